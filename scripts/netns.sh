#!/usr/bin/env bash
# Network namespaces for Braid, by hand and for benchmark scripts: the same two topologies
# the Rust harness (tests/netns, crate braid-netns) builds for the integration tests.
set -Eeuo pipefail

usage() {
  cat <<'EOF'
usage: scripts/netns.sh COMMAND ...   (as root)

  veth up NAME [MTU]  two namespaces NAME-a and NAME-b joined by one veth:
                        NAME-a  dev veth-a  10.9.0.1/24  <->  10.9.0.2/24  dev veth-b  NAME-b
                      MTU (default 1500) on both ends, e.g. 9000 for jumbo frames
  veth down NAME      deletes them

  testbed up NAME     the 4-path ECMP testbed:
                        NAME-ha (hostA, dev eth0, 10.10.0.1)
                          -- NAME-rl (routerL) == 4 veth links p0..p3 (10.11.K.1 - 10.11.K.2) ==
                        NAME-rr (routerR) -- NAME-hb (hostB, dev eth0, 10.12.0.2)
                      forwarding on, rp_filter off, 4-way multipath routes both ways hashing
                      addresses + protocol + ports (fib_multipath_hash_policy=3,
                      fib_multipath_hash_fields=0x37, a fixed fib_multipath_hash_seed), static
                      neighbour entries everywhere (AF_XDP senders do no ARP)
  testbed down NAME   deletes it

  rate NAME PATH MBIT   tbf on routerL's side of path PATH (0-3), towards hostB; MBIT 0 removes
  counters NAME         packets per path: routerL -> routerR (forward), routerR -> routerL (reverse)
  route NAME SPORT DPORT  which path routerL picks for UDP hostA:SPORT -> hostB:DPORT
  deps                  installs what is missing with apt-get: iproute2 (ip, tc, ss), iperf3,
                        mptcpd (mptcpize, to run iperf3 over MPTCP), jq

Run commands inside with `ip netns exec NAME-ha ...` (e.g. braid-perf or iperf3).

Loss, ECN marking and black holes are not available here: this kernel has no netem qdisc, so
they come from an XDP program (braid_netns::netem) that only the Rust harness loads:
braid_netns::Testbed4::set_netem / blackhole / netem_counters. For a script, the braid-testbed
binary (crate braid-netns) builds the same testbed with rates, loss and marking and holds it up
(see bench/scripts/compare-testbed.sh).
EOF
}

die() { echo "netns.sh: $*" >&2; exit 1; }

