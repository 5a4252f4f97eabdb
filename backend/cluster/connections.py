"""The connection caps (``AOQ_MAX_CONNECTIONS``, ``AOQ_MAX_CLIENT_CONNECTIONS``) counted across
worker processes: a client gets at most its cap in all workers together, not per worker."""

from __future__ import annotations

import hashlib

from aoq_serve.cluster.state import Shared


def address_key(address: str) -> int:
    """A nonzero 64-bit key of a client address (0 marks an empty table row)."""
    key = int.from_bytes(hashlib.blake2b(address.encode(), digest_size=8).digest(), "little", signed=True)
    return key or 1


class SharedConnections:
    """Admits or refuses a new connection of one worker against the counts of every worker.

    The table is open-addressed on the address key; a row whose counts are all zero is reused by
    the next new address that passes it, after the whole probe chain was searched for the key."""

    def __init__(self, shared: Shared, worker: int, max_connections: int, max_client_connections: int) -> None:
        self.shared, self.column = shared, 1 + worker
        self.max_connections, self.max_client_connections = max_connections, max_client_connections

    def admit(self, address: str) -> bool:
        """Count a new connection from ``address`` unless a cap is reached (then count nothing)."""
        key, conns = address_key(address), self.shared.conns
        with self.shared.locked():
            if int(conns[:, 1:].sum()) + 1 > self.max_connections:
                return False
            row = self._row(key)
            if row is None or int(conns[row, 1:].sum()) >= self.max_client_connections:
                return False
            conns[row, 0] = key
            conns[row, self.column] += 1
            return True

    def release(self, address: str) -> None:
        """Uncount a connection that :meth:`admit` counted."""
        key, conns = address_key(address), self.shared.conns
        with self.shared.locked():
            row = self._row(key)
            if row is not None and conns[row, 0] == key and conns[row, self.column] > 0:
                conns[row, self.column] -= 1

    def _row(self, key: int) -> int | None:
        """The row of ``key``, else the first free row of its probe chain; None when the table is full."""
        conns, slots = self.shared.conns, self.shared.slots
        free = None
        start = key % slots
        for step in range(slots):
            row = (start + step) % slots
            if conns[row, 0] == key:
                return row
            if free is None and not conns[row, 1:].any():
                free = row
            if conns[row, 0] == 0:
                break
        return free
