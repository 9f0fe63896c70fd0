//! The plain UDP socket backend: no privileges, works on any Linux machine.
//!
//! What it does not do: zero-copy, pacing, or any protocol logic. It moves datagrams.
//!
//! One [`UdpDatapath`] owns `paths` sockets. Path 0 is bound to the configured local address
//! and is the only one read from; paths `1..paths` are bound to the same IP with ephemeral
//! ports and only send, so each path leaves with its own UDP source port (the entropy that
//! ECMP switches hash on). Sends go out with `sendmmsg`, one call per run of consecutive
//! datagrams on the same path; receives use `poll` then `recvmmsg`. ECN is read through
//! `IP_RECVTOS`/`IPV6_RECVTCLASS` and set per datagram with an `IP_TOS`/`IPV6_TCLASS` control
//! message where it differs from the socket's own codepoint.
//!
//! **Cached routes.** Each socket is set up at its first send, from that first datagram: a
//! send-only socket is connected to its destination, and an IPv4 socket takes its ECN
//! codepoint as its own (`IP_TOS`: ECT(0) on a host that sends data, not-ECT on one that
//! only acknowledges). A datagram to that destination with that codepoint then goes out
//! with neither an address nor a control message (but a segment size), and udp_sendmsg
//! takes the route the socket cached instead of looking one up: about a third of a
//! microsecond per send, on each side of a veth round trip. Other destinations and
//! codepoints name theirs, as before. Path 0 is never connected, which would filter what it
//! receives.
//!
//! **Segmentation offload.** With [`UdpConfig::gso`] (the default, where the kernel has UDP
//! GSO, Linux 4.18), each run of consecutive datagrams with the same path, destination, ECN
//! codepoint and length (the last of a run may be shorter) goes out as one message with a
//! `UDP_SEGMENT` control message: the kernel builds one large datagram and cuts it into the
//! separate datagrams only at the device (or leaves that to a NIC with UDP segmentation
//! offload), so a run of up to 64 datagrams costs one trip down the stack. With
//! [`UdpConfig::gro`] (the default, Linux 5.0) the receiving socket has `UDP_GRO` set: the
//! kernel may hand over several datagrams of one flow coalesced in one buffer, with their
//! segment size in a control message; [`Datapath::recv_with`] splits the buffer and hands
//! each datagram on by itself, so callers see separate datagrams either way. Both are probed
//! at bind and fall back to one datagram per system call slot when the kernel lacks them.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::sys::{self, EventFd, LandMmsg, RecvMmsg, SendArrays, SendMmsg};
use crate::{
    Datapath, Ecn, InPlace, LandedPieces, LandingZone, MAX_DATAGRAM, RecvBatch, RecvMeta, Transmit,
};

/// The most paths (sockets, source ports) one datapath opens.
pub const MAX_PATHS: u16 = 256;

/// Default largest payload on IPv4: a 1500-byte MTU minus 20 (IPv4) and 8 (UDP) bytes.
pub const DEFAULT_MAX_PAYLOAD_V4: usize = 1472;

/// Default largest payload on IPv6: a 1500-byte MTU minus 40 (IPv6) and 8 (UDP) bytes.
pub const DEFAULT_MAX_PAYLOAD_V6: usize = 1452;

/// Socket buffer size asked for on every socket (the kernel may grant less).
const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// The shortest payload sent from where it lies ([`Datapath::in_place_min`]).
const IN_PLACE_MIN: usize = 4096;

/// Datagrams handed to one `sendmmsg` call at most.
const SEND_CHUNK: usize = 64;

/// Datagrams taken from one `recvmmsg` call at most.
const RECV_CHUNK: usize = 64;

/// Datagrams one receive in pieces (`recv_landing`) takes at most.
const LAND_CHUNK: usize = 4;

/// How long one `send` call waits in total for room in a full socket buffer.
pub(crate) const SEND_BLOCK_NS_MAX: u64 = 10_000_000;

/// Bytes of control-message space per received datagram (TOS and TCLASS messages, which a
/// dual-stack socket may both get, and a `UDP_GRO` message, 24 bytes each; the receive
/// timestamp, 32).
pub(crate) const RECV_CONTROL_BYTES: usize = 128;

/// Bytes of control-message space per sent message (a TOS or TCLASS message and a
/// `UDP_SEGMENT` message, 24 bytes each).
const SEND_CONTROL_BYTES: usize = 48;

thread_local! {
    /// Each sending thread's `sendmmsg` arrays, lent to every send it makes (zeroing 18 KiB
    /// per call cost more than the engine's work on a small message).
    static SEND_ARRAYS: RefCell<Box<SendArrays<SEND_CHUNK, SEND_CONTROL_BYTES>>> =
        RefCell::new(SendArrays::boxed());
}

/// Most datagrams in one GSO message (the kernel's `UDP_MAX_SEGMENTS` was 64 before Linux
/// 6.9, which raised it to 128).
pub(crate) const GSO_SEGMENTS_MAX: usize = 64;

/// Most payload bytes in one GSO message: all segments must fit one IPv4 datagram's length.
pub(crate) const GSO_BYTES_MAX: usize = MAX_DATAGRAM;

/// Bytes of each receive buffer when GRO is on: a coalesced buffer holds at most 64 KiB.
pub(crate) const GRO_BUFFER_BYTES: usize = 1 << 16;

/// How a [`UdpDatapath`] is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpConfig {
    /// Address of the path-0 socket, the one peers send to. Port 0 picks an ephemeral port;
    /// [`Datapath::local_addr`] then reports the real one.
    pub local: SocketAddr,
    /// Number of paths (sockets with distinct source ports), `1..=`[`MAX_PATHS`].
    pub paths: u16,
    /// Largest UDP payload the user of this datapath should send, `1..=`[`MAX_DATAGRAM`].
    /// Advisory: reported by [`Datapath::max_payload`], not enforced on `send`.
    pub max_payload: usize,
    /// Send runs of equal datagrams (same path, destination, ECN and length) as UDP GSO
    /// messages, where the kernel supports it (probed at bind). Default on; off sends one
    /// datagram per message.
    pub gso: bool,
    /// Let the kernel coalesce received datagrams (UDP GRO), where it supports it (probed at
    /// bind); the datapath splits them again. Default on.
    pub gro: bool,
}

impl UdpConfig {
    /// A config for `paths` paths on `local`, with `max_payload` sized for a 1500-byte MTU
    /// ([`DEFAULT_MAX_PAYLOAD_V4`] or [`DEFAULT_MAX_PAYLOAD_V6`]). On loopback or a
    /// jumbo-frame network set `max_payload` higher (8972 for a 9000-byte MTU, up to
    /// [`MAX_DATAGRAM`] on loopback).
    pub fn new(local: SocketAddr, paths: u16) -> Self {
        let max_payload = match local {
            SocketAddr::V4(_) => DEFAULT_MAX_PAYLOAD_V4,
            SocketAddr::V6(_) => DEFAULT_MAX_PAYLOAD_V6,
        };
        UdpConfig {
            local,
            paths,
            max_payload,
            gso: true,
            gro: true,
        }
    }
}

/// A [`Datapath`] over plain UDP sockets, one per path.
#[derive(Debug)]
pub struct UdpDatapath {
    /// One socket per path; path 0's also receives.
    sockets: PathSockets,
    /// Written by `wake`, polled and drained by `recv`.
    wake_fd: EventFd,
    max_payload: usize,
    /// Whether runs of equal datagrams go out as one GSO message. Cleared for good when the
    /// kernel or the device turns GSO down.
    gso: AtomicBool,
    /// The receive side when `UDP_GRO` is on: coalesced buffers and the datagrams of them
    /// not handed over yet. `None` when GRO is off (datagrams go straight into the caller's
    /// batch).
    gro: Option<Mutex<GroRx>>,
    /// The scratch of receives in pieces (`recv_landing`).
    land: Mutex<Box<LandMmsg<LAND_CHUNK, RECV_CONTROL_BYTES>>>,
    stats: OffloadCounters,
}

