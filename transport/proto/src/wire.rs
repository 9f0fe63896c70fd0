//! Braid's packet formats, all in one place, in the manner of smoltcp's `wire` module.
//!
//! Every Braid packet is one UDP payload: a 24-byte common header ([`Header`]), a per-kind
//! header ([`Request`], [`ReadResponse`], [`AtomicResponse`], [`Ack`], [`Nak`]; each type's
//! documentation draws its layout), an optional payload, and a 4-byte CRC32C trailer computed
//! over everything before it (like RoCE's ICRC). All integers are big-endian (network order).
//!
//! A QP created with encryption sends every packet *sealed* instead (requests, READ and atomic
//! responses, ACKs and NAKs alike): the [`Flags::SEALED`] bit is set in the common header, an
//! 8-byte sealing sequence number follows the header in clear, the per-kind header and payload
//! are AES-256-GCM ciphertext, and a 16-byte tag replaces the CRC32C trailer (the tag covers
//! integrity, so no CRC is computed or checked). See [`crate::seal`].
//!
//! ```text
//! Trailer, in every packet that is not sealed:
//! +---------------------------------------------------------------+
//! |   CRC32C (Castagnoli) of every byte before it                 |
//! +---------------------------------------------------------------+
//!
//! A sealed packet (flags & SEALED), any kind:
//! +---------------------------------------------------------------+
//! |   common header (24 bytes, as above, SEALED set)              |  authenticated (AAD),
//! |                                                               |  in clear
//! +---------------------------------------------------------------+
//! |   sealing sequence number (64 bits), per direction, from 0,   |  authenticated (AAD),
//! |   fresh for every datagram sent, retransmissions included     |  in clear
//! +---------------------------------------------------------------+
//! |   per-kind header and payload, exactly as above               |  AES-256-GCM
//! |   (the same length: GCM is a stream mode)                     |  ciphertext
//! +---------------------------------------------------------------+
//! |   GCM authentication tag (16 bytes)                           |
//! |                                                               |
//! +---------------------------------------------------------------+
//!   nonce (12 bytes) = direction (1 byte: 0 from the lower party, 1 from the higher; see
//!   crate::seal) || 3 zero bytes || sealing sequence number (8 bytes)
//! ```
//!
//! # Two levels
//!
//! - [`field`] holds one table of byte ranges per header. Every read and write of a header
//!   field, in the view, the parser, the writer, [`peek_sealed`] and [`is_sealed`], goes
//!   through it, so the layout is written down once.
//! - [`view::Packet`] (also [`PacketView`]) is a checked view over the bytes of a datagram:
//!   [`new_checked`](view::Packet::new_checked) (or [`check_len`](view::Packet::check_len)
//!   after [`new_unchecked`](view::Packet::new_unchecked)) checks the length once, and then
//!   no accessor of the view panics, whatever the bytes say.
//! - [`Repr`] is the parsed, high-level form: [`Repr::parse`] checks the CRC and every field's
//!   range, [`Repr::emit`] writes a packet, [`Repr::buffer_len`] says how long it will be.
//!   [`Packet`] (a `Repr` plus its borrowed payload) and the free functions [`emit`],
//!   [`emit_for_seal`] and [`packet_len`] are the same operations in the form the engine
//!   calls them.
//!
//! The fixed layouts are described by the field table rather than by `zerocopy` structs: one
//! table serves the view, the parser, the writer and the sealed-packet peeks over the same
//! bytes (including a per-kind header that starts 24 or 32 bytes in, depending on a flag), and
//! the sans-IO core keeps its short dependency list.
//!
//! Parsing never panics: a packet that is short, has a bad CRC, an unknown version, kind, op
//! or syndrome, or a length field that disagrees with its payload is rejected with an
//! [`Error`].
use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use crate::seq::Psn;

/// Protocol version carried in every packet.
pub const VERSION: u8 = 1;
/// Bytes of the common header.
pub const HEADER_LEN: usize = 24;
/// Bytes of the CRC32C trailer.
pub const TRAILER_LEN: usize = 4;
/// Bits in an ACK's SACK bitmap.
pub const SACK_BITS: u32 = 256;
/// Largest per-kind header (REQUEST).
pub const MAX_BODY_LEN: usize = REQUEST_LEN;
/// Bytes of a REQUEST header.
pub const REQUEST_LEN: usize = 36;
/// Bytes of a READ RESPONSE header.
pub const READ_RESP_LEN: usize = 16;
/// Bytes of an ATOMIC RESPONSE header.
pub const ATOMIC_RESP_LEN: usize = 16;
/// Bytes of an ACK body.
pub const ACK_LEN: usize = 24 + SACK_BITS as usize / 8;
/// Bytes of a NAK body.
pub const NAK_LEN: usize = 12;
/// Bytes of an atomic request's payload (operand, compare).
pub const ATOMIC_OPERANDS_LEN: usize = 16;
/// Bytes of the sealing sequence number that follows the common header of a sealed packet.
pub const SEAL_SEQ_LEN: usize = 8;
/// Bytes of the AES-GCM tag that ends a sealed packet (in place of the CRC32C trailer).
pub const SEAL_TAG_LEN: usize = 16;
/// Bytes a sealed packet has beyond the plain packet with the same body and payload.
pub const SEAL_OVERHEAD: usize = SEAL_SEQ_LEN + SEAL_TAG_LEN - TRAILER_LEN;

/// Why a packet could not be parsed. Tiny and `Copy`, as smoltcp's.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// Shorter than its headers say.
    Truncated,
    /// The CRC32C trailer does not match.
    BadCrc,
    /// Unknown protocol version.
    BadVersion,
    /// Unknown packet kind.
    BadKind,
    /// Unknown request op code.
    BadOp,
    /// Unknown NAK syndrome.
    BadSyndrome,
    /// A length or offset field is inconsistent with the payload.
    BadLength,
    /// The output buffer is too small.
    BufferTooSmall,
    /// The packet is sealed: it can only be read with its connection's key
    /// ([`crate::seal::Sealer::open`]).
    Sealed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Error::Truncated => "truncated packet",
            Error::BadCrc => "CRC32C mismatch",
            Error::BadVersion => "unknown protocol version",
            Error::BadKind => "unknown packet kind",
            Error::BadOp => "unknown request op",
            Error::BadSyndrome => "unknown NAK syndrome",
            Error::BadLength => "inconsistent length field",
            Error::BufferTooSmall => "output buffer too small",
            Error::Sealed => "sealed packet (needs its connection's key)",
        };
        f.write_str(s)
    }
}

impl std::error::Error for Error {}

/// Byte ranges of every header field, one table per header, as smoltcp's `wire` modules
/// keep them. Common-header and sealing fields count from the start of the datagram;
/// per-kind fields count from the start of their header (byte [`HEADER_LEN`] of a plain
/// packet, [`HEADER_LEN`]` + `[`SEAL_SEQ_LEN`] of a sealed one).
pub mod field {
    /// A range of bytes.
    pub type Field = core::ops::Range<usize>;

