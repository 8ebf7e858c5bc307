#!/usr/bin/env bash
# Starts a sharded kcp on loopback, as kcp's own sharded e2e setup (cmd/sharded-test-server of
# v0.32.3) does: a cache server, a root shard and $LAZYQUOTA_KCP_SHARDS - 1 more shards (each with
# its embedded etcd), and a front-proxy in front of them. Same flags as that setup; free ports
# instead of its fixed ones, and certificates made here with openssl instead of its Go helpers.
#
#   $LAZYQUOTA_KCP_DIR (default: <repo>/.lazyquota/kcp-sharded)
#     certs/                 the CAs (client, request-header, serving, service-account) and the
#                            certificates they signed
#     admin.kubeconfig       kcp-admin through the front-proxy (contexts root, base): create
#                            workspaces here, kcp schedules them onto shards
#     shard-<n>/shard.kubeconfig
#                            shard n's admin (system:masters; context shard-base): lazyquota's
#                            kubeconfig for that shard (wildcard requests)
#     env                    facts: front-proxy URL, each shard's name, URL and pid
#     logs/                  every process's log
#
# Shard 0 is named root, shard n > 0 shard-<n>; kcp labels each with name=<its name>, which a
# Workspace's spec.location.selector can ask for. Options (environment):
#   LAZYQUOTA_KCP_SHARDS=3      shards, the root shard included
#   LAZYQUOTA_KCP_QUOTA=on|off  kcp's own quota controller on every shard (as start.sh)
#   LAZYQUOTA_KCP_TIMEOUT=180   seconds to wait for each process to be ready
#
# Everything already running from the same directory is stopped first (stop.sh stops it all;
# restart-shard.sh restarts one shard with its data).
# Prints the front-proxy admin kubeconfig's path as the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
dir=${LAZYQUOTA_KCP_DIR:-$repo/.lazyquota/kcp-sharded}
timeout=${LAZYQUOTA_KCP_TIMEOUT:-180}
quota=${LAZYQUOTA_KCP_QUOTA:-on}
shards=${LAZYQUOTA_KCP_SHARDS:-3}

say() { printf 'kcp-sharded: %s\n' "$*" >&2; }

[[ $shards =~ ^[1-9]$ ]] || { say "error: LAZYQUOTA_KCP_SHARDS must be 1 to 9, not '$shards'"; exit 1; }
command -v openssl >/dev/null || { say "error: openssl is not installed"; exit 1; }

kcp=$(bash "$here/build.sh" kcp | tail -n 1)
bin=$(dirname "$kcp")
for server in cache-server kcp-front-proxy; do
  [[ -x $bin/$server ]] || bin=$(dirname "$(bash "$here/build.sh" "$server" | tail -n 1)")
done

bash "$here/stop.sh" "$dir" >/dev/null
rm -rf "$dir"
mkdir -p "$dir/logs" "$dir/certs"
dir=$(cd "$dir" && pwd)
certs=$dir/certs
started=$SECONDS

