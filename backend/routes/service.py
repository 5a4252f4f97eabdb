"""Service state: health, the models and datasets it knows, and a forced index reload."""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends

from aoq_serve.deps import Service, ServiceDep, SessionDep, SnapshotDep
from aoq_serve.errors import ServiceError
from aoq_serve.guards.access import require_admin
from aoq_serve.guards.paths import public_text
from aoq_serve.schemas import (
    DatasetOut,
    ErrorOut,
    HealthOut,
    ModelOut,
    ReloadOut,
    SplitCounts,
    WorkerOut,
)
from aoq_serve.store import catalogue
from aoq_serve.store.catalogue import CatalogueError
from aoq_serve.version import VERSION

router = APIRouter(tags=["service"])
#: how long a reload waits for the other worker processes to reload too.
RELOAD_WAIT_S = 300.0


def _workers(service: Service) -> list[WorkerOut]:
    """Every worker's published state; this process's own when it is the only one."""
    if service.board is None:
        return [WorkerOut(worker=0, pid=os.getpid(), **service.state())]
    service.watcher.refresh()  # type: ignore[union-attr]
    return [WorkerOut(**state) for state in service.board.states()]


@router.get("/health", response_model=HealthOut)
def health(service: ServiceDep) -> HealthOut:
    return HealthOut(**service.state(), version=VERSION, workers=_workers(service),
                     worker=service.board.worker if service.board is not None else 0)


@router.get("/models", response_model=list[ModelOut])
def list_models(snapshot: SnapshotDep, service: ServiceDep) -> list[ModelOut]:
    return [
        ModelOut(name=i.name, role=i.role, loss=i.loss, image_encoder=i.image_encoder, image_input=i.image_input,
                 checkpoint_hash=i.checkpoint_hash, dataset=i.dataset, enabled=i.enabled,
                 disabled_reason=i.disabled_reason and public_text(i.disabled_reason, service.settings),
                 metrics=i.metrics, metrics_measured=i.metrics_measured,
                 evaluated=i.evaluated, shortlist_by=i.shortlist_by, shortlist_n=i.shortlist_n)
        for i in sorted(snapshot.infos, key=lambda i: i.name)
    ]


@router.get("/datasets", response_model=list[DatasetOut])
def list_datasets(session: SessionDep) -> list[DatasetOut]:
    return [
        DatasetOut(
            name=dataset.name, synthetic=dataset.synthetic,
            n_images=sum(s.n_images for s in splits), n_captions=sum(s.n_captions for s in splits),
            splits={s.name: SplitCounts(images=s.n_images, captions=s.n_captions) for s in splits},
        )
        for dataset, splits in catalogue.datasets(session)
    ]


@router.post("/admin/reload", response_model=ReloadOut, dependencies=[Depends(require_admin)],
             responses={code: {"model": ErrorOut} for code in (401, 403, 415, 503)})
def reload(service: ServiceDep) -> ReloadOut:
    """Re-check and reload every model now (a running server also reloads by itself when
    ``aoq index`` writes a new ``index.json``). Requests in flight finish on the old indexes.

    Admin only: a JSON request (``Content-Type: application/json``, e.g. body ``{}``) with
    ``Authorization: Bearer <AOQ_ADMIN_TOKEN>``; without a configured token, only on a service
    listening on a loopback address.

    The catalogue is checked first: a damaged one keeps the models loaded before serving and
    answers 503 with the problem; a sound one enables again what damage found while serving had
    disabled.

    With several worker processes, every worker reloads before the answer, which lists them."""
    try:
        snapshot = service.reload()
    except CatalogueError as exc:
        raise ServiceError(503, f"{exc}; still serving the models loaded before") from None
    if service.board is not None:
        number = service.board.request_reload()
        service.watcher.refresh()  # type: ignore[union-attr]
        service.board.wait_all(number, RELOAD_WAIT_S)
    return ReloadOut(generation=snapshot.generation, models=sorted(snapshot.models), disabled=snapshot.disabled,
                     workers=_workers(service))
