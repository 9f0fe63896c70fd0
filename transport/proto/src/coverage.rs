//! Which byte ranges of a message have arrived.
//!
//! A READ or a RECV completes when every byte of its message has been placed. Counting placed
//! bytes is not enough: an honest peer never sends two packets covering the same bytes under
//! different PSNs, but a hostile one can, and a byte count would then complete the work
//! request while part of the buffer was never written. [`Coverage`] keeps the union of the
//! placed ranges instead, so a message is complete only when the union is the whole message.
//!
//! Ranges are kept sorted, disjoint and non-adjacent. In-order arrival extends the last range
//! in O(1); out-of-order arrival inserts with a binary search. The number of separate ranges
//! is capped ([`MAX_GAPS`]); an honest sender has at most a window's worth of packets
//! outstanding, so it never gets near the cap, and a peer that scatters tiny pieces past it
//! has its packets refused rather than growing our memory.

/// The most separate ranges one message may be in at once: four times the receive tracker's
/// window, since a window of sprayed packets can leave at most that many holes.
pub(crate) const MAX_GAPS: usize = 4 * crate::tracker::WINDOW as usize;

/// The union of the byte ranges of one message placed so far.
#[derive(Debug, Default, Clone)]
pub(crate) struct Coverage {
    /// Sorted, disjoint, non-adjacent half-open ranges.
    ranges: Vec<(u64, u64)>,
    covered: u64,
}

/// Inserting would split the message into more than [`MAX_GAPS`] ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooFragmented;

impl Coverage {
    /// Bytes covered by at least one placed range.
    pub(crate) fn covered(&self) -> u64 {
        self.covered
    }

    /// Whether [`insert`](Self::insert) of this range would succeed.
    pub(crate) fn admits(&self, start: u64, len: u64) -> bool {
        if len == 0 || self.ranges.len() < MAX_GAPS {
            return true;
        }
        let end = start.saturating_add(len);
        self.ranges.partition_point(|&(_, e)| e < start)
            < self.ranges.partition_point(|&(s, _)| s <= end)
    }

    /// Adds `[start, start + len)`. On error nothing changes.
    pub(crate) fn insert(&mut self, start: u64, len: u64) -> Result<(), TooFragmented> {
        if len == 0 {
            return Ok(());
        }
        let end = start.saturating_add(len);
        // Fast path: in order (or after everything placed so far).
        match self.ranges.last_mut() {
            None => {
                self.ranges.push((start, end));
                self.covered = len;
                return Ok(());
            }
            Some(last) if start >= last.1 => {
                if start == last.1 {
                    last.1 = end;
                } else if self.ranges.len() >= MAX_GAPS {
                    return Err(TooFragmented);
                } else {
                    self.ranges.push((start, end));
                }
                self.covered += len;
                return Ok(());
            }
            Some(_) => {}
        }
        // First range that touches or follows `start`, last range that touches `end`.
        let lo = self.ranges.partition_point(|&(_, e)| e < start);
        let hi = self.ranges.partition_point(|&(s, _)| s <= end);
        if lo == hi {
            // Touches nothing: a new range between two others.
            if self.ranges.len() >= MAX_GAPS {
                return Err(TooFragmented);
            }
            self.ranges.insert(lo, (start, end));
            self.covered += len;
            return Ok(());
        }
        let merged = (start.min(self.ranges[lo].0), end.max(self.ranges[hi - 1].1));
        let before: u64 = self.ranges[lo..hi].iter().map(|&(s, e)| e - s).sum();
        self.ranges.drain(lo + 1..hi);
        self.ranges[lo] = merged;
        self.covered = self.covered - before + (merged.1 - merged.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overlapping_pieces_do_not_add_up_to_a_whole() {
        let mut c = Coverage::default();
        c.insert(0, 100).unwrap();
        c.insert(50, 100).unwrap();
        c.insert(0, 150).unwrap();
        assert_eq!(c.covered(), 150);
        c.insert(300, 10).unwrap();
        assert_eq!(c.covered(), 160);
        c.insert(150, 150).unwrap();
        assert_eq!(c.covered(), 310);
        assert_eq!(c.ranges, vec![(0, 310)]);
    }

    #[test]
    fn fragmentation_is_capped_and_refusal_changes_nothing() {
        let mut c = Coverage::default();
        for i in 0..MAX_GAPS as u64 {
            c.insert(i * 2, 1).unwrap();
        }
        let before = c.clone();
        assert!(!c.admits(MAX_GAPS as u64 * 2 + 5, 1));
        assert!(c.admits(1, 1) && c.admits(MAX_GAPS as u64 * 2 - 1, 1));
        assert_eq!(c.insert(MAX_GAPS as u64 * 2 + 5, 1), Err(TooFragmented));
        assert_eq!(c.ranges, before.ranges);
        // Filling a hole still works at the cap (it merges ranges).
        c.insert(1, 1).unwrap();
        assert_eq!(c.covered(), MAX_GAPS as u64 + 1);
    }

    proptest! {
        #[test]
        fn matches_a_byte_map(pieces in proptest::collection::vec((0u64..512, 0u64..64), 0..64)) {
            let mut c = Coverage::default();
            let mut bytes = [false; 600];
            for (s, l) in pieces {
                c.insert(s, l).unwrap();
                for b in &mut bytes[s as usize..(s + l) as usize] {
                    *b = true;
                }
                prop_assert_eq!(c.covered(), bytes.iter().filter(|b| **b).count() as u64);
                for w in c.ranges.windows(2) {
                    prop_assert!(w[0].1 < w[1].0, "ranges sorted, disjoint, non-adjacent");
                }
            }
        }
    }
}
