//! What every socket-based datapath must do, written once and run against each backend
//! (`conformance_tests!(Backend)` in the backend's test module): datagrams leave on the
//! source port of their path and arrive intact, ECN codepoints survive both ways (IPv4 and
//! IPv6), a wake-up ends a blocking receive and is remembered when it comes first,
//! unreachable destinations are skipped without failing the batch, a peer gone away costs
//! no other peer a datagram, and datagrams up to the
//! configured maximum pass, and segmentation offload (GSO runs on send, GRO splitting on
//! receive) delivers every datagram by itself, with a counter proving it happened.
//! Backend-specific behaviour (io_uring's buffer ring, sendmmsg chunking) stays in the
//! backend's own tests. AF_XDP needs a veth pair in a
//! namespace and has its own suite in `xdp::tests`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::udp::{OffloadStats, UdpConfig};
use crate::{Datapath, Ecn, RecvBatch, RecvMeta, Transmit};

/// A datapath backend under test.
pub(crate) trait Backend: Datapath + Sized + 'static {
    /// The name `Datapath::kind` reports.
    const KIND: &'static str;
    fn bind(config: UdpConfig) -> io::Result<Self>;
    /// The local address datagrams on `path` leave from.
    fn source_of(&self, path: u16) -> Option<SocketAddr>;
    /// Messages against datagrams sent and received so far.
    fn stats(&self) -> OffloadStats;
    /// Whether sends use UDP GSO now.
    fn gso_on(&self) -> bool;
    /// Whether receives use UDP GRO.
    fn gro_on(&self) -> bool;
}

/// Binds on IPv4 loopback with GSO and GRO as asked.
fn loopback_with<B: Backend>(paths: u16, gso: bool, gro: bool) -> B {
    let config = UdpConfig {
        gso,
        gro,
        ..UdpConfig::new("127.0.0.1:0".parse().unwrap(), paths)
    };
    B::bind(config).unwrap()
}

/// Whether this kernel does UDP GSO and GRO for `B`; if not, says SKIPPED (outside CI, where
/// that fails instead).
fn offload_available<B: Backend>(test: &str) -> bool {
    let probe: B = loopback(1);
    if probe.gso_on() && probe.gro_on() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: UDP GSO/GRO unavailable under CI"
    );
    eprintln!("SKIPPED {test}: this kernel lacks UDP GSO or GRO");
    false
}

fn loopback<B: Backend>(paths: u16) -> B {
    B::bind(UdpConfig::new("127.0.0.1:0".parse().unwrap(), paths)).unwrap()
}

/// Receives until `count` datagrams arrived or 5 s passed.
pub(crate) fn recv_all(dp: &dyn Datapath, count: usize) -> Vec<(RecvMeta, Vec<u8>)> {
    let mut batch = RecvBatch::new(32, 2048);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < count && Instant::now() < deadline {
        dp.recv(&mut batch, Some(Duration::from_millis(100)))
            .unwrap();
        got.extend(batch.iter().map(|(m, b)| (*m, b.to_vec())));
    }
    got
}

/// Sends the whole batch (retrying what the socket buffers refused) within 5 s.
pub(crate) fn send_all(dp: &dyn Datapath, batch: &[Transmit<'_>]) {
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sent < batch.len() && Instant::now() < deadline {
        sent += dp.send(&batch[sent..]).unwrap();
    }
    assert_eq!(sent, batch.len());
}

/// `payloads` as one batch to `dest`, all on `path`, not ECN-capable.
pub(crate) fn on_path<P: AsRef<[u8]>>(
    dest: SocketAddr,
    path: u16,
    payloads: &[P],
) -> Vec<Transmit<'_>> {
    payloads
        .iter()
        .map(|p| Transmit {
            dest,
            path,
            ecn: Ecn::NotEct,
            contents: p.as_ref(),
        })
        .collect()
}

/// A payload of `len` (at least 4) bytes starting with `i`.
pub(crate) fn numbered(i: u32, len: usize) -> Vec<u8> {
    let mut p = vec![(i % 251) as u8; len.max(4)];
    p[..4].copy_from_slice(&i.to_be_bytes());
    p
}

pub(crate) fn index_of(bytes: &[u8]) -> usize {
    u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize
}

