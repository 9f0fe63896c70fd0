//! `braid-perf`: perftest-style bandwidth and latency tests for Braid.
//!
//! * `braid-perf demo`: one process, two devices on 127.0.0.1, WRITE/READ/SEND bandwidth with
//!   every byte verified, 8-byte WRITE round-trip latency, and the per-path table.
//! * `braid-perf server` / `braid-perf client HOST[:PORT] --test ...`: two processes (or two
//!   hosts). A TCP connection on the given port bootstraps the test (QP info, rkey, region
//!   length, one JSON line each way; see `braid_bench::wire`); the data moves over Braid. The
//!   server serves clients one after another, each on a fresh device, until killed (or after
//!   the first one with `--once`).
//! * `--encrypt` (demo, client): the connection is encrypted and authenticated (AES-256-GCM
//!   under keys agreed with X25519 at connect; see `braid_proto::seal`). The server follows the
//!   client's choice, or refuses plain clients when started with `--encrypt` itself.
use std::io::{BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use braid::proto::cc::{ControllerFactory, DcqcnConfig, FixedWindowConfig, SwiftConfig};
use braid::{
    Access, Backend, DatapathKind, Device, DeviceConfig, MemoryRegion, Progress, RemoteAddr,
    SendOp, SendWr, WcStatus,
};
use braid_bench::pattern;
use braid_bench::report::{self, BwResult, ClientReport, LatResult, PathRow, QpTelemetry, RttRow};
use braid_bench::run::{
    self, BwOp, BwSpec, Check, Conn, Limit, NoCheck, RecvSide, Verifier, perftest_engine,
};
use braid_bench::wire::{self, Bye, Done, Hello, Welcome, WireQp, WireRemote};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

const DEFAULT_PORT: u16 = 18515;
/// Salt of the pattern the server puts in its region for read_bw.
const READ_SALT: u64 = 0x00AD_5EED;

#[derive(Parser)]
#[command(
    name = "braid-perf",
    version,
    about = "perftest-style bandwidth and latency tests for Braid"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One process, two devices on 127.0.0.1: verified WRITE/READ/SEND bandwidth, WRITE latency, per-path table.
    Demo(DemoArgs),
    /// Serve tests to clients (one at a time, each on a fresh device) until killed.
    Server(ServerArgs),
    /// Run a test against a `braid-perf server`.
    Client(ClientArgs),
}

#[derive(Args, Clone)]
struct Engine {
    /// Paths (UDP source ports) each connection sprays over.
    #[arg(long, default_value_t = 16)]
    paths: u16,
    /// UDP source ports the device opens, at least --paths (0: twice the paths, at most 256);
    /// the spare ones are where PLB re-paths a congested path.
    #[arg(long, default_value_t = 0)]
    ports: u16,
    /// Largest datagram (UDP payload), bytes; 1472 fits a 1500-byte MTU.
    #[arg(long, default_value_t = 1472)]
    max_datagram: usize,
    /// Datapath: udp, uring (io_uring), xdp (AF_XDP, needs root and a real or veth
    /// interface), or auto (xdp, else uring, else udp).
    #[arg(long, default_value = "udp", value_parser = parse_datapath)]
    datapath: DatapathKind,
    /// Transport: software (Braid over --datapath), verbs or verbs:DEVICE (an RDMA NIC
    /// through rdma-core; needs a build with --features verbs), or auto (verbs if a device
    /// is active, else software).
    #[arg(long, default_value = "software", value_parser = parse_backend)]
    backend: Backend,
    /// The device's progress thread spins on the datapath instead of sleeping (lower latency,
    /// one core busy).
    #[arg(long)]
    progress_busy_poll: bool,
    /// Who drives the device: thread (the progress thread) or inline (the threads polling
    /// the completion queues, run to completion; the progress thread is the fallback).
    /// Default: BRAID_PROGRESS, else thread.
    #[arg(long, value_parser = parse_progress)]
    progress: Option<Progress>,
    /// Encrypt and authenticate the connection (AES-256-GCM, keys agreed at connect); each
    /// packet then carries 20 bytes less payload.
    #[arg(long)]
    encrypt: bool,
    /// Congestion controller of this side's QPs: swift (the default, `software_host()`
    /// settings), fixed (a fixed window of --fixed-packets) or dcqcn.
    #[arg(long, default_value = "swift", value_parser = ["swift", "fixed", "dcqcn"])]
    cc: String,
    /// Window of `--cc fixed`, packets.
    #[arg(long, default_value_t = 256)]
    fixed_packets: u32,
    /// Swift's headroom above the lowest measured delay, µs (default: the runtime's).
    #[arg(long)]
    swift_headroom_us: Option<u64>,
    /// Burst spraying: new packets sent on one path before the next path draw (1: a path
    /// per packet); longer bursts let the datapath send them as one UDP GSO message. A
    /// server uses its client's setting.
    #[arg(long, default_value_t = 1)]
    burst: u16,
    /// ACK coalescing: new packets arriving in order per acknowledgement (1: one per receive
    /// batch; default: the device's, 8 on AF_XDP and every batch elsewhere). A server uses
    /// its client's setting.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ack_every: Option<u16>,
    /// Engine shards of the device, each with its own lock, sockets and progress thread
    /// (default: BRAID_SHARDS, else 1); QPs are spread over them round robin. A server uses
    /// its client's setting.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    shards: Option<u16>,
}

impl Engine {
    fn controller(&self) -> Arc<dyn ControllerFactory> {
        match self.cc.as_str() {
            "fixed" => Arc::new(FixedWindowConfig {
                packets: self.fixed_packets,
            }),
            "dcqcn" => Arc::new(DcqcnConfig::default()),
            _ => {
                let mut c = SwiftConfig::software_host();
                if let Some(us) = self.swift_headroom_us {
                    c.base_target_ns = us * 1000;
                }
                Arc::new(c)
            }
        }
    }
}

