//! End to end on the deterministic simulated network: every operation, every size class, 8
//! paths, loss, reordering, duplication and corruption on every path; black-holed paths and
//! vanished peers; receiver-not-ready. Every assertion names the seed; replay a failure with
//! `BRAID_SEED=<seed> cargo test -p braid-tests <test name>`.
use braid::datapath::sim::LinkConfig;
use braid::proto::{
    Access, EndpointConfig, RecvWr, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use braid::testing::Mr;
use braid_tests::oracle::{self, Expect, Memory, Want};
use rand_chacha::ChaCha8Rng;
use rand_core::RngCore;

use crate::support::{
    Sim, below, config, hostile_link, quick_give_up, rng, seed, sge, snapshot, split,
};

const MIB: u32 = 1 << 20;
/// The value each fetch-and-add adds.
const ADD: u64 = 3;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
}

const DATA_KINDS: [Kind; 5] = [
    Kind::Send,
    Kind::SendImm,
    Kind::Write,
    Kind::WriteImm,
    Kind::Read,
];

/// A region plus the model of what it must hold ([`oracle::Memory`]), and a bump allocator
/// over it.
struct Tracked {
    mr: Mr,
    model: Memory,
    next: u64,
}

impl Tracked {
    fn new(
        sim: &mut Sim,
        side: braid::testing::Side,
        len: usize,
        access: Access,
        rng: &mut ChaCha8Rng,
    ) -> Tracked {
        let mr = sim.random_mr(side, len, access, rng);
        let model = Memory::new(snapshot(&mr.region));
        Tracked { mr, model, next: 0 }
    }

    /// Places pieces of `lens` bytes with random gaps between them.
    fn place(&mut self, rng: &mut ChaCha8Rng, lens: &[u32]) -> Vec<Sge> {
        lens.iter()
            .map(|&len| {
                let off = self.next + below(rng, 65);
                self.next = off + u64::from(len);
                assert!(
                    self.next <= self.model.len() as u64,
                    "test bug: region too small"
                );
                sge(&self.mr, off, len)
            })
            .collect()
    }

    /// The bytes a gather list reads.
    fn gather(&self, sges: &[Sge]) -> Vec<u8> {
        self.model.gather(sges)
    }

    /// Records `data` scattered over `sges` in the model.
    fn scatter(&mut self, sges: &[Sge], data: &[u8]) {
        self.model.scatter(sges, data);
    }

    fn check(&self, seed: u64, name: &str) {
        let tag = format!("seed {seed}");
        self.model.check(&tag, name, &snapshot(&self.mr.region));
    }
}

/// A hook run once the requester has sent this many packets.
type MidRun<'a> = (u64, &'a mut dyn FnMut(&mut Sim));

struct Outcome {
    sim: Sim,
    fetch_add_results: Vec<u64>,
}

/// Posts `ops` (in that order) from node a to node b, waits for every completion and checks
/// completions, memory on both sides and atomics.
fn run_workload(sim: Sim, ops: &[(Kind, u32)], max_steps: u64) -> Outcome {
    run_workload_with(sim, ops, max_steps, None)
}

