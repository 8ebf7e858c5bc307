#!/usr/bin/env bash
# The parity matrix: the parity test (tests/parity.rs: lazyquota against KCM's own quota
# controller, per key and through `lazyquota run`) against kube-apiserver and
# kube-controller-manager of each Kubernetes release in PARITY_VERSIONS
# (tests/control-plane/kube/matrix/versions.env), each on
# a control plane of its own, started and stopped here.
#
#   bash scripts/parity-matrix.sh                 # builds what is missing (cold: ~15 min a release), 20 seeds
#   bash scripts/parity-matrix.sh --cached-only   # skips (one line each) releases not built yet (CI)
#   LAZYQUOTA_PARITY_SEEDS=5 bash scripts/parity-matrix.sh v1.35.8
#   bash scripts/parity-matrix.sh --write         # and rewrites the table in docs/parity.md
#   bash scripts/parity-matrix.sh --others        # all but the pinned release (which `cargo test` runs)
#
# Every run prints one result line per release; a release with a mismatch fails the script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=../tests/control-plane/kube/matrix/versions.env
source tests/control-plane/kube/matrix/versions.env

cached_only=
write=
others=
versions=()
for arg in "$@"; do
  case $arg in
    --cached-only) cached_only=1 ;;
    --write) write=1 ;;
    --others) others=1 ;;
    v1.*) versions+=("$arg") ;;
    *) echo "parity-matrix: unknown argument $arg" >&2; exit 2 ;;
  esac
done
((${#versions[@]})) || read -r -a versions <<<"$PARITY_VERSIONS"
if [[ -n $others ]]; then
  pinned=$(sed -n 's/^KUBE_VERSION=//p' tests/control-plane/versions.env)
  for i in "${!versions[@]}"; do
    [[ ${versions[$i]} == "$pinned" ]] && unset 'versions[i]'
  done
fi
seeds=${LAZYQUOTA_PARITY_SEEDS:-20}

mkdir -p .lazyquota
# The parity test is built before the first release that runs, not before the loop: with
# --cached-only and nothing cached (CI on a new machine) nothing runs, and building it alone
# (a feature set of its own) took about as long as the rest of the phase.
test_built=""
rows=()
failed=0
for version in "${versions[@]}"; do
  if [[ -n $cached_only ]] && ! LAZYQUOTA_KUBE_VERSION=$version LAZYQUOTA_CACHED_ONLY=1 \
      bash tests/control-plane/build.sh >/dev/null 2>&1; then
    echo "parity-matrix: $version skipped: not built yet (make parity-matrix builds it)"
    continue
  fi
  if [[ -z $test_built ]]; then
    cargo test --locked --test parity --no-run >&2
    test_built=1
  fi
  build_start=$SECONDS
  LAZYQUOTA_KUBE_VERSION=$version bash tests/control-plane/build.sh >/dev/null
  built=$((SECONDS - build_start))
  dir=$PWD/.lazyquota/parity-$version
  log=$dir.log
  bash tests/control-plane/stop.sh "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
  start=$SECONDS
  status=0
  (
    trap 'bash tests/control-plane/stop.sh "$dir" >/dev/null 2>&1' EXIT
    LAZYQUOTA_CP_DIR=$dir LAZYQUOTA_KUBE_VERSION=$version LAZYQUOTA_KCM_QUOTA=on \
      bash tests/control-plane/start.sh >/dev/null
    LAZYQUOTA_CP_DIR_KCM=$dir LAZYQUOTA_PARITY_SEEDS=$seeds \
      cargo test --locked --test parity -- --nocapture
  ) >"$log" 2>&1 || status=$?
  summary=$(grep -E '^parity: [0-9]+ seeds' "$log" || true)
  if ((status != 0)) || [[ -z $summary ]]; then
    failed=1
    echo "parity-matrix: $version FAILED after $((SECONDS - start)) s (log: $log)"
    grep -E '^  seed|panicked' "$log" | head -20 || true
  else
    echo "parity-matrix: $version ok in $((SECONDS - start)) s (build $built s): ${summary#parity: }"
  fi
  while IFS= read -r line; do
    # "parity by evaluator: pods: 120 pairs, 0 mismatches"
    family=${line#parity by evaluator: }
    name=${family%%: *}
    counts=${family#*: }
    pairs=${counts%% pairs*}
    mismatches=${counts#*, }
    mismatches=${mismatches%% *}
    rows+=("| $version | $name | $pairs | $mismatches |")
  done < <(grep -E '^parity by evaluator: ' "$log" || true)
  e2e=$(sed -nE 's/.*through the controller: ([0-9]+) pairs, ([0-9]+) mismatches.*/\1 \2/p' "$log" | tail -n 1)
  if [[ -n $e2e ]]; then
    rows+=("| $version | **through \`lazyquota run\`** | ${e2e% *} | ${e2e#* } |")
  fi
done

if [[ -n $write ]]; then
  commit=$(git rev-parse --short HEAD)
  dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
  table=$(
    echo "<!-- parity-matrix: written by scripts/parity-matrix.sh --write -->"
    echo "Measured at commit \`$commit\`$dirty on $(date -u +%Y-%m-%d), $seeds seeds per release."
    echo
    echo "| release | evaluator | (quota, key) pairs | mismatches |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo "<!-- /parity-matrix -->"
  )
  python3 - "$table" <<'EOF'
import re, sys
path = "docs/parity.md"
text = open(path).read()
new = sys.argv[1]
text, n = re.subn(r"<!-- parity-matrix:.*?<!-- /parity-matrix -->", lambda _: new, text, flags=re.S)
if n != 1:
    sys.exit("docs/parity.md has no parity-matrix block")
open(path, "w").write(text)
EOF
  echo "parity-matrix: docs/parity.md updated"
fi
exit $failed