    /// Protocol version ([`VERSION`](super::VERSION)).
    pub const VERSION: usize = 0;
    /// Packet kind ([`Kind`](super::Kind)).
    pub const KIND: usize = 1;
    /// Path index the sender used.
    pub const PATH: usize = 2;
    /// [`Flags`](super::Flags).
    pub const FLAGS: usize = 3;
    /// Destination QP number.
    pub const DST_QPN: Field = 4..8;
    /// Source QP number.
    pub const SRC_QPN: Field = 8..12;
    /// Packet sequence number.
    pub const PSN: Field = 12..16;
    /// Send timestamp, ns.
    pub const SEND_TS: Field = 16..24;
    /// Sealing sequence number, in sealed packets only.
    pub const SEAL_SEQ: Field = 24..32;

    /// The REQUEST header ([`Request`](super::Request)).
    pub mod request {
        use super::Field;
        /// [`Op`](crate::wire::Op) code.
        pub const OP: usize = 0;
        /// Reserved, zero.
        pub const RESERVED: Field = 1..4;
        /// Message number.
        pub const MSN: Field = 4..8;
        /// Receive-consuming sequence number.
        pub const SSN: Field = 8..12;
        /// Immediate data.
        pub const IMM: Field = 12..16;
        /// Remote key.
        pub const RKEY: Field = 16..20;
        /// Message length.
        pub const MSG_LEN: Field = 20..24;
        /// Offset of the payload within the message.
        pub const OFFSET: Field = 24..28;
        /// Offset within the remote region.
        pub const REMOTE_OFFSET: Field = 28..36;
    }

    /// The READ RESPONSE header ([`ReadResponse`](super::ReadResponse)).
    pub mod read_resp {
        use super::Field;
        /// MSN of the READ.
        pub const MSN: Field = 0..4;
        /// Offset of the payload within the READ.
        pub const OFFSET: Field = 4..8;
        /// Total READ length.
        pub const MSG_LEN: Field = 8..12;
        /// Reserved, zero.
        pub const RESERVED: Field = 12..16;
    }

    /// The ATOMIC RESPONSE header ([`AtomicResponse`](super::AtomicResponse)).
    pub mod atomic_resp {
        use super::Field;
        /// MSN of the atomic.
        pub const MSN: Field = 0..4;
        /// Reserved, zero.
        pub const RESERVED: Field = 4..8;
        /// Original value at the target.
        pub const ORIGINAL: Field = 8..16;
    }

    /// The ACK header ([`Ack`](super::Ack)).
    pub mod ack {
        use super::Field;
        /// Cumulative PSN.
        pub const CUM_PSN: Field = 0..4;
        /// Echoed PSN.
        pub const ECHO_PSN: Field = 4..8;
        /// Echoed send timestamp, ns.
        pub const ECHO_TS: Field = 8..16;
        /// Holding time at the receiver, ns.
        pub const HOLD: Field = 16..20;
        /// CE-marked packets received so far.
        pub const CE_COUNT: Field = 20..24;
        /// SACK bitmap.
        pub const SACK: Field = 24..56;
    }

    /// The NAK header ([`Nak`](super::Nak)).
    pub mod nak {
        use super::Field;
        /// PSN of the refused packet.
        pub const PSN: Field = 0..4;
        /// MSN of its message.
        pub const MSN: Field = 4..8;
        /// [`Syndrome`](crate::wire::Syndrome) code.
        pub const SYNDROME: usize = 8;
        /// Reserved, zero.
        pub const RESERVED: Field = 9..12;
    }
}

// The tables and the length constants agree: every header ends where its table ends.
const _: () = {
    assert!(field::SEND_TS.end == HEADER_LEN);
    assert!(field::SEAL_SEQ.end == HEADER_LEN + SEAL_SEQ_LEN);
    assert!(field::request::REMOTE_OFFSET.end == REQUEST_LEN);
    assert!(field::read_resp::RESERVED.end == READ_RESP_LEN);
    assert!(field::atomic_resp::ORIGINAL.end == ATOMIC_RESP_LEN);
    assert!(field::ack::SACK.end == ACK_LEN);
    assert!(field::ack::SACK.end - field::ack::SACK.start == SACK_BITS as usize / 8);
    assert!(field::nak::RESERVED.end == NAK_LEN);
};

/// Reads a big-endian u32 at `f`. `b` must hold `f` (callers pass a slice they sized from
/// the same table).
fn get_u32(b: &[u8], f: field::Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_be_bytes(a)
}

/// Reads a big-endian u64 at `f`; `b` must hold `f`.
fn get_u64(b: &[u8], f: field::Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_be_bytes(a)
}

/// Writes `v` big-endian at `f`; `b` must hold `f`.
fn put_u32(b: &mut [u8], f: field::Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Writes `v` big-endian at `f`; `b` must hold `f`.
fn put_u64(b: &mut [u8], f: field::Field, v: u64) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Packet kinds (byte 1 of the common header).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A request: SEND, WRITE, READ or atomic.
    Request = 1,
    /// Data answering a READ.
    ReadResponse = 2,
    /// The original value answering an atomic.
    AtomicResponse = 3,
    /// Selective acknowledgement.
    Ack = 4,
    /// Negative acknowledgement.
    Nak = 5,
}

impl Kind {
    /// The kind with wire code `v`, or [`Error::BadKind`].
    pub const fn from_u8(v: u8) -> Result<Kind, Error> {
        Ok(match v {
            1 => Kind::Request,
            2 => Kind::ReadResponse,
            3 => Kind::AtomicResponse,
            4 => Kind::Ack,
            5 => Kind::Nak,
            _ => return Err(Error::BadKind),
        })
    }

    /// Bytes of this kind's per-kind header.
    pub const fn header_len(self) -> usize {
        match self {
            Kind::Request => REQUEST_LEN,
            Kind::ReadResponse => READ_RESP_LEN,
            Kind::AtomicResponse => ATOMIC_RESP_LEN,
            Kind::Ack => ACK_LEN,
            Kind::Nak => NAK_LEN,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Request => "REQ",
            Kind::ReadResponse => "READ_RESP",
            Kind::AtomicResponse => "ATOMIC_RESP",
            Kind::Ack => "ACK",
            Kind::Nak => "NAK",
        })
    }
}

/// Request op codes (first byte of a REQUEST header).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// SEND: payload goes into the receiver's matching posted RECV.
    Send = 0,
    /// SEND with immediate data.
    SendImm = 1,
    /// RDMA WRITE into a remote region.
    Write = 2,
    /// RDMA WRITE with immediate: also consumes a RECV at the target.
    WriteImm = 3,
    /// RDMA READ from a remote region.
    Read = 4,
    /// 8-byte atomic fetch-and-add.
    FetchAdd = 5,
    /// 8-byte atomic compare-and-swap.
    CompareSwap = 6,
}

