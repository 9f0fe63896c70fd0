#!/usr/bin/env bash
# Braid's libfabric provider next to libfabric's own socket providers, in one run:
# Debian's fi_pingpong -e rdm (one message in flight, so "bandwidth" is ping-pong throughput:
# size / half the round trip) at 64 B, 4 KiB, 64 KiB and 1 MiB through
#   braid, tcp;ofi_rxm, udp;ofi_rxd, net
# on loopback (-d lo, 127.0.0.1) and, as root, on a veth pair between two namespaces
# (scripts/netns.sh veth up; server in NS-b 10.9.0.2, client in NS-a 10.9.0.1).
# Each figure is the median of $RUNS runs; the providers take turns run by run (a run of each,
# then the next round), so load that comes and goes on a shared machine spreads over all of
# them instead of landing on one. Printed, and written with every raw run to
# bench/results/libfabric-<date>.md (or $OUT), with the ratios the targets are stated in:
#   latency  braid / tcp;ofi_rxm        (usec/xfer; target <= 1)
#   1 MiB    braid / tcp;ofi_rxm        (MB/s; target >= 1)
#   1 MiB    braid / udp;ofi_rxd        (MB/s; target >= 10)
# each as the ratio of the medians and as the median of the ratios paired within each run
# (with every run's), since one run's pair saw the same machine.
# A provider that fails a run (or is missing) is reported as "-".
#
# Needs libfabric-bin (installs it with scripts/libfabric.sh deps as root); builds braid-fi in
# release unless NO_BUILD=1.
# Settings (environment): RUNS=3 ITERS=1000 (64 B and 4 KiB) BIG_ITERS=1000 (64 KiB, 1 MiB;
#   fi_pingpong times the first message too, which sets up the connection: enough iterations
#   that this start-up does not weigh on the figure, bench/results/session-2026-12-07-s37.md)
#   PROVIDERS="braid tcp;ofi_rxm udp;ofi_rxd net" SIZES="64 4096 65536 1048576"
#   VETH=1 (0: loopback only) NS=bfab<pid> PORT=47590 (first control port; one per run)
#   TIMEOUT=120 (seconds per fi_pingpong run) CARGO_TARGET_DIR OUT (the results file)
#   BASE_SO=path/to/libbraid_fi.so: an earlier build of the provider, measured in the same
#     run as provider "braid@base" (for a before/after in one run, with its own ratio rows)
set -euo pipefail

BENCH=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
RUNS=${RUNS:-3}
ITERS=${ITERS:-1000}
BIG_ITERS=${BIG_ITERS:-1000}
PROVIDERS=${PROVIDERS:-braid tcp;ofi_rxm udp;ofi_rxd net}
SIZES=${SIZES:-64 4096 65536 1048576}
VETH=${VETH:-1}
NS=${NS:-bfab$$}
PORT=${PORT:-47590}
TIMEOUT=${TIMEOUT:-120}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
DATE=$(date -u +%Y-%m-%d)
OUT=${OUT:-$BENCH/results/libfabric-$DATE.md}
BASE_SO=${BASE_SO:-}
RAW=$(mktemp)
trap 'rm -f "$RAW"; [[ -n ${VETH_UP:-} ]] && "$ROOT/scripts/netns.sh" veth down "$NS" || true' EXIT

if [[ $(id -u) -eq 0 ]]; then "$ROOT/scripts/libfabric.sh" deps; fi
command -v fi_pingpong >/dev/null || { echo "needs fi_pingpong (libfabric-bin)" >&2; exit 1; }
if [[ ${NO_BUILD:-0} != 1 ]]; then
  (cd "$ROOT" && cargo build --release -p braid-fi)
fi
export FI_PROVIDER_PATH
FI_PROVIDER_PATH=$(CARGO_TARGET_DIR=$TARGET "$ROOT/scripts/libfabric.sh" path)
NEW_PATH=$FI_PROVIDER_PATH
if [[ -n $BASE_SO ]]; then
  BASE_DIR=$(mktemp -d)
  cp "$BASE_SO" "$BASE_DIR/libbraid_fi.so"
  trap 'rm -f "$RAW"; rm -rf "$BASE_DIR"; [[ -n ${VETH_UP:-} ]] && "$ROOT/scripts/netns.sh" veth down "$NS" || true' EXIT
  PROVIDERS="$PROVIDERS braid@base"
fi

if [[ $VETH == 1 && $(id -u) -eq 0 ]]; then
  "$ROOT/scripts/netns.sh" veth up "$NS"
  VETH_UP=1
  LINKS="lo veth"
else
  LINKS="lo"
fi

