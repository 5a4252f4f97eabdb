"""Parallel, deterministic writing of the synthetic benchmark in both dataset layouts.

The work is cut into chunks of whole families; a process pool renders each chunk (scenes, PNG
files, captions, region features) and the parent writes the results **in chunk order**, so the
output does not depend on the number of workers or on their scheduling. Everything is built in a
temporary sibling of the output folder that is renamed into place only once complete.

Layout of ``out``::

    dataset_synth.json            Karpathy format (splits "train", "val", "test"); each image
                                  entry has "labels", its object classes ("shape:circle", ...),
                                  "facts", "family", "change", and each sentence its "facts"
    images/{train,val,test}/*.png the rendered pictures
    precomp/{train,dev,test}_ims.npy   (N, N_REGIONS, FEATURE_DIM) float32 region features
    precomp/{train,dev,test}_caps.txt  5 captions per image, image order
    precomp/{train,dev,test}_labels.json  labels per image: the scene's object classes
    precomp/{train,dev,test}_facts.jsonl  facts per image and per caption, family, change kind
    scenes.jsonl                  one line per image: split, index, file, family, objects,
                                  facts of the image and of each caption
    manifest.json                 kind "synthetic_dataset", arguments, per-file hashes
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import numpy as np
from tqdm import tqdm

from aoq.data.vocab import tokenize
from aoq.features import FEATURE_DIM, N_REGIONS, extract_regions
from aoq.io import ArtefactError, atomic_dir, read_manifest, write_manifest
from aoq_train.datasets.synth.captions import CAPTIONS_PER_IMAGE, caption_family
from aoq_train.datasets.synth.phrases import Caption
from aoq_train.datasets.synth.facts import scene_facts
from aoq_train.datasets.synth.render import png_bytes, render_scene
from aoq_train.datasets.synth.scenes import (
    STREAM_RENDER,
    SceneParams,
    family_plan,
    rng_for,
    sample_family,
)

log = logging.getLogger(__name__)
from aoq.io import check_replaceable

MANIFEST_KIND = "synthetic_dataset"
#: bump when the same arguments would produce different files.
GENERATOR_VERSION = 3
#: precomp split name -> Karpathy split name (the Karpathy JSON calls the dev split "val").
SPLITS: dict[str, str] = {"train": "train", "dev": "val", "test": "test"}
_CHUNK_IMAGES = 64


@dataclass(frozen=True)
class _Chunk:
    split: str
    seed: int
    params: SceneParams
    families: tuple[tuple[int, int, int], ...]  # (family id, first image index, size)
    image_dir: str


@dataclass
class _Rendered:
    index: int
    filename: str
    captions: list[Caption]
    features: np.ndarray
    scene: dict
    labels: list[str]
    facts: list[str]


def image_filename(split: str, index: int) -> str:
    """File name of image ``index`` of ``split`` (a precomp split name)."""
    return f"synth_{SPLITS[split]}_{index:06d}.png"


def write_dataset(
    out: str | Path,
    sizes: dict[str, int],
    seed: int = 0,
    params: SceneParams | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> dict:
    """Generate the benchmark into ``out`` (atomically replacing an earlier synthetic dataset).

    Args:
        out: output folder; must not exist, be empty, or hold an earlier synthetic dataset.
        sizes: images per split, keys among ``train``, ``dev``, ``test``, each >= 1.
        seed: the one seed everything derives from (>= 0).
        params: difficulty knobs and image size.
        workers: processes (default: all cores); the output is the same for every value.
        progress: show a progress bar per split.

    Returns:
        The manifest that was written.

    Raises:
        ValueError: a bad size, split or seed.
        ArtefactError: ``out`` holds something that is not a synthetic dataset.
    """
    params = params or SceneParams()
    workers = max(1, workers or os.cpu_count() or 1)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    for split, n in sizes.items():
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if n < 1:
            raise ValueError(f"the {split} split needs at least 1 image, got {n}")
    out = Path(out)
    check_replaceable(out, MANIFEST_KIND, "a synthetic dataset")
    config = {"seed": seed, "sizes": dict(sizes), "params": asdict(params), "generator_version": GENERATOR_VERSION}
    with atomic_dir(out) as tmp:
        tmp.chmod(0o755)  # a temporary folder is private (0700); a dataset is meant to be shared
        (tmp / "precomp").mkdir()
        next_imgid = 0
        with (
            open(tmp / "dataset_synth.json", "w", encoding="utf-8") as karpathy,
            open(tmp / "scenes.jsonl", "w", encoding="utf-8") as scenes,
        ):
            karpathy.write('{"dataset": "synth", "images": [\n')
            for split in (s for s in SPLITS if s in sizes):
                next_imgid = _write_split(
                    tmp, split, sizes[split], seed, params, workers, progress, karpathy, scenes, next_imgid
                )
            karpathy.write("\n]}\n")
        return write_manifest(
            tmp,
            MANIFEST_KIND,
            config,
            n_regions=N_REGIONS,
            feature_dim=FEATURE_DIM,
            captions_per_image=CAPTIONS_PER_IMAGE,
        )


def _write_split(
    root: Path,
    split: str,
    n: int,
    seed: int,
    params: SceneParams,
    workers: int,
    progress: bool,
    karpathy: IO[str],
    scenes: IO[str],
    first_imgid: int,
) -> int:
    """Write one split's images, features, captions and JSON entries; returns the next imgid."""
    image_dir = root / "images" / SPLITS[split]
    image_dir.mkdir(parents=True)
    features = np.lib.format.open_memmap(
        root / "precomp" / f"{split}_ims.npy", mode="w+", dtype=np.float32, shape=(n, N_REGIONS, FEATURE_DIM)
    )
    chunks = list(_chunks(split, n, seed, params, str(image_dir)))
    imgid = first_imgid
    labels: list[list[str]] = [[] for _ in range(n)]
    with (
        open(root / "precomp" / f"{split}_caps.txt", "w", encoding="utf-8") as caps,
        open(root / "precomp" / f"{split}_facts.jsonl", "w", encoding="utf-8") as facts,
        tqdm(total=n, desc=f"synth {split}", unit="img", disable=not progress) as bar,
    ):
        for rendered in _run(chunks, workers):
            for item in rendered:
                features[item.index] = item.features
                labels[item.index] = item.labels
                caption_facts = [list(c.facts) for c in item.captions]
                facts.write(json.dumps({"facts": item.facts, "captions": caption_facts, "family": item.scene["family"],
                                        "change": item.scene["variant"]}, sort_keys=True) + "\n")
                caps.writelines(c.text + "\n" for c in item.captions)
                sentids = list(range(imgid * CAPTIONS_PER_IMAGE, (imgid + 1) * CAPTIONS_PER_IMAGE))
                entry = {
                    "filepath": f"images/{SPLITS[split]}",
                    "filename": item.filename,
                    "split": SPLITS[split],
                    "imgid": imgid,
                    "labels": item.labels,
                    "facts": item.facts,
                    "family": item.scene["family"],
                    "change": item.scene["variant"],
                    "sentids": sentids,
                    "sentences": [
                        {"raw": c.text, "tokens": tokenize(c.text), "sentid": sid, "imgid": imgid, "facts": f}
                        for c, f, sid in zip(item.captions, caption_facts, sentids)
                    ],
                }
                karpathy.write(("" if imgid == 0 else ",\n") + json.dumps(entry, sort_keys=True))
                record = {"split": split, "index": item.index, "filename": item.filename, **item.scene,
                          "facts": item.facts, "caption_facts": caption_facts}
                scenes.write(json.dumps(record, sort_keys=True) + "\n")
                imgid += 1
            bar.update(len(rendered))
    features.flush()
    del features
    (root / "precomp" / f"{split}_labels.json").write_text(json.dumps(labels) + "\n", encoding="utf-8")
    return imgid


