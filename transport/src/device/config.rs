//! How a device is opened: [`DeviceConfig`] and its builders, the datapath choice
//! ([`DatapathKind`], including `auto`'s fallback order) and [`OpenError`].
use std::io;
use std::net::SocketAddr;

use braid_datapath::Datapath;
use braid_datapath::udp::{UdpConfig, UdpDatapath};
use braid_datapath::uring::UringDatapath;
use braid_datapath::xdp::{XdpConfig, XdpDatapath};
use braid_proto::EndpointConfig;

use super::backend::{Backend, VerbsUnavailable};

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
    /// which it got and why ([`Device::datapath_report`](crate::Device::datapath_report)).
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

/// Who drives a device's datapath and engine: receiving datagrams, placing them, running
/// timers and sending what that produces.
///
/// The names follow libfabric's progress models (`FI_PROGRESS_AUTO` / `FI_PROGRESS_MANUAL`)
/// and eRPC's run-to-completion event loop.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Progress {
    /// The device's progress thread does everything; application threads only post and take
    /// completions from their queues. A round trip crosses two thread hand-offs per side
    /// (application, progress thread, wire, progress thread, application).
    #[default]
    Thread,
    /// Run to completion: a thread that polls or waits on a completion queue and finds it
    /// empty drives the device itself (a receive batch without waiting, the engine, due
    /// timers and the transmit flush), so a completion is produced on the thread that wants
    /// it. Pollers only ever try the engine lock: if another thread is driving, the poll just
    /// looks at the queue. A thread blocked in [`CompletionQueue::wait`](crate::CompletionQueue::wait)
    /// sleeps in the datapath itself (woken by the datagram). The progress thread stays as
    /// the fallback: it backs off while pollers are active and takes over receives, timers
    /// and ACKs within a couple of milliseconds once nobody polls. An application that
    /// sleeps in epoll on the CQ's descriptor ([`CompletionQueue::event_fd`](crate::CompletionQueue::event_fd))
    /// does not drive while it sleeps, so it pays that back-off after each burst of polls:
    /// it should keep `Thread`.
    Inline,
}

