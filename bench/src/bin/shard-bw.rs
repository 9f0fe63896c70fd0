//! `shard-bw`: RDMA WRITE bandwidth of several QPs between two devices in one process, to
//! compare engine shard counts (`DeviceConfig::shards`).
//!
//! `shard-bw [--shards 2] [--qps 2] [--size 1M] [--window 8] [--duration 3] [--bind 127.0.0.1]
//! [--peer-bind IP] [--datapath udp] [--json]` opens a sender and a receiver device with
//! `--shards` shards each, connects `--qps` QP pairs (spread round robin over the shards),
//! and runs one posting thread per QP, each with `--window` WRITEs of `--size` bytes in
//! flight on a CQ of its own, for `--duration` seconds. It prints the total and per-QP
//! Gbit/s of payload (one JSON object with `--json`).
use std::process::ExitCode;
use std::time::{Duration, Instant};

use braid::{Access, DatapathKind, Device, DeviceConfig, SendOp, SendWr, WcStatus};
use clap::Parser;
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "shard-bw",
    about = "WRITE bandwidth of several QPs over sharded devices"
)]
struct Cli {
    /// Engine shards per device.
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// QP pairs, one posting thread each.
    #[arg(long, default_value_t = 2)]
    qps: usize,
    /// WRITE size in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    size: u32,
    /// WRITEs in flight per QP.
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// IP address of the sending device.
    #[arg(long, default_value = "127.0.0.1")]
    bind: std::net::IpAddr,
    /// IP address of the receiving device (default: --bind).
    #[arg(long)]
    peer_bind: Option<std::net::IpAddr>,
    /// Datapath of both devices: udp or uring.
    #[arg(long, default_value = "udp")]
    datapath: DatapathKind,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    shards: usize,
    qps: usize,
    size: u32,
    seconds: f64,
    gbit_s: f64,
    per_qp_gbit_s: Vec<f64>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(r) => {
            if cli.json {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
            } else {
                println!(
                    "shard-bw: {} shards, {} QPs, {} B WRITEs: {:.2} Gbit/s (per QP: {:?})",
                    r.shards, r.qps, r.size, r.gbit_s, r.per_qp_gbit_s
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("shard-bw: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<Report, String> {
    let open = |ip| {
        let cfg = DeviceConfig::udp(std::net::SocketAddr::new(ip, 0))
            .datapath(cli.datapath)
            .shards(cli.shards);
        Device::open(cfg).map_err(|e| e.to_string())
    };
    let a = open(cli.bind)?;
    let b = open(cli.peer_bind.unwrap_or(cli.bind))?;
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let len = cli.size as usize * cli.window;
    let mut qps = Vec::new();
    for _ in 0..cli.qps {
        let (ca, cb) = (a.create_cq(), b.create_cq());
        let qa = pa.create_qp(&ca, &ca).map_err(|e| e.to_string())?;
        let qb = pb.create_qp(&cb, &cb).map_err(|e| e.to_string())?;
        qa.connect(qb.info()).map_err(|e| e.to_string())?;
        qb.connect(qa.info()).map_err(|e| e.to_string())?;
        let src = pa.alloc_mr(len, Access::NONE).map_err(|e| e.to_string())?;
        let dst = pb
            .alloc_mr(len, Access::REMOTE_WRITE)
            .map_err(|e| e.to_string())?;
        qps.push((qa, ca, src, dst, qb, cb));
    }
    let deadline = Duration::from_secs_f64(cli.duration);
    let start = Instant::now();
    let bytes: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let workers: Vec<_> = qps
            .iter()
            .map(|(qp, cq, src, dst, _, _)| {
                s.spawn(move || {
                    let wr = |i: u64| {
                        let off = (i % cli.window as u64) * u64::from(cli.size);
                        SendWr {
                            wr_id: i,
                            op: SendOp::Write(dst.remote(off)),
                            sges: vec![src.sge(off, cli.size)],
                            signaled: true,
                        }
                    };
                    let (mut posted, mut done) = (0u64, 0u64);
                    while posted < cli.window as u64 {
                        qp.post_send(wr(posted)).map_err(|e| format!("{e:?}"))?;
                        posted += 1;
                    }
                    while done < posted {
                        let c = cq
                            .wait(Duration::from_secs(20))
                            .ok_or("no completion for 20 s")?;
                        if c.status != WcStatus::Success {
                            return Err(format!("WRITE {}: {:?}", c.wr_id, c.status));
                        }
                        done += 1;
                        if start.elapsed() < deadline {
                            qp.post_send(wr(posted)).map_err(|e| format!("{e:?}"))?;
                            posted += 1;
                        }
                    }
                    Ok(done * u64::from(cli.size))
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let per_qp: Vec<f64> = bytes
        .into_iter()
        .map(|b| b.map(|b| b as f64 * 8.0 / seconds / 1e9))
        .collect::<Result<_, _>>()?;
    Ok(Report {
        shards: a.shards(),
        qps: cli.qps,
        size: cli.size,
        seconds,
        gbit_s: per_qp.iter().sum(),
        per_qp_gbit_s: per_qp.iter().map(|g| (g * 100.0).round() / 100.0).collect(),
    })
}
