"""A fake search service for the UI's unit tests: canned answers that follow docs/api.md.

``FakeBackend`` is an ``httpx.MockTransport`` handler. It serves two models (``baseline`` and
``aoq``) over 4 images x 5 captions, records every request, and can be told to fail: a model
may be missing, any path may answer with a given status and detail, or the whole service may be
"down" (connection refused). ``tests/test_contract.py`` checks every answer it gives against the
real service's OpenAPI document, so the fake cannot drift from the contract.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from aoq_serve.schemas import MAX_QUERY_CHARS
from aoq_ui.client import BackendClient

BASE = "http://backend.test"
#: (method, path as OpenAPI writes it) -> the FakeBackend method that answers it
ROUTES = {
    ("GET", "/health"): "_health",
    ("GET", "/models"): "_models",
    ("GET", "/examples"): "_examples",
    ("POST", "/compare/text"): "_compare_text",
    ("POST", "/compare/image"): "_compare_image",
    ("GET", "/failures"): "_failures",
    ("GET", "/metrics/{model}"): "_metrics",
    ("GET", "/negatives"): "_negatives",
}

MODELS = [
    {"name": "baseline", "role": "baseline", "loss": "max_violation", "image_encoder": "vse",
     "image_input": "features", "checkpoint_hash": "aaa", "dataset": "synth", "enabled": True,
     "disabled_reason": None, "metrics": {}},
    {"name": "aoq", "role": "aoq", "loss": "adaptive_offline_quintuplet", "image_encoder": "vse",
     "image_input": "features", "checkpoint_hash": "bbb", "dataset": "synth", "enabled": True,
     "disabled_reason": None, "metrics": {}},
]
CAPTIONS = {i * 5 + j: (f"a {colour} square number {j}", i) for i, colour in
            enumerate(["red", "green", "blue", "yellow"]) for j in range(5)}


def image_hit(rank: int, image_id: int, score: float, gt: bool) -> dict[str, Any]:
    return {"rank": rank, "image_id": image_id, "score": score, "image_url": f"/images/{image_id}",
            "thumbnail_url": f"/images/{image_id}?size=64", "is_ground_truth": gt}


def text_answer(model: str, query: str, order: list[int], k: int) -> dict[str, Any]:
    """A text->image answer whose ranking is ``order``; the ground truth is image 0 when the
    query is caption 0's text, and unknown otherwise."""
    known = query == CAPTIONS[0][0]
    gt = [0] if known else []
    return {
        "model": model, "query": query, "caption_id": 0 if known else None, "ground_truth_ids": gt,
        "ground_truth_rank": order.index(0) + 1 if known else None,
        "results": [image_hit(r + 1, i, round(0.9 - 0.1 * r, 3), i in gt) for r, i in enumerate(order[:k])],
        "latency_ms": 1.5,
    }


def image_answer(model: str, image_id: int | None, order: list[int], k: int) -> dict[str, Any]:
    gt = [c for c, (_, img) in CAPTIONS.items() if img == image_id] if image_id is not None else []
    ranks = [r + 1 for r, c in enumerate(order) if c in gt]
    return {
        "model": model, "image_id": image_id, "ground_truth_ids": gt,
        "ground_truth_rank": ranks[0] if ranks else None,
        "results": [{"rank": r + 1, "caption_id": c, "text": CAPTIONS[c][0], "image_id": CAPTIONS[c][1],
                     "score": round(0.8 - 0.05 * r, 3), "is_ground_truth": c in gt}
                    for r, c in enumerate(order[:k])],
        "latency_ms": 2.0,
    }


# The baseline ranks the ground truth of caption 0 third, AOQ first (a "baseline_only" failure).
ORDERS_T2I = {"baseline": [2, 1, 0, 3], "aoq": [0, 2, 1, 3]}
ORDERS_I2T = {"baseline": [7, 0, 1, 12, 2], "aoq": [0, 1, 7, 2, 3]}

METRICS = {
    "tables": {"full": {"i2t": {"r1": 40.0, "r5": 70.0, "r10": 80.0, "medr": 2.0, "meanr": 5.5},
                        "t2i": {"r1": 30.0, "r5": 60.0, "r10": 75.0, "medr": 3.0, "meanr": 7.25},
                        "rsum": 355.0}},
    "curves": [{"epoch": 0, "round": 1, "i2t_r1": 20.0, "t2i_r1": 15.0, "rsum": 200.0},
               {"epoch": 1, "round": 1, "i2t_r1": 35.0, "t2i_r1": 25.0, "rsum": 300.0}],
    "rank_histogram": {"bins": ["1", "2-5", "6-20", ">20"], "counts": [5, 3, 1, 1]},
}


