//! Raw bytes into the packet parser and printer; see `braid_tests::fuzz_checks::packet`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| braid_tests::fuzz_checks::packet(data));
