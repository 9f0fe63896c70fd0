//! The test loops, run over one connected queue pair.
//!
//! Bandwidth loops keep a bounded window of outstanding work requests: message `m` uses slot
//! `m % window` (or `m % slots` when fewer slots are asked for, [`BwSpec::slots`]: several
//! outstanding messages then share bytes, as perftest's do), at byte offset `slot * size` in
//! both the local and the remote region, and is
//! posted only once message `m - window` has completed. Completions arrive in posting order,
//! so the completion of `m` frees slot `m % window`, and with only every n-th work request
//! signaled (`BwSpec::signal_every`, perftest's `--cq-mod`) the completion of `m` frees the
//! slots of every message up to `m`.
use std::time::{Duration, Instant};

use braid::{
    Completion, CompletionQueue, MemoryRegion, QueuePair, RecvWr, RemoteAddr, SendOp, SendWr,
    WcOpcode, WcStatus,
};

use crate::pattern;
use crate::report::{BwResult, LatResult};
use crate::stats;

/// Most outstanding work requests in a bandwidth run.
pub const MAX_WINDOW: usize = 64;
/// Outstanding bytes a bandwidth run aims for (fewer work requests for big messages).
pub const WINDOW_BYTES: u64 = 32 << 20;
/// A run fails when no completion arrives for this long.
pub const STALL: Duration = Duration::from_secs(10);

/// The window for messages of `size` bytes: `WINDOW_BYTES / size`, within 2..=`MAX_WINDOW`.
pub fn window_for(size: u64) -> usize {
    (WINDOW_BYTES / size.max(1)).clamp(2, MAX_WINDOW as u64) as usize
}

/// The engine settings of a perftest-style run, over `cfg`: RNR retries without end, as
/// perftest's `rnr_retry` 7, because a SEND test's receiver reposts from a thread the host
/// may deschedule for longer than a finite RNR budget (7 x 0.2 ms by default) lasts.
pub fn perftest_engine(cfg: &mut braid::EndpointConfig) {
    cfg.rnr_retry_limit = braid::RNR_RETRY_FOREVER;
}

/// How long a run lasts.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Limit {
    /// A fixed number of messages.
    Iters(u64),
    /// Posting stops after this long; outstanding work is then drained.
    Duration(Duration),
}

/// One side of a connected QP pair, as a test sees it.
#[derive(Copy, Clone)]
pub struct Conn<'a> {
    /// The connected QP.
    pub qp: &'a QueuePair,
    /// Its send (and receive) completion queue.
    pub cq: &'a CompletionQueue,
    /// The local region (WRITE source, READ destination, SEND/RECV buffers).
    pub local: &'a MemoryRegion,
    /// The peer region's remote key.
    pub rkey: u32,
    /// The peer region's length.
    pub remote_len: u64,
}

/// One-sided operation of a bandwidth run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BwOp {
    /// RDMA WRITE from the local slot to the remote slot.
    Write,
    /// RDMA READ from the remote slot into the local slot.
    Read,
    /// SEND from the local slot into a receive the peer posted (see [`serve_recvs`]).
    Send,
}

impl BwOp {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            BwOp::Write => "write",
            BwOp::Read => "read",
            BwOp::Send => "send",
        }
    }
}

/// A bandwidth run.
#[derive(Clone, Debug)]
pub struct BwSpec {
    /// Operation.
    pub op: BwOp,
    /// Message size, bytes.
    pub size: u32,
    /// Length of the run.
    pub limit: Limit,
    /// Outstanding work requests allowed.
    pub window: usize,
    /// Message slots cycled through in both regions (message `m` uses slot `m % slots`);
    /// 0: one per outstanding work request (the window). Clamped to what the regions hold.
    /// [`run_bw`] only; a check that remembers a slot's content needs the default.
    pub slots: usize,
    /// Spin on the completion queue instead of sleeping on it.
    pub busy_poll: bool,
    /// Print a progress line per second to stderr.
    pub progress: bool,
    /// Signal only every n-th work request (and the last one), as perftest's `--cq-mod`:
    /// 1 signals all. At most the window (a larger value is clamped to it).
    pub signal_every: u32,
}

/// Content checks around each message: `before` prepares message `msg` in slot offset `off`
/// just before it is posted; `after` checks it once it has completed and returns the bytes
/// verified, or a description of the first mismatch.
pub trait Check {
    /// Prepares message `msg` at slot offset `off`.
    fn before(&mut self, msg: u64, off: u64);
    /// Checks message `msg` at slot offset `off`.
    fn after(&mut self, msg: u64, off: u64) -> Result<u64, String>;
}

/// No checks.
pub struct NoCheck;

impl Check for NoCheck {
    fn before(&mut self, _: u64, _: u64) {}
    fn after(&mut self, _: u64, _: u64) -> Result<u64, String> {
        Ok(0)
    }
}

