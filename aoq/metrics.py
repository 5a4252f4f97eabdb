"""The retrieval evaluation protocol of VSE++/SCAN/VSRN (docs/evaluation.md), vectorised with numpy.

Layout: ``sims`` is an (n_images, n_captions) array of similarity scores with
``n_captions = captions_per_image * n_images`` and captions ``cpi*k .. cpi*k + cpi - 1``
belonging to image k.

Ranks are 0-based. Image->text (i2t): one query per image, its rank is that of its best
positive caption. Text->image (t2i): one query per caption. R@K is the percentage of queries
ranked in the top K, ``medr = floor(median(rank)) + 1``, ``meanr = mean(rank) + 1``, and rsum
adds the six recalls.

Ties (:mod:`aoq.ranks`): a rank is where the best positive lands under a uniformly random order
of the tied items, so R@K is the probability of a hit (a positive tied with one negative is half
a hit at K = 1), medr and meanr come from the expected rank, and constant scores give exactly
:func:`chance_rsum`. Positives: ``texts=None`` is the published pair rule (caption ``c`` matches
image ``c // cpi``); with the caption texts, identical (normalised) texts count as one answer.

Everything is computed in blocks through a "sims function" ``fn(image_slice, caption_slice)``
returning that block of scores, so a 5,000 x 25,000 matrix never needs more than a few tens of
megabytes of temporaries and embeddings can be evaluated without forming the full matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from aoq.ranks import Positives, RankStats, SimsFn, array_fn, check_layout, i2t_stats, t2i_stats

METRIC_KEYS = ("r1", "r5", "r10", "medr", "meanr")
#: "full": the whole split; "1k5fold": COCO 1K, the mean over 5 folds of 1,000 images; "5k": COCO 5K
Protocol = Literal["full", "1k5fold", "5k"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)
#: COCO 1K: folds of this many images, this many folds (and 5K: their images at once).
FOLD_IMAGES = 1000
N_FOLDS = 5
#: rank intervals of the supplement's cross-retrieval histogram (inclusive, None = no upper end).
DEFAULT_BINS = ((1, 1), (2, 5), (6, 20), (21, 100), (101, 200), (201, None))


# --------------------------------------------------------------------------- validation


def _as_sims(sims: np.ndarray, captions_per_image: int) -> np.ndarray:
    sims = np.asarray(sims)
    if sims.ndim != 2:
        raise ValueError(f"sims must be a 2-D (n_images, n_captions) array, got shape {sims.shape}")
    if not (np.issubdtype(sims.dtype, np.floating) or np.issubdtype(sims.dtype, np.integer)):
        raise ValueError(f"sims must hold real numbers, got dtype {sims.dtype}")
    check_layout(sims.shape[0], sims.shape[1], captions_per_image)
    return sims


def positives_of(n_images: int, captions_per_image: int, texts: Sequence[str] | None) -> Positives:
    """The pair rule (``texts`` None) or the text rule over these caption texts."""
    if texts is None:
        return Positives.pairs(n_images, captions_per_image)
    if len(texts) != n_images * captions_per_image:
        raise ValueError(f"{len(texts)} caption texts for {n_images * captions_per_image} captions")
    return Positives.texts(texts, captions_per_image)


# --------------------------------------------------------------------------- ranks


def i2t_ranks(sims: np.ndarray, captions_per_image: int = 5, texts: Sequence[str] | None = None) -> np.ndarray:
    """0-based expected rank of every image query (its best positive caption), float64 (n_images,)."""
    sims = _as_sims(sims, captions_per_image)
    return i2t_stats(array_fn(sims), positives_of(sims.shape[0], captions_per_image, texts)).expected()


def t2i_ranks(sims: np.ndarray, captions_per_image: int = 5, texts: Sequence[str] | None = None) -> np.ndarray:
    """0-based expected rank of every caption query (its best positive image), float64 (n_captions,)."""
    sims = _as_sims(sims, captions_per_image)
    return t2i_stats(array_fn(sims), positives_of(sims.shape[0], captions_per_image, texts)).expected()


def recall_metrics(stats: RankStats) -> dict[str, float]:
    """``r1, r5, r10`` (percent: the mean probability of a hit), ``medr = floor(median) + 1``
    and ``meanr = mean + 1`` of the expected 0-based ranks."""
    if stats.above.ndim != 1 or stats.above.size == 0:
        raise ValueError(f"need rank statistics of at least one query, got shape {stats.above.shape}")
    expected = stats.expected()
    return {
        "r1": float(100.0 * stats.hit_probability(1).mean()),
        "r5": float(100.0 * stats.hit_probability(5).mean()),
        "r10": float(100.0 * stats.hit_probability(10).mean()),
        "medr": float(np.floor(np.median(expected)) + 1),
        "meanr": float(expected.mean() + 1),
    }


def i2t(sims: np.ndarray, captions_per_image: int = 5, texts: Sequence[str] | None = None) -> dict[str, float]:
    """Image->text retrieval metrics ``{r1, r5, r10, medr, meanr}`` (recalls in percent)."""
    sims = _as_sims(sims, captions_per_image)
    return recall_metrics(i2t_stats(array_fn(sims), positives_of(sims.shape[0], captions_per_image, texts)))


def t2i(sims: np.ndarray, captions_per_image: int = 5, texts: Sequence[str] | None = None) -> dict[str, float]:
    """Text->image retrieval metrics ``{r1, r5, r10, medr, meanr}`` (recalls in percent)."""
    sims = _as_sims(sims, captions_per_image)
    return recall_metrics(t2i_stats(array_fn(sims), positives_of(sims.shape[0], captions_per_image, texts)))


def rsum(i2t_metrics: dict[str, float], t2i_metrics: dict[str, float]) -> float:
    """The six recalls added: R@1 + R@5 + R@10 of both directions."""
    return float(sum(m[k] for m in (i2t_metrics, t2i_metrics) for k in ("r1", "r5", "r10")))


def chance_rsum(n_images: int, captions_per_image: int = 5) -> float:
    """Expected rsum of a uniformly random ranking on a full set: random scores, and (by the tie
    rule) constant scores too.

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


