"""Running and reading the regime map's pipelines (docs/regimes.md).

Each (cell, replicate) is one job: its set is generated (:mod:`aoq_train.regimes.grid`), then
``aoq report``'s machinery runs the pipeline with every arm on it
(:func:`aoq_train.report.runs.seed_config`, :func:`aoq_train.pipeline.run.run_pipeline`: plateau
budgets, resumable stage by stage). The replicate number is also the training seed, and the
arms of a job share its set, round-1 model and mined lists, so differences are paired. Jobs
are numbered in a fixed order and ``worker=(k, n)`` takes every n-th from the k-th, so several
processes share a map without touching each other's folders. With ``records`` (a folder), each
finished job is also kept as a small record (:mod:`aoq_train.regimes.records`) that stands for
its run folder: a job with a valid record is finished, whether or not its run is still there.
Each run folder names the CPUs that ran it (``machines.json``), since single runs differ between
CPUs (docs/regimes.md) and a map may be finished on several.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aoq_train.regimes.grid import TRAIN, Cell, ensure_cell_data
from aoq_train.regimes.records import job_identity, load_record, save_record
from aoq_train.report.runs import (
    ReportSetup,
    finished,
    history,
    machine_counts,
    machines_of,
    note_machine,
    round_dir,
    seed_config,
)

log = logging.getLogger(__name__)

#: the arms compared with the baseline in every cell: AOQ, AOQ on identity-filtered lists (the
#: false negatives under the text rule removed), GOAL cir x con (round 1 only)
ARMS = ("aoq", "aoq-fn-identity", "goal-cir-con")
#: the arm whose gain over the baseline the pilot and the predictors look at
GAIN_ARM = "aoq"
#: the protocol every cell is read under (the whole test split)
PROTOCOL = "full"


@dataclass(frozen=True)
class MapSetup:
    """What a map (or its pilot) runs: the config, the cells, the replicates, the folders."""

    config: Path
    cells: tuple[Cell, ...]
    replicates: tuple[int, ...]
    root: Path = Path("runs/regimes")
    overrides: tuple[str, ...] = ()
    patience: int | None = None
    #: images per split; the cell's ``train`` knob overrides the training size
    sizes: dict[str, int] | None = None
    arms: tuple[str, ...] = ARMS
    progress: bool = True
    #: where finished jobs are recorded (:mod:`aoq_train.regimes.records`); None: the runs only
    records: Path | None = None

    def jobs(self) -> list[tuple[Cell, int]]:
        """Every (cell, replicate), replicates outermost: a half-finished map has whole replicates."""
        return [(cell, r) for r in self.replicates for cell in self.cells]

    def report_setup(self, cell: Cell, replicate: int) -> ReportSetup:
        """The ``aoq report`` setup of one job: its own set, its folder ``<root>/runs/<cell>``."""
        data = self.root / "data" / cell.name / f"rep{replicate}" / "precomp"
        return ReportSetup(self.config, (replicate,), self.arms, self.root / "runs" / cell.name,
                           overrides=(*self.overrides, "data.format=precomp", f"data.path={data}"),
                           patience=self.patience)

    def run_dir(self, cell: Cell, replicate: int) -> Path:
        return seed_config(self.report_setup(cell, replicate), replicate).run_dir

    def identity(self, cell: Cell, replicate: int) -> dict[str, Any]:
        """What the job's results depend on (:func:`aoq_train.regimes.records.job_identity`)."""
        cfg = seed_config(self.report_setup(cell, replicate), replicate)
        return job_identity(cfg.model_dump(mode="json"), cell, replicate, self.arms, self.sizes)

    def recorded(self, cell: Cell, replicate: int) -> dict[str, Any] | None:
        """The job's record, if it has a valid one."""
        if self.records is None:
            return None
        return load_record(self.records, cell, replicate, self.identity(cell, replicate))


def parse_worker(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N): this process takes jobs K, K + N, K + 2N, ... (0-based)."""
    k, _, n = text.partition("/")
    try:
        worker = (int(k), int(n))
    except ValueError:
        raise ValueError(f"--worker {text!r}: give K/N, e.g. 0/2") from None
    if not 0 <= worker[0] < worker[1]:
        raise ValueError(f"--worker {text!r}: K must be in 0..N-1")
    return worker


def run_map(setup: MapSetup, worker: tuple[int, int] = (0, 1)) -> int:
    """Run (or resume) this worker's share of the jobs; returns how many it took."""
    from aoq_train.pipeline.arms import resolve_arms
    from aoq_train.pipeline.run import run_pipeline

    mine = [job for k, job in enumerate(setup.jobs()) if k % worker[1] == worker[0]]
    for cell, replicate in mine:
        if setup.recorded(cell, replicate) is not None:
            log.info("regimes: %s replicate %d: recorded, skipped", cell.name, replicate)
            continue
        ensure_cell_data(setup.root / "data", cell, replicate, setup.sizes, progress=setup.progress)
        cfg = seed_config(setup.report_setup(cell, replicate), replicate)
        log.info("regimes: %s replicate %d -> %s", cell.name, replicate, cfg.run_dir)
        note_machine(cfg.run_dir)
        run_pipeline(cfg, resolve_arms(setup.arms), progress_bar=setup.progress)
        finished_job(setup, cell, replicate)  # recorded now
    return len(mine)


