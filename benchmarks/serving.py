"""Serving benchmark: ``POST /search/text`` over HTTP against the bare work it wraps.

One run, on one machine:

1. a gallery of ``--gallery`` images whose embeddings are random unit vectors (the index does not
   care where they came from), catalogued and indexed exactly as ``aoq index`` does (flat
   inner-product FAISS index, one caption per image), with a real text encoder: ``--encoders
   small`` (default) the ``--checkpoint`` given, else an untrained model of
   ``configs/synthetic.yaml``'s architecture (gallery default 100,000); ``--encoders pretrained``
   the packaged MiniLM / EfficientNet-Lite0 backbones of ``configs/emoji.yaml`` with fresh
   projection heads (nothing is downloaded; gallery default 7,273, the emoji demo's);
2. **bare**: in this process, for each query, the text encoding plus the single-thread search of
   the top 10 as the service runs it (the flat index's block scan, :mod:`aoq_serve.index.scan`)
   (``--queries`` queries after a warm-up): the floor any server pays; and
   **bare batched**: the same queries encoded in batches of one token bucket and searched in
   batches, at most ``MAX_BATCH`` each, as the service batches them (docs/serving.md,
   Micro-batching), on one thread: the throughput floor of one core;
3. **http**: ``aoq serve`` started as a separate process on 127.0.0.1 with ``--workers`` worker
   processes (default: one per CPU core, as ``aoq serve``), the same queries sent one at a time
   over a keep-alive connection (``http.client``); latency is the client's wall time per
   request: HTTP parsing, JSON, validation, the worker-thread hop and the answer included;
4. **load**: ``--clients`` (16) threads sending queries back to back for ``--duration`` (30) s;
   every non-200 answer or transport error counts as an error; then the same with the service
   restarted with one worker, and with one worker and ``AOQ_BATCHING=false`` (each query
   searched alone: the one-by-one rate).

5. **rerank**: a cross-attention re-ranker's work for one text query as the service does it
   (docs/serving.md, Re-rankers), in this process on one thread: the query's word states by an
   untrained BFAN of ``configs/coco_precomp_bfan.yaml``'s architecture (``embed_dim`` 1024, bi-GRU),
   its scores against the 36 x 1024 random unit regions of ``--rerank-n`` (100) shortlisted images
   (COCO precomp's shape; their region terms precomputed, as ``aoq index`` stores them) and the
   re-sort, for ``--rerank-queries`` (200) queries after a warm-up
   (the shortlist's FAISS search is the **bare** figure, not counted here). Its own line, before
   the last: ``RESULT rerank_p50_ms=<p50> rerank_p95_ms=<p95> shortlist_n=<N> regions=36 dim=1024
   model=bfan``; ``--rerank-only`` measures this alone.

Last line: ``RESULT ratio_to_bare=<http p50 / bare p50> qps=<load throughput, the workers,
batched> workers=<their number> qps_1_worker=<one worker, batched> p95_ms=<http p95>
errors=<load errors, every load>``; with ``--encoders pretrained`` also ``qps_one_by_one=`` (one
worker, batching off) and ``speedup=`` (qps over qps_one_by_one, measured in the same run).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aoq.device import cpu_description, seed_everything  # noqa: E402
from aoq.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from aoq.config import load_config  # noqa: E402
from aoq.data.dataset import SplitData  # noqa: E402
from aoq.data.vocab import Vocabulary  # noqa: E402
from aoq.models.joint import build_model, text_vocabulary  # noqa: E402
from aoq.net import ServerNotReady, free_port, wait_http  # noqa: E402
from aoq_serve.config import Settings  # noqa: E402
from aoq_serve.index.build import record_model  # noqa: E402
from aoq_serve.store.pictures import digests_file, split_digests  # noqa: E402
from aoq_serve.store import catalogue  # noqa: E402
from aoq_serve.store.db import create_schema, make_engine, session_factory  # noqa: E402
from aoq.models.invariant import bucket_length, encode_bucket, query_text_encoder  # noqa: E402
from aoq_serve.index.faiss_index import (  # noqa: E402
    IndexSpec,
    bump_generation,
    load_model_index,
    search,
    search_many,
    set_search_threads,
    write_model_index,  # noqa: E402
)
from aoq_serve.search.batching import MAX_BATCH, search_limit, set_batching  # noqa: E402
from aoq_serve.search.featurize import encode_text  # noqa: E402
from aoq.embed import sentence_words  # noqa: E402
from aoq.pair_scores import score_sentence  # noqa: E402
from aoq_serve.index.rerank import gallery_region_stats  # noqa: E402

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "pink", "grey", "turquoise", "golden"]
SHAPES = ["circle", "square", "triangle", "star", "cross", "disc", "box", "rhombus", "block", "ring"]
PLACES = ["on the left", "on the right", "at the top", "at the bottom", "in the middle", "next to a wall"]


def queries(n: int, seed: int = 0) -> list[str]:
    """Sentences like the synthetic captions, none of them a gallery caption."""
    rng = np.random.default_rng(seed)
    return [
        f"a {rng.choice(['small', 'big', 'medium'])} {rng.choice(COLOURS)} {rng.choice(SHAPES)} "
        f"{rng.choice(PLACES)} and a {rng.choice(COLOURS)} {rng.choice(SHAPES)}"
        for _ in range(n)
    ]


#: gallery size by encoders: the small benchmark's, and the emoji demo's 7,273 pictures.
DEFAULT_GALLERY = {"small": 100_000, "pretrained": 7_273}


def checkpoint_into(models_dir: Path, source: Path | None, encoders: str) -> Path:
    """The benchmark's model folder: a copy of ``source``, or an untrained model of the synthetic
    config (small) or of the emoji config (pretrained backbones, fresh heads)."""
    target = models_dir / "bench"
    if source is not None:
        shutil.copytree(source, target)
        return target
    if encoders == "pretrained":
        cfg = load_config(REPO / "configs" / "emoji.yaml")
        seed_everything(0)
        save_checkpoint(target, build_model(cfg.model, 0, None), cfg, text_vocabulary(cfg.model, [], 1), {},
                        {"role": "aoq"})
        return target
    cfg = load_config(REPO / "configs" / "synthetic.yaml")
    vocab = Vocabulary.build([" ".join(COLOURS + SHAPES + PLACES + ["a", "small", "big", "medium", "and"])] * 4)
    seed_everything(0)
    model = build_model(cfg.model, len(vocab), 96)
    save_checkpoint(target, model, cfg, vocab, {}, {"role": "aoq"})
    return target


def unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def build_service(root: Path, n: int, source: Path | None, encoders: str) -> tuple[dict[str, str], Path]:
    """Catalogue, index and checkpoint of the random gallery; returns the server's environment."""
    models_dir, index_dir, data_dir = root / "models", root / "index", root / "data"
    data_dir.mkdir(parents=True)
    ckpt = load_checkpoint(checkpoint_into(models_dir, source, encoders))
    d = encode_text(ckpt, "size of the embedding").shape[0]
    url = f"sqlite:///{index_dir / 'catalogue.sqlite'}"
    engine = make_engine(url)
    create_schema(engine)
    sessions = session_factory(engine)
    split = SplitData(name="test", captions=[f"gallery caption {i}" for i in range(n)], captions_per_image=1,
                      image_ids=[str(i) for i in range(n)])
    with sessions() as session, session.begin():
        dataset = catalogue.get_or_create_dataset(session, "bench", "precomp", False, 1, {"path": "bench"})
        ids = catalogue.register_split(session, dataset, "test", split, None, None)
        # the digests the service checks before serving (no ground-truth ranks are stored here)
        paths_hash = {"test": catalogue.paths_digest(ids.image_ids, catalogue.image_paths(session, dataset.id, "test"))}
    embeddings = {"images": unit_rows(n, d, 1), "captions": unit_rows(n, d, 2)}
    manifest = write_model_index(index_dir / "bench", embeddings, {"images": ids.image_ids, "captions": ids.caption_ids},
                                 IndexSpec("flat"), {"model": "bench", "checkpoint_hash": ckpt.content_hash,
                                                     "gallery_hash": catalogue.gallery_digest(ids, split.captions),
                                                     "paths_hash": paths_hash, "ranks_hash": {},
                                                     "picture_digests": sorted(paths_hash)},
                                 {digests_file("test"): split_digests(None, n)})
    with sessions() as session, session.begin():
        record_model(session, "bench", "aoq", "benchmark", ckpt, ids, manifest, {}, {}, None)
    bump_generation(index_dir, ["bench"])
    engine.dispose()
    env = {"AOQ_CATALOGUE_URL": url, "AOQ_MODELS_DIR": str(models_dir), "AOQ_INDEX_DIR": str(index_dir),
           "AOQ_DATA_DIR": str(data_dir), "AOQ_RELOAD_POLL_S": "0", "AOQ_LOG_LEVEL": "warning"}
    return env, index_dir / "bench"


