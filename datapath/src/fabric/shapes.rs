//! The larger fabrics AI clusters are built as, next to [`LeafSpine`]: a rail-optimized
//! leaf-spine ([`RailOptimized`]), a three-tier Clos of pods ([`ThreeTier`]) and two sites
//! joined by long links ([`ScaleAcross`]).
//!
//! Each is a description that builds a [`Topology`] (and from it a [`Fabric`]) with the same
//! conventions as [`LeafSpine`]: hosts are the first nodes, numbered from 0, at
//! `10.0.0.1 + i`; leaves are switches of tier 0, spines tier 1, super-spines tier 2; every
//! switch output port has the same queue limit, ECN threshold and trimming; NIC ports never
//! mark. A *host* of the fabric is one NIC (one Braid endpoint): a rail-optimized server with
//! `R` NICs is `R` hosts of the fabric.
//!
//! Each also lists its [`Cut`]s: groups of hosts (a leaf's, a pod's, a site's) with the
//! capacity that joins the group to the rest of the fabric, each way. A workload's ideal
//! completion time is bounded below by the bytes that must cross each cut over its capacity,
//! which is what the simulator's reports use.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::{FabricConfig, LeafSpine, NodeId, PortConfig, Topology, gbps_to_bps};
use crate::fabric::Fabric;

/// The address of fabric host `i`: `10.0.0.1 + i`, port `port` (as [`LeafSpine::host_addr`]).
pub fn clos_host_addr(port: u16, i: usize) -> SocketAddr {
    let ip = Ipv4Addr::from(0x0A00_0001u32.wrapping_add(i as u32));
    SocketAddr::new(IpAddr::V4(ip), port)
}

/// A group of hosts and what joins it to the rest of the fabric: the bytes the group's hosts
/// send to hosts outside it (and receive from them) cannot cross faster than `capacity_bps`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cut {
    /// What the groups are (`leaf`, `pod`, `site`).
    pub name: &'static str,
    /// The group of each host (index by host).
    pub group_of: Vec<u32>,
    /// Capacity out of each group (and into it: the links are symmetric), bits per second.
    pub capacity_bps: Vec<f64>,
}

/// The settings every switch port of a fabric shares.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchPorts {
    /// Propagation delay of every link, ns.
    pub prop_delay_ns: u64,
    /// Byte limit of every switch output queue (and of the NIC queues).
    pub queue_bytes: usize,
    /// ECN marking threshold of every switch output queue (NICs never mark).
    pub ecn_threshold_bytes: Option<usize>,
    /// Whether switches trim instead of dropping.
    pub trim: bool,
}

impl Default for SwitchPorts {
    /// 1 µs per link, 512 KiB per output queue, ECN above 100 KB, no trimming (as
    /// [`LeafSpine::default`]).
    fn default() -> Self {
        SwitchPorts {
            prop_delay_ns: 1_000,
            queue_bytes: 512 << 10,
            ecn_threshold_bytes: Some(100_000),
            trim: false,
        }
    }
}

impl SwitchPorts {
    fn port(&self, bps: u64) -> PortConfig {
        PortConfig {
            bandwidth_bps: bps,
            prop_delay_ns: self.prop_delay_ns,
            queue_bytes: self.queue_bytes,
            ecn_threshold_bytes: self.ecn_threshold_bytes,
            trim: self.trim,
            loss: 0.0,
            ce_mark: 0.0,
            blackhole: false,
        }
    }

    fn nic(&self, bps: u64) -> PortConfig {
        PortConfig {
            ecn_threshold_bytes: None,
            trim: false,
            ..self.port(bps)
        }
    }
}

