//! `xdp-blast`: the AF_XDP frame rate of a link through Braid's own AF_XDP datapath
//! (`braid::datapath::xdp`: its UMEM, rings, frame writer and steering program) with no
//! protocol on top: the reference Braid's AF_XDP WRITE bandwidth is held against.
//!
//! `xdp-blast recv --bind IP:PORT [--json]` binds an AF_XDP datapath to the interface that
//! owns IP, counts the UDP datagrams steered to PORT and recycles their frames; once the sender
//! has been silent for `--idle` seconds it reports what arrived between the first and the last.
//!
//! `xdp-blast send IP:PORT --bind IP:PORT [--size 1472] [--paths 16] [--batch 64]
//! [--duration 3]` binds an AF_XDP datapath on its side and hands it batches of `--batch`
//! datagrams of `--size` payload bytes (round-robin over `--paths` source ports) for
//! `--duration` seconds. Each frame still gets its Ethernet/IPv4/UDP headers and UDP checksum
//! written by the datapath (the work Braid's sends pay too); the payload buffer is built once.
//!
//! Both print one JSON object with `--json`: datagrams, payload bytes, seconds, Gbit/s of UDP
//! payload, Gbit/s of Ethernet frames (payload + 42 header bytes) and Mpps. Needs root.
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use braid::datapath::xdp::{XdpConfig, XdpDatapath, XdpStats};
use braid::datapath::{Datapath, Ecn, RecvBatch, Transmit};
use clap::{Parser, Subcommand};
use serde::Serialize;

/// Ethernet (14), IPv4 (20) and UDP (8) header bytes in front of each payload.
const FRAME_HEADERS: u64 = 42;

/// The most datagrams handed to one `send` call.
const MAX_BATCH: usize = 1024;

#[derive(Parser)]
#[command(
    name = "xdp-blast",
    about = "AF_XDP frame-rate ceiling through Braid's AF_XDP datapath"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Count datagrams arriving on an AF_XDP socket; report after the sender went quiet.
    Recv {
        /// Local IPv4 address and UDP port to receive on.
        #[arg(long)]
        bind: SocketAddr,
        /// Seconds of silence after which the run is over.
        #[arg(long, default_value_t = 1.0)]
        idle: f64,
        /// Seconds to wait for the first datagram before giving up.
        #[arg(long, default_value_t = 120.0)]
        first_wait: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Blast datagrams from an AF_XDP socket.
    Send {
        /// Receiver address.
        target: SocketAddr,
        /// Local IPv4 address and UDP port to send from (path 0's port).
        #[arg(long)]
        bind: SocketAddr,
        /// UDP payload bytes per datagram.
        #[arg(long, default_value_t = 1472)]
        size: usize,
        /// Source ports used round-robin.
        #[arg(long, default_value_t = 16)]
        paths: u16,
        /// Datagrams per `send` call.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Seconds to send.
        #[arg(long, default_value_t = 3.0)]
        duration: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Serialize)]
struct Report {
    test: &'static str,
    interface: String,
    frame_size: u32,
    size: usize,
    paths: u16,
    datagrams: u64,
    bytes: u64,
    seconds: f64,
    gbps: f64,
    frame_gbps: f64,
    mpps: f64,
    /// The datapath's counters (kernel drops, skipped datagrams) at the end.
    stats: StatsReport,
}

#[derive(Serialize)]
struct StatsReport {
    sent: u64,
    received: u64,
    rx_rejected: u64,
    tx_unroutable: u64,
    tx_oversize: u64,
    tx_kick_errors: u64,
    kernel_rx_dropped: u64,
    kernel_fill_ring_empty: u64,
    kernel_tx_invalid: u64,
}

impl From<XdpStats> for StatsReport {
    fn from(s: XdpStats) -> Self {
        StatsReport {
            sent: s.sent,
            received: s.received,
            rx_rejected: s.rx_rejected,
            tx_unroutable: s.tx_unroutable,
            tx_oversize: s.tx_oversize,
            tx_kick_errors: s.tx_kick_errors,
            kernel_rx_dropped: s.kernel_rx_dropped,
            kernel_fill_ring_empty: s.kernel_fill_ring_empty,
            kernel_tx_invalid: s.kernel_tx_invalid,
        }
    }
}

fn rates(datagrams: u64, bytes: u64, seconds: f64) -> (f64, f64, f64) {
    if seconds <= 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let frame_bytes = bytes + datagrams * FRAME_HEADERS;
    (
        bytes as f64 * 8.0 / seconds / 1e9,
        frame_bytes as f64 * 8.0 / seconds / 1e9,
        datagrams as f64 / seconds / 1e6,
    )
}

fn bind(local: SocketAddr, paths: u16) -> Result<XdpDatapath, String> {
    XdpDatapath::bind(XdpConfig::new(local, paths)).map_err(|e| format!("AF_XDP on {local}: {e}"))
}

