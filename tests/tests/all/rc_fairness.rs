//! Responder-side RC rules and transmit scheduling: deregistration revokes a region at once
//! (queued READ responses stop and their requester gets a remote access error), responses
//! share a QP's sending side fairly with its own requests, an encrypted QP connected to itself
//! works, and `poll_transmit` does not visit idle QPs.
use std::sync::Arc;
use std::time::Duration;

use braid::datapath::sim::LinkConfig;
use braid::proto::{
    Access, Completion, EndpointConfig, RecvWr, Region, RemoteAddr, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};
use braid::testing::{Cluster, Mr, Side};
use braid::{Device, DeviceConfig};

fn sge(mr: &Mr, offset: u64, len: u32) -> Sge {
    Sge {
        lkey: mr.keys.lkey,
        offset,
        len,
    }
}

fn post(c: &mut Cluster, s: &Side, wr_id: u64, op: SendOp, sges: Vec<Sge>) {
    c.ep_mut(s.node)
        .post_send(
            s.qp.qpn,
            SendWr {
                wr_id,
                op,
                sges,
                signaled: true,
            },
        )
        .expect("post accepted");
}

/// Runs until `n` completions wait on `s`'s CQ (or nothing is pending) and takes them.
fn take(c: &mut Cluster, s: &Side, n: usize) -> Vec<Completion> {
    c.run_until(2_000_000, |c| c.cq_len(s.node, s.cq) >= n);
    let mut out = Vec::new();
    while let Some(wc) = c.poll_cq(s.node, s.cq) {
        out.push(wc);
    }
    out
}

fn read_all(r: &Arc<Region>) -> Vec<u8> {
    let mut v = vec![0u8; r.len()];
    r.read(0, &mut v).expect("in bounds");
    v
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + i / 253) as u8 ^ salt).collect()
}

// ---- Item 5: an encrypted QP connected to itself ----

/// Every operation on one encrypted QP connected to itself, in the simulator: the QP is both
/// requester and responder, and every packet must open with its own keys.
#[test]
fn an_encrypted_qp_connected_to_itself_runs_every_operation_in_the_simulator() {
    let mut c = Cluster::new(5, 1, &EndpointConfig::default(), LinkConfig::default());
    let s = c.new_side(0, true);
    c.ep_mut(0)
        .connect(s.qp.qpn, s.qp)
        .expect("connect to itself");
    let n = 20_000usize;
    let src = c.alloc_mr(&s, n, Access::LOCAL_WRITE);
    let dst = c.alloc_mr(&s, 4 * n + 8, Access::ALL);
    let data = pattern(n, 0x5a);
    src.region.write(0, &data).expect("in bounds");
    let ep = &mut c.ep_mut(0);
    for (id, off) in [(100u64, n as u64 + 8), (101, 2 * n as u64 + 8)] {
        ep.post_recv(
            s.qp.qpn,
            RecvWr {
                wr_id: id,
                sges: vec![sge(&dst, off, n as u32)],
            },
        )
        .expect("recv");
    }
    // The WRITE_IMM's notification takes a receive too.
    ep.post_recv(
        s.qp.qpn,
        RecvWr {
            wr_id: 102,
            sges: vec![],
        },
    )
    .expect("recv");
    let rkey = dst.keys.rkey;
    let at = |offset: u64| RemoteAddr { rkey, offset };
    let full = || vec![sge(&src, 0, n as u32)];
    post(&mut c, &s, 1, SendOp::Write(at(8)), full());
    post(&mut c, &s, 2, SendOp::Send, full());
    post(&mut c, &s, 3, SendOp::SendImm(77), full());
    post(
        &mut c,
        &s,
        4,
        SendOp::WriteImm(at(3 * n as u64 + 8), 9),
        full(),
    );
    let got = take(&mut c, &s, 7);
    let ok: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert!(
        got.len() == 7 && got.iter().all(|w| w.status == WcStatus::Success),
        "{ok:?}"
    );
    let recvs: Vec<_> = got
        .iter()
        .filter(|w| matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm))
        .map(|w| (w.wr_id, w.imm))
        .collect();
    assert_eq!(recvs, vec![(100, None), (101, Some(77)), (102, Some(9))]);
    let all = read_all(&dst.region);
    for off in [8, n + 8, 2 * n + 8, 3 * n + 8] {
        assert!(all[off..off + n] == data[..], "bytes at {off}");
    }
    // READ back into a cleared source, then the two atomics.
    src.region.write(0, &vec![0u8; n]).expect("in bounds");
    post(&mut c, &s, 5, SendOp::Read(at(8)), full());
    post(
        &mut c,
        &s,
        6,
        SendOp::FetchAdd(at(0), 5),
        vec![sge(&src, 0, 8)],
    );
    post(
        &mut c,
        &s,
        7,
        SendOp::CompareSwap {
            remote: at(0),
            compare: 5,
            swap: 40,
        },
        vec![sge(&src, 8, 8)],
    );
    let got = take(&mut c, &s, 3);
    let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![
            (5, WcStatus::Success),
            (6, WcStatus::Success),
            (7, WcStatus::Success)
        ]
    );
    let back = read_all(&src.region);
    assert_eq!(u64::from_ne_bytes(back[0..8].try_into().expect("8")), 0);
    assert_eq!(u64::from_ne_bytes(back[8..16].try_into().expect("8")), 5);
    assert!(back[16..] == data[16..], "READ differs");
    let mut word = [0u8; 8];
    dst.region.read(0, &mut word).expect("in bounds");
    assert_eq!(u64::from_ne_bytes(word), 40);
    let st = c.ep(0).stats();
    assert_eq!((st.rx_auth_failed, st.rx_replayed), (0, 0), "{st:?}");
}

