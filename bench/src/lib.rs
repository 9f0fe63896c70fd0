//! Shared pieces of Braid's benchmark tools: the test loops `braid-perf` runs over a connected
//! queue pair, data patterns for end-to-end verification, latency percentiles, the JSON report
//! shapes, and the bootstrap messages `braid-perf client` and `server` exchange over TCP.
#![warn(missing_docs)]

pub mod blast;
pub mod fabric;
pub mod pattern;
pub mod report;
pub mod run;
pub mod stats;
pub mod wire;
