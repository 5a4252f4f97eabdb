"""Request bodies are capped while they stream in, before anything is parsed or spooled.

A declared ``Content-Length`` over the limit is refused without parsing; a body without one
(chunked) is counted as it arrives and the request is cut off as soon as it passes the limit, so
an endless upload never fills memory or the temporary directory.

When the declared length is at most ``DRAIN_FACTOR`` times the limit, the body is read and
thrown away before the 413 is sent: a server that answers and closes while the client is still
sending makes the client see a reset connection instead of the answer (seen on loopback with an
11 MB upload). Larger declared bodies, and chunked bodies of unknown length, are cut off at once;
their clients may see the connection close instead of the 413.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]
#: how much of an oversized body is read (and discarded) so that the client can read the 413.
DRAIN_FACTOR = 4


class BodyLimitMiddleware:
    """Pure ASGI middleware answering 413 to bodies larger than ``max_bytes``."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"request body too large: the limit is {self.max_bytes} bytes"}).encode()
        await send({
            "type": "http.response.start", "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _drain(receive: Any) -> None:
        """Read and discard the body (its declared length is bounded by the caller)."""
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if int(declared) <= DRAIN_FACTOR * self.max_bytes:
                await self._drain(receive)
            await self._refuse(send)
            return
        received, too_large, started = 0, False, False

        async def limited_receive() -> dict:
            nonlocal received, too_large
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # The app sees a disconnect and stops parsing; the 413 is sent below.
                    too_large = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict) -> None:
            nonlocal started
            if too_large:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
        if too_large and not started:
            await self._refuse(send)
