"""``aoq warm``: compile the numba kernels of mining and of the service's scan for this machine.

numba compiles a kernel on its first call and caches it beside its source; without that cache
the first mining job of a fresh clone (in ``make demo``: the pipeline's mining stages) and each
server's first start wait for the compiler. ``make setup`` runs this command once, beside the
dataset's sources (docs/performance.md).
"""

from __future__ import annotations

import argparse
import logging
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the kernels compiled are those of this checkout, for this CPU."""


def run(args: argparse.Namespace) -> int:
    from aoq_serve.index.scan import compile_kernel
    from aoq_train.mining.warm import compile_kernels

    start = time.perf_counter()
    mining_log = logging.getLogger("aoq_train.mining")
    level = mining_log.level
    mining_log.setLevel(logging.WARNING)  # the tiny job's notes (probes, short lists) are not about any data
    try:
        precisions = compile_kernels()
    finally:
        mining_log.setLevel(level)
    compile_kernel()
    print(f"compiled the mining kernels ({', '.join(precisions)} products, text filters) and the service's scan "
          f"in {time.perf_counter() - start:.1f} s")
    return 0
