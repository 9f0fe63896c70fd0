//! Moving Braid's datagrams, and nothing else: this crate holds no protocol logic.
//!
//! A [`Datapath`] sends batches of datagrams, each on a chosen *path* (a UDP source port, so
//! switches hashing the 5-tuple route each path differently), and receives batches. The
//! backends are [`udp`] (plain sockets, the default that needs no privileges) and [`sim`] (a
//! deterministic, seeded network for tests, which is driven directly rather than through the
//! trait because it runs on virtual time).
#![warn(missing_docs, unreachable_pub)]

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

pub mod bpf;
#[cfg(test)]
mod conformance;
pub mod fabric;
pub mod net;
pub mod sim;
mod sys;
pub mod udp;
pub mod uring;
pub mod xdp;

/// The largest datagram any backend carries (UDP payload bytes).
pub const MAX_DATAGRAM: usize = 65_507;

/// `CLOCK_MONOTONIC` now, ns: the clock a runtime driving a datapath stamps its engine's
/// events with (the clock `std::time::Instant` reads, without the `Instant` arithmetic
/// around it: a runtime reads it several times per round trip). 0 if the clock cannot be
/// read.
pub fn monotonic_ns() -> u64 {
    sys::monotonic_ns().unwrap_or(0)
}

/// The datagrams of a received buffer of `len` bytes whose UDP GRO segment size is
/// `segment` (`None`: it holds one datagram): the offset and length of each.
pub fn segments(len: usize, segment: Option<usize>) -> impl Iterator<Item = (usize, usize)> {
    sys::segments(len, segment)
}

/// ECN codepoint of an IP packet; it lives in `braid-time` so that crates without a datapath
/// (the engine, congestion control) can name it too.
pub use braid_time::Ecn;

/// Message and datagram counts of the socket backends (what segmentation offload saved).
pub use udp::OffloadStats;

/// One datagram to send.
#[derive(Debug, Clone, Copy)]
pub struct Transmit<'a> {
    /// Destination address (the peer device's address).
    pub dest: SocketAddr,
    /// Path index, `0..paths()`: selects the local source port.
    pub path: u16,
    /// ECN codepoint to set on the IP header, where the backend can.
    pub ecn: Ecn,
    /// The UDP payload.
    pub contents: &'a [u8],
}

/// What arrived with one received datagram.
#[derive(Debug, Clone, Copy)]
pub struct RecvMeta {
    /// Source address (peer IP and the source port of the path it used).
    pub src: SocketAddr,
    /// Payload length in bytes.
    pub len: usize,
    /// ECN codepoint read from the IP header (`NotEct` where the backend cannot see it).
    pub ecn: Ecn,
    /// How long the datagram waited in the kernel, from its software receive timestamp to
    /// the receive call that took it, ns (0 where the backend cannot tell). The engine
    /// takes it off its delay samples, as Swift takes the host's own delay off the fabric's.
    pub queued_ns: u32,
}

/// Where one datagram is to be received in pieces ([`Datapath::recv_landing`]): its first
/// `head` bytes into the datapath's own buffer, the next `len` at `dst`, the rest into the
/// datapath's own buffer again.
#[derive(Debug, Clone, Copy)]
pub struct LandingZone {
    /// Bytes for the datapath's first buffer (the headers).
    pub head: usize,
    /// Where the next `len` bytes go: memory of the caller's.
    pub dst: *mut u8,
    /// Bytes at `dst`.
    pub len: usize,
}

/// One datagram (or, with UDP GRO, one coalesced buffer) received in pieces by
/// [`Datapath::recv_landing`].
#[derive(Debug, Clone, Copy)]
pub struct LandedPieces<'a> {
    /// Source, ECN and wait; `len` is the whole datagram (or buffer).
    pub meta: RecvMeta,
    /// The GRO segment size when the buffer holds several datagrams.
    pub segment: Option<usize>,
    /// The bytes received into the first buffer (at most the zone's `head`).
    pub head: &'a [u8],
    /// How many bytes went to the zone's `dst`.
    pub landed: usize,
    /// The bytes received into the last buffer.
    pub tail: &'a [u8],
}

/// Where the payload of one datagram sent by [`Datapath::send_in_place`] lies: the
/// datagram is its [`Transmit::contents`] but for the `len` bytes from `at`, which are read
/// from `src` instead (memory of the caller's, such as a registered region, so the payload
/// is not copied into the transmit buffer first).
#[derive(Debug, Clone, Copy)]
pub struct InPlace {
    /// Offset of the payload in the datagram.
    pub at: usize,
    /// Where the payload's bytes are.
    pub src: *const u8,
    /// Payload bytes.
    pub len: usize,
}

/// Buffers for one batched receive, owned by the caller and reused across calls.
#[derive(Debug)]
pub struct RecvBatch {
    /// One buffer per datagram slot, each `buf_size` bytes long.
    pub bufs: Vec<Box<[u8]>>,
    /// Metadata of the datagrams received by the last call, one per filled slot.
    pub metas: Vec<RecvMeta>,
}

