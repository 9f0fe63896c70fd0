//! Real engines on the larger fabric shapes (`braid::testing::sim::topo`): a small
//! rail-optimized leaf-spine and a small three-tier Clos (snapshot tables, spraying beats a
//! single ECMP path, a run replays from its seed), the mixed-tenant isolation case on a small
//! leaf-spine, and an all-reduce spanning the two sites of a small scale-across fabric.
//! Replay a scenario with `BRAID_SEED=<seed>`.
use braid::datapath::fabric::{LeafSpine, RailOptimized, ScaleAcross, ThreeTier};
use braid::testing::sim::fabric::{Mode, Report, Scenario, Topo, Workload, run};

use crate::support::seed;

/// 16 NICs: 2 scalable units of 4 servers with 2 rails (4 rail leaves), 4 spines.
fn rail16() -> Topo {
    Topo::Rail(RailOptimized {
        servers_per_su: 4,
        sus: 2,
        rails: 2,
        spines: 4,
        ..RailOptimized::default()
    })
}

/// 16 hosts: 2 pods of 2 leaves of 4 hosts, 2 spines per pod, 4 super-spines, full
/// bisection at both tiers.
fn three_tier16() -> Topo {
    Topo::ThreeTier(ThreeTier {
        hosts_per_leaf: 4,
        leaves_per_pod: 2,
        spines_per_pod: 2,
        pods: 2,
        super_spines: 4,
        ..ThreeTier::default()
    })
}

/// 16 hosts: two sites of 2 leaves of 4 hosts with 2 spines, joined by 2 long links of
/// 100 Gbit/s, `km` apart.
fn two_sites(km: f64) -> Topo {
    Topo::ScaleAcross(ScaleAcross {
        site: LeafSpine {
            hosts_per_leaf: 4,
            leaves: 2,
            spines: 2,
            ..LeafSpine::default()
        },
        long_links: 2,
        distance_km: km,
        ..ScaleAcross::default()
    })
}

fn row(r: &Report) -> String {
    format!(
        "{:<14} {:<8} eff {:>5.1}% flow {:>5.1}% finish {:>7.1}us ideal {:>7.1}us mct p50 {:>6.1}us p99 {:>6.1}us retx {:>4} rto {:>2} drops {:>4} marks {:>5} maxq {:>3}KB up {:.2} dgrams {:>6} {}",
        r.workload,
        r.mode,
        r.effective_bw * 100.0,
        r.flow_effective_bw * 100.0,
        r.finish_ns as f64 / 1000.0,
        r.ideal_ns as f64 / 1000.0,
        r.mct_p50_ns as f64 / 1000.0,
        r.mct_p99_ns as f64 / 1000.0,
        r.retransmits,
        r.rto_fired,
        r.drops,
        r.ecn_marks,
        r.max_queue_bytes / 1000,
        r.uplink_imbalance,
        r.datagrams,
        if r.finished { "done" } else { "UNFINISHED" },
    )
}

fn permutation() -> Workload {
    Workload::Permutation {
        bytes_per_host: 1 << 20,
        msg_bytes: 256 << 10,
        outstanding: 2,
    }
}

fn collectives() -> [Workload; 3] {
    [
        permutation(),
        Workload::RingAllReduce {
            vector_bytes: 2 << 20,
            slices: 2,
        },
        Workload::TreeAllReduce {
            vector_bytes: 2 << 20,
            slices: 4,
        },
    ]
}

fn table(topo: &Topo, s: u64) -> (String, Vec<Report>) {
    let mut out = String::new();
    let mut reports = Vec::new();
    for w in collectives() {
        for mode in [Mode::ecmp(), Mode::spray_cc(64)] {
            let r = run(&Scenario::on(topo.clone(), w.clone(), mode, s));
            assert!(r.finished, "seed {s}: {}: {}", topo.name(), row(&r));
            out.push_str(&format!("{:<12} {}\n", topo.name(), row(&r)));
            reports.push(r);
        }
    }
    (out, reports)
}

#[test]
fn rail_and_three_tier_snapshot() {
    let s = seed(1);
    let (rail, _) = table(&rail16(), s);
    let (three, _) = table(&three_tier16(), s);
    eprintln!("{rail}{three}");
    if s == 1 {
        insta::assert_snapshot!(format!("{rail}{three}"));
    }
}

