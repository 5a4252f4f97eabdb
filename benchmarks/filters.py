"""Cost of the false-negative filters in ``aoq mine``: the same checkpoint mined without filters and
with ``--filters`` (default identity + semantic), one after the other in one process.

Both runs embed the training split and mine; the filtered one also mines deeper, flags the
candidates and keeps the unflagged ones. After one untimed warm-up run of each, each is timed
``--repeats`` times, alternating, and the best time of each is kept. The sentence vectors of the
semantic filter come from the backbone feature cache: on the emoji set, whose models read MiniLM
features, they are the very entries training computed (on other data the first filtered run
computes them once, about as long as featurising the captions for a MiniLM model).

Last line: ``RESULT plain_s=<s> filtered_s=<s> ratio=<filtered / plain>``; the target for the
semantic filter on emoji is ratio <= 1.25.

Usage: python benchmarks/filters.py --checkpoint runs/demo-emoji/models/baseline
       [--config configs/emoji.yaml --set data.path=data/demo-emoji/dataset_emoji.json] [--filters identity,semantic]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aoq.device import cpu_description  # noqa: E402
from aoq.config import load_config  # noqa: E402
from aoq_train.mining import mine_with_checkpoint  # noqa: E402


def _timed(checkpoint: Path, cfg, out: Path) -> float:
    start = time.perf_counter()
    mine_with_checkpoint(checkpoint, cfg, out, progress=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=Path("configs/emoji.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="config overrides (default: data.path=data/demo-emoji/dataset_emoji.json)")
    parser.add_argument("--filters", default="identity,semantic")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each, best kept (default: %(default)s)")
    args = parser.parse_args()
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    overrides = args.overrides or ["data.path=data/demo-emoji/dataset_emoji.json"]
    plain = load_config(args.config, overrides)
    filtered = load_config(args.config, [*overrides, f"mining.filters=[{args.filters}]"])
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in (("plain", plain), ("filtered", filtered)):  # file caches, compiled kernels, imports
            _timed(args.checkpoint, cfg, Path(tmp) / f"warm-up-{name}")
        times: dict[str, list[float]] = {"plain": [], "filtered": []}
        for run in range(args.repeats):  # alternated, so that a busy moment hits both
            for name, cfg in (("plain", plain), ("filtered", filtered)):
                times[name].append(_timed(args.checkpoint, cfg, Path(tmp) / f"{name}{run}"))
        plain_s, filtered_s = min(times["plain"]), min(times["filtered"])
    print(f"aoq mine without filters: {plain_s:.1f} s; with {args.filters}: {filtered_s:.1f} s")
    print(f"RESULT plain_s={plain_s:.1f} filtered_s={filtered_s:.1f} ratio={filtered_s / plain_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
