"""Candidate pools and sampled thresholds: the selection half of the fused pass (:mod:`aoq_train.mining.fused`)."""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from aoq.io import atomic_open
from aoq_train.mining import kernels
from aoq_train.mining.keys import LOWEST, PAD, decode_scores


def fresh_array(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zeroed array in a fresh private anonymous mapping, on ordinary pages. numpy would
    advise huge pages for an array this large (``MADV_HUGEPAGE``), and where free memory is
    fragmented the kernel then compacts it on the first touch, which costs more system time than
    the faults of ordinary pages; a shared mapping (shmem) faults slower still (figures:
    docs/mining.md, "Measurements behind the code")."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size < 2**21:
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)  # the array holds the mapping alive


class Pool:
    """Candidate keys (:func:`aoq_train.mining.keys.encode_keys`) of ``n`` lists, at most ``cap``
    per list, held in one dense ``(n, cap)`` array with a fill count per list: appending is a
    write at the list's end, and a full list is cut to its best k in place
    (:func:`aoq_train.mining.kernels.append`). Only a list's first ``fill`` keys are meaningful,
    so an emptied pool is reused without touching its keys."""

    def __init__(self, n: int, cap: int, keys: np.ndarray | None = None) -> None:
        """``keys``: an ``(n, cap)`` int64 array to hold the lists in (a view of a larger one),
        else a fresh one."""
        self.n, self.cap = n, cap
        self.keys = fresh_array((n, cap), np.int64) if keys is None else keys
        self.fill = np.zeros(n, dtype=np.int64)

    def reset(self, n: int) -> None:
        """Empty the pool and use its first ``n`` lists (the array is reused: no new pages to fault in)."""
        self.n = n
        self.fill[:n] = 0

    def add(self, lists: np.ndarray, others: np.ndarray, other_ids: np.ndarray, values: np.ndarray, k: int,
            threshold: np.ndarray) -> int:
        """Append the candidates reaching their list's ``threshold`` (raised in place whenever a
        full list is cut to its best ``k``, see :func:`aoq_train.mining.kernels.append`): list
        ``lists[i]`` gets score ``values[i]`` (float32) with id ``other_ids[others[i]]``.
        Returns the number of cuts."""
        values = np.ascontiguousarray(values, dtype=np.float32)  # no copy: the scan's own array
        return kernels.append(lists, others, other_ids, values, threshold, self.keys, self.fill[: self.n], k)

    def rth_best(self, r: int) -> np.ndarray:
        """Each list's r-th best score (-inf where a list holds fewer than r keys). Reorders the
        lists in place (a list's order never matters to the pool)."""
        fill = self.fill[: self.n]
        out = np.full(self.n, -np.inf, dtype=np.float32)
        width = int(fill.max(initial=0))
        if width < r:
            return out
        kernels.pad_lists(self.keys, fill, width)
        lists = self.keys[: self.n, :width]
        lists.partition(width - r, axis=1)  # ascending, the pads lowest: the r-th best at width - r
        held = np.flatnonzero(fill >= r)
        out[held] = decode_scores(lists[held, width - r])
        kernels.unpad_lists(self.keys, fill, width, 0)
        return out

    def best(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, short): each list's best k keys in decreasing order (``PAD`` where a list has
        fewer), and the lists with fewer than k. Reorders the lists in place (the best k first, in
        that order: numpy partitions and sorts the padded lists, :func:`aoq_train.mining.kernels.
        pad_lists`) and returns a view: read it before the pool changes again."""
        fill = self.fill[: self.n]
        if k > self.cap:
            keys = self.padded(k)
            keys.sort(axis=1)  # numpy's vectorised sort
            keys[...] = keys[:, ::-1]
            return keys, fill < k
        width = max(k, int(fill.max(initial=0)))
        kernels.pad_lists(self.keys, fill, width)
        lists = self.keys[: self.n, :width]
        if width > k:
            lists.partition(width - k, axis=1)  # ascending: the best k last
        lists[:, width - k :].sort(axis=1)
        kernels.unpad_lists(self.keys, fill, width, k)  # decreasing, first; the other keys after them
        return self.keys[: self.n, :k], fill < k

    def padded(self, width: int) -> np.ndarray:
        """The first ``width`` key slots of every list, ``PAD`` past each list's fill."""
        used = min(width, self.cap)
        out = np.full((self.n, width), PAD, dtype=np.int64)
        np.copyto(out[:, :used], self.keys[: self.n, :used], where=np.arange(used) < self.fill[: self.n, None])
        return out

    def load(self, keys: np.ndarray, fill: np.ndarray) -> None:
        """Restore the lists saved as :meth:`padded` keys and their fill counts."""
        self.keys[: self.n, : keys.shape[1]] = keys
        self.fill[: self.n] = fill


def sample_width(n: int, k: int, hits: int) -> int:
    """Ids to sample for a threshold with about ``hits`` sampled scores above its level."""
    return min(n, math.ceil(hits * n / k))


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
    # contiguous: a strided array (the columns' transposed maxima) partitions several times slower
    maxima = np.ascontiguousarray(np.concatenate([_group_maxima(b, s, axis) for b in blocks], axis=1))
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


def save_pools(folder: Path, position: int, pools: list[Pool], thresholds: np.ndarray) -> None:
    """Save column pools (consecutive lists, in order) and their thresholds as they are once the
    rows below ``position`` are scored: the keys first, then the small file naming them (its
    presence validates them)."""
    width = max(int(p.fill.max()) for p in pools)
    n = sum(p.n for p in pools)
    keys_file = folder / f"columns_{position:010d}.npy"
    with atomic_open(keys_file) as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<i8", "fortran_order": False, "shape": (n, width)})
        for p in pools:
            fh.write(p.padded(width).tobytes())
    with atomic_open(folder / "columns.npz") as fh:
        np.savez(fh, keys_file=keys_file.name, position=position, width=width, tc=thresholds,
                 fill=np.concatenate([p.fill[: p.n] for p in pools]))
    for old in folder.glob("columns_*.npy"):
        if old != keys_file:
            old.unlink(missing_ok=True)


def load_pools(folder: Path, pools: list[Pool], bounds: list[int], thresholds: np.ndarray,
               usable: Callable[[int], bool]) -> int:
    """Restore the state saved by :func:`save_pools` into ``pools`` (lists ``bounds[i]`` to
    ``bounds[i + 1]``) and ``thresholds`` if ``usable(position)`` (the rows below it have their
    lists); returns that position, or 0 (nothing restored)."""
    n = bounds[-1]
    try:
        with np.load(folder / "columns.npz") as meta:
            keys = np.load(folder / str(meta["keys_file"]), mmap_mode="r")
            position, width = int(meta["position"]), int(meta["width"])
            tc, fill = meta["tc"], meta["fill"]
    except (OSError, ValueError, KeyError):
        return 0
    if (keys.shape != (n, width) or tc.shape != (n,) or fill.shape != (n,) or width > pools[0].cap
            or not usable(position)):
        return 0
    for p, c0, c1 in zip(pools, bounds[:-1], bounds[1:]):
        p.load(keys[c0:c1], fill[c0:c1])
    thresholds[:] = tc  # the margins are not saved: the embeddings give them again
    return position
