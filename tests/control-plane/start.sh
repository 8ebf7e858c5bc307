#!/usr/bin/env bash
# Starts the test control plane on loopback: etcd, kube-apiserver and kube-controller-manager,
# built by ./build.sh. Everything lives in one state directory:
#
#   $LAZYQUOTA_CP_DIR (default: <repo>/.lazyquota/control-plane)
#     admin.kubeconfig   the admin kubeconfig (also printed as the last line of stdout)
#     env                shell-sourceable facts: ports, pids, paths
#     pki/               CA, serving and client certificates, service-account keys (made at start)
#     logs/              one log per component
#
# Options (environment):
#   LAZYQUOTA_KCM_QUOTA=on|off   run KCM's own resourcequota controller (default: on). Off makes
#                               lazyquota the only writer of ResourceQuota status.
#   LAZYQUOTA_KCM=on|off         start kube-controller-manager at all (default: on)
#   LAZYQUOTA_CP_TIMEOUT=60      seconds to wait for each component to become ready
#   LAZYQUOTA_APISERVER_ARGS     extra kube-apiserver flags (space separated)
#   LAZYQUOTA_KCM_ARGS           extra kube-controller-manager flags (space separated)
#   LAZYQUOTA_KCM_CONTROLLERS    more KCM controllers, comma separated (the node flavour's
#                                deployment, replicaset, garbage collector, ...)
#   LAZYQUOTA_AUDIT_LISTS=on     also audit lists and watches (default: off)
#   LAZYQUOTA_EXTRA_APISERVERS=N more kube-apiservers on the same etcd, each its own cluster
#                                (its own --etcd-prefix); clusters.kubeconfig then has contexts
#                                cluster-0 (the first apiserver) .. cluster-N (default: 0)
#
# A control plane already running from the same directory is stopped first.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=${LAZYQUOTA_CP_DIR:-$repo/.lazyquota/control-plane}
timeout=${LAZYQUOTA_CP_TIMEOUT:-60}
kcm_quota=${LAZYQUOTA_KCM_QUOTA:-on}
kcm=${LAZYQUOTA_KCM:-on}
extra_apiservers=${LAZYQUOTA_EXTRA_APISERVERS:-0}

say() { printf 'control-plane: %s\n' "$*" >&2; }

bin=$(bash "$here/build.sh" | tail -n 1)

bash "$here/stop.sh" "$dir" >/dev/null
rm -rf "$dir"
mkdir -p "$dir/pki" "$dir/logs"
dir=$(cd "$dir" && pwd)
pki=$dir/pki

fail() {
  # A clear error and the tail of the failing component's log, then nothing left running.
  local component=$1; shift
  say "error: $*"
  if [[ -f "$dir/logs/$component.log" ]]; then
    say "last lines of $dir/logs/$component.log:"
    tail -n 30 "$dir/logs/$component.log" >&2
  fi
  bash "$here/stop.sh" "$dir" >/dev/null
  exit 1
}

# shellcheck source=ports.sh
source "$here/ports.sh"
free_port etcd_port
free_port etcd_peer_port
free_port apiserver_port
free_port kcm_port

# --- certificates -------------------------------------------------------------------------
ossl() { openssl "$@" >/dev/null 2>&1; }
ossl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=lazyquota-test-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt"
cert() {
  # cert NAME SUBJECT USAGE [SAN]: a key and a v3 certificate signed by the test CA (rustls
  # rejects v1 certificates, which is what openssl makes without extensions).
  local name=$1 subject=$2 usage=$3 san=${4:-}
  ossl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $san ]] && echo "subjectAltName=$san"
  } > "$pki/$name.ext"
  ossl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
}
cert apiserver "/CN=kube-apiserver" serverAuth "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default"
cert admin "/O=system:masters/CN=lazyquota-admin" clientAuth
cert kcm "/CN=system:kube-controller-manager" clientAuth
ossl genrsa -out "$pki/sa.key" 2048
ossl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
[[ -s $pki/admin.crt && -s $pki/sa.pub ]] || fail apiserver "could not generate certificates with openssl"

