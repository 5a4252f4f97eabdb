"""The two-round AOQ pipeline as hashed, resumable stages (``aoq pipeline``).

Stages, each an artefact directory under the run folder::

    round1/best      the baseline: round 1 with ``train.loss`` (max_violation = VSE++)
    mined            offline hard negatives mined with round1/best (or ``mining.teacher``)
    round2/best      the AOQ model: round 2 from scratch with ``round2.loss`` (one folder per arm)
    models/<name>    published checkpoints with their role, for ``aoq index`` / ``aoq serve``
    evaluation/<name> test-split evaluation of one published model (kept per model, so a run folder
                     gathers arms over several calls and a report reads any set of them)
    comparison       the table of the models of the last call

Budget (paper section 4.2): the baseline is the round-1 model trained for its full schedule;
AOQ is a fresh model trained in round 2 for its own schedule with negatives mined by that
baseline. A stage runs again only when something it depends on changed (see
:mod:`aoq_train.pipeline.stages`); interrupted training and mining resume from their saved state.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aoq.config import ExperimentConfig
from aoq.io import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    read_manifest,
    sha256_json,
    write_manifest,
)
from aoq_train.mining.canonical import RULE
from aoq_train.pipeline.arms import Arm, resolve_arm
from aoq_train.pipeline.stages import Stage, StageLedger, run_stages

log = logging.getLogger(__name__)

#: keys that change where or how fast a stage runs, not what it computes.
RUNTIME_KEYS = {"device", "num_workers", "save_every_steps", "block_size", "collapse_epochs"}
#: round-2 keys the mined artefact's hardness diagnostics depend on (training/mining/diagnostics.py).
DIAGNOSTIC_KEYS = ("batch_size", "seed", "depth", "h_t", "h_i", "h_rel", "min_depth", "sampling", "normal_center",
                   "normal_scale", "margin_online", "margin_offline", "alpha", "beta")
COMPARISON_KIND = "comparison"
EVALUATION_KIND = "evaluation"
#: the file of an evaluation artefact that holds the results
EVALUATION_FILE = "result.json"


@dataclass
class PipelineResult:
    """Where everything went and what ran."""

    run_dir: Path
    status: dict[str, str]
    models: dict[str, Path]
    comparison: dict[str, Any] = field(default_factory=dict)


def _section(model: Any) -> dict[str, Any]:
    return {k: v for k, v in model.model_dump(mode="json").items() if k not in RUNTIME_KEYS}


def dataset_identity(cfg: ExperimentConfig) -> dict[str, Any]:
    """What identifies the dataset a run reads, cheaply.

    A generated dataset (``aoq synth``) carries a manifest with a content hash; for user data
    (e.g. 33 GB of COCO features) hashing every byte on each run would be too slow, so the
    identity is the path, size and modification time of every file in the data folder.
    """
    root = Path(cfg.data.path)
    for candidate in (root, root.parent):
        try:
            return {"content_hash": read_manifest(candidate, verify=False)["content_hash"]}
        except Exception:  # noqa: BLE001 - no manifest here: fall back to file stats
            continue
    folder = root if root.is_dir() else root.parent
    files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    return {
        "path": str(root.resolve()),
        "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files],
    }


def seeded_config(cfg: ExperimentConfig, seed: int) -> ExperimentConfig:
    """``cfg`` with ``train.seed = round2.seed = seed`` and its run folder ``<run dir>/seed<seed>``
    (``aoq pipeline --seed``, ``aoq report``): seeds of one config never share a folder."""
    run_dir = cfg.run_dir / f"seed{seed}"
    return cfg.model_copy(update={
        "train": cfg.train.model_copy(update={"seed": seed}),
        "round2": cfg.round2.model_copy(update={"seed": seed}),
        "out_dir": str(run_dir),
    })


def _content_hash(path: Path) -> str:
    return read_manifest(path, kind=None, verify=False)["content_hash"]


#: written into a training stage's folder when it starts: the inputs it is being built from.
STAGE_INPUTS = "stage_inputs.json"


def _fresh(stage_dir: Path, ledger: StageLedger, name: str, inputs: dict[str, Any]) -> None:
    """Move a stage's work folder aside when it was built from other inputs, so the trainer starts
    over instead of refusing (or resuming) state that belongs to another config.

    The folder's own ``stage_inputs.json`` says what it was started with (an interrupted run
    too); without it, the ledger entry of a finished run does. A folder with neither is an
    interrupted first run and is resumed. The old folder is kept as ``<name>.stale-<time>``.
    """
    want = sha256_json(inputs)
    try:
        started = json.loads((stage_dir / STAGE_INPUTS).read_text())["input_hash"]
    except (OSError, ValueError, KeyError, TypeError):
        started = (ledger.entries.get(name) or {}).get("input_hash")
    if stage_dir.exists() and started is not None and started != want:
        stale = stage_dir.with_name(f"{stage_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        while stale.exists():
            stale = stale.with_name(stale.name + "x")
        stage_dir.rename(stale)
        log.warning("stage %s: its inputs changed since %s was started; moved it aside to %s and "
                    "running the stage again", name, stage_dir, stale)
    stage_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(stage_dir / STAGE_INPUTS, {"stage": name, "input_hash": want})


def publish(source: Path, target: Path, role: str, extra: dict[str, Any]) -> None:
    """Copy a checkpoint to ``models/<name>`` with its role and the paths the service reads
    (metrics log, mined negatives), as a new complete artefact."""
    with atomic_dir(target) as tmp:
        for f in source.iterdir():
            if f.is_file() and f.name != "manifest.json":
                shutil.copy2(f, tmp / f.name)
        ckpt_extra = json.loads((tmp / "extra.json").read_text()) if (tmp / "extra.json").is_file() else {}
        ckpt_extra.update(role=role, source_checkpoint=_content_hash(source), **extra)
        atomic_write_json(tmp / "extra.json", ckpt_extra)
        source_manifest = read_manifest(source, verify=False)
        write_manifest(tmp, source_manifest["kind"], source_manifest.get("config"),
                       **{k: v for k, v in source_manifest.items()
                          if k not in {"kind", "config", "files", "content_hash"}})


def comparison_table(results: dict[str, dict[str, Any]]) -> str:
    """A markdown table of R@K per model and protocol (the protocol is always named)."""
    lines = [
        "| model | protocol | i2t R@1 | R@5 | R@10 | t2i R@1 | R@5 | R@10 | rsum |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by_protocol in results.items():
        for protocol, r in by_protocol.items():
            i, t = r["i2t"], r["t2i"]
            lines.append(
                f"| {name} | {protocol} ({r.get('n_images', '?')} images) | {i['r1']:.1f} | {i['r5']:.1f} | "
                f"{i['r10']:.1f} | {t['r1']:.1f} | {t['r5']:.1f} | {t['r10']:.1f} | {r['rsum']:.1f} |"
            )
    return "\n".join(lines)


def evaluate_model_stage(model: Path, split: str, out: Path, *, labels: bool = False) -> dict[str, Any]:
    """Evaluate one published model on ``split`` (full protocol; 1K 5-fold and 5K when there are
    5,000 images or more; one encoding) into the artefact ``out`` (``result.json``).

    ``labels``: the split carries labels, so one protocol's results (1K 5-fold where it applies,
    else full) also hold the label-wise metrics (``"labels"``: mAP@R, NDCG@10, both directions).
    """
    from aoq_train.evaluate import compare_checkpoint

    result = compare_checkpoint(model, split, labels=labels)
    with atomic_dir(out) as tmp:
        atomic_write_json(tmp / EVALUATION_FILE, result)
        write_manifest(tmp, EVALUATION_KIND, {"split": split, "model": str(model), "labels": labels})
    return result


def read_evaluation(run_dir: Path, name: str) -> dict[str, Any]:
    """The test-split results of the published model ``name`` of a run folder."""
    return json.loads((run_dir / "evaluation" / name / EVALUATION_FILE).read_text())


def write_comparison(run_dir: Path, names: list[str], split: str, out: Path) -> dict[str, Any]:
    """``comparison.json`` and ``comparison.md`` of these models' evaluations, atomically."""
    results = {name: read_evaluation(run_dir, name) for name in names}
    with atomic_dir(out) as tmp:
        atomic_write_json(tmp / "comparison.json", results)
        atomic_write_text(tmp / "comparison.md", f"Split: {split}\n\n{comparison_table(results)}\n")
        write_manifest(tmp, COMPARISON_KIND, {"split": split, "models": names})
    return results


