"""Candidate pools and sampled thresholds: the selection half of the fused pass (:mod:`training.mining.fused`)."""

from __future__ import annotations

import math

import numpy as np

from training.mining.keys import LOWEST, PAD, decode_scores


class Pool:
    """Candidate keys (:func:`training.mining.keys.encode_keys`) of ``n`` lists, at most ``cap``
    per list, held in one dense ``(n, cap)`` array padded with ``PAD``: adding is one scatter,
    and the lists are cut or sorted row by row without any gather."""

    def __init__(self, n: int, cap: int) -> None:
        self.n, self.cap = n, cap
        self.keys = np.full((n, cap), PAD, dtype=np.int64)
        self.fill = np.zeros(n, dtype=np.int64)

    def reset(self, n: int) -> None:
        """Empty the pool and use its first ``n`` lists (the array is reused: no new pages to fault in)."""
        width = int(self.fill.max()) if self.fill.size else 0
        self.keys[:, :width] = PAD
        self.n, self.fill = n, np.zeros(n, dtype=np.int64)

    def add(self, rows: np.ndarray, keys: np.ndarray, k: int) -> np.ndarray | None:
        """Append ``keys`` to the lists ``rows`` (non-decreasing). Lists that would overflow are
        first cut to their best ``k``; returns the lists' k-th best scores when any was cut
        (-inf for the others: the caller's thresholds rise to them), else None."""
        counts = np.bincount(rows, minlength=self.n)
        after = self.fill + counts
        kth = None
        if after.max() > self.cap:
            kth = self.compact(k, np.flatnonzero(after > self.cap))
            after = self.fill + counts
            if after.max() > self.cap:  # more than cap - k new keys for one list at once
                self._grow(int(after.max()))
        offset = np.arange(self.n) * self.cap + self.fill - (np.cumsum(counts) - counts)
        self.keys.reshape(-1)[offset[rows] + np.arange(rows.size)] = keys
        self.fill = after
        return kth

    def _grow(self, cap: int) -> None:
        keys = np.full((self.keys.shape[0], cap), PAD, dtype=np.int64)
        keys[:, : self.cap] = self.keys
        self.keys, self.cap = keys, cap

    def compact(self, k: int, lists: np.ndarray) -> np.ndarray:
        """Cut the given lists to their best ``k`` keys (unordered); returns every list's k-th
        best score (-inf where not cut or shorter): below it nothing can enter that list's top k."""
        kth = np.full(self.n, -np.inf, dtype=np.float32)
        lists = lists[self.fill[lists] > k]
        if not lists.size:
            return kth
        width = int(self.fill[lists].max())
        part = np.partition(self.keys[lists, :width], width - k, axis=1)
        self.keys[lists, :k] = part[:, width - k :]
        self.keys[lists, k:width] = PAD
        self.fill[lists] = k
        kth[lists] = decode_scores(part[:, width - k])
        return kth

    def rth_best(self, r: int) -> np.ndarray:
        """Each list's r-th best score (-inf where a list holds fewer than r keys)."""
        width = int(self.fill.max()) if self.n else 0
        out = np.full(self.n, -np.inf, dtype=np.float32)
        if width >= r:
            rth = np.partition(self.keys[: self.n, :width], width - r, axis=1)[:, width - r]
            full = self.fill >= r
            out[full] = decode_scores(rth[full])
        return out

    def best(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, short): each list's best k keys in decreasing order (``PAD`` where a list has
        fewer), and the lists with fewer than k."""
        width = int(self.fill.max()) if self.n else 0
        top = np.sort(self.keys[: self.n, : max(width, k)], axis=1)[:, -k:]  # a full sort beats partition + sort here
        return top[:, ::-1], self.fill < k


def sampled_threshold(blocks: list[np.ndarray], k: int, population: int, axis: int = 1) -> np.ndarray:
    """Per query, a score that about ``E >= k`` of its ``population`` scores reach, read from a
    fair sample of them: ``blocks`` hold the sample, queries along the other axis (rows of each
    block with axis=1, columns with axis=0), the sampled scores side by side along ``axis``.

    The r-th best of W sampled scores has about ``r N / W`` population scores above it, within a
    relative ~1/sqrt(r); r solves ``r - 3 sqrt(r) = W k / N``, so that fewer than k lie above only
    ~3 standard deviations out (such queries are redone exactly by the caller). The scores are
    first reduced to the maxima of groups of s, a cheap pass that divides the selection's work by
    s (s is chosen so that a group holds a score above the level with probability ~0.1; a group
    with two counts once, which lowers the threshold a little: the safe side). Returns ``LOWEST``
    (every finite score passes) where the sample is too small to say anything."""
    widths = [b.shape[axis] for b in blocks]
    width, n = sum(widths), blocks[0].shape[1 - axis]
    r = sample_rank(width, k, population)
    s = max(1, min(width // r, int(0.1 * width / r))) if r < width else 1
    groups = sum(w // s for w in widths)
    r = sample_rank(groups * s, k, population)
    if r >= groups:
        return np.full(n, LOWEST, dtype=np.float32)
    maxima = np.concatenate([_group_maxima(b, s, axis) for b in blocks], axis=1)
    return np.partition(maxima, groups - r, axis=1)[:, groups - r]


def _group_maxima(block: np.ndarray, s: int, axis: int) -> np.ndarray:
    """Maxima of consecutive groups of s scores along ``axis``, queries along the rows:
    elementwise maxima of s strided lanes (much faster than a reduce over a short axis)."""
    used = block.shape[axis] // s * s
    lane = (lambda j: block[:, j:used:s]) if axis == 1 else (lambda j: block[j:used:s])
    maxima = lane(0).copy()
    for j in range(1, s):
        np.maximum(maxima, lane(j), out=maxima)
    return maxima if axis == 1 else maxima.T


def sample_rank(width: int, k: int, population: int) -> int:
    """The rank r whose r-th best of ``width`` fairly sampled scores is a threshold that at least
    k of the ``population`` scores reach but for ~3 standard deviations (see :func:`sampled_threshold`)."""
    r0 = width * k / population
    return math.ceil(((3 + math.sqrt(9 + 4 * r0)) / 2) ** 2)
