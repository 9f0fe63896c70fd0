#!/usr/bin/env bash
# Braid next to the kernel on one veth pair between two network namespaces, in one run:
#   * bandwidth: Braid RDMA WRITE of 1 MiB messages (braid-perf write_bw) over each datapath
#     (udp, uring, xdp; and AF_XDP on one side with UDP sockets on the other) vs iperf3 TCP,
#     one stream;
#   * latency:   Braid 8 B RDMA WRITE round trip (write_lat, p50/p99) over each datapath
#     vs a plain kernel UDP ping-pong of 8 B (udp-pingpong). On this kind of 2-vCPU VM the
#     ping-pong is bimodal: ~12 us when client and server share a CPU, ~55-70 us when each
#     wake-up crosses to the other (idle, halted) vCPU; unpinned it lands in either mode,
#     mostly the slow one on a quiet machine and the fast one on a busy machine. So besides
#     the unpinned ping-pong (the reference for the ratios) it is also measured pinned both
#     ways with taskset (PIN=0 skips that).
# Servers run in namespace B (10.9.0.2, dev veth-b), clients in namespace A (10.9.0.1, dev
# veth-a); `scripts/netns.sh veth up` builds the pair and the exit trap deletes it. Braid
# devices bind to the namespace's veth IP, so the AF_XDP datapath finds veth-a / veth-b itself.
# Each figure is the median of $RUNS runs. Printed and written, with every raw run (including
# per-run deltas of the veth drop counters and of `ethtool -S` XDP counters in both
# namespaces), to bench/results/veth-<date>.md (markdown table + JSON) and veth-<date>.json:
#   Braid WRITE bandwidth / iperf3 TCP bandwidth      (per datapath)
#   Braid 8 B WRITE p50 / UDP ping-pong p50           (per datapath)
#   AF_XDP WRITE bandwidth / Braid UDP WRITE bandwidth (target: >= 2)
#
# Needs root. Installs what it needs (iproute2, iperf3, jq; ethtool for the XDP counters) with
# apt-get when missing; builds braid-bench in release unless NO_BUILD=1.
# Settings (environment): RUNS=3 DURATION=3 LAT_ITERS=20000 SIZE=1M PATHS=16 MAX_DGRAM=1472
#   CONFIGS="udp uring xdp xdp/udp udp/xdp"   client/server datapath pairs ("xdp" = xdp/xdp);
#                                              xdp/udp = AF_XDP sender, UDP-socket receiver
#   BUSY_CONFIGS="udp xdp"  extra informational write_bw rows with the client's --busy-poll
#                           (empty: skip)
#   BW_PROGRESS=inline  who drives the client device in every Braid bandwidth row (WRITE,
#                       READ, SEND, message rate; braid-perf --progress): inline runs to
#                       completion, the thread that posts and waits on the CQ drives the
#                       device, as perftest's loop drives a NIC (since 2026-12-06; before, the
#                       progress thread); thread hands every post and completion across to the
#                       progress thread (bench/results/session-2026-12-06-s28.md)
#   THREAD_CONFIGS="udp"  extra informational SIZE write_bw rows with the client's --progress
#                         thread, beside the main rows (empty: skip)
#   WAIT_QUIET=180  before each run, wait up to this many seconds for the machine to be at least
#                   90% idle (other sessions' builds share these 2 CPUs); 0: don't wait. The
#                   idle share and the busiest processes seen are recorded either way.
#   FOREIGN_WARN=20  flag measurements during which other processes used more than this % of a
#                    CPU (measured from /proc/stat minus our own processes' CPU time)
#   RETRIES=2  measure again (after waiting for quiet) when other processes used more than
#              FOREIGN_WARN% of a CPU meanwhile, up to this many times; discarded attempts are
#              kept in the JSON (.discarded); RETRY_WAIT=20 s at most of waiting before each
#   PIN=1  also run udp-pingpong with client and server pinned to one CPU, and to two CPUs
#   LAT_MODES="inline-busy inline-blocking"  8 B WRITE latency in matched polling modes, each
#              next to a UDP ping-pong in the same mode (empty: skip). inline-busy: both
#              Braid sides run to completion (--progress inline), spinning on their CQs, vs a
#              ping-pong spinning on both sides; inline-blocking: both run to completion,
#              sleeping in CompletionQueue::wait (in the datapath), vs a blocking ping-pong;
#              thread-blocking: progress threads, the client sleeping on its CQ, vs a
#              blocking ping-pong. The main table's latency rows are progress threads with
#              the client spinning on its CQ.
#   LAT_CONFIGS="udp xdp"  datapaths (both sides) of the LAT_MODES rows
#   LAT_PORT  first port of the LAT_MODES braid-perf servers (default BRAID_PORT + 32)
#   NS (namespace prefix, default bveth<pid>), CARGO_TARGET_DIR (default: <workspace>/target),
#   NO_BUILD=1 (use the binaries already in CARGO_TARGET_DIR), ports BRAID_PORT (first of one
#   per server datapath) UDP_PORT IPERF_PORT.
# Ceilings and more Braid rows (bandwidth section; each measured in every run):
#   CEILING=1  the kernel's own UDP ceiling (udp-blast, receiver discarding): UDP_SEGMENT (GSO)
#              bursts of BURST datagrams of MAX_DGRAM bytes round-robin over PATHS connected
#              source ports to a UDP_GRO receiver; the same without GRO; one datagram per
#              send(); 8 B datagrams in sendmmsg batches of 64 (the message-rate reference);
#              and the GSO+GRO ceiling with the payload work no transport over UDP sockets
#              skips (udp-blast --pack/--place, regions of SIZE as Braid's one slot): each
#              datagram gathered from a region with its CRC32C in one pass, checked and
#              copied to its place at the receiver, as Braid's engine does
#   BURST      datagrams per GSO burst of the ceiling (default one full GSO message, under
#              64 KiB and at most 64 datagrams: 44 at 1472 B, 7 at 8972 B; it was 16 KiB
#              worth, 11 at 1472 B, until 2026-12-02 s8, see bench/results/
#              veth-2026-12-02-s8-after.md): the same burst size as Braid's
#   BRAID_BURST  Braid's burst spraying (braid-perf --burst: new packets per path draw, so
#              each burst leaves as one GSO message); default BURST; 1 = a path per packet
#   BRAID_SLOTS=1  message slots of Braid's SIZE write_bw/read_bw rows (braid-perf --slots): 1
#              posts every message from and to the same bytes, as perftest's bandwidth tests
#              do and as iperf3 and udp-blast send from one buffer; empty: one slot per
#              outstanding message (32 MiB of each region at 1 MiB), the script's figures
#              before 2026-12-03 (and what binaries without --slots need)
#   XDP_RAW=1  the AF_XDP frame rate through Braid's own AF_XDP datapath with no protocol
#              (xdp-blast), MAX_DGRAM and XDP_RAW_SMALL (64) byte payloads
#   READ_CONFIGS="udp uring xdp"  Braid read_bw SIZE rows (empty: skip)
#   SEND_CONFIGS="udp uring xdp"  Braid send_bw SIZE rows (the server keeps receives posted;
#                                 next to WRITE of the same size) (empty: skip)
#   MSG_CONFIGS="udp uring xdp"   Braid 8 B write_bw message-rate rows, every WRITE signaled,
#                                 and unsignaled ones (empty: skip)
#   CQ_MOD=16  the unsignaled rows signal every CQ_MOD-th WRITE (braid-perf --cq-mod, as
#              perftest's); next to the kernel 8 B datagram rate; 1: skip those rows
#   BLAST_PORT (udp-blast / xdp-blast receiver port, default 18700)
#   RESULTS_NAME (file name of the results without .md/.json, default veth-<date>)
#   BUILT_FROM  the commit the NO_BUILD=1 binaries were built from, recorded instead of the
#               checkout's (and its uncommitted files); e.g. a base build in a worktree
#   MTU=1500   of both veth ends (9000: jumbo frames; AF_XDP then uses multi-buffer frames);
#              MAX_DGRAM defaults to MTU - 28
set -euo pipefail

BENCH=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
LAT_ITERS=${LAT_ITERS:-20000}
SIZE=${SIZE:-1M}
PATHS=${PATHS:-16}
MTU=${MTU:-1500}
MAX_DGRAM=${MAX_DGRAM:-$((MTU - 28))}
CONFIGS=${CONFIGS:-udp uring xdp xdp/udp udp/xdp}
BUSY_CONFIGS=${BUSY_CONFIGS-udp xdp}
THREAD_CONFIGS=${THREAD_CONFIGS-udp}
BW_PROGRESS=${BW_PROGRESS:-inline}
PIN=${PIN:-1}
WAIT_QUIET=${WAIT_QUIET:-180}
NS=${NS:-bveth$$}
BRAID_PORT=${BRAID_PORT:-18515}
UDP_PORT=${UDP_PORT:-18600}
IPERF_PORT=${IPERF_PORT:-15201}
CEILING=${CEILING:-1}
DEFAULT_BURST=$((65000 / MAX_DGRAM))
[ "$DEFAULT_BURST" -le 64 ] || DEFAULT_BURST=64
[ "$DEFAULT_BURST" -ge 1 ] || DEFAULT_BURST=1
BURST=${BURST:-$DEFAULT_BURST}
BRAID_BURST=${BRAID_BURST:-$BURST}
# braid-perf's default is 1, so it is passed only when it differs (older binaries, without
# the flag, can then be measured with BRAID_BURST=1 for a before/after).
BURST_ARGS=()
[ "$BRAID_BURST" = 1 ] || BURST_ARGS=(--burst "$BRAID_BURST")
BRAID_SLOTS=${BRAID_SLOTS-1}
SLOT_ARGS=()
[ -z "$BRAID_SLOTS" ] || SLOT_ARGS=(--slots "$BRAID_SLOTS")
XDP_RAW=${XDP_RAW:-1}
XDP_RAW_SMALL=${XDP_RAW_SMALL:-64}
READ_CONFIGS=${READ_CONFIGS-udp uring xdp}
SEND_CONFIGS=${SEND_CONFIGS-udp uring xdp}
MSG_CONFIGS=${MSG_CONFIGS-udp uring xdp}
CQ_MOD=${CQ_MOD:-16}
BLAST_PORT=${BLAST_PORT:-18700}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export CARGO_TARGET_DIR=$TARGET
NETNS=$ROOT/scripts/netns.sh
NSA=$NS-a
NSB=$NS-b
IPA=10.9.0.1
IPB=10.9.0.2
IFA=veth-a
IFB=veth-b

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'compare-veth.sh: %s\n' "$*" >&2; exit 1; }
[[ $BW_PROGRESS =~ ^(inline|thread)$ ]] || die "BW_PROGRESS: $BW_PROGRESS is not inline or thread"

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, veth, AF_XDP); run it as root, e.g. sudo $0"

