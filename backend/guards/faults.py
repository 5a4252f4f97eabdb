"""Parts of the service found broken while serving, for ``/health`` and for one log line each.

A catalogue damaged while the service runs (a truncated or bit-flipped SQLite file, a dropped
table, an edited row) would otherwise turn every request that reads it into a 500 with a
traceback. Instead the endpoint that hit the damage is disabled: it answers 503 with the reason
without touching the catalogue again, the log gets one line when it is disabled (not one per
request), and ``/health`` says "degraded" and names it. Searches read only the verified snapshot
in memory and keep answering. ``POST /admin/reload`` checks the catalogue again and, when it
passes, enables everything.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)

#: the part of the service a fault of the catalogue file itself is recorded under.
CATALOGUE = "catalogue"


def endpoint(scope: dict[str, Any]) -> str:
    """The path template of the endpoint a request was routed to (``/captions/{caption_id}``)."""
    route = scope.get("route")
    return str(getattr(route, "path", None) or scope.get("path", "?"))


def first_line(exc: BaseException) -> str:
    """The database's own message of an SQLAlchemy error (its first line), else the exception's."""
    cause = getattr(exc, "orig", None) if isinstance(exc, SQLAlchemyError) else None
    text = str(cause if cause is not None else exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def picture_part(image_id: int) -> str:
    """The part a picture whose file differs from its recorded digest is disabled under."""
    return f"/images/{image_id}"


class CatalogueDamage(Exception):
    """Rows the catalogue must hold are missing or differ (found by a route or the watcher); the
    app answers it like a catalogue that cannot be read: 503, the endpoint disabled, one log line."""


class Faults:
    """``{part: reason}`` of what is disabled while serving; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: dict[str, str] = {}

    def disable(self, part: str, reason: str) -> None:
        """Disable ``part``; logged once, when it is first disabled."""
        with self._lock:
            new = part not in self._reasons
            self._reasons.setdefault(part, reason)
        if new:
            log.error("%s disabled: %s", part, reason)

    def get(self, part: str) -> str | None:
        """The reason ``part`` itself is disabled (the catalogue's fault aside)."""
        with self._lock:
            return self._reasons.get(part)

    def reason(self, part: str) -> str | None:
        with self._lock:
            return self._reasons.get(part) or self._reasons.get(CATALOGUE)

    def clear(self) -> None:
        with self._lock:
            cleared, self._reasons = self._reasons, {}
        if cleared:
            log.info("enabled again after a catalogue check: %s", ", ".join(sorted(cleared)))

    @property
    def current(self) -> dict[str, str]:
        with self._lock:
            return dict(self._reasons)
