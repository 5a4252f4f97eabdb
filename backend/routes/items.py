"""Catalogue items: image files and thumbnails, captions, and example queries for the UI."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from aoq_serve.deps import ServiceDep, SessionDep, SnapshotDep, UrlsDep
from aoq_serve.errors import ServiceError
from aoq_serve.guards.faults import CatalogueDamage, picture_part
from aoq_serve.guards.paths import public_text, safe_path
from aoq_serve.registry import Snapshot
from aoq_serve.schemas import (
    MAX_GALLERY_PAGE,
    MAX_ID,
    MAX_IMAGE_SIZE,
    MIN_IMAGE_SIZE,
    MAX_QUERY_CHARS,
    SCOPE_HELP,
    CaptionOut,
    ErrorOut,
    ExampleCaption,
    ExampleImage,
    ExamplesOut,
    GalleryPageOut,
    Scope,
)
from aoq_serve.search.engine import gallery_image
from aoq_serve.store import catalogue
from aoq_serve.store.images import PictureMismatch, checked_file, media_type, thumbnail_png

router = APIRouter(tags=["items"])
ERRORS = {404: {"model": ErrorOut}, 422: {"model": ErrorOut}, 503: {"model": ErrorOut}}
ItemId = Annotated[int, Path(ge=0, le=MAX_ID)]


def served_path(snapshot: Snapshot, image_id: int) -> tuple[str, bytes | None] | None:
    """The verified path of an image of a served gallery ("" for a features-only image) and the
    digest of its file, else None."""
    for served in snapshot.models.values():
        path = served.images.get(image_id)
        if path is not None:
            return path, served.images.digest(image_id)
    return None


@router.get(
    "/images/{image_id}",
    response_class=Response,
    responses={200: {"content": {"image/png": {}, "image/jpeg": {}}}, **ERRORS},
)
def get_image(
    image_id: ItemId, service: ServiceDep, snapshot: SnapshotDep,
    size: Annotated[int | None, Query(ge=MIN_IMAGE_SIZE, le=MAX_IMAGE_SIZE,
                                      description="thumbnail: longer side in pixels (PNG)")] = None,
) -> Response:
    """The image file (its own format), or a PNG thumbnail when ``size`` is given; either only
    after the file was checked to decode (404 when it is missing or damaged). Only the pictures
    of the served models (gallery, and training split of the negatives explorer), from the paths
    verified when the models were loaded: the catalogue is not read here. A file that decodes but
    is not the picture ``aoq index`` recorded (its digest differs) answers 503 and disables that
    picture (one log line; ``/health`` names it) until a reload finds it restored."""
    found = served_path(snapshot, image_id)
    if found is None:
        raise ServiceError(404, f"no image with id {image_id} among the pictures of the served models")
    relative, digest = found
    if not relative:
        raise ServiceError(404, f"image {image_id} has no file: its dataset holds precomputed features only")
    part = picture_part(image_id)
    reason = snapshot.pictures.get(image_id) or service.faults.get(part)
    if reason is None:
        path = safe_path(service.settings.data_dir, relative)
        headers = {"Cache-Control": "public, max-age=3600"}
        limit = service.settings.max_upload_pixels
        try:
            if size is not None:
                return Response(thumbnail_png(path, size, limit, digest), media_type="image/png", headers=headers)
            return Response(checked_file(path, limit, digest), media_type=media_type(path), headers=headers)
        except PictureMismatch as exc:
            reason = str(exc)
            service.faults.disable(part, reason)
    raise ServiceError(503, f"picture {image_id} is disabled: {public_text(reason, service.settings)}")


@router.get("/captions/{caption_id}", response_model=CaptionOut, responses=ERRORS)
def get_caption(caption_id: ItemId, session: SessionDep, snapshot: SnapshotDep) -> CaptionOut:
    caption = catalogue.get_caption(session, caption_id)
    if caption is None:
        if any(served.gallery.caption_position(caption_id) is not None for served in snapshot.models.values()):
            raise CatalogueDamage(f"caption {caption_id} of a served gallery has no row")
        raise ServiceError(404, f"no caption with id {caption_id}")
    return CaptionOut(id=caption.id, text=caption.text, image_id=caption.image_id, split=caption.split)


@router.get("/examples", response_model=ExamplesOut, responses=ERRORS)
def get_examples(
    session: SessionDep, snapshot: SnapshotDep, urls: UrlsDep,
    split: Annotated[str, Query(min_length=1, max_length=64)] = "test",
    n: Annotated[int, Query(ge=1, le=64)] = 8,
    dataset: Annotated[str | None, Query(max_length=200, description="default: the served models' dataset")] = None,
) -> ExamplesOut:
    """``n`` images spread evenly over a split, and the first caption of each: example queries."""
    known = {d.name: (d, splits) for d, splits in catalogue.datasets(session)}
    if dataset is None:
        served = snapshot.by_role("aoq") or snapshot.by_role("baseline") or next(iter(snapshot.models.values()), None)
        dataset = served.gallery.dataset if served else next(iter(sorted(known)), None)
    if dataset not in known:
        raise ServiceError(404, f"unknown dataset {dataset!r}; catalogued: {', '.join(sorted(known)) or 'none'}")
    record, splits = known[dataset]
    sizes = {s.name: s.n_images for s in splits}
    if split not in sizes:
        raise ServiceError(404, f"split {split!r} of dataset {dataset!r} is not catalogued; catalogued: "
                                f"{', '.join(sorted(sizes))}")
    positions = sorted({int(p) for p in np.linspace(0, sizes[split] - 1, num=min(n, sizes[split]))})
    images = catalogue.images_at(session, record.id, split, positions)
    firsts = catalogue.first_captions(session, [i.id for i in images])
    # Every registered image and its captions must be there: a deleted row is damage, not a shorter answer.
    found = {i.position for i in images}
    missing = [f"image at position {p}" for p in positions if p not in found]
    missing += [f"caption of image {i.id}" for i in images if i.id not in firsts]
    if missing:
        raise CatalogueDamage(f"split {split!r} of dataset {dataset!r} records {sizes[split]} images but has no row "
                              f"for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return ExamplesOut(
        dataset=dataset, split=split,
        captions=[ExampleCaption(id=firsts[i.id].id, text=firsts[i.id].text, image_id=i.id) for i in images],
        images=[ExampleImage(id=i.id, image_url=urls.image(i.id), thumbnail_url=urls.thumbnail(i.id),
                             name=firsts[i.id].text) for i in images],
    )


@router.get("/gallery", response_model=GalleryPageOut, responses=ERRORS)
def get_gallery(
    snapshot: SnapshotDep, urls: UrlsDep,
    scope: Annotated[Scope, Query(description=SCOPE_HELP)] = "all",
    q: Annotated[str, Query(max_length=MAX_QUERY_CHARS, description="keep images one of whose captions "
                                                                     "contains this (case folded)")] = "",
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_GALLERY_PAGE)] = 24,
    model: Annotated[str | None, Query(max_length=200, description="whose gallery; default the aoq-role model")] = None,
) -> GalleryPageOut:
    """A page of the searchable images, in catalogue order, named, optionally filtered by caption text."""
    served = snapshot.get(model) if model else snapshot.by_role("aoq") or next(iter(snapshot.models.values()), None)
    if served is None:
        raise ServiceError(404, "no model is served, so there is no gallery to browse")
    view = served.gallery.view
    matching = view.matching(q, view.image_range(scope))
    page = matching[offset:offset + limit]
    return GalleryPageOut(dataset=served.gallery.dataset, scope=scope, query=q, total=len(matching), offset=offset,
                          images=[gallery_image(served, int(p), urls) for p in page])
