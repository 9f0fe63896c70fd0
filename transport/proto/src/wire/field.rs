//! Byte ranges of every header field, one table per header, as smoltcp's `wire` modules
//! keep them. Common-header and sealing fields count from the start of the datagram;
//! per-kind fields count from the start of their header (byte
//! [`HEADER_LEN`](super::HEADER_LEN) of a plain packet,
//! [`HEADER_LEN`](super::HEADER_LEN)` + `[`SEAL_SEQ_LEN`](super::SEAL_SEQ_LEN) of a sealed one).

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
    pub const RESERVED: usize = 1;
    /// Hop telemetry: the largest queueing delay a switch on the way saw ahead of the packet,
    /// in units of [`HOP_QUEUE_UNIT_NS`](crate::wire::HOP_QUEUE_UNIT_NS) plus one (0: no
    /// switch stamped it). Mutable in flight: the CRC covers it as zeros.
    pub const HOP_QUEUE: Field = 2..4;
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

/// The ACK's telemetry extension ([`ACK_EXT_LEN`](crate::wire::ACK_EXT_LEN) bytes after the
/// ACK body, where a payload would be; present only when the echoed packet carried hop
/// telemetry, so ACKs on fabrics without it are unchanged).
pub mod ack_ext {
    use super::Field;
    /// Hop telemetry of the echoed packet ([`request::HOP_QUEUE`](super::request::HOP_QUEUE)).
    pub const HOP_QUEUE: Field = 0..2;
    /// Reserved, zero.
    pub const RESERVED: Field = 2..4;
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

/// Reads a big-endian u32 at `f`. `b` must hold `f` (callers pass a slice they sized from
/// the same table).
pub(super) fn get_u32(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_be_bytes(a)
}

/// Reads a big-endian u64 at `f`; `b` must hold `f`.
pub(super) fn get_u64(b: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_be_bytes(a)
}

/// Writes `v` big-endian at `f`; `b` must hold `f`.
pub(super) fn put_u32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Writes `v` big-endian at `f`; `b` must hold `f`.
pub(super) fn put_u64(b: &mut [u8], f: Field, v: u64) {
    b[f].copy_from_slice(&v.to_be_bytes());
}
