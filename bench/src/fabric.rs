//! Fabric-scale simulation for `braid-fabric`: the scenarios, the driver and the reports
//! live in [`braid::testing::sim::fabric`] (re-exported here, so `braid_bench::fabric` keeps
//! its names); this module adds what is the bench's own: the wall and CPU time of a run
//! ([`run`]) and the speed of the fabric model alone ([`raw_fabric_speed`]).
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

pub use braid::testing::sim::fabric::*;

use braid::datapath::Ecn;
use braid::datapath::fabric::{HostId, LeafSpine};
use braid::datapath::net::Network;
use braid::proto::Timestamp;

/// Runs `scenario` to completion (or its time limit) and reports, with the wall and CPU time
/// the run took (the simulator's speed: datagrams per CPU second of the process).
pub fn run(scenario: &Scenario) -> Report {
    let wall = Instant::now();
    let cpu = process_cpu_seconds();
    let mut sim = Sim::new(scenario);
    sim.run();
    let wall_s = wall.elapsed().as_secs_f64();
    let cpu_s = match (cpu, process_cpu_seconds()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => wall_s,
    };
    sim.report(wall_s, cpu_s)
}

/// CPU time of this process so far, seconds: user plus system time of all its threads, from
/// `/proc/self/stat` (in clock ticks, 10 ms here); `None` where that file does not exist.
/// The simulation runs on one thread, so this is the CPU time the run cost, whatever else
/// the machine was doing (wall time is not: on a loaded machine it counts other processes'
/// turns).
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// The fabric alone, without engines: every host sends `packets_per_host` datagrams of
/// `payload` bytes at line rate to another host (a random derangement), round-robin over 16
/// paths. Returns `(datagrams, hops, CPU seconds)`: the model's own speed.
pub fn raw_fabric_speed(
    ls: &LeafSpine,
    packets_per_host: u64,
    payload: usize,
    seed: u64,
) -> (u64, u64, f64) {
    let wall = Instant::now();
    let cpu = process_cpu_seconds();
    let mut fabric = ls.build(seed);
    let n = ls.hosts();
    let perm = derangement(n, seed);
    let frame = (payload + ls.fabric.frame_overhead_bytes as usize) as u64;
    let gap = (frame * 8 * 1_000_000_000).div_ceil(gbps_bps(ls.host_link_gbps).max(1));
    let mut sent = vec![0u64; n];
    let mut sends: BinaryHeap<Reverse<(u64, usize)>> = (0..n).map(|h| Reverse((0, h))).collect();
    loop {
        let ts = sends.peek().map(|Reverse((t, _))| *t);
        let tf = fabric.next_event().map(Timestamp::as_nanos);
        let now = match (ts, tf) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        while let Some(d) = fabric.poll_deliver(Timestamp::from_nanos(now)) {
            fabric.recycle(d.bytes);
        }
        while let Some(&Reverse((t, h))) = sends.peek() {
            if t > now {
                break;
            }
            sends.pop();
            let buf = fabric.buffer(payload);
            let path = (sent[h] % 16) as u16;
            let (at, dest) = (Timestamp::from_nanos(now), ls.host_addr(perm[h]));
            fabric.send_buf(at, HostId(h as u32), dest, path, Ecn::Ect0, buf);
            sent[h] += 1;
            if sent[h] < packets_per_host {
                sends.push(Reverse((now + gap, h)));
            }
        }
    }
    let s = fabric.stats();
    let wall_s = wall.elapsed().as_secs_f64();
    let secs = match (cpu, process_cpu_seconds()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => wall_s,
    };
    (s.sent, s.hops, secs)
}

fn gbps_bps(gbps: f64) -> u64 {
    (gbps * 1e9).round().max(0.0) as u64
}
