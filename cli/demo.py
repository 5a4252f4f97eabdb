"""``make demo``: dataset -> backbone features -> baseline and AOQ models -> indexes -> service and UI.

Two datasets: ``emoji`` (the default: real emoji pictures by Noto and Twemoji with CLDR captions,
pretrained EfficientNet-Lite0 + MiniLM encoders, configs/emoji.yaml) and ``synth`` (the synthetic
benchmark, configs/synthetic.yaml). Every step is skipped when its result is already there (the
dataset by its manifest, the backbone features by their content-hashed cache, the models by the
pipeline's stage hashes, the indexes by the model hashes they were built from), so a second
``make demo`` starts the servers within seconds. ``--quick`` is a small variant (a subset of the
dataset, short schedules) for tests; ``--prepare-only`` stops before starting servers (the
``init`` service of docker-compose). Paths follow ``AOQ_DATA_DIR`` / ``AOQ_RUNS_DIR`` when set.

Each stage prints its wall and CPU time (this process, its finished children and, for the
servers, theirs). SIGTERM is handled like Ctrl-C: the servers are stopped and waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from aoq.config import ExperimentConfig, load_config
from aoq.io import ArtefactError, read_manifest, stamp_matches, write_stamp
from aoq.net import ServerNotReady, port_free, wait_http
from aoq_cli.main import configure_logging

log = logging.getLogger("aoq_cli.demo")
ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("emoji", "synth")


@dataclass(frozen=True)
class DemoVariant:
    """One demo: its dataset, the config it trains with, and that config's overrides.

    ``sizes`` (synth) are the images per split; ``limit`` (emoji) the number of emoji kept, as
    whole base emoji (None: all of them), those named in ``include`` first. ``arms``: the models
    trained and published beside the baseline (:mod:`aoq_train.pipeline.arms`)."""

    name: str
    dataset: str
    config: str
    sizes: tuple[int, int, int] = (0, 0, 0)
    limit: int | None = None
    include: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    arms: tuple[str, ...] = ("aoq",)


#: configs/emoji.yaml on every emoji of both vendors (docs/emoji.md), with the best system the
#: emoji experiments found (docs/results-emoji.md: GOAL cir x con, selected by dev rsum) and the
#: best filtered AOQ (docs/results-false-negatives.md: the identity filter, whose struck-through
#: candidates the Negatives tab shows) beside the baseline and AOQ.
EMOJI_FULL = DemoVariant("demo-emoji", "emoji", "emoji.yaml", arms=("aoq", "goal-cir-con", "aoq-fn-identity"))
#: 120 emoji (about 240 pictures): every stage in under two minutes; numbers mean little. The
#: browser test searches for the flag of Japan (a training item of the full set too).
EMOJI_QUICK = DemoVariant(
    "demo-emoji-quick", "emoji", "emoji.yaml", limit=120, include=("flag: Japan",),
    overrides=(
        # a fixed, tiny budget instead of training to the plateau
        "model.embed_dim=64", "train.schedule=step", "train.epochs=3", "train.lr_decay_epochs=2",
        "train.batch_size=32", "round2.schedule=step", "round2.epochs=3", "round2.lr_decay_epochs=2",
        "round2.batch_size=32",
        "mining.top_captions=25", "mining.top_images=5", "round2.h_t=25", "round2.h_i=5",
        # a few epochs on 120 emoji stay near chance on their small dev split by design: no guard
        "train.collapse_epochs=0", "round2.collapse_epochs=0",
    ),
)
#: configs/synthetic.yaml as calibrated (docs/synthetic.md).
SYNTH_FULL = DemoVariant("demo", "synth", "synthetic.yaml", sizes=(4000, 500, 1000))
#: tiny synthetic variant: every stage runs, in well under two minutes.
SYNTH_QUICK = DemoVariant(
    "demo-quick", "synth", "synthetic.yaml", sizes=(160, 40, 100),
    overrides=(
        "model.embed_dim=64", "train.schedule=step", "train.epochs=2", "train.lr_decay_epochs=1",
        "train.batch_size=32", "round2.schedule=step", "round2.epochs=2", "round2.lr_decay_epochs=1",
        "round2.batch_size=32",
        "mining.top_captions=100", "mining.top_images=20", "round2.depth=absolute", "round2.h_t=50",
        "round2.h_i=10", "train.collapse_epochs=0", "round2.collapse_epochs=0",
    ),
)
VARIANTS: dict[tuple[str, bool], DemoVariant] = {
    ("emoji", False): EMOJI_FULL, ("emoji", True): EMOJI_QUICK,
    ("synth", False): SYNTH_FULL, ("synth", True): SYNTH_QUICK,
}
#: clickable free-text queries that show fine-grained differences, per dataset (``aoq ui --examples``).
EXAMPLE_QUERIES = {"emoji": ROOT / "configs" / "emoji_queries.yaml"}
#: the multi-seed results the Metrics tab puts beside the demo's one seed (``aoq ui --results``); the
#: full variant only: the quick one trains on another catalogue, so its seed is no draw of those.
RESULTS_PAGES = {"emoji": ROOT / "docs" / "results-emoji.md"}


class DemoError(RuntimeError):
    """A demo step cannot go on; the message says what to do."""


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time of this process, its waited-for children and the running processes ``pids``."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            # /proc/<pid>/stat fields 14-15 (after the command in parentheses): utime, stime in ticks.
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


@contextlib.contextmanager
def timed(stage: str, timings: dict[str, tuple[float, float]], pids: list[int] | None = None) -> Iterator[None]:
    """Record the wall and CPU seconds of ``stage`` in ``timings`` and log them."""
    pids = [] if pids is None else pids
    wall, cpu = time.monotonic(), _cpu_seconds(pids)
    yield
    spent = (time.monotonic() - wall, _cpu_seconds(pids) - cpu)
    timings[stage] = spent
    log.info("stage %s: %.1f s wall, %.1f s CPU", stage, *spent)


def timings_table(timings: dict[str, tuple[float, float]]) -> str:
    """The stages' times as aligned text lines."""
    lines = [f"  {'stage':<14} {'wall s':>8} {'CPU s':>8}"]
    lines += [f"  {name:<14} {wall:>8.1f} {cpu:>8.1f}" for name, (wall, cpu) in timings.items()]
    return "\n".join(lines)