def run_pipeline(
    cfg: ExperimentConfig,
    arms: list[Arm] | None = None,
    *,
    progress_bar: bool = True,
    workers: int = 1,
) -> PipelineResult:
    """Round 1 -> mining -> round 2 (one run per arm) -> publish -> compare; resumable.

    Args:
        cfg: the run configuration.
        arms: what to train beside the baseline (:mod:`aoq_train.pipeline.arms`); default one arm "aoq"
            with the configured method. Round-2 arms share round 1 and the mined negatives;
            round-1 arms (GOAL, the label term) train like the baseline with their own settings.
        workers: processes; with more than one, the round-1 arms train in other processes
            beside the baseline, its mining and the round-2 arms (:func:`run_stages`).

    Returns:
        Stage status (ran/skipped), the published model folders and the comparison results.
    """
    from aoq.data.load import load_split
    from aoq_train.mining import mine_with_checkpoint
    from aoq_train.round1 import train_round1
    from aoq_train.round2.train import train_round2

    arms = [resolve_arm("aoq")] if arms is None else arms
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = StageLedger(run_dir / "pipeline.json")
    data_id = dataset_identity(cfg)
    round1_dir = run_dir / "round1"
    mined_dir = run_dir / "mined"
    models_dir = run_dir / "models"

    def mine_stage(name: str, mining_cfg: ExperimentConfig, teacher: Path, out: Path) -> Stage:
        def inputs() -> dict[str, Any]:
            return {"checkpoint": _content_hash(teacher), "data": data_id, "mining": _section(mining_cfg.mining),
                    "ranking": RULE, "diagnostics": {k: getattr(mining_cfg.round2, k) for k in DIAGNOSTIC_KEYS}}

        return Stage(name, out, inputs, lambda: mine_with_checkpoint(teacher, mining_cfg, out, progress=progress_bar))

    teacher = Path(cfg.mining.teacher) if cfg.mining.teacher else round1_dir / "best"
    train_baseline, publish_baseline = _round1_stages("baseline", cfg, round1_dir, models_dir, data_id, ledger,
                                                      train_round1, progress_bar)
    models = {"baseline": models_dir / "baseline"}
    # a round-1 arm that mines for a round-2 arm trains first, whether or not it is compared itself
    teachers = [resolve_arm(a.teacher) for a in arms if a.round == 2 and a.teacher]
    round1_arms = list({a.name: a for a in [*teachers, *(a for a in arms if a.round == 1)]}.values())
    # Order: what the baseline's round 1 feeds, then the round-1 arms, then what they feed. The
    # round-1 arms train in another process from the start; in this one the loop waits for a stage
    # running elsewhere when it reaches it, so they come after the work that does not need them.
    by_baseline: list[Stage] = [mine_stage("mine", cfg, teacher, mined_dir)]
    by_arms: list[Stage] = []
    round2: dict[str, list[Stage]] = {"baseline": [], "arms": []}
    mine_names = {"mined": "mine"}
    for arm in arms:
        if arm.round == 1:
            models[arm.name] = models_dir / arm.name
            continue
        arm_cfg = arm.config(cfg)
        arm_mined = run_dir / arm.mined_folder
        side = by_arms if arm.teacher else by_baseline
        if arm.mined_folder not in mine_names:
            arm_teacher = run_dir / resolve_arm(arm.teacher).folder / "best" if arm.teacher else teacher
            mine_names[arm.mined_folder] = f"mine:{arm.mined_folder}"
            side.append(mine_stage(mine_names[arm.mined_folder], arm_cfg, arm_teacher, arm_mined))
        # round 2 reads round 1 only to start from it; lists mined by round 1 come after it anyway
        needs = (("round1",) if arm_cfg.round2.init == "finetune" else ()) + (mine_names[arm.mined_folder],)
        round2["arms" if arm.teacher else "baseline"] += _round2_stages(
            arm.name, arm_cfg, run_dir / arm.folder, arm_mined, round1_dir, models_dir, data_id, ledger,
            train_round2, progress_bar, needs=needs)
        models[arm.name] = models_dir / arm.name
    if cfg.mining.teacher and not any("round1" in s.needs for s in round2["baseline"]):
        # The paper's teacher setting: the lists come from outside the run and round 2 starts
        # from scratch, so round 1 and the round-2 arms need nothing of each other. The teacher
        # mines first (minutes) and round 1 waits for it, so that with two processes the other
        # one takes the first arm at once while this one trains round 1 and then the next arm,
        # rather than round 1 going elsewhere first and the arms one after another here.
        train_baseline = replace(train_baseline, needs=tuple(s.name for s in by_baseline))
        stages = [*by_baseline, train_baseline, publish_baseline, *round2["baseline"]]
    else:
        stages = [train_baseline, by_baseline[0], publish_baseline, *by_baseline[1:], *round2["baseline"]]
    for arm in round1_arms:
        stages += _round1_stages(arm.name, arm.config(cfg), run_dir / arm.folder, models_dir, data_id, ledger,
                                 train_round1, progress_bar)
    stages += [*by_arms, *round2["arms"]]

    labelled = load_split(cfg.data, "test").labels is not None
    for name, path in models.items():
        out = run_dir / "evaluation" / name
        work = functools.partial(evaluate_model_stage, path, "test", out, labels=labelled)
        # detachable: with two processes the evaluations are shared between them (one thread each)
        stages.append(Stage(
            f"evaluate:{name}", out,
            lambda path=path: {"model": _content_hash(path), "split": cfg.data.test_split, "labels": labelled},
            work, lambda work=work: work, needs=(f"publish:{name}",),
        ))
    comparison_dir = run_dir / "comparison"
    stages.append(Stage(
        "compare", comparison_dir,
        lambda: {"evaluations": {k: _content_hash(run_dir / "evaluation" / k) for k in models}},
        lambda: write_comparison(run_dir, list(models), cfg.data.test_split, comparison_dir),
    ))
    status = run_stages(stages, ledger, workers)
    comparison = json.loads((comparison_dir / "comparison.json").read_text())
    return PipelineResult(run_dir, status, models, comparison)


