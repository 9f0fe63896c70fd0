//! Braid's rdma-core backend: Braid's verbs-like API on real RC queue pairs (a ConnectX, or
//! any NIC with an rdma-core provider, or Soft-RoCE).
//!
//! What it does not do: it does not link rdma-core. libibverbs is loaded with `dlopen` the
//! first time a device is opened ([`sys`](crate) holds the table), so a build with this crate
//! runs on machines without rdma-core and reports [`VerbsError::NoLibrary`] or
//! [`VerbsError::NoDevice`] there. It has no connection manager (rdma_cm): peers exchange
//! [`QpInfo`] out of band or through Braid's connection handshake (in `braid`, over a UDP
//! socket next to the NIC), as Braid's software QPs do. It sprays nothing and repairs nothing:
//! the NIC's RC transport does that.
//!
//! How Braid's types map:
//! - memory regions are registered with IOVA 0 (`ibv_reg_mr_iova2`), so a Braid offset *is*
//!   the address in the region: local [`Sge`](braid_proto::Sge) offsets and remote
//!   [`RemoteAddr`](braid_proto::RemoteAddr) offsets go on the wire unchanged;
//! - a verbs [`QpInfo`] carries the port's GID as an IPv6 address with the RoCE v2 UDP port
//!   (4791), the QP number and the first PSN ([`qp_info`], [`peer_of`]);
//! - every `ibv_wc_status` maps onto a [`WcStatus`] ([`wc_status`]); send-side completions
//!   carry the opcode and byte count of what was posted (verbs leaves them undefined on
//!   errors).
#![warn(missing_docs, unreachable_pub)]

mod sys;

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, c_int, c_void};
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use braid_proto::{
    Access, Completion, PostError, QpInfo, RecvWr, ResourceError, SendOp, SendWr, WcOpcode,
    WcStatus,
};

use sys::Lib;

/// The UDP port RoCE v2 runs on; a verbs [`QpInfo`] carries it as its port, which is how a
/// peer tells it from a software QP's address.
pub const ROCE_V2_PORT: u16 = 4791;

/// Largest scatter/gather list a verbs QP is created for (Braid's own limit).
pub const MAX_SGE: u32 = braid_proto::MAX_SGE as u32;

/// Work requests per send or receive queue (capped by the device's `max_qp_wr`).
pub const QUEUE_DEPTH: u32 = 1024;

/// Completion queue entries (capped by the device's `max_cqe`).
pub const CQ_DEPTH: u32 = 8192;

/// Why the verbs backend is unavailable or an operation on it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs could not be loaded (rdma-core is not installed) or lacks a function.
    NoLibrary(String),
    /// The kernel has no RDMA devices: `ibv_get_device_list` failed (ENOSYS or ENODEV on a
    /// kernel without the RDMA subsystem) or listed none.
    NoDevice(String),
    /// No device of that name; the ones there are listed.
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The devices found.
        available: Vec<String>,
    },
    /// The device's port 1 is not ACTIVE (link down, or no IP/netdev for RoCE).
    PortNotActive {
        /// The device.
        device: String,
        /// `ibv_port_state` as a number (1 down, 2 init, 3 armed, 4 active).
        state: u32,
    },
    /// A verbs call failed with this errno.
    Call {
        /// The libibverbs function.
        call: &'static str,
        /// `errno` (or the returned error code).
        errno: i32,
    },
}

impl std::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerbsError::NoLibrary(why) => write!(f, "libibverbs not usable: {why}"),
            VerbsError::NoDevice(why) => write!(f, "no RDMA device: {why}"),
            VerbsError::UnknownDevice { name, available } => {
                write!(
                    f,
                    "no RDMA device {name:?} (found: {})",
                    available.join(", ")
                )
            }
            VerbsError::PortNotActive { device, state } => {
                write!(f, "{device} port 1 is not active (state {state})")
            }
            VerbsError::Call { call, errno } => write!(
                f,
                "{call} failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

impl std::error::Error for VerbsError {}

/// The RoCE version of the GID a device's QPs use.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RoceVersion {
    /// InfiniBand link layer, not RoCE.
    Infiniband,
    /// RoCE v1 (Ethernet frames, not routable).
    V1,
    /// RoCE v2 (UDP port 4791, routable).
    V2,
    /// The library is too old to report the GID type.
    Unknown,
}

/// What a verbs device can do (from `ibv_query_device`, `ibv_query_port` and the GID table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The device name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// Most scatter/gather entries per work request.
    pub max_sge: u32,
    /// Most work requests per queue.
    pub max_qp_wr: u32,
    /// Most entries per completion queue.
    pub max_cqe: u32,
    /// Whether the device runs atomics (`atomic_cap` other than `IBV_ATOMIC_NONE`).
    pub atomics: bool,
    /// Outstanding READs/atomics per QP (`max_qp_rd_atom`).
    pub max_rd_atomic: u8,
    /// The port's active MTU in bytes (256 to 4096): the path MTU of every QP.
    pub active_mtu: u32,
    /// The `ibv_mtu` code of `active_mtu`.
    active_mtu_code: u32,
    /// The RoCE version of the GID in use.
    pub roce: RoceVersion,
    /// The GID table index in use (`BRAID_VERBS_GID_INDEX`, default 0).
    pub gid_index: u8,
    /// The GID in use.
    pub gid: [u8; 16],
}

impl Caps {
    /// Work requests per send or receive queue of the QPs Braid creates on this device:
    /// [`QUEUE_DEPTH`], or less if the device allows less.
    pub fn qp_depth(&self) -> u32 {
        QUEUE_DEPTH.min(self.max_qp_wr.max(1))
    }

    /// Scatter/gather entries per work request of the QPs Braid creates on this device:
    /// [`MAX_SGE`], or less if the device allows less.
    pub fn qp_sge(&self) -> u32 {
        MAX_SGE.min(self.max_sge.max(1))
    }
}

