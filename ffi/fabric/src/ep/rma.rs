//! FI_RMA and FI_ATOMIC: one Braid work request each.
//!
//! - `fi_write*` is a Braid RDMA WRITE, `fi_writedata` a WRITE with immediate (the 4 bytes of
//!   CQ data; it consumes one of the target's provider receive buffers, and the target reports
//!   it on its receive CQ with `FI_REMOTE_CQ_DATA`), `fi_read*` a Braid READ.
//! - Atomics are what the engine does: 64-bit `FI_SUM` (fetch-and-add; the non-fetching form
//!   discards the old value), `FI_ATOMIC_READ` (fetch-and-add of 0) and `FI_CSWAP`
//!   (compare-and-swap), one element (`count` 1), on `FI_UINT64` or `FI_INT64`, at an 8-byte
//!   aligned offset. The `valid` queries say so; every other combination is `-FI_EOPNOTSUPP`.
//!
//! Remote addresses are offsets into the target region, or the target's virtual addresses
//! when the domain runs with `FI_MR_VIRT_ADDR` (see `Spec::virt_addr` for how the key carries
//! the region's base); keys are the target's provider keys. Local
//! buffers need no registration: each operation registers them with Braid for its duration.
use std::ffi::c_void;
use std::sync::atomic::Ordering;

use braid::{Access, RemoteAddr, SendOp, SendWr};

use super::{EpInner, Op, ep_get, iovs, one};
use crate::objects::Table;
use crate::util::{Iov, gather, guard_sz, iov_len};
use crate::{EAGER_MAX, SLOT_LEN, fi};

/// What an RMA or atomic operation does.
enum Kind {
    Write {
        data: Option<u32>,
    },
    Read,
    /// Fetch-and-add; `result` is where the old value goes (`None`: discarded).
    Add {
        add: u64,
        result: Option<Iov>,
    },
    Cswap {
        compare: u64,
        swap: u64,
        result: Iov,
    },
}

struct Req {
    kind: Kind,
    iovs: Vec<Iov>,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
    flags: u64,
}

const EINVAL: isize = -(fi::FI_EINVAL as isize);
const EOPNOTSUPP: isize = -(fi::FI_EOPNOTSUPP as isize);