def _round1_inputs(cfg: ExperimentConfig, data_id: dict[str, Any]) -> dict[str, Any]:
    """What a round-1 model depends on (the ``goal`` section only when the loss is GOAL, ``eval``
    only when it is not the default, so that other runs keep their hashes)."""
    inputs = {"data": data_id, "model": _section(cfg.model), "train": _section(cfg.train), **_eval_inputs(cfg)}
    if cfg.train.loss == "goal":
        inputs["goal"] = _section(cfg.goal)
    return inputs


def _eval_inputs(cfg: ExperimentConfig) -> dict[str, Any]:
    """The ``eval`` section where it changes training (the dev score picks the best epoch)."""
    return {} if cfg.eval == type(cfg.eval)() else {"eval": _section(cfg.eval)}


def _round1_stages(name, cfg, train_dir, models_dir, data_id, ledger, train_round1, progress_bar) -> list[Stage]:
    """The training and publish stages of a round-1 model: the baseline (stage ``round1``) or a
    round-1 arm (``round1:<arm>``)."""
    stage = "round1" if name == "baseline" else f"round1:{name}"
    log_path = f"{train_dir.name}/metrics.jsonl"
    # The baseline mined the negatives; a round-1 arm did not. A one-item list marks its log as round 1.
    extra = ({"metrics_log": log_path, "mined_dir": "mined"} if name == "baseline" else {"metrics_log": [log_path]})

    def run() -> None:
        _fresh(train_dir, ledger, stage, _round1_inputs(cfg, data_id))
        train_round1(cfg, train_dir, progress_bar=progress_bar)

    def detached() -> Callable[[], None]:
        _fresh(train_dir, ledger, stage, _round1_inputs(cfg, data_id))
        return functools.partial(_train_round1_quietly, cfg, train_dir)

    # A round-1 model needs no other stage's output, so it may train beside them.
    return [
        Stage(stage, train_dir / "best", lambda: _round1_inputs(cfg, data_id), run, detached),
        Stage(f"publish:{name}", models_dir / name,
              lambda: {"source": _content_hash(train_dir / "best"), "role": name},
              lambda: publish(train_dir / "best", models_dir / name, name, extra)),
    ]


