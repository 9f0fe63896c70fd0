#!/usr/bin/env bash
# The cost of per-connection encryption (braid-perf --encrypt: AES-256-GCM, keys agreed with
# X25519 at connect), plain and encrypted side by side in one run on 127.0.0.1:
#   * bandwidth: RDMA WRITE of 1 MiB messages (braid-perf client/server, write_bw);
#   * latency:   8 B RDMA WRITE round trip (write_lat, p50 and p99);
#   * engine:    the criterion engine bench's cost per packet (1408 B and 4 KiB payload) and
#                per 8 B message, plain and sealed (no datapath: the crypto and engine alone).
# Plain and encrypted runs alternate (the order flips every run) so drift on a shared machine
# hits both alike. Each figure is the median of $RUNS runs; the encrypted/plain ratios are
# printed and written, with every raw run, to bench/results/encryption-<date>.md and .json.
#
# Needs jq. Settings (environment): RUNS=3 DURATION=3 LAT_ITERS=20000 SIZE=1M PATHS=16
#   MAX_DGRAM=1472 ENGINE=1 (0: skip the criterion bench) CARGO_TARGET_DIR BRAID_PORT.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
LAT_ITERS=${LAT_ITERS:-20000}
SIZE=${SIZE:-1M}
PATHS=${PATHS:-16}
MAX_DGRAM=${MAX_DGRAM:-1472}
ENGINE=${ENGINE:-1}
BRAID_PORT=${BRAID_PORT:-18517}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export CARGO_TARGET_DIR=$TARGET

log() { printf '== %s\n' "$*" >&2; }
command -v jq >/dev/null || { echo "needs jq (apt-get install jq)" >&2; exit 1; }

log "building braid-bench (release, target $TARGET)"
(cd "$ROOT" && cargo build --release -q -p braid-bench --bins)
PERF=$TARGET/release/braid-perf

TMP=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

# The server follows each client's choice (plain or encrypted).
"$PERF" server --bind "127.0.0.1:$BRAID_PORT" >"$TMP/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$BRAID_PORT") 2>/dev/null; then break; fi
    sleep 0.05
done
sleep 0.2

median() { jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'; }

declare -A bw p50 p99
for mode in plain enc; do bw[$mode]=""; p50[$mode]=""; p99[$mode]=""; done
raw="$TMP/raw.jsonl"
: >"$raw"

run_mode() { # run mode
    local i=$1 mode=$2 flag=""
    [ "$mode" = enc ] && flag="--encrypt"
    log "run $i/$RUNS $mode: write_bw $SIZE, $DURATION s"
    "$PERF" client "127.0.0.1:$BRAID_PORT" --test write_bw --size "$SIZE" --duration "$DURATION" \
        --paths "$PATHS" --max-datagram "$MAX_DGRAM" $flag --json --quiet >"$TMP/out.json"
    jq -c --arg mode "$mode" --argjson run "$i" '{run: $run, mode: $mode, test: "write_bw", encrypted, bw_gbps, msg_rate, iterations, retransmits: ([.paths_client[].retransmits] | add)}' "$TMP/out.json" >>"$raw"
    bw[$mode]+="$(jq '.bw_gbps' "$TMP/out.json") "
    log "run $i/$RUNS $mode: write_lat 8 B x $LAT_ITERS"
    "$PERF" client "127.0.0.1:$BRAID_PORT" --test write_lat --size 8 --iters "$LAT_ITERS" \
        --paths "$PATHS" --max-datagram "$MAX_DGRAM" $flag --json --quiet >"$TMP/out.json"
    jq -c --arg mode "$mode" --argjson run "$i" '{run: $run, mode: $mode, test: "write_lat", encrypted, lat}' "$TMP/out.json" >>"$raw"
    p50[$mode]+="$(jq '.lat.p50_us' "$TMP/out.json") "
    p99[$mode]+="$(jq '.lat.p99_us' "$TMP/out.json") "
}

for i in $(seq "$RUNS"); do
    if ((i % 2)); then run_mode "$i" plain; run_mode "$i" enc; else run_mode "$i" enc; run_mode "$i" plain; fi
done

med() { printf '%s\n' $1 | median; }
m_bw_plain=$(med "${bw[plain]}"); m_bw_enc=$(med "${bw[enc]}")
m_p50_plain=$(med "${p50[plain]}"); m_p50_enc=$(med "${p50[enc]}")
m_p99_plain=$(med "${p99[plain]}"); m_p99_enc=$(med "${p99[enc]}")

engine_json=null
if [ "$ENGINE" = 1 ]; then
    log "criterion engine bench (plain and sealed variants)"
    (cd "$ROOT" && cargo bench -q -p braid-bench --bench engine) >"$TMP/criterion.log" 2>&1
    est() { # benchmark name, divisor -> median ns per packet
        jq --argjson d "$2" '.median.point_estimate / $d' \
            "$TARGET/criterion/engine_write/$1/new/estimates.json"
    }
    engine_json=$(jq -n \
        --argjson p1408 "$(est 1408B_payload_x256_per_packet 256)" \
        --argjson s1408 "$(est 1408B_payload_sealed_x256_per_packet 256)" \
        --argjson p4k "$(est 4KiB_payload_x256_per_packet 256)" \
        --argjson s4k "$(est 4KiB_payload_sealed_x256_per_packet 256)" \
        --argjson p8 "$(est 8B_single_packet_message 1)" \
        --argjson s8 "$(est 8B_single_packet_message_sealed 1)" \
        '{ns_per_packet_1408B: {plain: $p1408, sealed: $s1408, ratio: ($s1408 / $p1408)},
          ns_per_packet_4KiB: {plain: $p4k, sealed: $s4k, ratio: ($s4k / $p4k)},
          ns_per_8B_message: {plain: $p8, sealed: $s8, ratio: ($s8 / $p8)}}')
fi

DATE=$(date +%Y-%m-%d)
OUT_MD=$BENCH/results/encryption-$DATE.md
OUT_JSON=$BENCH/results/encryption-$DATE.json
mkdir -p "$BENCH/results"
jq -n \
    --arg date "$(date -Iseconds)" --arg kernel "$(uname -r)" --arg cpus "$(nproc)" \
    --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" \
    --arg commit "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --arg size "$SIZE" --argjson runs "$RUNS" --argjson duration "$DURATION" --argjson lat_iters "$LAT_ITERS" \
    --argjson paths "$PATHS" --argjson max_datagram "$MAX_DGRAM" \
    --argjson bwp "$m_bw_plain" --argjson bwe "$m_bw_enc" \
    --argjson p50p "$m_p50_plain" --argjson p50e "$m_p50_enc" \
    --argjson p99p "$m_p99_plain" --argjson p99e "$m_p99_enc" \
    --argjson engine "$engine_json" --slurpfile runs_raw "$raw" \
    '{date: $date, kernel: $kernel, cpus: ($cpus | tonumber), load_average_at_end: $load, commit: $commit,
      settings: {runs: $runs, duration_s: $duration, size: $size, lat_iters: $lat_iters, paths: $paths, max_datagram: $max_datagram},
      median: {write_bw_gbps: {plain: $bwp, encrypted: $bwe}, write_lat_p50_us: {plain: $p50p, encrypted: $p50e},
               write_lat_p99_us: {plain: $p99p, encrypted: $p99e}},
      ratio_encrypted_over_plain: {write_bw: ($bwe / $bwp), write_lat_p50: ($p50e / $p50p), write_lat_p99: ($p99e / $p99p)},
      engine: $engine, runs: $runs_raw}' >"$OUT_JSON"

