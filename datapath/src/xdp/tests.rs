//! The AF_XDP datapath on a veth pair between two private network namespaces.
//!
//! These tests need root (namespaces, AF_XDP, BPF). Without it they print a loud SKIPPED
//! line, except under CI (the `CI` variable set), where they fail: CI runs as root.

use super::*;
use crate::Ecn;
use crate::udp::{UdpConfig, UdpDatapath};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::process::Command;
use std::sync::atomic::AtomicUsize;

const A_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
const XDP_PORT: u16 = 4791;
const UDP_PORT: u16 = 4792;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a root-only test may run; under CI a missing privilege fails instead.
fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: needs root, and CI runs as root"
    );
    // Straight to the stderr handle, past the test harness's output capture, so the skip
    // shows even when the test passes.
    use std::io::Write;
    let _ = writeln!(
        io::stderr(),
        "*** SKIPPED {test}: needs root (network namespaces, AF_XDP, BPF) ***"
    );
    false
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

static NEXT_BED: AtomicUsize = AtomicUsize::new(0);

/// Two namespaces, A (10.200.0.1 on `xa`) and B (10.200.0.2 on `xb`), joined by a veth pair;
/// deleted on drop, even after a panic.
struct Testbed {
    a: String,
    b: String,
}

impl Testbed {
    /// With `queues` receive and transmit queues on each veth end.
    fn new(queues: u32) -> Testbed {
        let n = NEXT_BED.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let bed = Testbed {
            a: format!("braid-xdp-{pid}-{n}-a"),
            b: format!("braid-xdp-{pid}-{n}-b"),
        };
        ip(&["netns", "add", &bed.a]);
        ip(&["netns", "add", &bed.b]);
        let q = queues.to_string();
        ip(&[
            "link",
            "add",
            "xa",
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &bed.a,
            "type",
            "veth",
            "peer",
            "name",
            "xb",
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &bed.b,
        ]);
        for (ns, dev, addr) in [(&bed.a, "xa", A_IP), (&bed.b, "xb", B_IP)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        bed
    }

    /// Sets the MTU of both veth ends.
    fn set_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        ip(&["-n", &self.a, "link", "set", "xa", "mtu", &mtu]);
        ip(&["-n", &self.b, "link", "set", "xb", "mtu", &mtu]);
    }

