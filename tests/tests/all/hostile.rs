//! Refusals: bad keys, bounds and rights at the responder; hostile datagrams handed straight
//! to the engine; receives too short for their SEND; and bad API use.
use std::net::SocketAddr;

use braid::datapath::sim::LinkConfig;
use braid::proto::wire::{self, Body, Header, Kind, Op, Request};
use braid::proto::{
    Access, Endpoint, EndpointConfig, PostError, QpState, RecvWr, RemoteAddr, SendOp, SendWr, Sge,
    WcOpcode, WcStatus,
};
use braid::testing::Mr;
use rand_core::RngCore;

use crate::support::{Sim, below, config, hostile_link, rng, seed, sge, snapshot};

/// A remote operation from a to b, built from the target region's rkey.
type MakeOp = fn(rkey: u32) -> SendOp;

/// Posts `op` from a against a 4 KiB region on b registered with `access` (and, when
/// `other_pd`, in a protection domain the QP does not use); asserts the requester gets
/// `RemoteAccessError` and that no byte changed on either side.
fn assert_refused(
    seed: u64,
    link: LinkConfig,
    access: Access,
    other_pd: bool,
    len: u32,
    make: MakeOp,
) {
    let mut sim = Sim::new(seed, &config(8, 10), link);
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let local = sim.random_mr(a, 64 * 1024, Access::LOCAL_WRITE, &mut rng);
    let target = if other_pd {
        let pd = sim.c.ep_mut(b.node).alloc_pd();
        let mut side = b;
        side.pd = pd;
        sim.random_mr(side, 4096, access, &mut rng)
    } else {
        sim.random_mr(b, 4096, access, &mut rng)
    };
    let bystander = sim.random_mr(b, 4096, Access::ALL, &mut rng);
    // A RECV for WRITE_IMM to consume, so refusals are about the region, not receiver
    // readiness.
    sim.post_recv(
        b,
        RecvWr {
            wr_id: 2,
            sges: vec![sge(&bystander, 0, 64)],
        },
    );
    let before = [
        snapshot(&local.region),
        snapshot(&target.region),
        snapshot(&bystander.region),
    ];
    let op = make(target.keys.rkey);
    let sges = if matches!(op, SendOp::FetchAdd(..) | SendOp::CompareSwap { .. }) {
        vec![sge(&local, 0, 8)]
    } else {
        vec![sge(&local, 0, len)]
    };
    sim.post_send(
        a,
        SendWr {
            wr_id: 1,
            op,
            sges,
            signaled: true,
        },
    );
    let got = sim.wait_cq(a, 1, 200_000);
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (1, WcStatus::RemoteAccessError),
        "seed {seed}: {op:?}"
    );
    sim.c.run_until(10_000, |c| c.next_event().is_none());
    let after = [
        snapshot(&local.region),
        snapshot(&target.region),
        snapshot(&bystander.region),
    ];
    for (i, name) in ["requester buffer", "target region", "other region"]
        .iter()
        .enumerate()
    {
        assert!(
            before[i] == after[i],
            "seed {seed}: {op:?} changed the {name}"
        );
    }
    assert!(sim.c.ep(b.node).stats().naks_sent >= 1, "seed {seed}");
    assert_eq!(
        sim.c.ep(a.node).qp_stats(a.qp.qpn).map(|s| s.state),
        Some(QpState::Error),
        "seed {seed}"
    );
}

const KIB: u32 = 1024;

#[test]
fn write_with_a_wrong_rkey_is_refused_and_changes_nothing() {
    assert_refused(
        seed(201),
        LinkConfig::default(),
        Access::ALL,
        false,
        3000,
        |rkey| {
            SendOp::Write(RemoteAddr {
                rkey: rkey ^ 1,
                offset: 0,
            })
        },
    );
}

#[test]
fn write_past_the_region_end_is_refused_and_changes_nothing() {
    // 10 KiB into a 4 KiB region: eight packets, none of which may land.
    assert_refused(
        seed(202),
        LinkConfig::default(),
        Access::ALL,
        false,
        10 * KIB,
        |rkey| SendOp::Write(RemoteAddr { rkey, offset: 0 }),
    );
}

#[test]
fn write_one_byte_past_the_region_end_is_refused() {
    assert_refused(
        seed(203),
        LinkConfig::default(),
        Access::ALL,
        false,
        1000,
        |rkey| {
            SendOp::Write(RemoteAddr {
                rkey,
                offset: 4096 - 999,
            })
        },
    );
}

#[test]
fn write_at_a_wrapping_offset_is_refused() {
    assert_refused(
        seed(204),
        LinkConfig::default(),
        Access::ALL,
        false,
        16,
        |rkey| {
            SendOp::Write(RemoteAddr {
                rkey,
                offset: u64::MAX - 7,
            })
        },
    );
}

#[test]
fn write_without_remote_write_right_is_refused() {
    assert_refused(
        seed(205),
        LinkConfig::default(),
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        false,
        100,
        |rkey| SendOp::Write(RemoteAddr { rkey, offset: 0 }),
    );
}

#[test]
fn write_imm_without_remote_write_right_is_refused() {
    assert_refused(
        seed(206),
        LinkConfig::default(),
        Access::REMOTE_READ,
        false,
        100,
        |rkey| SendOp::WriteImm(RemoteAddr { rkey, offset: 0 }, 5),
    );
}

#[test]
fn write_into_a_region_of_another_protection_domain_is_refused() {
    assert_refused(
        seed(207),
        LinkConfig::default(),
        Access::ALL,
        true,
        100,
        |rkey| SendOp::Write(RemoteAddr { rkey, offset: 0 }),
    );
}

