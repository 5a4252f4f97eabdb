"""The UI's relay of the service's images: ``/media/images/<id>?size=`` on the UI's own server
answers with the service's ``/images/<id>``, so a browser that reaches the page sees the
pictures without a route to the service's port."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from fastapi.responses import Response
from fastapi.routing import APIRoute

from aoq_serve.schemas import MAX_ID, MAX_IMAGE_SIZE, MIN_IMAGE_SIZE
from aoq_ui.client import MEDIA_PREFIX, BackendClient, BackendError

#: how long a browser may keep a picture (the catalogue's images never change under an id).
CACHE_SECONDS = 3600


def media_routes(client: BackendClient) -> list[APIRoute]:
    """The relay's route, to add to the page's web application."""

    def image(image_id: Annotated[int, Path(ge=0, le=MAX_ID)],
              size: Annotated[int | None, Query(ge=MIN_IMAGE_SIZE, le=MAX_IMAGE_SIZE)] = None) -> Response:
        try:
            content, media_type = client.image(image_id, size)
        except BackendError as exc:
            status = exc.status if exc.status is not None and exc.status < 500 else 502
            return Response(str(exc), status_code=status, media_type="text/plain")
        return Response(content, media_type=media_type, headers={"Cache-Control": f"public, max-age={CACHE_SECONDS}"})

    return [APIRoute(f"{MEDIA_PREFIX}/images/{{image_id}}", image, methods=["GET"], include_in_schema=False)]
