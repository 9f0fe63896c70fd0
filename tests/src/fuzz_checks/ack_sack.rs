//! The `ack_sack` target: a sender driven by crafted ACKs and NAKs, and `RecvTracker`
//! against a naive model. The sender runs under the simulator's driver
//! ([`peer_wire`](super::peer_wire)), which hands it the crafted datagrams, runs its timers and
//! takes as many datagrams as the input polls.
use super::peer_wire::{self, Completions, ENGINE, PeerWire, settle};
use super::*;
use braid::testing::sim::Driver;

/// Most operations one [`ack_sack`] input runs.
const MAX_ACK_OPS: usize = 512;
/// Bytes of the sender's source region.
const ACK_SRC_LEN: usize = 16 * 1024;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum AckWrKind {
    Write,
    Send,
    Read,
}

/// A work request of the sender under test.
#[derive(Debug)]
struct AckWr {
    wr_id: u64,
    kind: AckWrKind,
    len: u32,
    src_off: u32,
    signaled: bool,
    msn: u32,
}

/// One data packet the sender emitted (PSN relative to its first).
#[derive(Debug)]
struct AckPkt {
    msn: u32,
    offset: u32,
    len: u32,
    wire_len: u32,
    send_ts: u64,
}

/// A QP whose peer is the fuzz input: it sends WRITEs, SENDs and READs, and hears only the
/// crafted ACKs and NAKs.
struct Sender {
    /// The sender, on the driver's host [`ENGINE`], and the driver's clock.
    d: Driver<PeerWire>,
    /// Its completions, as the driver handed them over, not yet checked.
    done: Completions,
    qp: QpInfo,
    cq: CqId,
    start: Timestamp,
    src_lkey: u32,
    land_lkey: u32,
    src: Vec<u8>,
    max_datagram: usize,
    rto_bounds: (u64, u64),
    wrs: Vec<AckWr>,
    pending: VecDeque<usize>,
    next_msn: u32,
    pkts: HashMap<u32, AckPkt>,
    next_rel: u32,
    /// Largest cumulative point any ACK gave (relative, when below 2^31).
    cum_cover: u32,
    /// PSNs (relative) some ACK's SACK bitmap named.
    sacked: HashSet<u32>,
    /// (msn, syndrome) of every NAK fed.
    naks: HashSet<(u32, u8)>,
    new_pkts: u64,
    rtx_pkts: u64,
    ce: u32,
}

impl Sender {
    fn new(config: u8) -> Sender {
        let cfg = EndpointConfig {
            seed: 0xac4_5ac4,
            paths: [1, 2, 4, 16][usize::from(config & 3)],
            max_datagram: [128, 600, 1472, 9000][usize::from(config >> 2 & 3)],
            retry_limit: 3,
            retry_timeout_ns: 100_000_000,
            rnr_retry_limit: 2,
            rnr_timer_ns: 50_000,
            max_send_wr: 64,
            ..EndpointConfig::default()
        };
        let mut ep = Endpoint::new(cfg, addr(VICTIM_ADDR));
        let pd = ep.alloc_pd();
        let cq = ep.create_cq();
        let qp = ep.create_qp(pd, cq, cq).expect("fresh PD and CQ");
        ep.connect(
            qp.qpn,
            QpInfo {
                addr: addr(PEER_ADDR),
                qpn: PEER_QPN,
                psn: PEER_PSN,
                seal_key: None,
            },
        )
        .expect("QP in Init");
        let src = pattern(0x77, ACK_SRC_LEN);
        let region = Region::new(ACK_SRC_LEN);
        region.write(0, &src).expect("in bounds");
        let src_lkey = ep.register(pd, region, Access::NONE).expect("PD").lkey;
        let land_lkey = ep
            .register(pd, Region::new(64), Access::LOCAL_WRITE)
            .expect("PD")
            .lkey;
        let c = ep.config();
        let (max_datagram, rto_bounds) = (c.max_datagram, (c.rto_min_ns, c.rto_max_ns));
        let start = Timestamp::from_nanos(1_000_000);
        let d = peer_wire::driver(ep, addr(VICTIM_ADDR), addr(PEER_ADDR), max_datagram, start);
        Sender {
            d,
            done: Completions::default(),
            qp,
            cq,
            start,
            src_lkey,
            land_lkey,
            src,
            max_datagram,
            rto_bounds,
            wrs: Vec::new(),
            pending: VecDeque::new(),
            next_msn: 0,
            pkts: HashMap::new(),
            next_rel: 0,
            cum_cover: 0,
            sacked: HashSet::new(),
            naks: HashSet::new(),
            new_pkts: 0,
            rtx_pkts: 0,
            ce: 0,
        }
    }

