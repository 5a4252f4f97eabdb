"""BFAN: Bidirectional Focal Attention (Liu et al., ACM MM 2019), as its public code scores a pair.

For one direction (queries ``q_i``, context fragments ``x_1..x_S``; t2i: the words attend to the
regions, i2t: the regions to the words):

- pre-assigned attention (SCAN's ``clipped_l2norm`` then a softmax): ``alpha_ij`` with
  ``sum_j alpha_ij = 1``, at ``lambda_softmax`` (20 in the published runs);
- eq. 3, focal function ``F(alpha_ij) = sum_k (alpha_ij - alpha_ik) g(alpha_ik)``, with
  ``equal``: ``g = 1`` (``F = S alpha_ij - sum_k alpha_ik``) or ``prob``: ``g(x) = sqrt(x)``;
- eq. 4: ``H(alpha_ij) = 1`` if ``F(alpha_ij) > 0`` (strictly, as the public code), else 0;
- eq. 5: ``alpha'_ij = H_ij alpha_ij / sum_k H_ik alpha_ik``; ``a_i = sum_j alpha'_ij x_j``;
- ``R_i = cos(q_i, a_i)``; the direction's score is ``mean_i R_i``.

The pair's score adds both directions: ``S = S_t2i + S_i2t``. The paper's BFAN row averages the
scores of an ``equal`` and a ``prob`` model (:func:`ensemble_scores`).

Where the public code fails: when no fragment passes the threshold (every ``F <= 0``, which is
exact when a query has one context fragment: the i2t direction of a one-word caption, or all
attention weights equal) it divides 0 by 0 and the score is NaN. Here such a query keeps its
pre-assigned attention (``H = 1`` for all fragments): with one fragment that is the fragment
itself, the only attention there is.

The ``prob`` focal function is computed as ``alpha_ij sum_k sqrt(alpha_ik) - sum_k alpha_ik^1.5``;
it equals the public code's pairwise sum to rounding, so only an exact tie (``F = 0`` up to
rounding, e.g. equal weights over several fragments) can fall on the other side of the threshold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aoq.models.attention import (
    Fragments,
    RegionStats,
    aggregate,
    region_attention,
    region_cosines,
    word_attention,
    word_cosines,
)

#: The focal functions ``g`` of eq. 3.
FOCAL_TYPES = ("equal", "prob")
#: The published temperature of the pre-assigned attention.
BFAN_LAMBDA_SOFTMAX = 20.0


def focal_indicator(alpha: Tensor, source_mask: Tensor, focal: str) -> Tensor:
    """``H`` (eq. 4) of attention ``alpha`` (..., Q, S) over the valid sources ``source_mask``
    (broadcastable): True where the focal function (eq. 3) is strictly positive.

    ``alpha`` is 0 on the invalid sources (a masked softmax), so they add nothing to the sums and
    their ``F`` is negative: they are never kept. ``H`` is a step function: no gradient.

    Raises:
        ValueError: an unknown focal type.
    """
    with torch.no_grad():
        if focal == "equal":
            f = alpha * source_mask.sum(-1, keepdim=True) - alpha.sum(-1, keepdim=True)
        elif focal == "prob":
            root = alpha.sqrt()
            f = alpha * root.sum(-1, keepdim=True) - (alpha * root).sum(-1, keepdim=True)
        else:
            raise ValueError(f"unknown focal type {focal!r} ({' or '.join(FOCAL_TYPES)})")
        return f > 0


def focal_attention(alpha: Tensor, source_mask: Tensor, focal: str) -> Tensor:
    """Eq. 5: the re-assigned attention; a query with no fragment above the threshold keeps
    ``alpha`` (the public code's 0/0, defined in the module docstring)."""
    kept = alpha * focal_indicator(alpha, source_mask, focal)  # alpha is finite: the product is a mask
    total = kept.sum(-1, keepdim=True)
    some = total > 0
    return torch.where(some, kept / torch.where(some, total, torch.ones_like(total)), alpha)


def bfan_scores(images: Tensor, region_counts: Tensor | None, captions: Tensor, lengths: Tensor,
                focal: str = "equal", lambda_softmax: float = BFAN_LAMBDA_SOFTMAX, aligned: bool = False,
                stats: RegionStats | None = None) -> Tensor:
    """The BFAN score (both directions summed) of every (image, caption) pair.

    Args:
        images: (B, R, D) region features (padding beyond ``region_counts`` is never read).
        region_counts: (B,) valid regions per image, or None (all R).
        captions: (C, L, D) word features (padding beyond ``lengths`` is never read).
        lengths: (C,) words per caption, 1..L.
        focal: ``equal`` or ``prob`` (eq. 3).
        lambda_softmax: temperature of the pre-assigned attention.
        aligned: score only the pairs (image b, caption b) (B = C).
        stats: the images' precomputed region terms (:func:`aoq.models.attention.region_stats`).

    Returns:
        (B, C) scores, rows images and columns captions (the layout of :mod:`aoq.metrics`);
        aligned: the (B,) diagonal.
    """
    if focal not in FOCAL_TYPES:
        raise ValueError(f"unknown focal type {focal!r} ({' or '.join(FOCAL_TYPES)})")
    f = Fragments(images, region_counts, captions, lengths, aligned, stats)
    words = focal_attention(word_attention(f, "clipped_l2norm", lambda_softmax),
                            f.region_valid.unsqueeze(-2), focal)
    regions = focal_attention(region_attention(f, "clipped_l2norm", lambda_softmax),
                              f.pair_word_mask, focal)
    t2i = aggregate(word_cosines(f, words), f.word_valid, "Mean", 0.0)
    i2t = aggregate(region_cosines(f, regions), f.region_valid, "Mean", 0.0)
    scores = t2i + i2t
    return scores[:, 0] if aligned else scores


def ensemble_scores(scores: list[Tensor]) -> Tensor:
    """The average of several models' (B, C) score matrices (the paper's BFAN row: equal + prob).

    Raises:
        ValueError: no scores, or matrices of different shapes.
    """
    if not scores or any(s.shape != scores[0].shape for s in scores):
        raise ValueError(f"need score matrices of one shape, got {[tuple(s.shape) for s in scores]}")
    return torch.stack(scores).mean(0)