/// The same over real UDP on loopback, through the runtime.
#[test]
fn an_encrypted_qp_connected_to_itself_runs_every_operation_over_udp() {
    let dev = Device::open(DeviceConfig::udp("127.0.0.1:0".parse().expect("addr")).paths(4))
        .expect("open a UDP device");
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = pd.create_encrypted_qp(&cq, &cq).expect("qp");
    qp.connect(qp.info()).expect("connect to itself");
    let n = 100_000usize;
    let src = pd.alloc_mr(n, Access::LOCAL_WRITE).expect("mr");
    let dst = pd.alloc_mr(3 * n + 8, Access::ALL).expect("mr");
    let data = pattern(n, 0x33);
    src.write(0, &data).expect("in bounds");
    qp.post_recv(RecvWr {
        wr_id: 100,
        sges: vec![dst.sge(n as u64 + 8, n as u32)],
    })
    .expect("recv");
    qp.post_recv(RecvWr {
        wr_id: 101,
        sges: vec![dst.sge(2 * n as u64 + 8, n as u32)],
    })
    .expect("recv");
    let wait = |want: usize| {
        let mut got = Vec::new();
        while got.len() < want {
            let wc = cq.wait(Duration::from_secs(20)).expect("a completion");
            got.push((wc.wr_id, wc.status));
        }
        got.sort_unstable_by_key(|&(id, _)| id);
        got
    };
    let send = |id: u64, op: SendOp, sges: Vec<Sge>| {
        qp.post_send(SendWr {
            wr_id: id,
            op,
            sges,
            signaled: true,
        })
        .expect("post");
    };
    let full = || vec![src.sge(0, n as u32)];
    send(1, SendOp::Write(dst.remote(8)), full());
    send(2, SendOp::Send, full());
    send(3, SendOp::SendImm(7), full());
    let ok = WcStatus::Success;
    assert_eq!(
        wait(5),
        vec![(1, ok), (2, ok), (3, ok), (100, ok), (101, ok)]
    );
    let mut all = vec![0u8; 3 * n + 8];
    dst.read(0, &mut all).expect("in bounds");
    for off in [8, n + 8, 2 * n + 8] {
        assert!(all[off..off + n] == data[..], "bytes at {off}");
    }
    src.write(0, &vec![0u8; n]).expect("in bounds");
    send(4, SendOp::Read(dst.remote(8)), full());
    send(5, SendOp::FetchAdd(dst.remote(0), 5), vec![src.sge(0, 8)]);
    assert_eq!(wait(2), vec![(4, ok), (5, ok)]);
    let mut back = vec![0u8; n];
    src.read(0, &mut back).expect("in bounds");
    assert!(back[8..] == data[8..], "READ differs");
    assert_eq!(u64::from_ne_bytes(back[..8].try_into().expect("8")), 0);
    let st = dev.stats();
    assert_eq!(st.rx_auth_failed, 0, "{st:?}");
}

