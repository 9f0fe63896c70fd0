//! The engine's public vocabulary: configuration, work requests, completions, errors and
//! counters.
use std::net::SocketAddr;
use std::sync::Arc;

use braid_cc::paths::PathConfig;
use braid_cc::{ControllerFactory, SwiftConfig};

/// Most paths a connection sprays over (path index is one byte on the wire).
pub const MAX_PATHS: u16 = 256;
/// Most work requests one QP's send queue holds.
pub const MAX_SEND_WR: usize = 16_384;
/// [`EndpointConfig::rnr_retry_limit`] that never runs out: a message waits for its
/// receive however many RNR NAKs it takes, like verbs' `rnr_retry` 7 (which perftest uses).
pub const RNR_RETRY_FOREVER: u32 = u32::MAX;
/// Most work requests one QP's receive queue holds.
pub const MAX_RECV_WR: usize = 16_384;
/// Most scatter/gather entries in one work request.
pub const MAX_SGE: usize = 32;
/// Most QPs one endpoint holds.
pub const MAX_QPS: usize = 65_536;

/// Endpoint configuration. `Default` gives 16 paths and 1472-byte datagrams.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// Seed for every random choice (keys, initial PSNs, retransmit paths). The runtime
    /// seeds it from the OS; simulations pass a fixed seed to replay a run.
    pub seed: u64,
    /// Largest datagram (UDP payload) the engine emits.
    pub max_datagram: usize,
    /// Paths each connection sprays over, 1 to [`MAX_PATHS`].
    pub paths: u16,
    /// Source ports the device sends from (the datapath opens this many), `paths` to
    /// [`MAX_PATHS`]; 0 (the default) means twice `paths`, at most [`MAX_PATHS`]. Each of a
    /// connection's logical paths occupies one port; PLB re-pathing moves a congested path
    /// to a port none of the connection's other paths uses, so without spare ports (`ports ==
    /// paths`) re-pathing has nowhere to go. See [`EndpointConfig::source_ports`].
    pub ports: u16,
    /// Retransmit timeout before any RTT sample, ns.
    pub rto_initial_ns: u64,
    /// Retransmit timeout floor, ns.
    pub rto_min_ns: u64,
    /// Retransmit timeout ceiling (after backoff), ns.
    pub rto_max_ns: u64,
    /// Counted retransmit timeouts in a row, without any sign of life from the peer, before
    /// the QP may fail with `RetryExceeded`; it fails once `retry_timeout_ns` is spent too.
    /// A timeout handled late because this host stalled, or one with nothing old enough to
    /// resend, is not counted (see [`retry_timeout_ns`](Self::retry_timeout_ns)).
    pub retry_limit: u32,
    /// The retry budget as a time, ns: how long the peer may stay silent (no ACK, no new
    /// response or request, no RNR NAK) while retransmit timeouts keep firing before the QP
    /// fails with `RetryExceeded`, like verbs' `timeout x retry_cnt`. Only the intervals of
    /// counted timeouts add up, so time this host spent stalled (a descheduled progress
    /// thread, a paused process) does not count against the peer. Default 4 s; 0 leaves only
    /// [`retry_limit`](Self::retry_limit).
    pub retry_timeout_ns: u64,
    /// RNR NAKs one message may receive before it fails with `RnrRetryExceeded`;
    /// [`RNR_RETRY_FOREVER`] retries without end (the QP still fails if the peer falls
    /// silent, by the retransmit budget).
    pub rnr_retry_limit: u32,
    /// Wait after an RNR NAK before sending the message again, ns.
    pub rnr_timer_ns: u64,
    /// Send queue depth per QP (at most [`MAX_SEND_WR`]).
    pub max_send_wr: usize,
    /// Receive queue depth per QP (at most [`MAX_RECV_WR`]).
    pub max_recv_wr: usize,
    /// Burst spraying: how many consecutive new packets a QP sends on one path before it
    /// draws the next path (by the paths' weights). 1, the default, draws a path for every
    /// packet; a larger burst lets the datapath hand a run of same-path datagrams to the
    /// kernel as one UDP GSO send. 0 is read as 1. Retransmissions, ACKs and NAKs always draw
    /// their own path. A QP may override it with [`QpOptions::burst`].
    pub burst: u16,
    /// Acknowledgement coalescing: the receiver of a QP's packets acknowledges after this
    /// many new packets in order, or at once for a packet flagged [`Flags::ACK_NOW`] (its
    /// sender can send nothing more until it hears back), a packet out of order (a hole
    /// before it, or it fills one) or a duplicate; otherwise the acknowledgement waits at
    /// most [`ack_delay_ns`](Self::ack_delay_ns). An ACK never goes more than once per
    /// receive batch (the datapath's batch between two [`Endpoint::poll_transmit`] rounds),
    /// so where batches are long (UDP GRO) this changes nothing; where they are short (AF_XDP
    /// in copy mode) it spares both hosts most ACK frames. 1 acknowledges every batch. 0, the
    /// default, leaves it to the runtime: a device on AF_XDP coalesces 8, anything else (the
    /// engine on its own, the simulated network) reads it as 1. On the simulated fabric,
    /// where the network and not the host is the bottleneck, coalescing made the ACK clock
    /// burstier and the last completions of a permutation later
    /// (bench/results/ack-coalescing-2026-12-07-s35.md).
    ///
    /// [`Flags::ACK_NOW`]: crate::wire::Flags::ACK_NOW
    /// [`Endpoint::poll_transmit`]: crate::Endpoint::poll_transmit
    pub ack_every: u16,
    /// The longest an acknowledgement waits for [`ack_every`](Self::ack_every) packets, ns.
    pub ack_delay_ns: u64,
    /// Congestion controller factory. The default is Swift (delay-based, `braid_cc::Swift`)
    /// with `SwiftConfig::software_host()` settings.
    pub cc: Arc<dyn ControllerFactory>,
    /// Tuning of each QP's per-path health, weights and re-pathing. Default
    /// [`PathConfig::default`].
    pub path: PathConfig,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            seed: 0,
            max_datagram: 1472,
            paths: 16,
            ports: 0,
            rto_initial_ns: 2_000_000,
            rto_min_ns: 500_000,
            rto_max_ns: 64_000_000,
            retry_limit: 7,
            retry_timeout_ns: 4_000_000_000,
            rnr_retry_limit: 7,
            rnr_timer_ns: 200_000,
            max_send_wr: 4096,
            max_recv_wr: 4096,
            burst: 1,
            ack_every: 0,
            ack_delay_ns: 20_000,
            cc: Arc::new(SwiftConfig::software_host()),
            path: PathConfig::default(),
        }
    }
}

