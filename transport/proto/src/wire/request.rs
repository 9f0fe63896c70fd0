//! The REQUEST header: SEND, WRITE, READ and atomic requests.
use super::field::{self, get_u32, get_u64, put_u32, put_u64};
use super::{Op, REQUEST_LEN};

/// REQUEST header fields: kind 1, 36 bytes, then the payload. SEND, WRITE, READ and atomic
/// requests ([`field::request`]).
///
/// ```text
/// +---------------+---------------+-------------------------------+
/// |      op       |  reserved (0) | hop telemetry (switches set)  |
/// +---------------+---------------+-------------------------------+
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

impl Request {
    /// Reads the header from `b`, which holds at least [`REQUEST_LEN`](super::REQUEST_LEN)
    /// bytes, with its op already decoded.
    pub(super) fn read(op: Op, b: &[u8]) -> Request {
        use field::request as f;
        // One length check for the whole header (see `Header::read`).
        let b: &[u8] = b.first_chunk::<REQUEST_LEN>().unwrap_or(&[0; REQUEST_LEN]);
        Request {
            op,
            msn: get_u32(b, f::MSN),
            ssn: get_u32(b, f::SSN),
            imm: get_u32(b, f::IMM),
            rkey: get_u32(b, f::RKEY),
            msg_len: get_u32(b, f::MSG_LEN),
            offset: get_u32(b, f::OFFSET),
            remote_offset: get_u64(b, f::REMOTE_OFFSET),
        }
    }

    /// Writes the header into `b`, exactly [`REQUEST_LEN`](super::REQUEST_LEN) bytes of
    /// zeros (the reserved bytes and the hop telemetry, which switches write in flight and
    /// [`super::hop_queue`] reads, stay zero).
    pub(super) fn write(&self, b: &mut [u8]) {
        use field::request as f;
        // One length check for the whole header; a shorter buffer (never passed) is left as is.
        let Some(b) = b.first_chunk_mut::<REQUEST_LEN>() else {
            return;
        };
        b[f::OP] = self.op as u8;
        put_u32(b, f::MSN, self.msn);
        put_u32(b, f::SSN, self.ssn);
        put_u32(b, f::IMM, self.imm);
        put_u32(b, f::RKEY, self.rkey);
        put_u32(b, f::MSG_LEN, self.msg_len);
        put_u32(b, f::OFFSET, self.offset);
        put_u64(b, f::REMOTE_OFFSET, self.remote_offset);
    }
}