impl UdpDatapath {
    /// Opens and binds the sockets. Fails with [`io::ErrorKind::InvalidInput`] if `paths` is
    /// 0 or above [`MAX_PATHS`] or `max_payload` is 0 or above [`MAX_DATAGRAM`], and with the
    /// OS error if a socket cannot be created or bound.
    pub fn bind(config: UdpConfig) -> io::Result<Self> {
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
        let sockets = PathSockets::open(config.local, config.paths)?;
        let wake_fd = EventFd::new()?;
        let gso = config.gso && supports_gso(sockets.rx());
        let gro = (config.gro && enable_gro(sockets.rx())).then(|| Mutex::new(GroRx::new()));
        Ok(UdpDatapath {
            sockets,
            wake_fd,
            max_payload: config.max_payload,
            gso: AtomicBool::new(gso),
            gro,
            land: Mutex::new(Box::new(LandMmsg::new())),
            stats: OffloadCounters::default(),
        })
    }

    /// Whether runs of equal datagrams currently go out as UDP GSO messages.
    pub fn uses_gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Whether the receiving socket has UDP GRO on.
    pub fn uses_gro(&self) -> bool {
        self.gro.is_some()
    }

    /// Counts of what went through this datapath (messages against datagrams both ways).
    pub fn offload_stats(&self) -> OffloadStats {
        self.stats.get()
    }

    /// The local address path `path` sends from (its source port), or `None` if this
    /// datapath has no such path.
    pub fn path_local_addr(&self, path: u16) -> Option<SocketAddr> {
        self.sockets.local_addr(path)
    }

    /// [`Datapath::send_in_place`] (and with no payloads [`Datapath::send`]), queueing in
    /// `arrays`.
    ///
    /// # Safety
    /// `send_in_place`'s contract for `payloads`.
    unsafe fn send_in(
        &self,
        arrays: &mut SendArrays<SEND_CHUNK, SEND_CONTROL_BYTES>,
        batch: &[Transmit<'_>],
        payloads: &[Option<InPlace>],
    ) -> io::Result<usize> {
        let mut scratch = SendMmsg::new(arrays);
        let mut sent = 0;
        // Datagrams before this index go out one per message (GSO was refused for them).
        let mut no_gso_before = 0;
        let mut blocked_since: Option<Instant> = None;
        let mut refusal_retried = false;
        while sent < batch.len() {
            let rest = &batch[sent..];
            let gso = self.gso.load(Ordering::Relaxed) && sent >= no_gso_before;
            // The leading run that shares the first datagram's path and can be addressed
            // from this socket family, at most SEND_CHUNK datagrams, as GSO runs if on.
            scratch.clear();
            let path = rest[0].path;
            let setup = self.sockets.setup(path, rest[0].dest, rest[0].ecn);
            let in_place = payloads.get(sent..).unwrap_or_default();
            // SAFETY: the caller's contract for `payloads`, which holds until this returns,
            // after the last send of `scratch`.
            unsafe { queue_path_run(&mut scratch, rest, in_place, self.sockets.ipv6, gso, setup) };
            if scratch.len() == 0 {
                // The first datagram cannot be addressed from this socket family.
                sent += 1;
                continue;
            }
            let fd = self.sockets.socket(path).as_raw_fd();
            let code = match scratch.send(fd) {
                Ok(r) if r > 0 => {
                    let datagrams = scratch.datagrams_in(r);
                    self.stats.sent(r, datagrams);
                    sent += datagrams;
                    continue;
                }
                Ok(_) => libc::EAGAIN,
                Err(e) => e.raw_os_error().unwrap_or(0),
            };
            let first = scratch.datagrams_in(1);
            match code {
                libc::EINTR => {}
                libc::EAGAIN => {
                    // The 10 ms budget covers the whole call, not each stall.
                    let since = *blocked_since.get_or_insert_with(Instant::now);
                    let waited = since.elapsed();
                    let limit = Duration::from_nanos(SEND_BLOCK_NS_MAX);
                    if waited >= limit {
                        return Ok(sent);
                    }
                    // EINTR or a timeout lands back here and is handled by the next round.
                    sys::wait_writable(fd, limit - waited);
                }
                code if first > 1 && is_gso_refusal(code) => {
                    // Send this run again one datagram per message; if the refusal says GSO
                    // cannot work here at all, stop trying it.
                    if is_gso_unsupported(code) {
                        self.gso.store(false, Ordering::Relaxed);
                    }
                    no_gso_before = sent + first;
                }
                libc::ECONNREFUSED if !refusal_retried => {
                    // A connected socket reports the port-unreachable of an earlier datagram
                    // to its peer at its next send, whatever that one's destination, and the
                    // report clears it: this run was not sent, so send it again (once).
                    refusal_retried = true;
                }
                code if is_per_datagram_error(code) => sent += first,
                _ if sent > 0 => return Ok(sent),
                code => return Err(io::Error::from_raw_os_error(code)),
            }
        }
        Ok(sent)
    }

    /// Receives ready datagrams into `batch` without waiting. Returns how many were kept.
    fn recv_ready(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let fd = self.sockets.rx().as_raw_fd();
        let slots = batch.bufs.len();
        let mut scratch = RecvMmsg::<RECV_CHUNK, RECV_CONTROL_BYTES>::new();
        // Every round either fills slots or finds the socket drained; the extra rounds
        // absorb truncated datagrams and soft errors.
        let rounds_max = slots.div_ceil(RECV_CHUNK) + 4;
        for _ in 0..rounds_max {
            let start = batch.metas.len();
            if start >= slots {
                break;
            }
            let want = (slots - start).min(RECV_CHUNK);
            let n = match scratch.recv(fd, &mut batch.bufs[start..start + want]) {
                Ok(n) => n,
                Err(err) => match err.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::EINTR) => continue,
                    Some(code) if is_per_datagram_error(code) => continue,
                    _ if batch.metas.is_empty() => return Err(err),
                    _ => break,
                },
            };
            for i in 0..n {
                let Some(meta) = scratch.meta(i) else {
                    continue;
                };
                let slot = start + i;
                let kept = batch.metas.len();
                if slot != kept {
                    // Keep payloads aligned with `metas` after a dropped datagram.
                    batch.bufs.swap(slot, kept);
                }
                batch.metas.push(meta);
            }
            if n < want {
                break;
            }
        }
        Ok(batch.metas.len())
    }
}

impl Datapath for UdpDatapath {
    fn kind(&self) -> &'static str {
        "udp"
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