impl Op {
    /// The op with wire code `v`, or [`Error::BadOp`].
    pub const fn from_u8(v: u8) -> Result<Op, Error> {
        Ok(match v {
            0 => Op::Send,
            1 => Op::SendImm,
            2 => Op::Write,
            3 => Op::WriteImm,
            4 => Op::Read,
            5 => Op::FetchAdd,
            6 => Op::CompareSwap,
            _ => return Err(Error::BadOp),
        })
    }

    /// Whether this op consumes a posted RECV at the target.
    pub fn consumes_recv(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::WriteImm)
    }

    /// Whether the request carries message bytes as payload.
    pub fn carries_data(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::Write | Op::WriteImm)
    }

    /// Whether this op is an 8-byte atomic.
    pub fn is_atomic(self) -> bool {
        matches!(self, Op::FetchAdd | Op::CompareSwap)
    }
}

/// Why a responder refused a request (NAK syndrome).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Syndrome {
    /// Receiver not ready: no RECV posted for this SEND.
    ReceiverNotReady = 1,
    /// Bad key, bounds or access rights.
    RemoteAccess = 2,
    /// The request is invalid at the responder (e.g. longer than the posted RECV).
    InvalidRequest = 3,
    /// The responder failed the operation (e.g. its QP is in error).
    RemoteOperation = 4,
}

impl Syndrome {
    /// The syndrome with wire code `v`, or [`Error::BadSyndrome`].
    pub const fn from_u8(v: u8) -> Result<Syndrome, Error> {
        Ok(match v {
            1 => Syndrome::ReceiverNotReady,
            2 => Syndrome::RemoteAccess,
            3 => Syndrome::InvalidRequest,
            4 => Syndrome::RemoteOperation,
            _ => return Err(Error::BadSyndrome),
        })
    }
}

/// The flags byte of the common header. Unknown bits are kept as they are (a receiver
/// ignores them), so every byte is a valid `Flags`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u8);

impl Flags {
    /// No flag set.
    pub const EMPTY: Flags = Flags(0);
    /// This packet is a retransmission.
    pub const RETRANSMIT: Flags = Flags(0x01);
    /// In ACKs: a duplicate data packet arrived since the previous ACK (a retransmission
    /// that was not needed, or network duplication), like TCP's D-SACK. The sender widens
    /// its reordering window on it.
    pub const DUPLICATE: Flags = Flags(0x02);
    /// The packet is sealed (encrypted and authenticated, see [`crate::seal`]); a sealing
    /// sequence number follows the header and a tag ends it.
    pub const SEALED: Flags = Flags(0x04);

    /// The flags of a flags byte, unknown bits included.
    pub const fn from_bits(bits: u8) -> Flags {
        Flags(bits)
    }

    /// The flags byte.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the flags of `other` set too.
    pub const fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    /// `self` without the flags of `other`.
    pub const fn difference(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }
}

impl BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        self.union(rhs)
    }
}

impl BitOrAssign for Flags {
    fn bitor_assign(&mut self, rhs: Flags) {
        *self = self.union(rhs);
    }
}

impl fmt::Display for Flags {
    /// The set flags' names followed by a space each (`rtx dup sealed `), as the packet
    /// printer uses them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (flag, name) in [
            (Flags::RETRANSMIT, "rtx "),
            (Flags::DUPLICATE, "dup "),
            (Flags::SEALED, "sealed "),
        ] {
            if self.contains(flag) {
                f.write_str(name)?;
            }
        }
        Ok(())
    }
}

/// Common header flag: this packet is a retransmission ([`Flags::RETRANSMIT`]).
pub const FLAG_RETRANSMIT: u8 = Flags::RETRANSMIT.bits();
/// Common header flag, in ACKs: a duplicate arrived ([`Flags::DUPLICATE`]).
pub const FLAG_DUPLICATE: u8 = Flags::DUPLICATE.bits();
/// Common header flag: the packet is sealed ([`Flags::SEALED`]).
pub const FLAG_SEALED: u8 = Flags::SEALED.bits();

/// The common header, in every packet ([`field`]: `VERSION` to `SEND_TS`).
///
/// ```text
///  0                   1                   2                   3
///  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
/// +---------------+---------------+---------------+---------------+
/// |  version (1)  |     kind      |     path      |     flags     |
/// +---------------+---------------+---------------+---------------+
/// |                  destination QP number                        |
/// +---------------------------------------------------------------+
/// |                     source QP number                          |
/// +---------------------------------------------------------------+
/// |       packet sequence number (PSN; 0 in ACK and NAK)          |
/// +---------------------------------------------------------------+
/// |              send timestamp, ns (sender's clock)              |
/// |                                                               |
/// +---------------------------------------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// What follows.
    pub kind: Kind,
    /// Path index the sender used (telemetry; the UDP source port is what routes).
    pub path: u8,
    /// Flags, `FLAG_*` (see [`Flags`] and [`Header::flag_set`]).
    pub flags: u8,
    /// Receiving QP.
    pub dst_qpn: u32,
    /// Sending QP.
    pub src_qpn: u32,
    /// Packet sequence number in the sender's space (0 for ACK/NAK).
    pub psn: u32,
    /// Sender's clock at transmission, ns.
    pub send_ts_ns: u64,
}

impl Header {
    /// [`flags`](Self::flags) as a typed [`Flags`].
    pub const fn flag_set(&self) -> Flags {
        Flags::from_bits(self.flags)
    }

    /// Reads the common header from `b`, which holds at least [`HEADER_LEN`] bytes, with
    /// its kind already decoded.
    fn read(b: &[u8], kind: Kind) -> Header {
        Header {
            kind,
            path: b[field::PATH],
            flags: b[field::FLAGS],
            dst_qpn: get_u32(b, field::DST_QPN),
            src_qpn: get_u32(b, field::SRC_QPN),
            psn: get_u32(b, field::PSN),
            send_ts_ns: get_u64(b, field::SEND_TS),
        }
    }
}

