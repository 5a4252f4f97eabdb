"""The bfloat16 filter's guarantee: a proven bound on how far a bf16 product lies from the
canonical score of the same pair, the filter levels it implies, and whether bf16 pays on this CPU.

The fused pass (:mod:`aoq_train.mining.fused`) may score its tiles with bfloat16 products and
re-score only the candidates canonically (:mod:`aoq_train.mining.canonical`). No list member may be
filtered out, so a score must be a candidate whenever its canonical value ``s`` reaches a level
``L``. For a query ``q`` and a gallery row ``g`` (float32), with ``q~ = bf16(q)``, ``e_q = q~ - q``
(likewise for ``g``), ``y`` the bf16 product's float32 accumulator and ``b = bf16(y)`` the tile's
entry (round to nearest):

    |y - q~.g~| <= gamma_d |q~| |g~|            (float32 accumulation; bf16 x bf16 products are exact)
    |q~.g~ - q.g| = |e_q.g + q.e_g + e_q.e_g| <= |e_q| |g| + |q| |e_g| + |e_q| |e_g|    (Cauchy-Schwarz)
    |q.g - s| <= canonical_error                (aoq_train.mining.canonical: ~1e-7 for unit vectors)

with ``gamma_d = d u / (1 - d u)``, ``u = 2**-24``, plus ``2 d 2**-126`` for subnormals flushed to
zero. Their sum ``m`` (maxima of the norms over all rows) bounds ``|y - s|``. So ``s >= L``
implies ``y >= L - m``, and rounding to bf16 is monotone: ``b >= bf16(L - m) >= floor_bf16(L -
m)``. The filter compares ``b`` with that floor: exact, with no estimate anywhere. The bound is
several times the largest error seen on a tile, which the filter pays in extra candidates to
re-score (docs/mining.md, section 2). The same bound holds for any other rounding of the inputs
whose products accumulate in float32 (float16 on CUDA: :func:`error_bound` takes the rounded
copies).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from aoq_train.mining import canonical, kernels

log = logging.getLogger(__name__)

UNIT_ROUNDOFF = 2.0**-24  # float32
BF16_UNIT_ROUNDOFF = 2.0**-8
PAYS_FACTOR = 1.5  # bf16 products must be this much faster than float32 ones to be chosen by "auto"


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn``, after one untimed call (kernel selection,
    packing buffers)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _norms(x: torch.Tensor, x16: torch.Tensor, rows: int = 2048) -> tuple[float, float, float]:
    """Upper bounds on (max |x_r|, max |x16_r|, max |x16_r - x_r|) over the rows of a float32
    matrix and its bfloat16 (or float16) rounding (:func:`aoq_train.mining.canonical.max_norm`;
    the difference of a float32 value and its rounding is exact in float32). Small row groups:
    their float32 copies stay in the caches and in memory already faulted in, where a whole
    matrix at a time pays page faults for its copies. (Norms taken in float64 cost ~1 s of CPU
    at the benchmark's size, these ~0.1 s.)"""
    top = [0.0, 0.0, 0.0]
    for s in range(0, x.shape[0], rows):
        part = x[s : s + rows]
        rounded = x16[s : s + rows].float()
        for i, v in enumerate((part, rounded, rounded - part)):
            top[i] = max(top[i], canonical.max_norm(v))
    return top[0], top[1], top[2]


def error_bound(queries: torch.Tensor, gallery: torch.Tensor, queries16: torch.Tensor | None = None,
                gallery16: torch.Tensor | None = None) -> float:
    """A proven bound on ``|y - s|`` for every pair of rows (see the module docstring): ``y`` the
    float32 accumulator of their bf16 product, ``s`` their canonical score. ``queries16`` /
    ``gallery16``: the bfloat16 roundings, if already made (or float16 ones: the same bound for
    float16 products accumulated in float32). Slightly inflated (1e-6 relative) for the float64
    arithmetic that computes it."""
    d = queries.shape[1]
    gamma = d * UNIT_ROUNDOFF / (1 - d * UNIT_ROUNDOFF)
    nq, nq16, eq = _norms(queries, queries.bfloat16() if queries16 is None else queries16)
    ng, ng16, eg = _norms(gallery, gallery.bfloat16() if gallery16 is None else gallery16)
    bound = eq * ng + nq * eg + eq * eg + gamma * nq16 * ng16 + 2 * d * 2.0**-126
    bound += canonical.canonical_error(d, nq, ng)
    return bound * (1 + 1e-6)


def filter_levels(levels: np.ndarray, margin: float) -> np.ndarray:
    """The bf16 filter's levels for float32 ``levels``: the largest bfloat16 values at or below
    ``levels - margin`` (:func:`aoq_train.mining.kernels.bf16_filter_keys`), as float32 values,
    for a compare with bf16 products held as float32. A bf16 product whose float32 score reaches
    a level compares ``>=`` to its filter level (module docstring)."""
    keys = kernels.bf16_filter_keys(np.ascontiguousarray(levels, dtype=np.float32), float(margin))
    patterns = np.where(keys >= 0, keys, 0x8000 - keys).astype(np.uint32) << 16
    return patterns.view(np.float32)


def tile_within_bound(approx: np.ndarray, exact: np.ndarray, margin: float, unit: float = BF16_UNIT_ROUNDOFF) -> bool:
    """Whether a tile of fast products (as float32) lies within ``margin`` of the canonical
    scores ``exact``, plus the rounding of the result itself to a format of unit roundoff
    ``unit`` (bfloat16's by default; 0 for float32 results): a bound's premise (float32
    accumulation, round to nearest) holds for this CPU's products, at least on this tile."""
    finite = np.isfinite(approx) & np.isfinite(exact)
    slack = margin + unit * np.abs(approx[finite].astype(np.float64)) / (1 - unit)
    return bool((np.abs(approx[finite].astype(np.float64) - exact[finite]) <= slack).all())


def canonical_tile(q: torch.Tensor, g: torch.Tensor) -> np.ndarray:
    """The canonical scores of every pair of rows of ``q`` and ``g`` (float32), as a matrix: the
    reference a premise check compares a tile of fast products with."""
    rows, cols = np.indices((q.shape[0], g.shape[0])).reshape(2, -1)
    out = np.empty(rows.size, dtype=np.float32)
    canonical.rescore(q.contiguous().numpy(), g.contiguous().numpy(), 0, 0, rows, cols, out)
    return out.reshape(q.shape[0], g.shape[0])


@functools.lru_cache(maxsize=1)
def bf16_speedup(dim: int = 512, repeats: int = 5) -> float:
    """How many times faster this CPU's single-threaded bf16 products are than float32 ones on a
    512 x 1024 tile; 0 where they lie outside the proven bound. Timed once per process (the
    speed-ups measured per CPU are in docs/mining.md)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(512, dim, generator=gen), dim=1)
    g = torch.nn.functional.normalize(torch.randn(1024, dim, generator=gen), dim=1)
    q16, g16 = q.bfloat16(), g.bfloat16()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the pass runs single-threaded tiles, one per core
    try:
        best = {"fp32": best_seconds(lambda: torch.mm(q, g.T), repeats),
                "bf16": best_seconds(lambda: torch.mm(q16, g16.T), repeats)}
        within = tile_within_bound(torch.mm(q16, g16.T).float().numpy(), canonical_tile(q, g),
                                   error_bound(q, g, q16, g16))
    finally:
        torch.set_num_threads(threads)
    speedup = best["fp32"] / best["bf16"]
    log.info("bf16 products %.2fx float32 on one core%s", speedup, "" if within else " but outside the proven error bound")
    return speedup if within else 0.0


def bf16_pays() -> bool:
    """Whether this CPU's bf16 products are at least ``PAYS_FACTOR`` times faster than float32
    ones and within the proven bound: ``precision="auto"`` takes a low-precision filter."""
    return bf16_speedup() >= PAYS_FACTOR
