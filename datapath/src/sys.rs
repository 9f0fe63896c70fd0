//! The socket system calls and control-message handling the UDP and io_uring backends share,
//! behind a safe API: every `unsafe` block of the socket path lives here, each with the
//! invariant that makes it sound.
//!
//! What it does not hold: the io_uring ring itself (its memory mappings, buffer ring and
//! submissions stay in [`uring`](crate::uring)), AF_XDP or BPF.
//!
//! Control messages are written into and parsed out of byte buffers with explicit bounds
//! checks instead of walking raw pointers with `CMSG_FIRSTHDR`/`CMSG_NXTHDR`, so a malformed
//! or truncated control area from the kernel cannot make us read past it.

use std::io;
use std::marker::PhantomData;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::{Ecn, InPlace, RecvMeta};

/// C structs made only of integers, raw pointers and byte arrays, for which all-zero bytes
/// are a valid value.
///
/// # Safety
/// An implementor must be valid when zero-filled.
pub(crate) unsafe trait Zeroable: Sized {}

// SAFETY: all four are plain C structs of integers and raw pointers (null when zero).
unsafe impl Zeroable for libc::msghdr {}
// SAFETY: as above.
unsafe impl Zeroable for libc::mmsghdr {}
// SAFETY: as above.
unsafe impl Zeroable for libc::iovec {}
// SAFETY: as above.
unsafe impl Zeroable for libc::sockaddr_storage {}
// SAFETY: as above; musl's padding fields are integers too.
unsafe impl Zeroable for libc::cmsghdr {}
// SAFETY: as above (seconds, nanoseconds and, on some targets, integer padding).
unsafe impl Zeroable for libc::timespec {}

/// An all-zero `T`.
pub(crate) fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `T: Zeroable` promises that all-zero bytes are a valid `T`.
    unsafe { mem::zeroed() }
}

/// A nonblocking eventfd: the wake-up counter of a receive loop.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A new nonblocking, close-on-exec eventfd with counter 0.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter. A full counter (EAGAIN) means a wake-up is already pending,
    /// so failures are ignored.
    pub(crate) fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes the 8 bytes of `one`, which is live for the call.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                one.as_ptr().cast::<libc::c_void>(),
                one.len(),
            )
        };
    }

    /// Resets the counter to zero.
    pub(crate) fn drain(&self) {
        drain_eventfd(self.0.as_raw_fd());
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Empties the counter of the eventfd `fd` (a no-op on any other descriptor that has no
/// 8 bytes to read; nothing but a local buffer is written).
pub(crate) fn drain_eventfd(fd: RawFd) {
    let mut value = [0u8; 8];
    // SAFETY: reads at most 8 bytes into `value`, which is 8 bytes long and live.
    let _ = unsafe { libc::read(fd, value.as_mut_ptr().cast::<libc::c_void>(), value.len()) };
}

/// `setsockopt(fd, level, name, &value)` with an `int` option value.
pub(crate) fn set_int_option(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast::<libc::c_void>(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `getsockopt(fd, level, name)` of an `int` option.
pub(crate) fn int_option(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live and `len` holds the size of `value`, so the kernel
    // writes at most that many bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Waits up to `timeout` for room to send on `fd` (a full socket buffer). EINTR, a timeout
/// or an error all return: the caller's next send attempt tells which.
pub(crate) fn wait_writable(fd: RawFd, timeout: Duration) {
    let mut fds = [libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    }];
    let _ = poll(&mut fds, Some(timeout));
}

/// `ppoll` on `fds` for up to `timeout` (forever if `None`); returns the number of ready
/// descriptors.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(t.subsec_nanos()),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` is a live, writable slice of `fds.len()` pollfds; `ts_ptr` is null or
    // points at `ts`, which outlives the call; a null signal mask leaves the mask alone.
    let r = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            ts_ptr,
            std::ptr::null(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Whether a destination goes out as IPv4 (TOS) or IPv6 (traffic class).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    /// The (level, type) of the control message that sets the ECN bits for this family.
    pub(crate) fn tos_message(self) -> (libc::c_int, libc::c_int) {
        match self {
            Family::V4 => (libc::IPPROTO_IP, libc::IP_TOS),
            Family::V6 => (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
        }
    }
}

/// Writes `dest` into `out` in the form a socket of the given family accepts: IPv4
/// addresses become v4-mapped on IPv6 sockets, v4-mapped ones become plain on IPv4 sockets.
/// `None` if an IPv4 socket cannot reach `dest`.
pub(crate) fn encode_addr(
    dest: SocketAddr,
    ipv6_socket: bool,
    out: &mut libc::sockaddr_storage,
) -> Option<(libc::socklen_t, Family)> {
    let v4 = match dest {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(a) => a
            .ip()
            .to_ipv4_mapped()
            .map(|ip| SocketAddrV4::new(ip, a.port())),
    };
    if !ipv6_socket {
        let a = v4?;
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr type, and
        // `out` is a live exclusive reference.
        unsafe {
            (out as *mut libc::sockaddr_storage)
                .cast::<libc::sockaddr_in>()
                .write(sin)
        };
        return Some((
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            Family::V4,
        ));
    }
    let (a6, family) = match dest {
        SocketAddr::V4(a) => (
            SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0),
            Family::V4,
        ),
        SocketAddr::V6(a) => (a, if v4.is_some() { Family::V4 } else { Family::V6 }),
    };
    let sin6 = libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: a6.port().to_be(),
        sin6_flowinfo: a6.flowinfo().to_be(),
        sin6_addr: libc::in6_addr {
            s6_addr: a6.ip().octets(),
        },
        sin6_scope_id: a6.scope_id(),
    };
    // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr type, and `out`
    // is a live exclusive reference.
    unsafe {
        (out as *mut libc::sockaddr_storage)
            .cast::<libc::sockaddr_in6>()
            .write(sin6)
    };
    Some((
        mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        family,
    ))
}

/// Reads the address the kernel wrote into `addr` (`len` bytes). IPv4-mapped IPv6 sources
/// come back as plain IPv4.
pub(crate) fn decode_addr(
    addr: &libc::sockaddr_storage,
    len: libc::socklen_t,
) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(addr.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in, whose
            // fields are integers valid for any bytes; the family says this is one.
            let sin =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::new(IpAddr::V4(v4), port),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    port,
                    u32::from_be(sin6.sin6_flowinfo),
                    sin6.sin6_scope_id,
                )),
            })
        }
        _ => None,
    }
}