/// End-to-end check with both regions at hand: fills `src`'s slot with a pattern unique to
/// (`salt`, message) before the post and compares `dst`'s slot with it after completion.
pub struct Verifier<'a> {
    src: &'a MemoryRegion,
    dst: &'a MemoryRegion,
    size: usize,
    salt: u64,
    expected: Vec<Vec<u8>>,
    got: Vec<u8>,
}

impl<'a> Verifier<'a> {
    /// A verifier for messages of `size` bytes moving from `src` to `dst` in up to
    /// `slots` slots.
    pub fn new(
        src: &'a MemoryRegion,
        dst: &'a MemoryRegion,
        size: usize,
        slots: usize,
        salt: u64,
    ) -> Self {
        Verifier {
            src,
            dst,
            size,
            salt,
            expected: vec![Vec::new(); slots],
            got: vec![0u8; size],
        }
    }

    fn slot(&self, off: u64) -> usize {
        (off / self.size.max(1) as u64) as usize % self.expected.len()
    }
}

impl Check for Verifier<'_> {
    fn before(&mut self, msg: u64, off: u64) {
        let slot = self.slot(off);
        let e = &mut self.expected[slot];
        e.resize(self.size, 0);
        pattern::fill(self.salt ^ msg.wrapping_mul(0x100_0000_01B3), e);
        // The slot was checked to fit when the window was chosen.
        let _ = self.src.write(off, e);
    }

    fn after(&mut self, msg: u64, off: u64) -> Result<u64, String> {
        let slot = self.slot(off);
        self.dst
            .read(off, &mut self.got)
            .map_err(|e| format!("message {msg}: reading the destination: {e:?}"))?;
        match pattern::first_mismatch(&self.got, &self.expected[slot]) {
            None => Ok(self.size as u64),
            Some(i) => Err(format!(
                "message {msg}: byte {i} of {} differs (got {:#04x}, want {:#04x})",
                self.size,
                self.got.get(i).copied().unwrap_or(0),
                self.expected[slot].get(i).copied().unwrap_or(0)
            )),
        }
    }
}

/// A placeholder completion for poll buffers.
pub fn empty_completion() -> Completion {
    Completion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qpn: 0,
    }
}

/// Takes at least one completion into `buf`: spinning when `busy`, else sleeping on the CQ.
/// Fails after [`STALL`] without any.
pub fn next_completions(
    cq: &CompletionQueue,
    buf: &mut [Completion],
    busy: bool,
) -> Result<usize, String> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let n = cq.poll(buf);
        if n > 0 {
            return Ok(n);
        }
        if busy {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) && start.elapsed() > STALL {
                return Err(format!(
                    "no completion for {} s: the connection stalled",
                    STALL.as_secs()
                ));
            }
        } else {
            if let Some(c) = cq.wait(Duration::from_millis(100)) {
                buf[0] = c;
                return Ok(1 + cq.poll(&mut buf[1..]));
            }
            if start.elapsed() > STALL {
                return Err(format!(
                    "no completion for {} s: the connection stalled",
                    STALL.as_secs()
                ));
            }
        }
    }
}

/// Prints a progress line per second to stderr.
pub struct Progress {
    enabled: bool,
    label: String,
    start: Instant,
    last: Instant,
    last_done: u64,
}

impl Progress {
    /// Starts the clock.
    pub fn new(enabled: bool, label: impl Into<String>) -> Self {
        let now = Instant::now();
        Progress {
            enabled,
            label: label.into(),
            start: now,
            last: now,
            last_done: 0,
        }
    }

    /// Reports `done` messages of `size` bytes if a second has passed since the last line.
    pub fn tick(&mut self, done: u64, size: u64) {
        if !self.enabled {
            return;
        }
        let Some(now) = now_if_due(self.last) else {
            return;
        };
        let dt = now.duration_since(self.last).as_secs_f64();
        let msgs = done - self.last_done;
        eprintln!(
            "[{:6.1} s] {}: {} msgs, {:.3} Gbit/s, {:.0} msg/s",
            now.duration_since(self.start).as_secs_f64(),
            self.label,
            done,
            (msgs * size) as f64 * 8.0 / dt / 1e9,
            msgs as f64 / dt
        );
        self.last = now;
        self.last_done = done;
    }
}

fn now_if_due(last: Instant) -> Option<Instant> {
    let now = Instant::now();
    (now.duration_since(last) >= Duration::from_secs(1)).then_some(now)
}

fn check_wc(wc: &Completion, want_id: u64, what: &str) -> Result<(), String> {
    if wc.status != WcStatus::Success {
        return Err(format!(
            "{what} {} completed with {:?}",
            wc.wr_id, wc.status
        ));
    }
    if wc.wr_id != want_id {
        return Err(format!(
            "{what}: completion for {} while {} was expected (out of order)",
            wc.wr_id, want_id
        ));
    }
    Ok(())
}

