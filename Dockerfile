# The image runs exactly the steps of `make setup` (a venv with the pinned torch, then the package):
# tests/test_compose.py checks that `make setup` is its only install step and that every file
# the install needs is copied. Run scripts/docker-base.sh first: it makes the base image and
# docker/local/ (the CPU torch wheel, pip settings). No BuildKit features: docker-compose 1.x
# builds with the classic builder.
#
# BASE_IMAGE: bare Debian bookworm made locally (Docker Hub may be unreachable); with Docker Hub,
# python:3.11-slim works as well (then Debian's python3 is installed beside it, unused).
ARG BASE_IMAGE=aoq-base:bookworm

FROM ${BASE_IMAGE} AS python
# inherited by every stage: tests/test_compose_run.py prunes the untagged images it marks
LABEL io.aoq.project=aoq-retrieval
# an imported root file system has no PATH of its own (the ENV below extends it)
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv make ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app

# Build stage: the torch wheel and the CA bundle stay here, out of the final image.
FROM python AS build
COPY docker/local /tmp/aoq-build
RUN test -n "$(ls /tmp/aoq-build/wheels/torch-*+cpu-*.whl 2>/dev/null)" \
    || (echo "docker/local/wheels has no CPU torch wheel: run scripts/docker-base.sh first" >&2 && false)
COPY pyproject.toml setup.py README.md Makefile ./
# one line per top-level package (setup.py maps each folder to its installed name)
COPY aoq ./aoq
COPY cli ./cli
COPY training ./training
COPY backend ./backend
COPY ui ./ui
RUN PIP_CONFIG_FILE=/tmp/aoq-build/pip.conf PIP_NO_CACHE_DIR=1 make setup
# read at run time only (the demo's experiment configs), so editing them reinstalls nothing
COPY configs ./configs

FROM python
COPY --from=build /app /app
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