/// As [`run_workload`]; `mid` runs once the requester has sent that many packets.
fn run_workload_with(
    sim: Sim,
    ops: &[(Kind, u32)],
    max_steps: u64,
    mid: Option<MidRun<'_>>,
) -> Outcome {
    let mut sim = sim;
    let seed = sim.seed;
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let n_atomic = ops
        .iter()
        .filter(|(k, _)| matches!(k, Kind::FetchAdd | Kind::CmpSwap))
        .count();
    let n_cas = ops.iter().filter(|(k, _)| *k == Kind::CmpSwap).count();
    let slack = |kinds: &[Kind]| -> usize {
        ops.iter()
            .filter(|(k, _)| kinds.contains(k))
            .map(|&(_, s)| s as usize + 5 * 64 + 300)
            .sum::<usize>()
            + 64
    };
    let mut a_src = Tracked::new(
        &mut sim,
        a,
        slack(&[Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm]),
        Access::NONE,
        &mut rng,
    );
    let mut a_dst = Tracked::new(
        &mut sim,
        a,
        slack(&[Kind::Read]),
        Access::LOCAL_WRITE,
        &mut rng,
    );
    let mut a_atomic = Tracked::new(
        &mut sim,
        a,
        72 * n_atomic + 8,
        Access::LOCAL_WRITE,
        &mut rng,
    );
    let mut b_dst = Tracked::new(
        &mut sim,
        b,
        slack(&[Kind::Write, Kind::WriteImm]),
        Access::REMOTE_WRITE,
        &mut rng,
    );
    let b_src = Tracked::new(
        &mut sim,
        b,
        slack(&[Kind::Read]),
        Access::REMOTE_READ,
        &mut rng,
    );
    let mut b_recv = Tracked::new(
        &mut sim,
        b,
        slack(&[Kind::Send, Kind::SendImm, Kind::WriteImm]),
        Access::LOCAL_WRITE,
        &mut rng,
    );
    let mut b_atomic = Tracked::new(&mut sim, b, 8 * n_cas + 8, Access::REMOTE_ATOMIC, &mut rng);
    // Word 0 of b_atomic is the fetch-and-add counter.
    b_atomic
        .mr
        .region
        .write(0, &0u64.to_ne_bytes())
        .expect("in bounds");
    b_atomic.model.write(0, &0u64.to_ne_bytes());
    b_atomic.next = 8;

    let mut want_a = Vec::new();
    let mut want_b = Vec::new();
    let mut fetch_add_slots = Vec::new();
    let mut wrs = Vec::new();
    let mut recvs = Vec::new();
    for (i, &(kind, size)) in ops.iter().enumerate() {
        let wr_id = 1000 + i as u64;
        let imm = rng.next_u32();
        let (op, sges, opcode, byte_len) = match kind {
            Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm => {
                let sges = {
                    let lens = split(&mut rng, size, 4);
                    a_src.place(&mut rng, &lens)
                };
                let data = a_src.gather(&sges);
                let op = match kind {
                    Kind::Send | Kind::SendImm => {
                        let extra = if below(&mut rng, 3) == 0 {
                            below(&mut rng, 200) as u32
                        } else {
                            0
                        };
                        let rsges = {
                            let lens = split(&mut rng, size + extra, 4);
                            b_recv.place(&mut rng, &lens)
                        };
                        b_recv.scatter(&rsges, &data);
                        recvs.push(RecvWr {
                            wr_id: wr_id + 1_000_000,
                            sges: rsges,
                        });
                        let imm = (kind == Kind::SendImm).then_some(imm);
                        want_b.push(Want {
                            wr_id: wr_id + 1_000_000,
                            opcode: WcOpcode::Recv,
                            byte_len: size,
                            imm,
                        });
                        if kind == Kind::Send {
                            SendOp::Send
                        } else {
                            SendOp::SendImm(imm.unwrap_or(0))
                        }
                    }
                    _ => {
                        let dst = b_dst.place(&mut rng, &[size]);
                        b_dst.scatter(&dst, &data);
                        let remote = RemoteAddr {
                            rkey: b_dst.mr.keys.rkey,
                            offset: dst[0].offset,
                        };
                        if kind == Kind::Write {
                            SendOp::Write(remote)
                        } else {
                            // The RECV a WRITE_IMM consumes: its buffers stay untouched.
                            let cap = below(&mut rng, 100) as u32;
                            let rsges = {
                                let lens = split(&mut rng, cap, 2);
                                b_recv.place(&mut rng, &lens)
                            };
                            recvs.push(RecvWr {
                                wr_id: wr_id + 1_000_000,
                                sges: rsges,
                            });
                            want_b.push(Want {
                                wr_id: wr_id + 1_000_000,
                                opcode: WcOpcode::RecvRdmaWithImm,
                                byte_len: size,
                                imm: Some(imm),
                            });
                            SendOp::WriteImm(remote, imm)
                        }
                    }
                };
                let opcode = if matches!(kind, Kind::Send | Kind::SendImm) {
                    WcOpcode::Send
                } else {
                    WcOpcode::Write
                };
                (op, sges, opcode, size)
            }
            Kind::Read => {
                let src = b_src.mr.keys.rkey;
                let from = read_source(&b_src, &mut rng, size);
                let data =
                    b_src.model.bytes()[from as usize..(from + u64::from(size)) as usize].to_vec();
                let sges = {
                    let lens = split(&mut rng, size, 4);
                    a_dst.place(&mut rng, &lens)
                };
                a_dst.scatter(&sges, &data);
                (
                    SendOp::Read(RemoteAddr {
                        rkey: src,
                        offset: from,
                    }),
                    sges,
                    WcOpcode::Read,
                    size,
                )
            }
            Kind::FetchAdd => {
                let slot = a_atomic.place(&mut rng, &[8]);
                let slot = Sge {
                    offset: slot[0].offset,
                    ..slot[0]
                };
                fetch_add_slots.push(slot.offset);
                (
                    SendOp::FetchAdd(
                        RemoteAddr {
                            rkey: b_atomic.mr.keys.rkey,
                            offset: 0,
                        },
                        ADD,
                    ),
                    vec![slot],
                    WcOpcode::FetchAdd,
                    8,
                )
            }
            Kind::CmpSwap => {
                let slot = a_atomic.place(&mut rng, &[8]);
                let word = b_atomic.next;
                b_atomic.next += 8;
                let initial = u64::from_ne_bytes(
                    b_atomic.model.bytes()[word as usize..word as usize + 8]
                        .try_into()
                        .expect("8 bytes"),
                );
                let matches = below(&mut rng, 2) == 0;
                let compare = if matches {
                    initial
                } else {
                    initial ^ (1 << below(&mut rng, 64))
                };
                let swap = rng.next_u64();
                a_atomic.scatter(&slot, &initial.to_ne_bytes());
                if matches {
                    b_atomic.model.write(word as usize, &swap.to_ne_bytes());
                }
                let remote = RemoteAddr {
                    rkey: b_atomic.mr.keys.rkey,
                    offset: word,
                };
                (
                    SendOp::CompareSwap {
                        remote,
                        compare,
                        swap,
                    },
                    slot,
                    WcOpcode::CompareSwap,
                    8,
                )
            }
        };
        want_a.push(Want {
            wr_id,
            opcode,
            byte_len,
            imm: None,
        });
        wrs.push(SendWr {
            wr_id,
            op,
            sges,
            signaled: true,
        });
    }
    for r in recvs {
        sim.post_recv(b, r);
    }
    for w in wrs {
        sim.post_send(a, w);
    }
    if let Some((packets, hook)) = mid {
        let qpn = a.qp.qpn;
        let sent =
            |c: &mut braid::testing::Cluster| c.ep(0).qp_stats(qpn).map_or(0, |s| s.packets_sent);
        assert!(
            sim.c.run_until(max_steps, |c| sent(c) >= packets),
            "seed {seed}: never sent {packets} packets"
        );
        hook(&mut sim);
    }
    let got_a = sim.wait_cq(a, want_a.len(), max_steps);
    let got_b = sim.wait_cq(b, want_b.len(), max_steps);
    let tag = format!("seed {seed}");
    oracle::requester(&tag, &got_a, &want_a, Some(a.qp.qpn), Expect::AllSucceed);
    oracle::responder(&tag, &got_b, &want_b, Some(b.qp.qpn), Expect::AllSucceed);

    // Fetch-and-add: the originals are a permutation of 0, ADD, 2*ADD, ...; mark the slots
    // as expected in the model once checked.
    let originals: Vec<u64> = fetch_add_slots
        .iter()
        .map(|&off| read_u64(&a_atomic.mr, off))
        .collect();
    for (&off, &v) in fetch_add_slots.iter().zip(&originals) {
        a_atomic.model.write(off as usize, &v.to_ne_bytes());
    }
    let n = originals.len();
    let counter = read_u64(&b_atomic.mr, 0);
    let results = oracle::fetch_adds(&tag, counter, ADD, n, originals, Expect::AllSucceed);
    b_atomic.model.write(0, &(n as u64 * ADD).to_ne_bytes());

    for (t, name) in [
        (&a_src, "a_src"),
        (&a_dst, "a_dst"),
        (&a_atomic, "a_atomic"),
        (&b_dst, "b_dst"),
        (&b_src, "b_src"),
        (&b_recv, "b_recv"),
        (&b_atomic, "b_atomic"),
    ] {
        t.check(seed, name);
    }
    // And then everything goes quiet: no livelock, no timer left armed, and no completion
    // comes twice.
    sim.c.drive_bounded(200_000);
    assert_eq!(
        sim.drain_cq(a),
        vec![],
        "seed {seed}: extra requester completions"
    );
    assert_eq!(
        sim.drain_cq(b),
        vec![],
        "seed {seed}: extra responder completions"
    );
    Outcome {
        sim,
        fetch_add_results: results,
    }
}

