//! The common header, in every packet.
use super::field::{self, get_u32, get_u64};
use super::{Flags, HEADER_LEN, Kind};

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
    pub(super) fn read(b: &[u8], kind: Kind) -> Header {
        // One length check for the whole header; the field reads below then need none. The
        // callers' invariant makes the fallback (all zeros) unreachable.
        let b: &[u8] = b.first_chunk::<HEADER_LEN>().unwrap_or(&[0; HEADER_LEN]);
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
