//! `fabric-trace`: why the last flows of a fabric run finish last.
//!
//! Runs one `braid-fabric` scenario (the 64-host leaf-spine, permutation, spray-cc by
//! default) in steps of `--step-us` of virtual time and prints, per step, every flow's
//! congestion window and send rate and every leaf's uplink and downlink load and queue, then
//! the flows in completion order with the leaves they cross and how loaded those were.
//!
//! ```text
//! cargo run --release -p braid-bench --example fabric-trace -- --seed 1 --step-us 100
//! ```
use braid::datapath::fabric::LeafSpine;
use braid::proto::Timestamp;
use braid_bench::fabric::{Mode, Scenario, Sim, Workload};
use clap::Parser;

#[derive(Parser, Debug)]
struct Cli {
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value = "spray-cc")]
    mode: String,
    #[arg(long, default_value_t = 256)]
    paths: u16,
    #[arg(long, default_value_t = 100)]
    step_us: u64,
    /// Propagation delay per link, ns.
    #[arg(long, default_value_t = 1_000)]
    prop_delay_ns: u64,
    /// Print the per-step table for each flow (else only the per-leaf one and the summary).
    #[arg(long)]
    per_flow: bool,
    /// Print steps from this time on only, µs.
    #[arg(long, default_value_t = 0)]
    from_us: u64,
    /// Burst spraying.
    #[arg(long, default_value_t = 1)]
    burst: u16,
    /// Bytes per host.
    #[arg(long, default_value_t = 32 << 20)]
    bytes: u64,
    /// In-band hop telemetry (switches stamp, Swift reacts to the bottleneck hop): `true`
    /// (the harness's default) or `false`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    hop_telemetry: bool,
    /// Override Swift's multiplicative decrease gain.
    #[arg(long)]
    swift_beta: Option<f64>,
    /// Swift's rate-fair increase: largest factor on the additive increase (0: off).
    #[arg(long)]
    swift_rtt_fair: Option<f64>,
    /// Exponent of the rate-fair increase.
    #[arg(long)]
    swift_rtt_fair_exp: Option<f64>,
    /// Swift's window validation: the window grows only while at most this many times the
    /// most bytes in flight of the last one to two round trips (0: off).
    #[arg(long)]
    swift_validate_cwnd: Option<f64>,
    /// Swift's delay-gated start (`true` or `false`; default as `braid-fabric`, on).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    swift_fast_start: Option<bool>,
    /// The delay-gated start once per connection, from its second round trip (`true` or
    /// `false`; default as `braid-fabric`, on).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    swift_fast_start_once_after_first_round: Option<bool>,
}