/// 200 datagrams in runs of 8 equal sizes per path (GSO material), 16 paths: all arrive,
/// intact, each from its path's own source port.
pub(crate) fn batch_on_16_paths_arrives_intact_from_16_ports<B: Backend>() {
    let a: B = loopback(16);
    let b: B = loopback(16);
    assert_eq!(a.kind(), B::KIND);
    assert_eq!(a.paths(), 16);
    assert_eq!(a.max_payload(), crate::udp::DEFAULT_MAX_PAYLOAD_V4);
    let payloads: Vec<Vec<u8>> = (0..200u32)
        .map(|i| numbered(i, 4 + ((i as usize / 8) * 37) % 1400))
        .collect();
    let path_of = |i: usize| ((i / 8) % 16) as u16;
    let batch: Vec<Transmit<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| Transmit {
            dest: b.local_addr(),
            path: path_of(i),
            ecn: Ecn::NotEct,
            contents: p,
        })
        .collect();
    send_all(&a, &batch);
    let got = recv_all(&b, payloads.len());
    assert_eq!(got.len(), payloads.len());
    let mut by_index = BTreeMap::new();
    for (meta, bytes) in &got {
        assert_eq!(meta.len, bytes.len());
        let i = index_of(bytes);
        assert_eq!(bytes, &payloads[i], "payload {i} damaged");
        assert_eq!(
            Some(meta.src),
            a.source_of(path_of(i)),
            "datagram {i} left on the wrong path"
        );
        by_index.insert(i, meta.src.port());
    }
    assert_eq!(by_index.len(), payloads.len());
    let ports: BTreeSet<u16> = by_index.values().copied().collect();
    assert_eq!(ports.len(), 16);
    assert_eq!(a.source_of(0), Some(a.local_addr()));
    assert_eq!(a.source_of(16), None);
}

pub(crate) fn ecn_codepoints_survive_the_round_trip<B: Backend>() {
    let a: B = loopback(2);
    let b: B = loopback(1);
    let codepoints = [Ecn::Ect0, Ecn::Ce, Ecn::Ect1, Ecn::NotEct];
    let payloads: Vec<[u8; 10]> = (0..codepoints.len()).map(|i| [i as u8; 10]).collect();
    let batch: Vec<Transmit<'_>> = codepoints
        .iter()
        .enumerate()
        .map(|(i, ecn)| Transmit {
            dest: b.local_addr(),
            path: (i % 2) as u16,
            ecn: *ecn,
            contents: &payloads[i],
        })
        .collect();
    send_all(&a, &batch);
    let got = recv_all(&b, codepoints.len());
    assert_eq!(got.len(), codepoints.len());
    for (meta, bytes) in got {
        let i = usize::from(bytes[0]);
        assert_eq!(meta.ecn, codepoints[i], "datagram {i}");
    }
}

pub(crate) fn ecn_works_over_ipv6<B: Backend>() {
    let a = match B::bind(UdpConfig::new("[::1]:0".parse().unwrap(), 2)) {
        Ok(a) => a,
        // CI machines have IPv6 loopback: there a failure to bind is a failure.
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED ecn_works_over_ipv6: no IPv6 loopback here ({e})");
            return;
        }
        Err(e) => panic!("binding [::1] failed under CI: {e}"),
    };
    let b = B::bind(UdpConfig::new("[::1]:0".parse().unwrap(), 1)).unwrap();
    assert_eq!(a.max_payload(), crate::udp::DEFAULT_MAX_PAYLOAD_V6);
    let batch = [
        Transmit {
            dest: b.local_addr(),
            path: 0,
            ecn: Ecn::Ect0,
            contents: &[0],
        },
        Transmit {
            dest: b.local_addr(),
            path: 1,
            ecn: Ecn::Ce,
            contents: &[1],
        },
    ];
    send_all(&a, &batch);
    let got = recv_all(&b, 2);
    assert_eq!(got.len(), 2);
    for (meta, bytes) in got {
        assert_eq!(meta.ecn, batch[usize::from(bytes[0])].ecn);
        assert_eq!(Some(meta.src), a.source_of(u16::from(bytes[0])));
    }
}

pub(crate) fn wake_ends_a_blocking_recv<B: Backend>() {
    let dp = Arc::new(loopback::<B>(1));
    let receiver = Arc::clone(&dp);
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut batch = RecvBatch::new(4, 2048);
        let n = receiver.recv(&mut batch, None);
        tx.send(n.map_err(|e| e.kind())).unwrap();
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        rx.try_recv().is_err(),
        "recv(None) returned before the wake-up"
    );
    dp.wake();
    let result = rx
        .recv_timeout(Duration::from_secs(2))
        .expect("recv did not wake up");
    assert_eq!(result, Ok(0));
    handle.join().unwrap();
}

