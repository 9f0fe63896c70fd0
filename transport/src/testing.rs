//! A deterministic simulated cluster: real [`Endpoint`]s on a [`SimNet`], on virtual time.
//!
//! No threads and no real clock: [`Cluster::step`] jumps to the earliest pending event (a
//! delivery or an engine timer), delivers, runs timers, and moves every datagram the engines
//! emit into the network. The same seed gives the same run, so a failing test prints its seed
//! and can be replayed.
//!
//! Hosts are infinitely fast by default. [`Cluster::set_host`] makes one slow, as a loaded or
//! emulated CPU is ([`HostModel`]): each datagram it handles or sends costs it time, during
//! which its timers and arrivals wait (and are handled late), arrivals beyond its socket
//! buffer are dropped, and it can pause at random, as a descheduled process does.
pub mod sim;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use braid_datapath::sim::{Delivery, LinkConfig, SimNet};
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

/// How fast a simulated host runs. `Default` is an infinitely fast host (no cost, no pause),
/// which is what every node is unless [`Cluster::set_host`] says otherwise.
#[derive(Copy, Clone, Debug, Default)]
pub struct HostModel {
    /// Time each datagram handled or sent costs the host, ns. While it works it handles
    /// nothing else: arrivals queue, timers fire late.
    pub cost_ns: u64,
    /// Arrivals queued while busy, at most (a socket buffer); more are dropped. 0 means 256.
    pub queue: usize,
    /// Mean time between pauses, ns (0: never pauses). Pause starts are drawn uniformly
    /// from 0 to twice this after the previous pause ends.
    pub pause_every_ns: u64,
    /// How long one pause lasts, ns.
    pub pause_ns: u64,
}

impl HostModel {
    /// A host `factor` times slower than one that spends a microsecond per datagram.
    pub fn slower(factor: u64) -> HostModel {
        HostModel {
            cost_ns: factor * 1_000,
            ..HostModel::default()
        }
    }

    /// A host that pauses for `pause_ns` every `every_ns` on average.
    pub fn pausing(every_ns: u64, pause_ns: u64) -> HostModel {
        HostModel {
            pause_every_ns: every_ns,
            pause_ns,
            ..HostModel::default()
        }
    }
}

/// What a slow host is doing: busy until when, what waits for it, when it pauses next.
#[derive(Debug, Default)]
struct HostState {
    model: HostModel,
    busy_until: Timestamp,
    inbox: VecDeque<Delivery>,
    next_pause: Option<Timestamp>,
    /// It handled something while busy and has not polled for datagrams to send since.
    owes_flush: bool,
    rng: u64,
    dropped: u64,
    pauses: u64,
}

impl HostState {
    fn is_slow(&self) -> bool {
        self.model.cost_ns > 0 || self.model.pause_every_ns > 0
    }

    fn draw(&mut self) -> u64 {
        // splitmix64: deterministic from the cluster's seed and the node index.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn schedule_pause(&mut self, after: Timestamp) {
        let every = self.model.pause_every_ns;
        self.next_pause = (every > 0).then(|| after.add_nanos(self.draw() % (2 * every)));
    }

    /// True when the host may work at `now`; starts a due pause first.
    fn ready(&mut self, now: Timestamp) -> bool {
        if let Some(p) = self.next_pause
            && p <= now
            && self.busy_until <= now
        {
            self.busy_until = now.add_nanos(self.model.pause_ns);
            self.pauses += 1;
            self.schedule_pause(self.busy_until);
        }
        self.busy_until <= now
    }

    fn work(&mut self, now: Timestamp, datagrams: u64) {
        let from = self.busy_until.max(now);
        self.busy_until = from.add_nanos(self.model.cost_ns.saturating_mul(datagrams));
    }
}

/// A rule of [`Cluster::drop_sent`]: the node, how many more to drop, and which datagrams.
#[derive(Copy, Clone, Debug)]
struct TxDrop {
    node: usize,
    left: u32,
    which: fn(&[u8]) -> bool,
}

