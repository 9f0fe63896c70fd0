#!/usr/bin/env bash
# Runs one command inside Braid's QEMU guest (real kernel verbs: two Soft-RoCE devices rxe0
# and rxe1 on the two ends of one veth pair, see scripts/guest/init) and exits with the
# command's exit status.
#
# The image comes from scripts/guest/build-image.sh (cached under target/guest). Each run
# packs a second, uncompressed cpio archive (the overlay: /guest/cmd, /guest/token, the
# executable and what `ldd` lists for it, extra files) and hands the kernel both archives
# concatenated as one initrd; the kernel unpacks them in order, the overlay on top. QEMU runs
# under TCG (the /dev/kvm of these machines is paravirtual and cannot boot a stock kernel).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/guest/run.sh [OPTIONS] [--] COMMAND [ARGS...]

COMMAND is a host file when it contains a slash (copied into the guest as
/guest/bin/<name>, with the shared libraries ldd lists for it), else a program of the guest
image (busybox applets, ibv_*, ib_write_bw and the rest of perftest, rdma, /usr/sbin/ip), e.g.
`sh -c '...'`. It runs in /guest as root, with PATH=/usr/sbin:/usr/bin:busybox and
BRAID_IN_GUEST=1 set.

Options:
  --timeout SECS   kill the guest after SECS seconds (default $BRAID_GUEST_TIMEOUT or 300)
  --file HOST[:GUEST]  copy a host file or folder into the guest (default GUEST path: HOST's
                   absolute path; a relative GUEST is under /guest), with the libraries ldd
                   lists for an executable file; repeatable
  --files LIST     a file listing one HOST[:GUEST] per line
  --env NAME       pass the host variable NAME through as well (BRAID_*, RUST_* and
                   RUST_BACKTRACE always pass); repeatable
  --log FILE       keep the guest console in FILE (it is always streamed to stdout)
  --mem MIB        guest memory (default $BRAID_GUEST_MEM or 1024)
  --quiet          do not stream the console (the log still keeps it)

Exit status: the guest command's own status (0-123 and 127+ pass as they are), or
  124  the guest timed out (killed after --timeout seconds)
  125  the guest never reported a status (setup failed, kernel panic, qemu died)
  126  the harness itself failed (bad arguments, no image, no qemu)
A command that itself exits 124-126 is indistinguishable from these: the last status line
("BRAID-GUEST-EXIT <token> <status>") is in the log when it matters.
EOF
}

here=$(cd "$(dirname "$0")" && pwd)

harness_fail() {
  echo "run.sh: $*" >&2
  exit 126
}

timeout_s=${BRAID_GUEST_TIMEOUT:-300}
mem=${BRAID_GUEST_MEM:-1024}
logfile=""
quiet=0
files=()
extra_env=()
while (($#)); do
  case $1 in
  --timeout) timeout_s=${2:?}; shift 2 ;;
  --file) files+=("${2:?}"); shift 2 ;;
  --files)
    [[ -r ${2:?} ]] || harness_fail "cannot read $2"
    while IFS= read -r line; do [[ -n $line ]] && files+=("$line"); done <"$2"
    shift 2
    ;;
  --env) extra_env+=("${2:?}"); shift 2 ;;
  --log) logfile=${2:?}; shift 2 ;;
  --mem) mem=${2:?}; shift 2 ;;
  --quiet) quiet=1; shift ;;
  -h | --help) usage; exit 0 ;;
  --) shift; break ;;
  -*) usage >&2; harness_fail "unknown option $1" ;;
  *) break ;;
  esac