fn lib() -> Result<&'static Lib, VerbsError> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(Lib::load)
        .as_ref()
        .map_err(|e| VerbsError::NoLibrary(e.clone()))
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The names of the RDMA devices on this machine.
pub fn list_devices() -> Result<Vec<String>, VerbsError> {
    let lib = lib()?;
    with_device_list(lib, |devs| {
        Ok(devs
            .iter()
            .map(|&d| device_name(lib, d))
            .collect::<Vec<_>>())
    })
}

fn device_name(lib: &Lib, d: *mut sys::ibv_device) -> String {
    // SAFETY: `d` comes from a live device list; the name is a NUL-terminated string inside
    // the device, valid as long as the list is.
    let p = unsafe { (lib.get_device_name)(d) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn with_device_list<R>(
    lib: &Lib,
    f: impl FnOnce(&[*mut sys::ibv_device]) -> Result<R, VerbsError>,
) -> Result<R, VerbsError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out pointer.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        let e = std::io::Error::from_raw_os_error(errno());
        return Err(VerbsError::NoDevice(format!("ibv_get_device_list: {e}")));
    }
    let len = usize::try_from(n).unwrap_or(0);
    // SAFETY: libibverbs returned an array of `n` device pointers (NULL-terminated).
    let devs = unsafe { std::slice::from_raw_parts(list, len) };
    let r = if devs.is_empty() {
        Err(VerbsError::NoDevice("no devices listed".into()))
    } else {
        f(devs)
    };
    // SAFETY: `list` came from ibv_get_device_list and is freed once; opened contexts stay
    // valid after the list is freed.
    unsafe { (lib.free_device_list)(list) };
    r
}

/// An open verbs device (`ibv_context`) and what it can do; port 1 is used.
pub struct Context {
    lib: &'static Lib,
    ctx: *mut sys::ibv_context,
    caps: Caps,
}

// SAFETY: libibverbs contexts and every object below are thread-safe (the verbs API is
// documented as thread-safe; providers lock internally); the raw pointers are only passed to it.
unsafe impl Send for Context {}
// SAFETY: see above.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every PD, CQ and QP holds an Arc of this context, so none is left.
        unsafe { (self.lib.close_device)(self.ctx) };
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("caps", &self.caps).finish()
    }
}

/// The GID index from `BRAID_VERBS_GID_INDEX` (default 0).
fn gid_index_from_env() -> u8 {
    std::env::var("BRAID_VERBS_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mtu_bytes(code: u32) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

impl Context {
    /// Opens `name`, or the first device whose port 1 is ACTIVE when `None`.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>, VerbsError> {
        let lib = lib()?;
        let gid_index = gid_index_from_env();
        with_device_list(lib, |devs| {
            let names: Vec<String> = devs.iter().map(|&d| device_name(lib, d)).collect();
            let mut last_err = None;
            for (&d, n) in devs.iter().zip(&names) {
                if name.is_some_and(|want| want != n) {
                    continue;
                }
                match Context::open_one(lib, d, n, gid_index) {
                    Ok(c) => return Ok(Arc::new(c)),
                    Err(e) if name.is_none() => last_err = Some(e),
                    Err(e) => return Err(e),
                }
            }
            Err(match (name, last_err) {
                (_, Some(e)) => e,
                (Some(want), None) => VerbsError::UnknownDevice {
                    name: want.to_owned(),
                    available: names,
                },
                (None, None) => VerbsError::NoDevice("no devices listed".into()),
            })
        })
    }

    fn open_one(
        lib: &'static Lib,
        d: *mut sys::ibv_device,
        name: &str,
        gid_index: u8,
    ) -> Result<Context, VerbsError> {
        // SAFETY: `d` is from the live device list.
        let ctx = unsafe { (lib.open_device)(d) };
        if ctx.is_null() {
            return Err(VerbsError::Call {
                call: "ibv_open_device",
                errno: errno(),
            });
        }
        // From here `c` owns the context and closes it on every error path.
        let mut c = Context {
            lib,
            ctx,
            caps: Caps {
                device: name.to_owned(),
                max_mr_size: 0,
                max_sge: 0,
                max_qp_wr: 0,
                max_cqe: 0,
                atomics: false,
                max_rd_atomic: 0,
                active_mtu: 0,
                active_mtu_code: 0,
                roce: RoceVersion::Unknown,
                gid_index,
                gid: [0; 16],
            },
        };
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut dev: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, out pointer to a struct of the C layout.
        let rc = unsafe { (lib.query_device)(ctx, &mut dev) };
        if rc != 0 {
            return Err(VerbsError::Call {
                call: "ibv_query_device",
                errno: rc,
            });
        }
        let mut port = sys::ibv_port_attr::default();
        // SAFETY: as above; the exported symbol fills the compat layout, a prefix of ours.
        let rc = unsafe { (lib.query_port)(ctx, 1, &mut port) };
        if rc != 0 {
            return Err(VerbsError::Call {
                call: "ibv_query_port",
                errno: rc,
            });
        }
        if port.state != sys::IBV_PORT_ACTIVE {
            return Err(VerbsError::PortNotActive {
                device: name.to_owned(),
                state: port.state,
            });
        }
        let mut gid = [0u8; 16];
        // SAFETY: out pointer to 16 bytes (`union ibv_gid`).
        let rc = unsafe { (lib.query_gid)(ctx, 1, c_int::from(gid_index), &mut gid) };
        if rc != 0 {
            return Err(VerbsError::Call {
                call: "ibv_query_gid",
                errno: rc,
            });
        }
        let roce = match lib.query_gid_ex {
            Some(q) => {
                let mut e = sys::ibv_gid_entry::default();
                // SAFETY: out pointer and its size, as `ibv_query_gid_ex` passes them.
                let rc = unsafe {
                    q(
                        ctx,
                        1,
                        u32::from(gid_index),
                        &mut e,
                        0,
                        std::mem::size_of::<sys::ibv_gid_entry>(),
                    )
                };
                match (rc, e.gid_type) {
                    (0, sys::IBV_GID_TYPE_IB) => RoceVersion::Infiniband,
                    (0, sys::IBV_GID_TYPE_ROCE_V1) => RoceVersion::V1,
                    (0, sys::IBV_GID_TYPE_ROCE_V2) => RoceVersion::V2,
                    _ => RoceVersion::Unknown,
                }
            }
            None if port.link_layer != sys::IBV_LINK_LAYER_ETHERNET => RoceVersion::Infiniband,
            None => RoceVersion::Unknown,
        };
        let pos = |v: c_int| u32::try_from(v).unwrap_or(0);
        c.caps.max_mr_size = dev.max_mr_size;
        c.caps.max_sge = pos(dev.max_sge);
        c.caps.max_qp_wr = pos(dev.max_qp_wr);
        c.caps.max_cqe = pos(dev.max_cqe);
        c.caps.atomics = dev.atomic_cap != sys::IBV_ATOMIC_NONE;
        c.caps.max_rd_atomic = u8::try_from(dev.max_qp_rd_atom.clamp(0, 255)).unwrap_or(0);
        c.caps.active_mtu = mtu_bytes(port.active_mtu);
        c.caps.active_mtu_code = port.active_mtu;
        c.caps.roce = roce;
        c.caps.gid = gid;
        Ok(c)
    }

    /// What the device can do.
    pub fn caps(&self) -> &Caps {
        &self.caps
    }
}

/// A protection domain.
pub struct Pd {
    ctx: Arc<Context>,
    pd: *mut sys::ibv_pd,
}

// SAFETY: see `Context`.
unsafe impl Send for Pd {}
// SAFETY: see `Context`.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc of it, so none is left.
        unsafe { (self.ctx.lib.dealloc_pd)(self.pd) };
    }
}

