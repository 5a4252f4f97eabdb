"""`aoq report`: the results page and its figures come from the run files, means over paired seeds."""

import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from aoq_cli.main import main as aoq
from aoq_train.report.runs import parse_seeds
from aoq_train.report.tables import format_difference, interval_method, mean_std_cell, paired_interval

TINY = ["model.embed_dim=16", "model.word_dim=8", "data.vocab_threshold=1",
        "train.epochs=2", "train.batch_size=16", "train.lr_decay_epochs=1",
        "round2.epochs=2", "round2.batch_size=16", "round2.lr_decay_epochs=1",
        "mining.top_captions=20", "mining.top_images=5", "round2.h_t=10", "round2.h_i=2"]


def test_parse_seeds():
    assert parse_seeds("0-4") == (0, 1, 2, 3, 4)
    assert parse_seeds("0,2, 5-6") == (0, 2, 5, 6)
    for bad in ("", "a", "1,1", "0-x"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_parse_sweep():
    from aoq_train.report.runs import Sweep, parse_sweep

    assert parse_sweep("depth30:round2.h_t=30,round2.h_i=6@aoq,offtri") == Sweep(
        "depth30", ("round2.h_t=30", "round2.h_i=6"), ("aoq", "offtri"))
    assert parse_sweep("ablations@only_offline") == Sweep("ablations", (), ("only_offline",))
    assert parse_sweep("plain") == Sweep("plain", (), ("aoq",))
    for bad in ("", ":a=1", "x:novalue", "a/b:k=1"):
        with pytest.raises(ValueError):
            parse_sweep(bad)


def test_paired_interval_is_student_t_below_20_seeds():
    d = [1.0, 2.0, 3.0, 4.0, 10.0]
    # by hand: mean 4, sample sd sqrt(50 / 4) = 3.5355, t(0.975, 4) = 2.7764 -> half width 4.3899
    mean, low, high = paired_interval(d)
    assert (mean, low, high) == pytest.approx((4.0, 4.0 - 2.7764451 * 3.5355339 / 5 ** 0.5,
                                               4.0 + 2.7764451 * 3.5355339 / 5 ** 0.5))
    assert format_difference(d) == "+4.0 [-0.4, +8.4] (n=5)"
    # one seed: a direction, no interval
    assert format_difference([2.5]) == "+2.5 (n=1)"


def test_one_seed_shows_its_values_without_a_spread_or_an_interval():
    # a "± 0.0" or "t with 0 degrees of freedom" would read as measured: one seed has neither
    assert mean_std_cell([151.04]) == "151.0"
    assert mean_std_cell([57.123], 2) == "57.12"
    assert mean_std_cell([1.0, 2.0, 6.0]) == "3.0 ± 2.6"
    assert interval_method(1).startswith("one seed: ")
    assert "t with 4 degrees of freedom" in interval_method(5)


def test_paired_interval_is_the_bootstrap_from_20_seeds():
    d = [float(x) for x in np.random.default_rng(1).normal(3.0, 2.0, 40)]
    mean, low, high = paired_interval(d, samples=20_000)
    # the bootstrap of a mean is about mean ± 1.96 sd / sqrt(n) (sd with ddof=0)
    half = 1.96 * np.std(d) / np.sqrt(len(d))
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=0.1)
    assert paired_interval(d) == paired_interval(d)  # fixed generator: a reproducible page


@pytest.mark.slow
def test_report_from_two_tiny_synthetic_seeds(tmp_path):
    out, figures = tmp_path / "docs" / "results.md", tmp_path / "docs" / "figures"
    args = ["report", "--run", "--synth", "--seeds", "0,1", "--runs", str(tmp_path / "runs"), "--data",
            str(tmp_path / "data"), "--train", "40", "--dev", "8", "--test", "8", "--out", str(out),
            "--figures", str(figures)]
    assert aoq(args + [a for o in TINY for a in ("--set", o)]) == 0
    text = out.read_text()
    # The table's means are the means of the seeds' comparison files (tiny test split: "full").
    rsums = [json.loads((tmp_path / "runs" / f"seed{s}" / "comparison" / "comparison.json").read_text())
             ["aoq"]["full"]["rsum"] for s in (0, 1)]
    row = next(line for line in text.splitlines() if line.startswith("| AdapOffQuin"))
    assert f"| {statistics.fmean(rsums):.1f} ± {statistics.stdev(rsums):.1f} |" in row
    for heading in ("## full test split, mean ± std over seeds", "## Training cost per batch",
                    "## Hardness diagnostics and training budget per method",
                    "## Mining diagnostics from the scene records (seed0)"):
        assert heading in text
    assert "aoq report --run --config configs/synthetic.yaml --seeds 0,1 --arms offtri,offquin,aoq" in text
    assert f"--out {out} --figures {figures}" in text  # not the defaults: the command names them
    assert "round-1 arms' curves" not in text  # only round-2 arms here
    for name in ("r1_curves.png", "rank_histogram.png"):
        assert (figures / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](figures/{name})" in text
    # Without --run it only reads the finished runs and writes the same tables.
    out.unlink()
    assert aoq(args[:1] + args[2:] + [a for o in TINY for a in ("--set", o)]) == 0
    assert row in out.read_text()


