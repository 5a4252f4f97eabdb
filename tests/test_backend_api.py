"""The real server on 127.0.0.1 (random port), with a SQLite and with a PostgreSQL catalogue:
every endpoint's happy path with its status and JSON fields, then every kind of bad input."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image
from sqlalchemy import func, select, update

from aoq.checkpoint import load_checkpoint
from aoq.embed import encode_texts
from aoq_serve.store.db import Image as ImageRow
from aoq_serve.store.db import QueryLog, make_engine
from aoq_serve.schemas import THUMBNAIL_SIZE
from tests.backend_helpers import MINED_FILTERS, ServiceFixture, build_service_fixture, postgres_database, run_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def service(request, tmp_path_factory) -> Iterator[tuple[ServiceFixture, str]]:
    tmp = tmp_path_factory.mktemp(f"service-{request.param}")
    if request.param == "sqlite":
        fx = build_service_fixture(tmp)
        with run_server(fx.settings()) as url:
            yield fx, url
        return
    with postgres_database() as pg_url:
        fx = build_service_fixture(tmp, catalogue_url=pg_url)
        with run_server(fx.settings()) as url:
            yield fx, url


@pytest.fixture(scope="module")
def client(service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service[1], timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def examples(client) -> dict:
    return client.get("/examples", params={"n": 4}).json()


def png(size=(48, 48), colour=(30, 200, 90)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


# ----------------------------------------------------------------------------- happy paths


def test_health_lists_every_model_and_nothing_disabled(client):
    health = client.get("/health").json()  # an error's body would not equal the answer below
    state = {"status": "ok", "models": ["aoq", "baseline", "pixels"], "disabled": {}, "faults": {}, "generation": 1}
    pid = health["workers"][0]["pid"]
    assert health == {**state, "version": "0.1.0", "worker": 0, "workers": [{**state, "worker": 0, "pid": pid}]}


def test_models_describe_role_loss_encoder_and_hash(service, client):
    fx, _ = service
    models = {m["name"]: m for m in client.get("/models").json()}
    assert {n: m["role"] for n, m in models.items()} == fx.roles
    assert models["aoq"]["loss"] == "adaptive_offline_quintuplet" and models["baseline"]["loss"] == "max_violation"
    assert models["pixels"]["image_input"] == "pixels" and models["aoq"]["image_input"] == "features"
    assert models["aoq"]["checkpoint_hash"] == load_checkpoint(fx.models_dir / "aoq").content_hash
    assert all(m["enabled"] and m["disabled_reason"] is None for m in models.values())
    assert models["aoq"]["dataset"] == "synth" and models["pixels"]["dataset"] == "synth_pixels"


def test_datasets_count_splits(client):
    datasets = {d["name"]: d for d in client.get("/datasets").json()}
    splits = {"test": {"images": 12, "captions": 60}, "train": {"images": 24, "captions": 120},
              "dev": {"images": 4, "captions": 20}}
    assert datasets["synth"]["splits"] == splits  # aoq index catalogues every split: the service searches all
    assert datasets["synth"]["n_images"] == 40 and datasets["synth"]["synthetic"] is True
    assert datasets["synth_pixels"]["splits"] == splits


def test_examples_are_test_items_with_working_urls(client, examples):
    assert examples["dataset"] == "synth" and examples["split"] == "test"
    assert len(examples["images"]) == 4 and len(examples["captions"]) == 4
    for image, caption in zip(examples["images"], examples["captions"]):
        assert caption["image_id"] == image["id"]
        assert client.get(f"/captions/{caption['id']}").json() == {**caption, "split": "test"}
        full = client.get(image["image_url"])
        assert full.status_code == 200 and full.headers["content-type"] == "image/png"
        thumb = client.get(image["thumbnail_url"])
        assert thumb.headers["content-type"] == "image/png"
        assert max(Image.open(io.BytesIO(thumb.content)).size) <= THUMBNAIL_SIZE


def test_search_text_marks_ground_truth_and_ranks_it_over_the_full_gallery(service, client, examples):
    fx, _ = service
    caption = examples["captions"][1]
    r = client.post("/search/text", json={"query": caption["text"], "model": "aoq", "k": 3})
    assert r.status_code == 200
    out = r.json()
    assert out["model"] == "aoq" and out["query"] == caption["text"] and out["caption_id"] == caption["id"]
    assert out["query_split"] == "test"
    assert out["context"] == dict(scope="all", searched=40, eval_split="test", positives="pair", normalise="none", normalised=False, rerank=None)
    assert out["ground_truth_ids"] == [caption["image_id"]]
    assert [g["image_id"] for g in out["ground_truth"]] == [caption["image_id"]]
    assert [h["rank"] for h in out["results"]] == [1, 2, 3]
    assert [h["is_ground_truth"] for h in out["results"]] == [h["image_id"] == caption["image_id"] for h in out["results"]]
    # ranks over all 40 catalogued images (the list's) and over the 12 test images (as evaluated),
    # computed independently here
    ckpt = load_checkpoint(fx.models_dir / "aoq")
    emb = np.load(fx.index_dir / "aoq" / "images.npy")
    ids = np.load(fx.index_dir / "aoq" / "image_ids.npy")
    scores = emb @ encode_texts(ckpt.model, ckpt.vocab, [caption["text"]])[0]
    truth = scores[ids.tolist().index(caption["image_id"])]
    test = np.isin(ids, [i["image_id"] for i in client.get("/gallery", params={"scope": "test", "limit": 100}).json()["images"]])
    assert test.sum() == 12
    assert out["scope_rank"] == int((scores > truth + 1e-6).sum()) + 1
    assert out["ground_truth_rank"] == int((scores[test] > truth + 1e-6).sum()) + 1
    assert [h["image_id"] for h in out["results"]] == ids[np.argsort(-scores)[:3]].tolist()
    assert all(h["name"] and h["split"] in ("train", "dev", "test") for h in out["results"])
    assert out["latency_ms"] > 0

    within = client.post("/search/text", json={"query": caption["text"], "model": "aoq", "k": 3, "scope": "test"}).json()
    assert within["context"]["searched"] == 12 and all(h["split"] == "test" for h in within["results"])
    assert within["scope_rank"] == within["ground_truth_rank"] == out["ground_truth_rank"]
    assert [h["image_id"] for h in within["results"]] == ids[test][np.argsort(-scores[test])[:3]].tolist()
    outside = [i for i in ids[np.argsort(-scores)[:3]].tolist() if i not in ids[test]]
    assert (within["outside"] or {}).get("image_id") == (outside[0] if outside else None)


def test_search_text_with_free_text_has_no_ground_truth(client):
    out = client.post("/search/text", json={"query": "a red circle", "model": "baseline"}).json()
    assert out["caption_id"] is None and out["ground_truth_ids"] == [] and out["ground_truth_rank"] is None
    assert len(out["results"]) == 10 and not any(h["is_ground_truth"] for h in out["results"])


@pytest.mark.parametrize("model", ["aoq", "pixels"])
def test_search_image_by_upload_uses_the_model_image_path(client, model):
    r = client.post("/search/image", data={"model": model, "k": 4}, files={"file": ("q.png", png(), "image/png")})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["image_id"] is None and out["ground_truth_rank"] is None and len(out["results"]) == 4


def test_gallery_png_upload_scores_like_its_id(client, examples):
    """The synthetic benchmark's extractor featurises an upload exactly as the stored features."""
    image_id = examples["images"][0]["id"]
    raw = client.get(f"/images/{image_id}").content
    by_id = client.post("/search/image", data={"model": "aoq", "k": 5, "image_id": image_id}).json()
    by_file = client.post("/search/image", data={"model": "aoq", "k": 5}, files={"file": ("g.png", raw, "image/png")}).json()
    assert [h["caption_id"] for h in by_file["results"]] == [h["caption_id"] for h in by_id["results"]]
    np.testing.assert_allclose([h["score"] for h in by_file["results"]], [h["score"] for h in by_id["results"]], atol=1e-5)


