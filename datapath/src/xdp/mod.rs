//! The AF_XDP backend: Braid's UDP datagrams sent and received as raw Ethernet frames through
//! AF_XDP sockets, bypassing the kernel's UDP stack.
//!
//! What it does not do: IPv6, VLAN tags, IP options or fragments, frames of more than
//! [`FRAGS_MAX`] UMEM frames, sharing an interface with another XDP program, or any protocol
//! logic. Receive steering covers one UDP port (the local one);
//! everything else on the interface still reaches the kernel.
//!
//! One [`XdpDatapath`] owns:
//!
//! - **One UMEM**: a page-aligned anonymous mapping of `frames × frame_size` bytes, frame size
//!   2048 or 4096 chosen from the interface MTU (an RX frame must hold the kernel's 256 bytes
//!   of headroom plus MTU + 14). [`RX_FRAMES_TOTAL`] frames are split evenly between the
//!   receive queues; [`TX_FRAMES`] frames form the transmit pool.
//! - **Multi-buffer frames** when the MTU needs more than one 4096-byte frame (a jumbo MTU,
//!   up to 9000 and beyond): the program is loaded as frags-aware (`BPF_F_XDP_HAS_FRAGS`, the
//!   `xdp.frags` section of libbpf), the socket is bound with `XDP_USE_SG`, and a frame spans
//!   up to [`FRAGS_MAX`] UMEM frames chained by `XDP_PKT_CONTD` descriptors both ways. A
//!   received chain is gathered into one buffer before it is lent to the callback (the one
//!   extra copy of this mode); a sent frame is written once and cut into its frames. Where
//!   the kernel or driver refuses (kernels before 6.6, drivers without multi-buffer XDP),
//!   `bind` fails with [`XdpError::MultiBufferUnsupported`] and the caller falls back to UDP
//!   sockets. On a real NIC with zero copy the same chains go to the hardware directly.
//! - **One AF_XDP socket per receive queue** of the interface (the count comes from ethtool's
//!   `ETHTOOL_GCHANNELS`), the first registering the UMEM, the others bound with
//!   `XDP_SHARED_UMEM`. Each has its own fill and RX ring holding its share of frames, so
//!   received frames always go back to the fill ring they came from. The first socket also
//!   has the TX and completion rings; all transmit goes through it.
//! - **The XDP program** [`bpf::steer_udp_port`] for the local port, each socket in its XSKMAP
//!   at its queue index, attached through a BPF link.
//! - **Plain UDP sockets**: one bound to the local address (so the port is reserved, and the
//!   kernel sends no ICMP port-unreachable for datagrams the program did not redirect) and one
//!   per extra path on an ephemeral port, reserving the source port that path sends from.
//!
//! Transmit writes Ethernet, IPv4 (DF, TTL 64, an IP ID, ECN in the TOS, header checksum) and UDP
//! headers (UDP checksum zero, "none", as RoCEv2 sends it) in front of the payload in a UMEM frame,
//! resolving the next hop's MAC through the kernel's route and neighbour tables over rtnetlink
//! (cached per destination, refreshed every 5 s; a missing entry is resolved by sending an empty
//! UDP datagram to the next hop through a normal socket and waiting up to 100 ms). Receive parses
//! and checks the headers (IPv4 header checksum included; the UDP checksum is not checked, because
//! frames from virtual devices carry only a partial one, and Braid's CRC32C covers the payload) and
//! lends the UDP payload straight out of the UMEM frame to [`Datapath::recv_with`]'s callback: the
//! only copy is the caller's.
//!
//! Binding needs root, or CAP_NET_RAW + CAP_NET_ADMIN + CAP_BPF; every failure comes back as
//! an [`io::Error`] whose inner error is an [`XdpError`] saying what was missing, so a caller
//! can fall back to [`crate::udp`] with a clear message.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::bpf::{self, Program, XdpLink, XdpMode};
use crate::{Datapath, MAX_DATAGRAM, RecvBatch, RecvMeta, Transmit};

mod frame;
mod neigh;
mod ring;
mod sys;
mod umem;

#[cfg(test)]
mod tests;

use frame::Mac;
use ring::{ConsRing, ProdRing, RingSizes, Xsk};
use umem::Umem;

/// The most paths (source ports) one datapath sends on.
pub const MAX_PATHS: u16 = 256;

/// The most receive queues (AF_XDP sockets) one datapath serves.
pub const MAX_QUEUES: u32 = 64;

/// UMEM frames for receiving, split evenly between the queues (each share a power of two).
pub const RX_FRAMES_TOTAL: u32 = 2048;

/// The fewest receive frames (and fill/RX ring entries) a queue gets.
pub const RX_FRAMES_PER_QUEUE_MIN: u32 = 256;

/// UMEM frames for transmitting; also the TX and completion ring sizes.
pub const TX_FRAMES: u32 = 2048;

/// Bytes the kernel reserves at the start of every received frame (`XDP_PACKET_HEADROOM`).
const RX_HEADROOM: u32 = 256;

/// Completion ring entries of the receive-only sockets (they never transmit).
const RX_ONLY_COMPLETION: u32 = 64;

/// Descriptors per TX wake-up: the kernel's copy mode processes about 32 per `sendto`.
const TX_KICK_BATCH: usize = 32;

/// How long one `send` call waits in total for TX frames the kernel still holds.
const SEND_BLOCK_NS_MAX: u64 = 10_000_000;

/// How long `bind` retries a queue that is still busy (the previous socket's teardown is
/// asynchronous).
const BIND_BUSY_NS_MAX: u64 = 2_000_000_000;

/// How long `bind` retries a local port that is in use (see `reserve_port_retrying`).
const PORT_BUSY_NS_MAX: u64 = 200_000_000;

/// Datagrams handed out per `recv_with` when the caller's scratch batch is empty.
const RX_BATCH_DEFAULT: usize = 64;

/// The most datagrams one receive call hands out.
const RX_BATCH_MAX: usize = 1024;

/// `ENOTSUPP`, which some drivers leak from zero-copy setup instead of `EOPNOTSUPP`.
const ENOTSUPP: i32 = 524;

/// The most UMEM frames one Ethernet frame may span in multi-buffer mode (4 x 3840 bytes of
/// room past the receive headroom: MTUs up to 15 KB).
pub const FRAGS_MAX: u32 = 4;

/// Descriptors of one received chain beyond which it is dropped as malformed (the kernel
/// never chains more than 18).
const RX_CHAIN_MAX: u32 = 32;

/// How an [`XdpDatapath`] is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpConfig {
    /// The interface to attach to; `None` picks the interface that owns `local`'s IP.
    pub interface: Option<String>,
    /// Address peers send to: an IPv4 address of the interface and a fixed, nonzero port.
    pub local: SocketAddr,
    /// Number of paths (distinct source ports), `1..=`[`MAX_PATHS`].
    pub paths: u16,
    /// Try zero-copy first, falling back to copy mode where the driver cannot (veth).
    pub zero_copy: bool,
    /// How the XDP program is attached.
    pub mode: XdpMode,
    /// UMEM frame size, 2048 or 4096; `None` picks the smaller that holds an MTU-sized frame.
    pub frame_size: Option<u32>,
}

