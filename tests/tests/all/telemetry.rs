//! Telemetry: the counters `qp_stats` and the endpoint expose after real transfers on the
//! simulated network (RTT percentiles, per-path counters, loss and spurious-loss counts).
use braid::proto::{Access, RemoteAddr, SendOp, SendWr, WcStatus};

use crate::support::{Sim, config, hostile_link, rng, seed, sge};

/// a WRITEs `len` bytes into a region on b and waits for the completion.
fn write(sim: &mut Sim, len: u32) {
    let mut rng = rng(sim.seed);
    let src = sim.random_mr(sim.a, len as usize, Access::NONE, &mut rng);
    let b = sim.b;
    let dst = sim.c.alloc_mr(&b, len as usize, Access::REMOTE_WRITE);
    sim.post_send(
        sim.a,
        SendWr {
            wr_id: 1,
            op: SendOp::Write(RemoteAddr {
                rkey: dst.keys.rkey,
                offset: 0,
            }),
            sges: vec![sge(&src, 0, len)],
            signaled: true,
        },
    );
    let wc = sim.wait_cq(sim.a, 1, 3_000_000);
    assert_eq!(wc[0].status, WcStatus::Success, "seed {}", sim.seed);
}

#[test]
fn qp_stats_report_rtt_percentiles_and_per_path_counters() {
    let seed = seed(41);
    let mut sim = Sim::new(seed, &config(8, 10), hostile_link(0.01));
    write(&mut sim, 4 << 20);
    let ep = &sim.c.nodes[0].ep;
    let st = ep.qp_stats(sim.a.qp.qpn).expect("the QP exists");
    let r = st.rtt;
    assert!(r.samples > 100, "seed {seed}: {r:?}");
    assert!(
        r.min_ns <= r.p50_ns
            && r.p50_ns <= r.p99_ns
            && r.p99_ns <= r.p999_ns
            && r.p999_ns <= r.max_ns,
        "seed {seed}: percentiles out of order: {r:?}"
    );
    // The link adds 10 us of delay each way plus up to 30 us of jitter and 80 us of reordering.
    assert!(r.min_ns >= 20_000, "seed {seed}: {r:?}");
    assert_eq!(r.min_ns, st.min_rtt_ns, "seed {seed}");
    // Per-path counters add up to the QP's.
    assert_eq!(st.paths.len(), 8);
    assert_eq!(st.path_ports.len(), 8);
    let sent: u64 = st.paths.iter().map(|p| p.packets).sum();
    let rtx: u64 = st.paths.iter().map(|p| p.retransmits).sum();
    assert_eq!(
        sent,
        st.packets_sent + st.retransmits,
        "seed {seed}: {st:?}"
    );
    assert_eq!(rtx, st.retransmits, "seed {seed}: {st:?}");
    let lost: u64 = st.paths.iter().map(|p| p.lost).sum();
    assert!(
        lost > 0 && st.retransmits > 0,
        "seed {seed}: 1% loss, none seen: {st:?}"
    );
    let samples: u64 = st.paths.iter().map(|p| p.rtt_samples).sum();
    // A path sample needs the echoed packet still unacknowledged; the QP's need not.
    assert!(
        samples <= r.samples && samples > r.samples / 2,
        "seed {seed}: {samples} {r:?}"
    );
    // The device-level distribution holds both QPs' samples (b's are from its ACK-only
    // traffic: none, since b sends no data).
    let dev = ep.rtt_summary();
    assert_eq!(dev, r, "seed {seed}: one QP, so the same distribution");
    assert_eq!(sim.c.nodes[0].ep.stats().rto_fired, st.rtos, "seed {seed}");
}

#[test]
fn plb_moves_a_lossy_path_onto_a_spare_port_and_its_losses_end() {
    use braid::datapath::sim::LinkConfig;
    let seed = seed(43);
    // 8 paths on 16 source ports (the default: twice the paths); every link clean except
    // the one port 2 of node a sends on, which drops 20% of its packets.
    let mut sim = Sim::new(seed, &config(8, 10), LinkConfig::default());
    assert_eq!(sim.c.nodes[0].ep.config().ports, 16);
    let a = sim.c.nodes[0].addr;
    sim.c.net.link_mut(a, 2).loss = 0.2;
    write(&mut sim, 4 << 20);
    let st = sim.c.nodes[0]
        .ep
        .qp_stats(sim.a.qp.qpn)
        .expect("the QP exists");
    assert!(st.repaths > 0, "seed {seed}: no re-path: {st:?}");
    assert_ne!(
        st.path_ports[2], 2,
        "seed {seed}: logical path 2 still on port 2: {st:?}"
    );
    let mut ports = st.path_ports.clone();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(
        ports.len(),
        8,
        "seed {seed}: two paths share a port: {st:?}"
    );
    assert!(
        !st.path_ports.contains(&2),
        "seed {seed}: a path moved onto the lossy port"
    );
    // Once moved, nothing more is lost: a second transfer crosses only clean links.
    let lossy = |sim: &Sim| sim.c.net.stats().link(a, 2).map_or(0, |l| l.sent);
    let (sent_before, lost_before) = (lossy(&sim), st.paths.iter().map(|p| p.lost).sum::<u64>());
    write(&mut sim, 4 << 20);
    let st2 = sim.c.nodes[0]
        .ep
        .qp_stats(sim.a.qp.qpn)
        .expect("the QP exists");
    let lost_after = st2.paths.iter().map(|p| p.lost).sum::<u64>();
    assert_eq!(
        lossy(&sim),
        sent_before,
        "seed {seed}: port 2 still carries packets"
    );
    assert_eq!(
        sim.c.net.stats().lost,
        sim.c.net.stats().link(a, 2).map_or(0, |l| l.lost),
        "seed {seed}: only port 2 drops"
    );
    eprintln!(
        "seed {seed}: repaths {}, ports {:?}, lost {lost_before} in the first transfer, {} in the second",
        st2.repaths,
        st2.path_ports,
        lost_after - lost_before
    );
}

#[test]
fn without_spare_ports_a_lossy_path_stays_put() {
    use braid::datapath::sim::LinkConfig;
    let seed = seed(43);
    let mut cfg = config(8, 10);
    cfg.ports = 8;
    let mut sim = Sim::new(seed, &cfg, LinkConfig::default());
    let a = sim.c.nodes[0].addr;
    sim.c.net.link_mut(a, 2).loss = 0.2;
    write(&mut sim, 4 << 20);
    let st = sim.c.nodes[0]
        .ep
        .qp_stats(sim.a.qp.qpn)
        .expect("the QP exists");
    assert_eq!(st.repaths, 0, "seed {seed}: {st:?}");
    assert_eq!(st.path_ports, (0..8).collect::<Vec<u16>>());
}
