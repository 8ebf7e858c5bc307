#!/usr/bin/env bash
# Usage: build.sh [kcp|cache-server|kcp-front-proxy|quota-e2e]
#
#   kcp (default)  kcp's server binary (cmd/kcp, v0.32.3); the same `go build` also links
#                  cache-server and kcp-front-proxy, which a sharded kcp needs (start-sharded.sh)
#   cache-server, kcp-front-proxy
#                  those two binaries (built with kcp when missing)
#   quota-e2e      kcp's own e2e quota tests (test/e2e/quota, `go test -c`): run against a
#                  shard with `--kcp-kubeconfig`, and KCP_REPO_DIR set to any directory (the
#                  framework looks for kcp's tree at start; with -trimpath it has none)
#
# Builds it from kcp's own source tree, with kcp's own go.mod:
# its staging modules (apimachinery, client-go, code-generator, sdk, virtual-workspace-framework)
# come from the tree, everything else from the Go module proxy. The Go module proxy does not
# serve github.com/kcp-dev/virtual-workspace-framework at any version, so building from module
# paths alone is impossible; a source tree is needed.
#
# Source, first that exists:
#   $LAZYQUOTA_KCP_SRC          a kcp v0.32.3 checkout (git clone --branch v0.32.3 ...kcp-dev/kcp)
#   $LAZYQUOTA_KCP_TARBALL      a `git archive` tarball of that tag (sha256 checked)
#   ../shared/vendor/kcp/kcp-v0.32.3.tar.gz beside this repository's clone (sha256 checked)
#
# Cached in ${LAZYQUOTA_CACHE:-~/.cache/lazyquota}/kcp/<version>_<hash of source and flags>/bin/
# (kcp, cache-server, kcp-front-proxy, quota-e2e.test); a second run only checks that the binary
# exists. Prints the binary's path as the last line of stdout. Cold: ~5 min and ~2.3 GB peak RSS
# on 2 cores for kcp, module downloads included; the e2e tests then reuse most of its compiled
# packages (Go's build cache).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
version=v0.32.3
commit=08be0a1c8de29f5ec6fc27d3563288be970bd3b4
sha256=4e5e18ff0a557723c58fddee01d507b453fdeec43d8c8693fcc14632ed880557
# kcp's Makefile stamps the version of the Kubernetes fork it builds on ("v1.36.0+kcp-<tag>");
# without it /version reports a placeholder and clients cannot tell which kcp they talk to.
kube_version=v1.36.0

say() { printf 'kcp-build: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

target=${1:-kcp}
case $target in
  kcp | cache-server | kcp-front-proxy) binary=$target ;;
  quota-e2e) binary=quota-e2e.test ;;
  *) die "unknown target $target (kcp, cache-server, kcp-front-proxy or quota-e2e)" ;;
esac

command -v go >/dev/null || die "go is not installed (Go >= 1.26 is required to build kcp)"

ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitCommit=${commit:0:9} -X $pkg.gitTreeState=clean"
  ldflags+=" -X $pkg.gitVersion=${kube_version}+kcp-${version} -X $pkg.gitMajor=1"
  ldflags+=" -X $pkg.gitMinor=$(cut -d. -f2 <<<"$kube_version") -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# The key: what goes into the binary (the source's sha256, the flags), not this script's text.
key=${version}_$(printf '%s\n' "$sha256" "$ldflags" "CGO_ENABLED=0" | sha256sum | cut -c1-12)
cache=${LAZYQUOTA_CACHE:-$HOME/.cache/lazyquota}/kcp/$key
if [[ -x $cache/bin/$binary ]]; then
  say "cached: $cache/bin/$binary"
  echo "$cache/bin/$binary"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [[ -n ${LAZYQUOTA_KCP_SRC:-} ]]; then
  [[ -f $LAZYQUOTA_KCP_SRC/go.mod && -d $LAZYQUOTA_KCP_SRC/cmd/kcp ]] ||
    die "LAZYQUOTA_KCP_SRC=$LAZYQUOTA_KCP_SRC is not a kcp checkout (no go.mod or cmd/kcp)"
  src=$(cd "$LAZYQUOTA_KCP_SRC" && pwd)
  say "source: checkout $src"
else
  tarball=${LAZYQUOTA_KCP_TARBALL:-$repo/../shared/vendor/kcp/kcp-$version.tar.gz}
  [[ -f $tarball ]] || die "no kcp source: set LAZYQUOTA_KCP_SRC to a kcp $version checkout, \
or LAZYQUOTA_KCP_TARBALL to its tarball (looked for $tarball)"
  got=$(sha256sum "$tarball" | cut -d' ' -f1)
  [[ $got == "$sha256" ]] || die "$tarball: sha256 $got, expected $sha256 (kcp $version)"
  say "source: $tarball (sha256 ok)"
  tar -xzf "$tarball" -C "$work"
  src=$work/kcp-$version
fi


start=$SECONDS
# The fork's root module, code-generator and embeddedetcd are not in the checksum database;
# kcp's go.sum pins their hashes.
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local \
  GONOSUMDB=github.com/kcp-dev/kubernetes,github.com/kcp-dev/code-generator,github.com/kcp-dev/embeddedetcd
servers=(kcp cache-server kcp-front-proxy)
case $target in
  kcp | cache-server | kcp-front-proxy)
    say "building kcp $version: ${servers[*]} (cold: ~5 min and ~2.3 GB peak RSS on 2 cores)"
    # One build: the three share almost every package, and `go build -o <dir>/` links each.
    mkdir -p "$work/out"
    build=(go build -trimpath -ldflags "$ldflags" -o "$work/out/" "${servers[@]/#/./cmd/}") ;;
  quota-e2e)
    say "building kcp $version's e2e quota tests"
    build=(go test -c -trimpath -vet=off -o "$work/$binary" ./test/e2e/quota) ;;
esac
if [[ -x /usr/bin/time ]]; then
  build=(/usr/bin/time -f "kcp-build: %e s wall, %M KiB peak RSS" "${build[@]}")
fi
(cd "$src" && "${build[@]}") || die "${build[*]} (kcp $version) failed (see above)"
say "built $binary in $((SECONDS - start)) s"

mkdir -p "$cache/bin"
if [[ $target == quota-e2e ]]; then
  mv "$work/$binary" "$cache/bin/$binary"
else
  # kcp last: its presence is what a later call of the kcp target checks.
  for server in cache-server kcp-front-proxy kcp; do mv "$work/out/$server" "$cache/bin/$server"; done
fi
echo "$cache/bin/$binary"
