"""``aoq evaluate``: R@K, medr, meanr and rsum of a checkpoint on a split, under a protocol."""

from __future__ import annotations

import argparse
import json
import sys

from aoq.metrics import PROTOCOLS
from aoq.names import NORMALISATIONS, POSITIVE_RULES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (e.g. runs/NAME/round1/best)")
    parser.add_argument("--split", default="test", help="train, dev, test or a file-level split name (default test)")
    parser.add_argument("--protocol", choices=(*PROTOCOLS, "labels"), default="full",
                        help="full: all images of the split; 1k5fold: mean of 5 folds of 1,000 (COCO 1K); "
                             "5k: the first 5,000 images (COCO 5K); labels: full plus mAP@R and NDCG@k "
                             "with relevance = shared labels (the split must carry labels)")
    parser.add_argument("--ndcg-k", type=int, default=10, help="NDCG cut-off of --protocol labels (default 10)")
    parser.add_argument("--positives", choices=POSITIVE_RULES, default=None,
                        help="pair: each caption matches its own image (the published protocol); text: identical "
                             "caption texts are one answer (default: the checkpoint config's eval.positives)")
    parser.add_argument("--hubness", choices=NORMALISATIONS, default=None,
                        help="rank by a query-time hubness normalisation with the training split as the bank "
                             "(none, qbnorm, invsoftmax; protocols full and labels) and report each direction's "
                             "hub share (docs/serving.md, Hubness correction)")
    parser.add_argument("--shortlist-by", default=None,
                        help="a cross-attention checkpoint only: re-score the top --shortlist-n items of this "
                             "embedding model's ranking instead of every pair (protocol full)")
    parser.add_argument("--shortlist-n", type=int, default=100, help="shortlist length of --shortlist-by (default 100)")
    parser.add_argument("--shortlist-cost", action="store_true",
                        help="with --shortlist-by: also score every pair and print, per metric, the re-ranked "
                             "value minus the full scoring's (what the cut costs)")
    parser.add_argument("--ensemble", default=None, metavar="CKPT2",
                        help="a cross-attention checkpoint only: average its scores with this second "
                             "cross-attention checkpoint's (the paper's SCAN and BFAN rows are such 2-model ensembles)")
    parser.add_argument("--data", help="read the split from this dataset path instead of the checkpoint's")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda ...")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from aoq_train.evaluate import evaluate_checkpoint, format_table

    try:
        result = evaluate_checkpoint(args.checkpoint, args.split, args.protocol, args.data, device=args.device,
                                     ndcg_k=args.ndcg_k, positives=args.positives,
                                     hubness=args.hubness, shortlist_by=args.shortlist_by,
                                     shortlist_n=args.shortlist_n, shortlist_cost=args.shortlist_cost,
                                     ensemble=args.ensemble)
    except ValueError as exc:  # e.g. 1k5fold on a split of fewer than 5,000 images
        print(f"aoq evaluate: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else format_table(result))
    return 0