/// A rail-optimized leaf-spine, as GB200/GB300 clusters are cabled: servers of `rails` NICs
/// in scalable units of `servers_per_su`; NIC `r` of every server of a unit goes to that
/// unit's rail-`r` leaf, and every leaf has one link to each of `spines` spines (the rails
/// meet at the spines).
///
/// Fabric host `e` is NIC `e % rails` of server `e / rails`. Traffic between NICs of one
/// rail in one unit stays in the rail's leaf; everything else crosses one spine. (NVLink
/// inside a server is not modelled: collectives move data between rails inside the server,
/// and send on the fabric rail to rail, as NCCL's rings and PXN do.)
#[derive(Debug, Clone, PartialEq)]
pub struct RailOptimized {
    /// Servers per scalable unit (hosts under each rail leaf).
    pub servers_per_su: usize,
    /// Scalable units.
    pub sus: usize,
    /// NICs (rails) per server.
    pub rails: usize,
    /// Spine switches.
    pub spines: usize,
    /// Rate of each NIC link, Gbit/s.
    pub host_link_gbps: f64,
    /// A leaf's host-facing capacity over its spine-facing capacity (1.0: full bisection);
    /// sets the leaf–spine rate to `servers_per_su × host_link_gbps / (spines ×
    /// oversubscription)`.
    pub oversubscription: f64,
    /// Queues, delays and marking of every port.
    pub ports: SwitchPorts,
    /// UDP port hosts receive on.
    pub port: u16,
    /// Fabric-wide settings.
    pub fabric: FabricConfig,
}

impl Default for RailOptimized {
    /// 2 units of 4 servers with 8 rails (64 NICs), 8 spines, 100 Gbit/s NICs, full
    /// bisection.
    fn default() -> Self {
        RailOptimized {
            servers_per_su: 4,
            sus: 2,
            rails: 8,
            spines: 8,
            host_link_gbps: 100.0,
            oversubscription: 1.0,
            ports: SwitchPorts::default(),
            port: 4791,
            fabric: FabricConfig::default(),
        }
    }
}

impl RailOptimized {
    /// Number of fabric hosts (NICs): servers × rails.
    pub fn hosts(&self) -> usize {
        self.servers() * self.rails
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.servers_per_su * self.sus
    }

    /// The address of fabric host `e`.
    pub fn host_addr(&self, e: usize) -> SocketAddr {
        clos_host_addr(self.port, e)
    }

    /// The fabric host of NIC `rail` of server `server`.
    pub fn nic(&self, server: usize, rail: usize) -> usize {
        server * self.rails + rail
    }

    /// The rail of fabric host `e`.
    pub fn rail_of(&self, e: usize) -> usize {
        e % self.rails.max(1)
    }

    /// The leaf fabric host `e` is under: `su × rails + rail`.
    pub fn leaf_of(&self, e: usize) -> usize {
        let server = e / self.rails.max(1);
        (server / self.servers_per_su.max(1)) * self.rails + self.rail_of(e)
    }

    /// Number of leaves: units × rails.
    pub fn leaves(&self) -> usize {
        self.sus * self.rails
    }

    /// Rate of each leaf–spine link, bits per second.
    pub fn spine_link_bps(&self) -> u64 {
        let o = if self.oversubscription > 0.0 {
            self.oversubscription
        } else {
            1.0
        };
        gbps_to_bps(
            self.servers_per_su as f64 * self.host_link_gbps / (self.spines.max(1) as f64 * o),
        )
    }

    /// The topology: hosts first (NIC order), then the leaves (tier 0, unit-major), then the
    /// spines (tier 1).
    pub fn topology(&self) -> Topology {
        let mut t = Topology::new(self.fabric.clone());
        let host_bps = gbps_to_bps(self.host_link_gbps);
        let hosts: Vec<NodeId> = (0..self.hosts())
            .map(|e| t.add_host(self.host_addr(e)))
            .collect();
        let leaves: Vec<NodeId> = (0..self.leaves()).map(|_| t.add_switch(0)).collect();
        let spines: Vec<NodeId> = (0..self.spines).map(|_| t.add_switch(1)).collect();
        for (e, h) in hosts.iter().enumerate() {
            t.connect(
                *h,
                leaves[self.leaf_of(e)],
                self.ports.nic(host_bps),
                self.ports.port(host_bps),
            );
        }
        let up = self.spine_link_bps();
        for l in &leaves {
            for s in &spines {
                t.connect(*l, *s, self.ports.port(up), self.ports.port(up));
            }
        }
        t
    }

