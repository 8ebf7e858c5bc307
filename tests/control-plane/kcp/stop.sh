#!/usr/bin/env bash
# Stops a kcp started by start.sh or start-sharded.sh and leaves no process behind: SIGTERM to
# each process group (the front-proxy, the shards, the cache server: every <name>.pid in the
# directory), SIGKILL after a grace period. Usage: stop.sh [STATE_DIR] (default:
# $LAZYQUOTA_KCP_DIR or <repo>/.lazyquota/kcp). A directory without a running kcp is fine.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
dir=${1:-${LAZYQUOTA_KCP_DIR:-$repo/.lazyquota/kcp}}
grace=${LAZYQUOTA_STOP_GRACE:-15}

shopt -s nullglob
pidfiles=("$dir"/*.pid)
((${#pidfiles[@]})) || exit 0
running=()
for pidfile in "${pidfiles[@]}"; do
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    # The start scripts run each process under setsid: its pid is its process group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    running+=("$pid")
  fi
done
for _ in $(seq 1 $((grace * 10))); do
  alive=0
  for pid in "${running[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  ((alive)) || break
  sleep 0.1
done
for pid in "${running[@]}"; do
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
done
if ((${#running[@]})); then printf 'kcp: stopped %s (%d processes)\n' "$dir" "${#running[@]}" >&2; fi
rm -f "${pidfiles[@]}"
