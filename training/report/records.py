"""What ``aoq report`` reads from one finished seed, and the small records that keep it
(docs/training.md, Reports over several sittings).

A report on a costly model (the cross-attention ones take hours of CPU a seed) is finished over
several sittings, perhaps on several machines, and its run folders (checkpoints, mined lists)
are too large to keep. Everything the page reads from a finished seed (:func:`seed_summary`:
every method's test results and training log, the mined lists' diagnostics, the test-split rank
histograms and within-family scores, the false-negative counts, the CPUs that ran it) is one
JSON file per seed, ``<records>/seed<N>.json``, small enough to keep under version control beside
the page. A record names what made it (the hash of the seed's configuration without its folder,
and of the configuration that trained the teacher that mined for it), so a record made under
other settings is ignored; it holds the methods its run had, and stands for the seed in any report
whose methods it holds. The teacher's weights are not part of that name: the same configuration
trains other weights on another CPU (its float kernels round differently), so each seed's record
keeps the content hash of the teacher that mined its lists instead, and the page shows them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from aoq.config import ExperimentConfig
from aoq.io import atomic_write_text, read_manifest, sha256_json
from aoq_train.report.false_negatives import needs_truth, seed_false_negatives
from aoq_train.report.figures import seed_test_figures
from aoq_train.report.runs import ReportSetup, collect, finished, machines_of, seed_config
from aoq_train.report.scenes import scene_diagnostics

log = logging.getLogger(__name__)

#: the record's format; a change makes every older record stale
FORMAT = 2


def seed_identity(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a seed's results depend on: its configuration (seeded; the run folder left out, since
    it says where, not what) and, when a teacher from outside the run mined its lists, the
    teacher's recipe (:func:`teacher_recipe`)."""
    config = cfg.model_dump(mode="json")
    config.pop("out_dir", None)
    teacher = teacher_recipe(Path(cfg.mining.teacher)) if cfg.mining.teacher else None
    return {"format": FORMAT, "config": config, "teacher": teacher}


def teacher_recipe(teacher: Path) -> str:
    """The hash of the configuration a teacher checkpoint was trained with, its folder left out:
    the same wherever that configuration ran, where the weights' content hash is not."""
    config = read_manifest(teacher, verify=False)["config"]
    config.pop("out_dir", None)
    return sha256_json(config)


def mined_by(run_dir: Path) -> str:
    """The content hash of the checkpoint that mined a run's lists (its mined lists' manifest)."""
    return read_manifest(run_dir / "mined", verify=False)["checkpoint_hash"]


def record_path(folder: Path, seed: int) -> Path:
    return folder / f"seed{seed}.json"


