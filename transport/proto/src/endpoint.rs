//! The protocol engine: one [`Endpoint`] per device, holding protection domains, memory
//! regions, completion queues and queue pairs.
//!
//! # Driving an endpoint
//!
//! The endpoint performs no I/O and reads no clock. Its caller (the runtime, or a simulator)
//! drives it with four families of methods (and an optional fifth), as quinn-proto's
//! `Connection`:
//!
//! 1. Getters (`&self`): [`Endpoint::qp_info`], [`Endpoint::stats`], ...
//! 2. Inputs: [`Endpoint::handle_datagram`] for every received datagram and
//!    [`Endpoint::handle_timeout`] whenever the deadline from `poll_timeout` has passed.
//! 3. Commands that only enqueue: [`Endpoint::post_send`], [`Endpoint::post_recv`], and the
//!    resource calls.
//! 4. Outputs, polled after every input or command, in this order until each returns `None`:
//!    [`Endpoint::poll_transmit`] (datagrams to send), [`Endpoint::poll_completion`]
//!    (completions for the application), then [`Endpoint::poll_timeout`] (when to call
//!    `handle_timeout` next).
//!
//! 5. Idle work, optional: [`Endpoint::tidy`] when the caller has nothing to do (its poll
//!    found nothing, or it is about to sleep) does now what the next input would otherwise
//!    pay for on its way (refreshing path weights).
//!
//! Skipping `poll_transmit` stalls the connection; skipping `poll_timeout` loses
//! retransmissions.
//!
//! # Order and fatal errors (RC semantics)
//!
//! Packets are placed out of order, straight into memory; completions are ordered:
//!
//! - Send completions are in posting order (a READ or atomic completes after every earlier
//!   work request, even if its response came first).
//! - A receive (SEND, SEND with immediate, WRITE with immediate) completes only after every
//!   earlier request of the QP has been fully placed, so "WRITE the data, then SEND the
//!   notification" holds; the `unordered` flag of [`QpOptions`] drops that wait.
//! - A fatal refusal at the responder (bad key, bounds or rights; an invalid request such as
//!   a SEND longer than its receive) stops the responder QP at that packet: nothing at or
//!   after it executes any more, requests before it (still on slower paths) do, and once they
//!   have all arrived the QP goes to the error state, its receives completing as flushed. The
//!   requester completes the refused request with the matching error and every later one as
//!   flushed; the refused packet is never retransmitted.
//! - Flushed means "not executed after the refusal reached the responder". One exception:
//!   packets of a later request that overtook the refused one on a faster path were executed
//!   on arrival (placement does not wait): their WRITE bytes may be in the responder's memory,
//!   their SEND bytes in a receive buffer, their atomics applied, their READs answered, and
//!   still the requester reports the request as flushed. Their receive completes as flushed
//!   in the ordered mode; on an unordered QP it may already have completed successfully.
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use braid_time::{Ecn, Timestamp};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::coverage::Coverage;
use crate::deadline::Deadlines;
use crate::departure::Departures;
use crate::hist::{RttHistogram, RttSummary};
use crate::keymap::{KeyMap, key_map};
use crate::landing::Landing;
use crate::mem::{Access, Region};
use crate::ready::ReadySet;
use crate::seq::Psn;
use crate::tracker::RecvTracker;
use crate::types::*;
use crate::wire::{self, Op};

pub use crate::qp::QpStats;
use crate::qp::*;
use crate::shared::{Mr, RemoteMr, Shared};
use crate::stall::HostStall;

/// ECN codepoint for ECN-capable transport, codepoint 0.
pub const ECN_ECT0: u8 = Ecn::Ect0.to_bits();
/// ECN codepoint for congestion experienced.
pub const ECN_CE: u8 = Ecn::Ce.to_bits();

pub use crate::qp::Transmit;

/// The QPs of an endpoint, in creation order (the round-robin order of transmission and the
/// order timers run in), each with its next deadline cached beside it.
///
/// Every mutable access goes through a [`QpMut`], which recomputes the QP's deadline when it
/// is dropped and files it in the timer heap ([`crate::deadline`]), so the next deadline is
/// read in O(1) and `handle_timeout` visits only the QPs that are due. Debug builds check the
/// cache against a fresh computation on every `next_deadline`. The same drop queues the QP in
/// the ready set that `poll_transmit` serves ([`crate::ready`]), and in the set of QPs whose
/// path weights [`Endpoint::tidy`] may refresh.
#[derive(Default)]
struct QpTable {
    qps: Vec<Qp>,
    timers: Deadlines,
    index: KeyMap<usize>,
    ready: ReadySet,
    /// The QPs whose path weights are out of date (feedback since their last refresh), for
    /// [`Endpoint::tidy`]. A bit set like `ready`, for the same cheap search.
    unsettled: ReadySet,
}

/// Mutable access to one QP of a [`QpTable`]; refreshes its cached deadline when dropped, and
/// queues it as ready to send, if it may have something to send (`Qp::may_transmit`), unless
/// it came from [`QpTable::at_mut_quiet`].
struct QpMut<'a> {
    qp: &'a mut Qp,
    slot: usize,
    timers: &'a mut Deadlines,
    ready: Option<&'a mut ReadySet>,
    unsettled: &'a mut ReadySet,
}

impl core::ops::Deref for QpMut<'_> {
    type Target = Qp;
    fn deref(&self) -> &Qp {
        self.qp
    }
}

impl core::ops::DerefMut for QpMut<'_> {
    fn deref_mut(&mut self) -> &mut Qp {
        self.qp
    }
}

impl Drop for QpMut<'_> {
    fn drop(&mut self) {
        self.timers.set(self.slot, self.qp.next_deadline());
        if self.qp.route.paths.is_dirty() {
            self.unsettled.mark(self.slot);
        }
        // Already marked, it stays so without the look at its queues.
        if let Some(ready) = self.ready.take()
            && !ready.is_marked(self.slot)
            && self.qp.may_transmit()
        {
            ready.mark(self.slot);
        }
    }
}

impl QpTable {
    fn len(&self) -> usize {
        self.qps.len()
    }

    fn contains(&self, qpn: u32) -> bool {
        self.index.contains_key(&qpn)
    }

    fn insert(&mut self, qpn: u32, qp: Qp) {
        self.index.insert(qpn, self.qps.len());
        self.timers.push_slot(qp.next_deadline());
        self.qps.push(qp);
        self.ready.add_slot();
        self.unsettled.add_slot();
    }

    fn remove(&mut self, qpn: u32) -> Option<Qp> {
        let i = self.index.remove(&qpn)?;
        self.timers.remove_slot(i);
        self.ready.remove_slot(i);
        self.unsettled.remove_slot(i);
        let qp = self.qps.remove(i);
        for slot in self.index.values_mut() {
            if *slot > i {
                *slot -= 1;
            }
        }
        Some(qp)
    }

    fn get(&self, qpn: u32) -> Option<&Qp> {
        self.index.get(&qpn).map(|&i| &self.qps[i])
    }

    fn get_mut(&mut self, qpn: u32) -> Option<QpMut<'_>> {
        let i = *self.index.get(&qpn)?;
        Some(self.at_mut(i))
    }

    /// The `i`-th QP in creation order (`i < len`).
    fn at_mut(&mut self, i: usize) -> QpMut<'_> {
        QpMut {
            qp: &mut self.qps[i],
            slot: i,
            timers: &mut self.timers,
            ready: Some(&mut self.ready),
            unsettled: &mut self.unsettled,
        }
    }

    /// [`at_mut`](Self::at_mut) without queueing the QP as ready: for `poll_transmit`, which
    /// queues it again only if it sent, and for sweeps that change nothing in most QPs.
    fn at_mut_quiet(&mut self, i: usize) -> QpMut<'_> {
        self.at_mut_quiet_with_ready(i).0
    }

    /// [`at_mut_quiet`](Self::at_mut_quiet), and the ready set to read meanwhile.
    fn at_mut_quiet_with_ready(&mut self, i: usize) -> (QpMut<'_>, &ReadySet) {
        let qp = QpMut {
            qp: &mut self.qps[i],
            slot: i,
            timers: &mut self.timers,
            ready: None,
            unsettled: &mut self.unsettled,
        };
        (qp, &self.ready)
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        debug_assert!(
            self.qps
                .iter()
                .zip(self.timers.slots())
                .all(|(q, &d)| q.next_deadline() == d),
            "a QP changed without refreshing its cached deadline"
        );
        self.timers.earliest()
    }
}

