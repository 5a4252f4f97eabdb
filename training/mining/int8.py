"""The int8 filter of the fused CPU pass: exact integer products of rounded embeddings find the
candidates, the canonical score (:mod:`aoq_train.mining.canonical`) decides.

Where a CPU has no fast bfloat16 products (no AVX512-BF16 nor AMX), its int8 products may still
be several times faster than float32 ones (VNNI); where torch has no fast int8 kernel for the CPU
(AVX2 only) they are much slower. The filter's wide bound admits more candidates to re-score, so
``auto`` picks it only where the products are faster by far (:func:`int8_pays`). Each row
``x`` of either matrix is rounded to ``x~ = s X``: ``s = max_j |x_j| / 127`` (float32) and ``X =
round(x / s)`` (int8, in [-127, 127]); ``torch._int_mm`` gives ``P = Q G^T`` in int32, exactly
(``|P| <= 127^2 d < 2^31``). For a query ``q``, a gallery row ``g``, ``e_q = q - q~``, ``e_g = g -
g~`` and their canonical score ``s_c``:

    q.g - q~.g~ = e_q.g + q~.e_g                  so |q.g - q~.g~| <= |e_q| |g| + |q~| |e_g|  (Cauchy-Schwarz)
    |q.g - s_c| <= canonical_error                (aoq_train.mining.canonical)

and ``q~.g~ = s_q s_g P`` exactly. A sample tile's float32 copy ``float32((float64(P) * s_q) *
s_g)`` is within ``2**-51 |q~| |g~|`` (two float64 roundings) plus one float32 rounding
(``2**-24 |v|``, plus ``2**-126`` for an underflow) of ``q~.g~``. The row tiles' scan works in
float32 (twice the lanes of float64): ``v = (float32(P) * s_q) * s_g`` and ``v + (A_r + B_c) >=
L``, five float32 roundings, each within ``2**-24`` of its result relatively (``P`` itself is
exact below ``2**24``) and ``2**-126`` absolutely (an underflow, or a flush to zero). With ``u =
2**-24``, ``N = |q~| |g~|`` and ``a_r + b_c`` the Cauchy-Schwarz terms above (the canonical error
in ``a_r``), the float32 ``v`` is within ``3.001 u N`` of ``q~.g~``, the sum ``A_r + B_c``
loses at most ``u (A_r + B_c)`` and the last addition ``u |v + A_r + B_c|``: so ``A_r = a_r +
8 u (N + max a + max b)`` (plus the absolute terms) and ``B_c = b_c``, both rounded up to
float32, leave ``v + (A_r + B_c) >= L`` whenever ``s_c >= L``. :func:`error_bounds` computes
these terms, slightly inflated for the float64 arithmetic that computes them, in two forms: with
every norm at its maximum over the rows, ``m``, which a sample tile's float32 copy is compared
with (``L - m`` rounded down to float32, :func:`aoq_train.mining.canonical.float32_levels`); and
per pair, ``A_r + B_c`` (the rounding errors' norms kept per row), for the row tiles' scan.
Either way ``s_c >= L`` implies that the pair passes: no list member is ever filtered out,
whatever the CPU, and the lists are those of the float32 mode, byte for byte. The price is the
bound's width (several times the bfloat16 filter's): more candidates to re-score (docs/mining.md,
section 2).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from aoq_train.mining import canonical
from aoq_train.mining.bf16 import best_seconds

log = logging.getLogger(__name__)

INT8_MAX = 127
#: How much faster than float32 ones this CPU's int8 tile products must be for ``auto`` to pick
#: the int8 filter: its bound admits more than twice the float32 mode's candidates, and on a CPU
#: whose float32 products are fast their re-scoring costs what the faster products save (a 4.1x
#: product gained nothing over float32 as a whole pass, before the per-pair bound; a ~9x one won:
#: docs/mining.md, section 2).
INT8_PAYS_FACTOR = 6.0
#: Where bf16 products pay as well, the share of the float32 tile product's time that int8 products
#: must save over bf16 ones for ``auto`` to pick the int8 filter (its wider bound leaves more
#: candidates to re-score): int8 saved 0.22 on an AMD Zen 4, whose int8 pass was the faster, and
#: ~0.11 on an AMD Zen 5, whose two passes tied (docs/mining.md, section 2).
INT8_OVER_BF16 = 0.15


def quantize(x: torch.Tensor, rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """(``X``, ``s``): each float32 row rounded to ``s X``, ``X`` int8 in [-127, 127], ``s`` its
    float32 scale (1 for an all-zero row), a few rows at a time (no large float temporaries)."""
    out = torch.empty(x.shape, dtype=torch.int8)
    scales = torch.empty(x.shape[0], dtype=torch.float32)
    for s0 in range(0, x.shape[0], rows):
        part = x[s0 : s0 + rows]
        scale = part.abs().amax(dim=1) / INT8_MAX
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        out[s0 : s0 + rows] = torch.round(part / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        scales[s0 : s0 + rows] = scale
    return out, scales


@njit(nogil=True, cache=True)
def _row_norms(x: np.ndarray, xi: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per row, ``(|x_r|, |x~_r|, |x_r - x~_r|)`` (n, 3), in float64: ``x~ = s X`` is exact there (a
    24-bit significand times a 7-bit integer) and each square and sum is one rounding, which the
    ``2**-50`` inflation and the 1e-6 of :func:`error_bounds` cover (compiled: numpy's float64
    temporaries cost more than the int8 products of a small run)."""
    out = np.empty((x.shape[0], 3))
    for r in range(x.shape[0]):
        s = np.float64(scales[r])
        a, b, c = 0.0, 0.0, 0.0
        for j in range(x.shape[1]):
            v = np.float64(x[r, j])
            w = np.float64(xi[r, j]) * s
            a += v * v
            b += w * w
            c += (v - w) * (v - w)
        out[r, 0], out[r, 1], out[r, 2] = a, b, c
    return np.sqrt(out) * (1 + 2.0**-50)


