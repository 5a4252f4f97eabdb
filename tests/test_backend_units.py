"""Unit tests of the service's parts that need no server: FAISS index artefacts, failure cases,
upload decoding, path confinement, catalogue registration and the query log."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import faiss
import numpy as np
import pytest
from PIL import Image
from sqlalchemy import func, select

from aoq.data.dataset import SplitData
from aoq.io import ArtefactError
from aoq_serve.errors import ServiceError
from aoq_serve.guards.paths import safe_path
from aoq_serve.index import faiss_index
from aoq_serve.search.decode import decode_upload
from aoq_serve.search.failures import failure_cases
from aoq_serve.search.featurize import upload_refusal
from aoq_serve.store import catalogue
from aoq_serve.store.catalogue import CatalogueError
from aoq_serve.store.db import QueryLog, QueryRank, create_schema, make_engine, session_factory
from aoq_serve.store.querylog import QueryLogger
from tests.backend_helpers import unit_vectors


def clustered(n: int, d: int, clusters: int, seed: int = 0) -> np.ndarray:
    """Unit vectors around ``clusters`` centres: structured like real embeddings, unlike pure noise."""
    rng = np.random.default_rng(seed)
    centres = unit_vectors(clusters, d, seed + 1)
    x = centres[rng.integers(0, clusters, n)] + 0.35 * rng.standard_normal((n, d)).astype(np.float32) / np.sqrt(d)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture()
def sessions(tmp_path: Path):
    engine = make_engine(f"sqlite:///{tmp_path / 'cat.sqlite'}")
    create_schema(engine)
    yield session_factory(engine)
    engine.dispose()


# ----------------------------------------------------------------------------- indexes


def test_flat_index_is_exact_and_keeps_catalogue_ids():
    vectors, queries = unit_vectors(300, 16, 0), unit_vectors(20, 16, 1)
    ids = np.arange(1000, 1300)
    index, params = faiss_index.build_index(vectors, ids, queries, faiss_index.IndexSpec("flat"))
    assert params == {"recall_at_10": 1.0}
    scores, found = faiss_index.search(index, queries[0], 5)
    brute = vectors @ queries[0]
    expected = np.argsort(-brute)[:5]
    assert found.tolist() == (expected + 1000).tolist()
    np.testing.assert_allclose(scores, brute[expected], rtol=1e-5)


@pytest.mark.parametrize("kind, param", [("hnsw", "efSearch"), ("ivf", "nprobe")])
def test_approximate_index_is_tuned_to_the_target_recall(kind: str, param: str):
    vectors = clustered(4000, 32, 40, seed=2)
    queries = clustered(500, 32, 40, seed=3)
    index, params = faiss_index.build_index(vectors, np.arange(4000), queries, faiss_index.IndexSpec(kind, target_recall=0.95))
    assert params["recall_at_10"] >= 0.95
    assert param in params
    exact, _ = faiss_index.build_index(vectors, np.arange(4000), queries, faiss_index.IndexSpec("flat"))
    # the recorded value is what the tuned index really achieves on these queries
    assert faiss_index.recall_at_k(index, exact, queries[:200]) >= 0.9


def test_recall_counts_tied_answers_as_found():
    """Duplicated vectors: any of the tied ids is a correct answer, not only the one exact search picked."""
    base = unit_vectors(50, 16, 8)
    vectors = np.repeat(base, 20, axis=0)  # every vector 20 times
    exact, _ = faiss_index.build_index(vectors, np.arange(1000), base, faiss_index.IndexSpec("flat"))
    shuffled, _ = faiss_index.build_index(vectors[::-1].copy(), np.arange(1000)[::-1].copy(), base, faiss_index.IndexSpec("flat"))
    _, a = exact.search(base, 10)
    _, b = shuffled.search(base, 10)
    assert (a != b).any()  # the two exact searches pick different ids among the ties...
    assert faiss_index.recall_at_k(shuffled, exact, base) == 1.0  # ...and both answers are perfect
    worse = faiss.IndexIDMap(faiss.IndexFlatIP(16))
    worse.add_with_ids(unit_vectors(1000, 16, 9), np.arange(1000))
    assert faiss_index.recall_at_k(worse, exact, base) < 0.2


def test_unreachable_recall_is_an_error_not_a_silent_index():
    vectors = unit_vectors(500, 16, 4)
    with pytest.raises(ArtefactError, match="below the target"):
        faiss_index.build_index(vectors, np.arange(500), vectors[:50], faiss_index.IndexSpec("hnsw", target_recall=1.01))


def test_search_threads_apply_in_every_worker_thread():
    """OpenMP thread counts are per thread: setting it once in the main thread would not reach
    the server's request threads."""
    index, _ = faiss_index.build_index(unit_vectors(50, 8, 0), np.arange(50), unit_vectors(5, 8, 1), faiss_index.IndexSpec())
    seen = []

    def worker() -> None:
        faiss_index.search(index, unit_vectors(1, 8, 2)[0], 3)
        seen.append(faiss.omp_get_max_threads())

    faiss_index.set_search_threads(1)
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    finally:
        faiss_index.set_search_threads(0)
    assert seen == [1]


