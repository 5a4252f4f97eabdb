#!/usr/bin/env bash
# The GPU path in one command (docs/gpu.md): tests that skip without CUDA, training speed at COCO
# shapes with and without AMP, COCO-scale mining, a two-round synthetic run, faiss-gpu serving.
# Writes $GPU_CHECK_OUT/summary.json and check.log (default artifacts/gpu-check/). Without CUDA
# every part is skipped with a line saying so; GPU_CHECK_TINY=1 runs them on the CPU at toy sizes.
# Set-up: the project's venv (make setup) with a CUDA build of torch; faiss-gpu-cu12 for serving.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
OUT="${GPU_CHECK_OUT:-artifacts/gpu-check}"
ARGS=(--out "$OUT")
[ "${GPU_CHECK_TINY:-0}" = 1 ] && ARGS+=(--tiny)
# The whole check must fit 8 minutes including set-up: the two-round run gets what is left.
exec timeout "${GPU_CHECK_TIMEOUT_S:-450}" "$PY" benchmarks/gpu_check.py "${ARGS[@]}" "$@"
