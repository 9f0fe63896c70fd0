//! The FIFO bottleneck queue the two-host network ([`crate::sim`]) keeps per link: which
//! accepted packets are still being serialized, and how many bytes they hold. (The fabric
//! keeps each port's queue as the tail of its data lane.)
use std::collections::VecDeque;

/// Packets accepted by a FIFO, work-conserving bottleneck and not yet fully sent. The
/// caller computes each packet's departure (its own units of rate and rounding) and tells
/// the backlog; the backlog answers how much is queued at a time.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// `(done_ns, bytes)` of each queued packet, oldest first; `done_ns` never decreases.
    fifo: VecDeque<(u64, usize)>,
    /// Sum of the bytes in `fifo`.
    queued: usize,
}

impl Backlog {
    /// Forgets the packets fully sent by `now_ns`.
    pub(crate) fn drain(&mut self, now_ns: u64) {
        while let Some(&(done, len)) = self.fifo.front() {
            if done > now_ns {
                break;
            }
            self.fifo.pop_front();
            self.queued -= len;
        }
    }

    /// Bytes queued (as of the last [`Backlog::drain`]).
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    /// Records a packet of `bytes` whose last bit leaves at `done_ns`.
    pub(crate) fn push(&mut self, done_ns: u64, bytes: usize) {
        self.fifo.push_back((done_ns, bytes));
        self.queued += bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_in_order() {
        let mut b = Backlog::default();
        b.push(10, 100);
        b.push(20, 100);
        b.push(30, 100);
        assert_eq!(b.queued(), 300);
        b.drain(19);
        assert_eq!(b.queued(), 200);
        b.drain(30);
        assert_eq!(b.queued(), 0);
    }
}
