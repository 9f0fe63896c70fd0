//! Why a packet could not be parsed or written.
use core::fmt;

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
