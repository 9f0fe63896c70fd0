//! One queue pair: the state [`Endpoint`](crate::Endpoint) keeps per QP, split by concern
//! (as quinn-proto splits its connection), each part in its own file:
//!
//! - [`requester`]: the send queue, packetizing new work, matching responses (READ and atomic
//!   results, NAKs) to work requests, and completing them in posting order;
//! - [`responder`]: executing and placing arriving requests, the receive queue, the READ and
//!   atomic response jobs, NAKs, and the execution/completion gate of RC semantics (a fatal
//!   refusal stops the QP; receives complete in order);
//! - [`recovery`]: the sent-packet record, ACK processing, RACK-style loss detection, the
//!   retransmit timeout, RTT estimation, spurious-loss undo and the retry budget;
//! - [`paths`]: the source-port map, PLB re-pathing and the pacing glue;
//! - [`transmit`]: building headers and emitting datagrams, and the turn-taking between
//!   response traffic and the QP's own requests;
//! - [`stats`]: the counters and the [`QpStats`] snapshot;
//! - [`revoke`]: what a QP does when a region it uses is deregistered.
//!
//! What lives here is what every part uses: the QP's fields, packet dispatch, the next
//! deadline, index lookups and the move to the error state.
use std::collections::VecDeque;
use std::sync::Arc;

use braid_cc::paths::{PathConfig, PathSet};
use braid_cc::{AckSample, Controller, Pacer};
use braid_time::{Ecn, Timestamp};
use rand_core::RngCore;

use crate::coverage::{Coverage, RangeBudget};
use crate::hist::RttHistogram;
use crate::in_place::{self, PayloadAt};
use crate::landing::{LANDING_MIN_BYTES, Landing, LandingHint};
use crate::mem::{Access, Region};
use crate::nak_repeat::{NakRepeat, Until};
use crate::rc_order::RcOrder;
use crate::retry::{AwaitedResponses, RetryBudget, Timeout};
use crate::seal::QpSeal;
use crate::seq::{CeCount, Msn, Psn};
use crate::share::{SendShare, Turn};
use crate::shared::Shared;
use crate::tracker::{Class, RecvTracker};
use crate::types::*;
use crate::wire::{self, Body, Header, Op, Syndrome};

pub(crate) mod paths;
pub(crate) mod recovery;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod revoke;
pub(crate) mod stats;
pub(crate) mod transmit;

pub(crate) use paths::*;
pub(crate) use recovery::*;
pub(crate) use requester::*;
pub(crate) use responder::*;
pub(crate) use stats::Counters;
pub use stats::QpStats;
pub use transmit::Transmit;