impl XdpConfig {
    /// `paths` paths on `local`, on the interface that owns its IP, copy mode, automatic
    /// attach mode and frame size.
    pub fn new(local: SocketAddr, paths: u16) -> Self {
        XdpConfig {
            interface: None,
            local,
            paths,
            zero_copy: false,
            mode: XdpMode::Auto,
            frame_size: None,
        }
    }
}

/// Why [`XdpDatapath::bind`] failed. It travels inside the returned [`io::Error`] (get it with
/// `err.get_ref().and_then(|e| e.downcast_ref::<XdpError>())`), whose kind matches the cause.
#[derive(Debug)]
#[non_exhaustive]
pub enum XdpError {
    /// The configuration cannot work (the text says which field and why).
    InvalidConfig(&'static str),
    /// The kernel refused a step with EPERM: AF_XDP needs root, or CAP_NET_RAW,
    /// CAP_NET_ADMIN and CAP_BPF.
    NotPermitted {
        /// What was refused.
        step: &'static str,
    },
    /// The kernel has no AF_XDP sockets (`socket(AF_XDP)` gave EAFNOSUPPORT).
    AfXdpUnsupported,
    /// No interface has this name.
    NoSuchInterface(String),
    /// No interface carries this IPv4 address (with [`XdpConfig::interface`] unset).
    NoInterfaceOwns(Ipv4Addr),
    /// The named interface does not carry the local IPv4 address.
    AddressNotOnInterface {
        /// The interface.
        interface: String,
        /// The address it lacks.
        ip: Ipv4Addr,
    },
    /// The interface is administratively down.
    InterfaceDown(String),
    /// The interface is not Ethernet (the datapath writes Ethernet headers).
    NotEthernet {
        /// The interface.
        interface: String,
        /// Its `ARPHRD_*` hardware type.
        hw_type: u16,
    },
    /// The MTU needs frames larger than the UMEM frame: an explicit
    /// [`XdpConfig::frame_size`] too small for it, or more than [`FRAGS_MAX`] frames per
    /// packet in multi-buffer mode.
    MtuTooLarge {
        /// The interface.
        interface: String,
        /// Its MTU.
        mtu: u32,
        /// The frame size that was too small.
        frame_size: u32,
    },
    /// The MTU needs multi-buffer frames and the kernel or driver refused a step of them
    /// (loading a frags-aware program, binding with `XDP_USE_SG`, or attaching).
    MultiBufferUnsupported {
        /// The interface.
        interface: String,
        /// Its MTU.
        mtu: u32,
        /// What was refused.
        step: &'static str,
        /// The kernel's error.
        source: io::Error,
    },
    /// The interface has more receive queues than this datapath opens sockets for.
    TooManyQueues {
        /// The interface.
        interface: String,
        /// Its active receive queues.
        queues: u32,
    },
    /// Another socket holds the local UDP port.
    PortInUse(SocketAddrV4),
    /// A queue stayed bound to another AF_XDP socket for the whole retry period.
    QueueBusy {
        /// The interface.
        interface: String,
        /// The queue.
        queue: u32,
    },
    /// The UMEM is larger than the locked-memory limit allows.
    MemlockLimit {
        /// UMEM bytes.
        bytes: usize,
    },
    /// Another XDP program is attached to the interface.
    AttachBusy(String),
    /// Attaching the XDP program failed for another reason (often: native mode on a driver
    /// without XDP support).
    Attach {
        /// The interface.
        interface: String,
        /// The mode asked for.
        mode: XdpMode,
        /// The kernel's error.
        source: io::Error,
    },
    /// Another system call failed.
    Os {
        /// What was being done.
        step: &'static str,
        /// The kernel's error.
        source: io::Error,
    },
}

impl fmt::Display for XdpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdpError::InvalidConfig(why) => write!(f, "invalid AF_XDP config: {why}"),
            XdpError::NotPermitted { step } => write!(
                f,
                "AF_XDP needs root, or CAP_NET_RAW, CAP_NET_ADMIN and CAP_BPF: the kernel \
                 refused {step} with EPERM"
            ),
            XdpError::AfXdpUnsupported => write!(
                f,
                "this kernel has no AF_XDP sockets (socket(AF_XDP) gave EAFNOSUPPORT; it \
                 needs CONFIG_XDP_SOCKETS)"
            ),
            XdpError::NoSuchInterface(name) => write!(f, "no network interface named {name:?}"),
            XdpError::NoInterfaceOwns(ip) => write!(
                f,
                "no network interface has the address {ip}: use an address of this host or \
                 name the interface"
            ),
            XdpError::AddressNotOnInterface { interface, ip } => {
                write!(f, "interface {interface} does not have the address {ip}")
            }
            XdpError::InterfaceDown(name) => write!(f, "interface {name} is down"),
            XdpError::NotEthernet { interface, hw_type } => write!(
                f,
                "interface {interface} is not Ethernet (hardware type {hw_type}); the AF_XDP \
                 datapath writes Ethernet frames"
            ),
            XdpError::MtuTooLarge {
                interface,
                mtu,
                frame_size,
            } => write!(
                f,
                "the MTU {mtu} of {interface} does not fit a {frame_size}-byte UMEM frame \
                 (MTU + 14 + 256 bytes of headroom; multi-buffer frames need the automatic \
                 frame size and at most {FRAGS_MAX} frames per packet)"
            ),
            XdpError::MultiBufferUnsupported {
                interface,
                mtu,
                step,
                source,
            } => write!(
                f,
                "the MTU {mtu} of {interface} needs multi-buffer AF_XDP frames, and {step} \
                 failed: {source} (needs Linux 6.6 or later and a driver with multi-buffer \
                 XDP; lower the MTU to 3800 or less)"
            ),
            XdpError::TooManyQueues { interface, queues } => write!(
                f,
                "interface {interface} has {queues} receive queues, more than the \
                 {MAX_QUEUES} AF_XDP sockets one datapath opens; reduce them (ethtool -L)"
            ),
            XdpError::PortInUse(addr) => write!(f, "UDP {addr} is already in use"),
            XdpError::QueueBusy { interface, queue } => write!(
                f,
                "queue {queue} of {interface} stayed bound to another AF_XDP socket for 2 s \
                 (another datapath on this interface?)"
            ),
            XdpError::MemlockLimit { bytes } => write!(
                f,
                "registering a {bytes}-byte UMEM exceeds RLIMIT_MEMLOCK: raise it (ulimit \
                 -l) or grant CAP_IPC_LOCK"
            ),
            XdpError::AttachBusy(name) => {
                write!(f, "another XDP program is already attached to {name}")
            }
            XdpError::Attach {
                interface,
                mode,
                source,
            } => write!(
                f,
                "attaching the XDP program to {interface} in {mode:?} mode failed: {source} \
                 (XdpMode::Generic works on every driver)"
            ),
            XdpError::Os { step, source } => write!(f, "AF_XDP setup: {step} failed: {source}"),
        }
    }
}

