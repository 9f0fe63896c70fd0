//! `braid-fabric`: the fabric-scale simulation report.
//!
//! Runs real Braid engines on a simulated leaf-spine fabric (see `braid_bench::fabric`) for
//! each workload and mode asked for, prints a markdown table (effective bandwidth, message
//! completion times, retransmits, drops, ECN marks, switch queue occupancy, uplink balance)
//! and the simulator's speed, and writes `README.md`, `report.json` and SVG plots (delivered
//! throughput over time, per-uplink load, switch queue over time) into `--out`.
//!
//! ```text
//! cargo run --release -p braid-bench --bin braid-fabric -- --workload all
//! cargo run --release -p braid-bench --bin braid-fabric -- --workload incast --senders 32 --trim
//! ```
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use braid::datapath::fabric::{LeafSpine, RailOptimized, ScaleAcross, SwitchPorts, ThreeTier};
use braid_bench::fabric::{
    self, EngineKnobs, JobStats, LinkChange, Mode, Report, Scenario, Topo, Workload,
};
use clap::Parser;
use plotters::prelude::*;

#[derive(Parser, Debug)]
#[command(
    name = "braid-fabric",
    version,
    about = "Braid on a simulated leaf-spine fabric: ECMP vs spraying vs spraying with congestion control"
)]
struct Cli {
    /// Fabric: leaf-spine; rail (rail-optimized: --servers-per-su, --sus, --rails, --spines);
    /// three-tier (--hosts-per-leaf, --leaves and --spines per pod, --pods, --super-spines,
    /// --oversubscription at the leaves, --spine-oversubscription); scale-across (two
    /// leaf-spine sites of --hosts-per-leaf, --leaves, --spines joined by --long-links).
    #[arg(long, default_value = "leaf-spine")]
    topology: String,
    /// Rail-optimized: servers per scalable unit.
    #[arg(long, default_value_t = 4)]
    servers_per_su: usize,
    /// Rail-optimized: scalable units.
    #[arg(long, default_value_t = 2)]
    sus: usize,
    /// Rail-optimized: NICs (rails) per server; each NIC is one endpoint.
    #[arg(long, default_value_t = 8)]
    rails: usize,
    /// Three-tier: pods.
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// Three-tier: super-spines.
    #[arg(long, default_value_t = 4)]
    super_spines: usize,
    /// Three-tier: a pod's leaf-facing over super-spine-facing capacity.
    #[arg(long, default_value_t = 1.0)]
    spine_oversubscription: f64,
    /// Scale-across: links between the two sites.
    #[arg(long, default_value_t = 4)]
    long_links: usize,
    /// Scale-across: rate of each long link, Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    long_gbps: f64,
    /// Scale-across: distance between the sites, km of fibre (5 µs per km).
    #[arg(long, default_value_t = 10.0)]
    distance_km: f64,
    /// Scale-across: output queue of the long links, KiB.
    #[arg(long, default_value_t = 4096)]
    long_queue_kib: usize,
    /// Mixed tenant: message size of the latency job.
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    lat_msg: u64,
    /// Mixed tenant: messages each latency host sends, one at a time.
    #[arg(long, default_value_t = 50)]
    lat_msgs: u32,
    /// Hosts under each leaf switch.
    #[arg(long, default_value_t = 8)]
    hosts_per_leaf: usize,
    /// Leaf switches.
    #[arg(long, default_value_t = 8)]
    leaves: usize,
    /// Spine switches.
    #[arg(long, default_value_t = 8)]
    spines: usize,
    /// Leaf-spine link rate, Gbit/s.
    #[arg(long, default_value_t = 100.0)]
    gbps: f64,
    /// Host link rate, Gbit/s (default: --gbps).
    #[arg(long)]
    host_gbps: Option<f64>,
    /// Oversubscription (host-facing over spine-facing capacity); sets the leaf-spine rate.
    #[arg(long)]
    oversubscription: Option<f64>,
    /// Propagation delay per link, ns.
    #[arg(long, default_value_t = 1_000)]
    prop_delay_ns: u64,
    /// Output queue limit per switch port, KiB.
    #[arg(long, default_value_t = 512)]
    queue_kib: usize,
    /// ECN marking threshold, KB (0: no marking).
    #[arg(long, default_value_t = 100)]
    ecn_kb: usize,
    /// Trim packets at full queues instead of dropping them.
    #[arg(long)]
    trim: bool,
    /// Workload: permutation, incast, all-to-all, ring-allreduce, or all.
    #[arg(long, default_value = "permutation")]
    workload: String,
    /// Bytes per host (permutation), per sender (incast), per pair (all-to-all) or of the
    /// vector (ring all-reduce); suffixes K, M, G are powers of 1024. Default per workload.
    #[arg(long, value_parser = parse_size)]
    bytes: Option<u64>,
    /// Message size of the streaming workloads (default per workload).
    #[arg(long, value_parser = parse_size)]
    msg: Option<u64>,
    /// Messages kept posted per flow.
    #[arg(long, default_value_t = 2)]
    outstanding: u32,
    /// Slices per ring all-reduce step (pipelined WRITEs).
    #[arg(long, default_value_t = 4)]
    slices: u32,
    /// Incast senders (default: half the hosts).
    #[arg(long)]
    senders: Option<usize>,
    /// Modes, comma-separated: ecmp (a), spray (b), spray-cc (c), ecmp-fixed, ecmp-dcqcn,
    /// spray-host (spraying with the runtime's default Swift, as braid-perf runs).
    #[arg(long, default_value = "ecmp,spray,spray-cc")]
    modes: String,
    /// Paths per connection when spraying (at most 256, the engine's limit).
    #[arg(long, default_value_t = 256)]
    paths: u16,
    /// Source ports per host in the spraying modes, at least --paths (0: twice the paths, at
    /// most 256); spare ports are where PLB moves a congested path. The single-path modes
    /// always use one.
    #[arg(long, default_value_t = 0)]
    ports: u16,
    /// Window of the fixed-window modes, packets.
    #[arg(long, default_value_t = 64)]
    fixed_window: u32,
    /// Largest datagram (UDP payload), bytes.
    #[arg(long, default_value_t = 4096)]
    max_datagram: usize,
    /// Retransmit timeout floor, µs.
    #[arg(long, default_value_t = 100)]
    rto_min_us: u64,
    /// How often a host picks up received datagrams, ns (0: each at once, one ACK per
    /// datagram).
    #[arg(long, default_value_t = 0)]
    rx_batch_ns: u64,
    /// Burst spraying: consecutive new packets a connection sends on one path before it
    /// draws the next (1: a path per packet).
    #[arg(long, default_value_t = 1)]
    burst: u16,
    /// Override Swift's base target delay (above the minimum), µs.
    #[arg(long)]
    swift_target_us: Option<u64>,
    /// Override Swift's initial window, packets.
    #[arg(long)]
    swift_init_cwnd: Option<f64>,
    /// Override Swift's largest window, packets.
    #[arg(long)]
    swift_max_cwnd: Option<f64>,
    /// Override Swift's additive increase, packets per round trip.
    #[arg(long)]
    swift_ai: Option<f64>,
    /// Override Swift's largest multiplicative decrease (0..1).
    #[arg(long)]
    swift_max_mdf: Option<f64>,
    /// Override Swift's flow-scaling range, µs.
    #[arg(long)]
    swift_fs_us: Option<u64>,
    /// Override Swift's distance scaling of the target (headroom per unit of base delay; 0
    /// turns it off).
    #[arg(long)]
    swift_base_delay_scale: Option<f64>,
    /// Override Swift's distance scaling of the additive increase: the base delay, µs,
    /// above which the increase is per that much time instead of per round trip (0: off).
    #[arg(long)]
    swift_ai_ref_us: Option<u64>,
    /// In-band hop telemetry: the switches stamp the largest queueing delay of one hop into
    /// each data packet, the ACK echoes it, and Swift reacts to that hop's queue instead of
    /// the round trip's sum of queues (`true` or `false`; on by default, and the default
    /// Swift of the modes is tuned with it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    hop_telemetry: bool,
    /// Override Swift's rate-fair increase: the largest factor on the additive increase from
    /// the smoothed round trip over the minimum delay (0: off).
    #[arg(long)]
    swift_rtt_fair: Option<f64>,
    /// With hop telemetry, Swift reacts to the bottleneck hop's standing queue (the lowest
    /// telemetry of the last one to two round trips) rather than the latest sample.
    #[arg(long)]
    swift_hop_standing: bool,
    /// Swift's delay-gated start: until the first decrease, an ACK whose delay is below half
    /// the target's headroom doubles the window per round trip instead of adding one packet
    /// (`true` or `false`; the ecmp and spray-cc modes' default is on, `fabric_swift`)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    swift_fast_start: Option<bool>,
    /// The delay-gated start once per connection, from its second round trip: only ACKs for
    /// packets sent at least one minimum delay after the connection's first may grow the
    /// window by it, and an idle restart does not start it again
    /// (`true` or `false`; the ecmp and spray-cc modes' default is on, `fabric_swift`)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    swift_fast_start_once_after_first_round: Option<bool>,
    /// Override Swift's multiplicative decrease gain on the relative excess delay.
    #[arg(long)]
    swift_beta: Option<f64>,
    /// Override the exponent of Swift's rate-fair increase (1: equal windows, 2: equal rates).
    #[arg(long)]
    swift_rtt_fair_exp: Option<f64>,
    /// Override Swift's window validation: the window grows only while it is at most this
    /// many times the most bytes in flight of the last one to two round trips, plus a packet
    /// (0: off; the ecmp and spray-cc modes' default is 1.05, `fabric_swift`).
    #[arg(long)]
    swift_validate_cwnd: Option<f64>,
    /// Override the path weights' ECN penalty (`PathConfig::k_ecn`, default 50; 0 ignores
    /// ECN marks in the spraying weights).
    #[arg(long)]
    path_k_ecn: Option<u32>,
    /// Override the path weights' ECN tolerance, percent of the packets
    /// (`PathConfig::ecn_tolerance`; the harness's default is 10, the engine's 0): marks
    /// this far above the connection's median are ignored.
    #[arg(long)]
    path_ecn_tolerance_pct: Option<u32>,
    /// Override the path weights' balance gain, thousandths (`PathConfig::balance_gain`; the
    /// engine's default is 50, i.e. 0.05 per delay sample, the harness's 500).
    #[arg(long)]
    path_balance_gain_milli: Option<u32>,
    /// Two regions of its own per host instead of one backing for all (the harness's old
    /// layout, for speed comparisons; the packets are the same).
    #[arg(long)]
    region_per_host: bool,
    /// Degrades the link from one spine down to leaf 0 (towards host 0, the incast receiver):
    /// `SPINE:KEY=VALUE[,KEY=VALUE...]` with keys
    /// `gbps` (rate), `queue-kb` (output queue, KB), `loss` (drop probability) and `ce`
    /// (probability an ECN-capable packet is marked). Repeatable. The namespace testbed's
    /// twin: `--downlink 0:gbps=0.01,queue-kb=12.5 --downlink 1:loss=0.01 --downlink 2:ce=0.4`.
    #[arg(long, value_parser = parse_downlink)]
    downlink: Vec<LinkChange>,
    /// Seed of everything.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Time series bucket, µs.
    #[arg(long, default_value_t = 10)]
    bucket_us: u64,
    /// Where to write README.md, report.json and the SVG plots.
    #[arg(long, default_value = "bench/results/fabric")]
    out: PathBuf,
    /// Print the table only; write nothing.
    #[arg(long)]
    no_write: bool,
    /// Also measure the fabric model alone (no engines), packets per wall second.
    #[arg(long)]
    speed: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mult)
        .map_err(|e| format!("bad size {s:?}: {e}"))
}