r2() { jq -rn "$1 * 100 | round / 100"; }
r3() { jq -rn "$1 * 1000 | round / 1000"; }
{
    echo "# The cost of encryption (generated $DATE)"
    echo
    echo "Machine: $(nproc) CPUs, Linux $(uname -r), load average at the end $(cut -d' ' -f1-3 /proc/loadavg); commit $(jq -r .commit "$OUT_JSON")."
    echo "braid-perf client/server on 127.0.0.1, UDP datapath, $PATHS paths, $MAX_DGRAM B datagrams; medians of $RUNS runs, plain and encrypted alternating."
    echo
    echo "| metric | plain | encrypted | encrypted / plain |"
    echo "|---|---|---|---|"
    echo "| $SIZE RDMA WRITE bandwidth (Gbit/s) | $(r2 "$m_bw_plain") | $(r2 "$m_bw_enc") | $(r3 "$m_bw_enc / $m_bw_plain") |"
    echo "| 8 B WRITE round trip p50 (µs) | $(r2 "$m_p50_plain") | $(r2 "$m_p50_enc") | $(r3 "$m_p50_enc / $m_p50_plain") |"
    echo "| 8 B WRITE round trip p99 (µs) | $(r2 "$m_p99_plain") | $(r2 "$m_p99_enc") | $(r3 "$m_p99_enc / $m_p99_plain") |"
    if [ "$engine_json" != null ]; then
        for k in ns_per_packet_1408B ns_per_packet_4KiB ns_per_8B_message; do
            echo "| engine bench, $k (ns) | $(r2 "$(jq ".$k.plain" <<<"$engine_json")") | $(r2 "$(jq ".$k.sealed" <<<"$engine_json")") | $(r3 "$(jq ".$k.ratio" <<<"$engine_json")") |"
        done
    fi
    echo
    echo "Raw runs, Gbit/s: plain [${bw[plain]% }], encrypted [${bw[enc]% }]; p50 µs: plain [${p50[plain]% }], encrypted [${p50[enc]% }]."
    echo
    echo '```json'
    jq . "$OUT_JSON"
    echo '```'
} >"$OUT_MD"

sed -n '1,/^Raw runs/p' "$OUT_MD"
echo
echo "written: $OUT_MD"
echo "         $OUT_JSON"
