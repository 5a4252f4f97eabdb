"""``aoq serve``: the REST search service (FastAPI on uvicorn). Settings come from ``AOQ_*``
environment variables; the flags below override them (docs/serving.md)."""

from __future__ import annotations

import argparse
import errno
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aoq_serve.config import Settings

#: shared memory, where the workers' shared files live when the system has it.
_SHM = Path("/dev/shm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalogue", dest="catalogue_url", default=None,
                        help="SQLAlchemy URL (env AOQ_CATALOGUE_URL; default sqlite file in the index dir)")
    parser.add_argument("--models-dir", type=Path, default=None, help="checkpoint folders (env AOQ_MODELS_DIR)")
    parser.add_argument("--index-dir", type=Path, default=None, help="written by aoq index (env AOQ_INDEX_DIR)")
    parser.add_argument("--data-dir", type=Path, default=None, help="the only tree images are read from (env AOQ_DATA_DIR)")
    parser.add_argument("--host", default=None, help="env AOQ_HOST (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="env AOQ_PORT (default 8000)")
    parser.add_argument("--device", default=None, help="env AOQ_DEVICE (default cpu)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes, 0 = one per CPU core (env AOQ_WORKERS, default 0)")
    parser.add_argument("--reload-poll", dest="reload_poll_s", type=float, default=None,
                        help="seconds between checks for a rebuilt index, 0 = never (env AOQ_RELOAD_POLL_S)")


def run(args: argparse.Namespace) -> int:
    from aoq_serve.config import Settings
    from aoq_serve.server import SPREAD_BY_KERNEL, listen, reserve
    from aoq_serve.store.integrity import check_catalogue

    overrides = {k: v for k, v in vars(args).items() if v is not None}
    settings = Settings(**overrides)
    workers = settings.worker_count()
    own_sockets = workers > 1 and SPREAD_BY_KERNEL
    try:
        # Bound before any model is loaded, so a busy port fails at once.
        sock = (reserve if own_sockets else listen)(settings.host, settings.port)
    except OSError as exc:
        why = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        print(f"aoq serve: error: cannot listen on {settings.host}:{settings.port}: {why}", file=sys.stderr)
        return 1
    claim = _claim(sock) if own_sockets else None
    try:
        if own_sockets and claim is None:
            # SO_REUSEPORT would let a second service of this user bind the port too
            print(f"aoq serve: error: cannot listen on {settings.host}:{settings.port}: the port is already in use "
                  "by another aoq serve", file=sys.stderr)
            return 1
        # Here rather than at application start-up, where a failure would end in a traceback.
        check_catalogue(settings)
        if workers == 1:
            return _serve_one(settings, sock)
        return _serve_workers(settings, sock, workers, own_sockets)
    finally:
        sock.close()
        if claim is not None:
            claim.close()


def _claim(sock: socket.socket) -> socket.socket | None:
    """A Unix socket in Linux's abstract namespace named after the port ``sock`` is bound to: only
    one process can hold the name, the kernel frees it when its holders end, and it leaves no
    file behind. None when another service holds it."""
    port = sock.getsockname()[1]
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0aoq-serve port {port}")
    except OSError:
        claim.close()
        return None
    return claim


def _serve_one(settings: Settings, sock: socket.socket) -> int:
    """One process: the app and the server in this process."""
    from aoq_serve.app import create_app
    from aoq_serve.server import make_server

    server = make_server(create_app(settings, check_catalogue=False), settings)
    server.run(sockets=[sock])
    # uvicorn leaves the loop without an exception when start-up fails (lifespan error)
    return 0 if server.started else 1


def _serve_workers(settings: Settings, sock: socket.socket, workers: int, own_sockets: bool) -> int:
    """``workers`` forked processes sharing the connection caps, the decode budget and the index
    pages (docs/serving.md, Workers); a worker that dies is replaced. With ``own_sockets`` each
    worker listens on a socket of its own bound to ``sock``'s address, else they all share
    ``sock``."""
    # Imported before the fork: the workers share these modules' pages and start sooner. No
    # model is loaded and no thread started here.
    from aoq_serve.app import create_app
    from aoq_serve.cluster.state import Shared
    from aoq_serve.cluster.supervisor import Supervisor
    from aoq_serve.cluster.worker import WorkerContext
    from aoq_serve.server import make_server, worker_socket

    share_dir = Path(tempfile.mkdtemp(prefix="aoq-serve-", dir=_SHM if _SHM.is_dir() else None))
    try:
        shared = Shared.create(share_dir, workers, settings.max_connections)

        def run_worker(worker: int) -> int:
            context = WorkerContext(shared.reopen(), worker, share_dir)
            app = create_app(settings, check_catalogue=False, cluster=context)
            server = make_server(app, settings, context.connections(settings))
            server.run(sockets=[worker_socket(sock) if own_sockets else sock])
            return 0 if server.started else 1

        print(f"aoq serve: {workers} worker processes on {settings.host}:{settings.port}", file=sys.stderr, flush=True)
        return Supervisor(workers, shared, run_worker).run()
    finally:
        shutil.rmtree(share_dir, ignore_errors=True)
