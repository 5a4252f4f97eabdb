"""The parent of the worker processes: forks ``workers`` children that serve the one port (each
on a socket of its own where the kernel spreads connections,
:data:`aoq_serve.server.SPREAD_BY_KERNEL`), replaces a child that dies while serving, and stops
them all on SIGTERM or SIGINT. It loads no model itself (the children do, after the fork), so
it stays small and forks no threads' state."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from aoq_serve.cluster.state import Shared

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1
#: seconds a stopping worker gets to finish its requests before it is killed.
STOP_GRACE_S = 30.0


class _Stop(Exception):
    """SIGTERM or SIGINT reached the supervisor."""


def _stop(signum: int, _frame: object) -> None:
    raise _Stop(signum)


class Supervisor:
    """Runs ``run_worker(worker_index)`` in ``workers`` forked children until told to stop.

    A child that dies after it published its state (it was serving) is replaced under the same
    index, with what it held dropped first (:meth:`Shared.forget`); one that dies before (it
    could not start) stops the service: every replacement would fail the same way.
    """

    def __init__(self, workers: int, shared: Shared, run_worker: Callable[[int], int]) -> None:
        self.workers, self.shared, self.run_worker = workers, shared, run_worker
        self.children: dict[int, int] = {}

    def _fork(self, worker: int) -> None:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                _end_with_parent(parent)
                code = self.run_worker(worker)
            except BaseException:
                log.exception("worker %d failed", worker)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children[pid] = worker

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit status 0) or until a worker fails to start (1)."""
        previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
        status = 0
        try:
            for worker in range(self.workers):
                self._fork(worker)
            while True:
                pid, code = os.waitpid(-1, 0)
                worker = self.children.pop(pid, None)
                if worker is None:
                    continue
                served = int(self.shared.workers[worker, 2]) > 0
                self.shared.forget(worker)
                if not served:
                    log.error("worker %d (pid %d) could not start; stopping the service", worker, pid)
                    status = 1
                    break
                log.warning("worker %d (pid %d) ended (%s); starting a new one", worker, pid, _how(code))
                self._fork(worker)
        except _Stop:
            pass
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._stop_children()
        return status

    def _stop_children(self) -> None:
        for pid in self.children:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.children:
            for pid in list(self.children):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    del self.children[pid]
                elif time.monotonic() > deadline:
                    _signal(pid, signal.SIGKILL)
            time.sleep(0.05)


def _end_with_parent(parent: int) -> None:
    """Have the kernel send SIGTERM to this worker when the supervisor dies (even by SIGKILL), so
    no worker keeps serving without it (Linux; elsewhere a worker outlives a killed supervisor)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the supervisor died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _how(code: int) -> str:
    if os.WIFSIGNALED(code):
        return f"killed by {signal.Signals(os.WTERMSIG(code)).name}"
    return f"exit status {os.waitstatus_to_exitcode(code)}"
