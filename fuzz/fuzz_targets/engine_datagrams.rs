//! One endpoint fed arbitrary datagrams, checked against shadow copies of its regions; see
//! `braid_tests::fuzz_checks::engine_datagrams`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_tests::fuzz_checks::engine_datagrams(data));
