//! The responder side of a QP: admitting and executing arriving requests, placing their bytes,
//! the receive queue, the READ and atomic response jobs and the NAKs, and the gate of RC
//! semantics (a fatal refusal stops execution and moves the QP to the error state once the
//! earlier requests have all arrived; receives complete in order).
use super::*;

/// Most NAKs queued per QP; more are dropped (the sender's retransmission asks again).
pub(crate) const MAX_PENDING_NAKS: usize = 64;
/// Most READ/atomic responses one QP queues for its peer; more requests get an RNR NAK.
pub(crate) const MAX_RESPONSE_JOBS: usize = 1024;

#[derive(Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) segs: Segs,
    pub(crate) cap: u64,
    /// Op and total length of the message matched to it, from its first packet.
    pub(crate) msg: Option<(Op, u32)>,
    pub(crate) placed: Coverage,
    pub(crate) imm: Option<u32>,
    pub(crate) done: bool,
    /// Why this receive failed (it completes with this status, in posting order, when the QP
    /// goes to the error state).
    pub(crate) error: Option<WcStatus>,
    /// The latest PSN of its message placed so far: in ordered mode it completes once every
    /// packet up to this one has arrived ([`RcOrder::may_complete`]).
    pub(crate) last_psn: Option<u32>,
}

#[derive(Debug)]
pub(crate) enum RespJob {
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

impl RespJob {
    /// Payload bytes of this job's next packet, `chunk` at most (0 for an atomic's result).
    pub(crate) fn next_len(&self, chunk: u32) -> u32 {
        match self {
            RespJob::Read {
                msg_len,
                next_offset,
                ..
            } => (*msg_len - *next_offset).min(chunk),
            RespJob::Atomic { .. } => 0,
        }
    }

