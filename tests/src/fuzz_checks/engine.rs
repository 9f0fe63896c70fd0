//! The `engine_datagrams` target: one endpoint fed arbitrary datagrams (optionally patched
//! so they reach deep into the engine), checked against a shadow copy of every region. The
//! endpoint runs under the simulator's driver ([`peer_wire`](super::peer_wire)), which hands it
//! the datagrams, runs its timers and takes what it sends when the input lets it.
use super::peer_wire::{self, Completions, ENGINE, PeerWire, settle};
use super::*;
use braid::testing::sim::Driver;

/// The address of the endpoint [`engine_datagrams`] attacks.
pub const VICTIM_ADDR: &str = "10.0.0.1:4791";
/// The address of its connected peer. No engine runs there: the fuzz input speaks for it.
pub const PEER_ADDR: &str = "10.0.0.2:4791";
/// An address that is nobody's peer.
pub const STRANGER_ADDR: &str = "10.9.9.9:4791";
/// The peer's QP number.
pub const PEER_QPN: u32 = 0x00ab_cdef;
/// The peer's first PSN (close to the wrap, so the receive window straddles it).
pub const PEER_PSN: u32 = 0xffff_fff0;
/// The rkey the victim's own WRITE, READ and atomics name at the peer.
pub(super) const PEER_RKEY: u32 = 0x5eed;
/// Bytes of each region of the victim, except the local one.
const ENGINE_REGION_LEN: usize = 2048;
/// Bytes of the victim's local region (receive buffers, READ and atomic destinations, and the
/// sources of its own WRITEs and SENDs).
const ENGINE_LOCAL_LEN: usize = 8192;
/// Most datagrams one input feeds.
const MAX_DATAGRAMS: usize = 256;
/// Clock advances a control byte can ask for, ns.
pub(super) const ADVANCE_NS: [u64; 8] = [
    0,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
];
/// Victim region index of the local region.
const LOCAL: usize = 5;

/// Bit of the configuration byte of [`engine_datagrams`] input: the victim's QP is encrypted
/// (its peer's private key is [`PEER_SECRET`], so the fuzz input speaks as the authenticated
/// peer: every datagram that parses is sealed before delivery, and everything the victim
/// sends must open).
pub const ENCRYPTED: u8 = 0x10;
/// The victim's X25519 private key when [`ENCRYPTED`].
const VICTIM_SECRET: [u8; 32] = [0x5a; 32];
/// Its peer's X25519 private key when [`ENCRYPTED`].
const PEER_SECRET: [u8; 32] = [0xa5; 32];

/// Control byte bits of one datagram record in [`engine_datagrams`] input.
pub(super) mod ctrl {
    /// Patch QP numbers, sequence numbers, keys and offsets to the victim's real ones.
    pub const PATCH: u8 = 0x01;
    /// Send from an address that is not the peer's.
    pub const STRANGER: u8 = 0x02;
    /// Poll every datagram the victim wants to send afterwards.
    pub const TRANSMIT: u8 = 0x04;
    /// Run the victim's timers afterwards.
    pub const TIMEOUT: u8 = 0x08;
    /// Mark it congestion experienced.
    pub const CE: u8 = 0x10;
    /// The top three bits index `ADVANCE_NS`: how far the clock moves first.
    pub const ADVANCE_SHIFT: u32 = 5;
}

/// One region of the endpoint under attack, with its shadow copy.
pub(super) struct TargetRegion {
    pub(super) name: &'static str,
    region: Arc<Region>,
    pub(super) keys: MrKeys,
    access: Access,
    /// In the QP's protection domain and still registered.
    reachable: bool,
    shadow: Vec<u8>,
}