fn recv(local: SocketAddr, idle: f64, first_wait: f64) -> Result<Report, String> {
    let (idle, first_wait) = braid_bench::blast::receiver_waits(idle, first_wait)?;
    let dp = bind(local, 1)?;
    eprintln!(
        "xdp-blast: receiving on {local} ({}, {} queue(s), frames of {} B)",
        dp.interface(),
        dp.queues(),
        dp.frame_size()
    );
    // Only the length matters: it bounds the datagrams one call hands out.
    let mut scratch = RecvBatch::new(256, 0);
    let started_wait = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let (mut datagrams, mut bytes) = (0u64, 0u64);
    let (mut first_datagrams, mut first_bytes) = (0u64, 0u64);
    loop {
        let (mut d, mut b) = (0u64, 0u64);
        dp.recv_with(
            &mut scratch,
            Some(Duration::from_millis(50)),
            &mut |m, _| {
                d += 1;
                b += m.len as u64;
            },
        )
        .map_err(|e| format!("receive: {e}"))?;
        let now = Instant::now();
        if d == 0 {
            if first.is_some() && now.duration_since(last) >= idle {
                break;
            }
            if first.is_none() && started_wait.elapsed() >= first_wait {
                return Err(format!(
                    "nothing arrived on {local} for {} s",
                    first_wait.as_secs_f64()
                ));
            }
            continue;
        }
        datagrams += d;
        bytes += b;
        if first.is_none() {
            first = Some(now);
            first_datagrams = d;
            first_bytes = b;
        }
        last = now;
    }
    // The rate covers what arrived after the first call, over the time since it returned.
    let seconds = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let (gbps, frame_gbps, mpps) = rates(datagrams - first_datagrams, bytes - first_bytes, seconds);
    Ok(Report {
        test: "xdp_blast_recv",
        interface: dp.interface().to_string(),
        frame_size: dp.frame_size(),
        size: bytes.checked_div(datagrams).unwrap_or(0) as usize,
        paths: 1,
        datagrams,
        bytes,
        seconds,
        gbps,
        frame_gbps,
        mpps,
        stats: dp.stats().into(),
    })
}

struct SendArgs {
    target: SocketAddr,
    local: SocketAddr,
    size: usize,
    paths: u16,
    batch: usize,
    duration: f64,
}

fn send(a: SendArgs) -> Result<Report, String> {
    if a.batch == 0 || a.batch > MAX_BATCH {
        return Err(format!("--batch must be 1 to {MAX_BATCH}"));
    }
    if !(a.duration > 0.0 && a.duration < 3600.0) {
        return Err("--duration must be between 0 and 3600 seconds".into());
    }
    let dp = bind(a.local, a.paths)?;
    if a.size == 0 || a.size > dp.max_payload() {
        return Err(format!(
            "--size must be 1 to {} on {} (its MTU minus 28)",
            dp.max_payload(),
            dp.interface()
        ));
    }
    let payload: Vec<u8> = (0..a.size).map(|i| (i % 251) as u8).collect();
    let paths = dp.paths();
    let batch: Vec<Transmit<'_>> = (0..a.batch)
        .map(|i| Transmit {
            dest: a.target,
            path: (i % usize::from(paths)) as u16,
            ecn: Ecn::NotEct,
            contents: &payload,
        })
        .collect();
    let duration = Duration::from_secs_f64(a.duration);
    let start = Instant::now();
    let mut datagrams = 0u64;
    while start.elapsed() < duration {
        datagrams += dp.send(&batch).map_err(|e| format!("send: {e}"))? as u64;
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats: StatsReport = dp.stats().into();
    // Skipped datagrams count as sent in `send`'s return value; report only real frames.
    let skipped = stats.tx_unroutable + stats.tx_oversize;
    if skipped > 0 && stats.sent == 0 {
        return Err(format!(
            "no frame left: {skipped} datagrams skipped (no route or neighbour for {} on {}?)",
            a.target,
            dp.interface()
        ));
    }
    let datagrams = datagrams.saturating_sub(skipped);
    let bytes = datagrams * a.size as u64;
    let (gbps, frame_gbps, mpps) = rates(datagrams, bytes, seconds);
    Ok(Report {
        test: "xdp_blast_send",
        interface: dp.interface().to_string(),
        frame_size: dp.frame_size(),
        size: a.size,
        paths,
        datagrams,
        bytes,
        seconds,
        gbps,
        frame_gbps,
        mpps,
        stats,
    })
}

fn main() -> ExitCode {
    let (res, json) = match Cli::parse().cmd {
        Cmd::Recv {
            bind,
            idle,
            first_wait,
            json,
        } => (recv(bind, idle, first_wait), json),
        Cmd::Send {
            target,
            bind,
            size,
            paths,
            batch,
            duration,
            json,
        } => (
            send(SendArgs {
                target,
                local: bind,
                size,
                paths,
                batch,
                duration,
            }),
            json,
        ),
    };
    braid_bench::blast::finish("xdp-blast", res, json, |r| {
        format!(
            "{} on {}: {} datagrams of {} B in {:.3} s: {:.3} Mpps, {:.2} Gbit/s payload, {:.2} Gbit/s frames",
            r.test, r.interface, r.datagrams, r.size, r.seconds, r.mpps, r.gbps, r.frame_gbps
        )
    })
}