/// The QP a plain (not sealed) packet with header `h` from `src` is for, if `src` is its
/// connected peer and it takes plain packets; else the drop is counted and `None`.
/// [`Endpoint::handle_received`] makes the same checks in its own body: through this
/// function every small packet cost measurably more (the engine probe,
/// bench/results/session-2026-12-07-s38.md).
fn plain_qp<'a>(
    qps: &'a mut QpTable,
    stats: &mut EndpointStats,
    h: &wire::Header,
    src: SocketAddr,
) -> Option<QpMut<'a>> {
    let Some(qp) = qps.get_mut(h.dst_qpn) else {
        stats.rx_unknown_qp += 1;
        return None;
    };
    match qp.peer {
        Some(p) if p.addr.ip() == src.ip() && p.qpn == h.src_qpn => {}
        _ => {
            stats.rx_wrong_peer += 1;
            return None;
        }
    }
    if qp.seal.is_on() {
        // A plain packet on an encrypted connection: unauthenticated, so refused.
        stats.rx_auth_failed += 1;
        return None;
    }
    Some(qp)
}

/// Asks the QP for its next datagram, written into `buf`, counting the visit in `visits` and
/// the datagram in the statistics. Sets `keeps_turn` to whether the QP keeps its turn: only a
/// new packet of an unfinished burst does (an ACK or a retransmission in between does not).
/// (The flag goes out through a reference: returned beside the datagram, the pair was
/// rebuilt from the fresh `Transmit` by wide loads after its narrow stores, a
/// store-forwarding stall per datagram.)
fn ask(
    qp: &mut QpMut<'_>,
    now: Timestamp,
    buf: &mut [u8],
    sh: &mut Shared,
    visits: &mut u64,
    keeps_turn: &mut bool,
) -> Option<Transmit> {
    *visits += 1;
    let left = qp.burst_left();
    let t = qp.poll_transmit(now, buf, sh);
    if t.is_some() {
        sh.stats.tx_datagrams += 1;
        *keeps_turn = qp.burst_left() > 0 && qp.burst_left() != left;
    }
    t
}

/// One device's protocol state. See the module documentation for the driving order.
pub struct Endpoint {
    local: SocketAddr,
    sh: Shared,
    qps: QpTable,
    /// QPs `poll_transmit` has asked for a datagram, in all (a work counter for tests).
    tx_visits: u64,
    pds: HashMap<u32, u32>,
    cqs: Vec<u32>,
    next_id: u32,
    /// Where sealed datagrams are decrypted (reused).
    open_buf: Vec<u8>,
    /// The QP slots `handle_timeout` found due (reused).
    due: Vec<usize>,
}

impl core::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.local)
            .field("qps", &self.qps.len())
            .finish()
    }
}

impl Endpoint {
    /// A new endpoint for a device reachable at `local`.
    ///
    /// `cfg.paths` is clamped to `1..=MAX_PATHS`, `cfg.ports` is set to
    /// [`EndpointConfig::source_ports`] and the queue depths are clamped to their maxima.
    pub fn new(mut cfg: EndpointConfig, local: SocketAddr) -> Endpoint {
        cfg.ports = cfg.source_ports();
        cfg.paths = cfg.paths.clamp(1, MAX_PATHS);
        cfg.max_send_wr = cfg.max_send_wr.clamp(1, MAX_SEND_WR);
        cfg.max_recv_wr = cfg.max_recv_wr.clamp(1, MAX_RECV_WR);
        cfg.ack_every = cfg.ack_every.max(1);
        let min_dgram = wire::HEADER_LEN + wire::MAX_BODY_LEN + wire::TRAILER_LEN + 64;
        cfg.max_datagram = cfg.max_datagram.clamp(min_dgram, 65_507);
        let overhead =
            |body: usize| (cfg.max_datagram - wire::HEADER_LEN - body - wire::TRAILER_LEN) as u32;
        let sh = Shared {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            req_chunk: overhead(wire::REQUEST_LEN),
            resp_chunk: overhead(wire::READ_RESP_LEN),
            paths: vec![PathStats::default(); usize::from(cfg.paths)],
            rtt_hist: RttHistogram::new(),
            cfg,
            mrs: key_map(),
            rkeys: key_map(),
            completions: VecDeque::new(),
            stats: EndpointStats::default(),
            stall: HostStall::default(),
            rx_at: Timestamp::ZERO,
            departures: Departures::default(),
            landing: None,
            in_place: Default::default(),
        };
        Endpoint {
            local,
            sh,
            qps: QpTable::default(),
            tx_visits: 0,
            pds: HashMap::new(),
            cqs: Vec::new(),
            next_id: 1,
            open_buf: Vec::new(),
            due: Vec::new(),
        }
    }

