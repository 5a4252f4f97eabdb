"""The pixel region extractor: a tiny, deterministic stand-in for a bottom-up-attention detector.

Region features are computed from the pixels alone, never from the generator's labels, so the
same function featurises generated PNGs and images uploaded to the search service:

1. the image is converted to RGB (alpha composited on white, 16-bit/float scaled) and resized
   to ``WORK_SIZE`` pixels (generated images already have that size by default);
2. the background colour is the median of the border pixels (the generator keeps objects off the
   border), and a pixel is foreground when some channel differs from it by more than
   ``FG_THRESHOLD`` grey levels;
3. foreground pixels are grouped into 8-connected components; the ``N_PROPOSALS`` largest
   (of at least ``MIN_AREA`` pixels) are object proposals;
4. the remaining proposal slots are filled with background boxes (cells of a 3x3 grid, emptiest
   first), and the whole image is one more region, so there are always ``N_REGIONS`` regions and
   their number never gives the object count away;
5. regions are ordered by the position of their box centre (top to bottom, left to right), so
   the order does not tell object proposals from background boxes either.

Each region is described by ``FEATURE_DIM`` numbers:

- geometry (10): normalised box x1, y1, x2, y2, width, height, box area, centre x, centre y, and
  the foreground pixel area;
- colour (20): mean and standard deviation of R, G, B, mean saturation and value, and a 12-bin
  hue histogram weighted by saturation (grey pixels hardly count);
- shape (66): the region's foreground mask resized to 8x8 (coverage per cell), the fill ratio
  (foreground share of the box) and the log aspect ratio.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy import ndimage

WORK_SIZE = 64
N_PROPOSALS = 7
#: regions per image: the proposals plus the whole image.
N_REGIONS = N_PROPOSALS + 1
MASK_SIDE = 8
HUE_BINS = 12
_GEOMETRY_DIM = 10
_COLOUR_DIM = 3 + 3 + 2 + HUE_BINS
_SHAPE_DIM = MASK_SIDE * MASK_SIDE + 2
FEATURE_DIM = _GEOMETRY_DIM + _COLOUR_DIM + _SHAPE_DIM
FG_THRESHOLD = 36
MIN_AREA = 6
_BORDER = 2
_GRID = 3
_SUPERSAMPLE = 4
_EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)

# A box is (y0, y1, x0, x1) in pixels, end exclusive.
_Box = tuple[int, int, int, int]


def extract_regions(image: Image.Image) -> np.ndarray:
    """Region features of ``image`` as a ``(N_REGIONS, FEATURE_DIM)`` float32 array.

    Accepts any PIL image (any mode and size, including blank, noise, 1x1 and empty images).

    Raises:
        TypeError: ``image`` is not a PIL image.
    """
    return _regions_from_rgb(_to_work_rgb(image))


def _to_work_rgb(image: Image.Image) -> np.ndarray:
    """``image`` as a (WORK_SIZE, WORK_SIZE, 3) uint8 array."""
    if not isinstance(image, Image.Image):
        raise TypeError(f"extract_regions needs a PIL.Image.Image, got {type(image).__name__}")
    if image.width == 0 or image.height == 0:
        return np.zeros((WORK_SIZE, WORK_SIZE, 3), dtype=np.uint8)
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        # No fixed range for these modes: stretch min..max to 0..255.
        values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        lo, hi = float(values.min()), float(values.max())
        scaled = (values - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(values)
        image = Image.fromarray(np.rint(scaled).astype(np.uint8), "L")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    if image.mode != "RGB":
        image = image.convert("RGB")
    if image.size != (WORK_SIZE, WORK_SIZE):
        image = image.resize((WORK_SIZE, WORK_SIZE), Image.Resampling.BILINEAR, reducing_gap=3.0)
    return np.asarray(image, dtype=np.uint8)


def _regions_from_rgb(rgb: np.ndarray) -> np.ndarray:
    size = rgb.shape[0]
    border = np.concatenate(
        [
            rgb[:_BORDER].reshape(-1, 3),
            rgb[-_BORDER:].reshape(-1, 3),
            rgb[:, :_BORDER].reshape(-1, 3),
            rgb[:, -_BORDER:].reshape(-1, 3),
        ]
    )
    background = np.median(border, axis=0)
    foreground = np.abs(rgb.astype(np.int16) - background.astype(np.int16)).max(axis=2) > FG_THRESHOLD
    labels, n_labels = ndimage.label(foreground, structure=_EIGHT_CONNECTED)
    areas = np.bincount(labels.ravel(), minlength=n_labels + 1)
    # Largest first; ties keep raster order (label ids are assigned in raster order).
    keep = [k for k in sorted(range(1, n_labels + 1), key=lambda k: (-areas[k], k)) if areas[k] >= MIN_AREA]
    keep = keep[:N_PROPOSALS]
    slices = ndimage.find_objects(labels)

    # Every region as (component label or 0, box); label 0 = all pixels of the box count for
    # colour and the foreground inside the box is its shape.
    regions = [(k, (ys.start, ys.stop, xs.start, xs.stop)) for k in keep for ys, xs in [slices[k - 1]]]
    regions += [(0, box) for box in _background_boxes(foreground, N_PROPOSALS - len(keep))]
    regions.append((0, (0, size, 0, size)))
    label_of = np.array([k for k, _ in regions])
    boxes = np.array([box for _, box in regions], dtype=np.int64)
    # foreground pixels of each region: the component's area, or the foreground inside the box
    fg_count = np.array(
        [areas[k] if k > 0 else int(foreground[y0:y1, x0:x1].sum()) for k, (y0, y1, x0, x1) in regions]
    )

    features = np.concatenate(
        [
            _geometry(boxes, fg_count, size),
            _colour(rgb, boxes, label_of, labels, areas),
            _shape(boxes, label_of, labels, foreground, fg_count),
        ],
        axis=1,
    )
    # Order by box centre (row, then column), then box area: independent of what a region is.
    y0, y1, x0, x1 = boxes.T
    order = np.lexsort((np.arange(len(regions)), (y1 - y0) * (x1 - x0), x0 + x1, y0 + y1))
    return features[order].astype(np.float32)


def _background_boxes(foreground: np.ndarray, count: int) -> list[_Box]:
    """``count`` cells of a 3x3 grid, the ones with the least foreground first."""
    if count <= 0:
        return []
    edges = np.linspace(0, foreground.shape[0], _GRID + 1).round().astype(int)
    cells = [
        (int(edges[r]), int(edges[r + 1]), int(edges[c]), int(edges[c + 1]))
        for r in range(_GRID)
        for c in range(_GRID)
    ]
    counts = [int(foreground[y0:y1, x0:x1].sum()) for y0, y1, x0, x1 in cells]
    areas = [(y1 - y0) * (x1 - x0) for y0, y1, x0, x1 in cells]
    ranked = sorted(range(len(cells)), key=lambda i: (counts[i] / areas[i], i))
    return [cells[i] for i in ranked[:count]]


def _geometry(boxes: np.ndarray, fg_count: np.ndarray, size: int) -> np.ndarray:
    y0, y1, x0, x1 = (boxes[:, i].astype(np.float64) / size for i in range(4))
    w, h = x1 - x0, y1 - y0
    return np.stack([x0, y0, x1, y1, w, h, w * h, (x0 + x1) / 2, (y0 + y1) / 2, fg_count / size**2], axis=1)


def _colour(
    rgb: np.ndarray, boxes: np.ndarray, label_of: np.ndarray, labels: np.ndarray, areas: np.ndarray
) -> np.ndarray:
    """Mean and std of R, G, B, mean saturation and value, saturation-weighted hue histogram.

    Sums are taken over integer pixel values (exact, so features are bit-identical on every
    run): per component with ``bincount`` over the foreground labels, per box by slicing.
    """
    hsv = np.asarray(Image.fromarray(rgb, "RGB").convert("HSV"), dtype=np.float64)
    values = rgb.astype(np.float64)
    # per pixel: R, G, B, R^2, G^2, B^2, S, V  (all integers)
    table = np.concatenate([values, values**2, hsv[:, :, 1:3]], axis=2)
    hue_bin = hsv[:, :, 0].astype(np.int64) * HUE_BINS // 256
    sat = hsv[:, :, 1]
    n_labels = len(areas)
    fg = labels > 0
    lab = labels[fg].astype(np.int64)
    fg_table = table[fg]
    by_label = np.stack(
        [np.bincount(lab, weights=fg_table[:, c], minlength=n_labels) for c in range(table.shape[2])], axis=1
    )
    hue_by_label = np.bincount(
        lab * HUE_BINS + hue_bin[fg], weights=sat[fg], minlength=n_labels * HUE_BINS
    ).reshape(n_labels, HUE_BINS)
    rows = []
    for k, (y0, y1, x0, x1) in zip(label_of, boxes):
        if k > 0:
            rows.append(np.concatenate([by_label[k], hue_by_label[k]]) / areas[k])
        else:
            box_hue = np.bincount(
                hue_bin[y0:y1, x0:x1].ravel(), weights=sat[y0:y1, x0:x1].ravel(), minlength=HUE_BINS
            )
            box_sums = table[y0:y1, x0:x1].reshape(-1, table.shape[2]).sum(axis=0)
            rows.append(np.concatenate([box_sums, box_hue]) / ((y1 - y0) * (x1 - x0)))
    means = np.stack(rows)
    mean = means[:, 0:3] / 255.0
    std = np.sqrt(np.maximum(means[:, 3:6] - means[:, 0:3] ** 2, 0.0)) / 255.0
    return np.concatenate([mean, std, means[:, 6:8] / 255.0, means[:, 8:] / 255.0], axis=1)


def _shape(
    boxes: np.ndarray, label_of: np.ndarray, labels: np.ndarray, foreground: np.ndarray, fg_count: np.ndarray
) -> np.ndarray:
    """The region's mask as MASK_SIDE x MASK_SIDE coverage, its fill ratio and log aspect ratio.

    Coverage is estimated from a regular grid of _SUPERSAMPLE x _SUPERSAMPLE points per cell
    placed in the box, so boxes smaller than the grid are upsampled and larger ones averaged alike.
    """
    n = MASK_SIDE * _SUPERSAMPLE
    t = (np.arange(n) + 0.5) / n
    y0, y1, x0, x1 = (boxes[:, i : i + 1] for i in range(4))
    sy = np.minimum((y0 + t[None, :] * (y1 - y0)).astype(np.int64), y1 - 1)
    sx = np.minimum((x0 + t[None, :] * (x1 - x0)).astype(np.int64), x1 - 1)
    sampled_labels = labels[sy[:, :, None], sx[:, None, :]]
    sampled_fg = foreground[sy[:, :, None], sx[:, None, :]]
    inside = np.where(label_of[:, None, None] > 0, sampled_labels == label_of[:, None, None], sampled_fg)
    coverage = inside.reshape(len(boxes), MASK_SIDE, _SUPERSAMPLE, MASK_SIDE, _SUPERSAMPLE).mean(axis=(2, 4))
    h, w = (y1 - y0)[:, 0], (x1 - x0)[:, 0]
    fill = fg_count / (h * w)
    aspect = np.log(w / h) / 2
    return np.concatenate([coverage.reshape(len(boxes), -1), fill[:, None], aspect[:, None]], axis=1)
