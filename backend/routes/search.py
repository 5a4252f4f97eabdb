"""Searches on one model and side-by-side comparisons of two."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, File, Form, Response, UploadFile
from PIL import Image
from pydantic import BaseModel

from aoq.names import Normalisation
from aoq_serve.deps import ServiceDep, SnapshotDep, UrlsDep
from aoq_serve.errors import ServiceError
from aoq_serve.registry import Snapshot
from aoq_serve.schemas import (
    DEFAULT_MAX_UPLOAD_BYTES,
    MAX_ID,
    MAX_K,
    NORMALISE_HELP,
    CompareImageOut,
    CompareTextIn,
    CompareTextOut,
    ErrorOut,
    SCOPE_HELP,
    Scope,
    SearchImageOut,
    SearchTextIn,
    SearchTextOut,
)
from aoq_serve.registry import ServingModel
from aoq_serve.search import engine, rerank
from aoq_serve.search.decode import decode_upload

router = APIRouter(tags=["search"])
ERRORS = {code: {"model": ErrorOut} for code in (404, 409, 413, 415, 422)}

ModelForm = Annotated[str, Form(min_length=1, max_length=200, description="model name")]
KForm = Annotated[int, Form(ge=1, le=MAX_K)]
ImageIdForm = Annotated[int | None, Form(ge=0, le=MAX_ID, description="a gallery image id (or upload a file)")]
ScopeForm = Annotated[Scope, Form(description=SCOPE_HELP)]
NormaliseForm = Annotated[Normalisation, Form(description=NORMALISE_HELP)]
FileForm = Annotated[UploadFile | None, File(description=f"PNG or JPEG, at most {DEFAULT_MAX_UPLOAD_BYTES // 2**20} MB by default (or give image_id)")]


def _answer(out: BaseModel) -> Response:
    """The answer serialised once. A route that returns the model itself has FastAPI validate it
    again against the route's ``response_model`` and then serialise it; on the search path that
    second validation cost about a fifth of the server's CPU per answer (docs/serving.md, Speed).
    The answers are built from validated models of that very type, and the OpenAPI document still
    comes from ``response_model``."""
    return Response(out.model_dump_json(), media_type="application/json")


def _read_query_image(service: ServiceDep, image_id: int | None, file: UploadFile | None) -> Image.Image | None:
    """The decoded upload, or None for an image-id query; exactly one of the two must be given."""
    if (image_id is None) == (file is None):
        raise ServiceError(422, "give exactly one of image_id (a gallery image) or file (an uploaded PNG/JPEG)")
    if file is None:
        return None
    limit = service.settings.max_upload_bytes
    data = file.file.read(limit + 1)
    if len(data) > limit:
        raise ServiceError(413, f"the uploaded file is larger than the limit of {limit} bytes")
    settings = service.settings
    return decode_upload(data, settings.max_upload_pixels, settings.upload_max_side, service.decode_budget)


def _text_search(served: ServingModel) -> Callable[..., SearchTextOut]:
    """The sentence search of a served model: a re-ranker's own, or the embedding search."""
    return rerank.search_text if served.rerank is not None else engine.search_text


def _image_search(served: ServingModel) -> Callable[..., SearchImageOut]:
    """The image search of a served model: a re-ranker's own, or the embedding search."""
    return rerank.search_image if served.rerank is not None else engine.search_image


def _pair(snapshot: Snapshot, models: list[str] | None) -> tuple[str, str]:
    if models is None:
        return snapshot.default_pair()
    left, right = models
    return left, right


@router.post("/search/text", response_model=SearchTextOut, responses=ERRORS)
def post_search_text(body: SearchTextIn, service: ServiceDep, snapshot: SnapshotDep, urls: UrlsDep) -> Response:
    """Rank the gallery images of ``model`` for a sentence."""
    served = snapshot.get(body.model)
    out = _text_search(served)(served, body.query, body.k, urls, body.scope, body.normalise,
                      body.intended)
    service.querylog.record("/search/text", out.latency_ms, body.model, body.k)
    return _answer(out)


@router.post("/search/image", response_model=SearchImageOut, responses=ERRORS)
def post_search_image(
    service: ServiceDep, snapshot: SnapshotDep, urls: UrlsDep, model: ModelForm, k: KForm = 10,
    image_id: ImageIdForm = None, file: FileForm = None, scope: ScopeForm = "all", normalise: NormaliseForm = "none",
) -> Response:
    """Rank the gallery captions of ``model`` for a gallery image or an uploaded one."""
    served = snapshot.get(model)
    upload = _read_query_image(service, image_id, file)
    out = _image_search(served)(served, k, urls, image_id=image_id, upload=upload, scope=scope, normalise=normalise)
    service.querylog.record("/search/image", out.latency_ms, model, k)
    return _answer(out)


@router.post("/compare/text", response_model=CompareTextOut, responses=ERRORS)
def post_compare_text(body: CompareTextIn, service: ServiceDep, snapshot: SnapshotDep, urls: UrlsDep) -> Response:
    """The same sentence on two models (default: the baseline-role and the aoq-role model)."""
    start = time.perf_counter()
    left, right = (snapshot.get(name) for name in _pair(snapshot, body.models))
    out = CompareTextOut(query=body.query,
                         left=_text_search(left)(left, body.query, body.k, urls, body.scope, body.normalise, body.intended),
                         right=_text_search(right)(right, body.query, body.k, urls, body.scope, body.normalise, body.intended))
    service.querylog.record("/compare/text", (time.perf_counter() - start) * 1000, f"{left.name},{right.name}", body.k)
    return _answer(out)


@router.post("/compare/image", response_model=CompareImageOut, responses=ERRORS)
def post_compare_image(
    service: ServiceDep, snapshot: SnapshotDep, urls: UrlsDep, k: KForm = 10,
    models: Annotated[str | None, Form(max_length=401, description='"left,right"; default baseline and aoq roles')] = None,
    image_id: ImageIdForm = None, file: FileForm = None, scope: ScopeForm = "all", normalise: NormaliseForm = "none",
) -> Response:
    """The same image on two models, each with its rank of the ground truth."""
    start = time.perf_counter()
    names = None
    if models is not None:
        names = [m.strip() for m in models.split(",")]
        if len(names) != 2 or not all(names):
            raise ServiceError(422, f'models must be two names separated by a comma ("left,right"), got {models!r}')
    left, right = (snapshot.get(name) for name in _pair(snapshot, names))
    upload = _read_query_image(service, image_id, file)
    out = CompareImageOut(
        left=_image_search(left)(left, k, urls, image_id=image_id, upload=upload, scope=scope, normalise=normalise),
        right=_image_search(right)(right, k, urls, image_id=image_id, upload=upload, scope=scope, normalise=normalise))
    service.querylog.record("/compare/image", (time.perf_counter() - start) * 1000, f"{left.name},{right.name}", k)
    return _answer(out)
