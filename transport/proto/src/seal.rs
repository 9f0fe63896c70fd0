//! Optional per-connection authenticated encryption ("sealing"), as Falcon's PSP and Ultra
//! Ethernet's TSS provide on hardware. What it does not do: authenticate *who* the peer is
//! (the public keys travel out of band with the rest of [`QpInfo`], exactly as QP numbers and
//! remote keys do, so the out-of-band channel must be trusted for that), hide the common
//! header (QP numbers, PSN, timestamp and path stay readable for telemetry and demultiplexing,
//! but are authenticated), or hide packet sizes and timing.
//!
//! # Opting in
//!
//! A QP is created encrypted with [`QpOptions::encrypted`], given a 32-byte X25519 private key.
//! The engine is sans-IO and draws no OS entropy, so the caller supplies the key: the runtime
//! draws it from the OS, a simulation derives it from its seed (keeping runs replayable). The
//! QP's public key is published in [`QpInfo::seal_key`]. A plain QP has `seal_key: None` and
//! pays for nothing here beyond one branch per packet. At `connect` both sides must agree:
//! one encrypted and one plain side is refused with [`ResourceError::EncryptionMismatch`].
//!
//! # Key agreement
//!
//! At `connect`, each side computes the X25519 shared secret of its private key and the peer's
//! public key (a non-contributory result, from a low-order peer key, is refused with
//! [`ResourceError::BadPeerKey`]). The two parties are ordered by (public key, QPN): the lower
//! is party A, the higher party B. Then, with HKDF-SHA256 (RFC 5869):
//!
//! ```text
//! PRK     = HKDF-Extract(salt = "braid seal v1", IKM = shared secret)
//! context = "braid seal v1" || pub_A || qpn_A || psn_A || pub_B || qpn_B || psn_B
//!           (QPNs and initial PSNs as 4 big-endian bytes)
//! key A→B = HKDF-Expand(PRK, context || "A->B", 32 bytes)    AES-256-GCM
//! key B→A = HKDF-Expand(PRK, context || "B->A", 32 bytes)    AES-256-GCM
//! ```
//!
//! Each side sends with its own direction's key and receives with the other, so the two
//! directions never share a (key, nonce) pair. The QPNs and PSNs in the context bind the keys
//! to this one connection: the same key pair reused for another QP gives other keys.
//!
//! # Packet protection
//!
//! Every packet of an encrypted connection is sealed: requests, READ and atomic responses,
//! ACKs and NAKs (so nobody can forge progress or refusals). The wire layout is drawn in
//! [`crate::wire`]: the common header (with `FLAG_SEALED`) and a 64-bit sealing sequence number
//! travel in clear and are the AEAD's associated data; the per-kind header and payload are
//! encrypted; a 16-byte tag replaces the CRC32C trailer (the tag covers integrity, so no CRC is
//! computed or checked on sealed packets). A sealed packet is [`wire::SEAL_OVERHEAD`] (20)
//! bytes longer than the plain one, so an encrypted QP carries 20 bytes less payload per packet.
//!
//! The sealing sequence number counts every datagram a side sends on the connection, from 0,
//! retransmissions included, so every datagram gets a fresh nonce: direction bit (0 for A→B,
//! 1 for B→A) || three zero bytes || sequence number. Sequence numbers never wrap: a connection
//! that used 2^64 - 1 of them stops sending (it would take centuries).
//!
//! # Replay rejection
//!
//! The receiver keeps an anti-replay window of [`REPLAY_WINDOW`] sequence numbers (a bitmap,
//! as IPsec's ESP and DTLS): a datagram is accepted once, and one older than the window is
//! refused. The window is consulted and moved only *after* the tag verifies, so forged
//! datagrams cannot move it. The window is wide because spraying reorders datagrams across
//! paths, and a datagram refused as too old is recovered by the ordinary retransmission, which
//! carries a fresh sequence number.
//!
//! Whatever fails is dropped and counted in [`EndpointStats`]: a bad tag (tampered, forged,
//! sealed with another key) or a plain packet arriving at an encrypted QP as `rx_auth_failed`,
//! a replay as `rx_replayed`. Nothing of such a datagram reaches the QP: no memory is touched,
//! no state moves, and other QPs never see it.
//!
//! # Why ring and x25519-dalek
//!
//! ring's AES-GCM (with AES-NI/PCLMULQDQ/AVX assembly) and HKDF are what rustls long used;
//! ring 0.17 cannot build an X25519 private key from given bytes (its random source is sealed),
//! which a sans-IO engine with a deterministic simulator needs, so the agreement comes from
//! x25519-dalek (`StaticSecret::from`). aws-lc-rs can do both, but it compiles all of AWS-LC:
//! measured here (2 cores), ring plus x25519-dalek built from clean in about 17 s, aws-lc-rs
//! in about 105 s.
//!
//! [`QpInfo`]: crate::QpInfo
//! [`QpInfo::seal_key`]: crate::QpInfo::seal_key
//! [`QpOptions::encrypted`]: crate::QpOptions::encrypted
//! [`ResourceError::EncryptionMismatch`]: crate::ResourceError::EncryptionMismatch
//! [`ResourceError::BadPeerKey`]: crate::ResourceError::BadPeerKey
//! [`EndpointStats`]: crate::EndpointStats
use core::cell::Cell;
use core::fmt;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, Zeroizing};

