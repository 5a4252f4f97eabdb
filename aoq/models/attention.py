"""Pieces shared by the cross-attention scores (:mod:`aoq.models.scan`, :mod:`aoq.models.bfan`).

Layout (docs/models.md, "Cross-attention models"): ``images`` (B, R, D) region features with
``region_counts`` (B,) valid regions each (None: all R), ``captions`` (C, L, D) word features
with ``lengths`` (C,) valid words each. Every pair (b, c) is scored at once through the
(B, C, R, L) tensor of region-word dot products ``s[b, c, r, l] = <v_br, e_cl>``; padded regions
and words are replaced by zeros before any arithmetic and masked out of every norm, softmax, sum
and mean, so whatever the padding holds (NaN, 1e30) never changes a score.

An attended vector ``a = sum_j w_j x_j`` is never formed: its dot product with the query
fragment is ``sum_j w_j s_j`` and its squared norm ``w^T G w`` with ``G`` the Gram matrix of the
context fragments, so memory stays O(B C R L) instead of O(B C R L D) and equals the public
code's cosine to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: The epsilon of the public SCAN/BFAN code: added to an L2 norm (``x / (||x|| + EPS)``) and the
#: lower clamp of the product of norms in a cosine (``<x, y> / max(||x|| ||y||, EPS)``).
EPS = 1e-8
#: Slope of the leaky ReLU of the ``clipped_*`` attention norms (public code: ``LeakyReLU(0.1)``).
LEAKY_SLOPE = 0.1


def valid_mask(counts: Tensor | None, rows: int, size: int, device: torch.device) -> Tensor:
    """(rows, size) bool mask of the first ``counts[i]`` positions of row i (all when None).

    Raises:
        ValueError: a count outside 1..size (a caption or an image needs a fragment).
    """
    if counts is None:
        return torch.ones(rows, size, dtype=torch.bool, device=device)
    counts = torch.as_tensor(counts, device=device).long()
    if counts.shape != (rows,):
        raise ValueError(f"expected {rows} counts, got shape {tuple(counts.shape)}")
    if rows and (int(counts.min()) < 1 or int(counts.max()) > size):
        raise ValueError(f"fragment counts must lie in 1..{size}, got {counts.min()}..{counts.max()}")
    return torch.arange(size, device=device).unsqueeze(0) < counts.unsqueeze(1)


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` (N, T, D) with the fragments outside ``mask`` (N, T) replaced by zeros, so junk
    padding (NaN, inf) cannot reach any product."""
    return torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))


def safe_sqrt(x: Tensor) -> Tensor:
    """``sqrt(max(x, 0))`` with a finite gradient at 0 (zero): padded fragments are all-zero and
    a plain ``sqrt`` would send NaN gradients to every feature through them."""
    positive = x > 0
    return torch.where(positive, x, torch.ones_like(x)).sqrt() * positive


def l2norm(x: Tensor, dim: int) -> Tensor:
    """``x / (||x||_2 + EPS)`` along ``dim`` (the public code's ``l2norm``; torch's norm has a zero
    gradient at a zero vector, so all-zero padding sends no NaN back)."""
    return x / (torch.linalg.vector_norm(x, dim=dim, keepdim=True) + EPS)


