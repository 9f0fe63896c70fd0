//! The checks a post must pass on its buffers and shape, without an [`Endpoint`].
//!
//! [`Endpoint::post_send`] and [`Endpoint::post_recv`] refuse a work request for the same
//! reasons, in the same order; these functions let a runtime refuse it before handing it to a
//! busy engine (from its own copy of the registrations), so that a post is refused the same
//! way whether or not the engine was free at that moment.
//!
//! [`Endpoint`]: crate::Endpoint
//! [`Endpoint::post_send`]: crate::Endpoint::post_send
//! [`Endpoint::post_recv`]: crate::Endpoint::post_recv
use crate::mem::Access;
use crate::types::{MAX_SGE, PostError, RecvWr, SendOp, SendWr, Sge};

/// What a post is checked against for one registered region (by local key).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LocalMr {
    /// Its protection domain.
    pub pd: u32,
    /// Its access rights.
    pub access: Access,
    /// Its length in bytes.
    pub len: u64,
}

/// Checks a scatter/gather list for a QP in protection domain `pd`, each entry needing
/// `need` rights; returns the total length. `lookup` finds a region by local key.
pub fn check_sges(
    pd: u32,
    sges: &[Sge],
    need: Access,
    lookup: impl Fn(u32) -> Option<LocalMr>,
) -> Result<u32, PostError> {
    if sges.len() > MAX_SGE {
        return Err(PostError::TooManySges);
    }
    let mut total: u64 = 0;
    for s in sges {
        let mr = lookup(s.lkey).ok_or(PostError::InvalidLkey)?;
        if mr.pd != pd {
            return Err(PostError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(PostError::NoLocalWrite);
        }
        match s.offset.checked_add(u64::from(s.len)) {
            Some(end) if end <= mr.len => {}
            _ => return Err(PostError::OutOfBounds),
        }
        total += u64::from(s.len);
    }
    u32::try_from(total).map_err(|_| PostError::TooManySges)
}

/// Checks a send work request's buffers and shape (not the QP's state or queue depth).
pub fn check_send(
    pd: u32,
    wr: &SendWr,
    lookup: impl Fn(u32) -> Option<LocalMr>,
) -> Result<(), PostError> {
    let (atomic_offset, need) = match wr.op {
        SendOp::Read(_) => (None, Access::LOCAL_WRITE),
        SendOp::FetchAdd(r, _) => (Some(r.offset), Access::LOCAL_WRITE),
        SendOp::CompareSwap { remote, .. } => (Some(remote.offset), Access::LOCAL_WRITE),
        _ => (None, Access::NONE),
    };
    let len = check_sges(pd, &wr.sges, need, lookup)?;
    if let Some(off) = atomic_offset
        && (wr.sges.len() != 1 || len != 8 || off % 8 != 0)
    {
        return Err(PostError::BadAtomic);
    }
    Ok(())
}

/// Checks a receive work request's buffers (not the QP's queue depth).
pub fn check_recv(
    pd: u32,
    wr: &RecvWr,
    lookup: impl Fn(u32) -> Option<LocalMr>,
) -> Result<(), PostError> {
    check_sges(pd, &wr.sges, Access::LOCAL_WRITE, lookup).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::RemoteAddr;
    use crate::{Endpoint, EndpointConfig, Region};
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// The checks refuse exactly what the engine refuses, with the same error.
        #[test]
        fn agrees_with_the_engine(
            entries in proptest::collection::vec(
                (0usize..4, 0u64..300, 0u32..300), 0..4),
            op in 0u8..4,
            remote_offset in 0u64..20,
        ) {
            let addr = "127.0.0.1:1".parse().unwrap();
            let mut ep = Endpoint::new(EndpointConfig::default(), addr);
            let (pd, other) = (ep.alloc_pd(), ep.alloc_pd());
            let cq = ep.create_cq();
            let qp = ep.create_qp(pd, cq, cq).unwrap();
            let peer = ep.create_qp(pd, cq, cq).unwrap();
            ep.connect(qp.qpn, peer).unwrap();
            let mut table = HashMap::new();
            let mut lkeys = Vec::new();
            for (p, access) in [(pd, Access::ALL), (pd, Access::NONE), (other, Access::ALL)] {
                let keys = ep.register(p, Region::new(256), access).unwrap();
                table.insert(keys.lkey, LocalMr { pd: p.0, access, len: 256 });
                lkeys.push(keys.lkey);
            }
            lkeys.push(0xdead); // unknown
            let sges: Vec<Sge> = entries
                .iter()
                .map(|&(k, offset, len)| Sge { lkey: lkeys[k], offset, len })
                .collect();
            let remote = RemoteAddr { rkey: 1, offset: remote_offset };
            let op = match op {
                0 => SendOp::Write(remote),
                1 => SendOp::Read(remote),
                2 => SendOp::FetchAdd(remote, 1),
                _ => SendOp::Send,
            };
            let wr = SendWr { wr_id: 1, op, sges: sges.clone(), signaled: true };
            let lookup = |k| table.get(&k).copied();
            prop_assert_eq!(check_send(pd.0, &wr, lookup), ep.post_send(qp.qpn, wr));
            let rwr = RecvWr { wr_id: 2, sges };
            prop_assert_eq!(check_recv(pd.0, &rwr, lookup), ep.post_recv(qp.qpn, rwr));
        }
    }
}
