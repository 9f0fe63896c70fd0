#!/usr/bin/env bash
# Where Braid's bandwidth CPU goes on one veth pair: runs one braid-perf server (namespace B)
# and client (namespace A) of `write_bw`, and reports CPU time per MiB moved, for A/B runs on a
# shared, noisy machine (CPU time per MiB depends far less on other processes than Gbit/s).
#
# Per run it prints one JSON line (and appends it to $OUT if set):
#   gbps, mib                 what the client reported
#   client_ms_per_mib, server_ms_per_mib   user+system CPU of each process (all its threads,
#                             from /proc/PID/stat) per MiB moved
#   client_user/client_sys/server_user/server_sys   the same split, ms per MiB
#   machine_ms_per_mib        all CPUs' busy time (user+nice+system+irq+softirq, /proc/stat)
#                             per MiB: the processes above plus the kernel's softirq work done
#                             outside them (veth receive in ksoftirqd) plus other processes'
#   softirq_ms_per_mib        the machine's softirq time per MiB (veth xmit/receive, GRO)
#   foreign_ms_per_mib        machine busy time not accounted to the two processes, per MiB
#                             (softirq in other contexts, and other sessions' load)
#   datagrams_per_client_message   the client's data datagrams per packet veth-a sent (a GSO
#                             message passes the veth whole, so this is the mean GSO run)
#   server_messages_per_mib   packets veth-b sent per MiB: the server's ACKs
#   uptime                    the load average when the run started
# With PERF_RECORD=1 it also records `perf record -a -g` (cpu-clock; this VM has no hardware
# counters) over the run and prints the top of `perf report --no-children` by symbol, split by
# command, to $PROFILE_OUT (default /tmp/profile-veth.txt), and keeps each run's perf.data beside it
# ($PROFILE_OUT.runN.data; remove them afterwards).
#
# Settings: RUNS=3 DURATION=3 SIZE=1M PATHS=16 MAX_DGRAM=1472 BURST=44 DATAPATH=udp
#   CLIENT_ARGS / SERVER_ARGS (extra braid-perf flags), PERF=<braid-perf binary> (default
#   $CARGO_TARGET_DIR/release/braid-perf), NS (namespace prefix, default bprof<pid>), PORT.
# Needs root (namespaces). Builds nothing.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
SIZE=${SIZE:-1M}
PATHS=${PATHS:-16}
MAX_DGRAM=${MAX_DGRAM:-1472}
BURST=${BURST:-44}
DATAPATH=${DATAPATH:-udp}
CLIENT_ARGS=${CLIENT_ARGS:-}
SERVER_ARGS=${SERVER_ARGS:-}
PORT=${PORT:-18915}
NS=${NS:-bprof$$}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PERF=${PERF:-$TARGET/release/braid-perf}
PERF_RECORD=${PERF_RECORD:-0}
PROFILE_OUT=${PROFILE_OUT:-/tmp/profile-veth.txt}
OUT=${OUT:-}
NETNS=$ROOT/scripts/netns.sh
IPB=10.9.0.2

die() { printf 'profile-veth.sh: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
[ -x "$PERF" ] || die "no braid-perf at $PERF (build it: cargo build --release -p braid-bench)"
command -v jq >/dev/null || die "needs jq"

TMP=$(mktemp -d)
SERVER=""
cleanup() {
    local rc=$?
    trap - EXIT
    if [ -n "$SERVER" ]; then
        kill "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
    fi
    "$NETNS" veth down "$NS" >/dev/null 2>&1 || true
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
"$NETNS" veth up "$NS" 1500 >/dev/null

# shellcheck disable=SC2086 # the extra flags are words
ip netns exec "$NS-b" "$PERF" server --bind "$IPB:$PORT" --datapath "$DATAPATH" $SERVER_ARGS \
    >"$TMP/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do
    ip netns exec "$NS-a" bash -c "exec 3<>/dev/tcp/$IPB/$PORT" 2>/dev/null && break
    sleep 0.05
done
sleep 0.3

# Packets the veth ends sent (GSO messages count once: veth passes them whole).
vstat() { ip netns exec "$NS-$1" cat "/sys/class/net/veth-$1/statistics/tx_packets"; }
ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }
machine() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $8 }' /proc/stat; }
HZ=$(getconf CLK_TCK)

