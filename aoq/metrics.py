"""The retrieval evaluation protocol of VSE++/SCAN/VSRN (docs/evaluation.md), vectorised with numpy.

Layout: ``sims`` is an (n_images, n_captions) array of similarity scores with
``n_captions = captions_per_image * n_images`` and captions ``cpi*k .. cpi*k + cpi - 1``
belonging to image k.

Ranks are 0-based. Image->text (i2t): one query per image, its rank is the best (lowest) rank
among its captions. Text->image (t2i): one query per caption. R@K is the percentage of queries
with rank < K, ``medr = floor(median(rank)) + 1``, ``meanr = mean(rank) + 1``, and rsum adds the
six recalls.

Tie rule (pessimistic): the rank of a positive is the number of NEGATIVE candidates whose score
is greater than OR EQUAL to the positive's, counted exactly against the positive's own score. A
negative tied with the positive ranks above it, so constant scores (a collapsed model) give
recall 0, at or below chance, never a perfect score. Without ties this equals the usual
``argsort`` position used by the VSE++ code; with ties argsort would depend on the sort's
arbitrary order. For i2t the other captions of the same image are positives and never count,
so the rank is the number of negatives scored at or above the best caption.

Everything is computed in blocks through a "sims function" ``fn(image_slice, caption_slice)``
returning that block of scores, so a 5,000 x 25,000 matrix never needs more than a few tens of
megabytes of temporaries and embeddings can be evaluated without forming the full matrix.
"""

from __future__ import annotations

from typing import Callable, Literal, get_args

import numpy as np

#: ``fn(image_slice, caption_slice) -> scores`` of those images against those captions.
SimsFn = Callable[[slice, slice], np.ndarray]

METRIC_KEYS = ("r1", "r5", "r10", "medr", "meanr")
#: "full": the whole split; "1k5fold": COCO 1K, the mean over 5 folds of 1,000 images; "5k": COCO 5K
Protocol = Literal["full", "1k5fold", "5k"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)
#: rank intervals of the supplement's cross-retrieval histogram (inclusive, None = no upper end).
DEFAULT_BINS = ((1, 1), (2, 5), (6, 20), (21, 100), (101, 200), (201, None))
#: number of score elements handled per block (bounds the temporary boolean arrays).
BLOCK_ELEMENTS = 1 << 24


# --------------------------------------------------------------------------- validation


def check_layout(n_images: int, n_captions: int, captions_per_image: int, what: str = "sims") -> None:
    if not isinstance(captions_per_image, (int, np.integer)) or captions_per_image < 1:
        raise ValueError(f"captions_per_image must be a positive integer, got {captions_per_image!r}")
    if n_images < 1:
        raise ValueError(f"{what}: needs at least one image, got {n_images}")
    if n_captions != captions_per_image * n_images:
        raise ValueError(
            f"{what}: {n_captions} captions for {n_images} images, expected "
            f"captions_per_image * n_images = {captions_per_image * n_images}"
        )


def _as_sims(sims: np.ndarray, captions_per_image: int) -> np.ndarray:
    sims = np.asarray(sims)
    if sims.ndim != 2:
        raise ValueError(f"sims must be a 2-D (n_images, n_captions) array, got shape {sims.shape}")
    if not (np.issubdtype(sims.dtype, np.floating) or np.issubdtype(sims.dtype, np.integer)):
        raise ValueError(f"sims must hold real numbers, got dtype {sims.dtype}")
    check_layout(sims.shape[0], sims.shape[1], captions_per_image)
    return sims


def _array_fn(sims: np.ndarray) -> SimsFn:
    return lambda rows, cols: sims[rows, cols]


def _block(fn: SimsFn, rows: slice, cols: slice) -> np.ndarray:
    return np.asarray(fn(rows, cols))


def _check_positives(positives: np.ndarray) -> None:
    # A NaN positive would compare False against everything and rank first. Scanning every
    # score for NaN would cost as much as ranking, so only the (few) positives are checked;
    # a NaN negative compares False and is never counted above a positive.
    if np.isnan(positives).any():
        raise ValueError("similarity scores of positive pairs contain NaN: ranks would be meaningless")


