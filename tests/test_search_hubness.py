"""The service's hubness correction (normalise: qbnorm | invsoftmax) against a brute-force
normalisation of the full score matrix, straight from the definition (docs/serving.md, Hubness
correction), on the service fixture: both directions in the test scope; the whole-catalogue scope,
which holds the bank's own training split, refused with 422; and an index built before
normalisation existed, which refuses it with 409 and still searches raw."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from aoq.checkpoint import load_checkpoint
from aoq.data.load import load_split
from aoq.embed import encode_split, encode_texts
from aoq.io import read_manifest
from tests.backend_helpers import SIZES, ServiceFixture, build_service_fixture, run_server, strip_hubness_bank

pytestmark = pytest.mark.slow
MODEL = "baseline"
BETA = 20.0


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[tuple[ServiceFixture, httpx.Client]]:
    fx = build_service_fixture(tmp_path_factory.mktemp("hubness"))
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield fx, client


@pytest.fixture(scope="module")
def arrays(service) -> dict:
    """The gallery as the index stores it, the bank embedded here, the ids by position."""
    fx, _ = service
    folder = fx.index_dir / MODEL
    ckpt = load_checkpoint(fx.models_dir / MODEL)
    bank_img, bank_cap = encode_split(ckpt.model, ckpt.vocab, load_split(ckpt.config.data, "train"))
    return {"ckpt": ckpt, "images": np.load(folder / "images.npy"), "captions": np.load(folder / "captions.npy"),
            "image_ids": np.load(folder / "image_ids.npy"), "caption_ids": np.load(folder / "caption_ids.npy"),
            "bank": {"images": bank_img, "captions": bank_cap}, "manifest": read_manifest(folder)}


def _test_span(manifest: dict, per_image: int = 1) -> slice:
    """The test split's positions: the manifest names the gallery's splits in position order."""
    start = 0
    for split in manifest["config"]["splits"]:
        if split == "test":
            return slice(start * per_image, (start + SIZES["test"]) * per_image)
        start += SIZES[split]
    raise AssertionError("no test split in the gallery")


def _brute(raw: np.ndarray, bank_scores: np.ndarray, method: str) -> tuple[np.ndarray, bool]:
    """One query's log-normalised scores over a gallery from the definition, and whether it applied:
    exp(20 s) / sum over the bank of exp(20 s(b, g)), for every query (invsoftmax) or when the
    query's raw top-1 is the top-1 of some bank query (qbnorm); else exp(20 s)."""
    numerator = np.exp(BETA * raw.astype(np.float64))
    denominator = np.exp(BETA * bank_scores).sum(axis=0)
    applied = method == "invsoftmax" or int(np.argmax(raw)) in set(np.argmax(bank_scores, axis=1).tolist())
    return np.log(numerator / denominator if applied else numerator), applied


def _expected(gallery: np.ndarray, bank: np.ndarray, vector: np.ndarray, method: str, span: slice, k: int
              ) -> tuple[list[int], np.ndarray, bool]:
    """Positions (in the whole gallery), scores and the applied flag of the top ``k`` of ``span``,
    over every score of the span."""
    part = gallery[span]
    raw = part @ vector.astype(np.float32)
    scores, applied = _brute(raw, bank.astype(np.float64) @ part.astype(np.float64).T, method)
    candidates = np.arange(len(part))
    order = candidates[np.lexsort((candidates, -scores[candidates]))][:k]
    return [int(p) + span.start for p in order], scores[order], applied


def test_the_manifest_names_the_bank(arrays) -> None:
    bank = arrays["bank"]
    digest = hashlib.sha256(bank["images"].tobytes() + bank["captions"].tobytes()).hexdigest()
    assert arrays["manifest"]["config"]["hubness"] == {
        "split": "train", "images": SIZES["train"], "captions": 5 * SIZES["train"], "content_hash": digest,
        "beta": BETA, "k": 1}


