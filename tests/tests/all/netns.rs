//! Braid over real network namespaces: devices opened inside namespaces (`Netns::run`), on a
//! veth pair and on the four-path ECMP testbed of LAB.md, through real kernel forwarding,
//! tbf rate limits and XDP fault injection (`braid-netns`).
//!
//! Root only: without root every test prints `SKIPPED <test>` and passes, except under CI
//! (`CI` set), where it fails. Each scenario is a function taking the datapath of each side,
//! so a variant for another datapath (AF_XDP both sides, AF_XDP against UDP, io_uring) is a
//! three-line test. Run them with their counters printed:
//! `cargo test -p braid-tests netns -- --nocapture`.
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use braid::{
    Access, Completion, CompletionQueue, DatapathKind, Device, DeviceConfig, MemoryRegion,
    ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use braid_netns::{
    NetemConfig, Netns, PathCounters, TESTBED_PATHS, Testbed4, VethPair, path_delta, require_root,
    setup,
};

use braid_tests::oracle::Memory;

use crate::support::random_mr;

/// The UDP port every device binds (each namespace has its own port space).
const PORT: u16 = 4791;
/// Longest wait for one completion; a test takes at most a few seconds when it passes.
const WAIT: Duration = Duration::from_secs(15);
/// Paths (source ports) per device.
const PATHS: u16 = 16;

/// Where a device lives: its namespace, interface and address.
#[derive(Copy, Clone)]
struct Host<'a> {
    ns: &'a Netns,
    ifname: &'a str,
    ip: Ipv4Addr,
}

/// One open device with a connected (later) QP.
struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

/// The one place that turns a datapath kind and a host into a device configuration.
fn device_config(kind: DatapathKind, host: Host<'_>) -> DeviceConfig {
    // AF_XDP binds the queue of the host's one interface.
    DeviceConfig::udp(SocketAddr::from((host.ip, PORT)))
        .paths(PATHS)
        .datapath(kind)
        .interface(host.ifname)
}

/// Opens a device inside `host`'s namespace, so its sockets and progress thread live there.
fn open(kind: DatapathKind, host: Host<'_>) -> Side {
    let cfg = device_config(kind, host);
    let dev = host
        .ns
        .run(|| Device::open(cfg))
        .unwrap_or_else(|e| panic!("open a {kind:?} device in {}: {e}", host.ns.name()));
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = pd.create_qp(&cq, &cq).expect("create a QP");
    Side { dev, pd, cq, qp }
}

/// Opens a device on each host and connects their QPs.
fn pair(kind_a: DatapathKind, a: Host<'_>, kind_b: DatapathKind, b: Host<'_>) -> (Side, Side) {
    let (a, b) = (open(kind_a, a), open(kind_b, b));
    a.qp.connect(b.qp.info()).expect("connect a");
    b.qp.connect(a.qp.info()).expect("connect b");
    (a, b)
}

fn veth_hosts(v: &VethPair) -> (Host<'_>, Host<'_>) {
    (
        Host {
            ns: v.a(),
            ifname: v.if_a(),
            ip: v.ip_a(),
        },
        Host {
            ns: v.b(),
            ifname: v.if_b(),
            ip: v.ip_b(),
        },
    )
}

fn testbed_hosts(t: &Testbed4) -> (Host<'_>, Host<'_>) {
    (
        Host {
            ns: t.host_a(),
            ifname: &t.end_a().ifname,
            ip: t.ip_a(),
        },
        Host {
            ns: t.host_b(),
            ifname: &t.end_b().ifname,
            ip: t.ip_b(),
        },
    )
}

fn contents(mr: &MemoryRegion) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read(0, &mut v).expect("whole region");
    v
}

fn word(mr: &MemoryRegion, off: u64) -> u64 {
    let mut b = [0u8; 8];
    mr.read(off, &mut b).expect("in bounds");
    u64::from_ne_bytes(b)
}

fn wait(cq: &CompletionQueue, what: &str) -> Completion {
    cq.wait(WAIT)
        .unwrap_or_else(|| panic!("no completion for {what} within {WAIT:?}"))
}

fn wr(wr_id: u64, op: SendOp, sges: Vec<Sge>) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges,
        signaled: true,
    }
}