@pytest.mark.slow
def test_seed_records_stand_for_the_run_folders(tmp_path, capsys):
    """--records keeps each finished seed as a small record: with every run folder gone the page
    and its figures are rebuilt from the records alone, byte for byte; a record made under other
    settings does not stand for its seed."""
    import shutil

    runs, records = tmp_path / "runs", tmp_path / "records"
    out, figures = tmp_path / "docs" / "results.md", tmp_path / "docs" / "figures"
    args = ["report", "--synth", "--seeds", "0,1", "--arms", "aoq,aoq-fn-identity", "--runs", str(runs),
            "--data", str(tmp_path / "data"), "--train", "40", "--dev", "8", "--test", "8", "--out", str(out),
            "--figures", str(figures), "--records", str(records), *[a for o in TINY for a in ("--set", o)]]
    assert aoq([*args, "--run"]) == 0
    page, histogram = out.read_text(), (figures / "rank_histogram.png").read_bytes()
    assert sorted(p.name for p in records.iterdir()) == ["seed0.json", "seed1.json"]
    assert f"--records {records}" in page and f"the seed records in `{records}`" in page
    # the sections that read checkpoints, mined lists and scene records are in the records too
    for heading in ("## Mining diagnostics from the scene records (seed0)",
                    "## False negatives and near neighbours in the mined lists", "## Figures"):
        assert heading in page
    seed0 = json.loads((records / "seed0.json").read_text())["seed"]
    assert list(seed0["results"]) == ["baseline", "aoq", "aoq-fn-identity"]
    assert list(seed0["rank_histogram"]) == ["baseline", "aoq"] and seed0["cpus"]
    shutil.rmtree(runs)
    out.unlink()
    (figures / "rank_histogram.png").unlink()
    assert aoq(args) == 0
    assert out.read_text() == page and (figures / "rank_histogram.png").read_bytes() == histogram
    # a report of fewer methods reads the same records
    assert aoq([*args[:5], "aoq", *args[6:]]) == 0
    assert "aoq-fn-identity" not in out.read_text().split("Regenerate with:")[1].split("\n")[2]
    # other settings: another identity, so the records do not stand for the seeds
    capsys.readouterr()
    assert aoq([*args, "--set", "round2.alpha=0.5"]) == 2
    assert f"no finished runs in {runs / 'seed0'} (no record in {records})" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["karpathy", "precomp"])
