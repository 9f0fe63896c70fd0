//! The plain UDP socket backend: no privileges, works on any Linux machine.
//!
//! What it does not do: GSO/GRO, zero-copy, pacing, or any protocol logic. It moves datagrams.
//!
//! One [`UdpDatapath`] owns `paths` sockets. Path 0 is bound to the configured local address
//! and is the only one read from; paths `1..paths` are bound to the same IP with ephemeral
//! ports and only send, so each path leaves with its own UDP source port (the entropy that
//! ECMP switches hash on). Sends go out with `sendmmsg`, one call per run of consecutive
//! datagrams on the same path; receives use `poll` then `recvmmsg`. ECN is set per datagram
//! with an `IP_TOS`/`IPV6_TCLASS` control message and read back through `IP_RECVTOS`/
//! `IPV6_RECVTCLASS`.

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::{Datapath, Ecn, MAX_DATAGRAM, RecvBatch, RecvMeta, Transmit};

/// The most paths (sockets, source ports) one datapath opens.
pub const MAX_PATHS: u16 = 256;

/// Default largest payload on IPv4: a 1500-byte MTU minus 20 (IPv4) and 8 (UDP) bytes.
pub const DEFAULT_MAX_PAYLOAD_V4: usize = 1472;

/// Default largest payload on IPv6: a 1500-byte MTU minus 40 (IPv6) and 8 (UDP) bytes.
pub const DEFAULT_MAX_PAYLOAD_V6: usize = 1452;

/// Socket buffer size asked for on every socket (the kernel may grant less).
const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// Datagrams handed to one `sendmmsg` call at most.
const SEND_CHUNK: usize = 64;

/// Datagrams taken from one `recvmmsg` call at most.
const RECV_CHUNK: usize = 64;

/// How long one `send` call waits in total for room in a full socket buffer.
pub(crate) const SEND_BLOCK_NS_MAX: u64 = 10_000_000;

/// Bytes of control-message space per received datagram (one TOS or TCLASS message).
const RECV_CONTROL_BYTES: usize = 64;

/// Bytes of control-message space per sent datagram (one TOS or TCLASS message).
const SEND_CONTROL_BYTES: usize = 32;

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
        }
    }
}

/// A [`Datapath`] over plain UDP sockets, one per path.
#[derive(Debug)]
pub struct UdpDatapath {
    /// `sockets[p]` sends path `p`; `sockets[0]` also receives. Never empty.
    sockets: Vec<Socket>,
    /// Where each socket is bound, same indexing as `sockets`.
    addrs: Vec<SocketAddr>,
    /// Written by `wake`, polled and drained by `recv`.
    wake_fd: OwnedFd,
    /// Whether the sockets are IPv6 (possibly dual-stack) sockets.
    ipv6: bool,
    max_payload: usize,
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
        let ipv6 = config.local.is_ipv6();
        let mut sockets = Vec::with_capacity(usize::from(config.paths));
        let mut addrs = Vec::with_capacity(usize::from(config.paths));
        for path in 0..config.paths {
            let bind_to = if path == 0 {
                config.local
            } else {
                SocketAddr::new(config.local.ip(), 0)
            };
            let socket = open_socket(bind_to, path == 0)?;
            let bound = socket
                .local_addr()?
                .as_socket()
                .ok_or_else(|| io::Error::other("bound socket has no IP address"))?;
            sockets.push(socket);
            addrs.push(bound);
        }
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(UdpDatapath {
            sockets,
            addrs,
            wake_fd,
            ipv6,
            max_payload: config.max_payload,
        })
    }

    /// The local address path `path` sends from (its source port), or `None` if this
    /// datapath has no such path.
    pub fn path_local_addr(&self, path: u16) -> Option<SocketAddr> {
        self.addrs.get(usize::from(path)).copied()
    }

    /// The socket for `path`; out-of-range paths wrap around (`path % paths`).
    fn socket_for(&self, path: u16) -> &Socket {
        let index = usize::from(path) % self.sockets.len();
        &self.sockets[index]
    }

    /// Receives ready datagrams into `batch` without waiting. Returns how many were kept.
    fn recv_ready(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let fd = self.sockets[0].as_raw_fd();
        let slots = batch.bufs.len();
        let mut scratch = RecvScratch::new();
        // Every round either fills slots or finds the socket drained; the extra rounds
        // absorb truncated datagrams and soft errors.
        let rounds_max = slots.div_ceil(RECV_CHUNK) + 4;
        for _ in 0..rounds_max {
            let start = batch.metas.len();
            if start >= slots {
                break;
            }
            let want = (slots - start).min(RECV_CHUNK);
            scratch.prepare(&mut batch.bufs[start..start + want]);
            // SAFETY: `prepare` pointed `want` headers at live iovecs, address storage and
            // control buffers inside `scratch`, and the iovecs at `want` distinct buffers
            // of `batch.bufs`; none of them moves or is freed until this call returns.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    scratch.hdrs.as_mut_ptr(),
                    want as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::EINTR) => continue,
                    Some(code) if is_per_datagram_error(code) => continue,
                    _ if batch.metas.is_empty() => return Err(err),
                    _ => break,
                }
            }
            let n = n as usize;
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

    /// Drains the wake-up counter.
    fn drain_wake(&self) {
        let mut value = 0u64;
        // SAFETY: reads at most 8 bytes into `value`, which is 8 bytes long and live.
        let _ = unsafe {
            libc::read(
                self.wake_fd.as_raw_fd(),
                (&mut value as *mut u64).cast::<libc::c_void>(),
                mem::size_of::<u64>(),
            )
        };
    }
}

