"""``/docs`` and ``/redoc`` work offline: the pages name only assets the service serves itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from aoq_serve.app import create_app
from aoq_serve.config import Settings


@pytest.mark.parametrize("page, script", [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")])
def test_api_pages_reference_no_external_host_and_their_assets_are_served(tmp_path: Path, page: str, script: str):
    app = create_app(Settings(index_dir=tmp_path, models_dir=tmp_path, data_dir=tmp_path))
    client = TestClient(app, base_url="http://127.0.0.1")  # no lifespan: the pages need no catalogue
    html = client.get(page)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    assert not re.search(r"(https?:)?//[\w.-]+\.[a-z]{2,}", html.text), html.text  # no host, no CDN
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
    assert f"/docs/assets/{script}" in assets, assets
    for asset in assets:
        served = client.get(asset)
        assert served.status_code == 200 and len(served.content) > 1000, asset
    assert "/openapi.json" in html.text