impl Pd {
    /// Allocates a protection domain.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, VerbsError> {
        // SAFETY: live context.
        let pd = unsafe { (ctx.lib.alloc_pd)(ctx.ctx) };
        if pd.is_null() {
            return Err(VerbsError::Call {
                call: "ibv_alloc_pd",
                errno: errno(),
            });
        }
        Ok(Arc::new(Pd {
            ctx: ctx.clone(),
            pd,
        }))
    }

    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

/// The `ibv_access_flags` of Braid's `access`. Hardware refuses remote write or atomic
/// rights without local write, so those imply it.
pub fn access_flags(access: Access) -> u32 {
    let mut f = 0;
    if access.contains(Access::LOCAL_WRITE) {
        f |= sys::IBV_ACCESS_LOCAL_WRITE;
    }
    if access.contains(Access::REMOTE_WRITE) {
        f |= sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_LOCAL_WRITE;
    }
    if access.contains(Access::REMOTE_READ) {
        f |= sys::IBV_ACCESS_REMOTE_READ;
    }
    if access.contains(Access::REMOTE_ATOMIC) {
        f |= sys::IBV_ACCESS_REMOTE_ATOMIC | sys::IBV_ACCESS_LOCAL_WRITE;
    }
    f
}

/// A registered memory region (IOVA 0: offsets are addresses).
pub struct Mr {
    pd: Arc<Pd>,
    mr: *mut sys::ibv_mr,
    lkey: u32,
    rkey: u32,
}

// SAFETY: see `Context`.
unsafe impl Send for Mr {}
// SAFETY: see `Context`.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once; after this the NIC no longer touches
        // the memory.
        unsafe { (self.pd.ctx.lib.dereg_mr)(self.mr) };
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .finish()
    }
}

impl Mr {
    /// Registers `len` bytes at `ptr` with `access`.
    ///
    /// # Safety
    /// The memory stays valid (allocated, not unmapped) until the returned `Mr` is dropped,
    /// and, while registered, the program reads and writes it only atomically or through
    /// operations that tolerate the NIC writing it at any time (Braid's `Region`).
    pub unsafe fn register(
        pd: &Arc<Pd>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        // SAFETY: live PD; the caller keeps the memory valid while registered.
        let mr = unsafe {
            (pd.ctx.lib.reg_mr_iova2)(pd.pd, ptr.cast::<c_void>(), len, 0, access_flags(access))
        };
        if mr.is_null() {
            return Err(VerbsError::Call {
                call: "ibv_reg_mr_iova2",
                errno: errno(),
            });
        }
        // SAFETY: non-null MR returned by libibverbs, read-only fields.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Mr {
            pd: pd.clone(),
            mr,
            lkey,
            rkey,
        })
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

/// What a posted work request completes as; verbs leaves the opcode and length undefined on
/// errors, so they are kept here, in posting order, per queue.
#[derive(Copy, Clone, Debug)]
struct Slot {
    /// The `wr_id` given to libibverbs.
    tag: u64,
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
}

/// The posted-but-not-completed requests of one QP.
#[derive(Default)]
struct Pending {
    send: Mutex<VecDeque<Slot>>,
    recv: Mutex<VecDeque<Slot>>,
    next_tag: AtomicU64,
}

/// The bit that marks a receive's tag.
const RECV_TAG: u64 = 1 << 63;

impl Pending {
    fn tag(&self, recv: bool) -> u64 {
        let n = self.next_tag.fetch_add(1, Ordering::Relaxed) & !RECV_TAG;
        if recv { n | RECV_TAG } else { n }
    }

    /// Takes the slot of `tag` and every earlier one (unsignaled sends complete silently
    /// with the next signaled one).
    fn take(&self, tag: u64) -> Option<Slot> {
        let q = if tag & RECV_TAG != 0 {
            &self.recv
        } else {
            &self.send
        };
        let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
        if !q.iter().any(|s| s.tag == tag) {
            return None;
        }
        while let Some(s) = q.pop_front() {
            if s.tag == tag {
                return Some(s);
            }
        }
        None
    }
}

/// A completion queue, with a completion channel for [`wait`](Cq::wait) when the device gives
/// one.
pub struct Cq {
    ctx: Arc<Context>,
    cq: *mut sys::ibv_cq,
    /// The completion channel the CQ reports to (its fd non-blocking), or null if
    /// `ibv_create_comp_channel` failed (`wait` then polls).
    channel: *mut sys::ibv_comp_channel,
    /// The QPs reporting here, by QP number.
    qps: Mutex<HashMap<u32, Arc<Pending>>>,
    poll: Mutex<()>,
    /// Completions of requests the NIC never saw ([`Qp::complete_unposted`]), handed out
    /// before the NIC's; `has_unposted` lets a poll skip the lock while there are none.
    unposted: Mutex<VecDeque<Completion>>,
    has_unposted: AtomicBool,
}