#[test]
fn read_with_a_wrong_rkey_is_refused_and_changes_nothing() {
    assert_refused(
        seed(208),
        LinkConfig::default(),
        Access::ALL,
        false,
        3000,
        |rkey| {
            SendOp::Read(RemoteAddr {
                rkey: rkey.wrapping_add(1),
                offset: 0,
            })
        },
    );
}

#[test]
fn read_past_the_region_end_is_refused() {
    assert_refused(
        seed(209),
        LinkConfig::default(),
        Access::ALL,
        false,
        4097,
        |rkey| SendOp::Read(RemoteAddr { rkey, offset: 0 }),
    );
}

#[test]
fn read_without_remote_read_right_is_refused() {
    assert_refused(
        seed(210),
        LinkConfig::default(),
        Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
        false,
        100,
        |rkey| SendOp::Read(RemoteAddr { rkey, offset: 0 }),
    );
}

#[test]
fn fetch_add_without_remote_atomic_right_is_refused() {
    assert_refused(
        seed(211),
        LinkConfig::default(),
        Access::REMOTE_WRITE | Access::REMOTE_READ,
        false,
        8,
        |rkey| SendOp::FetchAdd(RemoteAddr { rkey, offset: 0 }, 1),
    );
}

#[test]
fn compare_swap_past_the_region_end_is_refused() {
    assert_refused(
        seed(212),
        LinkConfig::default(),
        Access::ALL,
        false,
        8,
        |rkey| SendOp::CompareSwap {
            remote: RemoteAddr { rkey, offset: 4096 },
            compare: 0,
            swap: 1,
        },
    );
}

#[test]
fn refusals_survive_loss_reordering_and_corruption() {
    for s in 0..4 {
        assert_refused(
            seed(220 + s),
            hostile_link(0.1),
            Access::REMOTE_READ,
            false,
            20 * KIB,
            |rkey| SendOp::Write(RemoteAddr { rkey, offset: 0 }),
        );
    }
}

/// A pair with a WRITE-able region on b; returns the sim, the region and a's source.
fn pair_with_target(seed: u64) -> (Sim, Mr, Mr) {
    let mut sim = Sim::new(seed, &config(8, 7), LinkConfig::default());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let src = sim.random_mr(a, 8192, Access::LOCAL_WRITE, &mut rng);
    let dst = sim.random_mr(b, 8192, Access::ALL, &mut rng);
    (sim, dst, src)
}

/// a WRITEs 5000 bytes to b; asserts success and the bytes.
fn assert_write_works(sim: &mut Sim, dst: &Mr, src: &Mr, wr_id: u64) {
    let seed = sim.seed;
    let remote = RemoteAddr {
        rkey: dst.keys.rkey,
        offset: 100,
    };
    sim.post_send(
        sim.a,
        SendWr {
            wr_id,
            op: SendOp::Write(remote),
            sges: vec![sge(src, 0, 5000)],
            signaled: true,
        },
    );
    let got = sim.wait_cq(sim.a, 1, 100_000);
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (wr_id, WcStatus::Success),
        "seed {seed}"
    );
    assert!(
        dst.region.to_vec(100, 5000).expect("in bounds")
            == src.region.to_vec(0, 5000).expect("in bounds"),
        "seed {seed}"
    );
}

/// One datagram: `h`, `body` and `payload`, with its CRC.
fn datagram(h: &Header, body: &Body, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; wire::packet_len(body, payload.len())];
    wire::emit(&mut buf, h, body, payload.len(), |p| {
        p.copy_from_slice(payload)
    })
    .expect("sized");
    buf
}

/// A request packet from `src_qpn` to `dst_qpn` with sequence number `psn`, writing
/// `payload` at `offset` of region `rkey`.
fn forged_write(
    dst_qpn: u32,
    src_qpn: u32,
    psn: u32,
    rkey: u32,
    offset: u64,
    payload: &[u8],
) -> Vec<u8> {
    let h = Header {
        kind: Kind::Request,
        path: 0,
        flags: 0,
        dst_qpn,
        src_qpn,
        psn,
        send_ts_ns: 1,
    };
    let body = Body::Request(Request {
        op: Op::Write,
        msn: 0,
        ssn: 0,
        imm: 0,
        rkey,
        msg_len: payload.len() as u32,
        offset: 0,
        remote_offset: offset,
    });
    datagram(&h, &body, payload)
}

#[test]
fn random_datagrams_are_counted_dropped_and_the_qp_keeps_working() {
    let seed = seed(231);
    let (mut sim, dst, src) = pair_with_target(seed);
    let before = snapshot(&dst.region);
    let mut rng = rng(seed);
    let from = sim.c.addr(0);
    let now = sim.c.now;
    let n = 3000;
    for _ in 0..n {
        let mut d = vec![0u8; below(&mut rng, 1600) as usize];
        rng.fill_bytes(&mut d);
        sim.c.ep_mut(1).handle_datagram(now, from, 0, &d);
    }
    let st = sim.c.ep(1).stats().clone();
    assert_eq!(st.rx_datagrams, n, "seed {seed}");
    // A few look sealed (version 1 and FLAG_SEALED by chance): they name an unknown QP, or
    // fail authentication.
    assert_eq!(
        st.rx_bad_crc + st.rx_malformed + st.rx_unknown_qp + st.rx_wrong_peer + st.rx_auth_failed,
        n,
        "seed {seed}: every random datagram is counted as bad: {st:?}"
    );
    assert!(
        snapshot(&dst.region) == before,
        "seed {seed}: random datagrams changed memory"
    );
    assert_write_works(&mut sim, &dst, &src, 9);
}

