"""``aoq regimes``: the regime map (docs/regimes.md). A pilot over ``aoq synth``'s difficulty
knobs picks two, a grid over them runs baseline, AOQ, the identity-filtered AOQ and GOAL cir x
con on paired seeds, and docs/results-regimes.md is written from the finished runs."""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import replace
from pathlib import Path

from aoq_cli import int_at_least, set_threads
from aoq.config import ConfigError
from aoq_train.loop.guards import TrainingCollapsed

#: printed as one line by aoq_cli.main: a collapsed run stops with what to try.
STOPS = (TrainingCollapsed,)
#: knobs whose levels are whole numbers
WHOLE = ("max_variants", "contrast_captions", "train")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aoq_train.regimes.grid import LEVELS, SIZES

    parser.add_argument("--config", type=Path, default=Path("configs/synthetic.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value in every run (repeatable)")
    parser.add_argument("--root", type=Path, default=Path("runs/regimes"),
                        help="sets under <root>/data, runs under <root>/runs (default: %(default)s)")
    parser.add_argument("--replicates", default="0-4", help="paired seeds per grid cell (default: %(default)s)")
    parser.add_argument("--knobs", default="", metavar="A,B",
                        help=f"the grid's two knobs, from {', '.join(LEVELS)}; default: picked by the pilot")
    parser.add_argument("--levels", action="append", default=[], metavar="KNOB=V1,V2,...",
                        help="a knob's levels instead of the default ones (repeatable)")
    parser.add_argument("--patience", type=int, default=None, help="patience in epochs of both rounds' plateaus")
    for split, size in SIZES.items():
        parser.add_argument(f"--{split}", type=int_at_least(1), default=size,
                            help=f"{split} images per set (default: %(default)s)")
    parser.add_argument("--run", action=argparse.BooleanOptionalAction, default=False,
                        help="run or resume the pilot and the grid first (default: only read finished runs)")
    parser.add_argument("--worker", default="0/1", metavar="K/N",
                        help="with --run: take jobs K, K+N, ... so N processes share the map (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads of this process (default: torch's choice, or with --worker K/N "
                             "the cores shared out over the N processes, since oversubscribed workers crawl)")
    parser.add_argument("--out", type=Path, default=Path("docs/results-regimes.md"))
    parser.add_argument("--evidence", type=Path, default=None,
                        help="the advice's evidence file (default: --out with .json)")
    parser.add_argument("--records", type=Path, default=None,
                        help="a small record per finished job, which stands for its run folder, so a map can be "
                             "finished in several sittings (default: --out's name with -jobs, e.g. "
                             "docs/results-regimes-jobs)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _levels(items: list[str]) -> dict[str, tuple[float | int, ...]]:
    from aoq_train.regimes.grid import LEVELS, Cell

    out = dict(LEVELS)
    for item in items:
        knob, _, values = item.partition("=")
        if knob not in LEVELS or not values:
            raise ConfigError(f"--levels {item!r}: give KNOB=V1,V2,... with KNOB from {', '.join(LEVELS)}")
        try:
            out[knob] = tuple((int if knob in WHOLE else float)(v) for v in values.split(","))
        except ValueError:
            raise ConfigError(f"--levels {item!r}: the levels of {knob} are numbers") from None
        for level in out[knob]:
            try:
                Cell.of(**{knob: level}).params()
            except ValueError as exc:
                raise ConfigError(f"--levels {item!r}: {exc}") from None
    return out


def worker_threads(threads: int | None, worker: tuple[int, int], cores: int) -> int | None:
    """Torch threads of one map process: ``--threads`` if given, else the cores shared out over
    the N workers (None with one worker: torch's own choice)."""
    if threads is not None or worker[1] == 1:
        return threads
    return max(1, cores // worker[1])


def _command(args: argparse.Namespace) -> str:
    """The ``aoq regimes --run`` command line that regenerates the page."""
    parts = ["aoq regimes --run", f"--config {args.config}", f"--root {args.root}", f"--replicates {args.replicates}",
             f"--train {args.train} --dev {args.dev} --test {args.test}"]
    parts += [f"--knobs {args.knobs}"] if args.knobs else []
    parts += [f"--levels {shlex.quote(item)}" for item in args.levels]
    parts += [f"--patience {args.patience}"] if args.patience is not None else []
    parts += [f"--set {shlex.quote(o)}" for o in args.overrides]
    parts += [f"--out {args.out}"] + ([f"--evidence {args.evidence}"] if args.evidence else [])
    parts += [f"--records {args.records}"] if args.records else []
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    from aoq_train.regimes import grid
    from aoq_train.regimes.page import write_page
    from aoq_train.regimes.runs import (
        MapSetup,
        collect_map,
        parse_worker,
        pick_knobs,
        pilot_setup,
        pilot_summary,
        run_map,
        unfinished,
    )
    from aoq_train.report.runs import parse_seeds

    try:
        replicates, worker = parse_seeds(args.replicates), parse_worker(args.worker)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    set_threads(worker_threads(args.threads, worker, os.cpu_count() or 1))
    levels = _levels(args.levels)
    sizes = {split: getattr(args, split) for split in grid.SIZES}
    records = args.records or args.out.with_name(f"{args.out.stem}-jobs")
    base = MapSetup(args.config, (), replicates, args.root, tuple(args.overrides), args.patience, sizes,
                    progress=not args.no_progress, records=records)
    summary = None
    if args.knobs:
        knobs = tuple(k.strip() for k in args.knobs.split(","))
        if len(knobs) != 2 or not set(knobs) <= set(grid.LEVELS) or knobs[0] == knobs[1]:
            raise ConfigError(f"--knobs {args.knobs!r}: two different knobs from {', '.join(grid.LEVELS)}")
    else:
        pilot = pilot_setup(base, tuple(grid.pilot_cells(levels)))
        if args.run:
            run_map(pilot, worker)
        if unfinished(pilot):
            print(f"pilot: {len(unfinished(pilot))} of {len(pilot.jobs())} runs not finished"
                  + ("; run again once the other workers are done" if args.run else "; add --run to run them"))
            return 0 if args.run else 1
        summary = pilot_summary(pilot, collect_map(pilot))
        try:
            knobs = pick_knobs(summary)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        print(f"pilot: the grid crosses {knobs[0]} and {knobs[1]}")
    setup = replace(base, cells=tuple(grid.grid_cells(*knobs, levels)))
    if args.run:
        run_map(setup, worker)
    missing = unfinished(setup)
    if missing:
        print(f"grid: {len(missing)} of {len(setup.jobs())} runs not finished"
              + ("; run again once the other workers are done" if args.run else "; add --run to run them"))
        return 0 if args.run else 1
    evidence = args.evidence or args.out.with_suffix(".json")
    write_page(setup, knobs, collect_map(setup), summary, _command(args), args.out, evidence)
    print(f"wrote {args.out} and {evidence}")
    return 0
