"""Compiled per-score work of the fused pass (numba): the scan of a score tile and the pools' appends.

The fused pass (:mod:`training.mining.fused`) looks at every score once. With numpy each look was
several full passes over the tile (two compares, an or, a nonzero, gathers, a sort by column, a
scatter), together more than the product that made the tile; here a tile is read once and each
candidate is touched once more when it is appended. Every function releases the GIL (the pass runs
one worker thread per core) and is compiled on first use, then cached beside this file.

Keys are :mod:`training.mining.keys`'s packed (score, id) int64s; a pool is a dense ``(lists,
cap)`` key array with a fill count per list, and only the first ``fill`` keys of a list are
meaningful (nothing else is ever read).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

ID_MASK = 0x7FFFFFFF  # keys.ID_MASK (kept literal: compiled code reads module constants at compile time)
_GATHER = np.uint64(0x0102040810204080)


@njit(nogil=True, cache=True)
def scan(scores: np.ndarray, tr: np.ndarray, tc: np.ndarray, mask: np.ndarray,
         rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> int:
    """Positions and values of the tile's scores reaching their row's or their column's level:
    ``scores[r, c] >= min(tr[r], tc[c])``, in row-major order, written to ``rows``, ``cols`` and
    ``values`` (each at least ``scores.size`` long); returns how many.

    ``mask`` (uint8, at least the tile's width rounded up to 64) is scratch. Each row is first
    compared as a whole (a vectorised loop writing one flag byte per score), then every 8 flag
    bytes are gathered into 8 bits of a 64-bit word (one multiply) and the set bits are visited
    with a count of trailing zeros: the work follows the ~3% of scores that pass, not the tile."""
    n = 0
    n_rows, width = scores.shape
    groups = (width + 63) // 64
    mask[width : 64 * groups] = 0
    words = mask.view(np.uint64)
    for r in range(n_rows):
        t = tr[r]
        row = scores[r]
        for c in range(width):
            mask[c] = row[c] >= min(t, tc[c])
        for g in range(groups):
            bits = np.uint64(0)
            for b in range(8):
                # flag bytes (0 or 1) -> the top byte's bits, byte j to bit 56 + j, with no carries
                byte = (words[8 * g + b] * _GATHER) >> np.uint64(56)
                bits |= byte << np.uint64(8 * b)
            while bits:
                c = 64 * g + trailing_zeros(bits)
                rows[n] = r
                cols[n] = c
                values[n] = row[c]
                n += 1
                bits &= bits - np.uint64(1)
    return n


@njit(nogil=True, cache=True)
def append(lists: np.ndarray, others: np.ndarray, other_ids: np.ndarray, values: np.ndarray,
           threshold: np.ndarray, keys: np.ndarray, fill: np.ndarray, k: int) -> int:
    """Append candidate ``i`` (score ``values[i]``, id ``other_ids[others[i]]``) to list
    ``lists[i]`` when its score reaches ``threshold[lists[i]]``. A full list is first cut to its
    best ``k`` keys and its threshold raised to its k-th best score (nothing below it can enter
    its top k), so thresholds only rise and the lists stay exact. ``values`` must hold no -0.0
    (the keys' order would put it below +0.0). Returns the number of cuts."""
    cap = keys.shape[1]
    bits = values.view(np.int32)
    scratch = np.empty(1, dtype=np.int32)
    as_float = scratch.view(np.float32)
    cuts = 0
    for i in range(lists.shape[0]):
        li = lists[i]
        if values[i] < threshold[li]:
            continue
        if fill[li] == cap:
            part = np.partition(keys[li], cap - k)
            keys[li, :k] = part[cap - k:]
            fill[li] = k
            high = np.int32(part[cap - k] >> 32)
            scratch[0] = high ^ ((high >> 31) & ID_MASK)
            cuts += 1
            if as_float[0] > threshold[li]:
                threshold[li] = as_float[0]
            if values[i] < threshold[li]:
                continue
        b = bits[i]
        ordered = b ^ ((b >> 31) & ID_MASK)
        keys[li, fill[li]] = (np.int64(ordered) << 32) | (ID_MASK - np.int64(other_ids[others[i]]))
        fill[li] += 1
    return cuts
