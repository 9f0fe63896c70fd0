//! Devices with several engine shards (`DeviceConfig::shards`) over loopback UDP: every
//! operation on QPs spread over the shards, a completion queue fed by several shards, a QP
//! error on one shard leaving the others alone, deregistration revoking a region on every
//! shard, the handshake (on shard 0) beside QPs on other shards, and inline progress.
//!
//! The shard count is set explicitly here, so these tests mean the same whatever
//! `BRAID_SHARDS` says.
use std::collections::HashSet;
use std::time::Duration;

use braid::{
    Access, Completion, CompletionQueue, Device, DeviceConfig, MemoryRegion, OpenError, Progress,
    ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

const WAIT: Duration = Duration::from_secs(20);

struct Dev {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

fn open(shards: usize, progress: Progress) -> Dev {
    let cfg = DeviceConfig::udp("127.0.0.1:0".parse().unwrap())
        .paths(4)
        .shards(shards)
        .progress(progress);
    let dev = Device::open(cfg).expect("open a sharded UDP device");
    assert_eq!(dev.shards(), shards);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq();
    Dev { dev, pd, cq }
}

/// `n` connected QP pairs between `a` and `b`, every QP reporting to its device's one CQ.
fn connect(a: &Dev, b: &Dev, n: usize) -> Vec<(QueuePair, QueuePair)> {
    (0..n)
        .map(|_| {
            let qa = a.pd.create_qp(&a.cq, &a.cq).expect("qp a");
            let qb = b.pd.create_qp(&b.cq, &b.cq).expect("qp b");
            qa.connect(qb.info()).expect("connect a");
            qb.connect(qa.info()).expect("connect b");
            (qa, qb)
        })
        .collect()
}

fn wr(wr_id: u64, op: SendOp, sges: Vec<Sge>) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges,
        signaled: true,
    }
}

fn wait(cq: &CompletionQueue) -> Completion {
    cq.wait(WAIT).expect("a completion within the wait")
}

fn read_u64(mr: &MemoryRegion, off: u64) -> u64 {
    let mut b = [0u8; 8];
    mr.read(off, &mut b).unwrap();
    u64::from_le_bytes(b)
}

/// The QPs of a device with `shards` shards land on every shard: their addresses (one per
/// shard's socket set) are `shards` distinct ones, and the first is not the device's own
/// (shard 0's, which the handshake uses).
fn assert_spread(dev: &Device, qps: &[&QueuePair], shards: usize) {
    let addrs: HashSet<_> = qps.iter().map(|q| q.info().addr).collect();
    assert_eq!(addrs.len(), shards, "QPs on {shards} shards: {addrs:?}");
    if shards > 1 {
        assert_ne!(qps[0].info().addr, dev.local_addr());
        assert!(addrs.contains(&dev.local_addr()));
    } else {
        assert_eq!(qps[0].info().addr, dev.local_addr());
    }
}