pub(crate) fn wake_before_recv_makes_the_next_recv_return<B: Backend>() {
    let dp: B = loopback(1);
    dp.wake();
    dp.wake();
    let mut batch = RecvBatch::new(4, 2048);
    assert_eq!(dp.recv(&mut batch, None).unwrap(), 0);
    // The wake-up was consumed: now a short timeout expires.
    let start = Instant::now();
    assert_eq!(
        dp.recv(&mut batch, Some(Duration::from_millis(20)))
            .unwrap(),
        0
    );
    assert!(start.elapsed() >= Duration::from_millis(15));
}

/// An IPv6 destination from an IPv4 datapath and port 0 are skipped; the rest of the batch
/// goes out; a path number past the datapath's count wraps.
pub(crate) fn unreachable_destinations_are_skipped_not_fatal<B: Backend>() {
    let a: B = loopback(2);
    let b: B = loopback(1);
    let v6_dest: SocketAddr = "[2001:db8::1]:9".parse().unwrap();
    let to = |dest, path, first: &'static [u8]| Transmit {
        dest,
        path,
        ecn: Ecn::NotEct,
        contents: first,
    };
    let batch = [
        to(v6_dest, 0, &[1]),
        to(b.local_addr(), 0, &[2]),
        to("127.0.0.1:0".parse().unwrap(), 1, &[3]),
        to(b.local_addr(), 7, &[4]),
    ];
    assert_eq!(a.send(&batch).unwrap(), batch.len());
    let got = recv_all(&b, 2);
    let firsts: BTreeSet<u8> = got.iter().map(|(_, bytes)| bytes[0]).collect();
    assert_eq!(firsts, BTreeSet::from([2, 4]));
    // Path 7 of a two-path datapath wraps to path 1.
    let path7 = got.iter().find(|(_, bytes)| bytes[0] == 4).unwrap();
    assert_eq!(Some(path7.0.src), a.source_of(1));
}

/// A send-only path socket is set up at its first send (connected to that destination,
/// see `udp::PathSockets`): it still reaches other destinations from the path's port with
/// their own ECN codepoints, the port-unreachable a peer that went away causes does not cost
/// the next datagram (to someone else) its send, and path 0 still receives from anyone.
pub(crate) fn a_gone_peer_costs_no_other_peer_a_datagram<B: Backend>() {
    let a: B = loopback(2);
    let (b, c): (B, B) = (loopback(1), loopback(1));
    let gone = loopback::<B>(1).local_addr(); // closed at once: the port is unreachable
    send_all(&a, &on_path(gone, 1, &[[0u8; 4]]));
    // The ICMP error is pending (loopback answers at once); then the first peer again and
    // two others are reached through the same socket.
    std::thread::sleep(Duration::from_millis(20));
    send_all(&a, &on_path(b.local_addr(), 1, &[*b"to-b"]));
    send_all(&a, &on_path(gone, 1, &[[1u8; 4]]));
    let to_c_bytes = [*b"to-c"];
    let mut to_c = on_path(c.local_addr(), 1, &to_c_bytes);
    to_c[0].ecn = Ecn::Ect0;
    send_all(&a, &to_c);
    for (dp, want, ecn) in [(&b, b"to-b", Ecn::NotEct), (&c, b"to-c", Ecn::Ect0)] {
        let got = recv_all(dp, 1);
        assert_eq!(got.len(), 1, "{want:?} arrived");
        assert_eq!(&got[0].1[..], want);
        assert_eq!(got[0].0.ecn, ecn);
        assert_eq!(Some(got[0].0.src), a.source_of(1));
    }
    send_all(&a, &on_path(b.local_addr(), 0, &[*b"p0-b"]));
    send_all(&c, &on_path(a.local_addr(), 0, &[*b"from"]));
    assert_eq!(recv_all(&a, 1).len(), 1);
    assert_eq!(&recv_all(&b, 1)[0].1[..], b"p0-b");
}

