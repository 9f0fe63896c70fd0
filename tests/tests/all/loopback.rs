//! Real UDP on 127.0.0.1: two devices in this process, and a device in a child process
//! (`braid-test-peer`) driven over its stdin and stdout.
use std::process::Command;
use std::time::Duration;

use braid::{
    Access, Completion, CompletionQueue, Device, DeviceConfig, MemoryRegion, ProtectionDomain,
    QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};
use braid_tests::{PEER_RECV_LEN, PEER_REGION_LEN, fnv1a, format_info, parse_info, pattern_byte};

use braid_tests::oracle::Memory;

use crate::support::{Peer, below, random_mr, rng};

const WAIT: Duration = Duration::from_secs(20);
const PATHS: u16 = 16;

struct End {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn open() -> End {
    let dev = Device::open(DeviceConfig::udp("127.0.0.1:0".parse().expect("addr")).paths(PATHS))
        .expect("open a UDP device");
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    let qp = pd.create_qp(&cq, &cq).expect("qp");
    End { dev, pd, cq, qp }
}

/// Two devices on loopback with connected QPs.
fn pair() -> (End, End) {
    let (a, b) = (open(), open());
    a.qp.connect(b.qp.info()).expect("connect a");
    b.qp.connect(a.qp.info()).expect("connect b");
    (a, b)
}

fn contents(mr: &MemoryRegion) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read(0, &mut v).expect("whole region");
    v
}

fn wait(cq: &CompletionQueue) -> Completion {
    cq.wait(WAIT).expect("a completion within the wait")
}

fn wr(wr_id: u64, op: SendOp, sges: Vec<braid::Sge>) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges,
        signaled: true,
    }
}

#[test]
fn write_lands_byte_exact_over_udp() {
    let (a, b) = pair();
    let (src, data) = random_mr(&a.pd, 1 << 20, Access::NONE, 1);
    let (dst, before) = random_mr(&b.pd, 2 << 20, Access::REMOTE_WRITE, 2);
    let sges = vec![src.sge(0, 300_000), src.sge(500_000, 400_001)];
    a.qp.post_send(wr(1, SendOp::Write(dst.remote(777)), sges))
        .expect("post");
    let wc = wait(&a.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (1, WcStatus::Success, WcOpcode::Write, 700_001)
    );
    let mut want = Memory::new(before);
    want.write(777, &data[..300_000]);
    want.write(777 + 300_000, &data[500_000..900_001]);
    want.check("write", "target", &contents(&dst));
}

#[test]
fn read_returns_byte_exact_over_udp() {
    let (a, b) = pair();
    let (dst, before) = random_mr(&a.pd, 1 << 20, Access::LOCAL_WRITE, 3);
    let (src, data) = random_mr(&b.pd, 1 << 20, Access::REMOTE_READ, 4);
    let sges = vec![
        dst.sge(10, 100_000),
        dst.sge(200_000, 1),
        dst.sge(300_000, 250_000),
    ];
    a.qp.post_send(wr(2, SendOp::Read(src.remote(5)), sges))
        .expect("post");
    let wc = wait(&a.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (2, WcStatus::Success, WcOpcode::Read, 350_001)
    );
    let mut want = Memory::new(before);
    want.write(10, &data[5..100_005]);
    want.write(200_000, &data[100_005..100_006]);
    want.write(300_000, &data[100_006..350_006]);
    want.check("read", "destination", &contents(&dst));
}

/// Two devices on loopback sending 64 KiB datagrams, with connected QPs (encrypted if asked),
/// in progress mode `mode` (`None`: the default).
fn large_datagram_pair(mode: Option<braid::Progress>, encrypted: bool) -> (End, End) {
    large_datagram_pair_sending(mode, encrypted, true)
}

/// [`large_datagram_pair`], sending payloads from their regions or not (`send_in_place`).
fn large_datagram_pair_sending(
    mode: Option<braid::Progress>,
    encrypted: bool,
    send_in_place: bool,
) -> (End, End) {
    let open = || {
        let mut cfg = DeviceConfig::udp("127.0.0.1:0".parse().expect("addr"))
            .paths(4)
            .max_datagram(65_507)
            .send_in_place(send_in_place);
        if let Some(mode) = mode {
            cfg = cfg.progress(mode);
        }
        let dev = Device::open(cfg).expect("open a UDP device");
        let pd = dev.alloc_pd();
        let cq = dev.create_cq();
        let qp = if encrypted {
            pd.create_encrypted_qp(&cq, &cq)
        } else {
            pd.create_qp(&cq, &cq)
        }
        .expect("qp");
        End { dev, pd, cq, qp }
    };
    let (a, b) = (open(), open());
    a.qp.connect(b.qp.info()).expect("connect a");
    b.qp.connect(a.qp.info()).expect("connect b");
    (a, b)
}