fn every_operation_on_qps_spread_over(shards: usize, progress: Progress) {
    const QPS: usize = 4;
    let (a, b) = (open(shards, progress), open(shards, progress));
    let pairs = connect(&a, &b, QPS);
    assert_spread(
        &a.dev,
        &pairs.iter().map(|p| &p.0).collect::<Vec<_>>(),
        shards,
    );
    assert_spread(
        &b.dev,
        &pairs.iter().map(|p| &p.1).collect::<Vec<_>>(),
        shards,
    );
    // One region on each side, used by every QP (so by every shard) at its own offsets.
    const SLOT: u64 = 64 << 10;
    let len = SLOT as usize * QPS;
    let src = a.pd.alloc_mr(len, Access::LOCAL_WRITE).unwrap();
    let dst =
        b.pd.alloc_mr(
            len,
            Access::REMOTE_WRITE | Access::REMOTE_READ | Access::LOCAL_WRITE,
        )
        .unwrap();
    let atomics = b.pd.alloc_mr(8 * QPS, Access::REMOTE_ATOMIC).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    src.write(0, &data).unwrap();
    for (i, (qa, qb)) in pairs.iter().enumerate() {
        let i = i as u64;
        let base = i * SLOT;
        let id = |k: u64| i * 100 + k;
        // WRITE of 20 000 bytes (several packets), READ of it back into the second half of
        // the slot, SEND into a posted RECV, then both atomics.
        qb.post_recv(RecvWr {
            wr_id: id(9),
            sges: vec![dst.sge(base + 40_000, 1000)],
        })
        .unwrap();
        qa.post_send(wr(
            id(1),
            SendOp::Write(dst.remote(base)),
            vec![src.sge(base, 20_000)],
        ))
        .unwrap();
        qa.post_send(wr(
            id(2),
            SendOp::Read(dst.remote(base)),
            vec![src.sge(base + 20_000, 20_000)],
        ))
        .unwrap();
        qa.post_send(wr(
            id(3),
            SendOp::SendImm(i as u32),
            vec![src.sge(base, 1000)],
        ))
        .unwrap();
        qa.post_send(wr(
            id(4),
            SendOp::FetchAdd(atomics.remote(i * 8), 10 + i),
            vec![src.sge(base + 60_000, 8)],
        ))
        .unwrap();
        qa.post_send(wr(
            id(5),
            SendOp::CompareSwap {
                remote: atomics.remote(i * 8),
                compare: 10 + i,
                swap: 1000 + i,
            },
            vec![src.sge(base + 60_008, 8)],
        ))
        .unwrap();
    }
    // Each QP's completions in its posting order, whatever the interleaving between QPs on
    // the shared CQ.
    let mut per_qp: Vec<Vec<Completion>> = vec![Vec::new(); QPS];
    for _ in 0..QPS * 5 {
        let c = wait(&a.cq);
        per_qp[(c.wr_id / 100) as usize].push(c);
    }
    for (i, got) in per_qp.iter().enumerate() {
        let i = i as u64;
        let got: Vec<_> = got
            .iter()
            .map(|c| (c.wr_id - i * 100, c.status, c.opcode))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, WcStatus::Success, WcOpcode::Write),
                (2, WcStatus::Success, WcOpcode::Read),
                (3, WcStatus::Success, WcOpcode::Send),
                (4, WcStatus::Success, WcOpcode::FetchAdd),
                (5, WcStatus::Success, WcOpcode::CompareSwap),
            ],
            "QP {i} on {shards} shards"
        );
    }
    let mut recvs: Vec<_> = (0..QPS).map(|_| wait(&b.cq)).collect();
    recvs.sort_by_key(|c| c.wr_id);
    for (i, c) in recvs.iter().enumerate() {
        let qpn = pairs[i].1.info().qpn;
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len, c.imm, c.qpn),
            (
                i as u64 * 100 + 9,
                WcStatus::Success,
                WcOpcode::Recv,
                1000,
                Some(i as u32),
                qpn
            )
        );
    }
    for i in 0..QPS as u64 {
        let base = (i * SLOT) as usize;
        let mut got = vec![0u8; 20_000];
        dst.read(base as u64, &mut got).unwrap();
        assert!(got == data[base..base + 20_000], "WRITE of QP {i}");
        src.read(base as u64 + 20_000, &mut got).unwrap();
        assert!(got == data[base..base + 20_000], "READ of QP {i}");
        let mut sent = vec![0u8; 1000];
        dst.read(base as u64 + 40_000, &mut sent).unwrap();
        assert!(sent == data[base..base + 1000], "SEND of QP {i}");
        // fetch-add saw 0, compare-swap saw 10 + i and swapped.
        assert_eq!(read_u64(&src, base as u64 + 60_000), 0);
        assert_eq!(read_u64(&src, base as u64 + 60_008), 10 + i);
        assert_eq!(read_u64(&atomics, i * 8), 1000 + i);
    }
    assert!(a.cq.poll_one().is_none() && b.cq.poll_one().is_none());
    // Every shard took part: the summed counters cover every QP's traffic.
    let stats = a.dev.stats();
    assert!(stats.tx_datagrams >= (QPS * 5) as u64, "{stats:?}");
}

#[test]
fn every_operation_works_on_qps_spread_over_1_2_and_4_shards() {
    for shards in [1, 2, 4] {
        every_operation_on_qps_spread_over(shards, Progress::Thread);
    }
}

#[test]
fn every_operation_works_on_two_shards_with_inline_progress() {
    // The CQ is fed by both shards: pollers drive both.
    every_operation_on_qps_spread_over(2, Progress::Inline);
}