/// A datagram of the largest payload the datapath allows passes loopback intact, with ECN.
pub(crate) fn large_datagrams_pass_on_loopback<B: Backend>() {
    let config = UdpConfig {
        max_payload: crate::MAX_DATAGRAM,
        ..UdpConfig::new("127.0.0.1:0".parse().unwrap(), 1)
    };
    let a = B::bind(config).unwrap();
    let b = B::bind(config).unwrap();
    let len = crate::MAX_DATAGRAM;
    let payload: Vec<u8> = (0..len as u32).map(|i| (i % 253) as u8).collect();
    send_all(
        &a,
        &[Transmit {
            dest: b.local_addr(),
            path: 0,
            ecn: Ecn::Ect1,
            contents: &payload,
        }],
    );
    let mut rb = RecvBatch::new(2, len);
    let mut n = 0;
    for _ in 0..50 {
        n = b.recv(&mut rb, Some(Duration::from_millis(100))).unwrap();
        if n > 0 {
            break;
        }
    }
    assert_eq!(n, 1);
    let (meta, bytes) = rb.iter().next().unwrap();
    assert_eq!(bytes, &payload[..]);
    assert_eq!(meta.ecn, Ecn::Ect1);
}

/// A mixed batch (three paths, two destinations, runs of equal sizes with a short last one,
/// a run longer than 64 segments, ECN changes, single datagrams between runs) arrives
/// complete and intact from the right source ports, with GSO on and off and GRO on and off
/// at the receivers; with GSO on the same-path runs went out as fewer messages than
/// datagrams, with it off one message per datagram.
pub(crate) fn mixed_batch_arrives_intact_with_gso_on_and_off<B: Backend>() {
    let offload = offload_available::<B>("mixed_batch_arrives_intact_with_gso_on_and_off");
    for (gso, gro) in [(true, true), (true, false), (false, true), (false, false)] {
        if (gso || gro) && !offload {
            continue;
        }
        let a: B = loopback_with(4, gso, false);
        let b1: B = loopback_with(1, false, gro);
        let b2: B = loopback_with(1, false, gro);
        // (destination, path, ecn, length) per datagram, in batch order.
        let mut plan: Vec<(u8, u16, Ecn, usize)> = Vec::new();
        // 100 x 1000 bytes on one path: longer than a 64-segment message.
        plan.extend((0..100).map(|_| (1, 0, Ecn::Ect0, 1000)));
        // 7 x 700 then a short 300 on path 1, then an ECN change on the same path.
        plan.extend((0..7).map(|_| (1, 1, Ecn::Ect0, 700)));
        plan.push((1, 1, Ecn::Ect0, 300));
        plan.extend((0..5).map(|_| (1, 1, Ecn::Ce, 700)));
        // Path 2, alternating destinations (no run longer than one), then a run to b2.
        plan.extend((0..6).map(|k| (1 + (k % 2) as u8, 2, Ecn::NotEct, 400)));
        plan.extend((0..30).map(|_| (2, 2, Ecn::Ect1, 1472)));
        // Single datagrams of growing size on path 3 (a longer one never joins a run).
        plan.extend((0..10).map(|k| (2, 3, Ecn::NotEct, 100 + k * 10)));
        let payloads: Vec<Vec<u8>> = plan
            .iter()
            .enumerate()
            .map(|(i, &(_, _, _, len))| numbered(i as u32, len))
            .collect();
        let dest = |d: u8| {
            if d == 1 {
                b1.local_addr()
            } else {
                b2.local_addr()
            }
        };
        let batch: Vec<Transmit<'_>> = plan
            .iter()
            .zip(&payloads)
            .map(|(&(d, path, ecn, _), p)| Transmit {
                dest: dest(d),
                path,
                ecn,
                contents: p,
            })
            .collect();
        send_all(&a, &batch);
        let to_b1 = plan.iter().filter(|p| p.0 == 1).count();
        let mut got = recv_all(&b1, to_b1);
        got.extend(recv_all(&b2, plan.len() - to_b1));
        let case = format!("{} gso={gso} gro={gro}", B::KIND);
        assert_eq!(got.len(), plan.len(), "{case}: datagrams lost");
        let mut seen = BTreeSet::new();
        for (meta, bytes) in &got {
            let i = index_of(bytes);
            let (_, path, ecn, len) = plan[i];
            assert_eq!(meta.len, len, "{case}: datagram {i} length");
            assert_eq!(bytes, &payloads[i], "{case}: datagram {i} damaged");
            assert_eq!(meta.ecn, ecn, "{case}: datagram {i} ECN");
            assert_eq!(
                meta.src,
                a.source_of(path).unwrap(),
                "{case}: datagram {i} path"
            );
            assert!(seen.insert(i), "{case}: datagram {i} delivered twice");
        }
        let sent = a.stats();
        assert_eq!(sent.datagrams_sent, plan.len() as u64, "{case}");
        if gso {
            // Runs: 64 + 36 (path 0), 8 (7 + short), 5, six singles, 30, ten singles.
            assert_eq!(sent.messages_sent, 2 + 1 + 1 + 6 + 1 + 10, "{case}");
        } else {
            assert_eq!(sent.messages_sent, plan.len() as u64, "{case}");
        }
        let received = |b: &B| b.stats();
        for b in [&b1, &b2] {
            let r = received(b);
            if !gro {
                assert_eq!(r.messages_received, r.datagrams_received, "{case}");
            }
        }
        let total: u64 = [&b1, &b2]
            .iter()
            .map(|b| received(b).datagrams_received)
            .sum();
        assert_eq!(total, plan.len() as u64, "{case}");
    }
}

