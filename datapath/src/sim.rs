//! A deterministic simulated network on virtual time.
//!
//! What it does not do: read a clock, start threads, or touch a socket. Every call takes
//! `now` as a [`Timestamp`], and every random choice comes from a ChaCha8 generator derived
//! from the seed passed to [`SimNet::new`], so the same seed and the same sequence of calls
//! give exactly the same deliveries. Print [`SimNet::seed`] when a test fails so the run can
//! be replayed.
//!
//! The network is a set of hosts (addresses) and *links*. A link is the way packets take
//! that host `from` sends on path `p`, to whichever host they are addressed to; it has its
//! own [`LinkConfig`] knobs and its own random stream, seeded from the network seed and a
//! stable hash of `(from, p)`, so traffic on one link never perturbs the random choices of
//! another. Packets sent on path `p` of host `addr` arrive from source port
//! `addr.port() + 1 + p` (wrapping), mimicking the distinct UDP source ports of
//! [`udp`](crate::udp).
//!
//! Per packet, a link applies in order: black-holing, loss, the bandwidth bottleneck with
//! its drop-tail queue, (ECN marking: a later addition), corruption, then the propagation
//! delay plus jitter and possibly a reordering delay, and finally duplication.
//!
//! [`SimNet`] is the per-path-links topology of the [`Network`] trait (the other is the
//! leaf-spine [`Fabric`](crate::fabric::Fabric)); its own methods name hosts by address, the
//! trait's by [`HostId`] (numbered in the order [`SimNet::add_host`] first saw them).
//!
//! Drive it like this:
//!
//! ```
//! use braid_datapath::sim::SimNet;
//! use braid_datapath::{Ecn, Transmit};
//! use braid_time::Timestamp;
//!
//! let a = "10.0.0.1:4791".parse().unwrap();
//! let b = "10.0.0.2:4791".parse().unwrap();
//! let mut net = SimNet::new(7);
//! net.add_host(a, 16);
//! net.add_host(b, 16);
//! let now = Timestamp::ZERO;
//! net.send(now, a, &Transmit { dest: b, path: 3, ecn: Ecn::Ect0, contents: b"hi" });
//! let at = net.next_event().unwrap();
//! let d = net.poll_deliver(at).unwrap();
//! assert_eq!((d.to, d.meta.src.port(), &d.bytes[..]), (b, 4791 + 1 + 3, &b"hi"[..]));
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use braid_time::Timestamp;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

pub use crate::net::Delivery;
use crate::net::rng::{fires, splitmix64, unit};
use crate::net::{Backlog, EventQueue, HostId, Network};
use crate::{Ecn, RecvMeta, Transmit};

/// The knobs of one link. Probabilities are in `0.0..=1.0`: values at or below 0 (or NaN)
/// never fire, values at or above 1 always do.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub delay_ns: u64,
    /// Extra delay drawn uniformly from `0..=jitter_ns` per packet (and per duplicate).
    pub jitter_ns: u64,
    /// Probability that a packet is dropped.
    pub loss: f64,
    /// Probability that a packet is delivered twice (the copy draws its own jitter).
    pub duplicate: f64,
    /// Probability that a packet is held back by an extra [`reorder_extra_ns`], so later
    /// packets overtake it.
    ///
    /// [`reorder_extra_ns`]: LinkConfig::reorder_extra_ns
    pub reorder: f64,
    /// The extra delay of a reordered packet.
    pub reorder_extra_ns: u64,
    /// Probability that one random bit of the payload is flipped (empty payloads are left
    /// alone).
    pub corrupt: f64,
    /// Bottleneck rate in bits per second: packets are serialized one after another, each
    /// taking `payload_bytes * 8 / bandwidth_bps` seconds. `None` is unlimited; `Some(0)` is
    /// a link that never drains, so every packet is dropped at its queue.
    pub bandwidth_bps: Option<u64>,
    /// Capacity of the bottleneck queue (only with a `bandwidth_bps`): a packet is dropped
    /// at the tail when the bytes still queued, plus its own, would exceed it.
    pub queue_bytes: usize,
    /// Drop every packet (a failed link or switch).
    pub blackhole: bool,
}

impl Default for LinkConfig {
    /// 5 µs of delay, nothing else: no jitter, loss, duplication, reordering, corruption or
    /// bandwidth limit, a 1 MiB queue, not black-holed.
    fn default() -> Self {
        LinkConfig {
            delay_ns: 5_000,
            jitter_ns: 0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_extra_ns: 0,
            corrupt: 0.0,
            bandwidth_bps: None,
            queue_bytes: 1 << 20,
            blackhole: false,
        }
    }
}

