"""The compose test's slow part (a Docker engine, the base image, ``docker-compose build``) run in
the background from the start of the session, so that it overlaps the rest of the suite instead
of adding its minutes to it; ``tests/test_compose_run.py`` waits for it and runs last.

The images' names are fixed in ``docker-compose.yml``, so a build under any project name serves
the test's project. Whatever starts here is stopped at the end of the session even when the
compose tests never ran (deselected, or the session stopped early): a build still running is
terminated, and a ``dockerd`` the engine script had to start is stopped.

Under pytest-xdist the preparation runs in the controller process, once the workers' collection
shows the compose module, and writes how it went to the file named by :data:`STATE_ENV`; the
worker that runs the compose tests waits for that file (:class:`SharedPrebuild`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from aoq.io import atomic_write_json

REPO = Path(__file__).resolve().parents[1]
FILES = ["-f", "docker-compose.yml", "-f", "docker/quick.yml"]
ENGINE_TIMEOUT_S = 120
BASE_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 2400
MODULE = "test_compose_run.py"
#: the state file of a preparation run by the pytest-xdist controller for its workers
STATE_ENV = "AOQ_COMPOSE_PREBUILD_STATE"


def stop_engine(pid: str) -> None:
    """Stop a ``dockerd`` that ``scripts/docker-engine.sh`` started (a no-op once it is gone)."""
    subprocess.run(["bash", "scripts/docker-engine.sh", "--stop", pid], cwd=REPO, capture_output=True, text=True,
                   timeout=ENGINE_TIMEOUT_S)


@dataclass
class Prebuild:
    """What the background preparation did: ``skip`` says why the stack cannot run here,
    ``failure`` which step failed and its output; ``dockerd_pid`` is a daemon it started."""

    skip: str | None = None
    failure: str | None = None
    dockerd_pid: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    state_file: Path | None = None
    _thread: threading.Thread | None = None
    _running: subprocess.Popen | None = None
    _cancelled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self) -> None:
        try:
            self._prepare()
        finally:
            self._publish()

    def _publish(self) -> None:
        """The outcome, for the workers of a pytest-xdist session."""
        if self.state_file is not None:
            atomic_write_json(self.state_file, {"skip": self.skip, "failure": self.failure,
                                                "dockerd_pid": self.dockerd_pid, "timings": self.timings})

    def _prepare(self) -> None:
        start = time.monotonic()
        engine = self._call(["bash", "scripts/docker-engine.sh"], "scripts/docker-engine.sh", ENGINE_TIMEOUT_S)
        if engine is None:
            return
        if engine.returncode != 0:
            self.skip = f"no Docker engine: {engine.stderr.strip()}"
            return
        self.dockerd_pid = engine.stdout.strip() or None
        for argv, what, timeout, key in (
            (["bash", "scripts/docker-base.sh"], "scripts/docker-base.sh", BASE_TIMEOUT_S, "base_s"),
            (["docker-compose", *FILES, "build"], "docker-compose build", BUILD_TIMEOUT_S, "build_s"),
        ):
            mark = time.monotonic()
            out = self._call(argv, what, timeout)
            if out is None:
                return
            if out.returncode != 0:
                self.failure = f"{what} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
                return
            self.timings[key] = time.monotonic() - mark
        self.timings["prepared_s"] = time.monotonic() - start

    def _call(self, argv: list[str], what: str, timeout: float) -> subprocess.CompletedProcess | None:
        """Runs one step; None (and ``failure`` set) when it timed out or the session ended."""
        with self._lock:  # stop() either sees this process or keeps it from starting
            if self._cancelled:
                self.failure = f"{what}: the session ended first"
                return None
            proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self._running = proc
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.failure = f"{what} took more than {timeout:.0f} s:\n{out[-3000:]}\n{err[-3000:]}"
            return None
        finally:
            self._running = None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def start(self) -> None:
        if shutil.which("docker-compose") is None:
            self.skip = "docker-compose is not installed (make system-deps installs it)"
            self._publish()
            return
        self._thread = threading.Thread(target=self._run, name="compose-prebuild", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        """Ends what is still running and stops a dockerd this session started."""
        with self._lock:
            self._cancelled = True
            if self._running is not None:
                self._running.terminate()
        self.wait()
        if self.dockerd_pid:
            stop_engine(self.dockerd_pid)
            self.dockerd_pid = None


@dataclass
class SharedPrebuild:
    """A pytest-xdist worker's view of the preparation the controller runs: :meth:`wait` reads
    its state file; :meth:`stop` stops the ``dockerd`` it started, once this worker has waited
    for it (the worker that ran the compose tests, not one that finished before them)."""

    state_file: Path
    skip: str | None = None
    failure: str | None = None
    dockerd_pid: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _waited: bool = False

    def wait(self) -> None:
        deadline = time.monotonic() + ENGINE_TIMEOUT_S + BASE_TIMEOUT_S + BUILD_TIMEOUT_S
        while not self.state_file.is_file():
            if time.monotonic() > deadline:
                self.failure = f"the controller's preparation wrote no {self.state_file} in time"
                return
            time.sleep(1)
        state = json.loads(self.state_file.read_text())
        self.skip, self.failure, self.dockerd_pid = state["skip"], state["failure"], state["dockerd_pid"]
        self.timings = state["timings"]
        self._waited = True

    def stop(self) -> None:
        if self._waited and self.dockerd_pid:
            stop_engine(self.dockerd_pid)
            self.dockerd_pid = None


_PREBUILD: Prebuild | SharedPrebuild | None = None


def prebuild() -> Prebuild | SharedPrebuild:
    """The session's preparation, started on first use (the compose module run alone); in a
    pytest-xdist worker, the controller's."""
    global _PREBUILD
    if _PREBUILD is None:
        shared = os.environ.get(STATE_ENV)
        if shared and os.environ.get("PYTEST_XDIST_WORKER"):
            _PREBUILD = SharedPrebuild(Path(shared))
        else:
            _PREBUILD = Prebuild(state_file=Path(shared) if shared else None)
            _PREBUILD.start()
    return _PREBUILD


def finish() -> None:
    """End of session: stop whatever the preparation started."""
    if _PREBUILD is not None:
        _PREBUILD.stop()
