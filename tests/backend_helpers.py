"""A tiny, real search service for tests: a synthetic dataset, three untrained checkpoints,
mined negatives, indexes and a catalogue, and the real uvicorn server on a free loopback port.

Usable by any test module (backend, UI, end-to-end)::

    fx = build_service_fixture(tmp_path)
    with run_server(fx.settings()) as base_url:
        httpx.get(f"{base_url}/health")

Models: ``baseline`` (role baseline) and ``aoq`` (role aoq, with a mined-negatives artefact
filtered for false negatives, and a metrics log) read region features; ``pixels`` (role other) is a small CNN on raw images of a
second dataset (the same pictures read through the Karpathy JSON).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from aoq.checkpoint import load_checkpoint, save_checkpoint
from aoq.config import DataConfig, ExperimentConfig, ModelConfig
from aoq.data.load import load_split
from aoq.data.vocab import Vocabulary
from aoq.device import seed_everything
from aoq.embed import encode_split
from aoq.models.joint import build_model
from aoq_serve.index.build import IndexJob, index_models
from aoq_serve.config import Settings
from aoq_train.mining import mine_offline_negatives, save_mined
from aoq_train.mining.false_negatives import filtered_lists
from aoq_train.mining.filters import FilterInputs, text_ids

REPO = Path(__file__).resolve().parents[1]
SIZES = {"train": 24, "dev": 4, "test": 12}
#: the false-negative filters of the ``aoq`` model's mined lists
MINED_FILTERS = ["identity"]
#: training images whose first caption repeats image 0's first caption (region-feature dataset)
DUPLICATED_BY = (1, 2)
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@dataclass
class ServiceFixture:
    """Where the pieces of a built service live."""

    catalogue_url: str
    models_dir: Path
    index_dir: Path
    data_dir: Path
    #: model name -> role
    roles: dict[str, str] = field(default_factory=dict)

    def settings(self, **overrides: object) -> Settings:
        """Service settings for this fixture (no background reload polling unless asked)."""
        values = {
            "catalogue_url": self.catalogue_url, "models_dir": self.models_dir, "index_dir": self.index_dir,
            "data_dir": self.data_dir, "reload_poll_s": 0.0, "port": 0,
        }
        values.update(overrides)
        return Settings(**values)

    def index(self, **job: object) -> list[dict]:
        """(Re)run ``aoq index`` over this fixture's models."""
        values = {"models_dir": self.models_dir, "data_dir": self.data_dir, "out": self.index_dir,
                  "catalogue_url": self.catalogue_url, "split": "test", "device": "cpu"}
        values.update(job)
        return index_models(IndexJob(**values))


def _config(name: str, data: DataConfig, encoder: str) -> ExperimentConfig:
    model = ModelConfig(image_encoder=encoder, embed_dim=16, word_dim=8, cnn_width=4)
    return ExperimentConfig(name=name, data=data, model=model)


def write_checkpoint(path: Path, cfg: ExperimentConfig, vocab: Vocabulary, img_dim: int | None, seed: int,
                     extra: dict) -> str:
    """An untrained checkpoint (weights from ``seed``)."""
    seed_everything(seed)
    model = build_model(cfg.model, len(vocab), img_dim)
    metrics = {"rsum": 0.0, "i2t": {"r1": 0.0}, "t2i": {"r1": 0.0}}
    return save_checkpoint(path, model, cfg, vocab, metrics, extra)


