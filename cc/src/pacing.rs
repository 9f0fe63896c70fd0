//! Pacing arithmetic: from a rate to the earliest time the next packet may leave.

use braid_time::Timestamp;

/// Spaces packets at the rate a [`Controller`](crate::Controller) asks for.
///
/// The engine keeps one per connection. Before a transmission it checks
/// [`can_send`](Pacer::can_send) (and, when it cannot, reports
/// [`next_send_time`](Pacer::next_send_time) as a deadline from its `poll_timeout`); after it
/// calls [`on_sent`](Pacer::on_sent) with the controller's current
/// [`pacing_rate`](crate::Controller::pacing_rate). A packet of `len` bytes at rate `r` bytes/s
/// pushes the next send time `len * 1e9 / r` ns later. Time not used is not saved up: a
/// connection that sends late does not get to burst afterwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pacer {
    next_send: Timestamp,
}

impl Pacer {
    /// A pacer that lets the first packet leave at once.
    pub const fn new() -> Self {
        Pacer {
            next_send: Timestamp::ZERO,
        }
    }

    /// The earliest time the next packet may leave.
    pub const fn next_send_time(&self) -> Timestamp {
        self.next_send
    }

    /// Whether a packet may leave at `now`.
    pub fn can_send(&self, now: Timestamp) -> bool {
        now >= self.next_send
    }

    /// A packet of `bytes` left at `now` while the controller's pacing rate was
    /// `rate_bytes_per_s` (`None`: not pacing, the next packet may leave at once).
    pub fn on_sent(&mut self, now: Timestamp, bytes: u32, rate_bytes_per_s: Option<u64>) {
        self.next_send = match rate_bytes_per_s {
            None => now,
            Some(rate) => {
                let gap_ns = (u128::from(bytes) * 1_000_000_000).div_ceil(u128::from(rate.max(1)));
                let gap_ns = u64::try_from(gap_ns).unwrap_or(u64::MAX);
                now.max(self.next_send).add_nanos(gap_ns)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_spaces_packets_at_the_rate() {
        let mut p = Pacer::new();
        let t0 = Timestamp::from_micros(100);
        assert!(p.can_send(t0));
        // 1000 bytes at 10 MB/s: 100 µs apart.
        p.on_sent(t0, 1000, Some(10_000_000));
        assert_eq!(p.next_send_time(), Timestamp::from_micros(200));
        assert!(!p.can_send(Timestamp::from_micros(199)));
        assert!(p.can_send(Timestamp::from_micros(200)));
        // Sending late does not bank credit.
        p.on_sent(Timestamp::from_micros(500), 1000, Some(10_000_000));
        assert_eq!(p.next_send_time(), Timestamp::from_micros(600));
        // No pacing: the next packet may leave at once.
        p.on_sent(Timestamp::from_micros(600), 1000, None);
        assert!(p.can_send(Timestamp::from_micros(600)));
    }
}
