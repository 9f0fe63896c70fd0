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
//! # Two levels, one file each
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
//! The submodules are cut by what they describe, each readable on its own: `field` (the
//! tables and the byte accessors), `codes` ([`Kind`], [`Op`], [`Syndrome`]), `flags`
//! ([`Flags`]), `header` (the common [`Header`]), `request` ([`Request`]), `response`
//! ([`ReadResponse`], [`AtomicResponse`]), `ack` ([`Ack`], [`Nak`]), `body` ([`Body`], the
//! dispatch over the kinds), `view`, `repr` ([`Repr`]), `packet` ([`Packet`] and the free
//! functions), `sealed` (what a sealed envelope shows without its key, [`peek_sealed`]) and
//! `error` ([`Error`]). Everything is re-exported here: `braid_proto::wire::X` is the path to
//! use.
//!
//! The fixed layouts are described by the field table rather than by `zerocopy` structs: one
//! table serves the view, the parser, the writer and the sealed-packet peeks over the same
//! bytes (including a per-kind header that starts 24 or 32 bytes in, depending on a flag), and
//! the sans-IO core keeps its short dependency list.
//!
//! Parsing never panics: a packet that is short, has a bad CRC, an unknown version, kind, op
//! or syndrome, or a length field that disagrees with its payload is rejected with an
//! [`Error`].

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
/// Bytes of an ACK's telemetry extension ([`field::ack_ext`]), which follows the ACK body
/// in the payload's place when the echoed packet carried hop telemetry.
pub const ACK_EXT_LEN: usize = 4;
/// Unit of the hop telemetry fields ([`field::request::HOP_QUEUE`], [`field::ack_ext::HOP_QUEUE`]),
/// ns: 64 ns, so the 16-bit field spans up to about 4.2 ms of queueing.
pub const HOP_QUEUE_UNIT_NS: u64 = 64;
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

// The tables and the length constants agree: every header ends where its table ends.
const _: () = {
    assert!(field::SEND_TS.end == HEADER_LEN);
    assert!(field::SEAL_SEQ.end == HEADER_LEN + SEAL_SEQ_LEN);
    assert!(field::request::REMOTE_OFFSET.end == REQUEST_LEN);
    assert!(field::read_resp::RESERVED.end == READ_RESP_LEN);
    assert!(field::atomic_resp::ORIGINAL.end == ATOMIC_RESP_LEN);
    assert!(field::ack::SACK.end == ACK_LEN);
    assert!(field::ack_ext::RESERVED.end == ACK_EXT_LEN);
    assert!(field::ack::SACK.end - field::ack::SACK.start == SACK_BITS as usize / 8);
    assert!(field::nak::RESERVED.end == NAK_LEN);
};

mod ack;
mod body;
mod codes;
mod error;
pub mod field;
mod flags;
mod header;
mod packet;
mod repr;
mod request;
mod response;
#[cfg(any(test, feature = "testing"))]
pub mod samples;
mod sealed;
mod telemetry;
pub mod view;

pub use ack::{Ack, Nak};
pub use body::Body;
pub use codes::{Kind, Op, Syndrome};
pub use error::Error;
pub use flags::{FLAG_ACK_NOW, FLAG_DUPLICATE, FLAG_RETRANSMIT, FLAG_SEALED, Flags};
pub use header::Header;
pub use packet::{
    Packet, emit, emit_for_seal, emit_with_crc, packet_len, parse_pieces, verify_crc,
};
pub use repr::Repr;
pub use request::Request;
pub use response::{AtomicResponse, ReadResponse};
pub use sealed::{SealedPeek, is_sealed, peek_sealed, sealed_packet_len};
pub use telemetry::{decode_hop_queue, encode_hop_queue, hop_queue, stamp_hop_queue};

/// A checked view over a datagram: [`view::Packet`] under a name that does not clash with
/// the parsed [`Packet`].
pub type PacketView<T> = view::Packet<T>;

#[cfg(test)]
mod tests;