    /// The fabric, seeded with `seed`.
    pub fn build(&self, seed: u64) -> Fabric {
        self.topology()
            .build(seed)
            .expect("a rail-optimized fabric gives each NIC one port and distinct addresses")
    }

    /// The leaves' cut: each rail leaf's hosts and its uplinks.
    pub fn cuts(&self) -> Vec<Cut> {
        let up = self.spine_link_bps() as f64 * self.spines as f64;
        vec![Cut {
            name: "leaf",
            group_of: (0..self.hosts()).map(|e| self.leaf_of(e) as u32).collect(),
            capacity_bps: vec![up; self.leaves()],
        }]
    }
}

/// A three-tier Clos: `pods` pods, each of `leaves_per_pod` leaves (with `hosts_per_leaf`
/// hosts each) joined to the pod's `spines_per_pod` spines; every spine of every pod has one
/// link to each of `super_spines` super-spines.
///
/// Host `i` is under leaf `i / hosts_per_leaf` (leaves numbered pod-major), in pod
/// `i / (hosts_per_leaf × leaves_per_pod)`. Traffic inside a leaf stays there, inside a pod
/// crosses a spine, between pods crosses spine, super-spine, spine.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreeTier {
    /// Hosts under each leaf.
    pub hosts_per_leaf: usize,
    /// Leaves per pod.
    pub leaves_per_pod: usize,
    /// Spines per pod.
    pub spines_per_pod: usize,
    /// Pods.
    pub pods: usize,
    /// Super-spine switches.
    pub super_spines: usize,
    /// Rate of each host link, Gbit/s.
    pub host_link_gbps: f64,
    /// A leaf's host-facing capacity over its spine-facing capacity (1.0: full bisection).
    pub leaf_oversubscription: f64,
    /// A pod's leaf-facing spine capacity over its super-spine-facing capacity.
    pub spine_oversubscription: f64,
    /// Queues, delays and marking of every port.
    pub ports: SwitchPorts,
    /// UDP port hosts receive on.
    pub port: u16,
    /// Fabric-wide settings.
    pub fabric: FabricConfig,
}

impl Default for ThreeTier {
    /// 4 pods of 2 leaves of 8 hosts (64 hosts), 4 spines per pod, 4 super-spines,
    /// 100 Gbit/s hosts, full bisection at both tiers.
    fn default() -> Self {
        ThreeTier {
            hosts_per_leaf: 8,
            leaves_per_pod: 2,
            spines_per_pod: 4,
            pods: 4,
            super_spines: 4,
            host_link_gbps: 100.0,
            leaf_oversubscription: 1.0,
            spine_oversubscription: 1.0,
            ports: SwitchPorts::default(),
            port: 4791,
            fabric: FabricConfig::default(),
        }
    }
}

fn ratio(o: f64) -> f64 {
    if o > 0.0 { o } else { 1.0 }
}