def _data_root() -> Path:
    return Path(os.environ.get("AOQ_DATA_DIR", "data"))


def _runs_root() -> Path:
    return Path(os.environ.get("AOQ_RUNS_DIR", "runs"))


def demo_config(variant: DemoVariant, data_root: Path, runs_root: Path) -> ExperimentConfig:
    """The variant's config pointed at the demo's folders, with its overrides."""
    cfg = load_config(ROOT / "configs" / variant.config, list(variant.overrides))
    cfg.name = variant.name
    cfg.out_dir = str(runs_root / "{name}")
    folder = data_root / variant.name
    path = folder / "precomp" if cfg.data.format == "precomp" else folder / f"dataset_{variant.dataset}.json"
    cfg.data = cfg.data.model_copy(update={"path": str(path)})
    return cfg


def ensure_data(variant: DemoVariant, data_root: Path, workers: int = 1) -> None:
    """Build the variant's dataset unless it is already there (the emoji rendered by ``workers``
    processes)."""
    out = data_root / variant.name
    if variant.dataset == "emoji":
        from aoq_train.datasets.emoji.builder import ensure_emoji_dataset

        ensure_emoji_dataset(out, limit=variant.limit, include=variant.include, workers=workers)
    else:
        from aoq_train.datasets.synth.writer import ensure_dataset

        ensure_dataset(out, dict(zip(("train", "dev", "test"), variant.sizes)))


