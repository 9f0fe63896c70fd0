//! Host stalls: telling a round trip the network took from one this host (or the peer's)
//! spent not running.
//!
//! On a loaded machine a progress thread is descheduled for milliseconds, sometimes hundreds of
//! them. Acknowledgements wait in the socket meanwhile, and when the engine catches up every
//! one of them measures the stall as if it were fabric delay: the smoothed RTT and the
//! retransmit timeout jump, a delay-based controller cuts its window to the floor and paces at
//! the stalled round trip, and the QP crawls long after the host is running again. Swift keeps
//! such endpoint delay out of its fabric signal with NIC timestamps; this engine has no
//! receive timestamp, so it finds stalls from what it does know:
//!
//! - **Its own.** The caller is told when to call next ([`Endpoint::poll_timeout`]); a call
//!   that comes more than [`STALL_MIN_NS`] after the earliest deadline means the engine was not
//!   serviced from that deadline until now ([`HostStall::note`]). A delay sample whose interval
//!   is at least a quarter that stall ([`HostStall::taints`]) is not a measurement of the
//!   network and is dropped (the acknowledgement itself still counts). The receiver side does
//!   the same for the peer: a packet accepted while catching up after such a stall is not
//!   echoed (the previous echo, whose receipt time is known, stays), so the holding time the
//!   ACK reports stays true.
//! - **The peer's**, when it has no timer to notice it by (a pure receiver): the requester's
//!   retransmit timer fires meanwhile. A sample of a packet that was outstanding for longer
//!   than a timeout that fired while it was (see `Recovery::rto_at`) spans that silence and is
//!   dropped too: a network does not hold a packet for a whole retransmit timeout and then
//!   deliver it; a stalled host does.
//!
//! [`Endpoint::poll_timeout`]: crate::Endpoint::poll_timeout
use braid_time::Timestamp;

/// A call this much later than the earliest deadline means the host stalled, ns. The
/// runtime's own slack (a timer armed by a post while the progress thread sleeps) stays under
/// it.
pub(crate) const STALL_MIN_NS: u64 = 1_000_000;

/// The latest stall of this host: from the deadline it missed to the call that came late.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HostStall {
    pub(crate) from: Timestamp,
    pub(crate) to: Timestamp,
}

impl HostStall {
    /// A call at `now` with `earliest` the earliest deadline the caller was given: records a
    /// stall if the call is more than [`STALL_MIN_NS`] late.
    pub(crate) fn note(&mut self, now: Timestamp, earliest: Option<Timestamp>) {
        if let Some(d) = earliest
            && now.nanos_since(d) > STALL_MIN_NS
        {
            *self = HostStall { from: d, to: now };
        }
    }

    /// Whether `now` is the call that found the stall (the catch-up right after it).
    pub(crate) fn catching_up(&self, now: Timestamp) -> bool {
        self.to == now && self.to > self.from
    }

    /// Whether a delay sample from `start_ns` to `now` is mostly this host's stall: the
    /// stall covers at least a quarter of it.
    pub(crate) fn taints(&self, start_ns: u64, now: Timestamp) -> bool {
        let lo = start_ns.max(self.from.as_nanos());
        let hi = now.as_nanos().min(self.to.as_nanos());
        let full = now.as_nanos().saturating_sub(start_ns);
        hi > lo && 4 * (hi - lo) >= full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn a_call_late_by_more_than_the_threshold_is_a_stall() {
        let mut s = HostStall::default();
        s.note(t(10).add_nanos(STALL_MIN_NS), Some(t(10)));
        assert_eq!(
            s,
            HostStall::default(),
            "exactly at the threshold is no stall"
        );
        s.note(t(12), Some(t(10)));
        assert_eq!(
            s,
            HostStall {
                from: t(10),
                to: t(12)
            }
        );
        assert!(s.catching_up(t(12)) && !s.catching_up(t(13)));
        // No deadline, or an early call: nothing changes.
        s.note(t(500), None);
        s.note(t(20), Some(t(30)));
        assert_eq!(
            s,
            HostStall {
                from: t(10),
                to: t(12)
            }
        );
    }

    #[test]
    fn a_sample_is_tainted_when_the_stall_is_a_quarter_of_it() {
        let s = HostStall {
            from: t(100),
            to: t(600),
        };
        // Sent just before the stall, handled at its end: all stall.
        assert!(s.taints(t(99).as_nanos(), t(600)));
        // Sent at 0 and handled 1.4 s after the stall: its 500 ms are a quarter of 2 s.
        assert!(s.taints(0, t(600).add_nanos(1_400_000_000)));
        assert!(!s.taints(0, t(600).add_nanos(1_500_000_000)));
        // Entirely after the stall, or before it: untouched.
        assert!(!s.taints(t(600).as_nanos(), t(601)));
        assert!(!s.taints(t(10).as_nanos(), t(90)));
    }
}