fn record(res: Result<u64, String>, verified: &mut u64, mismatches: &mut u64) {
    match res {
        Ok(b) => *verified += b,
        Err(e) => {
            *mismatches += 1;
            if *mismatches <= 5 {
                eprintln!("VERIFY FAILED: {e}");
            }
        }
    }
}

/// Runs a WRITE or READ bandwidth test.
pub fn run_bw(c: &Conn<'_>, spec: &BwSpec, check: &mut dyn Check) -> Result<BwResult, String> {
    let size = u64::from(spec.size);
    if size == 0 {
        return Err("message size must be at least 1 byte".into());
    }
    let fit = (c.local.len() as u64 / size).min(c.remote_len / size) as usize;
    let wanted = if spec.slots == 0 {
        spec.window
    } else {
        spec.slots
    };
    let slots = wanted.min(fit);
    if slots == 0 || spec.window == 0 {
        return Err(format!("regions too small for {size}-byte messages"));
    }
    // Distinct slots per outstanding request, unless fewer were asked for.
    let window = if spec.slots == 0 {
        slots
    } else {
        spec.window.min(MAX_WINDOW)
    };
    // A group of `every` work requests ends in a signaled one; a window smaller than the
    // group would wait for a completion that is never asked for. With `every` at most the
    // window, the outstanding requests always hold a signaled one.
    let every = u64::from(spec.signal_every.max(1)).min(window as u64);
    let mut wcs = vec![empty_completion(); MAX_WINDOW];
    // The window's free slots are posted as one list (one doorbell), as perftest's post list
    // does; the list's buffer is reused from refill to refill.
    let mut list = Vec::with_capacity(window);
    let (mut posted, mut done, mut verified, mut mismatches) = (0u64, 0u64, 0u64, 0u64);
    let mut progress = Progress::new(spec.progress, format!("{} {size} B", spec.op.name()));
    let start = Instant::now();
    let mut end = start;
    loop {
        // A timed run that ran out finishes its group, so its last post is signaled.
        let more = match spec.limit {
            Limit::Iters(n) => posted < n,
            Limit::Duration(d) => start.elapsed() < d || !posted.is_multiple_of(every),
        };
        if more {
            let cap = match spec.limit {
                Limit::Iters(n) => n,
                Limit::Duration(_) => u64::MAX,
            };
            let mut next = posted;
            while next - done < window as u64 && next < cap {
                let off = (next % slots as u64) * size;
                check.before(next, off);
                let remote = RemoteAddr {
                    rkey: c.rkey,
                    offset: off,
                };
                let op = match spec.op {
                    BwOp::Write => SendOp::Write(remote),
                    BwOp::Read => SendOp::Read(remote),
                    BwOp::Send => SendOp::Send,
                };
                list.push(SendWr {
                    wr_id: next,
                    op,
                    sges: vec![c.local.sge(off, spec.size)],
                    signaled: (next + 1).is_multiple_of(every) || next + 1 == cap,
                });
                next += 1;
            }
            if !list.is_empty() {
                c.qp.post_send_list(list.drain(..)).map_err(|(i, e)| {
                    format!("post_send (work request {}): {e}", posted + i as u64)
                })?;
                posted = next;
            }
        } else if done == posted {
            break;
        }
        if done == posted {
            continue;
        }
        let n = next_completions(c.cq, &mut wcs, spec.busy_poll)?;
        for wc in &wcs[..n] {
            // Unsignaled work requests complete silently with the next signaled one.
            let want = if every == 1 {
                done
            } else {
                wc.wr_id.clamp(done, posted.saturating_sub(1))
            };
            check_wc(wc, want, spec.op.name())?;
            while done <= wc.wr_id {
                let off = (done % slots as u64) * size;
                record(check.after(done, off), &mut verified, &mut mismatches);
                done += 1;
            }
        }
        end = Instant::now();
        progress.tick(done, size);
    }
    let mut r = BwResult::new(
        spec.op.name(),
        size,
        done,
        end.duration_since(start).as_secs_f64(),
        window,
    );
    r.verified_bytes = verified;
    r.mismatches = mismatches;
    Ok(r)
}

/// Runs a WRITE latency test: each round trip posts one signaled WRITE of `size` bytes and
/// waits for its completion (= the peer's ACK): spinning on the CQ when `busy`, else
/// sleeping in [`CompletionQueue::wait`]. `check` runs outside the timed part; `warmup`
/// round trips are not counted.
pub fn run_write_lat(
    c: &Conn<'_>,
    size: u32,
    iters: u64,
    warmup: u64,
    progress: bool,
    busy: bool,
    check: &mut dyn Check,
) -> Result<LatResult, String> {
    run_rdma_lat(
        c,
        LatOp::Write,
        size,
        (iters, warmup),
        progress,
        busy,
        check,
    )
}

