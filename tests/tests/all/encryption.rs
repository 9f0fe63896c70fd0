//! Encrypted QPs (`braid_proto::seal`): agreement at connect, and what an attacker on the path
//! can and cannot do. Two engines are driven by hand so the tests can capture, alter, replay
//! and forge datagrams; the last tests run encrypted devices over real UDP on loopback.
//! (Every op under loss, reordering, duplication and corruption is in `sim_e2e::encrypted_*`.)
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use braid::proto::seal::{self, Party, Sealer};
use braid::proto::wire::{self, Body, Header};
use braid::proto::{
    Access, CqId, Endpoint, EndpointConfig, MrKeys, PdId, QpInfo, QpOptions, QpState, Region,
    RemoteAddr, ResourceError, SendOp, SendWr, Sge, Timestamp, WcOpcode, WcStatus,
};
use braid::{Device, DeviceConfig};

const A: &str = "10.0.0.1:4791";
const B: &str = "10.0.0.2:4791";
const LEN: usize = 4096;

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

/// One engine with a PD and a CQ.
struct Node {
    ep: Endpoint,
    pd: PdId,
    cq: CqId,
}

fn node(at: &str, seed: u64) -> Node {
    let cfg = EndpointConfig {
        seed,
        ..EndpointConfig::default()
    };
    let mut ep = Endpoint::new(cfg, addr(at));
    let pd = ep.alloc_pd();
    let cq = ep.create_cq();
    Node { ep, pd, cq }
}

fn opts(encrypted: bool, key_byte: u8) -> QpOptions {
    if encrypted {
        QpOptions::encrypted([key_byte; 32])
    } else {
        QpOptions::default()
    }
}

impl Node {
    fn qp(&mut self, o: QpOptions) -> QpInfo {
        self.ep
            .create_qp_with(self.pd, self.cq, self.cq, o)
            .expect("fresh PD and CQ")
    }

    fn mr(&mut self, access: Access) -> (Arc<Region>, MrKeys) {
        let region = Region::new(LEN);
        let keys = self
            .ep
            .register(self.pd, region.clone(), access)
            .expect("known PD");
        (region, keys)
    }

    /// Every datagram the engine has to send now.
    fn out(&mut self, now: Timestamp) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 65_536];
        let mut v = Vec::new();
        while let Some(t) = self.ep.poll_transmit(now, &mut buf) {
            v.push(buf[..t.len].to_vec());
        }
        v
    }
}

/// Two engines, A (10.0.0.1) and B (10.0.0.2), on a perfect in-memory wire.
struct Two {
    a: Node,
    b: Node,
    now: Timestamp,
}

impl Two {
    fn new() -> Two {
        Two {
            a: node(A, 1),
            b: node(B, 2),
            now: Timestamp::ZERO,
        }
    }

    /// A connected QP pair, encrypted or plain; keys differ per call through `key_byte`.
    fn pair(&mut self, encrypted: bool, key_byte: u8) -> (QpInfo, QpInfo) {
        let qa = self.a.qp(opts(encrypted, key_byte));
        let qb = self.b.qp(opts(encrypted, key_byte.wrapping_add(1)));
        self.a.ep.connect(qa.qpn, qb).expect("connect a");
        self.b.ep.connect(qb.qpn, qa).expect("connect b");
        (qa, qb)
    }

    /// Delivers everything both ways until both engines are quiet.
    fn run(&mut self) {
        for _ in 0..10_000 {
            let (xa, xb) = (self.a.out(self.now), self.b.out(self.now));
            if xa.is_empty() && xb.is_empty() {
                return;
            }
            for d in &xa {
                self.b.ep.handle_datagram(self.now, addr(A), 0, d);
            }
            for d in &xb {
                self.a.ep.handle_datagram(self.now, addr(B), 0, d);
            }
            self.now = self.now.add_nanos(10_000);
            self.a.ep.handle_timeout(self.now);
            self.b.ep.handle_timeout(self.now);
        }
        panic!("the engines never went quiet");
    }
}

