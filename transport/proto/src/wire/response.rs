//! The headers of the two responses: READ RESPONSE and ATOMIC RESPONSE.
use super::field::{self, get_u32, get_u64, put_u32, put_u64};

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

impl ReadResponse {
    /// Reads the header from `b`, which holds at least
    /// [`READ_RESP_LEN`](super::READ_RESP_LEN) bytes.
    pub(super) fn read(b: &[u8]) -> ReadResponse {
        use field::read_resp as f;
        ReadResponse {
            msn: get_u32(b, f::MSN),
            offset: get_u32(b, f::OFFSET),
            msg_len: get_u32(b, f::MSG_LEN),
        }
    }

    /// Writes the header into `b`, exactly [`READ_RESP_LEN`](super::READ_RESP_LEN) bytes
    /// of zeros.
    pub(super) fn write(&self, b: &mut [u8]) {
        use field::read_resp as f;
        put_u32(b, f::MSN, self.msn);
        put_u32(b, f::OFFSET, self.offset);
        put_u32(b, f::MSG_LEN, self.msg_len);
    }
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

impl AtomicResponse {
    /// Reads the header from `b`, which holds at least
    /// [`ATOMIC_RESP_LEN`](super::ATOMIC_RESP_LEN) bytes.
    pub(super) fn read(b: &[u8]) -> AtomicResponse {
        use field::atomic_resp as f;
        AtomicResponse {
            msn: get_u32(b, f::MSN),
            original: get_u64(b, f::ORIGINAL),
        }
    }

    /// Writes the header into `b`, exactly [`ATOMIC_RESP_LEN`](super::ATOMIC_RESP_LEN)
    /// bytes of zeros.
    pub(super) fn write(&self, b: &mut [u8]) {
        use field::atomic_resp as f;
        put_u32(b, f::MSN, self.msn);
        put_u64(b, f::ORIGINAL, self.original);
    }
}