/// A READ source range: `size` bytes at a random offset of `t`'s region (it is never written).
fn read_source(t: &Tracked, rng: &mut ChaCha8Rng, size: u32) -> u64 {
    let max = t.model.len() as u64 - u64::from(size);
    below(rng, max + 1)
}

fn read_u64(mr: &Mr, off: u64) -> u64 {
    let mut b = [0u8; 8];
    mr.region.read(off, &mut b).expect("in bounds");
    u64::from_ne_bytes(b)
}

/// Every data op at every boundary size around one packet, `extra` random ones up to
/// `max_random` bytes, the `big` sizes as random data ops, and `atomics` fetch-adds and
/// compare-swaps, shuffled.
fn mixed_ops(
    seed: u64,
    chunk: u32,
    extra: usize,
    max_random: u32,
    big: &[u32],
    atomics: usize,
) -> Vec<(Kind, u32)> {
    let mut rng = rng(seed ^ 0x0b5);
    let mut ops = Vec::new();
    for kind in DATA_KINDS {
        for size in [0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk + 7] {
            ops.push((kind, size));
        }
    }
    for _ in 0..extra {
        let kind = DATA_KINDS[below(&mut rng, 5) as usize];
        ops.push((kind, below(&mut rng, u64::from(max_random) + 1) as u32));
    }
    for &size in big {
        ops.push((DATA_KINDS[below(&mut rng, 5) as usize], size));
    }
    for i in 0..atomics {
        ops.push((
            if i % 3 == 2 {
                Kind::CmpSwap
            } else {
                Kind::FetchAdd
            },
            8,
        ));
    }
    for i in (1..ops.len()).rev() {
        ops.swap(i, below(&mut rng, i as u64 + 1) as usize);
    }
    ops
}

fn mixed(seed: u64, loss: f64, retry_limit: u32, big: &[u32], extra: usize) {
    mixed_with(seed, loss, retry_limit, big, extra, false, 0);
}

/// [`mixed`], on an encrypted QP pair when `encrypted` is set (then the packet boundary sizes
/// are those of sealed packets, which carry `SEAL_OVERHEAD` bytes less payload), with ACK
/// coalescing `ack_every` (`EndpointConfig::ack_every`; 0, the default: every batch).
fn mixed_with(
    seed: u64,
    loss: f64,
    retry_limit: u32,
    big: &[u32],
    extra: usize,
    encrypted: bool,
    ack_every: u16,
) -> Outcome {
    let seed = std::env::var("BRAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    let cfg = EndpointConfig {
        ack_every,
        ..config(8, retry_limit)
    };
    let sim = Sim::new_with(seed, &cfg, hostile_link(loss), encrypted);
    let mut chunk = sim.c.ep(0).chunk_size();
    if encrypted {
        chunk -= braid::proto::wire::SEAL_OVERHEAD as u32;
    }
    let ops = mixed_ops(seed, chunk, extra, 64 * 1024, big, 60);
    let out = run_workload(sim, &ops, 3_000_000);
    let st = out.sim.c.ep(0).stats();
    eprintln!(
        "seed {seed} loss {loss}: {} ops, virtual {:?}, {} steps, requester {st:?}, responder {:?}, net {:?}",
        ops.len(),
        out.sim.c.now,
        out.sim.c.steps,
        out.sim.c.ep(1).stats(),
        (
            out.sim.c.net.stats().sent,
            out.sim.c.net.stats().lost,
            out.sim.c.net.stats().corrupted
        )
    );
    if loss > 0.0 {
        assert!(
            st.retransmits > 0,
            "seed {seed}: {loss} loss but no retransmission: {st:?}"
        );
    }
    assert!(
        out.sim.c.net.stats().corrupted > 0,
        "seed {seed}: the link corrupted nothing"
    );
    out
}

