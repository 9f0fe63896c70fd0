//! The fabrics a [`Scenario`](super::fabric::Scenario) can run on besides its leaf-spine:
//! [`Topo`] wraps the rail-optimized, three-tier and scale-across shapes of
//! [`braid_datapath::fabric`] behind the few questions the workloads and the report ask (how
//! many hosts, where, which collective groups, which cuts).
use std::net::SocketAddr;

use braid_datapath::fabric::{Cut, Fabric, RailOptimized, ScaleAcross, ThreeTier};

/// A fabric other than the scenario's [`LeafSpine`].
#[derive(Debug, Clone, PartialEq)]
pub enum Topo {
    /// Rail-optimized leaf-spine: one fabric host (one Braid endpoint) per rail NIC.
    Rail(RailOptimized),
    /// Leaf, spine and super-spine.
    ThreeTier(ThreeTier),
    /// Two leaf-spine sites joined by long links.
    ScaleAcross(ScaleAcross),
}

impl Topo {
    /// Short name for tables and file names.
    pub fn name(&self) -> &'static str {
        match self {
            Topo::Rail(_) => "rail",
            Topo::ThreeTier(_) => "three-tier",
            Topo::ScaleAcross(_) => "scale-across",
        }
    }

    /// Number of fabric hosts (endpoints).
    pub fn hosts(&self) -> usize {
        match self {
            Topo::Rail(r) => r.hosts(),
            Topo::ThreeTier(t) => t.hosts(),
            Topo::ScaleAcross(x) => x.hosts(),
        }
    }

    /// The address of host `i`.
    pub fn host_addr(&self, i: usize) -> SocketAddr {
        match self {
            Topo::Rail(r) => r.host_addr(i),
            Topo::ThreeTier(t) => t.host_addr(i),
            Topo::ScaleAcross(x) => x.host_addr(i),
        }
    }

    /// The fabric, seeded with `seed`.
    pub fn build(&self, seed: u64) -> Fabric {
        match self {
            Topo::Rail(r) => r.build(seed),
            Topo::ThreeTier(t) => t.build(seed),
            Topo::ScaleAcross(x) => x.build(seed),
        }
    }

    /// The cuts of the ideal completion time.
    pub fn cuts(&self) -> Vec<Cut> {
        match self {
            Topo::Rail(r) => r.cuts(),
            Topo::ThreeTier(t) => t.cuts(),
            Topo::ScaleAcross(x) => x.cuts(),
        }
    }

    /// Rate of a host link, bits per second.
    pub fn host_link_bps(&self) -> f64 {
        match self {
            Topo::Rail(r) => r.host_link_gbps * 1e9,
            Topo::ThreeTier(t) => t.host_link_gbps * 1e9,
            Topo::ScaleAcross(x) => x.site.host_link_gbps * 1e9,
        }
    }

    /// Bytes a frame adds to its payload.
    pub fn frame_overhead_bytes(&self) -> u32 {
        match self {
            Topo::Rail(r) => r.fabric.frame_overhead_bytes,
            Topo::ThreeTier(t) => t.fabric.frame_overhead_bytes,
            Topo::ScaleAcross(x) => x.site.fabric.frame_overhead_bytes,
        }
    }

    /// Hosts under one leaf.
    pub fn hosts_per_leaf(&self) -> usize {
        match self {
            Topo::Rail(r) => r.servers_per_su,
            Topo::ThreeTier(t) => t.hosts_per_leaf,
            Topo::ScaleAcross(x) => x.site.hosts_per_leaf,
        }
    }

    /// The leaf of host `i`.
    pub fn leaf_of(&self, i: usize) -> usize {
        match self {
            Topo::Rail(r) => r.leaf_of(i),
            Topo::ThreeTier(t) => t.leaf_of(i),
            Topo::ScaleAcross(x) => x.leaf_of(i),
        }
    }

    /// The rails (1 but for a rail-optimized fabric).
    pub fn rails(&self) -> usize {
        match self {
            Topo::Rail(r) => r.rails.max(1),
            _ => 1,
        }
    }

    /// The groups a collective runs in, each in its ring (and tree) order: on a
    /// rail-optimized fabric one group per rail (that rail's NIC of every server, server
    /// order), as NCCL runs one ring per rail with the data split between them; elsewhere one
    /// group of every host in host order (consecutive hosts share a leaf, so a ring crosses
    /// the spines once per leaf, and the long links of two sites twice).
    pub fn collective_groups(&self) -> Vec<Vec<usize>> {
        match self {
            Topo::Rail(r) => (0..r.rails)
                .map(|rail| (0..r.servers()).map(|s| r.nic(s, rail)).collect())
                .collect(),
            _ => vec![(0..self.hosts()).collect()],
        }
    }

    /// The partner of each host in a permutation: a random derangement of the hosts, or on a
    /// rail-optimized fabric of the servers, NIC `r` sending to NIC `r` of its partner (what a
    /// rail-aware library does: data changes rails inside the server, over NVLink, as PXN).
    pub fn permutation(&self, seed: u64) -> Vec<usize> {
        match self {
            Topo::Rail(r) => {
                let servers = super::fabric::derangement(r.servers(), seed);
                (0..r.hosts())
                    .map(|e| r.nic(servers[e / r.rails.max(1)], r.rail_of(e)))
                    .collect()
            }
            _ => super::fabric::derangement(self.hosts(), seed),
        }
    }

    /// The peers of host `i` in an all-to-all: every other host, or on a rail-optimized
    /// fabric the same rail's NIC of every other server (as [`Topo::permutation`]). Each host
    /// starts with a different peer.
    pub fn all_to_all_peers(&self, i: usize) -> Vec<usize> {
        match self {
            Topo::Rail(r) => {
                let (server, rail, n) = (i / r.rails.max(1), r.rail_of(i), r.servers());
                (1..n).map(|k| r.nic((server + k) % n, rail)).collect()
            }
            _ => {
                let n = self.hosts();
                (1..n).map(|k| (i + k) % n).collect()
            }
        }
    }

    /// The round trip of the longest route with empty queues, propagation only, ns (for
    /// timeouts before the first sample).
    pub fn base_rtt_ns(&self) -> u64 {
        match self {
            Topo::Rail(r) => 8 * r.ports.prop_delay_ns,
            Topo::ThreeTier(t) => 12 * t.ports.prop_delay_ns,
            Topo::ScaleAcross(x) => 2 * (4 * x.site.prop_delay_ns + x.long_delay_ns()),
        }
    }
}
