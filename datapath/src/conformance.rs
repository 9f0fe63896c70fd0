//! What every socket-based datapath must do, written once and run against each backend
//! (`conformance_tests!(Backend)` in the backend's test module): datagrams leave on the
//! source port of their path and arrive intact, ECN codepoints survive both ways (IPv4 and
//! IPv6), a wake-up ends a blocking receive and is remembered when it comes first,
//! unreachable destinations are skipped without failing the batch, and datagrams up to the
//! configured maximum pass. Backend-specific behaviour (io_uring's buffer ring and GSO,
//! sendmmsg chunking) stays in the backend's own tests. AF_XDP needs a veth pair in a
//! namespace and has its own suite in `xdp::tests`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::udp::UdpConfig;
use crate::{Datapath, Ecn, RecvBatch, RecvMeta, Transmit};

/// A datapath backend under test.
pub(crate) trait Backend: Datapath + Sized + 'static {
    /// The name `Datapath::kind` reports.
    const KIND: &'static str;
    fn bind(config: UdpConfig) -> io::Result<Self>;
    /// The local address datagrams on `path` leave from.
    fn source_of(&self, path: u16) -> Option<SocketAddr>;
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
            fn large_datagrams_pass_on_loopback() {
                c::large_datagrams_pass_on_loopback::<$backend>();
            }
        }
    };
}
pub(crate) use conformance_tests;