def masked_softmax(x: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Softmax along ``dim`` over the entries where ``mask`` (broadcastable) is True; the others
    get weight 0. Each softmax must have at least one valid entry."""
    return torch.softmax(x.masked_fill(~mask, float("-inf")), dim=dim)


def normalise_attention(s: Tensor, query_mask: Tensor, norm: str, query_dim: int) -> Tensor:
    """The first attention normalisation (SCAN eq. 1 ``raw_feature_norm``), over the query axis.

    ``clipped_l2norm``: ``[s]_+ / sqrt(sum_q [s]_+^2)`` with ``[x]_+`` the leaky ReLU (0.1) and
    the sum over the valid query fragments (EPS added to the norm); ``softmax``: a softmax over
    the valid query fragments. The public code runs both over the *query* axis (the words for
    t2i, the regions for i2t), for every context fragment.

    Raises:
        ValueError: an unknown norm.
    """
    if norm == "clipped_l2norm":
        # padded fragments are zero vectors, so their products and leaky ReLUs are exactly 0 and
        # drop out of the norm without a mask
        return l2norm(F.leaky_relu(s, LEAKY_SLOPE), dim=query_dim)
    if norm == "softmax":
        return masked_softmax(s, query_mask, dim=query_dim)
    raise ValueError(f"unknown attention norm {norm!r} (clipped_l2norm or softmax)")


def _gram_product(weights: Tensor, gram: Tensor) -> Tensor:
    """``weights @ gram`` for (P, C, Q, S) weights and a (P, 1, S, S) or (1, C, S, S) Gram matrix,
    as one batched product per Gram matrix: a plain broadcast ``@`` would first copy the Gram
    matrix to every (p, c) pair, a (P, C, S, S) temporary larger than the scores themselves."""
    if weights.ndim != 4 or gram.shape[:2] == weights.shape[:2]:
        return weights @ gram
    p, c, q, s = weights.shape
    if gram.shape[1] == 1:
        return (weights.reshape(p, c * q, s) @ gram[:, 0]).reshape(p, c, q, s)
    out = weights.transpose(0, 1).reshape(c, p * q, s) @ gram[0]
    return out.reshape(c, p, q, s).transpose(0, 1)


def attended_cosine(weights: Tensor, s: Tensor, gram: Tensor, query_sq: Tensor) -> Tensor:
    """Cosine between each query fragment and its attended context vector ``a = sum_j w_j x_j``.

    Args:
        weights: (..., Q, S) attention of each query fragment over the context fragments.
        s: (..., Q, S) query-context dot products.
        gram: (..., S, S) context Gram matrix (broadcastable to the batch of ``weights``).
        query_sq: (..., Q) squared norms of the query fragments.

    Returns:
        (..., Q) ``<q, a> / max(||q|| ||a||, EPS)``, the public code's ``cosine_similarity``
        without its final ``squeeze`` (which breaks a one-fragment axis).
    """
    dot = (weights * s).sum(-1)
    a_sq = (_gram_product(weights, gram) * weights).sum(-1)
    return dot / (safe_sqrt(query_sq) * safe_sqrt(a_sq)).clamp(min=EPS)


def aggregate(r: Tensor, mask: Tensor, agg: str, lambda_lse: float) -> Tensor:
    """Pool the per-fragment cosines ``r`` (..., Q) over the valid fragments (``mask``).

    ``LogSumExp``: ``log(sum_q exp(lambda_lse r_q)) / lambda_lse`` (SCAN eq. 6/10);
    ``Mean``: ``mean_q r_q`` (SCAN eq. 7).

    Raises:
        ValueError: an unknown aggregation.
    """
    if agg == "LogSumExp":
        return torch.logsumexp((lambda_lse * r).masked_fill(~mask, float("-inf")), dim=-1) / lambda_lse
    if agg == "Mean":
        return torch.where(mask, r, torch.zeros((), dtype=r.dtype, device=r.device)).sum(-1) / mask.sum(-1)
    raise ValueError(f"unknown aggregation {agg!r} (LogSumExp or Mean)")


#: an image's terms that no caption changes: its regions' Gram matrix (B, R, R) and squared norms
#: (B, R). A re-ranker's gallery stores them (:func:`region_stats`), so a query skips the
#: largest passes of its scoring.
RegionStats = tuple[Tensor, Tensor]


def region_stats(regions: Tensor) -> RegionStats:
    """The :data:`RegionStats` of (B, R, D) regions (all valid), as :class:`Fragments` computes them."""
    return regions @ regions.transpose(1, 2), regions.pow(2).sum(-1)


class Fragments:
    """The masked, zero-padded inputs of a batch of pairs and their pairwise products.

    Every (image b, caption c) pair (B x C pairs, ``aligned`` False), or the B pairs (image b,
    caption b) (``aligned`` True, B = C; the caption axis below then has size 1 and the captions
    run along the image axis).

    Attributes:
        s: (B, C, R, L) region-word dot products (C = 1 when aligned).
        region_valid: (B, 1, R) valid regions; word_valid: (1, C, L), aligned (B, 1, L) valid words.
        region_gram: (B, 1, R, R); word_gram: (1, C, L, L), aligned (B, 1, L, L).
        region_sq: (B, 1, R); word_sq: like word_valid, squared norms.
        pair_region_mask: (B, 1, R, 1); pair_word_mask: (1, C, 1, L) (aligned (B, 1, 1, L)), for
            broadcasting over s.

    ``stats``: the images' precomputed :data:`RegionStats` (no ``region_counts`` then).
    """

    def __init__(self, images: Tensor, region_counts: Tensor | None, captions: Tensor, lengths: Tensor,
                 aligned: bool = False, stats: RegionStats | None = None) -> None:
        if images.ndim != 3 or captions.ndim != 3 or images.shape[-1] != captions.shape[-1]:
            raise ValueError(f"expected images (B, R, D) and captions (C, L, D), got {tuple(images.shape)} "
                             f"and {tuple(captions.shape)}")
        if aligned and images.shape[0] != captions.shape[0]:
            raise ValueError(f"aligned pairs need as many captions as images, got {captions.shape[0]} "
                             f"and {images.shape[0]}")
        device = images.device
        region_mask = valid_mask(region_counts, images.shape[0], images.shape[1], device)
        word_mask = valid_mask(lengths, captions.shape[0], captions.shape[1], device)
        if stats is not None and region_counts is not None:
            raise ValueError("precomputed region stats are for images whose every region is valid (no counts)")
        # every region is valid when stats are given: nothing to zero, and no copy of the (B, R, D) input
        v = images if stats is not None else zero_padding(images, region_mask)
        e = zero_padding(captions, word_mask)
        caption_axis = 1 if aligned else 0
        self.s = (torch.einsum("brd,bld->brl", v, e).unsqueeze(1) if aligned
                  else torch.einsum("brd,cld->bcrl", v, e))
        self.region_valid = region_mask.unsqueeze(1)
        self.word_valid = word_mask.unsqueeze(caption_axis)
        gram, sq = stats if stats is not None else region_stats(v)
        self.region_gram = gram.unsqueeze(1)
        self.word_gram = (e @ e.transpose(1, 2)).unsqueeze(caption_axis)
        self.region_sq = sq.unsqueeze(1)
        self.word_sq = e.pow(2).sum(-1).unsqueeze(caption_axis)
        self.pair_region_mask = self.region_valid.unsqueeze(-1)
        self.pair_word_mask = self.word_valid.unsqueeze(-2)


def word_attention(f: Fragments, norm: str, lambda_softmax: float) -> Tensor:
    """(B, C, L, R) attention of each word over the regions (t2i; SCAN eqs. 1-2): the first norm
    over the words for each region, then a softmax over the regions at ``lambda_softmax``."""
    first = normalise_attention(f.s, f.pair_word_mask, norm, query_dim=-1)
    return masked_softmax(lambda_softmax * first, f.pair_region_mask, dim=-2).transpose(-1, -2)


def region_attention(f: Fragments, norm: str, lambda_softmax: float) -> Tensor:
    """(B, C, R, L) attention of each region over the words (i2t): the first norm over the regions
    for each word, then a softmax over the words at ``lambda_softmax``."""
    first = normalise_attention(f.s, f.pair_region_mask, norm, query_dim=-2)
    return masked_softmax(lambda_softmax * first, f.pair_word_mask, dim=-1)


def word_cosines(f: Fragments, attention: Tensor) -> Tensor:
    """(B, C, L) cosine of each word with its attended region vector (``attention`` (B, C, L, R))."""
    return attended_cosine(attention, f.s.transpose(-1, -2), f.region_gram, f.word_sq)


def region_cosines(f: Fragments, attention: Tensor) -> Tensor:
    """(B, C, R) cosine of each region with its attended word vector (``attention`` (B, C, R, L))."""
    return attended_cosine(attention, f.s, f.word_gram, f.region_sq)