fn main() {
    let cli = Cli::parse();
    let ls = LeafSpine {
        prop_delay_ns: cli.prop_delay_ns,
        queue_bytes: 512 << 10,
        ecn_threshold_bytes: Some(100_000),
        ..LeafSpine::default()
    };
    let mut mode = Mode::by_name(&cli.mode, cli.paths, 64).expect("known mode");
    if let braid_bench::fabric::Cc::Swift(sw) = &mut mode.cc {
        sw.hop_telemetry = cli.hop_telemetry;
        if let Some(k) = cli.swift_rtt_fair {
            sw.rtt_fair_max = k;
        }
        if let Some(e) = cli.swift_rtt_fair_exp {
            sw.rtt_fair_exp = e;
        }
        if let Some(b) = cli.swift_beta {
            sw.beta = b;
        }
        if let Some(k) = cli.swift_validate_cwnd {
            sw.validate_cwnd = k;
        }
        if let Some(f) = cli.swift_fast_start {
            sw.fast_start = f;
        }
        if let Some(f) = cli.swift_fast_start_once_after_first_round {
            sw.fast_start_once_after_first_round = f;
        }
    }
    let w = Workload::Permutation {
        bytes_per_host: cli.bytes,
        msg_bytes: 1 << 20,
        outstanding: 2,
    };
    let mut s = Scenario::new(ls.clone(), w, mode, cli.seed);
    s.engine.burst = cli.burst;
    s.engine.hop_telemetry = cli.hop_telemetry;
    s.series_interval_ns = cli.step_us * 1000;
    let mut sim = Sim::new(&s);
    let flows = sim.flows();
    let spines = ls.spines;
    let up = sim.fabric().tier_ports(0, 1);
    let down = sim.fabric().tier_ports(1, 0);
    let leaf = |h: usize| ls.leaf_of(h);
    // Flows leaving / entering each leaf across the spines.
    let mut out_n = vec![0usize; ls.leaves];
    let mut in_n = vec![0usize; ls.leaves];
    for f in &flows {
        if leaf(f.from) != leaf(f.to) {
            out_n[leaf(f.from)] += 1;
            in_n[leaf(f.to)] += 1;
        }
    }
    println!("leaf: flows out / in across the spines");
    for l in 0..ls.leaves {
        println!("  leaf {l}: {} / {}", out_n[l], in_n[l]);
    }
    let mut sent = vec![0u64; flows.len()];
    let mut step = 0u64;
    let step_ns = cli.step_us * 1000;
    loop {
        step += 1;
        let done = sim.run_until(Timestamp::from_nanos(step * step_ns));
        let t_us = step * cli.step_us;
        let d = sim.driver();
        let mut line = format!("t {t_us:>5} us |");
        let mut rates = Vec::new();
        for (i, f) in flows.iter().enumerate() {
            let Some(st) = d.ep(f.from).qp_stats(f.qp_from) else {
                continue;
            };
            let n = st.packets_sent + st.retransmits;
            let gbps = (n - sent[i]) as f64 * 4162.0 * 8.0 / step_ns as f64;
            sent[i] = n;
            rates.push(gbps);
            if cli.per_flow && gbps > 0.0 {
                line.push_str(&format!(
                    " {}->{}:{:.0}p/{:.0}i/{:.0}G/{:.0}us",
                    f.from,
                    f.to,
                    st.cwnd_bytes as f64 / 4096.0,
                    st.in_flight_bytes as f64 / 4096.0,
                    gbps,
                    st.srtt_ns as f64 / 1000.0
                ));
            }
        }
        let active: Vec<f64> = rates.iter().copied().filter(|r| *r > 0.5).collect();
        let mean = active.iter().sum::<f64>() / active.len().max(1) as f64;
        let min = active.iter().copied().fold(f64::INFINITY, f64::min);
        line.push_str(&format!(
            " active {:>2} rate mean {mean:>5.1} min {min:>5.1} |",
            active.len()
        ));
        if let Some(series) = sim.fabric().series() {
            let b = (step - 1) as usize;
            for l in 0..ls.leaves {
                let (mut ub, mut uq, mut db, mut dq) = (0u64, 0u32, 0u64, 0u32);
                for s in 0..spines {
                    if let Some(x) = series.port(up[l * spines + s]).get(b) {
                        ub += x.bytes;
                        uq = uq.max(x.max_queue_bytes);
                    }
                    if let Some(x) = series.port(down[l * spines + s]).get(b) {
                        db += x.bytes;
                        dq = dq.max(x.max_queue_bytes);
                    }
                }
                let cap = spines as f64 * 100.0;
                line.push_str(&format!(
                    " L{l} up {:>3.0}% q{:>3}K dn {:>3.0}% q{:>3}K",
                    ub as f64 * 8.0 / step_ns as f64 / cap * 100.0,
                    uq / 1000,
                    db as f64 * 8.0 / step_ns as f64 / cap * 100.0,
                    dq / 1000
                ));
            }
        }
        if t_us >= cli.from_us {
            println!("{line}");
        }
        if done || step * step_ns > 20_000_000 {
            break;
        }
    }
    let flows = sim.flows();
    let mut order: Vec<usize> = (0..flows.len()).collect();
    order.sort_by_key(|&i| flows[i].finish_ns);
    let r = sim.report(0.0, 0.0);
    println!(
        "\neff {:.1}% flow {:.1}% ideal {:.1} us finish {:.1} us",
        r.effective_bw * 100.0,
        r.flow_effective_bw * 100.0,
        r.ideal_ns as f64 / 1000.0,
        r.finish_ns as f64 / 1000.0
    );
    println!(
        "flows by completion: finish_us from->to (leaf->leaf, flows out of src leaf / into dst leaf) repaths retx rtos ce srtt_us min_rtt_us"
    );
    for i in order {
        let f = flows[i];
        let st = sim.driver().ep(f.from).qp_stats(f.qp_from).expect("qp");
        println!(
            "  {:>7.1} {:>2}->{:>2} (L{}->L{}, {}/{}) repaths {:>4} retx {:>4} rtos {} ce {:>5} srtt {:>5.1} minrtt {:>5.1} eff {:.1}%",
            f.finish_ns as f64 / 1000.0,
            f.from,
            f.to,
            leaf(f.from),
            leaf(f.to),
            out_n[leaf(f.from)],
            in_n[leaf(f.to)],
            st.repaths,
            st.retransmits,
            st.rtos,
            st.ce_marks,
            st.srtt_ns as f64 / 1000.0,
            st.min_rtt_ns as f64 / 1000.0,
            r.ideal_ns as f64 / f.finish_ns as f64 * 100.0,
        );
    }
}
