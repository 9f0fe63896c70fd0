#!/bin/sh
# The rdma smoke test of Braid's QEMU guest: rdma-core sees both Soft-RoCE devices, and
# ibv_rc_pingpong and perftest's ib_write_bw pass between rxe0 and rxe1 (one veth pair, RoCE
# v2 GID index 0). Run it with `scripts/guest/run.sh scripts/guest/smoke.sh`; it exits 0 only
# when every step succeeded. Iteration counts are small: the guest CPU is emulated.
set -u

step() { echo "== smoke: $*"; }
fail() { echo "SMOKE-FAILED: $*"; exit 1; }

# wait_listen PORT: until a TCP socket listens on PORT (the out-of-band exchange of
# ibv_rc_pingpong and perftest), up to 30 s.
wait_listen() {
    hex=$(printf '%04X' "$1")
    n=0
    until grep -qE ":$hex [0-9A-F]+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
        n=$((n + 1))
        [ "$n" -le 300 ] || return 1
        sleep 0.1
    done
}

step ibv_devices
ibv_devices >/tmp/devices || fail "ibv_devices exited $?"
cat /tmp/devices
grep -qw rxe0 /tmp/devices || fail "ibv_devices does not list rxe0"
grep -qw rxe1 /tmp/devices || fail "ibv_devices does not list rxe1"

step "ibv_rc_pingpong rxe0 <-> rxe1"
ibv_rc_pingpong -d rxe0 -g 0 -n 200 -p 18515 &
server=$!
wait_listen 18515 || fail "ibv_rc_pingpong server never listened"
ibv_rc_pingpong -d rxe1 -g 0 -n 200 -p 18515 127.0.0.1 || fail "ibv_rc_pingpong client exited $?"
wait "$server" || fail "ibv_rc_pingpong server exited $?"

step "ib_write_bw rxe0 <-> rxe1"
# perftest calibrates its cycle counter before it reports and gives up ("Correlation
# coefficient r^2 ... < 0.9, Can't produce a report") when its samples do not line up, which
# an emulated CPU sometimes causes. That says nothing of RDMA: only that refusal is run again
# (on a fresh port), at most three times in all; any other failure fails at once.
attempt=1
while :; do
    port=$((18515 + attempt))
    ib_write_bw -d rxe0 -x 0 -s 65536 -n 200 -p "$port" >/tmp/wbw-server.txt 2>&1 &
    server=$!
    wait_listen "$port" || fail "ib_write_bw server never listened"
    ib_write_bw -d rxe1 -x 0 -s 65536 -n 200 -p "$port" 127.0.0.1 >/tmp/wbw-client.txt 2>&1
    client=$?
    wait "$server"
    srv=$?
    cat /tmp/wbw-server.txt /tmp/wbw-client.txt
    [ "$client" -eq 0 ] && [ "$srv" -eq 0 ] && break
    grep -q "Correlation coefficient" /tmp/wbw-server.txt /tmp/wbw-client.txt \
        || fail "ib_write_bw client exited $client, server $srv"
    [ "$attempt" -lt 3 ] || fail "ib_write_bw: perftest's clock calibration failed 3 times"
    echo "== smoke: perftest's clock calibration failed (attempt $attempt); again"
    attempt=$((attempt + 1))
done

echo "SMOKE-PASSED"