def _blocks(total: int, other: int, factor: int = 1):
    """Slices of ``total`` so that one block holds about ``BLOCK_ELEMENTS`` elements."""
    step = max(1, BLOCK_ELEMENTS // max(1, other * factor))
    for start in range(0, total, step):
        yield slice(start, min(start + step, total))


# --------------------------------------------------------------------------- ranks


def _i2t_ranks(fn: SimsFn, n_images: int, cpi: int) -> np.ndarray:
    n_captions = n_images * cpi
    ranks = np.empty(n_images, dtype=np.int64)
    for rows in _blocks(n_images, n_captions):
        block = _block(fn, rows, slice(0, n_captions))
        local = np.arange(rows.stop - rows.start)
        own = (rows.start + local)[:, None] * cpi + np.arange(cpi)
        positives = block[local[:, None], own]
        _check_positives(positives)
        best = positives.max(axis=1)
        # Pessimistic ties: every candidate >= the best positive, minus the positives themselves.
        at_or_above = np.count_nonzero(block >= best[:, None], axis=1)
        ranks[rows] = at_or_above - np.count_nonzero(positives >= best[:, None], axis=1)
    return ranks


def _t2i_ranks(fn: SimsFn, n_images: int, cpi: int) -> np.ndarray:
    """Caption ranks from a sims function, in caption blocks holding every image."""
    n_captions = n_images * cpi
    ranks = np.empty(n_captions, dtype=np.int64)
    for cols in _blocks(n_captions, n_images):
        block = _block(fn, slice(0, n_images), cols)
        caption = np.arange(cols.start, cols.stop)
        # The positive is read from the very block it is compared against, so a score computed
        # blockwise (e.g. a matrix product) is never compared with a differently rounded copy.
        positive = block[caption // cpi, caption - cols.start]
        _check_positives(positive)
        # >= counts the positive itself once: subtract it (pessimistic ties).
        ranks[cols] = np.count_nonzero(block >= positive[None, :], axis=0) - 1
    return ranks


def _t2i_ranks_array(sims: np.ndarray, cpi: int) -> np.ndarray:
    """Caption ranks from a score array, in contiguous image blocks (faster than caption blocks)."""
    n_images, n_captions = sims.shape
    caption = np.arange(n_captions)
    positive = sims[caption // cpi, caption]
    _check_positives(positive)
    ranks = np.full(n_captions, -1, dtype=np.int64)  # the positive itself is counted once below
    for rows in _blocks(n_images, n_captions):
        ranks += np.count_nonzero(sims[rows] >= positive[None, :], axis=0)
    return ranks


def _ranks(source: np.ndarray | SimsFn, n_images: int, cpi: int) -> tuple[np.ndarray, np.ndarray]:
    """(i2t ranks, t2i ranks) of a score array or a sims function."""
    if callable(source):
        return _i2t_ranks(source, n_images, cpi), _t2i_ranks(source, n_images, cpi)
    return _i2t_ranks(_array_fn(source), n_images, cpi), _t2i_ranks_array(source, cpi)


def i2t_ranks(sims: np.ndarray, captions_per_image: int = 5) -> np.ndarray:
    """0-based rank of every image query: negatives scored at or above its best caption.

    Returns:
        int64 array of shape (n_images,).
    """
    sims = _as_sims(sims, captions_per_image)
    return _i2t_ranks(_array_fn(sims), sims.shape[0], captions_per_image)


def t2i_ranks(sims: np.ndarray, captions_per_image: int = 5) -> np.ndarray:
    """0-based rank of every caption query: other images scored at or above the caption's own image.

    Returns:
        int64 array of shape (n_captions,).
    """
    return _t2i_ranks_array(_as_sims(sims, captions_per_image), captions_per_image)


def recall_metrics(ranks: np.ndarray) -> dict[str, float]:
    """``r1, r5, r10`` (percent), ``medr = floor(median) + 1`` and ``meanr = mean + 1`` of 0-based ranks."""
    ranks = np.asarray(ranks)
    if ranks.ndim != 1 or ranks.size == 0:
        raise ValueError(f"ranks must be a non-empty 1-D array, got shape {ranks.shape}")
    return {
        "r1": float(100.0 * np.mean(ranks < 1)),
        "r5": float(100.0 * np.mean(ranks < 5)),
        "r10": float(100.0 * np.mean(ranks < 10)),
        "medr": float(np.floor(np.median(ranks)) + 1),
        "meanr": float(ranks.mean() + 1),
    }


def i2t(sims: np.ndarray, captions_per_image: int = 5) -> dict[str, float]:
    """Image->text retrieval metrics ``{r1, r5, r10, medr, meanr}`` (recalls in percent)."""
    return recall_metrics(i2t_ranks(sims, captions_per_image))


def t2i(sims: np.ndarray, captions_per_image: int = 5) -> dict[str, float]:
    """Text->image retrieval metrics ``{r1, r5, r10, medr, meanr}`` (recalls in percent)."""
    return recall_metrics(t2i_ranks(sims, captions_per_image))


def rsum(i2t_metrics: dict[str, float], t2i_metrics: dict[str, float]) -> float:
    """The six recalls added: R@1 + R@5 + R@10 of both directions."""
    return float(sum(m[k] for m in (i2t_metrics, t2i_metrics) for k in ("r1", "r5", "r10")))


def chance_rsum(n_images: int, captions_per_image: int = 5) -> float:
    """Expected rsum of a uniformly random ranking (random scores, no ties) on a full set.

    i2t: the best of ``cpi`` positives among ``N = cpi * n`` captions is in the top K with
    probability ``1 - C(N - cpi, K) / C(N, K)``; t2i: ``min(K, n) / n``.
    """
    check_layout(n_images, n_images * captions_per_image, captions_per_image)
    n_captions = n_images * captions_per_image
    total = 0.0
    for k in (1, 5, 10):
        miss = 1.0
        for j in range(min(k, n_captions)):  # C(N - cpi, K) / C(N, K) as a product
            miss *= max(0, n_captions - captions_per_image - j) / (n_captions - j)
        total += 100.0 * ((1.0 - miss) + min(k, n_images) / n_images)
    return total


def _evaluate(source: np.ndarray | SimsFn, n_images: int, cpi: int) -> dict:
    forward_ranks, backward_ranks = _ranks(source, n_images, cpi)
    forward, backward = recall_metrics(forward_ranks), recall_metrics(backward_ranks)
    return {"i2t": forward, "t2i": backward, "rsum": rsum(forward, backward)}


def evaluate_sims(sims: np.ndarray, captions_per_image: int = 5) -> dict:
    """``{"i2t": {...}, "t2i": {...}, "rsum": x}`` on the whole matrix."""
    sims = _as_sims(sims, captions_per_image)
    return _evaluate(sims, sims.shape[0], captions_per_image)


# --------------------------------------------------------------------------- 1K / 5K protocols


def _checked_source(
    sims: np.ndarray | SimsFn, captions_per_image: int, n_images: int | None
) -> tuple[np.ndarray | SimsFn, int]:
    if callable(sims):
        if n_images is None:
            raise ValueError("a sims function needs n_images")
        check_layout(n_images, n_images * captions_per_image, captions_per_image)
        return sims, n_images
    array = _as_sims(sims, captions_per_image)
    return array, array.shape[0]


def _need_images(n_images: int, needed: int, protocol: str, fold_images: int, n_folds: int) -> None:
    if n_images < needed:
        raise ValueError(
            f"the {protocol} protocol needs at least {needed:,} images ({n_folds} folds of {fold_images:,}); "
            f"this set has {n_images:,}"
        )


def _mean_results(results: list[dict]) -> dict:
    mean = {
        direction: {k: float(np.mean([r[direction][k] for r in results])) for k in METRIC_KEYS}
        for direction in ("i2t", "t2i")
    }
    mean["rsum"] = float(np.mean([r["rsum"] for r in results]))
    return mean


def _fold(source: np.ndarray | SimsFn, images: slice, captions: slice) -> np.ndarray | SimsFn:
    """The block of ``source`` for these images and captions, re-indexed from 0."""
    if not callable(source):
        return source[images, captions]

    def fold_fn(rows: slice, cols: slice) -> np.ndarray:
        return source(
            slice(images.start + rows.start, images.start + rows.stop),
            slice(captions.start + cols.start, captions.start + cols.stop),
        )

    return fold_fn


def fold_1k(
    sims: np.ndarray | SimsFn,
    captions_per_image: int = 5,
    *,
    n_images: int | None = None,
    fold_images: int = 1000,
    n_folds: int = 5,
) -> dict:
    """COCO "1K": every metric averaged over ``n_folds`` consecutive folds of ``fold_images``
    images (and their captions) of the first ``n_folds * fold_images`` images.

    Args:
        sims: the (n_images, n_captions) score array, or a sims function ``fn(image_slice,
            caption_slice)`` (then ``n_images`` is required); only the diagonal fold blocks are read.

    Returns:
        ``{"protocol": "1k5fold", "n_images", "fold_images", "i2t", "t2i", "rsum", "folds": [...]}``
        where i2t/t2i/rsum are the fold means (medr too, so it need not be an integer) and
        ``folds`` holds each fold's own ``{"i2t", "t2i", "rsum"}``.

    Raises:
        ValueError: fewer than ``n_folds * fold_images`` images.
    """
    source, total = _checked_source(sims, captions_per_image, n_images)
    needed = fold_images * n_folds
    _need_images(total, needed, "1k5fold", fold_images, n_folds)
    folds = []
    for f in range(n_folds):
        images = slice(f * fold_images, (f + 1) * fold_images)
        captions = slice(images.start * captions_per_image, images.stop * captions_per_image)
        folds.append(_evaluate(_fold(source, images, captions), fold_images, captions_per_image))
    return {"protocol": "1k5fold", "n_images": needed, "fold_images": fold_images, **_mean_results(folds), "folds": folds}


def evaluate_embeddings(
    img_emb: np.ndarray,
    cap_emb: np.ndarray,
    captions_per_image: int = 5,
    protocol: Protocol = "full",
    *,
    fold_images: int = 1000,
    n_folds: int = 5,
) -> dict:
    """Evaluate (n_images, d) image and (n_captions, d) caption embeddings under a protocol.

    Scores are dot products (cosine similarity for L2-normalised embeddings), computed block by
    block, so neither the 5K matrix nor any fold's matrix is held in memory at once (each block
    is computed twice, once per direction, and each positive is compared inside its own block).

    * ``"full"``: every image and caption of the set (Flickr30K 1K test, the synthetic test split);
    * ``"1k5fold"``: :func:`fold_1k` (COCO 1K, the first 5,000 images in 5 folds of 1,000);
    * ``"5k"``: the first ``n_folds * fold_images`` (5,000) images at once (COCO 5K).

    Returns:
        ``{"protocol", "n_images", "i2t", "t2i", "rsum"}`` (plus ``fold_images`` and ``folds``
        for 1k5fold); ``n_images`` is the number of images evaluated.

    Raises:
        ValueError: bad shapes, non-finite embeddings, unknown protocol, or too few images for
        1k5fold/5k.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
    img_emb, cap_emb = np.asarray(img_emb), np.asarray(cap_emb)
    if img_emb.ndim != 2 or cap_emb.ndim != 2 or img_emb.shape[1] != cap_emb.shape[1]:
        raise ValueError(
            f"embeddings must be (n_images, d) and (n_captions, d) with the same d, "
            f"got {img_emb.shape} and {cap_emb.shape}"
        )
    check_layout(img_emb.shape[0], cap_emb.shape[0], captions_per_image, what="embeddings")
    if not (np.isfinite(img_emb).all() and np.isfinite(cap_emb).all()):
        raise ValueError("embeddings contain NaN or infinite values")

    def fn(rows: slice, cols: slice) -> np.ndarray:
        return img_emb[rows] @ cap_emb[cols].T

    n_images = img_emb.shape[0]
    if protocol == "1k5fold":
        return fold_1k(fn, captions_per_image, n_images=n_images, fold_images=fold_images, n_folds=n_folds)
    if protocol == "5k":
        needed = fold_images * n_folds
        _need_images(n_images, needed, "5k", fold_images, n_folds)
        n_images = needed
    return {"protocol": protocol, "n_images": n_images, **_evaluate(fn, n_images, captions_per_image)}


# --------------------------------------------------------------------------- cross-retrieval ranks


def pair_ranks(sims: np.ndarray, captions_per_image: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """1-based ranks ``(r_i, r_t)`` of every positive pair (caption c, its image k = c // cpi).

    Reading of the AOQ supplement: on COCO 5K each pair is ranked "against the 4,999 negative
    pairs that share the same text" (r_i) and "the 24,995 negative pairs that share the same
    image" (r_t). So, with the pessimistic tie rule of this module (ties rank above the pair):

    * ``r_i[c] = 1 + #{images j != k : S(j, c) >= S(k, c)}`` (= the t2i rank of c, plus one);
    * ``r_t[c] = 1 + #{captions c' not of image k : S(k, c') >= S(k, c)}`` — the other captions
      of image k are positives, not negatives, and are left out.

    Returns:
        two int64 arrays of shape (n_captions,).
    """
    sims = _as_sims(sims, captions_per_image)
    n_images, cpi = sims.shape[0], captions_per_image
    fn = _array_fn(sims)
    r_i = _t2i_ranks(fn, n_images, cpi) + 1
    r_t = np.empty(n_images * cpi, dtype=np.int64)
    for rows in _blocks(n_images, sims.shape[1], factor=cpi):
        block = _block(fn, rows, slice(None))
        local = np.arange(rows.stop - rows.start)
        own = (rows.start + local)[:, None] * cpi + np.arange(cpi)
        positives = block[local[:, None], own]  # (rows, cpi)
        _check_positives(positives)
        above_all = np.count_nonzero(block[:, None, :] >= positives[:, :, None], axis=2)
        above_own = np.count_nonzero(positives[:, None, :] >= positives[:, :, None], axis=2)
        r_t[own.ravel()] = (above_all - above_own).ravel() + 1
    return r_i, r_t


def cross_retrieval_ranks(sims: np.ndarray, captions_per_image: int = 5) -> np.ndarray:
    """Cross-retrieval rank of every positive pair: ``max(5 * r_i - 4, r_t)`` (AOQ supplement).

    ``r_i`` and ``r_t`` are the 1-based ranks of :func:`pair_ranks`. The factor puts the two
    scales side by side: a pair has 5x more image-sharing than text-sharing negatives, so rank
    r_i among images covers ranks ``5 r_i - 4 .. 5 r_i`` among captions; for another
    ``captions_per_image`` the formula reads ``cpi * r_i - (cpi - 1)``. A result of 1 means the
    pair beats every negative of both kinds.

    Returns:
        int64 array of shape (n_captions,), indexed by caption.
    """
    r_i, r_t = pair_ranks(sims, captions_per_image)
    return np.maximum(captions_per_image * r_i - (captions_per_image - 1), r_t)


def _bin_label(low: int, high: int | None) -> str:
    if high is None:
        return f">{low - 1}"
    return str(low) if low == high else f"{low}-{high}"


def rank_histogram(
    ranks: np.ndarray, bins: tuple[tuple[int, int | None], ...] = DEFAULT_BINS
) -> dict[str, int]:
    """Count 1-based ranks per inclusive interval; the default intervals are the supplement's
    (``"1", "2-5", "6-20", "21-100", "101-200", ">200"``).

    Args:
        bins: ascending, non-overlapping ``(low, high)`` pairs, ``high=None`` for no upper end.
            Ranks falling in no interval are not counted.

    Returns:
        ``{label: count}`` in the order of ``bins``.
    """
    ranks = np.asarray(ranks)
    if ranks.ndim != 1 or not np.issubdtype(ranks.dtype, np.integer):
        raise ValueError(f"ranks must be a 1-D integer array, got shape {ranks.shape} dtype {ranks.dtype}")
    if ranks.size and ranks.min() < 1:
        raise ValueError(f"ranks must be 1-based (>= 1), got a minimum of {ranks.min()}")
    previous_high = 0
    counts: dict[str, int] = {}
    for low, high in bins:
        if low <= previous_high or (high is not None and high < low):
            raise ValueError(f"bins must be ascending, non-overlapping intervals of ranks >= 1, got {bins}")
        inside = ranks >= low if high is None else (ranks >= low) & (ranks <= high)
        counts[_bin_label(low, high)] = int(np.count_nonzero(inside))
        previous_high = np.inf if high is None else high
    return counts