// ---- Item 4: responses do not starve requests ----

/// With 8 MiB of the peer's READs being answered, a local 8-byte WRITE goes out after at most
/// a quantum of response data, not after all of it.
#[test]
fn a_small_write_is_not_starved_by_8_mib_of_read_responses() {
    let mut c = Cluster::new(11, 2, &EndpointConfig::default(), LinkConfig::default());
    let (a, b) = c.connect(0, 1);
    let mib = 1usize << 20;
    let a_dst = c.alloc_mr(&a, 8 * mib, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let b_src = c.alloc_mr(&b, 8 * mib, Access::REMOTE_READ | Access::LOCAL_WRITE);
    b_src
        .region
        .write(0, &pattern(8 * mib, 1))
        .expect("in bounds");
    let rkey = b_src.keys.rkey;
    for i in 0..8u64 {
        let off = i * mib as u64;
        post(
            &mut c,
            &a,
            i,
            SendOp::Read(RemoteAddr { rkey, offset: off }),
            vec![sge(&a_dst, off, mib as u32)],
        );
    }
    // Until B is well into answering.
    let sent = |c: &Cluster| c.ep(1).qp_stats(b.qp.qpn).expect("qp").packets_sent;
    assert!(c.run_until(1_000_000, |c| sent(c) >= 200));
    let before = sent(&c);
    let b_word = c.alloc_mr(&b, 8, Access::LOCAL_WRITE);
    b_word.region.write(0, &[7u8; 8]).expect("in bounds");
    let rkey_a = a_dst.keys.rkey;
    post(
        &mut c,
        &b,
        99,
        SendOp::Write(RemoteAddr {
            rkey: rkey_a,
            offset: 8 * mib as u64 - 8,
        }),
        vec![sge(&b_word, 0, 8)],
    );
    assert!(c.run_until(1_000_000, |c| c.cq_len(1, b.cq) >= 1));
    let during = sent(&c) - before;
    let wc = c.poll_cq(1, b.cq).expect("the write's completion");
    assert_eq!((wc.wr_id, wc.status), (99, WcStatus::Success));
    // The response packets B sent between posting the WRITE and its completion: the WRITE's
    // own packet waited for at most a quantum (about a dozen packets); the rest is the round
    // trip of its ACK. All of the READ data is over 5000 packets.
    let total = (8 * mib) as u64 / u64::from(c.ep(1).chunk_size());
    assert!(
        during < total / 10,
        "{during} of B's packets went out before its WRITE completed (all READs: {total})"
    );
    // Everything still completes, in order, with the right bytes.
    let got = take(&mut c, &a, 8);
    let ids: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        (0..8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let all = read_all(&a_dst.region);
    let want = pattern(8 * mib, 1);
    assert!(
        all[..8 * mib - 8] == want[..8 * mib - 8],
        "READ data differs"
    );
}

// ---- Item 3: deregistration revokes at once ----

/// Every byte of `got` is either untouched (zero) or the byte `want` holds at that offset.
fn only_old_bytes(got: &[u8], want: &[u8]) -> Result<(), usize> {
    match got.iter().zip(want).position(|(&g, &w)| g != 0 && g != w) {
        Some(i) => Err(i),
        None => Ok(()),
    }
}

/// A large READ is being answered when the responder deregisters the source and overwrites
/// its memory: the requester never sees the new bytes, and the READ fails with a remote
/// access error (what follows it is flushed).
#[test]
fn deregistering_a_region_stops_the_read_responses_served_from_it() {
    let mut c = Cluster::new(21, 2, &EndpointConfig::default(), LinkConfig::default());
    let (a, b) = c.connect(0, 1);
    let len = 4usize << 20;
    let a_dst = c.alloc_mr(&a, len, Access::LOCAL_WRITE);
    let b_src = c.alloc_mr(&b, len, Access::REMOTE_READ);
    let want: Vec<u8> = pattern(len, 9).iter().map(|&x| x | 1).collect(); // never zero
    b_src.region.write(0, &want).expect("in bounds");
    let rkey = b_src.keys.rkey;
    post(
        &mut c,
        &a,
        1,
        SendOp::Read(RemoteAddr { rkey, offset: 0 }),
        vec![sge(&a_dst, 0, len as u32)],
    );
    post(
        &mut c,
        &a,
        2,
        SendOp::Read(RemoteAddr { rkey, offset: 0 }),
        vec![sge(&a_dst, 0, 8)],
    );
    let sent = |c: &Cluster| c.ep(1).qp_stats(b.qp.qpn).expect("qp").packets_sent;
    assert!(c.run_until(1_000_000, |c| sent(c) >= 300));
    c.ep_mut(1).deregister(b_src.keys.lkey).expect("registered");
    let at_deregistration = sent(&c);
    b_src
        .region
        .write(0, &vec![0xEEu8; len])
        .expect("in bounds");
    let got = take(&mut c, &a, 2);
    let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::RemoteAccessError), (2, WcStatus::Flushed)]
    );
    c.drive_bounded(1_000_000);
    let placed = read_all(&a_dst.region);
    assert_eq!(
        only_old_bytes(&placed, &want),
        Ok(()),
        "a new byte reached A"
    );
    assert!(
        placed.iter().any(|&x| x != 0),
        "some of the READ had arrived before deregistration"
    );
    let b_stats = c.ep(1).qp_stats(b.qp.qpn).expect("qp");
    assert_eq!(b_stats.state, braid::proto::QpState::Error);
    // Nothing was sent from the region after deregistration (the NAK is not counted).
    assert_eq!(b_stats.packets_sent, at_deregistration);
}

