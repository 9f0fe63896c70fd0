//! The project's own C programs against the libfabric API (ffi/fabric/c), one per capability,
//! compiled with gcc against libfabric-dev and run with `FI_PROVIDER_PATH` pointing at the
//! provider. Each exits 0 after printing `PASS <name>`, or non-zero naming the first check
//! that failed.
//!
//! Without gcc or libfabric-dev they print `SKIPPED` loudly; under CI (the `CI` variable set)
//! they fail instead (`./scripts/libfabric.sh deps` installs both).
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bounds the wait for a program that hangs (a hang is a failure); asserts nothing about speed.
const RUN_LIMIT: Duration = Duration::from_secs(300);

fn require_toolchain(test: &str) -> bool {
    let gcc = Command::new("gcc")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    let headers = Path::new("/usr/include/rdma/fabric.h").exists();
    if !(gcc && headers) {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: needs gcc and libfabric-dev, and CI must run it"
        );
        eprintln!(
            "SKIPPED {test}: needs gcc and libfabric-dev (apt-get install gcc libfabric-dev)"
        );
        return false;
    }
    true
}

/// A fresh folder for one program's binary and provider copy, removed when the test ends.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("braid-fi-c-")
        .tempdir()
        .expect("scratch dir")
}

/// Builds `c/<name>.c`, runs it against the provider and checks it passed.
fn run(name: &str) {
    if !require_toolchain(name) {
        return;
    }
    let scratch = scratch();
    let dir = scratch.path();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("c")
        .join(format!("{name}.c"));
    let exe = dir.join(name);
    let cc = Command::new("gcc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lfabric")
        .output()
        .expect("run gcc");
    assert!(
        cc.status.success(),
        "gcc {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&cc.stderr)
    );
    // The library this test run built, beside the test binaries in target/<profile>/deps
    // (cargo compiles the lib with all its crate types; only `cargo build` copies the cdylib
    // up to target/<profile>).
    let lib = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("libbraid_fi.so")))
        .expect("target folder");
    assert!(lib.exists(), "{} was not built", lib.display());
    let prov = dir.join("provider");
    std::fs::create_dir_all(&prov).expect("provider dir");
    std::fs::copy(&lib, prov.join("libbraid_fi.so")).expect("copy provider");
    let mut child = Command::new(&exe)
        .env("FI_PROVIDER_PATH", &prov)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run test program");
    let deadline = Instant::now() + RUN_LIMIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("PASS {name}")),
        "{name} failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_tagged_matching_wildcards_unexpected_and_rendezvous() {
    run("tagged");
}

#[test]
fn c_wait_fd_sread_and_counters() {
    run("waitfd");
}

#[test]
fn c_multi_recv() {
    run("multirecv");
}

#[test]
fn c_64_peers_accepted_before_they_are_in_the_av() {
    run("peers64");
}

#[test]
fn c_a_killed_peer_gives_error_completions_not_a_hang() {
    run("killed");
}

#[test]
fn c_rma_write_read_writedata_and_atomics_verified() {
    run("rma");
}

#[test]
fn c_bad_arguments_return_errors() {
    run("badargs");
}

#[test]
fn c_rma_with_virtual_addresses_and_with_offsets() {
    run("virtaddr");
}

#[test]
fn c_two_endpoints_in_one_domain_each_talk_to_peers() {
    run("multiep");
}

#[test]
fn c_getinfo_caps_placement_and_av_sync_err() {
    run("conform");
}

#[test]
fn c_rma_event_counters_count_remote_writes_and_reads() {
    run("rmaevent");
}
