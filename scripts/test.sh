#!/usr/bin/env bash
# The whole test suite, as `make test` runs it: lint, build the control plane (cached), build
# the Rust tests, run them against the real control planes, stop everything. Prints how long
# each phase took. Control planes are started by the tests themselves (crates/testenv) on
# first use and shared by every test binary; this script stops them at the end, pass or fail.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

phases=()
phase() {
  local name=$1; shift
  local start=$SECONDS
  printf '\n==> %s\n' "$name" >&2
  "$@"
  phases+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
}
# Every control plane and kcp shard the tests may have started (crates/testenv). A stop that
# fails is reported, not hidden: a server left running would skew the next run.
stop_all() {
  local flavour
  for flavour in kcm-quota lazyquota-only multi-cluster compacting; do
    bash tests/control-plane/stop.sh ".lazyquota/testenv-$flavour" >/dev/null ||
      echo "warning: stopping the $flavour control plane failed" >&2
  done
  for flavour in kcp-quota kcp-lazyquota-only kcp-sharded-quota kcp-sharded-lazyquota-only; do
    bash tests/control-plane/kcp/stop.sh ".lazyquota/testenv-$flavour" >/dev/null ||
      echo "warning: stopping the $flavour kcp shard failed" >&2
  done
  bash tests/control-plane/node/stop.sh .lazyquota/testenv-node 2>/dev/null ||
    echo "warning: stopping the node flavour failed" >&2
}
report() {
  local rc=$?
  # The image build running beside the tests (below), if the run ends before it does.
  if [[ -n ${image_pid:-} ]]; then kill -- "-$image_pid" 2>/dev/null || true; fi
  stop_all
  printf '\n==> phase times\n' >&2
  for p in "${phases[@]}"; do printf '  %s\n' "$p" >&2; done
  exit $rc
}
trap report EXIT

# Control planes left over from an interrupted run would be reused only if healthy; start clean.
stop_all
rm -rf .lazyquota/testenv-*

phase "format check" cargo fmt --all -- --check
phase "control plane build" bash tests/control-plane/build.sh >/dev/null
# kcp, cache-server and kcp-front-proxy (a sharded kcp's), in one go build.
phase "kcp build" bash tests/control-plane/kcp/build.sh >/dev/null
phase "kcp e2e quota tests build" bash tests/control-plane/kcp/build.sh quota-e2e >/dev/null
phase "helm build" bash tests/helm/build.sh >/dev/null
phase "node build" bash tests/control-plane/node/build.sh >/dev/null
phase "figures cite their result files" python3 scripts/figures.py
phase "helm lint/template" bash tests/helm/check.sh
phase "clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
phase "cargo-deny" bash scripts/deny.sh
phase "build tests" cargo test --workspace --locked --no-run
mkdir -p .lazyquota
# deploy/Dockerfile's build stage without an image engine: exactly the files it copies, the
# same cargo build (its release profile has its own target directory, so it does not wait for
# the tests' cargo). Its release binary is the one the bounded benchmarks and the chart's pods
# run. It runs beside the tests at the lowest CPU priority: the tests mostly wait on their
# servers, and on 2 cores this build was a phase of its own of about 390 s after them. Its own
# process group, so that a failed run can stop it (a job is one already under job control;
# otherwise setsid, which does not fork here, makes it one).
image_log=.lazyquota/image-build.log
if [[ $- == *m* ]]; then
  nice -n 19 bash deploy/build-stage.sh >"$image_log" 2>&1 &
else
  setsid nice -n 19 bash deploy/build-stage.sh >"$image_log" 2>&1 &
fi
image_pid=$!
wait_image() {
  local rc=0
  wait "$image_pid" || rc=$?
  image_pid=
  if ((rc != 0)); then
    tail -n 40 "$image_log" >&2
    echo "error: deploy/build-stage.sh failed ($rc); its log: $image_log" >&2
    return "$rc"
  fi
}
phase "tests" bash -c 'set -o pipefail; cargo test --workspace --locked 2>&1 | tee .lazyquota/test.log'
# The sharded kcp with kcp's quota controller is not needed again (the Helm test reuses the
# other one); idle, its five processes would take CPU from the benchmarks.
bash tests/control-plane/kcp/stop.sh .lazyquota/testenv-kcp-sharded-quota >/dev/null || true
phase "reliability report up to date" bash scripts/reliability.sh --check .lazyquota/test.log
# The parity test against the other Kubernetes releases of the matrix, each only if its build
# is cached on this machine (a skipped one prints one line); `make parity-matrix` builds them.
phase "parity matrix (cached releases)" env LAZYQUOTA_PARITY_SEEDS=10 bash scripts/parity-matrix.sh --cached-only --others
phase "image build stage (what was left after the tests)" wait_image
release_bin="$PWD/target/$(rustc --print host-tuple)/release/lazyquota"
# Bounded versions of the benchmarks (the full ones are documented in docs/benchmarks.md): they
# must run, their figures are not asserted. Their harnesses are built with the test profile,
# whose dependencies the test build above compiled, instead of the release profile's (each bench
# binary linked with fat LTO in one codegen unit); what they measure is the release binary
# (LAZYQUOTA_BIN). The heap bench's bytes do not depend on the profile; its compute times do.
# `--workspace`: the test build's feature resolution, so no dependency is compiled again.
phase "bench: heap (bounded)" env LAZYQUOTA_BENCH_OBJECTS=10000 cargo test --workspace --locked --bench heap
phase "bench: scale (bounded)" env LAZYQUOTA_BIN="$release_bin" cargo test --workspace --locked --bench scale -- --quick
phase "bench: scale against a full KCM (bounded)" env LAZYQUOTA_BIN="$release_bin" cargo test --workspace --locked --bench scale -- --quick --full-kcm
phase "bench: faults against KCM and lazyquota (bounded: F1, F4, F6)" env LAZYQUOTA_BIN="$release_bin" cargo test --workspace --locked --bench faults -- --quick
phase "bench: load and soak (bounded)" env LAZYQUOTA_BIN="$release_bin" cargo test --workspace --locked --bench load -- --quick
phase "bench: kcp seed scenario (bounded)" env LAZYQUOTA_BIN="$release_bin" cargo test --workspace --locked --bench kcp -- --quick
phase "bench: kcp seed scenario across 3 shards (bounded)" env LAZYQUOTA_BIN="$release_bin" cargo test --workspace --locked --bench kcp -- --quick --shards 3
# The chart's pods on two real nodes (kubelet, containerd, runc), with that binary's image.
phase "helm on nodes" bash tests/helm/node-test.sh "$release_bin"
