#!/usr/bin/env bash
# Braid against one TCP flow and MPTCP on the four-path ECMP testbed (issue 4, part 5), with
# three bad links at once:
#
#   link 0  rate-limited to a tenth of the others (tbf)      SLOW_MBIT = FAST_MBIT / 10
#   link 1  losing LOSS of its packets (XDP, random)          FAST_MBIT
#   link 2  marking CE_MARK of its ECN-capable packets (XDP)  FAST_MBIT
#   link 3  healthy                                           FAST_MBIT
#
# Measured in the same run, RUNS times, medians reported:
#   * Braid: braid-perf write_bw (1 MiB RDMA WRITEs, 16 paths) over each of DATAPATHS;
#   * one TCP flow: iperf3, ECMP-hashed onto one link; run from several client ports to show
#     which link each lands on (its goodput is that link's, whatever the others do);
#   * MPTCP: `mptcpize run iperf3` with EXTRA_ADDRS extra addresses on hostA, each an MPTCP
#     `subflow` endpoint, so the subflows hash onto different links (checked with `ss -M`).
# Loss and marks act on every IPv4 packet (TCP too), and TCP negotiates ECN
# (net.ipv4.tcp_ecn=1 on hostA), so TCP and MPTCP meet the same degradations as Braid.
#
# Goodput is compared with:
#   * the links without congestion signals: healthy + lossy = 2 × FAST_MBIT. Random 1% loss is
#     not congestion, ECN marks are, so a correct sender moves off the marked link (and the
#     slow one). This is what "the healthy paths' summed capacity" means in the target
#     (Braid within 10% of it);
#   * all four links: 3 × FAST_MBIT + SLOW_MBIT.
# The round trips until Braid's weight on the slow link falls below half its equal share come
# from the integration test `netns_paths` (it samples the QP's weights while it runs), run at
# the end unless RUN_TEST=0.
#
# Needs root. Installs what it needs with scripts/netns.sh deps (iproute2, iperf3, mptcpd for
# mptcpize, jq); builds braid-bench and braid-netns in release unless NO_BUILD=1.
#
# Environment: FAST_MBIT (150), LOSS (0.01), CE_MARK (0.4), RUNS (3), DURATION (5 s),
# DATAPATHS ("udp xdp"), PATHS (16), EXTRA_ADDRS (7), TCP_PORTS ("40001 40002 40003 40004"),
# OUT (bench/results/testbed-YYYY-MM-DD.json), RUN_TEST (1), CONTROL (1: also run Braid with all
# four links healthy, the same rate, to separate what path scoring costs from what the window
# and the CPU cost).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
FAST_MBIT=${FAST_MBIT:-150}
SLOW_MBIT=$((FAST_MBIT / 10))
LOSS=${LOSS:-0.01}
CE_MARK=${CE_MARK:-0.4}
RUNS=${RUNS:-3}
DURATION=${DURATION:-5}
DATAPATHS=${DATAPATHS:-udp xdp}
PATHS=${PATHS:-16}
EXTRA_ADDRS=${EXTRA_ADDRS:-7}
TCP_PORTS=${TCP_PORTS:-40001 40002 40003 40004}
RUN_TEST=${RUN_TEST:-1}
CONTROL=${CONTROL:-1}
OUT=${OUT:-$ROOT/bench/results/testbed-$(date -u +%F).json}
IPERF_PORT=5201
MPTCP_PORT=5202
BRAID_PORT=18515

log() { echo "[compare-testbed] $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
"$ROOT/scripts/netns.sh" deps
if [ "${NO_BUILD:-0}" != 1 ]; then
    log "building braid-bench and braid-netns (release, target $TARGET)"
    (cd "$ROOT" && cargo build --release -q -p braid-bench -p braid-netns --bins)
fi
PERF=$TARGET/release/braid-perf
TESTBED=$TARGET/release/braid-testbed
[ -x "$PERF" ] && [ -x "$TESTBED" ] || die "missing $PERF or $TESTBED (build them or unset NO_BUILD)"

TMP=$(mktemp -d)
RAW=$TMP/raw.jsonl
: >"$RAW"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ -n "${TB_PID:-}" ]; then
        echo quit >&"${TB[1]}" 2>/dev/null || true
        wait "$TB_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

