//! The runtime: a device drives one [`Endpoint`] over a real datapath, with a progress thread
//! for receives and timers; application threads post work and poll completions.
//!
//! Concurrency is confined to three places: the engine behind one mutex (posting, progress),
//! one queue per completion queue (engine → application), and the datapath's `send`, which
//! any thread may call. A post runs the engine's transmit loop on the posting thread, so a
//! WRITE leaves without waiting for the progress thread (an inline doorbell).
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid_datapath::udp::{UdpConfig, UdpDatapath};
use braid_datapath::uring::UringDatapath;
use braid_datapath::xdp::{XdpConfig, XdpDatapath};
use braid_datapath::{Datapath, Ecn, RecvBatch};
use braid_proto::{
    Access, Completion, CqId, Endpoint, EndpointConfig, EndpointStats, MrKeys, PathStats, PdId,
    PostError, QpInfo, QpOptions, QpStats, RecvWr, Region, RemoteAddr, ResourceError, SendWr, Sge,
    Timestamp,
};

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

struct CqShared {
    queue: Mutex<VecDeque<Completion>>,
    ready: Condvar,
    /// Threads blocked in `wait`; changed only with `queue` locked.
    waiters: AtomicUsize,
    /// Completions in `queue`, readable without the lock so that a spinning poller does not
    /// contend with the progress thread; changed only with `queue` locked.
    queued: AtomicUsize,
}

impl CqShared {
    fn pop(&self, out: &mut [Completion]) -> usize {
        if self.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = out.len().min(q.len());
        for (slot, c) in out.iter_mut().zip(q.drain(..n)) {
            *slot = c;
        }
        self.queued.store(q.len(), Ordering::Release);
        n
    }
}

struct Core {
    ep: Endpoint,
    cqs: HashMap<CqId, Arc<CqShared>>,
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
    tx_pool: Mutex<Vec<TxBatch>>,
    /// Which datapath was chosen and why (for `auto`, what failed before it).
    report: String,
    busy_poll: bool,
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

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands completions to their queues and fills `batch` with up to `BATCH` datagrams.
    /// Returns whether the engine may have more to send.
    fn drain(core: &mut Core, now: Timestamp, batch: &mut TxBatch) -> bool {
        while let Some((cq, c)) = core.ep.poll_completion() {
            if let Some(q) = core.cqs.get(&cq) {
                let mut queue = q.queue.lock().unwrap_or_else(|e| e.into_inner());
                queue.push_back(c);
                q.queued.store(queue.len(), Ordering::Release);
                if q.waiters.load(Ordering::Relaxed) > 0 {
                    q.ready.notify_all();
                }
            }
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

    fn take_batch(&self) -> TxBatch {
        self.tx_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| TxBatch::new(self.datapath.max_payload()))
    }

    fn put_batch(&self, b: TxBatch) {
        self.tx_pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(b);
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
        let mut batch = self.take_batch();
        self.flush(&mut batch);
        self.put_batch(batch);
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
            // Drain what is queued (up to a bound) before running timers: a time-based loss
            // decision taken while acknowledgements still wait in the socket is wrong.
            // Transmissions produced meanwhile (ACKs, responses) are flushed between batches.
            let mut timeout = Some(wait);
            let mut received = 0;
            for round in 0..MAX_RX_BATCHES_BEFORE_TIMERS {
                let n = self.receive(&mut rx, timeout);
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
            }
            self.flush(&mut tx);
        }
    }
}

/// Binds the datapath `cfg` asks for; `auto` tries AF_XDP, then io_uring, then plain UDP
/// sockets. Returns it with a one-line report of the choice.
fn open_datapath(
    cfg: &DeviceConfig,
    paths: u16,
    max_datagram: usize,
) -> Result<(Box<dyn Datapath>, String), OpenError> {
    let udp_config = || {
        let mut u = UdpConfig::new(cfg.local, paths);
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
                let mut x = XdpConfig::new(local, paths);
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
        let (datapath, report) = open_datapath(&cfg, engine.paths, engine.max_datagram)?;
        engine.max_datagram = engine.max_datagram.min(datapath.max_payload());
        let ep = Endpoint::new(engine, datapath.local_addr());
        let inner = Arc::new(Inner {
            core: Mutex::new(Core {
                ep,
                cqs: HashMap::new(),
            }),
            datapath,
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            tx_order: Mutex::new(()),
            report,
            busy_poll: cfg.busy_poll,
            tx_pool: Mutex::new(Vec::new()),
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
        let shared = Arc::new(CqShared {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            waiters: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
        });
        let mut core = self.inner().lock();
        let id = core.ep.create_cq();
        core.cqs.insert(id, shared.clone());
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
    /// Allocates a zero-filled region of `len` bytes and registers it with `access`.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, ResourceError> {
        self.register(Region::new(len), access)
    }

    /// Registers `len` bytes of caller memory at `ptr` (for the C API).
    ///
    /// # Safety
    /// As [`Region::from_raw`]: the memory stays valid until the region is dropped and every
    /// work request using it has completed, and meanwhile it is only accessed through the
    /// region or atomically.
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
        let keys = self
            .dev
            .inner()
            .lock()
            .ep
            .register(self.pd, region.clone(), access)?;
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
        let info = self
            .dev
            .inner()
            .lock()
            .ep
            .create_qp(self.pd, send_cq.id, recv_cq.id)?;
        Ok(QueuePair {
            dev: self.dev.clone(),
            info,
        })
    }

    /// Creates a QP as [`create_qp`](Self::create_qp) does, but encrypted: every packet is
    /// sealed with AES-256-GCM under keys agreed at `connect` (see `braid_proto::seal`). Its
    /// X25519 private key is drawn from the OS; the peer QP must be encrypted too.
    pub fn create_encrypted_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair, ResourceError> {
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret).map_err(|_| ResourceError::Entropy)?;
        let opts = QpOptions::encrypted(secret);
        let info = self
            .dev
            .inner()
            .lock()
            .ep
            .create_qp_with(self.pd, send_cq.id, recv_cq.id, opts)?;
        Ok(QueuePair {
            dev: self.dev.clone(),
            info,
        })
    }
}

/// A registered memory region. Read and write it through its methods (see
/// [`braid_proto::mem`] for why there is no `&[u8]` access); peers use its [`rkey`](Self::rkey).
/// Dropping it deregisters it: peers lose access at once.
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
        let _ = self.dev.inner().lock().ep.deregister(self.keys.lkey);
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

    /// Waits up to `timeout` for one completion.
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(c) = q.pop_front() {
                self.shared.queued.store(q.len(), Ordering::Release);
                return Some(c);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.shared.waiters.fetch_add(1, Ordering::Relaxed);
            q = self
                .shared
                .ready
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            self.shared.waiters.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }
}

/// A reliable queue pair, connected to one peer QP.
pub struct QueuePair {
    dev: Device,
    info: QpInfo,
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
        self.dev.inner().lock().ep.connect(self.info.qpn, peer)
    }

    /// Posts a send work request; its packets leave from this thread.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        self.dev
            .inner()
            .with_engine(|ep| ep.post_send(self.info.qpn, wr))
    }

    /// Posts a receive work request.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.dev
            .inner()
            .with_engine(|ep| ep.post_recv(self.info.qpn, wr))
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
