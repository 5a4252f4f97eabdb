"""`aoq pipeline` with the SCAN and BFAN configs: round 1 of the cross-attention baseline, mining by
a round-1 VSRN teacher (``aoq train`` with the embedding config), a round-2 (AOQ) epoch, evaluation."""

import json
from pathlib import Path

import pytest

from aoq.checkpoint import load_checkpoint
from aoq.mined import load_mined
from aoq_cli.main import main as aoq
from tests.fixtures import write_precomp_fixture

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["data.vocab_threshold=1", "data.max_dev_images=null", "train.epochs=1", "round2.epochs=1",
         "train.batch_size=8", "round2.batch_size=8", "train.num_workers=0", "round2.num_workers=0",
         "mining.top_captions=20", "mining.top_images=5", "round2.h_t=10", "round2.h_i=2"]

pytestmark = pytest.mark.slow


def _pipeline(config: str, data: Path, runs: Path, *extra: str) -> int:
    overrides = [f"data.path={data}", f"out_dir={runs}/{{name}}", *SMALL, *extra]
    return aoq(["pipeline", "--config", str(ROOT / "configs" / config), "--no-progress"]
               + [a for o in overrides for a in ("--set", o)])


def test_scan_and_bfan_configs_run_with_the_vsrn_teacher(tmp_path, capsys):
    data = write_precomp_fixture(tmp_path, splits={"train": 16, "dev": 4, "test": 4, "testall": 4},
                                 regions=6, dim=32, name="precomp")
    runs = tmp_path / "runs"
    teacher_run = runs / "teacher"
    overrides = [f"data.path={data}", *SMALL, "model.embed_dim=16", "model.word_dim=8", "model.gcn_layers=1"]
    assert aoq(["train", "--config", str(ROOT / "configs" / "coco_precomp.yaml"), "--out", str(teacher_run),
                "--no-progress"] + [a for o in overrides for a in ("--set", o)]) == 0
    teacher = teacher_run / "round1" / "best"
    for config, kind in (("coco_precomp_scan.yaml", "scan"), ("coco_precomp_bfan.yaml", "bfan")):
        capsys.readouterr()
        assert _pipeline(config, data, runs, f"mining.teacher={teacher}", "model.embed_dim=16",
                         "model.word_dim=8") == 0
        out = capsys.readouterr().out
        assert "| aoq | full (4 images) |" in out
        run = runs / f"coco_precomp_{kind}"
        ckpt = load_checkpoint(run / "models" / "aoq")
        assert ckpt.config.model.image_encoder == kind and ckpt.model.pairwise
        assert (ckpt.config.round2.alpha, ckpt.config.round2.beta, ckpt.config.round2.lr) == (0.3, 1.5, 0.0005)
        # the lists were mined by the teacher, not by the cross-attention baseline
        assert load_mined(run / "mined").checkpoint_hash == load_checkpoint(teacher).content_hash
    # aoq evaluate: the cross-attention model alone, and re-ranking the teacher's top 3
    assert aoq(["evaluate", "--checkpoint", str(run / "models" / "aoq"), "--split", "test"]) == 0
    assert "projected" in capsys.readouterr().out
    assert aoq(["evaluate", "--checkpoint", str(run / "models" / "aoq"), "--split", "test",
                "--shortlist-by", str(teacher), "--shortlist-n", "3", "--shortlist-cost"]) == 0
    out = capsys.readouterr().out
    assert "re-ranking the top 3 of the embedding model" in out and "the shortlist's cost" in out
    assert aoq(["evaluate", "--checkpoint", str(teacher), "--split", "test", "--shortlist-by", str(teacher)]) == 2
    # the paper's rows: two cross-attention checkpoints' scores averaged
    scan_aoq = runs / "coco_precomp_scan" / "models" / "aoq"
    assert aoq(["evaluate", "--checkpoint", str(run / "models" / "aoq"), "--split", "test", "--json",
                "--ensemble", str(scan_aoq)]) == 0
    assert json.loads(capsys.readouterr().out)["ensemble"] == load_checkpoint(scan_aoq).content_hash
    assert aoq(["evaluate", "--checkpoint", str(scan_aoq), "--split", "test", "--ensemble", str(teacher)]) == 2
    assert aoq(["evaluate", "--checkpoint", str(teacher), "--split", "test", "--ensemble", str(scan_aoq)]) == 2


def test_report_on_a_cross_attention_config_with_seed_records(tmp_path):
    """`aoq report` on the SCAN config (teacher-mined lists, filtered arm too): the test-split
    figures score every pair with the cross-attention model (it has no embedding), and each seed
    is kept as a record that rebuilds the page without its run folder."""
    import shutil

    data = write_precomp_fixture(tmp_path, splits={"train": 16, "dev": 4, "test": 4, "testall": 4},
                                 regions=6, dim=32, name="precomp")
    overrides = [f"data.path={data}", *SMALL, "model.embed_dim=16", "model.word_dim=8", "model.gcn_layers=1"]
    sets = [a for o in overrides for a in ("--set", o)]
    assert aoq(["train", "--config", str(ROOT / "configs" / "coco_precomp.yaml"), "--out", str(tmp_path / "teacher"),
                "--no-progress", *sets]) == 0
    runs, records, out = tmp_path / "runs", tmp_path / "records", tmp_path / "results.md"
    args = ["report", "--config", str(ROOT / "configs" / "coco_precomp_scan.yaml"), "--seeds", "0",
            "--arms", "aoq,aoq-fn-identity", "--runs", str(runs), "--records", str(records), "--out", str(out),
            "--figures", str(tmp_path / "fig"), "--workers", "2", *sets,
            "--set", f"mining.teacher={tmp_path / 'teacher' / 'round1' / 'best'}"]
    assert aoq([*args, "--run"]) == 0
    page = out.read_text()
    seed = json.loads((records / "seed0.json").read_text())["seed"]
    # every positive test pair (4 images x 5 captions) has its cross-retrieval rank in the histogram
    assert {arm: sum(h.values()) for arm, h in seed["rank_histogram"].items()} == {"baseline": 20, "aoq": 20}
    evaluation = json.loads((runs / "seed0" / "evaluation" / "aoq" / "result.json").read_text())
    assert seed["results"]["aoq"]["full"]["rsum"] == evaluation["full"]["rsum"]
    assert "## False negatives and near neighbours in the mined lists" in page
    teacher = load_checkpoint(tmp_path / "teacher" / "round1" / "best").content_hash
    assert seed["teacher"] == teacher
    assert f"by a teacher from outside the runs (`{tmp_path / 'teacher' / 'round1' / 'best'}`; " in page
    assert f"the same weights for every seed (content hash {teacher[:8]})" in page
    assert f"--workers 2 --records {records}" in page  # the command names the processes (one thread each)
    shutil.rmtree(runs)
    assert aoq(args) == 0 and out.read_text() == page
