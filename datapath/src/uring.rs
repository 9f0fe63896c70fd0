//! The io_uring UDP backend: the same sockets as the [`udp`] backend, driven through two
//! io_uring instances so that a whole batch costs one system call.
//!
//! What it does not do: zero-copy send (`SEND_ZC` pays only for payloads far larger than
//! Braid's MTU-sized datagrams), pacing, or any protocol logic. It moves datagrams.
//!
//! Sockets are laid out and set up exactly as in [`UdpDatapath`](crate::udp::UdpDatapath)
//! (the same `PathSockets`): one per path, path 0 bound to the configured address and the
//! only one read from, paths `1..paths` bound to ephemeral ports and only sending, each
//! connected to the first destination it sends to and marking that datagram's ECN
//! codepoint by default, so that sends to it carry neither address nor `IP_TOS` message.
//!
//! **Receive.** One multishot `IORING_OP_RECVMSG` stays armed on the path-0 socket. The
//! kernel picks a buffer from a registered *buffer ring* (`IORING_REGISTER_PBUF_RING`) for
//! each datagram and writes an `io_uring_recvmsg_out` header, the source address, the
//! `IP_TOS`/`IPV6_TCLASS` control message and the payload into it. [`Datapath::recv_with`]
//! hands the payload to the caller straight out of that buffer (no copy) and gives the
//! buffers back to the ring once per batch; [`Datapath::recv`] is built on it and copies
//! into the caller's [`RecvBatch`]. When the kernel ends the multishot (a completion without
//! `IORING_CQE_F_MORE`: the ring ran out of buffers, `ENOBUFS`, or the request was
//! cancelled) it is re-armed after the buffers are returned; datagrams wait in the socket
//! meanwhile, none is lost. With [`UdpConfig::gro`] (the default) the socket has `UDP_GRO`
//! on and every buffer is 64 KiB (plus headers), room for a coalesced run; its `UDP_GRO`
//! control message gives the segment size, and each segment is handed on as its own
//! datagram (a run cut short by the caller's limit resumes at the next call). A one-shot `POLL_ADD` on an eventfd in the same ring turns
//! [`Datapath::wake`] into a completion, so one `io_uring_enter` with a timeout waits for
//! datagrams, wake-ups and the deadline at once. This ring is used only by the thread
//! calling `recv`.
//!
//! **Send.** A second ring, behind a mutex because `send` is called from several threads,
//! carries one `IORING_OP_SENDMSG` per datagram, or per run of consecutive datagrams with
//! the same destination, path, ECN codepoint and length (the last of a run may be shorter),
//! sent as one UDP GSO super-datagram (`UDP_SEGMENT` control message) that the kernel cuts
//! into separate datagrams ([`UdpConfig::gso`], on by default, turns this off). A batch is
//! submitted and reaped with one `io_uring_enter`. Every send carries `MSG_DONTWAIT`, so the
//! kernel completes it inline during that call instead of parking it: no send outlives the
//! `send` call whose caller's memory it reads. A full socket buffer is waited out with
//! `poll` for at most about 10 ms per call, as in the UDP backend.
//!
//! **Requirements.** Linux 6.0 (multishot `RECVMSG`; buffer rings came in 5.19) and an
//! io_uring that the process may use (`kernel.io_uring_disabled`, seccomp and container
//! policies can forbid it). [`UringDatapath::bind`] checks all of it and says what is
//! missing; callers fall back to [`UdpDatapath`](crate::udp::UdpDatapath).

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use io_uring::types::{BufRingEntry, Fd, RecvMsgOut, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode};
use socket2::{Domain, Protocol, Socket, Type};

use crate::sys::{self, Control, EventFd};
use crate::udp::{
    self, GRO_BUFFER_BYTES, GSO_BYTES_MAX, GSO_SEGMENTS_MAX, MAX_PATHS, OffloadCounters,
    OffloadStats, PathSockets, UdpConfig,
};
use crate::{Datapath, MAX_DATAGRAM, RecvBatch, RecvMeta, Transmit};

/// Memory the receive buffer pool may take, in bytes (the pool is at most
/// [`RX_BUFFERS_MAX`] buffers, at least [`RX_BUFFERS_MIN`]).
const RX_POOL_BYTES: usize = 16 << 20;

/// Most receive buffers in the ring: at 1600-byte buffers, 6.5 MB, about 5 ms of a
/// 10 Gbit/s stream.
const RX_BUFFERS_MAX: u16 = 4096;

/// Fewest receive buffers in the ring, whatever their size.
const RX_BUFFERS_MIN: u16 = 32;

/// Bytes of the `io_uring_recvmsg_out` header the kernel writes at the start of each
/// receive buffer (four `u32`: name, control and payload lengths, flags).
const RECVMSG_OUT_BYTES: usize = 16;

/// Room reserved for the source address in each receive buffer: a `sockaddr_in6` (28
/// bytes) rounded up so the control messages after it stay 8-byte aligned.
const RX_NAME_BYTES: usize = 32;

/// Room reserved for control messages in each receive buffer: as much as the socket
/// datapath's (TOS, TCLASS, `UDP_GRO`, receive timestamp).
const RX_CONTROL_BYTES: usize = udp::RECV_CONTROL_BYTES;

/// Bytes in front of the payload in each receive buffer.
const RX_HEADER_BYTES: usize = RECVMSG_OUT_BYTES + RX_NAME_BYTES + RX_CONTROL_BYTES;

/// Receive buffers are a multiple of this many bytes (a cache line), so every buffer, and
/// the control messages inside it, start aligned.
const RX_BUFFER_ALIGN: usize = 64;

/// Submission queue entries of the receive ring: it only ever holds the multishot receive
/// and the wake-up poll, plus cancellations on drop.
const RX_SQ_ENTRIES: u32 = 8;

/// Buffer group id of the receive buffer ring.
const RX_BGID: u16 = 0;

/// Datagrams handed over by one `recv_with` whose scratch batch has no slots.
const RX_BATCH_DEFAULT: usize = 64;

/// How long dropping the datapath waits for the kernel to confirm that the multishot receive
/// ended, before it leaks the buffer memory rather than free memory the kernel may write.
const RX_CANCEL_NS_MAX: u64 = 1_000_000_000;

/// `user_data` of the multishot receive.
const TAG_RECV: u64 = 1;
/// `user_data` of the wake-up poll on the eventfd.
const TAG_WAKE: u64 = 2;
/// `user_data` of cancellations.
const TAG_CANCEL: u64 = 3;
/// `user_data` of the multishot receive that `bind` uses to probe for kernel support.
const TAG_PROBE: u64 = 4;

/// Send operations in one submission, and so the size of the send ring's queue.
const TX_SQ_ENTRIES: usize = 256;

/// Datagrams prepared for one submission at most (GSO puts several in one operation).
const TX_CHUNK: usize = 256;

/// Control-message space per send: a TOS/TCLASS message and a `UDP_SEGMENT` message, 24
/// bytes each.
const TX_CONTROL_BYTES: usize = 48;

/// A [`Datapath`] over UDP sockets driven through io_uring. See the [module docs](self).
pub struct UringDatapath {
    /// The receive ring, its buffers and its state: used by the thread calling `recv`.
    rx: Mutex<Rx>,
    /// The send ring and its scratch arrays; `None` once the ring failed beyond repair.
    tx: Mutex<Option<Tx>>,
    /// One socket per path; path 0's also receives. Declared after the rings so that they
    /// drop (and stop using these descriptors) first.
    sockets: PathSockets,
    /// Written by `wake`, polled through the receive ring and drained by `recv`.
    wake_fd: EventFd,
    /// Whether runs of equal datagrams go out as one GSO send. Cleared for good when the
    /// kernel or the device turns GSO down.
    gso: AtomicBool,
    /// GSO sends the kernel accepted (each carried two or more datagrams).
    gso_sends: AtomicU64,
    /// Whether the receiving socket has UDP GRO on (the receive buffers are then 64 KiB).
    gro: bool,
    stats: OffloadCounters,
    max_payload: usize,
}