/// [`decode_addr`] of a socket address given as bytes (as io_uring's multishot receive lays
/// it out in the buffer); bytes beyond a `sockaddr_storage` are ignored.
pub(crate) fn decode_addr_bytes(name: &[u8]) -> Option<SocketAddr> {
    let mut storage: libc::sockaddr_storage = zeroed();
    let len = name.len().min(mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: copies `len` bytes, which fit both the source slice and the storage; the two
    // do not overlap (one is on the stack, the other borrowed); any bytes are a valid
    // sockaddr_storage, which is integers only.
    unsafe {
        std::ptr::copy_nonoverlapping(
            name.as_ptr(),
            (&mut storage as *mut libc::sockaddr_storage).cast::<u8>(),
            len,
        );
    }
    decode_addr(&storage, len as libc::socklen_t)
}

/// `CMSG_ALIGN`: control messages are padded to the size of a `size_t` on Linux.
const fn cmsg_align(len: usize) -> usize {
    let a = mem::size_of::<usize>();
    (len + a - 1) & !(a - 1)
}

/// Bytes of a control-message header including the padding before its data (`CMSG_LEN(0)`).
const CMSG_HEADER_BYTES: usize = cmsg_align(mem::size_of::<libc::cmsghdr>());

/// `CMSG_LEN(len)`: the `cmsg_len` of a message carrying `len` data bytes.
pub(crate) const fn cmsg_len(len: usize) -> usize {
    CMSG_HEADER_BYTES + len
}

/// `CMSG_SPACE(len)`: the bytes a message carrying `len` data bytes takes in the buffer.
pub(crate) const fn cmsg_space(len: usize) -> usize {
    CMSG_HEADER_BYTES + cmsg_align(len)
}

/// Control-message space of `N` bytes, aligned for `cmsghdr`.
#[derive(Copy, Clone)]
#[repr(C, align(8))]
pub(crate) struct Control<const N: usize>([u8; N]);

impl<const N: usize> Control<N> {
    /// Zero-filled space.
    pub(crate) const fn new() -> Self {
        Control([0; N])
    }

    /// The buffer, for `msg_control`.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::c_void {
        self.0.as_mut_ptr().cast()
    }

    /// The first `len` bytes (all of them if `len` is larger).
    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        &self.0[..len.min(N)]
    }

    /// Writes the control messages of one send: the ECN codepoint as an `IP_TOS` or
    /// `IPV6_TCLASS` message (`tos`: the family and the codepoint), and the GSO segment size
    /// as a `UDP_SEGMENT` message (`segment`), each if given. Returns the bytes used (the
    /// `msg_controllen` to send with; 0 when there is nothing to say), or `None` if the
    /// messages do not fit in `N` bytes.
    pub(crate) fn write_send(
        &mut self,
        tos: Option<(Family, Ecn)>,
        segment: Option<u16>,
    ) -> Option<usize> {
        self.0.fill(0);
        let mut used = 0;
        if let Some((family, ecn)) = tos {
            let (level, kind) = family.tos_message();
            let value = libc::c_int::from(ecn.to_bits()).to_ne_bytes();
            used += self.write_message(used, level, kind, &value)?;
        }
        if let Some(size) = segment {
            used +=
                self.write_message(used, libc::SOL_UDP, libc::UDP_SEGMENT, &size.to_ne_bytes())?;
        }
        Some(used)
    }

    /// Writes one message with `data` at byte `at`; returns its space, or `None` if it does
    /// not fit.
    fn write_message(
        &mut self,
        at: usize,
        level: libc::c_int,
        kind: libc::c_int,
        data: &[u8],
    ) -> Option<usize> {
        let space = cmsg_space(data.len());
        let slot = self.0.get_mut(at..at.checked_add(space)?)?;
        let mut header: libc::cmsghdr = zeroed();
        header.cmsg_level = level;
        header.cmsg_type = kind;
        header.cmsg_len = cmsg_len(data.len()) as _;
        // SAFETY: `slot` holds at least CMSG_HEADER_BYTES >= size_of::<cmsghdr>() bytes,
        // and the unaligned write needs no alignment.
        unsafe {
            slot.as_mut_ptr()
                .cast::<libc::cmsghdr>()
                .write_unaligned(header)
        };
        slot[CMSG_HEADER_BYTES..CMSG_HEADER_BYTES + data.len()].copy_from_slice(data);
        Some(space)
    }
}

/// What the control messages of one receive say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvControl {
    /// The ECN codepoint of the TOS/TCLASS message (`NotEct` if there is none).
    pub(crate) ecn: Ecn,
    /// If the kernel coalesced several datagrams into this one buffer (UDP GRO), their
    /// segment size from the `UDP_GRO` message: every datagram but the last is that long.
    pub(crate) segment: Option<usize>,
    /// The kernel's software receive timestamp (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`), ns.
    pub(crate) rx_realtime_ns: Option<u64>,
}