impl ThreeTier {
    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts_per_leaf * self.leaves_per_pod * self.pods
    }

    /// Hosts per pod.
    pub fn hosts_per_pod(&self) -> usize {
        self.hosts_per_leaf * self.leaves_per_pod
    }

    /// The address of host `i`.
    pub fn host_addr(&self, i: usize) -> SocketAddr {
        clos_host_addr(self.port, i)
    }

    /// The leaf host `i` is under (numbered pod-major).
    pub fn leaf_of(&self, i: usize) -> usize {
        i / self.hosts_per_leaf.max(1)
    }

    /// The pod host `i` is in.
    pub fn pod_of(&self, i: usize) -> usize {
        i / self.hosts_per_pod().max(1)
    }

    /// Rate of each leaf–spine link, bits per second.
    pub fn leaf_link_bps(&self) -> u64 {
        gbps_to_bps(
            self.hosts_per_leaf as f64 * self.host_link_gbps
                / (self.spines_per_pod.max(1) as f64 * ratio(self.leaf_oversubscription)),
        )
    }

    /// Rate of each spine–super-spine link, bits per second.
    pub fn super_link_bps(&self) -> u64 {
        let spine_down = self.leaves_per_pod as f64 * self.leaf_link_bps() as f64;
        (spine_down / (self.super_spines.max(1) as f64 * ratio(self.spine_oversubscription)))
            .round() as u64
    }

    /// The topology: hosts, then the leaves (tier 0, pod-major), the spines (tier 1,
    /// pod-major), the super-spines (tier 2).
    pub fn topology(&self) -> Topology {
        let mut t = Topology::new(self.fabric.clone());
        let host_bps = gbps_to_bps(self.host_link_gbps);
        let hosts: Vec<NodeId> = (0..self.hosts())
            .map(|i| t.add_host(self.host_addr(i)))
            .collect();
        let leaves: Vec<NodeId> = (0..self.pods * self.leaves_per_pod)
            .map(|_| t.add_switch(0))
            .collect();
        let spines: Vec<NodeId> = (0..self.pods * self.spines_per_pod)
            .map(|_| t.add_switch(1))
            .collect();
        let supers: Vec<NodeId> = (0..self.super_spines).map(|_| t.add_switch(2)).collect();
        for (i, h) in hosts.iter().enumerate() {
            t.connect(
                *h,
                leaves[self.leaf_of(i)],
                self.ports.nic(host_bps),
                self.ports.port(host_bps),
            );
        }
        let (lb, sb) = (self.leaf_link_bps(), self.super_link_bps());
        for pod in 0..self.pods {
            for l in 0..self.leaves_per_pod {
                for s in 0..self.spines_per_pod {
                    t.connect(
                        leaves[pod * self.leaves_per_pod + l],
                        spines[pod * self.spines_per_pod + s],
                        self.ports.port(lb),
                        self.ports.port(lb),
                    );
                }
            }
        }
        for s in &spines {
            for x in &supers {
                t.connect(*s, *x, self.ports.port(sb), self.ports.port(sb));
            }
        }
        t
    }

    /// The fabric, seeded with `seed`.
    pub fn build(&self, seed: u64) -> Fabric {
        self.topology()
            .build(seed)
            .expect("a three-tier fabric gives each host one port and distinct addresses")
    }

    /// The leaves' and the pods' cuts.
    pub fn cuts(&self) -> Vec<Cut> {
        let n = self.hosts();
        let leaf_up = self.leaf_link_bps() as f64 * self.spines_per_pod as f64;
        let pod_up =
            self.super_link_bps() as f64 * (self.spines_per_pod * self.super_spines) as f64;
        vec![
            Cut {
                name: "leaf",
                group_of: (0..n).map(|i| self.leaf_of(i) as u32).collect(),
                capacity_bps: vec![leaf_up; self.pods * self.leaves_per_pod],
            },
            Cut {
                name: "pod",
                group_of: (0..n).map(|i| self.pod_of(i) as u32).collect(),
                capacity_bps: vec![pod_up; self.pods],
            },
        ]
    }
}

/// Two sites, each a [`LeafSpine`] (`site`), joined by `long_links` links of
/// `long_link_gbps` that are `distance_km` of fibre long (5 µs per km): long link `k` joins
/// spine `k % spines` of site 0 to the same spine of site 1.
///
/// Hosts `0..site.hosts()` are site 0's, the next as many site 1's (in the same leaf
/// layout). Traffic between the sites goes leaf, spine, long link, spine, leaf; the spines
/// that carry long links are the only ones on the shortest routes between the sites.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleAcross {
    /// Each site's fabric (its `port` and `fabric` settings are the whole fabric's).
    pub site: LeafSpine,
    /// Links between the sites.
    pub long_links: usize,
    /// Rate of each long link, Gbit/s.
    pub long_link_gbps: f64,
    /// Length of the long links, km of fibre.
    pub distance_km: f64,
    /// Output queue limit of the long links' ports (both ends), bytes.
    pub long_queue_bytes: usize,
}

