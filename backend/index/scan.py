"""Exact inner-product search of a flat index that reads the gallery once per batch of queries
(docs/serving.md, Micro-batching).

FAISS's flat index scans the whole gallery for each query of a small batch: the scan is bound by
memory bandwidth, so a batch costs what its queries cost one by one, and above FAISS's BLAS
switch the product rounds each row according to the batch's size. Here the gallery is stored in
blocks of :data:`WIDTH` items, dimension-major, and every block is read once for all the
queries of a call while it sits in the cache. Each score is summed over the dimensions in one
fixed order, by the same code whatever the other queries are, so a query gets bit for bit the
same scores and top list alone as in any batch (tested).

Ties are ordered by gallery position: of equal scores, the item indexed first comes first.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from aoq_serve.index.shared import shared

#: gallery items per block: a block of a 128-dimensional gallery (64 KiB) stays in a core's L2
#: cache while every query of a batch passes over it.
WIDTH = 128


@njit(nogil=True, cache=True)
def _scan(blocks: np.ndarray, n: int, queries: np.ndarray, k: int, top_scores: np.ndarray,
          top_positions: np.ndarray, sums: np.ndarray) -> None:  # pragma: no cover - compiled
    """Fill each query's top ``k`` (scores descending, ties by position) over ``n`` items.

    ``sums`` is scratch of shape (queries, WIDTH). Each query's sums are its own row, computed by
    the same loop for any number of queries: the batch never changes a score.
    """
    count, dim = queries.shape
    filled = np.zeros(count, np.int64)
    for block in range(blocks.shape[0]):
        base = block * WIDTH
        valid = min(WIDTH, n - base)
        sums[:count] = 0
        for c in range(dim):
            column = blocks[block, c]
            for q in range(count):
                weight = queries[q, c]
                row = sums[q]
                for j in range(WIDTH):
                    row[j] += weight * column[j]
        for q in range(count):
            row, best, where, size = sums[q], top_scores[q], top_positions[q], filled[q]
            for j in range(valid):
                score = row[j]
                # a later item enters only by beating the last one: earlier items win ties
                if size < k or score > best[k - 1]:
                    i = size if size < k else k - 1
                    while i > 0 and best[i - 1] < score:
                        best[i], where[i] = best[i - 1], where[i - 1]
                        i -= 1
                    best[i], where[i] = score, base + j
                    size = min(size + 1, k)
            filled[q] = size


@dataclass(frozen=True, eq=False)
class FlatScan:
    """A flat inner-product index served by :func:`_scan`; searched like a FAISS index
    (``ntotal``, ``search``) so the service treats both alike."""

    #: (blocks, d, WIDTH) float32: item ``b * WIDTH + j``'s dimension ``c`` at ``[b, c, j]``; the
    #: last block is padded with zeros that are never ranked.
    blocks: np.ndarray
    #: the index's id of each gallery position.
    ids: np.ndarray

    @classmethod
    def from_vectors(cls, vectors: np.ndarray, ids: np.ndarray) -> FlatScan:
        """The scan of ``vectors`` (N, d) indexed under ``ids`` (N,); compiles the kernel now, so
        the first query does not pay for it."""
        n, dim = vectors.shape
        padded = np.zeros((-(-n // WIDTH) * WIDTH, dim), dtype=np.float32)
        padded[:n] = vectors
        blocks = shared(np.ascontiguousarray(padded.reshape(-1, WIDTH, dim).transpose(0, 2, 1)))
        index = cls(blocks=blocks, ids=np.ascontiguousarray(ids, dtype=np.int64))
        index.search(np.zeros((1, dim), dtype=np.float32), 1)
        return index

    @property
    def ntotal(self) -> int:
        return len(self.ids)

    @property
    def d(self) -> int:
        return self.blocks.shape[1]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's contract: (scores, ids), each (len(queries), k), best first; ids -1 where the
        gallery holds fewer than ``k`` items.

        Raises:
            ValueError: queries of another dimension.
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.d:
            raise ValueError(f"queries of shape {queries.shape} for an index of dimension {self.d}")
        count, size = len(queries), min(k, self.ntotal)
        scores = np.full((count, k), -np.inf, dtype=np.float32)
        ids = np.full((count, k), -1, dtype=np.int64)
        if size > 0:
            where = np.empty((count, size), dtype=np.int64)
            _scan(self.blocks, self.ntotal, queries, size, scores, where, np.empty((count, WIDTH), dtype=np.float32))
            ids[:, :size] = self.ids[where]
        return scores, ids


def compile_kernel() -> None:
    """Compile :func:`_scan` for both kinds of gallery the service passes it (numba compiles and
    caches one version for each): a process's own array, and the read-only mapping that workers
    share (:func:`aoq_serve.index.shared.shared`). ``aoq warm`` (run by ``make setup``) calls it,
    so that a server's first start does not wait for the compiler."""
    own = FlatScan.from_vectors(np.zeros((1, 8), dtype=np.float32), np.zeros(1))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "blocks.npy"
        np.save(path, own.blocks, allow_pickle=False)
        mapped = FlatScan(blocks=np.load(path, mmap_mode="r", allow_pickle=False), ids=own.ids)
        mapped.search(np.zeros((1, 8), dtype=np.float32), 1)
        del mapped  # the mapping closes before its folder goes
