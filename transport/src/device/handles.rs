//! The public handles: [`Device`], [`ProtectionDomain`], [`MemoryRegion`],
//! [`CompletionQueue`] and [`QueuePair`]. Each holds its device and reaches the engine only
//! through the device's core (`runtime.rs`): posts through its hand-off, everything else
//! under the engine lock.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_datapath::Datapath;
use braid_proto::{
    Access, Completion, CqId, Endpoint, EndpointStats, MrKeys, PathStats, PdId, PostError, QpInfo,
    QpOptions, QpStats, RecvWr, Region, RemoteAddr, ResourceError, SendWr, Sge, Timestamp,
};

use super::config::{DeviceConfig, OpenError, open_datapath};
use super::runtime::{Core, CqShared, Inner, Owner, Post, QpGate};

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
        let mut engine = cfg.engine_config()?;
        // More source ports than paths: PLB re-paths a congested path onto a spare one.
        let ports = engine.source_ports();
        let (datapath, report) = open_datapath(&cfg, ports, engine.max_datagram)?;
        engine.max_datagram = engine.max_datagram.min(datapath.max_payload());
        let owner = Owner::start(engine, datapath, report, cfg.busy_poll, cfg.progress)?;
        Ok(Device {
            owner: Arc::new(owner),
        })
    }

    /// The core this device's handles share with its progress thread.
    pub(super) fn inner(&self) -> &Inner {
        self.owner.inner()
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

    /// Who drives the datapath and the engine (see [`Progress`](crate::Progress)).
    pub fn progress(&self) -> crate::Progress {
        self.inner().progress_mode()
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
        let (id, shared) = self.inner().create_cq();
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
        let keys = self.dev.inner().register(self.pd, &region, access)?;
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
            gate: Arc::new(QpGate::new(self.pd)),
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
        self.dev.inner().deregister(self.keys.lkey);
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
    pub(super) dev: Device,
    id: CqId,
    pub(super) shared: Arc<CqShared>,
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

    /// Takes up to `out.len()` completions without waiting; returns how many. On an
    /// inline-progress device ([`Progress::Inline`](crate::Progress::Inline)) a poll that
    /// finds the queue empty first drives the device (receives, places, sends) unless
    /// another thread is doing so, then looks again.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        let n = self.shared.pop(out);
        if n > 0 || !self.dev.inner().inline() {
            return n;
        }
        self.dev.inner().drive();
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
        (self.poll(&mut one) == 1).then_some(one[0])
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
            if self.dev.inner().inline() {
                // Sleeps in the datapath (or, if another thread drives, briefly on the CQ's
                // event), then drives again at the next `poll_one`.
                self.dev.inner().wait_inline(&self.shared, left);
                continue;
            }
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
        let inner = self.dev.inner();
        if !inner.inline() {
            return self
                .shared
                .ready
                .wait_until(|| !ring.is_empty(), Some(timeout));
        }
        let deadline = Instant::now() + timeout;
        loop {
            if !ring.is_empty() {
                return true;
            }
            inner.drive();
            if !ring.is_empty() {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            inner.wait_inline(&self.shared, left);
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
        self.gate.set_connected();
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
