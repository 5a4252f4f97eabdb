"""What the server serves: an immutable snapshot of the loaded models, swapped atomically.

At start-up and on every reload each catalogued model is checked against its files: the
checkpoint's content hash, the index manifest's checkpoint hash and per-file hashes, each index's
vector count and file hash as recorded in the catalogue, and the index's ids against the
catalogue's gallery ids. A model failing any check is disabled with the reason (logged, and shown
by ``/health`` and ``/models``) instead of serving wrong results (docs/serving.md, Design notes).

The gallery's caption text, ids and image paths are checked too: ``aoq index`` records their
digests (:func:`aoq_serve.store.catalogue.gallery_digest`, ``paths_digest``) in each index manifest,
so a caption or path edited in the catalogue (or a damaged row) disables the models of that
gallery, on SQLite and PostgreSQL. The digests of the stored ranks are checked on every
``/failures`` read (:mod:`aoq_serve.search.failures`).

The snapshot's types (served models, galleries, re-rankers) are in :mod:`aoq_serve.snapshot`.
A request takes ``registry.current`` once and uses only that snapshot, so a reload never mixes
an old index with a new catalogue inside one answer: requests in flight finish on the old
snapshot while new ones see the new one.

Each picture file the models show is compared with the digest ``aoq index`` recorded
(:mod:`aoq_serve.store.pictures`): a file swapped on disk disables that picture, not the model.

The embeddings are read into memory, not memory-mapped, so a file truncated while serving cannot
kill the process (SIGBUS); on every tick the watcher still looks for index files written in
place (same inode, new size or time): one whose bytes no longer match its manifest hash
disables its model at once, with the file named in the reason (a restart would serve those bytes).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import numpy as np
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from aoq.checkpoint import Checkpoint, load_checkpoint
from aoq.io import ArtefactError, read_manifest, sha256_file
from aoq.names import CROSS_ATTENTION_ENCODERS
from aoq_serve.config import Settings
from aoq_serve.guards.faults import CATALOGUE, Faults, first_line
from aoq_serve.index.faiss_index import (
    MODALITIES,
    FileStamp,
    LoadedIndex,
    indexed_splits,
    load_model_index,
    read_generation,
)
from aoq_serve.index.rerank import load_rerank_index, shortlist_card
from aoq_serve.search.gallery import GalleryView, Span
from aoq_serve.store import catalogue, pictures
from aoq_serve.store.db import Model
from aoq_serve.store.model_info import ModelInfo, model_info
from aoq_serve.snapshot import Disabled, Gallery, Reranking, ServingModel, Snapshot
from aoq_serve.store.integrity import row_count_problem

log = logging.getLogger(__name__)


class _Loader:
    """Builds one snapshot; galleries are shared by the models of a dataset split."""

    def __init__(self, settings: Settings, session: Session, previous: Snapshot | None,
                 checker: pictures.PictureChecker) -> None:
        self.settings, self.session, self.previous, self.checker = settings, session, previous, checker
        self.galleries: dict[tuple[int, tuple[str, ...], str], Gallery] = {}
        self.paths: dict[tuple[int, str], tuple[np.ndarray, list[str | None], str]] = {}
        #: picture files found to differ from their digests, and the splits already compared.
        self.bad_pictures: dict[int, str] = {}
        self.compared: set[tuple[int, str]] = set()

    def gallery(self, dataset_id: int, splits: tuple[str, ...], eval_split: str) -> Gallery:
        """The gallery of ``splits`` (as the index lists them) with ``eval_split`` among them."""
        key = (dataset_id, splits, eval_split)
        if key not in self.galleries:
            dataset = catalogue.get_dataset(self.session, dataset_id)
            parts = [(catalogue.split_ids(self.session, dataset_id, s),
                      catalogue.caption_texts(self.session, dataset_id, s)) for s in splits]
            parts.sort(key=lambda part: int(part[0].image_ids[0]) if part[0].n_images else 0)
            ids = catalogue.joined_ids([p[0] for p in parts])
            texts = [t for _, split_texts in parts for t in split_texts]
            spans, images, captions = [], 0, 0
            for split_ids, _ in parts:
                spans.append(Span(split_ids.split, range(images, images + split_ids.n_images),
                                  range(captions, captions + len(split_ids.caption_ids))))
                images, captions = spans[-1].images.stop, spans[-1].captions.stop
            if eval_split not in splits:
                raise Disabled(f"the index holds splits {', '.join(splits)} but not the evaluation split "
                               f"{eval_split!r}; re-run aoq index")
            owners = np.searchsorted(ids.image_ids, ids.caption_image_ids)
            self.galleries[key] = Gallery(dataset_id, dataset.name, eval_split, dataset.synthetic, ids, texts,
                                          GalleryView(spans, owners, texts, eval_split),
                                          catalogue.gallery_digest(ids, texts))
        return self.galleries[key]

    def checkpoint(self, row: Model) -> Checkpoint:
        path = self.settings.models_dir / row.name
        if not path.is_dir():
            raise Disabled(f"checkpoint directory {path} is missing")
        old = self.previous.models.get(row.name) if self.previous else None
        if old is not None and old.checkpoint.content_hash == row.checkpoint_hash:
            # Reuse the loaded weights only when the files on disk still hash to this checkpoint:
            # a file truncated, flipped or deleted while serving disables the model now, not at
            # the next restart.
            try:
                if read_manifest(path, verify=True).get("content_hash") == row.checkpoint_hash:
                    return old.checkpoint
            except ArtefactError as exc:
                raise Disabled(f"checkpoint changed on disk while being served: {exc}") from None
        try:
            ckpt = load_checkpoint(path, device=self.settings.device)
        except ArtefactError as exc:
            raise Disabled(f"checkpoint cannot be loaded: {exc}") from None
        if ckpt.content_hash != row.checkpoint_hash:
            raise Disabled(
                f"checkpoint {path} has hash {ckpt.content_hash[:12]} but the catalogue indexed "
                f"{row.checkpoint_hash[:12]}; re-run aoq index"
            )
        return ckpt

    def index(self, row: Model, gallery: Gallery) -> LoadedIndex:
        path = self.settings.index_dir / row.name
        try:
            loaded = load_model_index(path)
        except ArtefactError as exc:
            raise Disabled(f"index cannot be loaded: {exc}") from None
        built_from = loaded.config.get("checkpoint_hash")
        if built_from != row.checkpoint_hash:
            raise Disabled(
                f"index {path} was built from checkpoint {str(built_from)[:12]} but the catalogue records "
                f"{row.checkpoint_hash[:12]}; re-run aoq index"
            )
        indexed = loaded.config.get("gallery_hash")
        if indexed is None:
            raise Disabled(f"index {path} records no digest of its gallery's captions (built by an older aoq index); "
                           f"re-run aoq index")
        if indexed != gallery.digest:
            raise Disabled(
                f"caption text in the catalogue differs from what index {path} was built from (the catalogue "
                f"was edited or damaged); re-run aoq index"
            )
        records = catalogue.index_records(self.session, row.id)
        expected = {"images": gallery.ids.image_ids, "captions": gallery.ids.caption_ids}
        for modality in MODALITIES:
            record = records.get(modality)
            if record is None:
                raise Disabled(f"the catalogue has no {modality} index for this model; re-run aoq index")
            count = loaded.faiss[modality].ntotal
            if record.vector_count != count or len(expected[modality]) != count:
                raise Disabled(
                    f"{modality} index holds {count} vectors, the catalogue records {record.vector_count} "
                    f"and the gallery has {len(expected[modality])}; re-run aoq index"
                )
            if record.file_hash != loaded.manifest["files"].get(f"{modality}.faiss"):
                raise Disabled(f"{modality} index file differs from the one the catalogue records; re-run aoq index")
            if not np.array_equal(loaded.ids[modality], expected[modality]):
                raise Disabled(f"{modality} index ids differ from the catalogue's gallery ids; re-run aoq index")
        return loaded

    def split_paths(self, dataset_id: int, split: str) -> tuple[np.ndarray, list[str | None], str]:
        """(image ids, paths, their digest) of a split, read once per snapshot."""
        key = (dataset_id, split)
        if key not in self.paths:
            ids = catalogue.split_ids(self.session, dataset_id, split).image_ids
            paths = catalogue.image_paths(self.session, dataset_id, split)
            self.paths[key] = (ids, paths, catalogue.paths_digest(ids, paths))
        return self.paths[key]

    def image_paths(self, row: Model, index: LoadedIndex) -> pictures.ImagePaths:
        """The image files of every split the model shows, checked against its index's digests."""
        recorded = index.config.get("paths_hash")
        if not isinstance(recorded, dict) or "ranks_hash" not in index.config:
            raise Disabled(f"index {index.path} records no digest of its image paths and ranks (built by an older "
                           f"aoq index); re-run aoq index")
        if sorted(index.config.get("picture_digests") or []) != sorted(recorded):
            raise Disabled(f"index {index.path} records no digests of its picture files (built by an older aoq "
                           f"index); re-run aoq index")
        ids, paths, digests = [], [], []
        for split, digest in sorted(recorded.items()):
            split_ids, split_paths, found = self.split_paths(row.dataset_id, split)
            if found != digest:
                raise Disabled(f"image paths of split {split!r} in the catalogue differ from what index {index.path} "
                               f"was built from (the catalogue was edited or damaged); re-run aoq index")
            split_digests = np.load(index.path / pictures.digests_file(split))
            if split_digests.shape != (len(split_ids), pictures.DIGEST_BYTES):
                raise Disabled(f"{index.path / pictures.digests_file(split)} holds {split_digests.shape[0]} digests "
                               f"for {len(split_ids)} images; re-run aoq index")
            if (row.dataset_id, split) not in self.compared:  # once per snapshot
                self.compared.add((row.dataset_id, split))
                self.bad_pictures.update(self.checker.compare(self.settings.data_dir, split_ids, split_paths,
                                                              split_digests))
            ids.append(split_ids)
            paths.extend(split_paths)
            digests.append(split_digests)
        return pictures.ImagePaths.of(np.concatenate(ids) if ids else np.zeros(0, np.int64), paths,
                             np.concatenate(digests) if digests else np.zeros((0, pictures.DIGEST_BYTES), np.uint8))

    def load_reranker(self, row: Model, served: dict[str, ServingModel]) -> ServingModel:
        """A cross-attention model over its shortlisting model (``served`` holds the embedding
        models of this snapshot, already loaded)."""
        path = self.settings.index_dir / row.name
        try:
            loaded = load_rerank_index(path)
        except ArtefactError as exc:
            raise Disabled(f"index cannot be loaded: {exc}") from None
        config = loaded.config
        if config.get("checkpoint_hash") != row.checkpoint_hash:
            raise Disabled(f"index {path} was built from checkpoint {str(config.get('checkpoint_hash'))[:12]} but the "
                           f"catalogue records {row.checkpoint_hash[:12]}; re-run aoq index")
        name, n = config["shortlist_by"], int(config["shortlist_n"])
        base = served.get(name)
        if base is None or base.rerank is not None:
            raise Disabled(f"it re-ranks the top {n} of model {name!r}, which is not served (disabled or missing)")
        if base.checkpoint.content_hash != config["shortlist_by_hash"]:
            raise Disabled(f"its shortlisting model {name!r} is another checkpoint than the one it was indexed with; "
                           f"re-run aoq index")
        if config.get("gallery_hash") != base.gallery.digest or not all(
                np.array_equal(loaded.ids[m], base.index.ids[m]) for m in MODALITIES):
            raise Disabled(f"index {path} holds another gallery than its shortlisting model {name!r}; re-run aoq index")
        ckpt = self.checkpoint(row)
        if not ckpt.model.pairwise:
            raise Disabled(f"checkpoint {row.name} is not a cross-attention model; re-run aoq index")
        index = LoadedIndex(path=path, manifest=loaded.manifest, faiss=base.index.faiss,
                            embeddings=base.index.embeddings, ids=base.index.ids, stamps=loaded.stamps)
        info = dataclasses.replace(model_info(row, base.gallery.dataset, True, None), shortlist_by=name, shortlist_n=n)
        return ServingModel(info=info, model_id=row.id, checkpoint=ckpt, index=index, gallery=base.gallery,
                            report=dict(row.report or {}), mined_dir=None, images=base.images,
                            rerank=Reranking(base, n, loaded.fragments, loaded.stats))

    def load(self, row: Model) -> ServingModel:
        dataset = catalogue.get_dataset(self.session, row.dataset_id)
        try:
            splits = indexed_splits(self.settings.index_dir / row.name, row.gallery_split)
        except ArtefactError as exc:
            raise Disabled(f"index cannot be loaded: {exc}") from None
        gallery = self.gallery(row.dataset_id, splits, row.gallery_split)
        index = self.index(row, gallery)
        images = self.image_paths(row, index)
        ckpt = self.checkpoint(row)
        return ServingModel(
            info=model_info(row, dataset.name, True, None), model_id=row.id, checkpoint=ckpt, index=index,
            gallery=gallery, report=dict(row.report or {}), mined_dir=row.mined_dir, images=images,
        )