// SAFETY: see `Context`.
unsafe impl Send for Cq {}
// SAFETY: see `Context`.
unsafe impl Sync for Cq {}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc of it, so none is left; every event
        // taken from the channel was acknowledged (`take_events`), as destroy_cq requires; the
        // channel outlives the CQ and is destroyed once, after it.
        unsafe {
            (self.ctx.lib.destroy_cq)(self.cq);
            if !self.channel.is_null() {
                (self.ctx.lib.destroy_comp_channel)(self.channel);
            }
        }
    }
}

/// Braid's status for an `ibv_wc_status` (the table in docs/verbs.md).
pub fn wc_status(status: u32) -> WcStatus {
    match status {
        sys::IBV_WC_SUCCESS => WcStatus::Success,
        sys::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
        sys::IBV_WC_LOC_PROT_ERR | sys::IBV_WC_LOC_ACCESS_ERR | sys::IBV_WC_MW_BIND_ERR => {
            WcStatus::LocalProtectionError
        }
        sys::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        sys::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        sys::IBV_WC_REM_INV_REQ_ERR | sys::IBV_WC_REM_INV_RD_REQ_ERR => {
            WcStatus::RemoteInvalidRequest
        }
        sys::IBV_WC_REM_OP_ERR | sys::IBV_WC_REM_ABORT_ERR => WcStatus::RemoteOperationError,
        sys::IBV_WC_RETRY_EXC_ERR | sys::IBV_WC_RESP_TIMEOUT_ERR => WcStatus::RetryExceeded,
        sys::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
        // Local QP or device failures, a bad response, and statuses of transports Braid does
        // not use (EE contexts, RDD, tag matching): the request was not executed as asked.
        sys::IBV_WC_LOC_QP_OP_ERR
        | sys::IBV_WC_LOC_EEC_OP_ERR
        | sys::IBV_WC_BAD_RESP_ERR
        | sys::IBV_WC_LOC_RDD_VIOL_ERR
        | sys::IBV_WC_INV_EECN_ERR
        | sys::IBV_WC_INV_EEC_STATE_ERR
        | sys::IBV_WC_FATAL_ERR
        | sys::IBV_WC_GENERAL_ERR
        | sys::IBV_WC_TM_ERR
        | sys::IBV_WC_TM_RNDV_INCOMPLETE => WcStatus::RemoteOperationError,
        _ => WcStatus::RemoteOperationError,
    }
}

/// Entries taken from the NIC per `poll_cq` call.
const POLL_BATCH: usize = 32;

/// Longest sleep of [`Cq::wait`] on the completion channel before it polls again.
pub const WAIT_SLICE: Duration = Duration::from_millis(10);

/// A completion channel whose fd does not block (so a waiter never sleeps in
/// `ibv_get_cq_event`), or null if the device gives none.
fn open_channel(ctx: &Context) -> *mut sys::ibv_comp_channel {
    // SAFETY: live context.
    let ch = unsafe { (ctx.lib.create_comp_channel)(ctx.ctx) };
    if ch.is_null() {
        return ch;
    }
    // SAFETY: the channel's fd is an open descriptor it owns; only its flags change.
    let ok = unsafe {
        let fd = (*ch).fd;
        let fl = libc::fcntl(fd, libc::F_GETFL);
        fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
    };
    if !ok {
        // SAFETY: created above, used by no CQ.
        unsafe { (ctx.lib.destroy_comp_channel)(ch) };
        return std::ptr::null_mut();
    }
    ch
}

