"""Serving benchmark: ``POST /search/text`` over HTTP against the bare work it wraps.

One run, on one machine:

1. a gallery of ``--gallery`` (default 100,000) images whose embeddings are random unit vectors
   (the index does not care where they came from), catalogued and indexed exactly as ``aoq index``
   does (flat inner-product FAISS index, one caption per image), with a real text encoder: the
   ``--checkpoint`` given, else an untrained model of ``configs/synthetic.yaml``'s architecture;
2. **bare**: in this process, for each query, the text encoding plus the single-thread FAISS
   search of the top 10 (``--queries`` queries after a warm-up): the floor any server pays;
3. **http**: ``aoq serve`` started as a separate process on 127.0.0.1, the same queries sent one
   at a time over a keep-alive connection (``http.client``); latency is the client's wall time
   per request: HTTP parsing, JSON, validation, the worker-thread hop and the answer included;
4. **load**: ``--clients`` (16) threads sending queries back to back for ``--duration`` (30) s;
   every non-200 answer or transport error counts as an error.

Last line: ``RESULT p50_ms=<http p50> p95_ms=<http p95> ratio_to_bare=<http p50 / bare p50>
qps=<load throughput> errors=<load errors>``.
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

from aoq.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from aoq.config import load_config  # noqa: E402
from aoq.data.dataset import SplitData  # noqa: E402
from aoq.data.vocab import Vocabulary  # noqa: E402
from aoq.device import seed_everything  # noqa: E402
from aoq.models.joint import build_model  # noqa: E402
from aoq.net import ServerNotReady, free_port, wait_http  # noqa: E402
from aoq_serve.store import catalogue  # noqa: E402
from aoq_serve.index.build import record_model  # noqa: E402
from aoq_serve.store.db import create_schema, make_engine, session_factory  # noqa: E402
from aoq_serve.featurize import encode_text  # noqa: E402
from aoq_serve.index.faiss_index import (  # noqa: E402
    IndexSpec,
    bump_generation,
    load_model_index,
    search,
    set_search_threads,
    write_model_index,  # noqa: E402
)

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


def checkpoint_into(models_dir: Path, source: Path | None) -> Path:
    """The benchmark's model folder: a copy of ``source``, or an untrained synthetic-config model."""
    target = models_dir / "bench"
    if source is not None:
        shutil.copytree(source, target)
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


def build_service(root: Path, n: int, source: Path | None) -> tuple[dict[str, str], Path]:
    """Catalogue, index and checkpoint of the random gallery; returns the server's environment."""
    models_dir, index_dir, data_dir = root / "models", root / "index", root / "data"
    data_dir.mkdir(parents=True)
    ckpt = load_checkpoint(checkpoint_into(models_dir, source))
    d = ckpt.model.text_encoder.rnn.hidden_size
    url = f"sqlite:///{index_dir / 'catalogue.sqlite'}"
    engine = make_engine(url)
    create_schema(engine)
    sessions = session_factory(engine)
    split = SplitData(name="test", captions=[f"gallery caption {i}" for i in range(n)], captions_per_image=1,
                      image_ids=[str(i) for i in range(n)])
    with sessions() as session, session.begin():
        dataset = catalogue.get_or_create_dataset(session, "bench", "precomp", False, 1, {"path": "bench"})
        ids = catalogue.register_split(session, dataset, "test", split, None, None)
    embeddings = {"images": unit_rows(n, d, 1), "captions": unit_rows(n, d, 2)}
    manifest = write_model_index(index_dir / "bench", embeddings, {"images": ids.image_ids, "captions": ids.caption_ids},
                                 IndexSpec("flat"), {"model": "bench", "checkpoint_hash": ckpt.content_hash,
                                                     "gallery_hash": catalogue.gallery_digest(ids, split.captions)})
    with sessions() as session, session.begin():
        record_model(session, "bench", "aoq", "benchmark", ckpt, ids, manifest, {}, {}, None)
    bump_generation(index_dir, ["bench"])
    engine.dispose()
    env = {"AOQ_CATALOGUE_URL": url, "AOQ_MODELS_DIR": str(models_dir), "AOQ_INDEX_DIR": str(index_dir),
           "AOQ_DATA_DIR": str(data_dir), "AOQ_RELOAD_POLL_S": "0", "AOQ_LOG_LEVEL": "warning"}
    return env, index_dir / "bench"


def bare_latencies(model_dir: Path, index_dir: Path, texts: list[str], k: int) -> np.ndarray:
    """Text encoding + FAISS search in this process, one query at a time, one thread each."""
    import torch

    torch.set_num_threads(1)
    set_search_threads(1)
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




def start_server(env: dict[str, str], port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "aoq_cli.main", "serve", "--port", str(port)], cwd=REPO,
                              env={**os.environ, **env})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=server, what="aoq serve", timeout=300,
                  ready=lambda health: health.get("models") == ["bench"])
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
    parser.add_argument("--gallery", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a trained checkpoint whose text encoder to use (default: untrained synthetic model)")
    args = parser.parse_args()

    texts = queries(args.queries)
    with tempfile.TemporaryDirectory(prefix="aoq-serving-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        env, index_dir = build_service(root, args.gallery, args.checkpoint)
        print(f"gallery of {args.gallery} images indexed in {time.perf_counter() - t0:.1f} s", flush=True)
        bare = bare_latencies(root / "models" / "bench", index_dir, texts, args.k)
        print(f"bare  (encode + FAISS, 1 thread): p50 {np.percentile(bare, 50):.2f} ms, "
              f"p95 {np.percentile(bare, 95):.2f} ms", flush=True)
        port = free_port()
        server = start_server(env, port)
        try:
            http_ms = http_latencies(port, texts, args.k)
            print(f"http  (POST /search/text):       p50 {np.percentile(http_ms, 50):.2f} ms, "
                  f"p95 {np.percentile(http_ms, 95):.2f} ms", flush=True)
            answered, errors, lat = load(port, texts, args.k, args.clients, args.duration)
            print(f"load  ({args.clients} clients, {args.duration:.0f} s): {answered} answers, {errors} errors, "
                  f"p50 {np.percentile(lat, 50):.1f} ms, p95 {np.percentile(lat, 95):.1f} ms", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=60)
    p50, p95 = float(np.percentile(http_ms, 50)), float(np.percentile(http_ms, 95))
    print(f"RESULT p50_ms={p50:.2f} p95_ms={p95:.2f} ratio_to_bare={p50 / float(np.percentile(bare, 50)):.2f} "
          f"qps={answered / args.duration:.1f} errors={errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
