#!/usr/bin/env bash
# The chart on real nodes against a sharded kcp: one release per shard, as docs/kcp.md says to
# run it. Needs the node flavour started by node-test.sh (LAZYQUOTA_NODE_DIR) and helm; takes a
# sharded kcp (kcp's quota controller off, so the releases are the only writers) from
# $LAZYQUOTA_KCP_SHARDED_DIR, else the tests' if it is running, else starts one and stops it.
#
#   1. workspaces placed on the root shard, shard-1 and shard-2, each with a quota; a home
#      workspace on shard-1 for its release's Lease (`root` lives on the root shard only)
#   2. helm install twice: release lq-root (--kcp-shard-url of the root shard) and lq-shard-1,
#      each with a kubeconfig Secret for its shard and two pods -> four pods Ready, one leader
#      per release (its Lease in its shard's home cluster)
#   3. each release writes its own shard's quota exactly; shard-2's quota, with no release
#      for its shard, gets no status
#   4. Prometheus scrapes all four pods with the shard as a label; each shard's series name
#      only that shard's logical cluster
#   5. helm uninstall of both
#
# Usage: node-kcp-test.sh HELM
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
helm=${1:?usage: node-kcp-test.sh HELM}
dir=${LAZYQUOTA_NODE_DIR:?the state directory of the node flavour (node-test.sh sets it)}
ns=lazyquota-kcp

who=helm-kcp
# shellcheck source=lib.sh
source "$here/lib.sh"

