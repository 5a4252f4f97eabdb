# Two commands matter: `make demo` and `make test`. Both do their own set-up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# These machines carry a CPU build of torch 2.13.0 on disk; a bare `torch` would pull CUDA.
TORCH_PIN ?= torch==2.13.0
STAMP  := $(VENV)/.installed
QUICK  ?=
# emoji (real pictures, pretrained encoders) or synth (the synthetic benchmark)
DATASET ?= emoji
BACKEND_PORT ?= 8000
UI_PORT ?= 7860
PYTEST_ARGS ?=
# Python caches a module's bytecode (__pycache__) the first time a process imports it, and every
# later process reads it back: the demo's servers and workers, the suite's server subprocesses.
# PYTHONDONTWRITEBYTECODE, set on some machines, makes each of them compile all it imports again
# (about 3 s of CPU for the service's imports alone); `setup` installs with --no-compile on the
# premise that the first import compiles once.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup system-deps data-deps test demo bench gpu-check clean

setup: $(STAMP)

# --no-compile: pip would byte-compile every module of every package (torch, transformers,
# gradio...), about half of its CPU time; Python compiles the modules a program imports, once.
# `aoq warm` compiles the numba kernels of mining and search, which the first job would otherwise
# wait for (cached beside their sources, for this CPU).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile "$(TORCH_PIN)"
	$(PY) -m pip install --quiet --no-compile -e ".[all,test]"
	$(VENV)/bin/aoq warm
	touch $(STAMP)

# Chromium + chromedriver for the browser tests; docker-compose, docker.io and debootstrap for the
# compose tests (validating the file, and building and running the stack).
system-deps:
	@bash scripts/system-deps.sh

# The emoji dataset's sources: Debian fonts/CLDR/Unicode data and the Twemoji npm package.
data-deps:
	@bash scripts/data-deps.sh

# One pytest-xdist worker per core, a test file's tests on one worker (its module fixtures built
# once); PYTEST_ARGS="-n 0" runs them in this process.
test: setup system-deps data-deps
	$(PY) -m pytest -n auto --dist loadfile $(PYTEST_ARGS)

# The venv and the dataset's sources are set up side by side (-j2); exec: the demo replaces the
# recipe's shell, so a signal to make's child reaches it directly.
demo:
	@$(MAKE) --no-print-directory -j2 setup $(if $(filter emoji,$(DATASET)),data-deps,)
	exec $(PY) -m aoq_cli.demo --dataset $(DATASET) $(if $(QUICK),--quick,) --backend-port $(BACKEND_PORT) --ui-port $(UI_PORT)

# Quick versions of the benchmarks; each prints a RESULT line of ratios measured in one run.
bench: setup
	$(PY) benchmarks/metrics_speed.py --quick
	$(PY) benchmarks/mining.py --quick
	$(PY) benchmarks/training_speed.py --quick
	$(PY) benchmarks/synth_speed.py --images 300
	$(PY) benchmarks/serving.py --gallery 20000 --queries 100 --duration 10

# The GPU path in one short run (docs/gpu.md); on a machine without CUDA it skips each part.
gpu-check: setup
	bash scripts/gpu-check.sh

clean:
	rm -rf $(VENV) .demo build *.egg-info
