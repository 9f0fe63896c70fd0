//! Braid's packet formats, all in one place.
//!
//! Every Braid packet is one UDP payload: a 24-byte common header, a per-kind header, an
//! optional payload, and a 4-byte CRC32C trailer computed over everything before it (like
//! RoCE's ICRC). All integers are big-endian (network order).
//!
//! A QP created with encryption sends every packet *sealed* instead (requests, READ and atomic
//! responses, ACKs and NAKs alike): the `FLAG_SEALED` bit is set in the common header, an
//! 8-byte sealing sequence number follows the header in clear, the per-kind header and payload
//! are AES-256-GCM ciphertext, and a 16-byte tag replaces the CRC32C trailer (the tag covers
//! integrity, so no CRC is computed or checked). See the diagram at the end and [`crate::seal`].
//!
//! ```text
//! Common header (24 bytes), in every packet:
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +---------------+---------------+---------------+---------------+
//! |  version (1)  |     kind      |     path      |     flags     |
//! +---------------+---------------+---------------+---------------+
//! |                  destination QP number                        |
//! +---------------------------------------------------------------+
//! |                     source QP number                          |
//! +---------------------------------------------------------------+
//! |       packet sequence number (PSN; 0 in ACK and NAK)          |
//! +---------------------------------------------------------------+
//! |              send timestamp, ns (sender's clock)              |
//! |                                                               |
//! +---------------------------------------------------------------+
//!
//! kind 1, REQUEST (36 bytes, then payload): SEND, WRITE, READ and atomic requests
//! +---------------+-----------------------------------------------+
//! |      op       |                  reserved (0)                 |
//! +---------------+-----------------------------------------------+
//! |   MSN: message number in the requester's send queue           |
//! +---------------------------------------------------------------+
//! |   SSN: receive-consuming number (SEND, WRITE_IMM; else 0)     |
//! +---------------------------------------------------------------+
//! |   immediate data (SEND_IMM, WRITE_IMM; else 0)                |
//! +---------------------------------------------------------------+
//! |   remote key (WRITE, READ, atomics; else 0)                   |
//! +---------------------------------------------------------------+
//! |   message length in bytes (READ: bytes to read; atomics: 8)   |
//! +---------------------------------------------------------------+
//! |   offset of this payload within the message                   |
//! +---------------------------------------------------------------+
//! |   remote offset within the region (WRITE, READ, atomics)      |
//! |                                                               |
//! +---------------------------------------------------------------+
//! | payload: message bytes [offset, offset+len) for SEND/WRITE;   |
//! | none for READ; for atomics 16 bytes: add-or-swap, compare     |
//! +---------------------------------------------------------------+
//!
//! kind 2, READ RESPONSE (16 bytes, then payload)
//! +---------------------------------------------------------------+
//! |   MSN of the READ request being answered                      |
//! +---------------------------------------------------------------+
//! |   offset of this payload within the READ                      |
//! +---------------------------------------------------------------+
//! |   total READ length                                           |
//! +---------------------------------------------------------------+
//! |   reserved (0)                                                |
//! +---------------------------------------------------------------+
//!
//! kind 3, ATOMIC RESPONSE (16 bytes)
//! +---------------------------------------------------------------+
//! |   MSN of the atomic request being answered                    |
//! +---------------------------------------------------------------+
//! |   reserved (0)                                                |
//! +---------------------------------------------------------------+
//! |   original value at the target (before the operation)        |
//! |                                                               |
//! +---------------------------------------------------------------+
//!
//! kind 4, ACK (56 bytes): selective acknowledgement with telemetry echo
//! +---------------------------------------------------------------+
//! |   cumulative PSN: every PSN before it has been received       |
//! +---------------------------------------------------------------+
//! |   echoed PSN (the newest packet this ACK answers)             |
//! +---------------------------------------------------------------+
//! |   echoed send timestamp of that packet, ns                    |
//! |                                                               |
//! +---------------------------------------------------------------+
//! |   holding time at the receiver for that packet, ns            |
//! +---------------------------------------------------------------+
//! |   CE-marked packets received so far (wrapping counter)        |
//! +---------------------------------------------------------------+
//! |   SACK bitmap, 256 bits: bit i (byte i/8, LSB first) set      |
//! |   = PSN cumulative+1+i received                               |
//! |                          (32 bytes)                           |
//! +---------------------------------------------------------------+
//!
//! kind 5, NAK (12 bytes): a request that cannot be accepted
//! +---------------------------------------------------------------+
//! |   PSN of the refused packet                                   |
//! +---------------------------------------------------------------+
//! |   MSN of its message                                          |
//! +---------------+-----------------------------------------------+
//! |   syndrome    |                  reserved (0)                 |
//! +---------------+-----------------------------------------------+
//!
//! Trailer, in every packet that is not sealed:
//! +---------------------------------------------------------------+
//! |   CRC32C (Castagnoli) of every byte before it                 |
//! +---------------------------------------------------------------+
//!
//! A sealed packet (flags & FLAG_SEALED), any kind:
//! +---------------------------------------------------------------+
//! |   common header (24 bytes, as above, FLAG_SEALED set)         |  authenticated (AAD),
//! |                                                               |  in clear
//! +---------------------------------------------------------------+
//! |   sealing sequence number (64 bits), per direction, from 0,   |  authenticated (AAD),
//! |   fresh for every datagram sent, retransmissions included      |  in clear
//! +---------------------------------------------------------------+
//! |   per-kind header and payload, exactly as above               |  AES-256-GCM
//! |   (the same length: GCM is a stream mode)                     |  ciphertext
//! +---------------------------------------------------------------+
//! |   GCM authentication tag (16 bytes)                           |
//! |                                                               |
//! +---------------------------------------------------------------+
//!   nonce (12 bytes) = direction (1 byte: 0 from the lower party, 1 from the higher; see
//!   crate::seal) || 3 zero bytes || sealing sequence number (8 bytes)
//! ```
//!
//! Parsing never panics: every read goes through a bounds-checked cursor, and a packet that is
//! short, has a bad CRC, an unknown version, kind, op or syndrome, or a length field that
//! disagrees with its payload is rejected with an [`Error`].
use core::fmt;

