"""The experiment report ``docs/results.md``: several paired seeds of the pipeline on any dataset,
the baseline against its arms (default the round-2 arms OffTri, OffQuin, AdapOffQuin; round-1
arms such as GOAL objectives too, :mod:`aoq_train.pipeline.arms`), from the run files only.

``aoq report --run`` first runs (or resumes, stage by stage) one pipeline per seed: the config's
own dataset, or with ``--synth`` a synthetic set generated for the report (by default with a
5,000-image test split, so that the full 5K and the COCO-style 5-fold 1K protocols both apply).
Seeds are paired: every arm of a seed shares that seed's data, round-1 model and mined lists.
Without ``--run`` it only reads finished runs. Every figure in the report is computed here from
``evaluation/<model>/result.json``, ``metrics.jsonl``, ``mined/diagnostics.json`` and the
checkpoints; a seed's folder may hold more arms than one report shows (they are evaluated and
kept per model), so several reports can share the same runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aoq.config import ExperimentConfig, load_config
from aoq.device import cpu_model
from aoq.io import atomic_write_json
from aoq_train.pipeline.arms import arm_label, resolve_arm, resolve_arms
from aoq_train.loop.guards import TrainingCollapsed

log = logging.getLogger(__name__)

ARMS = ("offtri", "offquin", "aoq")
#: protocol -> heading, in the order the report shows them.
PROTOCOLS = {
    "5k": "5K protocol (all 5,000 test images)",
    "1k5fold": "1K protocol (mean of 5 folds of 1,000 test images)",
    "full": "full test split",
}
#: the file of a run folder that lists the CPUs it ran on
MACHINES = "machines.json"


def machines_of(run_dir: Path) -> list[str]:
    """The CPUs a job's run folder was run on (:func:`cpu_model`), in the order they took it up;
    empty for a run made before they were noted."""
    try:
        return list(json.loads((run_dir / MACHINES).read_text())["cpus"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def note_machine(run_dir: Path) -> None:
    """Add this CPU to the run folder's list, as a job starts or resumes."""
    cpus = machines_of(run_dir)
    if (cpu := cpu_model()) not in cpus:
        atomic_write_json(run_dir / MACHINES, {"cpus": [*cpus, cpu]})


