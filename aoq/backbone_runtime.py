"""The frozen backbones' forward pass through ONNX Runtime, a runtime made for CPU inference.

Featurising a dataset with a frozen backbone is pure inference, and on a CPU ONNX Runtime runs
EfficientNet-Lite0 in well under half of PyTorch's time (it fuses each convolution with its
batch norm and ReLU6 and runs the depthwise layers in a blocked layout; docs/performance.md).
The network is exported once from the very PyTorch module the encoders use (its weights, its
"SAME" padding, the input scaling of :func:`aoq.models.pretrained.effnet_normalise`) and kept
beside the feature cache, keyed by the backbone's identity and the exporter's version, so a later
run loads the file instead of exporting again.

Its features equal PyTorch's within float32 rounding: at most :data:`IMAGE_ATOL` apart on the
image features (values in [0, 6]), the same size of difference as PyTorch's own between two
memory layouts of the same network (tests/test_backbone_runtime.py checks both bounds). That is
why the runtime is not part of a cache entry's key (the key names what is computed: weights,
preprocessing, content; PyTorch's float32 kernels already differ at this level from one CPU to
the next); the manifest of each entry records which runtime made it.

``AOQ_BACKBONE_RUNTIME``: ``auto`` (the default: ONNX Runtime when ``onnxruntime`` and ``onnx``
are installed, else PyTorch), ``onnxruntime`` (an error when it is missing) or ``torch``.
Only the image backbone goes through it: MiniLM's products on short captions are already
compute-bound in PyTorch, and ONNX Runtime took about three quarters of its time (docs/performance.md).
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from aoq.io import ArtefactError, atomic_dir, read_manifest, sha256_json, write_manifest

log = logging.getLogger(__name__)

RUNTIME_ENV = "AOQ_BACKBONE_RUNTIME"
RUNTIMES = ("auto", "onnxruntime", "torch")
#: the most an ONNX Runtime image feature may differ from PyTorch's (absolute; features in [0, 6]).
IMAGE_ATOL = 1e-4
ONNX_KIND = "backbone-onnx"
ONNX_FILE = "model.onnx"
#: bump when the exported graph would differ for the same weights and exporter.
EXPORT_VERSION = 1
OPSET = 17
#: what an exported graph outputs: the pooled features, or the feature map before pooling (the
#: regions of :mod:`aoq.backbone_regions`).
POOLED_GRAPH = "pixels-to-pooled-features"
MAP_GRAPH = "pixels-to-feature-map"


def requested_runtime(name: str | None = None) -> str:
    """``name``, else ``$AOQ_BACKBONE_RUNTIME``, else ``auto``.

    Raises:
        ValueError: an unknown name.
    """
    wanted = name or os.environ.get(RUNTIME_ENV) or "auto"
    if wanted not in RUNTIMES:
        raise ValueError(f"{RUNTIME_ENV} must be one of {', '.join(RUNTIMES)}, got {wanted!r}")
    return wanted


def runtime_name(name: str | None = None) -> str:
    """``onnxruntime`` or ``torch``: what :func:`requested_runtime` asks for, ``auto`` being ONNX
    Runtime where it is installed.

    Raises:
        ValueError: an unknown name, or ``onnxruntime`` asked for and not installed.
    """
    wanted = requested_runtime(name)
    if wanted == "torch":
        return "torch"
    try:
        import onnx  # noqa: F401  (torch's exporter writes through it)
        import onnxruntime  # noqa: F401
    except ImportError:
        if wanted == "onnxruntime":
            raise ValueError(f"{RUNTIME_ENV}=onnxruntime needs the packages onnxruntime and onnx "
                             "(pip install onnxruntime onnx)") from None
        return "torch"
    return "onnxruntime"


def runtime_version(name: str) -> str:
    """What a cache manifest records about the runtime that made an entry."""
    if name == "onnxruntime":
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"
    return f"torch {torch.__version__}"


class _ImageGraph(nn.Module):
    """What is exported: pixels in [-1, 1] (``load_pixels``) -> pooled features or the feature map,
    through the encoder's own ``backbone_features`` / ``backbone_map`` (input scaling included)."""

    def __init__(self, encoder: nn.Module, graph: str) -> None:
        super().__init__()
        self.encoder = encoder
        self.graph = graph

    def forward(self, pixels: Tensor) -> Tensor:
        if self.graph == MAP_GRAPH:
            return self.encoder.backbone_map(pixels)
        return self.encoder.backbone_features(pixels)


