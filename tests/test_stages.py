"""Hashed stages: skipped when unchanged, re-run when inputs or outputs change; detached stages in
another process."""

import json

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


def _build_in_child(out, text):
    """A detached stage's work (module level: it is pickled into the other process)."""
    import os

    out.mkdir(exist_ok=True)
    (out / "x.txt").write_text(f"{text} {os.getpid()}")
    write_manifest(out, "test", {})


def _fail_in_child():
    raise RuntimeError("the other process failed")


def test_detached_stages_run_in_another_process_and_are_recorded(tmp_path):
    import functools
    import os

    calls = []
    side = tmp_path / "side"
    prepared = []

    def detached():
        prepared.append(os.getpid())  # the preparation runs here
        return functools.partial(_build_in_child, side, "side")

    stages = [_stage(tmp_path, calls, "first"),
              Stage("side", side, lambda: {"side": 1}, lambda: calls.append("side in this process"), detached),
              _stage(tmp_path, calls, "last")]
    ledger_path = tmp_path / "pipeline.json"
    assert run_stages(stages, StageLedger(ledger_path), workers=2) == {"first": "ran", "side": "ran", "last": "ran"}
    assert calls == ["first", "last"] and prepared == [os.getpid()]
    text, pid = (side / "x.txt").read_text().split()
    assert text == "side" and int(pid) != os.getpid()
    assert set(json.loads(ledger_path.read_text())["stages"]) == {"first", "side", "last"}
    assert run_stages(stages, StageLedger(ledger_path), workers=2) == dict.fromkeys(["first", "side", "last"], "skipped")
    # one process: the same stage runs in order, in this process
    assert run_stages(stages, StageLedger(tmp_path / "serial.json")) == {"first": "ran", "side": "ran", "last": "ran"}
    assert calls[-3:] == ["first", "side in this process", "last"]


def test_a_failing_detached_stage_fails_the_run(tmp_path):
    import pytest

    stages = [_stage(tmp_path, [], "first"),
              Stage("side", tmp_path / "side", lambda: {}, lambda: None, lambda: _fail_in_child)]
    with pytest.raises(RuntimeError, match="the other process failed"):
        run_stages(stages, StageLedger(tmp_path / "pipeline.json"), workers=2)
    assert set(json.loads((tmp_path / "pipeline.json").read_text())["stages"]) == {"first"}


def _copy_in_child(source, out):
    """A detached stage that reads an earlier stage's output (module level, for pickling)."""
    out.mkdir(exist_ok=True)
    (out / "x.txt").write_text((source / "x.txt").read_text())
    write_manifest(out, "test", {})


def test_a_detached_stage_starts_when_its_needs_are_done_and_runs_beside_the_loop(tmp_path):
    """``side`` reads ``up``'s output, so it may not start before ``up``; once started it runs
    while this process is still in ``wait``, which only returns when ``side`` has written its
    output: run one after the other, ``wait`` would time out."""
    import functools
    import time

    calls = []
    up, side, waited = tmp_path / "up", tmp_path / "side", tmp_path / "wait"

    def wait():
        deadline = time.monotonic() + 60
        while not (side / "manifest.json").is_file():
            assert time.monotonic() < deadline, "the detached stage did not run beside this one"
            time.sleep(0.05)
        waited.mkdir()
        write_manifest(waited, "test", {})

    stages = [_stage(tmp_path, calls, "up", param=7),
              Stage("wait", waited, lambda: {}, wait),
              Stage("side", side, lambda: {"up": (up / "x.txt").read_text()}, lambda: None,
                    lambda: functools.partial(_copy_in_child, up, side), needs=("up",))]
    status = run_stages(stages, StageLedger(tmp_path / "pipeline.json"), workers=2)
    assert status == {"up": "ran", "wait": "ran", "side": "ran"}
    assert (side / "x.txt").read_text() == "up7"


def test_a_stage_may_only_need_an_earlier_one(tmp_path):
    import pytest

    stages = [Stage("first", tmp_path / "a", lambda: {}, lambda: None, needs=("later",)),
              _stage(tmp_path, [], "later")]
    with pytest.raises(ValueError, match=r"stage first needs \['later'\], which do not come before it"):
        run_stages(stages, StageLedger(tmp_path / "pipeline.json"))


def _wait_for_in_child(other, out):
    """A detached stage that finishes only once ``other`` has written its output (module level)."""
    import time

    deadline = time.monotonic() + 60
    while not (other / "manifest.json").is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{other} was not written while this stage ran")
        time.sleep(0.05)
    out.mkdir(exist_ok=True)
    write_manifest(out, "test", {})


def test_waiting_for_a_stage_elsewhere_this_process_runs_the_ready_detachable_ones(tmp_path):
    """``slow`` starts in the other process (ready first) and only finishes once ``side`` is
    done; ``side`` is ready once ``mid`` is: with the other process busy, this process must run
    ``side`` itself instead of waiting for ``slow`` (which would time out)."""
    import functools

    calls = []
    slow, side = tmp_path / "slow", tmp_path / "side"

    def side_here():
        calls.append("side in this process")
        side.mkdir()
        write_manifest(side, "test", {})

    stages = [_stage(tmp_path, calls, "up"), _stage(tmp_path, calls, "mid"),
              Stage("slow", slow, lambda: {}, lambda: None,
                    lambda: functools.partial(_wait_for_in_child, side, slow), needs=("up",)),
              Stage("side", side, lambda: {}, side_here, lambda: functools.partial(_build_in_child, side, "x"),
                    needs=("mid",)),
              _stage(tmp_path, calls, "last")]
    ledger_path = tmp_path / "pipeline.json"
    status = run_stages(stages, StageLedger(ledger_path), workers=2)
    assert status == dict.fromkeys(["up", "mid", "slow", "side", "last"], "ran")
    assert calls == ["up", "mid", "side in this process", "last"]
    assert set(json.loads(ledger_path.read_text())["stages"]) == {"up", "mid", "slow", "side", "last"}