impl std::error::Error for XdpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            XdpError::Attach { source, .. }
            | XdpError::Os { source, .. }
            | XdpError::MultiBufferUnsupported { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<XdpError> for io::Error {
    fn from(e: XdpError) -> io::Error {
        use io::ErrorKind as K;
        let kind = match &e {
            XdpError::InvalidConfig(_) => K::InvalidInput,
            XdpError::NotPermitted { .. } => K::PermissionDenied,
            XdpError::AfXdpUnsupported
            | XdpError::NotEthernet { .. }
            | XdpError::MtuTooLarge { .. }
            | XdpError::MultiBufferUnsupported { .. }
            | XdpError::TooManyQueues { .. } => K::Unsupported,
            XdpError::NoSuchInterface(_) => K::NotFound,
            XdpError::NoInterfaceOwns(_) | XdpError::AddressNotOnInterface { .. } => {
                K::AddrNotAvailable
            }
            XdpError::InterfaceDown(_) => K::NetworkDown,
            XdpError::PortInUse(_) => K::AddrInUse,
            XdpError::QueueBusy { .. } | XdpError::AttachBusy(_) => K::ResourceBusy,
            XdpError::MemlockLimit { .. } => K::OutOfMemory,
            XdpError::Attach { source, .. } | XdpError::Os { source, .. } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// Classifies the OS error of setup step `step`.
fn os_error(step: &'static str, e: io::Error) -> XdpError {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => XdpError::NotPermitted { step },
        Some(libc::EAFNOSUPPORT) if step == "socket(AF_XDP)" => XdpError::AfXdpUnsupported,
        _ => XdpError::Os { step, source: e },
    }
}

/// Counters of one datapath (cumulative since bind).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct XdpStats {
    /// Datagrams placed on the TX ring.
    pub sent: u64,
    /// Datagrams handed to the receive callback.
    pub received: u64,
    /// Datagrams received per queue, indexed by queue.
    pub received_per_queue: Vec<u64>,
    /// Datagrams skipped on send: destination not IPv4, port 0, no route through this
    /// interface, or no neighbour entry.
    pub tx_unroutable: u64,
    /// Datagrams skipped on send: payload above [`Datapath::max_payload`].
    pub tx_oversize: u64,
    /// Received frames dropped: malformed, bad checksum, or not for our address and port.
    pub rx_rejected: u64,
    /// TX wake-ups the kernel failed with an unexpected error.
    pub tx_kick_errors: u64,
    /// Kernel: frames dropped before reaching an RX ring: RX ring full, fill ring empty or
    /// other reasons (all sockets).
    pub kernel_rx_dropped: u64,
    /// Kernel: times a frame found the fill ring empty (all sockets; such frames are also
    /// counted in `kernel_rx_dropped`).
    pub kernel_fill_ring_empty: u64,
    /// Kernel: invalid TX descriptors.
    pub kernel_tx_invalid: u64,
    /// Times `bind` found a queue busy (a previous socket still tearing down) and retried.
    pub bind_busy_retries: u32,
}

/// What `send` does with one datagram.
#[derive(Copy, Clone, Debug)]
enum Plan {
    /// Send it to this next-hop MAC.
    Send(Mac),
    /// Skip it: not IPv4, port 0, not routed here, or next hop unresolved.
    Unroutable,
    /// Skip it: payload above `max_payload`.
    Oversize,
}

/// Counters updated on the fast paths.
#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    /// One per queue.
    received_per_queue: Vec<AtomicU64>,
    tx_unroutable: AtomicU64,
    tx_oversize: AtomicU64,
    rx_rejected: AtomicU64,
    tx_kick_errors: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a receive callback poisons the lock but leaves the rings consistent (at
    // worst some frames are handed out again), so keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The transmit side: TX and completion rings of the first socket, and the free TX frames.
#[derive(Debug)]
struct TxState {
    tx: ProdRing<libc::xdp_desc>,
    completion: ConsRing<u64>,
    /// UMEM addresses of TX frames we own; never more than [`TX_FRAMES`].
    free: Vec<u64>,
    ip_id: u16,
    umem: Arc<Umem>,
    /// Multi-buffer mode: a whole outgoing frame is written here, then cut into UMEM frames
    /// (MTU + 14 bytes). Empty otherwise.
    jumbo: Vec<u8>,
}

impl TxState {
    /// Moves completed frames back to the free list.
    fn reclaim(&mut self) {
        let n = self.completion.available(TX_FRAMES);
        for i in 0..n {
            let addr = self.completion.read(i);
            self.free.push(self.umem.frame_base(addr));
        }
        self.completion.release(n);
        debug_assert!(self.free.len() <= TX_FRAMES as usize);
    }
}

/// One receive queue: its socket's RX and fill rings and its share of the frames.
#[derive(Debug)]
struct RxQueue {
    rx: ConsRing<libc::xdp_desc>,
    fill: ProdRing<u64>,
    /// Unused (only the first socket transmits), kept mapped for the socket's lifetime.
    _completion: Option<ConsRing<u64>>,
    fd: RawFd,
    /// Frames that found the fill ring full (cannot happen while the ring holds all of the
    /// queue's frames; kept rather than leaked if it ever does).
    spare: Vec<u64>,
}

impl RxQueue {
    /// Puts spare frames back on the fill ring.
    fn refill_spare(&mut self) {
        if self.spare.is_empty() {
            return;
        }
        let room = self.fill.free(self.spare.len() as u32);
        let n = room.min(self.spare.len() as u32);
        for i in 0..n {
            if let Some(addr) = self.spare.pop() {
                self.fill.write(i, addr);
            }
        }
        self.fill.submit(n);
    }
}

/// The receive side: every queue, and the poll set (queue sockets, then the wake eventfd).
#[derive(Debug)]
struct RxState {
    queues: Vec<RxQueue>,
    pollfds: Vec<libc::pollfd>,
    /// The queue served first next time (round robin, so no queue starves another).
    next: usize,
    umem: Arc<Umem>,
    /// Multi-buffer mode: where a chained frame is gathered (capacity MTU + 14). Empty and
    /// unused otherwise.
    gather: Vec<u8>,
    /// UMEM frames one received frame may span (1 without multi-buffer).
    frags: u32,
}

impl RxState {
    fn any_ready(&mut self) -> bool {
        self.queues.iter_mut().any(|q| !q.rx.is_empty())
    }

    /// Whether frames wait to go back on a fill ring (`RxQueue::spare`).
    fn any_spare(&self) -> bool {
        self.queues.iter().any(|q| !q.spare.is_empty())
    }

    /// Whether the kernel asked for a system call to see new fill-ring entries.
    fn fill_needs_wakeup(&self) -> bool {
        self.queues.iter().any(|q| q.fill.needs_wakeup())
    }

    /// Hands up to `limit` ready datagrams to `f` and recycles their frames; returns how
    /// many were handed out.
    fn drain(
        &mut self,
        limit: usize,
        local: SocketAddrV4,
        counters: &Counters,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> usize {
        let mut delivered = 0;
        let mut rejected = 0;
        let count = self.queues.len();
        for k in 0..count {
            let q = &mut self.queues[(self.next + k) % count];
            q.refill_spare();
            let budget = (limit - delivered) as u32;
            if budget == 0 {
                break;
            }
            // At least RX_CHAIN_MAX descriptors, so a chain at the front is always either
            // whole or known to be overlong (the kernel publishes whole frames; only this
            // limit can cut one), and one longer than `frags` (the MTU grew after bind)
            // cannot stall the queue.
            let n =
                q.rx.available(budget.saturating_mul(self.frags).max(RX_CHAIN_MAX));
            if n == 0 {
                continue;
            }
            let room = q.fill.free(n);
            let (mut kept, mut packets, mut i) = (0, 0, 0);
            while i < n && packets < budget {
                let desc = q.rx.read(i);
                // A frame is one descriptor, or (multi-buffer) a chain whose descriptors all
                // carry XDP_PKT_CONTD but the last.
                let mut last = i;
                while last < n && q.rx.read(last).options & libc::XDP_PKT_CONTD != 0 {
                    last += 1;
                    if last - i >= RX_CHAIN_MAX {
                        break;
                    }
                }
                if last == n && last - i < RX_CHAIN_MAX {
                    // The chain's end is not visible yet: leave it for the next call.
                    break;
                }
                let end = if last - i >= RX_CHAIN_MAX {
                    last
                } else {
                    last + 1
                };
                let frame = if end == i + 1 {
                    // SAFETY: the descriptor came off the RX ring, so its frame is ours until
                    // we put it on the fill ring below, after the callback has returned; only
                    // this shared slice of it exists meanwhile.
                    unsafe { self.umem.frame(desc.addr, desc.len as usize) }
                } else if end - i <= self.frags {
                    self.gather.clear();
                    let mut whole = true;
                    for j in i..end {
                        let d = q.rx.read(j);
                        // SAFETY: as above, for every descriptor of the chain; each slice
                        // lives only for the copy.
                        match unsafe { self.umem.frame(d.addr, d.len as usize) } {
                            Some(b) if self.gather.len() + b.len() <= self.gather.capacity() => {
                                self.gather.extend_from_slice(b)
                            }
                            _ => whole = false,
                        }
                    }
                    whole.then_some(&self.gather[..])
                } else {
                    None
                };
                match frame.map(|b| (frame::parse(b, local), b)) {
                    Some((Ok(d), b)) => {
                        let payload = &b[d.payload];
                        let meta = RecvMeta {
                            src: SocketAddr::V4(d.src),
                            len: payload.len(),
                            ecn: d.ecn,
                            queued_ns: 0,
                        };
                        f(&meta, payload);
                        kept += 1;
                    }
                    _ => rejected += 1,
                }
                for j in i..end {
                    let base = self.umem.frame_base(q.rx.read(j).addr);
                    if j < room {
                        q.fill.write(j, base);
                    } else {
                        q.spare.push(base);
                    }
                }
                i = end;
                packets += 1;
            }
            let n = i;
            q.rx.release(n);
            q.fill.submit(room.min(n));
            if q.fill.needs_wakeup() {
                Xsk::kick_fill(q.fd);
            }
            if let Some(c) = counters.received_per_queue.get((self.next + k) % count) {
                bump(c, kept);
            }
            delivered += kept as usize;
        }
        self.next = (self.next + 1) % count;
        bump(&counters.received, delivered as u64);
        bump(&counters.rx_rejected, rejected);
        delivered
    }
}

/// A [`Datapath`] over AF_XDP sockets on one interface.
///
/// Fields drop in declaration order, after [`Drop::drop`] has detached the program and
/// emptied its XSKMAP: program, rings, sockets, then the UMEM once nothing maps into it.
pub struct XdpDatapath {
    link: Option<XdpLink>,
    program: Program,
    tx: Mutex<TxState>,
    rx: Mutex<RxState>,
    /// The AF_XDP sockets, one per queue; the first also transmits.
    sockets: Vec<OwnedFd>,
    umem: Arc<Umem>,
    /// `udp[p]` reserves the source port of path `p`; `udp[0]` is bound to `local`.
    udp: Vec<Socket>,
    ports: Vec<u16>,
    neigh: neigh::Neighbours,
    wake_fd: OwnedFd,
    /// Set when `send` left descriptors on the TX ring; `recv` then kicks it.
    tx_pending: AtomicBool,
    counters: Counters,
    local: SocketAddrV4,
    interface: String,
    ifindex: u32,
    src_mac: Mac,
    mtu: u32,
    zero_copy: bool,
    /// UMEM frames one Ethernet frame may span (1 without multi-buffer).
    frags: u32,
    bind_busy_retries: u32,
}

impl fmt::Debug for XdpDatapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdpDatapath")
            .field("local", &self.local)
            .field("interface", &self.interface)
            .field("ifindex", &self.ifindex)
            .field("queues", &self.sockets.len())
            .field("paths", &self.ports.len())
            .field("mtu", &self.mtu)
            .field("frame_size", &self.umem.frame_size())
            .field("zero_copy", &self.zero_copy)
            .field("frags", &self.frags)
            .finish_non_exhaustive()
    }
}

impl XdpDatapath {
    /// Sets up the UMEM, one AF_XDP socket per receive queue, the steering program and the
    /// port-reserving UDP sockets. Fails (never panics) with an [`io::Error`] carrying an
    /// [`XdpError`]; a queue still busy from a just-closed socket is retried for up to 2 s.
    pub fn bind(config: XdpConfig) -> io::Result<XdpDatapath> {
        Self::bind_inner(config).map_err(io::Error::from)
    }

    fn bind_inner(config: XdpConfig) -> Result<XdpDatapath, XdpError> {
        let local = match config.local {
            SocketAddr::V4(a) if a.port() != 0 && !a.ip().is_unspecified() => a,
            _ => {
                return Err(XdpError::InvalidConfig(
                    "XdpConfig::local must be a specific IPv4 address with a nonzero port",
                ));
            }
        };
        if config.paths == 0 || config.paths > MAX_PATHS {
            return Err(XdpError::InvalidConfig(
                "XdpConfig::paths must be in 1..=256",
            ));
        }
        if let Some(fs) = config.frame_size
            && fs != 2048
            && fs != 4096
        {
            return Err(XdpError::InvalidConfig(
                "XdpConfig::frame_size must be 2048 or 4096",
            ));
        }
        let interface = pick_interface(config.interface.clone(), *local.ip())?;
        let ifindex =
            bpf::ifindex(&interface).map_err(|_| XdpError::NoSuchInterface(interface.clone()))?;
        let info = sys::interface_info(&interface).map_err(|e| XdpError::Os {
            step: "querying the interface",
            source: e,
        })?;
        if !info.ethernet {
            return Err(XdpError::NotEthernet {
                interface,
                hw_type: info.hw_type,
            });
        }
        if !info.up {
            return Err(XdpError::InterfaceDown(interface));
        }
        let queues = info.rx_queues;
        if queues > MAX_QUEUES {
            return Err(XdpError::TooManyQueues { interface, queues });
        }
        let needed = info.mtu + frame::ETH_HEADER as u32 + RX_HEADROOM;
        let frame_size = match config.frame_size {
            Some(fs) => fs,
            None if needed <= 2048 => 2048,
            None => 4096,
        };
        // Multi-buffer frames only with the automatic frame size: every received buffer has
        // the headroom in front of it, so a frame of MTU + 14 bytes needs this many.
        let frags = if needed <= frame_size {
            1
        } else if config.frame_size.is_none() {
            (info.mtu + frame::ETH_HEADER as u32).div_ceil(frame_size - RX_HEADROOM)
        } else {
            u32::MAX
        };
        if frags > FRAGS_MAX || info.mtu <= frame::IP_UDP_HEADERS as u32 {
            return Err(XdpError::MtuTooLarge {
                interface,
                mtu: info.mtu,
                frame_size,
            });
        }

        // Reserve the ports before anything else can grab them.
        let (udp, ports) = reserve_ports(local, config.paths)?;

        // The largest power of two within this queue's share (at least the minimum).
        let share = (RX_FRAMES_TOTAL / queues).max(RX_FRAMES_PER_QUEUE_MIN);
        let rx_per_queue = 1u32 << (31 - share.leading_zeros());
        let frames = queues * rx_per_queue + TX_FRAMES;
        let umem = Arc::new(Umem::new(frames, frame_size).map_err(|e| XdpError::Os {
            step: "mapping the UMEM",
            source: e,
        })?);
        let opened = open_sockets(
            &umem,
            &interface,
            ifindex,
            queues,
            rx_per_queue,
            config.zero_copy,
            frags > 1,
        )
        .map_err(|e| multi_buffer_error(e, frags, &interface, info.mtu))?;

        // Split the sockets into the receive and transmit sides, giving each queue its
        // frames on its fill ring.
        let mut sockets = Vec::with_capacity(opened.xsks.len());
        let mut rx_queues = Vec::with_capacity(opened.xsks.len());
        let mut tx_rings = None;
        for (q, xsk) in opened.xsks.into_iter().enumerate() {
            let Xsk {
                rx,
                tx,
                mut fill,
                completion,
                fd,
            } = xsk;
            let first_frame = q as u32 * rx_per_queue;
            // A fresh fill ring has room for all of the queue's frames.
            let room = fill.free(rx_per_queue).min(rx_per_queue);
            for i in 0..room {
                fill.write(i, umem.frame_addr(first_frame + i));
            }
            fill.submit(room);
            if fill.needs_wakeup() {
                Xsk::kick_fill(fd.as_raw_fd());
            }
            let rx = rx.ok_or(XdpError::Os {
                step: "creating the RX ring",
                source: io::Error::other("missing"),
            })?;
            let completion = match tx {
                Some(tx) => {
                    tx_rings = Some((tx, completion));
                    None
                }
                None => Some(completion),
            };
            rx_queues.push(RxQueue {
                rx,
                fill,
                _completion: completion,
                fd: fd.as_raw_fd(),
                spare: Vec::new(),
            });
            sockets.push(fd);
        }
        let (tx_ring, completion) = tx_rings.ok_or(XdpError::Os {
            step: "creating the TX ring",
            source: io::Error::other("missing"),
        })?;
        let tx_first = queues * rx_per_queue;
        let free = (0..TX_FRAMES)
            .map(|i| umem.frame_addr(tx_first + i))
            .collect();

        let (program, link) = load_and_attach(
            local.port(),
            &sockets,
            &interface,
            ifindex,
            config.mode,
            frags > 1,
        )
        .map_err(|e| multi_buffer_error(e, frags, &interface, info.mtu))?;
        let jumbo_len = if frags > 1 {
            (info.mtu + frame::ETH_HEADER as u32) as usize
        } else {
            0
        };
        let wake_fd = sys::eventfd().map_err(|e| os_error("creating an eventfd", e))?;
        let neigh =
            neigh::Neighbours::new(ifindex).map_err(|e| os_error("opening rtnetlink", e))?;
        let pollfds = sockets
            .iter()
            .map(|fd| fd.as_raw_fd())
            .chain([wake_fd.as_raw_fd()])
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        Ok(XdpDatapath {
            link: Some(link),
            program,
            tx: Mutex::new(TxState {
                tx: tx_ring,
                completion,
                free,
                ip_id: 0,
                umem: Arc::clone(&umem),
                jumbo: vec![0; jumbo_len],
            }),
            rx: Mutex::new(RxState {
                queues: rx_queues,
                pollfds,
                next: 0,
                umem: Arc::clone(&umem),
                gather: Vec::with_capacity(jumbo_len),
                frags,
            }),
            sockets,
            umem,
            udp,
            ports,
            neigh,
            wake_fd,
            tx_pending: AtomicBool::new(false),
            counters: Counters {
                received_per_queue: (0..queues).map(|_| AtomicU64::new(0)).collect(),
                ..Counters::default()
            },
            local,
            interface,
            ifindex,
            src_mac: info.mac,
            mtu: info.mtu,
            zero_copy: opened.zero_copy,
            frags,
            bind_busy_retries: opened.busy_retries,
        })
    }

    /// The local address path `path` sends from (its source port), or `None` if this
    /// datapath has no such path.
    pub fn path_local_addr(&self, path: u16) -> Option<SocketAddr> {
        self.ports
            .get(usize::from(path))
            .map(|&p| SocketAddr::V4(SocketAddrV4::new(*self.local.ip(), p)))
    }

    /// The interface the datapath is attached to.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// Receive queues served (one AF_XDP socket each).
    pub fn queues(&self) -> u32 {
        self.sockets.len() as u32
    }

    /// UMEM frame size in bytes.
    pub fn frame_size(&self) -> u32 {
        self.umem.frame_size()
    }

    /// Whether the sockets run in zero-copy mode (else copy mode).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The most UMEM frames one Ethernet frame spans: 1, or more in multi-buffer mode (an MTU
    /// that does not fit one frame; see the module docs).
    pub fn frags(&self) -> u32 {
        self.frags
    }

    /// Counters since bind, including the kernel's per-socket statistics.
    pub fn stats(&self) -> XdpStats {
        let c = &self.counters;
        let mut s = XdpStats {
            sent: c.sent.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            received_per_queue: c
                .received_per_queue
                .iter()
                .map(|q| q.load(Ordering::Relaxed))
                .collect(),
            tx_unroutable: c.tx_unroutable.load(Ordering::Relaxed),
            tx_oversize: c.tx_oversize.load(Ordering::Relaxed),
            rx_rejected: c.rx_rejected.load(Ordering::Relaxed),
            tx_kick_errors: c.tx_kick_errors.load(Ordering::Relaxed),
            bind_busy_retries: self.bind_busy_retries,
            ..XdpStats::default()
        };
        for fd in &self.sockets {
            if let Ok(k) = ring::statistics(fd.as_raw_fd()) {
                s.kernel_rx_dropped += k.rx_dropped + k.rx_ring_full;
                s.kernel_fill_ring_empty += k.rx_fill_ring_empty_descs;
                s.kernel_tx_invalid += k.tx_invalid_descs;
            }
        }
        s
    }

    fn tx_fd(&self) -> RawFd {
        // `bind` opens one socket per queue, at least one; the first has the TX ring.
        self.sockets[0].as_raw_fd()
    }

    /// Wakes the kernel's transmit processing when it needs it (always in copy mode).
    fn kick_tx(&self, tx: &TxState) {
        if self.zero_copy && !tx.tx.needs_wakeup() {
            return;
        }
        match Xsk::kick_tx(self.tx_fd()) {
            None | Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS)
            | Some(libc::EINTR) => {}
            Some(_) => bump(&self.counters.tx_kick_errors, 1),
        }
    }

    /// Writes as many of `chunk` as frames and ring room allow into the TX ring (skipping
    /// those planned as skipped), submits and kicks; returns how many were consumed.
    fn place(&self, chunk: &[Transmit<'_>], plans: &[Plan]) -> usize {
        let mut tx = lock(&self.tx);
        let tx = &mut *tx;
        tx.reclaim();
        let room = tx.tx.free(chunk.len() as u32 * self.frags);
        let frame_size = self.umem.frame_size() as usize;
        let mut used = 0u32;
        let mut frames = 0u64;
        let mut consumed = 0;
        for (t, plan) in chunk.iter().zip(plans) {
            let (Plan::Send(dst_mac), SocketAddr::V4(dst)) = (*plan, t.dest) else {
                let counter = match plan {
                    Plan::Oversize => &self.counters.tx_oversize,
                    _ => &self.counters.tx_unroutable,
                };
                bump(counter, 1);
                consumed += 1;
                continue;
            };
            let len = frame::HEADERS + t.contents.len();
            let pieces = len.div_ceil(frame_size) as u32;
            if pieces > self.frags {
                // `send` planned only payloads within `max_payload`; keep it that way.
                bump(&self.counters.tx_oversize, 1);
                consumed += 1;
                continue;
            }
            if used + pieces > room || tx.free.len() < pieces as usize {
                break;
            }
            tx.ip_id = tx.ip_id.wrapping_add(1);
            let headers = frame::TxHeaders {
                dst_mac,
                src_mac: self.src_mac,
                src: SocketAddrV4::new(
                    *self.local.ip(),
                    self.ports[usize::from(t.path) % self.ports.len()],
                ),
                dst,
                ecn: t.ecn,
                ip_id: tx.ip_id,
            };
            consumed += 1;
            if pieces > 1 {
                // Multi-buffer: write the frame once, then cut it into UMEM frames chained by
                // XDP_PKT_CONTD (`max_payload` kept it within MTU + 14 = `jumbo`'s length).
                let Some(len) = frame::write(&mut tx.jumbo, &headers, t.contents) else {
                    bump(&self.counters.tx_oversize, 1);
                    continue;
                };
                let mut addrs = [0u64; FRAGS_MAX as usize];
                for a in addrs.iter_mut().take(pieces as usize) {
                    // `free` holds at least `pieces` frames (checked above).
                    *a = tx.free.pop().unwrap_or_default();
                }
                let mut ok = true;
                for (piece, &addr) in tx.jumbo[..len].chunks(frame_size).zip(&addrs) {
                    // SAFETY: `addr` came off the free list, so the kernel does not hold the
                    // frame and no other slice of it exists; it goes to the kernel only
                    // through the TX ring below, after this slice is gone.
                    match unsafe { tx.umem.frame_mut(addr, piece.len()) } {
                        Some(f) => f.copy_from_slice(piece),
                        None => ok = false,
                    }
                }
                if !ok {
                    // Cannot happen (free frames lie inside the UMEM); give them back rather
                    // than publish a broken chain.
                    tx.free.extend_from_slice(&addrs[..pieces as usize]);
                    bump(&self.counters.tx_oversize, 1);
                    continue;
                }
                for (k, (piece, &addr)) in
                    tx.jumbo[..len].chunks(frame_size).zip(&addrs).enumerate()
                {
                    let options = if k + 1 < pieces as usize {
                        libc::XDP_PKT_CONTD
                    } else {
                        0
                    };
                    let desc = libc::xdp_desc {
                        addr,
                        len: piece.len() as u32,
                        options,
                    };
                    tx.tx.write(used + k as u32, desc);
                }
                used += pieces;
                frames += 1;
                continue;
            }
            let Some(addr) = tx.free.pop() else {
                break;
            };
            // SAFETY: `addr` came off the free list, so the kernel does not hold the frame
            // and no other slice of it exists; it goes to the kernel only through the TX
            // ring below, after this slice is gone.
            let written = unsafe { tx.umem.frame_mut(addr, frame_size) }
                .and_then(|f| frame::write(f, &headers, t.contents));
            match written {
                Some(len) => {
                    let desc = libc::xdp_desc {
                        addr,
                        len: len as u32,
                        options: 0,
                    };
                    tx.tx.write(used, desc);
                    used += 1;
                    frames += 1;
                }
                None => {
                    tx.free.push(addr);
                    bump(&self.counters.tx_oversize, 1);
                }
            }
        }
        if used > 0 {
            tx.tx.submit(used);
            self.kick_tx(tx);
            bump(&self.counters.sent, frames);
        }
        consumed
    }

    /// Kicks until the kernel has taken every TX descriptor, for at most `budget` from
    /// `since` (from the first time it has to wait, if `None`: a flush that need not wait
    /// reads no clock); if some are left, the next `recv` kicks again.
    fn flush(&self, since: Option<Instant>, budget: Duration) {
        let mut deadline = since.map(|s| s + budget);
        loop {
            {
                let mut tx = lock(&self.tx);
                if tx.tx.pending() == 0 {
                    return;
                }
                self.kick_tx(&tx);
                tx.reclaim();
                if tx.tx.pending() == 0 {
                    return;
                }
            }
            let now = Instant::now();
            if now >= *deadline.get_or_insert(now + budget) {
                self.tx_pending.store(true, Ordering::Relaxed);
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Waits for datagrams (or a wake-up) and hands up to `limit` to `f`.
    fn serve(
        &self,
        limit: usize,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        // Read before it is cleared: the swap is an atomic read-modify-write, on every look of
        // a spinning poller, for a flag that is rarely set.
        if self.tx_pending.load(Ordering::Relaxed) && self.tx_pending.swap(false, Ordering::Relaxed)
        {
            self.flush(None, Duration::ZERO);
        }
        let nonblocking = timeout == Some(Duration::ZERO);
        // A spinning poller's look (a zero timeout) reads no clock.
        let deadline = timeout.filter(|_| !nonblocking).map(|t| Instant::now() + t);
        let mut rx = lock(&self.rx);
        let rx = &mut *rx;
        loop {
            let ready = rx.any_ready();
            // The rings are shared memory: frames ready, or none when the caller will not
            // wait, need no system call (a poll per look was most of a spinning poller's
            // round), unless a fill ring asks for a wake-up.
            if (ready || nonblocking) && !rx.fill_needs_wakeup() {
                // A look that finds nothing: nothing to drain, unless frames wait to go back
                // on a fill ring (drain walked every queue's rings again to find that out).
                if !ready && !rx.any_spare() {
                    return Ok(0);
                }
                let n = rx.drain(limit, self.local, &self.counters, f);
                if n > 0
                    || nonblocking
                    || limit == 0
                    || deadline.is_some_and(|d| Instant::now() >= d)
                {
                    return Ok(n);
                }
                continue;
            }
            let wait = if ready || nonblocking {
                Some(Duration::ZERO)
            } else {
                deadline.map(|d| d.saturating_duration_since(Instant::now()))
            };
            for p in rx.pollfds.iter_mut() {
                p.revents = 0;
            }
            match sys::poll(&mut rx.pollfds, wait) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
                Err(e) => return Err(e),
            }
            if rx
                .pollfds
                .iter()
                .any(|p| p.revents & (libc::POLLNVAL | libc::POLLERR) != 0)
            {
                return Err(io::Error::other("AF_XDP socket reported an error"));
            }
            let woken = rx.pollfds.last().is_some_and(|p| p.revents != 0);
            if woken {
                sys::eventfd_drain(self.wake_fd.as_raw_fd());
            }
            let n = rx.drain(limit, self.local, &self.counters, f);
            if n > 0
                || woken
                || limit == 0
                || nonblocking
                || deadline.is_some_and(|d| Instant::now() >= d)
            {
                return Ok(n);
            }
            // Only rejected frames arrived: wait again for the rest of the timeout.
        }
    }
}

impl Drop for XdpDatapath {
    fn drop(&mut self) {
        // Detach first so no more frames are steered, then take the sockets out of the
        // XSKMAP so closing them releases the queues right away (the map would otherwise
        // keep them alive until the kernel frees the program).
        drop(self.link.take());
        if let Some(map) = self.program.maps().first() {
            for q in 0..self.sockets.len() as u32 {
                let _ = map.delete(&q.to_ne_bytes());
            }
        }
    }
}

impl Datapath for XdpDatapath {
    fn kind(&self) -> &'static str {
        "xdp"
    }

    fn local_addr(&self) -> SocketAddr {
        SocketAddr::V4(self.local)
    }

    fn paths(&self) -> u16 {
        // `bind` opens 1..=MAX_PATHS ports.
        u16::try_from(self.ports.len()).unwrap_or(MAX_PATHS)
    }

    /// The interface MTU minus the IPv4 (20) and UDP (8) headers.
    fn max_payload(&self) -> usize {
        // `bind` refused MTUs of 28 bytes or less.
        (self.mtu as usize - frame::IP_UDP_HEADERS).min(MAX_DATAGRAM)
    }

    /// Sends `batch` in order, in chunks of up to 32 frames per TX wake-up. A path at or
    /// beyond `paths()` wraps around. A datagram that cannot go out (destination not IPv4,
    /// port 0, payload above `max_payload()`, not routed through this interface, next hop
    /// unresolved) is skipped and counted as sent, as the UDP backend does with such errors;
    /// [`XdpDatapath::stats`] counts them. The first datagram to a new destination may wait
    /// up to 100 ms for ARP. If the kernel holds every TX frame for about 10 ms, returns the
    /// number sent so far.
    fn send(&self, batch: &[Transmit<'_>]) -> io::Result<usize> {
        let max_payload = self.max_payload();
        let mut dests = [None; TX_KICK_BATCH];
        let mut macs = [None; TX_KICK_BATCH];
        let mut plans = [Plan::Unroutable; TX_KICK_BATCH];
        let mut done = 0;
        let mut blocked_since: Option<Instant> = None;
        let budget = Duration::from_nanos(SEND_BLOCK_NS_MAX);
        while done < batch.len() {
            let chunk = &batch[done..batch.len().min(done + TX_KICK_BATCH)];
            let n = chunk.len();
            for (t, d) in chunk.iter().zip(dests.iter_mut()) {
                *d = match t.dest {
                    SocketAddr::V4(a) if a.port() != 0 && t.contents.len() <= max_payload => {
                        Some(*a.ip())
                    }
                    _ => None,
                };
            }
            // `udp[0]` exists: `bind` reserves at least the path-0 port.
            self.neigh
                .resolve(&dests[..n], &mut macs[..n], &self.udp[0]);
            for ((t, mac), plan) in chunk.iter().zip(&macs).zip(plans.iter_mut()) {
                *plan = match (mac, t.dest) {
                    (Some(m), _) => Plan::Send(*m),
                    (None, SocketAddr::V4(a))
                        if a.port() != 0 && t.contents.len() > max_payload =>
                    {
                        Plan::Oversize
                    }
                    _ => Plan::Unroutable,
                };
            }
            let placed = self.place(chunk, &plans[..n]);
            done += placed;
            if placed < chunk.len() {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= budget {
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.flush(blocked_since, budget);
        Ok(done)
    }

    /// Copies each datagram into `batch` (those longer than their buffer are dropped).
    fn recv(&self, batch: &mut RecvBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.metas.clear();
        let limit = batch.bufs.len().min(RX_BATCH_MAX);
        self.serve(limit, timeout, &mut |meta, bytes| {
            batch.push(meta, bytes);
        })?;
        Ok(batch.metas.len())
    }

    fn wake(&self) {
        sys::eventfd_signal(self.wake_fd.as_raw_fd());
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("sent", s.sent),
            ("received", s.received),
            ("tx_unroutable", s.tx_unroutable),
            ("tx_oversize", s.tx_oversize),
            ("rx_rejected", s.rx_rejected),
            ("tx_kick_errors", s.tx_kick_errors),
            ("kernel_rx_dropped", s.kernel_rx_dropped),
            ("kernel_fill_ring_empty", s.kernel_fill_ring_empty),
            ("kernel_tx_invalid", s.kernel_tx_invalid),
        ]
    }

    /// Lends each UDP payload straight out of its UMEM frame; `scratch` is unused except that
    /// its length (or 64 if empty) bounds how many datagrams one call hands out.
    fn recv_with(
        &self,
        scratch: &mut RecvBatch,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        let limit = match scratch.bufs.len() {
            0 => RX_BATCH_DEFAULT,
            n => n.min(RX_BATCH_MAX),
        };
        self.serve(limit, timeout, f)
    }
}

/// The interface to attach to: the named one, checked to exist and carry `ip`, or the one
/// that carries `ip`.
fn pick_interface(named: Option<String>, ip: Ipv4Addr) -> Result<String, XdpError> {
    let addr_err = |e| XdpError::Os {
        step: "listing interface addresses",
        source: e,
    };
    match named {
        Some(name) => {
            if bpf::ifindex(&name).is_err() {
                return Err(XdpError::NoSuchInterface(name));
            }
            if !sys::interface_has_ip(&name, ip).map_err(addr_err)? {
                return Err(XdpError::AddressNotOnInterface {
                    interface: name,
                    ip,
                });
            }
            Ok(name)
        }
        None => sys::interface_with_ip(ip)
            .map_err(addr_err)?
            .ok_or(XdpError::NoInterfaceOwns(ip)),
    }
}

/// Binds one UDP socket per path: path 0 on `local`, the others on ephemeral ports of the
/// same IP. Returns the sockets and their ports.
fn reserve_ports(local: SocketAddrV4, paths: u16) -> Result<(Vec<Socket>, Vec<u16>), XdpError> {
    let mut udp = Vec::with_capacity(usize::from(paths));
    let mut ports = Vec::with_capacity(usize::from(paths));
    for path in 0..paths {
        let at = SocketAddrV4::new(*local.ip(), if path == 0 { local.port() } else { 0 });
        let socket = reserve_port_retrying(at).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => XdpError::PortInUse(at),
            _ => XdpError::Os {
                step: "binding a port-reserving UDP socket",
                source: e,
            },
        })?;
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .ok_or_else(|| XdpError::Os {
                step: "reading a UDP socket's port",
                source: io::Error::other("no port"),
            })?;
        udp.push(socket);
        ports.push(port);
    }
    Ok((udp, ports))
}

/// The AF_XDP sockets of every queue, bound.
struct OpenedSockets {
    /// One per queue, in queue order; the first registered the UMEM and has the TX ring.
    xsks: Vec<Xsk>,
    zero_copy: bool,
    busy_retries: u32,
}

/// Opens and binds one socket per queue: the first registers `umem` and gets the TX and
/// completion rings (zero-copy first if asked, else or on EOPNOTSUPP copy mode); the others
/// share the UMEM.
fn open_sockets(
    umem: &Umem,
    interface: &str,
    ifindex: u32,
    queues: u32,
    rx_per_queue: u32,
    zero_copy: bool,
    multi_buffer: bool,
) -> Result<OpenedSockets, XdpError> {
    let busy_deadline = Instant::now() + Duration::from_nanos(BIND_BUSY_NS_MAX);
    let mut busy_retries = 0;
    let first_sizes = RingSizes {
        rx: rx_per_queue,
        tx: TX_FRAMES,
        fill: rx_per_queue,
        completion: TX_FRAMES,
    };
    let sg = if multi_buffer { libc::XDP_USE_SG } else { 0 };
    let mut open_first = |mode: u16| {
        open_and_bind(
            umem,
            first_sizes,
            interface,
            ifindex,
            0,
            mode | libc::XDP_USE_NEED_WAKEUP | sg,
            None,
            busy_deadline,
            &mut busy_retries,
        )
    };
    let first = if zero_copy {
        match open_first(libc::XDP_ZEROCOPY) {
            Err(XdpError::Os {
                step: "bind",
                source,
            }) if matches!(source.raw_os_error(), Some(libc::EOPNOTSUPP | ENOTSUPP)) => {
                open_first(libc::XDP_COPY)?
            }
            r => r?,
        }
    } else {
        open_first(libc::XDP_COPY)?
    };
    let zero_copy = ring::is_zero_copy(first.fd.as_raw_fd()).unwrap_or(false);
    let first_fd = first.fd.as_raw_fd();
    let mut xsks = vec![first];
    for q in 1..queues {
        let sizes = RingSizes {
            rx: rx_per_queue,
            tx: 0,
            fill: rx_per_queue,
            completion: RX_ONLY_COMPLETION,
        };
        xsks.push(open_and_bind(
            umem,
            sizes,
            interface,
            ifindex,
            q,
            0,
            Some(first_fd),
            busy_deadline,
            &mut busy_retries,
        )?);
    }
    Ok(OpenedSockets {
        xsks,
        zero_copy,
        busy_retries,
    })
}

/// Loads the steering program for `port`, puts `sockets[q]` in its XSKMAP at `q`, and
/// attaches it to the interface.
fn load_and_attach(
    port: u16,
    sockets: &[OwnedFd],
    interface: &str,
    ifindex: u32,
    mode: XdpMode,
    frags: bool,
) -> Result<(Program, XdpLink), XdpError> {
    let program = bpf::steer_udp_port_with(port, sockets.len() as u32, frags).map_err(|e| {
        let step = "loading the XDP program";
        match e.error.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => XdpError::NotPermitted { step },
            _ => XdpError::Os {
                step,
                source: e.into(),
            },
        }
    })?;
    let xskmap = program.maps().first().ok_or(XdpError::Os {
        step: "loading the XDP program",
        source: io::Error::other("the program has no XSKMAP"),
    })?;
    for (q, fd) in sockets.iter().enumerate() {
        xskmap
            .update(&(q as u32).to_ne_bytes(), &fd.as_raw_fd().to_ne_bytes())
            .map_err(|e| os_error("inserting a socket into the XSKMAP", e))?;
    }
    let link = bpf::attach_xdp(&program, ifindex, mode).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => XdpError::NotPermitted {
            step: "attaching the XDP program",
        },
        Some(libc::EBUSY) | Some(libc::EEXIST) => XdpError::AttachBusy(interface.to_string()),
        _ => XdpError::Attach {
            interface: interface.to_string(),
            mode,
            source: e,
        },
    })?;
    Ok((program, link))
}

/// In multi-buffer mode (`frags > 1`), turns the failure of a step the kernel may refuse for
/// multi-buffer frames (bind with `XDP_USE_SG`, a frags-aware program, attaching it) into
/// [`XdpError::MultiBufferUnsupported`]; other errors pass unchanged.
fn multi_buffer_error(e: XdpError, frags: u32, interface: &str, mtu: u32) -> XdpError {
    if frags <= 1 {
        return e;
    }
    match e {
        XdpError::Os { step, source }
            if matches!(
                source.raw_os_error(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP | libc::ERANGE)
            ) =>
        {
            XdpError::MultiBufferUnsupported {
                interface: interface.to_string(),
                mtu,
                step,
                source,
            }
        }
        XdpError::Attach { source, .. } => XdpError::MultiBufferUnsupported {
            interface: interface.to_string(),
            mtu,
            step: "attaching the frags-aware XDP program",
            source,
        },
        e => e,
    }
}

/// A UDP socket bound to `at`, kept only to reserve its port: it is never read, so its
/// receive buffer is kept small.
fn reserve_port(at: SocketAddrV4) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(4096);
    socket.bind(&SocketAddr::V4(at).into())?;
    Ok(socket)
}