def test_report_on_a_non_synthetic_fixture(tmp_path, fmt):
    from tests.fixtures import write_karpathy_fixture, write_precomp_fixture

    if fmt == "karpathy":
        path = write_karpathy_fixture(tmp_path / "k", "flickr30k", {"train": 16, "val": 4, "test": 4}, image_size=16)
        data = {"format": "karpathy", "path": str(path), "image_size": 16}
        model = {"image_encoder": "cnn", "cnn_width": 4}
    else:
        path = write_precomp_fixture(tmp_path / "p", {"train": 16, "dev": 4, "test": 4}, regions=3, dim=12)
        data, model = {"format": "precomp", "path": str(path)}, {"image_encoder": "vse"}
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "name": "fixture", "data": {**data, "name": f"fixture-{fmt}", "vocab_threshold": 1},
        "model": {**model, "embed_dim": 8, "word_dim": 8},
        "train": {"epochs": 2, "batch_size": 16},
        "mining": {"top_captions": 10, "top_images": 3},
        "round2": {"epochs": 2, "batch_size": 16, "h_t": 4, "h_i": 2},
    }))
    out = tmp_path / "results.md"
    sweep = ["--sweep", "shallow:round2.h_t=2,round2.h_i=1@offtri", "--sweep-seeds", "1"]
    assert aoq(["report", "--config", str(config), "--seeds", "0-1", "--arms", "aoq,goal-con-lin", "--run", "--runs",
                str(tmp_path / "runs"), "--out", str(out), "--figures", str(tmp_path / "fig"), *sweep]) == 0
    text = out.read_text()
    # the sweep point: its own baseline and arm, seed 1 only, its depth in the diagnostics
    point = json.loads((tmp_path / "runs" / "sweeps" / "shallow" / "seed1" / "comparison" / "comparison.json")
                       .read_text())
    gap = point["offtri"]["full"]["rsum"] - point["baseline"]["full"]["rsum"]
    row = next(line for line in text.splitlines() if line.startswith("| shallow |"))
    # two epochs and no patience: the cap stopped every run, and the row says so for both sides
    assert row.startswith(f"| shallow | `round2.h_t=2 round2.h_i=1` | OffTri (Eq. 3) † (baseline †) | "
                          f"{point['baseline']['full']['rsum']:.1f} |")
    assert f"| {gap:+.1f} (n=1) | — / — | 2 / 1 |" in row  # one seed: no interval; no labels: no NDCG
    assert not (tmp_path / "runs" / "sweeps" / "shallow" / "seed0").exists()
    assert text.startswith(f"# Results on `fixture-{fmt}`")
    diag = [json.loads((tmp_path / "runs" / f"seed{s}" / "mined" / "diagnostics.json").read_text()) for s in (0, 1)]
    mean_gap = statistics.fmean(d["image_anchors"]["on_minus_off"] for d in diag)
    diag_row = next(line for line in text.splitlines() if line.startswith("| AdapOffQuin") and "/" in line)
    assert f"{mean_gap:+.3f} / " in diag_row and "| 4 / 2 |" in diag_row
    # the interval of the paired differences
    res = [json.loads((tmp_path / "runs" / f"seed{s}" / "comparison" / "comparison.json").read_text()) for s in (0, 1)]
    diffs = [r["aoq"]["full"]["rsum"] - r["baseline"]["full"]["rsum"] for r in res]
    mean, low, high = paired_interval(diffs)
    assert f"{mean:+.1f} [{low:+.1f}, {high:+.1f}] (n=2)" in text
    assert "Mining diagnostics from the scene records" not in text
    # the GOAL round-1 arm: its own row and interval; the mined lists' diagnostics do not apply to it
    goal = [r["goal-con-lin"]["full"]["rsum"] - r["baseline"]["full"]["rsum"] for r in res]
    goal_rows = [line for line in text.splitlines() if line.startswith("| GOAL (con x lin)")]
    assert f"| {format_difference(goal)} |" in goal_rows[0]
    assert goal_rows[1].split(" | ")[1:6] == ["—"] * 5
    assert "Round-1 arms (GOAL (con x lin))" in text and "Label-wise retrieval" not in text
    assert "the round-1 arms' curves are round 1 too" in text


def test_within_family_table_gives_means_and_the_paired_interval():
    from aoq_train.report.tables import within_family_table

    def seed(i2t, t2i, colour):
        return {"all": {"i2t_r1": i2t, "t2i_r1": t2i}, "colour": {"i2t_r1": colour, "t2i_r1": 0.0}}

    scores = {"baseline": [seed(50.0, 40.0, 10.0), seed(60.0, 40.0, 30.0)],
              "aoq": [seed(55.0, 45.0, 20.0), seed(60.0, 46.0, 40.0)]}
    table = within_family_table(scores, {"baseline": "baseline", "aoq": "AdapOffQuin"}).splitlines()
    assert table[0] == "| method | all | colour | Δ all vs baseline [95% CI] |"
    assert table[2] == "| baseline | 95.0 ± 7.1 | 20.0 ± 14.1 | — |"  # sample std over seeds
    # paired differences +10 and +6: mean +8, sd 2.83, t(0.975, 1) = 12.71 -> half width 25.4
    assert table[3] == "| AdapOffQuin | 103.0 ± 4.2 | 30.0 ± 14.1 | +8.0 [-17.4, +33.4] (n=2) |"


