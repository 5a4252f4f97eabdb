"""The canonical score: what every mined list is ranked by, the same on every machine, in every
precision mode and on every device.

A fast product (float32 BLAS tiles, bfloat16 tiles, FAISS, CUDA, float16) only *finds* the
candidates; membership and order are decided by this score. For float32 embeddings ``q``, ``g``
of dimension ``d``:

1. ``p_j = double(q_j) * double(g_j)``: exact (24-bit x 24-bit significands fit float64's 53,
   and no float32 product under- or overflows in float64), so a fused multiply-add gives the
   same sums as a multiply and an add;
2. 32 lanes: lane ``l`` sums the ``p_j`` with ``j = l (mod 32)`` in increasing ``j``, from
   ``+0.0``, in float64 (round to nearest even);
3. the lanes are added pairwise: for ``w = 16, 8, 4, 2, 1``, lane ``l`` += lane ``l + w``
   (``l < w``); the result ``c`` is lane 0;
4. the score is ``c`` rounded to float32 (nearest even), and 0 where ``|c| < 2**-126`` (so that
   no float32 subnormal, which a flush-to-zero mode would change, is ever produced).

Every step is an IEEE-754 operation in a fixed order, so any machine gives the same bits. (The
inputs are float32 values without subnormals: the driver flushes those first, so a denormals-
are-zero mode cannot change them either.) Lists are ranked by (canonical score descending, id
ascending): :mod:`aoq_train.mining.keys` packs exactly that. No float64 sum here ever rounds
below 2**-298 in magnitude (every partial sum is a multiple of it), so no float64 subnormal
appears. Two implementations follow the definition: a compiled CPU kernel (:func:`rescore`,
32 lanes as four 8-wide float64 vectors, the order above) and a torch one for any device
(:func:`canonical_rows`, elementwise operations only); a test holds them bit for bit equal.

Error bounds (``u = 2**-24``, ``gamma_n(v) = n v / (1 - n v)``, ``v = 2**-53`` for float64):
``|c - q.g| <= gamma_d(v) sum_j |q_j g_j| <= gamma_d(v) |q| |g|`` (at most ``d - 1`` additions per
product, any order), and the float32 rounding adds ``u |c|`` (plus ``2**-126`` for the flush), so
``|canonical - q.g| <= (gamma_d(v) (1 + u) + u) |q| |g| + 2**-126``. A float32 product in any
summation order, fused or not, is within ``gamma_d(u) |q| |g| (+ 2 d 2**-126 for flushed
subnormals)`` of ``q.g``. :func:`float32_margin` is the sum of both for the largest norms: a
float32 score ``s`` of a pair whose canonical score reaches a level ``L`` has ``s >= L - m``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from aoq_train.mining.keys import LOWEST

LANES = 32
#: The ranking rule recorded with every mining job and artefact: a change re-mines old ones.
RULE = "canonical: float32(float64 sum in 32 lanes, pairwise), then id"
UNIT_ROUNDOFF = 2.0**-24  # float32
UNIT_ROUNDOFF_64 = 2.0**-53
FLOAT32_TINY = 2.0**-126  # the smallest normal float32


def _gamma(n: int, unit: float) -> float:
    return n * unit / (1 - n * unit)


def canonical_error(d: int, norm_q: float, norm_g: float) -> float:
    """A bound on ``|canonical score - q.g|`` for rows of norms at most ``norm_q``, ``norm_g``."""
    return (_gamma(d, UNIT_ROUNDOFF_64) * (1 + UNIT_ROUNDOFF) + UNIT_ROUNDOFF) * norm_q * norm_g + FLOAT32_TINY


def float32_error(d: int, norm_q: float, norm_g: float) -> float:
    """A bound on ``|s - q.g|`` for any float32 evaluation ``s`` of the product (any summation
    order, with or without fused multiply-adds, subnormals flushed or not)."""
    return _gamma(d, UNIT_ROUNDOFF) * norm_q * norm_g + 2 * d * FLOAT32_TINY


def max_norm(x: np.ndarray | torch.Tensor, rows: int = 8192) -> float:
    """An upper bound on the largest row norm of a float32 matrix: squared norms summed in float32
    (a few rows at a time, any order: nonnegative terms, so each sum is within ``gamma_d(u)`` of
    its exact value, relatively, plus ``d 2**-126`` for flushed subnormals), the largest one
    divided by ``1 - gamma_d(u)``, its square root taken in float64 and rounded up a little.
    (Entries above ~1e19 square to float32's infinity: the bound, and the margin with it, is then
    infinite, so every score is a candidate: slow, still exact.)"""
    x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    d = x.shape[1]
    top = 0.0
    for s in range(0, x.shape[0], rows):
        part = x[s : s + rows]
        top = max(top, float(np.einsum("ij,ij->i", part, part).max()))
    return math.sqrt((top + d * FLOAT32_TINY) / (1 - _gamma(d, UNIT_ROUNDOFF))) * (1 + 2**-50)


def float32_margin(queries: np.ndarray | torch.Tensor, gallery: np.ndarray | torch.Tensor) -> float:
    """A proven bound on ``|s - canonical|`` for every pair, ``s`` any float32 evaluation of the
    pair's product (module docstring), slightly inflated (1e-6 relative) for the float64
    arithmetic that computes it."""
    d, nq, ng = queries.shape[1], max_norm(queries), max_norm(gallery)
    return (float32_error(d, nq, ng) + canonical_error(d, nq, ng)) * (1 + 1e-6)


def float32_levels(levels: np.ndarray, margin: float) -> np.ndarray:
    """The largest float32 values at or below ``levels - margin`` (taken in float64), never below
    ``LOWEST``: a float32 score within ``margin`` of a canonical score that reaches a level
    compares ``>=`` to that level's float32 level, and a ``LOWEST`` level still lets every finite
    score pass and -inf fail. ``+inf`` stays ``+inf`` (nothing passes)."""
    out = np.empty(len(levels), dtype=np.float32)
    _float32_levels(np.ascontiguousarray(levels, dtype=np.float32), float(margin), out)
    return out


@njit(nogil=True, cache=True)
def _float32_levels(levels: np.ndarray, margin: float, out: np.ndarray) -> None:
    """:func:`float32_levels` into ``out`` (compiled: it runs on every tile's levels)."""
    bits = out.view(np.uint32)
    for i in range(levels.shape[0]):
        wanted = np.float64(levels[i]) - margin
        out[i] = np.float32(wanted)
        if np.float64(out[i]) > wanted:  # rounded up: one float32 step down
            if out[i] > 0:
                bits[i] -= 1
            elif out[i] < 0:
                bits[i] += 1
            else:
                bits[i] = 0x80000001  # the negative value nearest zero
        if out[i] < np.float32(LOWEST):
            out[i] = np.float32(LOWEST)


# --------------------------------------------------------------------------- the CPU kernel


def _lanes_codegen(count: int):
    """LLVM code scoring ``count`` gallery rows against one query, for the intrinsics
    :func:`_lanes` (one row) and :func:`_lanes2` (two), whose arguments are ``(qrow, g,
    row_1..row_count, blocks, tail_1..tail_count, ahead_1..ahead_count)`` and whose result is
    the ``count`` float32 scores: the float64 lanes of ``qrow . g[row_i]`` in the order of the
    module docstring, rounded to float32. ``qrow`` is the query as float64 values, ``g`` the
    gallery (a C-contiguous float32 matrix; its rows are addressed here, where numba's row views
    cost a reference count each), ``blocks`` the number of whole 32-wide blocks, ``tail_i`` the
    32 float64 products of the last, partial block (zeros past its end; adding +0.0 changes no
    lane, none of which is ever -0.0). Written as LLVM vector operations: four 8-wide float64
    accumulators per row stay in registers (numba's loops kept them in memory). Each product
    is added with a fused multiply-add, which rounds once, like the add alone: the product is
    exact. Two rows at a time share each load of the query and keep eight independent sums in
    flight. ``ahead_i``, rows scored soon after, are prefetched as these are read (the rows are
    not in the L1/L2 caches). The figures behind each choice: docs/mining.md, "Measurements
    behind the code"."""

    def codegen(context, builder, signature, args):
        def data(i):
            return context.make_array(signature.args[i])(context, builder, args[i]).data

        i64, i32, f64 = ir.IntType(64), ir.IntType(32), ir.DoubleType()
        v8d, v8f, byte_ptr = ir.VectorType(f64, 8), ir.VectorType(ir.FloatType(), 8), ir.IntType(8).as_pointer()
        gallery = context.make_array(signature.args[1])(context, builder, args[1])
        stride = cgutils.unpack_tuple(builder, gallery.strides, 2)[0]  # bytes per row
        base_ptr = builder.bitcast(gallery.data, byte_ptr)

        def gallery_row(i):
            start = builder.gep(base_ptr, [builder.mul(args[i], stride)])
            return builder.bitcast(start, ir.FloatType().as_pointer())

        q_p = data(0)
        b_ps = [gallery_row(2 + i) for i in range(count)]
        n = args[2 + count]
        t_ps = [data(3 + count + i) for i in range(count)]
        a_ps = [gallery_row(3 + 2 * count + i) for i in range(count)]

        def vec(ptr, offset, vtype, align):
            return builder.load(builder.bitcast(builder.gep(ptr, [offset]), vtype.as_pointer()), align=align)

        fma = builder.module.globals.get("llvm.fma.v8f64") or ir.Function(
            builder.module, ir.FunctionType(v8d, [v8d, v8d, v8d]), name="llvm.fma.v8f64")
        prefetch = builder.module.declare_intrinsic("llvm.prefetch", [byte_ptr],
                                                    ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]))
        fabs = builder.module.declare_intrinsic("llvm.fabs", [f64])

        entry = builder.block
        head = builder.append_basic_block("lanes.head")
        body = builder.append_basic_block("lanes.body")
        done = builder.append_basic_block("lanes.done")
        builder.branch(head)
        builder.position_at_end(head)
        t = builder.phi(i64)
        t.add_incoming(ir.Constant(i64, 0), entry)
        accs = [[builder.phi(v8d) for _ in range(4)] for _ in range(count)]
        for acc in (acc for per_row in accs for acc in per_row):
            acc.add_incoming(ir.Constant(v8d, None), entry)
        builder.cbranch(builder.icmp_signed("<", t, n), body, done)
        builder.position_at_end(body)
        base = builder.mul(t, ir.Constant(i64, LANES))
        for a_p in a_ps:  # the two 64-byte lines of this block in the rows ahead (read, keep in caches)
            for line in (0, 16):
                where = builder.bitcast(builder.gep(a_p, [builder.add(base, ir.Constant(i64, line))]), byte_ptr)
                builder.call(prefetch, [where, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        new = [[] for _ in range(count)]
        for k in range(4):
            off = builder.add(base, ir.Constant(i64, 8 * k))
            y = vec(q_p, off, v8d, 8)
            for row, b_p in enumerate(b_ps):
                new[row].append(builder.call(fma, [builder.fpext(vec(b_p, off, v8f, 4), v8d), y, accs[row][k]]))
        t.add_incoming(builder.add(t, ir.Constant(i64, 1)), body)
        for row in range(count):
            for a, v in zip(accs[row], new[row]):
                a.add_incoming(v, body)
        builder.branch(head)
        builder.position_at_end(done)
        scores = []
        for row in range(count):
            lanes = [builder.fadd(a, vec(t_ps[row], ir.Constant(i64, 8 * k), v8d, 8)) for k, a in enumerate(accs[row])]
            # pairwise: lanes 0-15 += 16-31 (vectors 0, 1 += 2, 3), then 0-7 += 8-15, then within a vector
            v = builder.fadd(builder.fadd(lanes[0], lanes[2]), builder.fadd(lanes[1], lanes[3]))
            width = 8
            while width > 1:
                half = width // 2
                low = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, half), list(range(half))))
                high = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, half), list(range(half, width))))
                v, width = builder.fadd(low, high), half
            c = builder.extract_element(v, ir.Constant(i32, 0))
            tiny = builder.fcmp_ordered("<", builder.call(fabs, [c]), ir.Constant(f64, FLOAT32_TINY))
            scores.append(builder.select(tiny, ir.Constant(ir.FloatType(), 0.0), builder.fptrunc(c, ir.FloatType())))
        return scores[0] if count == 1 else context.make_tuple(builder, signature.return_type, scores)

    return codegen