def bare_latencies(model_dir: Path, index_dir: Path, texts: list[str], k: int) -> np.ndarray:
    """Text encoding + search in this process, one query at a time, one thread each."""
    import torch

    torch.set_num_threads(1)
    set_search_threads(1)
    set_batching(False)
    ckpt = load_checkpoint(model_dir)
    index = load_model_index(index_dir).faiss["images"]
    for text in texts[:20]:
        search(index, encode_text(ckpt, text), k)
    out = []
    for text in texts:
        start = time.perf_counter()
        search(index, encode_text(ckpt, text), k)
        out.append(time.perf_counter() - start)
    return np.asarray(out) * 1000


def bare_batched_qps(model_dir: Path, index_dir: Path, texts: list[str], k: int) -> float:
    """Queries per second of the service's batched path without the server, one thread: texts of
    one token bucket encoded together, vectors searched together, at most ``MAX_BATCH`` at a time."""
    import torch

    ckpt = load_checkpoint(model_dir)
    index = load_model_index(index_dir).faiss["images"]
    encoder, device = query_text_encoder(ckpt.model), torch.device("cpu")
    sequences = [ckpt.vocab.encode(t) for t in texts]
    buckets: dict[int, list[list[int]]] = {}
    for sequence in sequences:
        buckets.setdefault(bucket_length(len(sequence)), []).append(sequence)
    start = time.perf_counter()
    vectors = np.concatenate([encode_bucket(encoder, group[first:first + MAX_BATCH], device)
                              for group in buckets.values() for first in range(0, len(group), MAX_BATCH)])
    limit = search_limit(index)
    for first in range(0, len(vectors), limit):
        search_many(index, vectors[first:first + limit], k)
    return len(texts) / (time.perf_counter() - start)