impl Datapath for UdpDatapath {
    fn kind(&self) -> &'static str {
        "udp"
    }

    fn local_addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    fn paths(&self) -> u16 {
        // `bind` opens 1..=MAX_PATHS sockets.
        u16::try_from(self.sockets.len()).unwrap_or(MAX_PATHS)
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
        let mut scratch = SendScratch::new();
        let mut sent = 0;
        let mut blocked_since: Option<Instant> = None;
        while sent < batch.len() {
            let rest = &batch[sent..];
            let n = scratch.prepare(rest, self.ipv6);
            if n == 0 {
                // The first datagram cannot be addressed from this socket family.
                sent += 1;
                continue;
            }
            let fd = self.socket_for(rest[0].path).as_raw_fd();
            // SAFETY: `prepare` filled `n` headers pointing at live iovecs, addresses and
            // control buffers inside `scratch` and at the payloads borrowed by `batch`; the
            // kernel only reads them, and nothing moves until the call returns.
            let r = unsafe { libc::sendmmsg(fd, scratch.hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
            if r > 0 {
                sent += r as usize;
                continue;
            }
            let code = if r == 0 {
                libc::EAGAIN
            } else {
                io::Error::last_os_error().raw_os_error().unwrap_or(0)
            };
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
                    let mut fds = [libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    }];
                    // EINTR or a timeout lands back here and is handled by the next round.
                    let _ = poll(&mut fds, Some(limit - waited));
                }
                code if is_per_datagram_error(code) => sent += 1,
                _ if sent > 0 => return Ok(sent),
                code => return Err(io::Error::from_raw_os_error(code)),
            }
        }
        Ok(sent)
    }

    /// Waits for the path-0 socket or a [`wake`](Datapath::wake), then receives up to
    /// `batch.bufs.len()` datagrams. Datagrams longer than their buffer are dropped.
    fn recv(&self, batch: &mut RecvBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.metas.clear();
        let mut fds = [
            libc::pollfd {
                fd: self.sockets[0].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake_fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        match poll(&mut fds, timeout) {
            Ok(0) => return Ok(0),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
            Err(e) => return Err(e),
        }
        if fds[1].revents != 0 {
            self.drain_wake();
        }
        if fds[0].revents == 0 || batch.bufs.is_empty() {
            return Ok(0);
        }
        self.recv_ready(batch)
    }

    fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes the 8 bytes of `one`, which is live for the call. A full counter
        // (EAGAIN) means a wake-up is already pending, so the result can be ignored.
        let _ = unsafe {
            libc::write(
                self.wake_fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                mem::size_of::<u64>(),
            )
        };
    }
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
        // SAFETY: passes a pointer to a live c_int and its exact size.
        let _ = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&value as *const libc::c_int).cast::<libc::c_void>(),
                mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if current_buffer(socket.as_raw_fd(), opt) >= SOCKET_BUFFER_BYTES {
            return;
        }
    }
}

