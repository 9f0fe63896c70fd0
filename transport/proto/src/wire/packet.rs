//! A parsed packet with its payload, and the free functions the engine calls.
use core::fmt;

use super::field::get_u32;
use super::{Body, Error, HEADER_LEN, Header, Repr, TRAILER_LEN, is_sealed, view};

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
    super::telemetry::crc(&datagram[..split]) == get_u32(datagram, split..split + TRAILER_LEN)
}

/// Parses and checks a plain datagram received in pieces: its headers `head`
/// ([`Repr::parse_head`]), `payload_len` payload bytes held elsewhere, and its `trailer`.
/// `payload_crc` gets the CRC32C of `head` (a REQUEST's hop field taken as zeros) and
/// returns it continued through the payload; the result must match the trailer, else
/// [`Error::BadCrc`]. The datagram is what [`Packet::parse`] would accept whole.
pub fn parse_pieces(
    head: &[u8],
    payload_len: usize,
    payload_crc: impl FnOnce(u32) -> u32,
    trailer: &[u8],
) -> Result<Repr, Error> {
    let repr = Repr::parse_head(head, payload_len)?;
    let Ok(want) = <[u8; TRAILER_LEN]>::try_from(trailer) else {
        return Err(Error::BadLength);
    };
    if !cfg!(fuzzing) && payload_crc(super::telemetry::crc(head)) != u32::from_be_bytes(want) {
        return Err(Error::BadCrc);
    }
    Ok(repr)
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

/// Writes a plain packet into `buf` whose payload filler also checksums it
/// ([`Repr::emit_with_crc`]). Returns the datagram's length.
pub fn emit_with_crc(
    buf: &mut [u8],
    header: &Header,
    body: &Body,
    payload_len: usize,
    fill_payload: impl FnOnce(&mut [u8], u32) -> u32,
) -> Result<usize, Error> {
    let repr = Repr {
        header: *header,
        body: *body,
    };
    repr.emit_with_crc(buf, payload_len, fill_payload)
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

/// Bytes of a packet with this body and payload.
pub fn packet_len(body: &Body, payload_len: usize) -> usize {
    HEADER_LEN + body.len() + payload_len + TRAILER_LEN
}
