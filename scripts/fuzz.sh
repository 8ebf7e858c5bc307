#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default: 30 s, all targets)
#
# Installs cargo-fuzz when it is missing. cargo-fuzz needs nightly-only rustc flags
# (-Zsanitizer=address, sancov); with only a stable toolchain installed they are unlocked
# with RUSTC_BOOTSTRAP=1 (set here unless the caller set it, or a nightly toolchain is in use).
# Seed inputs live in fuzz/seeds/<target>/ (versioned); what libFuzzer finds goes to
# fuzz/corpus/<target>/ and crashes to fuzz/artifacts/<target>/ (both ignored by git).
# Environment: CARGO_BUILD_JOBS is honoured (default 1 here), FUZZ_JOBS=<n> runs n workers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${1:-30}
shift || true
targets=("$@")

export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
if ! rustc --version | grep -q nightly; then
  export RUSTC_BOOTSTRAP=${RUSTC_BOOTSTRAP:-1}
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi

status=0
for target in "${targets[@]}"; do
  corpus=fuzz/corpus/$target
  seeds=fuzz/seeds/$target
  mkdir -p "$corpus"
  args=(-max_total_time="$seconds" -print_final_stats=1)
  if [[ -f fuzz/$target.dict ]]; then
    args+=(-dict="$PWD/fuzz/$target.dict")
  fi
  if [[ -n ${FUZZ_JOBS:-} ]]; then
    args+=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
  fi
  dirs=("$PWD/$corpus")
  [[ -d $seeds ]] && dirs+=("$PWD/$seeds")
  echo "==> fuzzing $target for ${seconds}s" >&2
  if ! (cd fuzz && cargo fuzz run "$target" "${dirs[@]}" -- "${args[@]}"); then
    echo "==> $target FAILED (see fuzz/artifacts/$target/)" >&2
    status=1
  fi
done
exit $status
