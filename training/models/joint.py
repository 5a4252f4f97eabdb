"""The matching model: an image encoder and a caption encoder into one joint space.

``S(image, caption)`` is the dot product of the two L2-normalised embeddings (cosine), so the
embeddings can be indexed with FAISS inner-product indexes.
"""

from __future__ import annotations

from torch import Tensor, nn

from training.config import ModelConfig
from training.models.image import ConvImageEncoder, ResNetImageEncoder, VSEImageEncoder, VSRNImageEncoder
from training.models.text import TextEncoder


class JointModel(nn.Module):
    """Image encoder + text encoder.

    Attributes:
        image_input: ``"features"`` (precomputed region/global features, vse and vsrn) or
            ``"pixels"`` (raw images, cnn): what :meth:`encode_images` expects.
        img_dim: the feature size the image encoder was built for (None for pixel models).
        resnet_arch: the torchvision ResNet depth of a ResNet-backed ``cnn`` model, else None.
        label_head: a linear classifier from the joint space to ``n_labels`` label logits, shared
            by both modalities, present only for models trained with ``train.label_lambda > 0``
            (retrieval never uses it).
    """

    def __init__(
        self,
        image_encoder: nn.Module,
        text_encoder: TextEncoder,
        image_input: str,
        img_dim: int | None,
        resnet_arch: str | None = None,
        label_head: nn.Linear | None = None,
    ) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.image_input = image_input
        self.img_dim = img_dim
        self.resnet_arch = resnet_arch
        self.label_head = label_head

    @property
    def n_labels(self) -> int | None:
        """Size of the label vocabulary of :attr:`label_head`, None without one."""
        return None if self.label_head is None else self.label_head.out_features

    def encode_images(self, images: Tensor) -> Tensor:
        """(B, R, D) / (B, D) features or (B, 3, H, W) pixels -> (B, d), unit L2 norm."""
        return self.image_encoder(images)

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """(B, T) padded token ids and (B,) lengths -> (B, d), unit L2 norm."""
        return self.text_encoder(tokens, lengths)

    def forward(self, images: Tensor, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.encode_images(images), self.encode_texts(tokens, lengths)


def build_model(
    model_cfg: ModelConfig,
    vocab_size: int,
    img_dim: int | None,
    *,
    resnet_arch: str | None = None,
    n_labels: int | None = None,
) -> JointModel:
    """Build a freshly initialised model from its configuration.

    Args:
        model_cfg: the ``model`` section of the run configuration.
        vocab_size: number of word ids.
        img_dim: feature size of the precomputed image features (vse, vsrn); ignored for cnn.
        resnet_arch: cnn with ``model.resnet_weights`` only: build this bare ResNet instead of
            reading the weights file (used when a checkpoint supplies every weight).
        n_labels: add a label classifier with this many outputs (``train.label_lambda > 0``),
            built after the encoders so their initial weights do not depend on it.

    Raises:
        ValueError: a feature model without ``img_dim``.
    """
    kind = model_cfg.image_encoder
    text = TextEncoder(
        vocab_size,
        model_cfg.word_dim,
        model_cfg.embed_dim,
        num_layers=model_cfg.text_layers,
        bidirectional=model_cfg.bidirectional,
    )
    if kind in ("vse", "vsrn"):
        if img_dim is None:
            raise ValueError(f"model.image_encoder={kind!r} needs precomputed features (img_dim)")
        if kind == "vse":
            image: nn.Module = VSEImageEncoder(img_dim, model_cfg.embed_dim, model_cfg.pooling)
        else:
            image = VSRNImageEncoder(img_dim, model_cfg.embed_dim, model_cfg.gcn_layers)
        model = JointModel(image, text, "features", img_dim)
    elif model_cfg.resnet_weights is not None or resnet_arch is not None:
        image = ResNetImageEncoder(model_cfg.embed_dim, model_cfg.resnet_weights, arch=resnet_arch)
        model = JointModel(image, text, "pixels", None, resnet_arch=image.arch)
    else:
        model = JointModel(ConvImageEncoder(model_cfg.embed_dim, model_cfg.cnn_width), text, "pixels", None)
    if n_labels:
        model.label_head = nn.Linear(model_cfg.embed_dim, n_labels)
    return model