/// A QP on `pd` reporting to `cq`, encrypted if asked.
fn make_qp(
    pd: &braid::ProtectionDomain,
    cq: &braid::CompletionQueue,
    encrypt: bool,
) -> Result<braid::QueuePair, braid::ResourceError> {
    if encrypt {
        pd.create_encrypted_qp(cq, cq)
    } else {
        pd.create_qp(cq, cq)
    }
}

/// Payload bytes per packet of a QP on `dev`: sealed packets carry `SEAL_OVERHEAD` less.
fn payload_per_packet(dev: &Device, encrypt: bool) -> u32 {
    let seal = if encrypt {
        braid::proto::wire::SEAL_OVERHEAD as u32
    } else {
        0
    };
    dev.chunk_size() - seal
}

#[derive(Args)]
struct DemoArgs {
    #[command(flatten)]
    engine: Engine,
    /// Message size of the bandwidth tests (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "1M", value_parser = braid_bench::parse_size)]
    size: u64,
    /// Messages per bandwidth test (default: run each for --duration).
    #[arg(long)]
    iters: Option<u64>,
    /// Seconds per bandwidth test.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Round trips of the latency test.
    #[arg(long, default_value_t = 10_000)]
    lat_iters: u64,
    /// Outstanding work requests in bandwidth tests (default: 32 MiB worth, 2 to 64).
    #[arg(long)]
    window: Option<usize>,
    /// Spin on completion queues in bandwidth tests instead of sleeping on them.
    #[arg(long)]
    busy_poll: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ServerArgs {
    #[command(flatten)]
    engine_dp: DatapathOnly,
    /// TCP address for the bootstrap; the Braid device binds to the IP a client reached.
    #[arg(long, default_value = "0.0.0.0:18515")]
    bind: SocketAddr,
    /// UDP port of the Braid device (0: ephemeral).
    #[arg(long, default_value_t = 0)]
    udp_port: u16,
    /// Exit after the first client.
    #[arg(long)]
    once: bool,
    /// Spin on the completion queue in the send_lat echo loop (and, with --progress inline,
    /// in the loop that drives the device during the other tests).
    #[arg(long)]
    busy_poll: bool,
    /// Largest region a client may ask for (suffixes K, M, G).
    #[arg(long, default_value = "1G", value_parser = braid_bench::parse_size)]
    max_region: u64,
}

#[derive(Args)]
struct DatapathOnly {
    /// Datapath: udp, uring (io_uring), xdp (AF_XDP, needs root and a real or veth
    /// interface), or auto (xdp, else uring, else udp).
    #[arg(long, default_value = "udp", value_parser = parse_datapath)]
    datapath: DatapathKind,
    /// Transport: software (Braid over --datapath), verbs or verbs:DEVICE (an RDMA NIC
    /// through rdma-core; needs a build with --features verbs), or auto (verbs if a device
    /// is active, else software).
    #[arg(long, default_value = "software", value_parser = parse_backend)]
    backend: Backend,
    /// The device's progress thread spins on the datapath instead of sleeping (lower latency,
    /// one core busy).
    #[arg(long)]
    progress_busy_poll: bool,
    /// Who drives the device: thread or inline (see the client's --progress). With inline,
    /// the server polls its completion queue during every test (spinning with --busy-poll,
    /// else sleeping in it), as the client does.
    #[arg(long, value_parser = parse_progress)]
    progress: Option<Progress>,
    /// Refuse clients whose connection is not encrypted (without it, the server encrypts when
    /// the client does).
    #[arg(long)]
    encrypt: bool,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum Test {
    /// RDMA WRITE bandwidth.
    #[value(name = "write_bw", alias = "write-bw")]
    WriteBw,
    /// RDMA WRITE round trip (post, wait for the completion).
    #[value(name = "write_lat", alias = "write-lat")]
    WriteLat,
    /// RDMA READ bandwidth.
    #[value(name = "read_bw", alias = "read-bw")]
    ReadBw,
    /// RDMA READ round trip (post, wait for the completion), as perftest's ib_read_lat.
    #[value(name = "read_lat", alias = "read-lat")]
    ReadLat,
    /// 8-byte fetch-and-add round trip (post, wait for the completion, check the value
    /// fetched), as perftest's ib_atomic_lat.
    #[value(name = "atomic_lat", alias = "atomic-lat")]
    AtomicLat,
    /// SEND bandwidth (the server keeps receives posted and reposts each as it completes).
    #[value(name = "send_bw", alias = "send-bw")]
    SendBw,
    /// SEND ping-pong (the server echoes).
    #[value(name = "send_lat", alias = "send-lat")]
    SendLat,
    /// write_bw over sizes 8 B .. 8 MiB.
    #[value(name = "sweep")]
    Sweep,
}

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::WriteLat => "write_lat",
            Test::ReadBw => "read_bw",
            Test::ReadLat => "read_lat",
            Test::AtomicLat => "atomic_lat",
            Test::SendBw => "send_bw",
            Test::SendLat => "send_lat",
            Test::Sweep => "sweep",
        }
    }
    fn is_lat(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::AtomicLat | Test::SendLat
        )
    }
}

