//! The requester side of a QP: the send queue, cutting new work into packets, matching the
//! responses (READ data, atomic results, NAKs) to their work requests, and completing those in
//! posting order.
use super::*;

#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: Op,
    pub(crate) segs: Segs,
    pub(crate) len: u32,
    pub(crate) remote: RemoteAddr,
    pub(crate) imm: u32,
    pub(crate) operands: (u64, u64),
    pub(crate) signaled: bool,
    pub(crate) msn: u32,
    pub(crate) ssn: u32,
    pub(crate) next_offset: u32,
    pub(crate) packetized: bool,
    pub(crate) unacked_pkts: u32,
    /// Bytes of a READ's response placed so far (their union: see [`Coverage`]).
    pub(crate) read_placed: Coverage,
    pub(crate) got_resp: bool,
    pub(crate) atomic_result: Option<u64>,
    pub(crate) rnr_retries: u32,
    pub(crate) rnr_until: Timestamp,
    pub(crate) status: Option<WcStatus>,
    /// The packet whose refusal (a NAK, or receiver-not-ready retries running out) set
    /// `status`, if one did ([`Qp::refused`]).
    pub(crate) refused_at: Option<u32>,
    /// PSN of the request's (last) packet, once sent: a READ or atomic still waiting for its
    /// response when the retransmit timer fires asks for it again under this number.
    pub(crate) req_psn: u32,
}

/// The requester's state: the send queue and its sequence numbers.
pub(crate) struct Requester {
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) sq_base_msn: Msn,
    pub(crate) next_msn: Msn,
    pub(crate) next_ssn: Msn,
    /// Index in `sq` of the first work request with packets still to emit.
    pub(crate) pack_idx: usize,
    /// READs and atomics sent and still awaiting their responses.
    pub(crate) awaited: AwaitedResponses,
    /// A work request was refused: send nothing new, fail once the earlier ones finish.
    pub(crate) failing: bool,
    /// READs and atomics (by MSN) to ask for again: their requests were acknowledged, their
    /// responses have not all come, and the retransmit timer fired (see `queue_reask`).
    pub(crate) reask: VecDeque<u32>,
}

