//! The protocol engine's cost per packet, without any datapath: two `braid_proto::Endpoint`s
//! in one thread, datagrams moved A→B and ACKs B→A by hand on a fake clock.
//!
//! Each iteration posts one RDMA WRITE of `PACKETS` full packets and drives both engines until
//! its completion: A packetizes (gathering from its region, CRC), B parses, checks, places and
//! acknowledges, A processes the ACKs and completes. Throughput is reported per data packet.
//!
//! The `_sealed` variants run the same on an encrypted QP pair (`braid_proto::seal`): every
//! data packet and ACK is sealed with AES-256-GCM and opened on the other side. Their datagrams
//! are `SEAL_OVERHEAD` (20) bytes longer, so each packet carries the same payload as the plain
//! variant of the same name.
//!
//! `cargo bench -p braid-bench --bench engine`
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;

use braid::proto::wire::SEAL_OVERHEAD;
use braid::proto::{
    Access, CqId, Endpoint, EndpointConfig, QpOptions, Region, RemoteAddr, SendOp, SendWr, Sge,
    Timestamp, WcStatus,
};
use criterion::{Criterion, Throughput, criterion_group};

/// Data packets per WRITE (the SACK span: at most this many packets are outstanding).
const PACKETS: u64 = 256;
/// Header + request body + CRC trailer of a WRITE packet: chunk = max_datagram - 64.
const WRITE_OVERHEAD: usize = 64;
/// Datagrams moved per round before the other side answers (as the runtime's batch).
const BATCH: usize = 64;

struct Pair {
    a: Endpoint,
    b: Endpoint,
    a_addr: SocketAddr,
    b_addr: SocketAddr,
    qpn: u32,
    cq: CqId,
    lkey: u32,
    rkey: u32,
    len: u32,
    now: Timestamp,
    /// `BATCH` slots of `size` bytes.
    bufs: Vec<u8>,
    size: usize,
    metas: Vec<braid::proto::Transmit>,
    next_id: u64,
    _regions: (std::sync::Arc<Region>, std::sync::Arc<Region>),
}