impl TargetRegion {
    /// The bytes of this region request `p` (from the connected peer) may change: the range a
    /// WRITE names, if the region grants REMOTE_WRITE and holds the whole message; the word
    /// an aligned atomic names, if it grants REMOTE_ATOMIC.
    fn writable_by(&self, p: &Packet<'_>) -> Option<Range<usize>> {
        let Body::Request(r) = p.body else {
            return None;
        };
        if !self.reachable || r.rkey != self.keys.rkey {
            return None;
        }
        let len = self.region.len() as u64;
        let (need, start, n) = match r.op {
            Op::Write | Op::WriteImm => {
                let end = r.remote_offset.checked_add(u64::from(r.msg_len))?;
                if end > len {
                    return None;
                }
                let start = r.remote_offset + u64::from(r.offset);
                (Access::REMOTE_WRITE, start, p.payload.len() as u64)
            }
            Op::FetchAdd | Op::CompareSwap if r.remote_offset.is_multiple_of(8) => {
                (Access::REMOTE_ATOMIC, r.remote_offset, 8)
            }
            _ => return None,
        };
        let end = start.checked_add(n)?;
        (self.access.contains(need) && end <= len).then_some(start as usize..end as usize)
    }
}

/// A work request the victim posted itself, with the local range the network may fill.
struct OwnWr {
    wr_id: u64,
    opcode: WcOpcode,
    /// Bytes of a receive buffer (0 for sends).
    cap: u32,
    /// Local ranges the peer's packets may write while it is outstanding.
    landing: Vec<Range<usize>>,
}

/// One endpoint with a connected QP, regions with every kind of rights, its own work posted,
/// and the bookkeeping to check it.
pub(super) struct EngineTarget {
    /// The endpoint under attack, on the driver's host [`ENGINE`], and the driver's clock.
    d: Driver<PeerWire>,
    /// Its completions, as the driver handed them over, not yet checked.
    done: Completions,
    pub(super) qp: QpInfo,
    cq: CqId,
    pub(super) regions: Vec<TargetRegion>,
    sends: Vec<OwnWr>,
    next_send: usize,
    recvs: Vec<OwnWr>,
    next_recv: usize,
    /// READ requests fed from the peer: (msn, rkey, remote offset, length).
    reads: Vec<(u32, u32, u64, u32)>,
    max_datagram: usize,
    /// The peer's end of the encryption, when the QP is encrypted.
    seal: Option<Sealer>,
    /// Where the victim's sealed datagrams are opened (reused).
    open_buf: Vec<u8>,
    /// Every datagram emitted, when building seeds.
    pub(super) emitted: Option<Vec<Vec<u8>>>,
}

