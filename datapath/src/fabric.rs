//! A discrete-event model of a switched fabric on virtual time: hosts with one NIC each,
//! switches with an output queue per port, links with a bandwidth and a propagation delay, and
//! ECMP hashing of the 5-tuple at every switch.
//!
//! What it does not do: read a clock, start threads, touch a socket, or know anything of the
//! protocol it carries. It has no PFC (it is lossy Ethernet), no shared switch buffer (each
//! output port has its own byte limit), no cut-through forwarding (a switch forwards a packet
//! once all of it has arrived), and no routing protocol (routes are the shortest paths of the
//! topology, computed once by [`Topology::build`]).
//!
//! # The model
//!
//! A [`Topology`] is a graph of hosts and switches joined by pairs of directed *ports*; each
//! port is the output queue of its node plus the link to the next one, with its own
//! [`PortConfig`]. [`LeafSpine`] builds the usual two-tier Clos; [`RailOptimized`],
//! [`ThreeTier`] and [`ScaleAcross`] the larger shapes of AI clusters (see their module). A packet a host sends goes
//! through its NIC port to its switch; each switch looks up the equal-cost output ports
//! towards the destination host and picks one by hashing the packet's 5-tuple
//! `(src ip, dst ip, src port, dst port, 17)` with a per-switch seed, so one flow always takes
//! one route while different source ports (Braid's paths) spread over the routes, as on a real
//! fabric.
//!
//! At each port, in this order:
//!
//! 1. a black-holed port drops the packet; a port with random `loss` drops it with that
//!    probability (each port has its own seeded random stream);
//! 2. **drop-tail**: if the bytes queued (the packet in service included) plus the packet
//!    would exceed `queue_bytes`, the packet is dropped, or, with `trim`, cut to its first
//!    [`TRIM_PAYLOAD_BYTES`] bytes and forwarded in a strict-priority lane (as Ultra
//!    Ethernet's packet trimming does; Braid's CRC then rejects the stub, so for Braid a trim
//!    is a loss that arrives early);
//! 3. **ECN**: an ECN-capable packet (ECT(0) or ECT(1)) is marked CE when more than
//!    `ecn_threshold_bytes` are queued ahead of it;
//! 4. **serialization**: the port sends one packet at a time at `bandwidth_bps`; a packet's
//!    wire size is its UDP payload plus [`FabricConfig::frame_overhead_bytes`] (Ethernet,
//!    IP and UDP headers, preamble and inter-frame gap);
//! 5. **propagation**: the packet arrives at the next node `prop_delay_ns` after its last
//!    bit left.
//!
//! Queues are FIFO and work-conserving, so a packet's departure time is known when it is
//! queued: the model needs one event per hop (the arrival at the next node), kept in a binary
//! heap ordered by `(time, sequence)`. The priority lane of trimmed stubs is modelled as
//! using no data-lane capacity (a stub is a few dozen bytes).
//!
//! # Determinism
//!
//! Nothing here reads a clock or OS entropy. The ECMP seeds and the loss streams derive from
//! the seed given to [`Topology::build`]; ties between events at the same nanosecond are
//! broken by the order the packets were queued. The same topology, seed and sequence of calls
//! give exactly the same deliveries and counters.
//!
//! # Driving it
//!
//! [`Fabric`] is the switched topology of the [`Network`] trait (the other is the per-path
//! links of [`SimNet`](crate::sim::SimNet)). Like it: [`Fabric::send`] puts a datagram on a
//! host's NIC,
//! [`Fabric::next_event`] says when something next happens inside the fabric, and
//! [`Fabric::poll_deliver`] runs the fabric up to `now` and hands out the datagrams that
//! reached a host by then, earliest first. A host's NIC has a queue like any port; a driver
//! that models a real NIC's backpressure asks [`Fabric::nic_backlog_bytes`] before sending
//! and [`Fabric::nic_drained_at`] for when to come back, instead of overflowing it.
//!
//! ```
//! use braid_datapath::fabric::LeafSpine;
//! use braid_datapath::net::Network;
//! use braid_datapath::{Ecn, Transmit};
//! use braid_time::Timestamp;
//!
//! let ls = LeafSpine { hosts_per_leaf: 2, leaves: 2, spines: 2, ..LeafSpine::default() };
//! let mut fabric = ls.build(7);
//! let (a, b) = (ls.host_addr(0), ls.host_addr(3));
//! let payload = [0u8; 1000];
//! let t = Transmit { dest: b, path: 5, ecn: Ecn::Ect0, contents: &payload };
//! assert!(fabric.send(Timestamp::ZERO, fabric.host_by_addr(a).unwrap(), &t));
//! // Host, leaf, spine, leaf, host: four links, each 1 µs away and 1066 bytes at 100 Gb/s.
//! let at = fabric.next_event().unwrap();
//! assert!(fabric.poll_deliver(at).is_none());
//! let d = loop {
//!     let at = fabric.next_event().unwrap();
//!     if let Some(d) = fabric.poll_deliver(at) {
//!         break d;
//!     }
//! };
//! assert_eq!((d.meta.src.port(), d.bytes.len()), (4791 + 1 + 5, 1000));
//! assert_eq!(fabric.stats().hops, 4);
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use braid_time::Timestamp;

use crate::net::rng::{mix64, splitmix64, unit};
use crate::net::{AddrMap, EventQueue, Network, path_source};
pub use crate::net::{Delivery, HostId};
use crate::{Ecn, RecvMeta, Transmit};

mod shapes;
pub use shapes::{
    Cut, FIBRE_NS_PER_KM, RailOptimized, ScaleAcross, SwitchPorts, ThreeTier, clos_host_addr,
};

/// Payload bytes a trimmed packet keeps (enough for Braid's header and a little more).
pub const TRIM_PAYLOAD_BYTES: usize = 64;

/// Bytes a frame adds to its UDP payload on an Ethernet link: Ethernet header (14) and FCS
/// (4), IPv4 (20), UDP (8), preamble (8) and the inter-frame gap (12).
pub const ETHERNET_IPV4_UDP_OVERHEAD: u32 = 66;

/// Most nodes (hosts plus switches) a topology may have.
pub const MAX_NODES: usize = 1 << 20;

/// A node of the topology: a host or a switch, numbered in the order they were added.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

/// A directed port: the output queue of one node and the link to the next.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId(pub u32);

/// What a node is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// An endpoint with one NIC.
    Host(HostId),
    /// A switch; `tier` is for the caller's bookkeeping (a leaf-spine uses 0 for leaves, 1
    /// for spines) and `index` counts switches of that tier.
    Switch {
        /// Tier of the switch.
        tier: u8,
        /// Index among the switches of its tier.
        index: u32,
    },
}

/// The knobs of one port: its link and its output queue. Change them between runs or during
/// one with [`Fabric::port_mut`].
#[derive(Debug, Clone, PartialEq)]
pub struct PortConfig {
    /// Link rate in bits per second; 0 is a port that never drains (everything is dropped).
    pub bandwidth_bps: u64,
    /// Propagation delay of the link, ns (cable plus the next switch's pipeline).
    pub prop_delay_ns: u64,
    /// Byte limit of the output queue, frame overhead included (drop-tail or trim above it).
    pub queue_bytes: usize,
    /// Mark ECN-capable packets CE when more than this many bytes are queued ahead of them.
    pub ecn_threshold_bytes: Option<usize>,
    /// Trim instead of dropping when the queue is full.
    pub trim: bool,
    /// Probability that a packet is dropped at this port (a bad link).
    pub loss: f64,
    /// Probability that an ECN-capable packet is marked CE at this port whatever the queue
    /// (a link an AQM or a middlebox marks heavily, as the namespace testbed's marked link).
    pub ce_mark: f64,
    /// Drop every packet (a failed link).
    pub blackhole: bool,
}

impl PortConfig {
    /// A link of `gbps` Gbit/s, `prop_delay_ns` away, with a `queue_bytes` drop-tail queue
    /// and nothing else.
    pub fn new(gbps: f64, prop_delay_ns: u64, queue_bytes: usize) -> Self {
        PortConfig {
            bandwidth_bps: gbps_to_bps(gbps),
            prop_delay_ns,
            queue_bytes,
            ecn_threshold_bytes: None,
            trim: false,
            loss: 0.0,
            ce_mark: 0.0,
            blackhole: false,
        }
    }
}

/// Fabric-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricConfig {
    /// Bytes every frame adds to its payload on the wire and in queues. Default
    /// [`ETHERNET_IPV4_UDP_OVERHEAD`].
    pub frame_overhead_bytes: u32,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            frame_overhead_bytes: ETHERNET_IPV4_UDP_OVERHEAD,
        }
    }
}

/// Why a topology cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopologyError {
    /// A host has no port, or more than one (hosts have exactly one NIC).
    HostPorts(HostId),
    /// Two hosts have the same address.
    DuplicateAddress(SocketAddr),
    /// More than [`MAX_NODES`] nodes.
    TooLarge,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::HostPorts(h) => write!(f, "host {} must have exactly one port", h.0),
            TopologyError::DuplicateAddress(a) => write!(f, "two hosts have address {a}"),
            TopologyError::TooLarge => write!(f, "more than {MAX_NODES} nodes"),
        }
    }
}