/// Protocol version carried in every packet.
pub const VERSION: u8 = 1;
/// Bytes of the common header.
pub const HEADER_LEN: usize = 24;
/// Bytes of the CRC32C trailer.
pub const TRAILER_LEN: usize = 4;
/// Bits in an ACK's SACK bitmap.
pub const SACK_BITS: u32 = 256;
/// Largest per-kind header (REQUEST).
pub const MAX_BODY_LEN: usize = REQUEST_LEN;
/// Bytes of a REQUEST header.
pub const REQUEST_LEN: usize = 36;
/// Bytes of a READ RESPONSE header.
pub const READ_RESP_LEN: usize = 16;
/// Bytes of an ATOMIC RESPONSE header.
pub const ATOMIC_RESP_LEN: usize = 16;
/// Bytes of an ACK body.
pub const ACK_LEN: usize = 24 + SACK_BITS as usize / 8;
/// Bytes of a NAK body.
pub const NAK_LEN: usize = 12;
/// Bytes of an atomic request's payload (operand, compare).
pub const ATOMIC_OPERANDS_LEN: usize = 16;
/// Bytes of the sealing sequence number that follows the common header of a sealed packet.
pub const SEAL_SEQ_LEN: usize = 8;
/// Bytes of the AES-GCM tag that ends a sealed packet (in place of the CRC32C trailer).
pub const SEAL_TAG_LEN: usize = 16;
/// Bytes a sealed packet has beyond the plain packet with the same body and payload.
pub const SEAL_OVERHEAD: usize = SEAL_SEQ_LEN + SEAL_TAG_LEN - TRAILER_LEN;