/// READs of 64 KiB datagrams, the largest loopback carries: their responses are received
/// straight into the destination (`braid::proto::Landing`), in both progress modes, byte
/// exact; a destination cut into segments still gets every byte (responses that span two
/// segments go the copying way).
#[test]
fn large_read_responses_land_in_place_over_udp() {
    for mode in [braid::Progress::Thread, braid::Progress::Inline] {
        let (a, b) = large_datagram_pair(Some(mode), false);
        let (dst, before) = random_mr(&a.pd, 4 << 20, Access::LOCAL_WRITE, 11);
        let (src, data) = random_mr(&b.pd, 4 << 20, Access::REMOTE_READ, 12);
        let mut want = Memory::new(before);
        for round in 0..4u64 {
            let at = round as usize * 1_000_003 % (2 << 20);
            let len: usize = 1 << 20;
            let sges = if round == 3 {
                vec![
                    dst.sge(at as u64, 300_000),
                    dst.sge(at as u64 + 400_000, len as u32 - 300_000),
                ]
            } else {
                vec![dst.sge(at as u64, len as u32)]
            };
            let from = round as usize * 77_777;
            a.qp.post_send(wr(round, SendOp::Read(src.remote(from as u64)), sges))
                .expect("post");
            let wc = wait(&a.cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (round, WcStatus::Success, len as u32),
                "{mode:?}"
            );
            if round == 3 {
                want.write(at, &data[from..from + 300_000]);
                want.write(at + 400_000, &data[from + 300_000..from + len]);
            } else {
                want.write(at, &data[from..from + len]);
            }
        }
        want.check("large reads", "destination", &contents(&dst));
        let s = a.dev.stats();
        // 16 or 17 responses a READ; the first of each and those cut by a segment's end
        // go the copying way.
        assert!(s.rx_landed >= 30, "{mode:?}: {s:?}");
        // The responses left the responder from the source region, none copied first.
        let sent = b.dev.stats();
        assert!(sent.tx_in_place >= 60, "{mode:?}: {sent:?}");
        assert_eq!(
            s.rx_bad_crc + s.rx_malformed + s.rx_bad_response,
            0,
            "{s:?}"
        );
    }
}

/// On an encrypted connection nothing lands in place (the payload on the wire is ciphertext):
/// the same large READs go the usual way, byte exact.
#[test]
fn large_encrypted_read_responses_do_not_land() {
    let (a, b) = large_datagram_pair(None, true);
    let (dst, before) = random_mr(&a.pd, 2 << 20, Access::LOCAL_WRITE, 13);
    let (src, data) = random_mr(&b.pd, 2 << 20, Access::REMOTE_READ, 14);
    let mut want = Memory::new(before);
    for round in 0..2u64 {
        let at = round as usize * 999_999;
        a.qp.post_send(wr(
            round,
            SendOp::Read(src.remote(at as u64)),
            vec![dst.sge(at as u64, 1 << 20)],
        ))
        .expect("post");
        let wc = wait(&a.cq);
        assert_eq!((wc.wr_id, wc.status), (round, WcStatus::Success));
        want.write(at, &data[at..at + (1 << 20)]);
    }
    want.check("encrypted reads", "destination", &contents(&dst));
    let s = a.dev.stats();
    assert_eq!(s.rx_landed, 0, "{s:?}");
    assert_eq!(s.rx_bad_crc + s.rx_malformed + s.rx_auth_failed, 0, "{s:?}");
    // Nor is anything sent from where it lies: the datagram carries the sealed payload.
    assert_eq!(b.dev.stats().tx_in_place, 0);
}

