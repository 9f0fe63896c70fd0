#!/usr/bin/env bash
# Braid next to the kernel on 127.0.0.1, in one run:
#   * bandwidth: Braid RDMA WRITE of 1 MiB messages (braid-perf client/server, write_bw)
#     vs iperf3 TCP, one stream;
#   * latency:   Braid 8 B RDMA WRITE round trip (write_lat, p50)
#     vs a plain kernel UDP ping-pong of 8 B (udp-pingpong, p50).
# Each figure is the median of $RUNS runs; the ratios Braid/TCP (bandwidth) and Braid/UDP
# (latency) are printed and written, with every raw run, to
# bench/results/loopback-<date>.md (markdown table + JSON) and loopback-<date>.json.
#
# Installs what it needs (iperf3, jq) with apt-get when missing; builds braid-bench in release.
# Settings (environment): RUNS=3 DURATION=3 LAT_ITERS=20000 SIZE=1M PATHS=16 MAX_DGRAM=1472
#   JUMBO=8972 (an extra informational Braid bandwidth row with bigger datagrams; empty: skip)
#   CARGO_TARGET_DIR (default: <workspace>/target), ports BRAID_PORT UDP_PORT IPERF_PORT.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
LAT_ITERS=${LAT_ITERS:-20000}
SIZE=${SIZE:-1M}
PATHS=${PATHS:-16}
MAX_DGRAM=${MAX_DGRAM:-1472}
JUMBO=${JUMBO-8972}
BRAID_PORT=${BRAID_PORT:-18515}
UDP_PORT=${UDP_PORT:-18600}
IPERF_PORT=${IPERF_PORT:-15201}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export CARGO_TARGET_DIR=$TARGET

log() { printf '== %s\n' "$*" >&2; }

# --- tools -------------------------------------------------------------------------------
missing=()
command -v iperf3 >/dev/null || missing+=(iperf3)
command -v jq >/dev/null || missing+=(jq)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

log "building braid-bench (release, target $TARGET)"
(cd "$ROOT" && cargo build --release -q -p braid-bench --bins)
PERF=$TARGET/release/braid-perf
PING=$TARGET/release/udp-pingpong

# --- servers -----------------------------------------------------------------------------
TMP=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

wait_tcp() { # port
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "server on port $1 did not come up" >&2
    return 1
}

"$PERF" server --bind "127.0.0.1:$BRAID_PORT" >"$TMP/braid-server.log" 2>&1 &
pids+=($!)
iperf3 -s -p "$IPERF_PORT" >"$TMP/iperf3-server.log" 2>&1 &
pids+=($!)
"$PING" server --bind "127.0.0.1:$UDP_PORT" >"$TMP/udp-server.log" 2>&1 &
pids+=($!)
wait_tcp "$BRAID_PORT"
wait_tcp "$IPERF_PORT"
# The TCP probes above count as (empty) clients; give the servers a moment to move on.
sleep 0.2

median() { jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'; }

braid_bw=()
braid_bw_jumbo=()
tcp_bw=()
braid_p50=()
braid_p99=()
udp_p50=()
udp_p99=()
raw_braid_bw="$TMP/braid_bw.jsonl"
raw_braid_jumbo="$TMP/braid_jumbo.jsonl"
raw_braid_lat="$TMP/braid_lat.jsonl"
raw_tcp="$TMP/tcp.jsonl"
raw_udp="$TMP/udp.jsonl"
: >"$raw_braid_bw"; : >"$raw_braid_jumbo"; : >"$raw_braid_lat"; : >"$raw_tcp"; : >"$raw_udp"

for i in $(seq "$RUNS"); do
    log "run $i/$RUNS: Braid write_bw $SIZE, $DURATION s, $PATHS paths, $MAX_DGRAM B datagrams"
    "$PERF" client "127.0.0.1:$BRAID_PORT" --test write_bw --size "$SIZE" --duration "$DURATION" \
        --paths "$PATHS" --max-datagram "$MAX_DGRAM" --json --quiet >"$TMP/out.json"
    jq -c '{bw_gbps, msg_rate, iterations, retransmits: ([.paths_client[].retransmits] | add), lost: ([.paths_client[].lost] | add)}' "$TMP/out.json" >>"$raw_braid_bw"
    braid_bw+=("$(jq '.bw_gbps' "$TMP/out.json")")

    if [ -n "$JUMBO" ]; then
        log "run $i/$RUNS: Braid write_bw $SIZE, $JUMBO B datagrams (informational)"
        "$PERF" client "127.0.0.1:$BRAID_PORT" --test write_bw --size "$SIZE" --duration "$DURATION" \
            --paths "$PATHS" --max-datagram "$JUMBO" --json --quiet >"$TMP/out.json"
        jq -c '{bw_gbps, msg_rate, iterations, retransmits: ([.paths_client[].retransmits] | add), lost: ([.paths_client[].lost] | add)}' "$TMP/out.json" >>"$raw_braid_jumbo"
        braid_bw_jumbo+=("$(jq '.bw_gbps' "$TMP/out.json")")
    fi

    log "run $i/$RUNS: iperf3 TCP, one stream, $DURATION s"
    iperf3 -c 127.0.0.1 -p "$IPERF_PORT" -t "$DURATION" -J >"$TMP/iperf.json"
    jq -c '{bw_gbps: (.end.sum_received.bits_per_second / 1e9), retransmits: .end.sum_sent.retransmits}' "$TMP/iperf.json" >>"$raw_tcp"
    tcp_bw+=("$(jq '.end.sum_received.bits_per_second / 1e9' "$TMP/iperf.json")")

    log "run $i/$RUNS: Braid write_lat 8 B x $LAT_ITERS"
    "$PERF" client "127.0.0.1:$BRAID_PORT" --test write_lat --size 8 --iters "$LAT_ITERS" \
        --paths "$PATHS" --max-datagram "$MAX_DGRAM" --json --quiet >"$TMP/out.json"
    jq -c '.lat' "$TMP/out.json" >>"$raw_braid_lat"
    braid_p50+=("$(jq '.lat.p50_us' "$TMP/out.json")")
    braid_p99+=("$(jq '.lat.p99_us' "$TMP/out.json")")

    log "run $i/$RUNS: UDP ping-pong 8 B x $LAT_ITERS"
    "$PING" client "127.0.0.1:$UDP_PORT" --size 8 --iters "$LAT_ITERS" --json >"$TMP/out.json"
    jq -c '.' "$TMP/out.json" >>"$raw_udp"
    udp_p50+=("$(jq '.p50_us' "$TMP/out.json")")
    udp_p99+=("$(jq '.p99_us' "$TMP/out.json")")
done

m_braid_bw=$(printf '%s\n' "${braid_bw[@]}" | median)
m_tcp_bw=$(printf '%s\n' "${tcp_bw[@]}" | median)
m_braid_p50=$(printf '%s\n' "${braid_p50[@]}" | median)
m_braid_p99=$(printf '%s\n' "${braid_p99[@]}" | median)
m_udp_p50=$(printf '%s\n' "${udp_p50[@]}" | median)
m_udp_p99=$(printf '%s\n' "${udp_p99[@]}" | median)
m_jumbo=null
[ -n "$JUMBO" ] && m_jumbo=$(printf '%s\n' "${braid_bw_jumbo[@]}" | median)
bw_ratio=$(jq -n "$m_braid_bw / $m_tcp_bw")
lat_ratio=$(jq -n "$m_braid_p50 / $m_udp_p50")

DATE=$(date +%Y-%m-%d)
OUT_MD=$BENCH/results/loopback-$DATE.md
OUT_JSON=$BENCH/results/loopback-$DATE.json
mkdir -p "$BENCH/results"

jq -n \
    --arg date "$(date -Iseconds)" --arg kernel "$(uname -r)" --arg cpus "$(nproc)" \
    --arg commit "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --arg size "$SIZE" --argjson runs "$RUNS" --argjson duration "$DURATION" --argjson lat_iters "$LAT_ITERS" \
    --argjson paths "$PATHS" --argjson max_datagram "$MAX_DGRAM" --arg jumbo "$JUMBO" \
    --argjson m_braid_bw "$m_braid_bw" --argjson m_tcp_bw "$m_tcp_bw" --argjson m_jumbo "$m_jumbo" \
    --argjson m_braid_p50 "$m_braid_p50" --argjson m_braid_p99 "$m_braid_p99" \
    --argjson m_udp_p50 "$m_udp_p50" --argjson m_udp_p99 "$m_udp_p99" \
    --argjson bw_ratio "$bw_ratio" --argjson lat_ratio "$lat_ratio" \
    --slurpfile braid_bw "$raw_braid_bw" --slurpfile braid_jumbo "$raw_braid_jumbo" --slurpfile tcp "$raw_tcp" \
    --slurpfile braid_lat "$raw_braid_lat" --slurpfile udp "$raw_udp" \
    '{date: $date, kernel: $kernel, cpus: ($cpus | tonumber), commit: $commit,
      settings: {runs: $runs, duration_s: $duration, size: $size, lat_iters: $lat_iters, paths: $paths, max_datagram: $max_datagram, jumbo: $jumbo},
      median: {braid_write_bw_gbps: $m_braid_bw, braid_write_bw_jumbo_gbps: $m_jumbo, tcp_iperf3_gbps: $m_tcp_bw,
               braid_write_lat_p50_us: $m_braid_p50, braid_write_lat_p99_us: $m_braid_p99,
               udp_pingpong_p50_us: $m_udp_p50, udp_pingpong_p99_us: $m_udp_p99},
      ratio: {braid_bw_over_tcp_bw: $bw_ratio, braid_p50_over_udp_p50: $lat_ratio},
      runs: {braid_write_bw: $braid_bw, braid_write_bw_jumbo: $braid_jumbo, tcp_iperf3: $tcp, braid_write_lat: $braid_lat, udp_pingpong: $udp}}' >"$OUT_JSON"

