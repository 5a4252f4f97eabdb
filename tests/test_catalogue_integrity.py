"""Integrity of what the service reads: the catalogue (SQLite checked at start-up, caption text
covered by each index's manifest on SQLite and PostgreSQL), gallery image files, and the
memory-mapped embeddings (in-place changes detected by the watcher). A 500 closes the
connection cleanly.
"""

from __future__ import annotations

import http.client
import sqlite3
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.backend_helpers import (
    ServiceFixture,
    build_service_fixture,
    postgres_database,
    refused_start,
    run_server,
)

pytestmark = pytest.mark.slow
QUERY = "a red circle on a grey background"


def _truncate(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def _flip_page_type(db: Path) -> None:
    """Flip bits in the b-tree page header of the catalogue's second page (a table's root)."""
    with sqlite3.connect(db) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with db.open("r+b") as fh:
        fh.seek(page_size)
        byte = fh.read(1)
        fh.seek(page_size)
        fh.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped", "deleted"])
def test_damaged_or_missing_sqlite_catalogue_refuses_to_start_with_one_line(tmp_path: Path, damage: str):
    fx = build_service_fixture(tmp_path)
    db = fx.index_dir / "catalogue.sqlite"
    for leftover in fx.index_dir.glob("catalogue.sqlite-*"):  # WAL files of the indexing run
        leftover.unlink()
    {"truncated": _truncate, "bit-flipped": _flip_page_type, "deleted": Path.unlink}[damage](db)
    code, err = refused_start(fx)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert last.startswith("aoq serve: error: ") and str(db) in last and "aoq index" in last, last
    assert damage != "deleted" or not db.exists()  # never silently recreated empty


def _edit_caption(fx: ServiceFixture, dataset: str) -> int:
    """Change the text of one gallery caption of ``dataset`` behind the service's back."""
    from sqlalchemy import select, update

    from aoq_serve.store.db import Caption, Dataset, make_engine

    engine = make_engine(fx.catalogue_url)
    with engine.begin() as conn:
        dataset_id = conn.execute(select(Dataset.id).where(Dataset.name == dataset)).scalar_one()
        caption_id = conn.execute(select(Caption.id).where(Caption.dataset_id == dataset_id, Caption.split == "test")
                                  .order_by(Caption.position).limit(1)).scalar_one()
        conn.execute(update(Caption).where(Caption.id == caption_id).values(text="an edited caption"))
    engine.dispose()
    return caption_id


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_edited_caption_text_disables_the_models_of_that_gallery(tmp_path: Path, backend: str):
    def check(fx: ServiceFixture) -> None:
        with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/health").json()["models"] == ["aoq", "baseline", "pixels"]
            _edit_caption(fx, "synth")  # while serving: found on the next reload
            reloaded = client.post("/admin/reload", json={}).json()
            refused = client.post("/search/text", json={"query": QUERY, "model": "aoq"})
        assert reloaded["models"] == ["pixels"]  # the other dataset's gallery is intact
        for name in ("aoq", "baseline"):
            assert "caption text in the catalogue differs" in reloaded["disabled"][name], reloaded
        assert refused.status_code == 409 and "re-run aoq index" in refused.json()["detail"]
        # And at start-up.
        with run_server(fx.settings()) as url:
            health = httpx.get(f"{url}/health", timeout=60).json()
        assert health["models"] == ["pixels"] and set(health["disabled"]) == {"aoq", "baseline"}

    if backend == "sqlite":
        check(build_service_fixture(tmp_path))
        return
    with postgres_database() as pg_url:
        check(build_service_fixture(tmp_path, catalogue_url=pg_url))


def test_a_table_dropped_while_serving_answers_503_and_the_connection_keeps_serving(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    with run_server(fx.settings()) as url:
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/health")
        conn.getresponse().read()
        with sqlite3.connect(fx.index_dir / "catalogue.sqlite") as db:  # damage while serving
            db.execute("DROP TABLE query_ranks")
        conn.request("GET", "/failures")
        failed = conn.getresponse()
        body = failed.read()
        assert failed.status == 503 and b"query_ranks" in body, body
        conn.request("GET", "/health")
        again = conn.getresponse()
        again.read()
        conn.close()
    assert again.status == 200


def test_image_file_damaged_on_disk_is_not_served(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=60) as client:
        image_id = client.get("/examples", params={"n": 1, "dataset": "synth_pixels"}).json()["images"][0]["id"]
        assert client.get(f"/images/{image_id}").status_code == 200
        path = next((fx.data_dir / "synth" / "images" / "test").glob("*000000.png"))
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # inside the compressed pixel data
        path.write_bytes(bytes(data))
        damaged = client.get(f"/images/{image_id}")
        thumb = client.get(f"/images/{image_id}", params={"size": 32})
    assert damaged.status_code == 404 and "cannot be decoded" in damaged.json()["detail"], damaged.text[:200]
    assert thumb.status_code == 404


def test_embeddings_changed_in_place_disable_the_model_on_the_next_tick(tmp_path: Path):
    fx = build_service_fixture(tmp_path)
    target = fx.index_dir / "aoq" / "images.npy"
    with run_server(fx.settings(reload_poll_s=0.2)) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/search/text", json={"query": QUERY, "model": "aoq"}).status_code == 200
        embeddings = np.load(target, mmap_mode="r+")  # the very bytes the server has mapped
        embeddings[0] = -embeddings[0]
        embeddings.flush()
        del embeddings
        deadline, health = time.monotonic() + 30, {}
        while time.monotonic() < deadline:
            health = client.get("/health").json()
            if "aoq" in health["disabled"]:
                break
            time.sleep(0.1)
        refused = client.post("/search/text", json={"query": QUERY, "model": "aoq"})
    assert health["models"] == ["baseline", "pixels"], health
    assert "$AOQ_INDEX_DIR/aoq/images.npy" in health["disabled"]["aoq"], health
    assert refused.status_code == 409