#[test]
fn truncated_and_malformed_datagrams_are_counted_as_malformed() {
    let seed = seed(232);
    let (mut sim, dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let from = sim.c.addr(0);
    let good = forged_write(b.qp.qpn, a.qp.qpn, a.qp.psn, dst.keys.rkey, 0, &[9; 100]);
    let mut bad: Vec<Vec<u8>> = (0..wire::HEADER_LEN + wire::TRAILER_LEN)
        .map(|n| good[..n].to_vec())
        .collect();
    // Valid CRCs over broken contents: truncated headers, a bad version, kind and op, and a
    // payload longer than the message.
    let refit = |mut v: Vec<u8>| {
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_be_bytes());
        v
    };
    let content = &good[..good.len() - wire::TRAILER_LEN];
    for cut in [
        wire::HEADER_LEN,
        wire::HEADER_LEN + 10,
        wire::HEADER_LEN + wire::REQUEST_LEN - 1,
    ] {
        bad.push(refit(content[..cut].to_vec()));
    }
    for (at, v) in [(0, 9u8), (1, 77), (wire::HEADER_LEN, 42)] {
        let mut c = content.to_vec();
        c[at] = v;
        bad.push(refit(c));
    }
    let mut c = content.to_vec();
    c[wire::HEADER_LEN + 20..wire::HEADER_LEN + 24].copy_from_slice(&99u32.to_be_bytes()); // msg_len 99 < payload 100
    bad.push(refit(c));
    let n = bad.len() as u64;
    let now = sim.c.now;
    for d in &bad {
        sim.c.ep_mut(1).handle_datagram(now, from, 0, d);
    }
    let st = sim.c.ep(1).stats().clone();
    assert_eq!(
        (st.rx_malformed, st.rx_bad_crc),
        (n, 0),
        "seed {seed}: {st:?}"
    );
    assert_write_works(&mut sim, &dst, &src, 10);
}