def _onnx_inputs(encoder, graph: str = POOLED_GRAPH) -> dict:
    if graph not in (POOLED_GRAPH, MAP_GRAPH):
        raise ValueError(f"graph must be {POOLED_GRAPH!r} or {MAP_GRAPH!r}, got {graph!r}")
    return {"backbone": encoder.identity.to_dict(), "graph": graph,
            "preprocess": _preprocess(), "export_version": EXPORT_VERSION, "opset": OPSET,
            "torch": torch.__version__}


def _onnx_folder(root: Path, inputs: dict) -> Path:
    return root / inputs["backbone"]["name"] / "onnx" / sha256_json(inputs)


def has_image_onnx(encoder, root: Path, graph: str = POOLED_GRAPH) -> bool:
    """Whether ``encoder``'s backbone is already exported under ``root`` (checked when loaded)."""
    return (_onnx_folder(root, _onnx_inputs(encoder, graph)) / "manifest.json").is_file()


def image_onnx(encoder, root: Path, graph: str = POOLED_GRAPH) -> Path:
    """The ONNX file of ``encoder``'s frozen EfficientNet-Lite0 backbone under ``root`` (the feature
    cache root), exported on the first call for these weights, this exporter and ``graph``
    (:data:`POOLED_GRAPH` or :data:`MAP_GRAPH`).

    Raises:
        ArtefactError: the export failed (the message says which backbone).
    """
    inputs = _onnx_inputs(encoder, graph)
    key = sha256_json(inputs)
    folder = _onnx_folder(root, inputs)
    try:
        read_manifest(folder, kind=ONNX_KIND)
        return folder / ONNX_FILE
    except ArtefactError:
        pass
    buffer = io.BytesIO()
    example = torch.zeros(1, 3, encoder.input_size, encoder.input_size)
    try:
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            # the tracer's notes on the padding arithmetic: the input size is fixed (224), so
            # the traced constants are the right ones
            warnings.simplefilter("ignore")
            torch.onnx.export(_ImageGraph(encoder, graph).eval(), (example,), buffer, input_names=["pixels"],
                              output_names=["features"], dynamic_axes={"pixels": {0: "batch"}, "features": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
    except Exception as exc:  # noqa: BLE001 - any exporter failure is reported as one error
        raise ArtefactError(f"exporting {inputs['backbone']['name']} to ONNX failed ({exc}); "
                            f"set {RUNTIME_ENV}=torch to featurise with PyTorch") from None
    with atomic_dir(folder) as tmp:
        (tmp / ONNX_FILE).write_bytes(buffer.getvalue())
        write_manifest(tmp, ONNX_KIND, inputs, key=key)
    log.info("exported %s to %s", inputs["backbone"]["name"], folder / ONNX_FILE)
    return folder / ONNX_FILE


def _preprocess() -> str:
    from aoq.models.pretrained import IMAGE_PREPROCESS

    return IMAGE_PREPROCESS


class OnnxImageBackbone:
    """An ONNX Runtime session of an exported image backbone on one thread (the callers run one
    process per core)."""

    def __init__(self, path: Path) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def __call__(self, pixels: Tensor) -> np.ndarray:
        """(B, 3, 224, 224) pixels in [-1, 1] -> (B, 1280) float32 features, or the (B, 1280, 7, 7)
        map of a :data:`MAP_GRAPH` export."""
        return self.session.run(None, {"pixels": pixels.numpy()})[0]