impl Cq {
    /// Creates a completion queue.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Cq>, VerbsError> {
        let depth = CQ_DEPTH.min(ctx.caps.max_cqe.max(1));
        let depth = c_int::try_from(depth).unwrap_or(c_int::MAX);
        let channel = open_channel(ctx);
        // SAFETY: live context; `channel` is null or a live channel of it; vector 0.
        let cq =
            unsafe { (ctx.lib.create_cq)(ctx.ctx, depth, std::ptr::null_mut(), channel.cast(), 0) };
        if cq.is_null() {
            let e = errno();
            if !channel.is_null() {
                // SAFETY: created above, used by no CQ.
                unsafe { (ctx.lib.destroy_comp_channel)(channel) };
            }
            return Err(VerbsError::Call {
                call: "ibv_create_cq",
                errno: e,
            });
        }
        Ok(Arc::new(Cq {
            ctx: ctx.clone(),
            cq,
            channel,
            qps: Mutex::new(HashMap::new()),
            poll: Mutex::new(()),
            unposted: Mutex::new(VecDeque::new()),
            has_unposted: AtomicBool::new(false),
        }))
    }

    /// Waits up to `timeout` for completions and takes up to `out.len()` of them; returns how
    /// many (0 when the time ran out). Sleeps on the CQ's completion channel: poll, arm the
    /// notification (`ibv_req_notify_cq`), poll again (what arrived before the arming raises
    /// no event), then sleep on the channel's fd. Several threads may wait on one CQ: the
    /// sleep is cut into slices of [`WAIT_SLICE`], so a waiter whose event another took looks
    /// again soon. Without a channel it polls, yielding the CPU in between.
    pub fn wait(&self, out: &mut [Completion], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.poll(out);
            if n > 0 || out.is_empty() {
                return n;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return 0;
            };
            if self.channel.is_null() || !self.arm() {
                std::thread::yield_now();
                continue;
            }
            let n = self.poll(out);
            if n > 0 {
                return n;
            }
            self.sleep(left.min(WAIT_SLICE));
        }
    }

    /// Asks for an event at the next completion; false if the provider cannot.
    fn arm(&self) -> bool {
        // SAFETY: `cq` is live; its context's ops table is filled by the provider.
        let rc = unsafe {
            let ctx = (*self.cq).context;
            match (*ctx).ops.req_notify_cq {
                Some(notify) => notify(self.cq, 0),
                None => -1,
            }
        };
        rc == 0
    }

    /// Sleeps until the channel's fd is readable or `t` passed, then takes and acknowledges
    /// the events there.
    fn sleep(&self, t: Duration) {
        // SAFETY: `channel` is non-null (checked by the caller) and live while `self` is.
        let fd = unsafe { (*self.channel).fd };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = c_int::try_from(t.as_millis().max(1)).unwrap_or(c_int::MAX);
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut p, 1, ms) };
        if ready > 0 {
            self.take_events();
        }
    }

    /// Takes every event waiting on the channel (its fd is non-blocking) and acknowledges
    /// them.
    fn take_events(&self) {
        let mut taken = 0u32;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: live channel; out-pointers to locals. Non-blocking: fails with EAGAIN
            // when no event is left (another waiter may have taken it).
            let rc = unsafe { (self.ctx.lib.get_cq_event)(self.channel, &mut cq, &mut ctx) };
            if rc != 0 || taken == u32::MAX {
                break;
            }
            taken += 1;
        }
        if taken > 0 {
            // SAFETY: this channel serves only this CQ; `taken` events of it were taken.
            unsafe { (self.ctx.lib.ack_cq_events)(self.cq, taken) };
        }
    }

    /// Takes up to `out.len()` completions without waiting; returns how many.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        // One poller at a time, so completions leave in the order the NIC reported them.
        let _one = self.poll.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        if self.has_unposted.load(Ordering::Acquire) {
            let mut q = self.unposted.lock().unwrap_or_else(|e| e.into_inner());
            while done < out.len() {
                let Some(c) = q.pop_front() else { break };
                out[done] = c;
                done += 1;
            }
            self.has_unposted.store(!q.is_empty(), Ordering::Release);
        }
        let mut wcs = [sys::ibv_wc::default(); POLL_BATCH];
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            // SAFETY: `cq` is live; its context's ops table is filled by the provider;
            // `wcs` holds `want` entries.
            let n = unsafe {
                let ctx = (*self.cq).context;
                match (*ctx).ops.poll_cq {
                    Some(poll) => poll(self.cq, want as c_int, wcs.as_mut_ptr()),
                    None => -1,
                }
            };
            let Ok(n) = usize::try_from(n) else { break };
            if n == 0 {
                break;
            }
            for wc in &wcs[..n.min(want)] {
                out[done] = self.completion(wc);
                done += 1;
            }
        }
        done
    }

    fn completion(&self, wc: &sys::ibv_wc) -> Completion {
        let pending = self
            .qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&wc.qp_num)
            .cloned();
        let slot = pending.and_then(|p| p.take(wc.wr_id));
        let status = wc_status(wc.status);
        let imm = (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data));
        match slot {
            Some(s) if s.opcode == WcOpcode::Recv => Completion {
                wr_id: s.wr_id,
                status,
                opcode: if status == WcStatus::Success
                    && wc.opcode == sys::IBV_WC_RECV_RDMA_WITH_IMM
                {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                },
                byte_len: if status == WcStatus::Success {
                    wc.byte_len
                } else {
                    0
                },
                imm,
                qpn: wc.qp_num,
            },
            Some(s) => Completion {
                wr_id: s.wr_id,
                status,
                opcode: s.opcode,
                byte_len: s.byte_len,
                imm: None,
                qpn: wc.qp_num,
            },
            None => Completion {
                wr_id: wc.wr_id,
                status,
                opcode: WcOpcode::Send,
                byte_len: wc.byte_len,
                imm,
                qpn: wc.qp_num,
            },
        }
    }
}

/// What a verbs peer needs to connect, decoded from its [`QpInfo`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The port GID of the peer's device.
    pub gid: [u8; 16],
    /// The peer's QP number.
    pub qpn: u32,
    /// The first PSN the peer sends.
    pub psn: u32,
}

/// The [`QpInfo`] of a verbs QP: the GID as an IPv6 address on [`ROCE_V2_PORT`], the QP
/// number and the first PSN. It goes through every encoding of a software QpInfo unchanged.
pub fn qp_info(gid: [u8; 16], qpn: u32, psn: u32) -> QpInfo {
    QpInfo {
        addr: SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(gid), ROCE_V2_PORT, 0, 0)),
        qpn,
        psn,
        seal_key: None,
    }
}

/// The verbs peer a [`QpInfo`] describes, or `None` for a software QP's info (an IPv4
/// address, another port, or an encryption key).
pub fn peer_of(info: &QpInfo) -> Option<Peer> {
    match info.addr {
        SocketAddr::V6(a) if a.port() == ROCE_V2_PORT && info.seal_key.is_none() => Some(Peer {
            gid: a.ip().octets(),
            qpn: info.qpn,
            psn: info.psn & 0xff_ffff,
        }),
        _ => None,
    }
}

/// Transport settings of a verbs QP (rnr_retry 7 is "retry forever" in the verbs spec).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpTiming {
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Transport retries before `RetryExceeded` (0 to 7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries before `RnrRetryExceeded` (0 to 6; 7 is infinite).
    pub rnr_retry: u8,
    /// The RNR NAK delay this QP asks senders to wait, as the verbs code (12 = 0.64 ms).
    pub min_rnr_timer: u8,
}

impl QpTiming {
    /// The settings matching Braid's software engine: `rnr_retry_limit` RNR retries, at most
    /// 6 (verbs' 7 is "forever", used only for the engine's own "forever", `u32::MAX`), and
    /// the smallest verbs RNR delay not below `rnr_timer_ns`.
    pub fn like_software(rnr_retry_limit: u32, rnr_timer_ns: u64) -> QpTiming {
        let rnr_retry = match rnr_retry_limit {
            u32::MAX => 7,
            n => u8::try_from(n.min(6)).unwrap_or(6),
        };
        QpTiming {
            rnr_retry,
            min_rnr_timer: rnr_timer_code(rnr_timer_ns),
            ..QpTiming::default()
        }
    }
}

