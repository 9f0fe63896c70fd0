//! One conformance suite for Braid's public API, run on whichever backend the environment
//! names, so the software transport and the rdma-core backend cannot drift apart.
//!
//! - default: the software backend, two UDP devices on 127.0.0.1 (part of every
//!   `cargo test`, through `tests/all/conformance.rs`);
//! - `BRAID_TEST_VERBS=1`: the verbs backend, one device per name in `BRAID_VERBS_DEVICES`
//!   (default `rxe0,rxe1`), both ends in this process. Without such devices the suite
//!   fails, it does not skip.
//!
//! Every case checks each byte it moved and the bytes around them. Where the software
//! transport and verbs could differ, the case asserts what the verbs spec says.
//! `braid-conformance` (src/bin) runs the same cases outside the test harness, for a guest
//! or a machine with a NIC.
use std::time::Duration;

use braid::{
    Access, Backend, Completion, CompletionQueue, ConnectError, ConnectionEvent, Device,
    DeviceConfig, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};

/// How long a case waits for a completion it needs before declaring it lost (a liveness
/// guard, not a speed check).
pub const WAIT: Duration = Duration::from_secs(20);

/// Which backend the suite runs on, from the environment: `Ok(None)` for software,
/// `Ok(Some((dev_a, dev_b)))` for verbs.
pub fn verbs_devices() -> Option<(String, String)> {
    if std::env::var("BRAID_TEST_VERBS").ok().as_deref() != Some("1") {
        return None;
    }
    let names = std::env::var("BRAID_VERBS_DEVICES").unwrap_or_else(|_| "rxe0,rxe1".into());
    let mut it = names.split(',').map(str::trim).filter(|s| !s.is_empty());
    let a = it.next().unwrap_or("rxe0").to_owned();
    let b = it.next().map_or_else(|| a.clone(), str::to_owned);
    Some((a, b))
}

/// Whether the suite runs on Soft-RoCE devices (named `rxe*`), where one case has a known
/// deviation from the verbs documentation.
pub fn on_rxe() -> bool {
    verbs_devices().is_some_and(|(a, b)| a.starts_with("rxe") && b.starts_with("rxe"))
}

/// The name of the backend the suite runs on, for reports.
pub fn backend_name() -> String {
    match verbs_devices() {
        Some((a, b)) => format!("verbs ({a}, {b})"),
        None => "software (udp on 127.0.0.1)".into(),
    }
}

/// One end: a device, a protection domain, one CQ for sends and receives, one QP.
pub struct Side {
    /// The device.
    pub dev: Device,
    /// Its protection domain.
    pub pd: ProtectionDomain,
    /// Send and receive CQ.
    pub cq: CompletionQueue,
    /// The QP, connected to the other side's.
    pub qp: QueuePair,
}

/// Two connected ends.
pub struct Pair {
    /// The requester in most cases.
    pub a: Side,
    /// The responder in most cases.
    pub b: Side,
}

fn open(backend: Backend, tune: fn(DeviceConfig) -> DeviceConfig) -> Device {
    let cfg = tune(
        DeviceConfig::udp("127.0.0.1:0".parse().unwrap())
            .paths(4)
            .backend(backend.clone()),
    );
    match Device::open(cfg) {
        Ok(d) => d,
        Err(e) => panic!("conformance: cannot open a {backend} device: {e}"),
    }
}

fn side(dev: Device) -> Side {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = pd.create_qp(&cq, &cq).expect("create_qp");
    Side { dev, pd, cq, qp }
}

/// Opens two devices on the backend the environment names and connects a QP on each.
/// Panics (so the case fails) when a device cannot be opened.
pub fn pair() -> Pair {
    pair_with(|cfg| cfg)
}

/// [`pair`] with device settings changed by `tune` (both ends).
pub fn pair_with(tune: fn(DeviceConfig) -> DeviceConfig) -> Pair {
    let (ba, bb) = match verbs_devices() {
        Some((a, b)) => (Backend::Verbs(Some(a)), Backend::Verbs(Some(b))),
        None => (Backend::Software, Backend::Software),
    };
    let a = side(open(ba, tune));
    let b = side(open(bb, tune));
    if verbs_devices().is_some() {
        assert!(a.dev.is_verbs() && b.dev.is_verbs(), "asked for verbs");
    }
    a.qp.connect(b.qp.info()).expect("connect a");
    b.qp.connect(a.qp.info()).expect("connect b");
    Pair { a, b }
}