impl Pair {
    /// A connected pair whose WRITEs carry `payload` bytes per packet, encrypted if `sealed`.
    fn new(payload: usize, msg_len: u32, sealed: bool) -> Pair {
        let extra = if sealed { SEAL_OVERHEAD } else { 0 };
        let max_datagram = payload + WRITE_OVERHEAD + extra;
        let a_addr: SocketAddr = "10.0.0.1:4791".parse().expect("literal");
        let b_addr: SocketAddr = "10.0.0.2:4791".parse().expect("literal");
        let cfg = |seed| EndpointConfig {
            seed,
            max_datagram,
            ..EndpointConfig::default()
        };
        let mut a = Endpoint::new(cfg(1), a_addr);
        let mut b = Endpoint::new(cfg(2), b_addr);
        assert_eq!(
            a.chunk_size() as usize,
            max_datagram - WRITE_OVERHEAD,
            "chunk size of a plain QP"
        );
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let (ca, cb) = (a.create_cq(), b.create_cq());
        let opts = |key: u8| {
            if sealed {
                QpOptions::encrypted([key; 32])
            } else {
                QpOptions::default()
            }
        };
        let qa = a.create_qp_with(pa, ca, ca, opts(1)).expect("qp");
        let qb = b.create_qp_with(pb, cb, cb, opts(2)).expect("qp");
        a.connect(qa.qpn, qb).expect("connect");
        b.connect(qb.qpn, qa).expect("connect");
        let src = Region::new(msg_len as usize);
        let dst = Region::new(msg_len as usize);
        let _ = src.fill(0, u64::from(msg_len), 0xA5);
        let ka = a
            .register(pa, src.clone(), Access::LOCAL_WRITE)
            .expect("register");
        let kb = b
            .register(pb, dst.clone(), Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .expect("register");
        Pair {
            a,
            b,
            a_addr,
            b_addr,
            qpn: qa.qpn,
            cq: ca,
            lkey: ka.lkey,
            rkey: kb.rkey,
            len: msg_len,
            now: Timestamp::from_micros(1),
            bufs: vec![0u8; BATCH * max_datagram],
            size: max_datagram,
            metas: Vec::with_capacity(BATCH),
            next_id: 0,
            _regions: (src, dst),
        }
    }

    /// Posts one WRITE and drives both engines until it completes; returns data packets A sent.
    fn write_once(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let wr = SendWr {
            wr_id: id,
            op: SendOp::Write(RemoteAddr {
                rkey: self.rkey,
                offset: 0,
            }),
            sges: vec![Sge {
                lkey: self.lkey,
                offset: 0,
                len: self.len,
            }],
            signaled: true,
        };
        self.a.post_send(self.qpn, wr).expect("post");
        let mut sent = 0u64;
        for _round in 0..1_000_000u32 {
            // As the runtime drains a batch: up to BATCH datagrams written at one time.
            self.metas.clear();
            self.a
                .poll_transmit_batch(self.now, &mut self.bufs, self.size, &mut self.metas, BATCH);
            let mut moved = self.metas.len();
            for (k, t) in self.metas.iter().enumerate() {
                self.now = self.now.add_nanos(20);
                let at = k * self.size;
                self.b
                    .handle_datagram(self.now, self.a_addr, 0, &self.bufs[at..at + t.len]);
            }
            sent += moved as u64;
            self.now = self.now.add_nanos(200);
            while let Some(t) = self.b.poll_transmit(self.now, &mut self.bufs[..self.size]) {
                self.a
                    .handle_datagram(self.now, self.b_addr, 0, &self.bufs[..t.len]);
                moved += 1;
            }
            while self.b.poll_completion().is_some() {}
            if let Some((cq, c)) = self.a.poll_completion() {
                assert_eq!((cq, c.wr_id, c.status), (self.cq, id, WcStatus::Success));
                return sent;
            }
            if moved == 0 {
                // Nothing in flight in either direction: only a timer can make progress.
                match self.a.poll_timeout() {
                    Some(t) => {
                        self.now = self.now.max(t);
                        self.a.handle_timeout(self.now);
                    }
                    None => panic!("WRITE {id} stalled with nothing to send and no timer"),
                }
            }
        }
        panic!("WRITE {id} did not complete");
    }
}

fn bench_engine(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_write");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (name, payload, sealed) in [
        ("4KiB_payload", 4096, false),
        ("4KiB_payload_sealed", 4096, true),
        ("1408B_payload", 1408, false),
        ("1408B_payload_sealed", 1408, true),
        ("64B_payload", 64, false),
    ] {
        let mut pair = Pair::new(payload, payload as u32 * PACKETS as u32, sealed);
        // Warm-up message; also checks that exactly PACKETS data packets leave A.
        assert_eq!(pair.write_once(), PACKETS, "{name}: packets per WRITE");
        g.throughput(Throughput::Elements(PACKETS));
        g.bench_function(format!("{name}_x{PACKETS}_per_packet"), |b| {
            b.iter(|| black_box(pair.write_once()))
        });
    }
    // One-packet WRITE: the per-message fixed cost (post, packetize, place, ACK, complete).
    for (name, sealed) in [
        ("8B_single_packet_message", false),
        ("8B_single_packet_message_sealed", true),
    ] {
        let mut pair = Pair::new(1408, 8, sealed);
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| b.iter(|| black_box(pair.write_once())));
    }
    g.finish();
}

criterion_group!(benches, bench_engine);

/// Instruction-count probe: `ENGINE_PROBE=<case>:<iters>` runs `write_once` `iters` times on
/// one case and exits without criterion, so `valgrind --tool=callgrind` can count it (cost of
/// one = (count at 11 - count at 1) / 10). Cases: `64`, `1408`, `4096`, `1408s` (sealed),
/// `8` (one 8-byte packet).
fn probe(spec: &str) {
    let (case, iters) = spec.split_once(':').unwrap_or((spec, "11"));
    let iters: u32 = iters.parse().expect("ENGINE_PROBE=<case>:<iters>");
    let (payload, sealed) = match case.strip_suffix('s') {
        Some(p) => (p, true),
        None => (case, false),
    };
    let payload: usize = payload.parse().expect("ENGINE_PROBE case");
    let mut pair = if payload == 8 {
        Pair::new(1408, 8, sealed)
    } else {
        Pair::new(payload, payload as u32 * PACKETS as u32, sealed)
    };
    let mut packets = 0;
    for _ in 0..iters {
        packets += pair.write_once();
    }
    println!("{case}: {iters} WRITEs, {packets} data packets");
}

fn main() {
    match std::env::var("ENGINE_PROBE") {
        Ok(spec) => probe(&spec),
        Err(_) => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
