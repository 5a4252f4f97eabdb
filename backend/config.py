"""Settings of the search service: environment variables with the ``AOQ_`` prefix, or CLI flags.

Example::

    AOQ_MODELS_DIR=runs/synthetic/models AOQ_INDEX_DIR=runs/synthetic/index aoq serve --port 8000
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from aoq_serve.schemas import DEFAULT_MAX_UPLOAD_BYTES

#: The catalogue lives beside the indexes unless a URL is given.
CATALOGUE_FILE = "catalogue.sqlite"


class Settings(BaseSettings):
    """Everything ``aoq serve`` needs; every field can be set as ``AOQ_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="AOQ_", extra="ignore")

    #: SQLAlchemy URL; default ``sqlite:///<index_dir>/catalogue.sqlite``.
    catalogue_url: str | None = None
    #: one checkpoint directory per model (``runs/<name>/models``).
    models_dir: Path = Path("runs/synthetic/models")
    #: written by ``aoq index``: one artefact directory per model plus ``index.json``.
    index_dir: Path = Path("runs/synthetic/index")
    #: the only tree images are ever read from (catalogue image paths are relative to it).
    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    #: worker processes serving the one port (docs/serving.md, Workers); 0: one per
    #: CPU core this process may run on. 1: a single process, nothing shared between processes.
    workers: int = Field(0, ge=0)
    #: where models run queries; the CPU is the sensible default for single queries.
    device: str = "cpu"
    #: threads for torch and for FAISS: on a small machine one thread per query wins (docs/serving.md, Design notes),
    #: concurrency comes from serving several requests at once.
    torch_threads: int = Field(1, ge=1)
    faiss_threads: int = Field(1, ge=1)
    #: search concurrent queries to one index together (aoq_serve.search.batching); off: each query alone.
    batching: bool = True
    #: seconds between checks of ``index.json`` for a rebuilt index (0: only ``POST /admin/reload``).
    reload_poll_s: float = Field(2.0, ge=0)
    max_upload_bytes: int = Field(DEFAULT_MAX_UPLOAD_BYTES, ge=1)
    #: uploads with more pixels are refused before decoding (decompression bombs).
    max_upload_pixels: int = Field(40_000_000, ge=1)
    #: uploads are reduced to at most this many pixels on their longer side right after decoding,
    #: before any conversion (every model's own image path then resizes further).
    upload_max_side: int = Field(1024, ge=16)
    #: memory that concurrent upload decodes may hold together (full-size decode buffers);
    #: decodes beyond it wait their turn. One decode larger than the budget runs alone.
    decode_memory_budget_mb: int = Field(512, ge=1)
    #: a request's headers must arrive within this many seconds of its first byte, its body
    #: within ``body_timeout_s`` of the headers; otherwise the connection is closed (408).
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    #: an idle kept-alive connection is closed after this many seconds.
    keep_alive_s: int = Field(5, ge=1)
    #: open connections beyond this are answered 503 and closed at once.
    max_connections: int = Field(1000, ge=1)
    #: open connections from one client address beyond this are answered 503 and closed at once
    #: (that client only). Above the benchmark's 16 clients and an HTTP client pool's usual 100,
    #: well below ``max_connections``: the UI relays all its users through one address.
    max_client_connections: int = Field(128, ge=1)
    #: bearer token of the admin endpoints (``POST /admin/reload``). Without one they answer only
    #: when the service listens on a loopback address.
    admin_token: SecretStr | None = None
    #: the address clients reach the service at (``https://search.example``): image URLs in
    #: answers are built from it, and its host is accepted in the ``Host`` header. Unset: the
    #: local address each connection arrived on (aoq_serve.guards.hosts).
    public_url: str | None = None
    #: more names the ``Host`` header may carry (loopback names and the listening address always may).
    allowed_hosts: list[str] = Field(default_factory=list)
    #: browser origins allowed to call the API from their pages (CORS); none by default.
    cors_origins: list[str] = Field(default_factory=list)
    #: record every query (time, endpoint, latency, model, k) in the catalogue; uploads never are.
    query_log: bool = True
    log_level: str = "info"

    def worker_count(self) -> int:
        """``workers``, with 0 meaning one per CPU core available to this process."""
        if self.workers:
            return self.workers
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    def catalogue(self) -> str:
        """The catalogue URL, defaulting to a SQLite file inside the index directory."""
        if self.catalogue_url:
            return self.catalogue_url
        return f"sqlite:///{(self.index_dir / CATALOGUE_FILE).resolve()}"
