//! The RDM endpoint: messages and tagged messages over Braid QPs, one per peer, set up by the
//! Braid handshake on first use.
//!
//! Wire protocol (inside Braid SENDs, so reliable and in order per peer). Every provider
//! message starts with a 40-byte header, all fields little-endian:
//!
//! ```text
//!  0        1        2        4        8                16               24         32      40
//! +--------+--------+--------+--------+----------------+----------------+----------+-------+
//! |  kind  | flags  |   0    |  rkey  |      tag       |    cq data     |  length  | token |
//! +--------+--------+--------+--------+----------------+----------------+----------+-------+
//! kind 1 EAGER: the payload (length bytes, at most EAGER_MAX) follows the header.
//! kind 2 RTS:   rendezvous: the sender registered its buffer under rkey; the receiver READs
//!               `length` bytes from offset 0, then answers with a FIN carrying `token`.
//! kind 3 FIN:   the READ for `token` is done (flag ERROR: it failed); the send completes.
//! kind 4 PROBE: nothing; sent while rendezvous sends to the peer wait, so that a dead peer
//!               is noticed (Braid's retries fail) instead of waiting for a FIN forever.
//! flags: 1 TAGGED, 2 CQ DATA (the cq data field is valid), 4 ERROR (FIN).
//! ```
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use braid::{
    Access, Completion, ConnectError, ConnectionEvent, MemoryRegion, RecvWr, SendOp, SendWr,
    WcStatus,
};

use crate::objects::{
    Av, AvInner, Cntr, CntrInner, Cq, CqInner, Domain, DomainInner, Entry, Eq, FI_ADDR_NOTAVAIL,
    Mr, Net, Object, Table, fi_ops, get,
};
use crate::util::{
    Iov, gather, guard, guard_sz, iov_len, neg, read_iovs, scatter, to_sockaddr_in, wc_errno,
};
use crate::{EAGER_MAX, HEADER_LEN, RX_QUEUE, RX_SLOTS, SLOT_LEN, TX_SLOTS, fi};

mod rma;

const KIND_EAGER: u8 = 1;
const KIND_RTS: u8 = 2;
const KIND_FIN: u8 = 3;
/// A probe: carries nothing; the receiver reposts its buffer. Sent to a peer whose rendezvous
/// sends wait for their FIN, so that a dead peer fails the connection (and those sends).
const KIND_PROBE: u8 = 4;
/// An RMA event (FI_RMA_EVENT): the sender's RMA write or atomic (flag READ_EVENT: read) into
/// the receiver's memory has completed; the receiver counts it on its remote-write (remote-
/// read) counter. Braid's one-sided operations tell the target nothing, so the initiator of
/// an endpoint with FI_RMA_EVENT sends this after each successful operation.
const KIND_RMA_EVENT: u8 = 5;
/// How often a peer with rendezvous sends outstanding is probed.
const PROBE_EVERY: Duration = Duration::from_millis(500);
const FLAG_TAGGED: u8 = 1;
const FLAG_DATA: u8 = 2;
const FLAG_ERROR: u8 = 4;
const FLAG_READ_EVENT: u8 = 8;
/// Marks an operation issued by an `fi_inject*` call (an internal flag bit libfabric leaves
/// unused): such calls generate no completion. The FI_INJECT flag alone (in `fi_sendmsg`
/// flags or the endpoint's op_flags) only frees the buffer at once; its operation completes
/// as usual (fabtests' fi_msg_inject checks this).
pub(crate) const INJECT_CALL: u64 = 1 << 63;
/// Work-request ids of provider receive buffers have this bit; the rest are operation ids.
const BOUNCE: u64 = 1 << 63;
/// How long the provider thread sleeps between checks when nothing completes.
const THREAD_WAIT: Duration = Duration::from_millis(2);
/// How long after the application last ran progress (any call into the endpoint, its CQs or
/// counters) the provider thread keeps out of the way: while the application polls, its calls
/// drive the device and the matching themselves, and a second thread taking the device's
/// driver slot or the endpoint lock only makes the polling thread wait for it (on a machine
/// with few cores, for the scheduler to run it).
const APP_GRACE: Duration = Duration::from_millis(2);
/// The longest the provider thread sleeps while it keeps out of the way: it looks again after
/// half the grace, then after twice as long each time up to this, for as long as the
/// application keeps calling. Each look wakes a thread on a machine whose CPUs the
/// application's polling keeps busy, which preempts it for a few microseconds; a thousand
/// looks a second delayed about one round trip in a hundred (the device's progress thread
/// backs off the same way). Once the application stops calling, the thread takes over
/// within the grace plus this.
const APP_AWAY_SLEEP_MAX: Duration = Duration::from_millis(16);

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
struct Header {
    kind: u8,
    flags: u8,
    rkey: u32,
    tag: u64,
    data: u64,
    len: u64,
    token: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.rkey.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.data.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Header {
            kind: b[0],
            flags: b[1],
            rkey: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            tag: u64_at(8),
            data: u64_at(16),
            len: u64_at(24),
            token: u64_at(32),
        }
    }
}

/// What a receive matches on, and where it goes.
struct Recv {
    ctx: *mut c_void,
    iovs: Vec<Iov>,
    /// Directed receive: only from this peer.
    src: Option<SocketAddr>,
    tag: u64,
    ignore: u64,
    report: bool,
    /// Multi-receive: bytes of the buffer used so far.
    multi: Option<usize>,
}
// SAFETY: the raw pointers are the application's, used only as its contract allows.
unsafe impl Send for Recv {}

enum UnexpKind {
    /// Copied out of the provider buffer.
    Data(Vec<u8>),
    /// Still in the provider buffer `slot` of peer `peer_id` (the buffer is not reposted).
    Held { peer_id: u32, slot: u32, len: usize },
    /// A rendezvous request.
    Rts { rkey: u32, len: usize, token: u64 },
}

struct Unexp {
    peer: SocketAddr,
    tag: u64,
    data: Option<u64>,
    kind: UnexpKind,
    /// Claimed by FI_PEEK|FI_CLAIM with this context.
    claimed: Option<*mut c_void>,
}
// SAFETY: the context pointer is only handed back to the application.
unsafe impl Send for Unexp {}

impl Unexp {
    fn len(&self) -> usize {
        match &self.kind {
            UnexpKind::Data(v) => v.len(),
            UnexpKind::Held { len, .. } | UnexpKind::Rts { len, .. } => *len,
        }
    }
}

enum Op {
    /// An eager send in provider buffer `slot`; completes with the Braid SEND.
    Eager {
        slot: u32,
        ctx: *mut c_void,
        flags: u64,
        len: usize,
        report: bool,
    },
    /// A control message (RTS, FIN) in provider buffer `slot`; an RTS failing fails `rndv`.
    Ctrl { slot: u32, rndv: Option<u64> },
    /// A rendezvous send waiting for its FIN.
    Rndv {
        _mr: MemoryRegion,
        peer: SocketAddr,
        ctx: *mut c_void,
        flags: u64,
        len: usize,
        report: bool,
    },
    /// An RMA or atomic operation (see `rma`).
    Rma {
        ctx: *mut c_void,
        flags: u64,
        len: usize,
        report: bool,
        /// A provider buffer used as the source (inject) or scratch result.
        slot: Option<u32>,
        _mrs: Vec<MemoryRegion>,
        /// Counts against the read counter (READ, fetching atomics) or the write counter.
        read: bool,
        /// The target, and whether its memory was read (a READ) rather than written, for
        /// the RMA event sent after success (`None`: the endpoint has no FI_RMA_EVENT).
        event: Option<(SocketAddr, bool)>,
    },
    /// A rendezvous READ into a receive buffer.
    Read {
        recv: Recv,
        _mrs: Vec<MemoryRegion>,
        peer: SocketAddr,
        token: u64,
        got: usize,
        msg_len: usize,
        tagged: bool,
        tag: u64,
        data: Option<u64>,
        last_multi: bool,
    },
}
// SAFETY: the raw pointers are application contexts, handed back verbatim.
unsafe impl Send for Op {}

struct Peer {
    id: u32,
    qpn: u32,
    rx: MemoryRegion,
    /// A completion failed on its QP: rebuild the connection before the next use.
    broken: bool,
}

#[derive(Default)]
struct Bound {
    tx_cq: Option<Arc<CqInner>>,
    rx_cq: Option<Arc<CqInner>>,
    tx_selective: bool,
    rx_selective: bool,
    av: Option<Arc<AvInner>>,
    send_cntr: Option<Arc<CntrInner>>,
    recv_cntr: Option<Arc<CntrInner>>,
    write_cntr: Option<Arc<CntrInner>>,
    read_cntr: Option<Arc<CntrInner>>,
    remote_write_cntr: Option<Arc<CntrInner>>,
    remote_read_cntr: Option<Arc<CntrInner>>,
    bound_eq: bool,
}

struct State {
    bound: Bound,
    enabled: bool,
    closed: bool,
    tx_mr: MemoryRegion,
    free_tx: Vec<u32>,
    peers: HashMap<SocketAddr, Peer>,
    peer_ids: HashMap<u32, SocketAddr>,
    next_peer_id: u32,
    ops: HashMap<u64, Op>,
    next_op: u64,
    /// Posted receives: [messages, tagged].
    posted: [VecDeque<Recv>; 2],
    unexpected: [VecDeque<Unexp>; 2],
    unexpected_bytes: usize,
    /// FINs waiting for a provider buffer: (peer, token, error).
    fins: VecDeque<(SocketAddr, u64, bool)>,
    /// RMA events waiting for a provider buffer: (peer, read).
    rma_events: VecDeque<(SocketAddr, bool)>,
    conn_gen: u64,
    last_probe: std::time::Instant,
    tx_op_flags: u64,
    rx_op_flags: u64,
    min_multi_recv: usize,
    /// Where an eager send is put together before it goes into its provider buffer.
    tx_buf: Vec<u8>,
}

