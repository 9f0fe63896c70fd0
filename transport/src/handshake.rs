//! The connection handshake: how two devices set up a connected QP pair without an
//! out-of-band exchange, so that "the first operation to an address" is enough.
//!
//! [`Handshake`] is a sans-IO state machine like the engine: it takes `now` and received
//! datagrams, queues datagrams to send and events to report, and says when it next needs
//! [`handle_timeout`](Handshake::handle_timeout). It creates no QP itself: the runtime passes a
//! QP when it starts a connection and a factory for requests it accepts, and applies the
//! resulting `connect` to the engine. The runtime ([`crate::Device::connect_to`] and friends)
//! intercepts datagrams addressed to [`HANDSHAKE_QPN`] before they reach the engine; no engine
//! QP ever has that number (engine QP numbers are 24 bits).
//!
//! The exchange:
//! - **REQUEST** (requester → responder): the requester's QP ([`QpInfo`]), its incarnation id
//!   and feature bits. Retransmitted with exponential backoff until a REPLY or REJECT arrives,
//!   at most [`HandshakeConfig::max_tries`] times; then the attempt fails.
//! - **REPLY** (responder → requester): the responder's QP, echoing the requester's QP number
//!   and incarnation so a stale reply cannot connect a newer attempt. A duplicate REQUEST gets
//!   the same REPLY again; replies themselves are never retransmitted.
//! - **REJECT**: the request cannot be served (version, features, limits); carries a reason.
//! - **CONFIRM** (requester → responder): sent for every REPLY that connects (or repeats the
//!   connection of) an attempt, in REPLY's layout, echoing the responder's QP number and
//!   incarnation. It proves the requester owns its source address and uses the connection.
//!
//! Accepting is bounded, so a request flood cannot use up the device's QPs (each accepted
//! request creates one): at most [`HandshakeConfig::max_accepted_per_source`] accepted
//! connections per source IP address, and at most [`HandshakeConfig::max_unconfirmed`]
//! accepted connections whose CONFIRM has not arrived (at most
//! [`HandshakeConfig::max_unconfirmed_per_source`] of them from one source IP address). A
//! request beyond a limit is answered with a REJECT ([`RejectReason::Limit`]), which the
//! requester reports as a failed attempt, except that an unconfirmed connection older than
//! [`HandshakeConfig::unconfirmed_grace_ns`] makes room first
//! ([`HandshakeEvent::Expired`]: a requester with a forged source address never sees the
//! REPLY, so its connections never confirm).
//!
//! Rules:
//! - A REQUEST from a peer this side knows nothing about is accepted (the factory gives the QP),
//!   and reported as [`HandshakeEvent::Connected`] with `accepted: true`.
//! - **Simultaneous connects** resolve to one QP pair: a side that is itself connecting when the
//!   peer's REQUEST arrives connects its pending QP to the peer's and replies with it. The peer
//!   does the same, so each side ends with its own pending QP connected to the other's; the
//!   REPLYs that follow carry the same QPs and are duplicates.
//! - **Incarnations** identify a run of a device. The runtime draws them from the wall clock
//!   at open, so a restarted peer has a larger one. A REQUEST with a newer incarnation (or, from
//!   the same incarnation, for another QP: the peer gave up and tried again) replaces the
//!   connection: [`HandshakeEvent::Replaced`] names the old local QP, then a fresh local QP is
//!   connected. A REQUEST with an older incarnation is stale and dropped.
//! - **Attempts** are numbered per device run, increasing: every REQUEST carries its
//!   attempt's number, every other message the newest number its sender has used. A REQUEST
//!   from the connected peer's incarnation for another QP is stale (dropped, not a
//!   replacement) if its number is no newer than what this side has seen of the peer with
//!   the connection: a retransmitted REQUEST of an attempt the peer has since replaced must
//!   not retire the newer connection.
//!
//! On the verbs backend the same exchange runs over a UDP socket of the device's own (bound to
//! [`DeviceConfig::local`](crate::DeviceConfig::local)) and carries the NIC's QP: the sender
//! sets [`FEATURE_ROCE`] and puts its port GID in the address field (IPv6) and its handshake
//! UDP port in the port field; the receiver keys the peer by source IP and that port, as
//! always, and keeps the GID, QP number and PSN as the remote [`QpInfo`] (on
//! [`ROCE_V2_PORT`], as every verbs `QpInfo`). A request whose RoCE bit differs from the
//! responder's is rejected ([`RejectReason::Features`]): a software QP cannot talk to a NIC's.
//!
//! Nothing a peer sends can panic this code: every field is parsed with bounds checks and a
//! malformed datagram is counted and dropped.
//!
//! ```text
//! Handshake datagram (all integers big-endian), 60 to 104 bytes:
//!  0               1               2               3
//! +---------------+---------------+---------------+---------------+
//! | version (1) | kind 16/17/18/19| reject reason |  family 4/6   |
//! +---------------+---------------+---------------+---------------+
//! |              destination QP number = 0xffffffff               |
//! +---------------------------------------------------------------+
//! |              sender's incarnation id (64 bits)                |
//! +---------------------------------------------------------------+
//! | echoed incarnation: the peer's (REPLY/REJECT/CONFIRM), else 0 |
//! +---------------------------------------------------------------+
//! | attempt (64 bits): REQUEST its attempt's number, else the     |
//! | newest attempt number the sender has used (0: none)           |
//! +---------------------------------------------------------------+
//! |                         feature bits                          |
//! +---------------------------------------------------------------+
//! |  echoed QP number: the peer's (REPLY/REJECT/CONFIRM), else 0  |
//! +---------------------------------------------------------------+
//! |                 sender's QP number (QpInfo.qpn)               |
//! +---------------------------------------------------------------+
//! |                 sender's first PSN (QpInfo.psn)               |
//! +-------------------------------+---------------+---------------+
//! |   sender's device UDP port    |  has seal key |  reserved (0) |
//! +-------------------------------+---------------+---------------+
//! |   sender's device IP address (4 or 16 bytes; with the RoCE    |
//! |   feature bit: the port GID of the sender's RDMA device)      |
//! +---------------------------------------------------------------+
//! |   X25519 public key (32 bytes), only if "has seal key" is 1   |
//! +---------------------------------------------------------------+
//! |   check: FNV-1a (32 bits) of every byte before it             |
//! +---------------------------------------------------------------+
//! ```
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use braid_datapath::Datapath;
use braid_proto::{
    CqId, Endpoint, PdId, PostError, QpInfo, RecvWr, ResourceError, SendWr, Timestamp,
};
use braid_sync::Event;

use crate::{CompletionQueue, Device, ProtectionDomain};

/// The destination QP number of every handshake datagram. Engine QP numbers fit in 24 bits, so
/// no QP has it.
pub const HANDSHAKE_QPN: u32 = u32::MAX;
/// The handshake's wire version. A REQUEST with another version is answered with a REJECT
/// ([`RejectReason::Version`]).
pub const HANDSHAKE_VERSION: u8 = 2;
/// Feature bit: the sender's QP encrypts its traffic (its seal key is in the datagram).
pub const FEATURE_SEAL: u32 = 1;
/// Feature bit: the sender's QP is an RDMA NIC's RC QP (the verbs backend); the address field
/// holds its port GID, the port field its handshake UDP port.
pub const FEATURE_ROCE: u32 = 2;
/// Feature bits this implementation understands; a REQUEST with others is rejected.
pub const FEATURES_KNOWN: u32 = FEATURE_SEAL | FEATURE_ROCE;
/// The UDP port of RoCE v2, which every verbs QP's [`QpInfo`] names (the remote QP of a
/// connection made with [`FEATURE_ROCE`] gets it).
pub const ROCE_V2_PORT: u16 = 4791;
/// Most peers one handshake tracks (connecting or connected); requests beyond are rejected.
pub const MAX_PEERS: usize = 65_536;
/// Most datagrams waiting to be sent; beyond, new ones are dropped (requests are retransmitted,
/// a lost reply is answered again when the request repeats).
pub const MAX_QUEUED_DATAGRAMS: usize = 4096;
/// Most events waiting to be polled; beyond, the oldest is dropped.
pub const MAX_QUEUED_EVENTS: usize = 65_536;
/// Largest handshake datagram, bytes.
pub const MAX_DATAGRAM: usize = FIXED_LEN + 16 + 32 + 4;

const KIND_REQUEST: u8 = 16;
const KIND_REPLY: u8 = 17;
const KIND_REJECT: u8 = 18;
const KIND_CONFIRM: u8 = 19;
const FIXED_LEN: usize = 52;

/// Whether `datagram` is addressed to the handshake (and so is not the engine's).
pub fn is_handshake(datagram: &[u8]) -> bool {
    datagram.len() >= 8 && datagram[4..8] == HANDSHAKE_QPN.to_be_bytes()
}

/// Handshake timers and limits.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct HandshakeConfig {
    /// Wait before the first retransmission of a REQUEST, ns.
    pub rto_initial_ns: u64,
    /// Longest wait between retransmissions (after doubling), ns.
    pub rto_max_ns: u64,
    /// REQUESTs sent (the first included) before the attempt fails.
    pub max_tries: u32,
    /// Most accepted connections from one source IP address (confirmed or not).
    pub max_accepted_per_source: usize,
    /// Most accepted connections, over all sources, whose CONFIRM has not arrived.
    pub max_unconfirmed: usize,
    /// Most accepted connections from one source IP address whose CONFIRM has not arrived.
    pub max_unconfirmed_per_source: usize,
    /// Age after which an unconfirmed accepted connection may be dropped to make room for a
    /// new request, ns.
    pub unconfirmed_grace_ns: u64,
}

impl Default for HandshakeConfig {
    /// 20 ms, doubling to 1 s, 10 tries: an attempt gives up after about 5 s. 4096 accepted
    /// connections per source address (a host may run many processes), 1024 unconfirmed in
    /// all and 64 per source, 2 s of grace (a CONFIRM follows the REPLY within a round trip).
    fn default() -> Self {
        HandshakeConfig {
            rto_initial_ns: 20_000_000,
            rto_max_ns: 1_000_000_000,
            max_tries: 10,
            max_accepted_per_source: 4096,
            max_unconfirmed: 1024,
            max_unconfirmed_per_source: 64,
            unconfirmed_grace_ns: 2_000_000_000,
        }
    }
}

/// Why a request was refused (carried in a REJECT).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// The responder speaks another handshake version.
    Version,
    /// The request asks for features the responder lacks (or lacks ones it requires, such as
    /// encryption on both sides or neither).
    Features,
    /// The responder cannot create another QP or track another peer, or this source has as
    /// many connections (or unconfirmed ones) as the responder allows.
    Limit,
    /// The responder does not accept connections (no handshake enabled), or refused this one.
    Refused,
    /// A reason this version does not know.
    Other(u8),
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            RejectReason::Version => 1,
            RejectReason::Features => 2,
            RejectReason::Limit => 3,
            RejectReason::Refused => 4,
            RejectReason::Other(c) => c,
        }
    }

    fn from_code(c: u8) -> RejectReason {
        match c {
            1 => RejectReason::Version,
            2 => RejectReason::Features,
            3 => RejectReason::Limit,
            4 => RejectReason::Refused,
            c => RejectReason::Other(c),
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectReason::Version => f.write_str("handshake version not supported"),
            RejectReason::Features => f.write_str("feature mismatch"),
            RejectReason::Limit => f.write_str("the peer is out of QPs or peer slots"),
            RejectReason::Refused => f.write_str("the peer refused the connection"),
            RejectReason::Other(c) => write!(f, "rejected (reason {c})"),
        }
    }
}

/// Why a connection attempt ended without a connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectFailure {
    /// No answer after [`HandshakeConfig::max_tries`] requests.
    Timeout,
    /// The peer answered with a REJECT.
    Rejected(RejectReason),
    /// An accepted connection was never confirmed by its requester and was dropped to make
    /// room for another request.
    Unconfirmed,
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectFailure::Timeout => f.write_str("no answer from the peer"),
            ConnectFailure::Rejected(r) => write!(f, "{r}"),
            ConnectFailure::Unconfirmed => f.write_str("the requester never confirmed"),
        }
    }
}

