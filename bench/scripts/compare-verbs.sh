#!/usr/bin/env bash
# Braid next to perftest on real kernel verbs, in one boot of the QEMU guest (scripts/guest/:
# Soft-RoCE devices rxe0 and rxe1 on the two ends of one veth pair, Debian's kernel under TCG):
#   perftest   ib_write_bw (SIZE, ITERS messages) and ib_write_lat (8 B, LAT_ITERS round
#              trips), server on rxe0, client on rxe1, GID index 0
#   braid      when BRAID_PERF names a braid-perf binary built with the verbs feature:
#              braid-perf client --test write_bw / write_lat with the same sizes and counts,
#              --backend verbs and --backend software (the software transport over the
#              guest's loopback UDP; both ends of rxe are in one namespace, so veth would
#              be routed locally anyway)
#   swfixed    the same software runs with a fixed window of FIXED_PACKETS (no congestion
#              control): on TCG the emulated host's own delay noise (hundreds of us to ms)
#              sits above Swift's target, so the default runs show what Swift makes of
#              that and these what the transport itself does
# Each figure is the median of RUNS runs; the ratios are what to read. The guest CPU is
# emulated (TCG), so absolute figures mean nothing and only ratios measured in this one boot
# do. Latency: ib_write_lat prints half a ping-pong round trip (t_typical), braid-perf
# write_lat a whole post-to-completion round trip (p50); the ratio compares braid's p50 with
# 2 x ib_write_lat's t_typical.
#
# Prints a Markdown table (and with OUT=FILE writes it there, with the raw runs).
# The guest console streams to stderr while it runs (each test prints "== start LABEL" and
# "== done LABEL rc=N after S s"), so a run that hangs shows which one; each client is killed
# after STEP_TIMEOUT seconds (its result is then "-", rc=124 or 143) and the rest go on.
# Settings (environment): RUNS=3 SIZE=65536 ITERS=1000 LAT_ITERS=1000 TIMEOUT=1200 (the
#   guest's whole run, seconds) STEP_TIMEOUT=240 (one client, seconds) BRAID_PERF=path
#   (optional) TESTS="perftest verbs sw swfixed" (which groups run) FIXED_PACKETS=64
#   BRAID_PERF_VERBS_SERVER / BRAID_PERF_VERBS_CLIENT (extra braid-perf arguments for the
#   verbs runs, default "--backend verbs"; e.g. to name the rxe device of each end)
#   BRAID_PERF_SW_ARGS (default "--backend software"; both ends of the software runs)
#   BRAID_PERF_SW_CLIENT (extra client-only arguments, e.g. "--cc fixed", which a server
#   does not take) KEEP_LOG=FILE (keeps the guest console)
# Root (qemu, the image build); scripts/guest/build-image.sh deps installs qemu.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
RUNS=${RUNS:-3}
SIZE=${SIZE:-65536}
ITERS=${ITERS:-1000}
LAT_ITERS=${LAT_ITERS:-1000}
TIMEOUT=${TIMEOUT:-1200}
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
TESTS=${TESTS:-perftest verbs sw swfixed}
FIXED_PACKETS=${FIXED_PACKETS:-64}
BRAID_PERF=${BRAID_PERF:-}
VS=${BRAID_PERF_VERBS_SERVER---backend verbs}
VC=${BRAID_PERF_VERBS_CLIENT---backend verbs}
SW=${BRAID_PERF_SW_ARGS---backend software}
SWC="$SW ${BRAID_PERF_SW_CLIENT:-}"
SWF="$SW --cc fixed --fixed-packets $FIXED_PACKETS"
OUT=${OUT:-}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [[ $(id -u) -eq 0 ]]; then "$ROOT/scripts/guest/build-image.sh" deps; fi