/// Every operation over a veth pair, byte-exact, multi-KiB and multi-MiB, on 16 paths:
/// WRITE, READ, SEND, SEND_IMM, WRITE_IMM, FETCH_ADD and CMP_SWAP (matching and not).
fn every_operation_is_byte_exact_over_veth(test: &str, kind_a: DatapathKind, kind_b: DatapathKind) {
    if !require_root(test) {
        return;
    }
    let Some(veth) = setup(test, VethPair::new()) else {
        return;
    };
    let started = Instant::now();
    let (ha, hb) = veth_hosts(&veth);
    let (a, b) = pair(kind_a, ha, kind_b, hb);
    const MIB: usize = 1 << 20;

    let (src, src_data) = random_mr(&a.pd, 8 * MIB, Access::NONE, 21);
    let (rdst, rdst_before) = random_mr(&a.pd, 4 * MIB, Access::LOCAL_WRITE, 22);
    let res = a.pd.alloc_mr(64, Access::LOCAL_WRITE).expect("mr");
    let remote_rights = Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (mem, mem_before) = random_mr(&b.pd, 8 * MIB, remote_rights, 23);
    let (rbuf, rbuf_before) = random_mr(&b.pd, 2 * MIB, Access::LOCAL_WRITE, 24);
    let atom = b.pd.alloc_mr(64, Access::REMOTE_ATOMIC).expect("mr");
    for (off, v) in [(0u64, 1000u64), (8, 7), (16, 55)] {
        atom.write(off, &v.to_ne_bytes()).expect("in bounds");
    }

    // Receives, matched in posting order: SEND, SEND_IMM, WRITE_IMM.
    let recvs = [
        (101, vec![rbuf.sge(0, 8192)]),
        (
            102,
            vec![
                rbuf.sge(16 << 10, 512 << 10),
                rbuf.sge(MIB as u64, 600 << 10),
            ],
        ),
        (103, vec![]),
    ];
    for (id, sges) in recvs {
        b.qp.post_recv(RecvWr { wr_id: id, sges })
            .expect("post_recv");
    }

    let big_write = 3 * MIB + 7;
    let big_read = 2 * MIB + 5;
    let imm_len = MIB + 1;
    let ops: Vec<(SendWr, WcOpcode, usize)> = vec![
        (
            wr(1, SendOp::Write(mem.remote(10)), vec![src.sge(100, 5000)]),
            WcOpcode::Write,
            5000,
        ),
        (
            wr(
                2,
                SendOp::Write(mem.remote((64 << 10) + 3)),
                vec![
                    src.sge(MIB as u64, MIB as u32),
                    src.sge(3 * MIB as u64, (2 * MIB + 7) as u32),
                ],
            ),
            WcOpcode::Write,
            big_write,
        ),
        (
            wr(
                3,
                SendOp::Read(mem.remote(4 * MIB as u64 + 11)),
                vec![rdst.sge(0, 4096)],
            ),
            WcOpcode::Read,
            4096,
        ),
        (
            wr(
                4,
                SendOp::Read(mem.remote(5 * MIB as u64)),
                vec![rdst.sge(8192, big_read as u32)],
            ),
            WcOpcode::Read,
            big_read,
        ),
        (
            wr(5, SendOp::Send, vec![src.sge(7 * MIB as u64, 7000)]),
            WcOpcode::Send,
            7000,
        ),
        (
            wr(
                6,
                SendOp::SendImm(0xfeed),
                vec![src.sge(6 * MIB as u64, imm_len as u32)],
            ),
            WcOpcode::Send,
            imm_len,
        ),
        (
            wr(
                7,
                SendOp::WriteImm(mem.remote(3 * MIB as u64 + 512), 0x1234),
                vec![src.sge(5 * MIB as u64, 64 << 10)],
            ),
            WcOpcode::Write,
            64 << 10,
        ),
        (
            wr(8, SendOp::FetchAdd(atom.remote(0), 3), vec![res.sge(0, 8)]),
            WcOpcode::FetchAdd,
            8,
        ),
        (
            wr(
                9,
                SendOp::CompareSwap {
                    remote: atom.remote(8),
                    compare: 7,
                    swap: 9,
                },
                vec![res.sge(8, 8)],
            ),
            WcOpcode::CompareSwap,
            8,
        ),
        (
            wr(
                10,
                SendOp::CompareSwap {
                    remote: atom.remote(16),
                    compare: 1,
                    swap: 2,
                },
                vec![res.sge(16, 8)],
            ),
            WcOpcode::CompareSwap,
            8,
        ),
    ];
    let want: Vec<_> = ops
        .iter()
        .map(|(w, op, len)| (w.wr_id, WcStatus::Success, *op, *len as u32))
        .collect();
    for (w, _, _) in ops {
        a.qp.post_send(w).expect("post_send");
    }
    let got: Vec<_> = (0..want.len())
        .map(|i| wait(&a.cq, &format!("send {i}")))
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
        .collect();
    assert_eq!(got, want, "send completions, in posting order");
    let got: Vec<_> = (0..3)
        .map(|i| wait(&b.cq, &format!("recv {i}")))
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len, c.imm))
        .collect();
    assert_eq!(
        got,
        vec![
            (101, WcStatus::Success, WcOpcode::Recv, 7000, None),
            (
                102,
                WcStatus::Success,
                WcOpcode::Recv,
                imm_len as u32,
                Some(0xfeed)
            ),
            (
                103,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                64 << 10,
                Some(0x1234)
            ),
        ],
        "receive completions"
    );

    // The responder's memory: three WRITEs.
    let mut want_mem = Memory::new(mem_before.clone());
    want_mem.write(10, &src_data[100..5100]);
    let at = (64 << 10) + 3;
    want_mem.write(at, &src_data[MIB..2 * MIB]);
    want_mem.write(at + MIB, &src_data[3 * MIB..5 * MIB + 7]);
    let at = 3 * MIB + 512;
    want_mem.write(at, &src_data[5 * MIB..5 * MIB + (64 << 10)]);
    want_mem.check("writes", "WRITE targets", &contents(&mem));
    // Its receive buffers: the SEND, then the SEND_IMM scattered over two entries.
    let mut want_rbuf = Memory::new(rbuf_before);
    want_rbuf.write(0, &src_data[7 * MIB..7 * MIB + 7000]);
    let imm_src = &src_data[6 * MIB..6 * MIB + imm_len];
    want_rbuf.write(16 << 10, &imm_src[..512 << 10]);
    want_rbuf.write(MIB, &imm_src[512 << 10..]);
    want_rbuf.check("sends", "receive buffers", &contents(&rbuf));
    // The requester's READ destinations.
    let mut want_rdst = Memory::new(rdst_before);
    want_rdst.write(0, &mem_before[4 * MIB + 11..4 * MIB + 11 + 4096]);
    want_rdst.write(8192, &mem_before[5 * MIB..5 * MIB + big_read]);
    want_rdst.check("reads", "READ destinations", &contents(&rdst));
    // Atomics: originals returned, targets updated only where they matched.
    assert_eq!(
        (word(&res, 0), word(&res, 8), word(&res, 16)),
        (1000, 7, 55)
    );
    assert_eq!(
        (word(&atom, 0), word(&atom, 8), word(&atom, 16)),
        (1003, 9, 55)
    );

    let sprayed = |d: &Device| d.path_stats().iter().filter(|p| p.packets > 0).count();
    assert_eq!(
        sprayed(&a.dev),
        usize::from(PATHS),
        "requests went out on every path"
    );
    assert_eq!(
        sprayed(&b.dev),
        usize::from(PATHS),
        "READ responses went out on every path"
    );
    // Each datapath counted the traffic it moved (AF_XDP: its rings; sockets: messages and
    // datagrams), under the names `Device::datapath_counters` documents.
    for (side, d) in [("requester", &a.dev), ("responder", &b.dev)] {
        let c = d.datapath_counters();
        let get = |names: [&str; 2]| {
            c.iter()
                .find(|(n, _)| names.contains(n))
                .map(|&(_, v)| v)
                .unwrap_or_else(|| panic!("{test}: {side} counters {c:?} lack {names:?}"))
        };
        assert!(get(["sent", "datagrams_sent"]) > 0, "{side}: {c:?}");
        assert!(get(["received", "datagrams_received"]) > 0, "{side}: {c:?}");
    }
    eprintln!(
        "{test}: {:.2?}; requester {:?} {:?}; responder {:?} {:?}; kernel drops: {}",
        started.elapsed(),
        a.dev.stats(),
        a.dev.datapath_counters(),
        b.dev.stats(),
        b.dev.datapath_counters(),
        kernel_drops(&[veth.a(), veth.b()])
    );
}

