"""What routes receive: the service's long-lived parts, and the snapshot a request works on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from aoq_serve.cluster.board import Board, BoardWatcher
from aoq_serve.config import Settings
from aoq_serve.errors import ServiceError
from aoq_serve.guards.faults import CATALOGUE, Faults, endpoint, picture_part
from aoq_serve.guards.hosts import public_base
from aoq_serve.guards.paths import public_text
from aoq_serve.registry import Registry, Snapshot
from aoq_serve.search.decode import MemoryBudget
from aoq_serve.search.engine import Urls
from aoq_serve.search.negatives import NegativesService
from aoq_serve.store.catalogue import CatalogueError
from aoq_serve.store.integrity import check_catalogue
from aoq_serve.store.querylog import QueryLogger


#: pictures named one by one in ``/health``; the rest are counted.
MAX_LISTED_PICTURES = 20


@dataclass
class Service:
    settings: Settings
    engine: Engine
    sessions: sessionmaker
    registry: Registry
    querylog: QueryLogger
    negatives: NegativesService
    #: shared by concurrent upload decodes (``AOQ_DECODE_MEMORY_BUDGET_MB``), of every worker.
    decode_budget: MemoryBudget
    #: endpoints disabled by catalogue damage found while serving.
    faults: Faults = field(default_factory=Faults)
    #: with several worker processes: this worker's place on the shared board, and the thread
    #: answering the other workers' reload requests; None in a server of one process.
    board: Board | None = None
    watcher: BoardWatcher | None = None

    def reload(self) -> Snapshot:
        """Check the catalogue, then reload every model of this process.

        Raises:
            CatalogueError: the catalogue is damaged (the models loaded before keep serving, and
                the catalogue is marked faulty).
        """
        try:
            check_catalogue(self.settings)
        except CatalogueError as exc:
            self.faults.disable(CATALOGUE, str(exc))
            raise
        self.faults.clear()
        return self.registry.reload()

    def state(self) -> dict:
        """What ``/health`` says about this process: status, served models, index generation,
        faults (pictures that differ from their digests named up to ``MAX_LISTED_PICTURES``).
        Public (health checks need no token): reasons name files relative to the configured folders."""
        snapshot = self.registry.current
        pictures = sorted(snapshot.pictures.items())
        faults = {**{picture_part(i): reason for i, reason in pictures[:MAX_LISTED_PICTURES]}, **self.faults.current}
        if len(pictures) > MAX_LISTED_PICTURES:
            faults["/images"] = f"{len(pictures) - MAX_LISTED_PICTURES} more pictures differ from their files' digests"
        healthy = bool(snapshot.models) and not snapshot.disabled and not faults
        return {"status": "ok" if healthy else "degraded", "models": sorted(snapshot.models),
                "disabled": self._public(snapshot.disabled), "faults": self._public(faults),
                "generation": snapshot.generation}

    def _public(self, reasons: dict[str, str]) -> dict[str, str]:
        return {part: public_text(reason, self.settings) for part, reason in reasons.items()}


# The dependencies that only read the app's state are coroutines: FastAPI runs a plain function
# dependency in its thread pool, and on a busy service each such hop (a task, a thread hand-off
# and a wake-up of the event loop) cost more than the attribute read it wraps.


async def get_service(request: Request) -> Service:
    return request.app.state.service


async def get_snapshot(request: Request) -> Snapshot:
    # Taken once per request: a reload during the request cannot change what it sees.
    return request.app.state.service.registry.current


def get_session(request: Request) -> Iterator[Session]:
    # An endpoint disabled by catalogue damage answers at once, without reading the catalogue again.
    service = request.app.state.service
    reason = service.faults.reason(endpoint(request.scope))
    if reason is not None:
        raise ServiceError(503, f"{endpoint(request.scope)} is disabled: {public_text(reason, service.settings)}; "
                                f"repair or rebuild the catalogue, then POST /admin/reload")
    with request.app.state.service.sessions() as session:
        yield session


async def get_urls(request: Request) -> Urls:
    # Never from the Host header (aoq_serve.guards.hosts): a forged Host must not reach the answer's links.
    return Urls(public_base(request.app.state.service.settings, request.scope))


ServiceDep = Annotated[Service, Depends(get_service)]
SnapshotDep = Annotated[Snapshot, Depends(get_snapshot)]
SessionDep = Annotated[Session, Depends(get_session)]
UrlsDep = Annotated[Urls, Depends(get_urls)]