def machine_counts(jobs: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``jobs`` each CPU (or set of CPUs, for a job resumed elsewhere) ran, most first;
    ``"not noted"`` for jobs from before the CPUs were."""
    counts: dict[str, int] = {}
    for job in jobs:
        key = " then ".join(job.get("cpus") or ["not noted"])
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def collapsed_file(run_dir: Path, sweep: str) -> Path:
    """Written into a run folder when the collapse guard stopped a sweep point there (the point is
    reported as collapsed); named by the point, since points without overrides share folders."""
    return run_dir / f"collapsed-{sweep}.json"


@dataclass(frozen=True)
class Sweep:
    """One sweep point: config overrides on top of the report's, run for the sweep seeds with
    ``arms`` (each compared with that point's own baseline), in ``<runs>/sweeps/<name>``."""

    name: str
    overrides: tuple[str, ...] = ()
    arms: tuple[str, ...] = ("aoq",)


def parse_sweep(text: str) -> Sweep:
    """``NAME[:KEY=VALUE,...][@ARM,...]``, e.g. ``depth10:round2.depth=absolute,round2.h_t=10@aoq``."""
    head, _, arms = text.partition("@")
    name, _, overrides = head.partition(":")
    if not name.strip() or "/" in name:
        raise ValueError(f"--sweep {text!r}: give NAME[:KEY=VALUE,...][@ARM,...]")
    items = tuple(o.strip() for o in overrides.split(",") if o.strip())
    if any("=" not in o for o in items):
        raise ValueError(f"--sweep {text!r}: overrides are KEY=VALUE, separated by commas")
    chosen = tuple(a.strip() for a in arms.split(",") if a.strip()) or ("aoq",)
    return Sweep(name.strip(), items, chosen)


@dataclass
class ReportSetup:
    """What the report runs: the config, seeds, arms, early stopping, the data and folders.

    ``synth``: generate a synthetic set of ``train``/``dev``/``test`` images under ``data_dir``
    and run on it; otherwise the config's own ``data`` section is used as is.
    """

    config: Path
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    arms: tuple[str, ...] = ARMS
    runs_root: Path = Path("runs/report")
    synth: bool = False
    data_dir: Path = Path("data/report")
    train: int = 4000
    dev: int = 500
    test: int = 5000
    overrides: tuple[str, ...] = ()
    #: the patience of both rounds' schedules (docs/training.md, Budgets); None keeps the config's.
    patience: int | None = None
    sweeps: tuple[Sweep, ...] = ()
    sweep_seeds: tuple[int, ...] = (0,)
    #: (arm, reference) pairs compared with each other as well as with the baseline
    pairs: tuple[tuple[str, str], ...] = ()
    #: a folder of seed records (:mod:`aoq_train.report.records`): a recorded seed needs no run
    #: folder, and every seed summarised from its run folder is recorded there
    records: Path | None = None
    #: processes per pipeline and torch threads (None: torch's choice): they change only the last
    #: bits of the weights (a float reduction's order follows the thread count), so the page's
    #: command names them
    workers: int = 1
    threads: int | None = None

    @property
    def methods(self) -> dict[str, str]:
        """arm -> label, baseline first."""
        return {arm: arm_label(arm) for arm in ("baseline", *self.arms)}


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0-4"`` -> (0, 1, 2, 3, 4); ``"0,2,5"`` -> (0, 2, 5); ranges and lists may mix."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        low, _, high = part.partition("-")
        try:
            seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
        except ValueError:
            raise ValueError(f"--seeds: cannot read {part!r}; use e.g. 0-4 or 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: give distinct seeds, e.g. 0-4")
    return tuple(seeds)


def seed_config(setup: ReportSetup, seed: int) -> ExperimentConfig:
    """The config of one seed: the report's overrides and patience, seeded, in ``<runs>/seed<N>``."""
    from aoq_train.pipeline.run import seeded_config

    patience = [] if setup.patience is None else [f"train.patience={setup.patience}",
                                                  f"round2.patience={setup.patience}"]
    cfg = load_config(setup.config, [*patience, *setup.overrides])
    cfg.out_dir = str(setup.runs_root)
    if setup.synth:
        cfg.data = cfg.data.model_copy(update={"path": str(setup.data_dir / "precomp"), "format": "precomp"})
    return seeded_config(cfg, seed)


def sweep_setup(setup: ReportSetup, sweep: Sweep) -> ReportSetup:
    """The report setup of one sweep point: its overrides added, its arms, the sweep seeds. A point
    without overrides changes nothing the baseline depends on, so it runs its arms in the main
    seeds' folders, beside the main arms, against the same baseline."""
    root = setup.runs_root / "sweeps" / sweep.name if sweep.overrides else setup.runs_root
    return replace(setup, seeds=setup.sweep_seeds, arms=sweep.arms, overrides=(*setup.overrides, *sweep.overrides),
                   runs_root=root, sweeps=(), records=None)


def recorded(setup: ReportSetup, seed: int, cfg: ExperimentConfig) -> bool:
    """Whether the setup's records folder holds a valid record of this seed with every method."""
    from aoq_train.report.records import load_record, seed_identity

    return setup.records is not None and load_record(setup.records, seed, seed_identity(cfg), setup.methods) is not None


def run_experiments(setup: ReportSetup, main: bool = True) -> list[Path]:
    """Generate the synthetic set if asked, then run (or resume) every seed's pipeline with all arms
    (unless ``main`` is False), then every sweep point, each on ``setup.workers`` processes
    (:func:`aoq_train.pipeline.run.run_pipeline`). Finished stages are skipped, so several
    processes may share the work by sweep points."""
    from aoq_train.pipeline.run import run_pipeline

    if setup.synth:
        from aoq_train.datasets.synth.writer import ensure_dataset

        ensure_dataset(setup.data_dir, {"train": setup.train, "dev": setup.dev, "test": setup.test})
    main_dirs = []
    jobs = [(setup, seed, None) for seed in setup.seeds] if main else []
    jobs += [(sweep_setup(setup, sw), seed, sw.name) for sw in setup.sweeps for seed in setup.sweep_seeds]
    for job, seed, sweep in jobs:
        cfg = seed_config(job, seed)
        if sweep is None and recorded(setup, seed, cfg):
            log.info("report: seed %d: recorded in %s, skipped", seed, setup.records)
            main_dirs.append(cfg.run_dir)
            continue
        log.info("report: seed %d -> %s", seed, cfg.run_dir)
        note_machine(cfg.run_dir)
        try:
            run_pipeline(cfg, resolve_arms(job.arms), workers=setup.workers)
        except TrainingCollapsed as exc:
            if sweep is None:
                raise  # a main seed must finish: the tables compare every arm on every seed
            # A sweep point that collapses is a result: recorded, shown in the table, not retried.
            log.warning("report: sweep run %s collapsed: %s", cfg.run_dir, exc)
            atomic_write_json(collapsed_file(cfg.run_dir, sweep), {"message": str(exc)})
        if sweep is None:
            main_dirs.append(cfg.run_dir)
    return main_dirs


# --------------------------------------------------------------------------- collection


def finished(run_dir: Path, methods: Iterable[str]) -> bool:
    """Whether a seed's run folder holds the test results of every method."""
    from aoq_train.pipeline.run import EVALUATION_FILE

    return all((run_dir / "evaluation" / arm / EVALUATION_FILE).is_file() for arm in methods)


def history(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (one per epoch)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def round_dir(run_dir: Path, arm: str) -> Path:
    """The training folder of a method of a run (its ``metrics.jsonl``)."""
    return run_dir / ("round1" if arm == "baseline" else resolve_arm(arm).folder)


def _diagnostics(run_dir: Path, mined_folder: str = "mined") -> dict[str, Any] | None:
    path = run_dir / mined_folder / "diagnostics.json"
    return json.loads(path.read_text()) if path.is_file() else None


def collect(run_dirs: list[Path], methods: dict[str, str]) -> dict[str, Any]:
    """Read every finished seed: results per protocol, training curves, mining diagnostics."""
    from aoq_train.pipeline.run import read_evaluation

    seeds = []
    for run_dir in run_dirs:
        seeds.append({
            "run_dir": str(run_dir),
            "results": {arm: read_evaluation(run_dir, arm) for arm in methods},
            "history": {arm: history(round_dir(run_dir, arm) / "metrics.jsonl") for arm in methods},
            "diagnostics": _diagnostics(run_dir),
            # each round-2 arm's own lists (filtered, or mined by another round-1 model)
            "arm_diagnostics": {arm: _diagnostics(run_dir, resolve_arm(arm).mined_folder) for arm in methods
                                if arm != "baseline" and resolve_arm(arm).round == 2},
        })
    return {"seeds": seeds, "methods": methods}