/// WRITEs of 64 KiB datagrams leave from the source region (`DeviceConfig::send_in_place`):
/// byte exact, from a gather list whose second entry starts mid-datagram (the datagrams
/// that span both entries are gathered as usual), in both progress modes; with the setting
/// off, every payload is gathered.
#[test]
fn large_writes_leave_from_the_source_region_over_udp() {
    for (mode, in_place) in [
        (braid::Progress::Thread, true),
        (braid::Progress::Inline, true),
        (braid::Progress::Thread, false),
    ] {
        let (a, b) = large_datagram_pair_sending(Some(mode), false, in_place);
        let (src, data) = random_mr(&a.pd, 3 << 20, Access::NONE, 21);
        let (dst, before) = random_mr(&b.pd, 3 << 20, Access::REMOTE_WRITE, 22);
        let mut want = Memory::new(before);
        let (first, second) = (700_001usize, 1_300_000usize);
        let sges = vec![src.sge(5, first as u32), src.sge(1_000_000, second as u32)];
        a.qp.post_send(wr(1, SendOp::Write(dst.remote(99)), sges))
            .expect("post");
        let wc = wait(&a.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (1, WcStatus::Success, (first + second) as u32),
            "{mode:?}"
        );
        want.write(99, &data[5..5 + first]);
        want.write(99 + first, &data[1_000_000..1_000_000 + second]);
        want.check("large writes", "destination", &contents(&dst));
        let s = a.dev.stats();
        if in_place {
            // 31 datagrams of 65 KB: all but the one across the two entries.
            assert!(s.tx_in_place >= 28, "{mode:?}: {s:?}");
        } else {
            assert_eq!(s.tx_in_place, 0, "{s:?}");
        }
        assert_eq!(b.dev.stats().rx_bad_crc, 0, "{mode:?}");
    }
}

#[test]
fn send_fills_the_posted_recv_over_udp() {
    let (a, b) = pair();
    let (src, data) = random_mr(&a.pd, 100_000, Access::NONE, 5);
    let (rbuf, before) = random_mr(&b.pd, 100_000, Access::LOCAL_WRITE, 6);
    b.qp.post_recv(RecvWr {
        wr_id: 10,
        sges: vec![rbuf.sge(0, 5000), rbuf.sge(50_000, 50_000)],
    })
    .expect("recv");
    b.qp.post_recv(RecvWr {
        wr_id: 11,
        sges: vec![],
    })
    .expect("recv");
    a.qp.post_send(wr(3, SendOp::SendImm(0xabcd), vec![src.sge(0, 20_000)]))
        .expect("post");
    a.qp.post_send(wr(4, SendOp::Send, vec![])).expect("post");
    let sent: Vec<_> = (0..2)
        .map(|_| wait(&a.cq))
        .map(|c| (c.wr_id, c.status, c.byte_len))
        .collect();
    assert_eq!(
        sent,
        vec![(3, WcStatus::Success, 20_000), (4, WcStatus::Success, 0)]
    );
    let got: Vec<_> = (0..2)
        .map(|_| wait(&b.cq))
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len, c.imm))
        .collect();
    assert_eq!(
        got,
        vec![
            (10, WcStatus::Success, WcOpcode::Recv, 20_000, Some(0xabcd)),
            (11, WcStatus::Success, WcOpcode::Recv, 0, None)
        ]
    );
    let mut want = Memory::new(before);
    want.write(0, &data[..5000]);
    want.write(50_000, &data[5000..20_000]);
    want.check("send", "receive buffer", &contents(&rbuf));
}

#[test]
fn atomics_are_exact_over_udp() {
    let (a, b) = pair();
    let res = a.pd.alloc_mr(8 * 200, Access::LOCAL_WRITE).expect("mr");
    let target = b.pd.alloc_mr(16, Access::REMOTE_ATOMIC).expect("mr");
    target
        .region()
        .write(8, &41u64.to_ne_bytes())
        .expect("in bounds");
    for i in 0..199u64 {
        a.qp.post_send(wr(
            i,
            SendOp::FetchAdd(target.remote(0), 5),
            vec![res.sge(8 * i, 8)],
        ))
        .expect("post");
    }
    let cas = SendOp::CompareSwap {
        remote: target.remote(8),
        compare: 41,
        swap: 99,
    };
    a.qp.post_send(wr(199, cas, vec![res.sge(8 * 199, 8)]))
        .expect("post");
    for i in 0..200 {
        let wc = wait(&a.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (i, WcStatus::Success, 8),
            "completion {i}"
        );
    }
    let word = |mr: &MemoryRegion, off: u64| {
        let mut b = [0u8; 8];
        mr.read(off, &mut b).expect("in bounds");
        u64::from_ne_bytes(b)
    };
    let mut originals: Vec<u64> = (0..199).map(|i| word(&res, 8 * i)).collect();
    originals.sort_unstable();
    assert_eq!(originals, (0..199).map(|i| 5 * i).collect::<Vec<_>>());
    assert_eq!(word(&target, 0), 5 * 199);
    assert_eq!((word(&res, 8 * 199), word(&target, 8)), (41, 99));
}

