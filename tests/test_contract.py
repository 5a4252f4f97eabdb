"""The fake search service of the UI tests (tests/ui_fake_backend.py) against the real one's
OpenAPI document: every route it serves exists there, every query parameter and JSON body the UI
client sends is declared there, and every answer it gives, errors included, fits the declared
response schema. A fake that drifts from the contract fails here, not in production."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema_rs
import pytest

from aoq.names import ROUND1_LOSSES, ROUND2_LOSSES
from aoq_serve.app import create_app
from aoq_serve.config import Settings
from tests.ui_fake_backend import BASE, MODELS, ROUTES, FakeBackend, match_template
from aoq_ui.client import BackendClient, BackendError

Exchange = tuple[httpx.Request, httpx.Response]


@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict[str, Any]:
    """The real application's document; building it loads no model and starts no server."""
    root = tmp_path_factory.mktemp("contract")
    settings = Settings(models_dir=root / "models", index_dir=root / "index", data_dir=root / "data")
    return create_app(settings).openapi()


def _closed(node: Any) -> Any:
    """A copy of a schema where every object with declared properties allows no others, so a
    renamed or invented field in the fake fails too (the real models ignore unknown fields)."""
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    closed = {key: _closed(value) for key, value in node.items()}
    if "properties" in closed and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


def _check(openapi: dict[str, Any], schema: dict[str, Any], instance: Any) -> list[str]:
    """Problems of ``instance`` against ``schema``, its ``$ref``s resolved in the document."""
    root = {**_closed(schema), "components": _closed(openapi["components"])}
    return [f"{'/'.join(map(str, e.instance_path)) or '(root)'}: {e.message}"
            for e in jsonschema_rs.validator_for(root).iter_errors(instance)]


def _operation(openapi: dict[str, Any], request: httpx.Request) -> tuple[str, dict[str, Any]]:
    template = match_template(request.url.path, set(openapi["paths"]))
    assert template is not None, f"{request.url.path} is not a path of the real service"
    operation = openapi["paths"][template].get(request.method.lower())
    assert operation is not None, f"the real service has no {request.method} {template}"
    return template, operation


def _response_problems(openapi: dict[str, Any], request: httpx.Request, response: httpx.Response) -> list[str]:
    template, operation = _operation(openapi, request)
    declared = operation["responses"].get(str(response.status_code))
    if declared is None:
        # Statuses a route does not declare (500, 404 of an unknown path) still come from the
        # app's error handlers, which all answer ErrorOut.
        assert response.status_code >= 400, f"{request.method} {template} does not declare {response.status_code}"
        schema = {"$ref": "#/components/schemas/ErrorOut"}
    else:
        content = declared["content"]
        media = response.headers.get("content-type", "").split(";")[0]
        if "application/json" not in content:  # a picture: its media type is the contract
            return [] if media in content else [f"{template} answers {media}, declared {sorted(content)}"]
        schema = content["application/json"]["schema"]
    return _check(openapi, schema, response.json())


def _request_problems(openapi: dict[str, Any], request: httpx.Request) -> list[str]:
    template, operation = _operation(openapi, request)
    declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
    problems = [f"query parameter {name!r} of {request.method} {template} is not declared"
                for name in request.url.params if name not in declared]
    content = operation.get("requestBody", {}).get("content", {})
    if request.headers.get("content-type") == "application/json":
        assert "application/json" in content, f"{request.method} {template} takes no JSON body"
        problems += _check(openapi, content["application/json"]["schema"], json.loads(request.content))
    return problems


def _recorded(fake: FakeBackend, exchanges: list[Exchange]) -> BackendClient:
    def handler(request: httpx.Request) -> httpx.Response:
        response = fake(request)
        exchanges.append((request, response))
        return response

    return BackendClient(BASE, transport=httpx.MockTransport(handler))


