//! RC order at the responder: where a fatal refusal stops a QP, and when a receive may
//! complete.
//!
//! Packets are placed in whatever order they arrive, straight into memory; what is ordered is
//! what the application sees:
//!
//! - **The fence of a fatal refusal.** When the responder refuses a request for good (bad
//!   key, bounds or rights, an invalid request), it stops at that packet's PSN, as verbs RC
//!   does: no packet at or after it executes any more (each is answered with the same NAK),
//!   while packets before it, still on slower paths, are executed as usual. Once every packet
//!   before the fence has arrived, its outstanding receives complete as flushed, and once the
//!   responses to the requests before it (READ data, atomic results) are delivered, the QP
//!   goes to the error state. The requester fails once every packet before the refused one is
//!   acknowledged, so both sides agree on what executed. The packets before the fence are
//!   waited for only within the retry budget (`EndpointConfig::retry_timeout_ns`, from the last
//!   request packet that came): a peer that died or lies fails the QP then, and a packet from
//!   before the fence that comes later finds a failed QP (a remote operation error). An
//!   application that fails a requester whose refusal has not settled gets that request
//!   flushed, not refused, since its peer never failed the receive the refusal stood for.
//! - **Ordered receive completions.** By default a receive (consumed by SEND, SEND with
//!   immediate or WRITE with immediate) completes only when its own bytes are all placed *and*
//!   every packet the peer sent before its last one has arrived, so every earlier request of
//!   the QP is fully placed: "WRITE the data, then SEND the notification" holds. A QP created
//!   with `QpOptions::unordered` set completes a receive as soon as
//!   its own bytes are placed.
//!
//! What "flushed" means here: a flushed work request was not executed *after* the refusal
//! reached the responder. Packets of later requests that arrived *before* the refused packet
//! (they took a faster path) were executed when they arrived, since placement does not wait:
//! their WRITE bytes may be in the responder's memory, their SEND bytes in a receive buffer
//! (whose receive still completes as flushed, in the default ordered mode), their atomics
//! applied and their READs answered. Their requester still reports them as flushed. Nothing
//! that arrives after the refusal executes.
use crate::seq::Psn;
use crate::wire::Syndrome;

/// Whether packet sequence number `a` comes before `b` (serial-number order, [`Psn::lt`]).
pub(crate) fn psn_before(a: u32, b: u32) -> bool {
    Psn(a).lt(Psn(b))
}

/// The packet a fatal refusal stopped the responder at.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fence {
    /// The refused packet: it and every packet after it are refused.
    pub(crate) psn: u32,
    /// Its request, for the NAK.
    pub(crate) msn: u32,
    /// The syndrome every packet at or after the fence is refused with.
    pub(crate) syndrome: Syndrome,
}

impl Fence {
    /// Whether the packet `psn` is at or after the fence (it must not execute).
    pub(crate) fn stops(&self, psn: u32) -> bool {
        !psn_before(psn, self.psn)
    }
}

/// The order state of one QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct RcOrder {
    /// Responder: set by the first fatal refusal (moved earlier if an earlier packet is
    /// refused later).
    pub(crate) fence: Option<Fence>,
    /// Requester: the earliest of its packets the peer refused for good. The QP fails once
    /// every packet before it is acknowledged, so that the responder, which stops once it has
    /// all of them, has failed too.
    pub(crate) refused_psn: Option<u32>,
    /// Receives complete when their own bytes are placed ([`crate::QpOptions::unordered`]).
    pub(crate) unordered: bool,
}

impl RcOrder {
    pub(crate) fn new(unordered: bool) -> RcOrder {
        RcOrder {
            fence: None,
            refused_psn: None,
            unordered,
        }
    }

    /// Records that the peer refused this QP's packet `psn` for good.
    pub(crate) fn refused(&mut self, psn: u32) {
        if self.refused_psn.is_none_or(|p| psn_before(psn, p)) {
            self.refused_psn = Some(psn);
        }
    }

    /// Records a fatal refusal of packet `psn` of request `msn`.
    pub(crate) fn refuse(&mut self, psn: u32, msn: u32, syndrome: Syndrome) {
        if self.fence.is_none_or(|f| psn_before(psn, f.psn)) {
            self.fence = Some(Fence { psn, msn, syndrome });
        }
    }

    /// Whether every packet before the fence has arrived (`cum` is the first PSN not yet
    /// received): time to enter the error state.
    pub(crate) fn fence_reached(&self, cum: u32) -> bool {
        self.fence.is_some_and(|f| !psn_before(cum, f.psn))
    }

    /// Whether a receive whose message ended at packet `last_psn` may complete, given that
    /// every packet before `cum` has arrived.
    pub(crate) fn may_complete(&self, last_psn: u32, cum: u32) -> bool {
        self.unordered || psn_before(last_psn, cum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_order_wraps() {
        assert!(psn_before(u32::MAX, 0));
        assert!(!psn_before(0, u32::MAX));
        assert!(!psn_before(5, 5));
        let f = Fence {
            psn: 2,
            msn: 0,
            syndrome: Syndrome::RemoteAccess,
        };
        assert!(f.stops(2) && f.stops(3) && !f.stops(1) && !f.stops(u32::MAX));
    }

    #[test]
    fn fence_moves_only_earlier() {
        let mut o = RcOrder::new(false);
        o.refuse(10, 3, Syndrome::RemoteAccess);
        o.refuse(12, 4, Syndrome::InvalidRequest);
        assert_eq!(o.fence.map(|f| (f.psn, f.msn)), Some((10, 3)));
        o.refuse(8, 2, Syndrome::InvalidRequest);
        assert_eq!(
            o.fence.map(|f| (f.psn, f.syndrome)),
            Some((8, Syndrome::InvalidRequest))
        );
        assert!(!o.fence_reached(7) && o.fence_reached(8));
    }

    #[test]
    fn ordered_receives_wait_for_every_earlier_packet() {
        let o = RcOrder::new(false);
        assert!(!o.may_complete(5, 5), "packet 5 itself not received");
        assert!(o.may_complete(5, 6));
        assert!(RcOrder::new(true).may_complete(5, 2));
    }

    #[test]
    fn requester_keeps_the_earliest_refusal() {
        let mut o = RcOrder::new(false);
        o.refused(7);
        o.refused(9);
        assert_eq!(o.refused_psn, Some(7));
        o.refused(3);
        assert_eq!(o.refused_psn, Some(3));
    }
}
