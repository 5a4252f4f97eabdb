#!/usr/bin/env bash
# Makes sure a Docker engine answers. When none does and Debian's dockerd is installed (docker.io,
# `make system-deps`), starts it in the background as root, logging to AOQ_DOCKERD_LOG; it keeps
# running afterwards like any system daemon. Exit status 0 once `docker info` answers.
set -euo pipefail
docker info >/dev/null 2>&1 && exit 0
command -v dockerd >/dev/null || { echo "docker-engine: no dockerd (Debian: apt-get install docker.io)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "docker-engine: no Docker engine answers, and starting dockerd needs root" >&2; exit 1; }
log=${AOQ_DOCKERD_LOG:-/var/log/aoq-dockerd.log}
echo "docker-engine: starting dockerd (log: $log)" >&2
nohup setsid dockerd >>"$log" 2>&1 </dev/null &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "docker-engine: dockerd did not answer within 60 s; see $log" >&2
exit 1