    /// The device address this endpoint was created for.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> &EndpointConfig {
        &self.sh.cfg
    }

    /// Endpoint-wide counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.sh.stats
    }

    /// Per-path counters, one entry per path.
    pub fn path_stats(&self) -> &[PathStats] {
        &self.sh.paths
    }

    /// The distribution of every QP's RTT samples since the endpoint was created.
    pub fn rtt_summary(&self) -> RttSummary {
        self.sh.rtt_hist.summary()
    }

    /// Payload bytes carried by one full request packet of a plain QP (an encrypted QP's
    /// carry [`wire::SEAL_OVERHEAD`] bytes less).
    pub fn chunk_size(&self) -> u32 {
        self.sh.req_chunk
    }

    fn new_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        let id = self.new_id();
        self.pds.insert(id, 0);
        PdId(id)
    }

    /// Frees a protection domain that no region or QP uses any more.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), ResourceError> {
        match self.pds.get(&pd.0) {
            None => Err(ResourceError::UnknownPd),
            Some(&n) if n > 0 => Err(ResourceError::Busy),
            Some(_) => {
                self.pds.remove(&pd.0);
                Ok(())
            }
        }
    }

    /// Creates a completion queue.
    pub fn create_cq(&mut self) -> CqId {
        let id = self.new_id();
        self.cqs.push(id);
        CqId(id)
    }

    /// Registers `region` in `pd` with `access` rights; returns fresh random keys.
    pub fn register(
        &mut self,
        pd: PdId,
        region: Arc<Region>,
        access: Access,
    ) -> Result<MrKeys, ResourceError> {
        if !self.pds.contains_key(&pd.0) {
            return Err(ResourceError::UnknownPd);
        }
        let lkey = loop {
            let k = self.sh.random_nonzero();
            if !self.sh.mrs.contains_key(&k) {
                break k;
            }
        };
        let rkey = loop {
            let k = self.sh.random_nonzero();
            if !self.sh.rkeys.contains_key(&k) {
                break k;
            }
        };
        let keys = MrKeys { lkey, rkey };
        self.register_as(pd, region, access, keys)?;
        Ok(keys)
    }

    /// Registers `region` in `pd` with `access` rights under `keys` chosen elsewhere: by
    /// [`register`](Self::register) on another endpoint of the same device, so that a region
    /// has the same keys in every engine shard of a device and a peer's remote key is valid
    /// whichever shard its QP lives on. Refused with [`ResourceError::Busy`] if either key is
    /// already in use here (or is 0).
    pub fn register_as(
        &mut self,
        pd: PdId,
        region: Arc<Region>,
        access: Access,
        keys: MrKeys,
    ) -> Result<(), ResourceError> {
        let MrKeys { lkey, rkey } = keys;
        if lkey == 0
            || rkey == 0
            || self.sh.mrs.contains_key(&lkey)
            || self.sh.rkeys.contains_key(&rkey)
        {
            return Err(ResourceError::Busy);
        }
        let users = self.pds.get_mut(&pd.0).ok_or(ResourceError::UnknownPd)?;
        *users += 1;
        self.sh.rkeys.insert(
            rkey,
            RemoteMr {
                region: Arc::clone(&region),
                pd: pd.0,
                access,
            },
        );
        self.sh.mrs.insert(
            lkey,
            Mr {
                region,
                pd: pd.0,
                access,
                rkey,
            },
        );
        Ok(())
    }

    /// Deregisters the region with local key `lkey`. When it returns, the engine never
    /// touches the region's memory again: peers lose access at once, a READ still being
    /// answered from it is refused (its requester gets `RemoteAccessError`), and this side's
    /// unfinished work requests with buffers in it fail with `LocalProtectionError`; either
    /// moves the QP concerned to the error state (see `endpoint/revoke.rs`).
    pub fn deregister(&mut self, lkey: u32) -> Result<(), ResourceError> {
        let mr = self.sh.mrs.remove(&lkey).ok_or(ResourceError::UnknownMr)?;
        self.sh.rkeys.remove(&mr.rkey);
        if let Some(n) = self.pds.get_mut(&mr.pd) {
            *n = n.saturating_sub(1);
        }
        for i in 0..self.qps.len() {
            let mut qp = self.qps.at_mut_quiet(i);
            if qp.revoke(&mr.region, &mut self.sh) {
                drop(qp);
                self.qps.ready.mark(i); // it has a NAK to send
            }
        }
        Ok(())
    }

    /// Creates a QP in `pd` reporting to `send_cq` and `recv_cq`. It starts in `Init`.
    pub fn create_qp(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Result<QpInfo, ResourceError> {
        self.create_qp_with(pd, send_cq, recv_cq, QpOptions::default())
    }

    /// Creates a QP as [`create_qp`](Self::create_qp) does, with options (encryption).
    pub fn create_qp_with(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        opts: QpOptions,
    ) -> Result<QpInfo, ResourceError> {
        if !self.pds.contains_key(&pd.0) {
            return Err(ResourceError::UnknownPd);
        }
        if !self.cqs.contains(&send_cq.0) || !self.cqs.contains(&recv_cq.0) {
            return Err(ResourceError::UnknownCq);
        }
        if self.qps.len() >= MAX_QPS {
            return Err(ResourceError::Limit);
        }
        let qpn = loop {
            let q = self.sh.random_nonzero() & 0x00ff_ffff;
            if q != 0 && !self.qps.contains(q) {
                break q;
            }
        };
        let psn = self.sh.rng.next_u32();
        let cc = self.sh.cfg.cc.build(self.sh.cfg.max_datagram as u32);
        let qp = Qp::new(
            QpIds {
                qpn,
                pd: pd.0,
                send_cq: send_cq.0,
                recv_cq: recv_cq.0,
            },
            Psn(psn),
            cc,
            &opts,
            &self.sh.cfg,
        );
        let seal_key = qp.seal.public_key();
        self.qps.insert(qpn, qp);
        if let Some(n) = self.pds.get_mut(&pd.0) {
            *n += 1;
        }
        Ok(QpInfo {
            addr: self.local,
            qpn,
            psn,
            seal_key,
        })
    }

    /// What a peer needs to connect to `qpn`.
    pub fn qp_info(&self, qpn: u32) -> Option<QpInfo> {
        self.qps.get(qpn).map(|q| QpInfo {
            addr: self.local,
            qpn,
            psn: q.initial_psn.get(),
            seal_key: q.seal.public_key(),
        })
    }

    /// Connects `qpn` (in `Init`) to the peer QP described by `peer`. An encrypted QP agrees
    /// its keys here; both sides must encrypt or neither ([`ResourceError::EncryptionMismatch`]).
    pub fn connect(&mut self, qpn: u32, peer: QpInfo) -> Result<(), ResourceError> {
        let mut guard = self.qps.get_mut(qpn).ok_or(ResourceError::UnknownQp)?;
        let qp = &mut *guard;
        if qp.state != QpState::Init {
            return Err(ResourceError::BadState);
        }
        qp.seal.connect(qp.qpn, qp.initial_psn.get(), &peer)?;
        qp.peer = Some(peer);
        qp.rsp.rx = RecvTracker::new(peer.psn);
        qp.state = QpState::Connected;
        Ok(())
    }

    /// Moves `qpn` to the error state: every outstanding work request completes as flushed.
    pub fn set_error(&mut self, qpn: u32) -> Result<(), ResourceError> {
        let mut guard = self.qps.get_mut(qpn).ok_or(ResourceError::UnknownQp)?;
        let qp = &mut *guard;
        qp.fail_by_application(&mut self.sh);
        Ok(())
    }

    /// Destroys `qpn` without generating completions.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), ResourceError> {
        let qp = self.qps.remove(qpn).ok_or(ResourceError::UnknownQp)?;
        if let Some(n) = self.pds.get_mut(&qp.pd) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    /// State and counters of `qpn`.
    pub fn qp_stats(&self, qpn: u32) -> Option<QpStats> {
        self.qps.get(qpn).map(|q| q.stats(&self.sh.cfg))
    }

    /// Send and receive work requests posted on `qpn` and not yet completed (what
    /// `max_send_wr` and `max_recv_wr` bound), in O(1).
    pub fn queue_depths(&self, qpn: u32) -> Option<(usize, usize)> {
        self.qps.get(qpn).map(|q| (q.req.sq.len(), q.rsp.rq.len()))
    }

    fn resolve(&self, pd: u32, sges: &[Sge], need: Access) -> Result<(Segs, u32), PostError> {
        if sges.len() > MAX_SGE {
            return Err(PostError::TooManySges);
        }
        let mut total: u64 = 0;
        let mut segs = Segs::with_capacity(sges.len());
        for s in sges {
            let mr = self.sh.mrs.get(&s.lkey).ok_or(PostError::InvalidLkey)?;
            if mr.pd != pd {
                return Err(PostError::WrongPd);
            }
            if !mr.access.contains(need) {
                return Err(PostError::NoLocalWrite);
            }
            mr.region
                .check(s.offset, u64::from(s.len))
                .map_err(|_| PostError::OutOfBounds)?;
            total += u64::from(s.len);
            segs.push(Seg {
                region: mr.region.clone(),
                offset: s.offset,
                len: s.len,
            });
        }
        let total = u32::try_from(total).map_err(|_| PostError::TooManySges)?;
        Ok((segs, total))
    }

    /// Queues a send work request on `qpn`. On a QP in the error state it is accepted and
    /// completes at once as flushed.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), PostError> {
        let (pd, state, depth) = {
            let qp = self.qps.get(qpn).ok_or(PostError::UnknownQp)?;
            (qp.pd, qp.state, qp.req.sq.len())
        };
        if state == QpState::Init {
            return Err(PostError::NotConnected);
        }
        if depth >= self.sh.cfg.max_send_wr {
            return Err(PostError::QueueFull);
        }
        let (op, remote, imm, operands) = decode(wr.op);
        let need = if matches!(op, Op::Read | Op::FetchAdd | Op::CompareSwap) {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let (segs, len) = self.resolve(pd, &wr.sges, need)?;
        if op.is_atomic() && (segs.len() != 1 || len != 8 || remote.offset % 8 != 0) {
            return Err(PostError::BadAtomic);
        }
        let mut guard = self.qps.get_mut(qpn).ok_or(PostError::UnknownQp)?;
        let qp = &mut *guard;
        let msn = qp.req.next_msn.get();
        qp.req.next_msn += 1;
        let ssn = if op.consumes_recv() {
            let s = qp.req.next_ssn.get();
            qp.req.next_ssn += 1;
            s
        } else {
            0
        };
        let len = if op.is_atomic() { 8 } else { len };
        let wqe = SendWqe::new(wr.wr_id, wr.signaled, (op, remote, imm, operands), msn, ssn);
        let wqe = SendWqe { segs, len, ..wqe };
        if state == QpState::Error {
            qp.req.sq_base_msn = qp.req.next_msn;
            let c = Completion {
                wr_id: wqe.wr_id,
                status: WcStatus::Flushed,
                opcode: wqe.opcode(),
                byte_len: 0,
                imm: None,
                qpn,
            };
            self.sh.complete(qp.send_cq, c);
            return Ok(());
        }
        qp.req.sq.push_back(wqe);
        Ok(())
    }

    /// Like [`post_send`](Self::post_send) for a request whose poster can no longer be told
    /// of a refusal (the runtime's hand-off of posts made while the engine was busy): a
    /// request refused for its buffers or shape is queued already failed, completes with
    /// the status verbs gives it (`LocalProtectionError`, `LocalLengthError`) in posting
    /// order, after the requests before it, and takes the QP to the error state. Refusals
    /// that leave nowhere to queue it (unknown or unconnected QP, full queue: flushed) or
    /// meet a QP already in error complete it at once on `cq`.
    pub fn post_send_or_fail(&mut self, qpn: u32, wr: SendWr, cq: CqId) {
        let (wr_id, signaled) = (wr.wr_id, wr.signaled);
        let (op, remote, imm, operands) = decode(wr.op);
        let Err(e) = self.post_send(qpn, wr) else {
            return;
        };
        let status = refused_status(e);
        let mut guard = match self.qps.get_mut(qpn) {
            Some(qp) if status != WcStatus::Flushed && qp.state == QpState::Connected => qp,
            _ => {
                // Nowhere to queue it, or the QP already failed: it completes now.
                let c = Completion {
                    wr_id,
                    status,
                    opcode: wc_opcode(op),
                    byte_len: 0,
                    imm: None,
                    qpn,
                };
                self.sh.complete(cq.0, c);
                return;
            }
        };
        let qp = &mut *guard;
        let msn = qp.req.next_msn.get();
        qp.req.next_msn += 1;
        qp.req.sq.push_back(SendWqe {
            status: Some(status),
            ..SendWqe::new(wr_id, signaled, (op, remote, imm, operands), msn, 0)
        });
        qp.complete_sq(&mut self.sh);
    }

    /// Like [`post_recv`](Self::post_recv) for a request whose poster can no longer be told
    /// of a refusal (see [`post_send_or_fail`](Self::post_send_or_fail)): a receive refused
    /// for its buffers is queued failed and takes the QP to the error state at once, so it
    /// completes with `LocalProtectionError` (or `LocalLengthError`) after the receives
    /// before it, which flush. Refusals with nowhere to queue it complete it at once.
    pub fn post_recv_or_fail(&mut self, qpn: u32, wr: RecvWr, cq: CqId) {
        let wr_id = wr.wr_id;
        let Err(e) = self.post_recv(qpn, wr) else {
            return;
        };
        let status = refused_status(e);
        let queue = self
            .qps
            .get_mut(qpn)
            .filter(|qp| qp.state != QpState::Error);
        let Some(mut qp) = queue.filter(|_| status != WcStatus::Flushed) else {
            // Nowhere to queue it, or the QP already failed (nothing before it is pending):
            // it completes now.
            let c = Completion {
                wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                qpn,
            };
            self.sh.complete(cq.0, c);
            return;
        };
        qp.rsp.rq.push_back(RecvWqe {
            wr_id,
            segs: Segs::new(),
            cap: 0,
            msg: None,
            placed: Coverage::default(),
            imm: None,
            done: false,
            error: Some(status),
            last_psn: None,
        });
        qp.enter_error(&mut self.sh);
    }

    /// Queues a receive work request on `qpn` (allowed from `Init` on). On a QP in the error
    /// state it is accepted and completes at once as flushed.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), PostError> {
        let (pd, state, depth) = {
            let qp = self.qps.get(qpn).ok_or(PostError::UnknownQp)?;
            (qp.pd, qp.state, qp.rsp.rq.len())
        };
        if depth >= self.sh.cfg.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        let (segs, cap) = self.resolve(pd, &wr.sges, Access::LOCAL_WRITE)?;
        let mut guard = self.qps.get_mut(qpn).ok_or(PostError::UnknownQp)?;
        let qp = &mut *guard;
        // A responder stopped by a fatal refusal whose receives have flushed (see
        // `settle_fence`) takes no more.
        if state == QpState::Error || qp.rsp.order.fence_reached(qp.rsp.rx.cum()) {
            let c = Completion {
                wr_id: wr.wr_id,
                status: WcStatus::Flushed,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                qpn,
            };
            self.sh.complete(qp.recv_cq, c);
            return Ok(());
        }
        qp.rsp.rq.push_back(RecvWqe {
            wr_id: wr.wr_id,
            segs,
            cap: u64::from(cap),
            msg: None,
            placed: Coverage::with_room(),
            imm: None,
            done: false,
            error: None,
            last_psn: None,
        });
        Ok(())
    }

    /// Processes one received datagram. Anything malformed, unexpected or hostile is counted
    /// and dropped; nothing here panics or touches memory outside registered regions.
    /// `ecn` is the IP header's ECN codepoint (its low two bits; see [`Ecn::from_bits`]).
    pub fn handle_datagram(&mut self, now: Timestamp, src: SocketAddr, ecn: u8, datagram: &[u8]) {
        self.handle_received(now, 0, src, ecn, datagram);
    }

    /// [`handle_datagram`](Self::handle_datagram) for a datagram that arrived `queued_ns`
    /// before `now` and waited that long in the kernel (the datapath's receive timestamp):
    /// a data packet's holding time (in its ACK) starts at its arrival, and the delay an
    /// ACK hands the congestion controller ends at its arrival, so a host slow to pick its
    /// datagrams up does not read as a congested network. Timers, the round trip behind the
    /// retransmit timeout and everything else use `now`.
    pub fn handle_received(
        &mut self,
        now: Timestamp,
        queued_ns: u32,
        src: SocketAddr,
        ecn: u8,
        datagram: &[u8],
    ) {
        self.note_arrival(now, queued_ns);
        let ecn = Ecn::from_bits(ecn);
        if wire::is_sealed(datagram) {
            self.handle_sealed(now, src, ecn, datagram);
            return;
        }
        let pkt = match wire::Packet::parse(datagram) {
            Ok(p) => p,
            Err(wire::Error::BadCrc) => {
                self.sh.stats.rx_bad_crc += 1;
                return;
            }
            Err(_) => {
                self.sh.stats.rx_malformed += 1;
                return;
            }
        };
        let Some(mut guard) = self.qps.get_mut(pkt.header.dst_qpn) else {
            self.sh.stats.rx_unknown_qp += 1;
            return;
        };
        let qp = &mut *guard;
        match qp.peer {
            Some(p) if p.addr.ip() == src.ip() && p.qpn == pkt.header.src_qpn => {}
            _ => {
                self.sh.stats.rx_wrong_peer += 1;
                return;
            }
        }
        if qp.seal.is_on() {
            // A plain packet on an encrypted connection: unauthenticated, so refused.
            self.sh.stats.rx_auth_failed += 1;
            return;
        }
        qp.dispatch(now, ecn, wire::hop_queue(datagram), &pkt, &mut self.sh);
    }

    /// A datagram reached this host `queued_ns` before `now`: counted, its arrival time kept
    /// for the delay samples ([`handle_received`](Self::handle_received)).
    fn note_arrival(&mut self, now: Timestamp, queued_ns: u32) {
        self.sh.rx_at = Timestamp::from_nanos(now.as_nanos().saturating_sub(u64::from(queued_ns)));
        self.sh.stats.rx_datagrams += 1;
        self.sh.stall.note(now, self.qps.timers.earliest());
    }

    /// Whether [`landings`](Self::landings) may name any: a READ response stream of large
    /// datagrams is being received.
    pub fn wants_landing(&self) -> bool {
        self.sh.landing.is_some()
    }

    /// Appends to `out`, up to `max` in all, where the next datagrams of the READ response
    /// being received are expected to land, in the order they are expected (see
    /// [`Landing`](crate::Landing)): consecutive payloads of the READ after the last one
    /// accepted, each of the size its responses have, each in one segment of the READ's
    /// destination and none over bytes already placed. Names none (and stops looking until
    /// the next large response) once that READ is finished or gone.
    pub fn landings(&mut self, out: &mut Vec<Landing>, max: usize) {
        let Some(hint) = self.sh.landing else {
            return;
        };
        let start = out.len();
        if let Some(qp) = self.qps.get(hint.qpn)
            && qp.state == QpState::Connected
            && !qp.seal.is_on()
            && let Some(i) = qp.wqe_index(hint.msn)
        {
            let w = &qp.req.sq[i];
            let open = w.op == wire::Op::Read && w.packetized && !w.is_done();
            let mut off = hint.next;
            while open && out.len() < max && off < u64::from(w.len) {
                let len = u64::from(hint.chunk).min(u64::from(w.len) - off);
                if w.read_placed.overlaps(off, len) {
                    break;
                }
                let Some(l) = Landing::at(&w.segs, (hint.qpn, hint.msn), off, len as usize) else {
                    break;
                };
                out.push(l);
                off += len;
            }
        }
        if out.len() == start {
            self.sh.landing = None;
        }
    }

    /// Handles a datagram received into `landing` that [`Landing::matches`] found to be the
    /// one predicted: `head` its headers, `tail` its trailer, its payload in place. Its CRC
    /// is checked over the three (the payload read where it landed), then it is handled as
    /// [`handle_received`](Self::handle_received) handles any READ response, except that its
    /// payload is placed already. Returns false, doing nothing, if the pieces are not what
    /// `landing` predicted: the caller then puts the datagram back together
    /// ([`Landing::read_landed`]) and hands it to `handle_received`.
    pub fn handle_landed(
        &mut self,
        now: Timestamp,
        queued_ns: u32,
        (src, ecn): (SocketAddr, u8),
        landing: &Landing,
        head: &[u8],
        tail: &[u8],
    ) -> bool {
        if !landing.matches(head, landing.len(), tail) {
            return false;
        }
        self.note_arrival(now, queued_ns);
        // A landing lies in a live region (the caller holds this endpoint since it was
        // named), so its CRC is always read; were it not, the flipped value fails the check.
        let crc = |c: u32| landing.crc(c).unwrap_or(!c);
        let (h, r) = match wire::parse_pieces(head, landing.len(), crc, tail) {
            Ok(wire::Repr {
                header,
                body: wire::Body::ReadResponse(r),
            }) => (header, r),
            Err(wire::Error::BadCrc) => {
                self.sh.stats.rx_bad_crc += 1;
                return true;
            }
            _ => {
                self.sh.stats.rx_malformed += 1;
                return true;
            }
        };
        let Some(mut qp) = plain_qp(&mut self.qps, &mut self.sh.stats, &h, src) else {
            return true;
        };
        // READ responses carry no hop telemetry (only requests do).
        qp.rsp.rx_hop = 0;
        let ecn = Ecn::from_bits(ecn);
        if qp.on_landed_read_response(now, (&h, &r), landing, ecn, &mut self.sh) {
            self.sh.stats.rx_landed += 1;
        }
        true
    }

    /// [`handle_datagram`](Self::handle_datagram) for a sealed datagram: the QP and peer are
    /// read from the clear header, then the tag is verified, the replay window consulted and
    /// the plaintext parsed before the QP sees anything.
    fn handle_sealed(&mut self, now: Timestamp, src: SocketAddr, ecn: Ecn, datagram: &[u8]) {
        let Ok(peek) = wire::peek_sealed(datagram) else {
            self.sh.stats.rx_malformed += 1;
            return;
        };
        let Some(mut guard) = self.qps.get_mut(peek.dst_qpn) else {
            self.sh.stats.rx_unknown_qp += 1;
            return;
        };
        let qp = &mut *guard;
        match qp.peer {
            Some(p) if p.addr.ip() == src.ip() && p.qpn == peek.src_qpn => {}
            _ => {
                self.sh.stats.rx_wrong_peer += 1;
                return;
            }
        }
        let Some(sealer) = qp.seal.sealer() else {
            // A sealed packet for a plain QP: no key can authenticate it.
            self.sh.stats.rx_auth_failed += 1;
            return;
        };
        let pkt = match sealer.open(datagram, &mut self.open_buf) {
            Ok(p) => p,
            Err(crate::seal::OpenError::Replayed) => {
                self.sh.stats.rx_replayed += 1;
                return;
            }
            Err(crate::seal::OpenError::BadPlaintext(_)) => {
                self.sh.stats.rx_malformed += 1;
                return;
            }
            Err(_) => {
                self.sh.stats.rx_auth_failed += 1;
                return;
            }
        };
        // Sealed: no hop telemetry (its header is authenticated, no switch changes it).
        qp.dispatch(now, ecn, 0, &pkt, &mut self.sh);
    }

    /// Runs the timers that are due at `now`: retransmit timeouts and RNR waits. Only the QPs
    /// that are due are visited (in creation order), found in O(log n) each.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.sh.stall.note(now, self.qps.timers.earliest());
        self.qps.timers.take_due(now, &mut self.due);
        for &i in &self.due {
            self.qps.at_mut(i).on_timeout(now, &mut self.sh);
        }
    }

    /// Ends the current transmit batch: the datagrams [`poll_transmit`](Self::poll_transmit)
    /// wrote since the last call are about to be handed to the network. Returns the batch's
    /// number for [`departed`](Self::departed).
    pub fn end_tx_batch(&mut self) -> u32 {
        self.sh.departures.end_batch()
    }

    /// The send of transmit batch `batch` ([`end_tx_batch`](Self::end_tx_batch)) returned at
    /// `at`: the fabric delay the congestion controller gets for its packets starts then, not
    /// when they were written, so the time this host took to send them (on a veth pair, the
    /// receiver's kernel work done inside the send) is not taken for network queueing
    /// (see the `departure` module). Optional: without it, delays start at the write.
    pub fn departed(&mut self, batch: u32, at: Timestamp) {
        self.sh.departures.departed(batch, at);
    }

    /// Lets [`poll_transmit`](Self::poll_transmit) leave the payload of a datagram in its
    /// registered region when it is at least `min` bytes (and the QP does not seal), for a
    /// datapath that sends a datagram from pieces: the datagram's [`Transmit::payload`] then
    /// says where the payload is, and the buffer holds the rest (see the `in_place` module).
    /// `None`, the default, writes every payload into the buffer.
    ///
    /// Each region a payload was left in stays pinned until
    /// [`unpin_payloads`](Self::unpin_payloads), so the addresses stay valid until then.
    pub fn set_in_place_min(&mut self, min: Option<usize>) {
        self.sh.in_place.min = min.unwrap_or(usize::MAX);
    }

    /// Releases the regions pinned for payloads left in place: call it once the datagrams
    /// [`poll_transmit`](Self::poll_transmit) wrote before are sent (or dropped).
    pub fn unpin_payloads(&mut self) {
        self.sh.in_place.clear();
    }

    /// Writes the payload `t` left in its region into its place in `buf` (the buffer `t` was
    /// written into), so the datagram is whole and may be sent after
    /// [`unpin_payloads`](Self::unpin_payloads); its CRC was read from the same bytes unless
    /// the application changed them since. Returns false (and leaves `t` as it is) if `t`
    /// has no payload in place or its region is no longer pinned.
    pub fn copy_payload(&self, t: &mut Transmit, buf: &mut [u8]) -> bool {
        let copied = t
            .payload
            .is_some_and(|p| self.sh.in_place.copy_into(p, buf));
        if copied {
            t.payload = None;
        }
        copied
    }

    /// The next datagram to send, written at the start of `buf` (which must hold
    /// `config().max_datagram` bytes). QPs with work take turns, one datagram each, except
    /// that a QP that has just sent a new packet of an unfinished burst
    /// ([`EndpointConfig::burst`]) keeps its turn: a burst's datagrams then leave back to
    /// back, so the datapath can send them as one GSO message (taking turns, two QPs' bursts
    /// would interleave datagram by datagram and every message would hold one). A turn kept
    /// so lasts at most a burst. Only QPs that had an event since they last sent are
    /// asked (the `ready` module's set), so idle QPs cost nothing here.
    pub fn poll_transmit(&mut self, now: Timestamp, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(i) = self.qps.ready.take_next() {
            let mut qp = self.qps.at_mut_quiet(i);
            let mut keeps_turn = false;
            let t = ask(
                &mut qp,
                now,
                buf,
                &mut self.sh,
                &mut self.tx_visits,
                &mut keeps_turn,
            );
            drop(qp);
            if let Some(t) = t {
                // It may have more, after the others' turns (or at once, mid-burst).
                self.qps.ready.sent(i, keeps_turn);
                return Some(t);
            }
        }
        None
    }

    /// [`poll_transmit`](Self::poll_transmit) into consecutive slots of `bufs` (each `size`
    /// bytes, at least `config().max_datagram`): the `k`-th datagram goes into slot
    /// `out.len()` as `out` was then, and its [`Transmit`] is pushed to `out`, until `out`
    /// holds `max` or the engine has nothing more to send. Returns whether `out` filled up
    /// (the engine may have more).
    ///
    /// The same datagrams in the same order as that many `poll_transmit` calls, and the same
    /// state after them; but a QP that keeps its turn (in the middle of a burst, or as the
    /// only QP with something to send) is asked again at once, its deadline and place in the
    /// ready set brought up to date once at the end of its run instead of after every
    /// datagram.
    pub fn poll_transmit_batch(
        &mut self,
        now: Timestamp,
        bufs: &mut [u8],
        size: usize,
        out: &mut Vec<Transmit>,
        max: usize,
    ) -> bool {
        let max = max.min(bufs.len() / size.max(1));
        while out.len() < max {
            let Some(i) = self.qps.ready.take_next() else {
                return false;
            };
            let (mut qp, ready) = self.qps.at_mut_quiet_with_ready(i);
            let (mut sent, mut keeps_turn, mut dry) = (false, false, false);
            while out.len() < max {
                let k = out.len();
                let buf = &mut bufs[k * size..(k + 1) * size];
                let t = ask(
                    &mut qp,
                    now,
                    buf,
                    &mut self.sh,
                    &mut self.tx_visits,
                    &mut keeps_turn,
                );
                let Some(t) = t else {
                    dry = true;
                    break;
                };
                sent = true;
                out.push(t);
                // Its turn passes to the next ready QP, if there is one; else the next
                // `poll_transmit` would come back to it.
                if !keeps_turn && !ready.is_empty() {
                    break;
                }
            }
            drop(qp);
            if sent {
                self.qps.ready.sent(i, keeps_turn);
                if dry {
                    // Asked again (mid-burst, or as the only ready QP), it had nothing: it
                    // leaves the ready set, as a `poll_transmit` call coming back to it would.
                    let again = self.qps.ready.take_next();
                    debug_assert_eq!(again, Some(i), "it is the next ready QP");
                }
            }
        }
        true
    }

    /// Work for a caller with nothing else to do (its poll found nothing to receive, or it is
    /// about to sleep): brings up to date the path weights of the QPs that had feedback since
    /// their last refresh. Without it a QP refreshes them when feedback has piled up
    /// (`PathConfig` amortizes it over a few events), which falls on the path of an ACK or a
    /// post; called in idle time, the refresh is already done when they come. The weights are
    /// those a refresh computes at any moment, so nothing but their timing changes. Returns
    /// whether any QP's weights were refreshed.
    pub fn tidy(&mut self) -> bool {
        let mut any = false;
        while let Some(i) = self.qps.unsettled.take_next() {
            if let Some(qp) = self.qps.qps.get_mut(i) {
                any |= qp.route.paths.settle();
            }
        }
        any
    }

    /// Whether a QP may have something to send: `false` when `poll_transmit` would surely
    /// return nothing (so a caller need not read its clock to stamp datagrams).
    pub fn may_transmit(&self) -> bool {
        !self.qps.ready.is_empty()
    }

    /// How many times, in all, `poll_transmit` asked a QP for a datagram: a measure of its
    /// work for tests (it grows with the datagrams sent and the QPs that had events, not with
    /// idle QPs).
    #[doc(hidden)]
    pub fn transmit_visits(&self) -> u64 {
        self.tx_visits
    }

    /// The next completion, with the completion queue it belongs to.
    pub fn poll_completion(&mut self) -> Option<(CqId, Completion)> {
        self.sh.completions.pop_front()
    }

    /// When `handle_timeout` must next be called, if any timer is armed.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.qps.next_deadline()
    }

    /// Number of QPs.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }
}