fn is_nak(d: &[u8]) -> bool {
    braid::proto::wire::Packet::parse(d)
        .is_ok_and(|p| p.header.kind == braid::proto::wire::Kind::Nak)
}

/// The NAK that revokes a READ being served is repeated like any NAK: when the first copy is
/// lost, the requester still fails the READ with a remote access error, without a retransmit
/// timeout and long before its retry budget would run out.
#[test]
fn a_lost_revocation_nak_is_repeated() {
    let mut c = Cluster::new(22, 2, &EndpointConfig::default(), LinkConfig::default());
    let (a, b) = c.connect(0, 1);
    let len = 1usize << 20;
    let a_dst = c.alloc_mr(&a, len, Access::LOCAL_WRITE);
    let b_src = c.alloc_mr(&b, len, Access::REMOTE_READ);
    let rkey = b_src.keys.rkey;
    post(
        &mut c,
        &a,
        1,
        SendOp::Read(RemoteAddr { rkey, offset: 0 }),
        vec![sge(&a_dst, 0, len as u32)],
    );
    let sent = |c: &Cluster| c.ep(1).qp_stats(b.qp.qpn).expect("qp").packets_sent;
    assert!(c.run_until(1_000_000, |c| sent(c) >= 100));
    c.drop_sent(1, 1, is_nak);
    c.ep_mut(1).deregister(b_src.keys.lkey).expect("registered");
    let got = take(&mut c, &a, 1);
    assert_eq!(c.dropped_sent(), 1, "the revocation NAK was not sent");
    let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, vec![(1, WcStatus::RemoteAccessError)]);
    let a_stats = c.ep(0).qp_stats(a.qp.qpn).expect("qp");
    assert_eq!(a_stats.rtos, 0, "{a_stats:?}");
}

