//! What an endpoint's QPs share: the configuration, the seeded RNG, the memory regions and
//! their keys, the completion queue of completions and the device-wide counters. QP methods
//! borrow it beside the QP itself.
use std::collections::VecDeque;
use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rand_core::RngCore;

use crate::Timestamp;
use crate::departure::Departures;
use crate::hist::RttHistogram;
use crate::keymap::KeyMap;
use crate::mem::{Access, Region};
use crate::stall::HostStall;
use crate::types::*;
use crate::wire::Syndrome;

/// A registered memory region as the endpoint keeps it.
pub(crate) struct Mr {
    pub(crate) region: Arc<Region>,
    pub(crate) pd: u32,
    pub(crate) access: Access,
    pub(crate) rkey: u32,
}

/// A registered memory region as peers reach it, by its remote key.
pub(crate) struct RemoteMr {
    pub(crate) region: Arc<Region>,
    pub(crate) pd: u32,
    pub(crate) access: Access,
}

/// Everything outside the QPs, borrowed by QP methods alongside the QP itself.
pub(crate) struct Shared {
    pub(crate) cfg: EndpointConfig,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) mrs: KeyMap<Mr>,
    /// The same regions by remote key, for peers' accesses: one lookup per packet.
    pub(crate) rkeys: KeyMap<RemoteMr>,
    pub(crate) completions: VecDeque<(CqId, Completion)>,
    pub(crate) stats: EndpointStats,
    pub(crate) paths: Vec<PathStats>,
    /// Every QP's RTT samples together (the device-level distribution).
    pub(crate) rtt_hist: RttHistogram,
    pub(crate) req_chunk: u32,
    pub(crate) resp_chunk: u32,
    /// The latest stall of this host ([`crate::stall`]).
    pub(crate) stall: HostStall,
    /// When the datagram being handled reached this host: `now` less the time it waited in
    /// the kernel for the datapath to take it ([`Endpoint::handle_received`]). The delay an
    /// ACK gives the controller ends here, so that wait, this host's and not the network's,
    /// stays out of it (Swift keeps such host delay apart from the fabric's).
    ///
    /// [`Endpoint::handle_received`]: crate::Endpoint::handle_received
    pub(crate) rx_at: Timestamp,
    /// The transmit batches and when they left ([`crate::departure`]).
    pub(crate) departures: Departures,
    /// The READ response stream whose next datagrams may be received straight into place
    /// ([`crate::landing`]).
    pub(crate) landing: Option<crate::landing::LandingHint>,
    /// Payloads left in their regions: the setting and the regions pinned
    /// ([`crate::in_place`]).
    pub(crate) in_place: crate::in_place::Pins,
}

impl Shared {
    pub(crate) fn complete(&mut self, cq: u32, c: Completion) {
        self.completions.push_back((CqId(cq), c));
    }

    /// Finds the region behind `rkey` for a remote access, checking PD, rights and bounds.
    pub(crate) fn remote_region(
        &self,
        pd: u32,
        rkey: u32,
        need: Access,
        offset: u64,
        len: u64,
    ) -> Result<Arc<Region>, Syndrome> {
        self.remote_region_ref(pd, rkey, need, offset, len)
            .map(Arc::clone)
    }

    /// [`remote_region`](Self::remote_region) borrowed: for an access that ends before the
    /// borrow does (a WRITE's placement), so no reference count is touched per packet.
    pub(crate) fn remote_region_ref(
        &self,
        pd: u32,
        rkey: u32,
        need: Access,
        offset: u64,
        len: u64,
    ) -> Result<&Arc<Region>, Syndrome> {
        let mr = self.rkeys.get(&rkey).ok_or(Syndrome::RemoteAccess)?;
        if mr.pd != pd || !mr.access.contains(need) {
            return Err(Syndrome::RemoteAccess);
        }
        mr.region
            .check(offset, len)
            .map_err(|_| Syndrome::RemoteAccess)?;
        Ok(&mr.region)
    }

    pub(crate) fn random_nonzero(&mut self) -> u32 {
        loop {
            let v = self.rng.next_u32();
            if v != 0 {
                return v;
            }
        }
    }
}