/// REQUEST header fields: kind 1, 36 bytes, then the payload. SEND, WRITE, READ and atomic
/// requests ([`field::request`]).
///
/// ```text
/// +---------------+-----------------------------------------------+
/// |      op       |                  reserved (0)                 |
/// +---------------+-----------------------------------------------+
/// |   MSN: message number in the requester's send queue           |
/// +---------------------------------------------------------------+
/// |   SSN: receive-consuming number (SEND, WRITE_IMM; else 0)     |
/// +---------------------------------------------------------------+
/// |   immediate data (SEND_IMM, WRITE_IMM; else 0)                |
/// +---------------------------------------------------------------+
/// |   remote key (WRITE, READ, atomics; else 0)                   |
/// +---------------------------------------------------------------+
/// |   message length in bytes (READ: bytes to read; atomics: 8)   |
/// +---------------------------------------------------------------+
/// |   offset of this payload within the message                   |
/// +---------------------------------------------------------------+
/// |   remote offset within the region (WRITE, READ, atomics)      |
/// |                                                               |
/// +---------------------------------------------------------------+
/// | payload: message bytes [offset, offset+len) for SEND/WRITE;   |
/// | none for READ; for atomics 16 bytes: add-or-swap, compare     |
/// +---------------------------------------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    /// Operation.
    pub op: Op,
    /// Message number in the requester's send queue.
    pub msn: u32,
    /// Receive-consuming sequence number (SEND/WRITE_IMM).
    pub ssn: u32,
    /// Immediate data.
    pub imm: u32,
    /// Remote key.
    pub rkey: u32,
    /// Total message length (READ: bytes to read; atomics: 8).
    pub msg_len: u32,
    /// Offset of this packet's payload within the message.
    pub offset: u32,
    /// Offset within the remote region.
    pub remote_offset: u64,
}

/// READ RESPONSE header fields: kind 2, 16 bytes, then the payload
/// ([`field::read_resp`]).
///
/// ```text
/// +---------------------------------------------------------------+
/// |   MSN of the READ request being answered                      |
/// +---------------------------------------------------------------+
/// |   offset of this payload within the READ                      |
/// +---------------------------------------------------------------+
/// |   total READ length                                           |
/// +---------------------------------------------------------------+
/// |   reserved (0)                                                |
/// +---------------------------------------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReadResponse {
    /// MSN of the READ.
    pub msn: u32,
    /// Offset of this payload within the READ.
    pub offset: u32,
    /// Total READ length.
    pub msg_len: u32,
}

/// ATOMIC RESPONSE fields: kind 3, 16 bytes, no payload ([`field::atomic_resp`]).
///
/// ```text
/// +---------------------------------------------------------------+
/// |   MSN of the atomic request being answered                    |
/// +---------------------------------------------------------------+
/// |   reserved (0)                                                |
/// +---------------------------------------------------------------+
/// |   original value at the target (before the operation)         |
/// |                                                               |
/// +---------------------------------------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AtomicResponse {
    /// MSN of the atomic.
    pub msn: u32,
    /// Value at the target before the operation.
    pub original: u64,
}

/// ACK fields: kind 4, 56 bytes, no payload; a selective acknowledgement with telemetry
/// echo ([`field::ack`]).
///
/// ```text
/// +---------------------------------------------------------------+
/// |   cumulative PSN: every PSN before it has been received       |
/// +---------------------------------------------------------------+
/// |   echoed PSN (the newest packet this ACK answers)             |
/// +---------------------------------------------------------------+
/// |   echoed send timestamp of that packet, ns                    |
/// |                                                               |
/// +---------------------------------------------------------------+
/// |   holding time at the receiver for that packet, ns            |
/// +---------------------------------------------------------------+
/// |   CE-marked packets received so far (wrapping counter)        |
/// +---------------------------------------------------------------+
/// |   SACK bitmap, 256 bits: bit i (byte i/8, LSB first) set      |
/// |   = PSN cumulative+1+i received                               |
/// |                          (32 bytes)                           |
/// +---------------------------------------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ack {
    /// Every PSN before this one has been received.
    pub cum_psn: u32,
    /// PSN of the packet whose timestamp is echoed.
    pub echo_psn: u32,
    /// Its send timestamp, ns.
    pub echo_ts_ns: u64,
    /// How long the receiver held it before this ACK, ns.
    pub hold_ns: u32,
    /// CE-marked packets received so far (wrapping).
    pub ce_count: u32,
    /// Bit i set: PSN `cum_psn + 1 + i` was received.
    pub sack: [u8; SACK_BITS as usize / 8],
}

impl Ack {
    /// Whether the SACK bitmap says `psn` was received (false outside its range).
    pub fn sacked(&self, psn: u32) -> bool {
        let d = Psn(psn).since(Psn(self.cum_psn) + 1);
        if d >= SACK_BITS {
            return false;
        }
        let byte = self.sack[(d / 8) as usize]; // d < 256: index < 32, the array's length
        byte & (1 << (d % 8)) != 0
    }
}

/// NAK fields: kind 5, 12 bytes, no payload; a request that cannot be accepted
/// ([`field::nak`]).
///
/// ```text
/// +---------------------------------------------------------------+
/// |   PSN of the refused packet                                   |
/// +---------------------------------------------------------------+
/// |   MSN of its message                                          |
/// +---------------+-----------------------------------------------+
/// |   syndrome    |                  reserved (0)                 |
/// +---------------+-----------------------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nak {
    /// PSN of the refused packet.
    pub psn: u32,
    /// MSN of its message.
    pub msn: u32,
    /// Why.
    pub syndrome: Syndrome,
}

/// The per-kind part of a packet.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    /// A request.
    Request(Request),
    /// READ response data.
    ReadResponse(ReadResponse),
    /// Atomic response.
    AtomicResponse(AtomicResponse),
    /// Acknowledgement.
    Ack(Ack),
    /// Negative acknowledgement.
    Nak(Nak),
}

impl Body {
    /// The kind byte for this body.
    pub fn kind(&self) -> Kind {
        match self {
            Body::Request(_) => Kind::Request,
            Body::ReadResponse(_) => Kind::ReadResponse,
            Body::AtomicResponse(_) => Kind::AtomicResponse,
            Body::Ack(_) => Kind::Ack,
            Body::Nak(_) => Kind::Nak,
        }
    }

    /// Bytes of this body's header.
    pub fn len(&self) -> usize {
        self.kind().header_len()
    }

