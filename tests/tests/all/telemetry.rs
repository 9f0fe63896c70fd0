//! Telemetry: the counters `qp_stats` and the endpoint expose after real transfers on the
//! simulated network (RTT percentiles, per-path counters, loss and spurious-loss counts).
use crate::support::{Sim, config, hostile_link, seed};

#[test]
fn qp_stats_report_rtt_percentiles_and_per_path_counters() {
    let seed = seed(41);
    let mut sim = Sim::new(seed, &config(8, 10), hostile_link(0.01));
    sim.write(4 << 20);
    let ep = &sim.c.ep_mut(0);
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
    assert_eq!(sim.c.ep(0).stats().rto_fired, st.rtos, "seed {seed}");
}

#[test]
fn plb_moves_a_lossy_path_onto_a_spare_port_and_its_losses_end() {
    use braid::datapath::sim::LinkConfig;
    let seed = seed(43);
    // 8 paths on 16 source ports (the default: twice the paths); every link clean except
    // the one port 2 of node a sends on, which drops 20% of its packets.
    let mut sim = Sim::new(seed, &config(8, 10), LinkConfig::default());
    assert_eq!(sim.c.ep(0).config().ports, 16);
    let a = sim.c.addr(0);
    sim.c.net.link_mut(a, 2).loss = 0.2;
    sim.write(4 << 20);
    let st = sim.c.ep(0).qp_stats(sim.a.qp.qpn).expect("the QP exists");
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
    sim.write(4 << 20);
    let st2 = sim.c.ep(0).qp_stats(sim.a.qp.qpn).expect("the QP exists");
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
    let a = sim.c.addr(0);
    sim.c.net.link_mut(a, 2).loss = 0.2;
    sim.write(4 << 20);
    let st = sim.c.ep(0).qp_stats(sim.a.qp.qpn).expect("the QP exists");
    assert_eq!(st.repaths, 0, "seed {seed}: {st:?}");
    assert_eq!(st.path_ports, (0..8).collect::<Vec<u16>>());
}

#[test]
fn reordering_beyond_the_window_shows_up_as_spurious_losses() {
    use braid::datapath::sim::LinkConfig;
    let seed = seed(47);
    let link = LinkConfig {
        delay_ns: 10_000,
        reorder: 0.05,
        reorder_extra_ns: 400_000,
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(seed, &config(8, 10), link);
    sim.write(4 << 20);
    let st = sim.c.ep(0).qp_stats(sim.a.qp.qpn).expect("the QP exists");
    assert_eq!(sim.c.net.stats().lost, 0);
    assert!(
        st.spurious_losses + st.spurious_retransmits > 0,
        "seed {seed}: no loss was real, yet none proved spurious: {st:?}"
    );
    eprintln!(
        "seed {seed}: retransmits {}, spurious losses {}, spurious retransmits {}, duplicates reported {}, cwnd {}",
        st.retransmits,
        st.spurious_losses,
        st.spurious_retransmits,
        st.duplicates_reported,
        st.cwnd_bytes
    );
}

/// What a probe controller heard: loss reports and spurious-loss proofs (send times, ns).
#[derive(Debug, Default)]
struct Heard {
    losses: Vec<u64>,
    spurious: Vec<u64>,
}

#[derive(Debug)]
struct Probe(std::sync::Arc<std::sync::Mutex<Heard>>);

impl braid::proto::cc::Controller for Probe {
    fn on_sent(&mut self, _: braid::proto::Timestamp, _: u32, _: u32) {}
    fn on_ack(
        &mut self,
        _: braid::proto::Timestamp,
        _: braid::proto::Timestamp,
        _: u32,
        _: Option<u64>,
    ) {
    }
    fn on_congestion_event(
        &mut self,
        _: braid::proto::Timestamp,
        sent_at: braid::proto::Timestamp,
        is_ecn: bool,
        _: u32,
    ) {
        if !is_ecn {
            self.0.lock().unwrap().losses.push(sent_at.as_nanos());
        }
    }
    fn on_spurious_loss(&mut self, _: braid::proto::Timestamp, sent_at: braid::proto::Timestamp) {
        self.0.lock().unwrap().spurious.push(sent_at.as_nanos());
    }
    fn window(&self) -> u64 {
        256 * 1472
    }
}

#[derive(Debug, Default)]
struct ProbeFactory(std::sync::Arc<std::sync::Mutex<Heard>>);

impl braid::proto::cc::ControllerFactory for ProbeFactory {
    fn build(&self, _mtu: u32) -> Box<dyn braid::proto::cc::Controller> {
        Box::new(Probe(self.0.clone()))
    }
}

#[test]
fn spurious_loss_proofs_name_losses_the_controller_heard_of_at_most_once_each() {
    use braid::datapath::sim::LinkConfig;
    let seed = seed(47);
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Heard::default()));
    let mut cfg = config(8, 10);
    cfg.cc = std::sync::Arc::new(ProbeFactory(heard.clone()));
    let link = LinkConfig {
        delay_ns: 10_000,
        reorder: 0.05,
        reorder_extra_ns: 400_000,
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(seed, &cfg, link);
    sim.write(4 << 20);
    assert_eq!(sim.c.net.stats().lost, 0);
    let h = heard.lock().unwrap();
    assert!(
        !h.spurious.is_empty(),
        "seed {seed}: no proof: {} losses",
        h.losses.len()
    );
    let mut left = h.losses.clone();
    for s in &h.spurious {
        let i = left
            .iter()
            .position(|l| l == s)
            .unwrap_or_else(|| panic!("seed {seed}: proof for {s}, never reported or twice"));
        left.swap_remove(i);
    }
    eprintln!(
        "seed {seed}: {} losses reported, {} proven spurious",
        h.losses.len(),
        h.spurious.len()
    );
}

