//! Braid's protocol engine, sans-IO: it opens no socket, starts no thread, reads no clock and
//! draws no OS entropy. Every input takes `now` as a [`Timestamp`]; randomness comes from the
//! seed in [`EndpointConfig`]. That is what lets the same engine run over UDP sockets, AF_XDP
//! and the deterministic simulator, and lets a failing simulated run be replayed from its seed.
//!
//! What it does: the wire format ([`wire`]), memory regions and direct placement ([`mem`]),
//! per-connection sequence numbers, selective ACKs, time-based loss detection, retransmit
//! timeouts, RNR retries, response replay for READ and atomics, and the verbs-like queue pair
//! state machine ([`Endpoint`]), and optional per-connection authenticated encryption
//! ([`seal`]). Congestion control is delegated to `braid-cc`.
#![warn(missing_docs, unreachable_pub)]
// The engine parses hostile bytes; it does so in safe code. The one exception is registering
// caller memory ([`mem::Region::from_raw`]), allowed item by item in `mem.rs`.
#![deny(unsafe_code)]

mod coverage;
mod deadline;
mod departure;
pub mod endpoint;
pub mod hist;
mod in_place;
mod keymap;
mod landing;
pub mod mem;
mod nak_repeat;
mod qp;
mod rc_order;
mod ready;
mod retry;
pub mod seal;
mod seq;
pub mod share;
mod shared;
mod stall;
pub mod tracker;
pub mod types;
pub mod validate;
pub mod wire;

pub use braid_cc as cc;
pub use braid_time::Timestamp;
pub use coverage::MAX_TRACKED_RANGES;
pub use endpoint::{ECN_CE, ECN_ECT0, Endpoint, QpStats, Transmit};
pub use hist::{RttHistogram, RttSummary};
pub use in_place::PayloadAt;
pub use keymap::{KeyHasher, KeyMap};
pub use landing::{LANDING_MIN_BYTES, Landing};
pub use mem::{Access, MemError, Region};
pub use types::*;