def ensure_features(cfg: ExperimentConfig, workers: int) -> None:
    """Compute the frozen pretrained backbones' features of every split into the feature cache
    once (images on ``workers`` processes while this one does the captions), so training, mining
    and indexing only run the heads. When every entry is there, no model is even built (that
    alone takes seconds)."""
    from aoq.backbone_cache import (
        caption_key_inputs,
        has_entry,
        image_key_inputs,
        precompute_backbone_features,
    )
    from aoq.data.load import load_split
    from aoq.models import packages

    image = cfg.model.image_encoder == "effnet_lite0" and cfg.model.image_finetune_blocks == 0
    text = cfg.model.text_encoder == "minilm" and cfg.model.text_finetune_layers == 0
    if not (image or text):
        return
    image_id = packages.effnet_identity().to_dict() if image else None
    text_id = packages.minilm_identity().to_dict() if text else None
    splits = [load_split(cfg.data, s) for s in (cfg.data.train_split, cfg.data.dev_split, cfg.data.test_split)]
    missing = [s for s in splits
               if (image and not has_entry(image_key_inputs(image_id, list(s.image_paths or []))))
               or (text and not has_entry(caption_key_inputs(text_id, s.captions)))]
    if not missing:
        log.info("backbone features: all %d splits cached, skipped", len(splits))
        return
    from aoq.models.joint import build_model, text_vocabulary
    from aoq.models.pretrained import EffNetImageEncoder

    def text_encoder() -> tuple:
        # built once the image workers run: MiniLM's loading overlaps them
        model = build_model(cfg.model, 1, None if image else 1)
        return model.text_encoder, text_vocabulary(cfg.model, [], cfg.data.vocab_threshold)

    precompute_backbone_features(missing, image=EffNetImageEncoder(cfg.model.embed_dim) if image else None,
                                 text=text_encoder if text else None, progress=True, workers=workers)


def ensure_indexes(models_dir: Path, data_root: Path, index_dir: Path, catalogue_url: str | None) -> None:
    """Build the FAISS indexes and the catalogue unless they were built from these very models."""
    from aoq_serve.index.build import INDEX_FORMAT, IndexJob, discover_checkpoints, index_models
    from aoq_serve.config import CATALOGUE_FILE

    hashes = {p.name: read_manifest(p, verify=False)["content_hash"] for p in discover_checkpoints(models_dir)}
    stamp = index_dir / "demo-built-from.json"
    url = catalogue_url or f"sqlite:///{(index_dir / CATALOGUE_FILE).resolve()}"
    key = {"models": hashes, "catalogue": url, "format": INDEX_FORMAT}
    if stamp_matches(stamp, key):
        log.info("indexes %s: up to date, skipped", index_dir)
        return
    index_dir.mkdir(parents=True, exist_ok=True)
    index_models(IndexJob(models_dir=models_dir, data_dir=data_root, out=index_dir, catalogue_url=url))
    write_stamp(stamp, key)


def prepare(variant: DemoVariant, timings: dict[str, tuple[float, float]], workers: int = 1
            ) -> tuple[ExperimentConfig, Path, Path]:
    """Dataset, features, pipeline and indexes; returns the config, the models dir and the index dir."""
    from aoq_train.pipeline.arms import resolve_arms
    from aoq_train.pipeline.run import comparison_table, run_pipeline

    data_root, runs_root = _data_root(), _runs_root()
    cfg = demo_config(variant, data_root, runs_root)
    with timed("dataset", timings):
        ensure_data(variant, data_root, workers)
    with timed("features", timings):
        ensure_features(cfg, workers)
    with timed("pipeline", timings):
        result = run_pipeline(cfg, resolve_arms(variant.arms), workers=workers)
    print("\n" + comparison_table(result.comparison) + "\n", flush=True)
    models_dir, index_dir = cfg.run_dir / "models", cfg.run_dir / "index"
    with timed("indexes", timings):
        ensure_indexes(models_dir, data_root, index_dir, os.environ.get("AOQ_CATALOGUE_URL"))
    return cfg, models_dir, index_dir


