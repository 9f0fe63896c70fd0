//! The provider as libfabric applications see it: Debian's `fi_info` and `fi_pingpong`
//! (package libfabric-bin) load `libbraid_fi.so` through `FI_PROVIDER_PATH`.
//!
//! Without libfabric-bin these tests print `SKIPPED` loudly, and fail under CI (the `CI`
//! variable set), which installs it (`./scripts/libfabric.sh deps`). The namespace test also
//! needs root.
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest a fi_pingpong pair may run before the test gives up on it (a hang is a failure,
/// not a slow pass; this bounds the wait, it asserts nothing about speed).
const RUN_LIMIT: Duration = Duration::from_secs(600);

fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// Whether the libfabric tools are installed; prints SKIPPED (or fails under CI) if not.
fn require_tools(test: &str) -> bool {
    let ok = ["fi_info", "fi_pingpong"].iter().all(|t| {
        Command::new(t)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    });
    if !ok {
        assert!(
            !in_ci(),
            "{test}: fi_info/fi_pingpong (libfabric-bin) missing, and CI must run it"
        );
        eprintln!("SKIPPED {test}: needs fi_info and fi_pingpong (apt-get install libfabric-bin)");
    }
    ok
}

/// A fresh folder holding only the provider library (libfabric loads every `*fi.so` of a
/// provider path); removed when the test is done with it.
struct ProviderDir(tempfile::TempDir);

impl std::ops::Deref for ProviderDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

fn provider_dir() -> ProviderDir {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> → target/<profile>/deps/libbraid_fi.so: the library this
    // test run built (cargo compiles the lib with all its crate types, the cdylib included,
    // beside the test binaries; only `cargo build` copies it up to target/<profile>).
    let lib = exe
        .parent()
        .map(|d| d.join("libbraid_fi.so"))
        .expect("target folder");
    assert!(lib.exists(), "{} was not built", lib.display());
    let dir = tempfile::Builder::new()
        .prefix("braid-fi-")
        .tempdir()
        .expect("temp dir");
    std::fs::copy(&lib, dir.path().join("libbraid_fi.so")).expect("copy provider");
    ProviderDir(dir)
}

/// A TCP port free right now, for fi_pingpong's control connection.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn fi_info(dir: &Path, args: &[&str]) -> Output {
    Command::new("fi_info")
        .args(args)
        .env("FI_PROVIDER_PATH", dir)
        .output()
        .expect("run fi_info")
}

#[test]
fn fi_info_lists_the_braid_provider_with_its_attributes() {
    if !require_tools("fi_info_lists_the_braid_provider_with_its_attributes") {
        return;
    }
    let dir = provider_dir();
    let list = fi_info(&dir, &["-l"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("braid:"), "fi_info -l:\n{text}");

    let out = fi_info(&dir, &["-p", "braid", "-v"]);
    assert!(out.status.success(), "{out:?}");
    let v = String::from_utf8_lossy(&out.stdout);
    for want in [
        "prov_name: braid",
        "type: FI_EP_RDM",
        "FI_MSG",
        "FI_TAGGED",
        "FI_DIRECTED_RECV",
        "FI_MULTI_RECV",
        "threading: FI_THREAD_SAFE",
        "data_progress: FI_PROGRESS_AUTO",
        "msg_order: [ FI_ORDER_SAS ]",
        "addr_format: FI_SOCKADDR_IN",
    ] {
        assert!(v.contains(want), "missing {want:?} in:\n{v}");
    }
    // max_msg_size of at least 8 MiB.
    let max = v
        .lines()
        .find_map(|l| l.trim().strip_prefix("max_msg_size: "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .expect("max_msg_size line");
    assert!(max >= 8 << 20, "max_msg_size {max}");
    // RMA and atomics with provider keys; fi_info's hints offer every mr_mode bit, so the
    // provider takes virtual addresses (offsets without the bit: c/virtaddr.c). Peers on
    // this host and others; nothing it does not do (FI_RMA_EVENT only when asked).
    assert!(v.contains("FI_RMA") && v.contains("FI_ATOMIC"), "{v}");
    assert!(
        v.contains("FI_MR_PROV_KEY") && v.contains("FI_MR_VIRT_ADDR"),
        "{v}"
    );
    assert!(
        v.contains("FI_LOCAL_COMM") && v.contains("FI_REMOTE_COMM"),
        "{v}"
    );
    assert!(
        !v.contains("FI_COLLECTIVE") && !v.contains("FI_RMA_EVENT"),
        "{v}"
    );
    // One domain per interface, loopback included.
    assert!(v.contains("name: lo"), "{v}");
}

#[test]
fn fi_info_honours_the_hints() {
    if !require_tools("fi_info_honours_the_hints") {
        return;
    }
    let dir = provider_dir();
    // Capabilities it lacks, another endpoint type, address format, domain or source
    // address: no data.
    for args in [
        &["-p", "braid", "-c", "FI_COLLECTIVE"][..],
        &["-p", "braid", "-c", "FI_MSG|FI_SHARED_AV"][..],
        &["-p", "braid", "-t", "FI_EP_MSG"][..],
        &["-p", "braid", "-t", "FI_EP_DGRAM"][..],
        &["-p", "braid", "-a", "FI_SOCKADDR_IN6"][..],
        &["-p", "braid", "-d", "no-such-interface"][..],
        &["-p", "braid", "-s", "192.0.2.77"][..],
    ] {
        let out = fi_info(&dir, args);
        let v = String::from_utf8_lossy(&out.stdout);
        assert!(
            !v.contains("provider: braid"),
            "fi_info {args:?} found:\n{v}"
        );
    }
    // Tagged only: trimmed to what was asked.
    let out = fi_info(&dir, &["-p", "braid", "-c", "FI_TAGGED", "-d", "lo", "-v"]);
    assert!(out.status.success(), "{out:?}");
    let v = String::from_utf8_lossy(&out.stdout);
    let caps = v
        .lines()
        .find(|l| l.trim_start().starts_with("caps:"))
        .expect("caps line");
    assert!(
        caps.contains("FI_TAGGED") && !caps.contains("FI_MSG"),
        "{caps}"
    );
    // A source address picks its interface; a node becomes the destination address.
    let out = fi_info(&dir, &["-p", "braid", "-s", "127.0.0.1"]);
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.contains("domain: lo") && !v.contains("domain: eth"),
        "{v}"
    );
    let out = fi_info(
        &dir,
        &[
            "-p",
            "braid",
            "-d",
            "lo",
            "-n",
            "127.0.0.1",
            "-P",
            "7777",
            "-v",
        ],
    );
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.contains("dest_addrlen: 16"), "{v}");
}

/// Runs `fi_pingpong` as server (`server` command prefix, e.g. `ip netns exec a`) and client,
/// with `extra` arguments on both, and returns both outputs.
fn pingpong(
    dir: &Path,
    server_prefix: &[&str],
    client_prefix: &[&str],
    server_dev: &str,
    client_dev: &str,
    server_ip: &str,
    extra: &[&str],
) -> (Output, Output) {
    let port = free_port().to_string();
    let spawn = |prefix: &[&str], args: Vec<&str>| -> Child {
        let (prog, rest) = match prefix.split_first() {
            Some((p, rest)) => (*p, rest.to_vec()),
            None => ("fi_pingpong", Vec::new()),
        };
        let mut all: Vec<&str> = rest;
        if !prefix.is_empty() {
            all.push("fi_pingpong");
        }
        all.extend(args);
        Command::new(prog)
            .args(&all)
            .env("FI_PROVIDER_PATH", dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fi_pingpong")
    };
    let mut common = vec!["-p", "braid", "-e", "rdm"];
    common.extend_from_slice(extra);
    let mut sargs = common.clone();
    sargs.extend(["-d", server_dev, "-B", port.as_str()]);
    let server = spawn(server_prefix, sargs);
    let deadline = Instant::now() + RUN_LIMIT;
    // The server needs a moment to listen on its control port; a client that found it not
    // listening yet fails at once and is started again.
    let client_out = loop {
        std::thread::sleep(Duration::from_millis(300));
        let mut cargs = common.clone();
        cargs.extend(["-d", client_dev, "-P", port.as_str(), server_ip]);
        let client = spawn(client_prefix, cargs);
        let out = wait_limited(client, deadline);
        let refused =
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("connect");
        if refused && Instant::now() < deadline {
            continue;
        }
        break out;
    };
    let server_out = wait_limited(server, deadline);
    (server_out, client_out)
}

/// Waits for `child`, killing it at `deadline` (its output then says so).
fn wait_limited(mut child: Child, deadline: Instant) -> Output {
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().expect("output"),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "fi_pingpong did not finish in {RUN_LIMIT:?}: {}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("wait: {e}"),
        }
    }
}