/// The endpoint's shared state.
pub(crate) struct EpInner {
    dom: Arc<DomainInner>,
    /// The Braid device this endpoint sends and receives on: the domain's for the first
    /// endpoint, one of its own for each further one.
    net: Arc<Net>,
    /// Whether `net` is the domain's (released on close).
    primary: bool,
    caps: u64,
    st: Mutex<State>,
    watch: Option<braid::handshake::ConnectionWatch>,
    stop: AtomicBool,
    ops_seq: AtomicU64,
    /// When the application last ran progress: nanoseconds since `epoch`, 0 for never.
    app_seen: AtomicU64,
    epoch: std::time::Instant,
    /// `APP_GRACE`, or `BRAID_FI_APP_GRACE_US` (0: the thread never keeps out of the way), ns.
    grace_ns: u64,
}

/// An endpoint.
#[repr(C)]
pub(crate) struct Ep {
    fid: fi::fid_ep,
    magic: u64,
    inner: Arc<EpInner>,
    thread: Mutex<Option<JoinHandle<()>>>,
    auto: bool,
}

impl Object for Ep {
    const CLASS: u32 = fi::FI_CLASS_EP;
    const MAGIC: u64 = 0x6272_6169_6465_7000;
    fn magic(&self) -> u64 {
        self.magic
    }
}

static EP_FID_OPS: Table<fi::fi_ops> = fi_ops!(ep_close, ep_bind, ep_control);
static EP_OPS: Table<fi::fi_ops_ep> = Table(fi::fi_ops_ep {
    size: std::mem::size_of::<fi::fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    tx_ctx: Some(no_tx_ctx),
    rx_ctx: Some(no_rx_ctx),
    rx_size_left: Some(rx_size_left),
    tx_size_left: Some(tx_size_left),
});
static CM_OPS: Table<fi::fi_ops_cm> = Table(fi::fi_ops_cm {
    size: std::mem::size_of::<fi::fi_ops_cm>(),
    setname: Some(no_setname),
    getname: Some(getname),
    getpeer: Some(no_getpeer),
    connect: Some(no_connect),
    listen: Some(no_listen),
    accept: Some(no_accept),
    reject: Some(no_reject),
    shutdown: Some(no_shutdown),
    join: Some(no_join),
});
static MSG_OPS: Table<fi::fi_ops_msg> = Table(fi::fi_ops_msg {
    size: std::mem::size_of::<fi::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
});
static TAGGED_OPS: Table<fi::fi_ops_tagged> = Table(fi::fi_ops_tagged {
    size: std::mem::size_of::<fi::fi_ops_tagged>(),
    recv: Some(tag_recv),
    recvv: Some(tag_recvv),
    recvmsg: Some(tag_recvmsg),
    send: Some(tag_send),
    sendv: Some(tag_sendv),
    sendmsg: Some(tag_sendmsg),
    inject: Some(tag_inject),
    senddata: Some(tag_senddata),
    injectdata: Some(tag_injectdata),
});

pub(crate) unsafe extern "C" fn endpoint_open(
    domain: *mut fi::fid_domain,
    info: *mut fi::fi_info,
    ep: *mut *mut fi::fid_ep,
    context: *mut c_void,
) -> i32 {
    // SAFETY: forwarded.
    unsafe { endpoint_open2(domain, info, ep, 0, context) }
}

pub(crate) unsafe extern "C" fn endpoint_open2(
    domain: *mut fi::fid_domain,
    info: *mut fi::fi_info,
    ep: *mut *mut fi::fid_ep,
    flags: u64,
    context: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let d = match unsafe { get::<Domain>(domain.cast()) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        if ep.is_null() || flags != 0 {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: info is null or valid.
        let spec = unsafe { crate::info::read_info(info) };
        let (caps, tx_op_flags, rx_op_flags) = match &spec {
            Some(s) => (s.caps, s.tx_op_flags, s.rx_op_flags),
            None => (crate::info::CAPS, 0, 0),
        };
        if caps & crate::info::PRIMARY_CAPS == 0 {
            return neg(fi::FI_EINVAL);
        }
        if d.inner.eps.load(Ordering::Acquire) >= crate::MAX_EPS_PER_DOMAIN {
            return neg(fi::FI_EBUSY);
        }
        // An endpoint's address is its Braid device's, and the handshake keys connections by
        // device address: the first endpoint takes the domain's device, each further one opens
        // its own on the domain's interface (see the module docs).
        let primary = d
            .inner
            .primary_taken
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let net = if primary {
            d.inner.net.clone()
        } else {
            match Net::open(SocketAddr::new(d.inner.spec.src.ip(), 0)) {
                Ok(n) => Arc::new(n),
                Err(e) => return e,
            }
        };
        let release = || {
            if primary {
                d.inner.primary_taken.store(false, Ordering::Release);
            }
        };
        let tx_mr = match net.pd.alloc_mr(TX_SLOTS * SLOT_LEN, Access::LOCAL_WRITE) {
            Ok(m) => m,
            Err(_) => {
                release();
                return neg(fi::FI_ENOMEM);
            }
        };
        d.inner.eps.fetch_add(1, Ordering::AcqRel);
        let auto = d.inner.spec.data_progress != fi::FI_PROGRESS_MANUAL;
        let inner = Arc::new(EpInner {
            dom: d.inner.clone(),
            watch: net.dev.connection_watch(),
            net,
            primary,
            caps,
            st: Mutex::new(State {
                bound: Bound::default(),
                enabled: false,
                closed: false,
                tx_mr,
                free_tx: (0..TX_SLOTS as u32).rev().collect(),
                peers: HashMap::new(),
                peer_ids: HashMap::new(),
                next_peer_id: 1,
                ops: HashMap::new(),
                next_op: 1,
                posted: [VecDeque::new(), VecDeque::new()],
                unexpected: [VecDeque::new(), VecDeque::new()],
                unexpected_bytes: 0,
                fins: VecDeque::new(),
                rma_events: VecDeque::new(),
                conn_gen: u64::MAX,
                last_probe: std::time::Instant::now(),
                tx_op_flags,
                rx_op_flags,
                min_multi_recv: 64,
                tx_buf: Vec::with_capacity(SLOT_LEN),
            }),
            stop: AtomicBool::new(false),
            ops_seq: AtomicU64::new(0),
            app_seen: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            grace_ns: std::env::var("BRAID_FI_APP_GRACE_US")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(APP_GRACE.as_nanos() as u64, |us| us.saturating_mul(1000)),
        });
        let obj = Box::new(Ep {
            fid: fi::fid_ep {
                fid: fi::fid {
                    fclass: fi::FI_CLASS_EP as usize,
                    context,
                    ops: EP_FID_OPS.ptr(),
                },
                ops: EP_OPS.ptr(),
                cm: CM_OPS.ptr(),
                msg: MSG_OPS.ptr(),
                rma: rma::RMA_OPS.ptr(),
                tagged: TAGGED_OPS.ptr(),
                atomic: rma::ATOMIC_OPS.ptr(),
                collective: crate::ep_stubs::COLLECTIVE_OPS.ptr(),
            },
            magic: Ep::MAGIC,
            inner,
            thread: Mutex::new(None),
            auto,
        });
        let p = Box::into_raw(obj);
        // SAFETY: ep is non-null (checked); p starts with fid_ep.
        unsafe { *ep = p.cast() };
        0
    })
}

/// The endpoint behind `ep`.
///
/// # Safety
/// As [`get`].
unsafe fn ep_get<'a>(ep: *const fi::fid_ep) -> Result<&'a Ep, i32> {
    // SAFETY: forwarded.
    unsafe { get::<Ep>(ep.cast()) }
}

unsafe extern "C" fn ep_close(fid: *mut fi::fid) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Ep>(fid) } {
            Ok(e) => e,
            Err(x) => return x,
        };
        e.inner.stop.store(true, Ordering::Release);
        if let Some(t) = e.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.thread().unpark();
            let _ = t.join();
        }
        if std::env::var_os("BRAID_FI_STATS").is_some() {
            // A diagnostic for profiling (bench/results/libfabric-*.md): the device's
            // counters and RTT distribution as the endpoint closes.
            let dev = &e.inner.net.dev;
            eprintln!(
                "braid-fi stats {}: {:?}\nbraid-fi rtt: {:?}",
                dev.local_addr(),
                dev.stats(),
                dev.rtt_summary()
            );
        }
        {
            let mut st = e.inner.lock();
            st.closed = true;
            let peers: Vec<SocketAddr> = st.peers.keys().copied().collect();
            for p in peers {
                e.inner.net.dev.disconnect(p);
            }
            st.peers.clear();
            st.ops.clear();
            st.bound = Bound::default();
        }
        if e.inner.primary {
            e.inner.dom.primary_taken.store(false, Ordering::Release);
        }
        e.inner.dom.eps.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: validated; closing gives up the handle.
        let b = unsafe { Box::from_raw(fid.cast::<Ep>()) };
        let mut b = b;
        b.magic = 0;
        drop(b);
        0
    })
}