/// What the handshake reports to the runtime, in the order it happened.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeEvent {
    /// `local` is now connected to `remote`: the runtime connects the engine QP.
    Connected {
        /// The peer device's address (the key of the connection).
        peer: SocketAddr,
        /// This side's QP.
        local: QpInfo,
        /// The peer's QP, its address normalised to `peer`.
        remote: QpInfo,
        /// The peer's incarnation id.
        incarnation: u64,
        /// Whether the peer started it (this side never called `connect` for it).
        accepted: bool,
    },
    /// The peer restarted (or retried with another QP): the connection of `old_local` is gone
    /// and a `Connected` for its replacement follows.
    Replaced {
        /// The peer device's address.
        peer: SocketAddr,
        /// The local QP of the old connection: the runtime fails it.
        old_local: QpInfo,
    },
    /// An accepted connection whose requester never confirmed it was dropped to make room
    /// (see the module docs): the runtime fails and destroys `local`.
    Expired {
        /// The peer device's address.
        peer: SocketAddr,
        /// The local QP of the dropped connection.
        local: QpInfo,
    },
    /// An attempt started with `connect` ended without a connection.
    Failed {
        /// The peer device's address.
        peer: SocketAddr,
        /// The local QP the attempt offered.
        local: QpInfo,
        /// Why.
        reason: ConnectFailure,
    },
}

/// Why [`Handshake::connect`] refused to start.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StartError {
    /// An attempt to this peer is under way, or the connection exists.
    Exists,
    /// [`MAX_PEERS`] peers are tracked already.
    Limit,
}

/// The state of one peer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// A REQUEST is out, offering `local`.
    Connecting {
        /// The QP offered.
        local: QpInfo,
    },
    /// Connected.
    Connected {
        /// This side's QP.
        local: QpInfo,
        /// The peer's QP.
        remote: QpInfo,
        /// The peer's incarnation id.
        incarnation: u64,
    },
}

/// Counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct HandshakeStats {
    /// REQUESTs sent, retransmissions included.
    pub requests_sent: u64,
    /// REQUESTs retransmitted.
    pub retransmits: u64,
    /// REPLYs sent.
    pub replies_sent: u64,
    /// REJECTs sent.
    pub rejects_sent: u64,
    /// Datagrams that did not parse (length, check, kind, address family).
    pub malformed: u64,
    /// Well-formed datagrams that matched no attempt (stale, duplicate or from an old
    /// incarnation) and were dropped.
    pub stale: u64,
    /// CONFIRMs sent.
    pub confirms_sent: u64,
    /// Accepted connections confirmed by their requester.
    pub confirmed: u64,
    /// Requests rejected because a per-source or unconfirmed limit was reached.
    pub limit_rejects: u64,
    /// Unconfirmed accepted connections dropped to make room.
    pub expired: u64,
}

struct Attempt {
    local: QpInfo,
    /// This attempt's number (see the module docs).
    number: u64,
    tries: u32,
    rto_ns: u64,
    deadline: Timestamp,
}

enum Peer {
    Connecting(Attempt),
    Connected {
        local: QpInfo,
        remote: QpInfo,
        incarnation: u64,
        /// The newest attempt number seen from the peer with this connection: its REQUEST's,
        /// or what its REPLY said it had used.
        peer_attempt: u64,
        origin: Origin,
    },
}

/// Who started a connection, and for accepted ones whether the requester confirmed it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Origin {
    /// This side connected (or both did at once).
    Ours,
    /// Accepted from the peer; `unconfirmed_since` is when, until its CONFIRM arrives.
    Accepted {
        unconfirmed_since: Option<Timestamp>,
    },
}

/// What one source IP address holds of the accept limits.
#[derive(Copy, Clone, Debug, Default)]
struct SourceCount {
    accepted: usize,
    unconfirmed: usize,
}

/// The handshake state machine of one device (see the module docs).
///
/// Polling order, as for the engine: feed [`handle_datagram`](Self::handle_datagram) and
/// [`handle_timeout`](Self::handle_timeout) (when [`poll_timeout`](Self::poll_timeout) has
/// passed), then drain [`poll_event`](Self::poll_event) (apply each `Connected` to the engine)
/// and [`poll_transmit`](Self::poll_transmit).
pub struct Handshake {
    cfg: HandshakeConfig,
    /// This device's address (its port goes into REJECTs, which carry no QP).
    local: SocketAddr,
    incarnation: u64,
    /// The newest attempt number used (0: none yet).
    attempts: u64,
    peers: HashMap<SocketAddr, Peer>,
    /// Accept-limit counts per source IP address (entries with both counts zero are removed).
    sources: HashMap<IpAddr, SourceCount>,
    /// Unconfirmed accepted connections, oldest first (by acceptance time, then address).
    unconfirmed: std::collections::BTreeSet<(Timestamp, SocketAddr)>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<HandshakeEvent>,
    stats: HandshakeStats,
    /// This device's QPs are an RDMA NIC's ([`FEATURE_ROCE`]).
    roce: bool,
}

impl Handshake {
    /// A handshake for the device at `local` whose run is identified by `incarnation`
    /// (larger after a restart: the runtime uses the wall clock, in ns).
    pub fn new(cfg: HandshakeConfig, local: SocketAddr, incarnation: u64) -> Handshake {
        Handshake {
            cfg,
            local,
            incarnation,
            attempts: 0,
            peers: HashMap::new(),
            sources: HashMap::new(),
            unconfirmed: std::collections::BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: HandshakeStats::default(),
            roce: false,
        }
    }

    /// The same for a device whose QPs are an RDMA NIC's (the verbs backend): every message
    /// carries [`FEATURE_ROCE`], local QPs' addresses are their port GIDs, and only peers
    /// that are RoCE too are served (see the module docs).
    pub fn new_roce(cfg: HandshakeConfig, local: SocketAddr, incarnation: u64) -> Handshake {
        Handshake {
            roce: true,
            ..Handshake::new(cfg, local, incarnation)
        }
    }

    /// Whether this handshake serves RDMA NIC QPs ([`new_roce`](Self::new_roce)).
    pub fn is_roce(&self) -> bool {
        self.roce
    }

    /// This device's incarnation id.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Counters.
    pub fn stats(&self) -> HandshakeStats {
        self.stats
    }

    /// Where the connection to `peer` stands.
    pub fn state(&self, peer: SocketAddr) -> Option<PeerState> {
        self.peers.get(&peer).map(|p| match p {
            Peer::Connecting(a) => PeerState::Connecting { local: a.local },
            Peer::Connected {
                local,
                remote,
                incarnation,
                ..
            } => PeerState::Connected {
                local: *local,
                remote: *remote,
                incarnation: *incarnation,
            },
        })
    }

    /// Peers tracked (connecting or connected).
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Starts connecting to the device at `peer`, offering the local QP `local` (in `Init`).
    /// The first REQUEST is queued at once.
    pub fn connect(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        local: QpInfo,
    ) -> Result<(), StartError> {
        if self.peers.contains_key(&peer) {
            return Err(StartError::Exists);
        }
        if self.peers.len() >= MAX_PEERS {
            return Err(StartError::Limit);
        }
        let rto_ns = self.cfg.rto_initial_ns.max(1);
        self.attempts += 1;
        let number = self.attempts;
        self.set_peer(
            peer,
            Peer::Connecting(Attempt {
                local,
                number,
                tries: 1,
                rto_ns,
                deadline: now + std::time::Duration::from_nanos(rto_ns),
            }),
        );
        self.send_request(peer, local, number);
        Ok(())
    }

    /// Forgets `peer` (its connection failed or was closed): a later request from it is
    /// accepted as new, and a later `connect` starts afresh. Returns what was known.
    pub fn forget(&mut self, peer: SocketAddr) -> Option<PeerState> {
        let s = self.state(peer);
        self.take_peer(peer);
        s
    }

    /// Accepted connections from `ip`, and how many of them are unconfirmed.
    pub fn accepted_from(&self, ip: IpAddr) -> (usize, usize) {
        self.sources
            .get(&ip)
            .map_or((0, 0), |c| (c.accepted, c.unconfirmed))
    }

    /// Accepted connections whose CONFIRM has not arrived, over all sources.
    pub fn unconfirmed_count(&self) -> usize {
        self.unconfirmed.len()
    }

    /// Stores `p` for `peer`, replacing (and uncounting) what was there, and counts it.
    fn set_peer(&mut self, peer: SocketAddr, p: Peer) {
        self.take_peer(peer);
        if let Peer::Connected {
            origin: Origin::Accepted { unconfirmed_since },
            ..
        } = &p
        {
            let c = self.sources.entry(peer.ip()).or_default();
            c.accepted += 1;
            if let Some(t) = unconfirmed_since {
                c.unconfirmed += 1;
                self.unconfirmed.insert((*t, peer));
            }
        }
        self.peers.insert(peer, p);
    }

    /// Removes `peer` and uncounts it.
    fn take_peer(&mut self, peer: SocketAddr) -> Option<Peer> {
        let p = self.peers.remove(&peer)?;
        if let Peer::Connected {
            origin: Origin::Accepted { unconfirmed_since },
            ..
        } = &p
            && let Some(c) = self.sources.get_mut(&peer.ip())
        {
            c.accepted = c.accepted.saturating_sub(1);
            if let Some(t) = unconfirmed_since {
                c.unconfirmed = c.unconfirmed.saturating_sub(1);
                self.unconfirmed.remove(&(*t, peer));
            }
            if c.accepted == 0 && c.unconfirmed == 0 {
                self.sources.remove(&peer.ip());
            }
        }
        Some(p)
    }

    /// Drops the oldest unconfirmed accepted connection (from `ip` only, if given) if it is
    /// older than the grace time. Returns whether one was dropped.
    fn expire_one(&mut self, now: Timestamp, ip: Option<IpAddr>, exclude: SocketAddr) -> bool {
        let grace = Duration::from_nanos(self.cfg.unconfirmed_grace_ns);
        let victim = self
            .unconfirmed
            .iter()
            .take_while(|(t, _)| *t + grace <= now)
            .find(|(_, p)| *p != exclude && ip.is_none_or(|ip| p.ip() == ip))
            .map(|&(_, p)| p);
        let Some(peer) = victim else { return false };
        if let Some(Peer::Connected { local, .. }) = self.take_peer(peer) {
            self.stats.expired += 1;
            self.push_event(HandshakeEvent::Expired { peer, local });
        }
        true
    }

    /// Whether a new accepted connection from `peer` fits the accept limits (after dropping
    /// expired unconfirmed ones to make room). The peer's own accepted connection, which the
    /// new one would replace, does not count against it.
    fn admit(&mut self, now: Timestamp, peer: SocketAddr) -> bool {
        let ip = peer.ip();
        let (own_acc, own_unc) = match self.peers.get(&peer) {
            Some(Peer::Connected {
                origin: Origin::Accepted { unconfirmed_since },
                ..
            }) => (1, usize::from(unconfirmed_since.is_some())),
            _ => (0, 0),
        };
        let (acc, _) = self.accepted_from(ip);
        if acc.saturating_sub(own_acc) >= self.cfg.max_accepted_per_source {
            return false;
        }
        while self.accepted_from(ip).1.saturating_sub(own_unc)
            >= self.cfg.max_unconfirmed_per_source
        {
            if !self.expire_one(now, Some(ip), peer) {
                return false;
            }
        }
        while self.unconfirmed.len().saturating_sub(own_unc) >= self.cfg.max_unconfirmed {
            if !self.expire_one(now, None, peer) {
                return false;
            }
        }
        true
    }

