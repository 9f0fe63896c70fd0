//! The pending-event queue every topology keeps: a min-heap on `(time, sequence)`.
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Events ordered by time (ns) and, at one time, by the sequence number they were queued
/// with: [`EventQueue::pop_due`] hands out the earliest first, ties in queueing order, which
/// is what makes a simulated run replay exactly.
#[derive(Debug)]
pub struct EventQueue<T> {
    heap: BinaryHeap<Event<T>>,
    next_seq: u64,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }
}

impl<T> EventQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next sequence number, for an event queued later with
    /// [`EventQueue::push_seq`] (a topology that keeps one heap entry per FIFO lane gives
    /// the entry the sequence number of the lane's head).
    pub fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        seq
    }

    /// Queues `item` at `at_ns` with a fresh sequence number.
    pub fn push(&mut self, at_ns: u64, item: T) {
        let seq = self.take_seq();
        self.push_seq(at_ns, seq, item);
    }

    /// Queues `item` at `at_ns` with sequence number `seq` from [`EventQueue::take_seq`].
    pub fn push_seq(&mut self, at_ns: u64, seq: u64, item: T) {
        self.heap.push(Event::new(at_ns, seq, item));
    }

    /// When the earliest event happens, ns.
    pub fn peek_at(&self) -> Option<u64> {
        self.heap.peek().map(Event::at)
    }

    /// The earliest event, `(time ns, item)`, if it happens at or before `now_ns`.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<(u64, T)> {
        if self.heap.peek()?.at() > now_ns {
            return None;
        }
        self.heap.pop().map(|e| (e.at(), e.item))
    }

    /// The earliest event, `(time ns, &item)`, if it happens at or before `now_ns`; it stays
    /// queued.
    pub fn peek_due(&self, now_ns: u64) -> Option<(u64, &T)> {
        let e = self.heap.peek()?;
        (e.at() <= now_ns).then_some((e.at(), &e.item))
    }

    /// Takes the earliest event, `(time ns, item)`, and queues `item` at `at_ns` with
    /// sequence number `seq` in its place: [`pop_due`](Self::pop_due) then
    /// [`push_seq`](Self::push_seq) in one sift of the heap (a FIFO lane whose head left
    /// queues its next packet). `None`, and nothing queued, when the queue is empty.
    pub fn replace_first(&mut self, at_ns: u64, seq: u64, item: T) -> Option<(u64, T)> {
        let mut top = self.heap.peek_mut()?;
        let old = std::mem::replace(&mut *top, Event::new(at_ns, seq, item));
        Some((old.at(), old.item))
    }

    /// Events queued.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is queued.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// Ordered so that `BinaryHeap` (a max-heap) pops the earliest `(at, seq)` first. The pair
/// is kept as one integer, time above sequence, so that each comparison of a sift is one
/// integer comparison rather than a tuple's two.
#[derive(Debug)]
struct Event<T> {
    key: u128,
    item: T,
}

impl<T> Event<T> {
    fn new(at: u64, seq: u64, item: T) -> Self {
        Event {
            key: u128::from(at) << 64 | u128::from(seq),
            item,
        }
    }

    fn at(&self) -> u64 {
        (self.key >> 64) as u64
    }
}

impl<T> PartialEq for Event<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl<T> Eq for Event<T> {}

impl<T> PartialOrd for Event<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Event<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.key.cmp(&self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_ties_in_queueing_order() {
        let mut q = EventQueue::new();
        q.push(20, 'c');
        q.push(10, 'a');
        q.push(20, 'd');
        q.push(10, 'b');
        assert_eq!(q.peek_at(), Some(10));
        assert_eq!(q.pop_due(9), None);
        let got: Vec<_> = std::iter::from_fn(|| q.pop_due(u64::MAX)).collect();
        assert_eq!(got, vec![(10, 'a'), (10, 'b'), (20, 'c'), (20, 'd')]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_taken_sequence_number_keeps_its_place() {
        let mut q = EventQueue::new();
        let early = q.take_seq();
        q.push(5, "later");
        q.push_seq(5, early, "first");
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_due(5), Some((5, "first")));
        assert_eq!(q.pop_due(5), Some((5, "later")));
    }

    #[test]
    fn replacing_the_first_event_keeps_the_order() {
        let mut q = EventQueue::new();
        assert_eq!(q.replace_first(1, 0, 'z'), None);
        assert!(q.is_empty());
        let s = q.take_seq();
        q.push(10, 'a');
        q.push(30, 'c');
        assert_eq!(q.peek_due(9), None);
        assert_eq!(q.peek_due(10), Some((10, &'a')));
        // 'b' goes in at 30 with an older sequence number than 'c': it comes out first.
        assert_eq!(q.replace_first(30, s, 'b'), Some((10, 'a')));
        let got: Vec<_> = std::iter::from_fn(|| q.pop_due(u64::MAX)).collect();
        assert_eq!(got, vec![(30, 'b'), (30, 'c')]);
    }
}
