//! Braid's integration tests: one test binary, one module per area.
//!
//! - `wire`: the packet format, byte for byte.
//! - `sim_e2e`: real engines on the deterministic simulated network, under loss, reordering,
//!   duplication and corruption. Every failure names its seed; replay one with
//!   `BRAID_SEED=<seed> cargo test -p braid-tests <test name>`.
//! - `hostile`: bad keys, bounds and rights, hostile datagrams, bad API use.
//! - `encryption`: encrypted QPs: agreement at connect; tampered, replayed and forged
//!   datagrams; encrypted devices over UDP.
//! - `loopback`: devices over real UDP on 127.0.0.1, in one process and across two.
//! - `conformance`: the public API's behaviour case by case, on the software backend, or
//!   on the verbs backend with `BRAID_TEST_VERBS=1` (see `braid_tests::conformance`).
//! - `shard`: devices with several engine shards, QPs spread over them.
mod burst;
mod conformance;
mod encryption;
mod fabric;
mod fabric_shapes;
mod fault_matrix;
mod fuzz_corpus;
mod host_stall;
mod hostile;
mod loopback;
mod netns;
mod netns_faults;
mod netns_paths;
mod rc_fairness;
mod rc_order;
mod rc_recovery;
mod shard;
mod sim_e2e;
mod support;
mod telemetry;
mod wire;
