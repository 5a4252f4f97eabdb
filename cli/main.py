"""The ``aoq`` command. Each sub-command lives in ``cli/<name>.py`` and exposes
``add_arguments(parser)`` and ``run(args) -> int`` (its one-line help is in ``COMMANDS``); modules are imported only
when their command runs, so ``aoq synth`` does not pay for importing FastAPI or Gradio. A module may also define
``STOPS``, a tuple of exception types printed as one ``stopped:`` line (exit code 3) instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from aoq.config import ConfigError
from aoq.data.dataset import DataError
from aoq.io import ArtefactError

COMMANDS: dict[str, str] = {
    "synth": "Generate the synthetic benchmark (PNG images, Karpathy JSON and precomp features).",
    "data": "Build a real image-caption dataset from packaged sources (emoji: Noto + Twemoji, CLDR words).",
    "vocab": "Build the vocabulary of a dataset's train split and save it as JSON.",
    "train": "Round-1 training with an in-batch loss (max_violation, sum, smooth_ap, infonce) or GOAL.",
    "evaluate": "Evaluate a checkpoint (R@K, medr, meanr, rsum) under the full, 1K 5-fold or 5K protocol, or label-wise.",
    "mine": "Mine offline hard negatives for every training image and caption with a checkpoint.",
    "train2": "Round-2 training with offline hard negatives (OffTri, OffQuin, AdapOffQuin, ablations).",
    "pipeline": "Round 1 -> mining -> round 2, resumable stage by stage, with a comparison table.",
    "report": "Write docs/results.md and its figures from finished runs.",
    "regimes": "Map where offline mining pays: a pilot and a grid over aoq synth's knobs, docs/results-regimes.md.",
    "index": "Embed a gallery with registered models and build FAISS indexes plus the catalogue.",
    "serve": "Start the REST search service (FastAPI + FAISS).",
    "ui": "Start the comparison web UI (Gradio), talking to the service over HTTP.",
    "warm": "Compile the mining and search kernels for this machine now (make setup runs it).",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aoq",
        description="Image-text retrieval trained with hard negatives (AOQ, ECCV 2020).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def configure_logging(verbose: bool = False) -> None:
    """Timestamped log lines on stderr, INFO and up (DEBUG with ``verbose``), for ``aoq`` and the demo."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # faiss logs which CPU build it loads (six lines, two of them a ModuleNotFoundError) on
        # import; a command's output, and a refusal that must fit one line, do not need it.
        logging.getLogger("faiss.loader").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    top, rest = parser.parse_known_args(argv)
    if top.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(f"aoq_cli.{top.command}")
    sub = argparse.ArgumentParser(prog=f"aoq {top.command}", description=COMMANDS[top.command])
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    configure_logging(top.verbose)
    try:
        return int(module.run(args) or 0)
    except (ConfigError, DataError, ArtefactError) as exc:
        # Expected user-facing failures: one clear line, no traceback.
        print(f"aoq {top.command}: error: {exc}", file=sys.stderr)
        return 2
    except getattr(module, "STOPS", ()) as exc:
        # A command's own expected stops (e.g. a collapsed training run): one line, exit 3.
        print(f"aoq {top.command}: stopped: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"aoq {top.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