impl core::fmt::Debug for UringDatapath {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UringDatapath")
            .field("addrs", &self.sockets.addrs)
            .field("gso", &self.gso.load(Ordering::Relaxed))
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl UringDatapath {
    /// Opens and binds the sockets and sets up both rings. Fails with
    /// [`io::ErrorKind::InvalidInput`] on the same bad configurations as
    /// [`UdpDatapath::bind`](crate::udp::UdpDatapath::bind), with the OS error if a socket
    /// cannot be created or bound, and with an error whose message starts with
    /// `"io_uring unavailable: "` and names what is missing if the kernel or the process's
    /// policy does not allow this backend (the caller should fall back to UDP sockets).
    pub fn bind(config: UdpConfig) -> io::Result<Self> {
        Self::bind_with_buffers(config, None)
    }

    /// [`bind`](Self::bind) with `rx_buffers` receive buffers (a power of two) instead of the
    /// default pool size, so tests can run the ring dry.
    fn bind_with_buffers(config: UdpConfig, rx_buffers: Option<u16>) -> io::Result<Self> {
        if config.paths == 0 || config.paths > MAX_PATHS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UdpConfig::paths must be in 1..=256",
            ));
        }
        if config.max_payload == 0 || config.max_payload > MAX_DATAGRAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UdpConfig::max_payload must be in 1..=65507",
            ));
        }
        // With GRO a buffer must hold a coalesced run: a smaller one would truncate it.
        let payload_room = if config.gro {
            GRO_BUFFER_BYTES.max(config.max_payload)
        } else {
            config.max_payload
        };
        let buf_size = (RX_HEADER_BYTES + payload_room).next_multiple_of(RX_BUFFER_ALIGN);
        let count = rx_buffers.unwrap_or_else(|| default_buffer_count(buf_size));
        // Rings first: if io_uring is missing, that is the error to report.
        let mut rx = Rx::new(buf_size, count)?;
        rx.probe_multishot(config.local)?;
        let tx = Tx::new()?;

        let sockets = PathSockets::open(config.local, config.paths)?;
        let wake_fd = EventFd::new()?;
        rx.sock_fd = sockets.rx().as_raw_fd();
        rx.wake_fd = wake_fd.as_raw_fd();
        let gso = config.gso && udp::supports_gso(sockets.rx());
        let gro = config.gro && udp::enable_gro(sockets.rx());
        Ok(UringDatapath {
            rx: Mutex::new(rx),
            tx: Mutex::new(Some(tx)),
            sockets,
            wake_fd,
            gso: AtomicBool::new(gso),
            gso_sends: AtomicU64::new(0),
            gro,
            stats: OffloadCounters::default(),
            max_payload: config.max_payload,
        })
    }

    /// The local address path `path` sends from (its source port), or `None` if this
    /// datapath has no such path.
    pub fn path_local_addr(&self, path: u16) -> Option<SocketAddr> {
        self.sockets.local_addr(path)
    }

    /// Whether runs of equal-sized datagrams currently go out as UDP GSO sends.
    pub fn uses_gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Whether the receiving socket has UDP GRO on.
    pub fn uses_gro(&self) -> bool {
        self.gro
    }

    /// Counts of what went through this datapath (messages against datagrams both ways).
    pub fn offload_stats(&self) -> OffloadStats {
        self.stats.get()
    }

    /// Receives up to `limit` datagrams, handing each to `f` as a slice of its receive
    /// buffer; waits up to `timeout` first if nothing is ready.
    fn receive(
        &self,
        limit: usize,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        let mut rx = lock(&self.rx);
        rx.arm()?;
        let spin = timeout == Some(Duration::ZERO);
        if rx.stash.is_none()
            && rx.ring.completion().is_empty()
            && (!spin || rx.kernel_may_hold_completions())
        {
            rx.enters += 1;
            let waited = match timeout {
                None => rx.ring.submit_and_wait(1),
                Some(t) => {
                    let ts = Timespec::from(t);
                    let args = SubmitArgs::new().timespec(&ts);
                    rx.ring.submitter().submit_with_args(1, &args)
                }
            };
            match waited {
                Ok(_) => {}
                // Timed out, interrupted, or completions waiting in the overflow list: take
                // what is there.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
        } else if !rx.ring.submission().is_empty() {
            // Newly armed operations, or a spinning receive that found nothing waiting.
            rx.enters += 1;
            submit_retrying(&rx.ring)?;
        }
        let (messages, datagrams, handed) = rx.reap(limit, f)?;
        self.stats.received(messages, datagrams);
        Ok(handed)
    }

    /// The addresses of this datapath's receive buffer memory (call it outside `recv`:
    /// it takes the receive lock).
    #[cfg(test)]
    fn pool_range(&self) -> std::ops::Range<usize> {
        let rx = lock(&self.rx);
        let base = rx.bufs.data.ptr.as_ptr() as usize;
        base..base + rx.bufs.data.len
    }

    /// How many times the multishot receive was armed (the first time included).
    #[cfg(test)]
    fn arms(&self) -> u64 {
        lock(&self.rx).arms
    }

    /// How many `io_uring_enter` calls `recv` made, and whether the ring can tell deferred
    /// completions without one (TASKRUN_FLAG).
    #[cfg(test)]
    fn receive_enters(&self) -> (u64, bool) {
        let rx = lock(&self.rx);
        (rx.enters, rx.taskrun_flag)
    }
}

impl Datapath for UringDatapath {
    fn kind(&self) -> &'static str {
        "uring"
    }

    fn local_addr(&self) -> SocketAddr {
        self.sockets.addrs[0]
    }

    fn paths(&self) -> u16 {
        self.sockets.paths()
    }

    fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Sends `batch` in order, with the same contract as
    /// [`UdpDatapath`](crate::udp::UdpDatapath)'s `send`: a path at or beyond `paths()`
    /// wraps around; a datagram the kernel refuses on its own account (unreachable or
    /// refusing peer, wrong address family, too large, no buffer) is skipped and counted as
    /// sent; if a socket buffer stays full for about 10 ms the call returns the number sent
    /// so far; other errors end the call with `Ok(sent)` if some datagrams went out, with
    /// the error if none did. Datagrams after the returned count may already have gone out
    /// (sends on other paths are not held back by a full socket), so a retry can
    /// duplicate them; UDP allows that.
    fn send(&self, batch: &[Transmit<'_>]) -> io::Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        let mut guard = lock(&self.tx);
        let Some(tx) = guard.as_mut() else {
            return Err(io::Error::other(
                "io_uring send ring failed earlier and was closed",
            ));
        };
        tx.done.clear();
        tx.done.resize(batch.len(), false);
        let mut sent = 0;
        // Runs starting before this index go out one datagram per send (GSO was refused).
        let mut no_gso_before = 0;
        let mut blocked_since: Option<Instant> = None;
        let mut refusal_retried = false;
        loop {
            while sent < batch.len() && tx.done[sent] {
                sent += 1;
            }
            if sent == batch.len() {
                return Ok(sent);
            }
            let gso = self.gso.load(Ordering::Relaxed);
            let ops = tx.prepare(self, batch, sent, gso, no_gso_before);
            if ops == 0 {
                // Everything prepared was unaddressable and is now marked done.
                continue;
            }
            if let Err(e) = tx.run(ops) {
                // The kernel never read the operations still queued (a failed enter consumes
                // none) and the consumed ones completed inline (MSG_DONTWAIT), so closing
                // the ring leaves nothing that reads `batch`.
                *guard = None;
                return if sent > 0 { Ok(sent) } else { Err(e) };
            }
            let mut blocked_fd = None;
            let mut hard_error = None;
            for op in 0..ops {
                let span = tx.spans[op];
                let result = tx.results[op];
                if result >= 0 {
                    tx.done[span.start..span.start + span.count].fill(true);
                    if span.count > 1 {
                        self.gso_sends.fetch_add(1, Ordering::Relaxed);
                    }
                    self.stats.sent(1, span.count);
                    continue;
                }
                match -result {
                    libc::EAGAIN => {
                        blocked_fd.get_or_insert(span.fd);
                    }
                    libc::EINTR => {}
                    code if span.count > 1 && udp::is_gso_refusal(code) => {
                        // Send this run again one datagram at a time; if the refusal says
                        // GSO cannot work here at all, stop trying it.
                        if udp::is_gso_unsupported(code) {
                            self.gso.store(false, Ordering::Relaxed);
                        }
                        no_gso_before = no_gso_before.max(span.start + span.count);
                    }
                    libc::ECONNREFUSED if !refusal_retried => {
                        // The port-unreachable of an earlier datagram to the peer a socket is
                        // connected to, reported (and cleared) now: send this one again, once
                        // (see `UdpDatapath::send`).
                        refusal_retried = true;
                    }
                    code if udp::is_per_datagram_error(code) => {
                        tx.done[span.start..span.start + span.count].fill(true);
                    }
                    code => {
                        hard_error.get_or_insert(code);
                    }
                }
            }
            if let Some(code) = hard_error {
                while sent < batch.len() && tx.done[sent] {
                    sent += 1;
                }
                return if sent > 0 {
                    Ok(sent)
                } else {
                    Err(io::Error::from_raw_os_error(code))
                };
            }
            if let Some(fd) = blocked_fd {
                // The 10 ms budget covers the whole call, not each stall.
                let since = *blocked_since.get_or_insert_with(Instant::now);
                let waited = since.elapsed();
                let limit = Duration::from_nanos(udp::SEND_BLOCK_NS_MAX);
                if waited >= limit {
                    while sent < batch.len() && tx.done[sent] {
                        sent += 1;
                    }
                    return Ok(sent);
                }
                // EINTR or a timeout lands back here and is handled by the next round.
                sys::wait_writable(fd, limit - waited);
            }
        }
    }

    /// Waits for datagrams or a [`wake`](Datapath::wake), then copies up to
    /// `batch.bufs.len()` datagrams into `batch`. Datagrams longer than their buffer, or
    /// longer than the receive buffers (`max_payload` rounded up, 64 KiB with GRO), are
    /// dropped.
    fn recv(&self, batch: &mut RecvBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.metas.clear();
        let limit = batch.bufs.len();
        self.receive(limit, timeout, &mut |meta, bytes| {
            batch.push(meta, bytes);
        })?;
        Ok(batch.metas.len())
    }

    fn wake(&self) {
        self.wake_fd.signal();
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.offload_stats().counters()
    }

    /// Hands each datagram to `f` straight out of the kernel-filled receive buffer, without
    /// copying, and leaves `scratch` unused except for its slot count, which bounds the
    /// datagrams handed over per call (64 if it has no slots). `f` runs with the receive
    /// side locked: it must not call `recv` on this datapath.
    fn recv_with(
        &self,
        scratch: &mut RecvBatch,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        scratch.metas.clear();
        let limit = if scratch.bufs.is_empty() {
            RX_BATCH_DEFAULT
        } else {
            scratch.bufs.len()
        };
        self.receive(limit, timeout, f)
    }
}