#[cfg(test)]
mod register_as_tests {
    use super::*;

    fn endpoint(seed: u64) -> Endpoint {
        let cfg = EndpointConfig {
            seed,
            ..EndpointConfig::default()
        };
        Endpoint::new(cfg, "127.0.0.1:1".parse().unwrap())
    }

    #[test]
    fn a_region_registered_as_another_endpoints_keys_keeps_them_and_refuses_reuse() {
        let (mut a, mut b) = (endpoint(1), endpoint(2));
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let region = Region::new(64);
        let keys = a
            .register(pa, region.clone(), Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            b.register_as(pb, region.clone(), Access::REMOTE_WRITE, keys),
            Ok(())
        );
        // Either key in use, or 0, is refused; an unknown PD too.
        let other = MrKeys {
            lkey: keys.lkey,
            rkey: keys.rkey ^ 1,
        };
        assert_eq!(
            b.register_as(pb, region.clone(), Access::NONE, other),
            Err(ResourceError::Busy)
        );
        let zero = MrKeys { lkey: 0, rkey: 5 };
        assert_eq!(
            b.register_as(pb, region.clone(), Access::NONE, zero),
            Err(ResourceError::Busy)
        );
        let fresh = MrKeys {
            lkey: keys.lkey ^ 1,
            rkey: keys.rkey ^ 1,
        };
        assert_eq!(
            b.register_as(PdId(999), region, Access::NONE, fresh),
            Err(ResourceError::UnknownPd)
        );
        // The PD is in use through the region until it is deregistered under the same key.
        assert_eq!(b.dealloc_pd(pb), Err(ResourceError::Busy));
        assert_eq!(b.deregister(keys.lkey), Ok(()));
        assert_eq!(b.dealloc_pd(pb), Ok(()));
    }
}