    /// Processes one datagram addressed to [`HANDSHAKE_QPN`] from `src`. `accept` gives a
    /// fresh local QP for a request this side did not start (or a replacement), given the
    /// peer's; it may refuse with a reason, which is sent back in a REJECT.
    pub fn handle_datagram(
        &mut self,
        now: Timestamp,
        src: SocketAddr,
        datagram: &[u8],
        accept: &mut dyn FnMut(&QpInfo) -> Result<QpInfo, RejectReason>,
    ) {
        let msg = match Message::parse(datagram) {
            Ok(m) => m,
            Err(ParseError::Version { kind }) => {
                if kind == KIND_REQUEST {
                    self.send_reject_raw(src, 0, 0, RejectReason::Version);
                } else {
                    self.stats.malformed += 1;
                }
                return;
            }
            Err(ParseError::Malformed) => {
                self.stats.malformed += 1;
                return;
            }
        };
        // The peer's device address: its own port, the IP it sent from (it may have bound
        // a wildcard address).
        let peer = SocketAddr::new(src.ip(), msg.info.addr.port());
        let mut remote = msg.info;
        let roce = msg.kind != KIND_REJECT && msg.features & FEATURE_ROCE != 0;
        if roce {
            // The address field is the peer QP's port GID: a GID is 16 bytes.
            if !msg.info.addr.is_ipv6() {
                self.stats.malformed += 1;
                return;
            }
            remote.addr = SocketAddr::new(msg.info.addr.ip(), ROCE_V2_PORT);
        } else {
            remote.addr = peer;
        }
        if roce != self.roce && msg.kind != KIND_REJECT {
            // A software QP and a NIC's cannot talk: refuse a request, drop the rest (a
            // well-behaved peer never answers a request it could not serve).
            if msg.kind == KIND_REQUEST {
                self.send_reject_raw(peer, msg.incarnation, msg.info.qpn, RejectReason::Features);
            } else {
                self.stats.stale += 1;
            }
            return;
        }
        match msg.kind {
            KIND_REQUEST => self.on_request(now, peer, remote, &msg, accept),
            KIND_REPLY => self.on_reply(peer, remote, &msg),
            KIND_REJECT => self.on_reject(peer, &msg),
            KIND_CONFIRM => self.on_confirm(peer, remote, &msg),
            _ => self.stats.malformed += 1,
        }
    }

    fn on_request(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        remote: QpInfo,
        msg: &Message,
        accept: &mut dyn FnMut(&QpInfo) -> Result<QpInfo, RejectReason>,
    ) {
        if msg.features & !FEATURES_KNOWN != 0 {
            self.send_reject_raw(peer, msg.incarnation, remote.qpn, RejectReason::Features);
            return;
        }
        let mut replaced = None;
        match self.peers.get(&peer) {
            None => {
                if self.peers.len() >= MAX_PEERS {
                    self.send_reject_raw(peer, msg.incarnation, remote.qpn, RejectReason::Limit);
                    return;
                }
            }
            Some(Peer::Connecting(a)) => {
                // Simultaneous connect: our pending QP serves the peer's request.
                let local = a.local;
                self.establish(peer, local, remote, msg, Origin::Ours);
                self.send_reply(peer, local, msg.incarnation, remote.qpn);
                return;
            }
            Some(Peer::Connected {
                local,
                remote: known,
                incarnation,
                peer_attempt,
                ..
            }) => {
                if msg.incarnation < *incarnation {
                    self.stats.stale += 1;
                    return;
                }
                if msg.incarnation == *incarnation {
                    if known.qpn == remote.qpn {
                        // A duplicate (our reply was lost): answer again.
                        let local = *local;
                        self.send_reply(peer, local, msg.incarnation, remote.qpn);
                        return;
                    }
                    if msg.attempt <= *peer_attempt {
                        // A late copy of an attempt the peer has moved on from.
                        self.stats.stale += 1;
                        return;
                    }
                }
                replaced = Some(*local);
            }
        }
        if !self.admit(now, peer) {
            // A refused replacement leaves the old connection standing, as below.
            self.stats.limit_rejects += 1;
            self.send_reject_raw(peer, msg.incarnation, remote.qpn, RejectReason::Limit);
            return;
        }
        match accept(&remote) {
            Ok(local) => {
                if let Some(old_local) = replaced {
                    self.push_event(HandshakeEvent::Replaced { peer, old_local });
                }
                let origin = Origin::Accepted {
                    unconfirmed_since: Some(now),
                };
                self.establish(peer, local, remote, msg, origin);
                self.send_reply(peer, local, msg.incarnation, remote.qpn);
            }
            Err(reason) => {
                // A refused replacement leaves the old connection standing: the new request
                // may be forged or the QP limit reached, and the old QP may still be in use.
                self.send_reject_raw(peer, msg.incarnation, remote.qpn, reason);
            }
        }
    }

    fn on_reply(&mut self, peer: SocketAddr, remote: QpInfo, msg: &Message) {
        if msg.echo_incarnation != self.incarnation {
            self.stats.stale += 1;
            return;
        }
        match self.peers.get(&peer) {
            Some(Peer::Connecting(a)) if a.local.qpn == msg.echo_qpn => {
                let local = a.local;
                self.establish(peer, local, remote, msg, Origin::Ours);
                self.send_confirm(peer, local, msg.incarnation, remote.qpn);
            }
            Some(Peer::Connected {
                local,
                remote: known,
                incarnation,
                ..
            }) if local.qpn == msg.echo_qpn
                && known.qpn == remote.qpn
                && *incarnation == msg.incarnation =>
            {
                // A duplicate REPLY (our REQUEST was repeated): confirm again, in case the
                // first CONFIRM was lost.
                let local = *local;
                self.send_confirm(peer, local, msg.incarnation, remote.qpn);
            }
            _ => self.stats.stale += 1,
        }
    }

    fn on_confirm(&mut self, peer: SocketAddr, remote: QpInfo, msg: &Message) {
        if msg.echo_incarnation != self.incarnation {
            self.stats.stale += 1;
            return;
        }
        match self.peers.get(&peer) {
            Some(Peer::Connected {
                local,
                remote: known,
                incarnation,
                peer_attempt,
                origin,
            }) if local.qpn == msg.echo_qpn
                && known.qpn == remote.qpn
                && *incarnation == msg.incarnation =>
            {
                if let Origin::Accepted {
                    unconfirmed_since: Some(_),
                } = *origin
                {
                    let (local, known, incarnation) = (*local, *known, *incarnation);
                    let peer_attempt = (*peer_attempt).max(msg.attempt);
                    self.stats.confirmed += 1;
                    self.set_peer(
                        peer,
                        Peer::Connected {
                            local,
                            remote: known,
                            incarnation,
                            peer_attempt,
                            origin: Origin::Accepted {
                                unconfirmed_since: None,
                            },
                        },
                    );
                }
                // Otherwise confirmed already, or started here (simultaneous connect): nothing
                // to do.
            }
            _ => self.stats.stale += 1,
        }
    }

    fn on_reject(&mut self, peer: SocketAddr, msg: &Message) {
        if msg.echo_incarnation != self.incarnation && msg.echo_incarnation != 0 {
            self.stats.stale += 1;
            return;
        }
        match self.peers.get(&peer) {
            Some(Peer::Connecting(a))
                if a.local.qpn == msg.echo_qpn || (msg.echo_qpn == 0 && msg.reason != 0) =>
            {
                let local = a.local;
                self.take_peer(peer);
                self.push_event(HandshakeEvent::Failed {
                    peer,
                    local,
                    reason: ConnectFailure::Rejected(RejectReason::from_code(msg.reason)),
                });
            }
            _ => self.stats.stale += 1,
        }
    }

    /// Connects `local` to the peer's `remote`, which `msg` (its REQUEST or REPLY) offered.
    fn establish(
        &mut self,
        peer: SocketAddr,
        local: QpInfo,
        remote: QpInfo,
        msg: &Message,
        origin: Origin,
    ) {
        let incarnation = msg.incarnation;
        self.set_peer(
            peer,
            Peer::Connected {
                local,
                remote,
                incarnation,
                peer_attempt: msg.attempt,
                origin,
            },
        );
        self.push_event(HandshakeEvent::Connected {
            peer,
            local,
            remote,
            incarnation,
            accepted: origin != Origin::Ours,
        });
    }

    /// Retransmits REQUESTs whose timer expired and fails attempts out of tries.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let mut resend = Vec::new();
        let mut failed = Vec::new();
        for (peer, p) in self.peers.iter_mut() {
            let Peer::Connecting(a) = p else { continue };
            if a.deadline > now {
                continue;
            }
            if a.tries >= self.cfg.max_tries {
                failed.push((*peer, a.local));
                continue;
            }
            a.tries += 1;
            a.rto_ns = a.rto_ns.saturating_mul(2).min(self.cfg.rto_max_ns.max(1));
            a.deadline = now + std::time::Duration::from_nanos(a.rto_ns);
            resend.push((*peer, a.local, a.number));
        }
        for (peer, local) in failed {
            self.take_peer(peer);
            self.push_event(HandshakeEvent::Failed {
                peer,
                local,
                reason: ConnectFailure::Timeout,
            });
        }
        for (peer, local, number) in resend {
            self.stats.retransmits += 1;
            self.send_request(peer, local, number);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next needed.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.peers
            .values()
            .filter_map(|p| match p {
                Peer::Connecting(a) => Some(a.deadline),
                Peer::Connected { .. } => None,
            })
            .min()
    }

    /// The next datagram to send: destination and bytes (send it from the device's own port).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.out.pop_front()
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<HandshakeEvent> {
        self.events.pop_front()
    }

    fn push_event(&mut self, e: HandshakeEvent) {
        if self.events.len() >= MAX_QUEUED_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    fn queue(&mut self, dest: SocketAddr, bytes: Vec<u8>) {
        if self.out.len() < MAX_QUEUED_DATAGRAMS {
            self.out.push_back((dest, bytes));
        }
    }

    fn send_request(&mut self, peer: SocketAddr, local: QpInfo, attempt: u64) {
        self.stats.requests_sent += 1;
        self.send_info(KIND_REQUEST, peer, local, 0, 0, attempt);
    }

    fn send_reply(&mut self, peer: SocketAddr, local: QpInfo, echo_inc: u64, echo_qpn: u32) {
        self.stats.replies_sent += 1;
        self.send_info(KIND_REPLY, peer, local, echo_inc, echo_qpn, self.attempts);
    }

    fn send_confirm(&mut self, peer: SocketAddr, local: QpInfo, echo_inc: u64, echo_qpn: u32) {
        self.stats.confirms_sent += 1;
        self.send_info(KIND_CONFIRM, peer, local, echo_inc, echo_qpn, self.attempts);
    }

    /// Queues a message of `kind` that carries this side's QP (request, reply, confirm).
    fn send_info(
        &mut self,
        kind: u8,
        peer: SocketAddr,
        local: QpInfo,
        echo_inc: u64,
        echo_qpn: u32,
        attempt: u64,
    ) {
        let mut info = local;
        let mut features = features_of(&local);
        if self.roce {
            // The GID travels in the address field, the handshake's own port in the port
            // field (the peer keys this device by it).
            info.addr = SocketAddr::new(local.addr.ip(), self.local.port());
            features |= FEATURE_ROCE;
        }
        let m = Message {
            kind,
            reason: 0,
            incarnation: self.incarnation,
            echo_incarnation: echo_inc,
            attempt,
            features,
            echo_qpn,
            info,
        };
        self.queue(peer, m.emit());
    }

    fn send_reject_raw(
        &mut self,
        peer: SocketAddr,
        echo_inc: u64,
        echo_qpn: u32,
        reason: RejectReason,
    ) {
        self.stats.rejects_sent += 1;
        let m = Message {
            kind: KIND_REJECT,
            reason: reason.code(),
            incarnation: self.incarnation,
            echo_incarnation: echo_inc,
            attempt: self.attempts,
            features: 0,
            echo_qpn,
            info: QpInfo {
                addr: self.local,
                qpn: 0,
                psn: 0,
                seal_key: None,
            },
        };
        self.queue(peer, m.emit());
    }
}

fn features_of(info: &QpInfo) -> u32 {
    if info.seal_key.is_some() {
        FEATURE_SEAL
    } else {
        0
    }
}

/// One handshake datagram, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Message {
    kind: u8,
    reason: u8,
    incarnation: u64,
    echo_incarnation: u64,
    attempt: u64,
    features: u32,
    echo_qpn: u32,
    info: QpInfo,
}