    fn in_a<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(&self.a, f)
    }

    fn in_b<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(&self.b, f)
    }

    fn xdp_a(&self, config: XdpConfig) -> XdpDatapath {
        self.in_a(|| XdpDatapath::bind(config))
            .unwrap_or_else(|e| panic!("XdpDatapath::bind in A: {e}"))
    }

    fn udp_b(&self, paths: u16) -> UdpDatapath {
        let local = SocketAddr::V4(SocketAddrV4::new(B_IP, UDP_PORT));
        self.in_b(|| UdpDatapath::bind(UdpConfig::new(local, paths)))
            .expect("UdpDatapath::bind in B")
    }

    /// [`udp_b`](Self::udp_b) for datagrams of up to `max_payload` bytes (jumbo MTUs).
    fn udp_b_max(&self, paths: u16, max_payload: usize) -> UdpDatapath {
        let local = SocketAddr::V4(SocketAddrV4::new(B_IP, UDP_PORT));
        let config = UdpConfig {
            max_payload,
            ..UdpConfig::new(local, paths)
        };
        self.in_b(|| UdpDatapath::bind(config))
            .expect("UdpDatapath::bind in B")
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Runs `f` on a thread that joined network namespace `name`. Sockets it creates stay in that
/// namespace, whichever thread uses them afterwards.
fn in_netns<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/var/run/netns/{name}");
    std::thread::scope(|s| {
        let handle = s.spawn(move || {
            let ns = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            // SAFETY: setns only changes this thread's network namespace; `ns` is a live fd.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", io::Error::last_os_error());
            f()
        });
        match handle.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

fn xdp_config(paths: u16) -> XdpConfig {
    XdpConfig::new(SocketAddr::V4(SocketAddrV4::new(A_IP, XDP_PORT)), paths)
}

/// Sends all of `batch`, retrying what the datapath could not take at once.
fn send_all(dp: &dyn Datapath, batch: &[Transmit<'_>]) {
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sent < batch.len() {
        assert!(Instant::now() < deadline, "send stalled at {sent}");
        sent += dp.send(&batch[sent..]).expect("send");
    }
}

/// Receives (through `recv_with`) until `count` datagrams arrived or 5 s passed.
fn recv_n(dp: &dyn Datapath, count: usize) -> Vec<(RecvMeta, Vec<u8>)> {
    // Room for a datagram of a 9000-byte MTU (the UDP datapath receives into these).
    let mut scratch = RecvBatch::new(64, 9216);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < count && Instant::now() < deadline {
        dp.recv_with(
            &mut scratch,
            Some(Duration::from_millis(50)),
            &mut |meta, bytes| {
                assert_eq!(meta.len, bytes.len());
                got.push((*meta, bytes.to_vec()));
            },
        )
        .expect("recv_with");
    }
    got
}

/// Payload `i`: its index, then a pattern, `len` bytes in all (at least 4).
fn payload(i: u32, len: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len.max(4))
        .map(|k| (k as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect();
    p[..4].copy_from_slice(&i.to_be_bytes());
    p
}

/// Sends 1000 datagrams of sizes 4..=max on 16 paths from `tx` to `rx` in windows, and
/// checks each arrives intact from the source port of its path.
fn exchange(
    tx: &dyn Datapath,
    path_addr: &dyn Fn(u16) -> Option<SocketAddr>,
    rx: &dyn Datapath,
    max: usize,
) {
    const COUNT: u32 = 1000;
    const WINDOW: u32 = 50;
    let payloads: Vec<Vec<u8>> = (0..COUNT)
        .map(|i| {
            let len = match i % 7 {
                0 => max,
                1 => 4,
                _ => 4 + (i as usize * 131) % (max - 3),
            };
            payload(i, len)
        })
        .collect();
    let mut ports = BTreeMap::new();
    for start in (0..COUNT).step_by(WINDOW as usize) {
        let batch: Vec<Transmit<'_>> = (start..start + WINDOW)
            .map(|i| Transmit {
                dest: rx.local_addr(),
                path: (i % 16) as u16,
                ecn: Ecn::NotEct,
                contents: &payloads[i as usize],
            })
            .collect();
        send_all(tx, &batch);
        let got = recv_n(rx, WINDOW as usize);
        assert_eq!(
            got.len(),
            WINDOW as usize,
            "window at {start}: {} of {WINDOW} arrived",
            got.len()
        );
        for (meta, bytes) in got {
            let i = u32::from_be_bytes(bytes[..4].try_into().unwrap());
            assert!((start..start + WINDOW).contains(&i), "stray datagram {i}");
            assert_eq!(bytes, payloads[i as usize], "datagram {i} damaged");
            assert_eq!(
                Some(meta.src),
                path_addr((i % 16) as u16),
                "datagram {i} left from the wrong port"
            );
            assert!(ports.insert(i, meta.src.port()).is_none(), "{i} twice");
        }
    }
    assert_eq!(ports.len(), COUNT as usize);
    let distinct: BTreeSet<u16> = ports.values().copied().collect();
    assert_eq!(distinct.len(), 16, "16 paths, 16 source ports");
}

#[test]
fn xdp_and_udp_exchange_1000_datagrams_on_16_paths_both_ways() {
    if !require_root("xdp_and_udp_exchange_1000_datagrams_on_16_paths_both_ways") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(XdpConfig {
        zero_copy: true, // veth cannot: falls back to copy mode
        ..xdp_config(16)
    });
    let udp = bed.udp_b(16);
    assert_eq!(xdp.kind(), "xdp");
    assert_eq!(xdp.paths(), 16);
    assert_eq!(xdp.max_payload(), 1472);
    assert_eq!(xdp.queues(), 1);
    assert_eq!(xdp.frame_size(), 2048);
    assert!(!xdp.zero_copy(), "veth has no zero-copy AF_XDP");
    assert_eq!(xdp.interface(), "xa");
    assert_eq!(xdp.path_local_addr(0), Some(xdp.local_addr()));
    assert_eq!(xdp.path_local_addr(16), None);
    let max = xdp.max_payload();
    exchange(&xdp, &|p| xdp.path_local_addr(p), &udp, max);
    exchange(&udp, &|p| udp.path_local_addr(p), &xdp, max);
    let stats = xdp.stats();
    assert_eq!(stats.sent, 1000);
    assert_eq!(stats.received, 1000);
    assert_eq!(
        stats.tx_unroutable + stats.tx_oversize + stats.tx_kick_errors,
        0
    );
    eprintln!("xdp stats after the exchange: {stats:?}");
}

#[test]
fn xdp_to_xdp_in_generic_mode_delivers() {
    if !require_root("xdp_to_xdp_in_generic_mode_delivers") {
        return;
    }
    let bed = Testbed::new(1);
    let a = bed.xdp_a(XdpConfig {
        mode: XdpMode::Generic,
        ..xdp_config(16)
    });
    let b_config = XdpConfig {
        mode: XdpMode::Generic,
        ..XdpConfig::new(SocketAddr::V4(SocketAddrV4::new(B_IP, XDP_PORT)), 16)
    };
    let b = bed.in_b(|| XdpDatapath::bind(b_config)).expect("bind in B");
    let max = a.max_payload();
    exchange(&a, &|p| a.path_local_addr(p), &b, max);
    exchange(&b, &|p| b.path_local_addr(p), &a, max);
}

#[test]
fn ecn_codepoints_round_trip_both_ways() {
    if !require_root("ecn_codepoints_round_trip_both_ways") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(xdp_config(2));
    let udp = bed.udp_b(2);
    let codepoints = [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ce];
    for (from, to) in [(&xdp as &dyn Datapath, &udp as &dyn Datapath), (&udp, &xdp)] {
        let payloads: Vec<Vec<u8>> = (0..8).map(|i| payload(i, 20)).collect();
        let batch: Vec<Transmit<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| Transmit {
                dest: to.local_addr(),
                path: (i % 2) as u16,
                ecn: codepoints[i % 4],
                contents: p,
            })
            .collect();
        send_all(from, &batch);
        let got = recv_n(to, batch.len());
        assert_eq!(got.len(), batch.len());
        for (meta, bytes) in got {
            let i = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
            assert_eq!(
                meta.ecn,
                codepoints[i % 4],
                "{} -> {}: datagram {i}",
                from.kind(),
                to.kind()
            );
        }
    }
}

#[test]
fn frames_for_other_ports_reach_the_kernel() {
    if !require_root("frames_for_other_ports_reach_the_kernel") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(xdp_config(1));
    let kernel_a = bed
        .in_a(|| std::net::UdpSocket::bind((A_IP, 5555)))
        .expect("bind kernel socket in A");
    kernel_a
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let kernel_b = bed
        .in_b(|| std::net::UdpSocket::bind((B_IP, 0)))
        .expect("bind kernel socket in B");
    kernel_b.send_to(b"for the kernel", (A_IP, 5555)).unwrap();
    kernel_b.send_to(b"for braid", (A_IP, XDP_PORT)).unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = kernel_a
        .recv_from(&mut buf)
        .expect("kernel socket got nothing");
    assert_eq!(&buf[..n], b"for the kernel");
    assert_eq!(from, kernel_b.local_addr().unwrap());
    let got = recv_n(&xdp, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, b"for braid");
    assert_eq!(got[0].0.src, kernel_b.local_addr().unwrap());
    // Nothing for the XDP port leaked to the kernel, nothing for the kernel to XDP.
    assert_eq!(recv_n_within(&xdp, Duration::from_millis(100)), 0);
    // And transmit still answers the kernel socket (its ARP entry was learned by the kernel).
    send_all(
        &xdp,
        &[Transmit {
            dest: kernel_b.local_addr().unwrap(),
            path: 0,
            ecn: Ecn::NotEct,
            contents: b"reply",
        }],
    );
    kernel_b
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let (n, from) = kernel_b.recv_from(&mut buf).expect("reply lost");
    assert_eq!(&buf[..n], b"reply");
    assert_eq!(from, xdp.local_addr());
}

/// A kernel UDP socket on `at`. "Address in use" is retried briefly: a socket closed a moment
/// ago can still be held by a child process that another test is spawning (between fork and
/// exec), which is what `XdpDatapath::bind` retries too.
fn bind_kernel_socket(at: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let start = Instant::now();
    loop {
        match std::net::UdpSocket::bind(at) {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse
                    && start.elapsed() < Duration::from_millis(500) =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            r => return r,
        }
    }
}

/// Datagrams received within `wait`.
fn recv_n_within(dp: &dyn Datapath, wait: Duration) -> usize {
    let mut scratch = RecvBatch::new(8, 2048);
    let mut n = 0;
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        n += dp
            .recv_with(
                &mut scratch,
                Some(Duration::from_millis(20)),
                &mut |_, _| {},
            )
            .unwrap();
    }
    n
}

#[test]
fn dropping_detaches_and_a_new_datapath_binds_again() {
    if !require_root("dropping_detaches_and_a_new_datapath_binds_again") {
        return;
    }
    let bed = Testbed::new(1);
    let udp = bed.udp_b(1);
    let ping = |xdp: &XdpDatapath, tag: u8| {
        send_all(
            &udp,
            &[Transmit {
                dest: xdp.local_addr(),
                path: 0,
                ecn: Ecn::NotEct,
                contents: &[tag; 10],
            }],
        );
        let got = recv_n(xdp, 1);
        assert_eq!(got.len(), 1, "ping {tag} lost");
        assert_eq!(got[0].1, vec![tag; 10]);
    };
    let xdp = bed.xdp_a(xdp_config(4));
    ping(&xdp, 1);
    drop(xdp);
    // Detached, and the port released: the kernel gets the next datagram.
    let kernel = bed
        .in_a(|| bind_kernel_socket((A_IP, XDP_PORT).into()))
        .expect("port released on drop");
    kernel
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    send_all(
        &udp,
        &[Transmit {
            dest: kernel.local_addr().unwrap(),
            path: 0,
            ecn: Ecn::NotEct,
            contents: b"kernel",
        }],
    );
    let mut buf = [0u8; 16];
    let (n, _) = kernel.recv_from(&mut buf).expect("program still attached?");
    assert_eq!(&buf[..n], b"kernel");
    drop(kernel);
    // Bind again at once, several times: the queue may still be busy with the old socket.
    for round in 2..5u8 {
        let start = Instant::now();
        let xdp = bed.xdp_a(xdp_config(4));
        eprintln!(
            "rebind {round} took {:?}, {} EBUSY retries",
            start.elapsed(),
            xdp.stats().bind_busy_retries
        );
        ping(&xdp, round);
    }
}

#[test]
fn two_receive_queues_share_one_umem() {
    if !require_root("two_receive_queues_share_one_umem") {
        return;
    }
    let bed = Testbed::new(2);
    let xdp = bed.xdp_a(xdp_config(16));
    assert_eq!(xdp.queues(), 2);
    let udp = bed.udp_b(16);
    let max = xdp.max_payload();
    exchange(&udp, &|p| udp.path_local_addr(p), &xdp, max);
    exchange(&xdp, &|p| xdp.path_local_addr(p), &udp, max);
    let stats = xdp.stats();
    eprintln!("per-queue receive counts: {:?}", stats.received_per_queue);
    assert_eq!(stats.received_per_queue.iter().sum::<u64>(), 1000);
    assert!(
        stats.received_per_queue.iter().all(|&n| n > 0),
        "16 flows should use both queues: {:?}",
        stats.received_per_queue
    );
}

#[test]
fn payloads_are_lent_straight_from_the_umem() {
    if !require_root("payloads_are_lent_straight_from_the_umem") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(xdp_config(1));
    let udp = bed.udp_b(1);
    let payloads: Vec<Vec<u8>> = (0..20).map(|i| payload(i, 100 + i as usize)).collect();
    let batch: Vec<Transmit<'_>> = payloads
        .iter()
        .map(|p| Transmit {
            dest: xdp.local_addr(),
            path: 0,
            ecn: Ecn::NotEct,
            contents: p,
        })
        .collect();
    send_all(&udp, &batch);
    let umem = xdp.umem.base() as usize..xdp.umem.base() as usize + xdp.umem.len();
    let mut scratch = RecvBatch::new(0, 0);
    let mut lent = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while lent < batch.len() && Instant::now() < deadline {
        xdp.recv_with(
            &mut scratch,
            Some(Duration::from_millis(50)),
            &mut |_, bytes| {
                let at = bytes.as_ptr() as usize;
                assert!(umem.contains(&at) && umem.contains(&(at + bytes.len() - 1)));
                let i = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
                assert_eq!(bytes, &payloads[i][..]);
                lent += 1;
            },
        )
        .unwrap();
    }
    assert_eq!(lent, batch.len());
}

#[test]
fn concurrent_senders_share_the_tx_ring() {
    if !require_root("concurrent_senders_share_the_tx_ring") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(xdp_config(16));
    let udp = bed.udp_b(1);
    const THREADS: u32 = 4;
    const EACH: u32 = 200;
    let dest = udp.local_addr();
    let received = std::thread::scope(|s| {
        let receiver = s.spawn(|| recv_n(&udp, (THREADS * EACH) as usize));
        for t in 0..THREADS {
            let xdp = &xdp;
            s.spawn(move || {
                for k in 0..EACH / 10 {
                    let payloads: Vec<Vec<u8>> = (0..10)
                        .map(|j| payload(t * EACH + k * 10 + j, 600))
                        .collect();
                    let batch: Vec<Transmit<'_>> = payloads
                        .iter()
                        .map(|p| Transmit {
                            dest,
                            path: t as u16,
                            ecn: Ecn::NotEct,
                            contents: p,
                        })
                        .collect();
                    send_all(xdp, &batch);
                    // Leave the receiver's socket buffer time to drain.
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        }
        receiver.join().unwrap()
    });
    let ids: BTreeSet<u32> = received
        .iter()
        .map(|(_, b)| u32::from_be_bytes(b[..4].try_into().unwrap()))
        .collect();
    assert_eq!(ids.len(), (THREADS * EACH) as usize);
    for (_, bytes) in &received {
        let i = u32::from_be_bytes(bytes[..4].try_into().unwrap());
        assert_eq!(bytes, &payload(i, 600));
    }
}

#[test]
fn more_queues_than_sockets_is_refused_naming_the_count() {
    if !require_root("more_queues_than_sockets_is_refused_naming_the_count") {
        return;
    }
    let bed = Testbed::new(MAX_QUEUES + 1);
    let err = bed
        .in_a(|| XdpDatapath::bind(xdp_config(1)))
        .expect_err("65 queues accepted");
    assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("65 receive queues"), "{err}");
}

#[test]
fn a_3000_byte_mtu_uses_4096_byte_frames() {
    if !require_root("a_3000_byte_mtu_uses_4096_byte_frames") {
        return;
    }
    let bed = Testbed::new(1);
    bed.set_mtu(3000);
    let err = bed
        .in_a(|| {
            XdpDatapath::bind(XdpConfig {
                frame_size: Some(2048),
                ..xdp_config(16)
            })
        })
        .expect_err("MTU 3000 in 2048-byte frames");
    assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("MTU 3000"), "{err}");
    let xdp = bed.xdp_a(xdp_config(16));
    assert_eq!(xdp.frame_size(), 4096);
    assert_eq!(xdp.max_payload(), 2972);
    let udp = bed.udp_b_max(16, 2972);
    exchange(&xdp, &|p| xdp.path_local_addr(p), &udp, 2972);
    exchange(&udp, &|p| udp.path_local_addr(p), &xdp, 2972);
}

#[test]
fn a_9000_byte_mtu_sends_and_receives_multi_buffer_frames() {
    if !require_root("a_9000_byte_mtu_sends_and_receives_multi_buffer_frames") {
        return;
    }
    let bed = Testbed::new(1);
    bed.set_mtu(9000);
    // An explicit frame size opts out of multi-buffer frames: refused as before.
    let err = bed
        .in_a(|| {
            XdpDatapath::bind(XdpConfig {
                frame_size: Some(4096),
                ..xdp_config(16)
            })
        })
        .expect_err("MTU 9000 in single 4096-byte frames");
    assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("MTU 9000"), "{err}");

    let xdp = bed.xdp_a(xdp_config(16));
    assert_eq!(xdp.frame_size(), 4096);
    // 9014-byte frames in buffers of 4096 - 256 bytes of headroom.
    assert_eq!(xdp.frags(), 3);
    assert_eq!(xdp.max_payload(), 8972);
    let udp = bed.udp_b_max(16, 8972);
    // Chained TX descriptors reach the kernel's UDP stack whole, and frames the kernel
    // splits over several RX buffers are gathered back, at every size up to the MTU.
    exchange(&xdp, &|p| xdp.path_local_addr(p), &udp, 8972);
    exchange(&udp, &|p| udp.path_local_addr(p), &xdp, 8972);
    drop(udp);

    let b_config = XdpConfig::new(SocketAddr::V4(SocketAddrV4::new(B_IP, XDP_PORT)), 16);
    let b = bed.in_b(|| XdpDatapath::bind(b_config)).expect("xdp B");
    assert_eq!(b.frags(), 3);
    exchange(&xdp, &|p| xdp.path_local_addr(p), &b, 8972);
    exchange(&b, &|p| b.path_local_addr(p), &xdp, 8972);
    for stats in [xdp.stats(), b.stats()] {
        assert_eq!(stats.rx_rejected, 0, "{stats:?}");
        assert_eq!(stats.tx_oversize + stats.tx_unroutable, 0, "{stats:?}");
        assert_eq!(stats.kernel_tx_invalid, 0, "{stats:?}");
    }
}

#[test]
fn frames_longer_than_the_bind_time_mtu_are_rejected_without_stalling() {
    if !require_root("frames_longer_than_the_bind_time_mtu_are_rejected_without_stalling") {
        return;
    }
    let bed = Testbed::new(1);
    bed.set_mtu(9000);
    let xdp = bed.xdp_a(xdp_config(1));
    assert_eq!(xdp.frags(), 3);
    // The MTU grows after bind: 12014-byte frames arrive in chains of 4 buffers.
    bed.set_mtu(12000);
    let udp = bed.udp_b_max(1, 11972);
    let big = payload(1, 11972);
    let small = payload(2, 100);
    for contents in [&big[..], &small[..]] {
        send_all(
            &udp,
            &[Transmit {
                dest: xdp.local_addr(),
                path: 0,
                ecn: Ecn::NotEct,
                contents,
            }],
        );
    }
    // One datagram per call: the smallest receive budget must still get past the chain.
    let mut scratch = RecvBatch::new(1, 0);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.is_empty() && Instant::now() < deadline {
        xdp.recv_with(
            &mut scratch,
            Some(Duration::from_millis(50)),
            &mut |_, bytes| got.push(bytes.to_vec()),
        )
        .expect("recv_with");
    }
    assert_eq!(got, [small], "the datagram after the overlong one arrives");
    assert_eq!(xdp.stats().rx_rejected, 1, "{:?}", xdp.stats());
}

#[test]
fn a_1500_byte_mtu_stays_single_buffer() {
    if !require_root("a_1500_byte_mtu_stays_single_buffer") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(xdp_config(1));
    assert_eq!(xdp.frags(), 1);
    assert_eq!(xdp.frame_size(), 2048);
}

#[test]
fn wake_ends_a_blocking_recv() {
    if !require_root("wake_ends_a_blocking_recv") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(xdp_config(1));
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let mut scratch = RecvBatch::new(4, 64);
            let start = Instant::now();
            let n = xdp.recv_with(&mut scratch, None, &mut |_, _| {}).unwrap();
            (n, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        // Counters stay readable while a receive waits.
        assert_eq!(xdp.stats().received, 0);
        xdp.wake();
        let (n, waited) = waiter.join().unwrap();
        assert_eq!(n, 0);
        assert!(waited >= Duration::from_millis(90) && waited < Duration::from_secs(2));
    });
    // A wake before the call makes the next call return at once, and is consumed.
    xdp.wake();
    let mut batch = RecvBatch::new(4, 64);
    assert_eq!(xdp.recv(&mut batch, None).unwrap(), 0);
    let start = Instant::now();
    assert_eq!(
        xdp.recv(&mut batch, Some(Duration::from_millis(30)))
            .unwrap(),
        0
    );
    assert!(start.elapsed() >= Duration::from_millis(25));
}

#[test]
fn unsendable_datagrams_are_skipped_and_counted() {
    if !require_root("unsendable_datagrams_are_skipped_and_counted") {
        return;
    }
    let bed = Testbed::new(1);
    let xdp = bed.xdp_a(xdp_config(2));
    let udp = bed.udp_b(1);
    let big = vec![0u8; xdp.max_payload() + 1];
    let batch = [
        Transmit {
            dest: "[2001:db8::1]:9".parse().unwrap(),
            path: 0,
            ecn: Ecn::NotEct,
            contents: b"v6",
        },
        Transmit {
            dest: udp.local_addr(),
            path: 0,
            ecn: Ecn::NotEct,
            contents: &big,
        },
        // No route: not on the veth's subnet and no default route.
        Transmit {
            dest: "192.0.2.1:9".parse().unwrap(),
            path: 0,
            ecn: Ecn::NotEct,
            contents: b"nowhere",
        },
        Transmit {
            dest: udp.local_addr(),
            path: 7, // wraps to path 1
            ecn: Ecn::NotEct,
            contents: b"ok",
        },
    ];
    assert_eq!(xdp.send(&batch).unwrap(), batch.len());
    let got = recv_n(&udp, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, b"ok");
    assert_eq!(Some(got[0].0.src), xdp.path_local_addr(1));
    let stats = xdp.stats();
    assert_eq!(
        (stats.sent, stats.tx_oversize, stats.tx_unroutable),
        (1, 1, 2)
    );
}

#[test]
fn bind_refuses_bad_configs_with_clear_errors() {
    let inner = |e: &io::Error| -> String {
        e.get_ref()
            .and_then(|i| i.downcast_ref::<XdpError>())
            .map(|x| format!("{x:?}"))
            .unwrap_or_else(|| panic!("no XdpError inside {e:?}"))
    };
    let v4 = |s: &str| -> SocketAddr { s.parse().unwrap() };
    for (config, kind, what) in [
        (
            XdpConfig::new(v4("[::1]:4791"), 1),
            io::ErrorKind::InvalidInput,
            "InvalidConfig",
        ),
        (
            XdpConfig::new(v4("127.0.0.1:0"), 1),
            io::ErrorKind::InvalidInput,
            "InvalidConfig",
        ),
        (
            XdpConfig::new(v4("0.0.0.0:4791"), 1),
            io::ErrorKind::InvalidInput,
            "InvalidConfig",
        ),
        (
            XdpConfig::new(v4("127.0.0.1:4791"), 0),
            io::ErrorKind::InvalidInput,
            "InvalidConfig",
        ),
        (
            XdpConfig::new(v4("127.0.0.1:4791"), MAX_PATHS + 1),
            io::ErrorKind::InvalidInput,
            "InvalidConfig",
        ),
        (
            XdpConfig {
                frame_size: Some(1000),
                ..XdpConfig::new(v4("127.0.0.1:4791"), 1)
            },
            io::ErrorKind::InvalidInput,
            "InvalidConfig",
        ),
        (
            XdpConfig::new(v4("192.0.2.77:4791"), 1),
            io::ErrorKind::AddrNotAvailable,
            "NoInterfaceOwns",
        ),
        (
            XdpConfig {
                interface: Some("braid-nonesuch".into()),
                ..XdpConfig::new(v4("127.0.0.1:4791"), 1)
            },
            io::ErrorKind::NotFound,
            "NoSuchInterface",
        ),
        (
            XdpConfig {
                interface: Some("lo".into()),
                ..XdpConfig::new(v4("192.0.2.77:4791"), 1)
            },
            io::ErrorKind::AddrNotAvailable,
            "AddressNotOnInterface",
        ),
    ] {
        let err = XdpDatapath::bind(config.clone()).expect_err("bad config accepted");
        assert_eq!(err.kind(), kind, "{config:?}: {err}");
        assert!(inner(&err).starts_with(what), "{config:?}: {err}");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn loopback_is_not_ethernet() {
    if !require_root("loopback_is_not_ethernet") {
        return;
    }
    let bed = Testbed::new(1);
    let err = bed
        .in_a(|| XdpDatapath::bind(XdpConfig::new("127.0.0.1:4791".parse().unwrap(), 1)))
        .expect_err("lo accepted");
    assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("not Ethernet"), "{err}");
}

/// `struct __user_cap_header_struct` / `__user_cap_data_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Copy, Clone, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Clears this thread's effective capabilities (root without them is like any user).
fn drop_effective_capabilities() {
    let mut header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset read and write one header and two data structs of the layout
    // the kernel expects for version 3; all are live for the calls. capset on pid 0 only
    // affects the calling thread.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()),
            0
        );
        data[0].effective = 0;
        data[1].effective = 0;
        assert_eq!(
            libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()),
            0,
            "capset: {}",
            io::Error::last_os_error()
        );
    }
}

