"""Compiled per-score work of the fused pass (numba): the scan of a score tile and the pools' appends
(the candidates' canonical re-scoring is :func:`aoq_train.mining.canonical.rescore`).

The fused pass (:mod:`aoq_train.mining.fused`) looks at every score once. With numpy each look was
several full passes over the tile (two compares, an or, a nonzero, gathers, a sort by column, a
scatter), together more than the product that made the tile; here a tile is read once and each
candidate is touched once more when it is appended. Every function releases the GIL (the pass runs
one worker thread per core) and is compiled on first use, then cached beside this file.

Keys are :mod:`aoq_train.mining.keys`'s packed (score, id) int64s; a pool is a dense ``(lists,
cap)`` key array with a fill count per list, and only the first ``fill`` keys of a list are
meaningful (nothing else is ever read).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

ID_MASK = 0x7FFFFFFF  # keys.ID_MASK (kept literal: compiled code reads module constants at compile time)
_GATHER = np.uint64(0x0102040810204080)
BF16_LOWEST_KEY = 0x8000 - 0xFF7F  # the key of the most negative finite bfloat16


@njit(nogil=True, cache=True, inline="always")
def _flag_groups(mask: np.ndarray, width: int) -> int:
    """The 64-flag groups a row of ``width`` scores spans, with the flags past ``width`` cleared
    (they are read with the last group)."""
    groups = (width + 63) // 64
    mask[width : 64 * groups] = 0
    return groups


@njit(nogil=True, cache=True, inline="always")
def _collect(mask: np.ndarray, groups: int, r: int, rows: np.ndarray, cols: np.ndarray, n: int) -> int:
    """Append the positions of row ``r``'s set flag bytes (``mask``, one byte per score) to
    ``rows`` and ``cols`` from index ``n``; returns the new count. Every 8 flag bytes are gathered
    into 8 bits of a 64-bit word (one multiply) and the set bits are visited with a count of
    trailing zeros: the work follows the few scores that pass, not the tile."""
    words = mask.view(np.uint64)
    for g in range(groups):
        bits = np.uint64(0)
        for b in range(8):
            # flag bytes (0 or 1) -> the top byte's bits, byte j to bit 56 + j, with no carries
            byte = (words[8 * g + b] * _GATHER) >> np.uint64(56)
            bits |= byte << np.uint64(8 * b)
        while bits:
            rows[n] = r
            cols[n] = 64 * g + trailing_zeros(bits)
            n += 1
            bits &= bits - np.uint64(1)
    return n


@njit(nogil=True, cache=True)
def mask_own(scores: np.ndarray, own: np.ndarray, c0: int, c1: int, value: float) -> None:
    """Set ``scores[r, own[r, u] - c0]`` to ``value`` wherever ``c0 <= own[r, u] < c1``: a tile's
    own positives (``own``: each row's own gallery positions; the tile holds columns [c0, c1)).
    Compiled: a tile holds only a few of them, yet numpy's masks and gathers over all of ``own``
    ran for every tile (docs/mining.md, section 5)."""
    for r in range(scores.shape[0]):
        for u in range(own.shape[1]):
            pos = own[r, u]
            if c0 <= pos < c1:
                scores[r, pos - c0] = value


@njit(nogil=True, cache=True)
def scan(scores: np.ndarray, tr: np.ndarray, tc: np.ndarray, mask: np.ndarray,
         rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> int:
    """Positions and values of the tile's scores reaching their row's or their column's level:
    ``scores[r, c] >= min(tr[r], tc[c])``, in row-major order, written to ``rows``, ``cols`` and
    ``values`` (each at least ``scores.size`` long); returns how many.

    ``mask`` (uint8, at least the tile's width rounded up to 64) is scratch: each row is first
    compared as a whole (a vectorised loop writing one flag byte per score), then its flags are
    collected (:func:`_collect`)."""
    n = 0
    n_rows, width = scores.shape
    groups = _flag_groups(mask, width)
    for r in range(n_rows):
        t = tr[r]
        row = scores[r]
        for c in range(width):
            mask[c] = row[c] >= min(t, tc[c])
        first = n
        n = _collect(mask, groups, r, rows, cols, n)
        for i in range(first, n):
            values[i] = row[cols[i]]
    return n


@njit(nogil=True, cache=True)
def scan_bf16(bits: np.ndarray, kr: np.ndarray, kc: np.ndarray, mask: np.ndarray,
              rows: np.ndarray, cols: np.ndarray) -> int:
    """:func:`scan` on a tile of bfloat16 scores, read as their bit patterns (uint16), with the
    levels given as keys of bfloat16 values (:func:`bf16_filter_keys`): positions of the scores
    ``>= min`` of their row's and their column's level, exactly, with no float32 copy of the tile. A bit pattern ``u`` is
    compared through its order-preserving integer key, ``u`` for a positive score and ``0x8000 -
    u`` for a negative one. No values: the caller re-scores the positions in float32."""
    n = 0
    n_rows, width = bits.shape
    groups = _flag_groups(mask, width)
    for r in range(n_rows):
        t = kr[r]
        row = bits[r]
        for c in range(width):
            u = np.int32(row[c])
            key = u if u < 0x8000 else 0x8000 - u
            mask[c] = key >= min(t, kc[c])
        n = _collect(mask, groups, r, rows, cols, n)
    return n


@njit(nogil=True, cache=True)
def scan_int8(products: np.ndarray, q_scales: np.ndarray, g_scales: np.ndarray, tr: np.ndarray, tc: np.ndarray,
              q_terms: np.ndarray, g_terms: np.ndarray, mask: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> int:
    """:func:`scan` on a tile of exact int8 products (int32, :mod:`aoq_train.mining.int8`): a
    score is ``v = (float32(p) * q_scales[r]) * g_scales[c]``, in that order, and passes when
    ``v + (q_terms[r] + g_terms[c]) >= min(tr[r], tc[c])``, all in float32 (twice the lanes of
    float64), with ``tr``/``tc`` the thresholds themselves and the terms the pair's bound, which
    covers these roundings (:class:`aoq_train.mining.int8.Bounds`); every array float32.
    ``INT32_MIN`` marks an own positive, which never passes. No values: the caller re-scores the
    positions."""
    n = 0
    n_rows, width = products.shape
    groups = _flag_groups(mask, width)
    lowest = np.int32(-2147483648)
    for r in range(n_rows):
        t = tr[r]
        sq = q_scales[r]
        a = q_terms[r]
        row = products[r]
        for c in range(width):
            p = row[c]
            v = (np.float32(p) * sq) * g_scales[c]
            mask[c] = (p != lowest) & (v + (a + g_terms[c]) >= min(t, tc[c]))
        n = _collect(mask, groups, r, rows, cols, n)
    return n


@njit(nogil=True, cache=True)
def bf16_filter_keys(levels: np.ndarray, margin: float) -> np.ndarray:
    """The integer keys (see :func:`scan_bf16`) of the largest bfloat16 values at or below
    ``levels - margin`` (float32 levels; the difference taken in float64 and rounded down to
    float32, then to bfloat16), never below the most negative finite bfloat16: a ``LOWEST`` level
    lets every finite score pass and -inf fail (:mod:`aoq_train.mining.bf16` says why this is
    the filter's level)."""
    out = np.empty(levels.shape[0], dtype=np.int32)
    scratch = np.empty(1, dtype=np.float32)
    bits = scratch.view(np.uint32)
    for i in range(levels.shape[0]):
        wanted = np.float64(levels[i]) - margin
        scratch[0] = np.float32(wanted)
        if np.float64(scratch[0]) > wanted:  # rounded up: one float32 step down
            if scratch[0] > 0:
                bits[0] -= 1
            elif scratch[0] < 0:
                bits[0] += 1
            else:
                bits[0] = 0x80000001  # the negative value nearest zero
        b = bits[0]
        high = np.int32(b >> 16)  # truncation: down for a positive value, up for a negative one
        if b >> 31 and b & 0xFFFF:
            high += 1  # negative and between two bfloat16 values: the one below
        key = high if high < 0x8000 else 0x8000 - high
        out[i] = max(key, BF16_LOWEST_KEY)
    return out


@njit(nogil=True, cache=True)
def pad_lists(keys: np.ndarray, fill: np.ndarray, width: int) -> None:
    """Fill each list's slots from its fill to ``width`` with distinct pads below every key
    (``PAD + slot``: a key's high half never encodes a NaN, so every key is far above them), so
    that numpy can partition or sort the pool's first ``width`` slots of every list at once (its
    vectorised partition is several times faster than a compiled quickselect; a ragged pool is
    not one array to numpy; equal pads slowed it down). :func:`unpad_lists` restores the pool."""
    low = np.iinfo(np.int64).min
    for i in range(fill.shape[0]):
        for j in range(fill[i], width):
            keys[i, j] = low + j


@njit(nogil=True, cache=True)
def unpad_lists(keys: np.ndarray, fill: np.ndarray, width: int, front: int) -> None:
    """After numpy reordered each list's first ``width`` slots (:func:`pad_lists`), put its keys
    back in its first ``fill`` slots: the last ``front`` slots reversed first (numpy's ascending
    order made decreasing; ``PAD`` past a list's fill when it holds fewer), then the list's other
    keys."""
    low = np.iinfo(np.int64).min
    pads = low + width  # every pad is below it, every key above
    scratch = np.empty(width if front else 0, dtype=np.int64)
    for i in range(fill.shape[0]):
        row = keys[i]
        source = row
        if front:
            scratch[:] = row[:width]
            source = scratch
            for j in range(front):
                x = source[width - 1 - j]
                row[j] = x if x >= pads else low
        w = front
        for j in range(width - front):  # forward: in place when nothing comes first
            x = source[j]
            row[w] = x
            w += x >= pads


@njit(nogil=True, cache=True)
def append(lists: np.ndarray, others: np.ndarray, other_ids: np.ndarray, values: np.ndarray,
           threshold: np.ndarray, keys: np.ndarray, fill: np.ndarray, k: int) -> int:
    """Append candidate ``i`` (score ``values[i]``, id ``other_ids[others[i]]``) to list
    ``lists[i]`` when its score reaches ``threshold[lists[i]]``. A full list is first cut to its
    best ``k`` keys and its threshold raised to its k-th best score (nothing below it can enter
    its top k), so thresholds only rise and the lists stay exact. A -0.0 is keyed as +0.0 (the
    keys' order would put it below). Returns the number of cuts."""
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
        if b == np.int32(-2147483648):  # -0.0
            b = np.int32(0)
        ordered = b ^ ((b >> 31) & ID_MASK)
        keys[li, fill[li]] = (np.int64(ordered) << 32) | (ID_MASK - np.int64(other_ids[others[i]]))
        fill[li] += 1
    return cuts
