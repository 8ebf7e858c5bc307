#!/usr/bin/env bash
# Stops a kcp started by start.sh and leaves no process behind: SIGTERM to its process group,
# SIGKILL after a grace period. Usage: stop.sh [STATE_DIR] (default: $LAZYQUOTA_KCP_DIR or
# <repo>/.lazyquota/kcp). A directory without a running kcp is fine.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
dir=${1:-${LAZYQUOTA_KCP_DIR:-$repo/.lazyquota/kcp}}
grace=${LAZYQUOTA_STOP_GRACE:-15}

pidfile=$dir/kcp.pid
[[ -f $pidfile ]] || exit 0
pid=$(cat "$pidfile")
if kill -0 "$pid" 2>/dev/null; then
  # start.sh runs kcp under setsid: its pid is its process group.
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  printf 'kcp: stopped %s\n' "$dir" >&2
fi
rm -f "$pidfile"
