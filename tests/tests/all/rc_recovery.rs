//! Recovery on a reliable connection: a slow or pausing host is not a dead peer, a dead peer
//! still fails after the configured retry time, a lost NAK costs a round trip, and placement
//! tracking has a per-QP bound a peer cannot push. Every assertion names the seed; replay a
//! failure with `BRAID_SEED=<seed> cargo test -p braid-tests --test all <test name>`.
use braid::datapath::sim::LinkConfig;
use braid::proto::{
    Access, Completion, EndpointConfig, RecvWr, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus,
};
use braid::testing::HostModel;

use crate::support::{Sim, config, rng, seed, sge, snapshot};

const KIB: u32 = 1 << 10;
const MS: u64 = 1_000_000;

/// A link like a LAN's: 10 µs each way, a little jitter.
fn lan() -> LinkConfig {
    LinkConfig {
        delay_ns: 10_000,
        jitter_ns: 5_000,
        ..LinkConfig::default()
    }
}

/// Posts `n` WRITEs and `n` READs of `size` bytes each (interleaved) from a to b, and a SEND
/// of `size` bytes into a RECV posted at b; runs up to `max_steps`; checks every byte and
/// that every work request completed with Success.
fn transfer_is_exact(sim: &mut Sim, n: u32, size: u32, max_steps: u64) {
    let seed = sim.seed;
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let total = (n * size) as usize;
    let src = sim.random_mr(a, total + size as usize, Access::LOCAL_WRITE, &mut rng);
    let back = sim.c.alloc_mr(&a, total, Access::LOCAL_WRITE);
    let dst = sim.random_mr(b, 2 * total + size as usize, Access::ALL, &mut rng);
    // READs fetch the upper half of b's region, which the WRITEs do not touch.
    let upper = total as u64;
    sim.post_recv(
        b,
        RecvWr {
            wr_id: 1000,
            sges: vec![sge(&dst, 2 * total as u64, size)],
        },
    );
    let remote = |offset| RemoteAddr {
        rkey: dst.keys.rkey,
        offset,
    };
    let mut id = 0;
    for i in 0..u64::from(n) {
        let off = i * u64::from(size);
        for (op, sges) in [
            (SendOp::Write(remote(off)), vec![sge(&src, off, size)]),
            (
                SendOp::Read(remote(upper + off)),
                vec![sge(&back, off, size)],
            ),
        ] {
            id += 1;
            sim.post_send(
                a,
                SendWr {
                    wr_id: id,
                    op,
                    sges,
                    signaled: true,
                },
            );
        }
    }
    id += 1;
    sim.post_send(
        a,
        SendWr {
            wr_id: id,
            op: SendOp::Send,
            sges: vec![sge(&src, total as u64, size)],
            signaled: true,
        },
    );
    let sends = sim.wait_cq(a, id as usize, max_steps);
    let recvs = sim.wait_cq(b, 1, max_steps);
    let bad: Vec<&Completion> = sends
        .iter()
        .chain(&recvs)
        .filter(|c| c.status != WcStatus::Success)
        .collect();
    assert!(
        bad.is_empty(),
        "seed {seed}: error completions {bad:?} at {:?}",
        sim.c.now
    );
    let ids: Vec<u64> = sends.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (1..=id).collect::<Vec<_>>(), "seed {seed}: order");
    assert_eq!(recvs[0].opcode, WcOpcode::Recv, "seed {seed}");
    let (s, d, r) = (
        snapshot(&src.region),
        snapshot(&dst.region),
        snapshot(&back.region),
    );
    assert!(d[..total] == s[..total], "seed {seed}: WRITE bytes differ");
    assert!(
        r[..] == d[total..2 * total],
        "seed {seed}: READ bytes differ"
    );
    assert!(
        d[2 * total..2 * total + size as usize] == s[total..total + size as usize],
        "seed {seed}: SEND bytes differ"
    );
}

#[test]
fn a_host_twenty_times_slower_delivers_every_byte_without_an_error() {
    for node in [0, 1] {
        let seed = seed(7101 + node as u64);
        let mut sim = Sim::new(seed, &config(8, 7), lan());
        sim.c.set_host(node, HostModel::slower(20));
        transfer_is_exact(&mut sim, 16, 64 * KIB, 20_000_000);
    }
}