/// What the test modules below share.
#[cfg(test)]
mod fixtures {
    use super::*;

    /// The addresses of the two endpoints A and B.
    pub(super) fn addrs() -> (SocketAddr, SocketAddr) {
        (
            "10.0.0.1:4791".parse().unwrap(),
            "10.0.0.2:4791".parse().unwrap(),
        )
    }

    /// A QP on `a` (in `apd`, both queues on `acq`) connected to a new one on `b` (in
    /// `bpd`, on `bcq`): A's.
    pub(super) fn connected_qp(
        a: &mut Endpoint,
        b: &mut Endpoint,
        (apd, acq): (PdId, CqId),
        (bpd, bcq): (PdId, CqId),
    ) -> QpInfo {
        let qa = a.create_qp(apd, acq, acq).unwrap();
        let qb = b.create_qp(bpd, bcq, bcq).unwrap();
        a.connect(qa.qpn, qb).unwrap();
        b.connect(qb.qpn, qa).unwrap();
        qa
    }

    /// A `len`-byte source region at A and a remotely writable one at B.
    pub(super) fn write_regions(
        a: &mut Endpoint,
        b: &mut Endpoint,
        apd: PdId,
        bpd: PdId,
        len: usize,
    ) -> (MrKeys, MrKeys) {
        let src = a.register(apd, Region::new(len), Access::NONE).unwrap();
        let dst = b
            .register(bpd, Region::new(len), Access::REMOTE_WRITE)
            .unwrap();
        (src, dst)
    }

