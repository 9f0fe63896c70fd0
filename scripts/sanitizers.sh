#!/usr/bin/env bash
# Runs Braid's unsafe code under Miri and the test suite under AddressSanitizer.
#
#   scripts/sanitizers.sh miri   # Miri: the code Miri can run (no sockets or io_uring there)
#   scripts/sanitizers.sh asan   # AddressSanitizer: the workspace's tests (as root also the
#                                # namespace, BPF and AF_XDP ones)
#   scripts/sanitizers.sh        # both
#
# Both need the nightly toolchain; the components they use (miri, rust-src) are installed
# here if missing. Neither is part of ./scripts/test.sh: they take tens of minutes on 2 cores.
# Builds go to target/miri and target/asan so they do not disturb the normal build cache.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
target_dir=${CARGO_TARGET_DIR:-target}
host=$(rustc -vV | sed -n 's/^host: //p')

ensure_nightly() {
  if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
  fi
  local have
  have=$(rustup +nightly component list --installed)
  for c in "$@"; do
    grep -q "^$c" <<<"$have" || rustup component add "$c" --toolchain nightly
  done
}

run_miri() {
  ensure_nightly miri rust-src
  echo "== Miri (strict provenance, data-race and weak-memory checking)"
  # Isolation off: proptest looks up the working directory for its failure files.
  export MIRIFLAGS="-Zmiri-strict-provenance -Zmiri-disable-isolation ${MIRIFLAGS:-}"
  export PROPTEST_CASES=${PROPTEST_CASES:-8}
  local miri=(cargo +nightly miri test --locked)
  export CARGO_TARGET_DIR="$target_dir/miri"
  # Memory regions: Region::from_raw (raw registration of application memory, as the C API
  # does) and the word-wise accesses at every alignment. The rest of the engine is safe code.
  "${miri[@]}" -p braid-proto --lib -- mem::
  # AF_XDP ring protocol against a simulated kernel thread over anonymous memory, UMEM
  # frame slicing, frame building/parsing. Sockets, bpf() and io_uring are out of Miri's
  # reach; those run under AddressSanitizer below.
  "${miri[@]}" -p braid-datapath --lib -- xdp::ring xdp::umem xdp::frame
  if cargo metadata --no-deps --format-version 1 | grep -q '"name":"braid-sync"'; then
    # The runtime's rings, doorbells and buffer pool (loom checks their orderings; Miri
    # checks the unsafe cell accesses on real threads).
    "${miri[@]}" -p braid-sync
  fi
}

run_asan() {
  ensure_nightly rust-src
  echo "== AddressSanitizer: cargo test --workspace"
  if [[ $(id -u) -eq 0 ]]; then
    ./scripts/netns.sh deps
  fi
  # Sanitized std (build-std) so that std's own allocations and unsafe code are checked too.
  RUSTFLAGS="-Zsanitizer=address ${RUSTFLAGS:-}" \
    RUSTDOCFLAGS="-Zsanitizer=address" \
    ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:${ASAN_OPTIONS:-}" \
    CARGO_TARGET_DIR="$target_dir/asan" \
    cargo +nightly test --locked -Zbuild-std --target "$host" --workspace --lib --bins --tests
}

case "$what" in
  miri) run_miri ;;
  asan) run_asan ;;
  all) run_miri; run_asan ;;
  *) echo "usage: $0 [miri|asan|all]" >&2; exit 2 ;;
esac
echo "== sanitizers: $what passed"
