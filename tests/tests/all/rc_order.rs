//! RC semantics at the responder: a fatal refusal stops the responder QP (nothing after it
//! executes, its receives flush), receive completions wait for every earlier request to be
//! placed (unless the QP asks for unordered completions), and the requester's completions
//! stay in posting order.
use braid::datapath::sim::LinkConfig;
use braid::proto::{
    Access, Completion, QpOptions, QpState, RecvWr, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus,
};
use braid::testing::{Mr, Side};

use crate::support::{Sim, config, rng, seed, sge, snapshot};

/// A link that holds every packet for a millisecond: "the slow path".
fn slow() -> LinkConfig {
    LinkConfig {
        delay_ns: 1_000_000,
        ..LinkConfig::default()
    }
}

fn send_wr(wr_id: u64, op: SendOp, sges: Vec<braid::proto::Sge>) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges,
        signaled: true,
    }
}

/// How the first request of [`assert_refusal_stops_responder`] goes wrong.
#[derive(Copy, Clone, Debug)]
enum Refusal {
    /// A WRITE with a key the responder never issued.
    Key,
    /// A WRITE past the end of the region.
    Bounds,
    /// A WRITE into a region registered without remote write.
    Rights,
    /// A SEND longer than the RECV it lands in.
    Invalid,
    /// A WRITE_IMM with a bad key (it would consume the first RECV).
    WriteImmKey,
}

/// Posts a refused request (WR 1), then a WRITE (WR 2) to a good region and a SEND (WR 3),
/// against two posted RECVs on b. Nothing after the refusal may execute at b: the good region
/// keeps its bytes, no RECV completes Success, b's QP ends in error with no timer armed, and
/// a reports the refusal then two flushes, in posting order.
fn assert_refusal_stops_responder(seed: u64, kind: Refusal) {
    refusal_run(seed, kind, None);
}

