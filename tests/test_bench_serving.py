"""benchmarks/serving.py end to end on a tiny gallery: the benchmark builds its index the way the
service checks it (a change to what an index must record once left it serving no model)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_the_serving_benchmark_runs_and_prints_its_result() -> None:
    out = subprocess.run([sys.executable, "benchmarks/serving.py", "--gallery", "2000", "--queries", "20",
                          "--duration", "1", "--clients", "4", "--workers", "1", "--rerank-queries", "5"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = re.search(r"^RESULT .*\bqps=([\d.]+) .*\berrors=(\d+)$", out.stdout, re.M)
    assert result, out.stdout[-3000:]
    assert float(result.group(1)) > 0 and int(result.group(2)) == 0
    rerank = re.search(r"^RESULT rerank_p50_ms=([\d.]+) rerank_p95_ms=([\d.]+) shortlist_n=100 regions=36 dim=1024 "
                       r"model=bfan$", out.stdout, re.M)
    assert rerank and 0 < float(rerank.group(1)) <= float(rerank.group(2)), out.stdout[-3000:]