# --- tools -------------------------------------------------------------------------------
missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v iperf3 >/dev/null || missing+=(iperf3)
command -v jq >/dev/null || missing+=(jq)
command -v ethtool >/dev/null || missing+=(ethtool)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "${NO_BUILD:-0}" != 1 ]; then
    log "building braid-bench (release, target $TARGET)"
    (cd "$ROOT" && cargo build --release -q -p braid-bench --bins)
fi
PERF=$TARGET/release/braid-perf
PING=$TARGET/release/udp-pingpong
if [ ! -x "$PERF" ] || [ ! -x "$PING" ]; then die "missing $PERF or $PING (build braid-bench first)"; fi
UBLAST=$TARGET/release/udp-blast
XBLAST=$TARGET/release/xdp-blast
if [ ! -x "$UBLAST" ] || [ ! -x "$XBLAST" ]; then die "missing $UBLAST or $XBLAST (build braid-bench first)"; fi

LAT_MODES=${LAT_MODES-inline-busy inline-blocking}
LAT_CONFIGS=${LAT_CONFIGS-udp xdp}
LAT_PORT=${LAT_PORT:-$((BRAID_PORT + 32))}
for m in $LAT_MODES; do
    [[ $m =~ ^(inline-busy|inline-blocking|thread-blocking)$ ]] || die "LAT_MODES: $m is not inline-busy, inline-blocking or thread-blocking"
done
for d in $LAT_CONFIGS; do
    [[ $d =~ ^(udp|uring|xdp)$ ]] || die "LAT_CONFIGS: $d is not udp, uring or xdp (both sides)"
done

# Client/server datapath of a config ("xdp" = xdp/xdp).
cdp() { echo "${1%%/*}"; }
sdp() { [[ $1 == */* ]] && echo "${1##*/}" || echo "$1"; }
for c in $CONFIGS $BUSY_CONFIGS $THREAD_CONFIGS $READ_CONFIGS $MSG_CONFIGS; do
    for d in "$(cdp "$c")" "$(sdp "$c")"; do
        [[ $d =~ ^(udp|uring|xdp|auto)$ ]] || die "config $c: datapath $d is not udp, uring, xdp or auto"
    done
done
# One braid-perf server per server-side datapath, on consecutive ports.
server_dps=()
for c in $CONFIGS $BUSY_CONFIGS $THREAD_CONFIGS $READ_CONFIGS $MSG_CONFIGS; do
    d=$(sdp "$c")
    [[ " ${server_dps[*]} " == *" $d "* ]] || server_dps+=("$d")
done
port_of() { # server datapath -> its braid-perf server port
    local i
    for i in "${!server_dps[@]}"; do
        [ "${server_dps[$i]}" = "$1" ] && { echo $((BRAID_PORT + i)); return; }
    done
    return 1
}

# --- namespaces and servers --------------------------------------------------------------
TMP=$(mktemp -d)
pids=()
CHILDREN=() # a client running under run_limited, and its timer
ns_made=0
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "${CHILDREN[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${CHILDREN[@]}" "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "$ns_made" = 1 ]; then
        "$NETNS" veth down "$NS" >/dev/null 2>&1 || true
        log "namespaces $NSA $NSB deleted"
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "veth pair: $NSA $IFA $IPA <-> $IPB $IFB $NSB"
# netns.sh refuses existing namespaces and cleans up after itself if `up` fails half-way, so
# the trap deletes only what it built.
"$NETNS" veth up "$NS" "$MTU" >/dev/null
ns_made=1

inA() { ip netns exec "$NSA" "$@"; }

wait_tcp() { # ip port: connect from namespace A
    local _
    for _ in $(seq 100); do
        if inA bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    die "server on $1:$2 did not come up (see its log)"
}

for d in "${server_dps[@]}"; do
    port=$(port_of "$d")
    # Not through a shell function: a backgrounded function is a subshell, $! would be its pid
    # and killing it would orphan the server. `ip netns exec` execs the command itself.
    ip netns exec "$NSB" "$PERF" server --bind "$IPB:$port" --datapath "$d" >"$TMP/braid-server-$d.log" 2>&1 &
    pids+=($!)
done
ip netns exec "$NSB" iperf3 -s -B "$IPB" -p "$IPERF_PORT" >"$TMP/iperf3-server.log" 2>&1 &
pids+=($!)
ip netns exec "$NSB" "$PING" server --bind "$IPB:$UDP_PORT" >"$TMP/udp-server.log" 2>&1 &
PING_PID=$! # `ip netns exec` execs the command: this is udp-pingpong's pid
pids+=($!)
NCPU=$(nproc)
if [ "$PIN" = 1 ] && { [ "$NCPU" -lt 2 ] || ! command -v taskset >/dev/null; }; then
    log "PIN=1 needs 2 CPUs and taskset: skipping the pinned ping-pong"
    PIN=0
fi
# --- latency in matched polling modes: servers --------------------------------------------
# One braid-perf server per LAT_CONFIGS datapath and LAT_MODES mode, in that mode's server
# settings; one busy-polling udp-pingpong server (the main one blocks) for the *-busy modes.
lat_server_args() { # mode -> braid-perf server flags
    case $1 in
        inline-busy) echo "--progress inline --busy-poll" ;;
        inline-blocking) echo "--progress inline" ;;
        thread-blocking) echo "--progress thread" ;;
    esac
}
lat_client_args() { # mode -> braid-perf client flags for write_lat
    case $1 in
        inline-busy) echo "--progress inline" ;;
        inline-blocking) echo "--progress inline --lat-wait" ;;
        thread-blocking) echo "--progress thread --lat-wait" ;;
    esac
}
lat_port() { # datapath mode -> port of its server
    local k=0 d m
    for d in $LAT_CONFIGS; do
        for m in $LAT_MODES; do
            [ "$d/$m" = "$1/$2" ] && { echo $((LAT_PORT + k)); return; }
            k=$((k + 1))
        done
    done
    return 1
}
PING_BUSY_PORT=$((UDP_PORT + 1))
for d in $LAT_CONFIGS; do
    for m in $LAT_MODES; do
        # shellcheck disable=SC2046 # the flags are words
        ip netns exec "$NSB" "$PERF" server --bind "$IPB:$(lat_port "$d" "$m")" --datapath "$d" $(lat_server_args "$m") \
            >"$TMP/braid-server-lat-$d-$m.log" 2>&1 &
        pids+=($!)
    done
done
# The busy ping-pong server spins a CPU while it lives, so it runs only for its own rows
# (pingpong_mode), not beside every other measurement.
for d in $LAT_CONFIGS; do
    for m in $LAT_MODES; do wait_tcp "$IPB" "$(lat_port "$d" "$m")"; done
done

for d in "${server_dps[@]}"; do wait_tcp "$IPB" "$(port_of "$d")"; done
wait_tcp "$IPB" "$IPERF_PORT"
# The TCP probes above count as (empty) clients; give the servers a moment to move on.
sleep 0.3