#: COCO precomp's regions per image (the re-rank benchmark's fragment shape).
RERANK_REGIONS = 36
#: images whose regions the re-rank benchmark holds (each query's shortlist is drawn from them).
RERANK_GALLERY = 1_000
#: re-rank queries run before the measured ones.
RERANK_WARMUP = 10


def rerank_latencies(texts: list[str], n: int) -> tuple[np.ndarray, int]:
    """Per-query ms of a BFAN re-ranker's work on one thread: the query's word states, its scores
    against ``n`` shortlisted images' regions, the re-sort; and the embedding size."""
    import torch

    torch.set_num_threads(1)
    cfg = load_config(REPO / "configs" / "coco_precomp_bfan.yaml")
    vocab = Vocabulary.build([" ".join(COLOURS + SHAPES + PLACES + ["a", "small", "big", "medium", "and"])] * 4)
    seed_everything(0)
    model = build_model(cfg.model, len(vocab), 2048).eval()
    d = cfg.model.embed_dim
    regions = np.random.default_rng(3).standard_normal((RERANK_GALLERY, RERANK_REGIONS, d), dtype=np.float32)
    regions /= np.linalg.norm(regions, axis=2, keepdims=True)
    shortlists = np.random.default_rng(4).random((len(texts), RERANK_GALLERY)).argsort(axis=1)[:, :n]
    stats = gallery_region_stats(regions)  # stored by aoq index with a re-ranker's fragments
    cpu, out = torch.device("cpu"), []
    for i in range(-RERANK_WARMUP, len(texts)):
        start = time.perf_counter()
        scores = score_sentence(model.pair_scores, sentence_words(model, vocab, texts[i % len(texts)]), regions,
                                shortlists[i % len(texts)], cpu, stats)
        np.lexsort((np.arange(n), -scores))
        out.append(time.perf_counter() - start)
    return np.asarray(out[RERANK_WARMUP:]) * 1000, d