kubeconfig() {
  # kubeconfig FILE USER: a kubeconfig for USER's client certificate.
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lazyquota-test
  cluster:
    server: https://127.0.0.1:$apiserver_port
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: lazyquota-test
  context:
    cluster: lazyquota-test
    user: $2
current-context: lazyquota-test
EOF
}
kubeconfig "$dir/admin.kubeconfig" admin
kubeconfig "$dir/kcm.kubeconfig" kcm

# --- processes ----------------------------------------------------------------------------
start_bg() {
  # start_bg NAME CMD...: runs CMD in its own process group, logs to logs/NAME.log.
  local name=$1; shift
  setsid "$@" >"$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/$name.pid"
}

wait_ready() {
  # wait_ready NAME URL [curl args...]: polls URL until it answers 200, or fails after $timeout s.
  local name=$1 url=$2; shift 2
  local deadline=$((SECONDS + timeout))
  while (( SECONDS < deadline )); do
    if ! kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
      fail "$name" "$name exited during start-up"
    fi
    if curl -fsS --max-time 2 "$@" "$url" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.3
  done
  fail "$name" "$name was not ready at $url within ${timeout}s"
}

start_bg etcd "$bin/etcd" \
  --name lazyquota-test \
  --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "lazyquota-test=http://127.0.0.1:$etcd_peer_port" \
  --unsafe-no-fsync \
  --log-level warn
wait_ready etcd "http://127.0.0.1:$etcd_port/health"

# From 1.37 kube-apiserver refuses a loopback advertise address while it reconciles the
# `kubernetes` Service's endpoints; those endpoints would name 127.0.0.1, which no pod can
# reach anyway, so that release runs without the reconciler.
apiserver_minor=$("$bin/kube-apiserver" --version | sed -nE 's/.*v1\.([0-9]+).*/\1/p')
reconciler=()
if (( ${apiserver_minor:-0} >= 37 )); then
  reconciler=(--endpoint-reconciler-type none)
fi

# An audit log of ResourceQuota status writes (who wrote, and the answer), so a test can count
# each writer's writes exactly: quota admission's charges, KCM's and lazyquota's; with
# LAZYQUOTA_AUDIT_LISTS=on also of lists and watches, so a benchmark can count a controller's
# relists (benches/faults).
list_rule=""
if [[ ${LAZYQUOTA_AUDIT_LISTS:-off} == on ]]; then
  list_rule="- level: Metadata
  verbs: [list, watch]"
fi
cat > "$dir/audit-policy.yaml" <<POLICY
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources: [{group: "", resources: ["resourcequotas/status"]}]
  verbs: [update, patch]
$list_rule
- level: None
POLICY

start_apiserver() {
  # start_apiserver NAME PORT [FLAGS...]: a kube-apiserver on etcd, with the shared PKI, ready;
  # its audit log is $dir/NAME.audit.log.
  local name=$1 port=$2; shift 2
  # shellcheck disable=SC2086 # extra args are intentionally word-split
  start_bg "$name" "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 \
    --advertise-address 127.0.0.1 \
    --secure-port "$port" \
    --tls-cert-file "$pki/apiserver.crt" \
    --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --allow-privileged=true \
    --audit-policy-file "$dir/audit-policy.yaml" \
    --audit-log-path "$dir/$name.audit.log" \
    --audit-log-maxsize 100 \
    --audit-log-maxbackup 1 \
    "${reconciler[@]}" \
    "$@" \
    ${LAZYQUOTA_APISERVER_ARGS:-}
  wait_ready "$name" "https://127.0.0.1:$port/readyz" \
    --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key"
}
start_apiserver kube-apiserver "$apiserver_port"

