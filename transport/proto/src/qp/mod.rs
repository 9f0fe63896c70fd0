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

use braid_cc::paths::PathSet;
use braid_cc::{AckSample, Controller, Pacer};
use braid_time::{Ecn, Timestamp};
use rand_core::RngCore;

use crate::coverage::{Coverage, RangeBudget};
use crate::endpoint::{Shared, Transmit};
use crate::hist::RttHistogram;
use crate::mem::{Access, Region};
use crate::nak_repeat::{NakRepeat, Until};
use crate::rc_order::RcOrder;
use crate::retry::{AwaitedResponses, RetryBudget, Timeout};
use crate::seal::QpSeal;
use crate::seq::{CeCount, Msn, Psn};
use crate::share::{SendShare, Turn};
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
pub use stats::QpStats;

/// A local buffer resolved at post time.
#[derive(Clone, Debug)]
pub(crate) struct Seg {
    pub(crate) region: Arc<Region>,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

/// Copies message bytes `[off, off + out.len())` out of a gather list.
pub(crate) fn gather(segs: &[Seg], mut off: u64, out: &mut [u8]) {
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
        let _ = s.region.read(s.offset + off, &mut out[done..done + n]);
        done += n;
        off = 0;
    }
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
    // Requester.
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) sq_base_msn: Msn,
    pub(crate) next_msn: Msn,
    pub(crate) next_ssn: Msn,
    /// Index in `sq` of the first work request with packets still to emit.
    pub(crate) pack_idx: usize,
    // Responder output.
    pub(crate) resp: VecDeque<RespJob>,
    /// How new packets are shared between `resp` and `sq` ([`crate::share`]).
    pub(crate) share: SendShare,
    // Reliability of what this QP sends.
    pub(crate) next_psn: Psn,
    pub(crate) snd_una: Psn,
    pub(crate) sent: VecDeque<SentPkt>,
    pub(crate) rtx: VecDeque<u32>,
    pub(crate) held: Vec<u32>,
    pub(crate) in_flight_bytes: u64,
    pub(crate) in_flight_pkts: u32,
    pub(crate) rtt: Rtt,
    pub(crate) rtt_hist: RttHistogram,
    pub(crate) rto_deadline: Option<Timestamp>,
    pub(crate) backoff: u32,
    /// Counted timeouts and silence since the peer was last heard from.
    pub(crate) retry: RetryBudget,
    /// READs and atomics sent and still awaiting their responses.
    pub(crate) awaited: AwaitedResponses,
    /// Placement ranges tracked over all of this QP's messages.
    pub(crate) ranges: RangeBudget,
    pub(crate) rack_ts: Timestamp,
    /// Round trip of the packet that set `rack_ts`: it includes the queueing that packets
    /// sent around the same time meet, which a smoothed RTT averages away.
    pub(crate) rack_rtt_ns: u64,
    /// When the reorder timer of loss detection fires.
    pub(crate) reorder_deadline: Option<Timestamp>,
    pub(crate) reo_mult: u32,
    pub(crate) reo_bumped_at: Timestamp,
    pub(crate) acks_since_spurious: u32,
    pub(crate) cc: Box<dyn Controller>,
    /// Per-path health, spraying weights and re-pathing (indexed by logical path).
    pub(crate) paths: PathSet,
    /// Logical path → device path (source port). Re-pathing moves a logical path to a
    /// fresh port.
    pub(crate) port_map: Vec<u16>,
    /// The ports `port_map` holds (each at most once), for finding a spare one in O(1).
    pub(crate) ports_used: PortSet,
    pub(crate) repaths: u64,
    /// CE marks the peer reported for our packets.
    pub(crate) ce_marks: u64,
    pub(crate) pacer: Pacer,
    /// When the last new packet left, and its length (see [`Qp::pace_at`]).
    pub(crate) last_paced: (Timestamp, u32),
    /// New packets are waiting only for the pacer (its next send time is a deadline).
    pub(crate) paced_out: bool,
    pub(crate) peer_ce_seen: CeCount,
    pub(crate) last_echo: (u32, u64),
    pub(crate) packets_sent: u64,
    pub(crate) retransmits: u64,
    pub(crate) rtos: u64,
    pub(crate) spurious_losses: u64,
    pub(crate) spurious_retransmits: u64,
    pub(crate) duplicates_reported: u64,
    /// Retransmitted packets (whose loss the controller heard of) acknowledged without proof
    /// of which copy arrived: the loss send times, oldest first, for duplicate flags to prove
    /// spurious (at most [`MAX_UNRESOLVED_LOSSES`]).
    pub(crate) unresolved_losses: VecDeque<Timestamp>,
    /// Duplicate flags expected for retransmissions already proven spurious.
    pub(crate) dup_expected: u32,
    /// Counters per logical path (the endpoint's `paths` sums them over QPs).
    pub(crate) path_stats: Vec<PathStats>,
    // Receiving the peer's packets.
    pub(crate) rx: RecvTracker,
    pub(crate) ack_pending: bool,
    /// A duplicate arrived since the last ACK was sent (reported with `FLAG_DUPLICATE`).
    pub(crate) dup_since_ack: bool,
    pub(crate) echo: Option<(u32, u64, Timestamp)>,
    pub(crate) ce_count: CeCount,
    pub(crate) naks: VecDeque<(wire::Nak, Until)>,
    /// Where a fatal refusal stopped this QP as a responder, and whether receives complete
    /// in order ([`crate::rc_order`]).
    pub(crate) order: RcOrder,
    /// The last NAK sent, repeated on a short timer in case it was lost.
    pub(crate) nak_repeat: NakRepeat,
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(crate) rq_base_ssn: Msn,
    /// A work request was refused: send nothing new, fail once the earlier ones finish.
    pub(crate) failing: bool,
    /// Encryption of this QP's packets, if any ([`crate::seal`]).
    pub(crate) seal: QpSeal,
}