# The testbed, held up by braid-testbed (the XDP loss and marking need it: no netem here).
coproc TB { exec "$TESTBED" --rate "0:$SLOW_MBIT" --rate "1:$FAST_MBIT" --rate "2:$FAST_MBIT" \
    --rate "3:$FAST_MBIT" --loss "1:$LOSS" --ce "2:$CE_MARK"; }
TB_PID=$TB_PID
while read -r line <&"${TB[0]}"; do
    [ "$line" = READY ] && break
    case $line in [A-Z]*=*) eval "$line" ;; *) die "braid-testbed: $line" ;; esac
done
[ -n "${NSA:-}" ] || die "braid-testbed did not come up"
log "testbed up: hostA $NSA ($IPA), hostB $NSB ($IPB); links 0 slow $SLOW_MBIT Mbit/s, 1 lossy $LOSS, 2 CE $CE_MARK, 3 healthy, $FAST_MBIT Mbit/s each"

counters() { # one JSON object: per-link counters since the testbed came up
    echo counters >&"${TB[1]}"
    local l
    read -r l <&"${TB[0]}"
    echo "$l"
}
# delta BEFORE AFTER: per-link forwarded packets, tbf drops, netem drops and marks in between
delta() {
    jq -n -c --argjson a "$1" --argjson b "$2" '[range(0; 4) as $i | {
        link: $i,
        packets: ($b.links[$i].forward_packets - $a.links[$i].forward_packets),
        tbf_drops: ($b.links[$i].tbf_drops - $a.links[$i].tbf_drops),
        netem_dropped: ($b.links[$i].netem_dropped - $a.links[$i].netem_dropped),
        netem_marked: ($b.links[$i].netem_marked - $a.links[$i].netem_marked)}]'
}

tb_cmd() { # a command for braid-testbed (rate, netem); fails unless it answers OK
    echo "$1" >&"${TB[1]}"
    local l
    read -r l <&"${TB[0]}"
    [ "$l" = OK ] || die "braid-testbed: $1: $l"
}

inA() { ip netns exec "$NSA" "$@"; }
inB() { ip netns exec "$NSB" "$@"; }
for ns in "$NSA" "$NSB"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_ecn=1
    ip netns exec "$ns" sysctl -qw net.mptcp.enabled=1
    ip -n "$ns" mptcp limits set subflow 8 add_addr_accepted 8
done
base=${IPA%.*}
for k in $(seq 1 "$EXTRA_ADDRS"); do
    ip -n "$NSA" addr add "$base.$((10 + k))/24" dev "$IFA"
    ip -n "$NSA" mptcp endpoint add "$base.$((10 + k))" dev "$IFA" subflow
done

wait_tcp() { # ip port
    local _
    for _ in $(seq 100); do
        if inA bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    die "server on $1:$2 did not come up"
}
dps=($DATAPATHS)
for i in "${!dps[@]}"; do
    # `ip netns exec` execs the command, so $! is the server's pid.
    ip netns exec "$NSB" "$PERF" server --bind "$IPB:$((BRAID_PORT + i))" --datapath "${dps[$i]}" \
        >"$TMP/braid-server-${dps[$i]}.log" 2>&1 &
    pids+=($!)
done
ip netns exec "$NSB" iperf3 -s -B "$IPB" -p "$IPERF_PORT" >"$TMP/iperf3.log" 2>&1 &
pids+=($!)
ip netns exec "$NSB" mptcpize run iperf3 -s -B "$IPB" -p "$MPTCP_PORT" >"$TMP/iperf3-mptcp.log" 2>&1 &
pids+=($!)
for i in "${!dps[@]}"; do wait_tcp "$IPB" "$((BRAID_PORT + i))"; done
wait_tcp "$IPB" "$IPERF_PORT"
wait_tcp "$IPB" "$MPTCP_PORT"
sleep 0.3

record() { # run label mbit extra-json
    jq -n -c --argjson run "$1" --arg lbl "$2" --argjson mbit "$3" --argjson extra "$4" \
        '{run: $run, label: $lbl, mbit: $mbit} + $extra' >>"$RAW"
}