    fn post(&mut self, kind: AckWrKind, len: u32, src_off: u32, signaled: bool) {
        let wr_id = 100 + self.wrs.len() as u64;
        let (op, sge) = match kind {
            AckWrKind::Write => (
                SendOp::Write(RemoteAddr {
                    rkey: PEER_RKEY,
                    offset: 0,
                }),
                Sge {
                    lkey: self.src_lkey,
                    offset: u64::from(src_off),
                    len,
                },
            ),
            AckWrKind::Send => (
                SendOp::Send,
                Sge {
                    lkey: self.src_lkey,
                    offset: u64::from(src_off),
                    len,
                },
            ),
            AckWrKind::Read => (
                SendOp::Read(RemoteAddr {
                    rkey: PEER_RKEY,
                    offset: 0,
                }),
                Sge {
                    lkey: self.land_lkey,
                    offset: 0,
                    len,
                },
            ),
        };
        let wr = SendWr {
            wr_id,
            op,
            sges: vec![sge],
            signaled,
        };
        let ep = self.d.ep_mut(ENGINE);
        let depth = ep.qp_stats(self.qp.qpn).expect("QP").outstanding_sends;
        match ep.post_send(self.qp.qpn, wr) {
            Ok(()) => {}
            Err(PostError::QueueFull) if depth >= 64 => return,
            Err(e) => panic!("post_send refused a valid work request: {e:?}"),
        }
        self.pending.push_back(self.wrs.len());
        self.wrs.push(AckWr {
            wr_id,
            kind,
            len,
            src_off,
            signaled,
            msn: self.next_msn,
        });
        self.next_msn = self.next_msn.wrapping_add(1);
    }

    /// Polls up to `n` datagrams: each is a request of a posted message carrying its bytes;
    /// new ones take consecutive PSNs, retransmissions repeat an earlier PSN's content.
    fn transmit(&mut self, n: usize) {
        self.d.net.allow(n);
        settle(&mut self.d, &mut self.done);
        self.d.net.allow(0);
        while let Some((dest, d)) = self.d.net.sent.pop_front() {
            assert!(d.len() <= self.max_datagram);
            assert_eq!(dest, addr(PEER_ADDR));
            let p = Packet::parse(&d).expect("the engine emits packets that parse");
            assert_eq!(
                (p.header.src_qpn, p.header.dst_qpn),
                (self.qp.qpn, PEER_QPN)
            );
            let Body::Request(r) = p.body else {
                panic!("a sender with nothing to acknowledge sent {p}");
            };
            let w = self
                .wrs
                .iter()
                .find(|w| w.msn == r.msn)
                .unwrap_or_else(|| panic!("a request for a message never posted: {p}"));
            let plen = p.payload.len() as u32;
            match w.kind {
                AckWrKind::Write | AckWrKind::Send => {
                    let op = if w.kind == AckWrKind::Write {
                        Op::Write
                    } else {
                        Op::Send
                    };
                    assert_eq!((r.op, r.msg_len), (op, w.len), "{p}");
                    let at = (w.src_off + r.offset) as usize;
                    assert!(
                        self.src.get(at..at + plen as usize) == Some(p.payload),
                        "a packet carries the wrong bytes: {p}"
                    );
                }
                AckWrKind::Read => {
                    assert_eq!((r.op, r.msg_len, plen), (Op::Read, w.len, 0), "{p}");
                }
            }
            let rel = p.header.psn.wrapping_sub(self.qp.psn);
            let rec = AckPkt {
                msn: r.msn,
                offset: r.offset,
                len: plen,
                wire_len: d.len() as u32,
                send_ts: p.header.send_ts_ns,
            };
            if p.header.flags & wire::FLAG_RETRANSMIT != 0 {
                let prev = self
                    .pkts
                    .get(&rel)
                    .unwrap_or_else(|| panic!("a retransmission of a PSN never sent: {p}"));
                assert_eq!(
                    (prev.msn, prev.offset, prev.len),
                    (rec.msn, rec.offset, rec.len),
                    "a retransmission differs from the original: {p}"
                );
                self.rtx_pkts += 1;
            } else {
                assert_eq!(rel, self.next_rel, "new packets take consecutive PSNs: {p}");
                self.next_rel += 1;
                self.new_pkts += 1;
            }
            self.pkts.insert(rel, rec);
        }
    }