def test_full_rank_takes_the_expected_rank_over_tie_orders():
    emb = np.array([[1, 0], [0.6, 0.8], [0, 1], [0.6, 0.8]], dtype=np.float32)
    query = np.array([0.6, 0.8], dtype=np.float32)
    # scores 0.6, 1.0, 0.8, 1.0: items 1 and 3 tie at the top, the truth first half the time
    assert faiss_index.full_rank(emb, query, np.array([3])) == 1.5
    assert faiss_index.full_rank(emb, query, np.array([1, 3])) == 1  # tied truths do not count
    assert faiss_index.full_rank(emb, query, np.array([0])) == 4  # 0.6 < 1.0 (x2) and < 0.8
    assert faiss_index.full_rank(emb, query, np.array([0, 2])) == 3  # best of the two
    # a collapsed gallery: the truth and the 4 other items tie, expected in the middle (rank 3)
    assert faiss_index.full_rank(np.ones((5, 2), dtype=np.float32), query, np.array([2])) == 3


def _write(tmp_path: Path, spec=faiss_index.IndexSpec()) -> Path:
    emb = {"images": unit_vectors(10, 8, 5), "captions": unit_vectors(50, 8, 6)}
    ids = {"images": np.arange(1, 11), "captions": np.arange(1, 51)}
    out = tmp_path / "idx" / "m"
    faiss_index.write_model_index(out, emb, ids, spec, {"model": "m", "checkpoint_hash": "abc"})
    return out


def test_index_artefact_round_trip(tmp_path: Path):
    out = _write(tmp_path)
    loaded = faiss_index.load_model_index(out)
    assert loaded.config["checkpoint_hash"] == "abc"
    assert loaded.config["counts"] == {"images": 10, "captions": 50}
    assert loaded.faiss["images"].ntotal == 10 and loaded.ids["captions"].tolist() == list(range(1, 51))
    assert not list(out.parent.glob(".*tmp"))  # nothing half-written left behind


def test_corrupted_index_file_is_refused(tmp_path: Path):
    out = _write(tmp_path)
    data = bytearray((out / "images.faiss").read_bytes())
    data[-5] ^= 0xFF
    (out / "images.faiss").write_bytes(bytes(data))
    with pytest.raises(ArtefactError, match="images.faiss: content hash mismatch"):
        faiss_index.load_model_index(out)


def test_generation_file_counts_up(tmp_path: Path):
    assert faiss_index.read_generation(tmp_path) is None
    assert faiss_index.bump_generation(tmp_path, ["a"]) == {"generation": 1, "models": ["a"]}
    assert faiss_index.bump_generation(tmp_path, ["b"]) == {"generation": 2, "models": ["a", "b"]}


# ----------------------------------------------------------------------------- failure cases