def test_compare_text_defaults_to_baseline_and_aoq(client, examples):
    query = examples["captions"][0]["text"]
    out = client.post("/compare/text", json={"query": query, "k": 2}).json()
    assert out["query"] == query and out["left"]["model"] == "baseline" and out["right"]["model"] == "aoq"
    assert out["left"]["ground_truth_ids"] == out["right"]["ground_truth_ids"] == [examples["captions"][0]["image_id"]]
    named = client.post("/compare/text", json={"query": query, "k": 2, "models": ["aoq", "pixels"]}).json()
    assert (named["left"]["model"], named["right"]["model"]) == ("aoq", "pixels")


def test_compare_image_by_id_and_by_upload(client, examples):
    image_id = examples["images"][1]["id"]
    out = client.post("/compare/image", data={"k": 3, "image_id": image_id}).json()
    assert out["left"]["model"] == "baseline" and out["right"]["model"] == "aoq"
    assert out["left"]["ground_truth_rank"] >= 1 and out["right"]["ground_truth_rank"] >= 1
    up = client.post("/compare/image", data={"k": 3, "models": "aoq,pixels"}, files={"file": ("q.png", png(), "image/png")})
    assert up.status_code == 200 and up.json()["right"]["model"] == "pixels"


def test_failures_partition_the_queries_and_agree_with_search(client):
    totals = {}
    for which in ("baseline_only", "aoq_only", "both"):
        out = client.get("/failures", params={"direction": "t2i", "which": which, "limit": 100}).json()
        assert (out["left"], out["right"], out["direction"], out["which"]) == ("baseline", "aoq", "t2i", which)
        assert out["total"] == len(out["items"])
        totals[which] = out["total"]
        for item in out["items"]:
            left_wrong, right_wrong = item["left_rank"] > 1, item["right_rank"] > 1
            assert {"baseline_only": left_wrong and not right_wrong, "aoq_only": right_wrong and not left_wrong,
                    "both": left_wrong and right_wrong}[which]
    assert sum(totals.values()) <= 60
    item = client.get("/failures", params={"which": "both", "limit": 1}).json()["items"][0]
    search = client.post("/search/text", json={"query": item["query_text"], "model": "baseline", "k": 1}).json()
    assert search["caption_id"] == item["query_id"] and search["ground_truth_rank"] == item["left_rank"]
    i2t = client.get("/failures", params={"direction": "i2t", "which": "both", "limit": 2}).json()
    assert all(i["image_url"].endswith(f"/images/{i['query_id']}") and i["query_text"] is None for i in i2t["items"])


