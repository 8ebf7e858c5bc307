#!/usr/bin/env bash
# Restarts one shard of a kcp started by start-sharded.sh, with its data (embedded etcd,
# certificates) and its port: SIGTERM to its process group (SIGKILL after a grace period),
# then the same command again, then /readyz. Usage: restart-shard.sh STATE_DIR SHARD_NAME.
# Updates the shard's pid in STATE_DIR/env. With LAZYQUOTA_KCP_QUOTA=on|off the shard comes back
# with kcp's own quota controller on or off (the kept command's controller flags swapped, and
# kept for the next restart); unset, as it was.
set -euo pipefail

dir=${1:?usage: restart-shard.sh STATE_DIR SHARD_NAME}
name=${2:?usage: restart-shard.sh STATE_DIR SHARD_NAME}
timeout=${LAZYQUOTA_KCP_TIMEOUT:-180}
quota=${LAZYQUOTA_KCP_QUOTA:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
grace=${LAZYQUOTA_STOP_GRACE:-15}

say() { printf 'kcp-sharded: %s\n' "$*" >&2; }
fail() { say "error: $*"; tail -n 15 "$dir/logs/$name.log" >&2 || true; exit 1; }

[[ -f $dir/$name.command && -f $dir/env ]] || fail "no shard $name started by start-sharded.sh in $dir"
n=$(sed -n "s/^LAZYQUOTA_KCP_SHARD_\([0-9]*\)_NAME=$name$/\1/p" "$dir/env")
[[ -n $n ]] || fail "shard $name is not in $dir/env"
url=$(sed -n "s/^LAZYQUOTA_KCP_SHARD_${n}_URL=//p" "$dir/env")

if [[ -f $dir/$name.pid ]]; then
  pid=$(cat "$dir/$name.pid")
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
fi
mapfile -d '' command <"$dir/$name.command"
if [[ -n $quota ]]; then
  # shellcheck source=quota-args.sh
  source "$here/quota-args.sh"
  quota_args "$quota" || fail "LAZYQUOTA_KCP_QUOTA must be on or off, not '$quota'"
  kept=()
  for arg in "${command[@]}"; do
    case $arg in
      --run-controllers=* | --unsupported-run-individual-controllers=*) ;;
      *) kept+=("$arg") ;;
    esac
  done
  command=("${kept[@]}" "${quota_args[@]}")
  printf '%s\0' "${command[@]}" >"$dir/$name.command"
fi
echo "--- restarted $(date -u +%FT%TZ)" >>"$dir/logs/$name.log"
setsid "${command[@]}" </dev/null >>"$dir/logs/$name.log" 2>&1 &
pid=$!
echo "$pid" >"$dir/$name.pid"
sed -i "s/^LAZYQUOTA_KCP_SHARD_${n}_PID=.*/LAZYQUOTA_KCP_SHARD_${n}_PID=$pid/" "$dir/env"

start=$SECONDS
until curl -fsS --max-time 3 --cacert "$dir/certs/serving-ca.crt" --cert "$dir/certs/shard-admin.crt" \
  --key "$dir/certs/shard-admin.key" "$url/readyz" >/dev/null 2>&1; do
  kill -0 "$pid" 2>/dev/null || fail "shard $name exited during its restart"
  ((SECONDS - start < timeout)) || fail "shard $name not ready within ${timeout} s of its restart"
  sleep 1
done
say "shard $name restarted${quota:+ with kcp quota controller $quota}, ready in $((SECONDS - start)) s"