impl std::error::Error for TopologyError {}

/// A graph of hosts and switches to build a [`Fabric`] from.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    cfg: FabricConfig,
    nodes: Vec<NodeSpec>,
    hosts: Vec<(NodeId, SocketAddr)>,
    switches_per_tier: Vec<u32>,
    ports: Vec<PortSpec>,
}

#[derive(Debug, Clone)]
struct NodeSpec {
    kind: NodeKind,
    ports: Vec<u32>,
}

#[derive(Debug, Clone)]
struct PortSpec {
    from: u32,
    to: u32,
    cfg: PortConfig,
}

impl Topology {
    /// An empty topology with fabric-wide settings `cfg`.
    pub fn new(cfg: FabricConfig) -> Self {
        Topology {
            cfg,
            ..Topology::default()
        }
    }

    /// Adds a host that receives at `addr` (and sends from `addr.port() + 1 + path`, as
    /// [`path_source`]).
    pub fn add_host(&mut self, addr: SocketAddr) -> NodeId {
        let id = HostId(self.hosts.len() as u32);
        let node = NodeId(self.nodes.len() as u32);
        self.nodes.push(NodeSpec {
            kind: NodeKind::Host(id),
            ports: Vec::new(),
        });
        self.hosts.push((node, addr));
        node
    }

    /// Adds a switch of tier `tier`.
    pub fn add_switch(&mut self, tier: u8) -> NodeId {
        let t = usize::from(tier);
        if self.switches_per_tier.len() <= t {
            self.switches_per_tier.resize(t + 1, 0);
        }
        let index = self.switches_per_tier[t];
        self.switches_per_tier[t] += 1;
        let node = NodeId(self.nodes.len() as u32);
        self.nodes.push(NodeSpec {
            kind: NodeKind::Switch { tier, index },
            ports: Vec::new(),
        });
        node
    }

    /// Joins `a` and `b` with a link: the port `a → b` gets `a_to_b`, the port `b → a` gets
    /// `b_to_a`. Returns the two ports.
    ///
    /// # Panics
    ///
    /// If `a` or `b` is not a node of this topology.
    pub fn connect(
        &mut self,
        a: NodeId,
        b: NodeId,
        a_to_b: PortConfig,
        b_to_a: PortConfig,
    ) -> (PortId, PortId) {
        assert!(
            (a.0 as usize) < self.nodes.len() && (b.0 as usize) < self.nodes.len(),
            "connect: unknown node"
        );
        let pa = self.ports.len() as u32;
        self.ports.push(PortSpec {
            from: a.0,
            to: b.0,
            cfg: a_to_b,
        });
        self.ports.push(PortSpec {
            from: b.0,
            to: a.0,
            cfg: b_to_a,
        });
        self.nodes[a.0 as usize].ports.push(pa);
        self.nodes[b.0 as usize].ports.push(pa + 1);
        (PortId(pa), PortId(pa + 1))
    }

    /// Computes the routes (every shortest path from each switch to each host) and returns
    /// the fabric, whose ECMP seeds and loss streams derive from `seed`.
    pub fn build(self, seed: u64) -> Result<Fabric, TopologyError> {
        if self.nodes.len() > MAX_NODES {
            return Err(TopologyError::TooLarge);
        }
        let mut addrs = AddrMap::with_capacity_and_hasher(self.hosts.len(), Default::default());
        for (i, (node, addr)) in self.hosts.iter().enumerate() {
            if self.nodes[node.0 as usize].ports.len() != 1 {
                return Err(TopologyError::HostPorts(HostId(i as u32)));
            }
            if addrs.insert(*addr, i as u32).is_some() {
                return Err(TopologyError::DuplicateAddress(*addr));
            }
        }
        let n_hosts = self.hosts.len();
        let mut switch_index = vec![u32::MAX; self.nodes.len()];
        let mut n_switches = 0u32;
        for (i, n) in self.nodes.iter().enumerate() {
            if matches!(n.kind, NodeKind::Switch { .. }) {
                switch_index[i] = n_switches;
                n_switches += 1;
            }
        }

        // Shortest paths towards each host (breadth-first from the host, through switches
        // only: hosts do not forward), then for each switch the ports one step closer.
        let mut routes = vec![NO_ROUTE; n_switches as usize * n_hosts];
        let mut groups: Vec<(u32, u32)> = Vec::new();
        let mut group_ports: Vec<u32> = Vec::new();
        let mut group_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        let mut dist = vec![u32::MAX; self.nodes.len()];
        let mut queue = VecDeque::new();
        let mut members = Vec::new();
        for (h, (hnode, _)) in self.hosts.iter().enumerate() {
            dist.fill(u32::MAX);
            dist[hnode.0 as usize] = 0;
            queue.clear();
            queue.push_back(hnode.0);
            while let Some(n) = queue.pop_front() {
                let nk = self.nodes[n as usize].kind;
                if n != hnode.0 && matches!(nk, NodeKind::Host(_)) {
                    continue;
                }
                for &p in &self.nodes[n as usize].ports {
                    let next = self.ports[p as usize].to;
                    if dist[next as usize] == u32::MAX {
                        dist[next as usize] = dist[n as usize] + 1;
                        queue.push_back(next);
                    }
                }
            }
            for (s, node) in self.nodes.iter().enumerate() {
                let si = switch_index[s];
                if si == u32::MAX || dist[s] == u32::MAX {
                    continue;
                }
                members.clear();
                for &p in &node.ports {
                    let to = self.ports[p as usize].to;
                    let is_switch_or_dst = to == hnode.0
                        || matches!(self.nodes[to as usize].kind, NodeKind::Switch { .. });
                    if is_switch_or_dst && dist[to as usize].saturating_add(1) == dist[s] {
                        members.push(p);
                    }
                }
                if members.is_empty() {
                    continue;
                }
                let id = *group_ids.entry(members.clone()).or_insert_with(|| {
                    groups.push((group_ports.len() as u32, members.len() as u32));
                    group_ports.extend_from_slice(&members);
                    (groups.len() - 1) as u32
                });
                routes[si as usize * n_hosts + h] = id;
            }
        }

        let mut state = seed ^ 0xFAB2_1C00_0000_0000;
        let node_seeds = (0..self.nodes.len())
            .map(|_| splitmix64(&mut state))
            .collect();
        let ports = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let to_host = match self.nodes[p.to as usize].kind {
                    NodeKind::Host(h) => h.0,
                    NodeKind::Switch { .. } => u32::MAX,
                };
                let mut s = seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
                let from_switch =
                    matches!(self.nodes[p.from as usize].kind, NodeKind::Switch { .. });
                Port::new(
                    p.cfg.clone(),
                    p.from,
                    p.to,
                    to_host,
                    from_switch,
                    splitmix64(&mut s),
                )
            })
            .collect();
        let host_port = self
            .hosts
            .iter()
            .map(|(n, _)| self.nodes[n.0 as usize].ports[0])
            .collect();
        Ok(Fabric {
            seed,
            overhead: self.cfg.frame_overhead_bytes,
            kinds: self.nodes.iter().map(|n| n.kind).collect(),
            node_seeds,
            switch_index,
            n_hosts,
            host_addrs: self.hosts.iter().map(|(_, a)| *a).collect(),
            host_port,
            addrs,
            routes,
            groups,
            group_ports,
            ports,
            pkts: Vec::new(),
            free_pkts: Vec::new(),
            heads: EventQueue::new(),
            in_flight: 0,
            pool: Vec::new(),
            small_pool: Vec::new(),
            stats: FabricStats::default(),
            series: None,
            hop_stamp: None,
        })
    }
}

/// A two-tier leaf-spine (folded Clos) fabric: `leaves` leaf switches with `hosts_per_leaf`
/// hosts each, every leaf joined to every one of `spines` spine switches by one link.
///
/// Host `i` is under leaf `i / hosts_per_leaf`, at [`host_addr(i)`](LeafSpine::host_addr)
/// (`10.0.0.1` onwards, port `port`). Traffic between hosts of one leaf stays in the leaf;
/// traffic between leaves crosses one spine, chosen by ECMP at the leaf.
#[derive(Debug, Clone, PartialEq)]
pub struct LeafSpine {
    /// Hosts under each leaf.
    pub hosts_per_leaf: usize,
    /// Leaf switches.
    pub leaves: usize,
    /// Spine switches.
    pub spines: usize,
    /// Rate of each leaf–spine link, Gbit/s (unless `oversubscription` sets it).
    pub link_gbps: f64,
    /// Rate of each host link (NIC to leaf and back), Gbit/s.
    pub host_link_gbps: f64,
    /// When set, the leaf–spine rate is chosen so that a leaf's host-facing capacity is this
    /// many times its spine-facing capacity: `hosts_per_leaf × host_link_gbps / (spines ×
    /// oversubscription)`, overriding `link_gbps`. 1.0 is full bisection bandwidth.
    pub oversubscription: Option<f64>,
    /// Propagation delay of every link, ns.
    pub prop_delay_ns: u64,
    /// Byte limit of every switch output queue (and of the NIC queues).
    pub queue_bytes: usize,
    /// ECN marking threshold of every switch output queue (NICs never mark).
    pub ecn_threshold_bytes: Option<usize>,
    /// Whether switches trim instead of dropping.
    pub trim: bool,
    /// UDP port hosts receive on.
    pub port: u16,
    /// Fabric-wide settings.
    pub fabric: FabricConfig,
}

