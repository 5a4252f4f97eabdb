"""The machine line every benchmark prints first (aoq.device.cpu_description)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from aoq.device import cpu_description, cpu_model

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) CPU @ 2.50GHz
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni

processor\t: 1
model name\t: ignored: the first CPU's lines are read
"""
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_names_the_cpu_and_its_speed_flags() -> None:
    line = cpu_description(XEON)
    assert line.startswith('cpu="Intel(R) Xeon(R) CPU @ 2.50GHz" family=6 model=85 cores=')
    assert line.endswith(f" flags=avx2,fma,avx512f,avx512_vnni torch_threads={torch.get_num_threads()}")
    assert "flags=none" in cpu_description("model name\t: a CPU without the flags line\n")


def test_the_model_names_the_generation() -> None:
    assert cpu_model(XEON) == "Intel(R) Xeon(R) CPU @ 2.50GHz (family 6 model 85)"
    assert cpu_model("model name\t: AMD EPYC\n") == "AMD EPYC (family ? model ?)"


def test_every_benchmark_prints_it() -> None:
    # the scripts one runs; a helper module beside them (benchmarks/mining_checks.py) has no main
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if '__name__ == "__main__"' in p.read_text())
    assert len(scripts) >= 9
    for script in scripts:
        calls = [node for node in ast.walk(ast.parse(script.read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
                 and any(isinstance(a, ast.Call) and getattr(a.func, "id", None) == "cpu_description" for a in node.args)]
        assert calls, f"{script.name} does not print cpu_description()"