deps() {
  local missing=()
  command -v ip >/dev/null && command -v tc >/dev/null && command -v ss >/dev/null || missing+=(iproute2)
  command -v iperf3 >/dev/null || missing+=(iperf3)
  command -v mptcpize >/dev/null || missing+=(mptcpd) # mptcpize runs TCP programs over MPTCP
  command -v jq >/dev/null || missing+=(jq)
  if ((${#missing[@]})); then
    echo "netns.sh: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# in NS FILE VALUE: writes a sysctl inside namespace NS.
sysctl_in() {
  ip netns exec "$1" sh -c "echo $3 > /proc/sys/$2"
}

# A fresh namespace with lo up and IPv6 off (no ND/MLD chatter in the packet counters).
new_ns() {
  ip netns add "$1"
  ip -n "$1" link set lo up
  sysctl_in "$1" net/ipv6/conf/all/disable_ipv6 1 2>/dev/null || true
  sysctl_in "$1" net/ipv6/conf/default/disable_ipv6 1 2>/dev/null || true
}

# link NS_A IF_A IP_A MAC_A NS_B IF_B IP_B MAC_B: a veth between two namespaces, addressed
# (/24), up, with permanent neighbour entries both ways.
link() {
  local nsa=$1 ifa=$2 ipa=$3 maca=$4 nsb=$5 ifb=$6 ipb=$7 macb=$8
  ip -n "$nsa" link add "$ifa" address "$maca" type veth peer name "$ifb" address "$macb" netns "$nsb"
  ip -n "$nsa" addr add "$ipa/24" dev "$ifa"
  ip -n "$nsb" addr add "$ipb/24" dev "$ifb"
  ip -n "$nsa" link set "$ifa" up
  ip -n "$nsb" link set "$ifb" up
  ip -n "$nsa" neigh replace "$ipb" lladdr "$macb" dev "$ifa" nud permanent
  ip -n "$nsb" neigh replace "$ipa" lladdr "$maca" dev "$ifb" nud permanent
}

# Fails if any of the namespaces exists already (so a second `up` never touches the first).
check_free() {
  for ns in "$@"; do
    [[ ! -e /var/run/netns/$ns ]] || die "namespace $ns exists already (run \`down\` first)"
  done
}

del_ns() {
  for ns in "$@"; do
    ip netns del "$ns" 2>/dev/null || true
  done
}

veth_up() {
  local n=$1 mtu=${2:-1500}
  [[ $mtu =~ ^[0-9]+$ ]] && ((mtu >= 68 && mtu <= 65535)) || die "MTU must be 68 to 65535"
  new_ns "$n-a"
  new_ns "$n-b"
  link "$n-a" veth-a 10.9.0.1 02:b5:09:00:00:01 "$n-b" veth-b 10.9.0.2 02:b5:09:00:00:02
  ip -n "$n-a" link set veth-a mtu "$mtu"
  ip -n "$n-b" link set veth-b mtu "$mtu"
  echo "veth $n: $n-a veth-a 10.9.0.1 <-> 10.9.0.2 veth-b $n-b (MTU $mtu)"
}

testbed_up() {
  local n=$1 k
  for ns in ha rl rr hb; do new_ns "$n-$ns"; done
  for r in rl rr; do
    sysctl_in "$n-$r" net/ipv4/ip_forward 1
    sysctl_in "$n-$r" net/ipv4/conf/all/rp_filter 0
    sysctl_in "$n-$r" net/ipv4/conf/default/rp_filter 0
    sysctl_in "$n-$r" net/ipv4/fib_multipath_hash_policy 3
    sysctl_in "$n-$r" net/ipv4/fib_multipath_hash_fields 55 # 0x37
    # Linux 6.11 and later; the Rust harness uses the same seed (braid_netns::HASH_SEED).
    sysctl_in "$n-$r" net/ipv4/fib_multipath_hash_seed 192552286 2>/dev/null || true
  done
  link "$n-ha" eth0 10.10.0.1 02:b5:0a:00:00:01 "$n-rl" toA 10.10.0.2 02:b5:0a:00:00:02
  for k in 0 1 2 3; do
    link "$n-rl" "p$k" "10.11.$k.1" "02:b5:0b:0$k:00:01" "$n-rr" "p$k" "10.11.$k.2" "02:b5:0b:0$k:00:02"
  done
  link "$n-rr" toB 10.12.0.1 02:b5:0c:00:00:01 "$n-hb" eth0 10.12.0.2 02:b5:0c:00:00:02
  ip -n "$n-ha" route add default via 10.10.0.2 dev eth0
  ip -n "$n-hb" route add default via 10.12.0.1 dev eth0
  local fwd="" rev=""
  for k in 0 1 2 3; do
    fwd="$fwd nexthop via 10.11.$k.2 dev p$k weight 1"
    rev="$rev nexthop via 10.11.$k.1 dev p$k weight 1"
  done
  # shellcheck disable=SC2086 # word splitting of the nexthop lists is intended
  ip -n "$n-rl" route add 10.12.0.0/24 $fwd
  # shellcheck disable=SC2086
  ip -n "$n-rr" route add 10.10.0.0/24 $rev
  echo "testbed $n: hostA $n-ha 10.10.0.1 -> routerL $n-rl -> p0..p3 -> routerR $n-rr -> hostB $n-hb 10.12.0.2"
}

rate() {
  local n=$1 path=$2 mbit=$3
  [[ $path =~ ^[0-3]$ ]] || die "PATH must be 0 to 3"
  if [[ $mbit == 0 ]]; then
    tc -n "$n-rl" qdisc del dev "p$path" root 2>/dev/null || true
    return
  fi
  # A burst of 1 ms at the rate (at least 4 frames), a queue of about 10 ms.
  local per_ms=$((mbit * 1000000 / 8 / 1000))
  local burst=$((per_ms > 6056 ? per_ms : 6056))
  local limit=$((10 * per_ms > burst + 6056 ? 10 * per_ms : burst + 6056))
  tc -n "$n-rl" qdisc replace dev "p$path" root tbf rate "${mbit}mbit" burst "$burst" limit "$limit"
}

counters() {
  local n=$1 k f r
  for k in 0 1 2 3; do
    f=$(ip netns exec "$n-rl" cat "/sys/class/net/p$k/statistics/tx_packets")
    r=$(ip netns exec "$n-rr" cat "/sys/class/net/p$k/statistics/tx_packets")
    echo "path $k: forward $f reverse $r"
  done
}

route() {
  ip -n "$1-rl" route get 10.12.0.2 from 10.10.0.1 iif toA ipproto udp sport "$2" dport "$3"
}

[[ $# -ge 1 ]] || { usage; exit 1; }
cmd=$1
shift
case "$cmd" in
  -h | --help | help) usage ;;
  deps) deps ;;
  veth | testbed)
    [[ $# -eq 2 || ( $# -eq 3 && "$cmd $1" == "veth up" ) ]] || { usage; exit 1; }
    [[ $(id -u) -eq 0 ]] || die "needs root"
    deps
    case "$cmd $1" in
      "veth up")
        check_free "$2-a" "$2-b"
        trap 'del_ns "$2-a" "$2-b"; die "veth up failed; cleaned up"' ERR
        veth_up "$2" "${3:-1500}"
        ;;
      "veth down") del_ns "$2-a" "$2-b" ;;
      "testbed up")
        check_free "$2-ha" "$2-rl" "$2-rr" "$2-hb"
        trap 'del_ns "$2-ha" "$2-rl" "$2-rr" "$2-hb"; die "testbed up failed; cleaned up"' ERR
        testbed_up "$2"
        ;;
      "testbed down") del_ns "$2-ha" "$2-rl" "$2-rr" "$2-hb" ;;
      *) usage; exit 1 ;;
    esac
    ;;
  rate) [[ $# -eq 3 ]] || { usage; exit 1; }; rate "$@" ;;
  counters) [[ $# -eq 1 ]] || { usage; exit 1; }; counters "$1" ;;
  route) [[ $# -eq 3 ]] || { usage; exit 1; }; route "$@" ;;
  *) usage; exit 1 ;;
esac
