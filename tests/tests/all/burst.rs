//! Burst spraying (`EndpointConfig::burst`, `QpOptions::burst`): a QP draws a path once per
//! burst of B new packets, so they leave consecutively on one path and the datapath can send
//! them as one UDP GSO message. Engines driven by hand show the path sequence; devices over
//! UDP sockets and io_uring on loopback (GSO and GRO on, their default) show every byte of a
//! WRITE placed.
use std::net::SocketAddr;
use std::time::Duration;

use braid::proto::{
    Access, CqId, Endpoint, EndpointConfig, PdId, QpOptions, Region, RemoteAddr, SendOp, SendWr,
    Sge, Timestamp, WcStatus,
};
use braid::{DatapathKind, Device, DeviceConfig};

use crate::support::random_mr;

const A: &str = "10.0.0.1:4791";
const B: &str = "10.0.0.2:4791";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

fn node(at: &str, seed: u64, burst: u16) -> (Endpoint, PdId, CqId) {
    let cfg = EndpointConfig {
        seed,
        burst,
        ..EndpointConfig::default()
    };
    let mut ep = Endpoint::new(cfg, addr(at));
    let pd = ep.alloc_pd();
    let cq = ep.create_cq();
    (ep, pd, cq)
}

/// Bytes of each test WRITE.
const LEN: usize = 200_000;

/// Connects a new QP of A (options `opts`) to a new QP of B and posts one signaled WRITE of
/// `data` (`LEN` bytes) from a region of A to a region of B; returns B's region.
fn post_write(
    (a, apd, acq): (&mut Endpoint, PdId, CqId),
    (b, bpd, bcq): (&mut Endpoint, PdId, CqId),
    opts: QpOptions,
    data: &[u8],
    wr_id: u64,
) -> std::sync::Arc<Region> {
    let qa = a.create_qp_with(apd, acq, acq, opts).expect("qp a");
    let qb = b
        .create_qp_with(bpd, bcq, bcq, QpOptions::default())
        .expect("qp b");
    a.connect(qa.qpn, qb).expect("connect a");
    b.connect(qb.qpn, qa).expect("connect b");
    let src = Region::new(LEN);
    src.write(0, data).expect("in bounds");
    let dst = Region::new(LEN);
    let sk = a.register(apd, src, Access::NONE).expect("register src");
    let dk = b
        .register(bpd, dst.clone(), Access::REMOTE_WRITE)
        .expect("register dst");
    let wr = SendWr {
        wr_id,
        op: SendOp::Write(RemoteAddr {
            rkey: dk.rkey,
            offset: 0,
        }),
        sges: vec![Sge {
            lkey: sk.lkey,
            offset: 0,
            len: LEN as u32,
        }],
        signaled: true,
    };
    a.post_send(qa.qpn, wr).expect("post");
    dst
}

/// Moves datagrams between A and B on a perfect in-memory wire until A has `want`
/// successful completions; `sent` sees every datagram A sent (its bytes and path), in order.
fn run_until(a: &mut Endpoint, b: &mut Endpoint, want: usize, mut sent: impl FnMut(&[u8], u16)) {
    let mut now = Timestamp::ZERO;
    let mut buf = vec![0u8; 65_536];
    let mut done = 0;
    for _ in 0..100_000 {
        let mut quiet = true;
        while let Some(t) = a.poll_transmit(now, &mut buf) {
            quiet = false;
            sent(&buf[..t.len], t.path);
            b.handle_datagram(now, addr(A), 0, &buf[..t.len]);
        }
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            quiet = false;
            a.handle_datagram(now, addr(B), 0, &buf[..t.len]);
        }
        while let Some((_, wc)) = a.poll_completion() {
            assert_eq!(wc.status, WcStatus::Success);
            done += 1;
        }
        if done == want {
            return;
        }
        if quiet {
            now = now.add_nanos(5_000);
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
    }
    panic!("{done} of {want} WRITEs completed");
}

/// Runs one 200 KB WRITE from A (QP options `opts`, endpoint burst `ep_burst`) to B on a
/// perfect in-memory wire and returns the path of every datagram A sent, in order, after
/// checking the bytes landed.
fn write_paths(ep_burst: u16, opts: QpOptions) -> Vec<u16> {
    let (mut a, apd, acq) = node(A, 7, ep_burst);
    let (mut b, bpd, bcq) = node(B, 8, 1);
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    let dst = post_write((&mut a, apd, acq), (&mut b, bpd, bcq), opts, &data, 1);
    let mut paths = Vec::new();
    run_until(&mut a, &mut b, 1, |_, p| paths.push(p));
    assert_eq!(dst.to_vec(0, LEN).expect("whole region"), data);
    paths
}

#[test]
fn a_burst_of_one_sprays_exactly_as_before() {
    let per_packet = write_paths(1, QpOptions::default());
    assert!(per_packet.len() > 100, "{} datagrams", per_packet.len());
    // Burst 0 reads as 1, and a QP option of 1 over an endpoint default of 8 wins.
    assert_eq!(write_paths(0, QpOptions::default()), per_packet);
    assert_eq!(
        write_paths(8, QpOptions::default().with_burst(1)),
        per_packet
    );
    // Per packet, a 16-path spray rarely repeats a path four times in a row.
    let repeats = per_packet
        .windows(4)
        .filter(|w| w.iter().all(|&p| p == w[0]))
        .count();
    assert!(repeats < 3, "{repeats} runs of four on one path");
}

