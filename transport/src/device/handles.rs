//! The public handles: [`Device`], [`ProtectionDomain`], [`MemoryRegion`],
//! [`CompletionQueue`] and [`QueuePair`]. Each holds its device and reaches the engine only
//! through the device's core (`runtime.rs`): posts through its hand-off, everything else
//! under the engine lock. On a verbs device (`backend.rs`) each handle holds the matching
//! rdma-core object instead and every call goes to libibverbs.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_datapath::Datapath;
use braid_proto::{
    Access, Completion, CqId, EndpointStats, MrKeys, PathStats, PdId, PostError, QpInfo, QpOptions,
    QpStats, RecvWr, Region, RemoteAddr, ResourceError, SendWr, Sge, Timestamp,
};

use super::backend::{Chosen, choose};
#[cfg(feature = "verbs")]
use super::backend::{VerbsCq, VerbsDevice, VerbsPd, resource};
use super::config::{DeviceConfig, OpenError, open_datapaths};
use super::runtime::{Core, CqShared, Inner, Owner, Post, QpGate};

/// A completion to fill a poll buffer with before polling.
fn blank_completion() -> Completion {
    Completion {
        wr_id: 0,
        status: braid_proto::WcStatus::Flushed,
        opcode: braid_proto::WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qpn: 0,
    }
}

/// The page size verbs regions are aligned to (the kernel maps whole pages and requires a
/// region's address and its IOVA 0 to share the page offset). 64 KiB covers every Linux page
/// size but costs up to that much per region, so only non-x86 targets use it.
#[cfg(feature = "verbs")]
const PAGE: usize = if cfg!(target_arch = "x86_64") {
    4096
} else {
    65536
};

/// ACK coalescing ([`EndpointConfig::ack_every`](braid_proto::EndpointConfig::ack_every)) of a
/// device on AF_XDP when its configuration leaves it to the device (0). In copy mode a
/// receiver takes the frames about as fast as they come, a few per receive batch, so
/// acknowledging every batch costs both hosts nearly a frame per data frame; the figures are
/// in bench/results/ack-coalescing-2026-12-07-s35.md.
const XDP_ACK_EVERY: u16 = 8;

/// The ACK coalescing a device's engine runs with: `configured` unless it is 0 (left to the
/// device), then [`XDP_ACK_EVERY`] on AF_XDP (`kinds` are its datapaths' kinds), else 0 (read
/// by the engine as 1: every receive batch).
fn device_ack_every<'a>(configured: u16, mut kinds: impl Iterator<Item = &'a str>) -> u16 {
    if configured == 0 && kinds.any(|k| k == "xdp") {
        XDP_ACK_EVERY
    } else {
        configured
    }
}

/// An open device: an endpoint bound to a local address over a datapath, or an RDMA device
/// (see [`Backend`](crate::Backend)).
#[derive(Clone)]
pub struct Device {
    imp: DeviceImp,
    /// Which backend was chosen and why.
    backend: Arc<str>,
}

#[derive(Clone)]
enum DeviceImp {
    Software(Arc<Owner>),
    #[cfg(feature = "verbs")]
    Verbs(Arc<VerbsDevice>),
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
    /// Opens a device: binds the datapath and starts the progress thread, or, on the verbs
    /// backend, opens the RDMA device (see [`Backend`](crate::Backend)).
    // Without the `verbs` feature the match below has one arm; with it, two.
    #[cfg_attr(not(feature = "verbs"), allow(clippy::infallible_destructuring_match))]
    pub fn open(cfg: DeviceConfig) -> Result<Device, OpenError> {
        let backend =
            match choose(&cfg.backend, &cfg.engine, cfg.local).map_err(OpenError::Verbs)? {
                Chosen::Software(report) => report,
                #[cfg(feature = "verbs")]
                Chosen::Verbs(v) => {
                    let backend = v.report.as_str().into();
                    return Ok(Device {
                        imp: DeviceImp::Verbs(Arc::from(v)),
                        backend,
                    });
                }
            };
        let mut engine = cfg.engine_config()?;
        // More source ports than paths: PLB re-paths a congested path onto a spare one.
        let ports = engine.source_ports();
        let (datapaths, report) = open_datapaths(&cfg, ports, engine.max_datagram)?;
        for d in &datapaths {
            engine.max_datagram = engine.max_datagram.min(d.max_payload());
        }
        engine.ack_every = device_ack_every(engine.ack_every, datapaths.iter().map(|d| d.kind()));
        let owner = Owner::start(
            engine,
            datapaths,
            report,
            cfg.busy_poll,
            cfg.progress,
            cfg.send_in_place,
        )?;
        Ok(Device {
            imp: DeviceImp::Software(Arc::new(owner)),
            backend: backend.into(),
        })
    }

