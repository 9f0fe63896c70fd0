//! Which packets of the peer's sequence space have been accepted: duplicate suppression and
//! the SACK bitmap.
//!
//! The tracker keeps `cum` (every PSN before it has been accepted) and a bitmap of the
//! [`WINDOW`] PSNs from `cum` on. A sender never has more than `wire::SACK_BITS` packets
//! outstanding past its oldest unacknowledged one, so a PSN farther ahead than `WINDOW` is
//! hostile or stale and is refused. PSNs are compared with wrapping (serial number)
//! arithmetic.
use crate::seq::Psn;
use crate::wire::SACK_BITS;

/// PSNs tracked ahead of `cum`. A power of two, at least four times the sender's limit.
pub const WINDOW: u32 = 1024;
const WORDS: usize = (WINDOW / 64) as usize;

/// How a received PSN relates to what was accepted before.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// Not seen before, inside the window: process it, then [`RecvTracker::accept`] it.
    New,
    /// Accepted before: drop it, but acknowledge again (the earlier ACK may have been lost).
    Duplicate,
    /// Too far ahead: drop it without acknowledging.
    OutOfWindow,
}

/// Accepted-PSN tracker for one direction of one connection.
#[derive(Clone, Debug)]
pub struct RecvTracker {
    cum: u32,
    /// One past the highest PSN accepted (`cum` when nothing above it has been).
    top: u32,
    /// Bit `psn % WINDOW` is set when `psn` in `[cum, cum + WINDOW)` has been accepted.
    bits: [u64; WORDS],
}

impl RecvTracker {
    /// A tracker expecting `initial_psn` first.
    pub fn new(initial_psn: u32) -> Self {
        RecvTracker {
            cum: initial_psn,
            top: initial_psn,
            bits: [0; WORDS],
        }
    }

    /// Every PSN before this one has been accepted.
    pub fn cum(&self) -> u32 {
        self.cum
    }

    /// Whether a PSN above `cum` has been accepted, so some before it are missing.
    pub fn has_holes(&self) -> bool {
        self.top != self.cum
    }