# --- counters ----------------------------------------------------------------------------
# JSON object of one namespace's veth counters: /sys statistics and `ethtool -S` (the veth
# driver's per-queue XDP counters: xdp_packets, xdp_redirect, xdp_drops, drops, ...).
# shellcheck disable=SC2016 # the script inside runs in the namespace's sh
snap_if() { # ns ifname
    ip netns exec "$1" sh -c '
        d=/sys/class/net/'"$2"'/statistics
        for f in rx_packets tx_packets rx_dropped tx_dropped rx_errors tx_errors; do
            echo "$f: $(cat $d/$f)"
        done
        ethtool -S '"$2"' 2>/dev/null | tail -n +2 | grep -v peer_ifindex || true' |
        jq -R -n '[inputs | capture("^\\s*(?<k>[^:\\s]+):\\s*(?<v>[0-9]+)\\s*$")? | {(.k): (.v | tonumber)}] | add // {}'
}
snap() { jq -n -c --argjson a "$(snap_if "$NSA" "$IFA")" --argjson b "$(snap_if "$NSB" "$IFB")" '{a: $a, b: $b}'; }
# Non-zero differences after - before, per side.
delta() { # before after
    jq -n -c --argjson x "$1" --argjson y "$2" \
        '{a: ($y.a | with_entries(.value -= ($x.a[.key] // 0)) | with_entries(select(.value != 0))),
          b: ($y.b | with_entries(.value -= ($x.b[.key] // 0)) | with_entries(select(.value != 0)))}'
}

# CPU used by other processes during a measurement (other sessions share these CPUs): the
# machine's user+nice+system+irq+softirq time minus our servers' and our foreground children's
# (the client, reaped by this shell: `times`). In % of one CPU. On a quiet machine it reads
# -7 to -17 (our processes' times and /proc/stat do not add up exactly), clamped to 0.
# cpu_mark VAR: sets VAR to "machine_ticks servers_ticks children_s epoch_s". Not to be called
# as $(cpu_mark): `times` in a command substitution's subshell sees none of our children.
cpu_mark() {
    local m srv=0 p t
    m=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat)
    for p in "${pids[@]}"; do
        t=$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null) || t=0
        srv=$((srv + ${t:-0}))
    done
    times >"$TMP/times" # a builtin with a redirection: runs in this shell, not a subshell
    printf -v "$1" '%s' "$(awk -v m="$m" -v s="$srv" -v now="$(date +%s.%N)" 'NR == 2 {
            split($1, u, /[ms]/); split($2, y, /[ms]/)
            printf "%s %s %.3f %s\n", m, s, u[1] * 60 + u[2] + y[1] * 60 + y[2], now }' "$TMP/times")"
}
foreign_pct() { # mark_before mark_after -> % of one CPU used by others
    awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        el = y[4] - x[4]
        f = ((y[1] - x[1]) - (y[2] - x[2])) / hz - (y[3] - x[3])
        printf "%.1f\n", (el > 0 && f > 0) ? 100 * f / el : 0 }'
}
FOREIGN_WARN=${FOREIGN_WARN:-20}
# run_limited SECONDS COMMAND...: like timeout(1) (exit 124 when killed), but the command is a
# child of this shell, so `times` counts its CPU (through timeout(1) it did not).
run_limited() {
    local lim=$1 c s rc=0 first=""
    shift
    "$@" &
    c=$!
    CHILDREN=("$c")
    sleep "$lim" &
    s=$!
    CHILDREN+=("$s")
    wait -n -p first "$c" "$s" || rc=$?
    if [ "$first" = "$s" ]; then
        kill "$c" 2>/dev/null || true
        wait "$c" 2>/dev/null || true
        CHILDREN=()
        return 124
    fi
    kill "$s" 2>/dev/null || true
    wait "$s" 2>/dev/null || true
    CHILDREN=()
    return "$rc"
}
RETRIES=${RETRIES:-2}
RETRY_WAIT=${RETRY_WAIT:-20}

RAW=$TMP/raw.jsonl
: >"$RAW"

# braid RUN CONFIG TEST LABEL [client args...]: one braid-perf client run, one JSON line in $RAW.
braid() {
    local run=$1 cfg=$2 test=$3 label=$4
    shift 4
    local c s port before after rc=0 lim m0 m1 foreign
    c=$(cdp "$cfg")
    s=$(sdp "$cfg")
    port=$(port_of "$s")
    case $test in *_bw) lim=$((DURATION + 60)) ;; *) lim=300 ;; esac
    before=$(snap)
    cpu_mark m0
    run_limited "$lim" ip netns exec "$NSA" "$PERF" client "$IPB:$port" --datapath "$c" --test "$test" \
        --paths "$PATHS" --max-datagram "$MAX_DGRAM" "${BURST_ARGS[@]}" --json --quiet "$@" \
        >"$TMP/out.json" 2>"$TMP/err.txt" || rc=$?
    cpu_mark m1
    after=$(snap)
    foreign=$(foreign_pct "$m0" "$m1")
    sleep 0.1 # the server logs its summary after the client's last line
    local srv_line err
    srv_line=$(tail -n 1 "$TMP/braid-server-$s.log")
    err=$(tr '\n' ' ' <"$TMP/err.txt" | cut -c1-2000)
    if [ "$rc" -ne 0 ] || ! jq -e . "$TMP/out.json" >/dev/null 2>&1; then
        log "  $label FAILED (exit $rc): $err"
        jq -n -c --argjson run "$run" --arg cfg "$cfg" --arg lbl "$label" --arg test "$test" \
            --arg c "$c" --arg s "$s" --argjson rc "$rc" --arg err "$err" --arg srv "$srv_line" \
            --argjson veth "$(delta "$before" "$after")" --argjson foreign "$foreign" \
            '{run: $run, config: $cfg, label: $lbl, test: $test, client_datapath: $c, server_datapath: $s,
              ok: false, exit: $rc, error: $err, server: $srv, veth: $veth, foreign_cpu_pct: $foreign}' >>"$RAW"
        return 0
    fi
    jq -c --argjson run "$run" --arg cfg "$cfg" --arg lbl "$label" --arg c "$c" --arg s "$s" \
        --arg srv "$srv_line" --argjson veth "$(delta "$before" "$after")" --argjson foreign "$foreign" \
        '{run: $run, config: $cfg, label: $lbl, test, client_datapath: $c, server_datapath: $s, foreign_cpu_pct: $foreign,
          reported_datapath: .datapath, ok: true, bw_gbps, msg_rate, iterations, lat,
          packets: ([.paths_client[].packets] | add), lost: ([.paths_client[].lost] | add),
          retransmits: ([.paths_client[].retransmits] | add),
          srtt_us_max: ([.paths_client[].srtt_us] | max),
          server: $srv, veth: $veth}' "$TMP/out.json" >>"$RAW"
    local note=""
    awk -v f="$foreign" -v w="$FOREIGN_WARN" 'BEGIN { exit !(f > w) }' && note=" (other processes used $foreign% of a CPU meanwhile)"
    if [[ $test == *_bw ]]; then
        log "  $label: $(jq -r '"\(.bw_gbps * 1000 | round / 1000) Gbit/s, \(.msg_rate // 0 | round) msg/s, \([.paths_client[].retransmits] | add) retransmits"' "$TMP/out.json")$note"
    else
        log "  $label: $(jq -r '"p50 \(.lat.p50_us * 10 | round / 10) us, p99 \(.lat.p99_us * 10 | round / 10) us"' "$TMP/out.json")$note"
    fi
}

pingpong() { # run label [pinning command...]: one udp-pingpong client run, one JSON line in $RAW
    local run=$1 label=$2
    shift 2
    log "run $run/$RUNS: UDP ping-pong 8 B x $LAT_ITERS${1:+ (client: $*, server: CPU 0)}"
    local m0 m1 foreign
    cpu_mark m0
    "$@" ip netns exec "$NSA" "$PING" client "$IPB:$UDP_PORT" --size 8 --iters "$LAT_ITERS" --json >"$TMP/out.json"
    cpu_mark m1
    foreign=$(foreign_pct "$m0" "$m1")
    jq -c --argjson run "$run" --arg lbl "$label" --argjson foreign "$foreign" \
        '{run: $run, label: $lbl, ok: true, foreign_cpu_pct: $foreign, lat: .}' "$TMP/out.json" >>"$RAW"
    log "  $label: $(jq -r '"p50 \(.p50_us * 10 | round / 10) us, p99 \(.p99_us * 10 | round / 10) us"' "$TMP/out.json")$(
        awk -v f="$foreign" -v w="$FOREIGN_WARN" 'BEGIN { exit !(f > w) }' && echo " (other processes used $foreign% of a CPU meanwhile)")"
}

# "IDLE BUSY": the machine's idle share (%, all CPUs) over half a second, and the processes
# that used at least 10% of a CPU meanwhile.
machine_load() {
    top -b -n 2 -d 0.5 -w 256 | awk '
        /^top -/ { n++ }
        n == 2 && /^%Cpu/ && match($0, /[0-9.]+ +id/) { idle = substr($0, RSTART, RLENGTH) + 0 }
        n == 2 && $1 ~ /^[0-9]+$/ && $9 + 0 >= 10 { busy = busy $12 "(" $9 "%) " }
        END { printf "%s %s\n", idle + 0, busy }'
}
# Waits (up to WAIT_QUIET s) for >= 90% idle, then records the load in $RAW.
# Waits up to $1 s for the machine to be >= 90% idle. Sets IDLE, BUSY, WAITED.
wait_quiet() {
    WAITED=0
    while :; do
        read -r IDLE BUSY <<<"$(machine_load)"
        if awk -v i="$IDLE" 'BEGIN { exit !(i >= 90) }' || [ "$WAITED" -ge "$1" ]; then break; fi
        [ "$WAITED" -eq 0 ] && log "machine busy (idle $IDLE%: $BUSY); waiting up to $1 s for it to calm down"
        sleep 5
        WAITED=$((WAITED + 5))
    done
}
quiet() { # run: waits, then records the machine's load in $RAW
    wait_quiet "$WAIT_QUIET"
    awk -v i="$IDLE" 'BEGIN { exit !(i < 90) }' && log "run $1: machine still busy (idle $IDLE%: $BUSY); measuring anyway"
    jq -n -c --argjson run "$1" --argjson idle "$IDLE" --arg busy "$BUSY" --argjson waited "$WAITED" \
        '{run: $run, label: "machine", idle_pct_before: $idle, busy_processes: $busy, waited_s: $waited}' >>"$RAW"
}
# measure COMMAND...: runs a measurement (which appends one line to $RAW); while other processes
# used more than FOREIGN_WARN% of a CPU meanwhile, moves that line to $DISCARDED, waits for quiet
# and measures again, up to RETRIES times (the last attempt is kept whatever happened).
DISCARDED=$TMP/discarded.jsonl
: >"$DISCARDED"
measure() {
    local k last
    for k in $(seq 0 "$RETRIES"); do
        "$@"
        last=$(tail -n 1 "$RAW")
        [ "$k" -lt "$RETRIES" ] || break
        jq -e --argjson w "$FOREIGN_WARN" '(.foreign_cpu_pct // 0) > $w' <<<"$last" >/dev/null || break
        log "  (discarded: other processes used $(jq -r .foreign_cpu_pct <<<"$last")% of a CPU; measuring again)"
        sed -i '$d' "$RAW"
        printf '%s\n' "$last" >>"$DISCARDED"
        wait_quiet "$RETRY_WAIT"
    done
}
iperf() { # run
    local before after m0 m1
    log "run $1/$RUNS: iperf3 TCP, one stream, $DURATION s"
    before=$(snap)
    cpu_mark m0
    inA iperf3 -c "$IPB" -p "$IPERF_PORT" -t "$DURATION" -J >"$TMP/iperf.json"
    cpu_mark m1
    after=$(snap)
    jq -c --argjson run "$1" --argjson veth "$(delta "$before" "$after")" --argjson foreign "$(foreign_pct "$m0" "$m1")" \
        '{run: $run, label: "iperf3-tcp", ok: true, foreign_cpu_pct: $foreign, bw_gbps: (.end.sum_received.bits_per_second / 1e9),
          retransmits: .end.sum_sent.retransmits, veth: $veth}' "$TMP/iperf.json" >>"$RAW"
    log "  iperf3: $(jq -r '"\(.end.sum_received.bits_per_second / 1e9 * 100 | round / 100) Gbit/s"' "$TMP/iperf.json")$(
        tail -n 1 "$RAW" | jq -r --argjson w "$FOREIGN_WARN" 'if .foreign_cpu_pct > $w then " (other processes used \(.foreign_cpu_pct)% of a CPU meanwhile)" else "" end')"
}