    /// Sends `batch` in order. A path at or beyond `paths()` wraps around (`path % paths`).
    /// A datagram the kernel refuses on its own account (unreachable or refusing peer,
    /// address of the wrong family, too large, no buffer) is skipped and counted as sent:
    /// UDP gives no delivery guarantee anyway. If the socket buffer stays full for about
    /// 10 ms, returns the number sent so far. Other errors end the call: with `Ok(sent)` if
    /// some datagrams went out, with the error if none did.
    fn send(&self, batch: &[Transmit<'_>]) -> io::Result<usize> {
        // SAFETY: no payloads in place.
        SEND_ARRAYS.with_borrow_mut(|arrays| unsafe { self.send_in(arrays, batch, &[]) })
    }

    /// A page: measured with `udp-blast send --in-place`, the iovecs cost the kernel more
    /// than the gather saves in GSO runs of 1472-byte datagrams (two iovecs a datagram),
    /// less with 8972-byte ones (bench/results/session-2026-12-07-s39.md).
    fn in_place_min(&self) -> Option<usize> {
        Some(IN_PLACE_MIN)
    }

    /// [`send`](Datapath::send), each payload in place taking up to three iovecs (the
    /// headers, the payload, the trailer; the headers extend the iovec before them when
    /// they follow it in memory, as full-size datagrams in consecutive slots do).
    unsafe fn send_in_place(
        &self,
        batch: &[Transmit<'_>],
        payloads: &[Option<InPlace>],
    ) -> io::Result<usize> {
        // SAFETY: the caller's contract.
        SEND_ARRAYS.with_borrow_mut(|arrays| unsafe { self.send_in(arrays, batch, payloads) })
    }

    /// Waits for the path-0 socket or a [`wake`](Datapath::wake), then receives up to
    /// `batch.bufs.len()` datagrams. Datagrams longer than their buffer are dropped.
    fn recv(&self, batch: &mut RecvBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.metas.clear();
        if let Some(gro) = &self.gro {
            let limit = batch.bufs.len();
            self.receive_gro(&mut lock(gro), limit, timeout, &mut |meta, bytes| {
                batch.push(meta, bytes);
            })?;
            return Ok(batch.metas.len());
        }
        if !self.wait_readable(timeout)? || batch.bufs.is_empty() {
            return Ok(0);
        }
        let n = self.recv_ready(batch)?;
        self.stats.received(n, n);
        Ok(n)
    }

    /// With GRO on, hands each datagram to `f` straight out of the datapath's coalesced
    /// receive buffers (no copy into `scratch`, whose slot count, 64 if it has none, bounds
    /// the datagrams handed over per call); otherwise receives into `scratch` first, as
    /// [`recv`](Datapath::recv) does. `f` runs with the receive side locked: it must not
    /// call `recv` on this datapath.
    fn recv_with(
        &self,
        scratch: &mut RecvBatch,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        let Some(gro) = &self.gro else {
            let n = self.recv(scratch, timeout)?;
            for (meta, bytes) in scratch.iter().take(n) {
                f(meta, bytes);
            }
            return Ok(n);
        };
        scratch.metas.clear();
        let limit = match scratch.bufs.len() {
            0 => RECV_CHUNK,
            n => n,
        };
        self.receive_gro(&mut lock(gro), limit, timeout, f)
    }

    fn lands(&self) -> bool {
        true
    }

    /// One `recvmmsg` of up to four datagrams, each with three iovecs. Declines (`None`)
    /// while coalesced buffers of an earlier receive still hold datagrams, which go first.
    unsafe fn recv_landing(
        &self,
        zones: &[LandingZone],
        f: &mut dyn FnMut(usize, &LandedPieces<'_>),
    ) -> io::Result<Option<usize>> {
        // Held through the receive: no coalesced buffer is filled meanwhile.
        let gro = self.gro.as_ref().map(lock);
        if gro.as_ref().is_some_and(|g| g.pending()) {
            return Ok(None);
        }
        let mut land = lock(&self.land);
        // SAFETY: the caller's contract (each zone's `dst` writable for its `len` bytes, the
        // zones apart) is `LandMmsg::recv`'s.
        let n = match unsafe { land.recv(self.sockets.rx().as_raw_fd(), zones) } {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(Some(0)),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => return Ok(Some(0)),
            Err(e) => return Err(e),
        };
        let mut datagrams = 0;
        for (i, zone) in zones.iter().enumerate().take(n) {
            if let Some(p) = land.pieces(i, zone) {
                datagrams += sys::segments(p.meta.len, p.segment).count();
                f(i, &p);
            }
        }
        self.stats.received(n, datagrams);
        Ok(Some(n))
    }

    fn wake(&self) {
        self.wake_fd.signal();
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.offload_stats().counters()
    }
}

impl UdpDatapath {
    /// Waits up to `timeout` for the path-0 socket to be readable or a wake-up; drains the
    /// wake-up. Returns whether the socket is readable.
    ///
    /// A zero timeout skips the wait and answers "maybe readable": the caller's
    /// `recvmmsg(MSG_DONTWAIT)` finds out with EAGAIN, one syscall instead of a `ppoll`
    /// followed by `recvmmsg` (a spinning poller calls this in a loop, and the `ppoll` was
    /// about a third of its time). A pending wake-up is then left in the eventfd; the next
    /// waiting call returns at once and drains it, which a wake-up may always cause.
    fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        if timeout == Some(Duration::ZERO) {
            return Ok(true);
        }
        let mut fds = [
            libc::pollfd {
                fd: self.sockets.rx().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake_fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        match sys::poll(&mut fds, timeout) {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(false),
            Err(e) => return Err(e),
        }
        if fds[1].revents != 0 {
            self.wake_fd.drain();
        }
        Ok(fds[0].revents != 0)
    }

    /// The GRO receive: hands `f` up to `limit` datagrams, first those left over from the
    /// last call's coalesced buffers, then, after waiting up to `timeout` if none were left,
    /// those of newly received buffers, each buffer split into its segments. Datagrams
    /// beyond `limit` stay for the next call (which then does not wait).
    fn receive_gro(
        &self,
        rx: &mut GroRx,
        limit: usize,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        let mut handed = rx.hand_out(limit, f);
        if handed > 0 {
            // Do not wait when something was handed over; take more only if ready.
            if handed >= limit {
                return Ok(handed);
            }
        } else if !self.wait_readable(timeout)? {
            return Ok(0);
        }
        let fd = self.sockets.rx().as_raw_fd();
        // Each round refills the buffers once the previous round's datagrams are handed
        // over; stop when the socket is drained or `limit` is reached.
        let rounds_max = limit.div_ceil(RECV_CHUNK) + 4;
        for _ in 0..rounds_max {
            if handed >= limit || rx.pending() {
                break;
            }
            match rx.fill(fd, limit - handed) {
                Ok((messages, datagrams)) => {
                    self.stats.received(messages, datagrams);
                    if messages == 0 {
                        break;
                    }
                }
                Err(err) => match err.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::EINTR) => continue,
                    Some(code) if is_per_datagram_error(code) => continue,
                    _ if handed == 0 => return Err(err),
                    _ => break,
                },
            }
            let filled = rx.received;
            handed += rx.hand_out(limit - handed, f);
            // Fewer than all buffers: the socket is drained, or this call asked for one
            // (the first after finding it empty), and the next call asks for all.
            if filled < RECV_CHUNK {
                break;
            }
        }
        Ok(handed)
    }
}

/// The coalesced-receive state of a datapath with UDP GRO on.
pub(crate) struct GroRx {
    /// Receives into [`RECV_CHUNK`] buffers of [`GRO_BUFFER_BYTES`] of its own, allocated
    /// when the datapath is bound: at the first receive, the allocation (4 MiB, mapped a
    /// page at a time as the kernel writes, but grown into a thread's heap with an
    /// `mprotect` per buffer) fell on the first round trip of a new connection, on both
    /// sides.
    scratch: Box<RecvMmsg<RECV_CHUNK, RECV_CONTROL_BYTES>>,
    /// Per filled buffer: its metadata (`len` is the whole buffer) and GRO segment size.
    metas: Vec<(RecvMeta, Option<usize>)>,
    /// Buffers the last `fill` received (kept or dropped).
    received: usize,
    /// The next datagram to hand over: buffer index into `metas` and byte offset in it.
    next: (usize, usize),
    /// How many buffers the next `fill` asks the kernel for: one after a call that found the
    /// socket empty, else all [`RECV_CHUNK`]. `recvmmsg` goes on to the next buffer after
    /// each datagram until the socket is empty, and that last, failing look is a cost: for a
    /// poller taking one datagram at a time (a round trip's reply) it is paid on every
    /// receive, for a burst (where the call that found one asks for all next) once per call
    /// (measured in bench/results/session-2026-12-07-s33.md).
    ask: usize,
}

impl core::fmt::Debug for GroRx {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GroRx")
            .field("filled", &self.metas.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl GroRx {
    fn new() -> Self {
        let mut scratch = Box::new(RecvMmsg::new());
        scratch.own(RECV_CHUNK, GRO_BUFFER_BYTES);
        GroRx {
            scratch,
            metas: Vec::new(),
            received: 0,
            next: (0, 0),
            ask: RECV_CHUNK,
        }
    }

    /// Whether datagrams of the last fill are still to be handed over.
    fn pending(&self) -> bool {
        self.next.0 < self.metas.len()
    }

    /// `recvmmsg` into the buffers (all handed over before), at most `max` of them (the
    /// datagrams the caller takes now: each buffer holds one or more: what is left
    /// queued stays in the kernel, not in buffers that go cold before it is handed over,
    /// and a receive straight into place can take it):
    /// returns (buffers kept, datagrams in them).
    fn fill(&mut self, fd: RawFd, max: usize) -> io::Result<(usize, usize)> {
        self.metas.clear();
        self.next = (0, 0);
        self.received = 0;
        let got = self.scratch.recv_owned(fd, self.ask.min(max));
        self.ask = match &got {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => 1,
            _ => RECV_CHUNK,
        };
        let n = got?;
        self.received = n;
        let mut datagrams = 0;
        for i in 0..n {
            let Some((meta, segment)) = self.scratch.meta_gro(i) else {
                // Truncated or of an unknown family: dropped; keep buffers aligned.
                self.metas.push((
                    RecvMeta {
                        src: SocketAddr::from(([0, 0, 0, 0], 0)),
                        len: 0,
                        ecn: Ecn::NotEct,
                        queued_ns: 0,
                    },
                    Some(0),
                ));
                continue;
            };
            datagrams += sys::segments(meta.len, segment).count();
            self.metas.push((meta, segment));
        }
        Ok((n, datagrams))
    }

    /// Hands up to `limit` of the received datagrams to `f`, each a segment of its buffer
    /// with the buffer's source and ECN. Returns how many.
    fn hand_out(&mut self, limit: usize, f: &mut dyn FnMut(&RecvMeta, &[u8])) -> usize {
        let mut handed = 0;
        while handed < limit {
            let (index, offset) = self.next;
            let Some(&(meta, segment)) = self.metas.get(index) else {
                break;
            };
            // A dropped slot (marked with segment size 0) holds nothing.
            if segment == Some(0) {
                self.next = (index + 1, 0);
                continue;
            }
            let step = segment.filter(|&s| s < meta.len).unwrap_or(meta.len);
            let len = step.min(meta.len - offset.min(meta.len));
            if let Some(bytes) = self
                .scratch
                .owned(index)
                .and_then(|b| b.get(offset..offset + len))
            {
                f(&RecvMeta { len, ..meta }, bytes);
                handed += 1;
            }
            let end = offset + len.max(1);
            self.next = if end >= meta.len {
                (index + 1, 0)
            } else {
                (index, end)
            };
        }
        handed
    }
}

/// Message and datagram counts of a socket datapath: what segmentation offload saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Messages handed to the kernel by `send` (one per datagram, or one per GSO run).
    pub messages_sent: u64,
    /// Datagrams those messages carried.
    pub datagrams_sent: u64,
    /// Buffers taken from the kernel by `recv` (one per datagram, or one per GRO batch).
    pub messages_received: u64,
    /// Datagrams those buffers held.
    pub datagrams_received: u64,
}

impl OffloadStats {
    /// These counts by name, as [`Datapath::counters`] gives them.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("messages_sent", self.messages_sent),
            ("datagrams_sent", self.datagrams_sent),
            ("messages_received", self.messages_received),
            ("datagrams_received", self.datagrams_received),
        ]
    }
}

/// The atomic counters behind [`OffloadStats`].
#[derive(Debug, Default)]
pub(crate) struct OffloadCounters {
    messages_sent: AtomicU64,
    datagrams_sent: AtomicU64,
    messages_received: AtomicU64,
    datagrams_received: AtomicU64,
}

impl OffloadCounters {
    pub(crate) fn sent(&self, messages: usize, datagrams: usize) {
        self.messages_sent
            .fetch_add(messages as u64, Ordering::Relaxed);
        self.datagrams_sent
            .fetch_add(datagrams as u64, Ordering::Relaxed);
    }