def _evaluate(source: np.ndarray | SimsFn, positives: Positives, t2i_source: SimsFn | None = None) -> dict:
    fn = source if callable(source) else array_fn(source)
    forward = recall_metrics(i2t_stats(fn, positives))
    backward = recall_metrics(t2i_stats(t2i_source or fn, positives))
    return {"i2t": forward, "t2i": backward, "rsum": rsum(forward, backward), "merged": positives.merged}


def evaluate_directions(i2t_fn: SimsFn, t2i_fn: SimsFn, n_images: int, captions_per_image: int = 5,
                        texts: Sequence[str] | None = None) -> dict:
    """The ``full`` protocol where each direction ranks its own scores: ``i2t_fn`` is read by
    image rows, ``t2i_fn`` by caption columns (both in the (n_images, n_captions) layout). Query-side
    normalisations (:mod:`aoq.hubness`) give a different matrix per direction.

    Returns:
        as :func:`evaluate_embeddings` with ``protocol="full"``.
    """
    check_layout(n_images, n_images * captions_per_image, captions_per_image)
    positives = positives_of(n_images, captions_per_image, texts)
    return {"protocol": "full", "n_images": n_images, **_evaluate(i2t_fn, positives, t2i_fn)}


def evaluate_sims(sims: np.ndarray, captions_per_image: int = 5, texts: Sequence[str] | None = None) -> dict:
    """``{"i2t": {...}, "t2i": {...}, "rsum": x, "merged": n}`` on the whole matrix (``merged``:
    the (image, caption) pairs the text rule matched beyond each caption's own image)."""
    sims = _as_sims(sims, captions_per_image)
    return _evaluate(sims, positives_of(sims.shape[0], captions_per_image, texts))


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
    mean["merged"] = int(sum(r["merged"] for r in results))
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
    sims: np.ndarray | SimsFn, captions_per_image: int = 5, *, n_images: int | None = None,
    fold_images: int = FOLD_IMAGES, n_folds: int = N_FOLDS, texts: Sequence[str] | None = None,
) -> dict:
    """COCO "1K": every metric averaged over ``n_folds`` consecutive folds of ``fold_images``
    images (and their captions) of the first ``n_folds * fold_images`` images.

    Args:
        sims: the (n_images, n_captions) score array, or a sims function ``fn(image_slice,
            caption_slice)`` (then ``n_images`` is required); only the diagonal fold blocks are read.
        texts: the caption texts for the text rule (within each fold), None for the pair rule.

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
    positives = positives_of(total, captions_per_image, texts)
    folds = []
    for f in range(n_folds):
        images = slice(f * fold_images, (f + 1) * fold_images)
        captions = slice(images.start * captions_per_image, images.stop * captions_per_image)
        folds.append(_evaluate(_fold(source, images, captions), positives.fold(images.start, fold_images)))
    return {"protocol": "1k5fold", "n_images": needed, "fold_images": fold_images, **_mean_results(folds), "folds": folds}


def evaluate_embeddings(
    img_emb: np.ndarray, cap_emb: np.ndarray, captions_per_image: int = 5, protocol: Protocol = "full", *,
    fold_images: int = FOLD_IMAGES, n_folds: int = N_FOLDS, texts: Sequence[str] | None = None,
) -> dict:
    """Evaluate (n_images, d) image and (n_captions, d) caption embeddings under a protocol.

    Scores are dot products (cosine similarity for L2-normalised embeddings), computed block by
    block, so neither the 5K matrix nor any fold's matrix is held in memory at once (each block
    is computed twice, once per direction, and each positive is compared inside its own block).

    * ``"full"``: every image and caption of the set (Flickr30K 1K test, the synthetic test split);
    * ``"1k5fold"``: :func:`fold_1k` (COCO 1K, the first 5,000 images in 5 folds of 1,000);
    * ``"5k"``: the first ``n_folds * fold_images`` (5,000) images at once (COCO 5K).

    ``texts`` (the captions' texts) selects the text rule: identical texts are one answer
    (``eval.positives: text``); None keeps the pair rule of the published protocol.

    Returns:
        ``{"protocol", "n_images", "i2t", "t2i", "rsum", "merged"}`` (plus ``fold_images`` and
        ``folds`` for 1k5fold); ``n_images`` is the number of images evaluated, ``merged`` the
        (image, caption) pairs the text rule matched beyond each caption's own image.

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

    return _evaluate_protocol(fn, img_emb.shape[0], captions_per_image, protocol, fold_images, n_folds, texts)


def evaluate_scores(
    sims: np.ndarray, captions_per_image: int = 5, protocol: Protocol = "full", *,
    fold_images: int = FOLD_IMAGES, n_folds: int = N_FOLDS, texts: Sequence[str] | None = None,
) -> dict:
    """:func:`evaluate_embeddings` on a score matrix (a pair model's, :mod:`aoq.pair_scores`):
    (n_images, n_captions), or for ``1k5fold`` and ``5k`` at least its first 5,000 images' rows and
    their captions' columns.

    Raises:
        ValueError: as :func:`evaluate_embeddings`.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
    sims = _as_sims(sims, captions_per_image)
    if not np.isfinite(sims).all():
        raise ValueError("scores contain NaN or infinite values")
    return _evaluate_protocol(array_fn(sims), sims.shape[0], captions_per_image, protocol, fold_images, n_folds,
                              texts)


def _evaluate_protocol(fn: SimsFn, n_images: int, captions_per_image: int, protocol: str, fold_images: int,
                       n_folds: int, texts: Sequence[str] | None) -> dict:
    if protocol == "1k5fold":
        return fold_1k(fn, captions_per_image, n_images=n_images, fold_images=fold_images, n_folds=n_folds,
                       texts=texts)
    if protocol == "5k":
        needed = fold_images * n_folds
        _need_images(n_images, needed, "5k", fold_images, n_folds)
        n_images = needed
        texts = None if texts is None else texts[: needed * captions_per_image]
    positives = positives_of(n_images, captions_per_image, texts)
    return {"protocol": protocol, "n_images": n_images, **_evaluate(fn, positives)}


# --------------------------------------------------------------------------- cross-retrieval ranks


def pair_ranks(sims: np.ndarray, captions_per_image: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """1-based expected ranks ``(r_i, r_t)`` of every positive pair (caption c, its image k = c // cpi).

    Reading of the AOQ supplement: on COCO 5K each pair is ranked "against the 4,999 negative
    pairs that share the same text" (r_i) and "the 24,995 negative pairs that share the same
    image" (r_t). So, with the tie rule of this module (a tie with the pair is half a place):

    * ``r_i[c]``: image k among all images for caption c (the t2i rank of c, plus one);
    * ``r_t[c]``: caption c among the captions of other images for image k — the other captions
      of image k are positives, not negatives, and are left out.

    Returns:
        two float64 arrays of shape (n_captions,).
    """
    sims = _as_sims(sims, captions_per_image)
    n_images, cpi = sims.shape[0], captions_per_image
    r_i = t2i_stats(array_fn(sims), Positives.pairs(n_images, cpi)).expected() + 1
    r_t = np.empty(n_images * cpi, dtype=np.float64)
    for k in range(n_images):
        own = slice(k * cpi, (k + 1) * cpi)
        others = np.concatenate([sims[k, : own.start], sims[k, own.stop :]])
        scores = sims[k, own]
        above = np.count_nonzero(others[None, :] > scores[:, None], axis=1)
        tied = np.count_nonzero(others[None, :] == scores[:, None], axis=1)
        r_t[k * cpi:(k + 1) * cpi] = above + tied / 2.0 + 1
    return r_i, r_t


def cross_retrieval_ranks(sims: np.ndarray, captions_per_image: int = 5) -> np.ndarray:
    """Cross-retrieval rank of every positive pair: ``max(5 * r_i - 4, r_t)`` (AOQ supplement).

    ``r_i`` and ``r_t`` are the 1-based ranks of :func:`pair_ranks`. The factor puts the two
    scales side by side: a pair has 5x more image-sharing than text-sharing negatives, so rank
    r_i among images covers ranks ``5 r_i - 4 .. 5 r_i`` among captions; for another
    ``captions_per_image`` the formula reads ``cpi * r_i - (cpi - 1)``. A result of 1 means the
    pair beats every negative of both kinds.

    Returns:
        float64 array of shape (n_captions,), indexed by caption.
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
    """Count 1-based ranks per interval ``low <= rank < high + 1`` (an expected rank between two
    integers falls in the interval of its integer part); the default intervals are the
    supplement's (``"1", "2-5", "6-20", "21-100", "101-200", ">200"``).

    Args:
        bins: ascending, non-overlapping ``(low, high)`` pairs, ``high=None`` for no upper end.
            Ranks falling in no interval are not counted.

    Returns:
        ``{label: count}`` in the order of ``bins``.
    """
    ranks = np.asarray(ranks)
    if ranks.ndim != 1 or not np.issubdtype(ranks.dtype, np.number):
        raise ValueError(f"ranks must be a 1-D array of numbers, got shape {ranks.shape} dtype {ranks.dtype}")
    if ranks.size and ranks.min() < 1:
        raise ValueError(f"ranks must be 1-based (>= 1), got a minimum of {ranks.min()}")
    previous_high = 0
    counts: dict[str, int] = {}
    for low, high in bins:
        if low <= previous_high or (high is not None and high < low):
            raise ValueError(f"bins must be ascending, non-overlapping intervals of ranks >= 1, got {bins}")
        inside = ranks >= low if high is None else (ranks >= low) & (ranks < high + 1)
        counts[_bin_label(low, high)] = int(np.count_nonzero(inside))
        previous_high = np.inf if high is None else high
    return counts