/// [`reserve_port`], retrying "address in use" for up to [`PORT_BUSY_NS_MAX`]: a socket
/// closed a moment ago can still be held by a child process between its fork and exec.
fn reserve_port_retrying(at: SocketAddrV4) -> io::Result<Socket> {
    let start = Instant::now();
    loop {
        match reserve_port(at) {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse
                    && start.elapsed() < Duration::from_nanos(PORT_BUSY_NS_MAX) =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            r => return r,
        }
    }
}

/// Opens a socket for queue `queue` and binds it, retrying while the queue is busy (a
/// previous socket's asynchronous teardown) until `busy_deadline`.
#[allow(clippy::too_many_arguments)]
fn open_and_bind(
    umem: &Umem,
    sizes: RingSizes,
    interface: &str,
    ifindex: u32,
    queue: u32,
    flags: u16,
    shared: Option<RawFd>,
    busy_deadline: Instant,
    busy_retries: &mut u32,
) -> Result<Xsk, XdpError> {
    let mut pause = Duration::from_millis(5);
    loop {
        let xsk = Xsk::open(umem, shared.is_none(), sizes).map_err(|(step, e)| {
            match (step, e.raw_os_error()) {
                ("XDP_UMEM_REG", Some(libc::ENOBUFS) | Some(libc::ENOMEM)) => {
                    XdpError::MemlockLimit { bytes: umem.len() }
                }
                _ => os_error(step, e),
            }
        })?;
        match xsk.bind(ifindex, queue, flags, shared) {
            Ok(()) => return Ok(xsk),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                drop(xsk);
                if Instant::now() >= busy_deadline {
                    return Err(XdpError::QueueBusy {
                        interface: interface.to_string(),
                        queue,
                    });
                }
                *busy_retries += 1;
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(os_error("bind", e)),
        }
    }
}
