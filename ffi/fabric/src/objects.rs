//! Fabric, domain, memory regions, address vectors, completion queues, counters and event
//! queues: the objects around an endpoint ([`crate::ep`]).
//!
//! Every object is a `#[repr(C)]` struct whose first field is libfabric's `fid_*` structure
//! (so a `*mut fid` from the application is also a pointer to the object), followed by a
//! magic number checked, with the class, before any use: a handle of the wrong kind is
//! refused with `-FI_EINVAL`. Every op table is fully populated.
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use braid::{
    Access, CompletionQueue, Device, DeviceConfig, MemoryRegion, Progress, ProtectionDomain,
};

use crate::ep::EpInner;
use crate::fi;
use crate::info::Spec;
use crate::util::{c_str, from_sockaddr, guard, guard_sz, neg, to_sockaddr_in};

/// `FI_ADDR_NOTAVAIL` / `FI_ADDR_UNSPEC` (`(uint64_t)-1` in the headers).
pub(crate) const FI_ADDR_NOTAVAIL: u64 = u64::MAX;

/// An op table in a static: libfabric and applications only read it.
pub(crate) struct Table<T>(pub(crate) T);
// SAFETY: the tables are never written after initialisation; they hold function pointers.
unsafe impl<T> Sync for Table<T> {}

impl<T> Table<T> {
    pub(crate) fn ptr(&'static self) -> *mut T {
        std::ptr::addr_of!(self.0).cast_mut()
    }
}

/// A provider object behind a `fid`.
pub(crate) trait Object {
    const CLASS: u32;
    const MAGIC: u64;
    fn magic(&self) -> u64;
}

/// The object behind `fid`, if it is one of class `T` and alive.
///
/// # Safety
/// `fid` is null or points to a `fid` (of any provider object of this library, or of
/// another, which the class and magic checks then refuse).
pub(crate) unsafe fn get<'a, T: Object>(fid: *const fi::fid) -> Result<&'a T, i32> {
    if fid.is_null() {
        return Err(neg(fi::FI_EINVAL));
    }
    // SAFETY: non-null and pointing to a fid by contract.
    let class = unsafe { (*fid).fclass };
    if class != T::CLASS as usize {
        return Err(neg(fi::FI_EINVAL));
    }
    // SAFETY: a fid of class T::CLASS made by this library is the first field of a T
    // (repr(C)); the magic check below catches a fid of that class made elsewhere.
    let obj = unsafe { &*fid.cast::<T>() };
    if obj.magic() != T::MAGIC {
        return Err(neg(fi::FI_EINVAL));
    }
    Ok(obj)
}

macro_rules! object {
    ($t:ty, $class:expr, $magic:expr) => {
        impl Object for $t {
            const CLASS: u32 = $class;
            const MAGIC: u64 = $magic;
            fn magic(&self) -> u64 {
                self.magic
            }
        }
    };
}

/// Closes a boxed object: clears its magic (a second close is refused) and frees it.
///
/// # Safety
/// `fid` was validated as a `T` made with `Box::into_raw` and nothing uses it afterwards.
unsafe fn free<T: Object>(fid: *mut fi::fid, clear: impl FnOnce(&mut T)) {
    // SAFETY: by contract, the fid is the start of a live Box<T>.
    let mut b = unsafe { Box::from_raw(fid.cast::<T>()) };
    clear(&mut b);
    drop(b);
}

pub(crate) unsafe extern "C" fn no_ops_open(
    _: *mut fi::fid,
    _: *const libc::c_char,
    _: u64,
    _: *mut *mut c_void,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
pub(crate) unsafe extern "C" fn no_tostr(_: *const fi::fid, _: *mut libc::c_char, _: usize) -> i32 {
    neg(fi::FI_ENOSYS)
}
pub(crate) unsafe extern "C" fn no_ops_set(
    _: *mut fi::fid,
    _: *const libc::c_char,
    _: u64,
    _: *mut c_void,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
pub(crate) unsafe extern "C" fn no_bind(_: *mut fi::fid, _: *mut fi::fid, _: u64) -> i32 {
    neg(fi::FI_ENOSYS)
}
pub(crate) unsafe extern "C" fn no_control(_: *mut fi::fid, _: i32, _: *mut c_void) -> i32 {
    neg(fi::FI_ENOSYS)
}

/// An `fi_ops` with `close`, `bind` and `control`; the rest not supported.
macro_rules! fi_ops {
    ($close:expr, $bind:expr, $control:expr) => {
        Table(fi::fi_ops {
            size: std::mem::size_of::<fi::fi_ops>(),
            close: Some($close),
            bind: Some($bind),
            control: Some($control),
            ops_open: Some($crate::objects::no_ops_open),
            tostr: Some($crate::objects::no_tostr),
            ops_set: Some($crate::objects::no_ops_set),
        })
    };
}
pub(crate) use fi_ops;

/// Writes a new object to the application's out-pointer.
///
/// # Safety
/// `out` is non-null and writable.
unsafe fn hand_out<T, F>(obj: Box<T>, out: *mut *mut F) {
    let p = Box::into_raw(obj);
    // SAFETY: by contract; T starts with F (repr(C)).
    unsafe { *out = p.cast() };
}

// ---------------------------------------------------------------------------------------------

/// A fabric: holds nothing but the API version.
#[repr(C)]
pub(crate) struct Fabric {
    fid: fi::fid_fabric,
    magic: u64,
}
object!(Fabric, fi::FI_CLASS_FABRIC, 0x6272_6169_6466_6162);

static FABRIC_FID_OPS: Table<fi::fi_ops> = fi_ops!(fabric_close, no_bind, no_control);
static FABRIC_OPS: Table<fi::fi_ops_fabric> = Table(fi::fi_ops_fabric {
    size: std::mem::size_of::<fi::fi_ops_fabric>(),
    domain: Some(domain_open),
    passive_ep: Some(no_passive_ep),
    eq_open: Some(eq_open),
    wait_open: Some(no_wait_open),
    trywait: Some(trywait),
    domain2: Some(domain_open2),
});

/// `fabric` in the provider table.
pub(crate) unsafe extern "C" fn fabric_open(
    attr: *mut fi::fi_fabric_attr,
    fabric: *mut *mut fi::fid_fabric,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        if attr.is_null() || fabric.is_null() {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: attr is non-null and valid by fi_fabric's contract.
        let a = unsafe { &*attr };
        // SAFETY: the name is null or a C string.
        if let Some(n) = unsafe { c_str(a.name) }
            && !n.eq_ignore_ascii_case("braid")
        {
            return neg(fi::FI_ENODATA);
        }
        let obj = Box::new(Fabric {
            fid: fi::fid_fabric {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_FABRIC as usize,
                    context,
                    ops: FABRIC_FID_OPS.ptr(),
                },
                ops: FABRIC_OPS.ptr(),
                api_version: if a.api_version == 0 {
                    crate::API_VERSION
                } else {
                    a.api_version
                },
            },
            magic: Fabric::MAGIC,
        });
        // SAFETY: fabric is non-null (checked), writable by contract.
        unsafe { hand_out(obj, fabric) };
        0
    })
}

unsafe extern "C" fn fabric_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: fid is from the application; get() validates it.
        if let Err(e) = unsafe { get::<Fabric>(fid) } {
            return e;
        }
        // SAFETY: validated above; the application gives up the handle by closing it.
        unsafe { free::<Fabric>(fid, |f| f.magic = 0) };
        0
    })
}

unsafe extern "C" fn no_passive_ep(
    _: *mut fi::fid_fabric,
    _: *mut fi::fi_info,
    _: *mut *mut fi::fid_pep,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}

unsafe extern "C" fn no_wait_open(
    _: *mut fi::fid_fabric,
    _: *mut fi::fi_wait_attr,
    _: *mut *mut fi::fid_wait,
) -> i32 {
    neg(fi::FI_ENOSYS)
}