def test_a_collapsed_sweep_point_is_reported_not_raised(tmp_path):
    from aoq_train.report.runs import ReportSetup, Sweep, collapsed_file, seed_config, sweep_setup
    from aoq_train.report.page import sweeps_table

    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"name": "x", "data": {"path": str(tmp_path / "data")}}))
    sweep = Sweep("shallow", ("round2.h_t=2",), ("only_offline",))
    setup = ReportSetup(config, (0,), ("aoq",), tmp_path / "runs", sweeps=(sweep,), sweep_seeds=(0,))
    run_dir = seed_config(sweep_setup(setup, sweep), 0).run_dir
    run_dir.mkdir(parents=True)
    collapsed_file(run_dir, "shallow").write_text(json.dumps(
        {"message": "round2 collapsed: dev rsum 9.76 at chance (chance 6.38) for 3 epoch(s). Try a lower lr"}))
    row = sweeps_table(setup).splitlines()[2]
    assert row == ("| shallow | `round2.h_t=2` | OnlyOffline (ablation) | — | collapsed | dev rsum 9.76 at chance "
                   "(chance 6.38) for 3 epoch(s) | | | | |")


def test_label_table_gives_percent_means_and_the_paired_ndcg_interval():
    from aoq_train.report.tables import label_table

    def result(i2t_ndcg, t2i_ndcg):
        return {"full": {"labels": {"k": 10, "i2t": {"map_at_r": 0.5, "ndcg_at_10": i2t_ndcg},
                                    "t2i": {"map_at_r": 0.25, "ndcg_at_10": t2i_ndcg}}}}

    history = {"baseline": [{"dev_rsum": 1.0, "epoch": 1, "stop": "plateau"}], "aoq": []}
    collected = {"methods": {"baseline": "Baseline", "aoq": "AOQ"}, "seeds": [
        {"results": {"baseline": result(0.5, 0.3), "aoq": result(0.6, 0.4)}, "history": history},
        {"results": {"baseline": result(0.7, 0.5), "aoq": result(0.7, 0.6)}, "history": history},
    ]}
    table = label_table(collected)
    assert "| Baseline | 50.00 ± 0.00 | 60.00 ± 14.14 | 25.00 ± 0.00 | 40.00 ± 14.14 | — |" in table
    # mean NDCG differences per seed: +10 and +5 -> mean +7.5, sd 3.54, half width 12.71 x 2.5 = 31.77
    aoq_row = table.splitlines()[-1]
    assert aoq_row.startswith("| AOQ | 50.00 ± 0.00 | 65.00 ± 7.07 |") and "+7.50 [-24.27, +39.27] (n=2)" in aoq_row
    collected["seeds"][0]["results"]["aoq"]["full"].pop("labels")
    assert label_table(collected) is None


def test_pairs_table_compares_any_two_methods_paired_by_seed():
    from aoq_train.report.tables import pairs_table

    def result(rsum, ndcg):
        return {"full": {"rsum": rsum, "labels": {"k": 10, "i2t": {"map_at_r": 0.5, "ndcg_at_10": ndcg},
                                                  "t2i": {"map_at_r": 0.5, "ndcg_at_10": ndcg}}}}

    history = {arm: [{"dev_rsum": 1.0, "epoch": 1, "stop": "plateau"}] for arm in ("baseline", "aoq", "fn")}
    history["fn"] = [{"dev_rsum": 1.0, "epoch": 60, "stop": "cap"}]  # a capped run is marked on both sides
    collected = {"methods": {"baseline": "Baseline", "aoq": "AOQ", "fn": "Filtered"}, "seeds": [
        {"results": {"baseline": result(100.0, 0.5), "aoq": result(104.0, 0.6), "fn": result(110.0, 0.6)},
         "history": history},
        {"results": {"baseline": result(90.0, 0.5), "aoq": result(91.0, 0.5), "fn": result(93.0, 0.7)},
         "history": history},
    ]}
    rows = pairs_table(collected, (("fn", "aoq"), ("aoq", "fn")), "full").splitlines()
    assert rows[0] == "| method | against | Δ rsum [95% CI] | Δ NDCG@10 (mean of both) [95% CI] |"
    # fn - aoq per seed: +6 and +2 -> mean +4, sd 2.83, half width 12.71 x 2 = 25.41; NDCG 0 and +20
    assert rows[2] == "| Filtered † | AOQ | +4.0 [-21.4, +29.4] (n=2) | +10.00 [-117.06, +137.06] (n=2) |"
    assert rows[3].startswith("| AOQ | Filtered † | -4.0 [-29.4, +21.4] (n=2) |")


