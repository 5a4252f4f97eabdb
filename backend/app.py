"""The FastAPI application: ``create_app(settings)`` wires the catalogue, the model registry, the
query log and the routers; errors of every kind become JSON ``{"detail": ...}``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from aoq_serve.cluster.board import BoardWatcher
from aoq_serve.cluster.worker import WorkerContext
from aoq_serve.config import Settings
from aoq_serve.deps import Service
from aoq_serve.docs_page import add_docs_pages
from aoq_serve.errors import ServiceError
from aoq_serve.guards.faults import CatalogueDamage, Faults, endpoint, first_line
from aoq_serve.guards.hosts import HostCheckMiddleware
from aoq_serve.guards.limits import BodyLimitMiddleware
from aoq_serve.index.faiss_index import set_search_threads
from aoq_serve.index.shared import set_share_dir
from aoq_serve.registry import Registry
from aoq_serve.routes import analysis, items, search, service
from aoq_serve.search.batching import set_batching
from aoq_serve.search.decode import MemoryBudget
from aoq_serve.search.negatives import NegativesService
from aoq_serve.store.db import make_engine, session_factory
from aoq_serve.store.integrity import check_catalogue
from aoq_serve.store.querylog import QueryLogger
from aoq_serve.version import VERSION

log = logging.getLogger(__name__)
#: room for the multipart framing and the other form fields around a maximal upload.
_FORM_OVERHEAD = 64 * 1024


def start_service(settings: Settings, check: bool = True, cluster: WorkerContext | None = None) -> Service:
    """Check and open the catalogue, check and load every model, start the background threads.

    Args:
        check: run :func:`aoq_serve.store.integrity.check_catalogue` first (``aoq serve`` has run it
            already, before the server starts, to report a bad catalogue in one line).
        cluster: this worker's place among several worker processes (None: the only process).

    Raises:
        CatalogueError: the catalogue is missing, damaged or not written by ``aoq index``.
    """
    torch.set_num_threads(settings.torch_threads)
    set_search_threads(settings.faiss_threads)
    set_batching(settings.batching)
    set_share_dir(cluster.share_dir if cluster else None)
    board = cluster.board() if cluster else None
    if board is not None:
        board.join()
    if check:
        check_catalogue(settings)
    engine = make_engine(settings.catalogue(), create=False)
    sessions = session_factory(engine)
    faults = Faults()
    registry = Registry(settings, sessions, faults)
    registry.start()
    querylog = QueryLogger(sessions, enabled=settings.query_log)
    querylog.start()
    budget_bytes = settings.decode_memory_budget_mb * 1024 * 1024
    budget = cluster.decode_budget(settings) if cluster else MemoryBudget(budget_bytes)
    svc = Service(settings=settings, engine=engine, sessions=sessions, registry=registry, querylog=querylog,
                  negatives=NegativesService(settings.data_dir, sessions), decode_budget=budget, faults=faults,
                  board=board)
    if board is not None:
        svc.watcher = BoardWatcher(board, svc.reload, svc.state)
        svc.watcher.start()
    return svc


def stop_service(svc: Service) -> None:
    if svc.watcher is not None:
        svc.watcher.stop()
    svc.registry.stop()
    svc.querylog.close()
    svc.engine.dispose()


def _problems(exc: RequestValidationError) -> list[dict]:
    return [{"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": str(e.get("msg"))} for e in exc.errors()]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = _problems(exc)
        # "body.query: String should have at most 1000 characters; query.k: ..." reads on one line
        text = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in problems)
        return JSONResponse({"detail": text or "invalid request", "errors": problems}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    def disable(request: Request, reason: str) -> JSONResponse:
        # Damage found while serving: disable the endpoint (one log line), never a 500 per request.
        part = endpoint(request.scope)
        request.app.state.service.faults.disable(part, reason)
        return JSONResponse({"detail": f"{part} is disabled: {reason}; repair or rebuild the catalogue, then "
                                       f"POST /admin/reload"}, status_code=503)

    @app.exception_handler(SQLAlchemyError)
    async def catalogue_error(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        return disable(request, f"the catalogue cannot be read ({first_line(exc)})")

    @app.exception_handler(CatalogueDamage)
    async def catalogue_damage(request: Request, exc: CatalogueDamage) -> JSONResponse:
        return disable(request, f"the catalogue is damaged ({exc})")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Last resort only: every expected problem is a ServiceError or a validation error.
        # The server closes the connection after a 500; saying so lets the client reconnect
        # instead of sending its next request into a closed connection.
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal error (logged on the server)"}, status_code=500,
                            headers={"Connection": "close"})


def create_app(settings: Settings | None = None, check_catalogue: bool = True,
               cluster: WorkerContext | None = None) -> FastAPI:
    """The application; models are loaded when it starts (lifespan), not when it is created.

    Args:
        check_catalogue: check the catalogue at start-up (see :func:`start_service`).
        cluster: this worker's place among several worker processes (None: the only process).
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.service = start_service(settings, check=check_catalogue, cluster=cluster)
        try:
            yield
        finally:
            stop_service(app.state.service)

    app = FastAPI(
        title="AOQ image-text retrieval",
        version=VERSION,
        description="Sentence -> images and image -> sentences with baseline and AOQ models (docs/api.md).",
        lifespan=lifespan, docs_url=None, redoc_url=None,
    )
    add_docs_pages(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_upload_bytes + _FORM_OVERHEAD)
    # Added last, so it runs first: a request with a foreign Host is answered before anything else.
    app.add_middleware(HostCheckMiddleware, settings=settings)
    if settings.cors_origins:
        # Off unless configured: the UI calls the API from its server, not from the browser.
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Authorization"])
    _install_error_handlers(app)
    for module in (service, search, items, analysis):
        app.include_router(module.router)
    return app
