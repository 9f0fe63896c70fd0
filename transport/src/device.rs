//! The runtime: a device drives one [`Endpoint`] over a real datapath, with a progress thread
//! for receives and timers; application threads post work and poll completions.
//!
//! Concurrency is confined to the engine behind one mutex and to the loom-checked structures
//! of `braid-sync` around it:
//! - **Posting.** A post is first checked, without the engine lock, against everything it
//!   can be refused for (the QP's state, keys, protection domain, access rights, bounds,
//!   lengths, atomic shape: [`braid_proto::validate`], from the device's own copy of its
//!   registrations; and queue depth, see `QpGate`): a refusal is always a synchronous
//!   [`PostError`], whether or not the engine is busy. An accepted post then tries the engine
//!   lock. If it is free, the post runs on the posting thread and so does the engine's
//!   transmit loop: a WRITE leaves without waiting for the progress thread (an inline
//!   doorbell). If the lock is busy (the progress thread is placing a batch, another thread is
//!   posting), the work request goes into the device's hand-off ring ([`braid_sync::Mpsc`])
//!   and, if the progress thread is asleep, its doorbell rings ([`Datapath::wake`]). Whoever
//!   takes the engine lock next applies queued work requests first, in order, before anything
//!   else, so a thread's posts keep their order and every later engine operation sees them.
//!   A post racing with the deregistration of a region it uses is ordered by the
//!   registration table's lock: checked before the deregistration, it is applied before it
//!   (it keeps its buffers, as a work request posted earlier does); checked after, it is
//!   refused with `InvalidLkey`.
//! - **Completions.** Each completion queue is an SPSC ring: the engine-lock holder produces,
//!   application threads consume (behind a per-CQ lock, since several threads may poll one CQ;
//!   an empty CQ is seen without that lock). Waiters sleep on the CQ's [`braid_sync::Event`].
//! - **Transmit buffers** come from a lock-free [`braid_sync::Pool`].
//! - The datapath's `send`, which any thread may call.
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid_datapath::udp::{UdpConfig, UdpDatapath};
use braid_datapath::uring::UringDatapath;
use braid_datapath::xdp::{XdpConfig, XdpDatapath};
use braid_datapath::{Datapath, Ecn, RecvBatch};
use braid_proto::validate::{self, LocalMr};
use braid_proto::{
    Access, Completion, CqId, Endpoint, EndpointConfig, EndpointStats, MrKeys, PathStats, PdId,
    PostError, QpInfo, QpOptions, QpStats, RecvWr, Region, RemoteAddr, ResourceError, SendWr, Sge,
    Timestamp,
};
use braid_sync::{Consumer, Event, Mpsc, Pool, Producer, Ring};

mod cq_fd;

/// Datagrams moved per batch between the engine and the datapath.
const BATCH: usize = 64;
/// Longest the progress thread sleeps. Posting threads never wake it for timers, so a
/// retransmit timeout armed by a post fires at most this late; the floor of the timeout is
/// 500 µs by default, so the slack stays within the same order.
const TIMER_SLACK: Duration = Duration::from_millis(1);
/// How often a busy-polling progress thread that receives nothing checks timers, ns.
const BUSY_TIMER_CHECK_NS: u64 = 20_000;
/// Receive batches the progress thread takes before it runs timers.
const MAX_RX_BATCHES_BEFORE_TIMERS: usize = 16;
/// Longest the progress thread sleeps while the device has no QP.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Completions a completion queue's ring holds (32 B each). More wait in the engine-side
/// spill queue and move to the ring as the application polls (at the latest on the progress
/// thread's next round, within `TIMER_SLACK`).
const CQ_RING: usize = 4096;
/// Work requests the hand-off ring holds; a post finding it full waits for the engine lock.
const POST_RING: usize = 1024;
/// Transmit batches kept for reuse (each is `BATCH` datagram buffers): one per thread that
/// sends at the same time is enough; more are allocated and freed.
const TX_POOL: usize = 4;

/// Which datapath a device uses.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DatapathKind {
    /// Plain UDP sockets with sendmmsg/recvmmsg: needs no privileges, works anywhere.
    #[default]
    Udp,
    /// UDP sockets driven through io_uring (multishot receive, batched sends).
    Uring,
    /// AF_XDP on the interface that owns the local address: needs root (CAP_NET_ADMIN and
    /// CAP_BPF) and an IPv4 address on a real or veth interface.
    Xdp,
    /// AF_XDP if it can be set up, else io_uring, else plain UDP sockets; the device says
    /// which it got and why ([`Device::datapath_report`]).
    Auto,
}

impl DatapathKind {
    /// The name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            DatapathKind::Udp => "udp",
            DatapathKind::Uring => "uring",
            DatapathKind::Xdp => "xdp",
            DatapathKind::Auto => "auto",
        }
    }
}

impl std::fmt::Display for DatapathKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DatapathKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "udp" => Ok(DatapathKind::Udp),
            "uring" | "io_uring" | "io-uring" => Ok(DatapathKind::Uring),
            "xdp" | "af_xdp" | "af-xdp" => Ok(DatapathKind::Xdp),
            "auto" => Ok(DatapathKind::Auto),
            other => Err(format!(
                "unknown datapath {other:?} (one of: udp, uring, xdp, auto)"
            )),
        }
    }
}

/// How to open a device.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Local address to bind (port 0 picks one).
    pub local: SocketAddr,
    /// Datapath backend.
    pub datapath: DatapathKind,
    /// Engine settings (paths, timers, queue depths, congestion control). Its `seed` is
    /// replaced by OS entropy unless `deterministic_seed` is set.
    pub engine: EndpointConfig,
    /// Use `engine.seed` as is (for reproducible key and PSN choice in tests).
    pub deterministic_seed: bool,
    /// Network interface for AF_XDP; `None` picks the one that owns `local`'s address.
    pub interface: Option<String>,
    /// The progress thread spins on the datapath instead of sleeping in the kernel: no
    /// wake-up per packet, for a core spent on it. Only for dedicated cores: on a 2-core
    /// machine with the application also spinning on its CQ, the spinners starved the peer's
    /// progress thread (about 100 round trips per second over veth).
    pub busy_poll: bool,
}