/// The socket buffer size the kernel granted for `opt` (it reports double the request).
fn current_buffer(fd: RawFd, opt: libc::c_int) -> usize {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live and `len` holds the size of `value`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut value as *mut libc::c_int).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if r == 0 {
        usize::try_from(value).unwrap_or(0)
    } else {
        0
    }
}

/// `ppoll` on `fds` for up to `timeout` (forever if `None`); returns the number of ready
/// descriptors.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: t.subsec_nanos() as libc::c_long,
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

/// Whether a destination goes out as IPv4 (TOS) or IPv6 (traffic class).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
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
        // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr type.
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
    // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr type.
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
            // SAFETY: the family says the storage holds a sockaddr_in, and it is aligned.
            let sin =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6, and it is aligned.
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

/// Control-message space, aligned for `cmsghdr`.
#[derive(Copy, Clone)]
#[repr(C, align(8))]
pub(crate) struct Control<const N: usize>(pub(crate) [u8; N]);

/// The arrays one `sendmmsg` call points into. Lives on the stack of one `send` call, so
/// concurrent senders share nothing.
struct SendScratch {
    hdrs: [libc::mmsghdr; SEND_CHUNK],
    iovs: [libc::iovec; SEND_CHUNK],
    addrs: [libc::sockaddr_storage; SEND_CHUNK],
    control: [Control<SEND_CONTROL_BYTES>; SEND_CHUNK],
}

impl SendScratch {
    fn new() -> Self {
        // SAFETY: every field is a C struct (or byte array) of integers and raw pointers,
        // for which all-zero bytes are a valid value.
        unsafe { MaybeUninit::<SendScratch>::zeroed().assume_init() }
    }