# run LINK PROVIDER SIZE → prints "usec MBps" from the client's result line, or "- -".
run() {
  local link=$1 prov=$2 size=$3 iters=$ITERS port=$((PORT++))
  FI_PROVIDER_PATH=$NEW_PATH
  if [[ $prov == braid@base ]]; then
    prov=braid
    FI_PROVIDER_PATH=$BASE_DIR
  fi
  ((size >= 65536)) && iters=$BIG_ITERS
  local sargs=(-p "$prov" -e rdm -S "$size" -I "$iters" -B "$port")
  local cargs=(-p "$prov" -e rdm -S "$size" -I "$iters" -P "$port")
  local spre=() cpre=() dst=127.0.0.1
  if [[ $link == lo ]]; then
    sargs+=(-d lo); cargs+=(-d lo)
  else
    spre=(ip netns exec "$NS-b"); cpre=(ip netns exec "$NS-a"); dst=10.9.0.2
    sargs+=(-d veth-b); cargs+=(-d veth-a)
  fi
  # tcp and udp name their domains after the interface too; net uses the interface name.
  "${spre[@]}" timeout "$TIMEOUT" fi_pingpong "${sargs[@]}" >/dev/null 2>&1 &
  local spid=$! line=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.3
    if line=$("${cpre[@]}" timeout "$TIMEOUT" fi_pingpong "${cargs[@]}" "$dst" 2>/dev/null | tail -1); then
      break
    fi
    line=""
    kill -0 "$spid" 2>/dev/null || break
  done
  wait "$spid" 2>/dev/null || true
  # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
  if [[ $line =~ ^[0-9] ]]; then
    awk '{print $7, $6}' <<<"$line"
  else
    echo "- -"
  fi
}

median() { # values on stdin ("-" ignored)
  grep -v '^-$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for link in $LINKS; do
  for size in $SIZES; do
    for r in $(seq "$RUNS"); do
      for prov in $PROVIDERS; do
        read -r usec mbps < <(run "$link" "$prov" "$size")
        echo "$link|$size|$prov|$r|$usec|$mbps" | tee -a "$RAW"
      done
    done
  done
done

get() { # LINK SIZE PROV FIELD(5=usec,6=MBps)
  awk -F'|' -v l="$1" -v s="$2" -v p="$3" -v f="$4" '$1==l && $2==s && $3==p {print $f}' "$RAW" | median
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a=="-"||b=="-"||b==0) print "-"; else printf "%.2f", a/b }'; }
# paired LINK SIZE PROV_A PROV_B FIELD → "median [r1, r2, ...]": A/B within each run (the
# providers take turns inside a run, so a run's pair saw the same machine), then their median.
paired() {
  awk -F'|' -v l="$1" -v s="$2" -v a="$3" -v b="$4" -v f="$5" '
    $1==l && $2==s && $3==a && $f!="-" {x[$4]=$f}
    $1==l && $2==s && $3==b && $f!="-" {y[$4]=$f}
    END {
      n=0
      for (r=1; r<=1000; r++) if ((r in x) && (r in y) && y[r]>0) v[++n]=x[r]/y[r]
      if (n==0) { print "-"; exit }
      list=""
      for (i=1; i<=n; i++) list=list (i>1 ? ", " : "") sprintf("%.2f", v[i])
      for (i=2; i<=n; i++) { t=v[i]; j=i-1; while (j>0 && v[j]>t) { v[j+1]=v[j]; j-- } v[j+1]=t }
      m=(n%2) ? v[(n+1)/2] : (v[n/2]+v[n/2+1])/2
      printf "%.2f [%s]", m, list
    }' "$RAW"
}

{
  echo "# libfabric providers: fi_pingpong -e rdm, $DATE"
  echo
  echo "Medians of $RUNS runs; $ITERS iterations (64 B, 4 KiB), $BIG_ITERS (64 KiB, 1 MiB)."
  echo "One message in flight: MB/s is ping-pong throughput. Machine: $(nproc) CPUs, load at the"
  echo "start $LOAD_START, at the end $(cut -d' ' -f1-3 /proc/loadavg)."
  for link in $LINKS; do
    echo
    echo "## $link"
    echo
    echo "| size | provider | usec/xfer | MB/s |"
    echo "|---|---|---|---|"
    for size in $SIZES; do
      for prov in $PROVIDERS; do
        echo "| $size | $prov | $(get "$link" "$size" "$prov" 5) | $(get "$link" "$size" "$prov" 6) |"
      done
    done
    echo
    echo "| ratio | of the medians | paired in each run: median [per run] | target |"
    echo "|---|---|---|---|"
    for size in $SIZES; do
      echo "| latency $size B: braid / tcp;ofi_rxm | $(ratio "$(get "$link" "$size" braid 5)" "$(get "$link" "$size" 'tcp;ofi_rxm' 5)") | $(paired "$link" "$size" braid 'tcp;ofi_rxm' 5) | <= 1 |"
    done
    big=$(echo "$SIZES" | awk '{print $NF}')
    echo "| $big B MB/s: braid / tcp;ofi_rxm | $(ratio "$(get "$link" "$big" braid 6)" "$(get "$link" "$big" 'tcp;ofi_rxm' 6)") | $(paired "$link" "$big" braid 'tcp;ofi_rxm' 6) | >= 1 |"
    echo "| $big B MB/s: braid / udp;ofi_rxd | $(ratio "$(get "$link" "$big" braid 6)" "$(get "$link" "$big" 'udp;ofi_rxd' 6)") | $(paired "$link" "$big" braid 'udp;ofi_rxd' 6) | >= 10 |"
    if [[ -n $BASE_SO ]]; then
      for size in $SIZES; do
        echo "| latency $size B: braid / braid@base | $(ratio "$(get "$link" "$size" braid 5)" "$(get "$link" "$size" braid@base 5)") | $(paired "$link" "$size" braid braid@base 5) | (before/after) |"
      done
    fi
  done
  echo
  echo "Raw runs (link|size|provider|run|usec/xfer|MB/s):"
  echo
  echo '```'
  cat "$RAW"
  echo '```'
} | tee "$OUT"
echo "written: $OUT" >&2