/// Locks `mutex`, ignoring poisoning: a panic inside it (in a caller's `f` mid-batch) can
/// at worst leave some receive buffers never returned to the kernel, which costs capacity,
/// not memory safety.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The receive pool size for buffers of `buf_size` bytes: [`RX_POOL_BYTES`] worth, a power
/// of two within [`RX_BUFFERS_MIN`]`..=`[`RX_BUFFERS_MAX`].
fn default_buffer_count(buf_size: usize) -> u16 {
    let fit = (RX_POOL_BYTES / buf_size).max(1);
    // Largest power of two not above `fit`.
    let pow2 = 1usize << (usize::BITS - 1 - fit.leading_zeros());
    let clamped = pow2.clamp(usize::from(RX_BUFFERS_MIN), usize::from(RX_BUFFERS_MAX));
    u16::try_from(clamped).unwrap_or(RX_BUFFERS_MAX)
}

/// An io::Error saying io_uring cannot be used, and why.
fn unavailable(what: &str, err: &io::Error) -> io::Error {
    io::Error::new(err.kind(), format!("io_uring unavailable: {what}: {err}"))
}

/// `submit` that retries when interrupted or short of kernel memory for a moment.
fn submit_retrying(ring: &IoUring) -> io::Result<usize> {
    loop {
        match ring.submit() {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {
                std::thread::yield_now();
            }
            other => return other,
        }
    }
}

/// An anonymous, private, read-write memory mapping, page-aligned and zero-filled.
struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
    /// Set when the memory must outlive us (the kernel may still write it): never unmapped.
    leaked: bool,
}

// SAFETY: the mapping is plain memory owned by this value; moving that ownership to another
// thread is as safe as moving a Vec.
unsafe impl Send for Mmap {}

