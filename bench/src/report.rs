//! Result shapes (serialised as JSON) and perftest-like text tables.
use braid::PathStats;
use serde::{Deserialize, Serialize};

use crate::stats::Latency;

/// One path's counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PathRow {
    /// Path index (UDP source port index).
    pub path: usize,
    /// Data packets sent on it (first transmissions and retransmissions).
    pub packets: u64,
    /// Packets sent on it that were declared lost.
    pub lost: u64,
    /// Retransmissions sent on it.
    pub retransmits: u64,
    /// Smoothed RTT on it, µs (0 before any sample).
    pub srtt_us: f64,
    /// RTT samples taken on it.
    pub rtt_samples: u64,
}

/// Converts a device's per-path counters.
pub fn path_rows(stats: &[PathStats]) -> Vec<PathRow> {
    stats
        .iter()
        .enumerate()
        .map(|(path, p)| PathRow {
            path,
            packets: p.packets,
            lost: p.lost,
            retransmits: p.retransmits,
            srtt_us: p.srtt_ns as f64 / 1000.0,
            rtt_samples: p.rtt_samples,
        })
        .collect()
}

/// Result of a bandwidth run (or of the bandwidth half of a latency run).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct BwResult {
    /// `write`, `read` or `send`.
    pub op: String,
    /// Message size, bytes.
    pub size: u64,
    /// Messages completed.
    pub iterations: u64,
    /// Wall time from the first post to the last completion, s.
    pub seconds: f64,
    /// Payload bandwidth, Gbit/s (10^9 bit/s).
    pub bw_gbps: f64,
    /// Payload bandwidth, MiB/s.
    pub bw_mib_s: f64,
    /// Messages per second.
    pub msg_rate: f64,
    /// Outstanding work requests allowed.
    pub window: usize,
    /// Bytes whose content was checked end to end.
    pub verified_bytes: u64,
    /// Messages whose content did not match.
    pub mismatches: u64,
}

impl BwResult {
    /// Fills in the derived rates.
    pub fn new(op: &str, size: u64, iterations: u64, seconds: f64, window: usize) -> BwResult {
        let bytes = (size * iterations) as f64;
        let s = seconds.max(1e-9);
        BwResult {
            op: op.to_string(),
            size,
            iterations,
            seconds,
            bw_gbps: bytes * 8.0 / s / 1e9,
            bw_mib_s: bytes / s / (1024.0 * 1024.0),
            msg_rate: iterations as f64 / s,
            window,
            verified_bytes: 0,
            mismatches: 0,
        }
    }
}

/// Result of a latency run.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LatResult {
    /// `write` or `send`.
    pub op: String,
    /// Message size, bytes.
    pub size: u64,
    /// Timed round trips.
    pub iterations: u64,
    /// Percentiles.
    pub lat: Latency,
    /// Round trips whose content did not match.
    pub mismatches: u64,
}

/// What `braid-perf client --json` prints: one object per run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClientReport {
    /// Test name (`write_bw`, `write_lat`, `read_bw`, `send_lat`, `sweep`).
    pub test: String,
    /// Datapath in use.
    pub datapath: String,
    /// Paths per connection.
    pub paths: u16,
    /// Largest datagram.
    pub max_datagram: usize,
    /// Message size (the largest, for a sweep).
    pub size: u64,
    /// Whether the connection was encrypted (`--encrypt`).
    pub encrypted: bool,
    /// Messages or round trips completed (for a sweep: summed).
    pub iterations: u64,
    /// Bandwidth, Gbit/s (bandwidth tests; for latency tests, the payload rate achieved).
    pub bw_gbps: f64,
    /// Messages per second.
    pub msg_rate: f64,
    /// Latency percentiles (latency tests).
    pub lat: Option<Latency>,
    /// Sweep rows (sweep only).
    pub results: Vec<BwResult>,
    /// The client device's per-path counters (it sends WRITE and SEND data).
    pub paths_client: Vec<PathRow>,
    /// The server device's per-path counters (it sends READ responses and echoes).
    pub paths_server: Vec<PathRow>,
    /// Whether every check that ran passed.
    pub verified: bool,
}

/// Prints a bandwidth table header.
pub fn print_bw_header(title: &str) {
    println!("{}", "-".repeat(96));
    println!(" {title}");
    println!("{}", "-".repeat(96));
    println!(
        " {:>9} {:>11} {:>9} {:>13} {:>12} {:>14} {:>7} {:>10}",
        "#bytes",
        "#iterations",
        "seconds",
        "BW [Gbit/s]",
        "BW [MiB/s]",
        "MsgRate [/s]",
        "window",
        "verified"
    );
}

/// Prints one bandwidth row.
pub fn print_bw_row(r: &BwResult) {
    let v = if r.mismatches > 0 {
        format!("{} BAD", r.mismatches)
    } else if r.verified_bytes > 0 {
        "ok".to_string()
    } else {
        "-".to_string()
    };
    println!(
        " {:>9} {:>11} {:>9.3} {:>13.3} {:>12.1} {:>14.0} {:>7} {:>10}",
        r.size, r.iterations, r.seconds, r.bw_gbps, r.bw_mib_s, r.msg_rate, r.window, v
    );
}

/// Prints a latency table (header and row).
pub fn print_lat(title: &str, r: &LatResult) {
    println!("{}", "-".repeat(96));
    println!(" {title}");
    println!("{}", "-".repeat(96));
    println!(
        " {:>7} {:>11} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>9}",
        "#bytes",
        "#iterations",
        "t_min[us]",
        "t_p50[us]",
        "t_avg[us]",
        "t_p99[us]",
        "t_p99.9[us]",
        "t_max[us]",
        "verified"
    );
    let l = &r.lat;
    let v = if r.mismatches > 0 {
        format!("{} BAD", r.mismatches)
    } else {
        "ok".to_string()
    };
    println!(
        " {:>7} {:>11} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>12.2} {:>10.2} {:>9}",
        r.size, r.iterations, l.min_us, l.p50_us, l.mean_us, l.p99_us, l.p999_us, l.max_us, v
    );
}

/// Prints a per-path table.
pub fn print_paths(title: &str, rows: &[PathRow]) {
    println!("{}", "-".repeat(96));
    println!(" {title}");
    println!(
        " {:>5} {:>12} {:>8} {:>12} {:>10} {:>12}",
        "path", "packets", "lost", "retransmits", "srtt[us]", "rtt samples"
    );
    let mut tot = PathRow::default();
    for r in rows {
        println!(
            " {:>5} {:>12} {:>8} {:>12} {:>10.1} {:>12}",
            r.path, r.packets, r.lost, r.retransmits, r.srtt_us, r.rtt_samples
        );
        tot.packets += r.packets;
        tot.lost += r.lost;
        tot.retransmits += r.retransmits;
        tot.rtt_samples += r.rtt_samples;
    }
    println!(
        " {:>5} {:>12} {:>8} {:>12} {:>10} {:>12}",
        "total", tot.packets, tot.lost, tot.retransmits, "", tot.rtt_samples
    );
}