    pub(crate) fn received(&self, messages: usize, datagrams: usize) {
        self.messages_received
            .fetch_add(messages as u64, Ordering::Relaxed);
        self.datagrams_received
            .fetch_add(datagrams as u64, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> OffloadStats {
        OffloadStats {
            messages_sent: self.messages_sent.load(Ordering::Relaxed),
            datagrams_sent: self.datagrams_sent.load(Ordering::Relaxed),
            messages_received: self.messages_received.load(Ordering::Relaxed),
            datagrams_received: self.datagrams_received.load(Ordering::Relaxed),
        }
    }
}

/// Queues into `scratch` the leading datagrams of `rest` that share the first one's path
/// (stopping at one that cannot be addressed from this socket family, or when the scratch is
/// full). With `gso`, each run of consecutive datagrams with the same destination, ECN and
/// length (the last may be shorter, none empty) becomes one message of up to
/// [`GSO_SEGMENTS_MAX`] segments and [`GSO_BYTES_MAX`] bytes. A datagram with a payload in
/// place (`in_place[i]`, aligned with `rest`) takes up to three iovecs instead of one.
///
/// # Safety
/// [`Datapath::send_in_place`]'s contract for `in_place`, until the last send of `scratch`.
unsafe fn queue_path_run<'a, const C: usize, const CTRL: usize>(
    scratch: &mut SendMmsg<'a, C, CTRL>,
    rest: &[Transmit<'a>],
    in_place: &[Option<InPlace>],
    ipv6: bool,
    gso: bool,
    socket: SocketSetup,
) {
    let Some(path) = rest.first().map(|t| t.path) else {
        return;
    };
    let payload = |i: usize| in_place.get(i).copied().flatten();
    let mut i = 0;
    while let Some(t) = rest.get(i) {
        let to_connected = socket.connected == Some(t.dest);
        // SAFETY: the caller's contract for `in_place`.
        let queued = t.path == path
            && unsafe {
                scratch.push_in_place(
                    t.dest,
                    ipv6,
                    t.contents,
                    payload(i),
                    t.ecn,
                    socket.ecn,
                    to_connected,
                )
            };
        if !queued {
            return;
        }
        i += 1;
        let seg = t.contents.len();
        if !gso || seg == 0 {
            continue;
        }
        let max = GSO_SEGMENTS_MAX.min(GSO_BYTES_MAX / seg);
        let mut count = 1;
        while count < max {
            let Some(u) = rest.get(i) else { break };
            let len = u.contents.len();
            // SAFETY: the caller's contract for `in_place`.
            let mut added = || unsafe { scratch.add_segment_in_place(u.contents, payload(i)) };
            if u.path != path
                || u.dest != t.dest
                || u.ecn != t.ecn
                || len == 0
                || len > seg
                || !added()
            {
                break;
            }
            i += 1;
            count += 1;
            if len < seg {
                // A shorter segment ends the run.
                break;
            }
        }
    }
}

/// The sockets of a socket datapath, one per path: path 0's bound to the configured address
/// (the one that receives), the others to the same IP with ephemeral ports, each set up at
/// its first send (see the module documentation).
#[derive(Debug)]
pub(crate) struct PathSockets {
    /// Never empty.
    sockets: Vec<Socket>,
    /// Where each socket is bound, same indexing.
    pub(crate) addrs: Vec<SocketAddr>,
    setup: Vec<OnceLock<SocketSetup>>,
    /// Whether the sockets are IPv6 (possibly dual-stack) sockets.
    pub(crate) ipv6: bool,
}

impl PathSockets {
    /// Opens and binds `paths` (1..=[`MAX_PATHS`]) sockets on `local`.
    pub(crate) fn open(local: SocketAddr, paths: u16) -> io::Result<PathSockets> {
        let mut sockets = Vec::with_capacity(usize::from(paths));
        let mut addrs = Vec::with_capacity(usize::from(paths));
        for path in 0..paths.max(1) {
            let bind_to = if path == 0 {
                local
            } else {
                SocketAddr::new(local.ip(), 0)
            };
            let socket = open_socket(bind_to, path == 0)?;
            let bound = socket
                .local_addr()?
                .as_socket()
                .ok_or_else(|| io::Error::other("bound socket has no IP address"))?;
            sockets.push(socket);
            addrs.push(bound);
        }
        Ok(PathSockets {
            setup: (0..sockets.len()).map(|_| OnceLock::new()).collect(),
            sockets,
            addrs,
            ipv6: local.is_ipv6(),
        })
    }

    /// Number of paths.
    pub(crate) fn paths(&self) -> u16 {
        // `open` opens 1..=MAX_PATHS sockets.
        u16::try_from(self.sockets.len()).unwrap_or(MAX_PATHS)
    }

    /// The socket that receives (path 0's).
    pub(crate) fn rx(&self) -> &Socket {
        &self.sockets[0]
    }

    /// The index of `path`'s socket: out-of-range paths wrap around (`path % paths`).
    pub(crate) fn index(&self, path: u16) -> usize {
        usize::from(path) % self.sockets.len()
    }

    /// `path`'s socket.
    pub(crate) fn socket(&self, path: u16) -> &Socket {
        &self.sockets[self.index(path)]
    }

    /// The local address path `path` sends from, if there is such a path.
    pub(crate) fn local_addr(&self, path: u16) -> Option<SocketAddr> {
        self.addrs.get(usize::from(path)).copied()
    }

    /// How `path`'s socket is set up; the first call sets it up for a datagram to `dest`
    /// marked `ecn` (once: a socket that later sends elsewhere or otherwise marked names
    /// those in each message).
    pub(crate) fn setup(&self, path: u16, dest: SocketAddr, ecn: Ecn) -> SocketSetup {
        let i = self.index(path);
        *self.setup[i].get_or_init(|| {
            let socket = &self.sockets[i];
            let same_family = dest.is_ipv6() == self.ipv6;
            let connected =
                (i > 0 && same_family && socket.connect(&dest.into()).is_ok()).then_some(dest);
            let tos = libc::c_int::from(ecn.to_bits());
            let own_ecn = !self.ipv6
                && sys::set_int_option(socket.as_raw_fd(), libc::IPPROTO_IP, libc::IP_TOS, tos)
                    .is_ok();
            SocketSetup {
                ecn: if own_ecn { ecn } else { Ecn::NotEct },
                connected,
            }
        })
    }
}

/// What a socket was set up with at its first send (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketSetup {
    /// The codepoint its datagrams carry when a send names none.
    pub(crate) ecn: Ecn,
    /// The destination it is connected to (`None`: path 0, a destination of the other
    /// family, or a failed connect).
    pub(crate) connected: Option<SocketAddr>,
}

/// Locks `mutex`, ignoring poisoning: a panic in a caller's `f` mid-batch leaves at worst
/// some received datagrams not handed over.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the kernel knows UDP GSO (Linux 4.18): it answers `getsockopt(UDP_SEGMENT)`.
pub(crate) fn supports_gso(socket: &Socket) -> bool {
    sys::int_option(socket.as_raw_fd(), libc::SOL_UDP, libc::UDP_SEGMENT).is_ok()
}

/// Turns UDP GRO on for `socket` (Linux 5.0); `false` if the kernel refuses.
pub(crate) fn enable_gro(socket: &Socket) -> bool {
    sys::set_int_option(socket.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
}

/// Errors with which the kernel turns down a GSO message as such (not its destination):
/// segment size above the route MTU, too many segments, no checksum offload, no support.
pub(crate) fn is_gso_refusal(code: i32) -> bool {
    matches!(
        code,
        libc::EINVAL | libc::EMSGSIZE | libc::EIO | libc::EOPNOTSUPP | libc::ENOPROTOOPT
    )
}

/// GSO refusals that say it cannot work on this socket or device at all.
pub(crate) fn is_gso_unsupported(code: i32) -> bool {
    matches!(code, libc::EIO | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
}

/// Creates one nonblocking UDP socket bound to `addr`; `rx` enables ECN reception.
pub(crate) fn open_socket(addr: SocketAddr, rx: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    grow_buffer(&socket, libc::SO_SNDBUF, libc::SO_SNDBUFFORCE);
    if rx {
        grow_buffer(&socket, libc::SO_RCVBUF, libc::SO_RCVBUFFORCE);
        if addr.is_ipv6() {
            socket.set_recv_tclass_v6(true)?;
            // IPv4 peers of a dual-stack socket report their TOS through IP_RECVTOS;
            // a v6-only socket may refuse it, which is harmless.
            let _ = socket.set_recv_tos(true);
        } else {
            socket.set_recv_tos(true)?;
        }
        // The kernel's receive time of each datagram, so the engine can tell the time a
        // datagram waited for this host from the network's (`RecvMeta::queued_ns`). Without
        // it the wait stays in the delay samples, as before.
        let _ = sys::enable_rx_timestamps(socket.as_raw_fd());
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Asks for [`SOCKET_BUFFER_BYTES`] of socket buffer, first within the sysctl limit, then
/// past it (needs CAP_NET_ADMIN). Failures leave the default: a smaller buffer only costs
/// drops under bursts.
fn grow_buffer(socket: &Socket, opt: libc::c_int, force_opt: libc::c_int) {
    let value = SOCKET_BUFFER_BYTES as libc::c_int;
    for name in [opt, force_opt] {
        let _ = sys::set_int_option(socket.as_raw_fd(), libc::SOL_SOCKET, name, value);
        if current_buffer(socket.as_raw_fd(), opt) >= SOCKET_BUFFER_BYTES {
            return;
        }
    }
}

/// The socket buffer size the kernel granted for `opt` (it reports double the request).
fn current_buffer(fd: RawFd, opt: libc::c_int) -> usize {
    sys::int_option(fd, libc::SOL_SOCKET, opt)
        .ok()
        .and_then(|v| usize::try_from(v).ok())
        .unwrap_or(0)
}

/// Errors that concern one datagram (its destination, size or a transient local shortage)
/// rather than the socket: the datagram is skipped, as if lost on the wire.
pub(crate) fn is_per_datagram_error(code: i32) -> bool {
    matches!(
        code,
        libc::ECONNREFUSED
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::EHOSTDOWN
            | libc::ENETDOWN
            | libc::EPERM
            | libc::EACCES
            | libc::EMSGSIZE
            | libc::EADDRNOTAVAIL
            | libc::EAFNOSUPPORT
            | libc::EINVAL
            | libc::ENOBUFS
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ecn;
    use crate::conformance::{self, Backend, on_path, recv_all, send_all};

    impl Backend for UdpDatapath {
        const KIND: &'static str = "udp";
        fn bind(config: UdpConfig) -> io::Result<Self> {
            UdpDatapath::bind(config)
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

    conformance::conformance_tests!(UdpDatapath);
    use std::collections::BTreeSet;

    fn loopback(paths: u16) -> UdpDatapath {
        UdpDatapath::bind(UdpConfig::new("127.0.0.1:0".parse().unwrap(), paths)).unwrap()
    }

    #[test]
    fn dual_stack_sockets_talk_to_ipv4_with_ecn() {
        let Ok(v6) = UdpDatapath::bind(UdpConfig::new("[::]:0".parse().unwrap(), 2)) else {
            return; // no IPv6 on this machine
        };
        let v4 = loopback(2);
        let v6_at: SocketAddr =
            SocketAddr::new("127.0.0.1".parse().unwrap(), v6.local_addr().port());
        // IPv6 socket to an IPv4 peer: v4-mapped destination, TOS set with IP_TOS.
        send_all(
            &v6,
            &[Transmit {
                dest: v4.local_addr(),
                path: 1,
                ecn: Ecn::Ce,
                contents: &[1],
            }],
        );
        let got = recv_all(&v4, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.ecn, Ecn::Ce);
        assert_eq!(got[0].0.src.port(), v6.path_local_addr(1).unwrap().port());
        // IPv4 peer to an IPv6 socket: the source comes back as plain IPv4.
        send_all(
            &v4,
            &[Transmit {
                dest: v6_at,
                path: 1,
                ecn: Ecn::Ect0,
                contents: &[2],
            }],
        );
        let got = recv_all(&v6, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.ecn, Ecn::Ect0);
        assert_eq!(Some(got[0].0.src), v4.path_local_addr(1));
    }

    /// A send-only path socket is set up at its first send: connected to that destination,
    /// marking that datagram's codepoint by default; path 0 is never connected. (What that
    /// does to traffic is `conformance::a_gone_peer_costs_no_other_peer_a_datagram`.)
    #[test]
    fn a_path_socket_is_set_up_for_its_first_datagram() {
        let a = loopback(2);
        let b = loopback(1);
        send_all(&a, &on_path(b.local_addr(), 1, &[[0u8; 4]]));
        let setup = |path| {
            a.sockets
                .setup(path, "127.0.0.1:9".parse().unwrap(), Ecn::Ect0)
        };
        assert_eq!(
            setup(1),
            SocketSetup {
                ecn: Ecn::NotEct,
                connected: Some(b.local_addr()),
            }
        );
        assert_eq!(setup(0).connected, None);
        assert_eq!(setup(0).ecn, Ecn::Ect0);
    }

    #[test]
    fn a_large_mixed_batch_goes_out_in_one_call() {
        let a = loopback(4);
        let b = loopback(1);
        // Small enough to fit a default-sized receive buffer, large enough for 5 sendmmsg
        // chunks.
        let payloads: Vec<[u8; 4]> = (0..300u32).map(|i| i.to_be_bytes()).collect();
        let batch: Vec<Transmit<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| Transmit {
                dest: b.local_addr(),
                path: ((i / 50) % 4) as u16,
                ecn: if i % 2 == 0 { Ecn::Ect0 } else { Ecn::NotEct },
                contents: p,
            })
            .collect();
        assert_eq!(a.send(&batch).unwrap(), batch.len());
        let got = recv_all(&b, batch.len());
        assert_eq!(got.len(), batch.len());
        let mut seen = BTreeSet::new();
        for (meta, bytes) in got {
            let i = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
            assert_eq!(meta.ecn, batch[i].ecn);
            assert_eq!(Some(meta.src), a.path_local_addr(batch[i].path));
            seen.insert(i);
        }
        assert_eq!(seen.len(), batch.len());
    }

    /// A GSO run whose datagrams lie back to back in one buffer (one iovec for the run)
    /// arrives as those datagrams, byte for byte, as does a run spread over buffers apart.
    #[test]
    fn a_run_back_to_back_in_memory_arrives_datagram_by_datagram() {
        let a = loopback(2);
        let b = loopback(1);
        let one: Vec<u8> = (0..1200u32).map(|i| (i % 251) as u8).collect();
        let apart: Vec<Vec<u8>> = (0..3).map(|k| vec![0xA0 + k as u8; 400]).collect();
        let mut batch: Vec<Transmit<'_>> = one
            .chunks(400)
            .map(|c| Transmit {
                dest: b.local_addr(),
                path: 1,
                ecn: Ecn::Ect0,
                contents: c,
            })
            .collect();
        batch.extend(apart.iter().map(|c| Transmit {
            dest: b.local_addr(),
            path: 0,
            ecn: Ecn::Ect0,
            contents: c,
        }));
        assert_eq!(a.send(&batch).unwrap(), batch.len());
        let got: BTreeSet<Vec<u8>> = recv_all(&b, batch.len())
            .into_iter()
            .map(|(_, bytes)| bytes)
            .collect();
        let want: BTreeSet<Vec<u8>> = batch.iter().map(|t| t.contents.to_vec()).collect();
        assert_eq!(got, want);
        if a.uses_gso() {
            // Each run of three (one per path) went out as one message.
            assert_eq!(a.offload_stats().messages_sent, 2);
        }
    }

    /// Datagrams whose payloads lie elsewhere (`send_in_place`) arrive as their headers, those
    /// payloads and their trailers, byte for byte: a GSO run of them from consecutive slots
    /// of one buffer (as the runtime's transmit batches lay them out), ended by a shorter
    /// datagram sent whole, then one more sent whole.
    #[test]
    fn payloads_sent_in_place_arrive_between_their_headers_and_trailers() {
        const LEN: usize = 5000;
        const AT: usize = 40;
        const PAYLOAD: usize = LEN - AT - 4;
        let a = loopback(1);
        let mut config = UdpConfig::new("127.0.0.1:0".parse().unwrap(), 1);
        config.max_payload = MAX_DATAGRAM;
        let b = UdpDatapath::bind(config).unwrap();
        let payloads: Vec<u8> = (0..3 * PAYLOAD as u32)
            .map(|i| (i * 7 % 253) as u8)
            .collect();
        // Three slots back to back; the buffer's payload bytes are not the payloads and must
        // not be sent.
        let mut slots = vec![0xEE; 3 * LEN];
        for (k, slot) in slots.chunks_mut(LEN).enumerate() {
            slot[..AT].fill(0x10 + k as u8);
            slot[AT + PAYLOAD..].fill(0x20 + k as u8);
        }
        let whole: Vec<Vec<u8>> = (0..2).map(|k| vec![0x30 + k as u8; 300]).collect();
        let to = |contents| Transmit {
            dest: b.local_addr(),
            path: 0,
            ecn: Ecn::Ect0,
            contents,
        };
        let mut batch: Vec<Transmit<'_>> = slots.chunks(LEN).map(to).collect();
        batch.extend(whole.iter().map(|c| to(c)));
        let in_place: Vec<Option<InPlace>> = (0..3)
            .map(|k| {
                Some(InPlace {
                    at: AT,
                    src: payloads[k * PAYLOAD..].as_ptr(),
                    len: PAYLOAD,
                })
            })
            .collect();
        assert_eq!(a.in_place_min(), Some(IN_PLACE_MIN));
        // SAFETY: `payloads` outlives the call; each payload ends before its datagram's
        // 4-byte trailer.
        let n = unsafe { a.send_in_place(&batch, &in_place) }.unwrap();
        assert_eq!(n, batch.len());
        let mut want: BTreeSet<Vec<u8>> = whole.iter().cloned().collect();
        for (k, slot) in slots.chunks(LEN).enumerate() {
            let mut sent = slot.to_vec();
            sent[AT..AT + PAYLOAD].copy_from_slice(&payloads[k * PAYLOAD..(k + 1) * PAYLOAD]);
            want.insert(sent);
        }
        let mut rx = RecvBatch::new(8, MAX_DATAGRAM);
        let mut got = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < want.len() && Instant::now() < deadline {
            b.recv(&mut rx, Some(Duration::from_millis(100))).unwrap();
            got.extend(rx.iter().map(|(_, bytes)| bytes.to_vec()));
        }
        assert!(
            got == want,
            "{} datagrams; as sent: {}",
            got.len(),
            got == want
        );
        if a.uses_gso() {
            // The three in place and the first short one, then the other.
            assert_eq!(a.offload_stats().messages_sent, 2);
        }
    }

    /// A receive in pieces cuts each datagram over its zone: the head into the datapath's
    /// buffer, the payload straight into the caller's memory, the rest into the tail; one
    /// of other lengths is cut the same way (the caller puts it back together); an empty
    /// socket gives `Some(0)`; coalesced buffers still to hand over make it decline.
    #[test]
    fn a_receive_in_pieces_lands_each_payload_in_place() {
        for gro in [false, true] {
            let a = loopback(1);
            let b = UdpDatapath::bind(UdpConfig {
                gro,
                ..UdpConfig::new("127.0.0.1:0".parse().unwrap(), 1)
            })
            .unwrap();
            let mut dst = vec![0u8; 3 * 40_000];
            let zones: Vec<LandingZone> = (0..3)
                .map(|i| LandingZone {
                    head: 40,
                    // SAFETY: inside `dst` (3 zones of 40,000 bytes).
                    dst: unsafe { dst.as_mut_ptr().add(i * 40_000) },
                    len: 40_000,
                })
                .collect();
            let mut calls = 0;
            // SAFETY: each zone is 40,000 bytes of `dst`, apart, alive through the call.
            let none = unsafe { b.recv_landing(&zones, &mut |_, _| calls += 1) };
            assert_eq!(
                (none.unwrap(), calls),
                (Some(0), 0),
                "gro {gro}: empty socket"
            );
            let fits: Vec<u8> = (0..40_044u32).map(|i| (i * 13) as u8).collect();
            let short: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
            send_all(&a, &on_path(b.local_addr(), 0, &[&fits[..], &short[..]]));
            std::thread::sleep(Duration::from_millis(50));
            let mut got = Vec::new();
            // SAFETY: as above.
            let n = unsafe {
                b.recv_landing(&zones, &mut |i, p| {
                    got.push((i, p.meta.len, p.head.to_vec(), p.landed, p.tail.to_vec()));
                })
            };
            assert_eq!(n.unwrap(), Some(2), "gro {gro}");
            assert_eq!(got[0].0, 0);
            assert_eq!((got[0].1, got[0].3), (40_044, 40_000));
            assert_eq!(got[0].2, fits[..40]);
            assert_eq!(got[0].4, fits[40_040..]);
            assert_eq!(dst[..40_000], fits[40..40_040]);
            assert_eq!((got[1].0, got[1].1, got[1].3), (1, 1000, 960));
            assert_eq!(got[1].2, short[..40]);
            assert!(got[1].4.is_empty());
            assert_eq!(dst[40_000..40_960], short[40..]);
            assert!(
                dst[40_960..].iter().all(|&x| x == 0),
                "nothing past what arrived"
            );
        }
        // With GRO, small datagrams coalesce into buffers; while one is half handed over,
        // the receive in pieces declines.
        let a = loopback(1);
        let b = loopback(1);
        let small = [[1u8; 100], [2u8; 100], [3u8; 100]];
        send_all(&a, &on_path(b.local_addr(), 0, &small));
        std::thread::sleep(Duration::from_millis(50));
        let mut batch = RecvBatch::new(1, 2048);
        let mut first = 0;
        b.recv_with(&mut batch, Some(Duration::ZERO), &mut |_, _| first += 1)
            .unwrap();
        let mut dst = [0u8; 64];
        let zone = [LandingZone {
            head: 8,
            dst: dst.as_mut_ptr(),
            len: dst.len(),
        }];
        assert!(a.uses_gso() && b.uses_gro(), "loopback has UDP GSO and GRO");
        assert_eq!(first, 1);
        assert!(b.gro.as_ref().is_some_and(|g| lock(g).pending()));
        // SAFETY: `dst` is 64 bytes, alive through the call.
        let r = unsafe { b.recv_landing(&zone, &mut |_, _| {}) }.unwrap();
        assert_eq!(r, None, "declines while coalesced datagrams wait");
        b.recv_with(&mut batch, Some(Duration::ZERO), &mut |_, _| first += 1)
            .unwrap();
        b.recv_with(&mut batch, Some(Duration::ZERO), &mut |_, _| first += 1)
            .unwrap();
        assert_eq!(first, 3);
        // SAFETY: as above.
        let r = unsafe { b.recv_landing(&zone, &mut |_, _| {}) }.unwrap();
        assert_eq!(r, Some(0), "then receives again");
    }

    /// A spinning poller's zero-timeout receive skips the readiness wait: it still returns 0
    /// on an empty socket, finds every datagram that arrived (GRO on and off), and leaves a
    /// wake-up it did not wait for to end the next waiting receive.
    #[test]
    fn zero_timeout_recv_spins_without_losing_datagrams_or_wakeups() {
        for gro in [false, true] {
            let a = loopback(2);
            let b = UdpDatapath::bind(UdpConfig {
                gro,
                ..UdpConfig::new("127.0.0.1:0".parse().unwrap(), 1)
            })
            .unwrap();
            let mut batch = RecvBatch::new(8, 2048);
            assert_eq!(b.recv(&mut batch, Some(Duration::ZERO)).unwrap(), 0);
            let payloads: Vec<[u8; 4]> = (0..20u32).map(|i| i.to_be_bytes()).collect();
            let sends = on_path(b.local_addr(), 1, &payloads);
            send_all(&a, &sends);
            let mut got = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while got.len() < payloads.len() && std::time::Instant::now() < deadline {
                let n = b.recv(&mut batch, Some(Duration::ZERO)).unwrap();
                assert!(n <= 8, "gro {gro}: {n} datagrams for 8 slots");
                got.extend(batch.iter().map(|(_, bytes)| bytes.to_vec()));
            }
            let want: Vec<Vec<u8>> = payloads.iter().map(|p| p.to_vec()).collect();
            assert_eq!(got, want, "gro {gro}");
            b.wake();
            assert_eq!(b.recv(&mut batch, Some(Duration::ZERO)).unwrap(), 0);
            // The wake-up is still pending: a receive that waits forever returns at once.
            assert_eq!(b.recv(&mut batch, None).unwrap(), 0, "gro {gro}");
        }
    }

    /// After a receive that found the socket empty, the next one asks the kernel for a
    /// single buffer (a round trip's reply comes alone) and the one after for all: a burst
    /// arriving meanwhile still comes out whole, each datagram with its own source and ECN
    /// codepoint (read from control messages, whose lengths the kernel rewrote at the
    /// larger calls before), round after round.
    #[test]
    fn a_burst_after_an_empty_receive_arrives_whole() {
        let a = loopback(4);
        let b = loopback(1);
        assert!(b.uses_gro(), "loopback has UDP GRO on Linux 5.0 and later");
        let mut batch = RecvBatch::new(256, 2048);
        for round in 0..3u32 {
            assert_eq!(b.recv(&mut batch, Some(Duration::ZERO)).unwrap(), 0);
            let payloads: Vec<[u8; 4]> = (0..150u32)
                .map(|i| (round * 1000 + i).to_be_bytes())
                .collect();
            let sends: Vec<Transmit<'_>> = payloads
                .iter()
                .enumerate()
                .map(|(i, p)| Transmit {
                    dest: b.local_addr(),
                    path: (i % 4) as u16,
                    ecn: if i % 3 == 0 { Ecn::Ce } else { Ecn::Ect0 },
                    contents: p,
                })
                .collect();
            send_all(&a, &sends);
            let before = b.offload_stats().messages_received;
            let first = b.recv(&mut batch, Some(Duration::from_secs(1))).unwrap();
            assert!(first >= 1, "round {round}: the burst is there");
            assert_eq!(
                b.offload_stats().messages_received - before,
                1,
                "round {round}: the first call after an empty one asks for one buffer"
            );
            let mut got: Vec<(RecvMeta, Vec<u8>)> =
                batch.iter().map(|(m, b)| (*m, b.to_vec())).collect();
            got.extend(recv_all(&b, sends.len() - got.len()));
            assert_eq!(got.len(), sends.len(), "round {round}");
            let mut seen = BTreeSet::new();
            for (meta, bytes) in got {
                let i =
                    (u32::from_be_bytes(bytes[..4].try_into().unwrap()) - round * 1000) as usize;
                assert_eq!(meta.ecn, sends[i].ecn, "round {round}, datagram {i}");
                assert_eq!(Some(meta.src), a.path_local_addr(sends[i].path));
                seen.insert(i);
            }
            assert_eq!(seen.len(), sends.len(), "round {round}");
        }
    }

    #[test]
    fn bad_path_counts_are_rejected() {
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for paths in [0, MAX_PATHS + 1, u16::MAX] {
            let err = UdpDatapath::bind(UdpConfig::new(local, paths)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "paths = {paths}");
        }
        for max_payload in [0, MAX_DATAGRAM + 1] {
            let config = UdpConfig {
                max_payload,
                ..UdpConfig::new(local, 1)
            };
            let err = UdpDatapath::bind(config).unwrap_err();
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidInput,
                "max_payload = {max_payload}"
            );
        }
        let config = UdpConfig {
            max_payload: MAX_DATAGRAM,
            ..UdpConfig::new(local, 1)
        };
        assert_eq!(
            UdpDatapath::bind(config).unwrap().max_payload(),
            MAX_DATAGRAM
        );
    }

    #[test]
    fn max_paths_is_accepted() {
        let dp = loopback(MAX_PATHS);
        assert_eq!(dp.paths(), MAX_PATHS);
        let ports: BTreeSet<u16> = (0..MAX_PATHS)
            .filter_map(|p| dp.path_local_addr(p))
            .map(|a| a.port())
            .collect();
        assert_eq!(ports.len(), usize::from(MAX_PATHS));
    }

    /// CPU time of the calling thread, ns.
    fn thread_cpu_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes one timespec into `ts`, which is live and exclusively borrowed.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// Streams `total` 1400-byte datagrams in batches of 64, in runs of `run` per path over
    /// 4 paths, from a sender with GSO `gso` to a receiver with GRO `gro` (receiving in
    /// another thread); returns (sender CPU ns, receiver CPU ns) per datagram received and
    /// the fraction received. CPU time, not wall time, so a loaded machine skews it less.
    fn cpu_per_datagram(gso: bool, gro: bool, run: usize, total: usize) -> (f64, f64, f64) {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        let config = |gso, gro| UdpConfig {
            gso,
            gro,
            ..UdpConfig::new("127.0.0.1:0".parse().unwrap(), 4)
        };
        let a = UdpDatapath::bind(config(gso, false)).unwrap();
        let b = Arc::new(UdpDatapath::bind(config(false, gro)).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicUsize::new(0));
        let receiver = {
            let (b, stop, received) = (Arc::clone(&b), Arc::clone(&stop), Arc::clone(&received));
            std::thread::spawn(move || {
                let start = thread_cpu_ns();
                let mut scratch = RecvBatch::new(64, 2048);
                while !stop.load(Ordering::Relaxed) {
                    let n = b
                        .recv_with(
                            &mut scratch,
                            Some(Duration::from_millis(20)),
                            &mut |_, _| {},
                        )
                        .unwrap();
                    received.fetch_add(n, Ordering::Relaxed);
                }
                thread_cpu_ns() - start
            })
        };
        let payload = vec![0x5au8; 1400];
        let batch: Vec<Transmit<'_>> = (0..64)
            .map(|i| Transmit {
                dest: b.local_addr(),
                path: ((i / run) % 4) as u16,
                ecn: Ecn::Ect0,
                contents: &payload,
            })
            .collect();
        let start = thread_cpu_ns();
        let mut sent = 0;
        while sent < total {
            sent += a.send(&batch).unwrap();
            // Keep the receiver's socket buffer from overflowing: at most ~2000 in flight
            // (for at most 50 ms, in case some were dropped after all).
            let waiting = Instant::now();
            while sent.saturating_sub(received.load(Ordering::Relaxed)) > 2000
                && waiting.elapsed() < Duration::from_millis(50)
            {
                std::thread::yield_now();
            }
        }
        let tx_ns = thread_cpu_ns() - start;
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        b.wake();
        let rx_ns = receiver.join().unwrap();
        let got = received.load(Ordering::Relaxed).max(1);
        (
            tx_ns as f64 / got as f64,
            rx_ns as f64 / got as f64,
            got as f64 / sent as f64,
        )
    }

    #[test]
    #[ignore = "measurement: cargo test -p braid-datapath --release cpu_per_datagram -- --ignored --nocapture"]
    fn measure_cpu_per_datagram_with_and_without_gso_gro() {
        // Alternating rounds; runs of 16 datagrams per path (a 16-datagram burst) and of 1
        // (per-packet spraying, where GSO finds nothing to coalesce).
        for round in 0..3 {
            for (gso, gro, run) in [
                (false, false, 16),
                (true, false, 16),
                (true, true, 16),
                (true, true, 1),
            ] {
                let (tx, rx, frac) = cpu_per_datagram(gso, gro, run, 200_000);
                println!(
                    "round {round} gso={gso:<5} gro={gro:<5} run={run:>2}: sender {tx:>6.0} ns, \
                     receiver {rx:>6.0} ns CPU per datagram ({:.1}% received)",
                    frac * 100.0
                );
            }
        }
    }

    #[test]
    fn truncated_datagrams_are_dropped() {
        let a = loopback(1);
        let b = loopback(1);
        let big = [7u8; 200];
        let small = [9u8; 50];
        let batch = [
            Transmit {
                dest: b.local_addr(),
                path: 0,
                ecn: Ecn::NotEct,
                contents: &small,
            },
            Transmit {
                dest: b.local_addr(),
                path: 0,
                ecn: Ecn::NotEct,
                contents: &big,
            },
            Transmit {
                dest: b.local_addr(),
                path: 0,
                ecn: Ecn::NotEct,
                contents: &small,
            },
        ];
        send_all(&a, &batch);
        std::thread::sleep(Duration::from_millis(20));
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
}
