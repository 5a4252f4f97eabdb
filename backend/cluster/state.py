"""One file mapped into every worker process, guarded by a file lock.

The file lives in a private directory (``/dev/shm`` where there is one), so its pages are shared
memory. The lock is ``flock``: the kernel drops it when its holder dies, so a killed worker
never leaves the others waiting. What each worker holds (connections, decode memory) is counted
in its own column, so the supervisor can drop a dead worker's share (:meth:`Shared.forget`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

STATE_FILE = "state.bin"
#: bytes of each worker's published state (JSON, :mod:`aoq_serve.cluster.board`).
STATE_BYTES = 4096


def table_slots(max_connections: int) -> int:
    """Rows of the per-client table: at most ``max_connections`` addresses are open at once
    (each worker may hold one more being refused); twice that keeps probe chains short."""
    return 1 << (2 * max_connections + 64).bit_length()


class Shared:
    """Views of the shared file: ``conns`` (slots, 1 + workers) int64 (address key, then each
    worker's open connections from it), ``decode`` (workers,) int64 (bytes each worker's upload
    decodes hold), ``reload`` (1,) int64 (reload requests so far), ``workers`` (workers, 3) int64
    (pid, reload requests done, state length) and ``states`` (workers, STATE_BYTES) uint8."""

    def __init__(self, path: Path, workers: int, slots: int) -> None:
        self.path, self.n_workers, self.slots = path, workers, slots
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, _size(workers, slots))
        self._thread_lock = threading.Lock()
        offset = 0
        views = {}
        for name, shape, dtype in _layout(workers, slots):
            views[name] = np.ndarray(shape, dtype=dtype, buffer=self._map, offset=offset)
            offset += int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.conns, self.decode, self.reload = views["conns"], views["decode"], views["reload"]
        self.workers, self.states = views["workers"], views["states"]

    @classmethod
    def create(cls, directory: Path, workers: int, max_connections: int) -> Shared:
        """A zeroed shared file in ``directory`` (the supervisor's, before any worker starts)."""
        slots = table_slots(max_connections)
        path = directory / STATE_FILE
        with open(path, "wb") as f:
            f.truncate(_size(workers, slots))
        os.chmod(path, 0o600)
        return cls(path, workers, slots)

    def reopen(self) -> Shared:
        """The same file opened again: a forked worker needs its own open file for ``flock``
        (a lock belongs to the open file, which ``fork`` shares)."""
        return Shared(self.path, self.n_workers, self.slots)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive access across threads (the thread lock) and processes (``flock``)."""
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def forget(self, worker: int) -> None:
        """Drop what a dead worker held: its connections, its decode memory, its published state."""
        with self.locked():
            self.conns[:, 1 + worker] = 0
            self.decode[worker] = 0
            self.workers[worker] = 0


def _layout(workers: int, slots: int) -> list[tuple[str, tuple[int, ...], type]]:
    return [("conns", (slots, 1 + workers), np.int64), ("decode", (workers,), np.int64), ("reload", (1,), np.int64),
            ("workers", (workers, 3), np.int64), ("states", (workers, STATE_BYTES), np.uint8)]


def _size(workers: int, slots: int) -> int:
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for _, shape, dtype in _layout(workers, slots))
