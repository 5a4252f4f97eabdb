"""``make demo``: synthetic data -> baseline and AOQ models -> indexes -> service and UI.

Every step is skipped when its result is already there (the dataset by its manifest, the
models by the pipeline's stage hashes, the indexes by the model hashes they were built from),
so a second ``make demo`` starts the servers within seconds. ``--quick`` is a tiny variant for
tests; ``--prepare-only`` stops before starting servers (the ``init`` service of
docker-compose). Paths follow ``AOQ_DATA_DIR`` / ``AOQ_RUNS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from aoq.config import ExperimentConfig, load_config
from aoq.io import ArtefactError, read_manifest, stamp_matches, write_stamp
from aoq.net import ServerNotReady, port_free, wait_http

log = logging.getLogger("aoq.cli.demo")
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoSize:
    """Dataset sizes and schedule overrides of one demo variant."""

    name: str
    train: int
    dev: int
    test: int
    overrides: tuple[str, ...] = ()


#: The default: configs/synthetic.yaml as calibrated (docs/synthetic.md).
FULL = DemoSize("demo", 4000, 500, 1000)
#: Tiny: every stage runs, in well under two minutes; numbers are meaningless at this size.
QUICK = DemoSize(
    "demo-quick", 160, 40, 100,
    (
        "model.embed_dim=64", "train.epochs=2", "train.lr_decay_epochs=1", "train.batch_size=32",
        "round2.epochs=2", "round2.lr_decay_epochs=1", "round2.batch_size=32",
        "mining.top_captions=100", "mining.top_images=20", "round2.depth=absolute", "round2.h_t=50",
        "round2.h_i=10",
    ),
)


class DemoError(RuntimeError):
    """A demo step cannot go on; the message says what to do."""


def demo_config(size: DemoSize, data_root: Path, runs_root: Path) -> ExperimentConfig:
    """configs/synthetic.yaml pointed at the demo's folders, with the variant's overrides."""
    cfg = load_config(ROOT / "configs" / "synthetic.yaml", list(size.overrides))
    cfg.name = size.name
    cfg.out_dir = str(runs_root / "{name}")
    cfg.data = cfg.data.model_copy(update={"path": str(data_root / size.name / "precomp")})
    return cfg


def ensure_indexes(models_dir: Path, data_root: Path, index_dir: Path, catalogue_url: str | None) -> None:
    """Build the FAISS indexes and the catalogue unless they were built from these very models."""
    from backend.build import IndexJob, discover_checkpoints, index_models
    from backend.config import CATALOGUE_FILE

    hashes = {p.name: read_manifest(p, verify=False)["content_hash"] for p in discover_checkpoints(models_dir)}
    stamp = index_dir / "demo-built-from.json"
    url = catalogue_url or f"sqlite:///{(index_dir / CATALOGUE_FILE).resolve()}"
    key = {"models": hashes, "catalogue": url}
    if stamp_matches(stamp, key):
        log.info("indexes %s: up to date, skipped", index_dir)
        return
    index_dir.mkdir(parents=True, exist_ok=True)
    index_models(IndexJob(models_dir=models_dir, data_dir=data_root, out=index_dir, catalogue_url=url))
    write_stamp(stamp, key)


def prepare(size: DemoSize) -> tuple[ExperimentConfig, Path, Path]:
    """Dataset, pipeline and indexes; returns the config, the models dir and the index dir."""
    from training.datasets.synth.writer import ensure_dataset
    from training.pipeline import comparison_table, run_pipeline

    data_root = Path(os.environ.get("AOQ_DATA_DIR", "data"))
    runs_root = Path(os.environ.get("AOQ_RUNS_DIR", "runs"))
    ensure_dataset(data_root / size.name, {"train": size.train, "dev": size.dev, "test": size.test})
    cfg = demo_config(size, data_root, runs_root)
    result = run_pipeline(cfg)
    print("\n" + comparison_table(result.comparison) + "\n", flush=True)
    models_dir, index_dir = cfg.run_dir / "models", cfg.run_dir / "index"
    ensure_indexes(models_dir, data_root, index_dir, os.environ.get("AOQ_CATALOGUE_URL"))
    return cfg, models_dir, index_dir


def start_servers(args: argparse.Namespace, models_dir: Path, index_dir: Path) -> list[subprocess.Popen]:
    """Start ``aoq serve`` and ``aoq ui``, wait until both answer, and run a first query."""
    data_root = os.environ.get("AOQ_DATA_DIR", "data")
    backend_url = f"http://{args.host}:{args.backend_port}"
    ui_url = f"http://{args.host}:{args.ui_port}"
    aoq = [sys.executable, "-m", "aoq.cli.main"]
    backend = subprocess.Popen(aoq + ["serve", "--models-dir", str(models_dir), "--index-dir", str(index_dir),
                                      "--data-dir", data_root, "--host", args.host, "--port", str(args.backend_port)])
    procs = [backend]
    try:
        wait_http(f"{backend_url}/health", proc=backend, what="the search service")
        ui = subprocess.Popen(aoq + ["ui", "--backend", backend_url, "--host", args.host, "--port", str(args.ui_port)])
        procs.append(ui)
        wait_http(ui_url, proc=ui, what="the UI")
        example = httpx.get(f"{backend_url}/examples", params={"split": "test", "n": 1}, timeout=30).json()
        query = example["captions"][0]["text"]
        answer = httpx.post(f"{backend_url}/compare/text", json={"query": query, "k": 5}, timeout=60)
        answer.raise_for_status()
        ranks = {side: answer.json()[side]["ground_truth_rank"] for side in ("left", "right")}
        print(f"first query {query!r}: ground truth at rank {ranks['left']} (baseline) / "
              f"{ranks['right']} (AOQ)", flush=True)
    except BaseException:
        stop(procs)
        raise
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the servers, politely first."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aoq.cli.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny variant (tests): every step, minutes less")
    parser.add_argument("--prepare-only", action="store_true", help="data, models and indexes; no servers")
    parser.add_argument("--exit-when-ready", action="store_true", help="stop the servers after the first query")
    parser.add_argument("--host", default=os.environ.get("AOQ_DEMO_HOST", "127.0.0.1"))
    parser.add_argument("--backend-port", type=int, default=int(os.environ.get("BACKEND_PORT", 8000)))
    parser.add_argument("--ui-port", type=int, default=int(os.environ.get("UI_PORT", 7860)))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    start = time.monotonic()
    try:
        if not args.prepare_only:
            # Checked first, so a second demo fails at once instead of after minutes of work.
            busy = [p for p in (args.backend_port, args.ui_port) if not port_free(args.host, p)]
            if busy:
                raise DemoError(
                    f"port(s) {', '.join(map(str, busy))} on {args.host} already in use: is the demo already "
                    "running? Stop it, or choose others: make demo BACKEND_PORT=8001 UI_PORT=7861"
                )
        _, models_dir, index_dir = prepare(QUICK if args.quick else FULL)
        if args.prepare_only:
            print(f"prepared in {time.monotonic() - start:.0f} s: models {models_dir}, indexes {index_dir}")
            return 0
        procs = start_servers(args, models_dir, index_dir)
    except (DemoError, ServerNotReady, ArtefactError, ValueError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    print(f"\nready in {time.monotonic() - start:.0f} s\n"
          f"  comparison UI:  http://{args.host}:{args.ui_port}\n"
          f"  search API:     http://{args.host}:{args.backend_port}/docs\n"
          "Ctrl-C stops both.", flush=True)
    if args.exit_when_ready:
        stop(procs)
        return 0
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        print("demo: a server exited; stopping the other", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(procs)


if __name__ == "__main__":
    sys.exit(main())
