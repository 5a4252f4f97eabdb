"""Reader of Karpathy's split JSON (``dataset_coco.json``, ``dataset_flickr30k.json``,
``dataset_flickr8k.json``) plus the folder of images it points to.

Layout::

    {"dataset": "coco",
     "images": [{"filepath": "val2014", "filename": "COCO_val2014_000000391895.jpg",
                 "split": "train" | "restval" | "val" | "test",
                 "sentences": [{"raw": "A man ...", "tokens": [...], ...}, ...],
                 "imgid": 0, "cocoid": 391895, "sentids": [...]}, ...]}

Flickr30K/8K entries have no ``filepath`` (and no ``cocoid``). An entry may carry
``"labels": ["group:animals", ...]``, its image's labels (captions inherit them); either every
entry of the file has the key or none has. Splits are renamed to the ones the
rest of the project uses: ``train`` (COCO's ``restval`` joined to it, as VSE++/SCAN do: 113,287
COCO training images), ``dev`` (Karpathy ``val``) and ``test``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from aoq.data.dataset import DataError, DatasetDescription, SplitData
from aoq.data.facts import SplitFacts, check_facts
from aoq.io import parse_json

#: Karpathy split label -> project split name.
SPLIT_NAMES: dict[str, str] = {"train": "train", "restval": "train", "val": "dev", "test": "test"}
_SHOW_MISSING = 5


def read_karpathy(
    json_path: str | Path,
    image_root: str | Path | None = None,
    captions_per_image: int = 5,
    check_files: bool = True,
) -> DatasetDescription:
    """Read a Karpathy split JSON into train/dev/test splits of image paths and captions.

    Images keep the JSON order within each split (COCO ``train`` and ``restval`` entries stay
    interleaved as in the file). Each image keeps its first ``captions_per_image`` sentences:
    COCO has a few images with 6 or 7 sentences, and the field's protocol uses exactly 5 per
    image. A sentence's ``raw`` text is used (its whitespace collapsed to single spaces, so the
    caption fits on one line of a precomp captions file); entries with only ``tokens`` use them
    joined by spaces.

    Args:
        json_path: the ``dataset_*.json`` file.
        image_root: folder the image paths are relative to (default: the JSON's folder). COCO
            images are ``image_root/filepath/filename``, Flickr ones ``image_root/filename``.
        captions_per_image: sentences kept per image; an image with fewer is an error.
        check_files: check that every image file exists (one ``os.path.exists`` per image,
            about a second for COCO's 123K images); False defers errors to loading time.

    Returns:
        A :class:`DatasetDescription` with the non-empty splits among ``train``, ``dev`` and
        ``test``; image ids are the ``cocoid``, else the ``imgid``, else the file name, as str.

    Raises:
        DataError: missing or unreadable JSON, missing keys, unknown split labels, too few or
            empty sentences (naming the image), missing image files (listing the first ones).
    """
    json_path = Path(json_path)
    if not json_path.is_file():
        raise DataError(f"{json_path}: Karpathy split JSON not found")
    data = parse_json(json_path, DataError)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f'{json_path}: missing key "images" (the list of image entries)')
    root = json_path.parent if image_root is None else Path(image_root)

    columns: dict[str, dict[str, list[Any]]] = {
        name: {"captions": [], "ids": [], "paths": [], "labels": [], "entries": []} for name in ("train", "dev", "test")
    }
    for k, entry in enumerate(data["images"]):
        where = f"{json_path}: images[{k}]"
        split, image_id, path, captions = _read_entry(entry, where, root, captions_per_image)
        column = columns[split]
        column["captions"].extend(captions)
        column["ids"].append(image_id)
        column["paths"].append(path)
        column["labels"].append(_read_labels(entry, where))
        column["entries"].append(entry)
    if not any(c["ids"] for c in columns.values()):
        raise DataError(f"{json_path}: no images")
    labelled = _check_labels_everywhere(data["images"], json_path)
    with_facts = _check_labels_everywhere(data["images"], json_path, key="facts")
    if check_files:
        _check_files([p for c in columns.values() for p in c["paths"]], root)

    splits = {
        name: SplitData(
            name=name,
            captions=c["captions"],
            captions_per_image=captions_per_image,
            image_ids=c["ids"],
            image_paths=c["paths"],
            source=f"{json_path} (split {name})",
            extra={"format": "karpathy", "json": str(json_path)},
            labels=c["labels"] if labelled else None,
            facts=_read_facts(c["entries"], captions_per_image, f"{json_path} (split {name})") if with_facts else None,
        )
        for name, c in columns.items()
        if c["ids"]
    }
    name = data.get("dataset") if isinstance(data.get("dataset"), str) else json_path.stem
    return DatasetDescription(name=name, format="karpathy", root=root, splits=splits)


def _read_entry(entry: Any, where: str, root: Path, cpi: int) -> tuple[str, str, Path, list[str]]:
    """(project split, image id, image path, first ``cpi`` captions) of one image entry."""
    if not isinstance(entry, dict):
        raise DataError(f"{where}: an image entry must be an object, got {type(entry).__name__}")
    missing = [key for key in ("filename", "split", "sentences") if key not in entry]
    if missing:
        raise DataError(f"{where}: missing key(s) {', '.join(repr(m) for m in missing)}")
    filename = entry["filename"]
    label = f"{where} ({filename})"
    split = SPLIT_NAMES.get(entry["split"])
    if split is None:
        raise DataError(
            f"{label}: unknown split {entry['split']!r}; expected one of {', '.join(SPLIT_NAMES)}"
        )
    sentences = entry["sentences"]
    if not isinstance(sentences, list) or len(sentences) < cpi:
        count = len(sentences) if isinstance(sentences, list) else "no"
        raise DataError(f"{label}: has {count} sentences, {cpi} captions per image are needed")
    captions = [_sentence_text(s, f"{label}: sentence {j}") for j, s in enumerate(sentences[:cpi])]
    image_id = str(entry.get("cocoid", entry.get("imgid", filename)))
    return split, image_id, root / entry.get("filepath", "") / filename, captions


def _read_labels(entry: dict, where: str) -> list[str]:
    """The entry's ``labels`` (a list of non-empty strings), [] without the key."""
    labels = entry.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels):
        raise DataError(f'{where}: "labels" must be a list of non-empty strings')
    return labels


def _check_labels_everywhere(entries: list, json_path: Path, key: str = "labels") -> bool:
    """True when every entry has ``key``, False when none has; a mix is an error."""
    has = [isinstance(e, dict) and key in e for e in entries]
    if any(has) and not all(has):
        first = has.index(False)
        raise DataError(
            f'{json_path}: images[{first}] has no "{key}" but other entries do; '
            f"give every image a {key} list (it may be empty) or none"
        )
    return all(has)


def _read_facts(entries: list[dict], cpi: int, where: str) -> SplitFacts:
    """The ``facts`` of a split's entries and of their first ``cpi`` sentences."""
    captions = [s.get("facts", []) if isinstance(s, dict) else [] for e in entries for s in e["sentences"][:cpi]]
    has_family = all("family" in e for e in entries)
    facts = SplitFacts(
        [e["facts"] for e in entries],
        captions,
        np.asarray([e["family"] for e in entries], dtype=np.int64) if has_family else None,
        [e["change"] for e in entries] if all("change" in e for e in entries) else None,
    )
    return check_facts(facts, len(entries), cpi, where)


def _sentence_text(sentence: Any, where: str) -> str:
    if isinstance(sentence, dict) and isinstance(sentence.get("raw"), str):
        text = sentence["raw"]
    elif isinstance(sentence, dict) and isinstance(sentence.get("tokens"), list):
        text = " ".join(str(t) for t in sentence["tokens"])
    else:
        raise DataError(f'{where}: needs a "raw" string or a "tokens" list')
    text = " ".join(text.split())
    if not text:
        raise DataError(f"{where}: empty caption")
    return text


def _check_files(paths: list[Path], root: Path) -> None:
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        shown = ", ".join(str(p) for p in missing[:_SHOW_MISSING])
        more = f" and {len(missing) - _SHOW_MISSING} more" if len(missing) > _SHOW_MISSING else ""
        raise DataError(
            f"{root}: {len(missing)} of {len(paths)} images missing: {shown}{more} "
            f"(is the image folder right? set data.image_root, or pass check_files=False)"
        )
