"""What each worker is serving, readable by every worker (``/health`` lists them), and reloads
that reach every worker: ``POST /admin/reload`` reloads the worker it reached, asks the others
and waits until each live worker has reloaded (a watcher thread in each worker answers)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from aoq_serve.cluster.state import STATE_BYTES, Shared

log = logging.getLogger(__name__)
_PID, _DONE, _LENGTH = 0, 1, 2
#: how often a worker looks for a reload request and republishes its state when it changed.
POLL_S = 0.05


class Board:
    """One worker's access to the shared states and reload requests."""

    def __init__(self, shared: Shared, worker: int) -> None:
        self.shared, self.worker = shared, worker

    def join(self) -> None:
        """Mark this worker live; it loads its models after this, so earlier reload requests are done."""
        with self.shared.locked():
            self.shared.workers[self.worker] = (os.getpid(), int(self.shared.reload[0]), 0)

    def publish(self, state: dict[str, Any]) -> None:
        data = json.dumps({**state, "worker": self.worker, "pid": os.getpid()}).encode()[:STATE_BYTES]
        with self.shared.locked():
            self.shared.states[self.worker, :len(data)] = memoryview(data)
            self.shared.workers[self.worker, _LENGTH] = len(data)

    def states(self) -> list[dict[str, Any]]:
        """The published state of every live worker, in worker order."""
        with self.shared.locked():
            rows = [(int(pid), bytes(self.shared.states[w, :length])) for w, (pid, _, length)
                    in enumerate(self.shared.workers.tolist()) if pid and length]
        return [json.loads(data) for _, data in rows]

    def request_reload(self) -> int:
        """Ask every worker to reload; this worker has done so already. Returns the request number."""
        with self.shared.locked():
            self.shared.reload[0] += 1
            number = int(self.shared.reload[0])
            self.shared.workers[self.worker, _DONE] = number
        return number

    def pending(self) -> int | None:
        """The newest reload request when this worker has not done it yet."""
        with self.shared.locked():
            number = int(self.shared.reload[0])
            return number if self.shared.workers[self.worker, _DONE] < number else None

    def done(self, number: int) -> None:
        with self.shared.locked():
            self.shared.workers[self.worker, _DONE] = max(number, int(self.shared.workers[self.worker, _DONE]))

    def wait_all(self, number: int, timeout_s: float) -> bool:
        """Wait until every live worker has done reload request ``number``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.shared.locked():
                lagging = any(pid and done < number for pid, done, _ in self.shared.workers.tolist())
            if not lagging:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S / 5)


class BoardWatcher:
    """A worker's thread that answers other workers' reload requests and publishes this
    worker's state (``state()``) whenever it changes."""

    def __init__(self, board: Board, reload: Callable[[], object], state: Callable[[], dict[str, Any]]) -> None:
        self.board, self._reload, self._state = board, reload, state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aoq-worker-board", daemon=True)
        self._published: dict[str, Any] | None = None

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def refresh(self) -> None:
        """Publish this worker's state if it changed since last published."""
        state = self._state()
        if state != self._published:
            self.board.publish(state)
            self._published = state

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            number = self.board.pending()
            if number is not None:
                try:
                    self._reload()
                except Exception:  # the old snapshot keeps serving; /health shows its generation
                    log.exception("reload asked by another worker failed")
                self.refresh()  # before done: the asking worker reads the states once all are done
                self.board.done(number)
            self.refresh()