# --- ceilings: the kernel's UDP and the raw AF_XDP frame rate -----------------------------
# Waits until something in namespace B listens on UDP port $1 (a blast receiver).
wait_udp() {
    local _
    for _ in $(seq 200); do
        [ -n "$(ip netns exec "$NSB" ss -Hlun "sport = :$1" 2>/dev/null)" ] && return 0
        sleep 0.05
    done
    return 1
}
# blast RUN LABEL KIND "RECV ARGS" SEND ARGS...: one receiver (udp-blast or xdp-blast, KIND udp
# or xdp) in namespace B, one sender in namespace A for $DURATION s; one JSON line in $RAW with
# the receiver's figures (what was delivered) and the sender's.
blast() {
    local run=$1 label=$2 kind=$3 rargs=$4 bin rc=0 rp m0 m1 before after foreign
    shift 4
    [ "$kind" = xdp ] && bin=$XBLAST || bin=$UBLAST
    log "run $run/$RUNS: $label"
    before=$(snap)
    cpu_mark m0
    # shellcheck disable=SC2086 # word splitting of the receiver's arguments is intended
    ip netns exec "$NSB" "$bin" recv --bind "$IPB:$BLAST_PORT" --first-wait "$((DURATION + 20))" $rargs --json >"$TMP/blast-recv.json" 2>"$TMP/blast-recv.err" &
    rp=$!
    CHILDREN=("$rp")
    if [ "$kind" = xdp ]; then
        # The AF_XDP receiver reserves its port with a plain UDP socket once its rings are up.
        wait_udp "$BLAST_PORT" || true
        sleep 0.2
    else
        wait_udp "$BLAST_PORT" || true
    fi
    if [ "$kind" = xdp ]; then
        inA "$bin" send "$IPB:$BLAST_PORT" --bind "$IPA:$BLAST_PORT" --duration "$DURATION" --json "$@" >"$TMP/blast-send.json" 2>"$TMP/blast-send.err" || rc=$?
    else
        inA "$bin" send "$IPB:$BLAST_PORT" --duration "$DURATION" --json "$@" >"$TMP/blast-send.json" 2>"$TMP/blast-send.err" || rc=$?
    fi
    if [ "$rc" -ne 0 ]; then kill "$rp" 2>/dev/null || true; fi
    wait "$rp" || rc=$((rc ? rc : $?))
    CHILDREN=()
    cpu_mark m1
    after=$(snap)
    foreign=$(foreign_pct "$m0" "$m1")
    if [ "$rc" -ne 0 ] || ! jq -e . "$TMP/blast-recv.json" >/dev/null 2>&1 || ! jq -e . "$TMP/blast-send.json" >/dev/null 2>&1; then
        local err
        err=$(cat "$TMP/blast-send.err" "$TMP/blast-recv.err" | tr '\n' ' ' | cut -c1-2000)
        log "  $label FAILED (exit $rc): $err"
        jq -n -c --argjson run "$run" --arg lbl "$label" --argjson rc "$rc" --arg err "$err" \
            --argjson veth "$(delta "$before" "$after")" --argjson foreign "$foreign" \
            '{run: $run, label: $lbl, test: "ceiling", ok: false, exit: $rc, error: $err, veth: $veth, foreign_cpu_pct: $foreign}' >>"$RAW"
        return 0
    fi
    jq -n -c --argjson run "$run" --arg lbl "$label" --slurpfile r "$TMP/blast-recv.json" --slurpfile s "$TMP/blast-send.json" \
        --argjson veth "$(delta "$before" "$after")" --argjson foreign "$foreign" \
        '{run: $run, label: $lbl, test: "ceiling", ok: true, foreign_cpu_pct: $foreign,
          bw_gbps: $r[0].gbps, datagrams_per_s: ($r[0].datagrams_per_s // ($r[0].mpps * 1e6)),
          sent_gbps: $s[0].gbps, sent_datagrams_per_s: ($s[0].datagrams_per_s // ($s[0].mpps * 1e6)),
          delivered_share: (if $s[0].datagrams > 0 then $r[0].datagrams / $s[0].datagrams else null end),
          receiver: $r[0], sender: $s[0], veth: $veth}' >>"$RAW"
    log "  $label: $(tail -n 1 "$RAW" | jq -r '"\(.bw_gbps * 100 | round / 100) Gbit/s, \(.datagrams_per_s / 1000 | round) kdatagrams/s delivered (sent \(.sent_gbps * 100 | round / 100) Gbit/s)"')$(
        awk -v f="$foreign" -v w="$FOREIGN_WARN" 'BEGIN { exit !(f > w) }' && echo " (other processes used $foreign% of a CPU meanwhile)")"
}
ceilings() { # run
    if [ "$CEILING" = 1 ]; then
        measure blast "$1" "kernel-udp-gso$BURST-gro" udp "--gro" --burst "$BURST" --segment "$MAX_DGRAM" --ports "$PATHS"
        measure blast "$1" "kernel-udp-gso$BURST-gro-placed" udp "--gro --place $SIZE" --burst "$BURST" --segment "$MAX_DGRAM" --ports "$PATHS" --pack "$SIZE"
        measure blast "$1" "kernel-udp-gso$BURST" udp "" --burst "$BURST" --segment "$MAX_DGRAM" --ports "$PATHS"
        measure blast "$1" "kernel-udp-1dgram" udp "" --burst 1 --segment "$MAX_DGRAM" --ports "$PATHS"
        measure blast "$1" "kernel-udp-8B-sendmmsg64" udp "" --burst 1 --segment 8 --mmsg 64 --ports "$PATHS"
    fi
    if [ "$XDP_RAW" = 1 ]; then
        measure blast "$1" "xdp-raw-$MAX_DGRAM" xdp "" --size "$MAX_DGRAM" --paths "$PATHS"
        measure blast "$1" "xdp-raw-$XDP_RAW_SMALL" xdp "" --size "$XDP_RAW_SMALL" --paths "$PATHS"
    fi
}
more_braid() { # run: read_bw, send_bw and 8 B write_bw message-rate rows
    local cfg
    for cfg in $READ_CONFIGS; do
        log "run $1/$RUNS: Braid $cfg read_bw $SIZE ${DURATION}s"
        measure braid "$1" "$cfg" read_bw "$cfg+read" --size "$SIZE" --duration "$DURATION" --progress "$BW_PROGRESS" "${SLOT_ARGS[@]}"
    done
    for cfg in $SEND_CONFIGS; do
        log "run $1/$RUNS: Braid $cfg send_bw $SIZE ${DURATION}s"
        measure braid "$1" "$cfg" send_bw "$cfg+send" --size "$SIZE" --duration "$DURATION" --progress "$BW_PROGRESS"
    done
    for cfg in $MSG_CONFIGS; do
        log "run $1/$RUNS: Braid $cfg write_bw 8 B ${DURATION}s (message rate)"
        measure braid "$1" "$cfg" write_bw "$cfg+8B" --size 8 --duration "$DURATION" --progress "$BW_PROGRESS"
        if [ "$CQ_MOD" != 1 ]; then
            log "run $1/$RUNS: Braid $cfg write_bw 8 B ${DURATION}s, every ${CQ_MOD}th signaled (message rate)"
            measure braid "$1" "$cfg" write_bw "$cfg+8B-unsignaled" --size 8 --duration "$DURATION" --cq-mod "$CQ_MOD" --progress "$BW_PROGRESS"
        fi
    done
}
# --- latency in matched polling modes: measurements ----------------------------------------
# `braid` finds its server with port_of; while LAT_SERVER_PORT is set, that is the port of a
# LAT_MODES server instead.
eval "$(declare -f port_of | sed '1s/^port_of/port_of_main/')"
port_of() { if [ -n "${LAT_SERVER_PORT:-}" ]; then echo "$LAT_SERVER_PORT"; else port_of_main "$@"; fi; }
pingpong_mode() { # run label mode: one udp-pingpong client run in the mode's polling, one JSON line in $RAW
    local run=$1 label=$2 port=$UDP_PORT flags=() m0 m1 foreign busy_pid=
    if [[ $3 == *-busy ]]; then
        port=$PING_BUSY_PORT flags=(--busy-poll)
        ip netns exec "$NSB" "$PING" server --bind "$IPB:$PING_BUSY_PORT" --busy-poll >>"$TMP/udp-server-busy.log" 2>&1 &
        busy_pid=$!
        wait_udp "$PING_BUSY_PORT" || true
    fi
    log "run $run/$RUNS: UDP ping-pong 8 B x $LAT_ITERS, ${3#*-} on both sides"
    cpu_mark m0
    ip netns exec "$NSA" "$PING" client "$IPB:$port" --size 8 --iters "$LAT_ITERS" --json "${flags[@]}" >"$TMP/out.json"
    cpu_mark m1
    if [ -n "$busy_pid" ]; then
        kill "$busy_pid" 2>/dev/null || true
        wait "$busy_pid" 2>/dev/null || true
    fi
    foreign=$(foreign_pct "$m0" "$m1")
    jq -c --argjson run "$run" --arg lbl "$label" --arg mode "$3" --argjson foreign "$foreign" \
        '{run: $run, label: $lbl, lat_mode: $mode, ok: true, foreign_cpu_pct: $foreign, lat: .}' "$TMP/out.json" >>"$RAW"
    log "  $label: $(jq -r '"p50 \(.p50_us * 10 | round / 10) us, p99.9 \(.p999_us * 10 | round / 10) us"' "$TMP/out.json")"
}
lat_modes_run() { # run: every LAT_MODES row once
    local d m
    for m in $LAT_MODES; do
        for d in $LAT_CONFIGS; do
            log "run $1/$RUNS: Braid $d write_lat 8 B x $LAT_ITERS, $m"
            # shellcheck disable=SC2046 # the flags are words
            LAT_SERVER_PORT=$(lat_port "$d" "$m") measure braid "$1" "$d" write_lat "lat:$d:$m" --size 8 --iters "$LAT_ITERS" $(lat_client_args "$m")
        done
        # The blocking ping-pong of the main rows serves the blocking modes of the same run too,
        # but is measured here again so that each mode's pair is taken back to back.
        measure pingpong_mode "$1" "lat:udp-pingpong:$m" "$m"
    done
}

