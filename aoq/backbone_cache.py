"""Backbone features of frozen pretrained encoders, computed once per split and cached on disk.

With a frozen backbone, training only runs the projection heads, so the backbone's outputs can
be computed once: the pooled 1280-d EfficientNet-Lite0 vector of every image and the 384-d
MiniLM sentence vector of every caption. They are cached under a key that is the SHA-256 of

- the backbone's identity (package, version, SHA-256 of its weights file),
- the preprocessing version (``IMAGE_PREPROCESS`` / ``TEXT_PREPROCESS``),
- the content: SHA-256 of every image file, in split order / the caption strings, in order;

so any change to the weights, the preprocessing, an image's bytes or a caption gives a new
entry, and moving a dataset does not. Layout::

    <root>/<backbone>/<key>/features.npy    float32 (rows, dim), read as a memory map
    <root>/<backbone>/<key>/manifest.json   kind "backbone-features", the key's inputs, file hash

Each entry is written atomically (``aoq.io.atomic_dir``) and verified when read; a damaged
entry is recomputed. ``<root>`` is ``$AOQ_FEATURE_CACHE``, else ``~/.cache/aoq/features``.

Fine-tuned backbones (``model.image_finetune_blocks`` / ``text_finetune_layers`` > 0) bypass the
cache: their outputs change every step, and caching the activations below the trained units
would cost a (49 x channels)-float map per image for a saving that only matters on big runs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from aoq.data.dataset import DataError, SplitData
from aoq.data.loaders import ImageMode, TextMode, load_pixels, pad_tokens
from aoq.io import (
    ArtefactError,
    atomic_dir,
    read_manifest,
    sha256_file,
    sha256_json,
    write_manifest,
)
from aoq.models.joint import JointModel
from aoq.models.pretrained import (
    IMAGE_PREPROCESS,
    TEXT_PREPROCESS,
    EffNetImageEncoder,
    MiniLMTextEncoder,
    WordPieceVocab,
)

log = logging.getLogger(__name__)

CACHE_ENV = "AOQ_FEATURE_CACHE"
KIND = "backbone-features"
FEATURES = "features.npy"
_MARK = "backbone_features"


def cache_root(root: str | Path | None = None) -> Path:
    """``root``, else ``$AOQ_FEATURE_CACHE``, else ``~/.cache/aoq/features``."""
    if root is not None:
        return Path(root)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "aoq" / "features"


@dataclass
class CachedFeatures:
    """One cache entry: ``features`` (rows, dim) float32 memory map, its folder, and whether it was
    already there (``hit``) or computed by this call."""

    features: np.ndarray
    path: Path
    hit: bool


def cached_features(root: Path, key_inputs: dict, compute: Callable[[], np.ndarray], rows: int) -> CachedFeatures:
    """Return the entry for ``key_inputs``, computing and storing it on a miss.

    Args:
        root: the cache root.
        key_inputs: JSON-able; its ``backbone.name`` names the subfolder, its SHA-256 the entry.
        compute: makes the (rows, dim) float32 array on a miss.
        rows: the expected number of rows (an entry with another count is recomputed).
    """
    key = sha256_json(key_inputs)
    folder = root / key_inputs["backbone"]["name"] / key
    if folder.is_dir():
        try:
            read_manifest(folder, kind=KIND)
            features = np.load(folder / FEATURES, mmap_mode="r")
            if features.shape[0] == rows:
                return CachedFeatures(features, folder, hit=True)
            log.warning("%s: %d rows, expected %d; recomputing", folder, features.shape[0], rows)
        except (ArtefactError, OSError, ValueError) as exc:
            log.warning("%s: unusable cache entry (%s); recomputing", folder, exc)
    array = np.ascontiguousarray(compute(), dtype=np.float32)
    if array.shape[0] != rows:
        raise ValueError(f"computed {array.shape[0]} feature rows, expected {rows}")
    with atomic_dir(folder) as tmp:
        np.save(tmp / FEATURES, array)
        write_manifest(tmp, KIND, key_inputs, key=key, shape=list(array.shape))
    return CachedFeatures(np.load(folder / FEATURES, mmap_mode="r"), folder, hit=False)


@torch.inference_mode()
def image_backbone_features(encoder: EffNetImageEncoder, paths: Sequence[Path], batch_size: int = 32,
                            progress: bool = False) -> np.ndarray:
    """Pooled EfficientNet-Lite0 features of image files, (len(paths), 1280) float32."""
    device = next(encoder.parameters()).device
    out = [np.zeros((0, encoder.feature_dim), np.float32)]
    for start in tqdm(range(0, len(paths), batch_size), desc="EfficientNet-Lite0 features", disable=not progress,
                      leave=False):
        pixels = torch.stack([load_pixels(p, encoder.input_size) for p in paths[start:start + batch_size]])
        out.append(encoder.backbone_features(pixels.to(device)).float().cpu().numpy())
    return np.concatenate(out)


@torch.inference_mode()
def caption_backbone_features(encoder: MiniLMTextEncoder, vocab: WordPieceVocab, captions: Sequence[str],
                              batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """Mean-pooled, L2-normalised MiniLM vectors of captions, (len(captions), 384) float32."""
    device = next(encoder.parameters()).device
    ids = [torch.tensor(vocab.encode(c), dtype=torch.long) for c in captions]
    # Batches of similar lengths waste little time on padding; rows go back to caption order.
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    out = np.zeros((len(ids), encoder.feature_dim), np.float32)
    for start in tqdm(range(0, len(order), batch_size), desc="MiniLM features", disable=not progress, leave=False):
        rows = order[start:start + batch_size]
        tokens, lengths = pad_tokens([ids[k] for k in rows])
        out[rows] = encoder.backbone_features(tokens.to(device), lengths).float().cpu().numpy()
    return out


def cached_modalities(model: JointModel) -> tuple[bool, bool]:
    """Whether the model's image / text encoder has a frozen pretrained backbone (cacheable)."""
    image = isinstance(model.image_encoder, EffNetImageEncoder) and model.image_encoder.is_frozen
    text = isinstance(model.text_encoder, MiniLMTextEncoder) and model.text_encoder.is_frozen
    return image, text


