#!/usr/bin/env bash
# The chart's pods on real nodes: starts the node flavour (tests/control-plane/node: its own
# control plane, kube-scheduler, two kubelets on containerd + runc, every image built offline),
# then, with helm built by ./build.sh:
#
#   1. helm install as documented (plus the host-network values this machine needs)
#      -> both pods Running and Ready through their probes; one holds the Lease
#   2. a quota in another namespace gets its status from the pods (KCM's quota controller is off)
#   3. Prometheus (built by the node flavour) discovers the pods with kubernetes_sd_configs (role pod, relabelled
#      to select what the chart's PodMonitor selects) and PromQL returns lazyquota_active_watches
#   4. deleting the leader pod -> another pod takes the Lease; the Deployment replaces the pod
#   5. helm upgrade with a changed value rolls both pods
#   6. metrics.auth=delegated: a scraper's token reads /metrics over HTTPS; no token is refused
#   7. helm uninstall -> no pods, Services, ServiceAccount, RBAC or Lease left
#   8. node-kcp-test.sh: two releases, one per shard of a sharded kcp
#
# Usage: node-test.sh [LAZYQUOTA_BINARY]   (default: deploy/build-stage.sh's output)
# Every step is bounded in time; the first failing step stops the test with the evidence; the
# node is stopped at the end, pass or fail (LAZYQUOTA_NODE_KEEP=1 keeps it for a look).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=${LAZYQUOTA_NODE_DIR:-$repo/.lazyquota/testenv-node}
export LAZYQUOTA_NODE_DIR=$dir
binary=${1:-}
release=lq
ns=lazyquota-system

who=helm-node
# shellcheck source=lib.sh
source "$here/lib.sh"

cleanup() {
  local rc=$?
  if ((rc != 0)) && [[ -n ${kubectl:-} ]]; then
    say "state at failure:"
    "${kubectl[@]}" get pods,lease -A -o wide >&2 || true
    "${kubectl[@]}" -n "$ns" logs -l app.kubernetes.io/name=lazyquota --tail 20 --prefix >&2 || true
    if [[ -f ${work:-}/prometheus.log ]]; then
      say "last lines of Prometheus' log:"
      tail -n 15 "$work/prometheus.log" >&2
    fi
  fi
  [[ -n ${prom_pid:-} ]] && kill "$prom_pid" 2>/dev/null
  [[ -n ${work:-} ]] && rm -rf "$work"
  if [[ -z ${LAZYQUOTA_NODE_KEEP:-} ]]; then
    bash "$repo/tests/control-plane/node/stop.sh" "$dir" || true
  fi
  exit $rc
}
trap cleanup EXIT


if [[ -z $binary ]]; then
  binary=$(bash "$repo/deploy/build-stage.sh" | tail -n 1)
fi
helm=${HELM:-$(bash "$here/build.sh" | tail -n 1)}
work=$(mktemp -d)

step "starting the node flavour"
LAZYQUOTA_NODE_IMAGE=$binary bash "$repo/tests/control-plane/node/start.sh" >/dev/null
# shellcheck source=/dev/null
source "$dir/env"
export KUBECONFIG=$LAZYQUOTA_KUBECONFIG
kubectl=("$LAZYQUOTA_CP_BIN/kubectl")
# shellcheck source=../control-plane/ports.sh
source "$repo/tests/control-plane/ports.sh"
free_port metrics_port
free_port prometheus_port

bash "$here/node-values.sh" "$dir" "$metrics_port" > "$work/values.yaml"
selector=app.kubernetes.io/name=lazyquota,app.kubernetes.io/instance=$release
pods() { "${kubectl[@]}" -n "$ns" get pods -l "$selector" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{end}'; }
ready_pods() {
  "${kubectl[@]}" -n "$ns" get pods -l "$selector" \
    -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}terminating {end}{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}'
}
# two_ready [EXCLUDED...]: exactly two pods, both Ready, none terminating or excluded.
two_ready() {
  local state
  state=$(ready_pods)
  [[ $state != *terminating* ]] || return 1
  for old in "$@"; do [[ $state != *"$old="* ]] || return 1; done
  [[ $(grep -o '=True' <<<"$state" | wc -l) -eq 2 && $(wc -w <<<"$state") -eq 2 ]]
}
holder() { "${kubectl[@]}" -n "$ns" get lease "$release-lazyquota" -o jsonpath='{.spec.holderIdentity}'; }

