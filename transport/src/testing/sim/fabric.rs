//! Fabric-scale simulation: real Braid engines ([`Endpoint`]) on a simulated leaf-spine fabric
//! ([`braid_datapath::fabric`]), or on a rail-optimized, three-tier or two-site one
//! ([`Scenario::topology`], [`Topo`]), on virtual time, under the traffic of a collective or a
//! storage cluster.
//!
//! What it does not do: it does not change the engine (every endpoint is the unmodified
//! sans-IO [`Endpoint`], driven by the one [`Driver`]), read a clock (the wall-time fields of
//! a [`Report`] are measured by `braid_bench::fabric::run`, with the plots and the CLI), or
//! use threads.
//! The same [`Scenario`] gives the same [`Report`] (except its wall-time fields) on every run.
//!
//! # How a run goes
//!
//! [`Sim`] runs on the [`Driver`] over a [`Fabric`] (see the driver's docs for one step): one
//! endpoint per
//! host, one connected QP pair per flow, a source and a destination registration per host,
//! all of one memory region the size of the largest message (every message reads the same
//! source bytes and lands at the same offset of the region: the contents do not matter here,
//! only the packets; one backing for every host keeps a 1,024-host run from zeroing two
//! regions per host). Each step jumps to the
//! earliest event, a packet reaching a host or a host's wake-up time (an engine timer or its
//! NIC draining), delivers, runs due timers, and then *services* every host that had input:
//! `poll_transmit` while its NIC has room, `poll_completion` (the workload reacts, possibly
//! posting more work), and `poll_timeout` for its next wake-up.
//!
//! A host hands each datagram to its engine as it arrives, so the engine acknowledges about
//! every data packet; [`EngineKnobs::rx_batch_ns`] models a progress loop that picks up
//! received datagrams in batches instead (one ACK per batch).
//!
//! The NIC is modelled as a real one behaves: the engine is asked for a datagram only when
//! the NIC queue holds less than two full frames, so the engine's packets leave at line rate
//! and wait in the fabric's switch queues, not in an unbounded host queue. The send timestamp
//! the engine puts in each packet is therefore at most two frames older than its first bit on
//! the wire.
//!
//! # Workloads ([`Workload`])
//!
//! - **permutation**: every host WRITEs the same number of bytes to one other host, a random
//!   derangement (no host sends to itself, every host receives from exactly one);
//! - **incast**: `senders` hosts (spread over the leaves) WRITE to host 0;
//! - **all-to-all**: every host WRITEs the same number of bytes to every other host;
//! - **ring all-reduce**: each host WRITEs (with immediate) chunks of `V / N` bytes to its
//!   successor in `2 (N − 1)` steps, each step cut into `slices` WRITEs; slice `k` of step
//!   `s + 1` leaves as soon as slice `k` of step `s` from the predecessor has landed (the
//!   receive completion of its immediate), as a pipelined ring all-reduce does. The ring
//!   visits the leaves in turn, so every hop crosses the spines.
//!
//! - **tree all-reduce**: a binary tree per collective group (one per rail on a
//!   rail-optimized fabric, [`Topo::collective_groups`]), the vector cut into slices that are
//!   reduced up (a host sends slice `k` to its parent once every child's slice `k` landed) and
//!   broadcast down, pipelined;
//! - **mixed tenant**: a latency job (every fourth host, one small WRITE at a time) with or
//!   without a background all-to-all among the other hosts; [`Report::jobs`] has each job's
//!   completion times.
//!
//! On a rail-optimized fabric every NIC is one endpoint, ring and tree all-reduce run one
//! ring (tree) per rail with the vector split between the rails, and permutation and
//! all-to-all are rail-aligned (NIC `r` to NIC `r` of the peer server), as a rail-aware
//! library moves data between rails inside a server.
//!
//! Streams (the first three) keep `outstanding` messages posted per flow, and post the next
//! when one completes, so a message's completion time is measured from its posting to its
//! send completion (the acknowledgement of its last byte).
//!
//! # Modes ([`Mode`])
//!
//! - **(a) `ecmp`**: one path per connection (`EndpointConfig::paths = 1`), as RoCE does:
//!   each connection's packets all leave from one UDP source port, so ECMP pins the flow to
//!   one route. It runs the *same* controller as (c) ([`fabric_swift`]), so (a) and (c)
//!   differ only in load balancing. `ecmp-fixed` and `ecmp-dcqcn` are the variants with no
//!   congestion control and with DCQCN (RoCE's usual ECN-driven rate control).
//! - **(b) `spray`**: `paths` paths per connection (`braid-fabric` uses 256, the engine's
//!   most), a fixed window and no congestion control.
//! - **(c) `spray-cc`**: `paths` paths per connection with Swift ([`fabric_swift`]) and the
//!   engine's path management (per-path weights and PLB re-pathing, always on).
//!
//! # What is measured ([`Report`])
//!
//! *Effective bandwidth* (of the job) is the ideal completion time over the time the last
//! message completed; the *flow effective bandwidth* is the mean over flows of the same ideal
//! over the time the flow's last message completed (capped at 1; flows of unequal size scale
//! the ideal by their bytes). The ideal is a
//! lower bound that any transport and routing must respect: the payload bytes that must cross
//! each host link and each leaf's spine-facing links, over their raw line rate (so Ethernet,
//! IP, UDP and Braid headers and ACKs all count against the transport). For the ring it is
//! `2 (N − 1) / N × V` over the host link rate. On the other fabrics the ideal is the same
//! kind of bound, generalised: the largest of each host's bytes over its link rate and each
//! cut's (leaf, pod, site: [`braid_datapath::fabric::Cut`]) bytes across it over its
//! capacity. Queue occupancy is that of switch output ports
//! only (host NICs excluded).
use std::sync::Arc;

use braid_datapath::fabric::{Fabric, LeafSpine, NodeKind, PortConfig, PortId};
use braid_datapath::net::{HostId, Network};
use braid_proto::cc::paths::PathConfig;
use braid_proto::cc::{ControllerFactory, DcqcnConfig, FixedWindowConfig, SwiftConfig};
use braid_proto::{
    Access, Completion, CqId, Endpoint, EndpointConfig, MrKeys, PdId, RecvWr, Region, RemoteAddr,
    SendOp, SendWr, Sge, Timestamp, WcOpcode, WcStatus,
};
use serde::Serialize;

use super::driver::{Driver, DriverConfig, Handler, Service};
pub use super::topo::Topo;

/// Datagrams shorter than this (ACKs, NAKs) are copied into the fabric rather than handed
/// over in the engine's full-size buffer.
const SMALL_DATAGRAM: usize = 512;

/// Tag of receive work request ids (the low bits are the flow index).
const RECV_TAG: u64 = 1 << 63;

/// Swift as Braid runs it on a simulated 100 Gbit/s fabric: the defaults
/// ([`SwiftConfig::default`]) except the delay allowances, scaled to a fabric whose base
/// round trip is about 10 µs and whose 512 KiB queues hold about 40 µs at line rate, and the
/// reaction to retransmit timeouts.
///
/// | field | value | default | why |
/// |---|---|---|---|
/// | `base_target_ns` | 15 µs | 50 µs | above the minimum delay: ~190 KB of queue at 100 Gbit/s; 50 µs is more than a 512 KiB queue holds |
/// | `fs_range_ns` | 20 µs | 100 µs | flow scaling for incast: tiny windows tolerate up to 20 µs more, still within the queue |
/// | `init_cwnd` | 32 packets | 64 | about the bandwidth-delay product (4 KiB packets, ~10 µs); 64 overfills the fabric at start |
/// | `rtt_init_ns` | 20 µs | 100 µs | the fabric's round trip, before the first sample |
/// | `rto_reset_threshold` | 3 | 1 | in an incast the first timeouts come from the initial burst; resetting the window to 0.01 packet on each starves a sender for milliseconds (as `SwiftConfig::software_host` also chooses) |
/// | `base_delay_scale` | 0.25 | 0 | distance scaling: the target's headroom grows by a quarter of the measured base delay (2.5 µs on this fabric, 100 µs over 400 µs of long links) |
/// | `ai_ref_delay_ns` | 20 µs | 0 | distance scaling: above a 20 µs base delay (longer than this fabric's round trip) the additive increase is one packet per 20 µs, not per round trip |
///
/// | `hop_telemetry` | on | off | the harness's switches stamp the largest hop queue ([`EngineKnobs::hop_telemetry`], on by default): a flow between two full leaves crosses four full queues in its round trip where a flow with one full end crosses two, and a summed delay cuts it for that alone (bench/results/fabric-tail-2026-12-05.md section 2) |
/// | `rtt_fair_max`, `rtt_fair_exp` | 16, 2 | off, 1 | the increase grows rates, not windows, alike: a longer round trip no longer means a lower rate at the same bottleneck |
/// | `rtt_fair_hop_ref` | on | off | the stretch is the round trip over the delay Swift acts on (base + bottleneck hop queue), not over the base: an incast, whose round trips are all stretched by the one queue, is not made 16 times as aggressive (bench/results/fabric-tail-2026-12-05-s2.md) |
/// | `beta` | 0.4 | 0.8 | a gentler decrease, with the faster increase above |
/// | `ai` | 1.5 packets | 1 | the flows between two full leaves, cut at every crossing of the target, finish last; a faster increase brings them back sooner; swept with the other workloads beside it in bench/results/fabric-ai-2026-12-07-s33.md |
/// | `validate_cwnd` | 1.05 | off | a flow held back by its own host link (one full end) otherwise grows a window it does not use, and a decrease at the full leaves' uplinks then takes nothing from its rate: the reduction falls on the flows between two full leaves, which finish last (bench/results/fabric-tail-2026-12-06.md) |
/// | `fast_start`, `fast_start_once_after_first_round` | on, on | off, off | those flows also start slowest; the delay-gated start opens their windows from the second round trip on (the first round's ACKs cannot show an incast's queue) and not again after idle (a tree all-reduce's next step meets a fan-in) |
///
/// The rest of the control law (`max_mdf` 0.5, pacing below one packet) is Swift's default.
/// Without telemetry in the samples (`EngineKnobs::hop_telemetry` off) Swift falls back to
/// the measured delay and the rate-fair factor stays near 1.
pub fn fabric_swift() -> SwiftConfig {
    SwiftConfig {
        base_target_ns: 15_000,
        fs_range_ns: 20_000,
        init_cwnd: 32.0,
        rtt_init_ns: 20_000,
        rto_reset_threshold: 3,
        base_delay_scale: 0.25,
        ai_ref_delay_ns: 20_000,
        hop_telemetry: true,
        rtt_fair_max: 16.0,
        rtt_fair_exp: 2.0,
        rtt_fair_hop_ref: true,
        beta: 0.4,
        ai: 1.5,
        validate_cwnd: 1.05,
        fast_start: true,
        fast_start_once_after_first_round: true,
        ..SwiftConfig::default()
    }
}