impl Mmap {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: an anonymous private mapping with no address hint touches no existing
        // memory; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave 0"))?;
        Ok(Mmap {
            ptr,
            len,
            leaked: false,
        })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        if !self.leaked {
            // SAFETY: `ptr`/`len` are exactly the mapping `new` created, which nothing else
            // unmaps, and no reference into it outlives `self`.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// The provided-buffer ring: `count` entries the kernel takes buffers from, and the buffers.
struct BufRing {
    /// `count` `io_uring_buf` entries shared with the kernel; entry 0's last field is the
    /// tail.
    entries: Mmap,
    /// `count` buffers of `buf_size` bytes; buffer `bid` starts at `bid * buf_size`.
    data: Mmap,
    count: u16,
    buf_size: usize,
    /// Tail as written by us; `publish` makes it visible to the kernel.
    tail: u16,
}

impl BufRing {
    /// Allocates `count` (a power of two) buffers of `buf_size` bytes and fills the ring.
    fn new(count: u16, buf_size: usize) -> io::Result<Self> {
        let entries = Mmap::new(usize::from(count) * mem::size_of::<BufRingEntry>())?;
        let data = Mmap::new(usize::from(count) * buf_size)?;
        let mut ring = BufRing {
            entries,
            data,
            count,
            buf_size,
            tail: 0,
        };
        for bid in 0..count {
            ring.provide(bid);
        }
        ring.publish();
        Ok(ring)
    }

    /// Queues buffer `bid` (which the kernel handed us and we no longer read) for the
    /// kernel; it sees it after the next [`publish`](Self::publish).
    fn provide(&mut self, bid: u16) {
        if bid >= self.count {
            return;
        }
        let index = usize::from(self.tail & (self.count - 1));
        let addr = self.data.ptr.as_ptr() as u64 + (usize::from(bid) * self.buf_size) as u64;
        // SAFETY: `index < count`, so the entry lies inside `entries`, which is aligned for
        // BufRingEntry. The kernel reads only entries between its head and the published
        // tail, and this one is at or past the published tail, so nothing reads it now.
        // The setters leave the `resv` field (entry 0's is the tail) alone.
        let entry = unsafe { &mut *self.entries.ptr.as_ptr().cast::<BufRingEntry>().add(index) };
        entry.set_addr(addr);
        entry.set_len(self.buf_size as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the provided entries visible to the kernel.
    fn publish(&self) {
        // SAFETY: the tail is the u16 `resv` field of entry 0, inside `entries` and 2-byte
        // aligned; the kernel reads it with acquire semantics, so an atomic release store
        // orders the entry writes before it.
        let tail = unsafe {
            &*BufRingEntry::tail(self.entries.ptr.as_ptr().cast::<BufRingEntry>())
                .cast::<AtomicU16>()
        };
        tail.store(self.tail, Ordering::Release);
    }

    /// The first `len` bytes of buffer `bid`, or `None` if out of range.
    ///
    /// Only for a buffer the kernel handed back in a completion and that is not provided
    /// again yet: the kernel writes no other bytes of it meanwhile.
    fn filled(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.count || len > self.buf_size {
            return None;
        }
        // SAFETY: `bid < count` and `len <= buf_size`, so the range lies inside `data`;
        // per this method's contract the kernel wrote these bytes and writes none of them
        // until the buffer is provided again, which needs `&mut self`.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.data.ptr.as_ptr().add(usize::from(bid) * self.buf_size),
                len,
            )
        })
    }
}

/// The `msghdr` the multishot receive is armed with: only `msg_namelen` and
/// `msg_controllen` matter (they size the name and control areas of every buffer).
struct RecvTemplate(Box<libc::msghdr>);

// SAFETY: the msghdr's pointer fields are all null; nothing is shared through them.
unsafe impl Send for RecvTemplate {}

/// The receive side: its ring, buffers and armed operations.
struct Rx {
    /// Declared before `bufs`: the ring (and with it the buffer registration) goes first.
    ring: IoUring,
    bufs: BufRing,
    msg: RecvTemplate,
    sock_fd: RawFd,
    wake_fd: RawFd,
    /// The multishot receive is submitted (or queued) and has not ended.
    recv_armed: bool,
    /// The wake-up poll is submitted (or queued) and has not completed.
    wake_armed: bool,
    /// A data completion taken from the queue but not (fully) handed over because the batch
    /// was full, and the byte offset of its next datagram (GRO runs are handed over in
    /// parts). Its buffer is not given back to the kernel until it is done.
    stash: Option<(cqueue::Entry, usize)>,
    /// How many times the multishot receive was armed.
    arms: u64,
    /// The ring was set up with IORING_SETUP_TASKRUN_FLAG (see `kernel_may_hold_completions`).
    taskrun_flag: bool,
    /// `io_uring_enter` calls made by `receive` (for the zero-timeout test).
    enters: u64,
}

impl Rx {
    /// Sets up the ring and registers `count` buffers of `buf_size` bytes.
    fn new(buf_size: usize, count: u16) -> io::Result<Self> {
        let cq_entries = 2 * u32::from(count) + 2 * RX_SQ_ENTRIES;
        // COOP_TASKRUN (Linux 5.19): the kernel does not interrupt the receiving thread with
        // an IPI for every arriving datagram; the work runs when the thread next enters the
        // kernel or returns to user mode (waiting in `recv` wakes it as before), which saves
        // the receiver an interrupt per datagram (docs/design-notes.md, "COOP_TASKRUN").
        // TASKRUN_FLAG (same kernel) raises IORING_SQ_TASKRUN while such work waits, so a
        // zero-timeout receive can see without a syscall that nothing arrived.
        let (ring, taskrun_flag) = match IoUring::builder()
            .setup_cqsize(cq_entries)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(RX_SQ_ENTRIES)
        {
            Ok(ring) => (ring, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let ring = IoUring::builder()
                    .setup_cqsize(cq_entries)
                    .build(RX_SQ_ENTRIES)
                    .map_err(|e| unavailable("io_uring_setup", &e))?;
                (ring, false)
            }
            Err(e) => return Err(unavailable("io_uring_setup", &e)),
        };
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring unavailable: the kernel lacks IORING_FEAT_EXT_ARG (Linux 5.11), \
                 needed for timed waits",
            ));
        }
        let bufs = BufRing::new(count, buf_size)?;
        // SAFETY: the entries memory holds `count` entries and lives in `bufs`, which is
        // dropped after `ring` (field order, and `Drop for Rx` leaks it if the kernel may
        // still use the buffers), so it outlives the registration.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.entries.ptr.as_ptr() as u64,
                count,
                RX_BGID,
                0,
            )
        }
        .map_err(|e| {
            unavailable(
                "buffer ring registration (IORING_REGISTER_PBUF_RING, Linux 5.19)",
                &e,
            )
        })?;
        let mut msg: Box<libc::msghdr> = Box::new(sys::zeroed());
        msg.msg_namelen = RX_NAME_BYTES as libc::socklen_t;
        msg.msg_controllen = RX_CONTROL_BYTES as _;
        Ok(Rx {
            ring,
            bufs,
            msg: RecvTemplate(msg),
            sock_fd: -1,
            wake_fd: -1,
            recv_armed: false,
            wake_armed: false,
            stash: None,
            arms: 0,
            taskrun_flag,
            enters: 0,
        })
    }

    /// Whether the kernel may hold completions this ring has not seen: work deferred by
    /// COOP_TASKRUN (which only an `io_uring_enter` runs) or an overflowed completion queue.
    /// Without TASKRUN_FLAG the ring cannot tell, so the answer is always yes.
    fn kernel_may_hold_completions(&mut self) -> bool {
        let sq = self.ring.submission();
        !self.taskrun_flag || sq.taskrun() || sq.cq_overflow()
    }

    /// Checks that the kernel takes a multishot RECVMSG (Linux 6.0), by arming one on a
    /// throwaway socket of `local`'s family and cancelling it.
    fn probe_multishot(&mut self, local: SocketAddr) -> io::Result<()> {
        let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?;
        let recv = opcode::RecvMsgMulti::new(Fd(socket.as_raw_fd()), &*self.msg.0, RX_BGID)
            .build()
            .user_data(TAG_PROBE);
        let cancel = opcode::AsyncCancel::new(TAG_PROBE)
            .build()
            .user_data(TAG_CANCEL);
        // SAFETY: the msghdr lives in `self.msg` for the ring's life; the socket outlives
        // the request, which ends (cancelled or refused) before this function returns; if
        // the kernel does not confirm that, the buffers it could write are leaked.
        unsafe { self.ring.submission().push_multiple(&[recv, cancel]) }
            .map_err(|_| io::Error::other("io_uring submission queue full at setup"))?;
        let mut probe_result = None;
        let mut reaped = 0;
        let deadline = Instant::now() + Duration::from_nanos(RX_CANCEL_NS_MAX);
        while reaped < 2 && Instant::now() < deadline {
            let ts = Timespec::from(Duration::from_millis(100));
            let args = SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(2 - reaped, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) => {
                    if probe_result.is_none() {
                        self.leak_buffers();
                    }
                    return Err(unavailable("io_uring_enter", &e));
                }
            }
            for cqe in self.ring.completion() {
                reaped += 1;
                if cqe.user_data() == TAG_PROBE && !cqueue::more(cqe.flags()) {
                    probe_result = Some(cqe.result());
                }
            }
        }
        match probe_result {
            Some(r) if r == -libc::ECANCELED => Ok(()),
            Some(r) if r == -libc::EINVAL => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring unavailable: the kernel lacks multishot IORING_OP_RECVMSG \
                 (Linux 6.0)",
            )),
            Some(r) => Err(unavailable(
                "multishot IORING_OP_RECVMSG probe",
                &io::Error::from_raw_os_error(-r),
            )),
            None => {
                self.leak_buffers();
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "io_uring unavailable: multishot IORING_OP_RECVMSG probe did not complete",
                ))
            }
        }
    }

    /// Keeps the buffer memory mapped for good: a receive the kernel has not confirmed as
    /// ended may still write into it.
    fn leak_buffers(&mut self) {
        self.bufs.data.leaked = true;
        self.bufs.entries.leaked = true;
    }

    /// Queues the multishot receive and the wake-up poll if they are not armed.
    fn arm(&mut self) -> io::Result<()> {
        if !self.recv_armed {
            let entry = opcode::RecvMsgMulti::new(Fd(self.sock_fd), &*self.msg.0, RX_BGID)
                .build()
                .user_data(TAG_RECV);
            // SAFETY: the msghdr lives in `self.msg` as long as the ring; the socket and the
            // buffer group outlive the request (`Drop for Rx` cancels it first).
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring receive submission queue full"))?;
            self.recv_armed = true;
            self.arms += 1;
        }
        if !self.wake_armed {
            let entry = opcode::PollAdd::new(Fd(self.wake_fd), libc::POLLIN as u32)
                .build()
                .user_data(TAG_WAKE);
            // SAFETY: a poll reads no user memory; the eventfd outlives the request.
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring receive submission queue full"))?;
            self.wake_armed = true;
        }
        Ok(())
    }

    /// Takes completions until `limit` datagrams were handed to `f` or none are left,
    /// returns the buffers to the kernel, and re-arms the receive if it ended. Returns the
    /// buffers taken, the datagrams they held, and the datagrams handed over.
    fn reap(
        &mut self,
        limit: usize,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<(usize, usize, usize)> {
        let mut handed = 0;
        let mut messages = 0;
        let mut datagrams = 0;
        let mut woken = false;
        let mut error = None;
        let Rx {
            ring,
            bufs,
            msg,
            recv_armed,
            wake_armed,
            stash,
            ..
        } = &mut *self;
        {
            let mut cq = ring.completion();
            while let Some((cqe, resume)) = stash.take().or_else(|| cq.next().map(|c| (c, 0))) {
                match cqe.user_data() {
                    TAG_RECV => {
                        let flags = cqe.flags();
                        let result = cqe.result();
                        let Some(bid) = cqueue::buffer_select(flags) else {
                            // No data: the receive ended (ENOBUFS when the ring ran dry,
                            // ECANCELED) or failed; it is re-armed below.
                            if !cqueue::more(flags) {
                                *recv_armed = false;
                            }
                            if result < 0 && !is_soft_recv_error(-result) {
                                error.get_or_insert(-result);
                            }
                            continue;
                        };
                        if handed >= limit {
                            *stash = Some((cqe, resume));
                            break;
                        }
                        if !cqueue::more(flags) {
                            *recv_armed = false;
                        }
                        let len = usize::try_from(result).unwrap_or(0);
                        let mut cut_at = None;
                        if let Some((meta, segment, payload)) = bufs
                            .filled(bid, len)
                            .and_then(|filled| parse_datagram(filled, &msg.0))
                        {
                            if resume == 0 {
                                messages += 1;
                                datagrams += sys::segments(payload.len(), segment).count();
                            }
                            for (at, seg_len) in sys::segments(payload.len(), segment) {
                                if at < resume {
                                    continue;
                                }
                                if handed >= limit {
                                    cut_at = Some(at);
                                    break;
                                }
                                if let Some(bytes) = payload.get(at..at + seg_len) {
                                    f(
                                        &RecvMeta {
                                            len: seg_len,
                                            ..meta
                                        },
                                        bytes,
                                    );
                                    handed += 1;
                                }
                            }
                        }
                        if let Some(at) = cut_at {
                            // The rest of this run goes with the next call; the kernel does
                            // not get the buffer back until then.
                            *stash = Some((cqe, at));
                            break;
                        }
                        bufs.provide(bid);
                    }
                    TAG_WAKE => {
                        *wake_armed = false;
                        woken = true;
                    }
                    _ => {}
                }
            }
        }
        bufs.publish();
        if woken {
            sys::drain_eventfd(self.wake_fd);
        }
        if !self.recv_armed {
            // Re-arm now, with the buffers back, so the kernel fills them while the caller
            // works on this batch.
            self.arm()?;
            submit_retrying(&self.ring)?;
        }
        match error {
            Some(code) if handed == 0 => Err(io::Error::from_raw_os_error(code)),
            _ => Ok((messages, datagrams, handed)),
        }
    }
}

