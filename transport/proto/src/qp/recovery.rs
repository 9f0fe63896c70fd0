//! Loss recovery of a QP: the record of sent packets, ACK processing, time-based loss
//! detection (RACK-style, with a reordering window that widens when losses prove spurious),
//! the retransmit timeout and its backoff, RTT estimation and the retry budget.
use super::*;

/// Lower bound of the reordering window used by time-based loss detection, ns.
pub(crate) const REO_WND_MIN_NS: u64 = 20_000;
/// Largest multiplier of the reordering window (it grows when losses prove spurious). High
/// enough that the cap in `reorder_window_ns` (the smoothed RTT plus four deviations, at least
/// the RTO floor) is what bounds the window, as SRTT bounds RACK's (RFC 8985 §6.2): with
/// spraying, reordering spans the queueing spread between paths, which a multiple of a
/// quarter of the *minimum* RTT does not follow.
pub(crate) const REO_MULT_MAX: u32 = 1024;
/// Packets acknowledged without a spurious loss before the reordering window shrinks a step.
pub(crate) const REO_DECAY_ACKS: u32 = 4096;
/// Packets a retransmit timeout sends again as a probe.
pub(crate) const RTO_PROBE_PACKETS: usize = 2;
/// Most retransmitted packets kept waiting for a duplicate flag to prove their loss spurious.
pub(crate) const MAX_UNRESOLVED_LOSSES: usize = 64;
/// Largest RTO backoff exponent.
pub(crate) const MAX_BACKOFF_SHIFT: u32 = 10;

#[derive(Debug)]
pub(crate) enum SentWhat {
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
    /// A READ response sent from a region deregistered since (see `revoke`): it cannot be
    /// built again, so should it need resending, the READ is refused instead.
    Revoked {
        msn: u32,
    },
}

#[derive(Debug)]
pub(crate) struct SentPkt {
    pub(crate) psn: u32,
    pub(crate) what: SentWhat,
    pub(crate) send_ts: Timestamp,
    /// The transmit batch of the latest copy ([`crate::departure`]).
    pub(crate) batch: u32,
    pub(crate) path: u8,
    pub(crate) wire_len: u32,
    pub(crate) acked: bool,
    /// Declared lost and not yet sent again (in `rtx` or `held`).
    pub(crate) lost: bool,
    /// Sent more than once: an acknowledgement may be for an earlier copy.
    pub(crate) retransmitted: bool,
    /// Path and send time of the first copy, to tell which copy an ACK's echo measured.
    pub(crate) first_path: u8,
    pub(crate) first_ts: Timestamp,
    pub(crate) hold_until: Timestamp,
    /// Its loss was reported to the controller, for the transmission sent at this time.
    pub(crate) cc_loss_ts: Option<Timestamp>,
}

impl SentPkt {
    /// A record to push and then fill in place (`Qp::send_new`'s record of a new packet).
    pub(crate) const BLANK: SentPkt = SentPkt {
        psn: 0,
        what: SentWhat::Revoked { msn: 0 },
        send_ts: Timestamp::ZERO,
        batch: 0,
        path: 0,
        wire_len: 0,
        acked: false,
        lost: false,
        retransmitted: false,
        first_path: 0,
        first_ts: Timestamp::ZERO,
        hold_until: Timestamp::ZERO,
        cc_loss_ts: None,
    };
}

/// What one ACK frame says beyond which packets arrived: the measurement for the packet it
/// echoes, and whether new CE marks were reported.
#[derive(Copy, Clone, Debug)]
pub(crate) struct AckFeedback {
    /// Send time of the newest packet the peer accepted (`u64::MAX` when unknown).
    pub(crate) echo_ts_ns: u64,
    pub(crate) echo_psn: u32,
    /// Logical path of the echoed copy of the packet, if known.
    pub(crate) echo_path: u8,
    pub(crate) echo_known: bool,
    /// The echo measured the packet's latest transmission (not an earlier copy that arrived
    /// late, after the packet was declared lost and sent again on another path).
    pub(crate) echo_latest: bool,
    /// Full round trip and fabric delay (holding time removed) of the echoed packet.
    pub(crate) rtt_ns: Option<u64>,
    pub(crate) fabric_ns: Option<u64>,
    /// The same delay counted from the echoed packet's write rather than its departure: what
    /// path scoring compares ([`crate::departure`]).
    pub(crate) path_fabric_ns: Option<u64>,
    /// Hop telemetry of the echoed packet: the largest queueing delay of one hop, ns.
    pub(crate) hop_ns: Option<u64>,
    /// The ACK reported CE marks not seen before.
    pub(crate) ce: bool,
    /// The packets this frame newly acknowledged, gathered for the controller, which hears
    /// of them once per frame ([`Qp::feed_controller`]).
    pub(crate) batch: AckedBatch,
}