def test_metrics_tables_curves_and_histogram(client):
    out = client.get("/metrics/aoq").json()
    assert out["model"] == "aoq" and set(out["tables"]) == {"full"}
    full = out["tables"]["full"]
    assert set(full["i2t"]) == {"r1", "r5", "r10", "medr", "meanr"}
    assert full["rsum"] == pytest.approx(sum(full[d][k] for d in ("i2t", "t2i") for k in ("r1", "r5", "r10")))
    assert out["curves"] == [{"epoch": 1, "round": 2, "i2t_r1": 10.0, "t2i_r1": 8.0, "rsum": 50.0},
                             {"epoch": 2, "round": 2, "i2t_r1": 20.0, "t2i_r1": 16.0, "rsum": 100.0}]
    assert out["rank_histogram"]["bins"] == ["1", "2-5", "6-20", "21-100", "101-200", ">200"]
    assert sum(out["rank_histogram"]["counts"]) == 60
    assert client.get("/metrics/baseline").json()["curves"] == []


def test_negatives_offline_from_the_mined_artefact_and_online_from_a_batch(service, client):
    fx, _ = service
    from aoq.mined import load_mined, removed_by

    mined = load_mined(fx.models_dir.parent / "mined")
    train = client.get("/examples", params={"split": "train", "n": 2}).json()
    first_train_image = min(i["id"] for i in train["images"])  # train ids are contiguous, by position
    first_train_caption = min(c["id"] for c in train["captions"])
    # a caption whose mined list had a candidate removed by the filters within its first 8
    raw, flags = np.asarray(mined.filtered["cap_raw"]), np.asarray(mined.filtered["cap_flags"])
    position = int(np.flatnonzero(flags[:, :8].any(axis=1))[0])
    caption_id = first_train_caption + position
    out = client.get("/negatives", params={"kind": "caption", "id": caption_id, "model": "aoq", "n": 8}).json()
    assert out["kind"] == "caption" and out["id"] == caption_id and out["filters"] == MINED_FILTERS == ["identity"]
    assert [(x["rank"], x["id"], x["removed_by"]) for x in out["offline"]] == list(zip(  # raw list, filters named
        range(1, 9), (raw[position, :8] + first_train_image).tolist(), removed_by(flags[position, :8], MINED_FILTERS)))
    marks = [(x["correct"], x["removed_by"] == "identity") for x in out["offline"]]  # correct: the anchor's text
    assert all(c == r for c, r in marks) and (True, True) in marks and out["correct_rule"] == "text"
    kept = [x["id"] - first_train_image for x in out["offline"] if x["removed_by"] is None]
    assert kept == mined.cap_top_imgs[position][:len(kept)].tolist()  # what round 2 samples from, in order
    assert all(x["image_url"].endswith(f"/images/{x['id']}?size={THUMBNAIL_SIZE}") and x["text"] for x in out["offline"])
    scores = [x["score"] for x in out["online"]]
    assert len(scores) == 8 and scores == sorted(scores, reverse=True)
    assert first_train_image + position // mined.captions_per_image not in [x["id"] for x in out["online"]]

    image = train["images"][0]
    out = client.get("/negatives", params={"kind": "image", "id": image["id"], "model": "aoq", "n": 3}).json()
    assert out["image_url"].endswith(f"/images/{image['id']}") and out["text"] == train["captions"][0]["text"]
    assert all(x["text"] and "/images/" in x["image_url"] for x in out["offline"] + out["online"])
    again = client.get("/negatives", params={"kind": "image", "id": image["id"], "model": "aoq", "n": 3}).json()
    assert again["online"] == out["online"]  # same seed, same batch


