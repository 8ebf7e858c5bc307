#!/usr/bin/env bash
# Builds helm from the published Go module pinned in ./go.mod (helm.sh/helm/v3, used through
# the Go 1.24+ `tool` directive) and caches the binary outside the repository, keyed by the
# pinned version and a hash of the module files:
#
#   ${LAZYQUOTA_CACHE:-~/.cache/lazyquota}/helm/<version>_<hash>/bin/helm
#
# A second run with the same pins only checks that the binary exists and prints its path.
# Prints the path of the helm binary as its last line of stdout; logs go to stderr.
#
# To move to another helm release:
#   cd tests/helm && go get helm.sh/helm/v3@vX.Y.Z && go mod tidy
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { printf 'helm: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# Read the pins from go.mod directly (no `go` invocation) so the cached path stays fast.
mod_version() {
  awk -v mod="$1" '$1 == mod && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == mod { print $3; exit }' \
    "$here/go.mod"
}
HELM_VERSION=$(mod_version helm.sh/helm/v3)
[[ -n "$HELM_VERSION" ]] || die "helm.sh/helm/v3 is not required in $here/go.mod"

sum=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
key="${HELM_VERSION}_${sum}"
cache="${LAZYQUOTA_CACHE:-$HOME/.cache/lazyquota}/helm/$key"
bin="$cache/bin"

if [[ -x "$bin/helm" ]]; then
  say "cached: $bin/helm"
  echo "$bin/helm"
  exit 0
fi

command -v go >/dev/null || die "go is not installed (Go >= 1.26 is required to build helm ${HELM_VERSION})"

mkdir -p "$cache"
staging=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$staging"' EXIT

# Stamp the version the way helm's own Makefile does. Without it `helm version` says v3.NN
# only, and the Kubernetes version helm assumes for `helm template`/`helm lint` (its
# .Capabilities.KubeVersion and deprecation checks) would fall back to v1.20. Helm derives
# that version from the k8s.io/client-go it is built with: v0.N.x -> v1.N.
client_go=$(mod_version k8s.io/client-go)
[[ -n "$client_go" ]] || die "k8s.io/client-go is not listed in $here/go.mod; run go mod tidy"
k8s_minor=${client_go#v0.}
k8s_minor=${k8s_minor%%.*}
ldflags="-s -w"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${k8s_minor}"
done

timed() {
  # GNU time reports the peak resident set size of the build.
  local name=$1; shift
  local start=$SECONDS
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f "helm: $name: %e s wall, %M KiB peak RSS" "$@"
  else
    "$@"
  fi
  say "$name built in $((SECONDS - start)) s"
}

export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off
say "building helm ${HELM_VERSION} (Kubernetes v1.${k8s_minor} client libraries; a cold build takes a few minutes on 2 cores)"
(cd "$here" && timed helm go build -trimpath -ldflags "$ldflags" -o "$staging/helm" helm.sh/helm/v3/cmd/helm)
"$staging/helm" version --short >&2 || die "the built helm does not run"

# Publish atomically so an interrupted build never leaves a half-filled cache entry. If a
# concurrent run published first, keep its binary.
if ! mv -T "$staging" "$bin" 2>/dev/null; then
  [[ -x "$bin/helm" ]] || die "cannot publish $bin"
  say "another build published $bin first; using it"
  rm -rf "$staging"
fi
trap - EXIT
say "built: $bin/helm"
echo "$bin/helm"