/// Counters of one link, or of the whole network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets handed to [`SimNet::send`].
    pub sent: u64,
    /// Copies delivered by [`SimNet::poll_deliver`] (duplicates included).
    pub delivered: u64,
    /// Packets dropped by random loss.
    pub lost: u64,
    /// Packets dropped because the link was black-holed.
    pub blackholed: u64,
    /// Extra copies created.
    pub duplicated: u64,
    /// Packets with a flipped bit.
    pub corrupted: u64,
    /// Packets given the extra reordering delay (whether or not anything overtook them).
    pub reordered: u64,
    /// Packets dropped at the tail of a full bottleneck queue.
    pub queue_drops: u64,
    /// Packets addressed to no known host, dropped.
    pub unknown_dest: u64,
}

/// Network-wide totals plus per-link counters. The totals are a [`LinkStats`] too, and the
/// fields of [`SimStats::totals`] read directly (`stats.lost`) through `Deref`.
///
/// Every packet sent is eventually delivered or counted once as lost, blackholed,
/// queue-dropped or unknown-destination; duplicates add copies:
/// `sent + duplicated == delivered + lost + blackholed + queue_drops + unknown_dest +
/// in_flight`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    /// The counters summed over every link.
    pub totals: LinkStats,
    /// The same counters per link, keyed by `(sending host, path)`.
    pub links: BTreeMap<(SocketAddr, u16), LinkStats>,
}

impl std::ops::Deref for SimStats {
    type Target = LinkStats;

    fn deref(&self) -> &LinkStats {
        &self.totals
    }
}

impl SimStats {
    /// The counters of the link host `from` sends on `path`, if it carried anything.
    pub fn link(&self, from: SocketAddr, path: u16) -> Option<&LinkStats> {
        self.links.get(&(from, path))
    }

    fn bump(&mut self, key: LinkKey, counter: Counter) {
        *self.totals.counter(counter) += 1;
        *self.links.entry(key).or_default().counter(counter) += 1;
    }
}

impl LinkStats {
    fn counter(&mut self, counter: Counter) -> &mut u64 {
        match counter {
            Counter::Sent => &mut self.sent,
            Counter::Delivered => &mut self.delivered,
            Counter::Lost => &mut self.lost,
            Counter::Blackholed => &mut self.blackholed,
            Counter::Duplicated => &mut self.duplicated,
            Counter::Corrupted => &mut self.corrupted,
            Counter::Reordered => &mut self.reordered,
            Counter::QueueDrops => &mut self.queue_drops,
            Counter::UnknownDest => &mut self.unknown_dest,
        }
    }
}

/// A deterministic network of hosts joined by per-path links; see the [module
/// docs](self).
#[derive(Debug)]
pub struct SimNet {
    seed: u64,
    /// ChaCha key derived from `seed`; each link uses its own stream under it.
    rng_key: [u8; 32],
    /// Known hosts: the number of paths each declared, and its id.
    hosts: BTreeMap<SocketAddr, (u16, HostId)>,
    /// Host addresses by id.
    addrs: Vec<SocketAddr>,
    default_link: LinkConfig,
    links: BTreeMap<LinkKey, Link>,
    /// Packets on the wire, earliest first.
    pending: EventQueue<(LinkKey, Delivery)>,
    stats: SimStats,
}

