"""Who may call the admin endpoints (``POST /admin/reload``).

- With ``AOQ_ADMIN_TOKEN`` set: ``Authorization: Bearer <token>`` (401 otherwise).
- Without a token: only a service listening on a loopback address answers them (403 otherwise),
  so an exposed service never has an open admin endpoint.
- Always: the request must be ``Content-Type: application/json``. An HTML form on another site
  can only post form or plain-text bodies, and a cross-site JSON post needs a CORS preflight that
  this service does not grant (CORS is off unless ``AOQ_CORS_ORIGINS`` is set). Requests that a
  browser marks as cross-site (``Sec-Fetch-Site: cross-site``, or an ``Origin`` other than the
  service's own) are refused too (403).
"""

from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from fastapi import Request

from aoq_serve.errors import ServiceError


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as given to ``--host``) is a loopback address or ``localhost``."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _cross_site(request: Request) -> bool:
    if request.headers.get("sec-fetch-site", "").lower() == "cross-site":
        return True
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()


def require_admin(request: Request) -> None:
    """FastAPI dependency of every admin endpoint.

    Raises:
        ServiceError: 401 missing or wrong token, 403 admin disabled or a cross-site request,
            415 not a JSON request.
    """
    settings = request.app.state.service.settings
    token = settings.admin_token.get_secret_value() if settings.admin_token is not None else None
    if token:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ServiceError(401, "admin endpoint: give the admin token as 'Authorization: Bearer <token>'",
                               headers={"WWW-Authenticate": "Bearer"})
    elif not is_loopback(settings.host):
        raise ServiceError(403, f"admin endpoints are disabled: the service listens on {settings.host}, not on a "
                                f"loopback address, and no AOQ_ADMIN_TOKEN is set")
    if _cross_site(request):
        raise ServiceError(403, "admin endpoint: cross-site requests are refused")
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise ServiceError(415, "admin endpoint: send the request as JSON (Content-Type: application/json); "
                                "form posts are refused")
