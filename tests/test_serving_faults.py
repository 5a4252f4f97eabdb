"""Faults while the real server runs on 127.0.0.1: none takes the service down or makes it lie.

Each test damages a copy of one built service (index files, catalogue rows, checkpoints) while
it serves, and checks that the damage disables what it touches with a named log line and a
clear 503 or 409, that ``/health`` says "degraded" and names it, and that nothing else changes.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.backend_helpers import ServiceFixture, build_service_fixture, refused_start, run_server, serve_process

pytestmark = pytest.mark.slow
QUERY = {"query": "a red circle on a grey background", "model": "aoq", "k": 5}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> ServiceFixture:
    return build_service_fixture(tmp_path_factory.mktemp("faults"))


@pytest.fixture
def fx(built: ServiceFixture, tmp_path: Path) -> ServiceFixture:
    """A private copy of the built service, free to damage."""
    root = built.index_dir.parent
    shutil.copytree(root, tmp_path / "svc")

    def moved(path: Path) -> Path:
        return tmp_path / "svc" / path.relative_to(root)

    return ServiceFixture(catalogue_url=f"sqlite:///{moved(built.index_dir) / 'catalogue.sqlite'}",
                          models_dir=moved(built.models_dir), index_dir=moved(built.index_dir),
                          data_dir=moved(built.data_dir), roles=dict(built.roles))


def _db(fx: ServiceFixture) -> Path:
    return fx.index_dir / "catalogue.sqlite"


def _first_image(client: httpx.Client) -> int:
    return client.get("/examples", params={"n": 2}).json()["images"][0]["id"]


def test_truncated_embeddings_while_serving_do_not_kill_the_process(fx):
    with serve_process(fx) as (port, proc), httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        image_id = _first_image(client)
        for name in ("images.npy", "captions.npy"):
            path = fx.index_dir / "aoq" / name
            with path.open("r+b") as f:
                f.truncate(path.stat().st_size // 3)  # in place: a mapping of it would lose its pages
        r = client.post("/search/image", data={"model": "aoq", "image_id": image_id, "k": 5})
        assert r.status_code == 200, r.text
        assert client.post("/search/text", json=QUERY).status_code == 200
        assert proc.poll() is None


def test_damaged_catalogue_disables_what_reads_it_with_one_line_and_503(fx, caplog):
    caplog.set_level(logging.INFO)
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        image_id = _first_image(client)
        db = _db(fx)
        with db.open("r+b") as f:
            f.truncate(db.stat().st_size // 2)
        paths = ["/datasets", "/failures", "/captions/1", "/examples"] * 10
        answers = [client.get(p) for p in paths]
        assert {r.status_code for r in answers} <= {200, 503}, [r.text for r in answers if r.status_code >= 500]
        assert any(r.status_code == 503 and "catalogue" in r.json()["detail"] for r in answers)
        # searches and pictures read only the verified snapshot in memory
        assert client.post("/search/text", json=QUERY).status_code == 200
        assert client.get(f"/images/{image_id}").status_code == 200
        health = client.get("/health").json()
        reload = client.post("/admin/reload", json={})
    assert health["status"] == "degraded" and health["faults"], health
    assert reload.status_code == 503 and "catalogue" in reload.json()["detail"], reload.text
    disabled = [r for r in caplog.records if "disabled:" in r.getMessage()]
    assert 1 <= len(disabled) <= len(set(paths)) + 1, [r.getMessage() for r in disabled]
    assert not any(r.exc_info for r in caplog.records)


def test_health_after_a_failed_reload_names_no_absolute_path(fx):
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        db = _db(fx)
        with db.open("r+b") as f:
            f.truncate(db.stat().st_size // 2)
        reload = client.post("/admin/reload", json={})
        health = client.get("/health")
        examples = client.get("/examples")
    assert reload.status_code == 503 and str(db) in reload.json()["detail"]  # the admin sees the file
    assert health.json()["status"] == "degraded" and "$AOQ_INDEX_DIR/catalogue.sqlite" in health.text, health.text
    for public in (health.text, examples.text):
        assert str(fx.index_dir.parent) not in public and str(fx.index_dir.resolve().parts[1]) not in public, public


def test_a_catalogue_row_deleted_while_serving_is_a_503_with_one_log_line_not_a_short_answer(fx, caplog):
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        before = client.get("/examples", params={"n": 4}).json()
        first = before["images"][0]["id"]
        with sqlite3.connect(_db(fx)) as conn:  # the service's own connection enforces the foreign keys
            conn.execute("DELETE FROM images WHERE id = ?", (first,))
        answers = [client.get("/examples", params={"n": 4}) for _ in range(3)]
        caption = client.get(f"/captions/{before['captions'][0]['id']}")
        health = client.get("/health").json()
    assert len(before["images"]) == 4
    assert [r.status_code for r in answers] == [503] * 3, answers[0].text
    assert f"image at position 0" in answers[0].json()["detail"], answers[0].text
    assert caption.status_code == 200  # the caption row is still there
    assert health["status"] == "degraded" and "/examples" in health["faults"], health
    logged = [r.getMessage() for r in caplog.records if "disabled:" in r.getMessage()]
    assert len(logged) == 1 and logged[0].startswith("/examples disabled: the catalogue is damaged"), logged


def test_the_watcher_counts_catalogue_rows_while_serving(fx):
    with run_server(fx.settings(reload_poll_s=0.2)) as url, httpx.Client(base_url=url, timeout=30) as client:
        caption = client.get("/examples", params={"n": 1}).json()["captions"][0]["id"]
        assert client.get("/health").json()["status"] == "ok"
        with sqlite3.connect(_db(fx)) as conn:
            conn.execute("DELETE FROM captions WHERE id = ?", (caption,))
        deadline, health = time.monotonic() + 20, {}
        while time.monotonic() < deadline and health.get("status") != "degraded":
            time.sleep(0.1)
            health = client.get("/health").json()
        missing = client.get(f"/captions/{caption}")
        search = client.post("/search/text", json=QUERY)
    assert "catalogue" in health["faults"] and "captions rows but recorded" in health["faults"]["catalogue"], health
    assert missing.status_code == 503 and search.status_code == 200  # searches read the verified snapshot


def _swap_in(fx: ServiceFixture, target: int, source: int) -> Path:
    """Copy the picture file of image ``source`` over that of ``target`` (a valid PNG, another picture)."""
    with sqlite3.connect(_db(fx)) as conn:
        (a,), (b,) = (conn.execute("SELECT path FROM images WHERE id = ?", (i,)).fetchone() for i in (target, source))
    path = fx.data_dir / a
    path.write_bytes((fx.data_dir / b).read_bytes())
    return path


def test_a_picture_file_swapped_on_disk_is_a_503_and_health_names_it_also_after_a_reload(fx, caplog):
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        first, second = (i["id"] for i in client.get("/examples", params={"n": 2}).json()["images"])
        original = client.get(f"/images/{first}").content
        path = _swap_in(fx, first, second)
        served = [client.get(f"/images/{first}") for _ in range(3)]
        thumb = client.get(f"/images/{first}", params={"size": 32})
        other = client.get(f"/images/{second}")
        health = client.get("/health").json()
        reload = client.post("/admin/reload", json={})
        after_reload = (client.get("/health").json(), client.get(f"/images/{first}"))
        path.write_bytes(original)  # restored: the next reload serves it again
        client.post("/admin/reload", json={})
        restored = (client.get("/health").json(), client.get(f"/images/{first}"))
    assert [r.status_code for r in served] == [503] * 3 and thumb.status_code == 503, served[0].text
    assert "differs from the picture file that aoq index recorded" in served[0].json()["detail"]
    assert other.status_code == 200
    part = f"/images/{first}"
    assert health["status"] == "degraded" and part in health["faults"], health
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{part} disabled")]
    assert len(logged) == 1, logged
    assert reload.status_code == 200
    assert after_reload[0]["status"] == "degraded" and part in after_reload[0]["faults"], after_reload[0]
    assert after_reload[1].status_code == 503
    assert restored[0]["status"] == "ok" and restored[1].content == original


def test_a_picture_file_swapped_before_start_up_is_found_when_loading(fx, caplog):
    with run_server(fx.settings()) as url:
        first, second = (i["id"] for i in httpx.get(f"{url}/examples", params={"n": 2}).json()["images"])
    _swap_in(fx, first, second)
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        health = client.get("/health").json()
        served = client.get(f"/images/{first}")
        search = client.post("/search/text", json=QUERY)
    assert health["status"] == "degraded" and health["models"] == ["aoq", "baseline", "pixels"], health
    # the pixels model's dataset shows the same file under its own id: that picture is disabled too
    assert f"/images/{first}" in health["faults"] and len(health["faults"]) == 2, health
    assert all(part.startswith("/images/") for part in health["faults"]), health
    assert served.status_code == 503 and search.status_code == 200
    assert any(r.getMessage().startswith(f"picture {first} disabled:") for r in caplog.records)


def _zero_index_cells(db: Path) -> None:
    """Zero the cell pointers of an index's root page: SQLite still opens the file, and
    ``PRAGMA quick_check`` reports one problem per lost cell (dozens of lines)."""
    with sqlite3.connect(db) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ix_images_split_position'").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with db.open("r+b") as fh:
        fh.seek((root - 1) * page_size + 12)  # past the b-tree page header
        fh.write(bytes(64))


def test_a_long_quick_check_report_is_one_line_naming_the_full_report(fx):
    db = _db(fx)
    for leftover in fx.index_dir.glob("catalogue.sqlite-*"):  # WAL files of the indexing run
        leftover.unlink()
    _zero_index_cells(db)
    code, err = refused_start(fx)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("aoq serve: error: ") and "quick_check" in lines[0] and "aoq index" in lines[0]
    report = Path(lines[0].split("full report: ", 1)[1].split(")", 1)[0])
    assert report.is_file() and len(report.read_text().splitlines()) > 10  # the whole report is kept


def test_dropped_query_ranks_table_answers_503_with_a_message(fx):
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/failures").status_code == 200
        with sqlite3.connect(_db(fx)) as conn:
            conn.execute("DROP TABLE query_ranks")
        r = client.get("/failures")
        health = client.get("/health").json()
    assert r.status_code == 503 and "query_ranks" in r.json()["detail"], r.text
    assert health["status"] == "degraded" and "/failures" in health["faults"], health


def test_edited_query_ranks_are_detected_not_served(fx):
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/failures").status_code == 200
        with sqlite3.connect(_db(fx)) as conn:
            conn.execute("UPDATE query_ranks SET rank = rank + 1 WHERE query_id = (SELECT MIN(query_id) FROM query_ranks)")
        r = client.get("/failures")
    assert r.status_code == 503 and "differ from what aoq index recorded" in r.json()["detail"], r.text


def test_swapped_image_paths_are_detected_not_served(fx):
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        images = client.get("/examples", params={"n": 2}).json()["images"]
        first, second = images[0]["id"], images[1]["id"]
        before = client.get(f"/images/{first}").content
        with sqlite3.connect(_db(fx)) as conn:
            (a,), (b,) = (conn.execute("SELECT path FROM images WHERE id = ?", (i,)).fetchone() for i in (first, second))
            conn.execute("UPDATE images SET path = ? WHERE id = ?", (b, first))
            conn.execute("UPDATE images SET path = ? WHERE id = ?", (a, second))
        assert client.get(f"/images/{first}").content == before  # the verified path, not the edited row
        reload = client.post("/admin/reload", json={}).json()
        after = client.get(f"/images/{first}")
    assert "aoq" in reload["disabled"] and "image paths" in reload["disabled"]["aoq"], reload
    assert after.status_code == 200 and after.content == before or after.status_code == 404


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_reload_rehashes_checkpoints(fx, caplog, damage):
    weights = fx.models_dir / "baseline" / "model.safetensors"
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        if damage == "delete":
            weights.unlink()
        else:
            data = bytearray(weights.read_bytes())
            data[len(data) // 2] ^= 0xFF
            weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else data)
        reload = client.post("/admin/reload", json={}).json()
        health = client.get("/health").json()
    assert "baseline" in reload["disabled"] and "baseline" not in reload["models"], reload
    assert health["status"] == "degraded" and "baseline" in health["disabled"], health
    assert any("model 'baseline' disabled" in r.getMessage() for r in caplog.records)


def test_host_header_is_checked_and_image_urls_use_the_public_url(fx):
    settings = fx.settings(public_url="https://search.example")
    with run_server(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        foreign = client.get("/health", headers={"Host": "evil.example"})
        rebinding = client.post("/admin/reload", json={}, headers={"Host": "evil.example:8000"})
        public = client.post("/search/text", json=QUERY, headers={"Host": "search.example"})
        local = client.post("/search/text", json=QUERY)
    assert foreign.status_code == 400 and "evil.example" in foreign.json()["detail"]
    assert rebinding.status_code == 400
    for r in (public, local):
        assert r.status_code == 200
        assert all(h["image_url"].startswith("https://search.example/images/") for h in r.json()["results"])


def test_without_a_public_url_image_urls_name_the_listening_address(fx):
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=30) as client:
        r = client.post("/search/text", json=QUERY, headers={"Host": "localhost"})
    assert r.status_code == 200
    assert all(h["image_url"].startswith(f"{url}/images/") for h in r.json()["results"])