impl EndpointConfig {
    /// The number of source ports in force: `ports` clamped to `paths..=MAX_PATHS` (with
    /// `paths` clamped to `1..=MAX_PATHS`), or twice `paths` (at most [`MAX_PATHS`]) when
    /// `ports` is 0. The runtime opens this many ports on the datapath.
    pub fn source_ports(&self) -> u16 {
        let paths = self.paths.clamp(1, MAX_PATHS);
        if self.ports == 0 {
            paths.saturating_mul(2).min(MAX_PATHS)
        } else {
            self.ports.clamp(paths, MAX_PATHS)
        }
    }
}

/// A protection domain handle.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// A completion queue handle.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

/// Keys of a registered memory region.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// Local key, used in this side's scatter/gather entries.
    pub lkey: u32,
    /// Remote key, given to peers for WRITE, READ and atomics.
    pub rkey: u32,
}

/// What a peer needs to connect to a QP (exchanged out of band).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct QpInfo {
    /// The device address.
    pub addr: SocketAddr,
    /// The QP number.
    pub qpn: u32,
    /// The first PSN this QP will send.
    pub psn: u32,
    /// The QP's X25519 public key when it encrypts its traffic ([`crate::seal`]); `None` for
    /// a plain QP. Both sides of a connection must agree: `connect` refuses a mismatch with
    /// [`ResourceError::EncryptionMismatch`].
    pub seal_key: Option<[u8; 32]>,
}