def rerank_result(args: argparse.Namespace) -> str:
    """Measure the re-ranker (step 5) and return its ``RESULT`` line."""
    latencies, d = rerank_latencies(queries(args.rerank_queries, seed=1), args.rerank_n)
    p50, p95 = np.percentile(latencies, 50), np.percentile(latencies, 95)
    print(f"rerank (BFAN, top {args.rerank_n} of a shortlist, {RERANK_REGIONS} x {d} regions, 1 thread): "
          f"p50 {p50:.2f} ms, p95 {p95:.2f} ms; load average {os.getloadavg()[0]:.1f}", flush=True)
    return (f"RESULT rerank_p50_ms={p50:.2f} rerank_p95_ms={p95:.2f} shortlist_n={args.rerank_n} "
            f"regions={RERANK_REGIONS} dim={d} model=bfan")


def start_server(env: dict[str, str], port: int, workers: int) -> subprocess.Popen:
    """``aoq serve`` with ``workers`` worker processes, once every worker serves the gallery."""
    server = subprocess.Popen([sys.executable, "-m", "aoq_cli.main", "serve", "--port", str(port)], cwd=REPO,
                              env={**os.environ, **env, "AOQ_WORKERS": str(workers)})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=server, what="aoq serve", timeout=300,
                  ready=lambda health: [w["models"] for w in health.get("workers", [])] == [["bench"]] * workers)
    except ServerNotReady:
        server.kill()
        raise
    return server


