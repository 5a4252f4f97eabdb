"""Offline hard-negative mining ("global similarity score prediction", DESIGN section 1).

After round 1, every training image is scored against every training caption. For each image we
keep the ids of its ``top_captions`` best captions other than its own, and for each caption the
ids of its ``top_images`` best images other than its own. Round 2 samples its offline negatives
from these lists (:mod:`training.sampling`).

How it is computed (torch backend)
    Blocked and streamed: a block of ``block_size`` queries is scored against the gallery one
    chunk of ``gallery_chunk`` columns at a time, so the full ``n_images x n_captions`` matrix
    never exists. The first chunk is a strided sample of the gallery (every n-th id), so its
    scores give each row a representative threshold: the score with about ``1.25 k + 32``
    gallery scores above it. Every chunk then contributes only its scores ``>= threshold``
    (one vectorised compare; ~2.5% of the scores), which are kept as packed keys and sorted
    once at the end. This costs a small fraction of the matrix product, unlike a running
    ``torch.topk`` merge, which is slower than the product itself on the CPU. Two safety
    valves keep it exact: a row holding more than ``max(2k, k + 4096)`` candidates is cut to
    its best k and its threshold raised to the k-th best score; a row that ends with fewer than
    k candidates (threshold guessed too high) is redone with no threshold.
    float32 on the CPU; on CUDA the products run in float16 and the compare on the GPU, only
    the passing scores travel to the host.

FAISS backend
    ``IndexFlatIP`` searched with ``k = H + own positives``, own positives dropped. A row whose
    lowest returned score equals its k-th kept score (a tie may continue past FAISS's cut) is
    redone by the torch path, so both backends follow the same tie rule.

Tie rule (deterministic)
    Higher score first; among equal scores, the lower gallery id first. Scores are compared as
    float32 values (``-0.0 == +0.0``). Implemented by ranking a packed int64 key
    ``(order-preserving int32 of the score) << 32 | (2**31 - 1 - id)``, so the ids equal those of
    a brute-force reference (full matrix, stable argsort on ``-score``) whenever both see the
    same float32 scores (always on exactly representable data; on the GPU the float16 products
    give slightly different scores, hence possibly a different order among near-ties).

Resuming
    With ``work_dir``, every finished query block is saved atomically as
    ``work_dir/parts/<direction>_<first row>.npy`` next to a ``job.json`` describing the job
    (embedding hashes, H, blocks, backend, precision). A rerun of the same job skips the blocks
    already on disk, so ``kill -9`` loses at most the block in progress. The artefact itself is
    written by :func:`save_mined` into a temporary directory renamed into place at the end.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from training.device import resolve_device
from training.io import (
    ArtefactError,
    atomic_dir,
    atomic_save_npy,
    atomic_write_json,
    read_manifest,
    write_manifest,
)

log = logging.getLogger(__name__)

KIND = "mined_negatives"
IMG_FILE = "img_top_caps.npy"
CAP_FILE = "cap_top_imgs.npy"

_ID_MASK = 0x7FFFFFFF  # ids are stored inverted in the low 32 bits: lower id = larger key
_PAD = np.iinfo(np.int64).min  # below every real key
_LOWEST = float(np.finfo(np.float32).min)  # a threshold every finite score passes; -inf fails it


# --------------------------------------------------------------------------------------------
# Packed (score, id) keys: one int64 whose order is "higher score, then lower id".
# --------------------------------------------------------------------------------------------


def encode_keys(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Pack float32 scores and ids in [0, 2**31) into int64 keys ordered by the tie rule."""
    bits = (np.asarray(scores, dtype=np.float32) + np.float32(0.0)).view(np.int32)  # -0.0 -> +0.0
    ordered = bits ^ ((bits >> 31) & _ID_MASK)  # order-preserving float -> int map (an involution)
    return (ordered.astype(np.int64) << 32) | (_ID_MASK - np.asarray(ids, dtype=np.int64))


def decode_ids(keys: np.ndarray) -> np.ndarray:
    """The ids packed by :func:`encode_keys` (int64)."""
    return _ID_MASK - (keys & 0xFFFFFFFF)


def decode_scores(keys: np.ndarray) -> np.ndarray:
    """The float32 scores packed by :func:`encode_keys`."""
    high = (keys >> 32).astype(np.int32)
    return (high ^ ((high >> 31) & _ID_MASK)).view(np.float32)