for i in $(seq "$RUNS"); do
    quiet "$i"
    lat_modes_run "$i"
    for cfg in $CONFIGS; do
        log "run $i/$RUNS: Braid $cfg (client/server datapath): write_bw $SIZE ${DURATION}s, write_lat 8 B x $LAT_ITERS"
        measure braid "$i" "$cfg" write_bw "$cfg" --size "$SIZE" --duration "$DURATION" --progress "$BW_PROGRESS" "${SLOT_ARGS[@]}"
        measure braid "$i" "$cfg" write_lat "$cfg" --size 8 --iters "$LAT_ITERS"
    done
    for cfg in $BUSY_CONFIGS; do
        log "run $i/$RUNS: Braid $cfg write_bw with the client's --busy-poll (informational)"
        measure braid "$i" "$cfg" write_bw "$cfg+busy-poll" --size "$SIZE" --duration "$DURATION" --busy-poll "${SLOT_ARGS[@]}"
    done
    for cfg in $THREAD_CONFIGS; do
        log "run $i/$RUNS: Braid $cfg write_bw with the client's --progress thread (informational)"
        measure braid "$i" "$cfg" write_bw "$cfg+thread" --size "$SIZE" --duration "$DURATION" --progress thread "${SLOT_ARGS[@]}"
    done

    measure iperf "$i"
    ceilings "$i"
    more_braid "$i"

    measure pingpong "$i" udp-pingpong
    if [ "$PIN" = 1 ]; then
        taskset -a -p -c 0 "$PING_PID" >/dev/null
        measure pingpong "$i" udp-pingpong-same-cpu taskset -c 0
        measure pingpong "$i" udp-pingpong-cross-cpu taskset -c 1
        taskset -a -p -c "0-$((NCPU - 1))" "$PING_PID" >/dev/null
    fi
done

# --- medians and ratios ------------------------------------------------------------------
DATE=$(date +%Y-%m-%d)
OUT_MD=$BENCH/results/${RESULTS_NAME:-veth-$DATE}.md
OUT_JSON=$BENCH/results/${RESULTS_NAME:-veth-$DATE}.json
mkdir -p "$BENCH/results"

# shellcheck disable=SC2086 # word splitting of the lists is intended
cfg_json=$(printf '%s\n' $CONFIGS | jq -R . | jq -s -c .)
# shellcheck disable=SC2086
busy_json=$(printf '%s\n' $BUSY_CONFIGS | jq -R 'select(length > 0)' | jq -s -c .)
# shellcheck disable=SC2086
thread_json=$(printf '%s\n' $THREAD_CONFIGS | jq -R 'select(length > 0)' | jq -s -c .)