/// Parses the control messages of one receive (`msg_flags`: the receive's flags, which say
/// if the area was truncated). Stops at the first malformed message; a truncated area
/// (`MSG_CTRUNC`) says nothing.
pub(crate) fn read_control(control: &[u8], msg_flags: libc::c_int) -> RecvControl {
    let mut out = RecvControl {
        ecn: Ecn::NotEct,
        segment: None,
        rx_realtime_ns: None,
    };
    if msg_flags & libc::MSG_CTRUNC != 0 {
        return out;
    }
    let mut at = 0;
    while let Some(head) = control.get(at..at + mem::size_of::<libc::cmsghdr>()) {
        // SAFETY: `head` holds size_of::<cmsghdr>() bytes; cmsghdr is integers, valid for
        // any bytes; the unaligned read needs no alignment.
        let c = unsafe { head.as_ptr().cast::<libc::cmsghdr>().read_unaligned() };
        // `cmsg_len` is a size_t on glibc and a socklen_t on musl.
        #[allow(clippy::unnecessary_cast)]
        let len = c.cmsg_len as usize;
        // A message must hold its header and end inside the area; after this check
        // `at + len <= control.len()`, so the advance below cannot overflow.
        let Some(data) = at
            .checked_add(len)
            .filter(|_| len >= CMSG_HEADER_BYTES)
            .and_then(|end| control.get(at + CMSG_HEADER_BYTES..end))
        else {
            break;
        };
        match (c.cmsg_level, c.cmsg_type) {
            (libc::IPPROTO_IP, libc::IP_TOS) if !data.is_empty() => {
                out.ecn = Ecn::from_tos(data[0]);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if data.len() >= 4 => {
                let tclass = libc::c_int::from_ne_bytes([data[0], data[1], data[2], data[3]]);
                out.ecn = Ecn::from_tos(tclass.to_le_bytes()[0]);
            }
            (libc::SOL_UDP, libc::UDP_GRO) if data.len() >= 4 => {
                let size = libc::c_int::from_ne_bytes([data[0], data[1], data[2], data[3]]);
                out.segment = usize::try_from(size).ok().filter(|&s| s > 0);
            }
            (libc::SOL_SOCKET, SCM_TIMESTAMPNS)
                if data.len() >= mem::size_of::<libc::timespec>() =>
            {
                // SAFETY: `data` holds a whole timespec (integers, valid for any bytes); the
                // unaligned read needs no alignment.
                let ts = unsafe { data.as_ptr().cast::<libc::timespec>().read_unaligned() };
                out.rx_realtime_ns = timespec_ns(&ts);
            }
            _ => {}
        }
        at += cmsg_align(len);
    }
    out
}

/// `SO_TIMESTAMPNS` (and its control message type) where the generic socket option numbers
/// apply; elsewhere receive timestamps stay off.
const SO_TIMESTAMPNS: Option<libc::c_int> = if cfg!(any(
    target_arch = "x86",
    target_arch = "x86_64",
    target_arch = "arm",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "powerpc64",
    target_arch = "s390x",
    target_arch = "loongarch64"
)) {
    Some(35)
} else {
    None
};
const SCM_TIMESTAMPNS: libc::c_int = match SO_TIMESTAMPNS {
    Some(v) => v,
    None => -1,
};

/// Asks the kernel to stamp each datagram `fd` receives with its software receive time
/// (`SO_TIMESTAMPNS`); `false` where that is not available.
pub(crate) fn enable_rx_timestamps(fd: RawFd) -> bool {
    SO_TIMESTAMPNS.is_some_and(|opt| set_int_option(fd, libc::SOL_SOCKET, opt, 1).is_ok())
}

fn timespec_ns(ts: &libc::timespec) -> Option<u64> {
    let s = u64::try_from(ts.tv_sec).ok()?;
    let ns = u64::try_from(ts.tv_nsec).ok()?;
    s.checked_mul(1_000_000_000)?.checked_add(ns)
}

/// `CLOCK_REALTIME` now, ns (the clock of the kernel's receive timestamps).
pub(crate) fn realtime_ns() -> Option<u64> {
    clock_ns(libc::CLOCK_REALTIME)
}

/// `CLOCK_MONOTONIC` now, ns.
pub(crate) fn monotonic_ns() -> Option<u64> {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE` now, ns: the monotonic clock as of the last timer tick (a few
/// ms of resolution), read without the time source.
pub(crate) fn coarse_monotonic_ns() -> Option<u64> {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts: libc::timespec = zeroed();
    // SAFETY: `ts` is a valid, exclusively borrowed timespec the call writes.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    if r == 0 { timespec_ns(&ts) } else { None }
}

/// How long a datagram stamped at `rx_realtime_ns` has waited in the kernel by
/// `now_realtime_ns`, ns, at most `u32::MAX`; 0 when either is unknown or the clock went
/// back (a wall-clock step must not invent a wait).
pub(crate) fn queued_ns(rx_realtime_ns: Option<u64>, now_realtime_ns: Option<u64>) -> u32 {
    match (rx_realtime_ns, now_realtime_ns) {
        (Some(rx), Some(now)) if now >= rx => u32::try_from(now - rx).unwrap_or(u32::MAX),
        _ => 0,
    }
}

/// The segments of one received buffer of `len` bytes that the kernel coalesced with
/// segment size `segment` (UDP GRO; `None`: one datagram): `(offset, length)` of each, in
/// order, the last possibly shorter. An empty buffer is one empty datagram.
pub(crate) fn segments(len: usize, segment: Option<usize>) -> impl Iterator<Item = (usize, usize)> {
    let step = segment.filter(|&s| s > 0 && s < len).unwrap_or(len.max(1));
    let count = if len == 0 { 1 } else { len.div_ceil(step) };
    (0..count).map(move |k| {
        let at = k * step;
        (at, step.min(len - at))
    })
}

/// The arrays one `sendmmsg` call points into, for up to `C` messages carrying up to `C`
/// datagrams in all, with `CTRL` bytes of control space per message: 18 KiB at the sizes
/// the UDP datapath uses, so a sender keeps one and lends it to every call's [`SendMmsg`]
/// instead of zeroing a new one per call. Between calls they hold stale addresses, which
/// nothing reads: every entry a call uses is written by that call first.
pub(crate) struct SendArrays<const C: usize, const CTRL: usize> {
    hdrs: [libc::mmsghdr; C],
    iovs: [libc::iovec; C],
    addrs: [libc::sockaddr_storage; C],
    addr_lens: [libc::socklen_t; C],
    control: [Control<CTRL>; C],
    /// Per message: the TOS/TCLASS message to send, if any.
    tos: [Option<(Family, Ecn)>; C],
    /// Per message: where its iovecs are and what datagrams they hold.
    spans: [Span; C],
}

/// One queued message of a [`SendMmsg`]: its iovecs `iovs[first..first + iovs]`, and the
/// `datagrams` they hold, every one `segment` bytes long but the last (a GSO run when more
/// than one). Datagrams that lie back to back in memory share an iovec.
#[derive(Clone, Copy, Default)]
struct Span {
    first: usize,
    iovs: usize,
    datagrams: usize,
    segment: usize,
}

impl<const C: usize, const CTRL: usize> SendArrays<C, CTRL> {
    /// Zero-filled arrays, on the heap.
    pub(crate) fn boxed() -> Box<Self> {
        Box::new(SendArrays {
            hdrs: [zeroed(); C],
            iovs: [zeroed(); C],
            addrs: [zeroed(); C],
            addr_lens: [0; C],
            control: [Control::new(); C],
            tos: [None; C],
            spans: [Span::default(); C],
        })
    }
}

/// One `sendmmsg` call's queue, in borrowed [`SendArrays`]. A message is one datagram, or a
/// UDP GSO run of several that the kernel (or the NIC) cuts into datagrams of the first
/// one's length (the last may be shorter). A run's datagrams take one iovec each, except
/// that one starting where the previous one ends extends its iovec: the kernel's copy of a
/// message costs per iovec (measured in `bench/results/session-2026-12-06-s29.md`). Holds
/// only the payloads' addresses:
/// the lifetime `'a` keeps them borrowed. The pointers between the arrays and the control
/// messages are set in [`send`](Self::send), right before the call, so moving the arrays
/// is harmless.
pub(crate) struct SendMmsg<'a, const C: usize, const CTRL: usize> {
    a: &'a mut SendArrays<C, CTRL>,
    /// Messages queued.
    len: usize,
    /// Iovecs queued.
    slots: usize,
    payloads: PhantomData<&'a [u8]>,
}

impl<'a, const C: usize, const CTRL: usize> SendMmsg<'a, C, CTRL> {
    /// An empty queue in `arrays`.
    pub(crate) fn new(arrays: &'a mut SendArrays<C, CTRL>) -> Self {
        SendMmsg {
            a: arrays,
            len: 0,
            slots: 0,
            payloads: PhantomData,
        }
    }

    /// Forgets the queued messages.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.slots = 0;
    }

    /// Queued messages.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Datagrams carried by the first `messages` queued messages.
    pub(crate) fn datagrams_in(&self, messages: usize) -> usize {
        self.a.spans[..messages.min(self.len)]
            .iter()
            .map(|s| s.datagrams)
            .sum()
    }

    /// [`push_in_place`](Self::push_in_place) of a datagram whole (the queue's tests).
    #[cfg(test)]
    pub(crate) fn push(
        &mut self,
        dest: SocketAddr,
        ipv6_socket: bool,
        contents: &'a [u8],
        ecn: Ecn,
        socket_ecn: Ecn,
        connected: bool,
    ) -> bool {
        // SAFETY: no payload in place.
        unsafe {
            self.push_in_place(
                dest,
                ipv6_socket,
                contents,
                None,
                ecn,
                socket_ecn,
                connected,
            )
        }
    }

    /// Queues a new message: `contents` for `dest` with ECN codepoint `ecn`, except that
    /// with `p` its bytes `[p.at, p.at + p.len)` are read from `p.src` (a message of up to
    /// three iovecs). Returns `false` (and queues nothing) if the scratch is full or `dest`
    /// cannot be addressed from a socket of this family (`ipv6_socket`). The socket it goes
    /// out on marks its datagrams `socket_ecn` unless told otherwise, so only another
    /// codepoint takes a control message; `connected`: it is connected to `dest`, so the
    /// message names no address. Both let the kernel send on the route the socket cached
    /// instead of looking one up (a control message other than the segment size makes it
    /// look one up too).
    ///
    /// # Safety
    /// `p.src` is valid for reads of `p.len` bytes until the last [`send`](Self::send) of
    /// this queue returns, and `p.at + p.len <= contents.len()`.
    #[allow(clippy::too_many_arguments)] // the message's fields and the payload
    pub(crate) unsafe fn push_in_place(
        &mut self,
        dest: SocketAddr,
        ipv6_socket: bool,
        contents: &'a [u8],
        p: Option<InPlace>,
        ecn: Ecn,
        socket_ecn: Ecn,
        connected: bool,
    ) -> bool {
        let n = self.len;
        let (pieces, count) = pieces(contents, p);
        if n >= C || self.slots + count > C {
            return false;
        }
        let Some((addr_len, family)) = encode_addr(dest, ipv6_socket, &mut self.a.addrs[n]) else {
            return false;
        };
        // A length of 0 sends without a name.
        self.a.addr_lens[n] = if connected { 0 } else { addr_len };
        self.a.tos[n] = (ecn != socket_ecn).then_some((family, ecn));
        self.a.spans[n] = Span {
            first: self.slots,
            iovs: 0,
            datagrams: 1,
            segment: contents.len(),
        };
        self.len += 1;
        for &(base, len) in &pieces[..count] {
            self.add_iov(base, len);
        }
        true
    }

    /// [`add_segment_in_place`](Self::add_segment_in_place) of a datagram whole (the
    /// queue's tests).
    #[cfg(test)]
    pub(crate) fn add_segment(&mut self, contents: &'a [u8]) -> bool {
        // SAFETY: no payload in place.
        unsafe { self.add_segment_in_place(contents, None) }
    }

    /// Adds `contents` (its payload read from `p.src` with `p`, as
    /// [`push_in_place`](Self::push_in_place) does) as one more GSO segment to the last
    /// queued message (same destination and ECN); each piece that starts where the last
    /// iovec ends extends it. The caller keeps the run valid for the kernel: every segment
    /// but the last as long as the first, at most 64 segments and 65507 bytes. Returns
    /// `false` (and adds nothing) if there is no message or no room.
    ///
    /// # Safety
    /// As [`push_in_place`](Self::push_in_place).
    pub(crate) unsafe fn add_segment_in_place(
        &mut self,
        contents: &'a [u8],
        p: Option<InPlace>,
    ) -> bool {
        if self.len == 0 {
            return false;
        }
        let (pieces, count) = pieces(contents, p);
        // The last message's last iovec is the last one queued.
        let extends = is_adjacent(&self.a.iovs[self.slots - 1], pieces[0].0);
        if self.slots + count - usize::from(extends) > C {
            return false;
        }
        for &(base, len) in &pieces[..count] {
            let last = &mut self.a.iovs[self.slots - 1];
            if is_adjacent(last, base) {
                last.iov_len += len;
            } else {
                self.add_iov(base, len);
            }
        }
        self.a.spans[self.len - 1].datagrams += 1;
        true
    }

    /// Appends an iovec to the last message.
    fn add_iov(&mut self, base: *const u8, len: usize) {
        self.a.iovs[self.slots] = libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: len,
        };
        self.slots += 1;
        self.a.spans[self.len - 1].iovs += 1;
    }

    /// `sendmmsg` of the queued messages on `fd`: how many messages the kernel took
    /// (possibly 0; [`datagrams_in`](Self::datagrams_in) counts their datagrams), or the OS
    /// error, which concerns the first message. The queue is left as it is. A bare system
    /// call, as [`RecvMmsg`]'s receive is, without the wrapper's cancellation bookkeeping.
    pub(crate) fn send(&mut self, fd: RawFd) -> io::Result<usize> {
        for i in 0..self.len {
            let span = self.a.spans[i];
            // GSO: the kernel cuts the run into datagrams of the first segment's length.
            let segment = (span.datagrams > 1)
                .then(|| u16::try_from(span.segment).ok())
                .flatten();
            // CTRL holds both messages (checked by the callers' sizes); without them the
            // datagram would still go out, only unmarked (and a run as one datagram, which
            // the callers never queue without a segment size).
            let control_len = self.a.control[i]
                .write_send(self.a.tos[i], segment)
                .unwrap_or(0);
            let mut hdr: libc::msghdr = zeroed();
            if self.a.addr_lens[i] > 0 {
                hdr.msg_name = (&mut self.a.addrs[i] as *mut libc::sockaddr_storage).cast();
                hdr.msg_namelen = self.a.addr_lens[i];
            }
            hdr.msg_iov = &mut self.a.iovs[span.first];
            hdr.msg_iovlen = span.iovs as _;
            if control_len > 0 {
                hdr.msg_control = self.a.control[i].as_mut_ptr();
                hdr.msg_controllen = control_len as _;
            }
            self.a.hdrs[i] = libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            };
        }
        // SAFETY: the first `len` headers were just pointed at this scratch's own address,
        // control and iovec arrays (each header's `span.iovs` iovecs lie inside `iovs`: spans
        // are built by `push_in_place`/`add_segment_in_place`, which stop at C), which stay put
        // while `&mut self` is held, and the iovecs at payloads borrowed for `'a` or, for
        // payloads in place, valid until this returns (`push_in_place`'s contract); `len <=
        // C`. The kernel only reads them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sendmmsg,
                fd,
                self.a.hdrs.as_mut_ptr(),
                self.len as libc::c_uint,
                0 as libc::c_int,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

