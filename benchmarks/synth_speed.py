"""Throughput of the synthetic benchmark generator: one worker against all cores.

Generates the same small dataset twice (into a temporary folder that is removed afterwards)
and prints images per second for each run, the speed-up, and the peak resident memory of this
process and of its worker processes (the largest single process, in MiB). The last line is

    RESULT images_per_s=<all-core rate> speedup_all_cores=<all-core / one-worker> peak_mb=<MiB>

Other jobs on the machine slow both runs; the figures are only comparable within one run.

Usage: python benchmarks/synth_speed.py [--images 1200] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aoq.device import cpu_description  # noqa: E402
from aoq_train.datasets.synth.writer import write_dataset  # noqa: E402


def _timed_run(root: Path, name: str, n_images: int, workers: int) -> float:
    """Images per second of one generation of ``n_images`` images (train/dev/test 80/10/10)."""
    dev = test = max(1, n_images // 10)
    sizes = {"train": n_images - dev - test, "dev": dev, "test": test}
    start = time.perf_counter()
    write_dataset(root / name, sizes, seed=0, workers=workers, progress=False)
    return n_images / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1200, help="images per run (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="all-core worker count")
    args = parser.parse_args()
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    if args.images < 3 or args.workers < 1:
        parser.error("need --images >= 3 and --workers >= 1")
    with tempfile.TemporaryDirectory(prefix="synth-speed-") as tmp:
        root = Path(tmp)
        one = _timed_run(root, "one", args.images, 1)
        print(f"1 worker: {one:.1f} images/s")
        many = _timed_run(root, "all", args.images, args.workers)
        print(f"{args.workers} workers: {many:.1f} images/s")
    # ru_maxrss is in KiB on Linux; RUSAGE_CHILDREN reports the largest child.
    peak_kib = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    print(f"RESULT images_per_s={many:.1f} speedup_all_cores={many / one:.2f} peak_mb={peak_kib / 1024:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
