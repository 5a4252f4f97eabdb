#!/usr/bin/env bash
# Prepares what `docker-compose build` needs, on machines where Docker Hub may be unreachable:
#   1. the base image, AOQ_BASE_IMAGE (default aoq-base:bookworm). When it is not there yet, an
#      aoq-base:* image is made from Debian with debootstrap (about 2 minutes, root only); any
#      other name (e.g. python:3.11-slim) is pulled.
#   2. docker/local/ (git-ignored), copied into the build stage only: the CPU build of the pinned
#      torch (a plain PyPI torch brings gigabytes of CUDA libraries) and a pip.conf with this
#      machine's CA bundle, so pip inside the build trusts what pip here trusts.
# Idempotent: a second run with everything in place takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${AOQ_BASE_IMAGE:-aoq-base:bookworm}
SUITE=bookworm  # Python 3.11, the version of the torch wheel below
PY_TAG=cp311
LOCAL=docker/local
TORCH_VERSION=$(sed -n 's/^TORCH_PIN ?= *torch==//p' Makefile)
[ -n "$TORCH_VERSION" ] || { echo "docker-base: no 'TORCH_PIN ?= torch==X' line in the Makefile" >&2; exit 1; }
PIP=(python3 -m pip)

# The first http(s) Debian mirror apt uses here (deb822 or one-line sources), else deb.debian.org.
debian_mirror() {
  local uri
  uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -oE '(URIs:|^deb)[[:space:]]+https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
        | grep -oE 'https?://[^[:space:]]+' | head -n 1 || true)
  echo "${AOQ_DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

make_base_image() {
  if docker image inspect "$BASE" >/dev/null 2>&1; then
    echo "docker-base: $BASE is there"
    return
  fi
  if [[ "$BASE" != aoq-base:* ]]; then
    docker pull "$BASE"
    return
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "docker-base: making $BASE needs root (debootstrap); or set AOQ_BASE_IMAGE=python:3.11-slim" >&2
    exit 1
  fi
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  local mirror root
  mirror=$(debian_mirror)
  root=$(mktemp -d /var/tmp/aoq-base.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "docker-base: debootstrap $SUITE from $mirror (about 2 minutes)"
  debootstrap --variant=minbase "$SUITE" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 20 "$root.log" >&2; echo "docker-base: debootstrap failed (log: $root.log)" >&2; exit 1; }
  rm -f "$root.log"
  # no package cache or lists in the image: every Dockerfile starts with apt-get update
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$BASE" >/dev/null
  rm -rf "$root"
  trap - EXIT
  echo "docker-base: made $BASE"
}

# Folders pip here looks in for wheels (PIP_FIND_LINKS and pip's configuration).
find_links() {
  { echo "${PIP_FIND_LINKS:-}"; "${PIP[@]}" config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p"; } \
    | tr ' ' '\n' | sed 's#^file://##' | sort -u
}

prepare_torch_wheel() {
  mkdir -p "$LOCAL/wheels"
  local name="torch-${TORCH_VERSION}+cpu-${PY_TAG}-${PY_TAG}-*.whl" dir wheel
  if compgen -G "$LOCAL/wheels/$name" >/dev/null; then
    return
  fi
  while read -r dir; do
    [ -d "$dir" ] || continue
    for wheel in "$dir"/$name; do
      if [ -f "$wheel" ]; then
        # a hard link when the folders share a file system (no 190 MB copy)
        ln -f "$wheel" "$LOCAL/wheels/" 2>/dev/null || cp "$wheel" "$LOCAL/wheels/"
        echo "docker-base: torch wheel from $dir"
        return
      fi
    done
  done < <(find_links)
  echo "docker-base: downloading the CPU torch $TORCH_VERSION wheel"
  "${PIP[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --index-url https://download.pytorch.org/whl/cpu \
    -d "$LOCAL/wheels" "torch==${TORCH_VERSION}+cpu"
}

# pip settings for the build stage: find the wheel above, trust this machine's CA bundle.
write_pip_conf() {
  local cert conf
  cert=${PIP_CERT:-$("${PIP[@]}" config get global.cert 2>/dev/null || true)}
  conf=$(mktemp "$LOCAL/pip.conf.XXXXXX")
  {
    echo "[global]"
    echo "find-links = /tmp/aoq-build/wheels"
    if [ -n "$cert" ] && [ -f "$cert" ]; then
      cp "$cert" "$LOCAL/ca.crt.tmp" && mv "$LOCAL/ca.crt.tmp" "$LOCAL/ca.crt"
      echo "cert = /tmp/aoq-build/ca.crt"
    fi
  } >"$conf"
  chmod 644 "$conf"
  mv "$conf" "$LOCAL/pip.conf"
}

make_base_image
prepare_torch_wheel
write_pip_conf
echo "docker-base: ready (base $BASE, build inputs in $LOCAL/)"
