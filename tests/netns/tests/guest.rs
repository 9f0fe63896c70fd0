//! Real kernel verbs in a QEMU guest: the harness of scripts/guest/ (build-image.sh,
//! run.sh, init, smoke.sh) and what runs through it.
//!
//! The host kernel has no RDMA subsystem; the guest boots Debian's own kernel under TCG with
//! two Soft-RoCE devices, rxe0 and rxe1, on the two ends of one veth pair. These tests check
//! that rdma-core works there (the smoke), that a Rust binary of ours runs there and dlopens
//! libibverbs, and that the harness reports the guest command's exit status and a timeout.
//!
//! Root only, like every test of this crate (`braid_netns::require_root`): without root (or
//! without qemu, which `scripts/guest/build-image.sh deps` installs) they print `SKIPPED` and
//! pass; under CI (CI set) they fail instead. One guest boots at a time (each emulates two
//! CPUs on a two-core machine).
//!
//! # Running another test binary in the guest
//!
//! [`run_in_guest`] takes a host executable, its arguments and environment, and returns the
//! guest command's exit status and console. [`guest_verbs_conformance`] runs the backend
//! conformance suite on the verbs backend that way:
//!
//! ```text
//! cargo build -p braid-tests --features verbs --bin braid-conformance
//! cp target/debug/braid-conformance target/guest/braid-conformance-verbs
//! BRAID_GUEST_TEST_EXE=target/guest/braid-conformance-verbs \
//!   cargo test -p braid-netns --test guest guest_verbs_conformance -- --nocapture
//! ```
//!
//! By hand, the same is `BRAID_TEST_VERBS=1 scripts/guest/run.sh EXE [CASE...]`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// One guest at a time: the image is built once, and concurrent TCG guests on two cores
/// would only slow each other down.
static GUEST: Mutex<()> = Mutex::new(());

/// How long one guest may run before run.sh kills it, unless `BRAID_GUEST_TIMEOUT` says
/// otherwise. Generous: a boot takes about 15 s on a quiet machine, several minutes on a
/// machine busy compiling.
const DEFAULT_TIMEOUT_S: u64 = 600;

/// run.sh's exit status when it killed the guest at the timeout.
const TIMED_OUT: i32 = 124;