/// Runs a READ latency test, as perftest's `ib_read_lat`: each round trip posts one
/// signaled READ of `size` bytes from the peer's region into the local one and waits for
/// its completion (= the last byte of the response placed), as [`run_write_lat`] waits.
pub fn run_read_lat(
    c: &Conn<'_>,
    size: u32,
    (iters, warmup): (u64, u64),
    progress: bool,
    busy: bool,
) -> Result<LatResult, String> {
    run_rdma_lat(
        c,
        LatOp::Read,
        size,
        (iters, warmup),
        progress,
        busy,
        &mut NoCheck,
    )
}

/// Runs an atomic latency test, as perftest's `ib_atomic_lat`: each round trip posts one
/// signaled fetch-and-add of 1 to the peer's first 8 bytes and waits for its completion
/// (= the original value landed in the local region). The peer's region starts zeroed and
/// nothing else adds to it, so round trip `i` (warm-up included) must fetch `i`: every
/// result is checked, outside the timed part.
pub fn run_atomic_lat(
    c: &Conn<'_>,
    (iters, warmup): (u64, u64),
    progress: bool,
    busy: bool,
) -> Result<LatResult, String> {
    let mut check = Fetched(c.local);
    run_rdma_lat(
        c,
        LatOp::FetchAdd,
        8,
        (iters, warmup),
        progress,
        busy,
        &mut check,
    )
}

/// What a latency test's work request does.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum LatOp {
    Write,
    Read,
    /// Fetch-and-add of 1 (8 bytes).
    FetchAdd,
}

impl LatOp {
    fn name(self) -> &'static str {
        match self {
            LatOp::Write => "write",
            LatOp::Read => "read",
            LatOp::FetchAdd => "fetch_add",
        }
    }
}

/// The check of [`run_atomic_lat`]: round trip `msg` fetched `msg` into the region's first
/// 8 bytes.
struct Fetched<'a>(&'a MemoryRegion);

impl Check for Fetched<'_> {
    fn before(&mut self, _: u64, _: u64) {}
    fn after(&mut self, msg: u64, _: u64) -> Result<u64, String> {
        let mut b = [0u8; 8];
        self.0
            .read(0, &mut b)
            .map_err(|e| format!("local read: {e:?}"))?;
        match u64::from_ne_bytes(b) {
            got if got == msg => Ok(8),
            got => Err(format!("fetch_add {msg} fetched {got}")),
        }
    }
}

/// The round trips of [`run_write_lat`], [`run_read_lat`] and [`run_atomic_lat`].
fn run_rdma_lat(
    c: &Conn<'_>,
    op: LatOp,
    size: u32,
    (iters, warmup): (u64, u64),
    progress: bool,
    busy: bool,
    check: &mut dyn Check,
) -> Result<LatResult, String> {
    if u64::from(size) > c.remote_len || size as usize > c.local.len() {
        return Err(format!("regions too small for {size}-byte messages"));
    }
    let mut samples = Vec::with_capacity(iters as usize);
    let mut mismatches = 0u64;
    let mut verified = 0u64;
    let mut wcs = [empty_completion()];
    let mut prog = Progress::new(progress, format!("{}_lat {size} B", op.name()));
    let remote = RemoteAddr {
        rkey: c.rkey,
        offset: 0,
    };
    for i in 0..warmup + iters {
        check.before(i, 0);
        let wr = SendWr {
            wr_id: i,
            op: match op {
                LatOp::Write => SendOp::Write(remote),
                LatOp::Read => SendOp::Read(remote),
                LatOp::FetchAdd => SendOp::FetchAdd(remote, 1),
            },
            sges: vec![c.local.sge(0, size)],
            signaled: true,
        };
        let t0 = Instant::now();
        c.qp.post_send(wr).map_err(|e| format!("post_send: {e}"))?;
        next_completions(c.cq, &mut wcs, busy)?;
        let dt = t0.elapsed();
        check_wc(&wcs[0], i, op.name())?;
        record(check.after(i, 0), &mut verified, &mut mismatches);
        if i >= warmup {
            samples.push(dt.as_nanos() as u64);
            prog.tick(i + 1 - warmup, u64::from(size));
        }
    }
    Ok(LatResult {
        op: op.name().into(),
        size: u64::from(size),
        iterations: iters,
        lat: stats::summarize(&mut samples),
        mismatches,
    })
}