@intrinsic
def _lanes(typingctx, qrow, g, row, blocks, tail, ahead):
    """One gallery row's canonical score (:func:`_lanes_codegen`)."""
    return types.float32(qrow, g, row, blocks, tail, ahead), _lanes_codegen(1)


@intrinsic
def _lanes2(typingctx, qrow, g, row, row2, blocks, tail, tail2, ahead, ahead2):
    """Two gallery rows' canonical scores against one query (:func:`_lanes_codegen`)."""
    return (types.UniTuple(types.float32, 2)(qrow, g, row, row2, blocks, tail, tail2, ahead, ahead2),
            _lanes_codegen(2))


@njit(nogil=True, cache=True, inline="always")
def _tail(qrow: np.ndarray, g: np.ndarray, row: int, full: int, tail: np.ndarray) -> None:
    """The products of the last, partial block of ``qrow . g[row]`` into ``tail`` (see :func:`_lanes_codegen`)."""
    for j in range(full, qrow.shape[0]):
        tail[j - full] = qrow[j] * np.float64(g[row, j])


@njit(nogil=True, cache=True)
def rescore(q: np.ndarray, g: np.ndarray, p0: int, c0: int, rows: np.ndarray, cols: np.ndarray,
            out: np.ndarray) -> None:
    """Canonical scores of ``q[p0 + rows[i]]`` and ``g[c0 + cols[i]]`` into ``out[i]`` (float32
    C-contiguous matrices). A query row is converted to float64 once for a run of equal
    ``rows`` (the scan's row-major order), and the run's candidates are scored two at a time."""
    d, n = q.shape[1], rows.shape[0]
    full = d - d % LANES
    blocks = np.int64(full // LANES)
    qrow = np.zeros(d, np.float64)
    tail, tail2 = np.zeros(LANES, np.float64), np.zeros(LANES, np.float64)
    last = -1
    i = 0
    while i < n:
        r = p0 + rows[i]
        if r != last:
            for j in range(d):
                qrow[j] = np.float64(q[r, j])
            last = r
        c = np.int64(c0 + cols[i])
        if i + 1 < n and rows[i + 1] == rows[i]:
            c2 = np.int64(c0 + cols[i + 1])
            if full < d:
                _tail(qrow, g, c, full, tail)
                _tail(qrow, g, c2, full, tail2)
            out[i], out[i + 1] = _lanes2(qrow, g, c, c2, blocks, tail, tail2, np.int64(c0 + cols[min(i + 2, n - 1)]),
                                         np.int64(c0 + cols[min(i + 3, n - 1)]))
            i += 2
        else:
            if full < d:
                _tail(qrow, g, c, full, tail)
            out[i] = _lanes(qrow, g, c, blocks, tail, np.int64(c0 + cols[min(i + 2, n - 1)]))
            i += 1


def canonical_pairs(queries: np.ndarray, gallery: np.ndarray, qi: np.ndarray, gi: np.ndarray) -> np.ndarray:
    """Canonical scores (float32) of the pairs ``(queries[qi[i]], gallery[gi[i]])`` on the CPU."""
    out = np.empty(len(qi), dtype=np.float32)
    if len(qi):
        rescore(np.ascontiguousarray(queries), np.ascontiguousarray(gallery), 0, 0,
                np.ascontiguousarray(qi, dtype=np.int64), np.ascontiguousarray(gi, dtype=np.int64), out)
    return out


@njit(nogil=True, cache=True)
def _inspect(bits: np.ndarray) -> tuple[bool, bool]:
    """(every entry finite, some entry subnormal) of a flat float32 array read as its bit
    patterns, in one vectorised read (an all-ones exponent: inf or NaN; a zero exponent with a
    nonzero significand: a subnormal)."""
    bad, subnormal = np.uint32(0), np.uint32(0)
    for u in bits:
        e = u & np.uint32(0x7F800000)
        bad |= np.uint32(e == np.uint32(0x7F800000))
        subnormal |= np.uint32((e == np.uint32(0)) & ((u & np.uint32(0x7FFFFF)) != np.uint32(0)))
    return bad == 0, subnormal != 0


def canonical_inputs(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(``x`` with subnormal entries replaced by zeros, whether ``x`` is all finite). ``x`` itself
    when it holds no subnormal (the usual case); otherwise a copy, so that no denormals-are-zero
    mode can read the inputs differently (module docstring)."""
    finite, subnormal = _inspect(np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32))
    if subnormal:
        x = np.where(np.abs(x) < FLOAT32_TINY, np.float32(0), x).astype(np.float32)
    return x, finite


# --------------------------------------------------------------------------- any device


def canonical_rows(q: torch.Tensor, g: torch.Tensor, rows_at_once: int | None = None) -> torch.Tensor:
    """Canonical scores of the row pairs ``(q[i], g[i])`` (float32 tensors of the same shape, on
    any device), by elementwise float64 operations in the order of the module docstring: the
    same bits as :func:`rescore` wherever it runs. ``rows_at_once`` bounds the float64
    temporaries (default: ~2**24 elements)."""
    n, d = q.shape
    blocks = -(-d // LANES)
    rows_at_once = rows_at_once or max(1, 2**24 // (blocks * LANES))
    out = torch.empty(n, dtype=torch.float32, device=q.device)
    for s in range(0, n, rows_at_once):
        qs, gs = q[s : s + rows_at_once], g[s : s + rows_at_once]
        p = qs.double() * gs.double()
        if d % LANES:
            p = torch.nn.functional.pad(p, (0, blocks * LANES - d))  # +0.0 products change no lane
        p = p.view(len(qs), blocks, LANES)
        lanes = torch.zeros(len(qs), LANES, dtype=torch.float64, device=q.device)
        for t in range(blocks):
            lanes = lanes + p[:, t]
        width = LANES
        while width > 1:
            width //= 2
            lanes = lanes[:, :width] + lanes[:, width : 2 * width]
        c = lanes[:, 0]
        out[s : s + len(qs)] = torch.where(c.abs() < FLOAT32_TINY, torch.zeros_like(c), c).float()
    return out
