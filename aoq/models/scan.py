"""SCAN: Stacked Cross Attention (Lee et al., ECCV 2018), as its public code scores a pair.

Notation: regions ``v_1..v_k`` of an image, words ``e_1..e_n`` of a caption, ``s_ij = <v_i, e_j>``.

Text-to-image (``t2i``; the words are the queries, the regions the context):

- eq. 1 (first norm, over the *query* axis, for each region i): ``clipped_l2norm``
  ``s'_ij = [s_ij]_+ / (sqrt(sum_j [s_ij]_+^2) + eps)``, ``[x]_+`` the leaky ReLU with slope 0.1;
  or ``softmax`` ``s'_ij = exp(s_ij) / sum_j exp(s_ij)``;
- eq. 2: ``alpha_ij = exp(lambda_softmax s'_ij) / sum_i exp(lambda_softmax s'_ij)`` (over regions);
- eq. 3: ``a_j = sum_i alpha_ij v_i``; eq. 4: ``R(e_j, a_j) = <e_j, a_j> / max(||e_j|| ||a_j||, eps)``;
- eq. 5/6 ``LogSumExp``: ``S = log(sum_j exp(lambda_lse R_j)) / lambda_lse``; eq. 7 ``Mean``:
  ``S = mean_j R_j``.

Image-to-text (``i2t``): the same with the roles swapped (the first norm over the regions for
each word, the softmax over the words, ``R(v_i, a'_i)`` pooled over the regions).

``eps = 1e-8`` (:data:`aoq.models.attention.EPS`). Where the public code fails: its cosine
helper squeezes the word axis of a one-word caption (and the image axis of a one-image batch)
and the pooling then errs; here a one-word caption is scored like any other (``S = R_1`` for
both pools in t2i).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ScanSettings:
    """One SCAN scoring configuration (the public code's ``cross_attn``, ``raw_feature_norm``,
    ``agg_func``, ``lambda_softmax``, ``lambda_lse``)."""

    direction: str = "t2i"
    norm: str = "clipped_l2norm"
    agg: str = "LogSumExp"
    lambda_softmax: float = 9.0
    lambda_lse: float = 6.0

    def __post_init__(self) -> None:
        if self.direction not in ("t2i", "i2t"):
            raise ValueError(f"unknown SCAN direction {self.direction!r} (t2i or i2t)")
        if self.norm not in ("clipped_l2norm", "softmax"):
            raise ValueError(f"unknown attention norm {self.norm!r} (clipped_l2norm or softmax)")
        if self.agg not in ("LogSumExp", "Mean"):
            raise ValueError(f"unknown aggregation {self.agg!r} (LogSumExp or Mean)")


#: The published settings (the public code's README; the paper's Tables 1-2).
SCAN_PRESETS: dict[str, ScanSettings] = {
    "t2i_lse": ScanSettings("t2i", "clipped_l2norm", "LogSumExp", 9.0, 6.0),
    "t2i_avg": ScanSettings("t2i", "clipped_l2norm", "Mean", 9.0),
    "i2t_lse_f30k": ScanSettings("i2t", "clipped_l2norm", "LogSumExp", 4.0, 5.0),
    "i2t_lse_coco": ScanSettings("i2t", "clipped_l2norm", "LogSumExp", 4.0, 20.0),
    "i2t_avg": ScanSettings("i2t", "clipped_l2norm", "Mean", 4.0),
}


def scan_t2i(f: Fragments, settings: ScanSettings) -> Tensor:
    """SCAN t2i (eqs. 1-7, words attend to regions) for every pair: (B, C)."""
    r = word_cosines(f, word_attention(f, settings.norm, settings.lambda_softmax))
    return aggregate(r, f.word_valid, settings.agg, settings.lambda_lse)


def scan_i2t(f: Fragments, settings: ScanSettings) -> Tensor:
    """SCAN i2t (regions attend to words) for every pair: (B, C)."""
    r = region_cosines(f, region_attention(f, settings.norm, settings.lambda_softmax))
    return aggregate(r, f.region_valid, settings.agg, settings.lambda_lse)


def scan_scores(images: Tensor, region_counts: Tensor | None, captions: Tensor, lengths: Tensor,
                settings: ScanSettings, aligned: bool = False, stats: RegionStats | None = None) -> Tensor:
    """The SCAN score of every (image, caption) pair.

    Args:
        images: (B, R, D) region features (padding beyond ``region_counts`` is never read).
        region_counts: (B,) valid regions per image, or None (all R).
        captions: (C, L, D) word features (padding beyond ``lengths`` is never read).
        lengths: (C,) words per caption, 1..L.
        settings: direction, norms and temperatures (:data:`SCAN_PRESETS`).
        aligned: score only the pairs (image b, caption b) (B = C).
        stats: the images' precomputed region terms (:func:`aoq.models.attention.region_stats`).

    Returns:
        (B, C) scores, rows images and columns captions (the layout of :mod:`aoq.metrics`);
        aligned: the (B,) diagonal.
    """
    f = Fragments(images, region_counts, captions, lengths, aligned, stats)
    scores = scan_t2i(f, settings) if settings.direction == "t2i" else scan_i2t(f, settings)
    return scores[:, 0] if aligned else scores