/// Both hosts pause for 50 ms at random (40 ms apart on average, each on its own schedule),
/// as descheduled processes do, and spend 2 µs per datagram: the timeouts each sees while the
/// other sleeps, and the ones it handles late after its own pause, must not add up to a dead
/// peer. (The first engine counted seven timeouts in a row, about 128 ms, as death, and
/// failed a READ here with `RetryExceeded`.)
/// Both hosts pause for 50 ms at random (40 ms apart on average, each on its own schedule),
/// as descheduled processes do, and spend 2 µs per datagram: the timeouts each sees while the
/// other sleeps, and the ones it handles late after its own pause, must not add up to a dead
/// peer. (Counting seven timeouts in a row, about 128 ms of backoff, as death failed a READ
/// here with `RetryExceeded`.)
#[test]
fn hosts_pausing_50_ms_at_random_deliver_every_byte_without_an_error() {
    let mut pauses = [0; 2];
    for run in 0..3 {
        let seed = seed(1 + run);
        let mut sim = Sim::new(seed, &config(8, 7), lan());
        for node in [0, 1] {
            sim.c.set_host(
                node,
                HostModel {
                    cost_ns: 2_000,
                    ..HostModel::pausing(40 * MS, 50 * MS)
                },
            );
        }
        transfer_is_exact(&mut sim, 64, 256 * KIB, 20_000_000);
        for (node, p) in pauses.iter_mut().enumerate() {
            *p += sim.c.host_pauses(node);
        }
    }
    assert!(
        pauses.iter().all(|&p| p >= 5),
        "the hosts paused only {pauses:?} times"
    );
}

#[test]
fn a_dead_peer_ends_in_retry_exceeded_after_the_configured_time() {
    let seed = seed(7301);
    let cfg = EndpointConfig {
        retry_timeout_ns: 1_000 * MS,
        ..config(8, 7)
    };
    let mut sim = Sim::new(seed, &cfg, lan());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let src = sim.random_mr(a, 256 * KIB as usize, Access::LOCAL_WRITE, &mut rng);
    let dst = sim.random_mr(b, 256 * KIB as usize, Access::ALL, &mut rng);
    for i in 0..4u64 {
        sim.post_send(
            a,
            SendWr {
                wr_id: i,
                op: SendOp::Write(RemoteAddr {
                    rkey: dst.keys.rkey,
                    offset: i * 64 * u64::from(KIB),
                }),
                sges: vec![sge(&src, i * 64 * u64::from(KIB), 64 * KIB)],
                signaled: true,
            },
        );
    }
    let qpn = a.qp.qpn;
    assert!(
        sim.c.run_until(1_000_000, |c| c
            .ep(0)
            .qp_stats(qpn)
            .is_some_and(|s| s.packets_sent >= 20)),
        "seed {seed}: never got going"
    );
    let t0 = sim.c.now;
    sim.c.remove_host(1); // node b is gone: its packets and timers with it
    let got = sim.wait_cq(a, 4, 1_000_000);
    let waited = sim.c.now.nanos_since(t0);
    let statuses: Vec<WcStatus> = got.iter().map(|c| c.status).collect();
    assert_eq!(statuses[0], WcStatus::RetryExceeded, "seed {seed}: {got:?}");
    assert!(
        statuses[1..].iter().all(|s| *s == WcStatus::Flushed),
        "seed {seed}: {got:?}"
    );
    // Not before the configured silence, and not much after (one ceiling-length timeout
    // beyond it, plus the round trip that was in flight).
    let rto_max = cfg.rto_max_ns;
    // (The silence is counted from the peer's last packet, which may have left it a few
    // microseconds before `t0`.)
    assert!(
        waited >= cfg.retry_timeout_ns - cfg.rto_min_ns,
        "seed {seed}: gave up after {waited} ns, before the retry time"
    );
    assert!(
        waited <= cfg.retry_timeout_ns + 2 * rto_max,
        "seed {seed}: gave up only after {waited} ns"
    );
}