/// Whether bytes at `base` start where `iov` ends (so one iovec can cover both; the caller
/// holds both ranges, so the longer iovec covers valid bytes only).
pub(crate) fn is_adjacent(iov: &libc::iovec, base: *const u8) -> bool {
    (iov.iov_base as usize).wrapping_add(iov.iov_len) == base as usize
}

/// The pieces of a datagram, and how many: `contents` whole, or with its payload elsewhere
/// (`p`) the non-empty ones of the bytes before it, the payload, the bytes after it.
fn pieces(contents: &[u8], p: Option<InPlace>) -> ([(*const u8, usize); 3], usize) {
    let mut out = [(contents.as_ptr(), contents.len()); 3];
    let Some(p) = p else {
        return (out, 1);
    };
    let (head, rest) = contents.split_at(p.at);
    let tail = &rest[p.len..];
    let mut n = 0;
    for piece in [
        (head.as_ptr(), head.len()),
        (p.src, p.len),
        (tail.as_ptr(), tail.len()),
    ] {
        if piece.1 > 0 {
            out[n] = piece;
            n += 1;
        }
    }
    (out, n)
}

/// The arrays one `recvmmsg` call points into, for up to `C` datagrams with `CTRL` bytes of
/// control space each.
pub(crate) struct RecvMmsg<const C: usize, const CTRL: usize> {
    hdrs: [libc::mmsghdr; C],
    iovs: [libc::iovec; C],
    addrs: [libc::sockaddr_storage; C],
    control: [Control<CTRL>; C],
    /// Datagrams the last [`recv`](Self::recv) received.
    received: usize,
    /// `CLOCK_REALTIME` when it returned (what the datagrams' kernel timestamps are
    /// measured against).
    received_at: Option<u64>,
    /// The leading headers that point at these arrays and at the iovecs, and where the
    /// arrays were then: a spinning poller calls `recv` with the same buffers again and
    /// again, and rewriting all `C` headers per call was most of its own time.
    prepared: usize,
    prepared_at: usize,
    /// Buffers of its own ([`own`](Self::own), [`recv_owned`](Self::recv_owned)), and how
    /// many of the first headers point at them (nobody else can move or replace them, so a
    /// call need not compare every iovec to find out, as `recv` must).
    owned: Vec<Box<[u8]>>,
    owned_prepared: usize,
}

