//! The endpoint op table for what the provider does not offer: collectives. Every op exists
//! and refuses with `-FI_ENOSYS`, so no application ever calls a NULL pointer; getinfo never
//! claims FI_COLLECTIVE.
use std::ffi::c_void;

use crate::fi;
use crate::objects::Table;

const NOSYS: isize = -(fi::FI_ENOSYS as isize);
type Ep = *mut fi::fid_ep;
type V = *mut c_void;
type CV = *const c_void;
type Dt = fi::fi_datatype;
type Opn = fi::fi_op;

unsafe extern "C" fn co_barrier(_: Ep, _: u64, _: V) -> isize {
    NOSYS
}
unsafe extern "C" fn co_broadcast(
    _: Ep,
    _: V,
    _: usize,
    _: V,
    _: u64,
    _: u64,
    _: Dt,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn co_alltoall(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: V,
    _: V,
    _: u64,
    _: Dt,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn co_allreduce(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: V,
    _: V,
    _: u64,
    _: Dt,
    _: Opn,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn co_reduce(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: V,
    _: V,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn co_scatter(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: V,
    _: V,
    _: u64,
    _: u64,
    _: Dt,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn co_msg(
    _: Ep,
    _: *const fi::fi_msg_collective,
    _: *mut fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: u64,
) -> isize {
    NOSYS
}
unsafe extern "C" fn co_barrier2(_: Ep, _: u64, _: u64, _: V) -> isize {
    NOSYS
}

pub(crate) static COLLECTIVE_OPS: Table<fi::fi_ops_collective> = Table(fi::fi_ops_collective {
    size: std::mem::size_of::<fi::fi_ops_collective>(),
    barrier: Some(co_barrier),
    broadcast: Some(co_broadcast),
    alltoall: Some(co_alltoall),
    allreduce: Some(co_allreduce),
    allgather: Some(co_alltoall),
    reduce_scatter: Some(co_allreduce),
    reduce: Some(co_reduce),
    scatter: Some(co_scatter),
    gather: Some(co_scatter),
    msg: Some(co_msg),
    barrier2: Some(co_barrier2),
});
