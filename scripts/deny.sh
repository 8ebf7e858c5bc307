#!/usr/bin/env bash
# Checks licences, bans and sources of every crate with cargo-deny (deny.toml), and RustSec
# advisories when the advisory database can be fetched. Offline, the advisory check is skipped
# with one clear line and the other checks still decide the result.
# Installs cargo-deny (pinned, a debug build) into ~/.cargo/bin on first use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=0.20.2
if ! cargo deny --version 2>/dev/null | grep -q " $version"; then
  echo "==> installing cargo-deny $version" >&2
  # A debug build: it compiles in about a third of a release build's time (a cold CI run
  # installs it), and checking this workspace takes it a few seconds either way.
  cargo install cargo-deny --version "$version" --locked --debug >&2
fi

# Duplicate versions are warnings (see deny.toml); `-L error` keeps CI output to what fails.
cargo deny -L error check licenses bans sources
if timeout 60 cargo deny fetch db >/dev/null 2>&1; then
  cargo deny -L error check advisories
else
  echo "cargo-deny: advisories skipped: the RustSec advisory database could not be fetched (offline?)" >&2
fi
