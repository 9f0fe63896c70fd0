//! The C types: opaque handles, flags, enumerations and plain structs.
use core::ffi::c_char;

/// A device: an endpoint bound to a local address over a datapath (UDP sockets, io_uring or
/// AF_XDP), with its own progress thread. Opaque.
pub struct braid_device {
    _opaque: [u8; 0],
}

/// A protection domain: memory regions and QPs of one domain may be used together. Opaque.
pub struct braid_pd {
    _opaque: [u8; 0],
}

/// A registered memory region. Opaque.
pub struct braid_mr {
    _opaque: [u8; 0],
}

/// A completion queue. Opaque.
pub struct braid_cq {
    _opaque: [u8; 0],
}

/// A reliable queue pair, connected to one peer QP. Opaque.
pub struct braid_qp {
    _opaque: [u8; 0],
}

/// Datapath: plain UDP sockets (sendmmsg/recvmmsg). Needs no privileges.
pub const BRAID_DATAPATH_UDP: u32 = 0;
/// Datapath: UDP sockets driven through io_uring.
pub const BRAID_DATAPATH_URING: u32 = 1;
/// Datapath: AF_XDP on the interface that owns the bind address (needs CAP_NET_ADMIN and
/// CAP_BPF, and an IPv4 address).
pub const BRAID_DATAPATH_XDP: u32 = 2;
/// Datapath: AF_XDP if it can be set up, else io_uring, else UDP sockets;
/// `braid_device_report` says which one was opened and why.
pub const BRAID_DATAPATH_AUTO: u32 = 3;
/// Datapath of a device on the verbs backend (reported by `braid_device_query`, never
/// configured): the RDMA NIC moves the data.
pub const BRAID_DATAPATH_VERBS: u32 = 4;

/// Backend: Braid's software transport over the chosen datapath (the default).
pub const BRAID_BACKEND_SOFTWARE: u32 = 0;
/// Backend: an RDMA NIC's RC queue pairs through rdma-core (`verbs_device`, or the first
/// device whose port is active). Without rdma-core, an RDMA device, or verbs support in this
/// build, `braid_device_open` fails with `BRAID_ENODEV`.
pub const BRAID_BACKEND_VERBS: u32 = 1;
/// Backend: verbs if a device is there and active, else software; `braid_device_report`
/// says which and why.
pub const BRAID_BACKEND_AUTO: u32 = 2;

/// Device flag: use `seed` as is (reproducible keys and PSNs, for tests). Without it the seed
/// comes from the OS.
pub const BRAID_DEVICE_DETERMINISTIC_SEED: u32 = 1;
/// Device flag: the progress thread spins on the datapath instead of sleeping (for a
/// dedicated core only).
pub const BRAID_DEVICE_BUSY_POLL: u32 = 2;

/// Access right: the local side may place incoming data here (RECV buffers, READ and atomic
/// destinations).
pub const BRAID_ACCESS_LOCAL_WRITE: u32 = 1;
/// Access right: peers may RDMA WRITE here.
pub const BRAID_ACCESS_REMOTE_WRITE: u32 = 2;
/// Access right: peers may RDMA READ from here.
pub const BRAID_ACCESS_REMOTE_READ: u32 = 4;
/// Access right: peers may run atomics here.
pub const BRAID_ACCESS_REMOTE_ATOMIC: u32 = 8;

/// QP flag: encrypt and authenticate every packet with AES-256-GCM (keys agreed by X25519 at
/// connect). The peer QP must be encrypted too, or connect fails with `BRAID_EPROTO`.
pub const BRAID_QP_ENCRYPTED: u32 = 1;