    /// The core this device's handles share with its progress thread: shard 0's, which has
    /// the device's address and the handshake.
    pub(super) fn inner(&self) -> &Inner {
        self.owner().inner()
    }

    /// The shards and what spans them.
    ///
    /// Only handles of a software device reach this: every handle of a verbs device holds
    /// its rdma-core object and returns before any call to `owner` or `inner` (the checks at
    /// the top of each method).
    // Without the `verbs` feature the match has one arm; with it, two.
    #[cfg_attr(not(feature = "verbs"), allow(clippy::infallible_destructuring_match))]
    pub(super) fn owner(&self) -> &Owner {
        match &self.imp {
            DeviceImp::Software(owner) => owner,
            #[cfg(feature = "verbs")]
            DeviceImp::Verbs(_) => unreachable!("a verbs device's handles never use the engine"),
        }
    }

    /// The number of engine shards (see [`DeviceConfig::shards`]); each QP lives on one. A
    /// verbs device has one (the NIC's).
    pub fn shards(&self) -> usize {
        if self.is_verbs() {
            return 1;
        }
        self.owner().shard_count()
    }

    /// The verbs device, if this is one.
    #[cfg(feature = "verbs")]
    fn verbs(&self) -> Option<&Arc<VerbsDevice>> {
        match &self.imp {
            DeviceImp::Verbs(v) => Some(v),
            DeviceImp::Software(_) => None,
        }
    }

    /// Whether this device runs on an RDMA NIC (the verbs backend).
    pub fn is_verbs(&self) -> bool {
        match &self.imp {
            DeviceImp::Software(_) => false,
            #[cfg(feature = "verbs")]
            DeviceImp::Verbs(_) => true,
        }
    }

    /// Which backend the device runs on and why: `software (as configured)`,
    /// `software (auto; verbs unavailable: ...)` or `verbs rxe0 (...)`.
    pub fn backend_report(&self) -> &str {
        &self.backend
    }

    /// The verbs device's capabilities (max MR size, SGEs, atomics, port MTU, RoCE
    /// version); `None` on the software backend.
    #[cfg(feature = "verbs")]
    pub fn verbs_caps(&self) -> Option<braid_verbs::Caps> {
        self.verbs().map(|v| v.caps().clone())
    }

    /// Runs `f` on the engine and the handshake runtime under the engine lock, then sends what
    /// the engine produced (for `crate::handshake`).
    /// On verbs, the handshake runs over the device's own UDP socket and creates the NIC's
    /// QPs (`backend.rs`).
    pub(crate) fn with_handshake<R>(
        &self,
        f: impl FnOnce(
            &mut dyn crate::handshake::QpHost,
            &mut Option<crate::handshake::Runtime>,
            Timestamp,
            &dyn Datapath,
        ) -> R,
    ) -> R {
        #[cfg(feature = "verbs")]
        if let Some(v) = self.verbs() {
            return v.handshake.with(|qps, rt, now, dp| f(qps, rt, now, dp));
        }
        let inner = self.inner();
        let r = {
            let mut core = inner.lock();
            let Core { ep, hs, .. } = &mut *core;
            f(ep, hs, inner.now(), &*inner.datapath)
        };
        inner.flush_pooled();
        r
    }