impl Drop for Rx {
    /// Cancels the armed operations and waits until the kernel confirms they ended, so that
    /// no receive writes into the buffers after they are freed; if that confirmation does
    /// not come, leaks the buffers instead.
    fn drop(&mut self) {
        let mut cancels = Vec::with_capacity(2);
        if self.recv_armed {
            cancels.push(
                opcode::AsyncCancel::new(TAG_RECV)
                    .build()
                    .user_data(TAG_CANCEL),
            );
        }
        if self.wake_armed {
            cancels.push(
                opcode::AsyncCancel::new(TAG_WAKE)
                    .build()
                    .user_data(TAG_CANCEL),
            );
        }
        if cancels.is_empty() {
            return;
        }
        // SAFETY: cancellations carry no pointers.
        let pushed = unsafe { self.ring.submission().push_multiple(&cancels) }.is_ok();
        let deadline = Instant::now() + Duration::from_nanos(RX_CANCEL_NS_MAX);
        while pushed && (self.recv_armed || self.wake_armed) && Instant::now() < deadline {
            let ts = Timespec::from(Duration::from_millis(50));
            let args = SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(_) => break,
            }
            for cqe in self.ring.completion() {
                match cqe.user_data() {
                    TAG_RECV if !cqueue::more(cqe.flags()) => self.recv_armed = false,
                    TAG_WAKE => self.wake_armed = false,
                    _ => {}
                }
            }
        }
        if self.recv_armed {
            self.leak_buffers();
        }
    }
}

/// Receive errors that end or interrupt the multishot receive without saying anything
/// about the socket: it is re-armed and the call goes on.
fn is_soft_recv_error(code: i32) -> bool {
    matches!(
        code,
        libc::ENOBUFS | libc::ECANCELED | libc::EINTR | libc::EAGAIN
    ) || udp::is_per_datagram_error(code)
}

/// Reads one multishot receive buffer (`filled`, the bytes the kernel wrote) laid out after
/// `template`: the metadata, the GRO segment size (`None`: one datagram) and the payload (a
/// whole coalesced run under GRO), or `None` if the buffer is to be dropped (truncated, or
/// from an unknown address family).
fn parse_datagram<'a>(
    filled: &'a [u8],
    template: &libc::msghdr,
) -> Option<(RecvMeta, Option<usize>, &'a [u8])> {
    let out = RecvMsgOut::parse(filled, template).ok()?;
    if out.is_payload_truncated() || out.is_name_data_truncated() {
        return None;
    }
    let src = sys::decode_addr_bytes(out.name_data())?;
    // The control bytes are parsed by copying, so their alignment inside the buffer does
    // not matter.
    let c = sys::read_control(out.control_data(), out.flags() as libc::c_int);
    let queued_ns = match c.rx_realtime_ns {
        Some(_) => sys::queued_ns(c.rx_realtime_ns, sys::realtime_ns()),
        None => 0,
    };
    // `RecvMsgOut` lends the payload only for its own lifetime; take the same bytes from
    // `filled` instead: they follow the fixed-size header, name and control areas.
    let payload_len = out.payload_data().len();
    let payload = filled.get(RX_HEADER_BYTES..RX_HEADER_BYTES + payload_len)?;
    Some((
        RecvMeta {
            src,
            len: payload.len(),
            ecn: c.ecn,
            queued_ns,
        },
        c.segment,
        payload,
    ))
}

/// The datagrams one send operation carries: `batch[start..start + count]`, on socket `fd`.
#[derive(Copy, Clone, Debug, Default)]
struct Span {
    start: usize,
    count: usize,
    fd: RawFd,
}

/// The send side: its ring and the arrays its operations point into, reused across calls.
struct Tx {
    ring: IoUring,
    hdrs: Vec<libc::msghdr>,
    iovs: Vec<libc::iovec>,
    addrs: Vec<libc::sockaddr_storage>,
    control: Vec<Control<TX_CONTROL_BYTES>>,
    spans: Vec<Span>,
    /// Result of each operation of the last submission.
    results: Vec<i32>,
    /// Per datagram of the current batch: sent, or skipped as lost.
    done: Vec<bool>,
}

// SAFETY: the raw pointers in `hdrs` and `iovs` point into this struct's own arrays or at
// the caller's payloads, are rewritten before every submission, and are read (by the
// kernel) only during a `send` call, which holds the mutex around this struct.
unsafe impl Send for Tx {}

impl Tx {
    fn new() -> io::Result<Self> {
        let ring = IoUring::builder()
            .setup_cqsize(2 * TX_SQ_ENTRIES as u32)
            .build(TX_SQ_ENTRIES as u32)
            .map_err(|e| unavailable("io_uring_setup", &e))?;
        Ok(Tx {
            ring,
            hdrs: vec![sys::zeroed(); TX_SQ_ENTRIES],
            iovs: vec![sys::zeroed(); TX_CHUNK],
            addrs: vec![sys::zeroed(); TX_SQ_ENTRIES],
            control: vec![Control::new(); TX_SQ_ENTRIES],
            spans: vec![Span::default(); TX_SQ_ENTRIES],
            results: vec![0; TX_SQ_ENTRIES],
            done: Vec::new(),
        })
    }