/// A GSO run received with GRO on arrives coalesced (fewer receive buffers than datagrams)
/// and is split again: every segment comes out by itself, in order, with its own length and
/// the sender's path as source, also when the caller takes fewer datagrams per call than a
/// run holds.
pub(crate) fn gro_splits_coalesced_runs_into_datagrams<B: Backend>() {
    if !offload_available::<B>("gro_splits_coalesced_runs_into_datagrams") {
        return;
    }
    let a: B = loopback_with(2, true, false);
    let b: B = loopback_with(1, false, true);
    let lens: Vec<usize> = (0..20).map(|_| 500).chain([123]).collect();
    let payloads: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| numbered(i as u32, len))
        .collect();
    let batch: Vec<Transmit<'_>> = payloads
        .iter()
        .map(|p| Transmit {
            dest: b.local_addr(),
            path: 1,
            ecn: Ecn::Ect0,
            contents: p,
        })
        .collect();
    for round in 0..2 {
        send_all(&a, &batch);
        // Three per call: the 21-datagram run is handed over across seven calls.
        let mut scratch = RecvBatch::new(3, 2048);
        let mut order = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while order.len() < lens.len() && Instant::now() < deadline {
            let n = if round == 0 {
                b.recv_with(
                    &mut scratch,
                    Some(Duration::from_millis(100)),
                    &mut |meta, bytes| {
                        assert_eq!(meta.len, bytes.len());
                        assert_eq!(meta.src, a.source_of(1).unwrap());
                        assert_eq!(meta.ecn, Ecn::Ect0);
                        let i = index_of(bytes);
                        assert_eq!(bytes, &payloads[i][..], "datagram {i} damaged");
                        order.push(i);
                    },
                )
                .unwrap()
            } else {
                let n = b
                    .recv(&mut scratch, Some(Duration::from_millis(100)))
                    .unwrap();
                for (meta, bytes) in scratch.iter() {
                    assert_eq!(meta.src, a.source_of(1).unwrap());
                    let i = index_of(bytes);
                    assert_eq!(bytes, &payloads[i][..], "datagram {i} damaged");
                    order.push(i);
                }
                n
            };
            assert!(n <= 3, "{n} datagrams handed over past the limit of 3");
        }
        assert_eq!(order, (0..lens.len()).collect::<Vec<_>>(), "round {round}");
    }
    let r = b.stats();
    assert_eq!(r.datagrams_received, 2 * lens.len() as u64);
    assert!(
        r.messages_received < r.datagrams_received,
        "GRO coalesced nothing: {r:?}"
    );
    assert_eq!(a.stats().messages_sent, 2, "each round is one GSO message");
}

/// A datagram that sat in the kernel before `recv` took it reports that wait (the kernel's
/// receive timestamp), with GRO on and off; one taken at once reports little.
pub(crate) fn a_datagram_left_waiting_reports_its_wait<B: Backend>() {
    const WAIT: Duration = Duration::from_millis(30);
    for gro in [false, true] {
        let a: B = loopback(1);
        let b: B = loopback_with(1, false, gro);
        // The kernel turns arrival stamping on a moment after the first socket asks (until
        // then it stamps at `recv`, which reads as no wait): let it.
        std::thread::sleep(WAIT);
        let payloads: Vec<[u8; 100]> = (0..3).map(|i| [i as u8; 100]).collect();
        send_all(&a, &on_path(b.local_addr(), 0, &payloads));
        std::thread::sleep(WAIT);
        let got = recv_all(&b, payloads.len());
        assert_eq!(got.len(), payloads.len(), "gro {gro}");
        for (meta, bytes) in &got {
            // The sleep is a lower bound; the upper one only rules out nonsense.
            assert!(
                u64::from(meta.queued_ns) >= WAIT.as_nanos() as u64 * 9 / 10
                    && u64::from(meta.queued_ns) < 10_000_000_000,
                "gro {gro}, datagram {}: waited {} ns",
                bytes[0],
                meta.queued_ns
            );
        }
    }
}