#[test]
fn a_flipped_bit_is_counted_as_bad_crc() {
    let seed = seed(233);
    let (mut sim, dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let before = snapshot(&dst.region);
    let good = forged_write(b.qp.qpn, a.qp.qpn, a.qp.psn, dst.keys.rkey, 0, &[9; 100]);
    let from = sim.c.addr(0);
    let now = sim.c.now;
    // The REQUEST's hop telemetry is mutable in flight (the CRC covers it as zeros): a
    // switch may set it, so its 16 bits are not corruption.
    let f = braid::proto::wire::field::request::HOP_QUEUE;
    let hop = braid::proto::wire::HEADER_LEN + f.start..braid::proto::wire::HEADER_LEN + f.end;
    for bit in 0..good.len() * 8 {
        if hop.contains(&(bit / 8)) {
            continue;
        }
        let mut d = good.clone();
        d[bit / 8] ^= 1 << (bit % 8);
        sim.c.ep_mut(1).handle_datagram(now, from, 0, &d);
    }
    let st = sim.c.ep(1).stats().clone();
    // Flipping FLAG_SEALED makes the packet claim a seal this plain QP has no key for.
    assert_eq!(st.rx_auth_failed, 1, "seed {seed}: {st:?}");
    assert_eq!(
        st.rx_bad_crc,
        (good.len() - hop.len()) as u64 * 8 - 1,
        "seed {seed}: {st:?}"
    );
    assert!(snapshot(&dst.region) == before, "seed {seed}");
    assert_write_works(&mut sim, &dst, &src, 11);
}

#[test]
fn a_valid_packet_for_an_unknown_qp_is_counted_and_dropped() {
    let seed = seed(234);
    let (mut sim, dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let before = snapshot(&dst.region);
    let d = forged_write(
        b.qp.qpn ^ 0x40,
        a.qp.qpn,
        a.qp.psn,
        dst.keys.rkey,
        0,
        &[9; 100],
    );
    let (now, from) = (sim.c.now, sim.c.addr(0));
    sim.c.ep_mut(1).handle_datagram(now, from, 0, &d);
    assert_eq!(sim.c.ep(1).stats().rx_unknown_qp, 1, "seed {seed}");
    assert!(snapshot(&dst.region) == before, "seed {seed}");
    assert_write_works(&mut sim, &dst, &src, 12);
}

#[test]
fn a_forged_write_from_the_wrong_address_is_counted_and_dropped() {
    let seed = seed(235);
    let (mut sim, dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let before = snapshot(&dst.region);
    let d = forged_write(b.qp.qpn, a.qp.qpn, a.qp.psn, dst.keys.rkey, 0, &[9; 100]);
    let stranger: SocketAddr = "10.9.9.9:4791".parse().expect("addr");
    let now = sim.c.now;
    sim.c.ep_mut(1).handle_datagram(now, stranger, 0, &d);
    assert_eq!(sim.c.ep(1).stats().rx_wrong_peer, 1, "seed {seed}");
    assert!(
        snapshot(&dst.region) == before,
        "seed {seed}: a forged WRITE landed"
    );
    assert_write_works(&mut sim, &dst, &src, 13);
}

#[test]
fn a_forged_write_from_the_wrong_source_qp_is_counted_and_dropped() {
    let seed = seed(236);
    let (mut sim, dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let before = snapshot(&dst.region);
    let d = forged_write(
        b.qp.qpn,
        a.qp.qpn ^ 1,
        a.qp.psn,
        dst.keys.rkey,
        0,
        &[9; 100],
    );
    let (now, from) = (sim.c.now, sim.c.addr(0));
    sim.c.ep_mut(1).handle_datagram(now, from, 0, &d);
    assert_eq!(sim.c.ep(1).stats().rx_wrong_peer, 1, "seed {seed}");
    assert!(
        snapshot(&dst.region) == before,
        "seed {seed}: a forged WRITE landed"
    );
    assert_write_works(&mut sim, &dst, &src, 14);
}

#[test]
fn a_packet_far_outside_the_receive_window_is_counted_and_dropped() {
    let seed = seed(237);
    let (mut sim, dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let before = snapshot(&dst.region);
    let d = forged_write(
        b.qp.qpn,
        a.qp.qpn,
        a.qp.psn.wrapping_add(1 << 20),
        dst.keys.rkey,
        0,
        &[9; 100],
    );
    let (now, from) = (sim.c.now, sim.c.addr(0));
    sim.c.ep_mut(1).handle_datagram(now, from, 0, &d);
    assert_eq!(sim.c.ep(1).stats().rx_out_of_window, 1, "seed {seed}");
    assert!(snapshot(&dst.region) == before, "seed {seed}");
    assert_write_works(&mut sim, &dst, &src, 15);
}

#[test]
fn hostile_datagrams_on_one_qp_leave_another_qp_working() {
    let seed = seed(238);
    let (mut sim, dst, src) = pair_with_target(seed);
    // A second pair between the same nodes, attacked with forged ACKs and responses.
    let (x, y) = sim.c.connect(0, 1);
    let mut rng = rng(seed);
    for _ in 0..500 {
        let kind = below(&mut rng, 5);
        let h = Header {
            kind: Kind::Ack,
            path: 0,
            flags: 0,
            dst_qpn: y.qp.qpn,
            src_qpn: x.qp.qpn,
            psn: rng.next_u32(),
            send_ts_ns: rng.next_u64(),
        };
        let body = match kind {
            0 => Body::Ack(wire::Ack {
                cum_psn: rng.next_u32(),
                echo_psn: rng.next_u32(),
                echo_ts_ns: rng.next_u64(),
                hold_ns: rng.next_u32(),
                ce_count: rng.next_u32(),
                sack: [0xff; 32],
            }),
            1 => Body::Nak(wire::Nak {
                psn: rng.next_u32(),
                msn: rng.next_u32(),
                syndrome: wire::Syndrome::RemoteAccess,
            }),
            2 => Body::ReadResponse(wire::ReadResponse {
                msn: rng.next_u32(),
                offset: 0,
                msg_len: 8,
            }),
            3 => Body::AtomicResponse(wire::AtomicResponse {
                msn: rng.next_u32(),
                original: 5,
            }),
            _ => Body::Request(Request {
                op: Op::Read,
                msn: 0,
                ssn: 0,
                imm: 0,
                rkey: rng.next_u32(),
                msg_len: 1 << 30,
                offset: 0,
                remote_offset: 0,
            }),
        };
        let plen = if kind == 2 { 8 } else { 0 };
        let mut buf = vec![0u8; wire::packet_len(&body, plen)];
        let h = Header {
            kind: body.kind(),
            ..h
        };
        wire::emit(&mut buf, &h, &body, plen, |p| p.fill(1)).expect("sized");
        let (now, from) = (sim.c.now, sim.c.addr(0));
        sim.c.ep_mut(1).handle_datagram(now, from, 0, &buf);
    }
    sim.c.run_until(100_000, |c| c.next_event().is_none());
    assert_write_works(&mut sim, &dst, &src, 16);
}

#[test]
fn a_send_longer_than_its_recv_is_a_length_error_at_both_ends() {
    let seed = seed(241);
    let (mut sim, _dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let mut rng = rng(seed);
    let small = sim.random_mr(b, 4096, Access::LOCAL_WRITE, &mut rng);
    let before = snapshot(&small.region);
    sim.post_recv(
        b,
        RecvWr {
            wr_id: 20,
            sges: vec![sge(&small, 0, 1000), sge(&small, 2000, 500)],
        },
    );
    sim.post_recv(
        b,
        RecvWr {
            wr_id: 21,
            sges: vec![sge(&small, 3000, 1000)],
        },
    );
    sim.post_send(
        a,
        SendWr {
            wr_id: 30,
            op: SendOp::Send,
            sges: vec![sge(&src, 0, 2000)],
            signaled: true,
        },
    );
    let at_a = sim.wait_cq(a, 1, 100_000);
    assert_eq!(
        (at_a[0].wr_id, at_a[0].status, at_a[0].opcode),
        (30, WcStatus::RemoteInvalidRequest, WcOpcode::Send),
        "seed {seed}"
    );
    let at_b = sim.wait_cq(b, 2, 100_000);
    let st: Vec<_> = at_b.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        vec![(20, WcStatus::LocalLengthError), (21, WcStatus::Flushed)],
        "seed {seed}"
    );
    assert!(
        snapshot(&small.region) == before,
        "seed {seed}: a refused SEND placed bytes"
    );
}

// Bad API use: every case returns its typed error and queues nothing.

fn endpoint() -> (Endpoint, braid::proto::PdId, braid::proto::CqId) {
    let cfg = EndpointConfig {
        max_send_wr: 4,
        max_recv_wr: 3,
        ..EndpointConfig::default()
    };
    let mut ep = Endpoint::new(cfg, "10.0.0.1:4791".parse().expect("addr"));
    let pd = ep.alloc_pd();
    let cq = ep.create_cq();
    (ep, pd, cq)
}

/// A connected QP on `ep` (the peer need not exist: nothing is driven), and a 4 KiB region.
fn connected(
    ep: &mut Endpoint,
    pd: braid::proto::PdId,
    cq: braid::proto::CqId,
    access: Access,
) -> (u32, braid::proto::MrKeys) {
    let qp = ep.create_qp(pd, cq, cq).expect("qp");
    let peer = braid::proto::QpInfo {
        addr: "10.0.0.2:4791".parse().expect("addr"),
        qpn: 5,
        psn: 0,
        seal_key: None,
    };
    ep.connect(qp.qpn, peer).expect("connect");
    let keys = ep
        .register(pd, braid::proto::Region::new(4096), access)
        .expect("register");
    (qp.qpn, keys)
}

fn write_wr(sges: Vec<Sge>) -> SendWr {
    SendWr {
        wr_id: 1,
        op: SendOp::Write(RemoteAddr { rkey: 1, offset: 0 }),
        sges,
        signaled: true,
    }
}

fn outstanding(ep: &Endpoint, qpn: u32) -> (usize, usize) {
    let s = ep.qp_stats(qpn).expect("qp");
    (s.outstanding_sends, s.outstanding_recvs)
}

#[test]
fn post_send_with_an_unknown_lkey_is_invalid_lkey() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let wr = write_wr(vec![Sge {
        lkey: keys.lkey ^ 0x55,
        offset: 0,
        len: 8,
    }]);
    assert_eq!(ep.post_send(qpn, wr), Err(PostError::InvalidLkey));
    let wr = write_wr(vec![Sge {
        lkey: keys.rkey,
        offset: 0,
        len: 8,
    }]);
    assert!(
        keys.rkey == keys.lkey || ep.post_send(qpn, wr) == Err(PostError::InvalidLkey),
        "an rkey is not an lkey"
    );
    assert_eq!(outstanding(&ep, qpn), (0, 0));
}

#[test]
fn an_sge_ending_at_the_region_end_is_accepted() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    assert_eq!(
        ep.post_send(
            qpn,
            write_wr(vec![Sge {
                lkey: keys.lkey,
                offset: 4000,
                len: 96
            }])
        ),
        Ok(())
    );
    assert_eq!(outstanding(&ep, qpn), (1, 0));
}

#[test]
fn an_sge_one_byte_past_the_region_end_is_out_of_bounds() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    assert_eq!(
        ep.post_send(
            qpn,
            write_wr(vec![Sge {
                lkey: keys.lkey,
                offset: 4000,
                len: 97
            }])
        ),
        Err(PostError::OutOfBounds)
    );
    assert_eq!(
        ep.post_send(
            qpn,
            write_wr(vec![Sge {
                lkey: keys.lkey,
                offset: u64::MAX,
                len: 1
            }])
        ),
        Err(PostError::OutOfBounds)
    );
    let recv = RecvWr {
        wr_id: 2,
        sges: vec![Sge {
            lkey: keys.lkey,
            offset: 4096,
            len: 1,
        }],
    };
    assert_eq!(ep.post_recv(qpn, recv), Err(PostError::OutOfBounds));
    assert_eq!(outstanding(&ep, qpn), (0, 0));
}

#[test]
fn post_send_before_connect_is_not_connected() {
    let (mut ep, pd, cq) = endpoint();
    let qp = ep.create_qp(pd, cq, cq).expect("qp");
    let keys = ep
        .register(pd, braid::proto::Region::new(64), Access::ALL)
        .expect("register");
    assert_eq!(
        ep.post_send(
            qp.qpn,
            write_wr(vec![Sge {
                lkey: keys.lkey,
                offset: 0,
                len: 8
            }])
        ),
        Err(PostError::NotConnected)
    );
    // RECVs may be posted before connecting.
    assert_eq!(
        ep.post_recv(
            qp.qpn,
            RecvWr {
                wr_id: 1,
                sges: vec![Sge {
                    lkey: keys.lkey,
                    offset: 0,
                    len: 8
                }]
            }
        ),
        Ok(())
    );
}

#[test]
fn post_to_an_unknown_qp_is_unknown_qp() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let s = vec![Sge {
        lkey: keys.lkey,
        offset: 0,
        len: 8,
    }];
    assert_eq!(
        ep.post_send(qpn ^ 1, write_wr(s.clone())),
        Err(PostError::UnknownQp)
    );
    assert_eq!(
        ep.post_recv(qpn ^ 1, RecvWr { wr_id: 1, sges: s }),
        Err(PostError::UnknownQp)
    );
}

#[test]
fn atomics_need_one_aligned_8_byte_entry() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let e8 = Sge {
        lkey: keys.lkey,
        offset: 0,
        len: 8,
    };
    let at = |offset| RemoteAddr { rkey: 1, offset };
    let cases = [
        (SendOp::FetchAdd(at(4), 1), vec![e8]),
        (
            SendOp::CompareSwap {
                remote: at(12),
                compare: 0,
                swap: 1,
            },
            vec![e8],
        ),
        (SendOp::FetchAdd(at(0), 1), vec![Sge { len: 4, ..e8 }]),
        (SendOp::FetchAdd(at(0), 1), vec![Sge { len: 16, ..e8 }]),
        (
            SendOp::FetchAdd(at(0), 1),
            vec![
                Sge { len: 4, ..e8 },
                Sge {
                    offset: 4,
                    len: 4,
                    ..e8
                },
            ],
        ),
        (
            SendOp::CompareSwap {
                remote: at(0),
                compare: 0,
                swap: 1,
            },
            vec![],
        ),
    ];
    for (op, sges) in cases {
        let wr = SendWr {
            wr_id: 1,
            op,
            sges: sges.clone(),
            signaled: true,
        };
        assert_eq!(
            ep.post_send(qpn, wr),
            Err(PostError::BadAtomic),
            "{op:?} {sges:?}"
        );
    }
    assert_eq!(
        ep.post_send(
            qpn,
            SendWr {
                wr_id: 1,
                op: SendOp::FetchAdd(at(8), 1),
                sges: vec![e8],
                signaled: true
            }
        ),
        Ok(())
    );
}