impl Default for LeafSpine {
    /// 8 leaves of 8 hosts and 8 spines (64 hosts, full bisection), 100 Gbit/s everywhere,
    /// 1 µs per link, 512 KiB per output queue, ECN above 100 KB, no trimming, port 4791.
    fn default() -> Self {
        LeafSpine {
            hosts_per_leaf: 8,
            leaves: 8,
            spines: 8,
            link_gbps: 100.0,
            host_link_gbps: 100.0,
            oversubscription: None,
            prop_delay_ns: 1_000,
            queue_bytes: 512 << 10,
            ecn_threshold_bytes: Some(100_000),
            trim: false,
            port: 4791,
            fabric: FabricConfig::default(),
        }
    }
}

impl LeafSpine {
    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts_per_leaf * self.leaves
    }

    /// The address of host `i`: `10.0.0.1 + i`, port `port`.
    pub fn host_addr(&self, i: usize) -> SocketAddr {
        let ip = Ipv4Addr::from(0x0A00_0001u32.wrapping_add(i as u32));
        SocketAddr::new(IpAddr::V4(ip), self.port)
    }

    /// The leaf host `i` is under.
    pub fn leaf_of(&self, i: usize) -> usize {
        i / self.hosts_per_leaf.max(1)
    }

    /// Rate of each leaf–spine link, bits per second.
    pub fn spine_link_bps(&self) -> u64 {
        match self.oversubscription {
            Some(o) if o > 0.0 && self.spines > 0 => gbps_to_bps(
                self.hosts_per_leaf as f64 * self.host_link_gbps / (self.spines as f64 * o),
            ),
            _ => gbps_to_bps(self.link_gbps),
        }
    }

    /// A leaf's host-facing capacity over its spine-facing capacity (1.0: full bisection).
    pub fn oversubscription_ratio(&self) -> f64 {
        let up = self.spine_link_bps() as f64 * self.spines as f64;
        let down = gbps_to_bps(self.host_link_gbps) as f64 * self.hosts_per_leaf as f64;
        if up > 0.0 { down / up } else { f64::INFINITY }
    }

    /// The topology: hosts first (nodes `0..hosts()`), then leaves (tier 0), then spines
    /// (tier 1).
    pub fn topology(&self) -> Topology {
        let mut t = Topology::new(self.fabric.clone());
        let switch_port = |bps: u64| PortConfig {
            bandwidth_bps: bps,
            prop_delay_ns: self.prop_delay_ns,
            queue_bytes: self.queue_bytes,
            ecn_threshold_bytes: self.ecn_threshold_bytes,
            trim: self.trim,
            loss: 0.0,
            ce_mark: 0.0,
            blackhole: false,
        };
        let host_bps = gbps_to_bps(self.host_link_gbps);
        let nic = PortConfig {
            ecn_threshold_bytes: None,
            trim: false,
            ..switch_port(host_bps)
        };
        let hosts: Vec<NodeId> = (0..self.hosts())
            .map(|i| t.add_host(self.host_addr(i)))
            .collect();
        let leaves: Vec<NodeId> = (0..self.leaves).map(|_| t.add_switch(0)).collect();
        let spines: Vec<NodeId> = (0..self.spines).map(|_| t.add_switch(1)).collect();
        for (i, h) in hosts.iter().enumerate() {
            t.connect(
                *h,
                leaves[self.leaf_of(i)],
                nic.clone(),
                switch_port(host_bps),
            );
        }
        let up = self.spine_link_bps();
        for l in &leaves {
            for s in &spines {
                t.connect(*l, *s, switch_port(up), switch_port(up));
            }
        }
        t
    }

    /// The fabric, seeded with `seed`.
    pub fn build(&self, seed: u64) -> Fabric {
        self.topology()
            .build(seed)
            .expect("a leaf-spine gives each host one port and distinct addresses")
    }
}

/// Counters of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
// The four a hop updates first, in the port's second cache line (see `Port`).
#[repr(C)]
pub struct PortStats {
    /// Packets accepted into the queue (trimmed stubs included).
    pub packets: u64,
    /// Wire bytes accepted (frame overhead included).
    pub bytes: u64,
    /// Most bytes ever queued (the packet in service included), at most `queue_bytes`.
    pub max_queue_bytes: usize,
    /// Sum over accepted data packets of the bytes queued ahead of them.
    pub queue_seen_sum: u64,
    /// Packets dropped at the tail.
    pub drops: u64,
    /// Packets trimmed instead of dropped.
    pub trimmed: u64,
    /// Packets marked CE.
    pub ecn_marks: u64,
    /// Packets dropped by random loss.
    pub lost: u64,
    /// Packets dropped because the port was black-holed.
    pub blackholed: u64,
}

impl PortStats {
    /// Mean bytes queued ahead of a packet, as arriving packets saw it.
    pub fn mean_queue_bytes(&self) -> f64 {
        let data = self.packets - self.trimmed;
        if data == 0 {
            0.0
        } else {
            self.queue_seen_sum as f64 / data as f64
        }
    }
}

/// Fabric-wide counters.
///
/// `sent == delivered + drops + lost + blackholed + no_route + unknown_dest + in_flight`:
/// trimmed packets are delivered (short).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Datagrams handed to [`Fabric::send`].
    pub sent: u64,
    /// Datagrams handed out by [`Fabric::poll_deliver`].
    pub delivered: u64,
    /// Packets queued at a port: one per hop.
    pub hops: u64,
    /// Packets dropped at the tail of a queue.
    pub drops: u64,
    /// Packets trimmed.
    pub trimmed: u64,
    /// Packets marked CE.
    pub ecn_marks: u64,
    /// Packets dropped by random loss.
    pub lost: u64,
    /// Packets dropped at a black-holed port.
    pub blackholed: u64,
    /// Packets a switch had no route for.
    pub no_route: u64,
    /// Datagrams addressed to no host.
    pub unknown_dest: u64,
}

/// Per-port time series, in buckets of `interval_ns`; see [`Fabric::enable_series`].
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Bucket width, ns.
    pub interval_ns: u64,
    ports: Vec<Vec<Bucket>>,
    /// The last bucket looked up and where it starts: hops come in time order, so most fall
    /// in it, and skip the division (two per hop cost more than the rest of the recording).
    last: (usize, u64),
}

/// One bucket of one port's time series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Wire bytes whose serialization ended in this bucket.
    pub bytes: u64,
    /// Most bytes queued at any enqueue in this bucket.
    pub max_queue_bytes: u32,
}

impl Series {
    /// The buckets of `port` (trailing empty buckets may be missing).
    pub fn port(&self, port: PortId) -> &[Bucket] {
        self.ports.get(port.0 as usize).map_or(&[], Vec::as_slice)
    }

    /// Number of buckets of the longest port series.
    pub fn len(&self) -> usize {
        self.ports.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bucket(&mut self, port: u32, at_ns: u64) -> &mut Bucket {
        let (mut b, start) = self.last;
        if at_ns < start || at_ns - start >= self.interval_ns {
            let interval = self.interval_ns.max(1);
            b = (at_ns / interval) as usize;
            self.last = (b, b as u64 * interval);
        }
        let v = &mut self.ports[port as usize];
        if v.len() <= b {
            v.resize(b + 1, Bucket::default());
        }
        &mut v[b]
    }
}

/// A fabric of hosts and switches; see the [module docs](self).
#[derive(Debug)]
pub struct Fabric {
    seed: u64,
    overhead: u32,
    kinds: Vec<NodeKind>,
    node_seeds: Vec<u64>,
    switch_index: Vec<u32>,
    n_hosts: usize,
    host_addrs: Vec<SocketAddr>,
    host_port: Vec<u32>,
    addrs: AddrMap<u32>,
    /// `routes[switch * n_hosts + host]`: index into `groups`, or `NO_ROUTE`.
    routes: Vec<u32>,
    /// `(start, len)` in `group_ports`: the equal-cost output ports of a route.
    groups: Vec<(u32, u32)>,
    group_ports: Vec<u32>,
    ports: Vec<Port>,
    /// Packets in the fabric, by slot (one cache line each: what a hop reads of a packet
    /// is one miss, its payload none); `free_pkts` lists the empty slots.
    pkts: Vec<Pkt>,
    free_pkts: Vec<u32>,
    /// One entry per non-empty port lane (`port * 2 + prio`): the arrival time of its first
    /// packet, with that packet's sequence number. Lanes are FIFO, so merging their heads by
    /// `(time, sequence)` processes every packet in global `(time, queueing order)`.
    heads: EventQueue<u32>,
    /// Packets on links or in queues.
    in_flight: usize,
    /// Payload buffers handed back with [`Fabric::recycle`]: large ones (for
    /// [`Fabric::buffer`], whose length is usually already a full datagram's, so reusing
    /// them costs no zeroing) and small ones (ACK-sized copies).
    pool: Vec<Vec<u8>>,
    small_pool: Vec<Vec<u8>>,
    stats: FabricStats,
    series: Option<Series>,
    hop_stamp: Option<HopStamp>,
}

/// In-band hop telemetry: the function may rewrite a datagram with the time the bytes queued
/// ahead of it at a switch took to drain (ns). It must keep the largest value it is given
/// (Braid's `braid_proto::wire::stamp_hop_queue` does: the largest such delay on the way), so
/// the fabric calls it once per datagram, with the largest delay any switch on the way saw,
/// as the datagram reaches its host (or before a switch trims it): a hop then touches only
/// the packet's record, not its bytes. The fabric knows no protocol, so the harness that runs
/// one gives it.
pub type HopStamp = fn(&mut [u8], u64);

impl Fabric {
    /// Makes every switch port stamp in-band hop telemetry into the datagrams it queues
    /// (host NICs do not), as switches with INT do; `None` turns it off (the default).
    pub fn set_hop_stamp(&mut self, stamp: Option<HopStamp>) {
        self.hop_stamp = stamp;
    }