/// The congestion controller of a mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cc {
    /// A fixed window of this many full packets: no congestion control.
    Fixed(u32),
    /// Swift with these settings.
    Swift(SwiftConfig),
    /// DCQCN with these settings.
    Dcqcn(DcqcnConfig),
}

impl Cc {
    fn factory(&self) -> Arc<dyn ControllerFactory> {
        match *self {
            Cc::Fixed(packets) => Arc::new(FixedWindowConfig { packets }),
            Cc::Swift(s) => Arc::new(s),
            Cc::Dcqcn(d) => Arc::new(d),
        }
    }
}

/// How connections use the fabric: paths per connection and congestion control.
#[derive(Debug, Clone, PartialEq)]
pub struct Mode {
    /// Short name for tables and file names.
    pub name: String,
    /// Paths (source ports) per connection.
    pub paths: u16,
    /// Source ports per host ([`EndpointConfig::ports`]): 0 for the engine's default (twice
    /// the paths, so PLB can move a congested path to a spare port); the single-path modes use
    /// 1, so they stay a RoCE-like baseline whose flows never change route.
    pub ports: u16,
    /// The controller.
    pub cc: Cc,
}

impl Mode {
    /// (a) One path per connection (plain ECMP, as RoCE), with the same controller as (c).
    pub fn ecmp() -> Mode {
        Mode {
            name: "ecmp".into(),
            paths: 1,
            ports: 1,
            cc: Cc::Swift(fabric_swift()),
        }
    }

    /// (a') One path per connection and a fixed window of `packets`.
    pub fn ecmp_fixed(packets: u32) -> Mode {
        Mode {
            name: "ecmp-fixed".into(),
            paths: 1,
            ports: 1,
            cc: Cc::Fixed(packets),
        }
    }

    /// (a'') One path per connection with DCQCN at 100 Gbit/s (RoCE's usual pairing).
    pub fn ecmp_dcqcn() -> Mode {
        Mode {
            name: "ecmp-dcqcn".into(),
            paths: 1,
            ports: 1,
            cc: Cc::Dcqcn(DcqcnConfig::default()),
        }
    }

    /// (b) Spraying over `paths` paths with a fixed window of `packets`: no congestion
    /// control.
    pub fn spray(paths: u16, packets: u32) -> Mode {
        Mode {
            name: "spray".into(),
            paths,
            ports: 0,
            cc: Cc::Fixed(packets),
        }
    }

    /// (c) Spraying over `paths` paths with Swift ([`fabric_swift`]) and path management.
    pub fn spray_cc(paths: u16) -> Mode {
        Mode {
            name: "spray-cc".into(),
            paths,
            ports: 0,
            cc: Cc::Swift(fabric_swift()),
        }
    }

    /// (c') Spraying over `paths` paths with the runtime's default Swift
    /// ([`SwiftConfig::software_host`], what `braid-perf` runs) and path management: for
    /// slow, software-paced links such as the namespace testbed's.
    pub fn spray_host(paths: u16) -> Mode {
        Mode {
            name: "spray-host".into(),
            paths,
            ports: 0,
            cc: Cc::Swift(SwiftConfig::software_host()),
        }
    }

    /// The mode called `name` (`ecmp`, `ecmp-fixed`, `ecmp-dcqcn`, `spray`, `spray-cc`,
    /// `spray-host`).
    pub fn by_name(name: &str, paths: u16, fixed_window_packets: u32) -> Option<Mode> {
        Some(match name {
            "ecmp" | "a" => Mode::ecmp(),
            "ecmp-fixed" => Mode::ecmp_fixed(fixed_window_packets),
            "ecmp-dcqcn" => Mode::ecmp_dcqcn(),
            "spray" | "b" => Mode::spray(paths, fixed_window_packets),
            "spray-cc" | "c" => Mode::spray_cc(paths),
            "spray-host" => Mode::spray_host(paths),
            _ => return None,
        })
    }
}

/// The traffic of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    /// Every host WRITEs `bytes_per_host` to one other host (a random derangement).
    Permutation {
        /// Bytes each host sends.
        bytes_per_host: u64,
        /// Message size.
        msg_bytes: u32,
        /// Messages kept posted per flow.
        outstanding: u32,
    },
    /// `senders` hosts WRITE `bytes_per_sender` each to host 0.
    Incast {
        /// Number of senders (at most hosts − 1).
        senders: usize,
        /// Bytes each sender sends.
        bytes_per_sender: u64,
        /// Message size.
        msg_bytes: u32,
        /// Messages kept posted per flow.
        outstanding: u32,
    },
    /// Every host WRITEs `bytes_per_pair` to every other host.
    AllToAll {
        /// Bytes per ordered pair.
        bytes_per_pair: u64,
        /// Message size.
        msg_bytes: u32,
        /// Messages kept posted per flow.
        outstanding: u32,
    },
    /// A ring all-reduce of a `vector_bytes` vector: `2 (N − 1)` steps of `vector_bytes / N`,
    /// each step cut into `slices` WRITEs that pipeline independently.
    RingAllReduce {
        /// Size of the reduced vector, bytes.
        vector_bytes: u64,
        /// WRITEs per step (slice `k` of step `s + 1` leaves once slice `k` of step `s` has
        /// landed, as NCCL pipelines a ring).
        slices: u32,
    },
    /// A tree all-reduce of a `vector_bytes` vector: a binary tree over the hosts of each
    /// collective group (one per rail on a rail-optimized fabric, the vector split between
    /// them); the vector is cut into `slices` WRITEs (with immediate) that go up the tree
    /// (a host sends slice `k` to its parent once slice `k` of each child has landed) and
    /// back down from the root (a host forwards slice `k` to its children as it lands).
    TreeAllReduce {
        /// Size of the reduced vector, bytes (all groups together).
        vector_bytes: u64,
        /// WRITEs the vector is cut into.
        slices: u32,
    },
    /// Two tenants: a latency-sensitive job of every fourth host, each WRITE-ing `lat_msgs`
    /// messages of `lat_msg_bytes` one at a time to the next host of the job, and (when
    /// `background`) an all-to-all of `bg_bytes_per_pair` between the other hosts. Run once
    /// with and once without the background job: the latency job's completion times are the
    /// isolation.
    MixedTenant {
        /// Whether the background all-to-all runs.
        background: bool,
        /// Bytes per ordered pair of the background all-to-all.
        bg_bytes_per_pair: u64,
        /// Message size of the background job.
        bg_msg_bytes: u32,
        /// Message size of the latency job.
        lat_msg_bytes: u32,
        /// Messages each latency host sends, one after the other.
        lat_msgs: u32,
    },
}

impl Workload {
    /// Short name for tables and file names.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Permutation { .. } => "permutation",
            Workload::Incast { .. } => "incast",
            Workload::AllToAll { .. } => "all-to-all",
            Workload::RingAllReduce { .. } => "ring-allreduce",
            Workload::TreeAllReduce { .. } => "tree-allreduce",
            Workload::MixedTenant {
                background: true, ..
            } => "mixed-tenant",
            Workload::MixedTenant {
                background: false, ..
            } => "latency-alone",
        }
    }
}