/// Options for creating a QP. `Default` is a plain (unencrypted) QP.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct QpOptions {
    /// Encrypt and authenticate every packet of the connection with AES-256-GCM, keyed by an
    /// X25519 agreement at `connect` from this 32-byte private key ([`crate::seal`]). The
    /// engine draws no OS entropy: the runtime passes fresh random bytes, a simulation bytes
    /// derived from its seed.
    pub seal_secret: Option<[u8; 32]>,
    /// Complete receives as soon as their own bytes are placed (SRD-style), instead of
    /// after every earlier request of the QP has been placed (the default, verbs RC order).
    ///
    /// What the application gives up: "WRITE the data, then SEND (or WRITE_IMM) the
    /// notification" no longer works, because the receive of the notification may complete
    /// while packets of the earlier WRITE are still on a slower path; it must not read
    /// memory an earlier WRITE targets on the strength of a later completion. Receives still
    /// complete in posting order among themselves, and a fatal refusal still stops the QP,
    /// but receives of SENDs posted after the refused request may have completed with
    /// `Success` before the refusal arrived. What it gains: a receive's completion does not
    /// wait for unrelated earlier traffic (a large WRITE, a lost packet's repair).
    pub unordered: bool,
    /// This QP's burst size, overriding [`EndpointConfig::burst`] (which `None`, the
    /// default, keeps): consecutive new packets sent on one path per path draw.
    pub burst: Option<u16>,
}

impl QpOptions {
    /// Options for a plain QP with unordered receive completions (see
    /// [`unordered`](Self::unordered)).
    pub fn unordered() -> QpOptions {
        QpOptions {
            unordered: true,
            ..QpOptions::default()
        }
    }

    /// Options for an encrypted QP with this X25519 private key.
    pub fn encrypted(secret: [u8; 32]) -> QpOptions {
        QpOptions {
            seal_secret: Some(secret),
            ..QpOptions::default()
        }
    }

    /// These options with a burst of `packets` new packets per path draw (see
    /// [`EndpointConfig::burst`]).
    pub fn with_burst(self, packets: u16) -> QpOptions {
        QpOptions {
            burst: Some(packets),
            ..self
        }
    }
}

impl core::fmt::Debug for QpOptions {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print the private key.
        f.debug_struct("QpOptions")
            .field("encrypted", &self.seal_secret.is_some())
            .field("unordered", &self.unordered)
            .field("burst", &self.burst)
            .finish()
    }
}

/// A local scatter/gather entry: `len` bytes at `offset` in the region with key `lkey`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Local key of the region.
    pub lkey: u32,
    /// Byte offset in the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
}

/// A place in a peer's memory: remote key and byte offset in that region.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// The peer region's remote key.
    pub rkey: u32,
    /// Byte offset in that region.
    pub offset: u64,
}

/// The operation of a send work request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SendOp {
    /// SEND into the peer's next posted RECV.
    Send,
    /// SEND with 32 bits of immediate data.
    SendImm(u32),
    /// RDMA WRITE of the gathered bytes to `remote`.
    Write(RemoteAddr),
    /// RDMA WRITE with immediate: also consumes a RECV at the peer.
    WriteImm(RemoteAddr, u32),
    /// RDMA READ from `remote` into the scatter list.
    Read(RemoteAddr),
    /// Atomic fetch-and-add of `add` to the u64 at `remote`; the old value lands in the
    /// (single, 8-byte) scatter entry.
    FetchAdd(RemoteAddr, u64),
    /// Atomic compare-and-swap of the u64 at `remote`; the old value lands in the (single,
    /// 8-byte) scatter entry.
    CompareSwap {
        /// Where.
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// New value if the expected one is there.
        swap: u64,
    },
}

/// A send work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local buffers: gathered for SEND/WRITE, scattered into for READ/atomics.
    pub sges: Vec<Sge>,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

/// A receive work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's bytes are scattered.
    pub sges: Vec<Sge>,
}