impl Progress {
    /// The name used on command lines, in reports and in `BRAID_PROGRESS`.
    pub fn name(self) -> &'static str {
        match self {
            Progress::Thread => "thread",
            Progress::Inline => "inline",
        }
    }

    /// The mode `BRAID_PROGRESS` names (`thread` or `inline`), else [`Progress::Thread`]:
    /// the default of [`DeviceConfig::udp`], so that a whole test suite or application can
    /// be run in either mode without changing its code.
    pub fn from_env() -> Progress {
        std::env::var("BRAID_PROGRESS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Progress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "thread" | "auto" => Ok(Progress::Thread),
            "inline" | "manual" | "rtc" => Ok(Progress::Inline),
            other => Err(format!(
                "unknown progress mode {other:?} (one of: thread, inline)"
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
    /// The progress thread spins on the datapath instead of sleeping in the kernel. It then
    /// takes no wake-up per packet, which shortens the time from arrival to placement, but it
    /// keeps one core busy all the time. Use it only where that core is the progress thread's
    /// alone: a spinning thread that shares a core with other busy threads (the application
    /// spinning on its CQ, a peer device on the same machine) takes the CPU time they need
    /// to make progress, and everything slows down.
    pub busy_poll: bool,
    /// Who drives the datapath and the engine (default: `BRAID_PROGRESS`, else the progress
    /// thread; see [`Progress`]).
    pub progress: Progress,
    /// The transport: Braid's software transport (the default), an RDMA NIC through
    /// rdma-core, or whichever is there ([`Backend`]). On verbs, `local`, `datapath`,
    /// `engine`, `interface`, `busy_poll`, `progress` and `shards` do not apply.
    pub backend: Backend,
    /// Engine shards, 1 to 64 (default: `BRAID_SHARDS`, else 1). Each shard is
    /// an engine of its own with its own lock, datapath (socket set) and progress thread;
    /// each QP lives on one shard, picked round robin at creation, and its
    /// [`QpInfo`](braid_proto::QpInfo) carries that shard's address, so peers send to it
    /// directly. Regions, protection domains and completion queues span every shard. Shard
    /// 0 has the device's address and answers the connection handshake. AF_XDP binds every
    /// queue of its interface for one socket set, so an AF_XDP device runs one shard (its
    /// [`datapath_report`](crate::Device::datapath_report) says so when more were asked).
    /// With [`Progress::Inline`], a poll drives the shards whose QPs report to the polled
    /// queue; a blocking wait on a queue fed by one shard sleeps in that shard's datapath,
    /// but one fed by several cannot sleep in all of them and waits on the queue's event in
    /// slices of a millisecond: for latency, give each shard's QPs queues of their own.
    pub shards: usize,
    /// Send large payloads straight from their registered regions, where the datapath can
    /// (UDP sockets, payloads of 16 KiB and more: loopback's 64 KiB datagrams), instead of
    /// copying each into a transmit buffer first (default: on, unless `BRAID_SEND_IN_PLACE`
    /// is `0`). The CRC32C is computed where the payload lies and the kernel copies it from
    /// there: if the application changes the bytes an operation reads while it runs (as
    /// RDMA leaves undefined), the receiver drops the datagram for its CRC and it is sent
    /// again.
    pub send_in_place: bool,
}

/// The most engine shards a device may have (see [`DeviceConfig::shards`]).
const MAX_SHARDS: usize = 64;

/// The shard count `BRAID_SHARDS` names, else 1: the default of [`DeviceConfig::udp`], so
/// that a whole test suite or application can be run sharded without changing its code.
fn shards_from_env() -> usize {
    std::env::var("BRAID_SHARDS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1)
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
            progress: Progress::from_env(),
            backend: Backend::Software,
            shards: shards_from_env(),
            send_in_place: std::env::var("BRAID_SEND_IN_PLACE").map_or(true, |v| v.trim() != "0"),
        }
    }

    /// Sets the transport backend (see [`Backend`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Sets the number of engine shards, 1 to 64 (see [`shards`](Self::shards)).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }

    /// Sends large payloads from their regions where the datapath can, or always copies them
    /// (see [`send_in_place`](Self::send_in_place)).
    pub fn send_in_place(mut self, on: bool) -> Self {
        self.send_in_place = on;
        self
    }

    /// Sets who drives the datapath and the engine (see [`Progress`]).
    pub fn progress(mut self, mode: Progress) -> Self {
        self.progress = mode;
        self
    }

    /// Makes the progress thread spin on the datapath instead of sleeping (see
    /// [`busy_poll`](Self::busy_poll): only for a core of its own).
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
    /// [`Backend::Verbs`] was asked for and cannot be used: no verbs support in this build,
    /// no rdma-core, no RDMA device (ENOSYS/ENODEV, as on a kernel without RDMA), no device
    /// of that name, or its port is down.
    Verbs(VerbsUnavailable),
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
            OpenError::Verbs(why) => write!(f, "verbs backend unavailable: {why}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Datapath { source: e, .. }
            | OpenError::Thread(e)
            | OpenError::Entropy(e) => Some(e),
            OpenError::Verbs(why) => Some(why),
            OpenError::InvalidConfig(_) => None,
        }
    }
}

impl DeviceConfig {
    /// The engine settings a device opens with: `engine`, checked, with its seed drawn from
    /// the OS unless `deterministic_seed` is set.
    pub(super) fn engine_config(&self) -> Result<EndpointConfig, OpenError> {
        if self.engine.paths == 0 || self.engine.paths > braid_proto::MAX_PATHS {
            return Err(OpenError::InvalidConfig("paths must be 1 to 256"));
        }
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(OpenError::InvalidConfig("shards must be 1 to 64"));
        }
        let mut engine = self.engine.clone();
        if !self.deterministic_seed {
            let mut seed = [0u8; 8];
            getrandom::getrandom(&mut seed).map_err(|e| OpenError::Entropy(io::Error::other(e)))?;
            engine.seed = u64::from_le_bytes(seed);
        }
        Ok(engine)
    }
}

