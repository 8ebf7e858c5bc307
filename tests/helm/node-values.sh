#!/usr/bin/env bash
# Prints the Helm values the node flavour (tests/control-plane/node) needs on top of the
# documented install, for the node started in STATE_DIR:
#   - the image was imported into the nodes' containerd, not pulled: pullPolicy Never;
#   - no pod network and no kube-proxy: the host network, and the in-cluster client pointed
#     at the apiserver's loopback address (its serving certificate covers 127.0.0.1);
#   - one pod per node on a fixed port: a rollout replaces a pod before it starts another
#     (maxSurge 0), or the new pod would wait for a free node forever;
#   - short leader-election timings, so a failover shows within seconds.
# Usage: node-values.sh STATE_DIR METRICS_PORT
set -euo pipefail
dir=$1 metrics_port=$2
# shellcheck source=/dev/null
source "$dir/env"
[[ -n ${LAZYQUOTA_NODE_IMAGE:-} ]] || { echo "node-values: no lazyquota image on the node in $dir" >&2; exit 1; }
cat <<VALUES
image: {tag: "${LAZYQUOTA_NODE_IMAGE##*:}", pullPolicy: Never}
hostNetwork: true
metrics: {port: $metrics_port}
extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
  - {name: KUBERNETES_SERVICE_PORT, value: "${LAZYQUOTA_APISERVER_URL##*:}"}
updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 0, maxUnavailable: 1}}
leaderElection: {leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 1s}
VALUES