    fn covered(&self, rel: u32) -> bool {
        rel < self.cum_cover || self.sacked.contains(&rel)
    }

    fn feed(&mut self, h: &Header, body: &Body) {
        let d = build(h, body, &[]);
        let now = self.d.now;
        self.d.net.inject(now, addr(PEER_ADDR), 0, d);
        settle(&mut self.d, &mut self.done);
    }

    /// Moves the clock `ns` on and runs the timers that are due.
    fn advance(&mut self, ns: u64) {
        self.d.now = self.d.now.add_nanos(ns);
        settle(&mut self.d, &mut self.done);
    }

    fn ack(&mut self, cum: u32, sack: [u8; 32], echo: (u32, u64), hold: u32, dup: bool) {
        let cum_rel = cum.wrapping_sub(self.qp.psn);
        if cum_rel < 1 << 31 {
            self.cum_cover = self.cum_cover.max(cum_rel);
        }
        for i in 0..wire::SACK_BITS {
            if sack[(i / 8) as usize] & (1 << (i % 8)) != 0 {
                self.sacked.insert(cum_rel.wrapping_add(1 + i));
            }
        }
        let mut h = header(Kind::Ack, self.qp.qpn, PEER_QPN, 0);
        h.flags = if dup { wire::FLAG_DUPLICATE } else { 0 };
        let body = Body::Ack(wire::Ack {
            cum_psn: cum,
            echo_psn: echo.0,
            echo_ts_ns: echo.1,
            hold_ns: hold,
            ce_count: self.ce,
            sack,
        });
        let before = self.d.ep(ENGINE).qp_stats(self.qp.qpn).expect("QP");
        let bad_before = self.d.ep(ENGINE).stats().rx_bad_response;
        self.feed(&h, &body);
        // An ACK for packets never sent (and not an old one) changes nothing but a counter.
        if before.state == QpState::Connected && cum_rel > self.next_rel && cum_rel < 1 << 30 {
            let after = self.d.ep(ENGINE).qp_stats(self.qp.qpn).expect("QP");
            assert_eq!(
                self.d.ep(ENGINE).stats().rx_bad_response,
                bad_before + 1,
                "an ACK for packets never sent was not counted"
            );
            assert_eq!(
                (after.in_flight_bytes, after.outstanding_sends),
                (before.in_flight_bytes, before.outstanding_sends),
                "an ACK for packets never sent changed the sender"
            );
        }
    }