/// Deterministic test bytes: byte `i` of stream `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(u32::from(seed) * 7) as u8
                ^ 0x5a
        })
        .collect()
}

fn mr(pd: &ProtectionDomain, len: usize, access: Access) -> MemoryRegion {
    pd.alloc_mr(len, access).expect("alloc_mr")
}

fn bytes(m: &MemoryRegion) -> Vec<u8> {
    let mut v = vec![0; m.len()];
    m.read(0, &mut v).unwrap();
    v
}

/// The next completion on `cq`, or a panic naming `what`.
pub fn next(cq: &CompletionQueue, what: &str) -> Completion {
    cq.wait(WAIT)
        .unwrap_or_else(|| panic!("no completion for {what} within {WAIT:?}"))
}

fn send_wr(wr_id: u64, op: SendOp, sges: Vec<Sge>) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges,
        signaled: true,
    }
}

fn expect(c: Completion, wr_id: u64, status: WcStatus, opcode: WcOpcode, what: &str) {
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (wr_id, status, opcode),
        "{what}: {c:?}"
    );
}

/// A SEND of 3000 bytes (several packets at any MTU) lands in the posted RECV.
pub fn send_recv(p: &Pair) {
    let data = pattern(1, 3000);
    let src = mr(&p.a.pd, 4096, Access::LOCAL_WRITE);
    src.write(0, &data).unwrap();
    let dst = mr(&p.b.pd, 4096, Access::LOCAL_WRITE);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 10,
            sges: vec![dst.sge(0, 4096)],
        })
        .unwrap();
    p.a.qp
        .post_send(send_wr(1, SendOp::Send, vec![src.sge(0, 3000)]))
        .unwrap();
    expect(
        next(&p.a.cq, "send"),
        1,
        WcStatus::Success,
        WcOpcode::Send,
        "send",
    );
    let r = next(&p.b.cq, "recv");
    expect(r, 10, WcStatus::Success, WcOpcode::Recv, "recv");
    assert_eq!((r.byte_len, r.imm), (3000, None));
    assert_eq!(r.qpn, p.b.qp.info().qpn);
    let got = bytes(&dst);
    assert_eq!(&got[..3000], &data[..]);
    assert!(got[3000..].iter().all(|&b| b == 0), "bytes past the SEND");
}

/// SEND with immediate: the RECV reports the immediate.
pub fn send_imm(p: &Pair) {
    let data = pattern(2, 100);
    let src = mr(&p.a.pd, 128, Access::LOCAL_WRITE);
    src.write(0, &data).unwrap();
    let dst = mr(&p.b.pd, 128, Access::LOCAL_WRITE);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 11,
            sges: vec![dst.sge(0, 128)],
        })
        .unwrap();
    p.a.qp
        .post_send(send_wr(
            2,
            SendOp::SendImm(0xdead_beef),
            vec![src.sge(0, 100)],
        ))
        .unwrap();
    expect(
        next(&p.a.cq, "send_imm"),
        2,
        WcStatus::Success,
        WcOpcode::Send,
        "send_imm",
    );
    let r = next(&p.b.cq, "recv");
    expect(r, 11, WcStatus::Success, WcOpcode::Recv, "recv");
    assert_eq!((r.byte_len, r.imm), (100, Some(0xdead_beef)));
    let got = bytes(&dst);
    assert_eq!(&got[..100], &data[..]);
    assert!(got[100..].iter().all(|&b| b == 0));
}

