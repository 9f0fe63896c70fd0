//! Payloads sent from where they lie ([`Endpoint::set_in_place_min`]).
//!
//! A large datagram's payload is normally gathered out of its registered region into the
//! caller's transmit buffer (with its CRC32C in the same pass), and the kernel then copies it
//! again. A datapath that can send a datagram from several pieces (the UDP sockets' iovecs)
//! can instead take the payload straight from the region: the engine writes the headers and
//! the trailer into the buffer, computes the CRC32C over the payload where it lies, and says
//! where that is ([`Transmit::payload`]). The bytes the CRC covered are the ones the kernel
//! copies unless the application changes them meanwhile, as it may change any buffer an RDMA
//! operation reads; the receiver then drops the datagram for its CRC and it is sent again.
//!
//! The address stays valid while the engine holds the region: every region a datagram was
//! left in is pinned (its `Arc` kept) until [`Endpoint::unpin_payloads`], which the caller
//! calls once the datagrams handed out before are sent. Memory registered from the caller's
//! own buffer (`Region::from_raw`) lives as long as the registration, so the runtime also
//! finishes any send in flight before a deregistration returns.
//!
//! [`Endpoint::set_in_place_min`]: crate::Endpoint::set_in_place_min
//! [`Endpoint::unpin_payloads`]: crate::Endpoint::unpin_payloads
//! [`Transmit::payload`]: crate::Transmit::payload
use std::sync::Arc;

use crate::mem::Region;

/// Where a datagram's payload lies when it was left in its region: the datagram is the
/// buffer's first `at` bytes, then `len` bytes at address `addr`, then the buffer's bytes from
/// `at + len` to [`Transmit::len`](crate::Transmit::len) (the trailer). The buffer's own
/// bytes in between are not the payload.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PayloadAt {
    /// Offset of the payload in the datagram.
    pub at: u32,
    /// Payload bytes.
    pub len: u32,
    /// Address of the payload's first byte (in a region the engine pinned).
    pub addr: usize,
}

/// The endpoint's side: the shortest payload left in place (`usize::MAX`: none), the
/// regions pinned since the last unpin, and where the payload of the datagram being
/// emitted lies, if it was left in place.
#[derive(Debug)]
pub(crate) struct Pins {
    pub(crate) min: usize,
    regions: Vec<Arc<Region>>,
    last: Option<PayloadAt>,
}

impl Default for Pins {
    fn default() -> Self {
        Pins {
            min: usize::MAX,
            regions: Vec::new(),
            last: None,
        }
    }
}

impl Pins {
    /// Keeps `region` until the next [`clear`](Self::clear), and where the `len` bytes at
    /// its `offset` are, `at` bytes into the datagram being emitted, for
    /// [`take_last`](Self::take_last).
    pub(crate) fn pin(&mut self, region: &Arc<Region>, offset: u64, at: usize, len: usize) {
        if !self.regions.last().is_some_and(|r| Arc::ptr_eq(r, region)) {
            self.regions.push(Arc::clone(region));
        }
        self.last = Some(PayloadAt {
            at: at as u32,
            len: len as u32,
            addr: (region.as_ptr() as usize).wrapping_add(offset as usize),
        });
    }

    /// Where the payload of the datagram just emitted lies, if it was left in place.
    pub(crate) fn take_last(&mut self) -> Option<PayloadAt> {
        self.last.take()
    }

    pub(crate) fn clear(&mut self) {
        self.regions.clear();
    }

    /// Copies the payload `p` describes from its pinned region into `buf` (the datagram's
    /// buffer) at its place; false if no pinned region holds it.
    pub(crate) fn copy_into(&self, p: PayloadAt, buf: &mut [u8]) -> bool {
        let (at, len) = (p.at as usize, p.len as usize);
        let Some(dst) = buf.get_mut(at..at + len) else {
            return false;
        };
        self.regions.iter().any(|r| {
            let offset = p.addr.wrapping_sub(r.as_ptr() as usize) as u64;
            offset < r.len() as u64 && r.read(offset, dst).is_ok()
        })
    }
}