fn write_wr(id: u64, src: &MrKeys, len: u32, dst: &MrKeys, offset: u64) -> SendWr {
    SendWr {
        wr_id: id,
        op: SendOp::Write(RemoteAddr {
            rkey: dst.rkey,
            offset,
        }),
        sges: vec![Sge {
            lkey: src.lkey,
            offset: 0,
            len,
        }],
        signaled: true,
    }
}

fn whole(r: &Arc<Region>) -> Vec<u8> {
    r.to_vec(0, r.len()).expect("whole region")
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// An encrypted pair with A's source region full of a pattern and B's target region zeroed.
struct Write {
    t: Two,
    qa: QpInfo,
    src: MrKeys,
    dst: (Arc<Region>, MrKeys),
    data: Vec<u8>,
}

fn encrypted_write_setup() -> Write {
    let mut t = Two::new();
    let (qa, _) = t.pair(true, 7);
    let (src_region, src) = t.a.mr(Access::NONE);
    let data = pattern(0x5a);
    src_region.write(0, &data).expect("in bounds");
    let dst = t.b.mr(Access::REMOTE_WRITE);
    Write {
        t,
        qa,
        src,
        dst,
        data,
    }
}

#[test]
fn encrypted_and_plain_qps_cannot_connect() {
    let mut t = Two::new();
    let enc = t.a.qp(opts(true, 1));
    let plain = t.b.qp(opts(false, 0));
    assert!(enc.seal_key.is_some() && plain.seal_key.is_none());
    assert_eq!(
        t.a.ep.connect(enc.qpn, plain),
        Err(ResourceError::EncryptionMismatch)
    );
    assert_eq!(
        t.b.ep.connect(plain.qpn, enc),
        Err(ResourceError::EncryptionMismatch)
    );
    // Nothing changed: both QPs are still in Init and can connect to a matching peer.
    assert_eq!(
        t.a.ep.qp_stats(enc.qpn).map(|s| s.state),
        Some(QpState::Init)
    );
    assert_eq!(
        t.b.ep.qp_stats(plain.qpn).map(|s| s.state),
        Some(QpState::Init)
    );
    let enc_b = t.b.qp(opts(true, 2));
    assert_eq!(t.a.ep.connect(enc.qpn, enc_b), Ok(()));
}

#[test]
fn a_low_order_peer_key_is_refused_at_connect() {
    let mut t = Two::new();
    let qa = t.a.qp(opts(true, 1));
    let mut qb = t.b.qp(opts(true, 2));
    qb.seal_key = Some([0u8; 32]);
    assert_eq!(t.a.ep.connect(qa.qpn, qb), Err(ResourceError::BadPeerKey));
    assert_eq!(
        t.a.ep.qp_stats(qa.qpn).map(|s| s.state),
        Some(QpState::Init)
    );
}

#[test]
fn every_packet_of_an_encrypted_connection_is_sealed_and_the_write_lands() {
    let mut w = encrypted_write_setup();
    w.t.a
        .ep
        .post_send(w.qa.qpn, write_wr(1, &w.src, 3000, &w.dst.1, 100))
        .expect("post");
    let mut seen = 0;
    for _ in 0..100 {
        let (xa, xb) = (w.t.a.out(w.t.now), w.t.b.out(w.t.now));
        if xa.is_empty() && xb.is_empty() {
            break;
        }
        for d in &xa {
            assert!(wire::is_sealed(d), "request not sealed");
            assert_eq!(wire::Packet::parse(d), Err(wire::Error::Sealed));
            // The payload is not in clear anywhere in the datagram.
            assert!(
                !d.windows(64)
                    .any(|win| w.data.windows(64).any(|x| x == win))
            );
            w.t.b.ep.handle_datagram(w.t.now, addr(A), 0, d);
            seen += 1;
        }
        for d in &xb {
            assert!(wire::is_sealed(d), "ACK not sealed");
            w.t.a.ep.handle_datagram(w.t.now, addr(B), 0, d);
            seen += 1;
        }
        w.t.now = w.t.now.add_nanos(10_000);
    }
    assert!(seen >= 4, "3000 bytes take three packets and an ACK");
    let wc = w.t.a.ep.poll_completion().expect("a completion").1;
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::Write)
    );
    let got = whole(&w.dst.0);
    assert_eq!(&got[100..3100], &w.data[..3000]);
    assert!(got[..100].iter().chain(&got[3100..]).all(|&b| b == 0));
    let (sa, sb) = (w.t.a.ep.stats(), w.t.b.ep.stats());
    assert_eq!((sa.rx_auth_failed, sb.rx_auth_failed), (0, 0));
    assert_eq!((sa.rx_replayed, sb.rx_replayed), (0, 0));
}

