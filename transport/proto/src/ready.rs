//! The QPs that may have something to send, in round-robin order.
//!
//! `Endpoint::poll_transmit` used to ask every QP in turn, so each datagram cost a visit to
//! every idle QP. Now a QP is queued here whenever something may have given it work: any
//! mutable access to it (a post, a received packet, a timer, a connect, an error) queues it
//! once, and `poll_transmit` asks only queued QPs, from the front. A QP that sends goes to
//! the back (round robin between the QPs that have work); one that has nothing to send, or is
//! held by its window or pacer, leaves the queue until the next event concerning it (an ACK
//! opens the window; the pacer's time is a deadline, so its timer queues it again). So a
//! call's work is the QPs that had an event since they last sent, not the number of QPs.
use std::collections::VecDeque;

/// A FIFO of QP slots (indices into the QP table), each queued at most once.
#[derive(Debug, Default)]
pub(crate) struct ReadySet {
    queue: VecDeque<usize>,
    queued: Vec<bool>,
}

impl ReadySet {
    /// A new slot, at the end of the table, queued (a fresh QP has not been asked yet).
    pub(crate) fn add_slot(&mut self) {
        let i = self.queued.len();
        self.queued.push(false);
        self.push(i);
    }

    /// Forgets slot `i` and renumbers the slots after it, as the table does when a QP is
    /// removed (rare: linear in the table).
    pub(crate) fn remove_slot(&mut self, i: usize) {
        if i >= self.queued.len() {
            return;
        }
        self.queued.remove(i);
        self.queue.retain(|&j| j != i);
        for j in &mut self.queue {
            if *j > i {
                *j -= 1;
            }
        }
    }

    /// Queues slot `i` at the back unless it is queued already.
    pub(crate) fn push(&mut self, i: usize) {
        if let Some(q) = self.queued.get_mut(i)
            && !*q
        {
            *q = true;
            self.queue.push_back(i);
        }
    }

    /// Takes the slot at the front.
    pub(crate) fn pop(&mut self) -> Option<usize> {
        let i = self.queue.pop_front()?;
        if let Some(q) = self.queued.get_mut(i) {
            *q = false;
        }
        Some(i)
    }

    /// Slots queued.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slot_is_queued_once_in_arrival_order() {
        let mut r = ReadySet::default();
        for _ in 0..4 {
            r.add_slot();
        }
        assert_eq!(
            (0..4).map(|_| r.pop()).collect::<Vec<_>>(),
            [0, 1, 2, 3].map(Some)
        );
        r.push(2);
        r.push(0);
        r.push(2);
        assert_eq!(r.len(), 2);
        assert_eq!((r.pop(), r.pop(), r.pop()), (Some(2), Some(0), None));
    }

    #[test]
    fn removing_a_slot_renumbers_the_later_ones() {
        let mut r = ReadySet::default();
        for _ in 0..4 {
            r.add_slot();
        }
        r.remove_slot(1);
        assert_eq!(
            (0..4).map(|_| r.pop()).collect::<Vec<_>>(),
            [Some(0), Some(1), Some(2), None]
        );
        r.push(2);
        r.push(3); // no such slot any more
        assert_eq!((r.pop(), r.pop()), (Some(2), None));
    }
}
