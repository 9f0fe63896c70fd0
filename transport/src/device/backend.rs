//! Which transport a device runs on: Braid's own software transport (the engine over a
//! datapath) or an RDMA NIC's RC queue pairs through rdma-core ([`Backend`]), and, with the
//! `verbs` feature, the verbs side of the public handles.
//!
//! The handles ([`Device`](crate::Device) and the rest) dispatch inside: a device opened on
//! verbs holds a [`VerbsDevice`], its protection domains, regions, queues and QPs hold the
//! matching `braid_verbs` objects, and every call goes straight to libibverbs (no engine, no
//! progress thread: the NIC is the progress engine). What only the software transport has
//! (encrypted QPs, path statistics, the in-band connection handshake, a CQ's file
//! descriptor) is refused or empty on verbs, as each method's doc says.
use std::fmt;

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
/// does, so both report `RnrRetryExceeded` the same way).
pub(super) fn choose(
    backend: &Backend,
    engine: &braid_proto::EndpointConfig,
) -> Result<Chosen, VerbsUnavailable> {
    match backend {
        Backend::Software => Ok(Chosen::Software("software (as configured)".into())),
        Backend::Verbs(name) => open_verbs(name.as_deref(), "as configured", engine),
        Backend::Auto => match open_verbs(None, "auto: first choice", engine) {
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
) -> Result<Chosen, VerbsUnavailable> {
    Err(VerbsUnavailable::NotBuilt)
}

#[cfg(feature = "verbs")]
fn open_verbs(
    name: Option<&str>,
    why: &str,
    engine: &braid_proto::EndpointConfig,
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
    let c = ctx.caps();
    let report = format!(
        "verbs {} ({why}; mtu {}, roce {:?}, gid index {})",
        c.device, c.active_mtu, c.roce, c.gid_index
    );
    log::info!("braid device: backend {report}");
    let timing = braid_verbs::QpTiming::like_software(engine.rnr_retry_limit, engine.rnr_timer_ns);
    Ok(Chosen::Verbs(Box::new(VerbsDevice::new(
        ctx, report, timing,
    ))))
}

#[cfg(feature = "verbs")]
pub(super) use verbs_impl::*;

#[cfg(feature = "verbs")]
mod verbs_impl {
    use std::io;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use braid_datapath::{Datapath, RecvBatch, Transmit};
    use braid_proto::{Endpoint, EndpointConfig, ResourceError};

    pub(in crate::device) use braid_verbs::{Caps, Cq, Pd};

    /// An open verbs device, plus an idle engine that only the handshake calls reach (the
    /// in-band handshake runs over Braid's datagrams, which a verbs device does not have:
    /// its connections never come up, and `wait_connected` times out).
    pub(in crate::device) struct VerbsDevice {
        pub(in crate::device) ctx: Arc<braid_verbs::Context>,
        pub(in crate::device) report: String,
        pub(in crate::device) addr: SocketAddr,
        pub(in crate::device) idle: Mutex<(Endpoint, Option<crate::handshake::Runtime>)>,
        pub(in crate::device) null: NullDatapath,
        /// RNR and retry settings of every QP.
        pub(in crate::device) timing: braid_verbs::QpTiming,
    }

    impl VerbsDevice {
        pub(super) fn new(
            ctx: Arc<braid_verbs::Context>,
            report: String,
            timing: braid_verbs::QpTiming,
        ) -> VerbsDevice {
            let addr = braid_verbs::qp_info(ctx.caps().gid, 0, 0).addr;
            VerbsDevice {
                ctx,
                report,
                addr,
                idle: Mutex::new((Endpoint::new(EndpointConfig::default(), addr), None)),
                null: NullDatapath { addr },
                timing,
            }
        }

        pub(in crate::device) fn caps(&self) -> &Caps {
            self.ctx.caps()
        }
    }

    /// The datapath the idle handshake engine of a verbs device sees: sends vanish, nothing
    /// arrives.
    #[derive(Debug)]
    pub(in crate::device) struct NullDatapath {
        addr: SocketAddr,
    }

    impl Datapath for NullDatapath {
        fn kind(&self) -> &'static str {
            "verbs"
        }
        fn local_addr(&self) -> SocketAddr {
            self.addr
        }
        fn paths(&self) -> u16 {
            1
        }
        fn max_payload(&self) -> usize {
            1200
        }
        fn send(&self, batch: &[Transmit<'_>]) -> io::Result<usize> {
            Ok(batch.len())
        }
        fn recv(&self, _batch: &mut RecvBatch, _timeout: Option<Duration>) -> io::Result<usize> {
            Ok(0)
        }
        fn wake(&self) {}
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
        match choose(&Backend::Verbs(None), &cfg) {
            Err(why) => {
                let Ok(Chosen::Software(report)) = choose(&Backend::Auto, &cfg) else {
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
                let Ok(Chosen::Verbs(_)) = choose(&Backend::Auto, &cfg) else {
                    panic!("auto must pick the verbs device {} that exists", v.report);
                };
            }
            Ok(Chosen::Software(r)) => panic!("verbs asked, software chosen: {r}"),
        }
        let Ok(Chosen::Software(r)) = choose(&Backend::Software, &cfg) else {
            panic!("software must always open");
        };
        assert_eq!(r, "software (as configured)");
    }
}