def _train_round1_quietly(cfg: ExperimentConfig, train_dir: Path) -> None:
    """A round-1 arm trained in another process (no progress bar to mix with this one's)."""
    from aoq_train.round1 import train_round1

    # a pool's process may not start loader processes of its own (same batches without them)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"num_workers": 0})})
    train_round1(cfg, train_dir, progress_bar=False)


def _round2_stages(arm, arm_cfg, arm_dir, mined_dir, round1_dir, models_dir, data_id, ledger, train_round2,
                   progress_bar, needs: tuple[str, ...]) -> list[Stage]:
    """The round-2 and publish stages of one arm (``needs``: the stages that make round 1 and the
    mined lists it reads, after which it may train in another process)."""
    r2 = arm_cfg.round2
    if r2.init == "finetune" and not r2.init_from:
        arm_cfg = arm_cfg.model_copy(update={"round2": r2.model_copy(update={"init_from": str(round1_dir / "best")})})

    def inputs() -> dict[str, Any]:
        init = _content_hash(round1_dir / "best") if arm_cfg.round2.init == "finetune" else None
        return {"data": data_id, "model": _section(arm_cfg.model), "round2": _section(arm_cfg.round2),
                "mined": _content_hash(mined_dir), "init": init, **_eval_inputs(arm_cfg)}

    def run() -> None:
        _fresh(arm_dir, ledger, f"round2:{arm}", inputs())
        train_round2(arm_cfg, mined_dir, arm_dir, progress_bar=progress_bar)

    def detached() -> Callable[[], None]:
        _fresh(arm_dir, ledger, f"round2:{arm}", inputs())
        return functools.partial(_train_round2_quietly, arm_cfg, mined_dir, arm_dir)

    rel = arm_dir.name
    return [
        Stage(f"round2:{arm}", arm_dir / "best", inputs, run, detached, needs),
        Stage(f"publish:{arm}", models_dir / arm,
              lambda: {"source": _content_hash(arm_dir / "best"), "role": arm},
              lambda: publish(arm_dir / "best", models_dir / arm, arm,
                              {"metrics_log": f"{rel}/metrics.jsonl", "mined_dir": mined_dir.name})),
    ]


def _train_round2_quietly(cfg: ExperimentConfig, mined_dir: Path, arm_dir: Path) -> None:
    """A round-2 arm trained in another process (no progress bar to mix with this one's; no loader
    processes, as for a round-1 arm)."""
    from aoq_train.round2.train import train_round2

    cfg = cfg.model_copy(update={"round2": cfg.round2.model_copy(update={"num_workers": 0})})
    train_round2(cfg, mined_dir, arm_dir, progress_bar=False)