impl SendWqe {
    /// A work request not yet sent, without buffers (`segs`, `len` are set by the caller).
    pub(crate) fn new(
        wr_id: u64,
        signaled: bool,
        (op, remote, imm, operands): (Op, RemoteAddr, u32, (u64, u64)),
        msn: u32,
        ssn: u32,
    ) -> SendWqe {
        SendWqe {
            wr_id,
            op,
            segs: Segs::new(),
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
            read_placed: if op == Op::Read {
                Coverage::with_room()
            } else {
                Coverage::default()
            },
            got_resp: false,
            atomic_result: None,
            rnr_retries: 0,
            rnr_until: Timestamp::ZERO,
            status: None,
            refused_at: None,
            req_psn: 0,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        match self.op {
            Op::Read => self.got_resp && self.read_placed.covered() == u64::from(self.len),
            Op::FetchAdd | Op::CompareSwap => self.atomic_result.is_some(),
            _ => self.packetized && self.unacked_pkts == 0,
        }
    }

    pub(crate) fn awaits_response(&self) -> bool {
        self.packetized
            && matches!(self.op, Op::Read | Op::FetchAdd | Op::CompareSwap)
            && !self.is_done()
    }

    pub(crate) fn opcode(&self) -> WcOpcode {
        wc_opcode(self.op)
    }

    /// Payload bytes of the next packet cut from this request, `chunk` at most (0 for an
    /// operation without data, which is one packet).
    pub(crate) fn next_len(&self, chunk: u32) -> u32 {
        if self.op.carries_data() {
            (self.len - self.next_offset).min(chunk)
        } else {
            0
        }
    }

    /// Cuts the next packet: its `(offset, len)` in the message. The packet counts as
    /// unacknowledged; with the last one the request is `packetized`.
    pub(crate) fn take_packet(&mut self, chunk: u32) -> (u32, u32) {
        let offset = self.next_offset;
        let len = self.next_len(chunk);
        self.next_offset = offset + len;
        self.unacked_pkts += 1;
        if self.next_offset >= self.len || !self.op.carries_data() {
            self.packetized = true;
        }
        (offset, len)
    }
}

/// A send operation as the wire has it: op, remote address, immediate, atomic operands.
pub(crate) fn decode(op: SendOp) -> (Op, RemoteAddr, u32, (u64, u64)) {
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

pub(crate) fn wc_opcode(op: Op) -> WcOpcode {
    match op {
        Op::Send | Op::SendImm => WcOpcode::Send,
        Op::Write | Op::WriteImm => WcOpcode::Write,
        Op::Read => WcOpcode::Read,
        Op::FetchAdd => WcOpcode::FetchAdd,
        Op::CompareSwap => WcOpcode::CompareSwap,
    }
}

/// The completion status verbs gives a work request refused for its buffers or shape; other
/// refusals (no such QP, not connected, full queue) mean it never ran: flushed.
pub(crate) fn refused_status(e: PostError) -> WcStatus {
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

impl Requester {
    pub(crate) fn new() -> Requester {
        Requester {
            sq: VecDeque::new(),
            sq_base_msn: Msn(0),
            next_msn: Msn(0),
            next_ssn: Msn(0),
            pack_idx: 0,
            awaited: AwaitedResponses::default(),
            failing: false,
            reask: VecDeque::new(),
        }
    }
}

impl Qp {
    /// Whether responses or requests still have packets to emit for the first time.
    pub(crate) fn has_new_work(&self) -> bool {
        !self.rsp.resp.is_empty() || self.req.pack_idx < self.req.sq.len()
    }
    /// Takes the next packet's worth of new work: a response or a request, as the deficit
    /// round robin of [`crate::share`] picks.
    pub(crate) fn next_new_packet(&mut self, sh: &Shared) -> Option<SentWhat> {
        let resp_chunk = sh.resp_chunk - self.seal.overhead();
        let req_chunk = sh.req_chunk - self.seal.overhead();
        let resp_len = self.rsp.resp.front().map(|job| job.next_len(resp_chunk));
        let req_len = self.sendable_request().map(|w| w.next_len(req_chunk));
        match self.share.pick(resp_len, req_len)? {
            Turn::Response => self.next_response_packet(resp_chunk),
            Turn::Request => self.next_request_packet(req_chunk),
        }
    }

    /// The work request whose packets are cut next, unless nothing new may be sent: the QP
    /// is failing, or the request was queued already failed (`post_send_or_fail`: never
    /// sent, it fails the QP when it reaches the front).
    fn sendable_request(&self) -> Option<&SendWqe> {
        self.req
            .sq
            .get(self.req.pack_idx)
            .filter(|w| !self.req.failing && w.status.is_none())
    }

    /// The next packet of the oldest response job; the job leaves the queue with its last.
    fn next_response_packet(&mut self, chunk: u32) -> Option<SentWhat> {
        let (what, finished) = self.rsp.resp.front_mut()?.take_packet(chunk);
        if finished {
            self.rsp.resp.pop_front();
        }
        Some(what)
    }

    /// The next packet of the request being cut; past its last, the next request's turn
    /// comes, and a READ or atomic starts waiting for its response.
    fn next_request_packet(&mut self, chunk: u32) -> Option<SentWhat> {
        if self.req.failing {
            return None;
        }
        let w = self.req.sq.get_mut(self.req.pack_idx)?;
        if w.status.is_some() {
            return None;
        }
        let (offset, len) = w.take_packet(chunk);
        let what = SentWhat::Req {
            msn: w.msn,
            offset,
            len,
        };
        if w.packetized {
            if w.awaits_response() {
                self.req.awaited.started();
            }
            self.req.pack_idx += 1;
        }
        Some(what)
    }
    /// Completes send work requests from the front of the queue, in posting order.
    /// Once a refused work request (see `on_nak`) reaches the front, the QP fails.
    pub(crate) fn complete_sq(&mut self, sh: &mut Shared) {
        while self
            .req
            .sq
            .front()
            .is_some_and(|w| w.status.is_none() && w.is_done())
        {
            let Some(w) = self.req.sq.pop_front() else {
                break;
            };
            self.ranges.release(&w.read_placed);
            self.req.sq_base_msn += 1;
            self.req.pack_idx = self.req.pack_idx.saturating_sub(1);
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
        if self.req.sq.front().is_some_and(|w| w.status.is_some()) && self.refusal_settled() {
            self.enter_error(sh);
        }
    }
    pub(crate) fn on_read_response(
        &mut self,
        now: Timestamp,
        h: &Header,
        r: &wire::ReadResponse,
        payload: &[u8],
        ecn: Ecn,
        sh: &mut Shared,
    ) {
        let place = |segs: &[Seg], off| scatter(segs, off, payload);
        self.read_response(now, (h, r), payload.len(), ecn, sh, place);
    }
    /// A READ response whose payload the datapath received straight into place
    /// ([`Landing`]): checked as [`on_read_response`](Self::on_read_response) checks any,
    /// and placed already if the landing is where its bytes go. Returns whether it was
    /// accepted so.
    pub(crate) fn on_landed_read_response(
        &mut self,
        now: Timestamp,
        (h, r): (&Header, &wire::ReadResponse),
        landing: &Landing,
        ecn: Ecn,
        sh: &mut Shared,
    ) -> bool {
        let place = |segs: &[Seg], off| landing.is_at(segs, off, landing.len());
        self.read_response(now, (h, r), landing.len(), ecn, sh, place)
    }
    /// A READ response of `len` payload bytes: `place` puts them at message offset `off` of
    /// the READ's destination `segs` (false if it cannot), once the packet is found new and
    /// consistent with the READ. Returns whether it was accepted (and placed).
    fn read_response(
        &mut self,
        now: Timestamp,
        (h, r): (&Header, &wire::ReadResponse),
        len: usize,
        ecn: Ecn,
        sh: &mut Shared,
        place: impl FnOnce(&[Seg], u64) -> bool,
    ) -> bool {
        if self.state != QpState::Connected {
            self.nak(h, r.msn, Syndrome::RemoteOperation);
            return false;
        }
        if !self.admit(h, sh) {
            return false;
        }
        let qpn = self.qpn;
        let ok = self.wqe_index(r.msn).is_some_and(|i| {
            let w = &mut self.req.sq[i];
            if w.op != Op::Read || w.len != r.msg_len || !w.packetized || w.is_done() {
                return false;
            }
            // Parsing bounded offset + length by the message length, which matches ours.
            let off = u64::from(r.offset);
            if !self.ranges.admits(&w.read_placed, off, len as u64) || !place(&w.segs, off) {
                return false;
            }
            let _ = self.ranges.insert(&mut w.read_placed, off, len as u64);
            w.got_resp = true;
            let this = |l: &LandingHint| (l.qpn, l.msn) == (qpn, r.msn);
            if w.is_done() {
                self.req.awaited.answered();
                if sh.landing.as_ref().is_some_and(this) {
                    sh.landing = None;
                }
            } else if len >= LANDING_MIN_BYTES {
                // The next responses of this READ may be received straight into place.
                let chunk = match sh.landing {
                    Some(l) if this(&l) => l.chunk.max(len as u32),
                    _ => len as u32,
                };
                sh.landing = Some(LandingHint {
                    qpn,
                    msn: r.msn,
                    next: off + len as u64,
                    chunk,
                });
            }
            true
        });
        if !ok {
            sh.stats.rx_bad_response += 1;
            return false;
        }
        self.response_acknowledges(now, r.msn, sh);
        self.accepted(now, h, ecn, sh);
        self.after_accept(sh);
        self.complete_sq(sh);
        self.rearm_rto(now, sh);
        true
    }
    pub(crate) fn on_atomic_response(
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
            let w = &mut self.req.sq[i];
            if !w.op.is_atomic() || !w.packetized || w.atomic_result.is_some() {
                return false;
            }
            w.atomic_result = Some(r.original);
            self.req.awaited.answered();
            scatter(&w.segs, 0, &r.original.to_ne_bytes())
        });
        if !ok {
            sh.stats.rx_bad_response += 1;
            return;
        }
        self.response_acknowledges(now, r.msn, sh);
        self.accepted(now, h, ecn, sh);
        self.after_accept(sh);
        self.complete_sq(sh);
        self.rearm_rto(now, sh);
    }
    /// A response of READ or atomic `msn` was accepted: the responder had the request, so its
    /// packet is acknowledged if no ACK did that yet, as InfiniBand's responses acknowledge
    /// the requests before them (here only the request itself: sprayed, the packets before
    /// it may not have arrived). The responder spares the ACK of a request it answers at
    /// once ([`Qp::accepted_as`]), which would otherwise leave before the response.
    ///
    /// The time from the request to the response is a round trip for the retransmit
    /// timeout (which must outlast it), unless the request was sent again (which copy was
    /// answered is unknown) or the sample spans a stall; without it a requester that only
    /// reads would never measure one. It is no delay sample for the controller or the paths:
    /// it includes the responder's own work, which an ACK's holding time would take out.
    fn response_acknowledges(&mut self, now: Timestamp, msn: u32, sh: &mut Shared) {
        let Some(wi) = self.wqe_index(msn) else {
            return;
        };
        let Some(i) = self.sent_index(self.req.sq[wi].req_psn) else {
            return;
        };
        let p = &self.rec.sent[i];
        if p.acked || !matches!(p.what, SentWhat::Req { msn: m, .. } if m == msn) {
            return;
        }
        let (sent, again) = (p.send_ts.as_nanos(), p.retransmitted);
        let full = now.as_nanos().saturating_sub(sent).max(1);
        if !again && !self.sample_spans_a_stall(now, sent, full, sh) {
            self.rec.rtt.sample(full);
        }
        let mut none = AckFeedback::NONE;
        self.packet_acked(i, now, &mut none);
        self.feed_controller(now, &mut none);
        self.release_acked();
    }
    /// Whether a READ or atomic still awaits its response: O(1) from the count kept as they
    /// are sent and answered; debug builds check it against a scan of the send queue.
    pub(crate) fn awaits_response(&self) -> bool {
        debug_assert_eq!(
            self.req.awaited.count(),
            self.req.sq.iter().filter(|w| w.awaits_response()).count(),
            "awaited-response count out of step with the send queue"
        );
        self.req.awaited.any()
    }
    /// The retransmit timer fired while a READ or atomic waits for its response: queues the
    /// oldest such request whose own packet was acknowledged, to be sent again (under its PSN,
    /// flagged as a retransmission) so that the responder resends what it has not had
    /// acknowledged at once ([`Qp::answer_again`]).
    ///
    /// This keeps the retry on the side that owns the budget, as in verbs (rxe's requester
    /// resends a READ request for the missing part; the responder re-executes a duplicate
    /// READ): otherwise the requester counts its timeouts on its own clock while only the
    /// responder's timer, backed off on another host's round-trip estimate, resends the
    /// response, and after an outage the responder's next try can come after the requester
    /// gave up. A request whose packet is still unacknowledged needs nothing here: the probe
    /// resends it, and the responder takes that duplicate as the same question.
    pub(crate) fn queue_reask(&mut self) {
        // Only packetized requests can wait; `pack_idx` bounds the scan (a timeout is rare).
        let oldest = self
            .req
            .sq
            .iter()
            .take(self.req.pack_idx)
            .find(|w| w.awaits_response() && w.unacked_pkts == 0)
            .map(|w| w.msn);
        if let Some(msn) = oldest
            && !self.req.reask.contains(&msn)
        {
            self.req.reask.push_back(msn);
        }
    }
    pub(crate) fn on_nak(&mut self, now: Timestamp, n: &wire::Nak, sh: &mut Shared) {
        sh.stats.naks_received += 1;
        if self.state != QpState::Connected || self.refused_after_acceptance(n, sh) {
            return;
        }
        let Some(i) = self.sent_index(n.psn) else {
            return;
        };
        if self.rec.sent[i].acked {
            return;
        }
        let msn = match self.rec.sent[i].what {
            SentWhat::Req { msn, .. } if msn == n.msn => msn,
            SentWhat::ReadResp { .. } | SentWhat::AtomicResp { .. } | SentWhat::Revoked { .. } => {
                // The requester gave up on this response: stop sending it.
                let mut none = AckFeedback::NONE;
                self.packet_acked(i, now, &mut none);
                self.feed_controller(now, &mut none);
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
                if self.hold_for_rnr(i, wi, now, sh) {
                    return;
                }
                WcStatus::RnrRetryExceeded
            }
            Syndrome::RemoteAccess => WcStatus::RemoteAccessError,
            Syndrome::InvalidRequest => WcStatus::RemoteInvalidRequest,
            Syndrome::RemoteOperation => WcStatus::RemoteOperationError,
        };
        self.refused(i, wi, n, status, now, sh);
    }

    /// Receiver not ready for packet `i` of work request `wi`: the peer is alive and will
    /// take the message later, which is progress (a fatal NAK is not: counting it would let a
    /// failed responder, which NAKs every probe, keep this QP retrying forever). The packet
    /// is held out of the flight until the RNR timer ends; false once the RNR retries are
    /// spent.
    fn hold_for_rnr(&mut self, i: usize, wi: usize, now: Timestamp, sh: &Shared) -> bool {
        self.made_progress();
        let w = &mut self.req.sq[wi];
        if now >= w.rnr_until {
            w.rnr_retries = w.rnr_retries.saturating_add(1);
            w.rnr_until = now.add_nanos(sh.cfg.rnr_timer_ns);
        }
        if w.rnr_retries > sh.cfg.rnr_retry_limit {
            return false;
        }
        let until = w.rnr_until;
        let p = &mut self.rec.sent[i];
        if !p.lost {
            p.lost = true;
            self.rec.in_flight_bytes = self
                .rec
                .in_flight_bytes
                .saturating_sub(u64::from(p.wire_len));
            self.rec.in_flight_pkts = self.rec.in_flight_pkts.saturating_sub(1);
        }
        p.hold_until = until;
        let psn = p.psn;
        self.rec.rtx.retain(|&q| q != psn);
        if !self.rec.held.contains(&psn) {
            self.rec.held.push(psn);
        }
        self.rearm_rto(now, sh);
        true
    }

    /// Moved to the error state by its application ([`crate::Endpoint::set_error`]). A
    /// refusal the peer reported that has not settled yet (packets sent before the refused
    /// one still unacknowledged) is not reported: the peer fails only once it has those
    /// packets, which nobody sends any more, so it never fails the receive or whatever the
    /// refusal stood for. The refused request flushes, as every unfinished one does.
    pub(crate) fn fail_by_application(&mut self, sh: &mut Shared) {
        if !self.refusal_settled() {
            for w in &mut self.req.sq {
                if matches!(
                    w.status,
                    Some(
                        WcStatus::RemoteInvalidRequest
                            | WcStatus::RemoteAccessError
                            | WcStatus::RemoteOperationError
                            | WcStatus::RnrRetryExceeded
                    )
                ) {
                    w.status = Some(WcStatus::Flushed);
                }
            }
        }
        self.enter_error(sh);
    }

    /// A fatal refusal of packet `i` of work request `wi`: the packet was not executed and
    /// is never sent again, the request will complete with `status`, and nothing new is sent.
    fn refused(
        &mut self,
        i: usize,
        wi: usize,
        n: &wire::Nak,
        status: WcStatus,
        now: Timestamp,
        sh: &mut Shared,
    ) {
        let mut none = AckFeedback::NONE;
        self.packet_acked(i, now, &mut none);
        self.feed_controller(now, &mut none);
        self.rsp.order.refused(n.psn);
        // Work requests posted before the refused one may still be in flight (their packets
        // took other paths): let them finish, then fail this one and flush the rest, so the
        // statuses read in posting order. Nothing new is sent meanwhile. The responder stops
        // at its first refusal and refuses everything after it the same way, so the earliest
        // refused request in posting order carries the status (the later ones flush, see
        // `enter_error`). Within one request the refusal of its earliest packet decides,
        // whichever NAK came first: the packets of a SEND are sprayed, so its first one may
        // run out of receiver-not-ready retries while later ones, arriving once a receive
        // was posted, are refused as too long for it; the responder then never reaches its
        // own refusal (the first packets never arrive), and only the earlier status is true
        // of what the responder did.
        let w = &self.req.sq[wi];
        let earlier = w
            .refused_at
            .is_some_and(|p| crate::rc_order::psn_before(n.psn, p));
        if (w.status.is_none() || earlier)
            && !self.req.sq.iter().take(wi).any(|w| w.status.is_some())
        {
            self.req.sq[wi].status = Some(status);
            self.req.sq[wi].refused_at = Some(n.psn);
        }
        self.req.failing = true;
        if n.syndrome == Syndrome::RemoteOperation {
            // The responder's QP is in error: nothing earlier will complete either.
            self.enter_error(sh);
            return;
        }
        self.complete_sq(sh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wqe(op: Op, len: u32) -> SendWqe {
        let remote = RemoteAddr { rkey: 1, offset: 0 };
        SendWqe {
            len,
            ..SendWqe::new(7, true, (op, remote, 0, (0, 0)), 0, 0)
        }
    }

    #[test]
    fn a_write_is_cut_into_chunks_and_a_short_last_one() {
        let mut w = wqe(Op::Write, 2500);
        assert_eq!(w.next_len(1000), 1000);
        assert_eq!(w.take_packet(1000), (0, 1000));
        assert_eq!(w.take_packet(1000), (1000, 1000));
        assert!(!w.packetized);
        assert_eq!(w.next_len(1000), 500);
        assert_eq!(w.take_packet(1000), (2000, 500));
        assert!(w.packetized);
        assert_eq!(w.unacked_pkts, 3);
        assert!(!w.is_done(), "packets are still unacknowledged");
    }

    #[test]
    fn operations_without_data_are_one_empty_packet() {
        for op in [Op::Read, Op::FetchAdd, Op::CompareSwap] {
            let mut w = wqe(op, 8);
            assert_eq!(w.next_len(1000), 0, "{op:?}");
            assert_eq!(w.take_packet(1000), (0, 0), "{op:?}");
            assert!(w.packetized, "{op:?}");
            assert!(w.awaits_response(), "{op:?} waits for its response");
        }
        // A zero-length WRITE is one empty packet too.
        let mut w = wqe(Op::Write, 0);
        assert_eq!(w.take_packet(1000), (0, 0));
        assert!(w.packetized);
    }
}
