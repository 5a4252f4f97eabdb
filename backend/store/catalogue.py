"""Reading and writing the catalogue: datasets, splits, images, captions, models, indexes, ranks.

Registration is idempotent: registering a split whose content is already catalogued returns the
existing ids, so a rebuilt index keeps every id a running server (and its old index) knows. A
split whose content changed on disk is refused instead of silently renumbered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from aoq.data.dataset import SplitData
from aoq.io import ArtefactError
from aoq_serve.store.db import (
    Caption,
    Dataset,
    DatasetSplit,
    Image,
    IndexRecord,
    Model,
    QueryRank,
    utcnow,
)

#: rows per INSERT statement when registering large splits (COCO train: 566K captions).
_CHUNK = 20_000


class CatalogueError(ArtefactError):
    """The catalogue disagrees with the data or artefacts on disk; the message says how."""


@dataclass(frozen=True)
class SplitIds:
    """Catalogue ids of a split, by position: image ``p`` is ``image_ids[p]``, and so on."""

    dataset_id: int
    split: str
    image_ids: np.ndarray
    caption_ids: np.ndarray
    #: ``caption_image_ids[c]``: catalogue id of the image of the split's caption ``c``.
    caption_image_ids: np.ndarray

    @property
    def n_images(self) -> int:
        return len(self.image_ids)


def position(sorted_ids: np.ndarray, item_id: int) -> int | None:
    """Position of ``item_id`` in an increasing id array (ids are assigned in position order)."""
    p = int(np.searchsorted(sorted_ids, item_id))
    return p if p < len(sorted_ids) and int(sorted_ids[p]) == item_id else None


def joined_ids(parts: list[SplitIds]) -> SplitIds:
    """Splits of one dataset as one gallery, in the given order (its ``split`` names them, joined
    by ``+``)."""
    return SplitIds(
        dataset_id=parts[0].dataset_id,
        split="+".join(p.split for p in parts),
        image_ids=np.concatenate([p.image_ids for p in parts]),
        caption_ids=np.concatenate([p.caption_ids for p in parts]),
        caption_image_ids=np.concatenate([p.caption_image_ids for p in parts]),
    )


def split_content_hash(split: SplitData, image_paths: list[str] | None) -> str:
    """Identity of a split's content: its captions, captions per image and image files."""
    h = hashlib.sha256()
    h.update(f"{split.n_images}:{split.captions_per_image}\n".encode())
    for caption in split.captions:
        h.update(caption.encode("utf-8") + b"\n")
    for path in image_paths or []:
        h.update(path.encode("utf-8") + b"\n")
    return h.hexdigest()


def gallery_digest(ids: SplitIds, captions: list[str]) -> str:
    """Identity of a gallery as the service serves it: its image, caption and caption-to-image
    ids and every caption's text. ``aoq index`` records it in each index manifest; the server
    recomputes it from the catalogue, so an edited or damaged caption row is detected."""
    h = hashlib.sha256()
    for array in (ids.image_ids, ids.caption_ids, ids.caption_image_ids):
        h.update(np.ascontiguousarray(array, dtype="<i8").tobytes())
    for text in captions:
        encoded = text.encode("utf-8")
        h.update(len(encoded).to_bytes(8, "little") + encoded)
    return h.hexdigest()


def paths_digest(image_ids: np.ndarray, paths: list[str | None]) -> str:
    """Identity of which file each gallery image is served from. ``aoq index`` records it in each
    index manifest, so two swapped ``images.path`` values disable the model instead of serving
    the wrong picture."""
    h = hashlib.sha256(np.ascontiguousarray(image_ids, dtype="<i8").tobytes())
    for path in paths:
        encoded = b"\0" if path is None else b"/" + path.encode("utf-8")  # None and "" differ
        h.update(len(encoded).to_bytes(8, "little") + encoded)
    return h.hexdigest()