impl EpInner {
    fn rma(&self, req: Req) -> isize {
        let mut st = self.lock();
        if !st.enabled {
            return -(fi::FI_EOPBADSTATE as isize);
        }
        let atomic = matches!(req.kind, Kind::Add { .. } | Kind::Cswap { .. });
        let need = if atomic { fi::FI_ATOMIC } else { fi::FI_RMA } as u64;
        if self.caps & need == 0 {
            return EOPNOTSUPP;
        }
        let Some(peer) = st.bound.av.as_ref().and_then(|a| a.lookup(req.dest)) else {
            return EINVAL;
        };
        let (rkey, offset) = if self.dom.spec.virt_addr() {
            crate::info::virt_target(req.key, req.addr)
        } else {
            let Ok(rkey) = u32::try_from(req.key) else {
                return -(fi::FI_EKEYREJECTED as isize);
            };
            (rkey, req.addr)
        };
        let len = iov_len(&req.iovs);
        if len > crate::MAX_MSG_SIZE {
            return -(fi::FI_EMSGSIZE as isize);
        }
        let flags = req.flags | st.tx_op_flags;
        let inject = flags & fi::FI_INJECT as u64 != 0;
        if inject && (len > EAGER_MAX || matches!(req.kind, Kind::Read)) {
            return -(fi::FI_EMSGSIZE as isize);
        }
        let report = flags & super::INJECT_CALL == 0
            && (!st.bound.tx_selective || flags & fi::FI_COMPLETION as u64 != 0);
        self.note_app();
        self.progress_locked(&mut st);
        if let Err(e) = self.ensure_peer(&mut st, peer) {
            return e;
        }
        let remote = RemoteAddr { rkey, offset };
        let mut mrs = Vec::new();
        let mut sges = Vec::new();
        let mut slot = None;
        let register = |v: &Iov, mrs: &mut Vec<braid::MemoryRegion>, sges: &mut Vec<braid::Sge>| {
            // SAFETY: the operation's contract keeps the application buffer valid until it
            // completes; the region is dropped when the Braid work request completes.
            let m = unsafe { self.net.pd.register_raw(v.base, v.len, Access::LOCAL_WRITE) }
                .map_err(|_| -(fi::FI_ENOMEM as isize))?;
            sges.push(m.sge(0, v.len as u32));
            mrs.push(m);
            Ok::<(), isize>(())
        };
        let (op, read, op_flags, op_len) = match &req.kind {
            Kind::Write { data } => {
                if inject || len == 0 {
                    let Some(s) = st.free_tx.pop() else {
                        return -(fi::FI_EAGAIN as isize);
                    };
                    let mut buf = vec![0u8; len];
                    // SAFETY: the iovs describe readable application memory.
                    unsafe { gather(&req.iovs, &mut buf) };
                    let off = u64::from(s) * SLOT_LEN as u64;
                    if st.tx_mr.write(off, &buf).is_err() {
                        st.free_tx.push(s);
                        return -(fi::FI_EIO as isize);
                    }
                    sges.push(st.tx_mr.sge(off, len as u32));
                    slot = Some(s);
                } else {
                    for v in req.iovs.iter().filter(|v| v.len > 0) {
                        if let Err(e) = register(v, &mut mrs, &mut sges) {
                            return e;
                        }
                    }
                }
                let op = match data {
                    Some(d) => SendOp::WriteImm(remote, *d),
                    None => SendOp::Write(remote),
                };
                (op, false, fi::FI_RMA as u64 | fi::FI_WRITE as u64, len)
            }
            Kind::Read => {
                for v in req.iovs.iter().filter(|v| v.len > 0) {
                    if let Err(e) = register(v, &mut mrs, &mut sges) {
                        return e;
                    }
                }
                (
                    SendOp::Read(remote),
                    true,
                    fi::FI_RMA as u64 | fi::FI_READ as u64,
                    len,
                )
            }
            Kind::Add { add, result } => {
                if !req.addr.is_multiple_of(8) {
                    return EINVAL;
                }
                let read = result.is_some();
                match result {
                    Some(r) => {
                        if let Err(e) = register(r, &mut mrs, &mut sges) {
                            return e;
                        }
                    }
                    None => {
                        // The old value goes to a provider buffer and is dropped.
                        let Some(s) = st.free_tx.pop() else {
                            return -(fi::FI_EAGAIN as isize);
                        };
                        sges.push(st.tx_mr.sge(u64::from(s) * SLOT_LEN as u64, 8));
                        slot = Some(s);
                    }
                }
                let f = if read { fi::FI_READ } else { fi::FI_WRITE } as u64;
                (
                    SendOp::FetchAdd(remote, *add),
                    read,
                    fi::FI_ATOMIC as u64 | f,
                    8,
                )
            }
            Kind::Cswap {
                compare,
                swap,
                result,
            } => {
                if !req.addr.is_multiple_of(8) {
                    return EINVAL;
                }
                if let Err(e) = register(result, &mut mrs, &mut sges) {
                    return e;
                }
                (
                    SendOp::CompareSwap {
                        remote,
                        compare: *compare,
                        swap: *swap,
                    },
                    true,
                    fi::FI_ATOMIC as u64 | fi::FI_READ as u64,
                    8,
                )
            }
        };
        let id = Self::new_op(
            &mut st,
            Op::Rma {
                ctx: req.ctx,
                flags: op_flags,
                len: op_len,
                report,
                slot,
                _mrs: mrs,
                read,
                event: (self.caps & fi::FI_RMA_EVENT != 0)
                    .then_some((peer, matches!(req.kind, Kind::Read))),
            },
        );
        let wr = SendWr {
            wr_id: id,
            op,
            sges,
            signaled: true,
        };
        if self.net.dev.post_send_to(peer, wr).is_err() {
            st.ops.remove(&id);
            if let Some(s) = slot {
                st.free_tx.push(s);
            }
            return -(fi::FI_EAGAIN as isize);
        }
        self.ops_seq.fetch_add(1, Ordering::Relaxed);
        0
    }
}