/// [`assert_refusal_stops_responder`] over `link` when given: loss, reordering and duplication
/// lose NAKs and ACKs and let later packets overtake the refused one, so only the completions
/// and the final states are checked (memory may hold bytes of later requests that overtook
/// the refusal, the documented exception).
fn refusal_run(seed: u64, kind: Refusal, link: Option<LinkConfig>) {
    let lossy = link.is_some();
    let mut sim = Sim::new(seed, &config(4, 10), link.unwrap_or_default());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let local = sim.random_mr(a, 8192, Access::LOCAL_WRITE, &mut rng);
    let good = sim.random_mr(b, 4096, Access::ALL, &mut rng);
    let readonly = sim.random_mr(b, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ, &mut rng);
    let rbuf = sim.random_mr(b, 4096, Access::LOCAL_WRITE, &mut rng);
    for (id, off) in [(11, 0), (12, 2048)] {
        sim.post_recv(
            b,
            RecvWr {
                wr_id: id,
                sges: vec![sge(&rbuf, off, 64)],
            },
        );
    }
    let before = (snapshot(&good.region), snapshot(&rbuf.region));
    let (first, first_len, want) = match kind {
        Refusal::Key => (
            SendOp::Write(RemoteAddr {
                rkey: good.keys.rkey ^ 0x5a5a,
                offset: 0,
            }),
            100,
            WcStatus::RemoteAccessError,
        ),
        Refusal::Bounds => (
            SendOp::Write(RemoteAddr {
                rkey: good.keys.rkey,
                offset: 4000,
            }),
            200,
            WcStatus::RemoteAccessError,
        ),
        Refusal::Rights => (
            SendOp::Write(RemoteAddr {
                rkey: readonly.keys.rkey,
                offset: 0,
            }),
            100,
            WcStatus::RemoteAccessError,
        ),
        Refusal::Invalid => (SendOp::Send, 500, WcStatus::RemoteInvalidRequest),
        Refusal::WriteImmKey => (
            SendOp::WriteImm(
                RemoteAddr {
                    rkey: good.keys.rkey ^ 0x5a5a,
                    offset: 0,
                },
                7,
            ),
            100,
            WcStatus::RemoteAccessError,
        ),
    };
    sim.post_send(a, send_wr(1, first, vec![sge(&local, 0, first_len)]));
    let write = SendOp::Write(RemoteAddr {
        rkey: good.keys.rkey,
        offset: 0,
    });
    sim.post_send(a, send_wr(2, write, vec![sge(&local, 1000, 1000)]));
    sim.post_send(a, send_wr(3, SendOp::Send, vec![sge(&local, 3000, 32)]));
    let got = sim.wait_cq(a, 3, 200_000);
    let statuses: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        statuses,
        [(1, want), (2, WcStatus::Flushed), (3, WcStatus::Flushed)],
        "seed {seed}: {kind:?}: requester completions"
    );
    sim.c.run_until(200_000, |c| c.next_event().is_none());
    assert!(
        lossy || snapshot(&good.region) == before.0,
        "seed {seed}: {kind:?}: the WRITE after the refusal changed responder memory"
    );
    let recvs: Vec<Completion> = sim.drain_cq(b);
    let recv_status: Vec<(u64, WcStatus)> = recvs.iter().map(|c| (c.wr_id, c.status)).collect();
    let first_recv = match kind {
        // The too-long SEND consumed the first RECV: verbs completes it with a length error.
        Refusal::Invalid => WcStatus::LocalLengthError,
        _ => WcStatus::Flushed,
    };
    assert_eq!(
        recv_status,
        [(11, first_recv), (12, WcStatus::Flushed)],
        "seed {seed}: {kind:?}: responder receives"
    );
    if !lossy && !matches!(kind, Refusal::Invalid) {
        // Nothing was placed into the receive buffers (the too-long SEND may have written
        // the bytes that fit before its refusal; verbs leaves them undefined).
        assert!(
            snapshot(&rbuf.region) == before.1,
            "seed {seed}: {kind:?}: a refused or flushed SEND wrote into a RECV buffer"
        );
    }
    let eb = &sim.c.ep_mut(b.node);
    assert_eq!(
        eb.qp_stats(b.qp.qpn)
            .map(|s| (s.state, s.outstanding_recvs)),
        Some((QpState::Error, 0)),
        "seed {seed}: {kind:?}: responder QP"
    );
    assert_eq!(eb.poll_timeout(), None, "seed {seed}: {kind:?}: b timer");
    // A refused packet is done at the requester: on a lossless link nothing is resent.
    if !lossy {
        assert_eq!(
            sim.c.ep(a.node).qp_stats(a.qp.qpn).map(|s| s.retransmits),
            Some(0),
            "seed {seed}: {kind:?}: requester retransmits"
        );
    }
    assert_eq!(
        sim.c.ep(a.node).poll_timeout(),
        None,
        "seed {seed}: {kind:?}: a timer"
    );
}

#[test]
fn refused_key_stops_the_responder() {
    assert_refusal_stops_responder(seed(901), Refusal::Key);
}

#[test]
fn refused_bounds_stops_the_responder() {
    assert_refusal_stops_responder(seed(902), Refusal::Bounds);
}

#[test]
fn refused_rights_stops_the_responder() {
    assert_refusal_stops_responder(seed(903), Refusal::Rights);
}

#[test]
fn invalid_request_stops_the_responder() {
    assert_refusal_stops_responder(seed(904), Refusal::Invalid);
}

#[test]
fn refused_write_imm_then_send_flushes_both_receives() {
    assert_refusal_stops_responder(seed(905), Refusal::WriteImmKey);
}

/// Lost and reordered NAKs and ACKs: the refusal is answered again, both sides still end in
/// error with the statuses in posting order and every receive flushed.
#[test]
fn refusals_hold_on_a_hostile_link() {
    let base = seed(920);
    for i in 0..20 {
        let kind = [
            Refusal::Key,
            Refusal::Bounds,
            Refusal::Rights,
            Refusal::Invalid,
            Refusal::WriteImmKey,
        ][i as usize % 5];
        refusal_run(base + i, kind, Some(crate::support::hostile_link(0.1)));
    }
}