def ranks_digest(query_ids: np.ndarray, ranks: np.ndarray) -> str:
    """Identity of a model's stored ground-truth ranks of one direction, in query id order (what
    ``/failures`` reads); recorded by ``aoq index`` and checked on every read."""
    order = np.argsort(query_ids, kind="stable")
    h = hashlib.sha256(np.ascontiguousarray(np.asarray(query_ids)[order], dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(np.asarray(ranks)[order], dtype="<f8").tobytes())
    return h.hexdigest()


def get_or_create_dataset(
    session: Session, name: str, fmt: str, synthetic: bool, captions_per_image: int, data_config: dict[str, Any]
) -> Dataset:
    """The dataset row called ``name``, created or updated to the given description."""
    dataset = session.scalar(select(Dataset).where(Dataset.name == name))
    if dataset is None:
        dataset = Dataset(name=name, format=fmt, synthetic=synthetic, captions_per_image=captions_per_image,
                          data_config=data_config)
        session.add(dataset)
        session.flush()
    elif dataset.captions_per_image != captions_per_image or dataset.format != fmt:
        raise CatalogueError(
            f"dataset {name!r} is catalogued as {dataset.format} with {dataset.captions_per_image} "
            f"captions per image, the data on disk is {fmt} with {captions_per_image}; use a fresh catalogue"
        )
    else:
        dataset.synthetic, dataset.data_config = synthetic, data_config
    return dataset


def _next_id(session: Session, column: Any) -> int:
    return int(session.scalar(select(func.max(column))) or 0) + 1


def register_split(
    session: Session,
    dataset: Dataset,
    split_name: str,
    split: SplitData,
    image_paths: list[str] | None,
    image_sizes: list[tuple[int, int]] | None,
) -> SplitIds:
    """Catalogue a split's images and captions (or find them, when already catalogued).

    Args:
        split_name: the name used in the catalogue (``train``, ``test``...).
        image_paths: image file paths relative to the data directory, or None (features only).
        image_sizes: (width, height) per image, or None.

    Raises:
        CatalogueError: the split is catalogued with different content.
    """
    digest = split_content_hash(split, image_paths)
    record = session.scalar(
        select(DatasetSplit).where(DatasetSplit.dataset_id == dataset.id, DatasetSplit.name == split_name)
    )
    if record is not None:
        if record.content_hash != digest:
            raise CatalogueError(
                f"dataset {dataset.name!r} split {split_name!r} changed on disk since it was catalogued "
                f"({split.n_images} images now, {record.n_images} catalogued); ids would no longer "
                f"match: index into a fresh catalogue"
            )
        return split_ids(session, dataset.id, split_name)

    first_image, first_caption = _next_id(session, Image.id), _next_id(session, Caption.id)
    cpi = split.captions_per_image
    images = [
        {
            "id": first_image + p,
            "dataset_id": dataset.id,
            "split": split_name,
            "position": p,
            "external_id": str(split.image_ids[p])[:200],
            "path": None if image_paths is None else image_paths[p],
            "width": None if image_sizes is None else image_sizes[p][0],
            "height": None if image_sizes is None else image_sizes[p][1],
        }
        for p in range(split.n_images)
    ]
    captions = [
        {
            "id": first_caption + c,
            "dataset_id": dataset.id,
            "split": split_name,
            "position": c,
            "image_id": first_image + c // cpi,
            "text": text,
        }
        for c, text in enumerate(split.captions)
    ]
    for table, rows in ((Image, images), (Caption, captions)):
        for start in range(0, len(rows), _CHUNK):
            session.execute(insert(table), rows[start : start + _CHUNK])
    session.add(
        DatasetSplit(dataset_id=dataset.id, name=split_name, n_images=split.n_images,
                     n_captions=split.n_captions, content_hash=digest)
    )
    session.flush()
    return split_ids(session, dataset.id, split_name)


def split_ids(session: Session, dataset_id: int, split_name: str) -> SplitIds:
    """The ids of a catalogued split, in position order."""
    images = session.execute(
        select(Image.id).where(Image.dataset_id == dataset_id, Image.split == split_name).order_by(Image.position)
    ).scalars().all()
    caps = session.execute(
        select(Caption.id, Caption.image_id)
        .where(Caption.dataset_id == dataset_id, Caption.split == split_name)
        .order_by(Caption.position)
    ).all()
    return SplitIds(
        dataset_id=dataset_id,
        split=split_name,
        image_ids=np.asarray(images, dtype=np.int64),
        caption_ids=np.asarray([c[0] for c in caps], dtype=np.int64),
        caption_image_ids=np.asarray([c[1] for c in caps], dtype=np.int64),
    )


def caption_texts(session: Session, dataset_id: int, split_name: str) -> list[str]:
    """Caption texts of a split in position order (the service keeps the gallery's in memory)."""
    return list(
        session.execute(
            select(Caption.text)
            .where(Caption.dataset_id == dataset_id, Caption.split == split_name)
            .order_by(Caption.position)
        ).scalars()
    )


def image_paths(session: Session, dataset_id: int, split_name: str) -> list[str | None]:
    """Image paths of a split in position order (the service keeps the gallery's in memory)."""
    return list(
        session.execute(
            select(Image.path).where(Image.dataset_id == dataset_id, Image.split == split_name).order_by(Image.position)
        ).scalars()
    )


def query_ranks(session: Session, model_id: int, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, ranks) of a model's stored ranks of one direction, in query id order."""
    rows = session.execute(
        select(QueryRank.query_id, QueryRank.rank)
        .where(QueryRank.model_id == model_id, QueryRank.direction == direction)
        .order_by(QueryRank.query_id)
    ).all()
    return np.asarray([r[0] for r in rows], dtype=np.int64), np.asarray([r[1] for r in rows], dtype=np.float64)


def upsert_model(session: Session, name: str, **fields: Any) -> Model:
    """Create or update the model called ``name``; its old index records and ranks are dropped."""
    model = session.scalar(select(Model).where(Model.name == name))
    if model is None:
        model = Model(name=name, **fields)
        session.add(model)
    else:
        for key, value in fields.items():
            setattr(model, key, value)
        model.registered_at = utcnow()
        session.execute(delete(IndexRecord).where(IndexRecord.model_id == model.id))
        session.execute(delete(QueryRank).where(QueryRank.model_id == model.id))
    session.flush()
    return model


def add_index_record(
    session: Session, model: Model, modality: str, index_type: str, vector_count: int, dim: int,
    file_hash: str, params: dict[str, Any], built_at: datetime,
) -> None:
    session.add(
        IndexRecord(model_id=model.id, modality=modality, index_type=index_type, vector_count=vector_count,
                    dim=dim, file_hash=file_hash, params=params, built_at=built_at)
    )


def store_ranks(session: Session, model: Model, direction: str, query_ids: np.ndarray, ranks: np.ndarray) -> None:
    """Store 1-based full-gallery ranks of the ground truth of each test query."""
    rows = [
        {"model_id": model.id, "direction": direction, "query_id": int(q), "rank": float(r)}
        for q, r in zip(query_ids, ranks)
    ]
    for start in range(0, len(rows), _CHUNK):
        session.execute(insert(QueryRank), rows[start : start + _CHUNK])


def models(session: Session) -> list[Model]:
    return list(session.scalars(select(Model).order_by(Model.name)))


def index_records(session: Session, model_id: int) -> dict[str, IndexRecord]:
    """The model's index records keyed by modality."""
    rows = session.scalars(select(IndexRecord).where(IndexRecord.model_id == model_id))
    return {r.modality: r for r in rows}


def datasets(session: Session) -> list[tuple[Dataset, list[DatasetSplit]]]:
    out = []
    for dataset in session.scalars(select(Dataset).order_by(Dataset.name)):
        splits = session.scalars(
            select(DatasetSplit).where(DatasetSplit.dataset_id == dataset.id).order_by(DatasetSplit.name)
        )
        out.append((dataset, list(splits)))
    return out


def get_dataset(session: Session, dataset_id: int) -> Dataset | None:
    return session.get(Dataset, dataset_id)


def get_image(session: Session, image_id: int) -> Image | None:
    return session.get(Image, image_id)


def get_caption(session: Session, caption_id: int) -> Caption | None:
    return session.get(Caption, caption_id)


def images_at(session: Session, dataset_id: int, split: str, positions: list[int]) -> list[Image]:
    """Images of a split at the given positions, in that order (missing positions skipped)."""
    rows = session.scalars(
        select(Image).where(Image.dataset_id == dataset_id, Image.split == split, Image.position.in_(positions))
    )
    by_position = {r.position: r for r in rows}
    return [by_position[p] for p in positions if p in by_position]


def first_captions(session: Session, image_ids: list[int]) -> dict[int, Caption]:
    """The first caption (lowest position) of each image."""
    rows = session.scalars(select(Caption).where(Caption.image_id.in_(image_ids)).order_by(Caption.position))
    out: dict[int, Caption] = {}
    for row in rows:
        out.setdefault(row.image_id, row)
    return out
