//! `udp-blast`: the kernel's own UDP ceiling on a link, the reference for Braid's bandwidth and
//! message rate over UDP sockets.
//!
//! `udp-blast recv --bind ADDR [--gro] [--json]` discards every datagram it receives on one
//! socket (with `--gro`, the kernel coalesces them into `UDP_GRO` buffers, split here by their
//! segment size only to count them) and, once the sender has been silent for `--idle` seconds,
//! reports what arrived between the first and the last datagram.
//!
//! `udp-blast send ADDR [--burst 11] [--segment 1472] [--ports 16] [--mmsg 1] [--duration 3]`
//! sends for `--duration` seconds, round-robin over `--ports` connected sockets (one source
//! port each, as Braid's paths): every send is one `UDP_SEGMENT` (GSO) buffer of `--burst`
//! equal datagrams of `--segment` bytes (`--burst 1`: one plain datagram per send, no GSO),
//! `--mmsg` sends per `sendmmsg` call. The message-rate reference is `--segment 8 --burst 1
//! --mmsg 64`: 8-byte datagrams, 64 per system call.
//!
//! Both sides print one JSON object with `--json`: datagrams, payload bytes, seconds, Gbit/s
//! of UDP payload and datagrams per second. The receiver's figures are the ceiling (what was
//! delivered); the sender's include what the kernel dropped on the way.
//!
//! `--pack BYTES` (send) and `--place BYTES` (recv) add the work on the payload that a
//! transport over UDP sockets cannot skip, done the way Braid's engine does it: the sender
//! gathers each datagram from a registered region of BYTES in one pass with its CRC32C
//! (`Region::read_crc`, the CRC in the datagram's last 4 bytes), and the receiver checks
//! each datagram's CRC32C and then copies it to its place in a region of BYTES
//! (`Region::write`), walking each region in order. That is the ceiling for Braid's UDP
//! datapath with no protocol at all: the kernel's path plus the one copy and one check on
//! each side. `--in-place` (with `--pack`) sends without the gather: each datagram's CRC32C
//! is read where its payload lies, and the kernel gets iovecs pointing into the region (two
//! per datagram), so the only copy on the sender's side is the kernel's.
use std::io;
use std::mem;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::proto::Region;

use clap::{Parser, Subcommand};
use serde::Serialize;

/// The most datagrams one GSO buffer may hold (`UDP_MAX_SEGMENTS` in the kernel).
const MAX_BURST: usize = 64;

/// The largest UDP payload of one send (65535 minus the IPv4 and UDP headers).
const MAX_SEND_BYTES: usize = 65_507;

/// The most sends per `sendmmsg` call (and buffers per `recvmmsg` call).
const MAX_MMSG: usize = 256;

/// Receive buffers per `recvmmsg` call.
const RX_BUFFERS: usize = 32;

/// Bytes of one receive buffer: a whole GRO buffer (up to 64 KiB) fits.
const RX_BUFFER_BYTES: usize = 65_536;

/// Socket buffer sizes asked for (with `SO_*BUFFORCE` as root, else capped by the sysctls).
const SOCKET_BUFFER_BYTES: usize = 16 << 20;