@dataclass(frozen=True)
class Bounds:
    """How far a pair's canonical score ``s_c`` may lie from the scans' values of its int8
    product (module docstring): ``margin`` for every pair's float32 copy (the sample tiles);
    ``rows[r] + columns[c]`` (float32, rounded up) for pair ``(r, c)`` in the row tiles' float32
    scan, :func:`aoq_train.mining.kernels.scan_int8`, its own roundings included."""

    margin: float
    rows: np.ndarray
    columns: np.ndarray


#: Beyond this product of the rounded rows' largest norms the float32 scan could overflow: every
#: pair then passes (infinite bounds), as where the margin itself is not finite.
FLOAT32_SAFE_PRODUCT = 2.0**120


def _float32_up(x: np.ndarray) -> np.ndarray:
    """``x`` (float64) rounded up to float32 (``inf`` past float32's range)."""
    with np.errstate(over="ignore"):
        out = x.astype(np.float32)
    low = out.astype(np.float64) < x
    out[low] = np.nextafter(out[low], np.float32(np.inf))
    return out


def error_bounds(queries: torch.Tensor, gallery: torch.Tensor, qi: torch.Tensor, q_scales: torch.Tensor,
                 gi: torch.Tensor, g_scales: torch.Tensor) -> Bounds:
    """Proven bounds on the distance between a pair's canonical score and the scan's value of its
    int8 product; ``qi``/``q_scales``, ``gi``/``g_scales``: :func:`quantize`'s roundings.

    ``margin`` takes every norm at its maximum over the rows. The per-pair bound keeps the
    rounding errors' norms per row: ``|e_q| |g| + |q~| |e_g| <= |e_q| max|g| + max|q~| |e_g|``, a
    row term plus a column term, with the float32 scan's and the canonical score's own errors
    (taken at the maximal norms) in the row term. ``|e_q|`` ranges over ~1.7x between the rows of
    random unit vectors (the largest sets ``margin``), so the pairs' bounds are ~40% narrower on
    average, and fewer candidates pass the filter."""
    d = queries.shape[1]
    if d * INT8_MAX * INT8_MAX >= 2**31:
        raise ValueError(f"int8 products of dimension {d} may overflow int32: mine with precision fp32 or bf16")
    q_norms = _row_norms(queries.numpy(), qi.numpy(), q_scales.numpy())
    g_norms = _row_norms(gallery.numpy(), gi.numpy(), g_scales.numpy())
    (nq, nq8, eq), (ng, ng8, eg) = q_norms.max(axis=0, initial=0.0), g_norms.max(axis=0, initial=0.0)
    product, canonical_error = nq8 * ng8, canonical.canonical_error(d, nq, ng)
    tiny, u = canonical.FLOAT32_TINY, canonical.UNIT_ROUNDOFF
    margin = eq * ng + nq8 * eg + canonical_error + (2.0**-51 + u * (1 + 2.0**-51)) * product + 2 * tiny
    if not math.isfinite(margin) or product >= FLOAT32_SAFE_PRODUCT:
        return Bounds(math.inf, np.full(len(q_norms), np.inf, np.float32), np.full(len(g_norms), np.inf, np.float32))
    inflate = 1 + 1e-6
    rows, columns = q_norms[:, 2] * ng + canonical_error, nq8 * g_norms[:, 2]
    # the scan's five float32 roundings (module docstring); the absolute terms cover underflows and
    # flushed subnormal scales (a scale below 2**-126 leaves |q~.g~| <= 127 d 2**-126 max|g~|)
    scan = 8 * u * (product + rows.max(initial=0.0) + columns.max(initial=0.0)) + (127 * d * (nq8 + ng8) + 8) * tiny
    return Bounds(margin * inflate, _float32_up((rows + scan) * inflate), _float32_up(columns * inflate))


