//! Arbitrary API calls and network changes on the simulated network, against an oracle; see
//! `braid_tests::fuzz_checks::sim_ops`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_tests::fuzz_checks::sim_ops(data));
