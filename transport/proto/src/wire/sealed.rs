//! The sealed envelope seen from outside: whether a datagram is sealed, and what can be read
//! of it without its key (see [`crate::seal`] for opening it).
use super::{
    Body, Error, HEADER_LEN, SEAL_OVERHEAD, SEAL_SEQ_LEN, SEAL_TAG_LEN, VERSION, packet_len, view,
};
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
/// and tag at least), version and [`Flags::SEALED`](super::Flags::SEALED). Authenticates nothing.
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

/// Bytes of a sealed packet with this body and payload.
pub fn sealed_packet_len(body: &Body, payload_len: usize) -> usize {
    packet_len(body, payload_len) + SEAL_OVERHEAD
}
