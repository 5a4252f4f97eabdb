"""Access control of the admin endpoints and CORS, on the real server (127.0.0.1, random port).

The rules (docs/serving.md): with ``AOQ_ADMIN_TOKEN`` set, admin requests need
``Authorization: Bearer <token>``; without one they are allowed only when the service is bound
to a loopback address. Either way they must be JSON (``Content-Type: application/json``), which
an HTML form on another site cannot send, and requests that a browser marks as cross-site are
refused. CORS headers are sent only for the configured origins.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.backend_helpers import ServiceFixture, build_service_fixture, run_server

pytestmark = pytest.mark.slow
TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> ServiceFixture:
    return build_service_fixture(tmp_path_factory.mktemp("admin"))


@pytest.fixture(scope="module")
def loopback(fx) -> Iterator[httpx.Client]:
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def with_token(fx) -> Iterator[httpx.Client]:
    with run_server(fx.settings(host="0.0.0.0", admin_token=TOKEN, cors_origins=["https://ui.example"])) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client


def test_loopback_without_token_allows_json_admin_requests(loopback):
    r = loopback.post("/admin/reload", json={})
    assert r.status_code == 200 and r.json()["models"] == ["aoq", "baseline", "pixels"]


@pytest.mark.parametrize("content", [
    {"data": {"a": "b"}},                                      # application/x-www-form-urlencoded
    {"files": {"f": ("x.txt", b"x", "text/plain")}},           # multipart/form-data
    {"content": b"{}", "headers": {"Content-Type": "text/plain"}},
    {},                                                        # no body at all
], ids=["urlencoded", "multipart", "text-plain", "no-body"])
def test_form_style_admin_posts_are_refused(loopback, content):
    r = loopback.post("/admin/reload", **content)
    assert r.status_code == 415 and "application/json" in r.json()["detail"]


def test_requests_a_browser_marks_cross_site_are_refused(loopback):
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
        r = loopback.post("/admin/reload", json={}, headers=headers)
        assert r.status_code == 403 and "cross-site" in r.json()["detail"], headers


def test_no_cors_headers_unless_configured(loopback):
    r = loopback.options("/search/text", headers={"Origin": "https://ui.example",
                                                  "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in loopback.get("/health", headers={"Origin": "https://ui.example"}).headers


def test_admin_needs_the_token_when_one_is_set(with_token):
    assert with_token.post("/admin/reload", json={}).status_code == 401
    wrong = with_token.post("/admin/reload", json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    ok = with_token.post("/admin/reload", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    form = with_token.post("/admin/reload", data={"a": "b"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert form.status_code == 415


def test_configured_cors_origin_gets_cors_headers_and_others_do_not(with_token):
    ok = with_token.get("/health", headers={"Origin": "https://ui.example"})
    assert ok.headers["access-control-allow-origin"] == "https://ui.example"
    other = with_token.get("/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_admin_is_disabled_without_a_token_on_a_non_loopback_bind(fx):
    with run_server(fx.settings(host="0.0.0.0")) as url:
        r = httpx.post(f"{url}/admin/reload", json={}, timeout=60)
    assert r.status_code == 403 and "AOQ_ADMIN_TOKEN" in r.json()["detail"]