/// The requester's refused packet is done: a refusal is never retransmitted, even when
/// earlier work is still in flight on a slow path (the requester waits for it, then fails).
#[test]
fn refusal_behind_a_slow_write_keeps_posting_order() {
    let seed = seed(906);
    let mut sim = Sim::new(seed, &config(4, 10), LinkConfig::default());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let local = sim.random_mr(a, 8192, Access::LOCAL_WRITE, &mut rng);
    let good = sim.random_mr(b, 8192, Access::ALL, &mut rng);
    let write = |offset| {
        SendOp::Write(RemoteAddr {
            rkey: good.keys.rkey,
            offset,
        })
    };
    sim.c.net.set_default_link(slow());
    sim.post_send(a, send_wr(1, write(0), vec![sge(&local, 0, 3000)]));
    sim.c.flush();
    sim.c.net.set_default_link(LinkConfig::default());
    let bad = SendOp::Write(RemoteAddr {
        rkey: good.keys.rkey ^ 1,
        offset: 0,
    });
    sim.post_send(a, send_wr(2, bad, vec![sge(&local, 0, 100)]));
    sim.post_send(a, send_wr(3, write(4096), vec![sge(&local, 4096, 1000)]));
    let got = sim.wait_cq(a, 3, 200_000);
    let statuses: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        statuses,
        [
            (1, WcStatus::Success),
            (2, WcStatus::RemoteAccessError),
            (3, WcStatus::Flushed)
        ],
        "seed {seed}"
    );
    sim.c.run_until(50_000, |c| c.next_event().is_none());
    assert_eq!(
        good.region.to_vec(0, 3000).expect("in bounds"),
        local.region.to_vec(0, 3000).expect("in bounds"),
        "seed {seed}: the WRITE before the refusal was placed"
    );
    assert_eq!(
        sim.c.ep(b.node).qp_stats(b.qp.qpn).map(|s| s.state),
        Some(QpState::Error),
        "seed {seed}"
    );
}

/// Creates a connected pair with `opts` on both sides (the cluster's `connect` takes none).
fn pair_with(sim: &mut Sim, opts: QpOptions) -> (Side, Side) {
    let mk = |sim: &mut Sim, node: usize| {
        let ep = &mut sim.c.ep_mut(node);
        let pd = ep.alloc_pd();
        let cq = ep.create_cq();
        let qp = ep
            .create_qp_with(pd, cq, cq, opts.clone())
            .expect("fresh PD");
        Side { node, pd, cq, qp }
    };
    let (a, b) = (mk(sim, 0), mk(sim, 1));
    sim.c.ep_mut(0).connect(a.qp.qpn, b.qp).expect("Init");
    sim.c.ep_mut(1).connect(b.qp.qpn, a.qp).expect("Init");
    (a, b)
}

/// A 3000-byte WRITE whose packets all take the slow path, then `then` (a SEND or a
/// WRITE_IMM) on the fast one; runs until b's receive completes. Returns the target region,
/// the source, and whether the WRITE's bytes were all in place when the receive completed.
fn slow_write_then(seed: u64, then: fn(u32) -> SendOp, opts: QpOptions) -> (bool, Completion) {
    let mut sim = Sim::new(seed, &config(4, 10), LinkConfig::default());
    let (a, b) = pair_with(&mut sim, opts);
    let mut rng = rng(seed);
    let local: Mr = sim.random_mr(a, 8192, Access::LOCAL_WRITE, &mut rng);
    let target = sim.c.alloc_mr(&b, 8192, Access::ALL);
    let rbuf = sim.c.alloc_mr(&b, 4096, Access::LOCAL_WRITE);
    sim.post_recv(
        b,
        RecvWr {
            wr_id: 50,
            sges: vec![sge(&rbuf, 0, 256)],
        },
    );
    sim.c.net.set_default_link(slow());
    let write = SendOp::Write(RemoteAddr {
        rkey: target.keys.rkey,
        offset: 0,
    });
    sim.post_send(a, send_wr(1, write, vec![sge(&local, 0, 3000)]));
    sim.c.flush();
    let sent = sim.c.ep(0).qp_stats(a.qp.qpn).expect("QP").packets_sent;
    assert!(
        sent >= 3,
        "seed {seed}: the whole WRITE left on the slow path"
    );
    sim.c.net.set_default_link(LinkConfig::default());
    sim.post_send(
        a,
        send_wr(2, then(target.keys.rkey), vec![sge(&local, 4096, 64)]),
    );
    let wc = sim.wait_cq(b, 1, 200_000).remove(0);
    let placed = target.region.to_vec(0, 3000).expect("in bounds")
        == local.region.to_vec(0, 3000).expect("in bounds");
    // Everything completes in the end, either way.
    let got = sim.wait_cq(a, 2, 200_000);
    assert!(
        got.iter().all(|c| c.status == WcStatus::Success),
        "seed {seed}: {got:?}"
    );
    (placed, wc)
}

