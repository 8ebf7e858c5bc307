# Sourced by the Helm tests (node-test.sh, node-kcp-test.sh): their log lines and bounded
# waits. Set `who` (the prefix of every line) before sourcing.

say() { printf '%s: %s\n' "$who" "$*" >&2; }
step() { printf '\n==> %s: %s\n' "$who" "$*" >&2; }
die() { say "FAIL: $*"; exit 1; }

# eventually SECONDS WHAT CMD...: retries CMD every second until it succeeds.
eventually() {
  local limit=$1 what=$2
  shift 2
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - start < limit)) || die "$what (not within ${limit}s)"
    sleep 1
  done
  say "ok: $what ($((SECONDS - start)) s)"
}
