//! The core of a device: it owns the [`Endpoint`] behind the engine lock, hands posts over
//! to whoever holds that lock, runs the progress thread (receive batches, timers) and the
//! transmit loop, and keeps each completion queue's engine side.
//!
//! A device has one or more **shards** (`DeviceConfig::shards`, see [`Owner`]): each is all
//! of the above (an [`Inner`]: its own engine, lock, datapath socket set, hand-off ring and
//! progress thread), and a QP lives on exactly one, so QPs on different shards never share a
//! lock on the data path. What follows describes one shard; the region table and the
//! completion queues' application sides span them.
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
//! - **Completions.** Each completion queue is one SPSC ring per shard: the shard's
//!   engine-lock holder produces, application threads consume (behind a per-ring lock, since
//!   several threads may poll one CQ; an empty CQ is seen without a lock). Waiters sleep on
//!   the CQ's [`braid_sync::Event`], which every shard notifies.
//! - **Transmit buffers** come from a lock-free [`braid_sync::Pool`].
//! - The datapath's `send`, which any thread may call.
//! - **Who drives** ([`Progress`]). With `Progress::Thread` only the progress thread
//!   receives, and timers are its job. With `Progress::Inline` (run to completion) a thread
//!   that finds its completion queue empty drives the device itself (`Inner::drive`): it
//!   *tries* the driver slot (`Inner::driver`, the receive and transmit buffers of whoever
//!   drives), the transmit order lock and the engine lock, in that order, and if any is
//!   taken it just looks at its queue again, so a poller never waits on a lock held by
//!   another poller (it does wait, off the CPU, for the progress thread, or a waiter asleep
//!   in the datapath, to hand the slot over: on a machine whose CPUs the pollers keep busy,
//!   spinning beside it kept it from running for milliseconds). While it
//!   holds all three it receives one batch without waiting, places it, runs due timers and
//!   sends what that produced. A thread blocked in `CompletionQueue::wait` with nobody else
//!   driving sleeps in the datapath itself (`Inner::wait_inline`), woken by the datagram, by
//!   a handed-off post (the post doorbell) or by a completion another thread publishes (the
//!   `sleeper` doorbell). The progress thread takes the driver slot for each of its rounds,
//!   and backs off (sleeps, out of the datapath) while a poller has been seen within
//!   `POLLER_GRACE_NS`; a poller that finds it asleep in the datapath wakes it so it sees
//!   that. Backed off, it looks again after `INLINE_SLICE`, then after twice as long each
//!   time up to `PARKED_SLICE_MAX`: on a machine whose CPUs the pollers keep busy, each of
//!   its wake-ups preempts one of them for a few microseconds, and a thousand a second put
//!   about one round trip in a hundred behind one. When nobody polls any more it takes over
//!   receives, timers and ACKs again, within `POLLER_GRACE_NS` and its current slice.
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use braid_datapath::{Datapath, Ecn, InPlace, LandingZone, RecvBatch, RecvMeta};
use braid_proto::validate::{self, LocalMr};
use braid_proto::{
    Access, Completion, CqId, Endpoint, EndpointConfig, EndpointStats, KeyHasher, KeyMap, Landing,
    MrKeys, PathStats, PdId, PostError, RecvWr, Region, ResourceError, RttSummary, SendWr,
    Timestamp,
};
use braid_sync::{Consumer, Doorbell, Event, Mpsc, Pool, Producer, Ring};
use smallvec::SmallVec;

use super::cq_fd;
use super::{OpenError, Progress};

/// Datagrams moved per batch between the engine and the datapath.
const BATCH: usize = 64;
/// Payload bytes one receive batch may hold at most, so that the acknowledgements of its
/// first datagrams do not wait for the placement of many large ones behind them.
const RX_BATCH_BYTES: usize = 256 << 10;
/// Payload bytes one transmit batch of datagrams above 32 KiB may hold at most. The engine
/// writes a batch's datagrams (payload gathered and its CRC folded in the same pass) before
/// the datapath sends any of them, so a batch of such datagrams would delay the first one's
/// departure by all the others' gathering, and would leave the cache before the kernel
/// copies it out; and as no two of them fit one GSO message, a larger batch saves only
/// system calls, each cheap next to the copy of one. Smaller datagrams keep `BATCH`: their
/// batches feed GSO messages of many, where a batch's system call carries many datagrams.
const TX_LARGE_BATCH_BYTES: usize = 128 << 10;
/// How long a poller's wish for the driver slot holds (`Inner::slot_wanted`): a poller
/// renews it at every look that finds the slot with a waiter asleep, so an older one is left
/// from a poller that is gone.
const SLOT_WISH_NS: u64 = 100_000;
/// Longest the progress thread sleeps. Posting threads never wake it for timers, so a
/// retransmit timeout armed by a post fires at most this late; the floor of the timeout is
/// 500 µs by default, so the slack stays within the same order.
const TIMER_SLACK: Duration = Duration::from_millis(1);
/// How often a busy-polling progress thread that receives nothing checks timers, ns.
const BUSY_TIMER_CHECK_NS: u64 = 20_000;
/// How long after it last received a thread-progress device's progress thread polls the
/// datapath without sleeping (yielding the CPU between polls), ns. At a steady rate the
/// next batch comes sooner, and a sleep costs a wake-up at both ends (the sender's kernel
/// wakes the sleeper): see bench/results/veth-2026-12-03.md.
const SPIN_BEFORE_SLEEP_NS: u64 = 50_000;
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
/// How long after a poller was last seen the progress thread of an inline-progress device
/// keeps out of the way, ns.
const POLLER_GRACE_NS: u64 = 2_000_000;
/// How stale the recorded poller time may get before a poller updates it, ns.
const POLLER_SEEN_STEP_NS: u64 = 100_000;
/// A spinning poller's looks that receive nothing read the clock once in this many (for the
/// timers and the poller mark): a clock read is a sizeable part of a look that finds nothing.
const CLOCK_EVERY_POLLS: u32 = 8;
/// How long the backed-off progress thread first sleeps before it looks again, and the
/// longest an inline waiter sleeps in the datapath or on its CQ's event before it looks again.
const INLINE_SLICE: Duration = Duration::from_millis(1);
/// The longest the backed-off progress thread sleeps before it looks again (its sleep
/// doubles from `INLINE_SLICE` while pollers stay active): after pollers stop, it takes over
/// within `POLLER_GRACE_NS` plus this.
const PARKED_SLICE_MAX: Duration = Duration::from_millis(16);
/// Datagrams of one UDP GSO message at most (the kernel's limit before Linux 6.9).
const GSO_RUN_MAX: usize = 64;
/// Transmit batches kept for reuse (each a `TxBatch`'s datagram buffers): one per thread that
/// sends at the same time is enough; more are allocated and freed.
const TX_POOL: usize = 4;

/// The application's side of a completion queue.
pub(super) struct CqShared {
    /// One ring per engine shard: shard `i` produces into `rings[i]`. A QP lives on one
    /// shard, so each QP's completions are in one ring, in its order.
    rings: Vec<CqRing>,
    /// The ring a multi-shard poll starts with (round robin, so no shard starves another).
    next: AtomicUsize,
    /// The shards that have QPs reporting here (bit `i`: shard `i`; 0 for none yet). Only
    /// steers who drives on an inline-progress device; completions are found in any ring.
    shard_mask: AtomicU64,
    /// Notified by the engine side after it publishes completions; `wait` sleeps on it.
    pub(super) ready: Event,
    /// The CQ's file descriptor for epoll users, made on first request (`cq_fd.rs`).
    pub(super) fd: std::sync::OnceLock<cq_fd::CqFd>,
}

/// One shard's ring of a completion queue.
struct CqRing {
    /// The ring's consumer end. Locked by whichever thread polls: several may poll one CQ.
    rx: Mutex<Consumer<Completion>>,
    /// The ring itself, to see an empty CQ without the lock (a spinning poller then touches
    /// only the ring's producer counter, not a lock the engine side also takes).
    ring: Arc<Ring<Completion>>,
}

impl CqRing {
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

impl CqShared {
    /// Takes up to `out.len()` completions from the rings; returns how many.
    pub(super) fn pop(&self, out: &mut [Completion]) -> usize {
        if let [one] = &self.rings[..] {
            return one.pop(out);
        }
        let n = self.rings.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut got = 0;
        for k in 0..n {
            if got == out.len() {
                break;
            }
            got += self.rings[(start + k) % n].pop(&mut out[got..]);
        }
        got
    }

    /// Whether every ring is empty (without taking a lock).
    pub(super) fn is_empty(&self) -> bool {
        self.rings.iter().all(|r| r.ring.is_empty())
    }

    /// Records that a QP on shard `shard` reports here.
    fn add_shard(&self, shard: usize) {
        self.shard_mask.fetch_or(1 << shard, Ordering::Relaxed);
    }

    /// The shards with QPs reporting here, as a mask (all `count` if none yet).
    fn shards(&self, count: usize) -> u64 {
        match self.shard_mask.load(Ordering::Relaxed) {
            0 => u64::MAX >> (64 - count),
            m => m,
        }
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
    /// anything new is in the ring; returns whether it did.
    fn publish(&mut self) -> bool {
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
            return true;
        }
        false
    }
}

/// A work request on its way to the engine: posted directly when the engine lock is free,
/// else through the hand-off ring.
pub(super) enum Post {
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
pub(super) struct QpGate {
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
    /// The gate of a new, not yet connected QP in protection domain `pd`.
    pub(super) fn new(pd: PdId) -> QpGate {
        QpGate {
            pd: pd.0,
            connected: AtomicBool::new(false),
            sq: Depth::default(),
            rq: Depth::default(),
        }
    }

