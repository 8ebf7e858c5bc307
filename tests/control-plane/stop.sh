#!/usr/bin/env bash
# Stops a control plane started by start.sh and leaves no process behind: SIGTERM to each
# component's process group (KCM first, etcd last), then SIGKILL after a grace period.
# Usage: stop.sh [STATE_DIR]   (default: $LAZYQUOTA_CP_DIR or <repo>/.lazyquota/control-plane)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=${1:-${LAZYQUOTA_CP_DIR:-$repo/.lazyquota/control-plane}}
grace=${LAZYQUOTA_STOP_GRACE:-10}

[[ -d $dir ]] || exit 0
stopped=0
extra=()
for pidfile in "$dir"/kube-apiserver-*.pid; do
  [[ -f $pidfile ]] && extra+=("$(basename "$pidfile" .pid)")
done
for name in kube-controller-manager "${extra[@]}" kube-apiserver etcd; do
  pidfile=$dir/$name.pid
  [[ -f $pidfile ]] || continue
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    # start.sh runs each component under setsid, so its pid is also its process group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 $((grace * 10))); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
    stopped=$((stopped + 1))
  fi
  rm -f "$pidfile"
done
printf 'control-plane: stopped %d component(s) in %s\n' "$stopped" "$dir" >&2
