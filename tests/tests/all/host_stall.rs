//! A loaded host is not a dead path: a responder whose retransmit timer runs on a slow host's
//! round trips, and a host that is not serviced for half a second mid-transfer, must not fail
//! a live QP nor leave it crawling. Every assertion names the seed; replay a failure with
//! `BRAID_SEED=<seed> cargo test -p braid-tests --test all host_stall`.
use braid::datapath::sim::LinkConfig;
use braid::proto::{
    Access, Endpoint, EndpointConfig, RemoteAddr, SendOp, SendWr, Timestamp, WcStatus,
};
use braid::testing::{Cluster, HostModel, Mr, Side};
use rand_core::RngCore;

use crate::support::{rng, seed, sge, snapshot};

const KIB: u32 = 1 << 10;
const MS: u64 = 1_000_000;
/// Paths per device.
const PATHS: u16 = 8;
/// Most steps one phase may take before it counts as a livelock.
const MAX_STEPS: u64 = 5_000_000;

/// A LAN's links: 10 µs each way, a little jitter.
fn lan() -> LinkConfig {
    LinkConfig {
        delay_ns: 10_000,
        jitter_ns: 2_000,
        ..LinkConfig::default()
    }
}

/// A region of `len` bytes on `side`'s node, filled with bytes drawn from `seed`.
fn filled_mr(c: &mut Cluster, side: &Side, len: usize, access: Access, seed: u64) -> Mr {
    let mr = c.alloc_mr(side, len, access);
    let mut bytes = vec![0u8; len];
    rng(seed).fill_bytes(&mut bytes);
    mr.region.write(0, &bytes).expect("in bounds");
    mr
}

/// The links of every path of `node` (the direction from it).
fn links_from(c: &mut Cluster, node: usize, blackhole: bool) {
    let addr = c.addr(node);
    for path in 0..PATHS {
        c.net.link_mut(addr, path).blackhole = blackhole;
    }
}

/// A responder whose retransmit timer is slow (a 50 ms floor, backing off to 200 ms: the
/// round trips a heavily loaded host measures) serves a 4 MiB READ from a requester with the
/// default timers and a budget of seven timeouts in a row (the namespace fault matrix's), and
/// everything the requester sends is black-holed for 55 ms mid-response: the responder's
/// acknowledgements are lost, its window fills, and its first probe (50 ms) goes unanswered.
/// The requester's budget lasts 127.5 ms from its last progress and its last timeout before
/// that comes at 63.5 ms, after the outage; the responder's next probe would come only at
/// 150 ms. The READ must still complete: the requester asks for the response again on its
/// timeout and the responder answers that at once (before, the requester counted its
/// timeouts while only the responder's timer could resend, and failed with RetryExceeded).
#[test]
fn a_read_outlives_an_outage_that_ends_between_the_responders_probes() {
    let seed = seed(9101);
    let cfg = EndpointConfig {
        paths: PATHS,
        rto_initial_ns: 500_000,
        retry_timeout_ns: 0,
        ..EndpointConfig::default()
    };
    let mut c = Cluster::new(seed, 2, &cfg, lan());
    let slow = EndpointConfig {
        seed: seed ^ 0x51_0e,
        rto_initial_ns: 50 * MS,
        rto_min_ns: 50 * MS,
        rto_max_ns: 200 * MS,
        ..cfg.clone()
    };
    let addr = c.addr(1);
    c.restart(1, Endpoint::new(slow, addr));
    let (a, b) = c.connect(0, 1);
    let len = 4096 * KIB;
    let src = filled_mr(&mut c, &b, len as usize, Access::ALL, seed);
    let dst = c.alloc_mr(&a, len as usize, Access::LOCAL_WRITE);
    c.ep_mut(0)
        .post_send(
            a.qp.qpn,
            SendWr {
                wr_id: 1,
                op: SendOp::Read(RemoteAddr {
                    rkey: src.keys.rkey,
                    offset: 0,
                }),
                sges: vec![sge(&dst, 0, len)],
                signaled: true,
            },
        )
        .expect("post the READ");
    let bq = b.qp.qpn;
    assert!(
        c.run_until(MAX_STEPS, |c| c
            .ep(1)
            .qp_stats(bq)
            .is_some_and(|s| s.packets_sent >= 400)),
        "seed {seed}: the response never got going"
    );
    links_from(&mut c, 0, true);
    let back = c.now.add_nanos(55 * MS);
    while c.now < back && c.cq_len(0, a.cq) == 0 {
        c.step_tapped(Some(back), &mut |_| true);
    }
    assert_eq!(
        c.cq_len(0, a.cq),
        0,
        "seed {seed}: the READ ended during the outage: {:?}",
        c.poll_cq(0, a.cq)
    );
    links_from(&mut c, 0, false);
    assert!(
        c.run_until(MAX_STEPS, |c| c.cq_len(0, a.cq) > 0),
        "seed {seed}: no completion"
    );
    let wc = c.poll_cq(0, a.cq).expect("one completion");
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "seed {seed}: {wc:?} at {:?}",
        c.now
    );
    assert!(
        snapshot(&dst.region) == snapshot(&src.region),
        "seed {seed}: READ bytes differ"
    );
}

