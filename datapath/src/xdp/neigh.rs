//! Next-hop MAC addresses for transmit, from the kernel's own tables over rtnetlink.
//!
//! AF_XDP frames bypass the kernel's neighbour subsystem, so the datapath asks it instead:
//! `RTM_GETROUTE` for the destination (as `ip route get` does) gives the output interface and
//! the gateway, if any; `RTM_GETNEIGH` for the next hop (as `ip neigh get` does) gives its
//! MAC. When the kernel has no entry yet, an empty UDP datagram to the next hop through a
//! normal socket makes it resolve one (ARP), and the lookup is retried briefly. Results are
//! cached per destination and re-checked every [`NEIGH_REFRESH_NS`]; an entry the kernel holds
//! as STALE (our frames never confirm it) is poked again so the kernel re-validates it.
//!
//! The netlink socket is opened at bind time, so every query reaches the network namespace
//! the datapath was bound in, whichever thread later sends.

use std::collections::HashMap;
use std::io;
use std::mem;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::frame::Mac;

/// How long a cached MAC is used before the kernel's tables are asked again.
pub(super) const NEIGH_REFRESH_NS: u64 = 5_000_000_000;
/// How long the first lookup of a destination waits for ARP to finish.
pub(super) const NEIGH_RESOLVE_NS_MAX: u64 = 100_000_000;
/// How long a destination that could not be resolved is dropped before asking again.
pub(super) const NEIGH_RETRY_NS: u64 = 200_000_000;
/// The most destinations cached.
pub(super) const NEIGH_ENTRIES_MAX: usize = 4096;
/// The port the resolution trigger is sent to (discard).
const POKE_PORT: u16 = 9;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const RTN_UNICAST: u8 = 1;
/// Neighbour states with a usable link-layer address.
const NUD_USABLE: u16 = 0x02 /* REACHABLE */
    | 0x04 /* STALE */
    | 0x08 /* DELAY */
    | 0x10 /* PROBE */
    | 0x40 /* NOARP */
    | 0x80 /* PERMANENT */;
const NUD_STALE: u16 = 0x04;
const NLMSG_HDR: usize = 16;
const RECV_BUF: usize = 16 * 1024;

/// Where the kernel routes a destination.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Route {
    /// `rtm_type`: unicast, local, broadcast, unreachable, ...
    kind: u8,
    oif: u32,
    gateway: Option<Ipv4Addr>,
}

/// An rtnetlink socket for route and neighbour queries.
#[derive(Debug)]
struct Netlink {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn push_attr(msg: &mut Vec<u8>, kind: u16, data: &[u8]) {
    let len = 4 + data.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(data);
    msg.resize(align4(msg.len()), 0);
}

/// The (type, payload) of each attribute in `data`, stopping at the first malformed one.
fn attrs(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes([*data.first()?, *data.get(1)?]));
        let kind = u16::from_ne_bytes([*data.get(2)?, *data.get(3)?]);
        if len < 4 || len > data.len() {
            return None;
        }
        let payload = &data[4..len];
        data = data.get(align4(len)..).unwrap_or(&[]);
        Some((kind & 0x3fff, payload))
    })
}

fn ipv4_of(data: &[u8]) -> Option<Ipv4Addr> {
    let b: [u8; 4] = data.try_into().ok()?;
    Some(Ipv4Addr::from(b))
}

