//! Result shapes (serialised as JSON) and perftest-like text tables.
use braid::{PathStats, QpStats, RttSummary};
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

/// An RTT distribution, µs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RttRow {
    /// Samples recorded.
    pub samples: u64,
    /// Smallest sample (exact).
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample (exact).
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl From<RttSummary> for RttRow {
    fn from(r: RttSummary) -> RttRow {
        let us = |ns: u64| ns as f64 / 1000.0;
        RttRow {
            samples: r.samples,
            min_us: us(r.min_ns),
            p50_us: us(r.p50_ns),
            p99_us: us(r.p99_ns),
            p999_us: us(r.p999_ns),
            max_us: us(r.max_ns),
            mean_us: us(r.mean_ns),
        }
    }
}

/// One logical path of one QP.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct QpPathRow {
    /// Logical path index.
    pub path: usize,
    /// Device source port index it uses now (changes when PLB re-paths it).
    pub port: u16,
    /// Spraying weight (the weights sum to 1).
    pub weight: f64,
    /// Smoothed RTT on it, µs (0 before any sample).
    pub srtt_us: f64,
    /// Data packets sent on it (first transmissions and retransmissions).
    pub packets: u64,
    /// Packets sent on it that were declared lost.
    pub lost: u64,
    /// Retransmissions sent on it.
    pub retransmits: u64,
    /// CE marks charged to it.
    pub ce_marks: u64,
}

/// Congestion-control and reliability telemetry of one QP.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct QpTelemetry {
    /// Which QP (`client`, `server`).
    pub role: String,
    /// Congestion controller.
    pub controller: String,
    /// Congestion window, bytes.
    pub cwnd_bytes: u64,
    /// Pacing rate, Gbit/s, if the controller paces.
    pub pacing_gbps: Option<f64>,
    /// Smoothed RTT, µs.
    pub srtt_us: f64,
    /// Retransmit timeout, µs.
    pub rto_us: f64,
    /// Fabric RTT distribution (receiver holding time removed).
    pub rtt: RttRow,
    /// Data packets sent (first transmissions).
    pub packets_sent: u64,
    /// Retransmissions.
    pub retransmits: u64,
    /// Retransmit timeouts.
    pub rtos: u64,
    /// Losses declared that proved spurious.
    pub spurious_losses: u64,
    /// Retransmissions that proved unnecessary.
    pub spurious_retransmits: u64,
    /// CE marks reported by the peer.
    pub ce_marks: u64,
    /// PLB re-path events.
    pub repaths: u64,
    /// Per logical path.
    pub paths: Vec<QpPathRow>,
}

impl QpTelemetry {
    /// Converts a QP's counters.
    pub fn new(role: &str, st: &QpStats) -> QpTelemetry {
        QpTelemetry {
            role: role.to_string(),
            controller: st.cc.to_string(),
            cwnd_bytes: st.cwnd_bytes,
            pacing_gbps: st.pacing_rate.map(|r| r as f64 * 8.0 / 1e9),
            srtt_us: st.srtt_ns as f64 / 1000.0,
            rto_us: st.rto_ns as f64 / 1000.0,
            rtt: st.rtt.into(),
            packets_sent: st.packets_sent,
            retransmits: st.retransmits,
            rtos: st.rtos,
            spurious_losses: st.spurious_losses,
            spurious_retransmits: st.spurious_retransmits,
            ce_marks: st.ce_marks,
            repaths: st.repaths,
            paths: st
                .paths
                .iter()
                .enumerate()
                .map(|(path, p)| QpPathRow {
                    path,
                    port: st.path_ports.get(path).copied().unwrap_or(0),
                    weight: st.path_weights.get(path).copied().unwrap_or(0.0),
                    srtt_us: p.srtt_ns as f64 / 1000.0,
                    packets: p.packets,
                    lost: p.lost,
                    retransmits: p.retransmits,
                    ce_marks: p.ce_marks,
                })
                .collect(),
        }
    }
}

/// Prints one QP's telemetry block.
pub fn print_qp_telemetry(t: &QpTelemetry) {
    println!("{}", "-".repeat(96));
    let pacing = t
        .pacing_gbps
        .map_or("off".to_string(), |g| format!("{g:.3} Gbit/s"));
    println!(
        " QP telemetry ({}): cc {}, cwnd {} B, pacing {}, srtt {:.1} us, rto {:.0} us",
        t.role, t.controller, t.cwnd_bytes, pacing, t.srtt_us, t.rto_us
    );
    let r = &t.rtt;
    println!(
        "   rtt [us]: min {:.1} p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1} mean {:.1} ({} samples)",
        r.min_us, r.p50_us, r.p99_us, r.p999_us, r.max_us, r.mean_us, r.samples
    );
    println!(
        "   packets {}, retransmits {}, RTOs {}, spurious losses {} / retransmits {}, ECN marks {}, re-paths {}",
        t.packets_sent,
        t.retransmits,
        t.rtos,
        t.spurious_losses,
        t.spurious_retransmits,
        t.ce_marks,
        t.repaths
    );
    if t.paths.iter().all(|p| p.packets == 0) {
        return;
    }
    println!(
        "   {:>5} {:>5} {:>7} {:>10} {:>11} {:>8} {:>8} {:>8}",
        "path", "port", "weight", "srtt[us]", "packets", "lost", "rtx", "ce"
    );
    for p in &t.paths {
        println!(
            "   {:>5} {:>5} {:>7.3} {:>10.1} {:>11} {:>8} {:>8} {:>8}",
            p.path, p.port, p.weight, p.srtt_us, p.packets, p.lost, p.retransmits, p.ce_marks
        );
    }
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
    /// Who drove the client's device (`thread` or `inline`, `Progress::name`).
    pub progress: String,
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
    /// Telemetry of the client's QP and (if the server sent it) the server's.
    pub qps: Vec<QpTelemetry>,
    /// RTT distribution over every QP of the client device.
    pub rtt_client: RttRow,
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

/// A device's datapath counters (`Device::datapath_counters`) for a report line: the
/// non-zero ones as `name value` pairs, or `None` when every counter is zero or there are
/// none.
pub fn datapath_counters(counters: &[(&'static str, u64)]) -> Option<String> {
    let set: Vec<String> = counters
        .iter()
        .filter(|(_, v)| *v != 0)
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    (!set.is_empty()).then(|| set.join(", "))
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
