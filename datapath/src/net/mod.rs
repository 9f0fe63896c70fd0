//! One network model behind one trait: what a driver of real engines needs from a simulated
//! network, whatever its topology.
//!
//! What it does not do: read a clock, start threads, or touch a socket. Two topologies
//! implement [`Network`]:
//!
//! - [`SimNet`](crate::sim::SimNet): hosts joined by *per-path links*, each with its own
//!   delay, jitter, loss, duplication, corruption, reordering, bandwidth bottleneck and
//!   black-holing (the fault-injection network of the tests);
//! - [`Fabric`](crate::fabric::Fabric): a switched fabric (a leaf-spine, usually) with an
//!   output queue per port, ECN marking, trimming and ECMP hashing of the 5-tuple (the
//!   fabric-scale studies).
//!
//! Both hand out the same [`Delivery`], name hosts by the same [`HostId`] (numbered in the
//! order they were added), and keep their pending events in the same [`EventQueue`], so
//! ties between events at one nanosecond are broken the same way: by the order they were
//! queued. A driver (`braid::testing::driver`) runs engines over any of them through this
//! trait: it sends each engine's datagrams with [`Network::send`] (or
//! [`Network::send_buf`]), steps to [`Network::next_event`], and hands what
//! [`Network::poll_deliver`] returns to the receiving engine. A network with a NIC model
//! (the fabric) also says how full a host's NIC queue is, so the driver asks the engine for
//! a datagram only when the NIC has room, as a real NIC's backpressure does.
use std::net::SocketAddr;

use braid_time::Timestamp;

use crate::{Ecn, RecvMeta, Transmit};

mod event;
mod hash;
mod queue;
pub(crate) mod rng;

pub use event::EventQueue;
pub(crate) use hash::AddrMap;
pub(crate) use queue::Backlog;

/// A host of a simulated network, numbered `0..` in the order it was added.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(pub u32);

/// One datagram arriving at a host.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The receiving host.
    pub host: HostId,
    /// The receiving host's address (the `dest` the datagram was sent to).
    pub to: SocketAddr,
    /// Source (sender IP, source port of the path), length and ECN codepoint as it arrived.
    pub meta: RecvMeta,
    /// The payload, possibly corrupted or trimmed on the way. Hand it back with
    /// [`Network::recycle`] to save an allocation.
    pub bytes: Vec<u8>,
}

/// The source address of datagrams host `from` sends on `path`: `from.port() + 1 + path`
/// (wrapping), mimicking the distinct UDP source ports of [`udp`](crate::udp). Every
/// topology uses it, so a path picks the same source port (and ECMP route) on each.
pub fn path_source(from: SocketAddr, path: u16) -> SocketAddr {
    SocketAddr::new(from.ip(), from.port().wrapping_add(1).wrapping_add(path))
}

/// A deterministic simulated network on virtual time; see the [module docs](self).
///
/// Every method that advances the model takes `now`; the same calls in the same order give
/// the same deliveries. Calls must not go back in time (`now` never decreases).
pub trait Network {
    /// Counters the network keeps.
    type Stats;

    /// The seed the network was built with: print it on failure to replay the run.
    fn seed(&self) -> u64;

    /// Number of hosts.
    fn hosts(&self) -> usize;

    /// The address host `h` receives at.
    ///
    /// # Panics
    ///
    /// If `h` is not a host of this network.
    fn host_addr(&self, h: HostId) -> SocketAddr;

    /// The host that receives at `addr`.
    fn host_by_addr(&self, addr: SocketAddr) -> Option<HostId>;