/// The IB spec's RNR NAK delays (µs × 100) for codes 1 to 31 (code 0 is 655.36 ms).
const RNR_DELAY_10US: [u32; 31] = [
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
    3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The smallest verbs `min_rnr_timer` code whose delay is at least `ns` (0, 655.36 ms, past
/// the largest).
pub fn rnr_timer_code(ns: u64) -> u8 {
    RNR_DELAY_10US
        .iter()
        .position(|&d| u64::from(d) * 10_000 >= ns)
        .map_or(0, |i| i as u8 + 1)
}

impl Default for QpTiming {
    fn default() -> Self {
        QpTiming {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

/// An RC queue pair.
pub struct Qp {
    pd: Arc<Pd>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    qp: *mut sys::ibv_qp,
    qpn: u32,
    psn: u32,
    pending: Arc<Pending>,
    timing: QpTiming,
    /// In RTS: sends are refused with `NotConnected` before (as Braid's software QPs do).
    connected: AtomicBool,
    /// Moved to the error state: sends are taken and flushed by the NIC, as verbs does.
    errored: AtomicBool,
}

// SAFETY: see `Context`.
unsafe impl Send for Qp {}
// SAFETY: see `Context`.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        for cq in [&self.send_cq, &self.recv_cq] {
            cq.qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.qpn);
        }
        // SAFETY: created once, destroyed once.
        unsafe { (self.pd.ctx.lib.destroy_qp)(self.qp) };
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp").field("qpn", &self.qpn).finish()
    }
}

fn random_psn() -> u32 {
    // RandomState is keyed from the OS generator; a PSN needs no more than that.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x0050_534e);
    (h.finish() as u32) & 0xff_ffff
}

fn call(call: &'static str, rc: c_int) -> Result<(), VerbsError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(VerbsError::Call { call, errno: rc })
    }
}