# The script the guest runs: every result as one line "RESULT <label> <run> <value>".
inner=$TMP/compare-verbs-guest.sh
cat >"$inner" <<EOF
#!/bin/sh
RUNS=$RUNS SIZE=$SIZE ITERS=$ITERS LAT_ITERS=$LAT_ITERS STEP=$STEP_TIMEOUT TESTS="$TESTS"
PERF=${BRAID_PERF:+/guest/bin/braid-perf}
VS="$VS" VC="$VC" SW="$SW" SWC="$SWC" SWF="$SWF"
EOF
cat >>"$inner" <<'EOF'
port=18600
t0=$(date +%s)
start() { echo "== start $1 run $run at $(($(date +%s) - t0)) s"; st=$(date +%s); }
done_() { echo "== done $1 run $run rc=$2 after $(($(date +%s) - st)) s"; }
want() { case " $TESTS " in *" $1 "*) return 0 ;; esac; return 1; }
wait_listen() { # PORT PID: until a TCP socket listens on PORT, up to 60 s, while PID lives
    hex=$(printf '%04X' "$1"); n=0
    until grep -qE ":$hex [0-9A-F]+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
        n=$((n + 1)); [ "$n" -le 600 ] && kill -0 "$2" 2>/dev/null || return 1; sleep 0.1
    done
}
perftest() { # LABEL TOOL ARGS...: up to 3 tries (perftest's own clock calibration fails
    # on an emulated, loaded CPU now and then: "Correlation coefficient r^2 < 0.9")
    try=1
    while :; do
        perftest_once "$@"
        case $v in ""|-|inf|*nan*) ;; *) return ;; esac
        [ "$try" -ge 3 ] && return
        try=$((try + 1)); echo "== retry $1 run $run (try $try)"
    done
}
perftest_once() { # LABEL TOOL ARGS...: server on rxe0, client on rxe1
    label=$1; tool=$2; shift 2; port=$((port + 1)); v=; start "$label"
    "$tool" -d rxe0 -x 0 -p "$port" "$@" >/tmp/server.out 2>&1 &
    s=$!
    wait_listen "$port" "$s" || { done_ "$label" listen; kill "$s" 2>/dev/null; [ "$try" -lt 3 ] || echo "RESULT $label $run -"; return; }
    timeout "$STEP" "$tool" -d rxe1 -x 0 -p "$port" "$@" 127.0.0.1 >/tmp/client.out 2>&1
    rc=$?; done_ "$label" "$rc"
    if [ "$rc" -eq 0 ] && wait "$s"; then
        cat /tmp/client.out
        case $tool in
        ib_write_bw) v=$(awk -v s="$SIZE" '$1 == s && NF >= 5 { print $4 }' /tmp/client.out) ;;
        ib_write_lat) v=$(awk '$1 == 8 && NF >= 6 { print $5 }' /tmp/client.out) ;;
        esac
        case $v in ""|-|inf|*nan*) [ "$try" -lt 3 ] && return; v=- ;; esac
        echo "RESULT $label $run ${v:--}"
    else
        cat /tmp/server.out /tmp/client.out
        kill "$s" 2>/dev/null
        [ "$try" -lt 3 ] && return
        echo "RESULT $label $run -"
    fi
}
braid() { # LABEL KEY SERVER_ARGS CLIENT_ARGS CLIENT_TEST_ARGS...: KEY is the JSON field
    label=$1; key=$2; sargs=$3; cargs=$4; shift 4; port=$((port + 1)); start "$label"
    # shellcheck disable=SC2086
    "$PERF" server --once --bind "127.0.0.1:$port" $sargs >/tmp/server.out 2>&1 &
    s=$!
    wait_listen "$port" "$s" || { done_ "$label" listen; cat /tmp/server.out; echo "RESULT $label $run -"; kill "$s" 2>/dev/null; return; }
    # shellcheck disable=SC2086
    timeout "$STEP" "$PERF" client "127.0.0.1:$port" $cargs --json --quiet "$@" >/tmp/client.out 2>&1
    rc=$?; done_ "$label" "$rc"
    if [ "$rc" -eq 0 ]; then
        cat /tmp/client.out; echo
        v=$(tr ',{}' '\n\n\n' </tmp/client.out | awk -F: -v k="$key" '$1 == "\"" k "\"" { print $2; exit }')
        echo "RESULT $label $run ${v:--}"
    else
        cat /tmp/server.out /tmp/client.out
        # A server whose client failed may wait for it forever (--once): stop it.
        kill "$s" 2>/dev/null
        echo "RESULT $label $run -"
    fi
    wait "$s" 2>/dev/null
}
run=1
while [ "$run" -le "$RUNS" ]; do
    echo "== run $run/$RUNS"
    if want perftest; then
        perftest perftest_bw ib_write_bw --report_gbits -s "$SIZE" -n "$ITERS"
        perftest perftest_lat ib_write_lat -s 8 -n "$LAT_ITERS"
    fi
    if [ -n "$PERF" ] && want verbs; then
        braid verbs_bw bw_gbps "$VS" "$VC" --test write_bw --size "$SIZE" --iters "$ITERS"
        braid verbs_lat p50_us "$VS" "$VC" --test write_lat --size 8 --iters "$LAT_ITERS"
    fi
    if [ -n "$PERF" ] && want sw; then
        braid sw_bw bw_gbps "$SW" "$SWC" --test write_bw --size "$SIZE" --iters "$ITERS"
        braid sw_lat p50_us "$SW" "$SWC" --test write_lat --size 8 --iters "$LAT_ITERS"
    fi
    if [ -n "$PERF" ] && want swfixed; then
        braid swf_bw bw_gbps "$SW" "$SWF" --test write_bw --size "$SIZE" --iters "$ITERS"
        braid swf_lat p50_us "$SW" "$SWF" --test write_lat --size 8 --iters "$LAT_ITERS"
    fi
    run=$((run + 1))
done
EOF
chmod +x "$inner"

files=()
if [[ -n $BRAID_PERF ]]; then
  [[ -x $BRAID_PERF ]] || { echo "compare-verbs.sh: BRAID_PERF=$BRAID_PERF is not executable" >&2; exit 1; }
  files=(--file "$BRAID_PERF:/guest/bin/braid-perf")