/// How a transfer went around a stall: its rate before, and after the stall ended.
struct AroundStall {
    before_bps: f64,
    after_bps: f64,
    /// Delay samples the sender dropped as measuring a stall.
    stalled_samples: u64,
}

/// 256 WRITEs of 64 KiB from node 0 to node 1 over eight 1 Gbit/s paths; once a quarter of
/// them completed, node `held` is not serviced for 500 ms (a descheduled progress thread:
/// what arrives meanwhile waits in its socket, its timers fire late); then the rest. Every
/// WRITE must succeed and every byte arrive.
fn stall_mid_transfer(seed: u64, held: usize) -> AroundStall {
    const N: usize = 256;
    const SIZE: u32 = 64 * KIB;
    let cfg = EndpointConfig {
        paths: PATHS,
        ..EndpointConfig::default()
    };
    let link = LinkConfig {
        bandwidth_bps: Some(1_000_000_000),
        queue_bytes: 256 << 10,
        ..lan()
    };
    let mut c = Cluster::new(seed, 2, &cfg, link);
    let (a, b): (Side, Side) = c.connect(0, 1);
    let total = N * SIZE as usize;
    let src = filled_mr(&mut c, &a, total, Access::LOCAL_WRITE, seed);
    let dst = c.alloc_mr(&b, total, Access::ALL);
    for i in 0..N {
        let off = (i * SIZE as usize) as u64;
        c.ep_mut(0)
            .post_send(
                a.qp.qpn,
                SendWr {
                    wr_id: i as u64,
                    op: SendOp::Write(RemoteAddr {
                        rkey: dst.keys.rkey,
                        offset: off,
                    }),
                    sges: vec![sge(&src, off, SIZE)],
                    signaled: true,
                },
            )
            .expect("post a WRITE");
    }
    let start = c.now;
    let cq = a.cq;
    assert!(
        c.run_until(MAX_STEPS, |c| c.cq_len(0, cq) >= N / 4),
        "seed {seed}: the first quarter never completed"
    );
    let before_n = c.cq_len(0, cq);
    let before_bps = rate(before_n, SIZE, start, c.now);
    let resume = c.now.add_nanos(500 * MS);
    c.hold_until(held, resume);
    assert!(
        c.run_until(MAX_STEPS, |c| c.now >= resume),
        "seed {seed}: the clock never reached the end of the stall"
    );
    let after_n = c.cq_len(0, cq);
    assert!(
        c.run_until(MAX_STEPS, |c| c.cq_len(0, cq) >= N),
        "seed {seed}: {} of {N} WRITEs completed by {:?} (node {held} stalled); {:?}",
        c.cq_len(0, cq),
        c.now,
        c.ep(0).qp_stats(a.qp.qpn)
    );
    let after_bps = rate(N - after_n, SIZE, resume, c.now);
    let mut n = 0;
    while let Some(wc) = c.poll_cq(0, cq) {
        assert_eq!(wc.status, WcStatus::Success, "seed {seed}: {wc:?}");
        assert_eq!(wc.wr_id, n, "seed {seed}: completion order");
        n += 1;
    }
    assert!(
        snapshot(&dst.region) == snapshot(&src.region),
        "seed {seed}: WRITE bytes differ (node {held} stalled)"
    );
    AroundStall {
        before_bps,
        after_bps,
        stalled_samples: c.ep(0).stats().stalled_samples,
    }
}

/// Payload bits per second of `n` messages of `size` bytes from `from` to `to`.
fn rate(n: usize, size: u32, from: Timestamp, to: Timestamp) -> f64 {
    (n as f64 * f64::from(size) * 8.0) / (to.nanos_since(from).max(1) as f64 / 1e9)
}

/// The sender is not serviced for 500 ms: every acknowledgement waiting for it then measures
/// the stall, and its retransmit timer fires half a second late. After the stall the QP
/// must run at least at half its rate before it, not at the rate a 500 ms round trip
/// (or a window cut to the floor) allows.
#[test]
fn a_sender_stalled_500_ms_recovers_its_rate() {
    let seed = seed(9201);
    let s = stall_mid_transfer(seed, 0);
    assert!(
        s.stalled_samples > 0,
        "seed {seed}: no sample dropped as stalled"
    );
    assert!(
        s.after_bps >= 0.5 * s.before_bps,
        "seed {seed}: {:.0} Mbit/s after the stall, {:.0} before",
        s.after_bps / 1e6,
        s.before_bps / 1e6
    );
}