    /// Lets sends through (call once the engine has connected the QP).
    pub(super) fn set_connected(&self) {
        self.connected.store(true, Ordering::Release);
    }

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

/// What the engine lock guards.
pub(super) struct Core {
    pub(super) ep: Endpoint,
    cqs: HashMap<CqId, CqSink, BuildHasherDefault<KeyHasher>>,
    /// The hand-off ring's consumer end: whoever holds the engine lock consumes.
    posts: Consumer<Post>,
    /// The connection handshake, once enabled (`crate::handshake`).
    pub(super) hs: Option<crate::handshake::Runtime>,
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

/// The regions of a device by local key, shared by its shards, for checking posts without
/// an engine lock.
type MrTable = RwLock<KeyMap<LocalMr>>;

/// One engine shard of a device: the state its handles and its progress thread share. A
/// device has one or more (`DeviceConfig::shards`), each with its own engine, lock, datapath
/// and progress thread; [`Owner`] holds them and what spans them.
pub(super) struct Inner {
    core: Mutex<Core>,
    pub(super) datapath: Box<dyn Datapath>,
    /// `braid_datapath::monotonic_ns()` when the shard was made: its timestamps count from
    /// there.
    epoch_ns: u64,
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
    pub(super) report: String,
    busy_poll: bool,
    /// The registered regions by local key, for checking posts without the engine lock;
    /// one table for every shard of the device. Never taken while holding an engine lock (a
    /// poster holds it while it waits for the engine).
    mrs: Arc<MrTable>,
    /// The engine's queue limits (`max_send_wr`, `max_recv_wr`, after clamping).
    max_wr: (usize, usize),
    /// Who drives the datapath and the engine.
    mode: Progress,
    /// The buffers of whoever drives an inline-progress device (a poller, a waiter or the
    /// progress thread): holding it is the right to receive. Taken before `tx_order` and the
    /// engine lock; pollers only try it.
    driver: Mutex<Driver>,
    /// When a poller was last seen (`now` in ns, 0 for never); the progress thread of an
    /// inline device backs off while it is recent.
    poller_seen: AtomicU64,
    /// Armed by an inline waiter sleeping in the datapath: whoever publishes completions
    /// then wakes the datapath, so the waiter does not sleep past a completion another
    /// thread produced.
    sleeper: Doorbell,
    /// The progress thread of an inline device is (about to be) asleep in the datapath; the
    /// first poller to see it wakes it.
    progress_asleep: AtomicBool,
    /// The progress thread of an inline device is backing off (out of the datapath).
    progress_parked: AtomicBool,
    /// The progress thread of an inline device holds the driver slot (set a little after it
    /// takes it and cleared a little after it gives it back: a hint for pollers).
    progress_driving: AtomicBool,
    /// When a poller last found the driver slot held by an inline waiter asleep in the
    /// datapath (ns, 0 for never): the waiter's next `wait_inline` within `SLOT_WISH_NS`
    /// gives the slot back instead of sleeping with it again (see `drive`).
    slot_wanted: AtomicU64,
    /// The engine may name places to receive large READ responses into
    /// (`Endpoint::wants_landing`, refreshed by whoever receives): receives try
    /// `receive_landed` first.
    landing: AtomicBool,
    /// The scratch of `receive_landed` (taken by whoever receives: uncontended).
    land: Mutex<LandScratch>,
    /// The engine may leave payloads in their regions ([`braid_proto::PayloadAt`]): its
    /// batches are sent with `send_in_place`.
    in_place: bool,
}

/// The receive and transmit buffers of the thread driving an inline-progress device.
pub(super) struct Driver {
    rx: RecvBatch,
    tx: TxBatch,
    /// When a poller last ran the timers.
    timers_checked: Timestamp,
    /// Polls that receive nothing left before one reads the clock (see `Inner::drive`).
    clock_in: u32,
    /// The next poll that receives nothing still has engine work: sending what a poll could
    /// not (the transmit order was taken), or the idle refresh after feedback.
    engine_owed: bool,
}

impl Driver {
    fn new(max_payload: usize) -> Driver {
        Driver {
            rx: RecvBatch::new(rx_slots(max_payload), max_payload),
            tx: TxBatch::new(max_payload),
            timers_checked: Timestamp::ZERO,
            clock_in: 0,
            engine_owed: false,
        }
    }
}

/// Datagrams one receive straight into place takes at most (`Inner::receive_landed`).
const LAND_MAX: usize = 4;

/// Header bytes a landed datagram's record keeps (a READ response's headers are 40).
const LAND_HEAD: usize = 64;

/// The scratch of the receives straight into place (`Inner::receive_landed`).
#[derive(Default)]
struct LandScratch {
    /// Where the engine expects the next datagrams.
    lands: Vec<Landing>,
    /// What the receive brought, in order.
    items: Vec<Landed>,
    /// The datagrams that were not the ones predicted, put back together.
    bytes: Vec<u8>,
}

/// One datagram of a receive straight into place.
enum Landed {
    /// The one predicted for landing `i`: its headers and trailer (its payload in place).
    Placed {
        i: usize,
        meta: RecvMeta,
        head: [u8; LAND_HEAD],
        head_len: usize,
        tail: [u8; 4],
    },
    /// Another datagram (or coalesced buffer), put back together at `bytes[at..at + len]`.
    Whole {
        meta: RecvMeta,
        segment: Option<usize>,
        at: usize,
    },
}

/// Datagram slots of a receive batch for datagrams of up to `max_payload` bytes: `BATCH`,
/// fewer for large datagrams (`RX_BATCH_BYTES`), at least 4.
fn rx_slots(max_payload: usize) -> usize {
    (RX_BATCH_BYTES / max_payload.max(1)).clamp(4, BATCH)
}

/// Takes `m` if it is free (ignoring poisoning, as every lock here does).
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Owns a device's shards and their progress threads (dropping the last handle stops them),
/// and what spans the shards: the region table and the choice of shard for a new QP.
///
/// Each shard is a whole engine with its own datapath (socket set, so its own UDP port),
/// lock, hand-off ring and progress thread; a QP lives on one, and its `QpInfo` carries that
/// shard's address, so the peer's datagrams reach the owning shard without any
/// demultiplexing here. What spans shards is kept the same in each: every protection domain
/// and completion queue is created in every shard's engine (the engines number them alike),
/// and every region is registered in every engine under the same keys (shard 0 draws them,
/// the others take them with `Endpoint::register_as`), so a remote key is valid whichever
/// shard the peer's QP talks to, and a deregistration revokes the region in each. A
/// completion queue has one ring per shard. Shard 0 has the device's address and runs the
/// connection handshake (its QPs are shard 0's).
pub(super) struct Owner {
    shards: Vec<Arc<Inner>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    mrs: Arc<MrTable>,
    /// Round-robin counter for the shard of the next QP.
    next_qp: AtomicUsize,
}

impl Owner {
    /// Starts a device's shards: one engine with `engine` settings over each of `datapaths`
    /// (opened as `report` says), and one progress thread each.
    pub(super) fn start(
        engine: EndpointConfig,
        datapaths: Vec<Box<dyn Datapath>>,
        report: String,
        busy_poll: bool,
        mode: Progress,
        send_in_place: bool,
    ) -> Result<Owner, OpenError> {
        let mrs = Arc::new(MrTable::default());
        let mut owner = Owner {
            shards: Vec::with_capacity(datapaths.len()),
            threads: Mutex::new(Vec::new()),
            mrs: mrs.clone(),
            next_qp: AtomicUsize::new(0),
        };
        for (index, datapath) in datapaths.into_iter().enumerate() {
            let mut engine = engine.clone();
            // Shard 0 keeps the seed (a deterministic single-shard device is unchanged); the
            // others draw other QP numbers, PSNs and keys.
            engine.seed = engine
                .seed
                .wrapping_add((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let inner = Arc::new(Inner::new(
                engine,
                datapath,
                report.clone(),
                busy_poll,
                mode,
                mrs.clone(),
                send_in_place,
            ));
            let worker = inner.clone();
            let name = if index == 0 {
                "braid-progress".to_string()
            } else {
                format!("braid-progress-{index}")
            };
            // On an error `owner` drops here and stops the threads started so far.
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || worker.progress())
                .map_err(OpenError::Thread)?;
            owner.shards.push(inner);
            owner
                .threads
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .push(thread);
        }
        Ok(owner)
    }

    /// Shard 0: the device's address, the handshake, the device-wide settings.
    pub(super) fn inner(&self) -> &Inner {
        &self.shards[0]
    }

    /// Shard `i`.
    pub(super) fn shard(&self, i: usize) -> &Inner {
        &self.shards[i]
    }

    /// The number of shards.
    pub(super) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard a new QP goes to: round robin, starting with shard 1 (so that the first QP
    /// of a device is not on shard 0, which also runs the handshake's QPs; and so that a
    /// single-QP device with several shards still exercises a shard of its own).
    pub(super) fn pick_shard(&self) -> usize {
        (self.next_qp.fetch_add(1, Ordering::Relaxed) + 1) % self.shards.len()
    }

    /// Records that a QP on `shard` reports to `cq` (steers inline driving).
    pub(super) fn cq_used_by(&self, cq: &CqShared, shard: usize) {
        cq.add_shard(shard);
    }

    /// Takes every shard's engine lock, in shard order (nothing else takes two).
    pub(super) fn lock_all(&self) -> Vec<MutexGuard<'_, Core>> {
        self.shards.iter().map(|s| s.lock()).collect()
    }

    /// Allocates a protection domain in every shard's engine.
    pub(super) fn alloc_pd(&self) -> PdId {
        let mut ids = self.shards.iter().map(|s| s.lock().ep.alloc_pd());
        let id = ids.next().expect("a device has a shard");
        for other in ids {
            // Every engine numbers its PDs and CQs from one counter, and each gets every one.
            debug_assert_eq!(other, id, "shards numbered a protection domain apart");
        }
        id
    }

    /// Creates a completion queue in every shard's engine, with one ring per shard; returns
    /// its id and the application's side.
    pub(super) fn create_cq(&self) -> (CqId, Arc<CqShared>) {
        let (producers, rings): (Vec<_>, Vec<_>) = self
            .shards
            .iter()
            .map(|_| {
                let (tx, rx) = braid_sync::ring::channel(CQ_RING);
                let ring = CqRing {
                    ring: rx.ring().clone(),
                    rx: Mutex::new(rx),
                };
                (tx, ring)
            })
            .unzip();
        let shared = Arc::new(CqShared {
            rings,
            next: AtomicUsize::new(0),
            shard_mask: AtomicU64::new(0),
            ready: Event::new(),
            fd: std::sync::OnceLock::new(),
        });
        let mut id = None;
        for (shard, tx) in self.shards.iter().zip(producers) {
            let got = shard.add_cq(tx, &shared);
            debug_assert!(id.is_none_or(|id| id == got), "shards numbered a CQ apart");
            id.get_or_insert(got);
        }
        (id.expect("a device has a shard"), shared)
    }

    /// Registers `region` in protection domain `pd` with every shard's engine (shard 0 draws
    /// the keys, the others take the same), then in the table posts are checked against.
    pub(super) fn register(
        &self,
        pd: PdId,
        region: &Arc<Region>,
        access: Access,
    ) -> Result<MrKeys, ResourceError> {
        let keys = self.shards[0]
            .lock()
            .ep
            .register(pd, region.clone(), access)?;
        for (i, shard) in self.shards.iter().enumerate().skip(1) {
            let r = shard
                .lock()
                .ep
                .register_as(pd, region.clone(), access, keys);
            if let Err(e) = r {
                // Every shard holds the same keys, so this is not expected; undo what was
                // done rather than leave a region valid on some shards only.
                for s in &self.shards[..i] {
                    let _ = s.lock().ep.deregister(keys.lkey);
                }
                return Err(e);
            }
        }
        // After the engine locks are released (see `Inner::mrs`).
        let mr = LocalMr {
            pd: pd.0,
            access,
            len: region.len() as u64,
        };
        self.mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(keys.lkey, mr);
        Ok(keys)
    }

    /// Deregisters the region with local key `lkey`: when this returns, no post can use it
    /// and no shard's engine touches its memory any more.
    pub(super) fn deregister(&self, lkey: u32) {
        // First out of the table posts are checked against (waiting for posts being checked),
        // then out of each engine, whose lock first applies the posts checked before; through
        // `with_engine`, so the refusals the revocation causes leave now. Its flush takes the
        // transmit order, so a send in flight from the region's memory (a payload sent in
        // place, `Inner::send`) has returned before this does, and caller memory may go.
        self.mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lkey);
        for shard in &self.shards {
            let _ = shard.with_engine(|ep| ep.deregister(lkey));
        }
    }

