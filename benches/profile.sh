#!/usr/bin/env bash
# What the release profile's knobs change: builds lazyquota with each variant below, each in its
# own target directory (nothing in target/<host>/release changes), reports the binary sizes, then runs
# the scale benchmark once with KCM, the default build and every variant side by side, at the
# given N (default 400 CRDs), and writes benches/results/profile/ (scale.md and sizes.md).
#
#   bash benches/profile.sh [N]
#
# Variants:
#   default      the workspace's release profile as committed (target/<host>/release)
#   strip        that binary with its symbol table removed by strip(1) (what strip = "symbols"
#                does at link time; the default profile already drops debug info)
#   lto          lto = "fat", codegen-units = 1 (CARGO_PROFILE_RELEASE_*) on top of the committed
#                profile (so at its opt-level, "s" since d284373), in target/profile-lto
#   lto-strip    that binary stripped
# The LTO build takes the whole machine for several minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
n=${1:-400}
# Binaries land under target/<host tuple>/ (.cargo/config.toml builds for the host as a named target).
host=$(rustc --print host-tuple)
out=$repo/benches/results/profile
mkdir -p "$out"

declare -A binaries
start=$SECONDS
cargo build --release --locked --bin lazyquota >&2
binaries[default]=$repo/target/$host/release/lazyquota
start=$SECONDS
CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 CARGO_TARGET_DIR=$repo/target/profile-lto \
  cargo build --release --locked --bin lazyquota >&2
echo "profile: the LTO build took $((SECONDS - start)) s" >&2
binaries[lto]=$repo/target/profile-lto/$host/release/lazyquota
mkdir -p "$repo/target/profile-strip"
for name in default lto; do
  strip --strip-all -o "$repo/target/profile-strip/lazyquota-$name" "${binaries[$name]}"
  binaries[$name-strip]=$repo/target/profile-strip/lazyquota-$name
done
binaries[strip]=${binaries[default-strip]}

{
  echo "# Release profile variants: binary size"
  echo
  echo "Built by \`bash benches/profile.sh $n\` at commit \`$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!benches/results' || echo -dirty)\`."
  echo
  echo "| variant | settings | binary MiB |"
  echo "|---|---|---|"
  for name in default strip lto lto-strip; do
    case $name in
      default) settings="as committed" ;;
      strip) settings='strip(1) --strip-all' ;;
      lto) settings='lto = "fat", codegen-units = 1' ;;
      lto-strip) settings='lto = "fat", codegen-units = 1, then strip(1)' ;;
    esac
    size=$(stat -c %s "${binaries[$name]}")
    awk -v n="$name" -v s="$settings" -v b="$size" 'BEGIN { printf "| %s | %s | %.1f |\n", n, s, b / 1048576 }'
  done
} > "$out/sizes.md"
cat "$out/sizes.md"

flags=()
for name in default strip lto lto-strip; do
  flags+=(--lazy-binary "$name=${binaries[$name]}")
done
cargo bench --locked --bench scale -- --crds "$n" --controllers kcm --new-quota-samples 10 \
  --deletes 20 --out "$out" "${flags[@]}"
