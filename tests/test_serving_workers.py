"""``aoq serve`` with several worker processes (``AOQ_WORKERS``): the same answers as one
process, the connection caps counted across workers, reloads reaching every worker, ``/health``
listing each, and a killed worker replaced. Real servers on 127.0.0.1, random ports."""

from __future__ import annotations

import http.client
import json
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.backend_helpers import ServiceFixture, build_service_fixture, serve_env, serve_process, start_serve

WORKERS = 2
QUERIES = [{"query": q, "model": m, "k": 7} for q in ("a red circle", "a big blue square on the left", "green")
           for m in ("aoq", "baseline")]


CAP = 8


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> ServiceFixture:
    return build_service_fixture(tmp_path_factory.mktemp("workers"))


@pytest.fixture(scope="module")
def several(fx) -> Iterator[tuple[int, subprocess.Popen]]:
    """One server of ``WORKERS`` workers for the whole module (each start loads every model per worker)."""
    with serve_process(fx, workers=WORKERS, max_client_connections=CAP, header_timeout_s=60) as server:
        port = server[0]
        _until(lambda: len(_workers(port)) == WORKERS, what="every worker published its state")
        yield server


def _fresh_get(port: int, path: str) -> dict:
    # A new connection each time, so that the kernel hands requests to every worker.
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        response = client.get(path)
    response.raise_for_status()
    return response.json()


def _answers(port: int) -> list[dict]:
    out = []
    for _ in range(3):  # each query several times, on fresh connections: several workers answer
        for query in QUERIES:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                response = client.post("/search/text", json=query)
            assert response.status_code == 200, response.text
            # image links carry the server's address, which differs between the two servers
            answer = json.loads(response.text.replace(f"127.0.0.1:{port}", "SERVER"))
            del answer["latency_ms"]
            out.append(answer)
    return out


def _until(predicate, within_s: float = 60.0, what: str = "the condition"):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not hold within {within_s} s")


def _workers(port: int) -> list[dict]:
    return _fresh_get(port, "/health")["workers"]


def test_several_workers_answer_as_one_worker_does(fx, several):
    with serve_process(fx, workers=1) as (port, proc):
        one = _answers(port)
        assert [(w["worker"], w["pid"]) for w in _workers(port)] == [(0, proc.pid)]  # the process itself
    port = several[0]
    assert len({w["pid"] for w in _workers(port)}) == WORKERS
    assert _answers(port) == one


def test_reload_reaches_every_worker_and_health_lists_each(fx, several):
    port, proc = several
    workers = _workers(port)
    generation = workers[0]["generation"]
    assert [w["worker"] for w in workers] == list(range(WORKERS))
    assert {w["generation"] for w in workers} == {generation}
    assert all(w["status"] == "ok" and w["pid"] != proc.pid for w in workers)

    fx.index()  # a new generation on disk; AOQ_RELOAD_POLL_S=0: only the admin reload picks it up
    reloaded = httpx.post(f"http://127.0.0.1:{port}/admin/reload", json={}, timeout=120).json()
    assert reloaded["generation"] == generation + 1
    assert [(w["worker"], w["generation"]) for w in reloaded["workers"]] == \
        [(w, generation + 1) for w in range(WORKERS)]
    for _ in range(6):
        health = _fresh_get(port, "/health")
        assert health["generation"] == generation + 1  # whichever worker answered
        assert {w["generation"] for w in health["workers"]} == {generation + 1}


#: the client addresses of the spread test's connections, ``CAP`` from each, opened together.
BURST_SOURCES = ("127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13")


def test_connections_opened_together_are_spread_over_the_workers(several):
    """Connections opened at once (a client's pool of keep-alive connections) reach every worker.
    On one shared listening socket the worker that woke first accepted nearly all of them and
    served them on one core (docs/serving.md, Workers); on sockets of their own (SO_REUSEPORT)
    the kernel spreads them. 32 connections: each worker gets at least 5 unless the kernel's
    hash splits them worse than 1 in 50,000 splits would."""
    port = several[0]
    start = threading.Barrier(len(BURST_SOURCES) * CAP)

    def answering_worker(source: str) -> int:
        start.wait()
        with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            response = http.client.HTTPResponse(s)
            response.begin()
            assert response.status == 200
            return json.loads(response.read())["worker"]

    with ThreadPoolExecutor(len(BURST_SOURCES) * CAP) as pool:
        answered = Counter(pool.map(answering_worker, [source for source in BURST_SOURCES for _ in range(CAP)]))
    assert sorted(answered) == list(range(WORKERS)) and min(answered.values()) >= 5, answered


def test_a_second_service_on_the_port_is_refused(fx, several):
    """Sockets of their own let any process of this user bind the port too (SO_REUSEPORT): a
    second ``aoq serve`` there is refused, rather than taking a share of the first one's clients."""
    second = start_serve(serve_env(fx, workers=WORKERS), several[0])
    try:
        _, err = second.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        second.kill()
        second.communicate()
        pytest.fail("a second aoq serve started on the port of the first")
    assert second.returncode == 1
    assert "already in use by another aoq serve" in err


def _held(port: int, n: int, source: str = "127.0.0.1") -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) for _ in range(n)]


def _refused(socks: list[socket.socket], within_s: float = 5.0) -> list[socket.socket]:
    """Those of ``socks`` the server answered 503 within ``within_s`` (it does so on accepting).

    Waits the whole window: which of several connections opened together the workers accept
    first is up to the kernel and the scheduler, so only the count over all of them is fixed."""
    refused = []
    with selectors.DefaultSelector() as selector:
        for s in socks:
            selector.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + within_s
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                selector.unregister(key.fileobj)
                if key.fileobj.recv(64).startswith(b"HTTP/1.1 503 "):
                    refused.append(key.fileobj)
    return refused


def test_connection_caps_hold_across_workers_and_a_killed_worker_is_replaced(several):
    port = several[0]
    before = _workers(port)
    opened = _held(port, CAP + 4)
    other = _held(port, 1, source="127.0.0.2")[0]
    try:
        # Counted per worker, the workers would have taken up to WORKERS * CAP from one address.
        refused = _refused(opened)
        assert len(refused) == 4
        idle = [s for s in opened if s not in refused]
        other.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert other.recv(4096).startswith(b"HTTP/1.1 200 ")

        # Kill every worker in turn: each is replaced, and the connections it held stop counting
        # (all CAP were held by the workers killed, however the kernel spread them).
        for victim in before:
            os.kill(victim["pid"], signal.SIGKILL)
            after = _until(lambda: (w := _workers_safely(port, "127.0.0.3")) and len(w) == WORKERS
                           and victim["pid"] not in {x["pid"] for x in w} and w, what="the killed worker replaced")
            assert [w["worker"] for w in after] == list(range(WORKERS))
        assert sum(_closed(s) for s in idle) == CAP
        fresh = _held(port, CAP + 1)
        assert len(_refused(fresh)) == 1
        for s in fresh:
            s.close()
    finally:
        for s in opened + [other]:
            s.close()


def _workers_safely(port: int, source: str) -> list[dict] | None:
    """``/health``'s workers from another client address (127.0.0.1 is at its cap here)."""
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10,
                          transport=httpx.HTTPTransport(local_address=source)) as client:
            return client.get("/health").json()["workers"]
    except httpx.HTTPError:
        return None


def _closed(s: socket.socket) -> bool:
    """Whether the server closed this idle connection (its worker died)."""
    s.settimeout(0.2)
    try:
        return s.recv(64) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