    /// Starts what drives the handshake once it is enabled: on verbs, the thread that
    /// receives its datagrams and runs its timers (a software device's progress thread does
    /// that already).
    pub(crate) fn handshake_enabled(&self) {
        #[cfg(feature = "verbs")]
        if let Some(v) = self.verbs() {
            v.start_handshake_driver();
        }
    }

    /// The address peers send to and connect to with the handshake
    /// ([`connect_to`](Self::connect_to)). On verbs that is the device's handshake UDP socket
    /// (bound to [`DeviceConfig::local`]); its QPs' [`QpInfo`] name the port GID instead.
    pub fn local_addr(&self) -> SocketAddr {
        #[cfg(feature = "verbs")]
        if let Some(v) = self.verbs() {
            return v.handshake.local_addr();
        }
        self.inner().datapath.local_addr()
    }

    /// The datapath in use (`"udp"`, `"uring"`, `"xdp"`, or `"verbs"`).
    pub fn datapath_kind(&self) -> &'static str {
        if self.is_verbs() {
            return "verbs";
        }
        self.inner().datapath.kind()
    }

    /// Who drives the datapath and the engine (see [`Progress`](crate::Progress)); on
    /// verbs the NIC does, reported as `Thread`.
    pub fn progress(&self) -> crate::Progress {
        if self.is_verbs() {
            return crate::Progress::Thread;
        }
        self.inner().progress_mode()
    }

    /// Which datapath was chosen and why: for `auto`, why the faster ones were not used
    /// (on verbs: the backend report).
    pub fn datapath_report(&self) -> &str {
        #[cfg(feature = "verbs")]
        if let Some(v) = self.verbs() {
            return &v.report;
        }
        &self.inner().report
    }

    /// Payload bytes per full packet (on verbs: the port's active MTU).
    pub fn chunk_size(&self) -> u32 {
        #[cfg(feature = "verbs")]
        if let Some(v) = self.verbs() {
            return v.caps().active_mtu;
        }
        self.inner().lock().ep.chunk_size()
    }

    /// Endpoint counters, summed over the shards (all zero on verbs: the NIC keeps its own).
    pub fn stats(&self) -> EndpointStats {
        if self.is_verbs() {
            return EndpointStats::default();
        }
        self.owner().stats()
    }

    /// What the datapath and the kernel under it counted since the device opened, by name,
    /// summed over the shards: for AF_XDP the frames the kernel dropped before they reached
    /// a receive ring (`kernel_rx_dropped`, `kernel_fill_ring_empty`), for UDP sockets and
    /// io_uring the messages against the datagrams they carried (segmentation offload).
    /// Empty on verbs.
    pub fn datapath_counters(&self) -> Vec<(&'static str, u64)> {
        if self.is_verbs() {
            return Vec::new();
        }
        self.owner().datapath_counters()
    }

    /// Per-path counters, summed over the shards (empty on verbs).
    pub fn path_stats(&self) -> Vec<PathStats> {
        if self.is_verbs() {
            return Vec::new();
        }
        self.owner().path_stats()
    }

    /// RTT distribution over every QP of this device (percentiles, extremes, sample count;
    /// with several shards each percentile is the largest shard's); empty on verbs.
    pub fn rtt_summary(&self) -> braid_proto::RttSummary {
        if self.is_verbs() {
            return braid_proto::RttSummary::default();
        }
        self.owner().rtt_summary()
    }

    /// Allocates a protection domain. On verbs a failed `ibv_alloc_pd` is reported by the
    /// first registration or QP creation in the domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        #[cfg(feature = "verbs")]
        if let Some(v) = self.verbs() {
            return ProtectionDomain {
                dev: self.clone(),
                pd: PdId(0),
                verbs: Some(braid_verbs::Pd::new(&v.ctx).map_err(|e| resource(&e))),
            };
        }
        let pd = self.owner().alloc_pd();
        ProtectionDomain {
            dev: self.clone(),
            pd,
            #[cfg(feature = "verbs")]
            verbs: None,
        }
    }

    /// Creates a completion queue. On verbs a failed `ibv_create_cq` is reported by the
    /// first QP creation on it.
    pub fn create_cq(&self) -> CompletionQueue {
        #[cfg(feature = "verbs")]
        if let Some(v) = self.verbs() {
            return CompletionQueue {
                dev: self.clone(),
                imp: CqImp::Verbs(braid_verbs::Cq::new(&v.ctx).map_err(|e| resource(&e))),
            };
        }
        let (id, shared) = self.owner().create_cq();
        CompletionQueue {
            dev: self.clone(),
            imp: CqImp::Software { id, shared },
        }
    }
}