    /// A signaled WRITE (`wr_id` 7) of `len` bytes from the start of `src` to that of `dst`.
    pub(super) fn write_wr(src: &MrKeys, dst: &MrKeys, len: u32) -> SendWr {
        SendWr {
            wr_id: 7,
            op: SendOp::Write(RemoteAddr {
                rkey: dst.rkey,
                offset: 0,
            }),
            sges: vec![Sge {
                lkey: src.lkey,
                offset: 0,
                len,
            }],
            signaled: true,
        }
    }
}

#[cfg(test)]
mod host_wait_tests {
    use std::sync::{Arc, Mutex};

    use super::fixtures::{addrs, connected_qp, write_regions, write_wr};
    use super::*;
    use crate::cc::{AckSample, Controller, ControllerFactory, FixedWindowConfig};

    /// (round trip, fabric delay) of each sample a controller was given.
    type Seen = Arc<Mutex<Vec<(Option<u64>, Option<u64>, u32)>>>;

    /// A fixed window that records the delay samples it is given, with their bytes.
    #[derive(Debug)]
    struct Recorder {
        inner: Box<dyn Controller>,
        seen: Seen,
    }

    impl Controller for Recorder {
        fn on_sent(&mut self, now: Timestamp, bytes: u32, psn: u32) {
            self.inner.on_sent(now, bytes, psn);
        }
        fn on_ack(&mut self, now: Timestamp, sent_at: Timestamp, bytes: u32, rtt: Option<u64>) {
            self.inner.on_ack(now, sent_at, bytes, rtt);
        }
        fn on_ack_with(&mut self, now: Timestamp, s: &AckSample) {
            self.seen
                .lock()
                .unwrap()
                .push((s.rtt_ns, s.fabric_delay_ns, s.bytes));
            self.inner.on_ack_with(now, s);
        }
        fn on_congestion_event(&mut self, now: Timestamp, sent: Timestamp, ecn: bool, lost: u32) {
            self.inner.on_congestion_event(now, sent, ecn, lost);
        }
        fn window(&self) -> u64 {
            self.inner.window()
        }
    }

