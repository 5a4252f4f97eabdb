"""Micro-batching (aoq_serve.search.batching): concurrent searches answered together give exactly the
answers each query gets alone (ids and scores, ties and mixed k included), batches stay within
MAX_BATCH, a lone query runs at once, queries waiting on a busy leader go together in the next
batch, a second batch starts beside a running one only with half a batch waiting, an error
reaches every query of its batch; and on the real server, concurrent text and
image queries answer exactly as the same queries sent one by one, each answer (serialised by the
route itself) exactly its declared model."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import faiss
import httpx
import numpy as np
import pytest

from aoq_serve.index import faiss_index
from aoq_serve.index.scan import FlatScan
from aoq_serve.schemas import CompareImageOut, CompareTextOut, SearchImageOut, SearchTextOut
from aoq_serve.search import batching
from tests.backend_helpers import build_service_fixture, run_server

D = 32


def _gallery(n: int = 3000) -> np.ndarray:
    """Unit rows with many exact duplicates (identical captions embed identically): ties at every cut."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((n // 3, D)).astype(np.float32)
    x = np.concatenate([base, base, base[::-1]])
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _flat(x: np.ndarray) -> faiss.Index:
    index = faiss.IndexIDMap(faiss.IndexFlatIP(D))
    index.add_with_ids(x, np.arange(len(x), dtype=np.int64) * 7 + 3)
    return index


def _scan(x: np.ndarray) -> FlatScan:
    return FlatScan.from_vectors(x, np.arange(len(x), dtype=np.int64) * 7 + 3)


def _hnsw(x: np.ndarray) -> faiss.Index:
    index = faiss.IndexIDMap(faiss.IndexHNSWFlat(D, 16, faiss.METRIC_INNER_PRODUCT))
    index.add_with_ids(x, np.arange(len(x), dtype=np.int64))
    return index