/// RDMA WRITE of 5000 bytes at offset 100 changes exactly those bytes.
pub fn write(p: &Pair) {
    let data = pattern(3, 5000);
    let src = mr(&p.a.pd, 8192, Access::LOCAL_WRITE);
    src.write(0, &data).unwrap();
    let dst = mr(&p.b.pd, 8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    p.a.qp
        .post_send(send_wr(
            3,
            SendOp::Write(dst.remote(100)),
            vec![src.sge(0, 5000)],
        ))
        .unwrap();
    let c = next(&p.a.cq, "write");
    expect(c, 3, WcStatus::Success, WcOpcode::Write, "write");
    let got = bytes(&dst);
    assert!(got[..100].iter().all(|&b| b == 0), "bytes before the WRITE");
    assert_eq!(&got[100..5100], &data[..]);
    assert!(got[5100..].iter().all(|&b| b == 0), "bytes after the WRITE");
}

/// WRITE with immediate places the bytes and consumes a RECV that reports the immediate
/// and the length written.
pub fn write_imm(p: &Pair) {
    let data = pattern(4, 2000);
    let src = mr(&p.a.pd, 2048, Access::LOCAL_WRITE);
    src.write(0, &data).unwrap();
    let dst = mr(&p.b.pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 12,
            sges: vec![],
        })
        .unwrap();
    p.a.qp
        .post_send(send_wr(
            4,
            SendOp::WriteImm(dst.remote(8), 77),
            vec![src.sge(0, 2000)],
        ))
        .unwrap();
    expect(
        next(&p.a.cq, "write_imm"),
        4,
        WcStatus::Success,
        WcOpcode::Write,
        "write_imm",
    );
    let r = next(&p.b.cq, "recv");
    expect(r, 12, WcStatus::Success, WcOpcode::RecvRdmaWithImm, "recv");
    assert_eq!(r.imm, Some(77));
    assert_eq!(
        r.byte_len, 2000,
        "a WRITE_IMM's RECV reports the length written"
    );
    let got = bytes(&dst);
    assert!(got[..8].iter().all(|&b| b == 0));
    assert_eq!(&got[8..2008], &data[..]);
    assert!(got[2008..].iter().all(|&b| b == 0));
}

/// RDMA READ of 4000 bytes scattered over two local entries.
pub fn read_scatter(p: &Pair) {
    let data = pattern(5, 4000);
    let remote = mr(&p.b.pd, 8192, Access::REMOTE_READ);
    remote.write(1000, &data).unwrap();
    let local = mr(&p.a.pd, 8192, Access::LOCAL_WRITE);
    let sges = vec![local.sge(0, 1500), local.sge(4000, 2500)];
    p.a.qp
        .post_send(send_wr(5, SendOp::Read(remote.remote(1000)), sges))
        .unwrap();
    let c = next(&p.a.cq, "read");
    expect(c, 5, WcStatus::Success, WcOpcode::Read, "read");
    let got = bytes(&local);
    assert_eq!(&got[..1500], &data[..1500]);
    assert!(
        got[1500..4000].iter().all(|&b| b == 0),
        "between the entries"
    );
    assert_eq!(&got[4000..6500], &data[1500..]);
    assert!(got[6500..].iter().all(|&b| b == 0));
}