/// Why a packet could not be parsed. Tiny and `Copy`, as smoltcp's.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// Shorter than its headers say.
    Truncated,
    /// The CRC32C trailer does not match.
    BadCrc,
    /// Unknown protocol version.
    BadVersion,
    /// Unknown packet kind.
    BadKind,
    /// Unknown request op code.
    BadOp,
    /// Unknown NAK syndrome.
    BadSyndrome,
    /// A length or offset field is inconsistent with the payload.
    BadLength,
    /// The output buffer is too small.
    BufferTooSmall,
    /// The packet is sealed: it can only be read with its connection's key
    /// ([`crate::seal::Sealer::open`]).
    Sealed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Error::Truncated => "truncated packet",
            Error::BadCrc => "CRC32C mismatch",
            Error::BadVersion => "unknown protocol version",
            Error::BadKind => "unknown packet kind",
            Error::BadOp => "unknown request op",
            Error::BadSyndrome => "unknown NAK syndrome",
            Error::BadLength => "inconsistent length field",
            Error::BufferTooSmall => "output buffer too small",
            Error::Sealed => "sealed packet (needs its connection's key)",
        };
        f.write_str(s)
    }
}

impl std::error::Error for Error {}

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
    fn from_u8(v: u8) -> Result<Op, Error> {
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
    fn from_u8(v: u8) -> Result<Syndrome, Error> {
        Ok(match v {
            1 => Syndrome::ReceiverNotReady,
            2 => Syndrome::RemoteAccess,
            3 => Syndrome::InvalidRequest,
            4 => Syndrome::RemoteOperation,
            _ => return Err(Error::BadSyndrome),
        })
    }
}

/// Common header flag: this packet is a retransmission.
pub const FLAG_RETRANSMIT: u8 = 0x01;
/// Common header flag, in ACKs: a duplicate data packet arrived since the previous ACK (a
/// retransmission that was not needed, or network duplication), like TCP's D-SACK. The
/// sender widens its reordering window on it.
pub const FLAG_DUPLICATE: u8 = 0x02;
/// Common header flag: the packet is sealed (encrypted and authenticated, see
/// [`crate::seal`]); a sealing sequence number follows the header and a tag ends it.
pub const FLAG_SEALED: u8 = 0x04;

/// The common header.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// What follows.
    pub kind: Kind,
    /// Path index the sender used (telemetry; the UDP source port is what routes).
    pub path: u8,
    /// Flags, `FLAG_*`.
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

/// REQUEST header fields.
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

/// READ RESPONSE header fields.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReadResponse {
    /// MSN of the READ.
    pub msn: u32,
    /// Offset of this payload within the READ.
    pub offset: u32,
    /// Total READ length.
    pub msg_len: u32,
}

/// ATOMIC RESPONSE fields.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AtomicResponse {
    /// MSN of the atomic.
    pub msn: u32,
    /// Value at the target before the operation.
    pub original: u64,
}

/// ACK fields.
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
    /// Whether the SACK bitmap says `psn` was received (false outside its range).
    pub fn sacked(&self, psn: u32) -> bool {
        let d = psn.wrapping_sub(self.cum_psn.wrapping_add(1));
        if d >= SACK_BITS {
            return false;
        }
        let byte = self.sack[(d / 8) as usize]; // d < 256: index < 32, the array's length
        byte & (1 << (d % 8)) != 0
    }
}

/// NAK fields.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nak {
    /// PSN of the refused packet.
    pub psn: u32,
    /// MSN of its message.
    pub msn: u32,
    /// Why.
    pub syndrome: Syndrome,
}

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
        match self {
            Body::Request(_) => REQUEST_LEN,
            Body::ReadResponse(_) => READ_RESP_LEN,
            Body::AtomicResponse(_) => ATOMIC_RESP_LEN,
            Body::Ack(_) => ACK_LEN,
            Body::Nak(_) => NAK_LEN,
        }
    }

    /// Always false: every body has a header. (Present for clippy's `len` convention.)
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A parsed packet, borrowing its payload from the datagram.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Common header.
    pub header: Header,
    /// Per-kind header.
    pub body: Body,
    /// Payload bytes (empty for kinds without payload).
    pub payload: &'a [u8],
}

/// A bounds-checked big-endian reader: every read returns `Err(Truncated)` past the end.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.buf.len() < n {
            return Err(Error::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_be_bytes(self.array()?))
    }
}

/// A bounds-checked big-endian writer.
struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        // Callers check the whole length up front (`emit`), so this range is in bounds.
        self.buf[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }
    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_be_bytes());
    }
}