impl DeviceConfig {
    /// A UDP device on `local` with default engine settings (16 paths).
    pub fn udp(local: SocketAddr) -> DeviceConfig {
        DeviceConfig {
            local,
            datapath: DatapathKind::Udp,
            engine: EndpointConfig::default(),
            deterministic_seed: false,
            interface: None,
            busy_poll: false,
        }
    }

    /// Makes the progress thread spin on the datapath instead of sleeping.
    pub fn busy_poll(mut self, on: bool) -> Self {
        self.busy_poll = on;
        self
    }

    /// Sets the datapath backend.
    pub fn datapath(mut self, kind: DatapathKind) -> Self {
        self.datapath = kind;
        self
    }

    /// Sets the network interface AF_XDP attaches to.
    pub fn interface(mut self, name: impl Into<String>) -> Self {
        self.interface = Some(name.into());
        self
    }

    /// Sets the number of paths (UDP source ports) to spray over, 1 to 256.
    pub fn paths(mut self, paths: u16) -> Self {
        self.engine.paths = paths;
        self
    }

    /// Sets the number of UDP source ports the device opens, `paths` to 256 (default: twice
    /// the paths, at most 256). Ports beyond the paths are where PLB moves congested paths.
    pub fn ports(mut self, ports: u16) -> Self {
        self.engine.ports = ports;
        self
    }

    /// Sets the largest datagram (UDP payload), e.g. 8972 for jumbo frames or loopback.
    pub fn max_datagram(mut self, bytes: usize) -> Self {
        self.engine.max_datagram = bytes;
        self
    }
}

/// Why a device could not be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// The configuration is invalid (e.g. 0 or more than 256 paths).
    InvalidConfig(&'static str),
    /// The chosen datapath could not be set up: bind failed, missing privileges (AF_XDP needs
    /// CAP_NET_ADMIN and CAP_BPF), or missing kernel support (io_uring, AF_XDP).
    Datapath {
        /// The datapath that failed.
        kind: DatapathKind,
        /// Why.
        source: io::Error,
    },
    /// The progress thread could not be started.
    Thread(io::Error),
    /// The OS random generator, which seeds keys and initial PSNs, failed.
    Entropy(io::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::InvalidConfig(why) => write!(f, "invalid device configuration: {why}"),
            OpenError::Datapath { kind, source } => {
                write!(f, "{kind} datapath setup failed: {source}")
            }
            OpenError::Thread(e) => write!(f, "could not start the progress thread: {e}"),
            OpenError::Entropy(e) => write!(f, "no OS randomness for keys and PSNs: {e}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Datapath { source: e, .. }
            | OpenError::Thread(e)
            | OpenError::Entropy(e) => Some(e),
            OpenError::InvalidConfig(_) => None,
        }
    }
}

/// The application's side of a completion queue.
struct CqShared {
    /// The ring's consumer end. Locked by whichever thread polls: several may poll one CQ.
    rx: Mutex<Consumer<Completion>>,
    /// The ring itself, to see an empty CQ without the lock (a spinning poller then touches
    /// only the ring's producer counter, not a lock the engine side also takes).
    ring: Arc<Ring<Completion>>,
    /// Notified by the engine side after it publishes completions; `wait` sleeps on it.
    ready: Event,
    /// The CQ's file descriptor for epoll users, made on first request (`cq_fd.rs`).
    fd: std::sync::OnceLock<cq_fd::CqFd>,
}

impl CqShared {
    fn pop(&self, out: &mut [Completion]) -> usize {
        if self.ring.is_empty() {
            return 0;
        }
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let mut slots = out.iter_mut();
        rx.pop_batch(slots.len(), |c| {
            if let Some(slot) = slots.next() {
                *slot = c;
            }
        })
    }
}

/// The engine's side of a completion queue, used only with the engine lock held.
struct CqSink {
    tx: Producer<Completion>,
    /// Completions that found the ring full, oldest first; they go before any newer one.
    spill: VecDeque<Completion>,
    /// Completions pushed since the last `publish`.
    unannounced: bool,
    shared: Arc<CqShared>,
}

impl CqSink {
    fn push(&mut self, c: Completion) {
        self.unannounced = true;
        if !self.spill.is_empty() {
            self.spill.push_back(c);
        } else if let Err(c) = self.tx.push(c) {
            self.spill.push_back(c);
        }
    }

    /// Moves spilled completions into the ring while it has room, and wakes waiters if
    /// anything new is in the ring.
    fn publish(&mut self) {
        if !self.spill.is_empty() {
            let spill = &mut self.spill;
            if self
                .tx
                .push_iter(&mut std::iter::from_fn(|| spill.pop_front()))
                > 0
            {
                self.unannounced = true;
            }
        }
        if std::mem::take(&mut self.unannounced) {
            self.shared.ready.notify();
            if let Some(fd) = self.shared.fd.get() {
                fd.signal();
            }
        }
    }
}

/// A work request that found the engine busy, on its way through the hand-off ring.
enum Post {
    Send {
        qpn: u32,
        wr: SendWr,
        cq: CqId,
        gate: Arc<QpGate>,
    },
    Recv {
        qpn: u32,
        wr: RecvWr,
        cq: CqId,
        gate: Arc<QpGate>,
    },
}

impl Post {
    fn gate(&self) -> &QpGate {
        match self {
            Post::Send { gate, .. } | Post::Recv { gate, .. } => gate,
        }
    }

    fn is_send(&self) -> bool {
        matches!(self, Post::Send { .. })
    }
}

