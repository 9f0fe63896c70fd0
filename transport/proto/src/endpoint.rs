//! The protocol engine: one [`Endpoint`] per device, holding protection domains, memory
//! regions, completion queues and queue pairs.
//!
//! # Driving an endpoint
//!
//! The endpoint performs no I/O and reads no clock. Its caller (the runtime, or a simulator)
//! drives it with four families of methods, as quinn-proto's `Connection`:
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

use braid_cc::paths::PathSet;
use braid_cc::{AckSample, Controller, Pacer};
use braid_time::{Ecn, Timestamp};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::coverage::{Coverage, RangeBudget};
use crate::hist::{RttHistogram, RttSummary};
use crate::mem::{Access, Region};
use crate::nak_repeat::{NakRepeat, Until};
use crate::rc_order::RcOrder;
use crate::ready::ReadySet;
use crate::retry::{AwaitedResponses, RetryBudget, Timeout};
use crate::seal::QpSeal;
use crate::seq::{CeCount, Msn, Psn};
use crate::share::{SendShare, Turn};
use crate::tracker::{Class, RecvTracker};
use crate::types::*;
use crate::wire::{self, Body, Header, Op, Syndrome};

mod revoke;

/// Most NAKs queued per QP; more are dropped (the sender's retransmission asks again).
const MAX_PENDING_NAKS: usize = 64;
/// Most READ/atomic responses one QP queues for its peer; more requests get an RNR NAK.
const MAX_RESPONSE_JOBS: usize = 1024;
/// Lower bound of the reordering window used by time-based loss detection, ns.
const REO_WND_MIN_NS: u64 = 20_000;
/// Largest multiplier of the reordering window (it grows when losses prove spurious). High
/// enough that the cap in `reorder_window_ns` (the smoothed RTT plus four deviations, at least
/// the RTO floor) is what bounds the window, as SRTT bounds RACK's (RFC 8985 §6.2): with
/// spraying, reordering spans the queueing spread between paths, which a multiple of a
/// quarter of the *minimum* RTT does not follow.
const REO_MULT_MAX: u32 = 1024;
/// Packets acknowledged without a spurious loss before the reordering window shrinks a step.
const REO_DECAY_ACKS: u32 = 4096;
/// Packets a retransmit timeout sends again as a probe.
const RTO_PROBE_PACKETS: usize = 2;
/// Most retransmitted packets kept waiting for a duplicate flag to prove their loss spurious.
const MAX_UNRESOLVED_LOSSES: usize = 64;
/// Largest RTO backoff exponent.
const MAX_BACKOFF_SHIFT: u32 = 10;

/// ECN codepoint for ECN-capable transport, codepoint 0.
pub const ECN_ECT0: u8 = Ecn::Ect0.to_bits();
/// ECN codepoint for congestion experienced.
pub const ECN_CE: u8 = Ecn::Ce.to_bits();

/// A datagram the endpoint wrote into the caller's buffer, to be sent.
#[must_use]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination device address.
    pub dest: SocketAddr,
    /// Path (source port index) to send it on.
    pub path: u16,
    /// ECN codepoint to set in the IP header.
    pub ecn: u8,
    /// Bytes written at the start of the buffer.
    pub len: usize,
}

/// Counters and state of one QP.
#[derive(Clone, Debug, PartialEq)]
pub struct QpStats {
    /// Current state.
    pub state: QpState,
    /// Smoothed RTT, ns (0 before any sample).
    pub srtt_ns: u64,
    /// Minimum RTT seen, ns (0 before any sample).
    pub min_rtt_ns: u64,
    /// Distribution of the fabric RTT samples (receiver holding time removed): percentiles
    /// from a log-linear histogram (within 1/32 of a recorded value), exact min and max.
    pub rtt: RttSummary,
    /// Current retransmit timeout, ns.
    pub rto_ns: u64,
    /// Congestion controller in use.
    pub cc: &'static str,
    /// Congestion window, bytes.
    pub cwnd_bytes: u64,
    /// Pacing rate, bytes per second, when the controller paces.
    pub pacing_rate: Option<u64>,
    /// CE marks the peer reported for this QP's packets.
    pub ce_marks: u64,
    /// Paths moved to a fresh source port (PLB re-pathing).
    pub repaths: u64,
    /// Spraying weight of each logical path (sums to 1).
    pub path_weights: Vec<f64>,
    /// Bytes in flight.
    pub in_flight_bytes: u64,
    /// Data packets sent (first transmissions).
    pub packets_sent: u64,
    /// Data packets retransmitted.
    pub retransmits: u64,
    /// Retransmit timeouts fired on this QP.
    pub rtos: u64,
    /// Packets declared lost whose original transmission was acknowledged after all.
    pub spurious_losses: u64,
    /// Retransmissions that proved unnecessary: the acknowledgement was for an earlier copy
    /// (Eifel-style echo check), or the peer flagged a duplicate that no earlier proof
    /// explains.
    pub spurious_retransmits: u64,
    /// ACKs from the peer flagging that a duplicate arrived (`FLAG_DUPLICATE`).
    pub duplicates_reported: u64,
    /// Device source port each logical path currently uses (changes on re-pathing).
    pub path_ports: Vec<u16>,
    /// Counters per logical path of this QP.
    pub paths: Vec<PathStats>,
    /// Send work requests posted and not yet completed.
    pub outstanding_sends: usize,
    /// Receive work requests posted and not yet completed.
    pub outstanding_recvs: usize,
}

struct Mr {
    region: Arc<Region>,
    pd: u32,
    access: Access,
    rkey: u32,
}

/// Everything outside the QPs, borrowed by QP methods alongside the QP itself.
struct Shared {
    cfg: EndpointConfig,
    rng: ChaCha8Rng,
    mrs: HashMap<u32, Mr>,
    rkeys: HashMap<u32, u32>,
    completions: VecDeque<(CqId, Completion)>,
    stats: EndpointStats,
    paths: Vec<PathStats>,
    /// Every QP's RTT samples together (the device-level distribution).
    rtt_hist: RttHistogram,
    req_chunk: u32,
    resp_chunk: u32,
}

impl Shared {
    fn complete(&mut self, cq: u32, c: Completion) {
        self.completions.push_back((CqId(cq), c));
    }

    /// Finds the region behind `rkey` for a remote access, checking PD, rights and bounds.
    fn remote_region(
        &self,
        pd: u32,
        rkey: u32,
        need: Access,
        offset: u64,
        len: u64,
    ) -> Result<Arc<Region>, Syndrome> {
        let mr = self
            .rkeys
            .get(&rkey)
            .and_then(|l| self.mrs.get(l))
            .ok_or(Syndrome::RemoteAccess)?;
        if mr.pd != pd || !mr.access.contains(need) {
            return Err(Syndrome::RemoteAccess);
        }
        mr.region
            .check(offset, len)
            .map_err(|_| Syndrome::RemoteAccess)?;
        Ok(mr.region.clone())
    }

    fn random_nonzero(&mut self) -> u32 {
        loop {
            let v = self.rng.next_u32();
            if v != 0 {
                return v;
            }
        }
    }
}

/// A local buffer resolved at post time.
#[derive(Clone, Debug)]
struct Seg {
    region: Arc<Region>,
    offset: u64,
    len: u32,
}