#[allow(clippy::too_many_arguments)] // the C ops' own argument lists
fn run(
    ep: *mut fi::fid_ep,
    iovs: Result<Vec<Iov>, isize>,
    kind: Kind,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
    flags: u64,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated.
        let e = match unsafe { ep_get(ep) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        let iovs = match iovs {
            Ok(v) => v,
            Err(x) => return x,
        };
        e.inner.rma(Req {
            kind,
            iovs,
            dest,
            addr,
            key,
            ctx,
            flags,
        })
    })
}

/// An RMA message's local iovs, peer, remote address, key, context and CQ data.
type RmaMsg = (Result<Vec<Iov>, isize>, u64, u64, u64, *mut c_void, u64);

/// The single remote iov of an RMA message (more are refused).
///
/// # Safety
/// `msg` is null or valid, its iov arrays of their stated counts.
unsafe fn rma_msg(msg: *const fi::fi_msg_rma) -> Result<RmaMsg, isize> {
    // SAFETY: null or valid by contract.
    let m = unsafe { msg.as_ref() }.ok_or(EINVAL)?;
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: one entry (checked).
    let r = unsafe { &*m.rma_iov };
    // SAFETY: msg_iov has iov_count entries.
    let v = unsafe { iovs(m.msg_iov, m.iov_count) };
    Ok((v, m.addr, r.addr, r.key, m.context, m.data))
}

const RMA_FLAGS: u64 = crate::info::OP_FLAGS | fi::FI_MORE as u64 | fi::FI_FENCE as u64;

