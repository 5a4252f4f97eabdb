"""The image backbone through OpenVINO and ONNX Runtime (aoq/backbone_runtime.py): their features
equal PyTorch's within the stated tolerance, the export is made once and reused, the runtime rule,
and the demo's one-pass precomputation writes the entries training reads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aoq import backbone_runtime
from aoq.backbone_cache import (
    EXPORT_MIN_IMAGES,
    ImageRuntime,
    _torch_runner,
    image_backbone_features,
    image_key_inputs,
    image_runtime,
    precompute_backbone_features,
    with_backbone_features,
)
from aoq.backbone_runtime import IMAGE_ATOL, image_backbone, image_onnx
from aoq.config import config_from_dict
from aoq.data.load import load_split
from aoq.data.loaders import load_pixels
from aoq.io import read_manifest, sha256_json
from aoq.models.joint import build_model, text_vocabulary
from aoq.models.pretrained import EffNetImageEncoder
from tests.fixtures import write_karpathy_fixture

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def encoder() -> EffNetImageEncoder:
    return EffNetImageEncoder(embed_dim=8).eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def exported(encoder, cache: Path) -> Path:
    return image_onnx(encoder, cache)


def _pictures() -> torch.Tensor:
    """A real photo, two crops of it scaled up as the emoji are, flat colour and noise."""
    from skimage import data as skdata

    cat = Image.fromarray(skdata.chelsea())
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8))
    pictures = [cat, cat.crop((100, 50, 228, 178)), cat.crop((0, 0, 64, 64)), Image.new("RGB", (128, 128), "white"),
                noise]
    return torch.stack([load_pixels(p, 224) for p in pictures])


RUNTIMES = [pytest.param(name, marks=pytest.mark.skipif(importlib.util.find_spec(name) is None,
                                                        reason=f"{name} is not installed"))
            for name in backbone_runtime.EXPORT_RUNTIMES]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_runtime_features_equal_pytorch_within_the_tolerance(encoder, exported, runtime) -> None:
    pixels = _pictures()
    reference = _torch_runner(encoder)(pixels)
    fast = np.concatenate([image_backbone(runtime, exported)(pixels[k:k + 1]) for k in range(len(pixels))])
    assert fast.shape == reference.shape == (5, 1280) and fast.dtype == np.float32
    assert float(reference.max()) > 1.0  # real activations, not a degenerate input
    assert np.abs(fast - reference).max() <= IMAGE_ATOL
    # the tolerance is the size of PyTorch's own rounding differences: the same network in
    # the default memory layout instead of channels_last stays within it too
    with torch.inference_mode():
        from aoq.models.pretrained import effnet_normalise

        plain = encoder.backbone.features(effnet_normalise(pixels).contiguous()).numpy()
    assert np.abs(plain - reference).max() <= IMAGE_ATOL


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_feature_does_not_depend_on_its_batch(exported, runtime) -> None:
    pixels = _pictures()
    session = image_backbone(runtime, exported)
    one_by_one = np.concatenate([session(pixels[k:k + 1]) for k in range(len(pixels))])
    assert np.array_equal(one_by_one[2:3], session(pixels[2:3]))
    first = session(pixels[:1])
    session(pixels[1:2])
    assert np.array_equal(first, one_by_one[:1])  # a result is not overwritten by the next call
    assert np.abs(session(pixels) - one_by_one).max() <= IMAGE_ATOL


def test_the_export_is_made_once_and_reused(encoder, exported, monkeypatch) -> None:
    manifest = read_manifest(exported.parent, kind=backbone_runtime.ONNX_KIND)
    assert manifest["config"]["backbone"] == encoder.identity.to_dict()

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    assert image_onnx(encoder, exported.parents[3]) == exported
    assert backbone_runtime.has_image_onnx(encoder, exported.parents[3])
    assert not backbone_runtime.has_image_onnx(encoder, exported.parents[4])


def test_the_runtime_rule(encoder, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(backbone_runtime, "image_onnx", lambda enc, root, graph: root / "model.onnx")
    monkeypatch.setattr("aoq.backbone_cache.image_onnx", lambda enc, root, graph: root / "model.onnx")
    monkeypatch.delenv(backbone_runtime.RUNTIME_ENV, raising=False)
    # auto: few images run in PyTorch (an export would cost more than it saves), many through
    # OpenVINO where it is installed, else ONNX Runtime
    assert image_runtime(encoder, tmp_path, EXPORT_MIN_IMAGES - 1) == ImageRuntime()
    first = "openvino" if importlib.util.find_spec("openvino") else "onnxruntime"
    assert image_runtime(encoder, tmp_path, EXPORT_MIN_IMAGES) == ImageRuntime(first, tmp_path / "model.onnx", 1)
    installed = backbone_runtime._installed
    monkeypatch.setattr(backbone_runtime, "_installed", lambda runtime: runtime == "onnxruntime")
    assert image_runtime(encoder, tmp_path, EXPORT_MIN_IMAGES).name == "onnxruntime"
    monkeypatch.setenv(backbone_runtime.RUNTIME_ENV, "openvino")
    with pytest.raises(ValueError, match="AOQ_BACKBONE_RUNTIME=openvino needs the packages openvino and onnx"):
        image_runtime(encoder, tmp_path, 1)
    monkeypatch.setattr(backbone_runtime, "_installed", installed)
    monkeypatch.setenv(backbone_runtime.RUNTIME_ENV, "torch")
    assert image_runtime(encoder, tmp_path, 10 ** 6) == ImageRuntime()
    monkeypatch.setenv(backbone_runtime.RUNTIME_ENV, "onnxruntime")
    assert image_runtime(encoder, tmp_path, 1).name == "onnxruntime"
    monkeypatch.setenv(backbone_runtime.RUNTIME_ENV, "tensorrt")
    with pytest.raises(ValueError, match="AOQ_BACKBONE_RUNTIME must be one of auto, openvino, onnxruntime, torch"):
        image_runtime(encoder, tmp_path, 1)


def test_precompute_writes_the_entries_training_reads(exported: Path, cache: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    data = write_karpathy_fixture(tmp_path / "data", "flickr30k", {"train": 6, "val": 2, "test": 2}, image_size=24)
    cfg = config_from_dict({"name": "p", "out_dir": str(tmp_path / "run"),
                            "data": {"format": "karpathy", "path": str(data), "image_size": 224},
                            "model": {"image_encoder": "effnet_lite0", "text_encoder": "minilm", "embed_dim": 8}})
    model = build_model(cfg.model, 0, None).eval()
    vocab = text_vocabulary(cfg.model, [], 1)
    splits = [load_split(cfg.data, s) for s in ("train", "dev", "test")]
    monkeypatch.setenv(backbone_runtime.RUNTIME_ENV, "onnxruntime")
    precompute_backbone_features(splits, image=model.image_encoder, text=lambda: (model.text_encoder, vocab),
                                 root=cache)
    for split in splits:
        entry = cache / "efficientnet_lite0" / sha256_json(image_key_inputs(model.image_encoder.identity.to_dict(),
                                                                            list(split.image_paths)))
        recorded = json.loads((entry / "manifest.json").read_text())["runtime"]
        assert recorded.startswith("onnxruntime ")

        def no_compute(*args, **kwargs):
            raise AssertionError("featurised again")

        monkeypatch.setattr("aoq.backbone_cache.image_backbone_features", no_compute)
        monkeypatch.setattr("aoq.backbone_cache.caption_backbone_features", no_compute)
        ready = with_backbone_features(model, split, vocab, root=cache)  # every entry read, none computed
        monkeypatch.undo()
        monkeypatch.setenv(backbone_runtime.RUNTIME_ENV, "onnxruntime")
        reference = image_backbone_features(model.image_encoder, list(split.image_paths), runtime=ImageRuntime())
        assert np.abs(np.asarray(ready.features) - reference).max() <= IMAGE_ATOL
        assert ready.caption_features.shape == (split.n_captions, 384)


def test_precompute_loads_the_caption_encoder_after_the_image_workers_have_their_work(
        cache: Path, tmp_path: Path, monkeypatch) -> None:
    """MiniLM's loading (seconds of one core) overlaps the image workers: the factory runs once
    every image chunk is queued, and the images still come out in split order."""
    from concurrent.futures import Future

    from aoq import backbone_cache

    data = write_karpathy_fixture(tmp_path / "data", "flickr30k", {"train": 6, "val": 2, "test": 2}, image_size=24)
    cfg = config_from_dict({"name": "o", "out_dir": str(tmp_path / "run"),
                            "data": {"format": "karpathy", "path": str(data), "image_size": 224},
                            "model": {"image_encoder": "effnet_lite0", "text_encoder": "minilm", "embed_dim": 8}})
    model = build_model(cfg.model, 0, None).eval()
    splits = [load_split(cfg.data, s) for s in ("train", "dev", "test")]
    queued: list[list[Path]] = []

    class InlinePool:  # the workers' work, done at once in this process: only the order is tested
        def submit(self, fn, chunk, batch_size) -> Future:
            queued.append(chunk)
            done: Future = Future()
            done.set_result(image_backbone_features(model.image_encoder, chunk, runtime=ImageRuntime()))
            return done

        def shutdown(self, cancel_futures: bool) -> None:
            pass

    def text() -> tuple:
        assert sum(len(chunk) for chunk in queued) == sum(len(s.image_paths) for s in splits), "loaded too early"
        return model.text_encoder, text_vocabulary(cfg.model, [], 1)

    monkeypatch.setattr(backbone_cache, "POOL_MIN_IMAGES", 1)
    monkeypatch.setattr(backbone_cache, "_image_pool", lambda workers, runtime: InlinePool())
    monkeypatch.setenv(backbone_runtime.RUNTIME_ENV, "torch")
    root = tmp_path / "cache"
    precompute_backbone_features(splits, image=model.image_encoder, text=text, root=root, workers=2)
    for split in splits:
        ready = with_backbone_features(model, split, text_vocabulary(cfg.model, [], 1), root=root,
                                       compute_missing=False)
        reference = image_backbone_features(model.image_encoder, list(split.image_paths), runtime=ImageRuntime())
        assert np.array_equal(np.asarray(ready.features), reference)
        assert ready.caption_features.shape == (split.n_captions, 384)


def test_image_workers_run_below_the_caption_process() -> None:
    """The captions beside the image workers keep a core: the workers are niced."""
    import os

    from aoq.backbone_cache import WORKER_NICENESS, _image_pool

    with _image_pool(1, ImageRuntime()) as pool:
        assert pool.submit(os.nice, 0).result() == min(19, os.nice(0) + WORKER_NICENESS)