/// The verbs pattern "the requester reports a READ, then the responder's application frees
/// the source": a READ fully answered, reported at the requester, and the responder
/// deregisters the region before the acknowledgement of its responses has arrived. The QP
/// carries on (it used to fail, and every later request got a remote operation error).
#[test]
fn deregistering_a_region_whose_read_completed_keeps_the_qp() {
    let mut c = Cluster::new(23, 2, &EndpointConfig::default(), LinkConfig::default());
    let (a, b) = c.connect(0, 1);
    let len = 64usize << 10;
    let a_dst = c.alloc_mr(&a, len, Access::LOCAL_WRITE);
    let b_src = c.alloc_mr(&b, len, Access::REMOTE_READ);
    let b_dst = c.alloc_mr(&b, len, Access::REMOTE_WRITE);
    let want = pattern(len, 5);
    b_src.region.write(0, &want).expect("in bounds");
    post(
        &mut c,
        &a,
        1,
        SendOp::Read(RemoteAddr {
            rkey: b_src.keys.rkey,
            offset: 0,
        }),
        vec![sge(&a_dst, 0, len as u32)],
    );
    assert!(c.run_until(1_000_000, |c| c.cq_len(a.node, a.cq) >= 1));
    let unacked = |c: &Cluster| {
        let s = c.ep(1).qp_stats(b.qp.qpn).expect("qp");
        s.in_flight_bytes
    };
    assert!(unacked(&c) > 0, "the responses were acknowledged already");
    c.ep_mut(1).deregister(b_src.keys.lkey).expect("registered");
    let st = |c: &Cluster| c.ep(1).qp_stats(b.qp.qpn).expect("qp").state;
    assert_eq!(st(&c), braid::proto::QpState::Connected);
    post(
        &mut c,
        &a,
        2,
        SendOp::Write(RemoteAddr {
            rkey: b_dst.keys.rkey,
            offset: 0,
        }),
        vec![sge(&a_dst, 0, len as u32)],
    );
    let got = take(&mut c, &a, 2);
    let st_a: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st_a, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(read_all(&a_dst.region), want);
    assert_eq!(read_all(&b_dst.region), want);
    c.drive_bounded(1_000_000);
    assert_eq!(st(&c), braid::proto::QpState::Connected);
}

fn is_read_response(d: &[u8]) -> bool {
    braid::proto::wire::Packet::parse(d)
        .is_ok_and(|p| p.header.kind == braid::proto::wire::Kind::ReadResponse)
}

/// A READ response sent, then its region deregistered, then the response turns out lost:
/// it is not built again from the region; the READ fails with a remote access error, and
/// nothing more is sent from the region.
#[test]
fn a_read_response_lost_after_deregistration_refuses_the_read() {
    let mut c = Cluster::new(24, 2, &EndpointConfig::default(), LinkConfig::default());
    let (a, b) = c.connect(0, 1);
    let a_dst = c.alloc_mr(&a, 512, Access::LOCAL_WRITE);
    let b_src = c.alloc_mr(&b, 512, Access::REMOTE_READ);
    b_src.region.write(0, &[0x5a; 512]).expect("in bounds");
    c.drop_sent(1, 1, is_read_response);
    post(
        &mut c,
        &a,
        1,
        SendOp::Read(RemoteAddr {
            rkey: b_src.keys.rkey,
            offset: 0,
        }),
        vec![sge(&a_dst, 0, 512)],
    );
    let sent = |c: &Cluster| c.ep(1).qp_stats(b.qp.qpn).expect("qp").packets_sent;
    assert!(c.run_until(1_000_000, |c| sent(c) >= 1));
    c.ep_mut(1).deregister(b_src.keys.lkey).expect("registered");
    let at_deregistration = sent(&c);
    assert_eq!(
        c.ep(1).qp_stats(b.qp.qpn).expect("qp").state,
        braid::proto::QpState::Connected,
        "nothing needs the region yet"
    );
    let got = take(&mut c, &a, 1);
    assert_eq!(c.dropped_sent(), 1, "the response was not dropped");
    let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, vec![(1, WcStatus::RemoteAccessError)]);
    assert!(read_all(&a_dst.region).iter().all(|&x| x == 0));
    let b_stats = c.ep(1).qp_stats(b.qp.qpn).expect("qp");
    assert_eq!(b_stats.state, braid::proto::QpState::Error);
    assert_eq!(b_stats.packets_sent, at_deregistration);
}

