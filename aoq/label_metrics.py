"""Label-wise retrieval metrics: mAP@R and NDCG@k with relevance = shared labels, both
directions, vectorised in query blocks (docs/evaluation.md, Label-wise evaluation)."""

from __future__ import annotations

import numpy as np

from aoq.data.dataset import SplitData, split_targets
from aoq.ranks import (  # one memory bound and one layout check
    BLOCK_ELEMENTS,
    check_layout,
)

# Relevance of a gallery item x to a query q is the number of labels they share,
# ``rel(q, x) = |L(q) & L(x)|`` (captions carry their image's labels). Ties in the scores are
# averaged over every order of the tied items (the expected value under a uniformly random
# tie-break), so constant scores give the chance value. See docs/evaluation.md.


def shared_label_counts(query_labels: np.ndarray, gallery_labels: np.ndarray) -> np.ndarray:
    """``rel[q, x]`` = number of labels shared by query q and gallery item x, from multi-hot rows."""
    query_labels, gallery_labels = np.asarray(query_labels), np.asarray(gallery_labels)
    if query_labels.ndim != 2 or gallery_labels.ndim != 2 or query_labels.shape[1] != gallery_labels.shape[1]:
        raise ValueError(
            f"label matrices must be (n, L) with the same L, got {query_labels.shape} and {gallery_labels.shape}"
        )
    return query_labels.astype(np.float64) @ gallery_labels.astype(np.float64).T