/// An encrypted run: every op exact, and what the hostile link did shows in the sealing
/// counters: corrupted datagrams fail authentication and duplicated ones are refused as
/// replays. (A flip in the clear header's version, flags or QP numbers is caught earlier, as
/// malformed, unsealed-on-an-encrypted-QP or for another QP.)
fn mixed_sealed(seed: u64, loss: f64, retry_limit: u32, big: &[u32], extra: usize) {
    let out = mixed_with(seed, loss, retry_limit, big, extra, true, 0);
    let net = out.sim.c.net.stats();
    assert!(
        net.duplicated > 0,
        "seed {seed}: the link duplicated nothing"
    );
    let (mut auth, mut replayed) = (0, 0);
    for ep in out.sim.c.live_endpoints() {
        let st = ep.stats();
        auth += st.rx_auth_failed;
        replayed += st.rx_replayed;
    }
    assert!(auth > 0, "seed {seed}: corruption never failed a tag");
    assert!(
        replayed > 0,
        "seed {seed}: duplicates were never refused as replays"
    );
}

#[test]
fn encrypted_every_op_is_exact_with_reordering_duplication_and_corruption() {
    mixed_sealed(seed(311), 0.0, 7, &[3 * MIB + 5], 30);
}

/// Keys come from the cluster's seed, so an encrypted run replays exactly.
#[test]
fn an_encrypted_run_replays_exactly_from_its_seed() {
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let out = mixed_with(seed(317), 0.05, 20, &[MIB / 4], 10, true, 0);
            let c = &out.sim.c;
            (
                c.now,
                c.steps,
                c.ep(0).stats().clone(),
                c.ep(1).stats().clone(),
            )
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
}

#[test]
fn encrypted_every_op_is_exact_at_10_percent_loss() {
    mixed_sealed(seed(313), 0.10, 20, &[MIB + 1], 30);
}

#[test]
fn encrypted_every_op_is_exact_at_1_percent_loss_over_several_seeds() {
    for s in 0..4 {
        mixed_sealed(seed(400 + s), 0.01, 10, &[MIB / 2 + 3], 20);
    }
}

#[test]
fn every_op_is_exact_without_loss_but_with_reordering_duplication_and_corruption() {
    mixed(seed(11), 0.0, 7, &[3 * MIB + 5, 8 * MIB], 30);
}

#[test]
fn every_op_is_exact_at_1_percent_loss() {
    mixed(seed(12), 0.01, 10, &[MIB, 2 * MIB + 3, 8 * MIB], 30);
}

#[test]
fn every_op_is_exact_at_10_percent_loss() {
    mixed(seed(13), 0.10, 20, &[MIB + 1, 2 * MIB], 30);
}

/// ACK coalescing as a device on AF_XDP runs it (8): its timer, the out-of-order rule and
/// the ACK_NOW flag under loss, reordering, duplication and corruption, every op exact.
#[test]
fn every_op_is_exact_with_coalesced_acks_at_1_and_10_percent_loss() {
    mixed_with(seed(14), 0.01, 10, &[MIB, 2 * MIB + 3], 30, false, 8);
    mixed_with(seed(15), 0.10, 20, &[MIB + 1], 30, false, 8);
}

/// On one clean path, where packets arrive in order, coalescing 8 sends at most a quarter of
/// the ACKs that acknowledging every packet (the simulated host takes them one at a time)
/// does, for the same 4 MiB WRITE, which arrives exactly and as fast.
#[test]
fn coalesced_acks_on_a_clean_path_are_fewer_and_the_write_is_exact() {
    let s = seed(16);
    let acks = |ack_every: u16| {
        let cfg = EndpointConfig {
            ack_every,
            ..config(1, 10)
        };
        // A 10 Gbit/s bottleneck spaces the packets, so each arrives in a batch of its own.
        let link = LinkConfig {
            delay_ns: 10_000,
            bandwidth_bps: Some(10_000_000_000),
            queue_bytes: 4 << 20,
            ..LinkConfig::default()
        };
        let mut sim = Sim::new(s, &cfg, link);
        let (src, dst) = sim.write(4 * MIB);
        assert!(
            snapshot(&dst.region) == snapshot(&src.region),
            "seed {s}: ack_every {ack_every}: the bytes differ"
        );
        (sim.c.ep(1).stats().tx_datagrams, sim.c.now.as_nanos())
    };
    let ((every, t1), (coalesced, t8)) = (acks(1), acks(8));
    eprintln!(
        "seed {s}: ACKs {every} acknowledging every packet ({t1} ns), {coalesced} coalescing 8 ({t8} ns)"
    );
    assert!(every > 2_000, "seed {s}: {every}");
    assert!(4 * coalesced <= every, "seed {s}: {coalesced} of {every}");
    // And the WRITE takes no longer for it (no ACK waited out its delay).
    assert!(t8 <= t1 + t1 / 20, "seed {s}: {t8} ns against {t1} ns");
}

#[test]
fn every_op_is_exact_at_1_percent_loss_over_several_seeds() {
    for s in 0..8 {
        mixed(seed(200 + s), 0.01, 10, &[MIB / 2 + 3], 20);
    }
}

#[test]
fn every_op_is_exact_at_10_percent_loss_over_several_seeds() {
    for s in 0..12 {
        mixed(seed(100 + s), 0.10, 20, &[MIB / 2 + 3], 20);
    }
}