/// Propagation delay of fibre: about 5 µs per km (light at two thirds of c).
pub const FIBRE_NS_PER_KM: f64 = 5_000.0;

impl Default for ScaleAcross {
    /// Two sites of 4 leaves of 8 hosts with 4 spines (64 hosts), 10 km apart, joined by 4
    /// long links of 100 Gbit/s with 4 MiB queues.
    fn default() -> Self {
        ScaleAcross {
            site: LeafSpine {
                hosts_per_leaf: 8,
                leaves: 4,
                spines: 4,
                ..LeafSpine::default()
            },
            long_links: 4,
            long_link_gbps: 100.0,
            distance_km: 10.0,
            long_queue_bytes: 4 << 20,
        }
    }
}

impl ScaleAcross {
    /// Number of hosts (both sites).
    pub fn hosts(&self) -> usize {
        2 * self.site.hosts()
    }

    /// The address of host `i`.
    pub fn host_addr(&self, i: usize) -> SocketAddr {
        clos_host_addr(self.site.port, i)
    }

    /// The site host `i` is in (0 or 1).
    pub fn site_of(&self, i: usize) -> usize {
        usize::from(i >= self.site.hosts())
    }

    /// The leaf host `i` is under (site 0's leaves, then site 1's).
    pub fn leaf_of(&self, i: usize) -> usize {
        i / self.site.hosts_per_leaf.max(1)
    }

    /// One-way propagation delay of a long link, ns.
    pub fn long_delay_ns(&self) -> u64 {
        (self.distance_km.max(0.0) * FIBRE_NS_PER_KM).round() as u64
    }

    /// The topology: hosts, then the leaves of both sites (tier 0), their spines (tier 1);
    /// the long links join spines (tier 1 to tier 1).
    pub fn topology(&self) -> Topology {
        let s = &self.site;
        let mut t = Topology::new(s.fabric.clone());
        let sp = SwitchPorts {
            prop_delay_ns: s.prop_delay_ns,
            queue_bytes: s.queue_bytes,
            ecn_threshold_bytes: s.ecn_threshold_bytes,
            trim: s.trim,
        };
        let host_bps = gbps_to_bps(s.host_link_gbps);
        let hosts: Vec<NodeId> = (0..self.hosts())
            .map(|i| t.add_host(self.host_addr(i)))
            .collect();
        let leaves: Vec<NodeId> = (0..2 * s.leaves).map(|_| t.add_switch(0)).collect();
        let spines: Vec<NodeId> = (0..2 * s.spines).map(|_| t.add_switch(1)).collect();
        for (i, h) in hosts.iter().enumerate() {
            t.connect(
                *h,
                leaves[self.leaf_of(i)],
                sp.nic(host_bps),
                sp.port(host_bps),
            );
        }
        let up = s.spine_link_bps();
        for site in 0..2 {
            for l in 0..s.leaves {
                for k in 0..s.spines {
                    t.connect(
                        leaves[site * s.leaves + l],
                        spines[site * s.spines + k],
                        sp.port(up),
                        sp.port(up),
                    );
                }
            }
        }
        let long = PortConfig {
            prop_delay_ns: self.long_delay_ns(),
            queue_bytes: self.long_queue_bytes,
            ..sp.port(gbps_to_bps(self.long_link_gbps))
        };
        if s.spines > 0 {
            for k in 0..self.long_links {
                let k = k % s.spines;
                t.connect(spines[k], spines[s.spines + k], long.clone(), long.clone());
            }
        }
        t
    }