# More clusters on the same etcd: a kube-apiserver each, with its own key prefix, so the
# clusters share nothing but etcd's resourceVersion sequence (as kcp's logical clusters on one
# shard do). They run no controller manager: their tests use kinds that need none.
clusters_kubeconfig=""
if (( extra_apiservers > 0 )); then
  clusters_kubeconfig=$dir/clusters.kubeconfig
  {
    echo "apiVersion: v1"
    echo "kind: Config"
    echo "clusters:"
    echo "- name: cluster-0"
    echo "  cluster: {server: 'https://127.0.0.1:$apiserver_port', certificate-authority: '$pki/ca.crt'}"
  } > "$clusters_kubeconfig.clusters"
  contexts="- name: cluster-0
  context: {cluster: cluster-0, user: admin}"
  for i in $(seq 1 "$extra_apiservers"); do
    free_port port
    start_apiserver "kube-apiserver-$i" "$port" --etcd-prefix "/registry-cluster-$i"
    echo "- name: cluster-$i" >> "$clusters_kubeconfig.clusters"
    echo "  cluster: {server: 'https://127.0.0.1:$port', certificate-authority: '$pki/ca.crt'}" >> "$clusters_kubeconfig.clusters"
    contexts+="
- name: cluster-$i
  context: {cluster: cluster-$i, user: admin}"
  done
  {
    cat "$clusters_kubeconfig.clusters"
    echo "users:"
    echo "- name: admin"
    echo "  user: {client-certificate: '$pki/admin.crt', client-key: '$pki/admin.key'}"
    echo "contexts:"
    echo "$contexts"
    echo "current-context: cluster-0"
  } > "$clusters_kubeconfig"
  rm -f "$clusters_kubeconfig.clusters"
fi

kcm_pid=""
if [[ $kcm == on ]]; then
  # Only the controllers the tests need to behave like a real cluster: service accounts and
  # their tokens (so pods can be created), the root CA ConfigMap every namespace gets,
  # namespaces (so they can be deleted), and -- switchable -- the upstream resource quota
  # controller. Not the garbage collector: it watches every resource type, which would hide
  # lazyquota's own watches in the apiserver's metrics.
  controllers=serviceaccount-token-controller,serviceaccount-controller,root-ca-certificate-publisher-controller,namespace-controller
  if [[ $kcm_quota == on ]]; then
    controllers+=,resourcequota-controller
  fi
  if [[ -n ${LAZYQUOTA_KCM_CONTROLLERS:-} ]]; then
    controllers+=,$LAZYQUOTA_KCM_CONTROLLERS
  fi
  # shellcheck disable=SC2086
  start_bg kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/kcm.kubeconfig" \
    --authentication-kubeconfig "$dir/kcm.kubeconfig" \
    --authorization-kubeconfig "$dir/kcm.kubeconfig" \
    --authorization-always-allow-paths /healthz,/readyz,/livez,/metrics \
    --bind-address 127.0.0.1 \
    --secure-port "$kcm_port" \
    --controllers "$controllers" \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" \
    --root-ca-file "$pki/ca.crt" \
    --leader-elect=false \
    ${LAZYQUOTA_KCM_ARGS:-}
  wait_ready kube-controller-manager "https://127.0.0.1:$kcm_port/healthz" --insecure
  kcm_pid=$(cat "$dir/kube-controller-manager.pid")
fi

cat > "$dir/env" <<EOF
LAZYQUOTA_KUBECONFIG=$dir/admin.kubeconfig
LAZYQUOTA_CP_DIR=$dir
LAZYQUOTA_CP_BIN=$bin
LAZYQUOTA_APISERVER_URL=https://127.0.0.1:$apiserver_port
LAZYQUOTA_ETCD_URL=http://127.0.0.1:$etcd_port
LAZYQUOTA_CLUSTERS_KUBECONFIG=$clusters_kubeconfig
LAZYQUOTA_KCM_URL=${kcm_pid:+https://127.0.0.1:$kcm_port}
LAZYQUOTA_KCM_QUOTA=$([[ $kcm == on ]] && echo "$kcm_quota" || echo off)
LAZYQUOTA_CA_FILE=$pki/ca.crt
LAZYQUOTA_ADMIN_CERT=$pki/admin.crt
LAZYQUOTA_ADMIN_KEY=$pki/admin.key
EOF
say "ready: kube-apiserver https://127.0.0.1:$apiserver_port, KCM quota controller: $kcm_quota (kcm: $kcm)"
say "admin kubeconfig:"
echo "$dir/admin.kubeconfig"
