#!/usr/bin/env bash
# Makes sure a Docker engine answers. When none does and Debian's dockerd is installed (docker.io,
# `make system-deps`), starts it in the background as root, logging to AOQ_DOCKERD_LOG, and prints
# its process id on stdout (the only thing this script prints there), so that whoever asked for the
# engine can stop what it started (`scripts/docker-engine.sh --stop PID`); an engine that already
# answered is left alone and nothing is printed. Exit status 0 once `docker info` answers.
set -euo pipefail
if [ "${1:-}" = "--stop" ]; then
  pid=${2:?usage: docker-engine.sh --stop PID}
  # dockerd stops its containers and its own containerd on SIGTERM; wait for all of it to go
  kill -TERM "$pid" 2>/dev/null || exit 0
  for _ in $(seq 60); do
    kill -0 "$pid" 2>/dev/null || exit 0
    sleep 0.5
  done
  echo "docker-engine: dockerd ($pid) still running 30 s after SIGTERM; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
  exit 0
fi
docker info >/dev/null 2>&1 && exit 0
command -v dockerd >/dev/null || { echo "docker-engine: no dockerd (Debian: apt-get install docker.io)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "docker-engine: no Docker engine answers, and starting dockerd needs root" >&2; exit 1; }
log=${AOQ_DOCKERD_LOG:-/var/log/aoq-dockerd.log}
echo "docker-engine: starting dockerd (log: $log)" >&2
nohup setsid dockerd >>"$log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then
    echo "$pid"
    exit 0
  fi
  kill -0 "$pid" 2>/dev/null || { echo "docker-engine: dockerd exited at start; see $log" >&2; exit 1; }
  sleep 1
done
echo "docker-engine: dockerd did not answer within 60 s; see $log" >&2
kill -TERM "$pid" 2>/dev/null || true
exit 1