#[test]
fn the_send_queue_accepts_its_depth_and_refuses_one_more() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let s = vec![Sge {
        lkey: keys.lkey,
        offset: 0,
        len: 8,
    }];
    for _ in 0..4 {
        assert_eq!(ep.post_send(qpn, write_wr(s.clone())), Ok(()));
    }
    assert_eq!(ep.post_send(qpn, write_wr(s)), Err(PostError::QueueFull));
    assert_eq!(outstanding(&ep, qpn), (4, 0));
}

#[test]
fn the_receive_queue_accepts_its_depth_and_refuses_one_more() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let r = || RecvWr {
        wr_id: 1,
        sges: vec![Sge {
            lkey: keys.lkey,
            offset: 0,
            len: 8,
        }],
    };
    for _ in 0..3 {
        assert_eq!(ep.post_recv(qpn, r()), Ok(()));
    }
    assert_eq!(ep.post_recv(qpn, r()), Err(PostError::QueueFull));
    assert_eq!(outstanding(&ep, qpn), (0, 3));
}

#[test]
fn more_than_max_sge_entries_is_too_many_sges() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let e = Sge {
        lkey: keys.lkey,
        offset: 0,
        len: 1,
    };
    assert_eq!(
        ep.post_send(qpn, write_wr(vec![e; braid::proto::MAX_SGE])),
        Ok(())
    );
    assert_eq!(
        ep.post_send(qpn, write_wr(vec![e; braid::proto::MAX_SGE + 1])),
        Err(PostError::TooManySges)
    );
}