#[derive(Parser)]
#[command(
    name = "udp-blast",
    about = "kernel UDP bandwidth / datagram-rate ceiling"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Count and discard datagrams; report after the sender went quiet.
    Recv {
        /// Address to bind.
        #[arg(long, default_value = "127.0.0.1:18700")]
        bind: SocketAddr,
        /// Ask for `UDP_GRO` (coalesced receive buffers).
        #[arg(long)]
        gro: bool,
        /// Seconds of silence after which the run is over.
        #[arg(long, default_value_t = 1.0)]
        idle: f64,
        /// Seconds to wait for the first datagram before giving up.
        #[arg(long, default_value_t = 120.0)]
        first_wait: f64,
        /// Check each datagram's CRC32C and copy it into a region of this many bytes (K, M,
        /// G), in order; without it the receiver discards (the kernel's own ceiling).
        #[arg(long, value_parser = braid_bench::parse_size)]
        place: Option<u64>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Blast datagrams at a receiver.
    Send {
        /// Receiver address.
        target: SocketAddr,
        /// Datagrams per send (one GSO buffer); 1 sends plain datagrams without GSO.
        #[arg(long, default_value_t = 11)]
        burst: usize,
        /// UDP payload bytes of each datagram.
        #[arg(long, default_value_t = 1472)]
        segment: usize,
        /// Connected sockets (source ports) used round-robin.
        #[arg(long, default_value_t = 16)]
        ports: usize,
        /// Sends per `sendmmsg` call (all on one socket).
        #[arg(long, default_value_t = 1)]
        mmsg: usize,
        /// Seconds to send.
        #[arg(long, default_value_t = 3.0)]
        duration: f64,
        /// Gather each datagram from a region of this many bytes (K, M, G), in order, with
        /// its CRC32C in one pass; without it every send is one fixed buffer (the kernel's own
        /// ceiling).
        #[arg(long, value_parser = braid_bench::parse_size)]
        pack: Option<u64>,
        /// With `--pack`: leave each datagram's payload in the region and hand the kernel
        /// iovecs pointing at it (the CRC32C is read in place), instead of gathering it.
        #[arg(long, requires = "pack")]
        in_place: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Serialize)]