def test_query_log_records_searches_but_not_their_content(service, client):
    fx, _ = service
    client.post("/search/text", json={"query": "query log probe", "model": "aoq", "k": 7})
    service_state = None  # the log is flushed by the background thread within a second
    engine = make_engine(fx.catalogue_url)
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                service_state = conn.execute(
                    select(func.count()).select_from(QueryLog).where(QueryLog.endpoint == "/search/text", QueryLog.k == 7)
                ).scalar()
            if service_state:
                break
            time.sleep(0.2)
    finally:
        engine.dispose()
    assert service_state and service_state >= 1
    assert _database_text_containing(fx.catalogue_url, "query log probe") == []


def _database_text_containing(url: str, needle: str) -> list[str]:
    """``table.column`` of every stored value, in every table, that contains ``needle``."""
    from sqlalchemy import MetaData, String, Text

    engine = make_engine(url)
    found = []
    try:
        meta = MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            for table in meta.tables.values():
                for column in table.columns:
                    if isinstance(column.type, (String, Text)):
                        hits = conn.execute(select(func.count()).where(column.contains(needle))).scalar()
                        if hits:
                            found.append(f"{table.name}.{column.name}")
    finally:
        engine.dispose()
    return found


# ----------------------------------------------------------------------------- bad input


def assert_error(r: httpx.Response, status: int, *fragments: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert isinstance(body["detail"], str) and body["detail"]
    for fragment in fragments:
        assert fragment in body["detail"], body["detail"]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"query": "", "model": "aoq"}, "body.query"),
        ({"query": "   ", "model": "aoq"}, "non-space"),
        ({"query": "x" * 1001, "model": "aoq"}, "at most 1000"),
        ({"query": "ok", "model": "aoq", "k": 0}, "body.k"),
        ({"query": "ok", "model": "aoq", "k": 101}, "body.k"),
        ({"query": "ok"}, "body.model"),
        ({"model": "aoq"}, "body.query"),
    ],
)
def test_invalid_text_queries_are_422_with_a_readable_detail(client, body, fragment):
    r = client.post("/search/text", json=body)
    assert_error(r, 422, fragment)
    assert r.json()["errors"]


def test_malformed_json_is_422(client):
    assert_error(client.post("/search/text", content=b"{not json", headers={"content-type": "application/json"}), 422)


def test_query_of_exactly_1000_characters_is_accepted(client):
    assert client.post("/search/text", json={"query": "a" * 1000, "model": "aoq", "k": 1}).status_code == 200


def test_unknown_model_is_404_naming_the_served_ones(client):
    assert_error(client.post("/search/text", json={"query": "x", "model": "nope"}), 404, "unknown model 'nope'", "aoq")
    assert_error(client.get("/metrics/nope"), 404, "unknown model")
    assert_error(client.post("/compare/text", json={"query": "x", "models": ["aoq", "nope"]}), 404, "nope")


@pytest.mark.parametrize("path", ["/images/999999", "/captions/999999", "/images/999999?size=64"])
def test_unknown_ids_are_404(client, path):
    assert_error(client.get(path), 404, "999999")


def test_out_of_range_ids_and_sizes_are_422(client):
    assert_error(client.get("/images/1", params={"size": 8}), 422, "size")
    assert_error(client.get("/images/1", params={"size": 513}), 422, "size")
    assert_error(client.get(f"/images/{2**40}"), 422)
    assert_error(client.get("/images/-1"), 422)


def test_search_image_needs_exactly_one_query(client, examples):
    assert_error(client.post("/search/image", data={"model": "aoq"}), 422, "exactly one of image_id")
    both = client.post("/search/image", data={"model": "aoq", "image_id": examples["images"][0]["id"]},
                       files={"file": ("q.png", png(), "image/png")})
    assert_error(both, 422, "exactly one of image_id")


def test_image_id_outside_the_model_gallery_is_404(client):
    other_dataset = client.get("/examples", params={"dataset": "synth_pixels", "n": 1}).json()["images"][0]["id"]
    assert_error(client.post("/search/image", data={"model": "aoq", "image_id": other_dataset}), 404, "not in the gallery")


