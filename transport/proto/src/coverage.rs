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

/// The most separate ranges one QP tracks at once, over all its messages (its posted RECVs
/// and its READs awaiting responses). Without it, a peer could fragment every one of up to
/// [`MAX_RECV_WR`](crate::types::MAX_RECV_WR) RECVs into `MAX_GAPS` ranges, about a GiB of
/// tracking per QP. An honest peer stays far below: every packet it has outstanding lies
/// within the receive tracker's window of [`WINDOW`](crate::tracker::WINDOW) PSNs past the
/// cumulative point, so at most that many holes are open, and at most that many messages are
/// partly placed or placed but waiting for an earlier one. A packet that would open a range
/// past the budget is dropped before it writes anything (counted as a bad packet, never
/// acknowledged); filling or extending a range is always admitted, so the budget never stops
/// a message that is being completed.
pub const MAX_TRACKED_RANGES: usize = 4 * crate::tracker::WINDOW as usize;

/// The ranges one QP tracks, against [`MAX_TRACKED_RANGES`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RangeBudget {
    used: usize,
}

impl RangeBudget {
    /// Places `[start, start + len)` into `cov` if both the message's cap and this QP's budget
    /// admit it. On error nothing changes.
    pub(crate) fn insert(
        &mut self,
        cov: &mut Coverage,
        start: u64,
        len: u64,
    ) -> Result<(), TooFragmented> {
        if !self.admits(cov, start, len) {
            return Err(TooFragmented);
        }
        let before = cov.ranges.len();
        cov.insert(start, len)?;
        self.used = (self.used + cov.ranges.len()).saturating_sub(before);
        Ok(())
    }

    /// Whether [`insert`](Self::insert) would succeed.
    pub(crate) fn admits(&self, cov: &Coverage, start: u64, len: u64) -> bool {
        cov.admits(start, len) && (self.used < MAX_TRACKED_RANGES || !cov.opens(start, len))
    }

    /// A message's tracking is dropped (it completed or was flushed).
    pub(crate) fn release(&mut self, cov: &Coverage) {
        self.used = self.used.saturating_sub(cov.ranges.len());
    }

    /// Every message's tracking is dropped (the QP went to error).
    pub(crate) fn clear(&mut self) {
        self.used = 0;
    }

    /// Ranges tracked now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

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

/// Ranges a message's tracking has room for from its posting on: in-order arrival needs one,
/// so placing its packets allocates nothing (the room is allocated when the work request is
/// posted, beside its gather list).
pub(crate) const PREALLOCATED_RANGES: usize = 2;

impl Coverage {
    /// Empty, with room for [`PREALLOCATED_RANGES`] ranges.
    pub(crate) fn with_room() -> Coverage {
        Coverage {
            ranges: Vec::with_capacity(PREALLOCATED_RANGES),
            covered: 0,
        }
    }

    /// Bytes covered by at least one placed range.
    pub(crate) fn covered(&self) -> u64 {
        self.covered
    }

    /// Whether inserting this range would add a separate range (it touches none placed).
    pub(crate) fn opens(&self, start: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let end = start.saturating_add(len);
        self.ranges.partition_point(|&(_, e)| e < start)
            == self.ranges.partition_point(|&(s, _)| s <= end)
    }

    /// Separate ranges placed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether any byte of `[start, start + len)` is placed.
    pub(crate) fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        len > 0 && self.ranges.get(i).is_some_and(|&(s, _)| s < end)
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
    fn overlaps_tells_whether_any_byte_is_placed() {
        let mut c = Coverage::default();
        assert!(!c.overlaps(0, 100));
        c.insert(100, 50).unwrap();
        c.insert(300, 10).unwrap();
        assert!(!c.overlaps(0, 100), "ends where the first range starts");
        assert!(c.overlaps(0, 101));
        assert!(c.overlaps(120, 5));
        assert!(c.overlaps(149, 100));
        assert!(!c.overlaps(150, 150), "between the two");
        assert!(c.overlaps(150, 151));
        assert!(!c.overlaps(310, 1000));
        assert!(!c.overlaps(120, 0), "an empty range overlaps nothing");
    }

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

    #[test]
    fn the_qp_budget_refuses_new_ranges_but_admits_merges() {
        let mut budget = RangeBudget::default();
        let mut msgs = vec![Coverage::default(); MAX_TRACKED_RANGES / 16 + 1];
        // Sixteen ranges in each message until the budget is spent.
        for (m, c) in msgs.iter_mut().enumerate().take(MAX_TRACKED_RANGES / 16) {
            for i in 0..16 {
                budget.insert(c, i * 10, 1).unwrap();
            }
            assert_eq!(budget.used(), (m + 1) * 16);
        }
        assert_eq!(budget.used(), MAX_TRACKED_RANGES);
        // A fresh message cannot open a range, though its own cap is far away.
        let last = msgs.len() - 1;
        assert!(msgs[last].admits(0, 1));
        assert_eq!(budget.insert(&mut msgs[last], 0, 1), Err(TooFragmented));
        assert_eq!(msgs[last].len(), 0);
        // Extending or merging is still admitted, and merging gives budget back.
        budget.insert(&mut msgs[0], 1, 1).unwrap();
        assert_eq!(budget.used(), MAX_TRACKED_RANGES);
        budget.insert(&mut msgs[0], 0, 200).unwrap();
        assert_eq!(budget.used(), MAX_TRACKED_RANGES - 15);
        budget.insert(&mut msgs[last], 0, 1).unwrap();
        // Releasing a message gives its ranges back.
        budget.release(&msgs[1]);
        assert_eq!(budget.used(), MAX_TRACKED_RANGES - 30);
    }

    proptest! {
        /// `opens` says exactly when an insert adds a range.
        #[test]
        fn opens_predicts_a_new_range(pieces in proptest::collection::vec((0u64..512, 0u64..64), 0..64)) {
            let mut c = Coverage::default();
            for (s, l) in pieces {
                let (before, opens) = (c.len(), c.opens(s, l));
                c.insert(s, l).unwrap();
                prop_assert_eq!(opens, c.len() > before);
                prop_assert!(opens || c.len() <= before);
            }
        }

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
