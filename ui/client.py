"""A small typed HTTP client for the search service (the only way the UI gets results).

Every failure becomes a ``BackendError`` carrying a message fit to show in the page:

* ``BackendUnavailable``: nothing answers at the URL (refused, timed out, DNS);
* ``BackendError`` with ``status`` set: the backend answered 4xx/5xx; ``detail`` is its
  ``{"detail": ...}`` message (a 422's list of problems is flattened to ``field: msg; ...``);
* ``BackendError`` with ``status=None``: the answer is not the JSON the contract promises.

The contract is the backend's own pydantic models (``aoq_serve.schemas``, which imports pydantic
only, no torch or FAISS). They ignore unknown fields, so a newer backend may add fields; a field
the UI needs that is missing or mistyped becomes a ``BackendError`` naming it.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urljoin, urlsplit

import httpx
from pydantic import TypeAdapter, ValidationError

from aoq_serve.schemas import (
    CompareImageOut,
    CompareTextOut,
    DatasetOut,
    ExamplesOut,
    FailuresOut,
    GalleryPageOut,
    HealthOut,
    MetricsOut,
    ModelOut,
    NegativesOut,
)

DEFAULT_BACKEND_URL = "http://127.0.0.1:8000"
#: where the UI's own server relays the service's images (``aoq_ui.app``), so the browser needs
#: no route to the service.
MEDIA_PREFIX = "/media"
_IMAGE_PATH = re.compile(r"/images/\d+")
_LOCATIONS = ("body", "query", "path", "header", "cookie")
UPLOAD_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
#: answer fields holding an image URL the browser will load
URL_FIELDS = frozenset({"image_url", "thumbnail_url"})

T = TypeVar("T")


class BackendError(RuntimeError):
    """The backend could not give the answer asked for; ``str(exc)`` is shown to the user."""

    def __init__(self, message: str, status: int | None = None, detail: str | None = None):
        super().__init__(message)
        self.status = status
        self.detail = detail


class BackendUnavailable(BackendError):
    """Nothing answers at the backend URL."""


def rewrite_urls(payload: Any, to_browser: Callable[[str], str]) -> Any:
    """A copy of a JSON answer with every string under a ``URL_FIELDS`` key, at any depth,
    passed through ``to_browser``; everything else is kept as it is."""
    if isinstance(payload, list):
        return [rewrite_urls(item, to_browser) for item in payload]
    if isinstance(payload, dict):
        return {
            key: to_browser(value) if key in URL_FIELDS and isinstance(value, str) else rewrite_urls(value, to_browser)
            for key, value in payload.items()
        }
    return payload


def format_detail(detail: Any) -> str:
    """Turn a FastAPI ``detail`` (a string, or the 422 list of ``{loc, msg}``) into one line."""
    if detail is None:
        return ""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, Mapping):
                loc = [str(p) for p in item.get("loc", [])]
                if loc and loc[0] in _LOCATIONS:  # where FastAPI found the field, not its name
                    loc = loc[1:]
                msg = str(item.get("msg", item))
                parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


class BackendClient:
    """Calls the endpoints of docs/api.md and returns validated ``aoq_serve.schemas`` objects.

    The image URLs of every answer are rewritten for the browser (``browser_url``) before
    validation: by default to the UI's own relay (``/media/images/<id>``, served by
    ``aoq_ui.app`` through :meth:`image`), so one open port suffices; with ``public_url``, the
    backend's address as the browser reaches it, the browser loads them from the service.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BACKEND_URL,
        *,
        public_url: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.public_url = public_url.rstrip("/") if public_url else None
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BackendClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def browser_url(self, url: str) -> str:
        """An image URL from an answer as the browser must load it. Without ``public_url``: the
        relay's path (``/media/images/<id>?size=...``) for any URL of a service image. With it:
        relative URLs and those on ``base_url`` are moved to ``public_url``. Any other absolute
        URL is kept."""
        if self.public_url is None:
            parts = urlsplit(url)
            if _IMAGE_PATH.fullmatch(parts.path):
                return MEDIA_PREFIX + parts.path + (f"?{parts.query}" if parts.query else "")
            return url
        if url.startswith(self.base_url + "/"):
            return self.public_url + url[len(self.base_url):]
        return urljoin(self.public_url + "/", url)

    # -- endpoints ---------------------------------------------------------------------------

    def health(self) -> HealthOut:
        return self._get("/health", HealthOut)

    def models(self) -> list[ModelOut]:
        return self._get("/models", list[ModelOut])

    def datasets(self) -> list[DatasetOut]:
        return self._get("/datasets", list[DatasetOut])

    def examples(self, split: str = "test", n: int = 8) -> ExamplesOut:
        return self._get("/examples", ExamplesOut, params={"split": split, "n": n})

    def gallery(self, scope: str = "all", query: str = "", offset: int = 0, limit: int = 24) -> GalleryPageOut:
        """A page of the searchable images, filtered by caption text."""
        return self._get("/gallery", GalleryPageOut,
                         params={"scope": scope, "q": query, "offset": offset, "limit": limit})

    def image(self, image_id: int, size: int | None = None) -> tuple[bytes, str]:
        """An image file or thumbnail of the service and its media type (the UI's relay)."""
        params = {} if size is None else {"size": size}
        where = f"GET /images/{image_id}"
        response = self._send("GET", f"/images/{image_id}", where, params=params)
        return response.content, response.headers.get("content-type", "application/octet-stream")

    def compare_text(self, query: str, models: Sequence[str] | None = None, k: int = 10,
                     scope: str = "all", normalise: str = "none", intended: str | None = None) -> CompareTextOut:
        body: dict[str, Any] = {"query": query, "k": k, "scope": scope, "normalise": normalise}
        if models:
            body["models"] = list(models)
        if intended:
            body["intended"] = intended
        return self._call("POST", "/compare/text", CompareTextOut, json=body)

    def compare_image(
        self,
        *,
        image_id: int | None = None,
        file: str | Path | None = None,
        models: Sequence[str] | None = None,
        k: int = 10,
        scope: str = "all",
        normalise: str = "none",
    ) -> CompareImageOut:
        """Compare two models on a gallery image (``image_id``) or an uploaded PNG/JPEG (``file``)."""
        if (image_id is None) == (file is None):
            raise ValueError("give exactly one of image_id and file")
        # Every field goes as a multipart part (a (None, value) pair has no file name): the
        # contract is multipart/form-data even without an upload, which httpx would urlencode.
        fields: dict[str, tuple[str | None, bytes | str, str | None]] = {
            "k": (None, str(k), None), "scope": (None, scope, None), "normalise": (None, normalise, None)}
        if models:
            fields["models"] = (None, ",".join(models), None)
        if image_id is not None:
            fields["image_id"] = (None, str(image_id), None)
        else:
            path = Path(file)  # type: ignore[arg-type]
            mime = UPLOAD_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0]
            try:
                content = path.read_bytes()
            except OSError as exc:
                raise BackendError(f"cannot read the uploaded image {path}: {exc.strerror}") from exc
            fields["file"] = (path.name, content, mime or "application/octet-stream")
        return self._call("POST", "/compare/image", CompareImageOut, files=fields)

    def failures(
        self,
        direction: str,
        which: str,
        limit: int = 20,
        models: Sequence[str] | None = None,
        offset: int = 0,
    ) -> FailuresOut:
        """Queries one model ranks well and the other badly: ``direction`` is ``t2i`` or ``i2t``,
        ``which`` is ``baseline_only``, ``aoq_only`` or ``both`` (the backend checks them)."""
        params: dict[str, Any] = {"direction": direction, "which": which, "limit": limit, "offset": offset}
        if models:
            params["models"] = ",".join(models)
        return self._get("/failures", FailuresOut, params=params)

    def metrics(self, model: str) -> MetricsOut:
        return self._get(f"/metrics/{quote(model, safe='')}", MetricsOut)

    def negatives(self, kind: str, item_id: int, model: str, n: int = 5, seed: int | None = None) -> NegativesOut:
        """Offline (mined) and online (in-batch) hard negatives of a training item; ``seed``
        picks the random batch the online ones come from."""
        params: dict[str, Any] = {"kind": kind, "id": item_id, "model": model, "n": n}
        if seed is not None:
            params["seed"] = seed
        return self._get("/negatives", NegativesOut, params=params)

    # -- plumbing ----------------------------------------------------------------------------

    def _get(self, path: str, shape: type[T], params: Mapping[str, Any] | None = None) -> T:
        return self._call("GET", path, shape, params=params)

    def _send(self, method: str, path: str, where: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise BackendUnavailable(
                f"The search service at {self.base_url} did not answer {where} in time ({exc.__class__.__name__})."
            ) from exc
        except httpx.TransportError as exc:
            raise BackendUnavailable(
                f"The search service at {self.base_url} is not reachable ({exc.__class__.__name__}: {exc}). "
                "Start it with `aoq serve` or point the UI at it with --backend / AOQ_BACKEND_URL."
            ) from exc
        if response.status_code >= 400:
            raise _http_error(response, where)
        return response

    def _call(self, method: str, path: str, shape: type[T], **kwargs: Any) -> T:
        where = f"{method} {path}"
        response = self._send(method, path, where, **kwargs)
        try:
            payload = response.json()
        except ValueError as exc:
            raise BackendError(f"The search service answered {where} with something that is not JSON.") from exc
        try:
            return TypeAdapter(shape).validate_python(rewrite_urls(payload, self.browser_url))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "(root)"
            raise BackendError(
                f"The search service answered {where} with an unexpected shape: {field}: {first['msg']} "
                f"({exc.error_count()} problem(s)); are the UI and backend versions the same?"
            ) from exc


def _http_error(response: httpx.Response, where: str) -> BackendError:
    try:
        body = response.json()
        # A 422 carries its problems as a list too; formatted, it reads "query: ..." not "body.query: ...".
        detail = format_detail(body.get("errors") or body.get("detail"))
    except (ValueError, AttributeError):
        detail = response.text.strip()[:300] or response.reason_phrase
    status = response.status_code
    if status >= 500:
        message = f"The search service failed on {where} (HTTP {status}): {detail}"
    else:
        message = detail or f"The search service rejected {where} (HTTP {status})."
    return BackendError(message, status=status, detail=detail)


__all__ = [
    "DEFAULT_BACKEND_URL",
    "BackendClient",
    "BackendError",
    "BackendUnavailable",
    "format_detail",
    "rewrite_urls",
]
