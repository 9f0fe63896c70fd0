//! The QPs that may have something to send, served in round-robin order of the QP table.
//!
//! `Endpoint::poll_transmit` used to ask every QP in turn, so each datagram cost a visit to
//! every idle QP. Now a QP is marked here whenever something may have given it work: any
//! mutable access to it (a post, a received packet, a timer, a connect, an error) marks it
//! unless a look at its queues shows it surely has nothing to send (`Qp::may_transmit`: an
//! ACK that leaves the send queue empty), and `poll_transmit` asks only marked QPs. A QP
//! that has nothing to send, or is held by its window or pacer, is unmarked until the next
//! event concerning it (an ACK opens the window; the pacer's time is a deadline, so its timer
//! marks it again).
//!
//! The order is the table's, from a rotating cursor: the first marked QP at or after the
//! cursor is asked first, and the cursor moves past the QP that sent (or stays on it while it
//! is in the middle of a burst). That is exactly the
//! order in which asking every QP from the cursor would find a sender (an unmarked QP has
//! nothing to send), so the set changes the cost of `poll_transmit`, never its choices. The
//! search reads one 64-bit word per 64 QPs, so a call costs the QPs that had an event since
//! they last sent plus a word scan, not a visit per QP.

/// Marked QP slots (indices into the QP table) and the round-robin cursor.
#[derive(Debug, Default)]
pub(crate) struct ReadySet {
    /// Bit `i % 64` of word `i / 64`: slot `i` may have something to send.
    marks: Vec<u64>,
    /// Slots in the table.
    slots: usize,
    /// Marked slots.
    marked: usize,
    /// Where the next search starts (`< slots`, or 0).
    cursor: usize,
}

impl ReadySet {
    /// A new slot, at the end of the table, marked (a fresh QP has not been asked yet).
    pub(crate) fn add_slot(&mut self) {
        let i = self.slots;
        self.slots += 1;
        if self.marks.len() * 64 < self.slots {
            self.marks.push(0);
        }
        self.mark(i);
    }

    /// Forgets slot `i` and renumbers the slots after it, as the table does when a QP is
    /// removed (rare: linear in the table). The cursor keeps its index, as the table's
    /// round robin always did.
    pub(crate) fn remove_slot(&mut self, i: usize) {
        if i >= self.slots {
            return;
        }
        let was = (0..self.slots)
            .map(|j| self.is_marked(j))
            .collect::<Vec<_>>();
        self.marks.iter_mut().for_each(|w| *w = 0);
        self.marked = 0;
        self.slots -= 1;
        self.marks.truncate(self.slots.div_ceil(64));
        for (j, m) in was.into_iter().enumerate().filter(|&(j, _)| j != i) {
            if m {
                self.mark(if j > i { j - 1 } else { j });
            }
        }
        if self.cursor >= self.slots {
            self.cursor = 0;
        }
    }

    /// Whether no slot is marked.
    pub(crate) fn is_empty(&self) -> bool {
        self.marked == 0
    }

    /// Marks slot `i` (a no-op if it is marked already or does not exist).
    pub(crate) fn mark(&mut self, i: usize) {
        if i < self.slots && !self.is_marked(i) {
            self.marks[i / 64] |= 1 << (i % 64);
            self.marked += 1;
        }
    }

    /// Takes the first marked slot at or after the cursor (wrapping) and unmarks it.
    pub(crate) fn take_next(&mut self) -> Option<usize> {
        if self.marked == 0 {
            return None;
        }
        let i = self
            .first_marked_from(self.cursor)
            .or_else(|| self.first_marked_from(0))?;
        self.marks[i / 64] &= !(1 << (i % 64));
        self.marked -= 1;
        Some(i)
    }

    /// Slot `i` sent: it stays marked (it may have more) and the next search starts after it,
    /// or at it if it `keeps_turn` (in the middle of a burst, see `Endpoint::poll_transmit`).
    pub(crate) fn sent(&mut self, i: usize, keeps_turn: bool) {
        self.mark(i);
        self.cursor = if keeps_turn {
            i
        } else if i + 1 < self.slots {
            i + 1
        } else {
            0
        };
    }

    /// Whether slot `i` is marked (`false` past the last slot).
    pub(crate) fn is_marked(&self, i: usize) -> bool {
        self.marks
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn first_marked_from(&self, from: usize) -> Option<usize> {
        let mut w = from / 64;
        let mut bits = *self.marks.get(w)? & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *self.marks.get(w)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(r: &mut ReadySet) -> Vec<usize> {
        std::iter::from_fn(|| r.take_next()).collect()
    }

    #[test]
    fn marked_slots_come_in_table_order_from_the_cursor() {
        let mut r = ReadySet::default();
        for _ in 0..4 {
            r.add_slot();
        }
        assert_eq!(drain(&mut r), [0, 1, 2, 3]);
        r.mark(2);
        r.mark(0);
        r.mark(2);
        assert_eq!(r.marked, 2);
        assert_eq!(drain(&mut r), [0, 2]);
        // Slot 1 sent: the search starts after it and wraps.
        r.mark(0);
        r.mark(3);
        r.sent(1, false);
        assert_eq!(drain(&mut r), [3, 0, 1]);
    }

    #[test]
    fn a_slot_that_keeps_its_turn_is_asked_again_first() {
        let mut r = ReadySet::default();
        for _ in 0..3 {
            r.add_slot();
        }
        assert_eq!(r.take_next(), Some(0));
        r.sent(0, true);
        assert_eq!(r.take_next(), Some(0), "mid-burst: the same slot again");
        r.sent(0, false);
        assert_eq!(drain(&mut r), [1, 2, 0]);
    }

    #[test]
    fn removing_a_slot_renumbers_the_later_ones() {
        let mut r = ReadySet::default();
        for _ in 0..4 {
            r.add_slot();
        }
        r.remove_slot(1);
        assert_eq!(drain(&mut r), [0, 1, 2]);
        r.mark(2);
        r.mark(3); // no such slot any more
        assert_eq!(drain(&mut r), [2]);
    }

    #[test]
    fn the_search_crosses_words_and_wraps() {
        let mut r = ReadySet::default();
        for _ in 0..200 {
            r.add_slot();
        }
        drain(&mut r);
        for i in [3, 64, 130, 199] {
            r.mark(i);
        }
        r.sent(100, false); // marks 100, cursor 101
        assert_eq!(drain(&mut r), [130, 199, 3, 64, 100]);
    }

    /// Against the old rule: asking every slot from the cursor, the first one with work sends.
    #[test]
    fn the_choice_is_the_full_scan_s_choice() {
        let n = 150;
        let mut r = ReadySet::default();
        for _ in 0..n {
            r.add_slot();
        }
        drain(&mut r);
        let mut cursor = 0usize;
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut has_work = vec![false; n];
        for _ in 0..2000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state % n as u64) as usize;
            has_work[i] = state & 0x100 != 0;
            if has_work[i] {
                r.mark(i);
            }
            let old = (0..n).map(|k| (cursor + k) % n).find(|&j| has_work[j]);
            let new = loop {
                match r.take_next() {
                    Some(j) if has_work[j] => break Some(j),
                    Some(_) => continue,
                    None => break None,
                }
            };
            assert_eq!(new, old);
            if let Some(j) = old {
                cursor = (j + 1) % n;
                r.sent(j, false);
            }
        }
    }
}