    /// Always false: every body has a header. (Present for clippy's `len` convention.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Decodes a per-kind header of kind `kind` from the front of `rest` (the bytes after
    /// the common header and, if sealed, the sequence number). The op and syndrome codes
    /// are checked as soon as their byte is there, so a packet cut short after a bad code
    /// reports the code.
    fn parse(kind: Kind, rest: &[u8]) -> Result<Body, Error> {
        let op = match kind {
            Kind::Request => Some(Op::from_u8(
                *rest.get(field::request::OP).ok_or(Error::Truncated)?,
            )?),
            _ => None,
        };
        if kind == Kind::Nak
            && let Some(&code) = rest.get(field::nak::SYNDROME)
        {
            Syndrome::from_u8(code)?;
        }
        let b = rest.get(..kind.header_len()).ok_or(Error::Truncated)?;
        // `b` holds the whole header of `kind`, so every field of its table is in range.
        Ok(match (kind, op) {
            (Kind::Request, Some(op)) => {
                use field::request as f;
                Body::Request(Request {
                    op,
                    msn: get_u32(b, f::MSN),
                    ssn: get_u32(b, f::SSN),
                    imm: get_u32(b, f::IMM),
                    rkey: get_u32(b, f::RKEY),
                    msg_len: get_u32(b, f::MSG_LEN),
                    offset: get_u32(b, f::OFFSET),
                    remote_offset: get_u64(b, f::REMOTE_OFFSET),
                })
            }
            (Kind::ReadResponse, _) => {
                use field::read_resp as f;
                Body::ReadResponse(ReadResponse {
                    msn: get_u32(b, f::MSN),
                    offset: get_u32(b, f::OFFSET),
                    msg_len: get_u32(b, f::MSG_LEN),
                })
            }
            (Kind::AtomicResponse, _) => {
                use field::atomic_resp as f;
                Body::AtomicResponse(AtomicResponse {
                    msn: get_u32(b, f::MSN),
                    original: get_u64(b, f::ORIGINAL),
                })
            }
            (Kind::Ack, _) => {
                use field::ack as f;
                let mut sack = [0u8; SACK_BITS as usize / 8];
                sack.copy_from_slice(&b[f::SACK]);
                Body::Ack(Ack {
                    cum_psn: get_u32(b, f::CUM_PSN),
                    echo_psn: get_u32(b, f::ECHO_PSN),
                    echo_ts_ns: get_u64(b, f::ECHO_TS),
                    hold_ns: get_u32(b, f::HOLD),
                    ce_count: get_u32(b, f::CE_COUNT),
                    sack,
                })
            }
            (Kind::Nak, _) => {
                use field::nak as f;
                Body::Nak(Nak {
                    psn: get_u32(b, f::PSN),
                    msn: get_u32(b, f::MSN),
                    syndrome: Syndrome::from_u8(b[f::SYNDROME])?,
                })
            }
            (Kind::Request, None) => return Err(Error::BadOp), // `op` is Some for requests
        })
    }

    /// Writes this per-kind header into `b`, exactly [`len`](Self::len) bytes long,
    /// reserved bytes zero.
    fn emit(&self, b: &mut [u8]) {
        b.fill(0);
        match self {
            Body::Request(r) => {
                use field::request as f;
                b[f::OP] = r.op as u8;
                put_u32(b, f::MSN, r.msn);
                put_u32(b, f::SSN, r.ssn);
                put_u32(b, f::IMM, r.imm);
                put_u32(b, f::RKEY, r.rkey);
                put_u32(b, f::MSG_LEN, r.msg_len);
                put_u32(b, f::OFFSET, r.offset);
                put_u64(b, f::REMOTE_OFFSET, r.remote_offset);
            }
            Body::ReadResponse(r) => {
                use field::read_resp as f;
                put_u32(b, f::MSN, r.msn);
                put_u32(b, f::OFFSET, r.offset);
                put_u32(b, f::MSG_LEN, r.msg_len);
            }
            Body::AtomicResponse(r) => {
                use field::atomic_resp as f;
                put_u32(b, f::MSN, r.msn);
                put_u64(b, f::ORIGINAL, r.original);
            }
            Body::Ack(a) => {
                use field::ack as f;
                put_u32(b, f::CUM_PSN, a.cum_psn);
                put_u32(b, f::ECHO_PSN, a.echo_psn);
                put_u64(b, f::ECHO_TS, a.echo_ts_ns);
                put_u32(b, f::HOLD, a.hold_ns);
                put_u32(b, f::CE_COUNT, a.ce_count);
                b[f::SACK].copy_from_slice(&a.sack);
            }
            Body::Nak(n) => {
                use field::nak as f;
                put_u32(b, f::PSN, n.psn);
                put_u32(b, f::MSN, n.msn);
                b[f::SYNDROME] = n.syndrome as u8;
            }
        }
    }

    /// Checks that the length fields agree with the payload carried.
    fn check_payload(&self, payload_len: usize) -> Result<(), Error> {
        let len = u64::try_from(payload_len).map_err(|_| Error::BadLength)?;
        let ok = match self {
            Body::Request(r) => match r.op {
                Op::Read => len == 0,
                Op::FetchAdd | Op::CompareSwap => {
                    r.msg_len == 8 && len == ATOMIC_OPERANDS_LEN as u64
                }
                _ => u64::from(r.offset) + len <= u64::from(r.msg_len),
            },
            Body::ReadResponse(r) => u64::from(r.offset) + len <= u64::from(r.msg_len),
            Body::AtomicResponse(_) | Body::Ack(_) | Body::Nak(_) => len == 0,
        };
        if ok { Ok(()) } else { Err(Error::BadLength) }
    }
}

/// The checked view over a datagram's bytes (smoltcp's `Packet<T>`).
pub mod view {
    use super::{
        Error, Flags, HEADER_LEN, Kind, SEAL_SEQ_LEN, SEAL_TAG_LEN, TRAILER_LEN, field, get_u32,
        get_u64, put_u32, put_u64,
    };
    use core::fmt;

    /// A view over the bytes of one datagram, plain or sealed, giving typed access to the
    /// common header, the sealing sequence number and the trailer.
    ///
    /// # No panics after `check_len`
    ///
    /// Once [`check_len`](Self::check_len) has succeeded (or the view came from
    /// [`new_checked`](Self::new_checked)), no accessor or setter of this view panics,
    /// whatever the bytes hold: the common-header fields are within the checked length, and
    /// everything whose place depends on the flags byte (the sequence number, the trailer,
    /// the per-kind bytes) is looked up with bounds checks. On a view made with
    /// [`new_unchecked`](Self::new_unchecked) and never checked, the common-header accessors
    /// panic if the buffer is shorter than [`HEADER_LEN`].
    #[derive(Copy, Clone, Debug, PartialEq, Eq)]
    pub struct Packet<T: AsRef<[u8]>> {
        buffer: T,
    }

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Wraps `buffer` without looking at it.
        pub const fn new_unchecked(buffer: T) -> Packet<T> {
            Packet { buffer }
        }

        /// Wraps `buffer` and checks its length ([`check_len`](Self::check_len)).
        pub fn new_checked(buffer: T) -> Result<Packet<T>, Error> {
            let packet = Packet::new_unchecked(buffer);
            packet.check_len()?;
            Ok(packet)
        }

        /// Checks that the buffer holds the common header and the trailer: at least
        /// [`HEADER_LEN`]` + `[`TRAILER_LEN`] bytes, and for a sealed packet (its flags byte
        /// says so) the sequence number and the tag too. The per-kind header is not checked:
        /// [`Repr::parse`](super::Repr::parse) does that with the kind.
        pub fn check_len(&self) -> Result<(), Error> {
            let len = self.buffer.as_ref().len();
            if len < HEADER_LEN + TRAILER_LEN {
                return Err(Error::Truncated);
            }
            if self.is_sealed() && len < HEADER_LEN + SEAL_SEQ_LEN + SEAL_TAG_LEN {
                return Err(Error::Truncated);
            }
            Ok(())
        }

