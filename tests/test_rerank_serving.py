"""A cross-attention model (BFAN, untrained, seeded) served as a re-ranker of the ``baseline``
model's FAISS shortlist, on the real server: its card, its answers against brute-force scores of
the whole gallery restricted to the shortlist, k above N, compare views, and a disabled
shortlisting model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from aoq.checkpoint import load_checkpoint
from aoq.embed import encode_fragments
from aoq.data.load import load_split
from aoq.io import ArtefactError
from aoq_serve.index.rerank import load_rerank_index
from tests.backend_helpers import ServiceFixture, _config, build_service_fixture, run_server, write_checkpoint

pytestmark = pytest.mark.slow

#: the re-ranker's shortlist length in these tests (small: the gallery has 40 images).
N = 6


def write_reranker(fx: ServiceFixture, name: str = "bfan", kind: str = "bfan") -> None:
    """An untrained cross-attention checkpoint on the baseline's data."""
    base = load_checkpoint(fx.models_dir / "baseline")
    train = load_split(base.config.data, "train")
    write_checkpoint(fx.models_dir / name, _config(name, base.config.data, kind), base.vocab, train.feature_dim, 4,
                     {"role": "rerank"})


def add_reranker(fx: ServiceFixture) -> None:
    """The BFAN re-ranker, indexed over the baseline's shortlist."""
    write_reranker(fx)
    fx.index(shortlist_by="baseline", shortlist_n=N)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ServiceFixture, httpx.Client]]:
    fx = build_service_fixture(tmp_path_factory.mktemp("rerank"), index=False)
    add_reranker(fx)
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield fx, client


def brute_force(fx: ServiceFixture, text: str | None = None, image_id: int | None = None) -> dict[int, float]:
    """``{gallery id: score}`` of every gallery image for ``text`` (or every caption for the
    gallery image ``image_id``), scored by the model directly from the stored fragments."""
    ckpt = load_checkpoint(fx.models_dir / "bfan")
    loaded = load_rerank_index(fx.index_dir / "bfan")
    fragments = loaded.fragments
    with torch.inference_mode():
        if text is not None:
            tokens = torch.tensor([ckpt.vocab.encode(text)])
            words = ckpt.model.encode_texts(tokens, torch.tensor([tokens.shape[1]]))
            scores = ckpt.model.pair_scores(torch.from_numpy(fragments.regions), words, torch.tensor([tokens.shape[1]]))
            return dict(zip(loaded.ids["images"].tolist(), scores[:, 0].tolist()))
        position = int(np.searchsorted(loaded.ids["images"], image_id))
        words, lengths = fragments.captions(range(fragments.n_captions))
        scores = ckpt.model.pair_scores(torch.from_numpy(fragments.regions[position : position + 1]), words, lengths)
        return dict(zip(loaded.ids["captions"].tolist(), scores[0].tolist()))


def test_the_card_names_the_shortlisting_model_and_n(served) -> None:
    _, client = served
    cards = {m["name"]: m for m in client.get("/models").json()}
    assert cards["bfan"]["enabled"] is True
    assert (cards["bfan"]["shortlist_by"], cards["bfan"]["shortlist_n"]) == ("baseline", N)
    assert (cards["baseline"]["shortlist_by"], cards["baseline"]["shortlist_n"]) == (None, None)


def test_a_sentence_is_answered_by_the_shortlist_resorted_by_full_scores(served) -> None:
    fx, client = served
    caption = client.get("/examples", params={"split": "test", "n": 1}).json()["captions"][0]["text"]
    short = client.post("/search/text", json={"query": caption, "model": "baseline", "k": N}).json()["results"]
    out = client.post("/search/text", json={"query": caption, "model": "bfan", "k": N}).json()
    full = brute_force(fx, text=caption)
    expected = sorted((r["image_id"] for r in short), key=lambda i: -full[i])
    assert [r["image_id"] for r in out["results"]] == expected
    assert np.allclose([r["score"] for r in out["results"]], [full[i] for i in expected], atol=1e-5)
    assert [r["rank"] for r in out["results"]] == list(range(1, N + 1))
    assert out["model"] == "bfan" and out["context"]["normalised"] is False
    assert out["context"]["rerank"] == {"kind": "bfan", "shortlist_by": "baseline", "shortlist_n": N}


