#!/usr/bin/env bash
# Checks the Helm chart in charts/lazyquota with helm built by ./build.sh (or $HELM):
#
#   1. helm lint                   (default values)
#   2. helm lint --strict          (default values, and ./values-all.yaml: every optional
#                                   feature on, leader election off)
#   3. helm template               (both value sets), with a few assertions on the output
#   4. the schema rejects bad values and the chart refuses unsafe combinations
#   5. deploy/manifests/lazyquota.yaml is what deploy/render.sh renders now
#
# Runs every check, prints a summary, and exits non-zero if any failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
chart=$repo/charts/lazyquota
all=$here/values-all.yaml

say() { printf 'helm-check: %s\n' "$*" >&2; }

helm=${HELM:-$(bash "$here/build.sh" | tail -n 1)} || { say "error: building helm failed"; exit 1; }
[[ -x "$helm" ]] || { say "error: no helm at '$helm'"; exit 1; }
say "using $("$helm" version --short) ($helm)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=()
check() {
  # check NAME COMMAND...: runs the command, output to $work/<n>.log, shown on failure.
  local name=$1; shift
  local log="$work/check.$((passed + ${#failed[@]})).log"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    say "ok   $name"
  else
    failed+=("$name")
    say "FAIL $name"
    sed 's/^/    /' "$log" >&2
  fi
}

# contains FILE PATTERN... / lacks FILE PATTERN...: fixed-string line checks on a rendering.
contains() { local f=$1; shift; for p in "$@"; do grep -qF -- "$p" "$f" || { echo "missing: $p"; return 1; }; done; }
lacks() { local f=$1; shift; for p in "$@"; do ! grep -qF -- "$p" "$f" || { echo "unexpected: $p"; return 1; }; done; }
# fails_with TEXT CMD...: the command must fail with TEXT in its output.
fails_with() {
  local text=$1; shift
  local output
  if output=$("$@" 2>&1); then echo "expected a failure"; return 1; fi
  grep -qF -- "$text" <<<"$output" || { echo "expected '$text' in:"; echo "$output"; return 1; }
}

template() { "$helm" template lazyquota "$chart" --namespace lazyquota "$@"; }
# template_to FILE ARGS...: renders into FILE.
template_to() { local out=$1; shift; template "$@" >"$out"; }
# up_to_date: deploy/render.sh renders exactly the committed manifests.
up_to_date() {
  HELM="$helm" bash "$repo/deploy/render.sh" "$work/rendered.yaml" &&
    diff -u "$repo/deploy/manifests/lazyquota.yaml" "$work/rendered.yaml"
}

check "helm lint" "$helm" lint "$chart"
check "helm lint --strict (defaults)" "$helm" lint --strict "$chart"
check "helm lint --strict (values-all.yaml)" "$helm" lint --strict "$chart" -f "$all"

check "helm template (defaults)" template_to "$work/default.yaml"
check "helm template (values-all.yaml)" template_to "$work/all.yaml" -f "$all"

check "defaults: 2 replicas, leader election, restricted pod, probes" contains "$work/default.yaml" \
  "kind: Deployment" "replicas: 2" "- --leader-elect" "- --leader-election-namespace" \
  "- --metrics-addr" '"0.0.0.0:9090"' "kind: Role" "resourceNames: [\"lazyquota\"]" \
  "runAsNonRoot: true" "runAsUser: 65532" "readOnlyRootFilesystem: true" \
  "allowPrivilegeEscalation: false" "- ALL" "type: RuntimeDefault" \
  "path: /healthz" "path: /readyz" "name: POD_NAME" "name: POD_NAMESPACE" "name: RUST_LOG" \
  'apiGroups: ["*"]' "image: \"lazyquota:0.1.0\"" "- --metrics-auth" '"none"' "kind: Lease"
check "defaults: optional objects off" lacks "$work/default.yaml" \
  "kind: ServiceMonitor" "kind: PodMonitor" "kind: PrometheusRule" "kind: NetworkPolicy" \
  "- --shadow" "LAZYQUOTA_KCP_SHARD_URL" "system:auth-delegator" "scheme: HTTPS" \
  "- --quota-usage-metrics"
# shellcheck disable=SC2016 # the alert templates are literal text
check "values-all: every optional object and flag" contains "$work/all.yaml" \
  "kind: ServiceMonitor" "kind: PodMonitor" "kind: PrometheusRule" "kind: NetworkPolicy" \
  "- --shadow" "name: LAZYQUOTA_KCP_SHARD_URL" "alert: LazyquotaNoLeader" \
  "alert: LazyquotaQuotaSyncErrors" "alert: LazyquotaWatchFailing" \
  "alert: LazyquotaShadowDisagreements" "max(lazyquota_leader) == 0" \
  'rate(lazyquota_quota_syncs_total{result=~"error|conflict"}[5m]) > 0.1' \
  "lazyquota_watch_failing > 0" "sum(lazyquota_shadow_disagreements) > 0" \
  '{{ $labels.resource }}' '{{ $labels.reason }}' \
  'apiGroups: ["apps","batch","example.com"]' "- persistentvolumeclaims" '"0.0.0.0:8080"' \
  "- --metrics-auth" '"delegated"' "name: system:auth-delegator" "scheme: HTTPS" \
  "scheme: https" "insecureSkipVerify: true" "bearerTokenFile:" \
  "secretName: kcp-shard-1" "value: /etc/lazyquota/kcp/kubeconfig" "- --kcp-home-cluster" \
  "\"2a8mvkes5kbo2uiz\"" \
  "- --quota-usage-metrics" "- --quota-usage-metrics-max-series" '"500"' \
  "alert: LazyquotaQuotaNearlyFull" \
  "expr: lazyquota_quota_usage_ratio >= 0.9" "for: 15m"
check "values-all: leader election off, no wildcard rule" lacks "$work/all.yaml" \
  "- --leader-elect" "kind: Role" 'apiGroups: ["*"]' "kind: Lease"

check "helm template (hostNetwork)" template_to "$work/host.yaml" --set hostNetwork=true
check "hostNetwork: host network, metrics on the pod IP from the downward API" contains "$work/host.yaml" \
  "hostNetwork: true" "dnsPolicy: ClusterFirstWithHostNet" "name: POD_IP" "fieldPath: status.podIP" \
  '"$(POD_IP):9090"'
check "defaults: pod network" lacks "$work/default.yaml" "hostNetwork: true" "name: POD_IP"

check "schema rejects an unknown value" fails_with "'notAValue' not allowed" template --set notAValue=1
check "schema rejects a bad enum" fails_with "/controller/mode" template --set controller.mode=busy
check "schema rejects a bad duration" fails_with "/controller/resyncPeriod" template --set controller.resyncPeriod=5min
check "schema rejects a ratio above 1" fails_with "/prometheusRule/quotaNearlyFull/ratio" \
  template --set prometheusRule.quotaNearlyFull.ratio=1.5
check "chart refuses kcp without shard credentials" fails_with "needs kcp.kubeconfigSecret" \
  template --set kcp.shardURL=https://shard.example:6443
check "chart refuses 2 writers without leader election" fails_with "needs leaderElection.enabled" \
  template --set leaderElection.enabled=false

check "deploy/manifests/lazyquota.yaml is up to date (deploy/render.sh)" up_to_date

say "${passed} passed, ${#failed[@]} failed"
if ((${#failed[@]})); then
  for name in "${failed[@]}"; do say "failed: $name"; done
  exit 1
fi