struct Report {
    test: &'static str,
    /// Receiver: whether `UDP_GRO` was on. Sender: whether `UDP_SEGMENT` was used.
    offload: bool,
    /// Datagrams per send (sender) or the largest GRO buffer's segment count (receiver).
    burst: usize,
    segment: usize,
    ports: usize,
    mmsg: usize,
    /// Sender: the bytes of the region each datagram was gathered from (`--pack`).
    /// Receiver: the bytes of the region each datagram was checked and placed into
    /// (`--place`). 0: neither.
    region: u64,
    /// Receiver: datagrams whose CRC32C did not match (not placed).
    crc_errors: u64,
    datagrams: u64,
    bytes: u64,
    /// System calls that moved data.
    syscalls: u64,
    /// Sender: sends refused with ENOBUFS/EAGAIN/ECONNREFUSED (retried).
    send_errors: u64,
    seconds: f64,
    gbps: f64,
    datagrams_per_s: f64,
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// `setsockopt(fd, level, name, &value)` for an `int` option.
fn set_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` lives across the call and the length passed is its size; the kernel
    // only reads that many bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Large socket buffers: the forced variant needs CAP_NET_ADMIN, the plain one is capped by
/// `net.core.[rw]mem_max`.
fn grow_buffers(sock: &UdpSocket, recv: bool) {
    let fd = sock.as_raw_fd();
    let (force, plain) = if recv {
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF)
    } else {
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)
    };
    let bytes = SOCKET_BUFFER_BYTES as i32;
    if set_int(fd, libc::SOL_SOCKET, force, bytes).is_err() {
        let _ = set_int(fd, libc::SOL_SOCKET, plain, bytes);
    }
}

fn rate(datagrams: u64, bytes: u64, seconds: f64) -> (f64, f64) {
    if seconds > 0.0 {
        (
            bytes as f64 * 8.0 / seconds / 1e9,
            datagrams as f64 / seconds,
        )
    } else {
        (0.0, 0.0)
    }
}

/// What a transport over UDP must do with the payload on each side (`--pack`, `--place`): a
/// region walked in order, one datagram after the other.
struct Payload {
    region: Arc<Region>,
    at: usize,
}

impl Payload {
    fn new(bytes: Option<u64>, segment: usize) -> Result<Option<Payload>, String> {
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let bytes = usize::try_from(bytes).map_err(|e| e.to_string())?;
        if bytes < segment || segment <= CRC_BYTES {
            return Err(format!(
                "the region must hold a datagram, and a datagram more than its {CRC_BYTES}-byte CRC"
            ));
        }
        let region = Region::new(bytes);
        region
            .fill(0, bytes as u64, 0xA5)
            .map_err(|e| format!("region: {e:?}"))?;
        Ok(Some(Payload { region, at: 0 }))
    }

    /// The next `len` bytes of the region (wrapping to its start).
    fn next(&mut self, len: usize) -> u64 {
        if self.at + len > self.region.len() {
            self.at = 0;
        }
        let at = self.at;
        self.at += len;
        at as u64
    }

    /// The sender's gather: the datagram's payload from the region, its CRC32C computed in
    /// the same pass and put in its last bytes.
    fn pack(&mut self, datagram: &mut [u8]) {
        let (body, crc) = datagram.split_at_mut(datagram.len() - CRC_BYTES);
        let at = self.next(body.len());
        let c = self.region.read_crc(at, body, 0).unwrap_or(0);
        crc.copy_from_slice(&c.to_le_bytes());
    }

    /// The sender's side without the gather: `burst` datagrams of `segment` bytes sent as
    /// one GSO buffer of iovecs, each datagram's payload where it lies in the region and its
    /// CRC32C (read in place) in `crcs`. 1 if sent, -1 on error (errno set).
    fn send_in_place(
        &mut self,
        fd: i32,
        burst: usize,
        segment: usize,
        crcs: &mut [[u8; CRC_BYTES]],
        iovs: &mut Vec<libc::iovec>,
    ) -> i32 {
        let body = segment - CRC_BYTES;
        iovs.clear();
        for crc in crcs.iter_mut().take(burst) {
            let at = self.next(body);
            *crc = self.region.crc(at, body, 0).unwrap_or(0).to_le_bytes();
            iovs.push(libc::iovec {
                // SAFETY: `next` keeps `at + body` within the region.
                iov_base: unsafe { self.region.as_ptr().add(at as usize) }.cast(),
                iov_len: body,
            });
            iovs.push(libc::iovec {
                iov_base: crc.as_mut_ptr().cast(),
                iov_len: CRC_BYTES,
            });
        }
        // SAFETY: all-zero is a valid `msghdr`; the iovecs point at the region (live in
        // `self`) and at `crcs`, both outliving the call; the kernel only reads them.
        let r = unsafe {
            let mut m: libc::msghdr = mem::zeroed();
            m.msg_iov = iovs.as_mut_ptr();
            m.msg_iovlen = iovs.len();
            libc::sendmsg(fd, &m, 0)
        };
        if r < 0 { -1 } else { 1 }
    }

    /// The receiver's placement: check the CRC32C, then copy into the region. False if the
    /// CRC does not match.
    fn place(&mut self, datagram: &[u8]) -> bool {
        if datagram.len() <= CRC_BYTES {
            return false;
        }
        let (body, crc) = datagram.split_at(datagram.len() - CRC_BYTES);
        if braid_crc::crc32c(body).to_le_bytes() != crc {
            return false;
        }
        let at = self.next(body.len());
        self.region.write(at, body).is_ok()
    }
}

/// Bytes of the CRC32C trailer `--pack` writes and `--place` checks.
const CRC_BYTES: usize = 4;

fn recv(
    bind: SocketAddr,
    gro: bool,
    idle: f64,
    first_wait: f64,
    place: Option<u64>,
    json: bool,
) -> Result<Report, String> {
    let (idle, first_wait) = braid_bench::blast::receiver_waits(idle, first_wait)?;
    let mut payload = Payload::new(place, CRC_BYTES + 1)?;
    let sock = UdpSocket::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    let fd = sock.as_raw_fd();
    grow_buffers(&sock, true);
    if gro {
        set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1)
            .map_err(|e| format!("UDP_GRO is not available here: {e}"))?;
    }
    if !json {
        eprintln!(
            "udp-blast: receiving on {bind} (GRO {})",
            if gro { "on" } else { "off" }
        );
    }
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| e.to_string())?;

    let mut bufs = vec![0u8; RX_BUFFERS * RX_BUFFER_BYTES];
    // One control-message area per buffer, room for one `int` message (the GRO size).
    // SAFETY: CMSG_SPACE only computes a size.
    let cmsg_space = unsafe { libc::CMSG_SPACE(mem::size_of::<i32>() as u32) } as usize;
    // u64 elements keep each area aligned for `cmsghdr`.
    let cmsg_words = cmsg_space.div_ceil(8);
    let mut cmsgs = vec![0u64; RX_BUFFERS * cmsg_words];
    let mut iovs: Vec<libc::iovec> = bufs
        .chunks_mut(RX_BUFFER_BYTES)
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: all-zero is a valid `mmsghdr` (null pointers, zero lengths).
    let mut msgs: Vec<libc::mmsghdr> = (0..RX_BUFFERS).map(|_| unsafe { mem::zeroed() }).collect();

    let started_wait = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let (mut datagrams, mut bytes, mut syscalls) = (0u64, 0u64, 0u64);
    let (mut first_datagrams, mut first_bytes) = (0u64, 0u64);
    let mut max_segments = 0usize;
    let mut crc_errors = 0u64;
    loop {
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_iov = &mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = cmsgs[i * cmsg_words..].as_mut_ptr().cast();
            m.msg_hdr.msg_controllen = cmsg_space as _;
            m.msg_hdr.msg_name = std::ptr::null_mut();
            m.msg_hdr.msg_namelen = 0;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
        // SAFETY: every header points at its own iovec (a live, disjoint slice of `bufs`)
        // and its own control area of `cmsg_space` bytes inside `cmsgs`; all outlive the call.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                RX_BUFFERS as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    if first.is_some() && last.elapsed() >= idle {
                        break;
                    }
                    if first.is_none() && started_wait.elapsed() >= first_wait {
                        return Err(format!(
                            "nothing arrived on {bind} for {} s",
                            first_wait.as_secs_f64()
                        ));
                    }
                    continue;
                }
                io::ErrorKind::Interrupted => continue,
                _ => return Err(format!("recvmmsg: {e}")),
            }
        }
        let now = Instant::now();
        syscalls += 1;
        let (mut d, mut b) = (0u64, 0u64);
        for (i, m) in msgs[..n as usize].iter().enumerate() {
            let len = m.msg_len as usize;
            let gso = gro_size(&m.msg_hdr);
            let segs = match gso {
                Some(s) if s > 0 => len.div_ceil(s),
                _ => 1,
            };
            if let Some(p) = &mut payload {
                let data = &bufs[i * RX_BUFFER_BYTES..][..len];
                let seg = gso.filter(|&s| s > 0).unwrap_or(len.max(1));
                for d in data.chunks(seg) {
                    crc_errors += u64::from(!p.place(d));
                }
            }
            max_segments = max_segments.max(segs);
            d += segs as u64;
            b += len as u64;
        }
        datagrams += d;
        bytes += b;
        if first.is_none() {
            first = Some(now);
            first_datagrams = d;
            first_bytes = b;
        }
        last = now;
    }
    // The rate covers what arrived after the first call, over the time since it returned.
    let seconds = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let (gbps, dps) = rate(datagrams - first_datagrams, bytes - first_bytes, seconds);
    Ok(Report {
        test: "udp_blast_recv",
        offload: gro,
        burst: max_segments,
        segment: 0,
        ports: 1,
        mmsg: RX_BUFFERS,
        region: place.unwrap_or(0),
        crc_errors,
        datagrams,
        bytes,
        syscalls,
        send_errors: 0,
        seconds,
        gbps,
        datagrams_per_s: dps,
    })
}

/// The segment size of a `UDP_GRO` control message in `hdr`, if there is one.
fn gro_size(hdr: &libc::msghdr) -> Option<usize> {
    if hdr.msg_controllen == 0 {
        return None;
    }
    // SAFETY: `hdr` was filled by recvmmsg, so its control area holds `msg_controllen`
    // valid bytes; the CMSG_* walk stays inside them, and the `int` payload is read
    // unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
                return usize::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

struct SendArgs {
    target: SocketAddr,
    burst: usize,
    segment: usize,
    ports: usize,
    mmsg: usize,
    duration: f64,
    pack: Option<u64>,
    in_place: bool,
}

fn send(a: SendArgs) -> Result<Report, String> {
    if a.burst == 0 || a.burst > MAX_BURST {
        return Err(format!("--burst must be 1 to {MAX_BURST}"));
    }
    if a.segment == 0 || a.segment * a.burst > MAX_SEND_BYTES {
        return Err(format!(
            "--segment x --burst must be 1 to {MAX_SEND_BYTES} bytes"
        ));
    }
    if a.ports == 0 || a.ports > 1024 {
        return Err("--ports must be 1 to 1024".into());
    }
    if a.mmsg == 0 || a.mmsg > MAX_MMSG {
        return Err(format!("--mmsg must be 1 to {MAX_MMSG}"));
    }
    if !(a.duration > 0.0 && a.duration < 3600.0) {
        return Err("--duration must be between 0 and 3600 seconds".into());
    }
    let gso = a.burst > 1;
    let local: SocketAddr = if a.target.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let mut socks = Vec::with_capacity(a.ports);
    for _ in 0..a.ports {
        let s = UdpSocket::bind(local).map_err(|e| format!("bind: {e}"))?;
        s.connect(a.target)
            .map_err(|e| format!("connect {}: {e}", a.target))?;
        grow_buffers(&s, false);
        if gso {
            set_int(
                s.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_SEGMENT,
                a.segment as i32,
            )
            .map_err(|e| format!("UDP_SEGMENT is not available here: {e}"))?;
        }
        socks.push(s);
    }
    let len = a.burst * a.segment;
    let mut payload = Payload::new(a.pack, a.segment)?;
    if payload.is_some() && a.mmsg > 1 {
        return Err("--pack gathers one buffer per send: use it with --mmsg 1".into());
    }
    let mut buf: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut crcs = vec![[0u8; CRC_BYTES]; a.burst];
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(2 * a.burst);
    // Every message of one sendmmsg sends the same buffer (the receiver discards it).
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: len,
    };
    let mut msgs: Vec<libc::mmsghdr> = (0..a.mmsg)
        .map(|_| {
            // SAFETY: all-zero is a valid `mmsghdr` (null pointers, zero lengths).
            let mut m: libc::mmsghdr = unsafe { mem::zeroed() };
            m.msg_hdr.msg_iov = &mut iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();

    let duration = Duration::from_secs_f64(a.duration);
    let start = Instant::now();
    let (mut sends, mut syscalls, mut errors) = (0u64, 0u64, 0u64);
    let mut next = 0usize;
    while start.elapsed() < duration {
        let fd = socks[next].as_raw_fd();
        next = (next + 1) % socks.len();
        if let (Some(p), false) = (&mut payload, a.in_place) {
            for d in buf.chunks_mut(a.segment) {
                p.pack(d);
            }
        }
        let n = if let (Some(p), true) = (&mut payload, a.in_place) {
            p.send_in_place(fd, a.burst, a.segment, &mut crcs, &mut iovs)
        } else if a.mmsg == 1 {
            // SAFETY: `buf` is live and `len` bytes long; the kernel only reads it.
            let r = unsafe { libc::send(fd, buf.as_ptr().cast(), len, 0) };
            if r < 0 { -1 } else { 1 }
        } else {
            // SAFETY: every header points at `iov`, which points at `buf` (`len` bytes);
            // both outlive the call and the kernel only reads them (and writes msg_len).
            unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), a.mmsg as u32, 0) }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENOBUFS | libc::EAGAIN | libc::ECONNREFUSED | libc::EINTR) => {
                    errors += 1;
                    continue;
                }
                _ => return Err(os_err("send")),
            }
        }
        syscalls += 1;
        sends += n as u64;
    }
    let seconds = start.elapsed().as_secs_f64();
    let datagrams = sends * a.burst as u64;
    let bytes = sends * len as u64;
    let (gbps, dps) = rate(datagrams, bytes, seconds);
    Ok(Report {
        test: "udp_blast_send",
        offload: gso,
        burst: a.burst,
        segment: a.segment,
        ports: a.ports,
        mmsg: a.mmsg,
        region: a.pack.unwrap_or(0),
        crc_errors: 0,
        datagrams,
        bytes,
        syscalls,
        send_errors: errors,
        seconds,
        gbps,
        datagrams_per_s: dps,
    })
}

fn main() -> ExitCode {
    let (res, json) = match Cli::parse().cmd {
        Cmd::Recv {
            bind,
            gro,
            idle,
            first_wait,
            place,
            json,
        } => (recv(bind, gro, idle, first_wait, place, json), json),
        Cmd::Send {
            target,
            burst,
            segment,
            ports,
            mmsg,
            duration,
            pack,
            in_place,
            json,
        } => (
            send(SendArgs {
                target,
                burst,
                segment,
                ports,
                mmsg,
                duration,
                pack,
                in_place,
            }),
            json,
        ),
    };
    braid_bench::blast::finish("udp-blast", res, json, |r| {
        format!(
            "{}: {} datagrams, {} bytes in {:.3} s: {:.2} Gbit/s, {:.0} datagrams/s ({} syscalls, {} send errors)",
            r.test,
            r.datagrams,
            r.bytes,
            r.seconds,
            r.gbps,
            r.datagrams_per_s,
            r.syscalls,
            r.send_errors
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--pack` gathers, `--place` checks and puts in the same order, and a datagram
    /// changed on the way is counted, not placed.
    #[test]
    fn packed_datagrams_are_placed_and_a_changed_one_is_refused() {
        let mut tx = Payload::new(Some(4096), 100).unwrap().unwrap();
        let mut rx = Payload::new(Some(4096), 100).unwrap().unwrap();
        for i in 0..4096u64 {
            tx.region.fill(i, 1, (i * 7 % 251) as u8).unwrap();
        }
        let mut d = [0u8; 100];
        // 96 payload bytes a datagram: 42 of them fill 4032 bytes of each region, in order.
        for _ in 0..42 {
            tx.pack(&mut d);
            assert!(rx.place(&d));
        }
        assert_eq!(
            tx.region.to_vec(0, 4032).unwrap(),
            rx.region.to_vec(0, 4032).unwrap()
        );
        // The next one wraps to the start of the source region; changed, it lands nowhere.
        tx.pack(&mut d);
        d[5] ^= 1;
        let before = rx.region.to_vec(0, 4096).unwrap();
        assert!(!rx.place(&d));
        assert_eq!(rx.region.to_vec(0, 4096).unwrap(), before);
        assert!(!rx.place(&d[..CRC_BYTES]));
        assert!(Payload::new(Some(50), 100).is_err());
        assert!(Payload::new(None, 100).unwrap().is_none());
    }

