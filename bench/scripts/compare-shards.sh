#!/usr/bin/env bash
# Engine shards (DeviceConfig::shards, BRAID_SHARDS) side by side, alternating A/B in one run:
#   * veth: braid-perf write_bw (1 MiB WRITEs, one QP) and write_lat (8 B) between two network
#     namespaces over UDP sockets, both sides with BRAID_SHARDS=1, then =2, RUNS times;
#   * loopback: shard-bw, QPS QP pairs between two devices in one process, each QP with its
#     own posting thread and CQ, with --shards 1, then 2, RUNS times.
# braid-perf connects one QP per client, so the veth rows show what a shard of its own costs a
# single QP (its QP lives on shard 1, not on the device's first); shard-bw shows QPs on
# different shards working in parallel.
# Needs root (namespaces). Settings: RUNS=3 DURATION=3 LAT_ITERS=5000 QPS=2 NO_BUILD=1
# CARGO_TARGET_DIR. Prints one line per measurement; the medians go in bench/results by hand.
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
for s in 1 2; do
    BRAID_SHARDS=$s ip netns exec "$NSB" "$PERF" server --bind "$IPB:$((PORT + s))" --datapath udp \
        >/tmp/"$NS"-server-$s.log 2>&1 &
    pids+=($!)
done
sleep 1
for run in $(seq "$RUNS"); do
    for s in 1 2; do
        bw=$(BRAID_SHARDS=$s ip netns exec "$NSA" "$PERF" client "$IPB:$((PORT + s))" --datapath udp \
            --test write_bw --size 1M --duration "$DURATION" --quiet --json |
            jq -r '.bw_gbps')
        lat=$(BRAID_SHARDS=$s ip netns exec "$NSA" "$PERF" client "$IPB:$((PORT + s))" --datapath udp \
            --test write_lat --iters "$LAT_ITERS" --quiet --json |
            jq -r '"\(.lat.p50_us) p99 \(.lat.p99_us)"')
        echo "run $run veth shards=$s write_bw_1M_gbit_s=$bw write_lat_8B_p50_us=$lat"
        sbw=$("$SBW" --shards "$s" --qps "$QPS" --duration "$DURATION" --json)
        echo "run $run loopback shards=$s shard-bw qps=$QPS $sbw"
    done
done
echo "uptime: $(uptime)"
