#!/usr/bin/env bash
# What a sharded kcp (tests/control-plane/kcp/start-sharded.sh: a cache server, a root shard
# and two more, a front-proxy) costs to start on this machine: each phase's time to ready, then,
# after 30 s idle, each process's RSS, threads and Go goroutines. With kcp's quota controller on
# and off (the two flavours the tests start), R runs each (default 1), interleaved.
#
#   benches/kcp-sharded-start.sh [R]     # writes benches/results/kcp-sharded/start.md
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-1}
out=${LAZYQUOTA_BENCH_OUT:-benches/results/kcp-sharded}
state=$PWD/.lazyquota/bench-kcp-sharded
mkdir -p "$out"
commit=$(git rev-parse --short HEAD)
[[ -z $(git status --porcelain --untracked-files=no) ]] || commit+=" (uncommitted changes)"
trap 'bash tests/control-plane/kcp/stop.sh "$state" >/dev/null 2>&1 || true' EXIT

rows=()
starts=()
for run in $(seq 1 "$runs"); do
  for quota in on off; do
    echo "kcp-sharded-start: run $run, quota controller $quota" >&2
    log=$(LAZYQUOTA_KCP_DIR=$state LAZYQUOTA_KCP_QUOTA=$quota bash tests/control-plane/kcp/start-sharded.sh 2>&1 >/dev/null)
    phase() { sed -n "s/^kcp-sharded: $1.*(\([0-9]*\) s)$/\1/p" <<<"$log"; }
    cache=$(phase "cache server ready") shards=$(phase "3 shards ready") front=$(phase "front-proxy ready")
    total=$(sed -n 's/^kcp-sharded: ready in \([0-9]*\) s$/\1/p' <<<"$log")
    sleep 30
    # shellcheck source=/dev/null
    source "$state/env"
    certs=$state/certs
    goroutines() { # goroutines URL: go_goroutines from the process's /metrics (as shard admin)
      curl -fsS --max-time 5 --cacert "$certs/serving-ca.crt" --cert "$certs/shard-admin.crt" \
        --key "$certs/shard-admin.key" "$1/metrics" 2>/dev/null | sed -n 's/^go_goroutines \([0-9]*\)$/\1/p'
    }
    proc() { # proc NAME PID URL
      local rss threads
      rss=$(awk '/^VmRSS:/ {printf "%.0f", $2 / 1024}' "/proc/$2/status")
      threads=$(awk '/^Threads:/ {print $2}' "/proc/$2/status")
      rows+=("| $run | $quota | $1 | $rss | $threads | ${3:+$(goroutines "$3")} |")
    }
    proc cache-server "$LAZYQUOTA_KCP_CACHE_PID" ""
    for n in 0 1 2; do
      name=LAZYQUOTA_KCP_SHARD_${n}_NAME pid=LAZYQUOTA_KCP_SHARD_${n}_PID url=LAZYQUOTA_KCP_SHARD_${n}_URL
      proc "${!name}" "${!pid}" "${!url}"
    done
    proc front-proxy "$LAZYQUOTA_KCP_FRONT_PROXY_PID" ""
    starts+=("| $run | $quota | $cache | $shards | $front | $total |")
    bash tests/control-plane/kcp/stop.sh "$state" >/dev/null
  done
done

{
  echo "# A sharded kcp's start on this machine"
  echo
  echo "Commit: $commit. Command: \`benches/kcp-sharded-start.sh $runs\` ($(nproc) cores)."
  echo "kcp v0.32.3 built by tests/control-plane/kcp/build.sh; a cache server, a root shard and"
  echo "two more (embedded etcd each), a front-proxy, started by start-sharded.sh on loopback."
  echo
  echo "## Seconds to ready, from the script's start"
  echo
  echo "| run | kcp quota controller | cache server | 3 shards | front-proxy | all |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${starts[@]}"
  echo
  echo "## Each process after 30 s idle"
  echo
  echo "Go goroutines from the shards' /metrics (the cache server and the front-proxy are not asked)."
  echo
  echo "| run | kcp quota controller | process | RSS MiB | threads | goroutines |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$out/start.md"
echo "kcp-sharded-start: wrote $out/start.md" >&2