/// What a post on one QP is checked against without the engine lock.
///
/// Queue depth: `depth` is the engine's count of outstanding work requests as last seen by a
/// lock holder (it may be stale, but only high: it is stored after every post the engine
/// applies, and the engine only ever lowers it on its own), `in_ring` the posts handed off and
/// not yet applied. A post is handed off only if the two leave room; otherwise it waits for
/// the engine lock and gets the engine's exact answer. So a handed-off post always finds room.
#[derive(Debug)]
struct QpGate {
    pd: u32,
    /// Connected (`post_send` before `connect` is refused with `NotConnected`).
    connected: AtomicBool,
    sq: Depth,
    rq: Depth,
}

#[derive(Debug, Default)]
struct Depth {
    depth: AtomicUsize,
    in_ring: AtomicUsize,
}

impl Depth {
    /// Reserves a place in the hand-off ring if the queue surely has room for it.
    fn reserve(&self, max: usize) -> bool {
        let queued = self.in_ring.fetch_add(1, Ordering::AcqRel) + 1;
        if self.depth.load(Ordering::Acquire) + queued <= max {
            return true;
        }
        self.in_ring.fetch_sub(1, Ordering::AcqRel);
        false
    }
}

impl QpGate {
    fn depth(&self, send: bool) -> &Depth {
        if send { &self.sq } else { &self.rq }
    }

    /// Records the engine's queue depths (call with the engine lock held, after a post).
    fn publish(&self, ep: &Endpoint, qpn: u32) {
        if let Some((sq, rq)) = ep.queue_depths(qpn) {
            self.sq.depth.store(sq, Ordering::Release);
            self.rq.depth.store(rq, Ordering::Release);
        }
    }
}

struct Core {
    ep: Endpoint,
    cqs: HashMap<CqId, CqSink>,
    /// The hand-off ring's consumer end: whoever holds the engine lock consumes.
    posts: Consumer<Post>,
    /// The connection handshake, once enabled (`crate::handshake`).
    hs: Option<crate::handshake::Runtime>,
}