def _tie_groups(sorted_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows of descending scores: a global group id per cell and each cell's group start column."""
    new_group = np.ones(sorted_scores.shape, dtype=bool)
    new_group[:, 1:] = sorted_scores[:, 1:] != sorted_scores[:, :-1]
    group = np.cumsum(new_group.ravel()).reshape(sorted_scores.shape) - 1
    columns = np.broadcast_to(np.arange(sorted_scores.shape[1]), sorted_scores.shape)
    start = np.maximum.accumulate(np.where(new_group, columns, 0), axis=1)
    return group, start


def _group_mean(values: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell: the mean, the sum and the size of its tie group's ``values``."""
    flat = group.ravel()
    sums = np.bincount(flat, weights=values.ravel())
    sizes = np.bincount(flat).astype(np.float64)
    return (sums / sizes)[group], sums[group], sizes[group]


def _label_block(scores: np.ndarray, relevance: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """NDCG@k and AP@R of each row (NaN where undefined: no relevant item)."""
    n = scores.shape[1]
    order = np.argsort(-scores, axis=1, kind="stable")
    sorted_scores = np.take_along_axis(scores, order, axis=1)
    rel = np.take_along_axis(relevance, order, axis=1)
    group, start = _tie_groups(sorted_scores)
    positions = np.arange(n)

    # NDCG@k: a random order of a tie group puts the group's mean gain at each of its positions.
    depth = min(k, n)
    discount = 1.0 / np.log2(positions[:depth] + 2.0)
    mean_gain = _group_mean(rel, group)[0]
    dcg = mean_gain[:, :depth] @ discount
    ideal = -np.sort(-relevance, axis=1)[:, :depth] @ discount
    with np.errstate(invalid="ignore", divide="ignore"):
        ndcg = np.where(ideal > 0, dcg / ideal, np.nan)

    # AP@R with binary relevance b = rel > 0 and R = number of relevant items:
    # AP@R = (1/R) sum_{i <= R} b_i * (b_1 + ... + b_i) / i. Under random tie orders, for a cell
    # at position i of a group G of size g holding m relevant items, starting at s_G:
    # E[b_i (b_1 + ... + b_i)] = p (1 + before_G) + (i - s_G) * m (m - 1) / (g (g - 1)),
    # with p = m / g and before_G the relevant items of the groups ranked above G.
    binary = (rel > 0).astype(np.float64)
    p, m, g = _group_mean(binary, group)
    exclusive = np.cumsum(binary, axis=1) - binary
    before = np.take_along_axis(exclusive, start, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        pair = np.where(g > 1, m * (m - 1) / (g * (g - 1)), 0.0)
    expected = p * (1.0 + before) + (positions - start) * pair
    r = binary.sum(axis=1)
    inside = positions[None, :] < r[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        ap = np.where(r > 0, (expected / (positions + 1.0) * inside).sum(axis=1) / r, np.nan)
    return ndcg, ap


def label_ranking_metrics(scores: np.ndarray, relevance: np.ndarray, k: int = 10) -> dict[str, float]:
    """mAP@R and NDCG@k of one retrieval direction, queries in rows.

    Args:
        scores: (n_queries, n_gallery) similarity scores.
        relevance: same shape, graded relevance ``rel >= 0`` (:func:`shared_label_counts`).
        k: NDCG cut-off.

    Definitions (per query; ties averaged over tie orders, see the section comment):

    * ``NDCG@k = DCG@k / IDCG@k`` with ``DCG@k = sum_{i=1..k} rel_i / log2(i + 1)`` over the
      ranked gallery and ``IDCG@k`` the same sum for the gallery sorted by relevance;
    * ``AP@R = (1/R) sum_{i=1..R} b_i * precision@i`` with ``b_i = [rel_i > 0]`` and ``R`` the
      number of items with ``rel > 0`` (Musgrave et al.'s mAP@R).

    Returns:
        ``{"map_at_r": ..., "ndcg_at_<k>": ..., "queries": n}``: means over the ``n`` queries
        with at least one relevant item (the others have neither metric), as fractions in [0, 1].
        The means are NaN when no query has a relevant item.
    """
    scores, relevance = np.asarray(scores, dtype=np.float64), np.asarray(relevance, dtype=np.float64)
    if scores.ndim != 2 or scores.shape != relevance.shape:
        raise ValueError(f"scores and relevance must be 2-D of the same shape, got {scores.shape} and {relevance.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or infinite values")
    if (relevance < 0).any():
        raise ValueError("relevance must be >= 0")
    rows_per_block = max(1, BLOCK_ELEMENTS // (8 * max(1, scores.shape[1])))
    ndcg_parts, ap_parts = [], []
    for lo in range(0, scores.shape[0], rows_per_block):
        ndcg, ap = _label_block(scores[lo : lo + rows_per_block], relevance[lo : lo + rows_per_block], k)
        ndcg_parts.append(ndcg)
        ap_parts.append(ap)
    ndcg, ap = np.concatenate(ndcg_parts), np.concatenate(ap_parts)
    valid = ~np.isnan(ap)
    mean = (lambda x: float(np.mean(x[valid]))) if valid.any() else (lambda x: float("nan"))
    return {"map_at_r": mean(ap), f"ndcg_at_{k}": mean(ndcg), "queries": int(valid.sum())}


def label_metrics(
    img_emb: np.ndarray, cap_emb: np.ndarray, image_labels: np.ndarray, captions_per_image: int = 5,
    k: int = 10,
) -> dict:
    """Label-wise retrieval metrics in both directions from embeddings and per-image labels.

    Args:
        img_emb / cap_emb: (n_images, d) and (n_captions, d) embeddings (scores = dot products).
        image_labels: (n_images, L) multi-hot labels; caption c carries the labels of image
            ``c // captions_per_image``.

    Returns:
        ``{"i2t": {...}, "t2i": {...}, "k": k, "relevance": "shared_labels"}`` with the
        :func:`label_ranking_metrics` of image queries over captions and caption queries over images.
    """
    img_emb, cap_emb = np.asarray(img_emb), np.asarray(cap_emb)
    image_labels = np.asarray(image_labels)
    check_layout(img_emb.shape[0], cap_emb.shape[0], captions_per_image, what="embeddings")
    if image_labels.shape[0] != img_emb.shape[0]:
        raise ValueError(f"{image_labels.shape[0]} label rows for {img_emb.shape[0]} images")
    scores = img_emb.astype(np.float64) @ cap_emb.astype(np.float64).T
    return label_metrics_of_scores(scores, scores.T, image_labels, captions_per_image, k)


def label_metrics_of_scores(i2t_scores: np.ndarray, t2i_scores: np.ndarray, image_labels: np.ndarray,
                            captions_per_image: int = 5, k: int = 10) -> dict:
    """:func:`label_metrics` from each direction's own scores: ``i2t_scores`` (n_images, n_captions)
    and ``t2i_scores`` (n_captions, n_images), queries in rows (a query-side normalisation such as
    :mod:`aoq.hubness` makes them differ)."""
    caption_labels = np.repeat(image_labels, captions_per_image, axis=0)
    relevance = shared_label_counts(image_labels, caption_labels)
    return {
        "i2t": label_ranking_metrics(i2t_scores, relevance, k),
        "t2i": label_ranking_metrics(t2i_scores, relevance.T, k),
        "k": k,
        "relevance": "shared_labels",
    }


def split_label_metrics(i2t_scores: np.ndarray, t2i_scores: np.ndarray, split: SplitData, k: int = 10) -> dict:
    """:func:`label_metrics_of_scores` of a labelled split (its own label vocabulary), with
    ``n_labels``.

    Raises:
        DataError: the split has no labels.
    """
    targets = split_targets(split)
    return {**label_metrics_of_scores(i2t_scores, t2i_scores, targets, split.captions_per_image, k),
            "n_labels": int(targets.shape[1])}


def label_metrics_folds(
    img_emb: np.ndarray, cap_emb: np.ndarray, image_labels: np.ndarray, captions_per_image: int = 5,
    k: int = 10, *, fold_images: int = 1000, n_folds: int = 5,
) -> dict:
    """:func:`label_metrics` under the COCO 1K protocol: the mean over ``n_folds`` consecutive folds
    of ``fold_images`` images (and their captions) of each metric, ``queries`` summed.

    On a 5,000-image split this is 5x cheaper than the whole split at once (each fold ranks a
    fifth of the gallery for a fifth of the queries), and it ranks against the same galleries as
    the 1K recalls.

    Raises:
        ValueError: fewer than ``n_folds * fold_images`` images, or :func:`label_metrics`'s errors.
    """
    img_emb, cap_emb, image_labels = np.asarray(img_emb), np.asarray(cap_emb), np.asarray(image_labels)
    if img_emb.shape[0] < fold_images * n_folds:
        raise ValueError(f"{n_folds} folds of {fold_images} images need {fold_images * n_folds} images, "
                         f"got {img_emb.shape[0]}")
    folds = []
    for f in range(n_folds):
        lo, hi = f * fold_images, (f + 1) * fold_images
        folds.append(label_metrics(img_emb[lo:hi], cap_emb[lo * captions_per_image : hi * captions_per_image],
                                   image_labels[lo:hi], captions_per_image, k))
    out: dict = {"k": k, "relevance": "shared_labels", "folds": n_folds, "fold_images": fold_images}
    for direction in ("i2t", "t2i"):
        keys = [key for key in folds[0][direction] if key != "queries"]
        out[direction] = {key: float(np.mean([fold[direction][key] for fold in folds])) for key in keys}
        out[direction]["queries"] = int(sum(fold[direction]["queries"] for fold in folds))
    return out