# shellcheck source=/dev/null
source "$dir/env"
kubectl=("$LAZYQUOTA_CP_BIN/kubectl" --kubeconfig "$LAZYQUOTA_KUBECONFIG")
work=$(mktemp -d)
own_kcp=
cleanup() {
  local rc=$?
  if ((rc != 0)); then
    say "state at failure:"
    "${kubectl[@]}" -n "$ns" get pods -o wide >&2 || true
    "${kubectl[@]}" -n "$ns" logs -l app.kubernetes.io/name=lazyquota --tail 15 --prefix >&2 || true
  fi
  [[ -n ${prom_pid:-} ]] && kill "$prom_pid" 2>/dev/null
  for release in lq-root lq-shard-1; do "$helm" uninstall "$release" -n "$ns" >/dev/null 2>&1 || true; done
  [[ -n $own_kcp ]] && bash "$repo/tests/control-plane/kcp/stop.sh" "$own_kcp"
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

# --- the sharded kcp -------------------------------------------------------------------------
kcp_dir=${LAZYQUOTA_KCP_SHARDED_DIR:-$repo/.lazyquota/testenv-kcp-sharded-lazyquota-only}
front_ready() { curl -fsSk --max-time 3 "$(sed -n 's/^LAZYQUOTA_KCP_URL=//p' "$kcp_dir/env")/readyz"; }
if [[ -f $kcp_dir/env ]] && grep -q '^LAZYQUOTA_KCP_QUOTA=off$' "$kcp_dir/env" && front_ready >/dev/null 2>&1; then
  say "using the sharded kcp in $kcp_dir"
else
  kcp_dir=$repo/.lazyquota/helm-kcp-sharded
  own_kcp=$kcp_dir
  step "starting a sharded kcp (quota controller off)"
  LAZYQUOTA_KCP_DIR=$kcp_dir LAZYQUOTA_KCP_QUOTA=off bash "$repo/tests/control-plane/kcp/start-sharded.sh" >/dev/null
fi
# shellcheck source=/dev/null
source "$kcp_dir/env"
kcp=("$LAZYQUOTA_CP_BIN/kubectl" --kubeconfig "$LAZYQUOTA_KCP_KUBECONFIG" --context base)
at() { local path=$1; shift; "${kcp[@]}" --server "$LAZYQUOTA_KCP_URL/clusters/$path" "$@"; }
tag=lqh$(date +%s)

# --- 1. workspaces ---------------------------------------------------------------------------
step "1. workspaces on each shard"
workspace() { # workspace NAME SHARD: placed on SHARD, prints its logical cluster once Ready
  at root create -f - >/dev/null <<EOF
apiVersion: tenancy.kcp.io/v1alpha1
kind: Workspace
metadata: {name: $1}
spec: {location: {selector: {matchLabels: {name: $2}}}}
EOF
  local start=$SECONDS
  until [[ $(at root get workspace "$1" -o jsonpath='{.status.phase}') == Ready ]]; do
    ((SECONDS - start < 90)) || die "workspace $1 not Ready within 90 s"
    sleep 1
  done
  at root get workspace "$1" -o jsonpath='{.spec.cluster}'
}
declare -A cluster
for shard in root shard-1 shard-2; do
  cluster[$shard]=$(workspace "$tag-$shard" "$shard")
  path=root:$tag-$shard
  eventually 30 "root:$tag-$shard serves requests" at "$path" get --raw /version
  at "$path" create namespace team >/dev/null
  for name in one two three; do at "$path" -n team create configmap "$name" >/dev/null; done
  at "$path" -n team create quota q --hard=count/configmaps=10 >/dev/null
  say "root:$tag-$shard is logical cluster ${cluster[$shard]} on $shard"
done
home=$(workspace "$tag-home" shard-1)
eventually 30 "the shard-1 home workspace serves requests" at "root:$tag-home" get --raw /version
at root create namespace "$ns" 2>/dev/null || true
at "root:$tag-home" create namespace "$ns" >/dev/null

# --- 2. two releases -------------------------------------------------------------------------
step "2. helm install, one release per shard"
# shellcheck source=../control-plane/ports.sh
source "$repo/tests/control-plane/ports.sh"
"${kubectl[@]}" create namespace "$ns" >/dev/null
declare -A port
for n in 0 1; do
  var=LAZYQUOTA_KCP_SHARD_${n}_NAME
  shard=${!var}
  var=LAZYQUOTA_KCP_SHARD_${n}_URL
  url=${!var}
  var=LAZYQUOTA_KCP_SHARD_${n}_KUBECONFIG
  # The pod has no certificate files: everything inline.
  "$LAZYQUOTA_CP_BIN/kubectl" config view --kubeconfig "${!var}" --context shard-base --minify \
    --flatten >"$work/$shard.kubeconfig"
  "${kubectl[@]}" -n "$ns" create secret generic "kcp-$shard" \
    --from-file=kubeconfig="$work/$shard.kubeconfig" >/dev/null
  free_port "port[$shard]"
  bash "$here/node-values.sh" "$dir" "${port[$shard]}" >"$work/node.yaml"
  home_cluster=root
  [[ $shard == root ]] || home_cluster=$home
  cat >"$work/$shard.yaml" <<EOF
podLabels: {lazyquota.dev/kcp-shard: $shard}
metrics: {port: ${port[$shard]}, quotaUsage: {enabled: true}}
kcp: {shardURL: "$url", kubeconfigSecret: kcp-$shard, homeCluster: "$home_cluster"}
EOF
  "$helm" install "lq-$shard" "$repo/charts/lazyquota" -n "$ns" -f "$work/node.yaml" -f "$work/$shard.yaml" \
    --wait=false >/dev/null
done
ready_of() { # ready_of RELEASE: both of its pods Ready
  local state
  state=$("${kubectl[@]}" -n "$ns" get pods -l "app.kubernetes.io/instance=$1" \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status} {end}')
  [[ $state == "True True " ]]
}
eventually 120 "lq-root: both pods Ready" ready_of lq-root
eventually 120 "lq-shard-1: both pods Ready" ready_of lq-shard-1
holder() { at "$1" -n "$ns" get lease "$2" -o jsonpath='{.spec.holderIdentity}'; }
leads() { [[ -n $(holder "$1" "$2") ]]; }
eventually 60 "lq-root's leader holds its Lease in root" leads root lq-root-lazyquota
eventually 60 "lq-shard-1's leader holds its Lease in its home cluster on shard-1" \
  leads "root:$tag-home" lq-shard-1-lazyquota

# --- 3. each release writes its own shard's quota --------------------------------------------
step "3. each release writes its shard's quota, exactly"
truth() { at "root:$tag-$1" -n team get configmaps -o name | wc -l; }
written() { [[ $(at "root:$tag-$1" -n team get quota q -o jsonpath='{.status.used.count/configmaps}') == "$(truth "$1")" ]]; }
eventually 60 "lq-root writes root's quota ($(truth root) configmaps)" written root
eventually 60 "lq-shard-1 writes shard-1's quota ($(truth shard-1) configmaps)" written shard-1
at "root:$tag-shard-1" -n team create configmap four >/dev/null
at "root:$tag-shard-1" -n team delete configmap one >/dev/null
eventually 60 "lq-shard-1 counts a create and a delete" written shard-1
sleep 3
used=$(at "root:$tag-shard-2" -n team get quota q -o jsonpath='{.status.used}')
[[ -z $used ]] || die "shard-2's quota got a status ($used) though no release serves shard-2"
say "ok: shard-2's quota has no status: no release serves shard-2"

# --- 4. Prometheus, the shard as a label -----------------------------------------------------
step "4. Prometheus scrapes the four pods with the shard as a label"
free_port prometheus_port
cat >"$work/prometheus.yml" <<EOF
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
  - job_name: lazyquota-kcp
    metrics_path: /metrics
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: $LAZYQUOTA_KUBECONFIG
        namespaces: {names: [$ns]}
    relabel_configs:
      - {action: keep, source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name], regex: lazyquota}
      - {action: keep, source_labels: [__meta_kubernetes_pod_container_port_name], regex: metrics}
      - {source_labels: [__meta_kubernetes_pod_label_lazyquota_dev_kcp_shard], target_label: shard}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