/// A local buffer resolved at post time.
#[derive(Clone, Debug)]
pub(crate) struct Seg {
    pub(crate) region: Arc<Region>,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

/// A work request's scatter/gather list: most have one or two entries, held inline, so a
/// post allocates nothing.
pub(crate) type Segs = smallvec::SmallVec<[Seg; 2]>;

/// Copies message bytes `[off, off + out.len())` out of a gather list.
///
/// With `crc` (the CRC32C of the bytes before `out`), returns the CRC32C through `out`,
/// computed as the bytes are copied ([`Region::read_crc`]); without, returns 0.
pub(crate) fn gather(segs: &[Seg], mut off: u64, out: &mut [u8], mut crc: Option<u32>) -> u32 {
    let mut done = 0;
    for s in segs {
        if done == out.len() {
            break;
        }
        let len = u64::from(s.len);
        if off >= len {
            off -= len;
            continue;
        }
        let n = ((len - off) as usize).min(out.len() - done);
        // Bounds were checked when the work request was posted.
        let part = &mut out[done..done + n];
        match crc {
            Some(c) => crc = Some(s.region.read_crc(s.offset + off, part, c).unwrap_or(c)),
            None => {
                let _ = s.region.read(s.offset + off, part);
            }
        }
        done += n;
        off = 0;
    }
    crc.unwrap_or(0)
}

/// The region and offset of message bytes `[off, off + len)` of a gather list, if they lie
/// in one entry.
pub(crate) fn seg_span(segs: &[Seg], mut off: u64, len: usize) -> Option<(&Arc<Region>, u64)> {
    for s in segs {
        let seg_len = u64::from(s.len);
        if off < seg_len {
            return (off + len as u64 <= seg_len).then_some((&s.region, s.offset + off));
        }
        off -= seg_len;
    }
    None
}

/// Copies `data` into a scatter list at message offset `off`. False if it does not fit.
pub(crate) fn scatter(segs: &[Seg], mut off: u64, data: &[u8]) -> bool {
    let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
    if off + data.len() as u64 > total {
        return false;
    }
    let mut done = 0;
    for s in segs {
        if done == data.len() {
            break;
        }
        let len = u64::from(s.len);
        if off >= len {
            off -= len;
            continue;
        }
        let n = ((len - off) as usize).min(data.len() - done);
        if s.region
            .write(s.offset + off, &data[done..done + n])
            .is_err()
        {
            return false;
        }
        done += n;
        off = 0;
    }
    true
}

pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) pd: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) state: QpState,
    pub(crate) peer: Option<QpInfo>,
    pub(crate) initial_psn: Psn,
    /// How new packets are shared between the responder's jobs and the send queue
    /// ([`crate::share`]).
    pub(crate) share: SendShare,
    /// Placement ranges tracked over all of this QP's messages.
    pub(crate) ranges: RangeBudget,
    pub(crate) cc: Box<dyn Controller>,
    /// Encryption of this QP's packets, if any ([`crate::seal`]).
    pub(crate) seal: QpSeal,
    /// Counters behind [`QpStats`] ([`stats`]).
    pub(crate) counters: Counters,
    /// Port map, re-pathing and pacing ([`paths`]).
    pub(crate) route: Route,
    /// Sent packets, loss detection, RTT and the retransmit timer ([`recovery`]).
    pub(crate) rec: Recovery,
    /// The send queue ([`requester`]).
    pub(crate) req: Requester,
    /// What the peer's requests built up: tracker, ACK/NAK state, receive queue, response
    /// jobs, the RC gate ([`responder`]).
    pub(crate) rsp: Responder,
}

/// Who a new QP is: its number and the resources it was created on.
pub(crate) struct QpIds {
    pub(crate) qpn: u32,
    pub(crate) pd: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
}

impl Qp {
    /// A QP in the `Init` state, its first PSN `psn`.
    pub(crate) fn new(
        ids: QpIds,
        psn: Psn,
        cc: Box<dyn Controller>,
        opts: &QpOptions,
        cfg: &EndpointConfig,
    ) -> Qp {
        Qp {
            qpn: ids.qpn,
            pd: ids.pd,
            send_cq: ids.send_cq,
            recv_cq: ids.recv_cq,
            state: QpState::Init,
            peer: None,
            initial_psn: psn,
            share: SendShare::default(),
            ranges: RangeBudget::default(),
            cc,
            seal: QpSeal::new(opts.seal_secret),
            counters: Counters::new(cfg.paths),
            route: Route::new(cfg.paths, opts.burst.unwrap_or(cfg.burst), cfg.path),
            rec: Recovery::new(psn),
            req: Requester::new(),
            rsp: Responder::new(opts.unordered),
        }
    }

