//! Hop telemetry: a field of the REQUEST header that switches may rewrite in flight.
//!
//! A switch that supports it (today: the simulated fabric's, [`stamp_hop_queue`]) writes into
//! [`field::request::HOP_QUEUE`] the largest queueing delay any switch on the way saw ahead of
//! the packet, as in-band network telemetry does (HPCC's INT, Ultra Ethernet's CSIG, Falcon);
//! the receiver echoes the value of the packet its ACK answers ([`field::ack::HOP_QUEUE`]),
//! so the sender learns the delay of its path's *most congested hop* rather than only the
//! sum over all hops that the round trip gives. Congestion control may use it
//! (`braid_cc::AckSample::hop_queue_ns`).
//!
//! The field is mutable in flight, so the CRC covers it as zeros (as RoCE's ICRC masks the
//! fields routers change). Sealed packets carry no telemetry: their header is authenticated
//! and a switch must not change it; [`stamp_hop_queue`] leaves them alone.
use super::field;
use super::{HEADER_LEN, HOP_QUEUE_UNIT_NS, Kind, REQUEST_LEN, TRAILER_LEN};

/// Where the hop field of a plain REQUEST datagram `b` sits, if `b` is one (long enough
/// for a REQUEST header and a trailer, kind REQUEST, not sealed).
fn hop_field(b: &[u8]) -> Option<core::ops::Range<usize>> {
    let is_request = b.get(field::KIND) == Some(&(Kind::Request as u8));
    let sealed = b
        .get(field::FLAGS)
        .is_some_and(|&f| f & super::FLAG_SEALED != 0);
    let f = field::request::HOP_QUEUE;
    (is_request && !sealed && b.len() >= HEADER_LEN + REQUEST_LEN + TRAILER_LEN)
        .then(|| HEADER_LEN + f.start..HEADER_LEN + f.end)
}

/// The CRC32C of `b` (a datagram without its trailer) with the hop field, if `b` is a plain
/// REQUEST, taken as zeros.
pub(super) fn crc(b: &[u8]) -> u32 {
    // `hop_field` asks for the trailer's bytes too; `b` stops before them.
    let with_trailer = b.len() + TRAILER_LEN;
    let kind_ok = b.get(field::KIND) == Some(&(Kind::Request as u8));
    let sealed = b
        .get(field::FLAGS)
        .is_some_and(|&f| f & super::FLAG_SEALED != 0);
    if !kind_ok || sealed || with_trailer < HEADER_LEN + REQUEST_LEN + TRAILER_LEN {
        return braid_crc::crc32c(b);
    }
    let f = field::request::HOP_QUEUE;
    braid_crc::crc32c_masked(b, HEADER_LEN + f.start..HEADER_LEN + f.end)
}

/// The raw hop field of `datagram` (0: none, or not a plain REQUEST).
pub fn hop_queue(datagram: &[u8]) -> u16 {
    match hop_field(datagram) {
        Some(r) => u16::from_be_bytes([datagram[r.start], datagram[r.start + 1]]),
        None => 0,
    }
}

/// A switch's stamp: raises the hop field of a plain REQUEST `datagram` to `queue_ns` (the
/// bytes queued ahead of it at this hop, in time) if that is more than it holds; other
/// datagrams are left alone.
pub fn stamp_hop_queue(datagram: &mut [u8], queue_ns: u64) {
    let Some(r) = hop_field(datagram) else {
        return;
    };
    let v = encode_hop_queue(queue_ns);
    let old = u16::from_be_bytes([datagram[r.start], datagram[r.start + 1]]);
    if v > old {
        datagram[r].copy_from_slice(&v.to_be_bytes());
    }
}

/// The field value for `queue_ns` of queueing: one more than the delay in
/// [`HOP_QUEUE_UNIT_NS`], saturating.
pub const fn encode_hop_queue(queue_ns: u64) -> u16 {
    let units = queue_ns / HOP_QUEUE_UNIT_NS;
    if units >= u16::MAX as u64 - 1 {
        u16::MAX
    } else {
        units as u16 + 1
    }
}

/// The queueing delay, ns, a field value stands for (`None` for 0: not stamped).
pub const fn decode_hop_queue(v: u16) -> Option<u64> {
    if v == 0 {
        None
    } else {
        Some((v as u64 - 1) * HOP_QUEUE_UNIT_NS)
    }
}