/// Computes the CRC32C that ends a packet.
///
/// Under `cfg(fuzzing)` verification always succeeds, so fuzzers reach the code behind it.
pub fn verify_crc(datagram: &[u8]) -> bool {
    if cfg!(fuzzing) {
        return true;
    }
    let Some(split) = datagram.len().checked_sub(TRAILER_LEN) else {
        return false;
    };
    let (data, trailer) = datagram.split_at(split);
    let mut t = [0u8; 4];
    t.copy_from_slice(trailer);
    crc32c::crc32c(data) == u32::from_be_bytes(t)
}

impl<'a> Packet<'a> {
    /// Parses and checks one datagram: length, CRC32C, version, kind and every field's range.
    ///
    /// A sealed packet is refused with [`Error::Sealed`] before its CRC is looked at.
    pub fn parse(datagram: &'a [u8]) -> Result<Packet<'a>, Error> {
        if datagram.len() < HEADER_LEN + TRAILER_LEN {
            return Err(Error::Truncated);
        }
        if is_sealed(datagram) {
            return Err(Error::Sealed);
        }
        if !verify_crc(datagram) {
            return Err(Error::BadCrc);
        }
        let content = &datagram[..datagram.len() - TRAILER_LEN]; // len checked above
        Packet::parse_content(content, 0)
    }

    /// Parses the plaintext of a sealed packet once its tag has been verified and its bytes
    /// decrypted: common header, sealing sequence number, per-kind header and payload, with
    /// the tag already cut off. The header must carry `FLAG_SEALED`.
    pub fn parse_opened(plaintext: &'a [u8]) -> Result<Packet<'a>, Error> {
        if plaintext.len() < HEADER_LEN + SEAL_SEQ_LEN {
            return Err(Error::Truncated);
        }
        if !is_sealed(plaintext) {
            return Err(Error::BadLength);
        }
        Packet::parse_content(plaintext, SEAL_SEQ_LEN)
    }

    /// Parses header, `ext_len` bytes of extension after it (skipped), body and payload.
    fn parse_content(content: &'a [u8], ext_len: usize) -> Result<Packet<'a>, Error> {
        let mut r = Reader { buf: content };
        if r.u8()? != VERSION {
            return Err(Error::BadVersion);
        }
        let kind = r.u8()?;
        let path = r.u8()?;
        let flags = r.u8()?;
        let dst_qpn = r.u32()?;
        let src_qpn = r.u32()?;
        let psn = r.u32()?;
        let send_ts_ns = r.u64()?;
        r.take(ext_len)?;
        let (kind, body) = match kind {
            1 => {
                let op = Op::from_u8(r.u8()?)?;
                r.take(3)?;
                let req = Request {
                    op,
                    msn: r.u32()?,
                    ssn: r.u32()?,
                    imm: r.u32()?,
                    rkey: r.u32()?,
                    msg_len: r.u32()?,
                    offset: r.u32()?,
                    remote_offset: r.u64()?,
                };
                (Kind::Request, Body::Request(req))
            }
            2 => {
                let resp = ReadResponse {
                    msn: r.u32()?,
                    offset: r.u32()?,
                    msg_len: r.u32()?,
                };
                r.u32()?;
                (Kind::ReadResponse, Body::ReadResponse(resp))
            }
            3 => {
                let msn = r.u32()?;
                r.u32()?;
                (
                    Kind::AtomicResponse,
                    Body::AtomicResponse(AtomicResponse {
                        msn,
                        original: r.u64()?,
                    }),
                )
            }
            4 => {
                let ack = Ack {
                    cum_psn: r.u32()?,
                    echo_psn: r.u32()?,
                    echo_ts_ns: r.u64()?,
                    hold_ns: r.u32()?,
                    ce_count: r.u32()?,
                    sack: r.array()?,
                };
                (Kind::Ack, Body::Ack(ack))
            }
            5 => {
                let psn = r.u32()?;
                let msn = r.u32()?;
                let syndrome = Syndrome::from_u8(r.u8()?)?;
                r.take(3)?;
                (Kind::Nak, Body::Nak(Nak { psn, msn, syndrome }))
            }
            _ => return Err(Error::BadKind),
        };
        let payload = r.buf;
        check_payload(&body, payload.len())?;
        let header = Header {
            kind,
            path,
            flags,
            dst_qpn,
            src_qpn,
            psn,
            send_ts_ns,
        };
        Ok(Packet {
            header,
            body,
            payload,
        })
    }
}

/// Checks that a body's length fields agree with the payload it carries.
fn check_payload(body: &Body, payload_len: usize) -> Result<(), Error> {
    let len = u64::try_from(payload_len).map_err(|_| Error::BadLength)?;
    let ok = match body {
        Body::Request(r) => match r.op {
            Op::Read => len == 0,
            Op::FetchAdd | Op::CompareSwap => r.msg_len == 8 && len == ATOMIC_OPERANDS_LEN as u64,
            _ => u64::from(r.offset) + len <= u64::from(r.msg_len),
        },
        Body::ReadResponse(r) => u64::from(r.offset) + len <= u64::from(r.msg_len),
        Body::AtomicResponse(_) | Body::Ack(_) | Body::Nak(_) => len == 0,
    };
    if ok { Ok(()) } else { Err(Error::BadLength) }
}

/// Writes one packet into `buf`: header, body, `payload_len` bytes filled in place by
/// `fill_payload`, and the CRC32C trailer. Returns the datagram's length.
///
/// The payload is written by the closure so that message bytes go from the memory region to
/// the transmit buffer in one copy.
pub fn emit(
    buf: &mut [u8],
    header: &Header,
    body: &Body,
    payload_len: usize,
    fill_payload: impl FnOnce(&mut [u8]),
) -> Result<usize, Error> {
    let start = HEADER_LEN + body.len();
    let total = start + payload_len + TRAILER_LEN;
    if buf.len() < total {
        return Err(Error::BufferTooSmall);
    }
    let mut w = Writer { buf, pos: 0 };
    write_header(&mut w, header, header.flags & !FLAG_SEALED, body);
    write_body(&mut w, body);
    debug_assert_eq!(w.pos, start);
    fill_payload(&mut buf[start..start + payload_len]);
    let crc = crc32c::crc32c(&buf[..start + payload_len]);
    buf[start + payload_len..total].copy_from_slice(&crc.to_be_bytes());
    Ok(total)
}

/// Writes the plaintext of a sealed packet into `buf`: the header with `FLAG_SEALED` set, the
/// sealing sequence number `seq`, the body and `payload_len` bytes filled by `fill_payload`,
/// and leaves [`SEAL_TAG_LEN`] bytes for the tag. Returns the sealed datagram's length. The
/// caller encrypts it in place ([`crate::seal::Sealer::emit`] does both).
pub fn emit_for_seal(
    buf: &mut [u8],
    header: &Header,
    seq: u64,
    body: &Body,
    payload_len: usize,
    fill_payload: impl FnOnce(&mut [u8]),
) -> Result<usize, Error> {
    let start = HEADER_LEN + SEAL_SEQ_LEN + body.len();
    let total = start + payload_len + SEAL_TAG_LEN;
    if buf.len() < total {
        return Err(Error::BufferTooSmall);
    }
    let mut w = Writer { buf, pos: 0 };
    write_header(&mut w, header, header.flags | FLAG_SEALED, body);
    w.u64(seq);
    write_body(&mut w, body);
    debug_assert_eq!(w.pos, start);
    fill_payload(&mut buf[start..start + payload_len]);
    Ok(total)
}

/// Whether a datagram's common header says it is sealed (false if too short to say).
pub fn is_sealed(datagram: &[u8]) -> bool {
    datagram.get(3).is_some_and(|f| f & FLAG_SEALED != 0)
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
/// and tag at least), version and `FLAG_SEALED`. Authenticates nothing.
pub fn peek_sealed(datagram: &[u8]) -> Result<SealedPeek, Error> {
    if datagram.len() < HEADER_LEN + SEAL_SEQ_LEN + SEAL_TAG_LEN {
        return Err(Error::Truncated);
    }
    let mut r = Reader { buf: datagram };
    if r.u8()? != VERSION {
        return Err(Error::BadVersion);
    }
    r.u8()?;
    r.u8()?;
    if r.u8()? & FLAG_SEALED == 0 {
        return Err(Error::BadLength);
    }
    let dst_qpn = r.u32()?;
    let src_qpn = r.u32()?;
    r.take(12)?;
    let seq = r.u64()?;
    Ok(SealedPeek {
        dst_qpn,
        src_qpn,
        seq,
    })
}

fn write_header(w: &mut Writer<'_>, header: &Header, flags: u8, body: &Body) {
    w.u8(VERSION);
    w.u8(body.kind() as u8);
    w.u8(header.path);
    w.u8(flags);
    w.u32(header.dst_qpn);
    w.u32(header.src_qpn);
    w.u32(header.psn);
    w.u64(header.send_ts_ns);
}

fn write_body(w: &mut Writer<'_>, body: &Body) {
    match body {
        Body::Request(r) => {
            w.put(&[r.op as u8, 0, 0, 0]);
            w.u32(r.msn);
            w.u32(r.ssn);
            w.u32(r.imm);
            w.u32(r.rkey);
            w.u32(r.msg_len);
            w.u32(r.offset);
            w.u64(r.remote_offset);
        }
        Body::ReadResponse(r) => {
            w.u32(r.msn);
            w.u32(r.offset);
            w.u32(r.msg_len);
            w.u32(0);
        }
        Body::AtomicResponse(r) => {
            w.u32(r.msn);
            w.u32(0);
            w.u64(r.original);
        }
        Body::Ack(a) => {
            w.u32(a.cum_psn);
            w.u32(a.echo_psn);
            w.u64(a.echo_ts_ns);
            w.u32(a.hold_ns);
            w.u32(a.ce_count);
            w.put(&a.sack);
        }
        Body::Nak(n) => {
            w.u32(n.psn);
            w.u32(n.msn);
            w.put(&[n.syndrome as u8, 0, 0, 0]);
        }
    }
}

/// Bytes of a packet with this body and payload.
pub fn packet_len(body: &Body, payload_len: usize) -> usize {
    HEADER_LEN + body.len() + payload_len + TRAILER_LEN
}

/// Bytes of a sealed packet with this body and payload.
pub fn sealed_packet_len(body: &Body, payload_len: usize) -> usize {
    packet_len(body, payload_len) + SEAL_OVERHEAD
}

impl fmt::Display for Packet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.header;
        write!(f, "qp {}->{} path {} ", h.src_qpn, h.dst_qpn, h.path)?;
        if h.flags & FLAG_RETRANSMIT != 0 {
            f.write_str("rtx ")?;
        }
        if h.flags & FLAG_DUPLICATE != 0 {
            f.write_str("dup ")?;
        }
        if h.flags & FLAG_SEALED != 0 {
            f.write_str("sealed ")?;
        }
        match &self.body {
            Body::Request(r) => write!(
                f,
                "REQ psn {} {:?} msn {} ssn {} rkey {:#x} roff {} off {}/{} imm {:#x} payload {}",
                h.psn,
                r.op,
                r.msn,
                r.ssn,
                r.rkey,
                r.remote_offset,
                r.offset,
                r.msg_len,
                r.imm,
                self.payload.len()
            ),
            Body::ReadResponse(r) => write!(
                f,
                "READ_RESP psn {} msn {} off {}/{} payload {}",
                h.psn,
                r.msn,
                r.offset,
                r.msg_len,
                self.payload.len()
            ),
            Body::AtomicResponse(r) => {
                write!(
                    f,
                    "ATOMIC_RESP psn {} msn {} original {:#x}",
                    h.psn, r.msn, r.original
                )
            }
            Body::Ack(a) => {
                let sacked = a.sack.iter().map(|b| b.count_ones()).sum::<u32>();
                write!(
                    f,
                    "ACK cum {} sacked {} echo psn {} ts {} hold {}ns ce {}",
                    a.cum_psn, sacked, a.echo_psn, a.echo_ts_ns, a.hold_ns, a.ce_count
                )
            }
            Body::Nak(n) => write!(f, "NAK psn {} msn {} {:?}", n.psn, n.msn, n.syndrome),
        }
    }
}
