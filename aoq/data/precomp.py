"""Reader of the SCAN/VSRN/AOQ "precomp" format: ``{split}_ims.npy`` + ``{split}_caps.txt``.

``{split}_ims.npy`` holds region features ``(N, R, D)`` (bottom-up attention: R=36, D=2048) or
global features ``(N, D)``; ``{split}_caps.txt`` one caption per line, image by image, so
``im_div = captions // images`` captions belong to each image. Features are memory-mapped:
COCO's 113K x 36 x 2048 float32 train split (~33 GB) is never read into RAM; the loaders copy
one row at a time.

Optional ``{split}_labels.json``: a JSON list with one list of label strings per image (in
image order), read into ``SplitData.labels``; captions inherit their image's labels.
Optional ``{split}_facts.jsonl``: structured facts of images and captions, read into
``SplitData.facts`` (:mod:`aoq.data.facts`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aoq.data.dataset import DataError, SplitData
from aoq.data.facts import read_facts_file
from aoq.io import parse_json

IMS_SUFFIX = "_ims.npy"
CAPS_SUFFIX = "_caps.txt"
LABELS_SUFFIX = "_labels.json"
FACTS_SUFFIX = "_facts.jsonl"


def available_splits(root: str | Path) -> list[str]:
    """Split names that have a features or a captions file in ``root`` (``train``, ``testall``...)."""
    root = Path(root)
    names = {p.name[: -len(IMS_SUFFIX)] for p in root.glob(f"*{IMS_SUFFIX}")}
    names |= {p.name[: -len(CAPS_SUFFIX)] for p in root.glob(f"*{CAPS_SUFFIX}")}
    return sorted(names)


def read_captions(path: str | Path) -> list[str]:
    """One caption per line, decoded as UTF-8 (a BOM is tolerated); only the line end is removed.

    Raises:
        DataError: the file is not UTF-8, is empty, or has an empty line (1-based line number).
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line} is not UTF-8 text ({exc.reason})") from None
    # split("\n") rather than splitlines(): captions may contain U+2028 & co., which are not
    # line ends in this format and would shift every following caption to the wrong image.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    captions = [line[:-1] if line.endswith("\r") else line for line in lines]
    if not captions:
        raise DataError(f"{path}: no captions (empty file)")
    for number, caption in enumerate(captions, start=1):
        if not caption.strip():
            raise DataError(f"{path}: line {number} is an empty caption")
    return captions


def load_features(path: str | Path) -> np.ndarray:
    """Memory-map a ``(N, R, D)`` or ``(N, D)`` numeric ``.npy`` array read-only.

    Raises:
        DataError: unreadable / truncated file, non-numeric dtype, wrong number of dimensions,
            or no rows.
    """
    path = Path(path)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy array ({exc})") from None
    if not isinstance(array, np.ndarray):
        raise DataError(f"{path}: expected a single .npy array, found an .npz archive")
    if array.ndim not in (2, 3):
        raise DataError(
            f"{path}: features must be (N, R, D) region or (N, D) global features, "
            f"got shape {array.shape} (ndim {array.ndim})"
        )
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise DataError(f"{path}: features must be numeric, got dtype {array.dtype}")
    if array.shape[0] == 0:
        raise DataError(f"{path}: no images (shape {array.shape})")
    return array


def read_precomp(
    root: str | Path,
    split: str,
    captions_per_image: int | None = None,
    max_images: int | None = None,
) -> SplitData:
    """Read one precomp split.

    Args:
        root: the folder holding ``{split}_ims.npy`` and ``{split}_caps.txt``.
        split: file prefix: ``train``, ``dev``, ``test``, SCAN's ``testall`` (COCO 5K), ...
        captions_per_image: expected captions per image; None infers ``captions // images``.
            Feature files with one (repeated) row per caption, as some VSE++ releases ship, are
            accepted when this is given: every ``captions_per_image``-th row is kept, which is
            the image the public evaluation code uses.
        max_images: keep only the first images (the public COCO code cuts dev to 1,000
            images = 5,000 captions).

    Returns:
        A :class:`SplitData` whose ``features`` is a read-only ``np.memmap`` and whose image ids
        are the row indices as strings.

    Raises:
        DataError: missing folder or file, unknown split (the available ones are listed), bad
            captions or features, caption count not a multiple of the image count.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: precomp folder not found")
    ims_path, caps_path = root / f"{split}{IMS_SUFFIX}", root / f"{split}{CAPS_SUFFIX}"
    if not ims_path.exists() and not caps_path.exists():
        available = ", ".join(available_splits(root)) or f"none (no *{IMS_SUFFIX} files)"
        raise DataError(f"{root}: unknown split {split!r}; available: {available}")
    for path in (ims_path, caps_path):
        if not path.is_file():
            raise DataError(f"{path}: missing (split {split!r} needs {ims_path.name} and {caps_path.name})")

    features = load_features(ims_path)
    captions = read_captions(caps_path)
    n_rows, n_caps = int(features.shape[0]), len(captions)
    if n_caps % n_rows:
        raise DataError(
            f"{caps_path}: {n_caps} captions is not a multiple of the {n_rows} images in {ims_path.name}"
        )
    im_div = n_caps // n_rows
    if captions_per_image is not None and im_div != captions_per_image:
        if im_div != 1 or n_caps % captions_per_image:
            raise DataError(
                f"{caps_path}: {n_caps} captions for {n_rows} images is {im_div} per image, "
                f"expected {captions_per_image}"
            )
        features = _one_row_per_image(features, captions_per_image, ims_path)
        im_div = captions_per_image

    data = SplitData(
        name=split,
        captions=captions,
        captions_per_image=im_div,
        image_ids=[str(i) for i in range(int(features.shape[0]))],
        features=features,
        source=f"{root} (split {split})",
        extra={"format": "precomp", "features_path": str(ims_path), "captions_path": str(caps_path)},
        labels=read_labels(root / f"{split}{LABELS_SUFFIX}", int(features.shape[0])),
        facts=read_facts_file(root / f"{split}{FACTS_SUFFIX}", int(features.shape[0]), im_div),
    )
    return data if max_images is None else data.subset(max_images)


def read_labels(path: Path, n_images: int) -> list[list[str]] | None:
    """``{split}_labels.json`` (a list of label lists, one per image), None when the file is absent.

    Raises:
        DataError: not valid JSON, not a list of lists of non-empty strings, wrong length.
    """
    if not path.is_file():
        return None
    labels = parse_json(path, DataError)
    if not isinstance(labels, list) or not all(
        isinstance(item, list) and all(isinstance(x, str) and x for x in item) for item in labels
    ):
        raise DataError(f"{path}: must be a JSON list with one list of label strings per image")
    if len(labels) != n_images:
        raise DataError(f"{path}: {len(labels)} label lists for {n_images} images")
    return labels


def _one_row_per_image(features: np.ndarray, cpi: int, path: Path) -> np.ndarray:
    """Every ``cpi``-th row of a feature file that repeats each image once per caption."""
    # Checking the first group is cheap and catches the real mistake: a file whose rows are
    # genuinely different images (then captions_per_image must be 1).
    first = np.asarray(features[:cpi])
    if not (first == first[:1]).all():
        raise DataError(
            f"{path}: one feature row per caption, but rows 0..{cpi - 1} differ, so they are not "
            f"one image repeated; set data.captions_per_image=1 for this dataset"
        )
    return features[::cpi]