/// Engine settings for the simulation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineKnobs {
    /// Largest datagram (UDP payload). Default 4096, RoCE's usual MTU.
    pub max_datagram: usize,
    /// Retransmit timeout floor, ns. Default 100 µs: the engine's 500 µs default is meant for
    /// software hosts; a µs fabric needs less, but not less than a full queue's delay.
    pub rto_min_ns: u64,
    /// Retransmit timeout before any sample, ns. Default 200 µs.
    pub rto_initial_ns: u64,
    /// Consecutive timeouts before a QP fails. Default 15.
    pub retry_limit: u32,
    /// How often a host's progress loop picks up received datagrams, ns: datagrams that
    /// arrive within one interval are handed to the engine together (as a batched receive
    /// does), so one ACK covers them. 0 hands each datagram over as it arrives.
    pub rx_batch_ns: u64,
    /// Burst spraying ([`EndpointConfig::burst`]): new packets per path draw. Default 1.
    pub burst: u16,
    /// Whether the switches stamp in-band hop telemetry into Braid's REQUEST packets
    /// ([`braid_proto::wire::stamp_hop_queue`]: the largest queueing delay of one hop on the
    /// way), which receivers echo in their ACKs; Swift uses it with
    /// [`SwiftConfig::hop_telemetry`]. Default on (since bench/results/fabric-tail-2026-12-05-s2.md;
    /// [`fabric_swift`] is tuned with it): fabrics built for AI training commonly carry
    /// in-band telemetry, and without it a summed delay cuts the flows that cross two full
    /// leaves harder than the rest.
    pub hop_telemetry: bool,
    /// Give every host two regions of its own (a source and a destination) instead of one
    /// backing shared by all: the harness's layout before the shared one, for speed
    /// comparisons (the packets are the same either way). Default off.
    pub region_per_host: bool,
    /// Override the path weights' ECN penalty ([`PathConfig::k_ecn`], whole units): `None`
    /// keeps the engine's default (50).
    pub path_k_ecn: Option<u32>,
    /// Override the path weights' ECN tolerance ([`PathConfig::ecn_tolerance`], percent of
    /// the packets): `None` keeps the engine's default (0). Default 10 here: on a fabric
    /// whose links run full (a permutation's full leaves), every uplink's queue crosses the
    /// marking threshold now and then, and a path's ECN fraction, an average over the few
    /// packets it carries when a connection sprays over hundreds of paths, is mostly noise
    /// around the median; penalized 50-fold from the first point above the median (and barred
    /// from gaining share by the balance term), that noise moves the shares off their even
    /// split and the uplinks' queues empty in turn (bench/results/fabric-tail-2026-12-05.md).
    /// A link marked far more than the rest still loses its traffic.
    pub path_ecn_tolerance_pct: Option<u32>,
    /// Override the path weights' balance gain ([`PathConfig::balance_gain`], thousandths):
    /// `None` keeps the engine's default (0.05). Default 500 here: a saturated leaf's
    /// uplinks need their shares evened within a few round trips, and with the hop-telemetry
    /// Swift of [`fabric_swift`] the faster balance no longer costs the incast
    /// (bench/results/fabric-tail-2026-12-05-s2.md).
    pub path_balance_gain_milli: Option<u32>,
}

impl Default for EngineKnobs {
    fn default() -> Self {
        EngineKnobs {
            max_datagram: 4096,
            rto_min_ns: 100_000,
            rto_initial_ns: 200_000,
            retry_limit: 15,
            rx_batch_ns: 0,
            burst: 1,
            hop_telemetry: true,
            region_per_host: false,
            path_k_ecn: None,
            path_ecn_tolerance_pct: Some(10),
            path_balance_gain_milli: Some(500),
        }
    }
}

/// One simulated run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The fabric.
    pub fabric: LeafSpine,
    /// The traffic.
    pub workload: Workload,
    /// Paths and congestion control.
    pub mode: Mode,
    /// Seed of everything (fabric, engines, workload).
    pub seed: u64,
    /// Engine settings.
    pub engine: EngineKnobs,
    /// Bucket width of the time series, ns.
    pub series_interval_ns: u64,
    /// Virtual time after which the run gives up, ns.
    pub max_sim_ns: u64,
    /// Changes to the links from the spines down to leaf 0 (the routes towards host 0, the
    /// incast receiver), applied once the fabric is built: degraded routes. Leaf-spine
    /// only.
    pub downlinks: Vec<LinkChange>,
    /// Another fabric to run on instead of `fabric` (`None`: the leaf-spine).
    pub topology: Option<Topo>,
}

/// A change to the link from one spine down to leaf 0, to model a degraded route towards
/// the hosts of leaf 0 (as on the namespace testbed: a slow link, a lossy one, a heavily
/// marked one). Fields left `None` keep the fabric's value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkChange {
    /// The spine the link comes from.
    pub spine: usize,
    /// Link rate, Gbit/s.
    pub gbps: Option<f64>,
    /// Output queue limit, bytes.
    pub queue_bytes: Option<usize>,
    /// Probability a packet is dropped.
    pub loss: Option<f64>,
    /// Probability an ECN-capable packet is marked CE.
    pub ce_mark: Option<f64>,
}

impl LinkChange {
    /// Writes the fields that are set into `port`.
    pub fn apply(&self, port: &mut PortConfig) {
        if let Some(g) = self.gbps {
            port.bandwidth_bps = (g * 1e9).round() as u64;
        }
        if let Some(q) = self.queue_bytes {
            port.queue_bytes = q;
        }
        if let Some(l) = self.loss {
            port.loss = l;
        }
        if let Some(m) = self.ce_mark {
            port.ce_mark = m;
        }
    }
}

impl Scenario {
    /// The four-link namespace testbed's twin: two leaves of one host, four spines, 10 Gbit/s
    /// everywhere except the links from the spines down to leaf 0 (one rate-limited hop per
    /// route, as the testbed's tbf): spine 0 at 10 Mbit/s with 12.5 KB of queue (slow), 1 at
    /// 100 Mbit/s losing 1%, 2 at 100 Mbit/s marking 40% CE, 3 at 100 Mbit/s (125 KB queues);
    /// host 1 writes `bytes` to host 0 over 16 paths with the runtime's Swift, 1472-byte
    /// datagrams and a 500 µs RTO floor, as `braid-perf` does (README, "Fabric-scale
    /// simulation", gives the same as a braid-fabric command).
    pub fn testbed_twin(bytes: u64, seed: u64) -> Scenario {
        let ls = LeafSpine {
            hosts_per_leaf: 1,
            leaves: 2,
            spines: 4,
            link_gbps: 10.0,
            host_link_gbps: 10.0,
            prop_delay_ns: 4_000,
            ecn_threshold_bytes: None,
            ..LeafSpine::default()
        };
        let w = Workload::Incast {
            senders: 1,
            bytes_per_sender: bytes,
            msg_bytes: 256 << 10,
            outstanding: 2,
        };
        let link = |spine, gbps, queue_bytes| LinkChange {
            spine,
            gbps: Some(gbps),
            queue_bytes: Some(queue_bytes),
            ..LinkChange::default()
        };
        let mut s = Scenario::new(ls, w, Mode::spray_host(16), seed);
        s.engine.max_datagram = 1472;
        s.engine.rto_min_ns = 500_000;
        s.downlinks = vec![
            link(0, 0.01, 12_500),
            LinkChange {
                loss: Some(0.01),
                ..link(1, 0.1, 125_000)
            },
            LinkChange {
                ce_mark: Some(0.4),
                ..link(2, 0.1, 125_000)
            },
            link(3, 0.1, 125_000),
        ];
        s
    }

    /// A scenario with default engine settings, 10 µs series buckets and a 1 s time limit.
    pub fn new(fabric: LeafSpine, workload: Workload, mode: Mode, seed: u64) -> Self {
        Scenario {
            fabric,
            workload,
            mode,
            seed,
            engine: EngineKnobs::default(),
            series_interval_ns: 10_000,
            max_sim_ns: 1_000_000_000,
            downlinks: Vec::new(),
            topology: None,
        }
    }

    /// A scenario on `topo` (see [`Scenario::new`]); the retransmit timeout before the first
    /// sample is at least three of the fabric's base round trips (the two sites of a
    /// scale-across fabric are hundreds of µs apart).
    pub fn on(topo: Topo, workload: Workload, mode: Mode, seed: u64) -> Self {
        let mut s = Scenario::new(LeafSpine::default(), workload, mode, seed);
        s.engine.rto_initial_ns = s.engine.rto_initial_ns.max(3 * topo.base_rtt_ns());
        s.topology = Some(topo);
        s
    }