    /// Resolves completions: once each, in posting order; a WRITE or SEND succeeds only once
    /// every packet of it was sent and acknowledged and together they cover the message; a
    /// READ never succeeds (no response ever comes); an error status names a NAK fed for it.
    fn check_completions(&mut self) {
        while let Some((cq, c)) = self.done.0.pop_front() {
            assert_eq!((cq, c.qpn), (self.cq, self.qp.qpn));
            let idx = c
                .wr_id
                .checked_sub(100)
                .map(|i| i as usize)
                .filter(|i| self.pending.contains(i))
                .unwrap_or_else(|| panic!("completion repeated or for nothing posted: {c:?}"));
            while let Some(front) = self.pending.pop_front() {
                if front == idx {
                    break;
                }
                assert!(
                    !self.wrs[front].signaled,
                    "wr {} completed before the signaled wr {}",
                    c.wr_id, self.wrs[front].wr_id
                );
                self.check_success(front);
            }
            let w = &self.wrs[idx];
            let opcode = match w.kind {
                AckWrKind::Write => WcOpcode::Write,
                AckWrKind::Send => WcOpcode::Send,
                AckWrKind::Read => WcOpcode::Read,
            };
            assert_eq!(c.opcode, opcode, "{c:?}");
            let nak = |s: Syndrome| self.naks.contains(&(w.msn, s as u8));
            match c.status {
                WcStatus::Success => {
                    assert!(w.signaled, "an unsignaled success was reported: {c:?}");
                    assert_eq!(c.byte_len, w.len);
                    self.check_success(idx);
                }
                WcStatus::RemoteAccessError => assert!(nak(Syndrome::RemoteAccess), "{c:?}"),
                WcStatus::RemoteInvalidRequest => {
                    assert!(nak(Syndrome::InvalidRequest), "{c:?}")
                }
                WcStatus::RemoteOperationError => {
                    assert!(nak(Syndrome::RemoteOperation), "{c:?}")
                }
                WcStatus::RnrRetryExceeded => assert!(nak(Syndrome::ReceiverNotReady), "{c:?}"),
                WcStatus::RetryExceeded | WcStatus::Flushed => {}
                s => panic!("unexpected status {s:?}: {c:?}"),
            }
        }
    }

    fn check_success(&self, idx: usize) {
        let w = &self.wrs[idx];
        assert!(
            w.kind != AckWrKind::Read,
            "a READ succeeded though no response was ever sent: {w:?}"
        );
        let mut parts: Vec<(u32, u32, u32)> = self
            .pkts
            .iter()
            .filter(|(_, p)| p.msn == w.msn)
            .map(|(&rel, p)| (p.offset, p.len, rel))
            .collect();
        assert!(
            !parts.is_empty(),
            "a message completed without a packet sent: {w:?}"
        );
        parts.sort_unstable();
        let mut end = 0;
        for &(offset, len, rel) in &parts {
            assert!(
                self.covered(rel),
                "{w:?} completed but its packet {rel} (relative PSN) was never acknowledged"
            );
            assert!(
                offset <= end,
                "{w:?} completed with bytes {end}..{offset} never sent"
            );
            end = end.max(offset + len);
        }
        assert!(
            end >= w.len,
            "{w:?} completed with bytes {end}.. never sent"
        );
    }

    /// Counters and accounting stay sane.
    fn check_stats(&self) {
        let st = self.d.ep(ENGINE).qp_stats(self.qp.qpn).expect("QP");
        assert_eq!(
            (st.packets_sent, st.retransmits),
            (self.new_pkts, self.rtx_pkts),
            "packet counters disagree with what was polled"
        );
        let bound: u64 = self.pkts.values().map(|p| u64::from(p.wire_len)).sum();
        assert!(
            st.in_flight_bytes <= bound,
            "{} bytes in flight, more than every packet sent ({bound}): {st:?}",
            st.in_flight_bytes
        );
        if st.state == QpState::Error || st.outstanding_sends == 0 {
            assert_eq!(
                st.in_flight_bytes, 0,
                "bytes in flight with nothing outstanding: {st:?}"
            );
        }
        let (lo, hi) = self.rto_bounds;
        assert!((lo..=hi).contains(&st.rto_ns), "{st:?}");
        assert!(
            st.srtt_ns <= self.d.now.nanos_since(Timestamp::ZERO),
            "{st:?}"
        );
        assert!(st.cwnd_bytes > 0, "{st:?}");
    }