impl Cli {
    fn fabric(&self) -> LeafSpine {
        LeafSpine {
            hosts_per_leaf: self.hosts_per_leaf,
            leaves: self.leaves,
            spines: self.spines,
            link_gbps: self.gbps,
            host_link_gbps: self.host_gbps.unwrap_or(self.gbps),
            oversubscription: self.oversubscription,
            prop_delay_ns: self.prop_delay_ns,
            queue_bytes: self.queue_kib << 10,
            ecn_threshold_bytes: (self.ecn_kb > 0).then_some(self.ecn_kb * 1000),
            trim: self.trim,
            ..LeafSpine::default()
        }
    }

    fn topo(&self) -> Result<Option<Topo>, String> {
        let ls = self.fabric();
        let ports = SwitchPorts {
            prop_delay_ns: ls.prop_delay_ns,
            queue_bytes: ls.queue_bytes,
            ecn_threshold_bytes: ls.ecn_threshold_bytes,
            trim: ls.trim,
        };
        Ok(Some(match self.topology.as_str() {
            "leaf-spine" => return Ok(None),
            "rail" => Topo::Rail(RailOptimized {
                servers_per_su: self.servers_per_su,
                sus: self.sus,
                rails: self.rails,
                spines: self.spines,
                host_link_gbps: ls.host_link_gbps,
                oversubscription: self.oversubscription.unwrap_or(1.0),
                ports,
                ..RailOptimized::default()
            }),
            "three-tier" => Topo::ThreeTier(ThreeTier {
                hosts_per_leaf: self.hosts_per_leaf,
                leaves_per_pod: self.leaves,
                spines_per_pod: self.spines,
                pods: self.pods,
                super_spines: self.super_spines,
                host_link_gbps: ls.host_link_gbps,
                leaf_oversubscription: self.oversubscription.unwrap_or(1.0),
                spine_oversubscription: self.spine_oversubscription,
                ports,
                ..ThreeTier::default()
            }),
            "scale-across" => Topo::ScaleAcross(ScaleAcross {
                site: ls,
                long_links: self.long_links,
                long_link_gbps: self.long_gbps,
                distance_km: self.distance_km,
                long_queue_bytes: self.long_queue_kib << 10,
            }),
            t => return Err(format!("unknown topology {t:?}")),
        }))
    }

