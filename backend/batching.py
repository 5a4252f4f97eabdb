"""Micro-batching of concurrent FAISS searches on one index (docs/serving.md, Micro-batching).

Each request encodes its own query in its own worker thread (a batch of n texts through torch
rounds differently from n texts one by one, so encoding stays per query), then hands the vector
to :func:`search`. Queries that meet on the same index are searched together: the first to
arrive while nothing runs on that index becomes the leader and searches at once if it is alone;
queries arriving while a batch runs wait for it and go in the next one (the collection window is
the running batch, plus :data:`WINDOW_S` when a leader already has company). A batch holds at most
:data:`MAX_BATCH` queries and is split by ``k``, so every query gets exactly the answer it gets
alone (tested in tests/test_search_batching.py).
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field

import faiss
import numpy as np

from aoq_serve.index import faiss_index

#: the most queries one FAISS call holds. FAISS's flat index switches to a BLAS matrix product at
#: 20 queries (``distance_compute_blas_threshold``), which rounds differently from the per-query
#: scan a single search takes; below it every query of a batch is scanned exactly as alone.
MAX_BATCH = 16
#: how long a leader that already has company waits for more queries (seconds): a query alone
#: never waits.
WINDOW_S = 0.0005

_state = {"enabled": True}
_attach = threading.Lock()
#: each index's batcher, dropped with the index when a reload replaces it.
_batchers: weakref.WeakKeyDictionary[faiss.Index, _Batcher] = weakref.WeakKeyDictionary()


def set_batching(enabled: bool) -> None:
    """Switch micro-batching on or off for the whole service (``AOQ_BATCHING``)."""
    _state["enabled"] = enabled


@dataclass(eq=False)  # compared by identity: a leader finds its own query in the waiting list
class _Query:
    vector: np.ndarray
    k: int
    done: bool = False
    result: tuple[np.ndarray, np.ndarray] | None = None
    error: BaseException | None = None


@dataclass
class _Batcher:
    """The queries waiting on one index and whether a batch is being searched (it holds no
    reference to the index, so that the index can go when a reload replaces it)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    waiting: list[_Query] = field(default_factory=list)
    busy: bool = False

    def submit(self, index: faiss.Index, query: _Query) -> tuple[np.ndarray, np.ndarray]:
        with self.cond:
            self.waiting.append(query)
            if self.busy:
                self.cond.notify_all()  # a leader may be collecting its batch
            while self.busy and not query.done:
                self.cond.wait()
            if not query.done:
                batch = self._lead(query)
        if not query.done:
            try:
                _run(index, batch)
            finally:  # the next leader must never wait on a batch that is gone
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()
        if query.error is not None:
            raise query.error
        assert query.result is not None
        return query.result

    def _lead(self, own: _Query) -> list[_Query]:
        """Take the leader's batch (its own query first, then the oldest waiting); holds the lock."""
        self.busy = True
        if len(self.waiting) > 1:
            deadline = time.monotonic() + WINDOW_S
            while len(self.waiting) < MAX_BATCH and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)
        self.waiting.remove(own)
        batch = [own, *self.waiting[:MAX_BATCH - 1]]
        del self.waiting[:MAX_BATCH - 1]
        return batch


def _run(index: faiss.Index, batch: list[_Query]) -> None:
    """Search a batch, one FAISS call per distinct ``k`` (a wider search cut to a smaller k could
    order tied scores differently), and hand every query its answer or the error."""
    for k in sorted({q.k for q in batch}):
        group = [q for q in batch if q.k == k]
        try:
            answers = faiss_index.search_many(index, np.stack([q.vector for q in group]), k)
            for q, answer in zip(group, answers):
                q.result = answer
        except Exception as error:  # every waiting request answers with it, none hangs
            for q in group:
                q.error = error
        for q in group:
            q.done = True


def _batcher(index: faiss.Index) -> _Batcher:
    """The index's batcher, created on its first search."""
    with _attach:
        batcher = _batchers.get(index)
        if batcher is None:
            batcher = _batchers[index] = _Batcher()
        return batcher


def search(index: faiss.Index, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (scores, ids) of one query vector, as :func:`aoq_serve.index.faiss_index.search`
    gives them, searched together with concurrent queries on the same index when batching is on."""
    if not _state["enabled"]:
        return faiss_index.search(index, vector, k)
    return _batcher(index).submit(index, _Query(np.asarray(vector, dtype=np.float32).reshape(-1), k))
