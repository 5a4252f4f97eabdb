"""One pass over the score matrix for both directions (CPU, torch backend).

Both lists read the same matrix ``S = img @ cap.T``: a row holds an image's scores (its top
captions), a column a caption's scores (its top images). This pass computes every tile of S once
and selects both directions from it, so the product, most of the cost, is paid once.

Layout
    Images and captions are visited in a fixed pseudo-random order (:func:`processing_order`):
    any contiguous slice of either is a fair sample of all ids. Caption chunks are ``CHUNK``
    consecutive positions of that order. Image rows are scored ``ROW_TILE`` at a time against
    every chunk (a 512 x 1024 tile stays in the caches from the product to the compares), a row
    tile per worker thread, one worker per torch thread running single-threaded kernels. Row
    tiles are grouped in blocks of ``block_size`` rows, the resumable unit.

Thresholds
    Rows: a row tile scores its first ``sample_chunks`` chunks first (~``ROW_HITS`` sampled scores
    above the target level) and reads each row's threshold from them
    (:func:`aoq_train.mining.pools.sampled_threshold`). Columns: the sample phase scores the first
    ``sample_height`` rows as one tall tile per chunk, whose first ``sample_rows`` give each
    column its threshold (~``COL_HITS`` hits). A score enters a row's (a column's) pool when it
    reaches that threshold. Thresholds only rise: a full list is cut to its best k and its
    threshold raised to its k-th best (exact); after a quarter and half of a row's chunks (of the
    image rows, for columns) they are estimated again from the pools' larger fair sample.

Canonical decision
    The tiles' products (float32 BLAS, bfloat16 with ``precision="bf16"``, exact int8 products of
    rounded embeddings with ``precision="int8"``) only find the candidates: the scores reaching a
    threshold minus a proven bound on their distance to the pair's canonical score
    (:mod:`aoq_train.mining.canonical`, ``bf16``, ``int8``). Every candidate is re-scored
    canonically (:func:`aoq_train.mining.canonical.rescore`, while the chunk is in the caches);
    thresholds, pools and lists hold canonical scores only, so the lists do not depend on the
    tiles' precision, blocking or CPU. The scans read bf16 products as they come out
    (:func:`kernels.scan_bf16`) and int8 ones as int32 with each pair's own bound
    (:func:`kernels.scan_int8`, :class:`aoq_train.mining.int8.Bounds`); sample tiles, whose
    thresholds are read with numpy, are float32 (int8: a float32 copy beside the int32 products,
    which the scan reads). A first tile checks the bound's premise on this CPU.

Exactness: a list that ends with fewer than k candidates, or whose k-th best is below its last
threshold (an estimate too high), is redone unfiltered (:func:`aoq_train.mining.topk.exact_rows`).
Every other list is the canonical brute force's: each member reached every threshold it met.

Memory, beyond the inputs and the two returned id arrays: a permuted float32 copy of both
embedding arrays (plus a bf16 or int8 copy); the column pools, ``N_captions x (1.5 k_cols +
64)`` int64 keys; the sample phase's row pool, ``sample_height x (2 k_rows + 64)`` keys; per
worker a row pool (``ROW_TILE x (2 k_rows + 64)`` keys), a tall tile (``sample_height x CHUNK``
values; int8: float32 copies of the sample tiles too) and the scan's output.

The per-score work (scans, appends) is compiled (:mod:`aoq_train.mining.kernels`): with numpy it
cost more than the product itself.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from aoq_train.mining import bf16 as bf16_filter
from aoq_train.mining import canonical, int8, kernels
from aoq_train.mining.keys import LOWEST, decode_ids, decode_scores
from aoq_train.mining.pools import (Pool, fresh_array, load_pools, sample_rank, sample_width, sampled_threshold,
                                   save_pools)
from aoq_train.mining.topk import directions, exact_rows
from aoq_train.mining.workers import worker_pool

log = logging.getLogger(__name__)

ROW_TILE = 512  # image rows per tile: with CHUNK columns, the tile stays in the caches from the product to the compares
CHUNK = 1024  # caption columns per tile
ROW_HITS = 100  # sampled scores above a row threshold's level (a few % of a row's gallery at H = 2000)
COL_HITS = 32  # the same for columns, whose sample is the first rows of the image order, scored as tall tiles
BF16_NEG_INF = 0xFF80  # the bit pattern of bfloat16 -inf
INT32_MIN = np.iinfo(np.int32).min  # an own positive's int8 product: it never passes (kernels.scan_int8)
QUEUED_BLOCKS = 2  # blocks of row tiles queued at once: the one waited for and the next
SNAPSHOT_SECONDS = 600.0  # the column pools are saved at most this often: a kill loses at most ~that much work


def processing_order(n: int, seed: int) -> np.ndarray:
    """A fixed pseudo-random order of ``n`` ids: every contiguous slice is a fair sample."""
    return np.random.default_rng(seed).permutation(n)


def _permuted(a: np.ndarray, order: np.ndarray) -> torch.Tensor:
    """``a[order]`` as a tensor, in fresh memory (:func:`aoq_train.mining.pools.fresh_array`), filled
    by torch's threads."""
    out = torch.from_numpy(fresh_array(a.shape, a.dtype))
    with warnings.catch_warnings():  # "the given NumPy array is not writable": it is only read
        warnings.simplefilter("ignore", UserWarning)
        source = torch.from_numpy(a)
    return torch.index_select(source, 0, torch.from_numpy(order), out=out)