def test_an_image_is_answered_by_the_shortlist_resorted_by_full_scores(served) -> None:
    fx, client = served
    image_id = client.get("/examples", params={"split": "test", "n": 1}).json()["images"][0]["id"]
    short = client.post("/search/image", data={"model": "baseline", "k": N, "image_id": image_id}).json()["results"]
    out = client.post("/search/image", data={"model": "bfan", "k": N, "image_id": image_id}).json()
    full = brute_force(fx, image_id=image_id)
    expected = sorted((r["caption_id"] for r in short), key=lambda c: -full[c])
    assert [r["caption_id"] for r in out["results"]] == expected
    assert np.allclose([r["score"] for r in out["results"]], [full[c] for c in expected], atol=1e-5)


def test_k_above_the_shortlist_is_refused_naming_n(served) -> None:
    _, client = served
    answer = client.post("/search/text", json={"query": "a red circle", "model": "bfan", "k": N + 1})
    assert answer.status_code == 422
    assert answer.json()["detail"] == f"model 'bfan' re-ranks the top {N} of 'baseline': k must be at most {N}, got {N + 1}"
    answer = client.post("/search/image", data={"model": "bfan", "k": N + 1, "image_id": 0})
    assert answer.status_code == 422


def test_compare_takes_the_reranker_like_any_model(served) -> None:
    _, client = served
    body = {"query": "a small red circle", "k": 3}
    alone = client.post("/search/text", json={**body, "model": "bfan"}).json()["results"]
    pair = client.post("/compare/text", json={**body, "models": ["baseline", "bfan"]}).json()
    assert pair["right"]["results"] == alone and pair["right"]["model"] == "bfan"
    image_id = client.get("/examples", params={"split": "test", "n": 1}).json()["images"][0]["id"]
    answer = client.post("/compare/image", data={"k": 3, "models": "bfan,aoq", "image_id": image_id})
    assert answer.status_code == 200, answer.text
    assert answer.json()["left"]["model"] == "bfan" and answer.json()["right"]["model"] == "aoq"


def test_a_reload_serves_the_reranker_again(served) -> None:
    _, client = served
    before = client.post("/search/text", json={"query": "a red circle", "model": "bfan", "k": 3}).json()["results"]
    assert client.post("/admin/reload", json={}).status_code == 200
    assert {m["name"]: m for m in client.get("/models").json()}["bfan"]["enabled"] is True
    after = client.post("/search/text", json={"query": "a red circle", "model": "bfan", "k": 3}).json()["results"]
    assert after == before


def test_failure_cases_refuse_a_reranker(served) -> None:
    _, client = served
    answer = client.get("/failures", params={"models": "baseline,bfan"})
    assert answer.status_code == 422 and "re-ranker" in answer.json()["detail"]


def test_a_reranker_without_its_shortlisting_model_is_disabled_with_the_reason(tmp_path: Path) -> None:
    fx = build_service_fixture(tmp_path, index=False)
    write_reranker(fx)
    with pytest.raises(ArtefactError, match="bfan is a cross-attention model, served as a re-ranker: name the "
                                            "embedding model whose FAISS shortlist it re-ranks with --shortlist-by"):
        fx.index()
    with pytest.raises(ArtefactError, match="--shortlist-by bfan: not an embedding model of "):
        fx.index(shortlist_by="bfan")
    assert not (fx.index_dir / "baseline").exists()  # refused before any work
    fx.index(shortlist_by="baseline", shortlist_n=N)
    (fx.index_dir / "baseline" / "images.npy").write_bytes(b"damaged")
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=60) as client:
        card = {m["name"]: m for m in client.get("/models").json()}["bfan"]
        assert card["enabled"] is False and (card["shortlist_by"], card["shortlist_n"]) == ("baseline", N)
        assert card["disabled_reason"] == f"it re-ranks the top {N} of model 'baseline', which is not served (disabled or missing)"
        answer = client.post("/search/text", json={"query": "a red circle", "model": "bfan", "k": 3})
        assert answer.status_code == 409 and "not served" in answer.json()["detail"]


def test_the_index_stores_the_fragments_the_model_computes(served) -> None:
    fx, _ = served
    ckpt = load_checkpoint(fx.models_dir / "bfan")
    split = load_split(ckpt.config.data, "test")
    exact = encode_fragments(ckpt.model, ckpt.vocab, split)
    stored = load_rerank_index(fx.index_dir / "bfan").fragments
    # where the test split sits in the gallery: the stored image equal to its first image
    first = int(np.flatnonzero((stored.regions == exact.regions[0]).all(axis=(1, 2)))[0])
    c0 = first * split.captions_per_image
    words = stored.offsets[c0 : c0 + split.n_captions + 1]
    assert np.array_equal(stored.regions[first : first + split.n_images], exact.regions)
    assert np.array_equal(stored.words[words[0] : words[-1]], exact.words)
    assert np.array_equal(words - words[0], exact.offsets)
