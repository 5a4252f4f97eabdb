"""The blocked, resumable driver: every query block of both directions, saved part by part."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from aoq.device import resolve_device
from aoq.io import (
    atomic_save_npy,
    stamp_matches,
    write_stamp,
)
from aoq_train.mining.bf16 import bf16_pays, bf16_speedup, canonical_tile, error_bound, tile_within_bound
from aoq_train.mining.int8 import int8_beats_bf16, int8_pays
from aoq_train.mining.canonical import RULE, canonical_inputs, float32_margin
from aoq_train.mining.fused import CHUNK, FusedPass, processing_order
from aoq_train.mining.pools import fresh_array
from aoq_train.mining.topk import (
    Direction,
    Scorer,
    half_product,
    block_topk_faiss,
    block_topk_torch,
    directions,
    faiss_index,
)
from aoq_train.mining.workers import worker_pool

log = logging.getLogger(__name__)

BF16_FILTER = "bfloat16+float32"  # the bf16 filter's products: bf16 tiles, float32 embeddings re-scored canonically
INT8_FILTER = "int8+float32"  # the int8 filter's: exact int8 tile products, the same canonical re-score
FILTER_MODES = {BF16_FILTER: "bf16", INT8_FILTER: "int8"}  # the fused pass's mode for each filter

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
        if not stamp_matches(job_file, job):
            shutil.rmtree(self.dir, ignore_errors=True)
            write_stamp(job_file, job)
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

    def drop_snapshots(self) -> None:
        """Remove the fused pass's column snapshots (:meth:`FusedPass.save_columns`) once unneeded."""
        if self.dir is not None:
            for path in self.dir.glob("columns*"):
                path.unlink(missing_ok=True)


def _check_inputs(img_emb: np.ndarray, cap_emb: np.ndarray, cpi: int, top_captions: int,
                  top_images: int) -> tuple[np.ndarray, np.ndarray]:
    """The embeddings as mined (subnormal entries flushed to zero: the canonical score's inputs,
    :func:`aoq_train.mining.canonical.canonical_inputs`), once shapes, H and values are checked."""
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
    out = []
    for name, a in (("image", img_emb), ("caption", cap_emb)):
        a, finite = canonical_inputs(a)
        if not finite:
            raise ValueError(f"{name} embeddings contain NaN or infinite values")
        out.append(a)
    return out[0], out[1]