#[test]
fn a_tampered_datagram_is_dropped_and_counted_and_memory_is_unchanged() {
    let mut w = encrypted_write_setup();
    w.t.a
        .ep
        .post_send(w.qa.qpn, write_wr(1, &w.src, 500, &w.dst.1, 0))
        .expect("post");
    let pkts = w.t.a.out(w.t.now);
    assert_eq!(pkts.len(), 1);
    let orig = &pkts[0];
    // Header fields (kind, PSN, timestamp), the sequence number, the encrypted body, the
    // encrypted payload and the tag: a flipped bit anywhere there fails authentication.
    let spots = [
        1,
        13,
        20,
        wire::HEADER_LEN + 7,
        wire::HEADER_LEN + wire::SEAL_SEQ_LEN + 5,
        orig.len() - wire::SEAL_TAG_LEN - 1,
        orig.len() - 1,
    ];
    for (i, &at) in spots.iter().enumerate() {
        let mut bad = orig.clone();
        bad[at] ^= 0x10;
        w.t.b.ep.handle_datagram(w.t.now, addr(A), 0, &bad);
        assert_eq!(
            w.t.b.ep.stats().rx_auth_failed,
            i as u64 + 1,
            "flip at {at}"
        );
    }
    assert!(whole(&w.dst.0).iter().all(|&b| b == 0), "memory changed");
    assert!(w.t.b.out(w.t.now).is_empty(), "B answered a forged packet");
    // The genuine datagram still goes through afterwards.
    w.t.b.ep.handle_datagram(w.t.now, addr(A), 0, orig);
    w.t.run();
    assert_eq!(&whole(&w.dst.0)[..500], &w.data[..500]);
    let wc = w.t.a.ep.poll_completion().expect("completion").1;
    assert_eq!(wc.status, WcStatus::Success);
}

#[test]
fn a_replayed_datagram_is_rejected_and_counted_including_acks() {
    let mut w = encrypted_write_setup();
    w.t.a
        .ep
        .post_send(w.qa.qpn, write_wr(1, &w.src, 200, &w.dst.1, 0))
        .expect("post");
    let req = w.t.a.out(w.t.now);
    assert_eq!(req.len(), 1);
    w.t.b.ep.handle_datagram(w.t.now, addr(A), 0, &req[0]);
    let acks = w.t.b.out(w.t.now);
    assert_eq!(acks.len(), 1);
    w.t.a.ep.handle_datagram(w.t.now, addr(B), 0, &acks[0]);
    w.t.run();
    assert_eq!(
        w.t.a.ep.poll_completion().map(|c| c.1.status),
        Some(WcStatus::Success)
    );
    // Later: B's owner reuses the memory; a replay of the captured WRITE must not land again.
    w.t.now = w.t.now.add_nanos(1_000_000_000);
    w.dst.0.write(0, &[0xEE; 200]).expect("in bounds");
    w.t.b.ep.handle_datagram(w.t.now, addr(A), 0, &req[0]);
    assert_eq!(w.t.b.ep.stats().rx_replayed, 1);
    assert_eq!(w.t.b.ep.stats().rx_auth_failed, 0);
    assert!(
        whole(&w.dst.0)[..200].iter().all(|&b| b == 0xEE),
        "replay landed"
    );
    assert!(w.t.b.out(w.t.now).is_empty(), "B answered a replay");
    // And a replayed ACK is refused at A.
    w.t.a.ep.handle_datagram(w.t.now, addr(B), 0, &acks[0]);
    assert_eq!(w.t.a.ep.stats().rx_replayed, 1);
}