def load_snapshot(settings: Settings, sessions: sessionmaker, previous: Snapshot | None = None,
                  checker: pictures.PictureChecker | None = None) -> Snapshot:
    """Check and load every catalogued model; failures become disabled entries, never exceptions."""
    generation = None
    try:
        generation = (read_generation(settings.index_dir) or {}).get("generation")
    except ArtefactError as exc:
        log.error("%s", exc)
    served: dict[str, ServingModel] = {}
    infos: list[ModelInfo] = []
    with sessions() as session:
        loader = _Loader(settings, session, previous, checker or pictures.PictureChecker())
        rows = catalogue.models(session)
        # the embedding models first: a re-ranker is served over one of them
        for row in sorted(rows, key=lambda r: r.image_encoder in CROSS_ATTENTION_ENCODERS):
            reranker = row.image_encoder in CROSS_ATTENTION_ENCODERS
            try:
                model = loader.load_reranker(row, served) if reranker else loader.load(row)
            except Disabled as exc:
                log.error("model %r disabled: %s", row.name, exc)
                dataset = catalogue.get_dataset(session, row.dataset_id)
                info = model_info(row, dataset.name if dataset else "", False, str(exc))
                infos.append(dataclasses.replace(info, **shortlist_card(settings.index_dir / row.name))
                             if reranker else info)
                continue
            served[row.name] = model
            infos.append(model.info)
    catalogued = {r.name for r in rows}
    for path in sorted(settings.models_dir.glob("*/manifest.json")) if settings.models_dir.is_dir() else []:
        name = path.parent.name
        # ".<name>.*" folders are atomic writes that a kill interrupted (aoq.io.atomic_dir), not models
        if name not in catalogued and not name.startswith("."):
            reason = "checkpoint is not in the catalogue; run aoq index"
            log.warning("model %r disabled: %s", name, reason)
            infos.append(ModelInfo(name=name, enabled=False, disabled_reason=reason))
    log.info("serving %d model(s): %s (generation %s)", len(served), ", ".join(served) or "none", generation)
    return Snapshot(generation=generation, models=served, infos=infos, loaded_at=time.time(),
                    pictures=loader.bad_pictures)