/// A peer that places one byte at every other offset of eight 64 KiB RECVs (40 000 separate
/// pieces, each in its own new packet) gets tracked up to the QP's budget of
/// `MAX_TRACKED_RANGES` ranges, and every piece past it is dropped (counted as a bad packet):
/// the tracking never grows further, though each message alone stays under its own cap. A
/// second QP between the same nodes keeps working.
#[test]
fn a_peer_fragmenting_placement_past_the_qp_budget_is_refused() {
    use braid::proto::MAX_TRACKED_RANGES;
    use braid::proto::wire::{self, Body, Header, Kind, Op, Request};
    let seed = seed(7401);
    let mut sim = Sim::new(seed, &config(8, 7), LinkConfig::default());
    let (a, b) = (sim.a, sim.b);
    const RECVS: u32 = 8;
    const PIECES: u32 = 5_000;
    const LEN: u32 = 64 * KIB;
    let sink = sim
        .c
        .alloc_mr(&b, (RECVS * LEN) as usize, Access::LOCAL_WRITE);
    for j in 0..RECVS {
        sim.post_recv(
            b,
            RecvWr {
                wr_id: u64::from(j),
                sges: vec![sge(&sink, u64::from(j * LEN), LEN)],
            },
        );
    }
    let before = sim.c.ep(1).stats().rx_bad_response;
    let (from, now) = (sim.c.addr(0), sim.c.now);
    let mut psn = a.qp.psn;
    for j in 0..RECVS {
        for i in 0..PIECES {
            let h = Header {
                kind: Kind::Request,
                path: 0,
                flags: 0,
                dst_qpn: b.qp.qpn,
                src_qpn: a.qp.qpn,
                psn,
                send_ts_ns: 1,
            };
            let body = Body::Request(Request {
                op: Op::Send,
                msn: j,
                ssn: j,
                imm: 0,
                rkey: 0,
                msg_len: LEN,
                offset: 2 * i,
                remote_offset: 0,
            });
            let mut buf = vec![0u8; wire::packet_len(&body, 1)];
            wire::emit(&mut buf, &h, &body, 1, |p| p.fill(0xa5)).expect("sized");
            let bad = sim.c.ep(1).stats().rx_bad_response;
            sim.c.ep_mut(1).handle_datagram(now, from, 0, &buf);
            // A refused packet is not accepted: the next one reuses its sequence number.
            if sim.c.ep(1).stats().rx_bad_response == bad {
                psn = psn.wrapping_add(1);
            }
        }
    }
    let refused = sim.c.ep(1).stats().rx_bad_response - before;
    let total = u64::from(RECVS * PIECES);
    assert_eq!(
        refused,
        total - MAX_TRACKED_RANGES as u64,
        "seed {seed}: pieces refused past the budget"
    );
    let st = sim.c.ep(1).qp_stats(b.qp.qpn).expect("qp");
    assert_eq!(st.state, braid::proto::QpState::Connected, "seed {seed}");
    // Another QP between the same nodes is untouched: a SEND still lands whole.
    let (x, y) = sim.c.connect(0, 1);
    let mut rng = rng(seed);
    let src = sim.random_mr(x, LEN as usize, Access::NONE, &mut rng);
    let dst = sim.c.alloc_mr(&y, LEN as usize, Access::LOCAL_WRITE);
    sim.post_recv(
        y,
        RecvWr {
            wr_id: 99,
            sges: vec![sge(&dst, 0, LEN)],
        },
    );
    sim.post_send(
        x,
        SendWr {
            wr_id: 98,
            op: SendOp::Send,
            sges: vec![sge(&src, 0, LEN)],
            signaled: true,
        },
    );
    let got = sim.wait_cq(y, 1, 1_000_000);
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (99, WcStatus::Success),
        "seed {seed}"
    );
    assert!(
        snapshot(&dst.region) == snapshot(&src.region),
        "seed {seed}: bytes"
    );
}

fn is_nak(d: &[u8]) -> bool {
    braid::proto::wire::Packet::parse(d)
        .is_ok_and(|p| p.header.kind == braid::proto::wire::Kind::Nak)
}