/// A protection domain: regions and QPs in one domain may be used together.
#[derive(Clone)]
pub struct ProtectionDomain {
    dev: Device,
    pd: PdId,
    #[cfg(feature = "verbs")]
    verbs: Option<VerbsPd>,
}

impl ProtectionDomain {
    /// The verbs PD (or why it could not be allocated); `None` on the software backend.
    #[cfg(feature = "verbs")]
    pub(super) fn verbs_pd(&self) -> Option<&VerbsPd> {
        self.verbs.as_ref()
    }
}

impl CompletionQueue {
    /// The verbs CQ (or why it could not be created); `None` on the software backend.
    #[cfg(feature = "verbs")]
    pub(super) fn verbs_cq(&self) -> Option<&VerbsCq> {
        match &self.imp {
            CqImp::Verbs(cq) => Some(cq),
            CqImp::Software { .. } => None,
        }
    }
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

    /// Allocates a zero-filled region of `len` bytes and registers it with `access` (on
    /// verbs, page-aligned: the NIC registers whole pages).
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, ResourceError> {
        #[cfg(feature = "verbs")]
        if self.verbs.is_some() {
            return self.register(Region::new_aligned(len, PAGE), access);
        }
        self.register(Region::new(len), access)
    }

    /// Registers `len` bytes of caller memory at `ptr` (for the C API). On verbs `ptr` must
    /// be page-aligned (else [`ResourceError::Unsupported`]).
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
        #[cfg(feature = "verbs")]
        if self.verbs.is_some() && !(ptr as usize).is_multiple_of(PAGE) {
            // The NIC would place offset 0 of the region at the page offset of `ptr`, which
            // peers cannot know from an rkey and an offset.
            return Err(ResourceError::Unsupported);
        }
        // SAFETY: forwarded to the caller's contract above.
        let region = unsafe { Region::from_raw(ptr, len) };
        self.register(region, access)
    }

    fn register(&self, region: Arc<Region>, access: Access) -> Result<MemoryRegion, ResourceError> {
        #[cfg(feature = "verbs")]
        if let Some(pd) = &self.verbs {
            let pd = pd.as_ref().map_err(|e| *e)?;
            // SAFETY: the region's bytes live as long as `region`, which the returned
            // MemoryRegion holds and drops only after the Mr (field order), so the NIC stops
            // using them first; the region only accesses them atomically.
            let mr =
                unsafe { braid_verbs::Mr::register(pd, region.as_ptr(), region.len(), access) }
                    .map_err(|e| resource(&e))?;
            return Ok(MemoryRegion {
                dev: self.dev.clone(),
                keys: MrKeys {
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                },
                verbs: Some(mr),
                region,
                access,
            });
        }
        let keys = self.dev.owner().register(self.pd, &region, access)?;
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            #[cfg(feature = "verbs")]
            verbs: None,
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
    /// X25519 private key is drawn from the OS; the peer QP must be encrypted too. Refused
    /// with [`ResourceError::Unsupported`] on verbs.
    pub fn create_encrypted_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair, ResourceError> {
        if self.dev.is_verbs() {
            return Err(ResourceError::Unsupported);
        }
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
        #[cfg(feature = "verbs")]
        if let Some(pd) = &self.verbs {
            let pd = pd.as_ref().map_err(|e| *e)?;
            let (CqImp::Verbs(scq), CqImp::Verbs(rcq)) = (&send_cq.imp, &recv_cq.imp) else {
                return Err(ResourceError::UnknownCq);
            };
            let scq = scq.as_ref().map_err(|e| *e)?;
            let rcq = rcq.as_ref().map_err(|e| *e)?;
            let verbs_dev = self.dev.verbs().ok_or(ResourceError::UnknownPd)?;
            if !Arc::ptr_eq(pd.context(), &verbs_dev.ctx) {
                return Err(ResourceError::UnknownPd);
            }
            let qp =
                braid_verbs::Qp::new(pd, scq, rcq, verbs_dev.timing).map_err(|e| resource(&e))?;
            return Ok(QueuePair {
                dev: self.dev.clone(),
                shard: 0,
                gate: Arc::new(QpGate::new(self.pd)),
                info: qp.info(),
                send_cq: CqId(0),
                recv_cq: CqId(0),
                verbs: Some(Arc::new(qp)),
            });
        }
        // A verbs CQ has no engine id: using one with a software QP is an unknown CQ.
        if send_cq.shared().is_none() || recv_cq.shared().is_none() {
            return Err(ResourceError::UnknownCq);
        }
        let (send_id, recv_id) = (send_cq.id(), recv_cq.id());
        let owner = self.dev.owner();
        let shard = owner.pick_shard();
        let info = owner
            .shard(shard)
            .lock()
            .ep
            .create_qp_with(self.pd, send_id, recv_id, opts)?;
        for cq in [send_cq, recv_cq] {
            if let Some(shared) = cq.shared() {
                owner.cq_used_by(shared, shard);
            }
        }
        Ok(QueuePair {
            dev: self.dev.clone(),
            shard,
            gate: Arc::new(QpGate::new(self.pd)),
            info,
            send_cq: send_id,
            recv_cq: recv_id,
            #[cfg(feature = "verbs")]
            verbs: None,
        })
    }
}