#[derive(Args)]
struct ClientArgs {
    /// Server, HOST or HOST:PORT (default port 18515).
    target: String,
    #[command(flatten)]
    engine: Engine,
    /// Test to run.
    #[arg(long, value_enum)]
    test: Test,
    /// Message size (default 64K for bandwidth, 8 for latency; the largest for sweep: 8M).
    #[arg(long, value_parser = braid_bench::parse_size)]
    size: Option<u64>,
    /// Messages (bandwidth; per size for sweep) or round trips (latency).
    #[arg(long, conflicts_with = "duration")]
    iters: Option<u64>,
    /// Seconds to run (bandwidth default 5, sweep default 1 per size; latency tests count --iters, default 10000).
    #[arg(long)]
    duration: Option<f64>,
    /// Outstanding work requests in bandwidth tests (default: 32 MiB worth, 2 to 64).
    #[arg(long)]
    window: Option<usize>,
    /// Message slots the WRITE and READ bandwidth tests cycle through in each region
    /// (default: one per outstanding work request, the window). 1 posts every message from
    /// and to the same bytes, as perftest's bandwidth tests do: a working set of one message
    /// instead of the window's (32 MiB by default). Not with --verify (each message's
    /// pattern needs its own slot).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "verify")]
    slots: Option<u64>,
    /// QPs of a WRITE or READ bandwidth test, as perftest's -q: each with its own completion
    /// queue, regions and posting thread, on the device's shards round robin (give it as
    /// many with --shards for one core each); the bandwidth is their sum.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64), conflicts_with = "verify")]
    qps: u16,
    /// Sweep over powers of 2 instead of powers of 4.
    #[arg(long)]
    pow2: bool,
    /// Check data: read_bw checks every message; write_bw reads the window back at the end.
    #[arg(long)]
    verify: bool,
    /// Bandwidth tests signal only every N-th work request (and the last), as perftest's
    /// --cq-mod; the others complete with it. With 8 B WRITEs this measures the message
    /// rate. At most the window.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    cq_mod: u32,
    /// Spin on the completion queue in bandwidth tests instead of sleeping on it.
    #[arg(long)]
    busy_poll: bool,
    /// Latency tests sleep on the completion queue (CompletionQueue::wait) instead of
    /// spinning on it.
    #[arg(long)]
    lat_wait: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

fn parse_datapath(s: &str) -> Result<DatapathKind, String> {
    s.parse::<DatapathKind>()
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    s.parse::<Backend>()
}

fn parse_progress(s: &str) -> Result<Progress, String> {
    s.parse::<Progress>()
}

fn parse_target(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = s.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>().map_err(|_| format!("bad port in {s:?}"))?,
        ),
        None => (s, DEFAULT_PORT),
    };
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host:?} has no address"))
}

fn open_device(engine: &Engine, local: SocketAddr) -> Result<Device, String> {
    let mut cfg = DeviceConfig::udp(local)
        .paths(engine.paths)
        .ports(engine.ports)
        .max_datagram(engine.max_datagram);
    cfg.datapath = engine.datapath;
    cfg.backend = engine.backend.clone();
    cfg.busy_poll = engine.progress_busy_poll;
    if let Some(mode) = engine.progress {
        cfg.progress = mode;
    }
    cfg.engine.cc = engine.controller();
    cfg.engine.burst = engine.burst;
    if let Some(n) = engine.ack_every {
        cfg.engine.ack_every = n;
    }
    if let Some(n) = engine.shards {
        cfg = cfg.shards(usize::from(n));
    }
    perftest_engine(&mut cfg.engine);
    Device::open(cfg).map_err(|e| format!("opening a Braid device on {local}: {e}"))
}

fn limit_of(iters: Option<u64>, duration: f64) -> Result<Limit, String> {
    match iters {
        Some(0) => Err("--iters must be at least 1".into()),
        Some(n) => Ok(Limit::Iters(n)),
        None if duration > 0.0 && duration.is_finite() => {
            Ok(Limit::Duration(Duration::from_secs_f64(duration)))
        }
        None => Err("--duration must be a positive number of seconds".into()),
    }
}

