"""``aoq pipeline``: round 1 -> mining -> round 2 -> published models -> comparison table."""

from __future__ import annotations

import argparse

from aoq.cli import add_config_flags
from aoq.config import ConfigError, load_config
from training.guards import TrainingCollapsed

#: printed as one line by aoq.cli.main: a collapsed run stops with what to try.
STOPS = (TrainingCollapsed,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from training.pipeline import KNOWN_ARMS

    add_config_flags(parser, example="round2.epochs=5")
    parser.add_argument("--out", help="run folder (default: the config's out_dir)")
    parser.add_argument("--arms", default="aoq",
                        help=f"comma-separated round-2 arms to train, from: {', '.join(KNOWN_ARMS)} "
                             "(default: %(default)s = the configured round-2 method)")
    parser.add_argument("--seed", type=int,
                        help="set train.seed and round2.seed to N and run in <run folder>/seed<N>")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    from training.pipeline import (
        KNOWN_ARMS,
        comparison_table,
        run_pipeline,
        seeded_config,
    )

    cfg = load_config(args.config, args.overrides)
    if args.out is not None:
        cfg.out_dir = args.out
    if args.seed is not None:
        cfg = seeded_config(cfg, args.seed)
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in names if a not in KNOWN_ARMS]
    if unknown or not names:
        raise ConfigError(f"--arms: unknown arm(s) {', '.join(unknown) or '(none given)'}; "
                          f"choose from {', '.join(KNOWN_ARMS)}")
    result = run_pipeline(cfg, {a: KNOWN_ARMS[a] for a in names}, progress_bar=not args.no_progress)
    for stage, state in result.status.items():
        print(f"  {stage:<22} {state}")
    print(f"\nTest split, {cfg.data.name} ({result.run_dir}):\n")
    print(comparison_table(result.comparison))
    print("\nmodels for `aoq index --models-dir`: " + str(result.run_dir / "models"))
    return 0
