#!/usr/bin/env bash
# Braid's test command: the one README.md gives and .ci/run runs.
# It installs what the tests need (iproute2 for the network-namespace tests, when running as
# root), then runs the whole workspace's tests: unit tests, the integration test binary
# (simulated network, loopback UDP in one process and across two processes, network
# namespaces with veth and a 4-path ECMP testbed), property tests and doctests.
#
# The namespace, BPF and AF_XDP tests need root. Without it they print "SKIPPED ..." loudly;
# under CI (CI set) they fail instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install the Rust toolchain (https://rustup.rs)" >&2
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  ./scripts/netns.sh deps
fi

echo "== cargo test --workspace"
cargo test --workspace --locked "$@"
