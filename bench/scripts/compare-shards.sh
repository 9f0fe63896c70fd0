#!/usr/bin/env bash
# Engine shards and several QPs (DeviceConfig::shards, braid-perf --shards / --qps), side by
# side in one run, alternating:
#   * veth (two namespaces, MTU 1500, UDP sockets, 16 paths, 1472 B datagrams, bursts of 44
#     and one message slot, as compare-veth.sh): braid-perf write_bw of 1 MiB messages with
#       - 1 QP on 1 shard (compare-veth.sh's row),
#       - QPS QPs on 1 shard (one engine, one progress thread),
#       - QPS QPs on QPS shards (an engine, lock and progress thread each),
#     next to iperf3 TCP with one stream and with QPS streams (-P), the same number of
#     connections; then write_lat 8 B on 1 and on 2 shards (the QP on a shard of its own);
#   * loopback: shard-bw, QPS QP pairs between two devices in one process, each QP with its
#     own posting thread and CQ, with --shards 1, then QPS.
# Prints one line per measurement, then the medians and their ratios; the tables go in
# bench/results by hand.
# Needs root (namespaces). Settings: RUNS=3 DURATION=3 LAT_ITERS=5000 QPS=2 NO_BUILD=1
# CARGO_TARGET_DIR.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
LAT_ITERS=${LAT_ITERS:-5000}
QPS=${QPS:-2}
NS=${NS:-bshard$$}
NSA=$NS-a
NSB=$NS-b
IPA=10.9.0.1
IPB=10.9.0.2
PORT=18600
IPERF_PORT=5231
command -v iperf3 >/dev/null && command -v jq >/dev/null || "$ROOT/scripts/netns.sh" deps
if [ "${NO_BUILD:-0}" != 1 ]; then
    (cd "$ROOT" && cargo build --release -q -p braid-bench --bin braid-perf --bin shard-bw)
fi
PERF=$TARGET/release/braid-perf
SBW=$TARGET/release/shard-bw
"$ROOT/scripts/netns.sh" veth up "$NS" 1500 >/dev/null
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    "$ROOT/scripts/netns.sh" veth down "$NS" >/dev/null 2>&1 || true
}
trap cleanup EXIT
echo "uptime: $(uptime)"
echo "veth $NSA $IPA <-> $IPB $NSB"
# One server: it opens each client's device with the client's shard count.
ip netns exec "$NSB" "$PERF" server --bind "$IPB:$PORT" --datapath udp >/tmp/"$NS"-server.log 2>&1 &
pids+=($!)
ip netns exec "$NSB" iperf3 -s -B "$IPB" -p "$IPERF_PORT" >/tmp/"$NS"-iperf3.log 2>&1 &
pids+=($!)
sleep 1
BW=(--datapath udp --test write_bw --size 1M --duration "$DURATION" --paths 16 --max-datagram 1472
    --burst 44 --slots 1 --quiet --json)
RAW=$(mktemp)
bw() { # label client-args...: one write_bw run
    local label=$1
    shift
    local g
    g=$(ip netns exec "$NSA" "$PERF" client "$IPB:$PORT" "${BW[@]}" "$@" | jq -r '.bw_gbps')
    echo "run $run veth $label gbit_s=$g"
    echo "$label $g" >>"$RAW"
}
tcp() { # streams
    local g
    g=$(ip netns exec "$NSA" iperf3 -c "$IPB" -p "$IPERF_PORT" -t "$DURATION" -P "$1" -J |
        jq -r '.end.sum_received.bits_per_second / 1e9')
    echo "run $run veth iperf3-tcp-P$1 gbit_s=$g"
    echo "tcp-P$1 $g" >>"$RAW"
}
for run in $(seq "$RUNS"); do
    bw "1qp-1shard" --qps 1 --shards 1
    bw "${QPS}qp-1shard" --qps "$QPS" --shards 1
    bw "${QPS}qp-${QPS}shard" --qps "$QPS" --shards "$QPS"
    tcp 1
    tcp "$QPS"
    for s in 1 2; do
        lat=$(ip netns exec "$NSA" "$PERF" client "$IPB:$PORT" --datapath udp --shards "$s" \
            --test write_lat --iters "$LAT_ITERS" --quiet --json |
            jq -r '"\(.lat.p50_us) p99 \(.lat.p99_us)"')
        echo "run $run veth shards=$s write_lat_8B_p50_us=$lat"
    done
    for s in 1 "$QPS"; do
        sbw=$("$SBW" --shards "$s" --qps "$QPS" --duration "$DURATION" --json)
        echo "run $run loopback shards=$s shard-bw qps=$QPS $sbw"
        echo "loopback-${s}shard $(jq -r '.gbit_s' <<<"$sbw")" >>"$RAW"
    done
done
echo "uptime: $(uptime)"
echo "medians of $RUNS (Gbit/s):"
med() { awk -v l="$1" '$1 == l { print $2 }' "$RAW" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "nan" }'; }
for l in 1qp-1shard "${QPS}qp-1shard" "${QPS}qp-${QPS}shard" tcp-P1 "tcp-P$QPS" loopback-1shard "loopback-${QPS}shard"; do
    echo "  $l $(med "$l")"
done
ratio() { awk -v a="$(med "$1")" -v b="$(med "$2")" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
echo "ratios of medians:"
row() { printf '  %-46s %s\n' "$1" "$(ratio "$2" "$3")"; }
row "$QPS QPs on $QPS shards / 1 QP" "${QPS}qp-${QPS}shard" 1qp-1shard
row "$QPS QPs on 1 shard / 1 QP" "${QPS}qp-1shard" 1qp-1shard
row "$QPS QPs on $QPS shards / iperf3 TCP one stream" "${QPS}qp-${QPS}shard" tcp-P1
row "$QPS QPs on $QPS shards / iperf3 TCP $QPS streams" "${QPS}qp-${QPS}shard" "tcp-P$QPS"
row "1 QP / iperf3 TCP one stream" 1qp-1shard tcp-P1
rm -f "$RAW"