    /// Runs the timers out: every work request completes.
    fn finish(&mut self) {
        for _ in 0..64 {
            self.transmit(512);
            self.check_completions();
            self.check_stats();
            let Some(t) = self.d.ep(ENGINE).poll_timeout() else {
                break;
            };
            self.advance(t.nanos_since(self.d.now));
        }
        self.check_completions();
        let st = self.d.ep(ENGINE).qp_stats(self.qp.qpn).expect("QP");
        assert_eq!(
            st.outstanding_sends, 0,
            "work requests outstanding once every timer ran: {st:?}"
        );
        let _ = self.start;
    }
}

/// [`RecvTracker`] next to a naive model: the set of accepted PSNs (relative to the start).
struct TrackerModel {
    start: u32,
    t: RecvTracker,
    seen: BTreeSet<u32>,
    cum: u32,
}

impl TrackerModel {
    fn new(start: u32) -> Self {
        TrackerModel {
            start,
            t: RecvTracker::new(start),
            seen: BTreeSet::new(),
            cum: 0,
        }
    }

    fn expect(&self, rel: u32) -> Class {
        let d = rel.wrapping_sub(self.cum);
        if d >= 1 << 31 || self.seen.contains(&rel) {
            Class::Duplicate
        } else if d >= WINDOW {
            Class::OutOfWindow
        } else {
            Class::New
        }
    }

    fn op(&mut self, accept: bool, rel: u32) {
        let e = self.expect(rel);
        let psn = self.start.wrapping_add(rel);
        if accept {
            assert_eq!(
                self.t.accept(psn),
                e == Class::New,
                "accept({rel}) from {}",
                self.start
            );
            if e == Class::New {
                self.seen.insert(rel);
                while self.seen.contains(&self.cum) {
                    self.cum += 1;
                }
            }
        } else {
            assert_eq!(
                self.t.classify(psn),
                e,
                "classify({rel}) from {}",
                self.start
            );
        }
        assert_eq!(
            self.t.cum(),
            self.start.wrapping_add(self.cum),
            "cum from {}",
            self.start
        );
        let sack = self.t.sack();
        for i in 0..wire::SACK_BITS {
            let bit = sack[(i / 8) as usize] & (1 << (i % 8)) != 0;
            assert_eq!(
                bit,
                self.seen.contains(&(self.cum + 1 + i)),
                "SACK bit {i} with cum {}",
                self.cum
            );
        }
    }
}

/// The operations [`ack_sack`] decodes from its input.
#[derive(Clone, Debug)]
pub(super) enum AckOp {
    /// Post a WRITE, SEND or READ (`kind % 3`) of `len` bytes.
    Post {
        kind: u8,
        len: u16,
        src_off: u16,
        unsignaled: bool,
    },
    /// Poll up to `n` datagrams.
    Transmit(u8),
    /// A crafted ACK. `flags`: bit 0 duplicate flag, bits 1-2 SACK mode (bitmap from the
    /// input, all ones, none, sent PSNs under `mask`), bit 3 raw cumulative PSN, bit 4 echo a
    /// sent packet.
    Ack {
        flags: u8,
        cum: u32,
        sack: [u8; 32],
        mask: u32,
        echo: u16,
        echo_raw: (u32, u64),
        hold: u16,
        ce: u8,
    },
    /// A NAK for the `pkt`-th sent packet (its MSN, or a wrong one).
    Nak {
        pkt: u16,
        syndrome: u8,
        wrong_msn: bool,
    },
    /// Advance the clock and run timers.
    Advance(u8),
    /// An ACK of everything sent.
    AckAll,
    /// Tracker: accept or classify a PSN (relative to its start).
    Tracker { accept: bool, rel: u16 },
}