#[test]
fn placing_into_a_region_without_local_write_is_no_local_write() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let s = vec![Sge {
        lkey: keys.lkey,
        offset: 0,
        len: 8,
    }];
    let read = SendWr {
        wr_id: 1,
        op: SendOp::Read(RemoteAddr { rkey: 1, offset: 0 }),
        sges: s.clone(),
        signaled: true,
    };
    assert_eq!(ep.post_send(qpn, read), Err(PostError::NoLocalWrite));
    assert_eq!(
        ep.post_recv(
            qpn,
            RecvWr {
                wr_id: 1,
                sges: s.clone()
            }
        ),
        Err(PostError::NoLocalWrite)
    );
    // Gathering from it is fine.
    assert_eq!(ep.post_send(qpn, write_wr(s)), Ok(()));
}

#[test]
fn an_entry_from_another_protection_domain_is_wrong_pd() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, _) = connected(&mut ep, pd, cq, Access::ALL);
    let other = ep.alloc_pd();
    let keys = ep
        .register(other, braid::proto::Region::new(64), Access::ALL)
        .expect("register");
    assert_eq!(
        ep.post_send(
            qpn,
            write_wr(vec![Sge {
                lkey: keys.lkey,
                offset: 0,
                len: 8
            }])
        ),
        Err(PostError::WrongPd)
    );
}

#[test]
fn a_deregistered_lkey_is_refused_at_post() {
    let seed = seed(251);
    let (mut sim, dst, src) = pair_with_target(seed);
    sim.c
        .ep_mut(0)
        .deregister(src.keys.lkey)
        .expect("registered");
    let remote = RemoteAddr {
        rkey: dst.keys.rkey,
        offset: 0,
    };
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write(remote),
        sges: vec![sge(&src, 0, 8)],
        signaled: true,
    };
    assert_eq!(
        sim.try_post_send(sim.a, wr),
        Err(PostError::InvalidLkey),
        "seed {seed}"
    );
}

#[test]
fn endpoints_never_panic_on_hostile_datagrams_at_any_time() {
    // A short fuzz loop: valid-CRC packets with random fields, addressed to a live QP from its
    // real peer, while traffic flows. Nothing may panic, and the real transfer completes.
    let seed = seed(261);
    let (mut sim, dst, src) = pair_with_target(seed);
    let (a, b) = (sim.a, sim.b);
    let mut rng = rng(seed);
    let remote = RemoteAddr {
        rkey: dst.keys.rkey,
        offset: 0,
    };
    sim.post_send(
        a,
        SendWr {
            wr_id: 1,
            op: SendOp::Write(remote),
            sges: vec![sge(&src, 0, 8192)],
            signaled: true,
        },
    );
    for _ in 0..2000 {
        let mut bytes = vec![0u8; wire::HEADER_LEN + below(&mut rng, 120) as usize];
        rng.fill_bytes(&mut bytes);
        bytes[0] = wire::VERSION;
        bytes[1] = 1 + below(&mut rng, 5) as u8;
        let (to, from, dst_qpn, src_qpn) = if below(&mut rng, 2) == 0 {
            (1, 0, b.qp.qpn, a.qp.qpn)
        } else {
            (0, 1, a.qp.qpn, b.qp.qpn)
        };
        bytes[4..8].copy_from_slice(&dst_qpn.to_be_bytes());
        bytes[8..12].copy_from_slice(&src_qpn.to_be_bytes());
        if bytes.len() > wire::HEADER_LEN {
            bytes[wire::HEADER_LEN] %= 7;
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_be_bytes());
        let addr = sim.c.addr(from);
        let now = sim.c.now;
        sim.c.ep_mut(to).handle_datagram(now, addr, 0, &bytes);
        sim.c.step();
    }
    sim.c.run_until(1_000_000, |c| c.next_event().is_none());
    // The forged packets carry the right addresses and QP numbers, so they may legitimately
    // fail the connection; but nothing panics and the WRITE completes exactly once.
    let got = sim.drain_cq(a);
    assert_eq!(
        got.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![1],
        "seed {seed}: {got:?}"
    );
    assert!(
        sim.c.ep(1).stats().rx_datagrams + sim.c.ep(0).stats().rx_datagrams >= 2000,
        "seed {seed}"
    );
}

