"""The service over time: start-up checks that disable mismatched models, rebuilding the indexes
while the server answers (atomic swap), approximate indexes end to end, and the two commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from aoq.checkpoint import load_checkpoint
from aoq.net import wait_http
from aoq_serve.store.db import Dataset, IndexRecord, Model, make_engine
from aoq_serve.index.faiss_index import load_model_index
from tests.backend_helpers import build_service_fixture, free_socket, retrain, run_server, write_checkpoint

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_mismatched_models_are_disabled_with_the_reason(tmp_path: Path, caplog):
    fx = build_service_fixture(tmp_path)
    engine = make_engine(fx.catalogue_url)
    with engine.begin() as conn:  # the catalogue says the baseline's image index has one vector more
        baseline = conn.execute(Model.__table__.select().where(Model.name == "baseline")).one()
        conn.execute(update(IndexRecord).where(IndexRecord.model_id == baseline.id, IndexRecord.modality == "images")
                     .values(vector_count=41))
    engine.dispose()
    retrain(fx.models_dir, "aoq", seed=99)  # new weights, never indexed
    shutil.rmtree(fx.index_dir / "pixels")  # index lost
    write_checkpoint(fx.models_dir / "newcomer", load_checkpoint(fx.models_dir / "aoq").config,
                     load_checkpoint(fx.models_dir / "aoq").vocab, 96, 5, {"role": "other"})

    with caplog.at_level("ERROR"), run_server(fx.settings()) as url, httpx.Client(base_url=url) as client:
        health = client.get("/health").json()
        models = {m["name"]: m for m in client.get("/models").json()}
        refused = client.post("/search/text", json={"query": "a red circle", "model": "aoq"})
        failures = client.get("/failures")
    assert health["status"] == "degraded" and health["models"] == []
    disabled = health["disabled"]
    assert "images index holds 40 vectors, the catalogue records 41" in disabled["baseline"]
    assert "checkpoint" in disabled["aoq"] and "re-run aoq index" in disabled["aoq"]
    assert "index cannot be loaded" in disabled["pixels"]
    assert "not in the catalogue" in disabled["newcomer"]
    assert all(not m["enabled"] and m["disabled_reason"] == disabled[n] for n, m in models.items())
    assert refused.status_code == 409 and refused.json()["detail"].startswith("model 'aoq' is disabled: ")
    assert failures.status_code == 404  # no served baseline/aoq pair
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for name in ("baseline", "aoq", "pixels"):
        assert f"model {name!r} disabled" in logged


def test_catalogue_hash_differing_from_the_index_disables_the_model(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    engine = make_engine(fx.catalogue_url)
    with engine.begin() as conn:
        conn.execute(update(Model).where(Model.name == "baseline").values(checkpoint_hash="0" * 64))
    engine.dispose()
    with run_server(fx.settings()) as url:
        health = httpx.get(f"{url}/health").json()
    assert health["models"] == ["aoq", "pixels"]
    assert "was built from checkpoint" in health["disabled"]["baseline"]


def _wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_rebuilding_indexes_swaps_atomically_while_serving(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    query = {"query": "a red circle on a grey background", "model": "aoq", "k": 5}
    answers: list[tuple[int, tuple]] = []
    errors: list[str] = []
    stop = threading.Event()

    def hammer(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not stop.is_set():
                r = client.post("/search/text", json=query)
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text}")
                    continue
                answers.append(tuple((h["image_id"], round(h["score"], 5)) for h in r.json()["results"]))

    with run_server(fx.settings(reload_poll_s=0.2)) as url:
        before = httpx.post(f"{url}/search/text", json=query).json()
        old = tuple((h["image_id"], round(h["score"], 5)) for h in before["results"])
        workers = [threading.Thread(target=hammer, args=(url,)) for _ in range(3)]
        for w in workers:
            w.start()
        try:
            _wait_until(lambda: len(answers) >= 5 or bool(errors))
            new_hash = retrain(fx.models_dir, "aoq", seed=1234)
            fx.index()  # rewrites the index directories and the catalogue, then index.json
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/health").json()["generation"] != 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            swapped_at = len(answers)
            _wait_until(lambda: len(answers) >= swapped_at + 10 or bool(errors))
        finally:
            stop.set()
            for w in workers:
                w.join()
        health = httpx.get(f"{url}/health").json()
        after = httpx.post(f"{url}/search/text", json=query).json()
        models = {m["name"]: m for m in httpx.get(f"{url}/models").json()}
    new = tuple((h["image_id"], round(h["score"], 5)) for h in after["results"])
    assert not errors, errors[:3]
    assert health["generation"] == 2 and health["disabled"] == {}
    assert models["aoq"]["checkpoint_hash"] == new_hash
    assert new != old
    # every answer came whole from the old model or whole from the new one, old ones first
    assert set(answers) <= {old, new}, set(answers) - {old, new}
    assert old in answers and new in answers
    switch = answers.index(new)
    assert all(a == new for a in answers[switch:][len(answers[switch:]) // 2:])


def test_hnsw_indexes_admin_reload_and_detector_features_end_to_end(tmp_path: Path):
    fx = build_service_fixture(tmp_path, index=False)
    out = subprocess.run(
        [sys.executable, "-m", "aoq_cli.main", "index", "--models-dir", str(fx.models_dir), "--data-dir",
         str(fx.data_dir), "--out", str(fx.index_dir), "--catalogue", fx.catalogue_url, "--type", "hnsw",
         "--device", "cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "aoq (aoq): rsum " in out.stdout and "on the test split (full protocol)" in out.stdout and "recall@10 vs exact" in out.stdout
    manifest = load_model_index(fx.index_dir / "aoq").manifest
    assert manifest["config"]["index_type"] == "hnsw"
    for params in manifest["params"].values():
        assert params["recall_at_10"] >= 0.95 and params["efSearch"] >= 16
    assert json.loads((fx.index_dir / "index.json").read_text())["generation"] == 1
    with run_server(fx.settings()) as url, httpx.Client(base_url=url) as client:
        example = client.get("/examples", params={"n": 1}).json()["captions"][0]
        found = client.post("/search/text", json={"query": example["text"], "model": "aoq", "k": 100}).json()
        truth = [h["rank"] for h in found["results"] if h["is_ground_truth"]]
        assert found["scope_rank"] == truth[0]  # computed exactly, outside the HNSW list
        reloaded = client.post("/admin/reload", json={}).json()
        workers = reloaded.pop("workers")
        assert reloaded == {"generation": 1, "models": ["aoq", "baseline", "pixels"], "disabled": {}}
        assert [(w["worker"], w["generation"], w["models"]) for w in workers] == [(0, 1, ["aoq", "baseline", "pixels"])]
        # The same features, now said to come from an external detector (as COCO precomp):
        engine = make_engine(fx.catalogue_url)
        with engine.begin() as conn:
            conn.execute(update(Dataset).where(Dataset.name == "synth").values(synthetic=False))
        engine.dispose()
        client.post("/admin/reload", json={})
        upload = {"file": ("q.png", (fx.data_dir / "synth/images/test/synth_test_000000.png").read_bytes(), "image/png")}
        refused = client.post("/search/image", data={"model": "aoq", "k": 3}, files=upload)
        assert refused.status_code == 422 and "external detector" in refused.json()["detail"]
        assert client.post("/search/image", data={"model": "pixels", "k": 3}, files=upload).status_code == 200


def _aoq(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aoq_cli.main", *args], cwd=REPO, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_serve_command_starts_answers_and_refuses_a_busy_port(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    env = {"AOQ_CATALOGUE_URL": fx.catalogue_url, "AOQ_MODELS_DIR": str(fx.models_dir),
           "AOQ_INDEX_DIR": str(fx.index_dir), "AOQ_DATA_DIR": str(fx.data_dir)}
    busy = free_socket()
    try:
        start = time.monotonic()
        refused = _aoq("serve", "--port", str(busy.getsockname()[1]), env=env)
        _, err = refused.communicate(timeout=60)
        assert refused.returncode != 0
        assert "already in use" in err and time.monotonic() - start < 60
    finally:
        busy.close()

    probe = free_socket()
    port = probe.getsockname()[1]
    probe.close()
    server = _aoq("serve", "--port", str(port), "--reload-poll", "0", env=env)
    try:
        health = wait_http(f"http://127.0.0.1:{port}/health", proc=server, what="aoq serve", timeout=90)
        assert health["models"] == ["aoq", "baseline", "pixels"]
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    # Ctrl+C: uvicorn shuts the app down (lifespan end: query log flushed), then aoq exits 130 when
    # uvicorn re-raises the signal, 0 when it arrived while uvicorn was already stopping
    assert server.returncode in (0, 130) and "Application shutdown complete" in err
