//! Sample packets for tests: one valid packet of every kind and request op, and the helpers
//! to build and emit them, shared by the codec's unit tests and the integration tests
//! (`tests/`, which enable the `testing` feature) so both check the same packets.
//!
//! Only built for tests (`cfg(test)` or the `testing` feature); nothing in the engine uses it.
use super::{
    Ack, AtomicResponse, Body, FLAG_RETRANSMIT, Header, Kind, Nak, Op, ReadResponse, Request,
    SACK_BITS, Syndrome,
};

/// Every request op, in code order.
pub const ALL_OPS: [Op; 7] = [
    Op::Send,
    Op::SendImm,
    Op::Write,
    Op::WriteImm,
    Op::Read,
    Op::FetchAdd,
    Op::CompareSwap,
];

/// A common header of `kind` with a distinct value in every field (path 0x2a,
/// [`FLAG_RETRANSMIT`], QPs 0x123456 from 0xabcdef, PSN 0xfedcba98, timestamp
/// 0x0102030405060708).
pub fn header(kind: Kind) -> Header {
    Header {
        kind,
        path: 0x2a,
        flags: FLAG_RETRANSMIT,
        dst_qpn: 0x0012_3456,
        src_qpn: 0x00ab_cdef,
        psn: 0xfedc_ba98,
        send_ts_ns: 0x0102_0304_0506_0708,
    }
}

/// Emits a packet into a fresh vector.
pub fn emit(h: &Header, body: &Body, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; super::packet_len(body, payload.len())];
    let n = super::emit(&mut buf, h, body, payload.len(), |p| {
        p.copy_from_slice(payload)
    })
    .expect("buffer sized by packet_len");
    assert_eq!(n, buf.len(), "emit wrote the length packet_len announced");
    buf
}

/// Appends the CRC32C trailer to literal header bytes.
pub fn with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes
}

/// A request for `op` whose length fields agree with the payload it returns.
pub fn request(op: Op) -> (Request, Vec<u8>) {
    let (msg_len, offset, payload): (u32, u32, Vec<u8>) = match op {
        Op::Read => (70_000, 0, vec![]),
        Op::FetchAdd | Op::CompareSwap => (8, 0, (1..=16).collect()),
        _ => (5000, 1400, (0..100u8).map(|i| i.wrapping_mul(37)).collect()),
    };
    let imm = if matches!(op, Op::SendImm | Op::WriteImm) {
        0xdead_beef
    } else {
        0
    };
    let ssn = if op.consumes_recv() { 77 } else { 0 };
    let rkey = if matches!(op, Op::Send | Op::SendImm) {
        0
    } else {
        0x1357_9bdf
    };
    let remote_offset = if matches!(op, Op::Send | Op::SendImm) {
        0
    } else {
        0x0000_0001_0000_0008
    };
    let r = Request {
        op,
        msn: 9,
        ssn,
        imm,
        rkey,
        msg_len,
        offset,
        remote_offset,
    };
    (r, payload)
}

/// An ACK with a distinct value in every field and SACK bits at both ends of the bitmap
/// (PSNs 1001, 1006, 1008 and 1256 past a cumulative 1000).
pub fn sample_ack() -> Ack {
    let mut sack = [0u8; SACK_BITS as usize / 8];
    sack[0] = 0b1010_0001;
    sack[31] = 0x80;
    Ack {
        cum_psn: 1000,
        echo_psn: 1003,
        echo_ts_ns: 123_456_789,
        hold_ns: 4321,
        ce_count: 7,
        sack,
    }
}

/// One valid packet of every kind and every request op, with its payload.
pub fn samples() -> Vec<(Header, Body, Vec<u8>)> {
    let mut v: Vec<(Header, Body, Vec<u8>)> = ALL_OPS
        .iter()
        .map(|&op| {
            let (r, p) = request(op);
            (header(Kind::Request), Body::Request(r), p)
        })
        .collect();
    v.push((
        header(Kind::ReadResponse),
        Body::ReadResponse(ReadResponse {
            msn: 3,
            offset: 2816,
            msg_len: 4000,
        }),
        vec![0x5a; 1184],
    ));
    v.push((
        header(Kind::AtomicResponse),
        Body::AtomicResponse(AtomicResponse {
            msn: 4,
            original: u64::MAX - 1,
        }),
        vec![],
    ));
    let ack = Header {
        psn: 0,
        ..header(Kind::Ack)
    };
    v.push((ack, Body::Ack(sample_ack()), vec![]));
    for syndrome in [
        Syndrome::ReceiverNotReady,
        Syndrome::RemoteAccess,
        Syndrome::InvalidRequest,
        Syndrome::RemoteOperation,
    ] {
        let h = Header {
            psn: 0,
            ..header(Kind::Nak)
        };
        v.push((
            h,
            Body::Nak(Nak {
                psn: 55,
                msn: 6,
                syndrome,
            }),
            vec![],
        ));
    }
    v
}