class Registry:
    """Holds the current snapshot; reloads on demand or when ``index.json`` changes."""

    def __init__(self, settings: Settings, sessions: sessionmaker, faults: Faults | None = None) -> None:
        self.settings, self.sessions = settings, sessions
        #: where the watcher records catalogue damage it finds (``/health``, and 503 on what reads it).
        self.faults = faults if faults is not None else Faults()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        #: kept across reloads: a picture file is hashed again only when its stamp changed.
        self.pictures = pictures.PictureChecker()
        self._snapshot = load_snapshot(settings, sessions, checker=self.pictures)

    @property
    def current(self) -> Snapshot:
        return self._snapshot

    def reload(self) -> Snapshot:
        """Build a new snapshot next to the current one, then swap (one reference assignment)."""
        with self._lock:
            self._snapshot = load_snapshot(self.settings, self.sessions, self._snapshot, self.pictures)
            return self._snapshot

    def _generation_on_disk(self) -> Any:
        try:
            return (read_generation(self.settings.index_dir) or {}).get("generation")
        except ArtefactError:
            return None

    def check_files(self) -> dict[str, str]:
        """Disable the served models whose index files were changed in place and no longer match
        their manifest hashes; returns ``{model: reason}`` of those disabled now."""
        with self._lock:
            snapshot, reasons = self._snapshot, {}
            for name, served in snapshot.models.items():
                index = served.index
                for file in index.changed_in_place():
                    path = index.path / file
                    if sha256_file(path) == index.manifest["files"].get(file):
                        index.stamps[file] = FileStamp.of(path)  # touched, same bytes
                        continue
                    reasons[name] = (f"{path} was changed in place while being served (content hash mismatch); "
                                     f"restore it or re-run aoq index")
                    break
            for name, reason in reasons.items():
                log.error("model %r disabled: %s", name, reason)
            if reasons:
                self._snapshot = snapshot.without(reasons)
            return reasons

    def check_rows(self) -> str | None:
        """Count the catalogue's rows per split against what was registered; a difference (a row
        deleted while serving) disables what reads the catalogue until a reload finds it sound."""
        try:
            with self.sessions() as session:
                problem = row_count_problem(session.connection())
        except SQLAlchemyError as exc:
            problem = f"the catalogue cannot be read ({first_line(exc)})"
        if problem is not None:
            self.faults.disable(CATALOGUE, problem)
        return problem

    def _watch(self) -> None:
        while not self._stop.wait(self.settings.reload_poll_s):
            try:
                self.check_files()
            except OSError:
                log.exception("checking the served index files failed")
            self.check_rows()
            on_disk = self._generation_on_disk()
            if on_disk is not None and on_disk != self._snapshot.generation:
                log.info("index generation %s on disk (serving %s): reloading", on_disk, self._snapshot.generation)
                try:
                    self.reload()
                except Exception:  # the old snapshot keeps serving; the next change retries
                    log.exception("reload failed; still serving generation %s", self._snapshot.generation)

    def start(self) -> None:
        if self.settings.reload_poll_s > 0 and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="aoq-index-watcher", daemon=True)
            self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None