impl AckOp {
    fn decode(inp: &mut Input<'_>) -> AckOp {
        match inp.u8() % 8 {
            0 => {
                let kind = inp.u8();
                AckOp::Post {
                    kind,
                    len: inp.u16(),
                    src_off: inp.u16(),
                    unsignaled: kind & 0x80 != 0,
                }
            }
            1 => AckOp::Transmit(inp.u8()),
            2 => {
                let flags = inp.u8();
                let cum = inp.u32();
                let mut sack = [0u8; 32];
                if flags >> 1 & 3 == 0 {
                    let b = inp.bytes(32);
                    sack[..b.len()].copy_from_slice(b);
                }
                AckOp::Ack {
                    flags,
                    cum,
                    sack,
                    mask: inp.u32(),
                    echo: inp.u16(),
                    echo_raw: (inp.u32(), inp.u64()),
                    hold: inp.u16(),
                    ce: inp.u8(),
                }
            }
            3 => AckOp::Nak {
                pkt: inp.u16(),
                syndrome: inp.u8(),
                wrong_msn: inp.u8() & 1 != 0,
            },
            4 => AckOp::Advance(inp.u8()),
            5 => AckOp::AckAll,
            6 => AckOp::Tracker {
                accept: true,
                rel: inp.u16(),
            },
            _ => AckOp::Tracker {
                accept: false,
                rel: inp.u16(),
            },
        }
    }

    pub(super) fn encode(&self, o: &mut Out) {
        match self {
            AckOp::Post {
                kind,
                len,
                src_off,
                unsignaled,
            } => {
                o.u8(0).u8(kind & 0x7f | if *unsignaled { 0x80 } else { 0 });
                o.u16(*len).u16(*src_off);
            }
            AckOp::Transmit(n) => {
                o.u8(1).u8(*n);
            }
            AckOp::Ack {
                flags,
                cum,
                sack,
                mask,
                echo,
                echo_raw,
                hold,
                ce,
            } => {
                o.u8(2).u8(*flags).u32(*cum);
                if flags >> 1 & 3 == 0 {
                    o.bytes(sack);
                }
                o.u32(*mask).u16(*echo).u32(echo_raw.0).u64(echo_raw.1);
                o.u16(*hold).u8(*ce);
            }
            AckOp::Nak {
                pkt,
                syndrome,
                wrong_msn,
            } => {
                o.u8(3).u16(*pkt).u8(*syndrome).u8(u8::from(*wrong_msn));
            }
            AckOp::Advance(e) => {
                o.u8(4).u8(*e);
            }
            AckOp::AckAll => {
                o.u8(5);
            }
            AckOp::Tracker { accept, rel } => {
                o.u8(if *accept { 6 } else { 7 }).u16(*rel);
            }
        }
    }
}