def _run_finished(setup: MapSetup, cell: Cell, replicate: int) -> bool:
    """Whether the job's run folder holds every method's test evaluation."""
    return finished(setup.run_dir(cell, replicate), ("baseline", *setup.arms))


def finished_job(setup: MapSetup, cell: Cell, replicate: int) -> dict[str, Any] | None:
    """A finished job's results (:func:`read_job`), from its record or else from its run folder,
    which is then recorded; None while it is not finished."""
    identity = None if setup.records is None else setup.identity(cell, replicate)
    if identity is not None and (job := load_record(setup.records, cell, replicate, identity)) is not None:
        return job
    if not _run_finished(setup, cell, replicate):
        return None
    job = read_job(setup, cell, replicate)
    if identity is not None:
        save_record(setup.records, cell, replicate, identity, job)
    return job


def unfinished(setup: MapSetup) -> list[tuple[Cell, int]]:
    """The jobs not finished yet: no valid record, and an arm without its test evaluation. The
    finished ones met on the way are recorded (:func:`finished_job`), so a map stopped half-way
    keeps what it has."""
    return [(c, r) for c, r in setup.jobs() if finished_job(setup, c, r) is None]


def read_job(setup: MapSetup, cell: Cell, replicate: int) -> dict[str, Any]:
    """One finished job: rsum per method, epochs run per method, the round-1 predictors."""
    from aoq_train.pipeline.run import read_evaluation
    from aoq_train.regimes.predictors import predictor_values
    from aoq_train.report.tables import budget

    run_dir = setup.run_dir(cell, replicate)
    methods = ("baseline", *setup.arms)
    logs = {a: history(round_dir(run_dir, a) / "metrics.jsonl") for a in methods}
    diagnostics = json.loads((run_dir / "mined" / "diagnostics.json").read_text())
    dev = max(h["dev_rsum"] for h in logs["baseline"])
    return {
        "cell": cell.name,
        "replicate": replicate,
        "rsum": {a: read_evaluation(run_dir, a)[PROTOCOL]["rsum"] for a in methods},
        "epochs": {a: budget(logs[a])["epochs"] for a in methods},
        "minutes": sum(budget(h)["minutes"] for h in logs.values()),
        "premise_holds": bool(diagnostics["premise_holds"]),
        "on_minus_off": {d: diagnostics[f"{d}_anchors"]["on_minus_off"] for d in ("image", "caption")},
        "predictors": predictor_values(diagnostics, dev, float(cell.params().family_share)),
        "cpus": machines_of(run_dir),
    }


def collect_map(setup: MapSetup) -> dict[str, list[dict[str, Any]]]:
    """Every finished job, grouped by cell name (in the setup's cell order)."""
    out: dict[str, list[dict[str, Any]]] = {c.name: [] for c in setup.cells}
    for cell, replicate in setup.jobs():
        job = finished_job(setup, cell, replicate)
        if job is not None:
            out[cell.name].append(job)
    return out


def differences(jobs: list[dict[str, Any]], arm: str, reference: str = "baseline") -> list[float]:
    """``arm`` minus ``reference`` rsum per replicate (paired: same set, seed and round 1)."""
    return [j["rsum"][arm] - j["rsum"][reference] for j in jobs]


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else float("nan")


def pilot_summary(pilot: MapSetup, jobs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per knob of the pilot: its levels' AOQ - baseline differences and their range; the budget;
    and the seed's yardstick, ``defaults``: the differences of the cells whose level is their
    knob's default (one and the same generator setting, different set seeds) and their range."""
    knobs: dict[str, dict[str, Any]] = {}
    at_defaults: list[float] = []
    for cell in pilot.cells:
        (knob, level), = cell.knobs
        row = knobs.setdefault(knob, {"levels": []})
        found = differences(jobs[cell.name], GAIN_ARM)
        row["levels"] += [(level, d) for d in found]
        if level == (Cell.of().sizes(pilot.sizes)[TRAIN] if knob == TRAIN else Cell.of().value(knob)):
            at_defaults += found
    for row in knobs.values():
        row["range"] = _spread([d for _, d in row["levels"]])
    return {"knobs": knobs, "defaults": {"differences": at_defaults, "range": _spread(at_defaults)},
            "minutes": sum(j["minutes"] for js in jobs.values() for j in js),
            "machines": machine_counts([j for js in jobs.values() for j in js])}


def pick_knobs(summary: dict[str, Any]) -> tuple[str, str]:
    """The two knobs whose levels move AOQ minus the baseline most (:func:`pilot_summary`'s range)."""
    ranges = {k: row["range"] for k, row in summary["knobs"].items() if row["range"] == row["range"]}
    if len(ranges) < 2:
        raise ValueError("the pilot needs finished runs of at least two knobs at two levels each")
    first, second = sorted(ranges, key=lambda k: -ranges[k])[:2]
    return first, second


def pilot_setup(setup: MapSetup, cells: tuple[Cell, ...]) -> MapSetup:
    """The pilot of a map: the given one-knob cells, one replicate (the first), and only the arm
    whose gain picks the knobs (the other arms would double its cost and inform nothing)."""
    return replace(setup, cells=cells, replicates=setup.replicates[:1], arms=(GAIN_ARM,))