/// A registered memory region. Read and write it through its methods (see
/// [`braid_proto::mem`] for why there is no `&[u8]` access); peers use its [`rkey`](Self::rkey).
/// Dropping it deregisters it: peers lose access at once, and when `drop` returns the engine
/// no longer touches its memory (see [`braid_proto::Endpoint::deregister`]).
pub struct MemoryRegion {
    dev: Device,
    /// The NIC's registration; declared before `region` so it is dropped (deregistered)
    /// before the bytes can be freed.
    #[cfg(feature = "verbs")]
    #[allow(dead_code)] // Held for its Drop.
    verbs: Option<braid_verbs::Mr>,
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
        if self.dev.is_verbs() {
            return; // The Mr deregisters itself.
        }
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
    /// The shared bytes (read, write, atomics). On verbs the same bytes are registered with
    /// the NIC, which writes them directly.
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
    imp: CqImp,
}

#[derive(Clone)]
enum CqImp {
    Software {
        id: CqId,
        shared: Arc<CqShared>,
    },
    #[cfg(feature = "verbs")]
    Verbs(VerbsCq),
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("id", &self.id().0)
            .finish()
    }
}

impl CompletionQueue {
    /// The engine's CQ id (0 on verbs, where the handshake's idle engine has none).
    pub(crate) fn id(&self) -> CqId {
        match &self.imp {
            CqImp::Software { id, .. } => *id,
            #[cfg(feature = "verbs")]
            CqImp::Verbs(_) => CqId(0),
        }
    }

    /// The completion ring of a software CQ; `None` on verbs.
    pub(super) fn shared(&self) -> Option<&Arc<CqShared>> {
        match &self.imp {
            CqImp::Software { shared, .. } => Some(shared),
            #[cfg(feature = "verbs")]
            CqImp::Verbs(_) => None,
        }
    }