for run in $(seq 1 "$RUNS"); do
    for i in "${!dps[@]}"; do
        d=${dps[$i]}
        b=$(counters)
        rc=0
        inA timeout $((DURATION + 60)) "$PERF" client "$IPB:$((BRAID_PORT + i))" --datapath "$d" \
            --test write_bw --paths "$PATHS" --duration "$DURATION" --json --quiet \
            >"$TMP/braid.json" 2>"$TMP/braid.err" || rc=$?
        a=$(counters)
        if [ "$rc" -ne 0 ] || ! jq -e .bw_gbps "$TMP/braid.json" >/dev/null 2>&1; then
            log "run $run: Braid $d FAILED (exit $rc): $(tr '\n' ' ' <"$TMP/braid.err" | cut -c1-500)"
            record "$run" "braid-$d" null "{\"ok\": false}"
            continue
        fi
        mbit=$(jq '.bw_gbps * 1000' "$TMP/braid.json")
        extra=$(jq -c --argjson links "$(delta "$b" "$a")" \
            '{ok: true, retransmits: ([.paths_client[].retransmits] | add),
              packets: ([.paths_client[].packets] | add), links: $links}' "$TMP/braid.json")
        record "$run" "braid-$d" "$mbit" "$extra"
        log "run $run: Braid $d: $(printf %.0f "$mbit") Mbit/s; packets per link $(jq -c '[.links[].packets]' <<<"$extra")"
    done
    for p in $TCP_PORTS; do
        b=$(counters)
        rc=0
        inA iperf3 -c "$IPB" -p "$IPERF_PORT" --cport "$p" -t "$DURATION" -J >"$TMP/tcp.json" 2>&1 || rc=$?
        a=$(counters)
        # iperf3 can exit 0 with a JSON that has no result (server busy): count it as failed.
        if [ "$rc" -ne 0 ] || ! jq -e .end.sum_received.bits_per_second "$TMP/tcp.json" >/dev/null 2>&1; then
            log "run $run: TCP port $p FAILED: $(head -c 300 "$TMP/tcp.json")"
            continue
        fi
        links=$(delta "$b" "$a")
        link=$(jq '[.[] ] | max_by(.packets) | .link' <<<"$links")
        mbit=$(jq '.end.sum_received.bits_per_second / 1e6' "$TMP/tcp.json")
        record "$run" "tcp" "$mbit" "$(jq -c --argjson links "$links" --argjson link "$link" --argjson p "$p" \
            '{ok: true, cport: $p, link: $link, retransmits: .end.sum_sent.retransmits, links: $links}' "$TMP/tcp.json")"
        log "run $run: TCP from port $p: link $link, $(printf %.0f "$mbit") Mbit/s"
    done
    if [ "$CONTROL" = 1 ]; then
        # The same sender with all four links healthy at FAST_MBIT: what it gets when path
        # scoring has nothing to do (the window and the CPU are then the only limits).
        for l in 0 1 2 3; do tb_cmd "rate $l $FAST_MBIT"; tb_cmd "netem $l 0 0"; done
        rc=0
        inA timeout $((DURATION + 60)) "$PERF" client "$IPB:$BRAID_PORT" --datapath "${dps[0]}" \
            --test write_bw --paths "$PATHS" --duration "$DURATION" --json --quiet \
            >"$TMP/braid.json" 2>"$TMP/braid.err" || rc=$?
        tb_cmd "rate 0 $SLOW_MBIT"
        tb_cmd "netem 1 $LOSS 0"
        tb_cmd "netem 2 0 $CE_MARK"
        if [ "$rc" -eq 0 ] && jq -e .bw_gbps "$TMP/braid.json" >/dev/null 2>&1; then
            mbit=$(jq '.bw_gbps * 1000' "$TMP/braid.json")
            record "$run" "control: braid-${dps[0]}, 4 healthy links" "$mbit" "{\"ok\": true, \"links\": []}"
            log "run $run: control, Braid ${dps[0]} on 4 healthy links: $(printf %.0f "$mbit") Mbit/s (capacity $((4 * FAST_MBIT)))"
        fi
    fi
    b=$(counters)
    rc=0
    inA mptcpize run iperf3 -c "$IPB" -p "$MPTCP_PORT" -t "$DURATION" -J >"$TMP/mptcp.json" 2>&1 &
    mp=$!
    sleep $((DURATION / 2 + 1))
    subflows=$(inA ss -Mni | grep -o 'subflows:[0-9]*' | cut -d: -f2 | sort -n | tail -1 || true)
    wait "$mp" || rc=$?
    a=$(counters)
    joins=$(inA nstat -az MPTcpExtMPJoinSynAckRx 2>/dev/null | awk '/MPTcpExtMPJoinSynAckRx/ {print $2}')
    if [ "$rc" -ne 0 ] || ! jq -e .end.sum_received.bits_per_second "$TMP/mptcp.json" >/dev/null 2>&1; then
        log "run $run: MPTCP FAILED: $(head -c 300 "$TMP/mptcp.json")"
        continue
    fi
    mbit=$(jq '.end.sum_received.bits_per_second / 1e6' "$TMP/mptcp.json")
    record "$run" "mptcp" "$mbit" "$(jq -n -c --argjson links "$(delta "$b" "$a")" --arg sf "${subflows:-0}" \
        --arg j "${joins:-0}" '{ok: true, subflows: ($sf | tonumber), joins_total: ($j | tonumber), links: $links}')"
    log "run $run: MPTCP: $(printf %.0f "$mbit") Mbit/s, ${subflows:-?} extra subflows seen by ss -M"