/// What a guest run gave back.
#[derive(Debug)]
pub struct GuestRun {
    /// The guest command's exit status, or run.sh's own (124 timed out, 125 never reported,
    /// 126 harness failure).
    pub status: i32,
    /// The guest's serial console.
    pub console: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The gate: root, and qemu present. Prints `SKIPPED` and returns false when either is
/// missing, except under CI, where it panics.
fn guest_available(test: &str) -> bool {
    if !braid_netns::require_root(test) {
        return false;
    }
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    if qemu.is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(
        !braid_netns::in_ci(),
        "{test}: qemu-system-x86_64 missing under CI (scripts/guest/build-image.sh deps installs it)"
    );
    eprintln!(
        "SKIPPED {test}: needs qemu-system-x86_64 (run scripts/guest/build-image.sh deps as root)"
    );
    false
}

/// Runs `exe` with `args` inside the guest through scripts/guest/run.sh, with `env` set
/// there (besides the BRAID_* and RUST_* variables of this process, which pass on their
/// own). `exe` is a host path when it contains a slash (copied in with its libraries), else a
/// program of the guest image. `timeout_s` defaults to `BRAID_GUEST_TIMEOUT` or 600 s.
pub fn run_in_guest(
    exe: &str,
    args: &[&str],
    env: &[(&str, &str)],
    timeout_s: Option<u64>,
) -> GuestRun {
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let timeout = timeout_s.unwrap_or_else(|| {
        std::env::var("BRAID_GUEST_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_TIMEOUT_S)
    });
    let log = std::env::temp_dir().join(format!(
        "braid-guest-{}-{}.log",
        std::process::id(),
        next_run()
    ));
    let mut cmd = Command::new(repo_root().join("scripts/guest/run.sh"));
    cmd.arg("--timeout").arg(timeout.to_string());
    cmd.arg("--log").arg(&log);
    for (name, value) in env {
        cmd.env(name, value);
        cmd.arg("--env").arg(name);
    }
    cmd.arg("--").arg(exe).args(args);
    eprintln!("guest: {cmd:?}");
    let status = cmd.status().expect("scripts/guest/run.sh did not start");
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    GuestRun {
        status: status.code().unwrap_or(-1),
        console,
    }
}

fn next_run() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// rdma-core in the guest: ibv_devices lists rxe0 and rxe1, ibv_rc_pingpong and
/// ib_write_bw pass between them (scripts/guest/smoke.sh).
#[test]
fn guest_rdma_smoke() {
    if !guest_available("guest_rdma_smoke") {
        return;
    }
    let smoke = repo_root().join("scripts/guest/smoke.sh");
    let run = run_in_guest(smoke.to_str().unwrap(), &[], &[], None);
    assert_eq!(run.status, 0, "the rdma smoke failed in the guest");
    for line in [
        "SMOKE-PASSED",
        "== smoke: ibv_rc_pingpong",
        "== smoke: ib_write_bw",
        "BW average[MB/sec]",
    ] {
        assert!(
            run.console.contains(line),
            "no {line:?} on the guest console"
        );
    }
    // ibv_rc_pingpong prints its transfer summary on both sides.
    assert!(
        run.console.matches("bytes in").count() >= 2,
        "ibv_rc_pingpong printed no transfer summary on both sides"
    );
}

/// A Rust binary of ours in the guest (this test executable, with the libraries ldd lists):
/// it dlopens libibverbs.so.1 and finds rxe0 and rxe1 (guest_payload_list_ibverbs_devices).
#[test]
fn guest_rust_binary_dlopens_ibverbs() {
    if !guest_available("guest_rust_binary_dlopens_ibverbs") {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let run = run_in_guest(
        me.to_str().unwrap(),
        &[
            "--exact",
            "guest_payload_list_ibverbs_devices",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ],
        &[],
        None,
    );
    assert_eq!(run.status, 0, "the Rust payload failed in the guest");
    assert!(
        run.console.contains("BRAID-GUEST-DEVICES rxe0,rxe1"),
        "the payload did not list rxe0 and rxe1"
    );
    assert!(
        run.console.contains("1 passed"),
        "the payload test did not run"
    );
}

/// The harness reports the guest command's own exit status, and the environment passes
/// through with its quoting intact.
#[test]
fn guest_harness_reports_exit_status() {
    if !guest_available("guest_harness_reports_exit_status") {
        return;
    }
    let tricky = "it's \"quoted\" $HOME `x` \\ end";
    let run = run_in_guest(
        "sh",
        &[
            "-c",
            "[ \"$BRAID_GUEST_CHECK\" = \"$1\" ] || { echo env mismatch; exit 9; }; \
             [ \"$BRAID_IN_GUEST\" = 1 ] || exit 8; echo guest-said-hello; exit 3",
            "sh",
            tricky,
        ],
        &[("BRAID_GUEST_CHECK", tricky)],
        None,
    );
    assert_eq!(
        run.status, 3,
        "run.sh did not pass the guest's exit status 3 on"
    );
    assert!(run.console.contains("guest-said-hello"));
}

/// A guest command that hangs: run.sh kills the guest at the timeout and says so (124).
#[test]
fn guest_harness_times_out() {
    if !guest_available("guest_harness_times_out") {
        return;
    }
    let run = run_in_guest("sleep", &["100000"], &[], Some(40));
    assert_eq!(run.status, TIMED_OUT, "run.sh did not report the timeout");
    assert!(!run.console.contains("BRAID-GUEST-EXIT"));
}

/// The backend conformance suite (`braid_tests::conformance`) on the verbs backend over rxe0
/// and rxe1: `BRAID_GUEST_TEST_EXE` is a `braid-conformance` built with `--features verbs`
/// (scripts/test.sh builds it and sets this when running as root), run in the guest with
/// `BRAID_TEST_VERBS=1 BRAID_VERBS_DEVICES=rxe0,rxe1` and `BRAID_GUEST_TEST_ARGS` (split on
/// whitespace: case names, default all); it must exit 0. Unset: `SKIPPED`, and under CI a
/// failure.
#[test]
fn guest_verbs_conformance() {
    const TEST: &str = "guest_verbs_conformance";
    if !guest_available(TEST) {
        return;
    }
    let Ok(exe) = std::env::var("BRAID_GUEST_TEST_EXE") else {
        assert!(
            !braid_netns::in_ci(),
            "{TEST}: BRAID_GUEST_TEST_EXE not set under CI (scripts/test.sh sets it)"
        );
        eprintln!(
            "SKIPPED {TEST}: BRAID_GUEST_TEST_EXE not set (cargo build -p braid-tests \\
             --features verbs --bin braid-conformance, then point it at the binary)"
        );
        return;
    };
    let exe = std::fs::canonicalize(&exe).expect("BRAID_GUEST_TEST_EXE does not exist");
    let args = std::env::var("BRAID_GUEST_TEST_ARGS").unwrap_or_default();
    let args: Vec<&str> = args.split_whitespace().collect();
    let run = run_in_guest(
        exe.to_str().unwrap(),
        &args,
        &[
            ("BRAID_TEST_VERBS", "1"),
            ("BRAID_VERBS_DEVICES", "rxe0,rxe1"),
        ],
        None,
    );
    assert_eq!(
        run.status,
        0,
        "{} failed in the guest:\n{}",
        exe.display(),
        run.console
    );
    assert!(
        run.console.contains("braid conformance on verbs"),
        "the suite did not run on the verbs backend:\n{}",
        run.console
    );
}

/// The payload of guest_rust_binary_dlopens_ibverbs, run inside the guest only (ignored; run
/// by hand on the host it says so and returns): lists the verbs devices through a dlopened
/// libibverbs.so.1 and requires rxe0 and rxe1.
#[test]
#[ignore = "runs inside the QEMU guest (guest_rust_binary_dlopens_ibverbs)"]
fn guest_payload_list_ibverbs_devices() {
    if std::env::var_os("BRAID_IN_GUEST").is_none() {
        eprintln!("guest_payload_list_ibverbs_devices: not in the guest (BRAID_IN_GUEST unset)");
        return;
    }
    let names = ibverbs_device_names().expect("listing the verbs devices");
    println!("verbs devices: {names:?}");
    for want in ["rxe0", "rxe1"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    println!("BRAID-GUEST-DEVICES rxe0,rxe1");
}

/// The device names libibverbs.so.1 lists, with the library loaded at run time (dlopen), as
/// Braid's verbs backend loads it.
fn ibverbs_device_names() -> Result<Vec<String>, String> {
    use std::ffi::{CStr, c_char, c_int, c_void};
    type GetList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
    type FreeList = unsafe extern "C" fn(*mut *mut c_void);
    type GetName = unsafe extern "C" fn(*mut c_void) -> *const c_char;

    // SAFETY: the name is a NUL-terminated literal; dlopen has no other preconditions.
    let lib = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        return Err("dlopen libibverbs.so.1 failed".into());
    }
    let sym = |name: &CStr| {
        // SAFETY: lib is a live handle from dlopen, name a NUL-terminated literal.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        if p.is_null() {
            Err(format!("dlsym {name:?} failed"))
        } else {
            Ok(p)
        }
    };
    let (get_list, free_list, get_name) = (
        sym(c"ibv_get_device_list")?,
        sym(c"ibv_free_device_list")?,
        sym(c"ibv_get_device_name")?,
    );
    // SAFETY: the three symbols are rdma-core's, with these C signatures (infiniband/verbs.h).
    let (get_list, free_list, get_name) = unsafe {
        (
            std::mem::transmute::<*mut c_void, GetList>(get_list),
            std::mem::transmute::<*mut c_void, FreeList>(free_list),
            std::mem::transmute::<*mut c_void, GetName>(get_name),
        )
    };
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer; the list is freed below.
    let list = unsafe { get_list(&mut n) };
    if list.is_null() {
        return Err(format!(
            "ibv_get_device_list failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds n device pointers; each name is a NUL-terminated string
        // owned by the device, copied out before the list is freed.
        let name = unsafe { CStr::from_ptr(get_name(*list.add(i))) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: list came from ibv_get_device_list and is freed once.
    unsafe { free_list(list) };
    Ok(names)
}