/// Send opcode: SEND into the peer's next posted receive.
pub const BRAID_WR_SEND: u32 = 0;
/// Send opcode: SEND with 32 bits of immediate data (`imm_data`).
pub const BRAID_WR_SEND_WITH_IMM: u32 = 1;
/// Send opcode: RDMA WRITE of the gathered bytes to `rkey` + `remote_offset`.
pub const BRAID_WR_RDMA_WRITE: u32 = 2;
/// Send opcode: RDMA WRITE with immediate: also consumes a receive at the peer, which
/// completes with `BRAID_WC_RECV_RDMA_WITH_IMM` and the immediate.
pub const BRAID_WR_RDMA_WRITE_WITH_IMM: u32 = 3;
/// Send opcode: RDMA READ from `rkey` + `remote_offset` into the scatter list.
pub const BRAID_WR_RDMA_READ: u32 = 4;
/// Send opcode: atomic fetch-and-add of `compare_add` to the native-endian u64 at `rkey` +
/// `remote_offset` (8-byte aligned); the old value lands in the single 8-byte scatter entry.
pub const BRAID_WR_ATOMIC_FETCH_AND_ADD: u32 = 5;
/// Send opcode: atomic compare-and-swap: if the u64 at `rkey` + `remote_offset` equals
/// `compare_add` it becomes `swap`; the old value lands in the single 8-byte scatter entry.
pub const BRAID_WR_ATOMIC_CMP_AND_SWP: u32 = 6;

/// Send flag: report a completion when the request succeeds (errors are always reported).
pub const BRAID_SEND_SIGNALED: u32 = 1;

/// Completion status: it worked.
pub const BRAID_WC_SUCCESS: u32 = 0;
/// Completion status: an incoming SEND was longer than the receive's buffers.
pub const BRAID_WC_LOC_LEN_ERR: u32 = 1;
/// Completion status: a local buffer could not be used (key, bounds or rights).
pub const BRAID_WC_LOC_PROT_ERR: u32 = 2;
/// Completion status: the peer refused the remote key, the bounds or the rights.
pub const BRAID_WC_REM_ACCESS_ERR: u32 = 3;
/// Completion status: the peer found the request invalid (e.g. longer than its receive).
pub const BRAID_WC_REM_INV_REQ_ERR: u32 = 4;
/// Completion status: the peer could not perform the operation (e.g. its QP is in error).
pub const BRAID_WC_REM_OP_ERR: u32 = 5;
/// Completion status: no acknowledgement after the retry limit (peer gone or unreachable).
pub const BRAID_WC_RETRY_EXC_ERR: u32 = 6;
/// Completion status: the peer had no receive posted, after every RNR retry.
pub const BRAID_WC_RNR_RETRY_EXC_ERR: u32 = 7;
/// Completion status: not executed, because the QP went to the error state first.
pub const BRAID_WC_WR_FLUSH_ERR: u32 = 8;
/// Completion status: an error this version of the header has no name for.
pub const BRAID_WC_GENERAL_ERR: u32 = 9;

/// Completion opcode: a SEND (with or without immediate) finished.
pub const BRAID_WC_SEND: u32 = 0;
/// Completion opcode: an RDMA WRITE (with or without immediate) finished.
pub const BRAID_WC_RDMA_WRITE: u32 = 1;
/// Completion opcode: an RDMA READ finished.
pub const BRAID_WC_RDMA_READ: u32 = 2;
/// Completion opcode: a fetch-and-add finished.
pub const BRAID_WC_FETCH_ADD: u32 = 3;
/// Completion opcode: a compare-and-swap finished.
pub const BRAID_WC_COMP_SWAP: u32 = 4;
/// Completion opcode: a receive was filled by a SEND.
pub const BRAID_WC_RECV: u32 = 5;
/// Completion opcode: a receive was consumed by an RDMA WRITE with immediate.
pub const BRAID_WC_RECV_RDMA_WITH_IMM: u32 = 6;
/// Completion opcode: none (an error this version of the header has no name for).
pub const BRAID_WC_UNKNOWN: u32 = 7;

/// Completion flag: `imm_data` holds immediate data.
pub const BRAID_WC_WITH_IMM: u32 = 1;

/// QP state: created, not connected (receives may be posted).
pub const BRAID_QPS_INIT: u32 = 0;
/// QP state: connected to its peer.
pub const BRAID_QPS_CONNECTED: u32 = 1;
/// QP state: failed; every work request completes as flushed.
pub const BRAID_QPS_ERROR: u32 = 2;

/// Bytes of a QP's connection information blob (`braid_qp_info`, `braid_qp_connect`).
pub const BRAID_QP_INFO_SIZE: usize = 72;
/// Most scatter/gather entries in one work request.
pub const BRAID_MAX_SGE: u32 = 32;
/// Largest region `braid_mr_alloc` allocates (4 GiB); register caller memory beyond that.
pub const BRAID_MR_ALLOC_MAX: u64 = 4_294_967_296;

