#!/usr/bin/env bash
# Writes tests/control-plane/kube/matrix/<version>/go.{mod,sum}: the module that builds
# kube-apiserver and kube-controller-manager of that Kubernetes release, for the parity
# matrix (docs/parity.md). k8s.io/kubernetes points its staging modules at ./staging, so each
# is replaced by its published release of the same version (v0.37.2 for v1.37.2), read from
# that release's own go.mod. Needs the Go module proxy; the result is committed, so builds
# are reproducible without running this again.
#
#   bash tests/control-plane/kube/matrix/gen.sh v1.37.2
set -euo pipefail

version=${1:?usage: gen.sh v1.MINOR.PATCH}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "gen.sh: not a release version: $version" >&2; exit 2; }
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out="$here/$version"
mkdir -p "$out"

src=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -f $src ]] || { echo "gen.sh: the module proxy did not serve k8s.io/kubernetes@$version" >&2; exit 1; }

{
  echo "// kube-apiserver and kube-controller-manager $version for the parity matrix; written by ../gen.sh."
  echo "module github.com/lazyquota/lazyquota/tests/control-plane/kube/matrix/$version"
  echo
  echo "go 1.26.0"
  echo
  echo "tool ("
  echo "	k8s.io/kubernetes/cmd/kube-apiserver"
  echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
  echo ")"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$src" | sort -u | while read -r m; do
    echo "	$m => $m $staging"
  done
  echo ")"
} > "$out/go.mod"
(cd "$out" && GOFLAGS=-mod=mod go mod tidy)
echo "$out"
