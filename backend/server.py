"""The HTTP server around the app: the listening socket, and uvicorn's h11 protocol with the
guards a service exposed to a network needs.

- **No Nagle stall.** asyncio sets ``TCP_NODELAY`` on accepted connections only when the
  listening socket was created with protocol ``IPPROTO_TCP``; with protocol 0 every response
  after the first on a kept-alive connection waited for the client's delayed ACK (~40 ms).
  :func:`listen` creates it as a TCP socket, and each response's writes of one event-loop step
  (status line and headers, body, end of message) leave in one ``send``.
- **Read timeouts.** A request's headers must arrive within ``header_timeout_s`` of its first
  byte (or of the connection opening) and its body within ``body_timeout_s`` of the headers;
  otherwise the connection is answered 408 (when the headers were complete) and closed.
  uvicorn itself only times out idle kept-alive connections, so half-sent requests were held
  forever.
- **Connection caps.** Beyond ``max_connections`` open connections, a new one is answered 503
  and closed at once; so is a client's connection beyond ``max_client_connections`` open from
  its address, so one client holding many idle sockets is refused alone instead of starving
  every other client of the global cap. HTTP/1.1 answers one request at a time per connection,
  so this caps a client's concurrent requests too. With several worker processes the counts are
  those of all workers together (:class:`aoq_serve.cluster.connections.SharedConnections`).
- **Event loop.** uvloop where it is installed (a dependency of the service on Linux and macOS,
  taken by uvicorn's default loop choice): the event-loop thread runs every request's HTTP work
  under the GIL, and uvloop's loop and transports cost less of it per request than asyncio's
  (docs/serving.md, Speed).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from aoq_serve.config import Settings

_REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
#: h11 states of the client once its request has been read completely.
_REQUEST_READ = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)


#: Whether several worker processes each listen on a socket of their own bound to the one port
#: (``SO_REUSEPORT``), so that the kernel spreads new connections among them: on one shared
#: listening socket the worker that woke first accepted most of a burst of keep-alive connections
#: and served them on one core (docs/serving.md, Workers). Linux only: elsewhere ``SO_REUSEPORT``
#: does not spread connections, and the workers share one listening socket.
SPREAD_BY_KERNEL = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def _bound(host: str, port: int, shared: bool) -> socket.socket:
    """A TCP socket (``IPPROTO_TCP``, so accepted connections get ``TCP_NODELAY``) bound to the
    address; ``shared``: with ``SO_REUSEPORT``, for the sockets of several workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket, inherited by forked workers where they share it.

    Raises:
        OSError: the address is in use or cannot be bound.
    """
    sock = _bound(host, port, shared=False)
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def reserve(host: str, port: int) -> socket.socket:
    """The address of a service whose workers listen on sockets of their own
    (:data:`SPREAD_BY_KERNEL`), held by the parent process: bound, not listening, so it takes
    no connection itself.

    Raises:
        OSError: the address is in use or cannot be bound.
    """
    return _bound(host, port, shared=True)


def worker_socket(reserved: socket.socket) -> socket.socket:
    """A worker's own socket on the address :func:`reserve` holds, bound and not listening yet:
    the server listens on it once the worker's application has started, so no connection waits
    in the queue of a worker still loading its models while the others answer."""
    host, port = reserved.getsockname()[:2]
    return _bound(host, port, shared=True)


class ClientConnections:
    """The connection caps of one process: open connections in all, and per client address
    (event loop thread only)."""

    def __init__(self, max_connections: int, max_client_connections: int) -> None:
        self.max_connections, self.max_client_connections = max_connections, max_client_connections
        self.per_client: Counter[str] = Counter()
        self.open = 0

    def admit(self, address: str) -> bool:
        """Count a new connection from ``address`` unless a cap is reached (then count nothing)."""
        if self.open + 1 > self.max_connections or self.per_client[address] >= self.max_client_connections:
            return False
        self.per_client[address] += 1
        self.open += 1
        return True

    def release(self, address: str) -> None:
        """Uncount a connection that :meth:`admit` counted."""
        self.per_client[address] -= 1
        self.open -= 1
        if self.per_client[address] <= 0:
            del self.per_client[address]


class Connections(Protocol):
    def admit(self, address: str) -> bool: ...

    def release(self, address: str) -> None: ...


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    body_timeout_s: float


class _CoalescingTransport:
    """Collects the writes of one event-loop step and sends them together.

    uvicorn writes a response as separate pieces (headers, body, end of message); small
    responses then leave as one TCP segment instead of two or three. Everything but ``write``
    and closing is the real transport's.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def flush(self) -> None:
        if self._pending and not self._transport.is_closing():
            self._transport.write(b"".join(self._pending))
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read timeouts, a connection cap and coalesced writes."""

    limits: Limits
    #: the connection caps, shared by the connections of one server (or of all its workers).
    connections_counted: Connections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        self._counted: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.connections_counted.admit(address):
            self.transport.write(_REFUSED)
            self.transport.close()
            return
        self._counted = address
        self._watch_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            self.connections_counted.release(self._counted)
            self._counted = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A pipelined request may already be half read; an idle connection is uvicorn's keep-alive.
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self._disarm()
        else:
            self._watch_request()

    def _watch_request(self) -> None:
        """Arm the timer of the part of the request being read (headers or body), or disarm it."""
        state = self.conn.their_state
        if self.transport.is_closing() or state in _REQUEST_READ:
            self._disarm()
            return
        phase = "headers" if state is h11.IDLE else "body"
        if phase == self._phase:
            return
        self._disarm()
        timeout = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
        self._phase, self._deadline = phase, self.loop.call_later(timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # The app has not answered yet (it is still waiting for the body): say why before closing.
        if self._phase == "body" and (self.cycle is None or not self.cycle.response_started):
            self.transport.write(_TIMED_OUT)
        self._phase = None
        self.transport.close()


def protocol_class(settings: Settings, connections: Connections | None = None) -> type[GuardedH11Protocol]:
    """:class:`GuardedH11Protocol` with the limits of ``settings``, counting connections in
    ``connections`` (default: this process's own :class:`ClientConnections`)."""
    limits = Limits(settings.header_timeout_s, settings.body_timeout_s)
    counted = connections or ClientConnections(settings.max_connections, settings.max_client_connections)
    return type("ServiceH11Protocol", (GuardedH11Protocol,), {"limits": limits, "connections_counted": counted})


def make_server(app: Any, settings: Settings, connections: Connections | None = None) -> uvicorn.Server:
    """The uvicorn server for ``app`` with the timeouts and limits of ``settings`` (connections
    counted as :func:`protocol_class` says)."""
    config = uvicorn.Config(
        app, http=protocol_class(settings, connections), log_level=settings.log_level, access_log=False,
        timeout_keep_alive=settings.keep_alive_s,
    )
    return uvicorn.Server(config)