/// `fi_trywait`: success when every CQ, counter and EQ named is empty (after progress), so
/// the application may block on their file descriptors.
unsafe extern "C" fn trywait(
    fabric: *mut fi::fid_fabric,
    fids: *mut *mut fi::fid,
    count: i32,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        if let Err(e) = unsafe { get::<Fabric>(fabric.cast()) } {
            return e;
        }
        if count < 0 || (count > 0 && fids.is_null()) {
            return neg(fi::FI_EINVAL);
        }
        for i in 0..count as usize {
            // SAFETY: fids has `count` entries by contract.
            let f = unsafe { *fids.add(i) };
            if f.is_null() {
                return neg(fi::FI_EINVAL);
            }
            // SAFETY: f is non-null and points to a fid.
            let class = unsafe { (*f).fclass } as u32;
            let ready = match class {
                fi::FI_CLASS_CQ => {
                    // SAFETY: validated by get().
                    let cq = match unsafe { get::<Cq>(f) } {
                        Ok(c) => c,
                        Err(e) => return e,
                    };
                    cq.inner.progress_then_wait();
                    !cq.inner.is_empty()
                }
                fi::FI_CLASS_CNTR => {
                    // SAFETY: validated by get().
                    let c = match unsafe { get::<Cntr>(f) } {
                        Ok(c) => c,
                        Err(e) => return e,
                    };
                    c.inner.progress_then_wait();
                    false
                }
                fi::FI_CLASS_EQ => {
                    // SAFETY: validated by get().
                    let eq = match unsafe { get::<Eq>(f) } {
                        Ok(c) => c,
                        Err(e) => return e,
                    };
                    !eq.inner
                        .q
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty()
                }
                _ => return neg(fi::FI_EINVAL),
            };
            if ready {
                return neg(fi::FI_EAGAIN);
            }
        }
        0
    })
}

// ---------------------------------------------------------------------------------------------

/// What every object of a domain shares: the Braid device (one UDP port), its protection
/// domain and the Braid CQ every QP of the domain reports to.
pub(crate) struct DomainInner {
    /// The domain's own Braid device: its memory regions live there, and the first endpoint
    /// uses it (see [`crate::ep`] for the others).
    pub(crate) net: Arc<Net>,
    pub(crate) spec: Spec,
    /// Endpoints open on the domain.
    pub(crate) eps: AtomicUsize,
    /// Whether an open endpoint uses `net` (the others have devices of their own).
    pub(crate) primary_taken: AtomicBool,
    /// Objects open on the domain besides endpoints (MRs, AVs, CQs, counters).
    pub(crate) children: AtomicUsize,
}

/// One Braid device with the connection handshake enabled, its protection domain and the
/// completion queue every QP the handshake creates reports to.
pub(crate) struct Net {
    pub(crate) dev: Device,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
}

impl Net {
    /// Opens a device at `src` (port 0: any free port) and enables the handshake.
    pub(crate) fn open(src: SocketAddr) -> Result<Net, i32> {
        let cfg = device_config(src)?;
        let dev = Device::open(cfg).map_err(|_| neg(fi::FI_EADDRINUSE))?;
        let pd = dev.alloc_pd();
        let cq = dev.create_cq();
        dev.enable_handshake(&pd, &cq, &cq)
            .map_err(|_| neg(fi::FI_EOTHER))?;
        Ok(Net { dev, pd, cq })
    }
}

/// A domain.
#[repr(C)]
pub(crate) struct Domain {
    fid: fi::fid_domain,
    magic: u64,
    pub(crate) inner: Arc<DomainInner>,
}
object!(Domain, fi::FI_CLASS_DOMAIN, 0x6272_6169_6464_6f6d);

static DOMAIN_FID_OPS: Table<fi::fi_ops> = fi_ops!(domain_close, no_bind, no_control);
static DOMAIN_OPS: Table<fi::fi_ops_domain> = Table(fi::fi_ops_domain {
    size: std::mem::size_of::<fi::fi_ops_domain>(),
    av_open: Some(av_open),
    cq_open: Some(cq_open),
    endpoint: Some(crate::ep::endpoint_open),
    scalable_ep: Some(no_scalable_ep),
    cntr_open: Some(cntr_open),
    poll_open: Some(no_poll_open),
    stx_ctx: Some(no_stx_ctx),
    srx_ctx: Some(no_srx_ctx),
    query_atomic: Some(no_query_atomic),
    query_collective: Some(no_query_collective),
    endpoint2: Some(crate::ep::endpoint_open2),
});
static MR_OPS: Table<fi::fi_ops_mr> = Table(fi::fi_ops_mr {
    size: std::mem::size_of::<fi::fi_ops_mr>(),
    reg: Some(mr_reg),
    regv: Some(mr_regv),
    regattr: Some(mr_regattr),
});

/// Settings read from the environment: `BRAID_FI_PATHS` (paths per connection, default 4),
/// `BRAID_FI_DATAPATH` (`udp`, `uring`, `xdp`, `auto`; default `udp`),
/// `BRAID_FI_MAX_DATAGRAM` (default: from the source interface's MTU with the udp datapath,
/// else 1472), `BRAID_FI_BURST` (packets per path in a row, 1 to
/// 64; default 32), `BRAID_PROGRESS` (`thread` or `inline`; default inline).
fn device_config(src: SocketAddr) -> Result<DeviceConfig, i32> {
    let mut cfg = DeviceConfig::udp(src).paths(
        std::env::var("BRAID_FI_PATHS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4),
    );
    let datapath = std::env::var("BRAID_FI_DATAPATH").ok();
    if let Some(d) = &datapath {
        cfg = cfg.datapath(d.parse().map_err(|_| neg(fi::FI_EINVAL))?);
    }
    if let Some(m) = std::env::var("BRAID_FI_MAX_DATAGRAM")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg = cfg.max_datagram(m);
    } else if datapath.as_deref().is_none_or(|d| d == "udp") {
        // Packets as large as the link takes, as RoCE uses its port's active MTU: the MTU of
        // the interface holding the source address (65536 on loopback: 65507-byte datagrams,
        // 16 per MiB instead of 713). Without a specific source address the route to each
        // peer is unknown, so the 1500-byte default stays. Peers need not agree: UDP sockets
        // with GRO (the udp datapath's default) receive into 64 KiB buffers, so a receiver
        // takes datagrams larger than those it sends.
        let mtu = match src.ip() {
            std::net::IpAddr::V4(ip) if !ip.is_unspecified() => crate::util::interface_mtu(ip),
            _ => None,
        };
        // A link below IPv6's minimum MTU keeps the default too.
        if let Some(d) = mtu
            .map(crate::util::datagram_for_mtu)
            .filter(|&d| d >= 1252)
        {
            cfg = cfg.max_datagram(d);
        }
    }
    // Eager messages wait in the receiver's provider buffers, which the provider reposts as
    // it runs: a sender that finds none retries (receiver not ready) rather than failing.
    // The provider drives the device in every call (fi_cq_read, posts) and, for
    // FI_PROGRESS_AUTO, from its own thread, so its polls drive the datapath and the engine
    // too (run to completion) instead of waiting for the device's progress thread, which stays
    // as the fallback while nobody polls. `BRAID_PROGRESS=thread` restores the hand-off.
    if std::env::var_os("BRAID_PROGRESS").is_none() {
        cfg = cfg.progress(Progress::Inline);
    }
    // Burst spraying: a rendezvous READ answers with hundreds of packets at once, and runs
    // of `PROVIDER_BURST` same-path packets leave as one UDP GSO send (one syscall and one
    // trip down the stack instead of one each), which is what a 1 MiB message costs here.
    cfg.engine.burst = env_num("BRAID_FI_BURST").map_or(PROVIDER_BURST, |b| b.clamp(1, 64) as u16);
    cfg.engine.rnr_retry_limit = braid::RNR_RETRY_FOREVER;
    cfg.engine.rnr_timer_ns = 100_000;
    // A peer that is merely slow (a loaded host) stays connected: the engine's retry budget
    // is a time without any sign of life from the peer (`retry_timeout_ns`, seconds by
    // default), not a count of timeouts, so no override is needed here.
    Ok(cfg)
}