unsafe extern "C" fn ep_bind(fid: *mut fi::fid, bfid: *mut fi::fid, flags: u64) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Ep>(fid) } {
            Ok(e) => e,
            Err(x) => return x,
        };
        if bfid.is_null() {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: non-null, points to a fid.
        let class = unsafe { (*bfid).fclass } as u32;
        let mut st = e.inner.lock();
        if st.enabled {
            return neg(fi::FI_EOPBADSTATE);
        }
        let weak = Arc::downgrade(&e.inner);
        match class {
            fi::FI_CLASS_CQ => {
                // SAFETY: validated by get().
                let cq = match unsafe { get::<Cq>(bfid) } {
                    Ok(c) => c,
                    Err(x) => return x,
                };
                let known =
                    fi::FI_TRANSMIT as u64 | fi::FI_RECV as u64 | fi::FI_SELECTIVE_COMPLETION;
                if flags & !known != 0 || flags & (fi::FI_TRANSMIT as u64 | fi::FI_RECV as u64) == 0
                {
                    return neg(fi::FI_EBADFLAGS);
                }
                let selective = flags & fi::FI_SELECTIVE_COMPLETION != 0;
                if flags & fi::FI_TRANSMIT as u64 != 0 {
                    st.bound.tx_cq = Some(cq.inner.clone());
                    st.bound.tx_selective = selective;
                }
                if flags & fi::FI_RECV as u64 != 0 {
                    st.bound.rx_cq = Some(cq.inner.clone());
                    st.bound.rx_selective = selective;
                }
                cq.inner
                    .eps
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(weak);
                0
            }
            fi::FI_CLASS_AV => {
                // SAFETY: validated by get().
                let av = match unsafe { get::<Av>(bfid) } {
                    Ok(a) => a,
                    Err(x) => return x,
                };
                st.bound.av = Some(av.inner.clone());
                0
            }
            fi::FI_CLASS_CNTR => {
                // SAFETY: validated by get().
                let c = match unsafe { get::<Cntr>(bfid) } {
                    Ok(c) => c,
                    Err(x) => return x,
                };
                // Remote-side counters (FI_REMOTE_READ/WRITE) need FI_RMA_EVENT (see
                // KIND_RMA_EVENT).
                let mut known = fi::FI_SEND as u64
                    | fi::FI_RECV as u64
                    | fi::FI_READ as u64
                    | fi::FI_WRITE as u64;
                if e.inner.caps & fi::FI_RMA_EVENT != 0 {
                    known |= fi::FI_REMOTE_READ as u64 | fi::FI_REMOTE_WRITE as u64;
                }
                if flags & !known != 0 || flags == 0 {
                    return neg(fi::FI_EBADFLAGS);
                }
                if flags & fi::FI_SEND as u64 != 0 {
                    st.bound.send_cntr = Some(c.inner.clone());
                }
                if flags & fi::FI_RECV as u64 != 0 {
                    st.bound.recv_cntr = Some(c.inner.clone());
                }
                if flags & fi::FI_WRITE as u64 != 0 {
                    st.bound.write_cntr = Some(c.inner.clone());
                }
                if flags & fi::FI_READ as u64 != 0 {
                    st.bound.read_cntr = Some(c.inner.clone());
                }
                if flags & fi::FI_REMOTE_WRITE as u64 != 0 {
                    st.bound.remote_write_cntr = Some(c.inner.clone());
                }
                if flags & fi::FI_REMOTE_READ as u64 != 0 {
                    st.bound.remote_read_cntr = Some(c.inner.clone());
                }
                c.inner
                    .eps
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(weak);
                0
            }
            fi::FI_CLASS_EQ => {
                // SAFETY: validated by get().
                if let Err(x) = unsafe { get::<Eq>(bfid) } {
                    return x;
                }
                st.bound.bound_eq = true;
                0
            }
            fi::FI_CLASS_MR => {
                // SAFETY: validated by get().
                match unsafe { get::<Mr>(bfid) } {
                    Ok(_) => 0,
                    Err(x) => x,
                }
            }
            _ => neg(fi::FI_EINVAL),
        }
    })
}

unsafe extern "C" fn ep_control(fid: *mut fi::fid, command: i32, arg: *mut c_void) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Ep>(fid) } {
            Ok(e) => e,
            Err(x) => return x,
        };
        match command as u32 {
            fi::FI_ENABLE => {
                let mut st = e.inner.lock();
                if st.enabled {
                    return 0;
                }
                if st.bound.av.is_none() {
                    return neg(fi::FI_ENOAV);
                }
                if st.bound.tx_cq.is_none() && st.bound.send_cntr.is_none() {
                    return neg(fi::FI_ENOCQ);
                }
                if st.bound.rx_cq.is_none() && st.bound.recv_cntr.is_none() {
                    return neg(fi::FI_ENOCQ);
                }
                st.enabled = true;
                drop(st);
                if e.auto {
                    let inner = e.inner.clone();
                    let t = std::thread::Builder::new()
                        .name("braid-fi-progress".into())
                        .spawn(move || {
                            let first = Duration::from_nanos(inner.grace_ns / 2);
                            let mut away = first;
                            while !inner.stop.load(Ordering::Acquire) {
                                if inner.app_active() {
                                    // Parked, not asleep: closing the endpoint unparks it.
                                    std::thread::park_timeout(away);
                                    away = (away * 2).min(APP_AWAY_SLEEP_MAX.max(first));
                                    continue;
                                }
                                away = first;
                                inner.net.cq.wait_ready(THREAD_WAIT);
                                inner.progress_background();
                            }
                        });
                    match t {
                        Ok(t) => *e.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(t),
                        Err(_) => return neg(fi::FI_ENOMEM),
                    }
                }
                0
            }
            fi::FI_GETOPSFLAG | fi::FI_SETOPSFLAG => {
                if arg.is_null() {
                    return neg(fi::FI_EINVAL);
                }
                // SAFETY: these commands take a u64* holding FI_TRANSMIT or FI_RECV.
                let flags = unsafe { &mut *arg.cast::<u64>() };
                let mut st = e.inner.lock();
                let tx = *flags & fi::FI_TRANSMIT as u64 != 0;
                let rx = *flags & fi::FI_RECV as u64 != 0;
                if tx == rx {
                    return neg(fi::FI_EINVAL);
                }
                let dir = fi::FI_TRANSMIT as u64 | fi::FI_RECV as u64;
                if command as u32 == fi::FI_SETOPSFLAG {
                    let v = *flags & !dir;
                    if v & !crate::info::OP_FLAGS != 0 {
                        return neg(fi::FI_EINVAL);
                    }
                    if tx {
                        st.tx_op_flags = v;
                    } else {
                        st.rx_op_flags = v;
                    }
                } else {
                    *flags = (*flags & dir) | if tx { st.tx_op_flags } else { st.rx_op_flags };
                }
                0
            }
            _ => neg(fi::FI_ENOSYS),
        }
    })
}

unsafe extern "C" fn ep_cancel(fid: fi::fid_t, context: *mut c_void) -> isize {
    guard_sz(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Ep>(fid) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        let mut st = e.inner.lock();
        for t in 0..2 {
            if let Some(i) = st.posted[t].iter().position(|r| r.ctx == context) {
                let Some(r) = st.posted[t].remove(i) else {
                    continue;
                };
                let flags = fi::FI_RECV as u64
                    | if t == 1 {
                        fi::FI_TAGGED as u64
                    } else {
                        fi::FI_MSG as u64
                    };
                let mut en = Entry::ok(r.ctx, flags, 0);
                en.tag = r.tag;
                en.err = Some((fi::FI_ECANCELED, 0));
                if let Some(cq) = &st.bound.rx_cq {
                    cq.push(en);
                }
                return 0;
            }
        }
        -(fi::FI_ENOENT as isize)
    })
}

unsafe extern "C" fn ep_getopt(
    fid: fi::fid_t,
    level: i32,
    optname: i32,
    optval: *mut c_void,
    optlen: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Ep>(fid) } {
            Ok(e) => e,
            Err(x) => return x,
        };
        if level as u32 != fi::FI_OPT_ENDPOINT {
            return neg(fi::FI_ENOPROTOOPT);
        }
        if optval.is_null() || optlen.is_null() {
            return neg(fi::FI_EINVAL);
        }
        match optname as u32 {
            fi::FI_OPT_MIN_MULTI_RECV => {
                // SAFETY: optlen non-null; optval has *optlen bytes.
                unsafe {
                    if *optlen < std::mem::size_of::<usize>() {
                        return neg(fi::FI_ETOOSMALL);
                    }
                    *optval.cast::<usize>() = e.inner.lock().min_multi_recv;
                    *optlen = std::mem::size_of::<usize>();
                }
                0
            }
            _ => neg(fi::FI_ENOPROTOOPT),
        }
    })
}

unsafe extern "C" fn ep_setopt(
    fid: fi::fid_t,
    level: i32,
    optname: i32,
    optval: *const c_void,
    optlen: usize,
) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Ep>(fid) } {
            Ok(e) => e,
            Err(x) => return x,
        };
        if level as u32 != fi::FI_OPT_ENDPOINT {
            return neg(fi::FI_ENOPROTOOPT);
        }
        if optval.is_null() {
            return neg(fi::FI_EINVAL);
        }
        match optname as u32 {
            fi::FI_OPT_MIN_MULTI_RECV => {
                if optlen < std::mem::size_of::<usize>() {
                    return neg(fi::FI_EINVAL);
                }
                // SAFETY: optval has optlen >= size_of::<usize>() bytes.
                let v = unsafe { std::ptr::read_unaligned(optval.cast::<usize>()) };
                e.inner.lock().min_multi_recv = v;
                0
            }
            _ => neg(fi::FI_ENOPROTOOPT),
        }
    })
}

