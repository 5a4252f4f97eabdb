"""`aoq regimes`: the cells' sets, the predictor correlations, the advice line, a toy map end to end."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from aoq.device import cpu_model
from aoq.io import read_manifest
from aoq_train.regimes.advice import advice_line
from aoq_train.regimes.grid import Cell, data_seed, ensure_cell_data, grid_cells, pilot_cells
from aoq_train.regimes.predictors import correlations, spearman, spearman_interval

TINY_SIZES = {"train": 12, "dev": 4, "test": 4}


def test_cells_and_seeds() -> None:
    cell = Cell.of(family_share=0.9, caption_detail=0.2)
    assert cell.name == "caption_detail=0.2,family_share=0.9"
    assert cell.params().family_share == 0.9 and cell.params().caption_detail == 0.2
    assert Cell.of(train=1000).sizes()["train"] == 1000 and Cell.of(noise=0.3).value("train") == 2000
    # the seed depends on the cell and the replicate only: the same in every process, distinct otherwise
    assert data_seed(cell, 0) == data_seed(Cell.of(caption_detail=0.2, family_share=0.9), 0)
    assert len({data_seed(c, r) for c in (cell, Cell.of(family_share=0.1)) for r in range(5)}) == 10
    assert len(grid_cells("family_share", "noise")) == 9
    assert len(pilot_cells({"noise": (0.3, 1.0), "train": (10, 20)})) == 4
    with pytest.raises(ValueError, match="unknown knob"):
        Cell.of(colour=3)
    for cell in pilot_cells():  # every default level is one the generator accepts
        cell.params()
        assert cell.sizes()["train"] >= 1


def test_cell_generation_is_deterministic_per_seed(tmp_path: Path) -> None:
    cell = Cell.of(family_share=0.9, max_variants=2)
    a = ensure_cell_data(tmp_path / "a", cell, 0, TINY_SIZES, progress=False)
    b = ensure_cell_data(tmp_path / "b", cell, 0, TINY_SIZES, progress=False)
    c = ensure_cell_data(tmp_path / "a", cell, 1, TINY_SIZES, progress=False)
    digest = [read_manifest(p, kind=None, verify=False)["content_hash"] for p in (a, b, c)]
    assert digest[0] == digest[1] and digest[0] != digest[2]
    assert (a / "precomp" / "train_caps.txt").read_bytes() == (b / "precomp" / "train_caps.txt").read_bytes()
    params = read_manifest(a, kind=None, verify=False)["config"]["params"]
    assert params["family_share"] == 0.9 and params["max_variants"] == 2


def test_correlation_recovers_a_planted_monotone_relation() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, 12)
    gain = np.exp(3 * x)  # monotone, far from linear: Spearman sees 1
    assert spearman(x, gain) == pytest.approx(1.0)
    rho, low, high = spearman_interval(x, -gain)
    assert rho == pytest.approx(-1.0) and high < 0
    noise = rng.normal(size=12)
    rho, low, high = spearman_interval(x, noise)
    assert low < 0 < high  # unrelated: the interval straddles 0
    cells = [{"gain": float(g), "predictors": {"s_on_minus_off": float(v), "family_share": 0.5,
                                               "near_neighbours": None}} for v, g in zip(x, gain)]
    got = correlations(cells)
    assert got["s_on_minus_off"]["reliable"] and got["s_on_minus_off"]["cells"] == 12
    assert not got["family_share"]["reliable"]  # constant: no correlation
    assert "near_neighbours" not in got  # not measured
    few = correlations(cells[:8])  # perfectly monotone, but too few cells for a bootstrap over cells
    assert few["s_on_minus_off"]["rho"] == pytest.approx(1.0) and not few["s_on_minus_off"]["reliable"]


def _diagnostics(gap: float) -> dict:
    direction = {"on_minus_off": gap, "offline_rank": {"median": 10.0}, "in_batch_rank": {"median": 20.0}}
    return {"image_anchors": direction, "caption_anchors": direction,
            "shares": {"false_negatives": 0.1, "near_neighbours": 0.3}}


def test_advice_line() -> None:
    assert "no reliable predictor" in advice_line(_diagnostics(-0.05), None)
    cells = [{"cell": f"c{k}", "gain": float(k), "predictors": {"s_on_minus_off": 0.0 - 0.01 * k}} for k in range(6)]
    reliable = {"page": "docs/results-regimes.md", "cells": cells,
                "correlations": {"s_on_minus_off": {"rho": -1.0, "low": -1.0, "high": -0.8, "reliable": True},
                                 "round1_dev_rsum": {"rho": 0.9, "low": 0.5, "high": 1.0, "reliable": True}}}
    line = advice_line(_diagnostics(-0.04), reliable)
    # round-1 dev rsum is not in the mining diagnostics: the advice uses the reliable one it can measure
    assert line.startswith("advice: S_on − S_off predicts") and "[-1.00, -0.80], 6 cells" in line
    assert "nearest cells gained +4.0 rsum" in line  # c3, c4, c5: -0.03, -0.04, -0.05
    assert "extrapolation" not in line
    beyond = advice_line(_diagnostics(-0.2), reliable)
    assert "here it is -0.200 (outside the map's -0.050 to +0.000: an extrapolation)" in beyond
    reliable["correlations"]["s_on_minus_off"]["reliable"] = False
    assert "no reliable predictor" in advice_line(_diagnostics(-0.04), reliable)


TOY_CONFIG = {
    "name": "toy",
    "data": {"format": "precomp", "path": "unused", "name": "synth", "vocab_threshold": 1},
    "model": {"image_encoder": "vse", "embed_dim": 16, "word_dim": 8},
    "train": {"epochs": 2, "batch_size": 16, "lr": 0.002, "lr_decay_epochs": 1, "save_every_steps": 50},
    "mining": {"top_captions": 20, "top_images": 5},
    "round2": {"epochs": 2, "batch_size": 16, "lr": 0.002, "lr_decay_epochs": 1, "h_t": 10, "h_i": 2,
               "save_every_steps": 50},
}


@pytest.mark.slow
def test_two_cell_toy_map_end_to_end(tmp_path: Path, capsys) -> None:
    """Two cells x two replicates on tiny sets, given knobs (no pilot): every arm runs, the page
    and its evidence are written from the runs, and a second call only reads them."""
    from aoq_cli.main import main as aoq

    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(TOY_CONFIG))
    out = tmp_path / "results-regimes.md"
    args = ["regimes", "--config", str(config), "--root", str(tmp_path / "map"), "--replicates", "0,1",
            "--knobs", "family_share,noise", "--levels", "family_share=0.1,0.9", "--levels", "noise=1.0",
            "--train", "30", "--dev", "6", "--test", "6", "--out", str(out), "--no-progress"]
    assert aoq([*args, "--run"]) == 0
    page = out.read_text()
    evidence = json.loads(out.with_suffix(".json").read_text())
    assert [c["cell"] for c in evidence["cells"]] == ["family_share=0.1,noise=1.0", "family_share=0.9,noise=1.0"]
    assert all(c["runs"] == 2 for c in evidence["cells"]) and evidence["correlations"] == {}  # 2 cells: too few
    assert "aoq regimes --run --config" in page and "## AOQ − GOAL cir x con (Δ rsum)" in page
    assert "| family_share \\ noise | 1.0 |" in page and "Too few cells" in page
    assert f"Ran on: {cpu_model()} (4 jobs);" in page  # the CPU each job ran on, noted in its run folder
    for arm in ("aoq", "aoq-fn-identity", "goal-cir-con"):
        assert (tmp_path / "map" / "runs" / "family_share=0.9,noise=1.0" / "seed1" / "evaluation" / arm
                / "result.json").is_file()
    first = out.read_text()
    assert aoq(args) == 0 and out.read_text() == first  # read only: the same page

    # each finished job left a record, which stands for its run: without the runs, the same page,
    # and a run finds nothing to do
    records = sorted(p.relative_to(tmp_path / "results-regimes-jobs").as_posix()
                     for p in (tmp_path / "results-regimes-jobs").rglob("*.json"))
    assert records == [f"family_share={f},noise=1.0/seed{r}.json" for f in (0.1, 0.9) for r in (0, 1)]
    shutil.rmtree(tmp_path / "map")
    out.unlink()
    assert aoq([*args, "--run"]) == 0 and out.read_text() == first
    assert not (tmp_path / "map" / "runs").exists()
    # a record made under other settings is not this job's: it runs again
    record = tmp_path / "results-regimes-jobs" / "family_share=0.1,noise=1.0" / "seed0.json"
    stale = json.loads(record.read_text())
    stale["identity"]["config"]["train"]["epochs"] = 3
    stale["identity_hash"] = "0" * 64
    record.write_text(json.dumps(stale))
    assert aoq(args) == 1 and "1 of 4 runs not finished" in capsys.readouterr().out


def test_pilot_picks_the_two_knobs_that_move_the_gain_most() -> None:
    from aoq_train.regimes.runs import MapSetup, pick_knobs, pilot_setup, pilot_summary

    levels = {"noise": (0.3, 1.8), "family_share": (0.1, 0.9), "max_variants": (1, 6)}
    pilot = MapSetup(Path("cfg"), tuple(pilot_cells(levels)), (0,))
    gain = {"noise=0.3": 1.0, "noise=1.8": 1.5, "family_share=0.1": -2.0, "family_share=0.9": 4.0,
            "max_variants=1": 0.0, "max_variants=6": 3.0}
    jobs = {name: [{"rsum": {"baseline": 100.0, "aoq": 100.0 + g}, "minutes": 2.0}] for name, g in gain.items()}
    summary = pilot_summary(pilot, jobs)
    assert summary["knobs"]["family_share"] == {"levels": [(0.1, -2.0), (0.9, 4.0)], "range": 6.0}
    assert summary["minutes"] == 12.0
    assert pick_knobs(summary) == ("family_share", "max_variants")
    full = MapSetup(Path("cfg"), (), (3, 4))
    assert (pilot_setup(full, pilot.cells).arms, pilot_setup(full, pilot.cells).replicates) == (("aoq",), (3,))
    with pytest.raises(ValueError, match="at least two knobs"):
        pick_knobs(pilot_summary(pilot, {**{n: [] for n in gain}, "noise=0.3": jobs["noise=0.3"]}))


def test_the_machines_a_map_ran_on_are_counted_per_job(tmp_path: Path) -> None:
    from aoq_train.report.runs import machine_counts, machines_of, note_machine

    assert machines_of(tmp_path) == []
    note_machine(tmp_path)
    note_machine(tmp_path)  # resumed on the same CPU: named once
    assert machines_of(tmp_path) == [cpu_model()]
    jobs = [{"cpus": ["Zen 5"]}, {"cpus": ["Xeon"]}, {"cpus": ["Xeon"]}, {}, {"cpus": ["Xeon", "Zen 5"]}]
    assert machine_counts(jobs) == {"Xeon": 2, "Zen 5": 1, "not noted": 1, "Xeon then Zen 5": 1}


def test_workers_share_the_jobs_without_overlap() -> None:
    from aoq_train.regimes.runs import MapSetup, parse_worker

    config = Path(__file__).resolve().parents[1] / "configs" / "synthetic.yaml"
    setup = MapSetup(config, tuple(grid_cells("noise", "train")), (0, 1, 2))
    jobs = setup.jobs()
    assert len(jobs) == 27 and jobs[:9] == [(c, 0) for c in setup.cells]  # replicates outermost
    k, n = parse_worker("1/2")
    mine = [j for i, j in enumerate(jobs) if i % n == k]
    assert len(mine) == 13 and jobs[1] in mine and jobs[0] not in mine
    for bad in ("2/2", "x", "1/0"):
        with pytest.raises(ValueError):
            parse_worker(bad)
    # every job its own folders: its set and its run
    folders = {setup.run_dir(c, r) for c, r in jobs}
    assert len(folders) == 27 and setup.run_dir(*jobs[0]).name == "seed0"


def test_predictor_values_from_the_mining_diagnostics() -> None:
    from aoq_train.regimes.predictors import predictor_values

    d = _diagnostics(-0.02)
    d["caption_anchors"] = {"on_minus_off": -0.04, "offline_rank": {"median": 30.0}, "in_batch_rank": {"median": 10.0}}
    got = predictor_values(d, 250.0, 0.5)
    assert got == pytest.approx({"s_on_minus_off": -0.03, "rank_ratio": 1.75, "false_negatives": 0.1,
                                 "near_neighbours": 0.3, "round1_dev_rsum": 250.0, "family_share": 0.5})
    assert predictor_values({**d, "shares": None})["false_negatives"] is None


def test_workers_share_the_cores_out_unless_threads_are_given() -> None:
    from aoq_cli.regimes import worker_threads

    assert worker_threads(None, (0, 2), 2) == 1 and worker_threads(None, (1, 2), 16) == 8
    assert worker_threads(None, (0, 4), 2) == 1  # never zero threads
    assert worker_threads(None, (0, 1), 2) is None  # one process: torch's own choice
    assert worker_threads(3, (0, 2), 2) == 3


def test_a_job_identity_names_what_the_results_depend_on_not_where_they_lie(tmp_path: Path) -> None:
    from aoq_train.regimes.records import load_record, save_record
    from aoq_train.regimes.runs import MapSetup

    config = Path(__file__).resolve().parents[1] / "configs" / "synthetic.yaml"
    cell = Cell.of(noise=0.3)
    here, there = MapSetup(config, (cell,), (0,), root=tmp_path / "a"), MapSetup(config, (cell,), (0,), root=tmp_path / "b")
    assert here.identity(cell, 0) == there.identity(cell, 0)  # another folder: the same job
    assert here.identity(cell, 0) != here.identity(cell, 1)
    assert here.identity(cell, 0) != MapSetup(config, (cell,), (0,), arms=("aoq",)).identity(cell, 0)
    assert here.identity(cell, 0) != MapSetup(config, (cell,), (0,), overrides=("train.margin=0.1",)).identity(cell, 0)
    job = {"cell": cell.name, "rsum": {"baseline": 400.5}}
    save_record(tmp_path / "jobs", cell, 0, here.identity(cell, 0), job)
    assert load_record(tmp_path / "jobs", cell, 0, there.identity(cell, 0)) == job
    assert load_record(tmp_path / "jobs", cell, 0, here.identity(cell, 1)) is None
    assert load_record(tmp_path / "nowhere", cell, 0, here.identity(cell, 0)) is None


def test_the_pilot_measures_what_the_seed_alone_moves() -> None:
    """The pilot cells at their knob's default level are one setting with different set seeds:
    their spread is the yardstick the page holds each knob's range against."""
    from aoq_train.regimes.page import pilot_section
    from aoq_train.regimes.runs import MapSetup, pick_knobs, pilot_summary

    levels = {"noise": (0.3, 1.0), "family_share": (0.5, 0.9), "train": (1000, 2000)}
    pilot = MapSetup(Path("cfg"), tuple(pilot_cells(levels)), (0,))
    gain = {"noise=0.3": 5.0, "noise=1.0": -1.0, "family_share=0.5": 2.0, "family_share=0.9": 1.0,
            "train=1000": 9.0, "train=2000": 0.5}
    jobs = {name: [{"rsum": {"baseline": 100.0, "aoq": 100.0 + g}, "minutes": 1.0}] for name, g in gain.items()}
    summary = pilot_summary(pilot, jobs)
    # defaults: noise 1.0, family_share 0.5, train 2000 (the map's training size)
    assert summary["defaults"] == {"differences": [-1.0, 2.0, 0.5], "range": 3.0}
    knobs = pick_knobs(summary)
    assert knobs == ("train", "noise")
    text = "\n".join(pilot_section(summary, knobs))
    assert "runs from -1.0 to +2.0 (range 3.0)" in text
    assert "not told apart from the seed by this pilot: family_share." in text
    assert "Both picked knobs' ranges are above it." in text
    # another training size for the map: its default level follows
    other = pilot_summary(MapSetup(Path("cfg"), pilot.cells, (0,), sizes={"train": 1000, "dev": 5, "test": 5}), jobs)
    assert other["defaults"]["differences"] == [-1.0, 2.0, 9.0]


def test_a_reliable_predictor_with_one_sign_everywhere_orders_losses_not_regimes() -> None:
    from aoq_train.regimes.page import predictor_section

    corr = {"near_neighbours": {"rho": 0.73, "low": 0.16, "high": 1.0, "reliable": True}}
    losing = predictor_section(corr, [-0.6, -9.4, -3.0])
    assert losing[2] == "| near-neighbour share | +0.73 | [+0.16, +1.00] | yes |"
    assert losing[-1].endswith("Every cell's mean difference is below the baseline (-9.4 to -0.6): on this map the "
                               "predictors order how much AOQ loses, not where it wins.")
    mixed = predictor_section(corr, [-0.6, 2.0, -3.0])
    assert mixed[-1].startswith("A user can read **near-neighbour share**") and "Every cell" not in mixed[-1]
    corr["near_neighbours"]["reliable"] = False
    assert "every interval over the 9 cells includes 0" in predictor_section(corr, [-1.0] * 9)[-1]
    assert "3 cells are fewer than the 9" in predictor_section(corr, [-1.0] * 3)[-1]
