#!/usr/bin/env bash
# Prices the socket features Braid's UDP datapath uses on a round trip: runs
# socket-pingpong (bench/tools/socket-pingpong.c) with each feature set in turn, ROUNDS
# times alternately, server pinned to CPU 0 in namespace NSB and client to CPU 1 in NSA,
# and prints each set's median p50.
#   ROUNDS=10 NSA=lt-a NSB=lt-b IPB=10.9.0.2 bench/tools/socket-pingpong.sh "" "mm" "mm s64" ...
# (scripts/netns.sh veth up lt 1500 makes the namespaces; run as root.)
set -euo pipefail
ROUNDS=${ROUNDS:-10}
NSA=${NSA:-lt-a}
NSB=${NSB:-lt-b}
IPB=${IPB:-10.9.0.2}
BIN=${BIN:-${TMPDIR:-/tmp}/socket-pingpong}
gcc -O2 -o "$BIN" "$(dirname "$0")/socket-pingpong.c"
[ $# -gt 0 ] || set -- "" "mm" "mm s64" "ts" "tos" "gro" "mm s64 ts tos gro"
OUT=$(mktemp)
for r in $(seq "$ROUNDS"); do
    i=0
    for set in "$@"; do
        i=$((i + 1))
        port=$((7400 + i))
        # shellcheck disable=SC2086
        ip netns exec "$NSB" taskset -c 0 "$BIN" server "$IPB" "$port" $set &
        srv=$!
        sleep 0.2
        # shellcheck disable=SC2086
        echo "$r [$set] $(ip netns exec "$NSA" taskset -c 1 "$BIN" client "$IPB" "$port" $set)" | tee -a "$OUT"
        kill "$srv"
        wait "$srv" 2>/dev/null || true
    done
done
python3 - "$OUT" <<'PY'
import collections, re, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r'\d+ \[(.*?)\] p50 ([\d.]+)', line)
    if m:
        runs[m.group(1)].append(float(m.group(2)))
for k, v in runs.items():
    print(f'{k or "(plain)":22s} p50 median {statistics.median(v):.2f} us over {len(v)} runs')
PY
rm -f "$OUT"
