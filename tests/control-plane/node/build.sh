#!/usr/bin/env bash
# Builds what the node flavour adds to the test control plane, from published sources, and
# caches it outside the repository keyed by the pinned versions and a hash of the module files:
#
#   ${LAZYQUOTA_CACHE:-~/.cache/lazyquota}/node/<key>/bin/
#     kubelet, kube-scheduler        k8s.io/kubernetes (same release as the control plane), ./kube
#     containerd, containerd-shim-runc-v2, ctr   github.com/containerd/containerd/v2, ./containerd
#     cni/loopback                   github.com/containernetworking/plugins, ./containerd
#     prometheus                     github.com/prometheus/prometheus, ./prometheus, with only the
#                                    Kubernetes service discovery (Debian's package has none)
#     pause                          build/pause/linux/pause.c of that k8s.io/kubernetes module,
#                                    compiled static with the host's gcc (the sandbox image)
#
# runc is not built: Debian's (the `runc` package, with libseccomp) is used; the script checks
# it is installed. Prints the bin dir as its last line of stdout; logs go to stderr.
# LAZYQUOTA_CACHED_ONLY=1 builds nothing: it prints the bin dir if cached, else exits 3.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../versions.env
source "$here/../versions.env"

say() { printf 'node: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

containerd_version=$(sed -n 's#^\tgithub.com/containerd/containerd/v2 \(v[^ ]*\).*#\1#p' "$here/containerd/go.mod")
sum=$(cat "$here/build.sh" "$here"/kube/go.{mod,sum} "$here"/containerd/go.{mod,sum} "$here"/prometheus/go.{mod,sum} | sha256sum | cut -c1-12)
key="kube-${KUBE_VERSION}_containerd-${containerd_version}_${sum}"
cache="${LAZYQUOTA_CACHE:-$HOME/.cache/lazyquota}/node/$key"
bin="$cache/bin"
all=(kubelet kube-scheduler containerd containerd-shim-runc-v2 ctr cni/loopback prometheus pause)

cached=1
for tool in "${all[@]}"; do [[ -x $bin/$tool ]] || cached=; done
if [[ -n $cached ]]; then
  say "cached: $bin"
  echo "$bin"
  exit 0
fi
if [[ -n ${LAZYQUOTA_CACHED_ONLY:-} ]]; then
  say "not cached: $bin"
  exit 3
fi
command -v go >/dev/null || die "go is not installed (Go >= 1.26 is required)"
command -v gcc >/dev/null || die "gcc is not installed (apt-get install gcc libc6-dev): it compiles the pause binary"

mkdir -p "$cache"
staging=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/cni"

timed() {
  local name=$1; shift
  local start=$SECONDS
  "$@"
  say "$name built in $((SECONDS - start)) s"
}

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=${KUBE_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for tool in kubelet kube-scheduler; do
  say "building $tool ${KUBE_VERSION}"
  (cd "$here/kube" && timed "$tool" go build -trimpath -ldflags "$kube_ldflags" \
    -o "$staging/$tool" "k8s.io/kubernetes/cmd/$tool")
done

# Without cgo and without the snapshotters this node does not use (overlayfs and native stay).
ctrd_tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs no_aufs"
ctrd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=${containerd_version}"
for path in containerd containerd-shim-runc-v2 ctr; do
  say "building $path ${containerd_version}"
  (cd "$here/containerd" && timed "$path" go build -trimpath -tags "$ctrd_tags" -ldflags "$ctrd_ldflags" \
    -o "$staging/$path" "github.com/containerd/containerd/v2/cmd/$path")
done
(cd "$here/containerd" && timed loopback go build -trimpath -ldflags "-s -w" \
  -o "$staging/cni/loopback" github.com/containernetworking/plugins/plugins/main/loopback)

# The web UI's assets are not embedded (no `builtinassets` tag): the test uses the HTTP API.
(cd "$here/prometheus" && timed prometheus go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
  -ldflags "-s -w" -o "$staging/prometheus" github.com/prometheus/prometheus/cmd/prometheus)

kube_src=$(cd "$here/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
gcc -Os -static -Wall -Werror -DVERSION="${KUBE_VERSION}-lazyquota" \
  -o "$staging/pause" "$kube_src/build/pause/linux/pause.c"
say "pause compiled from $kube_src/build/pause/linux/pause.c"

# Publish atomically so an interrupted build never leaves a half-filled cache entry.
rm -rf "$bin"
mv "$staging" "$bin"
trap - EXIT
say "built: $bin"
echo "$bin"
