"""The query log, written off the request path: requests append to a queue, a background thread
inserts the queued rows in one statement per second, so a search never waits for the database."""

from __future__ import annotations

import logging
import threading
from collections import deque
from datetime import datetime, timezone

from sqlalchemy import insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from aoq_serve.store.db import QueryLog

log = logging.getLogger(__name__)


class QueryLogger:
    """Batches query-log rows (time, endpoint, latency, model, k, status); never the query content."""

    def __init__(self, sessions: sessionmaker, enabled: bool = True, flush_every_s: float = 1.0) -> None:
        self.sessions, self.enabled, self.flush_every_s = sessions, enabled, flush_every_s
        self._pending: deque[dict] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, endpoint: str, latency_ms: float, model: str | None = None, k: int | None = None,
               status: int = 200) -> None:
        if self.enabled:
            self._pending.append({
                "time": datetime.now(timezone.utc), "endpoint": endpoint, "latency_ms": float(latency_ms),
                "model": model, "k": k, "status": status,
            })

    def flush(self) -> int:
        """Insert everything queued so far; returns the number of rows written."""
        rows = []
        while self._pending:
            rows.append(self._pending.popleft())
        if not rows:
            return 0
        try:
            with self.sessions() as session, session.begin():
                session.execute(insert(QueryLog), rows)
        except SQLAlchemyError as exc:  # a full disk or a locked database must not break searches
            log.warning("query log: %d rows dropped (%s)", len(rows), exc)
            return 0
        return len(rows)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_every_s):
            self.flush()

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aoq-query-log", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.flush()