    /// Name of the fabric (`leaf-spine` or the [`Topo`]'s).
    pub fn topology_name(&self) -> &'static str {
        self.topology.as_ref().map_or("leaf-spine", Topo::name)
    }

    /// Number of hosts of the fabric the scenario runs on.
    pub fn hosts(&self) -> usize {
        self.topology
            .as_ref()
            .map_or(self.fabric.hosts(), Topo::hosts)
    }

    /// The engine configuration every host gets (its seed is mixed per host).
    pub fn endpoint_config(&self) -> EndpointConfig {
        EndpointConfig {
            seed: self.seed,
            max_datagram: self.engine.max_datagram,
            paths: self.mode.paths,
            ports: self.mode.ports,
            rto_initial_ns: self.engine.rto_initial_ns,
            rto_min_ns: self.engine.rto_min_ns,
            retry_limit: self.engine.retry_limit,
            burst: self.engine.burst,
            cc: self.mode.cc.factory(),
            path: PathConfig {
                k_ecn: self
                    .engine
                    .path_k_ecn
                    .map_or(PathConfig::default().k_ecn, f64::from),
                ecn_tolerance: self
                    .engine
                    .path_ecn_tolerance_pct
                    .map_or(PathConfig::default().ecn_tolerance, |p| {
                        f64::from(p) / 100.0
                    }),
                balance_gain: self
                    .engine
                    .path_balance_gain_milli
                    .map_or(PathConfig::default().balance_gain, |g| {
                        f64::from(g) / 1000.0
                    }),
                ..PathConfig::default()
            },
            ..EndpointConfig::default()
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Mode name.
    pub mode: String,
    /// Hosts in the fabric.
    pub hosts: usize,
    /// The seed.
    pub seed: u64,
    /// Whether every message completed before the time limit.
    pub finished: bool,
    /// Messages completed successfully.
    pub messages: u64,
    /// Messages that completed with an error.
    pub failed: u64,
    /// Payload bytes of the messages completed successfully.
    pub payload_bytes: u64,
    /// When the last message completed, ns of virtual time.
    pub finish_ns: u64,
    /// The lower bound on the completion time (see the module docs), ns.
    pub ideal_ns: u64,
    /// `ideal_ns / finish_ns`: the job's effective bandwidth (everything must finish).
    pub effective_bw: f64,
    /// Mean over flows of the job's ideal time (scaled by the flow's bytes over the largest
    /// flow's) over the time the flow's last message completed, each capped at 1: the
    /// average flow's effective bandwidth.
    pub flow_effective_bw: f64,
    /// Payload goodput per sending host, Gbit/s.
    pub goodput_gbps_per_sender: f64,
    /// Message completion time, median, ns.
    pub mct_p50_ns: u64,
    /// Message completion time, 99th percentile, ns.
    pub mct_p99_ns: u64,
    /// Message completion time, largest, ns.
    pub mct_max_ns: u64,
    /// Data packets retransmitted (all hosts).
    pub retransmits: u64,
    /// Retransmit timeouts fired (all hosts).
    pub rto_fired: u64,
    /// Paths moved to another source port by PLB (all senders).
    pub repaths: u64,
    /// Packets dropped at switch and NIC queues.
    pub drops: u64,
    /// Packets trimmed.
    pub trimmed: u64,
    /// Packets marked CE.
    pub ecn_marks: u64,
    /// Most bytes queued at any switch port.
    pub max_queue_bytes: usize,
    /// Most bytes queued at any switch port in the second half of the run (the steady state,
    /// once the initial burst of every sender's first window has drained), from the time
    /// series.
    pub steady_max_queue_bytes: usize,
    /// Mean bytes queued ahead of a packet at switch ports, as arriving packets saw it.
    pub mean_queue_bytes: f64,
    /// Load balance of the leaf-to-spine links: per leaf, its busiest uplink's bytes over the
    /// mean of its uplinks; the worst leaf's ratio (1.0: perfectly balanced).
    pub uplink_imbalance: f64,
    /// Datagrams the engines sent into the fabric.
    pub datagrams: u64,
    /// Packet hops simulated (one per queue a packet entered).
    pub hops: u64,
    /// Wall time of the run, seconds (not deterministic).
    pub wall_s: f64,
    /// CPU time the run used on its one thread, seconds (the wall time where the OS does
    /// not report it; not deterministic). On a shared machine this, not the wall time, is
    /// the simulator's speed.
    pub cpu_s: f64,
    /// Datagrams per CPU second (not deterministic).
    pub datagrams_per_s: f64,
    /// Packet hops per CPU second (not deterministic).
    pub hops_per_s: f64,
    /// The jobs of a multi-tenant workload, each on its own (empty otherwise).
    pub jobs: Vec<JobStats>,
    /// Time series for plots.
    #[serde(skip)]
    pub plots: Plots,
}

/// The completion times of one job of a multi-tenant workload.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobStats {
    /// Job name (`background`, `latency`).
    pub name: String,
    /// Messages the job completed.
    pub messages: u64,
    /// When the job's last message completed, ns.
    pub finish_ns: u64,
    /// Message completion time, median, ns.
    pub mct_p50_ns: u64,
    /// Message completion time, 99th percentile, ns.
    pub mct_p99_ns: u64,
    /// Message completion time, largest, ns.
    pub mct_max_ns: u64,
}

/// Time series and per-link loads of a run, for plotting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plots {
    /// Bucket width, ns.
    pub interval_ns: u64,
    /// Wire throughput delivered to hosts (data and ACKs), Gbit/s, per bucket.
    pub delivered_gbps: Vec<f64>,
    /// Largest switch queue, bytes, per bucket.
    pub max_queue_bytes: Vec<f64>,
    /// Mean rate of each leaf-to-spine link over the run, Gbit/s, in port order (leaf-major).
    pub uplink_gbps: Vec<f64>,
    /// Hosts that receive data in this workload.
    pub receivers: usize,
    /// When each flow's last message completed, ns, sorted (a collective's completion CDF).
    pub flow_done_ns: Vec<u64>,
    /// Queue depth distribution: percentiles 0, 1, ..., 100 of the largest queue of each
    /// switch port in each bucket where the port carried traffic, bytes.
    pub queue_cdf_bytes: Vec<f64>,
}

impl Report {
    /// The header and separator of [`Report::row`]'s markdown table.
    pub fn table_header() -> String {
        "| workload | mode | eff. BW | flow eff. BW | goodput/sender | MCT p50 | MCT p99 | retx | RTOs | drops | trims | ECN marks | max queue (2nd half) | mean queue | uplink max/mean | repaths | done |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            .to_string()
    }

    /// One markdown table row: every deterministic figure of the run.
    pub fn row(&self) -> String {
        format!(
            "| {} | {} | {:.1}% | {:.1}% | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} KB ({:.0} KB) | {:.1} KB | {:.2} | {} | {} |",
            self.workload,
            self.mode,
            self.effective_bw * 100.0,
            self.flow_effective_bw * 100.0,
            rate(self.goodput_gbps_per_sender),
            us(self.mct_p50_ns),
            us(self.mct_p99_ns),
            self.retransmits,
            self.rto_fired,
            self.drops,
            self.trimmed,
            self.ecn_marks,
            self.max_queue_bytes as f64 / 1000.0,
            self.steady_max_queue_bytes as f64 / 1000.0,
            self.mean_queue_bytes / 1000.0,
            self.uplink_imbalance,
            self.repaths,
            if self.finished {
                "yes".to_string()
            } else {
                format!("no ({} failed)", self.failed)
            },
        )
    }
}

/// A rate in Gbit/s, in Mbit/s below 1 Gbit/s (slow links, as the testbed twin's).
fn rate(gbps: f64) -> String {
    if gbps < 1.0 {
        format!("{:.1} Mb/s", gbps * 1000.0)
    } else {
        format!("{gbps:.1} Gb/s")
    }
}

fn us(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1000.0)
}

/// Runs `scenario` to completion (or its time limit) and reports. The wall-time fields of
/// the report are 0: `braid_bench::fabric::run` measures them.
pub fn run(scenario: &Scenario) -> Report {
    let mut sim = Sim::new(scenario);
    sim.run();
    sim.report(0.0, 0.0)
}

/// One host's resources: its protection domain, completion queue and the two regions every
/// message reads from and lands in.
#[derive(Debug)]
struct HostRes {
    pd: PdId,
    cq: CqId,
    src: MrKeys,
    dst: MrKeys,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlowKind {
    /// Keep `outstanding` messages posted until `total` bytes are posted.
    Stream,
    /// A ring all-reduce link: steps posted as the predecessor's chunks land.
    Ring,
    /// A tree all-reduce link from a child to its parent (the reduction).
    TreeUp,
    /// A tree all-reduce link from a parent to a child (the broadcast).
    TreeDown,
}

#[derive(Debug)]
struct Flow {
    kind: FlowKind,
    from: usize,
    to: usize,
    /// QP on `from` (the sender) and on `to`.
    qp_from: u32,
    qp_to: u32,
    remote: RemoteAddr,
    total: u64,
    msg_bytes: u32,
    outstanding_max: u32,
    posted: u64,
    outstanding: u32,
    failed: bool,
    /// The tenant the flow belongs to (0 but in a multi-tenant workload).
    job: u8,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    flow: u32,
    bytes: u32,
    posted_at: u64,
    done_at: Option<u64>,
    ok: bool,
}

/// The workload's state: flows, messages and what is still expected. It is the driver's
/// [`Handler`]: completions post the next messages.
#[derive(Debug)]
struct Work {
    scenario: Scenario,
    res: Vec<HostRes>,
    flows: Vec<Flow>,
    msgs: Vec<Msg>,
    /// Steps and slices per step of the ring all-reduce (0 otherwise).
    ring_steps: u32,
    ring_slices: u32,
    /// The ring flow each host sends on.
    ring_flow_of: Vec<usize>,
    /// Slices of the tree all-reduce (0 otherwise).
    tree_slices: u32,
    /// Per host: the tree flow to its parent (`usize::MAX` at a root), the flows to its
    /// children, and per slice how many children's slices have landed.
    tree_up: Vec<usize>,
    tree_down: Vec<Vec<usize>>,
    tree_got: Vec<u32>,
    /// Messages expected in total, and receive completions expected (ring).
    expected_msgs: u64,
    expected_recvs: u64,
    recvs_done: u64,
    msgs_done: u64,
    last_completion_ns: u64,
    /// Whether [`Work::start`] posted the initial work.
    started: bool,
}

/// One flow of a [`Sim`], for tracing ([`Sim::flows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlowView {
    /// Sending host.
    pub from: usize,
    /// Receiving host.
    pub to: usize,
    /// The sender's QP number (for [`Endpoint::qp_stats`] on host `from`).
    pub qp_from: u32,
    /// Bytes the flow carries in all.
    pub bytes: u64,
    /// When its last message completed, ns (0 while any is pending).
    pub finish_ns: u64,
}

/// Real engines on a simulated fabric, driven by one [`Driver`]; see the [module
/// docs](self).
#[derive(Debug)]
pub struct Sim {
    driver: Driver<Fabric>,
    work: Work,
}

