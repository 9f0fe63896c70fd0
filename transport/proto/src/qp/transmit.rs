//! Building headers and emitting a QP's datagrams, and the order in which they go: NAKs, then
//! ACKs, then (by turns between response traffic and the QP's own requests) responses,
//! retransmissions and new packets.
use std::net::SocketAddr;

use super::*;

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
    /// Bytes written at the start of the buffer: the datagram's length.
    pub len: usize,
    /// Where the payload lies if it was left in its region instead of written into the
    /// buffer ([`Endpoint::set_in_place_min`](crate::Endpoint::set_in_place_min)).
    pub payload: Option<PayloadAt>,
}

impl Qp {
    pub(crate) fn header(
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
    /// The datagram description of the datagram `emit` just wrote (`len` bytes), with where
    /// its payload lies if it was left in its region.
    fn transmit_emitted(&self, peer: &QpInfo, len: usize, path: u8, sh: &mut Shared) -> Transmit {
        let mut t = self.transmit(peer, len, path, Ecn::Ect0);
        if let Some(p) = sh.in_place.take_last() {
            t.payload = Some(p);
            sh.stats.tx_in_place += 1;
        }
        t
    }

    /// The datagram description for `len` bytes on logical path `path`.
    pub(crate) fn transmit(&self, peer: &QpInfo, len: usize, path: u8, ecn: Ecn) -> Transmit {
        let port = self
            .route
            .port_map
            .get(usize::from(path))
            .copied()
            .unwrap_or(0);
        Transmit {
            dest: peer.addr,
            path: port,
            ecn: ecn.to_bits(),
            len,
            payload: None,
        }
    }
    /// Writes the datagram of `what`, sequence number `psn`, into `buf` and returns its
    /// length. A payload of at least `pins.min` bytes in one region is left there
    /// ([`crate::in_place`]): its CRC32C is read in place, and `pins` pins the region and
    /// keeps where the payload is.
    #[allow(clippy::too_many_arguments)] // the packet's fields, its buffer and the pins
    pub(crate) fn emit(
        &self,
        what: &SentWhat,
        psn: u32,
        path: u8,
        flags: u8,
        now: Timestamp,
        buf: &mut [u8],
        pins: &mut in_place::Pins,
    ) -> Option<usize> {
        let min = pins.min;
        let mut source = None;
        let len = match what {
            SentWhat::Req { msn, offset, len } => {
                let w = &self.req.sq[self.wqe_index(*msn)?];
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
                    .emit_copied(buf, &h, &body, plen, |p, crc| match (ops, crc) {
                        (Some((a, b)), _) => {
                            p[..8].copy_from_slice(&a.to_be_bytes());
                            p[8..16].copy_from_slice(&b.to_be_bytes());
                            crc.map_or(0, |c| braid_crc::crc32c_append(c, p))
                        }
                        (None, Some(c)) if p.len() >= min => {
                            match seg_span(&w.segs, u64::from(*offset), p.len()) {
                                Some((region, at)) => {
                                    source = Some((region, at, p.len()));
                                    region.crc(at, p.len(), c).unwrap_or(c)
                                }
                                None => gather(&w.segs, u64::from(*offset), p, crc),
                            }
                        }
                        (None, _) => gather(&w.segs, u64::from(*offset), p, crc),
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
                    .emit_copied(buf, &h, &body, *len as usize, |p, crc| {
                        // Bounds were checked when the READ was accepted.
                        let at = base + u64::from(*offset);
                        match crc {
                            Some(c) if p.len() >= min => {
                                source = Some((region, at, p.len()));
                                region.crc(at, p.len(), c).unwrap_or(c)
                            }
                            Some(c) => region.read_crc(at, p, c).unwrap_or(c),
                            None => {
                                let _ = region.read(at, p);
                                0
                            }
                        }
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
            // Never resent: `send_retransmission` refuses its READ instead.
            SentWhat::Revoked { .. } => None,
        }?;
        if let Some((region, offset, payload)) = source {
            // The payload is followed by the trailer only.
            pins.pin(region, offset, len - wire::TRAILER_LEN - payload, payload);
        }
        Some(len)
    }
    /// The next datagram of this QP, in this order: a NAK (new, or a repeat that is due), an
    /// ACK, a retransmission, then a new packet (within the SACK span, window and pacing).
    pub(crate) fn poll_transmit(
        &mut self,
        now: Timestamp,
        buf: &mut [u8],
        sh: &mut Shared,
    ) -> Option<Transmit> {
        if !self.may_transmit() {
            // What `send_new` would have done before finding no work.
            self.route.paced_out = false;
            return None;
        }
        let peer = self.peer?;
        if let Some(nak) = self.due_nak(now) {
            return self.send_nak(nak, &peer, now, buf, sh);
        }
        // In the error state only a responder stopped by a fatal refusal acknowledges (the
        // packets before the refusal, see `after_accept`).
        if self.state != QpState::Connected && !self.rsp.ack_pending {
            return None;
        }
        if self.rsp.ack_pending {
            return self.send_ack(&peer, now, buf, sh);
        }
        // A READ or atomic asked for again, then retransmissions: they are not limited by
        // the window.
        if let Some(t) = self.send_reask(&peer, now, buf, sh) {
            return Some(t);
        }
        if let Some(t) = self.send_retransmission(&peer, now, buf, sh) {
            return Some(t);
        }
        self.send_new(&peer, now, buf, sh)
    }

    /// Whether [`poll_transmit`](Qp::poll_transmit) may find something to send: `false` only
    /// when it surely finds nothing (no peer; or no NAK queued or armed to repeat, no ACK
    /// owed, and, when connected, nothing to ask again, to retransmit or newly to send).
    /// Reads a few fields, where asking in vain walks every source in turn: an event that
    /// gave the QP nothing to send (an ACK with the send queue empty) does not mark it ready.
    pub(crate) fn may_transmit(&self) -> bool {
        self.peer.is_some()
            && (!self.rsp.naks.is_empty()
                || self.rsp.nak_repeat.deadline().is_some()
                || self.rsp.ack_pending
                || (self.state == QpState::Connected
                    && (!self.req.reask.is_empty()
                        || !self.rec.rtx.is_empty()
                        || self.has_new_work())))
    }

    /// The NAK to send now: the oldest queued one (arming its repeat), else a repeat that is
    /// due.
    fn due_nak(&mut self, now: Timestamp) -> Option<wire::Nak> {
        if let Some((nak, until)) = self.rsp.naks.pop_front() {
            let wait = NakRepeat::interval_ns(
                self.rec.rtt.srtt_ns,
                self.rec.rtt.rttvar_ns,
                self.rec.rtt.samples,
            );
            self.rsp.nak_repeat.sent(nak, until, now, wait);
            return Some(nak);
        }
        let rx = &self.rsp.rx;
        self.rsp
            .nak_repeat
            .take_due(now, |psn| rx.classify(psn) != Class::Duplicate)
    }

    fn send_nak(
        &mut self,
        nak: wire::Nak,
        peer: &QpInfo,
        now: Timestamp,
        buf: &mut [u8],
        sh: &mut Shared,
    ) -> Option<Transmit> {
        let path = self.next_path(sh);
        let h = self.header(wire::Kind::Nak, 0, path, now, 0)?;
        let len = self.seal.emit(buf, &h, &Body::Nak(nak), 0, |_| {}).ok()?;
        sh.stats.naks_sent += 1;
        Some(self.transmit(peer, len, path, Ecn::NotEct))
    }

    fn send_ack(
        &mut self,
        peer: &QpInfo,
        now: Timestamp,
        buf: &mut [u8],
        sh: &mut Shared,
    ) -> Option<Transmit> {
        self.rsp.ack_pending = false;
        self.rsp.unacked = 0;
        self.rsp.ack_due = None;
        self.rsp.echo_ce = false;
        let (echo_psn, echo_ts, at) = self.rsp.echo.unwrap_or((0, 0, now));
        let ack = wire::Ack {
            cum_psn: self.rsp.rx.cum(),
            echo_psn,
            echo_ts_ns: echo_ts,
            hold_ns: u32::try_from(now.nanos_since(at)).unwrap_or(u32::MAX),
            ce_count: self.rsp.ce_count.get(),
            sack: self.rsp.rx.sack(),
        };
        let path = self.next_path(sh);
        let flags = if self.rsp.dup_since_ack {
            wire::FLAG_DUPLICATE
        } else {
            0
        };
        self.rsp.dup_since_ack = false;
        let h = self.header(wire::Kind::Ack, 0, path, now, flags)?;
        // The echoed packet's hop telemetry, in the ACK's extension when there is any.
        let hop = self.rsp.echo_hop.to_be_bytes();
        let ext = if self.rsp.echo_hop != 0 {
            wire::ACK_EXT_LEN
        } else {
            0
        };
        let len = self
            .seal
            .emit(buf, &h, &Body::Ack(ack), ext, |p| {
                if let Some(f) = p.get_mut(wire::field::ack_ext::HOP_QUEUE) {
                    f.copy_from_slice(&hop);
                }
            })
            .ok()?;
        Some(self.transmit(peer, len, path, Ecn::NotEct))
    }

    /// The request of a READ or atomic queued by `queue_reask`, sent again under its PSN and
    /// flagged as a retransmission: the responder takes it as a duplicate and resends its
    /// unacknowledged response packets ([`Qp::answer_again`]). Not a sequenced packet of its
    /// own, so it takes no place in the flight.
    fn send_reask(
        &mut self,
        peer: &QpInfo,
        now: Timestamp,
        buf: &mut [u8],
        sh: &mut Shared,
    ) -> Option<Transmit> {
        while let Some(msn) = self.req.reask.pop_front() {
            let Some(wi) = self.wqe_index(msn) else {
                continue;
            };
            let w = &self.req.sq[wi];
            if !w.awaits_response() || w.unacked_pkts != 0 {
                continue;
            }
            let psn = w.req_psn;
            let what = SentWhat::Req {
                msn,
                offset: 0,
                len: 0,
            };
            let path = self.next_path(sh);
            let flags = wire::FLAG_RETRANSMIT | wire::FLAG_ACK_NOW;
            let Some(len) = self.emit(&what, psn, path, flags, now, buf, &mut sh.in_place) else {
                continue;
            };
            self.count_retransmit(path, sh);
            return Some(self.transmit_emitted(peer, len, path, sh));
        }
        None
    }

    /// Counts a packet sent again on `path`, in the QP's and the endpoint's statistics.
    fn count_retransmit(&mut self, path: u8, sh: &mut Shared) {
        self.counters.retransmits += 1;
        sh.stats.retransmits += 1;
        for ps in [
            &mut sh.paths[usize::from(path)],
            &mut self.counters.path_stats[usize::from(path)],
        ] {
            ps.packets += 1;
            ps.retransmits += 1;
        }
    }

    /// The first packet queued for retransmission that still needs it, sent on another path.
    fn send_retransmission(
        &mut self,
        peer: &QpInfo,
        now: Timestamp,
        buf: &mut [u8],
        sh: &mut Shared,
    ) -> Option<Transmit> {
        while let Some(psn) = self.rec.rtx.pop_front() {
            let Some(i) = self.sent_index(psn) else {
                continue;
            };
            if self.rec.sent[i].acked || !self.rec.sent[i].lost {
                continue;
            }
            if let SentWhat::Req { msn, .. } = self.rec.sent[i].what
                && self.wqe_index(msn).is_none()
            {
                // Its work request completed (a READ or atomic answered): nothing to resend.
                self.rec.sent[i].acked = true;
                self.rec.sent[i].lost = false;
                continue;
            }
            if let SentWhat::Revoked { msn } = self.rec.sent[i].what {
                // Lost after its region went: the requester misses part of that READ.
                self.refuse_revoked(msn, sh);
                let nak = self.due_nak(now)?;
                return self.send_nak(nak, peer, now, buf, sh);
            }
            let path = self
                .route
                .paths
                .pick_other(u16::from(self.rec.sent[i].path), sh.rng.next_u32())
                as u8;
            let Some(len) = self.emit(
                &self.rec.sent[i].what,
                psn,
                path,
                wire::FLAG_RETRANSMIT | wire::FLAG_ACK_NOW,
                now,
                buf,
                &mut sh.in_place,
            ) else {
                continue;
            };
            let p = &mut self.rec.sent[i];
            p.lost = false;
            p.retransmitted = true;
            p.send_ts = now;
            p.batch = sh.departures.current();
            p.path = path;
            p.wire_len = len as u32;
            self.rec.in_flight_bytes += len as u64;
            self.rec.in_flight_pkts += 1;
            self.count_retransmit(path, sh);
            self.route.paths.on_sent(u16::from(path), now);
            self.cc.on_sent(now, len as u32, psn);
            if self.rec.rto_deadline.is_none() {
                self.rec.rto_deadline = Some(now.add_nanos(self.rto_ns(&sh.cfg)));
            }
            return Some(self.transmit_emitted(peer, len, path, sh));
        }
        None
    }

    /// Burst deferral, as TCP's TSO deferral: at the start of a burst of `route.burst` > 1
    /// new packets, waits until the window (and the SACK span) holds the whole burst, as long
    /// as at least a burst's worth is in flight, whose acknowledgements will make the room.
    /// Without it a window-limited sender sends as many packets as each ACK frees (about one
    /// receive batch of the peer's), and the datapath's GSO messages are that short however
    /// long the burst. Never when the window holds fewer than two bursts (the wait would
    /// leave it half empty), and never for a burst of 1, so nothing changes there.
    fn defers_burst(&self, sh: &Shared) -> bool {
        let burst = self.route.burst;
        if burst <= 1 || self.route.burst_left > 0 {
            return false;
        }
        let need = u64::from(burst) * sh.cfg.max_datagram as u64;
        let window = self.cc.window();
        let in_flight = self.rec.in_flight_bytes;
        let span = self.rec.next_psn.since(self.rec.snd_una);
        in_flight >= need
            && window >= 2 * need
            && (in_flight + need > window || span + u32::from(burst) > wire::SACK_BITS)
    }

    /// A new packet, within the SACK span, the window and the pacing rate.
    fn send_new(
        &mut self,
        peer: &QpInfo,
        now: Timestamp,
        buf: &mut [u8],
        sh: &mut Shared,
    ) -> Option<Transmit> {
        self.route.paced_out = false;
        let span = self.rec.next_psn.since(self.rec.snd_una);
        if span >= wire::SACK_BITS {
            return None;
        }
        let max = sh.cfg.max_datagram as u64;
        let in_flight = self.rec.in_flight_bytes;
        // The window is read only with something in flight (the first packet always goes).
        let window = (in_flight > 0).then(|| self.cc.window());
        if window.is_some_and(|w| in_flight + max > w) {
            return None;
        }
        if !self.has_new_work() || self.defers_burst(sh) {
            return None;
        }
        if now < self.pace_at() {
            self.route.paced_out = true;
            return None;
        }
        let what = self.next_new_packet(sh)?;
        let psn = self.rec.next_psn.get();
        // The last packet of a request that completes on its acknowledgement (not a READ or
        // atomic: their response completes them) asks for it at once, as InfiniBand's
        // requester sets AckReq on a message's last packet: the ACK should not wait for the
        // next message's packets.
        let mut ends_message = false;
        if let SentWhat::Req { msn, .. } = what
            && let Some(wi) = self.wqe_index(msn)
        {
            let w = &mut self.req.sq[wi];
            w.req_psn = psn;
            ends_message = w.packetized && w.op != wire::Op::Read && !w.op.is_atomic();
        }
        // So does a packet after which this QP can send nothing new until it hears from the
        // peer (no work left, or the SACK span or the window full, counting this packet at
        // the largest size): the receiver would otherwise hold the ACK for packets that will
        // not come.
        let stops = !self.has_new_work()
            || span + 1 >= wire::SACK_BITS
            || in_flight + 2 * max > window.unwrap_or_else(|| self.cc.window());
        let path = self.next_burst_path(sh);
        let flags = if ends_message || stops {
            wire::FLAG_ACK_NOW
        } else {
            0
        };
        let len = self.emit(&what, psn, path, flags, now, buf, &mut sh.in_place)?;
        self.rec.next_psn += 1;
        // Filled in place: a record built on the stack field by field and then pushed was
        // copied out in wide loads right after its narrow stores (a store-forwarding stall
        // per packet, since the push is not inlined).
        self.rec.sent.push_back(SentPkt::BLANK);
        let s = self.rec.sent.back_mut().expect("just pushed");
        s.psn = psn;
        s.what = what;
        s.send_ts = now;
        s.batch = sh.departures.current();
        s.path = path;
        s.wire_len = len as u32;
        s.first_path = path;
        s.first_ts = now;
        self.rec.in_flight_bytes += len as u64;
        self.rec.in_flight_pkts += 1;
        self.counters.packets_sent += 1;
        sh.paths[usize::from(path)].packets += 1;
        self.counters.path_stats[usize::from(path)].packets += 1;
        self.route.paths.on_sent(u16::from(path), now);
        self.cc.on_sent(now, len as u32, psn);
        if !self.route.pacer.can_send(now) {
            // Sent ahead of a gap set by a lower rate (see `pace_at`): that schedule is stale.
            self.route.pacer = Pacer::new();
        }
        self.route
            .pacer
            .on_sent(now, len as u32, self.cc.pacing_rate());
        self.route.last_paced = (now, len as u32);
        if self.rec.rto_deadline.is_none() {
            self.rec.rto_deadline = Some(now.add_nanos(self.rto_ns(&sh.cfg)));
        }
        Some(self.transmit_emitted(peer, len, path, sh))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use crate::cc::FixedWindowConfig;
    use crate::{
        Access, Endpoint, EndpointConfig, QpOptions, Region, RemoteAddr, SendOp, SendWr, Sge,
        Timestamp, WcStatus,
    };

    /// A and B connected, A's window fixed at `window` packets and its bursts `burst` long,
    /// B acknowledging after `b_ack_every` packets; `writes` WRITEs of `len` bytes from A to
    /// B posted.
    fn write_pair(
        burst: u16,
        window: u32,
        b_ack_every: u16,
        len: usize,
        writes: u64,
    ) -> (Endpoint, Endpoint, SocketAddr, SocketAddr) {
        let at = |s: &str| s.parse::<SocketAddr>().expect("address");
        let (ea, eb) = (at("10.0.0.1:4791"), at("10.0.0.2:4791"));
        let cfg = |seed, ack_every| EndpointConfig {
            seed,
            burst,
            ack_every,
            cc: Arc::new(FixedWindowConfig { packets: window }),
            ..EndpointConfig::default()
        };
        let mut a = Endpoint::new(cfg(1, 1), ea);
        let mut b = Endpoint::new(cfg(2, b_ack_every), eb);
        let (apd, bpd) = (a.alloc_pd(), b.alloc_pd());
        let (acq, bcq) = (a.create_cq(), b.create_cq());
        let qa = a
            .create_qp_with(apd, acq, acq, QpOptions::default())
            .expect("qp a");
        let qb = b
            .create_qp_with(bpd, bcq, bcq, QpOptions::default())
            .expect("qp b");
        a.connect(qa.qpn, qb).expect("connect a");
        b.connect(qb.qpn, qa).expect("connect b");
        let sk = a
            .register(apd, Region::new(len), Access::NONE)
            .expect("src");
        let dk = b
            .register(bpd, Region::new(len), Access::REMOTE_WRITE)
            .expect("dst");
        for wr_id in 0..writes {
            let wr = SendWr {
                wr_id,
                op: SendOp::Write(RemoteAddr {
                    rkey: dk.rkey,
                    offset: 0,
                }),
                sges: vec![Sge {
                    lkey: sk.lkey,
                    offset: 0,
                    len: len as u32,
                }],
                signaled: true,
            };
            a.post_send(qa.qpn, wr).expect("post");
        }
        (a, b, ea, eb)
    }

    /// One 400 KB WRITE from A to B, A's window fixed at `window` packets and its bursts
    /// `burst` long, B acknowledging every `ack_every` data packets (each ACK goes back to A
    /// before B takes the next packet): the number of new packets A sent each time it was
    /// polled, in order, after checking that the WRITE completed.
    fn rounds(burst: u16, window: u32, ack_every: usize) -> Vec<usize> {
        // B's acknowledgements follow `ack_every` here, not its own coalescing.
        let (mut a, mut b, ea, eb) = write_pair(burst, window, 1, 400_000, 1);
        let mut now = Timestamp::ZERO;
        let mut buf = vec![0u8; 2048];
        let mut wire = std::collections::VecDeque::new();
        let mut sent = Vec::new();
        for _ in 0..100_000 {
            let mut round = 0;
            while let Some(t) = a.poll_transmit(now, &mut buf) {
                wire.push_back(buf[..t.len].to_vec());
                round += 1;
            }
            if round > 0 {
                sent.push(round);
            }
            // B takes `ack_every` packets, then its ACK reaches A.
            let took = wire.len().min(ack_every);
            for d in wire.drain(..took) {
                b.handle_datagram(now, ea, 0, &d);
            }
            while let Some(t) = b.poll_transmit(now, &mut buf) {
                a.handle_datagram(now, eb, 0, &buf[..t.len]);
            }
            if let Some((_, wc)) = a.poll_completion() {
                assert_eq!(wc.status, WcStatus::Success);
                return sent;
            }
            now = now.add_nanos(1_000);
            if took == 0 {
                a.handle_timeout(now);
                b.handle_timeout(now);
            }
        }
        panic!("the WRITE never completed");
    }

    #[test]
    fn a_window_limited_sender_waits_for_room_for_a_whole_burst() {
        // Window 64, bursts of 16, an ACK every 5 packets: after the first window A sends
        // only whole bursts (the last of the message may be shorter).
        let sent = rounds(16, 64, 5);
        assert_eq!(sent[0], 64, "the first window leaves at once: {sent:?}");
        let (last, steady) = sent[1..].split_last().expect("more than one round");
        assert!(steady.len() > 10, "{sent:?}");
        assert!(
            steady.iter().all(|&n| n % 16 == 0),
            "rounds not whole bursts: {sent:?}"
        );
        assert!(*last <= 64, "{sent:?}");
    }

    #[test]
    fn without_room_for_two_bursts_or_with_bursts_of_one_the_ack_clock_rules() {
        // Each ACK of 5 frees 5 packets of window: they go at once.
        for (burst, window) in [(1, 64), (16, 24)] {
            let sent = rounds(burst, window, 5);
            assert!(
                sent[1..sent.len() - 1].iter().all(|&n| n <= 5),
                "burst {burst}, window {window}: {sent:?}"
            );
            assert!(sent.len() > 30, "{sent:?}");
        }
    }

    /// Payload bytes per packet of `write_pair`'s WRITE (1472-byte datagrams).
    const CHUNK: usize = 1408;

    /// Drives `write_pair`'s WRITEs to their completion with B handed A's packets one per
    /// receive batch (B is polled after each, and its ACKs reach A at once); time stands
    /// still except that when nothing moves both sides' next timer fires. Returns, for each
    /// data packet in order, whether it asked for an ACK at once ([`wire::Flags::ACK_NOW`])
    /// and whether B acknowledged right after it; and how many times a timer had to fire.
    fn one_per_batch(
        (mut a, mut b, ea, eb): (Endpoint, Endpoint, SocketAddr, SocketAddr),
        writes: usize,
    ) -> (Vec<(bool, bool)>, u32) {
        assert_eq!(a.chunk_size() as usize, CHUNK);
        let mut now = Timestamp::from_micros(1);
        let mut buf = vec![0u8; 2048];
        let mut ack = vec![0u8; 2048];
        let mut packets = Vec::new();
        let mut timers = 0;
        let mut done = 0;
        for _ in 0..10_000 {
            let mut moved = false;
            while let Some(t) = a.poll_transmit(now, &mut buf) {
                moved = true;
                let flags = crate::wire::view::Packet::new_checked(&buf[..t.len])
                    .expect("a packet")
                    .flags();
                b.handle_datagram(now, ea, 0, &buf[..t.len]);
                let mut acked = false;
                while let Some(t) = b.poll_transmit(now, &mut ack) {
                    acked = true;
                    a.handle_datagram(now, eb, 0, &ack[..t.len]);
                }
                packets.push((flags.contains(crate::wire::Flags::ACK_NOW), acked));
            }
            while let Some((_, wc)) = a.poll_completion() {
                assert_eq!(wc.status, WcStatus::Success);
                done += 1;
            }
            if done == writes {
                return (packets, timers);
            }
            if !moved {
                let next = [a.poll_timeout(), b.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                now = next.expect("nothing to send and no timer");
                a.handle_timeout(now);
                b.handle_timeout(now);
                timers += 1;
            }
        }
        panic!("the WRITEs never completed");
    }

    /// The 1-based numbers of the packets `one_per_batch` reported for which `pick` holds.
    fn numbers(packets: &[(bool, bool)], pick: impl Fn(&(bool, bool)) -> bool) -> Vec<usize> {
        (packets.iter().enumerate())
            .filter(|(_, p)| pick(p))
            .map(|(i, _)| i + 1)
            .collect()
    }

    #[test]
    fn a_receiver_acknowledges_every_ack_every_packets_and_the_last_at_once() {
        // 20 packets, a window wider than the message: only the last asks for an ACK (A has
        // nothing more to send), and B acknowledges after the 8th, the 16th and that one.
        let (packets, timers) = one_per_batch(write_pair(1, 64, 8, 20 * CHUNK, 1), 1);
        let asked = numbers(&packets, |p| p.0);
        let acked = numbers(&packets, |p| p.1);
        assert_eq!((asked, acked, timers), (vec![20], vec![8, 16, 20], 0));
        // Acknowledging every batch, as before coalescing: every packet.
        let (packets, _) = one_per_batch(write_pair(1, 64, 1, 20 * CHUNK, 1), 1);
        assert!(packets.iter().all(|p| p.1), "{packets:?}");
    }

    #[test]
    fn the_last_packet_a_window_lets_out_asks_for_an_ack_at_once() {
        // Window 5 packets, B coalescing 8: each window's last packet asks and is
        // acknowledged at once, so the 12 packets go without waiting for any timer.
        let (packets, timers) = one_per_batch(write_pair(1, 5, 8, 12 * CHUNK, 1), 1);
        assert_eq!(packets.len(), 12);
        let asked = numbers(&packets, |p| p.0);
        assert_eq!(asked, [5, 10, 12], "{packets:?}");
        assert!(packets.iter().all(|p| p.0 == p.1), "{packets:?}");
        assert_eq!(timers, 0);
    }

    #[test]
    fn an_ack_held_back_goes_when_its_delay_is_over() {
        // B gets the first 3 of 20 packets; the rest are lost. Its ACK for those waits
        // `ack_delay_ns` from the first, then goes.
        let (mut a, mut b, ea, _) = write_pair(1, 64, 8, 20 * CHUNK, 1);
        let delay = b.config().ack_delay_ns;
        let t0 = Timestamp::from_micros(1);
        let mut buf = vec![0u8; 2048];
        for k in 0..3 {
            let t = a.poll_transmit(t0, &mut buf).expect("a packet");
            b.handle_datagram(t0.add_nanos(k * 100), ea, 0, &buf[..t.len]);
            assert!(b.poll_transmit(t0, &mut buf).is_none(), "no ACK after {k}");
        }
        assert_eq!(b.poll_timeout(), Some(t0.add_nanos(delay)));
        let early = t0.add_nanos(delay - 1);
        b.handle_timeout(early);
        assert!(b.poll_transmit(early, &mut buf).is_none(), "early");
        let due = t0.add_nanos(delay);
        b.handle_timeout(due);
        let t = b.poll_transmit(due, &mut buf).expect("the ACK leaves");
        let p = crate::wire::Packet::parse(&buf[..t.len]).expect("a packet");
        let crate::wire::Body::Ack(ack) = p.body else {
            panic!("not an ACK: {p:?}");
        };
        // It covers the three: every PSN before the one after the third (the echoed one).
        assert_eq!(ack.cum_psn.wrapping_sub(ack.echo_psn), 1, "{ack:?}");
        assert!(b.poll_timeout().is_none_or(|t| t > due));
    }

    #[test]
    fn a_packet_out_of_order_is_acknowledged_at_once() {
        // 20 packets, B given the second first: that one (a hole before it) and the first
        // (filling it) are acknowledged at once; then B coalesces again: after 8 more in
        // order, 8 more, and the last (which asks).
        let (mut a, mut b, ea, _) = write_pair(1, 64, 8, 20 * CHUNK, 1);
        let t0 = Timestamp::from_micros(1);
        let mut buf = vec![0u8; 2048];
        let mut packets = Vec::new();
        while let Some(t) = a.poll_transmit(t0, &mut buf) {
            packets.push(buf[..t.len].to_vec());
        }
        assert_eq!(packets.len(), 20);
        packets.swap(0, 1);
        let mut acked = Vec::new();
        for (k, p) in packets.iter().enumerate() {
            b.handle_datagram(t0, ea, 0, p);
            if b.poll_transmit(t0, &mut buf).is_some() {
                acked.push(k + 1);
            }
        }
        assert_eq!(acked, [1, 2, 10, 18, 20]);
    }

    #[test]
    fn the_last_packet_of_a_write_asks_for_an_ack_though_more_follow() {
        // Three WRITEs of 5 packets queued at once: each one's last packet asks, so each
        // completes without waiting for the next one's packets.
        let (packets, timers) = one_per_batch(write_pair(1, 64, 8, 5 * CHUNK, 3), 3);
        let asked = numbers(&packets, |p| p.0);
        assert_eq!((asked, timers), (vec![5, 10, 15], 0));
        assert!(packets.iter().all(|p| p.0 == p.1), "{packets:?}");
    }
}