/// A WRITE whose local source is deregistered before it went out fails with a local
/// protection error, and its source memory is not read.
#[test]
fn deregistering_a_posted_writes_source_fails_it_with_a_local_protection_error() {
    let mut c = Cluster::new(22, 2, &EndpointConfig::default(), LinkConfig::default());
    let (a, b) = c.connect(0, 1);
    let src = c.alloc_mr(&a, 64 << 10, Access::LOCAL_WRITE);
    src.region.write(0, &[0x11; 64 << 10]).expect("in bounds");
    let dst = c.alloc_mr(&b, 64 << 10, Access::REMOTE_WRITE);
    let rkey = dst.keys.rkey;
    post(
        &mut c,
        &a,
        1,
        SendOp::Write(RemoteAddr { rkey, offset: 0 }),
        vec![sge(&src, 0, 64 << 10)],
    );
    post(
        &mut c,
        &a,
        2,
        SendOp::Write(RemoteAddr { rkey, offset: 0 }),
        vec![],
    );
    c.ep_mut(0).deregister(src.keys.lkey).expect("registered");
    let got = take(&mut c, &a, 2);
    let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::LocalProtectionError), (2, WcStatus::Flushed)]
    );
    c.drive_bounded(1_000_000);
    assert!(
        read_all(&dst.region).iter().all(|&x| x == 0),
        "source was read"
    );
}

/// The runtime: dropping a `MemoryRegion` while a READ from it is answered revokes it before
/// `drop` returns.
#[test]
fn dropping_a_memory_region_stops_read_responses_over_udp() {
    let open = || {
        Device::open(DeviceConfig::udp("127.0.0.1:0".parse().expect("addr")).paths(4))
            .expect("open a UDP device")
    };
    let (da, db) = (open(), open());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (ca, cb) = (da.create_cq(), db.create_cq());
    let qa = pa.create_qp(&ca, &ca).expect("qp a");
    let qb = pb.create_qp(&cb, &cb).expect("qp b");
    qa.connect(qb.info()).expect("connect a");
    qb.connect(qa.info()).expect("connect b");
    let len = 64usize << 20;
    let dst = pa.alloc_mr(len, Access::LOCAL_WRITE).expect("mr");
    let src = pb.alloc_mr(len, Access::REMOTE_READ).expect("mr");
    let want: Vec<u8> = pattern(len, 3).iter().map(|&x| x | 1).collect();
    src.write(0, &want).expect("in bounds");
    let memory = src.region().clone();
    qa.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Read(src.remote(0)),
        sges: vec![dst.sge(0, len as u32)],
        signaled: true,
    })
    .expect("post");
    // Until the first responses have landed.
    let mut first = [0u8; 64];
    let started = std::time::Instant::now();
    while first == [0u8; 64] {
        assert!(started.elapsed() < Duration::from_secs(20), "no response");
        dst.read(0, &mut first).expect("in bounds");
        std::thread::yield_now();
    }
    drop(src);
    memory.write(0, &vec![0xEEu8; len]).expect("in bounds");
    let wc = ca.wait(Duration::from_secs(20)).expect("a completion");
    assert_eq!(
        (wc.wr_id, wc.status),
        (1, WcStatus::RemoteAccessError),
        "the READ finished before the drop, or was served after it"
    );
    std::thread::sleep(Duration::from_millis(50));
    let mut placed = vec![0u8; len];
    dst.read(0, &mut placed).expect("in bounds");
    assert_eq!(
        only_old_bytes(&placed, &want),
        Ok(()),
        "a new byte reached A"
    );
}