fn to_u32(size: u64) -> Result<u32, String> {
    u32::try_from(size).map_err(|_| format!("size {size} is too large (at most 4 GiB - 1)"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Demo(a) => demo(&a),
        Cmd::Server(a) => server(&a).map(|()| true),
        Cmd::Client(a) => client(&a),
    };
    match res {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("braid-perf: VERIFICATION FAILED");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("braid-perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// demo

#[derive(Serialize)]
struct DemoReport {
    test: &'static str,
    datapath: String,
    paths: u16,
    max_datagram: usize,
    chunk: u32,
    encrypted: bool,
    bw: Vec<BwResult>,
    lat: LatResult,
    paths_client: Vec<PathRow>,
    paths_server: Vec<PathRow>,
    qps: Vec<QpTelemetry>,
    rtt_client: RttRow,
    verified: bool,
}

fn demo(a: &DemoArgs) -> Result<bool, String> {
    let size32 = to_u32(a.size)?;
    let limit = limit_of(a.iters, a.duration)?;
    let window = a
        .window
        .unwrap_or_else(|| run::window_for(a.size))
        .clamp(1, run::MAX_WINDOW);
    let lo: SocketAddr = ([127, 0, 0, 1], 0).into();
    let srv = open_device(&a.engine, lo)?;
    let cli = open_device(&a.engine, lo)?;
    let (spd, cpd) = (srv.alloc_pd(), cli.alloc_pd());
    let (scq, ccq) = (srv.create_cq(), cli.create_cq());
    let err = |e: braid::ResourceError| e.to_string();
    let sqp = make_qp(&spd, &scq, a.engine.encrypt).map_err(err)?;
    let cqp = make_qp(&cpd, &ccq, a.engine.encrypt).map_err(err)?;
    cqp.connect(sqp.info()).map_err(err)?;
    sqp.connect(cqp.info()).map_err(err)?;
    let len = (window as u64 * a.size).max(8) as usize;
    let smr = spd.alloc_mr(len, Access::ALL).map_err(err)?;
    let cmr = cpd.alloc_mr(len, Access::LOCAL_WRITE).map_err(err)?;
    let conn = Conn {
        qp: &cqp,
        cq: &ccq,
        local: &cmr,
        rkey: smr.rkey(),
        remote_len: smr.len() as u64,
    };
    if !a.json {
        println!(
            "braid-perf demo: client {} -> server {}, backend {}, datapath {}, {} paths, {} B datagrams ({} B payload per packet), {} B messages, window {}{}",
            cli.local_addr(),
            srv.local_addr(),
            cli.backend_report(),
            cli.datapath_report(),
            a.engine.paths,
            a.engine.max_datagram,
            payload_per_packet(&cli, a.engine.encrypt),
            a.size,
            window,
            if a.engine.encrypt {
                ", encrypted (AES-256-GCM)"
            } else {
                ""
            }
        );
    }
    let spec = |op| BwSpec {
        op,
        size: size32,
        limit,
        window,
        slots: 0,
        busy_poll: a.busy_poll,
        progress: false,
        signal_every: 1,
    };
    let mut bw = Vec::new();
    let w = run::run_bw(
        &conn,
        &spec(BwOp::Write),
        &mut Verifier::new(&cmr, &smr, a.size as usize, window, 0x11),
    )?;
    bw.push(w);
    let r = run::run_bw(
        &conn,
        &spec(BwOp::Read),
        &mut Verifier::new(&smr, &cmr, a.size as usize, window, 0x22),
    )?;
    bw.push(r);
    let recv = RecvSide {
        qp: &sqp,
        cq: &scq,
        mr: &smr,
    };
    let s = run::run_send_bw_local(
        &conn,
        &recv,
        &spec(BwOp::Write),
        &mut Verifier::new(&cmr, &smr, a.size as usize, window, 0x33),
    )?;
    bw.push(s);
    // With inline progress the server device moves while something polls it, in the same
    // mode as the client (which spins).
    let stop = AtomicBool::new(false);
    let lat = std::thread::scope(|s| {
        let driver = (srv.progress() == Progress::Inline)
            .then(|| s.spawn(|| run::drive_passive(&scq, true, &stop)));
        let lat = run::run_write_lat(
            &conn,
            8,
            a.lat_iters,
            a.lat_iters / 10 + 10,
            false,
            true,
            &mut Verifier::new(&cmr, &smr, 8, 1, 0x44),
        );
        stop.store(true, Ordering::Release);
        if let Some(d) = driver {
            let _ = d.join();
        }
        lat
    })?;
    let verified = bw
        .iter()
        .all(|r| r.mismatches == 0 && r.verified_bytes == r.size * r.iterations)
        && lat.mismatches == 0;
    let rep = DemoReport {
        test: "demo",
        datapath: cli.datapath_kind().to_string(),
        paths: a.engine.paths,
        max_datagram: a.engine.max_datagram,
        chunk: payload_per_packet(&cli, a.engine.encrypt),
        encrypted: a.engine.encrypt,
        bw,
        lat,
        paths_client: report::path_rows(&cli.path_stats()),
        paths_server: report::path_rows(&srv.path_stats()),
        qps: [("client", &cqp), ("server", &sqp)]
            .iter()
            .filter_map(|(role, qp)| qp.stats().map(|st| QpTelemetry::new(role, &st)))
            .collect(),
        rtt_client: cli.rtt_summary().into(),
        verified,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rep).map_err(|e| e.to_string())?
        );
    } else {
        report::print_bw_header(
            "Bandwidth: RDMA WRITE, RDMA READ, SEND (every byte verified at the destination)",
        );
        for (name, r) in ["WRITE", "READ", "SEND"].iter().zip(&rep.bw) {
            print!("{name:>6}");
            report::print_bw_row(r);
        }
        report::print_lat(
            "Latency: 8 B RDMA WRITE round trip (post signaled WRITE, spin on the CQ until its completion)",
            &rep.lat,
        );
        report::print_paths(
            "Client device paths (WRITE and SEND data, READ requests)",
            &rep.paths_client,
        );
        report::print_paths("Server device paths (READ responses)", &rep.paths_server);
        for t in &rep.qps {
            report::print_qp_telemetry(t);
        }
        let cs = cli.stats();
        let ss = srv.stats();
        println!("{}", "-".repeat(96));
        println!(
            " client: tx {} rx {} datagrams, {} retransmits, {} RTOs, {} duplicates | server: tx {} rx {}, {} retransmits, {} RTOs, {} duplicates",
            cs.tx_datagrams,
            cs.rx_datagrams,
            cs.retransmits,
            cs.rto_fired,
            cs.rx_duplicates,
            ss.tx_datagrams,
            ss.rx_datagrams,
            ss.retransmits,
            ss.rto_fired,
            ss.rx_duplicates
        );
        for (label, dev) in [("client", &cli), ("server", &srv)] {
            if let Some(c) = report::datapath_counters(&dev.datapath_counters()) {
                println!(" {label} datapath: {c}");
            }
        }
        println!(
            " verification: {}",
            if verified {
                "PASSED (every byte of every message)"
            } else {
                "FAILED"
            }
        );
    }
    Ok(verified)
}

// ---------------------------------------------------------------------------------------
// server

fn server(a: &ServerArgs) -> Result<(), String> {
    let listener = TcpListener::bind(a.bind).map_err(|e| format!("bind {}: {e}", a.bind))?;
    eprintln!(
        "braid-perf server: listening on {} (TCP bootstrap), datapath {:?}; serving clients one at a time{}",
        listener.local_addr().map_err(|e| e.to_string())?,
        a.engine_dp.datapath,
        if a.once {
            ", exiting after the first"
        } else {
            " until killed"
        }
    );
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        let peer = stream
            .peer_addr()
            .map(|p| p.to_string())
            .unwrap_or_else(|_| "?".into());
        match serve_one(a, stream) {
            Ok(summary) => eprintln!("client {peer}: {summary}"),
            Err(e) => eprintln!("client {peer}: error: {e}"),
        }
        if a.once {
            break;
        }
    }
    Ok(())
}

fn serve_one(a: &ServerArgs, stream: TcpStream) -> Result<String, String> {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut writer = stream;
    let hello: Hello = wire::recv_line(&mut reader)?;
    let refuse = |w: &mut TcpStream, why: String| -> Result<String, String> {
        let _ = wire::send_line(
            w,
            &Welcome {
                error: Some(why.clone()),
                ..Welcome::default()
            },
        );
        Err(why)
    };
    let qps = 1 + hello.more_qps.len() as u64;
    if hello.region_len == 0 || hello.region_len.saturating_mul(qps) > a.max_region {
        return refuse(
            &mut writer,
            format!(
                "{qps} region(s) of {} bytes refused (limit {} in all)",
                hello.region_len, a.max_region
            ),
        );
    }
    if qps > 1 && !matches!(hello.test.as_str(), "write_bw" | "read_bw") {
        return refuse(
            &mut writer,
            format!(
                "{} runs on one QP (more than one: write_bw, read_bw)",
                hello.test
            ),
        );
    }
    let ip = writer.local_addr().map_err(|e| e.to_string())?.ip();
    let engine = Engine {
        paths: hello.paths,
        ports: 0,
        max_datagram: hello.max_datagram,
        datapath: a.engine_dp.datapath,
        backend: a.engine_dp.backend.clone(),
        progress_busy_poll: a.engine_dp.progress_busy_poll,
        progress: a.engine_dp.progress,
        encrypt: hello.qp.seal_key.is_some(),
        cc: "swift".into(),
        fixed_packets: 256,
        swift_headroom_us: None,
        burst: hello.burst,
        ack_every: hello.ack_every,
        shards: hello.shards,
    };
    if a.engine_dp.encrypt && !engine.encrypt {
        return refuse(
            &mut writer,
            braid::ResourceError::EncryptionMismatch.to_string() + " (server requires --encrypt)",
        );
    }
    let dev = match open_device(&engine, SocketAddr::new(ip, a.udp_port)) {
        Ok(d) => d,
        Err(e) => return refuse(&mut writer, e),
    };
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = make_qp(&pd, &cq, engine.encrypt).map_err(|e| e.to_string())?;
    let mr = pd
        .alloc_mr(hello.region_len as usize, Access::ALL)
        .map_err(|e| e.to_string())?;
    let size = to_u32(hello.size.max(1))?;
    if hello.test == "read_bw" {
        fill_read_pattern(&mr, hello.size);
    }
    if hello.test == "send_lat"
        && let Err(e) = run::post_echo_recvs(&qp, &mr, size)
    {
        return refuse(&mut writer, e);
    }
    let recv_slots = if hello.test == "send_bw" {
        match run::post_recv_slots(&qp, &mr, size) {
            Ok(n) => n,
            Err(e) => return refuse(&mut writer, e),
        }
    } else {
        0
    };
    qp.connect(hello.qp.into()).map_err(|e| e.to_string())?;
    // The further QPs of a multi-QP bandwidth test: passive targets, each with a region of
    // its own, on the same completion queue (one-sided operations complete nothing here).
    let mut more = Vec::with_capacity(hello.more_qps.len());
    for peer in &hello.more_qps {
        let q = make_qp(&pd, &cq, engine.encrypt).map_err(|e| e.to_string())?;
        let m = pd
            .alloc_mr(hello.region_len as usize, Access::ALL)
            .map_err(|e| e.to_string())?;
        if hello.test == "read_bw" {
            fill_read_pattern(&m, hello.size);
        }
        q.connect((*peer).into()).map_err(|e| e.to_string())?;
        more.push((q, m));
    }
    let welcome = Welcome {
        qp: Some(WireQp::from(qp.info())),
        rkey: mr.rkey(),
        region_len: mr.len() as u64,
        datapath: dev.datapath_kind().to_string(),
        error: None,
        more: more
            .iter()
            .map(|(q, m)| WireRemote {
                qp: WireQp::from(q.info()),
                rkey: m.rkey(),
            })
            .collect(),
    };
    wire::send_line(&mut writer, &welcome)?;
    let stop = AtomicBool::new(false);
    let (echoed, done) = std::thread::scope(|s| {
        let echo =
            match hello.test.as_str() {
                "send_lat" => {
                    Some(s.spawn(|| run::serve_echo(&qp, &cq, &mr, size, a.busy_poll, &stop)))
                }
                "send_bw" => Some(s.spawn(|| {
                    run::serve_recvs(&qp, &cq, &mr, size, recv_slots, a.busy_poll, &stop)
                })),
                _ => None,
            };
        // An inline device moves only while someone polls it (else its progress thread,
        // the fallback, does the work, with its hand-offs): the echo loop polls in send_lat,
        // the receive loop in send_bw, this loop in the other tests.
        let driver = (echo.is_none() && dev.progress() == Progress::Inline)
            .then(|| s.spawn(|| run::drive_passive(&cq, a.busy_poll, &stop)));
        let done: Result<Done, String> = wire::recv_line(&mut reader);
        stop.store(true, Ordering::Release);
        if let Some(d) = driver {
            let _ = d.join();
        }
        let echoed = match echo.map(|h| h.join()) {
            None => Ok(0),
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(format!("{} thread panicked", hello.test)),
        };
        (echoed, done)
    });
    let bye = Bye {
        paths: report::path_rows(&dev.path_stats()),
        echoed: *echoed.as_ref().unwrap_or(&0),
        qp: qp.stats().map(|st| QpTelemetry::new("server", &st)),
    };
    let _ = wire::send_line(&mut writer, &bye);
    done?;
    let echoed = echoed?;
    let st = dev.stats();
    Ok(format!(
        "{} ({} B, {} paths, {} B datagrams): done; tx {} rx {} datagrams, {} retransmits{}",
        hello.test,
        hello.size,
        hello.paths,
        hello.max_datagram,
        st.tx_datagrams,
        st.rx_datagrams,
        st.retransmits,
        match hello.test.as_str() {
            "send_lat" => format!(", {echoed} echoes"),
            "send_bw" => format!(", {echoed} receives"),
            _ => String::new(),
        }
    ) + &report::datapath_counters(&dev.datapath_counters())
        .map(|c| format!("; datapath: {c}"))
        .unwrap_or_default())
}

/// `spec` on `first` and every one of `more` at once, a thread each (the QPs of `--qps`):
/// the messages of all over the longest run's time (the window is each QP's).
fn run_bw_together(first: &Conn<'_>, more: &[Conn<'_>], spec: &BwSpec) -> Result<BwResult, String> {
    let runs: Vec<Result<BwResult, String>> = std::thread::scope(|s| {
        let others: Vec<_> = more
            .iter()
            .map(|c| {
                let quiet = BwSpec {
                    progress: false,
                    ..*spec
                };
                s.spawn(move || run::run_bw(c, &quiet, &mut NoCheck))
            })
            .collect();
        let mut all = vec![run::run_bw(first, spec, &mut NoCheck)];
        all.extend(others.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("a posting thread panicked".into()))
        }));
        all
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>, String>>()?;
    let op = runs[0].op.clone();
    let iterations = runs.iter().map(|r| r.iterations).sum();
    let seconds = runs.iter().map(|r| r.seconds).fold(0.0, f64::max);
    Ok(BwResult::new(
        &op,
        u64::from(spec.size),
        iterations,
        seconds,
        runs[0].window,
    ))
}

