#!/usr/bin/env bash
# Runs deploy/Dockerfile's build stage without an image engine: copies exactly the files its
# COPY lines copy into an empty directory and runs the stage's cargo build there. A manifest
# that needs a file the stage does not copy (a [[bench]] whose source is not in the image's
# context, say) fails here as it would in `docker build`.
#
#   bash deploy/build-stage.sh            # prints the binary's path as the last line
#
# The registry and compiled dependencies come from this machine's cargo cache and the
# repository's target/ directory (the image build mounts caches the same way), so only the
# workspace crates are compiled again. Offline: nothing is fetched that Cargo.lock does not
# already name and the cache does not hold.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
dockerfile=$here/Dockerfile

stage=$(mktemp -d "${TMPDIR:-/tmp}/lazyquota-build-stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# The build stage: from `FROM ... AS build` to the next FROM.
in_stage=0
copies=0
run=
while IFS= read -r line; do
  case $line in
    FROM*" AS build"*|FROM*" as build"*) in_stage=1; continue ;;
    FROM*) in_stage=0; continue ;;
  esac
  ((in_stage)) || continue
  case $line in
    COPY\ --from=*) echo "build-stage: unexpected COPY --from in the build stage: $line" >&2; exit 1 ;;
    COPY\ *)
      read -r -a words <<<"${line#COPY }"
      dest=${words[${#words[@]}-1]}
      for src in "${words[@]:0:${#words[@]}-1}"; do
        if [[ ! -e $repo/$src ]]; then
          echo "build-stage: the Dockerfile copies $src, which does not exist" >&2
          exit 1
        fi
        if [[ $dest == */ || $dest == ./ ]]; then
          mkdir -p "$stage/$dest"
          cp -a "$repo/$src" "$stage/$dest"
        else
          mkdir -p "$(dirname "$stage/$dest")"
          cp -a "$repo/$src" "$stage/$dest"
        fi
        copies=$((copies + 1))
      done
      ;;
    *"cargo build"*) run=${line#*cargo build} ;;
  esac
done <"$dockerfile"

# What the build context leaves out (deploy/Dockerfile.dockerignore's rooted paths) is not
# there in the image build either.
while IFS= read -r pattern; do
  [[ $pattern == /* ]] && rm -rf "${stage:?}$pattern"
done <"$here/Dockerfile.dockerignore"

if ((copies == 0)) || [[ -z $run ]]; then
  echo "build-stage: could not find the build stage's COPY lines and cargo build in $dockerfile" >&2
  exit 1
fi
# `cargo build --release --locked --bin lazyquota \` as the stage runs it (line continuation
# and what follows `&&` dropped).
run=${run%%\\*}
run=${run%%&&*}
echo "build-stage: copied $copies paths; running cargo build$run" >&2
(cd "$stage" && CARGO_TARGET_DIR="$repo/target" cargo build $run)
echo "$repo/target/$(rustc --print host-tuple)/release/lazyquota"
