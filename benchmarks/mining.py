"""Offline mining benchmark: our blocked miner vs the public per-anchor loop vs the bare matmul.

Measured in one run on random unit vectors (default 20,000 images x 100,000 captions, d=512,
H = 2000 captions per image / 400 images per caption, like the public AOQ code):

(a) ``training.mining.mine_offline_negatives``, both directions, torch backend, with its
    resumable per-block files written to a temporary folder (as ``aoq mine`` does);
(b) the public AOQ mining loop: one anchor at a time, ``(anchor * gallery).sum(1)``, own
    positives set to -inf, ``torch.topk``; timed on a subset of anchors per direction and
    extrapolated to all anchors. The same loop with a matrix-vector product instead of the
    element-wise product and sum is timed too and printed (it is ~6x faster than the public
    form, a fairer "best per-anchor loop" reference);
(c) the bare blocked matrix product with the same blocks and chunks, no selection: the limit.

Peak memory of (a): Linux resets the process's peak RSS (VmHWM) when "5" is written to
/proc/self/clear_refs; we reset it just before (a) and report VmHWM minus the RSS at that
moment, i.e. every byte (a) added at its peak: score buffers, running top-k, the returned
id arrays, the gallery tensor. Where clear_refs is not writable the growth of ru_maxrss is
used instead (an upper bound only if nothing before (a) peaked higher, so (a) runs first).

Last line: ``RESULT speedup_vs_loop=<(b)/(a)> ratio_to_matmul=<(a)/(c)> peak_mb=<z>``.

``--coco``: the COCO shape (113,287 images x 566,435 captions, d = 1024, H = 2000 / 400) on a
slice: ``--coco-blocks`` query blocks of each direction are mined in fp32 (exact) and in bf16
mode, next to the bare fp32 and bf16 products of the same blocks; the whole run is projected
from the per-block times (blocks per direction x time per block), and the bf16 lists are compared
with the fp32 ones row by row (share identical, share with the same set of ids). Wall and CPU
time are both printed: the machine is shared, the CPU time is the less load-sensitive figure.
Last line: ``RESULT coco_fp32_s=<projected> coco_bf16_s=<projected> bf16_rows_identical=<share>
ratio_to_matmul_fp32=<..> ratio_to_bf16_matmul=<..>``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.mining import mine_offline_negatives  # noqa: E402
from training.mining.topk import block_topk_torch, directions  # noqa: E402

COCO_IMAGES, COCO_CPI, COCO_DIM = 113_287, 5, 1024


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Extra peak resident memory of a code section, in MB (see the module docstring)."""

    def __enter__(self) -> "PeakMemory":
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.method = "VmHWM reset via /proc/self/clear_refs"
            self.base_kb = _status_kb("VmRSS")
        except OSError:
            self.method = "ru_maxrss growth"
            self.base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return self

    def __exit__(self, *exc: object) -> None:
        if self.method.startswith("VmHWM"):
            peak = _status_kb("VmHWM") or 0
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.mb = max(0, peak - (self.base_kb or 0)) / 1024


def unit_vectors(n: int, d: int, gen: torch.Generator, chunk: int = 8192) -> np.ndarray:
    """Random unit vectors, generated chunk by chunk so no large temporary exists."""
    out = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, chunk):
        x = torch.randn(min(chunk, n - s), d, generator=gen)
        out[s : s + x.shape[0]] = torch.nn.functional.normalize(x, dim=1).numpy()
    return out


def blocked_matmul(queries: np.ndarray, gallery: np.ndarray, block: int, chunk: int) -> None:
    """The miner's matrix products alone (same query blocks and gallery chunks), results dropped."""
    g = torch.from_numpy(gallery)
    buf = torch.empty(block * chunk)
    for s in range(0, len(queries), block):
        q = torch.from_numpy(queries[s : s + block])
        for c in range(0, len(gallery), chunk):
            gc = g[c : c + chunk]
            torch.mm(q, gc.T, out=buf[: q.shape[0] * gc.shape[0]].view(q.shape[0], gc.shape[0]))


