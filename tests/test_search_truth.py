"""Twins and identical texts through the real server: a dataset whose two test pictures carry the
same five captions (one in other case), served by a model evaluated with the text rule and by
one evaluated with the pair rule. The marks, the ranks in the list and the ranks as evaluated
must agree with each other and with ``aoq.metrics``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from aoq.config import DataConfig
from aoq.data.load import load_split
from aoq.data.vocab import Vocabulary
from aoq_serve.index.build import IndexJob, index_models
from aoq_serve.index.reports import gallery_ranks
from aoq_serve.schemas import THUMBNAIL_SIZE
from tests.backend_helpers import SIZES, _config, run_server, write_checkpoint

pytestmark = pytest.mark.slow
CPI = 5


def _twin_dataset(root: Path) -> Path:
    """The synthetic benchmark's precomp files, with test image 1's captions replaced by image
    0's (its first one upper-cased: the rule compares normalised texts)."""
    from aoq_train.datasets.synth.writer import write_dataset

    write_dataset(root / "synth", SIZES, seed=0, workers=1, progress=False)
    folder = root / "twins"
    folder.mkdir()
    for split in SIZES:
        for suffix in ("_ims.npy", "_caps.txt"):
            shutil.copy(root / "synth" / "precomp" / f"{split}{suffix}", folder / f"{split}{suffix}")
    caps = (folder / "test_caps.txt").read_text().splitlines()
    caps[CPI:2 * CPI] = [caps[0].upper()] + caps[1:CPI]
    (folder / "test_caps.txt").write_text("\n".join(caps) + "\n")
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("twins")
    data_dir = root / "data"
    folder = _twin_dataset(data_dir)
    data = DataConfig(format="precomp", path=str(folder), name="twins", vocab_threshold=1)
    train = load_split(data, "train")
    vocab = Vocabulary.build(train.captions, threshold=1)
    models, index = root / "models", root / "index"
    for name, rule, seed in (("text", "text", 1), ("pair", "pair", 2)):
        cfg = _config(name, data, "vse")
        cfg.eval = cfg.eval.model_copy(update={"positives": rule})
        write_checkpoint(models / name, cfg, vocab, train.feature_dim, seed, {"role": name})
    url = f"sqlite:///{index / 'catalogue.sqlite'}"
    index_models(IndexJob(models_dir=models, data_dir=data_dir, out=index, catalogue_url=url, device="cpu"))
    from aoq_serve.config import Settings

    settings = Settings(catalogue_url=url, models_dir=models, index_dir=index, data_dir=data_dir,
                        reload_poll_s=0.0, port=0)
    with run_server(settings) as base:
        yield base, index


@pytest.fixture(scope="module")
def client(served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0], timeout=60) as c:
        yield c


def _evaluated(index: Path, model: str, client: httpx.Client) -> dict[str, np.ndarray]:
    """``aoq.metrics``' expected ranks of the test split, from the embeddings the index holds."""
    test = client.get("/gallery", params={"scope": "test", "limit": 100, "model": model}).json()["images"]
    image_ids = np.load(index / model / "image_ids.npy")
    rows = np.flatnonzero(np.isin(image_ids, [i["image_id"] for i in test]))
    images = np.load(index / model / "images.npy")[rows]
    captions = np.load(index / model / "captions.npy")[rows[0] * CPI:(rows[-1] + 1) * CPI]
    texts = [client.get(f"/captions/{c}").json()["text"]
             for c in np.load(index / model / "caption_ids.npy")[rows[0] * CPI:(rows[-1] + 1) * CPI]]
    return gallery_ranks(images, captions, CPI, texts if model == "text" else None)


def test_a_twin_is_a_correct_image_and_the_ranks_agree(client, served):
    test = client.get("/gallery", params={"scope": "test", "limit": 100, "model": "text"}).json()["images"]
    twin_a, twin_b = test[0], test[1]
    ranks = _evaluated(served[1], "text", client)
    for scope in ("test", "all"):
        out = client.post("/search/text", json={"query": twin_a["name"], "model": "text", "k": 40,
                                                "scope": scope}).json()
        assert out["context"]["positives"] == "text" and out["query_split"] == "test"
        assert sorted(out["ground_truth_ids"]) == sorted([twin_a["image_id"], twin_b["image_id"]])
        marked = [h for h in out["results"] if h["is_ground_truth"]]
        assert sorted(h["image_id"] for h in marked) == sorted(out["ground_truth_ids"])
        assert out["scope_rank"] == marked[0]["rank"]
        assert out["ground_truth_rank"] == pytest.approx(ranks["t2i"][0])
    # the pair rule: only the caption's own picture is correct
    pair = client.post("/search/text", json={"query": twin_a["name"], "model": "pair", "k": 5}).json()
    assert pair["ground_truth_ids"] == [twin_a["image_id"]] and pair["context"]["positives"] == "pair"


def test_an_image_lists_each_text_once_and_its_mark_agrees_with_the_rank(client, served):
    test = client.get("/gallery", params={"scope": "test", "limit": 100, "model": "text"}).json()["images"]
    ranks = _evaluated(served[1], "text", client)
    for scope, searched in (("test", 60), ("all", 200)):
        out = client.post("/search/image", data={"model": "text", "image_id": test[0]["image_id"], "k": 100,
                                                 "scope": scope}).json()
        rows = out["results"]
        texts = [r["text"].lower() for r in rows]
        assert len(texts) == len(set(texts)) == min(100, searched - CPI)  # five texts of two copies each
        own = {t.lower() for t in out["ground_truth_texts"]}
        assert {r["text"].lower() for r in rows if r["is_ground_truth"]} == own & set(texts)
        assert all(r["copies"] == 2 for r in rows if r["is_ground_truth"])
        assert all(r["image_id"] == test[0]["image_id"] for r in rows if r["is_ground_truth"])  # its own copy
        assert out["scope_rank"] == min(r["rank"] for r in rows if r["is_ground_truth"])
        # a row stands for its copies: the next row starts after them
        assert all(b["rank"] == a["rank"] + a["copies"] for a, b in zip(rows, rows[1:]))
        assert out["ground_truth_rank"] == pytest.approx(ranks["i2t"][0])
        assert len(out["ground_truth_ids"]) == 2 * CPI