    /// Cuts this job's next packet; the flag is true when that was its last.
    pub(crate) fn take_packet(&mut self, chunk: u32) -> (SentWhat, bool) {
        let len = self.next_len(chunk);
        match self {
            RespJob::Read {
                msn,
                region,
                base,
                msg_len,
                next_offset,
            } => {
                let offset = *next_offset;
                let what = SentWhat::ReadResp {
                    msn: *msn,
                    region: region.clone(),
                    base: *base,
                    offset,
                    len,
                    msg_len: *msg_len,
                };
                *next_offset = offset + len;
                (what, *next_offset >= *msg_len)
            }
            RespJob::Atomic { msn, original } => (
                SentWhat::AtomicResp {
                    msn: *msn,
                    original: *original,
                },
                true,
            ),
        }
    }
}

/// The responder's state: what the peer's packets built up (tracker, ACK and NAK state, the receive queue, response jobs, the RC gate).
pub(crate) struct Responder {
    pub(crate) resp: VecDeque<RespJob>,
    pub(crate) rx: RecvTracker,
    pub(crate) ack_pending: bool,
    /// New packets accepted since the last ACK went ([`EndpointConfig::ack_every`]).
    pub(crate) unacked: u16,
    /// When an ACK owed for fewer than `ack_every` packets becomes due
    /// ([`EndpointConfig::ack_delay_ns`]).
    pub(crate) ack_due: Option<Timestamp>,
    /// Stopped by a fatal refusal, this side waits for the packets before it
    /// ([`RcOrder::fence_reached`]) at most until then: a dead or lying peer would otherwise
    /// leave the QP, and every request of its own (held back meanwhile), waiting forever.
    pub(crate) fence_deadline: Option<Timestamp>,
    /// A duplicate arrived since the last ACK was sent (reported with `FLAG_DUPLICATE`).
    pub(crate) dup_since_ack: bool,
    pub(crate) echo: Option<(u32, u64, Timestamp)>,
    /// The echoed packet arrived CE-marked: a later unmarked one does not replace it before
    /// the next ACK goes. The ACK reports marks as one bit that the requester charges to the
    /// echoed packet's path, so echoing a marked packet keeps the mark on a path that was
    /// marked when one ACK covers packets of several paths (a receive batch of a busy host).
    pub(crate) echo_ce: bool,
    /// Hop telemetry of the packet being handled ([`Qp::dispatch`]).
    pub(crate) rx_hop: u16,
    /// Hop telemetry of the echoed packet.
    pub(crate) echo_hop: u16,
    pub(crate) ce_count: CeCount,
    pub(crate) naks: VecDeque<(wire::Nak, Until)>,
    /// Where a fatal refusal stopped this QP as a responder, and whether receives complete
    /// in order ([`crate::rc_order`]).
    pub(crate) order: RcOrder,
    /// The last NAK sent, repeated on a short timer in case it was lost.
    pub(crate) nak_repeat: NakRepeat,
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(crate) rq_base_ssn: Msn,
}

impl Responder {
    pub(crate) fn new(unordered: bool) -> Responder {
        Responder {
            resp: VecDeque::new(),
            rx: RecvTracker::new(0),
            ack_pending: false,
            unacked: 0,
            ack_due: None,
            fence_deadline: None,
            dup_since_ack: false,
            echo: None,
            echo_ce: false,
            rx_hop: 0,
            echo_hop: 0,
            ce_count: CeCount(0),
            naks: VecDeque::new(),
            order: RcOrder::new(unordered),
            nak_repeat: NakRepeat::default(),
            rq: VecDeque::new(),
            rq_base_ssn: Msn(0),
        }
    }
}

impl Qp {
    /// Records a newly accepted packet of the peer's for acknowledgement. It becomes the
    /// packet the next ACK echoes, unless this host is catching up after a stall: it may have
    /// waited in the socket since the stall began, so its receipt time (from which the ACK's
    /// holding time counts) is unknown, and the peer would take this host's stall for fabric
    /// delay ([`crate::stall`]); the previous echo, whose receipt time is known, stays.
    pub(crate) fn accepted(&mut self, now: Timestamp, h: &Header, ecn: Ecn, sh: &Shared) {
        self.accepted_as(now, h, ecn, false, sh);
    }
    /// [`accepted`](Self::accepted) for a packet that may be `answered`: a READ or atomic
    /// request whose response was just queued. Its response acknowledges it (as
    /// InfiniBand's responses acknowledge their requests; the requester's side is
    /// [`Qp::response_acknowledges`]), so when it came in order, nothing else waits for an
    /// ACK, and the response may leave at once (the only one queued, with room in the
    /// window), no ACK is owed for it: the response is not held behind an ACK datagram of
    /// its own. A later ACK covers it in its cumulative point.
    pub(crate) fn accepted_as(
        &mut self,
        now: Timestamp,
        h: &Header,
        ecn: Ecn,
        answered: bool,
        sh: &Shared,
    ) {
        // The next PSN with nothing accepted beyond it (so none missing before it after).
        let in_order = self.rsp.rx.cum() == h.psn && !self.rsp.rx.has_holes();
        self.rsp.rx.accept(h.psn);
        let spared = answered
            && in_order
            && self.rsp.unacked == 0
            && !self.rsp.ack_pending
            && self.rsp.resp.len() == 1
            && self.rec.in_flight_bytes + sh.cfg.max_datagram as u64 <= self.cc.window();
        if !spared {
            // Out of order (a hole before it, or it filled one): at once, as TCP does; a
            // sender asking for an ACK may be waiting for exactly the packets that came late.
            let at_once = !in_order || h.flags & wire::FLAG_ACK_NOW != 0;
            self.owe_ack(now, at_once, sh);
        }
        let keep_marked = self.rsp.echo_ce && !ecn.is_ce();
        if !keep_marked && (self.rsp.echo.is_none() || !sh.stall.catching_up(now)) {
            // Held from its arrival at this host, not from when the engine got to it.
            self.rsp.echo = Some((h.psn, h.send_ts_ns, sh.rx_at.min(now)));
            // The hop telemetry goes with the echoed packet: kept when its echo is kept.
            self.rsp.echo_hop = self.rsp.rx_hop;
            self.rsp.echo_ce = ecn.is_ce();
        }
        if ecn.is_ce() {
            self.rsp.ce_count += 1;
        }
        self.made_progress();
    }
    /// Counts a newly accepted packet towards the next ACK: it is owed `at_once`, or when
    /// `ack_every` packets wait for one, else by `ack_delay_ns` from the first that waits.
    fn owe_ack(&mut self, now: Timestamp, at_once: bool, sh: &Shared) {
        let r = &mut self.rsp;
        r.unacked = r.unacked.saturating_add(1);
        if at_once || r.unacked >= sh.cfg.ack_every {
            r.ack_pending = true;
        } else if !r.ack_pending && r.ack_due.is_none() {
            r.ack_due = Some(now.add_nanos(sh.cfg.ack_delay_ns));
        }
    }
    /// The ACK owed since `ack_due` is due by `now`.
    pub(crate) fn ack_timer(&mut self, now: Timestamp) {
        if self.rsp.ack_due.is_some_and(|d| d <= now) {
            self.rsp.ack_due = None;
            self.rsp.ack_pending = true;
        }
    }
    /// Classifies a sequenced packet from the peer; true if it is new and should be processed.
    pub(crate) fn admit(&mut self, h: &Header, sh: &mut Shared) -> bool {
        match self.rsp.rx.classify(h.psn) {
            Class::New => true,
            Class::Duplicate => {
                sh.stats.rx_duplicates += 1;
                self.rsp.ack_pending = true;
                self.rsp.dup_since_ack = true;
                false
            }
            Class::OutOfWindow => {
                sh.stats.rx_out_of_window += 1;
                false
            }
        }
    }
    pub(crate) fn nak(&mut self, h: &Header, msn: u32, syndrome: Syndrome) {
        if self.rsp.naks.len() < MAX_PENDING_NAKS {
            let nak = wire::Nak {
                psn: h.psn,
                msn,
                syndrome,
            };
            self.rsp.naks.push_back((nak, Until::Accepted));
        }
    }
    pub(crate) fn on_request(
        &mut self,
        now: Timestamp,
        h: &Header,
        r: &wire::Request,
        payload: &[u8],
        ecn: Ecn,
        sh: &mut Shared,
    ) {
        if let Some(f) = self.rsp.order.fence
            && f.stops(h.psn)
        {
            // At or after a fatal refusal: never executed, refused the same way (a lost NAK
            // is answered again when the requester retransmits).
            self.nak(h, r.msn, f.syndrome);
            return;
        }
        if self.state == QpState::Error {
            if self.rsp.order.fence.is_some() {
                // Before the fence: every such packet arrived before the QP failed, so this
                // is a duplicate whose acknowledgement may have been lost.
                self.rsp.ack_pending = true;
            } else {
                self.nak(h, r.msn, Syndrome::RemoteOperation);
            }
            return;
        }
        if !self.admit(h, sh) {
            if h.flags & wire::FLAG_RETRANSMIT != 0 && (r.op == Op::Read || r.op.is_atomic()) {
                self.answer_again(now, sh);
            }
            return;
        }
        match self.execute(h.psn, r, payload, sh) {
            Ok(()) => {
                let answered = r.op == Op::Read || r.op.is_atomic();
                self.accepted_as(now, h, ecn, answered, sh);
            }
            Err(Some(Syndrome::ReceiverNotReady)) => self.nak(h, r.msn, Syndrome::ReceiverNotReady),
            Err(Some(syndrome)) => {
                // Fatal: the responder stops at this packet ([`crate::rc_order`]), and this
                // QP sends no new request of its own (they flush when it fails).
                self.nak(h, r.msn, syndrome);
                self.rsp.order.refuse(h.psn, r.msn, syndrome);
                self.req.failing = true;
            }
            Err(None) => sh.stats.rx_bad_response += 1,
        }
        self.after_accept(sh);
        if self.state == QpState::Connected && self.rsp.order.fence.is_some() {
            // Still waiting for packets before the refusal: they have the retry budget from
            // the last request packet that came.
            let wait = match sh.cfg.retry_timeout_ns {
                0 => sh
                    .cfg
                    .rto_max_ns
                    .saturating_mul(u64::from(sh.cfg.retry_limit.max(1))),
                t => t,
            };
            self.rsp.fence_deadline = Some(now.add_nanos(wait));
        }
    }
    /// The requester sent a READ or atomic request again that this side had executed: its
    /// retransmit timer fired while it still waits for the response ([`Qp::queue_reask`]),
    /// so the peer is alive and the response, or its acknowledgement, was lost. Rather than
    /// wait for this side's own timer (backed off, maybe far, on this host's round-trip
    /// estimate), the oldest response packets not acknowledged and older than a smoothed
    /// round trip are resent now, as a retransmit timeout's probe would be (their
    /// acknowledgement lets loss detection find the rest); the backoff and the retry budget
    /// start over. A copy the network duplicated finds nothing that old, and costs nothing.
    pub(crate) fn answer_again(&mut self, now: Timestamp, sh: &mut Shared) {
        self.made_progress();
        let age = self.rec.rtt.srtt_ns.max(REO_WND_MIN_NS);
        let mut probes = 0;
        for i in 0..self.rec.sent.len() {
            if probes == RTO_PROBE_PACKETS {
                break;
            }
            let p = &self.rec.sent[i];
            if p.acked || p.lost || matches!(p.what, SentWhat::Req { .. }) {
                continue;
            }
            if p.send_ts.add_nanos(age) > now {
                continue;
            }
            probes += 1;
            self.declare_lost(i, now, false, sh);
        }
        if probes > 0 {
            self.rearm_rto(now, sh);
        }
    }
    /// After a packet of the peer's was accepted or refused: completes the receives that may
    /// complete now and, once every packet before a fatal refusal has arrived, moves the QP
    /// to the error state (its receives flush; the last acknowledgement still goes out, so the
    /// requester learns that the requests before the refusal arrived).
    pub(crate) fn after_accept(&mut self, sh: &mut Shared) {
        self.complete_rq(sh);
        self.settle_fence(sh);
    }
    /// Moves a responder stopped by a fatal refusal to the error state once every packet
    /// before the refusal has arrived and every response to them (READ data, atomic results)
    /// has been acknowledged or given up by the requester: a READ posted before the refused
    /// request still gets its data. The last acknowledgement still goes out.
    pub(crate) fn settle_fence(&mut self, sh: &mut Shared) {
        if self.state != QpState::Connected || !self.rsp.order.fence_reached(self.rsp.rx.cum()) {
            return;
        }
        // Every receive before the fence has completed: the rest flush now, before this side
        // acknowledges the last packet before the refusal (so before the requester can
        // report the refusal).
        self.flush_rq(sh);
        // Only while fenced (rare): a scan of what is in flight.
        let delivered = self.rsp.resp.is_empty()
            && self
                .rec
                .sent
                .iter()
                .all(|p| p.acked || matches!(p.what, SentWhat::Req { .. }));
        if delivered {
            // An ACK coalescing was holding back goes now too.
            let ack = self.rsp.ack_pending || self.rsp.unacked > 0;
            self.enter_error(sh);
            self.rsp.ack_pending = ack;
        }
    }
    /// Executes one request packet. `Err(Some)` refuses it with a NAK, `Err(None)` drops it
    /// silently (an inconsistent peer).
    pub(crate) fn execute(
        &mut self,
        psn: u32,
        r: &wire::Request,
        payload: &[u8],
        sh: &mut Shared,
    ) -> Result<(), Option<Syndrome>> {
        let plen = payload.len() as u64;
        let recv_idx = self.matching_recv(r, plen)?;
        match r.op {
            Op::Write | Op::WriteImm => self.place_write(r, payload, sh)?,
            Op::Send | Op::SendImm => self.place_send(recv_idx.unwrap_or(0), r, payload)?,
            Op::Read => self.queue_read(r, sh)?,
            Op::FetchAdd | Op::CompareSwap => self.apply_atomic(r, payload, sh)?,
        }
        if let Some(i) = recv_idx {
            self.note_placed(i, psn, r, plen);
        }
        Ok(())
    }