#[test]
fn without_capabilities_bind_fails_with_permission_denied() {
    if !require_root("without_capabilities_bind_fails_with_permission_denied") {
        return;
    }
    let bed = Testbed::new(1);
    let err = bed
        .in_a(|| {
            drop_effective_capabilities();
            XdpDatapath::bind(xdp_config(1))
        })
        .expect_err("bound without capabilities");
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("CAP_BPF"), "{err}");
    eprintln!("unprivileged bind says: {err}");
    // The failed attempt left nothing behind: a privileged bind works.
    let xdp = bed.xdp_a(xdp_config(1));
    drop(xdp);
}

/// Packets per second delivered from `tx` to `rx` over about 2 s of 1400-byte datagrams.
fn measure(tx: &dyn Datapath, rx: &dyn Datapath, paths: u16) -> (f64, u64) {
    use std::sync::atomic::AtomicBool;
    let stop = AtomicBool::new(false);
    let payload = vec![0x5au8; 1400];
    let batch: Vec<Transmit<'_>> = (0..64)
        .map(|i| Transmit {
            dest: rx.local_addr(),
            path: i % paths,
            ecn: Ecn::Ect0,
            contents: &payload,
        })
        .collect();
    let run = Duration::from_secs(2);
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                sent += tx.send(&batch).unwrap() as u64;
            }
            sent
        });
        let mut scratch = RecvBatch::new(256, 2048);
        // Warm up (ARP, caches), then count for `run`.
        let warm = Instant::now() + Duration::from_millis(200);
        while Instant::now() < warm {
            rx.recv_with(
                &mut scratch,
                Some(Duration::from_millis(10)),
                &mut |_, _| {},
            )
            .unwrap();
        }
        let start = Instant::now();
        let mut got = 0u64;
        let mut bytes = 0u64;
        while start.elapsed() < run {
            got += rx
                .recv_with(
                    &mut scratch,
                    Some(Duration::from_millis(10)),
                    &mut |_, b| {
                        bytes += b.len() as u64;
                    },
                )
                .unwrap() as u64;
        }
        let secs = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let sent = sender.join().unwrap();
        (got as f64 / secs, sent)
    })
}