/// Fetch-and-add returns the old value and adds; compare-and-swap swaps only on a match.
pub fn atomics(p: &Pair) {
    let remote = mr(&p.b.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    remote.write(16, &1000u64.to_ne_bytes()).unwrap();
    let local = mr(&p.a.pd, 64, Access::LOCAL_WRITE);
    let r = remote.remote(16);
    let read_u64 = |m: &MemoryRegion, off: u64| {
        let mut b = [0u8; 8];
        m.read(off, &mut b).unwrap();
        u64::from_ne_bytes(b)
    };
    p.a.qp
        .post_send(send_wr(6, SendOp::FetchAdd(r, 5), vec![local.sge(0, 8)]))
        .unwrap();
    expect(
        next(&p.a.cq, "fetch_add"),
        6,
        WcStatus::Success,
        WcOpcode::FetchAdd,
        "fadd",
    );
    assert_eq!(read_u64(&local, 0), 1000, "fetch-add returns the old value");
    assert_eq!(read_u64(&remote, 16), 1005);
    let cas = |wr_id, compare, swap, at| {
        send_wr(
            wr_id,
            SendOp::CompareSwap {
                remote: r,
                compare,
                swap,
            },
            vec![local.sge(at, 8)],
        )
    };
    p.a.qp.post_send(cas(7, 1, 99, 8)).unwrap();
    expect(
        next(&p.a.cq, "cas miss"),
        7,
        WcStatus::Success,
        WcOpcode::CompareSwap,
        "cas",
    );
    assert_eq!(read_u64(&local, 8), 1005);
    assert_eq!(read_u64(&remote, 16), 1005, "no swap on a mismatch");
    p.a.qp.post_send(cas(8, 1005, 42, 16)).unwrap();
    expect(
        next(&p.a.cq, "cas hit"),
        8,
        WcStatus::Success,
        WcOpcode::CompareSwap,
        "cas",
    );
    assert_eq!(read_u64(&local, 16), 1005);
    assert_eq!(read_u64(&remote, 16), 42, "swapped on a match");
    let got = bytes(&remote);
    assert!(got[..16].iter().chain(&got[24..]).all(|&b| b == 0));
}

/// A SEND gathered from three entries in two regions, scattered over two RECV entries.
pub fn gather_scatter(p: &Pair) {
    let (d1, d2, d3) = (pattern(6, 700), pattern(7, 1300), pattern(8, 500));
    let s1 = mr(&p.a.pd, 4096, Access::LOCAL_WRITE);
    let s2 = mr(&p.a.pd, 4096, Access::LOCAL_WRITE);
    s1.write(10, &d1).unwrap();
    s2.write(0, &d2).unwrap();
    s1.write(3000, &d3).unwrap();
    let dst = mr(&p.b.pd, 4096, Access::LOCAL_WRITE);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 13,
            sges: vec![dst.sge(0, 1000), dst.sge(2000, 2000)],
        })
        .unwrap();
    let sges = vec![s1.sge(10, 700), s2.sge(0, 1300), s1.sge(3000, 500)];
    p.a.qp.post_send(send_wr(9, SendOp::Send, sges)).unwrap();
    expect(
        next(&p.a.cq, "send"),
        9,
        WcStatus::Success,
        WcOpcode::Send,
        "send",
    );
    let r = next(&p.b.cq, "recv");
    expect(r, 13, WcStatus::Success, WcOpcode::Recv, "recv");
    assert_eq!(r.byte_len, 2500);
    let want: Vec<u8> = [d1, d2, d3].concat();
    let got = bytes(&dst);
    assert_eq!(&got[..1000], &want[..1000]);
    assert!(
        got[1000..2000].iter().all(|&b| b == 0),
        "between the entries"
    );
    assert_eq!(&got[2000..3500], &want[1000..]);
    assert!(got[3500..].iter().all(|&b| b == 0));
}

