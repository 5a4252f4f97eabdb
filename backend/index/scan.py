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

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from aoq_serve.index.shared import shared

#: gallery items per block: a block of a 128-dimensional gallery (64 KiB) stays in a core's L2
#: cache while every query of a batch passes over it.
WIDTH = 128
#: dimensions of a block summed in one pass over the queries: a slice of 16 KiB stays in L1.
SLICE = 32
#: float32 lanes of the LLVM vectors the sums are kept in (one AVX-512 register, two AVX2 ones).
LANES = 16


def _wide_registers() -> bool:
    """Whether the CPU numba compiles for has AVX-512's 32 vector registers, which hold two
    queries' sums of a block (AVX2's 16 hold about one query's).
    (``NUMBA_CPU_FEATURES`` overrides the host's features for numba: followed here too.)"""
    features = os.environ.get("NUMBA_CPU_FEATURES")
    if features is not None:
        return "+avx512f" in features.split(",")
    return bool(llvm.get_host_cpu_features().get("avx512f"))


#: which kernel :meth:`FlatScan.search` runs: either gives the same bits.
WIDE = _wide_registers()


def _sums_codegen(queries: int) -> Callable:
    """LLVM code adding dimensions ``[c0, c1)`` of a block's items to the running sums of
    ``queries`` consecutive queries (from ``q``), for the intrinsics below, whose arguments are
    ``(blocks, queries, sums, block, q, c0, c1)``. The sums stay in registers across the
    dimensions (numba's loops stored them back to memory at every dimension, and the stores
    bound the scan; with AVX2 a few of one query's 16 vectors go to the stack, still fewer
    stores). Each is a float32 multiply and then an add, in increasing dimension order, exactly
    as ``sums[q, j] += queries[q, c] * blocks[block, c, j]`` (no fused multiply-add), so either
    kernel gives the same bits as that plain loop."""

    def codegen(context, builder, signature, args):
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        vec, byte = ir.VectorType(f32, LANES), ir.IntType(8).as_pointer()
        block, q, c0, c1 = (context.cast(builder, args[i], signature.args[i], types.int64) for i in range(3, 7))
        arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in range(3)]
        (gallery, query_rows, sums), strides = arrays, [cgutils.unpack_tuple(builder, a.strides) for a in arrays]

        def at(array, offset):
            return builder.bitcast(builder.gep(builder.bitcast(array.data, byte), [offset]), f32.as_pointer())

        def vector(ptr, v):
            return builder.bitcast(builder.gep(ptr, [ir.Constant(i64, LANES * v)]), vec.as_pointer())

        start = builder.mul(block, strides[0][0])
        rows = [builder.add(q, ir.Constant(i64, t)) for t in range(queries)]
        weights = [at(query_rows, builder.mul(r, strides[1][0])) for r in rows]
        outs = [at(sums, builder.mul(r, strides[2][0])) for r in rows]
        count = WIDTH // LANES
        initial = [[builder.load(vector(out, v), align=4) for v in range(count)] for out in outs]
        entry = builder.block
        head, body, done = (builder.append_basic_block(f"sums.{name}") for name in ("head", "body", "done"))
        builder.branch(head)
        builder.position_at_end(head)
        c = builder.phi(i64)
        c.add_incoming(c0, entry)
        accs = [[builder.phi(vec) for _ in range(count)] for _ in rows]
        for per_query, values in zip(accs, initial):
            for acc, value in zip(per_query, values):
                acc.add_incoming(value, entry)
        builder.cbranch(builder.icmp_signed("<", c, c1), body, done)
        builder.position_at_end(body)
        column = at(gallery, builder.add(start, builder.mul(c, strides[0][1])))
        xs = [builder.load(vector(column, v), align=4) for v in range(count)]
        splat = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)
        for w_ptr, per_query in zip(weights, accs):
            w = builder.load(builder.gep(w_ptr, [c]))
            wv = builder.shuffle_vector(builder.insert_element(ir.Constant(vec, ir.Undefined), w, ir.Constant(i32, 0)),
                                        ir.Constant(vec, ir.Undefined), splat)
            for acc, x in zip(per_query, xs):
                acc.add_incoming(builder.fadd(acc, builder.fmul(wv, x)), body)
        c.add_incoming(builder.add(c, ir.Constant(i64, 1)), body)
        builder.branch(head)
        builder.position_at_end(done)
        for out, per_query in zip(outs, accs):
            for v, acc in enumerate(per_query):
                builder.store(acc, vector(out, v), align=4)
        return context.get_dummy_value()

    return codegen


def _typed(queries: int, blocks: types.Type, query_rows: types.Type, sums: types.Type, *indices: types.Type
           ) -> tuple[types.Type, Callable] | None:
    """The intrinsics' signature and code; none for arrays that are not C-contiguous float32
    (the code addresses items and dimensions by their byte offsets)."""
    arrays = (blocks, query_rows, sums)
    if any(not isinstance(a, types.Array) or a.layout != "C" or a.dtype != types.float32 for a in arrays):
        return None
    return types.void(*arrays, *indices), _sums_codegen(queries)


@intrinsic
def _pair(typingctx, blocks, queries, sums, block, q, c0, c1):
    """Two queries' sums over a block (:func:`_sums_codegen`): the kernel for AVX-512."""
    return _typed(2, blocks, queries, sums, block, q, c0, c1)


@intrinsic
def _single(typingctx, blocks, queries, sums, block, q, c0, c1):
    """One query's sums over a block: AVX-512's odd query out, and the kernel for AVX2."""
    return _typed(1, blocks, queries, sums, block, q, c0, c1)


@njit(nogil=True, cache=True)
def _scan(blocks: np.ndarray, n: int, queries: np.ndarray, k: int, top_scores: np.ndarray,
          top_positions: np.ndarray, sums: np.ndarray, wide: bool) -> None:  # pragma: no cover - compiled
    """Fill each query's top ``k`` (scores descending, ties by position) over ``n`` items.

    ``sums`` is scratch of shape (queries, WIDTH). Each query's sums are its own row, computed by
    the same arithmetic for any number of queries and either kernel (``wide``: two queries at a
    time, else one): the batch never changes a score. A block none of whose scores beats a full
    list's last is passed over without visiting its items.
    """
    count, dim = queries.shape
    filled = np.zeros(count, np.int64)
    paired = count - count % 2 if wide else 0  # queries summed two at a time, the rest one by one
    for block in range(blocks.shape[0]):
        base = block * WIDTH
        valid = min(WIDTH, n - base)
        sums[:count] = 0
        for c0 in range(0, dim, SLICE):
            c1 = min(c0 + SLICE, dim)
            for q in range(0, paired, 2):
                _pair(blocks, queries, sums, block, q, c0, c1)
            for q in range(paired, count):
                _single(blocks, queries, sums, block, q, c0, c1)
        for q in range(count):
            row, best, where, size = sums[q], top_scores[q], top_positions[q], filled[q]
            if size == k:
                last, beaten = best[k - 1], False
                for j in range(valid):  # vectorised: most blocks hold nothing that enters
                    beaten |= row[j] > last
                if not beaten:
                    continue
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
            sums = np.empty((count, WIDTH), dtype=np.float32)
            _scan(self.blocks, self.ntotal, queries, size, scores, where, sums, WIDE)
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
