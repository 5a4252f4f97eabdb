"""Faults real machines have, on real processes (127.0.0.1 only): ``kill -9`` of the search
service under query load, damaged artefacts met by the commands that read them, and ``kill -9``
of the commands that write artefacts at the worst moment. docs/reliability.md lists every fault,
what the system does, and the test (here or elsewhere) that proves it.

A kill at a chosen point runs the real ``aoq`` entry point (or a checkpoint save) in a child
process where one patched function sends SIGKILL to its own process, so the moment is exact and
the test cannot be flaky about timing.
"""

from __future__ import annotations

import inspect
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from aoq.checkpoint import load_checkpoint
from aoq.io import read_manifest
from aoq.net import ServerNotReady, free_port, wait_http
from aoq_serve.index.faiss_index import load_model_index, read_generation
from aoq_serve.store.querylog import QueryLogger
from tests.backend_helpers import ServiceFixture, build_service_fixture, retrain, run_server

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
QUERY = "a red circle on a grey background"
CATALOGUE_TABLES = ("datasets", "splits", "images", "captions", "models", "indexes", "query_ranks")
#: the query log is written by a background thread every this many seconds
FLUSH_EVERY_S = inspect.signature(QueryLogger).parameters["flush_every_s"].default


def _env(fx: ServiceFixture) -> dict[str, str]:
    return {**os.environ, "AOQ_CATALOGUE_URL": fx.catalogue_url, "AOQ_MODELS_DIR": str(fx.models_dir),
            "AOQ_INDEX_DIR": str(fx.index_dir), "AOQ_DATA_DIR": str(fx.data_dir), "AOQ_RELOAD_POLL_S": "0",
            "AOQ_WORKERS": "1"}  # kill -9 of the one serving process (workers: tests/test_serving_workers.py)


def _aoq(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aoq_cli.main", *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_KILLED_AT = """
import os, signal, sys
sys.path.insert(0, {repo!r})
import importlib
module = importlib.import_module({module!r})
original = getattr(module, {name!r})
calls = 0
def die_on_call(*args, **kwargs):
    global calls
    calls += 1
    if calls == {call}:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)
