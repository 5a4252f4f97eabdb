"""The UI's HTTP client against a fake search service (httpx.MockTransport): requests sent,
answers parsed, and every failure mapped to a BackendError with a message fit for the page."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest

from aoq_cli import ui as ui_command
from tests.ui_fake_backend import BASE, FakeBackend, text_answer
from aoq_ui.client import (
    DEFAULT_BACKEND_URL,
    BackendClient,
    BackendError,
    BackendUnavailable,
    format_detail,
    rewrite_urls,
)


def _client(handler) -> BackendClient:
    return BackendClient(BASE, transport=httpx.MockTransport(handler))


def test_health_and_models_are_parsed():
    fake = FakeBackend()
    client = fake.client()
    health = client.health()
    assert (health.status, health.models, health.version) == ("ok", ["baseline", "aoq"], "0.1.0")
    models = client.models()
    assert [(m.name, m.role, m.loss) for m in models] == [("baseline", "baseline", "max_violation"),
                                                         ("aoq", "aoq", "adaptive_offline_quintuplet")]
    assert [str(r.url) for r in fake.requests] == [f"{BASE}/health", f"{BASE}/models"]


def test_examples_sends_split_and_n():
    fake = FakeBackend()
    examples = fake.client().examples("train", 3)
    assert fake.requests[0].url.params == httpx.QueryParams({"split": "train", "n": "3"})
    assert [c.id for c in examples.captions] == [100, 101, 102]
    # pictures come through the UI's own relay unless the client was given a public URL
    assert [i.thumbnail_url for i in examples.images] == [f"/media/images/{i}?size=64" for i in (100, 101, 102)]


def test_compare_text_sends_the_contract_body_and_parses_both_sides():
    fake = FakeBackend()
    answer = fake.client().compare_text("red square number 0", ["baseline", "aoq"], k=2)
    request = fake.requests[0]
    assert (request.method, request.url.path) == ("POST", "/compare/text")
    assert json.loads(request.content) == {"query": "red square number 0", "models": ["baseline", "aoq"], "k": 2,
                                           "scope": "all", "normalise": "none"}
    assert (answer.left.model, answer.left.ground_truth_rank, answer.left.caption_id) == ("baseline", 3, 0)
    assert [(h.image_id, h.name, h.split) for h in answer.left.results] == [(4, "flag: Japan", "train"),
                                                                            (2, "blue square", "test")]
    assert [h.is_ground_truth for h in answer.right.results] == [True, False]
    assert answer.left.context.positives == "text" and answer.left.ground_truth_ids == [0, 1]


def test_compare_text_without_models_lets_the_backend_choose():
    fake = FakeBackend()
    fake.client().compare_text("anything", None, k=1, scope="test")
    assert json.loads(fake.requests[0].content) == {"query": "anything", "k": 1, "scope": "test", "normalise": "none"}


def test_compare_image_by_id_sends_form_fields():
    fake = FakeBackend()
    answer = fake.client().compare_image(image_id=0, models=["baseline", "aoq"], k=3)
    body = fake.requests[0].content
    assert b'name="image_id"\r\n\r\n0' in body and b'name="models"\r\n\r\nbaseline,aoq' in body
    assert b'name="k"\r\n\r\n3' in body and b'name="scope"\r\n\r\nall' in body and b"filename=" not in body
    assert b'name="normalise"\r\n\r\nnone' in body
    fake.client().compare_image(image_id=0, k=3, scope="test", normalise="qbnorm")
    assert b'name="normalise"\r\n\r\nqbnorm' in fake.requests[1].content
    assert [(h.caption_id, h.copies) for h in answer.left.results] == [(12, 1), (0, 2), (1, 2)]
    assert answer.left.ground_truth_rank == 2 and answer.right.ground_truth_rank == 1


def test_compare_image_upload_sends_the_file_as_png(tmp_path):
    fake = FakeBackend()
    path = tmp_path / "query.png"
    path.write_bytes(b"\x89PNG fake bytes")
    fake.client().compare_image(file=path, k=1)
    body = fake.requests[0].content
    assert b'filename="query.png"' in body and b"Content-Type: image/png" in body
    assert b"\x89PNG fake bytes" in body and b'name="models"' not in body


def test_compare_image_needs_exactly_one_source(tmp_path):
    client = FakeBackend().client()
    with pytest.raises(ValueError, match="exactly one"):
        client.compare_image(k=1)
    with pytest.raises(ValueError, match="exactly one"):
        client.compare_image(image_id=1, file=tmp_path / "x.png")


def test_unreadable_upload_is_a_backend_error_naming_the_file(tmp_path):
    with pytest.raises(BackendError, match="cannot read the uploaded image .*missing.png"):
        FakeBackend().client().compare_image(file=tmp_path / "missing.png")


def test_failures_and_negatives_send_their_parameters():
    fake = FakeBackend()
    client = fake.client()
    failures = client.failures("i2t", "both", 5, ["aoq", "baseline"], offset=5)
    assert fake.requests[0].url.params == httpx.QueryParams(
        {"direction": "i2t", "which": "both", "limit": "5", "offset": "5", "models": "aoq,baseline"})
    assert (failures.left, failures.right, failures.total, failures.items[0].image_url) == (
        "aoq", "baseline", 7, "/media/images/2")
    negatives = client.negatives("image", 4, "aoq", 2)
    assert fake.requests[1].url.params == httpx.QueryParams({"kind": "image", "id": "4", "model": "aoq", "n": "2"})
    assert [n.text for n in negatives.offline] == ["a blue <b>square</b>"]
    client.negatives("caption", 4, "aoq", 2, seed=7)
    assert fake.requests[2].url.params["seed"] == "7"


def test_gallery_pages_and_pictures_for_the_relay():
    fake = FakeBackend()
    client = fake.client()
    page = client.gallery("test", "square", 1, 2)
    assert fake.requests[0].url.params == httpx.QueryParams({"scope": "test", "q": "square", "offset": "1",
                                                             "limit": "2"})
    assert (page.total, [i.image_id for i in page.images]) == (4, [1, 2])
    assert page.images[0].thumbnail_url == "/media/images/1?size=64"
    assert client.image(3, 64) == (b"\x89PNG\r\n\x1a\n fake picture", "image/png")
    assert fake.requests[-1].url.params == httpx.QueryParams({"size": "64"})
    with pytest.raises(BackendError, match="no image with id 99") as caught:
        client.image(99)
    assert caught.value.status == 404
    assert [d.name for d in client.datasets()] == ["synth"]


def test_metrics_quotes_the_model_name():
    seen = []

    def handler(request):
        seen.append(request.url.raw_path)
        return httpx.Response(404, json={"detail": "unknown model"})

    with pytest.raises(BackendError):
        _client(handler).metrics("my model/2")
    assert seen == [b"/metrics/my%20model%2F2"]


def test_backend_down_is_unavailable_with_a_hint():
    fake = FakeBackend(down=True)
    with pytest.raises(BackendUnavailable) as info:
        fake.client().health()
    message = str(info.value)
    assert message.startswith(f"The search service at {BASE} is not reachable (ConnectError")
    assert "aoq serve" in message and "AOQ_BACKEND_URL" in message
    assert info.value.status is None


def test_timeout_is_unavailable():
    def handler(request):
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(BackendUnavailable, match=r"did not answer GET /models in time \(ReadTimeout\)"):
        _client(handler).models()


def test_4xx_detail_becomes_the_message():
    fake = FakeBackend()
    with pytest.raises(BackendError) as info:
        fake.client().compare_text("q", ["baseline", "nope"], 1)
    assert not isinstance(info.value, BackendUnavailable)
    assert info.value.status == 404
    assert str(info.value) == "unknown model 'nope'; known: ['baseline', 'aoq']"
    assert info.value.detail == str(info.value)


def test_422_problem_list_is_flattened():
    with pytest.raises(BackendError) as info:
        FakeBackend().client().compare_text("", None, 1)
    assert (str(info.value), info.value.status) == ("query: String should have at least 1 character", 422)

    def handler(request):
        return httpx.Response(422, json={"detail": "body.query: a; query.k: b", "errors": [
            {"type": "x", "loc": ["body", "query"], "msg": "a"}, {"type": "y", "loc": ["query", "k"], "msg": "b"}]})

    with pytest.raises(BackendError, match=r"^query: a; k: b$"):
        _client(handler).compare_text("q")


def test_error_without_a_problem_list_uses_the_detail():
    def handler(request):
        return httpx.Response(409, json={"detail": "the index is being rebuilt", "errors": None})

    with pytest.raises(BackendError, match=r"^the index is being rebuilt$"):
        _client(handler).compare_text("q")


def test_5xx_says_the_service_failed():
    fake = FakeBackend(fail={"/failures": (500, "index and catalogue disagree")})
    with pytest.raises(BackendError, match=r"^The search service failed on GET /failures \(HTTP 500\): "
                                           r"index and catalogue disagree$"):
        fake.client().failures("t2i", "both")


def test_error_without_json_uses_the_body_text():
    def handler(request):
        return httpx.Response(502, text="Bad gateway from the proxy")

    with pytest.raises(BackendError, match=r"\(HTTP 502\): Bad gateway from the proxy$"):
        _client(handler).health()


def test_success_that_is_not_json_is_an_error():
    def handler(request):
        return httpx.Response(200, text="<html>hello</html>")

    with pytest.raises(BackendError, match="answered GET /health with something that is not JSON"):
        _client(handler).health()


def test_wrong_shape_names_the_field():
    left = {key: value for key, value in text_answer("a", "q", [1], 1).items() if key != "results"}

    def handler(request):
        return httpx.Response(200, json={"query": "q", "left": left, "right": {}})

    with pytest.raises(BackendError, match=r"unexpected shape: left\.results: Field required \(\d+ problem"):
        _client(handler).compare_text("q")


def test_mistyped_field_is_an_error_and_unknown_fields_are_ignored():
    answer = text_answer("a", "q", [1], 1)

    def handler(request):
        return httpx.Response(200, json={"query": "q", "left": answer, "right": answer, "new_field": [1]})

    assert _client(handler).compare_text("q").right.results[0].image_id == 1
    answer["results"][0]["score"] = "high"
    with pytest.raises(BackendError, match=r"shape: left\.results\.0\.score: Input should be a valid number"):
        _client(handler).compare_text("q")


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ("plain", "plain"),
        (None, ""),
        ([{"loc": ["query", "n"], "msg": "too big"}], "n: too big"),
        ([{"loc": [], "msg": "bad"}, "odd"], "bad; odd"),
        ({"weird": 1}, "{'weird': 1}"),
    ],
)
def test_format_detail(detail, expected):
    assert format_detail(detail) == expected


def test_image_urls_are_rewritten_for_the_browser():
    fake = FakeBackend()
    examples = fake.client(public_url="http://public:9").examples("test", 1)
    assert (examples.images[0].image_url, examples.images[0].thumbnail_url) == (
        "http://public:9/images/0", "http://public:9/images/0?size=64")
    client = BackendClient(BASE, public_url="http://public:9")
    assert client.browser_url(f"{BASE}/images/3?size=9") == "http://public:9/images/3?size=9"
    assert client.browser_url("http://elsewhere/x.png") == "http://elsewhere/x.png"
    assert client.browser_url(f"{BASE}.evil/x.png") == f"{BASE}.evil/x.png"
    relayed = fake.client()  # no public URL: the UI's own server relays the pictures
    assert relayed.browser_url("/images/1") == "/media/images/1"
    assert relayed.browser_url("http://service.internal:8000/images/5?size=64") == "/media/images/5?size=64"
    assert relayed.browser_url("http://elsewhere/x.png") == "http://elsewhere/x.png"


def test_rewrite_urls_reaches_nested_url_fields_only():
    answer = {"image_url": "/images/1", "items": [{"thumbnail_url": "/t", "text": "/images/2", "id": 3}],
              "left": {"image_url": None, "results": [{"image_url": "/images/4"}]}}
    assert rewrite_urls(answer, str.upper) == {
        "image_url": "/IMAGES/1", "items": [{"thumbnail_url": "/T", "text": "/images/2", "id": 3}],
        "left": {"image_url": None, "results": [{"image_url": "/IMAGES/4"}]}}
    assert answer["image_url"] == "/images/1"  # the input is left as it was


def test_trailing_slash_and_public_url():
    client = BackendClient("http://host:9/", public_url="http://public:9/")
    assert (client.base_url, client.public_url) == ("http://host:9", "http://public:9")
    assert BackendClient("http://host:9").public_url is None


def _parse_ui(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ui_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_aoq_ui_options_and_environment(monkeypatch):
    monkeypatch.delenv("AOQ_BACKEND_URL", raising=False)
    monkeypatch.delenv("AOQ_PUBLIC_BACKEND_URL", raising=False)
    args = _parse_ui([])
    assert (args.backend, args.public_backend_url, args.host, args.port, args.concurrency) == (
        DEFAULT_BACKEND_URL, None, "127.0.0.1", 7860, 4)
    monkeypatch.setenv("AOQ_BACKEND_URL", "http://service:8000")
    monkeypatch.setenv("AOQ_PUBLIC_BACKEND_URL", "http://localhost:8000")
    args = _parse_ui(["--port", "7999"])
    assert (args.backend, args.public_backend_url, args.port) == ("http://service:8000", "http://localhost:8000", 7999)
    assert _parse_ui(["--backend", "http://other:1"]).backend == "http://other:1"
    with pytest.raises(SystemExit):
        _parse_ui(["--concurrency", "0"])
