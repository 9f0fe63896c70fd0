//! `braid-perf client` against a real `braid-perf server` on loopback, both processes as a user
//! runs them: a bandwidth test over several QPs (and shards), and the latency tests.
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const PERF: &str = env!("CARGO_BIN_EXE_braid-perf");

/// A server for one client on an ephemeral port of 127.0.0.1, and the address it listens on.
fn server() -> (Child, String) {
    let mut child = Command::new(PERF)
        .args(["server", "--bind", "127.0.0.1:0", "--once"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn braid-perf server");
    let stderr = child.stderr.take().expect("server stderr");
    let mut line = String::new();
    BufReader::new(stderr)
        .read_line(&mut line)
        .expect("the server's first line");
    // "braid-perf server: listening on 127.0.0.1:PORT (TCP bootstrap), ..."
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, addr)
}

/// Runs `braid-perf client` with `args` against a fresh server and returns its JSON report.
fn client(args: &[&str]) -> serde_json::Value {
    let (mut srv, addr) = server();
    let out = Command::new(PERF)
        .args(["client", &addr, "--json", "--quiet"])
        .args(args)
        .output()
        .expect("run braid-perf client");
    let _ = srv.wait();
    assert!(
        out.status.success(),
        "client {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON report")
}

#[test]
fn write_and_read_bandwidth_run_on_several_qps_and_shards() {
    for test in ["write_bw", "read_bw"] {
        for shards in ["1", "2"] {
            let rep = client(&[
                "--test", test, "--size", "64K", "--iters", "40", "--qps", "3", "--shards", shards,
            ]);
            // Every QP ran the whole count: the report sums them.
            assert_eq!(rep["iterations"], 120, "{test}, {shards} shard(s): {rep}");
            let bw = rep["bw_gbps"].as_f64().expect("bw_gbps");
            assert!(bw > 0.0, "{test}, {shards} shard(s): {bw} Gbit/s");
        }
    }
}

#[test]
fn a_test_of_one_qp_refuses_more() {
    let out = Command::new(PERF)
        .args(["client", "127.0.0.1:1", "--test", "write_lat", "--qps", "2"])
        .output()
        .expect("run braid-perf client");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--qps 2"), "{err}");
}

#[test]
fn every_latency_test_counts_its_round_trips() {
    for (test, size) in [
        ("write_lat", "8"),
        ("read_lat", "8"),
        ("read_lat", "64K"),
        ("atomic_lat", "8"),
        ("send_lat", "8"),
    ] {
        let rep = client(&["--test", test, "--size", size, "--iters", "200"]);
        assert_eq!(rep["iterations"], 200, "{test} {size}: {rep}");
        assert_eq!(rep["verified"], true, "{test} {size}: {rep}");
        let p50 = rep["lat"]["p50_us"].as_f64().expect("p50_us");
        assert!(p50 > 0.0, "{test} {size}: {rep}");
    }
}