def _chunks(split: str, n: int, seed: int, params: SceneParams, image_dir: str) -> Iterator[_Chunk]:
    """Consecutive whole families, about ``_CHUNK_IMAGES`` images per chunk."""
    current: list[tuple[int, int, int]] = []
    count = 0
    for family, (start, size) in enumerate(family_plan(n, params, seed, split)):
        current.append((family, start, size))
        count += size
        if count >= _CHUNK_IMAGES:
            yield _Chunk(split, seed, params, tuple(current), image_dir)
            current, count = [], 0
    if current:
        yield _Chunk(split, seed, params, tuple(current), image_dir)


def _run(chunks: list[_Chunk], workers: int) -> Iterator[list[_Rendered]]:
    """Rendered chunks in input order, from a process pool when ``workers > 1``.

    The pool is closed and joined when every chunk is done (its workers exit on their own) and
    terminated only on an error or an interruption. Its workers take back the default SIGTERM and
    SIGINT: a forked worker inherits its parent's handlers (the demo's turns SIGTERM into
    KeyboardInterrupt), and a worker that survives ``terminate()`` leaves the parent joining it
    forever (seen once: a CI run hung in the demo's data step inside a container)."""
    if workers == 1 or len(chunks) == 1:
        yield from map(_render_chunk, chunks)
        return
    pool = multiprocessing.get_context().Pool(min(workers, len(chunks)), initializer=_default_signals)
    try:
        yield from pool.imap(_render_chunk, chunks)
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def _default_signals() -> None:
    """Pool worker initializer: SIGTERM and SIGINT back to their defaults (see :func:`_run`)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _render_chunk(chunk: _Chunk) -> list[_Rendered]:
    """Scenes, PNG files, captions and features of one chunk (runs in a worker process)."""
    out = []
    for family, start, size in chunk.families:
        scenes = sample_family(chunk.params, chunk.seed, chunk.split, family, size)
        captions = caption_family(scenes, chunk.seed, chunk.split, start, chunk.params.caption_detail,
                                  chunk.params.contrast_captions)
        for offset, scene in enumerate(scenes):
            index = start + offset
            image = render_scene(scene, chunk.params, rng_for(chunk.seed, chunk.split, STREAM_RENDER, index))
            filename = image_filename(chunk.split, index)
            data = png_bytes(image)
            with open(os.path.join(chunk.image_dir, filename), "wb") as fh:
                fh.write(data)
            out.append(_Rendered(index, filename, captions[offset], extract_regions(image), scene.to_dict(),
                                 scene.labels(), scene_facts(scene)))
    return out


def ensure_dataset(out: str | Path, sizes: dict[str, int], seed: int = 0, workers: int | None = None,
                   progress: bool = True, params: SceneParams | None = None) -> bool:
    """Generate the benchmark into ``out`` unless it already holds one of these sizes, seed and
    scene parameters (default: the defaults). Returns True when it generated, False when it skipped."""
    params = params or SceneParams()
    try:
        config = read_manifest(out, kind=MANIFEST_KIND, verify=False)["config"]
        if config.get("sizes") == dict(sizes) and config.get("seed") == seed and \
                config.get("generator_version") == GENERATOR_VERSION and config.get("params") == asdict(params):
            log.info("dataset %s: up to date, skipped", out)
            return False
    except ArtefactError:
        pass
    write_dataset(out, sizes, seed=seed, params=params, workers=workers, progress=progress)
    return True