def _calls(tmp_path) -> list[tuple[str, dict[str, Any], Callable[[BackendClient], object]]]:
    """(what, FakeBackend arguments, client call): every answer of the fake, good and bad."""
    upload = tmp_path / "query.png"
    upload.write_bytes(b"\x89PNG not really")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"a text file")
    disabled = [MODELS[0], {**MODELS[1], "enabled": False, "disabled_reason": "index missing"}]
    return [
        ("health", {}, lambda c: c.health()),
        ("health with a disabled model", {"models": disabled}, lambda c: c.health()),
        ("models", {}, lambda c: c.models()),
        ("models with a disabled model", {"models": disabled}, lambda c: c.models()),
        ("datasets", {}, lambda c: c.datasets()),
        ("test examples", {}, lambda c: c.examples("test", 12)),
        ("gallery", {}, lambda c: c.gallery()),
        ("gallery, filtered, test scope, second page", {}, lambda c: c.gallery("test", "square", 2, 2)),
        ("a picture", {}, lambda c: c.image(3, 64)),
        ("a picture that does not exist", {}, lambda c: c.image(99)),
        ("train examples", {}, lambda c: c.examples("train", 3)),
        ("injected 404", {"fail": {"/examples": (404, "split 'test' is not catalogued")}},
         lambda c: c.examples()),
        ("injected 500", {"fail": {"/failures": (500, "internal error (logged on the server)")}},
         lambda c: c.failures("t2i", "both")),
        ("compare text", {}, lambda c: c.compare_text("a red square number 0", ["baseline", "aoq"], 3)),
        ("compare text, default models", {}, lambda c: c.compare_text("free text", None, 2)),
        ("compare text, test scope", {}, lambda c: c.compare_text("flag of Japan", None, 4, "test")),
        ("compare text, normalised", {}, lambda c: c.compare_text("flag of Japan", None, 4, "test", "qbnorm")),
        ("compare text, unknown model", {}, lambda c: c.compare_text("q", ["baseline", "gone"], 2)),
        ("compare text, empty query", {}, lambda c: c.compare_text("", None, 2)),
        ("compare text, long query", {}, lambda c: c.compare_text("x" * 1001, None, 2)),
        ("compare image by id", {}, lambda c: c.compare_image(image_id=0, models=["baseline", "aoq"], k=3)),
        ("compare image upload", {}, lambda c: c.compare_image(file=upload, k=2)),
        ("compare image, test scope", {}, lambda c: c.compare_image(image_id=2, k=2, scope="test")),
        ("compare image, normalised", {}, lambda c: c.compare_image(image_id=2, k=2, scope="test",
                                                                    normalise="invsoftmax")),
        ("compare image, normalised in the whole catalogue (refused)", {},
         lambda c: c.compare_image(image_id=2, k=2, normalise="invsoftmax")),
        ("compare text with an intended answer", {},
         lambda c: c.compare_text("a red one", None, 2, intended="red square number 0")),
        ("compare image, a bad upload", {}, lambda c: c.compare_image(file=bad, k=2)),
        ("compare image, unknown model", {}, lambda c: c.compare_image(image_id=1, models=["x", "aoq"])),
        ("failures t2i", {}, lambda c: c.failures("t2i", "baseline_only", 5, ["baseline", "aoq"])),
        ("failures i2t", {}, lambda c: c.failures("i2t", "both")),
        ("failures, a later page", {}, lambda c: c.failures("i2t", "both", 5, offset=5)),
        ("failures, unknown model", {}, lambda c: c.failures("i2t", "both", models=["baseline", "x"])),
        ("metrics", {}, lambda c: c.metrics("aoq")),
        ("metrics, unknown model", {}, lambda c: c.metrics("nope")),
        ("caption negatives", {}, lambda c: c.negatives("caption", 3, "aoq", 5)),
        ("image negatives", {}, lambda c: c.negatives("image", 4, "aoq", 2, seed=7)),
    ]


@pytest.fixture(scope="module")
def exchanges(tmp_path_factory) -> list[tuple[str, httpx.Request, httpx.Response]]:
    """Every call of ``_calls`` made through the UI client against the fake, recorded."""
    recorded = []
    for what, options, call in _calls(tmp_path_factory.mktemp("uploads")):
        seen: list[Exchange] = []
        try:
            call(_recorded(FakeBackend(**options), seen))
        except BackendError:
            pass  # the error answers are checked like the others
        assert len(seen) == 1, f"{what}: {len(seen)} requests"
        recorded.append((what, *seen[0]))
    return recorded


def test_every_route_of_the_fake_is_a_route_of_the_service(openapi):
    missing = [f"{method} {path}" for method, path in ROUTES
               if method.lower() not in openapi["paths"].get(path, {})]
    assert missing == []


def test_the_calls_cover_every_route_and_status_of_the_fake(exchanges):
    served = {(request.method, match_template(request.url.path, {t for _, t in ROUTES})) for _, request, _ in exchanges}
    assert served == set(ROUTES)
    assert {response.status_code for _, _, response in exchanges} == {200, 404, 422, 500}


def test_every_answer_of_the_fake_fits_the_real_schema(openapi, exchanges):
    problems = {f"{what} ({response.status_code})": found for what, request, response in exchanges
                if (found := _response_problems(openapi, request, response))}
    assert problems == {}


def test_every_request_the_fake_accepts_fits_the_real_schema(openapi, exchanges):
    """The client's requests as the service reads them (three 422 cases are invalid on purpose,
    one is valid and refused for what it asks: a hubness correction in the whole catalogue)."""
    accepted = [(what, request) for what, request, response in exchanges
                if response.status_code != 422 or "refused" in what]
    assert len(accepted) == len(exchanges) - 3
    problems = {what: found for what, request in accepted if (found := _request_problems(openapi, request))}
    assert problems == {}


def test_the_check_catches_a_renamed_and_an_invented_field(openapi):
    """The schema check itself can fail: the fake's real answer passes, doctored ones do not."""
    seen: list[Exchange] = []
    _recorded(FakeBackend(), seen).health()
    request, response = seen[0]
    body = response.json()
    assert _response_problems(openapi, request, response) == []
    renamed = {**{k: v for k, v in body.items() if k != "version"}, "versions": body["version"]}
    assert _response_problems(openapi, request, httpx.Response(200, json=renamed)) == [
        '(root): "version" is a required property',
        '(root): Additional properties are not allowed (\'versions\' was unexpected)',
    ]
    assert _response_problems(openapi, request, httpx.Response(200, json={**body, "models": "aoq"})) == [
        'models: "aoq" is not of type "array"']


def test_a_removed_negative_names_one_of_the_filters(openapi):
    """``removed_by`` is checked against the filters' names, not merely as a string."""
    seen: list[Exchange] = []
    _recorded(FakeBackend(), seen).negatives("caption", 3, "aoq", 5)
    request, response = seen[0]
    body = response.json()
    assert body["offline"][0]["removed_by"] == "identity" and _response_problems(openapi, request, response) == []
    body["offline"][0]["removed_by"] = "duplicate"
    problems = _response_problems(openapi, request, httpx.Response(200, json=body))
    assert problems == ['offline/0/removed_by: "duplicate" is not valid under any of the schemas listed in the \'anyOf\' keyword']


def test_the_fake_models_record_real_loss_names():
    """``loss`` is a plain string in the schema: its values are checked against the training
    configuration's names (what ``aoq index`` records) here."""
    assert [(m["role"], m["loss"] in ROUND1_LOSSES, m["loss"] in ROUND2_LOSSES) for m in MODELS] == [
        ("baseline", True, False), ("aoq", False, True)]
