//! The network of the targets whose peer is the fuzz input itself (`engine_datagrams`,
//! `ack_sack`): one engine runs, on host 0, under [`braid::testing::sim::Driver`] (the
//! driver the simulated cluster uses); host 1 is its peer's address, where no engine runs.
//!
//! The input's datagrams are injected with [`PeerWire::inject`] and delivered at the instant
//! they were injected; what the engine sends is kept in [`PeerWire::sent`] for the target to
//! check, and goes no further. The engine's NIC takes only as many datagrams as the target
//! allows ([`PeerWire::allow`]), through the driver's NIC backpressure, so the input decides
//! when the engine may transmit, as it did when the targets called `poll_transmit` by hand.
use std::collections::VecDeque;
use std::net::SocketAddr;

use braid::datapath::net::{Delivery, HostId, Network};
use braid::datapath::{Ecn, RecvMeta, Transmit};
use braid::proto::{Completion, CqId, Endpoint, Timestamp};
use braid::testing::sim::{Driver, DriverConfig, Handler, Service};

/// The engine's host.
pub(super) const ENGINE: usize = 0;

/// Host 0 (the engine) and host 1 (its peer), datagrams in from the input and out to checks.
#[derive(Debug)]
pub(super) struct PeerWire {
    addrs: [SocketAddr; 2],
    /// Injected datagrams, each due at the time it was injected.
    inbox: VecDeque<(Timestamp, Delivery)>,
    /// What the engine sent, in order: destination and bytes.
    pub(super) sent: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Datagrams the engine's NIC still takes.
    budget: usize,
}

impl PeerWire {
    fn new(engine: SocketAddr, peer: SocketAddr) -> PeerWire {
        PeerWire {
            addrs: [engine, peer],
            inbox: VecDeque::new(),
            sent: VecDeque::new(),
            budget: 0,
        }
    }

    /// Delivers `bytes` from `from` to the engine at `now`.
    pub(super) fn inject(&mut self, now: Timestamp, from: SocketAddr, ecn: u8, bytes: Vec<u8>) {
        let meta = RecvMeta {
            src: from,
            len: bytes.len(),
            ecn: Ecn::from_tos(ecn),
            queued_ns: 0,
        };
        let d = Delivery {
            host: HostId(ENGINE as u32),
            to: self.addrs[ENGINE],
            meta,
            bytes,
        };
        self.inbox.push_back((now, d));
    }

    /// Lets the engine's NIC take `n` more datagrams (0: none until the next call).
    pub(super) fn allow(&mut self, n: usize) {
        self.budget = n;
    }
}

impl Network for PeerWire {
    type Stats = ();

    fn seed(&self) -> u64 {
        0
    }

    fn hosts(&self) -> usize {
        2
    }

    fn host_addr(&self, h: HostId) -> SocketAddr {
        self.addrs[h.0 as usize]
    }

    fn host_by_addr(&self, addr: SocketAddr) -> Option<HostId> {
        self.addrs
            .iter()
            .position(|&a| a == addr)
            .map(|i| HostId(i as u32))
    }

    fn send(&mut self, _now: Timestamp, from: HostId, t: &Transmit<'_>) -> bool {
        assert_eq!(from, HostId(ENGINE as u32), "only the engine's host sends");
        self.budget = self.budget.saturating_sub(1);
        self.sent.push_back((t.dest, t.contents.to_vec()));
        true
    }

    fn next_event(&self) -> Option<Timestamp> {
        self.inbox.front().map(|&(t, _)| t)
    }

    fn poll_deliver(&mut self, now: Timestamp) -> Option<Delivery> {
        if self.inbox.front().is_some_and(|&(t, _)| t <= now) {
            return self.inbox.pop_front().map(|(_, d)| d);
        }
        None
    }

    fn in_flight(&self) -> usize {
        self.inbox.len()
    }

    fn stats(&self) -> &() {
        &()
    }

    fn has_nic_queues(&self) -> bool {
        true
    }

    fn nic_backlog_bytes(&mut self, _h: HostId, _now: Timestamp) -> usize {
        if self.budget > 0 { 0 } else { usize::MAX }
    }

    fn nic_drained_at(&self, _h: HostId, _now: Timestamp, _below: usize) -> Timestamp {
        // Only the target drains it (`allow`): no wake-up for it.
        Timestamp::from_nanos(u64::MAX / 2)
    }
}

/// A [`Handler`] that keeps the engine's completions for the target to check, in order.
#[derive(Debug, Default)]
pub(super) struct Completions(pub(super) VecDeque<(CqId, Completion)>);

impl Handler<PeerWire> for Completions {
    fn on_completion(
        &mut self,
        _: &mut Driver<PeerWire>,
        _host: usize,
        cq: CqId,
        c: Completion,
    ) -> bool {
        self.0.push_back((cq, c));
        false
    }
}

/// The driver of one engine, `ep` at `engine`, whose peer `peer` is the fuzz input; its
/// buffer holds `max_datagram` bytes, as the targets' own buffer did.
pub(super) fn driver(
    ep: Endpoint,
    engine: SocketAddr,
    peer: SocketAddr,
    max_datagram: usize,
    now: Timestamp,
) -> Driver<PeerWire> {
    let cfg = DriverConfig {
        buffer_bytes: max_datagram,
        handover_min_bytes: usize::MAX,
        nic_limit_bytes: Some(1),
        rx_batch_ns: 0,
        service: Service::Marked,
    };
    let mut d = Driver::new(PeerWire::new(engine, peer), cfg);
    d.add_host(HostId(ENGINE as u32), ep);
    d.now = now;
    d
}

/// Runs what is due at the driver's clock (deliveries, due timers, transmissions the NIC
/// takes, completions) without moving it.
pub(super) fn settle(d: &mut Driver<PeerWire>, h: &mut Completions) {
    let now = d.now;
    for _ in 0..1024 {
        d.touch(ENGINE);
        d.service(h);
        match d.next_event() {
            Some(t) if t <= now => {
                d.step_until(h, Some(now));
            }
            _ => return,
        }
    }
}
