//! A deterministic simulated cluster: real [`Endpoint`]s on a [`SimNet`], on virtual time.
//!
//! No threads and no real clock: [`Cluster::step`] jumps to the earliest pending event (a
//! delivery or an engine timer), delivers, runs timers, and moves every datagram the engines
//! emit into the network. The same seed gives the same run, so a failing test prints its seed
//! and can be replayed.
//!
//! A `Cluster` is the one driver ([`sim::Driver`]) over a [`SimNet`], servicing every host
//! at every step ([`sim::Service::EveryHost`]) and queueing completions per host and queue
//! ([`sim::CqQueues`]), plus what tests want on top: nodes at fixed addresses, connected QP
//! pairs, registered regions and seeded keys. It dereferences to the driver, so everything
//! the driver offers (its network, clock, engines, holds, host models, dropped sends,
//! removed or restarted hosts) is there too.
//!
//! Hosts are infinitely fast by default. [`Cluster::set_host`] makes one slow, as a loaded or
//! emulated CPU is ([`HostModel`]): each datagram it handles or sends costs it time, during
//! which its timers and arrivals wait (and are handled late), arrivals beyond its socket
//! buffer are dropped, and it can pause at random, as a descheduled process does.
pub mod sim;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use braid_datapath::net::Delivery;
use braid_datapath::sim::{LinkConfig, SimNet};
use braid_proto::{
    Access, Completion, CqId, Endpoint, EndpointConfig, MrKeys, PdId, QpInfo, QpOptions, Region,
    Timestamp,
};

pub use sim::HostModel;
use sim::{CqQueues, Driver, DriverConfig, Handler, Service};

/// Engines on a simulated network, driven on virtual time: the one driver with the
/// cluster's service order and completion queues (see the [module docs](self)).
#[derive(Debug)]
pub struct Cluster {
    driver: Driver<SimNet>,
    cqs: CqQueues,
    /// Each node's address, by index.
    addrs: Vec<SocketAddr>,
    /// Seed of the run, from which encrypted QPs' private keys are derived.
    seed: u64,
    /// Private keys drawn so far.
    keys_drawn: u64,
}

impl Deref for Cluster {
    type Target = Driver<SimNet>;

    fn deref(&self) -> &Driver<SimNet> {
        &self.driver
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Driver<SimNet> {
        &mut self.driver
    }
}

/// The cluster's handler for one tapped step: every delivery through the tap first, then
/// completions into the queues.
struct Tapped<'a> {
    cqs: &'a mut CqQueues,
    tap: &'a mut dyn FnMut(&Delivery) -> bool,
}

impl Handler<SimNet> for Tapped<'_> {
    fn on_delivery(&mut self, delivery: &Delivery) -> bool {
        (self.tap)(delivery)
    }

    fn on_completion(
        &mut self,
        driver: &mut Driver<SimNet>,
        host: usize,
        cq: CqId,
        completion: Completion,
    ) -> bool {
        self.cqs.on_completion(driver, host, cq, completion)
    }
}

/// One side of a connected QP pair built by [`Cluster::connect`].
#[derive(Copy, Clone, Debug)]
pub struct Side {
    /// Node index.
    pub node: usize,
    /// Protection domain.
    pub pd: PdId,
    /// Completion queue used for sends and receives.
    pub cq: CqId,
    /// The QP.
    pub qp: QpInfo,
}

/// A region registered on a node, with its keys.
#[derive(Clone, Debug)]
pub struct Mr {
    /// The bytes.
    pub region: Arc<Region>,
    /// Keys.
    pub keys: MrKeys,
}

