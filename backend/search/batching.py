"""Micro-batching of concurrent queries (docs/serving.md, Micro-batching): text encodings on one
model and FAISS searches on one index.

Jobs that meet on the same target (a model's query encoder, an index) are run together. A job
that arrives while no batch runs on its target runs at once (a job alone never waits); jobs
arriving while a batch runs wait, and when a batch ends the oldest of them leads the next one
with the others (the running batch is the collection window: nothing waits on a timer). Where a
target allows more batches at once (:data:`ENCODE_LEADERS`), a batch beside a running one starts,
or follows one that ends, only with half a batch waiting; fewer wait for the running batch. A
batch holds at most :data:`MAX_BATCH` jobs and is run in groups of one key (the ``k`` of a
search, the token bucket of a text), so every job gets exactly the answer it gets alone (tested
in tests/test_search_batching.py):

- a text is encoded by :mod:`aoq.models.invariant`, whose products have a shape fixed by the
  text's own bucket;
- a flat index on the CPU is searched by :mod:`aoq_serve.index.scan`, whose scores do not depend
  on the batch; batches of a FAISS index stay below ``distance_compute_blas_threshold`` queries
  (:func:`search_limit`), under which FAISS's flat scan treats each query of a call on its own (a
  BLAS product above it rounds differently); HNSW and IVF search every query independently.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faiss
import numpy as np
import torch

from aoq.models.invariant import bucket_length, encode_bucket
from aoq_serve.index import faiss_index
from aoq_serve.index.scan import FlatScan

#: the most jobs one batch holds.
MAX_BATCH = 16
#: searches that may run at once on one index: one. A flat index is scanned once per batch
#: (:mod:`aoq_serve.index.scan`), so a second leader would scan the gallery again for the
#: stragglers of a batch (measured in docs/serving.md).
SEARCH_LEADERS = 1
#: encoding batches that may run at once on one model: one per core this process may use. A
#: batch beside a running one needs half a batch waiting (:meth:`_Batcher._worth_a_batch`): a
#: cheap encoder then keeps to one large batch at a time, an expensive one (MiniLM) gets both
#: cores instead of all clients moving in one batch in lockstep (measured in docs/serving.md).
ENCODE_LEADERS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)

_state = {"enabled": True}
_attach = threading.Lock()
#: each target's batcher, dropped with the target when a reload replaces it.
_batchers: weakref.WeakKeyDictionary[Any, _Batcher] = weakref.WeakKeyDictionary()

#: runs one group of a batch: the jobs' payloads (all of one key) -> one result each.
Work = Callable[[list[Any], Hashable], Sequence[Any]]


def set_batching(enabled: bool) -> None:
    """Switch micro-batching on or off for the whole service (``AOQ_BATCHING``)."""
    _state["enabled"] = enabled


def search_limit(index: faiss_index.SearchIndex) -> int:
    """The most queries one search of ``index`` may hold and still give each query its answer alone."""
    if isinstance(index, FlatScan):
        return MAX_BATCH
    return max(1, min(MAX_BATCH, faiss.cvar.distance_compute_blas_threshold - 1))


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class _Job:
    payload: Any
    key: Hashable
    #: released when the job is answered, or when a finishing leader hands it its slot; a lock
    #: rather than an ``Event``: releasing it is one C call, where ``Event.set`` runs a Python
    #: condition under the GIL for every answer.
    wake: threading.Lock = field(default_factory=_held_lock)
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class _Batcher:
    """The jobs waiting on one target and how many batches run on it (it holds no reference to
    the target, so that the target can go when a reload replaces it). Each waiting job sleeps on
    its own lock: an arrival wakes nobody, a finished batch wakes its own jobs and the one job
    that leads next."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    waiting: list[_Job] = field(default_factory=list)
    running: int = 0

    def _worth_a_batch(self, limit: int, beside: int) -> bool:
        """Whether the waiting jobs start a batch now, ``beside`` other batches running (under
        ``self.lock``). With none running, any waiting job does: none waits on a batch that is
        gone. Beside a running batch only half a batch is worth a core; fewer wait and go with
        the next batch, since small batches side by side cost an expensive encoder the most per
        text (docs/serving.md, Micro-batching)."""
        return len(self.waiting) >= (1 if beside == 0 else max(1, limit // 2))

    def submit(self, work: Work, job: _Job, limit: int, leaders: int) -> Any:
        starter = None
        with self.lock:
            self.waiting.append(job)  # with no batch running nothing else waits: the job leads
            if self.running < leaders and self._worth_a_batch(limit, beside=self.running):
                starter = self.waiting.pop(0)
                self.running += 1
        lead = starter is job
        if starter is not None and not lead:
            starter.wake.release()
        if not lead:
            job.wake.acquire()
        if not job.done:  # leading: a free slot, or one handed over by a finished batch
            if lead:
                # Let threads that are already running reach the queue first (queries answered
                # by one batch of the previous step arrive together); alone, nothing runs and
                # this returns at once.
                time.sleep(0)
            with self.lock:
                batch = [job, *self.waiting[:limit - 1]]
                del self.waiting[:limit - 1]
            try:
                _run(work, batch)
            finally:
                with self.lock:
                    worth = self._worth_a_batch(limit, beside=self.running - 1)
                    successor = self.waiting.pop(0) if worth else None
                    if successor is None:
                        self.running -= 1
                for answered in batch[1:]:
                    if not answered.done:  # the batch was interrupted (not by an Exception)
                        answered.error, answered.done = RuntimeError("the batch was interrupted"), True
                    answered.wake.release()
                if successor is not None:
                    successor.wake.release()
        if job.error is not None:
            raise job.error
        return job.result


def _run(work: Work, batch: list[_Job]) -> None:
    """Run a batch one key at a time and hand every job its answer or the error."""
    for key in dict.fromkeys(job.key for job in batch):
        group = [job for job in batch if job.key == key]
        try:
            for job, result in zip(group, work([job.payload for job in group], key), strict=True):
                job.result = result
        except Exception as error:  # every waiting request answers with it, none hangs
            for job in group:
                job.error = error
        for job in group:
            job.done = True


def _submit(target: Any, work: Work, payload: Any, key: Hashable, limit: int, leaders: int) -> Any:
    """``work([payload], key)[0]``, run together with concurrent jobs on ``target`` when batching is on."""
    if not _state["enabled"]:
        return work([payload], key)[0]
    with _attach:
        batcher = _batchers.get(target)
        if batcher is None:
            batcher = _batchers[target] = _Batcher()
    return batcher.submit(work, _Job(payload, key), limit, leaders)


def search(index: faiss_index.SearchIndex, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (scores, ids) of one query vector, as :func:`aoq_serve.index.faiss_index.search`
    gives them, searched together with concurrent queries on the same index when batching is on."""
    def work(vectors: list[np.ndarray], k: Hashable) -> list[tuple[np.ndarray, np.ndarray]]:
        # a wider search cut to a smaller k could order tied scores differently: one call per k
        return faiss_index.search_many(index, np.stack(vectors), int(k))  # type: ignore[call-overload]

    vector = np.asarray(vector, dtype=np.float32).reshape(-1)
    return _submit(index, work, vector, k, search_limit(index), SEARCH_LEADERS)


def encode(encoder: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], sequence: Sequence[int],
           device: torch.device) -> np.ndarray:
    """One token sequence's embedding by a batch-invariant query encoder
    (:func:`aoq.models.invariant.query_text_encoder`), encoded together with concurrent texts of
    the same token bucket when batching is on."""
    def work(sequences: list[Sequence[int]], _: Hashable) -> np.ndarray:
        return encode_bucket(encoder, sequences, device)

    return _submit(encoder, work, sequence, bucket_length(len(sequence)), MAX_BATCH, ENCODE_LEADERS)