impl Core {
    /// Applies work requests queued while the engine was busy, oldest first. They were
    /// checked before the hand-off (see [`Inner::post`]), so the engine accepts them; should
    /// it refuse one all the same, the refusal cannot reach the poster any more, and it
    /// completes with an error status in posting order (`Endpoint::post_send_or_fail`).
    fn take_posts(&mut self) {
        let Core { ep, posts, .. } = self;
        posts.pop_batch(usize::MAX, |p| {
            let send = p.is_send();
            let gate = match p {
                Post::Send { qpn, wr, cq, gate } => {
                    ep.post_send_or_fail(qpn, wr, cq);
                    gate.publish(ep, qpn);
                    gate
                }
                Post::Recv { qpn, wr, cq, gate } => {
                    ep.post_recv_or_fail(qpn, wr, cq);
                    gate.publish(ep, qpn);
                    gate
                }
            };
            // After publishing the depth it now counts in, so the sum never falls short.
            gate.depth(send).in_ring.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Applies queued work requests, then `p`, returning the engine's verdict on `p`.
    fn post(&mut self, p: Post) -> Result<(), PostError> {
        self.take_posts();
        // Counted as in the ring until its depth is published, so that a concurrent check
        // (which reads the two without the lock) never sees less than the engine holds.
        let send = p.is_send();
        let depth = p.gate().depth(send);
        depth.in_ring.fetch_add(1, Ordering::AcqRel);
        let (r, gate) = match p {
            Post::Send { qpn, wr, gate, .. } => {
                let r = self.ep.post_send(qpn, wr);
                gate.publish(&self.ep, qpn);
                (r, gate)
            }
            Post::Recv { qpn, wr, gate, .. } => {
                let r = self.ep.post_recv(qpn, wr);
                gate.publish(&self.ep, qpn);
                (r, gate)
            }
        };
        gate.depth(send).in_ring.fetch_sub(1, Ordering::AcqRel);
        r
    }
}

struct Inner {
    core: Mutex<Core>,
    datapath: Box<dyn Datapath>,
    epoch: Instant,
    stop: AtomicBool,
    /// Held from stamping datagrams (in the engine) to handing them to the datapath, so they
    /// leave in the order of their timestamps; otherwise two threads sending batches out of
    /// order look like reordering and trigger spurious retransmissions.
    tx_order: Mutex<()>,
    tx_pool: Pool<TxBatch>,
    /// Work requests posted while the engine lock was busy; the doorbell is the progress
    /// thread's (it sleeps in the datapath's `recv`, which [`Datapath::wake`] ends).
    posts: Mpsc<Post>,
    /// Which datapath was chosen and why (for `auto`, what failed before it).
    report: String,
    busy_poll: bool,
    /// The registered regions by local key, for checking posts without the engine lock.
    /// Never taken while holding the engine lock (a poster holds it while it waits for the
    /// engine).
    mrs: RwLock<HashMap<u32, LocalMr>>,
    /// The engine's queue limits (`max_send_wr`, `max_recv_wr`, after clamping).
    max_wr: (usize, usize),
}

/// Owns the progress thread: dropping the last handle stops it.
struct Owner {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.datapath.wake();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

struct TxBatch {
    bufs: Vec<Box<[u8]>>,
    metas: Vec<braid_proto::Transmit>,
}

impl TxBatch {
    fn new(size: usize) -> TxBatch {
        TxBatch {
            bufs: (0..BATCH)
                .map(|_| vec![0u8; size].into_boxed_slice())
                .collect(),
            metas: Vec::with_capacity(BATCH),
        }
    }
}

impl Inner {
    fn now(&self) -> Timestamp {
        Timestamp::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Takes the engine lock and applies the work requests queued in the hand-off ring, so
    /// that every engine operation sees the posts that returned before it.
    fn lock(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        core.take_posts();
        core
    }

    /// Checks `p` (refusing it here if it is bad, whether or not the engine is busy), then
    /// posts it on this thread if the engine lock is free (the inline doorbell: its packets
    /// leave from here), or hands it to whoever holds the lock and wakes the progress thread
    /// if it sleeps.
    fn post(&self, p: Post) -> Result<(), PostError> {
        // Held until the post is applied or in the ring: a deregistration (which takes it for
        // writing, then the engine lock, which applies the ring) is ordered before or after.
        let mrs = self.mrs.read().unwrap_or_else(|e| e.into_inner());
        let lookup = |lkey| mrs.get(&lkey).copied();
        let gate = p.gate();
        match &p {
            Post::Send { wr, .. } => {
                if !gate.connected.load(Ordering::Acquire) {
                    return Err(PostError::NotConnected);
                }
                validate::check_send(gate.pd, wr, lookup)?;
            }
            Post::Recv { wr, .. } => validate::check_recv(gate.pd, wr, lookup)?,
        }
        let max = if p.is_send() {
            self.max_wr.0
        } else {
            self.max_wr.1
        };
        let r = match self.core.try_lock() {
            Ok(mut core) => core.post(p),
            Err(TryLockError::Poisoned(e)) => e.into_inner().post(p),
            Err(TryLockError::WouldBlock) if gate.depth(p.is_send()).reserve(max) => {
                match self.posts.send(p) {
                    Ok(wake) => {
                        if wake {
                            self.datapath.wake();
                        }
                        return Ok(());
                    }
                    // The hand-off ring is full: wait for the engine like any other operation.
                    Err(p) => {
                        p.gate()
                            .depth(p.is_send())
                            .in_ring
                            .fetch_sub(1, Ordering::AcqRel);
                        self.lock().post(p)
                    }
                }
            }
            // The queue may be full: only the engine can say, so wait for it.
            Err(TryLockError::WouldBlock) => self.lock().post(p),
        };
        drop(mrs);
        self.flush_pooled();
        r
    }

    /// Hands completions to their queues and fills `batch` with up to `BATCH` datagrams.
    /// Returns whether the engine may have more to send.
    fn drain(core: &mut Core, now: Timestamp, batch: &mut TxBatch) -> bool {
        while let Some((cq, c)) = core.ep.poll_completion() {
            if let Some(sink) = core.cqs.get_mut(&cq) {
                sink.push(c);
            }
        }
        for sink in core.cqs.values_mut() {
            sink.publish();
        }
        batch.metas.clear();
        while batch.metas.len() < BATCH {
            let i = batch.metas.len();
            match core.ep.poll_transmit(now, &mut batch.bufs[i]) {
                Some(t) => batch.metas.push(t),
                None => return false,
            }
        }
        true
    }

    fn send(&self, batch: &TxBatch) {
        let txs: Vec<braid_datapath::Transmit<'_>> = batch
            .metas
            .iter()
            .zip(&batch.bufs)
            .map(|(t, b)| braid_datapath::Transmit {
                dest: t.dest,
                path: t.path,
                ecn: Ecn::from_tos(t.ecn),
                contents: &b[..t.len],
            })
            .collect();
        let mut sent = 0;
        while sent < txs.len() {
            match self.datapath.send(&txs[sent..]) {
                Ok(0) | Err(_) => break, // the rest are lost; the engine retransmits them
                Ok(n) => sent += n,
            }
        }
    }

    /// Flushes with a transmit batch from the pool (a fresh one if the pool is empty; it is
    /// dropped afterwards if the pool is full).
    fn flush_pooled(&self) {
        let mut batch = self
            .tx_pool
            .get()
            .unwrap_or_else(|| Box::new(TxBatch::new(self.datapath.max_payload())));
        self.flush(&mut batch);
        let _ = self.tx_pool.put(batch);
    }

    /// Sends everything the engine has to send, in timestamp order, and hands completions to
    /// their queues.
    fn flush(&self, batch: &mut TxBatch) {
        let _order = self.tx_order.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let more = Inner::drain(&mut self.lock(), self.now(), batch);
            self.send(batch);
            if !more {
                break;
            }
        }
    }

    /// Runs `f` on the engine, then sends what it produced, from this thread.
    fn with_engine<R>(&self, f: impl FnOnce(&mut Endpoint) -> R) -> R {
        let r = f(&mut self.lock().ep);
        self.flush_pooled();
        r
    }

    /// Receives one batch and hands it to the engine. The engine lock is taken at the first
    /// datagram, not while waiting, and each payload goes from the datapath's buffer straight
    /// into its memory region.
    fn receive(&self, rx: &mut RecvBatch, timeout: Option<Duration>) -> usize {
        let mut core = None;
        let mut now = Timestamp::ZERO;
        let r = self.datapath.recv_with(rx, timeout, &mut |meta, bytes| {
            let core = core.get_or_insert_with(|| {
                now = self.now();
                self.lock()
            });
            if crate::handshake::is_handshake(bytes) {
                let Core { ep, hs, .. } = &mut **core;
                crate::handshake::on_datagram(hs, ep, now, meta.src, bytes, &*self.datapath);
                return;
            }
            core.ep
                .handle_datagram(now, meta.src, meta.ecn as u8, bytes);
        });
        match r {
            Ok(n) => n,
            Err(_) => {
                // A failing datapath must not turn this loop into a busy spin.
                std::thread::sleep(TIMER_SLACK);
                0
            }
        }
    }

    fn progress(self: Arc<Inner>) {
        let mut rx = RecvBatch::new(BATCH, self.datapath.max_payload());
        let mut tx = TxBatch::new(self.datapath.max_payload());
        let mut timers_checked = Timestamp::ZERO;
        while !self.stop.load(Ordering::Acquire) {
            let wait = if self.busy_poll {
                Duration::ZERO
            } else {
                let core = self.lock();
                let cap = if core.ep.qp_count() > 0 {
                    TIMER_SLACK
                } else {
                    IDLE_WAIT
                };
                match core.ep.poll_timeout() {
                    Some(t) => t.saturating_since(self.now()).min(cap),
                    None => cap,
                }
            };
            // Before sleeping, arm the post doorbell and re-check the hand-off ring: a post
            // queued from here on wakes the datapath, one queued before is seen now.
            let armed = !wait.is_zero() && self.posts.arm();
            let wait = if armed { wait } else { Duration::ZERO };
            // Drain what is queued (up to a bound) before running timers: a time-based loss
            // decision taken while acknowledgements still wait in the socket is wrong.
            // Transmissions produced meanwhile (ACKs, responses) are flushed between batches.
            let mut timeout = Some(wait);
            let mut received = 0;
            for round in 0..MAX_RX_BATCHES_BEFORE_TIMERS {
                let n = self.receive(&mut rx, timeout);
                if round == 0 && armed {
                    self.posts.disarm();
                }
                received += n;
                timeout = Some(Duration::ZERO);
                if n < BATCH || round + 1 == MAX_RX_BATCHES_BEFORE_TIMERS {
                    break;
                }
                self.flush(&mut tx);
            }
            // A busy-polling thread that received nothing leaves the engine lock alone
            // (posting threads send their own packets) and checks timers only now and then.
            let now = self.now();
            if self.busy_poll
                && received == 0
                && self.posts.is_empty()
                && now.nanos_since(timers_checked) < BUSY_TIMER_CHECK_NS
            {
                std::hint::spin_loop();
                continue;
            }
            timers_checked = now;
            {
                let mut core = self.lock();
                let now = self.now();
                if core.ep.poll_timeout().is_some_and(|t| t <= now) {
                    core.ep.handle_timeout(now);
                }
                let Core { ep, hs, .. } = &mut *core;
                crate::handshake::on_timer(hs, ep, now, &*self.datapath);
            }
            self.flush(&mut tx);
        }
    }
}

/// Binds the datapath `cfg` asks for; `auto` tries AF_XDP, then io_uring, then plain UDP
/// sockets. Returns it with a one-line report of the choice.
fn open_datapath(
    cfg: &DeviceConfig,
    ports: u16,
    max_datagram: usize,
) -> Result<(Box<dyn Datapath>, String), OpenError> {
    let udp_config = || {
        let mut u = UdpConfig::new(cfg.local, ports);
        u.max_payload = max_datagram;
        u
    };
    let open = |kind: DatapathKind| -> io::Result<Box<dyn Datapath>> {
        Ok(match kind {
            DatapathKind::Udp | DatapathKind::Auto => Box::new(UdpDatapath::bind(udp_config())?),
            DatapathKind::Uring => Box::new(UringDatapath::bind(udp_config())?),
            DatapathKind::Xdp => {
                let mut local = cfg.local;
                if local.port() == 0 {
                    // AF_XDP steers one fixed port: pick a free one the way the kernel would.
                    local.set_port(std::net::UdpSocket::bind(local)?.local_addr()?.port());
                }
                let mut x = XdpConfig::new(local, ports);
                x.interface = cfg.interface.clone();
                Box::new(XdpDatapath::bind(x)?)
            }
        })
    };
    if cfg.datapath != DatapathKind::Auto {
        let d = open(cfg.datapath).map_err(|source| OpenError::Datapath {
            kind: cfg.datapath,
            source,
        })?;
        let report = format!("{} (as configured)", cfg.datapath);
        return Ok((d, report));
    }
    let mut failed = Vec::new();
    for kind in [DatapathKind::Xdp, DatapathKind::Uring, DatapathKind::Udp] {
        match open(kind) {
            Ok(d) => {
                let report = if failed.is_empty() {
                    format!("{kind} (auto: first choice)")
                } else {
                    format!("{kind} (auto; {})", failed.join("; "))
                };
                log::info!("braid device on {}: datapath {report}", cfg.local);
                return Ok((d, report));
            }
            Err(e) => failed.push(format!("{kind} unavailable: {e}")),
        }
    }
    // Plain UDP sockets failed too: report that error.
    let source = open(DatapathKind::Udp)
        .err()
        .unwrap_or_else(|| io::Error::other(failed.join("; ")));
    Err(OpenError::Datapath {
        kind: DatapathKind::Udp,
        source,
    })
}

/// An open device: an endpoint bound to a local address over a datapath.
#[derive(Clone)]
pub struct Device {
    owner: Arc<Owner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("addr", &self.local_addr())
            .field("datapath", &self.datapath_kind())
            .finish()
    }
}

impl Device {
    /// Opens a device: binds the datapath and starts the progress thread.
    pub fn open(cfg: DeviceConfig) -> Result<Device, OpenError> {
        if cfg.engine.paths == 0 || cfg.engine.paths > braid_proto::MAX_PATHS {
            return Err(OpenError::InvalidConfig("paths must be 1 to 256"));
        }
        let mut engine = cfg.engine.clone();
        if !cfg.deterministic_seed {
            let mut seed = [0u8; 8];
            getrandom::getrandom(&mut seed).map_err(|e| OpenError::Entropy(io::Error::other(e)))?;
            engine.seed = u64::from_le_bytes(seed);
        }
        // More source ports than paths: PLB re-paths a congested path onto a spare one.
        let ports = engine.source_ports();
        let (datapath, report) = open_datapath(&cfg, ports, engine.max_datagram)?;
        engine.max_datagram = engine.max_datagram.min(datapath.max_payload());
        let ep = Endpoint::new(engine, datapath.local_addr());
        let max_wr = (ep.config().max_send_wr, ep.config().max_recv_wr);
        let (posts, posts_rx) = Mpsc::new(POST_RING);
        let inner = Arc::new(Inner {
            core: Mutex::new(Core {
                ep,
                cqs: HashMap::new(),
                posts: posts_rx,
                hs: None,
            }),
            datapath,
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            tx_order: Mutex::new(()),
            report,
            busy_poll: cfg.busy_poll,
            tx_pool: Pool::new(TX_POOL),
            posts,
            mrs: RwLock::new(HashMap::new()),
            max_wr,
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("braid-progress".into())
            .spawn(move || worker.progress())
            .map_err(OpenError::Thread)?;
        Ok(Device {
            owner: Arc::new(Owner {
                inner,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    fn inner(&self) -> &Inner {
        &self.owner.inner
    }

    /// Runs `f` on the engine and the handshake runtime under the engine lock, then sends what
    /// the engine produced (for `crate::handshake`).
    pub(crate) fn with_handshake<R>(
        &self,
        f: impl FnOnce(
            &mut Endpoint,
            &mut Option<crate::handshake::Runtime>,
            Timestamp,
            &dyn Datapath,
        ) -> R,
    ) -> R {
        let inner = self.inner();
        let r = {
            let mut core = inner.lock();
            let Core { ep, hs, .. } = &mut *core;
            f(ep, hs, inner.now(), &*inner.datapath)
        };
        inner.flush_pooled();
        r
    }

    /// The address peers send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner().datapath.local_addr()
    }

    /// The datapath in use (`"udp"`, `"uring"`, `"xdp"`).
    pub fn datapath_kind(&self) -> &'static str {
        self.inner().datapath.kind()
    }

    /// Which datapath was chosen and why: for `auto`, why the faster ones were not used.
    pub fn datapath_report(&self) -> &str {
        &self.inner().report
    }

    /// Payload bytes per full packet.
    pub fn chunk_size(&self) -> u32 {
        self.inner().lock().ep.chunk_size()
    }

    /// Endpoint counters.
    pub fn stats(&self) -> EndpointStats {
        self.inner().lock().ep.stats().clone()
    }

    /// Per-path counters.
    pub fn path_stats(&self) -> Vec<PathStats> {
        self.inner().lock().ep.path_stats().to_vec()
    }

    /// RTT distribution over every QP of this device (percentiles, extremes, sample count).
    pub fn rtt_summary(&self) -> braid_proto::RttSummary {
        self.inner().lock().ep.rtt_summary()
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let pd = self.inner().lock().ep.alloc_pd();
        ProtectionDomain {
            dev: self.clone(),
            pd,
        }
    }

    /// Creates a completion queue.
    pub fn create_cq(&self) -> CompletionQueue {
        let (tx, rx) = braid_sync::ring::channel(CQ_RING);
        let shared = Arc::new(CqShared {
            ring: rx.ring().clone(),
            rx: Mutex::new(rx),
            ready: Event::new(),
            fd: std::sync::OnceLock::new(),
        });
        let mut core = self.inner().lock();
        let id = core.ep.create_cq();
        core.cqs.insert(
            id,
            CqSink {
                tx,
                spill: VecDeque::new(),
                unannounced: false,
                shared: shared.clone(),
            },
        );
        CompletionQueue {
            dev: self.clone(),
            id,
            shared,
        }
    }
}

/// A protection domain: regions and QPs in one domain may be used together.
#[derive(Clone)]
pub struct ProtectionDomain {
    dev: Device,
    pd: PdId,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("id", &self.pd.0)
            .finish()
    }
}

impl ProtectionDomain {
    pub(crate) fn id(&self) -> PdId {
        self.pd
    }

    /// Allocates a zero-filled region of `len` bytes and registers it with `access`.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, ResourceError> {
        self.register(Region::new(len), access)
    }

    /// Registers `len` bytes of caller memory at `ptr` (for the C API).
    ///
    /// # Safety
    /// As [`Region::from_raw`]: the memory stays valid until the returned [`MemoryRegion`]
    /// has been dropped (dropping deregisters it; once `drop` returns the engine never
    /// touches the memory again: READs still being answered from it fail at their requester
    /// with `RemoteAccessError`, this side's unfinished work requests using it with
    /// `LocalProtectionError`) and the caller stops using any clone of
    /// [`MemoryRegion::region`]; meanwhile it is only accessed through the region or
    /// atomically.
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, ResourceError> {
        // SAFETY: forwarded to the caller's contract above.
        let region = unsafe { Region::from_raw(ptr, len) };
        self.register(region, access)
    }

    fn register(&self, region: Arc<Region>, access: Access) -> Result<MemoryRegion, ResourceError> {
        let inner = self.dev.inner();
        let keys = inner.lock().ep.register(self.pd, region.clone(), access)?;
        // After the engine lock is released (see `Inner::mrs`).
        let mr = LocalMr {
            pd: self.pd.0,
            access,
            len: region.len() as u64,
        };
        inner
            .mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(keys.lkey, mr);
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            region,
            keys,
            access,
        })
    }

    /// Creates a reliable QP reporting sends to `send_cq` and receives to `recv_cq`.
    pub fn create_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair, ResourceError> {
        self.create_qp_with(send_cq, recv_cq, QpOptions::default())
    }

    /// Creates a QP as [`create_qp`](Self::create_qp) does, but encrypted: every packet is
    /// sealed with AES-256-GCM under keys agreed at `connect` (see `braid_proto::seal`). Its
    /// X25519 private key is drawn from the OS; the peer QP must be encrypted too.
    pub fn create_encrypted_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair, ResourceError> {
        let mut secret = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::getrandom(&mut secret[..]).map_err(|_| ResourceError::Entropy)?;
        self.create_qp_with(send_cq, recv_cq, QpOptions::encrypted(*secret))
    }

    fn create_qp_with(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: QpOptions,
    ) -> Result<QueuePair, ResourceError> {
        let info = self
            .dev
            .inner()
            .lock()
            .ep
            .create_qp_with(self.pd, send_cq.id, recv_cq.id, opts)?;
        Ok(QueuePair {
            dev: self.dev.clone(),
            gate: Arc::new(QpGate {
                pd: self.pd.0,
                connected: AtomicBool::new(false),
                sq: Depth::default(),
                rq: Depth::default(),
            }),
            info,
            send_cq: send_cq.id,
            recv_cq: recv_cq.id,
        })
    }
}

/// A registered memory region. Read and write it through its methods (see
/// [`braid_proto::mem`] for why there is no `&[u8]` access); peers use its [`rkey`](Self::rkey).
/// Dropping it deregisters it: peers lose access at once, and when `drop` returns the engine
/// no longer touches its memory (see [`braid_proto::Endpoint::deregister`]).
pub struct MemoryRegion {
    dev: Device,
    region: Arc<Region>,
    keys: MrKeys,
    access: Access,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.region.len())
            .field("lkey", &self.keys.lkey)
            .field("rkey", &self.keys.rkey)
            .finish()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let inner = self.dev.inner();
        // First out of the table posts are checked against (waiting for posts being checked),
        // then out of the engine, whose lock first applies the posts checked before; through
        // `with_engine`, so the refusals the revocation causes leave now.
        inner
            .mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.keys.lkey);
        let _ = inner.with_engine(|ep| ep.deregister(self.keys.lkey));
    }
}

impl MemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }
    /// Remote key, to give to peers.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }
    /// The shared bytes (read, write, atomics).
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }
    /// Copies bytes out of the region.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), braid_proto::MemError> {
        self.region.read(offset, dst)
    }
    /// Copies bytes into the region.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), braid_proto::MemError> {
        self.region.write(offset, src)
    }
    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            lkey: self.keys.lkey,
            offset,
            len,
        }
    }
    /// The remote address of byte `offset`, for a peer's WRITE, READ or atomic.
    pub fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            rkey: self.keys.rkey,
            offset,
        }
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct CompletionQueue {
    dev: Device,
    id: CqId,
    shared: Arc<CqShared>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("id", &self.id.0)
            .finish()
    }
}