#[test]
fn fetch_adds_count_exactly_under_loss() {
    let seed = seed(21);
    let sim = Sim::new(seed, &config(8, 20), hostile_link(0.10));
    let ops: Vec<(Kind, u32)> = (0..300).map(|_| (Kind::FetchAdd, 8)).collect();
    let out = run_workload(sim, &ops, 2_000_000);
    assert_eq!(out.fetch_add_results.len(), 300, "seed {seed}");
}

#[test]
fn a_path_black_holed_mid_transfer_does_not_stop_it() {
    let seed = seed(31);
    let sim = Sim::new(seed, &config(8, 10), hostile_link(0.01));
    let ops = [
        (Kind::Write, 4 * MIB + 17),
        (Kind::Read, 2 * MIB),
        (Kind::Send, MIB),
        (Kind::FetchAdd, 8),
    ];
    let mut cut = |sim: &mut Sim| {
        let (a, b) = (sim.c.addr(0), sim.c.addr(1));
        sim.c.net.link_mut(a, 3).blackhole = true;
        sim.c.net.link_mut(b, 3).blackhole = true;
    };
    let out = run_workload_with(sim, &ops, 3_000_000, Some((500, &mut cut)));
    let net = out.sim.c.net.stats();
    assert!(
        net.blackholed > 0,
        "seed {seed}: the black hole swallowed nothing: {net:?}"
    );
}

/// Posts a WRITE, a READ, a SEND and a fetch-add from a, and a RECV on a; runs until `n`
/// packets went out; returns the virtual time then.
fn start_then(sim: &mut Sim, packets: u64) -> braid::proto::Timestamp {
    let mut rng = rng(sim.seed);
    let (a, b) = (sim.a, sim.b);
    let src = sim.random_mr(a, 2 * MIB as usize, Access::LOCAL_WRITE, &mut rng);
    let dst = sim.random_mr(b, 2 * MIB as usize, Access::ALL, &mut rng);
    sim.post_recv(
        b,
        RecvWr {
            wr_id: 90,
            sges: vec![sge(&dst, 0, 4096)],
        },
    );
    sim.post_recv(
        a,
        RecvWr {
            wr_id: 91,
            sges: vec![sge(&src, 0, 4096)],
        },
    );
    let remote = |offset| RemoteAddr {
        rkey: dst.keys.rkey,
        offset,
    };
    let wrs = [
        (SendOp::Write(remote(0)), vec![sge(&src, 0, MIB)]),
        (
            SendOp::Read(remote(MIB.into())),
            vec![sge(&src, MIB.into(), 65_536)],
        ),
        (SendOp::Send, vec![sge(&src, 0, 3000)]),
        (SendOp::FetchAdd(remote(8), 1), vec![sge(&src, 8, 8)]),
    ];
    for (i, (op, sges)) in wrs.into_iter().enumerate() {
        sim.post_send(
            a,
            SendWr {
                wr_id: 1 + i as u64,
                op,
                sges,
                signaled: true,
            },
        );
    }
    let qpn = a.qp.qpn;
    let seed = sim.seed;
    assert!(
        sim.c.run_until(1_000_000, |c| c
            .ep(0)
            .qp_stats(qpn)
            .is_some_and(|s| s.packets_sent >= packets)),
        "seed {seed}: never sent {packets} packets"
    );
    sim.c.now
}

/// The requester's completions after its peer disappeared: the oldest outstanding work
/// request fails with `RetryExceeded`, every later one and the posted RECV are flushed, all
/// within `bound_ns` of virtual time.
fn assert_gave_up(sim: &mut Sim, since: braid::proto::Timestamp, bound_ns: u64) {
    let seed = sim.seed;
    let got = sim.wait_cq(sim.a, 5, 1_000_000);
    let waited = sim.c.now.nanos_since(since);
    assert!(
        waited < bound_ns,
        "seed {seed}: gave up after {waited} ns of virtual time, bound {bound_ns}"
    );
    let sends: Vec<(u64, WcStatus)> = got
        .iter()
        .filter(|c| c.opcode != WcOpcode::Recv)
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        sends,
        vec![
            (1, WcStatus::RetryExceeded),
            (2, WcStatus::Flushed),
            (3, WcStatus::Flushed),
            (4, WcStatus::Flushed)
        ],
        "seed {seed}: {got:?}"
    );
    let recv: Vec<_> = got
        .iter()
        .filter(|c| c.opcode == WcOpcode::Recv)
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(recv, vec![(91, WcStatus::Flushed)], "seed {seed}");
    let st = sim.c.ep(0).qp_stats(sim.a.qp.qpn).expect("qp");
    assert_eq!(st.state, braid::proto::QpState::Error, "seed {seed}");
}

#[test]
fn a_vanished_peer_gives_retry_exceeded_then_flushed_within_a_second() {
    let seed = seed(41);
    let mut sim = Sim::new(seed, &quick_give_up(config(8, 7)), LinkConfig::default());
    let t0 = start_then(&mut sim, 100);
    sim.c.remove_host(1); // node b is gone: its packets and timers with it
    assert_gave_up(&mut sim, t0, 1_000_000_000);
}

#[test]
fn a_black_holed_peer_gives_retry_exceeded_then_flushed_within_a_second() {
    let seed = seed(42);
    let mut sim = Sim::new(seed, &quick_give_up(config(8, 7)), hostile_link(0.01));
    let t0 = start_then(&mut sim, 100);
    for node in [0, 1] {
        let addr = sim.c.addr(node);
        for p in 0..8 {
            sim.c.net.link_mut(addr, p).blackhole = true;
        }
    }
    assert_gave_up(&mut sim, t0, 1_000_000_000);
}