@pytest.mark.parametrize("method", ["qbnorm", "invsoftmax"])
def test_text_queries_rank_as_the_brute_force_normalisation(service, arrays, method) -> None:
    _, client = service
    scope, k = "test", 12
    span = _test_span(arrays["manifest"])
    queries = load_split(arrays["ckpt"].config.data, "test").captions[::7]
    changed = 0
    for query in queries:
        vector = encode_texts(arrays["ckpt"].model, arrays["ckpt"].vocab, [query])[0]
        want, scores, applied = _expected(arrays["images"], arrays["bank"]["captions"], vector, method, span, k)
        body = {"query": query, "model": MODEL, "k": k, "scope": scope, "normalise": method}
        out = client.post("/search/text", json=body).json()
        assert [h["image_id"] for h in out["results"]] == arrays["image_ids"][want].tolist(), query
        assert [h["score"] for h in out["results"]] == pytest.approx(scores.tolist(), rel=1e-5, abs=1e-5)
        assert (out["context"]["normalise"], out["context"]["normalised"]) == (method, applied)
        plain = client.post("/search/text", json={**body, "normalise": "none"}).json()
        changed += [h["image_id"] for h in plain["results"]] != [h["image_id"] for h in out["results"]]
    assert changed > 0  # the fixture is one where normalising reorders some lists


@pytest.mark.parametrize("method", ["qbnorm", "invsoftmax"])
def test_image_queries_rank_as_the_brute_force_normalisation(service, arrays, method) -> None:
    _, client = service
    span, images = _test_span(arrays["manifest"], 5), _test_span(arrays["manifest"])
    for position in range(images.start, images.stop, 3):
        vector = arrays["images"][position]
        want, _, applied = _expected(arrays["captions"], arrays["bank"]["images"], vector, method, span, 60)
        form = {"model": MODEL, "k": "60", "image_id": str(arrays["image_ids"][position]), "scope": "test",
                "normalise": method}
        out = client.post("/search/image", data=form).json()
        assert [h["caption_id"] for h in out["results"]] == arrays["caption_ids"][want].tolist()
        assert out["context"]["normalised"] == applied


def test_ranks_of_the_ground_truth_follow_the_normalised_list(service, arrays) -> None:
    _, client = service
    query = load_split(arrays["ckpt"].config.data, "test").captions[0]
    out = client.post("/search/text", json={"query": query, "model": MODEL, "k": 12, "scope": "test",
                                            "normalise": "invsoftmax"}).json()
    listed = [h["rank"] for h in out["results"] if h["is_ground_truth"]]
    assert out["scope_rank"] == out["ground_truth_rank"] == listed[0]
    compare = client.post("/compare/text", json={"query": query, "k": 12, "scope": "test", "normalise": "invsoftmax"})
    assert compare.json()["left"]["results"] == out["results"][:12]


def test_the_whole_catalogue_holding_the_bank_is_refused_a_correction(service, arrays) -> None:
    """Scope all holds the training split, the bank itself: normalising there would push every
    training item down, so it is refused with a message that names the way out."""
    _, client = service
    query, image_id = load_split(arrays["ckpt"].config.data, "test").captions[0], str(arrays["image_ids"][0])
    for method in ("qbnorm", "invsoftmax"):
        for answer in (client.post("/search/text", json={"query": query, "model": MODEL, "normalise": method}),
                       client.post("/compare/text", json={"query": query, "scope": "all", "normalise": method}),
                       client.post("/compare/image", data={"image_id": image_id, "normalise": method})):
            assert answer.status_code == 422
            assert answer.json()["detail"] == (
                f"hubness correction {method!r} is refused in scope 'all': it holds the train split, whose items "
                "are the correction's own bank, so every train item would be pushed down; search scope 'test' (the "
                "evaluation split, disjoint from the bank) or use normalise 'none'")
    assert client.post("/search/text", json={"query": query, "model": MODEL, "scope": "test",
                                             "normalise": "qbnorm"}).status_code == 200