impl SimNet {
    /// An empty network whose random choices all derive from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut rng_key = [0u8; 32];
        let mut state = seed;
        for chunk in rng_key.chunks_exact_mut(8) {
            chunk.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
        }
        SimNet {
            seed,
            rng_key,
            hosts: BTreeMap::new(),
            addrs: Vec::new(),
            default_link: LinkConfig::default(),
            links: BTreeMap::new(),
            pending: EventQueue::new(),
            stats: SimStats::default(),
        }
    }

    /// The seed this network was built with: print it on failure to replay the run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Adds (or re-declares) a host that receives at `addr` and sends on `paths` paths;
    /// path `p` sends from port `addr.port() + 1 + p` (wrapping). A host may still send on
    /// a path index of `paths` or more: that is simply one more link.
    ///
    /// Returns the host's id: the next one for a new address, the same one for a re-declared
    /// address.
    pub fn add_host(&mut self, addr: SocketAddr, paths: u16) -> HostId {
        let next = HostId(self.addrs.len() as u32);
        let entry = self.hosts.entry(addr).or_insert((paths, next));
        entry.0 = paths;
        if entry.1 == next {
            self.addrs.push(addr);
        }
        entry.1
    }

    /// The number of paths `addr` declared, or `None` if it is not a host.
    pub fn host_paths(&self, addr: SocketAddr) -> Option<u16> {
        self.hosts.get(&addr).map(|h| h.0)
    }

    /// The source address of packets host `from` sends on `path` (see
    /// [`net::path_source`](crate::net::path_source)).
    pub fn path_source(from: SocketAddr, path: u16) -> SocketAddr {
        crate::net::path_source(from, path)
    }

    /// Sets the config of every link not configured with [`set_link`](Self::set_link) or
    /// [`link_mut`](Self::link_mut), including links that already carried traffic.
    pub fn set_default_link(&mut self, cfg: LinkConfig) {
        self.default_link = cfg;
    }

    /// The config links use unless configured explicitly.
    pub fn default_link(&self) -> &LinkConfig {
        &self.default_link
    }

    /// Configures the link taken by packets host `from` sends on `path` (to any host).
    pub fn set_link(&mut self, from: SocketAddr, path: u16, cfg: LinkConfig) {
        *self.link_mut(from, path) = cfg;
    }

    /// The config of the link host `from` sends on `path`, to change knobs mid-run (for
    /// example `net.link_mut(a, 3).blackhole = true`). A link that followed the default
    /// starts from a copy of it and is configured explicitly from then on.
    pub fn link_mut(&mut self, from: SocketAddr, path: u16) -> &mut LinkConfig {
        let default = &self.default_link;
        let link = link_entry(&mut self.links, &self.rng_key, (from, path));
        link.cfg.get_or_insert_with(|| default.clone())
    }

    /// The config the link host `from` sends on `path` currently follows.
    pub fn link(&self, from: SocketAddr, path: u16) -> &LinkConfig {
        self.links
            .get(&(from, path))
            .and_then(|l| l.cfg.as_ref())
            .unwrap_or(&self.default_link)
    }

    /// Puts `t` on the link host `from` sends on `t.path`. A packet to an address that is
    /// not a host is dropped and counted in [`LinkStats::unknown_dest`] (of [`SimNet::stats`]).
    pub fn send(&mut self, now: Timestamp, from: SocketAddr, t: &Transmit<'_>) {
        let key = (from, t.path);
        let SimNet {
            rng_key,
            hosts,
            default_link,
            links,
            pending,
            stats,
            ..
        } = self;
        let link = link_entry(links, rng_key, key);
        let cfg = link.cfg.as_ref().unwrap_or(default_link);
        // Always the same number of draws per packet, so turning one knob does not shift
        // the random choices of the others.
        let draws = Draws::new(&mut link.rng);
        stats.bump(key, Counter::Sent);

        let Some(&(_, host)) = hosts.get(&t.dest) else {
            stats.bump(key, Counter::UnknownDest);
            return;
        };
        if cfg.blackhole {
            stats.bump(key, Counter::Blackholed);
            return;
        }
        if fires(draws.loss, cfg.loss) {
            stats.bump(key, Counter::Lost);
            return;
        }

        let len = t.contents.len();
        let (depart, queued_ahead_bytes) = match cfg.bandwidth_bps {
            None => (now, 0),
            Some(bandwidth_bps) => {
                let Some(queued) =
                    link.bottleneck
                        .enqueue(now, len, bandwidth_bps, cfg.queue_bytes)
                else {
                    stats.bump(key, Counter::QueueDrops);
                    return;
                };
                queued
            }
        };
        let ecn = congestion_mark(t.ecn, queued_ahead_bytes, cfg);

        let mut bytes = t.contents.to_vec();
        if fires(draws.corrupt, cfg.corrupt) && !bytes.is_empty() {
            let bit = uniform(draws.corrupt_bit, (len as u64).saturating_mul(8) - 1);
            if let Some(byte) = bytes.get_mut((bit / 8) as usize) {
                *byte ^= 1 << (bit % 8);
                stats.bump(key, Counter::Corrupted);
            }
        }

        let base = depart.add_nanos(cfg.delay_ns);
        let mut deliver_at = base.add_nanos(uniform(draws.jitter, cfg.jitter_ns));
        if fires(draws.reorder, cfg.reorder) {
            deliver_at = deliver_at.add_nanos(cfg.reorder_extra_ns);
            stats.bump(key, Counter::Reordered);
        }
        let meta = RecvMeta {
            src: Self::path_source(from, t.path),
            len,
            ecn,
            queued_ns: 0,
        };
        let duplicate = fires(draws.duplicate, cfg.duplicate).then(|| {
            let at = base.add_nanos(uniform(draws.duplicate_jitter, cfg.jitter_ns));
            (at, bytes.clone())
        });
        let mut push = |at: Timestamp, bytes: Vec<u8>| {
            let delivery = Delivery {
                host,
                to: t.dest,
                meta,
                bytes,
            };
            pending.push(at.as_nanos(), (key, delivery));
        };
        push(deliver_at, bytes);
        if let Some((at, copy)) = duplicate {
            push(at, copy);
            stats.bump(key, Counter::Duplicated);
        }
    }

    /// When the earliest packet on the wire arrives, or `None` if none is.
    pub fn next_event(&self) -> Option<Timestamp> {
        self.pending.peek_at().map(Timestamp::from_nanos)
    }

    /// The next packet due at or before `now`, earliest first (ties in the order they were
    /// put on the wire), or `None` if nothing is due.
    pub fn poll_deliver(&mut self, now: Timestamp) -> Option<Delivery> {
        let (_, (link, delivery)) = self.pending.pop_due(now.as_nanos())?;
        self.stats.bump(link, Counter::Delivered);
        Some(delivery)
    }

    /// Packets (and duplicates) on the wire, not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Counters since the network was created.
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }

    /// The id of the host that receives at `addr`.
    pub fn host_id(&self, addr: SocketAddr) -> Option<HostId> {
        self.hosts.get(&addr).map(|h| h.1)
    }
}