/// A sender driven by crafted ACKs and NAKs, and the receive tracker against a naive model.
///
/// Input: a configuration byte (paths, datagram size, the tracker's start PSN), then
/// [`AckOp`]s.
///
/// Checked: nothing panics; every datagram sent is a request of a posted message carrying its
/// bytes, new PSNs are consecutive and a retransmission repeats its original; completions come
/// once each, in posting order; a WRITE or SEND succeeds only when all its bytes were sent and
/// every packet was covered by some ACK, a READ never succeeds, an error status names a NAK
/// fed for that message; an ACK for packets never sent is counted and changes nothing; packet
/// counters match what was polled; bytes in flight never exceed what was sent and are zero
/// with nothing outstanding or after a failure; RTO, RTT and window stay in range; once the
/// timers run out every work request has completed. The tracker's cumulative point, SACK
/// bitmap and classification equal the model's after every operation.
pub fn ack_sack(data: &[u8]) {
    let mut inp = Input::new(data);
    let config = inp.u8();
    let mut s = Sender::new(config);
    let start = match config >> 4 & 3 {
        0 => u32::MAX - 600,
        1 => 0,
        2 => (1 << 31) - 10,
        _ => inp.u32(),
    };
    let mut tracker = TrackerModel::new(start);
    let mut n = 0;
    while !inp.is_empty() && n < MAX_ACK_OPS {
        n += 1;
        match AckOp::decode(&mut inp) {
            AckOp::Post {
                kind,
                len,
                src_off,
                unsignaled,
            } => {
                let kind =
                    [AckWrKind::Write, AckWrKind::Send, AckWrKind::Read][usize::from(kind % 3)];
                let (len, src_off) = match kind {
                    AckWrKind::Read => (u32::from(len) % 65, 0),
                    _ => (u32::from(len) % 8192, u32::from(src_off) % 8192),
                };
                s.post(kind, len, src_off, !unsignaled);
            }
            AckOp::Transmit(k) => s.transmit(usize::from(k)),
            AckOp::Ack {
                flags,
                cum,
                sack,
                mask,
                echo,
                echo_raw,
                hold,
                ce,
            } => {
                let cum = if flags & 8 != 0 {
                    cum
                } else {
                    s.qp.psn.wrapping_add(cum % (s.next_rel + 4))
                };
                let cum_rel = cum.wrapping_sub(s.qp.psn);
                let sack = match flags >> 1 & 3 {
                    0 => sack,
                    1 => [0xff; 32],
                    2 => [0; 32],
                    _ => {
                        let mut b = [0u8; 32];
                        for i in 0..wire::SACK_BITS {
                            let rel = cum_rel.wrapping_add(1 + i);
                            if s.pkts.contains_key(&rel) && mask & (1 << (i % 32)) != 0 {
                                b[(i / 8) as usize] |= 1 << (i % 8);
                            }
                        }
                        b
                    }
                };
                let echo = if flags & 0x10 != 0 && !s.pkts.is_empty() {
                    let mut rels: Vec<_> = s.pkts.keys().copied().collect();
                    rels.sort_unstable();
                    let rel = rels[usize::from(echo) % rels.len()];
                    (s.qp.psn.wrapping_add(rel), s.pkts[&rel].send_ts)
                } else {
                    echo_raw
                };
                s.ce = s.ce.wrapping_add(u32::from(ce));
                s.ack(cum, sack, echo, u32::from(hold) * 16, flags & 1 != 0);
            }
            AckOp::Nak {
                pkt,
                syndrome,
                wrong_msn,
            } => {
                if s.pkts.is_empty() {
                    continue;
                }
                let mut rels: Vec<_> = s.pkts.keys().copied().collect();
                rels.sort_unstable();
                let rel = rels[usize::from(pkt) % rels.len()];
                let msn = s.pkts[&rel].msn.wrapping_add(u32::from(wrong_msn));
                let syndrome = [
                    Syndrome::ReceiverNotReady,
                    Syndrome::RemoteAccess,
                    Syndrome::InvalidRequest,
                    Syndrome::RemoteOperation,
                ][usize::from(syndrome % 4)];
                s.naks.insert((msn, syndrome as u8));
                let body = Body::Nak(wire::Nak {
                    psn: s.qp.psn.wrapping_add(rel),
                    msn,
                    syndrome,
                });
                s.feed(&header(Kind::Nak, s.qp.qpn, PEER_QPN, 0), &body);
            }
            AckOp::Advance(e) => {
                s.advance(ADVANCE_NS[usize::from(e % 8)]);
            }
            AckOp::AckAll => {
                let cum = s.qp.psn.wrapping_add(s.next_rel);
                let now = s.d.now.as_nanos();
                s.ack(cum, [0; 32], (cum.wrapping_sub(1), now), 0, false);
            }
            AckOp::Tracker { accept, rel } => {
                // Mostly near the window; sometimes far ahead.
                let rel = if rel & 0x8000 != 0 {
                    u32::from(rel) << 4
                } else {
                    u32::from(rel) % 1400
                };
                tracker.op(accept, rel);
            }
        }
        s.check_completions();
        s.check_stats();
    }
    s.finish();
}