#[test]
fn veth_udp_every_operation_is_byte_exact_on_16_paths() {
    every_operation_is_byte_exact_over_veth(
        "veth_udp_every_operation_is_byte_exact_on_16_paths",
        DatapathKind::Udp,
        DatapathKind::Udp,
    );
}

/// A WRITE workload: `count` messages of `size` seeded random bytes from `a`, each to its
/// own place in a region of `b`.
struct Writes {
    src: MemoryRegion,
    src_data: Vec<u8>,
    dst: MemoryRegion,
    dst_before: Vec<u8>,
    size: usize,
    count: usize,
}

impl Writes {
    fn new(a: &Side, b: &Side, size: usize, count: usize, seed: u64) -> Writes {
        let (src, src_data) = random_mr(&a.pd, size * count, Access::NONE, seed);
        // A gap of 13 bytes before each message, so a misplaced packet cannot hide.
        let (dst, dst_before) =
            random_mr(&b.pd, (size + 13) * count, Access::REMOTE_WRITE, seed + 1);
        Writes {
            src,
            src_data,
            dst,
            dst_before,
            size,
            count,
        }
    }

    /// Posts the WRITEs with at most `depth` outstanding, checks each completion (in posting
    /// order, successful, full length), counts completed messages in `progress` (for a thread
    /// that acts mid-transfer), then checks that the target holds exactly the sent bytes.
    /// Returns the time from the first post to the last completion.
    fn run(&self, a: &Side, depth: usize, progress: &AtomicU64) -> Duration {
        let started = Instant::now();
        let (mut posted, mut done) = (0usize, 0usize);
        while done < self.count {
            while posted < self.count && posted - done < depth {
                let to = (self.size + 13) * posted + 13;
                let op = SendOp::Write(self.dst.remote(to as u64));
                let sge = self.src.sge((self.size * posted) as u64, self.size as u32);
                a.qp.post_send(wr(posted as u64, op, vec![sge]))
                    .expect("post_send");
                posted += 1;
            }
            let wc = wait(&a.cq, &format!("WRITE {done} of {}", self.count));
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (done as u64, WcStatus::Success, self.size as u32),
                "WRITE {done}: completions in posting order, all successful; requester {:?}",
                a.dev.stats()
            );
            done += 1;
            progress.store(done as u64, Ordering::Release);
        }
        let elapsed = started.elapsed();
        let mut want = Memory::new(self.dst_before.clone());
        for i in 0..self.count {
            let to = (self.size + 13) * i + 13;
            want.write(to, &self.src_data[self.size * i..self.size * (i + 1)]);
        }
        want.check("writes", "WRITE targets", &contents(&self.dst));
        elapsed
    }
}