step "1. helm install"
"$helm" install "$release" "$repo/charts/lazyquota" -n "$ns" --create-namespace -f "$work/values.yaml" --wait=false >/dev/null
eventually 120 "both pods Running and Ready (probes on port $metrics_port)" two_ready
first_pods=$(pods)
is_a_pod() { local h; h=$(holder); [[ -n $h && " $(pods) " == *" $h "* ]]; }
eventually 60 "one pod holds the Lease" is_a_pod
leader=$(holder)
say "pods: $first_pods; leader: $leader"
for pod in $first_pods; do
  user=$("${kubectl[@]}" -n "$ns" get pod "$pod" -o jsonpath='{.spec.containers[0].securityContext.runAsUser}/{.spec.containers[0].securityContext.readOnlyRootFilesystem}/{.spec.securityContext.seccompProfile.type}')
  [[ $user == 65532/true/RuntimeDefault ]] || die "pod $pod runs as $user, want 65532/true/RuntimeDefault"
done
say "ok: the pods run with the chart's restricted securityContext (65532, read-only root, RuntimeDefault seccomp)"

step "2. a quota in another namespace gets its status from the pods"
"${kubectl[@]}" create namespace team-a >/dev/null
for name in one two three; do "${kubectl[@]}" -n team-a create configmap "$name" >/dev/null; done
"${kubectl[@]}" -n team-a create quota q --hard=count/configmaps=10 >/dev/null
# Three of ours and the root CA ConfigMap KCM publishes into every namespace.
used() { [[ $("${kubectl[@]}" -n team-a get quota q -o jsonpath='{.status.used.count/configmaps}') == "$1" ]]; }
eventually 60 "quota team-a/q counts 4 configmaps" used 4

step "3. Prometheus discovers and scrapes the pods"
# What the chart's PodMonitor selects, as prometheus-operator turns it into a scrape config:
# pods in the release's namespace with the selector labels, the container port named
# `metrics`, path /metrics, scheme http (metrics.auth=none); finished pods dropped.
cat > "$work/prometheus.yml" <<EOF
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
  - job_name: podMonitor/$ns/$release-lazyquota/0
    metrics_path: /metrics
    scheme: http
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: $LAZYQUOTA_KUBECONFIG
        namespaces: {names: [$ns]}
    relabel_configs:
      - {action: drop, source_labels: [__meta_kubernetes_pod_phase], regex: (Failed|Succeeded)}
      - {action: keep, source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name], regex: lazyquota}
      - {action: keep, source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_instance], regex: $release}
      - {action: keep, source_labels: [__meta_kubernetes_pod_container_port_name], regex: metrics}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
EOF
"$LAZYQUOTA_NODE_BIN/prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom-data" \
  --web.listen-address="127.0.0.1:$prometheus_port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
promql() { curl -fsS --max-time 5 "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1"; }
two_up() { [[ $(promql 'sum(up{job=~"podMonitor/.*"})' | jq -r '.data.result[0].value[1]') == 2 ]]; }
eventually 90 "Prometheus scrapes both pods (up == 1 for 2 targets)" two_up
watches() {
  local out
  out=$(promql "lazyquota_active_watches{resource=\"configmaps\",pod=\"$leader\"}" | jq -r '.data.result[0].value[1]')
  [[ $out =~ ^[0-9]+$ ]] && ((out >= 1))
}
eventually 60 "PromQL: lazyquota_active_watches{resource=\"configmaps\"} >= 1 on the leader" watches
# jemalloc (linked into the binary) runs under the read-only root and RuntimeDefault seccomp.
jemalloc() { [[ $(promql 'count(lazyquota_jemalloc_allocated_bytes > 0)' | jq -r '.data.result[0].value[1]') == 2 ]]; }
eventually 30 "PromQL: both pods report jemalloc's allocated bytes" jemalloc

step "4. the leader pod is deleted"
"${kubectl[@]}" -n "$ns" delete pod "$leader" --wait=false >/dev/null
# The leader releases the Lease on SIGTERM; the standby and the Deployment's new pod (which
# starts within a second or two here) both try every retryPeriod, so either may win.
other_leads() { local h; h=$(holder); [[ -n $h && $h != "$leader" && " $(pods) " == *" $h "* ]]; }
eventually 60 "another pod takes the Lease" other_leads
new_leader=$(holder)
if [[ " $first_pods " == *" $new_leader "* ]]; then
  say "the standby $new_leader leads"
