"""The index of a re-ranker: a cross-attention model's encoded gallery, written as one atomic
artefact directory beside the embedding models' indexes.

A cross-attention model (SCAN, BFAN) has no embedding for FAISS; it is served over another
model's FAISS shortlist (docs/serving.md, Re-rankers). Layout of ``<index_dir>/<model>/``::

    regions.npy       (n_images, R, d) float32 region vectors, row p = gallery image p
    words.npy         (total words, d) float32 word vectors, the captions' words one after another
    word_offsets.npy  (n_captions + 1,) int64: caption c's words are words[offsets[c]:offsets[c + 1]]
    region_gram.npy   (n_images, R, R) and region_sq.npy (n_images, R): each image's region terms
                      (:func:`aoq.models.attention.region_stats`), which no query changes: a
                      query's scoring skips its largest passes
    image_ids.npy     catalogue ids by position
    caption_ids.npy
    manifest.json     kind "aoq-rerank-index": model, checkpoint hash, the shortlisting model
                      (name and checkpoint hash) and N, the gallery's splits and digests,
                      per-file hashes

The fragments are stored in float32, as the model computed them, so the service's scores are
those of ``aoq evaluate --shortlist-by``: float16 would halve the disk, but BFAN's strict focal
threshold turns its rounding into score jumps of about 1e-2 on some pairs (docs/serving.md,
Re-rankers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aoq.embed import EncodedFragments
from aoq.models.attention import region_stats
from aoq.io import ArtefactError, atomic_dir, atomic_save_npy, read_manifest, write_manifest
from aoq_serve.index.faiss_index import FileStamp
from aoq_serve.index.shared import shared

KIND = "aoq-rerank-index"
#: how the fragments are stored and served.
STORED_DTYPE = np.float32
#: the default length of a re-ranker's shortlist (``aoq index --shortlist-n``).
DEFAULT_SHORTLIST_N = 100
_FILES = ("regions.npy", "words.npy", "word_offsets.npy", "region_gram.npy", "region_sq.npy", "image_ids.npy",
          "caption_ids.npy")
#: images per block when the region terms are computed.
STATS_BLOCK = 256


def is_rerank_index(path: Path) -> bool:
    """Whether ``path`` holds a re-ranker's index (its manifest's kind, not verified here)."""
    try:
        return read_manifest(path, verify=False).get("kind") == KIND
    except ArtefactError:
        return False


def gallery_region_stats(regions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The region terms of every gallery image, (G, R, R) and (G, R) float32, in blocks."""
    grams, sqs = [], []
    with torch.inference_mode():
        for first in range(0, len(regions), STATS_BLOCK):
            gram, sq = region_stats(torch.from_numpy(np.ascontiguousarray(regions[first:first + STATS_BLOCK])))
            grams.append(gram.numpy())
            sqs.append(sq.numpy())
    r = regions.shape[1]
    return (np.concatenate(grams) if grams else np.zeros((0, r, r), np.float32),
            np.concatenate(sqs) if sqs else np.zeros((0, r), np.float32))


def write_rerank_index(out: Path, fragments: EncodedFragments, ids: dict[str, np.ndarray],
                       meta: dict[str, Any]) -> dict[str, Any]:
    """Write a re-ranker's fragments, ids and manifest (``meta`` plus counts) into ``out`` atomically."""
    with atomic_dir(out) as tmp:
        atomic_save_npy(tmp / "regions.npy", fragments.regions.astype(STORED_DTYPE))
        atomic_save_npy(tmp / "words.npy", fragments.words.astype(STORED_DTYPE))
        atomic_save_npy(tmp / "word_offsets.npy", fragments.offsets.astype(np.int64))
        gram, sq = gallery_region_stats(fragments.regions)
        atomic_save_npy(tmp / "region_gram.npy", gram)
        atomic_save_npy(tmp / "region_sq.npy", sq)
        atomic_save_npy(tmp / "image_ids.npy", np.asarray(ids["images"], dtype=np.int64))
        atomic_save_npy(tmp / "caption_ids.npy", np.asarray(ids["captions"], dtype=np.int64))
        config = {**meta, "counts": {"images": int(fragments.n_images), "captions": int(fragments.n_captions)},
                  "regions": int(fragments.regions.shape[1]), "dim": int(fragments.regions.shape[2])}
        return write_manifest(tmp, KIND, config)


@dataclass(frozen=True)
class LoadedRerank:
    """A re-ranker's index as the server holds it (its fragments in memory)."""

    path: Path
    manifest: dict[str, Any]
    fragments: EncodedFragments
    #: each image's region terms, (G, R, R) and (G, R) (:func:`gallery_region_stats`).
    stats: tuple[np.ndarray, np.ndarray]
    ids: dict[str, np.ndarray]
    stamps: dict[str, FileStamp]

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]


def _read(path: Path) -> np.ndarray:
    # Read into memory, never memory-mapped (a mapped file truncated while serving is a SIGBUS).
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ArtefactError(f"{path}: not a readable array ({exc})") from None


def load_rerank_index(path: Path) -> LoadedRerank:
    """Verify (per-file hashes) and load a re-ranker's index directory.

    Raises:
        ArtefactError: missing, foreign or corrupted directory, inconsistent counts, or files
            that changed while they were being loaded.
    """
    stamps = {name: FileStamp.of(path / name) for name in _FILES if (path / name).is_file()}
    manifest = read_manifest(path, kind=KIND)
    arrays = {name: _read(path / name) for name in _FILES}
    # one copy of the fragments for all the server's workers, as the embeddings (aoq_serve.index.shared)
    fragments = EncodedFragments(shared(arrays["regions.npy"].astype(STORED_DTYPE, copy=False)),
                                 shared(arrays["words.npy"].astype(STORED_DTYPE, copy=False)), arrays["word_offsets.npy"])
    ids = {"images": arrays["image_ids.npy"], "captions": arrays["caption_ids.npy"]}
    stats = (shared(arrays["region_gram.npy"]), shared(arrays["region_sq.npy"]))
    counts = manifest["config"]["counts"]
    if not (fragments.n_images == len(ids["images"]) == counts["images"] == len(stats[0]) == len(stats[1])
            and fragments.n_captions == len(ids["captions"]) == counts["captions"]
            and int(fragments.offsets[-1]) == len(fragments.words)):
        raise ArtefactError(f"{path}: fragment counts differ from the ids and the manifest")
    if {name: FileStamp.of(path / name) for name in _FILES} != stamps:
        raise ArtefactError(f"{path}: files changed while the index was being loaded; load it again")
    return LoadedRerank(path=path, manifest=manifest, fragments=fragments, stats=stats, ids=ids, stamps=stamps)


def joined_fragments(parts: list[EncodedFragments]) -> EncodedFragments:
    """The fragments of consecutive gallery parts (splits in id order) as one gallery."""
    starts = np.cumsum([0] + [len(p.words) for p in parts[:-1]])
    offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, starts)]).astype(np.int64)
    return EncodedFragments(np.concatenate([p.regions for p in parts]), np.concatenate([p.words for p in parts]),
                            offsets)


def shortlist_card(path: Path) -> dict[str, Any]:
    """``shortlist_by`` and ``shortlist_n`` as a re-ranker's index records them (not verified:
    for the card of a model that may be disabled), or nothing when it records none."""
    try:
        config = read_manifest(path, kind=KIND, verify=False).get("config") or {}
    except ArtefactError:
        return {}
    return {key: config[key] for key in ("shortlist_by", "shortlist_n") if key in config}
