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
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::sys::{self, EventFd, RecvMmsg, SendMmsg};
use crate::{Datapath, MAX_DATAGRAM, RecvBatch, Transmit};

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
    wake_fd: EventFd,
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
        let wake_fd = EventFd::new()?;
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
        let mut scratch = SendMmsg::<SEND_CHUNK, SEND_CONTROL_BYTES>::new();
        let mut sent = 0;
        let mut blocked_since: Option<Instant> = None;
        while sent < batch.len() {
            let rest = &batch[sent..];
            // The leading run that shares the first datagram's path and can be addressed
            // from this socket family, at most SEND_CHUNK long.
            scratch.clear();
            for t in rest {
                if t.path != rest[0].path || !scratch.push(t.dest, self.ipv6, t.contents, t.ecn) {
                    break;
                }
            }
            if scratch.len() == 0 {
                // The first datagram cannot be addressed from this socket family.
                sent += 1;
                continue;
            }
            let fd = self.socket_for(rest[0].path).as_raw_fd();
            let code = match scratch.send(fd) {
                Ok(r) if r > 0 => {
                    sent += r;
                    continue;
                }
                Ok(_) => libc::EAGAIN,
                Err(e) => e.raw_os_error().unwrap_or(0),
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
                    let _ = sys::poll(&mut fds, Some(limit - waited));
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
        match sys::poll(&mut fds, timeout) {
            Ok(0) => return Ok(0),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
            Err(e) => return Err(e),
        }
        if fds[1].revents != 0 {
            self.wake_fd.drain();
        }
        if fds[0].revents == 0 || batch.bufs.is_empty() {
            return Ok(0);
        }
        self.recv_ready(batch)
    }

    fn wake(&self) {
        self.wake_fd.signal();
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
