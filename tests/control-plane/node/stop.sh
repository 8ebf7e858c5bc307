#!/usr/bin/env bash
# Stops the node flavour started by ./start.sh and leaves nothing behind: the kubelets, every
# container and shim (killed through their cgroups), containerd, kube-scheduler and the control
# plane; then unmounts what the nodes mounted, removes their cgroups and /run directories and
# restores the sysctls the kubelet changed.
# Usage: stop.sh [STATE_DIR]   (default: $LAZYQUOTA_NODE_DIR or <repo>/.lazyquota/node)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
dir=${1:-${LAZYQUOTA_NODE_DIR:-$repo/.lazyquota/node}}
[[ -d $dir ]] || exit 0
dir=$(cd "$dir" && pwd)

stop_pid() {
  # stop_pid PIDFILE: SIGTERM to the process group, SIGKILL after 10 s.
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$pidfile"
}

# Every process in a cgroup subtree (deepest first does not matter for SIGKILL).
kill_cgroup() {
  local cg=$1 procs
  [[ -d $cg ]] || return 0
  for _ in 1 2 3 4 5; do
    procs=$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
    [[ -z $procs ]] && return 0
    # shellcheck disable=SC2086
    kill -KILL $procs 2>/dev/null
    sleep 0.2
  done
}

for node in "$dir"/node-*/; do
  [[ -d $node ]] || continue
  node=${node%/}
  n=${node##*-}
  stop_pid "$node/kubelet.pid"
  # The containers run in the node's cgroups; their shims are children of containerd's
  # process group or reparented to init, found by the socket address they serve.
  for cg in /sys/fs/cgroup/lazyquota-node-"$n" /sys/fs/cgroup/*/lazyquota-node-"$n"; do
    kill_cgroup "$cg"
  done
  run=$(cat "$node/run-dir" 2>/dev/null)
  if [[ -n $run ]]; then
    pkill -KILL -f "containerd-shim-runc-v2 .*-address $run/containerd.sock" 2>/dev/null
  fi
  stop_pid "$node/containerd.pid"
  # Rootfs overlays, sandbox shm and pod volumes (tmpfs for projected tokens): deepest first.
  for root in "$run" "$node"; do
    [[ -n $root ]] || continue
    awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done
  done
  [[ -n $run ]] && rm -rf "$run"
  for cg in /sys/fs/cgroup/lazyquota-node-"$n" /sys/fs/cgroup/*/lazyquota-node-"$n"; do
    [[ -d $cg ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
  done
done
stop_pid "$dir/kube-scheduler.pid"
bash "$here/../stop.sh" "$dir/cp" >/dev/null 2>&1

if [[ -f $dir/sysctls.saved ]]; then
  while IFS== read -r key value; do
    echo "$value" > "/proc/sys/$key" 2>/dev/null
  done < "$dir/sysctls.saved"
  rm -f "$dir/sysctls.saved"
fi
printf 'node: stopped %s\n' "$dir" >&2