impl Qp {
    /// Creates an RC QP in the INIT state (remote write, read and atomics allowed: each
    /// region's own rights decide).
    pub fn new(
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        timing: QpTiming,
    ) -> Result<Qp, VerbsError> {
        let caps = &pd.ctx.caps;
        let depth = caps.qp_depth();
        let sge = caps.qp_sge();
        let mut init = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.cq,
            recv_cq: recv_cq.cq,
            srq: std::ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: sge,
                max_recv_sge: sge,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQs of the same context; `init` is fully initialised.
        let qp = unsafe { (pd.ctx.lib.create_qp)(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(VerbsError::Call {
                call: "ibv_create_qp",
                errno: errno(),
            });
        }
        // SAFETY: non-null QP from libibverbs.
        let qpn = unsafe { (*qp).qp_num };
        let q = Qp {
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            qp,
            qpn,
            psn: random_psn(),
            pending: Arc::new(Pending::default()),
            timing,
            connected: AtomicBool::new(false),
            errored: AtomicBool::new(false),
        };
        for cq in [send_cq, recv_cq] {
            cq.qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(qpn, q.pending.clone());
        }
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            port_num: 1,
            pkey_index: 0,
            qp_access_flags: sys::IBV_ACCESS_REMOTE_WRITE
                | sys::IBV_ACCESS_REMOTE_READ
                | sys::IBV_ACCESS_REMOTE_ATOMIC,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT;
        q.modify(
            &mut a,
            mask | sys::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;
        Ok(q)
    }

    fn modify(
        &self,
        a: &mut sys::ibv_qp_attr,
        mask: c_int,
        what: &'static str,
    ) -> Result<(), VerbsError> {
        // SAFETY: live QP; `a` is initialised for every bit in `mask`.
        call(what, unsafe {
            (self.pd.ctx.lib.modify_qp)(self.qp, a, mask)
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// What the peer needs to connect to this QP.
    pub fn info(&self) -> QpInfo {
        qp_info(self.pd.ctx.caps.gid, self.qpn, self.psn)
    }

    /// Moves the QP through RTR to RTS towards `peer` (path MTU: the port's active MTU).
    pub fn connect(&self, peer: &Peer) -> Result<(), VerbsError> {
        let caps = &self.pd.ctx.caps;
        let rd_atomic = caps.max_rd_atomic.clamp(1, 16);
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: caps.active_mtu_code,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: self.timing.min_rnr_timer,
            ah_attr: sys::ibv_ah_attr {
                grh: sys::ibv_global_route {
                    dgid: peer.gid,
                    flow_label: 0,
                    sgid_index: caps.gid_index,
                    hop_limit: 64,
                    traffic_class: 0,
                },
                dlid: 0,
                sl: 0,
                src_path_bits: 0,
                static_rate: 0,
                is_global: 1,
                port_num: 1,
            },
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "ibv_modify_qp(RTR)")?;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: self.timing.timeout,
            retry_cnt: self.timing.retry_cnt,
            rnr_retry: self.timing.rnr_retry,
            sq_psn: self.psn,
            max_rd_atomic: rd_atomic,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "ibv_modify_qp(RTS)")?;
        self.connected.store(true, Ordering::Release);
        Ok(())
    }

    /// Moves the QP to the error state: what is outstanding completes as flushed.
    pub fn set_error(&self) -> Result<(), VerbsError> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut a, sys::IBV_QP_STATE, "ibv_modify_qp(ERR)")?;
        self.errored.store(true, Ordering::Release);
        Ok(())
    }

    /// Completes a send request the NIC never took (its post was refused after its poster
    /// was told it was accepted: a request queued for a connection that came up, or failed,
    /// later) with `status` on the send CQ.
    pub fn complete_unposted(&self, wr: &SendWr, status: WcStatus) {
        let opcode = match wr.op {
            SendOp::Write(_) | SendOp::WriteImm(..) => WcOpcode::Write,
            SendOp::Read(_) => WcOpcode::Read,
            SendOp::FetchAdd(..) => WcOpcode::FetchAdd,
            SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
            _ => WcOpcode::Send,
        };
        let c = Completion {
            wr_id: wr.wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            qpn: self.qpn,
        };
        let cq = &self.send_cq;
        cq.unposted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(c);
        cq.has_unposted.store(true, Ordering::Release);
    }

    /// Posts a send work request. Local keys, bounds and rights are checked by the NIC and
    /// reported as completions; what is refused here is a malformed request.
    pub fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        if !self.connected.load(Ordering::Acquire) && !self.errored.load(Ordering::Acquire) {
            return Err(PostError::NotConnected);
        }
        check_send(wr)?;
        let mut sges: Vec<sys::ibv_sge> = wr
            .sges
            .iter()
            .map(|s| sys::ibv_sge {
                addr: s.offset,
                length: s.len,
                lkey: s.lkey,
            })
            .collect();
        let total = wr
            .sges
            .iter()
            .try_fold(0u32, |acc, s| acc.checked_add(s.len))
            .ok_or(PostError::TooManySges)?;
        let mut w = sys::ibv_send_wr::zeroed();
        w.sg_list = sges.as_mut_ptr();
        w.num_sge = sges.len() as c_int;
        w.send_flags = if wr.signaled {
            sys::IBV_SEND_SIGNALED
        } else {
            0
        };
        let atomic = |sges: &[sys::ibv_sge], r: &braid_proto::RemoteAddr| {
            if sges.len() != 1 || sges[0].length != 8 || !r.offset.is_multiple_of(8) {
                Err(PostError::BadAtomic)
            } else {
                Ok(())
            }
        };
        let (opcode, byte_len) = match wr.op {
            SendOp::Send => {
                w.opcode = sys::IBV_WR_SEND;
                (WcOpcode::Send, total)
            }
            SendOp::SendImm(imm) => {
                w.opcode = sys::IBV_WR_SEND_WITH_IMM;
                w.imm_data = imm.to_be();
                (WcOpcode::Send, total)
            }
            SendOp::Write(r) => {
                w.opcode = sys::IBV_WR_RDMA_WRITE;
                w.set_rdma(r.offset, r.rkey);
                (WcOpcode::Write, total)
            }
            SendOp::WriteImm(r, imm) => {
                w.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
                w.imm_data = imm.to_be();
                w.set_rdma(r.offset, r.rkey);
                (WcOpcode::Write, total)
            }
            SendOp::Read(r) => {
                w.opcode = sys::IBV_WR_RDMA_READ;
                w.set_rdma(r.offset, r.rkey);
                (WcOpcode::Read, total)
            }
            SendOp::FetchAdd(r, add) => {
                atomic(&sges, &r)?;
                w.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
                w.set_atomic(r.offset, r.rkey, add, 0);
                (WcOpcode::FetchAdd, 8)
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                atomic(&sges, &remote)?;
                w.opcode = sys::IBV_WR_ATOMIC_CMP_AND_SWP;
                w.set_atomic(remote.offset, remote.rkey, compare, swap);
                (WcOpcode::CompareSwap, 8)
            }
            _ => return Err(PostError::BadAtomic),
        };
        // The slot goes in before the post so the completion always finds it; it is taken
        // back out if the post is refused.
        let tag = self.pending.tag(false);
        w.wr_id = tag;
        let mut q = self.pending.send.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(Slot {
            tag,
            wr_id: wr.wr_id,
            opcode,
            byte_len,
        });
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; `w` and `sges` outlive the call (libibverbs copies them into the
        // send queue before returning); the provider's ops table is filled.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            match (*ctx).ops.post_send {
                Some(post) => post(self.qp, &mut w, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            q.pop_back();
            return Err(post_error(rc));
        }
        Ok(())
    }

    /// Posts a receive work request.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        if wr.sges.len() > MAX_SGE as usize {
            return Err(PostError::TooManySges);
        }
        let mut sges: Vec<sys::ibv_sge> = wr
            .sges
            .iter()
            .map(|s| sys::ibv_sge {
                addr: s.offset,
                length: s.len,
                lkey: s.lkey,
            })
            .collect();
        let tag = self.pending.tag(true);
        let mut w = sys::ibv_recv_wr {
            wr_id: tag,
            next: std::ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: sges.len() as c_int,
        };
        let mut q = self.pending.recv.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(Slot {
            tag,
            wr_id: wr.wr_id,
            opcode: WcOpcode::Recv,
            byte_len: 0,
        });
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in `post_send`.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            match (*ctx).ops.post_recv {
                Some(post) => post(self.qp, &mut w, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            q.pop_back();
            return Err(post_error(rc));
        }
        Ok(())
    }
}

/// Whether `wr` has a shape a verbs QP takes (what [`Qp::post_send`] refuses before the NIC
/// sees it): at most [`MAX_SGE`] entries, a total length that fits 32 bits, and for atomics
/// one 8-byte entry and an 8-byte-aligned remote offset.
pub fn check_send(wr: &SendWr) -> Result<(), PostError> {
    if wr.sges.len() > MAX_SGE as usize {
        return Err(PostError::TooManySges);
    }
    wr.sges
        .iter()
        .try_fold(0u32, |acc, s| acc.checked_add(s.len))
        .ok_or(PostError::TooManySges)?;
    let atomic = |r: &braid_proto::RemoteAddr| {
        if wr.sges.len() != 1 || wr.sges[0].len != 8 || !r.offset.is_multiple_of(8) {
            Err(PostError::BadAtomic)
        } else {
            Ok(())
        }
    };
    match &wr.op {
        SendOp::Send
        | SendOp::SendImm(_)
        | SendOp::Write(_)
        | SendOp::WriteImm(..)
        | SendOp::Read(_) => Ok(()),
        SendOp::FetchAdd(r, _) => atomic(r),
        SendOp::CompareSwap { remote, .. } => atomic(remote),
        _ => Err(PostError::BadAtomic),
    }
}

/// The [`PostError`] of a refused `ibv_post_*`: ENOMEM is a full queue; EINVAL (a bad
/// opcode, too many entries, or a QP not ready to send) reads as not connected.
fn post_error(rc: c_int) -> PostError {
    match rc {
        libc::ENOMEM => PostError::QueueFull,
        _ => PostError::NotConnected,
    }
}