/// Most queued arrivals a slow host handles in one go (a receive batch).
const HOST_BATCH: usize = 32;

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
    /// Per node: how fast it runs and what waits for it.
    hosts: Vec<HostState>,
    /// Datagrams to drop as they leave a node.
    tx_drop: Option<TxDrop>,
    /// Datagrams dropped by `tx_drop` so far.
    tx_dropped: u64,
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
            hosts: (0..n).map(|_| HostState::default()).collect(),
            tx_drop: None,
            tx_dropped: 0,
        }
    }

    /// Drops the next `n` datagrams node `node` sends that `which` matches, before they reach
    /// the network: a loss aimed at exactly one packet (a NAK, say). Replaces any earlier rule.
    pub fn drop_sent(&mut self, node: usize, n: u32, which: fn(&[u8]) -> bool) {
        self.tx_drop = Some(TxDrop {
            node,
            left: n,
            which,
        });
    }

    /// Datagrams dropped by [`drop_sent`](Self::drop_sent) so far.
    pub fn dropped_sent(&self) -> u64 {
        self.tx_dropped
    }

    /// Makes node `node` run as `model` says from now on.
    pub fn set_host(&mut self, node: usize, model: HostModel) {
        let h = &mut self.hosts[node];
        h.model = model;
        h.rng = self.seed ^ (node as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        h.schedule_pause(self.now);
    }

    /// Arrivals node `node` dropped because its queue was full while it was busy.
    pub fn host_drops(&self, node: usize) -> u64 {
        self.hosts[node].dropped
    }

    /// Pauses node `node` has taken.
    pub fn host_pauses(&self, node: usize) -> u64 {
        self.hosts[node].pauses
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

    /// Moves every pending datagram into the network and every completion into the CQs. A
    /// slow host that is busy sends nothing until it is free; sending costs it time.
    pub fn flush(&mut self) {
        let now = self.now;
        for (i, (node, host)) in self.nodes.iter_mut().zip(&mut self.hosts).enumerate() {
            if host.is_slow() && !host.ready(now) {
                continue;
            }
            let mut sent = 0;
            while let Some(t) = node.ep.poll_transmit(now, &mut self.buf) {
                let tx = Transmit {
                    dest: t.dest,
                    path: t.path,
                    ecn: Ecn::from_tos(t.ecn),
                    contents: &self.buf[..t.len],
                };
                sent += 1;
                if let Some(d) = &mut self.tx_drop
                    && d.node == i
                    && d.left > 0
                    && (d.which)(tx.contents)
                {
                    d.left -= 1;
                    self.tx_dropped += 1;
                    continue;
                }
                self.net.send(now, node.addr, &tx);
            }
            if host.is_slow() {
                host.work(now, sent);
                host.owes_flush = false;
            }
            while let Some((cq, c)) = node.ep.poll_completion() {
                node.cqs.entry(cq).or_default().push_back(c);
            }
        }
    }

    /// The earliest pending event: a delivery, an engine timer, or a busy slow host becoming
    /// free (its timers and queued arrivals wait for that).
    pub fn next_event(&self) -> Option<Timestamp> {
        let timers = self
            .nodes
            .iter()
            .zip(&self.hosts)
            .filter_map(|(n, h)| {
                let t = n.ep.poll_timeout();
                if !h.is_slow() {
                    return t;
                }
                // An idle host's pauses are no events: the run may end while it sleeps.
                let owed = (!h.inbox.is_empty() || h.owes_flush).then_some(h.busy_until);
                [t.map(|t| t.max(h.busy_until)), owed]
                    .into_iter()
                    .flatten()
                    .min()
            })
            .min();
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
            let Some(i) = self.nodes.iter().position(|n| n.addr == d.to) else {
                continue;
            };
            let host = &mut self.hosts[i];
            if host.is_slow() {
                let cap = if host.model.queue == 0 {
                    256
                } else {
                    host.model.queue
                };
                if host.inbox.len() < cap {
                    host.inbox.push_back(d);
                } else {
                    host.dropped += 1;
                }
                continue;
            }
            self.nodes[i]
                .ep
                .handle_datagram(now, d.meta.src, d.meta.ecn as u8, &d.bytes);
        }
        for (node, host) in self.nodes.iter_mut().zip(&mut self.hosts) {
            if host.is_slow() {
                // A batch of what arrived, then the timers, at whatever time the host is free.
                if !host.ready(now) {
                    continue;
                }
                let n = host.inbox.len().min(HOST_BATCH);
                for d in host.inbox.drain(..n) {
                    node.ep
                        .handle_datagram(now, d.meta.src, d.meta.ecn as u8, &d.bytes);
                }
                host.work(now, n as u64);
                host.owes_flush = true;
            }
            if node.ep.poll_timeout().is_some_and(|t| t <= now) {
                node.ep.handle_timeout(now);
                host.owes_flush = true;
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
