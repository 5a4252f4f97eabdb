"""Top-k of one block of queries against a gallery, own positives excluded (torch and FAISS paths)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aoq_train.mining.keys import PAD, decode_ids, decode_scores, encode_keys

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Direction:
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


def directions(img_emb: np.ndarray, cap_emb: np.ndarray, cpi: int, top_captions: int, top_images: int) -> list[Direction]:
    return [
        Direction("img_top_caps", img_emb, cap_emb, top_captions, cpi, 1, cpi),
        Direction("cap_top_imgs", cap_emb, img_emb, top_images, 1, cpi, 1),
    ]


def chunk_order(n_gallery: int, chunk: int) -> np.ndarray:
    """Gallery ids in processing order. The first chunk is a strided sample of the whole gallery
    (every n-th id: a fair base for the threshold whatever the id order) in a fixed shuffled order,
    so that any prefix of it is a fair sample too; then the other ids in order."""
    stride = max(1, -(-n_gallery // chunk))
    first = np.arange(0, n_gallery, stride)
    rest = np.setdiff1d(np.arange(n_gallery), first, assume_unique=True)
    return np.concatenate([np.random.default_rng(0).permutation(first), rest])


class Candidates:
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
        """(n_rows, max fill) keys, each row in decreasing order, padded with ``PAD``."""
        dense = np.full((self.n_rows, max(int(self.fill.max()), self.kept.shape[1])), PAD, dtype=np.int64)
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


def block_topk_torch(
    direction: Direction,
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
            chunk; ``keys.LOWEST`` everywhere makes every score a candidate.
        cap: candidates a row may hold before it is cut to k (default ``max(2k, k + 4096)``).
    """
    k, n_gal, n_q = direction.k, gallery.shape[0], queries.shape[0]
    device = queries.device
    cap = max(2 * k, k + 4096) if cap is None else cap
    order = chunk_order(n_gal, gallery_chunk)
    position = np.empty(n_gal, dtype=np.int64)
    position[order] = np.arange(n_gal)
    order_t = torch.from_numpy(order).to(device)
    own = position[direction.own_start(query_ids)[:, None] + np.arange(direction.own_count)]  # (n, own)
    buf = torch.empty(n_q * min(gallery_chunk, n_gal), dtype=torch.float32, device=device)
    cands = Candidates(n_q)
    for start in range(0, n_gal, gallery_chunk):
        stop = min(n_gal, start + gallery_chunk)
        width = stop - start
        scores = buf[: n_q * width].view(n_q, width)
        chunk = gallery.index_select(0, order_t[start:stop])
        # Own positives get -inf, which is below every threshold.
        rows, cols = np.nonzero((own >= start) & (own < stop))
        own_rows, own_cols = torch.from_numpy(rows).to(device), torch.from_numpy(own[rows, cols] - start).to(device)
        if queries.dtype == torch.float32:
            torch.mm(queries, chunk.T, out=scores)
        else:
            scores.copy_(_half_product(queries, chunk))
        if rows.size:
            scores[own_rows, own_cols] = float("-inf")
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
        ids[short] = exact_rows(direction, queries[torch.from_numpy(short).to(device)], query_ids[short], gallery)
    return ids


def exact_rows(direction: Direction, queries: torch.Tensor, query_ids: np.ndarray, gallery: torch.Tensor,
               rows_at_once: int | None = None) -> np.ndarray:
    """Top-k with no threshold: every score of each query, ranked by the tie rule. For the few
    rows whose threshold guess was too high: each row group is scored against the whole gallery
    at once (float32 products, or float16 ones with float32 results for a float16 ``queries``),
    packed into keys and partitioned, with no copy of the gallery (the chunked, candidate-pool
    path copied a permuted gallery per call: ~10 s of one core for a COCO-shape run's redone
    rows). ``rows_at_once`` (default: ~2**24 scores per group) bounds the memory: ~20 bytes a
    score (the scores, their keys and the partition's copy), ~340 MB per group."""
    k, n_gal, n_q = direction.k, gallery.shape[0], queries.shape[0]
    rows_at_once = rows_at_once or max(1, 2**24 // max(1, n_gal))
    gallery_ids = np.arange(n_gal)
    ids = np.empty((n_q, k), dtype=np.int32)
    for s in range(0, n_q, rows_at_once):
        q = queries[s : s + rows_at_once]
        scores = (_half_product(q, gallery) if q.dtype == torch.float16 else q @ gallery.T).float().cpu().numpy()
        own = direction.own_start(query_ids[s : s + len(q)])[:, None] + np.arange(direction.own_count)
        scores[np.arange(len(q))[:, None], own] = -np.inf
        keys = np.partition(encode_keys(scores, gallery_ids), n_gal - k, axis=1)[:, n_gal - k :]
        keys.sort(axis=1)
        ids[s : s + len(q)] = decode_ids(keys[:, ::-1])
    return ids


def _estimate_threshold(sample: torch.Tensor, k: int, n_gallery: int, rank: int = 100) -> np.ndarray:
    """Per-row score with about ``1.4 k + 32`` of the ``n_gallery`` scores above it, read as the
    ``rank``-th best of a prefix of the sampled (shuffled) first chunk. The count it lets through
    has a relative error of ~1/sqrt(rank) = 10%, so a row ends short of k candidates (and is
    redone) only ~3 standard deviations out, for ~0.2% of the rows."""
    target = min(n_gallery, int(1.4 * k) + 32)
    cols = min(sample.shape[1], -(-rank * n_gallery // target))
    r = min(cols, max(1, -(-target * cols // n_gallery)))
    return _kth_largest(sample[:, :cols], r)  # a prefix of the shuffled sample is a fair sample


def block_topk_faiss(
    direction: Direction, index: Any, gallery: torch.Tensor, queries: np.ndarray, q_first: int
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
    keys[((ids >= own_start) & (ids < own_start + own)) | (ids < 0)] = PAD
    keys.sort(axis=1)
    top = keys[:, ::-1][:, :k]
    top_ids = decode_ids(top).astype(np.int32)
    straddling = np.flatnonzero(scores.min(axis=1) >= decode_scores(top[:, -1]))
    if straddling.size:
        top_ids[straddling] = exact_rows(direction, torch.from_numpy(queries[straddling]), q_ids[straddling], gallery)
    return top_ids




def faiss_index(gallery: np.ndarray) -> Any:
    import faiss  # imported lazily: the torch backend does not need it

    index = faiss.IndexFlatIP(gallery.shape[1])
    index.add(np.ascontiguousarray(gallery, dtype=np.float32))
    return index