/// Runs a SEND ping-pong latency test against a peer that echoes every SEND back (see
/// [`serve_echo`]). The local region holds the send buffer at 0 and the receive buffer at
/// `size` rounded up to 8. Every echo is checked against what was sent.
pub fn run_send_lat(
    c: &Conn<'_>,
    size: u32,
    iters: u64,
    warmup: u64,
    progress: bool,
) -> Result<LatResult, String> {
    let rx_off = u64::from(size).div_ceil(8) * 8;
    if (rx_off + u64::from(size)) as usize > c.local.len() {
        return Err(format!("local region too small for {size}-byte messages"));
    }
    let mut samples = Vec::with_capacity(iters as usize);
    let mut mismatches = 0u64;
    let mut wcs = vec![empty_completion(); 4];
    let mut sent = vec![0u8; size as usize];
    let mut got = vec![0u8; size as usize];
    let mut prog = Progress::new(progress, format!("send_lat {size} B"));
    for i in 0..warmup + iters {
        pattern::fill(0x5E4D ^ i, &mut sent);
        c.local
            .write(0, &sent)
            .map_err(|e| format!("local write: {e:?}"))?;
        c.qp.post_recv(RecvWr {
            wr_id: i,
            sges: vec![c.local.sge(rx_off, size)],
        })
        .map_err(|e| format!("post_recv: {e}"))?;
        let t0 = Instant::now();
        c.qp.post_send(SendWr {
            wr_id: i,
            op: SendOp::Send,
            sges: vec![c.local.sge(0, size)],
            signaled: true,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        let (mut send_done, mut rtt) = (false, None);
        while !send_done || rtt.is_none() {
            let n = next_completions(c.cq, &mut wcs, true)?;
            let now = t0.elapsed();
            for wc in &wcs[..n] {
                match wc.opcode {
                    WcOpcode::Recv => {
                        check_wc(wc, i, "recv")?;
                        if wc.byte_len != size {
                            return Err(format!("echo {i} has {} bytes, want {size}", wc.byte_len));
                        }
                        rtt = Some(now);
                    }
                    _ => {
                        check_wc(wc, i, "send")?;
                        send_done = true;
                    }
                }
            }
        }
        c.local
            .read(rx_off, &mut got)
            .map_err(|e| format!("local read: {e:?}"))?;
        if let Some(at) = pattern::first_mismatch(&got, &sent) {
            mismatches += 1;
            if mismatches <= 5 {
                eprintln!("VERIFY FAILED: echo {i}: byte {at} differs");
            }
        }
        if i >= warmup {
            samples.push(rtt.map_or(0, |d| d.as_nanos() as u64));
            prog.tick(i + 1 - warmup, u64::from(size));
        }
    }
    Ok(LatResult {
        op: "send".into(),
        size: u64::from(size),
        iterations: iters,
        lat: stats::summarize(&mut samples),
        mismatches,
    })
}

/// Keeps the passive side of a test moving on an inline-progress device (one whose CQ polls
/// drive it, [`braid::Progress::Inline`]), in the polling mode of the active side: polls `cq`
/// until `stop` is set, spinning when `busy`, else sleeping in [`CompletionQueue::wait`].
/// On a thread-progress device the progress thread does this work and polling only takes
/// CPU time, so callers need it only for inline devices. Returns the completions it took
/// (none in WRITE and READ tests, whose passive side completes nothing).
pub fn drive_passive(
    cq: &CompletionQueue,
    busy: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> u64 {
    use std::sync::atomic::Ordering;
    let mut wcs = [empty_completion(); 16];
    let mut taken = 0u64;
    while !stop.load(Ordering::Acquire) {
        if busy {
            taken += cq.poll(&mut wcs) as u64;
            std::hint::spin_loop();
        } else if cq.wait(Duration::from_millis(20)).is_some() {
            taken += 1;
        }
    }
    taken
}

/// Slots the echo server keeps receives posted in.
pub const ECHO_SLOTS: usize = 64;

/// Posts the echo server's receives: `ECHO_SLOTS` slots of `size` bytes in `mr`.
pub fn post_echo_recvs(qp: &QueuePair, mr: &MemoryRegion, size: u32) -> Result<(), String> {
    let stride = u64::from(size).div_ceil(8).max(1) * 8;
    if stride * ECHO_SLOTS as u64 > mr.len() as u64 {
        return Err(format!(
            "region too small for {ECHO_SLOTS} receives of {size} bytes"
        ));
    }
    for k in 0..ECHO_SLOTS as u64 {
        qp.post_recv(RecvWr {
            wr_id: k,
            sges: vec![mr.sge(k * stride, size)],
        })
        .map_err(|e| format!("post_recv: {e}"))?;
    }
    Ok(())
}

/// Echoes every SEND that lands in a receive posted by [`post_echo_recvs`] back from the same
/// buffer, until `stop` is set. Returns how many were echoed.
pub fn serve_echo(
    qp: &QueuePair,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u32,
    busy: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<u64, String> {
    use std::sync::atomic::Ordering;
    let stride = u64::from(size).div_ceil(8).max(1) * 8;
    let mut wcs = vec![empty_completion(); 16];
    let mut echoed = 0u64;
    while !stop.load(Ordering::Acquire) {
        let n = if busy {
            cq.poll(&mut wcs)
        } else {
            match cq.wait(Duration::from_millis(20)) {
                Some(c) => {
                    wcs[0] = c;
                    1 + cq.poll(&mut wcs[1..])
                }
                None => 0,
            }
        };
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "echo: {:?} completed with {:?}",
                    wc.opcode, wc.status
                ));
            }
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            let slot = wc.wr_id % ECHO_SLOTS as u64;
            let off = slot * stride;
            qp.post_send(SendWr {
                wr_id: wc.wr_id,
                op: SendOp::Send,
                sges: vec![mr.sge(off, wc.byte_len)],
                signaled: true,
            })
            .map_err(|e| format!("echo post_send: {e}"))?;
            // The slot's next SEND arrives only after this echo was received (ping-pong), so
            // reposting it now is safe.
            qp.post_recv(RecvWr {
                wr_id: wc.wr_id + ECHO_SLOTS as u64,
                sges: vec![mr.sge(off, size)],
            })
            .map_err(|e| format!("echo post_recv: {e}"))?;
            echoed += 1;
        }
        if busy && n == 0 {
            std::hint::spin_loop();
        }
    }
    Ok(echoed)
}