def test_failures_and_metrics_follow_the_text_rule(client, served):
    ranks = _evaluated(served[1], "text", client)
    for direction in ("t2i", "i2t"):
        both = client.get("/failures", params={"direction": direction, "which": "both", "models": "text,text",
                                               "limit": 100}).json()
        assert both["measured"]["positives"] == "text" and both["measured"]["split"] == "test"
        assert both["queries"] == int((ranks[direction] > 1).sum()) == sum(i["copies"] for i in both["items"])
        assert sorted(i["left_rank"] for i in both["items"] for _ in range(i["copies"])) == \
            pytest.approx(sorted(ranks[direction][ranks[direction] > 1]))
        # text -> image: a text's captions (its twins) are one case with their count
        texts = [(i["query_text"] or str(i["query_id"])).lower() for i in both["items"]]
        assert len(texts) == len(set(texts)) == both["total"]
    metrics = client.get("/metrics/text").json()
    assert metrics["measured"] == {"split": "test", "n_images": 12, "protocol": None, "positives": "text", "seeds": [0]}
    assert metrics["tables"]["full"]["i2t"]["r1"] == pytest.approx(100 * float((ranks["i2t"] == 1).mean()))


def test_a_training_image_is_searchable_and_has_no_evaluated_rank(client):
    train_image = client.get("/examples", params={"split": "train", "n": 1}).json()["images"][0]["id"]
    out = client.post("/search/image", data={"model": "pair", "image_id": train_image, "k": 5}).json()
    assert out["query"]["split"] == "train" and out["ground_truth_rank"] is None and out["scope_rank"] >= 1
    assert client.post("/search/image", data={"model": "pair", "image_id": train_image, "scope": "test"}
                       ).json()["ground_truth_ids"] == []


def test_gallery_pages_and_filters_by_caption_text(client):
    examples = client.get("/examples", params={"n": 4}).json()
    first = client.get("/gallery", params={"limit": 7}).json()
    assert first["total"] == 40 and first["offset"] == 0 and len(first["images"]) == 7
    second = client.get("/gallery", params={"limit": 7, "offset": 7}).json()
    ids = [i["image_id"] for i in first["images"] + second["images"]]
    assert ids == sorted(ids) and len(set(ids)) == 14
    word = examples["captions"][0]["text"].split()[-1]
    found = client.get("/gallery", params={"q": word.upper(), "scope": "test", "limit": 100}).json()
    assert 1 <= found["total"] <= 12 and all(i["split"] == "test" for i in found["images"])
    assert examples["captions"][0]["image_id"] in [i["image_id"] for i in found["images"]]
    assert client.get("/gallery", params={"q": "no caption has this"}).json()["total"] == 0


def test_search_image_by_id_finds_its_captions(client):
    image_id = client.get("/examples", params={"n": 4}).json()["images"][2]["id"]
    for scope, searched, k in (("all", 200, 100), ("test", 60, 60)):
        r = client.post("/search/image", data={"model": "pair", "k": k, "image_id": image_id, "scope": scope})
        assert r.status_code == 200
        out = r.json()
        assert out["image_id"] == image_id and len(out["ground_truth_ids"]) == 5
        assert out["context"]["searched"] == searched and out["query"]["image_id"] == image_id
        assert out["ground_truth_texts"] and out["query"]["name"] == out["ground_truth_texts"][0]
        truth_ranks = [h["rank"] for h in out["results"] if h["is_ground_truth"]]
        assert out["scope_rank"] == min(truth_ranks)
        assert all((h["image_id"] == image_id) == h["is_ground_truth"] for h in out["results"])
        assert all(h["copies"] == 1 and h["thumbnail_url"].endswith(f"/images/{h['image_id']}?size={THUMBNAIL_SIZE}")
                   for h in out["results"])
    assert len(truth_ranks) == 5  # the whole test split is listed
    assert out["ground_truth_rank"] == out["scope_rank"]  # scope test: the evaluation split's own rank


def test_an_intended_answer_judges_a_free_text_query(client):
    caption = client.get("/examples", params={"split": "test", "n": 1}).json()["captions"][0]
    plain = client.post("/search/text", json={"query": caption["text"], "model": "text", "k": 3}).json()
    free = {"query": "words no caption has", "model": "text", "k": 3}
    judged = client.post("/search/text", json={**free, "intended": caption["text"]}).json()
    assert judged["intended"] == caption["text"] and judged["caption_id"] == plain["caption_id"]
    assert judged["ground_truth_ids"] == plain["ground_truth_ids"] != []
    assert judged["scope_rank"] >= 1 and any(h["is_ground_truth"] for h in judged["results"]) == (
        judged["scope_rank"] <= 3)
    lacking = client.post("/search/text", json={**free, "intended": "no such caption"}).json()
    assert lacking["intended"] == "no such caption" and lacking["ground_truth_ids"] == [] and \
        lacking["caption_id"] is None