/// The per-path-links topology. A datagram to an unknown address is not accepted; every
/// other one is (it may still be lost on its link).
impl Network for SimNet {
    type Stats = SimStats;

    fn seed(&self) -> u64 {
        self.seed
    }

    fn hosts(&self) -> usize {
        self.addrs.len()
    }

    fn host_addr(&self, h: HostId) -> SocketAddr {
        self.addrs[h.0 as usize]
    }

    fn host_by_addr(&self, addr: SocketAddr) -> Option<HostId> {
        self.host_id(addr)
    }

    fn send(&mut self, now: Timestamp, from: HostId, t: &Transmit<'_>) -> bool {
        let addr = self.addrs[from.0 as usize];
        SimNet::send(self, now, addr, t);
        self.hosts.contains_key(&t.dest)
    }

    fn next_event(&self) -> Option<Timestamp> {
        SimNet::next_event(self)
    }

    fn poll_deliver(&mut self, now: Timestamp) -> Option<Delivery> {
        SimNet::poll_deliver(self, now)
    }

    fn in_flight(&self) -> usize {
        SimNet::in_flight(self)
    }

    fn stats(&self) -> &SimStats {
        SimNet::stats(self)
    }
}

/// A link is named by the sending host and the path it sends on.
type LinkKey = (SocketAddr, u16);

#[derive(Debug)]
struct Link {
    /// `None` follows [`SimNet::default_link`].
    cfg: Option<LinkConfig>,
    rng: ChaCha8Rng,
    bottleneck: Bottleneck,
}

/// The serialization state of a link with a bandwidth limit.
#[derive(Debug, Default)]
struct Bottleneck {
    /// When the bottleneck finishes serializing the last accepted packet.
    free_at: Timestamp,
    /// Accepted packets not yet serialized, in payload bytes.
    queue: Backlog,
}

impl Bottleneck {
    /// Puts a `len`-byte packet through the bottleneck at `now`. Returns when it has been
    /// serialized and how many bytes were queued ahead of it, or `None` if the queue is
    /// full (or the link has no bandwidth at all).
    fn enqueue(
        &mut self,
        now: Timestamp,
        len: usize,
        bandwidth_bps: u64,
        queue_bytes: usize,
    ) -> Option<(Timestamp, usize)> {
        self.queue.drain(now.as_nanos());
        let ahead = self.queue.queued();
        if bandwidth_bps == 0 || ahead.saturating_add(len) > queue_bytes {
            return None;
        }
        let start = now.max(self.free_at);
        let done_at = start.add_nanos(serialization_ns(len, bandwidth_bps));
        self.free_at = done_at;
        self.queue.push(done_at.as_nanos(), len);
        Some((done_at, ahead))
    }
}