class FusedPass:
    """Top ``k_rows`` captions per image and top ``k_cols`` images per caption, own positives
    excluded, from one pass over ``img @ cap.T``; see the module docstring."""

    def __init__(self, img: np.ndarray, cap: np.ndarray, cpi: int, k_rows: int, k_cols: int, *,
                 chunk: int = CHUNK, precision: Literal["fp32", "bf16", "int8"] = "fp32") -> None:
        self.img, self.cap, self.cpi = img, cap, cpi
        self.k_rows, self.k_cols = k_rows, k_cols
        self.n_img, self.n_cap = len(img), len(cap)
        self.img_order = processing_order(self.n_img, 0)
        self.cap_order = processing_order(self.n_cap, 1)
        cap_pos = np.empty(self.n_cap, dtype=np.int64)
        cap_pos[self.cap_order] = np.arange(self.n_cap)
        self.own = cap_pos[cpi * self.img_order[:, None] + np.arange(cpi)]  # own captions' positions, per row
        self.q, self.g = _permuted(img, self.img_order), _permuted(cap, self.cap_order)
        self.bf16, self.int8 = precision == "bf16", precision == "int8"
        if self.bf16:  # the tiles' products against canonical scores
            self.q16, self.g16 = self.q.bfloat16(), self.g.bfloat16()
            self.margin = bf16_filter.error_bound(self.q, self.g, self.q16, self.g16)
        elif self.int8:
            (self.q8, q_scales), (self.g8, g_scales) = int8.quantize(self.q), int8.quantize(self.g)
            self.int8_bounds = int8.error_bounds(self.q, self.g, self.q8, q_scales, self.g8, g_scales)
            self.margin = self.int8_bounds.margin
            self.q_scales, self.g_scales = q_scales.numpy(), g_scales.numpy()  # float32, as the scan computes
        else:
            self.margin = self.f32_margin
        self.bounds = [*range(0, self.n_cap, chunk), self.n_cap]
        self.sample_chunks = -(-sample_width(self.n_cap, k_rows + cpi, ROW_HITS) // chunk)
        self.sample_rows = sample_width(self.n_img, k_cols + 1, COL_HITS)
        self.sample_height = min(self.n_img, max(ROW_TILE, self.sample_rows))
        self.row_cap = 2 * k_rows + 64  # candidates a list may hold before it is compacted to k
        col_cap = k_cols + k_cols // 2 + 64
        col_keys = fresh_array((self.n_cap, col_cap), np.int64)  # one mapping, viewed per chunk
        self.col_pools = [Pool(c1 - c0, col_cap, col_keys[c0:c1]) for c0, c1 in zip(self.bounds[:-1], self.bounds[1:])]
        self.col_locks = [threading.Lock() for _ in self.col_pools]
        self.rows_in = np.zeros(len(self.col_pools), dtype=np.int64)  # image rows each chunk's column pool has seen
        self.tc = np.full(self.n_cap, LOWEST, dtype=np.float32)  # column thresholds, by position
        self.local = threading.local()

    @functools.cached_property
    def f32_margin(self) -> float:
        """The float32 products' margin (:func:`aoq_train.mining.canonical.float32_margin`): the
        tiles' in fp32 mode, the redone lists' in both."""
        return canonical.float32_margin(self.q, self.g)

    # ------------------------------------------------------------------ one tile

    def _dense(self, p0: int, p1: int, ci: int, slot: int = 0, raw: bool = False) -> np.ndarray:
        """Rows [p0, p1) against chunk ``ci`` in this worker's buffer ``slot``: float32 scores (of
        bf16 products in that mode), own positives at -inf; int8: the int32 products, own positives
        at INT32_MIN (:meth:`_sampled` has their float32 copy). With ``raw`` and ``bf16``, the bf16
        products' bit patterns (uint16), which the scan reads directly: a float32 copy of the tile
        would cost about as much as the bf16 product that made it."""
        c0, c1 = self.bounds[ci], self.bounds[ci + 1]
        rows, width = p1 - p0, c1 - c0
        raw = (raw and self.bf16) or self.int8
        dtype = torch.int32 if self.int8 else torch.bfloat16 if raw else torch.float32
        bufs = self.local.__dict__.setdefault("bufs", {})
        key = (slot, raw)
        if key not in bufs or bufs[key].numel() < rows * width:
            bufs[key] = torch.empty(rows * width, dtype=dtype)
        out = bufs[key][: rows * width].view(rows, width)
        if self.int8:
            scores = int8.products(self.q8[p0:p1], self.g8[c0:c1], out).numpy()
        elif raw:
            scores = torch.mm(self.q16[p0:p1], self.g16[c0:c1].T, out=out).view(torch.int16).numpy().view(np.uint16)
        elif self.bf16:
            scores = out.copy_(torch.mm(self.q16[p0:p1], self.g16[c0:c1].T)).numpy()
        else:
            scores = torch.mm(self.q[p0:p1], self.g[c0:c1].T, out=out).numpy()  # (torch < 2.3 has no uint16)
        self._mask_own(scores, p0, ci, -np.inf if not raw else INT32_MIN if self.int8 else BF16_NEG_INF)
        return scores

    def _mask_own(self, scores: np.ndarray, p0: int, ci: int, value: float) -> None:
        """Set the tile's own positives (rows from ``p0``, columns of chunk ``ci``) to ``value``."""
        kernels.mask_own(scores, self.own[p0 : p0 + scores.shape[0]], self.bounds[ci], self.bounds[ci + 1], value)

    def _sampled(self, tile: np.ndarray, p0: int, ci: int, slot: int = 0) -> np.ndarray:
        """The float32 scores of a :meth:`_dense` tile: the tile itself, but in the int8 mode a
        float32 copy (own positives at -inf) in this worker's buffer ``slot``."""
        if not self.int8:
            return tile
        bufs = self.local.__dict__.setdefault("copies", {})
        if slot not in bufs or bufs[slot].size < tile.size:
            bufs[slot] = np.empty(tile.size, dtype=np.float32)
        c0, c1 = self.bounds[ci], self.bounds[ci + 1]
        out = int8.as_float32(tile, self.q_scales[p0 : p0 + tile.shape[0]], self.g_scales[c0:c1],
                              bufs[slot][: tile.size].reshape(tile.shape))
        self._mask_own(out, p0, ci, -np.inf)
        return out

    def _passing(self, scores: np.ndarray, tr: np.ndarray | None, tc: np.ndarray, p0: int, c0: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, columns and canonical scores of the tile's scores reaching the filter level of the
        row or the column threshold (module docstring). ``scores``: float32, or bf16 bit patterns
        (:meth:`_dense` with ``raw``)."""
        rows, width = scores.shape
        out = getattr(self.local, "scan", None)
        if out is None or out[0].size < scores.size or out[3].size < width + 64:
            size = max(scores.size, ROW_TILE * CHUNK)
            out = self.local.scan = (np.empty(size, np.int32), np.empty(size, np.int32), np.empty(size, np.float32),
                                     np.empty(max(width, CHUNK) + 64, np.uint8))
        if tr is None:
            tr = np.full(rows, np.inf, dtype=np.float32)
        if scores.dtype == np.int32:
            bounds = self.int8_bounds
            n = kernels.scan_int8(scores, self.q_scales[p0 : p0 + rows], self.g_scales[c0 : c0 + width], tr, tc,
                                  bounds.rows[p0 : p0 + rows], bounds.columns[c0 : c0 + width], out[3], out[0], out[1])
        elif scores.dtype == np.uint16:
            n = kernels.scan_bf16(scores, kernels.bf16_filter_keys(tr, self.margin),
                                  kernels.bf16_filter_keys(tc, self.margin), out[3], out[0], out[1])
        else:  # float32 products, or a sample tile's bf16 or int8 products as float32
            levels = bf16_filter.filter_levels if self.bf16 else canonical.float32_levels
            n = kernels.scan(scores, levels(tr, self.margin), levels(tc, self.margin), *out[3:], *out[:3])
        row, col, values = out[0][:n], out[1][:n], out[2][:n]
        canonical.rescore(self.q.numpy(), self.g.numpy(), p0, c0, row, col, values)  # what decides
        return row, col, values

    def _select(self, scores: np.ndarray, ci: int, p0: int, tr: np.ndarray | None = None, first: int = 0,
                rows: Pool | None = None, rows_lock: threading.Lock | None = None) -> None:
        """Add the tile's passing scores (rows from image position ``p0``, columns of chunk ``ci``)
        to the chunk's column pool and, when ``tr`` is given, to the row pool ``rows``, whose lists
        (and thresholds ``tr``) hold the tile's rows from index ``first``. Thresholds rise in place
        whenever a full list is cut."""
        c0, c1 = self.bounds[ci], self.bounds[ci + 1]
        n = scores.shape[0]
        tc = self.tc[c0:c1]
        row, col, values = self._passing(scores, None if tr is None else tr[first : first + n], tc, p0, c0)
        with self.col_locks[ci]:
            self.col_pools[ci].add(col, row, self.img_order[p0 : p0 + n], values, self.k_cols, tc)
            self.rows_in[ci] += n
        if tr is not None:
            with rows_lock or contextlib.nullcontext():
                rows.add(row + first if first else row, col, self.cap_order[c0:c1], values, self.k_rows, tr)

    # ------------------------------------------------------------------ rows

    def _row_pool(self, n: int) -> Pool:
        """This worker's row pool, emptied (one array per worker, faulted in once)."""
        pool = getattr(self.local, "pool", None)
        if pool is None or pool.keys.shape[0] < n:
            pool = self.local.pool = Pool(n, self.row_cap)
        else:
            pool.reset(n)
        return pool

    def _sample_tiles(self, p0: int, p1: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Rows [p0, p1) against the chunks that sample the row thresholds, one buffer each (as
        the scan reads them), and the rows' sampled thresholds."""
        tiles = [self._dense(p0, p1, ci, slot=ci) for ci in range(self.sample_chunks)]
        sampled = [self._sampled(tile, p0, ci, slot=ci) for ci, tile in enumerate(tiles)]
        return tiles, sampled_threshold(sampled, self.k_rows + self.cpi, self.n_cap)

    def _row_tile(self, p0: int, p1: int, wanted: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """Rows [p0, p1) against every chunk, the row sample first; their lists when ``wanted``."""
        pool, tr, n = None, None, len(self.bounds) - 1
        if wanted:
            pool = self._row_pool(p1 - p0)
            first, tr = self._sample_tiles(p0, p1)
        else:
            first = []
        rest = n - len(first)  # the other chunks from a tile-dependent start: workers seldom share a column pool
        shift = (p0 // ROW_TILE) * 7919 % max(1, rest)
        seen = 0
        for done, ci in enumerate([*range(len(first)), *(len(first) + (shift + i) % rest for i in range(rest))], 1):
            scores = first[ci] if ci < len(first) else self._dense(p0, p1, ci, raw=True)
            self._select(scores, ci, p0, tr, 0, pool)
            seen += scores.shape[1]
            if wanted and done in (-(-n // 4), -(-n // 2)):  # tighter estimates from what the rows have seen
                tr = np.maximum(tr, pool.rth_best(sample_rank(seen, self.k_rows + self.cpi, self.n_cap)))
        return self._finish(pool, self.k_rows, tr) if wanted else None

    @staticmethod
    def _finish(pool: Pool, k: int, threshold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, short): each list's best k ids, and the lists that may miss a member (their ids
        are meaningless: the caller redoes them): fewer than k candidates, or a k-th best below
        the list's last threshold, which was then a guess too high (an estimate: a threshold
        raised by compaction is a k-th best, never above the final one)."""
        keys, short = pool.best(k)
        short |= decode_scores(keys[:, k - 1]) < threshold
        return decode_ids(keys).astype(np.int32), short

    def _sample_phase(self, pool_map: Callable, rows_wanted: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """The first ``sample_height`` rows, one tall tile per chunk: their first ``sample_rows``
        give each column its sampled threshold; the rows' own lists come out too (their row
        thresholds are read first, ROW_TILE rows at a time, from the row-sample chunks: a small
        extra product, of ``sample_height x sample_chunks`` tiles)."""
        h = self.sample_height
        rows = min(h, ROW_TILE)  # the bound's premise (float32 accumulation, rounding to nearest), on a first tile
        exact = bf16_filter.canonical_tile(self.q[:rows], self.g[: self.bounds[1]])
        unit = bf16_filter.BF16_UNIT_ROUNDOFF if self.bf16 else 0.0
        if not bf16_filter.tile_within_bound(self._sampled(self._dense(0, rows, 0), 0, 0), exact, self.margin, unit):
            raise RuntimeError(f"this CPU's {'bf16' if self.bf16 else 'int8' if self.int8 else 'float32'} products are further from the "
                               "canonical scores than the proven bound allows (aoq_train.mining.canonical); "
                               + ("mine with precision fp32" if self.bf16 or self.int8 else "is torch's float32 matmul "
                                  "precision lowered (torch.set_float32_matmul_precision)?"))
        tr = None
        if rows_wanted:
            pieces = [(p, min(h, p + ROW_TILE)) for p in range(0, h, ROW_TILE)]
            tr = np.concatenate(pool_map(lambda t: self._sample_tiles(*t)[1], pieces))
        pool, lock = Pool(h, self.row_cap), threading.Lock()

        def chunk(ci: int) -> None:
            c0, c1 = self.bounds[ci], self.bounds[ci + 1]
            scores = self._dense(0, h, ci)
            self.tc[c0:c1] = sampled_threshold([self._sampled(scores[: self.sample_rows], 0, ci)], self.k_cols + 1,
                                               self.n_img, axis=0)
            for s0 in range(0, h, ROW_TILE):  # ROW_TILE rows at a time: the scan's buffers stay one tile
                self._select(scores[s0 : s0 + ROW_TILE], ci, s0, tr, s0, pool, lock)

        pool_map(chunk, range(len(self.bounds) - 1))
        return self._finish(pool, self.k_rows, tr) if rows_wanted else None

    def _tighten_columns(self) -> None:
        """Raise each column's threshold to an estimate from the rows its chunk has seen so far (a
        fair sample of the images, whichever row tiles they came from: the image order is random).
        Row tiles may be running meanwhile: each chunk is read under its lock, with its own count."""
        for ci, pool in enumerate(self.col_pools):
            c0, c1 = self.bounds[ci], self.bounds[ci + 1]
            with self.col_locks[ci]:
                r = sample_rank(int(self.rows_in[ci]), self.k_cols + 1, self.n_img)
                np.maximum(self.tc[c0:c1], pool.rth_best(r), out=self.tc[c0:c1])

    # ------------------------------------------------------------------ snapshots

    def save_columns(self, folder: Path, position: int) -> None:
        """Save the column pools and thresholds as they are once the rows below ``position`` are
        scored (:func:`aoq_train.mining.pools.save_pools`)."""
        save_pools(folder, position, self.col_pools, self.tc)

    def load_columns(self, folder: Path, usable: Callable[[int], bool]) -> int:
        """Restore the state saved by :meth:`save_columns` if ``usable(position)`` (the rows below
        it have their lists); returns that position, or 0 (nothing restored)."""
        position = load_pools(folder, self.col_pools, self.bounds, self.tc, usable)
        self.rows_in[:] = position  # a snapshot is taken with no row tile running
        return position

    # ------------------------------------------------------------------ the pass

    def run(self, img_out: np.ndarray, cap_out: np.ndarray, block_size: int,
            done: Callable[[int], bool], on_rows: Callable[[int], None], state: Path | None = None) -> None:
        """Fill ``img_out`` (by image id) for the blocks not ``done`` and all of ``cap_out``.

        Blocks are ``block_size`` consecutive positions of ``img_order``; ``done(first)`` says
        that block ``first`` needs no row lists; ``on_rows(end)`` is called whenever every
        block below position ``end`` has its lists in ``img_out``. With ``state`` (a folder),
        the column pools are saved there every ``SNAPSHOT_SECONDS`` at a block boundary, and a
        rerun whose blocks below a saved position are all done starts from that position.
        """
        short_rows: list[np.ndarray] = []

        def store(p0: int, result: tuple[np.ndarray, np.ndarray] | None) -> None:
            if result is None:
                return
            ids, short = result
            img_out[self.img_order[p0 : p0 + len(ids)]] = ids
            short_rows.append(self.img_order[p0 + np.flatnonzero(short)])

        def wanted(p0: int, p1: int) -> bool:
            return any(not done(b) for b in range(p0 - p0 % block_size, p1, block_size))

        with worker_pool() as ex:
            def pool_map(fn: Callable, items) -> list:
                return list(ex.map(fn, items))

            h = self.sample_height
            end = 0 if state is None else self.load_columns(
                state, lambda position: all(done(b) for b in range(0, position, block_size)))
            if end:
                on_rows(end)
            else:
                store(0, self._sample_phase(pool_map, wanted(0, h)))
                end = h - h % block_size
                if end:
                    self._redo_rows(short_rows, img_out)
                    on_rows(end)

            def submit(b0: int) -> tuple[int, int, list[tuple[int, int]], list]:
                """Queue block ``b0``'s row tiles on the workers: (its start, end, tiles, their futures)."""
                b1 = min(self.n_img, b0 + block_size)
                tiles = [(p, min(b1, p + ROW_TILE)) for p in range(max(b0, h), b1, ROW_TILE)]
                return b0, b1, tiles, [ex.submit(self._row_tile, p0, p1, wanted(p0, p1)) for p0, p1 in tiles]

            saved = time.monotonic()
            queued: collections.deque = collections.deque()  # submitted blocks, oldest first
            following = end  # the first row of the next block to submit

            def snapshot_due() -> bool:
                return state is not None and time.monotonic() - saved >= SNAPSHOT_SECONDS

            def top_up() -> None:
                """Keep the block after the one waited for queued, so that no worker waits at a
                block's end, but queue nothing past a block after which the column pools are to
                be saved: they must not change while they are written."""
                nonlocal following
                while following < self.n_img and len(queued) < QUEUED_BLOCKS and not (queued and snapshot_due()):
                    queued.append(submit(following))
                    following = queued[-1][1]

            top_up()
            while queued:
                b0, b1, tiles, futures = queued.popleft()
                for (p0, _), future in zip(tiles, futures):
                    store(p0, future.result())
                snapshot = b1 < self.n_img and not queued and snapshot_due()
                if not snapshot:
                    top_up()
                # on this thread, not the workers': their queue holds the next blocks' tiles
                self._redo_rows(short_rows, img_out)
                if b0 < self.n_img // 4 <= b1 or b0 < self.n_img // 2 <= b1:
                    self._tighten_columns()
                on_rows(b1)  # this block's lists are saved while the next ones are scored
                if snapshot:
                    self.save_columns(state, b1)
                    saved = time.monotonic()
                    top_up()

            def finish_columns(ci: int) -> np.ndarray:
                """Chunk ``ci``'s caption lists into ``cap_out`` (chunks hold distinct captions); its short ones."""
                c0, c1 = self.bounds[ci], self.bounds[ci + 1]
                ids, short = self._finish(self.col_pools[ci], self.k_cols, self.tc[c0:c1])
                cap_out[self.cap_order[c0:c1]] = ids
                return self.cap_order[c0 + np.flatnonzero(short)]

            short_cols = pool_map(finish_columns, range(len(self.col_pools)))
        self._redo(1, np.concatenate(short_cols), cap_out)

    def _redo_rows(self, short_rows: list[np.ndarray], img_out: np.ndarray) -> None:
        if short_rows:
            self._redo(0, np.concatenate(short_rows), img_out)
            short_rows.clear()

    def _redo(self, which: int, ids: np.ndarray, out: np.ndarray) -> None:
        """Lists that ended short, redone exactly with no threshold (float32 products, canonical
        decision: :func:`aoq_train.mining.topk.exact_rows`), on this thread: during the pass the
        workers are scoring the next blocks meanwhile."""
        if not ids.size:
            return
        log.info("%d %s lists redone exactly (their threshold estimate was too high)", ids.size,
                 ("image", "caption")[which])
        direction = directions(self.img, self.cap, self.cpi, self.k_rows, self.k_cols)[which]
        gallery = torch.from_numpy(direction.gallery)

        part = np.sort(ids)
        out[part] = exact_rows(direction, torch.from_numpy(direction.queries[part]), part, gallery, self.f32_margin)
