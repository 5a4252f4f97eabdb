"""Offline mining benchmark: our fused miner vs the public per-anchor loop vs the bare matmul.

Measured in one run on random unit vectors (default 20,000 images x 100,000 captions, d=512,
H = 2000 captions per image / 400 images per caption, like the public AOQ code):

(a) ``aoq_train.mining.mine_offline_negatives``, both directions, torch backend on the CPU (the
    fused pass: every score computed once, both directions selected from it), in every precision
    mode (float32 products, the bf16 filter and the int8 filter; the canonical scores decide
    either way), with its resumable per-block files written to a temporary folder (as ``aoq
    mine`` does). The default ("auto": the bf16 or int8 filter where this CPU's low-precision
    products pay, docs/mining.md section 2, else float32) is run first; every mode's lists are
    compared byte for byte with the float32 mode's. A mode whose products this CPU runs slower
    than float32 ones (bf16 and int8 on an AVX2-only CPU: there its full-size run takes tens of
    minutes) is mined at the ``--quick`` shape instead, for the comparison only, and its ratios
    print as ``skipped``, unless ``--all-modes``;
(b) the public AOQ mining loop: one anchor at a time, ``(anchor * gallery).sum(1)``, own
    positives set to -inf, ``torch.topk``; timed on a subset of anchors per direction and
    extrapolated to all anchors. The same loop with a matrix-vector product instead of the
    element-wise product and sum is timed too and printed (it is ~6x faster than the public
    form, a fairer "best per-anchor loop" reference);
(c) the bare float32 product of the whole score matrix, once, results dropped: the limit for a
    miner that computes every score in float32. Two arrangements are timed, blocks of 4096 x
    16384 on torch's threads and the pass's own tiles (one single-threaded worker per core), and
    the faster is the reference. (Before the fused pass, both directions computed the matrix
    separately and this reference was two products.)

Peak memory of (a): Linux resets the process's peak RSS (VmHWM) when "5" is written to
/proc/self/clear_refs; we reset it just before (a) and report VmHWM minus the RSS at that
moment, i.e. every byte (a) added at its peak: tiles, candidate pools, permuted copies of the
embeddings, the returned id arrays. Where clear_refs is not writable the growth of ru_maxrss is
used instead (an upper bound only if nothing before (a) peaked higher, so (a) runs first).

The miner's compiled kernels are warmed on a tiny case first (a fresh clone compiles them once,
~10 s, then loads them from numba's cache). Wall and CPU (process) time are both printed: on a shared machine the CPU time is the less
load-sensitive figure. The COCO shape's time is projected from the default's throughput (score
matrix size x dimension). Last line: ``RESULT precision=<the default's products>
identical_lists=<the smallest share, over the modes, of the lists (both directions) byte-identical
to the float32 mode's> speedup_vs_loop=<(b)/(a)> ratio_to_matmul=<(a)/(c), wall, the default
mode> ratio_to_matmul_cpu=<(a)/(c), CPU time> fp32_mode_ratio=<the float32 mode's, wall>
fp32_mode_ratio_cpu=<.., CPU time> bf16_mode_ratio=.. bf16_mode_ratio_cpu=.. int8_mode_ratio=..
int8_mode_ratio_cpu=.. (``skipped`` for a mode checked only at the quick shape)
coco_projected_s=<the COCO shape at this run's throughput, wall>
coco_projected_cpu_s=<the same from the CPU time, divided by the thread count> peak_mb=<the default's>``.

``--coco``: the COCO shape (113,287 images x 566,435 captions, d = 1024, H = 2000 / 400) on a
slice, in fp32 (exact) and bf16 (filter) mode: the fused pass is built at full size and runs its
sample phase in full (the first rows of the image order against every caption: they set every
column's threshold) plus ``--coco-tiles`` row tiles against every caption; the bare products of
the same rows (float32, and bfloat16) are timed next to them. The whole run is projected as
set-up + sample phase + (remaining rows / rows timed) x tile time + the column lists' final sort
(timed on the pools as the slice leaves them, a lower bound); the bf16 lists of the timed rows are
compared with the fp32 ones. Last line: ``RESULT coco_fp32_cpu_s=<projected CPU seconds>
coco_fp32_wall_s=<projected wall> coco_bf16_cpu_s=.. coco_bf16_wall_s=.. ratio_to_matmul_fp32=<CPU
time> ratio_to_bf16_matmul=<CPU time> bf16_rows_identical=<share> bf16_same_ids=<share>
bf16_worst_swap=<largest float64 score by which an id only fp32 kept beats one only bf16 kept>``; CPU
seconds divided by the thread count are what idle cores would take. The projection leaves out
what grows with the pools' fill over a whole run (the column thresholds' re-estimates, the final
sorts of full pools, the part files): whole runs measured 4-18% (fp32) and 16-37% (bf16) above it.

``--coco-full fp32|bf16|int8|auto``: the whole COCO shape mined once (auto: this CPU's default),
64 image and 64 caption lists checked against a brute force of canonical scores and one of
float64 products. Last line: ``RESULT coco_full_precision=.. coco_full_wall_s=.. coco_full_cpu_s=..
peak_mb=.. checked_identical=<share byte-identical to the canonical brute force>
checked_same_ids=<share holding the float64 brute force's ids> checked_worst_swap=<largest
float64 score by which a float64 brute-force id beats a mined one>``.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # mining_checks, also when loaded by path

from aoq.device import cpu_description  # noqa: E402
from aoq_train.mining import fused, mine_offline_negatives  # noqa: E402
from aoq_train.mining.driver import FILTER_MODES, product_precision  # noqa: E402
from aoq_train.mining.bf16 import bf16_speedup  # noqa: E402
from aoq_train.mining.int8 import int8_speedup  # noqa: E402
from aoq_train.mining.canonical import canonical_pairs  # noqa: E402
from aoq_train.mining.workers import worker_pool  # noqa: E402
from mining_checks import agreement, brute_force, canonical_brute_force, identical_lists, worst_swap  # noqa: E402

COCO_IMAGES, COCO_CPI, COCO_DIM = 113_287, 5, 1024
MODES = ("fp32", "bf16", "int8")  # the fused pass's products; the first is the reference the others are compared with
SPEEDUPS = {"bf16": bf16_speedup, "int8": int8_speedup}  # each filter mode's products against float32 ones, one core
QUICK = dict(images=2000, top_captions=200, top_images=40)  # --quick's shape, also where slow modes are checked


def coco_scale(n_img: int, n_cap: int, dim: int) -> float:
    """How many times more multiply-adds the COCO shape's score matrix takes than this run's."""
    return COCO_IMAGES * COCO_IMAGES * COCO_CPI * COCO_DIM / (n_img * n_cap * dim)


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


def warm_kernels() -> None:
    """Compile (or load from numba's cache) the miner's kernels on a tiny case in both modes, so
    that no timing includes a first compile (~10 s on a fresh clone: one-time, not mining)."""
    gen = torch.Generator().manual_seed(1)
    img, cap = unit_vectors(1024, 16, gen), unit_vectors(5120, 16, gen)  # past the sample phase: row tiles too
    for precision in MODES:
        with tempfile.TemporaryDirectory() as work:
            mine_offline_negatives(img, cap, 5, 200, 40, 512, "cpu", work_dir=work, progress=False, precision=precision)
    canonical_pairs(img, cap, np.arange(4), np.arange(4))  # the redone lists' signature (int64 ids)


def blocked_matmul(queries: np.ndarray, gallery: np.ndarray, dtype: torch.dtype = torch.float32,
                   block: int = 4096, chunk: int = 16384) -> None:
    """The product ``queries @ gallery.T`` alone, in blocks (torch's threads), results dropped."""
    g = torch.from_numpy(gallery).to(dtype)
    buf = torch.empty(block * chunk, dtype=dtype)
    for s in range(0, len(queries), block):
        q = torch.from_numpy(queries[s : s + block]).to(dtype)
        for c in range(0, len(gallery), chunk):
            gc = g[c : c + chunk]
            torch.mm(q, gc.T, out=buf[: q.shape[0] * gc.shape[0]].view(q.shape[0], gc.shape[0]))


def tiled_matmul(queries: np.ndarray, gallery: np.ndarray) -> None:
    """The product as the fused pass computes it: tiles of ``fused.ROW_TILE`` rows x
    ``fused.CHUNK`` columns, one worker per torch thread running single-threaded products
    (5-12% faster than the blocked product on the AMD Zen 5 machine), results dropped."""
    q, g = torch.from_numpy(queries), torch.from_numpy(gallery)

    def rows(p0: int) -> None:
        buf = torch.empty(fused.ROW_TILE * fused.CHUNK)
        for c0 in range(0, len(g), fused.CHUNK):
            qt, gt = q[p0 : p0 + fused.ROW_TILE], g[c0 : c0 + fused.CHUNK]
            torch.mm(qt, gt.T, out=buf[: len(qt) * len(gt)].view(len(qt), len(gt)))

    with worker_pool() as ex:
        list(ex.map(rows, range(0, len(q), fused.ROW_TILE)))


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
    """Wall and CPU seconds of a section, and its system seconds and page faults: touching memory
    a VM's host has not backed yet costs several times more (docs/mining.md, section 2)."""

    def __enter__(self) -> "Clock":
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        self.system, self.faults = r1.ru_stime - self.r0.ru_stime, r1.ru_minflt - self.r0.ru_minflt

    def split(self) -> str:
        """The CPU time's system part, for the printed lines."""
        return f"{self.system:.2f} s of it system time, {self.faults:,} page faults"


def coco(tiles: int, top_captions: int, top_images: int) -> str:
    """Time a slice of the fused pass at the COCO shape, fp32 and bf16, and project the whole run."""
    gen = torch.Generator().manual_seed(0)
    img = unit_vectors(COCO_IMAGES, COCO_DIM, gen)
    cap = unit_vectors(COCO_IMAGES * COCO_CPI, COCO_DIM, gen)
    threads = torch.get_num_threads()
    print(f"COCO shape: {len(img)} images x {len(cap)} captions, d={COCO_DIM}, H={top_captions}/{top_images}, "
          f"{threads} torch threads; sample phase + {tiles} row tiles of {fused.ROW_TILE} rows per mode")
    result, rows = {}, {}
    for mode in ("fp32", "bf16"):
        with Clock() as setup:
            miner = fused.FusedPass(img, cap, COCO_CPI, top_captions, top_images, precision=mode)
        h = miner.sample_height
        firsts = list(range(h, h + tiles * fused.ROW_TILE, fused.ROW_TILE))
        with worker_pool() as ex:
            pool_map = lambda fn, items: list(ex.map(fn, items))  # noqa: E731
            with Clock() as sample:
                miner._sample_phase(pool_map, True)
            with Clock() as body:
                out = pool_map(lambda p: miner._row_tile(p, p + fused.ROW_TILE, True), firsts)
            with Clock() as finish:
                pool_map(lambda ci: miner._finish(miner.col_pools[ci], top_images, miner.tc[miner.bounds[ci]:
                                                                                          miner.bounds[ci + 1]]),
                         range(len(miner.col_pools)))
        rows[mode] = np.concatenate([ids for ids, _ in out])
        timed_ids = miner.img_order[firsts[0] : firsts[0] + tiles * fused.ROW_TILE]
        timed = tiles * fused.ROW_TILE
        scale = (COCO_IMAGES - h) / timed
        dtype = torch.float32 if mode == "fp32" else torch.bfloat16
        with Clock() as mm_sample:
            blocked_matmul(img[miner.img_order[:h]], cap, dtype)
        with Clock() as mm_body:
            blocked_matmul(img[miner.img_order[h : h + timed]], cap, dtype)
        del miner
        total = [a + b + c * scale + d for a, b, c, d in zip((setup.wall, setup.cpu), (sample.wall, sample.cpu),
                                                             (body.wall, body.cpu), (finish.wall, finish.cpu))]
        limit = [a + b * scale for a, b in zip((mm_sample.wall, mm_sample.cpu), (mm_body.wall, mm_body.cpu))]
        result[mode] = (total, limit)
        print(f"  {mode}: set-up {setup.wall:.1f} s ({setup.cpu:.1f} CPU), sample phase of {h} rows {sample.wall:.1f} s "
              f"({sample.cpu:.1f} CPU), {timed} rows {body.wall:.1f} s ({body.cpu:.1f} CPU) x {scale:.1f}, column sort "
              f"{finish.wall:.1f} s ({finish.cpu:.1f} CPU); bare {mode} products of the same rows {mm_sample.wall:.1f} + "
              f"{mm_body.wall:.1f} s ({mm_sample.cpu:.1f} + {mm_body.cpu:.1f} CPU)")
        print(f"  projected whole run, {mode}: {total[0]:.0f} s wall, {total[1]:.0f} s CPU (= {total[1] / threads:.0f} s "
              f"on {threads} idle cores); bare products {limit[0]:.0f} s wall, {limit[1]:.0f} s CPU; "
              f"ratio {total[1] / limit[1]:.2f} (CPU), {total[0] / limit[0]:.2f} (wall)")
    same_rows = float((rows["fp32"] == rows["bf16"]).all(axis=1).mean())
    same_ids = float((np.sort(rows["fp32"], axis=1) == np.sort(rows["bf16"], axis=1)).all(axis=1).mean())
    swap = worst_swap(img[timed_ids], cap, rows["fp32"], rows["bf16"])
    print(f"bf16 vs fp32 image lists on the timed rows: {same_rows:.4f} identical, {same_ids:.4f} with the same ids; "
          f"where the ids differ, an id only fp32 kept beats one only bf16 kept by at most {swap:.1e} in float64 "
          f"(float32 resolution at these scores: ~1e-8; a bf16 margin miss would show as ~1e-4 or more)")
    (f32, m32), (b16, m16) = result["fp32"], result["bf16"]
    return (f"RESULT coco_fp32_cpu_s={f32[1]:.0f} coco_fp32_wall_s={f32[0]:.0f} coco_bf16_cpu_s={b16[1]:.0f} "
            f"coco_bf16_wall_s={b16[0]:.0f} ratio_to_matmul_fp32={f32[1] / m32[1]:.2f} "
            f"ratio_to_bf16_matmul={b16[1] / m16[1]:.2f} bf16_rows_identical={same_rows:.4f} bf16_same_ids={same_ids:.4f} "
            f"bf16_worst_swap={swap:.1e}")


def coco_full(precision: str, top_captions: int, top_images: int, block_size: int, checked: int = 64) -> str:
    """Mine the whole COCO shape once (both directions, part files in a temporary folder, as
    ``aoq mine`` does) and check ``checked`` image and caption lists against a brute force of
    canonical scores (byte for byte) and of float64 products (the same ids, but where two scores
    round to the same float32 value at the k-th place)."""
    gen = torch.Generator().manual_seed(0)
    img = unit_vectors(COCO_IMAGES, COCO_DIM, gen)
    cap = unit_vectors(COCO_IMAGES * COCO_CPI, COCO_DIM, gen)
    print(f"COCO shape, whole run: {len(img)} images x {len(cap)} captions, d={COCO_DIM}, H={top_captions}/{top_images}, "
          f"{precision}, {torch.get_num_threads()} torch threads")
    with tempfile.TemporaryDirectory() as work, PeakMemory() as mem, Clock() as run:
        img_top, cap_top = mine_offline_negatives(img, cap, COCO_CPI, top_captions, top_images, block_size, "cpu",
                                                  work_dir=work, progress=True, precision=precision)
    print(f"  {run.wall:.0f} s wall, {run.cpu:.0f} s CPU ({run.split()}); extra peak memory {mem.mb:.0f} MB")
    rng = np.random.default_rng(0)
    same, identical, swaps = 0, 0, [0.0]
    for queries, gallery, got, own_of in ((img, cap, img_top, lambda i: slice(i * COCO_CPI, (i + 1) * COCO_CPI)),
                                          (cap, img, cap_top, lambda j: slice(j // COCO_CPI, j // COCO_CPI + 1))):
        picked = rng.choice(len(queries), checked, replace=False)
        own = [own_of(q) for q in picked]
        identical += int((canonical_brute_force(queries[picked], gallery, own, got.shape[1]) == got[picked])
                         .all(axis=1).sum())
        exact = brute_force(queries[picked], gallery, own, got.shape[1])
        same += int((np.sort(exact, axis=1) == np.sort(got[picked], axis=1)).all(axis=1).sum())
        swaps.append(worst_swap(queries[picked], gallery, exact, got[picked]))
    print(f"  {identical} of {2 * checked} checked lists are the canonical brute force's, byte for byte; {same} hold "
          f"the float64 brute force's ids; where not, an id it kept beats one the miner kept by at most {max(swaps):.1e}")
    return (f"RESULT coco_full_precision={precision} coco_full_wall_s={run.wall:.0f} coco_full_cpu_s={run.cpu:.0f} "
            f"peak_mb={mem.mb:.0f} checked_identical={identical / (2 * checked):.4f} "
            f"checked_same_ids={same / (2 * checked):.4f} checked_worst_swap={max(swaps):.1e}")


def slow_modes(default: str) -> dict[str, float]:
    """The filter modes other than ``default`` whose products this CPU runs slower than float32
    ones, with their speed-ups (those ``auto`` measured, cached: one tile on one core)."""
    speedups = {mode: speedup() for mode, speedup in SPEEDUPS.items() if mode != default}
    return {mode: x for mode, x in speedups.items() if x < 1}


def mine_timed(img: np.ndarray, cap: np.ndarray, cpi: int, top_k: tuple[int, int], block_size: int, mode: str,
               default: str) -> tuple[Clock, PeakMemory, tuple[np.ndarray, np.ndarray]]:
    """(a) in one precision mode: both directions mined once, part files in a temporary folder."""
    with tempfile.TemporaryDirectory() as work, PeakMemory() as mem, Clock() as clock:
        lists = mine_offline_negatives(img, cap, cpi, *top_k, block_size, "cpu", work_dir=work, progress=False,
                                       precision=mode)
    note = " (the default here)" if mode == default else ""
    print(f"(a {mode}) fused miner, both directions, {mode} products{note}: {clock.wall:.2f} s ({clock.cpu:.2f} s "
          f"CPU, {clock.split()}); extra peak memory {mem.mb:.0f} MB ({mem.method})", flush=True)
    return clock, mem, lists


def check_slow_modes(slow: dict[str, float], dim: int, cpi: int, block_size: int) -> float:
    """The share of lists byte-identical to the float32 mode's for each mode in ``slow`` (its
    products' speed-up over float32 ones, below 1 here), mined at the ``--quick`` shape: at full
    size such a mode would take many times the float32 mode's time, and no default picks it on
    this CPU."""
    gen = torch.Generator().manual_seed(2)
    img, cap = unit_vectors(QUICK["images"], dim, gen), unit_vectors(QUICK["images"] * cpi, dim, gen)
    top_k = QUICK["top_captions"], QUICK["top_images"]
    reference = mine_offline_negatives(img, cap, cpi, *top_k, block_size, "cpu", progress=False, precision="fp32")
    shares = []
    for mode, speedup in slow.items():
        lists = mine_offline_negatives(img, cap, cpi, *top_k, block_size, "cpu", progress=False, precision=mode)
        shares.append(identical_lists(reference, lists))
        print(f"    {mode} mode: products {speedup:.2f}x float32 on this CPU, not timed at this size (--all-modes "
              f"does); at the --quick shape ({len(img)} x {len(cap)}) {shares[-1]:.4%} of its lists are the fp32 "
              f"mode's, byte for byte", flush=True)
    return min(shares)


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
    p.add_argument("--loop-images", type=int, default=40, help="image anchors timed in (b)")
    p.add_argument("--loop-captions", type=int, default=200, help="caption anchors timed in (b)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--all-modes", action="store_true",
                   help="time every precision mode at full size, also those whose products this CPU runs slower "
                        "than float32 ones (by default those are only checked, at the --quick shape)")
    p.add_argument("--coco", action="store_true", help="the COCO shape on a slice, fp32 and bf16, projected")
    p.add_argument("--coco-tiles", type=int, default=4, help="row tiles timed with --coco, besides the sample phase")
    p.add_argument("--coco-full", choices=[*MODES, "auto"], default=None,
                   help="mine the whole COCO shape once in this precision (auto: the default here; 3-8 min on 2 "
                        "cores with bf16 or int8 products, ~10 GB of memory) and check 128 lists against brute force")
    args = p.parse_args(argv)
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    if args.threads:
        torch.set_num_threads(args.threads)
    warm_kernels()
    top_k = args.top_captions, args.top_images
    products = product_precision(torch.device("cpu"), "torch", "auto")  # the default's: "auto" here
    default = FILTER_MODES.get(products, "fp32")
    if args.coco:
        print(coco(args.coco_tiles, *top_k))
        return 0
    if args.coco_full:
        print(coco_full(default if args.coco_full == "auto" else args.coco_full, *top_k, args.block_size))
        return 0
    if args.quick:
        args.images, args.top_captions, args.top_images = QUICK["images"], QUICK["top_captions"], QUICK["top_images"]
        args.loop_images, args.loop_captions = 100, 500
    cpi = args.captions_per_image
    n_img, n_cap = args.images, args.images * cpi
    gen = torch.Generator().manual_seed(0)
    img, cap = unit_vectors(n_img, args.dim, gen), unit_vectors(n_cap, args.dim, gen)
    print(
        f"{n_img} images x {n_cap} captions, d={args.dim}, H={args.top_captions}/{args.top_images}, "
        f"block {args.block_size}, {torch.get_num_threads()} torch threads"
    )

    slow = {} if args.all_modes else slow_modes(default)
    timed_modes = [default, *(m for m in MODES if m != default and m not in slow)]
    runs = {mode: mine_timed(img, cap, cpi, top_k, args.block_size, mode, default) for mode in timed_modes}
    ours, mem, lists = runs[default]
    identical = min(identical_lists(runs["fp32"][2], runs[mode][2]) for mode in timed_modes)
    for mode in timed_modes:
        if mode != "fp32":
            print(f"    {mode} mode {agreement(img, cap, runs[mode][2], runs['fp32'][2])}; "
                  f"{identical_lists(runs['fp32'][2], runs[mode][2]):.4%} of all lists byte-identical")
    if slow:
        identical = min(identical, check_slow_modes(slow, args.dim, cpi, args.block_size))

    products_timed = {}
    for name, fn in (("blocks of 4096 x 16384, torch's threads", blocked_matmul),
                     (f"tiles of {fused.ROW_TILE} x {fused.CHUNK}, one per core", tiled_matmul)):
        with Clock() as products_timed[name]:
            fn(img, cap)
        print(f"(c) bare float32 product of the score matrix, once, in {name}: {products_timed[name].wall:.2f} s "
              f"({products_timed[name].cpu:.2f} s CPU)")
    wall_mm = min(c.wall for c in products_timed.values())  # the faster arrangement: the stricter reference
    cpu_mm = min(c.cpu for c in products_timed.values())
    ratios = {mode: (clock.wall / wall_mm, clock.cpu / cpu_mm) for mode, (clock, _, _) in runs.items()}
    shown = {mode: ("skipped",) * 2 if mode in slow else tuple(f"{r:.2f}" for r in ratios[mode]) for mode in MODES}
    for mode, (wall_ratio, cpu_ratio) in ratios.items():
        print(f"ratio (a {mode})/(c): {wall_ratio:.2f} wall, {cpu_ratio:.2f} CPU time "
              "(against the faster product; CPU time is less sensitive to other processes)")

    loops = {}
    for form in ("elementwise", "matvec"):
        per_img = public_loop(img, cap, args.top_captions, lambda i: slice(i * cpi, (i + 1) * cpi), args.loop_images, form)
        per_cap = public_loop(cap, img, args.top_images, lambda c: c // cpi, args.loop_captions, form)
        loops[form] = per_img * n_img + per_cap * n_cap
        print(
            f"(b) per-anchor loop [{form}]: {per_img * 1e3:.2f} ms/image anchor ({args.loop_images} timed), "
            f"{per_cap * 1e3:.2f} ms/caption anchor ({args.loop_captions} timed) -> {loops[form]:.0f} s extrapolated"
        )
    print(f"speedup vs the matrix-vector loop: {loops['matvec'] / ours.wall:.1f}x")
    threads = torch.get_num_threads()
    coco_s, coco_cpu_s = (t * coco_scale(n_img, n_cap, args.dim) for t in (ours.wall, ours.cpu / threads))
    print(f"COCO shape ({COCO_IMAGES} x {COCO_IMAGES * COCO_CPI}, d={COCO_DIM}) projected from this run's throughput "
          f"({default}, {threads} torch threads): {coco_s:.0f} s wall, {coco_cpu_s:.0f} s from the CPU time on "
          f"{threads} idle cores (score-matrix size x dimension; leaves out what grows with the pools, see --coco)")
    print(
        f"RESULT precision={products} identical_lists={identical:.4f} "
        f"speedup_vs_loop={loops['elementwise'] / ours.wall:.1f} "
        f"ratio_to_matmul={ratios[default][0]:.2f} ratio_to_matmul_cpu={ratios[default][1]:.2f} "
        + "".join(f"{mode}_mode_ratio={shown[mode][0]} {mode}_mode_ratio_cpu={shown[mode][1]} " for mode in MODES) +
        f"coco_projected_s={coco_s:.0f} coco_projected_cpu_s={coco_cpu_s:.0f} peak_mb={mem.mb:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