#[test]
fn spraying_beats_a_single_ecmp_path_on_rail_and_three_tier_fabrics() {
    let s = seed(5);
    for topo in [rail16(), three_tier16()] {
        let ecmp = run(&Scenario::on(topo.clone(), permutation(), Mode::ecmp(), s));
        let spray = run(&Scenario::on(
            topo.clone(),
            permutation(),
            Mode::spray_cc(64),
            s,
        ));
        eprintln!("{}\n{}\n{}", topo.name(), row(&ecmp), row(&spray));
        assert!(ecmp.finished && spray.finished, "seed {s}");
        assert!(
            spray.effective_bw > ecmp.effective_bw,
            "seed {s}: {}\n{}\n{}",
            topo.name(),
            row(&ecmp),
            row(&spray)
        );
        assert!(
            spray.uplink_imbalance < ecmp.uplink_imbalance,
            "seed {s}: {}",
            topo.name()
        );
    }
}

#[test]
fn a_run_on_each_shape_replays_from_its_seed() {
    let s = seed(7);
    for topo in [rail16(), three_tier16(), two_sites(10.0)] {
        let w = Workload::TreeAllReduce {
            vector_bytes: 1 << 20,
            slices: 4,
        };
        let sc = Scenario::on(topo.clone(), w, Mode::spray_cc(64), s);
        let (once, twice) = (run(&sc), run(&sc));
        assert!(once.finished, "seed {s}: {}", topo.name());
        assert_eq!(row(&once), row(&twice), "seed {s}: {}", topo.name());
        assert_eq!(once.plots, twice.plots, "seed {s}: {}", topo.name());
    }
}

#[test]
fn the_latency_job_beside_a_background_all_to_all() {
    let s = seed(1);
    let ls = LeafSpine {
        hosts_per_leaf: 4,
        leaves: 4,
        spines: 4,
        ..LeafSpine::default()
    };
    let w = |background| Workload::MixedTenant {
        background,
        bg_bytes_per_pair: 256 << 10,
        bg_msg_bytes: 64 << 10,
        lat_msg_bytes: 4 << 10,
        lat_msgs: 20,
    };
    for mode in [Mode::ecmp(), Mode::spray_cc(64)] {
        let alone = run(&Scenario::new(ls.clone(), w(false), mode.clone(), s));
        let mixed = run(&Scenario::new(ls.clone(), w(true), mode.clone(), s));
        eprintln!(
            "{}\n{:?}\n{}\n{:?}",
            row(&alone),
            alone.jobs,
            row(&mixed),
            mixed.jobs
        );
        assert!(alone.finished && mixed.finished, "seed {s}: {}", mode.name);
        // Alone: the latency job only (4 hosts x 20 messages). Beside it: the 12 other
        // hosts' all-to-all, 12 x 11 pairs of 4 messages.
        let names = |r: &Report| r.jobs.iter().map(|j| j.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&alone), ["latency"], "seed {s}");
        assert_eq!(names(&mixed), ["background", "latency"], "seed {s}");
        let (lat_alone, bg, lat) = (&alone.jobs[0], &mixed.jobs[0], &mixed.jobs[1]);
        assert_eq!(
            (lat_alone.messages, lat.messages, bg.messages),
            (80, 80, 528)
        );
        // The background job loads the spines the latency job crosses: its messages queue
        // behind it, but (delay-based congestion control keeping queues short) by less than
        // their unloaded time again; and the latency job is done before the background.
        assert!(
            lat.mct_p99_ns > lat_alone.mct_p99_ns,
            "seed {s}: {lat:?} {lat_alone:?}"
        );
        assert!(
            lat.mct_p99_ns < 2 * lat_alone.mct_p99_ns,
            "seed {s}: {}: {lat:?} vs alone {lat_alone:?}",
            mode.name
        );
        assert!(lat.finish_ns < bg.finish_ns, "seed {s}");
    }
}

#[test]
fn an_all_reduce_spans_two_sites() {
    let s = seed(1);
    let w = Workload::RingAllReduce {
        vector_bytes: 1 << 20,
        slices: 4,
    };
    let mut reports = Vec::new();
    for km in [0.0, 10.0] {
        let sc = Scenario::on(two_sites(km), w.clone(), Mode::spray_cc(64), s);
        let r = run(&sc);
        eprintln!("{km} km: {}", row(&r));
        assert!(r.finished, "seed {s}: {km} km: {}", row(&r));
        // 16 hosts, one ring: 2 (16 - 1) steps of 4 slices on each of 16 links.
        assert_eq!(r.messages, 16 * 30 * 4, "seed {s}");
        assert_eq!(row(&r), row(&run(&sc)), "seed {s}: {km} km");
        reports.push(r);
    }
    let (near, far) = (&reports[0], &reports[1]);
    // The bytes are the same, so is the bound; but the ring's 30 steps are latency-bound:
    // at least every other one waits for a slice that crossed 10 km (50 µs) of fibre.
    assert_eq!(near.ideal_ns, far.ideal_ns, "seed {s}");
    assert!(
        far.finish_ns > near.finish_ns + 15 * 50_000,
        "seed {s}:\n{}\n{}",
        row(near),
        row(far)
    );
}