def start_servers(args: argparse.Namespace, models_dir: Path, index_dir: Path,
                  timings: dict[str, tuple[float, float]], procs: list[subprocess.Popen]) -> None:
    """Start ``aoq serve`` and ``aoq ui`` (appended to ``procs`` at once, so a signal meanwhile
    stops them too), wait until both answer, and run a first query."""
    backend_url = f"http://{args.host}:{args.backend_port}"
    ui_url = f"http://{args.host}:{args.ui_port}"
    aoq = [sys.executable, "-m", "aoq_cli.main"]
    pids: list[int] = []
    with timed("servers", timings, pids):
        backend = subprocess.Popen(aoq + ["serve", "--models-dir", str(models_dir), "--index-dir", str(index_dir),
                                          "--data-dir", str(_data_root()), "--host", args.host,
                                          "--port", str(args.backend_port)])
        procs.append(backend)
        pids.append(backend.pid)
        ui_cmd = aoq + ["ui", "--backend", backend_url, "--host", args.host, "--port", str(args.ui_port)]
        examples = EXAMPLE_QUERIES.get(args.dataset)
        if examples is not None and examples.is_file():
            ui_cmd += ["--examples", str(examples)]
        results = None if args.quick else RESULTS_PAGES.get(args.dataset)
        if results is not None and results.is_file():
            ui_cmd += ["--results", str(results)]
        # Both start at once: the UI needs the backend only when a page loads.
        ui = subprocess.Popen(ui_cmd)
        procs.append(ui)
        pids.append(ui.pid)
        wait_http(f"{backend_url}/health", proc=backend, what="the search service")
        wait_http(ui_url, proc=ui, what="the UI")
    with timed("first query", timings, pids):
        example = httpx.get(f"{backend_url}/examples", params={"split": "test", "n": 1}, timeout=30).json()
        query = example["captions"][0]["text"]
        answer = httpx.post(f"{backend_url}/compare/text", json={"query": query, "k": 5}, timeout=60)
        answer.raise_for_status()
    ranks = {side: answer.json()[side]["ground_truth_rank"] for side in ("left", "right")}
    print(f"first query {query!r}: ground truth at rank {ranks['left']} (baseline) / "
          f"{ranks['right']} (AOQ)", flush=True)


def stop(procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
    """Terminate the servers, politely first, and wait for them."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a process manager, ``docker stop``) ends the demo the way Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aoq_cli.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=DATASETS, default=os.environ.get("AOQ_DEMO_DATASET", "emoji"),
                        help="real emoji pictures, or the synthetic benchmark (env AOQ_DEMO_DATASET; "
                             "default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="small variant (tests): every step, minutes less")
    parser.add_argument("--prepare-only", action="store_true", help="data, models and indexes; no servers")
    parser.add_argument("--exit-when-ready", action="store_true", help="stop the servers after the first query")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="processes sharing the work: rendering, backbone features, the models trained "
                             "side by side (default: the CPU count, %(default)s)")
    parser.add_argument("--host", default=os.environ.get("AOQ_DEMO_HOST", "127.0.0.1"))
    parser.add_argument("--backend-port", type=int, default=int(os.environ.get("BACKEND_PORT", 8000)))
    parser.add_argument("--ui-port", type=int, default=int(os.environ.get("UI_PORT", 7860)))
    args = parser.parse_args(argv)
    configure_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)
    start = time.monotonic()
    timings: dict[str, tuple[float, float]] = {}
    procs: list[subprocess.Popen] = []
    try:
        if not args.prepare_only:
            # Checked first, so a second demo fails at once instead of after minutes of work.
            busy = [p for p in (args.backend_port, args.ui_port) if not port_free(args.host, p)]
            if busy:
                raise DemoError(
                    f"port(s) {', '.join(map(str, busy))} on {args.host} already in use: is the demo already "
                    "running? Stop it, or choose others: make demo BACKEND_PORT=8001 UI_PORT=7861"
                )
        variant = VARIANTS[(args.dataset, args.quick)]
        _, models_dir, index_dir = prepare(variant, timings, max(1, args.workers))
        if args.prepare_only:
            print(f"prepared in {time.monotonic() - start:.0f} s: models {models_dir}, indexes {index_dir}\n"
                  + timings_table(timings), flush=True)
            return 0
        start_servers(args, models_dir, index_dir, timings, procs)
        print(f"\nready in {time.monotonic() - start:.0f} s\n{timings_table(timings)}\n"
              f"  comparison UI:  http://{args.host}:{args.ui_port}\n"
              f"  search API:     http://{args.host}:{args.backend_port}/docs\n"
              "Ctrl-C stops both.", flush=True)
        if args.exit_when_ready:
            return 0
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("demo: a server exited; stopping the other", file=sys.stderr)
        return 1
    except (DemoError, ServerNotReady, ArtefactError, ValueError, OSError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: stopping", file=sys.stderr, flush=True)
        return 130
    finally:
        # Ignore further signals while the servers stop, so a second Ctrl-C cannot orphan them.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop(procs)


if __name__ == "__main__":
    sys.exit(main())