#[test]
fn send_completes_only_after_an_earlier_slow_write_is_placed() {
    let (placed, wc) = slow_write_then(seed(911), |_| SendOp::Send, QpOptions::default());
    assert_eq!((wc.wr_id, wc.status), (50, WcStatus::Success));
    assert!(
        placed,
        "the RECV completed before the earlier WRITE was placed"
    );
}

#[test]
fn write_imm_completes_only_after_an_earlier_slow_write_is_placed() {
    let (placed, wc) = slow_write_then(
        seed(912),
        |rkey| SendOp::WriteImm(RemoteAddr { rkey, offset: 4096 }, 9),
        QpOptions::default(),
    );
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.imm),
        (50, WcStatus::Success, WcOpcode::RecvRdmaWithImm, Some(9))
    );
    assert!(
        placed,
        "the WRITE_IMM completed before the earlier WRITE was placed"
    );
}

#[test]
fn unordered_qp_completes_a_send_before_an_earlier_slow_write() {
    let (placed, wc) = slow_write_then(seed(913), |_| SendOp::Send, QpOptions::unordered());
    assert_eq!((wc.wr_id, wc.status), (50, WcStatus::Success));
    assert!(
        !placed,
        "an unordered QP completes the RECV as soon as its own bytes are placed"
    );
}

/// At the requester, a READ whose response takes the slow path completes before a later
/// atomic whose response is fast: completions in posting order.
#[test]
fn requester_completes_read_and_atomic_in_posting_order() {
    let seed = seed(914);
    let mut sim = Sim::new(seed, &config(4, 10), LinkConfig::default());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let local = sim.random_mr(a, 8192, Access::LOCAL_WRITE, &mut rng);
    let remote = sim.random_mr(b, 8192, Access::ALL, &mut rng);
    let (rb, b_addr) = (b.node, sim.c.addr(b.node));
    let ports = sim.c.ep(rb).config().ports;
    // The READ's responses leave b on slow links; the atomic's leave later, on fast ones.
    for port in 0..ports {
        sim.c.net.set_link(b_addr, port, slow());
    }
    let read = SendOp::Read(RemoteAddr {
        rkey: remote.keys.rkey,
        offset: 0,
    });
    sim.post_send(a, send_wr(1, read, vec![sge(&local, 0, 3000)]));
    sim.c.run_until(10_000, |c| {
        c.ep(rb).qp_stats(b.qp.qpn).expect("QP").packets_sent >= 3
    });
    for port in 0..ports {
        sim.c.net.set_link(b_addr, port, LinkConfig::default());
    }
    let add = SendOp::FetchAdd(
        RemoteAddr {
            rkey: remote.keys.rkey,
            offset: 4096,
        },
        1,
    );
    sim.post_send(a, send_wr(2, add, vec![sge(&local, 4096, 8)]));
    let got = sim.wait_cq(a, 2, 200_000);
    let order: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        order,
        [(1, WcStatus::Success), (2, WcStatus::Success)],
        "seed {seed}"
    );
}