    /// One line saying what the fabric is.
    fn describe(&self, ls: &LeafSpine, topo: Option<&Topo>) -> String {
        let queues = format!(
            "{} ns per link, {} KiB queues, ECN above {}, trimming {}",
            ls.prop_delay_ns,
            ls.queue_bytes >> 10,
            ls.ecn_threshold_bytes
                .map_or("never".to_string(), |k| format!("{} KB", k / 1000)),
            if ls.trim { "on" } else { "off" },
        );
        match topo {
            None => format!(
                "leaf-spine: {} hosts = {} leaves x {} hosts, {} spines; host links {} Gbit/s, leaf-spine {:.1} Gbit/s (oversubscription {:.2}); {queues}",
                ls.hosts(),
                ls.leaves,
                ls.hosts_per_leaf,
                ls.spines,
                ls.host_link_gbps,
                ls.spine_link_bps() as f64 / 1e9,
                ls.oversubscription_ratio(),
            ),
            Some(Topo::Rail(r)) => format!(
                "rail-optimized: {} NICs (endpoints) = {} servers x {} rails, in {} scalable units of {} servers; {} rail leaves, {} spines; NIC links {} Gbit/s, leaf-spine {:.1} Gbit/s (oversubscription {:.2}); {queues}",
                r.hosts(),
                r.servers(),
                r.rails,
                r.sus,
                r.servers_per_su,
                r.leaves(),
                r.spines,
                r.host_link_gbps,
                r.spine_link_bps() as f64 / 1e9,
                r.oversubscription,
            ),
            Some(Topo::ThreeTier(t)) => format!(
                "three-tier: {} hosts = {} pods x {} leaves x {} hosts; {} spines per pod, {} super-spines; host links {} Gbit/s, leaf-spine {:.1} Gbit/s ({:.2}:1), spine-super-spine {:.1} Gbit/s ({:.2}:1); {queues}",
                t.hosts(),
                t.pods,
                t.leaves_per_pod,
                t.hosts_per_leaf,
                t.spines_per_pod,
                t.super_spines,
                t.host_link_gbps,
                t.leaf_link_bps() as f64 / 1e9,
                t.leaf_oversubscription,
                t.super_link_bps() as f64 / 1e9,
                t.spine_oversubscription,
            ),
            Some(Topo::ScaleAcross(x)) => format!(
                "scale-across: {} hosts in two sites of {} leaves x {} hosts with {} spines, joined by {} long links of {} Gbit/s, {} km ({} µs one way), {} KiB queues on the long links; host links {} Gbit/s, leaf-spine {:.1} Gbit/s; {queues}",
                x.hosts(),
                x.site.leaves,
                x.site.hosts_per_leaf,
                x.site.spines,
                x.long_links,
                x.long_link_gbps,
                x.distance_km,
                x.long_delay_ns() / 1000,
                x.long_queue_bytes >> 10,
                x.site.host_link_gbps,
                x.site.spine_link_bps() as f64 / 1e9,
            ),
        }
    }