unsafe extern "C" fn rma_read(
    ep: *mut fi::fid_ep,
    buf: *mut c_void,
    len: usize,
    _d: *mut c_void,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    run(
        ep,
        unsafe { one(buf, len) },
        Kind::Read,
        src,
        addr,
        key,
        ctx,
        0,
    )
}
unsafe extern "C" fn rma_readv(
    ep: *mut fi::fid_ep,
    iov: *const fi::iovec,
    _d: *mut *mut c_void,
    count: usize,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov has count entries.
    run(
        ep,
        unsafe { iovs(iov, count) },
        Kind::Read,
        src,
        addr,
        key,
        ctx,
        0,
    )
}
unsafe extern "C" fn rma_readmsg(
    ep: *mut fi::fid_ep,
    msg: *const fi::fi_msg_rma,
    flags: u64,
) -> isize {
    if flags & !RMA_FLAGS != 0 {
        return EINVAL;
    }
    // SAFETY: msg by contract.
    match unsafe { rma_msg(msg) } {
        Ok((v, dest, addr, key, ctx, _)) => run(ep, v, Kind::Read, dest, addr, key, ctx, flags),
        Err(e) => e,
    }
}
unsafe extern "C" fn rma_write(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    _d: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    run(
        ep,
        unsafe { one(buf, len) },
        Kind::Write { data: None },
        dest,
        addr,
        key,
        ctx,
        0,
    )
}
unsafe extern "C" fn rma_writev(
    ep: *mut fi::fid_ep,
    iov: *const fi::iovec,
    _d: *mut *mut c_void,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov has count entries.
    run(
        ep,
        unsafe { iovs(iov, count) },
        Kind::Write { data: None },
        dest,
        addr,
        key,
        ctx,
        0,
    )
}
unsafe extern "C" fn rma_writemsg(
    ep: *mut fi::fid_ep,
    msg: *const fi::fi_msg_rma,
    flags: u64,
) -> isize {
    if flags & !RMA_FLAGS != 0 {
        return EINVAL;
    }
    // SAFETY: msg by contract.
    match unsafe { rma_msg(msg) } {
        Ok((v, dest, addr, key, ctx, data)) => {
            let data = (flags & fi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(data as u32);
            run(ep, v, Kind::Write { data }, dest, addr, key, ctx, flags)
        }
        Err(e) => e,
    }
}
unsafe extern "C" fn rma_inject(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    // SAFETY: buf describes len bytes.
    run(
        ep,
        unsafe { one(buf, len) },
        Kind::Write { data: None },
        dest,
        addr,
        key,
        std::ptr::null_mut(),
        fi::FI_INJECT as u64 | super::INJECT_CALL,
    )
}
unsafe extern "C" fn rma_writedata(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    _d: *mut c_void,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    run(
        ep,
        unsafe { one(buf, len) },
        Kind::Write {
            data: Some(data as u32),
        },
        dest,
        addr,
        key,
        ctx,
        0,
    )
}
unsafe extern "C" fn rma_injectdata(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    // SAFETY: buf describes len bytes.
    run(
        ep,
        unsafe { one(buf, len) },
        Kind::Write {
            data: Some(data as u32),
        },
        dest,
        addr,
        key,
        std::ptr::null_mut(),
        fi::FI_INJECT as u64 | super::INJECT_CALL,
    )
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

type Ep = *mut fi::fid_ep;
type V = *mut c_void;
type CV = *const c_void;
type Dt = fi::fi_datatype;
type Opn = fi::fi_op;

fn is_u64(dt: Dt) -> bool {
    dt == fi::FI_UINT64 || dt == fi::FI_INT64
}

/// Reads the one 64-bit operand at `p`.
///
/// # Safety
/// `p` is null or points to 8 readable bytes.
unsafe fn operand(p: CV, count: usize, dt: Dt) -> Result<u64, isize> {
    if count != 1 || !is_u64(dt) {
        return Err(EOPNOTSUPP);
    }
    if p.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: 8 readable bytes by contract.
    Ok(unsafe { std::ptr::read_unaligned(p.cast::<u64>()) })
}

fn result_iov(p: V) -> Result<Iov, isize> {
    if p.is_null() {
        return Err(EINVAL);
    }
    Ok(Iov {
        base: p.cast(),
        len: 8,
    })
}

unsafe extern "C" fn at_write(
    ep: Ep,
    buf: CV,
    count: usize,
    _d: V,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Opn,
    ctx: V,
) -> isize {
    if op != fi::FI_SUM {
        return EOPNOTSUPP;
    }
    // SAFETY: buf has count elements of dt.
    match unsafe { operand(buf, count, dt) } {
        Ok(add) => run(
            ep,
            Ok(Vec::new()),
            Kind::Add { add, result: None },
            dest,
            addr,
            key,
            ctx,
            0,
        ),
        Err(e) => e,
    }
}
unsafe extern "C" fn at_writev(
    ep: Ep,
    iov: *const fi::fi_ioc,
    _d: *mut V,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Opn,
    ctx: V,
) -> isize {
    if count != 1 || iov.is_null() {
        return EINVAL;
    }
    // SAFETY: one entry (checked).
    let v = unsafe { &*iov };
    // SAFETY: forwarded.
    unsafe {
        at_write(
            ep,
            v.addr,
            v.count,
            std::ptr::null_mut(),
            dest,
            addr,
            key,
            dt,
            op,
            ctx,
        )
    }
}
unsafe extern "C" fn at_writemsg(ep: Ep, msg: *const fi::fi_msg_atomic, flags: u64) -> isize {
    // SAFETY: null or valid.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return EINVAL;
    };
    if m.iov_count != 1
        || m.msg_iov.is_null()
        || m.rma_iov_count != 1
        || m.rma_iov.is_null()
        || flags & !RMA_FLAGS != 0
    {
        return EINVAL;
    }
    // SAFETY: one entry each (checked).
    let (v, r) = unsafe { (&*m.msg_iov, &*m.rma_iov) };
    if m.op != fi::FI_SUM {
        return EOPNOTSUPP;
    }
    // SAFETY: v.addr has v.count elements.
    match unsafe { operand(v.addr, v.count, m.datatype) } {
        Ok(add) => run(
            ep,
            Ok(Vec::new()),
            Kind::Add { add, result: None },
            m.addr,
            r.addr,
            r.key,
            m.context,
            flags,
        ),
        Err(e) => e,
    }
}
unsafe extern "C" fn at_inject(
    ep: Ep,
    buf: CV,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Opn,
) -> isize {
    if op != fi::FI_SUM {
        return EOPNOTSUPP;
    }
    // SAFETY: buf has count elements.
    match unsafe { operand(buf, count, dt) } {
        Ok(add) => run(
            ep,
            Ok(Vec::new()),
            Kind::Add { add, result: None },
            dest,
            addr,
            key,
            std::ptr::null_mut(),
            fi::FI_INJECT as u64 | super::INJECT_CALL,
        ),
        Err(e) => e,
    }
}
unsafe extern "C" fn at_readwrite(
    ep: Ep,
    buf: CV,
    count: usize,
    _d: V,
    result: V,
    _rd: V,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Opn,
    ctx: V,
) -> isize {
    let add = match op {
        // SAFETY: buf has count elements.
        fi::FI_SUM => match unsafe { operand(buf, count, dt) } {
            Ok(a) => a,
            Err(e) => return e,
        },
        fi::FI_ATOMIC_READ => {
            if count != 1 || !is_u64(dt) {
                return EOPNOTSUPP;
            }
            0
        }
        _ => return EOPNOTSUPP,
    };
    match result_iov(result) {
        Ok(r) => run(
            ep,
            Ok(Vec::new()),
            Kind::Add {
                add,
                result: Some(r),
            },
            dest,
            addr,
            key,
            ctx,
            0,
        ),
        Err(e) => e,
    }
}
unsafe extern "C" fn at_readwritev(
    ep: Ep,
    iov: *const fi::fi_ioc,
    _d: *mut V,
    count: usize,
    resultv: *mut fi::fi_ioc,
    _rd: *mut V,
    result_count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Opn,
    ctx: V,
) -> isize {
    if result_count != 1
        || resultv.is_null()
        || (op != fi::FI_ATOMIC_READ && (count != 1 || iov.is_null()))
    {
        return EINVAL;
    }
    // SAFETY: one entry each (checked; iov may be null for FI_ATOMIC_READ).
    let (buf, n) = match unsafe { iov.as_ref() } {
        Some(v) => (v.addr.cast_const(), v.count),
        None => (std::ptr::null(), 1),
    };
    // SAFETY: one entry (checked).
    let r = unsafe { &*resultv };
    // SAFETY: forwarded.
    unsafe {
        at_readwrite(
            ep,
            buf,
            n,
            std::ptr::null_mut(),
            r.addr,
            std::ptr::null_mut(),
            dest,
            addr,
            key,
            dt,
            op,
            ctx,
        )
    }
}
unsafe extern "C" fn at_readwritemsg(
    ep: Ep,
    msg: *const fi::fi_msg_atomic,
    resultv: *mut fi::fi_ioc,
    _rd: *mut V,
    result_count: usize,
    flags: u64,
) -> isize {
    // SAFETY: null or valid.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return EINVAL;
    };
    if m.rma_iov_count != 1 || m.rma_iov.is_null() || flags & !RMA_FLAGS != 0 {
        return EINVAL;
    }
    // SAFETY: one entry (checked).
    let r = unsafe { &*m.rma_iov };
    // SAFETY: forwarded; msg_iov has iov_count entries.
    unsafe {
        at_readwritev(
            ep,
            m.msg_iov,
            std::ptr::null_mut(),
            m.iov_count,
            resultv,
            std::ptr::null_mut(),
            result_count,
            m.addr,
            r.addr,
            r.key,
            m.datatype,
            m.op,
            m.context,
        )
    }
}
unsafe extern "C" fn at_compwrite(
    ep: Ep,
    buf: CV,
    count: usize,
    _d: V,
    compare: CV,
    _cd: V,
    result: V,
    _rd: V,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Opn,
    ctx: V,
) -> isize {
    if op != fi::FI_CSWAP {
        return EOPNOTSUPP;
    }
    // SAFETY: buf and compare have count elements.
    let (swap, cmp) = match unsafe { (operand(buf, count, dt), operand(compare, count, dt)) } {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    match result_iov(result) {
        Ok(r) => run(
            ep,
            Ok(Vec::new()),
            Kind::Cswap {
                compare: cmp,
                swap,
                result: r,
            },
            dest,
            addr,
            key,
            ctx,
            0,
        ),
        Err(e) => e,
    }
}
unsafe extern "C" fn at_compwritev(
    ep: Ep,
    iov: *const fi::fi_ioc,
    _d: *mut V,
    count: usize,
    comparev: *const fi::fi_ioc,
    _cd: *mut V,
    compare_count: usize,
    resultv: *mut fi::fi_ioc,
    _rd: *mut V,
    result_count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Opn,
    ctx: V,
) -> isize {
    if count != 1
        || compare_count != 1
        || result_count != 1
        || iov.is_null()
        || comparev.is_null()
        || resultv.is_null()
    {
        return EINVAL;
    }
    // SAFETY: one entry each (checked).
    let (v, c, r) = unsafe { (&*iov, &*comparev, &*resultv) };
    if v.count != c.count {
        return EINVAL;
    }
    // SAFETY: forwarded.
    unsafe {
        at_compwrite(
            ep,
            v.addr,
            v.count,
            std::ptr::null_mut(),
            c.addr,
            std::ptr::null_mut(),
            r.addr,
            std::ptr::null_mut(),
            dest,
            addr,
            key,
            dt,
            op,
            ctx,
        )
    }
}
unsafe extern "C" fn at_compwritemsg(
    ep: Ep,
    msg: *const fi::fi_msg_atomic,
    comparev: *const fi::fi_ioc,
    _cd: *mut V,
    compare_count: usize,
    resultv: *mut fi::fi_ioc,
    _rd: *mut V,
    result_count: usize,
    flags: u64,
) -> isize {
    // SAFETY: null or valid.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return EINVAL;
    };
    if m.rma_iov_count != 1 || m.rma_iov.is_null() || flags & !RMA_FLAGS != 0 {
        return EINVAL;
    }
    // SAFETY: one entry (checked).
    let r = unsafe { &*m.rma_iov };
    // SAFETY: forwarded.
    unsafe {
        at_compwritev(
            ep,
            m.msg_iov,
            std::ptr::null_mut(),
            m.iov_count,
            comparev,
            std::ptr::null_mut(),
            compare_count,
            resultv,
            std::ptr::null_mut(),
            result_count,
            m.addr,
            r.addr,
            r.key,
            m.datatype,
            m.op,
            m.context,
        )
    }
}