# --------------------------------------------------------------------------------------------
# One direction: queries against a gallery, own positives excluded.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Direction:
    """Queries scored against a gallery; query q owns gallery ids ``own_start(q) + [0, own_count)``."""

    name: str
    queries: np.ndarray
    gallery: np.ndarray
    k: int
    own_num: int  # own_start(q) = q * own_num // own_den
    own_den: int
    own_count: int

    def own_start(self, q: np.ndarray) -> np.ndarray:
        return q * self.own_num // self.own_den


def _directions(img_emb: np.ndarray, cap_emb: np.ndarray, cpi: int, top_captions: int, top_images: int) -> list[_Direction]:
    return [
        _Direction("img_top_caps", img_emb, cap_emb, top_captions, cpi, 1, cpi),
        _Direction("cap_top_imgs", cap_emb, img_emb, top_images, 1, cpi, 1),
    ]


def _chunk_order(n_gallery: int, chunk: int) -> np.ndarray:
    """Gallery ids in processing order. The first chunk is a strided sample of the whole gallery
    (every n-th id: a fair base for the threshold whatever the id order) in a fixed shuffled order,
    so that any prefix of it is a fair sample too; then the other ids in order."""
    stride = max(1, -(-n_gallery // chunk))
    first = np.arange(0, n_gallery, stride)
    rest = np.setdiff1d(np.arange(n_gallery), first, assume_unique=True)
    return np.concatenate([np.random.default_rng(0).permutation(first), rest])


class _Candidates:
    """Candidate keys of one query block: a dense, row-sorted part plus appended chunks."""

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows
        self.kept = np.empty((n_rows, 0), dtype=np.int64)
        self.fill = np.zeros(n_rows, dtype=np.int64)
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """Append keys; ``rows`` must be non-decreasing (row-major scan order)."""
        counts = np.bincount(rows, minlength=self.n_rows)
        first_of_row = np.cumsum(counts) - counts
        pos = self.fill[rows] + np.arange(rows.size) - first_of_row[rows]
        self.pending.append((rows.astype(np.int32), pos.astype(np.int32), keys))  # int32: less memory
        self.fill += counts

    def sorted(self) -> np.ndarray:
        """(n_rows, max fill) keys, each row in decreasing order, padded with ``_PAD``."""
        dense = np.full((self.n_rows, max(int(self.fill.max()), self.kept.shape[1])), _PAD, dtype=np.int64)
        dense[:, : self.kept.shape[1]] = self.kept
        for rows, pos, keys in self.pending:
            dense[rows, pos] = keys
        _map_row_slices(lambda s: dense[s].sort(axis=1), self.n_rows)  # in place, slice by slice
        return dense[:, ::-1]

    def compact(self, k: int) -> np.ndarray:
        """Keep each row's best k keys; returns each row's k-th best score (-inf if it has fewer)."""
        self.kept = np.ascontiguousarray(self.sorted()[:, :k])
        self.pending = []
        self.fill = np.minimum(self.fill, k)
        kth = np.full(self.n_rows, -np.inf, dtype=np.float32)
        full = self.fill == k
        kth[full] = decode_scores(self.kept[full, k - 1])
        return kth


@functools.lru_cache(maxsize=None)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mining")


def _map_row_slices(fn: Callable[[slice], Any], n_rows: int) -> list[Any]:
    """Run ``fn`` over row slices on torch's thread count (numpy releases the GIL in these
    kernels, and a single numpy thread would leave the other cores idle after the product)."""
    parts = max(1, min(torch.get_num_threads(), n_rows // 64))
    bounds = np.linspace(0, n_rows, parts + 1).astype(int)
    slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    if parts == 1:
        return [fn(slices[0])]
    return list(_pool(parts).map(fn, slices))


def _kth_largest(scores: torch.Tensor, r: int) -> np.ndarray:
    """Each row's r-th largest value (r >= 1). numpy's introselect is several times faster than
    ``torch.topk`` on the CPU; on CUDA ``torch.topk`` is the fast one."""
    if scores.is_cuda:
        return torch.topk(scores, r, dim=1, sorted=False).values.min(dim=1).values.cpu().numpy()
    values, n = scores.numpy(), scores.shape[1]  # partition copies each row slice contiguously
    return np.concatenate(_map_row_slices(lambda s: np.partition(values[s], n - r, axis=1)[:, n - r], len(values)))


def _passing(scores: torch.Tensor, threshold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat row-major positions and values of the scores ``>= threshold[row]`` (one pass)."""
    if scores.is_cuda:
        flat = (scores >= torch.from_numpy(threshold).to(scores.device)[:, None]).view(-1).nonzero().squeeze(1)
        return flat.cpu().numpy(), scores.view(-1)[flat].cpu().numpy()
    values = scores.numpy()
    width = values.shape[1]

    def part(s: slice) -> np.ndarray:  # numpy compare + flatnonzero: ~4x torch.ge + nonzero here
        return np.flatnonzero(np.greater_equal(values[s], threshold[s, None])) + s.start * width

    flat = np.concatenate(_map_row_slices(part, len(values)))
    return flat, values.reshape(-1)[flat]


def _half_product(queries: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """float16 product with a float32 result on CUDA: the accumulation is float32 either way, and a
    float16 result would round unit-vector scores to ~5e-4 steps, creating artificial ties."""
    try:
        return torch.mm(queries, chunk.T, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):  # torch < 2.8 has no out_dtype
        return (queries @ chunk.T).float()


def _block_topk_torch(
    direction: _Direction,
    queries: torch.Tensor,
    query_ids: np.ndarray,
    gallery: torch.Tensor,
    gallery_chunk: int,
    threshold: np.ndarray | None = None,
    cap: int | None = None,
) -> np.ndarray:
    """Top-k gallery ids (int32, tie rule order) of one query block, streamed over gallery chunks.

    Args:
        queries: (n, d) query embeddings on the compute device (float32, or float16 on CUDA).
        query_ids: the queries' row numbers (they say which gallery ids are their own).
        gallery: (N, d) gallery embeddings on the same device and dtype.
        threshold: per-row starting threshold; None estimates it from the first (sampled)
            chunk; ``_LOWEST`` everywhere makes every score a candidate (the exact redo).
        cap: candidates a row may hold before it is cut to k (default ``max(2k, k + 4096)``).
    """
    k, n_gal, n_q = direction.k, gallery.shape[0], queries.shape[0]
    device = queries.device
    cap = max(2 * k, k + 4096) if cap is None else cap
    order = _chunk_order(n_gal, gallery_chunk)
    position = np.empty(n_gal, dtype=np.int64)
    position[order] = np.arange(n_gal)
    order_t = torch.from_numpy(order).to(device)
    own = position[direction.own_start(query_ids)[:, None] + np.arange(direction.own_count)]  # (n, own)
    buf = torch.empty(n_q * min(gallery_chunk, n_gal), dtype=torch.float32, device=device)
    cands = _Candidates(n_q)
    for start in range(0, n_gal, gallery_chunk):
        stop = min(n_gal, start + gallery_chunk)
        width = stop - start
        scores = buf[: n_q * width].view(n_q, width)
        chunk = gallery.index_select(0, order_t[start:stop])
        if queries.dtype == torch.float32:
            torch.mm(queries, chunk.T, out=scores)
        else:
            scores.copy_(_half_product(queries, chunk))
        # Own positives get -inf, which is below every threshold.
        rows, cols = np.nonzero((own >= start) & (own < stop))
        if rows.size:
            scores[torch.from_numpy(rows).to(device), torch.from_numpy(own[rows, cols] - start).to(device)] = float("-inf")
        if threshold is None:
            threshold = _estimate_threshold(scores, k + direction.own_count, n_gal)
        flat, values = _passing(scores, threshold)
        if flat.size:
            rows = flat // width
            cands.add(rows, encode_keys(values, order[flat - rows * width + start]))
        if cands.fill.max() > cap:
            threshold = np.maximum(threshold, cands.compact(k))
    ids = np.empty((n_q, k), dtype=np.int32)
    done = cands.fill >= k
    if done.any():
        ids[done] = decode_ids(cands.sorted()[done, :k])
    short = np.flatnonzero(~done)
    if short.size:  # the guessed threshold was too high for these rows: redo them exactly
        ids[short] = _exact_rows(direction, queries[torch.from_numpy(short).to(device)], query_ids[short],
                                 gallery, gallery_chunk, cap)
    return ids


def _exact_rows(
    direction: _Direction, queries: torch.Tensor, query_ids: np.ndarray, gallery: torch.Tensor,
    gallery_chunk: int, cap: int | None = None, rows_at_once: int = 256,
) -> np.ndarray:
    """Top-k with every score a candidate (no threshold guess), in small row groups because
    each chunk then adds ``rows x gallery_chunk`` candidates before they are cut to k."""
    parts = []
    for s in range(0, queries.shape[0], rows_at_once):
        lowest = np.full(min(rows_at_once, queries.shape[0] - s), _LOWEST, dtype=np.float32)
        parts.append(_block_topk_torch(direction, queries[s : s + rows_at_once], query_ids[s : s + rows_at_once],
                                       gallery, gallery_chunk, lowest, cap))
    return np.concatenate(parts)


def _estimate_threshold(sample: torch.Tensor, k: int, n_gallery: int, rank: int = 100) -> np.ndarray:
    """Per-row score with about ``1.4 k + 32`` of the ``n_gallery`` scores above it, read as the
    ``rank``-th best of a prefix of the sampled (shuffled) first chunk. The count it lets through
    has a relative error of ~1/sqrt(rank) = 10%, so a row ends short of k candidates (and is
    redone) only ~3 standard deviations out, for ~0.2% of the rows."""
    target = min(n_gallery, int(1.4 * k) + 32)
    cols = min(sample.shape[1], -(-rank * n_gallery // target))
    r = min(cols, max(1, -(-target * cols // n_gallery)))
    return _kth_largest(sample[:, :cols], r)  # a prefix of the shuffled sample is a fair sample


def _block_topk_faiss(
    direction: _Direction, index: Any, gallery: torch.Tensor, queries: np.ndarray, q_first: int, gallery_chunk: int
) -> np.ndarray:
    """Top-k of one query block with a FAISS flat inner-product index, own positives dropped.

    FAISS returns ``k + own`` results per query in its own order. Rows where a tie with the
    k-th kept score may continue past FAISS's cut (its lowest returned score equals that k-th
    score) are redone by the torch path, so the tie rule holds here too.
    """
    k, own = direction.k, direction.own_count
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    scores, ids = index.search(queries, k + own)
    q_ids = np.arange(q_first, q_first + queries.shape[0])
    own_start = direction.own_start(q_ids)[:, None]
    keys = encode_keys(scores, np.maximum(ids, 0))
    keys[((ids >= own_start) & (ids < own_start + own)) | (ids < 0)] = _PAD
    keys.sort(axis=1)
    top = keys[:, ::-1][:, :k]
    top_ids = decode_ids(top).astype(np.int32)
    straddling = np.flatnonzero(scores.min(axis=1) >= decode_scores(top[:, -1]))
    if straddling.size:
        top_ids[straddling] = _exact_rows(direction, torch.from_numpy(queries[straddling]), q_ids[straddling],
                                          gallery, gallery_chunk)
    return top_ids


# --------------------------------------------------------------------------------------------
# The driver: blocks, progress, resumable parts.
# --------------------------------------------------------------------------------------------


def _array_hash(a: np.ndarray) -> str:
    h = hashlib.sha256(str((a.shape, str(a.dtype))).encode())
    h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


class _Parts:
    """Per-block results of one job under ``work_dir/parts``, reset when the job changes."""

    def __init__(self, work_dir: Path | None, job: dict) -> None:
        self.dir = None if work_dir is None else Path(work_dir) / "parts"
        if work_dir is None:
            return
        job_file = Path(work_dir) / "job.json"
        try:
            same = json.loads(job_file.read_text()) == job
        except (OSError, ValueError):
            same = False
        if not same:
            shutil.rmtree(self.dir, ignore_errors=True)
            atomic_write_json(job_file, job)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str, first: int) -> Path:
        assert self.dir is not None
        return self.dir / f"{name}_{first:010d}.npy"

    def load(self, name: str, first: int, shape: tuple[int, int]) -> np.ndarray | None:
        if self.dir is None:
            return None
        path = self._path(name, first)
        try:
            part = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            return None  # missing, or damaged outside our atomic writes: recompute the block
        return part if part.shape == shape and part.dtype == np.int32 else None

    def save(self, name: str, first: int, part: np.ndarray) -> None:
        if self.dir is not None:
            atomic_save_npy(self._path(name, first), part)


def _check_inputs(img_emb: np.ndarray, cap_emb: np.ndarray, cpi: int, top_captions: int, top_images: int) -> None:
    if img_emb.ndim != 2 or cap_emb.ndim != 2 or img_emb.shape[1] != cap_emb.shape[1]:
        raise ValueError(f"embeddings must be (N, d) with the same d, got {img_emb.shape} and {cap_emb.shape}")
    if cap_emb.shape[0] != img_emb.shape[0] * cpi:
        raise ValueError(
            f"{cap_emb.shape[0]} captions for {img_emb.shape[0]} images x {cpi} captions per image"
        )
    if not 1 <= top_captions <= cap_emb.shape[0] - cpi:
        raise ValueError(f"top_captions={top_captions} must be in [1, {cap_emb.shape[0] - cpi}] (captions minus own)")
    if not 1 <= top_images <= img_emb.shape[0] - 1:
        raise ValueError(f"top_images={top_images} must be in [1, {img_emb.shape[0] - 1}] (images minus own)")
    for name, a in (("image", img_emb), ("caption", cap_emb)):
        if not np.isfinite(a).all():
            raise ValueError(f"{name} embeddings contain NaN or infinite values")


def mine_offline_negatives(
    img_emb: np.ndarray,
    cap_emb: np.ndarray,
    captions_per_image: int,
    top_captions: int,
    top_images: int,
    block_size: int = 4096,
    device: str | torch.device = "cpu",
    *,
    backend: Literal["torch", "faiss"] = "torch",
    gallery_chunk: int = 16384,
    work_dir: str | Path | None = None,
    progress: bool = True,
    on_block: Callable[[str, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-H offline negatives for every image and every caption, own positives excluded.

    Args:
        img_emb: (N_i, d) image embeddings (float32; L2-normalised for cosine models).
        cap_emb: (N_i * captions_per_image, d) caption embeddings; caption c belongs to image
            ``c // captions_per_image``.
        top_captions: H_t, caption ids kept per image.
        top_images: H_i, image ids kept per caption.
        block_size: query rows scored together (memory ~ block_size x gallery_chunk floats).
        device: torch device ("auto" = CUDA when present); CUDA uses float16 matrix products.
        backend: "torch" (exact tie rule) or "faiss" (IndexFlatIP on the CPU).
        gallery_chunk: gallery columns scored at once (torch backend).
        work_dir: folder for resumable per-block results; None keeps everything in memory.
        progress: show a tqdm bar over the blocks.
        on_block: called with (direction, first row) after each block is finished and saved
            (progress reporting, interruption tests).

    Returns:
        ``(img_top_caps, cap_top_imgs)``: int32 arrays (N_i, H_t) and (N_c, H_i), each row
        sorted by the tie rule (higher score first, then lower id).

    Raises:
        ValueError: inconsistent shapes, H larger than the gallery minus own positives, or
            non-finite embeddings.
    """
    img_emb = np.asarray(img_emb, dtype=np.float32)
    cap_emb = np.asarray(cap_emb, dtype=np.float32)
    _check_inputs(img_emb, cap_emb, captions_per_image, top_captions, top_images)
    # FAISS runs on the CPU; there the torch gallery only serves the exact re-ranking of tied rows.
    dev = resolve_device(device) if backend == "torch" else torch.device("cpu")
    half = dev.type == "cuda"
    job = {
        "img_emb": _array_hash(img_emb),
        "cap_emb": _array_hash(cap_emb),
        "captions_per_image": captions_per_image,
        "top_captions": top_captions,
        "top_images": top_images,
        "block_size": block_size,
        "backend": backend,
        "precision": "float16" if half else "float32",
    }
    parts = _Parts(None if work_dir is None else Path(work_dir), job)
    results = []
    for direction in _directions(img_emb, cap_emb, captions_per_image, top_captions, top_images):
        n_q = direction.queries.shape[0]
        out = np.empty((n_q, direction.k), dtype=np.int32)
        firsts = range(0, n_q, block_size)
        gallery_t = index = None
        bar = tqdm(firsts, desc=f"mining {direction.name}", unit="block", disable=not progress, leave=False)
        for first in bar:
            last = min(n_q, first + block_size)
            part = parts.load(direction.name, first, (last - first, direction.k))
            if part is None:
                if gallery_t is None:
                    gallery_t = torch.from_numpy(direction.gallery).to(dev, torch.float16 if half else torch.float32)
                if backend == "faiss":
                    if index is None:
                        index = _faiss_index(direction.gallery)
                    part = _block_topk_faiss(direction, index, gallery_t, direction.queries[first:last], first, gallery_chunk)
                else:
                    q = torch.from_numpy(direction.queries[first:last]).to(dev, gallery_t.dtype)
                    part = _block_topk_torch(direction, q, np.arange(first, last), gallery_t, gallery_chunk)
                parts.save(direction.name, first, part)
            out[first:last] = part
            if on_block is not None:
                on_block(direction.name, first)
        results.append(out)
    return results[0], results[1]


def _faiss_index(gallery: np.ndarray) -> Any:
    import faiss  # imported lazily: the torch backend does not need it

    index = faiss.IndexFlatIP(gallery.shape[1])
    index.add(np.ascontiguousarray(gallery, dtype=np.float32))
    return index


# --------------------------------------------------------------------------------------------
# The artefact.
# --------------------------------------------------------------------------------------------


@dataclass
class MinedNegatives:
    """A loaded mined-negatives artefact (arrays memory-mapped read-only)."""

    img_top_caps: np.ndarray  # (N_i, H_t) int32
    cap_top_imgs: np.ndarray  # (N_c, H_i) int32
    manifest: dict
    path: Path

    @property
    def top_captions(self) -> int:
        return int(self.img_top_caps.shape[1])

    @property
    def top_images(self) -> int:
        return int(self.cap_top_imgs.shape[1])

    @property
    def captions_per_image(self) -> int:
        return int(self.cap_top_imgs.shape[0] // self.img_top_caps.shape[0])

    @property
    def checkpoint_hash(self) -> str | None:
        return self.manifest.get("checkpoint_hash")


def save_mined(
    directory: str | Path,
    img_top_caps: np.ndarray,
    cap_top_imgs: np.ndarray,
    manifest_extra: dict[str, Any] | None = None,
    config: Any = None,
) -> dict:
    """Write the artefact atomically: both arrays (int32 ``.npy``) and ``manifest.json``.

    ``manifest_extra`` typically holds ``checkpoint_hash``; the H values and shapes are added
    here. Returns the manifest.
    """
    extra = dict(manifest_extra or {})
    extra.update(
        top_captions=int(img_top_caps.shape[1]),
        top_images=int(cap_top_imgs.shape[1]),
        shapes={IMG_FILE: list(img_top_caps.shape), CAP_FILE: list(cap_top_imgs.shape)},
    )
    with atomic_dir(directory) as tmp:
        atomic_save_npy(tmp / IMG_FILE, np.asarray(img_top_caps, dtype=np.int32))
        atomic_save_npy(tmp / CAP_FILE, np.asarray(cap_top_imgs, dtype=np.int32))
        manifest = write_manifest(tmp, KIND, config, **extra)
    return manifest


def load_mined(directory: str | Path, verify: bool = True) -> MinedNegatives:
    """Load a mined-negatives artefact, memory-mapped read-only.

    Raises:
        ArtefactError: the directory, manifest or an array is missing, of another kind,
            corrupted or truncated (hash or shape mismatch), naming the file.
    """
    directory = Path(directory)
    manifest = read_manifest(directory, kind=KIND, verify=verify)
    arrays = []
    for name in (IMG_FILE, CAP_FILE):
        path = directory / name
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ArtefactError(f"{path}: cannot be read as a .npy array ({exc})") from exc
        expected = manifest.get("shapes", {}).get(name)
        if arr.dtype != np.int32 or arr.ndim != 2 or (expected is not None and list(arr.shape) != expected):
            raise ArtefactError(f"{path}: expected int32 {expected}, found {arr.dtype} {list(arr.shape)}")
        arrays.append(arr)
    img_top_caps, cap_top_imgs = arrays
    if img_top_caps.shape[0] == 0 or cap_top_imgs.shape[0] % img_top_caps.shape[0]:
        raise ArtefactError(
            f"{directory}: {cap_top_imgs.shape[0]} caption rows do not match {img_top_caps.shape[0]} image rows"
        )
    return MinedNegatives(img_top_caps, cap_top_imgs, manifest, directory)


# --------------------------------------------------------------------------------------------
# From a checkpoint to the artefact (what ``aoq mine`` and the pipeline run).
# --------------------------------------------------------------------------------------------


def _data_identity(data_cfg: Any, n_images: int, n_captions: int) -> dict[str, Any]:
    return {
        "format": data_cfg.format,
        "path": str(data_cfg.path),
        "split": data_cfg.train_split,
        "n_images": n_images,
        "n_captions": n_captions,
    }


def _up_to_date(out: Path, want: dict[str, Any]) -> MinedNegatives | None:
    """The existing artefact at ``out`` if it was mined by the same checkpoint, data and H."""
    if not (out / "manifest.json").is_file():
        return None
    try:
        mined = load_mined(out)
    except ArtefactError as exc:
        log.warning("%s: re-mining, the existing artefact is unusable (%s)", out, exc)
        return None
    return mined if all(mined.manifest.get(key) == value for key, value in want.items()) else None


def _embeddings(ckpt: Any, split: Any, identity: dict, work: Path, device: torch.device, progress: bool):
    """Embed the split with the checkpoint, cached in ``work`` so a resumed job does not redo it."""
    from training.embed import encode_split

    key_file = work / "embeddings.json"
    key = {"checkpoint_hash": ckpt.content_hash, "data": identity}
    try:
        if json.loads(key_file.read_text()) == key:
            return np.load(work / "img_emb.npy"), np.load(work / "cap_emb.npy")
    except (OSError, ValueError):
        pass
    ckpt.model.to(device)
    img, cap = encode_split(ckpt.model, ckpt.vocab, split, device=device,
                            image_size=ckpt.config.data.image_size, progress=progress)
    atomic_save_npy(work / "img_emb.npy", img)
    atomic_save_npy(work / "cap_emb.npy", cap)
    atomic_write_json(key_file, key)  # written last: its presence means both arrays are complete
    return img, cap


def mine_with_checkpoint(
    checkpoint: str | Path,
    cfg: Any,
    out: str | Path,
    *,
    progress: bool = True,
) -> tuple[MinedNegatives, bool]:
    """Embed the training split of ``cfg.data`` with ``checkpoint`` and mine it into ``out``.

    The checkpoint may be of any model kind (a "teacher"); only its embeddings are used. The
    mining settings are ``cfg.mining`` (top_captions, top_images, block_size, backend, device).
    Nothing is done when ``out`` already holds an artefact mined by the same checkpoint (content
    hash), data and H. Work files (embeddings, per-block parts) live in a hidden sibling
    ``.<out>.work`` until the artefact is in place, so an interrupted run resumes.

    Returns:
        ``(artefact, skipped)``.

    Raises:
        ArtefactError: the checkpoint is damaged (``CheckpointError``).
        DataError: the training split cannot be read.
        ValueError: H larger than the split allows.
    """
    from training.checkpoint import load_checkpoint
    from training.data.load import load_split

    out = Path(out)
    m = cfg.mining
    ckpt = load_checkpoint(checkpoint)
    split = load_split(cfg.data, "train")
    identity = _data_identity(cfg.data, split.n_images, split.n_captions)
    want = {"checkpoint_hash": ckpt.content_hash, "top_captions": m.top_captions,
            "top_images": m.top_images, "data": identity}
    existing = _up_to_date(out, want)
    if existing is not None:
        return existing, True
    device = resolve_device(m.device)
    work = out.parent / f".{out.name}.work"
    work.mkdir(parents=True, exist_ok=True)
    img, cap = _embeddings(ckpt, split, identity, work, device, progress)
    img_top_caps, cap_top_imgs = mine_offline_negatives(
        img, cap, split.captions_per_image, m.top_captions, m.top_images, m.block_size, device,
        backend=m.backend, work_dir=work, progress=progress,
    )
    save_mined(out, img_top_caps, cap_top_imgs, {
        **want,
        "checkpoint": str(checkpoint),
        "teacher_model": ckpt.config.model.image_encoder,
        "backend": m.backend,
        "precision": "float16" if device.type == "cuda" and m.backend == "torch" else "float32",
    }, config=m.model_dump(mode="json"))
    shutil.rmtree(work, ignore_errors=True)
    return load_mined(out), False