unsafe extern "C" fn no_tx_ctx(
    _: *mut fi::fid_ep,
    _: i32,
    _: *mut fi::fi_tx_attr,
    _: *mut *mut fi::fid_ep,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_rx_ctx(
    _: *mut fi::fid_ep,
    _: i32,
    _: *mut fi::fi_rx_attr,
    _: *mut *mut fi::fid_ep,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}

unsafe extern "C" fn rx_size_left(ep: *mut fi::fid_ep) -> isize {
    guard_sz(|| {
        // SAFETY: validated.
        let e = match unsafe { ep_get(ep) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        let st = e.inner.lock();
        (RX_QUEUE - st.posted[0].len() - st.posted[1].len()) as isize
    })
}
unsafe extern "C" fn tx_size_left(ep: *mut fi::fid_ep) -> isize {
    guard_sz(|| {
        // SAFETY: validated.
        let e = match unsafe { ep_get(ep) } {
            Ok(e) => e,
            Err(x) => return x as isize,
        };
        e.inner.lock().free_tx.len() as isize
    })
}

unsafe extern "C" fn no_setname(_: fi::fid_t, _: *mut c_void, _: usize) -> i32 {
    neg(fi::FI_ENOSYS)
}

unsafe extern "C" fn getname(fid: fi::fid_t, addr: *mut c_void, addrlen: *mut usize) -> i32 {
    guard(|| {
        // SAFETY: validated by get().
        let e = match unsafe { get::<Ep>(fid) } {
            Ok(e) => e,
            Err(x) => return x,
        };
        if addrlen.is_null() {
            return neg(fi::FI_EINVAL);
        }
        let raw = to_sockaddr_in(e.inner.net.dev.local_addr());
        let need = std::mem::size_of::<libc::sockaddr_in>();
        // SAFETY: addrlen non-null; addr has *addrlen writable bytes by contract.
        unsafe {
            let room = *addrlen;
            *addrlen = need;
            if room < need || addr.is_null() {
                return neg(fi::FI_ETOOSMALL);
            }
            std::ptr::copy_nonoverlapping(std::ptr::addr_of!(raw).cast::<u8>(), addr.cast(), need);
        }
        0
    })
}

unsafe extern "C" fn no_getpeer(_: *mut fi::fid_ep, _: *mut c_void, _: *mut usize) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_connect(
    _: *mut fi::fid_ep,
    _: *const c_void,
    _: *const c_void,
    _: usize,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_listen(_: *mut fi::fid_pep) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_accept(_: *mut fi::fid_ep, _: *const c_void, _: usize) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_reject(
    _: *mut fi::fid_pep,
    _: fi::fid_t,
    _: *const c_void,
    _: usize,
) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_shutdown(_: *mut fi::fid_ep, _: u64) -> i32 {
    neg(fi::FI_ENOSYS)
}
unsafe extern "C" fn no_join(
    _: *mut fi::fid_ep,
    _: *const c_void,
    _: u64,
    _: *mut *mut fi::fid_mc,
    _: *mut c_void,
) -> i32 {
    neg(fi::FI_ENOSYS)
}

// ---------------------------------------------------------------------------------------------

/// One send, as the ops describe it.
struct SendReq {
    iovs: Vec<Iov>,
    dest: u64,
    tag: Option<u64>,
    data: Option<u64>,
    ctx: *mut c_void,
    flags: u64,
}

/// One receive, as the ops describe it.
struct RecvReq {
    iovs: Vec<Iov>,
    src: u64,
    tag: Option<(u64, u64)>,
    ctx: *mut c_void,
    flags: u64,
}

impl EpInner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the provider's matching and protocol: connection events, Braid completions,
    /// waiting control messages. Called by the application's calls (CQ and counter reads and
    /// waits, `fi_trywait`), which keeps the provider thread out of the way for `APP_GRACE`.
    pub(crate) fn progress(&self) {
        self.note_app();
        let mut st = self.lock();
        if st.closed {
            return;
        }
        self.progress_locked(&mut st);
    }

    /// The provider thread's progress (FI_PROGRESS_AUTO): as [`progress`](Self::progress),
    /// without counting as an application call.
    fn progress_background(&self) {
        let mut st = self.lock();
        if !st.closed {
            self.progress_locked(&mut st);
        }
    }

    /// Progress for an application about to block (`fi_trywait`): the provider thread takes
    /// over at once instead of after `APP_GRACE`.
    pub(crate) fn progress_then_wait(&self) {
        self.progress_background();
        self.app_seen.store(0, Ordering::Relaxed);
    }

    /// Records that the application is running progress now. Writes the shared word only
    /// when the recorded time is a tenth of `APP_GRACE` old, so a spinning poller mostly just
    /// reads it.
    pub(super) fn note_app(&self) {
        let now = (self.epoch.elapsed().as_nanos() as u64).max(1);
        let step = self.grace_ns / 10;
        if now.saturating_sub(self.app_seen.load(Ordering::Relaxed)) >= step {
            self.app_seen.store(now, Ordering::Relaxed);
        }
    }

    /// Whether the application ran progress within `APP_GRACE`.
    fn app_active(&self) -> bool {
        let seen = self.app_seen.load(Ordering::Relaxed);
        seen != 0 && (self.epoch.elapsed().as_nanos() as u64).saturating_sub(seen) < self.grace_ns
    }

    fn progress_locked(&self, st: &mut State) {
        if let Some(w) = &self.watch {
            let g = w.generation();
            if g != st.conn_gen {
                st.conn_gen = g;
                while let Some(ev) = self.net.dev.poll_connection_event() {
                    self.on_connection(st, ev);
                }
            }
        }
        let mut buf = [Completion {
            wr_id: 0,
            status: WcStatus::Flushed,
            opcode: braid::WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qpn: 0,
        }; 32];
        loop {
            let n = self.net.cq.poll(&mut buf);
            for c in &buf[..n] {
                self.on_completion(st, c);
            }
            if n < buf.len() {
                break;
            }
        }
        while let Some((peer, token, err)) = st.fins.pop_front() {
            if !self.send_ctrl(
                st,
                peer,
                KIND_FIN,
                if err { FLAG_ERROR } else { 0 },
                0,
                0,
                token,
                None,
            ) {
                st.fins.push_front((peer, token, err));
                break;
            }
        }
        while let Some((peer, read)) = st.rma_events.pop_front() {
            let flags = if read { FLAG_READ_EVENT } else { 0 };
            if !self.send_ctrl(st, peer, KIND_RMA_EVENT, flags, 0, 0, 0, None) {
                st.rma_events.push_front((peer, read));
                break;
            }
        }
        if st.last_probe.elapsed() >= PROBE_EVERY {
            st.last_probe = std::time::Instant::now();
            let mut waiting: Vec<SocketAddr> = st
                .ops
                .values()
                .filter_map(|op| match op {
                    Op::Rndv { peer, .. } => Some(*peer),
                    _ => None,
                })
                .collect();
            waiting.sort();
            waiting.dedup();
            for peer in waiting {
                if st.peers.get(&peer).is_some_and(|p| !p.broken) {
                    self.send_ctrl(st, peer, KIND_PROBE, 0, 0, 0, 0, None);
                }
            }
        }
        self.ops_seq.fetch_add(1, Ordering::Relaxed);
    }

    fn on_connection(&self, st: &mut State, ev: ConnectionEvent) {
        match ev {
            ConnectionEvent::Established(c) => {
                // The events can lag behind the connections: by the time this one is read,
                // the peer may have replaced it (several times over). Only the connection
                // that serves the peer now decides the peer's buffers; acting on an older
                // one would drop the buffers posted to the current QP and so fail it.
                if self.net.dev.local_qpn(c.peer) != Some(c.local.qpn) {
                    return;
                }
                let stale = st.peers.get(&c.peer).is_some_and(|p| p.qpn != c.local.qpn);
                if stale && let Some(p) = st.peers.remove(&c.peer) {
                    st.peer_ids.remove(&p.id);
                }
                if !st.peers.contains_key(&c.peer) {
                    self.add_peer(st, c.peer);
                }
            }
            ConnectionEvent::Replaced { peer, old_qpn } => {
                if st.peers.get(&peer).is_some_and(|p| p.qpn == old_qpn)
                    && let Some(p) = st.peers.remove(&peer)
                {
                    st.peer_ids.remove(&p.id);
                }
            }
            ConnectionEvent::Failed { peer, qpn, .. } => {
                if st.peers.get(&peer).is_some_and(|p| p.qpn == qpn)
                    && let Some(p) = st.peers.remove(&peer)
                {
                    st.peer_ids.remove(&p.id);
                }
            }
            _ => {}
        }
    }

    /// Creates the peer's provider receive buffers and posts them (which starts a connection
    /// attempt if there is none). Returns false if that failed.
    fn add_peer(&self, st: &mut State, peer: SocketAddr) -> bool {
        let Ok(rx) = self
            .net
            .pd
            .alloc_mr(RX_SLOTS * SLOT_LEN, Access::LOCAL_WRITE)
        else {
            return false;
        };
        let id = st.next_peer_id;
        st.next_peer_id = st.next_peer_id.wrapping_add(1).max(1);
        let slot_wr = |slot: u32| RecvWr {
            wr_id: bounce_id(id, slot),
            sges: vec![rx.sge(u64::from(slot) * SLOT_LEN as u64, SLOT_LEN as u32)],
        };
        // The first post picks (or starts) the connection; the others go to that same QP, so
        // every buffer of `rx` belongs to the QP recorded below.
        let Ok(qpn) = self.net.dev.post_recv_to(peer, slot_wr(0)) else {
            return false;
        };
        for slot in 1..RX_SLOTS as u32 {
            if self.net.dev.post_recv_on(peer, qpn, slot_wr(slot)).is_err() {
                return false;
            }
        }
        st.peer_ids.insert(id, peer);
        st.peers.insert(
            peer,
            Peer {
                id,
                qpn,
                rx,
                broken: false,
            },
        );
        true
    }

    /// Makes sure `peer` has a connection (or one being set up) with receive buffers.
    fn ensure_peer(&self, st: &mut State, peer: SocketAddr) -> Result<(), isize> {
        if let Some(p) = st.peers.get(&peer) {
            if !p.broken {
                return Ok(());
            }
            // The old QP failed: start over (its outstanding work has completed).
            let id = p.id;
            st.peers.remove(&peer);
            st.peer_ids.remove(&id);
            self.net.dev.disconnect(peer);
        }
        if self.add_peer(st, peer) {
            Ok(())
        } else {
            Err(-(fi::FI_EAGAIN as isize))
        }
    }

    fn new_op(st: &mut State, op: Op) -> u64 {
        let id = st.next_op;
        st.next_op = (st.next_op + 1) & !BOUNCE;
        st.ops.insert(id, op);
        id
    }

    fn tx_flags(tagged: bool) -> u64 {
        fi::FI_SEND as u64
            | if tagged {
                fi::FI_TAGGED as u64
            } else {
                fi::FI_MSG as u64
            }
    }

    fn rx_flags(tagged: bool) -> u64 {
        fi::FI_RECV as u64
            | if tagged {
                fi::FI_TAGGED as u64
            } else {
                fi::FI_MSG as u64
            }
    }

    /// Sends a header-only control message from a provider buffer; false if none is free.
    #[allow(clippy::too_many_arguments)]
    fn send_ctrl(
        &self,
        st: &mut State,
        peer: SocketAddr,
        kind: u8,
        flags: u8,
        rkey: u32,
        len: u64,
        token: u64,
        extra: Option<(u64, u64)>,
    ) -> bool {
        let Some(slot) = st.free_tx.pop() else {
            return false;
        };
        let (tag, data) = extra.unwrap_or((0, 0));
        let h = Header {
            kind,
            flags,
            rkey,
            tag,
            data,
            len,
            token,
        };
        let off = u64::from(slot) * SLOT_LEN as u64;
        if st.tx_mr.write(off, &h.encode()).is_err() {
            st.free_tx.push(slot);
            return false;
        }
        let rndv = (kind == KIND_RTS).then_some(token);
        let id = Self::new_op(st, Op::Ctrl { slot, rndv });
        let wr = SendWr {
            wr_id: id,
            op: SendOp::Send,
            sges: vec![st.tx_mr.sge(off, HEADER_LEN as u32)],
            signaled: true,
        };
        if self.net.dev.post_send_to(peer, wr).is_err() {
            st.ops.remove(&id);
            st.free_tx.push(slot);
            return false;
        }
        true
    }

    fn send(&self, req: SendReq) -> isize {
        let mut st = self.lock();
        if !st.enabled {
            return -(fi::FI_EOPBADSTATE as isize);
        }
        let tagged = req.tag.is_some();
        let need = if tagged { fi::FI_TAGGED } else { fi::FI_MSG } as u64;
        if self.caps & need == 0 {
            return -(fi::FI_EOPNOTSUPP as isize);
        }
        let Some(peer) = st.bound.av.as_ref().and_then(|a| a.lookup(req.dest)) else {
            return -(fi::FI_EINVAL as isize);
        };
        let len = iov_len(&req.iovs);
        if len > crate::MAX_MSG_SIZE {
            return -(fi::FI_EMSGSIZE as isize);
        }
        let flags = req.flags | st.tx_op_flags;
        let inject = flags & fi::FI_INJECT as u64 != 0;
        if inject && len > EAGER_MAX {
            return -(fi::FI_EMSGSIZE as isize);
        }
        let report = flags & INJECT_CALL == 0
            && (!st.bound.tx_selective || flags & fi::FI_COMPLETION as u64 != 0);
        self.note_app();
        self.progress_locked(&mut st);
        if let Err(e) = self.ensure_peer(&mut st, peer) {
            return e;
        }
        let mut hflags = if tagged { FLAG_TAGGED } else { 0 };
        if req.data.is_some() {
            hflags |= FLAG_DATA;
        }
        let tag = req.tag.unwrap_or(0);
        let data = req.data.unwrap_or(0);
        // FI_DELIVERY_COMPLETE promises the data is in the receive buffer when the send
        // completes: rendezvous gives exactly that (the FIN follows the receiver's READ),
        // eager does not (its completion means "in the peer's provider buffer").
        let delivery = flags & fi::FI_DELIVERY_COMPLETE as u64 != 0 && !inject && len > 0;
        if len <= EAGER_MAX && !delivery {
            let Some(slot) = st.free_tx.pop() else {
                return -(fi::FI_EAGAIN as isize);
            };
            let h = Header {
                kind: KIND_EAGER,
                flags: hflags,
                rkey: 0,
                tag,
                data,
                len: len as u64,
                token: 0,
            };
            let off = u64::from(slot) * SLOT_LEN as u64;
            // The message is put together in a buffer of the endpoint's, as long as it is
            // (a buffer of the slot's size on the stack was zeroed whole for every send).
            let State { tx_buf, tx_mr, .. } = &mut *st;
            tx_buf.clear();
            tx_buf.extend_from_slice(&h.encode());
            tx_buf.resize(HEADER_LEN + len, 0);
            // SAFETY: the iovs describe readable application memory (the send contract).
            unsafe { gather(&req.iovs, &mut tx_buf[HEADER_LEN..]) };
            if tx_mr.write(off, tx_buf).is_err() {
                st.free_tx.push(slot);
                return -(fi::FI_EIO as isize);
            }
            let id = Self::new_op(
                &mut st,
                Op::Eager {
                    slot,
                    ctx: req.ctx,
                    flags: Self::tx_flags(tagged),
                    len,
                    report,
                },
            );
            let wr = SendWr {
                wr_id: id,
                op: SendOp::Send,
                sges: vec![st.tx_mr.sge(off, (HEADER_LEN + len) as u32)],
                signaled: true,
            };
            if self.net.dev.post_send_to(peer, wr).is_err() {
                st.ops.remove(&id);
                st.free_tx.push(slot);
                return -(fi::FI_EAGAIN as isize);
            }
            return 0;
        }
        // Rendezvous: register the buffer (or a contiguous copy of a gather list) for the
        // receiver's READ.
        let mr = if req.iovs.len() == 1 {
            // SAFETY: the send contract keeps the buffer valid and unmodified until the send
            // completes; the region is dropped (deregistered) at the latest then.
            unsafe {
                self.net
                    .pd
                    .register_raw(req.iovs[0].base, len, Access::REMOTE_READ)
            }
        } else {
            let mut v = vec![0u8; len];
            // SAFETY: the iovs describe readable application memory.
            unsafe { gather(&req.iovs, &mut v) };
            self.net
                .pd
                .alloc_mr(len, Access::LOCAL_WRITE | Access::REMOTE_READ)
                .and_then(|m| {
                    m.write(0, &v).map_err(|_| braid::ResourceError::Limit)?;
                    Ok(m)
                })
        };
        let Ok(mr) = mr else {
            return -(fi::FI_ENOMEM as isize);
        };
        if st.free_tx.is_empty() {
            return -(fi::FI_EAGAIN as isize);
        }
        let rkey = mr.rkey();
        let token = Self::new_op(
            &mut st,
            Op::Rndv {
                _mr: mr,
                peer,
                ctx: req.ctx,
                flags: Self::tx_flags(tagged),
                len,
                report,
            },
        );
        if !self.send_ctrl(
            &mut st,
            peer,
            KIND_RTS,
            hflags,
            rkey,
            len as u64,
            token,
            Some((tag, data)),
        ) {
            st.ops.remove(&token);
            return -(fi::FI_EAGAIN as isize);
        }
        0
    }

    fn matches(r: &Recv, peer: SocketAddr, tagged: bool, tag: u64) -> bool {
        if r.src.is_some_and(|s| s != peer) {
            return false;
        }
        !tagged || (r.tag | r.ignore) == (tag | r.ignore)
    }

    fn recv(&self, req: RecvReq) -> isize {
        let mut st = self.lock();
        if !st.enabled {
            return -(fi::FI_EOPBADSTATE as isize);
        }
        let tagged = req.tag.is_some();
        let need = if tagged { fi::FI_TAGGED } else { fi::FI_MSG } as u64;
        if self.caps & need == 0 {
            return -(fi::FI_EOPNOTSUPP as isize);
        }
        let flags = req.flags | st.rx_op_flags;
        let multi = flags & fi::FI_MULTI_RECV as u64 != 0;
        if multi && (tagged || self.caps & fi::FI_MULTI_RECV as u64 == 0) {
            return -(fi::FI_EOPNOTSUPP as isize);
        }
        if multi && req.iovs.len() != 1 {
            return -(fi::FI_EINVAL as isize);
        }
        let src = if self.caps & fi::FI_DIRECTED_RECV != 0 && req.src != FI_ADDR_NOTAVAIL {
            match st.bound.av.as_ref().and_then(|a| a.lookup(req.src)) {
                Some(s) => Some(s),
                None => return -(fi::FI_EINVAL as isize),
            }
        } else {
            None
        };
        let (tag, ignore) = req.tag.unwrap_or((0, 0));
        let report = !st.bound.rx_selective || flags & fi::FI_COMPLETION as u64 != 0;
        let mut r = Recv {
            ctx: req.ctx,
            iovs: req.iovs,
            src,
            tag,
            ignore,
            report,
            multi: multi.then_some(0),
        };
        self.note_app();
        self.progress_locked(&mut st);
        let t = usize::from(tagged);
        if tagged && flags & fi::FI_PEEK as u64 != 0 {
            return self.peek(&mut st, r, flags);
        }
        if tagged && flags & fi::FI_CLAIM != 0 {
            // Take the message claimed with this context.
            let Some(i) = st.unexpected[1]
                .iter()
                .position(|u| u.claimed == Some(r.ctx))
            else {
                return -(fi::FI_EINVAL as isize);
            };
            let Some(u) = st.unexpected[1].remove(i) else {
                return -(fi::FI_EINVAL as isize);
            };
            if flags & fi::FI_DISCARD != 0 {
                self.discard(&mut st, u, r);
            } else {
                self.deliver_unexpected(&mut st, u, r, true);
            }
            return 0;
        }
        if st.posted[0].len() + st.posted[1].len() >= RX_QUEUE {
            return -(fi::FI_EAGAIN as isize);
        }
        // Unexpected messages first, oldest first.
        while let Some(i) = st.unexpected[t]
            .iter()
            .position(|u| u.claimed.is_none() && Self::matches(&r, u.peer, tagged, u.tag))
        {
            let Some(u) = st.unexpected[t].remove(i) else {
                break;
            };
            if r.multi.is_none() {
                self.deliver_unexpected(&mut st, u, r, tagged);
                return 0;
            }
            match self.take_multi(&mut st, &mut r, u.len()) {
                Some((sub, last)) => {
                    self.deliver_unexpected_multi(&mut st, u, sub, last);
                    if last {
                        return 0;
                    }
                }
                None => {
                    st.unexpected[t].push_front(u);
                    break;
                }
            }
        }
        st.posted[t].push_back(r);
        0
    }

    /// FI_PEEK: reports the first matching unexpected message without taking it (FI_CLAIM:
    /// and reserves it for a later receive with the same context).
    fn peek(&self, st: &mut State, r: Recv, flags: u64) -> isize {
        let found = st.unexpected[1]
            .iter_mut()
            .find(|u| u.claimed.is_none() && Self::matches(&r, u.peer, true, u.tag));
        let mut e = Entry::ok(r.ctx, Self::rx_flags(true), 0);
        match found {
            Some(u) => {
                e.len = u.len();
                e.tag = u.tag;
                if let Some(d) = u.data {
                    e.data = d;
                    e.flags |= fi::FI_REMOTE_CQ_DATA as u64;
                }
                let peer = u.peer;
                if flags & fi::FI_CLAIM != 0 {
                    u.claimed = Some(r.ctx);
                }
                e.src = self.src_of(st, peer);
                if flags & fi::FI_DISCARD != 0
                    && flags & fi::FI_CLAIM == 0
                    && let Some(i) = st.unexpected[1]
                        .iter()
                        .position(|u| u.claimed.is_none() && Self::matches(&r, u.peer, true, u.tag))
                    && let Some(u) = st.unexpected[1].remove(i)
                {
                    self.discard(st, u, r);
                    return 0;
                }
            }
            None => e.err = Some((fi::FI_ENOMSG, 0)),
        }
        if let Some(cq) = &st.bound.rx_cq {
            cq.push(e);
        }
        0
    }

    fn discard(&self, st: &mut State, u: Unexp, r: Recv) {
        let len = u.len();
        self.release_unexpected(st, u, None);
        let mut e = Entry::ok(r.ctx, Self::rx_flags(true), 0);
        e.len = len;
        if let Some(cq) = &st.bound.rx_cq {
            cq.push(e);
        }
    }

    /// Frees what an unexpected message holds (and, for a rendezvous, tells the sender);
    /// copies its bytes into `into` first if given. Returns bytes copied.
    fn release_unexpected(&self, st: &mut State, u: Unexp, into: Option<&[Iov]>) -> usize {
        let mut n = 0;
        match u.kind {
            UnexpKind::Data(v) => {
                st.unexpected_bytes -= v.len();
                if let Some(iovs) = into {
                    // SAFETY: the receive contract: iovs are writable application memory.
                    n = unsafe { scatter(iovs, &v) };
                }
            }
            UnexpKind::Held { peer_id, slot, len } => {
                if let Some(iovs) = into {
                    n = self.copy_from_slot(st, peer_id, slot, len, iovs);
                }
                self.repost(st, peer_id, slot);
            }
            UnexpKind::Rts { token, .. } => {
                // Discarded rendezvous: nothing is read; the sender completes.
                st.fins.push_back((u.peer, token, false));
            }
        }
        n
    }

    fn src_of(&self, st: &State, peer: SocketAddr) -> u64 {
        st.bound
            .av
            .as_ref()
            .map(|a| a.reverse(peer))
            .unwrap_or(FI_ADDR_NOTAVAIL)
    }

    /// Carves a piece for a message of `len` bytes out of a multi-receive buffer: the piece
    /// and whether the buffer is then used up. `None` if even the piece does not fit.
    fn take_multi(&self, st: &mut State, r: &mut Recv, len: usize) -> Option<(Recv, bool)> {
        let used = r.multi?;
        let total = iov_len(&r.iovs);
        let left = total.saturating_sub(used);
        if left == 0 {
            return None;
        }
        let n = len.min(left);
        let base = r.iovs.first()?.base;
        // SAFETY: a multi-receive has one buffer of `total` bytes, and `used + n <= total`.
        let at = unsafe { base.add(used) };
        let piece = Iov { base: at, len: n };
        r.multi = Some(used + n);
        let last = total - (used + n) < st.min_multi_recv.max(1);
        Some((
            Recv {
                ctx: r.ctx,
                iovs: vec![piece],
                src: None,
                tag: 0,
                ignore: 0,
                report: r.report,
                multi: None,
            },
            last,
        ))
    }

    fn deliver_unexpected(&self, st: &mut State, u: Unexp, r: Recv, tagged: bool) {
        let (peer, tag, data, len) = (u.peer, u.tag, u.data, u.len());
        if let UnexpKind::Rts { rkey, len, token } = u.kind {
            self.start_read(st, r, peer, rkey, len, token, tagged, tag, data, false);
            return;
        }
        let n = self.release_unexpected(st, u, Some(&r.iovs));
        self.complete_recv(st, &r, peer, tagged, tag, data, n, len, false);
    }

    fn deliver_unexpected_multi(&self, st: &mut State, u: Unexp, r: Recv, last: bool) {
        let (peer, data, len) = (u.peer, u.data, u.len());
        if let UnexpKind::Rts { rkey, len, token } = u.kind {
            self.start_read(st, r, peer, rkey, len, token, false, 0, data, last);
            return;
        }
        let n = self.release_unexpected(st, u, Some(&r.iovs));
        self.complete_recv(st, &r, peer, false, 0, data, n, len, last);
    }

    /// Reports a finished receive: `n` bytes placed of a `msg_len`-byte message.
    #[allow(clippy::too_many_arguments)]
    fn complete_recv(
        &self,
        st: &mut State,
        r: &Recv,
        peer: SocketAddr,
        tagged: bool,
        tag: u64,
        data: Option<u64>,
        n: usize,
        msg_len: usize,
        last_multi: bool,
    ) {
        let mut e = Entry::ok(r.ctx, Self::rx_flags(tagged), n);
        e.buf = r
            .iovs
            .first()
            .map(|v| v.base.cast())
            .unwrap_or(std::ptr::null_mut());
        e.tag = tag;
        e.src = self.src_of(st, peer);
        if let Some(d) = data {
            e.data = d;
            e.flags |= fi::FI_REMOTE_CQ_DATA as u64;
        }
        if last_multi {
            e.flags |= fi::FI_MULTI_RECV as u64;
        }
        let truncated = n < msg_len;
        if truncated {
            e.err = Some((fi::FI_ETRUNC, msg_len - n));
        }
        if let Some(c) = &st.bound.recv_cntr {
            if truncated {
                c.add_err(1);
            } else {
                c.add(1);
            }
        }
        if (r.report || truncated)
            && let Some(cq) = &st.bound.rx_cq
        {
            cq.push(e);
        }
    }

    fn copy_from_slot(
        &self,
        st: &State,
        peer_id: u32,
        slot: u32,
        len: usize,
        iovs: &[Iov],
    ) -> usize {
        let Some(p) = st.peer_ids.get(&peer_id).and_then(|a| st.peers.get(a)) else {
            return 0;
        };
        let mut off = u64::from(slot) * SLOT_LEN as u64 + HEADER_LEN as u64;
        let mut left = len;
        let mut done = 0;
        for v in iovs {
            if left == 0 {
                break;
            }
            let n = v.len.min(left);
            if n > 0 {
                // SAFETY: the receive contract: `v` is writable application memory of
                // v.len >= n bytes, not aliased by the provider's region.
                let dst = unsafe { std::slice::from_raw_parts_mut(v.base, n) };
                if p.rx.read(off, dst).is_err() {
                    break;
                }
            }
            off += n as u64;
            left -= n;
            done += n;
        }
        done
    }

    fn repost(&self, st: &mut State, peer_id: u32, slot: u32) {
        let Some(&peer) = st.peer_ids.get(&peer_id) else {
            return;
        };
        let Some(p) = st.peers.get(&peer) else { return };
        let wr = RecvWr {
            wr_id: bounce_id(peer_id, slot),
            sges: vec![p.rx.sge(u64::from(slot) * SLOT_LEN as u64, SLOT_LEN as u32)],
        };
        // Only to the QP the buffer belongs to: once the peer's connection was replaced, the
        // event that says so drops this peer entry and its buffers, so they must not reach
        // the new QP (whose receives would then name freed memory and fail it).
        match self.net.dev.post_recv_on(peer, p.qpn, wr) {
            Ok(()) | Err(ConnectError::Replaced) => {}
            Err(_) => {
                if let Some(p) = st.peers.get_mut(&peer) {
                    p.broken = true;
                }
            }
        }
    }

    /// Starts the rendezvous READ of a `len`-byte message into `r`.
    #[allow(clippy::too_many_arguments)]
    fn start_read(
        &self,
        st: &mut State,
        r: Recv,
        peer: SocketAddr,
        rkey: u32,
        len: usize,
        token: u64,
        tagged: bool,
        tag: u64,
        data: Option<u64>,
        last_multi: bool,
    ) {
        let want = len.min(iov_len(&r.iovs));
        let mut mrs = Vec::new();
        let mut sges = Vec::new();
        let mut left = want;
        for v in &r.iovs {
            if left == 0 {
                break;
            }
            let n = v.len.min(left);
            if n == 0 {
                continue;
            }
            // SAFETY: the receive contract keeps the buffer valid until the receive completes;
            // the region is dropped when the READ completes.
            match unsafe { self.net.pd.register_raw(v.base, n, Access::LOCAL_WRITE) } {
                Ok(m) => {
                    sges.push(m.sge(0, n as u32));
                    mrs.push(m);
                }
                Err(_) => break,
            }
            left -= n;
        }
        if want == 0 || left > 0 {
            // Nothing to read (empty buffer), or the buffer could not be registered.
            let failed = left > 0;
            st.fins.push_back((peer, token, failed));
            let mut e_r = r;
            if failed {
                e_r.report = true;
            }
            self.complete_recv(
                st,
                &e_r,
                peer,
                tagged,
                tag,
                data,
                0,
                if failed { len.max(1) } else { len },
                last_multi,
            );
            return;
        }
        let id = Self::new_op(
            st,
            Op::Read {
                recv: r,
                _mrs: mrs,
                peer,
                token,
                got: want,
                msg_len: len,
                tagged,
                tag,
                data,
                last_multi,
            },
        );
        let wr = SendWr {
            wr_id: id,
            op: SendOp::Read(braid::RemoteAddr { rkey, offset: 0 }),
            sges,
            signaled: true,
        };
        if self.net.dev.post_send_to(peer, wr).is_err()
            && let Some(Op::Read { recv, .. }) = st.ops.remove(&id)
        {
            st.fins.push_back((peer, token, true));
            let mut e = Entry::ok(recv.ctx, Self::rx_flags(tagged), 0);
            e.err = Some((fi::FI_EIO, len));
            if let Some(cq) = &st.bound.rx_cq {
                cq.push(e);
            }
        }
    }

    fn on_completion(&self, st: &mut State, c: &Completion) {
        if c.wr_id & BOUNCE != 0 {
            self.on_bounce(st, c);
            return;
        }
        let Some(op) = st.ops.remove(&c.wr_id) else {
            return;
        };
        let ok = c.status == WcStatus::Success;
        if !ok {
            self.mark_broken(st, c.qpn, c.status);
        }
        match op {
            Op::Eager {
                slot,
                ctx,
                flags,
                len,
                report,
            } => {
                st.free_tx.push(slot);
                self.complete_send(
                    st,
                    ctx,
                    flags,
                    len,
                    report,
                    (!ok).then(|| wc_errno(c.status)),
                );
            }
            Op::Ctrl { slot, rndv } => {
                st.free_tx.push(slot);
                if !ok
                    && let Some(Op::Rndv {
                        ctx,
                        flags,
                        len,
                        report,
                        ..
                    }) = rndv.and_then(|t| st.ops.remove(&t))
                {
                    self.complete_send(st, ctx, flags, len, report, Some(wc_errno(c.status)));
                }
            }
            Op::Rndv { .. } => {}
            Op::Rma {
                ctx,
                flags,
                len,
                report,
                slot,
                _mrs,
                read,
                event,
            } => {
                drop(_mrs);
                if let Some(s) = slot {
                    st.free_tx.push(s);
                }
                if ok && let Some(ev) = event {
                    st.rma_events.push_back(ev);
                }
                let cntr = if read {
                    st.bound.read_cntr.clone()
                } else {
                    st.bound.write_cntr.clone()
                };
                if let Some(cn) = cntr {
                    if ok {
                        cn.add(1);
                    } else {
                        cn.add_err(1);
                    }
                }
                if report || !ok {
                    let mut e = Entry::ok(ctx, flags, len);
                    e.err = (!ok).then(|| (wc_errno(c.status), 0));
                    if let Some(cq) = &st.bound.tx_cq {
                        cq.push(e);
                    }
                }
            }
            Op::Read {
                recv,
                _mrs,
                peer,
                token,
                got,
                msg_len,
                tagged,
                tag,
                data,
                last_multi,
            } => {
                drop(_mrs);
                st.fins.push_back((peer, token, !ok));
                if ok {
                    self.complete_recv(
                        st, &recv, peer, tagged, tag, data, got, msg_len, last_multi,
                    );
                } else {
                    let mut e = Entry::ok(recv.ctx, Self::rx_flags(tagged), 0);
                    e.tag = tag;
                    e.err = Some((wc_errno(c.status), msg_len));
                    if let Some(cq) = &st.bound.rx_cq {
                        cq.push(e);
                    }
                    if let Some(cn) = &st.bound.recv_cntr {
                        cn.add_err(1);
                    }
                }
            }
        }
    }

    /// A completion failed on QP `qpn`: its peer's connection is broken. Rendezvous sends
    /// to that peer wait for a FIN that cannot come any more: they fail now.
    fn mark_broken(&self, st: &mut State, qpn: u32, status: WcStatus) {
        if status == WcStatus::Flushed {
            // Flushed work follows the error that broke the QP, already recorded.
            return;
        }
        let mut gone = Vec::new();
        for (addr, p) in st.peers.iter_mut() {
            if p.qpn == qpn && !p.broken {
                p.broken = true;
                gone.push(*addr);
            }
        }
        let err = wc_errno(status);
        for peer in gone {
            let tokens: Vec<u64> = st
                .ops
                .iter()
                .filter(|(_, op)| matches!(op, Op::Rndv { peer: p, .. } if *p == peer))
                .map(|(t, _)| *t)
                .collect();
            for t in tokens {
                if let Some(Op::Rndv {
                    ctx,
                    flags,
                    len,
                    report,
                    ..
                }) = st.ops.remove(&t)
                {
                    self.complete_send(st, ctx, flags, len, report, Some(err));
                }
            }
            for q in st.unexpected.iter_mut() {
                q.retain(|u| !(u.peer == peer && matches!(u.kind, UnexpKind::Rts { .. })));
            }
        }
    }

    fn complete_send(
        &self,
        st: &mut State,
        ctx: *mut c_void,
        flags: u64,
        len: usize,
        report: bool,
        err: Option<u32>,
    ) {
        if let Some(c) = &st.bound.send_cntr {
            if err.is_some() {
                c.add_err(1);
            } else {
                c.add(1);
            }
        }
        if report || err.is_some() {
            let mut e = Entry::ok(ctx, flags, len);
            e.err = err.map(|x| (x, 0));
            if let Some(cq) = &st.bound.tx_cq {
                cq.push(e);
            }
        }
    }

    fn on_bounce(&self, st: &mut State, c: &Completion) {
        let peer_id = ((c.wr_id & !BOUNCE) >> 16) as u32;
        let slot = (c.wr_id & 0xffff) as u32;
        let Some(&peer) = st.peer_ids.get(&peer_id) else {
            return;
        };
        if c.status != WcStatus::Success {
            self.mark_broken(st, c.qpn, c.status);
            return;
        }
        if c.opcode == braid::WcOpcode::RecvRdmaWithImm {
            // A peer's fi_writedata: the data landed in a registered region; report it.
            self.repost(st, peer_id, slot);
            let mut e = Entry::ok(
                std::ptr::null_mut(),
                fi::FI_RMA as u64 | fi::FI_REMOTE_WRITE as u64 | fi::FI_REMOTE_CQ_DATA as u64,
                c.byte_len as usize,
            );
            e.data = u64::from(c.imm.unwrap_or(0));
            e.src = self.src_of(st, peer);
            if let Some(cq) = &st.bound.rx_cq {
                cq.push(e);
            }
            return;
        }
        let Some(p) = st.peers.get(&peer) else { return };
        let mut hb = [0u8; HEADER_LEN];
        let base = u64::from(slot) * SLOT_LEN as u64;
        let bytes = c.byte_len as usize;
        if bytes < HEADER_LEN || p.rx.read(base, &mut hb).is_err() {
            self.repost(st, peer_id, slot);
            return;
        }
        let h = Header::decode(&hb);
        let tagged = h.flags & FLAG_TAGGED != 0;
        let data = (h.flags & FLAG_DATA != 0).then_some(h.data);
        let t = usize::from(tagged);
        match h.kind {
            KIND_EAGER => {
                let len = bytes - HEADER_LEN;
                if h.len as usize != len {
                    self.repost(st, peer_id, slot);
                    return;
                }
                if let Some((r, last)) = self.match_posted(st, t, peer, tagged, h.tag, len) {
                    let n = self.copy_from_slot(st, peer_id, slot, len, &r.iovs);
                    self.repost(st, peer_id, slot);
                    self.complete_recv(st, &r, peer, tagged, h.tag, data, n, len, last);
                    return;
                }
                let kind = if st.unexpected_bytes + len <= crate::UNEXPECTED_BYTES_MAX {
                    let mut v = vec![0u8; len];
                    let read = st
                        .peers
                        .get(&peer)
                        .is_some_and(|p| p.rx.read(base + HEADER_LEN as u64, &mut v).is_ok());
                    if !read {
                        self.repost(st, peer_id, slot);
                        return;
                    }
                    st.unexpected_bytes += len;
                    self.repost(st, peer_id, slot);
                    UnexpKind::Data(v)
                } else {
                    UnexpKind::Held { peer_id, slot, len }
                };
                st.unexpected[t].push_back(Unexp {
                    peer,
                    tag: h.tag,
                    data,
                    kind,
                    claimed: None,
                });
            }
            KIND_RTS => {
                self.repost(st, peer_id, slot);
                let len = h.len as usize;
                if let Some((r, last)) = self.match_posted(st, t, peer, tagged, h.tag, len) {
                    self.start_read(st, r, peer, h.rkey, len, h.token, tagged, h.tag, data, last);
                    return;
                }
                st.unexpected[t].push_back(Unexp {
                    peer,
                    tag: h.tag,
                    data,
                    kind: UnexpKind::Rts {
                        rkey: h.rkey,
                        len,
                        token: h.token,
                    },
                    claimed: None,
                });
            }
            KIND_FIN => {
                self.repost(st, peer_id, slot);
                if let Some(Op::Rndv {
                    ctx,
                    flags,
                    len,
                    report,
                    ..
                }) = st.ops.remove(&h.token)
                {
                    let err = (h.flags & FLAG_ERROR != 0).then_some(fi::FI_EIO);
                    self.complete_send(st, ctx, flags, len, report, err);
                } else if let Some(op) = st.ops.remove(&h.token) {
                    // Not a rendezvous token: put it back untouched (a confused peer).
                    st.ops.insert(h.token, op);
                }
            }
            KIND_RMA_EVENT => {
                self.repost(st, peer_id, slot);
                if self.caps & fi::FI_RMA_EVENT != 0 {
                    let c = if h.flags & FLAG_READ_EVENT != 0 {
                        &st.bound.remote_read_cntr
                    } else {
                        &st.bound.remote_write_cntr
                    };
                    if let Some(c) = c {
                        c.add(1);
                    }
                }
            }
            _ => self.repost(st, peer_id, slot),
        }
    }

    /// The first posted receive matching a message (a piece of it, for multi-receive).
    fn match_posted(
        &self,
        st: &mut State,
        t: usize,
        peer: SocketAddr,
        tagged: bool,
        tag: u64,
        len: usize,
    ) -> Option<(Recv, bool)> {
        let i = st.posted[t]
            .iter()
            .position(|r| Self::matches(r, peer, tagged, tag))?;
        if st.posted[t][i].multi.is_none() {
            return st.posted[t].remove(i).map(|r| (r, false));
        }
        let mut r = st.posted[t].remove(i)?;
        let piece = self.take_multi(st, &mut r, len);
        match piece {
            Some((sub, last)) => {
                if !last {
                    st.posted[t].insert(i, r);
                }
                Some((sub, last))
            }
            None => None,
        }
    }
}

fn bounce_id(peer_id: u32, slot: u32) -> u64 {
    BOUNCE | (u64::from(peer_id) << 16) | u64::from(slot)
}

// ---------------------------------------------------------------------------------------------
// The message and tagged ops: argument checks, then EpInner::send / recv.

/// Reads `count` iovecs, or the single buffer.
///
/// # Safety
/// As [`read_iovs`].
unsafe fn one(buf: *const c_void, len: usize) -> Result<Vec<Iov>, isize> {
    if buf.is_null() && len > 0 {
        return Err(-(fi::FI_EINVAL as isize));
    }
    Ok(vec![Iov {
        base: buf.cast_mut().cast(),
        len,
    }])
}

fn do_send(
    ep: *mut fi::fid_ep,
    iovs: Result<Vec<Iov>, isize>,
    dest: u64,
    tag: Option<u64>,
    data: Option<u64>,
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
        e.inner.send(SendReq {
            iovs,
            dest,
            tag,
            data,
            ctx,
            flags,
        })
    })
}