// SAFETY: the raw pointers in the headers and iovecs point into this struct's own arrays or
// at the caller's buffers; they are rewritten before every `recvmmsg` in `recv`, which
// holds `&mut self`, and never dereferenced by us. Moving the arrays to another thread
// shares nothing.
unsafe impl<const C: usize, const CTRL: usize> Send for RecvMmsg<C, CTRL> {}

impl<const C: usize, const CTRL: usize> RecvMmsg<C, CTRL> {
    /// Empty scratch.
    pub(crate) fn new() -> Self {
        RecvMmsg {
            hdrs: [zeroed(); C],
            iovs: [zeroed(); C],
            addrs: [zeroed(); C],
            control: [Control::new(); C],
            received: 0,
            received_at: None,
            prepared: 0,
            prepared_at: 0,
            owned: Vec::new(),
            owned_prepared: 0,
        }
    }

    /// Gives the scratch `n` (at most `C`) zero-filled buffers of `len` bytes of its own, for
    /// [`recv_owned`](Self::recv_owned), unless it has them.
    pub(crate) fn own(&mut self, n: usize, len: usize) {
        if self.owned.is_empty() {
            // Zero-filled allocations are mapped lazily: a buffer only ever filled with small
            // datagrams costs a page.
            self.owned = (0..n.min(C))
                .map(|_| vec![0u8; len].into_boxed_slice())
                .collect();
            self.owned_prepared = 0;
        }
    }

    /// Own buffer `i` (see [`own`](Self::own)), as the last call filled it (the first
    /// `meta(i).len` bytes).
    pub(crate) fn owned(&self, i: usize) -> Option<&[u8]> {
        self.owned.get(i).map(|b| &b[..])
    }

    /// [`recv`](Self::recv) into the first `want` of the scratch's own buffers (all of them
    /// if it has fewer): when the headers point at them already (the scratch did not move),
    /// only those the kernel wrote last time are reset.
    pub(crate) fn recv_owned(&mut self, fd: RawFd, want: usize) -> io::Result<usize> {
        let want = want.clamp(1, self.owned.len().min(C).max(1));
        let moved = self.prepared_at != self.hdrs.as_ptr() as usize;
        if moved || self.owned_prepared < want {
            let mut bufs = mem::take(&mut self.owned);
            let want = want.min(bufs.len());
            let r = self.recv(fd, &mut bufs[..want]);
            self.owned_prepared = want;
            self.owned = bufs;
            return r;
        }
        self.reset_written();
        // SAFETY: as in `recv`: the first `want` headers were prepared by the `recv` of an
        // earlier call with these very buffers (`owned_prepared ≥ want`, cleared by any
        // `recv` with others), which only this scratch holds and nobody moved or resized
        // (they are boxes behind `&mut self`), and the arrays the headers point into are
        // where they were then (`moved` is false).
        unsafe { self.call(fd, want) }
    }

