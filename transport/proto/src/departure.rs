//! When a datagram really left this host, as opposed to when the engine wrote it.
//!
//! The engine stamps a packet with the time it builds it; the datapath sends it a batch later,
//! and the send itself can take long: on a veth pair the kernel delivers each datagram to the
//! receiving socket inside the sender's `sendmmsg`, so the last datagram of a 44-datagram batch
//! leaves after the receive path has run 43 times (tens of µs on a fast host, milliseconds in
//! an emulated guest). That wait is this host's transmit processing, not the network: Swift
//! measures its fabric delay from the NIC's transmit timestamp and keeps such endpoint delay
//! apart. Counting it as fabric delay reads host speed as congestion, and on a slow host
//! drives a delay-based window to its floor with no queue anywhere in the network.
//!
//! So transmits are numbered in batches. The runtime ends a batch before it hands it to the
//! datapath ([`Endpoint::end_tx_batch`]) and says when the send returned
//! ([`Endpoint::departed`]); an acknowledgement's fabric delay then starts at that return for
//! packets of a batch whose departure is known, and at the build time otherwise (a simulated
//! network, a runtime that does not say, a batch so old its entry was reused). The departure
//! of a batch is a bound: its first datagrams left earlier, so the fabric delay of those is
//! under-counted by at most the send's own duration, never over-counted by it. On a NIC
//! the send returns once the datagrams are queued to the device: its queue and the wire stay
//! in the fabric delay.
//!
//! Only the congestion controller takes the delay from the departure. Path scoring, which
//! compares paths with one another, keeps the delay from the write: the host's sending time
//! is common to every path, and one departure for a whole batch makes the packets early in
//! it look faster than the rest by up to the send's duration, whichever path they took. That
//! noise moved the path weights on the AF_XDP testbed (its path-weight test failed 2 of 10
//! runs with scoring from the departure, 0 of 15 with scoring from the write).
//!
//! [`Endpoint::end_tx_batch`]: crate::Endpoint::end_tx_batch
//! [`Endpoint::departed`]: crate::Endpoint::departed
use braid_time::Timestamp;

/// Batches whose departure is remembered: enough for every batch of a round trip at the
/// batch rates a runtime reaches (one per flush, a few µs each), 4 KiB in all.
const REMEMBERED: usize = 256;

/// The transmit batch being filled and the departures of the latest ones.
pub(crate) struct Departures {
    /// The batch new transmits belong to.
    current: u32,
    /// `(batch, departure)` at `batch % REMEMBERED`; an entry for another batch is stale.
    at: Box<[(u32, Timestamp); REMEMBERED]>,
}

impl Default for Departures {
    fn default() -> Self {
        Departures {
            current: 0,
            at: Box::new([(u32::MAX, Timestamp::ZERO); REMEMBERED]),
        }
    }
}

impl Departures {
    /// The batch a transmit built now belongs to.
    pub(crate) fn current(&self) -> u32 {
        self.current
    }

    /// Closes the current batch; returns its number.
    pub(crate) fn end_batch(&mut self) -> u32 {
        let b = self.current;
        self.current = self.current.wrapping_add(1);
        b
    }

    /// Batch `batch` finished leaving at `at`. A batch not yet closed, or one too old to be
    /// remembered, is ignored.
    pub(crate) fn departed(&mut self, batch: u32, at: Timestamp) {
        let age = self.current.wrapping_sub(batch);
        if age == 0 || age as usize > REMEMBERED {
            return;
        }
        self.at[batch as usize % REMEMBERED] = (batch, at);
    }

    /// When a packet of `batch`, built at `built`, left: the batch's departure if known and
    /// not before `built`, else `built`.
    pub(crate) fn left(&self, batch: u32, built: Timestamp) -> Timestamp {
        match self.at[batch as usize % REMEMBERED] {
            (b, at) if b == batch && at >= built => at,
            _ => built,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_departure_counts_only_for_its_own_closed_batch() {
        let mut d = Departures::default();
        let t = Timestamp::from_micros;
        let b0 = d.current();
        // Not closed yet: the departure is ignored.
        d.departed(b0, t(5));
        assert_eq!(d.left(b0, t(1)), t(1));
        assert_eq!(d.end_batch(), b0);
        d.departed(b0, t(5));
        assert_eq!(d.left(b0, t(1)), t(5));
        // Never before the build time (a clock read before it, a caller's mistake).
        assert_eq!(d.left(b0, t(6)), t(6));
        // A batch whose slot was reused by a later one is unknown again.
        for _ in 0..REMEMBERED {
            let b = d.end_batch();
            d.departed(b, t(9));
        }
        assert_eq!(d.left(b0, t(1)), t(1));
        // Too old to remember: ignored, not written over a newer batch's slot.
        let newest = d.current().wrapping_sub(1);
        d.departed(newest.wrapping_sub(REMEMBERED as u32), t(100));
        assert_eq!(d.left(newest.wrapping_sub(REMEMBERED as u32), t(1)), t(1));
        assert_eq!(
            d.left(newest.wrapping_sub(REMEMBERED as u32 - 1), t(1)),
            t(9)
        );
    }
}