/// The receiving side of an in-process SEND bandwidth test.
pub struct RecvSide<'a> {
    /// The receiving QP.
    pub qp: &'a QueuePair,
    /// Its receive completion queue.
    pub cq: &'a CompletionQueue,
    /// Its region (receive buffers, slot `m % window` at `slot * size`).
    pub mr: &'a MemoryRegion,
}

/// Runs a SEND bandwidth test with both ends in this process: the receiver keeps one RECV
/// posted per window slot, and a SEND is posted only once its RECV is. `check.after` runs on
/// each receive completion (so it should read the receiver's region).
pub fn run_send_bw_local(
    c: &Conn<'_>,
    r: &RecvSide<'_>,
    spec: &BwSpec,
    check: &mut dyn Check,
) -> Result<BwResult, String> {
    let size = u64::from(spec.size);
    if size == 0 {
        return Err("message size must be at least 1 byte".into());
    }
    let window = spec
        .window
        .min((c.local.len() as u64 / size).min(r.mr.len() as u64 / size) as usize);
    if window == 0 {
        return Err(format!("regions too small for {size}-byte messages"));
    }
    let w = window as u64;
    for m in 0..w {
        r.qp.post_recv(RecvWr {
            wr_id: m,
            sges: vec![r.mr.sge(m * size, spec.size)],
        })
        .map_err(|e| format!("post_recv: {e}"))?;
    }
    let mut recv_posted = w;
    let mut wcs = vec![empty_completion(); MAX_WINDOW];
    let (mut posted, mut sent, mut received, mut verified, mut mismatches) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut progress = Progress::new(spec.progress, format!("send {size} B"));
    let start = Instant::now();
    let mut end = start;
    let mut idle_since = Instant::now();
    loop {
        let more = match spec.limit {
            Limit::Iters(n) => posted < n,
            Limit::Duration(d) => start.elapsed() < d,
        };
        let cap = match spec.limit {
            Limit::Iters(n) => n,
            Limit::Duration(_) => u64::MAX,
        };
        if more {
            while posted - sent < w && posted < recv_posted && posted < cap {
                let off = (posted % w) * size;
                check.before(posted, off);
                let wr = SendWr {
                    wr_id: posted,
                    op: SendOp::Send,
                    sges: vec![c.local.sge(off, spec.size)],
                    signaled: true,
                };
                c.qp.post_send(wr).map_err(|e| format!("post_send: {e}"))?;
                posted += 1;
            }
        } else if sent == posted && received == posted {
            break;
        }
        let mut got_any = false;
        let n = r.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            check_wc(wc, received, "recv")?;
            if u64::from(wc.byte_len) != size {
                return Err(format!(
                    "recv {} has {} bytes, want {size}",
                    wc.wr_id, wc.byte_len
                ));
            }
            let off = (received % w) * size;
            record(check.after(received, off), &mut verified, &mut mismatches);
            r.qp.post_recv(RecvWr {
                wr_id: recv_posted,
                sges: vec![r.mr.sge(off, spec.size)],
            })
            .map_err(|e| format!("post_recv: {e}"))?;
            recv_posted += 1;
            received += 1;
            got_any = true;
        }
        if sent < posted {
            let n = if spec.busy_poll || n > 0 {
                c.cq.poll(&mut wcs)
            } else {
                match c.cq.wait(Duration::from_millis(1)) {
                    Some(x) => {
                        wcs[0] = x;
                        1 + c.cq.poll(&mut wcs[1..])
                    }
                    None => 0,
                }
            };
            for wc in &wcs[..n] {
                check_wc(wc, sent, "send")?;
                sent += 1;
                got_any = true;
            }
        }
        if got_any {
            end = Instant::now();
            idle_since = end;
            progress.tick(received, size);
        } else if idle_since.elapsed() > STALL {
            return Err(format!(
                "no completion for {} s: the connection stalled",
                STALL.as_secs()
            ));
        }
    }
    let mut res = BwResult::new(
        "send",
        size,
        received,
        end.duration_since(start).as_secs_f64(),
        window,
    );
    res.verified_bytes = verified;
    res.mismatches = mismatches;
    Ok(res)
}