    fn workloads(&self, name: &str, hosts: usize) -> Option<Vec<Workload>> {
        let mixed = |background| Workload::MixedTenant {
            background,
            bg_bytes_per_pair: self.bytes.unwrap_or(128 << 10),
            bg_msg_bytes: self.msg.unwrap_or(64 << 10).min(u64::from(u32::MAX)) as u32,
            lat_msg_bytes: self.lat_msg.min(u64::from(u32::MAX)) as u32,
            lat_msgs: self.lat_msgs,
        };
        Some(match name {
            "tree-allreduce" => vec![Workload::TreeAllReduce {
                vector_bytes: self.bytes.unwrap_or(8 << 20),
                slices: self.slices,
            }],
            "mixed-tenant" => vec![mixed(false), mixed(true)],
            _ => vec![self.workload(name, hosts)?],
        })
    }

    fn workload(&self, name: &str, hosts: usize) -> Option<Workload> {
        let msg = |d: u64| self.msg.unwrap_or(d).min(u64::from(u32::MAX)) as u32;
        Some(match name {
            "permutation" => Workload::Permutation {
                bytes_per_host: self.bytes.unwrap_or(32 << 20),
                msg_bytes: msg(1 << 20),
                outstanding: self.outstanding,
            },
            "incast" => Workload::Incast {
                senders: self.senders.unwrap_or(hosts / 2),
                bytes_per_sender: self.bytes.unwrap_or(1 << 20),
                msg_bytes: msg(256 << 10),
                outstanding: self.outstanding,
            },
            "all-to-all" => Workload::AllToAll {
                bytes_per_pair: self.bytes.unwrap_or(128 << 10),
                msg_bytes: msg(64 << 10),
                outstanding: self.outstanding,
            },
            "ring-allreduce" => Workload::RingAllReduce {
                vector_bytes: self.bytes.unwrap_or(8 << 20),
                slices: self.slices,
            },
            _ => return None,
        })
    }