    #[derive(Debug)]
    struct RecorderFactory(Seen);

    impl ControllerFactory for RecorderFactory {
        fn build(&self, mtu: u32) -> Box<dyn Controller> {
            Box::new(Recorder {
                inner: FixedWindowConfig { packets: 16 }.build(mtu),
                seen: self.0.clone(),
            })
        }
    }

    /// Two endpoints A (with controller `cc`) and B, one connected QP pair, a `len`-byte
    /// source region at A and a remotely writable one at B.
    struct Two {
        a: Endpoint,
        b: Endpoint,
        ea: SocketAddr,
        eb: SocketAddr,
        qa: QpInfo,
        src: MrKeys,
        dst: MrKeys,
    }

    fn two(cc: Arc<dyn ControllerFactory>, len: usize) -> Two {
        let (ea, eb) = addrs();
        let mut a = Endpoint::new(
            EndpointConfig {
                seed: 1,
                cc,
                ..EndpointConfig::default()
            },
            ea,
        );
        let mut b = Endpoint::new(
            EndpointConfig {
                seed: 2,
                ..EndpointConfig::default()
            },
            eb,
        );
        let (apd, bpd) = (a.alloc_pd(), b.alloc_pd());
        let (acq, bcq) = (a.create_cq(), b.create_cq());
        let qa = connected_qp(&mut a, &mut b, (apd, acq), (bpd, bcq));
        let (src, dst) = write_regions(&mut a, &mut b, apd, bpd, len);
        Two {
            a,
            b,
            ea,
            eb,
            qa,
            src,
            dst,
        }
    }

    /// One one-packet WRITE from A to B: B takes it 100 µs after it was written, of which it
    /// waited `queued_b` in B's kernel, and acknowledges it at once; A takes the ACK 100 µs
    /// later, of which it waited `queued_a`. A's runtime says the send returned `departs` ns
    /// after the write (`None`: it does not say). Returns the (round trip, fabric delay)
    /// samples A's controller saw.
    fn one_write(
        queued_b: u32,
        queued_a: u32,
        departs: Option<u64>,
    ) -> Vec<(Option<u64>, Option<u64>)> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let Two {
            mut a,
            mut b,
            ea,
            eb,
            qa,
            src,
            dst,
        } = two(Arc::new(RecorderFactory(seen.clone())), 64);
        let wr = write_wr(&src, &dst, 64);
        a.post_send(qa.qpn, wr).unwrap();
        let t0 = Timestamp::from_micros(1_000);
        let mut buf = vec![0u8; 2048];
        let t = a.poll_transmit(t0, &mut buf).expect("the WRITE leaves");
        let batch = a.end_tx_batch();
        if let Some(d) = departs {
            a.departed(batch, t0.add_nanos(d));
        }
        let data = buf[..t.len].to_vec();
        let tb = t0.add_nanos(100_000);
        b.handle_received(tb, queued_b, ea, 0, &data);
        let t = b.poll_transmit(tb, &mut buf).expect("the ACK leaves");
        let ack = buf[..t.len].to_vec();
        a.handle_received(tb.add_nanos(100_000), queued_a, eb, 0, &ack);
        let (_, wc) = a.poll_completion().expect("the WRITE completes");
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
        seen.lock().unwrap().iter().map(|s| (s.0, s.1)).collect()
    }

    #[test]
    fn the_controller_hears_of_one_ack_frame_once_with_all_its_bytes() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let Two {
            mut a,
            mut b,
            ea,
            eb,
            qa,
            src,
            dst,
        } = two(Arc::new(RecorderFactory(seen.clone())), 8192);
        let len = 4 * a.chunk_size() + 100;
        a.post_send(qa.qpn, write_wr(&src, &dst, len)).unwrap();
        let t0 = Timestamp::from_micros(1_000);
        let mut buf = vec![0u8; 2048];
        let mut packets = Vec::new();
        while let Some(t) = a.poll_transmit(t0, &mut buf) {
            packets.push(buf[..t.len].to_vec());
        }
        assert_eq!(packets.len(), 5);
        let wire: usize = packets.iter().map(Vec::len).sum();
        let tb = t0.add_nanos(50_000);
        for p in &packets {
            b.handle_received(tb, 0, ea, 0, p);
        }
        let t = b.poll_transmit(tb, &mut buf).expect("the ACK leaves");
        let ack = buf[..t.len].to_vec();
        assert!(
            b.poll_transmit(tb, &mut buf).is_none(),
            "one ACK for all five"
        );
        a.handle_received(tb.add_nanos(50_000), 0, eb, 0, &ack);
        let (_, wc) = a.poll_completion().expect("the WRITE completes");
        assert_eq!(wc.status, WcStatus::Success);
        // One call for the frame: all five packets' bytes, and the frame's delay with them.
        assert_eq!(
            *seen.lock().unwrap(),
            [(Some(100_000), Some(100_000), wire as u32)]
        );
    }

    #[test]
    fn time_a_datagram_waited_in_either_hosts_kernel_is_not_fabric_delay() {
        // Without receive timestamps: all 200 µs are the round trip and the fabric's.
        assert_eq!(one_write(0, 0, None), [(Some(200_000), Some(200_000))]);
        // The data waited 40 µs in B's kernel (B's holding time counts from its arrival),
        // the ACK 50 µs in A's: the fabric's share is 110 µs; the round trip A waited for,
        // behind its retransmit timeout, stays whole.
        assert_eq!(
            one_write(40_000, 50_000, None),
            [(Some(200_000), Some(110_000))]
        );
        // A wait longer than the sample (a wall-clock oddity) leaves at least 1 ns.
        assert_eq!(one_write(0, u32::MAX, None), [(Some(200_000), Some(1))]);
    }

    #[test]
    fn time_a_datagram_took_to_leave_this_host_is_not_fabric_delay() {
        // The send returned 30 µs after the write: 170 µs are the fabric's, the round trip
        // stays whole.
        assert_eq!(
            one_write(0, 0, Some(30_000)),
            [(Some(200_000), Some(170_000))]
        );
        // With the receive-side waits too: 200 - 30 - 40 - 50.
        assert_eq!(
            one_write(40_000, 50_000, Some(30_000)),
            [(Some(200_000), Some(80_000))]
        );
        // A departure after the ACK's arrival (a wall-clock oddity) leaves at least 1 ns.
        assert_eq!(one_write(0, 0, Some(300_000)), [(Some(200_000), Some(1))]);
        // A departure at the write itself changes nothing.
        assert_eq!(one_write(0, 0, Some(0)), [(Some(200_000), Some(200_000))]);
    }

    /// A two-packet WRITE from A to B, both packets built at t0 in one transmit batch whose
    /// send returned `departs` ns later (`None`: the runtime does not say). B gets only the
    /// first and acknowledges it 100 µs after t0; then A runs its timers at `at` ns after
    /// t0. Returns whether A resent the second packet by then.
    fn second_packet_resent(departs: Option<u64>, at: u64) -> bool {
        let Two {
            mut a,
            mut b,
            ea,
            eb,
            qa,
            src,
            dst,
        } = two(Arc::new(FixedWindowConfig { packets: 16 }), 4096);
        let len = a.chunk_size() + 100;
        let wr = write_wr(&src, &dst, len);
        a.post_send(qa.qpn, wr).unwrap();
        let t0 = Timestamp::from_micros(1_000);
        let mut buf = vec![0u8; 2048];
        let t = a
            .poll_transmit(t0, &mut buf)
            .expect("the first packet leaves");
        let first = buf[..t.len].to_vec();
        let _second = a
            .poll_transmit(t0, &mut buf)
            .expect("the second packet leaves");
        assert!(a.poll_transmit(t0, &mut buf).is_none(), "two packets");
        let batch = a.end_tx_batch();
        if let Some(d) = departs {
            a.departed(batch, t0.add_nanos(d));
        }
        let tb = t0.add_nanos(50_000);
        b.handle_received(tb, 0, ea, 0, &first);
        let t = b.poll_transmit(tb, &mut buf).expect("the ACK leaves");
        let ack = buf[..t.len].to_vec();
        a.handle_received(t0.add_nanos(100_000), 0, eb, 0, &ack);
        let now = t0.add_nanos(at);
        a.handle_timeout(now);
        a.poll_transmit(now, &mut buf).is_some()
    }

    #[test]
    fn the_reorder_timer_runs_from_when_a_packet_left_not_from_when_it_was_built() {
        // One round trip sample of 100 µs: the timer waits 100 + 4 x 50 µs plus the 20 µs
        // reordering window, 320 µs, and the retransmit timeout is 500 µs after the ACK.
        // Timed from its build, the second packet is resent after 320 µs.
        assert!(!second_packet_resent(None, 310_000));
        assert!(second_packet_resent(None, 330_000));
        // Its batch's send returned 150 µs after the build: it left then, so it is not
        // taken for lost before 470 µs, and is by 480 µs (before the retransmit timeout).
        assert!(!second_packet_resent(Some(150_000), 460_000));
        assert!(second_packet_resent(Some(150_000), 480_000));
    }
}

