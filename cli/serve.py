"""``aoq serve``: the REST search service (FastAPI on uvicorn). Settings come from ``AOQ_*``
environment variables; the flags below override them (docs/serving.md)."""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalogue", dest="catalogue_url", default=None,
                        help="SQLAlchemy URL (env AOQ_CATALOGUE_URL; default sqlite file in the index dir)")
    parser.add_argument("--models-dir", type=Path, default=None, help="checkpoint folders (env AOQ_MODELS_DIR)")
    parser.add_argument("--index-dir", type=Path, default=None, help="written by aoq index (env AOQ_INDEX_DIR)")
    parser.add_argument("--data-dir", type=Path, default=None, help="the only tree images are read from (env AOQ_DATA_DIR)")
    parser.add_argument("--host", default=None, help="env AOQ_HOST (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="env AOQ_PORT (default 8000)")
    parser.add_argument("--device", default=None, help="env AOQ_DEVICE (default cpu)")
    parser.add_argument("--reload-poll", dest="reload_poll_s", type=float, default=None,
                        help="seconds between checks for a rebuilt index, 0 = never (env AOQ_RELOAD_POLL_S)")


def run(args: argparse.Namespace) -> int:
    from aoq_serve.app import create_app
    from aoq_serve.config import Settings
    from aoq_serve.store.integrity import check_catalogue
    from aoq_serve.server import listen, make_server

    overrides = {k: v for k, v in vars(args).items() if v is not None}
    settings = Settings(**overrides)
    try:
        # Bound before any model is loaded, so a busy port fails at once.
        sock = listen(settings.host, settings.port)
    except OSError as exc:
        why = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        print(f"aoq serve: error: cannot listen on {settings.host}:{settings.port}: {why}", file=sys.stderr)
        return 1
    try:
        # Here rather than at application start-up, where a failure would end in a traceback.
        check_catalogue(settings)
        server = make_server(create_app(settings, check_catalogue=False), settings)
        server.run(sockets=[sock])
    finally:
        sock.close()
    # uvicorn leaves the loop without an exception when start-up fails (lifespan error)
    return 0 if server.started else 1