    /// Inline progress for a poller of `cq` that found it empty: drives each shard with QPs
    /// reporting there (see `Inner::drive`). Returns whether it drove any.
    pub(super) fn drive(&self, cq: &CqShared) -> bool {
        if let [one] = &self.shards[..] {
            return one.drive();
        }
        let mask = cq.shards(self.shards.len());
        let mut drove = false;
        for (i, shard) in self.shards.iter().enumerate() {
            if mask & (1 << i) != 0 {
                drove |= shard.drive();
            }
        }
        drove
    }

    /// The blocking side of inline progress for `cq` (see `Inner::wait_inline`). A queue
    /// whose QPs are all on one shard sleeps in that shard's datapath; one fed by several
    /// shards cannot sleep in all their datapaths at once, so it drives them and then sleeps
    /// on the queue's event for at most `INLINE_SLICE` before its caller drives again.
    pub(super) fn wait_inline(&self, cq: &CqShared, left: Duration) {
        let mask = cq.shards(self.shards.len());
        if mask.count_ones() == 1 {
            let i = mask.trailing_zeros() as usize;
            if let Some(shard) = self.shards.get(i) {
                return shard.wait_inline(cq, left);
            }
        }
        self.drive(cq);
        cq.ready
            .wait_until(|| !cq.is_empty(), Some(left.min(INLINE_SLICE)));
    }

    /// Endpoint counters, summed over the shards.
    pub(super) fn stats(&self) -> EndpointStats {
        let mut all = self.shards.iter().map(|s| s.lock().ep.stats().clone());
        let mut sum = all.next().unwrap_or_default();
        for s in all {
            sum.rx_datagrams += s.rx_datagrams;
            sum.tx_datagrams += s.tx_datagrams;
            sum.retransmits += s.retransmits;
            sum.rx_bad_crc += s.rx_bad_crc;
            sum.rx_malformed += s.rx_malformed;
            sum.rx_unknown_qp += s.rx_unknown_qp;
            sum.rx_wrong_peer += s.rx_wrong_peer;
            sum.rx_duplicates += s.rx_duplicates;
            sum.rx_out_of_window += s.rx_out_of_window;
            sum.rx_bad_response += s.rx_bad_response;
            sum.naks_sent += s.naks_sent;
            sum.naks_received += s.naks_received;
            sum.rto_fired += s.rto_fired;
            sum.rx_auth_failed += s.rx_auth_failed;
            sum.rx_replayed += s.rx_replayed;
            sum.stalled_samples += s.stalled_samples;
            sum.rx_landed += s.rx_landed;
            sum.tx_in_place += s.tx_in_place;
        }
        sum
    }

    /// The datapaths' counters ([`Datapath::counters`]), summed by name over the shards.
    pub(super) fn datapath_counters(&self) -> Vec<(&'static str, u64)> {
        let mut sum: Vec<(&'static str, u64)> = Vec::new();
        for shard in &self.shards {
            for (name, v) in shard.datapath.counters() {
                match sum.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, total)) => *total += v,
                    None => sum.push((name, v)),
                }
            }
        }
        sum
    }

    /// Per-path counters, summed over the shards path by path (the smoothed RTT weighted by
    /// each shard's samples on the path).
    pub(super) fn path_stats(&self) -> Vec<PathStats> {
        let mut all = self
            .shards
            .iter()
            .map(|s| s.lock().ep.path_stats().to_vec());
        let mut sum = all.next().unwrap_or_default();
        for paths in all {
            for (p, q) in sum.iter_mut().zip(paths) {
                let samples = p.rtt_samples + q.rtt_samples;
                if samples > 0 {
                    let weighted = u128::from(p.srtt_ns) * u128::from(p.rtt_samples)
                        + u128::from(q.srtt_ns) * u128::from(q.rtt_samples);
                    p.srtt_ns = (weighted / u128::from(samples)) as u64;
                }
                p.rtt_samples = samples;
                p.packets += q.packets;
                p.lost += q.lost;
                p.retransmits += q.retransmits;
                p.ce_marks += q.ce_marks;
            }
        }
        sum
    }