    /// Hands a parsed, authenticated packet from the connected peer to its handler; `hop`
    /// is the datagram's hop telemetry ([`wire::hop_queue`]), echoed by the next ACK if the
    /// packet is accepted.
    pub(crate) fn dispatch(
        &mut self,
        now: Timestamp,
        ecn: Ecn,
        hop: u16,
        pkt: &wire::Packet<'_>,
        sh: &mut Shared,
    ) {
        let h = pkt.header;
        self.rsp.rx_hop = hop;
        match pkt.body {
            Body::Ack(a) => self.on_ack(now, &a, h.flags, ack_hop(pkt.payload), sh),
            Body::Nak(n) => self.on_nak(now, &n, sh),
            Body::Request(r) => self.on_request(now, &h, &r, pkt.payload, ecn, sh),
            Body::ReadResponse(r) => self.on_read_response(now, &h, &r, pkt.payload, ecn, sh),
            Body::AtomicResponse(r) => self.on_atomic_response(now, &h, &r, ecn, sh),
        }
    }
    pub(crate) fn next_deadline(&self) -> Option<Timestamp> {
        // NAKs (and their repeats) go out in any state.
        let nak = self.rsp.nak_repeat.deadline();
        if self.state != QpState::Connected {
            return nak;
        }
        // The earliest of the timers, without building an iterator chain: this runs after
        // every event of the QP.
        let mut next = earlier(nak, self.rec.rto_deadline);
        next = earlier(next, self.rec.reorder_deadline);
        next = earlier(next, self.rsp.ack_due);
        next = earlier(next, self.rsp.fence_deadline);
        if self.route.paced_out {
            next = earlier(next, Some(self.pace_at()));
        }
        for &psn in &self.rec.held {
            if let Some(i) = self.sent_index(psn) {
                next = earlier(next, Some(self.rec.sent[i].hold_until));
            }
        }
        next
    }
    pub(crate) fn sent_index(&self, psn: u32) -> Option<usize> {
        let i = Psn(psn).since(self.rec.snd_una) as usize;
        (i < self.rec.sent.len()).then_some(i)
    }
    pub(crate) fn wqe_index(&self, msn: u32) -> Option<usize> {
        let i = Msn(msn).since(self.req.sq_base_msn) as usize;
        (i < self.req.sq.len()).then_some(i)
    }
    /// Moves the QP to the error state and completes every outstanding work request: the
    /// finished ones as successes, the one that failed with its status, the rest as flushed.
    pub(crate) fn enter_error(&mut self, sh: &mut Shared) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        // After the first failed work request everything is flushed, even work that finished
        // meanwhile (verbs semantics: nothing after an error completes successfully).
        let mut failed = false;
        for w in self.req.sq.drain(..) {
            let (status, byte_len) = match w.status {
                Some(s) if !failed => (s, 0),
                Some(_) => (WcStatus::Flushed, 0),
                None if w.is_done() && !failed => (WcStatus::Success, w.len),
                None => (WcStatus::Flushed, 0),
            };
            failed |= status != WcStatus::Success;
            if status != WcStatus::Success || w.signaled {
                sh.complete(
                    self.send_cq,
                    Completion {
                        wr_id: w.wr_id,
                        status,
                        opcode: w.opcode(),
                        byte_len,
                        imm: None,
                        qpn: self.qpn,
                    },
                );
            }
        }
        self.req.sq_base_msn = self.req.next_msn;
        self.req.pack_idx = 0;
        self.req.awaited.clear();
        self.req.reask.clear();
        self.ranges.clear();
        self.flush_rq(sh);
        self.rsp.resp.clear();
        self.rec.sent.clear();
        self.rec.snd_una = self.rec.next_psn;
        self.rec.rtx.clear();
        self.rec.held.clear();
        self.rec.in_flight_bytes = 0;
        self.rec.in_flight_pkts = 0;
        self.rec.rto_deadline = None;
        self.rec.reorder_deadline = None;
        self.rsp.ack_pending = false;
        self.rsp.unacked = 0;
        self.rsp.ack_due = None;
    }
}

/// The earlier of two optional deadlines (`None` is "not armed", later than any).
fn earlier(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The hop telemetry of an ACK's extension ([`wire::field::ack_ext`]), 0 without one.
fn ack_hop(ext: &[u8]) -> u16 {
    match ext.get(wire::field::ack_ext::HOP_QUEUE) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        _ => 0,
    }
}
