//! The acknowledgements: ACK (selective, with telemetry echo) and NAK.
use crate::seq::Psn;

use super::field::{self, get_u32, get_u64, put_u32, put_u64};
use super::{ACK_LEN, Error, SACK_BITS, Syndrome};

/// ACK fields: kind 4, 56 bytes, no payload but an optional telemetry extension; a selective
/// acknowledgement with telemetry echo ([`field::ack`]).
///
/// ```text
/// +---------------------------------------------------------------+
/// |   cumulative PSN: every PSN before it has been received       |
/// +---------------------------------------------------------------+
/// |   echoed PSN (the newest packet this ACK answers)             |
/// +---------------------------------------------------------------+
/// |   echoed send timestamp of that packet, ns                    |
/// |                                                               |
/// +---------------------------------------------------------------+
/// |   holding time at the receiver for that packet, ns            |
/// +---------------------------------------------------------------+
/// |   CE-marked packets received so far (wrapping counter)        |
/// +---------------------------------------------------------------+
/// |   SACK bitmap, 256 bits: bit i (byte i/8, LSB first) set      |
/// |   = PSN cumulative+1+i received                               |
/// |                          (32 bytes)                           |
/// +-------------------------------+-------------------------------+
/// | extension, only when the echoed packet carried hop telemetry  |
/// | ([`field::ack_ext`], [`ACK_EXT_LEN`](super::ACK_EXT_LEN)):    |
/// | hop telemetry of the echoed packet |      reserved (0)        |
/// +-------------------------------+-------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ack {
    /// Every PSN before this one has been received.
    pub cum_psn: u32,
    /// PSN of the packet whose timestamp is echoed.
    pub echo_psn: u32,
    /// Its send timestamp, ns.
    pub echo_ts_ns: u64,
    /// How long the receiver held it before this ACK, ns.
    pub hold_ns: u32,
    /// CE-marked packets received so far (wrapping).
    pub ce_count: u32,
    /// Bit i set: PSN `cum_psn + 1 + i` was received.
    pub sack: [u8; SACK_BITS as usize / 8],
}

impl Ack {
    /// Reads the body from `b`, which holds at least [`ACK_LEN`](super::ACK_LEN) bytes.
    pub(super) fn read(b: &[u8]) -> Ack {
        use field::ack as f;
        // One length check for the whole header (see `Header::read`).
        let b: &[u8] = b.first_chunk::<ACK_LEN>().unwrap_or(&[0; ACK_LEN]);
        let mut sack = [0u8; SACK_BITS as usize / 8];
        sack.copy_from_slice(&b[f::SACK]);
        Ack {
            cum_psn: get_u32(b, f::CUM_PSN),
            echo_psn: get_u32(b, f::ECHO_PSN),
            echo_ts_ns: get_u64(b, f::ECHO_TS),
            hold_ns: get_u32(b, f::HOLD),
            ce_count: get_u32(b, f::CE_COUNT),
            sack,
        }
    }

    /// Writes the body into `b`, exactly [`ACK_LEN`](super::ACK_LEN) bytes of zeros.
    pub(super) fn write(&self, b: &mut [u8]) {
        use field::ack as f;
        // One length check for the whole header; a shorter buffer (never passed) is left as is.
        let Some(b) = b.first_chunk_mut::<ACK_LEN>() else {
            return;
        };
        put_u32(b, f::CUM_PSN, self.cum_psn);
        put_u32(b, f::ECHO_PSN, self.echo_psn);
        put_u64(b, f::ECHO_TS, self.echo_ts_ns);
        put_u32(b, f::HOLD, self.hold_ns);
        put_u32(b, f::CE_COUNT, self.ce_count);
        b[f::SACK].copy_from_slice(&self.sack);
    }

    /// Whether the SACK bitmap says `psn` was received (false outside its range).
    pub fn sacked(&self, psn: u32) -> bool {
        let d = Psn(psn).since(Psn(self.cum_psn) + 1);
        if d >= SACK_BITS {
            return false;
        }
        let byte = self.sack[(d / 8) as usize]; // d < 256: index < 32, the array's length
        byte & (1 << (d % 8)) != 0
    }
}

/// NAK fields: kind 5, 12 bytes, no payload; a request that cannot be accepted
/// ([`field::nak`]).
///
/// ```text
/// +---------------------------------------------------------------+
/// |   PSN of the refused packet                                   |
/// +---------------------------------------------------------------+
/// |   MSN of its message                                          |
/// +---------------+-----------------------------------------------+
/// |   syndrome    |                  reserved (0)                 |
/// +---------------+-----------------------------------------------+
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nak {
    /// PSN of the refused packet.
    pub psn: u32,
    /// MSN of its message.
    pub msn: u32,
    /// Why.
    pub syndrome: Syndrome,
}

impl Nak {
    /// Reads the body from `b`, which holds at least [`NAK_LEN`](super::NAK_LEN) bytes;
    /// [`Error::BadSyndrome`] for an unknown syndrome code.
    pub(super) fn read(b: &[u8]) -> Result<Nak, Error> {
        use field::nak as f;
        Ok(Nak {
            psn: get_u32(b, f::PSN),
            msn: get_u32(b, f::MSN),
            syndrome: Syndrome::from_u8(b[f::SYNDROME])?,
        })
    }

    /// Writes the body into `b`, exactly [`NAK_LEN`](super::NAK_LEN) bytes of zeros.
    pub(super) fn write(&self, b: &mut [u8]) {
        use field::nak as f;
        put_u32(b, f::PSN, self.psn);
        put_u32(b, f::MSN, self.msn);
        b[f::SYNDROME] = self.syndrome as u8;
    }
}