/// Fills slot k (of `size` bytes) of the server's region with the pattern READ_SALT ^ k.
fn fill_read_pattern(mr: &MemoryRegion, size: u64) {
    let size = size.max(1);
    let mut buf = vec![0u8; size as usize];
    for k in 0..mr.len() as u64 / size {
        pattern::fill(READ_SALT ^ k, &mut buf);
        let _ = mr.write(k * size, &buf);
    }
}

// ---------------------------------------------------------------------------------------
// client

/// read_bw --verify: scrambles the local slot before each READ, checks the server's pattern after.
struct ReadCheck<'a> {
    local: &'a MemoryRegion,
    size: usize,
    got: Vec<u8>,
    want: Vec<u8>,
    scratch: Vec<u8>,
}

impl Check for ReadCheck<'_> {
    fn before(&mut self, msg: u64, off: u64) {
        pattern::fill(!msg, &mut self.scratch);
        let _ = self.local.write(off, &self.scratch);
    }
    fn after(&mut self, msg: u64, off: u64) -> Result<u64, String> {
        let slot = off / self.size as u64;
        pattern::fill(READ_SALT ^ slot, &mut self.want);
        self.local
            .read(off, &mut self.got)
            .map_err(|e| format!("{e:?}"))?;
        match pattern::first_mismatch(&self.got, &self.want) {
            None => Ok(self.size as u64),
            Some(i) => Err(format!("READ {msg}: byte {i} of slot {slot} differs")),
        }
    }
}