/// The operation a completion reports.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcOpcode {
    /// A SEND (with or without immediate) finished.
    Send,
    /// An RDMA WRITE (with or without immediate) finished.
    Write,
    /// An RDMA READ finished.
    Read,
    /// A fetch-and-add finished.
    FetchAdd,
    /// A compare-and-swap finished.
    CompareSwap,
    /// A RECV was filled by a SEND.
    Recv,
    /// A RECV was consumed by a WRITE with immediate.
    RecvRdmaWithImm,
}

/// The status of a completion.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// It worked.
    Success,
    /// An incoming SEND was longer than the RECV's buffers.
    LocalLengthError,
    /// A local buffer could not be used (key, bounds or rights).
    LocalProtectionError,
    /// The peer refused the key, the bounds or the rights.
    RemoteAccessError,
    /// The peer found the request invalid (e.g. longer than its posted RECV).
    RemoteInvalidRequest,
    /// The peer could not perform the operation (e.g. its QP is in error).
    RemoteOperationError,
    /// No acknowledgement after the retry limit: the peer is gone or unreachable.
    RetryExceeded,
    /// The peer had no RECV posted, after every RNR retry.
    RnrRetryExceeded,
    /// Not executed: the QP went to the error state first.
    Flushed,
}

/// One completion.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Result.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes transferred (RECV: bytes received; READ: bytes read; atomics: 8).
    pub byte_len: u32,
    /// Immediate data, for RECVs consumed by SEND_IMM or WRITE_IMM.
    pub imm: Option<u32>,
    /// The QP it belongs to.
    pub qpn: u32,
}

/// State of a queue pair.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, not connected: RECVs may be posted.
    Init,
    /// Connected to a peer: everything may be posted.
    Connected,
    /// Failed: every work request completes as flushed.
    Error,
}

/// Why `post_send` or `post_recv` refused a work request. Nothing was queued.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PostError {
    /// No QP with this number.
    UnknownQp,
    /// `post_send` before `connect`.
    NotConnected,
    /// The queue is full.
    QueueFull,
    /// More than [`MAX_SGE`] entries, or a total length above `u32::MAX`.
    TooManySges,
    /// An entry names an unknown local key.
    InvalidLkey,
    /// An entry's region belongs to another protection domain.
    WrongPd,
    /// An entry reaches past the end of its region.
    OutOfBounds,
    /// An entry's region lacks local write access, needed to place incoming bytes.
    NoLocalWrite,
    /// An atomic needs exactly one 8-byte scatter entry and an 8-byte-aligned remote offset.
    BadAtomic,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            PostError::UnknownQp => "unknown queue pair",
            PostError::NotConnected => "queue pair is not connected",
            PostError::QueueFull => "work queue is full",
            PostError::TooManySges => "too many scatter/gather entries or message too long",
            PostError::InvalidLkey => "unknown local key",
            PostError::WrongPd => "memory region belongs to another protection domain",
            PostError::OutOfBounds => "scatter/gather entry outside its memory region",
            PostError::NoLocalWrite => "memory region lacks local write access",
            PostError::BadAtomic => "atomics need one 8-byte entry and an aligned remote offset",
        })
    }
}

impl std::error::Error for PostError {}

/// Why a resource operation (create, connect, register) failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResourceError {
    /// An unknown protection domain.
    UnknownPd,
    /// An unknown completion queue.
    UnknownCq,
    /// An unknown QP.
    UnknownQp,
    /// An unknown memory region key.
    UnknownMr,
    /// The QP is not in a state that allows this (e.g. connecting twice).
    BadState,
    /// A limit (`MAX_QPS`, queue depths) would be exceeded.
    Limit,
    /// The resource is still in use (e.g. a PD with regions or QPs).
    Busy,
    /// One side of the connection encrypts and the other does not (see [`QpInfo::seal_key`]).
    EncryptionMismatch,
    /// The peer's public key gives no usable shared secret (a low-order point).
    BadPeerKey,
    /// The OS random generator failed while drawing a QP's private key.
    Entropy,
    /// Not available on this device's backend (an encrypted QP on the verbs backend, or a
    /// verbs QP given a software QP's info).
    Unsupported,
}