#[test]
fn a_refused_request_fails_after_earlier_ones_complete_and_later_ones_are_flushed() {
    for s in 0..4 {
        let seed = seed(271 + s);
        let mut sim = Sim::new(seed, &config(8, 20), hostile_link(0.05));
        let mut rng = rng(seed);
        let (a, b) = (sim.a, sim.b);
        let src = sim.random_mr(a, 64 * 1024, Access::LOCAL_WRITE, &mut rng);
        let dst = sim.random_mr(b, 64 * 1024, Access::REMOTE_WRITE, &mut rng);
        let remote = |offset| RemoteAddr {
            rkey: dst.keys.rkey,
            offset,
        };
        let write = |i: u64| SendWr {
            wr_id: i,
            op: SendOp::Write(remote(i * 4000)),
            sges: vec![sge(&src, i * 4000, 4000)],
            signaled: true,
        };
        for i in 0..10 {
            sim.post_send(a, write(i));
        }
        // No REMOTE_READ on the target: refused.
        sim.post_send(
            a,
            SendWr {
                wr_id: 10,
                op: SendOp::Read(remote(0)),
                sges: vec![sge(&src, 0, 8)],
                signaled: true,
            },
        );
        sim.post_send(a, write(11));
        sim.post_send(a, write(12));
        let got = sim.wait_cq(a, 13, 1_000_000);
        let st: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
        let mut want: Vec<_> = (0..10).map(|i| (i, WcStatus::Success)).collect();
        want.extend([
            (10, WcStatus::RemoteAccessError),
            (11, WcStatus::Flushed),
            (12, WcStatus::Flushed),
        ]);
        assert_eq!(st, want, "seed {seed}");
        assert!(
            dst.region.to_vec(0, 40_000).expect("in bounds")
                == src.region.to_vec(0, 40_000).expect("in bounds"),
            "seed {seed}: the successful WRITEs landed"
        );
    }
}

/// Drains everything `ep` wants to send and returns it parsed-able as owned datagrams.
fn transmitted(ep: &mut Endpoint, now: braid::proto::Timestamp) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 2048];
    while let Some(t) = ep.poll_transmit(now, &mut buf) {
        out.push(buf[..t.len].to_vec());
    }
    out
}

/// A packet from the fake peer (QPN 5 at 10.0.0.2) to `dst_qpn`.
fn from_peer(dst_qpn: u32, kind: Kind, psn: u32, body: Body, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        kind,
        path: 0,
        flags: 0,
        dst_qpn,
        src_qpn: 5,
        psn,
        send_ts_ns: 1,
    };
    datagram(&h, &body, payload)
}

#[test]
fn overlapping_read_responses_do_not_complete_a_read_with_holes() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, _) = connected(&mut ep, pd, cq, Access::ALL);
    let local = ep
        .register(pd, braid::proto::Region::new(8192), Access::LOCAL_WRITE)
        .expect("register");
    let peer: SocketAddr = "10.0.0.2:4791".parse().expect("addr");
    let now = braid::proto::Timestamp::from_nanos(1_000);
    ep.post_send(
        qpn,
        SendWr {
            wr_id: 7,
            op: SendOp::Read(RemoteAddr { rkey: 9, offset: 0 }),
            sges: vec![Sge {
                lkey: local.lkey,
                offset: 0,
                len: 8192,
            }],
            signaled: true,
        },
    )
    .expect("post");
    assert_eq!(transmitted(&mut ep, now).len(), 1, "the READ request");
    let resp = |offset: u32| {
        Body::ReadResponse(wire::ReadResponse {
            msn: 0,
            offset,
            msg_len: 8192,
        })
    };
    // The first half twice, under two PSNs: 8192 bytes "placed", half of the buffer untouched.
    for psn in 0..2 {
        let d = from_peer(qpn, Kind::ReadResponse, psn, resp(0), &[0xa5; 4096]);
        ep.handle_datagram(now, peer, 0, &d);
    }
    assert!(
        ep.poll_completion().is_none(),
        "a READ completed with 4096 of its 8192 bytes never written"
    );
    let d = from_peer(qpn, Kind::ReadResponse, 2, resp(4096), &[0x5a; 4096]);
    ep.handle_datagram(now, peer, 0, &d);
    let (_, c) = ep.poll_completion().expect("the READ completes once whole");
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (7, WcStatus::Success, 8192)
    );
}

