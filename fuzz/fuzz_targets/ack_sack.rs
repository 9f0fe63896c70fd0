//! A sender driven by crafted ACKs and NAKs, and the receive tracker against a model; see
//! `braid_tests::fuzz_checks::ack_sack`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_tests::fuzz_checks::ack_sack(data));
