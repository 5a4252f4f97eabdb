"""Compile the mining kernels before a job needs them.

The kernels (:mod:`aoq_train.mining.kernels`, ``canonical``, ``int8``, ``filters``, ``text_flags``)
are compiled by numba on their first call and cached beside their sources, once per machine;
without that cache the first mining job of a fresh clone spends most of its time compiling
(docs/performance.md). :func:`compile_kernels` runs the code paths a job runs, on a tiny random
set, so that every kernel is compiled for the very argument types a real job passes, which a
list of hand-written signatures could miss.
"""

from __future__ import annotations

import logging
import tempfile

import numpy as np

from aoq_train.mining.driver import mine_offline_negatives
from aoq_train.mining.false_negatives import filtered_lists
from aoq_train.mining.filters import FilterInputs, text_ids
from aoq_train.mining.fused import ROW_TILE

log = logging.getLogger(__name__)

#: the products a CPU job can run; each has its own scan kernel
PRECISIONS = ("fp32", "bf16", "int8")
#: share of the images whose first caption has the same text
SHARED = 0.9
#: the text filters, whose flags are compiled lookups (the teacher's are numpy)
FILTERS = (("identity",), ("identity", "semantic"))


def compile_kernels() -> list[str]:
    """Mine a tiny random set in each precision, unfiltered and with each text filter (some of
    its lists run short, so the whole-gallery path runs too); returns the precisions this torch
    build could run (a build without int8 products on this CPU skips those)."""
    rng = np.random.default_rng(0)
    # more images than the sample phase scores in float32, so that the filtering scans run too
    n_images, cpi, dim = 2 * ROW_TILE + 100, 5, 16
    img = _unit_rows(rng.standard_normal((n_images, dim), dtype=np.float32))
    cap = _unit_rows(rng.standard_normal((n_images * cpi, dim), dtype=np.float32))
    # the first caption of most images shares one text: the identity filter leaves some caption
    # anchors' deep lists short (the whole-gallery path) but never the whole gallery
    shared = int(SHARED * n_images) * cpi
    captions = [f"caption {c}" if c % cpi or c >= shared else "a shared caption" for c in range(n_images * cpi)]
    ids = text_ids(captions)
    near = np.array([1], dtype=np.int64)  # texts 0 and 1 as near-duplicates (key 0 * T + 1)
    inputs = FilterInputs(cpi, ids, near, img, cap)
    ran = []
    with tempfile.TemporaryDirectory() as work:
        for precision in PRECISIONS:

            def mine(top_captions: int, top_images: int, precision: str = precision) -> tuple[np.ndarray, np.ndarray]:
                return mine_offline_negatives(img, cap, cpi, top_captions, top_images, ROW_TILE, "cpu", precision=precision,
                                              work_dir=work, progress=False)

            try:
                mine(20, 5)
            except (RuntimeError, NotImplementedError) as exc:
                log.info("mining kernels: %s products do not run here (%s); not compiled", precision, exc)
                continue
            for filters in FILTERS:
                filtered_lists(mine, 20, 5, n_images, cpi, inputs, filters)
            ran.append(precision)
    return ran


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)