/// The receiver is not serviced for 500 ms: the sender's timeouts fire (it cannot tell a
/// stalled peer from a silent path), and the acknowledgements that come when the receiver
/// catches up measure its stall. The QP must survive and run at least at half its rate
/// before the stall.
#[test]
fn a_receiver_stalled_500_ms_recovers_its_rate() {
    let seed = seed(9202);
    let s = stall_mid_transfer(seed, 1);
    assert!(
        s.stalled_samples > 0,
        "seed {seed}: no sample dropped as stalled"
    );
    assert!(
        s.after_bps >= 0.5 * s.before_bps,
        "seed {seed}: {:.0} Mbit/s after the stall, {:.0} before",
        s.after_bps / 1e6,
        s.before_bps / 1e6
    );
}

/// `n` WRITEs of 64 KiB from node 0 to node 1 over eight 1 Gbit/s paths, node `paused`
/// pausing as `model` says; every WRITE must succeed, in order, every byte arrive. Returns
/// the payload rate over the time the paused host was running (the run's length less its
/// pauses), bits per second.
fn rate_while_pausing(seed: u64, paused: usize, model: Option<HostModel>) -> f64 {
    const N: usize = 1024;
    const SIZE: u32 = 64 * KIB;
    let cfg = EndpointConfig {
        paths: PATHS,
        ..EndpointConfig::default()
    };
    let link = LinkConfig {
        bandwidth_bps: Some(1_000_000_000),
        queue_bytes: 256 << 10,
        ..lan()
    };
    let mut c = Cluster::new(seed, 2, &cfg, link);
    let (a, b): (Side, Side) = c.connect(0, 1);
    let total = N * SIZE as usize;
    let src = filled_mr(&mut c, &a, total, Access::LOCAL_WRITE, seed);
    let dst = c.alloc_mr(&b, total, Access::ALL);
    for i in 0..N {
        let off = (i * SIZE as usize) as u64;
        c.ep_mut(0)
            .post_send(
                a.qp.qpn,
                SendWr {
                    wr_id: i as u64,
                    op: SendOp::Write(RemoteAddr {
                        rkey: dst.keys.rkey,
                        offset: off,
                    }),
                    sges: vec![sge(&src, off, SIZE)],
                    signaled: true,
                },
            )
            .expect("post a WRITE");
    }
    let pause_ns = model.map_or(0, |m| m.pause_ns);
    if let Some(m) = model {
        c.set_host(paused, m);
    }
    let start = c.now;
    let cq = a.cq;
    assert!(
        c.run_until(50 * MAX_STEPS, |c| c.cq_len(0, cq) >= N),
        "seed {seed}: {} of {N} WRITEs completed by {:?} (node {paused} pausing); {:?}",
        c.cq_len(0, cq),
        c.now,
        c.ep(0).qp_stats(a.qp.qpn)
    );
    let mut n = 0;
    while let Some(wc) = c.poll_cq(0, cq) {
        assert_eq!(wc.status, WcStatus::Success, "seed {seed}: {wc:?}");
        assert_eq!(wc.wr_id, n, "seed {seed}: completion order");
        n += 1;
    }
    assert!(
        snapshot(&dst.region) == snapshot(&src.region),
        "seed {seed}: WRITE bytes differ (node {paused} pausing)"
    );
    let paused_ns = c.host_pauses(paused) * pause_ns;
    let running = c.now.nanos_since(start).saturating_sub(paused_ns);
    rate(N, SIZE, start, start.add_nanos(running))
}

/// The receiver pauses for 20 ms at random, 40 ms apart on average (a descheduled process):
/// the sender's timeouts fire in every pause and cut its window to the floor, and the
/// acknowledgements that come when the receiver runs again measure the pause. Over the
/// time the receiver runs, the transfer must keep at least half the rate it has without
/// pauses. (Before stall-tainted samples were dropped, each pause left the sender pacing a
/// fraction of a packet per inflated round trip: 0.9 Gbit/s of 7.)
#[test]
fn a_receiver_pausing_20_ms_at_random_keeps_its_rate() {
    let seed = seed(77);
    let calm = rate_while_pausing(seed, 1, None);
    let paused = rate_while_pausing(seed, 1, Some(HostModel::pausing(40 * MS, 20 * MS)));
    assert!(
        paused >= 0.5 * calm,
        "seed {seed}: {:.0} Mbit/s while the receiver ran, {:.0} without pauses",
        paused / 1e6,
        calm / 1e6
    );
}