    /// Number of ports.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// Host `h`'s NIC port.
    pub fn host_port(&self, h: HostId) -> PortId {
        PortId(self.host_port[h.0 as usize])
    }

    /// What node `n` is.
    pub fn node_kind(&self, n: NodeId) -> NodeKind {
        self.kinds[n.0 as usize]
    }

    /// The node port `p` leaves and the node it leads to.
    pub fn port_ends(&self, p: PortId) -> (NodeId, NodeId) {
        let port = &self.ports[p.0 as usize];
        (NodeId(port.from), NodeId(port.to))
    }

    /// Every port, in creation order.
    pub fn ports(&self) -> impl Iterator<Item = PortId> + '_ {
        (0..self.ports.len() as u32).map(PortId)
    }

    /// Ports from a switch of tier `from` to a switch of tier `to` (in a leaf-spine,
    /// `(0, 1)` are the leaf uplinks), in creation order.
    pub fn tier_ports(&self, from: u8, to: u8) -> Vec<PortId> {
        let tier = |n: u32| match self.kinds[n as usize] {
            NodeKind::Switch { tier, .. } => Some(tier),
            NodeKind::Host(_) => None,
        };
        self.ports()
            .filter(|p| {
                let port = &self.ports[p.0 as usize];
                tier(port.from) == Some(from) && tier(port.to) == Some(to)
            })
            .collect()
    }

    /// Ports from a switch to a host (the last hop), in creation order.
    pub fn host_facing_ports(&self) -> Vec<PortId> {
        self.ports()
            .filter(|p| {
                let port = &self.ports[p.0 as usize];
                port.to_host != u32::MAX
                    && matches!(self.kinds[port.from as usize], NodeKind::Switch { .. })
            })
            .collect()
    }

    /// The configuration of port `p`.
    pub fn port(&self, p: PortId) -> &PortConfig {
        &self.ports[p.0 as usize].cfg
    }

    /// Changes port `p`'s configuration from now on (packets already queued keep their
    /// departure times).
    pub fn port_mut(&mut self, p: PortId) -> &mut PortConfig {
        let port = &mut self.ports[p.0 as usize];
        // The rate may change: recompute it on the next enqueue.
        port.ps_per_byte = u64::MAX;
        &mut port.cfg
    }

    /// Counters of port `p`.
    pub fn port_stats(&self, p: PortId) -> &PortStats {
        &self.ports[p.0 as usize].stats
    }

    /// Starts recording per-port time series in buckets of `interval_ns` (see
    /// [`Fabric::series`]). Recording costs a few nanoseconds per hop.
    pub fn enable_series(&mut self, interval_ns: u64) {
        self.series = Some(Series {
            interval_ns: interval_ns.max(1),
            ports: vec![Vec::new(); self.ports.len()],
            last: (0, 0),
        });
    }

    /// The time series recorded since [`Fabric::enable_series`].
    pub fn series(&self) -> Option<&Series> {
        self.series.as_ref()
    }

    /// Queues packet `slot` at `port` at time `at` (ns); false if it was dropped.
    fn enqueue(&mut self, at: u64, port_idx: u32, slot: u32) -> bool {
        let port = &mut self.ports[port_idx as usize];
        if port.ps_per_byte == u64::MAX {
            port.load_cfg();
        }
        if !port.plain {
            if port.cfg.blackhole {
                port.stats.blackholed += 1;
                self.stats.blackholed += 1;
                self.free(slot);
                return false;
            }
            if port.cfg.loss > 0.0 && unit(splitmix64(&mut port.rng)) < port.cfg.loss {
                port.stats.lost += 1;
                self.stats.lost += 1;
                self.free(slot);
                return false;
            }
        }
        self.stats.hops += 1;
        port.drain(at);
        let hop = &mut self.pkts[slot as usize];
        let wire = hop.bytes.len() + self.overhead as usize;
        // `queue_bytes` is 0 on a link of rate 0: everything is dropped.
        if port.queued + wire > port.queue_bytes {
            if !port.cfg.trim
                || port.cfg.bandwidth_bps == 0
                || hop.bytes.len() <= TRIM_PAYLOAD_BYTES
            {
                port.stats.drops += 1;
                self.stats.drops += 1;
                self.free(slot);
                return false;
            }
            // Trim: the stub skips the queue in the priority lane. What the switches before
            // this one stamped is written before the bytes go.
            hop.write_stamp(self.hop_stamp);
            hop.bytes.truncate(TRIM_PAYLOAD_BYTES);
            let wire = (TRIM_PAYLOAD_BYTES + self.overhead as usize) as u64;
            let done = port.transmit(at, wire, true);
            port.stats.trimmed += 1;
            port.stats.packets += 1;
            port.stats.bytes += wire;
            self.stats.trimmed += 1;
            let arrive = done.saturating_add(port.prop_delay_ns);
            if let Some(s) = &mut self.series {
                s.bucket(port_idx, done).bytes += wire;
            }
            self.push_event(port_idx, true, arrive, slot, (done, 0));
            return true;
        }
        let ahead = port.queued;
        if matches!(hop.ecn, Ecn::Ect0 | Ecn::Ect1)
            && (ahead > port.ecn_threshold_bytes
                || !port.plain
                    && port.cfg.ce_mark > 0.0
                    && unit(splitmix64(&mut port.rng)) < port.cfg.ce_mark)
        {
            hop.ecn = Ecn::Ce;
            port.stats.ecn_marks += 1;
            self.stats.ecn_marks += 1;
        }
        if self.hop_stamp.is_some() && port.from_switch {
            // ps per byte x bytes: the drain time of the queue ahead, in ps.
            let q = (ahead as u64).saturating_mul(port.ps_per_byte) / 1000;
            hop.queue_ns = Some(hop.queue_ns.map_or(q, |m| m.max(q)));
        }
        let done = port.transmit(at, wire as u64, false);
        let queued = ahead + wire;
        port.stats.packets += 1;
        port.stats.bytes += wire as u64;
        port.stats.queue_seen_sum += ahead as u64;
        port.stats.max_queue_bytes = port.stats.max_queue_bytes.max(queued);
        let arrive = done.saturating_add(port.prop_delay_ns);
        if let Some(s) = &mut self.series {
            s.bucket(port_idx, done).bytes += wire as u64;
            let b = s.bucket(port_idx, at);
            b.max_queue_bytes = b.max_queue_bytes.max(queued as u32);
        }
        // `wire` is at most a datagram and its overhead.
        self.push_event(port_idx, false, arrive, slot, (done, wire as u32));
        true
    }

    /// Puts packet `pkt` on the link of `port` (its priority lane if `prio`), to arrive at
    /// the next node at `at`. A lane is FIFO: its arrival times never decrease (a packet
    /// never overtakes another on the same link), so one heap entry per lane suffices. A
    /// data packet joins the port's queue until `done` (ns), with its `wire` bytes:
    /// `(done, wire)`.
    fn push_event(&mut self, port: u32, prio: bool, at: u64, pkt: u32, (done, wire): (u64, u32)) {
        let seq = self.heads.take_seq();
        let lane_id = port * 2 + u32::from(prio);
        let p = &mut self.ports[port as usize];
        if !prio {
            p.queued += wire as usize;
            p.queue_len += 1;
        }
        let lane = p.lane_mut(prio);
        let at = lane.back().map_or(at, |last| at.max(last.at));
        lane.push_back(Arrival {
            at,
            seq,
            done,
            pkt,
            wire,
        });
        if lane.len() == 1 {
            self.heads.push_seq(at, seq, lane_id);
        }
    }

    fn free(&mut self, slot: u32) {
        let bytes = std::mem::take(&mut self.pkts[slot as usize].bytes);
        self.recycle(bytes);
        self.free_pkts.push(slot);
        self.in_flight -= 1;
    }
}

