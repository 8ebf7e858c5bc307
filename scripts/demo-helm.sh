#!/usr/bin/env bash
# `make demo-helm`: the Helm chart's pods on real nodes without kind or Docker. Builds the image's
# binary as deploy/Dockerfile's build stage does, starts the node flavour (two kubelets on
# containerd, a control plane of their own, images built offline), installs the chart with the
# values that flavour needs (tests/helm/node-values.sh), and prints what to look at.
# Stop everything with `make node-stop`. Needs root (kubelet, containerd) and Debian's runc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
dir=${LAZYQUOTA_NODE_DIR:-$repo/.lazyquota/node}
export LAZYQUOTA_NODE_DIR=$dir

binary=$(bash deploy/build-stage.sh | tail -n 1)
helm=$(bash tests/helm/build.sh | tail -n 1)
LAZYQUOTA_NODE_IMAGE=$binary bash tests/control-plane/node/start.sh >/dev/null
# shellcheck source=/dev/null
source "$dir/env"
# shellcheck source=../tests/control-plane/ports.sh
source tests/control-plane/ports.sh
free_port metrics_port
bash tests/helm/node-values.sh "$dir" "$metrics_port" > "$dir/values.yaml"
"$helm" install lazyquota charts/lazyquota -n lazyquota-system --create-namespace -f "$dir/values.yaml" >/dev/null
kubectl="$LAZYQUOTA_CP_BIN/kubectl --kubeconfig $LAZYQUOTA_KUBECONFIG"
$kubectl -n lazyquota-system wait --for=condition=Ready pod -l app.kubernetes.io/name=lazyquota --timeout 120s >/dev/null
cat <<TEXT

lazyquota runs as two pods of the Helm release "lazyquota" in namespace lazyquota-system,
one on each node (127.0.0.1 and 127.0.0.2), on the host network.

  kubectl=($kubectl)
  "\${kubectl[@]}" get nodes,pods -A -o wide
  "\${kubectl[@]}" -n lazyquota-system get lease lazyquota      # who leads
  "\${kubectl[@]}" -n lazyquota-system logs deploy/lazyquota
  curl -s 127.0.0.1:$metrics_port/metrics | grep ^lazyquota_    # or 127.0.0.2
  "\${kubectl[@]}" create namespace demo
  "\${kubectl[@]}" -n demo create quota q --hard=count/configmaps=5
  "\${kubectl[@]}" -n demo get quota q -o yaml                  # status.used, written by the leader
  "\${kubectl[@]}" -n lazyquota-system delete pod <the leader>  # the other takes over

  $helm --kubeconfig $LAZYQUOTA_KUBECONFIG -n lazyquota-system upgrade lazyquota charts/lazyquota -f $dir/values.yaml --set ...

Stop the nodes and the control plane (nothing is left running): make node-stop
TEXT