/// The endpoints still open in a bound list.
fn upgrade(eps: &Mutex<Vec<Weak<EpInner>>>) -> Vec<Arc<EpInner>> {
    eps.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect()
}

/// Consecutive packets a provider QP sends on one path (`EndpointConfig::burst`). Chosen by
/// fi_pingpong on the veth pair (bench/results/libfabric-burst-2026-12-03.md): 32 is faster
/// than 16 at 1 MiB and even at 64 KiB; 44 (braid-perf's bandwidth default) is slower at
/// 64 KiB, where one burst holds the whole message.
const PROVIDER_BURST: u16 = 32;

/// A number from the environment variable `name`, if set and valid.
fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

unsafe extern "C" fn domain_open(
    fabric: *mut fi::fid_fabric,
    info: *mut fi::fi_info,
    domain: *mut *mut fi::fid_domain,
    context: *mut c_void,
) -> i32 {
    // SAFETY: forwarded.
    unsafe { domain_open2(fabric, info, domain, 0, context) }
}

unsafe extern "C" fn domain_open2(
    fabric: *mut fi::fid_fabric,
    info: *mut fi::fi_info,
    domain: *mut *mut fi::fid_domain,
    flags: u64,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        if let Err(e) = unsafe { get::<Fabric>(fabric.cast()) } {
            return e;
        }
        if domain.is_null() || flags != 0 {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: info is null or valid by contract.
        let Some(spec) = (unsafe { crate::info::read_info(info) }) else {
            return neg(fi::FI_EINVAL);
        };
        let net = match Net::open(spec.src) {
            Ok(n) => Arc::new(n),
            Err(e) => return e,
        };
        let obj = Box::new(Domain {
            fid: fi::fid_domain {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_DOMAIN as usize,
                    context,
                    ops: DOMAIN_FID_OPS.ptr(),
                },
                ops: DOMAIN_OPS.ptr(),
                mr: MR_OPS.ptr(),
            },
            magic: Domain::MAGIC,
            inner: Arc::new(DomainInner {
                net,
                spec,
                eps: AtomicUsize::new(0),
                primary_taken: AtomicBool::new(false),
                children: AtomicUsize::new(0),
            }),
        });
        // SAFETY: domain is non-null (checked).
        unsafe { hand_out(obj, domain) };
        0
    })
}

unsafe extern "C" fn domain_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let d = match unsafe { get::<Domain>(fid) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        if d.inner.eps.load(Ordering::Acquire) > 0 || d.inner.children.load(Ordering::Acquire) > 0 {
            return neg(fi::FI_EBUSY);
        }
        // SAFETY: validated above; closing gives up the handle.
        unsafe { free::<Domain>(fid, |d| d.magic = 0) };
        0
    })
}

unsafe extern "C" fn no_scalable_ep(
    _: *mut fi::fid_domain,
    _: *mut fi::fi_info,
    _: *mut *mut fi::fid_ep,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_poll_open(
    _: *mut fi::fid_domain,
    _: *mut fi::fi_poll_attr,
    _: *mut *mut fi::fid_poll,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_stx_ctx(
    _: *mut fi::fid_domain,
    _: *mut fi::fi_tx_attr,
    _: *mut *mut fi::fid_stx,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_srx_ctx(
    _: *mut fi::fid_domain,
    _: *mut fi::fi_rx_attr,
    _: *mut *mut fi::fid_ep,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
/// `fi_query_atomic`: 64-bit SUM (also fetching), ATOMIC_READ and CSWAP, one element.
unsafe extern "C" fn no_query_atomic(
    domain: *mut fi::fid_domain,
    datatype: fi::fi_datatype,
    op: fi::fi_op,
    attr: *mut fi::fi_atomic_attr,
    flags: u64,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        if let Err(e) = unsafe { get::<Domain>(domain.cast()) } {
            return e;
        }
        if datatype != fi::FI_UINT64 && datatype != fi::FI_INT64 {
            return neg(fi::FI_EOPNOTSUPP);
        }
        let fetch = flags & fi::FI_FETCH_ATOMIC != 0;
        let compare = flags & fi::FI_COMPARE_ATOMIC != 0;
        let ok = match op {
            fi::FI_SUM => !compare,
            fi::FI_ATOMIC_READ => fetch && !compare,
            fi::FI_CSWAP => compare,
            _ => false,
        };
        if !ok {
            return neg(fi::FI_EOPNOTSUPP);
        }
        // SAFETY: null or writable by contract.
        if let Some(a) = unsafe { attr.as_mut() } {
            a.size = 8;
            a.count = 1;
        }
        0
    })
}
unsafe extern "C" fn no_query_collective(
    _: *mut fi::fid_domain,
    _: fi::fi_collective_op,
    _: *mut fi::fi_collective_attr,
    _: u64,
) -> i32 {
    neg(fi::FI_ENOSYS)
}

// ---------------------------------------------------------------------------------------------

/// A registered memory region: a Braid region over the application's memory. Its key is the
/// Braid remote key; its descriptor is the object itself.
#[repr(C)]
pub(crate) struct Mr {
    fid: fi::fid_mr,
    magic: u64,
    pub(crate) mr: MemoryRegion,
    pub(crate) base: usize,
    dom: Arc<DomainInner>,
}
object!(Mr, fi::FI_CLASS_MR, 0x6272_6169_646d_7200);

static MR_FID_OPS: Table<fi::fi_ops> = fi_ops!(mr_close, mr_bind, no_control);

unsafe extern "C" fn mr_reg(
    fid: *mut fi::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fi::fid_mr,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        let _ = (offset, requested_key);
        // SAFETY: validated by get().
        let d = match unsafe { get::<Domain>(fid) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        if mr.is_null() || (buf.is_null() && len > 0) || flags != 0 || len == 0 {
            return neg(fi::FI_EINVAL);
        }
        if d.inner.spec.virt_addr() && len > crate::info::VIRT_MR_MAX {
            // Virtual-address keys carry 32 bits of the base (see `Spec::virt_addr`).
            return neg(fi::FI_EINVAL);
        }
        let mut acc = Access::LOCAL_WRITE;
        if access & fi::FI_REMOTE_READ as u64 != 0 {
            acc = acc | Access::REMOTE_READ;
        }
        if access & fi::FI_REMOTE_WRITE as u64 != 0 {
            // Atomics are remote writes to libfabric.
            acc = acc | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        }
        // SAFETY: registering application memory is fi_mr_reg's contract: the buffer stays
        // valid until the region is closed, and while remote peers may access it the
        // application treats it as shared with the NIC (here, Braid's progress thread).
        let region = unsafe { d.inner.net.pd.register_raw(buf.cast_mut().cast(), len, acc) };
        let region = match region {
            Ok(r) => r,
            Err(_) => return neg(fi::FI_ENOMEM),
        };
        let key = if d.inner.spec.virt_addr() {
            crate::info::virt_key(region.rkey(), buf as usize)
        } else {
            u64::from(region.rkey())
        };
        let obj = Box::new(Mr {
            fid: fi::fid_mr {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_MR as usize,
                    context,
                    ops: MR_FID_OPS.ptr(),
                },
                mem_desc: std::ptr::null_mut(),
                key,
            },
            magic: Mr::MAGIC,
            mr: region,
            base: buf as usize,
            dom: d.inner.clone(),
        });
        d.inner.children.fetch_add(1, Ordering::AcqRel);
        let p = Box::into_raw(obj);
        // SAFETY: p is a fresh Box; the descriptor is the object itself; mr is non-null.
        unsafe {
            (*p).fid.mem_desc = p.cast();
            *mr = p.cast();
        }
        0
    })
}