/// The link for `key`, created on first use with its own random stream.
fn link_entry<'a>(
    links: &'a mut BTreeMap<LinkKey, Link>,
    rng_key: &[u8; 32],
    key: LinkKey,
) -> &'a mut Link {
    links.entry(key).or_insert_with(|| {
        let mut rng = ChaCha8Rng::from_seed(*rng_key);
        rng.set_stream(link_hash(key));
        Link {
            cfg: None,
            rng,
            bottleneck: Bottleneck::default(),
        }
    })
}

/// The ECN codepoint a packet leaves the link with.
///
/// Today it passes through unchanged. Switch ECN marking goes here: mark `Ce` on an
/// ECN-capable packet when `queued_ahead_bytes` is above a threshold from `_cfg`.
fn congestion_mark(ecn: Ecn, _queued_ahead_bytes: usize, _cfg: &LinkConfig) -> Ecn {
    ecn
}

/// Nanoseconds to serialize `len` bytes at `bandwidth_bps` (> 0), rounded up.
fn serialization_ns(len: usize, bandwidth_bps: u64) -> u64 {
    let bits = len as u128 * 8 * 1_000_000_000;
    let ns = bits.div_ceil(u128::from(bandwidth_bps.max(1)));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// The random numbers one packet consumes, always all of them.
struct Draws {
    loss: f64,
    duplicate: f64,
    reorder: f64,
    corrupt: f64,
    corrupt_bit: u64,
    jitter: u64,
    duplicate_jitter: u64,
}

impl Draws {
    fn new(rng: &mut ChaCha8Rng) -> Self {
        Draws {
            loss: unit(rng.next_u64()),
            duplicate: unit(rng.next_u64()),
            reorder: unit(rng.next_u64()),
            corrupt: unit(rng.next_u64()),
            corrupt_bit: rng.next_u64(),
            jitter: rng.next_u64(),
            duplicate_jitter: rng.next_u64(),
        }
    }
}

/// A uniform integer in `0..=max` from a random `r` (multiply-shift, no modulo bias worth
/// noting for simulation).
fn uniform(r: u64, max: u64) -> u64 {
    ((u128::from(r) * (u128::from(max) + 1)) >> 64) as u64
}

/// A stable (FNV-1a) hash of a link key: the same on every run, platform and Rust version.
fn link_hash((addr, path): LinkKey) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    match addr.ip() {
        IpAddr::V4(ip) => {
            eat(&[4]);
            eat(&ip.octets());
        }
        IpAddr::V6(ip) => {
            eat(&[6]);
            eat(&ip.octets());
        }
    }
    eat(&addr.port().to_be_bytes());
    eat(&path.to_be_bytes());
    h
}