#[test]
fn a_qp_error_on_one_shard_leaves_qps_on_another_working() {
    let (a, b) = (open(2, Progress::Thread), open(2, Progress::Thread));
    let pairs = connect(&a, &b, 2);
    let (bad, good) = (&pairs[0], &pairs[1]);
    assert_ne!(
        bad.0.info().addr,
        good.0.info().addr,
        "the two QPs share a shard"
    );
    let src = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
    src.write(0, &[9; 64]).unwrap();
    // A WRITE with a bad remote key: the QP on shard 1 goes to error, and what was posted
    // after it is flushed.
    let mut wrong = dst.remote(0);
    wrong.rkey ^= 0x5a5a;
    bad.0
        .post_send(wr(1, SendOp::Write(wrong), vec![src.sge(0, 8)]))
        .unwrap();
    bad.0
        .post_send(wr(2, SendOp::Write(dst.remote(0)), vec![src.sge(0, 8)]))
        .unwrap();
    let c1 = wait(&a.cq);
    let c2 = wait(&a.cq);
    assert_eq!((c1.wr_id, c1.status), (1, WcStatus::RemoteAccessError));
    assert_eq!((c2.wr_id, c2.status), (2, WcStatus::Flushed));
    assert_eq!(bad.0.stats().unwrap().state, braid::QpState::Error);
    // The QP on shard 0, on the same CQ and regions, is untouched.
    for i in 0..10u64 {
        good.0
            .post_send(wr(
                10 + i,
                SendOp::Write(dst.remote(i * 4)),
                vec![src.sge(0, 4)],
            ))
            .unwrap();
        let c = wait(&a.cq);
        assert_eq!((c.wr_id, c.status), (10 + i, WcStatus::Success));
    }
    assert_eq!(good.0.stats().unwrap().state, braid::QpState::Connected);
    let mut got = [0u8; 40];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, [9; 40]);
    // set_error on the good QP's peer flushes the RECV posted there, and nothing else.
    good.1
        .post_recv(RecvWr {
            wr_id: 77,
            sges: vec![],
        })
        .unwrap();
    good.1.set_error().unwrap();
    let c = wait(&b.cq);
    assert_eq!((c.wr_id, c.status), (77, WcStatus::Flushed));
    assert!(b.cq.poll_one().is_none());
}

#[test]
fn a_deregistered_region_is_revoked_on_every_shard() {
    let (a, b) = (open(2, Progress::Thread), open(2, Progress::Thread));
    let pairs = connect(&a, &b, 2);
    let src = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
    // First the key works through both of B's shards.
    for (i, (qa, _)) in pairs.iter().enumerate() {
        qa.post_send(wr(
            i as u64,
            SendOp::Write(dst.remote(0)),
            vec![src.sge(0, 8)],
        ))
        .unwrap();
        assert_eq!(wait(&a.cq).status, WcStatus::Success);
    }
    let remote = dst.remote(0);
    drop(dst);
    // Then it is refused by both.
    for (i, (qa, _)) in pairs.iter().enumerate() {
        qa.post_send(wr(
            10 + i as u64,
            SendOp::Write(remote),
            vec![src.sge(0, 8)],
        ))
        .unwrap();
        let c = wait(&a.cq);
        assert_eq!(
            (c.wr_id, c.status),
            (10 + i as u64, WcStatus::RemoteAccessError)
        );
    }
    // A local key deregistered is refused at post on every shard.
    let lkey = src.lkey();
    drop(src);
    let other = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
    for (qa, _) in &pairs {
        let wr = wr(
            20,
            SendOp::Write(other.remote(0)),
            vec![Sge {
                lkey,
                offset: 0,
                len: 8,
            }],
        );
        assert_eq!(qa.post_send(wr), Err(braid::PostError::InvalidLkey));
    }
}

#[test]
fn the_handshake_connects_sharded_devices_beside_qps_on_other_shards() {
    let (a, b) = (open(2, Progress::Thread), open(2, Progress::Thread));
    a.dev.enable_handshake(&a.pd, &a.cq, &a.cq).unwrap();
    b.dev.enable_handshake(&b.pd, &b.cq, &b.cq).unwrap();
    // A QP pair made by hand first (on shard 1 of each device).
    let pairs = connect(&a, &b, 1);
    let dst = b.pd.alloc_mr(64, Access::REMOTE_WRITE).unwrap();
    let src = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    src.write(0, &[4; 64]).unwrap();
    let conn = a
        .dev
        .wait_connected(b.dev.local_addr(), WAIT)
        .expect("the handshake connects");
    assert_eq!(
        conn.remote.addr,
        b.dev.local_addr(),
        "handshake QPs are shard 0's"
    );
    assert_ne!(pairs[0].0.info().addr, a.dev.local_addr());
    a.dev
        .post_send_to(
            b.dev.local_addr(),
            wr(1, SendOp::Write(dst.remote(0)), vec![src.sge(0, 16)]),
        )
        .unwrap();
    pairs[0]
        .0
        .post_send(wr(2, SendOp::Write(dst.remote(16)), vec![src.sge(0, 16)]))
        .unwrap();
    let mut done: Vec<_> = (0..2)
        .map(|_| wait(&a.cq))
        .map(|c| (c.wr_id, c.status))
        .collect();
    done.sort_by_key(|d| d.0);
    assert_eq!(done, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let mut got = [0u8; 32];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, [4; 32]);
}

#[test]
fn shard_counts_outside_1_to_64_are_refused() {
    for shards in [0, 65] {
        let cfg = DeviceConfig::udp("127.0.0.1:0".parse().unwrap()).shards(shards);
        match Device::open(cfg) {
            Err(OpenError::InvalidConfig(why)) => assert!(why.contains("shards"), "{why}"),
            other => panic!("{shards} shards opened: {other:?}"),
        }
    }
}