def input_modes(model: JointModel) -> tuple[ImageMode, TextMode]:
    """The dataset modes to feed ``model`` a split prepared by :func:`with_backbone_features`."""
    image, text = cached_modalities(model)
    return ("features" if image else model.image_input), ("features" if text else "tokens")  # type: ignore[return-value]


def with_backbone_features(model: JointModel, split: SplitData, vocab, *, root: str | Path | None = None,
                           progress: bool = False) -> SplitData:
    """The split with the cached backbone features of ``model``'s frozen pretrained encoders in
    ``features`` (images) and ``caption_features`` (captions); the split itself when there are none.

    Raises:
        DataError: an image backbone needs image files and the split has none.
    """
    image, text = cached_modalities(model)
    if not (image or text):
        return split
    want = {"image": model.image_encoder.identity.to_dict() if image else None,
            "text": model.text_encoder.identity.to_dict() if text else None}
    if split.extra.get(_MARK) == want:
        return split
    base = cache_root(root)
    features, caption_features = split.features, split.caption_features
    if image:
        if split.image_paths is None:
            raise DataError(f"{split.source}: model.image_encoder=effnet_lite0 needs the image files, and this "
                            "split has none (use the Karpathy JSON of the dataset)")
        enc: EffNetImageEncoder = model.image_encoder  # type: ignore[assignment]
        paths = list(split.image_paths)
        inputs = {"backbone": want["image"], "preprocess": IMAGE_PREPROCESS,
                  "files_sha256": sha256_json([sha256_file(p) for p in paths])}
        entry = cached_features(base, inputs, lambda: image_backbone_features(enc, paths, progress=progress),
                                len(paths))
        log.info("%s %s image features: %s", "cached" if entry.hit else "computed", split.name, entry.path)
        features = entry.features
    if text:
        tenc: MiniLMTextEncoder = model.text_encoder  # type: ignore[assignment]
        inputs = {"backbone": want["text"], "preprocess": TEXT_PREPROCESS,
                  "captions_sha256": sha256_json(split.captions)}
        entry = cached_features(base, inputs, lambda: caption_backbone_features(tenc, vocab, split.captions,
                                                                               progress=progress), split.n_captions)
        log.info("%s %s caption features: %s", "cached" if entry.hit else "computed", split.name, entry.path)
        caption_features = entry.features
    return dataclasses.replace(split, features=features, caption_features=caption_features,
                               extra={**split.extra, _MARK: want})