    /// Resets the headers the kernel wrote at the last call (the lengths and flags of the
    /// ones it filled, and maybe of the first even when nothing came), whatever this call
    /// asks for: a call for fewer datagrams than the last one received must not leave the
    /// others' lengths for a later, larger call.
    fn reset_written(&mut self) {
        let written = self.received.max(1).min(C);
        self.received = 0;
        for m in &mut self.hdrs[..written] {
            m.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_controllen = CTRL as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
    }

    /// `recvmmsg(MSG_DONTWAIT)` on `fd` into the first `bufs.len()` (at most `C`) buffers:
    /// how many datagrams arrived, or the OS error. [`meta`](Self::meta) then describes them.
    pub(crate) fn recv(&mut self, fd: RawFd, bufs: &mut [Box<[u8]>]) -> io::Result<usize> {
        let want = bufs.len().min(C);
        let at = self.hdrs.as_ptr() as usize;
        if self.prepared_at != at {
            self.prepared = 0;
            self.prepared_at = at;
        }
        // The headers may stop pointing at the own buffers (`recv_owned` checks them again).
        self.owned_prepared = 0;
        self.reset_written();
        for (i, buf) in bufs.iter_mut().take(want).enumerate() {
            let iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let same = i < self.prepared
                && self.iovs[i].iov_base == iov.iov_base
                && self.iovs[i].iov_len == iov.iov_len;
            if same {
                continue;
            }
            self.iovs[i] = iov;
            let iovs = core::slice::from_mut(&mut self.iovs[i]);
            self.hdrs[i] = recv_header(&mut self.addrs[i], iovs, &mut self.control[i]);
        }
        self.prepared = self.prepared.max(want);
        // SAFETY: the first `want <= C` headers point at this scratch's own address storage
        // and control buffers (at their current place: `prepared_at`), sized as the headers
        // say, and their iovecs at `want` distinct buffers of `bufs` (each compared or
        // rewritten above), each `iov_len` long; all are exclusively borrowed until the call
        // returns.
        unsafe { self.call(fd, want) }
    }

    /// The `recvmmsg(MSG_DONTWAIT)` itself, into the first `want` headers. A bare system
    /// call, not glibc's wrapper: the wrapper is a cancellation point, which in a process
    /// with threads brackets the call with two atomic updates of the thread's cancellation
    /// state (Rust never cancels threads), on every poll of a spinning receiver.
    ///
    /// # Safety
    /// The first `want <= C` headers point at this scratch's own address storage and control
    /// buffers where they are now, sized as the headers say, and their iovecs at `want`
    /// distinct live buffers of at least `iov_len` bytes that nothing else accesses during
    /// the call (the kernel writes only within those lengths).
    unsafe fn call(&mut self, fd: RawFd, want: usize) -> io::Result<usize> {
        debug_assert!(want <= C && want <= self.prepared);
        // SAFETY: the caller's contract.
        let n = unsafe { recvmmsg(fd, &mut self.hdrs[..want])? };
        self.received = n;
        self.received_at = realtime_ns();
        Ok(self.received)
    }

    /// The metadata of received datagram `i`, or `None` if it is to be dropped (truncated,
    /// from an address family we do not know, or not received).
    pub(crate) fn meta(&self, i: usize) -> Option<RecvMeta> {
        self.meta_gro(i).map(|(meta, _)| meta)
    }

    /// Like [`meta`](Self::meta), and the GRO segment size of received buffer `i` (`None`
    /// when it holds one datagram): `len` is then the whole coalesced buffer. The control
    /// messages are read once for both.
    pub(crate) fn meta_gro(&self, i: usize) -> Option<(RecvMeta, Option<usize>)> {
        if i >= self.received {
            return None;
        }
        received_meta(
            &self.hdrs[i],
            &self.addrs[i],
            &self.control[i],
            self.received_at,
        )
    }
}

/// A `recvmmsg` header receiving into `iovs`, the source address into `addr` and control
/// messages into `control` (the pointers are the kernel's to write through during a call).
fn recv_header<const CTRL: usize>(
    addr: &mut libc::sockaddr_storage,
    iovs: &mut [libc::iovec],
    control: &mut Control<CTRL>,
) -> libc::mmsghdr {
    let mut hdr: libc::msghdr = zeroed();
    hdr.msg_name = (addr as *mut libc::sockaddr_storage).cast();
    hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    hdr.msg_iov = iovs.as_mut_ptr();
    hdr.msg_iovlen = iovs.len() as _;
    hdr.msg_control = control.as_mut_ptr();
    hdr.msg_controllen = CTRL as _;
    libc::mmsghdr {
        msg_hdr: hdr,
        msg_len: 0,
    }
}

/// The bare `recvmmsg(MSG_DONTWAIT)` system call into `hdrs` (see `RecvMmsg::call` for why
/// not glibc's wrapper): how many messages arrived, or the OS error.
///
/// # Safety
/// Every header points at address storage, control space and iovecs that are valid for the
/// kernel's writes (of the lengths the header and iovecs give) during the call and that
/// nothing else accesses meanwhile.
unsafe fn recvmmsg(fd: RawFd, hdrs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    // SAFETY: the caller's contract; `hdrs` is a live array of `hdrs.len()` headers.
    let n = unsafe {
        libc::syscall(
            libc::SYS_recvmmsg,
            fd,
            hdrs.as_mut_ptr(),
            hdrs.len() as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n as usize).min(hdrs.len()))
}

/// The metadata of one message a `recvmmsg` filled (`received_at`: the clock when it
/// returned) and the GRO segment size of its buffer, or `None` if it is to be dropped
/// (truncated, or from an address family we do not know).
fn received_meta<const CTRL: usize>(
    m: &libc::mmsghdr,
    addr: &libc::sockaddr_storage,
    control: &Control<CTRL>,
    received_at: Option<u64>,
) -> Option<(RecvMeta, Option<usize>)> {
    if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
        return None;
    }
    let src = decode_addr(addr, m.msg_hdr.msg_namelen)?;
    // `msg_controllen` is a size_t on glibc and a socklen_t on musl.
    #[allow(clippy::unnecessary_cast)]
    let control = control.bytes(m.msg_hdr.msg_controllen as usize);
    let c = read_control(control, m.msg_hdr.msg_flags);
    let meta = RecvMeta {
        src,
        len: m.msg_len as usize,
        ecn: c.ecn,
        queued_ns: queued_ns(c.rx_realtime_ns, received_at),
    };
    Some((meta, c.segment))
}

/// Longest head a landing receive takes into its own buffer.
pub(crate) const LAND_HEAD_MAX: usize = 64;

/// `recvmmsg` scratch for receives in pieces ([`crate::Datapath::recv_landing`]): per
/// message three iovecs, a head buffer of its own, the caller's landing zone, a tail buffer
/// of its own large enough for any datagram (so one that is not the expected one is
/// received whole, for the caller to put back together).
pub(crate) struct LandMmsg<const K: usize, const CTRL: usize> {
    hdrs: [libc::mmsghdr; K],
    iovs: [[libc::iovec; 3]; K],
    addrs: [libc::sockaddr_storage; K],
    control: [Control<CTRL>; K],
    heads: [[u8; LAND_HEAD_MAX]; K],
    /// Allocated at the first receive (`MAX_DATAGRAM` bytes each, mapped as written).
    tails: Vec<Box<[u8]>>,
    received: usize,
    received_at: Option<u64>,
}