done

rtts=""
if [ "$RUN_TEST" = 1 ]; then
    log "integration test netns_paths (weights sampled while a transfer runs)"
    (cd "$ROOT" && cargo test -q -p braid-tests --test all netns_paths -- --nocapture --test-threads 1) \
        >"$TMP/test.log" 2>&1 || log "netns_paths FAILED (see below)"
    rtts=$(grep -o 'testbed_[a-z]*_weights_move_off[a-z_]*: .*slow link below half its share after [^;]*' "$TMP/test.log" \
        | sed 's/: .* slow link below/: slow link below/' || true)
fi

capacity_all=$((3 * FAST_MBIT + SLOW_MBIT))
capacity_ok=$((2 * FAST_MBIT))
jq -s --argjson all "$capacity_all" --argjson ok "$capacity_ok" --arg rtts "$rtts" \
    --argjson fast "$FAST_MBIT" --argjson slow "$SLOW_MBIT" --arg loss "$LOSS" --arg ce "$CE_MARK" '
    def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
        else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    {setup: {fast_mbit: $fast, slow_mbit: $slow, loss: $loss, ce_mark: $ce,
             capacity_unsignalled_mbit: $ok, capacity_all_mbit: $all},
     rows: (group_by(.label + (if .label == "tcp" then ":\(.link)" else "" end)) | map({
        label: (.[0].label + (if .[0].label == "tcp" then " (link \(.[0].link))" else "" end)),
        runs: length, mbit_runs: [.[].mbit],
        median_mbit: ([.[] | select(.ok) | .mbit] | median),
        vs_unsignalled: (([.[] | select(.ok) | .mbit] | median) / $ok),
        vs_all: (([.[] | select(.ok) | .mbit] | median) / $all),
        vs_4_healthy: (([.[] | select(.ok) | .mbit] | median) / ($fast * 4)),
        link_packets_last: ((.[-1].links // []) | map(.packets)),
        subflows: ([.[].subflows // empty] | max)})),
     test_rtts: $rtts, raw: .}' "$RAW" >"$OUT"

echo
echo "Testbed: links 0 slow ($SLOW_MBIT Mbit/s), 1 lossy ($LOSS), 2 CE-marking ($CE_MARK of ECT), 3 healthy; $FAST_MBIT Mbit/s each otherwise."
echo "Target: Braid within 10% of the unsignalled links (healthy + lossy = $capacity_ok Mbit/s). All four: $capacity_all Mbit/s."
echo
echo "| sender | goodput Mbit/s (median of runs) | runs | / healthy+lossy ($capacity_ok) | / all four ($capacity_all) | packets per link 0-3 (last run) | note |"
echo "|---|---|---|---|---|---|---|"
jq -r '.rows[] | "| \(.label) | \(.median_mbit // "-" | if type == "number" then (. * 10 | round / 10) else . end) | \(.mbit_runs | map(if . == null then "fail" else (. | round | tostring) end) | join(", ")) | \(.vs_unsignalled // 0 | . * 100 | round / 100) | \(.vs_all // 0 | . * 100 | round / 100) | \(.link_packets_last | map(tostring) | join(" / ")) | \(if .subflows then "ss -M: \(.subflows) subflows" elif (.label | startswith("control")) then "\(.vs_4_healthy * 100 | round / 100) of the 4 healthy links" else "" end) |"' "$OUT"
echo
[ -n "$rtts" ] && { echo "Round trips until the slow link's weight fell below half its equal share (netns_paths):"; echo "$rtts"; }
log "results: $OUT"
