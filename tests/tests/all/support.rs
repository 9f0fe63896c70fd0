//! Shared helpers for the simulated tests: a two-node cluster, seeded data, and waiting for
//! completions with the seed in every failure message.
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::datapath::sim::LinkConfig;
use braid::proto::{
    Access, Completion, EndpointConfig, PostError, RecvWr, Region, RemoteAddr, SendOp, SendWr, Sge,
    WcStatus,
};
use braid::testing::{Cluster, Mr, Side};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// The seed for a simulated test: `BRAID_SEED` if set (to replay a failure), else `default`.
pub fn seed(default: u64) -> u64 {
    std::env::var("BRAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A seeded generator for test data, independent of the network's.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_da7a)
}

/// A uniform draw from `0..n` (n > 0).
pub fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// A link with `loss`, plus heavy jitter, reordering, duplication and corruption.
pub fn hostile_link(loss: f64) -> LinkConfig {
    LinkConfig {
        delay_ns: 10_000,
        jitter_ns: 30_000,
        loss,
        duplicate: 0.05,
        reorder: 0.2,
        reorder_extra_ns: 80_000,
        corrupt: 0.03,
        ..LinkConfig::default()
    }
}

/// Engine settings for simulated tests: `paths` paths, and `retry_limit` consecutive
/// timeouts before a QP gives up.
pub fn config(paths: u16, retry_limit: u32) -> EndpointConfig {
    EndpointConfig {
        paths,
        retry_limit,
        ..EndpointConfig::default()
    }
}

/// `cfg` with a short retry time (100 ms of counted silence), for tests that time how a QP
/// gives up on a vanished peer (the default is seconds).
pub fn quick_give_up(cfg: EndpointConfig) -> EndpointConfig {
    EndpointConfig {
        retry_timeout_ns: 100_000_000,
        ..cfg
    }
}

/// Two nodes (0 = requester `a`, 1 = responder `b`) with one connected QP pair.
pub struct Sim {
    /// The cluster.
    pub c: Cluster,
    /// Its seed, for failure messages.
    pub seed: u64,
    /// The requester side.
    pub a: Side,
    /// The responder side.
    pub b: Side,
}

impl Sim {
    pub fn new(seed: u64, cfg: &EndpointConfig, link: LinkConfig) -> Sim {
        Sim::new_with(seed, cfg, link, false)
    }

    /// As [`Sim::new`], with the QP pair encrypted when `encrypted` is set.
    pub fn new_with(seed: u64, cfg: &EndpointConfig, link: LinkConfig, encrypted: bool) -> Sim {
        let mut c = Cluster::new(seed, 2, cfg, link);
        let (a, b) = c.connect_with(0, 1, encrypted);
        Sim { c, seed, a, b }
    }

    /// A region on `side`, filled with seeded random bytes.
    pub fn random_mr(
        &mut self,
        side: Side,
        len: usize,
        access: Access,
        rng: &mut ChaCha8Rng,
    ) -> Mr {
        let mr = self.c.alloc_mr(&side, len, access);
        let mut bytes = vec![0u8; len];
        rng.fill_bytes(&mut bytes);
        mr.region.write(0, &bytes).expect("in bounds");
        mr
    }

    /// `a` WRITEs `len` seeded random bytes into a region on `b` and waits for the
    /// completion (a success); returns the source and destination regions.
    pub fn write(&mut self, len: u32) -> (Mr, Mr) {
        let mut rng = rng(self.seed);
        let src = self.random_mr(self.a, len as usize, Access::NONE, &mut rng);
        let b = self.b;
        let dst = self.c.alloc_mr(&b, len as usize, Access::REMOTE_WRITE);
        self.post_send(
            self.a,
            SendWr {
                wr_id: 1,
                op: SendOp::Write(RemoteAddr {
                    rkey: dst.keys.rkey,
                    offset: 0,
                }),
                sges: vec![sge(&src, 0, len)],
                signaled: true,
            },
        );
        let wc = self.wait_cq(self.a, 1, 3_000_000);
        assert_eq!(wc[0].status, WcStatus::Success, "seed {}", self.seed);
        (src, dst)
    }

    pub fn try_post_send(&mut self, side: Side, wr: SendWr) -> Result<(), PostError> {
        self.c.ep_mut(side.node).post_send(side.qp.qpn, wr)
    }

    pub fn post_send(&mut self, side: Side, wr: SendWr) {
        let seed = self.seed;
        let id = wr.wr_id;
        self.try_post_send(side, wr)
            .unwrap_or_else(|e| panic!("seed {seed}: post_send wr {id}: {e}"));
    }

    pub fn post_recv(&mut self, side: Side, wr: RecvWr) {
        let seed = self.seed;
        let id = wr.wr_id;
        self.c
            .ep_mut(side.node)
            .post_recv(side.qp.qpn, wr)
            .unwrap_or_else(|e| panic!("seed {seed}: post_recv wr {id}: {e}"));
    }

    /// Runs until `side`'s CQ holds `n` completions (or `max_steps` steps), then takes them.
    /// Panics, naming the seed, if fewer arrived.
    pub fn wait_cq(&mut self, side: Side, n: usize, max_steps: u64) -> Vec<Completion> {
        let (node, cq) = (side.node, side.cq);
        self.c.run_until(max_steps, |c| c.cq_len(node, cq) >= n);
        let mut got = Vec::new();
        while let Some(wc) = self.c.poll_cq(node, cq) {
            got.push(wc);
        }
        assert!(
            got.len() >= n,
            "seed {}: node {node} got {} of {n} completions by {:?} ({} steps); last: {:?}; \
             requester {:?}; responder {:?}",
            self.seed,
            got.len(),
            self.c.now,
            self.c.steps,
            got.last(),
            self.c.ep(0).stats(),
            self.c.ep(1).stats(),
        );
        got
    }

    /// Takes every completion waiting on `side`'s CQ.
    pub fn drain_cq(&mut self, side: Side) -> Vec<Completion> {
        let mut got = Vec::new();
        while let Some(wc) = self.c.poll_cq(side.node, side.cq) {
            got.push(wc);
        }
        got
    }
}

/// A scatter/gather entry.
pub fn sge(mr: &Mr, offset: u64, len: u32) -> Sge {
    Sge {
        lkey: mr.keys.lkey,
        offset,
        len,
    }
}

/// The whole content of a region.
pub fn snapshot(region: &Arc<Region>) -> Vec<u8> {
    region.to_vec(0, region.len()).expect("whole region")
}

/// A region of `len` bytes on a device, filled with bytes from `seed`, and a copy of them.
pub fn random_mr(
    pd: &braid::ProtectionDomain,
    len: usize,
    access: Access,
    seed: u64,
) -> (braid::MemoryRegion, Vec<u8>) {
    let mr = pd.alloc_mr(len, access).expect("alloc_mr");
    let mut data = vec![0u8; len];
    rng(seed).fill_bytes(&mut data);
    mr.write(0, &data).expect("in bounds");
    (mr, data)
}

/// The child peer process (`braid-test-peer`), spoken to line by line over its stdin and
/// stdout; killed and reaped when dropped, so a failing test never leaves it behind.
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    /// Starts `cmd` (which runs `braid-test-peer`, possibly through `ip netns exec`) with
    /// piped stdin and stdout.
    pub fn spawn(mut cmd: Command) -> Peer {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn braid-test-peer");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Peer {
            child,
            stdin,
            stdout,
        }
    }

    pub fn send(&mut self, line: &str) {
        let w = self.stdin.as_mut().expect("stdin open");
        writeln!(w, "{line}")
            .and_then(|()| w.flush())
            .expect("write to the peer");
    }

    pub fn recv(&mut self) -> String {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .expect("read from the peer");
        assert!(n > 0, "the peer closed its stdout");
        line.trim_end().to_string()
    }

    pub fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.recv()
    }

    /// Closes stdin after `QUIT` and waits (up to `wait`) for a clean exit.
    pub fn quit(mut self, wait: Duration) {
        self.send("QUIT");
        drop(self.stdin.take());
        let deadline = Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(status.success(), "peer exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "peer did not exit after QUIT");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The child's process id (to stop and continue it with signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Splits `len` bytes into up to `max_k` scatter/gather pieces (a zero-length message gets
/// either no entry or one empty entry).
pub fn split(rng: &mut ChaCha8Rng, len: u32, max_k: u64) -> Vec<u32> {
    if len == 0 {
        return if below(rng, 2) == 0 { vec![] } else { vec![0] };
    }
    let k = 1 + below(rng, max_k) as usize;
    let mut cuts: Vec<u32> = (1..k)
        .map(|_| below(rng, u64::from(len) + 1) as u32)
        .collect();
    cuts.push(0);
    cuts.push(len);
    cuts.sort_unstable();
    cuts.windows(2).map(|w| w[1] - w[0]).collect()
}
