"""Hubness correction measured (docs/serving.md, Hubness correction): for each checkpoint folder of
a models directory and each normalisation (none, qbnorm, invsoftmax), on one split:

* rsum and NDCG@10 (label-wise, relevance = shared labels; when the split has labels) of
  ``aoq evaluate --hubness``, exact, with the training split as the bank;
* the hubness figure: the share of queries whose top-1 is one of the 10 most frequent top-1 items;
* the latency a normalisation adds to a query of the service's path (scope all): a flat FAISS
  search of the whole gallery (every split) for ``CANDIDATE_FACTOR * k`` candidates and their
  re-rank, against a plain top-k search, one thread, the split's own queries.

    python benchmarks/hubness.py --models runs/demo-emoji/models [--split test] [--json out.json]

Prints a Markdown table (the one docs/serving.md shows) and a ``RESULT`` line per model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import faiss
import numpy as np

from aoq.device import cpu_description
from aoq.checkpoint import load_checkpoint
from aoq.data.load import load_split
from aoq.embed import encode_split
from aoq.hubness import CANDIDATE_FACTOR, HUB_ITEMS, bank_normaliser, bank_provenance, rerank
from aoq.names import NORMALISATIONS
from aoq_serve.index.faiss_index import IndexSpec, build_index, search
from aoq_train.evaluate import evaluate_hubness

K = 10
#: queries timed per direction (the first of the split's own)
LATENCY_QUERIES = 500


def _per_query_ms(index: faiss.Index, queries: np.ndarray, method: str, normaliser, ids: np.ndarray) -> float:
    """Mean milliseconds of one top-K query of the service's scope-all path under ``method``."""
    pool = K if method == "none" else K * CANDIDATE_FACTOR
    start = time.perf_counter()
    for vector in queries:
        scores, found = search(index, vector, pool)
        rerank(method, scores, np.searchsorted(ids, found), normaliser, K)  # type: ignore[arg-type]
    return (time.perf_counter() - start) * 1000 / len(queries)


def measure(checkpoint: Path, split_name: str) -> list[dict]:
    """One row per normalisation of one checkpoint."""
    ckpt = load_checkpoint(checkpoint)
    data = ckpt.config.data
    splits = {role: load_split(data, role) for role in dict.fromkeys([data.train_split, data.dev_split, split_name])}
    embedded = {role: encode_split(ckpt.model, ckpt.vocab, part, image_size=data.image_size)
                for role, part in splits.items()}
    img, cap = embedded[split_name]
    bank_img, bank_cap = embedded[data.train_split]
    bank = (bank_img, bank_cap, bank_provenance(data.train_split, bank_img, bank_cap))
    split = splits[split_name]
    ndcg_k = K if split.labels is not None else None
    # the service's gallery: every split; its normalisers under the same bank
    gallery = {m: np.concatenate([e[i] for e in embedded.values()]) for i, m in enumerate(("images", "captions"))}
    faiss.omp_set_num_threads(1)
    timed = {}
    for modality, queries, bank_side in (("images", cap, bank_cap), ("captions", img, bank_img)):
        ids = np.arange(len(gallery[modality]), dtype=np.int64)
        index, _ = build_index(gallery[modality], ids, queries, IndexSpec())
        normaliser = bank_normaliser(bank_side, gallery[modality])
        sample = queries[:LATENCY_QUERIES]
        timed[modality] = {m: _per_query_ms(index, sample, m, normaliser, ids) for m in NORMALISATIONS}
    rows = []
    for method in NORMALISATIONS:
        result = evaluate_hubness(img, cap, split, method, None if method == "none" else bank,
                                  ckpt.config.eval.positives, ndcg_k)
        labels = result.get("labels")
        rows.append({
            "model": checkpoint.name, "normalise": method, "rsum": result["rsum"],
            "ndcg_at_10": None if labels is None else {d: labels[d][f"ndcg_at_{K}"] for d in ("i2t", "t2i")},
            "hub_share": result["hubness"]["hub_share"],
            "added_ms": {"t2i": timed["images"][method] - timed["images"]["none"],
                         "i2t": timed["captions"][method] - timed["captions"]["none"]},
            "plain_ms": {"t2i": timed["images"]["none"], "i2t": timed["captions"]["none"]},
            "split": split_name, "n_images": split.n_images, "gallery_images": len(gallery["images"]),
            "bank": result["hubness"]["bank"],
        })
    return rows


def _cell(value: float | None, scale: float = 100.0) -> str:
    return "n/a" if value is None else f"{scale * value:.1f}"


def table(rows: list[dict]) -> str:
    """The Markdown table of docs/serving.md."""
    lines = [f"| model | normalise | rsum | NDCG@10 i2t | NDCG@10 t2i | top-{HUB_ITEMS} hub share i2t | t2i "
             "| added ms/query t2i | i2t |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ndcg = r["ndcg_at_10"] or {"i2t": None, "t2i": None}
        lines.append(f"| {r['model']} | {r['normalise']} | {r['rsum']:.1f} | {_cell(ndcg['i2t'])} | {_cell(ndcg['t2i'])} "
                     f"| {_cell(r['hub_share']['i2t'])}% | {_cell(r['hub_share']['t2i'])}% "
                     f"| {r['added_ms']['t2i']:+.3f} | {r['added_ms']['i2t']:+.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="folder of checkpoint folders (e.g. runs/NAME/models)")
    parser.add_argument("--split", default="test", help="the split measured (default test)")
    parser.add_argument("--json", type=Path, help="also write every row as JSON here")
    args = parser.parse_args()
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    folders = sorted(p.parent for p in args.models.glob("*/manifest.json") if not p.parent.name.startswith("."))
    rows = [row for folder in folders for row in measure(folder, args.split)]
    print(table(rows))
    for r in rows:
        print(f"RESULT model={r['model']} normalise={r['normalise']} rsum={r['rsum']:.2f} "
              f"hub_share_t2i={r['hub_share']['t2i']:.4f} added_ms_t2i={r['added_ms']['t2i']:.4f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
