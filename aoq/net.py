"""Local ports and readiness of HTTP servers: what the demo, the benchmarks and the tests share."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


class ServerNotReady(RuntimeError):
    """A server exited, or did not answer, before it was ready; the message says which."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (checked by binding, as a server would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As uvicorn and Gradio do: connections of a server that just stopped linger in TIME_WAIT
        # for a minute and do not stop a new server from binding; a listening socket does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wait_http(
    url: str,
    *,
    proc: subprocess.Popen | None = None,
    what: str = "the server",
    timeout: float = 180.0,
    ready: Callable[[Any], bool] = lambda body: True,
    interval: float = 0.2,
) -> Any:
    """Poll ``url`` until it answers 200 with a body that ``ready`` accepts; return that body
    (parsed as JSON when it is JSON, else the raw bytes).

    Raises:
        ServerNotReady: ``proc`` exited first, or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerNotReady(f"{what} exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2.0) as answer:
                raw = answer.read()
                status = answer.status
        except (urllib.error.URLError, OSError):
            status, raw = None, b""
        if status == 200:
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            if ready(body):
                return body
        time.sleep(interval)
    raise ServerNotReady(f"{what} did not answer {url} within {timeout:.0f} s")