impl Netlink {
    fn open() -> io::Result<Netlink> {
        // SAFETY: plain socket syscall; the result is checked and owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                0, /* NETLINK_ROUTE */
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A reply never takes long; a bound on the wait keeps a lost reply from hanging send.
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: passes a pointer to a live timeval and its exact size.
        let r = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast::<libc::c_void>(),
                mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Netlink {
            fd,
            seq: 1,
            buf: vec![0; RECV_BUF],
        })
    }

    /// Sends request `kind` with `body` (family header + attributes) and returns the reply
    /// message's type and payload, or the error the kernel answered with.
    fn request(&mut self, kind: u16, body: &[u8]) -> io::Result<(u16, Vec<u8>)> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut msg = Vec::with_capacity(NLMSG_HDR + body.len());
        msg.extend_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        // SAFETY: sends `msg.len()` bytes from the live buffer `msg`; to the kernel (port 0)
        // by default on an unconnected netlink socket.
        let r = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast::<libc::c_void>(),
                msg.len(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // Replies to earlier requests that timed out may still be queued: skip them.
        for _ in 0..16 {
            // SAFETY: receives at most `buf.len()` bytes into the live buffer `buf`.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast::<libc::c_void>(),
                    self.buf.len(),
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut data = &self.buf[..n as usize];
            while data.len() >= NLMSG_HDR {
                let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
                let mtype = u16::from_ne_bytes([data[4], data[5]]);
                let mseq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
                if len < NLMSG_HDR || len > data.len() {
                    break;
                }
                let payload = &data[NLMSG_HDR..len];
                if mseq == seq {
                    if mtype == NLMSG_ERROR {
                        let code = payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .unwrap_or(-libc::EPROTO);
                        return Err(io::Error::from_raw_os_error(code.saturating_neg()));
                    }
                    if mtype != NLMSG_DONE {
                        return Ok((mtype, payload.to_vec()));
                    }
                }
                data = data.get(align4(len)..).unwrap_or(&[]);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no netlink reply to our request",
        ))
    }

    /// The route the kernel would use to reach `dst`.
    fn route(&mut self, dst: Ipv4Addr) -> io::Result<Route> {
        // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
        let mut body = vec![libc::AF_INET as u8, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        push_attr(&mut body, RTA_DST, &dst.octets());
        let (mtype, reply) = self.request(RTM_GETROUTE, &body)?;
        if mtype != RTM_NEWROUTE || reply.len() < 12 {
            return Err(io::Error::other("unexpected netlink route reply"));
        }
        let mut route = Route {
            kind: reply[7],
            oif: 0,
            gateway: None,
        };
        for (kind, data) in attrs(&reply[12..]) {
            match kind {
                RTA_OIF if data.len() == 4 => {
                    route.oif = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
                }
                RTA_GATEWAY => route.gateway = ipv4_of(data),
                _ => {}
            }
        }
        Ok(route)
    }

    /// The kernel's neighbour entry for `ip` on `ifindex`: MAC and NUD state, or `None` if
    /// there is none (or it has no link-layer address yet).
    fn neighbour(&mut self, ifindex: u32, ip: Ipv4Addr) -> io::Result<Option<(Mac, u16)>> {
        // struct ndmsg: family, pad1, pad2 (2), ifindex (4), state (2), flags, type.
        let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
        body.extend_from_slice(&(ifindex as i32).to_ne_bytes());
        body.extend_from_slice(&[0, 0, 0, 0]);
        push_attr(&mut body, NDA_DST, &ip.octets());
        let (mtype, reply) = match self.request(RTM_GETNEIGH, &body) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        if mtype != RTM_NEWNEIGH || reply.len() < 12 {
            return Err(io::Error::other("unexpected netlink neighbour reply"));
        }
        let state = u16::from_ne_bytes([reply[8], reply[9]]);
        let mac = attrs(&reply[12..])
            .find(|(kind, _)| *kind == NDA_LLADDR)
            .and_then(|(_, data)| <[u8; 6]>::try_from(data).ok());
        Ok(mac.map(|m| (m, state)))
    }
}

#[derive(Copy, Clone, Debug)]
enum Entry {
    Known { mac: Mac, checked: u64 },
    Unknown { retry_at: u64 },
}

/// What one query of the kernel's tables found.
enum Found {
    /// A usable MAC, its NUD state and the next hop it belongs to.
    Mac(Mac, u16, Ipv4Addr),
    /// Routed through our interface, but no usable neighbour entry for this next hop yet.
    Pending(Ipv4Addr),
    /// Not reachable through our interface (no route, another interface, a local or
    /// broadcast address).
    Unroutable,
}

#[derive(Debug)]
struct Inner {
    nl: Netlink,
    cache: HashMap<Ipv4Addr, Entry>,
}

/// The next-hop MAC cache of one datapath.
#[derive(Debug)]
pub(super) struct Neighbours {
    ifindex: u32,
    inner: Mutex<Inner>,
}

impl Neighbours {
    /// Opens the netlink socket (in the calling thread's network namespace).
    pub(super) fn new(ifindex: u32) -> io::Result<Neighbours> {
        Ok(Neighbours {
            ifindex,
            inner: Mutex::new(Inner {
                nl: Netlink::open()?,
                cache: HashMap::new(),
            }),
        })
    }