#[derive(Debug, PartialEq, Eq)]
enum ParseError {
    /// Another handshake version; `kind` is its byte 1.
    Version {
        kind: u8,
    },
    Malformed,
}

/// FNV-1a, 32 bits: catches corruption on paths where UDP checksums are off (loopback);
/// not a defence against forgery (nothing in the plain handshake is).
fn check(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// A bounds-checked big-endian reader.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        if self.0.len() < n {
            return Err(ParseError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, ParseError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ParseError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, ParseError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, ParseError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
}

impl Message {
    fn parse(d: &[u8]) -> Result<Message, ParseError> {
        if !is_handshake(d) {
            return Err(ParseError::Malformed);
        }
        if d[0] != HANDSHAKE_VERSION {
            return Err(ParseError::Version { kind: d[1] });
        }
        if d.len() < FIXED_LEN + 4 + 4 || d.len() > MAX_DATAGRAM {
            return Err(ParseError::Malformed);
        }
        let (body, sum) = d.split_at(d.len() - 4);
        if check(body).to_be_bytes() != sum {
            return Err(ParseError::Malformed);
        }
        let mut r = Reader(body);
        let _version = r.u8()?;
        let kind = r.u8()?;
        let reason = r.u8()?;
        let family = r.u8()?;
        let _dst = r.u32()?;
        let incarnation = r.u64()?;
        let echo_incarnation = r.u64()?;
        let attempt = r.u64()?;
        let features = r.u32()?;
        let echo_qpn = r.u32()?;
        let qpn = r.u32()?;
        let psn = r.u32()?;
        let port = r.u16()?;
        let has_seal = r.u8()?;
        let _reserved = r.u8()?;
        let ip = match family {
            4 => {
                let b = r.take(4)?;
                IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
            }
            6 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(r.take(16)?);
                IpAddr::V6(Ipv6Addr::from(a))
            }
            _ => return Err(ParseError::Malformed),
        };
        let seal_key = match has_seal {
            0 => None,
            1 => {
                let mut k = [0u8; 32];
                k.copy_from_slice(r.take(32)?);
                Some(k)
            }
            _ => return Err(ParseError::Malformed),
        };
        if !r.0.is_empty()
            || !matches!(kind, KIND_REQUEST | KIND_REPLY | KIND_REJECT | KIND_CONFIRM)
        {
            return Err(ParseError::Malformed);
        }
        // A QP number in the reserved range is never a real QP.
        if kind != KIND_REJECT && (qpn == 0 || qpn == HANDSHAKE_QPN) {
            return Err(ParseError::Malformed);
        }
        Ok(Message {
            kind,
            reason,
            incarnation,
            echo_incarnation,
            attempt,
            features,
            echo_qpn,
            info: QpInfo {
                addr: SocketAddr::new(ip, port),
                qpn,
                psn,
                seal_key,
            },
        })
    }

    fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MAX_DATAGRAM);
        let family = if self.info.addr.is_ipv4() { 4 } else { 6 };
        v.extend_from_slice(&[HANDSHAKE_VERSION, self.kind, self.reason, family]);
        v.extend_from_slice(&HANDSHAKE_QPN.to_be_bytes());
        v.extend_from_slice(&self.incarnation.to_be_bytes());
        v.extend_from_slice(&self.echo_incarnation.to_be_bytes());
        v.extend_from_slice(&self.attempt.to_be_bytes());
        v.extend_from_slice(&self.features.to_be_bytes());
        v.extend_from_slice(&self.echo_qpn.to_be_bytes());
        v.extend_from_slice(&self.info.qpn.to_be_bytes());
        v.extend_from_slice(&self.info.psn.to_be_bytes());
        v.extend_from_slice(&self.info.addr.port().to_be_bytes());
        v.push(u8::from(self.info.seal_key.is_some()));
        v.push(0);
        match self.info.addr.ip() {
            IpAddr::V4(a) => v.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => v.extend_from_slice(&a.octets()),
        }
        if let Some(k) = self.info.seal_key {
            v.extend_from_slice(&k);
        }
        let sum = check(&v);
        v.extend_from_slice(&sum.to_be_bytes());
        v
    }
}

/// Most work requests waiting, per peer, for its connection to be set up; a post beyond is
/// refused with [`ConnectError::QueueFull`].
pub const MAX_PENDING_WR: usize = 1024;
/// Most connection events waiting in a device's queue ([`Device::poll_connection_event`]);
/// beyond, the oldest is dropped.
pub const MAX_CONNECTION_EVENTS: usize = 65_536;

/// A connection set up by the handshake.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The peer device's address.
    pub peer: SocketAddr,
    /// This side's QP (created by the handshake runtime; post to it with
    /// [`Device::post_send_to`] / [`Device::post_recv_to`]).
    pub local: QpInfo,
    /// The peer's QP.
    pub remote: QpInfo,
    /// The peer's incarnation id.
    pub incarnation: u64,
    /// Whether the peer started it.
    pub accepted: bool,
}

/// What the handshake runtime reports to the application, oldest first.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// A connection is up (started here or accepted from the peer).
    Established(Connection),
    /// The peer restarted: the old local QP went to the error state (its outstanding work
    /// completed as flushed); an `Established` for the new connection follows.
    Replaced {
        /// The peer device's address.
        peer: SocketAddr,
        /// The old local QP number.
        old_qpn: u32,
    },
    /// An attempt failed; work queued for it completed as flushed on the send CQ.
    Failed {
        /// The peer device's address.
        peer: SocketAddr,
        /// The local QP the attempt offered (now in the error state).
        qpn: u32,
        /// Why.
        reason: ConnectFailure,
    },
}

/// Why a handshake-level call failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectError {
    /// [`Device::enable_handshake`] was not called.
    NotEnabled,
    /// [`Device::enable_handshake`] was called before.
    AlreadyEnabled,
    /// The attempt failed.
    Failed(ConnectFailure),
    /// `wait_connected` ran out of time (the attempt goes on).
    TimedOut,
    /// [`MAX_PENDING_WR`] work requests already wait for this peer.
    QueueFull,
    /// Creating the local QP failed.
    Resource(ResourceError),
    /// The engine refused the work request.
    Post(PostError),
    /// Too many peers ([`MAX_PEERS`]).
    Limit,
    /// The QP named no longer serves the peer: its connection was replaced, failed or closed
    /// ([`Device::post_recv_on`]).
    Replaced,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::NotEnabled => f.write_str("the handshake is not enabled on this device"),
            ConnectError::AlreadyEnabled => f.write_str("the handshake is already enabled"),
            ConnectError::Failed(r) => write!(f, "connection failed: {r}"),
            ConnectError::TimedOut => f.write_str("timed out waiting for the connection"),
            ConnectError::QueueFull => f.write_str("too many work requests wait for this peer"),
            ConnectError::Resource(e) => write!(f, "{e}"),
            ConnectError::Post(e) => write!(f, "{e}"),
            ConnectError::Limit => f.write_str("too many peers"),
            ConnectError::Replaced => f.write_str("that QP no longer serves the peer"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// See [`Device::connection_watch`].
#[derive(Clone)]
pub struct ConnectionWatch {
    signal: Arc<Signal>,
}

impl ConnectionWatch {
    /// A number that changes whenever connection events are queued.
    pub fn generation(&self) -> u64 {
        self.signal.generation.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for ConnectionWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionWatch")
            .field("generation", &self.generation())
            .finish()
    }
}

/// Wakes threads waiting for connection events: a generation counter bumped before each
/// notification, so a waiter that saw generation `g` sleeps until it moves.
#[derive(Default)]
struct Signal {
    generation: AtomicU64,
    event: Event,
}

impl Signal {
    fn wait(&self, seen: u64, timeout: Duration) {
        self.event.wait_until(
            || self.generation.load(Ordering::Acquire) != seen,
            Some(timeout),
        );
    }
}

/// Where the handshake runtime's QPs live: the engine's on the software transport, the NIC's
/// on the verbs backend (`device/backend.rs`). The calls mirror the engine's.
pub(crate) trait QpHost {
    /// Whether these are an RDMA NIC's QPs (the handshake then speaks [`FEATURE_ROCE`]).
    fn is_roce(&self) -> bool {
        false
    }
    /// Takes the protection domain and queues of the QPs the handshake creates (the engine
    /// needs nothing: the runtime keeps their ids).
    fn adopt(
        &mut self,
        _pd: &ProtectionDomain,
        _send_cq: &CompletionQueue,
        _recv_cq: &CompletionQueue,
    ) -> Result<(), ResourceError> {
        Ok(())
    }
    /// Creates a QP in `Init`.
    fn create_qp(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Result<QpInfo, ResourceError>;
    /// Connects `qpn` to `peer`.
    fn connect(&mut self, qpn: u32, peer: QpInfo) -> Result<(), ResourceError>;
    /// Moves `qpn` to the error state.
    fn set_error(&mut self, qpn: u32) -> Result<(), ResourceError>;
    /// Destroys `qpn`.
    fn destroy_qp(&mut self, qpn: u32) -> Result<(), ResourceError>;
    /// Whether `wr` could be posted once connected (checked when it is queued for a
    /// connection that is not up yet, so a malformed request is refused to its poster).
    fn check_send(&self, _wr: &SendWr) -> Result<(), PostError> {
        Ok(())
    }
    /// Posts a send request.
    fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), PostError>;
    /// Posts a send request whose poster can no longer be told of a refusal: a refused one
    /// completes with an error on `cq` (see `Endpoint::post_send_or_fail`).
    fn post_send_or_fail(&mut self, qpn: u32, wr: SendWr, cq: CqId);
    /// Posts a receive request.
    fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), PostError>;
    /// QPs alive (for tests).
    #[cfg(test)]
    fn qp_count(&self) -> usize;
}

impl QpHost for Endpoint {
    fn create_qp(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Result<QpInfo, ResourceError> {
        Endpoint::create_qp(self, pd, send_cq, recv_cq)
    }
    fn connect(&mut self, qpn: u32, peer: QpInfo) -> Result<(), ResourceError> {
        Endpoint::connect(self, qpn, peer)
    }
    fn set_error(&mut self, qpn: u32) -> Result<(), ResourceError> {
        Endpoint::set_error(self, qpn)
    }
    fn destroy_qp(&mut self, qpn: u32) -> Result<(), ResourceError> {
        Endpoint::destroy_qp(self, qpn)
    }
    fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), PostError> {
        Endpoint::post_send(self, qpn, wr)
    }
    fn post_send_or_fail(&mut self, qpn: u32, wr: SendWr, cq: CqId) {
        Endpoint::post_send_or_fail(self, qpn, wr, cq)
    }
    fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), PostError> {
        Endpoint::post_recv(self, qpn, wr)
    }
    #[cfg(test)]
    fn qp_count(&self) -> usize {
        Endpoint::qp_count(self)
    }
}

/// The handshake runtime of a device: the state machine plus what the device keeps per peer.
/// Lives inside the device's engine lock, so every step sees a consistent engine.
pub(crate) struct Runtime {
    hs: Handshake,
    pd: PdId,
    send_cq: CqId,
    recv_cq: CqId,
    /// Work requests posted before the connection was up, per peer, in posting order.
    pending: HashMap<SocketAddr, VecDeque<SendWr>>,
    /// The QP of a failed or replaced connection, per peer, kept so its flushed completions
    /// are reported; destroyed when the peer's next QP retires or on `disconnect`.
    retired: HashMap<SocketAddr, u32>,
    /// The last failure per peer (for `wait_connected`), cleared by a new attempt.
    failures: HashMap<SocketAddr, ConnectFailure>,
    events: VecDeque<ConnectionEvent>,
    ready: Arc<Signal>,
}