/// write_bw --verify: a distinct pattern per message in the local slot (checked at the end).
struct WriteFill<'a> {
    local: &'a MemoryRegion,
    buf: Vec<u8>,
}

impl Check for WriteFill<'_> {
    fn before(&mut self, msg: u64, off: u64) {
        pattern::fill(0x77 ^ msg, &mut self.buf);
        let _ = self.local.write(off, &self.buf);
    }
    fn after(&mut self, _: u64, _: u64) -> Result<u64, String> {
        Ok(0)
    }
}

/// Reads the first `window` slots of the server's region back and compares them with the
/// local slots they were written from. Returns the bytes checked.
fn read_back(
    conn: &Conn<'_>,
    scratch: &MemoryRegion,
    window: usize,
    size: u64,
) -> Result<u64, String> {
    let mut wcs = [run::empty_completion()];
    let (mut a, mut b) = (vec![0u8; size as usize], vec![0u8; size as usize]);
    for k in 0..window as u64 {
        let off = k * size;
        let wr = SendWr {
            wr_id: k,
            op: SendOp::Read(RemoteAddr {
                rkey: conn.rkey,
                offset: off,
            }),
            sges: vec![scratch.sge(0, to_u32(size)?)],
            signaled: true,
        };
        conn.qp
            .post_send(wr)
            .map_err(|e| format!("post_send: {e}"))?;
        run::next_completions(conn.cq, &mut wcs, false)?;
        if wcs[0].status != WcStatus::Success {
            return Err(format!("read-back READ failed: {:?}", wcs[0].status));
        }
        scratch.read(0, &mut a).map_err(|e| format!("{e:?}"))?;
        conn.local.read(off, &mut b).map_err(|e| format!("{e:?}"))?;
        if let Some(i) = pattern::first_mismatch(&a, &b) {
            return Err(format!(
                "write_bw read-back: slot {k} byte {i} differs from what was written"
            ));
        }
    }
    Ok(window as u64 * size)
}

fn sweep_sizes(max: u64, pow2: bool) -> Vec<u64> {
    let step = if pow2 { 2 } else { 4 };
    let mut v = Vec::new();
    let mut s = 8u64;
    while s <= max {
        v.push(s);
        s *= step;
    }
    if v.last() != Some(&max) && max >= 8 {
        v.push(max);
    }
    v
}