    /// The fabric, seeded with `seed`.
    pub fn build(&self, seed: u64) -> Fabric {
        self.topology()
            .build(seed)
            .expect("two sites give each host one port and distinct addresses")
    }

    /// The leaves' and the sites' cuts.
    pub fn cuts(&self) -> Vec<Cut> {
        let n = self.hosts();
        let s = &self.site;
        let leaf_up = s.spine_link_bps() as f64 * s.spines as f64;
        let long = gbps_to_bps(self.long_link_gbps) as f64 * self.long_links as f64;
        vec![
            Cut {
                name: "leaf",
                group_of: (0..n).map(|i| self.leaf_of(i) as u32).collect(),
                capacity_bps: vec![leaf_up; 2 * s.leaves],
            },
            Cut {
                name: "site",
                group_of: (0..n).map(|i| self.site_of(i) as u32).collect(),
                capacity_bps: vec![long; 2],
            },
        ]
    }
}

impl LeafSpine {
    /// The leaves' cut: each leaf's hosts and its uplinks.
    pub fn cuts(&self) -> Vec<Cut> {
        let up = self.spine_link_bps() as f64 * self.spines as f64;
        vec![Cut {
            name: "leaf",
            group_of: (0..self.hosts()).map(|i| self.leaf_of(i) as u32).collect(),
            capacity_bps: vec![up; self.leaves],
        }]
    }
}

#[cfg(test)]
mod tests {
    use braid_time::Timestamp;

    use super::*;
    use crate::fabric::HostId;
    use crate::net::Network;
    use crate::{Ecn, Transmit};

    /// Sends one 1000-byte datagram from `a` to `b` and returns (arrival ns, hops).
    fn one(f: &mut Fabric, a: usize, b: SocketAddr, path: u16) -> (u64, u64) {
        let before = f.stats().hops;
        let payload = [0u8; 1000];
        let t = Transmit {
            dest: b,
            path,
            ecn: Ecn::Ect0,
            contents: &payload,
        };
        assert!(f.send(Timestamp::ZERO, HostId(a as u32), &t));
        loop {
            let at = f.next_event().expect("the packet is in flight");
            if let Some(d) = f.poll_deliver(at) {
                assert_eq!(Some(d.host), f.host_by_addr(b));
                return (at.as_nanos(), f.stats().hops - before);
            }
        }
    }

    #[test]
    fn rail_traffic_stays_in_its_leaf_and_other_rails_cross_a_spine() {
        let r = RailOptimized {
            servers_per_su: 2,
            sus: 2,
            rails: 4,
            spines: 2,
            ..RailOptimized::default()
        };
        assert_eq!((r.hosts(), r.leaves()), (16, 8));
        let mut f = r.build(1);
        // Server 0 rail 1 to server 1 rail 1: same unit, same rail leaf.
        assert_eq!(one(&mut f, r.nic(0, 1), r.host_addr(r.nic(1, 1)), 0).1, 2);
        // Same rail, other unit: through a spine.
        assert_eq!(one(&mut f, r.nic(0, 1), r.host_addr(r.nic(2, 1)), 0).1, 4);
        // Other rail, same unit: through a spine too (the rails meet there).
        assert_eq!(one(&mut f, r.nic(0, 1), r.host_addr(r.nic(1, 2)), 0).1, 4);
        assert_eq!(r.leaf_of(r.nic(3, 2)), 4 + 2);
        // Full bisection: a leaf's 2 × 100 Gbit/s of hosts over 2 spines.
        assert_eq!(r.spine_link_bps(), 100_000_000_000);
        assert_eq!(f.tier_ports(0, 1).len(), 8 * 2);
    }

