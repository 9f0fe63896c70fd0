//! Braid: RDMA semantics over plain Ethernet.
//!
//! Registered memory, one-sided RDMA WRITE and READ, SEND/RECV, atomics and completion
//! queues, with every message sprayed packet by packet over many UDP paths and every packet
//! placed straight at its final offset, in whatever order it arrives. The API follows
//! libibverbs: open a [`Device`], allocate a [`ProtectionDomain`], register
//! [`MemoryRegion`]s, create [`CompletionQueue`]s and [`QueuePair`]s, exchange [`QpInfo`] with
//! the peer out of band, then post work and poll completions.
//!
//! What it does not do: it is not wire-compatible with RoCE or InfiniBand, it has no
//! unreliable QP types, and memory regions are read and written through methods rather than
//! as plain slices (see [`braid_proto::mem`] for the access rule that keeps concurrent remote
//! writes defined behaviour).
//!
//! ```
//! use braid::{Access, Device, DeviceConfig, SendOp, SendWr, WcStatus};
//! use std::time::Duration;
//!
//! let open = || Device::open(DeviceConfig::udp("127.0.0.1:0".parse().unwrap())).unwrap();
//! let (a, b) = (open(), open());
//! let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
//! let (cq_a, cq_b) = (a.create_cq(), b.create_cq());
//! let qp_a = pd_a.create_qp(&cq_a, &cq_a).unwrap();
//! let qp_b = pd_b.create_qp(&cq_b, &cq_b).unwrap();
//! qp_a.connect(qp_b.info()).unwrap();
//! qp_b.connect(qp_a.info()).unwrap();
//!
//! let src = pd_a.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
//! let dst = pd_b.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
//! src.write(0, b"hello, braid").unwrap();
//!
//! // RDMA WRITE 12 bytes into the peer's region at offset 100 (its rkey came out of band).
//! let wr = SendWr { wr_id: 7, op: SendOp::Write(dst.remote(100)), sges: vec![src.sge(0, 12)], signaled: true };
//! qp_a.post_send(wr).unwrap();
//! let wc = cq_a.wait(Duration::from_secs(5)).expect("completion");
//! assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
//!
//! let mut got = [0u8; 12];
//! dst.read(100, &mut got).unwrap();
//! assert_eq!(&got, b"hello, braid");
//! ```
#![warn(missing_docs, unreachable_pub)]

mod device;
pub mod handshake;
#[cfg(feature = "testing")]
pub mod testing;

pub use braid_proto::{
    Access, Completion, EndpointConfig, EndpointStats, MAX_PATHS, MemError, PathStats, PostError,
    QpInfo, QpOptions, QpState, QpStats, RNR_RETRY_FOREVER, RecvWr, Region, RemoteAddr,
    ResourceError, RttSummary, SendOp, SendWr, Sge, Timestamp, WcOpcode, WcStatus,
};
pub use device::{
    Backend, CompletionQueue, DatapathKind, Device, DeviceConfig, MemoryRegion, OpenError,
    Progress, ProtectionDomain, QueuePair, VerbsUnavailable,
};
pub use handshake::{ConnectError, Connection, ConnectionEvent};

/// The datapaths (UDP sockets, simulated network).
pub use braid_datapath as datapath;
/// The sans-IO engine, for simulations and tools that drive it directly.
pub use braid_proto as proto;