impl<const K: usize, const CTRL: usize> core::fmt::Debug for LandMmsg<K, CTRL> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LandMmsg")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers in the headers and iovecs point into this struct's own arrays and
// buffers or at the caller's zones; they are rewritten before every `recvmmsg` in `recv`,
// which holds `&mut self`, and never dereferenced by us. Moving the scratch shares nothing.
unsafe impl<const K: usize, const CTRL: usize> Send for LandMmsg<K, CTRL> {}

impl<const K: usize, const CTRL: usize> LandMmsg<K, CTRL> {
    /// Empty scratch (its tail buffers come at the first receive).
    pub(crate) fn new() -> Self {
        LandMmsg {
            hdrs: [zeroed(); K],
            iovs: [[zeroed(); 3]; K],
            addrs: [zeroed(); K],
            control: [Control::new(); K],
            heads: [[0; LAND_HEAD_MAX]; K],
            tails: Vec::new(),
            received: 0,
            received_at: None,
        }
    }

    /// `recvmmsg(MSG_DONTWAIT)` on `fd` of up to `zones.len()` (at most `K`) datagrams, the
    /// `i`-th cut over `zones[i]` (its head clamped to [`LAND_HEAD_MAX`]).
    ///
    /// # Safety
    /// As [`crate::Datapath::recv_landing`]: each zone's `dst` valid for writes of `len`
    /// bytes during the call, the zones not overlapping.
    pub(crate) unsafe fn recv(
        &mut self,
        fd: RawFd,
        zones: &[crate::LandingZone],
    ) -> io::Result<usize> {
        let want = zones.len().min(K);
        if self.tails.is_empty() {
            self.tails = (0..K)
                .map(|_| vec![0u8; crate::MAX_DATAGRAM].into_boxed_slice())
                .collect();
        }
        for (i, z) in zones.iter().take(want).enumerate() {
            self.iovs[i] = [
                libc::iovec {
                    iov_base: self.heads[i].as_mut_ptr().cast(),
                    iov_len: z.head.min(LAND_HEAD_MAX),
                },
                libc::iovec {
                    iov_base: z.dst.cast(),
                    iov_len: z.len,
                },
                libc::iovec {
                    iov_base: self.tails[i].as_mut_ptr().cast(),
                    iov_len: self.tails[i].len(),
                },
            ];
            self.hdrs[i] = recv_header(&mut self.addrs[i], &mut self.iovs[i], &mut self.control[i]);
        }
        self.received = 0;
        // SAFETY: the first `want <= K` headers were just written to point at this scratch's
        // own address storage, control, head and tail buffers (sized as the iovecs say) and
        // at the caller's zones, valid for writes of their lengths by the caller's contract;
        // all are exclusively ours until the call returns.
        self.received = unsafe { recvmmsg(fd, &mut self.hdrs[..want])? };
        self.received_at = realtime_ns();
        Ok(self.received)
    }