def products(qi: torch.Tensor, gi: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``qi @ gi.T`` in int32, exact (``torch._int_mm``)."""
    if out is None:
        return torch._int_mm(qi, gi.T)
    return torch._int_mm(qi, gi.T, out=out)


def as_float32(p: np.ndarray, q_scales: np.ndarray, g_scales: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The float32 copy of a tile's values ``float64(P) * s_q * s_g`` (the scales taken in float64) into
    ``out``: what sampled thresholds are read from, with numpy. Compiled, with no temporaries:
    the sample phase's tiles are tall (thousands of rows), and numpy's float64 temporaries of
    such a tile cost as much as its product (docs/mining.md, section 2)."""
    _scale_into(p, q_scales, g_scales, out)
    return out


@njit(nogil=True, cache=True)
def _scale_into(p: np.ndarray, q_scales: np.ndarray, g_scales: np.ndarray, out: np.ndarray) -> None:
    """``out[r, c] = float32((float64(p[r, c]) * q_scales[r]) * g_scales[c])``."""
    for r in range(p.shape[0]):
        s = np.float64(q_scales[r])
        for c in range(p.shape[1]):
            out[r, c] = np.float32((np.float64(p[r, c]) * s) * np.float64(g_scales[c]))


@functools.lru_cache(maxsize=1)
def int8_speedup(dim: int = 512, repeats: int = 5) -> float:
    """How many times faster this CPU's single-threaded int8 products are than float32 ones on a
    512 x 1024 tile; 0 where they are not exact there (int32 results against int64 ones) or torch
    has none. Timed once per process."""
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(512, dim, generator=gen), dim=1)
    g = torch.nn.functional.normalize(torch.randn(1024, dim, generator=gen), dim=1)
    (qi, _), (gi, _) = quantize(q), quantize(g)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the pass runs single-threaded tiles, one per core
    try:
        best = {"fp32": best_seconds(lambda: torch.mm(q, g.T), repeats),
                "int8": best_seconds(lambda: products(qi, gi), repeats)}
        exact = bool((products(qi[:64], gi).long() == qi[:64].long() @ gi.long().T).all())
    except (RuntimeError, NotImplementedError) as err:  # a torch build without int8 products on this CPU
        log.info("no int8 products here (%s)", err)
        return 0.0
    finally:
        torch.set_num_threads(threads)
    speedup = best["fp32"] / best["int8"]
    log.info("int8 products %.2fx float32 on one core%s", speedup, "" if exact else " but not exact")
    return speedup if exact else 0.0


def int8_pays() -> bool:
    """Whether this CPU's int8 products are exact and at least ``INT8_PAYS_FACTOR`` times faster
    than float32 ones: ``precision="auto"`` where the bf16 filter does not pay."""
    return int8_speedup() >= INT8_PAYS_FACTOR


def int8_beats_bf16(bf16_speedup: float) -> bool:
    """Where bf16 products pay (``bf16_speedup`` times float32's), whether ``precision="auto"``
    takes the int8 filter instead: its products must save at least ``INT8_OVER_BF16`` of the
    float32 product's time over bf16 ones (``1 / bf16_speedup - 1 / int8_speedup``) to pay for
    the wider bound's extra re-scoring."""
    speedup = int8_speedup()
    return speedup > 0 and 1 / bf16_speedup - 1 / speedup >= INT8_OVER_BF16
