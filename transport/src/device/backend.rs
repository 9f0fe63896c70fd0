//! Which transport a device runs on: Braid's own software transport (the engine over a
//! datapath) or an RDMA NIC's RC queue pairs through rdma-core ([`Backend`]), and, with the
//! `verbs` feature, the verbs side of the public handles.
//!
//! The handles ([`Device`](crate::Device) and the rest) dispatch inside: a device opened on
//! verbs holds a [`VerbsDevice`], its protection domains, regions, queues and QPs hold the
//! matching `braid_verbs` objects, and every call goes straight to libibverbs (no engine, no
//! progress thread: the NIC is the progress engine). What only the software transport has
//! (encrypted QPs, path statistics, a CQ's file descriptor) is refused or empty on verbs, as
//! each method's doc says. The connection handshake runs on verbs too: over a UDP socket of
//! the device's own, creating and connecting the NIC's QPs (`HandshakeHost`).
use std::fmt;
use std::net::SocketAddr;

/// The transport a device runs on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Braid's software transport over the configured datapath (UDP, io_uring, AF_XDP).
    #[default]
    Software,
    /// RC queue pairs on an RDMA device through rdma-core (build with the `verbs` feature):
    /// the named device (`mlx5_0`, `rxe0`), or the first whose port is active.
    Verbs(Option<String>),
    /// Verbs when a device exists and its port is active, else the software transport; the
    /// device says which and why ([`Device::backend_report`](crate::Device::backend_report)).
    Auto,
}

impl Backend {
    /// The name used on command lines and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Software => "software",
            Backend::Verbs(_) => "verbs",
            Backend::Auto => "auto",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Verbs(Some(dev)) => write!(f, "verbs:{dev}"),
            other => f.write_str(other.name()),
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    /// `software`, `verbs`, `verbs:DEVICE` or `auto`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "software" | "sw" => Ok(Backend::Software),
            "verbs" | "rdma" => Ok(Backend::Verbs(None)),
            "auto" => Ok(Backend::Auto),
            other => match other.strip_prefix("verbs:") {
                Some(dev) if !dev.is_empty() => Ok(Backend::Verbs(Some(dev.to_owned()))),
                _ => Err(format!(
                    "unknown backend {other:?} (one of: software, verbs, verbs:DEVICE, auto)"
                )),
            },
        }
    }
}

/// Why the verbs backend could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerbsUnavailable {
    /// This build of Braid has no verbs backend (the `verbs` cargo feature is off).
    NotBuilt,
    /// libibverbs (rdma-core) could not be loaded.
    NoLibrary(String),
    /// The kernel has no RDMA device (ENOSYS or ENODEV from rdma-core, or none listed).
    NoDevice(String),
    /// No device of the requested name.
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// The devices there are.
        available: Vec<String>,
    },
    /// The device's port is not ACTIVE.
    PortNotActive {
        /// The device.
        device: String,
    },
    /// Opening or querying the device failed.
    Failed(String),
}

impl fmt::Display for VerbsUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsUnavailable::NotBuilt => f.write_str("built without the verbs feature"),
            VerbsUnavailable::NoLibrary(why) => write!(f, "rdma-core not usable: {why}"),
            VerbsUnavailable::NoDevice(why) => write!(f, "no RDMA device ({why})"),
            VerbsUnavailable::UnknownDevice { name, available } => {
                write!(
                    f,
                    "no RDMA device {name:?} (found: {})",
                    available.join(", ")
                )
            }
            VerbsUnavailable::PortNotActive { device } => {
                write!(f, "RDMA device {device}: port not active")
            }
            VerbsUnavailable::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for VerbsUnavailable {}

/// What `Device::open` runs on, and the one-line report of why.
pub(super) enum Chosen {
    Software(String),
    #[cfg(feature = "verbs")]
    Verbs(Box<VerbsDevice>),
}

