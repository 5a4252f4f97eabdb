"""`aoq warm` compiles every numba kernel a real mining job and the service's scan call, for the
argument types they pass: after it, a filtered mining job and both kinds of served index load
every kernel from the cache and compile none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A filtered `aoq mine` (identity, the demo's filter; precision auto) on a precomp fixture with
# more images than the miner's float32 sample phase, then the scan of a private and a shared
# index; prints every kernel's compiled (missed) and cached (hit) signatures.
JOB = r"""
import json, sys, tempfile
from pathlib import Path
import numpy as np, torch
from aoq.checkpoint import save_checkpoint
from aoq.config import config_from_dict
from aoq.data.load import load_split
from aoq.data.vocab import Vocabulary
from aoq.models.joint import build_model
from aoq_cli.main import main
from aoq_serve.index import scan
from aoq_serve.index.shared import set_share_dir
from aoq_train.mining import canonical, filters, int8, kernels, text_flags
from tests.fixtures import write_precomp_fixture

tmp = Path(sys.argv[1])
data = write_precomp_fixture(tmp / "data", {"train": 1200, "dev": 3, "test": 3}, regions=2, dim=6)
captions = (data / "train_caps.txt").read_text().splitlines()
for c in range(0, 5 * 1080, 5):  # most images: some caption lists run short (the whole-gallery path)
    captions[c] = "one caption text many images share"
(data / "train_caps.txt").write_text("\n".join(captions) + "\n")
cfg = config_from_dict({"name": "m", "out_dir": str(tmp / "run"), "data": {"path": str(data), "vocab_threshold": 1},
                        "model": {"embed_dim": 8, "word_dim": 8}, "mining": {"top_captions": 20, "top_images": 5},
                        "round2": {"h_t": 10, "h_i": 2}})
vocab = Vocabulary.build(load_split(cfg.data, "train").captions, 1)
torch.manual_seed(0)
save_checkpoint(tmp / "ckpt", build_model(cfg.model, len(vocab), 6), cfg, vocab, {"rsum": 0.0})
assert main(["mine", "--checkpoint", str(tmp / "ckpt"), "--no-progress", "--set", "mining.filters=[identity]"]) == 0
vectors = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
scan.FlatScan.from_vectors(vectors, np.arange(300)).search(vectors[:3], 5)
set_share_dir(tmp / "share")
(tmp / "share").mkdir()
scan.FlatScan.from_vectors(vectors, np.arange(300)).search(vectors[:3], 5)
stats = {}
for module in (canonical, filters, int8, kernels, text_flags, scan):
    for name, value in vars(module).items():
        if hasattr(value, "stats") and hasattr(value, "signatures") and value.__module__ == module.__name__:
            stats[f"{module.__name__}.{name}"] = {"hits": sum(value.stats.cache_hits.values()),
                                                  "misses": sum(value.stats.cache_misses.values())}
print(json.dumps(stats))
"""


@pytest.mark.slow
def test_after_aoq_warm_a_filtered_mining_job_and_the_scan_compile_nothing(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(ROOT)}
    warm = subprocess.run([sys.executable, "-m", "aoq_cli.main", "warm"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert "compiled the mining kernels (fp32, bf16" in warm.stdout
    job = subprocess.run([sys.executable, "-c", JOB, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    assert job.returncode == 0, job.stderr[-2000:]
    stats = json.loads(job.stdout.strip().splitlines()[-1])
    used = {name: s for name, s in stats.items() if s["hits"] or s["misses"]}
    # the job reached the kernels of each kind of work: scores, filters, text flags, the scan
    assert {"aoq_train.mining.kernels.append", "aoq_train.mining.canonical.rescore",
            "aoq_train.mining.filters._compact_rows", "aoq_train.mining.text_flags.flag_progressively",
            "aoq_train.mining.text_flags.mask_flagged", "aoq_serve.index.scan._scan"} <= set(used)
    assert {name: s["misses"] for name, s in used.items() if s["misses"]} == {}
    assert used["aoq_serve.index.scan._scan"]["hits"] == 2  # a private and a shared (read-only) gallery