#[cfg(test)]
mod tidy_tests {
    use super::fixtures::{addrs, connected_qp, write_regions, write_wr};
    use super::*;

    #[test]
    fn tidy_refreshes_the_path_weights_that_feedback_left_stale_and_only_those() {
        let (ea, eb) = addrs();
        let cfg = |seed| EndpointConfig {
            seed,
            ..EndpointConfig::default()
        };
        let (mut a, mut b) = (Endpoint::new(cfg(1), ea), Endpoint::new(cfg(2), eb));
        let (apd, bpd) = (a.alloc_pd(), b.alloc_pd());
        let (acq, bcq) = (a.create_cq(), b.create_cq());
        let (src, dst) = write_regions(&mut a, &mut b, apd, bpd, 64);
        // Three QPs; only the first two WRITE (one packet each), so only they get feedback.
        let qpns: Vec<u32> = (0..3)
            .map(|_| connected_qp(&mut a, &mut b, (apd, acq), (bpd, bcq)).qpn)
            .collect();
        let settled = |a: &Endpoint| -> Vec<bool> {
            qpns.iter()
                .map(|&q| !a.qps.get(q).unwrap().route.paths.is_dirty())
                .collect()
        };
        // Fresh path sets were refreshed at creation.
        assert!(!a.tidy() && settled(&a) == [true, true, true]);
        for &q in &qpns[..2] {
            a.post_send(q, write_wr(&src, &dst, 8)).unwrap();
        }
        let mut buf = vec![0u8; 2048];
        let mut now = Timestamp::from_micros(1_000);
        let mut relay = |from: &mut Endpoint, to: &mut Endpoint, src, now: Timestamp| {
            while let Some(t) = from.poll_transmit(now, &mut buf) {
                to.handle_received(now.add_nanos(10_000), 0, src, 0, &buf[..t.len]);
            }
        };
        relay(&mut a, &mut b, ea, now);
        now = now.add_nanos(10_000);
        relay(&mut b, &mut a, eb, now);
        assert_eq!(
            std::iter::from_fn(|| a.poll_completion()).count(),
            2,
            "both WRITEs acknowledged"
        );
        // One ACK each is one feedback event: fewer than a refresh waits for, so the weights
        // of the two QPs that had feedback are stale, the third's are not.
        assert_eq!(settled(&a), [false, false, true]);
        assert!(a.tidy());
        assert_eq!(settled(&a), [true, true, true]);
        assert!(!a.tidy(), "nothing left to refresh");
    }
}

#[cfg(test)]
mod transmit_batch_tests {
    use super::fixtures::{addrs, connected_qp, write_regions, write_wr};
    use super::*;

    /// Every datagram both endpoints sent, in order, and how many QP visits each side's
    /// transmits took, when each of A's `qps` QPs WRITEs 42 packets to B in bursts of
    /// `burst` (with 4, a message ends mid-burst) and both sides take their datagrams `batch`
    /// at a time (0: one `poll_transmit` call each), each side's output handed to the other
    /// 50 µs later, with one datagram in 13 from A lost (retransmissions interrupt bursts).
    fn exchange(qps: u64, burst: u16, batch: usize) -> (Vec<Vec<u8>>, u64, u64) {
        let (ea, eb) = addrs();
        let cfg = |seed| EndpointConfig {
            seed,
            burst,
            ..EndpointConfig::default()
        };
        let (mut a, mut b) = (Endpoint::new(cfg(1), ea), Endpoint::new(cfg(2), eb));
        let (apd, bpd) = (a.alloc_pd(), b.alloc_pd());
        let (acq, bcq) = (a.create_cq(), b.create_cq());
        let len = 42 * 1400;
        for q in 0..qps {
            let qa = connected_qp(&mut a, &mut b, (apd, acq), (bpd, bcq));
            let (src, dst) = write_regions(&mut a, &mut b, apd, bpd, len);
            let wr = SendWr {
                wr_id: q,
                ..write_wr(&src, &dst, len as u32)
            };
            a.post_send(qa.qpn, wr).unwrap();
        }
        let size = 2048;
        let mut bufs = vec![0u8; 64 * size];
        let mut metas = Vec::new();
        let mut all = Vec::new();
        let mut now = Timestamp::from_micros(1_000);
        let mut completions = 0;
        for _ in 0..1000 {
            for side in 0..2 {
                let (from, to, src) = if side == 0 {
                    (&mut a, &mut b, ea)
                } else {
                    (&mut b, &mut a, eb)
                };
                from.handle_timeout(now);
                let mut out = Vec::new();
                loop {
                    metas.clear();
                    if batch == 0 {
                        if let Some(t) = from.poll_transmit(now, &mut bufs[..size]) {
                            metas.push(t);
                        }
                    } else {
                        from.poll_transmit_batch(now, &mut bufs, size, &mut metas, batch);
                    }
                    if metas.is_empty() {
                        break;
                    }
                    for (k, t) in metas.iter().enumerate() {
                        out.push(bufs[k * size..k * size + t.len].to_vec());
                    }
                }
                now = now.add_nanos(50_000);
                for (n, d) in out.iter().enumerate() {
                    if side == 1 || (all.len() + n) % 13 != 5 {
                        to.handle_received(now, 0, src, 0, d);
                    }
                }
                all.extend(out);
            }
            while let Some((_, wc)) = a.poll_completion() {
                assert_eq!(wc.status, WcStatus::Success);
                completions += 1;
            }
            if completions == qps {
                return (all, a.transmit_visits(), b.transmit_visits());
            }
        }
        panic!("the WRITEs did not complete");
    }

    #[test]
    fn a_transmit_batch_sends_what_single_polls_send() {
        for (qps, burst) in [(3, 4), (1, 1), (2, 1)] {
            let single = exchange(qps, burst, 0);
            assert!(
                single.0.len() as u64 > 44 * qps,
                "{} datagrams",
                single.0.len()
            );
            for batch in [1, 3, 7, 64] {
                assert!(
                    exchange(qps, burst, batch) == single,
                    "{qps} QPs, bursts of {burst}, batches of {batch}"
                );
            }
        }
    }
}