/// Virtual time a 4 MiB WRITE takes on 8 paths where 5% of packets are held back 2 ms (no
/// loss at all), with Swift's spurious-loss undo on or off. 2 ms is beyond what the reordering
/// window reaches (its cap is the smoothed RTT plus four deviations, at least the 500 us RTO
/// floor), so late packets keep being declared lost and the undo has decreases to give back.
/// (At 400 us, as when this was written, the window has covered the delay since it may grow
/// to its cap: 33-48 retransmits a seed instead of 127-145, and the same time with or without
/// undo, 22.3 ms for the four seeds, where it was 21.2 ms with undo and 38.1 without.)
fn reordered_write_ns(seed: u64, undo: bool) -> (u64, u64) {
    use braid::datapath::sim::LinkConfig;
    use braid::proto::cc::SwiftConfig;
    let mut cfg = config(8, 10);
    cfg.cc = std::sync::Arc::new(SwiftConfig {
        undo_spurious_losses: undo,
        ..SwiftConfig::software_host()
    });
    let link = LinkConfig {
        delay_ns: 10_000,
        reorder: 0.1,
        reorder_extra_ns: 2_000_000,
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(seed, &cfg, link);
    sim.write(4 << 20);
    let st = sim.c.ep(0).qp_stats(sim.a.qp.qpn).expect("the QP exists");
    (sim.c.now.as_nanos(), st.retransmits)
}

#[test]
fn undoing_spurious_loss_decreases_speeds_up_a_reordered_transfer() {
    let (mut on, mut off) = (0, 0);
    for s in 0..4 {
        let seed = seed(50 + s);
        let (a, ra) = reordered_write_ns(seed, true);
        let (b, rb) = reordered_write_ns(seed, false);
        eprintln!("seed {seed}: undo on {a} ns ({ra} retransmits), off {b} ns ({rb} retransmits)");
        on += a;
        off += b;
    }
    eprintln!(
        "total: undo on {on} ns, off {off} ns, ratio {:.3}",
        on as f64 / off as f64
    );
    // A decrease for a packet that was only late is given back. Measured at 0.64 (158 against
    // 246 ms over the four seeds, every seed faster) with 10% of the packets 2 ms late. At 5%
    // the gap closed to 0.96 once the controller began seeing the round trip's median delay
    // (the late packets no longer cut the window by delay, so fewer decreases are left to
    // undo); below that nothing is left to undo.
    assert!(on < off - off / 20, "undo on {on} ns, off {off} ns");
}
