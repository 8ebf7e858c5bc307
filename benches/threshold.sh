#!/usr/bin/env bash
# What a namespaced watch costs against one cluster-wide watch filtered at ingest: the
# measurement behind lazyquota's --namespace-watch-threshold default.
#
# M namespaces (default 32) each get a `count/configmaps` quota and C ConfigMaps (default 50);
# a further U namespaces (default 32) hold C ConfigMaps each but no quota. lazyquota (release
# build) runs twice: with the threshold above M (M namespaced watches) and at 0 (one
# cluster-wide watch that also receives the U unconstrained namespaces' objects). Reports
# tasks, heap, RSS and watch connections of each, and the per-watch difference.
#
#   benches/threshold.sh [M] [U] [C]      # writes benches/results/threshold.md
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
m=${1:-32} u=${2:-32} c=${3:-50}
out=${LAZYQUOTA_BENCH_OUT:-benches/results}
state=$PWD/.lazyquota/bench-threshold
mkdir -p "$out"

cargo build --release --bin lazyquota >&2
LAZYQUOTA_CP_DIR=$state LAZYQUOTA_KCM_QUOTA=off bash tests/control-plane/start.sh >/dev/null
trap 'bash tests/control-plane/stop.sh "$state" >/dev/null 2>&1; kill $(jobs -p) 2>/dev/null || true' EXIT
# shellcheck source=/dev/null
source "$state/env"
k() { "$LAZYQUOTA_CP_BIN/kubectl" --kubeconfig "$LAZYQUOTA_KUBECONFIG" "$@"; }
port=${LAZYQUOTA_APISERVER_URL##*:}

echo "threshold: creating $((m + u)) namespaces with $c ConfigMaps each" >&2
for i in $(seq 1 $((m + u))); do
  {
    echo "apiVersion: v1"; echo "kind: Namespace"; echo "metadata: {name: t-$i}"
    for j in $(seq 1 "$c"); do
      echo "---"; echo "apiVersion: v1"; echo "kind: ConfigMap"
      echo "metadata: {name: cm-$j, namespace: t-$i}"; echo "data: {k: '$(printf '%0100d' 0)'}"
    done
  } | k apply -f - >/dev/null
done
for i in $(seq 1 "$m"); do
  k -n "t-$i" create quota q --hard=count/configmaps=100000 >/dev/null
done

measure() {
  # measure THRESHOLD: runs lazyquota until every quota is written, then samples it.
  local threshold=$1 mport
  mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  RUST_LOG=warn "target/$(rustc --print host-tuple)/release/lazyquota" run --kubeconfig "$LAZYQUOTA_KUBECONFIG" \
    --namespace-watch-threshold "$threshold" --metrics-addr "127.0.0.1:$mport" 2>/dev/null &
  local pid=$!
  local want=$((c + 1)) # plus the root CA ConfigMap
  for _ in $(seq 1 300); do
    local done=0
    for i in $(seq 1 "$m"); do
      [[ $(k -n "t-$i" get quota q -o jsonpath='{.status.used.count/configmaps}' 2>/dev/null) == "$want" ]] && done=$((done + 1))
    done
    [[ $done == "$m" ]] && break
    sleep 0.5
  done
  sleep 3
  local metrics
  metrics=$(curl -s "127.0.0.1:$mport/metrics")
  local tasks heap rss conns
  tasks=$(awk '/^lazyquota_tokio_alive_tasks /{print $2}' <<<"$metrics")
  heap=$(awk '/^lazyquota_jemalloc_allocated_bytes /{print $2}' <<<"$metrics")
  rss=$(awk '/^lazyquota_process_resident_memory_bytes /{print $2}' <<<"$metrics")
  conns=$(ss -tnpH state established "( dport = :$port )" | grep -c "pid=$pid," || true)
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  echo "$tasks $heap $rss $conns"
}

read -r nt nh nr nc <<<"$(measure $((m + 1)))"
read -r ct ch cr cc <<<"$(measure 0)"
per() { python3 -c "print(f'{($1 - $2) / ($3 - 1):.1f}')"; }
{
  echo "# Namespaced watches vs one cluster-wide watch"
  echo
  echo "\`benches/threshold.sh $m $u $c\`: $m namespaces demand count/configmaps, $u more hold ConfigMaps but no quota, $c ConfigMaps (~100 B of data) per namespace; lazyquota release build, HTTP/1.1."
  echo
  echo "| watch scope | watches | tokio tasks | heap (jemalloc allocated) | RSS | connections to the apiserver |"
  echo "|---|---|---|---|---|---|"
  echo "| namespaced (threshold $((m + 1))) | $m | $nt | $((nh / 1024)) KiB | $((nr / 1024)) KiB | $nc |"
  echo "| cluster-wide (threshold 0) | 1 | $ct | $((ch / 1024)) KiB | $((cr / 1024)) KiB | $cc |"
  echo
  echo "Per extra namespaced watch: $(per "$nt" "$ct" "$m") tasks, $(per "$nh" "$ch" "$m") bytes of heap, $(per "$nr" "$cr" "$m") bytes of RSS, $(per "$nc" "$cc" "$m") connections."
} | tee "$out/threshold.md"
