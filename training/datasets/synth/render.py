"""Pillow rendering of a :class:`~aoq_train.datasets.synth.scenes.Scene` and its deterministic PNG bytes.

Objects are drawn without anti-aliasing, so their colour is flat and their outline crisp; the
background carries a faint texture (grain, stripes or a gradient) whose amplitude stays well below
the object/background contrast, so a pixel-level extractor can still find every object.
"""

from __future__ import annotations

import io
import math
import random

import numpy as np
from PIL import Image, ImageDraw

from aoq_train.datasets.synth.scenes import BACKGROUNDS, Scene, SceneObject, SceneParams

#: texture amplitude in grey levels at ``noise=1``.
TEXTURE_AMPLITUDE = 8.0
#: fixed PNG options: identical inputs give byte-identical files.
PNG_OPTIONS = {"format": "PNG", "compress_level": 1, "optimize": False}


def render_scene(scene: Scene, params: SceneParams, rng: random.Random) -> Image.Image:
    """The scene as an RGB image of ``params.image_size`` pixels; ``rng`` only varies the texture."""
    size = params.image_size
    canvas = np.empty((size, size, 3), dtype=np.float64)
    canvas[:] = BACKGROUNDS[scene.background]
    canvas += _texture(scene.texture, size, TEXTURE_AMPLITUDE * params.noise, rng)[:, :, None]
    image = Image.fromarray(np.clip(np.rint(canvas), 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for obj in scene.objects:
        _draw_object(draw, obj, size)
    return image


def png_bytes(image: Image.Image) -> bytes:
    """The image encoded as PNG with fixed options (no timestamps, fixed compression)."""
    buf = io.BytesIO()
    image.save(buf, **PNG_OPTIONS)
    return buf.getvalue()


def _texture(kind: str, size: int, amplitude: float, rng: random.Random) -> np.ndarray:
    """A (size, size) grey-level offset in [-amplitude, amplitude]."""
    if kind == "plain" or amplitude == 0:
        return np.zeros((size, size))
    if kind == "grain":
        return np.random.default_rng(rng.getrandbits(64)).uniform(-amplitude, amplitude, size=(size, size))
    yy, xx = np.mgrid[0:size, 0:size] / size
    angle = rng.uniform(0, math.pi)
    coord = xx * math.cos(angle) + yy * math.sin(angle)
    if kind == "stripes":
        period = rng.uniform(0.1, 0.22)
        return amplitude * np.sin(2 * math.pi * coord / period + rng.uniform(0, 2 * math.pi))
    if kind == "gradient":
        lo, hi = coord.min(), coord.max()
        return amplitude * (2 * (coord - lo) / max(hi - lo, 1e-9) - 1)
    raise ValueError(f"unknown texture {kind!r}")


def _regular_polygon(cx: float, cy: float, radius: float, n: int, phase: float) -> list[tuple[float, float]]:
    return [
        (cx + radius * math.cos(phase + 2 * math.pi * k / n), cy + radius * math.sin(phase + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject, size: int) -> None:
    cx, cy, r = obj.x * size, obj.y * size, obj.r * size
    fill = obj.rgb
    if obj.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif obj.shape == "square":
        h = 0.85 * r  # a full-box square looks much bigger than a circle of the same radius
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    elif obj.shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + 0.8 * r), (cx - r, cy + 0.8 * r)], fill=fill)
    elif obj.shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + 0.7 * r, cy), (cx, cy + r), (cx - 0.7 * r, cy)], fill=fill)
    elif obj.shape == "cross":
        t = 0.33 * r
        draw.rectangle([cx - r, cy - t, cx + r, cy + t], fill=fill)
        draw.rectangle([cx - t, cy - r, cx + t, cy + r], fill=fill)
    elif obj.shape == "star":
        outer = _regular_polygon(cx, cy, r, 5, -math.pi / 2)
        inner = _regular_polygon(cx, cy, 0.45 * r, 5, -math.pi / 2 + math.pi / 5)
        draw.polygon([p for pair in zip(outer, inner) for p in pair], fill=fill)
    elif obj.shape == "hexagon":
        draw.polygon(_regular_polygon(cx, cy, r, 6, 0.0), fill=fill)
    elif obj.shape == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=max(2, round(0.35 * r)))
    else:
        raise ValueError(f"unknown shape {obj.shape!r}")