/// Newly acknowledged packets of one ACK frame, gathered for the controller.
#[derive(Copy, Clone, Debug)]
pub(crate) struct AckedBatch {
    /// How many, and their bytes on the wire.
    packets: u32,
    bytes: u64,
    /// The earliest send time among them.
    oldest: Timestamp,
    /// The first one's path (the sample's path when the batch carries the frame's delay).
    path: u16,
}

impl AckedBatch {
    const EMPTY: AckedBatch = AckedBatch {
        packets: 0,
        bytes: 0,
        oldest: Timestamp::ZERO,
        path: 0,
    };

    fn add(&mut self, a: &Acked) {
        if self.packets == 0 {
            self.oldest = a.send_ts;
            self.path = a.path;
        } else {
            self.oldest = self.oldest.min(a.send_ts);
        }
        self.packets += 1;
        self.bytes += u64::from(a.wire_len);
    }
}

/// What the rest of ACK processing needs of a packet just marked acknowledged.
#[derive(Copy, Clone, Debug)]
struct Acked {
    send_ts: Timestamp,
    wire_len: u32,
    psn: u32,
    path: u16,
    /// Its loss had been declared, or an earlier copy than the latest arrived.
    spurious: bool,
    /// The loss the controller heard of, to undo (a spurious one).
    undo: Option<Timestamp>,
}

/// Reliability of what this QP sends: sequence numbers, the sent-packet record, loss detection and the retransmit timer.
pub(crate) struct Recovery {
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
    pub(crate) rack_ts: Timestamp,
    /// Round trip of the packet that set `rack_ts`: it includes the queueing that packets
    /// sent around the same time meet, which a smoothed RTT averages away.
    pub(crate) rack_rtt_ns: u64,
    /// When the reorder timer of loss detection fires.
    pub(crate) reorder_deadline: Option<Timestamp>,
    pub(crate) reo_mult: u32,
    pub(crate) reo_bumped_at: Timestamp,
    pub(crate) acks_since_spurious: u32,
    pub(crate) peer_ce_seen: CeCount,
    pub(crate) last_echo: (u32, u64),
    /// Retransmitted packets (whose loss the controller heard of) acknowledged without proof
    /// of which copy arrived: the loss send times, oldest first, for duplicate flags to prove
    /// spurious (at most [`MAX_UNRESOLVED_LOSSES`]).
    pub(crate) unresolved_losses: VecDeque<Timestamp>,
    /// Duplicate flags expected for retransmissions already proven spurious.
    pub(crate) dup_expected: u32,
    /// When the last counted retransmit timeout fired, and the interval it was armed for: a
    /// delay sample of a packet sent before it and outstanding for longer than that interval
    /// spans the silence that fired it (a stalled peer) and is not a measurement
    /// ([`crate::stall`]).
    pub(crate) rto_at: Timestamp,
    pub(crate) rto_armed_ns: u64,
}

impl AckFeedback {
    /// No measurement (a NAK acknowledging a response, for instance).
    pub(crate) const NONE: AckFeedback = AckFeedback {
        echo_ts_ns: u64::MAX,
        echo_psn: 0,
        echo_path: 0,
        echo_known: false,
        echo_latest: false,
        rtt_ns: None,
        fabric_ns: None,
        path_fabric_ns: None,
        hop_ns: None,
        ce: false,
        batch: AckedBatch::EMPTY,
    };
}

#[derive(Debug, Default)]
pub(crate) struct Rtt {
    pub(crate) srtt_ns: u64,
    pub(crate) rttvar_ns: u64,
    pub(crate) min_ns: u64,
    pub(crate) samples: u64,
}