impl RecvBatch {
    /// Room for `count` datagrams of up to `buf_size` bytes each.
    pub fn new(count: usize, buf_size: usize) -> Self {
        RecvBatch {
            bufs: (0..count)
                .map(|_| vec![0u8; buf_size].into_boxed_slice())
                .collect(),
            metas: Vec::with_capacity(count),
        }
    }

    /// Copies one received datagram into the next free slot. Returns false (the datagram is
    /// dropped) when every slot is taken or it is longer than the slot.
    pub fn push(&mut self, meta: &RecvMeta, bytes: &[u8]) -> bool {
        let Some(dst) = self
            .bufs
            .get_mut(self.metas.len())
            .and_then(|buf| buf.get_mut(..bytes.len()))
        else {
            return false;
        };
        dst.copy_from_slice(bytes);
        self.metas.push(*meta);
        true
    }

    /// The datagrams received by the last call: metadata and payload.
    pub fn iter(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> {
        self.metas
            .iter()
            .zip(self.bufs.iter())
            .map(|(m, b)| (m, &b[..m.len]))
    }
}

/// A backend that moves datagrams between devices.
///
/// `send` may be called from several threads at once; `recv` is called by one progress
/// thread. `wake` interrupts a `recv` that is waiting, from any thread.
pub trait Datapath: Send + Sync + core::fmt::Debug {
    /// Short name for logs and reports: `"udp"`, ...
    fn kind(&self) -> &'static str;
    /// The address peers send to.
    fn local_addr(&self) -> SocketAddr;
    /// Number of paths (distinct source ports) this datapath sends on.
    fn paths(&self) -> u16;
    /// Largest UDP payload this datapath sends without fragmenting.
    fn max_payload(&self) -> usize;
    /// Sends as many of `batch` as it can without blocking for long; returns how many were
    /// handed to the kernel (the rest should be retried or treated as lost).
    fn send(&self, batch: &[Transmit<'_>]) -> io::Result<usize>;
    /// The shortest payload [`send_in_place`](Datapath::send_in_place) sends from where it
    /// lies, or `None` (the default) if this backend copies every datagram it sends.
    fn in_place_min(&self) -> Option<usize> {
        None
    }
    /// [`send`](Datapath::send), where `payloads[i]`, if given, says where datagram `i`'s
    /// payload lies ([`InPlace`]); `payloads` may be shorter than `batch` (the rest have
    /// none). A backend whose [`in_place_min`](Datapath::in_place_min) is `None` refuses
    /// with `Unsupported` (the default).
    ///
    /// # Safety
    /// Each payload's `src` is valid for reads of its `len` bytes until the call returns,
    /// and `at + len` is at most its datagram's `contents.len()`.
    unsafe fn send_in_place(
        &self,
        batch: &[Transmit<'_>],
        payloads: &[Option<InPlace>],
    ) -> io::Result<usize> {
        let _ = (batch, payloads);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Waits up to `timeout` (forever if `None`) for datagrams, then fills `batch` with as
    /// many as are ready without waiting again. Returns the number received (0 on timeout or
    /// wake-up).
    fn recv(&self, batch: &mut RecvBatch, timeout: Option<Duration>) -> io::Result<usize>;
    /// Makes a waiting or the next `recv` return promptly.
    fn wake(&self);

    /// What this datapath and the kernel under it counted since bind, by name, for reports
    /// and diagnosis: datagrams the kernel dropped before we could receive them, messages
    /// against datagrams with segmentation offload. Empty for a backend that counts nothing.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// Whether [`recv_landing`](Datapath::recv_landing) can receive at all on this backend.
    fn lands(&self) -> bool {
        false
    }

    /// Receives, without waiting, up to `zones.len()` datagrams, the `i`-th cut over
    /// `zones[i]` as it is received (the payload of a datagram whose place is known lands
    /// there, with no copy), and hands each to `f` with its index. Returns how many, or
    /// `None` if this backend cannot receive so (the default) or cannot now (datagrams of an
    /// earlier receive still wait to be handed over): the caller then uses
    /// [`recv_with`](Datapath::recv_with). A datagram cut at other lengths than the zone's
    /// (not the one the caller expected) is the caller's to put back together.
    ///
    /// # Safety
    /// Each zone's `dst` is valid for writes of its `len` bytes until the call returns, and
    /// the zones do not overlap each other; what the kernel writes there is any bytes.
    unsafe fn recv_landing(
        &self,
        zones: &[LandingZone],
        f: &mut dyn FnMut(usize, &LandedPieces<'_>),
    ) -> io::Result<Option<usize>> {
        let _ = (zones, f);
        Ok(None)
    }

    /// Like [`recv`](Datapath::recv), but hands each datagram to `f` as a borrowed slice, so
    /// the caller can copy the payload straight to its final place. Backends that own their
    /// receive buffers (AF_XDP's UMEM) lend them without copying and leave `scratch` unused;
    /// the others receive into `scratch` first. Returns the number of datagrams handed over.
    fn recv_with(
        &self,
        scratch: &mut RecvBatch,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(&RecvMeta, &[u8]),
    ) -> io::Result<usize> {
        let n = self.recv(scratch, timeout)?;
        for (meta, bytes) in scratch.iter().take(n) {
            f(meta, bytes);
        }
        Ok(n)
    }
}