// ---- Item 8 (part): poll_transmit visits only QPs with work ----

/// Moves 512 KiB over one of `idle + 1` connected QP pairs and returns how many QP visits
/// node 0's `poll_transmit` made per datagram it sent.
fn visits_per_datagram(idle: usize) -> f64 {
    let mut c = Cluster::new(31, 2, &EndpointConfig::default(), LinkConfig::default());
    for _ in 0..idle {
        c.connect(0, 1);
    }
    let (a, b) = c.connect(0, 1);
    let len = 512usize << 10;
    let src = c.alloc_mr(&a, len, Access::LOCAL_WRITE);
    let dst = c.alloc_mr(&b, len, Access::REMOTE_WRITE);
    let rkey = dst.keys.rkey;
    // Settle first: the fresh QPs are each asked once.
    c.drive_bounded(1_000);
    let (v0, d0) = (c.ep(0).transmit_visits(), c.ep(0).stats().tx_datagrams);
    post(
        &mut c,
        &a,
        1,
        SendOp::Write(RemoteAddr { rkey, offset: 0 }),
        vec![sge(&src, 0, len as u32)],
    );
    let got = take(&mut c, &a, 1);
    assert_eq!(got[0].status, WcStatus::Success);
    let visits = c.ep(0).transmit_visits() - v0;
    let datagrams = c.ep(0).stats().tx_datagrams - d0;
    assert!(datagrams > 300, "{datagrams}");
    visits as f64 / datagrams as f64
}

#[test]
fn poll_transmit_work_does_not_grow_with_idle_qps() {
    let few = visits_per_datagram(1);
    let many = visits_per_datagram(400);
    eprintln!("visits per datagram: {few} with 1 idle QP, {many} with 400");
    // Each datagram costs its own visit, plus the visit that finds the QP blocked (by window
    // or pacer) once per event; idle QPs are never asked.
    assert!(few < 3.0, "{few} visits per datagram with 1 idle QP");
    assert!(
        many <= few * 1.05 + 0.01,
        "{many} visits per datagram with 400 idle QPs, {few} with 1"
    );
}

/// Two QPs with work on one node take turns, one datagram each.
#[test]
fn two_busy_qps_take_turns() {
    let mut c = Cluster::new(32, 2, &EndpointConfig::default(), LinkConfig::default());
    let pairs = [c.connect(0, 1), c.connect(0, 1)];
    let len = 256usize << 10;
    for (i, (a, b)) in pairs.iter().enumerate() {
        let src = c.alloc_mr(a, len, Access::LOCAL_WRITE);
        let dst = c.alloc_mr(b, len, Access::REMOTE_WRITE);
        let rkey = dst.keys.rkey;
        post(
            &mut c,
            a,
            i as u64,
            SendOp::Write(RemoteAddr { rkey, offset: 0 }),
            vec![sge(&src, 0, len as u32)],
        );
    }
    // Ask node 0 directly, without delivering anything: the first datagrams alternate
    // between the two QPs until their windows fill.
    let mut buf = vec![0u8; 65_536];
    let now = c.now;
    let sent = |c: &Cluster, i: usize| {
        c.ep(0)
            .qp_stats(pairs[i].0.qp.qpn)
            .expect("qp")
            .packets_sent
    };
    let mut order = Vec::new();
    for _ in 0..8 {
        let before = [sent(&c, 0), sent(&c, 1)];
        if c.ep_mut(0).poll_transmit(now, &mut buf).is_none() {
            break;
        }
        let after = [sent(&c, 0), sent(&c, 1)];
        order.push(usize::from(after[1] > before[1]));
    }
    assert!(order.len() >= 4, "{order:?}");
    for w in order.windows(2) {
        assert_ne!(w[0], w[1], "turns {order:?}");
    }
    // And both transfers complete.
    for (i, (a, _)) in pairs.iter().enumerate() {
        let got = take(&mut c, a, 1);
        let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(st, vec![(i as u64, WcStatus::Success)]);
    }
}
