"""What the models learned: failure cases, evaluation tables and curves, hard negatives."""

from __future__ import annotations

import time
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Path, Query, Request

from aoq_serve.deps import ServiceDep, SessionDep, SnapshotDep, UrlsDep
from aoq_serve.errors import ServiceError
from aoq_serve.guards.faults import endpoint
from aoq_serve.schemas import (
    MAX_ID,
    ErrorOut,
    FailureItem,
    FailuresOut,
    MetricsOut,
    NegativeItem,
    NegativesOut,
)
from aoq_serve.registry import Gallery
from aoq_serve.search.failures import RanksChanged, failure_cases
from aoq_serve.search.negatives import CORRECT_RULE

router = APIRouter(tags=["analysis"])
ERRORS = {code: {"model": ErrorOut} for code in (404, 409, 422, 503)}


def _text_keys(gallery: Gallery):
    """Caption ids -> the key of their normalised text (an id without a caption: a key of its own)."""
    def key_of(caption_ids: np.ndarray) -> np.ndarray:
        known = gallery.ids.caption_ids
        p = np.searchsorted(known, caption_ids).clip(max=len(known) - 1)
        return np.where(known[p] == caption_ids, gallery.view.keys[p], -1 - caption_ids)
    return key_of


@router.get("/failures", response_model=FailuresOut, responses=ERRORS)
def get_failures(
    request: Request, service: ServiceDep, snapshot: SnapshotDep, session: SessionDep, urls: UrlsDep,
    direction: Literal["t2i", "i2t"] = "t2i",
    which: Literal["baseline_only", "aoq_only", "both"] = "baseline_only",
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    models: Annotated[str | None, Query(max_length=401, description='"left,right"; default baseline and aoq roles')] = None,
) -> FailuresOut:
    """Test queries where the left model (baseline) or the right one (AOQ) misses rank 1,
    from the full-gallery ranks ``aoq index`` stored."""
    start = time.perf_counter()
    if models is None:
        names = snapshot.default_pair()
    else:
        parts = [m.strip() for m in models.split(",")]
        if len(parts) != 2 or not all(parts):
            raise ServiceError(422, f'models must be two names separated by a comma ("left,right"), got {models!r}')
        names = (parts[0], parts[1])
    left, right = (snapshot.get(n) for n in names)
    reranker = next((m for m in (left, right) if m.rerank is not None), None)
    if reranker is not None:
        raise ServiceError(422, f"model {reranker.name!r} is a re-ranker: aoq index stores no ranks of the whole "
                                f"gallery for it, so it has no failure cases")
    if left.gallery is not right.gallery:
        raise ServiceError(422, f"models {left.name!r} and {right.name!r} are indexed over different galleries")
    try:
        total, queries, rows = failure_cases(session, left, right, direction, which, limit, offset,
                                             _text_keys(left.gallery) if direction == "t2i" else None)
    except RanksChanged as exc:
        service.faults.disable(endpoint(request.scope), str(exc))
        raise ServiceError(503, f"{exc}; /failures is disabled until POST /admin/reload") from None
    gallery = left.gallery
    view = gallery.view
    items = []
    for case in rows:
        query_id = case.query_id
        if direction == "t2i":
            p = gallery.caption_position(query_id)
            owner = None if p is None else int(view.caption_owner[p])
            text = gallery.captions[p] if p is not None else None
        else:
            owner, text = gallery.image_position(query_id), None
        image_id = None if owner is None else int(gallery.ids.image_ids[owner])
        items.append(FailureItem(
            query_id=query_id, query_text=text, image_id=image_id,
            image_url=None if image_id is None else urls.image(image_id),
            thumbnail_url=None if image_id is None else urls.thumbnail(image_id),
            image_name=None if owner is None else view.name(owner), left_rank=case.left_rank,
            right_rank=case.right_rank, copies=case.copies))
    service.querylog.record("/failures", (time.perf_counter() - start) * 1000, f"{left.name},{right.name}", limit)
    return FailuresOut(direction=direction, which=which, left=left.name, right=right.name, total=total,
                       queries=queries, offset=offset, measured=left.report.get("measured"), items=items)


@router.get("/metrics/{model}", response_model=MetricsOut, responses=ERRORS)
def get_metrics(model: Annotated[str, Path(min_length=1, max_length=200)], snapshot: SnapshotDep) -> MetricsOut:
    """Evaluation tables on the gallery split, training curves, cross-retrieval rank histogram."""
    report = snapshot.get(model).report
    return MetricsOut(model=model, measured=report.get("measured"), curves_measured=report.get("curves_measured"),
                      tables=report.get("tables", {}), curves=report.get("curves", []),
                      rank_histogram=report.get("rank_histogram"), labels=report.get("labels"))


@router.get("/negatives", response_model=NegativesOut, responses=ERRORS)
def get_negatives(
    service: ServiceDep, snapshot: SnapshotDep, urls: UrlsDep,
    kind: Literal["caption", "image"],
    id: Annotated[int, Query(ge=0, le=MAX_ID, description="a training caption or image id")],
    model: Annotated[str, Query(min_length=1, max_length=200)],
    n: Annotated[int, Query(ge=1, le=50)] = 5,
    seed: Annotated[int, Query(ge=0, le=MAX_ID, description="picks the random batch of the online kind")] = 0,
) -> NegativesOut:
    """Offline (mined) and online (in-batch) hard negatives of a training item (paper Fig. 3)."""
    start = time.perf_counter()
    result = service.negatives.negatives(snapshot.get(model), kind, id, n, seed)

    def item(neg, **extra) -> NegativeItem:
        return NegativeItem(id=neg.id, text=neg.text, image_url=urls.thumbnail(neg.image_id), **extra)

    out = NegativesOut(
        model=model, kind=kind, id=id, text=result.anchor_text, image_url=urls.image(result.anchor_image_id),
        offline=[item(x, rank=x.rank, removed_by=x.removed_by, correct=x.correct) for x in result.offline],
        online=[item(x, score=x.score, correct=x.correct) for x in result.online], filters=result.filters,
        correct_rule=CORRECT_RULE,
    )
    service.querylog.record("/negatives", (time.perf_counter() - start) * 1000, model, n)
    return out