/// The [`ResourceError`] a verbs failure surfaces as through Braid's resource calls.
pub fn resource_error(e: &VerbsError) -> ResourceError {
    match e {
        VerbsError::Call {
            errno: libc::ENOMEM,
            ..
        } => ResourceError::Limit,
        _ => ResourceError::BadState,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ibv_wc_status_has_the_documented_braid_status() {
        use WcStatus::*;
        let table = [
            (0, Success),
            (1, LocalLengthError),
            (2, RemoteOperationError),
            (3, RemoteOperationError),
            (4, LocalProtectionError),
            (5, Flushed),
            (6, LocalProtectionError),
            (7, RemoteOperationError),
            (8, LocalProtectionError),
            (9, RemoteInvalidRequest),
            (10, RemoteAccessError),
            (11, RemoteOperationError),
            (12, RetryExceeded),
            (13, RnrRetryExceeded),
            (14, RemoteOperationError),
            (15, RemoteInvalidRequest),
            (16, RemoteOperationError),
            (17, RemoteOperationError),
            (18, RemoteOperationError),
            (19, RemoteOperationError),
            (20, RetryExceeded),
            (21, RemoteOperationError),
            (22, RemoteOperationError),
            (23, RemoteOperationError),
            (999, RemoteOperationError),
        ];
        for (code, want) in table {
            assert_eq!(wc_status(code), want, "ibv_wc_status {code}");
        }
    }

    #[test]
    fn access_bits_map_to_ibv_access_flags_with_local_write_where_hardware_needs_it() {
        assert_eq!(access_flags(Access::NONE), 0);
        assert_eq!(access_flags(Access::LOCAL_WRITE), 1);
        assert_eq!(access_flags(Access::REMOTE_READ), 4);
        assert_eq!(access_flags(Access::REMOTE_WRITE), 1 | 2);
        assert_eq!(access_flags(Access::REMOTE_ATOMIC), 1 | 8);
        assert_eq!(access_flags(Access::ALL), 15);
    }

    #[test]
    fn a_verbs_qp_info_round_trips_and_a_software_one_is_not_a_verbs_peer() {
        let gid = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
        ];
        let info = qp_info(gid, 17, 0xabcdef);
        assert_eq!(
            peer_of(&info),
            Some(Peer {
                gid,
                qpn: 17,
                psn: 0xabcdef
            })
        );
        let soft = QpInfo {
            addr: "127.0.0.1:4791".parse().unwrap(),
            qpn: 17,
            psn: 1,
            seal_key: None,
        };
        assert_eq!(peer_of(&soft), None);
        let soft6 = QpInfo {
            addr: "[::1]:5000".parse().unwrap(),
            ..soft
        };
        assert_eq!(peer_of(&soft6), None);
        let sealed = QpInfo {
            seal_key: Some([1; 32]),
            ..info
        };
        assert_eq!(peer_of(&sealed), None);
    }

    #[test]
    fn rdma_fields_sit_where_verbs_h_puts_wr_rdma() {
        let mut w = sys::ibv_send_wr::zeroed();
        w.set_rdma(0x1122_3344_5566_7788, 0xdead_beef);
        // SAFETY: reading the plain-old-data struct as bytes.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(w) };
        assert_eq!(&bytes[40..48], &0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(&bytes[48..52], &0xdead_beefu32.to_ne_bytes());
    }

    #[test]
    fn rnr_timer_codes_follow_the_ib_table_and_software_limits_map_onto_verbs() {
        assert_eq!(rnr_timer_code(0), 1);
        assert_eq!(rnr_timer_code(10_000), 1);
        assert_eq!(rnr_timer_code(10_001), 2);
        assert_eq!(rnr_timer_code(200_000), 9); // 0.24 ms
        assert_eq!(rnr_timer_code(640_000), 12);
        assert_eq!(rnr_timer_code(491_520_000), 31);
        assert_eq!(rnr_timer_code(491_520_001), 0);
        let t = QpTiming::like_software(7, 200_000);
        assert_eq!((t.rnr_retry, t.min_rnr_timer), (6, 9));
        assert_eq!(QpTiming::like_software(2, 0).rnr_retry, 2);
        assert_eq!(QpTiming::like_software(u32::MAX - 1, 0).rnr_retry, 6);
        assert_eq!(QpTiming::like_software(u32::MAX, 0).rnr_retry, 7);
    }

    #[test]
    fn pending_slots_complete_in_order_and_unsignaled_ones_go_with_the_next() {
        let p = Pending::default();
        let mut tags = Vec::new();
        for i in 0..3 {
            let tag = p.tag(false);
            p.send.lock().unwrap().push_back(Slot {
                tag,
                wr_id: 100 + i,
                opcode: WcOpcode::Write,
                byte_len: 8,
            });
            tags.push(tag);
        }
        assert_eq!(p.take(tags[1]).map(|s| s.wr_id), Some(101));
        assert_eq!(p.take(tags[0]).map(|s| s.wr_id), None);
        assert_eq!(p.take(tags[2]).map(|s| s.wr_id), Some(102));
        let r = p.tag(true);
        assert_ne!(r & RECV_TAG, 0);
        assert!(p.take(r).is_none());
    }

    /// On a machine without RDMA (this project's hosts: ENOSYS from the kernel), opening
    /// fails with a typed error, never a panic; with a device, it reports sane capabilities.
    #[test]
    fn opening_reports_no_device_cleanly_or_real_caps() {
        match Context::open(None) {
            Ok(ctx) => {
                let c = ctx.caps();
                assert!(c.max_sge >= 1 && c.max_qp_wr >= 1, "{c:?}");
                assert!((256..=4096).contains(&c.active_mtu), "{c:?}");
            }
            Err(VerbsError::NoLibrary(_) | VerbsError::NoDevice(_)) => {}
            Err(e) => panic!("unexpected: {e}"),
        }
        match Context::open(Some("no-such-device0")) {
            Err(
                VerbsError::NoLibrary(_)
                | VerbsError::NoDevice(_)
                | VerbsError::UnknownDevice { .. },
            ) => {}
            other => panic!("unexpected: {other:?}"),
        }
    }
}