use crate::types::{QpInfo, ResourceError};
use crate::wire::{self, Body, Header, SEAL_SEQ_LEN, SEAL_TAG_LEN};

/// Bytes of an X25519 public or private key.
pub const KEY_LEN: usize = 32;
/// Sealing sequence numbers the anti-replay window spans.
pub const REPLAY_WINDOW: u64 = 4096;
/// Label used as HKDF salt and context prefix (a new version gets new keys).
const LABEL: &[u8] = b"braid seal v1";
/// Bytes of authenticated clear text at the start of a sealed packet.
const AAD_LEN: usize = wire::HEADER_LEN + SEAL_SEQ_LEN;

/// The X25519 public key of a 32-byte private key.
pub fn public_key(secret: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    PublicKey::from(&StaticSecret::from(*secret)).to_bytes()
}

/// One side of a connection, as the key derivation sees it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Party {
    /// X25519 public key.
    pub public: [u8; KEY_LEN],
    /// QP number.
    pub qpn: u32,
    /// First PSN that side sends.
    pub psn: u32,
}

/// Why a sealed datagram was refused by [`Sealer::open`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpenError {
    /// Too short, wrong version or not sealed: not a sealed datagram at all.
    Malformed,
    /// The tag does not verify: tampered with, forged, or sealed with another key.
    BadTag,
    /// The tag verifies but the sequence number was accepted before or is older than the
    /// anti-replay window.
    Replayed,
    /// The tag verifies, but the plaintext does not parse (the peer broke the protocol).
    BadPlaintext(wire::Error),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Malformed => f.write_str("not a sealed datagram"),
            OpenError::BadTag => f.write_str("authentication tag does not verify"),
            OpenError::Replayed => f.write_str("replayed datagram"),
            OpenError::BadPlaintext(e) => write!(f, "authenticated plaintext is malformed: {e}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Anti-replay window over sealing sequence numbers: a ring bitmap of [`REPLAY_WINDOW`] bits
/// below `top`, the highest accepted sequence number plus one.
#[derive(Clone)]
struct ReplayWindow {
    top: u64,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl ReplayWindow {
    fn new() -> ReplayWindow {
        ReplayWindow {
            top: 0,
            bits: [0; (REPLAY_WINDOW / 64) as usize],
        }
    }

    fn slot(seq: u64) -> (usize, u64) {
        let i = seq % REPLAY_WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64)) // i / 64 < REPLAY_WINDOW / 64: in bounds
    }

    /// Accepts `seq` once: false if it was seen or is too old. Call only after the tag
    /// verified.
    fn accept(&mut self, seq: u64) -> bool {
        if seq < self.top {
            if self.top - seq > REPLAY_WINDOW {
                return false;
            }
            let (w, b) = Self::slot(seq);
            if self.bits[w] & b != 0 {
                return false;
            }
            self.bits[w] |= b;
            return true;
        }
        // Slide: forget the slots that [top, seq] reuse.
        if seq - self.top >= REPLAY_WINDOW {
            self.bits = [0; (REPLAY_WINDOW / 64) as usize];
        } else {
            for s in self.top..=seq {
                let (w, b) = Self::slot(s);
                self.bits[w] &= !b;
            }
        }
        let (w, b) = Self::slot(seq);
        self.bits[w] |= b;
        self.top = seq + 1; // seq < u64::MAX: senders never use it (see `Sealer::emit`)
        true
    }
}

