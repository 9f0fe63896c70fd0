//! Revocation: what a QP does when a region it uses is deregistered.
//!
//! After [`Endpoint::deregister`](crate::Endpoint::deregister) returns, the engine never reads
//! or writes that region's memory again (with [`Region::from_raw`] memory the caller may free
//! it then). Peers' new requests find no key and are refused at once; what a QP already holds
//! is swept here, once per deregistration (it is rare, so the sweep's cost, linear in the QP's
//! queues, stays off the per-packet path):
//!
//! - **Responses being served** (a READ's response still queued): the responder refuses that
//!   READ with a remote access NAK and moves the QP to the error state, as verbs does for a
//!   fatal access error. The requester completes that READ with `RemoteAccessError` and
//!   flushes what follows; the response bytes it already placed are what the region held
//!   before deregistration, never anything written after. Atomic responses carry their
//!   value, not the region, and are unaffected.
//! - **Responses sent and not yet acknowledged** (all of a READ's response may have arrived:
//!   its requester may even have reported it, and its application deregistered the region
//!   on that news): they forget the region ([`SentWhat::Revoked`]) and the QP carries on. Only
//!   if one of them turns out lost, so that a retransmission would read the region again, is
//!   that READ refused as above, then.
//! - **This QP's own work requests** whose local buffers lie in the region (gather sources,
//!   READ and atomic destinations, posted receives), and that have not finished: the first
//!   gets `LocalProtectionError`, as verbs reports a work request whose memory registration
//!   vanished, and the QP goes to the error state, so nothing else touches those buffers.
//!   Work requests that finished and only wait to be reported in posting order keep their
//!   status: nothing reads or writes their buffers again.
//!
//! A region registered twice (two keys, the same [`Region`]) is revoked for every use when
//! either registration goes.
use std::sync::Arc;

use super::{Qp, RespJob, Seg, SentWhat};
use crate::mem::Region;
use crate::nak_repeat::Until;
use crate::shared::Shared;
use crate::types::{QpState, WcStatus};
use crate::wire::{self, Syndrome};

fn uses(segs: &[Seg], region: &Arc<Region>) -> bool {
    segs.iter().any(|s| Arc::ptr_eq(&s.region, region))
}

impl Qp {
    /// Stops every use of `region` by this QP (see the module documentation). Returns
    /// whether the QP changed (it failed).
    pub(crate) fn revoke(&mut self, region: &Arc<Region>, sh: &mut Shared) -> bool {
        if self.state != QpState::Connected && self.state != QpState::Init {
            return false; // in error: its queues were drained, nothing holds the region
        }
        // A READ whose response is still queued is refused; if an older one has responses
        // sent and not yet acknowledged, that one instead, so the refusal names the oldest
        // READ the region held up (sent responses are older than any queued job).
        let queued = self.rsp.resp.iter().find_map(|j| match j {
            RespJob::Read { msn, region: r, .. } if Arc::ptr_eq(r, region) => Some(*msn),
            _ => None,
        });
        let mut oldest_sent = None;
        for p in self.rec.sent.iter_mut().filter(|p| !p.acked) {
            if let SentWhat::ReadResp { msn, region: r, .. } = &p.what
                && Arc::ptr_eq(r, region)
            {
                oldest_sent = oldest_sent.or(Some(*msn));
                p.what = SentWhat::Revoked { msn: *msn };
            }
        }
        let refused = queued.map(|q| oldest_sent.unwrap_or(q));
        let mut fail = false;
        if let Some(msn) = refused {
            self.queue_refusal(msn);
            fail = true;
        }
        if let Some(w) = self
            .req
            .sq
            .iter_mut()
            .find(|w| !w.is_done() && w.status.is_none() && uses(&w.segs, region))
        {
            w.status = Some(WcStatus::LocalProtectionError);
            fail = true;
        }
        if let Some(w) = self
            .rsp
            .rq
            .iter_mut()
            .find(|w| !w.done && w.error.is_none() && uses(&w.segs, region))
        {
            w.error = Some(WcStatus::LocalProtectionError);
            fail = true;
        }
        if fail {
            // Drains the response jobs, the sent packets and both work queues: no copy of
            // the region's reference is used again.
            self.enter_error(sh);
        }
        fail
    }

    /// A READ response sent from a revoked region was lost: refuses that READ and fails the
    /// QP, as a revocation does for a response still queued (see the module documentation).
    pub(crate) fn refuse_revoked(&mut self, msn: u32, sh: &mut Shared) {
        self.queue_refusal(msn);
        self.enter_error(sh);
    }

    /// Queues the remote access NAK that refuses READ `msn`.
    fn queue_refusal(&mut self, msn: u32) {
        // Queued even if the NAK queue is full: this one carries the verdict. It is repeated
        // like every NAK (a lost one costs the requester a round trip, not its retry budget),
        // but it names a message, so no later acceptance stops the repeats.
        let nak = wire::Nak {
            psn: 0,
            msn,
            syndrome: Syndrome::RemoteAccess,
        };
        self.rsp.naks.push_back((nak, Until::Repeated));
    }

    /// A fatal NAK for a READ or atomic this side sent and the peer accepted (so the request
    /// packet is acknowledged already): the responder could not serve it after all (its
    /// region was deregistered, see the module documentation). The work request fails with
    /// the NAK's status, in posting order. Returns whether the NAK was such a refusal.
    pub(crate) fn refused_after_acceptance(&mut self, n: &wire::Nak, sh: &mut Shared) -> bool {
        let pending_request = self.sent_index(n.psn).is_some_and(|i| {
            let p = &self.rec.sent[i];
            !p.acked && matches!(p.what, SentWhat::Req { msn, .. } if msn == n.msn)
        });
        if pending_request {
            return false; // an ordinary refusal of a request packet
        }
        let Some(i) = self.wqe_index(n.msn) else {
            return false;
        };
        let w = &mut self.req.sq[i];
        if n.syndrome != Syndrome::RemoteAccess || !w.awaits_response() || w.status.is_some() {
            return false;
        }
        w.status = Some(WcStatus::RemoteAccessError);
        self.req.failing = true;
        self.complete_sq(sh);
        true
    }
}