    /// Takes up to `out.len()` completions without waiting; returns how many. On an
    /// inline-progress device ([`Progress::Inline`](crate::Progress::Inline)) a poll that
    /// finds the queue empty first drives the device (receives, places, sends) unless
    /// another thread is doing so, then looks again. A poll for no completions (`out`
    /// empty) returns 0 at once, as `ibv_poll_cq` with no entries does.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        if out.is_empty() {
            return 0;
        }
        let shared = match &self.imp {
            CqImp::Software { shared, .. } => shared,
            #[cfg(feature = "verbs")]
            CqImp::Verbs(cq) => return cq.as_ref().map_or(0, |cq| cq.poll(out)),
        };
        let n = shared.pop(out);
        if n > 0 || !self.dev.inner().inline() {
            return n;
        }
        self.dev.owner().drive(shared);
        shared.pop(out)
    }

    /// Takes one completion without waiting.
    pub fn poll_one(&self) -> Option<Completion> {
        let mut one = [blank_completion()];
        (self.poll(&mut one) == 1).then_some(one[0])
    }

    /// Waits up to `timeout` for one completion. Several threads may wait on one CQ; each
    /// completion goes to one of them. On verbs it sleeps on the CQ's completion channel.
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let Some(shared) = self.shared() else {
            return self.wait_verbs(deadline);
        };
        let mut one = [blank_completion()];
        loop {
            // Without driving: on an inline-progress device the sleep below takes what the
            // datapath holds first (a `poll` here would look at it once more, a receive
            // call for nothing before each sleep).
            if shared.pop(&mut one) == 1 {
                return Some(one[0]);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                // Out of time: one last look, which on an inline device drives.
                return self.poll_one();
            };
            if self.dev.inner().inline() {
                // Receives what is ready, else sleeps in the datapath (or, if another thread
                // drives, briefly on the CQ's event), places it and sends.
                self.dev.owner().wait_inline(shared, left);
                continue;
            }
            // Sleeps on the CQ's event (arm, re-check, sleep); another waiter may take what
            // woke us, hence the loop.
            shared.ready.wait_until(|| !shared.is_empty(), Some(left));
        }
    }

    /// `wait` on a verbs CQ: sleeps on the CQ's completion channel (`braid_verbs::Cq::wait`).
    fn wait_verbs(&self, deadline: Instant) -> Option<Completion> {
        #[cfg(feature = "verbs")]
        if let CqImp::Verbs(cq) = &self.imp {
            let cq = cq.as_ref().ok()?;
            let mut one = [blank_completion()];
            let left = deadline.saturating_duration_since(Instant::now());
            return (cq.wait(&mut one, left) == 1).then(|| one[0]);
        }
        loop {
            if let Some(c) = self.poll_one() {
                return Some(c);
            }
            deadline.checked_duration_since(Instant::now())?;
            std::thread::yield_now();
        }
    }

    /// Waits up to `timeout` until the queue holds a completion, without taking it (for a
    /// thread that hands completions to a consumer running elsewhere in order). Returns
    /// whether one is there.
    ///
    /// Not available on verbs (a completion cannot be looked at there without taking it):
    /// returns `false` at once.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let Some(shared) = self.shared() else {
            return false;
        };
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
    /// The engine shard it lives on (0 on verbs, which has none).
    shard: usize,
    /// What its posts are checked against before they reach the engine.
    gate: Arc<QpGate>,
    info: QpInfo,
    send_cq: CqId,
    recv_cq: CqId,
    #[cfg(feature = "verbs")]
    verbs: Option<Arc<braid_verbs::Qp>>,
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
        if self.dev.is_verbs() {
            return; // The Qp destroys itself.
        }
        let _ = self.shard().lock().ep.destroy_qp(self.info.qpn);
    }
}

impl QueuePair {
    /// The engine shard this QP lives on.
    fn shard(&self) -> &Inner {
        self.dev.owner().shard(self.shard)
    }

    /// What the peer needs to connect to this QP (address, QP number, first PSN; on verbs
    /// the address is the port GID on port 4791, see `braid_verbs::qp_info`).
    pub fn info(&self) -> QpInfo {
        self.info
    }