impl CompletionQueue {
    pub(crate) fn id(&self) -> CqId {
        self.id
    }

    /// Takes up to `out.len()` completions without waiting; returns how many.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        self.shared.pop(out)
    }

    /// Takes one completion without waiting.
    pub fn poll_one(&self) -> Option<Completion> {
        let mut one = [Completion {
            wr_id: 0,
            status: braid_proto::WcStatus::Flushed,
            opcode: braid_proto::WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qpn: 0,
        }];
        (self.shared.pop(&mut one) == 1).then_some(one[0])
    }

    /// Waits up to `timeout` for one completion. Several threads may wait on one CQ; each
    /// completion goes to one of them.
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.poll_one() {
                return Some(c);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            // Sleeps on the CQ's event (arm, re-check, sleep); another waiter may take what
            // woke us, hence the loop.
            let ring = &self.shared.ring;
            self.shared
                .ready
                .wait_until(|| !ring.is_empty(), Some(left));
        }
    }

    /// Waits up to `timeout` until the queue holds a completion, without taking it (for a
    /// thread that hands completions to a consumer running elsewhere in order). Returns
    /// whether one is there.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let ring = &self.shared.ring;
        self.shared
            .ready
            .wait_until(|| !ring.is_empty(), Some(timeout))
    }

    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }
}

