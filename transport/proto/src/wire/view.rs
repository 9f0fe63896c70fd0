//! The checked view over a datagram's bytes (smoltcp's `Packet<T>`).
use super::field::{self, get_u32, get_u64, put_u32, put_u64};
use super::{Error, Flags, HEADER_LEN, Kind, SEAL_SEQ_LEN, SEAL_TAG_LEN, TRAILER_LEN};
use core::fmt;

/// A view over the bytes of one datagram, plain or sealed, giving typed access to the
/// common header, the sealing sequence number and the trailer.
///
/// # No panics after `check_len`
///
/// Once [`check_len`](Self::check_len) has succeeded (or the view came from
/// [`new_checked`](Self::new_checked)), no accessor or setter of this view panics,
/// whatever the bytes hold: the common-header fields are within the checked length, and
/// everything whose place depends on the flags byte (the sequence number, the trailer,
/// the per-kind bytes) is looked up with bounds checks. On a view made with
/// [`new_unchecked`](Self::new_unchecked) and never checked, the common-header accessors
/// panic if the buffer is shorter than [`HEADER_LEN`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without looking at it.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` and checks its length ([`check_len`](Self::check_len)).
    pub fn new_checked(buffer: T) -> Result<Packet<T>, Error> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds the common header and the trailer: at least
    /// [`HEADER_LEN`]` + `[`TRAILER_LEN`] bytes, and for a sealed packet (its flags byte
    /// says so) the sequence number and the tag too. The per-kind header is not checked:
    /// [`Repr::parse`](super::Repr::parse) does that with the kind.
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN + TRAILER_LEN {
            return Err(Error::Truncated);
        }
        if self.is_sealed() && len < HEADER_LEN + SEAL_SEQ_LEN + SEAL_TAG_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Bytes in the buffer.
    pub fn total_len(&self) -> usize {
        self.buffer.as_ref().len()
    }

    /// The protocol version byte.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The kind byte, undecoded.
    pub fn kind_code(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }

    /// The kind, or [`Error::BadKind`].
    pub fn kind(&self) -> Result<Kind, Error> {
        Kind::from_u8(self.kind_code())
    }

    /// The path index.
    pub fn path(&self) -> u8 {
        self.buffer.as_ref()[field::PATH]
    }

    /// The flags.
    pub fn flags(&self) -> Flags {
        Flags::from_bits(self.buffer.as_ref()[field::FLAGS])
    }

    /// Whether the flags say the packet is sealed (false for a buffer too short to say).
    pub fn is_sealed(&self) -> bool {
        self.buffer
            .as_ref()
            .get(field::FLAGS)
            .is_some_and(|&f| Flags::from_bits(f).contains(Flags::SEALED))
    }

    /// The destination QP number.
    pub fn dst_qpn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DST_QPN)
    }

    /// The source QP number.
    pub fn src_qpn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SRC_QPN)
    }

    /// The packet sequence number.
    pub fn psn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::PSN)
    }

    /// The send timestamp, ns.
    pub fn send_ts_ns(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::SEND_TS)
    }

    /// The sealing sequence number: `None` unless the packet is sealed and long enough.
    pub fn seal_seq(&self) -> Option<u64> {
        let b = self.buffer.as_ref();
        (self.is_sealed() && b.len() >= field::SEAL_SEQ.end).then(|| get_u64(b, field::SEAL_SEQ))
    }

    /// Bytes before the per-kind header: [`HEADER_LEN`], plus [`SEAL_SEQ_LEN`] if sealed.
    pub fn header_len(&self) -> usize {
        if self.is_sealed() {
            HEADER_LEN + SEAL_SEQ_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Bytes of the trailer: [`SEAL_TAG_LEN`] if sealed, else [`TRAILER_LEN`].
    pub fn trailer_len(&self) -> usize {
        if self.is_sealed() {
            SEAL_TAG_LEN
        } else {
            TRAILER_LEN
        }
    }

    /// The CRC32C the trailer carries, `None` for a sealed packet (or a buffer too
    /// short for a trailer).
    pub fn checksum(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        let at = b.len().checked_sub(TRAILER_LEN)?;
        (!self.is_sealed()).then(|| get_u32(b, at..at + TRAILER_LEN))
    }

    /// Whether the trailer holds the CRC32C of every byte before it, a REQUEST's hop
    /// telemetry taken as zeros (false for a sealed packet).
    ///
    /// Under `cfg(fuzzing)` verification always succeeds, so fuzzers reach the code
    /// behind it.
    pub fn verify_checksum(&self) -> bool {
        if cfg!(fuzzing) {
            return true;
        }
        let b = self.buffer.as_ref();
        match (self.checksum(), b.len().checked_sub(TRAILER_LEN)) {
            (Some(crc), Some(at)) => super::telemetry::crc(&b[..at]) == crc,
            _ => false,
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The per-kind header and payload: the bytes between
    /// [`header_len`](Self::header_len) and the trailer (empty if there are none).
    pub fn body_and_payload(&self) -> &'a [u8] {
        let inner: &'a T = self.buffer;
        let b: &'a [u8] = inner.as_ref();
        let end = b.len().saturating_sub(self.trailer_len());
        b.get(self.header_len()..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the version byte.
    pub fn set_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::VERSION] = v;
    }

    /// Sets the kind.
    pub fn set_kind(&mut self, kind: Kind) {
        self.buffer.as_mut()[field::KIND] = kind as u8;
    }

    /// Sets the path index.
    pub fn set_path(&mut self, path: u8) {
        self.buffer.as_mut()[field::PATH] = path;
    }

    /// Sets the flags.
    pub fn set_flags(&mut self, flags: Flags) {
        self.buffer.as_mut()[field::FLAGS] = flags.bits();
    }

    /// Sets the destination QP number.
    pub fn set_dst_qpn(&mut self, qpn: u32) {
        put_u32(self.buffer.as_mut(), field::DST_QPN, qpn);
    }

    /// Sets the source QP number.
    pub fn set_src_qpn(&mut self, qpn: u32) {
        put_u32(self.buffer.as_mut(), field::SRC_QPN, qpn);
    }

    /// Sets the packet sequence number.
    pub fn set_psn(&mut self, psn: u32) {
        put_u32(self.buffer.as_mut(), field::PSN, psn);
    }

    /// Sets the send timestamp, ns.
    pub fn set_send_ts_ns(&mut self, ts: u64) {
        put_u64(self.buffer.as_mut(), field::SEND_TS, ts);
    }

    /// Sets the sealing sequence number; [`Error::BufferTooSmall`] if the buffer does
    /// not reach past it. (It does not set [`Flags::SEALED`].)
    pub fn set_seal_seq(&mut self, seq: u64) -> Result<(), Error> {
        let b = self.buffer.as_mut();
        if b.len() < field::SEAL_SEQ.end {
            return Err(Error::BufferTooSmall);
        }
        put_u64(b, field::SEAL_SEQ, seq);
        Ok(())
    }

    /// Writes the CRC32C of every byte before the trailer into the trailer (nothing for
    /// a sealed packet, whose tag the sealer writes).
    pub fn fill_checksum(&mut self) {
        if self.is_sealed() {
            return;
        }
        let b = self.buffer.as_mut();
        if let Some(at) = b.len().checked_sub(TRAILER_LEN) {
            let crc = super::telemetry::crc(&b[..at]);
            put_u32(b, at..at + TRAILER_LEN, crc);
        }
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Packet<T> {
    /// The parsed packet as [`Repr`](super::Repr) prints it, or for a packet that does
    /// not parse (sealed, corrupt, too short) its clear header fields and why.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.buffer.as_ref();
        let view = Packet::new_unchecked(bytes);
        if let Err(e) = view.check_len() {
            return write!(f, "{} bytes: {e}", bytes.len());
        }
        match super::Repr::parse(&view) {
            Ok((repr, payload)) => repr.fmt_with_payload(f, payload.len()),
            Err(e) => write!(
                f,
                "qp {}->{} path {} {}kind {} {} bytes: {e}",
                view.src_qpn(),
                view.dst_qpn(),
                view.path(),
                view.flags(),
                view.kind_code(),
                bytes.len()
            ),
        }
    }
}