/// The same bad post, made over and over while another thread keeps the engine busy (posting
/// WRITEs and reading stats), is refused synchronously every time, and the QP stays usable:
/// no post is accepted and then failed asynchronously.
#[test]
fn a_bad_post_is_refused_synchronously_under_a_busy_engine() {
    use braid::{Device, DeviceConfig, PostError};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    let open = || {
        let dev = Device::open(DeviceConfig::udp("127.0.0.1:0".parse().unwrap()).paths(4))
            .expect("open a UDP device");
        let pd = dev.alloc_pd();
        let cq = dev.create_cq();
        let qp = pd.create_qp(&cq, &cq).expect("qp");
        (dev, pd, cq, qp)
    };
    let (_da, pa, ca, qa) = open();
    let (_db, pb, _cb, qb) = open();
    qa.connect(qb.info()).unwrap();
    qb.connect(qa.info()).unwrap();
    let src = Arc::new(pa.alloc_mr(4096, Access::NONE).unwrap());
    let dst = Arc::new(pb.alloc_mr(4096, Access::REMOTE_WRITE).unwrap());
    let qa = Arc::new(qa);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let hammer = {
        let (qa, src, dst) = (qa.clone(), src.clone(), dst.clone());
        let (stop, count) = (stop.clone(), count.clone());
        std::thread::spawn(move || {
            let mut posted = 0u64;
            while !stop.load(Ordering::Relaxed) {
                count.fetch_add(1, Ordering::Relaxed);
                let _ = qa.stats();
                let wr = SendWr {
                    wr_id: 1_000_000 + posted,
                    op: SendOp::Write(dst.remote(0)),
                    sges: vec![src.sge(0, 64)],
                    signaled: false,
                };
                if qa.post_send(wr).is_ok() {
                    posted += 1;
                }
            }
            posted
        })
    };
    while count.load(Ordering::Relaxed) < 100 {
        std::thread::yield_now();
    }
    let mut bad_sge = src.sge(0, 64);
    bad_sge.offset = 1 << 20;
    let refused = (0..3000)
        .map(|i| {
            let wr = SendWr {
                wr_id: i,
                op: SendOp::Write(dst.remote(0)),
                sges: vec![bad_sge],
                signaled: true,
            };
            qa.post_send(wr)
        })
        .filter(|r| *r == Err(PostError::OutOfBounds))
        .count();
    stop.store(true, Ordering::Relaxed);
    let posted = hammer.join().unwrap();
    assert_eq!(refused, 3000, "every bad post refused synchronously");
    assert!(posted > 0, "the hammering thread posted");
    // A last signaled WRITE completes: nothing failed the QP.
    let last = SendWr {
        wr_id: 7,
        op: SendOp::Write(dst.remote(0)),
        sges: vec![src.sge(0, 64)],
        signaled: true,
    };
    // The hammering thread may have left the send queue full of unsignaled WRITEs: room
    // comes back as they complete, as a verbs application would wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match qa.post_send(last.clone()) {
            Ok(()) => break,
            Err(PostError::QueueFull) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("post the last WRITE: {e}"),
        }
    }
    let c = ca.wait(Duration::from_secs(20)).expect("a completion");
    assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
    assert!(ca.poll_one().is_none(), "no error completion");
}

/// A READ posted just before a refused WRITE still gets its data: the responder fails only
/// once its responses to the requests before the refusal are delivered.
#[test]
fn read_before_a_refusal_gets_its_data() {
    for (i, link) in [LinkConfig::default(), crate::support::hostile_link(0.05)]
        .into_iter()
        .cycle()
        .take(10)
        .collect::<Vec<_>>()
        .into_iter()
        .enumerate()
    {
        let seed = seed(930) + i as u64;
        let mut sim = Sim::new(seed, &config(4, 10), link);
        let mut rng = rng(seed);
        let (a, b) = (sim.a, sim.b);
        let local = sim.c.alloc_mr(&a, 16384, Access::LOCAL_WRITE);
        let remote = sim.random_mr(b, 16384, Access::ALL, &mut rng);
        let read = SendOp::Read(RemoteAddr {
            rkey: remote.keys.rkey,
            offset: 0,
        });
        sim.post_send(a, send_wr(1, read, vec![sge(&local, 0, 12000)]));
        let bad = SendOp::Write(RemoteAddr {
            rkey: remote.keys.rkey ^ 1,
            offset: 0,
        });
        sim.post_send(a, send_wr(2, bad, vec![sge(&local, 12000, 100)]));
        let got = sim.wait_cq(a, 2, 200_000);
        let statuses: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            statuses,
            [(1, WcStatus::Success), (2, WcStatus::RemoteAccessError)],
            "seed {seed}"
        );
        assert_eq!(
            local.region.to_vec(0, 12000).expect("in bounds"),
            remote.region.to_vec(0, 12000).expect("in bounds"),
            "seed {seed}: the READ's data"
        );
        sim.c.run_until(200_000, |c| c.next_event().is_none());
        let eb = &sim.c.ep_mut(b.node);
        assert_eq!(
            eb.qp_stats(b.qp.qpn).map(|s| s.state),
            Some(QpState::Error),
            "seed {seed}"
        );
        assert_eq!(eb.poll_timeout(), None, "seed {seed}");
    }
}