        /// The buffer.
        pub fn into_inner(self) -> T {
            self.buffer
        }

        /// Bytes in the buffer.
        pub fn total_len(&self) -> usize {
            self.buffer.as_ref().len()
        }

        /// The protocol version byte.
        pub fn version(&self) -> u8 {
            self.buffer.as_ref()[field::VERSION]
        }

        /// The kind byte, undecoded.
        pub fn kind_code(&self) -> u8 {
            self.buffer.as_ref()[field::KIND]
        }

        /// The kind, or [`Error::BadKind`].
        pub fn kind(&self) -> Result<Kind, Error> {
            Kind::from_u8(self.kind_code())
        }

        /// The path index.
        pub fn path(&self) -> u8 {
            self.buffer.as_ref()[field::PATH]
        }

        /// The flags.
        pub fn flags(&self) -> Flags {
            Flags::from_bits(self.buffer.as_ref()[field::FLAGS])
        }

        /// Whether the flags say the packet is sealed (false for a buffer too short to say).
        pub fn is_sealed(&self) -> bool {
            self.buffer
                .as_ref()
                .get(field::FLAGS)
                .is_some_and(|&f| Flags::from_bits(f).contains(Flags::SEALED))
        }

        /// The destination QP number.
        pub fn dst_qpn(&self) -> u32 {
            get_u32(self.buffer.as_ref(), field::DST_QPN)
        }

        /// The source QP number.
        pub fn src_qpn(&self) -> u32 {
            get_u32(self.buffer.as_ref(), field::SRC_QPN)
        }

        /// The packet sequence number.
        pub fn psn(&self) -> u32 {
            get_u32(self.buffer.as_ref(), field::PSN)
        }

        /// The send timestamp, ns.
        pub fn send_ts_ns(&self) -> u64 {
            get_u64(self.buffer.as_ref(), field::SEND_TS)
        }

        /// The sealing sequence number: `None` unless the packet is sealed and long enough.
        pub fn seal_seq(&self) -> Option<u64> {
            let b = self.buffer.as_ref();
            (self.is_sealed() && b.len() >= field::SEAL_SEQ.end)
                .then(|| get_u64(b, field::SEAL_SEQ))
        }

        /// Bytes before the per-kind header: [`HEADER_LEN`], plus [`SEAL_SEQ_LEN`] if sealed.
        pub fn header_len(&self) -> usize {
            if self.is_sealed() {
                HEADER_LEN + SEAL_SEQ_LEN
            } else {
                HEADER_LEN
            }
        }

        /// Bytes of the trailer: [`SEAL_TAG_LEN`] if sealed, else [`TRAILER_LEN`].
        pub fn trailer_len(&self) -> usize {
            if self.is_sealed() {
                SEAL_TAG_LEN
            } else {
                TRAILER_LEN
            }
        }

        /// The CRC32C the trailer carries, `None` for a sealed packet (or a buffer too
        /// short for a trailer).
        pub fn checksum(&self) -> Option<u32> {
            let b = self.buffer.as_ref();
            let at = b.len().checked_sub(TRAILER_LEN)?;
            (!self.is_sealed()).then(|| get_u32(b, at..at + TRAILER_LEN))
        }

        /// Whether the trailer holds the CRC32C of every byte before it (false for a sealed
        /// packet).
        ///
        /// Under `cfg(fuzzing)` verification always succeeds, so fuzzers reach the code
        /// behind it.
        pub fn verify_checksum(&self) -> bool {
            if cfg!(fuzzing) {
                return true;
            }
            let b = self.buffer.as_ref();
            match (self.checksum(), b.len().checked_sub(TRAILER_LEN)) {
                (Some(crc), Some(at)) => crc32c::crc32c(&b[..at]) == crc,
                _ => false,
            }
        }
    }

    impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
        /// The per-kind header and payload: the bytes between
        /// [`header_len`](Self::header_len) and the trailer (empty if there are none).
        pub fn body_and_payload(&self) -> &'a [u8] {
            let inner: &'a T = self.buffer;
            let b: &'a [u8] = inner.as_ref();
            let end = b.len().saturating_sub(self.trailer_len());
            b.get(self.header_len()..end).unwrap_or(&[])
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the version byte.
        pub fn set_version(&mut self, v: u8) {
            self.buffer.as_mut()[field::VERSION] = v;
        }

        /// Sets the kind.
        pub fn set_kind(&mut self, kind: Kind) {
            self.buffer.as_mut()[field::KIND] = kind as u8;
        }

        /// Sets the path index.
        pub fn set_path(&mut self, path: u8) {
            self.buffer.as_mut()[field::PATH] = path;
        }

        /// Sets the flags.
        pub fn set_flags(&mut self, flags: Flags) {
            self.buffer.as_mut()[field::FLAGS] = flags.bits();
        }

        /// Sets the destination QP number.
        pub fn set_dst_qpn(&mut self, qpn: u32) {
            put_u32(self.buffer.as_mut(), field::DST_QPN, qpn);
        }

        /// Sets the source QP number.
        pub fn set_src_qpn(&mut self, qpn: u32) {
            put_u32(self.buffer.as_mut(), field::SRC_QPN, qpn);
        }

        /// Sets the packet sequence number.
        pub fn set_psn(&mut self, psn: u32) {
            put_u32(self.buffer.as_mut(), field::PSN, psn);
        }

        /// Sets the send timestamp, ns.
        pub fn set_send_ts_ns(&mut self, ts: u64) {
            put_u64(self.buffer.as_mut(), field::SEND_TS, ts);
        }

        /// Sets the sealing sequence number; [`Error::BufferTooSmall`] if the buffer does
        /// not reach past it. (It does not set [`Flags::SEALED`].)
        pub fn set_seal_seq(&mut self, seq: u64) -> Result<(), Error> {
            let b = self.buffer.as_mut();
            if b.len() < field::SEAL_SEQ.end {
                return Err(Error::BufferTooSmall);
            }
            put_u64(b, field::SEAL_SEQ, seq);
            Ok(())
        }

        /// Writes the CRC32C of every byte before the trailer into the trailer (nothing for
        /// a sealed packet, whose tag the sealer writes).
        pub fn fill_checksum(&mut self) {
            if self.is_sealed() {
                return;
            }
            let b = self.buffer.as_mut();
            if let Some(at) = b.len().checked_sub(TRAILER_LEN) {
                let crc = crc32c::crc32c(&b[..at]);
                put_u32(b, at..at + TRAILER_LEN, crc);
            }
        }
    }

    impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
        /// The parsed packet as [`Repr`](super::Repr) prints it, or for a packet that does
        /// not parse (sealed, corrupt, too short) its clear header fields and why.
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let bytes = self.buffer.as_ref();
            let view = Packet::new_unchecked(bytes);
            if let Err(e) = view.check_len() {
                return write!(f, "{} bytes: {e}", bytes.len());
            }
            match super::Repr::parse(&view) {
                Ok((repr, payload)) => repr.fmt_with_payload(f, payload.len()),
                Err(e) => write!(
                    f,
                    "qp {}->{} path {} {}kind {} {} bytes: {e}",
                    view.src_qpn(),
                    view.dst_qpn(),
                    view.path(),
                    view.flags(),
                    view.kind_code(),
                    bytes.len()
                ),
            }
        }
    }
}