EOF
"$LAZYQUOTA_NODE_BIN/prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom-data" \
  --web.listen-address="127.0.0.1:$prometheus_port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
promql() { curl -fsS --max-time 5 "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1"; }
four_up() { [[ $(promql 'count by (shard) (up == 1)' | jq -c '[.data.result[] | [.metric.shard, .value[1]]] | sort') == '[["root","2"],["shard-1","2"]]' ]]; }
eventually 90 "Prometheus scrapes two pods of each shard (up by shard)" four_up
leaders() { [[ $(promql 'sum by (shard) (lazyquota_leader)' | jq -c '[.data.result[] | [.metric.shard, .value[1]]] | sort') == '[["root","1"],["shard-1","1"]]' ]]; }
eventually 30 "one leader per shard" leaders
series_shards() { # series_shards CLUSTER: the shards whose pods export quota series of CLUSTER
  promql "count by (shard) (lazyquota_quota_hard{cluster=\"$1\"})" | jq -c '[.data.result[].metric.shard] | sort'
}
own_series() { [[ $(series_shards "${cluster[$1]}") == "[\"$1\"]" ]]; }
eventually 30 "root's consumer in root's series only" own_series root
eventually 30 "shard-1's consumer in shard-1's series only" own_series shard-1
[[ $(series_shards "${cluster[shard-2]}") == "[]" ]] || die "shard-2's consumer in a release's series"
say "ok: shard-2's consumer in no release's series"

# --- 5. uninstall ----------------------------------------------------------------------------
step "5. helm uninstall of both"
for release in lq-root lq-shard-1; do "$helm" uninstall "$release" -n "$ns" --wait=false >/dev/null; done
no_pods() { [[ -z $("${kubectl[@]}" -n "$ns" get pods -o name) ]]; }
eventually 120 "no pods left" no_pods
for shard in root shard-1 shard-2 home; do at root delete workspace "$tag-$shard" --wait=false >/dev/null; done
say "passed"