def _metrics_log(path: Path) -> None:
    lines = [{"epoch": e, "dev_i2t_r1": 10.0 * e, "dev_t2i_r1": 8.0 * e, "dev_rsum": 50.0 * e} for e in (1, 2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def _repeat_a_caption(synth: Path) -> None:
    """Images ``DUPLICATED_BY`` of the training split take image 0's first caption, for the
    identity filter to find: in the precomp captions and in the Karpathy JSON that serves the
    same pictures (the index pairs the two by their captions)."""
    captions_file, json_file = synth / "precomp" / "train_caps.txt", synth / "dataset_synth.json"
    captions = captions_file.read_text().splitlines()
    doc = json.loads(json_file.read_text())
    train = [entry for entry in doc["images"] if entry["split"] == "train"]
    cpi = len(captions) // len(train)
    for image in DUPLICATED_BY:
        captions[image * cpi] = captions[0]
        train[image]["sentences"][0] = dict(train[0]["sentences"][0])
    captions_file.write_text("\n".join(captions) + "\n")
    json_file.write_text(json.dumps(doc))


def build_service_fixture(tmp_path: Path, catalogue_url: str | None = None, index: bool = True) -> ServiceFixture:
    """Generate the data, checkpoints and mined negatives under ``tmp_path``; index them unless told not to."""
    from aoq_train.datasets.synth.writer import write_dataset

    data_dir = tmp_path / "data"
    synth = data_dir / "synth"
    write_dataset(synth, SIZES, seed=0, workers=1, progress=False)
    _repeat_a_caption(synth)
    features = DataConfig(format="precomp", path=str(synth / "precomp"), name="synth", vocab_threshold=1)
    pixels = DataConfig(format="karpathy", path=str(synth / "dataset_synth.json"), name="synth_pixels",
                        vocab_threshold=1, image_size=32)
    train = load_split(features, "train")
    vocab = Vocabulary.build(train.captions, threshold=1)
    models_dir, run_dir = tmp_path / "run" / "models", tmp_path / "run"

    baseline_cfg = _config("baseline", features, "vse")
    write_checkpoint(models_dir / "baseline", baseline_cfg, vocab, train.feature_dim, 1, {"role": "baseline"})
    # Mined with the baseline, as the pipeline does, and recorded in the AOQ checkpoint.
    from aoq.checkpoint import load_checkpoint

    miner = load_checkpoint(models_dir / "baseline")
    img_emb, cap_emb = encode_split(miner.model, miner.vocab, train)
    cpi = train.captions_per_image

    def mine(top_captions: int, top_images: int):
        return mine_offline_negatives(img_emb, cap_emb, cpi, top_captions, top_images, progress=False)

    # filtered as ``aoq mine --set mining.filters=[identity]`` does, so /negatives has removals to show
    inputs = FilterInputs(cpi, text_ids(train.captions), img_emb=img_emb, cap_emb=cap_emb, rho=0.95)
    *tops, filtered = filtered_lists(mine, 20, 8, train.n_images, cpi, inputs, MINED_FILTERS)
    save_mined(run_dir / "mined", *tops, {"checkpoint_hash": miner.content_hash, "filters": MINED_FILTERS},
               filtered=filtered)
    _metrics_log(run_dir / "metrics.jsonl")
    aoq_extra = {"role": "aoq", "mined_dir": str(run_dir / "mined"), "metrics_log": str(run_dir / "metrics.jsonl")}
    write_checkpoint(models_dir / "aoq", _config("aoq", features, "vse"), vocab, train.feature_dim, 2, aoq_extra)
    write_checkpoint(models_dir / "pixels", _config("pixels", pixels, "cnn"), vocab, None, 3, {"role": "other"})

    index_dir = tmp_path / "index"
    fixture = ServiceFixture(
        catalogue_url=catalogue_url or f"sqlite:///{index_dir / 'catalogue.sqlite'}",
        models_dir=models_dir, index_dir=index_dir, data_dir=data_dir,
        roles={"baseline": "baseline", "aoq": "aoq", "pixels": "other"},
    )
    if index:
        fixture.index()
    return fixture


def free_socket(host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on a free port chosen by the kernel (no race between pick and bind),
    made as ``aoq serve`` makes its own."""
    from aoq_serve.server import listen

    return listen(host, 0)


@contextlib.contextmanager
def run_server(settings: Settings, timeout_s: float = 60.0) -> Iterator[str]:
    """Start the real uvicorn server (as ``aoq serve`` configures it) in a thread on 127.0.0.1
    (random free port); yield its base URL once it accepts requests; stop it cleanly on exit."""
    from aoq_serve.app import create_app
    from aoq_serve.server import make_server

    sock = free_socket()
    port = sock.getsockname()[1]
    server = make_server(create_app(settings), settings.model_copy(update={"log_level": "warning"}))
    # uvicorn installs signal handlers only in the main thread; a test thread must not try.
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("the test server did not start (see the log above)")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test session, dropped afterwards.

    The server comes from ``AOQ_TEST_POSTGRES_URL`` (default: trust auth on 127.0.0.1:5432,
    database ``test``, user ``postgres``, falling back to ``root``). Skips the test when no
    server can be reached.
    """
    import psycopg
    from sqlalchemy.engine import make_url

    configured = os.environ.get("AOQ_TEST_POSTGRES_URL")
    candidates = [configured] if configured else [DEFAULT_POSTGRES_URL, DEFAULT_POSTGRES_URL.replace("postgres@", "root@")]
    errors = []
    for url in candidates:
        admin = make_url(url)
        conninfo = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=5)
        except psycopg.Error as exc:
            errors.append(f"{admin.render_as_string()}: {str(exc).strip()}")
            continue
        name = f"aoq_test_{uuid.uuid4().hex[:12]}"
        with conn:
            conn.execute(f'CREATE DATABASE "{name}"')
            try:
                yield admin.set(database=name).render_as_string(hide_password=False)
            finally:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    pytest.skip(f"no PostgreSQL server reachable ({'; '.join(errors)})")


def unit_vectors(n: int, d: int, seed: int = 0) -> np.ndarray:
    """``n`` random L2-normalised float32 rows."""
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def serve_env(fx: ServiceFixture, **settings: object) -> dict[str, str]:
    """The environment of an ``aoq serve`` process for this fixture; ``settings`` become ``AOQ_*``.
    One worker process unless ``workers`` is given: each worker loads every model, and the suite's
    many servers would start once per core (tests/test_serving_workers.py runs several)."""
    env = {**os.environ, "AOQ_CATALOGUE_URL": fx.catalogue_url, "AOQ_MODELS_DIR": str(fx.models_dir),
           "AOQ_INDEX_DIR": str(fx.index_dir), "AOQ_DATA_DIR": str(fx.data_dir), "AOQ_RELOAD_POLL_S": "0",
           "AOQ_LOG_LEVEL": "warning", "AOQ_WORKERS": "1"}
    env.update({f"AOQ_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def start_serve(env: dict[str, str], port: int) -> subprocess.Popen:
    """``aoq serve --port port`` as a child process (stdout and stderr captured as text)."""
    return subprocess.Popen([sys.executable, "-m", "aoq_cli.main", "serve", "--port", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def serve_process(fx: ServiceFixture, timeout_s: float = 120.0, **settings: object) -> Iterator[tuple[int, subprocess.Popen]]:
    """The real ``aoq serve`` in its own process on a free loopback port; yields ``(port, process)``
    once ``/health`` answers; stops it with Ctrl+C (SIGINT) on exit."""
    import httpx

    probe = free_socket()
    port = probe.getsockname()[1]
    probe.close()
    proc = start_serve(serve_env(fx, **settings), port)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                _, err = proc.communicate(timeout=30)
                raise RuntimeError(f"aoq serve did not answer on port {port}:\n{err[-3000:]}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)


def strip_hubness_bank(folder: Path) -> None:
    """Make the model index in ``folder`` one built before hubness correction existed: no
    normaliser files, no bank in its manifest (rewritten, so its file hashes still verify)."""
    from aoq.io import read_manifest, write_manifest
    from aoq_serve.index.bank import MANIFEST_KEY

    manifest = read_manifest(folder)
    for name in manifest["files"]:
        if name.endswith("_log_z.npy") or "_active_" in name:
            (folder / name).unlink()
    config = {k: v for k, v in manifest["config"].items() if k != MANIFEST_KEY}
    extra = {k: v for k, v in manifest.items() if k not in ("kind", "config", "files", "content_hash")}
    write_manifest(folder, manifest["kind"], config, **extra)


def retrain(models_dir: Path, name: str, seed: int) -> str:
    """Replace a checkpoint by one with other weights (same config, vocab and extra)."""
    old = load_checkpoint(models_dir / name)
    return write_checkpoint(models_dir / name, old.config, old.vocab, old.extra.get("img_dim"), seed,
                            {k: v for k, v in old.extra.items() if k not in ("img_dim", "image_input", "resnet_arch")})


def refused_start(fx: ServiceFixture) -> tuple[int, str]:
    """Start ``aoq serve`` on a damaged catalogue; it must exit by itself (bounded wait)."""
    probe = free_socket()
    port = probe.getsockname()[1]
    probe.close()
    proc = start_serve(serve_env(fx), port)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"aoq serve kept running on a damaged catalogue:\n{err[-3000:]}") from None
    return proc.returncode, err
