"""Writers of tiny datasets in the layouts users have on disk, for tests (import from here).

- :func:`write_precomp_fixture`: a SCAN-style ``*_precomp`` folder with ``(N, R, D)`` or ``(N, D)``
  float32 features and one caption per line.
- :func:`write_karpathy_fixture`: a Karpathy split JSON (COCO with ``restval`` and
  ``filepath``/``filename``, Flickr30K or Flickr8K with ``filename`` only) plus small PNG images.

Everything is a deterministic function of the arguments. Captions come from
:func:`fixture_captions` and name their image ("... in picture 7"), so a test can tell which
image a caption was read for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from aoq_train.datasets.synth.scenes import Scene, SceneParams, family_plan, sample_family

from aoq.io import atomic_save_npy, atomic_write_json, atomic_write_text

_COLOURS = ["red", "blue", "green", "yellow", "white", "black"]
_THINGS = ["dog", "cat", "man", "woman", "bus", "surfboard", "pizza", "train"]
_ACTIONS = ["sitting", "standing", "riding a wave", "playing", "parked", "lying"]
_PLACES = ["on the beach", "in the snow", "near a café", "on top of a table", "by the road"]

KARPATHY_DEFAULT_SPLITS: dict[str, dict[str, int]] = {
    "coco": {"train": 6, "restval": 2, "val": 3, "test": 3},
    "flickr30k": {"train": 6, "val": 3, "test": 3},
    "flickr8k": {"train": 6, "val": 3, "test": 3},
}


def fixture_captions(split: str, n_images: int, cpi: int = 5, seed: int = 0) -> list[str]:
    """The ``n_images * cpi`` captions the writers use for ``split``, image by image.

    Caption ``j`` of image ``i`` ends with "in picture {i}" (so it names its image); the words
    before it are drawn from a small COCO-like vocabulary, so frequent words pass a vocabulary
    threshold and the picture numbers mostly do not.
    """
    rng = np.random.default_rng([seed, sum(map(ord, split))])
    captions = []
    for i in range(n_images):
        for _ in range(cpi):
            colour, thing = rng.choice(_COLOURS), rng.choice(_THINGS)
            action, place = rng.choice(_ACTIONS), rng.choice(_PLACES)
            captions.append(f"A {colour} {thing} {action} {place} in picture {i}.")
    return captions


def write_precomp_fixture(
    root: str | Path,
    splits: dict[str, int] | None = None,
    regions: int | None = 4,
    dim: int = 16,
    cpi: int = 5,
    seed: int = 0,
    name: str = "coco_precomp",
    labelled: bool = False,
) -> Path:
    """Write ``root/name/{split}_ims.npy`` and ``{split}_caps.txt`` for each split.

    Args:
        root: parent folder (e.g. pytest's ``tmp_path``).
        splits: images per split (default ``{"train": 20, "dev": 5, "test": 5}``).
        regions: regions per image, giving ``(N, regions, dim)`` features; None gives ``(N, dim)``.
        dim: feature dimension.
        cpi: captions per image.
        seed: seeds features and captions.
        name: folder name.
        labelled: also write ``{split}_labels.json`` with :func:`fixture_labels`.

    Returns:
        The precomp folder.
    """
    folder = Path(root) / name
    rng = np.random.default_rng(seed)
    for split, n in (splits or {"train": 20, "dev": 5, "test": 5}).items():
        shape = (n, dim) if regions is None else (n, regions, dim)
        atomic_save_npy(folder / f"{split}_ims.npy", rng.standard_normal(shape).astype(np.float32))
        lines = fixture_captions(split, n, cpi, seed)
        atomic_write_text(folder / f"{split}_caps.txt", "".join(f"{c}\n" for c in lines))
        if labelled:
            atomic_write_json(folder / f"{split}_labels.json", fixture_labels(n))
    return folder


def fixture_labels(n_images: int) -> list[list[str]]:
    """Labels of image ``i``: ``group:{i % 3}`` and ``parity:{i % 2}``, so a test can count shared labels."""
    return [[f"group:{i % 3}", f"parity:{i % 2}"] for i in range(n_images)]


def write_karpathy_fixture(
    root: str | Path,
    kind: str = "coco",
    splits: dict[str, int] | None = None,
    cpi: int = 5,
    extra_sentences: int | None = None,
    image_size: int = 8,
    image_subdir: str | None = None,
    seed: int = 0,
) -> Path:
    """Write ``root/dataset_{kind}.json`` and one small PNG per image entry.

    Args:
        root: folder of the JSON.
        kind: ``"coco"`` (entries with ``filepath`` ``train2014``/``val2014``, ``filename``,
            ``cocoid``), ``"flickr30k"`` or ``"flickr8k"`` (``filename`` only).
        splits: images per Karpathy split label (``train``, ``restval``, ``val``, ``test``);
            default :data:`KARPATHY_DEFAULT_SPLITS` of ``kind``.
        cpi: sentences every image has at least.
        extra_sentences: additional sentences of the first image of every split label (COCO
            has images with 6-7 sentences); default 2 for COCO, 0 otherwise.
        image_size: side of the square PNGs.
        image_subdir: folder under ``root`` that holds the images (then pass it as the reader's
            ``image_root``); default None puts them where the JSON's paths resolve from ``root``.
        seed: seeds the entry order (splits are interleaved as in the real files) and captions.

    Returns:
        The JSON file's path.
    """
    if kind not in KARPATHY_DEFAULT_SPLITS:
        raise ValueError(f"kind must be one of {sorted(KARPATHY_DEFAULT_SPLITS)}, got {kind!r}")
    root = Path(root)
    image_root = root if image_subdir is None else root / image_subdir
    extra = (2 if kind == "coco" else 0) if extra_sentences is None else extra_sentences
    rng = np.random.default_rng(seed)
    entries = []
    for label, n in (splits or KARPATHY_DEFAULT_SPLITS[kind]).items():
        per_image = cpi + extra
        texts = fixture_captions(label, n, per_image, seed)
        for i in range(n):
            own = texts[i * per_image : (i + 1) * per_image]
            entries.append({"split": label, "sentences": own if i == 0 else own[:cpi]})
    order = rng.permutation(len(entries))
    images, sentid = [], 0
    for imgid, k in enumerate(order):
        entry = entries[k]
        record = _image_record(kind, imgid, entry["split"])
        record["sentences"] = []
        for raw in entry["sentences"]:
            tokens = raw.lower().rstrip(".").split()
            record["sentences"].append({"raw": raw, "tokens": tokens, "imgid": imgid, "sentid": sentid})
            sentid += 1
        record["sentids"] = [s["sentid"] for s in record["sentences"]]
        images.append(record)
        _write_png(image_root / record.get("filepath", "") / record["filename"], imgid, image_size)
    path = root / f"dataset_{kind}.json"
    atomic_write_json(path, {"images": images, "dataset": kind})
    return path


def _image_record(kind: str, imgid: int, label: str) -> dict:
    if kind == "coco":
        folder = "train2014" if label == "train" else "val2014"
        cocoid = 1000 + 7 * imgid  # distinct from imgid, so tests can tell which one was used
        return {"filepath": folder, "filename": f"COCO_{folder}_{cocoid:012d}.png",
                "cocoid": cocoid, "imgid": imgid, "split": label}
    if kind == "flickr30k":
        return {"filename": f"{1000092795 + 13 * imgid}.png", "imgid": imgid, "split": label}
    return {"filename": f"{1000268201 + imgid}_{imgid:010x}.png", "imgid": imgid, "split": label}


def _write_png(path: Path, index: int, size: int) -> None:
    """A flat colour with a lighter square, both from ``index``: distinct images, tiny files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    colour = ((37 * index) % 256, (91 * index + 40) % 256, (53 * index + 80) % 256)
    img = Image.new("RGB", (size, size), colour)
    img.paste(tuple(min(255, c + 100) for c in colour), (0, 0, size // 2, size // 2))
    img.save(path, format="PNG")


def write_tiny_config(path: Path, data: Path, **sections: dict) -> Path:
    """A run config for a tiny model on the fixture at ``data`` (2 epochs, batch 30), with
    ``sections`` merged into (or added to) its sections; returns ``path``."""
    tree: dict = {
        "name": "tiny",
        "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"embed_dim": 16, "word_dim": 8},
        "train": {"epochs": 2, "batch_size": 30, "lr": 0.002},
    }
    for name, values in sections.items():
        tree[name] = {**tree.get(name, {}), **values}
    path.write_text(yaml.safe_dump(tree))
    return path


def synth_scenes(params: SceneParams, n: int, split: str = "train", seed: int = 0) -> list[Scene]:
    """The first ``n`` scenes of a synthetic-benchmark split, in image order, without writing anything."""
    out: list[Scene] = []
    for family, (_, size) in enumerate(family_plan(n, params, seed, split)):
        out.extend(sample_family(params, seed, split, family, size))
    return out