/// The sealing state of one connection: the two directions' AES-256-GCM keys, the next
/// sequence number to send and the anti-replay window of what was received.
pub struct Sealer {
    tx: LessSafeKey,
    rx: LessSafeKey,
    tx_dir: u8,
    /// Direction bit of the nonces of received datagrams: the peer's `tx_dir` (the other
    /// bit, or the same one on a QP connected to itself).
    rx_dir: u8,
    next_seq: Cell<u64>,
    window: ReplayWindow,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("tx_dir", &self.tx_dir)
            .field("next_seq", &self.next_seq.get())
            .field("rx_top", &self.window.top)
            .finish()
    }
}

fn nonce(dir: u8, seq: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[0] = dir;
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn direction_key(prk: &ring::hkdf::Prk, context: &[&[u8]], dir: &[u8]) -> LessSafeKey {
    let mut info: [&[u8]; 8] = [&[]; 8];
    info[..context.len()].copy_from_slice(context);
    info[context.len()] = dir;
    let okm = prk
        .expand(&info[..=context.len()], &AES_256_GCM)
        // 32 bytes is far below HKDF-SHA256's limit of 255 * 32.
        .expect("HKDF output length within limits");
    LessSafeKey::new(UnboundKey::from(okm))
}

impl Sealer {
    /// Agrees the keys of a connection between `local` (whose private key is `secret`) and
    /// `peer`. Both sides compute the same two keys.
    pub fn new(secret: &[u8; KEY_LEN], local: Party, peer: Party) -> Result<Sealer, ResourceError> {
        let shared = StaticSecret::from(*secret).diffie_hellman(&PublicKey::from(peer.public));
        if !shared.was_contributory() {
            return Err(ResourceError::BadPeerKey);
        }
        let local_is_a = (local.public, local.qpn) <= (peer.public, peer.qpn);
        let (a, b) = if local_is_a {
            (local, peer)
        } else {
            (peer, local)
        };
        let prk = Salt::new(HKDF_SHA256, LABEL).extract(shared.as_bytes());
        let (qa, pa, qb, pb) = (
            a.qpn.to_be_bytes(),
            a.psn.to_be_bytes(),
            b.qpn.to_be_bytes(),
            b.psn.to_be_bytes(),
        );
        let context: [&[u8]; 7] = [LABEL, &a.public, &qa, &pa, &b.public, &qb, &pb];
        let a_to_b = direction_key(&prk, &context, b"A->B");
        let b_to_a = direction_key(&prk, &context, b"B->A");
        // A QP connected to itself is both parties: it sends and receives A->B, so its
        // receive side expects its own direction bit in the nonce. Its sequence numbers are
        // still used once each (one counter sends, one window receives), so no (key, nonce)
        // pair repeats.
        let (tx, rx, tx_dir, rx_dir) = if local == peer {
            (a_to_b, direction_key(&prk, &context, b"A->B"), 0, 0)
        } else if local_is_a {
            (a_to_b, b_to_a, 0, 1)
        } else {
            (b_to_a, a_to_b, 1, 0)
        };
        Ok(Sealer {
            tx,
            rx,
            tx_dir,
            rx_dir,
            next_seq: Cell::new(0),
            window: ReplayWindow::new(),
        })
    }

    /// The sequence number the next sealed datagram will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.get()
    }

    /// Writes one sealed packet into `buf` (see [`wire::emit`] for the arguments) and returns
    /// its length. Takes the next sequence number only when the packet was written.
    pub fn emit(
        &self,
        buf: &mut [u8],
        header: &Header,
        body: &Body,
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8]),
    ) -> Result<usize, wire::Error> {
        let seq = self.next_seq.get();
        if seq == u64::MAX {
            // Never reached in practice; reusing a nonce would be far worse than stopping.
            return Err(wire::Error::BufferTooSmall);
        }
        let len = wire::emit_for_seal(buf, header, seq, body, payload_len, fill_payload)?;
        self.next_seq.set(seq + 1);
        let (aad, rest) = buf[..len].split_at_mut(AAD_LEN); // len >= AAD_LEN + tag
        let (text, tag_out) = rest.split_at_mut(rest.len() - SEAL_TAG_LEN);
        let tag = self
            .tx
            .seal_in_place_separate_tag(nonce(self.tx_dir, seq), Aad::from(&*aad), text)
            // ring refuses only inputs longer than GCM's 64 GiB limit.
            .map_err(|_| wire::Error::BufferTooSmall)?;
        tag_out.copy_from_slice(tag.as_ref());
        Ok(len)
    }

    /// Verifies and decrypts one sealed datagram into `scratch` (reused between calls), checks
    /// its sequence number against the anti-replay window, and parses the plaintext. The
    /// window moves only for datagrams whose tag verified.
    pub fn open<'s>(
        &mut self,
        datagram: &[u8],
        scratch: &'s mut Vec<u8>,
    ) -> Result<wire::Packet<'s>, OpenError> {
        let peek = wire::peek_sealed(datagram).map_err(|_| OpenError::Malformed)?;
        scratch.clear();
        scratch.extend_from_slice(datagram);
        let (aad, rest) = scratch.split_at_mut(AAD_LEN); // peek checked the length
        self.rx
            .open_in_place(nonce(self.rx_dir, peek.seq), Aad::from(&*aad), rest)
            .map_err(|_| OpenError::BadTag)?;
        if !self.window.accept(peek.seq) {
            return Err(OpenError::Replayed);
        }
        let plain = &scratch[..datagram.len() - SEAL_TAG_LEN];
        wire::Packet::parse_opened(plain).map_err(OpenError::BadPlaintext)
    }
}