/// The switched topology: host NICs have queues ([`Fabric::nic_backlog_bytes`]), and payload
/// buffers are pooled ([`Fabric::buffer`], [`Fabric::recycle`]).
impl Network for Fabric {
    type Stats = FabricStats;

    /// The seed the fabric was built with: print it on failure to replay the run.
    fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of hosts.
    fn hosts(&self) -> usize {
        self.n_hosts
    }

    /// The address host `h` receives at.
    fn host_addr(&self, h: HostId) -> SocketAddr {
        self.host_addrs[h.0 as usize]
    }

    /// The host that receives at `addr`.
    fn host_by_addr(&self, addr: SocketAddr) -> Option<HostId> {
        self.addrs.get(&addr).map(|&h| HostId(h))
    }

    /// Puts `t` on host `from`'s NIC at `now`. It leaves from
    /// [`path_source`]`(addr, t.path)` (so the path picks the UDP source port, and
    /// with it the ECMP routes). Returns whether the NIC accepted it (false: unknown
    /// destination, or the NIC queue was full or failed).
    fn send(&mut self, now: Timestamp, from: HostId, t: &Transmit<'_>) -> bool {
        let pool = if t.contents.len() < SMALL_BUFFER {
            &mut self.small_pool
        } else {
            &mut self.pool
        };
        let mut bytes = pool.pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(t.contents);
        self.send_buf(now, from, t.dest, t.path, t.ecn, bytes)
    }

    /// Like [`Fabric::send`], with the payload in an owned buffer (see [`Fabric::buffer`]).
    fn send_buf(
        &mut self,
        now: Timestamp,
        from: HostId,
        dest: SocketAddr,
        path: u16,
        ecn: Ecn,
        bytes: Vec<u8>,
    ) -> bool {
        self.stats.sent += 1;
        let Some(&dst_host) = self.addrs.get(&dest) else {
            self.stats.unknown_dest += 1;
            self.recycle(bytes);
            return false;
        };
        let src = path_source(self.host_addrs[from.0 as usize], path);
        let pkt = Pkt {
            bytes,
            flow_hash: hash_5tuple(src, dest),
            queue_ns: None,
            from: from.0,
            dst_host,
            path,
            ecn,
        };
        let slot = match self.free_pkts.pop() {
            Some(s) => {
                self.pkts[s as usize] = pkt;
                s
            }
            None => {
                self.pkts.push(pkt);
                (self.pkts.len() - 1) as u32
            }
        };
        self.in_flight += 1;
        self.enqueue(now.as_nanos(), self.host_port[from.0 as usize], slot)
    }

    /// A buffer of `len` bytes (of unspecified contents) for [`Fabric::send_buf`]: a recycled
    /// one when there is one, so a driver can have its sender write a datagram straight into
    /// the buffer the fabric will carry, without a copy.
    fn buffer(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        b.resize(len, 0);
        b
    }

    /// Hands a delivered payload buffer back for reuse.
    fn recycle(&mut self, bytes: Vec<u8>) {
        let pool = if bytes.capacity() < SMALL_BUFFER {
            &mut self.small_pool
        } else {
            &mut self.pool
        };
        if pool.len() < POOL_MAX && bytes.capacity() > 0 {
            pool.push(bytes);
        }
    }

    /// When the next packet reaches a node (a switch or a host), or `None` if the fabric is
    /// empty.
    fn next_event(&self) -> Option<Timestamp> {
        self.heads.peek_at().map(Timestamp::from_nanos)
    }

    /// Runs the fabric up to `now` and returns the next datagram that reached a host at or
    /// before `now`, earliest first (ties in queueing order), or `None` once none is due.
    fn poll_deliver(&mut self, now: Timestamp) -> Option<Delivery> {
        let now = now.as_nanos();
        while let Some((_, &lane_id)) = self.heads.peek_due(now) {
            let port = &mut self.ports[(lane_id / 2) as usize];
            let Some(ev) = port.pop_arrival(lane_id % 2 == 1) else {
                self.heads.pop_due(now);
                continue;
            };
            // The lane's entry leaves the queue; its next packet, if any, takes its place.
            match port.lane_mut(lane_id % 2 == 1).front() {
                Some(next) => self.heads.replace_first(next.at, next.seq, lane_id),
                None => self.heads.pop_due(now),
            };
            let node = port.to as usize;
            if let NodeKind::Host(h) = self.kinds[node] {
                let pkt = &mut self.pkts[ev.pkt as usize];
                pkt.write_stamp(self.hop_stamp);
                let bytes = std::mem::take(&mut pkt.bytes);
                let src = path_source(self.host_addrs[pkt.from as usize], pkt.path);
                let ecn = pkt.ecn;
                self.free_pkts.push(ev.pkt);
                self.in_flight -= 1;
                self.stats.delivered += 1;
                return Some(Delivery {
                    host: h,
                    to: self.host_addrs[h.0 as usize],
                    meta: RecvMeta {
                        src,
                        len: bytes.len(),
                        ecn,
                        queued_ns: 0,
                    },
                    bytes,
                });
            }
            let sw = self.switch_index[node] as usize;
            let hop = &self.pkts[ev.pkt as usize];
            let dst = hop.dst_host as usize;
            let group = self.routes[sw * self.n_hosts + dst];
            if group == NO_ROUTE {
                self.stats.no_route += 1;
                self.free(ev.pkt);
                continue;
            }
            let (start, len) = self.groups[group as usize];
            let choice = if len == 1 {
                0
            } else {
                let h = mix64(hop.flow_hash ^ self.node_seeds[node]);
                ((u128::from(h) * u128::from(len)) >> 64) as u32
            };
            let port = self.group_ports[(start + choice) as usize];
            self.enqueue(ev.at, port, ev.pkt);
        }
        None
    }

    /// Packets inside the fabric (queued or on a link).
    fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Fabric-wide counters.
    fn stats(&self) -> &FabricStats {
        &self.stats
    }

    fn has_nic_queues(&self) -> bool {
        true
    }

    /// Wire bytes queued at host `h`'s NIC at `now` (the frame being sent included).
    fn nic_backlog_bytes(&mut self, h: HostId, now: Timestamp) -> usize {
        let port = &mut self.ports[self.host_port[h.0 as usize] as usize];
        port.drain(now.as_nanos());
        port.queued
    }

    /// The earliest time at or after `now` when host `h`'s NIC will hold fewer than
    /// `below_bytes` wire bytes, if nothing more is sent.
    fn nic_drained_at(&self, h: HostId, now: Timestamp, below_bytes: usize) -> Timestamp {
        let port = &self.ports[self.host_port[h.0 as usize] as usize];
        Timestamp::from_nanos(port.drained_at(now.as_nanos(), below_bytes))
    }
}

/// Most payload buffers kept for reuse, per pool.
const POOL_MAX: usize = 1 << 16;

/// Buffers with less capacity than this go to the small pool.
const SMALL_BUFFER: usize = 1024;

/// Marks a `(switch, host)` pair with no route.
const NO_ROUTE: u32 = u32::MAX;

/// An output port and its link.
///
/// What every hop reads and writes comes first, in two cache lines (`repr(C)` keeps the
/// order): the first holds the data lane and the queue, the second what the hop needs of the
/// configuration (copied from `cfg`) and the counters it updates. The rest is read only when a
/// packet is dropped, trimmed or marked at random.
///
/// The queue is the tail of the data lane: the packets still being serialized are its last
/// `queue_len`, and their bytes are `queued`. A packet leaves it once its last bit is sent
/// (`drain`), or when it arrives at the next node if that comes first in the calls (a link
/// without propagation delay).
#[derive(Debug)]
#[repr(C, align(64))]
struct Port {
    /// When the data lane finishes the last queued packet, ps (kept in picoseconds so that
    /// back-to-back packets do not accumulate rounding).
    free_at_ps: u64,
    /// Serialization time per byte, ps, rounded up (`u64::MAX`: this and the fields copied
    /// from `cfg` are to be recomputed, see [`Port::load_cfg`]).
    ps_per_byte: u64,
    /// Wire bytes queued.
    queued: usize,
    /// Packets queued: the data lane's last ones.
    queue_len: u32,
    /// The node the link leads to.
    to: u32,
    /// Packets sent (or being sent) on the link and not yet arrived at the next node, in
    /// arrival order.
    data: VecDeque<Arrival>,
    /// `cfg.queue_bytes`, 0 on a link of rate 0.
    queue_bytes: usize,
    /// `cfg.ecn_threshold_bytes`, `usize::MAX` for none.
    ecn_threshold_bytes: usize,
    /// `cfg.prop_delay_ns`.
    prop_delay_ns: u64,
    /// No black hole, random loss or random marking: the hop draws nothing.
    plain: bool,
    /// The port leaves a switch (its hops stamp hop telemetry).
    from_switch: bool,
    stats: PortStats,
    /// Trimmed stubs, in arrival order: the priority lane.
    prio: VecDeque<Arrival>,
    /// When the priority lane is free, ps.
    prio_free_at_ps: u64,
    cfg: PortConfig,
    from: u32,
    /// The host `to` is, or `u32::MAX` for a switch.
    to_host: u32,
    rng: u64,
}