/// How to open a device. Fill it with `braid_device_config_init` (which sets `struct_size`
/// and the defaults), then set `bind` and whatever else differs. Zero in a numeric field
/// means the default.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct braid_device_config {
    /// `sizeof(braid_device_config)`, set by `braid_device_config_init`; another value is
    /// refused with `BRAID_EINVAL` (a program built against a different header).
    pub struct_size: u32,
    /// One of `BRAID_DATAPATH_*`.
    pub datapath: u32,
    /// Local address to bind, as text: "192.0.2.1:7000", "[::1]:0" (port 0 picks one).
    /// Required; peers reach the device at this address, so it must not be a wildcard.
    pub bind: *const c_char,
    /// Network interface for AF_XDP, or NULL to use the one that owns `bind`'s address.
    pub interface: *const c_char,
    /// Seed for keys, initial PSNs and path choice; used only with
    /// `BRAID_DEVICE_DETERMINISTIC_SEED`.
    pub seed: u64,
    /// `BRAID_DEVICE_*` flags.
    pub flags: u32,
    /// Paths (UDP source ports) each connection sprays over, 1 to 256 (default 16).
    pub paths: u16,
    /// UDP source ports the device opens, `paths` to 256 (default twice `paths`).
    pub ports: u16,
    /// Largest datagram (UDP payload), 1024 to 65507 (default 1472; 8972 for jumbo frames).
    pub max_datagram: u32,
    /// Send queue depth per QP, at most 16384 (default 4096).
    pub max_send_wr: u32,
    /// Receive queue depth per QP, at most 16384 (default 4096).
    pub max_recv_wr: u32,
    /// Retransmit timeouts without progress before a QP fails (default 7).
    pub retry_limit: u32,
    /// Retransmit timeout floor, ns (default 500000).
    pub rto_min_ns: u64,
    /// One of `BRAID_BACKEND_*` (added after the first release: a program built against a
    /// header without it passes the shorter `struct_size` and gets the software backend).
    pub backend: u32,
    /// With `BRAID_BACKEND_VERBS`: the RDMA device name ("mlx5_0", "rxe0"), or NULL for the
    /// first active one.
    pub verbs_device: *const c_char,
}

/// `sizeof(braid_device_config)` before `backend` was added (still accepted).
pub(crate) const DEVICE_CONFIG_V1_SIZE: usize = core::mem::offset_of!(braid_device_config, backend);

/// What was opened: filled by `braid_device_query`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct braid_device_attr {
    /// `sizeof(braid_device_attr)`, set by the caller.
    pub struct_size: u32,
    /// The datapath in use: `BRAID_DATAPATH_UDP`, `_URING`, `_XDP` or, on the verbs backend,
    /// `_VERBS` (never `_AUTO`).
    pub datapath: u32,
    /// The address peers send to, NUL-terminated ("127.0.0.1:40123").
    pub local_addr: [c_char; 64],
    /// Payload bytes per full packet.
    pub chunk_size: u32,
    /// Paths per connection.
    pub paths: u32,
    /// Send queue depth per QP.
    pub max_send_wr: u32,
    /// Receive queue depth per QP.
    pub max_recv_wr: u32,
    /// Most scatter/gather entries per work request (`BRAID_MAX_SGE`).
    pub max_sge: u32,
    /// Largest message, bytes.
    pub max_msg_size: u32,
    /// The backend the device runs on: `BRAID_BACKEND_SOFTWARE` or `BRAID_BACKEND_VERBS`
    /// (never `_AUTO`: what auto chose). Added after the first release: a program built
    /// against a header without it passes the shorter `struct_size` and gets the fields
    /// before it.
    pub backend: u32,
}

/// `sizeof(braid_device_attr)` before `backend` was added.
pub(crate) const DEVICE_ATTR_V1_SIZE: usize = core::mem::offset_of!(braid_device_attr, backend);

/// A local scatter/gather entry: `length` bytes at byte `offset` of the region with key
/// `lkey`. Braid addresses regions by offset, not by virtual address.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct braid_sge {
    /// Byte offset in the region.
    pub offset: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region (`braid_mr_query`).
    pub lkey: u32,
}

