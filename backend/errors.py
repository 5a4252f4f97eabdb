"""The one exception the service's modules raise for a request they cannot answer.

It carries the HTTP status (4xx for a request the service cannot answer; 503 for a part of the
service disabled because its data failed a check) and a message meant for the person who sent
the request; the app turns it into ``{"detail": message}``.
"""

from __future__ import annotations


class ServiceError(Exception):
    """A request that cannot be answered, with its HTTP status and a clear message."""

    def __init__(self, status_code: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
        #: extra response headers (``WWW-Authenticate`` of a 401).
        self.headers = headers
