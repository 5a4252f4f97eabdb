"""`aoq report`: the results page and its figures come from the run files, means over seeds."""

import json
import statistics

import pytest

from aoq.cli.main import main as aoq

TINY = ["model.embed_dim=16", "model.word_dim=8", "data.vocab_threshold=1",
        "train.epochs=2", "train.batch_size=16", "train.lr_decay_epochs=1",
        "round2.epochs=2", "round2.batch_size=16", "round2.lr_decay_epochs=1",
        "mining.top_captions=20", "mining.top_images=5", "round2.h_t=10", "round2.h_i=2"]


@pytest.mark.slow
def test_report_from_two_tiny_seeds(tmp_path):
    out, figures = tmp_path / "docs" / "results.md", tmp_path / "docs" / "figures"
    args = ["report", "--run", "--seeds", "0,1", "--runs", str(tmp_path / "runs"), "--data", str(tmp_path / "data"),
            "--train", "40", "--dev", "8", "--test", "8", "--out", str(out), "--figures", str(figures)]
    assert aoq(args + [a for o in TINY for a in ("--set", o)]) == 0
    text = out.read_text()
    # The table's means are the means of the seeds' comparison files (tiny test split: "full").
    rsums = [json.loads((tmp_path / "runs" / f"seed{s}" / "comparison" / "comparison.json").read_text())
             ["aoq"]["full"]["rsum"] for s in (0, 1)]
    row = next(line for line in text.splitlines() if line.startswith("| AdapOffQuin"))
    assert row.rstrip(" |").endswith(f"{statistics.fmean(rsums):.1f} ± {statistics.stdev(rsums):.1f}")
    for heading in ("## full test split, mean ± std over seeds", "## Training cost per batch",
                    "## Mining diagnostics (seed 0)"):
        assert heading in text
    for name in ("r1_curves.png", "rank_histogram.png"):
        assert (figures / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](figures/{name})" in text
    # Without --run it only reads the finished runs and writes the same tables.
    out.unlink()
    assert aoq(args[:1] + args[2:] + [a for o in TINY for a in ("--set", o)]) == 0
    assert row in out.read_text()