fn client(a: &ClientArgs) -> Result<bool, String> {
    let test = a.test;
    let size = a.size.unwrap_or(match test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => 64 << 10,
        Test::Sweep => 8 << 20,
        Test::WriteLat | Test::ReadLat | Test::AtomicLat | Test::SendLat => 8,
    });
    if test == Test::AtomicLat && size != 8 {
        return Err(format!(
            "--size {size}: atomic_lat's operations are 8 bytes"
        ));
    }
    let size32 = to_u32(size)?;
    if a.qps > 1 && !matches!(test, Test::WriteBw | Test::ReadBw) {
        return Err(format!(
            "--qps {}: {} runs on one QP (more than one: write_bw, read_bw)",
            a.qps,
            test.name()
        ));
    }
    let sizes = if test == Test::Sweep {
        sweep_sizes(size, a.pow2)
    } else {
        vec![size]
    };
    let window_of = |s: u64| {
        a.window
            .unwrap_or_else(|| run::window_for(s))
            .clamp(1, run::MAX_WINDOW)
    };
    let align8 = |s: u64| s.div_ceil(8) * 8;
    let (local_len, remote_len) = match test {
        Test::WriteBw | Test::ReadBw | Test::Sweep => {
            let l = sizes
                .iter()
                .map(|&s| a.slots.unwrap_or(u64::MAX).min(window_of(s) as u64) * s)
                .max()
                .unwrap_or(size);
            (l, l)
        }
        // Twice the window of receive slots at the server (see run::serve_recvs).
        Test::SendBw => {
            let w = window_of(size) as u64;
            let slots = (2 * w).min(run::RECV_SLOTS_MAX as u64);
            (w * size, slots * size)
        }
        Test::WriteLat | Test::ReadLat | Test::AtomicLat => (size, size),
        Test::SendLat => (2 * align8(size), run::ECHO_SLOTS as u64 * align8(size)),
    };
    let server_addr = parse_target(&a.target)?;
    let stream = TcpStream::connect_timeout(&server_addr, Duration::from_secs(5))
        .map_err(|e| format!("connect to {server_addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut writer = stream;
    let ip = writer.local_addr().map_err(|e| e.to_string())?.ip();
    let dev = open_device(&a.engine, SocketAddr::new(ip, 0))?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let err = |e: braid::ResourceError| e.to_string();
    let qp = make_qp(&pd, &cq, a.engine.encrypt).map_err(err)?;
    let mr = pd
        .alloc_mr(
            local_len.max(8) as usize,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .map_err(err)?;
    // The further QPs of `--qps`, each with a completion queue and a region of its own.
    let mut more = Vec::with_capacity(usize::from(a.qps - 1));
    for _ in 1..a.qps {
        let q_cq = dev.create_cq();
        let q = make_qp(&pd, &q_cq, a.engine.encrypt).map_err(err)?;
        let m = pd
            .alloc_mr(
                local_len.max(8) as usize,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )
            .map_err(err)?;
        more.push((q, q_cq, m));
    }
    let hello = Hello {
        test: test.name().to_string(),
        size,
        region_len: remote_len.max(8),
        paths: a.engine.paths,
        max_datagram: a.engine.max_datagram,
        burst: a.engine.burst,
        ack_every: a.engine.ack_every,
        qp: qp.info().into(),
        shards: u16::try_from(dev.shards()).ok(),
        more_qps: more.iter().map(|(q, _, _)| q.info().into()).collect(),
    };
    wire::send_line(&mut writer, &hello)?;
    let welcome: Welcome = wire::recv_line(&mut reader)?;
    if let Some(e) = welcome.error {
        return Err(format!("server refused: {e}"));
    }
    let peer_qp = welcome.qp.ok_or("server sent no QP")?;
    qp.connect(peer_qp.into()).map_err(err)?;
    if welcome.more.len() != more.len() {
        return Err(format!(
            "server answered {} of the {} further QPs (an older server?)",
            welcome.more.len(),
            more.len()
        ));
    }
    for ((q, _, _), r) in more.iter().zip(&welcome.more) {
        q.connect(r.qp.into()).map_err(err)?;
    }
    let conn = Conn {
        qp: &qp,
        cq: &cq,
        local: &mr,
        rkey: welcome.rkey,
        remote_len: welcome.region_len,
    };
    let more_conns: Vec<Conn<'_>> = more
        .iter()
        .zip(&welcome.more)
        .map(|((q, c, m), r)| Conn {
            qp: q,
            cq: c,
            local: m,
            rkey: r.rkey,
            remote_len: welcome.region_len,
        })
        .collect();
    if !a.json {
        println!(
            "braid-perf client: {} -> {} (server device {}), backend {}, datapath {}, {} paths, {} B datagrams ({} B payload per packet){}",
            dev.local_addr(),
            server_addr,
            peer_qp.addr,
            dev.backend_report(),
            dev.datapath_report(),
            a.engine.paths,
            a.engine.max_datagram,
            payload_per_packet(&dev, a.engine.encrypt),
            if a.engine.encrypt {
                ", encrypted (AES-256-GCM)"
            } else {
                ""
            }
        );
    }
    let progress = !a.quiet;
    let mut rep = ClientReport {
        test: test.name().to_string(),
        datapath: dev.datapath_kind().to_string(),
        progress: dev.progress().name().to_string(),
        paths: a.engine.paths,
        max_datagram: a.engine.max_datagram,
        size,
        encrypted: a.engine.encrypt,
        verified: true,
        ..ClientReport::default()
    };
    let outcome = (|| -> Result<(), String> {
        if test.is_lat() {
            let iters = match (a.iters, a.duration) {
                (Some(0), _) => return Err("--iters must be at least 1".into()),
                (Some(n), _) => n,
                (None, Some(_)) => {
                    return Err("latency tests count round trips: use --iters".into());
                }
                (None, None) => 10_000,
            };
            let warmup = (iters / 10).clamp(10, 1000);
            let lat = match test {
                Test::WriteLat => run::run_write_lat(
                    &conn,
                    size32,
                    iters,
                    warmup,
                    progress,
                    !a.lat_wait,
                    &mut NoCheck,
                )?,
                Test::ReadLat => {
                    run::run_read_lat(&conn, size32, (iters, warmup), progress, !a.lat_wait)?
                }
                Test::AtomicLat => {
                    run::run_atomic_lat(&conn, (iters, warmup), progress, !a.lat_wait)?
                }
                _ => run::run_send_lat(&conn, size32, iters, warmup, progress)?,
            };
            let secs = lat.lat.mean_us * lat.iterations as f64 / 1e6;
            let bw = BwResult::new(&lat.op, size, lat.iterations, secs, 1);
            rep.iterations = lat.iterations;
            rep.bw_gbps = bw.bw_gbps;
            rep.msg_rate = bw.msg_rate;
            rep.verified = lat.mismatches == 0;
            if !a.json {
                let title = match test {
                    Test::WriteLat => {
                        "RDMA WRITE latency: post signaled WRITE, spin on the CQ until its completion (one RTT)"
                    }
                    Test::ReadLat => {
                        "RDMA READ latency: post signaled READ, spin on the CQ until its completion (one RTT)"
                    }
                    Test::AtomicLat => {
                        "RDMA atomic latency: post signaled 8 B fetch-and-add, spin on the CQ until its completion (one RTT)"
                    }
                    _ => "SEND latency: ping-pong, the server echoes each SEND (one RTT)",
                };
                report::print_lat(title, &lat);
            }
            rep.lat = Some(lat.lat);
        } else {
            let default_secs = if test == Test::Sweep { 1.0 } else { 5.0 };
            let limit = limit_of(a.iters, a.duration.unwrap_or(default_secs))?;
            let op = match test {
                Test::ReadBw => BwOp::Read,
                Test::SendBw => BwOp::Send,
                _ => BwOp::Write,
            };
            if !a.json {
                let title = match test {
                    Test::ReadBw => "RDMA READ bandwidth".to_string(),
                    Test::SendBw => {
                        "SEND bandwidth (the server reposts each receive as it completes)"
                            .to_string()
                    }
                    Test::Sweep => "RDMA WRITE bandwidth sweep".to_string(),
                    _ => "RDMA WRITE bandwidth".to_string(),
                };
                let title = if a.cq_mod > 1 {
                    format!("{title}, every {}th work request signaled", a.cq_mod)
                } else {
                    title
                };
                report::print_bw_header(&title);
            }
            for &s in &sizes {
                let window = window_of(s);
                let spec = BwSpec {
                    op,
                    size: to_u32(s)?,
                    limit,
                    window,
                    slots: match op {
                        BwOp::Send => 0,
                        _ => a.slots.map_or(0, |n| n.min(window as u64) as usize),
                    },
                    busy_poll: a.busy_poll,
                    progress,
                    signal_every: a.cq_mod,
                };
                let mut r = if a.verify && op == BwOp::Read {
                    let mut chk = ReadCheck {
                        local: &mr,
                        size: s as usize,
                        got: vec![0; s as usize],
                        want: vec![0; s as usize],
                        scratch: vec![0; s as usize],
                    };
                    run::run_bw(&conn, &spec, &mut chk)?
                } else if a.verify && op == BwOp::Write {
                    let mut chk = WriteFill {
                        local: &mr,
                        buf: vec![0; s as usize],
                    };
                    let mut r = run::run_bw(&conn, &spec, &mut chk)?;
                    let scratch = pd.alloc_mr(s as usize, Access::LOCAL_WRITE).map_err(err)?;
                    r.verified_bytes =
                        read_back(&conn, &scratch, r.window.min(r.iterations as usize), s)?;
                    r
                } else if !more_conns.is_empty() {
                    run_bw_together(&conn, &more_conns, &spec)?
                } else {
                    run::run_bw(&conn, &spec, &mut NoCheck)?
                };
                if r.mismatches > 0 {
                    rep.verified = false;
                }
                r.op = op.name().to_string();
                if !a.json {
                    report::print_bw_row(&r);
                    let _ = std::io::stdout().flush();
                }
                rep.iterations += r.iterations;
                rep.results.push(r);
            }
            if let Some(last) = rep.results.last() {
                rep.bw_gbps = last.bw_gbps;
                rep.msg_rate = last.msg_rate;
            }
            if test != Test::Sweep {
                rep.results.clear();
            }
        }
        Ok(())
    })();
    // Tell the server we are done either way, and collect its counters.
    let _ = wire::send_line(&mut writer, &Done { done: true });
    let bye: Result<Bye, String> = wire::recv_line(&mut reader);
    outcome?;
    rep.paths_client = report::path_rows(&dev.path_stats());
    rep.rtt_client = dev.rtt_summary().into();
    rep.qps
        .extend(qp.stats().map(|st| QpTelemetry::new("client", &st)));
    if let Ok(b) = bye {
        rep.paths_server = b.paths;
        rep.qps.extend(b.qp);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&rep).map_err(|e| e.to_string())?
        );
    } else {
        report::print_paths("Client device paths", &rep.paths_client);
        report::print_paths("Server device paths", &rep.paths_server);
        for t in &rep.qps {
            report::print_qp_telemetry(t);
        }
        let st = dev.stats();
        println!("{}", "-".repeat(96));
        println!(
            " client: tx {} rx {} datagrams, {} retransmits, {} RTOs, {} duplicates; data check: {}",
            st.tx_datagrams,
            st.rx_datagrams,
            st.retransmits,
            st.rto_fired,
            st.rx_duplicates,
            if !rep.verified {
                "FAILED"
            } else if a.verify || test == Test::SendLat {
                "passed"
            } else {
                "not requested (--verify)"
            }
        );
        if let Some(c) = report::datapath_counters(&dev.datapath_counters()) {
            println!(" client datapath: {c}");
        }
    }
    Ok(rep.verified)
}
