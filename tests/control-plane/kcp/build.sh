#!/usr/bin/env bash
# Builds kcp's server binary (github.com/kcp-dev/kcp/cmd/kcp, v0.32.3) from the Go module
# proxy with kcp's own replace set (go.mod here: every k8s.io module replaced by the
# kcp-dev/kubernetes fork at kcp's pinned pseudo-version; kcp's local staging replaces mapped to
# their published tags), cached in ~/.cache/lazyquota/kcp/<version>_<go.mod hash>/bin/kcp.
# Prints the binary's path last.
#
# Status (2026-11-30): FAILS here. The proxy refuses github.com/kcp-dev/virtual-workspace-framework
# at every version (403); kcp's pkg/server imports it, and kcp publishes it from its staging
# directory without release tags. See docs/kcp.md. Kept so the attempt is reproducible and
# becomes the build the day the module is served.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=v0.32.3
key=${version}_$(sha256sum "$here/go.mod" | cut -c1-12)
cache=${LAZYQUOTA_KCP_CACHE:-$HOME/.cache/lazyquota/kcp}/$key
if [[ -x $cache/bin/kcp ]]; then
  echo "$cache/bin/kcp"
  exit 0
fi
mkdir -p "$cache/bin"
cd "$here"
# The fork's root module, code-generator and embeddedetcd are not in the checksum database
# (404); go.sum pins their hashes instead.
export CGO_ENABLED=0 GOFLAGS=-mod=mod \
  GONOSUMDB=github.com/kcp-dev/kubernetes,github.com/kcp-dev/code-generator,github.com/kcp-dev/embeddedetcd
if ! go build -p 2 -trimpath -o "$cache/bin/kcp.tmp" github.com/kcp-dev/kcp/cmd/kcp; then
  rm -rf "$cache"
  echo "kcp-build: error: go build github.com/kcp-dev/kcp/cmd/kcp@$version failed (see above)" >&2
  exit 1
fi
mv "$cache/bin/kcp.tmp" "$cache/bin/kcp"
echo "$cache/bin/kcp"
