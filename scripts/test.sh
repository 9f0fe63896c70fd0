#!/usr/bin/env bash
# Braid's test command: the one README.md gives and .ci/run runs.
# It installs what the tests need (nothing beyond the Rust toolchain so far), then runs the
# whole workspace's tests: unit tests, the integration test binary (simulated network,
# loopback UDP in one process and across two processes), property tests and doctests.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install the Rust toolchain (https://rustup.rs)" >&2
  exit 1
fi

echo "== cargo test --workspace"
cargo test --workspace --locked "$@"
