"""Hashed, resumable stages: a stage is skipped when its inputs are unchanged and its output
artefact is still intact.

A stage's identity is the hash of its inputs (the config sections it reads plus the content
hashes of the upstream artefacts). ``pipeline.json`` in the run directory records, per stage,
that input hash and the content hash of the artefact produced. On a re-run a stage is skipped
only when both still match (the output's manifest is re-verified), so a changed config, a
changed upstream artefact, or a damaged output all cause the stage to run again. Stages that
were interrupted resume through their own mechanisms (trainer state, mining parts).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.pool import AsyncResult, Pool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aoq.io import ArtefactError, atomic_write_json, read_manifest, sha256_json

log = logging.getLogger(__name__)


@dataclass
class Stage:
    """One step of a pipeline.

    Attributes:
        name: unique stage name (``round1``, ``mine``, ...).
        output: the artefact directory it produces (must hold a ``manifest.json``).
        inputs: returns a JSON-able description of everything the output depends on; called
            when the stage is reached, so it may read the hashes of upstream outputs.
        run: builds the output; called with no arguments; must leave ``output`` complete.
        detached: does what ``run`` does before its work, in this process, and returns the work
            as a picklable callable, which :func:`run_stages` with ``workers > 1`` runs in another
            process beside the others once the stages in ``needs`` have finished. With
            ``workers > 1`` such a stage runs on one torch thread wherever it runs, as its result
            may follow the thread count (the order of a float reduction does).
        needs: the earlier stages whose outputs a detached stage reads.
    """

    name: str
    output: Path
    inputs: Callable[[], dict[str, Any]]
    run: Callable[[], None]
    detached: Callable[[], Callable[[], None]] | None = None
    needs: tuple[str, ...] = ()

    def input_hash(self) -> str:
        return sha256_json(self.inputs())


class StageLedger:
    """The ``pipeline.json`` record of finished stages, rewritten atomically after each one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        if path.is_file():
            try:
                self.entries = json.loads(path.read_text())["stages"]
            except (json.JSONDecodeError, KeyError, TypeError):
                log.warning("%s is unreadable; every stage will be checked again", path)

    def is_current(self, stage: Stage, input_hash: str) -> bool:
        """True when ``stage`` already ran with these inputs and its output is intact."""
        entry = self.entries.get(stage.name)
        if not entry or entry.get("input_hash") != input_hash:
            return False
        try:
            manifest = read_manifest(stage.output)
        except ArtefactError as exc:
            log.warning("stage %s: output damaged, running it again (%s)", stage.name, exc)
            return False
        return manifest.get("content_hash") == entry.get("output_hash")

    def record(self, stage: Stage, input_hash: str, seconds: float) -> str:
        output_hash = read_manifest(stage.output, verify=False)["content_hash"]
        self.entries[stage.name] = {
            "input_hash": input_hash,
            "output": str(stage.output),
            "output_hash": output_hash,
            "seconds": round(seconds, 2),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write_json(self.path, {"stages": self.entries})
        return output_hash


def _one_thread() -> None:
    """A stage process's torch pool: one thread, as the processes share the cores."""
    torch.set_num_threads(1)


def run_stages(stages: list[Stage], ledger: StageLedger, workers: int = 1) -> dict[str, str]:
    """Run the stages in order, skipping those that are current.

    With ``workers > 1`` a detachable stage (:attr:`Stage.detached`) that must run starts on one
    of ``workers - 1`` other processes of one thread each as soon as the stages it needs have
    finished and a process is free, while this process runs the others in order (on its torch
    threads less one per busy process, detachable ones on one). When this process reaches a stage
    still running elsewhere, it runs the later detachable stages that are ready itself before it
    waits, rather than idle while they wait for a free process. Each is recorded when the loop
    reaches it and it has finished, so the ledger reads as in a serial run. Their results are
    those of a serial run on one thread: a stage's output depends on its inputs and the thread
    count, not on the process that computed it.

    Returns:
        stage name -> ``"skipped"`` or ``"ran"``.

    Raises:
        ValueError: a stage needs one that does not come before it.
    """
    names = [stage.name for stage in stages]
    for position, stage in enumerate(stages):
        missing = set(stage.needs) - set(names[:position])
        if missing:
            raise ValueError(f"stage {stage.name} needs {sorted(missing)}, which do not come before it")
    status: dict[str, str] = {}
    elsewhere: dict[str, tuple[AsyncResult, float]] = {}
    ahead: dict[str, float] = {}  # detachable stages run here while waiting: their seconds
    judged: set[str] = set()  # detachable stages whose needs were met when last looked at
    pool: Pool | None = None
    threads = torch.get_num_threads()

    def busy() -> int:
        return sum(not result.ready() for result, _ in elsewhere.values())

    def claim(stage: Stage) -> bool:
        """Whether a later stage is detachable, newly ready (what it needs has finished) and must
        run; either way a ready one is not looked at again."""
        if stage.detached is None or stage.name in judged or not set(stage.needs) <= status.keys():
            return False
        judged.add(stage.name)
        return not ledger.is_current(stage, stage.input_hash())

    def start_ready(later: list[Stage]) -> None:
        nonlocal pool
        for stage in later:
            if busy() >= workers - 1:
                return
            if not claim(stage):
                continue
            if pool is None:
                # spawn: no fork of a process holding torch threads
                pool = multiprocessing.get_context("spawn").Pool(workers - 1, _one_thread)
            log.info("stage %s: running in another process -> %s", stage.name, stage.output)
            elsewhere[stage.name] = (pool.apply_async(stage.detached()), time.perf_counter())  # type: ignore[misc]

    def run_ahead(waiting: AsyncResult, later: list[Stage]) -> None:
        for stage in later:
            if waiting.ready():
                return
            if not claim(stage):
                continue
            log.info("stage %s: running ahead in this process -> %s", stage.name, stage.output)
            torch.set_num_threads(1)
            start = time.perf_counter()
            stage.run()
            ahead[stage.name] = time.perf_counter() - start

    finished = False
    try:
        for position, stage in enumerate(stages):
            if workers > 1:
                start_ready(stages[position + 1:])
            input_hash = stage.input_hash()
            if stage.name in ahead:
                ledger.record(stage, input_hash, ahead.pop(stage.name))
                status[stage.name] = "ran"
                continue
            if stage.name in elsewhere:
                result, start = elsewhere[stage.name]
                run_ahead(result, stages[position + 1:])
                result.get()
                ledger.record(stage, input_hash, time.perf_counter() - start)
                status[stage.name] = "ran"
                continue
            if ledger.is_current(stage, input_hash):
                log.info("stage %s: up to date, skipped (%s)", stage.name, stage.output)
                status[stage.name] = "skipped"
                continue
            log.info("stage %s: running -> %s", stage.name, stage.output)
            # this process shares the cores with the busy others: more threads would only wait on
            # each other (a multi-threaded pass is slowest when a core it waits for is busy elsewhere)
            torch.set_num_threads(1 if workers > 1 and stage.detached is not None else max(1, threads - busy()))
            start = time.perf_counter()
            stage.run()
            ledger.record(stage, input_hash, time.perf_counter() - start)
            status[stage.name] = "ran"
        finished = True
    finally:
        torch.set_num_threads(threads)
        if pool is not None:
            # after an error or an interrupt the other processes stop too (their training state
            # is saved as it goes, so a later run resumes them)
            if finished:
                pool.close()
            else:
                pool.terminate()
            pool.join()
    return status