    /// Queues send operations for the datagrams of `batch` from `from` on that are not
    /// done, up to [`TX_CHUNK`] datagrams: runs of consecutive datagrams with equal
    /// destination, path, ECN and length become one GSO send when `gso` is on and the run
    /// starts at or after `no_gso_before`. Datagrams that cannot be addressed from this
    /// socket family are marked done (lost). Returns the number of operations queued.
    fn prepare(
        &mut self,
        dp: &UringDatapath,
        batch: &[Transmit<'_>],
        from: usize,
        gso: bool,
        no_gso_before: usize,
    ) -> usize {
        let mut ops = 0;
        let mut slots = 0;
        let mut i = from;
        while i < batch.len() && slots < TX_CHUNK && ops < TX_SQ_ENTRIES {
            if self.done[i] {
                i += 1;
                continue;
            }
            let t = &batch[i];
            let Some((addr_len, family)) =
                sys::encode_addr(t.dest, dp.sockets.ipv6, &mut self.addrs[ops])
            else {
                self.done[i] = true;
                i += 1;
                continue;
            };
            let socket = dp.sockets.index(t.path);
            let setup = dp.sockets.setup(t.path, t.dest, t.ecn);
            let seg = t.contents.len();
            let mut count = 1;
            if gso && i >= no_gso_before && seg > 0 {
                let max = GSO_SEGMENTS_MAX
                    .min(GSO_BYTES_MAX / seg)
                    .min(TX_CHUNK - slots);
                while count < max {
                    let j = i + count;
                    let Some(u) = batch.get(j) else { break };
                    let len = u.contents.len();
                    if self.done[j]
                        || u.dest != t.dest
                        || dp.sockets.index(u.path) != socket
                        || u.ecn != t.ecn
                        || len == 0
                        || len > seg
                    {
                        break;
                    }
                    count += 1;
                    if len < seg {
                        // The kernel allows a shorter last segment; it ends the run.
                        break;
                    }
                }
            }
            // One iovec per datagram, except that one starting where the previous one ends
            // extends it: the kernel's copy costs per iovec (see `sys::SendMmsg`).
            let mut iovs: usize = 0;
            for u in &batch[i..i + count] {
                if iovs > 0 && sys::is_adjacent(&self.iovs[slots + iovs - 1], u.contents.as_ptr()) {
                    self.iovs[slots + iovs - 1].iov_len += u.contents.len();
                    continue;
                }
                self.iovs[slots + iovs] = libc::iovec {
                    iov_base: u.contents.as_ptr() as *mut libc::c_void,
                    iov_len: u.contents.len(),
                };
                iovs += 1;
            }
            let mut hdr: libc::msghdr = sys::zeroed();
            // To the destination the socket is connected to, no name (see `PathSockets`).
            if setup.connected != Some(t.dest) {
                hdr.msg_name = (&mut self.addrs[ops] as *mut libc::sockaddr_storage).cast();
                hdr.msg_namelen = addr_len;
            }
            hdr.msg_iov = &mut self.iovs[slots];
            hdr.msg_iovlen = iovs as _;
            let tos = (t.ecn != setup.ecn).then_some((family, t.ecn));
            let segment = (count > 1).then_some(seg as u16);
            // TX_CONTROL_BYTES holds both messages, so this is never `None`; without the
            // messages the datagram would still go out, only unmarked and unsegmented.
            let used = self.control[ops].write_send(tos, segment).unwrap_or(0);
            if used > 0 {
                hdr.msg_control = self.control[ops].as_mut_ptr();
                hdr.msg_controllen = used as _;
            }
            self.hdrs[ops] = hdr;
            self.spans[ops] = Span {
                start: i,
                count,
                fd: dp.sockets.socket(t.path).as_raw_fd(),
            };
            let entry = opcode::SendMsg::new(Fd(self.spans[ops].fd), &self.hdrs[ops])
                .flags(libc::MSG_DONTWAIT as u32)
                .build()
                .user_data(ops as u64);
            // SAFETY: the msghdr and the address, iovecs and control bytes it points to live
            // in `self`, and the payloads in `batch`, until `run` has reaped this
            // operation's completion within the same `send` call; MSG_DONTWAIT makes the
            // kernel finish it inline instead of parking it. The queue holds
            // TX_SQ_ENTRIES and is empty at the start of a submission.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                break;
            }
            ops += 1;
            slots += iovs;
            i += count;
        }
        ops
    }