unsafe extern "C" fn mr_regv(
    fid: *mut fi::fid,
    iov: *const fi::iovec,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fi::fid_mr,
    context: *mut c_void,
) -> i32 {
    if count != 1 || iov.is_null() {
        return neg(fi::FI_EINVAL);
    }
    // SAFETY: iov has one entry (checked non-null, count 1).
    let v = unsafe { &*iov };
    // SAFETY: forwarded.
    unsafe {
        mr_reg(
            fid,
            v.iov_base,
            v.iov_len,
            access,
            offset,
            requested_key,
            flags,
            mr,
            context,
        )
    }
}

unsafe extern "C" fn mr_regattr(
    fid: *mut fi::fid,
    attr: *const fi::fi_mr_attr,
    flags: u64,
    mr: *mut *mut fi::fid_mr,
) -> i32 {
    if attr.is_null() {
        return neg(fi::FI_EINVAL);
    }
    // SAFETY: non-null, valid by contract.
    let a = unsafe { &*attr };
    if a.iface != fi::FI_HMEM_SYSTEM {
        return neg(fi::FI_EOPNOTSUPP);
    }
    // SAFETY: forwarded.
    unsafe {
        mr_regv(
            fid,
            a.mr_iov,
            a.iov_count,
            a.access,
            a.offset,
            a.requested_key,
            flags,
            mr,
            a.context,
        )
    }
}

unsafe extern "C" fn mr_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let m = match unsafe { get::<Mr>(fid) } {
            Ok(m) => m,
            Err(e) => return e,
        };
        m.dom.children.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: validated; closing gives up the handle.
        unsafe { free::<Mr>(fid, |m| m.magic = 0) };
        0
    })
}

/// Binding a region to an endpoint (FI_MR_ENDPOINT) is not needed here: accepted. Binding
/// it to a counter (a per-region remote-write counter) is not implemented: the remote
/// events of FI_RMA_EVENT are counted per endpoint, so such a counter would never move.
unsafe extern "C" fn mr_bind(fid: *mut fi::fid, bfid: *mut fi::fid, _: u64) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        if let Err(e) = unsafe { get::<Mr>(fid) } {
            return e;
        }
        // SAFETY: bfid is null or a fid by contract; only its class is read.
        match unsafe { bfid.as_ref() } {
            None => neg(fi::FI_EINVAL),
            Some(b) if b.fclass == fi::FI_CLASS_CNTR as usize => neg(fi::FI_ENOSYS),
            Some(_) => 0,
        }
    })
}

// ---------------------------------------------------------------------------------------------

/// Entries by index (`None` once removed), and the first index of each address.
type AvEntries = (Vec<Option<SocketAddr>>, HashMap<SocketAddr, u64>);

/// An address vector's entries: index → peer device address, and back.
#[derive(Default)]
pub(crate) struct AvInner {
    pub(crate) entries: RwLock<AvEntries>,
}

impl AvInner {
    pub(crate) fn lookup(&self, a: u64) -> Option<SocketAddr> {
        let e = self.entries.read().unwrap_or_else(|e| e.into_inner());
        usize::try_from(a)
            .ok()
            .and_then(|i| e.0.get(i).copied().flatten())
    }
    pub(crate) fn reverse(&self, addr: SocketAddr) -> u64 {
        let e = self.entries.read().unwrap_or_else(|e| e.into_inner());
        e.1.get(&addr).copied().unwrap_or(FI_ADDR_NOTAVAIL)
    }
    fn insert(&self, addr: SocketAddr) -> u64 {
        let mut e = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let i = e.0.len() as u64;
        e.0.push(Some(addr));
        e.1.entry(addr).or_insert(i);
        i
    }
}

/// An address vector (table and map alike: an fi_addr_t is the entry's index).
#[repr(C)]
pub(crate) struct Av {
    fid: fi::fid_av,
    magic: u64,
    pub(crate) inner: Arc<AvInner>,
    dom: Arc<DomainInner>,
}
object!(Av, fi::FI_CLASS_AV, 0x6272_6169_6461_7600);

static AV_FID_OPS: Table<fi::fi_ops> = fi_ops!(av_close, no_bind, no_control);
static AV_OPS: Table<fi::fi_ops_av> = Table(fi::fi_ops_av {
    size: std::mem::size_of::<fi::fi_ops_av>(),
    insert: Some(av_insert),
    insertsvc: Some(av_insertsvc),
    insertsym: Some(av_insertsym),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: Some(no_av_set),
});

unsafe extern "C" fn av_open(
    domain: *mut fi::fid_domain,
    attr: *mut fi::fi_av_attr,
    av: *mut *mut fi::fid_av,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let d = match unsafe { get::<Domain>(domain.cast()) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        if av.is_null() || attr.is_null() {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: non-null, valid by contract.
        let a = unsafe { &*attr };
        if !matches!(a.type_, fi::FI_AV_UNSPEC | fi::FI_AV_MAP | fi::FI_AV_TABLE) {
            return neg(fi::FI_EINVAL);
        }
        if a.flags & (fi::FI_EVENT as u64 | fi::FI_READ as u64 | fi::FI_SYMMETRIC) != 0
            || !a.name.is_null()
            || a.rx_ctx_bits != 0
        {
            // Asynchronous inserts, shared named AVs and scalable endpoints.
            return neg(fi::FI_ENOSYS);
        }
        let obj = Box::new(Av {
            fid: fi::fid_av {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_AV as usize,
                    context,
                    ops: AV_FID_OPS.ptr(),
                },
                ops: AV_OPS.ptr(),
            },
            magic: Av::MAGIC,
            inner: Arc::new(AvInner::default()),
            dom: d.inner.clone(),
        });
        d.inner.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: av is non-null (checked).
        unsafe { hand_out(obj, av) };
        0
    })
}

unsafe extern "C" fn av_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let a = match unsafe { get::<Av>(fid) } {
            Ok(a) => a,
            Err(e) => return e,
        };
        a.dom.children.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: validated; closing gives up the handle.
        unsafe { free::<Av>(fid, |a| a.magic = 0) };
        0
    })
}

const SOCKADDR_IN_LEN: usize = std::mem::size_of::<libc::sockaddr_in>();

unsafe extern "C" fn av_insert(
    av: *mut fi::fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut u64,
    flags: u64,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let a = match unsafe { get::<Av>(av.cast()) } {
            Ok(a) => a,
            Err(e) => return e,
        };
        if flags & !(fi::FI_MORE as u64 | fi::FI_SYNC_ERR) != 0 {
            return neg(fi::FI_EBADFLAGS);
        }
        // FI_SYNC_ERR: `context` is an array of `count` ints, one result per address (0 or
        // a positive error code).
        let sync_err = flags & fi::FI_SYNC_ERR != 0;
        if (addr.is_null() && count > 0) || (sync_err && context.is_null()) {
            return neg(fi::FI_EINVAL);
        }
        if count > i32::MAX as usize {
            return neg(fi::FI_EINVAL);
        }
        let mut n = 0;
        for i in 0..count {
            // SAFETY: addr holds `count` sockaddr_in entries (our address format).
            let parsed = unsafe {
                from_sockaddr(addr.cast::<u8>().add(i * SOCKADDR_IN_LEN), SOCKADDR_IN_LEN)
            }
            .filter(|s| !s.ip().is_unspecified() && s.port() != 0);
            let out = match parsed {
                Some(s) => {
                    n += 1;
                    a.inner.insert(s)
                }
                None => FI_ADDR_NOTAVAIL,
            };
            if !fi_addr.is_null() {
                // SAFETY: fi_addr has `count` slots by contract.
                unsafe { *fi_addr.add(i) = out };
            }
            if sync_err {
                let code = if out == FI_ADDR_NOTAVAIL {
                    fi::FI_EINVAL as i32
                } else {
                    0
                };
                // SAFETY: with FI_SYNC_ERR, context holds `count` ints by contract (non-null,
                // checked).
                unsafe { context.cast::<i32>().add(i).write_unaligned(code) };
            }
        }
        n
    })
}