def test_each_round2_arm_shows_the_diagnostics_of_its_own_lists():
    from aoq_train.report.tables import diagnostics_table

    def diag(rank, gap):
        side = {"in_batch_rank": {"median": 100.0}, "offline_rank": {"median": rank}, "on_minus_off": gap}
        return {"settings": {"h_t": 10, "h_i": 2}, "image_anchors": side, "caption_anchors": side,
                "premise_holds": True}

    history = [{"dev_rsum": 1.0, "epoch": 1, "train_time_s": 60.0, "val_time_s": 0.0, "stop": "plateau"}]
    arms = ("baseline", "aoq", "aoq-fn-identity")
    collected = {"methods": dict(zip(arms, ("Baseline", "AOQ", "Filtered"))), "seeds": [
        {"diagnostics": diag(5.0, -0.1), "arm_diagnostics": {"aoq": diag(5.0, -0.1), "aoq-fn-identity": diag(9.0, -0.02)},
         "history": {arm: history for arm in arms}}]}
    rows = diagnostics_table(collected).splitlines()[2:]
    assert rows[1] == "| AOQ | 10 / 2 | 100 / 100 | 5 / 5 | -0.100 / -0.100 | 1 of 1 | 1.0 | 1.0 | 1.0 | 0 of 1 |"
    assert rows[2] == "| Filtered | 10 / 2 | 100 / 100 | 9 / 9 | -0.020 / -0.020 | 1 of 1 | 1.0 | 1.0 | 1.0 | 0 of 1 |"


def test_a_seed_record_names_its_configuration_and_its_teachers_recipe(tmp_path):
    """A record stands for its seed only under the same seeded configuration (not the folder it
    ran in) and, with a teacher from outside the run, a teacher trained by the same configuration
    (its weights may differ: another CPU trains other weights from the same one)."""
    from aoq.io import write_manifest
    from aoq_train.report.records import load_record, save_record, seed_identity
    from aoq_train.report.runs import ReportSetup, seed_config

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "weights.bin").write_bytes(b"one")
    write_manifest(teacher, "checkpoint", {"name": "teacher", "out_dir": "runs/a"})
    setup = ReportSetup(Path("configs/synthetic.yaml"), arms=("aoq",), overrides=(f"mining.teacher={teacher}",))
    summary = {"results": {"baseline": {}, "aoq": {}}, "history": {}, "arm_diagnostics": {}, "rank_histogram": {}}
    identity = seed_identity(seed_config(setup, 0))
    save_record(tmp_path / "records", 0, identity, summary)
    assert load_record(tmp_path / "records", 0, identity, setup.methods) == summary
    moved = seed_identity(seed_config(replace(setup, runs_root=tmp_path / "elsewhere"), 0))
    assert moved == identity  # where the runs lie is not what they are
    assert seed_identity(seed_config(setup, 1)) != identity  # another seed
    (teacher / "weights.bin").write_bytes(b"two")  # retrained elsewhere, in another folder
    write_manifest(teacher, "checkpoint", {"name": "teacher", "out_dir": "runs/b"})
    assert load_record(tmp_path / "records", 0, seed_identity(seed_config(setup, 0)), setup.methods) == summary
    write_manifest(teacher, "checkpoint", {"name": "teacher", "out_dir": "runs/b", "margin": 0.1})  # another recipe
    assert load_record(tmp_path / "records", 0, seed_identity(seed_config(setup, 0)), setup.methods) is None
    # a record holding fewer methods than a report does not stand for the seed
    more = replace(setup, arms=("aoq", "offtri"))
    assert load_record(tmp_path / "records", 0, identity, more.methods) is None


def test_the_setup_names_the_teacher_weights_of_each_seed():
    from aoq_train.report.page import _teachers

    one, two = "03495c15" + "0" * 56, "ca04fe5a" + "1" * 56
    assert _teachers((0, 1), [{"teacher": one}, {"teacher": one}]) == "the same weights for every seed (content hash 03495c15)"
    mixed = _teachers((0, 1, 2, 3), [{"teacher": one}, {"teacher": one}, {"teacher": two}, {"teacher": two}])
    assert "(content hash: 03495c15 for seeds 0, 1; ca04fe5a for seeds 2, 3)" in mixed
    assert _teachers((4, 7), [{"teacher": two}, {"teacher": one}]).count(" for seed ") == 2