for run in $(seq "$RUNS"); do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    read -r su0 ss0 <<<"$(ticks "$SERVER")"
    read -r m0 sirq0 <<<"$(machine)"
    va0=$(vstat a) vb0=$(vstat b)
    if [ "$PERF_RECORD" = 1 ]; then
        perf record -a -g -F 999 -o "$TMP/perf.data" -- sleep "$((DURATION + 1))" >/dev/null 2>&1 &
        REC=$!
    fi
    # shellcheck disable=SC2086
    ip netns exec "$NS-a" "$PERF" client "$IPB:$PORT" --datapath "$DATAPATH" --test write_bw \
        --size "$SIZE" --duration "$DURATION" --paths "$PATHS" --max-datagram "$MAX_DGRAM" \
        --burst "$BURST" --json --quiet $CLIENT_ARGS >"$TMP/out.json" 2>"$TMP/err.txt" &
    CLIENT=$!
    # The client's own ticks, sampled just before it exits (it is our child, so /proc/PID/stat
    # stays readable until it is reaped).
    cu=0 cs=0
    while kill -0 "$CLIENT" 2>/dev/null; do
        if t=$(ticks "$CLIENT" 2>/dev/null); then read -r cu cs <<<"$t"; fi
        sleep 0.05
    done
    wait "$CLIENT" || die "client failed: $(cat "$TMP/err.txt")"
    read -r m1 sirq1 <<<"$(machine)"
    va1=$(vstat a) vb1=$(vstat b)
    read -r su1 ss1 <<<"$(ticks "$SERVER")"
    [ "$PERF_RECORD" = 1 ] && wait "$REC"
    jq -c --argjson cu "$cu" --argjson cs "$cs" --argjson su "$((su1 - su0))" \
        --argjson ss "$((ss1 - ss0))" --argjson m "$((m1 - m0))" --argjson sirq "$((sirq1 - sirq0))" \
        --argjson va "$((va1 - va0))" --argjson vb "$((vb1 - vb0))" --argjson hz "$HZ" --arg load "$load" --argjson burst "$BURST" --arg args "$CLIENT_ARGS" '
        (.iterations * .size / 1048576) as $mib
        | def per($t): ($t * 1000 / $hz / $mib * 1000 | round) / 1000;
        {gbps: (.bw_gbps * 1000 | round / 1000), mib: ($mib | round), burst: $burst, client_args: $args,
         client_ms_per_mib: per($cu + $cs), server_ms_per_mib: per($su + $ss),
         client_user: per($cu), client_sys: per($cs), server_user: per($su), server_sys: per($ss),
         machine_ms_per_mib: per($m), softirq_ms_per_mib: per($sirq),
         foreign_ms_per_mib: per($m - $cu - $cs - $su - $ss),
         retransmits: ([.paths_client[].retransmits] | add),
         datagrams_per_client_message: ((([.paths_client[].packets] | add) / ([$va, 1] | max)) * 10 | round / 10),
         server_messages_per_mib: ($vb / $mib | round), uptime: $load}' "$TMP/out.json" |
        tee -a "${OUT:-/dev/null}"
    if [ "$PERF_RECORD" = 1 ]; then
        # Only Braid's threads (client and server both name theirs braid-progress; the
        # client's main thread is braid-perf). Kernel receive work in softirq context lands in
        # whichever thread was running: mostly the sender's (veth transmit runs the receive
        # softirq on the sending CPU).
        local_report() { perf report -i "$TMP/perf.data" --no-children -g none --comms braid-progress,braid-perf "$@" --stdio 2>/dev/null | grep -E '^ +[0-9]' || true; }
        {
            echo "== run $run (client pid $CLIENT, server pid $SERVER): Braid's threads by pid and symbol"
            local_report --sort pid,sym | head -120 || true
            echo "== run $run: by pid and shared object"
            local_report --sort pid,dso | head -20 || true
        } >>"$PROFILE_OUT"
        cp "$TMP/perf.data" "$PROFILE_OUT.run$run.data"
    fi
done