/// Checks both sides finished and reported every size of `-S all` (1 byte to 6 MiB, the
/// data verified with `-c`).
fn assert_all_sizes(server: &Output, client: &Output) {
    for (who, out) in [("server", server), ("client", client)] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{who} failed: {:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for size in ["1 ", "64 ", "4k ", "64k ", "1m ", "6m "] {
            assert!(
                text.lines().any(|l| l.starts_with(size)),
                "{who}: no line for size {size:?}:\n{text}"
            );
        }
        // Every line sent as many as were acknowledged ("=").
        for l in text
            .lines()
            .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
        {
            let cols: Vec<&str> = l.split_whitespace().collect();
            assert!(cols.len() > 2 && cols[2].starts_with('='), "{who}: {l}");
        }
    }
}

#[test]
fn fi_pingpong_msg_runs_every_size_over_loopback() {
    if !require_tools("fi_pingpong_msg_runs_every_size_over_loopback") {
        return;
    }
    let dir = provider_dir();
    let (s, c) = pingpong(
        &dir,
        &[],
        &[],
        "lo",
        "lo",
        "127.0.0.1",
        &["-m", "msg", "-S", "all", "-c", "-I", "5"],
    );
    assert_all_sizes(&s, &c);
}

#[test]
fn fi_pingpong_tagged_runs_every_size_over_loopback() {
    if !require_tools("fi_pingpong_tagged_runs_every_size_over_loopback") {
        return;
    }
    let dir = provider_dir();
    let (s, c) = pingpong(
        &dir,
        &[],
        &[],
        "lo",
        "lo",
        "127.0.0.1",
        &["-m", "tagged", "-S", "all", "-c", "-I", "5"],
    );
    assert_all_sizes(&s, &c);
}

#[test]
fn fi_pingpong_runs_across_two_network_namespaces() {
    let test = "fi_pingpong_runs_across_two_network_namespaces";
    if !require_tools(test) || !braid_netns::require_root(test) {
        return;
    }
    let Some(pair) = braid_netns::setup(test, braid_netns::VethPair::new()) else {
        return;
    };
    let dir = provider_dir();
    let ip_a = pair.ip_a().to_string();
    for mode in ["msg", "tagged"] {
        let (s, c) = pingpong(
            &dir,
            &["ip", "netns", "exec", pair.a().name()],
            &["ip", "netns", "exec", pair.b().name()],
            pair.if_a(),
            pair.if_b(),
            &ip_a,
            &["-m", mode, "-S", "all", "-c", "-I", "5"],
        );
        assert_all_sizes(&s, &c);
    }
}
