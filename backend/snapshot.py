"""What one snapshot of the server holds: the served models (embedding models and re-rankers),
their galleries, and the cards of every catalogued model; built and swapped by
:mod:`aoq_serve.registry`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aoq.checkpoint import Checkpoint
from aoq.embed import EncodedFragments
from aoq_serve.errors import ServiceError
from aoq_serve.index.faiss_index import LoadedIndex
from aoq_serve.search.gallery import GalleryView
from aoq_serve.store import catalogue, pictures
from aoq_serve.store.catalogue import SplitIds
from aoq_serve.store.model_info import ModelInfo


class Disabled(Exception):
    """A model cannot be served; the message is the reason shown to users."""


@dataclass(frozen=True)
class Gallery:
    """The gallery of a dataset as the service keeps it in memory: the ids and caption texts of
    its splits in id order, and what :class:`GalleryView` derives from them."""

    dataset_id: int
    dataset: str
    #: the evaluation split (ground-truth ranks, failure cases, metrics).
    split: str
    synthetic: bool
    ids: SplitIds
    captions: list[str]
    view: GalleryView
    #: :func:`aoq_serve.store.catalogue.gallery_digest` of the ids and captions read from the catalogue.
    digest: str

    def image_position(self, image_id: int) -> int | None:
        return catalogue.position(self.ids.image_ids, image_id)

    def caption_position(self, caption_id: int) -> int | None:
        return catalogue.position(self.ids.caption_ids, caption_id)


@dataclass(frozen=True)
class ServingModel:
    """A model that passed every check: its checkpoint, indexes and gallery."""

    info: ModelInfo
    model_id: int
    checkpoint: Checkpoint
    index: LoadedIndex
    gallery: Gallery
    report: dict[str, Any]
    mined_dir: str | None
    #: the files of the images this model shows, verified when it was loaded.
    images: pictures.ImagePaths
    #: set for a cross-attention model, served as a re-ranker of another model's shortlist.
    rerank: Reranking | None = None

    @property
    def name(self) -> str:
        return self.info.name


@dataclass(frozen=True)
class Reranking:
    """How a cross-attention model is served: it re-scores the top ``n`` items of ``base``'s FAISS
    search with its encoded gallery ``fragments`` (gallery positions as ``base``'s)."""

    base: ServingModel
    n: int
    fragments: EncodedFragments
    #: the gallery images' region terms (:func:`aoq_serve.index.rerank.gallery_region_stats`).
    stats: tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Snapshot:
    generation: int | None
    models: dict[str, ServingModel]
    infos: list[ModelInfo]
    loaded_at: float
    #: ``{image id: reason}``: picture files whose bytes differ from their recorded digest when
    #: the snapshot was loaded; ``/images`` answers 503 for them and ``/health`` names them.
    pictures: dict[int, str] = field(default_factory=dict)

    @property
    def disabled(self) -> dict[str, str]:
        return {i.name: i.disabled_reason or "disabled" for i in self.infos if not i.enabled}

    def get(self, name: str) -> ServingModel:
        """The served model called ``name``.

        Raises:
            ServiceError: 404 unknown model, 409 a known but disabled model (with the reason).
        """
        served = self.models.get(name)
        if served is not None:
            return served
        reason = self.disabled.get(name)
        if reason is not None:
            raise ServiceError(409, f"model {name!r} is disabled: {reason}")
        known = ", ".join(sorted(self.models)) or "none"
        raise ServiceError(404, f"unknown model {name!r}; served models: {known}")

    def without(self, reasons: dict[str, str]) -> Snapshot:
        """This snapshot with the models named in ``reasons`` disabled for those reasons."""
        # a re-ranker serves its shortlisting model's in-memory index: it goes with it
        reasons = {**{name: f"its shortlisting model {m.rerank.base.name!r} is disabled: {reasons[m.rerank.base.name]}"
                      for name, m in self.models.items() if m.rerank is not None and m.rerank.base.name in reasons},
                   **reasons}
        infos = [dataclasses.replace(i, enabled=False, disabled_reason=reasons[i.name]) if i.name in reasons else i
                 for i in self.infos]
        models = {name: m for name, m in self.models.items() if name not in reasons}
        return Snapshot(generation=self.generation, models=models, infos=infos, loaded_at=self.loaded_at,
                        pictures=self.pictures)

    def by_role(self, role: str) -> ServingModel | None:
        return next((m for m in self.models.values() if m.info.role == role), None)

    def default_pair(self) -> tuple[str, str]:
        """The baseline-role and aoq-role models, the default of the comparison endpoints.

        Raises:
            ServiceError: 404 when either role has no served model.
        """
        left, right = self.by_role("baseline"), self.by_role("aoq")
        if left is None or right is None:
            missing = " and ".join(r for r, m in (("baseline", left), ("aoq", right)) if m is None)
            raise ServiceError(404, f"no served model with role {missing}; name the two models explicitly")
        return left.name, right.name