jq -s \
    --arg date "$(date -Iseconds)" --arg kernel "$(uname -r)" --arg cpus "$(nproc)" \
    --arg commit "${BUILT_FROM:-$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
    --arg dirty "$([ -n "${BUILT_FROM:-}" ] || (cd "$ROOT" && git status --porcelain -- bench/src bench/Cargo.toml datapath transport cc 2>/dev/null | awk '{print $2}' | paste -sd' '))" \
    --arg size "$SIZE" --argjson runs "$RUNS" --argjson duration "$DURATION" --argjson lat_iters "$LAT_ITERS" \
    --argjson paths "$PATHS" --argjson max_datagram "$MAX_DGRAM" \
    --argjson configs "$cfg_json" --argjson busy "$busy_json" --argjson thread "$thread_json" --slurpfile discarded "$DISCARDED" \
    --arg topo "$NSA $IFA $IPA <-> $IPB $IFB $NSB (one veth pair, MTU $MTU, one queue)" '
    def median: map(select(. != null)) | sort
        | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
          else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def div($a; $b): if $a == null or $b == null or $b == 0 then null else $a / $b end;
    . as $all
    | def ok($lb; $test): [$all[] | select(.label == $lb and .ok and ((.test // $test) == $test))];
      def failures($lb; $test): [$all[] | select(.label == $lb and (.ok | not) and .test == $test)] | length;
    ([ok("iperf3-tcp"; null)[].bw_gbps] | median) as $tcp
    | ([ok("udp-pingpong"; null)[].lat.p50_us] | median) as $u50
    | ([ok("udp-pingpong"; null)[].lat.p99_us] | median) as $u99
    | ([ok("udp-pingpong-same-cpu"; null)[].lat.p50_us] | median) as $s50
    | ([ok("udp-pingpong-same-cpu"; null)[].lat.p99_us] | median) as $s99
    | ([ok("udp-pingpong-cross-cpu"; null)[].lat.p50_us] | median) as $x50
    | ([ok("udp-pingpong-cross-cpu"; null)[].lat.p99_us] | median) as $x99
    | ([$configs[], ($busy[] | . + "+busy-poll"), ($thread[] | . + "+thread")]) as $lbls
    | ([$lbls[] as $l | {key: $l, value: {
          client_datapath: ($l | sub("\\+(busy-poll|thread)$"; "") | split("/")[0]),
          server_datapath: ($l | sub("\\+(busy-poll|thread)$"; "") | split("/") | last),
          write_bw_gbps: ([ok($l; "write_bw")[].bw_gbps] | median),
          write_bw_retransmits: ([ok($l; "write_bw")[].retransmits] | median),
          write_bw_failures: failures($l; "write_bw"),
          write_lat_p50_us: ([ok($l; "write_lat")[].lat.p50_us] | median),
          write_lat_p99_us: ([ok($l; "write_lat")[].lat.p99_us] | median),
          write_lat_failures: failures($l; "write_lat")}}] | from_entries) as $m
    # Ratios paired within each run (both figures measured minutes apart at most).
    | def at($lb; $test; $r): [ok($lb; $test)[] | select(.run == $r)] | first;
      def per_run(f): [range(1; $runs + 1) | f];
    ({braid_bw_over_tcp_bw: ($m | with_entries(.key as $l | .value = per_run(div(at($l; "write_bw"; .).bw_gbps; at("iperf3-tcp"; null; .).bw_gbps)))),
      braid_p50_over_udp_pingpong_p50: ($m | with_entries(select(.value.write_lat_p50_us != null)) | with_entries(.key as $l | .value = per_run(div(at($l; "write_lat"; .).lat.p50_us; at("udp-pingpong"; null; .).lat.p50_us)))),
      xdp_bw_over_udp_bw: per_run(div(at("xdp"; "write_bw"; .).bw_gbps; at("udp"; "write_bw"; .).bw_gbps)),
      xdp_to_udp_bw_over_udp_bw: per_run(div(at("xdp/udp"; "write_bw"; .).bw_gbps; at("udp"; "write_bw"; .).bw_gbps)),
      xdp_p50_over_udp_pingpong_p50: per_run(div(at("xdp"; "write_lat"; .).lat.p50_us; at("udp-pingpong"; null; .).lat.p50_us)),
      xdp_p50_over_udp_pingpong_same_cpu_p50: per_run(div(at("xdp"; "write_lat"; .).lat.p50_us; at("udp-pingpong-same-cpu"; null; .).lat.p50_us)),
      xdp_p50_over_udp_pingpong_cross_cpu_p50: per_run(div(at("xdp"; "write_lat"; .).lat.p50_us; at("udp-pingpong-cross-cpu"; null; .).lat.p50_us))}) as $pr
    | {date: $date, kernel: $kernel, cpus: ($cpus | tonumber), commit: $commit,
       uncommitted_files: ($dirty | split(" ") | map(select(length > 0))), topology: $topo,
       settings: {runs: $runs, duration_s: $duration, size: $size, lat_iters: $lat_iters, paths: $paths,
                  max_datagram: $max_datagram, configs: $configs, busy_poll_configs: $busy, thread_configs: $thread},
       median: {braid: $m, tcp_iperf3_gbps: $tcp, udp_pingpong_p50_us: $u50, udp_pingpong_p99_us: $u99,
               udp_pingpong_same_cpu_p50_us: $s50, udp_pingpong_same_cpu_p99_us: $s99,
               udp_pingpong_cross_cpu_p50_us: $x50, udp_pingpong_cross_cpu_p99_us: $x99},
       ratio: {
         braid_bw_over_tcp_bw: ($m | map_values(div(.write_bw_gbps; $tcp))),
         braid_p50_over_udp_pingpong_p50: ($m | with_entries(select(.value.write_lat_p50_us != null)) | map_values(div(.write_lat_p50_us; $u50))),
         braid_p99_over_udp_pingpong_p99: ($m | with_entries(select(.value.write_lat_p99_us != null)) | map_values(div(.write_lat_p99_us; $u99))),
         xdp_bw_over_udp_bw: div($m.xdp.write_bw_gbps?; $m.udp.write_bw_gbps?),
         xdp_to_udp_bw_over_udp_bw: div($m["xdp/udp"].write_bw_gbps?; $m.udp.write_bw_gbps?),
         xdp_p50_over_udp_pingpong_p50: div($m.xdp.write_lat_p50_us?; $u50),
         xdp_p50_over_udp_pingpong_same_cpu_p50: div($m.xdp.write_lat_p50_us?; $s50),
         xdp_p50_over_udp_pingpong_cross_cpu_p50: div($m.xdp.write_lat_p50_us?; $x50)},
       ratio_per_run: $pr,
       ratio_median_of_runs: ($pr | map_values(if type == "array" then median else map_values(median) end)),
       machine: [$all[] | select(.label == "machine") | del(.label)],
       targets: {xdp_bw_at_least_2x_udp: (div($m.xdp.write_bw_gbps?; $m.udp.write_bw_gbps?) as $r | if $r == null then null else $r >= 2 end),
                 xdp_p50_below_udp_pingpong_p50: (div($m.xdp.write_lat_p50_us?; $u50) as $r | if $r == null then null else $r < 1 end)},
       runs: [$all[] | select(.label != "machine")],
       discarded: $discarded}' "$RAW" >"$OUT_JSON"

# --- ceilings, READ and message rate: medians, ratios and targets, added to the results ----
# shellcheck disable=SC2086 # word splitting of the lists is intended
read_json=$(printf '%s\n' $READ_CONFIGS | jq -R 'select(length > 0)' | jq -s -c .)
# shellcheck disable=SC2086
send_json=$(printf '%s\n' $SEND_CONFIGS | jq -R 'select(length > 0)' | jq -s -c .)
# shellcheck disable=SC2086
msg_json=$(printf '%s\n' $MSG_CONFIGS | jq -R 'select(length > 0)' | jq -s -c .)
jq -s --slurpfile res "$OUT_JSON" --arg burst "$BURST" --arg dg "$MAX_DGRAM" --arg small "$XDP_RAW_SMALL" \
    --argjson reads "$read_json" --argjson sends "$send_json" --argjson msgs "$msg_json" --argjson runs "$RUNS" '
    def median: map(select(. != null)) | sort
        | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
          else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def div($a; $b): if $a == null or $b == null or $b == 0 then null else $a / $b end;
    def ge($r; $t): if $r == null then null else $r >= $t end;
    . as $all
    | def ok($lb; $test): [$all[] | select(.label == $lb and .ok and ((.test // $test) == $test))];
      def med($lb; $test; f): [ok($lb; $test)[] | f] | median;
      def at($lb; $test; $r): [ok($lb; $test)[] | select(.run == $r)] | first;
      def per_run($a; $ta; $b; $tb; f; g): [range(1; $runs + 1) as $r | div(at($a; $ta; $r) | f; at($b; $tb; $r) | g)];
    ("kernel-udp-gso" + $burst + "-gro") as $gro
    | ("kernel-udp-gso" + $burst) as $gso
    | ("xdp-raw-" + $dg) as $raw
    | ("xdp-raw-" + $small) as $raws
    | ($gro + "-placed") as $placed
    | ([$gro, $placed, $gso, "kernel-udp-1dgram", "kernel-udp-8B-sendmmsg64", $raw, $raws] | map(. as $k | {key: $k, value: {
          gbps: med($k; "ceiling"; .bw_gbps), datagrams_per_s: med($k; "ceiling"; .datagrams_per_s),
          sent_gbps: med($k; "ceiling"; .sent_gbps), delivered_share: med($k; "ceiling"; .delivered_share),
          failures: ([$all[] | select(.label == $k and (.ok | not))] | length)}}) | from_entries) as $c
    | $res[0].median.tcp_iperf3_gbps as $tcp
    | $res[0].median.braid as $b
    | ([$reads[] | . as $k | {key: $k, value: {read_bw_gbps: med($k + "+read"; "read_bw"; .bw_gbps),
                                   read_bw_failures: ([$all[] | select(.label == ($k + "+read") and (.ok | not))] | length)}}] | from_entries) as $rd
    | ([$sends[] | . as $k | {key: $k, value: {send_bw_gbps: med($k + "+send"; "send_bw"; .bw_gbps),
                                   send_bw_failures: ([$all[] | select(.label == ($k + "+send") and (.ok | not))] | length)}}] | from_entries) as $sd
    | ([$msgs[] | . as $k | {key: $k, value: {write_8b_msg_per_s: med($k + "+8B"; "write_bw"; .msg_rate),
                                   write_8b_failures: ([$all[] | select(.label == ($k + "+8B") and (.ok | not))] | length),
                                   write_8b_unsignaled_msg_per_s: med($k + "+8B-unsignaled"; "write_bw"; .msg_rate),
                                   write_8b_unsignaled_failures: ([$all[] | select(.label == ($k + "+8B-unsignaled") and (.ok | not))] | length)}}] | from_entries) as $mr
    | $res[0] + {ceiling: {
        burst: ($burst | tonumber), kernel_udp: $c, braid_read: $rd, braid_send: $sd, braid_msg_rate: $mr,
        ratio: {
          braid_write_over_udp_gso_gro: ($b | map_values(div(.write_bw_gbps; $c[$gro].gbps))),
          braid_write_over_udp_placed: ($b | map_values(div(.write_bw_gbps; $c[$placed].gbps))),
          udp_placed_over_tcp: div($c[$placed].gbps; $tcp),
          braid_write_over_tcp: ($b | map_values(div(.write_bw_gbps; $tcp))),
          braid_read_over_tcp: ($rd | map_values(div(.read_bw_gbps; $tcp))),
          braid_read_over_write: ($rd | with_entries(.key as $k | .value = div(.value.read_bw_gbps; $b[$k].write_bw_gbps?))),
          braid_send_over_write: ($sd | with_entries(.key as $k | .value = div(.value.send_bw_gbps; $b[$k].write_bw_gbps?))),
          braid_send_over_tcp: ($sd | map_values(div(.send_bw_gbps; $tcp))),
          braid_8b_msg_rate_over_udp_8b_rate: ($mr | map_values(div(.write_8b_msg_per_s; $c["kernel-udp-8B-sendmmsg64"].datagrams_per_s))),
          braid_8b_unsignaled_msg_rate_over_udp_8b_rate: ($mr | map_values(div(.write_8b_unsignaled_msg_per_s; $c["kernel-udp-8B-sendmmsg64"].datagrams_per_s))),
          xdp_write_over_xdp_raw: div($b.xdp.write_bw_gbps?; $c[$raw].gbps),
          udp_gso_gro_over_tcp: div($c[$gro].gbps; $tcp)},
        ratio_per_run: {
          udp_write_over_udp_gso_gro: per_run("udp"; "write_bw"; $gro; "ceiling"; .bw_gbps; .bw_gbps),
          udp_write_over_tcp: per_run("udp"; "write_bw"; "iperf3-tcp"; null; .bw_gbps; .bw_gbps),
          xdp_write_over_xdp_raw: per_run("xdp"; "write_bw"; $raw; "ceiling"; .bw_gbps; .bw_gbps)},
        targets: {
          udp_write_at_least_1_5x_tcp: ge(div($b.udp.write_bw_gbps?; $tcp); 1.5),
          udp_write_at_least_0_6x_udp_gso_gro: ge(div($b.udp.write_bw_gbps?; $c[$gro].gbps); 0.6),
          xdp_write_at_least_0_8x_xdp_raw: ge(div($b.xdp.write_bw_gbps?; $c[$raw].gbps); 0.8)}}}
    ' "$RAW" >"$TMP/with-ceiling.json"
mv "$TMP/with-ceiling.json" "$OUT_JSON"
{
    cr() { # jq expression on .ceiling -> rounded number or n/a
        jq -r --argjson d "${2:-2}" "(try (.ceiling | $1) catch null) as \$v | if \$v == null then \"n/a\" else (\$v * pow(10; \$d) | round / pow(10; \$d) | tostring) end" "$OUT_JSON"
    }
    cv() { jq -r "(.ceiling.targets.$1) | if . == null then \"n/a\" elif . then \"met\" else \"MISSED\" end" "$OUT_JSON"; }
    g=kernel-udp-gso$BURST-gro
    echo "Ceilings measured in the same run (receiver discarding unless the row says otherwise; Gbit/s of UDP payload, medians of $RUNS):"
    echo
    echo "| reference | Gbit/s | kdatagrams/s | sent Gbit/s | delivered share |"
    echo "|---|---|---|---|---|"
    for l in "$g" "$g-placed" "kernel-udp-gso$BURST" kernel-udp-1dgram kernel-udp-8B-sendmmsg64 "xdp-raw-$MAX_DGRAM" "xdp-raw-$XDP_RAW_SMALL"; do
        case $l in
            "$g") d="kernel UDP: GSO bursts of $BURST x $MAX_DGRAM B over $PATHS ports, UDP_GRO receiver" ;;
            "$g-placed") d="the same, with the sender gathering each datagram from a $SIZE region with its CRC32C and the receiver checking it and copying it into a $SIZE region (Braid's payload work, no protocol)" ;;
            kernel-udp-gso*) d="kernel UDP: the same GSO bursts, receiver without GRO" ;;
            kernel-udp-1dgram) d="kernel UDP: one $MAX_DGRAM B datagram per send(), $PATHS ports" ;;
            kernel-udp-8B*) d="kernel UDP: 8 B datagrams, sendmmsg x 64, $PATHS ports (message-rate reference)" ;;
            xdp-raw-*) d="AF_XDP raw (xdp-blast: Braid's AF_XDP datapath, no protocol), ${l#xdp-raw-} B payloads, $PATHS ports" ;;
        esac
        k=".kernel_udp[\"$l\"]"
        f=$(cr "$k.failures" 0)
        [ "$f" != 0 ] && [ "$f" != n/a ] && d="$d — failed $f/$RUNS"
        echo "| $d | $(cr "$k.gbps" 2) | $(cr "$k.datagrams_per_s / 1000" 0) | $(cr "$k.sent_gbps" 2) | $(cr "$k.delivered_share" 3) |"
    done
    echo
    echo "| Braid datapath | WRITE $SIZE / UDP GSO+GRO ceiling | READ $SIZE Gbit/s | READ / iperf3 TCP | SEND $SIZE Gbit/s | SEND / WRITE | SEND / iperf3 TCP | 8 B WRITE msg/s | / kernel 8 B datagrams/s | 8 B WRITE msg/s, every ${CQ_MOD}th signaled | / kernel 8 B datagrams/s |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    for l in $(jq -r '[.median.braid | keys_unsorted[]] + [.ceiling.braid_read | keys[]] + [.ceiling.braid_send | keys[]] + [.ceiling.braid_msg_rate | keys[]] | unique | .[]' "$OUT_JSON"); do
        echo "| $l | $(cr ".ratio.braid_write_over_udp_gso_gro[\"$l\"]" 3) | $(cr ".braid_read[\"$l\"].read_bw_gbps" 3) | $(cr ".ratio.braid_read_over_tcp[\"$l\"]" 3) | $(cr ".braid_send[\"$l\"].send_bw_gbps" 3) | $(cr ".ratio.braid_send_over_write[\"$l\"]" 3) | $(cr ".ratio.braid_send_over_tcp[\"$l\"]" 3) | $(cr ".braid_msg_rate[\"$l\"].write_8b_msg_per_s" 0) | $(cr ".ratio.braid_8b_msg_rate_over_udp_8b_rate[\"$l\"]" 3) | $(cr ".braid_msg_rate[\"$l\"].write_8b_unsignaled_msg_per_s" 0) | $(cr ".ratio.braid_8b_unsignaled_msg_rate_over_udp_8b_rate[\"$l\"]" 3) |"
    done
    echo
    echo "SEND bandwidth: braid-perf send_bw --size $SIZE, the server keeps twice the client's window of receives posted and reposts each as it completes."
    echo "8 B WRITE message rate: braid-perf write_bw --size 8, every work request signaled, and with --cq-mod $CQ_MOD (only every ${CQ_MOD}th signaled, as perftest's --cq-mod; the others complete with it). braid-perf posts each refill of its window as one list (QueuePair::post_send_list, one doorbell), as perftest's post list does. Every Braid bandwidth row: client --progress $BW_PROGRESS."
    echo
    echo "Bandwidth targets (ratio of medians; per run in brackets):"
    echo
    echo "- Braid UDP WRITE / iperf3 TCP: $(cr '.ratio.braid_write_over_tcp.udp' 2) (target ≥ 1.5: $(cv udp_write_at_least_1_5x_tcp)); per run $(jq -r -c '.ceiling.ratio_per_run.udp_write_over_tcp | map(if . == null then null else . * 100 | round / 100 end)' "$OUT_JSON")"
    echo "- Braid UDP WRITE / kernel UDP GSO+GRO ceiling at $BURST datagrams per burst: $(cr '.ratio.braid_write_over_udp_gso_gro.udp' 2) (target ≥ 0.6: $(cv udp_write_at_least_0_6x_udp_gso_gro)); per run $(jq -r -c '.ceiling.ratio_per_run.udp_write_over_udp_gso_gro | map(if . == null then null else . * 100 | round / 100 end)' "$OUT_JSON")"
    echo "- Braid AF_XDP WRITE / raw AF_XDP ($MAX_DGRAM B): $(cr '.ratio.xdp_write_over_xdp_raw' 2) (target ≥ 0.8: $(cv xdp_write_at_least_0_8x_xdp_raw)); per run $(jq -r -c '.ceiling.ratio_per_run.xdp_write_over_xdp_raw | map(if . == null then null else . * 100 | round / 100 end)' "$OUT_JSON")"
    echo "- kernel UDP GSO+GRO ceiling / iperf3 TCP: $(cr '.ratio.udp_gso_gro_over_tcp' 2)"
    echo "- the same ceiling with Braid's payload work (gather + CRC32C, check + place) / iperf3 TCP: $(cr '.ratio.udp_placed_over_tcp' 2); Braid UDP WRITE / it: $(cr '.ratio.braid_write_over_udp_placed.udp' 2)"
    echo
} >"$TMP/ceiling.md"

# --- report ------------------------------------------------------------------------------
r() { # jq expression on the results -> number rounded to $2 decimals, or "n/a"
    jq -r --argjson d "${2:-2}" "(try ($1) catch null) as \$v | if \$v == null then \"n/a\" else (\$v * pow(10; \$d) | round / pow(10; \$d) | tostring) end" "$OUT_JSON"
}
desc() {
    case $1 in
        udp) echo "udp (UDP sockets both sides)" ;;
        uring) echo "uring (io_uring both sides)" ;;
        xdp) echo "xdp (AF_XDP both sides)" ;;
        */*) echo "$1 (client $(cdp "$1") → server $(sdp "$1"))" ;;
        *) echo "$1 (both sides)" ;;
    esac
}
{
    echo "# Braid vs kernel on a veth pair between two namespaces ($DATE)"
    echo
    echo "Machine: $(nproc) CPUs, Linux $(uname -r); commit $(jq -r .commit "$OUT_JSON")$(jq -r '.uncommitted_files | if length > 0 then " plus uncommitted changes in \(join(", "))" else "" end' "$OUT_JSON"). Medians of $RUNS runs, all in this one run."
    echo "Topology: $(jq -r .topology "$OUT_JSON"); servers in $NSB, clients in $NSA."
    echo "Braid: $PATHS paths, $MAX_DGRAM B datagrams; write_bw $SIZE messages for $DURATION s (client sends, server receives; the client's device driven by braid-perf --progress $BW_PROGRESS, the server's by its progress thread; ${BRAID_SLOTS:-one per outstanding message} message slot(s) per region, braid-perf --slots); write_lat 8 B x $LAT_ITERS round trips."
    echo "Kernel: iperf3 TCP one stream $DURATION s; udp-pingpong 8 B x $LAT_ITERS."
    echo
    echo "| Braid datapath (client → server) | WRITE $SIZE Gbit/s | / iperf3 TCP | / Braid udp | retransmits | WRITE 8 B p50 µs | p99 µs | p50 / UDP ping-pong p50 | p99 / UDP p99 |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for l in $(jq -r '.median.braid | keys_unsorted[]' "$OUT_JSON"); do
        k=".median.braid[\"$l\"]"
        fails=$(jq -r "$k | [if .write_bw_failures > 0 then \"bw failed \(.write_bw_failures)/$RUNS\" else empty end, if .write_lat_failures > 0 then \"lat failed \(.write_lat_failures)/$RUNS\" else empty end] | join(\", \")" "$OUT_JSON")
        name=$(desc "${l%+*}")
        if [[ $l == *+busy-poll ]]; then
            name="$name, client --busy-poll (informational)"
            lat="| – | – | – | –"
        elif [[ $l == *+thread ]]; then
            name="$name, client --progress thread (informational)"
            lat="| – | – | – | –"
        else
            lat="| $(r "$k.write_lat_p50_us" 1) | $(r "$k.write_lat_p99_us" 1) | $(r ".ratio.braid_p50_over_udp_pingpong_p50[\"$l\"]" 2) | $(r ".ratio.braid_p99_over_udp_pingpong_p99[\"$l\"]" 2)"
        fi
        [ -n "$fails" ] && name="$name — $fails"
        echo "| $name | $(r "$k.write_bw_gbps" 3) | $(r ".ratio.braid_bw_over_tcp_bw[\"$l\"]" 3) | $(r "$k.write_bw_gbps / .median.braid.udp.write_bw_gbps" 2) | $(r "$k.write_bw_retransmits" 0) $lat |"
    done
    echo "| kernel: iperf3 TCP one stream / UDP ping-pong | $(r .median.tcp_iperf3_gbps 2) | 1 | | | $(r .median.udp_pingpong_p50_us 1) | $(r .median.udp_pingpong_p99_us 1) | 1 | 1 |"
    if [ "$PIN" = 1 ]; then
        echo "| kernel: UDP ping-pong, client and server pinned to CPU 0 (informational) | | | | | $(r .median.udp_pingpong_same_cpu_p50_us 1) | $(r .median.udp_pingpong_same_cpu_p99_us 1) | $(r '.median.udp_pingpong_same_cpu_p50_us / .median.udp_pingpong_p50_us' 2) | |"
        echo "| kernel: UDP ping-pong, server on CPU 0, client on CPU 1 (informational) | | | | | $(r .median.udp_pingpong_cross_cpu_p50_us 1) | $(r .median.udp_pingpong_cross_cpu_p99_us 1) | $(r '.median.udp_pingpong_cross_cpu_p50_us / .median.udp_pingpong_p50_us' 2) | |"
    fi
    echo
    cat "$TMP/ceiling.md"
    verdict() { jq -r "$1 | if . == null then \"n/a\" elif . then \"met\" else \"MISSED\" end" "$OUT_JSON"; }
    per_run() { jq -r -c "$1 | map(if . == null then null else . * 100 | round / 100 end)" "$OUT_JSON"; }
    echo "Targets (ratio of medians; then the median of the ratios paired within each run, and those):"
    echo
    echo "- AF_XDP WRITE bandwidth / Braid UDP WRITE bandwidth: $(r .ratio.xdp_bw_over_udp_bw 2) (target ≥ 2: $(verdict .targets.xdp_bw_at_least_2x_udp)); per run $(r .ratio_median_of_runs.xdp_bw_over_udp_bw 2) $(per_run .ratio_per_run.xdp_bw_over_udp_bw)"
    echo "- AF_XDP 8 B WRITE p50 / UDP ping-pong p50: $(r .ratio.xdp_p50_over_udp_pingpong_p50 2) (target < 1: $(verdict .targets.xdp_p50_below_udp_pingpong_p50)); per run $(r .ratio_median_of_runs.xdp_p50_over_udp_pingpong_p50 2) $(per_run .ratio_per_run.xdp_p50_over_udp_pingpong_p50)"
    if [ "$PIN" = 1 ]; then
        echo "- the same against the pinned ping-pong: same CPU $(r .ratio.xdp_p50_over_udp_pingpong_same_cpu_p50 2) $(per_run .ratio_per_run.xdp_p50_over_udp_pingpong_same_cpu_p50), cross CPU $(r .ratio.xdp_p50_over_udp_pingpong_cross_cpu_p50 2) $(per_run .ratio_per_run.xdp_p50_over_udp_pingpong_cross_cpu_p50)"
    fi
    echo "- measurements re-taken because other processes used more than $FOREIGN_WARN% of a CPU meanwhile: $(jq -r '.discarded | length' "$OUT_JSON")$(jq -r '.discarded | map("\(.label)\(if .test then " " + .test else "" end) run \(.run) (\(.foreign_cpu_pct)%)") | if length > 0 then ": " + join(", ") else "" end' "$OUT_JSON")"
    echo "- machine idle before each run (%): $(jq -r -c '[.machine[].idle_pct_before]' "$OUT_JSON")$(jq -r '[.machine[] | select(.busy_processes != "") | "run \(.run): \(.busy_processes)"] | if length > 0 then "; busy: " + join("; ") else "" end' "$OUT_JSON")"
    echo
    echo "Raw runs (bandwidth Gbit/s, latency p50 µs; each list in run order; * marks a measurement during"
    echo "which other processes used more than $FOREIGN_WARN% of a CPU, the figure after it):"
    echo
    jq -r --argjson w "$FOREIGN_WARN" '
        def f($d): . * pow(10; $d) | round / pow(10; $d);
        def mark(v): if .ok | not then "error" else (v | tostring) + (if (.foreign_cpu_pct // 0) > $w then " *\(.foreign_cpu_pct | round)%" else "" end) end;
        def list(v): map(mark(v)) | join(", ") | "[" + . + "]";
        [.runs[] | select(.label != null)] | group_by(.label) | .[]
        | .[0].label as $l
        | if $l == "iperf3-tcp" then "- iperf3 TCP: \(list(.bw_gbps | f(2)))"
          elif ($l | startswith("udp-pingpong")) then "- \($l) p50: \(list(.lat.p50_us | f(1)))"
          elif .[0].test == "ceiling" then "- \($l): delivered Gbit/s \(list(.bw_gbps | f(2))), kdatagrams/s \(list(.datagrams_per_s / 1000 | round))"
          elif .[0].test == "read_bw" or .[0].test == "send_bw" then "- Braid \($l): bw \(list(.bw_gbps | f(3)))"
          elif ($l | endswith("+8B")) or ($l | endswith("+8B-unsignaled")) then "- Braid \($l): msg/s \(list(.msg_rate | round))"
          else "- Braid \($l): bw \([.[] | select(.test == "write_bw")] | list(.bw_gbps | f(3)))"
             + (if any(.[]; .test == "write_lat") then ", p50 \([.[] | select(.test == "write_lat")] | list(.lat.p50_us | f(1)))" else "" end)
          end' "$OUT_JSON"
    if jq -e '[.runs[] | select(.ok | not)] | length > 0' "$OUT_JSON" >/dev/null; then
        echo
        echo "Failures:"
        echo
        jq -r '.runs[] | select(.ok | not) | "- run \(.run) \(.label) \(.test): exit \(.exit): \(.error)"' "$OUT_JSON"
    fi
    echo
    echo '```json'
    jq . "$OUT_JSON"
    echo '```'
} >"$OUT_MD"

# --- latency in matched polling modes: report ----------------------------------------------
# With RESULTS_NAME, beside its other files (NAME-latency.json), so a named run keeps the day's.
LAT_NAME=veth-latency-$DATE
[ -z "${RESULTS_NAME:-}" ] || LAT_NAME=$RESULTS_NAME-latency
OUT_LAT_JSON=$BENCH/results/$LAT_NAME.json
if [ -n "$LAT_MODES" ]; then
    # shellcheck disable=SC2086
    jq -s --argjson modes "$(printf '%s\n' $LAT_MODES | jq -R . | jq -s -c .)" \
        --argjson configs "$(printf '%s\n' $LAT_CONFIGS | jq -R . | jq -s -c .)" \
        --argjson runs "$RUNS" --argjson lat_iters "$LAT_ITERS" '
        def median: map(select(. != null)) | sort
            | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
              else (.[length / 2 - 1] + .[length / 2]) / 2 end;
        def div($a; $b): if $a == null or $b == null or $b == 0 then null else $a / $b end;
        def pct($r; $k): [$r[].lat[$k]] | median;
        . as $all
        | def ok($lb): [$all[] | select(.label == $lb and .ok)];
        {settings: {runs: $runs, lat_iters: $lat_iters, modes: $modes, configs: $configs},
         rows: [$modes[] as $m | ok("lat:udp-pingpong:" + $m) as $pp | $configs[] as $d | ok("lat:" + $d + ":" + $m) as $b
           | {mode: $m, datapath: $d, runs_ok: ($b | length),
              failures: ([$all[] | select(.label == ("lat:" + $d + ":" + $m) and (.ok | not))] | length),
              p50_us: pct($b; "p50_us"), p99_us: pct($b; "p99_us"), p999_us: pct($b; "p999_us"),
              pingpong_p50_us: pct($pp; "p50_us"), pingpong_p99_us: pct($pp; "p99_us"), pingpong_p999_us: pct($pp; "p999_us")}
           | .p50_over_pingpong_p50 = div(.p50_us; .pingpong_p50_us)
           | .p999_over_p50 = div(.p999_us; .p50_us)
           | .target_p50_ratio = (if .datapath == "xdp" then 1.0 else 1.5 end)
           | .p50_target_met = (if .p50_over_pingpong_p50 == null then null else .p50_over_pingpong_p50 <= .target_p50_ratio end)
           | .tail_target_met = (if .p999_over_p50 == null then null else .p999_over_p50 <= 3 end)],
         runs: [$all[] | select((.label // "") | startswith("lat:"))]}' "$RAW" >"$OUT_LAT_JSON"
    {
        echo
        echo "## 8 B WRITE round trip in matched polling modes"
        echo
        echo "Each Braid row next to a UDP ping-pong in the same polling mode, both measured in every run back to back; medians of $RUNS runs of $LAT_ITERS round trips. Targets: p50 ≤ 1.5x the ping-pong p50 on UDP sockets (≤ 1.0x on AF_XDP), p99.9 ≤ 3x p50. Raw runs: \`$(basename "$OUT_LAT_JSON")\`."
        echo
        echo "| mode | datapath | p50 µs | p99 µs | p99.9 µs | ping-pong p50 µs | p99 µs | p99.9 µs | p50 / ping-pong p50 (target) | p99.9 / p50 (target 3) |"
        echo "|---|---|---|---|---|---|---|---|---|---|"
        jq -r '
            def f($d): if . == null then "n/a" else . * pow(10; $d) | round / pow(10; $d) | tostring end;
            def v: if . == null then "n/a" elif . then "met" else "MISSED" end;
            .rows[] | "| \(.mode) | \(.datapath)\(if .failures > 0 then " (\(.failures) failed)" else "" end) | \(.p50_us | f(1)) | \(.p99_us | f(1)) | \(.p999_us | f(1)) | \(.pingpong_p50_us | f(1)) | \(.pingpong_p99_us | f(1)) | \(.pingpong_p999_us | f(1)) | \(.p50_over_pingpong_p50 | f(2)) (≤ \(.target_p50_ratio): \(.p50_target_met | v)) | \(.p999_over_p50 | f(2)) (\(.tail_target_met | v)) |"' "$OUT_LAT_JSON"
    } >"$TMP/lat-modes.md"
    cat "$TMP/lat-modes.md" >>"$OUT_MD"
fi

echo
sed -n '1,/^Raw runs/p' "$OUT_MD" | sed '$d'
if [ -n "$LAT_MODES" ]; then cat "$TMP/lat-modes.md"; fi
echo
echo "written: $OUT_MD"
echo "         $OUT_JSON"
if [ -n "$LAT_MODES" ]; then echo "         $OUT_LAT_JSON"; fi
