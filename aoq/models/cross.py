"""The cross-attention matching models (``model.image_encoder`` ``scan`` / ``bfan``).

The encoders produce fragments, not embeddings: one L2-normalised vector per region
(:class:`aoq.models.image.RegionEncoder`) and per word (:class:`aoq.models.text.WordEncoder`,
the bi-GRU's states; or, with ``model.text_encoder=minilm``,
:class:`aoq.models.pretrained.MiniLMWordEncoder`, the frozen MiniLM's token states), and a pair's score comes from :mod:`aoq.models.scan` or
:mod:`aoq.models.bfan` through :meth:`CrossAttentionModel.pair_scores`.
"""

from __future__ import annotations

from torch import Tensor, nn

from aoq.config import ModelConfig
from aoq.models.attention import RegionStats
from aoq.models.bfan import bfan_scores
from aoq.models.image import RegionEncoder
from aoq.models.joint import JointModel
from aoq.models.scan import SCAN_PRESETS, scan_scores
from aoq.models.text import WordEncoder


class CrossAttentionModel(JointModel):
    """Region and word encoders scored by SCAN or BFAN.

    :meth:`encode_images` returns (B, R, d) regions and :meth:`encode_texts` (B, T, d) word
    states (zeros after each caption's length); :meth:`pair_scores` turns them into the (B, C)
    score matrix. ``kind`` is ``scan`` or ``bfan``; ``scan_preset`` / ``bfan_focal`` pick the
    variant (docs/models.md).
    """

    pairwise = True

    def __init__(self, model_cfg: ModelConfig, vocab_size: int, img_dim: int) -> None:
        super().__init__(RegionEncoder(img_dim, model_cfg.embed_dim), _word_encoder(model_cfg, vocab_size),
                         "features", img_dim, model_cfg.embed_dim)
        self.kind = model_cfg.image_encoder
        self.scan_settings = SCAN_PRESETS[model_cfg.scan_preset]
        self.bfan_focal = model_cfg.bfan_focal

    def pair_scores(self, img: Tensor, cap: Tensor, lengths: Tensor, stats: RegionStats | None = None) -> Tensor:
        """(B, C) scores of B encoded images (B, R, d) and C encoded captions (C, T, d) of
        ``lengths`` words; ``stats``: the images' precomputed region terms (a re-ranker's gallery)."""
        lengths = lengths.to(cap.device)
        if self.kind == "scan":
            return scan_scores(img, None, cap, lengths, self.scan_settings, stats=stats)
        return bfan_scores(img, None, cap, lengths, self.bfan_focal, stats=stats)

    def aligned_scores(self, img: Tensor, cap: Tensor, lengths: Tensor) -> Tensor:
        """(B,) scores of the pairs (image b, caption b) of (B, R, d) images and (B, T, d) captions."""
        lengths = lengths.to(cap.device)
        if self.kind == "scan":
            return scan_scores(img, None, cap, lengths, self.scan_settings, aligned=True)
        return bfan_scores(img, None, cap, lengths, self.bfan_focal, aligned=True)


def _word_encoder(model_cfg: ModelConfig, vocab_size: int) -> nn.Module:
    if model_cfg.text_encoder == "minilm":
        from aoq.models.pretrained import MiniLMWordEncoder  # imports transformers: only when asked

        return MiniLMWordEncoder(model_cfg.embed_dim, model_cfg.text_finetune_layers, model_cfg.projection)
    return WordEncoder(vocab_size, model_cfg.word_dim, model_cfg.embed_dim, model_cfg.text_layers,
                       model_cfg.bidirectional)