@pytest.fixture
def batch_sizes(monkeypatch) -> list[int]:
    """The number of queries of every FAISS call the batcher makes."""
    sizes: list[int] = []
    real = faiss_index.search_many

    def counted(index: faiss.Index, queries: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        sizes.append(len(queries))
        return real(index, queries, k)

    monkeypatch.setattr(faiss_index, "search_many", counted)
    batching.set_batching(True)
    return sizes


def _concurrently(calls: list[Callable[[], object]]) -> list[object]:
    """Run every call in its own thread, all released at once."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], object]) -> object:
        start.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


@pytest.mark.parametrize("build", [_flat, _scan, _hnsw], ids=["flat", "scan", "hnsw"])
def test_concurrent_searches_equal_single_searches_exactly(build, batch_sizes):
    x = _gallery()
    index = build(x)
    rng = np.random.default_rng(1)
    # queries that are gallery rows tie with their duplicates; mixed k cuts through the ties
    queries = np.concatenate([x[rng.choice(len(x), 24)], rng.standard_normal((24, D)).astype(np.float32)])
    ks = [int(k) for k in rng.choice([1, 5, 10, 40], len(queries))]
    alone = [faiss_index.search(index, q, k) for q, k in zip(queries, ks)]
    for _ in range(3):
        together = _concurrently([lambda q=q, k=k: batching.search(index, q, k) for q, k in zip(queries, ks)])
        for (s1, i1), (s2, i2) in zip(alone, together):
            assert np.array_equal(i1, i2) and np.array_equal(s1, s2)
    assert max(batch_sizes) > 1, "no batch formed: the test did not exercise batching"
    assert max(batch_sizes) <= batching.MAX_BATCH


def test_a_full_batch_of_the_limit_is_scanned_as_single_queries():
    """MAX_BATCH queries in one FAISS call equal the same queries one by one (below the BLAS switch)."""
    x = _gallery()
    index = _flat(x)
    queries = np.concatenate([x[:batching.MAX_BATCH // 2], np.random.default_rng(2).standard_normal(
        (batching.MAX_BATCH - batching.MAX_BATCH // 2, D)).astype(np.float32)])
    together = faiss_index.search_many(index, queries, 10)
    for q, (scores, ids) in zip(queries, together):
        alone_scores, alone_ids = faiss_index.search(index, q, 10)
        assert np.array_equal(ids, alone_ids) and np.array_equal(scores, alone_scores)


def test_a_lone_query_is_searched_at_once_in_a_batch_of_one(batch_sizes):
    index = _flat(_gallery())
    query = np.random.default_rng(3).standard_normal(D).astype(np.float32)
    for _ in range(5):
        batching.search(index, query, 10)
    assert batch_sizes == [1] * 5


def test_an_error_reaches_every_query_of_the_batch_and_the_next_batch_runs(batch_sizes):
    index = _flat(_gallery())
    rng = np.random.default_rng(4)
    wrong = [lambda: batching.search(index, rng.standard_normal(D + 1).astype(np.float32), 10) for _ in range(6)]

    def outcome(call: Callable[[], object]) -> Callable[[], str]:
        def run() -> str:
            try:
                call()
            except Exception as error:  # noqa: BLE001 - the test reads which error came back
                return type(error).__name__
            return "answered"
        return run

    assert set(_concurrently([outcome(c) for c in wrong])) != {"answered"}
    scores, ids = batching.search(index, rng.standard_normal(D).astype(np.float32), 10)
    assert len(ids) == 10


def test_batching_off_searches_each_query_alone(batch_sizes):
    batching.set_batching(False)
    try:
        index = _flat(_gallery())
        queries = np.random.default_rng(5).standard_normal((8, D)).astype(np.float32)
        _concurrently([lambda q=q: batching.search(index, q, 10) for q in queries])
    finally:
        batching.set_batching(True)
    assert batch_sizes == [1] * 8, "with batching off every query is searched alone"


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[httpx.Client]:
    fx = build_service_fixture(tmp_path_factory.mktemp("batching"))
    with run_server(fx.settings()) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


def _stripped(answer: dict) -> dict:
    """An answer without its timing."""
    return {key: value for key, value in answer.items() if key != "latency_ms"}


@pytest.mark.slow
def test_concurrent_requests_answer_as_single_requests_on_the_real_server(client, batch_sizes):
    examples = client.get("/examples", params={"split": "test", "n": 8}).json()
    texts = [c["text"] for c in examples["captions"]] + ["a small red circle", "zzz unknown words"]
    requests = [("/search/text", {"json": {"query": t, "model": "baseline", "k": k}})
                for t in texts for k in (3, 10)]
    requests += [("/search/image", {"data": {"model": "aoq", "k": k, "image_id": str(i["id"])}})
                 for i in examples["images"] for k in (5, 10)]
    one_by_one = []
    for path, kwargs in requests:
        answer = client.post(path, **kwargs)
        assert answer.status_code == 200, answer.text
        one_by_one.append(_stripped(answer.json()))
    batch_sizes.clear()
    together = _concurrently([lambda p=p, kw=kw: client.post(p, **kw) for p, kw in requests])
    assert [a.status_code for a in together] == [200] * len(requests)
    assert [_stripped(a.json()) for a in together] == one_by_one
    assert batch_sizes and max(batch_sizes) <= batching.MAX_BATCH


class _HeldBatches:
    """Jobs submitted straight to a batcher whose work records each batch and holds a batch led
    by a job of ``held`` until that job's ``release`` event is set; each answer is its payload
    times 10."""

    def __init__(self, limit: int, leaders: int, held: tuple[int, ...] = (0,)) -> None:
        batching.set_batching(True)
        self.limit, self.leaders = limit, leaders
        self.release = {p: threading.Event() for p in held}
        self.started = {p: threading.Event() for p in held}
        self.batches: list[list[int]] = []
        self.answers: dict[int, int] = {}
        self.target = _flat(_gallery(30))  # any weak-referenceable object stands for the target

    def work(self, payloads: list[int], _key) -> list[int]:
        self.batches.append(list(payloads))
        if payloads[0] in self.release:
            self.started[payloads[0]].set()
            self.release[payloads[0]].wait(10)
        return [p * 10 for p in payloads]

    def submit(self, p: int) -> None:
        self.answers[p] = batching._submit(self.target, self.work, p, "key", self.limit, self.leaders)

    def start(self, p: int) -> threading.Thread:
        """Submit job ``p`` from a thread of its own."""
        thread = threading.Thread(target=self.submit, args=(p,))
        thread.start()
        return thread

    def until(self, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.001)

    def waiting(self) -> int:
        return len(batching._batchers[self.target].waiting)

    def idle(self) -> bool:
        batcher = batching._batchers[self.target]
        return batcher.running == 0 and not batcher.waiting


def test_jobs_waiting_on_a_busy_leader_go_together_in_the_next_batch_oldest_first():
    """One leader (as for encoding): while its batch runs, arrivals wait; when it ends, the oldest
    waiting job leads the next batch and takes the others, in arrival order."""
    held = _HeldBatches(limit=batching.MAX_BATCH, leaders=1)
    threads = [held.start(0)]
    assert held.started[0].wait(10)
    for p in range(1, 6):  # arrive one after the other while the first batch runs
        threads.append(held.start(p))
        held.until(lambda p=p: held.waiting() >= p)
    held.release[0].set()
    for t in threads:
        t.join(10)
    assert held.batches == [[0], [1, 2, 3, 4, 5]]
    assert held.answers == {p: p * 10 for p in range(6)}
    assert held.idle()


def test_search_answers_serialised_once_are_exactly_their_declared_models(client):
    """The search and compare routes return their JSON themselves (not re-validated by FastAPI):
    each answer must still be exactly its response model, no field more or less."""
    examples = client.get("/examples", params={"split": "test", "n": 1}).json()
    query, image_id = examples["captions"][0]["text"], str(examples["images"][0]["id"])
    answers = {
        SearchTextOut: client.post("/search/text", json={"query": query, "model": "baseline", "k": 3}),
        SearchImageOut: client.post("/search/image", data={"model": "aoq", "k": 3, "image_id": image_id}),
        CompareTextOut: client.post("/compare/text", json={"query": query, "k": 3}),
        CompareImageOut: client.post("/compare/image", data={"k": 3, "image_id": image_id}),
    }
    for model, answer in answers.items():
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        assert model.model_validate(answer.json()).model_dump(mode="json") == answer.json(), model.__name__


def test_a_second_batch_starts_beside_a_running_one_with_half_a_batch_waiting():
    """Two leaders allowed (as for encoding on two cores), batches of at most 4: while one batch
    runs, a lone arrival waits; the arrival that makes half a batch (2) starts a second batch with
    the oldest waiting job leading."""
    held = _HeldBatches(limit=4, leaders=2)
    threads = [held.start(0)]
    assert held.started[0].wait(10)
    threads.append(held.start(1))
    held.until(lambda: held.waiting() >= 1)
    time.sleep(0.05)
    assert held.batches == [[0]], "one job waiting is not half a batch: no second batch"
    threads.append(held.start(2))
    held.until(lambda: len(held.batches) >= 2)
    assert held.batches == [[0], [1, 2]]
    held.release[0].set()
    for t in threads:
        t.join(10)
    assert held.answers == {p: p * 10 for p in range(3)}
    assert held.idle()


def test_a_batch_ending_beside_a_running_one_leaves_fewer_than_half_a_batch_to_wait():
    """Two leaders, batches of at most 4: when a batch ends while another runs, one waiting job
    (less than half a batch) does not start a batch of one beside it; it waits, and leads the
    next batch when the other batch ends."""
    held = _HeldBatches(limit=4, leaders=2, held=(0, 1))
    threads = [held.start(0)]
    assert held.started[0].wait(10)
    threads.append(held.start(1))
    held.until(lambda: held.waiting() >= 1)
    threads.append(held.start(2))  # half a batch: a second batch starts, led by job 1
    assert held.started[1].wait(10)
    threads.append(held.start(3))
    held.until(lambda: held.waiting() >= 1)
    held.release[1].set()
    held.until(lambda: held.answers.keys() >= {1, 2})
    time.sleep(0.05)
    assert held.batches == [[0], [1, 2]], "a batch of one started beside the running batch"
    assert held.waiting() == 1
    held.release[0].set()
    for t in threads:
        t.join(10)
    assert held.batches == [[0], [1, 2], [3]]
    assert held.answers == {p: p * 10 for p in range(4)}
    assert held.idle()
