"""The compose test's slow part (a Docker engine, the base image, ``docker-compose build``) run in
the background from the start of the session, so that it overlaps the rest of the suite instead
of adding its minutes to it; ``tests/test_compose_run.py`` waits for it and runs last.

The images' names are fixed in ``docker-compose.yml``, so a build under any project name serves
the test's project. Whatever starts here is stopped at the end of the session even when the
compose tests never ran (deselected, or the session stopped early): a build still running is
terminated, and a ``dockerd`` the engine script had to start is stopped.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ["-f", "docker-compose.yml", "-f", "docker/quick.yml"]
ENGINE_TIMEOUT_S = 120
BASE_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 2400
MODULE = "test_compose_run.py"


@dataclass
class Prebuild:
    """What the background preparation did: ``skip`` says why the stack cannot run here,
    ``failure`` which step failed and its output; ``dockerd_pid`` is a daemon it started."""

    skip: str | None = None
    failure: str | None = None
    dockerd_pid: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _thread: threading.Thread | None = None
    _running: subprocess.Popen | None = None
    _cancelled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self) -> None:
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
            subprocess.run(["bash", "scripts/docker-engine.sh", "--stop", self.dockerd_pid], cwd=REPO,
                           capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
            self.dockerd_pid = None


_PREBUILD: Prebuild | None = None


def prebuild() -> Prebuild:
    """The session's preparation, started on first use (the compose module run alone)."""
    global _PREBUILD
    if _PREBUILD is None:
        _PREBUILD = Prebuild()
        _PREBUILD.start()
    return _PREBUILD


def finish() -> None:
    """End of session: stop whatever the preparation started."""
    if _PREBUILD is not None:
        _PREBUILD.stop()
