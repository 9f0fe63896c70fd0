//! Braid's time type and ECN codepoint: the two small values every layer (engine, congestion
//! control, datapaths) passes around. It does not read any clock: a [`Timestamp`] is a count
//! of nanoseconds from an epoch the caller chooses (process start for the runtime, zero for
//! the simulator).
//!
//! The sans-IO engine and the congestion controllers take `now: Timestamp` on every call, so
//! the same code runs against a real clock or a virtual one. [`Ecn`] is the two-bit codepoint
//! of the IP header; it lives here rather than in the datapath so that crates which must not
//! depend on a datapath can name it.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point in time, in nanoseconds since a caller-chosen epoch.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The epoch itself. Simulations start here.
    pub const ZERO: Timestamp = Timestamp(0);
    /// The latest representable time; used as "never".
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// A timestamp `ns` nanoseconds after the epoch.
    pub const fn from_nanos(ns: u64) -> Self {
        Timestamp(ns)
    }

    /// A timestamp `us` microseconds after the epoch.
    pub const fn from_micros(us: u64) -> Self {
        Timestamp(us.saturating_mul(1_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Nanoseconds from `earlier` to `self`, zero if `earlier` is later.
    pub const fn nanos_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// `self + ns` nanoseconds, saturating at [`Timestamp::MAX`].
    pub const fn add_nanos(self, ns: u64) -> Self {
        Timestamp(self.0.saturating_add(ns))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, rhs: Duration) -> Timestamp {
        let ns = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        self.add_nanos(ns)
    }
}

impl AddAssign<Duration> for Timestamp {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Timestamp> for Timestamp {
    type Output = Duration;
    /// Saturating: a later `rhs` gives zero.
    fn sub(self, rhs: Timestamp) -> Duration {
        self.saturating_since(rhs)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}ms", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// ECN codepoint of an IP packet: the low two bits of the IPv4 TOS byte or the IPv6 traffic
/// class (RFC 3168). The discriminants are the bits on the wire.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Ecn {
    /// Not ECN-capable transport.
    #[default]
    NotEct = 0b00,
    /// ECN-capable, codepoint 1.
    Ect1 = 0b01,
    /// ECN-capable, codepoint 0.
    Ect0 = 0b10,
    /// Congestion experienced.
    Ce = 0b11,
}

impl Ecn {
    /// The codepoint in the low two bits of `bits`; the upper six bits (the DSCP, when `bits`
    /// is a whole TOS byte) are ignored, so every byte maps to some codepoint.
    pub const fn from_bits(bits: u8) -> Ecn {
        match bits & 0b11 {
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            0b11 => Ecn::Ce,
            _ => Ecn::NotEct,
        }
    }

    /// The codepoint of a whole TOS / traffic-class byte (its low two bits).
    pub const fn from_tos(tos: u8) -> Ecn {
        Ecn::from_bits(tos)
    }

    /// The two bits as they go into the IP header (DSCP zero).
    pub const fn to_bits(self) -> u8 {
        self as u8
    }

    /// Whether the packet is marked congestion experienced.
    pub const fn is_ce(self) -> bool {
        matches!(self, Ecn::Ce)
    }
}

impl From<u8> for Ecn {
    /// Takes the low two bits, as [`Ecn::from_bits`].
    fn from(bits: u8) -> Ecn {
        Ecn::from_bits(bits)
    }
}

impl From<Ecn> for u8 {
    fn from(ecn: Ecn) -> u8 {
        ecn.to_bits()
    }
}

impl fmt::Display for Ecn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ecn::NotEct => "not-ECT",
            Ecn::Ect1 => "ECT(1)",
            Ecn::Ect0 => "ECT(0)",
            Ecn::Ce => "CE",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecn_round_trips_through_its_two_bits() {
        for e in [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ce] {
            assert_eq!(Ecn::from_bits(e.to_bits()), e);
            assert_eq!(Ecn::from(u8::from(e)), e);
        }
        assert_eq!(Ecn::Ect0.to_bits(), 0b10);
        assert_eq!(Ecn::Ect1.to_bits(), 0b01);
        // The DSCP bits of a TOS byte do not leak into the codepoint.
        assert_eq!(Ecn::from_tos(0xb8 | 0b11), Ecn::Ce);
        assert_eq!(Ecn::from_tos(0xb8), Ecn::NotEct);
        assert!(Ecn::Ce.is_ce() && !Ecn::Ect0.is_ce());
        assert_eq!(Ecn::Ect0.to_string(), "ECT(0)");
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_micros(5);
        assert_eq!(t.as_nanos(), 5_000);
        assert_eq!(t - Timestamp::from_micros(7), Duration::ZERO);
        assert_eq!(Timestamp::MAX + Duration::from_secs(1), Timestamp::MAX);
        assert_eq!((t + Duration::from_nanos(10)).nanos_since(t), 10);
        assert_eq!(Timestamp::from_nanos(1_500_000).to_string(), "1.500000ms");
    }
}
