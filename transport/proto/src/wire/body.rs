//! The per-kind part of a packet, whichever kind it is: the dispatch from the kind byte to
//! each header's own reader and writer, and the check that the length fields agree with the
//! payload.
use super::field;
use super::{
    ACK_EXT_LEN, ATOMIC_OPERANDS_LEN, Ack, AtomicResponse, Error, Kind, Nak, Op, ReadResponse,
    Request, Syndrome,
};

/// The per-kind part of a packet.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    /// A request.
    Request(Request),
    /// READ response data.
    ReadResponse(ReadResponse),
    /// Atomic response.
    AtomicResponse(AtomicResponse),
    /// Acknowledgement.
    Ack(Ack),
    /// Negative acknowledgement.
    Nak(Nak),
}

impl Body {
    /// The kind byte for this body.
    pub fn kind(&self) -> Kind {
        match self {
            Body::Request(_) => Kind::Request,
            Body::ReadResponse(_) => Kind::ReadResponse,
            Body::AtomicResponse(_) => Kind::AtomicResponse,
            Body::Ack(_) => Kind::Ack,
            Body::Nak(_) => Kind::Nak,
        }
    }

    /// Bytes of this body's header.
    pub fn len(&self) -> usize {
        self.kind().header_len()
    }

    /// Always false: every body has a header. (Present for clippy's `len` convention.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Decodes a per-kind header of kind `kind` from the front of `rest` (the bytes after
    /// the common header and, if sealed, the sequence number). The op and syndrome codes
    /// are checked as soon as their byte is there, so a packet cut short after a bad code
    /// reports the code.
    pub(super) fn parse(kind: Kind, rest: &[u8]) -> Result<Body, Error> {
        let op = match kind {
            Kind::Request => Some(Op::from_u8(
                *rest.get(field::request::OP).ok_or(Error::Truncated)?,
            )?),
            _ => None,
        };
        if kind == Kind::Nak
            && let Some(&code) = rest.get(field::nak::SYNDROME)
        {
            Syndrome::from_u8(code)?;
        }
        let b = rest.get(..kind.header_len()).ok_or(Error::Truncated)?;
        // `b` holds the whole header of `kind`, so every field of its table is in range.
        Ok(match (kind, op) {
            (Kind::Request, Some(op)) => Body::Request(Request::read(op, b)),
            (Kind::ReadResponse, _) => Body::ReadResponse(ReadResponse::read(b)),
            (Kind::AtomicResponse, _) => Body::AtomicResponse(AtomicResponse::read(b)),
            (Kind::Ack, _) => Body::Ack(Ack::read(b)),
            (Kind::Nak, _) => Body::Nak(Nak::read(b)?),
            (Kind::Request, None) => return Err(Error::BadOp), // `op` is Some for requests
        })
    }

    /// Writes this per-kind header into `b`, exactly [`len`](Self::len) bytes long,
    /// reserved bytes zero.
    pub(super) fn emit(&self, b: &mut [u8]) {
        b.fill(0);
        match self {
            Body::Request(r) => r.write(b),
            Body::ReadResponse(r) => r.write(b),
            Body::AtomicResponse(r) => r.write(b),
            Body::Ack(a) => a.write(b),
            Body::Nak(n) => n.write(b),
        }
    }

    /// Checks that the length fields agree with the payload carried.
    pub(super) fn check_payload(&self, payload_len: usize) -> Result<(), Error> {
        let len = u64::try_from(payload_len).map_err(|_| Error::BadLength)?;
        let ok = match self {
            Body::Request(r) => match r.op {
                Op::Read => len == 0,
                Op::FetchAdd | Op::CompareSwap => {
                    r.msg_len == 8 && len == ATOMIC_OPERANDS_LEN as u64
                }
                _ => u64::from(r.offset) + len <= u64::from(r.msg_len),
            },
            Body::ReadResponse(r) => u64::from(r.offset) + len <= u64::from(r.msg_len),
            Body::Ack(_) => len == 0 || len == ACK_EXT_LEN as u64,
            Body::AtomicResponse(_) | Body::Nak(_) => len == 0,
        };
        if ok { Ok(()) } else { Err(Error::BadLength) }
    }
}