/// A datagram for B's QP from A's address and QP, with correct-looking fields, sealed by an
/// attacker who knows both public keys but not A's private key.
#[test]
fn a_datagram_sealed_with_another_key_is_rejected() {
    let mut t = Two::new();
    let (qa, qb) = t.pair(true, 9);
    let dst_region = t.b.mr(Access::REMOTE_WRITE);
    let attacker_secret = [0x42u8; 32];
    let forger = Sealer::new(
        &attacker_secret,
        Party {
            public: seal::public_key(&attacker_secret),
            qpn: qa.qpn,
            psn: qa.psn,
        },
        Party {
            public: qb.seal_key.expect("encrypted"),
            qpn: qb.qpn,
            psn: qb.psn,
        },
    )
    .expect("a valid key pair");
    let h = Header {
        kind: wire::Kind::Request,
        path: 0,
        flags: 0,
        dst_qpn: qb.qpn,
        src_qpn: qa.qpn,
        psn: qa.psn,
        send_ts_ns: 1,
    };
    let body = Body::Request(wire::Request {
        op: wire::Op::Write,
        msn: 0,
        ssn: 0,
        imm: 0,
        rkey: dst_region.1.rkey,
        msg_len: 64,
        offset: 0,
        remote_offset: 0,
    });
    let mut buf = [0u8; 256];
    let len = forger
        .emit(&mut buf, &h, &body, 64, |p| p.fill(0xAB))
        .expect("room");
    t.b.ep.handle_datagram(t.now, addr(A), 0, &buf[..len]);
    assert_eq!(t.b.ep.stats().rx_auth_failed, 1);
    assert!(
        whole(&dst_region.0).iter().all(|&b| b == 0),
        "forgery landed"
    );
    // The same request in clear, with a valid CRC, is refused too.
    let len = wire::emit(&mut buf, &h, &body, 64, |p| p.fill(0xAB)).expect("room");
    t.b.ep.handle_datagram(t.now, addr(A), 0, &buf[..len]);
    assert_eq!(t.b.ep.stats().rx_auth_failed, 2);
    assert!(
        whole(&dst_region.0).iter().all(|&b| b == 0),
        "plain packet landed"
    );
    assert!(t.b.out(t.now).is_empty(), "B answered a forgery");
}

#[test]
fn attacks_on_an_encrypted_qp_leave_other_qps_alone() {
    let mut t = Two::new();
    let (enc_a, _) = t.pair(true, 3);
    let (plain_a, _) = t.pair(false, 0);
    let (enc2_a, _) = t.pair(true, 5);
    let (src_region, src) = t.a.mr(Access::NONE);
    let data = pattern(0x33);
    src_region.write(0, &data).expect("in bounds");
    let dsts: Vec<_> = (0..3).map(|_| t.b.mr(Access::REMOTE_WRITE)).collect();
    for (i, qpn) in [enc_a.qpn, plain_a.qpn, enc2_a.qpn].into_iter().enumerate() {
        let wr = write_wr(i as u64, &src, 2000 + i as u32, &dsts[i].1, 0);
        t.a.ep.post_send(qpn, wr).expect("post");
    }
    // Deliver with an attacker in the middle: every datagram also arrives tampered, and
    // every earlier datagram is replayed.
    let mut captured: Vec<Vec<u8>> = Vec::new();
    for _ in 0..1000 {
        let (xa, xb) = (t.a.out(t.now), t.b.out(t.now));
        if xa.is_empty() && xb.is_empty() {
            break;
        }
        for d in &xa {
            let mut bad = d.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            t.b.ep.handle_datagram(t.now, addr(A), 0, &bad);
            t.b.ep.handle_datagram(t.now, addr(A), 0, d);
            for old in &captured {
                t.b.ep.handle_datagram(t.now, addr(A), 0, old);
            }
            captured.push(d.clone());
        }
        for d in &xb {
            t.a.ep.handle_datagram(t.now, addr(B), 0, d);
        }
        t.now = t.now.add_nanos(10_000);
        t.a.ep.handle_timeout(t.now);
        t.b.ep.handle_timeout(t.now);
    }
    let mut done = Vec::new();
    while let Some((_, wc)) = t.a.ep.poll_completion() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        done.push(wc.wr_id);
    }
    done.sort_unstable();
    assert_eq!(done, vec![0, 1, 2]);
    for (i, (region, _)) in dsts.iter().enumerate() {
        let n = 2000 + i;
        assert_eq!(&whole(region)[..n], &data[..n], "QP {i}");
    }
    let st = t.b.ep.stats();
    assert!(st.rx_auth_failed > 0 && st.rx_replayed > 0, "{st:?}");
    // The plain QP's tampered copies fail the CRC; its replays are ordinary duplicates.
    assert!(st.rx_bad_crc > 0, "{st:?}");
}

