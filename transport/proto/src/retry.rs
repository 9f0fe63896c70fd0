//! The retry budget of a QP's requester: when does a run of retransmit timeouts mean the peer
//! is gone?
//!
//! Counting timeouts alone (as the first engine did: seven in a row, about 128 ms of backoff
//! from a 500 µs floor) mistakes a slow host for a dead peer: a progress thread that was
//! descheduled sees its own lateness as silence, full socket buffers drop ACKs, and a timeout
//! that fires while every outstanding packet is younger than the timeout itself resends
//! nothing yet still counted. The budget is a *time without any sign of life* from the peer
//! instead, as verbs' `timeout x retry_cnt` is:
//!
//! - every sign of life from the peer resets it ([`RetryBudget::heard`]): any consistent ACK
//!   (also one that acknowledges nothing new, as the answer to a probe that arrived as a
//!   duplicate does), any newly accepted response or request, an RNR NAK. A fatal NAK is not
//!   one: it fails the work request anyway, and a responder in error NAKs every probe;
//!   neither is a NAK that names no packet outstanding;
//! - a timeout adds the interval it was armed for (not the time that really passed), and only
//!   when it counts ([`Timeout::Counted`]): a timeout handled more than its own interval late
//!   ([`Timeout::Late`]) means this host stalled, not that the peer was silent, and a timeout
//!   whose probe had nothing old enough to resend ([`Timeout::Early`]) is not a lost round;
//! - the QP fails with `RetryExceeded` once the counted timeouts exceed
//!   `EndpointConfig::retry_limit` *and* their intervals add up to
//!   `EndpointConfig::retry_timeout_ns`.
//!
//! A dead peer still fails the QP: with the timeout capped at `rto_max_ns`, the counted
//! intervals reach the budget after about `retry_timeout_ns` of silence (plus whatever time
//! this host spent stalled).
use crate::types::EndpointConfig;

/// How one retransmit timeout is charged.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Timeout {
    /// Handled more than its armed interval after its deadline: this host stalled. It probes,
    /// but it does not count, back off, cut the window or re-path.
    Late,
    /// Every outstanding packet is younger than the timeout: nothing to probe, nothing
    /// charged.
    Early,
    /// A round without an answer: it counts against the peer.
    Counted,
}

impl Timeout {
    /// Classifies a timeout due at `deadline`, handled at `now_ns`, armed for `armed_ns`.
    /// `resends` says whether the probe found an old enough packet to send again, `waiting`
    /// whether a READ or atomic still awaits its response (which only the peer can send, so
    /// waiting for it is a lost round even with nothing to resend).
    pub(crate) fn classify(
        now_ns: u64,
        deadline_ns: u64,
        armed_ns: u64,
        resends: bool,
        waiting: bool,
    ) -> Timeout {
        if now_ns.saturating_sub(deadline_ns) > armed_ns {
            Timeout::Late
        } else if resends || waiting {
            Timeout::Counted
        } else {
            Timeout::Early
        }
    }
}

/// Counted timeouts and counted silence since the peer was last heard from.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct RetryBudget {
    /// Counted timeouts in a row.
    counted: u32,
    /// Sum of the armed intervals of those timeouts, ns.
    silent_ns: u64,
}

impl RetryBudget {
    /// A sign of life from the peer: the budget starts over.
    pub(crate) fn heard(&mut self) {
        *self = RetryBudget::default();
    }

    /// Charges a counted timeout armed for `armed_ns`. True when the budget is spent and the
    /// QP must fail.
    pub(crate) fn charge(&mut self, armed_ns: u64, cfg: &EndpointConfig) -> bool {
        self.counted = self.counted.saturating_add(1);
        self.silent_ns = self.silent_ns.saturating_add(armed_ns);
        self.counted > cfg.retry_limit && self.silent_ns >= cfg.retry_timeout_ns
    }
}

/// READs and atomics whose requests are all sent and whose responses have not all arrived:
/// kept as a count, so that re-arming the retransmit timer on every ACK needs no scan of the
/// send queue to learn whether the peer still owes an answer.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct AwaitedResponses {
    count: u32,
}

impl AwaitedResponses {
    /// A READ or atomic has sent its last request packet.
    pub(crate) fn started(&mut self) {
        self.count = self.count.saturating_add(1);
    }

    /// One of them got its whole response.
    pub(crate) fn answered(&mut self) {
        self.count = self.count.saturating_sub(1);
    }

    /// The send queue was flushed.
    pub(crate) fn clear(&mut self) {
        self.count = 0;
    }

    /// Whether any response is awaited.
    pub(crate) fn any(&self) -> bool {
        self.count > 0
    }

    /// How many are awaited (for the debug cross-check against a scan).
    pub(crate) fn count(&self) -> usize {
        self.count as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(limit: u32, timeout_ns: u64) -> EndpointConfig {
        EndpointConfig {
            retry_limit: limit,
            retry_timeout_ns: timeout_ns,
            ..EndpointConfig::default()
        }
    }

    #[test]
    fn both_the_count_and_the_time_must_be_spent() {
        let c = cfg(2, 10_000);
        let mut b = RetryBudget::default();
        // Three counted timeouts of 1 µs: the count is spent, the time is not.
        assert!(!b.charge(1_000, &c) && !b.charge(1_000, &c) && !b.charge(1_000, &c));
        // 7 µs more reaches 10 µs.
        assert!(!b.charge(6_000, &c));
        assert!(b.charge(1_000, &c));
        // A sign of life starts over.
        b.heard();
        assert!(!b.charge(20_000, &c) && !b.charge(20_000, &c));
        assert!(b.charge(20_000, &c));
    }

    #[test]
    fn late_and_early_timeouts_are_told_apart() {
        // Due at 100, armed for 50: handled at 151 is late, at 150 is not.
        assert_eq!(Timeout::classify(151, 100, 50, true, false), Timeout::Late);
        assert_eq!(
            Timeout::classify(150, 100, 50, true, false),
            Timeout::Counted
        );
        assert_eq!(
            Timeout::classify(100, 100, 50, false, false),
            Timeout::Early
        );
        assert_eq!(
            Timeout::classify(100, 100, 50, false, true),
            Timeout::Counted
        );
        // A late timeout stays late whatever it would resend.
        assert_eq!(
            Timeout::classify(1_000, 100, 50, false, true),
            Timeout::Late
        );
    }
}
