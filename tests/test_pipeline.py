"""`aoq pipeline`: round 1 -> mine -> round 2 -> publish -> compare, resumable stage by stage."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from aoq.checkpoint import WEIGHTS, load_checkpoint
from aoq_cli.main import main as aoq
from aoq.config import load_config
from tests.fixtures import write_precomp_fixture
from aoq.data.load import load_split
from aoq.mined import load_mined
from aoq_train.pipeline.arms import resolve_arm, resolve_arms
from aoq_train.pipeline.run import read_evaluation, run_pipeline

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "model": {"image_encoder": "vse", "embed_dim": 16, "word_dim": 8},
    "train": {"epochs": 2, "batch_size": 16, "lr": 0.002, "lr_decay_epochs": 1, "save_every_steps": 1},
    "mining": {"top_captions": 20, "top_images": 5},
    "round2": {"epochs": 2, "batch_size": 16, "lr": 0.002, "lr_decay_epochs": 1, "h_t": 10, "h_i": 2,
               "save_every_steps": 1},
}

# every test here trains models through the whole pipeline
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "synth"
    assert aoq(["synth", "--out", str(out), "--train", "40", "--dev", "8", "--test", "8", "--seed", "5",
                "--workers", "1"]) == 0
    return out


def _config(tmp_path, synth, **sections):
    tree = {"name": "tiny", "out_dir": str(tmp_path / "runs" / "{name}"),
            "data": {"format": "precomp", "path": str(synth / "precomp"), "name": "synth", "vocab_threshold": 1},
            **{k: dict(v) for k, v in TINY.items()}}
    for section, values in sections.items():
        tree[section].update(values)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_end_to_end_then_skips_then_reruns_only_round2(tmp_path, synth, capsys):
    cfg_path = _config(tmp_path, synth)
    result = run_pipeline(load_config(cfg_path), progress_bar=False)
    assert set(result.status.values()) == {"ran"}
    assert list(result.status) == ["round1", "mine", "publish:baseline", "round2:aoq", "publish:aoq",
                                   "evaluate:baseline", "evaluate:aoq", "compare"]
    base, aoq_model = load_checkpoint(result.models["baseline"]), load_checkpoint(result.models["aoq"])
    assert (base.extra["role"], aoq_model.extra["role"]) == ("baseline", "aoq")
    assert aoq_model.extra["loss"] == "adaptive_offline_quintuplet"
    assert base.extra["source_checkpoint"] == load_checkpoint(result.run_dir / "round1" / "best").content_hash
    assert (result.run_dir / aoq_model.extra["mined_dir"] / "manifest.json").is_file()
    assert set(result.comparison) == {"baseline", "aoq"}
    assert result.comparison["aoq"]["full"]["n_images"] == 8

    again = run_pipeline(load_config(cfg_path), progress_bar=False)
    assert set(again.status.values()) == {"skipped"}

    lists = (result.run_dir / "mined" / "img_top_caps.npy").read_bytes()
    changed = run_pipeline(load_config(cfg_path, ["round2.margin_online=0.1"]), progress_bar=False)
    # the margin enters the hardness diagnostics: they are recomputed, the lists are not re-mined
    assert changed.status == {"round1": "skipped", "mine": "ran", "publish:baseline": "skipped",
                              "round2:aoq": "ran", "publish:aoq": "ran", "evaluate:baseline": "skipped",
                              "evaluate:aoq": "ran", "compare": "ran"}
    assert (result.run_dir / "mined" / "img_top_caps.npy").read_bytes() == lists
    diag = json.loads((result.run_dir / "mined" / "diagnostics.json").read_text())
    assert diag["settings"]["margin_online"] == 0.1
    assert "diagnostics.json" in json.loads((result.run_dir / "mined" / "manifest.json").read_text())["files"]
    # a round-2 key the diagnostics do not read leaves the mined lists alone
    longer = run_pipeline(load_config(cfg_path, ["round2.margin_online=0.1", "round2.epochs=3"]), progress_bar=False)
    assert longer.status["mine"] == "skipped" and longer.status["round2:aoq"] == "ran"
    # another arm in the same folder: the baseline and aoq stay as they are, the evaluations of all
    # three are kept per model, and the comparison shows the arms of this call
    more = run_pipeline(load_config(cfg_path, ["round2.margin_online=0.1", "round2.epochs=3"]),
                        [resolve_arm("offtri")], progress_bar=False)
    assert more.status["round1"] == "skipped" and more.status["evaluate:baseline"] == "skipped"
    assert more.status["round2:offtri"] == "ran" and "round2:aoq" not in more.status
    assert set(more.comparison) == {"baseline", "offtri"}
    assert read_evaluation(result.run_dir, "aoq") == longer.comparison["aoq"]


def test_changed_config_moves_an_interrupted_stage_aside(tmp_path, synth, caplog):
    cfg_path = _config(tmp_path, synth, train={"epochs": 1}, round2={"epochs": 1})
    result = run_pipeline(load_config(cfg_path), progress_bar=False)
    # round 2 interrupted before the ledger recorded it, then the config changed: the old code
    # kept the folder and round 2 refused ("started with mined negatives ... now given ...")
    ledger_path = result.run_dir / "pipeline.json"
    ledger = json.loads(ledger_path.read_text())
    del ledger["stages"]["round2:aoq"]
    ledger_path.write_text(json.dumps(ledger))
    changed = run_pipeline(load_config(cfg_path, ["mining.top_captions=15"]), progress_bar=False)
    assert changed.status["mine"] == "ran" and changed.status["round2:aoq"] == "ran"
    stale = list(result.run_dir.glob("round2.stale-*"))
    assert len(stale) == 1 and (stale[0] / "best" / "manifest.json").is_file()
    used = json.loads((result.run_dir / "round2" / "mined.json").read_text())["content_hash"]
    assert used == json.loads((result.run_dir / "mined" / "manifest.json").read_text())["content_hash"]
    assert any("moved it aside to" in r.getMessage() and "round2.stale-" in r.getMessage() for r in caplog.records)


def test_cli_arms_and_table(tmp_path, synth, capsys):
    cfg_path = _config(tmp_path, synth, train={"epochs": 1}, round2={"epochs": 1})
    assert aoq(["pipeline", "--config", str(cfg_path), "--arms", "aoq,offtri,goal-nca-sig", "--no-progress",
                "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "round2:offtri" in out and "| offtri | full (8 images) |" in out and "| baseline |" in out
    assert "round1:goal-nca-sig" in out and "| goal-nca-sig | full (8 images) |" in out
    run_dir = tmp_path / "runs" / "tiny"
    offtri = load_checkpoint(run_dir / "models" / "offtri")
    assert offtri.extra["loss"] == "offline_triplet"
    # A round-1 arm trains its own model from scratch with its objective, not on mined negatives.
    goal = load_checkpoint(run_dir / "models" / "goal-nca-sig")
    assert goal.extra["loss"] == "goal" and "mined_dir" not in goal.extra
    assert goal.config.goal.triplet == "nca" and goal.config.goal.pair == "sig"
    assert goal.extra["metrics_log"] == ["round1-goal-nca-sig/metrics.jsonl"]
    assert goal.content_hash != load_checkpoint(run_dir / "models" / "baseline").content_hash
    # The synthetic set carries object-class labels: the comparison has the label-wise metrics.
    comparison = json.loads((run_dir / "comparison" / "comparison.json").read_text())
    assert set(comparison["goal-nca-sig"]["full"]["labels"]) >= {"i2t", "t2i", "k"}
    assert aoq(["pipeline", "--config", str(cfg_path), "--arms", "nope"]) == 2
    assert "unknown arm 'nope'" in capsys.readouterr().err


def test_filtered_and_teacher_arms_train_on_their_own_mined_lists(tmp_path, synth, monkeypatch):
    monkeypatch.setenv("AOQ_FEATURE_CACHE", str(tmp_path / "cache"))
    cfg = load_config(_config(tmp_path, synth, train={"epochs": 1}, round2={"epochs": 1, "h_t": 5},
                              mining={"top_captions": 10}))
    arms = resolve_arms(["aoq", "aoq-fn-identity+teacher1.5", "aoq-by-goal-con-sig"])
    result = run_pipeline(cfg, arms, progress_bar=False)
    # each arm mines its own lists once; the teacher (round 1, not compared) trains before its
    # mining, after the stages that need only the baseline
    order = list(result.status)
    assert order[:4] == ["round1", "mine", "publish:baseline", "mine:mined-fn-identity+teacher1.5"]
    assert order.index("round2:aoq-fn-identity+teacher1.5") < order.index("round1:goal-con-sig") \
        < order.index("mine:mined-by-goal-con-sig") < order.index("round2:aoq-by-goal-con-sig")
    assert result.status["mine:mined-fn-identity+teacher1.5"] == "ran"
    assert result.status["mine:mined-by-goal-con-sig"] == "ran"
    assert set(result.comparison) == {"baseline", "aoq", "aoq-fn-identity+teacher1.5", "aoq-by-goal-con-sig"}
    run_dir = result.run_dir
    filtered = load_mined(run_dir / "mined-fn-identity+teacher1.5")
    assert filtered.filters == ["identity", "teacher"] and filtered.manifest["teacher_rho"] == 1.5
    assert load_mined(run_dir / "mined").filters == []
    by_goal = load_mined(run_dir / "mined-by-goal-con-sig")
    assert by_goal.checkpoint_hash == load_checkpoint(run_dir / "round1-goal-con-sig" / "best").content_hash
    model = load_checkpoint(result.models["aoq-fn-identity+teacher1.5"])
    assert model.extra["mined_dir"] == "mined-fn-identity+teacher1.5"
    assert json.loads((run_dir / "round2-aoq-fn-identity+teacher1.5" / "mined.json").read_text())["content_hash"] \
        == filtered.manifest["content_hash"]
    # the report's section: the synthetic facts are the ground truth, the filtered arm's detector scores
    from aoq_train.mining.truth import split_truth
    from aoq_train.report.false_negatives import detector_scores, false_negative_section, seed_false_negatives
    from aoq_train.report.runs import ReportSetup

    methods = ReportSetup(Path("cfg"), arms=("aoq", "aoq-fn-identity+teacher1.5")).methods
    truth = split_truth(load_split(cfg.data, "train"), cfg.data.path, cfg.data.format, cfg.eval.positives)
    section = "\n".join(false_negative_section([{"false_negatives": seed_false_negatives(run_dir, methods, truth)}],
                                                methods))
    assert truth.broad_rule == "the synthetic benchmark's facts"
    assert "## False negatives and near neighbours in the mined lists" in section
    settings = filtered.diagnostics["settings"]
    scores = detector_scores(filtered, truth, settings["h_t"], settings["h_i"])
    row = next(line for line in section.splitlines() if line.startswith("| AdapOffQuin, filters identity"))
    assert row.startswith(f"| AdapOffQuin, filters identity + teacher rho=1.5 | {100 * scores['false_negatives']:.1f} | "
                          f"{100 * scores['near_neighbours']:.1f} | {100 * scores['enabled']['flagged']:.1f} |")
    shares = filtered.diagnostics["shares"]  # the mining's own count, both kinds
    assert set(shares) == {"false_negatives", "near_neighbours"} and shares["near_neighbours"] is not None


def test_two_processes_train_the_models_of_one_on_one_thread(tmp_path, synth, one_thread, caplog):
    """With two processes the round-2 arms and the round-1 arm train beside the main line, and the
    evaluations are shared between the processes, each on one thread: the weights and results are
    those of a serial run on one thread, byte for byte (a float reduction's order follows the
    thread count, so that is the serial run to match)."""
    cfg_path = _config(tmp_path, synth, train={"epochs": 1}, round2={"epochs": 1})
    arms = resolve_arms(["aoq", "aoq-fn-identity", "goal-con-sig"])
    serial = run_pipeline(load_config(cfg_path), arms, progress_bar=False)
    with caplog.at_level(logging.INFO, logger="aoq_train.pipeline.stages"):
        two = run_pipeline(load_config(cfg_path, [f"out_dir={tmp_path}/two/{{name}}"]), arms, progress_bar=False,
                           workers=2)
    assert any(re.match(r"stage evaluate:\S+: running in another process", r.getMessage()) for r in caplog.records)
    assert set(two.status.values()) == {"ran"} and list(two.status) == list(serial.status)
    assert set(serial.models) == {"baseline", "aoq", "aoq-fn-identity", "goal-con-sig"}
    for name, path in serial.models.items():
        assert (two.models[name] / WEIGHTS).read_bytes() == (path / WEIGHTS).read_bytes(), name
        assert read_evaluation(two.run_dir, name)["full"]["i2t"] == read_evaluation(serial.run_dir, name)["full"]["i2t"]


def test_with_a_teacher_round_1_and_the_arms_need_nothing_of_each_other(tmp_path, synth, one_thread, caplog):
    """The teacher setting (lists mined by a model from outside the run, round 2 from scratch): the
    teacher mines first, and with two processes an arm trains in the other one while this one
    trains round 1; the weights are still those of a serial run on one thread, byte for byte."""
    teacher = run_pipeline(load_config(_config(tmp_path, synth, train={"epochs": 1}), [f"out_dir={tmp_path}/t"]),
                           [], progress_bar=False).run_dir / "round1" / "best"
    cfg_path = _config(tmp_path, synth, train={"epochs": 1}, round2={"epochs": 1}, mining={"teacher": str(teacher)})
    arms = resolve_arms(["aoq", "aoq-fn-identity"])
    serial = run_pipeline(load_config(cfg_path), arms, progress_bar=False)
    assert list(serial.status)[:4] == ["mine", "mine:mined-fn-identity", "round1", "publish:baseline"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aoq_train.pipeline.stages"):
        two = run_pipeline(load_config(cfg_path, [f"out_dir={tmp_path}/two/{{name}}"]), arms, progress_bar=False,
                           workers=2)
    assert list(two.status) == list(serial.status)
    for name, path in serial.models.items():
        assert (two.models[name] / WEIGHTS).read_bytes() == (path / WEIGHTS).read_bytes(), name
    # the first arm went to the other process as soon as its lists existed, before round 1 started
    # here; the second arm ran here after round 1
    started = [m.groups() for r in caplog.records
               if (m := re.match(r"stage (\S+): (running in another process|running ahead in this process|running) ->",
                                 r.getMessage()))]
    assert started == [("mine", "running"), ("round2:aoq", "running in another process"),
                       ("mine:mined-fn-identity", "running"), ("round1", "running"), ("publish:baseline", "running"),
                       ("round2:aoq-fn-identity", "running ahead in this process"), *started[6:]]


def test_resumes_after_kill_9(tmp_path, synth):
    """kill -9 in the middle of round 2, run the same command again: round 1 and mining are
    skipped, round 2 resumes from its saved state, and the pipeline finishes."""
    cfg_path = _config(tmp_path, synth, round2={"epochs": 3})
    cmd = [sys.executable, "-m", "aoq_cli.main", "pipeline", "--config", str(cfg_path), "--no-progress"]
    run_dir = tmp_path / "runs" / "tiny"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        progress = run_dir / "round2" / "state" / "progress.json"
        while not progress.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the pipeline ended before round 2 saved any state"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (run_dir / "models" / "aoq").exists()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "round1                 skipped" in done.stdout
    assert "mine                   skipped" in done.stdout
    assert "round2:aoq             ran" in done.stdout
    history = [json.loads(line) for line in (run_dir / "round2" / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert load_checkpoint(run_dir / "models" / "aoq").extra["role"] == "aoq"


@pytest.mark.parametrize("config", ["coco_precomp.yaml", "f30k_precomp.yaml"])
def test_paper_configs_run_on_fixture_of_the_same_shapes(tmp_path, config, capsys):
    """The paper configs, unchanged but for data path, epochs and list depths, on tiny SCAN-layout
    data with 36 regions x 2048-d features (testall for COCO)."""
    splits = {"train": 24, "dev": 6, "test": 6, "testall": 6}
    data = write_precomp_fixture(tmp_path, splits=splits, regions=36, dim=2048, name="precomp")
    overrides = [f"data.path={data}", f"out_dir={tmp_path}/runs/{{name}}", "data.vocab_threshold=1",
                 "data.max_dev_images=null", "model.embed_dim=64", "train.epochs=1", "round2.epochs=1",
                 "train.batch_size=16", "round2.batch_size=16", "train.num_workers=0", "round2.num_workers=0",
                 "mining.top_captions=20", "mining.top_images=5", "round2.h_t=10", "round2.h_i=2"]
    args = ["pipeline", "--config", str(ROOT / "configs" / config), "--no-progress"]
    assert aoq(args + [a for o in overrides for a in ("--set", o)]) == 0
    out = capsys.readouterr().out
    assert "| aoq | full (6 images) |" in out
    ckpt = load_checkpoint(next((tmp_path / "runs").iterdir()) / "models" / "aoq")
    assert ckpt.config.model.image_encoder == "vsrn"
    assert (ckpt.config.round2.alpha, ckpt.config.round2.beta) == (0.3, 1.5)