/// Binds the datapath `cfg` asks for; `auto` tries AF_XDP, then io_uring, then plain UDP
/// sockets. Returns it with a one-line report of the choice.
pub(super) fn open_datapath(
    cfg: &DeviceConfig,
    ports: u16,
    max_datagram: usize,
) -> Result<(Box<dyn Datapath>, String), OpenError> {
    let open = |kind| bind_datapath(cfg, kind, ports, max_datagram);
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

/// Binds the datapaths of a device, one per shard (see [`DeviceConfig::shards`]): shard 0's as
/// [`open_datapath`] does, on `cfg.local`; the others of the same kind on `cfg.local`'s IP
/// address with a port of their own. AF_XDP binds every queue of the interface for one
/// socket set, so an AF_XDP device gets one (the report says so when more were asked).
pub(super) fn open_datapaths(
    cfg: &DeviceConfig,
    ports: u16,
    max_datagram: usize,
) -> Result<(Vec<Box<dyn Datapath>>, String), OpenError> {
    let (first, mut report) = open_datapath(cfg, ports, max_datagram)?;
    if cfg.shards <= 1 {
        return Ok((vec![first], report));
    }
    let kind: DatapathKind = first.kind().parse().unwrap_or(DatapathKind::Udp);
    if kind == DatapathKind::Xdp {
        report.push_str(&format!(
            "; 1 shard, not {}: AF_XDP binds every queue of the interface once",
            cfg.shards
        ));
        return Ok((vec![first], report));
    }
    let mut rest = cfg.clone();
    rest.local.set_port(0);
    rest.datapath = kind;
    let mut datapaths = vec![first];
    for _ in 1..cfg.shards {
        let (d, _) = open_datapath(&rest, ports, max_datagram)?;
        datapaths.push(d);
    }
    report.push_str(&format!("; {} shards", cfg.shards));
    Ok((datapaths, report))
}

/// Binds one datapath of `kind` on `cfg.local` (`Auto` binds plain UDP sockets).
fn bind_datapath(
    cfg: &DeviceConfig,
    kind: DatapathKind,
    ports: u16,
    max_datagram: usize,
) -> io::Result<Box<dyn Datapath>> {
    let udp_config = || {
        let mut u = UdpConfig::new(cfg.local, ports);
        u.max_payload = max_datagram;
        u
    };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_datapath_name_parses_back_to_its_kind() {
        for kind in [
            DatapathKind::Udp,
            DatapathKind::Uring,
            DatapathKind::Xdp,
            DatapathKind::Auto,
        ] {
            assert_eq!(kind.to_string(), kind.name());
            assert_eq!(kind.name().parse::<DatapathKind>(), Ok(kind));
        }
        assert_eq!("io_uring".parse::<DatapathKind>(), Ok(DatapathKind::Uring));
        assert_eq!("af-xdp".parse::<DatapathKind>(), Ok(DatapathKind::Xdp));
        let err = "rdma".parse::<DatapathKind>().unwrap_err();
        assert!(err.contains("\"rdma\""), "{err}");
    }

    #[test]
    fn every_progress_name_parses_back_to_its_mode() {
        for mode in [Progress::Thread, Progress::Inline] {
            assert_eq!(mode.to_string(), mode.name());
            assert_eq!(mode.name().parse::<Progress>(), Ok(mode));
        }
        assert_eq!("manual".parse::<Progress>(), Ok(Progress::Inline));
        let err = "sometimes".parse::<Progress>().unwrap_err();
        assert!(err.contains("\"sometimes\""), "{err}");
    }

    #[test]
    fn path_counts_outside_1_to_256_are_refused() {
        let cfg = DeviceConfig::udp("127.0.0.1:0".parse().unwrap());
        for paths in [0, braid_proto::MAX_PATHS + 1] {
            let got = cfg.clone().paths(paths).engine_config();
            assert!(
                matches!(got, Err(OpenError::InvalidConfig(_))),
                "{paths} paths: {got:?}"
            );
        }
        for paths in [1, braid_proto::MAX_PATHS] {
            let got = cfg.clone().paths(paths).engine_config().unwrap();
            assert_eq!(got.paths, paths);
        }
    }

    #[test]
    fn the_configured_seed_is_kept_only_when_deterministic() {
        let mut cfg = DeviceConfig::udp("127.0.0.1:0".parse().unwrap());
        cfg.engine.seed = 0x5eed;
        cfg.deterministic_seed = true;
        assert_eq!(cfg.engine_config().unwrap().seed, 0x5eed);
        cfg.deterministic_seed = false;
        // Two draws from the OS differ (but with probability 2^-64); were the configured
        // seed kept, both would be 0x5eed.
        let s1 = cfg.engine_config().unwrap().seed;
        let s2 = cfg.engine_config().unwrap().seed;
        assert_ne!(s1, s2);
    }
}
