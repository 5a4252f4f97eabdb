"""Image encoders. Each maps its input to L2-normalised joint-space embeddings.

- :class:`VSEImageEncoder` (``vse``): precomputed features -> FC -> pooling over regions
  (VSE++ "precomp" style; (N, D) global features skip the pooling).
- :class:`VSRNImageEncoder` (``vsrn``): FC -> stacked region-relation graph convolutions ->
  GRU over the regions, final state (VSRN *without* its caption-generation decoder, as Bleeker
  and de Rijke used it).
- :class:`ConvImageEncoder` (``cnn``): raw pixels -> a small convolutional network trained from
  scratch, or a torchvision ResNet initialised from a *local* weights file.
- :class:`RegionEncoder` (``scan``, ``bfan``): FC per region, one L2-normalised vector per region.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aoq.models.attention import l2norm


def _xavier_fc(in_dim: int, out_dim: int) -> nn.Linear:
    """A Linear layer initialised as in VSE++ (uniform Xavier, zero bias)."""
    fc = nn.Linear(in_dim, out_dim)
    r = math.sqrt(6.0) / math.sqrt(in_dim + out_dim)
    nn.init.uniform_(fc.weight, -r, r)
    nn.init.zeros_(fc.bias)
    return fc


def _as_regions(features: Tensor) -> Tensor:
    """(B, D) global features become one region so every encoder sees (B, R, D)."""
    if features.dim() == 2:
        return features.unsqueeze(1)
    if features.dim() != 3:
        raise ValueError(f"image features must be (B, D) or (B, R, D), got shape {tuple(features.shape)}")
    return features


class VSEImageEncoder(nn.Module):
    """Precomputed features -> FC per region -> mean or max over regions -> L2 norm."""

    def __init__(self, img_dim: int, embed_dim: int, pooling: str = "mean") -> None:
        super().__init__()
        if pooling not in ("mean", "max"):
            raise ValueError(f"pooling must be 'mean' or 'max', got {pooling!r}")
        self.pooling = pooling
        self.fc = _xavier_fc(img_dim, embed_dim)

    def forward(self, features: Tensor) -> Tensor:
        regions = _as_regions(features)
        # The FC is affine, so it commutes with the mean: it runs once per image instead of once
        # per region (the same values and gradients up to rounding, R times less work).
        x = self.fc(regions.mean(dim=1)) if self.pooling == "mean" else self.fc(regions).amax(dim=1)
        return F.normalize(x, dim=-1)


class RegionRelationGCN(nn.Module):
    """One residual graph convolution over the regions of an image (VSRN's ``Rs_GCN``).

    The affinity of regions a and b is ``(W_phi x_a) . (W_psi x_b)``, divided by the number of
    regions; messages ``W_g x`` are mixed by it, projected back, batch-normalised and added to
    the input. The batch-norm scale starts at zero, so every layer starts as the identity.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.phi = nn.Linear(dim, dim)
        self.psi = nn.Linear(dim, dim)
        self.g = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.BatchNorm1d(dim)
        nn.init.zeros_(self.norm.weight)
        nn.init.zeros_(self.norm.bias)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, R, D) -> (B, R, D)."""
        affinity = self.phi(x) @ self.psi(x).transpose(1, 2) / x.shape[1]
        y = self.out(affinity @ self.g(x))
        y = self.norm(y.transpose(1, 2)).transpose(1, 2)
        return x + y


class VSRNImageEncoder(nn.Module):
    """FC -> ``gcn_layers`` region-relation GCNs -> GRU over regions -> final state -> L2 norm."""

    def __init__(self, img_dim: int, embed_dim: int, gcn_layers: int = 4) -> None:
        super().__init__()
        self.fc = _xavier_fc(img_dim, embed_dim)
        self.gcn = nn.Sequential(*(RegionRelationGCN(embed_dim) for _ in range(gcn_layers)))
        self.rnn = nn.GRU(embed_dim, embed_dim, batch_first=True)

    def forward(self, features: Tensor) -> Tensor:
        x = F.normalize(self.fc(_as_regions(features)), dim=-1)
        x = F.normalize(self.gcn(x), dim=-1)
        _, h_n = self.rnn(x)
        return F.normalize(h_n[-1], dim=-1)


class ConvImageEncoder(nn.Module):
    """Raw images (B, 3, H, W) -> a small from-scratch CNN -> global average pool -> FC -> L2 norm.

    Four stages of (stride-2 conv, conv), widths ``width * (1, 2, 4, 8)``, each conv followed by
    batch norm and ReLU: cheap enough to train on a CPU at 64-128 px.
    """

    def __init__(self, embed_dim: int, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = 3
        for mult in (1, 2, 4, 8):
            ch = width * mult
            for stride in (2, 1):
                layers += [
                    nn.Conv2d(prev, ch, 3, stride=stride, padding=1, bias=False),
                    nn.BatchNorm2d(ch),
                    nn.ReLU(inplace=True),
                ]
                prev = ch
        self.backbone = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = _xavier_fc(prev, embed_dim)

    def forward(self, images: Tensor) -> Tensor:
        return F.normalize(self.fc(self.backbone(images)), dim=-1)


# ResNet depth from (block type, number of blocks in layer3), read off a state dict's keys.
_RESNET_BY_LAYER3 = {("basic", 2): "resnet18", ("basic", 6): "resnet34", ("bottleneck", 6): "resnet50",
                     ("bottleneck", 23): "resnet101", ("bottleneck", 36): "resnet152"}


def _resnet_arch(state: dict[str, Tensor], source: Path) -> str:
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"layer3\.(\d+)\.", k))}
    kind = "bottleneck" if any(k.startswith("layer1.0.conv3.") for k in state) else "basic"
    arch = _RESNET_BY_LAYER3.get((kind, len(blocks)))
    if arch is None:
        raise ValueError(f"{source}: not a torchvision ResNet state dict (found {kind} blocks, {len(blocks)} in layer3)")
    return arch


class ResNetImageEncoder(nn.Module):
    """A torchvision ResNet (18/34/50/101/152) -> FC -> L2 norm.

    Pretrained weights come only from ``weights_path`` (a local ``state_dict`` file; the depth is
    read off its keys); nothing is ever downloaded. With ``arch`` instead, the bare architecture is
    built (a checkpoint then supplies every weight). torchvision is imported here, lazily, so it
    stays an optional dependency.
    """

    def __init__(self, embed_dim: int, weights_path: str | Path | None = None, arch: str | None = None) -> None:
        super().__init__()
        try:
            import torchvision.models as tvm
        except ImportError as exc:
            raise ImportError(
                f"model.resnet_weights={weights_path} needs torchvision, which is not installed; "
                "install torchvision or unset model.resnet_weights to use the small CNN"
            ) from exc
        if arch is None:
            if weights_path is None:
                raise ValueError("ResNetImageEncoder needs a weights file or an architecture name")
            path = Path(weights_path)
            if not path.is_file():
                raise FileNotFoundError(f"{path}: ResNet weights file not found (model.resnet_weights; never downloaded)")
            state = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(state, dict) and "state_dict" in state:
                state = state["state_dict"]
            arch = _resnet_arch(state, path)
            net = getattr(tvm, arch)(weights=None)
            net.load_state_dict(state)
        else:
            net = getattr(tvm, arch)(weights=None)
        self.arch = arch
        feat_dim = net.fc.in_features
        net.fc = nn.Identity()
        self.backbone = net
        self.fc = _xavier_fc(feat_dim, embed_dim)

    def forward(self, images: Tensor) -> Tensor:
        return F.normalize(self.fc(self.backbone(images)), dim=-1)


class RegionEncoder(nn.Module):
    """Precomputed region features -> FC per region -> L2 norm per region (SCAN/BFAN's image
    encoder: the regions stay apart for the cross-attention)."""

    def __init__(self, img_dim: int, embed_dim: int) -> None:
        super().__init__()
        self.fc = _xavier_fc(img_dim, embed_dim)

    def forward(self, features: Tensor) -> Tensor:
        """(B, R, D) or (B, D) features -> (B, R, embed_dim) (R = 1 for global features)."""
        return l2norm(self.fc(_as_regions(features)), dim=-1)