unsafe extern "C" fn av_insertsvc(
    av: *mut fi::fid_av,
    node: *const libc::c_char,
    service: *const libc::c_char,
    fi_addr: *mut u64,
    flags: u64,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: strings are null or C strings.
        let (Some(n), Some(s)) = (unsafe { c_str(node) }, unsafe { c_str(service) }) else {
            return neg(fi::FI_EINVAL);
        };
        let Ok(port) = s.parse::<u16>() else {
            return neg(fi::FI_EINVAL);
        };
        use std::net::ToSocketAddrs;
        let Some(sa) = (n, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.find(|a| a.is_ipv4()))
        else {
            return 0;
        };
        let raw = to_sockaddr_in(sa);
        // SAFETY: forwarded with one valid sockaddr_in.
        unsafe {
            av_insert(
                av,
                std::ptr::addr_of!(raw).cast(),
                1,
                fi_addr,
                flags,
                context,
            )
        }
    })
}

unsafe extern "C" fn av_insertsym(
    _: *mut fi::fid_av,
    _: *const libc::c_char,
    _: usize,
    _: *const libc::c_char,
    _: usize,
    _: *mut u64,
    _: u64,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}

unsafe extern "C" fn av_remove(
    av: *mut fi::fid_av,
    fi_addr: *mut u64,
    count: usize,
    _: u64,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let a = match unsafe { get::<Av>(av.cast()) } {
            Ok(a) => a,
            Err(e) => return e,
        };
        if fi_addr.is_null() && count > 0 {
            return neg(fi::FI_EINVAL);
        }
        let mut e = a.inner.entries.write().unwrap_or_else(|e| e.into_inner());
        for i in 0..count {
            // SAFETY: fi_addr has `count` entries.
            let idx = unsafe { *fi_addr.add(i) };
            let Some(slot) = usize::try_from(idx).ok().and_then(|i| e.0.get_mut(i)) else {
                return neg(fi::FI_EINVAL);
            };
            if let Some(s) = slot.take()
                && e.1.get(&s) == Some(&idx)
            {
                e.1.remove(&s);
            }
        }
        0
    })
}

unsafe extern "C" fn av_lookup(
    av: *mut fi::fid_av,
    fi_addr: u64,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let a = match unsafe { get::<Av>(av.cast()) } {
            Ok(a) => a,
            Err(e) => return e,
        };
        if addrlen.is_null() {
            return neg(fi::FI_EINVAL);
        }
        let Some(s) = a.inner.lookup(fi_addr) else {
            return neg(fi::FI_EINVAL);
        };
        let raw = to_sockaddr_in(s);
        // SAFETY: addrlen is non-null; addr has *addrlen writable bytes by contract.
        unsafe {
            let n = (*addrlen).min(SOCKADDR_IN_LEN);
            if !addr.is_null() {
                std::ptr::copy_nonoverlapping(
                    std::ptr::addr_of!(raw).cast::<u8>(),
                    addr.cast::<u8>(),
                    n,
                );
            }
            *addrlen = SOCKADDR_IN_LEN;
        }
        0
    })
}

/// Writes `s` (truncated, NUL-terminated) into `buf` of `*len` bytes; sets `*len` to the
/// length it needs.
///
/// # Safety
/// `len` is non-null; `buf` has `*len` writable bytes.
pub(crate) unsafe fn write_str(s: &str, buf: *mut libc::c_char, len: *mut usize) {
    // SAFETY: by contract.
    unsafe {
        let room = *len;
        if !buf.is_null() && room > 0 {
            let n = s.len().min(room - 1);
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
        *len = s.len() + 1;
    }
}

unsafe extern "C" fn av_straddr(
    av: *mut fi::fid_av,
    addr: *const c_void,
    buf: *mut libc::c_char,
    len: *mut usize,
) -> *const libc::c_char {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: validated by get().
        if unsafe { get::<Av>(av.cast()) }.is_err() || len.is_null() {
            return std::ptr::null();
        }
        // SAFETY: addr holds one sockaddr_in of our format (or is refused).
        let s = match unsafe { from_sockaddr(addr.cast(), SOCKADDR_IN_LEN) } {
            Some(s) => format!("fi_sockaddr_in://{s}"),
            None => "fi_addr_format_unknown".to_string(),
        };
        // SAFETY: len non-null; buf has *len bytes by contract.
        unsafe { write_str(&s, buf, len) };
        buf.cast_const()
    });
    r.unwrap_or(std::ptr::null())
}

unsafe extern "C" fn no_av_set(
    _: *mut fi::fid_av,
    _: *mut fi::fi_av_set_attr,
    _: *mut *mut fi::fid_av_set,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}

// ---------------------------------------------------------------------------------------------

/// One completion, in the widest format; narrowed when read.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) context: *mut c_void,
    pub(crate) flags: u64,
    pub(crate) len: usize,
    pub(crate) buf: *mut c_void,
    pub(crate) data: u64,
    pub(crate) tag: u64,
    pub(crate) src: u64,
    /// `(err, olen)` for an error entry.
    pub(crate) err: Option<(u32, usize)>,
}
// SAFETY: the raw pointers are the application's context and buffer values, handed back
// verbatim; the provider never dereferences them.
unsafe impl Send for Entry {}

impl Entry {
    pub(crate) fn ok(context: *mut c_void, flags: u64, len: usize) -> Entry {
        Entry {
            context,
            flags,
            len,
            buf: std::ptr::null_mut(),
            data: 0,
            tag: 0,
            src: FI_ADDR_NOTAVAIL,
            err: None,
        }
    }
}

/// A completion queue's shared state.
pub(crate) struct CqInner {
    format: fi::fi_cq_format,
    q: Mutex<VecDeque<Entry>>,
    cond: Condvar,
    /// An eventfd, readable while the queue holds entries (FI_WAIT_FD).
    fd: Option<i32>,
    signaled: AtomicBool,
    /// Endpoints bound to it, which `progress` runs.
    pub(crate) eps: Mutex<Vec<Weak<EpInner>>>,
}

impl CqInner {
    /// Runs progress on every endpoint bound to the queue.
    pub(crate) fn progress(&self) {
        for ep in upgrade(&self.eps) {
            ep.progress();
        }
    }

    /// As [`progress`](Self::progress), for an application about to block (`fi_trywait`):
    /// the endpoints' provider threads take over at once.
    pub(crate) fn progress_then_wait(&self) {
        for ep in upgrade(&self.eps) {
            ep.progress_then_wait();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    pub(crate) fn push(&self, e: Entry) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = q.is_empty();
        q.push_back(e);
        drop(q);
        if was_empty && let Some(fd) = self.fd {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a local to our own eventfd.
            unsafe { libc::write(fd, std::ptr::addr_of!(one).cast(), 8) };
        }
        self.cond.notify_all();
    }

    fn entry_size(&self) -> usize {
        match self.format {
            fi::FI_CQ_FORMAT_CONTEXT => std::mem::size_of::<fi::fi_cq_entry>(),
            fi::FI_CQ_FORMAT_MSG => std::mem::size_of::<fi::fi_cq_msg_entry>(),
            fi::FI_CQ_FORMAT_DATA => std::mem::size_of::<fi::fi_cq_data_entry>(),
            _ => std::mem::size_of::<fi::fi_cq_tagged_entry>(),
        }
    }

    /// Moves up to `count` successful entries to `buf` (and their sources to `src`).
    ///
    /// # Safety
    /// `buf` has room for `count` entries of the queue's format; `src` is null or has
    /// `count` slots.
    unsafe fn read(&self, buf: *mut c_void, count: usize, src: *mut u64) -> isize {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            return -(fi::FI_EAGAIN as isize);
        }
        if q.front().is_some_and(|e| e.err.is_some()) {
            return -(fi::FI_EAVAIL as isize);
        }
        let size = self.entry_size();
        let mut n = 0;
        while n < count {
            let Some(e) = q.front().copied() else { break };
            if e.err.is_some() {
                break;
            }
            q.pop_front();
            let full = fi::fi_cq_tagged_entry {
                op_context: e.context,
                flags: e.flags,
                len: e.len,
                buf: e.buf,
                data: e.data,
                tag: e.tag,
            };
            // SAFETY: buf has room for `count` entries of `size` bytes; the tagged entry
            // starts with the fields of every narrower format, in the same layout.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    std::ptr::addr_of!(full).cast::<u8>(),
                    buf.cast::<u8>().add(n * size),
                    size,
                );
                if !src.is_null() {
                    *src.add(n) = e.src;
                }
            }
            n += 1;
        }
        if q.is_empty() {
            self.drain_fd();
        }
        n as isize
    }

    fn drain_fd(&self) {
        if let Some(fd) = self.fd {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a local from our own non-blocking eventfd.
            unsafe { libc::read(fd, std::ptr::addr_of_mut!(v).cast(), 8) };
        }
    }
}

