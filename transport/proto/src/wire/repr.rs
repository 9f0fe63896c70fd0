//! The parsed, high-level form of a packet's headers (smoltcp's `Repr`).
use core::fmt;

use super::field;
use super::{
    Body, Error, Flags, HEADER_LEN, Header, Kind, SEAL_OVERHEAD, SEAL_SEQ_LEN, TRAILER_LEN,
    VERSION, is_sealed, view,
};

/// A parsed packet without its payload: the common header and the per-kind header
/// (smoltcp's `Repr`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Common header. Its `kind` is taken from `body` when emitting.
    pub header: Header,
    /// Per-kind header.
    pub body: Body,
}

impl Repr {
    /// Parses a checked view of a plain datagram: refuses a sealed one with
    /// [`Error::Sealed`], then checks the CRC32C, version, kind, every field's range and
    /// that the length fields agree with the payload. Returns the payload beside.
    pub fn parse<'a, T: AsRef<[u8]> + ?Sized>(
        packet: &view::Packet<&'a T>,
    ) -> Result<(Repr, &'a [u8]), Error> {
        packet.check_len()?;
        if packet.is_sealed() {
            return Err(Error::Sealed);
        }
        if !packet.verify_checksum() {
            return Err(Error::BadCrc);
        }
        let inner: &'a T = packet.into_inner();
        let bytes: &'a [u8] = inner.as_ref();
        // check_len: at least HEADER_LEN + TRAILER_LEN bytes.
        Repr::parse_content(&bytes[..bytes.len() - TRAILER_LEN], 0)
    }

    /// Parses the plaintext of a sealed packet once its tag has been verified and its bytes
    /// decrypted: common header, sealing sequence number, per-kind header and payload, with
    /// the tag already cut off. The header must carry [`Flags::SEALED`].
    pub fn parse_opened(plaintext: &[u8]) -> Result<(Repr, &[u8]), Error> {
        if plaintext.len() < HEADER_LEN + SEAL_SEQ_LEN {
            return Err(Error::Truncated);
        }
        if !is_sealed(plaintext) {
            return Err(Error::BadLength);
        }
        Repr::parse_content(plaintext, SEAL_SEQ_LEN)
    }

    /// Parses the headers of a plain datagram received in pieces (`crate::Landing`): `head`
    /// holds the common and per-kind headers and nothing more; `payload_len` payload bytes
    /// followed elsewhere. Checks what [`parse`](Self::parse) checks but the CRC32C, which
    /// covers pieces this function does not see ([`super::parse_pieces`]).
    pub fn parse_head(head: &[u8], payload_len: usize) -> Result<Repr, Error> {
        if head.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if is_sealed(head) {
            return Err(Error::Sealed);
        }
        if head[field::VERSION] != VERSION {
            return Err(Error::BadVersion);
        }
        let kind = Kind::from_u8(head[field::KIND])?;
        let body = Body::parse(kind, &head[HEADER_LEN..])?;
        if HEADER_LEN + body.len() != head.len() {
            return Err(Error::BadLength);
        }
        body.check_payload(payload_len)?;
        Ok(Repr {
            header: Header::read(head, kind),
            body,
        })
    }

    /// Parses the common header, `ext_len` bytes after it (skipped), the per-kind header
    /// and the payload of `content` (no trailer), which holds at least [`HEADER_LEN`] bytes.
    fn parse_content(content: &[u8], ext_len: usize) -> Result<(Repr, &[u8]), Error> {
        if content[field::VERSION] != VERSION {
            return Err(Error::BadVersion);
        }
        let kind = Kind::from_u8(content[field::KIND])?;
        let rest = content
            .get(HEADER_LEN + ext_len..)
            .ok_or(Error::Truncated)?;
        let body = Body::parse(kind, rest)?;
        let payload = &rest[body.len()..]; // Body::parse checked that `rest` holds the body
        body.check_payload(payload.len())?;
        let header = Header::read(content, kind);
        Ok((Repr { header, body }, payload))
    }

    /// Bytes of the plain packet with this header and `payload_len` payload bytes.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        HEADER_LEN + self.body.len() + payload_len + TRAILER_LEN
    }

    /// Bytes of the sealed packet with this header and `payload_len` payload bytes.
    pub fn sealed_buffer_len(&self, payload_len: usize) -> usize {
        self.buffer_len(payload_len) + SEAL_OVERHEAD
    }

    /// Writes the plain packet into `buf`: header (without [`Flags::SEALED`]), per-kind
    /// header, `payload_len` bytes filled in place by `fill_payload`, and the CRC32C
    /// trailer. Returns the datagram's length, or [`Error::BufferTooSmall`] (before
    /// writing anything).
    ///
    /// The payload is written by the closure so that message bytes go from the memory
    /// region to the transmit buffer in one copy.
    pub fn emit(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8]),
    ) -> Result<usize, Error> {
        let total = self.buffer_len(payload_len);
        let buf = buf.get_mut(..total).ok_or(Error::BufferTooSmall)?;
        let flags = self.header.flag_set().difference(Flags::SEALED);
        let start = self.emit_headers(buf, flags, None);
        fill_payload(&mut buf[start..start + payload_len]);
        view::Packet::new_unchecked(buf).fill_checksum();
        Ok(total)
    }

    /// [`emit`](Self::emit) with the payload's CRC computed by the filler: `fill_payload`
    /// gets the payload's bytes and the CRC32C of the bytes before them, and returns the
    /// CRC32C through the payload (so a copy can checksum what it copies in the same pass,
    /// `Region::read_crc`), which goes into the trailer.
    pub fn emit_with_crc(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8], u32) -> u32,
    ) -> Result<usize, Error> {
        let total = self.buffer_len(payload_len);
        let buf = buf.get_mut(..total).ok_or(Error::BufferTooSmall)?;
        let flags = self.header.flag_set().difference(Flags::SEALED);
        let start = self.emit_headers(buf, flags, None);
        // The hop field lies in the headers, so their CRC masks it as the whole packet's would.
        let head = super::telemetry::crc(&buf[..start]);
        let (body, trailer) = buf.split_at_mut(start + payload_len);
        let crc = fill_payload(&mut body[start..], head);
        trailer.copy_from_slice(&crc.to_be_bytes());
        Ok(total)
    }

    /// Writes the plaintext of a sealed packet into `buf`: the header with
    /// [`Flags::SEALED`] set, the sealing sequence number `seq`, the per-kind header and
    /// `payload_len` bytes filled by `fill_payload`, and leaves
    /// [`SEAL_TAG_LEN`](super::SEAL_TAG_LEN) bytes for the tag. Returns the sealed datagram's
    /// length. The caller encrypts it in place ([`crate::seal::Sealer::emit`] does both).
    pub fn emit_for_seal(
        &self,
        buf: &mut [u8],
        seq: u64,
        payload_len: usize,
        fill_payload: impl FnOnce(&mut [u8]),
    ) -> Result<usize, Error> {
        let total = self.sealed_buffer_len(payload_len);
        let buf = buf.get_mut(..total).ok_or(Error::BufferTooSmall)?;
        let flags = self.header.flag_set() | Flags::SEALED;
        let start = self.emit_headers(buf, flags, Some(seq));
        fill_payload(&mut buf[start..start + payload_len]);
        Ok(total)
    }

    /// Writes the common header with `flags`, the sealing sequence number if given, and
    /// the per-kind header into `buf`, which holds the whole packet; returns where the
    /// payload starts.
    fn emit_headers(&self, buf: &mut [u8], flags: Flags, seq: Option<u64>) -> usize {
        let h = &self.header;
        // The callers sized `buf` for the whole packet. The common header goes through a
        // view of exactly its length: one length check instead of one per field.
        if let Some(head) = buf.first_chunk_mut::<HEADER_LEN>() {
            let mut v = view::Packet::new_unchecked(&mut head[..]);
            v.set_version(VERSION);
            v.set_kind(self.body.kind());
            v.set_path(h.path);
            v.set_flags(flags);
            v.set_dst_qpn(h.dst_qpn);
            v.set_src_qpn(h.src_qpn);
            v.set_psn(h.psn);
            v.set_send_ts_ns(h.send_ts_ns);
        }
        let mut start = HEADER_LEN;
        if let Some(seq) = seq {
            // The caller sized `buf` for a sealed packet, which reaches past the sequence.
            let _ = view::Packet::new_unchecked(&mut *buf).set_seal_seq(seq);
            start += SEAL_SEQ_LEN;
        }
        self.body.emit(&mut buf[start..start + self.body.len()]);
        start + self.body.len()
    }

    /// Prints the packet as [`Display`](fmt::Display) does, with `payload_len` for the
    /// kinds that carry a payload.
    pub(super) fn fmt_with_payload(
        &self,
        f: &mut fmt::Formatter<'_>,
        payload_len: usize,
    ) -> fmt::Result {
        let h = &self.header;
        write!(f, "qp {}->{} path {} ", h.src_qpn, h.dst_qpn, h.path)?;
        write!(f, "{}", h.flag_set())?;
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
                payload_len
            ),
            Body::ReadResponse(r) => write!(
                f,
                "READ_RESP psn {} msn {} off {}/{} payload {}",
                h.psn, r.msn, r.offset, r.msg_len, payload_len
            ),
            Body::AtomicResponse(r) => write!(
                f,
                "ATOMIC_RESP psn {} msn {} original {:#x}",
                h.psn, r.msn, r.original
            ),
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

impl fmt::Display for Repr {
    /// One line: QPs, path, flags, kind and fields (payload length 0).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_with_payload(f, 0)
    }
}