    /// `--in-place` sends what `--pack` would have gathered: the datagrams of one GSO send,
    /// received on loopback, are placed in order with their CRCs right.
    #[test]
    fn datagrams_sent_in_place_are_placed() {
        let segment = 100;
        let mut tx = Payload::new(Some(4096), segment).unwrap().unwrap();
        let mut rx = Payload::new(Some(4096), segment).unwrap().unwrap();
        for i in 0..4096u64 {
            tx.region.fill(i, 1, (i * 13 % 251) as u8).unwrap();
        }
        let recv = UdpSocket::bind("127.0.0.1:0").unwrap();
        recv.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let send = UdpSocket::bind("127.0.0.1:0").unwrap();
        send.connect(recv.local_addr().unwrap()).unwrap();
        set_int(
            send.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            segment as i32,
        )
        .expect("UDP_SEGMENT on loopback");
        let (burst, rounds) = (4, 3);
        let mut crcs = vec![[0u8; CRC_BYTES]; burst];
        let mut iovs = Vec::new();
        for _ in 0..rounds {
            let r = tx.send_in_place(send.as_raw_fd(), burst, segment, &mut crcs, &mut iovs);
            assert_eq!(r, 1, "{}", io::Error::last_os_error());
        }
        let mut d = [0u8; 200];
        for _ in 0..burst * rounds {
            let n = recv.recv(&mut d).unwrap();
            assert_eq!(n, segment);
            assert!(rx.place(&d[..n]));
        }
        let placed = burst * rounds * (segment - CRC_BYTES);
        assert_eq!(
            tx.region.to_vec(0, placed).unwrap(),
            rx.region.to_vec(0, placed).unwrap()
        );
    }
}