setattr(module, {name!r}, die_on_call)
{then}
"""


def _killed_at(target: str, call: int, then: str) -> None:
    """Run the Python code ``then`` in a child process and SIGKILL it when ``target``
    (``module:function``) is called the ``call``-th time, before that call does anything."""
    module, name = target.split(":")
    code = _KILLED_AT.format(repo=str(REPO), module=module, name=name, call=call, then=then)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {target} call {call}:\n{proc.stderr[-3000:]}"


def _aoq_killed_at(argv: list[str], target: str, call: int) -> None:
    """``aoq argv``, killed by :func:`_killed_at`."""
    _killed_at(target, call, f"from aoq_cli.main import main\nsys.exit(main({argv!r}))")


#: called by ``aoq.io.atomic_dir`` once everything is written, just before the rename that
#: publishes the directory: a kill there leaves a complete-looking temporary directory.
BEFORE_PUBLISHING = "aoq.io:_sync_tree"


def _wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 120.0) -> dict:
    try:
        return wait_http(f"http://127.0.0.1:{port}/health", proc=server, what="aoq serve", timeout=timeout_s)
    except ServerNotReady as exc:
        server.kill()
        _, err = server.communicate(timeout=30)
        raise AssertionError(f"{exc}:\n{err[-3000:]}") from None


def _stop(server: subprocess.Popen) -> str:
    """Ctrl+C the server; returns its stderr."""
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
    try:
        _, err = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        _, err = server.communicate(timeout=30)
    return err




def _rows(db: Path, table: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()  # noqa: S608 (fixed names)


def _hits(response: httpx.Response) -> tuple:
    """(image id, score) of a text search's results, independent of the server's URL."""
    assert response.status_code == 200, response.text
    return tuple((h["image_id"], round(h["score"], 5)) for h in response.json()["results"])


def _top_k(client: httpx.Client) -> dict[str, tuple]:
    """Each model's answer to the same text query, and the aoq model's to an image query."""
    answers = {model: _hits(client.post("/search/text", json={"query": QUERY, "model": model, "k": 5}))
               for model in ("baseline", "aoq", "pixels")}
    image_id = client.get("/examples", params={"n": 1}).json()["images"][0]["id"]
    r = client.post("/search/image", data={"model": "aoq", "k": "5", "image_id": str(image_id)})
    assert r.status_code == 200, r.text
    answers["aoq image"] = tuple((h["caption_id"], round(h["score"], 5)) for h in r.json()["results"])
    return answers


class _Load:
    """Client threads sending text queries; keeps the time of every acknowledged (200) answer."""

    def __init__(self, base_url: str, threads: int = 3) -> None:
        self.base_url, self.acks, self.errors = base_url, [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        models = ("baseline", "aoq", "pixels")
        with httpx.Client(base_url=self.base_url, timeout=10) as client:
            n = i
            while not self.stop.is_set():
                try:
                    r = client.post("/search/text", json={"query": QUERY, "model": models[n % 3], "k": 5})
                except httpx.HTTPError:
                    return  # the server is gone
                n += 1
                if r.status_code == 200:
                    self.acks.append(time.time())
                else:
                    self.errors.append(f"{r.status_code} {r.text}")

    def wait_for_acks(self, n: int, timeout_s: float = 60.0) -> None:
        """Block until ``n`` answers were acknowledged (or the clients failed, or time ran out)."""
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < n and not self.errors and time.monotonic() < deadline:
            time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def _log_times(rows: list[tuple]) -> list[float]:
    """Unix times of query-log rows (column 1; SQLite keeps the UTC wall time as text)."""
    out = []
    for row in rows:
        stamp = datetime.fromisoformat(str(row[1]))
        out.append((stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp())
    return out


def test_backend_killed_under_load_restarts_with_catalogue_indexes_and_committed_log_intact(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    db = fx.index_dir / "catalogue.sqlite"
    catalogue_before = {t: _rows(db, t) for t in CATALOGUE_TABLES}
    port = free_port()
    server = _aoq(["serve", "--port", str(port)], env=_env(fx))
    try:
        health_before = _wait_healthy(port, server)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            answers_before = _top_k(client)
        # Phase 1: load, then quiet: every acknowledged query reaches the log within a flush or two.
        load = _Load(f"http://127.0.0.1:{port}")
        load.wait_for_acks(20)
        load.finish()
        expected = len(load.acks) + 4  # + the four searches of _top_k (/examples is not logged)
        deadline = time.monotonic() + 10 * FLUSH_EVERY_S
        while len(_rows(db, "query_log")) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
        committed = _rows(db, "query_log")
        assert len(committed) == expected and not load.errors, load.errors[:3]
        # Phase 2: kill -9 in the middle of the load.
        load = _Load(f"http://127.0.0.1:{port}")
        load.wait_for_acks(40)  # past at least one flush of the query log under way
        killed_at = time.time()
        server.kill()
        server.wait(timeout=30)
        load.finish()
    finally:
        _stop(server)
    assert server.returncode == -signal.SIGKILL
    assert len(load.acks) > 10 and not load.errors, load.errors[:3]

    # Before anything restarts: the database file is sound and nothing committed was lost.
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    logged = _rows(db, "query_log")
    assert logged[:len(committed)] == committed
    new_rows, new_acks = logged[len(committed):], load.acks
    # No invented rows: at most the acknowledged queries plus one in flight per client thread.
    assert len(new_rows) <= len(new_acks) + len(load.threads)
    # Only the last flush interval can be lost: queries acknowledged well before the kill are in.
    old_enough = killed_at - 2.5 * FLUSH_EVERY_S
    print(f"kill -9 under load: {len(new_acks)} answers acknowledged in the last 3 s, "
          f"{len(new_rows)} logged, {len(new_acks) - len(new_rows)} not yet flushed")
    assert sum(t <= old_enough for t in _log_times(new_rows)) >= sum(t <= old_enough for t in new_acks)

    # Restart on the same files and the same port.
    server = _aoq(["serve", "--port", str(port)], env=_env(fx))
    try:
        health = _wait_healthy(port, server)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            answers_after = _top_k(client)
    finally:
        err = _stop(server)
    for state in (health, health_before):  # the restarted process has another pid
        state["workers"] = [{**w, "pid": None} for w in state["workers"]]
    assert health == health_before and health["status"] == "ok", health
    assert answers_after == answers_before
    assert {t: _rows(db, t) for t in CATALOGUE_TABLES} == catalogue_before
    assert _rows(db, "query_log")[:len(logged)] == logged
    assert "Traceback" not in err, err[-3000:]


# ----------------------------------------------------------------------------- damaged artefacts


def _truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_serve_disables_what_is_damaged_naming_the_file_and_serves_the_rest(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    weights = _truncate(fx.models_dir / "baseline" / "model.safetensors")
    index = _truncate(fx.index_dir / "pixels" / "images.faiss")
    mined_dir = Path(load_checkpoint(fx.models_dir / "aoq").extra["mined_dir"])
    mined = _truncate(mined_dir / "cap_top_imgs.npy")
    port = free_port()
    server = _aoq(["serve", "--port", str(port)], env=_env(fx))
    try:
        health = _wait_healthy(port, server)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            refused = client.post("/search/text", json={"query": QUERY, "model": "baseline"})
            served = client.post("/search/text", json={"query": QUERY, "model": "aoq"})
            anchor = client.get("/examples", params={"split": "train", "n": 1}).json()["captions"][0]["id"]
            negatives = client.get("/negatives", params={"kind": "caption", "id": anchor, "model": "aoq"})
    finally:
        err = _stop(server)
    assert health["status"] == "degraded" and health["models"] == ["aoq"]  # degraded: two models are disabled
    assert health["disabled"] == {  # public: relative to the configured folders, which the log names
        "baseline": "checkpoint cannot be loaded: $AOQ_MODELS_DIR/baseline/model.safetensors: content hash mismatch "
                    "(corrupted or truncated file)",
        "pixels": "index cannot be loaded: $AOQ_INDEX_DIR/pixels/images.faiss: content hash mismatch "
                  "(corrupted or truncated file)",
    }
    assert refused.status_code == 409 and str(weights) in refused.json()["detail"]
    assert served.status_code == 200 and len(served.json()["results"]) == 10
    assert negatives.status_code == 404
    assert negatives.json()["detail"] == (f"the mined negatives of model 'aoq' cannot be read: {mined}: "
                                          "content hash mismatch (corrupted or truncated file)")
    assert f"model 'baseline' disabled: checkpoint cannot be loaded: {weights}" in err
    assert f"model 'pixels' disabled: index cannot be loaded: {index}" in err
    assert "Traceback" not in err, err[-3000:]


def _one_line_error(proc: subprocess.Popen, command: str) -> str:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, (out, err)
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"aoq {command}: error: "), err[-3000:]
    return last


def test_commands_name_the_damaged_file_in_one_line(tmp_path: Path):
    """``aoq mine``/``aoq index`` on a truncated checkpoint, ``aoq train2`` on truncated mined
    negatives (``aoq evaluate``: tests/test_evaluate_cli.py)."""
    fx = build_service_fixture(tmp_path)
    generation = read_generation(fx.index_dir)
    aoq = fx.models_dir / "aoq"
    mined_dir = Path(load_checkpoint(aoq).extra["mined_dir"])
    mined = _truncate(mined_dir / "img_top_caps.npy")
    weights = _truncate(fx.models_dir / "baseline" / "model.safetensors")
    procs = {
        "mine": _aoq(["mine", "--checkpoint", str(fx.models_dir / "baseline"), "--out", str(tmp_path / "mined2"),
                      "--no-progress"]),
        "train2": _aoq(["train2", "--config", str(aoq / "config.json"), "--mined", str(mined_dir),
                        "--out", str(tmp_path / "r2"), "--device", "cpu", "--no-progress"]),
        "index": _aoq(["index", "--models-dir", str(fx.models_dir), "--data-dir", str(fx.data_dir),
                       "--out", str(fx.index_dir), "--catalogue", fx.catalogue_url, "--device", "cpu"]),
    }
    damaged = "content hash mismatch (corrupted or truncated file)"
    assert _one_line_error(procs["mine"], "mine") == f"aoq mine: error: {weights}: {damaged}"
    assert _one_line_error(procs["train2"], "train2") == f"aoq train2: error: {mined}: {damaged}"
    assert _one_line_error(procs["index"], "index") == f"aoq index: error: {weights}: {damaged}"
    assert not (tmp_path / "mined2").exists() and not (tmp_path / "r2" / "round2").exists()
    assert read_generation(fx.index_dir) == generation  # the served generation is untouched


# ----------------------------------------------------------------------------- kill -9 of writers


def _temporaries(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f".{name}.*"))


@pytest.mark.parametrize("previous", [False, True], ids=["fresh", "replacing"])
def test_synth_killed_before_publishing_leaves_no_dataset_or_the_previous_one(tmp_path: Path, previous: bool):
    from aoq_cli.main import main
    from aoq_train.datasets.synth.writer import write_dataset

    out = tmp_path / "data" / "synth"
    if previous:
        write_dataset(out, {"train": 4, "dev": 2, "test": 2}, seed=0, workers=1, progress=False)
    argv = ["synth", "--out", str(out), "--train", "6", "--dev", "2", "--test", "2", "--seed", "1",
            "--workers", "1", "--no-progress"]
    _aoq_killed_at(argv, BEFORE_PUBLISHING, 1)
    # the new dataset was complete, manifest included, but only under its temporary name
    (leftover,) = _temporaries(out.parent, "synth")
    assert (leftover / "manifest.json").is_file()
    if previous:
        assert read_manifest(out)["config"]["seed"] == 0  # verified hashes: the old one, whole
    else:
        assert not out.exists()
    assert main(argv) == 0
    manifest = read_manifest(out)
    assert manifest["config"]["seed"] == 1 and manifest["config"]["sizes"] == {"train": 6, "dev": 2, "test": 2}


def test_index_killed_midway_serves_only_consistent_models_and_the_rerun_completes(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    old_hash = load_checkpoint(fx.models_dir / "baseline").content_hash
    new_hash = retrain(fx.models_dir, "baseline", seed=77)
    with run_server(fx.settings()) as url:
        aoq_before = _hits(httpx.post(f"{url}/search/text", json={"query": QUERY, "model": "aoq"}))
    argv = ["index", "--models-dir", str(fx.models_dir), "--data-dir", str(fx.data_dir), "--out", str(fx.index_dir),
            "--catalogue", fx.catalogue_url, "--device", "cpu"]
    # Models are indexed in name order (aoq, baseline, pixels): die on the second one, first while
    # its index directory is complete but unpublished, then once it is published but not catalogued.
    for kill_at, published in ((BEFORE_PUBLISHING, False), ("aoq_serve.index.build:record_model", True)):
        _aoq_killed_at(argv, kill_at, 2)
        assert read_generation(fx.index_dir)["generation"] == 1, kill_at
        built_from = {m: load_model_index(fx.index_dir / m).config["checkpoint_hash"]  # every one verifies
                      for m in ("aoq", "baseline", "pixels")}
        assert built_from["baseline"] == (new_hash if published else old_hash), kill_at
        with run_server(fx.settings()) as url:
            health = httpx.get(f"{url}/health").json()
            aoq_after = _hits(httpx.post(f"{url}/search/text", json={"query": QUERY, "model": "aoq"}))
        assert health["models"] == ["aoq", "pixels"], kill_at
        assert health["disabled"]["baseline"].endswith("re-run aoq index"), kill_at
        assert aoq_after == aoq_before, kill_at

    fx.index()
    with run_server(fx.settings()) as url:
        health = httpx.get(f"{url}/health").json()
        models = {m["name"]: m for m in httpx.get(f"{url}/models").json()}
    assert health["generation"] == 2 and health["models"] == ["aoq", "baseline", "pixels"]
    assert health["disabled"] == {} and models["baseline"]["checkpoint_hash"] == new_hash


_SAVE_BASELINE = """
from pathlib import Path
from tests.backend_helpers import write_checkpoint
from aoq.checkpoint import load_checkpoint
old = load_checkpoint(Path({path!r}))
write_checkpoint(Path({path!r}), old.config, old.vocab, old.extra["img_dim"], 55, {{"role": "baseline"}})
"""


def test_checkpoint_killed_before_publishing_is_never_indexed_or_served(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    path = fx.models_dir / "baseline"
    before = load_checkpoint(path).content_hash
    _killed_at(BEFORE_PUBLISHING, 1, _SAVE_BASELINE.format(path=str(path)))
    (leftover,) = _temporaries(fx.models_dir, "baseline")
    assert (leftover / "manifest.json").is_file()  # complete, but not published
    assert load_checkpoint(path).content_hash == before
    summaries = fx.index()
    assert [s["model"] for s in summaries] == ["aoq", "baseline", "pixels"]
    with run_server(fx.settings()) as url:
        health = httpx.get(f"{url}/health").json()
    assert health["models"] == ["aoq", "baseline", "pixels"] and health["disabled"] == {}
