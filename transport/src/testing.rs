//! A deterministic simulated cluster: real [`Endpoint`]s on a [`SimNet`], on virtual time.
//!
//! No threads and no real clock: [`Cluster::step`] jumps to the earliest pending event (a
//! delivery or an engine timer), delivers, runs timers, and moves every datagram the engines
//! emit into the network. The same seed gives the same run, so a failing test prints its seed
//! and can be replayed.
pub mod sim;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use braid_datapath::sim::{LinkConfig, SimNet};
use braid_datapath::{Ecn, Transmit};
use braid_proto::{
    Access, Completion, CqId, Endpoint, EndpointConfig, MrKeys, PdId, QpInfo, QpOptions, Region,
    Timestamp,
};

/// One simulated device.
#[derive(Debug)]
pub struct Node {
    /// Its engine.
    pub ep: Endpoint,
    /// Its address on the simulated network.
    pub addr: SocketAddr,
    /// Completions polled from the engine, per completion queue.
    pub cqs: HashMap<CqId, VecDeque<Completion>>,
}

/// Engines on a simulated network, driven on virtual time.
#[derive(Debug)]
pub struct Cluster {
    /// The network; change its links at any time.
    pub net: SimNet,
    /// Virtual time now.
    pub now: Timestamp,
    /// The devices.
    pub nodes: Vec<Node>,
    /// Steps taken so far.
    pub steps: u64,
    buf: Vec<u8>,
    /// Seed of the run, from which encrypted QPs' private keys are derived.
    seed: u64,
    /// Private keys drawn so far.
    keys_drawn: u64,
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
        let nodes = (0..n)
            .map(|i| {
                let addr = SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250 + 1) as u8)),
                    4791,
                );
                net.add_host(addr, cfg.paths);
                let mut c = cfg.clone();
                c.seed = seed
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(i as u64);
                Node {
                    ep: Endpoint::new(c, addr),
                    addr,
                    cqs: HashMap::new(),
                }
            })
            .collect();
        Cluster {
            net,
            now: Timestamp::ZERO,
            nodes,
            steps: 0,
            buf: vec![0u8; 65_536],
            seed,
            keys_drawn: 0,
        }
    }

    /// Creates a PD, a CQ and a QP on nodes `a` and `b` and connects the two QPs.
    pub fn connect(&mut self, a: usize, b: usize) -> (Side, Side) {
        self.connect_with(a, b, false)
    }

    /// [`connect`](Self::connect), with both QPs encrypted when `encrypted` is set. Their
    /// private keys derive from the cluster's seed, so the run stays replayable.
    pub fn connect_with(&mut self, a: usize, b: usize, encrypted: bool) -> (Side, Side) {
        let (sa, sb) = (self.new_side(a, encrypted), self.new_side(b, encrypted));
        self.nodes[a]
            .ep
            .connect(sa.qp.qpn, sb.qp)
            .expect("QP in Init");
        self.nodes[b]
            .ep
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
        let ep = &mut self.nodes[n].ep;
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
        let keys = self.nodes[side.node]
            .ep
            .register(side.pd, region.clone(), access)
            .expect("known PD");
        Mr { region, keys }
    }

    /// Moves every pending datagram into the network and every completion into the CQs.
    pub fn flush(&mut self) {
        let now = self.now;
        for node in &mut self.nodes {
            while let Some(t) = node.ep.poll_transmit(now, &mut self.buf) {
                let tx = Transmit {
                    dest: t.dest,
                    path: t.path,
                    ecn: Ecn::from_tos(t.ecn),
                    contents: &self.buf[..t.len],
                };
                self.net.send(now, node.addr, &tx);
            }
            while let Some((cq, c)) = node.ep.poll_completion() {
                node.cqs.entry(cq).or_default().push_back(c);
            }
        }
    }

    /// The earliest pending event: a delivery or an engine timer.
    pub fn next_event(&self) -> Option<Timestamp> {
        let timers = self.nodes.iter().filter_map(|n| n.ep.poll_timeout()).min();
        match (self.net.next_event(), timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Advances to the next event and processes it. False when nothing is pending.
    pub fn step(&mut self) -> bool {
        self.flush();
        let Some(next) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(next);
        self.steps += 1;
        let now = self.now;
        while let Some(d) = self.net.poll_deliver(now) {
            if let Some(node) = self.nodes.iter_mut().find(|n| n.addr == d.to) {
                node.ep
                    .handle_datagram(now, d.meta.src, d.meta.ecn as u8, &d.bytes);
            }
        }
        for node in &mut self.nodes {
            if node.ep.poll_timeout().is_some_and(|t| t <= now) {
                node.ep.handle_timeout(now);
            }
        }
        self.flush();
        true
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
        let seed = self.net.seed();
        assert!(
            self.run_until(max_steps, |c| c.next_event().is_none()),
            "no quiescence after {max_steps} steps (seed {seed})"
        );
    }

    /// Takes the next completion of `cq` on node `node`.
    pub fn poll_cq(&mut self, node: usize, cq: CqId) -> Option<Completion> {
        self.nodes[node].cqs.get_mut(&cq)?.pop_front()
    }

    /// Completions waiting on `cq` of node `node`.
    pub fn cq_len(&self, node: usize, cq: CqId) -> usize {
        self.nodes[node].cqs.get(&cq).map_or(0, VecDeque::len)
    }
}