f2() { jq -rn "$1 * 100 | round / 100"; }
rounded() { printf '%s\n' "$@" | jq -s -c 'map(. * 100 | round / 100)'; }
{
    echo "# Braid vs kernel on loopback ($DATE)"
    echo
    echo "Machine: $(nproc) CPUs, Linux $(uname -r); commit $(jq -r .commit "$OUT_JSON"). Medians of $RUNS runs."
    echo "Braid: $PATHS paths, $MAX_DGRAM B datagrams, UDP datapath; bandwidth runs $DURATION s; latency $LAT_ITERS round trips."
    echo
    echo "| metric | Braid | kernel | Braid / kernel |"
    echo "|---|---|---|---|"
    echo "| bandwidth, $SIZE RDMA WRITE vs iperf3 TCP one stream (Gbit/s) | $(f2 "$m_braid_bw") | $(f2 "$m_tcp_bw") | $(jq -rn "$bw_ratio * 1000 | round / 1000") |"
    echo "| latency p50, 8 B WRITE round trip vs UDP ping-pong (µs) | $(f2 "$m_braid_p50") | $(f2 "$m_udp_p50") | $(jq -rn "$lat_ratio * 100 | round / 100") |"
    echo "| latency p99 (µs) | $(f2 "$m_braid_p99") | $(f2 "$m_udp_p99") | $(jq -rn "$m_braid_p99 / $m_udp_p99 * 100 | round / 100") |"
    if [ -n "$JUMBO" ]; then
        echo "| bandwidth, $SIZE WRITE with $JUMBO B datagrams (Gbit/s, informational) | $(f2 "$m_jumbo") | $(f2 "$m_tcp_bw") | $(jq -rn "$m_jumbo / $m_tcp_bw * 1000 | round / 1000") |"
    fi
    echo
    echo "Raw runs (Gbit/s): Braid $(rounded "${braid_bw[@]}"), TCP $(rounded "${tcp_bw[@]}")."
    echo "Raw p50 (µs): Braid $(rounded "${braid_p50[@]}"), UDP $(rounded "${udp_p50[@]}")."
    echo
    echo '```json'
    jq . "$OUT_JSON"
    echo '```'
} >"$OUT_MD"

echo
cat "$OUT_MD" | sed -n '1,/^Raw p50/p'
echo
echo "written: $OUT_MD"
echo "         $OUT_JSON"
