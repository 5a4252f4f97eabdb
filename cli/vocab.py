"""``aoq vocab``: build the vocabulary of a dataset's train split and save it as JSON."""

from __future__ import annotations

import argparse
import logging

from tqdm import tqdm

from aoq_cli import add_config_flags
from aoq.config import load_config
from aoq.data.dataset import DataError
from aoq.data.load import load_split
from aoq.data.vocab import Vocabulary, coverage, format_coverage

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser, example="data.vocab_threshold=2", config_help="experiment YAML (its data section is used)")
    parser.add_argument("--out", required=True, help="vocabulary JSON file to write")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    train = load_split(cfg.data, "train")
    vocab = Vocabulary.build(
        tqdm(train.captions, desc="tokenizing", unit="caption", disable=None),
        threshold=cfg.data.vocab_threshold,
    )
    path = vocab.save(args.out)
    print(
        f"{path}: {len(vocab)} tokens (threshold {vocab.threshold}) from "
        f"{train.n_captions} captions of split {train.name!r} ({train.source})"
    )
    # The held-out splits show what the vocabulary will miss at evaluation time.
    for name in ("train", "dev", "test"):
        try:
            split = train if name == "train" else load_split(cfg.data, name)
        except DataError as exc:
            log.info("no %s coverage: %s", name, exc)
            continue
        print(f"  {name}: {format_coverage(coverage(vocab, split.captions))}")
    return 0