impl Rtt {
    pub(crate) fn sample(&mut self, rtt: u64) {
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

impl Recovery {
    pub(crate) fn new(psn: Psn) -> Recovery {
        Recovery {
            next_psn: psn,
            snd_una: psn,
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
            rack_ts: Timestamp::ZERO,
            rack_rtt_ns: 0,
            reorder_deadline: None,
            reo_mult: 1,
            reo_bumped_at: Timestamp::ZERO,
            acks_since_spurious: 0,
            peer_ce_seen: CeCount(0),
            last_echo: (0, 0),
            unresolved_losses: VecDeque::new(),
            dup_expected: 0,
            rto_at: Timestamp::ZERO,
            rto_armed_ns: u64::MAX,
        }
    }
}

impl Qp {
    pub(crate) fn rto_ns(&self, cfg: &EndpointConfig) -> u64 {
        let base = if self.rec.rtt.samples == 0 {
            cfg.rto_initial_ns
        } else {
            self.rec.rtt.srtt_ns + (4 * self.rec.rtt.rttvar_ns).max(10_000)
        };
        let base = base.clamp(cfg.rto_min_ns, cfg.rto_max_ns);
        (base << self.rec.backoff.min(MAX_BACKOFF_SHIFT)).min(cfg.rto_max_ns)
    }
    /// Bookkeeping for one packet newly acknowledged: it leaves the flight, the loss
    /// detector learns whether its loss (if it was declared lost) was spurious, path scoring
    /// hears of it, it joins the frame's batch for the controller (`fb.batch`, handed over by
    /// [`feed_controller`](Qp::feed_controller)), and its work request has one packet less
    /// to wait for. `fb.echo_ts_ns` is the send time of the newest packet the peer accepted,
    /// from the ACK (`u64::MAX` when unknown, as for a NAK).
    pub(crate) fn packet_acked(&mut self, i: usize, now: Timestamp, fb: &mut AckFeedback) {
        let Some(a) = self.mark_acked(i, now, fb.echo_ts_ns) else {
            return;
        };
        if let Some(lost_sent_at) = a.undo {
            self.cc.on_spurious_loss(now, lost_sent_at);
        }
        self.track_reordering(now, a.spurious);
        self.score_paths(now, &a, fb);
        fb.batch.add(&a);
        if let SentWhat::Req { msn, .. } = self.rec.sent[i].what
            && let Some(w) = self.wqe_index(msn)
        {
            let w = &mut self.req.sq[w];
            w.unacked_pkts = w.unacked_pkts.saturating_sub(1);
        }
    }

    /// Marks packet `i` acknowledged (`None` if it already was): takes it out of the flight,
    /// tells which copy arrived, keeps what a later duplicate flag needs, and advances the
    /// RACK time.
    fn mark_acked(&mut self, i: usize, now: Timestamp, echo_ts_ns: u64) -> Option<Acked> {
        let min_rtt_ns = self.rec.rtt.min_ns;
        let p = &mut self.rec.sent[i];
        if p.acked {
            return None;
        }
        p.acked = true;
        if !p.lost {
            self.rec.in_flight_bytes = self
                .rec
                .in_flight_bytes
                .saturating_sub(u64::from(p.wire_len));
            self.rec.in_flight_pkts = self.rec.in_flight_pkts.saturating_sub(1);
        }
        // Was the retransmission what arrived, or an earlier copy? The peer echoes the send
        // time of the newest packet it accepted, and it never accepts a duplicate: an echo
        // older than the retransmission, or an acknowledgement sooner than any round trip
        // after it, means an earlier copy arrived (the loss was spurious, as Eifel detects for
        // TCP). The retransmission time then says nothing about what was delivered, so it must
        // not advance the RACK time, or everything sent before it would look lost.
        let ambiguous = p.retransmitted
            && (echo_ts_ns < p.send_ts.as_nanos() || now.nanos_since(p.send_ts) < min_rtt_ns);
        let spurious = p.lost || ambiguous;
        self.counters.spurious_losses += u64::from(p.lost);
        self.counters.spurious_retransmits += u64::from(ambiguous);
        p.lost = false;
        // The controller heard of this packet's loss; the original arrived after all, so the
        // decrease it caused may be undone.
        let cc_loss_ts = p.cc_loss_ts.take();
        let acked = Acked {
            send_ts: p.send_ts,
            wire_len: p.wire_len,
            psn: p.psn,
            path: u16::from(p.path),
            spurious,
            undo: cc_loss_ts.filter(|_| spurious),
        };
        if p.retransmitted && cc_loss_ts.is_some() {
            self.expect_duplicate_flag(ambiguous, spurious, cc_loss_ts);
        }
        if !ambiguous && acked.send_ts >= self.rec.rack_ts {
            self.rec.rack_ts = acked.send_ts;
            self.rec.rack_rtt_ns = now.nanos_since(acked.send_ts);
        }
        Some(acked)
    }

    /// A retransmitted packet whose loss the controller heard of was acknowledged: if the
    /// echo proved an earlier copy arrived, the retransmission will reach the peer as a
    /// duplicate and its flag is expected; if which copy arrived is unknown, a later
    /// duplicate flag may tell, so the loss is kept for it.
    fn expect_duplicate_flag(
        &mut self,
        ambiguous: bool,
        spurious: bool,
        cc_loss_ts: Option<Timestamp>,
    ) {
        if ambiguous {
            self.rec.dup_expected = self.rec.dup_expected.saturating_add(1);
        } else if !spurious {
            if self.rec.unresolved_losses.len() == MAX_UNRESOLVED_LOSSES {
                self.rec.unresolved_losses.pop_front();
            }
            self.rec.unresolved_losses.extend(cc_loss_ts);
        }
    }

    /// The reordering window widens when a loss proves spurious and shrinks a step after
    /// [`REO_DECAY_ACKS`] acknowledgements without one.
    fn track_reordering(&mut self, now: Timestamp, spurious: bool) {
        if spurious {
            self.widen_reorder_window(now);
        } else {
            self.rec.acks_since_spurious += 1;
            if self.rec.acks_since_spurious >= REO_DECAY_ACKS {
                self.rec.acks_since_spurious = 0;
                self.rec.reo_mult = (self.rec.reo_mult / 2).max(1);
            }
        }
    }

    /// Path scoring hears about every packet; the echoed one carries the measurements (and a
    /// measurement of an earlier copy goes to the path that copy left on).
    fn score_paths(&mut self, now: Timestamp, a: &Acked, fb: &AckFeedback) {
        let mut sample = AckSample::new(a.send_ts, a.wire_len);
        sample.path = a.path;
        let echoed = a.psn == fb.echo_psn && fb.rtt_ns.is_some();
        if echoed && fb.echo_latest {
            sample.rtt_ns = fb.rtt_ns;
            sample.fabric_delay_ns = fb.path_fabric_ns;
            sample.ecn_ce = Some(fb.ce);
        }
        self.route.paths.on_ack(now, &sample);
        if echoed && fb.echo_known && !fb.echo_latest {
            // The echo measured an earlier copy, on the path it left on.
            let mut late = AckSample::new(Timestamp::from_nanos(fb.echo_ts_ns), a.wire_len);
            late.path = u16::from(fb.echo_path);
            late.rtt_ns = fb.rtt_ns;
            late.fabric_delay_ns = fb.path_fabric_ns;
            late.ecn_ce = Some(fb.ce);
            self.route.paths.on_late_copy(now, &late);
        }
    }

    /// Hands the packets one frame newly acknowledged (`fb.batch`) to the controller in
    /// one call: their bytes, the earliest send time, and the frame's delay seen through the
    /// connection-wide signal (one slow path alone does not shrink the window). Once per
    /// frame rather than once per packet: a window's growth is per byte acknowledged either
    /// way, and a decrease is at most one per round trip.
    pub(crate) fn feed_controller(&mut self, now: Timestamp, fb: &mut AckFeedback) {
        let b = std::mem::replace(&mut fb.batch, AckedBatch::EMPTY);
        if b.packets == 0 {
            return;
        }
        let bytes = u32::try_from(b.bytes).unwrap_or(u32::MAX);
        let mut sample = AckSample::new(b.oldest, bytes);
        sample.path = b.path;
        if fb.echo_known
            && let (Some(rtt), Some(fabric)) = (fb.rtt_ns, fb.fabric_ns)
        {
            sample.rtt_ns = Some(rtt);
            sample.fabric_delay_ns = Some(self.route.paths.cc_delay_ns(
                now,
                u16::from(fb.echo_path),
                fabric,
            ));
            // Marked: the delay includes a queue, and must not become the base delay.
            sample.ecn_ce = Some(fb.ce);
            sample.hop_queue_ns = fb.hop_ns;
        }
        self.cc.on_ack_with(now, &sample);
    }
    pub(crate) fn on_ack(
        &mut self,
        now: Timestamp,
        a: &wire::Ack,
        flags: u8,
        hop: u16,
        sh: &mut Shared,
    ) {
        if self.state != QpState::Connected {
            return;
        }
        let dup_flag = flags & wire::FLAG_DUPLICATE != 0;
        if dup_flag {
            self.counters.duplicates_reported += 1;
            self.widen_reorder_window(now);
        }
        // The cumulative point must lie within what was sent. One behind `snd_una` is an
        // older ACK overtaken by a newer one (normal with spraying): its SACK bits still count.
        let cum = Psn(a.cum_psn);
        let adv = if cum.le(self.rec.snd_una) {
            0 // stale
        } else {
            cum.since(self.rec.snd_una)
        };
        if adv > self.rec.next_psn.since(self.rec.snd_una) {
            sh.stats.rx_bad_response += 1;
            return;
        }
        // Any consistent ACK, even one that acknowledges nothing new (the answer to a probe
        // that arrived as a duplicate), shows the peer alive: the retry budget starts over.
        self.rec.retry.heard();
        let mut fb = AckFeedback {
            echo_ts_ns: a.echo_ts_ns,
            echo_psn: a.echo_psn,
            ..AckFeedback::NONE
        };
        let ce_new = self.ack_ce(a, &mut fb);
        self.ack_rtt(now, a, &mut fb, sh);
        if fb.fabric_ns.is_some() {
            fb.hop_ns = wire::decode_hop_queue(hop);
        }
        self.charge_ce(a.echo_psn, ce_new, sh);
        let newest = self.ack_packets(now, a, adv, &mut fb);
        self.feed_controller(now, &mut fb);
        if dup_flag {
            self.duplicate_proves_spurious(now);
        }
        if fb.ce && !self.route.paths.is_outlier(u16::from(fb.echo_path)) {
            self.cc.on_congestion_event(now, now, true, 0);
        }
        self.route
            .paths
            .set_delay_target_ns(self.cc.target_delay_ns());
        self.repath(sh);
        self.release_acked();
        if newest.is_some() {
            self.made_progress();
            self.detect_losses(now, sh);
            self.rearm_rto(now, sh);
        }
        self.complete_sq(sh);
        if self.rec.in_flight_pkts == 0 && !self.has_new_work() {
            self.cc.on_idle(now);
        }
        self.settle_fence(sh);
    }

    /// Drops the acknowledged packets at the front of the sent record, advancing `snd_una`
    /// past them.
    pub(crate) fn release_acked(&mut self) {
        while self.rec.sent.front().is_some_and(|p| p.acked) {
            self.rec.sent.pop_front();
            self.rec.snd_una += 1;
        }
    }

    /// New CE marks the ACK reports (its counter is cumulative and wraps); flags them in `fb`.
    fn ack_ce(&mut self, a: &wire::Ack, fb: &mut AckFeedback) -> u32 {
        // ECN echo: new CE marks since the last ACK (a wrapping counter).
        let peer_ce = CeCount(a.ce_count);
        if self.rec.peer_ce_seen.lt(peer_ce) {
            let ce = peer_ce.since(self.rec.peer_ce_seen);
            self.rec.peer_ce_seen = peer_ce;
            self.counters.ce_marks += u64::from(ce);
            fb.ce = true;
            return ce;
        }
        0
    }

    /// The RTT sample of the ACK's echoed timestamp (the receiver's holding time removed),
    /// charged to the path of the copy it measured.
    fn ack_rtt(&mut self, now: Timestamp, a: &wire::Ack, fb: &mut AckFeedback, sh: &mut Shared) {
        // RTT from the echoed timestamp, minus the receiver's holding time.
        if (a.echo_psn, a.echo_ts_ns) != self.rec.last_echo
            && a.echo_ts_ns != 0
            && a.echo_ts_ns <= now.as_nanos()
        {
            self.rec.last_echo = (a.echo_psn, a.echo_ts_ns);
            let full = (now.as_nanos() - a.echo_ts_ns).max(1);
            if self.sample_spans_a_stall(now, a.echo_ts_ns, full, sh) {
                return;
            }
            // Which copy the echo measured: a packet declared lost and sent again on another
            // path may still arrive first through the slow path it left on. Its delay belongs
            // to that path, not to the retransmission's, or one slow path's queue shows up on
            // the fast paths (and in the controller) every time it causes a spurious loss.
            let copy = self.sent_index(a.echo_psn).and_then(|i| {
                let p = &self.rec.sent[i];
                if a.echo_ts_ns == p.send_ts.as_nanos() {
                    Some((p.path, Some(p.batch)))
                } else if a.echo_ts_ns == p.first_ts.as_nanos() {
                    Some((p.first_path, None))
                } else {
                    None
                }
            });
            // The receiver's holding time counts from the data's arrival there (its kernel
            // receive timestamp), so it covers the time the peer took to pick the data up.
            let hold = u64::from(a.hold_ns);
            let rtt = full.saturating_sub(hold).max(1);
            // The controller's delay is the network's share: from the departure of the
            // latest copy (when its batch's send returned, if the runtime said) to the ACK's
            // arrival at this host (not to when the engine got to it), less that holding
            // time. What either host took to send or to pick up its datagrams is its own
            // delay, not the fabric's (Swift keeps such host delay apart from the fabric's).
            let built = Timestamp::from_nanos(a.echo_ts_ns);
            let left = match copy {
                Some((_, Some(batch))) => sh.departures.left(batch, built),
                _ => built,
            };
            let arrived = sh.rx_at.min(now);
            let since = |start: Timestamp| {
                arrived
                    .max(start)
                    .nanos_since(start)
                    .saturating_sub(hold)
                    .max(1)
            };
            // The retransmit timeout must outlast everything the sender waits for, the
            // hosts' delays included: its estimate takes the whole round trip.
            self.rec.rtt.sample(full);
            self.rec.rtt_hist.record(rtt);
            sh.rtt_hist.record(rtt);
            fb.rtt_ns = Some(full);
            fb.fabric_ns = Some(since(left));
            fb.path_fabric_ns = Some(since(built));
            fb.echo_path = copy.map_or(0, |c| c.0);
            fb.echo_known = copy.is_some();
            fb.echo_latest = copy.is_some_and(|c| c.1.is_some());
            if let Some((path, _)) = copy {
                let path = usize::from(path);
                for ps in [&mut sh.paths[path], &mut self.counters.path_stats[path]] {
                    ps.srtt_ns = if ps.rtt_samples == 0 {
                        rtt
                    } else {
                        (7 * ps.srtt_ns + rtt) / 8
                    };
                    ps.rtt_samples += 1;
                }
            }
        }
    }

    /// Whether the delay sample of a packet sent at `sent_ns` and acknowledged now (`full`
    /// ns) measured a stall rather than the network ([`crate::stall`]): this host's own (it
    /// covers a quarter of the sample or more), or the peer's (the packet was outstanding for
    /// longer than a counted retransmit timeout that fired meanwhile). Such a sample feeds
    /// neither the RTT estimate nor path scoring nor the controller.
    pub(crate) fn sample_spans_a_stall(
        &mut self,
        now: Timestamp,
        sent_ns: u64,
        full: u64,
        sh: &mut Shared,
    ) -> bool {
        let local = sh.stall.taints(sent_ns, now);
        let remote = sent_ns < self.rec.rto_at.as_nanos() && full > self.rec.rto_armed_ns;
        if local || remote {
            sh.stats.stalled_samples += 1;
        }
        local || remote
    }

    fn charge_ce(&mut self, echo_psn: u32, ce_new: u32, sh: &mut Shared) {
        // New CE marks are charged to the echoed packet's path: the ACK carries one counter,
        // and the echoed packet is the newest one it reports on.
        if ce_new != 0
            && let Some(i) = self.sent_index(echo_psn)
        {
            let path = usize::from(self.rec.sent[i].path);
            for ps in [&mut sh.paths[path], &mut self.counters.path_stats[path]] {
                ps.ce_marks += u64::from(ce_new);
            }
        }
    }

    /// Marks what the ACK acknowledges (the `adv` packets before its cumulative point, then
    /// its SACK bits); the index of the last packet newly acknowledged.
    fn ack_packets(
        &mut self,
        now: Timestamp,
        a: &wire::Ack,
        adv: u32,
        fb: &mut AckFeedback,
    ) -> Option<usize> {
        let mut newest = None;
        for i in 0..(adv as usize).min(self.rec.sent.len()) {
            if !self.rec.sent[i].acked {
                self.packet_acked(i, now, fb);
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
                    && !self.rec.sent[i].acked
                {
                    self.packet_acked(i, now, fb);
                    newest = Some(i);
                }
            }
        }
        newest
    }
    /// Time-based loss detection (RACK): a packet sent a reordering window before the newest
    /// delivered one is lost; so is one sent before it that stays unacknowledged a round trip
    /// plus the reordering window after it left (the reorder timer, which catches losses at
    /// the tail of a burst without waiting for the retransmit timeout). With spraying,
    /// reordering is normal, so counting duplicate ACKs would be wrong.
    pub(crate) fn detect_losses(&mut self, now: Timestamp, sh: &mut Shared) {
        let reo = self.reorder_window_ns(&sh.cfg);
        let rack = self.rec.rack_ts.as_nanos();
        // Datagrams stamped together leave and land over tens of microseconds (one stamp per
        // batch, then a batched send and a batched receive), so the reorder timer waits at
        // least a smoothed RTT plus four deviations, not only the last packet's RTT.
        let wait = self
            .rec
            .rack_rtt_ns
            .max(self.rec.rtt.srtt_ns + 4 * self.rec.rtt.rttvar_ns)
            + reo;
        let mut next: Option<u64> = None;
        for i in 0..self.rec.sent.len() {
            let p = &mut self.rec.sent[i];
            if p.first_ts.as_nanos() > rack {
                // First sent after the RACK time, and so was every later packet (first sends
                // go out in sequence order, on a clock that does not go back), and a copy is
                // never older than its first: the in-flight tail needs no visit.
                break;
            }
            let sent = p.send_ts.as_nanos();
            if p.acked || p.lost || sent > rack {
                continue;
            }
            // The timer runs from when the packet left, if the runtime said when its batch's
            // send returned ([`crate::departure`]), not from when it was built: the last
            // datagrams of a batch leave up to the whole send's duration after their stamp
            // (about 100 µs for 64 frames through AF_XDP's copy mode on a veth pair), and
            // timed from the stamp they were declared lost while still on their way. The
            // comparison with the RACK packet stays on build times: packets of one batch
            // share their stamp.
            let left = sh.departures.left(p.batch, p.send_ts).as_nanos();
            if sent + reo >= rack && left + wait > now.as_nanos() {
                next = Some(next.map_or(left + wait, |n| n.min(left + wait)));
                continue;
            }
            self.declare_lost(i, now, true, sh);
        }
        self.rec.reorder_deadline = next.map(Timestamp::from_nanos);
    }

    /// Declares packet `i` lost: it leaves the flight and queues for retransmission, its
    /// path is charged, and (if `charge_cc` and the path is not an outlier that path scoring
    /// handles alone) the controller hears of a congestion event.
    pub(crate) fn declare_lost(
        &mut self,
        i: usize,
        now: Timestamp,
        charge_cc: bool,
        sh: &mut Shared,
    ) {
        let p = &mut self.rec.sent[i];
        p.lost = true;
        let (psn, path, len, ts) = (p.psn, p.path, p.wire_len, p.send_ts);
        self.rec.in_flight_bytes = self.rec.in_flight_bytes.saturating_sub(u64::from(len));
        self.rec.in_flight_pkts = self.rec.in_flight_pkts.saturating_sub(1);
        self.rec.rtx.push_back(psn);
        sh.paths[usize::from(path)].lost += 1;
        self.counters.path_stats[usize::from(path)].lost += 1;
        self.route.paths.on_loss(now, u16::from(path), ts);
        if charge_cc && !self.route.paths.is_outlier(u16::from(path)) {
            self.rec.sent[i].cc_loss_ts = Some(ts);
            self.cc.on_congestion_event(now, ts, false, len);
        }
    }
    /// The peer flagged a duplicate: one retransmission was unnecessary. Unless it is the one
    /// of a packet already proven spurious by the echoed timestamp, it is charged to the oldest
    /// retransmitted packet acknowledged without saying which copy arrived, and the
    /// controller may undo that loss. (A copy the network duplicated looks the same to the
    /// peer; that is the price of a flag that names no packet.)
    pub(crate) fn duplicate_proves_spurious(&mut self, now: Timestamp) {
        if self.rec.dup_expected > 0 {
            self.rec.dup_expected -= 1;
        } else if let Some(lost_sent_at) = self.rec.unresolved_losses.pop_front() {
            self.counters.spurious_retransmits += 1;
            self.cc.on_spurious_loss(now, lost_sent_at);
        }
    }
    /// A loss proved spurious (the peer saw a duplicate, or an acknowledgement came for the
    /// copy before a retransmission): doubles the reordering window, at most once per RTT.
    pub(crate) fn widen_reorder_window(&mut self, now: Timestamp) {
        self.rec.acks_since_spurious = 0;
        if now >= self.rec.reo_bumped_at.add_nanos(self.rec.rtt.srtt_ns) {
            self.rec.reo_mult = (self.rec.reo_mult * 2).min(REO_MULT_MAX);
            self.rec.reo_bumped_at = now;
        }
    }
    /// How much later than a delivered packet an undelivered one may still arrive: a quarter
    /// of the minimum RTT, scaled up while losses keep proving spurious, and never more than
    /// the larger of the RTT's smoothed value plus four deviations and the RTO floor (a
    /// software stack on busy cores reorders by scheduling delays, not only by paths).
    pub(crate) fn reorder_window_ns(&self, cfg: &EndpointConfig) -> u64 {
        let cap = (self.rec.rtt.srtt_ns + 4 * self.rec.rtt.rttvar_ns).max(cfg.rto_min_ns);
        (self.rec.rtt.min_ns / 4 * u64::from(self.rec.reo_mult))
            .max(REO_WND_MIN_NS)
            .min(cap)
    }
    pub(crate) fn rearm_rto(&mut self, now: Timestamp, sh: &Shared) {
        let waiting = self.awaits_response();
        self.rec.rto_deadline =
            (self.rec.in_flight_pkts > 0 || waiting).then(|| now.add_nanos(self.rto_ns(&sh.cfg)));
    }
    /// The QP's timers at `now`: an ACK coalescing held back that is due, RNR holds that
    /// ended, the reorder timer of loss detection, then the retransmit timeout.
    pub(crate) fn on_timeout(&mut self, now: Timestamp, sh: &mut Shared) {
        if self.state != QpState::Connected {
            return;
        }
        if self.rsp.fence_deadline.is_some_and(|d| d <= now) {
            // The packets before a fatal refusal did not come: the QP fails (its receives
            // and its own requests flush). Failed by the wait, not at the fence: a packet
            // from before the fence that comes after all is answered as by any failed QP (a
            // remote operation error), not acknowledged as one it already had.
            self.rsp.fence_deadline = None;
            self.rsp.order.fence = None;
            self.enter_error(sh);
            return;
        }
        self.ack_timer(now);
        self.release_held(now);
        if self.rec.reorder_deadline.is_some_and(|d| d <= now) {
            self.detect_losses(now, sh);
        }
        if let Some(deadline) = self.rec.rto_deadline
            && now >= deadline
        {
            self.on_rto(now, deadline, sh);
        }
    }

    /// Packets held back by an RNR NAK whose wait is over queue for retransmission (and
    /// those acknowledged meanwhile, or gone, are dropped from the hold).
    fn release_held(&mut self, now: Timestamp) {
        let mut i = 0;
        while i < self.rec.held.len() {
            let psn = self.rec.held[i];
            match self.sent_index(psn) {
                Some(s) if self.rec.sent[s].hold_until > now && !self.rec.sent[s].acked => i += 1,
                Some(s) => {
                    self.rec.held.swap_remove(i);
                    if !self.rec.sent[s].acked {
                        self.rec.rtx.push_back(psn);
                    }
                }
                None => {
                    self.rec.held.swap_remove(i);
                }
            }
        }
    }

    /// The retransmit timer armed for `deadline` fired: charge the retry budget (failing
    /// the QP once it is spent), then probe with the oldest outstanding packets.
    fn on_rto(&mut self, now: Timestamp, deadline: Timestamp, sh: &mut Shared) {
        // Nothing outstanding (the last packet probed needed no resending: its work request had
        // completed, as a READ does when its response arrives before the request's ACK): no
        // timeout to count. Counting it would fail an idle QP `retry_limit` timeouts later.
        let waiting = self.awaits_response();
        if self.rec.in_flight_pkts == 0 && self.rec.rtx.is_empty() && !waiting {
            self.rec.rto_deadline = None;
            return;
        }
        sh.stats.rto_fired += 1;
        self.counters.rtos += 1;
        // The interval this timer was armed for (the backoff has not moved since), and whether
        // the probe below finds anything old enough to send again.
        let rto = self.rto_ns(&sh.cfg);
        let resends = self
            .rec
            .sent
            .iter()
            .any(|p| !p.acked && !p.lost && p.send_ts.add_nanos(rto) <= now);
        let charge = Timeout::classify(
            now.as_nanos(),
            deadline.as_nanos(),
            rto,
            resends,
            waiting && self.rec.in_flight_pkts == 0,
        );
        let counted = charge == Timeout::Counted;
        if counted && self.rec.retry.charge(rto, &sh.cfg) {
            // The oldest unfinished work request gets the error (a READ waiting for its
            // response counts, though none of its packets is unacknowledged); the rest are
            // flushed, so the statuses read in posting order as verbs users expect.
            if let Some(i) = self.req.sq.iter().position(|w| !w.is_done()) {
                self.req.sq[i].status = Some(WcStatus::RetryExceeded);
            }
            self.enter_error(sh);
            return;
        }
        // A late timeout (this host stalled) probes too, but says nothing about the network:
        // no window cut, no re-path, no backoff.
        if counted {
            self.cc.on_retransmit_timeout(now);
            self.rec.rto_at = now;
            self.rec.rto_armed_ns = rto;
        }
        self.send_rto_probes(now, rto, counted, sh);
        if waiting {
            self.queue_reask();
        }
        if counted {
            self.rec.backoff = (self.rec.backoff + 1).min(MAX_BACKOFF_SHIFT);
        }
        self.rec.rto_deadline = Some(now.add_nanos(self.rto_ns(&sh.cfg)));
    }

    /// Probes with the oldest outstanding packets only (as RACK-TLP does): if the tail was
    /// really lost, their acknowledgement lets time-based detection declare the rest; if the
    /// timeout was spurious (a stalled receiver), it costs a duplicate or two instead of the
    /// whole window. A `counted` timeout also re-paths the first probe's path and tells the
    /// controller of the losses.
    fn send_rto_probes(&mut self, now: Timestamp, rto: u64, counted: bool, sh: &mut Shared) {
        let mut probes = 0;
        for i in 0..self.rec.sent.len() {
            if probes == RTO_PROBE_PACKETS {
                break;
            }
            let p = &self.rec.sent[i];
            if p.acked || p.lost || p.send_ts.add_nanos(rto) > now {
                continue;
            }
            if probes == 0 && counted {
                // A timeout suggests this path swallows packets: re-path it.
                self.route.paths.request_repath(u16::from(p.path));
            }
            probes += 1;
            self.declare_lost(i, now, counted, sh);
        }
    }

    pub(crate) fn made_progress(&mut self) {
        self.rec.retry.heard();
        self.rec.backoff = 0;
    }
}
