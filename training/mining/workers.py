"""The mining pass's worker threads: one per torch thread, each running single-threaded kernels."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch


@contextmanager
def worker_pool() -> Iterator[ThreadPoolExecutor]:
    """An executor with one worker thread per torch thread, each running single-threaded
    torch kernels; torch's thread count is 1 inside and restored after. A new thread does not
    inherit the count set by another: a worker that did not set its own would run every product
    on all cores, and the workers together would oversubscribe them (more CPU time for the same
    pass). On an error, tasks not yet started are cancelled."""
    threads = torch.get_num_threads()
    workers = max(1, threads)
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="mining", initializer=torch.set_num_threads,
                                initargs=(1,)) as ex:
            try:
                yield ex
            except BaseException:  # an error or an interruption: drop the queued tasks, not wait for them
                ex.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        torch.set_num_threads(threads)