impl EngineTarget {
    /// Builds the victim. `config` picks the path count, the datagram size and whether the
    /// QP is encrypted ([`ENCRYPTED`]).
    pub(super) fn new(config: u8) -> EngineTarget {
        let cfg = EndpointConfig {
            seed: 0x00b4_a1d0,
            paths: [1, 2, 4, 16][usize::from(config & 3)],
            max_datagram: [128, 512, 1472, 9000][usize::from(config >> 2 & 3)],
            retry_limit: 3,
            retry_timeout_ns: 100_000_000,
            rnr_retry_limit: 2,
            rnr_timer_ns: 50_000,
            max_send_wr: 64,
            max_recv_wr: 64,
            ..EndpointConfig::default()
        };
        let mut ep = Endpoint::new(cfg, addr(VICTIM_ADDR));
        let max_datagram = ep.config().max_datagram;
        let pd = ep.alloc_pd();
        let other_pd = ep.alloc_pd();
        let cq = ep.create_cq();
        let encrypted = config & ENCRYPTED != 0;
        let opts = if encrypted {
            QpOptions::encrypted(VICTIM_SECRET)
        } else {
            QpOptions::default()
        };
        let qp = ep
            .create_qp_with(pd, cq, cq, opts)
            .expect("fresh PD and CQ");
        let peer_public = public_key(&PEER_SECRET);
        let peer = QpInfo {
            addr: addr(PEER_ADDR),
            qpn: PEER_QPN,
            psn: PEER_PSN,
            seal_key: encrypted.then_some(peer_public),
        };
        ep.connect(qp.qpn, peer).expect("QP in Init");
        let seal = qp.seal_key.map(|victim_public| {
            let me = Party {
                public: peer_public,
                qpn: PEER_QPN,
                psn: PEER_PSN,
            };
            let victim = Party {
                public: victim_public,
                qpn: qp.qpn,
                psn: qp.psn,
            };
            Sealer::new(&PEER_SECRET, me, victim).expect("fixed, valid keys")
        });
        // (name, length, rights, in the QP's PD, deregistered afterwards)
        let specs: [(&'static str, usize, Access, bool, bool); 8] = [
            (
                "rw",
                ENGINE_REGION_LEN,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                true,
                false,
            ),
            ("ro", ENGINE_REGION_LEN, Access::REMOTE_READ, true, false),
            (
                "atomic",
                ENGINE_REGION_LEN,
                Access::REMOTE_ATOMIC,
                true,
                false,
            ),
            ("all", ENGINE_REGION_LEN, Access::ALL, true, false),
            ("none", ENGINE_REGION_LEN, Access::NONE, true, false),
            ("local", ENGINE_LOCAL_LEN, Access::LOCAL_WRITE, true, false),
            ("other-pd", ENGINE_REGION_LEN, Access::ALL, false, false),
            ("deregistered", ENGINE_REGION_LEN, Access::ALL, true, true),
        ];
        let regions = specs
            .iter()
            .enumerate()
            .map(|(i, &(name, len, access, ours, dereg))| {
                let region = Region::new(len);
                let bytes = pattern(i as u8 + 1, len);
                region.write(0, &bytes).expect("in bounds");
                let keys = ep
                    .register(if ours { pd } else { other_pd }, region.clone(), access)
                    .expect("known PD");
                if dereg {
                    ep.deregister(keys.lkey).expect("registered");
                }
                TargetRegion {
                    name,
                    region,
                    keys,
                    access,
                    reachable: ours && !dereg,
                    shadow: bytes,
                }
            })
            .collect::<Vec<_>>();
        let start = Timestamp::from_nanos(1_000_000);
        let d = peer_wire::driver(ep, addr(VICTIM_ADDR), addr(PEER_ADDR), max_datagram, start);
        let mut t = EngineTarget {
            d,
            done: Completions::default(),
            qp,
            cq,
            regions,
            sends: Vec::new(),
            next_send: 0,
            recvs: Vec::new(),
            next_recv: 0,
            reads: Vec::new(),
            max_datagram,
            seal,
            open_buf: Vec::new(),
            emitted: None,
        };
        t.post_own_work();
        t
    }

    fn local_sge(&self, r: Range<usize>) -> Sge {
        Sge {
            lkey: self.regions[LOCAL].keys.lkey,
            offset: r.start as u64,
            len: r.len() as u32,
        }
    }

    /// Three receives and one of each send, so the peer's packets have something to hit.
    fn post_own_work(&mut self) {
        let recvs: [(u64, Vec<Range<usize>>); 3] = [
            (1, vec![Range { start: 0, end: 600 }]),
            (2, vec![600..900, 1000..1200]),
            (
                3,
                vec![Range {
                    start: 1200,
                    end: 1208,
                }],
            ),
        ];
        for (wr_id, ranges) in recvs {
            let sges = ranges.iter().map(|r| self.local_sge(r.clone())).collect();
            self.d
                .ep_mut(ENGINE)
                .post_recv(self.qp.qpn, RecvWr { wr_id, sges })
                .expect("valid receive");
            self.recvs.push(OwnWr {
                wr_id,
                opcode: WcOpcode::Recv,
                cap: ranges.iter().map(|r| r.len() as u32).sum(),
                landing: ranges,
            });
        }
        let remote = |offset| RemoteAddr {
            rkey: PEER_RKEY,
            offset,
        };
        let sends: [(u64, SendOp, Range<usize>, WcOpcode, bool); 6] = [
            (
                10,
                SendOp::Write(remote(0)),
                4096..7096,
                WcOpcode::Write,
                false,
            ),
            (
                11,
                SendOp::Read(remote(64)),
                2048..3072,
                WcOpcode::Read,
                true,
            ),
            (
                12,
                SendOp::FetchAdd(remote(8), 5),
                1208..1216,
                WcOpcode::FetchAdd,
                true,
            ),
            (
                13,
                SendOp::CompareSwap {
                    remote: remote(16),
                    compare: 0,
                    swap: 7,
                },
                1216..1224,
                WcOpcode::CompareSwap,
                true,
            ),
            (14, SendOp::Send, 4096..4596, WcOpcode::Send, false),
            (
                15,
                SendOp::WriteImm(remote(4000), 0xfeed),
                5000..5100,
                WcOpcode::Write,
                false,
            ),
        ];
        for (wr_id, op, range, opcode, lands) in sends {
            let wr = SendWr {
                wr_id,
                op,
                sges: vec![self.local_sge(range.clone())],
                signaled: true,
            };
            self.d
                .ep_mut(ENGINE)
                .post_send(self.qp.qpn, wr)
                .expect("valid send");
            self.sends.push(OwnWr {
                wr_id,
                opcode,
                cap: 0,
                landing: if lands { vec![range] } else { Vec::new() },
            });
        }
    }

    /// The rkeys a patched request may name: every region's, and one nobody has.
    fn rkey_choices(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.regions.iter().map(|r| r.keys.rkey).collect();
        v.push(0);
        v
    }

    /// Rewrites identities and sequence numbers so a datagram gets past the demultiplexing
    /// and the receive window; fields keep some of their fuzzed value.
    fn patch(&self, d: &mut [u8]) {
        fn get(d: &[u8], at: usize) -> u32 {
            u32::from_be_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
        }
        fn put(d: &mut [u8], at: usize, v: u32) {
            d[at..at + 4].copy_from_slice(&v.to_be_bytes());
        }
        let h = wire::HEADER_LEN;
        if d.len() < h {
            return;
        }
        d[0] = wire::VERSION;
        d[1] = d[1] % 5 + 1;
        put(d, 4, self.qp.qpn);
        put(d, 8, PEER_QPN);
        let kind = d[1];
        if matches!(kind, 1..=3) {
            let psn = PEER_PSN.wrapping_add(get(d, 12) % 64);
            put(d, 12, psn);
        }
        let body_len = match kind {
            1 => wire::REQUEST_LEN,
            2 => wire::READ_RESP_LEN,
            3 => wire::ATOMIC_RESP_LEN,
            4 => wire::ACK_LEN,
            _ => wire::NAK_LEN,
        };
        let Some(plen) = d.len().checked_sub(h + body_len + wire::TRAILER_LEN) else {
            return;
        };
        let plen = plen as u32;
        let mine = self.qp.psn;
        match kind {
            1 => {
                d[h] %= 7;
                let op = d[h];
                put(d, h + 8, get(d, h + 8) % 4); // ssn
                let keys = self.rkey_choices();
                let rkey = keys[get(d, h + 16) as usize % keys.len()];
                put(d, h + 16, rkey);
                let mut roff = [0u8; 8];
                roff.copy_from_slice(&d[h + 28..h + 36]);
                let roff = u64::from_be_bytes(roff) % (ENGINE_REGION_LEN as u64 + 64);
                d[h + 28..h + 36].copy_from_slice(&roff.to_be_bytes());
                match op {
                    4 => put(d, h + 20, get(d, h + 20) % 4096),
                    5 | 6 => put(d, h + 20, 8),
                    _ => {
                        let offset = get(d, h + 24) % 4096;
                        put(d, h + 24, offset);
                        let msg_len = (get(d, h + 20) % 8192).max(offset + plen);
                        put(d, h + 20, msg_len);
                    }
                }
            }
            2 => {
                put(d, h, get(d, h) % 8);
                let offset = get(d, h + 4) % 1024;
                put(d, h + 4, offset);
                let msg_len = if get(d, h + 8) & 1 == 0 {
                    1024
                } else {
                    get(d, h + 8) % 2048
                };
                put(d, h + 8, msg_len.max(offset + plen));
            }
            3 => put(d, h, get(d, h) % 8),
            4 => {
                put(d, h, mine.wrapping_add(get(d, h) % 64));
                put(d, h + 4, mine.wrapping_add(get(d, h + 4) % 64));
                let mut ts = [0u8; 8];
                ts.copy_from_slice(&d[h + 8..h + 16]);
                let ts = u64::from_be_bytes(ts) % (self.d.now.as_nanos() + 1);
                d[h + 8..h + 16].copy_from_slice(&ts.to_be_bytes());
            }
            _ => {
                put(d, h, mine.wrapping_add(get(d, h) % 64));
                put(d, h + 4, get(d, h + 4) % 8);
                d[h + 8] = d[h + 8] % 4 + 1;
            }
        }
    }

    /// Remembers a READ request from the peer, to tell a READ response from a leak.
    fn note_read(&mut self, d: &[u8], from: SocketAddr) {
        let Ok(p) = Packet::parse(d) else { return };
        if let Body::Request(r) = p.body
            && r.op == Op::Read
            && from == addr(PEER_ADDR)
            && p.header.dst_qpn == self.qp.qpn
            && p.header.src_qpn == PEER_QPN
        {
            self.reads.push((r.msn, r.rkey, r.remote_offset, r.msg_len));
        }
    }

    /// Local ranges the network may write now: those of outstanding work requests.
    fn local_landing(&self) -> Vec<bool> {
        let mut mask = vec![false; ENGINE_LOCAL_LEN];
        let outstanding = self.sends[self.next_send..]
            .iter()
            .chain(&self.recvs[self.next_recv..]);
        for w in outstanding {
            for r in &w.landing {
                mask[r.clone()].fill(true);
            }
        }
        mask
    }

    /// Compares every region with its shadow: a byte may change only in an `allowed` range
    /// (region index, bytes), or in a local buffer of an outstanding work request. Then
    /// updates the shadows.
    fn check_memory(&mut self, when: &str, allowed: &[(usize, Range<usize>)]) {
        let landing = self.local_landing();
        for (i, r) in self.regions.iter_mut().enumerate() {
            let now = region_bytes(&r.region);
            if now == r.shadow {
                continue;
            }
            for (off, (&new, &old)) in now.iter().zip(&r.shadow).enumerate() {
                let ok = (i == LOCAL && landing[off])
                    || allowed.iter().any(|(ri, rr)| *ri == i && rr.contains(&off));
                assert!(
                    new == old || ok,
                    "{when}: region {:?} ({:?}) byte {off} changed {old:#04x} -> {new:#04x}, \
                     but nothing may write it",
                    r.name,
                    r.access
                );
            }
            r.shadow = now;
        }
    }

    /// Takes every completion: each work request completes once, in posting order per queue,
    /// with the right opcode; a filled receive holds at most its capacity.
    fn check_completions(&mut self) {
        while let Some((cq, c)) = self.done.0.pop_front() {
            assert_eq!((cq, c.qpn), (self.cq, self.qp.qpn), "{c:?}");
            if let Some(w) = self.sends.get(self.next_send)
                && w.wr_id == c.wr_id
            {
                assert_eq!(c.opcode, w.opcode, "{c:?}");
                self.next_send += 1;
            } else if let Some(w) = self.recvs.get(self.next_recv)
                && w.wr_id == c.wr_id
            {
                assert!(
                    matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                    "{c:?}"
                );
                if c.status == WcStatus::Success && c.opcode == WcOpcode::Recv {
                    assert!(
                        c.byte_len <= w.cap,
                        "a receive holds more than its buffers: {c:?}"
                    );
                }
                self.next_recv += 1;
            } else {
                panic!(
                    "completion out of posting order, repeated, or for nothing posted: {c:?} \
                     (next send {:?}, next receive {:?})",
                    self.sends.get(self.next_send).map(|w| w.wr_id),
                    self.recvs.get(self.next_recv).map(|w| w.wr_id)
                );
            }
        }
    }

    /// Checks one datagram the victim emits: it parses, fits, names the peer, and a READ
    /// response carries exactly the bytes a READ the peer sent asked for, from a region that
    /// allows remote reads.
    /// Checks one datagram the victim sent: it fits, parses (or, encrypted, opens as the peer
    /// would), and names the connection; READ responses carry only bytes an accepted READ
    /// asked for.
    fn check_transmit(&mut self, d: &[u8]) {
        assert!(d.len() <= self.max_datagram);
        let mut buf = std::mem::take(&mut self.open_buf);
        match &mut self.seal {
            Some(s) => {
                let p = s
                    .open(d, &mut buf)
                    .expect("the peer opens every datagram the engine seals");
                self.check_packet(&p);
            }
            None => {
                let p = Packet::parse(d).expect("the engine emits packets that parse");
                self.check_packet(&p);
            }
        }
        self.open_buf = buf;
    }

    fn check_packet(&self, p: &Packet<'_>) {
        assert_eq!(
            (p.header.src_qpn, p.header.dst_qpn),
            (self.qp.qpn, PEER_QPN),
            "{p}"
        );
        let Body::ReadResponse(r) = p.body else {
            return;
        };
        let matches = |&(msn, rkey, roff, len): &(u32, u32, u64, u32)| {
            let Some(reg) = self.regions.iter().find(|x| x.keys.rkey == rkey) else {
                return false;
            };
            msn == r.msn
                && len == r.msg_len
                && reg.reachable
                && reg.access.contains(Access::REMOTE_READ)
                && roff
                    .checked_add(u64::from(len))
                    .is_some_and(|e| e <= reg.region.len() as u64)
                && reg
                    .region
                    .to_vec(roff + u64::from(r.offset), p.payload.len())
                    .is_ok_and(|b| b == p.payload)
        };
        assert!(
            self.reads.iter().any(matches),
            "a READ response carries bytes no accepted READ asked for: {p}"
        );
    }

    /// The datagram as the peer puts it on the wire, and whether it was sealed: sealed when
    /// the QP is encrypted and it parses (what does not parse goes as it is, and must be
    /// refused).
    fn as_peer_sends(&mut self, d: Vec<u8>) -> (Vec<u8>, bool) {
        let Some(s) = &self.seal else {
            return (d, false);
        };
        let Ok(p) = Packet::parse(&d) else {
            return (d, false);
        };
        let mut out = vec![0u8; d.len() + wire::SEAL_OVERHEAD];
        match s.emit(&mut out, &p.header, &p.body, p.payload.len(), |x| {
            x.copy_from_slice(p.payload)
        }) {
            Ok(len) => {
                out.truncate(len);
                (out, true)
            }
            Err(_) => (d, false),
        }
    }

    /// Lets the victim send (up to 1024 datagrams) and checks every datagram it sends.
    pub(super) fn transmit_all(&mut self) {
        self.d.net.allow(1024);
        settle(&mut self.d, &mut self.done);
        self.d.net.allow(0);
        while let Some((dest, d)) = self.d.net.sent.pop_front() {
            assert_eq!(dest, addr(PEER_ADDR));
            self.check_transmit(&d);
            if let Some(e) = &mut self.emitted {
                e.push(d);
            }
        }
    }

    /// Runs what is due now: the datagrams handed over, the timers that are due.
    fn settle(&mut self) {
        settle(&mut self.d, &mut self.done);
    }

    /// Lets every timer run out; then every send has completed, and if the QP failed, every
    /// receive too.
    fn finish(&mut self) {
        for _ in 0..64 {
            self.transmit_all();
            self.check_completions();
            let Some(t) = self.d.ep(ENGINE).poll_timeout() else {
                break;
            };
            self.d.now = self.d.now.max(t);
            self.settle();
            self.check_memory("at a final timeout", &[]);
        }
        self.check_completions();
        let st = self
            .d
            .ep(ENGINE)
            .qp_stats(self.qp.qpn)
            .expect("the QP exists");
        assert_eq!(
            self.next_send,
            self.sends.len(),
            "sends still outstanding once every timer has run: {st:?}"
        );
        if st.state == QpState::Error {
            assert_eq!(
                self.next_recv,
                self.recvs.len(),
                "a failed QP flushes its receives"
            );
        }
    }
}

/// One endpoint fed arbitrary datagrams, as its connected peer (or a stranger) might send
/// them.
///
/// Input: a configuration byte, then records of a control byte (`ctrl` bits: patch the
/// identities in, send from a stranger, poll transmissions, run timers, CE mark, clock
/// advance), a little-endian `u16` length and that many bytes; the trailer is recomputed.
///
/// Checked: nothing panics; after every datagram, memory changed only where that datagram may
/// write — the bytes a WRITE from the connected peer names in a region of the QP's protection
/// domain that grants REMOTE_WRITE and holds the whole message, the word an aligned atomic
/// names in one that grants REMOTE_ATOMIC, and the local buffers of outstanding receives,
/// READs and atomics — so regions with only READ or no remote rights, in another protection
/// domain, or deregistered stay byte-identical to their shadow, and timers write nothing;
/// completions come once each, in posting order, with the right opcode; every emitted
/// datagram parses and a READ response never carries bytes no READ asked for; and once the
/// timers have run out every send has completed.
pub fn engine_datagrams(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut t = EngineTarget::new(inp.u8());
    t.transmit_all();
    let peer = addr(PEER_ADDR);
    let stranger = addr(STRANGER_ADDR);
    let mut n = 0;
    while !inp.is_empty() && n < MAX_DATAGRAMS {
        n += 1;
        let c = inp.u8();
        let len = usize::from(inp.u16()) % 2048;
        let mut d = inp.bytes(len).to_vec();
        t.d.now =
            t.d.now
                .add_nanos(ADVANCE_NS[usize::from(c >> ctrl::ADVANCE_SHIFT)]);
        if c & ctrl::PATCH != 0 {
            t.patch(&mut d);
        }
        fix_crc(&mut d);
        let from = if c & ctrl::STRANGER != 0 {
            stranger
        } else {
            peer
        };
        let ecn = if c & ctrl::CE != 0 {
            braid::proto::ECN_CE
        } else {
            braid::proto::ECN_ECT0
        };
        t.note_read(&d, from);
        let connected =
            t.d.ep(ENGINE)
                .qp_stats(t.qp.qpn)
                .is_some_and(|s| s.state == QpState::Connected);
        let allowed: Vec<(usize, Range<usize>)> = match Packet::parse(&d) {
            Ok(p)
                if connected
                    && from == peer
                    && (p.header.dst_qpn, p.header.src_qpn) == (t.qp.qpn, PEER_QPN) =>
            {
                let regions = t.regions.iter().enumerate();
                regions
                    .filter_map(|(i, r)| Some((i, r.writable_by(&p)?)))
                    .collect()
            }
            _ => Vec::new(),
        };
        let (d, sealed) = t.as_peer_sends(d);
        let refused = |t: &EngineTarget| {
            let st = t.d.ep(ENGINE).stats();
            st.rx_auth_failed + st.rx_replayed
        };
        let refused_before = refused(&t);
        let now = t.d.now;
        t.d.net.inject(now, from, ecn, d);
        t.settle();
        if sealed {
            assert_eq!(
                refused(&t),
                refused_before,
                "datagram {n}, sealed by the peer, did not authenticate"
            );
        }
        t.check_memory(&format!("after datagram {n}"), &allowed);
        t.check_completions();
        if c & ctrl::TRANSMIT != 0 {
            t.transmit_all();
        }
        if c & ctrl::TIMEOUT != 0 {
            t.settle();
            t.check_memory(&format!("after the timers following datagram {n}"), &[]);
            t.check_completions();
        }
    }
    t.finish();
}
