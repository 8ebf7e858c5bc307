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
#
# LAZYQUOTA_KUBE_VERSION=v1.MINOR.PATCH builds another Kubernetes release for the parity
# matrix instead: kube-apiserver and kube-controller-manager from ./kube/matrix/<version>
# (written by ./kube/matrix/gen.sh), cached under their own key; that bin dir links etcd and
# kubectl of the pinned build, which is built first if needed.
# LAZYQUOTA_CACHED_ONLY=1 builds nothing: it prints the bin dir if cached, else exits 3.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

say() { printf 'control-plane: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

version=${LAZYQUOTA_KUBE_VERSION:-$KUBE_VERSION}
if [[ $version == "$KUBE_VERSION" ]]; then
  kube_dir="$here/kube"
  module_files=("$here"/versions.env "$here"/kube/go.mod "$here"/kube/go.sum "$here"/etcd/go.mod "$here"/etcd/go.sum)
  own=(etcd kube-apiserver kube-controller-manager kubectl)
else
  kube_dir="$here/kube/matrix/$version"
  [[ -f $kube_dir/go.mod ]] || die "no module for $version in $kube_dir (write it with: bash tests/control-plane/kube/matrix/gen.sh $version)"
  module_files=("$kube_dir"/go.mod "$kube_dir"/go.sum)
  own=(kube-apiserver kube-controller-manager)
fi

sum=$(cat "${module_files[@]}" | sha256sum | cut -c1-12)
key="kube-${version}_etcd-${ETCD_VERSION}_${sum}"
cache="${LAZYQUOTA_CACHE:-$HOME/.cache/lazyquota}/control-plane/$key"
bin="$cache/bin"

if [[ -x "$bin/etcd" && -x "$bin/kube-apiserver" && -x "$bin/kube-controller-manager" && -x "$bin/kubectl" ]]; then
  say "cached: $bin"
  echo "$bin"
  exit 0
fi
if [[ -n ${LAZYQUOTA_CACHED_ONLY:-} ]]; then
  say "not cached: Kubernetes $version ($bin)"
  exit 3
fi

command -v go >/dev/null || die "go is not installed (Go >= 1.26 is required to build the control plane)"

pinned_bin=
if [[ $version != "$KUBE_VERSION" ]]; then
  pinned_bin=$(LAZYQUOTA_KUBE_VERSION= bash "$here/build.sh" | tail -n 1)
fi

mkdir -p "$cache"
staging=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$staging"' EXIT

# The version stamped into the binaries matters: kube-apiserver derives its emulation and
# compatibility versions from it, and KCM reports it. Without it they would say v0.0.0-master.
minor=${version#v1.}
minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=${version} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
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
for tool in "${own[@]}"; do
  if [[ $tool == etcd ]]; then
    say "building etcd ${ETCD_VERSION} (cold builds take several minutes on 2 cores)"
    (cd "$here/etcd" && timed etcd go build -trimpath -ldflags "-s -w" -o "$staging/etcd" go.etcd.io/etcd/server/v3)
    continue
  fi
  say "building $tool ${version}"
  (cd "$kube_dir" && timed "$tool" go build -trimpath -ldflags "$kube_ldflags" \
    -o "$staging/$tool" "k8s.io/kubernetes/cmd/$tool")
done
if [[ -n $pinned_bin ]]; then
  # etcd and kubectl are version-independent here: the pinned ones serve every matrix version.
  ln -s "$pinned_bin/etcd" "$staging/etcd"
  ln -s "$pinned_bin/kubectl" "$staging/kubectl"
fi

# Publish atomically so an interrupted build never leaves a half-filled cache entry.
rm -rf "$bin"
mv "$staging" "$bin"
trap - EXIT
say "built: $bin"
echo "$bin"
