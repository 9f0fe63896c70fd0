//! The runtime: a device drives one [`Endpoint`](braid_proto::Endpoint) over a real datapath,
//! with a progress thread for receives and timers; application threads post work and poll
//! completions. With [`Progress::Inline`] (run to completion) the threads that poll or wait
//! on completion queues drive the datapath and the engine themselves, and the progress
//! thread is only the fallback for when nobody polls.
//!
//! - `config.rs`: how a device is opened ([`DeviceConfig`], the datapath choice,
//!   [`OpenError`]).
//! - `runtime.rs`: the core that owns the engine (the engine lock, the post hand-off, the
//!   progress thread, the receive and transmit loops, timers) and its concurrency rules.
//! - `handles.rs`: the public handles, which reach the engine only through that core.
//! - `backend.rs`: the software/verbs choice ([`Backend`]) and, with the `verbs` feature,
//!   the rdma-core objects the handles hold on a verbs device.
//! - `cq_fd.rs`: a completion queue's file descriptor for epoll users.
mod backend;
mod config;
mod cq_fd;
mod handles;
mod runtime;

pub use backend::{Backend, VerbsUnavailable};
pub use config::{DatapathKind, DeviceConfig, OpenError, Progress};
pub use handles::{CompletionQueue, Device, MemoryRegion, ProtectionDomain, QueuePair};