/// A checked view over a datagram: [`view::Packet`] under a name that does not clash with
/// the parsed [`Packet`].
pub type PacketView<T> = view::Packet<T>;

/// A parsed packet without its payload: the common header and the per-kind header
/// (smoltcp's `Repr`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Common header. Its `kind` is taken from `body` when emitting.
    pub header: Header,
    /// Per-kind header.
    pub body: Body,
}

impl Repr {
    /// Parses a checked view of a plain datagram: refuses a sealed one with
    /// [`Error::Sealed`], then checks the CRC32C, version, kind, every field's range and
    /// that the length fields agree with the payload. Returns the payload beside.
    pub fn parse<'a, T: AsRef<[u8]> + ?Sized>(
        packet: &view::Packet<&'a T>,
    ) -> Result<(Repr, &'a [u8]), Error> {
        packet.check_len()?;
        if packet.is_sealed() {
            return Err(Error::Sealed);
        }
        if !packet.verify_checksum() {
            return Err(Error::BadCrc);
        }
        let inner: &'a T = packet.into_inner();
        let bytes: &'a [u8] = inner.as_ref();
        // check_len: at least HEADER_LEN + TRAILER_LEN bytes.
        Repr::parse_content(&bytes[..bytes.len() - TRAILER_LEN], 0)
    }

    /// Parses the plaintext of a sealed packet once its tag has been verified and its bytes
    /// decrypted: common header, sealing sequence number, per-kind header and payload, with
    /// the tag already cut off. The header must carry [`Flags::SEALED`].
    pub fn parse_opened(plaintext: &[u8]) -> Result<(Repr, &[u8]), Error> {
        if plaintext.len() < HEADER_LEN + SEAL_SEQ_LEN {
            return Err(Error::Truncated);
        }
        if !is_sealed(plaintext) {
            return Err(Error::BadLength);
        }
        Repr::parse_content(plaintext, SEAL_SEQ_LEN)
    }

    /// Parses the common header, `ext_len` bytes after it (skipped), the per-kind header
    /// and the payload of `content` (no trailer), which holds at least [`HEADER_LEN`] bytes.
    fn parse_content(content: &[u8], ext_len: usize) -> Result<(Repr, &[u8]), Error> {
        if content[field::VERSION] != VERSION {
            return Err(Error::BadVersion);
        }
        let kind = Kind::from_u8(content[field::KIND])?;
        let rest = content
            .get(HEADER_LEN + ext_len..)
            .ok_or(Error::Truncated)?;
        let body = Body::parse(kind, rest)?;
        let payload = &rest[body.len()..]; // Body::parse checked that `rest` holds the body
        body.check_payload(payload.len())?;
        let header = Header::read(content, kind);
        Ok((Repr { header, body }, payload))
    }

    /// Bytes of the plain packet with this header and `payload_len` payload bytes.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        HEADER_LEN + self.body.len() + payload_len + TRAILER_LEN
    }

    /// Bytes of the sealed packet with this header and `payload_len` payload bytes.
    pub fn sealed_buffer_len(&self, payload_len: usize) -> usize {
        self.buffer_len(payload_len) + SEAL_OVERHEAD
    }

    /// Writes the plain packet into `buf`: header (without [`Flags::SEALED`]), per-kind
    /// header, `payload_len` bytes filled in place by `fill_payload`, and the CRC32C
    /// trailer. Returns the datagram's length, or [`Error::BufferTooSmall`] (before
    /// writing anything).
    ///
    /// The payload is written by the closure so that message bytes go from the memory
    /// region to the transmit buffer in one copy.
    pub fn emit(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8]),
    ) -> Result<usize, Error> {
        let total = self.buffer_len(payload_len);
        let buf = buf.get_mut(..total).ok_or(Error::BufferTooSmall)?;
        let flags = self.header.flag_set().difference(Flags::SEALED);
        let start = self.emit_headers(buf, flags, None);
        fill_payload(&mut buf[start..start + payload_len]);
        view::Packet::new_unchecked(buf).fill_checksum();
        Ok(total)
    }

    /// Writes the plaintext of a sealed packet into `buf`: the header with
    /// [`Flags::SEALED`] set, the sealing sequence number `seq`, the per-kind header and
    /// `payload_len` bytes filled by `fill_payload`, and leaves [`SEAL_TAG_LEN`] bytes for
    /// the tag. Returns the sealed datagram's length. The caller encrypts it in place
    /// ([`crate::seal::Sealer::emit`] does both).
    pub fn emit_for_seal(
        &self,
        buf: &mut [u8],
        seq: u64,
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8]),
    ) -> Result<usize, Error> {
        let total = self.sealed_buffer_len(payload_len);
        let buf = buf.get_mut(..total).ok_or(Error::BufferTooSmall)?;
        let flags = self.header.flag_set() | Flags::SEALED;
        let start = self.emit_headers(buf, flags, Some(seq));
        fill_payload(&mut buf[start..start + payload_len]);
        Ok(total)
    }

    /// Writes the common header with `flags`, the sealing sequence number if given, and
    /// the per-kind header into `buf`, which holds the whole packet; returns where the
    /// payload starts.
    fn emit_headers(&self, buf: &mut [u8], flags: Flags, seq: Option<u64>) -> usize {
        let h = &self.header;
        let mut v = view::Packet::new_unchecked(&mut *buf);
        v.set_version(VERSION);
        v.set_kind(self.body.kind());
        v.set_path(h.path);
        v.set_flags(flags);
        v.set_dst_qpn(h.dst_qpn);
        v.set_src_qpn(h.src_qpn);
        v.set_psn(h.psn);
        v.set_send_ts_ns(h.send_ts_ns);
        let mut start = HEADER_LEN;
        if let Some(seq) = seq {
            // The caller sized `buf` for a sealed packet, which reaches past the sequence.
            let _ = v.set_seal_seq(seq);
            start += SEAL_SEQ_LEN;
        }
        self.body.emit(&mut buf[start..start + self.body.len()]);
        start + self.body.len()
    }

    /// Prints the packet as [`Display`](fmt::Display) does, with `payload_len` for the
    /// kinds that carry a payload.
    fn fmt_with_payload(&self, f: &mut fmt::Formatter<'_>, payload_len: usize) -> fmt::Result {
        let h = &self.header;
        write!(f, "qp {}->{} path {} ", h.src_qpn, h.dst_qpn, h.path)?;
        write!(f, "{}", h.flag_set())?;
        match &self.body {
            Body::Request(r) => write!(
                f,
                "REQ psn {} {:?} msn {} ssn {} rkey {:#x} roff {} off {}/{} imm {:#x} payload {}",
                h.psn,
                r.op,
                r.msn,
                r.ssn,
                r.rkey,
                r.remote_offset,
                r.offset,
                r.msg_len,
                r.imm,
                payload_len
            ),
            Body::ReadResponse(r) => write!(
                f,
                "READ_RESP psn {} msn {} off {}/{} payload {}",
                h.psn, r.msn, r.offset, r.msg_len, payload_len
            ),
            Body::AtomicResponse(r) => write!(
                f,
                "ATOMIC_RESP psn {} msn {} original {:#x}",
                h.psn, r.msn, r.original
            ),
            Body::Ack(a) => {
                let sacked = a.sack.iter().map(|b| b.count_ones()).sum::<u32>();
                write!(
                    f,
                    "ACK cum {} sacked {} echo psn {} ts {} hold {}ns ce {}",
                    a.cum_psn, sacked, a.echo_psn, a.echo_ts_ns, a.hold_ns, a.ce_count
                )
            }
            Body::Nak(n) => write!(f, "NAK psn {} msn {} {:?}", n.psn, n.msn, n.syndrome),
        }
    }
}