#[test]
fn work_posted_after_the_qp_failed_completes_flushed() {
    let seed = seed(43);
    let mut sim = Sim::new(seed, &quick_give_up(config(8, 3)), LinkConfig::default());
    let t0 = start_then(&mut sim, 10);
    sim.c.remove_host(1);
    assert_gave_up(&mut sim, t0, 1_000_000_000);
    let mr = sim.c.alloc_mr(&sim.a.clone(), 64, Access::LOCAL_WRITE);
    sim.post_send(
        sim.a,
        SendWr {
            wr_id: 77,
            op: SendOp::Send,
            sges: vec![sge(&mr, 0, 64)],
            signaled: true,
        },
    );
    let got = sim.wait_cq(sim.a, 1, 1000);
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (77, WcStatus::Flushed),
        "seed {seed}"
    );
}

/// a SENDs `len` bytes to b; returns the source data.
fn send_bytes(sim: &mut Sim, len: u32) -> (Mr, Vec<u8>) {
    let mut rng = rng(sim.seed);
    let src = sim.random_mr(sim.a, len as usize, Access::NONE, &mut rng);
    let data = snapshot(&src.region);
    sim.post_send(
        sim.a,
        SendWr {
            wr_id: 5,
            op: SendOp::SendImm(0xfeed),
            sges: vec![sge(&src, 0, len)],
            signaled: true,
        },
    );
    (src, data)
}

/// The RECV the SEND of [`send_bytes`] was refused for, posted late at b: wr_id 6, 6000 bytes.
fn post_the_late_recv(sim: &mut Sim) -> Mr {
    let dst = sim.c.alloc_mr(&sim.b.clone(), 6000, Access::LOCAL_WRITE);
    sim.post_recv(
        sim.b,
        RecvWr {
            wr_id: 6,
            sges: vec![sge(&dst, 0, 6000)],
        },
    );
    dst
}

#[test]
fn rnr_send_is_retried_until_a_recv_is_posted() {
    let seed = seed(51);
    let mut sim = Sim::new(seed, &config(8, 7), LinkConfig::default());
    let (_src, data) = send_bytes(&mut sim, 5000);
    // b refuses it (no RECV) a few times.
    assert!(
        sim.c.run_until(100_000, |c| c.ep(1).stats().naks_sent >= 3),
        "seed {seed}: no RNR NAK"
    );
    assert_eq!(
        sim.c.cq_len(0, sim.a.cq),
        0,
        "seed {seed}: completed without a RECV"
    );
    let dst = post_the_late_recv(&mut sim);
    let a = sim.wait_cq(sim.a, 1, 100_000);
    assert_eq!(
        (a[0].wr_id, a[0].status, a[0].opcode, a[0].byte_len),
        (5, WcStatus::Success, WcOpcode::Send, 5000),
        "seed {seed}"
    );
    let b = sim.wait_cq(sim.b, 1, 100_000);
    assert_eq!(
        (b[0].wr_id, b[0].status, b[0].byte_len, b[0].imm),
        (6, WcStatus::Success, 5000, Some(0xfeed)),
        "seed {seed}"
    );
    assert_eq!(
        dst.region.to_vec(0, 5000).expect("in bounds"),
        data,
        "seed {seed}"
    );
    assert_eq!(
        dst.region.to_vec(5000, 1000).expect("in bounds"),
        vec![0; 1000],
        "seed {seed}: past the message"
    );
    assert!(sim.c.ep(0).stats().naks_received >= 3, "seed {seed}");
}

#[test]
fn rnr_retry_forever_outlasts_any_count_of_rnr_naks() {
    let seed = seed(53);
    let mut cfg = config(8, 7);
    cfg.rnr_retry_limit = braid::RNR_RETRY_FOREVER;
    let mut sim = Sim::new(seed, &cfg, LinkConfig::default());
    let (_src, data) = send_bytes(&mut sim, 5000);
    // A hundred RNR timers: far more RNR NAKs than a finite default would take.
    let until = 100 * cfg.rnr_timer_ns;
    assert!(
        sim.c.run_until(10_000_000, |c| c.now.as_nanos() > until),
        "seed {seed}: nothing left to simulate (did the SEND give up?)"
    );
    assert!(
        sim.c.ep(1).stats().naks_sent >= 50,
        "seed {seed}: stopped asking"
    );
    assert_eq!(sim.c.cq_len(0, sim.a.cq), 0, "seed {seed}: gave up");
    let dst = post_the_late_recv(&mut sim);
    let a = sim.wait_cq(sim.a, 1, 100_000);
    assert_eq!(
        (a[0].wr_id, a[0].status),
        (5, WcStatus::Success),
        "seed {seed}"
    );
    assert_eq!(
        dst.region.to_vec(0, 5000).expect("in bounds"),
        data,
        "seed {seed}"
    );
}

#[test]
fn rnr_send_with_no_recv_ever_ends_in_rnr_retry_exceeded() {
    let seed = seed(52);
    let cfg = config(8, 7);
    let (limit, timer) = (cfg.rnr_retry_limit, cfg.rnr_timer_ns);
    let mut sim = Sim::new(seed, &cfg, LinkConfig::default());
    let _src = send_bytes(&mut sim, 5000);
    let mr = sim.c.alloc_mr(&sim.a.clone(), 8, Access::LOCAL_WRITE);
    sim.post_send(
        sim.a,
        SendWr {
            wr_id: 8,
            op: SendOp::Send,
            sges: vec![sge(&mr, 0, 8)],
            signaled: true,
        },
    );
    let got = sim.wait_cq(sim.a, 2, 100_000);
    let st: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        vec![(5, WcStatus::RnrRetryExceeded), (8, WcStatus::Flushed)],
        "seed {seed}"
    );
    let bound = u64::from(limit + 2) * timer + 1_000_000;
    assert!(
        sim.c.now.as_nanos() < bound,
        "seed {seed}: gave up at {:?}, bound {bound} ns",
        sim.c.now
    );
    assert_eq!(
        sim.c.cq_len(1, sim.b.cq),
        0,
        "seed {seed}: the receiver completed nothing"
    );
}