impl Port {
    fn new(cfg: PortConfig, from: u32, to: u32, to_host: u32, from_switch: bool, rng: u64) -> Port {
        let mut port = Port {
            free_at_ps: 0,
            ps_per_byte: u64::MAX,
            queued: 0,
            queue_len: 0,
            to,
            data: VecDeque::new(),
            queue_bytes: 0,
            ecn_threshold_bytes: usize::MAX,
            prop_delay_ns: 0,
            plain: true,
            from_switch,
            stats: PortStats::default(),
            prio: VecDeque::new(),
            prio_free_at_ps: 0,
            cfg,
            from,
            to_host,
            rng,
        };
        port.load_cfg();
        port
    }

    /// Copies what a hop reads of `cfg` into the port's first lines.
    fn load_cfg(&mut self) {
        let c = &self.cfg;
        self.ps_per_byte = ps_per_byte(c.bandwidth_bps);
        self.queue_bytes = if c.bandwidth_bps == 0 {
            0
        } else {
            c.queue_bytes
        };
        self.ecn_threshold_bytes = c.ecn_threshold_bytes.unwrap_or(usize::MAX);
        self.prop_delay_ns = c.prop_delay_ns;
        self.plain = !(c.blackhole || c.loss > 0.0 || c.ce_mark > 0.0);
    }

    fn lane_mut(&mut self, prio: bool) -> &mut VecDeque<Arrival> {
        if prio { &mut self.prio } else { &mut self.data }
    }

    /// Takes the first packet of a lane off the link; one still counted in the queue (on a
    /// link without propagation delay) leaves it too.
    fn pop_arrival(&mut self, prio: bool) -> Option<Arrival> {
        if prio {
            return self.prio.pop_front();
        }
        let ev = self.data.pop_front()?;
        if self.queue_len as usize > self.data.len() {
            self.queue_len -= 1;
            self.queued -= ev.wire as usize;
        }
        Some(ev)
    }

    /// Forgets the queued packets fully sent by `now_ns`.
    fn drain(&mut self, now_ns: u64) {
        while self.queue_len > 0 {
            let a = &self.data[self.data.len() - self.queue_len as usize];
            if a.done > now_ns {
                break;
            }
            self.queued -= a.wire as usize;
            self.queue_len -= 1;
        }
    }

    /// The earliest time at or after `now_ns` when fewer than `below_bytes` are queued, if
    /// nothing more is accepted.
    fn drained_at(&self, now_ns: u64, below_bytes: usize) -> u64 {
        let mut left = self.queued;
        let mut at = now_ns;
        for a in self.data.range(self.data.len() - self.queue_len as usize..) {
            if left < below_bytes {
                break;
            }
            left -= a.wire as usize;
            at = at.max(a.done);
        }
        at
    }

    /// Serializes `wire_bytes` in the data lane (or the priority lane) starting no earlier
    /// than `at_ns`; returns when the last bit has left, ns (rounded up).
    fn transmit(&mut self, at_ns: u64, wire_bytes: u64, prio: bool) -> u64 {
        let lane = if prio {
            &mut self.prio_free_at_ps
        } else {
            &mut self.free_at_ps
        };
        let done = at_ns
            .saturating_mul(1_000)
            .max(*lane)
            .saturating_add(wire_bytes.saturating_mul(self.ps_per_byte));
        *lane = done;
        done.div_ceil(1_000).max(at_ns)
    }
}

#[derive(Debug)]
#[repr(align(64))]
struct Pkt {
    /// The datagram (cut to [`TRIM_PAYLOAD_BYTES`] if trimmed).
    bytes: Vec<u8>,
    flow_hash: u64,
    /// The largest queueing delay a switch on the way saw ahead of the packet, ns, not yet
    /// stamped into its bytes ([`HopStamp`]).
    queue_ns: Option<u64>,
    /// The sending host and its path: the source address, [`path_source`]`(from, path)`.
    from: u32,
    dst_host: u32,
    path: u16,
    ecn: Ecn,
}

impl Pkt {
    /// Writes the hop telemetry the switches so far recorded into the bytes ([`HopStamp`]).
    fn write_stamp(&mut self, stamp: Option<HopStamp>) {
        if let (Some(stamp), Some(q)) = (stamp, self.queue_ns.take()) {
            stamp(&mut self.bytes, q);
        }
    }
}

/// A packet on a link, arriving at the next node at `at`; a data packet is in the port's
/// queue until `done` (ns), with its `wire` bytes.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: u64,
    seq: u64,
    done: u64,
    pkt: u32,
    wire: u32,
}

fn gbps_to_bps(gbps: f64) -> u64 {
    if gbps.is_finite() && gbps > 0.0 {
        (gbps * 1e9).round() as u64
    } else {
        0
    }
}

/// Serialization time per byte at `bps`, ps, rounded up (exact for rates that divide 8 Tb/s:
/// 80 ps at 100 Gb/s).
fn ps_per_byte(bps: u64) -> u64 {
    if bps == 0 {
        return 0;
    }
    8_000_000_000_000u64.div_ceil(bps)
}