    #[test]
    fn three_tier_routes_between_pods_over_the_super_spines() {
        let t = ThreeTier {
            hosts_per_leaf: 2,
            leaves_per_pod: 2,
            spines_per_pod: 2,
            pods: 2,
            super_spines: 2,
            leaf_oversubscription: 2.0,
            spine_oversubscription: 2.0,
            ..ThreeTier::default()
        };
        assert_eq!(t.hosts(), 8);
        // Leaf: 2 × 100 down, 2 spines at 2:1: 50 each. Spine: 2 leaves × 50 down, 2 supers
        // at 2:1: 25 each.
        assert_eq!(t.leaf_link_bps(), 50_000_000_000);
        assert_eq!(t.super_link_bps(), 25_000_000_000);
        let mut f = t.build(2);
        assert_eq!(one(&mut f, 0, t.host_addr(1), 0).1, 2);
        assert_eq!(one(&mut f, 0, t.host_addr(2), 0).1, 4);
        assert_eq!(one(&mut f, 0, t.host_addr(4), 0).1, 6);
        assert_eq!(f.tier_ports(1, 2).len(), 4 * 2);
        // Many paths between pods spread over every super-spine.
        let mut f = t.build(3);
        for path in 0..64 {
            one(&mut f, 0, t.host_addr(5), path);
        }
        let used = f
            .tier_ports(1, 2)
            .iter()
            .filter(|p| f.port_stats(**p).packets > 0)
            .count();
        // Host 0's pod has 2 spines × 2 super-spines = 4 uplinks towards the other pod.
        assert_eq!(used, 4);
        let cuts = t.cuts();
        assert_eq!(cuts[1].group_of, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(cuts[1].capacity_bps, vec![100e9, 100e9]);
    }

    #[test]
    fn scale_across_crosses_the_long_links_only_between_sites() {
        let x = ScaleAcross {
            site: LeafSpine {
                hosts_per_leaf: 2,
                leaves: 2,
                spines: 2,
                ..LeafSpine::default()
            },
            long_links: 1,
            distance_km: 10.0,
            ..ScaleAcross::default()
        };
        assert_eq!(x.hosts(), 8);
        assert_eq!(x.long_delay_ns(), 50_000);
        let mut f = x.build(4);
        let (t_local, h_local) = one(&mut f, 0, x.host_addr(2), 0);
        assert_eq!(h_local, 4);
        let (t_far, h_far) = one(&mut f, 0, x.host_addr(6), 0);
        assert_eq!(h_far, 5);
        // One long link more than the local route's hops: 50 µs of fibre.
        assert!(t_far > t_local + 50_000, "{t_far} vs {t_local}");
        assert_eq!(f.tier_ports(1, 1).len(), 2);
        for p in f.tier_ports(1, 1) {
            assert_eq!(
                f.port_stats(p).packets,
                u64::from(f.port_ends(p).0 == NodeId(8 + 4))
            );
        }
    }

    #[test]
    fn a_thousand_hosts_build_for_each_shape() {
        let r = RailOptimized {
            servers_per_su: 32,
            sus: 4,
            rails: 8,
            spines: 32,
            ..RailOptimized::default()
        };
        let t = ThreeTier {
            hosts_per_leaf: 16,
            leaves_per_pod: 8,
            spines_per_pod: 8,
            pods: 8,
            super_spines: 8,
            ..ThreeTier::default()
        };
        let x = ScaleAcross {
            site: LeafSpine {
                hosts_per_leaf: 32,
                leaves: 16,
                spines: 16,
                ..LeafSpine::default()
            },
            long_links: 16,
            ..ScaleAcross::default()
        };
        assert_eq!((r.hosts(), t.hosts(), x.hosts()), (1024, 1024, 1024));
        for (mut f, to) in [
            (r.build(5), r.host_addr(1023)),
            (t.build(5), t.host_addr(1023)),
            (x.build(5), x.host_addr(1023)),
        ] {
            assert_eq!(f.hosts(), 1024);
            let (_, hops) = one(&mut f, 0, to, 9);
            assert!(hops >= 4, "{hops}");
        }
    }
}