fn do_recv(
    ep: *mut fi::fid_ep,
    iovs: Result<Vec<Iov>, isize>,
    src: u64,
    tag: Option<(u64, u64)>,
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
        e.inner.recv(RecvReq {
            iovs,
            src,
            tag,
            ctx,
            flags,
        })
    })
}

/// # Safety
/// As [`read_iovs`].
unsafe fn iovs(iov: *const fi::iovec, count: usize) -> Result<Vec<Iov>, isize> {
    // SAFETY: forwarded.
    unsafe { read_iovs(iov, count) }.map_err(|e| e as isize)
}

/// Flags a caller may pass to sendmsg/recvmsg.
const MSG_FLAGS: u64 = crate::info::OP_FLAGS
    | fi::FI_MORE as u64
    | fi::FI_PEEK as u64
    | fi::FI_CLAIM
    | fi::FI_DISCARD
    | fi::FI_FENCE as u64;

unsafe extern "C" fn msg_recv(
    ep: *mut fi::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes by contract.
    do_recv(ep, unsafe { one(buf, len) }, src, None, ctx, 0)
}
unsafe extern "C" fn msg_recvv(
    ep: *mut fi::fid_ep,
    iov: *const fi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov has count entries by contract.
    do_recv(ep, unsafe { iovs(iov, count) }, src, None, ctx, 0)
}
unsafe extern "C" fn msg_recvmsg(ep: *mut fi::fid_ep, msg: *const fi::fi_msg, flags: u64) -> isize {
    if msg.is_null() || flags & !MSG_FLAGS != 0 {
        return -(fi::FI_EINVAL as isize);
    }
    // SAFETY: non-null, valid by contract.
    let m = unsafe { &*msg };
    // SAFETY: msg_iov has iov_count entries.
    do_recv(
        ep,
        unsafe { iovs(m.msg_iov, m.iov_count) },
        m.addr,
        None,
        m.context,
        flags,
    )
}
unsafe extern "C" fn msg_send(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(ep, unsafe { one(buf, len) }, dest, None, None, ctx, 0)
}
unsafe extern "C" fn msg_sendv(
    ep: *mut fi::fid_ep,
    iov: *const fi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov has count entries.
    do_send(ep, unsafe { iovs(iov, count) }, dest, None, None, ctx, 0)
}
unsafe extern "C" fn msg_sendmsg(ep: *mut fi::fid_ep, msg: *const fi::fi_msg, flags: u64) -> isize {
    if msg.is_null() || flags & !MSG_FLAGS != 0 {
        return -(fi::FI_EINVAL as isize);
    }
    // SAFETY: non-null, valid by contract.
    let m = unsafe { &*msg };
    let data = (flags & fi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(m.data & 0xffff_ffff);
    // SAFETY: msg_iov has iov_count entries.
    do_send(
        ep,
        unsafe { iovs(m.msg_iov, m.iov_count) },
        m.addr,
        None,
        data,
        m.context,
        flags,
    )
}
unsafe extern "C" fn msg_inject(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(
        ep,
        unsafe { one(buf, len) },
        dest,
        None,
        None,
        std::ptr::null_mut(),
        fi::FI_INJECT as u64 | INJECT_CALL,
    )
}
unsafe extern "C" fn msg_senddata(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(
        ep,
        unsafe { one(buf, len) },
        dest,
        None,
        Some(data & 0xffff_ffff),
        ctx,
        0,
    )
}
unsafe extern "C" fn msg_injectdata(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(
        ep,
        unsafe { one(buf, len) },
        dest,
        None,
        Some(data & 0xffff_ffff),
        std::ptr::null_mut(),
        fi::FI_INJECT as u64 | INJECT_CALL,
    )
}

unsafe extern "C" fn tag_recv(
    ep: *mut fi::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_recv(
        ep,
        unsafe { one(buf, len) },
        src,
        Some((tag, ignore)),
        ctx,
        0,
    )
}
unsafe extern "C" fn tag_recvv(
    ep: *mut fi::fid_ep,
    iov: *const fi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov has count entries.
    do_recv(
        ep,
        unsafe { iovs(iov, count) },
        src,
        Some((tag, ignore)),
        ctx,
        0,
    )
}
unsafe extern "C" fn tag_recvmsg(
    ep: *mut fi::fid_ep,
    msg: *const fi::fi_msg_tagged,
    flags: u64,
) -> isize {
    if msg.is_null() || flags & !MSG_FLAGS != 0 {
        return -(fi::FI_EINVAL as isize);
    }
    // SAFETY: non-null, valid by contract.
    let m = unsafe { &*msg };
    // SAFETY: msg_iov has iov_count entries.
    do_recv(
        ep,
        unsafe { iovs(m.msg_iov, m.iov_count) },
        m.addr,
        Some((m.tag, m.ignore)),
        m.context,
        flags,
    )
}
unsafe extern "C" fn tag_send(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(ep, unsafe { one(buf, len) }, dest, Some(tag), None, ctx, 0)
}
unsafe extern "C" fn tag_sendv(
    ep: *mut fi::fid_ep,
    iov: *const fi::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: iov has count entries.
    do_send(
        ep,
        unsafe { iovs(iov, count) },
        dest,
        Some(tag),
        None,
        ctx,
        0,
    )
}
unsafe extern "C" fn tag_sendmsg(
    ep: *mut fi::fid_ep,
    msg: *const fi::fi_msg_tagged,
    flags: u64,
) -> isize {
    if msg.is_null() || flags & !MSG_FLAGS != 0 {
        return -(fi::FI_EINVAL as isize);
    }
    // SAFETY: non-null, valid by contract.
    let m = unsafe { &*msg };
    let data = (flags & fi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(m.data & 0xffff_ffff);
    // SAFETY: msg_iov has iov_count entries.
    do_send(
        ep,
        unsafe { iovs(m.msg_iov, m.iov_count) },
        m.addr,
        Some(m.tag),
        data,
        m.context,
        flags,
    )
}
unsafe extern "C" fn tag_inject(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    tag: u64,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(
        ep,
        unsafe { one(buf, len) },
        dest,
        Some(tag),
        None,
        std::ptr::null_mut(),
        fi::FI_INJECT as u64 | INJECT_CALL,
    )
}
unsafe extern "C" fn tag_senddata(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(
        ep,
        unsafe { one(buf, len) },
        dest,
        Some(tag),
        Some(data & 0xffff_ffff),
        ctx,
        0,
    )
}
unsafe extern "C" fn tag_injectdata(
    ep: *mut fi::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    tag: u64,
) -> isize {
    // SAFETY: buf describes len bytes.
    do_send(
        ep,
        unsafe { one(buf, len) },
        dest,
        Some(tag),
        Some(data & 0xffff_ffff),
        std::ptr::null_mut(),
        fi::FI_INJECT as u64 | INJECT_CALL,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let h = Header {
            kind: KIND_RTS,
            flags: FLAG_TAGGED | FLAG_DATA,
            rkey: 0xdead_beef,
            tag: 0x0102_0304_0506_0708,
            data: 77,
            len: 1 << 20,
            token: 42,
        };
        assert_eq!(Header::decode(&h.encode()), h);
    }
}