    /// Received datagram `i` of the last call, cut over `zone` (the one it was received
    /// with), or `None` if it is to be dropped (truncated, of an unknown family, not
    /// received).
    pub(crate) fn pieces(
        &self,
        i: usize,
        zone: &crate::LandingZone,
    ) -> Option<crate::LandedPieces<'_>> {
        if i >= self.received {
            return None;
        }
        let (meta, segment) = received_meta(
            &self.hdrs[i],
            &self.addrs[i],
            &self.control[i],
            self.received_at,
        )?;
        let len = meta.len;
        let head = len.min(zone.head.min(LAND_HEAD_MAX));
        let landed = (len - head).min(zone.len);
        let tail = len - head - landed;
        Some(crate::LandedPieces {
            meta,
            segment,
            head: &self.heads[i][..head],
            landed,
            tail: self.tails[i].get(..tail)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmsg_sizes_match_libc() {
        for n in [0usize, 1, 2, 4, 8, 13] {
            // SAFETY: CMSG_LEN and CMSG_SPACE are pure arithmetic.
            let (len, space) = unsafe { (libc::CMSG_LEN(n as u32), libc::CMSG_SPACE(n as u32)) };
            assert_eq!(cmsg_len(n), len as usize);
            assert_eq!(cmsg_space(n), space as usize);
        }
    }

    #[test]
    fn send_control_round_trips_through_the_reader() {
        let mut c = Control::<48>::new();
        let used = c
            .write_send(Some((Family::V6, Ecn::Ce)), Some(1400))
            .unwrap();
        assert_eq!(used, cmsg_space(4) + cmsg_space(2));
        assert_eq!(ecn_of(c.bytes(used), 0), Ecn::Ce);
        // The reader sees the TOS message alone too, and the truncation flag wins.
        let used = c.write_send(Some((Family::V4, Ecn::Ect0)), None).unwrap();
        assert_eq!(ecn_of(c.bytes(used), 0), Ecn::Ect0);
        assert_eq!(ecn_of(c.bytes(used), libc::MSG_CTRUNC), Ecn::NotEct);
        assert_eq!(c.write_send(None, None), Some(0));
    }

    #[test]
    fn control_that_does_not_fit_is_refused() {
        let mut c = Control::<24>::new();
        assert!(c.write_send(Some((Family::V4, Ecn::Ce)), None).is_some());
        assert_eq!(c.write_send(Some((Family::V4, Ecn::Ce)), Some(1000)), None);
    }

    #[test]
    fn malformed_control_bytes_read_as_not_ect() {
        let mut c = Control::<48>::new();
        let used = c.write_send(Some((Family::V4, Ecn::Ce)), None).unwrap();
        let mut bytes = c.bytes(used).to_vec();
        // A cmsg_len past the end of the area, then one shorter than a header.
        for bad_len in [usize::MAX, 1000, 3] {
            bytes[..mem::size_of::<usize>()].copy_from_slice(&bad_len.to_ne_bytes());
            assert_eq!(ecn_of(&bytes, 0), Ecn::NotEct);
        }
        for cut in 0..used {
            let _ = ecn_of(&c.bytes(used)[..cut], 0);
        }
        // A good first message, then one whose length would run past the end of memory: the
        // first one's codepoint stands.
        let used = c
            .write_send(Some((Family::V4, Ecn::Ect1)), Some(1400))
            .unwrap();
        let mut bytes = c.bytes(used).to_vec();
        let second = cmsg_space(4);
        bytes[second..second + mem::size_of::<usize>()].copy_from_slice(&usize::MAX.to_ne_bytes());
        assert_eq!(ecn_of(&bytes, 0), Ecn::Ect1);
    }

    fn ecn_of(control: &[u8], flags: libc::c_int) -> Ecn {
        read_control(control, flags).ecn
    }

    #[test]
    fn back_to_back_segments_share_an_iovec() {
        let mut arrays = SendArrays::<8, 64>::boxed();
        let buf = [7u8; 40];
        let dest: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut q = SendMmsg::new(&mut arrays);
        assert!(q.push(dest, false, &buf[..10], Ecn::NotEct, Ecn::NotEct, true));
        assert!(q.add_segment(&buf[10..20]));
        assert!(q.add_segment(&buf[20..30]));
        // A gap: a second iovec, and the shorter last datagram of the run.
        assert!(q.add_segment(&buf[31..40]));
        assert_eq!(q.len(), 1);
        assert_eq!(q.datagrams_in(1), 4);
        assert_eq!(q.slots, 2);
        let s = q.a.spans[0];
        assert_eq!((s.first, s.iovs, s.datagrams, s.segment), (0, 2, 4, 10));
        assert_eq!((q.a.iovs[0].iov_len, q.a.iovs[1].iov_len), (30, 9));
        // A new message starts a new iovec even where the last one ends.
        assert!(q.push(dest, false, &buf[..5], Ecn::NotEct, Ecn::NotEct, true));
        assert_eq!((q.len(), q.slots, q.datagrams_in(2)), (2, 3, 5));
    }

    #[test]
    fn a_full_iovec_array_still_takes_back_to_back_segments() {
        let mut arrays = SendArrays::<2, 64>::boxed();
        let buf = [7u8; 40];
        let dest: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut q = SendMmsg::new(&mut arrays);
        assert!(q.push(dest, false, &buf[..10], Ecn::NotEct, Ecn::NotEct, true));
        assert!(q.add_segment(&buf[11..21]));
        assert!(!q.add_segment(&buf[22..32]), "no iovec left for a gap");
        assert!(q.add_segment(&buf[21..31]), "extends the last iovec");
        assert_eq!(q.datagrams_in(1), 3);
    }

    /// The codepoint and the GRO segment size that `control` carries.
    fn ecn_gro(control: &[u8], flags: libc::c_int) -> (Ecn, Option<usize>) {
        let c = read_control(control, flags);
        (c.ecn, c.segment)
    }

    #[test]
    fn receive_timestamp_is_read_beside_the_codepoint() {
        let mut c = Control::<72>::new();
        let used = c.write_send(Some((Family::V4, Ecn::Ect0)), None).unwrap();
        let ts = libc::timespec {
            tv_sec: 1_700_000_000,
            tv_nsec: 250,
        };
        // SAFETY: a timespec is plain integers; its bytes are read as such.
        let raw = unsafe {
            std::slice::from_raw_parts(
                (&ts as *const libc::timespec).cast::<u8>(),
                mem::size_of::<libc::timespec>(),
            )
        };
        let used = used
            + c.write_message(used, libc::SOL_SOCKET, SCM_TIMESTAMPNS, raw)
                .unwrap();
        let got = read_control(c.bytes(used), 0);
        assert_eq!(got.ecn, Ecn::Ect0);
        assert_eq!(got.rx_realtime_ns, Some(1_700_000_000_000_000_250));
        // Cut inside the timestamp: not read; a negative one is refused.
        assert_eq!(
            read_control(&c.bytes(used)[..used - 9], 0).rx_realtime_ns,
            None
        );
        let bad = libc::timespec {
            tv_sec: -1,
            tv_nsec: 0,
        };
        assert_eq!(timespec_ns(&bad), None);
    }

    #[test]
    fn queued_time_is_never_invented() {
        assert_eq!(queued_ns(Some(1_000), Some(4_500)), 3_500);
        // A wall-clock step backwards, or a missing stamp: no wait.
        assert_eq!(queued_ns(Some(5_000), Some(4_500)), 0);
        assert_eq!(queued_ns(None, Some(4_500)), 0);
        assert_eq!(queued_ns(Some(1), None), 0);
        assert_eq!(queued_ns(Some(0), Some(u64::MAX)), u32::MAX);
    }

    #[test]
    fn gro_segment_size_is_read_beside_the_codepoint() {
        let mut c = Control::<72>::new();
        // A TOS message, then a UDP_GRO message with segment size 1400 (the kernel reports
        // it as an int).
        let used = c.write_send(Some((Family::V4, Ecn::Ce)), None).unwrap();
        let used = used
            + c.write_message(used, libc::SOL_UDP, libc::UDP_GRO, &1400i32.to_ne_bytes())
                .unwrap();
        assert_eq!(ecn_gro(c.bytes(used), 0), (Ecn::Ce, Some(1400)));
        assert_eq!(
            ecn_gro(c.bytes(used), libc::MSG_CTRUNC),
            (Ecn::NotEct, None)
        );
        // Cut inside the GRO message's data (before its padding): the codepoint stands, the
        // size is not read.
        let cut = used - cmsg_space(4) + cmsg_len(4) - 1;
        assert_eq!(ecn_gro(&c.bytes(used)[..cut], 0), (Ecn::Ce, None));
        let zero = c
            .write_message(0, libc::SOL_UDP, libc::UDP_GRO, &0i32.to_ne_bytes())
            .unwrap();
        assert_eq!(ecn_gro(c.bytes(zero), 0), (Ecn::NotEct, None));
    }

    #[test]
    fn coalesced_buffers_split_into_their_segments() {
        let split = |len, seg| segments(len, seg).collect::<Vec<_>>();
        assert_eq!(
            split(3000, Some(1000)),
            [(0, 1000), (1000, 1000), (2000, 1000)]
        );
        assert_eq!(
            split(2123, Some(1000)),
            [(0, 1000), (1000, 1000), (2000, 123)]
        );
        assert_eq!(split(500, Some(1000)), [(0, 500)]);
        assert_eq!(split(500, None), [(0, 500)]);
        assert_eq!(split(0, None), [(0, 0)]);
        assert_eq!(split(0, Some(100)), [(0, 0)]);
        assert_eq!(split(65_000, Some(1)).len(), 65_000);
    }

    #[test]
    fn addresses_round_trip_and_mapped_v4_comes_back_plain() {
        let mut s = zeroed();
        let v4: SocketAddr = "10.1.2.3:4791".parse().unwrap();
        let (len, family) = encode_addr(v4, false, &mut s).unwrap();
        assert_eq!((decode_addr(&s, len), family), (Some(v4), Family::V4));
        let (len, family) = encode_addr(v4, true, &mut s).unwrap();
        assert_eq!((decode_addr(&s, len), family), (Some(v4), Family::V4));
        let v6: SocketAddr = "[fd00::1]:4791".parse().unwrap();
        let (len, family) = encode_addr(v6, true, &mut s).unwrap();
        assert_eq!((decode_addr(&s, len), family), (Some(v6), Family::V6));
        assert_eq!(encode_addr(v6, false, &mut s), None);
        assert_eq!(decode_addr_bytes(&[0u8; 3]), None);
    }
}
