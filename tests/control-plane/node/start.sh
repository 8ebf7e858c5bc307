#!/usr/bin/env bash
# Starts the node flavour of the test control plane, on loopback only:
#
#   - a control plane of its own (../start.sh in $dir/cp) with the KCM controllers Deployments
#     need, and kube-scheduler;
#   - two nodes on this one machine, "127.0.0.1" and "127.0.0.2": each a containerd (built by
#     ./build.sh, runc from Debian) and a kubelet registered under that name. Two nodes because
#     the chart's two replicas run on the host network (this machine has no pod network and
#     tests contact nothing but loopback) and each binds its node's address;
#   - the sandbox (pause) image and, when LAZYQUOTA_NODE_IMAGE names a lazyquota binary, the
#     lazyquota image, built offline as OCI archives (./oci-image.py) and imported into both
#     containerds. Nothing is pulled from a registry.
#
#   $LAZYQUOTA_NODE_DIR (default: <repo>/.lazyquota/node)
#     cp/admin.kubeconfig  the admin kubeconfig (also printed as the last line of stdout)
#     env                  shell-sourceable facts: the control plane's, the nodes', images
#     node-<n>/            containerd and kubelet state, configs and logs of node n
#
# Options (environment):
#   LAZYQUOTA_NODE_IMAGE=PATH      a lazyquota binary to package as docker.io/library/lazyquota:<tag>
#   LAZYQUOTA_NODE_IMAGE_TAG=TAG   (default: the chart's appVersion)
#   LAZYQUOTA_CP_TIMEOUT=60        seconds to wait for each component to become ready
#
# Needs root (kubelet and containerd manage cgroups, mounts and sysctls) and cgroup v1 or v2.
# Changes three sysctls the kubelet insists on (vm.overcommit_memory, kernel.panic,
# kernel.panic_on_oops); ./stop.sh restores them, unmounts, removes the cgroups and stops
# everything. A node already running from the same directory is stopped first.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
dir=${LAZYQUOTA_NODE_DIR:-$repo/.lazyquota/node}
timeout=${LAZYQUOTA_CP_TIMEOUT:-60}
nodes=(127.0.0.1 127.0.0.2)

