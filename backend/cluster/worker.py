"""What one worker process of several holds: its index and the shared state it counts in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aoq_serve.cluster.board import Board
from aoq_serve.cluster.budget import SharedMemoryBudget
from aoq_serve.cluster.connections import SharedConnections
from aoq_serve.cluster.state import Shared
from aoq_serve.config import Settings


@dataclass(frozen=True)
class WorkerContext:
    """A worker's index among ``shared.n_workers``, the shared file (opened by this worker) and
    the directory where index arrays are shared (:mod:`aoq_serve.index.shared`)."""

    shared: Shared
    worker: int
    share_dir: Path

    def board(self) -> Board:
        return Board(self.shared, self.worker)

    def connections(self, settings: Settings) -> SharedConnections:
        return SharedConnections(self.shared, self.worker, settings.max_connections, settings.max_client_connections)

    def decode_budget(self, settings: Settings) -> SharedMemoryBudget:
        return SharedMemoryBudget(self.shared, self.worker, settings.decode_memory_budget_mb * 1024 * 1024)