def test_failure_cases_match_a_brute_force_reference(sessions):
    rng = np.random.default_rng(7)
    n = 200
    left, right = rng.integers(1, 4, n), rng.integers(1, 4, n)  # many rank-1 and many misses
    with sessions() as s, s.begin():
        ds = catalogue.get_or_create_dataset(s, "d", "precomp", False, 1, {"path": "p"})
        for name in ("left", "right"):
            catalogue.upsert_model(s, name, role=name, loss="x", image_encoder="vse", image_input="features",
                                   dataset_id=ds.id, gallery_split="test", checkpoint_path="-", checkpoint_hash="-")
    with sessions() as s, s.begin():
        for model, ranks in ((1, left), (2, right)):
            s.add_all(QueryRank(model_id=model, direction="t2i", query_id=q, rank=int(r)) for q, r in enumerate(ranks))
        s.add(QueryRank(model_id=1, direction="i2t", query_id=0, rank=5))  # other direction: ignored
    masks = {
        "baseline_only": (left > 1) & (right == 1),
        "aoq_only": (left == 1) & (right > 1),
        "both": (left > 1) & (right > 1),
    }
    def served(model_id: int, ranks: np.ndarray) -> SimpleNamespace:  # what failure_cases reads of a model
        digest = catalogue.ranks_digest(np.arange(n), ranks.astype(np.float64))
        return SimpleNamespace(model_id=model_id, name=str(model_id), index=SimpleNamespace(config={"ranks_hash": {"t2i": digest}}))

    one, two = served(1, left), served(2, right)
    with sessions() as s:
        for which, mask in masks.items():
            total, queries, rows = failure_cases(s, one, two, "t2i", which, limit=1000)
            assert total == queries == int(mask.sum())
            assert sorted(r.query_id for r in rows) == np.flatnonzero(mask).tolist()
            assert all(left[r.query_id] == r.left_rank and right[r.query_id] == r.right_rank and r.copies == 1
                       for r in rows)
        _, _, first = failure_cases(s, one, two, "t2i", "baseline_only", limit=3)
        _, _, second = failure_cases(s, one, two, "t2i", "baseline_only", limit=3, offset=3)
        assert [r.left_rank for r in first] == sorted([r.left_rank for r in first], reverse=True)  # worst first
        assert not {r.query_id for r in first} & {r.query_id for r in second}
        # queries of one key (a caption text) with the same two ranks are one case with their count
        pairs = lambda ids: ids // 2  # noqa: E731  (queries 2j and 2j+1 share a text)
        total, queries, rows = failure_cases(s, one, two, "t2i", "both", limit=1000, key_of=pairs)
        expected: dict[tuple[int, int, int], list[int]] = {}
        for q in np.flatnonzero(masks["both"]):
            expected.setdefault((q // 2, left[q], right[q]), []).append(int(q))
        assert queries == int(masks["both"].sum()) and total == len(expected) < queries
        assert sorted((r.query_id, r.copies) for r in rows) == sorted((min(v), len(v)) for v in expected.values())
        assert [r.left_rank + r.right_rank for r in rows] == sorted([r.left_rank + r.right_rank for r in rows],
                                                                   reverse=True)


# ----------------------------------------------------------------------------- uploads


def _encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_png_and_jpeg_uploads_decode(fmt: str):
    image = decode_upload(_encoded(Image.new("RGB", (40, 30), (200, 10, 10)), fmt), max_pixels=10_000)
    assert image.size == (40, 30)


@pytest.mark.parametrize(
    "data, status, message",
    [
        (b"", 422, "empty"),
        (b"definitely not an image", 422, "not an image"),
        (_encoded(Image.new("RGB", (8, 8)), "GIF"), 415, "GIF"),
        (_encoded(Image.new("RGB", (64, 64)), "PNG")[:60], 422, "corrupt or truncated"),
    ],
)
def test_bad_uploads_are_refused_clearly(data: bytes, status: int, message: str):
    with pytest.raises(ServiceError) as caught:
        decode_upload(data, max_pixels=10_000)
    assert caught.value.status_code == status and message in caught.value.detail


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's own warning, expected
def test_decompression_bomb_is_refused_before_decoding():
    bomb = _encoded(Image.new("1", (12_000, 12_000)), "PNG")  # ~150 KB on disk, 144 M pixels decoded
    assert len(bomb) < 10 * 1024 * 1024
    with pytest.raises(ServiceError) as caught:
        decode_upload(bomb, max_pixels=40_000_000)
    assert caught.value.status_code == 422 and "decompression bomb" in caught.value.detail


def test_uploads_to_detector_feature_models_are_refused_with_the_reason():
    assert upload_refusal("pixels", False, "coco") is None
    assert upload_refusal("features", True, "synth") is None
    assert "external detector" in upload_refusal("features", False, "coco")


# ----------------------------------------------------------------------------- paths


def test_paths_are_confined_to_the_data_directory(tmp_path: Path):
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    (data / "a" / "x.png").write_bytes(b"x")
    (tmp_path / "secret.txt").write_text("no")
    os.symlink(tmp_path / "secret.txt", data / "link.png")
    assert safe_path(data, "a/x.png") == (data / "a" / "x.png").resolve()
    assert safe_path(data, "a/../a/x.png") == (data / "a" / "x.png").resolve()
    for evil in ("../secret.txt", "a/../../secret.txt", str(tmp_path / "secret.txt"), "/etc/passwd", "link.png"):
        with pytest.raises(ServiceError) as caught:
            safe_path(data, evil)
        assert caught.value.status_code == 404 and "outside the data directory" in caught.value.detail


# ----------------------------------------------------------------------------- catalogue


def _split(captions: list[str]) -> SplitData:
    return SplitData(name="test", captions=captions, captions_per_image=2, image_ids=["a", "b"])


def test_registration_is_idempotent_and_refuses_changed_content(sessions):
    with sessions() as s, s.begin():
        ds = catalogue.get_or_create_dataset(s, "d", "precomp", False, 2, {"path": "p"})
        first = catalogue.register_split(s, ds, "test", _split(["a", "b", "c", "d"]), None, None)
    assert first.image_ids.tolist() == [1, 2] and first.caption_image_ids.tolist() == [1, 1, 2, 2]
    with sessions() as s, s.begin():
        ds = catalogue.get_or_create_dataset(s, "d", "precomp", False, 2, {"path": "p"})
        again = catalogue.register_split(s, ds, "test", _split(["a", "b", "c", "d"]), None, None)
        train = catalogue.register_split(s, ds, "train", _split(["e", "f", "g", "h"]), None, None)
    assert again.caption_ids.tolist() == first.caption_ids.tolist()
    assert train.image_ids.tolist() == [3, 4] and train.caption_ids.tolist() == [5, 6, 7, 8]
    with sessions() as s, s.begin(), pytest.raises(CatalogueError, match="changed on disk"):
        ds = catalogue.get_or_create_dataset(s, "d", "precomp", False, 2, {"path": "p"})
        catalogue.register_split(s, ds, "test", _split(["a", "b", "c", "CHANGED"]), None, None)


def test_query_log_is_written_in_batches_off_the_request_path(sessions):
    logger = QueryLogger(sessions, enabled=True, flush_every_s=3600)
    for k in (1, 2, 3):
        logger.record("/search/text", 1.5, "aoq", k)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(QueryLog)) == 0  # nothing written yet
    assert logger.flush() == 3
    with sessions() as s:
        rows = s.scalars(select(QueryLog).order_by(QueryLog.k)).all()
    assert [(r.endpoint, r.model, r.k, r.status) for r in rows] == [("/search/text", "aoq", k, 200) for k in (1, 2, 3)]
    off = QueryLogger(sessions, enabled=False)
    off.record("/x", 1.0)
    assert off.flush() == 0