    /// Puts `t` on the network at `now`, sent by host `from` on path `t.path` (from
    /// [`path_source`]). Returns whether the network accepted it (false: it was dropped at
    /// once, for example for an unknown destination; it is counted in the stats either way).
    fn send(&mut self, now: Timestamp, from: HostId, t: &Transmit<'_>) -> bool;

    /// Like [`Network::send`], with the payload in an owned buffer (see
    /// [`Network::buffer`]), which a network that carries buffers takes without a copy.
    fn send_buf(
        &mut self,
        now: Timestamp,
        from: HostId,
        dest: SocketAddr,
        path: u16,
        ecn: Ecn,
        bytes: Vec<u8>,
    ) -> bool {
        let t = Transmit {
            dest,
            path,
            ecn,
            contents: &bytes,
        };
        let accepted = self.send(now, from, &t);
        self.recycle(bytes);
        accepted
    }

    /// A buffer of `len` bytes (of unspecified contents) for [`Network::send_buf`], recycled
    /// when the network keeps a pool.
    fn buffer(&mut self, len: usize) -> Vec<u8> {
        vec![0; len]
    }

    /// Hands a delivered payload buffer back for reuse (a network without a pool drops it).
    fn recycle(&mut self, bytes: Vec<u8>) {
        drop(bytes);
    }

    /// When the next event inside the network happens (a delivery, or a packet reaching a
    /// switch), or `None` if nothing is in flight.
    fn next_event(&self) -> Option<Timestamp>;

    /// Runs the network up to `now` and returns the next datagram due at a host at or before
    /// `now`, earliest first (ties in the order they were queued), or `None` once none is.
    fn poll_deliver(&mut self, now: Timestamp) -> Option<Delivery>;

    /// Packets (and duplicates) inside the network, not yet delivered or dropped.
    fn in_flight(&self) -> usize;

    /// Counters since the network was created.
    fn stats(&self) -> &Self::Stats;

    /// Whether host NICs have queues of their own ([`Network::nic_backlog_bytes`]); a
    /// network without them accepts every datagram at once.
    fn has_nic_queues(&self) -> bool {
        false
    }

    /// Wire bytes queued at host `h`'s NIC at `now` (the frame being sent included); 0 for a
    /// network without NIC queues.
    fn nic_backlog_bytes(&mut self, h: HostId, now: Timestamp) -> usize {
        let _ = (h, now);
        0
    }

    /// The earliest time at or after `now` when host `h`'s NIC holds fewer than
    /// `below_bytes` wire bytes if nothing more is sent; `now` for a network without NIC
    /// queues.
    fn nic_drained_at(&self, h: HostId, now: Timestamp, below_bytes: usize) -> Timestamp {
        let _ = (h, below_bytes);
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::LeafSpine;
    use crate::sim::SimNet;

    /// Host 0 sends one datagram to host 1 on path 3 through the trait; returns what arrived
    /// and when.
    fn ping<N: Network>(net: &mut N) -> (Timestamp, Delivery) {
        let (a, b) = (net.host_addr(HostId(0)), net.host_addr(HostId(1)));
        assert_eq!(net.host_by_addr(b), Some(HostId(1)));
        let mut buf = net.buffer(100);
        buf.fill(7);
        assert!(net.send_buf(Timestamp::ZERO, HostId(0), b, 3, Ecn::Ect0, buf));
        assert!(net.in_flight() > 0);
        let mut got = None;
        while let Some(at) = net.next_event() {
            if let Some(d) = net.poll_deliver(at) {
                assert!(net.poll_deliver(at).is_none());
                got = Some((at, d));
            }
        }
        assert_eq!(net.in_flight(), 0);
        let (at, d) = got.expect("delivered");
        assert_eq!((d.host, d.to), (HostId(1), b));
        assert_eq!(d.meta.src, path_source(a, 3));
        assert_eq!((d.meta.len, &d.bytes[..]), (100, &[7u8; 100][..]));
        // An unknown destination is refused.
        let nobody: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let t = Transmit {
            dest: nobody,
            path: 0,
            ecn: Ecn::NotEct,
            contents: b"x",
        };
        assert!(!net.send(at, HostId(0), &t));
        assert_eq!(net.next_event(), None);
        (at, d)
    }

    #[test]
    fn both_topologies_deliver_through_the_trait() {
        let mut sim = SimNet::new(1);
        let a = sim.add_host("10.0.0.1:4791".parse().unwrap(), 4);
        let b = sim.add_host("10.0.0.2:4791".parse().unwrap(), 4);
        assert_eq!((a, b), (HostId(0), HostId(1)));
        assert_eq!(sim.add_host("10.0.0.1:4791".parse().unwrap(), 8), a);
        assert_eq!(Network::hosts(&sim), 2);
        assert!(!sim.has_nic_queues());
        let (at, _) = ping(&mut sim);
        assert_eq!(at.as_nanos(), 5_000);

        let ls = LeafSpine {
            hosts_per_leaf: 2,
            leaves: 1,
            spines: 1,
            ..LeafSpine::default()
        };
        let mut fabric = ls.build(1);
        assert!(fabric.has_nic_queues());
        let (at, _) = ping(&mut fabric);
        // NIC to leaf, leaf to host: two links of 1 µs, 166 wire bytes at 100 Gb/s each.
        assert_eq!(at.as_nanos(), 2 * (1_000 + 14));
    }
}
