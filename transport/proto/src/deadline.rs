//! The timers of an endpoint's QPs: each QP's next deadline (cached beside the QP table's
//! slots) and a min-heap of `(deadline, slot)` over them, so the earliest is read in O(1),
//! a change costs O(log n), and `handle_timeout` visits only the QPs that are due.
//!
//! The heap is lazily invalidated: a slot whose deadline moves gets a new entry and its old
//! one stays behind, recognised as stale (it no longer matches the slot's deadline) and
//! dropped when it reaches the top. The top is kept valid after every change, so reading the
//! earliest deadline needs no `&mut`. Stale entries are bounded: when the heap holds more
//! than twice the slots (plus a constant), it is rebuilt from the slots, which amortises to
//! O(1) per change.
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use braid_time::Timestamp;

/// Heap entries allowed beyond twice the slot count before a rebuild.
const SLACK: usize = 32;

/// Per-slot deadlines and the heap that orders them (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    /// The deadline of each slot. Invariant: every `Some(t)` at slot `i` has an entry
    /// `(t, i)` in `heap`.
    at: Vec<Option<Timestamp>>,
    heap: BinaryHeap<Reverse<(Timestamp, usize)>>,
}

impl Deadlines {
    /// Every slot's cached deadline, in slot order.
    pub(crate) fn slots(&self) -> &[Option<Timestamp>] {
        &self.at
    }

    /// Adds a slot at the end with deadline `d`.
    pub(crate) fn push_slot(&mut self, d: Option<Timestamp>) {
        self.at.push(None);
        let i = self.at.len() - 1;
        self.set(i, d);
    }

    /// Removes slot `i`; later slots move down by one (rare: the heap is rebuilt).
    pub(crate) fn remove_slot(&mut self, i: usize) {
        self.at.remove(i);
        self.rebuild();
    }

    /// Slot `i`'s deadline is now `new`.
    pub(crate) fn set(&mut self, i: usize, new: Option<Timestamp>) {
        let old = core::mem::replace(&mut self.at[i], new);
        if old == new {
            return;
        }
        if let Some(t) = new {
            self.heap.push(Reverse((t, i)));
        }
        if self.heap.len() > 2 * self.at.len() + SLACK {
            self.rebuild();
        } else {
            self.clean_top();
        }
    }

    /// The earliest deadline of any slot.
    pub(crate) fn earliest(&self) -> Option<Timestamp> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// The slots due at `now` (deadline at or before it), in ascending slot order, each
    /// once, into `out` (cleared first). Their cached deadlines become `None`: the caller
    /// runs their timers and then sets each slot's new deadline.
    pub(crate) fn take_due(&mut self, now: Timestamp, out: &mut Vec<usize>) {
        out.clear();
        while let Some(&Reverse((t, i))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            if self.at[i] == Some(t) {
                self.at[i] = None;
                out.push(i);
            }
        }
        out.sort_unstable();
        self.clean_top();
    }

    /// Drops stale entries from the top, so that [`earliest`](Self::earliest) is exact.
    fn clean_top(&mut self) {
        while let Some(&Reverse((t, i))) = self.heap.peek() {
            if self.at.get(i) == Some(&Some(t)) {
                break;
            }
            self.heap.pop();
        }
    }

    /// The heap again from the slots alone (no stale entries), in its own buffer: a rebuild
    /// on the data path allocates nothing.
    fn rebuild(&mut self) {
        let mut entries = core::mem::take(&mut self.heap).into_vec();
        entries.clear();
        entries.extend(
            self.at
                .iter()
                .enumerate()
                .filter_map(|(i, d)| d.map(|t| Reverse((t, i)))),
        );
        self.heap = BinaryHeap::from(entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Set(usize, Option<u64>),
        Push(Option<u64>),
        Remove(usize),
        TakeDue(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        let d = proptest::option::of(0u64..40);
        prop_oneof![
            6 => (0usize..8, d.clone()).prop_map(|(i, d)| Step::Set(i, d)),
            1 => d.prop_map(Step::Push),
            1 => (0usize..8).prop_map(Step::Remove),
            2 => (0u64..40).prop_map(Step::TakeDue),
        ]
    }

    proptest! {
        /// Against a plain vector of deadlines: the earliest is its minimum, the due slots
        /// are exactly those at or before `now`, in slot order, and the heap stays bounded.
        #[test]
        fn heap_matches_a_scan(steps in proptest::collection::vec(step(), 0..200)) {
            let mut d = Deadlines::default();
            let mut model: Vec<Option<Timestamp>> = Vec::new();
            let mut due = Vec::new();
            for s in steps {
                match s {
                    Step::Set(i, t) if i < model.len() => {
                        let t = t.map(Timestamp::from_nanos);
                        d.set(i, t);
                        model[i] = t;
                    }
                    Step::Set(..) => {}
                    Step::Push(t) => {
                        let t = t.map(Timestamp::from_nanos);
                        d.push_slot(t);
                        model.push(t);
                    }
                    Step::Remove(i) if i < model.len() => {
                        d.remove_slot(i);
                        model.remove(i);
                    }
                    Step::Remove(_) => {}
                    Step::TakeDue(now) => {
                        let now = Timestamp::from_nanos(now);
                        d.take_due(now, &mut due);
                        let want: Vec<usize> = (0..model.len())
                            .filter(|&i| model[i].is_some_and(|t| t <= now))
                            .collect();
                        prop_assert_eq!(&due, &want);
                        for &i in &want {
                            model[i] = None;
                        }
                    }
                }
                prop_assert_eq!(d.slots(), &model[..]);
                prop_assert_eq!(d.earliest(), model.iter().flatten().min().copied());
                prop_assert!(d.heap.len() <= 2 * model.len() + SLACK + 1);
            }
        }
    }

    #[test]
    fn a_deadline_moved_back_and_forth_is_due_once() {
        let mut d = Deadlines::default();
        d.push_slot(Some(Timestamp::from_nanos(5)));
        d.set(0, Some(Timestamp::from_nanos(9)));
        d.set(0, Some(Timestamp::from_nanos(5)));
        let mut due = Vec::new();
        d.take_due(Timestamp::from_nanos(10), &mut due);
        assert_eq!(due, vec![0]);
        assert_eq!(d.earliest(), None);
        d.take_due(Timestamp::from_nanos(10), &mut due);
        assert!(due.is_empty());
    }
}