impl core::fmt::Display for ResourceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ResourceError::UnknownPd => "unknown protection domain",
            ResourceError::UnknownCq => "unknown completion queue",
            ResourceError::UnknownQp => "unknown queue pair",
            ResourceError::UnknownMr => "unknown memory region",
            ResourceError::BadState => "queue pair is in the wrong state",
            ResourceError::Limit => "resource limit reached",
            ResourceError::Busy => "resource still in use",
            ResourceError::EncryptionMismatch => {
                "one side of the connection encrypts, the other not"
            }
            ResourceError::BadPeerKey => "the peer's public key is unusable",
            ResourceError::Entropy => "the OS random generator failed",
            ResourceError::Unsupported => "not supported by this device's backend",
        })
    }
}

impl std::error::Error for ResourceError {}

/// Ways a peer (or anyone on the network) can break the protocol. Each is counted in
/// [`EndpointStats`] and the packet is dropped; none of them stops the endpoint.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PeerViolation {
    /// The packet did not parse (length, CRC, version, kind, fields).
    Malformed,
    /// No QP with the destination number.
    UnknownQp,
    /// The source address or QP is not the connected peer's.
    WrongPeer,
    /// A PSN far outside the receive window.
    OutOfWindow,
    /// A response for no outstanding request, or one inconsistent with it.
    BadResponse,
    /// A message's length changed between its packets.
    InconsistentMessage,
    /// An ACK for packets never sent.
    BadAck,
}

/// Counters for one endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams handed to the engine.
    pub rx_datagrams: u64,
    /// Datagrams emitted.
    pub tx_datagrams: u64,
    /// Data packets retransmitted.
    pub retransmits: u64,
    /// Datagrams that failed the CRC check.
    pub rx_bad_crc: u64,
    /// Datagrams that failed to parse for other reasons.
    pub rx_malformed: u64,
    /// Packets for no known QP.
    pub rx_unknown_qp: u64,
    /// Packets from an address or QP that is not the connected peer.
    pub rx_wrong_peer: u64,
    /// Duplicate data packets suppressed.
    pub rx_duplicates: u64,
    /// Data packets beyond the receive window.
    pub rx_out_of_window: u64,
    /// Responses or ACKs inconsistent with what was sent.
    pub rx_bad_response: u64,
    /// NAKs sent.
    pub naks_sent: u64,
    /// NAKs received.
    pub naks_received: u64,
    /// Retransmit timeouts fired.
    pub rto_fired: u64,
    /// Datagrams dropped on an encrypted QP because they failed authentication: a bad tag
    /// (forged, tampered with, or sealed with another key), or not sealed at all.
    pub rx_auth_failed: u64,
    /// Sealed datagrams dropped as replays: their tag verified, but their sealing sequence
    /// number was seen before or is older than the anti-replay window.
    pub rx_replayed: u64,
    /// Delay samples dropped because they measured a host stall, this host's or the peer's,
    /// rather than the network (see the engine's `stall` module).
    pub stalled_samples: u64,
    /// READ response datagrams the datapath received straight into place and the engine
    /// accepted as such ([`crate::Landing`]): their payload was never copied by Braid.
    pub rx_landed: u64,
    /// Datagrams whose payload the engine left in its region for the datapath to send from
    /// there ([`Endpoint::set_in_place_min`](crate::Endpoint::set_in_place_min)): Braid never
    /// copied it.
    pub tx_in_place: u64,
}

/// Counters for one path (summed over the endpoint's QPs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Data packets sent on this path (first transmissions and retransmissions).
    pub packets: u64,
    /// Packets sent on this path that were declared lost.
    pub lost: u64,
    /// Retransmissions sent on this path.
    pub retransmits: u64,
    /// Smoothed RTT measured on this path, ns (0 before any sample).
    pub srtt_ns: u64,
    /// RTT samples taken on this path.
    pub rtt_samples: u64,
    /// CE marks the peer reported, charged to the path of the packet each ACK echoed.
    pub ce_marks: u64,
}
