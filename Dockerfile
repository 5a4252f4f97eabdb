# The image runs exactly the steps of `make setup` (a venv with the pinned torch, then the package):
# tests/test_compose.py checks that `make setup` is its only install step and that every file
# the install needs is copied.
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*

# Where pip may also look for torch: the CPU wheels by default, since a plain PyPI torch brings
# gigabytes of CUDA libraries. Build with --build-arg TORCH_INDEX_URL=https://pypi.org/simple for those.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY pyproject.toml README.md Makefile ./
COPY aoq ./aoq
COPY training ./training
COPY backend ./backend
COPY ui ./ui
COPY configs ./configs
COPY scripts ./scripts
RUN PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL" PIP_NO_CACHE_DIR=1 make setup

# The services run as an unprivileged user who may create files in /app (the demo's state); the
# volume folders exist (and are theirs) in the image, so fresh named volumes start with that owner.
RUN useradd --create-home --uid 1000 aoq && mkdir -p /app/data /app/runs \
    && chown aoq:aoq /app /app/data /app/runs
USER aoq

ENV PATH="/app/.venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    AOQ_DATA_DIR=/app/data \
    AOQ_RUNS_DIR=/app/runs
VOLUME ["/app/data", "/app/runs"]
EXPOSE 8000 7860
CMD ["aoq", "serve", "--host", "0.0.0.0", "--port", "8000"]