def load_record(folder: Path, seed: int, identity: dict[str, Any], methods: dict[str, str]) -> dict[str, Any] | None:
    """The seed's summary if a record of this very seed holding every one of ``methods`` is
    there, else None (missing, unreadable, made under another identity, or without a method)."""
    try:
        record = json.loads(record_path(folder, seed).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("identity_hash") != sha256_json(identity):
        return None
    summary = record.get("seed")
    if not isinstance(summary, dict) or not set(methods) <= set(summary.get("results", {})):
        return None
    return _only(summary, methods)


def save_record(folder: Path, seed: int, identity: dict[str, Any], summary: dict[str, Any]) -> Path:
    """Write (atomically) the record of a finished seed."""
    # not key-sorted: the summary's order (methods, histogram buckets) is the page's order
    record = {"identity_hash": sha256_json(identity), "identity": identity, "seed": summary}
    return atomic_write_text(record_path(folder, seed), json.dumps(record, indent=2) + "\n")


def seed_summary(run_dir: Path, methods: dict[str, str], cfg: ExperimentConfig,
                 scene_data: Path | None = None) -> dict[str, Any]:
    """Everything the page reads from one finished seed's run folder (``methods``: arm -> label,
    baseline first; ``scene_data``: the synthetic set's folder, when its scene records are there).

    Returns:
        :func:`aoq_train.report.runs.collect`'s entry for the seed, plus ``rank_histogram`` and
        ``family`` (:func:`aoq_train.report.figures.seed_test_figures`), ``false_negatives``
        (:func:`aoq_train.report.false_negatives.seed_false_negatives`, None without filtered or
        borrowed lists), ``scene`` (None without scene records), ``cpus`` (the CPUs noted in
        the run folder) and ``teacher`` (:func:`mined_by`, None when the seed's round-1 model
        mined).
    """
    from aoq.data.load import load_split
    from aoq_train.mining.truth import split_truth

    summary = collect([run_dir], methods)["seeds"][0]
    arms = [a for a in methods if a != "baseline"]
    histogram_arms = ("baseline", "aoq" if "aoq" in arms else arms[0])
    summary.update(seed_test_figures(run_dir, tuple(methods), histogram_arms))
    summary["false_negatives"] = None
    if needs_truth(methods):
        truth = split_truth(load_split(cfg.data, "train"), cfg.data.path, cfg.data.format, cfg.eval.positives)
        summary["false_negatives"] = seed_false_negatives(run_dir, methods, truth)
    diag = summary["diagnostics"]
    h_t = diag["settings"]["h_t"] if diag else cfg.round2.h_t
    summary["scene"] = scene_diagnostics(run_dir, scene_data, h_t) if scene_data is not None else None
    summary["cpus"] = machines_of(run_dir)
    summary["teacher"] = mined_by(run_dir) if cfg.mining.teacher else None
    # through JSON, so that a summary read from a record and one just computed are the same object
    return json.loads(json.dumps(summary))


def scene_data(setup: ReportSetup) -> Path | None:
    """The synthetic set's folder when the report runs on one with scene records, else None."""
    return setup.data_dir if setup.synth and (setup.data_dir / "scenes.jsonl").is_file() else None


def report_seeds(setup: ReportSetup) -> list[dict[str, Any]]:
    """The summaries of the setup's seeds, in order: from a valid record where ``setup.records``
    has one (its run folder is then not needed), else from the finished run folder, which is
    then recorded.

    Raises:
        FileNotFoundError: naming the seeds with neither.
    """
    summaries, missing = [], []
    for seed in setup.seeds:
        cfg = seed_config(setup, seed)
        identity = seed_identity(cfg) if setup.records is not None else None
        recorded = load_record(setup.records, seed, identity, setup.methods) if identity is not None else None
        if recorded is not None:
            summaries.append(recorded)
        elif finished(cfg.run_dir, setup.methods):
            log.info("report: summarising %s", cfg.run_dir)
            summary = seed_summary(cfg.run_dir, setup.methods, cfg, scene_data(setup))
            if identity is not None:
                save_record(setup.records, seed, identity, summary)
            summaries.append(summary)
        else:
            missing.append(f"{cfg.run_dir}" + (f" (no record in {setup.records})" if setup.records is not None else ""))
    if missing:
        raise FileNotFoundError(f"no finished runs in {', '.join(missing[:4])}; add --run to run them")
    return summaries


def _only(summary: dict[str, Any], methods: dict[str, str]) -> dict[str, Any]:
    """A record's summary cut to ``methods`` (a record may hold more than a report shows)."""
    keep = set(methods)
    out = {**summary, "results": {a: r for a, r in summary["results"].items() if a in keep},
           "history": {a: h for a, h in summary["history"].items() if a in keep},
           "arm_diagnostics": {a: d for a, d in summary["arm_diagnostics"].items() if a in keep},
           "rank_histogram": {a: h for a, h in summary["rank_histogram"].items() if a in keep}}
    if out.get("family") is not None:
        out["family"] = {a: f for a, f in out["family"].items() if a in keep}
    fn = out.get("false_negatives")
    if fn is not None:
        out["false_negatives"] = {**fn, "scores": {a: s for a, s in fn["scores"].items() if a in keep},
                                  "gaps": {a: g for a, g in fn["gaps"].items() if a in keep}} if needs_truth(methods) else None
    return out
