//! The endpoint op tables for what the provider does not offer: RMA, atomics and collectives.
//! Every op exists and refuses with `-FI_ENOSYS` (`-FI_EOPNOTSUPP` from the atomic `valid`
//! queries), so no application ever calls a NULL pointer; getinfo never claims these caps.
use std::ffi::c_void;

use crate::fi;
use crate::objects::Table;

const NOSYS: isize = -(fi::FI_ENOSYS as isize);
type Ep = *mut fi::fid_ep;
type V = *mut c_void;
type CV = *const c_void;
type Dt = fi::fi_datatype;
type Opn = fi::fi_op;

unsafe extern "C" fn rma_read(_: Ep, _: V, _: usize, _: V, _: u64, _: u64, _: u64, _: V) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_readv(
    _: Ep,
    _: *const fi::iovec,
    _: *mut V,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_readmsg(_: Ep, _: *const fi::fi_msg_rma, _: u64) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_write(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: u64,
    _: u64,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_writev(
    _: Ep,
    _: *const fi::iovec,
    _: *mut V,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_writemsg(_: Ep, _: *const fi::fi_msg_rma, _: u64) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_inject(_: Ep, _: CV, _: usize, _: u64, _: u64, _: u64) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_writedata(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn rma_injectdata(
    _: Ep,
    _: CV,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: u64,
) -> isize {
    NOSYS
}

pub(crate) static RMA_OPS: Table<fi::fi_ops_rma> = Table(fi::fi_ops_rma {
    size: std::mem::size_of::<fi::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
});

unsafe extern "C" fn at_write(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: u64,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_writev(
    _: Ep,
    _: *const fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_writemsg(_: Ep, _: *const fi::fi_msg_atomic, _: u64) -> isize {
    NOSYS
}
unsafe extern "C" fn at_inject(
    _: Ep,
    _: CV,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_readwrite(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: V,
    _: V,
    _: u64,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_readwritev(
    _: Ep,
    _: *const fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: *mut fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_readwritemsg(
    _: Ep,
    _: *const fi::fi_msg_atomic,
    _: *mut fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: u64,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_compwrite(
    _: Ep,
    _: CV,
    _: usize,
    _: V,
    _: CV,
    _: V,
    _: V,
    _: V,
    _: u64,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_compwritev(
    _: Ep,
    _: *const fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: *const fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: *mut fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: u64,
    _: u64,
    _: u64,
    _: Dt,
    _: Opn,
    _: V,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_compwritemsg(
    _: Ep,
    _: *const fi::fi_msg_atomic,
    _: *const fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: *mut fi::fi_ioc,
    _: *mut V,
    _: usize,
    _: u64,
) -> isize {
    NOSYS
}
unsafe extern "C" fn at_valid(_: Ep, _: Dt, _: Opn, _: *mut usize) -> i32 {
    -(fi::FI_EOPNOTSUPP as i32)
}

pub(crate) static ATOMIC_OPS: Table<fi::fi_ops_atomic> = Table(fi::fi_ops_atomic {
    size: std::mem::size_of::<fi::fi_ops_atomic>(),
    write: Some(at_write),
    writev: Some(at_writev),
    writemsg: Some(at_writemsg),
    inject: Some(at_inject),
    readwrite: Some(at_readwrite),
    readwritev: Some(at_readwritev),
    readwritemsg: Some(at_readwritemsg),
    compwrite: Some(at_compwrite),
    compwritev: Some(at_compwritev),
    compwritemsg: Some(at_compwritemsg),
    writevalid: Some(at_valid),
    readwritevalid: Some(at_valid),
    compwritevalid: Some(at_valid),
});

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
