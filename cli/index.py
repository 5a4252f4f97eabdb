"""``aoq index``: embed a gallery with every checkpoint of a models folder, build FAISS indexes,
and fill the catalogue the search service reads (see docs/serving.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from aoq_serve.index.faiss_index import IndexType
from aoq_serve.index.rerank import DEFAULT_SHORTLIST_N


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-dir", type=Path, required=True,
                        help="folder with one checkpoint folder per model (runs/<name>/models)")
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="the data tree the service may read images from; dataset paths must lie inside it")
    parser.add_argument("--out", type=Path, required=True, help="index directory (one subfolder per model)")
    parser.add_argument("--catalogue", default=None,
                        help="SQLAlchemy URL of the catalogue (default: sqlite file OUT/catalogue.sqlite)")
    parser.add_argument("--split", default="test",
                        help="evaluation split: ground-truth ranks, failure cases, metrics (default: %(default)s)")
    parser.add_argument("--gallery", choices=("all", "eval"), default="all",
                        help="what the service searches: every split of the data (train, dev and --split; "
                             "default) or the evaluation split alone")
    parser.add_argument("--config", type=Path, default=None,
                        help="take the data section from this run config instead of each checkpoint's own")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a --config key (repeatable)")
    parser.add_argument("--type", dest="index_type", choices=get_args(IndexType), default="flat",
                        help="flat = exact inner product (default); hnsw / ivf are tuned to --target-recall")
    parser.add_argument("--target-recall", type=float, default=0.95,
                        help="recall@10 against exact search an approximate index must reach (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="where to embed the gallery (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shortlist-by", default=None, metavar="MODEL",
                        help="cross-attention checkpoints (SCAN, BFAN) are served as re-rankers of this embedding "
                             "model's FAISS shortlist (a checkpoint folder of --models-dir)")
    parser.add_argument("--shortlist-n", type=int, default=DEFAULT_SHORTLIST_N,
                        help="items in each query's shortlist of --shortlist-by (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from aoq_serve.index.build import IndexJob, index_models
    from aoq_serve.config import Settings
    from aoq_serve.index.faiss_index import IndexSpec

    catalogue = args.catalogue or Settings(index_dir=args.out).catalogue()
    job = IndexJob(
        models_dir=args.models_dir, data_dir=args.data_dir, out=args.out, catalogue_url=catalogue,
        split=args.split, gallery=args.gallery,
        spec=IndexSpec(type=args.index_type, target_recall=args.target_recall),
        config=args.config, overrides=args.overrides, device=args.device, batch_size=args.batch_size,
        shortlist_by=args.shortlist_by, shortlist_n=args.shortlist_n,
    )
    for summary in index_models(job):
        if summary["rsum"] is None:
            print(f"{summary['model']} ({summary['role']}): re-ranks the top {summary['shortlist_n']} of "
                  f"{summary['shortlist_by']}")
            continue
        recall = {m: p.get("recall_at_10") for m, p in summary["params"].items()}
        print(f"{summary['model']} ({summary['role']}): rsum {summary['rsum']:.2f} on the {args.split} split "
              f"(full protocol), {args.index_type} index recall@10 vs exact {recall}")
    print(f"catalogue: {catalogue}\nindexes: {args.out}")
    return 0