#[derive(Copy, Clone, Debug)]
enum Counter {
    Sent,
    Delivered,
    Lost,
    Blackholed,
    Duplicated,
    Corrupted,
    Reordered,
    QueueDrops,
    UnknownDest,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn tx(dest: SocketAddr, path: u16, contents: &[u8]) -> Transmit<'_> {
        Transmit {
            dest,
            path,
            ecn: Ecn::NotEct,
            contents,
        }
    }

    /// Runs the clock to idle, returning `(time, delivery)` in delivery order.
    fn drain(net: &mut SimNet) -> Vec<(Timestamp, Delivery)> {
        let mut out = Vec::new();
        while let Some(at) = net.next_event() {
            while let Some(d) = net.poll_deliver(at) {
                out.push((at, d));
            }
        }
        out
    }

    type Trace = Vec<(u64, SocketAddr, SocketAddr, Ecn, Vec<u8>)>;

    fn trace(deliveries: &[(Timestamp, Delivery)]) -> Trace {
        deliveries
            .iter()
            .map(|(at, d)| (at.as_nanos(), d.to, d.meta.src, d.meta.ecn, d.bytes.clone()))
            .collect()
    }

    /// A busy two-host run with every knob turned; returns what was delivered.
    fn eventful_run(seed: u64) -> (Trace, SimStats) {
        let (a, b) = (addr("10.0.0.1:4791"), addr("10.0.0.2:4791"));
        let mut net = SimNet::new(seed);
        net.add_host(a, 8);
        net.add_host(b, 8);
        net.set_default_link(LinkConfig {
            delay_ns: 10_000,
            jitter_ns: 3_000,
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.1,
            reorder_extra_ns: 20_000,
            corrupt: 0.05,
            bandwidth_bps: Some(10_000_000_000),
            queue_bytes: 64 << 10,
            blackhole: false,
        });
        let mut out = Vec::new();
        for i in 0..2_000u32 {
            let now = Timestamp::from_nanos(u64::from(i) * 700);
            let payload = i.to_be_bytes().repeat(64);
            let ecn = if i % 3 == 0 { Ecn::Ect0 } else { Ecn::NotEct };
            let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
            net.send(
                now,
                from,
                &Transmit {
                    dest: to,
                    path: (i % 8) as u16,
                    ecn,
                    contents: &payload,
                },
            );
            while let Some(d) = net.poll_deliver(now) {
                out.push((now, d));
            }
        }
        out.extend(drain(&mut net));
        (trace(&out), net.stats().clone())
    }

    #[test]
    fn same_seed_same_deliveries_other_seed_differs() {
        let (first, stats) = eventful_run(42);
        let (second, stats2) = eventful_run(42);
        assert_eq!(first, second);
        assert_eq!(stats, stats2);
        assert!(stats.lost > 0 && stats.duplicated > 0 && stats.corrupted > 0);
        assert!(stats.reordered > 0);
        let (other, _) = eventful_run(43);
        assert_ne!(first, other);
    }

    #[test]
    fn traffic_on_one_link_does_not_perturb_another() {
        let (a, b) = (addr("10.0.0.1:4791"), addr("10.0.0.2:4791"));
        let cfg = LinkConfig {
            loss: 0.3,
            jitter_ns: 5_000,
            ..LinkConfig::default()
        };
        let run = |with_other_path: bool| {
            let mut net = SimNet::new(9);
            net.add_host(a, 2);
            net.add_host(b, 2);
            net.set_default_link(cfg.clone());
            for i in 0..500u32 {
                let now = Timestamp::from_micros(u64::from(i));
                let payload = i.to_be_bytes();
                net.send(now, a, &tx(b, 0, &payload));
                if with_other_path {
                    net.send(now, a, &tx(b, 1, &payload));
                    net.send(now, b, &tx(a, 0, &payload));
                }
            }
            let path0_src = SimNet::path_source(a, 0);
            let all = trace(&drain(&mut net));
            all.into_iter()
                .filter(|d| d.2 == path0_src)
                .collect::<Vec<_>>()
        };
        let alone = run(false);
        assert!(!alone.is_empty());
        assert_eq!(alone, run(true));
    }

    #[test]
    fn loss_of_10_percent_drops_10_percent() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(1);
        net.add_host(a, 4);
        net.add_host(b, 4);
        net.set_default_link(LinkConfig {
            loss: 0.1,
            ..LinkConfig::default()
        });
        for i in 0..20_000u64 {
            net.send(
                Timestamp::from_nanos(i * 100),
                a,
                &tx(b, (i % 4) as u16, b"x"),
            );
        }
        let delivered = drain(&mut net).len() as u64;
        let s = net.stats();
        assert_eq!(s.sent, 20_000);
        assert_eq!(s.delivered, delivered);
        assert_eq!(s.lost + s.delivered, 20_000);
        assert!(
            (1_800..=2_200).contains(&s.lost),
            "lost {} (seed {})",
            s.lost,
            net.seed()
        );
        let per_link: u64 = (0..4).map(|p| s.link(a, p).unwrap().lost).sum();
        assert_eq!(per_link, s.lost);
    }

    #[test]
    fn blackhole_drops_everything_until_lifted() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(2);
        net.add_host(a, 2);
        net.add_host(b, 2);
        net.link_mut(a, 1).blackhole = true;
        let mut now = Timestamp::ZERO;
        for _ in 0..100 {
            net.send(now, a, &tx(b, 1, b"lost"));
            net.send(now, a, &tx(b, 0, b"ok"));
            now = now.add_nanos(1_000);
        }
        let got = drain(&mut net);
        assert_eq!(got.len(), 100);
        assert!(got.iter().all(|(_, d)| d.bytes == b"ok"));
        assert_eq!(net.stats().blackholed, 100);
        assert_eq!(net.stats().link(a, 1).unwrap().blackholed, 100);

        net.link_mut(a, 1).blackhole = false;
        for _ in 0..100 {
            net.send(now, a, &tx(b, 1, b"back"));
        }
        let got = drain(&mut net);
        assert_eq!(got.len(), 100);
        assert!(got.iter().all(|(_, d)| d.bytes == b"back"));
        assert_eq!(net.stats().blackholed, 100);
    }

    #[test]
    fn one_gigabit_serializes_1000_byte_packets_8_us_apart() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(3);
        net.add_host(a, 1);
        net.add_host(b, 1);
        net.set_link(
            a,
            0,
            LinkConfig {
                bandwidth_bps: Some(1_000_000_000),
                ..LinkConfig::default()
            },
        );
        let payload = [0u8; 1000];
        for _ in 0..10 {
            net.send(Timestamp::ZERO, a, &tx(b, 0, &payload));
        }
        let times: Vec<u64> = drain(&mut net)
            .iter()
            .map(|(at, _)| at.as_nanos())
            .collect();
        let expected: Vec<u64> = (1..=10).map(|i| 5_000 + i * 8_000).collect();
        assert_eq!(times, expected);
    }

    #[test]
    fn a_full_queue_drops_at_the_tail() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(4);
        net.add_host(a, 1);
        net.add_host(b, 1);
        let cfg = LinkConfig {
            bandwidth_bps: Some(1_000_000_000),
            queue_bytes: 10_000,
            ..LinkConfig::default()
        };
        net.set_link(a, 0, cfg);
        let payload = [0u8; 1000];
        for _ in 0..20 {
            net.send(Timestamp::ZERO, a, &tx(b, 0, &payload));
        }
        assert_eq!(net.stats().queue_drops, 10);
        // After two packets' worth of serialization, two more fit.
        for _ in 0..3 {
            net.send(Timestamp::from_micros(16), a, &tx(b, 0, &payload));
        }
        assert_eq!(net.stats().queue_drops, 11);
        assert_eq!(drain(&mut net).len(), 12);

        net.link_mut(a, 0).bandwidth_bps = Some(0);
        net.send(Timestamp::from_micros(1_000), a, &tx(b, 0, &payload));
        assert_eq!(net.stats().queue_drops, 12);
    }

    #[test]
    fn corruption_flips_exactly_one_bit() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(5);
        net.add_host(a, 1);
        net.add_host(b, 1);
        net.set_default_link(LinkConfig {
            corrupt: 1.0,
            ..LinkConfig::default()
        });
        let payload: Vec<u8> = (0..=255u8).collect();
        for _ in 0..200 {
            net.send(Timestamp::ZERO, a, &tx(b, 0, &payload));
        }
        net.send(Timestamp::ZERO, a, &tx(b, 0, &[]));
        let got = drain(&mut net);
        assert_eq!(got.len(), 201);
        let mut bits_hit = std::collections::BTreeSet::new();
        for (_, d) in &got[..200] {
            let diff: Vec<(usize, u8)> = d
                .bytes
                .iter()
                .zip(&payload)
                .map(|(x, y)| x ^ y)
                .enumerate()
                .filter(|(_, x)| *x != 0)
                .collect();
            assert_eq!(diff.len(), 1);
            assert_eq!(diff[0].1.count_ones(), 1);
            bits_hit.insert(diff[0].0 * 8 + diff[0].1.trailing_zeros() as usize);
        }
        assert!(bits_hit.len() > 100, "corruption should hit many positions");
        assert!(got[200].1.bytes.is_empty());
        assert_eq!(net.stats().corrupted, 200);
    }

    #[test]
    fn reordering_lets_later_packets_overtake() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(6);
        net.add_host(a, 1);
        net.add_host(b, 1);
        net.set_default_link(LinkConfig {
            reorder: 0.2,
            reorder_extra_ns: 50_000,
            ..LinkConfig::default()
        });
        for i in 0..1_000u32 {
            net.send(
                Timestamp::from_micros(u64::from(i)),
                a,
                &tx(b, 0, &i.to_be_bytes()),
            );
        }
        let order: Vec<u32> = drain(&mut net)
            .iter()
            .map(|(_, d)| u32::from_be_bytes(d.bytes[..4].try_into().unwrap()))
            .collect();
        assert_eq!(order.len(), 1_000);
        let overtaken = order.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(overtaken > 50, "only {overtaken} inversions");
        let reordered = net.stats().reordered;
        assert!((150..=250).contains(&reordered), "reordered {reordered}");
    }

    #[test]
    fn duplicates_arrive_twice() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(7);
        net.add_host(a, 1);
        net.add_host(b, 1);
        net.set_default_link(LinkConfig {
            duplicate: 1.0,
            jitter_ns: 1_000,
            ..LinkConfig::default()
        });
        for i in 0..100u32 {
            net.send(
                Timestamp::from_micros(u64::from(i)),
                a,
                &tx(b, 0, &i.to_be_bytes()),
            );
        }
        let got = drain(&mut net);
        assert_eq!(got.len(), 200);
        let mut counts = BTreeMap::new();
        for (_, d) in &got {
            *counts.entry(d.bytes.clone()).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 100);
        assert!(counts.values().all(|c| *c == 2));
        assert_eq!(net.stats().duplicated, 100);
        assert_eq!(net.stats().delivered, 200);
    }

    #[test]
    fn source_ports_and_ecn_follow_the_path() {
        let (a, b) = (addr("10.0.0.1:65534"), addr("[fd00::2]:4791"));
        let mut net = SimNet::new(8);
        net.add_host(a, 4);
        net.add_host(b, 4);
        assert_eq!(net.host_paths(a), Some(4));
        let sends = [
            (0, Ecn::Ect0, 65535),
            (1, Ecn::Ce, 0),
            (3, Ecn::Ect1, 2),
            (999, Ecn::NotEct, 998),
        ];
        for (path, ecn, _) in sends {
            net.send(
                Timestamp::ZERO,
                a,
                &Transmit {
                    dest: b,
                    path,
                    ecn,
                    contents: b"p",
                },
            );
        }
        let got = drain(&mut net);
        assert_eq!(got.len(), sends.len());
        for ((at, d), (_, ecn, port)) in got.iter().zip(sends) {
            assert_eq!(at.as_nanos(), 5_000);
            assert_eq!(d.to, b);
            assert_eq!(d.meta.src, SocketAddr::new(a.ip(), port));
            assert_eq!(d.meta.ecn, ecn);
            assert_eq!(d.meta.len, 1);
        }
    }

    #[test]
    fn unknown_destinations_are_counted_and_dropped() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(9);
        net.add_host(a, 1);
        net.send(Timestamp::ZERO, a, &tx(b, 0, b"nobody"));
        assert_eq!(net.next_event(), None);
        assert!(net.poll_deliver(Timestamp::MAX).is_none());
        assert_eq!(net.stats().unknown_dest, 1);
        assert_eq!(net.stats().link(a, 0).unwrap().unknown_dest, 1);
    }

    #[test]
    fn deliveries_wait_for_their_time() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(10);
        net.add_host(a, 1);
        net.add_host(b, 1);
        net.send(Timestamp::from_micros(10), a, &tx(b, 0, b"1"));
        assert_eq!(net.next_event(), Some(Timestamp::from_micros(15)));
        assert!(net.poll_deliver(Timestamp::from_nanos(14_999)).is_none());
        assert_eq!(net.in_flight(), 1);
        assert!(net.poll_deliver(Timestamp::from_micros(15)).is_some());
        assert_eq!(net.in_flight(), 0);
    }

    #[test]
    fn default_link_changes_reach_unconfigured_links_only() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(11);
        net.add_host(a, 2);
        net.add_host(b, 2);
        net.send(Timestamp::ZERO, a, &tx(b, 0, b"x"));
        net.link_mut(a, 1).delay_ns = 1_000;
        net.set_default_link(LinkConfig {
            delay_ns: 100_000,
            ..LinkConfig::default()
        });
        assert_eq!(net.link(a, 0).delay_ns, 100_000);
        assert_eq!(net.link(a, 1).delay_ns, 1_000);
        drain(&mut net);
        net.send(Timestamp::ZERO, a, &tx(b, 0, b"x"));
        net.send(Timestamp::ZERO, a, &tx(b, 1, b"x"));
        let times: Vec<u64> = drain(&mut net)
            .iter()
            .map(|(at, _)| at.as_nanos())
            .collect();
        assert_eq!(times, vec![1_000, 100_000]);
    }

    #[test]
    fn hostile_configs_do_not_panic() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:1"));
        let mut net = SimNet::new(12);
        net.add_host(a, 1);
        net.add_host(b, 1);
        net.set_default_link(LinkConfig {
            delay_ns: u64::MAX,
            jitter_ns: u64::MAX,
            loss: f64::NAN,
            duplicate: 2.0,
            reorder: -1.0,
            reorder_extra_ns: u64::MAX,
            corrupt: f64::INFINITY,
            bandwidth_bps: Some(1),
            queue_bytes: usize::MAX,
            blackhole: false,
        });
        let big = vec![0u8; 65_507];
        net.send(Timestamp::MAX, a, &tx(b, u16::MAX, &big));
        net.send(Timestamp::ZERO, a, &tx(b, u16::MAX, &[]));
        assert_eq!(net.next_event(), Some(Timestamp::MAX));
        assert_eq!(drain(&mut net).len(), 4);
    }
}
