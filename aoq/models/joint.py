"""The matching model: an image encoder and a caption encoder into one joint space.

``S(image, caption)`` is the dot product of the two L2-normalised embeddings (cosine), so the
embeddings can be indexed with FAISS inner-product indexes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from aoq.config import ModelConfig
from aoq.data.vocab import Vocabulary
from aoq.names import CROSS_ATTENTION_ENCODERS
from aoq.models.image import (
    ConvImageEncoder,
    ResNetImageEncoder,
    VSEImageEncoder,
    VSRNImageEncoder,
)
from aoq.models.text import TextEncoder


class JointModel(nn.Module):
    """Image encoder + text encoder.

    Attributes:
        image_input: ``"features"`` (precomputed region/global features, vse and vsrn) or
            ``"pixels"`` (raw images, cnn): what :meth:`encode_images` expects.
        img_dim: the feature size the image encoder was built for (None for pixel models).
        embed_dim: the joint-space size.
        resnet_arch: the torchvision ResNet depth of a ResNet-backed ``cnn`` model, else None.
        label_head: a linear classifier from the joint space to ``n_labels`` label logits, shared
            by both modalities, present only for models trained with ``train.label_lambda > 0``
            (retrieval never uses it).

    ``pairwise`` (a class attribute): False here, True for models whose scores need both inputs
    at once (:class:`aoq.models.cross.CrossAttentionModel`), which have no embedding to index.

    The weights of frozen pretrained backbones are left out of :meth:`state_dict` (they come from
    their packages; :meth:`backbone_identities` names them), so checkpoints and trainer states
    hold only what training changed.
    """

    pairwise = False

    def __init__(
        self,
        image_encoder: nn.Module,
        text_encoder: nn.Module,
        image_input: str,
        img_dim: int | None,
        embed_dim: int,
        resnet_arch: str | None = None,
        label_head: nn.Linear | None = None,
    ) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.image_input = image_input
        self.img_dim = img_dim
        self.embed_dim = embed_dim
        self.resnet_arch = resnet_arch
        self.label_head = label_head

    @property
    def n_labels(self) -> int | None:
        """Size of the label vocabulary of :attr:`label_head`, None without one."""
        return None if self.label_head is None else self.label_head.out_features

    def _encoders(self) -> Iterable[tuple[str, nn.Module]]:
        return (("image", self.image_encoder), ("text", self.text_encoder))

    def backbone_identities(self) -> dict[str, dict[str, str]]:
        """``{"image"|"text": BackboneIdentity.to_dict()}`` for the encoders with a pretrained backbone."""
        return {name: enc.identity.to_dict() for name, enc in self._encoders() if hasattr(enc, "identity")}

    def packaged_state_keys(self) -> set[str]:
        """State keys of frozen pretrained backbone weights (read from packages, never saved)."""
        keys: set[str] = set()
        for name, enc in self._encoders():
            if hasattr(enc, "frozen_state_keys"):
                keys |= {f"{name}_encoder.{k}" for k in enc.frozen_state_keys()}
        return keys

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        for key in self.packaged_state_keys():
            state.pop(prefix + key, None)
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load trained weights; frozen backbone weights may be absent (they come from packages)."""
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        packaged = self.packaged_state_keys()
        missing = [k for k in result.missing_keys if k not in packaged]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"state does not fit the model: missing {missing[:5]}, "
                               f"unexpected {list(result.unexpected_keys)[:5]}")
        return result

    def encode_images(self, images: Tensor) -> Tensor:
        """(B, R, D) / (B, D) features or (B, 3, H, W) pixels -> (B, d), unit L2 norm."""
        return self.image_encoder(images)

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, T) padded token ids and (B,) lengths -> (B, d), unit L2 norm."""
        return self.text_encoder(tokens, lengths)

    def pair_scores(self, img: Tensor, cap: Tensor, lengths: Tensor) -> Tensor:
        """(B, C) scores of every pair of B encoded images and C encoded captions: the cosines
        ``img @ cap.T`` (``lengths``, the captions' word counts, matter to cross-attention
        models only, :class:`aoq.models.cross.CrossAttentionModel`)."""
        return img @ cap.T

    def aligned_scores(self, img: Tensor, cap: Tensor, lengths: Tensor) -> Tensor:
        """(B,) scores of the pairs (image b, caption b): the row-wise dot products."""
        return (img * cap).sum(dim=1)

    def forward(self, images: Tensor, tokens: Tensor, lengths: Tensor, groups: int = 1) -> tuple[Tensor, Tensor]:
        """Both modalities' embeddings. The rows may stack ``groups`` equal groups (round 2: the
        positives, the offline negatives, the derived items): an encoder that normalises with
        the statistics of its input batch then sees each group on its own, so positives are never
        normalised with negatives (under torchrun too, where DDP syncs gradients only through
        this one call); any other encoder gets one call over all rows, which is exact."""
        batch = images.shape[0] // groups
        return (encode_groups(self.image_encoder, lambda rows: self.encode_images(images[rows]), batch, groups),
                encode_groups(self.text_encoder, lambda rows: self.encode_texts(tokens[rows], lengths[rows]),
                              batch, groups))


def uses_batch_statistics(module: nn.Module) -> bool:
    """Whether a BatchNorm layer of ``module`` normalises with the statistics of its input batch
    in the current mode (train mode, or a layer without running statistics), as torch decides."""
    return any(
        isinstance(m, _BatchNorm) and (m.training or (m.running_mean is None and m.running_var is None))
        for m in module.modules()
    )


def encode_groups(module: nn.Module, encode: Callable[[slice], Tensor], batch: int, groups: int) -> Tensor:
    """The (groups x batch, d) embeddings of stacked groups: one ``encode(rows)`` call per group
    when ``module`` (the encoder behind ``encode``) uses batch statistics in its current mode, one
    call over all the rows otherwise. Each call updates the running statistics once."""
    if groups > 1 and uses_batch_statistics(module):
        return torch.cat([encode(slice(g * batch, (g + 1) * batch)) for g in range(groups)])
    return encode(slice(0, groups * batch))


def _text_encoder(model_cfg: ModelConfig, vocab_size: int) -> nn.Module:
    if model_cfg.text_encoder == "minilm":
        from aoq.models.pretrained import (
            MiniLMTextEncoder,  # imports transformers: only when asked
        )

        return MiniLMTextEncoder(model_cfg.embed_dim, model_cfg.text_finetune_layers, model_cfg.projection)
    return TextEncoder(
        vocab_size,
        model_cfg.word_dim,
        model_cfg.embed_dim,
        num_layers=model_cfg.text_layers,
        bidirectional=model_cfg.bidirectional,
    )


def text_vocabulary(model_cfg: ModelConfig, captions: Iterable[str], threshold: int) -> Any:
    """What turns captions into token ids for this model: a :class:`Vocabulary` built from the
    training captions (gru), or the pretrained WordPiece tokenizer (minilm, covers every word)."""
    if model_cfg.text_encoder == "minilm":
        from aoq.models.pretrained import WordPieceVocab

        return WordPieceVocab()
    return Vocabulary.build(captions, threshold)


def vocabulary_from_dict(data: Any, source: str) -> Any:
    """Rebuild a saved vocabulary of either kind (see :func:`text_vocabulary`).

    Raises:
        ArtefactError: a damaged vocabulary, or a tokenizer other than the installed one.
    """
    if isinstance(data, dict) and data.get("kind") == "aoq-wordpiece":
        from aoq.models.pretrained import WordPieceVocab

        return WordPieceVocab.from_dict(data, source)
    return Vocabulary.from_dict(data, source)


def build_model(
    model_cfg: ModelConfig,
    vocab_size: int,
    img_dim: int | None,
    *,
    resnet_arch: str | None = None,
    n_labels: int | None = None,
) -> JointModel:
    """Build a freshly initialised model from its configuration.

    Pretrained backbones (``effnet_lite0``, ``minilm``) are loaded from their packages; only the
    projection heads (and any fine-tuned top units) start fresh.

    Args:
        model_cfg: the ``model`` section of the run configuration.
        vocab_size: number of word ids (ignored by minilm).
        img_dim: feature size of the precomputed image features (vse, vsrn); ignored for cnn.
        resnet_arch: cnn with ``model.resnet_weights`` only: build this bare ResNet instead of
            reading the weights file (used when a checkpoint supplies every weight).
        n_labels: add a label classifier with this many outputs (``train.label_lambda > 0``),
            built after the encoders so their initial weights do not depend on it.

    Raises:
        ValueError: a feature model without ``img_dim``; labels for a cross-attention model.
        PretrainedPackageError: a pretrained encoder whose package is not installed.
    """
    model = _encoders(model_cfg, vocab_size, img_dim, resnet_arch)
    if n_labels and model_cfg.image_encoder in CROSS_ATTENTION_ENCODERS:
        raise ValueError("train.label_lambda > 0 needs a joint embedding; scan/bfan have none")
    if n_labels:
        model.label_head = nn.Linear(model_cfg.embed_dim, n_labels)
    return model


def _encoders(model_cfg: ModelConfig, vocab_size: int, img_dim: int | None, resnet_arch: str | None) -> JointModel:
    kind, dim = model_cfg.image_encoder, model_cfg.embed_dim
    if kind in ("vse", "vsrn", *CROSS_ATTENTION_ENCODERS) and img_dim is None:
        raise ValueError(f"model.image_encoder={kind!r} needs precomputed features (img_dim): precomp data, "
                         "or data.regions=effnet_lite0 with image files")
    if kind in CROSS_ATTENTION_ENCODERS:
        from aoq.models.cross import CrossAttentionModel  # it subclasses JointModel

        return CrossAttentionModel(model_cfg, vocab_size, img_dim)
    text = _text_encoder(model_cfg, vocab_size)
    if kind == "effnet_lite0":
        from aoq.models.pretrained import EffNetImageEncoder

        image_enc = EffNetImageEncoder(dim, model_cfg.image_finetune_blocks, model_cfg.projection)
        return JointModel(image_enc, text, "pixels", None, dim)
    if kind in ("vse", "vsrn"):
        if kind == "vse":
            image: nn.Module = VSEImageEncoder(img_dim, model_cfg.embed_dim, model_cfg.pooling)
        else:
            image = VSRNImageEncoder(img_dim, model_cfg.embed_dim, model_cfg.gcn_layers)
        return JointModel(image, text, "features", img_dim, dim)
    if model_cfg.resnet_weights is not None or resnet_arch is not None:
        image = ResNetImageEncoder(model_cfg.embed_dim, model_cfg.resnet_weights, arch=resnet_arch)
        return JointModel(image, text, "pixels", None, dim, resnet_arch=image.arch)
    return JointModel(ConvImageEncoder(model_cfg.embed_dim, model_cfg.cnn_width), text, "pixels", None, dim)