impl Qp {
    /// Hands a parsed, authenticated packet from the connected peer to its handler.
    pub(crate) fn dispatch(
        &mut self,
        now: Timestamp,
        ecn: Ecn,
        pkt: &wire::Packet<'_>,
        sh: &mut Shared,
    ) {
        let h = pkt.header;
        match pkt.body {
            Body::Ack(a) => self.on_ack(now, &a, h.flags, sh),
            Body::Nak(n) => self.on_nak(now, &n, sh),
            Body::Request(r) => self.on_request(now, &h, &r, pkt.payload, ecn, sh),
            Body::ReadResponse(r) => self.on_read_response(now, &h, &r, pkt.payload, ecn, sh),
            Body::AtomicResponse(r) => self.on_atomic_response(now, &h, &r, ecn, sh),
        }
    }
    pub(crate) fn next_deadline(&self) -> Option<Timestamp> {
        // NAKs (and their repeats) go out in any state.
        let nak = self.nak_repeat.deadline();
        if self.state != QpState::Connected {
            return nak;
        }
        let held = self
            .held
            .iter()
            .filter_map(|&psn| self.sent_index(psn).map(|i| self.sent[i].hold_until));
        let paced = self.paced_out.then(|| self.pace_at());
        held.chain(self.rto_deadline)
            .chain(self.reorder_deadline)
            .chain(paced)
            .chain(nak)
            .min()
    }
    pub(crate) fn sent_index(&self, psn: u32) -> Option<usize> {
        let i = Psn(psn).since(self.snd_una) as usize;
        (i < self.sent.len()).then_some(i)
    }
    pub(crate) fn wqe_index(&self, msn: u32) -> Option<usize> {
        let i = Msn(msn).since(self.sq_base_msn) as usize;
        (i < self.sq.len()).then_some(i)
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
        for w in self.sq.drain(..) {
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
        self.sq_base_msn = self.next_msn;
        self.pack_idx = 0;
        self.awaited.clear();
        self.ranges.clear();
        self.flush_rq(sh);
        self.resp.clear();
        self.sent.clear();
        self.snd_una = self.next_psn;
        self.rtx.clear();
        self.held.clear();
        self.in_flight_bytes = 0;
        self.in_flight_pkts = 0;
        self.rto_deadline = None;
        self.reorder_deadline = None;
        self.ack_pending = false;
    }
}