say() { printf 'node: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

((EUID == 0)) || die "the node flavour needs root (kubelet and containerd manage cgroups and mounts)"
runc=$(command -v runc) || die "runc is not installed (apt-get install runc)"
bin=$(bash "$here/build.sh" | tail -n 1)

bash "$here/stop.sh" "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

fail() {
  local log=$1; shift
  say "error: $*"
  if [[ -f $log ]]; then
    say "last lines of $log:"
    tail -n 30 "$log" >&2
  fi
  bash "$here/stop.sh" "$dir" >/dev/null 2>&1
  exit 1
}

# The sysctls the kubelet sets, saved for stop.sh before anything changes them.
for key in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do
  printf '%s=%s\n' "$key" "$(cat "/proc/sys/$key")"
done > "$dir/sysctls.saved"

# --- control plane ------------------------------------------------------------------------
LAZYQUOTA_CP_DIR=$dir/cp LAZYQUOTA_KCM_QUOTA=off \
  LAZYQUOTA_KCM_CONTROLLERS=deployment-controller,replicaset-controller,garbage-collector-controller,endpointslice-controller,node-lifecycle-controller,pod-garbage-collector-controller \
  bash "$here/../start.sh" >/dev/null || fail "$dir/cp/logs/kube-apiserver.log" "the control plane did not start"
# shellcheck source=/dev/null
source "$dir/cp/env"
cp_bin=$LAZYQUOTA_CP_BIN
pki=$dir/cp/pki
kubectl=("$cp_bin/kubectl" --kubeconfig "$dir/cp/admin.kubeconfig")

# shellcheck source=../ports.sh
source "$here/../ports.sh"

ossl() { openssl "$@" >/dev/null 2>&1; }
client_cert() {
  # client_cert NAME SUBJECT: a client certificate signed by the control plane's CA.
  local name=$1 subject=$2
  ossl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr"
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > "$pki/$name.ext"
  ossl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
  "${kubectl[@]}" config view --raw --minify > "$dir/$name.kubeconfig"
  "${kubectl[@]}" --kubeconfig "$dir/$name.kubeconfig" config set-credentials admin \
    --client-certificate "$pki/$name.crt" --client-key "$pki/$name.key" >/dev/null
}

start_bg() {
  # start_bg LOG PIDFILE CMD...: CMD in its own process group.
  local log=$1 pidfile=$2; shift 2
  setsid "$@" >"$log" 2>&1 </dev/null &
  echo $! > "$pidfile"
}

wait_for() {
  # wait_for LOG PIDFILE WHAT CMD...: polls CMD until it succeeds, or fails after $timeout s.
  local log=$1 pidfile=$2 what=$3; shift 3
  local deadline=$((SECONDS + timeout))
  while ((SECONDS < deadline)); do
    kill -0 "$(cat "$pidfile")" 2>/dev/null || fail "$log" "$what: the process exited"
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  fail "$log" "$what: not ready within ${timeout}s"
}

# --- kube-scheduler -----------------------------------------------------------------------
client_cert kube-scheduler "/CN=system:kube-scheduler"
free_port scheduler_port
start_bg "$dir/kube-scheduler.log" "$dir/kube-scheduler.pid" "$bin/kube-scheduler" \
  --kubeconfig "$dir/kube-scheduler.kubeconfig" \
  --authentication-kubeconfig "$dir/kube-scheduler.kubeconfig" \
  --authorization-kubeconfig "$dir/kube-scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$scheduler_port" --leader-elect=false
wait_for "$dir/kube-scheduler.log" "$dir/kube-scheduler.pid" kube-scheduler \
  curl -fsSk --max-time 2 "https://127.0.0.1:$scheduler_port/healthz"

# Kubelets authenticate as system:node:<name> in system:nodes; RBAC grants that group the
# system:node role (no Node authorizer here: RBAC is the apiserver's only mode).
"${kubectl[@]}" create clusterrolebinding lazyquota-test-nodes --clusterrole system:node \
  --group system:nodes >/dev/null

# --- images -------------------------------------------------------------------------------
images=$dir/images
mkdir -p "$images"
pause_image=registry.k8s.io/pause:lazyquota-test
python3 "$here/oci-image.py" --name "$pause_image" --out "$images/pause.tar" \
  --file "$bin/pause:/pause:0755" --entrypoint /pause --user 65535:65535 >&2
lazyquota_image=
if [[ -n ${LAZYQUOTA_NODE_IMAGE:-} ]]; then
  tag=${LAZYQUOTA_NODE_IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' "$repo/charts/lazyquota/Chart.yaml")}
  lazyquota_image=docker.io/library/lazyquota:$tag
  # The image deploy/Dockerfile describes: the binary at /lazyquota, user 65532, entrypoint
  # `/lazyquota run`. The release binary is static (.cargo/config.toml), so ldd lists nothing
  # and the image holds the binary alone, as distroless/static-debian12 adds only files it
  # does not read; a dynamic build (another target's flags) brings the libraries the dynamic
  # loader finds.
  files=("--file" "$LAZYQUOTA_NODE_IMAGE:/lazyquota:0755")
  while read -r lib; do
    [[ -n $lib ]] && files+=("--file" "$lib:$lib:0755")
  done < <(ldd "$LAZYQUOTA_NODE_IMAGE" | sed -nE 's#.*=> (/[^ ]+) .*#\1#p; s#^\s*(/[^ ]+) .*#\1#p' | sort -u)
  python3 "$here/oci-image.py" --name "$lazyquota_image" --out "$images/lazyquota.tar" \
    "${files[@]}" --passwd --user 65532 --entrypoint /lazyquota --cmd run --expose 9090 \
    --label org.opencontainers.image.title=lazyquota >&2
fi

# --- nodes --------------------------------------------------------------------------------
# containerd's sockets must be short (unix socket paths are at most 108 bytes, and the shim's
# go under its state directory): its state lives in /run/lqn-<hash of $dir>-<n>.
short=$(printf '%s' "$dir" | sha256sum | cut -c1-8)
mkdir -p "$dir/cni"
printf '{"cniVersion":"1.0.0","name":"lazyquota-test","plugins":[{"type":"loopback"}]}\n' \
  > "$dir/cni/10-loopback.conflist"

# Each node's pods live in their own cgroup subtree, which stop.sh removes.
cgroup_roots() {
  local n=$1 root
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    # cgroup v2 only: one hierarchy at the root (its children are other programs' cgroups).
    echo "/sys/fs/cgroup/lazyquota-node-$n"
    return
  fi
  # cgroup v1: one hierarchy per mount (the hybrid unified mount among them).
  for root in /sys/fs/cgroup/*/; do
    [[ -f $root/cgroup.procs ]] && echo "${root%/}/lazyquota-node-$n"
  done
}

for n in "${!nodes[@]}"; do
  name=${nodes[$n]}
  node=$dir/node-$n
  run=/run/lqn-$short-$n
  mkdir -p "$node" "$run"
  echo "$run" > "$node/run-dir"
  for cg in $(cgroup_roots "$n"); do
    mkdir -p "$cg"
    # A new cpuset cgroup starts empty; its tasks could run nowhere.
    if [[ -f $cg/cpuset.cpus ]]; then
      cat "$(dirname "$cg")/cpuset.cpus" > "$cg/cpuset.cpus"
      cat "$(dirname "$cg")/cpuset.mems" > "$cg/cpuset.mems"
    fi
  done

  cat > "$node/containerd.toml" <<EOF
version = 3
root = "$node/containerd"
state = "$run/state"
[grpc]
  address = "$run/containerd.sock"
[ttrpc]
  address = "$run/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "$name"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$pause_image"
[plugins."io.containerd.cri.v1.runtime"]
  # Pods never get a lower OOM score than containerd's own. The kubelet asks -998 for every
  # sandbox, which needs CAP_SYS_RESOURCE; root on a CI machine may not have it (this one's
  # does not), and runc then fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$runc"
        Root = "$run/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$bin/cni"]
    conf_dir = "$dir/cni"
EOF
  # The shim is found on PATH.
  PATH=$bin:$PATH start_bg "$node/containerd.log" "$node/containerd.pid" \
    "$bin/containerd" --config "$node/containerd.toml"
  ctr=("$bin/ctr" --address "$run/containerd.sock" --namespace k8s.io)
  wait_for "$node/containerd.log" "$node/containerd.pid" "containerd of node $name" "${ctr[@]}" version
  for image in "$images"/*.tar; do
    "${ctr[@]}" images import --local "$image" >&2 || fail "$node/containerd.log" "importing $image"
  done

  client_cert "node-$n" "/O=system:nodes/CN=system:node:$name"
  free_port kubelet_port
  free_port kubelet_healthz_port
  cat > "$node/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "$name"
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: "$name"
healthzPort: $kubelet_healthz_port
# Anyone on loopback may use the kubelet's API (the apiserver for logs and exec presents no
# client certificate here); it listens on the node's loopback address only.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: "unix://$run/containerd.sock"
cgroupDriver: cgroupfs
cgroupRoot: "/lazyquota-node-$n"
failCgroupV1: false
failSwapOn: false
# Disk and memory pressure on a shared build machine must not evict or taint the test node.
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: ""
maxPods: 20
EOF
  start_bg "$node/kubelet.log" "$node/kubelet.pid" "$bin/kubelet" \
    --config "$node/kubelet.yaml" \
    --kubeconfig "$dir/node-$n.kubeconfig" \
    --root-dir "$node/kubelet" \
    --cert-dir "$node/kubelet-pki" \
    --hostname-override "$name" \
    --v 2
done

for n in "${!nodes[@]}"; do
  wait_for "$dir/node-$n/kubelet.log" "$dir/node-$n/kubelet.pid" "node ${nodes[$n]} Ready" \
    "${kubectl[@]}" wait --for=condition=Ready "node/${nodes[$n]}" --timeout 2s
done

cat > "$dir/env" <<EOF
$(cat "$dir/cp/env")
LAZYQUOTA_NODE_DIR=$dir
LAZYQUOTA_NODE_BIN=$bin
LAZYQUOTA_NODES="${nodes[*]}"
LAZYQUOTA_NODE_IMAGE=$lazyquota_image
LAZYQUOTA_PAUSE_IMAGE=$pause_image
EOF
say "ready: nodes ${nodes[*]} on kube-apiserver $LAZYQUOTA_APISERVER_URL${lazyquota_image:+, image $lazyquota_image}"
echo "$dir/cp/admin.kubeconfig"
