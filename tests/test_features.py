"""The pixel region extractor (aoq/features.py) on rendered synthetic scenes and on odd images: what
it sees, a fixed shape whatever the input, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from aoq.features import FEATURE_DIM, N_REGIONS, extract_regions
from aoq_train.datasets.synth.render import render_scene
from aoq_train.datasets.synth.scenes import COLOURS, STREAM_RENDER, SceneParams, rng_for
from tests.fixtures import synth_scenes


def test_extractor_sees_an_objects_colour_and_box():
    params = SceneParams(noise=0.0)
    scene = next(s for s in synth_scenes(params, 60) if len(s.objects) == 1)
    obj = scene.objects[0]
    feats = extract_regions(render_scene(scene, params, rng_for(0, "train", STREAM_RENDER, 0)))
    mean_rgb = feats[:, 10:13]
    hits = np.flatnonzero(np.all(np.abs(mean_rgb - np.array(COLOURS[obj.colour]) / 255) < 1e-6, axis=1))
    assert len(hits) == 1, "exactly one region has the flat object colour"
    x1, y1, x2, y2 = feats[hits[0], :4]
    assert abs((x1 + x2) / 2 - obj.x) < 2 / 64 and abs((y1 + y2) / 2 - obj.y) < 2 / 64


def test_region_count_is_the_same_for_one_to_four_objects():
    params = SceneParams()
    by_count = {}
    for k, scene in enumerate(synth_scenes(params, 80)):
        by_count.setdefault(len(scene.objects), (k, scene))
    assert sorted(by_count) == [1, 2, 3, 4]
    for k, scene in by_count.values():
        feats = extract_regions(render_scene(scene, params, rng_for(0, "train", STREAM_RENDER, k)))
        assert feats.shape == (N_REGIONS, FEATURE_DIM) and feats.dtype == np.float32


@pytest.mark.parametrize(
    "image",
    [
        Image.new("RGB", (1, 1), (200, 10, 10)),
        Image.new("RGB", (0, 0)),
        Image.new("RGB", (64, 64)),
        Image.new("RGB", (2400, 1600), (30, 90, 200)),
        Image.new("RGB", (3000, 2)),
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)),
        Image.new("L", (40, 90), 77),
        Image.new("RGBA", (64, 64), (0, 255, 0, 0)),
        Image.new("LA", (20, 20), (9, 200)),
        Image.new("P", (30, 30), 5),
        Image.new("1", (30, 30), 1),
        Image.new("CMYK", (30, 30), (0, 90, 0, 0)),
        Image.fromarray(np.arange(900, dtype=np.uint16).reshape(30, 30)),
        Image.fromarray(np.full((8, 8), np.nan, dtype=np.float32)),
    ],
    ids=[
        "1x1", "0x0", "black", "huge", "strip", "noise", "gray", "rgba", "la", "palette", "bilevel", "cmyk", "i16",
        "nan",
    ],
)
def test_odd_images_give_fixed_shape_finite_features(image):
    feats = extract_regions(image)
    assert feats.shape == (N_REGIONS, FEATURE_DIM) and feats.dtype == np.float32
    assert np.isfinite(feats).all()


def test_extractor_rejects_what_is_not_an_image():
    with pytest.raises(TypeError, match="PIL"):
        extract_regions(np.zeros((64, 64, 3), dtype=np.uint8))