#[test]
fn a_peer_vanishing_while_a_read_is_answered_fails_the_read_first() {
    let seed = seed(44);
    let mut sim = Sim::new(seed, &quick_give_up(config(8, 7)), LinkConfig::default());
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let local = sim.random_mr(a, 8 * MIB as usize, Access::LOCAL_WRITE, &mut rng);
    let remote = sim.random_mr(b, 8 * MIB as usize, Access::ALL, &mut rng);
    let at = |offset| RemoteAddr {
        rkey: remote.keys.rkey,
        offset,
    };
    sim.post_send(
        a,
        SendWr {
            wr_id: 1,
            op: SendOp::Read(at(0)),
            sges: vec![sge(&local, 0, 4 * MIB)],
            signaled: true,
        },
    );
    sim.post_send(
        a,
        SendWr {
            wr_id: 2,
            op: SendOp::Write(at(4 * u64::from(MIB))),
            sges: vec![sge(&local, 4 * u64::from(MIB), MIB)],
            signaled: true,
        },
    );
    // Wait until part of the READ response has arrived (so the READ request was accepted).
    assert!(
        sim.c
            .run_until(1_000_000, |c| c.ep(0).stats().rx_datagrams >= 200),
        "seed {seed}"
    );
    let t0 = sim.c.now;
    sim.c.remove_host(1);
    let got = sim.wait_cq(a, 2, 1_000_000);
    let st: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::RetryExceeded), (2, WcStatus::Flushed)],
        "seed {seed}: the oldest work request fails, later ones are flushed"
    );
    assert!(sim.c.now.nanos_since(t0) < 1_000_000_000, "seed {seed}");
}

#[test]
fn both_directions_at_once_are_exact_under_loss() {
    let seed = seed(61);
    let mut sim = Sim::new(seed, &config(8, 20), hostile_link(0.05));
    let mut rng = rng(seed);
    let (a, b) = (sim.a, sim.b);
    let len = 3 * MIB as usize;
    let ma = sim.random_mr(a, len, Access::ALL, &mut rng);
    let mb = sim.random_mr(b, len, Access::ALL, &mut rng);
    let (ia, ib) = (snapshot(&ma.region), snapshot(&mb.region));
    let m = u64::from(MIB);
    // Each side writes its first MiB into the other's second, and reads the other's first
    // MiB into its own third.
    for (side, mine, theirs) in [(a, &ma, &mb), (b, &mb, &ma)] {
        let at = |offset| RemoteAddr {
            rkey: theirs.keys.rkey,
            offset,
        };
        sim.post_send(
            side,
            SendWr {
                wr_id: 1,
                op: SendOp::Write(at(m)),
                sges: vec![sge(mine, 0, MIB)],
                signaled: true,
            },
        );
        sim.post_send(
            side,
            SendWr {
                wr_id: 2,
                op: SendOp::Read(at(0)),
                sges: vec![sge(mine, 2 * m, MIB)],
                signaled: true,
            },
        );
    }
    for side in [a, b] {
        let got = sim.wait_cq(side, 2, 2_000_000);
        let st: Vec<_> = got
            .iter()
            .map(|c| (c.wr_id, c.status, c.byte_len))
            .collect();
        assert_eq!(
            st,
            vec![(1, WcStatus::Success, MIB), (2, WcStatus::Success, MIB)],
            "seed {seed}: node {}",
            side.node
        );
    }
    let mi = MIB as usize;
    for (mr, init, other) in [(&ma, &ia, &ib), (&mb, &ib, &ia)] {
        let got = snapshot(&mr.region);
        assert!(got[..mi] == init[..mi], "seed {seed}: source MiB changed");
        assert!(
            got[mi..2 * mi] == other[..mi],
            "seed {seed}: written MiB wrong"
        );
        assert!(got[2 * mi..] == other[..mi], "seed {seed}: read MiB wrong");
    }
}