    /// Fills `out[i]` with the MAC to send `dests[i]` to (`None`: unreachable for now).
    /// `poke` is a UDP socket in the datapath's namespace, used to make the kernel resolve
    /// a next hop it has no entry for. May block up to [`NEIGH_RESOLVE_NS_MAX`] per new
    /// destination.
    pub(super) fn resolve(
        &self,
        dests: &[Option<Ipv4Addr>],
        out: &mut [Option<Mac>],
        poke: &socket2::Socket,
    ) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut last: Option<(Ipv4Addr, Option<Mac>)> = None;
        for (dest, slot) in dests.iter().zip(out.iter_mut()) {
            let Some(ip) = *dest else {
                *slot = None;
                continue;
            };
            if let Some((lip, lmac)) = last
                && lip == ip
            {
                *slot = lmac;
                continue;
            }
            let mac = self.lookup(&mut inner, ip, poke);
            last = Some((ip, mac));
            *slot = mac;
        }
    }

    fn lookup(&self, inner: &mut Inner, ip: Ipv4Addr, poke: &socket2::Socket) -> Option<Mac> {
        // The coarse clock, much cheaper than the precise one (this runs for every send); its
        // ticks of a few ms are nothing against the intervals it times.
        let now = crate::sys::coarse_monotonic_ns()
            .or_else(crate::sys::monotonic_ns)
            .unwrap_or(0);
        match inner.cache.get(&ip).copied() {
            Some(Entry::Known { mac, checked })
                if now.saturating_sub(checked) < NEIGH_REFRESH_NS =>
            {
                Some(mac)
            }
            Some(Entry::Known { mac, .. }) => {
                // Refresh without blocking; keep the old MAC if the kernel lost the entry.
                let mac = match self.query(&mut inner.nl, ip) {
                    Found::Mac(fresh, state, hop) => {
                        if state & NUD_STALE != 0 {
                            poke_hop(poke, hop);
                        }
                        fresh
                    }
                    Found::Pending(hop) => {
                        poke_hop(poke, hop);
                        mac
                    }
                    Found::Unroutable => mac,
                };
                inner.cache.insert(ip, Entry::Known { mac, checked: now });
                Some(mac)
            }
            Some(Entry::Unknown { retry_at }) if now < retry_at => None,
            Some(Entry::Unknown { .. }) => {
                let found = self.query(&mut inner.nl, ip);
                if let Found::Pending(hop) = found {
                    poke_hop(poke, hop);
                }
                self.remember(inner, ip, found, now)
            }
            None => {
                let found = self.resolve_blocking(&mut inner.nl, ip, poke);
                self.remember(inner, ip, found, now)
            }
        }
    }

    fn remember(&self, inner: &mut Inner, ip: Ipv4Addr, found: Found, now: u64) -> Option<Mac> {
        if inner.cache.len() >= NEIGH_ENTRIES_MAX && !inner.cache.contains_key(&ip) {
            inner.cache.retain(|_, e| matches!(e, Entry::Known { .. }));
            if inner.cache.len() >= NEIGH_ENTRIES_MAX {
                inner.cache.clear();
            }
        }
        let (entry, mac) = match found {
            Found::Mac(mac, _, _) => (Entry::Known { mac, checked: now }, Some(mac)),
            Found::Pending(_) | Found::Unroutable => (
                Entry::Unknown {
                    retry_at: now.saturating_add(NEIGH_RETRY_NS),
                },
                None,
            ),
        };
        inner.cache.insert(ip, entry);
        mac
    }

    /// One look at the kernel's route and neighbour tables.
    fn query(&self, nl: &mut Netlink, ip: Ipv4Addr) -> Found {
        let Ok(route) = nl.route(ip) else {
            return Found::Unroutable;
        };
        if route.kind != RTN_UNICAST || route.oif != self.ifindex {
            return Found::Unroutable;
        }
        let hop = route.gateway.unwrap_or(ip);
        match nl.neighbour(self.ifindex, hop) {
            Ok(Some((mac, state))) if state & NUD_USABLE != 0 => Found::Mac(mac, state, hop),
            _ => Found::Pending(hop),
        }
    }

    /// Queries, triggers resolution if needed, and retries for up to
    /// [`NEIGH_RESOLVE_NS_MAX`].
    fn resolve_blocking(&self, nl: &mut Netlink, ip: Ipv4Addr, poke: &socket2::Socket) -> Found {
        let start = Instant::now();
        let mut poked = false;
        let mut pause = Duration::from_micros(50);
        loop {
            match self.query(nl, ip) {
                Found::Pending(hop) => {
                    if !poked {
                        poke_hop(poke, hop);
                        poked = true;
                    }
                    if start.elapsed() >= Duration::from_nanos(NEIGH_RESOLVE_NS_MAX) {
                        return Found::Pending(hop);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
                found => return found,
            }
        }
    }
}

/// Sends an empty UDP datagram to `hop`, which makes the kernel resolve (or re-validate) its
/// neighbour entry.
fn poke_hop(socket: &socket2::Socket, hop: Ipv4Addr) {
    let to = SocketAddr::V4(SocketAddrV4::new(hop, POKE_PORT));
    let _ = socket.send_to(&[], &to.into());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_parse_and_stop_at_garbage() {
        let mut msg = Vec::new();
        push_attr(&mut msg, RTA_OIF, &7u32.to_ne_bytes());
        push_attr(&mut msg, RTA_GATEWAY, &[10, 0, 0, 1]);
        push_attr(&mut msg, 99, &[1, 2, 3]);
        let all: Vec<(u16, Vec<u8>)> = attrs(&msg).map(|(k, d)| (k, d.to_vec())).collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[1], (RTA_GATEWAY, vec![10, 0, 0, 1]));
        assert_eq!(all[2].1, vec![1, 2, 3]);
        // Truncated or zero-length attributes end the walk instead of panicking.
        for cut in 0..msg.len() {
            let _ = attrs(&msg[..cut]).count();
        }
        assert_eq!(attrs(&[0, 0, 1, 0, 9, 9]).count(), 0);
    }

    /// The kernel answers route and neighbour queries for loopback in any namespace.
    #[test]
    fn loopback_routes_are_local_not_ours() {
        let Ok(mut nl) = Netlink::open() else {
            return;
        };
        let route = nl.route(Ipv4Addr::LOCALHOST).expect("route get 127.0.0.1");
        assert_ne!(route.kind, RTN_UNICAST, "127.0.0.1 is a local route");
    }
}