def mine_offline_negatives(
    img_emb: np.ndarray,
    cap_emb: np.ndarray,
    captions_per_image: int,
    top_captions: int,
    top_images: int,
    block_size: int = 4096,
    device: str | torch.device | Sequence[str | torch.device] = "cpu",
    *,
    backend: Literal["torch", "faiss"] = "torch",
    gallery_chunk: int | None = None,
    precision: Literal["auto", "fp32", "bf16", "int8", "fp16"] = "auto",
    work_dir: str | Path | None = None,
    progress: bool = True,
    on_block: Callable[[str, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-H offline negatives for every image and every caption, own positives excluded, ranked
    by canonical scores (:mod:`aoq_train.mining.canonical`): the same lists whatever the
    precision, device, backend or CPU.

    Args:
        img_emb: (N_i, d) image embeddings (float32; L2-normalised for cosine models).
        cap_emb: (N_i * captions_per_image, d) caption embeddings; caption c belongs to image
            ``c // captions_per_image``.
        top_captions: H_t, caption ids kept per image.
        top_images: H_i, image ids kept per caption.
        block_size: query rows per saved part (the resumable unit); the per-direction paths (CUDA,
            FAISS) also score that many rows at once (memory ~ block_size x gallery_chunk floats).
        device: torch device ("auto" = CUDA when present).
            ``"cuda"`` without an index means every visible GPU, and a sequence names several
            devices: the query blocks of each direction are then shared out among them, one
            thread and one copy of the gallery per device (the ids do not depend on how many).
            Several CPU devices run the per-direction path in float32 (tests; the fused pass is
            the faster CPU path).
        backend: "torch" (exact tie rule) or "faiss" (IndexFlatIP on the CPU).
        gallery_chunk: gallery columns scored at once (torch backend); default 1024 on the CPU
            (``aoq_train.mining.fused.CHUNK``), 16384 on CUDA.
        precision: the products that find the candidates; the canonical scores decide, so every
            choice gives the same lists. ``fp32``: float32 products (on CUDA a first block is
            checked against the bound, which TF32 would break). CPU torch backend: ``bf16``
            filters with bfloat16 products within a proven error bound
            (``aoq_train.mining.bf16``); ``int8`` (fused pass only) with exact int8 products of
            rounded embeddings within a proven bound (``aoq_train.mining.int8``). ``auto``:
            ``bf16`` where it pays (the fused CPU pass on a CPU whose bf16 products are at least
            1.5x faster, :func:`aoq_train.mining.bf16.bf16_pays`) unless int8 products save
            much more (:func:`aoq_train.mining.int8.int8_beats_bf16`), else ``int8`` where that
            pays (:func:`aoq_train.mining.int8.int8_pays`: its products faster by
            :data:`aoq_train.mining.int8.INT8_PAYS_FACTOR`), else ``fp32``. CUDA: ``fp16``,
            float16 products with float32 results and the same kind of bound (a float32 copy of the
            gallery is kept on the device for the canonical scores).
        work_dir: folder for resumable per-block results; None keeps everything in memory.
        progress: show a tqdm bar over the blocks.
        on_block: called with (direction, first row) after each block is finished and saved
            (progress reporting, interruption tests).

    Returns:
        ``(img_top_caps, cap_top_imgs)``: int32 arrays (N_i, H_t) and (N_c, H_i), each row
        sorted by the tie rule (higher canonical score first, then lower id).

    Raises:
        ValueError: inconsistent shapes, H larger than the gallery minus own positives, or
            non-finite embeddings.
    """
    img_emb = np.asarray(img_emb, dtype=np.float32)
    cap_emb = np.asarray(cap_emb, dtype=np.float32)
    img_emb, cap_emb = _check_inputs(img_emb, cap_emb, captions_per_image, top_captions, top_images)
    # FAISS runs on the CPU; there the torch gallery only serves the exact re-ranking of tied rows.
    devs = _devices(device) if backend == "torch" else [torch.device("cpu")]
    fused = backend == "torch" and len(devs) == 1 and devs[0].type == "cpu"  # one pass for both directions
    products = product_precision(devs[0], backend, precision, fused)
    log.info("mining precision %s: %s products find the candidates, canonical scores rank them", precision, products)
    half = products == "float16"
    job = {
        "img_emb": _array_hash(img_emb),
        "cap_emb": _array_hash(cap_emb),
        "captions_per_image": captions_per_image,
        "top_captions": top_captions,
        "top_images": top_images,
        "block_size": block_size,
        "backend": backend,
        "ranking": RULE,  # parts of any precision are the same lists; another rule discards them
        "layout": "fused" if fused else "per-direction",
    }
    run = _Run(_Parts(None if work_dir is None else Path(work_dir), job), block_size,
               gallery_chunk or (CHUNK if fused else 16384), progress, on_block)
    both = directions(img_emb, cap_emb, captions_per_image, top_captions, top_images)
    if fused:
        return _mine_fused(run, both, captions_per_image, FILTER_MODES.get(products, "fp32"))
    img_top_caps, cap_top_imgs = (_mine_direction(run, direction, devs, backend, half) for direction in both)
    return img_top_caps, cap_top_imgs


def fast_margin(direction: Direction, half: bool) -> float:
    """A proven bound on how far the per-direction path's products (float32, or float16 with
    float32 accumulation) lie from the canonical scores, for every pair of ``direction``. For
    float16 the bf16 filter's bound with float16 roundings (:func:`aoq_train.mining.bf16.error_bound`),
    plus a float16 rounding of the result (where torch has no float32 output for it).

    Raises:
        ValueError: float16 cannot hold the embeddings (the bound is not finite).
    """
    if not half:
        return float32_margin(direction.queries, direction.gallery)
    q, g = torch.from_numpy(direction.queries), torch.from_numpy(direction.gallery)
    q16, g16 = q.half(), g.half()
    result = 2.0**-11 * float(q16.float().norm(dim=1).max()) * float(g16.float().norm(dim=1).max()) * 1.001
    margin = error_bound(q, g, q16, g16) + result
    if not np.isfinite(margin):
        raise ValueError("float16 cannot hold these embeddings (norms too large): mine with precision fp32")
    return margin


def check_products(direction: Direction, dev: torch.device, gallery_t: torch.Tensor, margin: float) -> None:
    """The bound's premise on a first tile of this device's products (256 queries x 1024 gallery
    rows): every product within ``margin`` of its canonical score.

    Raises:
        RuntimeError: the products are further off (TF32 or reduced-precision reductions on).
    """
    q32, g32 = torch.from_numpy(direction.queries[:256]), torch.from_numpy(direction.gallery[:1024])
    q = q32.to(dev, gallery_t.dtype)
    fast = (half_product(q, gallery_t[:1024]) if q.dtype == torch.float16 else q @ gallery_t[:1024].T)
    if not tile_within_bound(fast.float().cpu().numpy(), canonical_tile(q32, g32), margin, 0.0):
        raise RuntimeError(f"{dev}'s {gallery_t.dtype} products are further from the canonical scores than the "
                           "proven bound allows (aoq_train.mining.canonical): is TF32 or a reduced-precision "
                           "reduction enabled? Mine with precision fp32 and full-precision float32 products.")


def product_precision(device: torch.device, backend: str, precision: str, fused: bool = True) -> str:
    """The products a mining job runs (recorded with the job and the mined artefact):
    ``float32``, ``bfloat16+float32`` (the CPU's bf16 filter; the name is from when candidates
    were re-scored in float32, now canonically) or ``float16`` (CUDA). The lists do not depend
    on it.
    ``int8+float32`` (the CPU's int8 filter, :mod:`aoq_train.mining.int8`).
    ``auto`` picks the bf16 filter for the fused CPU pass (``fused``: one CPU device, torch
    backend) where :func:`aoq_train.mining.bf16.bf16_pays`, unless the int8 filter's products save
    enough more to pay for its wider bound (:func:`aoq_train.mining.int8.int8_beats_bf16`), else
    the int8 filter where :func:`aoq_train.mining.int8.int8_pays`, else float32.

    Raises:
        ValueError: an unknown precision, or one the device cannot run.
    """
    if precision not in ("auto", "fp32", "bf16", "int8", "fp16"):
        raise ValueError(f"mining precision must be auto, fp32, bf16, int8 or fp16, got {precision!r}")
    if precision == "auto":
        if not (backend == "torch" and device.type == "cpu" and fused):
            return "float32"
        if bf16_pays():
            return INT8_FILTER if int8_beats_bf16(bf16_speedup()) else BF16_FILTER
        return INT8_FILTER if int8_pays() else "float32"
    if backend == "faiss" or precision == "fp32":
        return "float32"
    if device.type == "cuda" and precision == "fp16":
        return "float16"
    if device.type == "cpu" and precision == "bf16":
        return BF16_FILTER
    if device.type == "cpu" and precision == "int8" and fused:
        return INT8_FILTER
    hint = "fp16 (or fp32)" if device.type == "cuda" else "bf16 (or fp32; int8 on one CPU device)"
    raise ValueError(f"mining precision {precision} does not run on {device.type}: use {hint} there")


def _devices(device: str | torch.device | Sequence[str | torch.device]) -> list[torch.device]:
    """The devices to mine on: a sequence as given; ``cuda`` without an index, every visible GPU."""
    if isinstance(device, (list, tuple)):
        if not device:
            raise ValueError("no device to mine on: the device list is empty")
        devs = [resolve_device(d) for d in device]
        if len({d.type for d in devs}) > 1:
            raise ValueError(f"mining devices must be all CUDA or all CPU (their products' precision differs): {devs}")
        return devs
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [dev]


@dataclass(frozen=True)
class _Run:
    """What every block of one mining job shares: where parts are saved, the block and gallery
    chunk sizes, and how progress is shown and reported."""

    parts: _Parts
    block_size: int
    gallery_chunk: int
    progress: bool
    on_block: Callable[[str, int], None] | None

    def blocks(self, n: int) -> list[int]:
        """The first row of every block of ``n`` rows."""
        return list(range(0, n, self.block_size))

    def report(self, name: str, first: int) -> None:
        if self.on_block is not None:
            self.on_block(name, first)


def _mine_direction(run: _Run, direction: Direction, devs: list[torch.device], backend: str, half: bool) -> np.ndarray:
    """One direction block by block (per-direction paths: CUDA, FAISS, several devices). Block j
    goes to device j mod len(devs); each device has one thread and its own copy of the gallery.
    Blocks are stored, counted and reported (``on_block``) in order, from this thread."""
    n_q, block_size, parts = direction.queries.shape[0], run.block_size, run.parts
    out = np.empty((n_q, direction.k), dtype=np.int32)
    galleries: dict[int, tuple[torch.Tensor, Any, Scorer]] = {}
    margin = None

    def compute(slot: int, first: int) -> np.ndarray:
        nonlocal margin
        dev, last = devs[slot], min(n_q, first + block_size)
        if slot not in galleries:  # made by the device's own thread, once
            gallery32 = torch.from_numpy(direction.gallery).to(dev)
            gallery_t = gallery32.half() if half else gallery32
            if margin is None:
                margin = fast_margin(direction, half)
            check_products(direction, dev, gallery_t, margin)
            scorer = Scorer(direction, margin, gallery32 if dev.type != "cpu" else None)  # canonical on the GPU
            galleries[slot] = (gallery_t, faiss_index(direction.gallery) if backend == "faiss" else None, scorer)
        gallery_t, index, scorer = galleries[slot]
        if index is not None:
            part = block_topk_faiss(direction, index, gallery_t, direction.queries[first:last], first, scorer)
        else:
            q = torch.from_numpy(direction.queries[first:last]).to(dev, gallery_t.dtype)
            part = block_topk_torch(direction, q, np.arange(first, last), gallery_t, run.gallery_chunk,
                                    scorer=scorer)
        parts.save(direction.name, first, part)
        return part

    firsts = run.blocks(n_q)
    done = {first: parts.load(direction.name, first, (min(n_q, first + block_size) - first, direction.k))
            for first in firsts}
    with contextlib.ExitStack() as stack:
        pools = [stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix=f"mining-{j}-{d}"))
                 for j, d in enumerate(devs)]
        todo = [first for first in firsts if done[first] is None]
        futures = {first: pools[j % len(devs)].submit(compute, j % len(devs), first) for j, first in enumerate(todo)}
        stack.callback(lambda: [f.cancel() for f in futures.values()])  # an error or an interruption stops the rest
        for first in tqdm(firsts, desc=f"mining {direction.name}", unit="block", disable=not run.progress, leave=False):
            part = done[first] if done[first] is not None else futures[first].result()
            out[first : first + part.shape[0]] = part
            run.report(direction.name, first)
    return out


def _mine_fused(run: _Run, both: list[Direction], cpi: int,
                precision: Literal["fp32", "bf16", "int8"]) -> tuple[np.ndarray, np.ndarray]:
    """Both directions from one pass (:class:`aoq_train.mining.fused.FusedPass`), resumable.

    Image blocks are ``block_size`` consecutive positions of the pass's image order, saved as
    they complete; caption blocks are consecutive caption ids, saved at the end of the pass (the
    columns are complete only then). A rerun loads the finished blocks; when only caption blocks
    are missing (the pass was interrupted while saving them), those are computed on their own by
    the per-direction path rather than by a whole new pass.
    """
    rows, cols = both
    img_emb, cap_emb, top_captions, top_images = rows.queries, cols.queries, rows.k, cols.k
    n_img, n_cap, block_size, parts = len(img_emb), len(cap_emb), run.block_size, run.parts
    img_out = fresh_array((n_img, top_captions), np.int32)
    cap_out = fresh_array((n_cap, top_images), np.int32)
    order = processing_order(n_img, 0)
    img_firsts = run.blocks(n_img)
    img_done = set()
    for first in img_firsts:
        last = min(n_img, first + block_size)
        part = parts.load("img_top_caps", first, (last - first, top_captions))
        if part is not None:
            img_out[order[first:last]] = part
            img_done.add(first)
    cap_missing = []
    for first in run.blocks(n_cap):
        last = min(n_cap, first + block_size)
        part = parts.load("cap_top_imgs", first, (last - first, top_images))
        if part is None:
            cap_missing.append(first)
        else:
            cap_out[first:last] = part

    def save_cap_block(first: int) -> None:
        parts.save("cap_top_imgs", first, cap_out[first : first + block_size])

    if len(img_done) < len(img_firsts):
        bar = tqdm(total=len(img_firsts), desc="mining (both directions)", unit="block", disable=not run.progress,
                   leave=False)
        pending = iter(img_firsts)
        next_first = next(pending, None)

        def rows_done(end: int) -> None:
            nonlocal next_first
            while next_first is not None and min(n_img, next_first + block_size) <= end:
                if next_first not in img_done:
                    parts.save("img_top_caps", next_first, img_out[order[next_first : next_first + block_size]])
                run.report("img_top_caps", next_first)
                bar.update(1)
                next_first = next(pending, None)

        miner = FusedPass(img_emb, cap_emb, cpi, top_captions, top_images, chunk=run.gallery_chunk, precision=precision)
        miner.run(img_out, cap_out, block_size, img_done.__contains__, rows_done, state=parts.dir)
        bar.close()
        # a file write and an fsync each, one per core; on an error the queued ones are dropped
        with worker_pool() as ex:
            saves = [ex.submit(save_cap_block, first) for first in cap_missing]
            for first, save in zip(cap_missing, saves):
                save.result()
                run.report("cap_top_imgs", first)
        parts.drop_snapshots()
    elif cap_missing:  # float32 products whatever the precision (the same canonical lists): a few blocks
        gallery = torch.from_numpy(cols.gallery)
        scorer = Scorer(cols, float32_margin(cols.queries, cols.gallery))
        for first in tqdm(cap_missing, desc="mining cap_top_imgs", unit="block", disable=not run.progress, leave=False):
            last = min(n_cap, first + block_size)
            q = torch.from_numpy(cols.queries[first:last])
            cap_out[first:last] = block_topk_torch(cols, q, np.arange(first, last), gallery, run.gallery_chunk,
                                                   scorer=scorer)
            save_cap_block(first)
            run.report("cap_top_imgs", first)
    return img_out, cap_out
