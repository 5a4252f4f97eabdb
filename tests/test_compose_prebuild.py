"""The compose preparation's outcome handed from the pytest-xdist controller to its workers
(tests/compose_prebuild.py), without Docker: the steps are replaced."""

import subprocess

from tests import compose_prebuild
from tests.compose_prebuild import Prebuild, SharedPrebuild


def test_a_skip_reaches_the_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(compose_prebuild.shutil, "which", lambda _: None)
    controller = Prebuild(state_file=tmp_path / "state.json")
    controller.start()
    worker = SharedPrebuild(tmp_path / "state.json")
    worker.wait()
    assert worker.skip == controller.skip == "docker-compose is not installed (make system-deps installs it)"
    assert (worker.failure, worker.dockerd_pid, worker.timings) == (None, None, {})


def test_the_outcome_of_the_steps_reaches_the_worker(tmp_path, monkeypatch):
    """Written by the preparation's thread while it holds its lock and thread objects (which a
    copy of the whole object could not serialise)."""
    outcomes = {"scripts/docker-engine.sh": (0, "4242\n"), "scripts/docker-base.sh": (0, ""),
                "docker-compose build": (3, "no space left")}

    def step(self, argv, what, timeout):
        code, out = outcomes[what]
        return subprocess.CompletedProcess(argv, code, out, "")

    monkeypatch.setattr(Prebuild, "_call", step)
    controller = Prebuild(state_file=tmp_path / "state.json")
    controller._thread = compose_prebuild.threading.Thread(target=controller._run)
    controller._thread.start()
    controller.wait()
    assert (tmp_path / "state.json").is_file()
    worker = SharedPrebuild(tmp_path / "state.json")
    worker.wait()
    assert worker.dockerd_pid == "4242" and worker.skip is None
    assert worker.failure.startswith("docker-compose build failed (3):\nno space left")
    assert set(worker.timings) == {"base_s"}


def test_only_the_worker_that_waited_stops_the_daemon(tmp_path, monkeypatch):
    (tmp_path / "state.json").write_text('{"skip": null, "failure": null, "dockerd_pid": "4242", "timings": {}}')
    stopped = []
    monkeypatch.setattr(compose_prebuild.subprocess, "run", lambda argv, **_: stopped.append(argv))
    SharedPrebuild(tmp_path / "state.json").stop()  # a worker that never ran the compose tests
    assert stopped == []
    worker = SharedPrebuild(tmp_path / "state.json")
    worker.wait()
    worker.stop()
    worker.stop()
    assert stopped == [["bash", "scripts/docker-engine.sh", "--stop", "4242"]]
