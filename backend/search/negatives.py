"""Hard negatives of a training item, the two kinds the AOQ method learns from (paper Fig. 3):

- offline: the top of the mined lists of the model's pipeline (``aoq.mined`` artefact,
  found through the ``mined_dir`` the catalogue records for the model);
- online: the hardest in-batch negatives of the anchor in a random batch of 128 training pairs
  scored by the model, as the max-violation loss would pick them.

The mined lists and the training split are loaded on first use and kept per model checkpoint.
Models with frozen pretrained backbones read the training split's backbone features from the
feature cache that training filled (``aoq.backbone_cache``), so a request runs only the
projection heads over the batch; without a cache entry (another machine, a cleared cache) the
backbone runs on the batch's pictures / captions instead, and the service never featurises a
whole split inside a request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from sqlalchemy.orm import sessionmaker

from aoq.backbone_cache import with_backbone_features
from aoq.data.dataset import DataError, SplitData
from aoq.data.facts import text_identity
from aoq.data.load import load_split
from aoq.data.loaders import load_pixels
from aoq.embed import encode_caption_inputs, encode_image_inputs, encode_texts
from aoq.io import ArtefactError
from aoq.mined import UNCHECKED, MinedNegatives, load_mined, removed_by
from aoq_serve.errors import ServiceError
from aoq_serve.guards.paths import safe_path, served_data_config
from aoq_serve.registry import ServingModel
from aoq_serve.store import catalogue
from aoq_serve.store.catalogue import SplitIds

Kind = Literal["caption", "image"]
#: the catalogue name of the training split and the size of the random batch (paper: 128).
TRAIN_SPLIT = "train"
BATCH_SIZE = 128
_CACHED_MODELS = 4
#: the rule ``Negative.correct`` follows (docs/evaluation.md): the same as the search pages' ticks.
CORRECT_RULE = "text"


@dataclass(frozen=True)
class Negative:
    """A negative: catalogue id, its text (a caption's, or an image's name: its first caption),
    the image it shows (the image itself, or a caption's image) and its rank or score."""

    id: int
    text: str
    image_id: int
    rank: int | None = None
    score: float | None = None
    #: filtered lists: the false-negative filter that removed this mined candidate (None: kept)
    removed_by: str | None = None
    #: a correct match of the anchor under the text rule (:data:`CORRECT_RULE`), not a negative at all
    correct: bool = False


@dataclass(frozen=True)
class NegativesResult:
    kind: Kind
    anchor_id: int
    #: the anchor caption's text, or the anchor image's name
    anchor_text: str
    #: the anchor image, or the anchor caption's image
    anchor_image_id: int
    offline: list[Negative]
    online: list[Negative]
    #: the false-negative filters of the mined lists (empty: unfiltered)
    filters: list[str]


@dataclass(frozen=True)
class _Training:
    mined: MinedNegatives
    ids: SplitIds
    split: SplitData
    image_size: int
    #: ``true_of(caption positions, image positions)``: the caption's text is one of the image's own.
    true_of: Callable[[np.ndarray, np.ndarray], np.ndarray]


class NegativesService:
    """Answers ``/negatives``; caches the training data of the last few models."""

    def __init__(self, data_dir: Path, sessions: sessionmaker) -> None:
        self.data_dir, self.sessions = data_dir, sessions
        self._cache: OrderedDict[tuple, _Training] = OrderedDict()
        self._lock = threading.Lock()

    def _training(self, served: ServingModel) -> _Training:
        if served.mined_dir is None:
            raise ServiceError(
                404, f"no mined negatives are registered for model {served.name!r} (its checkpoint records no mined_dir)"
            )
        key = (served.name, served.checkpoint.content_hash, served.mined_dir)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            training = self._load(served)
            self._cache[key] = training
            while len(self._cache) > _CACHED_MODELS:
                self._cache.popitem(last=False)
            return training

    def _load(self, served: ServingModel) -> _Training:
        try:
            # Hashes checked once per model (the result is cached): a corrupted list of the same
            # length would otherwise index out of the training split (a 500) or show wrong items.
            mined = load_mined(served.mined_dir)
        except ArtefactError as exc:
            raise ServiceError(404, f"the mined negatives of model {served.name!r} cannot be read: {exc}") from None
        with self.sessions() as session:
            dataset = catalogue.get_dataset(session, served.gallery.dataset_id)
            ids = catalogue.split_ids(session, dataset.id, TRAIN_SPLIT)
        if ids.n_images == 0:
            raise ServiceError(404, f"the training split of dataset {dataset.name!r} is not catalogued; re-run aoq index")
        data_cfg = served_data_config(self.data_dir, dataset.data_config)
        try:
            split = load_split(data_cfg, TRAIN_SPLIT)
            split = with_backbone_features(served.checkpoint.model, split, served.checkpoint.vocab,
                                           compute_missing=False)
        except DataError as exc:
            raise ServiceError(404, f"the training split of dataset {dataset.name!r} cannot be read: {exc}") from None
        if mined.img_top_caps.shape[0] != ids.n_images or mined.cap_top_imgs.shape[0] != len(ids.caption_ids):
            raise ServiceError(
                409,
                f"the mined negatives of model {served.name!r} cover {mined.img_top_caps.shape[0]} images, the "
                f"catalogued training split has {ids.n_images}; they are from another dataset",
            )
        return _Training(mined, ids, split, data_cfg.image_size, text_identity(split.captions, split.captions_per_image))

    def _image_inputs(self, served: ServingModel, training: _Training, positions: np.ndarray) -> torch.Tensor:
        """Model inputs of the training images at ``positions`` (increasing): region features,
        cached backbone features, or pixels."""
        if training.split.features is not None:
            return torch.from_numpy(np.array(training.split.features[positions], dtype=np.float32))
        if served.checkpoint.model.image_input == "features":
            raise ServiceError(404, "the training split has no features for this model")
        if training.split.image_paths is None:
            raise ServiceError(404, "the training split has no image files for this model")
        try:
            return torch.stack([
                load_pixels(safe_path(self.data_dir, training.split.image_paths[p]), training.image_size)
                for p in positions
            ])
        except DataError as exc:
            raise ServiceError(404, f"a training image cannot be read: {exc}") from None

    @staticmethod
    def _caption_embeddings(served: ServingModel, training: _Training, positions: np.ndarray) -> np.ndarray:
        """Joint-space vectors of the training captions at ``positions``: the text head over their
        cached backbone features, else the whole text encoder over the strings."""
        ckpt = served.checkpoint
        cached = training.split.caption_features
        if cached is None or training.split.caption_spans is not None:  # none, or token states: not a sentence's
            return encode_texts(ckpt.model, ckpt.vocab, [training.split.captions[p] for p in positions])
        features = torch.from_numpy(np.array(cached[positions], dtype=np.float32))
        lengths = torch.ones(len(positions), dtype=torch.long)  # unused by a head over features
        return encode_caption_inputs(ckpt.model, features, lengths)

    def negatives(self, served: ServingModel, kind: Kind, item_id: int, n: int, seed: int = 0) -> NegativesResult:
        """Offline and online hard negatives of a training caption or image (catalogue id).

        Raises:
            ServiceError: 404 no mined artefact for the model, or ``item_id`` is not a training
                item of the model's dataset.
        """
        training = self._training(served)
        ids, cpi = training.ids, training.split.captions_per_image
        anchor_ids = ids.caption_ids if kind == "caption" else ids.image_ids
        position = int(np.searchsorted(anchor_ids, item_id))
        if position >= len(anchor_ids) or int(anchor_ids[position]) != item_id:
            raise ServiceError(404, f"{kind} {item_id} is not a training {kind} of dataset {served.gallery.dataset!r}")
        captions = training.split.captions
        n_captions = len(captions)
        rng = np.random.default_rng([seed, position, 0 if kind == "caption" else 1])
        ckpt = served.checkpoint

        # Under the text rule a candidate sharing a caption text with the anchor (an emoji's twin
        # drawing, an identical caption) is a correct match: marked whether or not a filter removed it.
        def image(p: int, **measure) -> Negative:
            correct = bool(training.true_of(np.array([position]), np.array([p]))[0])
            return Negative(int(ids.image_ids[p]), captions[p * cpi], int(ids.image_ids[p]), correct=correct,
                            **measure)

        def caption(p: int, **measure) -> Negative:
            correct = bool(training.true_of(np.array([p]), np.array([position]))[0])
            return Negative(int(ids.caption_ids[p]), captions[p], int(ids.image_ids[p // cpi]), correct=correct,
                            **measure)

        if kind == "caption":
            offline = [image(p, rank=r, removed_by=why) for p, r, why in _mined(training.mined, "cap", position, n)]
            own_image = position // cpi
            others = rng.choice(n_captions - 1, size=min(BATCH_SIZE - 1, n_captions - 1), replace=False)
            batch_images = np.unique((others + (others >= position)) // cpi)
            batch_images = batch_images[batch_images != own_image]
            query = self._caption_embeddings(served, training, np.array([position]))[0]
            scores = encode_image_inputs(ckpt.model, self._image_inputs(served, training, batch_images)) @ query
            order = np.argsort(-scores, kind="stable")[:n]
            online = [image(int(batch_images[j]), score=float(scores[j])) for j in order]
            return NegativesResult(kind, item_id, captions[position], int(ids.image_ids[own_image]), offline, online,
                                   training.mined.filters)

        offline = [caption(p, rank=r, removed_by=why) for p, r, why in _mined(training.mined, "img", position, n)]
        others = rng.choice(n_captions, size=min(BATCH_SIZE - 1, n_captions), replace=False)
        batch_captions = others[others // cpi != position]
        query = encode_image_inputs(ckpt.model, self._image_inputs(served, training, np.array([position])))[0]
        scores = self._caption_embeddings(served, training, batch_captions) @ query
        order = np.argsort(-scores, kind="stable")[:n]
        online = [caption(int(batch_captions[j]), score=float(scores[j])) for j in order]
        return NegativesResult(kind, item_id, captions[position * cpi], item_id, offline, online,
                               training.mined.filters)


def _mined(mined: MinedNegatives, side: str, position: int, n: int) -> list[tuple[int, int, str | None]]:
    """(training position, 1-based rank in the mined list, filter that removed it) of the first
    ``n`` mined candidates of an anchor: of the raw list when the lists were filtered (up to the
    candidates the filters were evaluated on), else of the list round 2 samples from."""
    if mined.filtered is None:
        top = mined.cap_top_imgs if side == "cap" else mined.img_top_caps
        return [(int(p), r + 1, None) for r, p in enumerate(np.asarray(top[position][:n]))]
    raw, flags = mined.filtered[f"{side}_raw"][position][:n], mined.filtered[f"{side}_flags"][position][:n]
    checked = np.flatnonzero(np.asarray(flags) & UNCHECKED)
    stop = int(checked[0]) if len(checked) else len(flags)
    return [(int(p), r + 1, why) for r, (p, why) in enumerate(zip(raw[:stop], removed_by(flags[:stop], mined.filters)))]
