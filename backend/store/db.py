"""The catalogue schema (SQLAlchemy 2.0 typed ORM) and engine set-up, for SQLite and PostgreSQL.

One id space: an image's or caption's row id is also its FAISS vector id, so an index and the
catalogue can be checked against each other (docs/serving.md, Design notes). Ids are assigned by ``aoq index``
(contiguous per split, never reused), not by the database, so they are identical on every backend.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Dataset(Base):
    """A dataset; ``data_config`` is its ``DataConfig`` with paths relative to the data directory."""

    __tablename__ = "datasets"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    format: Mapped[str] = mapped_column(String(32))
    #: the synthetic benchmark: uploads can be featurised with its own region extractor.
    synthetic: Mapped[bool] = mapped_column(Boolean, default=False)
    captions_per_image: Mapped[int] = mapped_column(Integer)
    data_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class DatasetSplit(Base):
    """A registered split; ``content_hash`` detects a dataset that changed on disk."""

    __tablename__ = "splits"
    __table_args__ = (UniqueConstraint("dataset_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    name: Mapped[str] = mapped_column(String(64))
    n_images: Mapped[int] = mapped_column(Integer)
    n_captions: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))


class Image(Base):
    """An image; ``path`` is relative to the data directory (None for feature-only datasets)."""

    __tablename__ = "images"
    __table_args__ = (Index("ix_images_split_position", "dataset_id", "split", "position"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    split: Mapped[str] = mapped_column(String(64))
    #: index of the image within its split (the id space of training arrays and mined lists).
    position: Mapped[int] = mapped_column(Integer)
    external_id: Mapped[str] = mapped_column(String(200))
    path: Mapped[str | None] = mapped_column(Text, nullable=True)
    width: Mapped[int | None] = mapped_column(Integer, nullable=True)
    height: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Caption(Base):
    __tablename__ = "captions"
    __table_args__ = (Index("ix_captions_split_position", "dataset_id", "split", "position"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    split: Mapped[str] = mapped_column(String(64))
    position: Mapped[int] = mapped_column(Integer)
    image_id: Mapped[int] = mapped_column(ForeignKey("images.id"), index=True)
    text: Mapped[str] = mapped_column(Text)


class Model(Base):
    """A served model; ``report`` holds its evaluation tables, curves and rank histogram."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    role: Mapped[str] = mapped_column(String(64))
    loss: Mapped[str] = mapped_column(String(64))
    image_encoder: Mapped[str] = mapped_column(String(32))
    image_input: Mapped[str] = mapped_column(String(16))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    gallery_split: Mapped[str] = mapped_column(String(64))
    checkpoint_path: Mapped[str] = mapped_column(Text)
    checkpoint_hash: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: the mined offline negatives of this model's pipeline (``/negatives``), when known.
    mined_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class IndexRecord(Base):
    """One FAISS index of a model (modality ``image``: the gallery images; ``caption``: captions)."""

    __tablename__ = "indexes"
    __table_args__ = (UniqueConstraint("model_id", "modality"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    modality: Mapped[str] = mapped_column(String(16))
    index_type: Mapped[str] = mapped_column(String(16))
    vector_count: Mapped[int] = mapped_column(Integer)
    dim: Mapped[int] = mapped_column(Integer)
    file_hash: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    built_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class QueryRank(Base):
    """Full-gallery rank (1-based) of the ground truth of one test query under one model.

    ``direction`` ``t2i``: ``query_id`` is a caption id; ``i2t``: an image id (best caption rank).
    Failure cases of any pair of models are a join of this table with itself.
    """

    __tablename__ = "query_ranks"
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), primary_key=True)
    direction: Mapped[str] = mapped_column(String(8), primary_key=True)
    query_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: expected 1-based rank under a random order of tied items (docs/evaluation.md, Ties)
    rank: Mapped[float] = mapped_column(Float)


class QueryLog(Base):
    """One answered request (never the uploaded bytes or the query text)."""

    __tablename__ = "query_log"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    endpoint: Mapped[str] = mapped_column(String(64))
    latency_ms: Mapped[float] = mapped_column(Float)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    k: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[int] = mapped_column(Integer)


def make_engine(url: str, create: bool = True) -> Engine:
    """An engine for ``url``; SQLite files get WAL mode so ``aoq index`` can write while the
    server reads, and a busy timeout instead of immediate "database is locked" errors.

    With ``create=False`` (the server) a missing SQLite file is an error when connecting instead
    of a new empty catalogue.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        if create:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        else:
            parsed = parsed.set(database=f"file:{parsed.database}", query={**parsed.query, "mode": "rw", "uri": "true"})
    engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def create_schema(engine: Engine) -> None:
    """Create missing tables (idempotent)."""
    Base.metadata.create_all(engine)


def session_factory(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