/// The sealing state of one QP, as the engine keeps it.
pub(crate) enum QpSeal {
    /// A plain QP.
    Off,
    /// Encrypted, not connected yet: the private key waits for the peer's public key. It is
    /// wiped when the QP connects (the state is replaced) or is dropped.
    Pending {
        secret: Box<Zeroizing<[u8; KEY_LEN]>>,
        public: [u8; KEY_LEN],
    },
    /// Encrypted and connected.
    On {
        sealer: Box<Sealer>,
        public: [u8; KEY_LEN],
    },
}

impl QpSeal {
    pub(crate) fn new(secret: Option<[u8; KEY_LEN]>) -> QpSeal {
        match secret {
            None => QpSeal::Off,
            Some(mut s) => {
                let seal = QpSeal::Pending {
                    public: public_key(&s),
                    secret: Box::new(Zeroizing::new(s)),
                };
                s.zeroize();
                seal
            }
        }
    }

    /// The public key published in [`QpInfo::seal_key`].
    pub(crate) fn public_key(&self) -> Option<[u8; KEY_LEN]> {
        match self {
            QpSeal::Off => None,
            QpSeal::Pending { public, .. } | QpSeal::On { public, .. } => Some(*public),
        }
    }

    /// Bytes a packet of this QP has beyond a plain one.
    pub(crate) fn overhead(&self) -> u32 {
        match self {
            QpSeal::Off => 0,
            _ => wire::SEAL_OVERHEAD as u32,
        }
    }

    /// The sealer, once connected.
    pub(crate) fn sealer(&mut self) -> Option<&mut Sealer> {
        match self {
            QpSeal::On { sealer, .. } => Some(sealer),
            _ => None,
        }
    }

    /// Whether this QP accepts only sealed packets.
    pub(crate) fn is_on(&self) -> bool {
        !matches!(self, QpSeal::Off)
    }