fi
load_before=$(uptime)
rc=0
# The console streams to stderr as the guest runs (stdout keeps only the table).
"$ROOT/scripts/guest/run.sh" --timeout "$TIMEOUT" --log "$TMP/console.log" \
  "${files[@]}" "$inner" >&2 || rc=$?
load_after=$(uptime)
[[ -n ${KEEP_LOG:-} ]] && cp "$TMP/console.log" "$KEEP_LOG"
if ((rc != 0)); then
  tail -n 60 "$TMP/console.log" >&2
  echo "compare-verbs.sh: the guest run failed (run.sh exit $rc)" >&2
  exit 1
fi

# median LABEL: the median of the label's numeric results ("-" when none).
median() {
  awk -v l="$1" '$1 == "RESULT" && $2 == l && $4 != "-" { print $4 }' "$TMP/console.log" |
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
runs_of() { awk -v l="$1" '$1 == "RESULT" && $2 == l { printf "%s ", $4 }' "$TMP/console.log"; }
ratio() { awk -v a="$1" -v b="$2" -v f="${3:-1}" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / (b * f) }'; }

pb=$(median perftest_bw)
pl=$(median perftest_lat)
vb=$(median verbs_bw)
vl=$(median verbs_lat)
sb=$(median sw_bw)
sl=$(median sw_lat)
fb=$(median swf_bw)
fl=$(median swf_lat)
{
  echo "Guest: $(grep -m1 'BRAID-GUEST-READY' "$TMP/console.log" | cut -d' ' -f3-); kernel $(cat "$ROOT/target/guest/image/kernel-version" 2>/dev/null || echo '?'), TCG (emulated CPU: only ratios mean anything)"
  echo "Host load before: $load_before"
  echo "Host load after:  $load_after"
  echo "Settings: RUNS=$RUNS SIZE=$SIZE ITERS=$ITERS LAT_ITERS=$LAT_ITERS STEP=$STEP_TIMEOUT TESTS="$TESTS"; braid-perf: ${BRAID_PERF:-not given}"
  echo
  echo "| test | median | runs |"
  echo "|---|---|---|"
  echo "| perftest ib_write_bw $SIZE B, Gbit/s | $pb | $(runs_of perftest_bw)|"
  echo "| perftest ib_write_lat 8 B, t_typical us (half round trip) | $pl | $(runs_of perftest_lat)|"
  if [[ -n $BRAID_PERF ]]; then
    echo "| braid-perf --backend verbs write_bw $SIZE B, Gbit/s | $vb | $(runs_of verbs_bw)|"
    echo "| braid-perf --backend verbs write_lat 8 B, p50 us (round trip) | $vl | $(runs_of verbs_lat)|"
    echo "| braid-perf --backend software write_bw $SIZE B, Gbit/s | $sb | $(runs_of sw_bw)|"
    echo "| braid-perf --backend software write_lat 8 B, p50 us (round trip) | $sl | $(runs_of sw_lat)|"
    echo "| braid-perf --backend software --cc fixed ($FIXED_PACKETS packets) write_bw $SIZE B, Gbit/s | $fb | $(runs_of swf_bw)|"
    echo "| braid-perf --backend software --cc fixed ($FIXED_PACKETS packets) write_lat 8 B, p50 us (round trip) | $fl | $(runs_of swf_lat)|"
    echo
    echo "| ratio | value |"
    echo "|---|---|"
    echo "| bandwidth: braid verbs / ib_write_bw | $(ratio "$vb" "$pb") |"
    echo "| bandwidth: braid software / ib_write_bw | $(ratio "$sb" "$pb") |"
    echo "| bandwidth: braid software / braid verbs | $(ratio "$sb" "$vb") |"
    echo "| latency: braid verbs p50 / (2 x ib_write_lat) | $(ratio "$vl" "$pl" 2) |"
    echo "| latency: braid software p50 / (2 x ib_write_lat) | $(ratio "$sl" "$pl" 2) |"
    echo "| latency: braid software / braid verbs | $(ratio "$sl" "$vl") |"
    echo "| bandwidth: braid software, fixed window / ib_write_bw | $(ratio "$fb" "$pb") |"
    echo "| bandwidth: braid software, fixed window / braid verbs | $(ratio "$fb" "$vb") |"
    echo "| latency: braid software, fixed window p50 / (2 x ib_write_lat) | $(ratio "$fl" "$pl" 2) |"
    echo "| latency: braid software, fixed window / braid verbs | $(ratio "$fl" "$vl") |"
  fi
} | tee "$TMP/table.md"
if [[ -n $OUT ]]; then
  {
    cat "$TMP/table.md"
    echo
    echo "Raw results (RESULT label run value):"
    echo
    echo '```'
    grep '^RESULT' "$TMP/console.log"
    echo '```'
  } >"$OUT"
  echo "compare-verbs.sh: wrote $OUT" >&2
fi
