"""The frozen EfficientNet-Lite0's feature map as image regions for the cross-attention models,
computed once per split and cached like the pooled features of :mod:`aoq.backbone_cache`.

SCAN and BFAN attend over an image's regions. The backbone's head activations before pooling,
a 7 x 7 grid of 1280-d cells at 224 x 224, give 49 regions per image: a fixed grid where
precomp data give 36 detected objects. ``data.regions: effnet_lite0`` (Karpathy-format data)
puts them in each split's ``features``, (N, 49, 1280), so that ``model.image_encoder: scan`` or
``bfan`` trains on image files (configs/emoji_scan.yaml).

One backbone pass gives both outputs: the map is stored, and its average, taken in float32 by
the backbone's own pooling (:func:`aoq.models.effnet_lite.pool_map`), fills the pooled entry
when that is missing, so a teacher embedding the same images later (``mining.teacher``) finds
its features cached. Nothing computes a map unless a config asks for regions: the pooled path
(``make demo``) is unchanged.

Entries live beside the pooled ones, under the pooled entry's key inputs plus ``"output":
REGIONS_OUTPUT`` (same root, layout, manifest and atomic write), stored as float16: the
activations are ReLU6 outputs in [0, 6], which float16 keeps to within
:data:`REGION_ROUNDING`, at :func:`region_bytes` per image on disk. The map is computed in this
process by the runtime the pooled features would use (``AOQ_BACKBONE_RUNTIME``,
:func:`aoq.backbone_cache.image_runtime`), OpenVINO or ONNX Runtime reading the map graph
(:data:`aoq.backbone_runtime.MAP_GRAPH`) beside the pooled one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from aoq.backbone_cache import (
    CachedFeatures,
    ImageRuntime,
    cache_root,
    cached_features,
    has_entry,
    image_key_inputs,
    image_runtime,
)
from aoq.backbone_runtime import MAP_GRAPH, image_backbone, runtime_version
from aoq.data.dataset import DataError, SplitData
from aoq.data.loaders import load_pixels
from aoq.models import packages
from aoq.models.effnet_lite import FEATURE_DIM, GRID, INPUT_SIZE, pool_map
from aoq.models.pretrained import EffNetImageEncoder

log = logging.getLogger(__name__)

REGIONS_OUTPUT = "feature-map-7x7"
N_REGIONS = GRID * GRID
REGION_DTYPE = np.float16
#: the most float16 rounding moves an activation in [0, 6] (half its step in [4, 8)), and so
#: the most the average of a stored map may differ from the float32 pooled feature.
REGION_ROUNDING = 2.0 ** -9


def region_bytes(n_images: int) -> int:
    """Bytes of the region array of ``n_images`` images on disk (the .npy header aside)."""
    return n_images * N_REGIONS * FEATURE_DIM * np.dtype(REGION_DTYPE).itemsize


def region_key_inputs(image_inputs: dict) -> dict:
    """The key inputs of the regions of the images whose pooled entry ``image_inputs`` keys."""
    return {**image_inputs, "output": REGIONS_OUTPUT}


def _map_runner(encoder: EffNetImageEncoder, runtime: ImageRuntime) -> Callable[[torch.Tensor], torch.Tensor]:
    if runtime.name != "torch":
        assert runtime.onnx is not None
        session = image_backbone(runtime.name, runtime.onnx)
        return lambda pixels: torch.from_numpy(session(pixels))
    device = next(encoder.parameters()).device
    return lambda pixels: encoder.backbone_map(pixels.to(device))


@torch.inference_mode()
def map_features(encoder: EffNetImageEncoder, paths: Sequence[Path], progress: bool = False,
                 runtime: ImageRuntime | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One pass over ``paths``: the pooled features, (N, 1280) float32, and the regions,
    (N, 49, 1280) float16, row-major over the grid. In PyTorch (the default ``runtime``) the pooled
    features equal :meth:`EffNetImageEncoder.backbone_features`; an OpenVINO or ONNX Runtime ``runtime`` of
    the map graph (:func:`aoq.backbone_cache.image_runtime`) gives them within
    :data:`aoq.backbone_runtime.IMAGE_ATOL`."""
    runtime = runtime or ImageRuntime()
    run = _map_runner(encoder, runtime)
    pooled = np.zeros((len(paths), FEATURE_DIM), np.float32)
    regions = np.zeros((len(paths), N_REGIONS, FEATURE_DIM), REGION_DTYPE)
    with tqdm(total=len(paths), desc="EfficientNet-Lite0 regions", disable=not progress, leave=False) as bar:
        for start in range(0, len(paths), runtime.batch_size):
            batch = paths[start:start + runtime.batch_size]
            fmap = run(torch.stack([load_pixels(p, INPUT_SIZE) for p in batch]))
            rows = slice(start, start + len(batch))
            pooled[rows] = pool_map(fmap).float().cpu().numpy()
            regions[rows] = fmap.flatten(2).transpose(1, 2).to(torch.float16).cpu().numpy()
            bar.update(len(batch))
    return pooled, regions


def cached_regions(paths: Sequence[Path], *, root: str | Path | None = None, progress: bool = False,
                   compute_missing: bool = True) -> CachedFeatures | None:
    """The cached (N, 49, 1280) float16 regions of the installed EfficientNet-Lite0 for the images
    ``paths`` (in order), computed on a miss together with the pooled entry when that is missing
    too; None on a miss with ``compute_missing=False``."""
    base = cache_root(root)
    paths = list(paths)
    pooled_inputs = image_key_inputs(packages.effnet_identity().to_dict(), paths)

    chosen: list[ImageRuntime] = []  # decided on a miss only: the runtime may export first

    def made_by() -> str:
        return runtime_version(chosen[0].name)

    def compute() -> np.ndarray:
        encoder = EffNetImageEncoder(embed_dim=8).eval()
        chosen.append(image_runtime(encoder, base, len(paths), graph=MAP_GRAPH))
        log.info("computing the EfficientNet-Lite0 regions of %d images with %s (once; cached under %s)",
                 len(paths), chosen[0].name, base)
        pooled, regions = map_features(encoder, paths, progress, chosen[0])
        if not has_entry(pooled_inputs, base):
            cached_features(base, pooled_inputs, lambda: pooled, len(paths), made_by)
        return regions

    return cached_features(base, region_key_inputs(pooled_inputs), compute if compute_missing else None,
                           len(paths), made_by, dtype=REGION_DTYPE)


def with_region_features(split: SplitData, *, root: str | Path | None = None, progress: bool = False) -> SplitData:
    """The split with its cached EfficientNet-Lite0 regions in ``features``.

    Raises:
        DataError: the split has no image files.
    """
    if split.image_paths is None:
        raise DataError(f"{split.source}: data.regions=effnet_lite0 needs the image files, and this split "
                        "has none (use the Karpathy JSON of the dataset)")
    entry = cached_regions(split.image_paths, root=root, progress=progress)
    assert entry is not None  # computed on a miss
    log.info("%s %s regions: %s", "cached" if entry.hit else "computed", split.name, entry.path)
    return dataclasses.replace(split, features=entry.features)