class Client:
    """A lean keep-alive HTTP/1.1 client (``http.client``): the client's own CPU use would
    otherwise be counted in the latency and, on a 2-core machine, taken from the server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def search(self, text: str, k: int) -> int:
        body = json.dumps({"query": text, "model": "bench", "k": k})
        try:
            self.conn.request("POST", "/search/text", body, {"Content-Type": "application/json"})
            response = self.conn.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            return -1

    def close(self) -> None:
        self.conn.close()


def http_latencies(port: int, texts: list[str], k: int) -> np.ndarray:
    client, out = Client(port), []
    try:
        for text in texts[:20] + texts:
            start = time.perf_counter()
            status = client.search(text, k)
            out.append(time.perf_counter() - start)
            if status != 200:
                raise RuntimeError(f"/search/text answered {status}")
    finally:
        client.close()
    return np.asarray(out[20:]) * 1000


def load(port: int, texts: list[str], k: int, clients: int, duration: float) -> tuple[int, int, list[float]]:
    """``clients`` threads querying back to back for ``duration`` seconds: (answers, errors, latencies)."""
    done, errors, latencies = [0], [0], []
    lock = threading.Lock()
    stop = time.monotonic() + duration

    def worker(offset: int) -> None:
        client, ok, bad, lat, i = Client(port), 0, 0, [], offset
        while time.monotonic() < stop:
            start = time.perf_counter()
            status = client.search(texts[i % len(texts)], k)
            lat.append((time.perf_counter() - start) * 1000)
            ok, bad = (ok + 1, bad) if status == 200 else (ok, bad + 1)
            i += 1
        client.close()
        with lock:
            done[0] += ok
            errors[0] += bad
            latencies.extend(lat)

    threads = [threading.Thread(target=worker, args=(c * 7,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0], errors[0], latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gallery", type=int, default=None,
                        help="gallery size (default: 100,000 small, 7,273 pretrained)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--workers", type=int, default=0,
                        help="worker processes of the measured service (default 0: one per CPU core, as aoq serve)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a trained checkpoint whose text encoder to use (default: untrained synthetic model)")
    parser.add_argument("--encoders", choices=sorted(DEFAULT_GALLERY), default="small",
                        help="small: the synthetic config's GRU; pretrained: the emoji demo's MiniLM / EfficientNet-Lite0")
    parser.add_argument("--rerank-n", type=int, default=100, help="the re-ranker's shortlist (default: %(default)s)")
    parser.add_argument("--rerank-queries", type=int, default=200)
    parser.add_argument("--rerank-only", action="store_true", help="measure the re-ranker (step 5) alone")
    args = parser.parse_args()
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    rerank = rerank_result(args)
    if args.rerank_only:
        print(rerank)
        return 0
    gallery = args.gallery or DEFAULT_GALLERY[args.encoders]
    workers = Settings(workers=args.workers).worker_count()

    texts = queries(args.queries)
    with tempfile.TemporaryDirectory(prefix="aoq-serving-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        env, index_dir = build_service(root, gallery, args.checkpoint, args.encoders)
        print(f"gallery of {gallery} images ({args.encoders} encoders) indexed in {time.perf_counter() - t0:.1f} s",
              flush=True)
        bare = bare_latencies(root / "models" / "bench", index_dir, texts, args.k)
        print(f"bare  (encode + FAISS, 1 thread): p50 {np.percentile(bare, 50):.2f} ms, "
              f"p95 {np.percentile(bare, 95):.2f} ms", flush=True)
        bare_qps = bare_batched_qps(root / "models" / "bench", index_dir, texts, args.k)
        print(f"bare batched (encode and FAISS {MAX_BATCH} at a time, 1 thread): {bare_qps:.1f} queries/s",
              flush=True)
        loads = {}
        # (workers, batching): the service as configured by default (one worker per core), one
        # worker, and one worker searching each query alone (the one-by-one rate).
        runs = [(workers, "true"), (1, "true"), (1, "false")] if workers > 1 else [(1, "true"), (1, "false")]
        for run_workers, batching in runs:
            port = free_port()
            server = start_server({**env, "AOQ_BATCHING": batching}, port, run_workers)
            try:
                if (run_workers, batching) == runs[0]:
                    http_ms = http_latencies(port, texts, args.k)
                    print(f"http  (POST /search/text, 1 client, {run_workers} workers): "
                          f"p50 {np.percentile(http_ms, 50):.2f} ms, p95 {np.percentile(http_ms, 95):.2f} ms",
                          flush=True)
                answered, errors, lat = load(port, texts, args.k, args.clients, args.duration)
                loads[run_workers, batching] = (answered / args.duration, errors)
                print(f"load  ({args.clients} clients, {args.duration:.0f} s, {run_workers} workers, batching "
                      f"{batching}): {answered} answers, {errors} errors, {answered / args.duration:.1f} q/s, "
                      f"p50 {np.percentile(lat, 50):.1f} ms, p95 {np.percentile(lat, 95):.1f} ms", flush=True)
            finally:
                server.terminate()
                server.wait(timeout=60)
    (qps, _), (qps_one_worker, _), (qps_alone, _) = loads[runs[0]], loads[1, "true"], loads[1, "false"]
    errors = sum(e for _, e in loads.values())
    p95 = float(np.percentile(http_ms, 95))
    ratio = float(np.percentile(http_ms, 50)) / float(np.percentile(bare, 50))
    extra = f" qps_one_by_one={qps_alone:.1f} speedup={qps / qps_alone:.2f}" if args.encoders == "pretrained" else ""
    print(rerank)
    print(f"RESULT ratio_to_bare={ratio:.2f} qps={qps:.1f} workers={workers} qps_1_worker={qps_one_worker:.1f} "
          f"p95_ms={p95:.2f} errors={errors}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