impl Sim {
    /// Builds the fabric, the endpoints, the connections and the regions of `scenario`.
    pub fn new(scenario: &Scenario) -> Sim {
        let ls = &scenario.fabric;
        let topo = scenario.topology.as_ref();
        let mut fabric = match topo {
            Some(t) => t.build(scenario.seed),
            None => ls.build(scenario.seed),
        };
        fabric.enable_series(scenario.series_interval_ns);
        if scenario.engine.hop_telemetry {
            fabric.set_hop_stamp(Some(braid_proto::wire::stamp_hop_queue));
        }
        if topo.is_none() {
            // The links into leaf 0 come first among the spine-to-leaf ports, one per spine
            // in order.
            let into_leaf0 = fabric.tier_ports(1, 0);
            for c in &scenario.downlinks {
                let Some(&port) = into_leaf0.get(c.spine) else {
                    continue;
                };
                c.apply(fabric.port_mut(port));
            }
        }
        let n = scenario.hosts();
        let hosts_per_leaf = topo.map_or(ls.hosts_per_leaf, Topo::hosts_per_leaf);
        let overhead = topo.map_or(ls.fabric.frame_overhead_bytes, Topo::frame_overhead_bytes);
        let cfg = scenario.endpoint_config();
        let plan = plan(&scenario.workload, n, hosts_per_leaf, topo, scenario.seed);
        let region_len = plan.flows.iter().map(|f| f.3).max().unwrap_or(0).max(8) as usize;
        let frame = scenario.engine.max_datagram + overhead as usize;
        let mut driver = Driver::new(
            fabric,
            DriverConfig {
                buffer_bytes: scenario.engine.max_datagram.max(2048),
                handover_min_bytes: SMALL_DATAGRAM,
                nic_limit_bytes: Some(2 * frame),
                rx_batch_ns: scenario.engine.rx_batch_ns,
                service: Service::Marked,
            },
        );
        let mut res = Vec::with_capacity(n);
        // One backing for every registration of every host (see the module docs).
        let backing = Region::new(region_len);
        let own_or = |shared: &Arc<Region>| {
            if scenario.engine.region_per_host {
                Region::new(region_len)
            } else {
                shared.clone()
            }
        };
        for i in 0..n {
            let mut c = cfg.clone();
            c.seed = scenario
                .seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(i as u64);
            let addr = topo.map_or_else(|| ls.host_addr(i), |t| t.host_addr(i));
            let mut ep = Endpoint::new(c, addr);
            let pd = ep.alloc_pd();
            let cq = ep.create_cq();
            let src = ep
                .register(pd, own_or(&backing), Access::LOCAL_WRITE)
                .expect("fresh PD");
            let dst = ep
                .register(
                    pd,
                    own_or(&backing),
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )
                .expect("fresh PD");
            driver.add_host(HostId(i as u32), ep);
            res.push(HostRes { pd, cq, src, dst });
        }
        let mut flows = Vec::with_capacity(plan.flows.len());
        for (i, &(from, to, total, msg_bytes, outstanding)) in plan.flows.iter().enumerate() {
            let qa = {
                let (pd, cq) = (res[from].pd, res[from].cq);
                driver
                    .ep_mut(from)
                    .create_qp(pd, cq, cq)
                    .expect("known PD and CQ")
            };
            let qb = {
                let (pd, cq) = (res[to].pd, res[to].cq);
                driver
                    .ep_mut(to)
                    .create_qp(pd, cq, cq)
                    .expect("known PD and CQ")
            };
            driver.ep_mut(from).connect(qa.qpn, qb).expect("fresh QP");
            driver.ep_mut(to).connect(qb.qpn, qa).expect("fresh QP");
            flows.push(Flow {
                kind: plan.kinds[i],
                from,
                to,
                qp_from: qa.qpn,
                qp_to: qb.qpn,
                remote: RemoteAddr {
                    rkey: res[to].dst.rkey,
                    offset: 0,
                },
                total,
                msg_bytes,
                outstanding_max: outstanding.max(1),
                posted: 0,
                outstanding: 0,
                failed: false,
                job: plan.jobs.get(i).copied().unwrap_or(0),
            });
        }
        let expected_msgs = flows
            .iter()
            .map(|f| f.total.div_ceil(u64::from(f.msg_bytes.max(1))))
            .sum();
        let expected_recvs = flows
            .iter()
            .map(|f| match f.kind {
                FlowKind::Stream => 0,
                FlowKind::Ring => u64::from(plan.ring_steps) * u64::from(plan.ring_slices),
                FlowKind::TreeUp | FlowKind::TreeDown => u64::from(plan.tree_slices),
            })
            .sum();
        let mut tree_up = vec![usize::MAX; n];
        let mut tree_down = vec![Vec::new(); n];
        for (i, f) in flows.iter().enumerate() {
            match f.kind {
                FlowKind::TreeUp => tree_up[f.from] = i,
                FlowKind::TreeDown => tree_down[f.from].push(i),
                FlowKind::Stream | FlowKind::Ring => {}
            }
        }
        let work = Work {
            scenario: scenario.clone(),
            res,
            flows,
            msgs: Vec::with_capacity(expected_msgs as usize),
            ring_steps: plan.ring_steps,
            ring_slices: plan.ring_slices,
            ring_flow_of: {
                let mut v = vec![usize::MAX; n];
                for (i, f) in plan.flows.iter().enumerate() {
                    v[f.0] = i;
                }
                v
            },
            tree_slices: plan.tree_slices,
            tree_up,
            tree_down,
            tree_got: vec![0; n * plan.tree_slices as usize],
            expected_msgs,
            expected_recvs,
            recvs_done: 0,
            msgs_done: 0,
            last_completion_ns: 0,
            started: false,
        };
        Sim { driver, work }
    }

    /// The fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.driver.net
    }

    /// The driver (engines, virtual time).
    pub fn driver(&self) -> &Driver<Fabric> {
        &self.driver
    }

    /// Virtual time now.
    pub fn now(&self) -> Timestamp {
        self.driver.now
    }

    /// Whether every message (and, for the ring, every step) has completed or failed.
    pub fn done(&self) -> bool {
        self.work.done()
    }

    /// Posts the initial work and runs until [`Sim::done`], the time limit, or nothing is
    /// pending.
    pub fn run(&mut self) {
        let Sim { driver, work } = self;
        if !work.started {
            work.start(driver);
        }
        let limit = Timestamp::from_nanos(work.scenario.max_sim_ns);
        driver.run_until(work, limit, |_, w| w.done());
    }

    /// Posts the initial work (on the first call) and runs until virtual time `until`,
    /// [`Sim::done`], or nothing is pending: [`Sim::run`] in steps, for a caller that samples
    /// the engines (through [`Sim::driver`] and [`Sim::flows`]) between them. Returns
    /// whether the run is done.
    pub fn run_until(&mut self, until: Timestamp) -> bool {
        let Sim { driver, work } = self;
        if !work.started {
            work.start(driver);
        }
        let limit = Timestamp::from_nanos(work.scenario.max_sim_ns).min(until);
        driver.run_until(work, limit, |_, w| w.done());
        work.done()
    }

    /// The flows of the workload, in the order the scenario planned them: who sends to whom
    /// on which QP, and when the flow's last message completed (0 while one is pending).
    pub fn flows(&self) -> Vec<FlowView> {
        let mut last = vec![0u64; self.work.flows.len()];
        let mut pending = vec![false; self.work.flows.len()];
        for m in &self.work.msgs {
            let f = m.flow as usize;
            match m.done_at {
                Some(t) => last[f] = last[f].max(t),
                None => pending[f] = true,
            }
        }
        self.work
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| FlowView {
                from: f.from,
                to: f.to,
                qp_from: f.qp_from,
                bytes: f.total,
                finish_ns: if pending[i] || f.posted < f.total {
                    0
                } else {
                    last[i]
                },
            })
            .collect()
    }

    /// Wake-ups that had to be pushed past an engine deadline already due (a sign of an
    /// engine that keeps reporting past deadlines; 0 in a healthy run).
    pub fn late_deadlines(&self) -> u64 {
        self.driver.late_deadlines()
    }

    /// Collects the report; `wall_s` and `cpu_s` are the wall and CPU time the run took (0
    /// when not measured: the per-second rates are then 0 too).
    pub fn report(&self, wall_s: f64, cpu_s: f64) -> Report {
        self.work.report(&self.driver, wall_s, cpu_s)
    }
}

impl Handler<Fabric> for Work {
    fn on_completion(&mut self, d: &mut Driver<Fabric>, h: usize, _: CqId, c: Completion) -> bool {
        self.on_completion(d, h, c)
    }
}

impl Work {
    fn done(&self) -> bool {
        self.msgs_done >= self.expected_msgs && self.recvs_done >= self.expected_recvs
    }

    fn start(&mut self, d: &mut Driver<Fabric>) {
        self.started = true;
        for f in 0..self.flows.len() {
            let flow = &self.flows[f];
            if flow.kind == FlowKind::Ring {
                // Every step's WRITE with immediate consumes a receive at the peer.
                let (to, qp_to) = (flow.to, flow.qp_to);
                for _ in 0..self.ring_steps * self.ring_slices {
                    let wr = RecvWr {
                        wr_id: RECV_TAG | f as u64,
                        sges: Vec::new(),
                    };
                    d.ep_mut(to)
                        .post_recv(qp_to, wr)
                        .expect("receive queue room");
                }
                for slice in 0..self.ring_slices {
                    self.post_ring_step(d, f, 0, slice);
                }
            } else if matches!(flow.kind, FlowKind::TreeUp | FlowKind::TreeDown) {
                let (to, qp_to) = (flow.to, flow.qp_to);
                for _ in 0..self.tree_slices {
                    let wr = RecvWr {
                        wr_id: RECV_TAG | f as u64,
                        sges: Vec::new(),
                    };
                    d.ep_mut(to)
                        .post_recv(qp_to, wr)
                        .expect("receive queue room");
                }
            } else {
                self.post_stream(d, f);
            }
        }
        // The tree's leaves hold their whole vector: every slice goes up at once.
        for f in 0..self.flows.len() {
            let flow = &self.flows[f];
            if flow.kind == FlowKind::TreeUp && self.tree_down[flow.from].is_empty() {
                for slice in 0..self.tree_slices {
                    self.post_tree_slice(d, f, slice);
                }
            }
        }
        d.touch_all();
        d.service(self);
    }

