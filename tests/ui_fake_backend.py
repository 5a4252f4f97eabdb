"""A fake search service for the UI's unit tests: canned answers that follow docs/api.md.

``FakeBackend`` is an ``httpx.MockTransport`` handler. It serves two models (``baseline`` and
``aoq``, evaluated with the text rule) over 4 test images x 5 captions, images 0 and 1 being
twins (the same five captions), and 2 training images; it records every request, and can be
told to fail: a model may be missing, any path may answer with a given status and detail, or
the whole service may be "down" (connection refused). ``tests/test_contract.py`` checks every answer it gives against the
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
    ("GET", "/datasets"): "_datasets",
    ("GET", "/examples"): "_examples",
    ("GET", "/gallery"): "_gallery",
    ("GET", "/images/{image_id}"): "_image",
    ("POST", "/compare/text"): "_compare_text",
    ("POST", "/compare/image"): "_compare_image",
    ("GET", "/failures"): "_failures",
    ("GET", "/metrics/{model}"): "_metrics",
    ("GET", "/negatives"): "_negatives",
}

EVALUATED = {"split": "test", "n_images": 4, "protocol": None, "positives": "text", "seeds": [0]}
SELECTED = {"split": "dev", "n_images": 2, "protocol": "full", "positives": "text", "seeds": [0]}
MODELS = [
    {"name": "baseline", "role": "baseline", "loss": "max_violation", "image_encoder": "vse",
     "image_input": "features", "checkpoint_hash": "aaa", "dataset": "synth", "enabled": True,
     "disabled_reason": None, "metrics": {"rsum": 171.6}, "metrics_measured": SELECTED, "evaluated": EVALUATED},
    {"name": "aoq", "role": "aoq", "loss": "adaptive_offline_quintuplet", "image_encoder": "vse",
     "image_input": "features", "checkpoint_hash": "bbb", "dataset": "synth", "enabled": True,
     "disabled_reason": None, "metrics": {"rsum": 165.5}, "metrics_measured": SELECTED, "evaluated": EVALUATED},
]
#: image id -> (name, split); 0 and 1 are twins, 4 and 5 training pictures
IMAGES = {0: ("red square", "test"), 1: ("red square", "test"), 2: ("blue square", "test"),
          3: ("yellow square", "test"), 4: ("flag: Japan", "train"), 5: ("green square", "train")}
CAPTIONS = {i * 5 + j: (f"{IMAGES[i][0]} number {j}", i) for i in IMAGES for j in range(5)}
PNG = b"\x89PNG\r\n\x1a\n fake picture"


def gallery_image(image_id: int) -> dict[str, Any]:
    name, split = IMAGES[image_id]
    return {"image_id": image_id, "name": name, "split": split, "image_url": f"/images/{image_id}",
            "thumbnail_url": f"/images/{image_id}?size=64"}


def image_hit(rank: int, image_id: int, score: float, gt: bool) -> dict[str, Any]:
    return {**gallery_image(image_id), "rank": rank, "score": score, "is_ground_truth": gt}


def _context(scope: str, searched: int, normalise: str) -> dict[str, Any]:
    return {"scope": scope, "searched": searched, "eval_split": "test", "positives": "text", "normalise": normalise,
            "normalised": normalise == "invsoftmax"}


def bank_refusal(scope: str, normalise: str) -> httpx.Response | None:
    """The service's 422 for a hubness correction in scope all, which holds the bank's split."""
    if scope != "all" or normalise == "none":
        return None
    return httpx.Response(422, json={"detail": (
        f"hubness correction {normalise!r} is refused in scope 'all': it holds the train split, whose items are "
        "the correction's own bank, so every train item would be pushed down; search scope 'test' (the "
        "evaluation split, disjoint from the bank) or use normalise 'none'")})


def text_answer(model: str, query: str, order: list[int], k: int, scope: str = "all", normalise: str = "none",
                intended: str | None = None) -> dict[str, Any]:
    """A text->image answer whose ranking is ``order`` (the test split's part of it in scope
    test); a query (or ``intended`` answer) equal to a caption of the twins has both as ground
    truth, other text none."""
    beyond = next((r for r, i in enumerate(order[:k]) if IMAGES[i][1] != "test"), None)
    outside = None if scope == "all" or beyond is None else image_hit(beyond + 1, order[beyond], 0.95, False)
    if scope == "test":
        order = [i for i in order if IMAGES[i][1] == "test"]
    known = (intended or query) in (CAPTIONS[0][0], CAPTIONS[5][0])
    gt = [0, 1] if known else []
    ranks = [r + 1 for r, i in enumerate(order) if i in gt]
    return {
        "model": model, "query": query, "intended": intended, "caption_id": 0 if known else None, "query_split": "test" if known else None,
        "context": _context(scope, 4 if scope == "test" else 6, normalise), "ground_truth_ids": gt,
        "ground_truth": [gallery_image(i) for i in gt], "scope_rank": ranks[0] if ranks else None,
        "ground_truth_rank": ranks[0] if ranks else None,
        "results": [image_hit(r + 1, i, round(0.9 - 0.1 * r, 3), i in gt) for r, i in enumerate(order[:k])],
        "outside": outside,
        "latency_ms": 1.5,
    }


def image_answer(model: str, image_id: int | None, order: list[int], k: int, scope: str = "all",
                 normalise: str = "none") -> dict[str, Any]:
    """An image->text answer listing the captions ``order`` (a caption of the twins stands for
    its two copies, as the text rule lists it)."""
    own = {CAPTIONS[c][0] for c, (_, img) in CAPTIONS.items() if img == image_id}
    gt = [c for c, (text, _) in CAPTIONS.items() if text in own]
    rows, rank = [], 1
    for c in order[:k]:
        text, img = CAPTIONS[c]
        copies = 2 if img in (0, 1) else 1
        rows.append({"rank": rank, "caption_id": c, "text": text, "copies": copies, "image_id": img,
                     "image_name": IMAGES[img][0], "split": IMAGES[img][1], "thumbnail_url": f"/images/{img}?size=64",
                     "score": round(0.8 - 0.05 * len(rows), 3), "is_ground_truth": text in own})
        rank += copies
    marked = [r["rank"] for r in rows if r["is_ground_truth"]]
    return {
        "model": model, "image_id": image_id, "query": None if image_id is None else gallery_image(image_id),
        "context": _context(scope, 20 if scope == "test" else 30, normalise), "ground_truth_ids": gt,
        "ground_truth_texts": sorted(own), "scope_rank": marked[0] if marked else None,
        "ground_truth_rank": marked[0] if marked else None, "results": rows, "outside": None, "latency_ms": 2.0,
    }


# The baseline ranks the twins of caption 0 third and fourth, AOQ first and third.
ORDERS_T2I = {"baseline": [4, 2, 0, 1, 3, 5], "aoq": [0, 2, 1, 3, 4, 5]}
ORDERS_I2T = {"baseline": [12, 0, 1, 22, 2], "aoq": [0, 1, 12, 2, 3]}

METRICS = {
    "measured": EVALUATED,
    "curves_measured": {**EVALUATED, "split": "dev", "n_images": None},
    "tables": {"full": {"i2t": {"r1": 40.0, "r5": 70.0, "r10": 80.0, "medr": 2.0, "meanr": 5.5},
                        "t2i": {"r1": 30.0, "r5": 60.0, "r10": 75.0, "medr": 3.0, "meanr": 7.25},
                        "rsum": 355.0}},
    "curves": [{"epoch": 1, "round": 1, "i2t_r1": 20.0, "t2i_r1": 15.0, "rsum": 200.0},
               {"epoch": 2, "round": 1, "i2t_r1": 35.0, "t2i_r1": 25.0, "rsum": 300.0}],
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

    def _datasets(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=[{"name": "synth", "n_images": 6, "n_captions": 30, "synthetic": True,
                                          "splits": {"test": {"images": 4, "captions": 20},
                                                     "train": {"images": 2, "captions": 10}}}])

    def _examples(self, request: httpx.Request) -> httpx.Response:
        n = int(request.url.params.get("n", 8))
        start = 0 if request.url.params.get("split", "test") == "test" else 100
        return httpx.Response(200, json={
            "dataset": "synth", "split": request.url.params.get("split", "test"),
            "captions": [{"id": start + c, "text": CAPTIONS[c][0], "image_id": start + CAPTIONS[c][1]}
                         for c in list(CAPTIONS)[:n]],
            "images": [{"id": start + i, "image_url": f"/images/{start + i}", "name": IMAGES[i][0],
                        "thumbnail_url": f"/images/{start + i}?size=64"} for i in range(min(n, 4))],
        })

    def _gallery(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        scope, query = params.get("scope", "all"), params.get("q", "").lower()
        offset, limit = int(params.get("offset", 0)), int(params.get("limit", 24))
        found = [i for i, (name, split) in IMAGES.items() if (scope == "all" or split == "test") and query in name]
        return httpx.Response(200, json={"dataset": "synth", "scope": scope, "query": params.get("q", ""),
                                         "total": len(found), "offset": offset,
                                         "images": [gallery_image(i) for i in found[offset:offset + limit]]})

    def _image(self, request: httpx.Request) -> httpx.Response:
        image_id = int(request.url.path.rsplit("/", 1)[-1])
        if image_id not in IMAGES:
            return httpx.Response(404, json={"detail": f"no image with id {image_id}"})
        return httpx.Response(200, content=PNG, headers={"content-type": "image/png"})

    def _compare_text(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        query, k, scope = body["query"], body.get("k", 10), body.get("scope", "all")
        normalise = body.get("normalise", "none")
        if not query:
            return _invalid("query", "string_too_short", "String should have at least 1 character")
        if len(query) > MAX_QUERY_CHARS:
            return _invalid("query", "string_too_long", f"String should have at most {MAX_QUERY_CHARS} characters")
        pair = self._pair(body.get("models"))
        if isinstance(pair, httpx.Response):
            return pair
        if refused := bank_refusal(scope, normalise):
            return refused
        intended = body.get("intended")
        return httpx.Response(200, json={
            "query": query, "left": text_answer(pair[0], query, ORDERS_T2I[pair[0]], k, scope, normalise, intended),
            "right": text_answer(pair[1], query, ORDERS_T2I[pair[1]], k, scope, normalise, intended)})

    def _compare_image(self, request: httpx.Request) -> httpx.Response:
        form = _multipart_fields(request)
        pair = self._pair(form["models"].split(",") if form.get("models") else None)
        if isinstance(pair, httpx.Response):
            return pair
        if form.get("file") == "bad.png":
            return httpx.Response(422, json={"detail": "the uploaded file is not an image Pillow can read "
                                                       "(cannot identify image file)"})
        image_id = int(form["image_id"]) if "image_id" in form else None
        k, scope, normalise = int(form.get("k", 10)), form.get("scope", "all"), form.get("normalise", "none")
        if refused := bank_refusal(scope, normalise):
            return refused
        return httpx.Response(200, json={
            "left": image_answer(pair[0], image_id, ORDERS_I2T[pair[0]], k, scope, normalise),
            "right": image_answer(pair[1], image_id, ORDERS_I2T[pair[1]], k, scope, normalise)})

    def _failures(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        pair = self._pair(params["models"].split(",") if "models" in params else None)
        if isinstance(pair, httpx.Response):
            return pair
        direction, offset = params["direction"], int(params.get("offset", 0))
        item = ({"query_id": 0, "query_text": CAPTIONS[0][0], "image_id": 0, "image_name": IMAGES[0][0],
                 "image_url": "/images/0", "thumbnail_url": "/images/0?size=64", "left_rank": 3, "right_rank": 1}
                if direction == "t2i"
                else {"query_id": 2, "image_url": "/images/2", "thumbnail_url": "/images/2?size=64", "image_id": 2,
                      "image_name": IMAGES[2][0], "left_rank": 4, "right_rank": 1.5})
        return httpx.Response(200, json={"direction": direction, "which": params["which"], "left": pair[0],
                                         "right": pair[1], "total": 7, "offset": offset, "measured": EVALUATED,
                                         "items": [item] if offset < 7 else []})

    def _metrics(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[-1]
        if name not in self._names():
            return httpx.Response(404, json={"detail": f"unknown model '{name}'"})
        return httpx.Response(200, json={"model": name, **METRICS})

    def _negatives(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        kind, item_id = params["kind"], int(params["id"])
        if kind == "caption":
            anchor = {"text": "a red square", "image_url": "/images/100"}
            offline = [{"id": 5, "text": "red square", "image_url": "/images/5?size=64", "rank": 1,
                        "removed_by": "identity"},
                       {"id": 3, "text": "yellow square", "image_url": "/images/3?size=64", "rank": 2}]
            online = [{"id": 2, "text": "blue square", "image_url": "/images/2?size=64", "score": 0.41}]
            anchor["filters"] = ["identity", "semantic"]
        else:
            anchor = {"text": "red square", "image_url": f"/images/{item_id}"}
            offline = [{"id": 7, "text": "a blue <b>square</b>", "image_url": "/images/1?size=64", "rank": 1}]
            online = [{"id": 12, "text": "a yellow square", "image_url": "/images/2?size=64", "score": 0.3}]
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
