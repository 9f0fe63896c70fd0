//! Builds `libbraid.so`, then the C programs in `ffi/c/` with gcc against `include/braid.h`
//! and that library, runs them, and checks that each exits
//! cleanly and says OK. Each program checks every byte it transfers and every return code
//! it expects; a crash (a signal) or a missing error fails the test.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a program may run before the test calls it hung (a failure bound, not a speed
/// check: the programs take about a second).
const HANG: Duration = Duration::from_secs(300);

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Builds `libbraid.so` from the current sources and returns the directory holding it.
///
/// Cargo does not build a cdylib-only crate for its own integration tests (they cannot link
/// it), so this runs `cargo build -p braid-ffi` once per test binary, into the target
/// directory and profile of this test run (whose dependencies are then already built). A
/// stale library would test old code.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        // target/<profile dir>/deps/<test binary>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("profile directory");
        let target_dir = profile_dir.parent().expect("target directory");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("release") => "release",
            _ => "test",
        };
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let out = Command::new(cargo)
            .args([
                "build",
                "--locked",
                "-p",
                "braid-ffi",
                "--lib",
                "--profile",
                profile,
            ])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(crate_dir())
            .output()
            .expect("run cargo build -p braid-ffi");
        assert!(
            out.status.success(),
            "cargo build -p braid-ffi failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let so = profile_dir.join("libbraid.so");
        assert!(so.exists(), "cargo built no {}", so.display());
        profile_dir.to_path_buf()
    })
}

/// Compiles `ffi/c/<name>.c` into the test's scratch directory, once per test binary (tests
/// run in parallel and some share a program).
fn build(name: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(exe) = built.get(name) {
        return exe.clone();
    }
    let exe = compile(name);
    built.insert(name.to_string(), exe.clone());
    exe
}

fn compile(name: &str) -> PathBuf {
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("braid-c");
    std::fs::create_dir_all(&out_dir).expect("scratch directory");
    let exe = out_dir.join(name);
    let lib = lib_dir();
    let src = crate_dir().join("c").join(format!("{name}.c"));
    let out = Command::new("gcc")
        .args([
            "-std=gnu11",
            "-O1",
            "-g",
            "-pthread",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-I")
        .arg(crate_dir().join("c"))
        .arg(&src)
        .arg("-L")
        .arg(lib)
        .arg("-lbraid")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("gcc must be installed to build the C API examples (apt-get install gcc)");
    assert!(
        out.status.success(),
        "gcc failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs a program to its end and returns its standard output; fails on a non-zero exit, a
/// signal or a hang.
fn run(exe: &Path, args: &[&str]) -> String {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the program");
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait for the program") {
            Some(_) => break,
            None if start.elapsed() > HANG => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("collect output");
                panic!(
                    "{} hung; stderr:\n{}",
                    exe.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = child.wait_with_output().expect("collect output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}, {}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        exe.display(),
        out.status,
        match out.status.code() {
            Some(_) => "exited",
            None => "killed by a signal: a crash",
        }
    );
    print!("{stdout}");
    stdout
}

fn write_ping_pong(args: &[&str]) {
    let out = run(&build("write_pingpong"), args);
    assert!(out.contains("write_pingpong: server OK"), "{out}");
    assert!(out.contains("write_pingpong: client OK"), "{out}");
    assert!(out.ends_with("write_pingpong: OK\n"), "{out}");
}

fn send_recv(args: &[&str]) {
    let out = run(&build("send_recv"), args);
    assert!(out.contains("send_recv: server OK"), "{out}");
    assert!(out.contains("send_recv: client OK (30 exchanges"), "{out}");
    assert!(out.ends_with("send_recv: OK\n"), "{out}");
}

#[test]
fn write_ping_pong_between_two_processes() {
    write_ping_pong(&[]);
}

#[test]
fn write_ping_pong_over_io_uring() {
    write_ping_pong(&["--datapath", "uring"]);
}

#[test]
fn send_recv_exchange_between_two_processes() {
    send_recv(&[]);
}

#[test]
fn send_recv_exchange_between_encrypted_qps() {
    send_recv(&["--encrypted"]);
}

#[test]
fn bad_arguments_return_errors_not_crashes() {
    let out = run(&build("bad_args"), &[]);
    let checks: u32 = out
        .trim()
        .strip_prefix("bad_args: OK (")
        .and_then(|s| s.strip_suffix(" checks)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {out:?}"));
    assert!(checks >= 100, "only {checks} checks ran");
}

#[test]
fn epoll_on_the_cq_fd_wakes_for_completions() {
    let out = run(&build("cq_fd"), &[]);
    // 100 single WRITEs and 100 bursts of 16.
    assert!(out.starts_with("cq_fd: OK (1700 completions"), "{out}");
}

#[test]
fn threads_share_a_qp_and_a_destroyed_handle_fails_cleanly() {
    let out = run(&build("threads"), &[]);
    assert!(out.starts_with("threads: OK (2000 completions"), "{out}");
}