/// A completion queue.
#[repr(C)]
pub(crate) struct Cq {
    fid: fi::fid_cq,
    magic: u64,
    pub(crate) inner: Arc<CqInner>,
    dom: Arc<DomainInner>,
}
object!(Cq, fi::FI_CLASS_CQ, 0x6272_6169_6463_7100);

static CQ_FID_OPS: Table<fi::fi_ops> = fi_ops!(cq_close, no_bind, cq_control);
static CQ_OPS: Table<fi::fi_ops_cq> = Table(fi::fi_ops_cq {
    size: std::mem::size_of::<fi::fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(cq_signal),
    strerror: Some(cq_strerror),
});

unsafe extern "C" fn cq_open(
    domain: *mut fi::fid_domain,
    attr: *mut fi::fi_cq_attr,
    cq: *mut *mut fi::fid_cq,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let d = match unsafe { get::<Domain>(domain.cast()) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        if cq.is_null() || attr.is_null() {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: non-null, valid by contract.
        let a = unsafe { &*attr };
        let format = match a.format {
            fi::FI_CQ_FORMAT_UNSPEC => fi::FI_CQ_FORMAT_CONTEXT,
            f @ (fi::FI_CQ_FORMAT_CONTEXT
            | fi::FI_CQ_FORMAT_MSG
            | fi::FI_CQ_FORMAT_DATA
            | fi::FI_CQ_FORMAT_TAGGED) => f,
            _ => return neg(fi::FI_ENOSYS),
        };
        let fd = match a.wait_obj {
            fi::FI_WAIT_NONE | fi::FI_WAIT_UNSPEC | fi::FI_WAIT_MUTEX_COND | fi::FI_WAIT_YIELD => {
                None
            }
            fi::FI_WAIT_FD => {
                // SAFETY: plain syscall.
                let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                if fd < 0 {
                    return neg(fi::FI_ENOMEM);
                }
                Some(fd)
            }
            _ => return neg(fi::FI_ENOSYS),
        };
        if a.wait_cond != fi::FI_CQ_COND_NONE && a.wait_cond != fi::FI_CQ_COND_THRESHOLD {
            return neg(fi::FI_ENOSYS);
        }
        let obj = Box::new(Cq {
            fid: fi::fid_cq {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_CQ as usize,
                    context,
                    ops: CQ_FID_OPS.ptr(),
                },
                ops: CQ_OPS.ptr(),
            },
            magic: Cq::MAGIC,
            inner: Arc::new(CqInner {
                format,
                q: Mutex::new(VecDeque::new()),
                cond: Condvar::new(),
                fd,
                signaled: AtomicBool::new(false),
                eps: Mutex::new(Vec::new()),
            }),
            dom: d.inner.clone(),
        });
        d.inner.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: cq is non-null (checked).
        unsafe { hand_out(obj, cq) };
        0
    })
}

unsafe extern "C" fn cq_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let c = match unsafe { get::<Cq>(fid) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if c.inner
            .eps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|w| w.strong_count() > 0)
        {
            return neg(fi::FI_EBUSY);
        }
        c.dom.children.fetch_sub(1, Ordering::AcqRel);
        if let Some(fd) = c.inner.fd {
            // SAFETY: our own eventfd, closed once.
            unsafe { libc::close(fd) };
        }
        // SAFETY: validated; closing gives up the handle.
        unsafe { free::<Cq>(fid, |c| c.magic = 0) };
        0
    })
}

unsafe extern "C" fn cq_control(fid: *mut fi::fid, command: i32, arg: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let c = match unsafe { get::<Cq>(fid) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        match command as u32 {
            fi::FI_GETWAIT => {
                let Some(fd) = c.inner.fd else {
                    return neg(fi::FI_ENODATA);
                };
                if arg.is_null() {
                    return neg(fi::FI_EINVAL);
                }
                // SAFETY: FI_GETWAIT with FI_WAIT_FD takes an int*.
                unsafe { *arg.cast::<i32>() = fd };
                0
            }
            fi::FI_GETWAITOBJ => {
                if arg.is_null() {
                    return neg(fi::FI_EINVAL);
                }
                let w = if c.inner.fd.is_some() {
                    fi::FI_WAIT_FD
                } else {
                    fi::FI_WAIT_NONE
                };
                // SAFETY: FI_GETWAITOBJ takes an enum fi_wait_obj*.
                unsafe { *arg.cast::<fi::fi_wait_obj>() = w };
                0
            }
            _ => neg(fi::FI_ENOSYS),
        }
    })
}

unsafe extern "C" fn cq_read(cq: *mut fi::fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: forwarded.
    unsafe { cq_readfrom(cq, buf, count, std::ptr::null_mut()) }
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut fi::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let c = match unsafe { get::<Cq>(cq.cast()) } {
            Ok(c) => c,
            Err(e) => return e as isize,
        };
        if buf.is_null() && count > 0 {
            return -(fi::FI_EINVAL as isize);
        }
        c.inner.progress();
        // SAFETY: buf has `count` entries of the CQ's format by contract; src null or sized.
        unsafe { c.inner.read(buf, count, src) }
    })
}

unsafe extern "C" fn cq_readerr(
    cq: *mut fi::fid_cq,
    buf: *mut fi::fi_cq_err_entry,
    _: u64,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let c = match unsafe { get::<Cq>(cq.cast()) } {
            Ok(c) => c,
            Err(e) => return e as isize,
        };
        if buf.is_null() {
            return -(fi::FI_EINVAL as isize);
        }
        c.inner.progress();
        let mut q = c.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        let Some((err, olen)) = q.front().and_then(|e| e.err) else {
            return -(fi::FI_EAGAIN as isize);
        };
        let Some(e) = q.pop_front() else {
            return -(fi::FI_EAGAIN as isize);
        };
        if q.is_empty() {
            c.inner.drain_fd();
        }
        // SAFETY: buf is non-null and points to an fi_cq_err_entry by contract. err_data is
        // left null with size 0: the provider has no extra error data.
        unsafe {
            let b = &mut *buf;
            b.op_context = e.context;
            b.flags = e.flags;
            b.len = e.len;
            b.buf = e.buf;
            b.data = e.data;
            b.tag = e.tag;
            b.olen = olen;
            b.err = err as i32;
            b.prov_errno = err as i32;
            b.err_data = std::ptr::null_mut();
            b.err_data_size = 0;
        }
        1
    })
}

unsafe extern "C" fn cq_sread(
    cq: *mut fi::fid_cq,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    timeout: i32,
) -> isize {
    // SAFETY: forwarded.
    unsafe { cq_sreadfrom(cq, buf, count, std::ptr::null_mut(), cond, timeout) }
}