/// A reliable queue pair, connected to one peer QP.
pub struct QueuePair {
    dev: Device,
    /// What its posts are checked against before they reach the engine.
    gate: Arc<QpGate>,
    info: QpInfo,
    send_cq: CqId,
    recv_cq: CqId,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.info.qpn)
            .finish()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.dev.inner().lock().ep.destroy_qp(self.info.qpn);
    }
}

impl QueuePair {
    /// What the peer needs to connect to this QP (address, QP number, first PSN).
    pub fn info(&self) -> QpInfo {
        self.info
    }

    /// Connects to the peer QP described by `peer`.
    pub fn connect(&self, peer: QpInfo) -> Result<(), ResourceError> {
        self.dev.inner().lock().ep.connect(self.info.qpn, peer)?;
        self.gate.connected.store(true, Ordering::Release);
        Ok(())
    }

    /// Posts a send work request: either it is refused here with a [`PostError`] (not
    /// connected, bad key, protection domain, rights or bounds, too many entries or bytes, a
    /// bad atomic, a full queue), the same way whether or not another thread holds the
    /// engine, or it is accepted and completes on the send CQ. When the engine is free its
    /// packets leave from this thread; when another thread holds it, the request is handed to
    /// that thread (or to the progress thread). On a QP in the error state an accepted request
    /// completes as `Flushed`.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        self.dev.inner().post(Post::Send {
            qpn: self.info.qpn,
            wr,
            cq: self.send_cq,
            gate: self.gate.clone(),
        })
    }

    /// Posts a receive work request; refused or accepted as [`post_send`](Self::post_send)
    /// is (bad buffers, full queue).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.dev.inner().post(Post::Recv {
            qpn: self.info.qpn,
            wr,
            cq: self.recv_cq,
            gate: self.gate.clone(),
        })
    }

    /// Moves the QP to the error state: outstanding work completes as flushed.
    pub fn set_error(&self) -> Result<(), ResourceError> {
        self.dev
            .inner()
            .with_engine(|ep| ep.set_error(self.info.qpn))
    }

    /// State and counters.
    pub fn stats(&self) -> Option<QpStats> {
        self.dev.inner().lock().ep.qp_stats(self.info.qpn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::{SendOp, WcOpcode, WcStatus};

    const WAIT: Duration = Duration::from_secs(20);

    struct End {
        dev: Device,
        pd: ProtectionDomain,
        cq: CompletionQueue,
        qp: QueuePair,
    }

    fn pair() -> (End, End) {
        let open = || {
            let dev = Device::open(DeviceConfig::udp("127.0.0.1:0".parse().unwrap()).paths(4))
                .expect("open a UDP device");
            let pd = dev.alloc_pd();
            let cq = dev.create_cq();
            let qp = pd.create_qp(&cq, &cq).expect("qp");
            End { dev, pd, cq, qp }
        };
        let (a, b) = (open(), open());
        a.qp.connect(b.qp.info()).unwrap();
        b.qp.connect(a.qp.info()).unwrap();
        (a, b)
    }

    fn write(wr_id: u64, src: &MemoryRegion, dst: &MemoryRegion, off: u64) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Write(dst.remote(off)),
            sges: vec![src.sge(off, 8)],
            signaled: true,
        }
    }

    #[test]
    fn posts_queued_while_the_engine_is_busy_run_in_order() {
        let (a, b) = pair();
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        src.write(0, &[7; 64]).unwrap();
        {
            // Hold the engine as the progress thread would: these posts must take the
            // hand-off ring and still complete, in posting order.
            let _busy = a.dev.inner().core.lock().unwrap();
            for i in 0..4 {
                assert_eq!(a.qp.post_send(write(i, &src, &dst, i * 8)), Ok(()));
            }
            assert!(!a.dev.inner().posts.is_empty());
        }
        for i in 0..4 {
            let c = a.cq.wait(WAIT).expect("a completion");
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        let mut got = [0u8; 32];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, [7; 32]);
        assert!(a.cq.poll_one().is_none());
    }

    #[test]
    fn a_bad_post_is_refused_at_once_even_while_the_engine_is_busy() {
        let (a, b) = pair();
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        let rbuf = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let mut bad = write(9, &src, &dst, 0);
        bad.sges[0].offset = 1 << 20; // outside the region
        let bad_recv = RecvWr {
            wr_id: 11,
            sges: vec![src.sge(0, 8)], // no local write
        };
        // Engine free: refused inline.
        assert_eq!(a.qp.post_send(bad.clone()), Err(PostError::OutOfBounds));
        assert_eq!(a.qp.post_send(write(8, &src, &dst, 0)), Ok(()));
        {
            // Engine busy: the same refusals, and good posts go through the hand-off.
            let _busy = a.dev.inner().core.lock().unwrap();
            assert_eq!(a.qp.post_send(bad), Err(PostError::OutOfBounds));
            assert_eq!(a.qp.post_recv(bad_recv), Err(PostError::NoLocalWrite));
            assert_eq!(a.qp.post_send(write(10, &src, &dst, 8)), Ok(()));
            let good_recv = RecvWr {
                wr_id: 12,
                sges: vec![rbuf.sge(0, 8)],
            };
            assert_eq!(a.qp.post_recv(good_recv), Ok(()));
            assert!(!a.dev.inner().posts.is_empty());
        }
        let got: Vec<_> = (0..2)
            .map(|_| {
                let c = a.cq.wait(WAIT).expect("a completion");
                (c.wr_id, c.status, c.opcode)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (8, WcStatus::Success, WcOpcode::Write),
                (10, WcStatus::Success, WcOpcode::Write),
            ]
        );
        let stats = a.qp.stats().unwrap();
        assert_eq!(
            (stats.state, stats.outstanding_recvs),
            (braid_proto::QpState::Connected, 1)
        );
    }

    #[test]
    fn a_post_checked_before_a_deregistration_is_applied_before_it() {
        let (a, b) = pair();
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        let lkey = src.lkey();
        src.write(0, &[5; 8]).unwrap();
        {
            let _busy = a.dev.inner().core.lock().unwrap();
            assert_eq!(a.qp.post_send(write(1, &src, &dst, 0)), Ok(()));
        }
        drop(src);
        // The deregistration applied the handed-off post first (it was accepted, not lost or
        // refused late), then revoked the region under it before any of its packets left:
        // the engine no longer reads the source, so the WRITE fails with a local protection
        // error and nothing reaches the peer.
        let c = a.cq.wait(WAIT).expect("a completion");
        assert_eq!(
            (c.wr_id, c.status),
            (1, WcStatus::LocalProtectionError)
        );
        let mut got = [0u8; 8];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, [0; 8]);
        // After the deregistration the key is refused, at once.
        let wr = SendWr {
            wr_id: 2,
            op: SendOp::Write(dst.remote(0)),
            sges: vec![Sge {
                lkey,
                offset: 0,
                len: 8,
            }],
            signaled: true,
        };
        assert_eq!(a.qp.post_send(wr), Err(PostError::InvalidLkey));
    }

    #[test]
    fn threads_posting_at_once_each_get_every_completion() {
        // Four threads post WRITEs on one QP at once (contending for the engine, so some posts
        // take the hand-off ring): every work request completes exactly once on the CQ.
        const PER_THREAD: u64 = 200;
        let (a, b) = pair();
        let src = Arc::new(a.pd.alloc_mr(4096, Access::NONE).unwrap());
        let dst = Arc::new(b.pd.alloc_mr(4096, Access::REMOTE_WRITE).unwrap());
        let qp = Arc::new(a.qp);
        let posters: Vec<_> = (0..4u64)
            .map(|t| {
                let (qp, src, dst) = (qp.clone(), src.clone(), dst.clone());
                std::thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        let wr = write(t * PER_THREAD + i, &src, &dst, t * 8);
                        qp.post_send(wr).expect("post");
                    }
                })
            })
            .collect();
        let mut seen = vec![false; 4 * PER_THREAD as usize];
        for _ in 0..seen.len() {
            let c = a.cq.wait(WAIT).expect("every completion arrives");
            assert_eq!(c.status, WcStatus::Success);
            assert!(!std::mem::replace(&mut seen[c.wr_id as usize], true));
        }
        for p in posters {
            p.join().unwrap();
        }
        assert!(a.cq.poll_one().is_none());
    }
}
