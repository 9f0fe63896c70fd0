#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz on the nightly toolchain) for a bounded time, one
# after another, and prints the executions of each at the end.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]    (default: 60 s, every target)
#
# The targets are safe Rust whose memory accesses are bounds-checked, so they run without a
# sanitizer by default (several times faster); SANITIZER=address brings AddressSanitizer back.
#
# Each target starts from its checked-in corpus fuzz/corpus/<target>/ (read only) and keeps
# what it discovers in fuzz/work/<target>/ (git-ignored), so runs build on each other. With
# MERGE=1, inputs that add coverage are merged into the checked-in corpus afterwards (libFuzzer
# -merge=1); keep the corpus small (under 2 MB, files under 64 KiB). A crash or timeout leaves
# its input in fuzz/artifacts/<target>/ (git-ignored), which the stable replay test
# (tests/tests/all/fuzz_corpus.rs) then runs too; the script goes on with the next target and
# exits non-zero at the end. Once fixed, copy the input into fuzz/corpus/<target>/ as
# regression-<what it caught>.
#
# The same checks run on stable in `cargo test -p braid-tests --test all fuzz_corpus`: the
# targets' bodies live in tests/src/fuzz_checks.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
shift || true
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  targets=(packet engine_datagrams sim_ops ack_sack)
fi
if ! [[ $secs =~ ^[0-9]+$ ]] || [[ $secs -eq 0 ]]; then
  echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "error: cargo-fuzz needs a nightly toolchain (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz
fi

cd fuzz
mkdir -p logs
declare -A execs result
failed=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "work/$t" "artifacts/$t"
  log="logs/$t.log"
  echo "== fuzzing $t for ${secs}s (log: fuzz/$log)"
  if cargo +nightly fuzz run -s "${SANITIZER:-none}" "$t" "work/$t" "corpus/$t" -- \
      -max_total_time="$secs" -timeout=20 -print_final_stats=1 >"$log" 2>&1; then
    result[$t]=ok
  else
    result[$t]="FAILED (see fuzz/$log and fuzz/artifacts/$t/)"
    failed=1
    tail -n 30 "$log" >&2
  fi
  execs[$t]=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1 || true)
  if [[ ${MERGE:-0} == 1 ]]; then
    echo "== merging new coverage of $t into fuzz/corpus/$t"
    cargo +nightly fuzz run -s "${SANITIZER:-none}" "$t" "corpus/$t" "work/$t" -- -merge=1 \
      >>"$log" 2>&1 || true
  fi
done

echo
printf '%-18s %12s %8s  %s\n' target executions seconds result
for t in "${targets[@]}"; do
  printf '%-18s %12s %8s  %s\n' "$t" "${execs[$t]:-?}" "$secs" "${result[$t]}"
done
exit "$failed"