def test_a_search_normalises_each_scope_once(service, arrays, monkeypatch) -> None:
    """A scope's normalised scores serve its top list, the ranks of the ground truth and the text
    rule's wider caption lists: one normalisation of each scope a search reads (k = 1 puts the
    ranks beyond the list, so they are computed over the scope)."""
    from aoq_serve.search import engine

    _, client = service
    scope = "test"
    sizes: list[int] = []

    def counted(scores: np.ndarray, *args, **kwargs) -> np.ndarray:
        sizes.append(scores.shape[1])
        return normalise_rows(scores, *args, **kwargs)

    normalise_rows = engine.normalise_rows
    monkeypatch.setattr(engine, "normalise_rows", counted)
    query = load_split(arrays["ckpt"].config.data, "test").captions[0]
    image_id = str(arrays["image_ids"][_test_span(arrays["manifest"]).start])
    test_images, test_captions = SIZES["test"], SIZES["test"] * 5
    every = (len(arrays["images"]), len(arrays["captions"]))
    for send, scoped in ((lambda: client.post("/search/text", json={"query": query, "model": MODEL, "k": 1,
                                                                     "scope": scope, "normalise": "invsoftmax"}),
                          [test_images] if scope == "test" else [every[0], test_images]),
                         (lambda: client.post("/search/image", data={"model": MODEL, "k": "1", "image_id": image_id,
                                                                     "scope": scope, "normalise": "invsoftmax"}),
                          [test_captions] if scope == "test" else [every[1], test_captions])):
        sizes.clear()
        assert send().status_code == 200
        assert sorted(sizes) == sorted(scoped)


@pytest.fixture(scope="module")
def legacy(service, tmp_path_factory) -> Iterator[httpx.Client]:
    """The service over a copy of the fixture's index and catalogue in which the ``aoq`` model's
    index was built before normalisation existed (no bank in its manifest)."""
    fx, _ = service
    index_dir = tmp_path_factory.mktemp("legacy") / "index"
    shutil.copytree(fx.index_dir, index_dir)
    strip_hubness_bank(index_dir / "aoq")
    settings = fx.settings(index_dir=index_dir, catalogue_url=f"sqlite:///{index_dir / 'catalogue.sqlite'}")
    with run_server(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


def test_an_index_without_a_bank_refuses_a_normalised_request_and_still_searches_raw(service, arrays, legacy) -> None:
    _, fresh = service
    refused = ("model 'aoq': its index holds no hubness bank (built before normalisation existed); run aoq index "
               "again, or search with normalise none")
    query, image_id = load_split(arrays["ckpt"].config.data, "test").captions[0], str(arrays["image_ids"][0])
    text = {"query": query, "model": "aoq", "k": 5, "scope": "test"}
    image = {"model": "aoq", "k": "5", "image_id": image_id, "scope": "test"}
    pair = {"query": query, "models": ["baseline", "aoq"], "k": 5, "scope": "test"}
    for method in ("qbnorm", "invsoftmax"):
        for answer in (legacy.post("/search/text", json={**text, "normalise": method}),
                       legacy.post("/search/image", data={**image, "normalise": method}),
                       legacy.post("/compare/text", json={**pair, "normalise": method}),
                       legacy.post("/compare/image", data={"models": "baseline,aoq", "k": "5", "image_id": image_id,
                                                           "scope": "test", "normalise": method})):
            assert (answer.status_code, answer.json()["detail"]) == (409, refused)
        # the other model's index has its bank
        other = legacy.post("/search/text", json={**text, "model": "baseline", "normalise": method})
        assert other.status_code == 200 and other.json()["context"]["normalise"] == method
    for path, kwargs in (("/search/text", {"json": {**text, "normalise": "none"}}),
                         ("/search/image", {"data": {**image, "normalise": "none"}})):
        plain = legacy.post(path, **kwargs)
        assert plain.status_code == 200
        assert (plain.json()["context"]["normalise"], plain.json()["context"]["normalised"]) == ("none", False)
        ranked = [[(h.get("image_id"), h.get("caption_id"), h["rank"], h["score"]) for h in out.json()["results"]]
                  for out in (plain, fresh.post(path, **kwargs))]
        assert ranked[0] == ranked[1]  # as the index with its bank ranks without normalising
    both = legacy.post("/compare/text", json={**pair, "normalise": "none"})
    assert both.status_code == 200 and [both.json()[s]["model"] for s in ("left", "right")] == ["baseline", "aoq"]