@dataclass
class FakeBackend:
    """Callable transport handler; set the attributes to change how it answers."""

    models: list[dict[str, Any]] = field(default_factory=lambda: [dict(m) for m in MODELS])
    down: bool = False
    fail: dict[str, tuple[int, Any]] = field(default_factory=dict)  # path -> (status, detail)
    requests: list[httpx.Request] = field(default_factory=list)

    def client(self, public_url: str | None = None) -> BackendClient:
        return BackendClient(BASE, public_url=public_url, transport=httpx.MockTransport(self))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        path = request.url.path
        if path in self.fail:
            status, detail = self.fail[path]
            return httpx.Response(status, json={"detail": detail})
        template = match_template(path, {t for m, t in ROUTES if m == request.method})
        if template is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return getattr(self, ROUTES[request.method, template])(request)

    def _names(self) -> list[str]:
        return [m["name"] for m in self.models if m["enabled"]]

    def _pair(self, models: list[str] | None) -> tuple[str, str] | httpx.Response:
        pair = models or ["baseline", "aoq"]
        for name in pair:
            if name not in self._names():
                return httpx.Response(404, json={"detail": f"unknown model '{name}'; known: {self._names()}"})
        return pair[0], pair[1]

    def _health(self, request: httpx.Request) -> httpx.Response:
        disabled = {m["name"]: m["disabled_reason"] for m in self.models if not m["enabled"]}
        return httpx.Response(200, json={"status": "ok", "models": self._names(), "disabled": disabled,
                                         "version": "0.1.0"})

    def _models(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=self.models)

    def _examples(self, request: httpx.Request) -> httpx.Response:
        n = int(request.url.params.get("n", 8))
        start = 0 if request.url.params.get("split", "test") == "test" else 100
        return httpx.Response(200, json={
            "dataset": "synth", "split": request.url.params.get("split", "test"),
            "captions": [{"id": start + c, "text": CAPTIONS[c][0], "image_id": start + CAPTIONS[c][1]}
                         for c in list(CAPTIONS)[:n]],
            "images": [{"id": start + i, "image_url": f"/images/{start + i}",
                        "thumbnail_url": f"/images/{start + i}?size=64"} for i in range(min(n, 4))],
        })

    def _compare_text(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        query, k = body["query"], body.get("k", 10)
        if not query:
            return _invalid("query", "string_too_short", "String should have at least 1 character")
        if len(query) > MAX_QUERY_CHARS:
            return _invalid("query", "string_too_long", f"String should have at most {MAX_QUERY_CHARS} characters")
        pair = self._pair(body.get("models"))
        if isinstance(pair, httpx.Response):
            return pair
        return httpx.Response(200, json={"query": query, "left": text_answer(pair[0], query, ORDERS_T2I[pair[0]], k),
                                         "right": text_answer(pair[1], query, ORDERS_T2I[pair[1]], k)})

    def _compare_image(self, request: httpx.Request) -> httpx.Response:
        form = _multipart_fields(request)
        pair = self._pair(form["models"].split(",") if form.get("models") else None)
        if isinstance(pair, httpx.Response):
            return pair
        image_id = int(form["image_id"]) if "image_id" in form else None
        k = int(form.get("k", 10))
        return httpx.Response(200, json={"left": image_answer(pair[0], image_id, ORDERS_I2T[pair[0]], k),
                                         "right": image_answer(pair[1], image_id, ORDERS_I2T[pair[1]], k)})

    def _failures(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        pair = self._pair(params["models"].split(",") if "models" in params else None)
        if isinstance(pair, httpx.Response):
            return pair
        direction = params["direction"]
        item = ({"query_id": 0, "query_text": CAPTIONS[0][0], "image_id": 0, "left_rank": 3, "right_rank": 1}
                if direction == "t2i"
                else {"query_id": 1, "image_url": "/images/1", "image_id": 1, "left_rank": 4, "right_rank": 1})
        return httpx.Response(200, json={"direction": direction, "which": params["which"], "left": pair[0],
                                         "right": pair[1], "total": 7, "items": [item]})

    def _metrics(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[-1]
        if name not in self._names():
            return httpx.Response(404, json={"detail": f"unknown model '{name}'"})
        return httpx.Response(200, json={"model": name, **METRICS})

    def _negatives(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        kind, item_id = params["kind"], int(params["id"])
        if kind == "caption":
            anchor = {"text": "a red square"}
            offline = [{"id": 3, "image_url": "/images/3", "rank": 1}]
            online = [{"id": 2, "image_url": "/images/2", "score": 0.41}]
        else:
            anchor = {"image_url": f"/images/{item_id}"}
            offline = [{"id": 7, "text": "a blue <b>square</b>", "rank": 1}]
            online = [{"id": 12, "text": "a yellow square", "score": 0.3}]
        return httpx.Response(200, json={"model": params["model"], "kind": kind, "id": item_id, **anchor,
                                         "offline": offline, "online": online})


def match_template(path: str, templates: set[str]) -> str | None:
    """The OpenAPI path template (``/metrics/{model}``) that a concrete path matches, if any."""
    for template in sorted(templates):
        if re.fullmatch(re.sub(r"\{[^/}]+\}", "[^/]+", template), path):
            return template
    return None


def _invalid(field_name: str, kind: str, msg: str) -> httpx.Response:
    """The service's 422 for one invalid body field: the problem on one line, and as a list."""
    return httpx.Response(422, json={"detail": f"body.{field_name}: {msg}", "errors": [
        {"type": kind, "loc": ["body", field_name], "msg": msg}]})


def _multipart_fields(request: httpx.Request) -> dict[str, str]:
    """The plain (non-file) fields of a multipart body, enough to route the fake."""
    boundary = request.headers["content-type"].split("boundary=")[1].encode()
    fields = {}
    for part in request.content.split(b"--" + boundary):
        head, _, value = part.partition(b"\r\n\r\n")
        if b'name="' in head and b"filename=" not in head:
            name = head.split(b'name="')[1].split(b'"')[0].decode()
            fields[name] = value.rstrip(b"\r\n").decode()
        elif b"filename=" in head:
            fields["file"] = head.split(b'filename="')[1].split(b'"')[0].decode()
    return fields