done
(($#)) || { usage >&2; harness_fail "no command"; }
[[ $timeout_s =~ ^[0-9]+$ ]] || harness_fail "--timeout wants whole seconds"
command -v qemu-system-x86_64 >/dev/null ||
  harness_fail "qemu-system-x86_64 missing (scripts/guest/build-image.sh deps installs it)"

image=$("$here/build-image.sh") || harness_fail "building the guest image failed"

run=$(mktemp -d "${TMPDIR:-/tmp}/braid-guest.XXXXXX")
qpid=""
cleanup() {
  if [[ -n $qpid ]] && kill -0 "$qpid" 2>/dev/null; then kill "$qpid" 2>/dev/null || true; fi
  rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# quote WORD: WORD in single quotes for the guest's sh.
quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

ov=$run/overlay
mkdir -p "$ov/guest/bin" "$ov/usr/lib/x86_64-linux-gnu" "$ov/usr/lib64"
cmd=$1
shift
if [[ $cmd == */* ]]; then
  [[ -f $cmd && -x $cmd ]] || harness_fail "$cmd is not an executable file"
  cp -L "$cmd" "$ov/guest/bin/"
  "$here/build-image.sh" libs "$ov" "$cmd" || harness_fail "copying the libraries of $cmd failed"
  cmd=/guest/bin/$(basename "$cmd")
fi
for spec in ${files[@]+"${files[@]}"}; do
  src=${spec%%:*}
  dst=${spec#*:}
  [[ $spec == *:* ]] || dst=$(realpath "$src")
  [[ -e $src ]] || harness_fail "--file $src does not exist"
  [[ $dst == /* ]] || dst=/guest/$dst
  mkdir -p "$ov$(dirname "$dst")"
  cp -a -L "$src" "$ov$dst"
  # An extra program brings its libraries too (ldd fails on anything else, which is skipped).
  [[ -f $src && -x $src ]] && { "$here/build-image.sh" libs "$ov" "$src" || harness_fail "copying the libraries of $src failed"; }
done

token=$(od -An -tx8 -N8 /dev/urandom | tr -d ' \n')
echo "$token" >"$ov/guest/token"
{
  echo '#!/bin/sh'
  echo 'export BRAID_IN_GUEST=1'
  while IFS='=' read -r name _; do
    case $name in BRAID_GUEST_*) continue ;; BRAID_* | RUST_*) ;; *) continue ;; esac
    echo "export $name=$(quote "${!name}")"
  done < <(env)
  for name in ${extra_env[@]+"${extra_env[@]}"}; do
    [[ -n ${!name+x} ]] && echo "export $name=$(quote "${!name}")"
  done
  printf 'exec %s' "$(quote "$cmd")"
  for a in "$@"; do printf ' %s' "$(quote "$a")"; done
  echo
} >"$ov/guest/cmd"
chmod 755 "$ov/guest/cmd"

# The overlay stays uncompressed: the emulated CPU would spend longer in gunzip than the
# host in writing the bytes.
(cd "$ov" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$run/overlay.cpio"
cat "$image/base.cpio.gz" "$run/overlay.cpio" >"$run/initrd"

[[ -n $logfile ]] || logfile=$run/console.log
: >"$logfile"
qemu=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$mem" -smp 2
  -nodefaults -no-user-config -display none -monitor none -nic none -no-reboot
  -chardev stdio,id=con,signal=off -serial chardev:con
  -kernel "$image/vmlinuz" -initrd "$run/initrd"
  -append "console=ttyS0 panic=-1 quiet")

# QEMU in the background so the trap can stop it; the console goes to the log (and stdout).
started=$(date +%s)
timed_out=0
"${qemu[@]}" </dev/null >"$run/console.raw" 2>&1 &
qpid=$!
tail_pid=""
if ((!quiet)); then
  tail -n +1 -F --pid="$qpid" "$run/console.raw" 2>/dev/null | tr -d '\r' &
  tail_pid=$!
fi
while kill -0 "$qpid" 2>/dev/null; do
  if (($(date +%s) - started >= timeout_s)); then
    timed_out=1
    kill "$qpid" 2>/dev/null || true
    sleep 1
    kill -KILL "$qpid" 2>/dev/null || true
    break
  fi
  sleep 0.2
done
wait "$qpid" 2>/dev/null || true
qpid=""
[[ -n $tail_pid ]] && wait "$tail_pid" 2>/dev/null || true
tr -d '\r' <"$run/console.raw" >"$logfile"

elapsed=$(($(date +%s) - started))
if ((timed_out)); then
  echo "run.sh: guest timed out after ${timeout_s}s" >&2
  exit 124
fi
status=$(awk -v t="$token" '$1 == "BRAID-GUEST-EXIT" && $2 == t { s = $3 } END { print s }' "$logfile")
if [[ ! $status =~ ^[0-9]+$ ]]; then
  setup=$(grep -m1 'BRAID-GUEST-SETUP-FAILED' "$logfile" || true)
  echo "run.sh: the guest never reported a status${setup:+ ($setup)} after ${elapsed}s" >&2
  exit 125
fi
echo "run.sh: guest command exited with $status after ${elapsed}s" >&2
exit "$status"
