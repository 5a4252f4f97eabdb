"""Hashed stages: skipped when unchanged, re-run when inputs or outputs change."""

from aoq.io import write_manifest
from aoq_train.pipeline.stages import Stage, StageLedger, run_stages


def _stage(tmp_path, calls, name="a", param=1):
    out = tmp_path / name

    def run():
        calls.append(name)
        out.mkdir(exist_ok=True)
        (out / "x.txt").write_text(f"{name}{param}")
        write_manifest(out, "test", {"param": param})

    return Stage(name, out, lambda: {"param": param}, run)


def test_skips_unchanged_and_reruns_on_change(tmp_path):
    calls = []
    ledger_path = tmp_path / "pipeline.json"
    assert run_stages([_stage(tmp_path, calls)], StageLedger(ledger_path)) == {"a": "ran"}
    assert run_stages([_stage(tmp_path, calls)], StageLedger(ledger_path)) == {"a": "skipped"}
    assert run_stages([_stage(tmp_path, calls, param=2)], StageLedger(ledger_path)) == {"a": "ran"}
    assert calls == ["a", "a"]


def test_damaged_output_reruns(tmp_path):
    calls = []
    ledger_path = tmp_path / "pipeline.json"
    run_stages([_stage(tmp_path, calls)], StageLedger(ledger_path))
    (tmp_path / "a" / "x.txt").write_text("tampered")
    assert run_stages([_stage(tmp_path, calls)], StageLedger(ledger_path)) == {"a": "ran"}


def test_downstream_sees_upstream_hash(tmp_path):
    calls = []
    ledger_path = tmp_path / "pipeline.json"
    down_out = tmp_path / "down"

    def down_run():
        calls.append("down")
        down_out.mkdir(exist_ok=True)
        write_manifest(down_out, "test", {})

    def down(param):
        return [
            _stage(tmp_path, calls, "up", param),
            Stage("down", down_out, lambda: {"up": (tmp_path / "up" / "x.txt").read_text()}, down_run),
        ]

    assert run_stages(down(1), StageLedger(ledger_path)) == {"up": "ran", "down": "ran"}
    assert run_stages(down(1), StageLedger(ledger_path)) == {"up": "skipped", "down": "skipped"}
    assert run_stages(down(2), StageLedger(ledger_path)) == {"up": "ran", "down": "ran"}