    /// The RTT distribution over every QP. With several shards, the count, extremes and mean
    /// are exact and each percentile is the largest of the shards' (an upper bound of the
    /// device-wide one: at least that share of every shard's samples lies at or below it).
    pub(super) fn rtt_summary(&self) -> RttSummary {
        let mut all = self
            .shards
            .iter()
            .map(|s| s.lock().ep.rtt_summary())
            .filter(|r| r.samples > 0);
        let Some(mut sum) = all.next() else {
            return RttSummary::default();
        };
        for r in all {
            let samples = sum.samples + r.samples;
            let mean = (u128::from(sum.mean_ns) * u128::from(sum.samples)
                + u128::from(r.mean_ns) * u128::from(r.samples))
                / u128::from(samples);
            sum.mean_ns = mean as u64;
            sum.samples = samples;
            sum.min_ns = sum.min_ns.min(r.min_ns);
            sum.max_ns = sum.max_ns.max(r.max_ns);
            sum.p50_ns = sum.p50_ns.max(r.p50_ns);
            sum.p99_ns = sum.p99_ns.max(r.p99_ns);
            sum.p999_ns = sum.p999_ns.max(r.p999_ns);
        }
        sum
    }
}

impl Inner {
    /// A shard: an engine with `engine` settings over `datapath`, sharing the region table
    /// `mrs` with the device's other shards, sending payloads from their regions where the
    /// datapath can if `send_in_place`. Its progress thread is started by the caller.
    fn new(
        engine: EndpointConfig,
        datapath: Box<dyn Datapath>,
        report: String,
        busy_poll: bool,
        mode: Progress,
        mrs: Arc<MrTable>,
        send_in_place: bool,
    ) -> Inner {
        let mut ep = Endpoint::new(engine, datapath.local_addr());
        let max_wr = (ep.config().max_send_wr, ep.config().max_recv_wr);
        let (posts, posts_rx) = Mpsc::new(POST_RING);
        let max_payload = datapath.max_payload();
        let in_place_min = datapath
            .in_place_min()
            .filter(|&min| send_in_place && min <= max_payload);
        ep.set_in_place_min(in_place_min);
        let in_place = in_place_min.is_some();
        Inner {
            core: Mutex::new(Core {
                ep,
                cqs: HashMap::default(),
                posts: posts_rx,
                hs: None,
            }),
            datapath,
            epoch_ns: braid_datapath::monotonic_ns(),
            stop: AtomicBool::new(false),
            tx_order: Mutex::new(()),
            report,
            busy_poll,
            tx_pool: Pool::new(TX_POOL),
            posts,
            mrs,
            max_wr,
            mode,
            driver: Mutex::new(Driver::new(max_payload)),
            in_place,
            poller_seen: AtomicU64::new(0),
            sleeper: Doorbell::new(),
            progress_asleep: AtomicBool::new(false),
            progress_parked: AtomicBool::new(false),
            progress_driving: AtomicBool::new(false),
            slot_wanted: AtomicU64::new(0),
            landing: AtomicBool::new(false),
            land: Mutex::new(LandScratch::default()),
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        for shard in &self.shards {
            shard.stop.store(true, Ordering::Release);
            shard.datapath.wake();
        }
        let threads = std::mem::take(self.threads.get_mut().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Datagrams taken from the engine for one `Datapath::send`: `max`, and past that the rest
/// of a run of same-path datagrams that reached the end of the batch (see `Inner::drain`).
struct TxBatch {
    /// `max + run_max` slots of `size` bytes, back to back: a run of up to `run_max`
    /// datagrams that starts in the last slot of the first `max` still fits. Full-size
    /// datagrams in consecutive slots are one contiguous range, which the UDP datapath sends
    /// as one iovec per GSO run.
    bufs: Box<[u8]>,
    size: usize,
    /// Datagrams taken before a run is topped up: `BATCH`, fewer for datagrams above 32 KiB
    /// (`TX_LARGE_BATCH_BYTES`).
    max: usize,
    metas: Vec<braid_proto::Transmit>,
    /// Longest run topped up past `max`: as many datagrams of the largest size as one GSO
    /// message holds (44 of 1472 bytes; 1 for datagrams above 32 KiB, where nothing is
    /// coalesced).
    run_max: usize,
    /// A datagram taken from the engine after the batch was full that does not continue its
    /// last run: it leads the next batch. Its buffer index.
    carry: Option<(braid_proto::Transmit, usize)>,
}

impl TxBatch {
    /// Slot `i`, to write a datagram into.
    fn slot_mut(bufs: &mut [u8], size: usize, i: usize) -> &mut [u8] {
        &mut bufs[i * size..(i + 1) * size]
    }

    fn new(size: usize) -> TxBatch {
        let size = size.max(1);
        let run_max = (braid_datapath::MAX_DATAGRAM / size).clamp(1, GSO_RUN_MAX);
        let max = if run_max > 1 {
            BATCH
        } else {
            (TX_LARGE_BATCH_BYTES / size).clamp(1, BATCH)
        };
        TxBatch {
            bufs: vec![0u8; (max + run_max) * size].into_boxed_slice(),
            size,
            max,
            metas: Vec::with_capacity(max + run_max),
            run_max,
            carry: None,
        }
    }
}

impl Inner {
    pub(super) fn now(&self) -> Timestamp {
        Timestamp::from_nanos(braid_datapath::monotonic_ns().saturating_sub(self.epoch_ns))
    }

    /// Takes the engine lock and applies the work requests queued in the hand-off ring, so
    /// that every engine operation sees the posts that returned before it.
    pub(super) fn lock(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        core.take_posts();
        core
    }

    /// Checks `p` (refusing it here if it is bad, whether or not the engine is busy), then
    /// posts it on this thread if the engine lock is free (the inline doorbell: its packets
    /// leave from here), or hands it to whoever holds the lock and wakes the progress thread
    /// if it sleeps.
    pub(super) fn post(&self, p: Post) -> Result<(), PostError> {
        let (r, applied_here) = self.post_unsent(p);
        if applied_here {
            self.flush_pooled();
        }
        r
    }

    /// Posts each of `posts` in order as [`post`](Self::post) does, then sends what they
    /// produced once, after the last (one doorbell for the list, as `ibv_post_send` takes a
    /// chain). Stops at the first refused one: `Err((its index, why))`, the ones before it
    /// stay posted.
    pub(super) fn post_list(
        &self,
        posts: impl IntoIterator<Item = Post>,
    ) -> Result<(), (usize, PostError)> {
        let mut r = Ok(());
        let mut flush = false;
        for (i, p) in posts.into_iter().enumerate() {
            let (one, applied_here) = self.post_unsent(p);
            flush |= applied_here;
            if let Err(e) = one {
                r = Err((i, e));
                break;
            }
        }
        if flush {
            self.flush_pooled();
        }
        r
    }

    /// [`post`](Self::post) without the send. Also says whether this thread applied it to
    /// the engine (then the caller sends what it produced); a request refused by the checks
    /// or handed to the lock holder leaves nothing for this thread to send.
    fn post_unsent(&self, p: Post) -> (Result<(), PostError>, bool) {
        // Held until the post is applied or in the ring: a deregistration (which takes it for
        // writing, then the engine lock, which applies the ring) is ordered before or after.
        let mrs = self.mrs.read().unwrap_or_else(|e| e.into_inner());
        let lookup = |lkey| mrs.get(&lkey).copied();
        let gate = p.gate();
        let checked = match &p {
            Post::Send { wr, .. } => {
                if !gate.connected.load(Ordering::Acquire) {
                    return (Err(PostError::NotConnected), false);
                }
                validate::check_send(gate.pd, wr, lookup)
            }
            Post::Recv { wr, .. } => validate::check_recv(gate.pd, wr, lookup),
        };
        if let Err(e) = checked {
            return (Err(e), false);
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
                        return (Ok(()), false);
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
        (r, true)
    }

    /// Hands completions to their queues and fills `batch` with up to `max` datagrams, led
    /// by the one the last call carried over. If the batch fills up, the run of same-path
    /// datagrams at its end is topped up until it ends (at most `run_max` in all past
    /// `max`), so the datapath sends it as one GSO message instead of two; the datagram
    /// that ends it is carried over to the next batch. Returns whether the engine may have
    /// more to send (always when a datagram was carried over).
    fn drain(&self, core: &mut Core, now: Timestamp, batch: &mut TxBatch) -> bool {
        // Every batch drained before was sent (drains and sends take turns under the
        // transmit order): the regions their payloads were left in may go.
        core.ep.unpin_payloads();
        while let Some((cq, c)) = core.ep.poll_completion() {
            if let Some(sink) = core.cqs.get_mut(&cq) {
                sink.push(c);
            }
        }
        let mut published = false;
        for sink in core.cqs.values_mut() {
            published |= sink.publish();
        }
        // An inline waiter asleep in the datapath learns of completions through it.
        if published && self.sleeper.ring() {
            self.datapath.wake();
        }
        batch.metas.clear();
        if let Some((t, i)) = batch.carry.take() {
            batch
                .bufs
                .copy_within(i * batch.size..i * batch.size + t.len, 0);
            batch.metas.push(t);
        }
        if !core.ep.poll_transmit_batch(
            now,
            &mut batch.bufs,
            batch.size,
            &mut batch.metas,
            batch.max,
        ) {
            return false;
        }
        // The run that reached the end of the batch: its first datagram's index.
        let last = batch.metas[batch.max - 1];
        let run_start = batch.metas[..batch.max]
            .iter()
            .rposition(|t| {
                (t.path, t.dest, t.ecn, t.len) != (last.path, last.dest, last.ecn, last.len)
            })
            .map_or(0, |i| i + 1);
        while batch.metas.len() < run_start + batch.run_max {
            let i = batch.metas.len();
            let slot = TxBatch::slot_mut(&mut batch.bufs, batch.size, i);
            let Some(mut t) = core.ep.poll_transmit(now, slot) else {
                return false;
            };
            if (t.path, t.dest, t.ecn) != (last.path, last.dest, last.ecn) || t.len > last.len {
                // It waits for the next batch, after its region's pin is gone (the next
                // drain unpins): it goes whole. (Its region was pinned by this very call; were
                // it not, the datagram is dropped, as if lost, rather than sent unpinned.)
                if t.payload.is_some() && !core.ep.copy_payload(&mut t, slot) {
                    return true;
                }
                batch.carry = Some((t, i));
                return true;
            }
            batch.metas.push(t);
            if t.len < last.len {
                // A shorter datagram ends a GSO run.
                return true;
            }
        }
        true
    }

    fn send(&self, batch: &TxBatch) {
        if batch.metas.is_empty() {
            return;
        }
        // On the stack: a transmit batch allocates nothing (`metas` holds at most
        // `BATCH + run_max` datagrams, and `run_max <= GSO_RUN_MAX`). Filled in place: the
        // array is 7 KiB, and `collect` returned it by value, a copy of it per call.
        let mut txs: SmallVec<[braid_datapath::Transmit<'_>; BATCH + GSO_RUN_MAX]> =
            SmallVec::new();
        txs.extend(
            batch
                .metas
                .iter()
                .zip(batch.bufs.chunks(batch.size))
                .map(|(t, b)| braid_datapath::Transmit {
                    dest: t.dest,
                    path: t.path,
                    ecn: Ecn::from_tos(t.ecn),
                    contents: &b[..t.len],
                }),
        );
        let mut in_place: SmallVec<[Option<InPlace>; BATCH + GSO_RUN_MAX]> = SmallVec::new();
        if self.in_place && batch.metas.iter().any(|t| t.payload.is_some()) {
            in_place.extend(batch.metas.iter().map(|t| {
                t.payload.map(|p| InPlace {
                    at: p.at as usize,
                    src: p.addr as *const u8,
                    len: p.len as usize,
                })
            }));
        }
        let mut sent = 0;
        while sent < txs.len() {
            let r = if in_place.is_empty() {
                self.datapath.send(&txs[sent..])
            } else {
                // SAFETY: each payload lies in a region the engine pinned when it wrote the
                // datagram, until the next `drain`, which comes after this returns (both run
                // under the transmit order); `at + len` ends before the trailer, inside the
                // datagram. Caller memory registered as a region lives until its
                // deregistration returns, which waits for the transmit order (it flushes).
                unsafe { self.datapath.send_in_place(&txs[sent..], &in_place[sent..]) }
            };
            match r {
                Ok(0) | Err(_) => break, // the rest are lost; the engine retransmits them
                Ok(n) => sent += n,
            }
        }
    }

    /// Flushes with a transmit batch from the pool (a fresh one if the pool is empty; it is
    /// dropped afterwards if the pool is full).
    pub(super) fn flush_pooled(&self) {
        let mut batch = self
            .tx_pool
            .get()
            .unwrap_or_else(|| Box::new(TxBatch::new(self.datapath.max_payload())));
        self.flush(&mut batch);
        let _ = self.tx_pool.put(batch);
    }

    /// Sends everything the engine has to send, in timestamp order, and hands completions to
    /// their queues. The engine learns when each batch's send returned (at the next batch,
    /// or after the last one), so the delay its congestion controller gets starts at the
    /// departure (`braid_proto::Endpoint::departed`).
    fn flush(&self, batch: &mut TxBatch) {
        self.flush_after_timers(batch, None);
    }

    /// [`flush`](Self::flush), first running the engine's and the handshake's timers due at
    /// `timers_at` (if given) under its first engine lock, whose batch is stamped with that
    /// time: the timers and the sends they cause for one lock and one clock read.
    fn flush_after_timers(&self, batch: &mut TxBatch, mut timers_at: Option<Timestamp>) {
        let _order = self.tx_order.lock().unwrap_or_else(|e| e.into_inner());
        let mut departed = None;
        loop {
            let (more, number) = {
                let mut core = self.lock();
                if let Some((b, at)) = departed.take() {
                    core.ep.departed(b, at);
                }
                let now = match timers_at.take() {
                    Some(t) => {
                        self.timers_locked(&mut core, t);
                        t
                    }
                    None => self.now(),
                };
                let more = self.drain(&mut core, now, batch);
                (more, core.ep.end_tx_batch())
            };
            if !batch.metas.is_empty() {
                self.send(batch);
                departed = Some((number, self.now()));
            }
            if !more {
                break;
            }
        }
        if let Some((b, at)) = departed {
            // The bare lock: taking the posts queued meanwhile is the next flush's work.
            let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
            core.ep.departed(b, at);
        }
    }

    /// Runs `f` on the engine, then sends what it produced, from this thread.
    pub(super) fn with_engine<R>(&self, f: impl FnOnce(&mut Endpoint) -> R) -> R {
        let r = f(&mut self.lock().ep);
        self.flush_pooled();
        r
    }

    /// Creates this shard's side of a completion queue: the engine's CQ and the sink (which
    /// the engine-lock holder fills through `tx`) feeding the application's side `shared`.
    fn add_cq(&self, tx: Producer<Completion>, shared: &Arc<CqShared>) -> CqId {
        let mut core = self.lock();
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
        id
    }

    /// Receives one batch and hands it to the engine. The engine lock is taken at the first
    /// datagram, not while waiting, and each payload goes from the datapath's buffer straight
    /// into its memory region.
    fn receive(&self, rx: &mut RecvBatch, timeout: Option<Duration>) -> usize {
        if self.landing.load(Ordering::Relaxed) {
            let mut core = self.lock();
            let now = self.now();
            match self.receive_landed(&mut core, now) {
                // Nothing queued and time to wait: the usual receive waits.
                Some(0) if timeout != Some(Duration::ZERO) => {}
                Some(n) => return n,
                None => {}
            }
        }
        let mut core = None;
        let mut now = Timestamp::ZERO;
        let r = self.datapath.recv_with(rx, timeout, &mut |meta, bytes| {
            let core = core.get_or_insert_with(|| {
                now = self.now();
                self.lock()
            });
            self.deliver(core, now, meta, bytes);
        });
        if let Some(core) = &core {
            self.note_landing(core);
        }
        match r {
            Ok(n) => n,
            Err(_) => {
                // A failing datapath must not turn this loop into a busy spin.
                std::thread::sleep(TIMER_SLACK);
                0
            }
        }
    }

    /// Records whether the engine may name landings (after it handled datagrams) that the
    /// datapath can receive into.
    fn note_landing(&self, core: &Core) {
        let wants = core.ep.wants_landing() && self.datapath.lands();
        if wants != self.landing.load(Ordering::Relaxed) {
            self.landing.store(wants, Ordering::Relaxed);
        }
    }

    /// Receives what is queued straight into place where the engine expects the next
    /// datagrams of a large READ response (see `braid_proto::Landing`): one receive in
    /// pieces of up to `LAND_MAX` datagrams, the engine held from naming the places until
    /// what landed there is handled, so nothing places or frees those bytes meanwhile. The
    /// datagrams that are not the ones predicted are put back together, all of them before
    /// any is handled (handling places bytes, maybe where another one landed), and handed
    /// over as any received datagram. `None` when the engine names no place (the flag is
    /// cleared) or the datapath declines: the caller receives the usual way.
    fn receive_landed(&self, core: &mut Core, now: Timestamp) -> Option<usize> {
        let mut scratch = self.land.lock().unwrap_or_else(|e| e.into_inner());
        let LandScratch {
            lands,
            items,
            bytes,
        } = &mut *scratch;
        lands.clear();
        core.ep.landings(lands, LAND_MAX);
        if lands.is_empty() {
            self.landing.store(false, Ordering::Relaxed);
            return None;
        }
        let empty = LandingZone {
            head: 0,
            dst: std::ptr::null_mut(),
            len: 0,
        };
        let mut zones = [empty; LAND_MAX];
        for (z, l) in zones.iter_mut().zip(lands.iter()) {
            *z = LandingZone {
                head: l.head_len(),
                dst: l.dst(),
                len: l.len(),
            };
        }
        items.clear();
        bytes.clear();
        let mut take = |i: usize, p: &braid_datapath::LandedPieces<'_>| {
            let l = &lands[i];
            if p.segment.is_none()
                && p.head.len() <= LAND_HEAD
                && l.matches(p.head, p.landed, p.tail)
            {
                let mut head = [0u8; LAND_HEAD];
                head[..p.head.len()].copy_from_slice(p.head);
                let mut tail = [0u8; 4];
                tail.copy_from_slice(p.tail);
                items.push(Landed::Placed {
                    i,
                    meta: p.meta,
                    head,
                    head_len: p.head.len(),
                    tail,
                });
                return;
            }
            let at = bytes.len();
            bytes.extend_from_slice(p.head);
            let mid = bytes.len();
            bytes.resize(mid + p.landed, 0);
            l.read_landed(&mut bytes[mid..]);
            bytes.extend_from_slice(p.tail);
            items.push(Landed::Whole {
                meta: p.meta,
                segment: p.segment,
                at,
            });
        };
        // SAFETY: each landing names `len` bytes of live registered memory that no packet
        // has placed, apart from the others' (`Endpoint::landings`); this thread holds the
        // engine from naming them until what landed is handled below, so nothing places,
        // deregisters or frees them meanwhile.
        let got = unsafe { self.datapath.recv_landing(&zones[..lands.len()], &mut take) };
        let n = match got {
            Ok(Some(n)) => n,
            // Declined, or an error the usual receive reports.
            Ok(None) | Err(_) => return None,
        };
        for item in items.drain(..) {
            match item {
                Landed::Placed {
                    i,
                    meta,
                    head,
                    head_len,
                    tail,
                } => {
                    let from = (meta.src, meta.ecn as u8);
                    let head = &head[..head_len];
                    let handled =
                        core.ep
                            .handle_landed(now, meta.queued_ns, from, &lands[i], head, &tail);
                    // `matches` said so above, for these very pieces.
                    debug_assert!(handled, "a landing refused what it predicted");
                }
                Landed::Whole { meta, segment, at } => {
                    for (off, len) in braid_datapath::segments(meta.len, segment) {
                        let d = &bytes[at + off..at + off + len];
                        self.deliver(core, now, &RecvMeta { len, ..meta }, d);
                    }
                }
            }
        }
        self.note_landing(core);
        Some(n)
    }

    /// Hands one received datagram to the handshake or the engine.
    fn deliver(&self, core: &mut Core, now: Timestamp, meta: &RecvMeta, bytes: &[u8]) {
        if crate::handshake::is_handshake(bytes) {
            let Core { ep, hs, .. } = core;
            crate::handshake::on_datagram(hs, ep, now, meta.src, bytes, &*self.datapath);
            return;
        }
        core.ep
            .handle_received(now, meta.queued_ns, meta.src, meta.ecn as u8, bytes);
    }

    /// Who drives the datapath and the engine.
    pub(super) fn progress_mode(&self) -> Progress {
        self.mode
    }

    /// Whether completion queue polls drive the device (`Progress::Inline`).
    pub(super) fn inline(&self) -> bool {
        self.mode == Progress::Inline
    }

    /// Records that a poller is active, so the progress thread keeps out of the way. Writes
    /// the shared word only when the recorded time is `POLLER_SEEN_STEP_NS` old, so spinning
    /// pollers mostly just read it.
    fn seen_poller(&self, now: Timestamp) {
        let now = now.as_nanos().max(1);
        if now.saturating_sub(self.poller_seen.load(Ordering::Relaxed)) >= POLLER_SEEN_STEP_NS {
            self.poller_seen.store(now, Ordering::Relaxed);
        }
    }

    /// Whether a poller was seen within `POLLER_GRACE_NS`.
    fn pollers_active(&self, now: Timestamp) -> bool {
        let seen = self.poller_seen.load(Ordering::Relaxed);
        seen != 0 && now.as_nanos().saturating_sub(seen) < POLLER_GRACE_NS
    }

    /// Inline progress from a thread polling a completion queue: if nobody else is driving,
    /// receives one batch without waiting, places it, runs the timers if due (at most every
    /// `BUSY_TIMER_CHECK_NS`) and sends what the engine has to send. Waits for no lock another
    /// poller holds but the engine once a datagram is in hand (as a receive does): if the
    /// driver slot is taken, or the engine when nothing came, the thread holding it makes the
    /// progress and this returns `false` (after waiting for the slot if the progress thread
    /// held it); if the transmit order is taken, its holder or the next look sends what this
    /// one produced.
    ///
    /// A spinning poller's look that finds nothing is this function's common case, and the
    /// time it takes is how late, on average half of it, a datagram is seen: such a look
    /// reads the clock only every `CLOCK_EVERY_POLLS` (for the timers and the poller mark)
    /// and takes neither the engine nor the transmit order unless posts wait in the hand-off
    /// ring, the timers are due, or an earlier look left engine work (`Driver::engine_owed`).
    /// A datagram takes the engine (waiting for it, as a receive does) and the clock.
    pub(super) fn drive(&self) -> bool {
        let Some(mut drv) = try_lock(&self.driver) else {
            let now = self.now();
            self.seen_poller(now);
            // The progress thread may hold the slot, maybe asleep in the datapath: wake it,
            // so that it sees the poller, backs off and leaves the slot to pollers. It needs
            // a CPU to get there, and where pollers keep every CPU busy it waited for one for
            // milliseconds (the first WRITE of most `braid-perf write_lat` runs, its ACK held
            // by both sides' progress threads, met its retransmission timeout): the poller
            // waits for the slot off the CPU instead of spinning beside it.
            //
            // Else an inline waiter (`wait_inline`) may hold it asleep in the datapath, as
            // the libfabric provider's own thread does while the application is away: the
            // same starvation, the datagram the poller waits for queued for a waiter that
            // woke but found no CPU. An armed sleeper is such a waiter: it is woken, and the
            // wish it finds at its next `wait_inline` sends it off the slot, so that it does
            // not take the slot back and sleep again while this poller waits for it. A poller
            // finding the slot held by another poller, or by a waiter not yet armed, just
            // looks again (and finds it armed the next time). The wish is a hint: missed, the
            // waiter sleeps one more slice and is woken again.
            let hand_over = if self.progress_driving.load(Ordering::Acquire) {
                // Ordered after this poller's mark (`seen_poller` above), against the progress
                // thread's flag-then-look before it sleeps.
                fence(Ordering::SeqCst);
                if self.progress_asleep.swap(false, Ordering::AcqRel) {
                    self.datapath.wake();
                }
                true
            } else if self.sleeper.ring() {
                self.slot_wanted
                    .store(now.as_nanos().max(1), Ordering::SeqCst);
                self.datapath.wake();
                true
            } else {
                false
            };
            if hand_over {
                drop(self.driver.lock().unwrap_or_else(|e| e.into_inner()));
            }
            return false;
        };
        let Driver {
            rx,
            tx,
            timers_checked,
            clock_in,
            engine_owed,
        } = &mut *drv;
        let mut now = None;
        if *clock_in == 0 {
            *clock_in = CLOCK_EVERY_POLLS;
            let t = self.now();
            self.seen_poller(t);
            now = Some(t);
        } else {
            *clock_in -= 1;
        }
        let mut engine = None;
        let mut landed = None;
        if self.landing.load(Ordering::Relaxed) {
            let (core, at) = engine.get_or_insert_with(|| (self.lock(), self.now()));
            landed = self.receive_landed(core, *at);
        }
        let received = match landed {
            Some(n) => n,
            None => {
                let n = self
                    .datapath
                    .recv_with(rx, Some(Duration::ZERO), &mut |meta, bytes| {
                        let (core, at) = engine.get_or_insert_with(|| (self.lock(), self.now()));
                        self.deliver(core, *at, meta, bytes);
                    })
                    .unwrap_or(0);
                if let Some((core, _)) = &engine {
                    self.note_landing(core);
                }
                n
            }
        };
        let now = engine.as_ref().map(|(_, at)| *at).or(now);
        let timers_due = now.is_some_and(|t| t.nanos_since(*timers_checked) >= BUSY_TIMER_CHECK_NS);
        let mut core = match engine {
            Some((core, _)) => core,
            None if timers_due || *engine_owed || !self.posts.is_empty() => {
                match try_lock(&self.core) {
                    Some(mut core) => {
                        core.take_posts();
                        core
                    }
                    None => return false,
                }
            }
            // Nothing came and nothing waits for the engine.
            None => return true,
        };
        let core = &mut *core;
        let mut timers_ran = false;
        if let Some(t) = now.filter(|_| timers_due) {
            *timers_checked = t;
            self.timers_locked(core, t);
            timers_ran = true;
        }
        // Taken with the engine held (a flush takes the order first, then the engine): only
        // tried, so the two cannot wait for each other. Whoever holds it sends next, and
        // sends what this round produced if it drains after it; else the next look does.
        let Some(_order) = try_lock(&self.tx_order) else {
            *engine_owed = true;
            return true;
        };
        // Nothing is stamped before a datagram is taken from the engine: a poll that ran no
        // timers and received nothing stamps with the look's time (when it read one), and a
        // poll with nothing to send reads no clock.
        let mut stamp = match now {
            Some(t) if !(received > 0 || timers_ran) => t,
            _ if core.ep.may_transmit() => self.now(),
            _ => now.unwrap_or(Timestamp::ZERO),
        };
        loop {
            let more = self.drain(core, stamp, tx);
            self.send(tx);
            if !more {
                // Posts handed off while this thread held the engine go now, not at the next
                // poll.
                if self.posts.is_empty() {
                    break;
                }
                core.take_posts();
            }
            stamp = self.now();
        }
        // Nothing came: spare time for the refresh the next ACK or post would pay for. After
        // a datagram, the next look that finds nothing does it.
        *engine_owed = received > 0;
        if received == 0 {
            core.ep.tidy();
        }
        true
    }

    /// The blocking side of inline progress, after a `drive` found the queue `cq` empty:
    /// if nobody else drives, sleeps in the datapath for up to `left` (at most
    /// `INLINE_SLICE`, at most until the engine's next deadline), then places what arrived,
    /// runs due timers and sends; else sleeps on the queue's event for as long. Either way the
    /// caller looks at its queue again afterwards.
    pub(super) fn wait_inline(&self, cq: &CqShared, left: Duration) {
        let left = left.min(INLINE_SLICE);
        let looked = self.now();
        self.seen_poller(looked);
        let Some(mut drv) = try_lock(&self.driver) else {
            cq.ready.wait_until(|| !cq.is_empty(), Some(left));
            return;
        };
        let wait = {
            let mut core = self.lock();
            // About to sleep: the refresh the wake-up's ACK would pay for, done now.
            core.ep.tidy();
            match core.ep.poll_timeout() {
                Some(t) => t.saturating_since(looked).min(left),
                None => left,
            }
        };
        // Armed before the last look at the queue and at the hand-off ring: a completion
        // published or a post handed off from here on wakes the datapath.
        self.sleeper.arm();
        let posts_armed = self.posts.arm();
        let wish = self.slot_wanted.swap(0, Ordering::SeqCst);
        if wish != 0 && looked.nanos_since(Timestamp::from_nanos(wish)) < SLOT_WISH_NS {
            // A poller wants the slot (`drive`): it drives, and this thread waits for the
            // completions it publishes, as when the slot was taken to begin with.
            if posts_armed {
                self.posts.disarm();
            }
            self.sleeper.disarm();
            drop(drv);
            cq.ready.wait_until(|| !cq.is_empty(), Some(left));
            return;
        }
        let sleep = posts_armed && cq.is_empty();
        let Driver { rx, tx, .. } = &mut *drv;
        self.receive(rx, Some(if sleep { wait } else { Duration::ZERO }));
        if posts_armed {
            self.posts.disarm();
        }
        self.sleeper.disarm();
        let now = self.now();
        self.seen_poller(now);
        self.flush_after_timers(tx, Some(now));
    }

    /// The progress thread: until the device closes, it sleeps in the datapath until a
    /// datagram, a post or a timer needs it, places what arrived, runs due timers and sends
    /// what all that produced.
    ///
    /// On an inline-progress device it takes the driver slot for each round and stays out of
    /// the datapath while pollers are active.
    fn progress(self: Arc<Inner>) {
        // A thread-progress device's progress thread keeps its buffers; an inline one uses
        // the driver slot's.
        let mut own = (!self.inline()).then(|| Driver::new(self.datapath.max_payload()));
        let mut timers_checked = Timestamp::ZERO;
        let mut received_at = Timestamp::ZERO;
        let threaded = own.is_some();
        let mut parked_slice = INLINE_SLICE;
        while !self.stop.load(Ordering::Acquire) {
            // Last round's slot (if any) is back.
            self.progress_driving.store(false, Ordering::Release);
            let mut slot;
            let drv = match own.as_mut() {
                Some(d) => d,
                None => {
                    if self.pollers_active(self.now()) {
                        self.progress_parked.store(true, Ordering::Release);
                        // Parked, not asleep: closing the device unparks it (`Owner::drop`).
                        std::thread::park_timeout(parked_slice);
                        parked_slice = (parked_slice * 2).min(PARKED_SLICE_MAX);
                        continue;
                    }
                    parked_slice = INLINE_SLICE;
                    self.progress_parked.store(false, Ordering::Release);
                    slot = self.driver.lock().unwrap_or_else(|e| e.into_inner());
                    self.progress_driving.store(true, Ordering::Release);
                    &mut *slot
                }
            };
            let Driver { rx, tx, .. } = drv;
            let spinning = threaded && self.now().nanos_since(received_at) < SPIN_BEFORE_SLEEP_NS;
            let mut wait = if spinning {
                Duration::ZERO
            } else {
                self.next_wait()
            };
            let asleep = self.inline() && !wait.is_zero();
            if asleep {
                self.progress_asleep.store(true, Ordering::Release);
                // A poller that came since the look at the top of the loop found the slot
                // taken and this flag maybe still clear, and waits for the slot without
                // waking us (`drive`): then do not sleep. Each side writes its flag, fences,
                // then reads the other's, so at least one sees the other.
                fence(Ordering::SeqCst);
                if self.pollers_active(self.now()) {
                    wait = Duration::ZERO;
                }
            }
            let received = self.receive_batches(rx, tx, wait);
            if asleep {
                self.progress_asleep.store(false, Ordering::Release);
            }
            // A busy-polling (or, shortly after a receive, spinning) thread that received
            // nothing leaves the engine lock alone (posting threads send their own packets)
            // and checks timers only now and then.
            let now = self.now();
            if received > 0 {
                received_at = now;
            }
            if (self.busy_poll || spinning)
                && received == 0
                && self.posts.is_empty()
                && now.nanos_since(timers_checked) < BUSY_TIMER_CHECK_NS
            {
                if self.busy_poll {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            timers_checked = now;
            self.flush_after_timers(tx, Some(now));
        }
    }

    /// How long the progress thread may sleep: until the engine's next deadline, at most
    /// `TIMER_SLACK` (`IDLE_WAIT` while the device has no QP); not at all when busy polling.
    fn next_wait(&self) -> Duration {
        if self.busy_poll {
            return Duration::ZERO;
        }
        let mut core = self.lock();
        // About to sleep: the refresh the wake-up's ACK would pay for, done now.
        core.ep.tidy();
        let cap = if core.ep.qp_count() > 0 {
            TIMER_SLACK
        } else {
            IDLE_WAIT
        };
        match core.ep.poll_timeout() {
            Some(t) => t.saturating_since(self.now()).min(cap),
            None => cap,
        }
    }

    /// Waits up to `wait` for datagrams, then takes what is queued, up to
    /// `MAX_RX_BATCHES_BEFORE_TIMERS` batches, sending with `tx` between batches. Returns the
    /// number of datagrams received.
    fn receive_batches(&self, rx: &mut RecvBatch, tx: &mut TxBatch, wait: Duration) -> usize {
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
            let n = self.receive(rx, timeout);
            if round == 0 && armed {
                self.posts.disarm();
            }
            received += n;
            timeout = Some(Duration::ZERO);
            if n < rx.bufs.len() || round + 1 == MAX_RX_BATCHES_BEFORE_TIMERS {
                break;
            }
            self.flush(tx);
        }
        received
    }

    /// Runs the engine's and the handshake's timers, if due, with the engine lock held.
    fn timers_locked(&self, core: &mut Core, now: Timestamp) {
        if core.ep.poll_timeout().is_some_and(|t| t <= now) {
            core.ep.handle_timeout(now);
        }
        let Core { ep, hs, .. } = core;
        crate::handshake::on_timer(hs, ep, now, &*self.datapath);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{
        CompletionQueue, Device, DeviceConfig, MemoryRegion, Progress, ProtectionDomain, QueuePair,
    };
    use braid_proto::{SendOp, Sge, WcOpcode, WcStatus};
    use std::time::Instant;

    const WAIT: Duration = Duration::from_secs(20);

    struct End {
        dev: Device,
        pd: ProtectionDomain,
        cq: CompletionQueue,
        qp: QueuePair,
    }

    fn open(cfg: DeviceConfig) -> End {
        let dev = Device::open(cfg).expect("open a UDP device");
        let pd = dev.alloc_pd();
        let cq = dev.create_cq();
        let qp = pd.create_qp(&cq, &cq).expect("qp");
        End { dev, pd, cq, qp }
    }

    fn config(mode: Progress) -> DeviceConfig {
        // One shard: these tests hold shard 0's engine lock to force the hand-off.
        DeviceConfig::udp("127.0.0.1:0".parse().unwrap())
            .paths(4)
            .progress(mode)
            .shards(1)
    }

    fn connect(a: &End, b: &End) {
        a.qp.connect(b.qp.info()).unwrap();
        b.qp.connect(a.qp.info()).unwrap();
    }

    fn pair(mode: Progress) -> (End, End) {
        let (a, b) = (open(config(mode)), open(config(mode)));
        connect(&a, &b);
        (a, b)
    }

    /// Runs a test body once per progress mode.
    macro_rules! in_both_modes {
        ($($name:ident),* $(,)?) => {
            mod both_modes {
                $(
                    mod $name {
                        #[test]
                        fn thread() {
                            super::super::$name(super::super::Progress::Thread);
                        }
                        #[test]
                        fn inline() {
                            super::super::$name(super::super::Progress::Inline);
                        }
                    }
                )*
            }
        };
    }

    in_both_modes!(
        a_poll_for_nothing_takes_nothing_and_a_wait_out_of_time_still_looks,
        a_post_list_runs_in_order_up_to_its_first_refused_request,
        posts_queued_while_the_engine_is_busy_run_in_order,
        a_bad_post_is_refused_at_once_even_while_the_engine_is_busy,
        a_post_checked_before_a_deregistration_is_applied_before_it,
        threads_posting_at_once_each_get_every_completion,
    );

    fn a_poll_for_nothing_takes_nothing_and_a_wait_out_of_time_still_looks(mode: Progress) {
        let (a, b) = pair(mode);
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        a.qp.post_send(write(1, &src, &dst, 0)).unwrap();
        for _ in 0..20 {
            assert_eq!(a.cq.poll(&mut []), 0);
            std::thread::sleep(Duration::from_millis(1));
        }
        // The completion the empty polls did not take.
        let c = a.cq.wait(WAIT).expect("the WRITE completes");
        assert_eq!((c.wr_id, c.status), (1, WcStatus::Success));
        // A wait with no time left still returns a completion that is ready.
        a.qp.post_send(write(2, &src, &dst, 8)).unwrap();
        let deadline = Instant::now() + WAIT;
        let c = loop {
            if let Some(c) = a.cq.wait(Duration::ZERO) {
                break c;
            }
            assert!(Instant::now() < deadline, "no completion");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!((c.wr_id, c.status), (2, WcStatus::Success));
    }

    fn write(wr_id: u64, src: &MemoryRegion, dst: &MemoryRegion, off: u64) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Write(dst.remote(off)),
            sges: vec![src.sge(off, 8)],
            signaled: true,
        }
    }

    fn a_post_list_runs_in_order_up_to_its_first_refused_request(mode: Progress) {
        let (a, b) = pair(mode);
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        src.write(0, &[5; 64]).unwrap();
        assert_eq!(
            a.qp.post_send_list((0..4).map(|i| write(i, &src, &dst, i * 8))),
            Ok(())
        );
        for i in 0..4 {
            let c = a.cq.wait(WAIT).expect("a completion");
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        // The third is refused: the two before it are posted and complete, the rest is not.
        let mut bad = write(12, &src, &dst, 0);
        bad.sges[0].offset = 1 << 20; // outside the region
        let list = vec![
            write(10, &src, &dst, 32),
            write(11, &src, &dst, 40),
            bad,
            write(13, &src, &dst, 48),
        ];
        assert_eq!(a.qp.post_send_list(list), Err((2, PostError::OutOfBounds)));
        for i in 10..12 {
            let c = a.cq.wait(WAIT).expect("a completion");
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        assert!(
            a.cq.wait(Duration::from_millis(50)).is_none(),
            "nothing after the refusal"
        );
        let mut got = [0u8; 64];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got[..48], [5; 48]);
        assert_eq!(
            got[48..],
            [0; 16],
            "the request after the refused one never ran"
        );
    }

    fn posts_queued_while_the_engine_is_busy_run_in_order(mode: Progress) {
        let (a, b) = pair(mode);
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

    fn a_bad_post_is_refused_at_once_even_while_the_engine_is_busy(mode: Progress) {
        let (a, b) = pair(mode);
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

    fn a_post_checked_before_a_deregistration_is_applied_before_it(mode: Progress) {
        let (a, b) = pair(mode);
        if mode == Progress::Inline {
            // Nobody but the deregistration may take the engine after the busy block below
            // (with thread progress, the progress thread woken by the hand-off can win that
            // race, apply the post and send it before the region goes: then the WRITE
            // succeeds).
            hold_progress_back(&a.dev);
        }
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
        // error and nothing reaches the peer. With thread progress the progress thread may
        // have taken the engine first, applied the post and sent the WRITE before the region
        // went: then it succeeds, whole, or (revoked before its ACK came) fails with the data
        // already placed. Either way the post was neither lost nor refused.
        let c = a.cq.wait(WAIT).expect("a completion");
        let mut got = [0u8; 8];
        dst.read(0, &mut got).unwrap();
        match (mode, c.status) {
            (Progress::Inline, WcStatus::LocalProtectionError) => assert_eq!(got, [0; 8]),
            (Progress::Thread, WcStatus::LocalProtectionError) => {
                assert!(got == [0; 8] || got == [5; 8], "torn WRITE: {got:?}")
            }
            (Progress::Thread, WcStatus::Success) => assert_eq!(got, [5; 8]),
            (_, status) => panic!("WRITE 1 completed with {status:?} ({mode:?} progress)"),
        }
        assert_eq!(c.wr_id, 1);
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

    fn threads_posting_at_once_each_get_every_completion(mode: Progress) {
        // Four threads post WRITEs on one QP at once (contending for the engine, so some posts
        // take the hand-off ring): every work request completes exactly once on the CQ.
        const PER_THREAD: u64 = 200;
        let (a, b) = pair(mode);
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

    /// Holds the progress thread of an inline device back for good (it sees a poller that is
    /// always recent) and waits until it is out of the datapath.
    fn hold_progress_back(dev: &Device) {
        let inner = dev.inner();
        inner.poller_seen.store(u64::MAX / 2, Ordering::Relaxed);
        inner.datapath.wake();
        let deadline = Instant::now() + WAIT;
        while !inner.progress_parked.load(Ordering::Acquire) {
            assert!(
                Instant::now() < deadline,
                "the progress thread never backed off"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Parked, it does not take the driver slot again: this waits out a round that was
        // already under way.
        drop(inner.driver.lock().unwrap());
    }

    /// Waits until `cq` holds a completion without polling it (so without driving).
    fn wait_without_polling(cq: &CompletionQueue) -> bool {
        let shared = cq.shared().expect("a software CQ");
        shared.ready.wait_until(|| !shared.is_empty(), Some(WAIT))
    }

    #[test]
    fn an_inline_poller_gets_its_completion_while_the_progress_thread_is_held_back() {
        // A's progress thread stays out of the datapath, so the peer's ACK can only be
        // received by a thread polling A's queue; B is a plain thread-progress device.
        let a = open(config(Progress::Inline));
        let b = open(config(Progress::Thread));
        connect(&a, &b);
        hold_progress_back(&a.dev);
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        src.write(0, &[3; 64]).unwrap();
        let received = a.dev.stats().rx_datagrams;
        for i in 0..20u64 {
            a.qp.post_send(write(i, &src, &dst, (i % 8) * 8)).unwrap();
            let deadline = Instant::now() + WAIT;
            let c = loop {
                if let Some(c) = a.cq.poll_one() {
                    break c;
                }
                assert!(Instant::now() < deadline, "no completion for WRITE {i}");
                std::hint::spin_loop();
            };
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        assert!(a.dev.stats().rx_datagrams > received);
        assert!(a.dev.inner().progress_parked.load(Ordering::Acquire));
        let mut got = [0u8; 64];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, [3; 64]);
        // A blocking wait drives the same way (it sleeps in the datapath itself).
        a.qp.post_send(write(20, &src, &dst, 0)).unwrap();
        let c =
            a.cq.wait(WAIT)
                .expect("a completion through the blocking wait");
        assert_eq!((c.wr_id, c.status), (20, WcStatus::Success));
    }

    #[test]
    fn on_an_inline_device_nobody_polls_and_the_progress_thread_takes_over() {
        let mut cfg = config(Progress::Inline);
        cfg.engine.rto_initial_ns = 1_000_000;
        cfg.engine.retry_limit = 2;
        cfg.engine.retry_timeout_ns = 20_000_000;
        let a = open(cfg.clone());
        let b = open(cfg);
        connect(&a, &b);
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        // Someone polled a moment ago, then stopped.
        assert!(a.cq.poll_one().is_none());
        // Receives: the ACK is taken by the progress thread.
        a.qp.post_send(write(1, &src, &dst, 0)).unwrap();
        assert!(wait_without_polling(&a.cq), "the ACK was never received");
        let c = a.cq.shared().expect("a software CQ").pop(&mut [empty(); 1]);
        assert_eq!(c, 1);
        // Timers: with the peer gone, only retransmit timeouts can end the WRITE, with
        // RetryExceeded.
        let rkey = dst.remote(0);
        drop(b);
        let wr = SendWr {
            wr_id: 2,
            op: SendOp::Write(rkey),
            sges: vec![src.sge(0, 8)],
            signaled: true,
        };
        a.qp.post_send(wr).unwrap();
        assert!(
            wait_without_polling(&a.cq),
            "the retransmit timer never fired"
        );
        let mut out = [empty(); 1];
        assert_eq!(a.cq.shared().expect("a software CQ").pop(&mut out), 1);
        assert_eq!((out[0].wr_id, out[0].status), (2, WcStatus::RetryExceeded));
    }

    fn empty() -> braid_proto::Completion {
        braid_proto::Completion {
            wr_id: u64::MAX,
            status: WcStatus::Flushed,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qpn: 0,
        }
    }

    #[test]
    fn datapath_counters_count_what_crossed_the_sockets() {
        // 16 signaled 8-byte WRITEs from a to b: a's sockets sent at least those 16
        // datagrams and received at least one ACK; b's the other way round. Nothing else
        // talks to these loopback sockets.
        let (a, b) = pair(Progress::Thread);
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        for i in 0..16 {
            a.qp.post_send(write(i, &src, &dst, (i % 8) * 8)).unwrap();
            let c = a.cq.wait(WAIT).expect("a completion");
            assert_eq!(c.status, WcStatus::Success);
        }
        let get = |e: &End, name: &str| {
            let all = e.dev.datapath_counters();
            all.iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, v)| v)
                .unwrap_or_else(|| panic!("no counter {name} in {all:?}"))
        };
        assert!(get(&a, "datagrams_sent") >= 16);
        assert!(get(&a, "datagrams_received") >= 1);
        assert!(get(&b, "datagrams_received") >= 16);
        assert!(get(&b, "datagrams_sent") >= 1);
        assert!(get(&a, "messages_sent") <= get(&a, "datagrams_sent"));
        assert_eq!(a.dev.stats().tx_datagrams, get(&a, "datagrams_sent"));
    }

    #[test]
    fn many_inline_pollers_get_every_completion_once_in_posting_order() {
        // Four threads spin on one CQ of an inline device (so they contend for driving it)
        // while a fifth posts WRITEs: each completion reaches exactly one poller, and each
        // poller sees its share in posting order.
        const TOTAL: u64 = 2000;
        let (a, b) = pair(Progress::Inline);
        let src = a.pd.alloc_mr(64, Access::NONE).unwrap();
        let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
        let done = AtomicUsize::new(0);
        let got: Vec<Vec<u64>> = std::thread::scope(|s| {
            let pollers: Vec<_> = (0..4)
                .map(|_| {
                    let (cq, done) = (&a.cq, &done);
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        let mut out = [empty(); 8];
                        let deadline = Instant::now() + WAIT;
                        while done.load(Ordering::Acquire) < TOTAL as usize {
                            assert!(Instant::now() < deadline, "completions stopped");
                            let n = cq.poll(&mut out);
                            for c in &out[..n] {
                                assert_eq!(c.status, WcStatus::Success);
                                mine.push(c.wr_id);
                            }
                            done.fetch_add(n, Ordering::AcqRel);
                        }
                        mine
                    })
                })
                .collect();
            let deadline = Instant::now() + WAIT;
            for i in 0..TOTAL {
                loop {
                    match a.qp.post_send(write(i, &src, &dst, (i % 8) * 8)) {
                        Ok(()) => break,
                        Err(PostError::QueueFull) => {
                            assert!(Instant::now() < deadline, "the send queue never drained");
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("post {i}: {e:?}"),
                    }
                }
            }
            pollers.into_iter().map(|p| p.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = Vec::new();
        for mine in &got {
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "a poller saw completions out of posting order"
            );
            all.extend(mine);
        }
        all.sort_unstable();
        assert_eq!(all, (0..TOTAL).collect::<Vec<_>>());
        assert!(a.cq.poll_one().is_none());
    }
}