impl Cluster {
    /// `n` nodes at 10.0.0.1.. port 4791, each with `cfg` (its seed mixed with `seed` and the
    /// node index), on a network seeded with `seed` whose links default to `link`.
    pub fn new(seed: u64, n: usize, cfg: &EndpointConfig, link: LinkConfig) -> Cluster {
        let mut net = SimNet::new(seed);
        net.set_default_link(link);
        let config = DriverConfig {
            service: Service::EveryHost,
            ..DriverConfig::default()
        };
        let mut driver = Driver::new(net, config);
        let mut addrs = Vec::with_capacity(n);
        for i in 0..n {
            let addr = SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250 + 1) as u8)),
                4791,
            );
            let id = driver.net.add_host(addr, cfg.paths);
            let mut c = cfg.clone();
            c.seed = seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(i as u64);
            driver.add_host(id, Endpoint::new(c, addr));
            addrs.push(addr);
        }
        Cluster {
            driver,
            cqs: CqQueues::default(),
            addrs,
            seed,
            keys_drawn: 0,
        }
    }

    /// Node `node`'s address on the simulated network.
    pub fn addr(&self, node: usize) -> SocketAddr {
        self.addrs[node]
    }

    /// The engines of the nodes not removed ([`Driver::remove_host`]), in node order.
    pub fn live_endpoints(&self) -> impl Iterator<Item = &Endpoint> + '_ {
        (0..self.driver.host_count())
            .filter(|&h| !self.driver.is_removed(h))
            .map(|h| self.driver.ep(h))
    }

    /// Runs `ep` on node `node` from now on, as a restarted process at the same address:
    /// the completions the old engine left unpolled are gone with it.
    pub fn restart(&mut self, node: usize, ep: Endpoint) -> Endpoint {
        self.cqs.clear(node);
        self.driver.replace_ep(node, ep)
    }

    /// Drops the next `n` datagrams node `node` sends that `which` matches, before they reach
    /// the network: a loss aimed at exactly one packet (a NAK, say). Replaces any earlier rule.
    pub fn drop_sent(&mut self, node: usize, n: u32, which: fn(&[u8]) -> bool) {
        self.driver.clear_drop_sent();
        self.driver.drop_sent(node, n, which);
    }

    /// Makes node `node` run as `model` says from now on (its pauses drawn from the
    /// cluster's seed and the node index).
    pub fn set_host(&mut self, node: usize, model: HostModel) {
        let seed = self.seed ^ (node as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        self.driver.set_host_model(node, model, seed);
    }

    /// Creates a PD, a CQ and a QP on nodes `a` and `b` and connects the two QPs.
    pub fn connect(&mut self, a: usize, b: usize) -> (Side, Side) {
        self.connect_with(a, b, false)
    }

    /// [`connect`](Self::connect), with both QPs encrypted when `encrypted` is set. Their
    /// private keys derive from the cluster's seed, so the run stays replayable.
    pub fn connect_with(&mut self, a: usize, b: usize, encrypted: bool) -> (Side, Side) {
        let (sa, sb) = (self.new_side(a, encrypted), self.new_side(b, encrypted));
        self.driver
            .ep_mut(a)
            .connect(sa.qp.qpn, sb.qp)
            .expect("QP in Init");
        self.driver
            .ep_mut(b)
            .connect(sb.qp.qpn, sa.qp)
            .expect("QP in Init");
        (sa, sb)
    }

    /// A 32-byte private key derived from the seed (splitmix64; test keys only).
    pub fn draw_secret(&mut self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for chunk in out.chunks_mut(8) {
            self.keys_drawn += 1;
            let mut z = self
                .seed
                .wrapping_add(self.keys_drawn.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        out
    }

    /// Creates a PD, a CQ and an (optionally encrypted) QP on node `n`, not connected.
    pub fn new_side(&mut self, n: usize, encrypted: bool) -> Side {
        let opts = if encrypted {
            QpOptions::encrypted(self.draw_secret())
        } else {
            QpOptions::default()
        };
        let ep = self.driver.ep_mut(n);
        let pd = ep.alloc_pd();
        let cq = ep.create_cq();
        let qp = ep
            .create_qp_with(pd, cq, cq, opts)
            .expect("fresh PD and CQ");
        Side {
            node: n,
            pd,
            cq,
            qp,
        }
    }

    /// Allocates and registers a zeroed region of `len` bytes on `side`'s node.
    pub fn alloc_mr(&mut self, side: &Side, len: usize, access: Access) -> Mr {
        let region = Region::new(len);
        let keys = self
            .driver
            .ep_mut(side.node)
            .register(side.pd, region.clone(), access)
            .expect("known PD");
        Mr { region, keys }
    }

    /// Moves every pending datagram into the network and every completion into the CQs. A
    /// slow host that is busy sends nothing until it is free; sending costs it time.
    pub fn flush(&mut self) {
        self.driver.service(&mut self.cqs);
    }

    /// The earliest pending event: a delivery, an engine timer, or a busy slow host becoming
    /// free (its timers and queued arrivals wait for that).
    pub fn next_event(&self) -> Option<Timestamp> {
        self.driver.every_host_next_event()
    }

    /// Advances to the next event and processes it. False when nothing is pending.
    pub fn step(&mut self) -> bool {
        self.driver.step(&mut self.cqs)
    }

    /// [`step`](Self::step), except that the clock never passes `until` (when nothing is due
    /// by then, the clock moves to `until` and the step ends there), and every delivery goes
    /// through `tap` first: it looks at the datagram and says whether it arrives (false: it
    /// is lost). False when nothing is pending and there is no `until`.
    pub fn step_tapped(
        &mut self,
        until: Option<Timestamp>,
        tap: &mut dyn FnMut(&Delivery) -> bool,
    ) -> bool {
        let mut handler = Tapped {
            cqs: &mut self.cqs,
            tap,
        };
        self.driver.step_until(&mut handler, until)
    }

    /// Steps until `done` holds, nothing is pending, or `max_steps` steps have run. Returns
    /// whether `done` held.
    pub fn run_until(
        &mut self,
        max_steps: u64,
        mut done: impl FnMut(&mut Cluster) -> bool,
    ) -> bool {
        self.flush();
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Runs until nothing is pending (all traffic delivered, no timer armed).
    /// Panics (with the seed) if that takes more than `max_steps` steps: a livelock.
    pub fn drive_bounded(&mut self, max_steps: u64) {
        let seed = self.driver.net.seed();
        assert!(
            self.run_until(max_steps, |c| c.next_event().is_none()),
            "no quiescence after {max_steps} steps (seed {seed})"
        );
    }

    /// Takes the next completion of `cq` on node `node`.
    pub fn poll_cq(&mut self, node: usize, cq: CqId) -> Option<Completion> {
        self.cqs.poll(node, cq)
    }

    /// Completions waiting on `cq` of node `node`.
    pub fn cq_len(&self, node: usize, cq: CqId) -> usize {
        self.cqs.len(node, cq)
    }
}