/// Copies message bytes `[off, off + out.len())` out of a gather list.
fn gather(segs: &[Seg], mut off: u64, out: &mut [u8]) {
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

/// A send operation as the wire has it: op, remote address, immediate, atomic operands.
fn decode(op: SendOp) -> (Op, RemoteAddr, u32, (u64, u64)) {
    let none = RemoteAddr { rkey: 0, offset: 0 };
    match op {
        SendOp::Send => (Op::Send, none, 0, (0, 0)),
        SendOp::SendImm(i) => (Op::SendImm, none, i, (0, 0)),
        SendOp::Write(r) => (Op::Write, r, 0, (0, 0)),
        SendOp::WriteImm(r, i) => (Op::WriteImm, r, i, (0, 0)),
        SendOp::Read(r) => (Op::Read, r, 0, (0, 0)),
        SendOp::FetchAdd(r, add) => (Op::FetchAdd, r, 0, (add, 0)),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => (Op::CompareSwap, remote, 0, (swap, compare)),
    }
}

/// The completion status verbs gives a work request refused for its buffers or shape; other
/// refusals (no such QP, not connected, full queue) mean it never ran: flushed.
fn refused_status(e: PostError) -> WcStatus {
    match e {
        PostError::InvalidLkey
        | PostError::WrongPd
        | PostError::OutOfBounds
        | PostError::NoLocalWrite
        | PostError::BadAtomic => WcStatus::LocalProtectionError,
        PostError::TooManySges => WcStatus::LocalLengthError,
        _ => WcStatus::Flushed,
    }
}

fn wc_opcode(op: Op) -> WcOpcode {
    match op {
        Op::Send | Op::SendImm => WcOpcode::Send,
        Op::Write | Op::WriteImm => WcOpcode::Write,
        Op::Read => WcOpcode::Read,
        Op::FetchAdd => WcOpcode::FetchAdd,
        Op::CompareSwap => WcOpcode::CompareSwap,
    }
}

/// Copies `data` into a scatter list at message offset `off`. False if it does not fit.
fn scatter(segs: &[Seg], mut off: u64, data: &[u8]) -> bool {
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

#[derive(Debug)]
struct SendWqe {
    wr_id: u64,
    op: Op,
    segs: Vec<Seg>,
    len: u32,
    remote: RemoteAddr,
    imm: u32,
    operands: (u64, u64),
    signaled: bool,
    msn: u32,
    ssn: u32,
    next_offset: u32,
    packetized: bool,
    unacked_pkts: u32,
    /// Bytes of a READ's response placed so far (their union: see [`Coverage`]).
    read_placed: Coverage,
    got_resp: bool,
    atomic_result: Option<u64>,
    rnr_retries: u32,
    rnr_until: Timestamp,
    status: Option<WcStatus>,
}

impl SendWqe {
    /// A work request not yet sent, without buffers (`segs`, `len` are set by the caller).
    fn new(
        wr_id: u64,
        signaled: bool,
        (op, remote, imm, operands): (Op, RemoteAddr, u32, (u64, u64)),
        msn: u32,
        ssn: u32,
    ) -> SendWqe {
        SendWqe {
            wr_id,
            op,
            segs: Vec::new(),
            len: 0,
            remote,
            imm,
            operands,
            signaled,
            msn,
            ssn,
            next_offset: 0,
            packetized: false,
            unacked_pkts: 0,
            read_placed: Coverage::default(),
            got_resp: false,
            atomic_result: None,
            rnr_retries: 0,
            rnr_until: Timestamp::ZERO,
            status: None,
        }
    }

    fn is_done(&self) -> bool {
        match self.op {
            Op::Read => self.got_resp && self.read_placed.covered() == u64::from(self.len),
            Op::FetchAdd | Op::CompareSwap => self.atomic_result.is_some(),
            _ => self.packetized && self.unacked_pkts == 0,
        }
    }

    fn awaits_response(&self) -> bool {
        self.packetized
            && matches!(self.op, Op::Read | Op::FetchAdd | Op::CompareSwap)
            && !self.is_done()
    }

    fn opcode(&self) -> WcOpcode {
        wc_opcode(self.op)
    }
}

#[derive(Debug)]
struct RecvWqe {
    wr_id: u64,
    segs: Vec<Seg>,
    cap: u64,
    /// Op and total length of the message matched to it, from its first packet.
    msg: Option<(Op, u32)>,
    placed: Coverage,
    imm: Option<u32>,
    done: bool,
    /// Why this receive failed (it completes with this status, in posting order, when the QP
    /// goes to the error state).
    error: Option<WcStatus>,
    /// The latest PSN of its message placed so far: in ordered mode it completes once every
    /// packet up to this one has arrived ([`RcOrder::may_complete`]).
    last_psn: Option<u32>,
}

#[derive(Debug)]
enum SentWhat {
    Req {
        msn: u32,
        offset: u32,
        len: u32,
    },
    ReadResp {
        msn: u32,
        region: Arc<Region>,
        base: u64,
        offset: u32,
        len: u32,
        msg_len: u32,
    },
    AtomicResp {
        msn: u32,
        original: u64,
    },
}

#[derive(Debug)]
struct SentPkt {
    psn: u32,
    what: SentWhat,
    send_ts: Timestamp,
    path: u8,
    wire_len: u32,
    acked: bool,
    /// Declared lost and not yet sent again (in `rtx` or `held`).
    lost: bool,
    /// Sent more than once: an acknowledgement may be for an earlier copy.
    retransmitted: bool,
    /// Path and send time of the first copy, to tell which copy an ACK's echo measured.
    first_path: u8,
    first_ts: Timestamp,
    hold_until: Timestamp,
    /// Its loss was reported to the controller, for the transmission sent at this time.
    cc_loss_ts: Option<Timestamp>,
}

#[derive(Debug)]
enum RespJob {
    Read {
        msn: u32,
        region: Arc<Region>,
        base: u64,
        msg_len: u32,
        next_offset: u32,
    },
    Atomic {
        msn: u32,
        original: u64,
    },
}

/// What one ACK frame says beyond which packets arrived: the measurement for the packet it
/// echoes, and whether new CE marks were reported.
#[derive(Copy, Clone, Debug)]
struct AckFeedback {
    /// Send time of the newest packet the peer accepted (`u64::MAX` when unknown).
    echo_ts_ns: u64,
    echo_psn: u32,
    /// Logical path of the echoed copy of the packet, if known.
    echo_path: u8,
    echo_known: bool,
    /// The echo measured the packet's latest transmission (not an earlier copy that arrived
    /// late, after the packet was declared lost and sent again on another path).
    echo_latest: bool,
    /// Full round trip and fabric delay (holding time removed) of the echoed packet.
    rtt_ns: Option<u64>,
    fabric_ns: Option<u64>,
    /// The ACK reported CE marks not seen before.
    ce: bool,
    /// The delay sample was already handed to the controller for this frame.
    delay_given: bool,
}

impl AckFeedback {
    /// No measurement (a NAK acknowledging a response, for instance).
    const NONE: AckFeedback = AckFeedback {
        echo_ts_ns: u64::MAX,
        echo_psn: 0,
        echo_path: 0,
        echo_known: false,
        echo_latest: false,
        rtt_ns: None,
        fabric_ns: None,
        ce: false,
        delay_given: false,
    };
}

#[derive(Debug, Default)]
struct Rtt {
    srtt_ns: u64,
    rttvar_ns: u64,
    min_ns: u64,
    samples: u64,
}

impl Rtt {
    fn sample(&mut self, rtt: u64) {
        if self.samples == 0 {
            self.srtt_ns = rtt;
            self.rttvar_ns = rtt / 2;
            self.min_ns = rtt;
        } else {
            let err = self.srtt_ns.abs_diff(rtt);
            self.rttvar_ns = (3 * self.rttvar_ns + err) / 4;
            self.srtt_ns = (7 * self.srtt_ns + rtt) / 8;
            self.min_ns = self.min_ns.min(rtt);
        }
        self.samples += 1;
    }
}

/// A set of source ports (`0..MAX_PATHS`), one bit each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PortSet([u64; MAX_PATHS as usize / 64]);

impl PortSet {
    /// Ports `0..n`.
    fn first(n: u16) -> PortSet {
        let mut s = PortSet::default();
        for p in 0..n.min(MAX_PATHS) {
            s.insert(p);
        }
        s
    }

    fn insert(&mut self, port: u16) {
        if let Some(w) = self.0.get_mut(usize::from(port) / 64) {
            *w |= 1 << (port % 64);
        }
    }

    fn remove(&mut self, port: u16) {
        if let Some(w) = self.0.get_mut(usize::from(port) / 64) {
            *w &= !(1 << (port % 64));
        }
    }

    /// How many of the ports `0..n` are not in the set.
    fn free_below(&self, n: u16) -> u16 {
        let n = usize::from(n.min(MAX_PATHS));
        let mut used = 0;
        for (i, w) in self.0.iter().enumerate() {
            let lo = i * 64;
            if lo >= n {
                break;
            }
            let mask = if n - lo >= 64 {
                u64::MAX
            } else {
                (1u64 << (n - lo)) - 1
            };
            used += (w & mask).count_ones() as usize;
        }
        (n - used) as u16
    }

    /// The `k`-th smallest port not in the set (`k` below [`free_below`](Self::free_below)).
    fn nth_free(&self, k: u16) -> u16 {
        let mut k = u32::from(k);
        for (i, w) in self.0.iter().enumerate() {
            let free = !w;
            let c = free.count_ones();
            if k < c {
                let mut f = free;
                for _ in 0..k {
                    f &= f - 1;
                }
                return (i * 64) as u16 + f.trailing_zeros() as u16;
            }
            k -= c;
        }
        MAX_PATHS
    }
}

struct Qp {
    qpn: u32,
    pd: u32,
    send_cq: u32,
    recv_cq: u32,
    state: QpState,
    peer: Option<QpInfo>,
    initial_psn: Psn,
    // Requester.
    sq: VecDeque<SendWqe>,
    sq_base_msn: Msn,
    next_msn: Msn,
    next_ssn: Msn,
    /// Index in `sq` of the first work request with packets still to emit.
    pack_idx: usize,
    // Responder output.
    resp: VecDeque<RespJob>,
    /// How new packets are shared between `resp` and `sq` ([`crate::share`]).
    share: SendShare,
    // Reliability of what this QP sends.
    next_psn: Psn,
    snd_una: Psn,
    sent: VecDeque<SentPkt>,
    rtx: VecDeque<u32>,
    held: Vec<u32>,
    in_flight_bytes: u64,
    in_flight_pkts: u32,
    rtt: Rtt,
    rtt_hist: RttHistogram,
    rto_deadline: Option<Timestamp>,
    backoff: u32,
    /// Counted timeouts and silence since the peer was last heard from.
    retry: RetryBudget,
    /// READs and atomics sent and still awaiting their responses.
    awaited: AwaitedResponses,
    /// Placement ranges tracked over all of this QP's messages.
    ranges: RangeBudget,
    rack_ts: Timestamp,
    /// Round trip of the packet that set `rack_ts`: it includes the queueing that packets
    /// sent around the same time meet, which a smoothed RTT averages away.
    rack_rtt_ns: u64,
    /// When the reorder timer of loss detection fires.
    reorder_deadline: Option<Timestamp>,
    reo_mult: u32,
    reo_bumped_at: Timestamp,
    acks_since_spurious: u32,
    cc: Box<dyn Controller>,
    /// Per-path health, spraying weights and re-pathing (indexed by logical path).
    paths: PathSet,
    /// Logical path → device path (source port). Re-pathing moves a logical path to a
    /// fresh port.
    port_map: Vec<u16>,
    /// The ports `port_map` holds (each at most once), for finding a spare one in O(1).
    ports_used: PortSet,
    repaths: u64,
    /// CE marks the peer reported for our packets.
    ce_marks: u64,
    pacer: Pacer,
    /// When the last new packet left, and its length (see [`Qp::pace_at`]).
    last_paced: (Timestamp, u32),
    /// New packets are waiting only for the pacer (its next send time is a deadline).
    paced_out: bool,
    peer_ce_seen: CeCount,
    last_echo: (u32, u64),
    packets_sent: u64,
    retransmits: u64,
    rtos: u64,
    spurious_losses: u64,
    spurious_retransmits: u64,
    duplicates_reported: u64,
    /// Retransmitted packets (whose loss the controller heard of) acknowledged without proof
    /// of which copy arrived: the loss send times, oldest first, for duplicate flags to prove
    /// spurious (at most [`MAX_UNRESOLVED_LOSSES`]).
    unresolved_losses: VecDeque<Timestamp>,
    /// Duplicate flags expected for retransmissions already proven spurious.
    dup_expected: u32,
    /// Counters per logical path (the endpoint's `paths` sums them over QPs).
    path_stats: Vec<PathStats>,
    // Receiving the peer's packets.
    rx: RecvTracker,
    ack_pending: bool,
    /// A duplicate arrived since the last ACK was sent (reported with `FLAG_DUPLICATE`).
    dup_since_ack: bool,
    echo: Option<(u32, u64, Timestamp)>,
    ce_count: CeCount,
    naks: VecDeque<(wire::Nak, Until)>,
    /// Where a fatal refusal stopped this QP as a responder, and whether receives complete
    /// in order ([`crate::rc_order`]).
    order: RcOrder,
    /// The last NAK sent, repeated on a short timer in case it was lost.
    nak_repeat: NakRepeat,
    rq: VecDeque<RecvWqe>,
    rq_base_ssn: Msn,
    /// A work request was refused: send nothing new, fail once the earlier ones finish.
    failing: bool,
    /// Encryption of this QP's packets, if any ([`crate::seal`]).
    seal: QpSeal,
}

/// The QPs of an endpoint, in creation order (the round-robin order of transmission and the
/// order timers run in), each with its next deadline cached beside it.
///
/// Every mutable access goes through a [`QpMut`], which recomputes the QP's deadline when it
/// is dropped, so [`QpTable::next_deadline`] is a scan of cached values rather than of every
/// QP's timers, and `handle_timeout` visits only the QPs that are due. Debug builds check the
/// cache against a fresh computation on every `next_deadline`. The same drop queues the QP in
/// the ready set that `poll_transmit` serves ([`crate::ready`]).
#[derive(Default)]
struct QpTable {
    qps: Vec<Qp>,
    deadlines: Vec<Option<Timestamp>>,
    earliest: Earliest,
    index: HashMap<u32, usize>,
    ready: ReadySet,
}

/// The earliest of the cached QP deadlines, kept up to date as they change, so that
/// `handle_timeout` and `poll_timeout` need not look at every QP when none is due. A change
/// that may raise the minimum (the QP holding it moved its deadline later) marks it stale; it
/// is found again by a scan on the next `handle_timeout`.
#[derive(Copy, Clone, Debug, Default)]
struct Earliest {
    at: Option<Timestamp>,
    stale: bool,
}

impl Earliest {
    /// One QP's deadline went from `old` to `new`.
    fn changed(&mut self, old: Option<Timestamp>, new: Option<Timestamp>) {
        if self.stale || old == new {
            return;
        }
        if old.is_some() && old == self.at {
            // This QP may have held the minimum: it stays exact only if the deadline came
            // earlier.
            match (new, old) {
                (Some(n), Some(o)) if n <= o => self.at = Some(n),
                _ => self.stale = true,
            }
        } else if let Some(n) = new {
            if self.at.is_none_or(|a| n < a) {
                self.at = Some(n);
            }
        }
    }
}

/// Mutable access to one QP of a [`QpTable`]; refreshes its cached deadline when dropped, and
/// queues it as ready to send unless it came from [`QpTable::at_mut_quiet`].
struct QpMut<'a> {
    qp: &'a mut Qp,
    deadline: &'a mut Option<Timestamp>,
    earliest: &'a mut Earliest,
    ready: Option<(&'a mut ReadySet, usize)>,
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
        let new = self.qp.next_deadline();
        let old = core::mem::replace(self.deadline, new);
        self.earliest.changed(old, new);
        if let Some((ready, i)) = self.ready.take() {
            ready.push(i);
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
        let d = qp.next_deadline();
        self.earliest.changed(None, d);
        self.deadlines.push(d);
        self.qps.push(qp);
        self.ready.add_slot();
    }

    fn remove(&mut self, qpn: u32) -> Option<Qp> {
        let i = self.index.remove(&qpn)?;
        let d = self.deadlines.remove(i);
        self.earliest.changed(d, None);
        self.ready.remove_slot(i);
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
            deadline: &mut self.deadlines[i],
            earliest: &mut self.earliest,
            ready: Some((&mut self.ready, i)),
        }
    }

    /// [`at_mut`](Self::at_mut) without queueing the QP as ready: for `poll_transmit`, which
    /// queues it again only if it sent, and for sweeps that change nothing in most QPs.
    fn at_mut_quiet(&mut self, i: usize) -> QpMut<'_> {
        QpMut {
            qp: &mut self.qps[i],
            deadline: &mut self.deadlines[i],
            earliest: &mut self.earliest,
            ready: None,
        }
    }

    /// The cached deadline of the `i`-th QP.
    fn deadline(&self, i: usize) -> Option<Timestamp> {
        self.deadlines[i]
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        debug_assert!(
            self.qps
                .iter()
                .zip(&self.deadlines)
                .all(|(q, &d)| q.next_deadline() == d),
            "a QP changed without refreshing its cached deadline"
        );
        if self.earliest.stale {
            self.scan_deadlines()
        } else {
            debug_assert_eq!(self.earliest.at, self.scan_deadlines());
            self.earliest.at
        }
    }

    fn scan_deadlines(&self) -> Option<Timestamp> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// The earliest cached deadline, found again first if it went stale.
    fn earliest(&mut self) -> Option<Timestamp> {
        if self.earliest.stale {
            self.earliest = Earliest {
                at: self.scan_deadlines(),
                stale: false,
            };
        }
        self.earliest.at
    }
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
            mrs: HashMap::new(),
            rkeys: HashMap::new(),
            completions: VecDeque::new(),
            stats: EndpointStats::default(),
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
        let users = self.pds.get_mut(&pd.0).ok_or(ResourceError::UnknownPd)?;
        *users += 1;
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
        self.sh.mrs.insert(
            lkey,
            Mr {
                region,
                pd: pd.0,
                access,
                rkey,
            },
        );
        self.sh.rkeys.insert(rkey, lkey);
        Ok(MrKeys { lkey, rkey })
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
                self.qps.ready.push(i); // it has a NAK to send
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
        let qp = Qp {
            qpn,
            pd: pd.0,
            send_cq: send_cq.0,
            recv_cq: recv_cq.0,
            state: QpState::Init,
            peer: None,
            initial_psn: Psn(psn),
            sq: VecDeque::new(),
            sq_base_msn: Msn(0),
            next_msn: Msn(0),
            next_ssn: Msn(0),
            pack_idx: 0,
            resp: VecDeque::new(),
            share: SendShare::default(),
            next_psn: Psn(psn),
            snd_una: Psn(psn),
            sent: VecDeque::new(),
            rtx: VecDeque::new(),
            held: Vec::new(),
            in_flight_bytes: 0,
            in_flight_pkts: 0,
            rtt: Rtt::default(),
            rtt_hist: RttHistogram::new(),
            rto_deadline: None,
            backoff: 0,
            retry: RetryBudget::default(),
            awaited: AwaitedResponses::default(),
            ranges: RangeBudget::default(),
            rack_ts: Timestamp::ZERO,
            rack_rtt_ns: 0,
            reorder_deadline: None,
            reo_mult: 1,
            reo_bumped_at: Timestamp::ZERO,
            acks_since_spurious: 0,
            cc,
            paths: PathSet::new(self.sh.cfg.paths),
            port_map: (0..self.sh.cfg.paths).collect(),
            ports_used: PortSet::first(self.sh.cfg.paths),
            repaths: 0,
            ce_marks: 0,
            pacer: Pacer::new(),
            last_paced: (Timestamp::ZERO, 0),
            paced_out: false,
            peer_ce_seen: CeCount(0),
            last_echo: (0, 0),
            packets_sent: 0,
            retransmits: 0,
            rtos: 0,
            spurious_losses: 0,
            spurious_retransmits: 0,
            duplicates_reported: 0,
            unresolved_losses: VecDeque::new(),
            dup_expected: 0,
            path_stats: vec![PathStats::default(); usize::from(self.sh.cfg.paths)],
            rx: RecvTracker::new(0),
            ack_pending: false,
            dup_since_ack: false,
            echo: None,
            ce_count: CeCount(0),
            naks: VecDeque::new(),
            order: RcOrder::new(opts.unordered),
            nak_repeat: NakRepeat::default(),
            rq: VecDeque::new(),
            rq_base_ssn: Msn(0),
            failing: false,
            seal: QpSeal::new(opts.seal_secret),
        };
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
        qp.rx = RecvTracker::new(peer.psn);
        qp.state = QpState::Connected;
        Ok(())
    }

    /// Moves `qpn` to the error state: every outstanding work request completes as flushed.
    pub fn set_error(&mut self, qpn: u32) -> Result<(), ResourceError> {
        let mut guard = self.qps.get_mut(qpn).ok_or(ResourceError::UnknownQp)?;
        let qp = &mut *guard;
        qp.enter_error(&mut self.sh);
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
        self.qps.get(qpn).map(|q| QpStats {
            state: q.state,
            srtt_ns: q.rtt.srtt_ns,
            min_rtt_ns: q.rtt.min_ns,
            rtt: q.rtt_hist.summary(),
            rto_ns: q.rto_ns(&self.sh.cfg),
            cc: q.cc.name(),
            cwnd_bytes: q.cc.window(),
            pacing_rate: q.cc.pacing_rate(),
            ce_marks: q.ce_marks,
            repaths: q.repaths,
            path_weights: q.paths.last_weights().to_vec(),
            in_flight_bytes: q.in_flight_bytes,
            packets_sent: q.packets_sent,
            retransmits: q.retransmits,
            rtos: q.rtos,
            spurious_losses: q.spurious_losses,
            spurious_retransmits: q.spurious_retransmits,
            duplicates_reported: q.duplicates_reported,
            path_ports: q.port_map.clone(),
            paths: q.path_stats.clone(),
            outstanding_sends: q.sq.len(),
            outstanding_recvs: q.rq.len(),
        })
    }

    /// Send and receive work requests posted on `qpn` and not yet completed (what
    /// `max_send_wr` and `max_recv_wr` bound), in O(1).
    pub fn queue_depths(&self, qpn: u32) -> Option<(usize, usize)> {
        self.qps.get(qpn).map(|q| (q.sq.len(), q.rq.len()))
    }

    fn resolve(&self, pd: u32, sges: &[Sge], need: Access) -> Result<(Vec<Seg>, u32), PostError> {
        if sges.len() > MAX_SGE {
            return Err(PostError::TooManySges);
        }
        let mut total: u64 = 0;
        let mut segs = Vec::with_capacity(sges.len());
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
            (qp.pd, qp.state, qp.sq.len())
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
        let msn = qp.next_msn.get();
        qp.next_msn += 1;
        let ssn = if op.consumes_recv() {
            let s = qp.next_ssn.get();
            qp.next_ssn += 1;
            s
        } else {
            0
        };
        let len = if op.is_atomic() { 8 } else { len };
        let wqe = SendWqe::new(wr.wr_id, wr.signaled, (op, remote, imm, operands), msn, ssn);
        let wqe = SendWqe { segs, len, ..wqe };
        if state == QpState::Error {
            qp.sq_base_msn = qp.next_msn;
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
        qp.sq.push_back(wqe);
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
        let msn = qp.next_msn.get();
        qp.next_msn += 1;
        qp.sq.push_back(SendWqe {
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
        qp.rq.push_back(RecvWqe {
            wr_id,
            segs: Vec::new(),
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
            (qp.pd, qp.state, qp.rq.len())
        };
        if depth >= self.sh.cfg.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        let (segs, cap) = self.resolve(pd, &wr.sges, Access::LOCAL_WRITE)?;
        let mut guard = self.qps.get_mut(qpn).ok_or(PostError::UnknownQp)?;
        let qp = &mut *guard;
        // A responder stopped by a fatal refusal whose receives have flushed (see
        // `settle_fence`) takes no more.
        if state == QpState::Error || qp.order.fence_reached(qp.rx.cum()) {
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
        qp.rq.push_back(RecvWqe {
            wr_id: wr.wr_id,
            segs,
            cap: u64::from(cap),
            msg: None,
            placed: Coverage::default(),
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
        let ecn = Ecn::from_bits(ecn);
        self.sh.stats.rx_datagrams += 1;
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
        qp.dispatch(now, ecn, &pkt, &mut self.sh);
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
        qp.dispatch(now, ecn, &pkt, &mut self.sh);
    }

    /// Runs the timers that are due at `now`: retransmit timeouts and RNR waits.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.qps.earliest().is_none_or(|d| d > now) {
            return; // no QP is due
        }
        for i in 0..self.qps.len() {
            if self.qps.deadline(i).is_some_and(|d| d <= now) {
                self.qps.at_mut(i).on_timeout(now, &mut self.sh);
            }
        }
    }

    /// The next datagram to send, written at the start of `buf` (which must hold
    /// `config().max_datagram` bytes). QPs with work take turns, one datagram each; only QPs
    /// that had an event since they last sent are asked ([`crate::ready`]), so idle QPs cost
    /// nothing here.
    pub fn poll_transmit(&mut self, now: Timestamp, buf: &mut [u8]) -> Option<Transmit> {
        for _ in 0..self.qps.ready.len() {
            let i = self.qps.ready.pop()?;
            self.tx_visits += 1;
            let t = self
                .qps
                .at_mut_quiet(i)
                .poll_transmit(now, buf, &mut self.sh);
            if let Some(t) = t {
                // To the back: it may have more, after the others' turns.
                self.qps.ready.push(i);
                self.sh.stats.tx_datagrams += 1;
                return Some(t);
            }
        }
        None
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

impl Qp {
    /// Hands a parsed, authenticated packet from the connected peer to its handler.
    fn dispatch(&mut self, now: Timestamp, ecn: Ecn, pkt: &wire::Packet<'_>, sh: &mut Shared) {
        let h = pkt.header;
        match pkt.body {
            Body::Ack(a) => self.on_ack(now, &a, h.flags, sh),
            Body::Nak(n) => self.on_nak(now, &n, sh),
            Body::Request(r) => self.on_request(now, &h, &r, pkt.payload, ecn, sh),
            Body::ReadResponse(r) => self.on_read_response(now, &h, &r, pkt.payload, ecn, sh),
            Body::AtomicResponse(r) => self.on_atomic_response(now, &h, &r, ecn, sh),
        }
    }

    fn rto_ns(&self, cfg: &EndpointConfig) -> u64 {
        let base = if self.rtt.samples == 0 {
            cfg.rto_initial_ns
        } else {
            self.rtt.srtt_ns + (4 * self.rtt.rttvar_ns).max(10_000)
        };
        let base = base.clamp(cfg.rto_min_ns, cfg.rto_max_ns);
        (base << self.backoff.min(MAX_BACKOFF_SHIFT)).min(cfg.rto_max_ns)
    }

    fn next_deadline(&self) -> Option<Timestamp> {
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

    /// The earliest time a new packet may leave. The pacer fixed it from the controller's rate
    /// when the last packet left; the rate may have risen since, or pacing stopped (a window of
    /// a packet or more), as when acknowledgements return after an outage that had cut the rate
    /// to a trickle. So the gap after the last packet is measured again at the current rate,
    /// and the earlier time holds: a gap set by a collapsed rate must not hold back a connection
    /// that has recovered (it held a READ's responses for 0.9 s, past the requester's retry
    /// budget, in the fault matrix's loss bursts).
    fn pace_at(&self) -> Timestamp {
        let (at, len) = self.last_paced;
        let mut current = Pacer::new();
        current.on_sent(at, len, self.cc.pacing_rate());
        self.pacer.next_send_time().min(current.next_send_time())
    }

    fn sent_index(&self, psn: u32) -> Option<usize> {
        let i = Psn(psn).since(self.snd_una) as usize;
        (i < self.sent.len()).then_some(i)
    }

    fn wqe_index(&self, msn: u32) -> Option<usize> {
        let i = Msn(msn).since(self.sq_base_msn) as usize;
        (i < self.sq.len()).then_some(i)
    }

    fn header(
        &self,
        kind: wire::Kind,
        psn: u32,
        path: u8,
        now: Timestamp,
        flags: u8,
    ) -> Option<Header> {
        let peer = self.peer?;
        Some(Header {
            kind,
            path,
            flags,
            dst_qpn: peer.qpn,
            src_qpn: self.qpn,
            psn,
            send_ts_ns: now.as_nanos(),
        })
    }

    /// A path for a new packet, drawn by the paths' weights.
    fn next_path(&mut self, sh: &mut Shared) -> u8 {
        self.paths.pick(sh.rng.next_u32()) as u8
    }

    /// The datagram description for `len` bytes on logical path `path`.
    fn transmit(&self, peer: &QpInfo, len: usize, path: u8, ecn: Ecn) -> Transmit {
        let port = self.port_map.get(usize::from(path)).copied().unwrap_or(0);
        Transmit {
            dest: peer.addr,
            path: port,
            ecn: ecn.to_bits(),
            len,
        }
    }

    /// Emits the packet described by `what` with sequence number `psn`.
    fn emit(
        &self,
        what: &SentWhat,
        psn: u32,
        path: u8,
        flags: u8,
        now: Timestamp,
        buf: &mut [u8],
    ) -> Option<usize> {
        match what {
            SentWhat::Req { msn, offset, len } => {
                let w = &self.sq[self.wqe_index(*msn)?];
                let body = Body::Request(wire::Request {
                    op: w.op,
                    msn: w.msn,
                    ssn: w.ssn,
                    imm: w.imm,
                    rkey: w.remote.rkey,
                    msg_len: w.len,
                    offset: *offset,
                    remote_offset: w.remote.offset,
                });
                let h = self.header(wire::Kind::Request, psn, path, now, flags)?;
                let (plen, ops) = if w.op.is_atomic() {
                    (wire::ATOMIC_OPERANDS_LEN, Some(w.operands))
                } else if w.op.carries_data() {
                    (*len as usize, None)
                } else {
                    (0, None)
                };
                self.seal
                    .emit(buf, &h, &body, plen, |p| match ops {
                        Some((a, b)) => {
                            p[..8].copy_from_slice(&a.to_be_bytes());
                            p[8..16].copy_from_slice(&b.to_be_bytes());
                        }
                        None => gather(&w.segs, u64::from(*offset), p),
                    })
                    .ok()
            }
            SentWhat::ReadResp {
                msn,
                region,
                base,
                offset,
                len,
                msg_len,
            } => {
                let h = self.header(wire::Kind::ReadResponse, psn, path, now, flags)?;
                let body = Body::ReadResponse(wire::ReadResponse {
                    msn: *msn,
                    offset: *offset,
                    msg_len: *msg_len,
                });
                self.seal
                    .emit(buf, &h, &body, *len as usize, |p| {
                        // Bounds were checked when the READ was accepted.
                        let _ = region.read(base + u64::from(*offset), p);
                    })
                    .ok()
            }
            SentWhat::AtomicResp { msn, original } => {
                let h = self.header(wire::Kind::AtomicResponse, psn, path, now, flags)?;
                let body = Body::AtomicResponse(wire::AtomicResponse {
                    msn: *msn,
                    original: *original,
                });
                self.seal.emit(buf, &h, &body, 0, |_| {}).ok()
            }
        }
    }

    fn poll_transmit(
        &mut self,
        now: Timestamp,
        buf: &mut [u8],
        sh: &mut Shared,
    ) -> Option<Transmit> {
        let peer = self.peer?;
        let fresh = self.naks.pop_front();
        let repeat = match fresh {
            Some(_) => None,
            None => {
                let rx = &self.rx;
                self.nak_repeat
                    .take_due(now, |psn| rx.classify(psn) != Class::Duplicate)
            }
        };
        if let Some(nak) = fresh.map(|(n, _)| n).or(repeat) {
            if let Some((_, until)) = fresh {
                let wait =
                    NakRepeat::interval_ns(self.rtt.srtt_ns, self.rtt.rttvar_ns, self.rtt.samples);
                self.nak_repeat.sent(nak, until, now, wait);
            }
            let path = self.next_path(sh);
            let h = self.header(wire::Kind::Nak, 0, path, now, 0)?;
            let len = self.seal.emit(buf, &h, &Body::Nak(nak), 0, |_| {}).ok()?;
            sh.stats.naks_sent += 1;
            return Some(self.transmit(&peer, len, path, Ecn::NotEct));
        }
        // In the error state only a responder stopped by a fatal refusal acknowledges (the
        // packets before the refusal, see `after_accept`).
        if self.state != QpState::Connected && !self.ack_pending {
            return None;
        }
        if self.ack_pending {
            self.ack_pending = false;
            let (echo_psn, echo_ts, at) = self.echo.unwrap_or((0, 0, now));
            let ack = wire::Ack {
                cum_psn: self.rx.cum(),
                echo_psn,
                echo_ts_ns: echo_ts,
                hold_ns: u32::try_from(now.nanos_since(at)).unwrap_or(u32::MAX),
                ce_count: self.ce_count.get(),
                sack: self.rx.sack(),
            };
            let path = self.next_path(sh);
            let flags = if self.dup_since_ack {
                wire::FLAG_DUPLICATE
            } else {
                0
            };
            self.dup_since_ack = false;
            let h = self.header(wire::Kind::Ack, 0, path, now, flags)?;
            let len = self.seal.emit(buf, &h, &Body::Ack(ack), 0, |_| {}).ok()?;
            return Some(self.transmit(&peer, len, path, Ecn::NotEct));
        }
        // Retransmissions first: they are not limited by the window.
        while let Some(psn) = self.rtx.pop_front() {
            let Some(i) = self.sent_index(psn) else {
                continue;
            };
            if self.sent[i].acked || !self.sent[i].lost {
                continue;
            }
            if let SentWhat::Req { msn, .. } = self.sent[i].what
                && self.wqe_index(msn).is_none()
            {
                // Its work request completed (a READ or atomic answered): nothing to resend.
                self.sent[i].acked = true;
                self.sent[i].lost = false;
                continue;
            }
            let path = self
                .paths
                .pick_other(u16::from(self.sent[i].path), sh.rng.next_u32())
                as u8;
            let Some(len) = self.emit(
                &self.sent[i].what,
                psn,
                path,
                wire::FLAG_RETRANSMIT,
                now,
                buf,
            ) else {
                continue;
            };
            let p = &mut self.sent[i];
            p.lost = false;
            p.retransmitted = true;
            p.send_ts = now;
            p.path = path;
            p.wire_len = len as u32;
            self.in_flight_bytes += len as u64;
            self.in_flight_pkts += 1;
            self.retransmits += 1;
            sh.stats.retransmits += 1;
            for ps in [
                &mut sh.paths[usize::from(path)],
                &mut self.path_stats[usize::from(path)],
            ] {
                ps.packets += 1;
                ps.retransmits += 1;
            }
            self.paths.on_sent(u16::from(path), now);
            self.cc.on_sent(now, len as u32, psn);
            if self.rto_deadline.is_none() {
                self.rto_deadline = Some(now.add_nanos(self.rto_ns(&sh.cfg)));
            }
            return Some(self.transmit(&peer, len, path, Ecn::Ect0));
        }
        // New packets, within the SACK span, the window and the pacing rate.
        self.paced_out = false;
        let span = self.next_psn.since(self.snd_una);
        if span >= wire::SACK_BITS {
            return None;
        }
        if self.in_flight_bytes > 0
            && self.in_flight_bytes + sh.cfg.max_datagram as u64 > self.cc.window()
        {
            return None;
        }
        if !self.has_new_work() {
            return None;
        }
        if now < self.pace_at() {
            self.paced_out = true;
            return None;
        }
        let what = self.next_new_packet(sh)?;
        let psn = self.next_psn.get();
        let path = self.next_path(sh);
        let len = self.emit(&what, psn, path, 0, now, buf)?;
        self.next_psn += 1;
        self.sent.push_back(SentPkt {
            psn,
            what,
            send_ts: now,
            path,
            wire_len: len as u32,
            acked: false,
            lost: false,
            retransmitted: false,
            first_path: path,
            first_ts: now,
            hold_until: Timestamp::ZERO,
            cc_loss_ts: None,
        });
        self.in_flight_bytes += len as u64;
        self.in_flight_pkts += 1;
        self.packets_sent += 1;
        sh.paths[usize::from(path)].packets += 1;
        self.path_stats[usize::from(path)].packets += 1;
        self.paths.on_sent(u16::from(path), now);
        self.cc.on_sent(now, len as u32, psn);
        if !self.pacer.can_send(now) {
            // Sent ahead of a gap set by a lower rate (see `pace_at`): that schedule is stale.
            self.pacer = Pacer::new();
        }
        self.pacer.on_sent(now, len as u32, self.cc.pacing_rate());
        self.last_paced = (now, len as u32);
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now.add_nanos(self.rto_ns(&sh.cfg)));
        }
        Some(self.transmit(&peer, len, path, Ecn::Ect0))
    }

    /// Whether responses or requests still have packets to emit for the first time.
    fn has_new_work(&self) -> bool {
        !self.resp.is_empty() || self.pack_idx < self.sq.len()
    }

    /// Takes the next packet's worth of new work: a response or a request, as the deficit
    /// round robin of [`crate::share`] picks.
    fn next_new_packet(&mut self, sh: &Shared) -> Option<SentWhat> {
        let resp_len = self.resp.front().map(|job| match job {
            RespJob::Read {
                msg_len,
                next_offset,
                ..
            } => (*msg_len - *next_offset).min(sh.resp_chunk - self.seal.overhead()),
            RespJob::Atomic { .. } => 0,
        });
        let req_len = match self.sq.get(self.pack_idx) {
            // Queued already failed (`post_send_or_fail`): never sent; it fails the QP when
            // it reaches the front.
            Some(w) if !self.failing && w.status.is_none() => Some(if w.op.carries_data() {
                (w.len - w.next_offset).min(sh.req_chunk - self.seal.overhead())
            } else {
                0
            }),
            _ => None,
        };
        if self.share.pick(resp_len, req_len)? == Turn::Response
            && let Some(job) = self.resp.front_mut()
        {
            match job {
                RespJob::Read {
                    msn,
                    region,
                    base,
                    msg_len,
                    next_offset,
                } => {
                    let offset = *next_offset;
                    let len = (*msg_len - offset).min(sh.resp_chunk - self.seal.overhead());
                    let what = SentWhat::ReadResp {
                        msn: *msn,
                        region: region.clone(),
                        base: *base,
                        offset,
                        len,
                        msg_len: *msg_len,
                    };
                    *next_offset = offset + len;
                    if *next_offset >= *msg_len {
                        self.resp.pop_front();
                    }
                    return Some(what);
                }
                RespJob::Atomic { msn, original } => {
                    let what = SentWhat::AtomicResp {
                        msn: *msn,
                        original: *original,
                    };
                    self.resp.pop_front();
                    return Some(what);
                }
            }
        }
        if self.failing {
            return None;
        }
        let w = self.sq.get_mut(self.pack_idx)?;
        if w.status.is_some() {
            // Queued already failed (`post_send_or_fail`): never sent; it fails the QP when
            // it reaches the front.
            return None;
        }
        let offset = w.next_offset;
        let len = if w.op.carries_data() {
            (w.len - offset).min(sh.req_chunk - self.seal.overhead())
        } else {
            0
        };
        w.next_offset = offset + len;
        w.unacked_pkts += 1;
        if w.next_offset >= w.len || !w.op.carries_data() {
            w.packetized = true;
            if w.awaits_response() {
                self.awaited.started();
            }
            self.pack_idx += 1;
        }
        Some(SentWhat::Req {
            msn: w.msn,
            offset,
            len,
        })
    }

    /// Records a newly accepted packet of the peer's for acknowledgement.
    fn accepted(&mut self, now: Timestamp, h: &Header, ecn: Ecn) {
        self.rx.accept(h.psn);
        self.ack_pending = true;
        self.echo = Some((h.psn, h.send_ts_ns, now));
        if ecn.is_ce() {
            self.ce_count += 1;
        }
        self.made_progress();
    }

    fn made_progress(&mut self) {
        self.retry.heard();
        self.backoff = 0;
    }

    /// Classifies a sequenced packet from the peer; true if it is new and should be processed.
    fn admit(&mut self, h: &Header, sh: &mut Shared) -> bool {
        match self.rx.classify(h.psn) {
            Class::New => true,
            Class::Duplicate => {
                sh.stats.rx_duplicates += 1;
                self.ack_pending = true;
                self.dup_since_ack = true;
                false
            }
            Class::OutOfWindow => {
                sh.stats.rx_out_of_window += 1;
                false
            }
        }
    }

    fn nak(&mut self, h: &Header, msn: u32, syndrome: Syndrome) {
        if self.naks.len() < MAX_PENDING_NAKS {
            let nak = wire::Nak {
                psn: h.psn,
                msn,
                syndrome,
            };
            self.naks.push_back((nak, Until::Accepted));
        }
    }

    fn on_request(
        &mut self,
        now: Timestamp,
        h: &Header,
        r: &wire::Request,
        payload: &[u8],
        ecn: Ecn,
        sh: &mut Shared,
    ) {
        if let Some(f) = self.order.fence
            && f.stops(h.psn)
        {
            // At or after a fatal refusal: never executed, refused the same way (a lost NAK
            // is answered again when the requester retransmits).
            self.nak(h, r.msn, f.syndrome);
            return;
        }
        if self.state == QpState::Error {
            if self.order.fence.is_some() {
                // Before the fence: every such packet arrived before the QP failed, so this
                // is a duplicate whose acknowledgement may have been lost.
                self.ack_pending = true;
            } else {
                self.nak(h, r.msn, Syndrome::RemoteOperation);
            }
            return;
        }
        if !self.admit(h, sh) {
            return;
        }
        match self.execute(h.psn, r, payload, sh) {
            Ok(()) => self.accepted(now, h, ecn),
            Err(Some(Syndrome::ReceiverNotReady)) => self.nak(h, r.msn, Syndrome::ReceiverNotReady),
            Err(Some(syndrome)) => {
                // Fatal: the responder stops at this packet ([`crate::rc_order`]), and this
                // QP sends no new request of its own (they flush when it fails).
                self.nak(h, r.msn, syndrome);
                self.order.refuse(h.psn, r.msn, syndrome);
                self.failing = true;
            }
            Err(None) => sh.stats.rx_bad_response += 1,
        }
        self.after_accept(sh);
    }

    /// After a packet of the peer's was accepted or refused: completes the receives that may
    /// complete now and, once every packet before a fatal refusal has arrived, moves the QP
    /// to the error state (its receives flush; the last acknowledgement still goes out, so the
    /// requester learns that the requests before the refusal arrived).
    fn after_accept(&mut self, sh: &mut Shared) {
        self.complete_rq(sh);
        self.settle_fence(sh);
    }

    /// Moves a responder stopped by a fatal refusal to the error state once every packet
    /// before the refusal has arrived and every response to them (READ data, atomic results)
    /// has been acknowledged or given up by the requester: a READ posted before the refused
    /// request still gets its data. The last acknowledgement still goes out.
    fn settle_fence(&mut self, sh: &mut Shared) {
        if self.state != QpState::Connected || !self.order.fence_reached(self.rx.cum()) {
            return;
        }
        // Every receive before the fence has completed: the rest flush now, before this side
        // acknowledges the last packet before the refusal (so before the requester can
        // report the refusal).
        self.flush_rq(sh);
        // Only while fenced (rare): a scan of what is in flight.
        let delivered = self.resp.is_empty()
            && self
                .sent
                .iter()
                .all(|p| p.acked || matches!(p.what, SentWhat::Req { .. }));
        if delivered {
            let ack = self.ack_pending;
            self.enter_error(sh);
            self.ack_pending = ack;
        }
    }

    /// Executes one request packet. `Err(Some)` refuses it with a NAK, `Err(None)` drops it
    /// silently (an inconsistent peer).
    fn execute(
        &mut self,
        psn: u32,
        r: &wire::Request,
        payload: &[u8],
        sh: &mut Shared,
    ) -> Result<(), Option<Syndrome>> {
        let plen = payload.len() as u64;
        let recv_idx = if r.op.consumes_recv() {
            let ssn = Msn(r.ssn);
            if !ssn.ge(self.rq_base_ssn) {
                return Err(None); // a message that already completed
            }
            let i = ssn.since(self.rq_base_ssn) as usize;
            if i >= self.rq.len() {
                return Err(Some(Syndrome::ReceiverNotReady));
            }
            let w = &self.rq[i];
            if let Some((op, len)) = w.msg
                && (op != r.op || len != r.msg_len)
            {
                return Err(None);
            }
            // A peer scattering a message into more pieces than any window could is refused
            // before it writes anything.
            if !self.ranges.admits(&w.placed, u64::from(r.offset), plen) {
                return Err(None);
            }
            Some(i)
        } else {
            None
        };
        match r.op {
            Op::Write | Op::WriteImm => {
                let region = sh
                    .remote_region(
                        self.pd,
                        r.rkey,
                        Access::REMOTE_WRITE,
                        r.remote_offset,
                        u64::from(r.msg_len),
                    )
                    .map_err(Some)?;
                region
                    .write(r.remote_offset + u64::from(r.offset), payload)
                    .map_err(|_| Some(Syndrome::RemoteAccess))?;
            }
            Op::Send | Op::SendImm => {
                let i = recv_idx.unwrap_or(0);
                if u64::from(r.msg_len) > self.rq[i].cap {
                    // A fatal refusal (the QP fails once the packets before it arrived);
                    // receives complete in posting order: this one with the length error,
                    // the ones after it as flushed.
                    self.rq[i].msg = Some((r.op, r.msg_len));
                    self.rq[i].error = Some(WcStatus::LocalLengthError);
                    return Err(Some(Syndrome::InvalidRequest));
                }
                if !scatter(&self.rq[i].segs, u64::from(r.offset), payload) {
                    return Err(Some(Syndrome::InvalidRequest));
                }
            }
            Op::Read => {
                sh.remote_region(
                    self.pd,
                    r.rkey,
                    Access::REMOTE_READ,
                    r.remote_offset,
                    u64::from(r.msg_len),
                )
                .map_err(Some)
                .map(|region| {
                    self.resp.push_back(RespJob::Read {
                        msn: r.msn,
                        region,
                        base: r.remote_offset,
                        msg_len: r.msg_len,
                        next_offset: 0,
                    })
                })?;
                if self.resp.len() > MAX_RESPONSE_JOBS {
                    self.resp.pop_back();
                    return Err(Some(Syndrome::ReceiverNotReady));
                }
            }
            Op::FetchAdd | Op::CompareSwap => {
                if self.resp.len() >= MAX_RESPONSE_JOBS {
                    return Err(Some(Syndrome::ReceiverNotReady));
                }
                if !r.remote_offset.is_multiple_of(8) {
                    return Err(Some(Syndrome::InvalidRequest));
                }
                let region = sh
                    .remote_region(self.pd, r.rkey, Access::REMOTE_ATOMIC, r.remote_offset, 8)
                    .map_err(Some)?;
                let mut a = [0u8; 8];
                let mut b = [0u8; 8];
                a.copy_from_slice(payload.get(..8).ok_or(None)?);
                b.copy_from_slice(payload.get(8..16).ok_or(None)?);
                let (a, b) = (u64::from_be_bytes(a), u64::from_be_bytes(b));
                let original = if r.op == Op::FetchAdd {
                    region.fetch_add(r.remote_offset, a)
                } else {
                    region.compare_swap(r.remote_offset, b, a)
                }
                .map_err(|_| Some(Syndrome::InvalidRequest))?;
                self.resp.push_back(RespJob::Atomic {
                    msn: r.msn,
                    original,
                });
            }
        }
        if let Some(i) = recv_idx {
            let w = &mut self.rq[i];
            w.msg = Some((r.op, r.msg_len));
            // Cannot fail: `admits` was checked before placing (parsing bounded the range).
            let _ = self.ranges.insert(&mut w.placed, u64::from(r.offset), plen);
            if matches!(r.op, Op::SendImm | Op::WriteImm) {
                w.imm = Some(r.imm);
            }
            if w.last_psn
                .is_none_or(|l| crate::rc_order::psn_before(l, psn))
            {
                w.last_psn = Some(psn);
            }
            if w.placed.covered() >= u64::from(r.msg_len) {
                w.done = true;
            }
        }
        Ok(())
    }

    /// Completes receives from the front of the queue, in posting order; in ordered mode only
    /// once every packet up to the last of their message has arrived.
    fn complete_rq(&mut self, sh: &mut Shared) {
        let cum = self.rx.cum();
        while self
            .rq
            .front()
            .is_some_and(|w| w.done && w.last_psn.is_some_and(|l| self.order.may_complete(l, cum)))
        {
            let Some(w) = self.rq.pop_front() else { break };
            self.ranges.release(&w.placed);
            self.rq_base_ssn += 1;
            let (op, len) = w.msg.unwrap_or((Op::Send, 0));
            let opcode = if op == Op::WriteImm {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            };
            sh.complete(
                self.recv_cq,
                Completion {
                    wr_id: w.wr_id,
                    status: WcStatus::Success,
                    opcode,
                    byte_len: len,
                    imm: w.imm,
                    qpn: self.qpn,
                },
            );
        }
    }

    /// Completes send work requests from the front of the queue, in posting order.
    /// Once a refused work request (see `on_nak`) reaches the front, the QP fails.
    fn complete_sq(&mut self, sh: &mut Shared) {
        while self
            .sq
            .front()
            .is_some_and(|w| w.status.is_none() && w.is_done())
        {
            let Some(w) = self.sq.pop_front() else { break };
            self.ranges.release(&w.read_placed);
            self.sq_base_msn += 1;
            self.pack_idx = self.pack_idx.saturating_sub(1);
            if w.signaled {
                sh.complete(
                    self.send_cq,
                    Completion {
                        wr_id: w.wr_id,
                        status: WcStatus::Success,
                        opcode: w.opcode(),
                        byte_len: w.len,
                        imm: None,
                        qpn: self.qpn,
                    },
                );
            }
        }
        if self.sq.front().is_some_and(|w| w.status.is_some()) && self.refusal_settled() {
            self.enter_error(sh);
        }
    }

    /// Whether every packet sent before the earliest one the peer refused for good has been
    /// acknowledged (true without a refusal). Until then those packets are still repaired:
    /// the responder executes them and fails only once it has them all.
    fn refusal_settled(&self) -> bool {
        let Some(psn) = self.order.refused_psn else {
            return true;
        };
        // A request packet also counts once its work request is done (a READ or atomic
        // answered: the request arrived, though its acknowledgement may not have); responses
        // to the peer's requests do not hold this QP's failure back.
        let settled = |p: &SentPkt| match p.what {
            SentWhat::Req { msn, .. } => {
                p.acked || self.wqe_index(msn).is_none_or(|w| self.sq[w].is_done())
            }
            _ => true,
        };
        match self.sent_index(psn) {
            Some(i) => self.sent.iter().take(i).all(settled),
            None => true,
        }
    }

    fn on_read_response(
        &mut self,
        now: Timestamp,
        h: &Header,
        r: &wire::ReadResponse,
        payload: &[u8],
        ecn: Ecn,
        sh: &mut Shared,
    ) {
        if self.state != QpState::Connected {
            self.nak(h, r.msn, Syndrome::RemoteOperation);
            return;
        }
        if !self.admit(h, sh) {
            return;
        }
        let ok = self.wqe_index(r.msn).is_some_and(|i| {
            let w = &mut self.sq[i];
            if w.op != Op::Read || w.len != r.msg_len || !w.packetized || w.is_done() {
                return false;
            }
            // Parsing bounded offset + length by the message length, which matches ours.
            let (off, len) = (u64::from(r.offset), payload.len() as u64);
            if !self.ranges.admits(&w.read_placed, off, len) || !scatter(&w.segs, off, payload) {
                return false;
            }
            let _ = self.ranges.insert(&mut w.read_placed, off, len);
            w.got_resp = true;
            if w.is_done() {
                self.awaited.answered();
            }
            true
        });
        if !ok {
            sh.stats.rx_bad_response += 1;
            return;
        }
        self.accepted(now, h, ecn);
        self.after_accept(sh);
        self.complete_sq(sh);
        self.rearm_rto(now, sh);
    }

    fn on_atomic_response(
        &mut self,
        now: Timestamp,
        h: &Header,
        r: &wire::AtomicResponse,
        ecn: Ecn,
        sh: &mut Shared,
    ) {
        if self.state != QpState::Connected {
            self.nak(h, r.msn, Syndrome::RemoteOperation);
            return;
        }
        if !self.admit(h, sh) {
            return;
        }
        let ok = self.wqe_index(r.msn).is_some_and(|i| {
            let w = &mut self.sq[i];
            if !w.op.is_atomic() || !w.packetized || w.atomic_result.is_some() {
                return false;
            }
            w.atomic_result = Some(r.original);
            self.awaited.answered();
            scatter(&w.segs, 0, &r.original.to_ne_bytes())
        });
        if !ok {
            sh.stats.rx_bad_response += 1;
            return;
        }
        self.accepted(now, h, ecn);
        self.after_accept(sh);
        self.complete_sq(sh);
        self.rearm_rto(now, sh);
    }

    /// Bookkeeping for one packet newly acknowledged.
    /// `echo_ts_ns` is the send time of the newest packet the peer accepted, from the ACK
    /// (`u64::MAX` when unknown, as for a NAK).
    fn packet_acked(&mut self, i: usize, now: Timestamp, fb: &mut AckFeedback) {
        let echo_ts_ns = fb.echo_ts_ns;
        let p = &mut self.sent[i];
        if p.acked {
            return;
        }
        p.acked = true;
        if !p.lost {
            self.in_flight_bytes = self.in_flight_bytes.saturating_sub(u64::from(p.wire_len));
            self.in_flight_pkts = self.in_flight_pkts.saturating_sub(1);
        }
        // Was the retransmission what arrived, or an earlier copy? The peer echoes the send
        // time of the newest packet it accepted, and it never accepts a duplicate: an echo
        // older than the retransmission, or an acknowledgement sooner than any round trip
        // after it, means an earlier copy arrived (the loss was spurious, as Eifel detects for
        // TCP). The retransmission time then says nothing about what was delivered, so it must
        // not advance the RACK time, or everything sent before it would look lost.
        let ambiguous = p.retransmitted
            && (echo_ts_ns < p.send_ts.as_nanos() || now.nanos_since(p.send_ts) < self.rtt.min_ns);
        let spurious = p.lost || ambiguous;
        self.spurious_losses += u64::from(p.lost);
        self.spurious_retransmits += u64::from(ambiguous);
        p.lost = false;
        // The controller heard of this packet's loss; the original arrived after all, so the
        // decrease it caused may be undone.
        let cc_loss_ts = p.cc_loss_ts.take();
        let undo = cc_loss_ts.filter(|_| spurious);
        if p.retransmitted && cc_loss_ts.is_some() {
            if ambiguous {
                // The retransmission will reach the peer as a duplicate: its flag is expected.
                self.dup_expected = self.dup_expected.saturating_add(1);
            } else if !spurious {
                // Which copy arrived is unknown: a later duplicate flag may tell.
                if self.unresolved_losses.len() == MAX_UNRESOLVED_LOSSES {
                    self.unresolved_losses.pop_front();
                }
                self.unresolved_losses.extend(cc_loss_ts);
            }
        }
        if !ambiguous && p.send_ts >= self.rack_ts {
            self.rack_ts = p.send_ts;
            self.rack_rtt_ns = now.nanos_since(p.send_ts);
        }
        let (send_ts, wire_len) = (p.send_ts, p.wire_len);
        let (psn, path) = (p.psn, u16::from(p.path));
        if let Some(lost_sent_at) = undo {
            self.cc.on_spurious_loss(now, lost_sent_at);
        }
        if spurious {
            self.widen_reorder_window(now);
        } else {
            self.acks_since_spurious += 1;
            if self.acks_since_spurious >= REO_DECAY_ACKS {
                self.acks_since_spurious = 0;
                self.reo_mult = (self.reo_mult / 2).max(1);
            }
        }
        // Path scoring hears about every packet; the echoed one carries the measurements.
        let mut sample = AckSample::new(send_ts, wire_len);
        sample.path = path;
        if psn == fb.echo_psn && fb.rtt_ns.is_some() && fb.echo_latest {
            sample.rtt_ns = fb.rtt_ns;
            sample.fabric_delay_ns = fb.fabric_ns;
            sample.ecn_ce = Some(fb.ce);
        }
        self.paths.on_ack(now, &sample);
        if psn == fb.echo_psn && fb.echo_known && !fb.echo_latest && fb.rtt_ns.is_some() {
            // The echo measured an earlier copy, on the path it left on.
            let mut late = AckSample::new(Timestamp::from_nanos(fb.echo_ts_ns), wire_len);
            late.path = u16::from(fb.echo_path);
            late.rtt_ns = fb.rtt_ns;
            late.fabric_delay_ns = fb.fabric_ns;
            late.ecn_ce = Some(fb.ce);
            self.paths.on_late_copy(now, &late);
        }
        // The controller gets the frame's delay once, seen through the connection-wide
        // signal: one slow path alone does not shrink the window.
        let mut sample = AckSample::new(send_ts, wire_len);
        sample.path = path;
        if !fb.delay_given
            && fb.echo_known
            && let (Some(rtt), Some(fabric)) = (fb.rtt_ns, fb.fabric_ns)
        {
            sample.rtt_ns = Some(rtt);
            sample.fabric_delay_ns =
                Some(self.paths.cc_delay_ns(now, u16::from(fb.echo_path), fabric));
            // Marked: the delay includes a queue, and must not become the base delay.
            sample.ecn_ce = Some(fb.ce);
            fb.delay_given = true;
        }
        self.cc.on_ack_with(now, &sample);
        if let SentWhat::Req { msn, .. } = self.sent[i].what
            && let Some(w) = self.wqe_index(msn)
        {
            let w = &mut self.sq[w];
            w.unacked_pkts = w.unacked_pkts.saturating_sub(1);
        }
    }

    fn on_ack(&mut self, now: Timestamp, a: &wire::Ack, flags: u8, sh: &mut Shared) {
        if self.state != QpState::Connected {
            return;
        }
        let dup_flag = flags & wire::FLAG_DUPLICATE != 0;
        if dup_flag {
            self.duplicates_reported += 1;
            self.widen_reorder_window(now);
        }
        // The cumulative point must lie within what was sent. One behind `snd_una` is an
        // older ACK overtaken by a newer one (normal with spraying): its SACK bits still count.
        let cum = Psn(a.cum_psn);
        let adv = if cum.le(self.snd_una) {
            0 // stale
        } else {
            cum.since(self.snd_una)
        };
        if adv > self.next_psn.since(self.snd_una) {
            sh.stats.rx_bad_response += 1;
            return;
        }
        // Any consistent ACK, even one that acknowledges nothing new (the answer to a probe
        // that arrived as a duplicate), shows the peer alive: the retry budget starts over.
        self.retry.heard();
        let mut fb = AckFeedback {
            echo_ts_ns: a.echo_ts_ns,
            echo_psn: a.echo_psn,
            ..AckFeedback::NONE
        };
        // ECN echo: new CE marks since the last ACK (a wrapping counter).
        let peer_ce = CeCount(a.ce_count);
        let mut ce_new = 0;
        if self.peer_ce_seen.lt(peer_ce) {
            let ce = peer_ce.since(self.peer_ce_seen);
            self.peer_ce_seen = peer_ce;
            self.ce_marks += u64::from(ce);
            ce_new = ce;
            fb.ce = true;
        }
        // RTT from the echoed timestamp, minus the receiver's holding time.
        if (a.echo_psn, a.echo_ts_ns) != self.last_echo
            && a.echo_ts_ns != 0
            && a.echo_ts_ns <= now.as_nanos()
        {
            self.last_echo = (a.echo_psn, a.echo_ts_ns);
            let full = (now.as_nanos() - a.echo_ts_ns).max(1);
            let rtt = full.saturating_sub(u64::from(a.hold_ns)).max(1);
            self.rtt.sample(rtt);
            self.rtt_hist.record(rtt);
            sh.rtt_hist.record(rtt);
            fb.rtt_ns = Some(full);
            fb.fabric_ns = Some(rtt);
            // Which copy the echo measured: a packet declared lost and sent again on another
            // path may still arrive first through the slow path it left on. Its delay belongs
            // to that path, not to the retransmission's, or one slow path's queue shows up on
            // the fast paths (and in the controller) every time it causes a spurious loss.
            let copy = self.sent_index(a.echo_psn).and_then(|i| {
                let p = &self.sent[i];
                if a.echo_ts_ns == p.send_ts.as_nanos() {
                    Some((p.path, true))
                } else if a.echo_ts_ns == p.first_ts.as_nanos() {
                    Some((p.first_path, false))
                } else {
                    None
                }
            });
            fb.echo_path = copy.map_or(0, |c| c.0);
            fb.echo_known = copy.is_some();
            fb.echo_latest = copy.is_some_and(|c| c.1);
            if let Some((path, _)) = copy {
                let path = usize::from(path);
                for ps in [&mut sh.paths[path], &mut self.path_stats[path]] {
                    ps.srtt_ns = if ps.rtt_samples == 0 {
                        rtt
                    } else {
                        (7 * ps.srtt_ns + rtt) / 8
                    };
                    ps.rtt_samples += 1;
                }
            }
        }
        // New CE marks are charged to the echoed packet's path: the ACK carries one counter,
        // and the echoed packet is the newest one it reports on.
        if ce_new != 0
            && let Some(i) = self.sent_index(a.echo_psn)
        {
            let path = usize::from(self.sent[i].path);
            for ps in [&mut sh.paths[path], &mut self.path_stats[path]] {
                ps.ce_marks += u64::from(ce_new);
            }
        }
        let mut newest = None;
        for i in 0..(adv as usize).min(self.sent.len()) {
            if !self.sent[i].acked {
                self.packet_acked(i, now, &mut fb);
                newest = Some(i);
            }
        }
        // Only the set bits of the SACK map, a word at a time (same order as bit by bit).
        for (k, chunk) in a.sack.chunks_exact(8).enumerate() {
            let mut word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            while word != 0 {
                let bit = 64 * k as u32 + word.trailing_zeros();
                word &= word - 1;
                let psn = (Psn(a.cum_psn) + 1 + bit).get();
                if let Some(i) = self.sent_index(psn)
                    && !self.sent[i].acked
                {
                    self.packet_acked(i, now, &mut fb);
                    newest = Some(i);
                }
            }
        }
        if dup_flag {
            self.duplicate_proves_spurious(now);
        }
        if fb.ce && !self.paths.is_outlier(u16::from(fb.echo_path)) {
            self.cc.on_congestion_event(now, now, true, 0);
        }
        self.paths.set_delay_target_ns(self.cc.target_delay_ns());
        // PLB: a path kept looking congested; move it to a source port no other path of this
        // QP uses (the device has `cfg.ports` of them, by default more than the paths).
        // Sharing a port would only concentrate traffic (and could leave a route unused), so
        // without a spare port the path stays where it is, and keeps its statistics (taking
        // the re-path would reset them and make the bad path look new).
        let ports = sh.cfg.ports;
        if self.ports_used.free_below(ports) == 0 {
            self.paths.drop_repaths();
        }
        while let Some(path) = self.paths.take_repath() {
            let spare = self.ports_used.free_below(ports);
            if spare == 0 {
                continue;
            }
            let k = (sh.rng.next_u32() as usize) % usize::from(spare);
            let port = self.ports_used.nth_free(k as u16);
            if let Some(slot) = self.port_map.get_mut(usize::from(path)) {
                self.ports_used.remove(*slot);
                self.ports_used.insert(port);
                *slot = port;
                self.repaths += 1;
            }
        }
        while self.sent.front().is_some_and(|p| p.acked) {
            self.sent.pop_front();
            self.snd_una += 1;
        }
        if newest.is_some() {
            self.made_progress();
            self.detect_losses(now, sh);
            self.rearm_rto(now, sh);
        }
        self.complete_sq(sh);
        if self.in_flight_pkts == 0 && !self.has_new_work() {
            self.cc.on_idle(now);
        }
        self.settle_fence(sh);
    }

    /// Time-based loss detection (RACK): a packet sent a reordering window before the newest
    /// delivered one is lost; so is one sent before it that stays unacknowledged a round trip
    /// plus the reordering window after it left (the reorder timer, which catches losses at
    /// the tail of a burst without waiting for the retransmit timeout). With spraying,
    /// reordering is normal, so counting duplicate ACKs would be wrong.
    fn detect_losses(&mut self, now: Timestamp, sh: &mut Shared) {
        let reo = self.reorder_window_ns(&sh.cfg);
        let rack = self.rack_ts.as_nanos();
        // Datagrams stamped together leave and land over tens of microseconds (one stamp per
        // batch, then a batched send and a batched receive), so the reorder timer waits at
        // least a smoothed RTT plus four deviations, not only the last packet's RTT.
        let wait = self
            .rack_rtt_ns
            .max(self.rtt.srtt_ns + 4 * self.rtt.rttvar_ns)
            + reo;
        let mut next: Option<u64> = None;
        for i in 0..self.sent.len() {
            let p = &mut self.sent[i];
            let sent = p.send_ts.as_nanos();
            if p.acked || p.lost || sent > rack {
                continue;
            }
            if sent + reo >= rack && sent + wait > now.as_nanos() {
                next = Some(next.map_or(sent + wait, |n| n.min(sent + wait)));
                continue;
            }
            p.lost = true;
            let (psn, path, len, ts) = (p.psn, p.path, p.wire_len, p.send_ts);
            self.in_flight_bytes = self.in_flight_bytes.saturating_sub(u64::from(len));
            self.in_flight_pkts = self.in_flight_pkts.saturating_sub(1);
            self.rtx.push_back(psn);
            sh.paths[usize::from(path)].lost += 1;
            self.path_stats[usize::from(path)].lost += 1;
            self.paths.on_loss(now, u16::from(path), ts);
            if !self.paths.is_outlier(u16::from(path)) {
                self.sent[i].cc_loss_ts = Some(ts);
                self.cc.on_congestion_event(now, ts, false, len);
            }
        }
        self.reorder_deadline = next.map(Timestamp::from_nanos);
    }

    /// The peer flagged a duplicate: one retransmission was unnecessary. Unless it is the one
    /// of a packet already proven spurious by the echoed timestamp, it is charged to the oldest
    /// retransmitted packet acknowledged without saying which copy arrived, and the
    /// controller may undo that loss. (A copy the network duplicated looks the same to the
    /// peer; that is the price of a flag that names no packet.)
    fn duplicate_proves_spurious(&mut self, now: Timestamp) {
        if self.dup_expected > 0 {
            self.dup_expected -= 1;
        } else if let Some(lost_sent_at) = self.unresolved_losses.pop_front() {
            self.spurious_retransmits += 1;
            self.cc.on_spurious_loss(now, lost_sent_at);
        }
    }

    /// A loss proved spurious (the peer saw a duplicate, or an acknowledgement came for the
    /// copy before a retransmission): doubles the reordering window, at most once per RTT.
    fn widen_reorder_window(&mut self, now: Timestamp) {
        self.acks_since_spurious = 0;
        if now >= self.reo_bumped_at.add_nanos(self.rtt.srtt_ns) {
            self.reo_mult = (self.reo_mult * 2).min(REO_MULT_MAX);
            self.reo_bumped_at = now;
        }
    }

    /// How much later than a delivered packet an undelivered one may still arrive: a quarter
    /// of the minimum RTT, scaled up while losses keep proving spurious, and never more than
    /// the larger of the RTT's smoothed value plus four deviations and the RTO floor (a
    /// software stack on busy cores reorders by scheduling delays, not only by paths).
    fn reorder_window_ns(&self, cfg: &EndpointConfig) -> u64 {
        let cap = (self.rtt.srtt_ns + 4 * self.rtt.rttvar_ns).max(cfg.rto_min_ns);
        (self.rtt.min_ns / 4 * u64::from(self.reo_mult))
            .max(REO_WND_MIN_NS)
            .min(cap)
    }

    fn rearm_rto(&mut self, now: Timestamp, sh: &Shared) {
        let waiting = self.awaits_response();
        self.rto_deadline =
            (self.in_flight_pkts > 0 || waiting).then(|| now.add_nanos(self.rto_ns(&sh.cfg)));
    }

    /// Whether a READ or atomic still awaits its response: O(1) from the count kept as they
    /// are sent and answered; debug builds check it against a scan of the send queue.
    fn awaits_response(&self) -> bool {
        debug_assert_eq!(
            self.awaited.count(),
            self.sq.iter().filter(|w| w.awaits_response()).count(),
            "awaited-response count out of step with the send queue"
        );
        self.awaited.any()
    }

    fn on_nak(&mut self, now: Timestamp, n: &wire::Nak, sh: &mut Shared) {
        sh.stats.naks_received += 1;
        if self.state != QpState::Connected || self.refused_after_acceptance(n, sh) {
            return;
        }
        let Some(i) = self.sent_index(n.psn) else {
            return;
        };
        if self.sent[i].acked {
            return;
        }
        let msn = match self.sent[i].what {
            SentWhat::Req { msn, .. } if msn == n.msn => msn,
            SentWhat::ReadResp { .. } | SentWhat::AtomicResp { .. } => {
                // The requester gave up on this response: stop sending it.
                let mut none = AckFeedback::NONE;
                self.packet_acked(i, now, &mut none);
                self.settle_fence(sh);
                return;
            }
            _ => {
                sh.stats.rx_bad_response += 1;
                return;
            }
        };
        let Some(wi) = self.wqe_index(msn) else {
            return;
        };
        let status = match n.syndrome {
            Syndrome::ReceiverNotReady => {
                // The peer is alive and will take the message later: that is progress. A
                // fatal NAK is not (counting it would let a failed responder, which NAKs every
                // probe, keep this QP retrying forever).
                self.made_progress();
                let w = &mut self.sq[wi];
                if now >= w.rnr_until {
                    w.rnr_retries += 1;
                    w.rnr_until = now.add_nanos(sh.cfg.rnr_timer_ns);
                }
                if w.rnr_retries <= sh.cfg.rnr_retry_limit {
                    let until = w.rnr_until;
                    let p = &mut self.sent[i];
                    if !p.lost {
                        p.lost = true;
                        self.in_flight_bytes =
                            self.in_flight_bytes.saturating_sub(u64::from(p.wire_len));
                        self.in_flight_pkts = self.in_flight_pkts.saturating_sub(1);
                    }
                    p.hold_until = until;
                    let psn = p.psn;
                    self.rtx.retain(|&q| q != psn);
                    if !self.held.contains(&psn) {
                        self.held.push(psn);
                    }
                    self.rearm_rto(now, sh);
                    return;
                }
                WcStatus::RnrRetryExceeded
            }
            Syndrome::RemoteAccess => WcStatus::RemoteAccessError,
            Syndrome::InvalidRequest => WcStatus::RemoteInvalidRequest,
            Syndrome::RemoteOperation => WcStatus::RemoteOperationError,
        };
        // A fatal refusal: the packet was not executed and is never sent again.
        let mut none = AckFeedback::NONE;
        self.packet_acked(i, now, &mut none);
        self.order.refused(n.psn);
        // Work requests posted before the refused one may still be in flight (their packets
        // took other paths): let them finish, then fail this one and flush the rest, so the
        // statuses read in posting order. Nothing new is sent meanwhile. The responder stops
        // at its first refusal and refuses everything after it the same way, so the earliest
        // refused request in posting order carries the status (the later ones flush, see
        // `enter_error`); later NAKs for a request do not overwrite its status.
        if self.sq[wi].status.is_none() && !self.sq.iter().take(wi).any(|w| w.status.is_some()) {
            self.sq[wi].status = Some(status);
        }
        self.failing = true;
        if n.syndrome == Syndrome::RemoteOperation {
            // The responder's QP is in error: nothing earlier will complete either.
            self.enter_error(sh);
            return;
        }
        self.complete_sq(sh);
    }

    fn on_timeout(&mut self, now: Timestamp, sh: &mut Shared) {
        if self.state != QpState::Connected {
            return;
        }
        if !self.held.is_empty() {
            let mut i = 0;
            while i < self.held.len() {
                let psn = self.held[i];
                match self.sent_index(psn) {
                    Some(s) if self.sent[s].hold_until > now && !self.sent[s].acked => i += 1,
                    Some(s) => {
                        self.held.swap_remove(i);
                        if !self.sent[s].acked {
                            self.rtx.push_back(psn);
                        }
                    }
                    None => {
                        self.held.swap_remove(i);
                    }
                }
            }
        }
        if self.reorder_deadline.is_some_and(|d| d <= now) {
            self.detect_losses(now, sh);
        }
        let Some(deadline) = self.rto_deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        // Nothing outstanding (the last packet probed needed no resending: its work request had
        // completed, as a READ does when its response arrives before the request's ACK): no
        // timeout to count. Counting it would fail an idle QP `retry_limit` timeouts later.
        let waiting = self.awaits_response();
        if self.in_flight_pkts == 0 && self.rtx.is_empty() && !waiting {
            self.rto_deadline = None;
            return;
        }
        sh.stats.rto_fired += 1;
        self.rtos += 1;
        // The interval this timer was armed for (the backoff has not moved since), and whether
        // the probe below finds anything old enough to send again.
        let rto = self.rto_ns(&sh.cfg);
        let resends = self
            .sent
            .iter()
            .any(|p| !p.acked && !p.lost && p.send_ts.add_nanos(rto) <= now);
        let charge = Timeout::classify(
            now.as_nanos(),
            deadline.as_nanos(),
            rto,
            resends,
            waiting && self.in_flight_pkts == 0,
        );
        let counted = charge == Timeout::Counted;
        if counted && self.retry.charge(rto, &sh.cfg) {
            // The oldest unfinished work request gets the error (a READ waiting for its
            // response counts, though none of its packets is unacknowledged); the rest are
            // flushed, so the statuses read in posting order as verbs users expect.
            if let Some(i) = self.sq.iter().position(|w| !w.is_done()) {
                self.sq[i].status = Some(WcStatus::RetryExceeded);
            }
            self.enter_error(sh);
            return;
        }
        // Probe with the oldest outstanding packets only (as RACK-TLP does): if the tail was
        // really lost, their acknowledgement lets time-based detection declare the rest; if
        // the timeout was spurious (a stalled receiver), it costs a duplicate or two instead
        // of the whole window. A late timeout (this host stalled) probes too, but says nothing
        // about the network: no window cut, no re-path, no backoff.
        if counted {
            self.cc.on_retransmit_timeout(now);
        }
        let mut probes = 0;
        for i in 0..self.sent.len() {
            if probes == RTO_PROBE_PACKETS {
                break;
            }
            let p = &mut self.sent[i];
            if p.acked || p.lost || p.send_ts.add_nanos(rto) > now {
                continue;
            }
            if probes == 0 && counted {
                // A timeout suggests this path swallows packets: re-path it.
                self.paths.request_repath(u16::from(p.path));
            }
            probes += 1;
            p.lost = true;
            let (psn, path, len, ts) = (p.psn, p.path, p.wire_len, p.send_ts);
            self.in_flight_bytes = self.in_flight_bytes.saturating_sub(u64::from(len));
            self.in_flight_pkts = self.in_flight_pkts.saturating_sub(1);
            self.rtx.push_back(psn);
            sh.paths[usize::from(path)].lost += 1;
            self.path_stats[usize::from(path)].lost += 1;
            self.paths.on_loss(now, u16::from(path), ts);
            if counted && !self.paths.is_outlier(u16::from(path)) {
                self.sent[i].cc_loss_ts = Some(ts);
                self.cc.on_congestion_event(now, ts, false, len);
            }
        }
        if counted {
            self.backoff = (self.backoff + 1).min(MAX_BACKOFF_SHIFT);
        }
        self.rto_deadline = Some(now.add_nanos(self.rto_ns(&sh.cfg)));
    }

    /// Moves the QP to the error state and completes every outstanding work request: the
    /// finished ones as successes, the one that failed with its status, the rest as flushed.
    fn enter_error(&mut self, sh: &mut Shared) {
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

    /// Completes every outstanding receive in posting order: a failed one with its status,
    /// the rest as flushed.
    fn flush_rq(&mut self, sh: &mut Shared) {
        for w in self.rq.drain(..) {
            let (status, byte_len) = match (w.error, w.msg) {
                (Some(e), Some((_, len))) => (e, len),
                (Some(e), None) => (e, 0),
                (None, _) => (WcStatus::Flushed, 0),
            };
            let c = Completion {
                wr_id: w.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len,
                imm: None,
                qpn: self.qpn,
            };
            sh.complete(self.recv_cq, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The cached earliest deadline is, whenever it is not stale, the minimum of the
        /// deadlines it was told about.
        #[test]
        fn earliest_deadline_follows_the_minimum(
            changes in proptest::collection::vec((0usize..4, proptest::option::of(0u64..50)), 0..64),
        ) {
            let mut slots = [None; 4];
            let mut e = Earliest::default();
            for (i, d) in changes {
                let new = d.map(Timestamp::from_nanos);
                e.changed(slots[i], new);
                slots[i] = new;
                if e.stale {
                    e = Earliest { at: slots.iter().flatten().min().copied(), stale: false };
                }
                prop_assert_eq!(e.at, slots.iter().flatten().min().copied());
            }
        }

        /// The port set answers what a plain list of ports would: how many of `0..n` are
        /// spare, and which is the k-th spare one in increasing order.
        #[test]
        fn port_set_matches_a_list(
            moves in proptest::collection::vec((0u16..MAX_PATHS, 0u16..MAX_PATHS), 0..64),
            initial in 1u16..=MAX_PATHS,
            n in 1u16..=MAX_PATHS,
        ) {
            let mut set = PortSet::first(initial);
            let mut list: Vec<u16> = (0..initial).collect();
            for (out, inn) in moves {
                set.remove(out);
                list.retain(|&p| p != out);
                set.insert(inn);
                if !list.contains(&inn) {
                    list.push(inn);
                }
                let spare: Vec<u16> = (0..n).filter(|p| !list.contains(p)).collect();
                prop_assert_eq!(usize::from(set.free_below(n)), spare.len());
                for (k, &p) in spare.iter().enumerate() {
                    prop_assert_eq!(set.nth_free(k as u16), p);
                }
            }
        }
    }
}