/// Unsignaled WRITEs complete silently; the signaled one after them is the only
/// completion, and every WRITE has landed by then.
pub fn unsignaled(p: &Pair) {
    let src = mr(&p.a.pd, 8 * 1024, Access::LOCAL_WRITE);
    let dst = mr(
        &p.b.pd,
        8 * 1024,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let data = pattern(9, 8 * 1024);
    src.write(0, &data).unwrap();
    for i in 0..8u64 {
        let mut wr = send_wr(
            100 + i,
            SendOp::Write(dst.remote(i * 1024)),
            vec![src.sge(i * 1024, 1024)],
        );
        wr.signaled = i == 7;
        p.a.qp.post_send(wr).unwrap();
    }
    expect(
        next(&p.a.cq, "signaled"),
        107,
        WcStatus::Success,
        WcOpcode::Write,
        "last",
    );
    assert_eq!(bytes(&dst), data);
    // Nothing else completes: a signaled marker WRITE is the very next completion.
    p.a.qp
        .post_send(send_wr(
            200,
            SendOp::Write(dst.remote(0)),
            vec![src.sge(0, 8)],
        ))
        .unwrap();
    expect(
        next(&p.a.cq, "marker"),
        200,
        WcStatus::Success,
        WcOpcode::Write,
        "marker",
    );
}

/// Posts a signaled WRITE of 8 bytes to `remote`, then a signaled WRITE to a good place;
/// expects the first to fail with `status` and the second to be flushed (the QP went to
/// error), with the good region untouched.
fn fails_then_flushes(p: &Pair, op: SendOp, status: WcStatus, opcode: WcOpcode, what: &str) {
    let local = mr(&p.a.pd, 64, Access::LOCAL_WRITE);
    local.write(0, &pattern(10, 64)).unwrap();
    let good = mr(&p.b.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    p.a.qp
        .post_send(send_wr(1, op, vec![local.sge(0, 8)]))
        .unwrap();
    p.a.qp
        .post_send(send_wr(
            2,
            SendOp::Write(good.remote(0)),
            vec![local.sge(0, 8)],
        ))
        .unwrap();
    expect(next(&p.a.cq, what), 1, status, opcode, what);
    let f = next(&p.a.cq, "the request after the error");
    assert_eq!((f.wr_id, f.status), (2, WcStatus::Flushed), "{what}: {f:?}");
    assert!(
        bytes(&good).iter().all(|&b| b == 0),
        "{what}: a flushed WRITE executed"
    );
}

/// A WRITE with a wrong rkey fails with `RemoteAccessError`; what follows is flushed.
pub fn bad_rkey(p: &Pair) {
    let target = mr(&p.b.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut r = target.remote(0);
    r.rkey ^= 0x5a5a_0000;
    fails_then_flushes(
        p,
        SendOp::Write(r),
        WcStatus::RemoteAccessError,
        WcOpcode::Write,
        "bad rkey",
    );
    assert!(bytes(&target).iter().all(|&b| b == 0));
}

/// A WRITE past the end of the region fails with `RemoteAccessError`.
pub fn out_of_bounds(p: &Pair) {
    let target = mr(&p.b.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let r = target.remote(60);
    fails_then_flushes(
        p,
        SendOp::Write(r),
        WcStatus::RemoteAccessError,
        WcOpcode::Write,
        "bounds",
    );
    assert!(bytes(&target).iter().all(|&b| b == 0));
}

/// A READ from a region without remote read rights fails with `RemoteAccessError`.
pub fn no_read_right(p: &Pair) {
    let target = mr(&p.b.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let r = target.remote(0);
    fails_then_flushes(
        p,
        SendOp::Read(r),
        WcStatus::RemoteAccessError,
        WcOpcode::Read,
        "read",
    );
}

/// A WRITE into a region without remote write rights fails with `RemoteAccessError`.
pub fn no_write_right(p: &Pair) {
    let target = mr(&p.b.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let r = target.remote(0);
    fails_then_flushes(
        p,
        SendOp::Write(r),
        WcStatus::RemoteAccessError,
        WcOpcode::Write,
        "write",
    );
    assert!(bytes(&target).iter().all(|&b| b == 0));
}

/// An atomic on a region without remote atomic rights fails with `RemoteAccessError`.
pub fn no_atomic_right(p: &Pair) {
    let target = mr(&p.b.pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let r = target.remote(0);
    let op = SendOp::FetchAdd(r, 1);
    fails_then_flushes(
        p,
        op,
        WcStatus::RemoteAccessError,
        WcOpcode::FetchAdd,
        "atomic",
    );
    assert!(bytes(&target).iter().all(|&b| b == 0));
}

/// `set_error` flushes every posted RECV, in posting order, and a SEND posted afterwards
/// completes as flushed without executing.
pub fn set_error_flushes(p: &Pair) {
    let buf = mr(&p.b.pd, 256, Access::LOCAL_WRITE);
    for i in 0..4u64 {
        p.b.qp
            .post_recv(RecvWr {
                wr_id: 20 + i,
                sges: vec![buf.sge(i * 64, 64)],
            })
            .unwrap();
    }
    p.b.qp.set_error().unwrap();
    for i in 0..4u64 {
        let c = next(&p.b.cq, "flushed recv");
        assert_eq!((c.wr_id, c.status), (20 + i, WcStatus::Flushed), "{c:?}");
    }
    let src = mr(&p.b.pd, 64, Access::LOCAL_WRITE);
    p.b.qp
        .post_send(send_wr(30, SendOp::Send, vec![src.sge(0, 8)]))
        .expect("a post on a QP in error is accepted, then flushed");
    let c = next(&p.b.cq, "send after error");
    assert_eq!((c.wr_id, c.status), (30, WcStatus::Flushed), "{c:?}");
    assert!(bytes(&buf).iter().all(|&b| b == 0));
}

/// A SEND longer than the posted RECV: the receiver's RECV fails with `LocalLengthError`,
/// the sender's SEND with `RemoteInvalidRequest`.
pub fn recv_too_short(p: &Pair) {
    let src = mr(&p.a.pd, 256, Access::LOCAL_WRITE);
    src.write(0, &pattern(11, 256)).unwrap();
    let dst = mr(&p.b.pd, 256, Access::LOCAL_WRITE);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 14,
            sges: vec![dst.sge(0, 64)],
        })
        .unwrap();
    p.a.qp
        .post_send(send_wr(15, SendOp::Send, vec![src.sge(0, 200)]))
        .unwrap();
    let s = next(&p.a.cq, "send");
    let r = next(&p.b.cq, "recv");
    if on_rxe() {
        // Soft-RoCE (Linux 6.1) treats the overflow as a malformed receive WQE: the sender
        // gets IBV_WC_REM_OP_ERR instead of the REM_INV_REQ_ERR / LOC_LEN_ERR pair
        // ibv_poll_cq(3) documents (docs/verbs.md).
        println!(
            "note: recv_too_short on rxe: {:?} / {:?}",
            s.status, r.status
        );
        assert_eq!(
            (s.wr_id, s.status),
            (15, WcStatus::RemoteOperationError),
            "{s:?}"
        );
        assert_eq!(r.wr_id, 14, "{r:?}");
        assert_ne!(r.status, WcStatus::Success, "{r:?}");
    } else {
        assert_eq!(
            (s.wr_id, s.status),
            (15, WcStatus::RemoteInvalidRequest),
            "{s:?}"
        );
        assert_eq!(
            (r.wr_id, r.status),
            (14, WcStatus::LocalLengthError),
            "{r:?}"
        );
    }
    let got = bytes(&dst);
    assert!(
        got[64..].iter().all(|&b| b == 0),
        "bytes past the RECV's buffer"
    );
}

/// A SEND to a QP with no RECV posted is retried as receiver-not-ready, then fails with
/// `RnrRetryExceeded` (the retry count is finite on both backends), and what follows is
/// flushed.
pub fn rnr_retry_exceeded(p: &Pair) {
    let src = mr(&p.a.pd, 64, Access::LOCAL_WRITE);
    p.a.qp
        .post_send(send_wr(16, SendOp::Send, vec![src.sge(0, 32)]))
        .unwrap();
    p.a.qp
        .post_send(send_wr(17, SendOp::Send, vec![src.sge(0, 32)]))
        .unwrap();
    let c = next(&p.a.cq, "rnr");
    assert_eq!(
        (c.wr_id, c.status),
        (16, WcStatus::RnrRetryExceeded),
        "{c:?}"
    );
    let f = next(&p.a.cq, "after rnr");
    assert_eq!((f.wr_id, f.status), (17, WcStatus::Flushed), "{f:?}");
}

/// The RNR window of [`rnr_late_recv`]: 6 retries 100 ms apart (on verbs the delay rounds up
/// to the IB table's 122.88 ms), so a RECV posted [`LATE_RECV_AFTER`] after the SEND is in
/// time even on an emulated CPU.
fn long_rnr_window(mut cfg: DeviceConfig) -> DeviceConfig {
    cfg.engine.rnr_retry_limit = 6;
    cfg.engine.rnr_timer_ns = 100_000_000;
    cfg
}

/// How long after the SEND [`rnr_late_recv`] posts the RECV: long enough for the SEND to
/// arrive and be refused (receiver not ready) first, well inside the RNR window.
const LATE_RECV_AFTER: Duration = Duration::from_millis(150);

/// The receiver's count of receiver-not-ready NAKs it sent: the engine's NAK counter on
/// software, Soft-RoCE's `send_rnr_err` counter on an rxe device (`None` elsewhere: hardware
/// names its counters otherwise).
fn rnr_naks_sent(dev: &Device, name: Option<&str>) -> Option<u64> {
    if !dev.is_verbs() {
        return Some(dev.stats().naks_sent);
    }
    let name = name?;
    let path = format!("/sys/class/infiniband/{name}/ports/1/hw_counters/send_rnr_err");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A SEND that arrives before its RECV is posted is refused as receiver-not-ready and
/// retried; the RECV posted within the RNR window takes it, and both complete successfully
/// with every byte.
pub fn rnr_late_recv(p: &Pair) {
    let data = pattern(14, 2500);
    let src = mr(&p.a.pd, 4096, Access::LOCAL_WRITE);
    src.write(0, &data).unwrap();
    let dst = mr(&p.b.pd, 4096, Access::LOCAL_WRITE);
    // The responder is the second device named.
    let b_name = verbs_devices().map(|(_, b)| b);
    let naks_before = rnr_naks_sent(&p.b.dev, b_name.as_deref());
    p.a.qp
        .post_send(send_wr(18, SendOp::Send, vec![src.sge(0, 2500)]))
        .unwrap();
    std::thread::sleep(LATE_RECV_AFTER);
    assert!(
        p.a.cq.poll_one().is_none(),
        "the SEND cannot complete before its RECV is posted"
    );
    let naks_after = rnr_naks_sent(&p.b.dev, b_name.as_deref());
    match (naks_before, naks_after) {
        (Some(b), Some(a)) => assert!(a > b, "the receiver sent no RNR NAK ({b} -> {a})"),
        _ => println!("note: rnr_late_recv: this device has no RNR NAK counter to check"),
    }
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 19,
            sges: vec![dst.sge(0, 4096)],
        })
        .unwrap();
    expect(
        next(&p.a.cq, "late send"),
        18,
        WcStatus::Success,
        WcOpcode::Send,
        "late send",
    );
    let r = next(&p.b.cq, "late recv");
    expect(r, 19, WcStatus::Success, WcOpcode::Recv, "late recv");
    assert_eq!(r.byte_len, 2500);
    let got = bytes(&dst);
    assert_eq!(&got[..2500], &data[..]);
    assert!(got[2500..].iter().all(|&b| b == 0), "bytes past the SEND");
}

/// The connection handshake connects two devices by address alone (on verbs over each
/// device's UDP socket, carrying the port GID, QP number and PSN, then RTR/RTS): both sides
/// see one QP pair, a SEND one way and a WRITE the other move every byte, and on verbs a
/// software device's request is refused (a software QP cannot talk to a NIC's).
pub fn handshake_connects(p: &Pair) {
    let (a, b) = (&p.a, &p.b);
    a.dev
        .enable_handshake(&a.pd, &a.cq, &a.cq)
        .expect("enable a");
    b.dev
        .enable_handshake(&b.pd, &b.cq, &b.cq)
        .expect("enable b");
    assert_eq!(
        a.dev.enable_handshake(&a.pd, &a.cq, &a.cq),
        Err(ConnectError::AlreadyEnabled)
    );
    let (a_addr, b_addr) = (a.dev.local_addr(), b.dev.local_addr());
    let ac = a.dev.wait_connected(b_addr, WAIT).expect("a connects to b");
    assert_eq!((ac.peer, ac.accepted), (b_addr, false), "{ac:?}");
    let bc = match b.dev.wait_connection_event(WAIT) {
        Some(ConnectionEvent::Established(c)) => c,
        other => panic!("b: expected the accepted connection, got {other:?}"),
    };
    assert_eq!((bc.peer, bc.accepted), (a_addr, true), "{bc:?}");
    assert_eq!(
        (bc.remote.qpn, bc.remote.psn, ac.remote.qpn, ac.remote.psn),
        (ac.local.qpn, ac.local.psn, bc.local.qpn, bc.local.psn),
        "each side holds the other's QP: {ac:?} / {bc:?}"
    );
    assert_ne!(
        ac.local.qpn,
        a.qp.info().qpn,
        "the handshake makes a QP of its own"
    );
    assert_eq!(a.dev.local_qpn(b_addr), Some(ac.local.qpn));
    assert_eq!(b.dev.local_qpn(a_addr), Some(bc.local.qpn));
    if a.dev.is_verbs() {
        // The QPs are the NICs': their infos name the port GIDs, as out-of-band ones do.
        assert_eq!(ac.local.addr, a.qp.info().addr, "{ac:?}");
        assert_eq!(ac.remote.addr, b.qp.info().addr, "{ac:?}");
        assert_eq!(bc.remote.addr, a.qp.info().addr, "{bc:?}");
    } else {
        assert_eq!(ac.remote.addr, b_addr, "{ac:?}");
    }

    // SEND a -> b, 3000 bytes.
    let data = pattern(12, 3000);
    let src = mr(&a.pd, 4096, Access::LOCAL_WRITE);
    src.write(0, &data).unwrap();
    let dst = mr(&b.pd, 4096, Access::LOCAL_WRITE);
    b.dev
        .post_recv_to(
            a_addr,
            RecvWr {
                wr_id: 42,
                sges: vec![dst.sge(0, 4096)],
            },
        )
        .expect("post_recv_to");
    a.dev
        .post_send_to(b_addr, send_wr(41, SendOp::Send, vec![src.sge(0, 3000)]))
        .expect("post_send_to");
    let s = next(&a.cq, "handshake send");
    expect(s, 41, WcStatus::Success, WcOpcode::Send, "handshake send");
    assert_eq!(s.qpn, ac.local.qpn);
    let r = next(&b.cq, "handshake recv");
    expect(r, 42, WcStatus::Success, WcOpcode::Recv, "handshake recv");
    assert_eq!((r.byte_len, r.qpn), (3000, bc.local.qpn), "{r:?}");
    let got = bytes(&dst);
    assert_eq!(&got[..3000], &data[..]);
    assert!(got[3000..].iter().all(|&b| b == 0), "bytes past the SEND");

    // WRITE b -> a, 5000 bytes at offset 64: the accepted side uses the connection too.
    let data = pattern(13, 5000);
    let wsrc = mr(&b.pd, 8192, Access::LOCAL_WRITE);
    wsrc.write(0, &data).unwrap();
    let wdst = mr(&a.pd, 8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    b.dev
        .post_send_to(
            a_addr,
            send_wr(43, SendOp::Write(wdst.remote(64)), vec![wsrc.sge(0, 5000)]),
        )
        .expect("post_send_to b");
    let w = next(&b.cq, "handshake write");
    expect(w, 43, WcStatus::Success, WcOpcode::Write, "handshake write");
    let got = bytes(&wdst);
    assert!(got[..64].iter().all(|&b| b == 0), "bytes before the WRITE");
    assert_eq!(&got[64..5064], &data[..]);
    assert!(got[5064..].iter().all(|&b| b == 0), "bytes after the WRITE");

    if b.dev.is_verbs() {
        // A software device's request to the verbs device is refused for its features.
        let sw = Device::open(DeviceConfig::udp("127.0.0.1:0".parse().unwrap()))
            .expect("software device");
        let (pd, cq) = (sw.alloc_pd(), sw.create_cq());
        sw.enable_handshake(&pd, &cq, &cq).expect("enable software");
        match sw.wait_connected(b_addr, WAIT) {
            Err(ConnectError::Failed(braid::handshake::ConnectFailure::Rejected(
                braid::handshake::RejectReason::Features,
            ))) => {}
            other => panic!("software to verbs: expected a features reject, got {other:?}"),
        }
    }
}

/// A conformance case: runs on a connected pair, panics on a deviation.
pub type Case = fn(&Pair);

/// Every case, by name.
pub const CASES: &[(&str, Case)] = &[
    ("send_recv", send_recv),
    ("send_imm", send_imm),
    ("write", write),
    ("write_imm", write_imm),
    ("read_scatter", read_scatter),
    ("atomics", atomics),
    ("gather_scatter", gather_scatter),
    ("unsignaled", unsignaled),
    ("bad_rkey", bad_rkey),
    ("out_of_bounds", out_of_bounds),
    ("no_read_right", no_read_right),
    ("no_write_right", no_write_right),
    ("no_atomic_right", no_atomic_right),
    ("set_error_flushes", set_error_flushes),
    ("recv_too_short", recv_too_short),
    ("rnr_retry_exceeded", rnr_retry_exceeded),
    ("rnr_late_recv", rnr_late_recv),
    ("handshake_connects", handshake_connects),
];

/// The device settings case `name` runs with.
fn tuning(name: &str) -> fn(DeviceConfig) -> DeviceConfig {
    match name {
        "rnr_late_recv" => long_rnr_window,
        _ => |cfg| cfg,
    }
}

/// Runs case `name` on a fresh pair.
pub fn run(name: &str) {
    let (_, case) = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no conformance case {name}"));
    case(&pair_with(tuning(name)));
}
