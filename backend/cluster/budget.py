"""The upload-decode memory budget (``AOQ_DECODE_MEMORY_BUDGET_MB``) held by all worker processes
together: :class:`aoq_serve.search.decode.MemoryBudget`'s contract across processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aoq_serve.cluster.state import Shared
from aoq_serve.search.decode import return_freed_memory

#: how often a waiting decode looks again when another worker may have freed memory (a worker's
#: own releases wake its waiters at once).
_RECHECK_S = 0.005


class SharedMemoryBudget:
    """A counting semaphore over bytes shared by the workers; each worker counts its own
    reservations in its own column, so a dead worker's are dropped with it."""

    def __init__(self, shared: Shared, worker: int, total_bytes: int) -> None:
        self.shared, self.worker, self.total = shared, worker, total_bytes
        self._cond = threading.Condition()

    @property
    def in_use(self) -> int:
        """Bytes reserved now by every worker together."""
        return int(self.shared.decode.sum())

    def _try_take(self, take: int) -> bool:
        with self.shared.locked():
            if int(self.shared.decode.sum()) + take > self.total:
                return False
            self.shared.decode[self.worker] += take
            return True

    @contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Hold ``nbytes`` of the budget for the duration of the ``with`` block; a reservation
        larger than the budget waits until nothing is reserved, then takes all of it."""
        take = min(nbytes, self.total)
        with self._cond:
            while not self._try_take(take):
                self._cond.wait(_RECHECK_S)
        try:
            yield
        finally:
            with self.shared.locked():
                self.shared.decode[self.worker] -= take
                idle = int(self.shared.decode[self.worker]) == 0
            with self._cond:
                self._cond.notify_all()
            if idle:
                return_freed_memory()
