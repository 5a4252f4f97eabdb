#!/usr/bin/env bash
# Installs the system packages the test suite drives: Chromium and chromedriver (browser tests),
# docker-compose (validates docker-compose.yml), and Debian's Docker engine with debootstrap
# (tests/test_compose_run.py builds and runs the stack; scripts/docker-engine.sh starts dockerd).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" \
       "or the browser/compose tests will be skipped." >&2
  exit 0
fi
echo "system-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
