//! Raw bytes into the packet parser. Under `cfg(fuzzing)` the CRC check passes, so the
//! fuzzer reaches every field decoder. Structural properties checked on every accepted input:
//! the payload lies inside the datagram, printing never panics, and re-emitting the parsed
//! packet gives back the same header, body and payload bytes.
#![no_main]

use braid_proto::wire::{self, Packet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(p) = Packet::parse(data) else { return };
    assert!(p.payload.len() + wire::HEADER_LEN + wire::TRAILER_LEN <= data.len());
    let _ = p.to_string();
    let mut out = vec![0u8; data.len()];
    let n = wire::emit(&mut out, &p.header, &p.body, p.payload.len(), |b| b.copy_from_slice(p.payload))
        .expect("a parsed packet fits the buffer it came from");
    let again = Packet::parse(&out[..n]).expect("an emitted packet parses");
    assert_eq!(again.header, p.header);
    assert_eq!(again.body, p.body);
    assert_eq!(again.payload, p.payload);
});
