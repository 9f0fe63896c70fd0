//! Sequence numbers that wrap: packet sequence numbers ([`Psn`]), message sequence numbers
//! ([`Msn`], also used for the receive side's SEND sequence) and the peer's running count of
//! CE marks ([`CeCount`]).
//!
//! They are 32-bit counters compared with serial-number arithmetic (RFC 1982): `a` comes
//! before `b` when `b - a`, modulo 2^32, is in `1..2^31`. Two numbers exactly 2^31 apart are
//! in no order (neither is before the other), which the engine never relies on: its windows
//! are far smaller. No `Ord` is implemented on purpose: the order is not transitive across the
//! whole space, so sorting by it would be wrong.
use core::fmt;
use core::ops::{Add, AddAssign};

/// Half the sequence space: distances at or above it point backwards.
const HALF: u32 = 1 << 31;

macro_rules! serial {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Copy, Clone, Default, PartialEq, Eq, Hash)]
        pub(crate) struct $name(pub(crate) u32);

        // Every type gets the whole set of comparisons, whether the engine uses it yet or not.
        #[allow(dead_code)]
        impl $name {
            /// The raw 32-bit value, as it goes on the wire.
            pub(crate) const fn get(self) -> u32 {
                self.0
            }

            /// How far `self` is past `earlier`, modulo 2^32 (a large value when `self` is in
            /// fact before `earlier`).
            pub(crate) const fn since(self, earlier: $name) -> u32 {
                self.0.wrapping_sub(earlier.0)
            }

            /// Whether `self` comes strictly before `other`: `other - self` is in `1..2^31`.
            pub(crate) const fn lt(self, other: $name) -> bool {
                let d = other.since(self);
                d != 0 && d < HALF
            }

            /// Whether `self` is `other` or comes before it: `other - self` is below 2^31.
            pub(crate) const fn le(self, other: $name) -> bool {
                other.since(self) < HALF
            }

            /// Whether `self` comes strictly after `other`.
            pub(crate) const fn gt(self, other: $name) -> bool {
                other.lt(self)
            }

            /// Whether `self` is `other` or comes after it: `self - other` is below 2^31.
            pub(crate) const fn ge(self, other: $name) -> bool {
                other.le(self)
            }
        }

        impl Add<u32> for $name {
            type Output = $name;
            fn add(self, n: u32) -> $name {
                $name(self.0.wrapping_add(n))
            }
        }

        impl AddAssign<u32> for $name {
            fn add_assign(&mut self, n: u32) {
                self.0 = self.0.wrapping_add(n);
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

serial! {
    /// A packet sequence number.
    Psn
}

serial! {
    /// A message sequence number: the position of a work request in a send queue, or of a
    /// SEND among the SENDs a receive queue matches.
    Msn
}

serial! {
    /// The peer's running count of CE-marked packets, echoed in every ACK.
    CeCount
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The naive model: values on an unbounded line, of which the 32-bit numbers are the
    /// residues; `a` is before `b` when `b` lies in the half-window after `a`.
    fn model_lt(a: i64, b: i64) -> bool {
        let d = (b - a).rem_euclid(1 << 32);
        d > 0 && d < 1 << 31
    }

    #[test]
    fn order_at_the_wrap() {
        let max = Psn(u32::MAX);
        assert!(max.lt(Psn(0)));
        assert!(max.lt(max + 1));
        assert_eq!(max + 1, Psn(0));
        assert!(Psn(0).gt(max));
        assert!(max.le(max) && max.ge(max) && !max.lt(max) && !max.gt(max));
        assert_eq!(Psn(2).since(max), 3);
        assert_eq!(max.since(Psn(2)), u32::MAX - 2);
        // Exactly half the space apart: in no order.
        let far = Psn(HALF);
        assert!(!Psn(0).lt(far) && !far.lt(Psn(0)));
        assert!(Psn(0).lt(Psn(HALF - 1)) && Psn(HALF + 1).lt(Psn(0)));
        let mut m = Msn(u32::MAX - 1);
        m += 3;
        assert_eq!(m, Msn(1));
    }

    proptest! {
        /// Against the model over i64: any base (so every wrap position), any distance within
        /// the half-window either way.
        #[test]
        fn comparisons_match_the_model(
            base in any::<u32>(),
            da in -(1i64 << 31) + 1..(1i64 << 31),
            db in -(1i64 << 31) + 1..(1i64 << 31),
        ) {
            let (a, b) = (i64::from(base) + da, i64::from(base) + db);
            let wrap = |x: i64| x.rem_euclid(1 << 32) as u32;
            let (pa, pb) = (Psn(wrap(a)), Psn(wrap(b)));
            prop_assert_eq!(pa.lt(pb), model_lt(a, b));
            prop_assert_eq!(pa.gt(pb), model_lt(b, a));
            prop_assert_eq!(pa.le(pb), wrap(a) == wrap(b) || model_lt(a, b));
            prop_assert_eq!(pa.ge(pb), pb.le(pa));
            prop_assert_eq!(pb.since(pa), wrap(b - a));
            prop_assert_eq!(pa + wrap(b - a), pb);
            // Within the half-window, the serial order is the order on the line.
            if (a - b).abs() < 1 << 31 {
                prop_assert_eq!(pa.lt(pb), a < b);
                prop_assert_eq!(pa.le(pb), a <= b);
            }
        }
    }
}