fail() {
  say "error: $*"
  for log in "$dir"/logs/*.log; do
    [[ -f $log ]] || continue
    say "last lines of $log:"
    tail -n 15 "$log" >&2
  done
  bash "$here/stop.sh" "$dir" >/dev/null
  exit 1
}

# --- certificates (what sharded-test-server's EnsureCA / Make*Cert calls make) ---------------
# P-256 keys: quick to make; the service-account key is RSA, what kcp's token signer expects.
ca() { # ca NAME COMMON_NAME
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
    -keyout "$certs/$1.key" -out "$certs/$1.crt" -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>/dev/null
}
sign() { # sign CA OUT SUBJECT EXTENSIONS: a key and a certificate for it, signed by CA
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$2.key" -subj "$3" 2>/dev/null |
    openssl x509 -req -CA "$certs/$1.crt" -CAkey "$certs/$1.key" -CAcreateserial -days 365 \
      -extfile <(printf '%s\n' "$4") -out "$2.crt" 2>/dev/null
}
client() { # client CA OUT USER [GROUP...]
  local ca=$1 out=$2 user=$3 subject=""
  shift 3
  for group in "$@"; do subject+="/O=$group"; done
  sign "$ca" "$out" "$subject/CN=$user" \
    "$(printf 'keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth')"
}
serving() { # serving OUT: a loopback serving certificate, its CA after it (a chain kcp serves)
  sign serving-ca "$1" "/CN=127.0.0.1" "$(printf '%s\n' 'keyUsage=critical,digitalSignature' \
    'extendedKeyUsage=serverAuth' 'subjectAltName=DNS:localhost,IP:127.0.0.1')"
  cat "$certs/serving-ca.crt" >>"$1.crt"
}
kubeconfig() { # kubeconfig OUT SERVER CERT CONTEXT...: a client-certificate kubeconfig
  local out=$1 server=$2 cert=$3
  shift 3
  {
    printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: base\n  cluster:\n'
    printf '    server: %s\n    certificate-authority: %s\n' "$server" "$certs/serving-ca.crt"
    printf -- '- name: root\n  cluster:\n    server: %s/clusters/root\n' "$server"
    printf '    certificate-authority: %s\n' "$certs/serving-ca.crt"
    printf 'users:\n- name: user\n  user:\n    client-certificate: %s.crt\n' "$cert"
    printf '    client-key: %s.key\ncontexts:\n' "$cert"
    for context in "$@"; do
      local cluster=base
      [[ $context == root ]] && cluster=root
      printf -- '- name: %s\n  context:\n    cluster: %s\n    user: user\n' "$context" "$cluster"
    done
    printf 'current-context: %s\n' "$1"
  } >"$out"
}

ca client-ca kcp-client-ca
ca requestheader-ca kcp-front-proxy-requestheader-ca
ca serving-ca kcp-serving-ca
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -keyout "$certs/service-account.key" \
  -out "$certs/service-account.crt" -subj "/CN=kcp-service-account-signing-ca" 2>/dev/null
client requestheader-ca "$certs/requestheader" kcp-front-proxy
client requestheader-ca "$certs/mounts-proxy" kcp-mounts-proxy
client client-ca "$certs/kcp-admin" kcp-admin system:kcp:admin
client client-ca "$certs/logical-cluster-admin" logical-cluster-admin system:kcp:logical-cluster-admin
client client-ca "$certs/external-logical-cluster-admin" external-logical-cluster-admin \
  system:kcp:external-logical-cluster-admin
client client-ca "$certs/shard-admin" shard-admin system:masters
client client-ca "$certs/cache-client" cache-client system:masters
serving "$certs/front-proxy"

# shellcheck source=../ports.sh
source "$here/../ports.sh"
# Below the ephemeral range: a shard restarted by restart-shard.sh comes back on its ports, which
# an outgoing connection could otherwise take as its local port meanwhile (seen: a restart whose
# embedded etcd found its peer port in use).
kept_port proxy_port
kept_port cache_port
kept_port cache_etcd
kept_port cache_etcd_peer
for n in $(seq 0 $((shards - 1))); do
  kept_port "shard_port_$n"
  kept_port "etcd_port_$n"
  kept_port "etcd_peer_$n"
done
proxy_url=https://127.0.0.1:$proxy_port
port_of() { local v="shard_port_$1"; echo "${!v}"; }
name_of() { if (($1 == 0)); then echo root; else echo "shard-$1"; fi; }

launch() { # launch NAME COMMAND...: in its own process group, logged, pid and command kept
  local name=$1
  shift
  printf '%s\0' "$@" >"$dir/$name.command" # restart-shard.sh starts it again from this
  setsid "$@" </dev/null >>"$dir/logs/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}
wait_ready() { # wait_ready NAME URL CA [CLIENT_CERT]
  local name=$1 url=$2 ca=$3 cert=${4:-} since=$SECONDS
  local auth=()
  [[ -n $cert ]] && auth=(--cert "$cert.crt" --key "$cert.key")
  until curl -fsS --max-time 3 --cacert "$ca" "${auth[@]}" "$url/readyz" >/dev/null 2>&1; do
    kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null || fail "$name exited during start"
    ((SECONDS - since < timeout)) || fail "$name not ready within ${timeout} s"
    sleep 1
  done
}

# --- the cache server ------------------------------------------------------------------------
mkdir -p "$dir/cache"
launch cache "$bin/cache-server" --root-directory="$dir/cache" --bind-address=127.0.0.1 \
  --secure-port="$cache_port" --synthetic-delay=0s --client-ca-file="$certs/client-ca.crt" \
  --embedded-etcd-client-port="$cache_etcd" --embedded-etcd-peer-port="$cache_etcd_peer"
since=$SECONDS
until [[ -f $dir/cache/apiserver.crt ]]; do
  kill -0 "$(cat "$dir/cache.pid")" 2>/dev/null || fail "the cache server exited during start"
  ((SECONDS - since < timeout)) || fail "no cache server certificate within ${timeout} s"
  sleep 0.5
done
# The cache server signs its own serving certificate for localhost, as in sharded-test-server.
cat >"$dir/cache/cache.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cache
  cluster:
    server: https://localhost:$cache_port
    certificate-authority: $dir/cache/apiserver.crt
users:
- name: cache
  user:
    client-certificate: $certs/cache-client.crt
    client-key: $certs/cache-client.key
contexts:
- name: cache
  context:
    cluster: cache
    user: cache
current-context: cache
EOF
wait_ready cache "https://localhost:$cache_port" "$dir/cache/apiserver.crt" "$certs/cache-client"
say "cache server ready on 127.0.0.1:$cache_port ($((SECONDS - started)) s)"

# --- the shards ------------------------------------------------------------------------------
kubeconfig "$certs/logical-cluster-admin.kubeconfig" "https://127.0.0.1:$(port_of 0)" \
  "$certs/logical-cluster-admin" base
kubeconfig "$certs/external-logical-cluster-admin.kubeconfig" "$proxy_url" \
  "$certs/external-logical-cluster-admin" base

# shellcheck source=quota-args.sh
source "$here/quota-args.sh"
quota_args "$quota" || fail "LAZYQUOTA_KCP_QUOTA must be on or off, not '$quota'"

start_shard() { # start_shard N
  local n=$1 name port etcd peer
  name=$(name_of "$n")
  port=$(port_of "$n")
  etcd="etcd_port_$n"
  peer="etcd_peer_$n"
  local sdir=$dir/shard-$n
  mkdir -p "$sdir"
  serving "$sdir/apiserver"
  client client-ca "$sdir/shard-client-cert" "kcp-shard-$n" system:masters
  local args=(start --shard-name="$name" --bind-address=127.0.0.1
    --embedded-etcd-client-port="${!etcd}" --embedded-etcd-peer-port="${!peer}"
    --root-directory="$sdir" --client-ca-file="$certs/client-ca.crt"
    --requestheader-client-ca-file="$certs/requestheader-ca.crt"
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group
    --requestheader-extra-headers-prefix=X-Remote-Extra-
    --service-account-key-file="$certs/service-account.crt"
    --service-account-private-key-file="$certs/service-account.key"
    --service-account-signing-key-file="$certs/service-account.key"
    --audit-log-path="$dir/logs/audit-$n.log" --shard-external-url="$proxy_url"
    --tls-cert-file="$sdir/apiserver.crt" --tls-private-key-file="$sdir/apiserver.key"
    --secure-port="$port"
    --logical-cluster-admin-kubeconfig="$certs/logical-cluster-admin.kubeconfig"
    --external-logical-cluster-admin-kubeconfig="$certs/external-logical-cluster-admin.kubeconfig"
    --shard-client-cert-file="$sdir/shard-client-cert.crt"
    --shard-client-key-file="$sdir/shard-client-cert.key"
    --shard-virtual-workspace-ca-file="$certs/serving-ca.crt"
    --mount-proxy-client-cert-file="$certs/mounts-proxy.crt"
    --mount-proxy-client-key-file="$certs/mounts-proxy.key"
    --cache-kubeconfig="$dir/cache/cache.kubeconfig" "${quota_args[@]}")
  ((n > 0)) && args+=(--root-shard-kubeconfig-file="$dir/shard-0/admin.kubeconfig")
  launch "$name" "$kcp" "${args[@]}"
  kubeconfig "$sdir/shard.kubeconfig" "https://127.0.0.1:$port" "$certs/shard-admin" shard-base root
}

start_shard 0
since=$SECONDS
# The other shards reach the root shard with the admin kubeconfig it writes once it serves.
until [[ -f $dir/shard-0/admin.kubeconfig ]]; do
  kill -0 "$(cat "$dir/root.pid")" 2>/dev/null || fail "the root shard exited during start"
  ((SECONDS - since < timeout)) || fail "no root shard admin kubeconfig within ${timeout} s"
  sleep 1
done
for n in $(seq 1 $((shards - 1))); do start_shard "$n"; done
for n in $(seq 0 $((shards - 1))); do
  wait_ready "$(name_of "$n")" "https://127.0.0.1:$(port_of "$n")" "$certs/serving-ca.crt" \
    "$certs/shard-admin"
done
say "$shards shards ready ($((SECONDS - started)) s)"

# --- the front-proxy -------------------------------------------------------------------------
mkdir -p "$dir/front-proxy"
cat >"$dir/front-proxy/mapping.yaml" <<EOF
- path: /clusters/
  backend: https://127.0.0.1:$(port_of 0)
  backend_server_ca: $certs/serving-ca.crt
  proxy_client_cert: $certs/requestheader.crt
  proxy_client_key: $certs/requestheader.key
EOF
kubeconfig "$dir/front-proxy/root.kubeconfig" "https://127.0.0.1:$(port_of 0)" \
  "$certs/shard-admin" shard-base
# No server: the front-proxy puts in each Shard's URL.
kubeconfig "$dir/front-proxy/shards.kubeconfig" "" "$certs/shard-admin" base
launch front-proxy "$bin/kcp-front-proxy" --bind-address=127.0.0.1 \
  --mapping-file="$dir/front-proxy/mapping.yaml" --root-directory="$dir/front-proxy" \
  --root-kubeconfig="$dir/front-proxy/root.kubeconfig" \
  --shards-kubeconfig="$dir/front-proxy/shards.kubeconfig" \
  --client-ca-file="$certs/client-ca.crt" --requestheader-client-ca-file="$certs/requestheader-ca.crt" \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --requestheader-allowed-names=kcp-front-proxy,kcp-mounts-proxy \
  --tls-cert-file="$certs/front-proxy.crt" --tls-private-key-file="$certs/front-proxy.key" \
  --secure-port="$proxy_port" --v=2
kubeconfig "$dir/admin.kubeconfig" "$proxy_url" "$certs/kcp-admin" root base
wait_ready front-proxy "$proxy_url" "$certs/serving-ca.crt" "$certs/kcp-admin"
say "front-proxy ready on $proxy_url ($((SECONDS - started)) s)"

# Every shard registered (kcp labels each Shard with its name: what a Workspace's
# spec.location.selector matches to be placed on it).
since=$SECONDS
until [[ $(curl -fsS --max-time 5 --cacert "$certs/serving-ca.crt" --cert "$certs/kcp-admin.crt" \
  --key "$certs/kcp-admin.key" "$proxy_url/clusters/root/apis/core.kcp.io/v1alpha1/shards" 2>/dev/null |
  jq '[.items[] | select(.metadata.labels.name != null)] | length') == "$shards" ]]; do
  ((SECONDS - since < 60)) || fail "not every shard registered within 60 s"
  sleep 1
done

{
  echo "LAZYQUOTA_KCP_DIR=$dir"
  echo "LAZYQUOTA_KCP_URL=$proxy_url"
  echo "LAZYQUOTA_KCP_KUBECONFIG=$dir/admin.kubeconfig"
  echo "LAZYQUOTA_KCP_QUOTA=$quota"
  echo "LAZYQUOTA_KCP_BIN=$kcp"
  echo "LAZYQUOTA_KCP_SHARDS=$shards"
  echo "LAZYQUOTA_KCP_CACHE_PID=$(cat "$dir/cache.pid")"
  echo "LAZYQUOTA_KCP_FRONT_PROXY_PID=$(cat "$dir/front-proxy.pid")"
  for n in $(seq 0 $((shards - 1))); do
    name=$(name_of "$n")
    echo "LAZYQUOTA_KCP_SHARD_${n}_NAME=$name"
    echo "LAZYQUOTA_KCP_SHARD_${n}_URL=https://127.0.0.1:$(port_of "$n")"
    echo "LAZYQUOTA_KCP_SHARD_${n}_KUBECONFIG=$dir/shard-$n/shard.kubeconfig"
    echo "LAZYQUOTA_KCP_SHARD_${n}_PID=$(cat "$dir/$name.pid")"
  done
} >"$dir/env"
say "ready in $((SECONDS - started)) s"
echo "$dir/admin.kubeconfig"