impl fmt::Display for Repr {
    /// One line: QPs, path, flags, kind and fields (payload length 0).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_with_payload(f, 0)
    }
}

/// A parsed packet, borrowing its payload from the datagram: a [`Repr`] and its payload, in
/// the form the engine uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Common header.
    pub header: Header,
    /// Per-kind header.
    pub body: Body,
    /// Payload bytes (empty for kinds without payload).
    pub payload: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Parses and checks one datagram: length, CRC32C, version, kind and every field's range
    /// ([`view::Packet::new_checked`] then [`Repr::parse`]).
    ///
    /// A sealed packet is refused with [`Error::Sealed`] before its CRC is looked at.
    pub fn parse(datagram: &'a [u8]) -> Result<Packet<'a>, Error> {
        if datagram.len() < HEADER_LEN + TRAILER_LEN {
            return Err(Error::Truncated);
        }
        if is_sealed(datagram) {
            return Err(Error::Sealed);
        }
        let view = view::Packet::new_checked(datagram)?;
        let (repr, payload) = Repr::parse(&view)?;
        Ok(Packet::from_repr(repr, payload))
    }

    /// Parses the plaintext of a sealed packet ([`Repr::parse_opened`]).
    pub fn parse_opened(plaintext: &'a [u8]) -> Result<Packet<'a>, Error> {
        let (repr, payload) = Repr::parse_opened(plaintext)?;
        Ok(Packet::from_repr(repr, payload))
    }

    /// The packet of `repr` with `payload`.
    pub fn from_repr(repr: Repr, payload: &'a [u8]) -> Packet<'a> {
        Packet {
            header: repr.header,
            body: repr.body,
            payload,
        }
    }

    /// The header part, without the payload.
    pub fn repr(&self) -> Repr {
        Repr {
            header: self.header,
            body: self.body,
        }
    }
}

impl fmt::Display for Packet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.repr().fmt_with_payload(f, self.payload.len())
    }
}

/// Whether the trailer of `datagram` holds the CRC32C of every byte before it
/// ([`view::Packet::verify_checksum`]; false if too short for a trailer).
///
/// Under `cfg(fuzzing)` verification always succeeds, so fuzzers reach the code behind it.
pub fn verify_crc(datagram: &[u8]) -> bool {
    if cfg!(fuzzing) {
        return true;
    }
    let Some(split) = datagram.len().checked_sub(TRAILER_LEN) else {
        return false;
    };
    crc32c::crc32c(&datagram[..split]) == get_u32(datagram, split..split + TRAILER_LEN)
}

/// Writes one packet into `buf` ([`Repr::emit`]). Returns the datagram's length.
pub fn emit(
    buf: &mut [u8],
    header: &Header,
    body: &Body,
    payload_len: usize,
    fill_payload: impl FnOnce(&mut [u8]),
) -> Result<usize, Error> {
    let repr = Repr {
        header: *header,
        body: *body,
    };
    repr.emit(buf, payload_len, fill_payload)
}

/// Writes the plaintext of a sealed packet into `buf` ([`Repr::emit_for_seal`]). Returns
/// the sealed datagram's length.
pub fn emit_for_seal(
    buf: &mut [u8],
    header: &Header,
    seq: u64,
    body: &Body,
    payload_len: usize,
    fill_payload: impl FnOnce(&mut [u8]),
) -> Result<usize, Error> {
    let repr = Repr {
        header: *header,
        body: *body,
    };
    repr.emit_for_seal(buf, seq, payload_len, fill_payload)
}

/// Whether a datagram's common header says it is sealed (false if too short to say).
pub fn is_sealed(datagram: &[u8]) -> bool {
    view::Packet::new_unchecked(datagram).is_sealed()
}

/// What can be read of a sealed datagram without its key.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SealedPeek {
    /// Receiving QP.
    pub dst_qpn: u32,
    /// Sending QP.
    pub src_qpn: u32,
    /// Sealing sequence number.
    pub seq: u64,
}

/// Reads the clear fields of a sealed datagram: checks its length (header, sequence number
/// and tag at least), version and [`Flags::SEALED`]. Authenticates nothing.
pub fn peek_sealed(datagram: &[u8]) -> Result<SealedPeek, Error> {
    if datagram.len() < HEADER_LEN + SEAL_SEQ_LEN + SEAL_TAG_LEN {
        return Err(Error::Truncated);
    }
    let v = view::Packet::new_checked(datagram)?;
    if v.version() != VERSION {
        return Err(Error::BadVersion);
    }
    let seq = v.seal_seq().ok_or(Error::BadLength)?; // None: not sealed
    Ok(SealedPeek {
        dst_qpn: v.dst_qpn(),
        src_qpn: v.src_qpn(),
        seq,
    })
}

/// Bytes of a packet with this body and payload.
pub fn packet_len(body: &Body, payload_len: usize) -> usize {
    HEADER_LEN + body.len() + payload_len + TRAILER_LEN
}

/// Bytes of a sealed packet with this body and payload.
pub fn sealed_packet_len(body: &Body, payload_len: usize) -> usize {
    packet_len(body, payload_len) + SEAL_OVERHEAD
}

#[cfg(test)]
mod tests;