    /// Fills headers for the leading run of `batch` that shares the first datagram's path
    /// and can be addressed from this socket family, at most [`SEND_CHUNK`] long. Returns
    /// the run length (0 if the first datagram cannot be addressed).
    fn prepare(&mut self, batch: &[Transmit<'_>], ipv6_socket: bool) -> usize {
        let Some(first) = batch.first() else { return 0 };
        let mut n = 0;
        for t in batch.iter().take(SEND_CHUNK) {
            if t.path != first.path {
                break;
            }
            let Some((addr_len, family)) = encode_addr(t.dest, ipv6_socket, &mut self.addrs[n])
            else {
                break;
            };
            self.iovs[n] = libc::iovec {
                iov_base: t.contents.as_ptr() as *mut libc::c_void,
                iov_len: t.contents.len(),
            };
            // SAFETY: msghdr is plain integers and pointers; all-zero is valid.
            let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
            hdr.msg_name = (&mut self.addrs[n] as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = addr_len;
            hdr.msg_iov = &mut self.iovs[n];
            hdr.msg_iovlen = 1;
            if t.ecn != Ecn::NotEct {
                hdr.msg_control = self.control[n].0.as_mut_ptr().cast();
                hdr.msg_controllen = SEND_CONTROL_BYTES as _;
                let (level, kind) = match family {
                    Family::V4 => (libc::IPPROTO_IP, libc::IP_TOS),
                    Family::V6 => (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
                };
                let value = libc::c_int::from(t.ecn.to_bits());
                // SAFETY: `hdr` points at a zeroed, cmsghdr-aligned control buffer of
                // SEND_CONTROL_BYTES, which holds CMSG_SPACE(sizeof(int)) = 24 bytes, so
                // CMSG_FIRSTHDR is non-null and the header and int fit inside it.
                unsafe {
                    let cmsg = libc::CMSG_FIRSTHDR(&hdr);
                    (*cmsg).cmsg_level = level;
                    (*cmsg).cmsg_type = kind;
                    (*cmsg).cmsg_len = libc::CMSG_LEN(mem::size_of::<libc::c_int>() as u32) as _;
                    libc::CMSG_DATA(cmsg)
                        .cast::<libc::c_int>()
                        .write_unaligned(value);
                    hdr.msg_controllen =
                        libc::CMSG_SPACE(mem::size_of::<libc::c_int>() as u32) as _;
                }
            }
            self.hdrs[n] = libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            };
            n += 1;
        }
        n
    }
}

/// The arrays one `recvmmsg` call points into.
struct RecvScratch {
    hdrs: [libc::mmsghdr; RECV_CHUNK],
    iovs: [libc::iovec; RECV_CHUNK],
    addrs: [libc::sockaddr_storage; RECV_CHUNK],
    control: [Control<RECV_CONTROL_BYTES>; RECV_CHUNK],
}

impl RecvScratch {
    fn new() -> Self {
        // SAFETY: every field is a C struct (or byte array) of integers and raw pointers,
        // for which all-zero bytes are a valid value.
        unsafe { MaybeUninit::<RecvScratch>::zeroed().assume_init() }
    }

    /// Points the first `bufs.len()` (at most [`RECV_CHUNK`]) headers at `bufs`.
    fn prepare(&mut self, bufs: &mut [Box<[u8]>]) {
        for (i, buf) in bufs.iter_mut().take(RECV_CHUNK).enumerate() {
            self.iovs[i] = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: msghdr is plain integers and pointers; all-zero is valid.
            let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
            hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_iov = &mut self.iovs[i];
            hdr.msg_iovlen = 1;
            hdr.msg_control = self.control[i].0.as_mut_ptr().cast();
            hdr.msg_controllen = RECV_CONTROL_BYTES as _;
            self.hdrs[i] = libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            };
        }
    }

    /// The metadata of received datagram `i`, or `None` if it is to be dropped (truncated,
    /// or from an address family we do not know).
    fn meta(&self, i: usize) -> Option<RecvMeta> {
        let m = self.hdrs.get(i)?;
        if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return None;
        }
        let src = decode_addr(&self.addrs[i], m.msg_hdr.msg_namelen)?;
        Some(RecvMeta {
            src,
            len: m.msg_len as usize,
            ecn: read_ecn(&m.msg_hdr),
        })
    }
}

/// The ECN codepoint from the TOS/TCLASS control message of a received datagram.
pub(crate) fn read_ecn(hdr: &libc::msghdr) -> Ecn {
    let mut ecn = Ecn::NotEct;
    if hdr.msg_control.is_null() || hdr.msg_flags & libc::MSG_CTRUNC != 0 {
        return ecn;
    }
    // SAFETY: the kernel filled `msg_control` with `msg_controllen` bytes of well-formed
    // control messages; CMSG_FIRSTHDR/CMSG_NXTHDR stay within that length and return null
    // at its end, and each data read stays within the message's `cmsg_len`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            let c = &*cmsg;
            let data = libc::CMSG_DATA(cmsg);
            let data_len = (c.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            match (c.cmsg_level, c.cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) if data_len >= 1 => {
                    ecn = Ecn::from_tos(data.read());
                }
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
                    if data_len >= mem::size_of::<libc::c_int>() =>
                {
                    let tclass = data.cast::<libc::c_int>().read_unaligned();
                    ecn = Ecn::from_tos(tclass as u8);
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    ecn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{self, Backend, recv_all, send_all};

    impl Backend for UdpDatapath {
        const KIND: &'static str = "udp";
        fn bind(config: UdpConfig) -> io::Result<Self> {
            UdpDatapath::bind(config)
        }
        fn source_of(&self, path: u16) -> Option<SocketAddr> {
            self.path_local_addr(path)
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
