//! Braid's time type. It does not read any clock: a [`Timestamp`] is a count of nanoseconds
//! from an epoch the caller chooses (process start for the runtime, zero for the simulator).
//!
//! The sans-IO engine and the congestion controllers take `now: Timestamp` on every call, so
//! the same code runs against a real clock or a virtual one.
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

#[cfg(test)]
mod tests {
    use super::*;

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
