//! The code bytes: packet kinds, request ops and NAK syndromes, each with its `from_u8`.
use core::fmt;

use super::{ACK_LEN, ATOMIC_RESP_LEN, Error, NAK_LEN, READ_RESP_LEN, REQUEST_LEN};

/// Packet kinds (byte 1 of the common header).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A request: SEND, WRITE, READ or atomic.
    Request = 1,
    /// Data answering a READ.
    ReadResponse = 2,
    /// The original value answering an atomic.
    AtomicResponse = 3,
    /// Selective acknowledgement.
    Ack = 4,
    /// Negative acknowledgement.
    Nak = 5,
}

impl Kind {
    /// The kind with wire code `v`, or [`Error::BadKind`].
    pub const fn from_u8(v: u8) -> Result<Kind, Error> {
        Ok(match v {
            1 => Kind::Request,
            2 => Kind::ReadResponse,
            3 => Kind::AtomicResponse,
            4 => Kind::Ack,
            5 => Kind::Nak,
            _ => return Err(Error::BadKind),
        })
    }

    /// Bytes of this kind's per-kind header.
    pub const fn header_len(self) -> usize {
        match self {
            Kind::Request => REQUEST_LEN,
            Kind::ReadResponse => READ_RESP_LEN,
            Kind::AtomicResponse => ATOMIC_RESP_LEN,
            Kind::Ack => ACK_LEN,
            Kind::Nak => NAK_LEN,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Request => "REQ",
            Kind::ReadResponse => "READ_RESP",
            Kind::AtomicResponse => "ATOMIC_RESP",
            Kind::Ack => "ACK",
            Kind::Nak => "NAK",
        })
    }
}

/// Request op codes (first byte of a REQUEST header).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// SEND: payload goes into the receiver's matching posted RECV.
    Send = 0,
    /// SEND with immediate data.
    SendImm = 1,
    /// RDMA WRITE into a remote region.
    Write = 2,
    /// RDMA WRITE with immediate: also consumes a RECV at the target.
    WriteImm = 3,
    /// RDMA READ from a remote region.
    Read = 4,
    /// 8-byte atomic fetch-and-add.
    FetchAdd = 5,
    /// 8-byte atomic compare-and-swap.
    CompareSwap = 6,
}

impl Op {
    /// The op with wire code `v`, or [`Error::BadOp`].
    pub const fn from_u8(v: u8) -> Result<Op, Error> {
        Ok(match v {
            0 => Op::Send,
            1 => Op::SendImm,
            2 => Op::Write,
            3 => Op::WriteImm,
            4 => Op::Read,
            5 => Op::FetchAdd,
            6 => Op::CompareSwap,
            _ => return Err(Error::BadOp),
        })
    }

    /// Whether this op consumes a posted RECV at the target.
    pub fn consumes_recv(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::WriteImm)
    }

    /// Whether the request carries message bytes as payload.
    pub fn carries_data(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::Write | Op::WriteImm)
    }

    /// Whether this op is an 8-byte atomic.
    pub fn is_atomic(self) -> bool {
        matches!(self, Op::FetchAdd | Op::CompareSwap)
    }
}

/// Why a responder refused a request (NAK syndrome).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Syndrome {
    /// Receiver not ready: no RECV posted for this SEND.
    ReceiverNotReady = 1,
    /// Bad key, bounds or access rights.
    RemoteAccess = 2,
    /// The request is invalid at the responder (e.g. longer than the posted RECV).
    InvalidRequest = 3,
    /// The responder failed the operation (e.g. its QP is in error).
    RemoteOperation = 4,
}

impl Syndrome {
    /// The syndrome with wire code `v`, or [`Error::BadSyndrome`].
    pub const fn from_u8(v: u8) -> Result<Syndrome, Error> {
        Ok(match v {
            1 => Syndrome::ReceiverNotReady,
            2 => Syndrome::RemoteAccess,
            3 => Syndrome::InvalidRequest,
            4 => Syndrome::RemoteOperation,
            _ => return Err(Error::BadSyndrome),
        })
    }
}