/// The 5-tuple hash of a UDP datagram from `src` to `dst` (protocol 17).
fn hash_5tuple(src: SocketAddr, dst: SocketAddr) -> u64 {
    let ip = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => {
            let x = u128::from(v6);
            mix64((x >> 64) as u64) ^ x as u64
        }
    };
    let mut h = mix64(ip(src) ^ 0x5851_F42D_4C95_7F2D);
    h = mix64(h ^ ip(dst));
    mix64(h ^ (u64::from(src.port()) << 32 | u64::from(dst.port()) << 16 | 17))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(dest: SocketAddr, path: u16, ecn: Ecn, contents: &[u8]) -> Transmit<'_> {
        Transmit {
            dest,
            path,
            ecn,
            contents,
        }
    }

    /// Runs the fabric to idle: `(time, delivery)` in delivery order.
    fn drain(f: &mut Fabric) -> Vec<(u64, Delivery)> {
        let mut out = Vec::new();
        while let Some(at) = f.next_event() {
            while let Some(d) = f.poll_deliver(at) {
                out.push((at.as_nanos(), d));
            }
        }
        out
    }

    fn small() -> LeafSpine {
        LeafSpine {
            hosts_per_leaf: 4,
            leaves: 4,
            spines: 4,
            ..LeafSpine::default()
        }
    }

    #[test]
    fn one_packet_crosses_four_links_with_serialization_and_delay() {
        let ls = small();
        let mut f = ls.build(1);
        let (a, b) = (HostId(0), HostId(5));
        let payload = [0u8; 1184]; // 1250 wire bytes: 100 ns at 100 Gb/s
        assert!(f.send(
            Timestamp::ZERO,
            a,
            &tx(ls.host_addr(5), 0, Ecn::Ect0, &payload)
        ));
        let got = drain(&mut f);
        assert_eq!(got.len(), 1);
        let (at, d) = &got[0];
        assert_eq!(*at, 4 * (100 + 1_000));
        assert_eq!(d.host, b);
        assert_eq!(d.meta.ecn, Ecn::Ect0);
        assert_eq!(d.meta.src, SocketAddr::new(ls.host_addr(0).ip(), 4792));
        assert_eq!(f.stats().hops, 4);
        assert_eq!(f.stats().delivered, 1);
    }

    #[test]
    fn traffic_within_a_leaf_takes_two_links() {
        let ls = small();
        let mut f = ls.build(1);
        f.send(
            Timestamp::ZERO,
            HostId(1),
            &tx(ls.host_addr(2), 0, Ecn::NotEct, &[1; 100]),
        );
        let got = drain(&mut f);
        assert_eq!(got[0].1.host, HostId(2));
        assert_eq!(f.stats().hops, 2);
        for p in f.tier_ports(0, 1) {
            assert_eq!(f.port_stats(p).packets, 0);
        }
    }

    #[test]
    fn back_to_back_packets_leave_one_serialization_apart() {
        let ls = LeafSpine {
            hosts_per_leaf: 2,
            leaves: 1,
            spines: 1,
            ..LeafSpine::default()
        };
        let mut f = ls.build(2);
        let payload = [0u8; 1184];
        for _ in 0..5 {
            f.send(
                Timestamp::ZERO,
                HostId(0),
                &tx(ls.host_addr(1), 0, Ecn::NotEct, &payload),
            );
        }
        assert_eq!(f.nic_backlog_bytes(HostId(0), Timestamp::ZERO), 5 * 1250);
        assert_eq!(
            f.nic_drained_at(HostId(0), Timestamp::ZERO, 2 * 1250),
            Timestamp::from_nanos(400)
        );
        let times: Vec<u64> = drain(&mut f).iter().map(|(t, _)| *t).collect();
        // NIC then leaf port: the second hop pipelines behind the first.
        assert_eq!(
            times,
            (1..=5).map(|i| 2_000 + 100 + i * 100).collect::<Vec<_>>()
        );
    }

    #[test]
    fn incast_drops_at_the_tail_and_marks_above_the_threshold() {
        let ls = LeafSpine {
            hosts_per_leaf: 9,
            leaves: 1,
            spines: 1,
            queue_bytes: 20_000,
            ecn_threshold_bytes: Some(5_000),
            ..LeafSpine::default()
        };
        let mut f = ls.build(3);
        let payload = [0u8; 934]; // 1000 wire bytes
        for s in 1..9 {
            for _ in 0..10 {
                f.send(
                    Timestamp::ZERO,
                    HostId(s),
                    &tx(ls.host_addr(0), 0, Ecn::Ect0, &payload),
                );
            }
        }
        let got = drain(&mut f);
        let down = f.host_port(HostId(0));
        let leaf_to_0 = f
            .host_facing_ports()
            .into_iter()
            .find(|p| f.port_ends(*p).1 == f.port_ends(down).0)
            .unwrap();
        let st = f.port_stats(leaf_to_0).clone();
        assert!(st.drops > 0, "{st:?}");
        assert!(st.max_queue_bytes <= 20_000);
        assert_eq!(st.max_queue_bytes, 20_000);
        assert!(st.ecn_marks > 0);
        assert_eq!(got.len() as u64 + st.drops, 80);
        let marked = got.iter().filter(|(_, d)| d.meta.ecn == Ecn::Ce).count() as u64;
        assert_eq!(marked, st.ecn_marks);
        let s = f.stats();
        assert_eq!(s.sent, s.delivered + s.drops);
    }

    /// A test stamp: the largest queue delay in bytes 0..8, the number of stamps in byte 8.
    fn record_stamp(b: &mut [u8], queue_ns: u64) {
        let old = u64::from_le_bytes(b[..8].try_into().unwrap());
        b[..8].copy_from_slice(&old.max(queue_ns).to_le_bytes());
        b[8] += 1;
    }

    #[test]
    fn switches_stamp_the_queue_ahead_and_hosts_do_not() {
        let ls = LeafSpine {
            hosts_per_leaf: 3,
            leaves: 2,
            spines: 1,
            ..LeafSpine::default()
        };
        let mut f = ls.build(3);
        f.set_hop_stamp(Some(record_stamp));
        let payload = [0u8; 934]; // 1000 wire bytes: 80 ns at 100 Gbit/s
        for s in 1..3 {
            for _ in 0..5 {
                f.send(
                    Timestamp::ZERO,
                    HostId(s),
                    &tx(ls.host_addr(0), 0, Ecn::NotEct, &payload),
                );
            }
        }
        // And one across the spine: three switches.
        f.send(
            Timestamp::ZERO,
            HostId(3),
            &tx(ls.host_addr(2), 0, Ecn::NotEct, &payload),
        );
        let got = drain(&mut f);
        assert_eq!(got.len(), 11);
        let into_0: Vec<_> = got.iter().filter(|(_, d)| d.host == HostId(0)).collect();
        // One switch on the way (the NIC queues, 5 packets deep, stamp nothing)...
        assert!(into_0.iter().all(|(_, d)| d.bytes[8] == 1));
        // ... and its stamp is the time the bytes queued ahead at the leaf's port to host 0
        // take to leave: the sum over packets is that port's queue_seen_sum at 80 ps a byte.
        let leaf_to_0 = f
            .host_facing_ports()
            .into_iter()
            .find(|p| f.port_ends(*p).1 == f.port_ends(f.host_port(HostId(0))).0)
            .unwrap();
        let seen = f.port_stats(leaf_to_0).queue_seen_sum;
        let stamped: u64 = into_0
            .iter()
            .map(|(_, d)| u64::from_le_bytes(d.bytes[..8].try_into().unwrap()))
            .sum();
        assert!(seen > 0);
        assert_eq!(stamped, seen * 80 / 1000);
        // Three switches on the way, one stamp: the largest delay they saw (none: it was
        // alone in each of their queues).
        let across = got.iter().find(|(_, d)| d.host == HostId(2)).unwrap();
        assert_eq!(across.1.bytes[8], 1);
        assert_eq!(across.1.bytes[..8], [0; 8]);
        // Off: nothing is written.
        f.set_hop_stamp(None);
        f.send(
            Timestamp::from_nanos(1_000_000),
            HostId(1),
            &tx(ls.host_addr(0), 0, Ecn::NotEct, &payload),
        );
        let mut got = drain(&mut f);
        assert_eq!(got.len(), 1);
        assert!(got.pop().unwrap().1.bytes.iter().all(|&b| b == 0));
    }

    /// A datagram's stamp is the largest delay of its way, however early it was met: two
    /// hosts of leaf 1 share its one uplink (a queue there), and nothing queues after it.
    #[test]
    fn the_stamp_is_the_largest_queue_on_the_way() {
        let ls = LeafSpine {
            hosts_per_leaf: 2,
            leaves: 2,
            spines: 1,
            ..LeafSpine::default()
        };
        let mut f = ls.build(5);
        f.set_hop_stamp(Some(record_stamp));
        let payload = [0u8; 934];
        for _ in 0..6 {
            for (from, to) in [(2, 0), (3, 1)] {
                f.send(
                    Timestamp::ZERO,
                    HostId(from),
                    &tx(ls.host_addr(to), 0, Ecn::NotEct, &payload),
                );
            }
        }
        let got = drain(&mut f);
        assert_eq!(got.len(), 12);
        assert!(got.iter().all(|(_, d)| d.bytes[8] == 1));
        let uplink = f.tier_ports(0, 1)[1];
        assert_eq!(f.port_ends(uplink).0, f.port_ends(f.host_port(HostId(2))).1);
        let seen = f.port_stats(uplink).queue_seen_sum;
        let stamped: u64 = (got.iter())
            .map(|(_, d)| u64::from_le_bytes(d.bytes[..8].try_into().unwrap()))
            .sum();
        assert!(seen > 0);
        assert_eq!(stamped, seen * 80 / 1000);
    }

    #[test]
    fn not_ect_packets_are_never_marked() {
        let ls = LeafSpine {
            hosts_per_leaf: 3,
            leaves: 1,
            spines: 1,
            ecn_threshold_bytes: Some(0),
            ..LeafSpine::default()
        };
        let mut f = ls.build(3);
        for s in 1..3 {
            for _ in 0..10 {
                f.send(
                    Timestamp::ZERO,
                    HostId(s),
                    &tx(ls.host_addr(0), 0, Ecn::NotEct, &[0; 500]),
                );
            }
        }
        assert!(drain(&mut f).iter().all(|(_, d)| d.meta.ecn == Ecn::NotEct));
        assert_eq!(f.stats().ecn_marks, 0);
    }

    #[test]
    fn trimming_delivers_short_stubs_instead_of_dropping() {
        let ls = LeafSpine {
            hosts_per_leaf: 5,
            leaves: 1,
            spines: 1,
            queue_bytes: 10_000,
            trim: true,
            ..LeafSpine::default()
        };
        let mut f = ls.build(4);
        let payload = [7u8; 1934];
        for i in 0..10 {
            for s in 1..5 {
                // One packet per sender every 160 ns: line rate for each NIC.
                f.send(
                    Timestamp::from_nanos(i * 160),
                    HostId(s),
                    &tx(ls.host_addr(0), 0, Ecn::NotEct, &payload),
                );
            }
        }
        let got = drain(&mut f);
        assert_eq!(got.len(), 40);
        let stubs = got
            .iter()
            .filter(|(_, d)| d.bytes.len() == TRIM_PAYLOAD_BYTES)
            .count();
        assert!(stubs > 0);
        assert_eq!(stubs as u64, f.stats().trimmed);
        assert_eq!(f.stats().drops, 0);
        // Stubs overtake the full packets queued before them.
        let first_stub = got
            .iter()
            .position(|(_, d)| d.bytes.len() == TRIM_PAYLOAD_BYTES);
        assert!(first_stub.unwrap() < got.len() - stubs);
    }

    #[test]
    fn one_flow_sticks_to_one_uplink_and_many_flows_spread() {
        let ls = small();
        let mut f = ls.build(5);
        for i in 0..100 {
            f.send(
                Timestamp::from_micros(i),
                HostId(0),
                &tx(ls.host_addr(15), 3, Ecn::NotEct, &[0; 100]),
            );
        }
        drain(&mut f);
        let up = f.tier_ports(0, 1);
        let used: Vec<u64> = up.iter().map(|p| f.port_stats(*p).packets).collect();
        assert_eq!(used.iter().filter(|&&n| n > 0).count(), 1, "{used:?}");
        assert_eq!(used.iter().sum::<u64>(), 100);

        let mut f = ls.build(5);
        for path in 0..256 {
            f.send(
                Timestamp::from_micros(u64::from(path)),
                HostId(0),
                &tx(ls.host_addr(15), path, Ecn::NotEct, &[0; 100]),
            );
        }
        drain(&mut f);
        let leaf0: Vec<u64> = up
            .iter()
            .filter(|p| f.port_ends(**p).0 == NodeId(ls.hosts() as u32))
            .map(|p| f.port_stats(*p).packets)
            .collect();
        assert_eq!(leaf0.len(), 4);
        assert!(leaf0.iter().all(|&n| (40..=90).contains(&n)), "{leaf0:?}");
    }

    #[test]
    fn same_seed_same_run_other_seed_other_routes() {
        let run = |seed: u64| {
            let ls = small();
            let mut f = ls.build(seed);
            for i in 0..2_000u64 {
                let from = HostId((i % 16) as u32);
                let to = ls.host_addr(((i * 7 + 3) % 16) as usize);
                let payload = (i as u32).to_be_bytes().repeat(200);
                f.send(
                    Timestamp::from_nanos(i * 50),
                    from,
                    &tx(to, (i % 8) as u16, Ecn::Ect0, &payload),
                );
            }
            let trace: Vec<(u64, u32, SocketAddr, Ecn, Vec<u8>)> = drain(&mut f)
                .into_iter()
                .map(|(t, d)| (t, d.host.0, d.meta.src, d.meta.ecn, d.bytes))
                .collect();
            let loads: Vec<u64> = f
                .tier_ports(0, 1)
                .iter()
                .map(|p| f.port_stats(*p).packets)
                .collect();
            (trace, loads, f.stats().clone())
        };
        let a = run(11);
        assert_eq!(a, run(11));
        assert_ne!(a.1, run(12).1);
    }

    /// A digest of everything a congested run delivers: time, host, source, ECN, length and
    /// payload of each delivery in order, then every port's counters and the fabric's.
    fn run_digest(f: &mut Fabric) -> u64 {
        let mut h = 0x243F_6A88_85A3_08D3u64;
        let mut eat = |x: u64| h = mix64(h ^ x).wrapping_add(x);
        for (t, d) in drain(f) {
            eat(t);
            eat(u64::from(d.host.0));
            eat(hash_5tuple(d.meta.src, d.to));
            eat(d.meta.ecn as u64);
            eat(d.meta.len as u64);
            for c in d.bytes.chunks(8) {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                eat(u64::from_le_bytes(w));
            }
        }
        for p in f.ports().collect::<Vec<_>>() {
            let s = f.port_stats(p);
            for x in [
                s.packets,
                s.bytes,
                s.drops,
                s.trimmed,
                s.ecn_marks,
                s.lost,
                s.blackholed,
                s.queue_seen_sum,
                s.max_queue_bytes as u64,
            ] {
                eat(x);
            }
        }
        let s = f.stats();
        for x in [s.sent, s.delivered, s.hops, s.drops, s.trimmed, s.ecn_marks] {
            eat(x);
        }
        if let Some(series) = f.series() {
            for p in f.ports() {
                for b in series.port(p) {
                    eat(b.bytes);
                    eat(u64::from(b.max_queue_bytes));
                }
            }
        }
        h
    }

    /// Pins a congested run (incast and cross traffic, ties at one nanosecond, drops, ECN
    /// marks, trimming, a lossy port) to a digest taken before the event queue, the address
    /// lookup and the packet store were reworked for speed: they must not change a single
    /// delivery, its time or its order.
    #[test]
    fn a_congested_run_delivers_exactly_what_it_always_did() {
        let digest = |trim: bool| {
            let ls = LeafSpine {
                queue_bytes: 64 << 10,
                ecn_threshold_bytes: Some(20_000),
                trim,
                ..small()
            };
            let mut f = ls.build(5);
            f.enable_series(1_000);
            let lossy = f.tier_ports(1, 0)[2];
            f.port_mut(lossy).loss = 0.05;
            let mut r = 9u64;
            for i in 0..6_000u64 {
                let x = splitmix64(&mut r);
                let from = HostId((x % 16) as u32);
                // Half the traffic converges on host 0; the rest goes anywhere else.
                let to = if x >> 60 < 8 {
                    0
                } else {
                    ((x >> 8) % 16) as usize
                };
                let len = [64usize, 1_000, 4_096][((x >> 16) % 3) as usize];
                let payload: Vec<u8> = (0..len).map(|b| (b as u64 ^ i) as u8).collect();
                let ecn = if x >> 20 & 3 == 0 {
                    Ecn::NotEct
                } else {
                    Ecn::Ect0
                };
                // Several sends share each nanosecond.
                let at = Timestamp::from_nanos(i / 4 * 30);
                f.send(
                    at,
                    from,
                    &tx(ls.host_addr(to), (x >> 24) as u16 % 32, ecn, &payload),
                );
            }
            let d = run_digest(&mut f);
            let s = f.stats();
            assert!(s.ecn_marks > 0 && s.lost > 0 && (s.drops > 0 || s.trimmed > 0));
            assert_eq!(s.trimmed > 0, trim);
            d
        };
        assert_eq!(digest(false), 12_116_660_404_510_333_483);
        assert_eq!(digest(true), 17_618_427_313_575_847_297);
    }

    #[test]
    fn oversubscription_sets_the_uplink_rate() {
        let ls = LeafSpine {
            oversubscription: Some(2.0),
            spines: 4,
            ..LeafSpine::default()
        };
        assert_eq!(ls.spine_link_bps(), 100_000_000_000);
        assert!((ls.oversubscription_ratio() - 2.0).abs() < 1e-9);
        assert!((LeafSpine::default().oversubscription_ratio() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn blackholed_and_lossy_ports_drop() {
        let ls = small();
        let mut f = ls.build(6);
        for p in f.tier_ports(0, 1) {
            f.port_mut(p).blackhole = true;
        }
        f.send(
            Timestamp::ZERO,
            HostId(0),
            &tx(ls.host_addr(15), 0, Ecn::NotEct, &[0; 10]),
        );
        assert!(drain(&mut f).is_empty());
        assert_eq!(f.stats().blackholed, 1);

        let mut f = ls.build(6);
        let nic = f.host_port(HostId(0));
        f.port_mut(nic).loss = 0.25;
        for i in 0..4_000 {
            f.send(
                Timestamp::from_micros(i),
                HostId(0),
                &tx(ls.host_addr(1), 0, Ecn::NotEct, &[0; 10]),
            );
        }
        let delivered = drain(&mut f).len();
        assert!((2_800..=3_200).contains(&delivered), "{delivered}");
        assert_eq!(f.stats().lost as usize + delivered, 4_000);
    }

    #[test]
    fn unknown_destinations_and_bad_topologies_are_reported() {
        let ls = small();
        let mut f = ls.build(7);
        let nowhere: SocketAddr = "192.0.2.1:1".parse().unwrap();
        assert!(!f.send(
            Timestamp::ZERO,
            HostId(0),
            &tx(nowhere, 0, Ecn::NotEct, b"x")
        ));
        assert_eq!(f.stats().unknown_dest, 1);
        assert_eq!(f.next_event(), None);

        let mut t = Topology::new(FabricConfig::default());
        let h = t.add_host(ls.host_addr(0));
        t.add_host(ls.host_addr(0));
        let s = t.add_switch(0);
        t.connect(h, s, PortConfig::new(1.0, 0, 1), PortConfig::new(1.0, 0, 1));
        assert_eq!(t.build(0).unwrap_err(), TopologyError::HostPorts(HostId(1)));
    }

    #[test]
    fn a_zero_rate_port_drops_everything_and_hostile_configs_do_not_panic() {
        let ls = LeafSpine {
            hosts_per_leaf: 2,
            leaves: 1,
            spines: 1,
            ..LeafSpine::default()
        };
        let mut f = ls.build(8);
        let nic = f.host_port(HostId(0));
        f.port_mut(nic).bandwidth_bps = 0;
        f.send(
            Timestamp::ZERO,
            HostId(0),
            &tx(ls.host_addr(1), 0, Ecn::NotEct, b"x"),
        );
        assert_eq!(f.stats().drops, 1);
        let c = f.port_mut(nic);
        c.bandwidth_bps = 1;
        c.queue_bytes = usize::MAX;
        c.prop_delay_ns = u64::MAX;
        c.loss = f64::NAN;
        f.send(
            Timestamp::MAX,
            HostId(0),
            &tx(ls.host_addr(1), u16::MAX, Ecn::NotEct, &[0; 9000]),
        );
        assert_eq!(drain(&mut f).len(), 1);
    }

    #[test]
    fn series_records_bytes_and_queue_per_bucket() {
        let ls = LeafSpine {
            hosts_per_leaf: 2,
            leaves: 1,
            spines: 1,
            ..LeafSpine::default()
        };
        let mut f = ls.build(9);
        f.enable_series(1_000);
        for i in 0..20 {
            f.send(
                Timestamp::from_nanos(i * 100),
                HostId(0),
                &tx(ls.host_addr(1), 0, Ecn::NotEct, &[0; 1184]),
            );
        }
        drain(&mut f);
        let nic = f.host_port(HostId(0));
        let s = f.series().unwrap();
        let total: u64 = s.port(nic).iter().map(|b| b.bytes).sum();
        assert_eq!(total, 20 * 1250);
        assert_eq!(s.port(nic)[0].bytes, 9 * 1250);
    }
}