/// A testbed (root only: `None` after saying why), a pair of devices across it and its
/// busiest path with every path's share (see [`busiest_path`]).
fn testbed_with_busiest_path(
    test: &str,
    kind_a: DatapathKind,
    kind_b: DatapathKind,
) -> Option<(Testbed4, Side, Side, usize, [f64; TESTBED_PATHS])> {
    if !require_root(test) {
        return None;
    }
    let bed = setup(test, Testbed4::new())?;
    let (ha, hb) = testbed_hosts(&bed);
    let (a, b) = pair(kind_a, ha, kind_b, hb);
    let (path, share) = busiest_path(&bed, &a, &b);
    Some((bed, a, b, path, share))
}

/// Sends `bytes` of WRITEs through the testbed and returns the path that carried most of
/// them towards hostB, with each path's share of the packets. Braid sprays 16 source ports
/// and the routers hash them onto 4 links unevenly (and differently each run, since the
/// ports are ephemeral), so a test that wants a busy path asks which one is.
fn busiest_path(bed: &Testbed4, a: &Side, b: &Side) -> (usize, [f64; TESTBED_PATHS]) {
    let before = bed.path_counters().expect("path counters");
    Writes::new(a, b, 64 << 10, 8, 31).run(a, 8, &AtomicU64::new(0));
    let d = path_delta(&before, &bed.path_counters().expect("path counters"));
    let total: u64 = d.iter().map(|c| c.forward).sum();
    assert!(total > 0, "the warm-up WRITEs crossed no path: {d:?}");
    let share = std::array::from_fn(|k| d[k].forward as f64 / total as f64);
    let busiest = (0..TESTBED_PATHS)
        .max_by_key(|&k| d[k].forward)
        .expect("four paths");
    (busiest, share)
}