    /// Submits the `ops` queued operations and waits for all their completions, storing
    /// each result in `results`. On an error the ring must not be used again.
    fn run(&mut self, ops: usize) -> io::Result<()> {
        let mut reaped = 0;
        while reaped < ops {
            match self.ring.submit_and_wait(ops - reaped) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
            for cqe in self.ring.completion() {
                if let Some(slot) = self.results.get_mut(cqe.user_data() as usize) {
                    *slot = cqe.result();
                    reaped += 1;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{self, Backend, index_of, numbered, on_path, recv_all, send_all};

    impl Backend for UringDatapath {
        const KIND: &'static str = "uring";
        fn bind(config: UdpConfig) -> io::Result<Self> {
            UringDatapath::bind(config)
        }
        fn source_of(&self, path: u16) -> Option<SocketAddr> {
            self.path_local_addr(path)
        }
        fn stats(&self) -> crate::udp::OffloadStats {
            self.offload_stats()
        }
        fn gso_on(&self) -> bool {
            self.uses_gso()
        }
        fn gro_on(&self) -> bool {
            self.uses_gro()
        }
    }

    conformance::conformance_tests!(UringDatapath);
    use crate::Ecn;
    use crate::udp::UdpDatapath;
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    fn v4_config(paths: u16) -> UdpConfig {
        UdpConfig::new("127.0.0.1:0".parse().unwrap(), paths)
    }

    fn loopback(paths: u16) -> UringDatapath {
        UringDatapath::bind(v4_config(paths)).unwrap()
    }

    /// Without GRO: one buffer of the ring per datagram, `max_payload` sized.
    fn no_gro_config(paths: u16) -> UdpConfig {
        UdpConfig {
            gro: false,
            ..v4_config(paths)
        }
    }

    #[test]
    fn recv_with_lends_payloads_from_the_buffer_ring() {
        let a = loopback(1);
        let b = loopback(1);
        let payloads: Vec<Vec<u8>> = (0..10u32).map(|i| numbered(i, 100 + i as usize)).collect();
        let batch = on_path(b.local_addr(), 0, &payloads);
        send_all(&a, &batch);
        let mut scratch = RecvBatch::new(16, 2048);
        let pool = b.pool_range();
        let mut seen = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.len() < 10 && Instant::now() < deadline {
            let mut lent = true;
            let n = b
                .recv_with(
                    &mut scratch,
                    Some(Duration::from_millis(100)),
                    &mut |meta, bytes| {
                        lent &= pool.contains(&(bytes.as_ptr() as usize))
                            && pool.contains(&(bytes.as_ptr() as usize + bytes.len() - 1));
                        assert_eq!(meta.len, bytes.len());
                        assert_eq!(Some(meta.src), a.path_local_addr(0));
                        let i = index_of(bytes);
                        assert_eq!(bytes, &payloads[i][..]);
                        seen.insert(i);
                    },
                )
                .unwrap();
            assert!(lent, "a payload was not lent from the buffer ring");
            assert!(n <= 16);
            assert!(scratch.metas.is_empty(), "scratch was used");
        }
        assert_eq!(seen.len(), 10);
    }

    #[test]
    fn recv_with_hands_over_at_most_the_scratch_slot_count() {
        let a = loopback(1);
        let b = loopback(1);
        let payloads: Vec<[u8; 4]> = (0..20u32).map(|i| i.to_be_bytes()).collect();
        let batch = on_path(b.local_addr(), 0, &payloads);
        send_all(&a, &batch);
        std::thread::sleep(Duration::from_millis(50));
        let mut scratch = RecvBatch::new(3, 16);
        let mut order = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while order.len() < 20 && Instant::now() < deadline {
            let n = b
                .recv_with(
                    &mut scratch,
                    Some(Duration::from_millis(100)),
                    &mut |_, bytes| order.push(index_of(bytes)),
                )
                .unwrap();
            assert!(n <= 3);
        }
        // One socket, one receive: arrival order is send order, and nothing is lost
        // or repeated across the held-back completions.
        assert_eq!(order, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn uring_and_udp_datapaths_interoperate_both_ways() {
        let uring = loopback(4);
        let udp = UdpDatapath::bind(v4_config(4)).unwrap();
        let payloads: Vec<Vec<u8>> = (0..40u32).map(|i| numbered(i, 300)).collect();
        let ecn_of = |i: usize| {
            if i.is_multiple_of(3) {
                Ecn::Ce
            } else {
                Ecn::Ect0
            }
        };
        for (from, to) in [
            (&uring as &dyn Datapath, &udp as &dyn Datapath),
            (&udp as &dyn Datapath, &uring as &dyn Datapath),
        ] {
            let batch: Vec<Transmit<'_>> = payloads
                .iter()
                .enumerate()
                .map(|(i, p)| Transmit {
                    dest: to.local_addr(),
                    path: (i / 10) as u16,
                    ecn: ecn_of(i),
                    contents: p,
                })
                .collect();
            send_all(from, &batch);
            let got = recv_all(to, batch.len());
            assert_eq!(got.len(), batch.len(), "{} -> {}", from.kind(), to.kind());
            let mut seen = BTreeSet::new();
            for (meta, bytes) in got {
                let i = index_of(&bytes);
                assert_eq!(bytes, payloads[i]);
                assert_eq!(meta.ecn, ecn_of(i));
                assert_eq!(meta.src.ip(), from.local_addr().ip());
                seen.insert((i, meta.src.port()));
            }
            let ports: BTreeSet<u16> = seen.iter().map(|(_, port)| *port).collect();
            assert_eq!(seen.len(), batch.len());
            assert_eq!(ports.len(), 4, "{} -> {}", from.kind(), to.kind());
        }
    }

    /// Sends `total` numbered datagrams from `a` to `b` with at most `window` unreceived
    /// at a time (so a small socket buffer never overflows), receiving with `recv_with`
    /// in the same thread. Returns how many distinct datagrams arrived.
    fn stream(a: &UringDatapath, b: &UringDatapath, total: usize, window: usize) -> usize {
        let payloads: Vec<Vec<u8>> = (0..total as u32).map(|i| numbered(i, 100)).collect();
        let mut seen = vec![false; total];
        let mut received = 0;
        let mut sent = 0;
        let mut scratch = RecvBatch::new(32, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        while received < total && Instant::now() < deadline {
            let room = window.saturating_sub(sent - received).min(64);
            if sent < total && room > 0 {
                let end = (sent + room).min(total);
                let batch: Vec<Transmit<'_>> = payloads[sent..end]
                    .iter()
                    .map(|p| Transmit {
                        dest: b.local_addr(),
                        path: 0,
                        ecn: Ecn::NotEct,
                        contents: p,
                    })
                    .collect();
                sent += a.send(&batch).unwrap();
            }
            b.recv_with(
                &mut scratch,
                Some(Duration::from_millis(20)),
                &mut |_, bytes| {
                    let i = index_of(bytes);
                    assert_eq!(bytes, &payloads[i][..], "datagram {i} damaged");
                    assert!(!seen[i], "datagram {i} delivered twice");
                    seen[i] = true;
                    received += 1;
                },
            )
            .unwrap();
        }
        received
    }

    /// A spinning poller's zero-timeout receive on an idle ring makes no `io_uring_enter`
    /// when the kernel flags deferred completions (TASKRUN_FLAG), and still receives every
    /// datagram that arrives while it spins.
    #[test]
    fn zero_timeout_recv_skips_the_syscall_when_nothing_is_pending() {
        let a = loopback(1);
        let b = UringDatapath::bind(no_gro_config(1)).unwrap();
        let mut batch = RecvBatch::new(8, 2048);
        // The first call arms the multishot receive and the wake-up poll.
        assert_eq!(b.recv(&mut batch, Some(Duration::ZERO)).unwrap(), 0);
        let (armed, taskrun_flag) = b.receive_enters();
        for _ in 0..100 {
            assert_eq!(b.recv(&mut batch, Some(Duration::ZERO)).unwrap(), 0);
        }
        let (idle, _) = b.receive_enters();
        if taskrun_flag {
            assert_eq!(idle, armed, "idle zero-timeout receives entered the kernel");
        } else {
            assert_eq!(
                idle,
                armed + 100,
                "without TASKRUN_FLAG every receive enters"
            );
        }
        let payloads: Vec<[u8; 4]> = (0..20u32).map(|i| i.to_be_bytes()).collect();
        let sends = on_path(b.local_addr(), 0, &payloads);
        send_all(&a, &sends);
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < payloads.len() && std::time::Instant::now() < deadline {
            b.recv(&mut batch, Some(Duration::ZERO)).unwrap();
            got.extend(batch.iter().map(|(_, bytes)| bytes.to_vec()));
        }
        let want: Vec<Vec<u8>> = payloads.iter().map(|p| p.to_vec()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_sustained_stream_outlasts_the_buffer_ring_many_times() {
        let a = loopback(1);
        let b = UringDatapath::bind(no_gro_config(1)).unwrap();
        assert_eq!(lock(&b.rx).bufs.count, RX_BUFFERS_MAX);
        assert_eq!(stream(&a, &b, 20_000, 200), 20_000);
    }

    #[test]
    fn a_ring_run_dry_is_refilled_and_the_receive_rearmed() {
        let a = loopback(1);
        let b = UringDatapath::bind_with_buffers(no_gro_config(1), Some(RX_BUFFERS_MIN)).unwrap();
        assert_eq!(stream(&a, &b, 20_000, 200), 20_000);
        // 32 buffers against 200 in flight: the kernel ran out (ENOBUFS) and the multishot
        // receive had to be armed again.
        assert!(b.arms() > 1, "the receive was never re-armed");
    }

    #[test]
    fn a_receiver_thread_that_exits_leaves_a_working_datapath() {
        // The first thread arms the receive and exits; the kernel then ends it and the next
        // caller re-arms it from its own thread.
        let a = loopback(1);
        let b = Arc::new(loopback(1));
        let first = Arc::clone(&b);
        std::thread::spawn(move || {
            let mut batch = RecvBatch::new(4, 2048);
            first
                .recv(&mut batch, Some(Duration::from_millis(10)))
                .unwrap();
        })
        .join()
        .unwrap();
        send_all(
            &a,
            &[Transmit {
                dest: b.local_addr(),
                path: 0,
                ecn: Ecn::Ect0,
                contents: &[42; 8],
            }],
        );
        let got = recv_all(&*b, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, vec![42; 8]);
        assert_eq!(got[0].0.ecn, Ecn::Ect0);
    }

    #[test]
    fn concurrent_senders_all_get_through() {
        let a = Arc::new(loopback(4));
        let b = loopback(1);
        let dest = b.local_addr();
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let a = Arc::clone(&a);
                std::thread::spawn(move || {
                    for round in 0..5u32 {
                        let payloads: Vec<Vec<u8>> = (0..10)
                            .map(|k| numbered(t * 1000 + round * 10 + k, 64))
                            .collect();
                        let batch: Vec<Transmit<'_>> = payloads
                            .iter()
                            .map(|p| Transmit {
                                dest,
                                path: t as u16,
                                ecn: Ecn::NotEct,
                                contents: p,
                            })
                            .collect();
                        send_all(&*a, &batch);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let got = recv_all(&b, 200);
        let ids: BTreeSet<usize> = got.iter().map(|(_, bytes)| index_of(bytes)).collect();
        assert_eq!(ids.len(), 200);
    }

    #[test]
    fn datagrams_too_long_for_a_buffer_are_dropped() {
        // A UDP peer allowed larger datagrams than this receiver's buffers hold.
        let big_sender = UdpDatapath::bind(UdpConfig {
            max_payload: 8972,
            ..v4_config(1)
        })
        .unwrap();
        let b = loopback(1);
        let huge = [7u8; 4000];
        let mid = [8u8; 200];
        let small = [9u8; 50];
        let batch = [&small[..], &huge[..], &mid[..], &small[..]].map(|contents| Transmit {
            dest: b.local_addr(),
            path: 0,
            ecn: Ecn::NotEct,
            contents,
        });
        send_all(&big_sender, &batch);
        std::thread::sleep(Duration::from_millis(20));
        // The 200-byte one fits the ring's buffers but not the caller's 100-byte slots.
        let mut rb = RecvBatch::new(8, 100);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        while got.len() < 2 && Instant::now() < deadline {
            b.recv(&mut rb, Some(Duration::from_millis(50))).unwrap();
            got.extend(rb.iter().map(|(_, bytes)| bytes.to_vec()));
        }
        assert_eq!(got, vec![small.to_vec(), small.to_vec()]);
        assert_eq!(b.recv(&mut rb, Some(Duration::from_millis(20))).unwrap(), 0);
    }

    #[test]
    fn a_gso_run_arrives_as_separate_datagrams() {
        let a = loopback(1);
        let b = loopback(1);
        if !a.uses_gso() {
            return; // kernel without UDP GSO
        }
        let payloads: Vec<Vec<u8>> = (0..150u32).map(|i| numbered(i, 1200)).collect();
        let batch: Vec<Transmit<'_>> = payloads
            .iter()
            .map(|p| Transmit {
                dest: b.local_addr(),
                path: 0,
                ecn: Ecn::Ect0,
                contents: p,
            })
            .collect();
        assert_eq!(a.send(&batch).unwrap(), batch.len());
        // 150 datagrams of 1200 bytes: runs are capped at 54 (65507 / 1200), so three sends.
        assert_eq!(a.gso_sends.load(Ordering::Relaxed), 3);
        let got = recv_all(&b, 150);
        assert_eq!(got.len(), 150);
        for (meta, bytes) in got {
            assert_eq!(meta.len, 1200);
            assert_eq!(meta.ecn, Ecn::Ect0);
            assert_eq!(bytes, payloads[index_of(&bytes)]);
        }
    }

    #[test]
    fn bad_config_is_rejected() {
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for paths in [0, MAX_PATHS + 1, u16::MAX] {
            let err = UringDatapath::bind(UdpConfig::new(local, paths)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "paths = {paths}");
        }
        for max_payload in [0, MAX_DATAGRAM + 1] {
            let config = UdpConfig {
                max_payload,
                ..UdpConfig::new(local, 1)
            };
            let err = UringDatapath::bind(config).unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidInput,
                "max_payload = {max_payload}"
            );
        }
        let max = loopback(MAX_PATHS);
        assert_eq!(max.paths(), MAX_PATHS);
        // An address this host does not have fails to bind, with the OS error.
        let err =
            UringDatapath::bind(UdpConfig::new("192.0.2.1:0".parse().unwrap(), 1)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable);
    }

    #[test]
    fn buffer_pool_sizes_are_powers_of_two_within_bounds() {
        for max_payload in [1, 1472, 8972, MAX_DATAGRAM] {
            let size = (RX_HEADER_BYTES + max_payload).next_multiple_of(RX_BUFFER_ALIGN);
            let count = default_buffer_count(size);
            assert!(count.is_power_of_two(), "{count}");
            assert!((RX_BUFFERS_MIN..=RX_BUFFERS_MAX).contains(&count));
        }
        assert_eq!(default_buffer_count(1600), RX_BUFFERS_MAX);
    }

    /// Makes `io_uring_setup` fail with EPERM in the calling thread only (seccomp filters
    /// are per thread unless synchronised), as `kernel.io_uring_disabled` or a container
    /// policy would.
    fn forbid_io_uring_in_this_thread() {
        const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
        const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
        let insn = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
        let filter = [
            // A = seccomp_data.nr
            insn(0x20, 0, 0, 0),
            // if A == io_uring_setup then next else skip one
            insn(0x15, 0, 1, libc::SYS_io_uring_setup as u32),
            insn(0x06, 0, 0, SECCOMP_RET_ERRNO | libc::EPERM as u32),
            insn(0x06, 0, 0, SECCOMP_RET_ALLOW),
        ];
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prctl with integer arguments only affects this thread's privileges.
        let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        // SAFETY: `prog` points at `filter`, both live for the call; the kernel copies them.
        let r = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
    }

    #[test]
    fn a_forbidden_io_uring_is_reported_clearly() {
        let err = std::thread::spawn(|| {
            forbid_io_uring_in_this_thread();
            UringDatapath::bind(v4_config(2)).unwrap_err()
        })
        .join()
        .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        let message = err.to_string();
        assert!(
            message.starts_with("io_uring unavailable: io_uring_setup: Operation not permitted"),
            "{message}"
        );
        // The rest of the process is unaffected.
        assert!(UringDatapath::bind(v4_config(1)).is_ok());
    }

    /// Blasts 1400-byte datagrams from `a` to `b` on one path for `secs`, receiving in
    /// another thread; returns (sent/s, received/s).
    fn blast(a: &dyn Datapath, b: Arc<dyn Datapath>, secs: f64) -> (f64, f64) {
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicUsize::new(0));
        let receiver = {
            let (b, stop, received) = (Arc::clone(&b), Arc::clone(&stop), Arc::clone(&received));
            std::thread::spawn(move || {
                let mut scratch = RecvBatch::new(64, 2048);
                while !stop.load(Ordering::Relaxed) {
                    let mut n = 0;
                    b.recv_with(
                        &mut scratch,
                        Some(Duration::from_millis(50)),
                        &mut |_, bytes| n += usize::from(bytes.len() == 1400),
                    )
                    .unwrap();
                    received.fetch_add(n, Ordering::Relaxed);
                }
            })
        };
        let payload = vec![0xabu8; 1400];
        let batch: Vec<Transmit<'_>> = (0..64)
            .map(|_| Transmit {
                dest: b.local_addr(),
                path: 0,
                ecn: Ecn::Ect0,
                contents: &payload,
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        let mut sent = 0;
        while start.elapsed().as_secs_f64() < secs {
            sent += a.send(&batch).unwrap();
        }
        let elapsed = start.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(50));
        let got = received.load(Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        b.wake();
        receiver.join().unwrap();
        (sent as f64 / elapsed, got as f64 / elapsed)
    }

    #[test]
    #[ignore = "measurement: cargo test -p braid-datapath --release measure -- --ignored --nocapture"]
    fn measure_1400_byte_stream_udp_vs_uring() {
        let secs = 2.0;
        for round in 0..2 {
            let udp_a = UdpDatapath::bind(v4_config(1)).unwrap();
            let udp_b: Arc<dyn Datapath> = Arc::new(UdpDatapath::bind(v4_config(1)).unwrap());
            let (s, r) = blast(&udp_a, udp_b, secs);
            println!("round {round} udp   -> udp  : sent {s:>9.0}/s received {r:>9.0}/s");

            let uring_a = loopback(1);
            uring_a.gso.store(false, Ordering::Relaxed);
            let uring_b: Arc<dyn Datapath> = Arc::new(loopback(1));
            let (s, r) = blast(&uring_a, uring_b, secs);
            println!("round {round} uring -> uring (no GSO): sent {s:>9.0}/s received {r:>9.0}/s");

            let uring_a = loopback(1);
            let uring_b: Arc<dyn Datapath> = Arc::new(loopback(1));
            let (s, r) = blast(&uring_a, uring_b, secs);
            println!("round {round} uring -> uring (GSO)   : sent {s:>9.0}/s received {r:>9.0}/s");

            let udp_a = UdpDatapath::bind(v4_config(1)).unwrap();
            let uring_b: Arc<dyn Datapath> = Arc::new(loopback(1));
            let (s, r) = blast(&udp_a, uring_b, secs);
            println!("round {round} udp   -> uring: sent {s:>9.0}/s received {r:>9.0}/s");

            let uring_a = loopback(1);
            uring_a.gso.store(false, Ordering::Relaxed);
            let udp_b: Arc<dyn Datapath> = Arc::new(UdpDatapath::bind(v4_config(1)).unwrap());
            let (s, r) = blast(&uring_a, udp_b, secs);
            println!("round {round} uring -> udp   (no GSO): sent {s:>9.0}/s received {r:>9.0}/s");

            let uring_a = loopback(1);
            let udp_b: Arc<dyn Datapath> = Arc::new(UdpDatapath::bind(v4_config(1)).unwrap());
            let (s, r) = blast(&uring_a, udp_b, secs);
            println!("round {round} uring -> udp   (GSO)   : sent {s:>9.0}/s received {r:>9.0}/s");
        }
    }
}