    fn bit(&self, psn: u32) -> bool {
        let i = psn % WINDOW;
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, psn: u32, on: bool) {
        let i = psn % WINDOW;
        let w = &mut self.bits[(i / 64) as usize];
        if on {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }

    /// Classifies `psn` without changing anything.
    pub fn classify(&self, psn: u32) -> Class {
        let (psn_s, cum) = (Psn(psn), Psn(self.cum));
        let d = psn_s.since(cum);
        if !psn_s.ge(cum) {
            Class::Duplicate
        } else if d >= WINDOW {
            Class::OutOfWindow
        } else if self.bit(psn) {
            Class::Duplicate
        } else {
            Class::New
        }
    }

    /// Records `psn` as accepted. Returns false (and changes nothing) unless it is `New`.
    pub fn accept(&mut self, psn: u32) -> bool {
        if psn == self.cum && self.top == self.cum {
            // The next PSN, nothing accepted beyond it (so no bit set): the usual case.
            self.cum = (Psn(psn) + 1).get();
            self.top = self.cum;
            return true;
        }
        if self.classify(psn) != Class::New {
            return false;
        }
        self.set(psn, true);
        let next = Psn(psn) + 1;
        if next.ge(Psn(self.top)) {
            self.top = next.get();
        }
        while self.bit(self.cum) {
            let c = self.cum;
            self.set(c, false);
            self.cum = (Psn(c) + 1).get();
        }
        true
    }

    /// The SACK bitmap for an ACK: bit i set when `cum + 1 + i` was accepted.
    pub fn sack(&self) -> [u8; SACK_BITS as usize / 8] {
        // 64 bits at a time from the circular bitmap (bit `i` of the result is PSN
        // `cum + 1 + i`): an ACK per datagram makes this a per-packet cost.
        const _: () = assert!(WINDOW.is_multiple_of(64) && SACK_BITS.is_multiple_of(64));
        let mut out = [0u8; SACK_BITS as usize / 8];
        for (k, chunk) in out.chunks_exact_mut(8).enumerate() {
            let start = self.cum.wrapping_add(1).wrapping_add(64 * k as u32) % WINDOW;
            let (w, shift) = ((start / 64) as usize, start % 64);
            let lo = self.bits[w] >> shift;
            let hi = if shift == 0 {
                0
            } else {
                self.bits[(w + 1) % WORDS] << (64 - shift)
            };
            chunk.copy_from_slice(&(lo | hi).to_le_bytes());
        }
        out
    }

    #[cfg(test)]
    fn sack_bit_by_bit(&self) -> [u8; SACK_BITS as usize / 8] {
        let mut out = [0u8; SACK_BITS as usize / 8];
        for i in 0..SACK_BITS {
            if self.bit(self.cum.wrapping_add(1 + i)) {
                out[(i / 8) as usize] |= 1 << (i % 8);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn in_order_and_duplicates() {
        let mut t = RecvTracker::new(u32::MAX - 1);
        assert!(t.accept(u32::MAX - 1));
        assert!(!t.accept(u32::MAX - 1));
        assert!(!t.has_holes());
        assert!(t.accept(1)); // across the wrap, a hole at u32::MAX and 0
        assert_eq!(t.cum(), u32::MAX);
        assert!(t.has_holes());
        assert!(t.accept(u32::MAX));
        assert!(t.has_holes());
        assert!(t.accept(0));
        assert_eq!(t.cum(), 2);
        assert!(!t.has_holes());
        assert!(t.accept(2) && t.accept(3) && !t.accept(3));
        assert_eq!(t.cum(), 4);
        assert_eq!(t.classify(5 + WINDOW), Class::OutOfWindow);
        assert_eq!(t.classify(0), Class::Duplicate);
    }

    /// The model: a naive set of accepted PSNs (relative to the start).
    #[derive(Debug, Clone)]
    enum Op {
        Accept(u32),
        Classify(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..1400).prop_map(Op::Accept),
            (0u32..1400).prop_map(Op::Classify),
        ]
    }

    proptest! {
        /// The tracker agrees with a naive oracle after every operation, from any start PSN
        /// (including one that wraps).
        #[test]
        fn matches_oracle(start in prop_oneof![Just(u32::MAX - 600), any::<u32>()],
                          ops in proptest::collection::vec(op(), 1..600)) {
            let mut t = RecvTracker::new(start);
            let mut seen = BTreeSet::new();
            let oracle_cum = |seen: &BTreeSet<u32>| (0..).find(|i| !seen.contains(i)).unwrap();
            for op in ops {
                let cum = oracle_cum(&seen);
                let expect = |rel: u32| {
                    if rel < cum || seen.contains(&rel) { Class::Duplicate }
                    else if rel - cum >= WINDOW { Class::OutOfWindow }
                    else { Class::New }
                };
                match op {
                    Op::Accept(rel) => {
                        let e = expect(rel);
                        prop_assert_eq!(t.accept(start.wrapping_add(rel)), e == Class::New);
                        if e == Class::New { seen.insert(rel); }
                    }
                    Op::Classify(rel) => prop_assert_eq!(t.classify(start.wrapping_add(rel)), expect(rel)),
                }
                let cum = oracle_cum(&seen);
                prop_assert_eq!(t.cum(), start.wrapping_add(cum));
                prop_assert_eq!(t.has_holes(), seen.iter().any(|&rel| rel > cum));
                let sack = t.sack();
                prop_assert_eq!(sack, t.sack_bit_by_bit());
                for i in 0..SACK_BITS {
                    let bit = sack[(i / 8) as usize] & (1 << (i % 8)) != 0;
                    prop_assert_eq!(bit, seen.contains(&(cum + 1 + i)));
                }
            }
        }
    }
}