/// What a refused one-packet WRITE costs the requester, with its first NAK dropped or not:
/// (virtual time to the completion, the requester's QP stats, the completion's status).
fn refused_write(drop_nak: bool) -> (u64, braid::proto::QpStats, WcStatus) {
    let seed = seed(7501);
    let mut sim = Sim::new(seed, &config(8, 7), lan());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let src = sim.random_mr(a, 4096, Access::LOCAL_WRITE, &mut rng);
    let dst = sim.random_mr(b, 4096, Access::ALL, &mut rng);
    if drop_nak {
        sim.c.drop_sent(1, 1, is_nak);
    }
    let t0 = sim.c.now;
    sim.post_send(
        a,
        SendWr {
            wr_id: 1,
            op: SendOp::Write(RemoteAddr {
                rkey: dst.keys.rkey ^ 0x5a5a,
                offset: 0,
            }),
            sges: vec![sge(&src, 0, 1000)],
            signaled: true,
        },
    );
    let got = sim.wait_cq(a, 1, 100_000);
    assert_eq!(sim.c.dropped_sent(), u64::from(drop_nak), "seed {seed}");
    let st = sim.c.ep(0).qp_stats(a.qp.qpn).expect("qp");
    (sim.c.now.nanos_since(t0), st, got[0].status)
}

/// A lost NAK is repeated by the responder: the refused WRITE fails with its remote access
/// error without a retransmit timeout, a retransmission, a window cut or a re-path, about a
/// round trip later than when the NAK arrives (the responder, which has no RTT sample of its
/// own, repeats after 50 µs; the requester's timeout floor is 500 µs).
#[test]
fn a_lost_nak_for_a_refused_write_costs_a_round_trip_not_a_timeout() {
    let (t_ok, ok, s_ok) = refused_write(false);
    let (t_lost, lost, s_lost) = refused_write(true);
    assert_eq!(s_ok, WcStatus::RemoteAccessError);
    assert_eq!(s_lost, WcStatus::RemoteAccessError);
    assert_eq!(
        (lost.rtos, lost.retransmits, lost.repaths),
        (0, 0, 0),
        "{lost:?}"
    );
    assert_eq!(lost.cwnd_bytes, ok.cwnd_bytes, "the window was cut");
    assert!(
        t_lost <= t_ok + 100_000,
        "the lost NAK cost {} ns more",
        t_lost - t_ok
    );
}

/// The same for a receiver-not-ready NAK: the SEND is retried after the RNR wait (posting
/// the RECV meanwhile), with no timeout, no re-path and no window cut.
#[test]
fn a_lost_rnr_nak_costs_a_round_trip_not_a_timeout() {
    let seed = seed(7502);
    let mut sim = Sim::new(seed, &config(8, 7), lan());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let src = sim.random_mr(a, 4096, Access::NONE, &mut rng);
    let dst = sim.c.alloc_mr(&b, 4096, Access::LOCAL_WRITE);
    sim.c.drop_sent(1, 1, is_nak);
    sim.post_send(
        a,
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sges: vec![sge(&src, 0, 1000)],
            signaled: true,
        },
    );
    assert!(
        sim.c.run_until(100_000, |c| c.dropped_sent() == 1),
        "seed {seed}: no NAK"
    );
    sim.post_recv(
        b,
        RecvWr {
            wr_id: 2,
            sges: vec![sge(&dst, 0, 4096)],
        },
    );
    let got = sim.wait_cq(a, 1, 100_000);
    assert_eq!(got[0].status, WcStatus::Success, "seed {seed}");
    let recv = sim.wait_cq(b, 1, 100_000);
    assert_eq!(recv[0].status, WcStatus::Success, "seed {seed}");
    let st = sim.c.ep(0).qp_stats(a.qp.qpn).expect("qp");
    assert_eq!((st.rtos, st.repaths), (0, 0), "seed {seed}: {st:?}");
    assert!(
        snapshot(&dst.region)[..1000] == snapshot(&src.region)[..1000],
        "seed {seed}: bytes"
    );
}