/// A send work request. Fields an opcode does not use are ignored.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct braid_send_wr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// One of `BRAID_WR_*`.
    pub opcode: u32,
    /// `BRAID_SEND_*` flags.
    pub send_flags: u32,
    /// `num_sge` entries (may be NULL when `num_sge` is 0): gathered for SEND and WRITE,
    /// scattered into for READ; atomics take exactly one 8-byte entry.
    pub sg_list: *const braid_sge,
    /// Entries in `sg_list`, at most `BRAID_MAX_SGE`.
    pub num_sge: u32,
    /// Immediate data for `BRAID_WR_SEND_WITH_IMM` and `BRAID_WR_RDMA_WRITE_WITH_IMM`.
    pub imm_data: u32,
    /// The peer region's remote key (WRITE, READ, atomics).
    pub rkey: u32,
    /// Must be 0.
    pub reserved: u32,
    /// Byte offset in the peer region (WRITE, READ, atomics).
    pub remote_offset: u64,
    /// The value to add (fetch-and-add) or to compare with (compare-and-swap).
    pub compare_add: u64,
    /// The value to store (compare-and-swap).
    pub swap: u64,
}

/// A receive work request.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct braid_recv_wr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// `num_sge` entries (may be NULL when `num_sge` is 0) an incoming SEND is scattered
    /// into; their regions need `BRAID_ACCESS_LOCAL_WRITE`.
    pub sg_list: *const braid_sge,
    /// Entries in `sg_list`, at most `BRAID_MAX_SGE`.
    pub num_sge: u32,
    /// Must be 0.
    pub reserved: u32,
}

/// A work completion.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct braid_wc {
    /// The work request's identifier.
    pub wr_id: u64,
    /// One of `BRAID_WC_SUCCESS` ... `BRAID_WC_GENERAL_ERR`.
    pub status: u32,
    /// One of `BRAID_WC_SEND` ... `BRAID_WC_UNKNOWN`.
    pub opcode: u32,
    /// Bytes transferred (receive: bytes received; READ: bytes read; atomics: 8).
    pub byte_len: u32,
    /// Immediate data when `wc_flags` has `BRAID_WC_WITH_IMM`, else 0.
    pub imm_data: u32,
    /// The QP number it belongs to.
    pub qp_num: u32,
    /// `BRAID_WC_*` flags.
    pub wc_flags: u32,
}

/// A memory region's keys and extent: filled by `braid_mr_query`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct braid_mr_attr {
    /// Local key, for this side's scatter/gather entries.
    pub lkey: u32,
    /// Remote key, to give to peers for WRITE, READ and atomics.
    pub rkey: u32,
    /// Length in bytes.
    pub length: u64,
    /// `BRAID_ACCESS_*` rights.
    pub access: u32,
    /// 1 if the library allocated the memory (`braid_mr_alloc`), 0 if it is the caller's.
    pub library_owned: u32,
}

/// Device counters: filled by `braid_device_query_stats`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct braid_device_stats {
    /// `sizeof(braid_device_stats)`, set by the caller.
    pub struct_size: u32,
    /// Must be 0.
    pub reserved: u32,
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
    /// NAKs sent.
    pub naks_sent: u64,
    /// NAKs received.
    pub naks_received: u64,
    /// Retransmit timeouts fired.
    pub rto_fired: u64,
    /// Datagrams dropped on encrypted QPs because they failed authentication.
    pub rx_auth_failed: u64,
}

/// QP state and counters: filled by `braid_qp_query_stats`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct braid_qp_stats {
    /// `sizeof(braid_qp_stats)`, set by the caller.
    pub struct_size: u32,
    /// One of `BRAID_QPS_*`.
    pub state: u32,
    /// The QP number.
    pub qp_num: u32,
    /// Must be 0.
    pub reserved: u32,
    /// Smoothed RTT, ns (0 before any sample).
    pub srtt_ns: u64,
    /// Smallest RTT seen, ns (0 before any sample).
    pub min_rtt_ns: u64,
    /// Current retransmit timeout, ns.
    pub rto_ns: u64,
    /// Congestion window, bytes.
    pub cwnd_bytes: u64,
    /// Bytes in flight.
    pub in_flight_bytes: u64,
    /// Data packets sent (first transmissions).
    pub packets_sent: u64,
    /// Data packets retransmitted.
    pub retransmits: u64,
    /// Retransmit timeouts fired.
    pub rtos: u64,
    /// CE marks the peer reported.
    pub ce_marks: u64,
    /// Paths moved to a fresh source port.
    pub repaths: u64,
}