#[test]
fn a_lost_fatal_nak_is_answered_again_with_the_same_syndrome() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, _) = connected(&mut ep, pd, cq, Access::ALL);
    let small = ep
        .register(pd, braid::proto::Region::new(4096), Access::LOCAL_WRITE)
        .expect("register");
    ep.post_recv(
        qpn,
        RecvWr {
            wr_id: 3,
            sges: vec![Sge {
                lkey: small.lkey,
                offset: 0,
                len: 1000,
            }],
        },
    )
    .expect("post");
    let peer: SocketAddr = "10.0.0.2:4791".parse().expect("addr");
    let now = braid::proto::Timestamp::from_nanos(1_000);
    // A 2000-byte SEND into a 1000-byte receive: the responder fails with a length error.
    let send = from_peer(
        qpn,
        Kind::Request,
        0,
        Body::Request(Request {
            op: Op::Send,
            msn: 0,
            ssn: 0,
            imm: 0,
            rkey: 0,
            msg_len: 2000,
            offset: 0,
            remote_offset: 0,
        }),
        &[1; 1000],
    );
    let naks = |out: Vec<Vec<u8>>| -> Vec<wire::Syndrome> {
        out.iter()
            .filter_map(|d| match wire::Packet::parse(d).expect("valid").body {
                Body::Nak(n) => Some(n.syndrome),
                _ => None,
            })
            .collect()
    };
    ep.handle_datagram(now, peer, 0, &send);
    assert_eq!(
        naks(transmitted(&mut ep, now)),
        vec![wire::Syndrome::InvalidRequest]
    );
    // That NAK was lost; the requester retransmits the same packet.
    ep.handle_datagram(now, peer, 0, &send);
    assert_eq!(
        naks(transmitted(&mut ep, now)),
        vec![wire::Syndrome::InvalidRequest],
        "the retransmission must learn why, not get a generic remote operation error"
    );
    let (_, c) = ep.poll_completion().expect("the receive fails");
    assert_eq!((c.wr_id, c.status), (3, WcStatus::LocalLengthError));
}

#[test]
fn a_receive_refused_after_the_fact_fails_the_qp_in_posting_order() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let good = |wr_id, offset| RecvWr {
        wr_id,
        sges: vec![Sge {
            lkey: keys.lkey,
            offset,
            len: 100,
        }],
    };
    ep.post_recv(qpn, good(1, 0)).expect("post");
    let mut bad = good(2, 0);
    bad.sges[0].lkey ^= 0x5a5a;
    ep.post_recv_or_fail(qpn, bad, cq);
    ep.post_recv_or_fail(qpn, good(3, 200), cq);
    let got: Vec<_> = std::iter::from_fn(|| ep.poll_completion())
        .map(|(_, c)| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Flushed),
            (2, WcStatus::LocalProtectionError),
            (3, WcStatus::Flushed),
        ]
    );
    assert_eq!(
        ep.qp_stats(qpn).map(|s| s.state),
        Some(QpState::Error),
        "a bad receive buffer fails the QP, as verbs reports it"
    );
}

/// A peer whose request is refused for good while a packet before it never comes (it died, or
/// lies): the responder waits for that packet only within the retry budget, then the QP
/// fails, and its own request, held back since the refusal, completes as flushed instead of
/// never.
#[test]
fn a_refusal_whose_earlier_packets_never_come_fails_the_qp_within_the_retry_budget() {
    let (mut ep, pd, cq) = endpoint();
    let (qpn, keys) = connected(&mut ep, pd, cq, Access::ALL);
    let peer: SocketAddr = "10.0.0.2:4791".parse().expect("addr");
    let start = braid::proto::Timestamp::from_nanos(1_000);
    // PSN 1 with a key nobody issued; PSN 0 never arrives.
    let refused = forged_write(qpn, 5, 1, keys.rkey ^ 0x5a5a, 0, &[7; 64]);
    ep.handle_datagram(start, peer, 0, &refused);
    assert_eq!(ep.qp_stats(qpn).expect("qp").state, QpState::Connected);
    ep.post_send(
        qpn,
        write_wr(vec![Sge {
            lkey: keys.lkey,
            offset: 0,
            len: 64,
        }]),
    )
    .expect("post");
    let mut now = start;
    let mut completions = Vec::new();
    for _ in 0..64 {
        transmitted(&mut ep, now);
        while let Some((_, c)) = ep.poll_completion() {
            completions.push(c);
        }
        let Some(t) = ep.poll_timeout() else { break };
        now = now.max(t);
        ep.handle_timeout(now);
    }
    while let Some((_, c)) = ep.poll_completion() {
        completions.push(c);
    }
    let st = ep.qp_stats(qpn).expect("qp");
    assert_eq!(st.state, QpState::Error, "{st:?}");
    assert_eq!(
        completions
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Flushed)]
    );
    let budget = EndpointConfig::default().retry_timeout_ns;
    assert!(
        now.nanos_since(start) <= budget + 1_000_000,
        "failed {} ns after the refusal, the budget is {budget} ns",
        now.nanos_since(start)
    );
    // The missing packet comes after all: the QP failed by the wait, so it is told so (an
    // acknowledgement would have the requester retransmit it for ever).
    let late = forged_write(qpn, 5, 0, keys.rkey, 0, &[9; 64]);
    ep.handle_datagram(now, peer, 0, &late);
    let answers: Vec<Body> = transmitted(&mut ep, now)
        .iter()
        .map(|d| wire::Packet::parse(d).expect("valid").body)
        .collect();
    assert!(
        matches!(answers[..], [Body::Nak(n)] if n.syndrome == wire::Syndrome::RemoteOperation),
        "{answers:?}"
    );
}