    /// Reacts to completion `c` on host `h`. Returns whether work was posted.
    fn on_completion(&mut self, d: &mut Driver<Fabric>, h: usize, c: Completion) -> bool {
        let now = d.now.as_nanos();
        if c.wr_id & RECV_TAG != 0 {
            // A ring step landed on `h`: send the next one on.
            self.recvs_done += 1;
            self.last_completion_ns = now;
            if c.status != WcStatus::Success || c.opcode != WcOpcode::RecvRdmaWithImm {
                return false;
            }
            let imm = c.imm.unwrap_or(u32::MAX);
            let via = (c.wr_id & !RECV_TAG) as usize;
            match self.flows.get(via).map(|f| f.kind) {
                Some(FlowKind::TreeUp) => return self.tree_up_landed(d, h, imm),
                Some(FlowKind::TreeDown) => return self.tree_send_down(d, h, imm),
                _ => {}
            }
            let (step, slice) = (imm / self.ring_slices, imm % self.ring_slices);
            let f = self.ring_flow_of[h];
            if step.saturating_add(1) < self.ring_steps && f != usize::MAX {
                self.post_ring_step(d, f, step + 1, slice);
                return true;
            }
            return false;
        }
        let Some(m) = self.msgs.get_mut(c.wr_id as usize) else {
            return false;
        };
        if m.done_at.is_some() {
            return false;
        }
        m.done_at = Some(now);
        m.ok = c.status == WcStatus::Success;
        self.msgs_done += 1;
        self.last_completion_ns = now;
        let f = m.flow as usize;
        let flow = &mut self.flows[f];
        flow.outstanding = flow.outstanding.saturating_sub(1);
        if c.status != WcStatus::Success && !flow.failed {
            // The QP is in error: its remaining messages will never be sent.
            flow.failed = true;
            let unposted = (flow.total - flow.posted).div_ceil(u64::from(flow.msg_bytes.max(1)));
            self.expected_msgs -= unposted;
            return false;
        }
        flow.kind == FlowKind::Stream && self.post_stream(d, f)
    }

    /// Posts messages on stream flow `f` up to its outstanding limit. Returns whether any
    /// was posted.
    fn post_stream(&mut self, d: &mut Driver<Fabric>, f: usize) -> bool {
        let mut posted = false;
        loop {
            let flow = &self.flows[f];
            if flow.failed || flow.outstanding >= flow.outstanding_max || flow.posted >= flow.total
            {
                return posted;
            }
            let len = (flow.total - flow.posted).min(u64::from(flow.msg_bytes)) as u32;
            self.post_write(d, f, len, None);
            posted = true;
        }
    }

    fn post_ring_step(&mut self, d: &mut Driver<Fabric>, f: usize, step: u32, slice: u32) {
        let len = self.flows[f].msg_bytes;
        if !self.flows[f].failed {
            self.post_write(d, f, len, Some(step * self.ring_slices + slice));
        }
    }

    /// Slice `slice` of every child of `h` has landed: reduce it and pass it on to the
    /// parent, or (at the root) start its broadcast. Returns whether work was posted.
    fn tree_up_landed(&mut self, d: &mut Driver<Fabric>, h: usize, slice: u32) -> bool {
        if slice >= self.tree_slices {
            return false;
        }
        let i = h * self.tree_slices as usize + slice as usize;
        let Some(got) = self.tree_got.get_mut(i) else {
            return false;
        };
        *got += 1;
        if *got as usize != self.tree_down[h].len() {
            return false;
        }
        match self.tree_up[h] {
            usize::MAX => self.tree_send_down(d, h, slice),
            up => {
                self.post_tree_slice(d, up, slice);
                true
            }
        }
    }

    /// Sends slice `slice` of the reduced vector from `h` to each of its children.
    fn tree_send_down(&mut self, d: &mut Driver<Fabric>, h: usize, slice: u32) -> bool {
        if slice >= self.tree_slices {
            return false;
        }
        for k in 0..self.tree_down[h].len() {
            let f = self.tree_down[h][k];
            self.post_tree_slice(d, f, slice);
        }
        !self.tree_down[h].is_empty()
    }

    fn post_tree_slice(&mut self, d: &mut Driver<Fabric>, f: usize, slice: u32) {
        let len = self.flows[f].msg_bytes;
        if !self.flows[f].failed {
            self.post_write(d, f, len, Some(slice));
        }
    }

    fn post_write(&mut self, d: &mut Driver<Fabric>, f: usize, len: u32, imm: Option<u32>) {
        let now = d.now.as_nanos();
        let flow = &mut self.flows[f];
        let wr_id = self.msgs.len() as u64;
        let op = match imm {
            Some(i) => SendOp::WriteImm(flow.remote, i),
            None => SendOp::Write(flow.remote),
        };
        let wr = SendWr {
            wr_id,
            op,
            sges: vec![Sge {
                lkey: self.res[flow.from].src.lkey,
                offset: 0,
                len,
            }],
            signaled: true,
        };
        d.ep_mut(flow.from)
            .post_send(flow.qp_from, wr)
            .expect("send queue room and a valid region");
        flow.posted += u64::from(len);
        flow.outstanding += 1;
        self.msgs.push(Msg {
            flow: f as u32,
            bytes: len,
            posted_at: now,
            done_at: None,
            ok: false,
        });
    }

    /// The lower bound on the completion time, ns (see the module docs).
    fn ideal_ns(&self, fabric: &Fabric) -> u64 {
        if let Some(t) = &self.scenario.topology {
            return self.cut_ideal_ns(t);
        }
        let ls = &self.scenario.fabric;
        let host_bps = ls.host_link_gbps * 1e9;
        let up_bps = ls.spine_link_bps() as f64 * ls.spines as f64;
        if self.ring_steps > 0 {
            let bytes = self.flows.first().map_or(0, |f| f.total) as f64;
            return (bytes * 8.0 / host_bps * 1e9).ceil() as u64;
        }
        let n = ls.hosts();
        let mut sent = vec![0f64; n];
        let mut recv = vec![0f64; n];
        let mut leaf_out = vec![0f64; ls.leaves];
        let mut leaf_in = vec![0f64; ls.leaves];
        for f in &self.flows {
            let b = f.total as f64;
            sent[f.from] += b;
            recv[f.to] += b;
            let (lf, lt) = (ls.leaf_of(f.from), ls.leaf_of(f.to));
            if lf != lt {
                leaf_out[lf] += b;
                leaf_in[lt] += b;
            }
        }
        let host = sent.iter().chain(&recv).fold(0f64, |a, &b| a.max(b)) / host_bps;
        // The links into leaf 0 may be degraded (`Scenario::downlinks`): its share of the
        // spines' capacity is what they carry now.
        let into_leaf0: f64 = fabric
            .tier_ports(1, 0)
            .iter()
            .take(ls.spines)
            .map(|&p| fabric.port(p).bandwidth_bps as f64)
            .sum();
        let leaf = leaf_out
            .iter()
            .map(|&b| b / up_bps)
            .chain(
                leaf_in
                    .iter()
                    .enumerate()
                    .map(|(l, &b)| b / if l == 0 { into_leaf0 } else { up_bps }),
            )
            .fold(0f64, f64::max);
        (host.max(leaf) * 8.0 * 1e9).ceil() as u64
    }

    /// The lower bound on a fabric other than the leaf-spine: the largest of, for each host,
    /// the bytes it sends or receives over its link's rate, and for each group of each cut
    /// ([`Topo::cuts`]: leaves, pods, sites), the bytes its hosts send out of it or receive
    /// into it over the capacity that joins it to the rest.
    fn cut_ideal_ns(&self, t: &Topo) -> u64 {
        let n = t.hosts();
        let mut sent = vec![0f64; n];
        let mut recv = vec![0f64; n];
        for f in &self.flows {
            sent[f.from] += f.total as f64;
            recv[f.to] += f.total as f64;
        }
        let mut bound = sent.iter().chain(&recv).fold(0f64, |a, &b| a.max(b)) / t.host_link_bps();
        for cut in t.cuts() {
            let groups = cut.capacity_bps.len();
            let (mut out, mut inn) = (vec![0f64; groups], vec![0f64; groups]);
            for f in &self.flows {
                let (a, b) = (cut.group_of[f.from] as usize, cut.group_of[f.to] as usize);
                if a != b && a < groups && b < groups {
                    out[a] += f.total as f64;
                    inn[b] += f.total as f64;
                }
            }
            for g in 0..groups {
                let cap = cut.capacity_bps[g];
                if cap > 0.0 {
                    bound = bound.max(out[g].max(inn[g]) / cap);
                }
            }
        }
        (bound * 8.0 * 1e9).ceil() as u64
    }

    /// Mean over flows of `min(1, ideal / completion of the flow's last message)`, the ideal
    /// being the job's lower bound scaled by the flow's share of the largest flow's bytes.
    fn flow_effective_bw(&self, fabric: &Fabric) -> f64 {
        let mut last = vec![0u64; self.flows.len()];
        for m in &self.msgs {
            let f = m.flow as usize;
            last[f] = last[f].max(m.done_at.unwrap_or(0));
        }
        let ideal = self.ideal_ns(fabric) as f64;
        let biggest = self.flows.iter().map(|f| f.total).max().unwrap_or(1).max(1) as f64;
        let sum: f64 = self
            .flows
            .iter()
            .zip(&last)
            .filter(|(_, t)| **t > 0)
            .map(|(f, &t)| (ideal * f.total as f64 / biggest / t as f64).min(1.0))
            .sum();
        sum / self.flows.len().max(1) as f64
    }

