"""Service state: health, the models and datasets it knows, and a forced index reload."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from aoq_serve.deps import ServiceDep, SessionDep, SnapshotDep
from aoq_serve.errors import ServiceError
from aoq_serve.guards.access import require_admin
from aoq_serve.guards.faults import CATALOGUE, picture_part
from aoq_serve.guards.paths import public_text
from aoq_serve.schemas import (
    DatasetOut,
    ErrorOut,
    HealthOut,
    ModelOut,
    ReloadOut,
    SplitCounts,
)
from aoq_serve.store import catalogue
from aoq_serve.store.catalogue import CatalogueError
from aoq_serve.store.integrity import check_catalogue
from aoq_serve.version import VERSION

router = APIRouter(tags=["service"])
#: pictures named one by one in ``/health``; the rest are counted.
MAX_LISTED_PICTURES = 20


@router.get("/health", response_model=HealthOut)
def health(snapshot: SnapshotDep, service: ServiceDep) -> HealthOut:
    faults = {**{picture_part(i): reason for i, reason in sorted(snapshot.pictures.items())[:MAX_LISTED_PICTURES]},
              **service.faults.current}
    if len(snapshot.pictures) > MAX_LISTED_PICTURES:
        faults["/images"] = f"{len(snapshot.pictures) - MAX_LISTED_PICTURES} more pictures differ from their files' digests"
    healthy = snapshot.models and not snapshot.disabled and not faults
    # Public (health checks need no token): reasons name files relative to the configured folders.
    def public(reasons: dict[str, str]) -> dict[str, str]:
        return {part: public_text(reason, service.settings) for part, reason in reasons.items()}

    return HealthOut(
        status="ok" if healthy else "degraded", models=sorted(snapshot.models),
        disabled=public(snapshot.disabled), faults=public(faults), version=VERSION, generation=snapshot.generation,
    )


@router.get("/models", response_model=list[ModelOut])
def list_models(snapshot: SnapshotDep, service: ServiceDep) -> list[ModelOut]:
    return [
        ModelOut(name=i.name, role=i.role, loss=i.loss, image_encoder=i.image_encoder, image_input=i.image_input,
                 checkpoint_hash=i.checkpoint_hash, dataset=i.dataset, enabled=i.enabled,
                 disabled_reason=i.disabled_reason and public_text(i.disabled_reason, service.settings),
                 metrics=i.metrics, metrics_measured=i.metrics_measured,
                 evaluated=i.evaluated)
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
    disabled."""
    try:
        check_catalogue(service.settings)
    except CatalogueError as exc:
        service.faults.disable(CATALOGUE, str(exc))
        raise ServiceError(503, f"{exc}; still serving the models loaded before") from None
    service.faults.clear()
    snapshot = service.registry.reload()
    return ReloadOut(generation=snapshot.generation, models=sorted(snapshot.models), disabled=snapshot.disabled)
