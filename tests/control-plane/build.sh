#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, and kubectl
# for scripts and the demo) from the
# published Go modules pinned in ./etcd/go.mod and ./kube/go.mod, and caches the binaries
# outside the repository, keyed by the pinned versions and a hash of the module files:
#
#   ${LAZYQUOTA_CACHE:-~/.cache/lazyquota}/control-plane/<key>/bin/{etcd,kube-apiserver,kube-controller-manager,kubectl}
#
# A second run with the same pins only checks that the binaries exist and prints the bin dir.
# Prints that directory as its last line of stdout; logs go to stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

say() { printf 'control-plane: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

command -v go >/dev/null || die "go is not installed (Go >= 1.26 is required to build the control plane)"

sum=$(cat "$here"/versions.env "$here"/kube/go.mod "$here"/kube/go.sum "$here"/etcd/go.mod "$here"/etcd/go.sum \
  | sha256sum | cut -c1-12)
key="kube-${KUBE_VERSION}_etcd-${ETCD_VERSION}_${sum}"
cache="${LAZYQUOTA_CACHE:-$HOME/.cache/lazyquota}/control-plane/$key"
bin="$cache/bin"

if [[ -x "$bin/etcd" && -x "$bin/kube-apiserver" && -x "$bin/kube-controller-manager" && -x "$bin/kubectl" ]]; then
  say "cached: $bin"
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
staging=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$staging"' EXIT

# The version stamped into the binaries matters: kube-apiserver derives its emulation and
# compatibility versions from it, and KCM reports it. Without it they would say v0.0.0-master.
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=${KUBE_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

timed() {
  # GNU time reports the peak resident set size of the build, which the README quotes.
  local name=$1; shift
  local start=$SECONDS
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f "control-plane: $name: %e s wall, %M KiB peak RSS" "$@"
  else
    "$@"
  fi
  say "$name built in $((SECONDS - start)) s"
}

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
say "building etcd ${ETCD_VERSION} (cold builds take several minutes on 2 cores)"
(cd "$here/etcd" && timed etcd go build -trimpath -ldflags "-s -w" -o "$staging/etcd" go.etcd.io/etcd/server/v3)
say "building kube-apiserver and kube-controller-manager ${KUBE_VERSION}"
(cd "$here/kube" && timed kube-apiserver go build -trimpath -ldflags "$kube_ldflags" \
  -o "$staging/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
(cd "$here/kube" && timed kube-controller-manager go build -trimpath -ldflags "$kube_ldflags" \
  -o "$staging/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager)
(cd "$here/kube" && timed kubectl go build -trimpath -ldflags "$kube_ldflags" \
  -o "$staging/kubectl" k8s.io/kubernetes/cmd/kubectl)

# Publish atomically so an interrupted build never leaves a half-filled cache entry.
rm -rf "$bin"
mv "$staging" "$bin"
trap - EXIT
say "built: $bin"
echo "$bin"