    fn modes(&self) -> Result<Vec<Mode>, String> {
        self.modes
            .split(',')
            .map(|m| {
                let mut mode = Mode::by_name(m.trim(), self.paths, self.fixed_window)
                    .ok_or_else(|| format!("unknown mode {m:?}"))?;
                if mode.paths > 1 {
                    mode.ports = self.ports;
                }
                if let fabric::Cc::Swift(s) = &mut mode.cc {
                    if let Some(t) = self.swift_target_us {
                        s.base_target_ns = t * 1000;
                    }
                    if let Some(w) = self.swift_init_cwnd {
                        s.init_cwnd = w;
                    }
                    if let Some(w) = self.swift_max_cwnd {
                        s.max_cwnd = w;
                    }
                    if let Some(ai) = self.swift_ai {
                        s.ai = ai;
                    }
                    if let Some(m) = self.swift_max_mdf {
                        s.max_mdf = m;
                    }
                    if let Some(fs) = self.swift_fs_us {
                        s.fs_range_ns = fs * 1000;
                    }
                    if let Some(k) = self.swift_base_delay_scale {
                        s.base_delay_scale = k;
                    }
                    if let Some(r) = self.swift_ai_ref_us {
                        s.ai_ref_delay_ns = r * 1000;
                    }
                    s.hop_telemetry = self.hop_telemetry;
                    if let Some(k) = self.swift_rtt_fair {
                        s.rtt_fair_max = k;
                    }
                    s.hop_standing |= self.swift_hop_standing;
                    if let Some(f) = self.swift_fast_start {
                        s.fast_start = f;
                    }
                    if let Some(f) = self.swift_fast_start_once_after_first_round {
                        s.fast_start_once_after_first_round = f;
                    }
                    if let Some(e) = self.swift_rtt_fair_exp {
                        s.rtt_fair_exp = e;
                    }
                    if let Some(b) = self.swift_beta {
                        s.beta = b;
                    }
                    if let Some(k) = self.swift_validate_cwnd {
                        s.validate_cwnd = k;
                    }
                }
                Ok(mode)
            })
            .collect()
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ls = cli.fabric();
    let topo = match cli.topo() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("braid-fabric: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workloads: Vec<&str> = if cli.workload == "all" {
        vec![
            "permutation",
            "incast",
            "all-to-all",
            "ring-allreduce",
            "tree-allreduce",
            "mixed-tenant",
        ]
    } else {
        cli.workload.split(',').map(str::trim).collect()
    };
    let modes = match cli.modes() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("braid-fabric: {e}");
            return ExitCode::FAILURE;
        }
    };
    let engine = EngineKnobs {
        max_datagram: cli.max_datagram,
        rto_min_ns: cli.rto_min_us * 1000,
        rx_batch_ns: cli.rx_batch_ns,
        burst: cli.burst,
        hop_telemetry: cli.hop_telemetry,
        region_per_host: cli.region_per_host,
        path_k_ecn: cli.path_k_ecn,
        path_ecn_tolerance_pct: cli
            .path_ecn_tolerance_pct
            .or(EngineKnobs::default().path_ecn_tolerance_pct),
        path_balance_gain_milli: cli
            .path_balance_gain_milli
            .or(EngineKnobs::default().path_balance_gain_milli),
        ..EngineKnobs::default()
    };
    println!("fabric: {}", cli.describe(&ls, topo.as_ref()));
    let hosts = topo.as_ref().map_or(ls.hosts(), Topo::hosts);
    let mut reports: Vec<Report> = Vec::new();
    for w in &workloads {
        let Some(workload_set) = cli.workloads(w, hosts) else {
            eprintln!("braid-fabric: unknown workload {w:?}");
            return ExitCode::FAILURE;
        };
        for workload in workload_set {
            println!("\n{workload:?}\n\n{}", Report::table_header());
            for mode in &modes {
                let mut s = match &topo {
                    Some(t) => Scenario::on(t.clone(), workload.clone(), mode.clone(), cli.seed),
                    None => Scenario::new(ls.clone(), workload.clone(), mode.clone(), cli.seed),
                };
                let rto_initial_ns = s.engine.rto_initial_ns;
                s.engine = EngineKnobs {
                    rto_initial_ns,
                    ..engine.clone()
                };
                s.series_interval_ns = cli.bucket_us.max(1) * 1000;
                s.downlinks = cli.downlink.clone();
                let r = fabric::run(&s);
                println!("{}", r.row());
                for j in &r.jobs {
                    println!("  job {}: {}", j.name, job_cells(j));
                }
                reports.push(r);
            }
        }
    }
    println!("\n{}", speed_table(&reports));
    let raw = (cli.speed && topo.is_none()).then(|| {
        let (pkts, hops, wall) = fabric::raw_fabric_speed(&ls, 20_000, cli.max_datagram, cli.seed);
        let line = format!(
            "fabric model alone (no engines): {pkts} datagrams, {hops} hops in {wall:.2} CPU s: {:.2} M datagrams/s, {:.2} M hops/s",
            pkts as f64 / wall / 1e6,
            hops as f64 / wall / 1e6
        );
        println!("{line}");
        line
    });
    if cli.no_write {
        return ExitCode::SUCCESS;
    }
    if let Err(e) = write_results(
        &cli,
        &ls,
        topo.as_ref(),
        &workloads,
        &reports,
        raw.as_deref(),
    ) {
        eprintln!("braid-fabric: writing {}: {e}", cli.out.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", cli.out.display());
    ExitCode::SUCCESS
}

fn job_cells(j: &JobStats) -> String {
    format!(
        "{} messages, MCT p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs, last done at {:.1} µs",
        j.messages,
        j.mct_p50_ns as f64 / 1000.0,
        j.mct_p99_ns as f64 / 1000.0,
        j.mct_max_ns as f64 / 1000.0,
        j.finish_ns as f64 / 1000.0
    )
}

fn speed_table(reports: &[Report]) -> String {
    let mut s = String::from(
        "| workload | mode | sim time | datagrams | hops | wall | CPU | datagrams/CPU s | hops/CPU s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} µs | {} | {} | {:.2} s | {:.2} s | {:.2} M | {:.2} M |",
            r.workload,
            r.mode,
            r.finish_ns as f64 / 1000.0,
            r.datagrams,
            r.hops,
            r.wall_s,
            r.cpu_s,
            r.datagrams_per_s / 1e6,
            r.hops_per_s / 1e6
        );
    }
    // Every run together: the engines-attached speed of the whole invocation.
    let (dgrams, hops) = reports
        .iter()
        .fold((0, 0), |(d, h), r| (d + r.datagrams, h + r.hops));
    let (wall, cpu) = reports
        .iter()
        .fold((0.0, 0.0), |(w, c), r| (w + r.wall_s, c + r.cpu_s));
    if reports.len() > 1 && cpu > 0.0 {
        let _ = writeln!(
            s,
            "| all | | | {dgrams} | {hops} | {wall:.2} s | {cpu:.2} s | {:.2} M | {:.2} M |",
            dgrams as f64 / cpu / 1e6,
            hops as f64 / cpu / 1e6
        );
    }
    s
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn write_results(
    cli: &Cli,
    ls: &LeafSpine,
    topo: Option<&Topo>,
    workloads: &[&str],
    reports: &[Report],
    raw: Option<&str>,
) -> Res<()> {
    std::fs::create_dir_all(&cli.out)?;
    std::fs::write(
        cli.out.join("report.json"),
        serde_json::to_string_pretty(reports)?,
    )?;
    let mut md = String::new();
    let _ = writeln!(md, "# Fabric simulation\n");
    let _ = writeln!(
        md,
        "Real Braid engines (the unmodified sans-IO `Endpoint`) on a simulated leaf-spine fabric \
         (`braid_datapath::fabric`), on virtual time, deterministic from the seed. Written by \
         `braid-fabric` (`bench/src/bin/braid-fabric.rs`); regenerate with\n\n```\ncargo run --release -p braid-bench --bin braid-fabric -- {}\n```\n",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    if let Some(t) = topo {
        let _ = writeln!(
            md,
            "**Fabric**: {}. Frames carry {} bytes of Ethernet/IP/UDP overhead (preamble and \
             gap included).\n\n\
             **Ideal** (the collective's lower bound on this fabric): the largest of, for each \
             host, the payload bytes it sends or receives over its link rate, and for each group \
             of hosts under one leaf{} the payload bytes leaving or entering the group over the \
             capacity joining it to the rest: `ideal = max(max_h bytes(h) / B_host, max_g \
             bytes(g) / C(g))`. For a ring all-reduce of V over n endpoints (R rails of m) each \
             NIC sends 2 (m − 1) / m × V / R; for the binary tree an inner node sends and \
             receives 3 × V / R. Propagation delay is not in the bound (it is a bandwidth \
             bound).\n",
            cli.describe(ls, Some(t)),
            t.frame_overhead_bytes(),
            match t {
                Topo::ThreeTier(_) => ", under one pod",
                Topo::ScaleAcross(_) => ", in one site",
                Topo::Rail(_) => " (a rail leaf)",
            },
        );
    } else {
        let _ = writeln!(
            md,
            "**Fabric**: {} hosts ({} leaves × {}), {} spines, host links {} Gbit/s, leaf–spine links \
         {:.1} Gbit/s (oversubscription {:.2}), {} ns per link, {} KiB output queues, ECN \
         marking above {}, trimming {}. Frames carry {} bytes of Ethernet/IP/UDP overhead \
         (preamble and gap included).\n",
            ls.hosts(),
            ls.leaves,
            ls.hosts_per_leaf,
            ls.spines,
            ls.host_link_gbps,
            ls.spine_link_bps() as f64 / 1e9,
            ls.oversubscription_ratio(),
            ls.prop_delay_ns,
            ls.queue_bytes >> 10,
            ls.ecn_threshold_bytes
                .map_or("never".to_string(), |k| format!("{} KB", k / 1000)),
            if ls.trim { "on" } else { "off" },
            ls.fabric.frame_overhead_bytes,
        );
    }
    let _ = writeln!(
        md,
        "**Engine**: {}-byte datagrams, retransmit timeout floor {} µs, seed {}. Modes: \
         **ecmp** (a) one path per connection, Swift; **spray** (b) {} paths, fixed window of {} \
         packets, no congestion control; **spray-cc** (c) {} paths, Swift (`fabric_swift()`: \
         target {} µs above the minimum delay, window validation, delay-gated start from the \
         second round trip) with per-path weights (ECN marks up to {} points above the \
         connection's median ignored) and PLB re-pathing.\n",
        cli.max_datagram,
        cli.rto_min_us,
        cli.seed,
        cli.paths,
        cli.fixed_window,
        cli.paths,
        cli.swift_target_us
            .unwrap_or(fabric::fabric_swift().base_target_ns / 1000),
        cli.path_ecn_tolerance_pct
            .or(EngineKnobs::default().path_ecn_tolerance_pct)
            .unwrap_or(0),
    );
    let _ = writeln!(
        md,
        "*Eff. BW* (the job's effective bandwidth) = ideal completion time / measured \
         completion time of the last message, where the \
         ideal is the payload each host link and each leaf's uplinks must carry at raw line rate \
         (headers and ACKs count against the transport). *Flow eff. BW* = the mean over \
         flows of the same ideal over the time the flow's last message completed (capped at \
         100%): how long the average flow took, rather than the last. *MCT* = message completion time, from \
         posting to the send completion. Queue figures are switch output ports only: the most \
         bytes ever queued (and, in parentheses, the most in the second half of the run, once \
         the first windows have drained), and the mean queued ahead of arriving packets. *Uplink max/mean* = \
         per leaf, the busiest uplink's bytes over the mean of that leaf's uplinks (worst leaf).\n"
    );
    let payload = cli.max_datagram.saturating_sub(64) as f64;
    let data = (cli.max_datagram + ls.fabric.frame_overhead_bytes as usize) as f64;
    let ack = (84 + ls.fabric.frame_overhead_bytes) as f64;
    let _ = writeln!(
        md,
        "*Ceiling*: a {}-byte datagram carries {} payload bytes in a {}-byte frame, and each \
         is acknowledged by a {}-byte ACK frame. A host link that carries only data can thus \
         deliver at most {:.1}% of its rate as payload; one that also carries the ACKs of \
         the flow its host receives (permutation, all-to-all, ring), {:.1}%{}.\n",
        cli.max_datagram,
        payload,
        data,
        ack,
        payload / data * 100.0,
        payload / (data + ack) * 100.0,
        if cli.rx_batch_ns > 0 {
            format!(
                " with an ACK per data packet; here a host picks up what arrived every {} ns \
                 and one ACK covers the batch, so its ceiling lies between the two",
                cli.rx_batch_ns
            )
        } else {
            String::new()
        }
    );
    for w in workloads {
        let rs: Vec<&Report> = reports
            .iter()
            .filter(|r| r.workload == *w || (*w == "mixed-tenant" && r.workload == "latency-alone"))
            .collect();
        if rs.is_empty() {
            continue;
        }
        let _ = writeln!(md, "## {w}\n\n{}", Report::table_header());
        for r in &rs {
            let _ = writeln!(md, "{}", r.row());
        }
        if rs.iter().any(|r| !r.jobs.is_empty()) {
            let _ = writeln!(
                md,
                "\nThe jobs on their own (latency-alone: the latency job without the background \
                 all-to-all; mixed-tenant: beside it):\n\n| workload | mode | job | messages | MCT p50 | MCT p99 | MCT max | last done |\n|---|---|---|---:|---:|---:|---:|---:|"
            );
            for r in &rs {
                for j in &r.jobs {
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs |",
                        r.workload,
                        r.mode,
                        j.name,
                        j.messages,
                        j.mct_p50_ns as f64 / 1000.0,
                        j.mct_p99_ns as f64 / 1000.0,
                        j.mct_max_ns as f64 / 1000.0,
                        j.finish_ns as f64 / 1000.0
                    );
                }
            }
        }
        let base = w.replace(' ', "-");
        let label = |r: &Report| {
            if rs.iter().any(|o| o.workload != r.workload) {
                format!("{} {}", r.workload, r.mode)
            } else {
                r.mode.clone()
            }
        };
        plot_throughput(&cli.out.join(format!("{base}-throughput.svg")), w, &rs)?;
        plot_uplinks(&cli.out.join(format!("{base}-uplinks.svg")), w, &rs)?;
        plot_queue(&cli.out.join(format!("{base}-queue.svg")), w, &rs)?;
        plot_queue_cdf(
            &cli.out.join(format!("{base}-queue-cdf.svg")),
            w,
            &rs,
            &label,
        )?;
        plot_completion_cdf(
            &cli.out.join(format!("{base}-completion-cdf.svg")),
            w,
            &rs,
            &label,
        )?;
        let _ = writeln!(
            md,
            "\n![{w}: throughput]({base}-throughput.svg)\n![{w}: uplink load]({base}-uplinks.svg)\n![{w}: switch queue]({base}-queue.svg)\n![{w}: queue depth CDF]({base}-queue-cdf.svg)\n![{w}: completion CDF]({base}-completion-cdf.svg)\n"
        );
    }
    let find = |w: &str, m: &str| reports.iter().find(|r| r.workload == w && r.mode == m);
    if let (Some(e), Some(c)) = (find("permutation", "ecmp"), find("permutation", "spray-cc")) {
        let verdict = |x: f64, ok: bool, goal: f64| {
            if ok {
                "met".to_string()
            } else {
                format!("missed by {:.1} points", (x - goal).abs())
            }
        };
        let line = |metric: &str, c: f64, e: f64| {
            format!(
                "- {metric}: spray-cc **{c:.1}%** ({}), ecmp **{e:.1}%** ({})",
                verdict(c, c >= 90.0, 90.0),
                verdict(e, e <= 70.0, 70.0)
            )
        };
        let _ = writeln!(
            md,
            "## Target\n\nPermutation: spraying with the default controller ≥ 90% where \
             single-path ECMP ≤ 70%.\n\n{}\n{}\n",
            line(
                "job (ideal / last completion)",
                c.effective_bw * 100.0,
                e.effective_bw * 100.0
            ),
            line(
                "mean flow (ideal / each flow's completion)",
                c.flow_effective_bw * 100.0,
                e.flow_effective_bw * 100.0
            ),
        );
    }
    let _ = writeln!(
        md,
        "## Simulator speed (one core)\n\n{}",
        speed_table(reports)
    );
    if let Some(raw) = raw {
        let _ = writeln!(md, "{raw}\n");
    }
    std::fs::write(cli.out.join("README.md"), md)?;
    Ok(())
}

const COLORS: [RGBColor; 5] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// A line chart of `series` (name, points), `x` and `y` labelled.
fn line_chart(
    path: &Path,
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Res<()> {
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1e-9, f64::max);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(1e-9, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn plot_throughput(path: &Path, w: &str, rs: &[&Report]) -> Res<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = rs
        .iter()
        .map(|r| {
            let p = &r.plots;
            let per = p.receivers.max(1) as f64;
            let pts = p
                .delivered_gbps
                .iter()
                .enumerate()
                .map(|(i, g)| ((i as f64 + 0.5) * p.interval_ns as f64 / 1000.0, g / per))
                .collect();
            (r.mode.clone(), pts)
        })
        .collect();
    line_chart(
        path,
        &format!("{w}: throughput delivered per receiving host"),
        "time (µs)",
        "Gbit/s per receiver (data + ACKs, wire)",
        &series,
    )
}

fn plot_uplinks(path: &Path, w: &str, rs: &[&Report]) -> Res<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = rs
        .iter()
        .map(|r| {
            let mut loads = r.plots.uplink_gbps.clone();
            loads.sort_by(|a, b| b.total_cmp(a));
            let pts = loads
                .iter()
                .enumerate()
                .map(|(i, g)| (i as f64, *g))
                .collect();
            (r.mode.clone(), pts)
        })
        .collect();
    line_chart(
        path,
        &format!("{w}: load of each leaf-to-spine link, busiest first"),
        "uplink rank",
        "mean Gbit/s over the run",
        &series,
    )
}

fn plot_queue(path: &Path, w: &str, rs: &[&Report]) -> Res<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = rs
        .iter()
        .map(|r| {
            let p = &r.plots;
            let pts = p
                .max_queue_bytes
                .iter()
                .enumerate()
                .map(|(i, q)| ((i as f64 + 0.5) * p.interval_ns as f64 / 1000.0, q / 1000.0))
                .collect();
            (r.mode.clone(), pts)
        })
        .collect();
    line_chart(
        path,
        &format!("{w}: largest switch queue"),
        "time (µs)",
        "KB",
        &series,
    )
}

