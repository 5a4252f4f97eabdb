"""The int8 filter of the fused CPU pass: exact integer products of rounded embeddings find the
candidates, the canonical score (:mod:`aoq_train.mining.canonical`) decides.

Where a CPU has no fast bfloat16 products (no AVX512-BF16 nor AMX), its int8 products (VNNI, or
the AVX2 / AVX-512BW multiply-adds) are still several times faster than float32 ones. Each row
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

import math

import numpy as np
import torch

from aoq_train.mining import canonical

INT8_MAX = 127


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


def _norms(x: torch.Tensor, xi: torch.Tensor, scales: torch.Tensor, rows: int = 4096) -> tuple[float, float, float]:
    """(max |x_r|, max |x~_r|, max |x_r - x~_r|) over the rows, in float64 (``x~ = s X`` and the
    difference are exact or within a float64 rounding there: the 1e-6 inflation of
    :func:`error_bound` covers them)."""
    top = [0.0, 0.0, 0.0]
    for s0 in range(0, x.shape[0], rows):
        part = x[s0 : s0 + rows].double()
        rounded = xi[s0 : s0 + rows].double() * scales[s0 : s0 + rows].double()[:, None]
        for i, v in enumerate((part, rounded, part - rounded)):
            top[i] = max(top[i], float(torch.linalg.vector_norm(v, dim=1).max()))
    return top[0], top[1], top[2]


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