/// Blocks until an entry is there, `timeout` ms pass (negative: forever) or the CQ is
/// signalled; progress runs every millisecond meanwhile.
unsafe extern "C" fn cq_sreadfrom(
    cq: *mut fi::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    _cond: *const c_void,
    timeout: i32,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let c = match unsafe { get::<Cq>(cq.cast()) } {
            Ok(c) => c,
            Err(e) => return e as isize,
        };
        if buf.is_null() && count > 0 {
            return -(fi::FI_EINVAL as isize);
        }
        let deadline =
            (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            // A blocking wait: the provider thread (FI_PROGRESS_AUTO) drives meanwhile.
            c.inner.progress_then_wait();
            // SAFETY: as in cq_readfrom.
            let r = unsafe { c.inner.read(buf, count, src) };
            if r != -(fi::FI_EAGAIN as isize) {
                return r;
            }
            if c.inner.signaled.swap(false, Ordering::AcqRel) {
                return -(fi::FI_EAGAIN as isize);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => l,
                    None => return -(fi::FI_EAGAIN as isize),
                },
                None => Duration::from_millis(1),
            };
            let q = c.inner.q.lock().unwrap_or_else(|e| e.into_inner());
            if q.is_empty() {
                let _ = c
                    .inner
                    .cond
                    .wait_timeout(q, left.min(Duration::from_millis(1)));
            }
        }
    })
}

unsafe extern "C" fn cq_signal(cq: *mut fi::fid_cq) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let c = match unsafe { get::<Cq>(cq.cast()) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        c.inner.signaled.store(true, Ordering::Release);
        c.inner.cond.notify_all();
        0
    })
}

/// The text for a provider error number (the provider reports libfabric codes as its own).
pub(crate) fn errno_text(prov_errno: i32) -> &'static std::ffi::CStr {
    match prov_errno.unsigned_abs() {
        fi::FI_ETRUNC => c"message truncated: the receive buffer is too small",
        fi::FI_EFAULT => c"a local buffer could not be used",
        fi::FI_EACCES => c"the peer refused the key, bounds or rights",
        fi::FI_EINVAL => c"the peer found the request invalid",
        fi::FI_EREMOTEIO => c"the peer could not perform the operation",
        fi::FI_ETIMEDOUT => c"no answer from the peer (retries exhausted)",
        fi::FI_ECANCELED => c"canceled or flushed: not executed",
        fi::FI_EHOSTUNREACH => c"the peer could not be reached",
        _ => c"braid provider error",
    }
}

unsafe extern "C" fn cq_strerror(
    _: *mut fi::fid_cq,
    prov_errno: i32,
    _: *const c_void,
    buf: *mut libc::c_char,
    len: usize,
) -> *const libc::c_char {
    let text = errno_text(prov_errno);
    if !buf.is_null() && len > 0 {
        let mut l = len;
        // SAFETY: buf has `len` writable bytes by contract.
        unsafe { write_str(text.to_str().unwrap_or(""), buf, &mut l) };
    }
    text.as_ptr()
}

// ---------------------------------------------------------------------------------------------

/// A counter's shared state.
pub(crate) struct CntrInner {
    value: AtomicU64,
    err: AtomicU64,
    lock: Mutex<()>,
    cond: Condvar,
    pub(crate) eps: Mutex<Vec<Weak<EpInner>>>,
}

impl CntrInner {
    pub(crate) fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::AcqRel);
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cond.notify_all();
    }
    pub(crate) fn add_err(&self, n: u64) {
        self.err.fetch_add(n, Ordering::AcqRel);
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cond.notify_all();
    }
    pub(crate) fn progress(&self) {
        for ep in upgrade(&self.eps) {
            ep.progress();
        }
    }

    /// As [`CqInner::progress_then_wait`].
    pub(crate) fn progress_then_wait(&self) {
        for ep in upgrade(&self.eps) {
            ep.progress_then_wait();
        }
    }
}

/// A counter.
#[repr(C)]
pub(crate) struct Cntr {
    fid: fi::fid_cntr,
    magic: u64,
    pub(crate) inner: Arc<CntrInner>,
    dom: Arc<DomainInner>,
}
object!(Cntr, fi::FI_CLASS_CNTR, 0x6272_6169_6463_6e74);

static CNTR_FID_OPS: Table<fi::fi_ops> = fi_ops!(cntr_close, no_bind, no_control);
static CNTR_OPS: Table<fi::fi_ops_cntr> = Table(fi::fi_ops_cntr {
    size: std::mem::size_of::<fi::fi_ops_cntr>(),
    read: Some(cntr_read),
    readerr: Some(cntr_readerr),
    add: Some(cntr_add),
    set: Some(cntr_set),
    wait: Some(cntr_wait),
    adderr: Some(cntr_adderr),
    seterr: Some(cntr_seterr),
});

unsafe extern "C" fn cntr_open(
    domain: *mut fi::fid_domain,
    attr: *mut fi::fi_cntr_attr,
    cntr: *mut *mut fi::fid_cntr,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let d = match unsafe { get::<Domain>(domain.cast()) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        if cntr.is_null() {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: null or valid by contract.
        if let Some(a) = unsafe { attr.as_ref() }
            && (a.events != fi::FI_CNTR_EVENTS_COMP
                || !matches!(
                    a.wait_obj,
                    fi::FI_WAIT_NONE
                        | fi::FI_WAIT_UNSPEC
                        | fi::FI_WAIT_MUTEX_COND
                        | fi::FI_WAIT_YIELD
                ))
        {
            return neg(fi::FI_ENOSYS);
        }
        let obj = Box::new(Cntr {
            fid: fi::fid_cntr {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_CNTR as usize,
                    context,
                    ops: CNTR_FID_OPS.ptr(),
                },
                ops: CNTR_OPS.ptr(),
            },
            magic: Cntr::MAGIC,
            inner: Arc::new(CntrInner {
                value: AtomicU64::new(0),
                err: AtomicU64::new(0),
                lock: Mutex::new(()),
                cond: Condvar::new(),
                eps: Mutex::new(Vec::new()),
            }),
            dom: d.inner.clone(),
        });
        d.inner.children.fetch_add(1, Ordering::AcqRel);
        // SAFETY: non-null (checked).
        unsafe { hand_out(obj, cntr) };
        0
    })
}

unsafe extern "C" fn cntr_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let c = match unsafe { get::<Cntr>(fid) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if c.inner
            .eps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|w| w.strong_count() > 0)
        {
            return neg(fi::FI_EBUSY);
        }
        c.dom.children.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: validated; closing gives up the handle.
        unsafe { free::<Cntr>(fid, |c| c.magic = 0) };
        0
    })
}

macro_rules! cntr_get {
    ($p:expr, $err:expr) => {
        // SAFETY: validated by get().
        match unsafe { get::<Cntr>($p.cast()) } {
            Ok(c) => c,
            Err(_) => return $err,
        }
    };
}

unsafe extern "C" fn cntr_read(cntr: *mut fi::fid_cntr) -> u64 {
    let r = std::panic::catch_unwind(|| {
        let c = cntr_get!(cntr, 0);
        c.inner.progress();
        c.inner.value.load(Ordering::Acquire)
    });
    r.unwrap_or(0)
}
unsafe extern "C" fn cntr_readerr(cntr: *mut fi::fid_cntr) -> u64 {
    let r = std::panic::catch_unwind(|| {
        let c = cntr_get!(cntr, 0);
        c.inner.progress();
        c.inner.err.load(Ordering::Acquire)
    });
    r.unwrap_or(0)
}
unsafe extern "C" fn cntr_add(cntr: *mut fi::fid_cntr, v: u64) -> i32 {
    guard(|| {
        let c = cntr_get!(cntr, neg(fi::FI_EINVAL));
        c.inner.add(v);
        0
    })
}
unsafe extern "C" fn cntr_set(cntr: *mut fi::fid_cntr, v: u64) -> i32 {
    guard(|| {
        let c = cntr_get!(cntr, neg(fi::FI_EINVAL));
        c.inner.value.store(v, Ordering::Release);
        c.inner.add(0);
        0
    })
}
unsafe extern "C" fn cntr_adderr(cntr: *mut fi::fid_cntr, v: u64) -> i32 {
    guard(|| {
        let c = cntr_get!(cntr, neg(fi::FI_EINVAL));
        c.inner.add_err(v);
        0
    })
}
unsafe extern "C" fn cntr_seterr(cntr: *mut fi::fid_cntr, v: u64) -> i32 {
    guard(|| {
        let c = cntr_get!(cntr, neg(fi::FI_EINVAL));
        c.inner.err.store(v, Ordering::Release);
        c.inner.add_err(0);
        0
    })
}

