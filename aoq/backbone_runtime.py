"""The frozen backbones' forward pass through a runtime made for CPU inference: OpenVINO or
ONNX Runtime.

Featurising a dataset with a frozen backbone is pure inference, and on a CPU these runtimes run
EfficientNet-Lite0 in a fraction of PyTorch's time (they fuse each convolution with its batch norm
and ReLU6 and run the depthwise layers in a blocked layout; OpenVINO's kernels took about half of
ONNX Runtime's CPU time on an Intel Xeon; docs/performance.md). The network is exported once to
ONNX from the very PyTorch module the encoders use (its weights, its "SAME" padding, the input
scaling of :func:`aoq.models.pretrained.effnet_normalise`) and kept beside the feature cache, keyed
by the backbone's identity and the exporter's version, so a later run loads the file instead of
exporting again; both runtimes read that file.

Their features equal PyTorch's within float32 rounding: at most :data:`IMAGE_ATOL` apart on the
image features (values in [0, 6]), the same size of difference as PyTorch's own between two
memory layouts of the same network (tests/test_backbone_runtime.py checks both bounds). OpenVINO
is held to float32 inference: where a CPU has bf16 units (AVX512-BF16, AMX) it would otherwise
infer in bfloat16, far outside that bound. That is why the runtime is not part of a cache entry's
key (the key names what is computed: weights, preprocessing, content; PyTorch's float32 kernels
already differ at this level from one CPU to the next); the manifest of each entry records which
runtime made it.

``AOQ_BACKBONE_RUNTIME``: ``auto`` (the default: OpenVINO where ``openvino`` is installed, else
ONNX Runtime where ``onnxruntime`` is, else PyTorch; both need ``onnx`` for the export),
``openvino`` or ``onnxruntime`` (an error when it is missing) or ``torch``. The choice depends on
what is installed only, never on a timing, so one machine always computes the same features.
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

from aoq.io import ArtefactError, atomic_dir, exclusive, read_manifest, sha256_json, write_manifest

log = logging.getLogger(__name__)

RUNTIME_ENV = "AOQ_BACKBONE_RUNTIME"
RUNTIMES = ("auto", "openvino", "onnxruntime", "torch")
#: the inference runtimes that read the exported ONNX file, in the order ``auto`` prefers them
EXPORT_RUNTIMES = ("openvino", "onnxruntime")
#: the most an OpenVINO or ONNX Runtime image feature may differ from PyTorch's (absolute; features in [0, 6]).
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
    """``openvino``, ``onnxruntime`` or ``torch``: what :func:`requested_runtime` asks for,
    ``auto`` being the first of :data:`EXPORT_RUNTIMES` that is installed.

    Raises:
        ValueError: an unknown name, or a runtime asked for and not installed.
    """
    wanted = requested_runtime(name)
    if wanted == "torch":
        return "torch"
    for runtime in EXPORT_RUNTIMES if wanted == "auto" else (wanted,):
        if _installed(runtime):
            return runtime
    if wanted != "auto":
        raise ValueError(f"{RUNTIME_ENV}={wanted} needs the packages {wanted} and onnx (pip install {wanted} onnx)")
    return "torch"


def _installed(runtime: str) -> bool:
    try:
        import onnx  # noqa: F401  (torch's exporter writes through it)

        if runtime == "openvino":
            import openvino  # noqa: F401
        else:
            import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def runtime_version(name: str) -> str:
    """What a cache manifest records about the runtime that made an entry."""
    if name == "openvino":
        import openvino

        return f"openvino {openvino.__version__}"
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


def _exported(folder: Path) -> bool:
    try:
        read_manifest(folder, kind=ONNX_KIND)
        return True
    except ArtefactError:
        return False


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
    if _exported(folder):  # no lock file on a hit: a read-only cache serves its exports
        return folder / ONNX_FILE
    with exclusive(folder.parent / f".{key}.lock"):  # jobs side by side export once
        if _exported(folder):
            return folder / ONNX_FILE
        buffer = io.BytesIO()
        example = torch.zeros(1, 3, encoder.input_size, encoder.input_size)
        try:
            with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
                # the tracer's notes on the padding arithmetic: the input size is fixed (224), so
                # the traced constants are the right ones
                warnings.simplefilter("ignore")
                torch.onnx.export(_ImageGraph(encoder, graph).eval(), (example,), buffer, input_names=["pixels"],
                                  output_names=["features"],
                                  dynamic_axes={"pixels": {0: "batch"}, "features": {0: "batch"}},
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


class OpenVinoImageBackbone:
    """An OpenVINO compiled model of an exported image backbone on one thread, in float32 (the
    module docstring says why the precision is pinned), its thread not pinned to a core: OpenVINO
    pins by default, and the demo's pool of one process per core then ran both processes on the
    first core (docs/performance.md)."""

    def __init__(self, path: Path) -> None:
        import openvino

        core = openvino.Core()
        self.model = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False})
        self.request = self.model.create_infer_request()

    def __call__(self, pixels: Tensor) -> np.ndarray:
        """As :meth:`OnnxImageBackbone.__call__` (the result is a copy, not the request's buffer)."""
        return self.request.infer({0: pixels.numpy()}, share_outputs=False)[self.model.output(0)]


def image_backbone(runtime: str, path: Path) -> OnnxImageBackbone | OpenVinoImageBackbone:
    """The session of ``runtime`` (one of :data:`EXPORT_RUNTIMES`) on the exported file ``path``."""
    if runtime == "openvino":
        return OpenVinoImageBackbone(path)
    if runtime == "onnxruntime":
        return OnnxImageBackbone(path)
    raise ValueError(f"no exported-graph runtime named {runtime!r}: use one of {', '.join(EXPORT_RUNTIMES)}")