impl Runtime {
    #[allow(clippy::too_many_arguments)]
    fn new(
        cfg: HandshakeConfig,
        local: SocketAddr,
        incarnation: u64,
        roce: bool,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Runtime {
        let hs = if roce {
            Handshake::new_roce(cfg, local, incarnation)
        } else {
            Handshake::new(cfg, local, incarnation)
        };
        Runtime {
            hs,
            pd,
            send_cq,
            recv_cq,
            pending: HashMap::new(),
            retired: HashMap::new(),
            failures: HashMap::new(),
            events: VecDeque::new(),
            ready: Arc::new(Signal::default()),
        }
    }

    fn local_qp(&self, peer: SocketAddr) -> Option<(QpInfo, bool)> {
        match self.hs.state(peer)? {
            PeerState::Connecting { local } => Some((local, false)),
            PeerState::Connected { local, .. } => Some((local, true)),
        }
    }

    /// Starts an attempt to `peer` unless one exists; returns the local QP.
    fn start(
        &mut self,
        ep: &mut dyn QpHost,
        now: Timestamp,
        peer: SocketAddr,
    ) -> Result<(QpInfo, bool), ConnectError> {
        if let Some(q) = self.local_qp(peer) {
            return Ok(q);
        }
        if self.hs.peer_count() >= MAX_PEERS {
            return Err(ConnectError::Limit);
        }
        let local = ep
            .create_qp(self.pd, self.send_cq, self.recv_cq)
            .map_err(ConnectError::Resource)?;
        self.failures.remove(&peer);
        if let Err(e) = self.hs.connect(now, peer, local) {
            let _ = ep.destroy_qp(local.qpn);
            return Err(match e {
                StartError::Limit => ConnectError::Limit,
                StartError::Exists => ConnectError::Limit,
            });
        }
        Ok((local, false))
    }

    fn retire(&mut self, ep: &mut dyn QpHost, peer: SocketAddr, qpn: u32) {
        let _ = ep.set_error(qpn);
        if let Some(old) = self.retired.insert(peer, qpn) {
            let _ = ep.destroy_qp(old);
        }
    }

    fn push(&mut self, e: ConnectionEvent) {
        if self.events.len() >= MAX_CONNECTION_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    /// Applies the state machine's events to the engine and turns them into connection
    /// events; sends its datagrams from the device's own port (path 0).
    fn apply(&mut self, ep: &mut dyn QpHost, datapath: &dyn Datapath) {
        let mut any = false;
        while let Some(e) = self.hs.poll_event() {
            any = true;
            match e {
                HandshakeEvent::Connected {
                    peer,
                    local,
                    remote,
                    incarnation,
                    accepted,
                } => {
                    if ep.connect(local.qpn, remote).is_err() {
                        // The QP is gone or in error (destroyed by the application): the
                        // connection cannot be used; forget it so the next attempt starts anew.
                        self.hs.forget(peer);
                        self.push(ConnectionEvent::Failed {
                            peer,
                            qpn: local.qpn,
                            reason: ConnectFailure::Rejected(RejectReason::Refused),
                        });
                        continue;
                    }
                    for wr in self.pending.remove(&peer).unwrap_or_default() {
                        ep.post_send_or_fail(local.qpn, wr, self.send_cq);
                    }
                    self.push(ConnectionEvent::Established(Connection {
                        peer,
                        local,
                        remote,
                        incarnation,
                        accepted,
                    }));
                }
                HandshakeEvent::Replaced { peer, old_local } => {
                    self.retire(ep, peer, old_local.qpn);
                    self.push(ConnectionEvent::Replaced {
                        peer,
                        old_qpn: old_local.qpn,
                    });
                }
                HandshakeEvent::Expired { peer, local } => {
                    // Nothing was sent to the peer on it (it never confirmed): fail what the
                    // application posted (flushed) and drop the QP with the next retirement.
                    self.retire(ep, peer, local.qpn);
                    self.push(ConnectionEvent::Failed {
                        peer,
                        qpn: local.qpn,
                        reason: ConnectFailure::Unconfirmed,
                    });
                }
                HandshakeEvent::Failed {
                    peer,
                    local,
                    reason,
                } => {
                    self.retire(ep, peer, local.qpn);
                    // Posted to a QP in the error state, queued work completes as flushed.
                    for wr in self.pending.remove(&peer).unwrap_or_default() {
                        ep.post_send_or_fail(local.qpn, wr, self.send_cq);
                    }
                    self.failures.insert(peer, reason);
                    self.push(ConnectionEvent::Failed {
                        peer,
                        qpn: local.qpn,
                        reason,
                    });
                }
            }
        }
        while let Some((dest, bytes)) = self.hs.poll_transmit() {
            let t = braid_datapath::Transmit {
                dest,
                path: 0,
                ecn: braid_datapath::Ecn::NotEct,
                contents: &bytes,
            };
            // A lost handshake datagram is retransmitted (requests) or answered again.
            let _ = datapath.send(std::slice::from_ref(&t));
        }
        if any {
            self.ready.generation.fetch_add(1, Ordering::AcqRel);
            self.ready.event.notify();
        }
    }
}

/// Hands a handshake datagram to the runtime (the device's receive path calls this for every
/// datagram [`is_handshake`] claims). Without a runtime the datagram is dropped.
pub(crate) fn on_datagram(
    rt: &mut Option<Runtime>,
    ep: &mut dyn QpHost,
    now: Timestamp,
    src: SocketAddr,
    bytes: &[u8],
    datapath: &dyn Datapath,
) {
    let Some(rt) = rt else { return };
    let (pd, scq, rcq) = (rt.pd, rt.send_cq, rt.recv_cq);
    rt.hs.handle_datagram(now, src, bytes, &mut |remote| {
        if remote.seal_key.is_some() {
            // QPs the runtime creates are plain; an encrypting peer cannot be served.
            return Err(RejectReason::Features);
        }
        ep.create_qp(pd, scq, rcq).map_err(|_| RejectReason::Limit)
    });
    rt.apply(ep, datapath);
}

/// Runs the handshake's timers (the device's progress thread calls this every round).
pub(crate) fn on_timer(
    rt: &mut Option<Runtime>,
    ep: &mut dyn QpHost,
    now: Timestamp,
    datapath: &dyn Datapath,
) {
    let Some(rt) = rt else { return };
    if rt.hs.poll_timeout().is_some_and(|t| t <= now) {
        rt.hs.handle_timeout(now);
        rt.apply(ep, datapath);
    }
}

/// When the handshake next needs [`on_timer`] (for a device that drives it on a thread of
/// its own: the verbs backend's).
#[cfg(feature = "verbs")]
pub(crate) fn next_timeout(rt: &Option<Runtime>) -> Option<Timestamp> {
    rt.as_ref()?.hs.poll_timeout()
}

/// The connection handshake on a device (see the module docs of `braid::handshake`).
impl Device {
    /// Enables the connection handshake: requests from peers are accepted, and
    /// [`connect_to`](Self::connect_to) / [`post_send_to`](Self::post_send_to) set up QPs by
    /// peer address. QPs it creates belong to `pd` and report to `send_cq` and `recv_cq`
    /// (keep those alive while the device is used).
    pub fn enable_handshake(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<(), ConnectError> {
        self.enable_handshake_with(HandshakeConfig::default(), pd, send_cq, recv_cq)
    }

    /// [`enable_handshake`](Self::enable_handshake) with other timers and accept limits.
    pub fn enable_handshake_with(
        &self,
        cfg: HandshakeConfig,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<(), ConnectError> {
        // Incarnations grow across restarts: the wall clock at enable time, in ns.
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            .max(1);
        self.with_handshake(|host, rt, _, dp| {
            if rt.is_some() {
                return Err(ConnectError::AlreadyEnabled);
            }
            host.adopt(pd, send_cq, recv_cq)
                .map_err(ConnectError::Resource)?;
            *rt = Some(Runtime::new(
                cfg,
                dp.local_addr(),
                incarnation,
                host.is_roce(),
                pd.id(),
                send_cq.id(),
                recv_cq.id(),
            ));
            Ok(())
        })?;
        self.handshake_enabled();
        Ok(())
    }

    /// Starts connecting to the device at `peer` (no-op if a connection exists or is being
    /// set up). Returns at once; see [`wait_connected`](Self::wait_connected).
    pub fn connect_to(&self, peer: SocketAddr) -> Result<(), ConnectError> {
        self.with_handshake(|ep, rt, now, dp| {
            let rt = rt.as_mut().ok_or(ConnectError::NotEnabled)?;
            rt.start(ep, now, peer)?;
            rt.apply(ep, dp);
            Ok(())
        })
    }

    /// The connection to `peer`, if it is up.
    pub fn connection(&self, peer: SocketAddr) -> Option<Connection> {
        self.with_handshake(|_, rt, _, _| match rt.as_ref()?.hs.state(peer)? {
            PeerState::Connected {
                local,
                remote,
                incarnation,
            } => Some(Connection {
                peer,
                local,
                remote,
                incarnation,
                accepted: false,
            }),
            PeerState::Connecting { .. } => None,
        })
    }

    /// Connects to `peer` (starting an attempt if none is under way) and waits up to
    /// `timeout` for the connection.
    pub fn wait_connected(
        &self,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Result<Connection, ConnectError> {
        let deadline = std::time::Instant::now() + timeout;
        let ready = self.with_handshake(|ep, rt, now, dp| {
            let rt = rt.as_mut().ok_or(ConnectError::NotEnabled)?;
            rt.start(ep, now, peer)?;
            rt.apply(ep, dp);
            Ok(rt.ready.clone())
        })?;
        loop {
            let epoch = ready.generation.load(Ordering::Acquire);
            let state = self.with_handshake(|_, rt, _, _| {
                let rt = rt.as_ref()?;
                Some((rt.hs.state(peer), rt.failures.get(&peer).copied()))
            });
            match state {
                None => return Err(ConnectError::NotEnabled),
                Some((Some(PeerState::Connected { .. }), _)) => {
                    if let Some(c) = self.connection(peer) {
                        return Ok(c);
                    }
                }
                Some((None, Some(f))) => return Err(ConnectError::Failed(f)),
                Some(_) => {}
            }
            let left = deadline
                .checked_duration_since(std::time::Instant::now())
                .ok_or(ConnectError::TimedOut)?;
            ready.wait(epoch, left);
        }
    }

    /// Posts a send work request to `peer`'s QP. If the connection is not up yet the request
    /// waits (at most [`MAX_PENDING_WR`] per peer) and an attempt starts; it is posted, in
    /// order, when the connection comes up, or completes as flushed if the attempt fails.
    pub fn post_send_to(&self, peer: SocketAddr, wr: SendWr) -> Result<(), ConnectError> {
        self.with_handshake(|ep, rt, now, dp| {
            let rt = rt.as_mut().ok_or(ConnectError::NotEnabled)?;
            let (local, up) = rt.start(ep, now, peer)?;
            let r = if up {
                ep.post_send(local.qpn, wr).map_err(ConnectError::Post)
            } else if let Err(e) = ep.check_send(&wr) {
                Err(ConnectError::Post(e))
            } else {
                let q = rt.pending.entry(peer).or_default();
                if q.len() >= MAX_PENDING_WR {
                    Err(ConnectError::QueueFull)
                } else {
                    q.push_back(wr);
                    Ok(())
                }
            };
            rt.apply(ep, dp);
            r
        })
    }

    /// Posts a receive work request on `peer`'s QP (allowed while the connection is being
    /// set up; starts an attempt if there is none). Returns the local QP number it went to.
    pub fn post_recv_to(&self, peer: SocketAddr, wr: RecvWr) -> Result<u32, ConnectError> {
        self.with_handshake(|ep, rt, now, dp| {
            let rt = rt.as_mut().ok_or(ConnectError::NotEnabled)?;
            let (local, _) = rt.start(ep, now, peer)?;
            let r = ep.post_recv(local.qpn, wr).map_err(ConnectError::Post);
            rt.apply(ep, dp);
            r.map(|()| local.qpn)
        })
    }

    /// Posts a receive work request on local QP `qpn` only while it still serves `peer`
    /// (connecting or connected); starts no attempt. A caller whose receive buffers belong to
    /// one connection re-posts them with this: once the peer's connection was replaced or
    /// failed, [`ConnectError::Replaced`] says so, and the buffer never reaches the QP that
    /// replaced it (whose owner may free that memory on seeing the replacement).
    pub fn post_recv_on(&self, peer: SocketAddr, qpn: u32, wr: RecvWr) -> Result<(), ConnectError> {
        self.with_handshake(|ep, rt, _, _| {
            let rt = rt.as_mut().ok_or(ConnectError::NotEnabled)?;
            match rt.local_qp(peer) {
                Some((local, _)) if local.qpn == qpn => {
                    ep.post_recv(qpn, wr).map_err(ConnectError::Post)
                }
                _ => Err(ConnectError::Replaced),
            }
        })
    }

    /// The local QP number serving `peer`, while its connection is being set up or is up.
    pub fn local_qpn(&self, peer: SocketAddr) -> Option<u32> {
        self.with_handshake(|_, rt, _, _| rt.as_ref()?.local_qp(peer).map(|(q, _)| q.qpn))
    }

    /// A watch on the connection events: its generation moves whenever events are queued, so
    /// a poller can skip [`poll_connection_event`](Self::poll_connection_event) (which takes
    /// the engine lock) while it stands still. `None` until the handshake is enabled.
    pub fn connection_watch(&self) -> Option<ConnectionWatch> {
        self.with_handshake(|_, rt, _, _| {
            rt.as_ref().map(|r| ConnectionWatch {
                signal: r.ready.clone(),
            })
        })
    }

    /// The next connection event (established, replaced, failed), oldest first.
    pub fn poll_connection_event(&self) -> Option<ConnectionEvent> {
        self.with_handshake(|_, rt, _, _| rt.as_mut()?.events.pop_front())
    }

    /// Waits up to `timeout` for the next connection event.
    pub fn wait_connection_event(&self, timeout: Duration) -> Option<ConnectionEvent> {
        let deadline = std::time::Instant::now() + timeout;
        let ready = self.with_handshake(|_, rt, _, _| rt.as_ref().map(|r| r.ready.clone()))?;
        loop {
            let epoch = ready.generation.load(Ordering::Acquire);
            if let Some(e) = self.poll_connection_event() {
                return Some(e);
            }
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            ready.wait(epoch, left);
        }
    }

    /// Closes the connection to `peer` without telling it: its QP (and a retired one) is
    /// destroyed without completions, and a later request from the peer is accepted anew.
    pub fn disconnect(&self, peer: SocketAddr) {
        self.with_handshake(|ep, rt, _, _| {
            let Some(rt) = rt.as_mut() else { return };
            if let Some((local, _)) = rt.local_qp(peer) {
                let _ = ep.destroy_qp(local.qpn);
            }
            if let Some(old) = rt.retired.remove(&peer) {
                let _ = ep.destroy_qp(old);
            }
            rt.hs.forget(peer);
            rt.pending.remove(&peer);
            rt.failures.remove(&peer);
        })
    }

    #[cfg(test)]
    fn inner_qp_count(&self) -> usize {
        self.with_handshake(|ep, _, _, _| ep.qp_count())
    }

    /// Handshake counters (zero when it is not enabled).
    pub fn handshake_stats(&self) -> HandshakeStats {
        self.with_handshake(|_, rt, _, _| rt.as_ref().map(|r| r.hs.stats()).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn qp(port: u16, qpn: u32) -> QpInfo {
        QpInfo {
            addr: addr(port),
            qpn,
            psn: qpn.wrapping_mul(7),
            seal_key: None,
        }
    }

    /// The QP info a verbs QP of the device at `port` has: its GID (fe80::`port`) on the
    /// RoCE v2 port.
    fn gid_qp(port: u16, qpn: u32) -> QpInfo {
        QpInfo {
            addr: SocketAddr::new(
                IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, port)),
                ROCE_V2_PORT,
            ),
            ..qp(port, qpn)
        }
    }

    /// One side: a handshake plus a counter handing out QP numbers to accepted requests.
    struct Side {
        hs: Handshake,
        port: u16,
        next_qpn: u32,
        refuse: bool,
    }

    impl Side {
        fn new(port: u16, incarnation: u64) -> Side {
            Side {
                hs: Handshake::new(HandshakeConfig::default(), addr(port), incarnation),
                port,
                next_qpn: u32::from(port) * 100,
                refuse: false,
            }
        }
        /// A side whose QPs are a NIC's (the verbs backend).
        fn new_roce(port: u16, incarnation: u64) -> Side {
            Side {
                hs: Handshake::new_roce(HandshakeConfig::default(), addr(port), incarnation),
                ..Side::new(port, incarnation)
            }
        }
        fn deliver(&mut self, now: Timestamp, from: u16, d: &[u8]) {
            self.deliver_from(now, addr(from), d);
        }
        fn deliver_from(&mut self, now: Timestamp, from: SocketAddr, d: &[u8]) {
            let (port, refuse, roce) = (self.port, self.refuse, self.hs.is_roce());
            let next = &mut self.next_qpn;
            self.hs.handle_datagram(now, from, d, &mut |_| {
                if refuse {
                    return Err(RejectReason::Refused);
                }
                *next += 1;
                Ok(if roce {
                    gid_qp(port, *next)
                } else {
                    qp(port, *next)
                })
            });
        }
        fn events(&mut self) -> Vec<HandshakeEvent> {
            std::iter::from_fn(|| self.hs.poll_event()).collect()
        }
        fn out(&mut self) -> Vec<Vec<u8>> {
            std::iter::from_fn(|| self.hs.poll_transmit().map(|(_, d)| d)).collect()
        }
    }

    /// Moves every queued datagram both ways until both are quiet.
    fn exchange(now: Timestamp, a: &mut Side, b: &mut Side) {
        for _ in 0..16 {
            let (fa, fb) = (a.out(), b.out());
            if fa.is_empty() && fb.is_empty() {
                return;
            }
            for d in fa {
                b.deliver(now, a.port, &d);
            }
            for d in fb {
                a.deliver(now, b.port, &d);
            }
        }
        panic!("handshake did not settle");
    }

    fn connected(s: &Side, peer: u16) -> (u32, u32) {
        match s.hs.state(addr(peer)) {
            Some(PeerState::Connected { local, remote, .. }) => (local.qpn, remote.qpn),
            other => panic!("not connected: {other:?}"),
        }
    }

    #[test]
    fn a_request_is_accepted_and_both_sides_connect() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 2));
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        exchange(now, &mut a, &mut b);
        let (al, ar) = connected(&a, 2000);
        let (bl, br) = connected(&b, 1000);
        assert_eq!((al, br), (11, 11));
        assert_eq!(ar, bl);
        assert!(matches!(
            b.events()[..],
            [HandshakeEvent::Connected {
                accepted: true,
                incarnation: 1,
                ..
            }]
        ));
        assert!(matches!(
            a.events()[..],
            [HandshakeEvent::Connected {
                accepted: false,
                incarnation: 2,
                ..
            }]
        ));
        assert_eq!(a.hs.poll_timeout(), None);
    }

    /// On verbs the handshake carries the port GID, QP number and PSN: each side keys the
    /// peer by its handshake address and keeps the peer QP's GID as the remote address.
    #[test]
    fn roce_sides_connect_and_keep_the_peer_gid() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new_roce(1000, 1), Side::new_roce(2000, 2));
        a.hs.connect(now, addr(2000), gid_qp(1000, 11)).unwrap();
        let req = a.out();
        assert_eq!(req.len(), 1);
        b.deliver(now, 1000, &req[0]);
        exchange(now, &mut a, &mut b);
        let Some(PeerState::Connected { local, remote, .. }) = a.hs.state(addr(2000)) else {
            panic!("a not connected: {:?}", a.hs.state(addr(2000)));
        };
        assert_eq!(local, gid_qp(1000, 11));
        assert_eq!(remote, gid_qp(2000, 200_001));
        let Some(PeerState::Connected { local, remote, .. }) = b.hs.state(addr(1000)) else {
            panic!("b not connected");
        };
        assert_eq!((local, remote), (gid_qp(2000, 200_001), gid_qp(1000, 11)));
        assert_eq!(b.hs.stats().confirmed, 1);
    }