    /// The index in the receive queue of the receive a SEND or WRITE with immediate consumes
    /// (`None` for other operations), checked to accept this packet.
    fn matching_recv(
        &self,
        r: &wire::Request,
        plen: u64,
    ) -> Result<Option<usize>, Option<Syndrome>> {
        if !r.op.consumes_recv() {
            return Ok(None);
        }
        let ssn = Msn(r.ssn);
        if !ssn.ge(self.rsp.rq_base_ssn) {
            return Err(None); // a message that already completed
        }
        let i = ssn.since(self.rsp.rq_base_ssn) as usize;
        if i >= self.rsp.rq.len() {
            return Err(Some(Syndrome::ReceiverNotReady));
        }
        let w = &self.rsp.rq[i];
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
        Ok(Some(i))
    }

    fn place_write(
        &mut self,
        r: &wire::Request,
        payload: &[u8],
        sh: &mut Shared,
    ) -> Result<(), Option<Syndrome>> {
        let region = sh
            .remote_region_ref(
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
        Ok(())
    }

    fn place_send(
        &mut self,
        i: usize,
        r: &wire::Request,
        payload: &[u8],
    ) -> Result<(), Option<Syndrome>> {
        if u64::from(r.msg_len) > self.rsp.rq[i].cap {
            // A fatal refusal (the QP fails once the packets before it arrived);
            // receives complete in posting order: this one with the length error,
            // the ones after it as flushed.
            self.rsp.rq[i].msg = Some((r.op, r.msg_len));
            self.rsp.rq[i].error = Some(WcStatus::LocalLengthError);
            return Err(Some(Syndrome::InvalidRequest));
        }
        if !scatter(&self.rsp.rq[i].segs, u64::from(r.offset), payload) {
            return Err(Some(Syndrome::InvalidRequest));
        }
        Ok(())
    }

    fn queue_read(&mut self, r: &wire::Request, sh: &mut Shared) -> Result<(), Option<Syndrome>> {
        sh.remote_region(
            self.pd,
            r.rkey,
            Access::REMOTE_READ,
            r.remote_offset,
            u64::from(r.msg_len),
        )
        .map_err(Some)
        .map(|region| {
            self.rsp.resp.push_back(RespJob::Read {
                msn: r.msn,
                region,
                base: r.remote_offset,
                msg_len: r.msg_len,
                next_offset: 0,
            })
        })?;
        if self.rsp.resp.len() > MAX_RESPONSE_JOBS {
            self.rsp.resp.pop_back();
            return Err(Some(Syndrome::ReceiverNotReady));
        }
        Ok(())
    }

    fn apply_atomic(
        &mut self,
        r: &wire::Request,
        payload: &[u8],
        sh: &mut Shared,
    ) -> Result<(), Option<Syndrome>> {
        if self.rsp.resp.len() >= MAX_RESPONSE_JOBS {
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
        self.rsp.resp.push_back(RespJob::Atomic {
            msn: r.msn,
            original,
        });
        Ok(())
    }

    /// Records a packet placed into receive `i`: its message, range, immediate and PSN.
    fn note_placed(&mut self, i: usize, psn: u32, r: &wire::Request, plen: u64) {
        let w = &mut self.rsp.rq[i];
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
    /// Completes receives from the front of the queue, in posting order; in ordered mode only
    /// once every packet up to the last of their message has arrived.
    pub(crate) fn complete_rq(&mut self, sh: &mut Shared) {
        let cum = self.rsp.rx.cum();
        while self.rsp.rq.front().is_some_and(|w| {
            w.done
                && w.last_psn
                    .is_some_and(|l| self.rsp.order.may_complete(l, cum))
        }) {
            let Some(w) = self.rsp.rq.pop_front() else {
                break;
            };
            self.ranges.release(&w.placed);
            self.rsp.rq_base_ssn += 1;
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
    /// Whether every packet sent before the earliest one the peer refused for good has been
    /// acknowledged (true without a refusal). Until then those packets are still repaired:
    /// the responder executes them and fails only once it has them all.
    pub(crate) fn refusal_settled(&self) -> bool {
        let Some(psn) = self.rsp.order.refused_psn else {
            return true;
        };
        // A request packet also counts once its work request is done (a READ or atomic
        // answered: the request arrived, though its acknowledgement may not have); responses
        // to the peer's requests do not hold this QP's failure back.
        let settled = |p: &SentPkt| match p.what {
            SentWhat::Req { msn, .. } => {
                p.acked || self.wqe_index(msn).is_none_or(|w| self.req.sq[w].is_done())
            }
            _ => true,
        };
        match self.sent_index(psn) {
            Some(i) => self.rec.sent.iter().take(i).all(settled),
            None => true,
        }
    }
    /// Completes every outstanding receive in posting order: a failed one with its status,
    /// the rest as flushed.
    pub(crate) fn flush_rq(&mut self, sh: &mut Shared) {
        for w in self.rsp.rq.drain(..) {
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

    #[test]
    fn a_read_response_is_cut_into_chunks_and_finishes_with_its_last() {
        let mut job = RespJob::Read {
            msn: 3,
            region: Region::new(4096),
            base: 100,
            msg_len: 2500,
            next_offset: 0,
        };
        let mut cuts = Vec::new();
        loop {
            let want = job.next_len(1000);
            let (what, last) = job.take_packet(1000);
            let SentWhat::ReadResp {
                msn,
                base,
                offset,
                len,
                msg_len,
                ..
            } = what
            else {
                panic!("a READ job cuts READ responses");
            };
            assert_eq!((msn, base, msg_len, len), (3, 100, 2500, want));
            cuts.push((offset, len));
            if last {
                break;
            }
        }
        assert_eq!(cuts, vec![(0, 1000), (1000, 1000), (2000, 500)]);
    }

    #[test]
    fn an_atomic_response_is_one_packet() {
        let mut job = RespJob::Atomic {
            msn: 9,
            original: 42,
        };
        assert_eq!(job.next_len(1000), 0);
        let (what, last) = job.take_packet(1000);
        assert!(last);
        assert!(matches!(
            what,
            SentWhat::AtomicResp {
                msn: 9,
                original: 42
            }
        ));
    }
}
