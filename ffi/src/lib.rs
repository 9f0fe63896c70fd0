//! The C API of Braid: `libbraid.so` and `include/braid.h`.
//!
//! A C ABI over the verbs-like [`braid_rt`] API: devices, protection domains, memory regions,
//! completion queues (poll, blocking wait, and a file descriptor for epoll), queue pairs
//! (connection information as a byte blob for out-of-band exchange, every send operation with
//! scatter/gather lists, receives) and counters. The header is generated from this crate with
//! cbindgen (`ffi/cbindgen.toml`) and committed; `tests/header.rs` fails when it is stale.
//!
//! What it does not do: it is not libibverbs-compatible (names, structs and semantics follow
//! verbs, but a verbs program must be ported), it has no libfabric interface (that is the
//! separate provider), and memory regions are addressed by offset, not by virtual address.
//!
//! The rules every exported function follows:
//! - It returns an errno-style code: 0 or a count on success, a negative `BRAID_E*` value
//!   on failure, with a message for [`braid_last_error`] on the calling thread.
//! - No panic crosses the boundary: each body runs under `catch_unwind`, and a panic returns
//!   [`BRAID_EINTERNAL`].
//! - Every pointer is checked for null, every size and enum value for range.
//! - Handles are opaque tokens, not addresses: they are looked up in a registry and checked
//!   for kind, so a stale, destroyed or forged handle returns [`BRAID_EBADF`] instead of
//!   touching freed memory. Destroying a parent that still has children returns
//!   [`BRAID_EBUSY`].
#![warn(missing_docs, unreachable_pub)]
// The C names (braid_device, braid_wc, ...) are the ones the header shows.
#![allow(non_camel_case_types)]

mod cq;
mod device;
mod error;
mod handle;
mod mr;
mod qp;
mod types;

pub use cq::*;
pub use device::*;
pub use error::*;
pub use mr::*;
pub use qp::*;
pub use types::*;