    /// Connects to the peer QP described by `peer` (on verbs: INIT to RTR to RTS; a software
    /// QP's info is refused with [`ResourceError::Unsupported`]).
    pub fn connect(&self, peer: QpInfo) -> Result<(), ResourceError> {
        #[cfg(feature = "verbs")]
        if let Some(qp) = &self.verbs {
            let p = braid_verbs::peer_of(&peer).ok_or(ResourceError::Unsupported)?;
            qp.connect(&p).map_err(|e| resource(&e))?;
            self.gate.set_connected();
            return Ok(());
        }
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
    ///
    /// On verbs the request goes to the NIC at once; local keys, bounds and rights are
    /// checked by the NIC and come back as `LocalProtectionError` completions.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        #[cfg(feature = "verbs")]
        if let Some(qp) = &self.verbs {
            return qp.post_send(&wr);
        }
        self.shard().post(Post::Send {
            qpn: self.info.qpn,
            wr,
            cq: self.send_cq,
            gate: self.gate.clone(),
        })
    }

    /// Posts the send work requests of `wrs` in order, each refused or accepted as by
    /// [`post_send`](Self::post_send), and sends what they produced once, after the last:
    /// the list form of `ibv_post_send` (one doorbell for the chain). Posting a window of
    /// small messages this way costs one send call for all of them instead of one each when
    /// the posting thread drives the device. Stops at the first refused request and returns
    /// its index in `wrs` with the reason; the requests before it stay posted, the ones after
    /// it are not.
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, PostError)> {
        #[cfg(feature = "verbs")]
        if let Some(qp) = &self.verbs {
            for (i, wr) in wrs.into_iter().enumerate() {
                qp.post_send(&wr).map_err(|e| (i, e))?;
            }
            return Ok(());
        }
        self.shard().post_list(wrs.into_iter().map(|wr| Post::Send {
            qpn: self.info.qpn,
            wr,
            cq: self.send_cq,
            gate: self.gate.clone(),
        }))
    }

    /// Posts a receive work request; refused or accepted as [`post_send`](Self::post_send)
    /// is (bad buffers, full queue).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        #[cfg(feature = "verbs")]
        if let Some(qp) = &self.verbs {
            return qp.post_recv(&wr);
        }
        self.shard().post(Post::Recv {
            qpn: self.info.qpn,
            wr,
            cq: self.recv_cq,
            gate: self.gate.clone(),
        })
    }

    /// Moves the QP to the error state: outstanding work completes as flushed.
    pub fn set_error(&self) -> Result<(), ResourceError> {
        #[cfg(feature = "verbs")]
        if let Some(qp) = &self.verbs {
            return qp.set_error().map_err(|e| resource(&e));
        }
        self.shard().with_engine(|ep| ep.set_error(self.info.qpn))
    }

    /// State and counters (`None` on verbs).
    pub fn stats(&self) -> Option<QpStats> {
        if self.dev.is_verbs() {
            return None;
        }
        self.shard().lock().ep.qp_stats(self.info.qpn)
    }
}

#[cfg(test)]
mod tests {
    use super::{XDP_ACK_EVERY, device_ack_every};

    #[test]
    fn a_device_coalesces_acks_on_af_xdp_only_when_left_to_it() {
        assert_eq!(device_ack_every(0, ["xdp"].into_iter()), XDP_ACK_EVERY);
        assert_eq!(
            device_ack_every(0, ["udp", "xdp"].into_iter()),
            XDP_ACK_EVERY
        );
        for kind in ["udp", "uring", "sim"] {
            assert_eq!(device_ack_every(0, [kind].into_iter()), 0, "{kind}");
        }
        // Configured: kept, whatever the datapath.
        assert_eq!(device_ack_every(1, ["xdp"].into_iter()), 1);
        assert_eq!(device_ack_every(3, ["udp"].into_iter()), 3);
    }
}
