//! `udp-pingpong`: a plain kernel-UDP ping-pong, the baseline for Braid's round-trip latency.
//!
//! `udp-pingpong server [--bind ADDR]` echoes every datagram back to its sender until killed.
//! `udp-pingpong client ADDR [--size 8] [--iters 20000] [--json]` sends one datagram at a time,
//! waits for the echo, and reports RTT percentiles. Blocking receives by default (the kernel
//! wakes the thread, as Braid's progress thread is woken); `--busy-poll` spins instead, on
//! either side (`server --busy-poll` spins on a nonblocking socket too), so that the
//! baseline can be matched to each of Braid's polling modes.
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use braid_bench::stats::{self, Latency};
use clap::{Parser, Subcommand};
use serde::Serialize;

#[derive(Parser)]
#[command(name = "udp-pingpong", about = "kernel UDP ping-pong RTT baseline")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Echo every datagram back to its sender.
    Server {
        /// Address to bind.
        #[arg(long, default_value = "127.0.0.1:18600")]
        bind: SocketAddr,
        /// Spin on a nonblocking socket instead of blocking in recv.
        #[arg(long)]
        busy_poll: bool,
    },
    /// Measure round trips against a server.
    Client {
        /// Server address.
        server: SocketAddr,
        /// Datagram payload, bytes.
        #[arg(long, default_value_t = 8)]
        size: usize,
        /// Timed round trips.
        #[arg(long, default_value_t = 20_000)]
        iters: u64,
        /// Untimed round trips first.
        #[arg(long, default_value_t = 1_000)]
        warmup: u64,
        /// Spin on a nonblocking socket instead of blocking in recv.
        #[arg(long)]
        busy_poll: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Serialize)]
struct Report {
    test: &'static str,
    size: usize,
    iterations: u64,
    lost: u64,
    busy_poll: bool,
    #[serde(flatten)]
    lat: Latency,
}

fn server(bind: SocketAddr, busy: bool) -> Result<(), String> {
    let sock = UdpSocket::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    if busy {
        sock.set_nonblocking(true).map_err(|e| e.to_string())?;
    }
    eprintln!(
        "udp-pingpong server: echoing on {}{}",
        sock.local_addr().map_err(|e| e.to_string())?,
        if busy { " (busy polling)" } else { "" }
    );
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock && busy => {
                std::hint::spin_loop();
                continue;
            }
            Err(e) => return Err(format!("recv: {e}")),
        };
        let _ = sock.send_to(&buf[..n], from);
    }
}

fn client(
    server: SocketAddr,
    size: usize,
    iters: u64,
    warmup: u64,
    busy: bool,
    json: bool,
) -> Result<(), String> {
    if size == 0 || size > 65_507 {
        return Err("--size must be 1 to 65507".into());
    }
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let local: SocketAddr = if server.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(local).map_err(|e| format!("bind: {e}"))?;
    sock.connect(server)
        .map_err(|e| format!("connect {server}: {e}"))?;
    let timeout = Duration::from_millis(500);
    if busy {
        sock.set_nonblocking(true).map_err(|e| e.to_string())?;
    } else {
        sock.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
    }
    let mut out = vec![0u8; size];
    let mut inb = vec![0u8; 65_536];
    let mut samples = Vec::with_capacity(iters as usize);
    let mut lost = 0u64;
    let mut i = 0u64;
    while i < warmup + iters {
        out[..8.min(size)].copy_from_slice(&i.to_le_bytes()[..8.min(size)]);
        let t0 = Instant::now();
        sock.send(&out).map_err(|e| format!("send: {e}"))?;
        let got = loop {
            match sock.recv(&mut inb) {
                Ok(n) if inb[..n] == out[..] => break true,
                Ok(_) => continue, // a late echo of an earlier (timed-out) ping
                Err(e) if e.kind() == ErrorKind::WouldBlock && busy => {
                    if t0.elapsed() > timeout {
                        break false;
                    }
                    std::hint::spin_loop();
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    break false;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("recv: {e}")),
            }
        };
        let dt = t0.elapsed();
        if !got {
            lost += 1;
            if lost > 100 {
                return Err(format!(
                    "no echo from {server} (100 pings lost): is the server running?"
                ));
            }
            continue;
        }
        if i >= warmup {
            samples.push(dt.as_nanos() as u64);
        }
        i += 1;
    }
    let lat = stats::summarize(&mut samples);
    let rep = Report {
        test: "udp_pingpong",
        size,
        iterations: iters,
        lost,
        busy_poll: busy,
        lat,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string(&rep).map_err(|e| e.to_string())?
        );
    } else {
        let l = &rep.lat;
        println!(
            "udp ping-pong {} B x {}: min {:.2} us, p50 {:.2} us, avg {:.2} us, p99 {:.2} us, p99.9 {:.2} us, max {:.2} us ({} lost)",
            size, iters, l.min_us, l.p50_us, l.mean_us, l.p99_us, l.p999_us, l.max_us, lost
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let res = match Cli::parse().cmd {
        Cmd::Server { bind, busy_poll } => server(bind, busy_poll),
        Cmd::Client {
            server,
            size,
            iters,
            warmup,
            busy_poll,
            json,
        } => client(server, size, iters, warmup, busy_poll, json),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udp-pingpong: error: {e}");
            ExitCode::FAILURE
        }
    }
}