    /// A software QP cannot talk to a NIC's: a request across the two kinds is rejected for
    /// its features, both ways, and nothing connects.
    #[test]
    fn roce_and_software_sides_refuse_each_other() {
        let now = Timestamp::ZERO;
        for roce_requests in [false, true] {
            let (mut a, mut b) = if roce_requests {
                (Side::new_roce(1000, 1), Side::new(2000, 2))
            } else {
                (Side::new(1000, 1), Side::new_roce(2000, 2))
            };
            let info = if roce_requests {
                gid_qp(1000, 11)
            } else {
                qp(1000, 11)
            };
            a.hs.connect(now, addr(2000), info).unwrap();
            exchange(now, &mut a, &mut b);
            assert!(
                matches!(
                    a.events()[..],
                    [HandshakeEvent::Failed {
                        reason: ConnectFailure::Rejected(RejectReason::Features),
                        ..
                    }]
                ),
                "roce requester: {roce_requests}"
            );
            assert_eq!(b.hs.peer_count(), 0);
            assert_eq!(b.next_qpn, 200_000, "no QP was made for it");
            assert_eq!(a.hs.state(addr(2000)), None);
        }
    }

    /// A reply whose RoCE bit differs from the request's is not a connection.
    #[test]
    fn a_reply_of_the_other_kind_is_dropped() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new_roce(1000, 1), Side::new_roce(2000, 2));
        a.hs.connect(now, addr(2000), gid_qp(1000, 11)).unwrap();
        let req = a.out();
        b.deliver(now, 1000, &req[0]);
        let reply = b.out().remove(0);
        // The same reply, emitted by a software side: the RoCE bit is clear.
        let mut forged = Message::parse(&reply).unwrap();
        forged.features &= !FEATURE_ROCE;
        forged.info.addr = addr(2000);
        a.deliver(now, 2000, &forged.emit());
        assert!(matches!(
            a.hs.state(addr(2000)),
            Some(PeerState::Connecting { .. })
        ));
        assert_eq!(a.hs.stats().stale, 1);
        a.deliver(now, 2000, &reply);
        assert!(matches!(
            a.hs.state(addr(2000)),
            Some(PeerState::Connected { .. })
        ));
    }

    #[test]
    fn simultaneous_connects_resolve_to_one_qp_pair() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 2));
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        b.hs.connect(now, addr(1000), qp(2000, 22)).unwrap();
        exchange(now, &mut a, &mut b);
        assert_eq!(connected(&a, 2000), (11, 22));
        assert_eq!(connected(&b, 1000), (22, 11));
        // No QP was created by either factory: each side used the QP it offered.
        assert_eq!((a.next_qpn, b.next_qpn), (100_000, 200_000));
        assert_eq!(a.events().len(), 1);
        assert_eq!(b.events().len(), 1);
    }

    #[test]
    fn a_lost_request_is_retransmitted_with_backoff() {
        let mut a = Side::new(1000, 1);
        let mut b = Side::new(2000, 2);
        let t0 = Timestamp::ZERO;
        a.hs.connect(t0, addr(2000), qp(1000, 11)).unwrap();
        assert_eq!(a.out().len(), 1); // lost
        let t1 = a.hs.poll_timeout().unwrap();
        assert_eq!(t1, t0 + Duration::from_millis(20));
        a.hs.handle_timeout(t1);
        let again = a.out();
        assert_eq!(again.len(), 1);
        assert_eq!(a.hs.stats().retransmits, 1);
        // The next wait doubled.
        assert_eq!(a.hs.poll_timeout().unwrap(), t1 + Duration::from_millis(40));
        b.deliver(t1, 1000, &again[0]);
        let reply = b.out();
        a.deliver(t1, 2000, &reply[0]);
        assert_eq!(connected(&a, 2000).0, 11);
    }

    #[test]
    fn a_lost_reply_is_answered_again_with_the_same_qp() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 2));
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        let req = a.out();
        b.deliver(now, 1000, &req[0]);
        let _lost = b.out();
        let t = a.hs.poll_timeout().unwrap();
        a.hs.handle_timeout(t);
        exchange(t, &mut a, &mut b);
        assert_eq!(connected(&a, 2000), connected(&b, 1000).swap());
        assert_eq!(b.next_qpn, 200_001, "one QP accepted, not two");
    }

    trait Swap {
        fn swap(self) -> Self;
    }
    impl Swap for (u32, u32) {
        fn swap(self) -> Self {
            (self.1, self.0)
        }
    }

    #[test]
    fn an_unanswered_attempt_fails_after_max_tries() {
        let mut a = Side::new(1000, 1);
        a.hs.connect(Timestamp::ZERO, addr(2000), qp(1000, 11))
            .unwrap();
        let mut sent = a.out().len();
        while let Some(t) = a.hs.poll_timeout() {
            a.hs.handle_timeout(t);
            sent += a.out().len();
        }
        assert_eq!(sent as u32, HandshakeConfig::default().max_tries);
        assert!(matches!(
            a.events()[..],
            [HandshakeEvent::Failed {
                reason: ConnectFailure::Timeout,
                ..
            }]
        ));
        assert_eq!(a.hs.state(addr(2000)), None);
    }

    #[test]
    fn a_restarted_peer_replaces_the_connection() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 5));
        b.hs.connect(now, addr(1000), qp(2000, 22)).unwrap();
        exchange(now, &mut a, &mut b);
        let (old_local, _) = connected(&a, 2000);
        a.events();
        // b restarts: a new incarnation, a new QP.
        let mut b2 = Side::new(2000, 6);
        b2.hs.connect(now, addr(1000), qp(2000, 33)).unwrap();
        exchange(now, &mut a, &mut b2);
        let (new_local, remote) = connected(&a, 2000);
        assert_eq!(remote, 33);
        assert_ne!(new_local, old_local);
        let ev = a.events();
        assert!(
            matches!(ev[0], HandshakeEvent::Replaced { old_local: o, .. } if o.qpn == old_local)
        );
        assert!(matches!(
            ev[1],
            HandshakeEvent::Connected { incarnation: 6, .. }
        ));
        // A late request of the old incarnation is stale.
        let mut old = Side::new(2000, 5);
        old.hs.connect(now, addr(1000), qp(2000, 22)).unwrap();
        let d = old.out();
        a.deliver(now, 2000, &d[0]);
        assert_eq!(connected(&a, 2000), (new_local, 33));
        assert_eq!(a.hs.stats().stale, 1);
    }

    #[test]
    fn a_late_request_of_an_earlier_attempt_does_not_replace_the_newer_connection() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 5));
        b.hs.connect(now, addr(1000), qp(2000, 22)).unwrap();
        // The first attempt's REQUEST, as a retransmission still in flight would carry it.
        let late = b.out().remove(0);
        a.deliver(now, 2000, &late);
        exchange(now, &mut a, &mut b);
        assert_eq!(connected(&b, 1000).0, 22);
        // Same run of b, a second attempt (its first connection failed): it replaces.
        b.hs.forget(addr(1000));
        b.hs.connect(now, addr(1000), qp(2000, 33)).unwrap();
        exchange(now, &mut a, &mut b);
        let (new_local, remote) = connected(&a, 2000);
        assert_eq!(remote, 33);
        assert!(matches!(
            a.events()[..],
            [_, HandshakeEvent::Replaced { .. }, _]
        ));
        // Then the first attempt's REQUEST arrives: stale, nothing answered, nothing replaced.
        let stale = a.hs.stats().stale;
        a.deliver(now, 2000, &late);
        assert_eq!(connected(&a, 2000), (new_local, 33));
        assert!(a.events().is_empty());
        assert!(a.out().is_empty());
        assert_eq!(a.hs.stats().stale, stale + 1);
        // A third attempt still replaces.
        b.hs.forget(addr(1000));
        b.hs.connect(now, addr(1000), qp(2000, 44)).unwrap();
        exchange(now, &mut a, &mut b);
        assert_eq!(connected(&a, 2000).1, 44);
        assert_eq!(connected(&b, 1000).0, 44);
    }

    #[test]
    fn a_reply_tells_which_of_the_peers_requests_are_older_than_the_connection() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 5));
        // b tries first and gives up before its REQUEST arrives.
        b.hs.connect(now, addr(1000), qp(2000, 22)).unwrap();
        let late = b.out().remove(0);
        b.hs.forget(addr(1000));
        // a connects; b's REPLY says b has used attempt 1 already.
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        exchange(now, &mut a, &mut b);
        let (local, remote) = connected(&a, 2000);
        assert_eq!(local, 11);
        a.events();
        a.deliver(now, 2000, &late);
        assert_eq!(connected(&a, 2000), (local, remote));
        assert!(a.events().is_empty());
        assert_eq!(a.hs.stats().stale, 1);
    }

    #[test]
    fn a_refused_request_fails_the_attempt_with_the_reason() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 2));
        b.refuse = true;
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        exchange(now, &mut a, &mut b);
        assert!(matches!(
            a.events()[..],
            [HandshakeEvent::Failed {
                reason: ConnectFailure::Rejected(RejectReason::Refused),
                ..
            }]
        ));
        assert_eq!(b.hs.state(addr(1000)), None);
    }

    #[test]
    fn another_version_is_rejected() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 2));
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        let mut req = a.out().remove(0);
        req[0] = 9;
        b.deliver(now, 1000, &req);
        let rej = b.out();
        assert_eq!(rej.len(), 1);
        a.deliver(now, 2000, &rej[0]);
        assert!(matches!(
            a.events()[..],
            [HandshakeEvent::Failed {
                reason: ConnectFailure::Rejected(RejectReason::Version),
                ..
            }]
        ));
    }

    #[test]
    fn hostile_datagrams_are_dropped() {
        let now = Timestamp::ZERO;
        let mut a = Side::new(1000, 1);
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        let good = a.out().remove(0);
        let mut b = Side::new(2000, 2);
        // Every truncation, and every single-byte corruption.
        for n in 0..good.len() {
            b.deliver(now, 1000, &good[..n]);
        }
        for i in 0..good.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut d = good.clone();
                d[i] ^= x;
                b.deliver(now, 1000, &d);
            }
        }
        assert_eq!(b.hs.peer_count(), 0);
        assert!(b.hs.stats().malformed > 0);
        // Only version corruptions are answered (with a REJECT); nothing got accepted.
        assert!(b.out().iter().all(|d| d[1] == KIND_REJECT));
        b.deliver(now, 1000, &good);
        assert_eq!(b.hs.peer_count(), 1);
    }

    /// A REQUEST as a flooder forges it: from `src`, claiming device port `port` and QP `qpn`.
    fn forged_request(src: SocketAddr, port: u16, qpn: u32) -> Vec<u8> {
        Message {
            kind: KIND_REQUEST,
            reason: 0,
            incarnation: 7,
            echo_incarnation: 0,
            attempt: 1,
            features: 0,
            echo_qpn: 0,
            info: QpInfo {
                addr: SocketAddr::new(src.ip(), port),
                qpn,
                psn: 1,
                seal_key: None,
            },
        }
        .emit()
    }

    fn limited(port: u16, cfg: HandshakeConfig) -> Side {
        let mut s = Side::new(port, 2);
        s.hs = Handshake::new(cfg, addr(port), 2);
        s
    }

    fn rejects(d: &[Vec<u8>], reason: RejectReason) -> usize {
        d.iter()
            .filter(|d| d[1] == KIND_REJECT && d[2] == reason.code())
            .count()
    }

    #[test]
    fn the_requester_confirms_an_accepted_connection() {
        let now = Timestamp::ZERO;
        let (mut a, mut b) = (Side::new(1000, 1), Side::new(2000, 2));
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        let req = a.out();
        b.deliver(now, 1000, &req[0]);
        assert_eq!(b.hs.accepted_from(addr(1000).ip()), (1, 1));
        assert_eq!(b.hs.unconfirmed_count(), 1);
        exchange(now, &mut a, &mut b);
        assert_eq!(a.hs.stats().confirms_sent, 1);
        assert_eq!(b.hs.stats().confirmed, 1);
        assert_eq!(b.hs.accepted_from(addr(1000).ip()), (1, 0));
        assert_eq!(b.hs.unconfirmed_count(), 0);
        // A confirmed connection forgotten frees its slot.
        b.hs.forget(addr(1000));
        assert_eq!(b.hs.accepted_from(addr(1000).ip()), (0, 0));
    }

    #[test]
    fn a_request_flood_from_one_source_is_bounded_and_other_peers_still_connect() {
        let now = Timestamp::ZERO;
        let cfg = HandshakeConfig {
            max_unconfirmed_per_source: 4,
            max_unconfirmed: 6,
            unconfirmed_grace_ns: 1_000_000_000,
            ..HandshakeConfig::default()
        };
        let mut b = limited(2000, cfg);
        let flooder: SocketAddr = "10.0.0.9:5000".parse().unwrap();
        for i in 0..100u16 {
            b.deliver_from(
                now,
                flooder,
                &forged_request(flooder, 3000 + i, 50 + u32::from(i)),
            );
        }
        // Four accepted (and unconfirmed), the other 96 rejected with Limit.
        assert_eq!(b.next_qpn, 2000 * 100 + 4);
        assert_eq!(b.hs.accepted_from(flooder.ip()), (4, 4));
        assert_eq!(b.hs.stats().limit_rejects, 96);
        assert_eq!(rejects(&b.out(), RejectReason::Limit), 96);
        // A second source fills the global unconfirmed limit (6) with two more.
        let other: SocketAddr = "10.0.0.10:5000".parse().unwrap();
        for i in 0..3u16 {
            b.deliver_from(
                now,
                other,
                &forged_request(other, 3000 + i, 50 + u32::from(i)),
            );
        }
        assert_eq!(b.hs.unconfirmed_count(), 6);
        assert_eq!(b.hs.accepted_from(other.ip()), (2, 2));
        b.out();
        // A real peer from elsewhere is refused while the unconfirmed are young...
        let mut a = Side::new(1000, 1);
        a.hs.connect(now, addr(2000), qp(1000, 11)).unwrap();
        exchange(now, &mut a, &mut b);
        assert_eq!(
            a.events(),
            vec![HandshakeEvent::Failed {
                peer: addr(2000),
                local: qp(1000, 11),
                reason: ConnectFailure::Rejected(RejectReason::Limit),
            }]
        );
        // ...and once they are past the grace time, the oldest makes room for it.
        let later = now + Duration::from_secs(2);
        a.hs.connect(later, addr(2000), qp(1000, 12)).unwrap();
        exchange(later, &mut a, &mut b);
        assert_eq!(connected(&a, 2000).0, 12);
        assert_eq!(b.hs.stats().expired, 1);
        let expired: Vec<_> = b
            .events()
            .into_iter()
            .filter(|e| matches!(e, HandshakeEvent::Expired { .. }))
            .collect();
        assert_eq!(expired.len(), 1);
        // The real peer confirmed, so it holds no unconfirmed slot: 5 forged ones remain.
        assert_eq!(b.hs.accepted_from(addr(1000).ip()), (1, 0));
        assert_eq!(b.hs.unconfirmed_count(), 5);
    }

    #[test]
    fn confirmed_connections_per_source_are_bounded_too() {
        let now = Timestamp::ZERO;
        let cfg = HandshakeConfig {
            max_accepted_per_source: 3,
            ..HandshakeConfig::default()
        };
        let mut b = limited(2000, cfg);
        let mut peers: Vec<Side> = (0..4).map(|i| Side::new(1000 + i, 1)).collect();
        for (i, a) in peers.iter_mut().enumerate() {
            a.hs.connect(now, addr(2000), qp(a.port, 11)).unwrap();
            exchange(now, a, &mut b);
            let ev = a.events();
            if i < 3 {
                assert!(
                    matches!(ev[..], [HandshakeEvent::Connected { .. }]),
                    "{ev:?}"
                );
            } else {
                assert_eq!(
                    ev,
                    vec![HandshakeEvent::Failed {
                        peer: addr(2000),
                        local: qp(a.port, 11),
                        reason: ConnectFailure::Rejected(RejectReason::Limit),
                    }]
                );
            }
        }
        assert_eq!(b.hs.accepted_from(addr(1000).ip()), (3, 0));
        // A connected peer restarting (new incarnation) replaces its own slot: not refused.
        let mut again = Side::new(1000, 5);
        again.hs.connect(now, addr(2000), qp(1000, 21)).unwrap();
        exchange(now, &mut again, &mut b);
        assert_eq!(connected(&again, 2000).0, 21);
        assert_eq!(b.hs.accepted_from(addr(1000).ip()), (3, 0));
    }

    #[test]
    fn messages_round_trip() {
        let m = Message {
            kind: KIND_REPLY,
            reason: 0,
            incarnation: 0x0102_0304_0506_0708,
            echo_incarnation: 9,
            attempt: 0x1112_1314_1516_1718,
            features: FEATURE_SEAL,
            echo_qpn: 77,
            info: QpInfo {
                addr: "[::1]:4791".parse().unwrap(),
                qpn: 5,
                psn: 6,
                seal_key: Some([3; 32]),
            },
        };
        let d = m.emit();
        assert_eq!(d.len(), MAX_DATAGRAM);
        assert!(is_handshake(&d));
        assert_eq!(Message::parse(&d), Ok(m));
    }
}