    /// Agrees the keys with `peer` at connect. Changes nothing on error.
    pub(crate) fn connect(
        &mut self,
        qpn: u32,
        psn: u32,
        peer: &QpInfo,
    ) -> Result<(), ResourceError> {
        match (&*self, peer.seal_key) {
            (QpSeal::Off, None) => Ok(()),
            (QpSeal::Off, Some(_)) | (QpSeal::Pending { .. }, None) => {
                Err(ResourceError::EncryptionMismatch)
            }
            (QpSeal::Pending { secret, public }, Some(peer_pub)) => {
                let local = Party {
                    public: *public,
                    qpn,
                    psn,
                };
                let remote = Party {
                    public: peer_pub,
                    qpn: peer.qpn,
                    psn: peer.psn,
                };
                let sealer = Sealer::new(secret, local, remote)?;
                let public = *public;
                *self = QpSeal::On {
                    sealer: Box::new(sealer),
                    public,
                };
                Ok(())
            }
            (QpSeal::On { .. }, _) => Err(ResourceError::BadState),
        }
    }

    /// Writes one packet, sealed if the QP encrypts (see [`wire::emit`]).
    pub(crate) fn emit(
        &self,
        buf: &mut [u8],
        header: &Header,
        body: &Body,
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8]),
    ) -> Result<usize, wire::Error> {
        match self {
            QpSeal::Off => wire::emit(buf, header, body, payload_len, fill_payload),
            QpSeal::On { sealer, .. } => sealer.emit(buf, header, body, payload_len, fill_payload),
            // Nothing is sent before connect.
            QpSeal::Pending { .. } => Err(wire::Error::Sealed),
        }
    }

    /// [`emit`](Self::emit) for a payload copied out of memory regions: `fill_payload` gets
    /// the payload's bytes and, when it should also checksum them, the CRC32C of the bytes
    /// before them (`Some`); it returns the CRC32C through the payload (anything when given
    /// `None`). The CRC goes along with the copy for plain packets whose payload is long
    /// enough for the one-pass copy to pay ([`braid_crc::COPY_FOLD_MIN`]); short payloads
    /// and sealed packets are copied, then checksummed or sealed, as by `emit`.
    pub(crate) fn emit_copied(
        &self,
        buf: &mut [u8],
        header: &Header,
        body: &Body,
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8], Option<u32>) -> u32,
    ) -> Result<usize, wire::Error> {
        match self {
            QpSeal::Off if payload_len >= braid_crc::COPY_FOLD_MIN => {
                wire::emit_with_crc(buf, header, body, payload_len, |p, crc| {
                    fill_payload(p, Some(crc))
                })
            }
            _ => self.emit(buf, header, body, payload_len, |p| {
                fill_payload(p, None);
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_window_accepts_each_number_once() {
        let mut w = ReplayWindow::new();
        assert!(w.accept(5));
        assert!(!w.accept(5));
        assert!(w.accept(3));
        assert!(!w.accept(3));
        assert!(w.accept(0));
        assert!(w.accept(REPLAY_WINDOW + 4));
        // The top is now REPLAY_WINDOW + 5: 5 is the oldest number inside, and was seen.
        assert!(!w.accept(5), "inside the window, seen");
        assert!(!w.accept(3), "older than the window");
        assert!(w.accept(6), "inside the window, never seen");
        assert!(!w.accept(REPLAY_WINDOW + 4));
    }

    #[test]
    fn replay_window_far_jump_forgets_everything() {
        let mut w = ReplayWindow::new();
        for s in 0..100 {
            assert!(w.accept(s));
        }
        assert!(w.accept(10 * REPLAY_WINDOW));
        assert!(!w.accept(99), "far below the window");
        assert!(w.accept(10 * REPLAY_WINDOW - 1));
        assert!(w.accept(9 * REPLAY_WINDOW + 1));
        assert!(
            !w.accept(9 * REPLAY_WINDOW),
            "exactly one window below the top"
        );
    }

    proptest::proptest! {
        /// The window against a naive model: a set of accepted numbers and the highest one.
        /// A number is accepted iff it was never accepted and is no more than REPLAY_WINDOW
        /// below the highest accepted plus one.
        #[test]
        fn replay_window_matches_a_set_model(
            steps in proptest::collection::vec((0u64..3, 0u64..2 * REPLAY_WINDOW), 1..600)
        ) {
            let mut w = ReplayWindow::new();
            let mut seen = std::collections::HashSet::new();
            let mut top = 0u64;
            let mut base = 0u64;
            for (jump, off) in steps {
                // Mostly near the top (reordering), sometimes a leap forward.
                base += jump * REPLAY_WINDOW / 2;
                let seq = base + off;
                let want = !seen.contains(&seq) && (seq >= top || top - seq <= REPLAY_WINDOW);
                proptest::prop_assert_eq!(w.accept(seq), want, "seq {} top {}", seq, top);
                if want {
                    seen.insert(seq);
                    top = top.max(seq + 1);
                }
            }
        }
    }

    #[test]
    fn both_sides_derive_matching_keys_and_directions_differ() {
        let (sa, sb) = ([1u8; 32], [2u8; 32]);
        let a = Party {
            public: public_key(&sa),
            qpn: 7,
            psn: 100,
        };
        let b = Party {
            public: public_key(&sb),
            qpn: 9,
            psn: 200,
        };
        let sealer_a = Sealer::new(&sa, a, b).expect("good keys");
        let mut sealer_b = Sealer::new(&sb, b, a).expect("good keys");
        assert_ne!(sealer_a.tx_dir, sealer_b.tx_dir);
        let h = Header {
            kind: wire::Kind::Nak,
            path: 1,
            flags: 0,
            dst_qpn: 9,
            src_qpn: 7,
            psn: 0,
            send_ts_ns: 5,
        };
        let body = Body::Nak(wire::Nak {
            psn: 1,
            msn: 2,
            syndrome: wire::Syndrome::RemoteAccess,
        });
        let mut buf = [0u8; 128];
        let len = sealer_a.emit(&mut buf, &h, &body, 0, |_| {}).expect("room");
        let mut scratch = Vec::new();
        let p = sealer_b.open(&buf[..len], &mut scratch).expect("opens");
        assert_eq!(p.body, body);
        // A's own receive key is the other direction: its own packet does not open.
        let mut sealer_a = sealer_a;
        assert_eq!(
            sealer_a.open(&buf[..len], &mut scratch).map(|_| ()),
            Err(OpenError::BadTag)
        );
    }

    #[test]
    fn a_qp_connected_to_itself_opens_its_own_packets_once() {
        let secret = [3u8; 32];
        let me = Party {
            public: public_key(&secret),
            qpn: 5,
            psn: 42,
        };
        let mut sealer = Sealer::new(&secret, me, me).expect("good key");
        let h = Header {
            kind: wire::Kind::Nak,
            path: 0,
            flags: 0,
            dst_qpn: 5,
            src_qpn: 5,
            psn: 0,
            send_ts_ns: 1,
        };
        let body = Body::Nak(wire::Nak {
            psn: 3,
            msn: 4,
            syndrome: wire::Syndrome::InvalidRequest,
        });
        let mut scratch = Vec::new();
        let mut bufs = [[0u8; 128]; 2];
        let mut lens = [0usize; 2];
        for (buf, len) in bufs.iter_mut().zip(&mut lens) {
            *len = sealer.emit(buf, &h, &body, 0, |_| {}).expect("room");
        }
        // Out of order, then a replay.
        for (buf, len) in bufs.iter().zip(lens).rev() {
            let p = sealer.open(&buf[..len], &mut scratch).expect("opens");
            assert_eq!(p.body, body);
        }
        assert_eq!(
            sealer.open(&bufs[0][..lens[0]], &mut scratch).map(|_| ()),
            Err(OpenError::Replayed)
        );
    }

    #[test]
    fn low_order_peer_key_is_refused() {
        let a = Party {
            public: public_key(&[1u8; 32]),
            qpn: 1,
            psn: 0,
        };
        let zero = Party {
            public: [0u8; 32],
            qpn: 2,
            psn: 0,
        };
        assert_eq!(
            Sealer::new(&[1u8; 32], a, zero).map(|_| ()),
            Err(ResourceError::BadPeerKey)
        );
    }
}
