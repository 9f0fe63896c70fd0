#!/usr/bin/env python3
"""Where Braid's threads spent their samples in a `perf record -a -g` file (profile-veth.sh
PERF_RECORD=1 keeps them), by thread and by cost, in % of that thread's samples.

Usage: perf-breakdown.py PERF_DATA [PID ...]   (default: every braid-progress thread)

Kernel costs are inclusive (through the call chains, which are complete in the kernel):
  send syscall        sendmmsg/sendmsg, less the receive softirq run inside it
  rx softirq in send  the peer's receive path (veth -> IP -> UDP -> socket, and the wake-up
                      of the peer's thread), which veth runs on the sending CPU
  recv syscall        recvmmsg/recvmsg (copy to user, skb free)
  poll / sleep        ppoll, futex, eventfd read/write (waiting and waking up)
  other kernel        interrupts, timers, page faults
User costs are self time (Rust code here has no frame pointers, so no call chains):
  copy                Region::read / Region::write (payload to and from registered memory)
  crc32c              the crc32c crate
  cc                  braid_cc (path scoring, Swift)
  engine              braid_proto, less the above
  runtime+datapath    braid (runtime), braid_datapath, libc, the rest of user space
"""
import collections
import re
import subprocess
import sys


def report(data, children):
    args = ["perf", "report", "-i", data, "--comms", "braid-progress", "-g", "none",
            "--sort", "pid,dso,sym", "--stdio"]
    args.append("--children" if children else "--no-children")
    out = subprocess.run(args, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        if children:
            m = re.match(r"\s+([\d.]+)%\s+([\d.]+)%\s+(\d+):\S+\s+(\S+)\s+\[(.)\]\s+(.*)", line)
            if m:
                rows.append((int(m[3]), m[4], m[5], m[6].strip(), float(m[1]), float(m[2])))
        else:
            m = re.match(r"\s+([\d.]+)%\s+(\d+):\S+\s+(\S+)\s+\[(.)\]\s+(.*)", line)
            if m:
                rows.append((int(m[2]), m[3], m[4], m[5].strip(), float(m[1]), float(m[1])))
    return rows


def main():
    data = sys.argv[1]
    want = {int(p) for p in sys.argv[2:]}
    incl = collections.defaultdict(dict)
    for pid, dso, kind, sym, total, _ in report(data, True):
        if kind == "k":
            incl[pid][sym] = incl[pid].get(sym, 0.0) + total
    selfs = report(data, False)
    totals = collections.Counter()
    user = collections.defaultdict(collections.Counter)
    for pid, dso, kind, sym, total, _ in selfs:
        totals[pid] += total
        if kind == "k":
            continue
        if "Region::read" in sym or "Region::write" in sym:
            cat = "copy"
        elif "crc32c" in sym:
            cat = "crc32c"
        elif sym.startswith("braid_cc") or "braid_cc::" in sym:
            cat = "cc"
        elif "braid_proto" in sym:
            cat = "engine"
        else:
            cat = "runtime+datapath"
        user[pid][cat] += total
    kernel_self = collections.Counter()
    for pid, dso, kind, sym, total, _ in selfs:
        if kind == "k":
            kernel_self[pid] += total
    pids = sorted(p for p in totals if not want or p in want)
    cats = ["send syscall", "rx softirq in send", "recv syscall", "poll / sleep", "other kernel",
            "copy", "crc32c", "cc", "engine", "runtime+datapath"]
    print("| thread (tid) | samples % of all | " + " | ".join(cats) + " |")
    print("|---|---:|" + "---:|" * len(cats))
    for pid in pids:
        k = incl[pid]
        send = k.get("__x64_sys_sendmmsg", 0.0) + k.get("__x64_sys_sendmsg", 0.0)
        sirq = min(send, k.get("do_softirq.part.0", 0.0) + k.get("do_softirq", 0.0))
        recv = k.get("__x64_sys_recvmmsg", 0.0) + k.get("__x64_sys_recvmsg", 0.0)
        poll = sum(k.get(f"__x64_sys_{c}", 0.0) for c in ("ppoll", "poll", "futex", "write", "read"))
        # Sleeping outside poll (futex is counted above; schedule inside poll is in poll).
        kern = kernel_self[pid]
        other = max(0.0, kern - send - recv - poll)
        row = [send - sirq, sirq, recv, poll, other] + [user[pid][c] for c in cats[5:]]
        t = totals[pid]
        print(f"| {pid} | {t:.2f} | " + " | ".join(f"{100 * v / t:.0f}" for v in row) + " |")


main()