/// The runtime over loopback UDP: real devices, real progress threads.
#[cfg(test)]
mod device_tests {
    use super::*;
    use crate::{Access, DeviceConfig, MemoryRegion, SendOp, WcOpcode, WcStatus};

    const WAIT: Duration = Duration::from_secs(20);

    struct End {
        dev: Device,
        pd: ProtectionDomain,
        cq: CompletionQueue,
    }

    fn open_at(addr: SocketAddr) -> End {
        let dev = Device::open(DeviceConfig::udp(addr).paths(2)).unwrap();
        let pd = dev.alloc_pd();
        let cq = dev.create_cq();
        dev.enable_handshake(&pd, &cq, &cq).unwrap();
        End { dev, pd, cq }
    }

    fn open() -> End {
        open_at("127.0.0.1:0".parse().unwrap())
    }

    fn mr(e: &End) -> MemoryRegion {
        e.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap()
    }

    fn send(wr_id: u64, src: &MemoryRegion, len: u32) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send,
            sges: vec![src.sge(0, len)],
            signaled: true,
        }
    }

    fn established(e: &End) -> Connection {
        match e.dev.wait_connection_event(WAIT) {
            Some(ConnectionEvent::Established(c)) => c,
            other => panic!("expected an established connection, got {other:?}"),
        }
    }

    #[test]
    fn a_send_posted_before_the_connection_is_delivered_to_an_unknown_peer() {
        let (a, b) = (open(), open());
        let (sa, rb) = (mr(&a), mr(&b));
        sa.write(0, b"first op").unwrap();
        // Nothing is connected: the SEND waits for the handshake, b accepts a's request.
        a.dev
            .post_send_to(b.dev.local_addr(), send(1, &sa, 8))
            .unwrap();
        let c = established(&b);
        assert!(c.accepted);
        assert_eq!(c.peer, a.dev.local_addr());
        b.dev
            .post_recv_to(
                c.peer,
                RecvWr {
                    wr_id: 2,
                    sges: vec![rb.sge(0, 64)],
                },
            )
            .unwrap();
        let wc = a.cq.wait(WAIT).expect("send completion");
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
        let wc = b.cq.wait(WAIT).expect("recv completion");
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (2, WcStatus::Success, WcOpcode::Recv)
        );
        let mut got = [0u8; 8];
        rb.read(0, &mut got).unwrap();
        assert_eq!(&got, b"first op");
        let ca = a.dev.connection(b.dev.local_addr()).unwrap();
        assert_eq!((ca.local.qpn, ca.remote.qpn), (c.remote.qpn, c.local.qpn));
    }

    #[test]
    fn both_sides_connecting_at_once_get_one_qp_pair() {
        let (a, b) = (open(), open());
        let (pa, pb) = (a.dev.local_addr(), b.dev.local_addr());
        a.dev.connect_to(pb).unwrap();
        b.dev.connect_to(pa).unwrap();
        let ca = a.dev.wait_connected(pb, WAIT).unwrap();
        let cb = b.dev.wait_connected(pa, WAIT).unwrap();
        assert_eq!(ca.local.qpn, cb.remote.qpn);
        assert_eq!(ca.remote.qpn, cb.local.qpn);
        // Exactly one QP per side.
        assert_eq!(a.dev.inner_qp_count(), 1);
        assert_eq!(b.dev.inner_qp_count(), 1);
        // And it carries traffic both ways.
        let (sa, sb, ra, rb) = (mr(&a), mr(&b), mr(&a), mr(&b));
        let recv = |m: &MemoryRegion| RecvWr {
            wr_id: 9,
            sges: vec![m.sge(0, 64)],
        };
        a.dev.post_recv_to(pb, recv(&ra)).unwrap();
        b.dev.post_recv_to(pa, recv(&rb)).unwrap();
        a.dev.post_send_to(pb, send(1, &sa, 4)).unwrap();
        b.dev.post_send_to(pa, send(1, &sb, 4)).unwrap();
        for cq in [&a.cq, &b.cq] {
            for _ in 0..2 {
                let wc = cq.wait(WAIT).expect("completion");
                assert_eq!(wc.status, WcStatus::Success);
            }
        }
    }

    #[test]
    fn a_restarted_peer_replaces_the_old_connection() {
        let a = open();
        let pa = a.dev.local_addr();
        let b = open();
        let pb = b.dev.local_addr();
        b.dev.wait_connected(pa, WAIT).unwrap();
        let first = established(&a);
        drop(b);
        // The peer comes back on the same address with a new incarnation.
        let b2 = open_at(pb);
        let c2 = b2.dev.wait_connected(pa, WAIT).unwrap();
        match a.dev.wait_connection_event(WAIT) {
            Some(ConnectionEvent::Replaced { peer, old_qpn }) => {
                assert_eq!((peer, old_qpn), (pb, first.local.qpn));
            }
            other => panic!("expected a replacement, got {other:?}"),
        }
        let second = established(&a);
        assert!(second.incarnation > first.incarnation);
        assert_eq!(second.remote.qpn, c2.local.qpn);
        assert_ne!(second.local.qpn, first.local.qpn);
        // A receive meant for the old QP does not reach the new one.
        let (s, r) = (mr(&b2), mr(&a));
        let recv = |wr_id| RecvWr {
            wr_id,
            sges: vec![r.sge(0, 64)],
        };
        assert_eq!(
            a.dev.post_recv_on(pb, first.local.qpn, recv(4)),
            Err(ConnectError::Replaced)
        );
        // The new connection works.
        assert_eq!(a.dev.post_recv_to(pb, recv(5)), Ok(second.local.qpn));
        b2.dev.post_send_to(pa, send(6, &s, 16)).unwrap();
        let wc = a.cq.wait(WAIT).expect("recv");
        assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
        // And takes receives posted on it by number.
        a.dev.post_recv_on(pb, second.local.qpn, recv(7)).unwrap();
        b2.dev.post_send_to(pa, send(8, &s, 16)).unwrap();
        let wc = a.cq.wait(WAIT).expect("recv");
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    }

    #[test]
    fn an_unreachable_peer_fails_the_queued_work_as_flushed() {
        let a = open();
        // A bound socket that never answers.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = silent.local_addr().unwrap();
        let s = mr(&a);
        a.dev.post_send_to(peer, send(3, &s, 8)).unwrap();
        match a.dev.wait_connected(peer, Duration::from_secs(60)) {
            Err(ConnectError::Failed(ConnectFailure::Timeout)) => {}
            other => panic!("expected a timeout failure, got {other:?}"),
        }
        let wc = a.cq.wait(WAIT).expect("flushed completion");
        assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Flushed));
        assert!(a.dev.handshake_stats().retransmits >= 1);
    }

    #[test]
    fn calls_without_the_handshake_enabled_are_refused() {
        let dev = Device::open(DeviceConfig::udp("127.0.0.1:0".parse().unwrap())).unwrap();
        let peer = "127.0.0.1:9".parse().unwrap();
        assert_eq!(dev.connect_to(peer), Err(ConnectError::NotEnabled));
        assert_eq!(dev.poll_connection_event(), None);
        let pd = dev.alloc_pd();
        let cq = dev.create_cq();
        dev.enable_handshake(&pd, &cq, &cq).unwrap();
        assert_eq!(
            dev.enable_handshake(&pd, &cq, &cq),
            Err(ConnectError::AlreadyEnabled)
        );
    }

    #[test]
    fn a_request_flood_over_loopback_uses_no_more_qps_than_the_limits() {
        // The responder at 127.0.0.1 allows 8 unconfirmed connections per source and a long
        // grace, so nothing expires during the test.
        let b = {
            let dev =
                Device::open(DeviceConfig::udp("127.0.0.1:0".parse().unwrap()).paths(2)).unwrap();
            let pd = dev.alloc_pd();
            let cq = dev.create_cq();
            let cfg = HandshakeConfig {
                max_unconfirmed_per_source: 8,
                unconfirmed_grace_ns: 600_000_000_000,
                ..HandshakeConfig::default()
            };
            dev.enable_handshake_with(cfg, &pd, &cq, &cq).unwrap();
            End { dev, pd, cq }
        };
        let pb = b.dev.local_addr();
        let qps_before = b.dev.inner_qp_count();
        // The flood: 500 requests from one socket at 127.0.0.3, each claiming another device
        // port and QP, so each is a new peer to the responder.
        let flood = std::net::UdpSocket::bind("127.0.0.3:0").unwrap();
        let fa = flood.local_addr().unwrap();
        for i in 0..500u32 {
            let d = Message {
                kind: KIND_REQUEST,
                reason: 0,
                incarnation: 9,
                echo_incarnation: 0,
                attempt: 1,
                features: 0,
                echo_qpn: 0,
                info: QpInfo {
                    addr: SocketAddr::new(fa.ip(), 10_000 + i as u16),
                    qpn: 100 + i,
                    psn: 1,
                    seal_key: None,
                },
            }
            .emit();
            flood.send_to(&d, pb).unwrap();
        }
        // Every request is answered (to the port it claims, where nobody listens): 8
        // REPLYs, the rest Limit REJECTs. Loopback loses nothing here (500 datagrams of
        // 64 bytes fit the socket buffer); wait until the device has handled them all.
        let deadline = std::time::Instant::now() + WAIT;
        let st = loop {
            let st = b.dev.handshake_stats();
            if st.replies_sent + st.rejects_sent >= 500 || std::time::Instant::now() > deadline {
                break st;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!((st.replies_sent, st.limit_rejects), (8, 492), "{st:?}");
        assert_eq!(b.dev.inner_qp_count() - qps_before, 8);
        // A real device from the flooded address is refused: its attempt fails with Limit...
        let same = open_at("127.0.0.3:0".parse().unwrap());
        assert_eq!(
            same.dev.wait_connected(pb, WAIT).map(|_| ()),
            Err(ConnectError::Failed(ConnectFailure::Rejected(
                RejectReason::Limit
            )))
        );
        // ...while peers from other addresses still connect and carry traffic.
        for ip in ["127.0.0.2:0", "127.0.0.4:0"] {
            let a = open_at(ip.parse().unwrap());
            let (sa, rb) = (mr(&a), mr(&b));
            sa.write(0, b"still up").unwrap();
            a.dev.post_send_to(pb, send(1, &sa, 8)).unwrap();
            let c = loop {
                match b.dev.wait_connection_event(WAIT) {
                    Some(ConnectionEvent::Established(c)) if c.peer == a.dev.local_addr() => {
                        break c;
                    }
                    Some(_) => {}
                    None => panic!("no connection from {ip}"),
                }
            };
            b.dev
                .post_recv_to(
                    c.peer,
                    RecvWr {
                        wr_id: 2,
                        sges: vec![rb.sge(0, 64)],
                    },
                )
                .unwrap();
            let wc = a.cq.wait(WAIT).expect("send completion");
            assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
            let wc = b.cq.wait(WAIT).expect("recv completion");
            assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
            let mut got = [0u8; 8];
            rb.read(0, &mut got).unwrap();
            assert_eq!(&got, b"still up");
        }
        // Both real requesters confirmed; the 8 forged connections stay unconfirmed.
        let st = b.dev.handshake_stats();
        assert_eq!(st.confirmed, 2);
    }
}