/// Picks the backend `backend` asks for.
///
/// On verbs, QPs take their RNR retry count and delay from `engine` (as the software engine
/// does, so both report `RnrRetryExceeded` the same way), and the device's connection
/// handshake gets a UDP socket bound to `local`.
pub(super) fn choose(
    backend: &Backend,
    engine: &braid_proto::EndpointConfig,
    local: SocketAddr,
) -> Result<Chosen, VerbsUnavailable> {
    match backend {
        Backend::Software => Ok(Chosen::Software("software (as configured)".into())),
        Backend::Verbs(name) => open_verbs(name.as_deref(), "as configured", engine, local),
        Backend::Auto => match open_verbs(None, "auto: first choice", engine, local) {
            Ok(c) => Ok(c),
            Err(why) => {
                let report = format!("software (auto; verbs unavailable: {why})");
                log::info!("braid device: backend {report}");
                Ok(Chosen::Software(report))
            }
        },
    }
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(
    _name: Option<&str>,
    _why: &str,
    _engine: &braid_proto::EndpointConfig,
    _local: SocketAddr,
) -> Result<Chosen, VerbsUnavailable> {
    Err(VerbsUnavailable::NotBuilt)
}

#[cfg(feature = "verbs")]
fn open_verbs(
    name: Option<&str>,
    why: &str,
    engine: &braid_proto::EndpointConfig,
    local: SocketAddr,
) -> Result<Chosen, VerbsUnavailable> {
    use braid_verbs::VerbsError;
    let ctx = braid_verbs::Context::open(name).map_err(|e| match e {
        VerbsError::NoLibrary(s) => VerbsUnavailable::NoLibrary(s),
        VerbsError::NoDevice(s) => VerbsUnavailable::NoDevice(s),
        VerbsError::UnknownDevice { name, available } => {
            VerbsUnavailable::UnknownDevice { name, available }
        }
        VerbsError::PortNotActive { device, .. } => VerbsUnavailable::PortNotActive { device },
        other => VerbsUnavailable::Failed(other.to_string()),
    })?;
    let timing = braid_verbs::QpTiming::like_software(engine.rnr_retry_limit, engine.rnr_timer_ns);
    let handshake = HandshakeHost::bind(local, &ctx, timing)
        .map_err(|e| VerbsUnavailable::Failed(format!("handshake socket on {local}: {e}")))?;
    let c = ctx.caps();
    let report = format!(
        "verbs {} ({why}; mtu {}, roce {:?}, gid index {}; handshake on udp {})",
        c.device,
        c.active_mtu,
        c.roce,
        c.gid_index,
        handshake.local_addr()
    );
    log::info!("braid device: backend {report}");
    Ok(Chosen::Verbs(Box::new(VerbsDevice {
        ctx,
        report,
        timing,
        handshake: std::sync::Arc::new(handshake),
        driver: std::sync::Mutex::new(None),
    })))
}

#[cfg(feature = "verbs")]
pub(super) use verbs_impl::*;

#[cfg(feature = "verbs")]
mod verbs_impl {
    use std::collections::HashMap;
    use std::io;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use braid_datapath::udp::{UdpConfig, UdpDatapath};
    use braid_datapath::{Datapath, RecvBatch};
    use braid_proto::{
        CqId, PdId, PostError, QpInfo, RecvWr, ResourceError, SendWr, Timestamp, WcStatus,
    };

    use crate::handshake::{self, QpHost, Runtime};
    use crate::{CompletionQueue, ProtectionDomain};

    pub(in crate::device) use braid_verbs::{Caps, Cq, Pd};

    /// An open verbs device: the rdma-core context, and the connection handshake's socket and
    /// state (the handshake speaks over UDP next to the NIC and creates the NIC's QPs).
    pub(in crate::device) struct VerbsDevice {
        pub(in crate::device) ctx: Arc<braid_verbs::Context>,
        pub(in crate::device) report: String,
        /// RNR and retry settings of every QP.
        pub(in crate::device) timing: braid_verbs::QpTiming,
        pub(in crate::device) handshake: Arc<HandshakeHost>,
        /// The thread that receives handshake datagrams and runs its timers, once enabled.
        pub(super) driver: Mutex<Option<JoinHandle<()>>>,
    }

    impl VerbsDevice {
        pub(in crate::device) fn caps(&self) -> &Caps {
            self.ctx.caps()
        }

        /// Starts the handshake's thread (once).
        pub(in crate::device) fn start_handshake_driver(&self) {
            let mut d = self.driver.lock().unwrap_or_else(|e| e.into_inner());
            if d.is_some() {
                return;
            }
            let host = self.handshake.clone();
            let spawned = std::thread::Builder::new()
                .name("braid-verbs-hs".into())
                .spawn(move || host.drive());
            match spawned {
                Ok(h) => *d = Some(h),
                // Without its thread the handshake answers nothing and its attempts time out
                // when the application next calls in; say why.
                Err(e) => log::error!("braid verbs backend: no handshake thread: {e}"),
            }
        }
    }

    impl Drop for VerbsDevice {
        fn drop(&mut self) {
            self.handshake.stop.store(true, Ordering::Release);
            self.handshake.dp.wake();
            let d = self.driver.get_mut().unwrap_or_else(|e| e.into_inner());
            if let Some(h) = d.take() {
                let _ = h.join();
            }
        }
    }

    /// Longest sleep of the handshake thread between looks at its stop flag.
    const IDLE_WAIT: Duration = Duration::from_millis(200);
    /// Datagrams taken per receive.
    const RECV_BATCH: usize = 16;

    /// The handshake of a verbs device: its UDP socket, the state machine and the QPs it made.
    pub(in crate::device) struct HandshakeHost {
        dp: UdpDatapath,
        state: Mutex<(VerbsQps, Option<Runtime>)>,
        epoch: Instant,
        stop: AtomicBool,
    }

    impl HandshakeHost {
        pub(super) fn bind(
            local: SocketAddr,
            ctx: &Arc<braid_verbs::Context>,
            timing: braid_verbs::QpTiming,
        ) -> io::Result<HandshakeHost> {
            let mut cfg = UdpConfig::new(local, 1);
            cfg.gso = false;
            cfg.gro = false;
            Ok(HandshakeHost {
                dp: UdpDatapath::bind(cfg)?,
                state: Mutex::new((
                    VerbsQps {
                        ctx: ctx.clone(),
                        timing,
                        res: None,
                        qps: HashMap::new(),
                    },
                    None,
                )),
                epoch: Instant::now(),
                stop: AtomicBool::new(false),
            })
        }

        pub(in crate::device) fn local_addr(&self) -> SocketAddr {
            self.dp.local_addr()
        }

        fn now(&self) -> Timestamp {
            Timestamp::from_nanos(
                u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX),
            )
        }

        /// Runs `f` on the QPs and the handshake runtime under their lock; wakes the thread if
        /// `f` set an earlier timer than the one it sleeps towards.
        pub(in crate::device) fn with<R>(
            &self,
            f: impl FnOnce(&mut dyn QpHost, &mut Option<Runtime>, Timestamp, &dyn Datapath) -> R,
        ) -> R {
            let now = self.now();
            let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let (qps, rt) = &mut *g;
            let before = handshake::next_timeout(rt);
            let r = f(qps, rt, now, &self.dp);
            let after = handshake::next_timeout(rt);
            drop(g);
            if after.is_some_and(|a| before.is_none_or(|b| a < b)) {
                self.dp.wake();
            }
            r
        }

        /// The handshake thread: receives datagrams, hands them to the handshake, runs its
        /// timers, until the device is dropped.
        fn drive(&self) {
            let mut batch = RecvBatch::new(RECV_BATCH, handshake::MAX_DATAGRAM.max(2048));
            while !self.stop.load(Ordering::Acquire) {
                let wait = {
                    let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    handshake::next_timeout(&g.1)
                        .map_or(IDLE_WAIT, |t| t.saturating_since(self.now()))
                        .min(IDLE_WAIT)
                };
                let n = match self.dp.recv(&mut batch, Some(wait)) {
                    Ok(n) => n,
                    Err(e) => {
                        log::warn!("braid verbs backend: handshake receive: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                        0
                    }
                };
                let now = self.now();
                let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let (qps, rt) = &mut *g;
                for (meta, bytes) in batch.iter().take(n) {
                    if handshake::is_handshake(bytes) {
                        handshake::on_datagram(rt, qps, now, meta.src, bytes, &self.dp);
                    }
                }
                handshake::on_timer(rt, qps, now, &self.dp);
            }
        }
    }

    /// The NIC QPs the handshake created, by QP number, and the protection domain and queues
    /// it creates them with.
    pub(in crate::device) struct VerbsQps {
        ctx: Arc<braid_verbs::Context>,
        timing: braid_verbs::QpTiming,
        res: Option<(Arc<Pd>, Arc<Cq>, Arc<Cq>)>,
        qps: HashMap<u32, Arc<braid_verbs::Qp>>,
    }

    impl VerbsQps {
        fn qp(&self, qpn: u32) -> Option<&Arc<braid_verbs::Qp>> {
            self.qps.get(&qpn)
        }
    }

    impl QpHost for VerbsQps {
        fn is_roce(&self) -> bool {
            true
        }

        fn adopt(
            &mut self,
            pd: &ProtectionDomain,
            send_cq: &CompletionQueue,
            recv_cq: &CompletionQueue,
        ) -> Result<(), ResourceError> {
            let pd = pd.verbs_pd().ok_or(ResourceError::UnknownPd)?.clone()?;
            let scq = send_cq
                .verbs_cq()
                .ok_or(ResourceError::UnknownCq)?
                .clone()?;
            let rcq = recv_cq
                .verbs_cq()
                .ok_or(ResourceError::UnknownCq)?
                .clone()?;
            if !Arc::ptr_eq(pd.context(), &self.ctx) {
                return Err(ResourceError::UnknownPd);
            }
            self.res = Some((pd, scq, rcq));
            Ok(())
        }

        fn create_qp(&mut self, _: PdId, _: CqId, _: CqId) -> Result<QpInfo, ResourceError> {
            let (pd, scq, rcq) = self.res.as_ref().ok_or(ResourceError::UnknownPd)?;
            let qp = braid_verbs::Qp::new(pd, scq, rcq, self.timing).map_err(|e| resource(&e))?;
            let info = qp.info();
            self.qps.insert(qp.qpn(), Arc::new(qp));
            Ok(info)
        }

        fn connect(&mut self, qpn: u32, peer: QpInfo) -> Result<(), ResourceError> {
            let qp = self.qp(qpn).ok_or(ResourceError::UnknownQp)?;
            let p = braid_verbs::peer_of(&peer).ok_or(ResourceError::Unsupported)?;
            qp.connect(&p).map_err(|e| resource(&e))
        }

        fn set_error(&mut self, qpn: u32) -> Result<(), ResourceError> {
            let qp = self.qp(qpn).ok_or(ResourceError::UnknownQp)?;
            qp.set_error().map_err(|e| resource(&e))
        }

        fn destroy_qp(&mut self, qpn: u32) -> Result<(), ResourceError> {
            self.qps
                .remove(&qpn)
                .map(drop)
                .ok_or(ResourceError::UnknownQp)
        }

        fn check_send(&self, wr: &SendWr) -> Result<(), PostError> {
            braid_verbs::check_send(wr)
        }

        fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), PostError> {
            self.qp(qpn).ok_or(PostError::UnknownQp)?.post_send(&wr)
        }

        fn post_send_or_fail(&mut self, qpn: u32, wr: SendWr, _: CqId) {
            let Some(qp) = self.qp(qpn) else {
                log::error!("braid verbs backend: queued request for a destroyed QP {qpn}");
                return;
            };
            // A QP that failed (error state) takes the post and the NIC flushes it; the
            // shape was checked when it was queued; what is left is a full send queue,
            // which the queue depth (no smaller than MAX_PENDING_WR on devices whose
            // max_qp_wr allows) rules out for the requests queued before the connection.
            if let Err(e) = qp.post_send(&wr) {
                let status = match e {
                    PostError::QueueFull | PostError::NotConnected => WcStatus::Flushed,
                    _ => WcStatus::LocalProtectionError,
                };
                qp.complete_unposted(&wr, status);
            }
        }

        fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), PostError> {
            self.qp(qpn).ok_or(PostError::UnknownQp)?.post_recv(&wr)
        }

        #[cfg(test)]
        fn qp_count(&self) -> usize {
            self.qps.len()
        }
    }

    /// A verbs protection domain, or why it could not be allocated (reported by the first
    /// registration or QP creation in it, since `alloc_pd` cannot fail).
    pub(in crate::device) type VerbsPd = Result<Arc<Pd>, ResourceError>;

    /// A verbs CQ, or why it could not be created (QP creation on it then fails).
    pub(in crate::device) type VerbsCq = Result<Arc<Cq>, ResourceError>;

    pub(in crate::device) fn resource(e: &braid_verbs::VerbsError) -> ResourceError {
        log::warn!("braid verbs backend: {e}");
        braid_verbs::resource_error(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_name_parses_back_to_its_backend() {
        for b in [
            Backend::Software,
            Backend::Verbs(None),
            Backend::Verbs(Some("rxe0".into())),
            Backend::Auto,
        ] {
            assert_eq!(b.to_string().parse::<Backend>(), Ok(b.clone()), "{b}");
        }
        assert!("verbs:".parse::<Backend>().is_err());
        let err = "tcp".parse::<Backend>().unwrap_err();
        assert!(err.contains("\"tcp\""), "{err}");
    }

    /// On a machine without RDMA (every host of this project: ENOSYS from the kernel),
    /// verbs is a typed error and auto says why it fell back.
    #[test]
    fn auto_falls_back_to_software_and_says_why_when_verbs_is_unavailable() {
        let cfg = braid_proto::EndpointConfig::default();
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        match choose(&Backend::Verbs(None), &cfg, local) {
            Err(why) => {
                let Ok(Chosen::Software(report)) = choose(&Backend::Auto, &cfg, local) else {
                    panic!("auto must fall back to software when verbs fails: {why}");
                };
                assert!(
                    report.starts_with("software (auto; verbs unavailable:"),
                    "{report}"
                );
                assert!(report.contains(&why.to_string()), "{report} / {why}");
            }
            #[cfg(feature = "verbs")]
            Ok(Chosen::Verbs(v)) => {
                let Ok(Chosen::Verbs(_)) = choose(&Backend::Auto, &cfg, local) else {
                    panic!("auto must pick the verbs device {} that exists", v.report);
                };
            }
            Ok(Chosen::Software(r)) => panic!("verbs asked, software chosen: {r}"),
        }
        let Ok(Chosen::Software(r)) = choose(&Backend::Software, &cfg, local) else {
            panic!("software must always open");
        };
        assert_eq!(r, "software (as configured)");
    }
}