/// The `valid` queries: `count` (the most elements per operation) is 1 for what the engine
/// does, everything else -FI_EOPNOTSUPP.
fn valid(ok: bool, count: *mut usize) -> i32 {
    if !ok {
        return -(fi::FI_EOPNOTSUPP as i32);
    }
    if !count.is_null() {
        // SAFETY: count points to a writable size_t by contract.
        unsafe { *count = 1 };
    }
    0
}
unsafe extern "C" fn at_writevalid(ep: Ep, dt: Dt, op: Opn, count: *mut usize) -> i32 {
    // SAFETY: validated.
    if unsafe { ep_get(ep) }.is_err() {
        return -(fi::FI_EINVAL as i32);
    }
    valid(is_u64(dt) && op == fi::FI_SUM, count)
}
unsafe extern "C" fn at_readwritevalid(ep: Ep, dt: Dt, op: Opn, count: *mut usize) -> i32 {
    // SAFETY: validated.
    if unsafe { ep_get(ep) }.is_err() {
        return -(fi::FI_EINVAL as i32);
    }
    valid(
        is_u64(dt) && (op == fi::FI_SUM || op == fi::FI_ATOMIC_READ),
        count,
    )
}
unsafe extern "C" fn at_compwritevalid(ep: Ep, dt: Dt, op: Opn, count: *mut usize) -> i32 {
    // SAFETY: validated.
    if unsafe { ep_get(ep) }.is_err() {
        return -(fi::FI_EINVAL as i32);
    }
    valid(is_u64(dt) && op == fi::FI_CSWAP, count)
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
    writevalid: Some(at_writevalid),
    readwritevalid: Some(at_readwritevalid),
    compwritevalid: Some(at_compwritevalid),
});