fn plot_queue_cdf(
    path: &Path,
    w: &str,
    rs: &[&Report],
    label: &dyn Fn(&Report) -> String,
) -> Res<()> {
    // x: queue depth (KB), y: fraction of (switch port, 10 µs bucket) samples at or below.
    let series: Vec<(String, Vec<(f64, f64)>)> = rs
        .iter()
        .map(|r| {
            let pts = r
                .plots
                .queue_cdf_bytes
                .iter()
                .enumerate()
                .map(|(q, b)| (b / 1000.0, q as f64 / 100.0))
                .collect();
            (label(r), pts)
        })
        .collect();
    line_chart(
        path,
        &format!("{w}: switch queue depth CDF (largest per port per bucket, busy ports)"),
        "queue depth (KB)",
        "fraction of samples",
        &series,
    )
}

fn plot_completion_cdf(
    path: &Path,
    w: &str,
    rs: &[&Report],
    label: &dyn Fn(&Report) -> String,
) -> Res<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = rs
        .iter()
        .map(|r| {
            let done = &r.plots.flow_done_ns;
            let n = done.len().max(1) as f64;
            let pts = done
                .iter()
                .enumerate()
                .map(|(i, t)| (*t as f64 / 1000.0, (i + 1) as f64 / n))
                .collect();
            (label(r), pts)
        })
        .collect();
    line_chart(
        path,
        &format!("{w}: flow completion CDF (each flow's last message)"),
        "time (µs)",
        "fraction of flows done",
        &series,
    )
}

