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

and ``q~.g~ = s_q s_g P`` exactly. The scan evaluates ``v = float64(P) * s_q * s_g`` (two float64
roundings, ``|v - q~.g~| <= 2**-51 |q~| |g~|``); a sample tile's float32 copy of ``v`` adds one
float32 rounding (``2**-24 |v|``, plus ``2**-126`` for an underflow). :func:`error_bound` is the sum of these terms with every norm
replaced by its maximum over the rows, slightly inflated for the float64 arithmetic that computes
it: ``m``. So ``s_c >= L`` implies ``v >= L - m`` (and the float32 copy too), and the filter
compares with ``L - m`` rounded down to float32 (:func:`aoq_train.mining.canonical.float32_levels`):
no list member is ever filtered out, whatever the CPU, and the lists are those of the float32
mode, byte for byte. The price is the bound's width (several times the bfloat16 filter's):
more candidates to re-score (docs/mining.md, section 2).
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np
import torch
from numba import njit

from aoq_train.mining import canonical
from aoq_train.mining.bf16 import best_seconds

log = logging.getLogger(__name__)

INT8_MAX = 127
#: How much faster than float32 ones this CPU's int8 tile products must be for ``auto`` to pick
#: the int8 filter: its bound admits ~2.7x the float32 mode's candidates, and on a CPU whose
#: float32 products are fast their re-scoring costs what the faster products save (a 4.1x
#: product gained nothing over float32 as a whole pass, a ~9x one won: docs/mining.md, section 2).
INT8_PAYS_FACTOR = 6.0


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


def _norms(x: torch.Tensor, xi: torch.Tensor, scales: torch.Tensor) -> tuple[float, float, float]:
    """(max |x_r|, max |x~_r|, max |x_r - x~_r|) over the rows (:func:`_row_norms`)."""
    top = _row_norms(x.numpy(), xi.numpy(), scales.numpy())
    return float(top[0]), float(top[1]), float(top[2])


@njit(nogil=True, cache=True)
def _row_norms(x: np.ndarray, xi: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The three maxima of :func:`_norms`, in float64: ``x~ = s X`` is exact there (a 24-bit
    significand times a 7-bit integer) and each square and sum is one rounding, which the 1e-6
    inflation of :func:`error_bound` covers (compiled: numpy's float64 temporaries cost more
    than the int8 products of a small run)."""
    top = np.zeros(3)
    for r in range(x.shape[0]):
        s = np.float64(scales[r])
        a, b, c = 0.0, 0.0, 0.0
        for j in range(x.shape[1]):
            v = np.float64(x[r, j])
            w = np.float64(xi[r, j]) * s
            a += v * v
            b += w * w
            c += (v - w) * (v - w)
        top[0], top[1], top[2] = max(top[0], a), max(top[1], b), max(top[2], c)
    return np.sqrt(top) * (1 + 2.0**-50)


def error_bound(queries: torch.Tensor, gallery: torch.Tensor, qi: torch.Tensor, q_scales: torch.Tensor,
                gi: torch.Tensor, g_scales: torch.Tensor) -> float:
    """A proven bound ``m`` on the distance between a pair's canonical score and the scan's value
    of its int8 product (or that value's float32 copy), for every pair of rows (module
    docstring); ``qi``/``q_scales``, ``gi``/``g_scales``: :func:`quantize`'s roundings."""
    d = queries.shape[1]
    if d * INT8_MAX * INT8_MAX >= 2**31:
        raise ValueError(f"int8 products of dimension {d} may overflow int32: mine with precision fp32 or bf16")
    nq, nq8, eq = _norms(queries, qi, q_scales)
    ng, ng8, eg = _norms(gallery, gi, g_scales)
    bound = eq * ng + nq8 * eg + (2.0**-51 + 2.0**-24 * (1 + 2.0**-51)) * nq8 * ng8
    bound += canonical.canonical_error(d, nq, ng) + 2 * canonical.FLOAT32_TINY  # the float32 copy's underflow
    return bound * (1 + 1e-6) if math.isfinite(bound) else math.inf


def products(qi: torch.Tensor, gi: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``qi @ gi.T`` in int32, exact (``torch._int_mm``)."""
    if out is None:
        return torch._int_mm(qi, gi.T)
    return torch._int_mm(qi, gi.T, out=out)


def as_float32(p: np.ndarray, q_scales: np.ndarray, g_scales: np.ndarray) -> np.ndarray:
    """The float32 copy of a tile's values ``float64(P) * s_q * s_g`` (a sample tile: its
    thresholds are read with numpy)."""
    return ((p.astype(np.float64) * q_scales.astype(np.float64)[:, None]) * g_scales.astype(np.float64)[None, :]
            ).astype(np.float32)


@functools.lru_cache(maxsize=1)
def int8_pays(dim: int = 512, repeats: int = 5) -> bool:
    """Whether this CPU's single-threaded int8 products are at least ``INT8_PAYS_FACTOR`` times
    faster than float32 ones on a 512 x 1024 tile and exact there (int32 results equal to int64
    ones). Timed once per process: ``precision="auto"`` where the bf16 filter does not pay."""
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
        log.info("no int8 products here (%s): mining filters in fp32", err)
        return False
    finally:
        torch.set_num_threads(threads)
    speedup = best["fp32"] / best["int8"]
    pays = exact and speedup >= INT8_PAYS_FACTOR
    log.info("int8 products %.2fx float32 on one core%s: mining filters in %s", speedup,
             "" if exact else " but not exact", "int8" if pays else "fp32")
    return pays
