"""Which names the service answers to, and the base of the image URLs it hands out.

A browser lets a page on ``evil.example`` send requests to ``evil.example`` after its DNS name
was re-pointed at 127.0.0.1 (DNS rebinding): the request reaches the loopback service with
``Host: evil.example``. So every request's ``Host`` must be a loopback name, the address the
service listens on, the host of ``AOQ_PUBLIC_URL`` or one of ``AOQ_ALLOWED_HOSTS`` (400
otherwise), and image URLs are built from the configured public URL (or, without one, from the
local address the connection arrived on), never from the ``Host`` header.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

from aoq_serve.config import Settings

Scope = dict[str, Any]
#: names a loopback client may use besides loopback addresses.
LOOPBACK_NAMES = frozenset({"localhost"})
#: listening addresses that mean "every interface": not a name a client sends.
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def host_name(host_header: str) -> str:
    """The name of a ``Host`` value without its port or IPv6 brackets, lower-cased."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    name, _, _ = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return name


def _is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_names(settings: Settings) -> frozenset[str]:
    """The non-loopback names the ``Host`` header may carry for this configuration."""
    names = {n.strip().lower() for n in settings.allowed_hosts if n.strip()}
    if settings.host.strip("[]").lower() not in WILDCARDS:
        names.add(settings.host.strip("[]").lower())
    if settings.public_url:
        names.add((urlsplit(settings.public_url).hostname or "").lower())
    return frozenset(names - {""})


def public_base(settings: Settings, scope: Scope) -> str:
    """The base of the absolute URLs in answers: ``AOQ_PUBLIC_URL``, else the local address of
    the connection (the socket's own address, not anything the client wrote)."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    host, port = scope.get("server") or (settings.host, settings.port)
    shown = f"[{host}]" if ":" in str(host) else str(host)
    return f"{scope.get('scheme', 'http')}://{shown}:{port}"


class HostCheckMiddleware:
    """Pure ASGI middleware answering 400 to requests whose ``Host`` is not an allowed name."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app, self.allowed = app, allowed_names(settings)

    def accepts(self, host_header: str) -> bool:
        name = host_name(host_header)
        return _is_loopback(name) or name in self.allowed

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        if self.accepts(given):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": f"Host {given!r} is not a name of this service; configure it with "
                                     f"AOQ_PUBLIC_URL or AOQ_ALLOWED_HOSTS"}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