/// Most receives the passive side of a remote SEND bandwidth test keeps posted.
pub const RECV_SLOTS_MAX: usize = 2 * MAX_WINDOW;

/// Posts the receives of the passive side of a SEND bandwidth test: one per slot of `size`
/// bytes in `mr`, at most [`RECV_SLOTS_MAX`]. Returns the slot count.
pub fn post_recv_slots(qp: &QueuePair, mr: &MemoryRegion, size: u32) -> Result<usize, String> {
    let size64 = u64::from(size.max(1));
    let slots = ((mr.len() as u64 / size64) as usize).min(RECV_SLOTS_MAX);
    if slots == 0 {
        return Err(format!("region too small for {size}-byte receives"));
    }
    for k in 0..slots as u64 {
        qp.post_recv(RecvWr {
            wr_id: k,
            sges: vec![mr.sge(k * size64, size)],
        })
        .map_err(|e| format!("post_recv: {e}"))?;
    }
    Ok(slots)
}

/// The passive side of a SEND bandwidth test: takes the receive completions of the slots
/// [`post_recv_slots`] posted and posts each slot's receive again at once, until `stop` is
/// set (spinning on `cq` when `busy`, else sleeping on it). Twice the sender's window in
/// slots keeps the sender from outrunning the reposting while this thread runs; when it is
/// descheduled, the sender's SENDs meet RNR NAKs and wait, which needs the endless RNR
/// retries of [`perftest_engine`]. Returns the receives completed.
pub fn serve_recvs(
    qp: &QueuePair,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u32,
    slots: usize,
    busy: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<u64, String> {
    use std::sync::atomic::Ordering;
    let size64 = u64::from(size.max(1));
    let slots = slots.max(1) as u64;
    let mut wcs = vec![empty_completion(); 32];
    let mut received = 0u64;
    while !stop.load(Ordering::Acquire) {
        let n = if busy {
            cq.poll(&mut wcs)
        } else {
            match cq.wait(Duration::from_millis(20)) {
                Some(c) => {
                    wcs[0] = c;
                    1 + cq.poll(&mut wcs[1..])
                }
                None => 0,
            }
        };
        for wc in &wcs[..n] {
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            check_wc(wc, received, "recv")?;
            if wc.byte_len != size {
                return Err(format!(
                    "recv {} has {} bytes, want {size}",
                    wc.wr_id, wc.byte_len
                ));
            }
            let off = (wc.wr_id % slots) * size64;
            qp.post_recv(RecvWr {
                wr_id: wc.wr_id + slots,
                sges: vec![mr.sge(off, size)],
            })
            .map_err(|e| format!("post_recv: {e}"))?;
            received += 1;
        }
        if busy && n == 0 {
            std::hint::spin_loop();
        }
    }
    Ok(received)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};

    use braid::{Access, Device, DeviceConfig};

    use super::*;

    /// Two connected devices on 127.0.0.1 and what a test loop needs of them.
    struct Loop {
        devs: [Device; 2],
    }

    fn pair() -> Loop {
        let lo: SocketAddr = ([127, 0, 0, 1], 0).into();
        let open = || {
            let mut cfg = DeviceConfig::udp(lo).paths(4);
            perftest_engine(&mut cfg.engine);
            Device::open(cfg).expect("device")
        };
        Loop {
            devs: [open(), open()],
        }
    }

    /// A protection domain, completion queue and QP on each device of a [`Loop`].
    struct Ends {
        pa: braid::ProtectionDomain,
        pb: braid::ProtectionDomain,
        ca: CompletionQueue,
        cb: CompletionQueue,
        qa: QueuePair,
        qb: QueuePair,
    }

    impl Ends {
        fn new(l: &Loop) -> Ends {
            let (pa, pb) = (l.devs[0].alloc_pd(), l.devs[1].alloc_pd());
            let (ca, cb) = (l.devs[0].create_cq(), l.devs[1].create_cq());
            let qa = pa.create_qp(&ca, &ca).unwrap();
            let qb = pb.create_qp(&cb, &cb).unwrap();
            Ends {
                pa,
                pb,
                ca,
                cb,
                qa,
                qb,
            }
        }

        fn connect(&self) {
            self.qa.connect(self.qb.info()).unwrap();
            self.qb.connect(self.qa.info()).unwrap();
        }
    }

    fn spec(op: BwOp, size: u32, limit: Limit, window: usize, every: u32) -> BwSpec {
        BwSpec {
            op,
            size,
            limit,
            window,
            slots: 0,
            busy_poll: false,
            progress: false,
            signal_every: every,
        }
    }

    #[test]
    fn unsignaled_writes_complete_with_the_next_signaled_one() {
        let l = pair();
        let e = Ends::new(&l);
        e.connect();
        let Ends { pa, pb, ca, qa, .. } = &e;
        let window = 8;
        let src = pa.alloc_mr(window * 64, Access::LOCAL_WRITE).unwrap();
        let dst = pb.alloc_mr(window * 64, Access::ALL).unwrap();
        let conn = Conn {
            qp: qa,
            cq: ca,
            local: &src,
            rkey: dst.rkey(),
            remote_len: dst.len() as u64,
        };
        // 103 messages in groups of 5 (the last one cut short): every message verified.
        let mut v = Verifier::new(&src, &dst, 64, window, 7);
        let r = run_bw(
            &conn,
            &spec(BwOp::Write, 64, Limit::Iters(103), window, 5),
            &mut v,
        )
        .unwrap();
        assert_eq!((r.iterations, r.mismatches), (103, 0));
        assert_eq!(r.verified_bytes, 103 * 64);
        // Only the signaled ones left completions: nothing more is queued.
        assert_eq!(ca.poll(&mut [empty_completion(); 4]), 0);
        // A timed run stops on a group boundary; a group wider than the window is clamped.
        let r = run_bw(
            &conn,
            &spec(
                BwOp::Write,
                64,
                Limit::Duration(Duration::from_millis(50)),
                window,
                32,
            ),
            &mut NoCheck,
        )
        .unwrap();
        assert!(r.iterations > 0);
        assert_eq!(r.iterations % window as u64, 0, "{} messages", r.iterations);
        assert_eq!(ca.poll(&mut [empty_completion(); 4]), 0);
    }

    #[test]
    fn fewer_slots_than_the_window_share_bytes_and_keep_the_window() {
        let l = pair();
        let e = Ends::new(&l);
        e.connect();
        let Ends { pa, pb, ca, qa, .. } = &e;
        // Regions of one 4 KiB slot: by default they allow one outstanding WRITE; with
        // `slots: 1` all 8 of the window are outstanding from and to the same bytes.
        let src = pa.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        let dst = pb.alloc_mr(4096, Access::ALL).unwrap();
        src.write(0, &[0x5a; 4096]).unwrap();
        let conn = Conn {
            qp: qa,
            cq: ca,
            local: &src,
            rkey: dst.rkey(),
            remote_len: dst.len() as u64,
        };
        let one = run_bw(
            &conn,
            &spec(BwOp::Write, 4096, Limit::Iters(20), 8, 1),
            &mut NoCheck,
        )
        .unwrap();
        assert_eq!((one.iterations, one.window), (20, 1));
        let shared = BwSpec {
            slots: 1,
            ..spec(BwOp::Write, 4096, Limit::Iters(40), 8, 1)
        };
        let r = run_bw(&conn, &shared, &mut NoCheck).unwrap();
        assert_eq!((r.iterations, r.window), (40, 8));
        let mut got = vec![0u8; 4096];
        dst.read(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0x5a));
        // More slots than the regions hold is clamped, not an error.
        let many = BwSpec {
            slots: 64,
            ..spec(BwOp::Write, 4096, Limit::Iters(4), 8, 1)
        };
        assert_eq!(run_bw(&conn, &many, &mut NoCheck).unwrap().iterations, 4);
    }

    #[test]
    fn send_bandwidth_lands_in_reposted_receives() {
        let l = pair();
        let e = Ends::new(&l);
        let Ends {
            pa,
            pb,
            ca,
            cb,
            qa,
            qb,
        } = &e;
        let size = 3000u32;
        let window = 4;
        let src = pa
            .alloc_mr(window * size as usize, Access::LOCAL_WRITE)
            .unwrap();
        let dst = pb
            .alloc_mr(2 * window * size as usize, Access::ALL)
            .unwrap();
        let slots = post_recv_slots(qb, &dst, size).unwrap();
        assert_eq!(slots, 2 * window);
        e.connect();
        let conn = Conn {
            qp: qa,
            cq: ca,
            local: &src,
            rkey: 0,
            remote_len: dst.len() as u64,
        };
        let stop = AtomicBool::new(false);
        let (sent, received) = std::thread::scope(|s| {
            let rx = s.spawn(|| serve_recvs(qb, cb, &dst, size, slots, false, &stop));
            let sent = run_bw(
                &conn,
                &spec(BwOp::Send, size, Limit::Iters(200), window, 1),
                &mut NoCheck,
            );
            stop.store(true, Ordering::Release);
            (sent, rx.join().unwrap())
        });
        let sent = sent.unwrap();
        assert_eq!((sent.op.as_str(), sent.iterations), ("send", 200));
        // Every SEND completed, so each receive completion was queued at the receiver before
        // the sender saw its ACK: those the loop did not take before it stopped are left.
        let mut wcs = [empty_completion(); 32];
        let mut left = 0;
        loop {
            let n = cb.poll(&mut wcs);
            if n == 0 {
                break;
            }
            assert!(wcs[..n].iter().all(|wc| wc.status == WcStatus::Success));
            left += n as u64;
        }
        assert_eq!(received.unwrap() + left, 200);
    }
}