#[test]
#[ignore = "throughput measurement, run by hand: cargo test -p braid-datapath xdp -- --ignored"]
fn throughput_xdp_to_xdp_and_udp_to_udp() {
    if !require_root("throughput_xdp_to_xdp_and_udp_to_udp") {
        return;
    }
    let bed = Testbed::new(1);
    {
        let a = bed.xdp_a(xdp_config(16));
        let b_config = XdpConfig::new(SocketAddr::V4(SocketAddrV4::new(B_IP, XDP_PORT)), 16);
        let b = bed.in_b(|| XdpDatapath::bind(b_config)).expect("bind B");
        let (pps, sent) = measure(&a, &b, 16);
        eprintln!(
            "AF_XDP -> AF_XDP, 1400 B: {:.0} kpps delivered ({:.2} Gbit/s payload), {sent} sent",
            pps / 1e3,
            pps * 1400.0 * 8.0 / 1e9
        );
        eprintln!("  sender {:?}\n  receiver {:?}", a.stats(), b.stats());
    }
    let ua = {
        let local = SocketAddr::V4(SocketAddrV4::new(A_IP, UDP_PORT));
        bed.in_a(|| UdpDatapath::bind(UdpConfig::new(local, 16)))
            .expect("udp A")
    };
    let ub = bed.udp_b(16);
    let (pps, sent) = measure(&ua, &ub, 16);
    eprintln!(
        "UDP -> UDP, 1400 B: {:.0} kpps delivered ({:.2} Gbit/s payload), {sent} sent",
        pps / 1e3,
        pps * 1400.0 * 8.0 / 1e9
    );
}
