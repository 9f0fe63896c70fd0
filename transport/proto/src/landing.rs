//! Receiving READ responses straight into place.
//!
//! A READ's requester knows where each byte of the response goes before it arrives, as an
//! RDMA NIC does when it places a response: so rather than receive a response datagram into
//! a buffer of the datapath and copy its payload into the destination region afterwards,
//! the datapath can scatter it as it receives it: the headers into a buffer of its own, the
//! payload straight into the destination, the trailer after. [`Endpoint::landings`] names
//! where the next datagrams of the READ response being received are expected to land;
//! the datapath receives into those places (one `recvmmsg` for several); each datagram that
//! is the one predicted ([`Landing::matches`]) is checked in place, its CRC read from the
//! destination ([`Endpoint::handle_landed`]), and placed by that; any other (a different
//! packet, one cut at other lengths) is put back together ([`Landing::read_landed`]) and
//! handled as any datagram. A landing only ever names bytes that no packet has placed yet,
//! so what the kernel writes there for a datagram that turns out to be another, or to fail
//! its CRC, is overwritten when the right one arrives; and nothing in the engine changes
//! between naming the places and handling what landed there as long as the caller holds
//! the endpoint throughout, as the runtime does.
//!
//! It pays where one datagram is one buffer: datagrams above [`LANDING_MIN_BYTES`], as on
//! loopback (64 KiB). Smaller ones arrive coalesced by UDP GRO, several to a buffer with
//! their headers between them, and are not predicted.
//!
//! [`Endpoint::landings`]: crate::Endpoint::landings
//! [`Endpoint::handle_landed`]: crate::Endpoint::handle_landed
use std::sync::Arc;

use crate::mem::Region;
use crate::qp::Seg;
use crate::wire::{self, Body, HEADER_LEN, Kind, READ_RESP_LEN, TRAILER_LEN};

/// READ response payloads below this many bytes are not predicted (see the module
/// documentation).
pub const LANDING_MIN_BYTES: usize = 16 << 10;

/// The READ response stream to predict: the last large response a QP accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LandingHint {
    pub(crate) qpn: u32,
    pub(crate) msn: u32,
    /// Message offset just after the accepted response.
    pub(crate) next: u64,
    /// Payload bytes of each response but the last (the largest seen).
    pub(crate) chunk: u32,
}

/// Where the next datagram the engine expects, a READ response, can be received straight
/// into place: its first [`head_len`](Self::head_len) bytes into a buffer of the caller's,
/// then [`len`](Self::len) bytes at [`dst`](Self::dst), then the rest (the trailer, if it is
/// the datagram predicted) into a buffer of the caller's again.
#[derive(Clone, Debug)]
pub struct Landing {
    region: Arc<Region>,
    /// Offset of the payload's place in `region`.
    at: u64,
    len: usize,
    qpn: u32,
    msn: u32,
    offset: u32,
}

impl Landing {
    /// Bytes before the payload: the common and READ response headers.
    pub const fn head_len(&self) -> usize {
        HEADER_LEN + READ_RESP_LEN
    }

    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a landing holds a payload. (Present for clippy's `len` convention.)
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the payload goes: [`len`](Self::len) bytes of registered memory that no packet
    /// has placed yet. What writes there (the kernel, receiving) must treat them as the
    /// atomic words they are (see [`Region::as_ptr`]), and may only do so while the
    /// endpoint that named the landing is held, between [`Endpoint::landings`] and the
    /// handling of what arrived.
    ///
    /// [`Endpoint::landings`]: crate::Endpoint::landings
    pub fn dst(&self) -> *mut u8 {
        self.region.as_ptr().wrapping_add(self.at as usize)
    }

    /// Whether a datagram received into this landing is the one predicted: `head` as
    /// [`head_len`](Self::head_len) bytes of READ response headers for this QP, READ and
    /// offset, `landed` bytes at [`dst`](Self::dst) as many as predicted, and a `tail` of
    /// exactly the trailer. The CRC is not checked here ([`Endpoint::handle_landed`] does).
    ///
    /// [`Endpoint::handle_landed`]: crate::Endpoint::handle_landed
    pub fn matches(&self, head: &[u8], landed: usize, tail: &[u8]) -> bool {
        if head.len() != self.head_len() || landed != self.len || tail.len() != TRAILER_LEN {
            return false;
        }
        match wire::Repr::parse_head(head, landed) {
            Ok(wire::Repr {
                header,
                body: Body::ReadResponse(r),
            }) => {
                header.kind == Kind::ReadResponse
                    && header.dst_qpn == self.qpn
                    && r.msn == self.msn
                    && r.offset == self.offset
            }
            _ => false,
        }
    }

    /// Copies the first `out.len()` bytes at [`dst`](Self::dst) (at most
    /// [`len`](Self::len)) into `out`: to put a datagram that is not the one predicted back
    /// together. False if `out` is longer than the landing.
    pub fn read_landed(&self, out: &mut [u8]) -> bool {
        out.len() <= self.len && self.region.read(self.at, out).is_ok()
    }

    /// The CRC32C of the bytes `crc` was the CRC of followed by the landed payload.
    pub(crate) fn crc(&self, crc: u32) -> Option<u32> {
        self.region.crc(self.at, self.len, crc).ok()
    }

    /// Whether message bytes `[off, off + len)` of a READ whose destination is `segs` are
    /// where this landing put them.
    pub(crate) fn is_at(&self, segs: &[Seg], off: u64, len: usize) -> bool {
        len == self.len
            && locate(segs, off, len as u64)
                .is_some_and(|(region, at)| Arc::ptr_eq(region, &self.region) && at == self.at)
    }

    /// The landing for message bytes `[off, off + len)` of READ `msn` on QP `qpn` whose
    /// destination is `segs`, if they lie in one segment.
    pub(crate) fn at(
        segs: &[Seg],
        (qpn, msn): (u32, u32),
        off: u64,
        len: usize,
    ) -> Option<Landing> {
        let (region, at) = locate(segs, off, len as u64)?;
        Some(Landing {
            region: region.clone(),
            at,
            len,
            qpn,
            msn,
            offset: u32::try_from(off).ok()?,
        })
    }
}

/// The region and offset of message bytes `[off, off + len)` of a gather or scatter list,
/// if they lie in one segment.
fn locate(segs: &[Seg], mut off: u64, len: u64) -> Option<(&Arc<Region>, u64)> {
    for s in segs {
        let seg_len = u64::from(s.len);
        if off < seg_len {
            return (off + len <= seg_len).then_some((&s.region, s.offset + off));
        }
        off -= seg_len;
    }
    None
}