    /// Collects the report of the run `d` drove.
    fn report(&self, d: &Driver<Fabric>, wall_s: f64, cpu_s: f64) -> Report {
        let fabric = &d.net;
        let mut mct: Vec<u64> = self
            .msgs
            .iter()
            .filter_map(|m| Some(m.done_at? - m.posted_at))
            .collect();
        mct.sort_unstable();
        let ok: Vec<&Msg> = self.msgs.iter().filter(|m| m.ok).collect();
        let payload_bytes: u64 = ok.iter().map(|m| u64::from(m.bytes)).sum();
        let failed = self
            .msgs
            .iter()
            .filter(|m| m.done_at.is_some() && !m.ok)
            .count() as u64;
        let finish_ns = self.last_completion_ns.max(1);
        let ideal_ns = self.ideal_ns(fabric);
        let finished = self.done() && failed == 0 && !self.flows.iter().any(|f| f.failed);
        let mut senders: Vec<usize> = self.flows.iter().map(|f| f.from).collect();
        senders.sort_unstable();
        senders.dedup();
        let goodput = payload_bytes as f64 * 8.0 / finish_ns as f64 / senders.len().max(1) as f64;

        let (mut retransmits, mut rto_fired, mut repaths) = (0, 0, 0);
        for ep in d.endpoints() {
            retransmits += ep.stats().retransmits;
            rto_fired += ep.stats().rto_fired;
        }
        for f in &self.flows {
            if let Some(s) = d.ep(f.from).qp_stats(f.qp_from) {
                repaths += s.repaths;
            }
        }
        let fs = fabric.stats();
        let switch_ports: Vec<PortId> = fabric
            .ports()
            .filter(|p| {
                matches!(
                    fabric.node_kind(fabric.port_ends(*p).0),
                    NodeKind::Switch { .. }
                )
            })
            .collect();
        let mut max_queue_bytes = 0;
        let (mut seen, mut pkts) = (0u64, 0u64);
        for p in &switch_ports {
            let s = fabric.port_stats(*p);
            max_queue_bytes = max_queue_bytes.max(s.max_queue_bytes);
            seen += s.queue_seen_sum;
            pkts += s.packets - s.trimmed;
        }
        let mean_queue_bytes = if pkts == 0 {
            0.0
        } else {
            seen as f64 / pkts as f64
        };
        let uplinks = fabric.tier_ports(0, 1);
        // Per leaf: its busiest uplink over the mean of its uplinks; the worst leaf counts.
        let mut per_leaf: Vec<(f64, f64, u32)> = vec![(0.0, 0.0, 0); self.scenario.fabric.leaves];
        if self.scenario.topology.is_some() {
            per_leaf.clear();
        }
        for p in &uplinks {
            let leaf = match fabric.node_kind(fabric.port_ends(*p).0) {
                NodeKind::Switch { index, .. } => index as usize,
                NodeKind::Host(_) => continue,
            };
            let b = fabric.port_stats(*p).bytes as f64;
            if self.scenario.topology.is_some() && per_leaf.len() <= leaf {
                per_leaf.resize(leaf + 1, (0.0, 0.0, 0));
            }
            if let Some(l) = per_leaf.get_mut(leaf) {
                l.0 = l.0.max(b);
                l.1 += b;
                l.2 += 1;
            }
        }
        let uplink_imbalance = per_leaf
            .iter()
            .filter(|l| l.1 > 0.0)
            .map(|l| l.0 / (l.1 / f64::from(l.2)))
            .fold(0.0, f64::max);

        let mut plots = self.plots(fabric, &switch_ports, &uplinks, finish_ns);
        plots.flow_done_ns = {
            let mut last = vec![0u64; self.flows.len()];
            for m in &self.msgs {
                last[m.flow as usize] = last[m.flow as usize].max(m.done_at.unwrap_or(0));
            }
            last.sort_unstable();
            last
        };
        let jobs = if matches!(self.scenario.workload, Workload::MixedTenant { .. }) {
            ["background", "latency"]
                .iter()
                .enumerate()
                .map(|(j, name)| self.job_stats(j as u8, name))
                .filter(|s| s.messages > 0)
                .collect()
        } else {
            Vec::new()
        };
        Report {
            workload: self.scenario.workload.name().to_string(),
            mode: self.scenario.mode.name.clone(),
            hosts: d.host_count(),
            seed: self.scenario.seed,
            finished,
            messages: ok.len() as u64,
            failed,
            payload_bytes,
            finish_ns,
            ideal_ns,
            effective_bw: ideal_ns as f64 / finish_ns as f64,
            flow_effective_bw: self.flow_effective_bw(fabric),
            goodput_gbps_per_sender: goodput,
            mct_p50_ns: quantile(&mct, 0.5),
            mct_p99_ns: quantile(&mct, 0.99),
            mct_max_ns: mct.last().copied().unwrap_or(0),
            retransmits,
            rto_fired,
            repaths,
            drops: fs.drops,
            trimmed: fs.trimmed,
            ecn_marks: fs.ecn_marks,
            max_queue_bytes,
            steady_max_queue_bytes: plots
                .max_queue_bytes
                .iter()
                .skip(plots.max_queue_bytes.len() / 2)
                .fold(0.0, |a: f64, &b| a.max(b)) as usize,
            mean_queue_bytes,
            uplink_imbalance,
            datagrams: fs.sent,
            hops: fs.hops,
            wall_s,
            cpu_s,
            datagrams_per_s: per_s(fs.sent, cpu_s),
            hops_per_s: per_s(fs.hops, cpu_s),
            jobs,
            plots,
        }
    }

    /// Completion times of job `job`'s messages.
    fn job_stats(&self, job: u8, name: &str) -> JobStats {
        let mut mct: Vec<u64> = Vec::new();
        let mut finish = 0;
        for m in &self.msgs {
            if self.flows[m.flow as usize].job != job {
                continue;
            }
            if let Some(t) = m.done_at {
                mct.push(t - m.posted_at);
                finish = finish.max(t);
            }
        }
        mct.sort_unstable();
        JobStats {
            name: name.to_string(),
            messages: mct.len() as u64,
            finish_ns: finish,
            mct_p50_ns: quantile(&mct, 0.5),
            mct_p99_ns: quantile(&mct, 0.99),
            mct_max_ns: mct.last().copied().unwrap_or(0),
        }
    }

    fn plots(
        &self,
        fabric: &Fabric,
        switch_ports: &[PortId],
        uplinks: &[PortId],
        finish_ns: u64,
    ) -> Plots {
        let Some(series) = fabric.series() else {
            return Plots::default();
        };
        let interval = series.interval_ns;
        let buckets = (finish_ns.div_ceil(interval) as usize).min(series.len());
        let mut delivered = vec![0u64; buckets];
        for p in fabric.host_facing_ports() {
            for (i, b) in series.port(p).iter().take(buckets).enumerate() {
                delivered[i] += b.bytes;
            }
        }
        let mut queue = vec![0u32; buckets];
        let mut samples = Vec::new();
        for p in switch_ports {
            for (i, b) in series.port(*p).iter().take(buckets).enumerate() {
                queue[i] = queue[i].max(b.max_queue_bytes);
                if b.bytes > 0 {
                    samples.push(u64::from(b.max_queue_bytes));
                }
            }
        }
        samples.sort_unstable();
        let queue_cdf_bytes = if samples.is_empty() {
            Vec::new()
        } else {
            (0..=100)
                .map(|q| quantile(&samples, f64::from(q) / 100.0) as f64)
                .collect()
        };
        let secs = finish_ns as f64 / 1e9;
        let mut receivers: Vec<usize> = self.flows.iter().map(|f| f.to).collect();
        receivers.sort_unstable();
        receivers.dedup();
        Plots {
            receivers: receivers.len(),
            interval_ns: interval,
            delivered_gbps: delivered
                .iter()
                .map(|&b| b as f64 * 8.0 / interval as f64)
                .collect(),
            max_queue_bytes: queue.iter().map(|&q| f64::from(q)).collect(),
            uplink_gbps: uplinks
                .iter()
                .map(|p| fabric.port_stats(*p).bytes as f64 * 8.0 / secs / 1e9)
                .collect(),
            flow_done_ns: Vec::new(),
            queue_cdf_bytes,
        }
    }
}

/// `count` per `secs` seconds, 0 when the time was not measured.
fn per_s(count: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        count as f64 / secs.max(1e-9)
    } else {
        0.0
    }
}

/// Flows of a workload: `(from, to, total bytes, message bytes, outstanding)`, each flow's
/// kind and job, the ring steps (0 unless ring all-reduce) and the tree slices (0 unless tree
/// all-reduce).
struct Plan {
    flows: Vec<(usize, usize, u64, u32, u32)>,
    kinds: Vec<FlowKind>,
    jobs: Vec<u8>,
    ring_steps: u32,
    ring_slices: u32,
    tree_slices: u32,
}