def public_loop(queries: np.ndarray, gallery: np.ndarray, k: int, own, n: int, form: str) -> float:
    """Seconds per anchor of the public per-anchor loop over the first ``n`` anchors."""
    g = torch.from_numpy(gallery)
    t0 = time.perf_counter()
    for i in range(n):
        a = torch.from_numpy(queries[i : i + 1])
        scores = (a * g).sum(1) if form == "elementwise" else g @ a[0]
        scores[own(i)] = float("-inf")
        torch.topk(scores, k)
    return (time.perf_counter() - t0) / n


class Clock:
    """Wall and CPU seconds of a section."""

    def __enter__(self) -> "Clock":
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0


def coco(blocks: int, block_size: int, chunk: int, top_captions: int, top_images: int) -> str:
    """Mine ``blocks`` query blocks per direction at the COCO shape, fp32 and bf16; project."""
    gen = torch.Generator().manual_seed(0)
    img = unit_vectors(COCO_IMAGES, COCO_DIM, gen)
    cap = unit_vectors(COCO_IMAGES * COCO_CPI, COCO_DIM, gen)
    print(f"COCO shape: {len(img)} images x {len(cap)} captions, d={COCO_DIM}, H={top_captions}/{top_images}, "
          f"block {block_size}, chunk {chunk}, {torch.get_num_threads()} torch threads; {blocks} block(s) per direction")
    totals = {"fp32": [0.0, 0.0], "bf16": [0.0, 0.0], "mm32": [0.0, 0.0], "mm16": [0.0, 0.0]}
    same_rows = same_sets = n_rows = 0
    for d in directions(img, cap, COCO_CPI, top_captions, top_images):
        gallery = torch.from_numpy(d.gallery)
        gallery_bf16 = gallery.bfloat16()
        n_blocks = -(-len(d.queries) // block_size)
        for b in range(blocks):
            first = b * block_size
            ids = np.arange(first, min(len(d.queries), first + block_size))
            q = torch.from_numpy(d.queries[ids])
            with Clock() as exact:
                ref = block_topk_torch(d, q, ids, gallery, chunk)
            with Clock() as fast:
                got = block_topk_torch(d, q, ids, gallery, chunk, gallery_bf16=gallery_bf16)
            with Clock() as mm32:
                for c in range(0, len(gallery), chunk):
                    torch.mm(q, gallery[c : c + chunk].T)
            q16 = q.bfloat16()
            with Clock() as mm16:
                for c in range(0, len(gallery), chunk):
                    torch.mm(q16, gallery_bf16[c : c + chunk].T)
            for key, clock in (("fp32", exact), ("bf16", fast), ("mm32", mm32), ("mm16", mm16)):
                totals[key][0] += clock.wall * n_blocks / blocks
                totals[key][1] += clock.cpu * n_blocks / blocks
            same_rows += int((ref == got).all(axis=1).sum())
            same_sets += int((np.sort(ref, axis=1) == np.sort(got, axis=1)).all(axis=1).sum())
            n_rows += len(ids)
            print(f"  {d.name} block {b}: fp32 {exact.wall:.2f} s ({exact.cpu:.2f} CPU), bf16 {fast.wall:.2f} s "
                  f"({fast.cpu:.2f} CPU), bare products fp32 {mm32.wall:.2f} s, bf16 {mm16.wall:.2f} s; "
                  f"x {n_blocks} blocks")
    for key, label in (("fp32", "miner, fp32 (exact)"), ("bf16", "miner, bf16 filter + fp32 re-score"),
                       ("mm32", "bare fp32 products"), ("mm16", "bare bf16 products")):
        print(f"projected whole run, {label}: {totals[key][0]:.0f} s wall ({totals[key][1]:.0f} s CPU)")
    print(f"bf16 vs fp32 lists on the slice: {same_rows}/{n_rows} rows identical, {same_sets}/{n_rows} with "
          f"the same ids (differences are order swaps of scores within float32 round-off)")
    return (f"RESULT coco_fp32_s={totals['fp32'][0]:.0f} coco_bf16_s={totals['bf16'][0]:.0f} "
            f"bf16_rows_identical={same_rows / n_rows:.4f} bf16_same_ids={same_sets / n_rows:.4f} "
            f"ratio_to_matmul_fp32={totals['fp32'][0] / totals['mm32'][0]:.2f} "
            f"ratio_to_bf16_matmul={totals['bf16'][0] / totals['mm16'][0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="2,000 images x 10,000 captions, H = 200/40 (the same fraction of the gallery)")
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--captions-per-image", type=int, default=5)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--top-captions", type=int, default=2000)
    p.add_argument("--top-images", type=int, default=400)
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--gallery-chunk", type=int, default=16384)
    p.add_argument("--loop-images", type=int, default=40, help="image anchors timed in (b)")
    p.add_argument("--loop-captions", type=int, default=200, help="caption anchors timed in (b)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--coco", action="store_true", help="the COCO shape on a slice, fp32 and bf16, projected")
    p.add_argument("--coco-blocks", type=int, default=1, help="query blocks per direction timed with --coco")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.coco:
        print(coco(args.coco_blocks, args.block_size, args.gallery_chunk, args.top_captions, args.top_images))
        return 0
    if args.quick:
        args.images, args.top_captions, args.top_images = 2000, 200, 40
        args.loop_images, args.loop_captions = 100, 500
    if args.threads:
        torch.set_num_threads(args.threads)
    cpi = args.captions_per_image
    n_img, n_cap = args.images, args.images * cpi
    gen = torch.Generator().manual_seed(0)
    img, cap = unit_vectors(n_img, args.dim, gen), unit_vectors(n_cap, args.dim, gen)
    print(
        f"{n_img} images x {n_cap} captions, d={args.dim}, H={args.top_captions}/{args.top_images}, "
        f"block {args.block_size}, chunk {args.gallery_chunk}, {torch.get_num_threads()} torch threads"
    )

    with tempfile.TemporaryDirectory() as work, PeakMemory() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        mine_offline_negatives(
            img, cap, cpi, args.top_captions, args.top_images, args.block_size, "cpu",
            gallery_chunk=args.gallery_chunk, work_dir=work, progress=False,
        )
        t_ours, c_ours = time.perf_counter() - t0, time.process_time() - c0
    print(f"(a) blocked miner, both directions: {t_ours:.2f} s ({c_ours:.2f} s CPU); "
          f"extra peak memory {mem.mb:.0f} MB ({mem.method})")

    t0, c0 = time.perf_counter(), time.process_time()
    blocked_matmul(img, cap, args.block_size, args.gallery_chunk)
    blocked_matmul(cap, img, args.block_size, args.gallery_chunk)
    t_mm, c_mm = time.perf_counter() - t0, time.process_time() - c0
    print(f"(c) bare blocked matmul, both directions: {t_mm:.2f} s ({c_mm:.2f} s CPU); "
          f"CPU-time ratio (a)/(c) {c_ours / c_mm:.2f} (less sensitive to other processes than wall time)")

    loops = {}
    for form in ("elementwise", "matvec"):
        per_img = public_loop(img, cap, args.top_captions, lambda i: slice(i * cpi, (i + 1) * cpi), args.loop_images, form)
        per_cap = public_loop(cap, img, args.top_images, lambda c: c // cpi, args.loop_captions, form)
        loops[form] = per_img * n_img + per_cap * n_cap
        print(
            f"(b) per-anchor loop [{form}]: {per_img * 1e3:.2f} ms/image anchor ({args.loop_images} timed), "
            f"{per_cap * 1e3:.2f} ms/caption anchor ({args.loop_captions} timed) -> {loops[form]:.0f} s extrapolated"
        )
    print(f"speedup vs the matrix-vector loop: {loops['matvec'] / t_ours:.1f}x")
    print(
        f"RESULT speedup_vs_loop={loops['elementwise'] / t_ours:.1f} "
        f"ratio_to_matmul={t_ours / t_mm:.2f} peak_mb={mem.mb:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