/// End to end on a real slow host: the child peer process (`braid-test-peer`, over loopback
/// UDP) is stopped with SIGSTOP for about 50 ms at random moments (and continued with
/// SIGCONT) while this process WRITEs into its region and READs each piece back: every byte
/// comes back as written, and no work request completes with an error.
#[test]
fn a_peer_process_stopped_50_ms_at_random_loses_no_byte_and_no_completion() {
    use std::process::Command;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::Duration;

    use braid::{Device, DeviceConfig};
    use braid_tests::{PEER_REGION_LEN, format_info, parse_info};

    use crate::support::{Peer, below, random_mr};

    let mut peer = Peer::spawn(Command::new(env!("CARGO_BIN_EXE_braid-test-peer")));
    let (info, rkey, len) = parse_info(&peer.recv()).expect("the peer's QP line");
    assert_eq!(len, PEER_REGION_LEN);
    let dev = Device::open(DeviceConfig::udp("127.0.0.1:0".parse().expect("addr")).paths(16))
        .expect("open a UDP device");
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = pd.create_qp(&cq, &cq).expect("qp");
    qp.connect(info).expect("connect");
    assert_eq!(peer.ask(&format_info(&qp.info(), 0, 0)), "READY");

    // Stop and continue the peer at random while the transfer runs.
    let pid = peer.pid().to_string();
    let done = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicU32::new(0));
    let pauser = {
        let (done, paused, pid) = (done.clone(), paused.clone(), pid.clone());
        std::thread::spawn(move || {
            let mut rng = rng(7601);
            let mut pauses = 0u32;
            let signal = |sig: &str| {
                let ok = Command::new("kill")
                    .args([sig, &pid])
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "kill {sig} {pid}");
            };
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10 + below(&mut rng, 60)));
                signal("-STOP");
                std::thread::sleep(Duration::from_millis(40 + below(&mut rng, 20)));
                signal("-CONT");
                pauses += 1;
                paused.store(pauses, Ordering::Relaxed);
            }
            pauses
        })
    };

    const PIECE: u32 = 128 * KIB;
    // Rounds go on until the peer was paused `PAUSES` times (at most `ROUNDS` of them).
    const ROUNDS: u64 = 2_000;
    const PAUSES: u32 = 8;
    const SOURCES: u64 = 16;
    let (src, data) = random_mr(
        &pd,
        (SOURCES * u64::from(PIECE)) as usize,
        Access::NONE,
        7602,
    );
    let back = pd
        .alloc_mr(PIECE as usize, Access::LOCAL_WRITE)
        .expect("mr");
    let slots = PEER_REGION_LEN / 2 / u64::from(PIECE);
    let wait = Duration::from_secs(30);
    let mut failure = None;
    for round in 0..ROUNDS {
        if paused.load(Ordering::Relaxed) >= PAUSES {
            break;
        }
        // Into the second half of its region (the first half holds its pattern).
        let at = PEER_REGION_LEN / 2 + (round % slots) * u64::from(PIECE);
        let off = (round % SOURCES) * u64::from(PIECE);
        let remote = braid::RemoteAddr { rkey, offset: at };
        let post = |id, op, sge| {
            qp.post_send(SendWr {
                wr_id: id,
                op,
                sges: vec![sge],
                signaled: true,
            })
            .expect("post");
        };
        post(2 * round, SendOp::Write(remote), src.sge(off, PIECE));
        post(2 * round + 1, SendOp::Read(remote), back.sge(0, PIECE));
        for id in [2 * round, 2 * round + 1] {
            let wc = cq.wait(wait).expect("a completion within the wait");
            if (wc.wr_id, wc.status) != (id, WcStatus::Success) {
                failure.get_or_insert(format!("round {round}: {wc:?}"));
            }
        }
        if failure.is_some() {
            break;
        }
        let mut got = vec![0u8; PIECE as usize];
        back.read(0, &mut got).expect("in bounds");
        let want = &data[off as usize..(off + u64::from(PIECE)) as usize];
        if got != want {
            failure = Some(format!("round {round}: the READ returned other bytes"));
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    let pauses = pauser.join().expect("the pausing thread");
    assert_eq!(failure, None, "after {pauses} pauses of the peer");
    assert!(pauses >= PAUSES, "the peer was paused only {pauses} times");
    peer.quit(wait);
}