@pytest.mark.parametrize(
    "content, status, fragment",
    [
        (b"hello, not an image", 422, "not an image"),
        (b"", 422, "empty"),
        (png()[:70], 422, "corrupt or truncated"),
    ],
)
def test_bad_uploads_are_4xx(client, content, status, fragment):
    r = client.post("/search/image", data={"model": "aoq"}, files={"file": ("q.png", content, "image/png")})
    assert_error(r, status, fragment)


def test_gif_upload_is_415(client):
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="GIF")
    r = client.post("/search/image", data={"model": "aoq"}, files={"file": ("q.gif", out.getvalue(), "image/gif")})
    assert_error(r, 415, "PNG or JPEG")


def test_decompression_bomb_upload_is_422(client):
    out = io.BytesIO()
    Image.new("1", (9000, 9000)).save(out, format="PNG")  # 81 M pixels in ~100 KB
    r = client.post("/search/image", data={"model": "aoq"}, files={"file": ("bomb.png", out.getvalue(), "image/png")})
    assert_error(r, 422, "decompression bomb")


def test_upload_over_10_mb_is_413(client):
    big = b"\x89PNG\r\n\x1a\n" + bytes(11 * 1024 * 1024)
    r = client.post("/search/image", data={"model": "aoq"}, files={"file": ("big.png", big, "image/png")})
    assert_error(r, 413, "too large")


def test_chunked_upload_is_cut_off_while_streaming(service):
    """No Content-Length: the body is counted as it arrives and refused past the limit."""
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        yield (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\naoq\r\n'
               b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.png"\r\n'
               b"Content-Type: image/png\r\n\r\n")
        for _ in range(40):  # would be 40 MB
            sent += 1
            yield b"x" * (1024 * 1024)

    headers = {"content-type": "multipart/form-data; boundary=b"}
    with httpx.Client(base_url=service[1], timeout=60) as c:
        try:
            r = c.post("/search/image", content=body(), headers=headers)
            assert_error(r, 413, "too large")
        except httpx.HTTPError:
            pass  # the server may close the connection before the client finishes sending
    assert sent < 40


def test_path_traversal_in_catalogue_rows_is_never_served(service, client, examples):
    # served from the path verified at load time: an edited row is never read (safe_path: unit tests)
    (fx, _), image_id = service, examples["images"][3]["id"]
    before = client.get(f"/images/{image_id}").content
    secret = fx.data_dir.parent / "secret.png"
    secret.write_bytes(png())
    engine = make_engine(fx.catalogue_url)

    def set_path(path: str) -> None:
        with engine.begin() as conn:
            conn.execute(update(ImageRow).where(ImageRow.id == image_id).values(path=path))

    try:
        with engine.connect() as conn:
            original = conn.execute(select(ImageRow.path).where(ImageRow.id == image_id)).scalar()
        for evil in ("../secret.png", "synth/../../secret.png", str(secret), "/etc/passwd"):
            set_path(evil)
            for params in ({}, {"size": 32}):
                r = client.get(f"/images/{image_id}", params=params)
                assert r.status_code == 200 and (params or r.content == before), r.text
        set_path(original)
    finally:
        engine.dispose()
    assert client.get(f"/images/{image_id}").status_code == 200


def test_failures_and_negatives_bad_parameters(client):
    assert_error(client.get("/failures", params={"direction": "x2y"}), 422, "direction")
    assert_error(client.get("/failures", params={"which": "none"}), 422, "which")
    assert_error(client.get("/failures", params={"limit": 0}), 422, "limit")
    assert_error(client.get("/failures", params={"models": "aoq"}), 422, "two names")
    assert_error(client.get("/failures", params={"models": "aoq,pixels"}), 422, "different galleries")
    assert_error(client.get("/negatives", params={"kind": "caption", "id": 1, "model": "baseline"}), 404, "no mined negatives")
    assert_error(client.get("/negatives", params={"kind": "caption", "id": 1, "model": "aoq"}), 404, "not a training caption")
    assert_error(client.get("/negatives", params={"kind": "word", "id": 1, "model": "aoq"}), 422, "kind")
    assert_error(client.get("/examples", params={"split": "nosuch"}), 404, "not catalogued")
    assert_error(client.get("/examples", params={"dataset": "nosuch"}), 404, "unknown dataset")


def test_unknown_route_and_method_are_json(client):
    assert_error(client.get("/nowhere"), 404)
    assert_error(client.get("/search/text"), 405)
