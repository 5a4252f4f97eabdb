"""Top-k of one block of queries against a gallery, own positives excluded (torch and FAISS paths).

The fast products (float32 or float16 on a device, FAISS's float32) only find candidates; the
lists are ranked by canonical scores (:mod:`aoq_train.mining.canonical`), like the fused pass's.
With ``m`` a proven bound on ``|fast - canonical|`` for every pair and ``s_k`` a row's k-th best
fast score: the k pairs with the best fast scores have canonical scores ``>= s_k - m``, so the
row's k-th best canonical score is too, and every member of its canonical top k has a fast
score ``>= s_k - 2 m``. Each row therefore keeps every candidate down to ``s_k - 2 m``
(:meth:`Candidates.compact`), and only those are re-scored canonically and ranked
(:func:`rank_canonically`); a row whose threshold guess lay above that level is redone with no
threshold (:func:`exact_rows`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aoq_train.mining.canonical import canonical_pairs, canonical_rows, float32_levels, float32_margin
from aoq_train.mining.keys import PAD, decode_ids, decode_scores, encode_keys

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Direction:
    """Queries scored against a gallery; query q owns gallery ids ``own_start(q) + [0, own_count)``."""

    name: str
    queries: np.ndarray
    gallery: np.ndarray
    k: int
    own_num: int  # own_start(q) = q * own_num // own_den
    own_den: int
    own_count: int

    def own_start(self, q: np.ndarray) -> np.ndarray:
        return q * self.own_num // self.own_den


@dataclass(frozen=True)
class Scorer:
    """Canonical scores of one direction's (query id, gallery id) pairs, with ``margin``, the
    bound on how far its fast products lie from them. On the host by default (the compiled
    kernel, from the direction's float32 arrays); with ``gallery`` (the float32 gallery on a
    device: the GPU's copy), on that device by elementwise operations
    (:func:`aoq_train.mining.canonical.canonical_rows`: the same bits), ``pairs_at_once`` pairs
    at a time (default: 256 MB of gathered float32 rows a side)."""

    direction: Direction
    margin: float
    gallery: torch.Tensor | None = None
    pairs_at_once: int = 0

    def __call__(self, query_ids: np.ndarray, gallery_ids: np.ndarray) -> np.ndarray:
        d = self.direction
        if self.gallery is None:
            return canonical_pairs(d.queries, d.gallery, query_ids, gallery_ids)
        dev = self.gallery.device
        unique, inverse = np.unique(query_ids, return_inverse=True)
        q = torch.from_numpy(d.queries[unique]).to(dev)
        qi, gi = torch.from_numpy(inverse.reshape(-1)).to(dev), torch.from_numpy(gallery_ids).to(dev)
        step = self.pairs_at_once or max(1, 2**26 // q.shape[1])
        parts = [canonical_rows(q[qi[s : s + step]], self.gallery[gi[s : s + step]], rows_at_once=step)
                 for s in range(0, len(qi), step)]  # one pass of ~40 elementwise kernels per piece
        return torch.cat(parts).cpu().numpy() if parts else np.empty(0, dtype=np.float32)


def default_scorer(direction: Direction) -> Scorer:
    """A host scorer for float32 products of ``direction``."""
    return Scorer(direction, float32_margin(direction.queries, direction.gallery))


def _best_keys(n_rows: int, rows: np.ndarray, ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Each row's best k ids (int32) by the tie rule, from (row, id, canonical score) triples,
    ``rows`` non-decreasing (every row has at least k)."""
    counts = np.bincount(rows, minlength=n_rows)
    dense = np.full((n_rows, int(counts.max()) if n_rows else 0), PAD, dtype=np.int64)
    dense[rows, np.arange(rows.size) - (np.cumsum(counts) - counts)[rows]] = encode_keys(scores, ids)
    dense.sort(axis=1)
    return decode_ids(dense[:, ::-1][:, :k]).astype(np.int32)


def rank_canonically(scorer: Scorer, query_ids: np.ndarray, keys: np.ndarray, k: int) -> np.ndarray:
    """The canonical top k ids (int32) of rows of fast keys ``keys`` (each row in decreasing
    order, ``PAD`` past its end, at least k keys, and every pair whose fast score reaches the
    row's k-th best minus twice the margin): those pairs are re-scored canonically and ranked
    by the tie rule (module docstring)."""
    limit = float32_levels(decode_scores(keys[:, k - 1]), 2 * scorer.margin)
    take = (keys != PAD) & (decode_scores(keys) >= limit[:, None])  # a PAD decodes to NaN: never taken
    rows, cols = np.nonzero(take)
    ids = decode_ids(keys[rows, cols])
    return _best_keys(len(keys), rows, ids, scorer(query_ids[rows], ids), k)


def directions(img_emb: np.ndarray, cap_emb: np.ndarray, cpi: int, top_captions: int, top_images: int) -> list[Direction]:
    return [
        Direction("img_top_caps", img_emb, cap_emb, top_captions, cpi, 1, cpi),
        Direction("cap_top_imgs", cap_emb, img_emb, top_images, 1, cpi, 1),
    ]


def chunk_order(n_gallery: int, chunk: int) -> np.ndarray:
    """Gallery ids in processing order. The first chunk is a strided sample of the whole gallery
    (every n-th id: a fair base for the threshold whatever the id order) in a fixed shuffled order,
    so that any prefix of it is a fair sample too; then the other ids in order."""
    stride = max(1, -(-n_gallery // chunk))
    first = np.arange(0, n_gallery, stride)
    rest = np.setdiff1d(np.arange(n_gallery), first, assume_unique=True)
    return np.concatenate([np.random.default_rng(0).permutation(first), rest])


class Candidates:
    """Candidate keys of one query block: a dense, row-sorted part plus appended chunks."""

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows
        self.kept = np.empty((n_rows, 0), dtype=np.int64)
        self.fill = np.zeros(n_rows, dtype=np.int64)
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """Append keys; ``rows`` must be non-decreasing (row-major scan order)."""
        counts = np.bincount(rows, minlength=self.n_rows)
        first_of_row = np.cumsum(counts) - counts
        pos = self.fill[rows] + np.arange(rows.size) - first_of_row[rows]
        self.pending.append((rows.astype(np.int32), pos.astype(np.int32), keys))  # int32: less memory
        self.fill += counts

    def sorted(self) -> np.ndarray:
        """(n_rows, max fill) keys, each row in decreasing order, padded with ``PAD``."""
        dense = np.full((self.n_rows, max(int(self.fill.max()), self.kept.shape[1])), PAD, dtype=np.int64)
        dense[:, : self.kept.shape[1]] = self.kept
        for rows, pos, keys in self.pending:
            dense[rows, pos] = keys
        _map_row_slices(lambda s: dense[s].sort(axis=1), self.n_rows)  # in place, slice by slice
        return dense[:, ::-1]

    def compact(self, k: int, slack: float = 0.0) -> np.ndarray:
        """Keep each row's keys down to its k-th best score minus ``slack`` (all of them in a row
        with fewer than k); returns that level per row (float32, rounded down; -inf for a row
        with fewer than k), below which nothing can matter any more."""
        dense = self.sorted()
        level = np.full(self.n_rows, -np.inf, dtype=np.float32)
        full = self.fill >= k
        level[full] = float32_levels(decode_scores(dense[full, k - 1]), slack)
        keep = (dense != PAD) & (decode_scores(dense) >= level[:, None])  # a prefix of each row
        self.fill = keep.sum(axis=1)
        self.kept = np.ascontiguousarray(dense[:, : int(self.fill.max())])
        self.pending = []
        return level


@functools.lru_cache(maxsize=None)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mining")


def _map_row_slices(fn: Callable[[slice], Any], n_rows: int) -> list[Any]:
    """Run ``fn`` over row slices on torch's thread count (numpy releases the GIL in these
    kernels, and a single numpy thread would leave the other cores idle after the product)."""
    parts = max(1, min(torch.get_num_threads(), n_rows // 64))
    bounds = np.linspace(0, n_rows, parts + 1).astype(int)
    slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    if parts == 1:
        return [fn(slices[0])]
    return list(_pool(parts).map(fn, slices))


def _kth_largest(scores: torch.Tensor, r: int) -> np.ndarray:
    """Each row's r-th largest value (r >= 1). numpy's introselect is several times faster than
    ``torch.topk`` on the CPU; on CUDA ``torch.topk`` is the fast one."""
    if scores.is_cuda:
        return torch.topk(scores, r, dim=1, sorted=False).values.min(dim=1).values.cpu().numpy()
    values, n = scores.numpy(), scores.shape[1]  # partition copies each row slice contiguously
    return np.concatenate(_map_row_slices(lambda s: np.partition(values[s], n - r, axis=1)[:, n - r], len(values)))


def _passing(scores: torch.Tensor, threshold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat row-major positions and values of the scores ``>= threshold[row]`` (one pass)."""
    if scores.is_cuda:
        flat = (scores >= torch.from_numpy(threshold).to(scores.device)[:, None]).view(-1).nonzero().squeeze(1)
        return flat.cpu().numpy(), scores.view(-1)[flat].cpu().numpy()
    values = scores.numpy()
    width = values.shape[1]

    def part(s: slice) -> np.ndarray:  # numpy compare + flatnonzero: ~4x torch.ge + nonzero here
        return np.flatnonzero(np.greater_equal(values[s], threshold[s, None])) + s.start * width

    flat = np.concatenate(_map_row_slices(part, len(values)))
    return flat, values.reshape(-1)[flat]


def half_product(queries: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """float16 product with a float32 result on CUDA: the accumulation is float32 either way, and a
    float16 result would round unit-vector scores to ~5e-4 steps, creating artificial ties."""
    try:
        return torch.mm(queries, chunk.T, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):  # torch < 2.8 has no out_dtype
        return (queries @ chunk.T).float()


def block_topk_torch(
    direction: Direction,
    queries: torch.Tensor,
    query_ids: np.ndarray,
    gallery: torch.Tensor,
    gallery_chunk: int,
    threshold: np.ndarray | None = None,
    cap: int | None = None,
    scorer: Scorer | None = None,
) -> np.ndarray:
    """Top-k gallery ids (int32, canonical tie rule order) of one query block, streamed over
    gallery chunks (module docstring).

    Args:
        queries: (n, d) query embeddings on the compute device (float32, or float16 on CUDA).
        query_ids: the queries' row numbers (they say which gallery ids are their own).
        gallery: (N, d) gallery embeddings on the same device and dtype.
        threshold: per-row starting filter level on the fast scores; None estimates it from the
            first (sampled) chunk; ``keys.LOWEST`` everywhere makes every score a candidate.
        cap: candidates a row may hold before it is cut (default ``max(2k, k + 4096)``).
        scorer: the canonical scores and the fast products' margin (default: float32 products,
            scored on the host).
    """
    scorer = scorer or default_scorer(direction)
    slack = 2 * scorer.margin
    k, n_gal, n_q = direction.k, gallery.shape[0], queries.shape[0]
    device = queries.device
    cap = max(2 * k, k + 4096) if cap is None else cap
    order = chunk_order(n_gal, gallery_chunk)
    position = np.empty(n_gal, dtype=np.int64)
    position[order] = np.arange(n_gal)
    order_t = torch.from_numpy(order).to(device)
    own = position[direction.own_start(query_ids)[:, None] + np.arange(direction.own_count)]  # (n, own)
    buf = torch.empty(n_q * min(gallery_chunk, n_gal), dtype=torch.float32, device=device)
    cands = Candidates(n_q)
    for start in range(0, n_gal, gallery_chunk):
        stop = min(n_gal, start + gallery_chunk)
        width = stop - start
        scores = buf[: n_q * width].view(n_q, width)
        chunk = gallery.index_select(0, order_t[start:stop])
        # Own positives get -inf, which is below every threshold.
        rows, cols = np.nonzero((own >= start) & (own < stop))
        own_rows, own_cols = torch.from_numpy(rows).to(device), torch.from_numpy(own[rows, cols] - start).to(device)
        if queries.dtype == torch.float32:
            torch.mm(queries, chunk.T, out=scores)
        else:
            scores.copy_(half_product(queries, chunk))
        if rows.size:
            scores[own_rows, own_cols] = float("-inf")
        if threshold is None:
            threshold = float32_levels(_estimate_threshold(scores, k + direction.own_count, n_gal), slack)
        flat, values = _passing(scores, threshold)
        if flat.size:
            rows = flat // width
            cands.add(rows, encode_keys(values, order[flat - rows * width + start]))
        if cands.fill.max() > cap:
            threshold = np.maximum(threshold, cands.compact(k, slack))
    ids = np.empty((n_q, k), dtype=np.int32)
    keys = cands.sorted()
    done = cands.fill >= k
    if done.any():  # complete where the last filter level lies at or below the k-th best minus 2 margins
        done[done] = float32_levels(decode_scores(keys[done, k - 1]), slack) >= threshold[done]
    if done.any():
        ids[done] = rank_canonically(scorer, query_ids[done], keys[done], k)
    short = np.flatnonzero(~done)
    if short.size:  # the guessed threshold was too high for these rows: redo them exactly
        ids[short] = exact_rows(direction, queries[torch.from_numpy(short).to(device)], query_ids[short], gallery,
                                scorer.margin)
    return ids


def exact_rows(direction: Direction, queries: torch.Tensor, query_ids: np.ndarray, gallery: torch.Tensor,
               margin: float | None = None, rows_at_once: int | None = None) -> np.ndarray:
    """Top-k with no threshold: every score of each query, ranked canonically. For the few rows
    whose threshold guess was too high: each row group is scored against the whole gallery at
    once (float32 products, or float16 ones with float32 results for a float16 ``queries``;
    ``margin`` bounds their distance to the canonical scores, default float32's), each row's
    k-th best fast score read with a partition, and every pair down to it minus twice the margin
    re-scored canonically on the host and ranked (module docstring), with no copy of the gallery
    (the chunked, candidate-pool path copied a permuted gallery per call: ~10 s of one core for
    a COCO-shape run's redone rows). ``rows_at_once`` (default: ~2**24 scores per group) bounds
    the memory: ~20 bytes a score, ~340 MB per group."""
    k, n_gal, n_q = direction.k, gallery.shape[0], queries.shape[0]
    rows_at_once = rows_at_once or max(1, 2**24 // max(1, n_gal))
    margin = float32_margin(direction.queries, direction.gallery) if margin is None else margin
    ids = np.empty((n_q, k), dtype=np.int32)
    for s in range(0, n_q, rows_at_once):
        q = queries[s : s + rows_at_once]
        scores = (half_product(q, gallery) if q.dtype == torch.float16 else q @ gallery.T).float().cpu().numpy()
        group = query_ids[s : s + len(q)]
        own = direction.own_start(group)[:, None] + np.arange(direction.own_count)
        scores[np.arange(len(q))[:, None], own] = -np.inf
        if s == 0:
            _check_premise(direction, group[0], scores[0], margin)
        kth = np.partition(scores, n_gal - k, axis=1)[:, n_gal - k]
        rows, cols = np.nonzero(scores >= float32_levels(kth, 2 * margin)[:, None])
        values = canonical_pairs(direction.queries, direction.gallery, group[rows], cols)
        ids[s : s + len(q)] = _best_keys(len(q), rows, cols, values, k)
    return ids


def _check_premise(direction: Direction, query_id: int, fast: np.ndarray, margin: float, width: int = 256) -> None:
    """The margin's premise on one row of fast scores (its first ``width`` gallery ids): within
    ``margin`` of the canonical scores (own positives, at -inf, aside).

    Raises:
        RuntimeError: they are further off (float32 products of lowered precision).
    """
    cols = np.arange(min(width, len(fast)))
    canon = canonical_pairs(direction.queries, direction.gallery, np.full(len(cols), query_id), cols)
    shown = np.isfinite(fast[cols])
    if (np.abs(fast[cols][shown].astype(np.float64) - canon[shown]) > margin).any():
        raise RuntimeError("products further from the canonical scores than the proven bound allows "
                           "(aoq_train.mining.canonical): is TF32 or a lowered float32 matmul precision on?")


def _estimate_threshold(sample: torch.Tensor, k: int, n_gallery: int, rank: int = 100) -> np.ndarray:
    """Per-row score with about ``1.4 k + 32`` of the ``n_gallery`` scores above it, read as the
    ``rank``-th best of a prefix of the sampled (shuffled) first chunk. The count it lets through
    has a relative error of ~1/sqrt(rank) = 10%, so a row ends short of k candidates (and is
    redone) only ~3 standard deviations out, for ~0.2% of the rows."""
    target = min(n_gallery, int(1.4 * k) + 32)
    cols = min(sample.shape[1], -(-rank * n_gallery // target))
    r = min(cols, max(1, -(-target * cols // n_gallery)))
    return _kth_largest(sample[:, :cols], r)  # a prefix of the shuffled sample is a fair sample


FAISS_EXTRA = 64  # results asked of FAISS beyond k + own: the pairs within two margins of the k-th


def block_topk_faiss(
    direction: Direction, index: Any, gallery: torch.Tensor, queries: np.ndarray, q_first: int,
    scorer: Scorer | None = None,
) -> np.ndarray:
    """Top-k of one query block with a FAISS flat inner-product index, own positives dropped,
    ranked canonically.

    FAISS returns ``k + own + FAISS_EXTRA`` results per query (float32 scores, within the
    float32 margin of the canonical ones). A row is complete when the lowest score FAISS
    returned lies below its k-th kept score minus twice the margin (nothing FAISS left out can
    then matter, module docstring); its candidates down to that level are ranked canonically.
    Other rows (a cluster of near-equal scores continues past FAISS's cut) are redone by
    :func:`exact_rows`.
    """
    scorer = scorer or default_scorer(direction)
    k, own = direction.k, direction.own_count
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    scores, ids = index.search(queries, min(direction.gallery.shape[0], k + own + FAISS_EXTRA))
    q_ids = np.arange(q_first, q_first + queries.shape[0])
    own_start = direction.own_start(q_ids)[:, None]
    keys = encode_keys(scores, np.maximum(ids, 0))
    keys[((ids >= own_start) & (ids < own_start + own)) | (ids < 0)] = PAD
    keys.sort(axis=1)
    keys = keys[:, ::-1]
    level = float32_levels(decode_scores(keys[:, k - 1]), 2 * scorer.margin)
    lowest = np.where(ids >= 0, scores, np.inf).min(axis=1)  # FAISS left out nothing above its lowest result
    complete = (lowest < level) | (ids < 0).any(axis=1) | (ids.shape[1] == direction.gallery.shape[0])  # or all
    top_ids = np.empty((len(queries), k), dtype=np.int32)
    done = np.flatnonzero(complete)
    if done.size:
        top_ids[done] = rank_canonically(scorer, q_ids[done], keys[done], k)
    straddling = np.flatnonzero(~complete)
    if straddling.size:
        top_ids[straddling] = exact_rows(direction, torch.from_numpy(queries[straddling]), q_ids[straddling], gallery,
                                         scorer.margin)
    return top_ids




def faiss_index(gallery: np.ndarray) -> Any:
    import faiss  # imported lazily: the torch backend does not need it

    index = faiss.IndexFlatIP(gallery.shape[1])
    index.add(np.ascontiguousarray(gallery, dtype=np.float32))
    return index

