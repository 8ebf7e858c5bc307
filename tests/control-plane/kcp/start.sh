#!/usr/bin/env bash
# Starts one kcp shard (embedded etcd) on loopback, built by ./build.sh. One state directory:
#
#   $LAZYQUOTA_KCP_DIR (default: <repo>/.lazyquota/kcp)
#     root/admin.kubeconfig  kcp's admin kubeconfig (contexts root, base, shard-base, system:admin)
#     env                    facts: URL, kubeconfig, pid, whether kcp's quota controller runs
#     logs/kcp.log           kcp's log
#
# Options (environment):
#   LAZYQUOTA_KCP_QUOTA=on|off  run kcp's own quota controller ("quota", kcp-kube-quota) (default
#                               on). Off runs every other controller of kcp v0.32.3 by name, so
#                               lazyquota is the only writer of ResourceQuota status; kcp's
#                               quota admission plugin still enforces the status it writes.
#   LAZYQUOTA_KCP_TIMEOUT=180   seconds to wait for /readyz
#   LAZYQUOTA_KCP_ARGS          extra `kcp start` flags (space separated)
#   LAZYQUOTA_KCP_KEEP_DATA=1   keep <dir>/root (embedded etcd data, certificates, admin tokens)
#                               of an earlier start and only restart the process, e.g. to run
#                               the same workspaces with and without kcp's quota controller
#                               (default 0: start from an empty directory). kcp reads the
#                               shard-admin token back from admin.kubeconfig and rewrites it for
#                               the new port (a new kcp-admin token); the earlier log is kept as
#                               logs/kcp.<time>.log.
#
# A kcp already running from the same directory is stopped first. Prints the shard-admin
# kubeconfig's path as the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
dir=${LAZYQUOTA_KCP_DIR:-$repo/.lazyquota/kcp}
timeout=${LAZYQUOTA_KCP_TIMEOUT:-180}
quota=${LAZYQUOTA_KCP_QUOTA:-on}

say() { printf 'kcp: %s\n' "$*" >&2; }

kcp=$(bash "$here/build.sh" | tail -n 1)

bash "$here/stop.sh" "$dir" >/dev/null
keep=0
if [[ ${LAZYQUOTA_KCP_KEEP_DATA:-0} == 1 && -f $dir/root/admin.kubeconfig ]]; then
  keep=1
  rm -f "$dir/env"
  if [[ -f $dir/logs/kcp.log ]]; then mv "$dir/logs/kcp.log" "$dir/logs/kcp.$(date +%s).log"; fi
  say "keeping the data in $dir/root"
else
  rm -rf "$dir"
fi
mkdir -p "$dir/logs"
dir=$(cd "$dir" && pwd)

fail() {
  say "error: $*"
  if [[ -f $dir/logs/kcp.log ]]; then
    say "last lines of $dir/logs/kcp.log:"
    tail -n 30 "$dir/logs/kcp.log" >&2
  fi
  bash "$here/stop.sh" "$dir" >/dev/null
  exit 1
}

# shellcheck source=../ports.sh
source "$here/../ports.sh"
free_port port
free_port etcd_port
free_port etcd_peer_port

args=(start --root-directory "$dir/root" --bind-address=127.0.0.1 --secure-port="$port"
  --external-hostname=127.0.0.1 --embedded-etcd-client-port="$etcd_port"
  --embedded-etcd-peer-port="$etcd_peer_port")
# shellcheck source=quota-args.sh
source "$here/quota-args.sh"
quota_args "$quota" || fail "LAZYQUOTA_KCP_QUOTA must be on or off, not '$quota'"
args+=("${quota_args[@]}")
# shellcheck disable=SC2206 # word splitting of the extra flags is the point
[[ -n ${LAZYQUOTA_KCP_ARGS:-} ]] && args+=($LAZYQUOTA_KCP_ARGS)

say "starting kcp on 127.0.0.1:$port (quota controller $quota)"
setsid "$kcp" "${args[@]}" </dev/null >"$dir/logs/kcp.log" 2>&1 &
echo $! >"$dir/kcp.pid"

kubeconfig=$dir/root/admin.kubeconfig
start=$SECONDS
# Kept data: the old kubeconfig names the old port until kcp has rewritten it.
until [[ -f $kubeconfig ]] && { ((keep == 0)) || grep -q "server: https://127.0.0.1:$port" "$kubeconfig"; } &&
  curl -fsS --max-time 3 --cacert "$dir/root/apiserver.crt" "https://127.0.0.1:$port/readyz" >/dev/null 2>&1; do
  kill -0 "$(cat "$dir/kcp.pid")" 2>/dev/null || fail "kcp exited during start"
  ((SECONDS - start < timeout)) || fail "kcp not ready within ${timeout} s"
  sleep 1
done
say "ready in $((SECONDS - start)) s"

cat >"$dir/env" <<FACTS
LAZYQUOTA_KCP_DIR=$dir
LAZYQUOTA_KCP_URL=https://127.0.0.1:$port
LAZYQUOTA_KCP_KUBECONFIG=$kubeconfig
LAZYQUOTA_KCP_PID=$(cat "$dir/kcp.pid")
LAZYQUOTA_KCP_QUOTA=$quota
LAZYQUOTA_KCP_BIN=$kcp
FACTS
echo "$kubeconfig"