/// Drops the kernel counted outside the netem programs and tbf, since the namespaces were
/// made: per namespace, datagrams dropped for a full socket receive buffer, sends refused
/// for a full send buffer, and packets dropped by its interfaces. Printed, to tell real
/// losses from the engine's spurious ones.
fn kernel_drops(nss: &[&Netns]) -> String {
    nss.iter()
        .map(|ns| {
            let udp = ns.udp_counters().unwrap_or_default();
            let links: u64 = ns
                .link_stats()
                .unwrap_or_default()
                .iter()
                .map(|(_, s)| s.rx_dropped + s.tx_dropped)
                .sum();
            format!(
                "{}: rcvbuf {} sndbuf {} interfaces {links}",
                ns.name(),
                udp.rcvbuf_errors,
                udp.sndbuf_errors
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn testbed_namespaces(bed: &Testbed4) -> [&Netns; 4] {
    [bed.host_a(), bed.router_l(), bed.router_r(), bed.host_b()]
}

fn forward(d: &[PathCounters; TESTBED_PATHS]) -> [u64; TESTBED_PATHS] {
    std::array::from_fn(|k| d[k].forward)
}

/// One path drops 5% of what crosses it towards hostB; a few MiB of WRITEs still land
/// byte-exact.
///
/// What is asserted, and why it holds:
/// - the netem on the lossy path dropped packets, between 2% and 9% of those it saw (5%
///   configured; the path is the busiest one, so it sees hundreds of packets);
/// - the requester retransmitted at least as many packets as the netem dropped. Each WRITE
///   packet that was dropped must be sent again for its bytes to land, and every one did
///   land, so per sequence number `drops ≤ transmissions − 1 = retransmissions` (nothing
///   else drops on this testbed, and only data packets flow hostA → hostB in a WRITE);
/// - the engine declared packets lost;
/// - traffic leaves the lossy link: its share of the packets sent during the transfer is
///   below 90% of its share in the loss-free warm-up. The engine retransmits a lost packet on
///   another source port, and its path scoring (`braid_cc::paths::PathSet`) lowers the weight
///   of every source port whose packets get lost, for new packets and retransmissions alike.
///   At 5% loss a lossy port's weight drops to about a third of a clean one's, so the link's
///   share falls well below the bound (15 runs: at most 0.77 of the warm-up share).
fn writes_survive_loss_on_one_path(test: &str, kind_a: DatapathKind, kind_b: DatapathKind) {
    let Some((bed, a, b, lossy, share)) = testbed_with_busiest_path(test, kind_a, kind_b) else {
        return;
    };
    bed.set_netem(
        lossy,
        NetemConfig {
            loss: 0.05,
            ..Default::default()
        },
    )
    .expect("attach netem");

    // 16 MiB: long enough (many round trips) for the path weights to settle.
    let work = Writes::new(&a, &b, 256 << 10, 64, 41);
    let stats_before = a.dev.stats();
    let paths_before = bed.path_counters().expect("path counters");
    let elapsed = work.run(&a, 8, &AtomicU64::new(0));
    let d = path_delta(&paths_before, &bed.path_counters().expect("path counters"));
    let stats = a.dev.stats();
    let c = bed.netem_counters(lossy).expect("netem counters");
    let retransmits = stats.retransmits - stats_before.retransmits;
    let lost: u64 = a.dev.path_stats().iter().map(|p| p.lost).sum();

    let sent: u64 = forward(&d).iter().sum();
    let share_after = d[lossy].forward as f64 / sent.max(1) as f64;
    let responder = b.dev.stats();
    eprintln!(
        "{test}: {} MiB in {elapsed:.2?}; lossy path {lossy} (share {:.2}, netem in {:?} \
         mode): {c:?} = {:.2}% dropped; forward packets per path {:?} (lossy share \
         {share_after:.2}); retransmits {retransmits}; requester total \
         retransmits {} = netem drops {} + duplicates at the responder (spurious) {}?; \
         declared lost {lost}; requester {stats:?}; responder {responder:?}; kernel drops: {}",
        (work.size * work.count) >> 20,
        share[lossy],
        bed.netem_of(lossy).map(|(_, mode)| mode),
        100.0 * c.drop_fraction(),
        forward(&d),
        stats.retransmits,
        c.dropped,
        responder.rx_duplicates,
        kernel_drops(&testbed_namespaces(&bed)),
    );
    assert!(c.dropped > 0, "the lossy path dropped nothing: {c:?}");
    assert!(
        (0.02..0.09).contains(&c.drop_fraction()),
        "5% loss configured, {:.2}% measured: {c:?}",
        100.0 * c.drop_fraction()
    );
    assert!(
        retransmits >= c.dropped,
        "{} packets dropped but only {retransmits} retransmitted",
        c.dropped
    );
    assert!(lost > 0, "the engine declared nothing lost");
    assert!(
        share_after < 0.9 * share[lossy],
        "traffic did not leave the lossy link: share {:.2} in the warm-up, {share_after:.2} \
         during the transfer",
        share[lossy]
    );
}

#[test]
fn testbed_udp_writes_are_byte_exact_with_5_percent_loss_on_one_path() {
    writes_survive_loss_on_one_path(
        "testbed_udp_writes_are_byte_exact_with_5_percent_loss_on_one_path",
        DatapathKind::Udp,
        DatapathKind::Udp,
    );
}

/// The busiest path turns into a black hole (every packet towards hostB dropped) while a
/// large WRITE transfer runs; the transfer completes byte-exact. Asserted besides: the black
/// hole did swallow packets (so the transfer really crossed it), and the requester
/// retransmitted at least as many packets as were swallowed (see
/// [`writes_survive_loss_on_one_path`] for why that bound holds).
fn transfer_survives_a_black_hole(test: &str, kind_a: DatapathKind, kind_b: DatapathKind) {
    let Some((bed, a, b, hole, share)) = testbed_with_busiest_path(test, kind_a, kind_b) else {
        return;
    };
    // Attach a harmless netem now, so the flip mid-transfer only swaps programs.
    bed.set_netem(hole, NetemConfig::default())
        .expect("attach netem");

    // 16 MiB, black-holed after an eighth: long enough that plenty of traffic is still to
    // come when the program swap takes effect (tens of milliseconds on a busy machine).
    let work = Writes::new(&a, &b, 256 << 10, 64, 51);
    let progress = AtomicU64::new(0);
    let paths_before = bed.path_counters().expect("path counters");
    let stats_before = a.dev.stats();
    let (elapsed, flipped_at) = std::thread::scope(|s| {
        let flipper = s.spawn(|| {
            // After an eighth of the messages completed.
            let deadline = Instant::now() + WAIT;
            while progress.load(Ordering::Acquire) < work.count as u64 / 8 {
                assert!(Instant::now() < deadline, "the transfer made no progress");
                std::thread::sleep(Duration::from_micros(200));
            }
            let at = progress.load(Ordering::Acquire);
            bed.blackhole(hole, true).expect("black hole");
            let counters = bed.path_counters().expect("path counters");
            (at, counters)
        });
        let elapsed = work.run(&a, 8, &progress);
        (elapsed, flipper.join().expect("flipper thread"))
    });
    let (flipped_after, at_flip) = flipped_at;
    let after = bed.path_counters().expect("path counters");
    let c = bed.netem_counters(hole).expect("netem counters");
    let stats = a.dev.stats();
    let retransmits = stats.retransmits - stats_before.retransmits;
    let into_hole = after[hole].forward - at_flip[hole].forward;
    eprintln!(
        "{test}: {} MiB in {elapsed:.2?}; path {hole} (share {:.2}) black-holed after \
         {flipped_after} of {} messages; packets sent into the hole after that: {into_hole}; \
         netem {c:?}; forward packets per path before the flip {:?}, after {:?}; retransmits \
         {retransmits}; requester {stats:?}; responder {:?}; kernel drops: {}",
        (work.size * work.count) >> 20,
        share[hole],
        work.count,
        forward(&path_delta(&paths_before, &at_flip)),
        forward(&path_delta(&at_flip, &after)),
        b.dev.stats(),
        kernel_drops(&testbed_namespaces(&bed)),
    );
    assert!(c.dropped > 0, "the black hole swallowed nothing: {c:?}");
    assert!(
        retransmits >= c.dropped,
        "{} packets swallowed but only {retransmits} retransmitted",
        c.dropped
    );
}

#[test]
fn testbed_udp_transfer_survives_a_path_black_holed_mid_transfer() {
    transfer_survives_a_black_hole(
        "testbed_udp_transfer_survives_a_path_black_holed_mid_transfer",
        DatapathKind::Udp,
        DatapathKind::Udp,
    );
}

/// Every path is rate-limited, the busiest one to a tenth of the others' rate; a few MiB of
/// WRITEs still complete byte-exact. Asserted besides: the slow path carried part of the
/// transfer.
fn transfer_completes_over_a_slow_path(test: &str, kind_a: DatapathKind, kind_b: DatapathKind) {
    let Some((bed, a, b, slow, share)) = testbed_with_busiest_path(test, kind_a, kind_b) else {
        return;
    };
    const FAST_MBIT: u32 = 400;
    for k in 0..TESTBED_PATHS {
        let mbit = if k == slow { FAST_MBIT / 10 } else { FAST_MBIT };
        bed.set_rate(k, mbit).expect("tbf");
    }

    let work = Writes::new(&a, &b, 256 << 10, 16, 61);
    let paths_before = bed.path_counters().expect("path counters");
    let stats_before = a.dev.stats();
    let elapsed = work.run(&a, 8, &AtomicU64::new(0));
    let d = path_delta(&paths_before, &bed.path_counters().expect("path counters"));
    let stats = a.dev.stats();
    let drops: Vec<u64> = (0..TESTBED_PATHS)
        .map(|k| bed.rate_drops(k).expect("tc stats"))
        .collect();
    let bytes = work.size * work.count;
    eprintln!(
        "{test}: {} MiB in {elapsed:.2?} ({:.0} Mbit/s); path {slow} (share {:.2}) at {} \
         Mbit/s, others at {FAST_MBIT}; forward packets per path {:?}; tbf drops per path \
         {drops:?}; retransmits {}; requester {stats:?}; responder {:?}; kernel drops: {}",
        bytes >> 20,
        bytes as f64 * 8.0 / elapsed.as_secs_f64() / 1e6,
        share[slow],
        FAST_MBIT / 10,
        forward(&d),
        stats.retransmits - stats_before.retransmits,
        b.dev.stats(),
        kernel_drops(&testbed_namespaces(&bed)),
    );
    assert!(d[slow].forward > 0, "the slow path carried nothing: {d:?}");
}

#[test]
fn testbed_udp_transfer_completes_with_one_path_at_a_tenth_of_the_rate() {
    transfer_completes_over_a_slow_path(
        "testbed_udp_transfer_completes_with_one_path_at_a_tenth_of_the_rate",
        DatapathKind::Udp,
        DatapathKind::Udp,
    );
}

#[test]
fn veth_xdp_every_operation_is_byte_exact_on_16_paths() {
    every_operation_is_byte_exact_over_veth(
        "veth_xdp_every_operation_is_byte_exact_on_16_paths",
        DatapathKind::Xdp,
        DatapathKind::Xdp,
    );
}

#[test]
fn veth_xdp_to_udp_every_operation_is_byte_exact_on_16_paths() {
    every_operation_is_byte_exact_over_veth(
        "veth_xdp_to_udp_every_operation_is_byte_exact_on_16_paths",
        DatapathKind::Xdp,
        DatapathKind::Udp,
    );
}

#[test]
fn veth_uring_every_operation_is_byte_exact_on_16_paths() {
    every_operation_is_byte_exact_over_veth(
        "veth_uring_every_operation_is_byte_exact_on_16_paths",
        DatapathKind::Uring,
        DatapathKind::Uring,
    );
}

#[test]
fn testbed_xdp_writes_are_byte_exact_with_5_percent_loss_on_one_path() {
    writes_survive_loss_on_one_path(
        "testbed_xdp_writes_are_byte_exact_with_5_percent_loss_on_one_path",
        DatapathKind::Xdp,
        DatapathKind::Xdp,
    );
}

#[test]
fn testbed_xdp_transfer_survives_a_path_black_holed_mid_transfer() {
    transfer_survives_a_black_hole(
        "testbed_xdp_transfer_survives_a_path_black_holed_mid_transfer",
        DatapathKind::Xdp,
        DatapathKind::Xdp,
    );
}

#[test]
fn testbed_uring_writes_are_byte_exact_with_5_percent_loss_on_one_path() {
    writes_survive_loss_on_one_path(
        "testbed_uring_writes_are_byte_exact_with_5_percent_loss_on_one_path",
        DatapathKind::Uring,
        DatapathKind::Uring,
    );
}