fn plan(w: &Workload, n: usize, hosts_per_leaf: usize, topo: Option<&Topo>, seed: u64) -> Plan {
    let mut flows = Vec::new();
    let mut jobs = Vec::new();
    let (mut ring_steps, mut ring_slices, mut tree_slices) = (0, 0, 0);
    let groups = topo.map_or_else(|| vec![(0..n).collect()], Topo::collective_groups);
    let rails = topo.map_or(1, Topo::rails) as u64;
    match *w {
        Workload::Permutation {
            bytes_per_host,
            msg_bytes,
            outstanding,
        } => {
            let pairs = topo.map_or_else(|| derangement(n, seed), |t| t.permutation(seed));
            for (from, to) in pairs.into_iter().enumerate() {
                flows.push((from, to, bytes_per_host, msg_bytes, outstanding));
            }
        }
        Workload::Incast {
            senders,
            bytes_per_sender,
            msg_bytes,
            outstanding,
        } => {
            for from in incast_senders(n, hosts_per_leaf, senders) {
                flows.push((from, 0, bytes_per_sender, msg_bytes, outstanding));
            }
        }
        Workload::AllToAll {
            bytes_per_pair,
            msg_bytes,
            outstanding,
        } => {
            for from in 0..n {
                if let Some(t) = topo {
                    for to in t.all_to_all_peers(from) {
                        flows.push((from, to, bytes_per_pair, msg_bytes, outstanding));
                    }
                    continue;
                }
                for k in 1..n {
                    // Each host starts with a different peer, as collective libraries do.
                    let to = (from + k) % n;
                    flows.push((from, to, bytes_per_pair, msg_bytes, outstanding));
                }
            }
        }
        Workload::RingAllReduce {
            vector_bytes,
            slices,
        } => {
            let chunk = vector_bytes / n.max(1) as u64;
            ring_slices = slices.max(1);
            let slice = u32::try_from(chunk / u64::from(ring_slices))
                .unwrap_or(u32::MAX)
                .max(1);
            if topo.is_none() {
                ring_steps = 2 * (n as u32).saturating_sub(1);
                // The ring visits the leaves in turn (host 0 of every leaf, then host 1, ...),
                // so every hop crosses the spines, as a ring laid out without regard to racks
                // does.
                let order = ring_order(n, hosts_per_leaf);
                for k in 0..n {
                    let total = u64::from(slice) * u64::from(ring_slices) * u64::from(ring_steps);
                    flows.push((order[k], order[(k + 1) % n], total, slice, ring_slices));
                }
            } else {
                // One ring per collective group (per rail), every group the same size, in the
                // topology's order: `2 (m − 1)` steps of `V / n` (= `V / rails / m`).
                let m = groups.iter().map(Vec::len).max().unwrap_or(0);
                ring_steps = 2 * (m as u32).saturating_sub(1);
                for g in &groups {
                    for k in 0..g.len() {
                        let total =
                            u64::from(slice) * u64::from(ring_slices) * u64::from(ring_steps);
                        flows.push((g[k], g[(k + 1) % g.len()], total, slice, ring_slices));
                    }
                }
            }
        }
        Workload::TreeAllReduce {
            vector_bytes,
            slices,
        } => {
            // A binary tree over each group in its order (member k's parent is member
            // (k - 1) / 2), each group reducing its share of the vector.
            tree_slices = slices.max(1);
            let slice = u32::try_from(vector_bytes / rails / u64::from(tree_slices))
                .unwrap_or(u32::MAX)
                .max(1);
            let total = u64::from(slice) * u64::from(tree_slices);
            for g in &groups {
                for k in 1..g.len() {
                    let (child, parent) = (g[k], g[(k - 1) / 2]);
                    flows.push((child, parent, total, slice, tree_slices));
                    flows.push((parent, child, total, slice, tree_slices));
                }
            }
        }
        Workload::MixedTenant {
            background,
            bg_bytes_per_pair,
            bg_msg_bytes,
            lat_msg_bytes,
            lat_msgs,
        } => {
            // The latency job: every fourth host, in leaf-interleaved order (so each of its
            // messages crosses the spines, where the background job's traffic is).
            let lat: Vec<usize> = ring_order(n, hosts_per_leaf)
                .into_iter()
                .filter(|h| h % 4 == 0)
                .collect();
            let bg: Vec<usize> = (0..n).filter(|h| h % 4 != 0).collect();
            if background {
                for (j, &from) in bg.iter().enumerate() {
                    for k in 1..bg.len() {
                        let to = bg[(j + k) % bg.len()];
                        flows.push((from, to, bg_bytes_per_pair, bg_msg_bytes, 2));
                        jobs.push(0);
                    }
                }
            }
            let total = u64::from(lat_msg_bytes.max(1)) * u64::from(lat_msgs);
            for k in 0..lat.len() {
                flows.push((
                    lat[k],
                    lat[(k + 1) % lat.len()],
                    total,
                    lat_msg_bytes.max(1),
                    1,
                ));
                jobs.push(1);
            }
        }
    }
    let kinds = flows
        .iter()
        .enumerate()
        .map(|(i, _)| {
            if ring_steps > 0 {
                FlowKind::Ring
            } else if tree_slices > 0 {
                if i % 2 == 0 {
                    FlowKind::TreeUp
                } else {
                    FlowKind::TreeDown
                }
            } else {
                FlowKind::Stream
            }
        })
        .collect();
    Plan {
        flows,
        kinds,
        jobs,
        ring_steps,
        ring_slices,
        tree_slices,
    }
}

/// Hosts in ring order: slot 0 of every leaf, then slot 1, and so on.
fn ring_order(n: usize, hosts_per_leaf: usize) -> Vec<usize> {
    let hpl = hosts_per_leaf.max(1);
    let leaves = n.div_ceil(hpl);
    let mut order = Vec::with_capacity(n);
    for slot in 0..hpl {
        for l in 0..leaves {
            let h = l * hpl + slot;
            if h < n {
                order.push(h);
            }
        }
    }
    order
}

/// `senders` hosts other than host 0, taken round-robin over the leaves (host 1 of leaf 0
/// last), so an incast crosses the spines.
fn incast_senders(n: usize, hosts_per_leaf: usize, senders: usize) -> Vec<usize> {
    let hpl = hosts_per_leaf.max(1);
    let leaves = n.div_ceil(hpl);
    let mut order = Vec::with_capacity(n);
    for slot in 0..hpl {
        for l in 1..=leaves {
            let h = (l % leaves) * hpl + slot;
            if h != 0 && h < n {
                order.push(h);
            }
        }
    }
    order.truncate(senders.min(n.saturating_sub(1)));
    order
}

/// A random permutation of `0..n` with no fixed point (seeded Fisher-Yates, retried): the
/// permutation workload's pairing.
pub fn derangement(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed ^ 0x0DE2_A46E_0000_0001;
    loop {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
            p.swap(i, j);
        }
        if n < 2 || p.iter().enumerate().all(|(i, &x)| i != x) {
            return p;
        }
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `q` quantile of sorted samples (nearest rank), 0 for none.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> LeafSpine {
        LeafSpine {
            hosts_per_leaf: 2,
            leaves: 2,
            spines: 2,
            ..LeafSpine::default()
        }
    }

    /// The testbed twin's knobs reach the links into leaf 0 and only those: the marked
    /// link marks, the lossy one loses, the slow one queues and drops, and the transfer still
    /// completes byte for byte (the engine repairs the losses).
    #[test]
    fn downlink_changes_degrade_the_routes_into_leaf_0() {
        // The twin's fabric, with starker degradations so that each shows for sure.
        let mut s = Scenario::testbed_twin(4 << 20, 1);
        s.downlinks = vec![
            LinkChange {
                spine: 0,
                gbps: Some(0.05),
                queue_bytes: Some(20_000),
                ..LinkChange::default()
            },
            LinkChange {
                spine: 1,
                loss: Some(0.05),
                ..LinkChange::default()
            },
            LinkChange {
                spine: 2,
                ce_mark: Some(1.0),
                ..LinkChange::default()
            },
        ];
        let mut sim = Sim::new(&s);
        sim.run();
        assert!(sim.done(), "the transfer completes");
        let into0 = sim.fabric().tier_ports(1, 0);
        let st = |i: usize| sim.fabric().port_stats(into0[i]).clone();
        let (slow, lossy, marked, healthy) = (st(0), st(1), st(2), st(3));
        assert!(
            slow.packets > 0 && slow.max_queue_bytes > 10_000,
            "{slow:?}"
        );
        assert!(lossy.lost > 0 && lossy.ecn_marks == 0, "{lossy:?}");
        assert!(marked.ecn_marks > 0 && marked.lost == 0, "{marked:?}");
        assert!(
            healthy.lost == 0 && healthy.ecn_marks == 0 && healthy.drops == 0,
            "{healthy:?}"
        );
        // Links into leaf 1 (the ACKs' way back) are untouched.
        for &p in &into0[4..] {
            let o = sim.fabric().port_stats(p);
            assert!(o.lost == 0 && o.ecn_marks == 0, "{o:?}");
        }
    }

    #[test]
    fn derangements_have_no_fixed_point_and_replay() {
        for n in 2..40 {
            let p = derangement(n, n as u64);
            assert!(p.iter().enumerate().all(|(i, &x)| i != x));
            let mut s = p.clone();
            s.sort_unstable();
            assert_eq!(s, (0..n).collect::<Vec<_>>());
            assert_eq!(p, derangement(n, n as u64));
        }
    }

    #[test]
    fn incast_senders_spread_over_leaves() {
        assert_eq!(incast_senders(8, 2, 3), vec![2, 4, 6]);
        assert_eq!(incast_senders(8, 2, 100).len(), 7);
    }

    #[test]
    fn a_small_permutation_completes_in_every_mode() {
        for mode in [Mode::ecmp(), Mode::spray(8, 32), Mode::spray_cc(8)] {
            let w = Workload::Permutation {
                bytes_per_host: 256 << 10,
                msg_bytes: 64 << 10,
                outstanding: 2,
            };
            let r = run(&Scenario::new(tiny(), w, mode.clone(), 1));
            assert!(r.finished, "{mode:?}: {r:?}");
            assert_eq!(r.messages, 4 * 4);
            assert!(r.effective_bw > 0.3 && r.effective_bw <= 1.0, "{r:?}");
        }
    }

    #[test]
    fn a_ring_allreduce_completes() {
        let w = Workload::RingAllReduce {
            vector_bytes: 1 << 20,
            slices: 2,
        };
        let r = run(&Scenario::new(tiny(), w, Mode::spray_cc(8), 2));
        assert!(r.finished, "{r:?}");
        assert_eq!(r.messages, 4 * 6 * 2);
    }
}
