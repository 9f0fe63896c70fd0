//! Repeating the responder's last NAK, so that losing it costs about a round trip, not a
//! retransmit timeout.
//!
//! A refused packet is not accepted, so nothing acknowledges it: when its NAK is lost and the
//! packet was the last the requester sent (a one-packet WRITE with a bad key, a SEND that
//! found no RECV), the requester hears nothing until its retransmit timeout fires, cuts the
//! window and re-paths, all for a packet that was delivered. So the responder sends its most
//! recent NAK again on a short timer while the condition lasts: [`NAK_REPEATS`] times, the
//! first after about a round trip ([`NakRepeat::interval_ns`]), doubling after that, and no
//! more once the refused PSN has been accepted (an RNR'd SEND whose RECV was posted since).
//! A repeat the requester did not need is harmless: it already knows the refusal, so a
//! repeated fatal NAK changes no status, and a repeated RNR NAK arriving while the packet is
//! held for the RNR timer adds no retry.
//!
//! A NAK that names a message rather than a refused packet (the revocation NAK of a READ whose
//! region was deregistered, sent by a QP that has stopped) is repeated [`NAK_REPEATS`] times
//! whatever the packet tracker says: nothing the QP accepts later can settle it.
use braid_time::Timestamp;

use crate::wire::Nak;

/// Times the last NAK is sent again after the first.
pub(crate) const NAK_REPEATS: u32 = 3;
/// Wait before the first repeat when this side has no RTT sample (a pure responder sends
/// nothing that is acknowledged), ns: a software stack's round trip on a LAN, well under the
/// requester's retransmit timeout floor.
const NAK_REPEAT_NO_RTT_NS: u64 = 50_000;
/// Shortest wait before a repeat, ns.
const NAK_REPEAT_MIN_NS: u64 = 10_000;

/// The last NAK sent and when to send it again.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct NakRepeat {
    armed: Option<Armed>,
}

#[derive(Copy, Clone, Debug)]
struct Armed {
    nak: Nak,
    until: Until,
    due: Timestamp,
    wait_ns: u64,
    left: u32,
}

/// When a NAK stops being repeated, besides running out of repeats.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Until {
    /// Once the refused packet (the NAK's PSN) has been accepted.
    Accepted,
    /// Only after [`NAK_REPEATS`] repeats: the NAK refuses a message, not a packet.
    Repeated,
}

impl NakRepeat {
    /// The wait before the first repeat, from this side's RTT estimate if it has one.
    pub(crate) fn interval_ns(srtt_ns: u64, rttvar_ns: u64, samples: u64) -> u64 {
        if samples == 0 {
            NAK_REPEAT_NO_RTT_NS
        } else {
            (srtt_ns + 4 * rttvar_ns).max(NAK_REPEAT_MIN_NS)
        }
    }

    /// `nak` was sent at `now`: repeat it from `now + wait_ns` on, until `until`.
    pub(crate) fn sent(&mut self, nak: Nak, until: Until, now: Timestamp, wait_ns: u64) {
        self.armed = Some(Armed {
            nak,
            until,
            due: now.add_nanos(wait_ns),
            wait_ns,
            left: NAK_REPEATS,
        });
    }

    /// When a repeat is due, if one is armed.
    pub(crate) fn deadline(&self) -> Option<Timestamp> {
        self.armed.map(|a| a.due)
    }

    /// The NAK to send again now, if one is due and (for [`Until::Accepted`])
    /// `still_refused(psn)` says the refused packet has not been accepted since. Arms the next repeat (twice the wait) or disarms.
    pub(crate) fn take_due(
        &mut self,
        now: Timestamp,
        still_refused: impl FnOnce(u32) -> bool,
    ) -> Option<Nak> {
        let a = self.armed.as_mut()?;
        if a.due > now {
            return None;
        }
        let settled = a.until == Until::Accepted && !still_refused(a.nak.psn);
        if settled || a.left == 0 {
            self.armed = None;
            return None;
        }
        let nak = a.nak;
        a.left -= 1;
        a.wait_ns = a.wait_ns.saturating_mul(2);
        a.due = now.add_nanos(a.wait_ns);
        if a.left == 0 {
            self.armed = None;
        }
        Some(nak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Syndrome;

    const NAK: Nak = Nak {
        psn: 7,
        msn: 1,
        syndrome: Syndrome::RemoteAccess,
    };

    #[test]
    fn repeats_a_bounded_number_of_times_with_doubling_waits() {
        let mut r = NakRepeat::default();
        r.sent(NAK, Until::Accepted, Timestamp::from_nanos(1_000), 100);
        assert_eq!(r.deadline(), Some(Timestamp::from_nanos(1_100)));
        assert_eq!(r.take_due(Timestamp::from_nanos(1_099), |_| true), None);
        let mut at = 1_100;
        let mut sent = Vec::new();
        while let Some(due) = r.deadline() {
            assert_eq!(due, Timestamp::from_nanos(at));
            sent.push(r.take_due(due, |_| true).expect("due"));
            at += 100 << sent.len();
        }
        assert_eq!(sent, vec![NAK; NAK_REPEATS as usize]);
    }

    #[test]
    fn stops_once_the_packet_is_accepted() {
        let mut r = NakRepeat::default();
        r.sent(NAK, Until::Accepted, Timestamp::ZERO, 100);
        assert_eq!(r.take_due(Timestamp::from_nanos(100), |psn| psn != 7), None);
        assert_eq!(r.deadline(), None);
    }

    #[test]
    fn a_message_refusal_repeats_whatever_the_tracker_says() {
        let mut r = NakRepeat::default();
        r.sent(NAK, Until::Repeated, Timestamp::ZERO, 100);
        let mut sent = 0;
        while let Some(due) = r.deadline() {
            assert_eq!(r.take_due(due, |_| false), Some(NAK));
            sent += 1;
        }
        assert_eq!(sent, NAK_REPEATS);
    }
}
