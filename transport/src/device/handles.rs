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

use super::config::{DeviceConfig, OpenError, open_datapaths};
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
        let (datapaths, report) = open_datapaths(&cfg, ports, engine.max_datagram)?;
        for d in &datapaths {
            engine.max_datagram = engine.max_datagram.min(d.max_payload());
        }
        let owner = Owner::start(engine, datapaths, report, cfg.busy_poll, cfg.progress)?;
        Ok(Device {
            owner: Arc::new(owner),
        })
    }

    /// The core this device's handles share with its progress thread: shard 0's, which has
    /// the device's address and the handshake.
    pub(super) fn inner(&self) -> &Inner {
        self.owner.inner()
    }

    /// The shards and what spans them.
    pub(super) fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The number of engine shards (see [`DeviceConfig::shards`]); each QP lives on one.
    pub fn shards(&self) -> usize {
        self.owner.shard_count()
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

    /// Endpoint counters (summed over the shards).
    pub fn stats(&self) -> EndpointStats {
        self.owner.stats()
    }

    /// Per-path counters (summed over the shards).
    pub fn path_stats(&self) -> Vec<PathStats> {
        self.owner.path_stats()
    }

    /// RTT distribution over every QP of this device (percentiles, extremes, sample count;
    /// with several shards each percentile is the largest shard's).
    pub fn rtt_summary(&self) -> braid_proto::RttSummary {
        self.owner.rtt_summary()
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let pd = self.owner.alloc_pd();
        ProtectionDomain {
            dev: self.clone(),
            pd,
        }
    }

    /// Creates a completion queue.
    pub fn create_cq(&self) -> CompletionQueue {
        let (id, shared) = self.owner.create_cq();
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
        let keys = self.dev.owner().register(self.pd, &region, access)?;
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
        let owner = self.dev.owner();
        let shard = owner.pick_shard();
        let info = owner
            .shard(shard)
            .lock()
            .ep
            .create_qp_with(self.pd, send_cq.id, recv_cq.id, opts)?;
        owner.cq_used_by(&send_cq.shared, shard);
        owner.cq_used_by(&recv_cq.shared, shard);
        Ok(QueuePair {
            dev: self.dev.clone(),
            shard,
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
        self.dev.owner().deregister(self.keys.lkey);
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
        self.dev.owner().drive(&self.shared);
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
                self.dev.owner().wait_inline(&self.shared, left);
                continue;
            }
            // Sleeps on the CQ's event (arm, re-check, sleep); another waiter may take what
            // woke us, hence the loop.
            let shared = &self.shared;
            shared.ready.wait_until(|| !shared.is_empty(), Some(left));
        }
    }

    /// Waits up to `timeout` until the queue holds a completion, without taking it (for a
    /// thread that hands completions to a consumer running elsewhere in order). Returns
    /// whether one is there.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let shared = &self.shared;
        let owner = self.dev.owner();
        if !owner.inner().inline() {
            return shared
                .ready
                .wait_until(|| !shared.is_empty(), Some(timeout));
        }
        let deadline = Instant::now() + timeout;
        loop {
            if !shared.is_empty() {
                return true;
            }
            owner.drive(shared);
            if !shared.is_empty() {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            owner.wait_inline(shared, left);
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
    /// The engine shard it lives on.
    shard: usize,
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
        let _ = self.shard().lock().ep.destroy_qp(self.info.qpn);
    }
}

impl QueuePair {
    /// The engine shard this QP lives on.
    fn shard(&self) -> &Inner {
        self.dev.owner().shard(self.shard)
    }

    /// What the peer needs to connect to this QP (address, QP number, first PSN).
    pub fn info(&self) -> QpInfo {
        self.info
    }

    /// Connects to the peer QP described by `peer`.
    pub fn connect(&self, peer: QpInfo) -> Result<(), ResourceError> {
        self.shard().lock().ep.connect(self.info.qpn, peer)?;
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
        self.shard().post(Post::Send {
            qpn: self.info.qpn,
            wr,
            cq: self.send_cq,
            gate: self.gate.clone(),
        })
    }

    /// Posts a receive work request; refused or accepted as [`post_send`](Self::post_send)
    /// is (bad buffers, full queue).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.shard().post(Post::Recv {
            qpn: self.info.qpn,
            wr,
            cq: self.recv_cq,
            gate: self.gate.clone(),
        })
    }

    /// Moves the QP to the error state: outstanding work completes as flushed.
    pub fn set_error(&self) -> Result<(), ResourceError> {
        self.shard().with_engine(|ep| ep.set_error(self.info.qpn))
    }

    /// State and counters.
    pub fn stats(&self) -> Option<QpStats> {
        self.shard().lock().ep.qp_stats(self.info.qpn)
    }
}