/// `fi_cntr_wait`: until the value reaches `threshold` (0), an error is counted
/// (`-FI_EAVAIL`) or `timeout` ms pass (`-FI_ETIMEDOUT`; negative waits forever).
unsafe extern "C" fn cntr_wait(cntr: *mut fi::fid_cntr, threshold: u64, timeout: i32) -> i32 {
    guard(|| {
        let c = cntr_get!(cntr, neg(fi::FI_EINVAL));
        let err0 = c.inner.err.load(Ordering::Acquire);
        let deadline =
            (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            // A blocking wait: the provider thread (FI_PROGRESS_AUTO) drives meanwhile.
            c.inner.progress_then_wait();
            if c.inner.value.load(Ordering::Acquire) >= threshold {
                return 0;
            }
            if c.inner.err.load(Ordering::Acquire) != err0 {
                return neg(fi::FI_EAVAIL);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => l,
                    None => return neg(fi::FI_ETIMEDOUT),
                },
                None => Duration::from_millis(1),
            };
            let g = c.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
            let _ = c
                .inner
                .cond
                .wait_timeout(g, left.min(Duration::from_millis(1)));
        }
    })
}

// ---------------------------------------------------------------------------------------------

/// An event queue: entries the application writes, or errors the provider reports.
pub(crate) struct EqInner {
    q: Mutex<VecDeque<(u32, Vec<u8>, bool)>>,
    cond: Condvar,
}

/// An event queue.
#[repr(C)]
pub(crate) struct Eq {
    fid: fi::fid_eq,
    magic: u64,
    pub(crate) inner: Arc<EqInner>,
}
object!(Eq, fi::FI_CLASS_EQ, 0x6272_6169_6465_7100);

static EQ_FID_OPS: Table<fi::fi_ops> = fi_ops!(eq_close, no_bind, no_control);
static EQ_OPS: Table<fi::fi_ops_eq> = Table(fi::fi_ops_eq {
    size: std::mem::size_of::<fi::fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
});

/// Most entries an EQ holds; a write beyond is refused with -FI_EAGAIN.
const EQ_MAX: usize = 4096;

unsafe extern "C" fn eq_open(
    fabric: *mut fi::fid_fabric,
    attr: *mut fi::fi_eq_attr,
    eq: *mut *mut fi::fid_eq,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        if let Err(e) = unsafe { get::<Fabric>(fabric.cast()) } {
            return e;
        }
        if eq.is_null() {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: null or valid by contract.
        if let Some(a) = unsafe { attr.as_ref() }
            && !matches!(
                a.wait_obj,
                fi::FI_WAIT_NONE | fi::FI_WAIT_UNSPEC | fi::FI_WAIT_MUTEX_COND | fi::FI_WAIT_YIELD
            )
        {
            return neg(fi::FI_ENOSYS);
        }
        let obj = Box::new(Eq {
            fid: fi::fid_eq {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_EQ as usize,
                    context,
                    ops: EQ_FID_OPS.ptr(),
                },
                ops: EQ_OPS.ptr(),
            },
            magic: Eq::MAGIC,
            inner: Arc::new(EqInner {
                q: Mutex::new(VecDeque::new()),
                cond: Condvar::new(),
            }),
        });
        // SAFETY: non-null (checked).
        unsafe { hand_out(obj, eq) };
        0
    })
}

unsafe extern "C" fn eq_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        if let Err(e) = unsafe { get::<Eq>(fid) } {
            return e;
        }
        // SAFETY: validated; closing gives up the handle.
        unsafe { free::<Eq>(fid, |e| e.magic = 0) };
        0
    })
}

/// Reads the head entry (an error head gives -FI_EAVAIL).
///
/// # Safety
/// `event` is null or writable; `buf` has `len` writable bytes.
unsafe fn eq_take(
    inner: &EqInner,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    let mut q = inner.q.lock().unwrap_or_else(|e| e.into_inner());
    let Some((ev, bytes, is_err)) = q.front() else {
        return -(fi::FI_EAGAIN as isize);
    };
    if *is_err {
        return -(fi::FI_EAVAIL as isize);
    }
    if len < bytes.len() || (buf.is_null() && !bytes.is_empty()) {
        return -(fi::FI_ETOOSMALL as isize);
    }
    // SAFETY: by contract; buf has room (checked).
    unsafe {
        if !event.is_null() {
            *event = *ev;
        }
        if !bytes.is_empty() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        }
    }
    let n = bytes.len() as isize;
    if flags & fi::FI_PEEK as u64 == 0 {
        q.pop_front();
    }
    n
}

unsafe extern "C" fn eq_read(
    eq: *mut fi::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Eq>(eq.cast()) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        // SAFETY: forwarded contract.
        unsafe { eq_take(&e.inner, event, buf, len, flags) }
    })
}

unsafe extern "C" fn eq_readerr(
    eq: *mut fi::fid_eq,
    buf: *mut fi::fi_eq_err_entry,
    _: u64,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Eq>(eq.cast()) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        if buf.is_null() {
            return -(fi::FI_EINVAL as isize);
        }
        let mut q = e.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        if !q.front().is_some_and(|h| h.2) {
            return -(fi::FI_EAGAIN as isize);
        }
        let Some((_, bytes, _)) = q.pop_front() else {
            return -(fi::FI_EAGAIN as isize);
        };
        let n = bytes.len().min(std::mem::size_of::<fi::fi_eq_err_entry>());
        // SAFETY: buf points to an fi_eq_err_entry; `bytes` holds (a prefix of) one.
        unsafe {
            std::ptr::write_bytes(buf, 0, 1);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
        }
        std::mem::size_of::<fi::fi_eq_err_entry>() as isize
    })
}

unsafe extern "C" fn eq_write(
    eq: *mut fi::fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    flags: u64,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Eq>(eq.cast()) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        if (buf.is_null() && len > 0) || len > 1 << 16 {
            return -(fi::FI_EINVAL as isize);
        }
        let bytes = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: buf has len readable bytes by contract.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec()
        };
        let mut q = e.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= EQ_MAX {
            return -(fi::FI_EAGAIN as isize);
        }
        let _ = flags;
        q.push_back((event, bytes, false));
        e.inner.cond.notify_all();
        len as isize
    })
}

unsafe extern "C" fn eq_sread(
    eq: *mut fi::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: i32,
    flags: u64,
) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Eq>(eq.cast()) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        let deadline =
            (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            // SAFETY: forwarded contract.
            let r = unsafe { eq_take(&e.inner, event, buf, len, flags) };
            if r != -(fi::FI_EAGAIN as isize) {
                return r;
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => l,
                    None => return -(fi::FI_EAGAIN as isize),
                },
                None => Duration::from_millis(50),
            };
            let q = e.inner.q.lock().unwrap_or_else(|e| e.into_inner());
            if q.is_empty() {
                let _ = e
                    .inner
                    .cond
                    .wait_timeout(q, left.min(Duration::from_millis(50)));
            }
        }
    })
}

unsafe extern "C" fn eq_strerror(
    _: *mut fi::fid_eq,
    prov_errno: i32,
    _: *const c_void,
    buf: *mut libc::c_char,
    len: usize,
) -> *const libc::c_char {
    let text = errno_text(prov_errno);
    if !buf.is_null() && len > 0 {
        let mut l = len;
        // SAFETY: buf has `len` writable bytes by contract.
        unsafe { write_str(text.to_str().unwrap_or(""), buf, &mut l) };
    }
    text.as_ptr()
}