#[test]
fn new_packets_leave_in_bursts_on_one_path() {
    for (ep_burst, opts, burst) in [
        (4, QpOptions::default(), 4),
        (1, QpOptions::default().with_burst(11), 11),
        (44, QpOptions::default(), 44),
    ] {
        let paths = write_paths(ep_burst, opts);
        let n = paths.len();
        assert!(n > 3 * burst, "{n} datagrams for bursts of {burst}");
        // No loss on this wire: every datagram A sent is a new packet, so the sequence
        // cuts into bursts of `burst` on one path each (the last may be shorter).
        for (k, chunk) in paths.chunks(burst).enumerate() {
            assert!(
                chunk.iter().all(|&p| p == chunk[0]),
                "burst {burst}: burst {k} spans paths {chunk:?}"
            );
        }
        // Still spraying: the bursts use several paths.
        let mut used: Vec<u16> = paths.chunks(burst).map(|c| c[0]).collect();
        used.sort_unstable();
        used.dedup();
        assert!(used.len() >= 3, "burst {burst}: paths used {used:?}");
    }
}

/// Two QPs of one endpoint with bursts of 8, each with a 200 KB WRITE to its own QP at the
/// peer: a QP in the middle of a burst keeps its turn, so each burst leaves whole (8 datagrams
/// of one QP on one path, back to back: one GSO message) instead of the two QPs' datagrams
/// alternating, which would leave the datapath runs of one.
#[test]
fn two_qps_send_their_bursts_whole_not_interleaved() {
    const BURST: usize = 8;
    let (mut a, apd, acq) = node(A, 7, BURST as u16);
    let (mut b, bpd, bcq) = node(B, 8, 1);
    let data: Vec<u8> = (0..LEN).map(|i| (i * 13 % 251) as u8).collect();
    let dsts: Vec<_> = (0..2)
        .map(|k| {
            let (a, b) = ((&mut a, apd, acq), (&mut b, bpd, bcq));
            post_write(a, b, QpOptions::default(), &data, k)
        })
        .collect();
    // (source QP, path) of every datagram A sent, in order.
    let mut sent = Vec::new();
    run_until(&mut a, &mut b, 2, |bytes, path| {
        let pkt = braid::proto::wire::Packet::parse(bytes).expect("a datagram");
        sent.push((pkt.header.src_qpn, path));
    });
    for dst in &dsts {
        assert_eq!(dst.to_vec(0, LEN).expect("whole region"), data);
    }
    // Cut the sequence where the source QP changes: every run is whole bursts of one QP on
    // one path each (only a QP's last burst may be shorter).
    let mut runs: Vec<&[(u32, u16)]> = Vec::new();
    let mut start = 0;
    for i in 1..=sent.len() {
        if i == sent.len() || sent[i].0 != sent[start].0 {
            runs.push(&sent[start..i]);
            start = i;
        }
    }
    let qps: std::collections::BTreeSet<u32> = sent.iter().map(|s| s.0).collect();
    assert_eq!(qps.len(), 2, "both QPs sent");
    assert!(runs.len() > 4, "the QPs took turns: {} runs", runs.len());
    let mut short = 0;
    for run in &runs {
        for burst in run.chunks(BURST) {
            assert!(
                burst.iter().all(|&(_, p)| p == burst[0].1),
                "a burst spans paths: {burst:?}"
            );
        }
        short += usize::from(run.len() % BURST != 0);
    }
    assert!(short <= 2, "{short} runs end inside a burst");
}

/// A 3 MB WRITE between two devices on loopback with bursts of `burst` over `kind`, GSO and
/// GRO on (the datapaths' default): every byte lands.
fn device_write_with_bursts(kind: DatapathKind, burst: u16) {
    let open = || {
        let mut cfg = DeviceConfig::udp("127.0.0.1:0".parse().expect("addr")).paths(4);
        cfg.datapath = kind;
        cfg.engine.burst = burst;
        Device::open(cfg)
    };
    let (da, db) = match (open(), open()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) if kind == DatapathKind::Uring => {
            assert!(
                std::env::var_os("CI").is_none(),
                "io_uring device failed to open under CI: {e}"
            );
            eprintln!("SKIPPED device_write_with_bursts over io_uring: {e}");
            return;
        }
        (Err(e), _) | (_, Err(e)) => panic!("open a {kind:?} device: {e}"),
    };
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (ca, cb) = (da.create_cq(), db.create_cq());
    let qa = pa.create_qp(&ca, &ca).expect("qp a");
    let qb = pb.create_qp(&cb, &cb).expect("qp b");
    qa.connect(qb.info()).expect("connect a");
    qb.connect(qa.info()).expect("connect b");
    const LEN: usize = 3 << 20;
    let (src, data) = random_mr(&pa, LEN, Access::NONE, 11);
    let (dst, _) = random_mr(&pb, LEN + 100, Access::REMOTE_WRITE, 12);
    qa.post_send(SendWr {
        wr_id: 9,
        op: SendOp::Write(dst.remote(100)),
        sges: vec![src.sge(0, LEN as u32)],
        signaled: true,
    })
    .expect("post");
    let wc = ca
        .wait(Duration::from_secs(30))
        .expect("a completion within the wait");
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success), "{kind:?}");
    let mut got = vec![0u8; LEN];
    dst.read(100, &mut got).expect("in bounds");
    assert!(got == data, "{kind:?} burst {burst}: target region differs");
}

#[test]
fn writes_in_bursts_over_udp_sockets_place_every_byte() {
    device_write_with_bursts(DatapathKind::Udp, 11);
    device_write_with_bursts(DatapathKind::Udp, 1);
}

#[test]
fn writes_in_bursts_over_io_uring_place_every_byte() {
    device_write_with_bursts(DatapathKind::Uring, 11);
}
