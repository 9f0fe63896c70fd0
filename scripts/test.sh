#!/usr/bin/env bash
# Braid's test command: the one README.md gives and .ci/run runs.
# It installs what the tests need (iproute2 for the network-namespace tests, when running as
# root), then runs the whole workspace's tests: unit tests, the integration test binary
# (simulated network, loopback UDP in one process and across two processes, network
# namespaces with veth and a 4-path ECMP testbed, real kernel verbs on Soft-RoCE in a QEMU
# guest), property tests and doctests; then the loom
# model checks of the concurrent structures in braid-sync.
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
  # libfabric-dev and libfabric-bin for the provider's tests (fi_info, fi_pingpong).
  ./scripts/libfabric.sh deps
  # qemu-system-x86, kmod and cpio for the QEMU guest with Soft-RoCE (tests/netns/tests/guest.rs
  # boots it through scripts/guest/run.sh; the image is built and cached under target/guest).
  ./scripts/guest/build-image.sh deps
  # The backend conformance suite built for the verbs backend, which the guest test
  # (guest_verbs_conformance) runs over rxe0/rxe1 inside the guest. Copied aside: the
  # workspace build below makes the software-only binary of the same name.
  echo "== cargo build -p braid-tests --features verbs --bin braid-conformance"
  cargo build --locked -p braid-tests --features verbs --bin braid-conformance
  target_dir="${CARGO_TARGET_DIR:-target}"
  mkdir -p "$target_dir/guest"
  cp "$target_dir/debug/braid-conformance" "$target_dir/guest/braid-conformance-verbs"
  BRAID_GUEST_TEST_EXE="$(realpath "$target_dir/guest/braid-conformance-verbs")"
  export BRAID_GUEST_TEST_EXE
fi

echo "== cargo test --workspace"
cargo test --workspace --locked "$@"

# The loopback suite again with every device split into two engine shards (BRAID_SHARDS=2,
# see DeviceConfig::shards): the test binary built above (same workspace features, so no
# rebuild), with each device's QPs on a shard other than its first. A few seconds.
echo "== loopback suite with BRAID_SHARDS=2"
BRAID_SHARDS=2 cargo test --workspace --locked "$@" --test all -- loopback::

# Loom model checks of braid-sync's rings, doorbells and pool (transport/sync/tests/loom.rs),
# in release (loom explores thousands of schedules per test) and in their own target dir, so
# that the --cfg loom flag does not invalidate the main build cache. Each test prints how many
# schedules it explored.
echo "== loom: cargo test --release -p braid-sync --test loom (RUSTFLAGS=--cfg loom)"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" RUSTFLAGS="--cfg loom" \
  cargo test --release --locked -p braid-sync --test loom -- --nocapture