fn parse_downlink(arg: &str) -> Result<LinkChange, String> {
    let (spine, kvs) = arg
        .split_once(':')
        .ok_or_else(|| format!("{arg:?}: expected SPINE:KEY=VALUE[,...]"))?;
    let mut c = LinkChange {
        spine: spine
            .parse()
            .map_err(|e| format!("{arg:?}: spine {spine:?}: {e}"))?,
        ..LinkChange::default()
    };
    for kv in kvs.split(',') {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("{arg:?}: {kv:?} is not KEY=VALUE"))?;
        let x: f64 = v.parse().map_err(|e| format!("{arg:?}: {k}={v:?}: {e}"))?;
        if !x.is_finite() || x < 0.0 {
            return Err(format!("{arg:?}: {k}={v} must be a non-negative number"));
        }
        match k {
            "gbps" => c.gbps = Some(x),
            "queue-kb" => c.queue_bytes = Some((x * 1000.0).round() as usize),
            "loss" if x <= 1.0 => c.loss = Some(x),
            "ce" if x <= 1.0 => c.ce_mark = Some(x),
            "loss" | "ce" => return Err(format!("{arg:?}: {k}={v} is not a probability")),
            _ => {
                return Err(format!(
                    "{arg:?}: unknown key {k:?} (gbps, queue-kb, loss, ce)"
                ));
            }
        }
    }
    Ok(c)
}