else
  say "the Deployment's new pod $new_leader leads (it won the race with the standby)"
fi
eventually 120 "the Deployment replaces the pod: two Ready pods again" two_ready "$leader"
"${kubectl[@]}" -n team-a create configmap four >/dev/null
eventually 60 "the new leader keeps the quota current (5 configmaps)" used 5

step "5. helm upgrade with a changed value rolls the pods"
before=$(pods)
"$helm" upgrade "$release" "$repo/charts/lazyquota" -n "$ns" -f "$work/values.yaml" \
  --set controller.concurrency=7 --wait=false >/dev/null
# shellcheck disable=SC2086 # word-split on purpose: one argument per old pod
eventually 180 "both pods replaced and Ready" two_ready $before
args_rolled() {
  for pod in $(pods); do
    "${kubectl[@]}" -n "$ns" get pod "$pod" -o jsonpath='{.spec.containers[0].args}' | grep -q '"--concurrency","7"' || return 1
  done
}
eventually 10 "the new pods run with --concurrency 7" args_rolled

step "6. metrics.auth=delegated: a scraper token is needed"
before=$(pods)
"$helm" upgrade "$release" "$repo/charts/lazyquota" -n "$ns" -f "$work/values.yaml" \
  --set metrics.auth=delegated --wait=false >/dev/null
# shellcheck disable=SC2086
eventually 180 "pods with delegated metrics auth Ready (HTTPS probes)" two_ready $before
"${kubectl[@]}" -n "$ns" create serviceaccount scraper >/dev/null
"${kubectl[@]}" create clusterrole lq-test-metrics-reader --verb=get --non-resource-url=/metrics >/dev/null
"${kubectl[@]}" create clusterrolebinding lq-test-metrics-reader --clusterrole lq-test-metrics-reader \
  --serviceaccount "$ns:scraper" >/dev/null
token=$("${kubectl[@]}" -n "$ns" create token scraper)
pod_ip=$("${kubectl[@]}" -n "$ns" get pods -l "$selector" -o jsonpath='{.items[0].status.podIP}')
url=https://$pod_ip:$metrics_port/metrics
status() { curl -ks -o /dev/null -w '%{http_code}' --max-time 5 "$@" "$url"; }
with_token() { [[ $(status -H "Authorization: Bearer $token") == 200 ]]; }
eventually 30 "the scraper's token reads $url" with_token
code=$(status)
[[ $code == 401 ]] || die "no token: HTTP $code, want 401"
say "ok: no token is refused (401)"
"${kubectl[@]}" delete clusterrolebinding,clusterrole lq-test-metrics-reader >/dev/null
forbidden() { [[ $(status -H "Authorization: Bearer $token") == 403 ]]; }
eventually 30 "the same token without the permission is forbidden (403)" forbidden

step "7. helm uninstall"
"$helm" uninstall "$release" -n "$ns" --wait=false >/dev/null
no_pods() { [[ -z $(pods) ]]; }
eventually 120 "no pods left" no_pods
left=$("${kubectl[@]}" get -A service,serviceaccount,role,rolebinding,clusterrole,clusterrolebinding,deployment,replicaset \
  -l app.kubernetes.io/instance=$release -o name)
[[ -z $left ]] || die "left behind: $left"
left=$("${kubectl[@]}" get clusterrolebinding,clusterrole,rolebinding -A -o name | grep -F "$release-lazyquota" || true)
[[ -z $left ]] || die "left behind: $left"
say "ok: no Services, ServiceAccount, Deployment or RBAC left"
# The chart owns the Lease (templates/lease.yaml): uninstall deletes it, so no Lease is left
# naming a pod that is gone.
lease_gone() { ! "${kubectl[@]}" -n "$ns" get lease "$release-lazyquota" >/dev/null 2>&1; }
eventually 30 "no Lease left" lease_gone

step "8. one release per shard of a sharded kcp (node-kcp-test.sh)"
bash "$here/node-kcp-test.sh" "$helm"
say "passed"