fn open_udp() -> Device {
    Device::open(DeviceConfig::udp("127.0.0.1:0".parse().expect("addr")).paths(8))
        .expect("open a UDP device")
}

#[test]
fn encrypted_write_read_and_atomic_over_udp_loopback() {
    let (da, db) = (open_udp(), open_udp());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (ca, cb) = (da.create_cq(), db.create_cq());
    let qa = pa.create_encrypted_qp(&ca, &ca).expect("qp a");
    let qb = pb.create_encrypted_qp(&cb, &cb).expect("qp b");
    assert!(qa.info().seal_key.is_some());
    qa.connect(qb.info()).expect("connect a");
    qb.connect(qa.info()).expect("connect b");
    let n = 300_000usize;
    let src = pa.alloc_mr(n, Access::LOCAL_WRITE).expect("mr");
    let data: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
    src.write(0, &data).expect("in bounds");
    let dst = pb
        .alloc_mr(
            n + 8,
            Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        )
        .expect("mr");
    let post = |id: u64, op: SendOp, sges: Vec<Sge>| {
        qa.post_send(SendWr {
            wr_id: id,
            op,
            sges,
            signaled: true,
        })
        .expect("post");
        let wc = ca.wait(Duration::from_secs(20)).expect("a completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    };
    post(1, SendOp::Write(dst.remote(8)), vec![src.sge(0, n as u32)]);
    let mut got = vec![0u8; n];
    dst.read(8, &mut got).expect("in bounds");
    assert!(got == data, "WRITE differs");
    // READ it back over the top of the source's first half, after clearing it.
    src.write(0, &vec![0u8; n / 2]).expect("in bounds");
    post(
        2,
        SendOp::Read(dst.remote(8)),
        vec![src.sge(0, (n / 2) as u32)],
    );
    let mut back = vec![0u8; n / 2];
    src.read(0, &mut back).expect("in bounds");
    assert!(back == data[..n / 2], "READ differs");
    post(3, SendOp::FetchAdd(dst.remote(0), 5), vec![src.sge(0, 8)]);
    post(4, SendOp::FetchAdd(dst.remote(0), 5), vec![src.sge(0, 8)]);
    let mut word = [0u8; 8];
    src.read(0, &mut word).expect("in bounds");
    assert_eq!(
        u64::from_ne_bytes(word),
        5,
        "fetch-add returned the old value"
    );
    let (sa, sb) = (da.stats(), db.stats());
    assert_eq!((sa.rx_auth_failed, sb.rx_auth_failed), (0, 0));
}

#[test]
fn an_encrypted_device_qp_refuses_a_plain_one_over_udp() {
    let (da, db) = (open_udp(), open_udp());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (ca, cb) = (da.create_cq(), db.create_cq());
    let qa = pa.create_encrypted_qp(&ca, &ca).expect("qp a");
    let qb = pb.create_qp(&cb, &cb).expect("qp b");
    assert_eq!(
        qa.connect(qb.info()),
        Err(ResourceError::EncryptionMismatch)
    );
    assert_eq!(
        qb.connect(qa.info()),
        Err(ResourceError::EncryptionMismatch)
    );
}