#[test]
fn several_qps_between_two_nodes_stay_independent_under_loss() {
    let seed = seed(62);
    let cfg = config(8, 20);
    let mut c = braid::testing::Cluster::new(seed, 3, &cfg, hostile_link(0.05));
    let mut rng = rng(seed);
    // Four QP pairs: three from node 0 to node 1, one from node 2 to node 1.
    let pairs: Vec<_> = [(0, 1), (0, 1), (0, 1), (2, 1)]
        .iter()
        .map(|&(x, y)| c.connect(x, y))
        .collect();
    let mut checks = Vec::new();
    for (i, (s, r)) in pairs.iter().enumerate() {
        let len = 200_000 + i * 1000;
        let src = c.alloc_mr(s, len, Access::NONE);
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        src.region.write(0, &data).expect("in bounds");
        let dst = c.alloc_mr(r, len, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
        let wr = SendWr {
            wr_id: i as u64,
            op: SendOp::Write(RemoteAddr {
                rkey: dst.keys.rkey,
                offset: 0,
            }),
            sges: vec![sge(&src, 0, len as u32)],
            signaled: true,
        };
        c.ep_mut(s.node).post_send(s.qp.qpn, wr).expect("post");
        checks.push((*s, dst, data));
    }
    let done = |c: &mut braid::testing::Cluster| checks_done(c, &pairs);
    assert!(
        c.run_until(2_000_000, done),
        "seed {seed}: not every QP completed"
    );
    for (i, (s, dst, data)) in checks.iter().enumerate() {
        let wc = c.poll_cq(s.node, s.cq).expect("one completion");
        assert_eq!(
            (wc.wr_id, wc.status, wc.qpn),
            (i as u64, WcStatus::Success, s.qp.qpn),
            "seed {seed}"
        );
        assert!(
            snapshot(&dst.region) == *data,
            "seed {seed}: QP pair {i} data"
        );
    }
}

fn checks_done(
    c: &mut braid::testing::Cluster,
    pairs: &[(braid::testing::Side, braid::testing::Side)],
) -> bool {
    // Every pair uses its own CQ on the sending node.
    pairs.iter().all(|(s, _)| c.cq_len(s.node, s.cq) >= 1)
}

#[test]
fn rnr_write_imm_is_retried_until_a_recv_is_posted() {
    let seed = seed(53);
    let mut sim = Sim::new(seed, &config(8, 7), LinkConfig::default());
    let mut rng = rng(seed);
    let src = sim.random_mr(sim.a, 3000, Access::NONE, &mut rng);
    let dst = sim.c.alloc_mr(&sim.b.clone(), 3000, Access::REMOTE_WRITE);
    let remote = RemoteAddr {
        rkey: dst.keys.rkey,
        offset: 0,
    };
    sim.post_send(
        sim.a,
        SendWr {
            wr_id: 5,
            op: SendOp::WriteImm(remote, 77),
            sges: vec![sge(&src, 0, 3000)],
            signaled: true,
        },
    );
    assert!(
        sim.c.run_until(100_000, |c| c.ep(1).stats().naks_sent >= 2),
        "seed {seed}: no RNR NAK"
    );
    sim.post_recv(
        sim.b,
        RecvWr {
            wr_id: 6,
            sges: vec![],
        },
    );
    let a = sim.wait_cq(sim.a, 1, 100_000);
    assert_eq!(
        (a[0].wr_id, a[0].status, a[0].opcode),
        (5, WcStatus::Success, WcOpcode::Write),
        "seed {seed}"
    );
    let b = sim.wait_cq(sim.b, 1, 100_000);
    assert_eq!(
        (
            b[0].wr_id,
            b[0].status,
            b[0].opcode,
            b[0].byte_len,
            b[0].imm
        ),
        (
            6,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            3000,
            Some(77)
        ),
        "seed {seed}"
    );
    assert!(
        snapshot(&dst.region) == snapshot(&src.region),
        "seed {seed}"
    );
}

#[test]
fn rnr_retry_works_under_loss_and_reordering() {
    for s in 0..6 {
        let seed = seed(54 + s);
        let cfg = braid::proto::EndpointConfig {
            rnr_retry_limit: 30,
            ..config(8, 20)
        };
        let mut sim = Sim::new(seed, &cfg, hostile_link(0.05));
        let (_src, data) = send_bytes(&mut sim, 20_000);
        assert!(
            sim.c.run_until(100_000, |c| c.ep(1).stats().naks_sent >= 3),
            "seed {seed}: no RNR NAK"
        );
        let dst = sim.c.alloc_mr(&sim.b.clone(), 20_000, Access::LOCAL_WRITE);
        sim.post_recv(
            sim.b,
            RecvWr {
                wr_id: 6,
                sges: vec![sge(&dst, 0, 7000), sge(&dst, 7000, 13_000)],
            },
        );
        let a = sim.wait_cq(sim.a, 1, 1_000_000);
        assert_eq!(
            (a[0].wr_id, a[0].status),
            (5, WcStatus::Success),
            "seed {seed}"
        );
        let b = sim.wait_cq(sim.b, 1, 1_000_000);
        assert_eq!(
            (b[0].wr_id, b[0].status, b[0].byte_len),
            (6, WcStatus::Success, 20_000),
            "seed {seed}"
        );
        assert!(snapshot(&dst.region) == data, "seed {seed}");
    }
}

#[test]
fn unsignaled_work_requests_complete_silently_unless_they_fail() {
    let seed = seed(71);
    let mut sim = Sim::new(seed, &config(8, 7), hostile_link(0.01));
    let mut rng = rng(seed);
    let src = sim.random_mr(sim.a, 64 * 1024, Access::LOCAL_WRITE, &mut rng);
    let dst = sim.random_mr(sim.b, 64 * 1024, Access::REMOTE_WRITE, &mut rng);
    let remote = |offset| RemoteAddr {
        rkey: dst.keys.rkey,
        offset,
    };
    for i in 0..10u64 {
        let signaled = i == 9;
        sim.post_send(
            sim.a,
            SendWr {
                wr_id: i,
                op: SendOp::Write(remote(i * 5000)),
                sges: vec![sge(&src, i * 5000, 5000)],
                signaled,
            },
        );
    }
    // Then one that fails (a READ from a region without REMOTE_READ), unsignaled.
    sim.post_send(
        sim.a,
        SendWr {
            wr_id: 10,
            op: SendOp::Read(remote(0)),
            sges: vec![sge(&src, 0, 8)],
            signaled: false,
        },
    );
    let got = sim.wait_cq(sim.a, 2, 1_000_000);
    let st: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        vec![(9, WcStatus::Success), (10, WcStatus::RemoteAccessError)],
        "seed {seed}"
    );
    sim.c.run_until(100_000, |c| c.next_event().is_none());
    assert_eq!(sim.drain_cq(sim.a), vec![], "seed {seed}");
}