/// Runs of equal datagrams that lie back to back in one buffer (the runtime's transmit slots,
/// which the socket backends send as one iovec per run), with a shorter last one, beside a run
/// in separate buffers: every datagram arrives intact, from its path.
pub(crate) fn runs_back_to_back_in_memory_arrive_intact<B: Backend>() {
    let a: B = loopback(4);
    let b: B = loopback(1);
    // Datagrams 0-9 of 1000 bytes in one buffer, 10 of 600 right after them; 11-15 apart.
    let sizes = |i: u32| if i == 10 { 600 } else { 1000 };
    let one: Vec<u8> = (0..11u32).flat_map(|i| numbered(i, sizes(i))).collect();
    let apart: Vec<Vec<u8>> = (11..16u32).map(|i| numbered(i, 1000)).collect();
    let mut slices: Vec<&[u8]> = Vec::new();
    let mut at = 0;
    for i in 0..11u32 {
        slices.push(&one[at..at + sizes(i)]);
        at += sizes(i);
    }
    slices.extend(apart.iter().map(Vec::as_slice));
    let path_of = |i: usize| {
        if i < 6 {
            1
        } else if i < 11 {
            2
        } else {
            3
        }
    };
    let batch: Vec<Transmit<'_>> = slices
        .iter()
        .enumerate()
        .map(|(i, c)| Transmit {
            dest: b.local_addr(),
            path: path_of(i),
            ecn: Ecn::NotEct,
            contents: c,
        })
        .collect();
    send_all(&a, &batch);
    let got = recv_all(&b, batch.len());
    assert_eq!(got.len(), batch.len());
    let mut seen = BTreeSet::new();
    for (meta, bytes) in &got {
        let i = index_of(bytes);
        assert_eq!(bytes.as_slice(), slices[i], "datagram {i} damaged");
        assert_eq!(
            Some(meta.src),
            a.source_of(path_of(i)),
            "datagram {i} on the wrong path"
        );
        seen.insert(i);
    }
    assert_eq!(seen.len(), batch.len());
}

/// One `#[test]` per conformance check for `$backend`.
macro_rules! conformance_tests {
    ($backend:ty) => {
        mod conforms {
            use super::*;
            use crate::conformance as c;
            #[test]
            fn batch_on_16_paths_arrives_intact_from_16_ports() {
                c::batch_on_16_paths_arrives_intact_from_16_ports::<$backend>();
            }
            #[test]
            fn runs_back_to_back_in_memory_arrive_intact() {
                c::runs_back_to_back_in_memory_arrive_intact::<$backend>();
            }
            #[test]
            fn ecn_codepoints_survive_the_round_trip() {
                c::ecn_codepoints_survive_the_round_trip::<$backend>();
            }
            #[test]
            fn ecn_works_over_ipv6() {
                c::ecn_works_over_ipv6::<$backend>();
            }
            #[test]
            fn wake_ends_a_blocking_recv() {
                c::wake_ends_a_blocking_recv::<$backend>();
            }
            #[test]
            fn wake_before_recv_makes_the_next_recv_return() {
                c::wake_before_recv_makes_the_next_recv_return::<$backend>();
            }
            #[test]
            fn unreachable_destinations_are_skipped_not_fatal() {
                c::unreachable_destinations_are_skipped_not_fatal::<$backend>();
            }
            #[test]
            fn a_gone_peer_costs_no_other_peer_a_datagram() {
                c::a_gone_peer_costs_no_other_peer_a_datagram::<$backend>();
            }
            #[test]
            fn large_datagrams_pass_on_loopback() {
                c::large_datagrams_pass_on_loopback::<$backend>();
            }
            #[test]
            fn mixed_batch_arrives_intact_with_gso_on_and_off() {
                c::mixed_batch_arrives_intact_with_gso_on_and_off::<$backend>();
            }
            #[test]
            fn gro_splits_coalesced_runs_into_datagrams() {
                c::gro_splits_coalesced_runs_into_datagrams::<$backend>();
            }
            #[test]
            fn a_datagram_left_waiting_reports_its_wait() {
                c::a_datagram_left_waiting_reports_its_wait::<$backend>();
            }
        }
    };
}
pub(crate) use conformance_tests;