#[test]
fn many_messages_spread_over_16_paths() {
    let (a, b) = pair();
    let mut r = rng(7);
    let (len, n, max) = (4 << 20, 1000u64, 16_000u64);
    let (src, data) = random_mr(&a.pd, len, Access::NONE, 8);
    // Each message gets its own slice of the target, with gaps, so the final content does
    // not depend on placement order.
    let (dst, before) = random_mr(&b.pd, (n * (max + 64)) as usize, Access::REMOTE_WRITE, 9);
    let mut want = Memory::new(before);
    let (mut posted, mut done, mut next_to) = (0u64, 0u64, 0usize);
    while done < n {
        while posted < n && posted - done < 256 {
            let size = below(&mut r, max) as usize;
            let off = below(&mut r, (len - size) as u64) as usize;
            let to = next_to + below(&mut r, 64) as usize;
            next_to = to + size;
            want.write(to, &data[off..off + size]);
            let op = SendOp::Write(dst.remote(to as u64));
            a.qp.post_send(wr(posted, op, vec![src.sge(off as u64, size as u32)]))
                .expect("post");
            posted += 1;
        }
        let wc = wait(&a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (done, WcStatus::Success),
            "completions come in posting order"
        );
        done += 1;
    }
    want.check("write", "target", &contents(&dst));
    let used = a.dev.path_stats().iter().filter(|p| p.packets > 0).count();
    assert_eq!(
        used,
        usize::from(PATHS),
        "packets were sprayed over every path"
    );
}

/// `braid-test-peer` as a child of this process.
fn spawn_peer() -> Peer {
    Peer::spawn(Command::new(env!("CARGO_BIN_EXE_braid-test-peer")))
}

#[test]
fn write_read_and_send_to_another_process() {
    let mut peer = spawn_peer();
    let (info, rkey, len) = parse_info(&peer.recv()).expect("the peer's QP line");
    assert_eq!(len, PEER_REGION_LEN);
    let me = open();
    me.qp.connect(info).expect("connect");
    assert_eq!(peer.ask(&format_info(&me.qp.info(), 0, 0)), "READY");
    let remote = |offset| braid::RemoteAddr { rkey, offset };

    // WRITE 300 000 bytes into the second half of its region, then ask for a fingerprint.
    let (src, data) = random_mr(&me.pd, 400_000, Access::LOCAL_WRITE, 11);
    let half = PEER_REGION_LEN / 2;
    me.qp
        .post_send(wr(
            1,
            SendOp::Write(remote(half + 3)),
            vec![src.sge(0, 300_000)],
        ))
        .expect("post");
    let wc = wait(&me.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 300_000)
    );
    assert_eq!(
        peer.ask(&format!("SUM {} 300000", half + 3)),
        format!("SUM {}", fnv1a(&data[..300_000]))
    );

    // READ 256 KiB of its pattern.
    let dst = me.pd.alloc_mr(300_000, Access::LOCAL_WRITE).expect("mr");
    me.qp
        .post_send(wr(2, SendOp::Read(remote(1000)), vec![dst.sge(0, 262_144)]))
        .expect("post");
    let wc = wait(&me.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, WcStatus::Success, 262_144)
    );
    let mut got = vec![0u8; 262_144];
    dst.read(0, &mut got).expect("in bounds");
    let want: Vec<u8> = (1000..1000 + 262_144).map(pattern_byte).collect();
    assert!(got == want, "READ from the peer differs from its pattern");

    // SEND with immediate into its posted RECV.
    me.qp
        .post_send(wr(3, SendOp::SendImm(4242), vec![src.sge(1000, 50_000)]))
        .expect("post");
    let wc = wait(&me.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (3, WcStatus::Success, 50_000)
    );
    const { assert!(50_000 <= PEER_RECV_LEN) };
    let line = peer.ask("RECV");
    assert_eq!(
        line,
        format!("RECV 1 Success 50000 4242 {}", fnv1a(&data[1000..51_000]))
    );

    // A fetch-add on its region.
    let res = me.pd.alloc_mr(8, Access::LOCAL_WRITE).expect("mr");
    me.qp
        .post_send(wr(
            4,
            SendOp::FetchAdd(remote(half - 8), 1),
            vec![res.sge(0, 8)],
        ))
        .expect("post");
    assert_eq!(wait(&me.cq).status, WcStatus::Success);
    let mut orig = [0u8; 8];
    res.read(0, &mut orig).expect("in bounds");
    let want: Vec<u8> = (half - 8..half).map(pattern_byte).collect();
    assert_eq!(&orig[..], &want[..], "fetch-add returned the original word");

    peer.quit(WAIT);
}
