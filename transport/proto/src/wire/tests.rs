//! The codec: round trips, golden bytes written by hand from the header diagrams in this
//! module, and rejection of truncated, corrupted, inconsistent and random input; the checked
//! view, the `Repr` level and the flags type.
use super::*;
use crate::wire;
use proptest::prelude::*;

const ALL_OPS: [Op; 7] = [
    Op::Send,
    Op::SendImm,
    Op::Write,
    Op::WriteImm,
    Op::Read,
    Op::FetchAdd,
    Op::CompareSwap,
];

fn header(kind: Kind) -> Header {
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
fn emit(h: &Header, body: &Body, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; wire::packet_len(body, payload.len())];
    let n = wire::emit(&mut buf, h, body, payload.len(), |p| {
        p.copy_from_slice(payload)
    })
    .expect("buffer sized by packet_len");
    assert_eq!(n, buf.len(), "emit wrote the length packet_len announced");
    buf
}

/// Appends the CRC32C trailer to literal header bytes.
fn with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes
}

/// A request for `op` whose length fields agree with the payload it returns.
fn request(op: Op) -> (Request, Vec<u8>) {
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

fn sample_ack() -> Ack {
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
fn samples() -> Vec<(Header, Body, Vec<u8>)> {
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

#[test]
fn every_packet_kind_and_op_round_trips() {
    for (h, body, payload) in samples() {
        let bytes = emit(&h, &body, &payload);
        let p = Packet::parse(&bytes).unwrap_or_else(|e| panic!("{body:?}: {e}"));
        assert_eq!(p.header, h, "{body:?}");
        assert_eq!(p.body, body);
        assert_eq!(p.payload, &payload[..], "{body:?}");
        // Display never panics and names the kind.
        assert!(!p.to_string().is_empty());
    }
}

#[test]
fn request_round_trips_with_extreme_field_values() {
    for op in ALL_OPS {
        let (mut r, payload) = request(op);
        r.msn = u32::MAX;
        r.ssn = u32::MAX;
        r.imm = u32::MAX;
        r.rkey = u32::MAX;
        r.remote_offset = u64::MAX;
        if op.carries_data() {
            r.msg_len = u32::MAX;
            r.offset = u32::MAX - payload.len() as u32;
        }
        let h = Header {
            dst_qpn: u32::MAX,
            src_qpn: 0,
            psn: u32::MAX,
            send_ts_ns: u64::MAX,
            ..header(Kind::Request)
        };
        let bytes = emit(&h, &Body::Request(r), &payload);
        let p = Packet::parse(&bytes).expect("valid");
        assert_eq!(
            (p.header, p.body, p.payload),
            (h, Body::Request(r), &payload[..])
        );
    }
}

/// The common header of `header(kind)` as the diagram lays it out.
fn common_bytes(kind: u8, psn: [u8; 4]) -> Vec<u8> {
    let mut v = vec![
        0x01, kind, 0x2a, 0x01, // version, kind, path, flags
        0x00, 0x12, 0x34, 0x56, // destination QP
        0x00, 0xab, 0xcd, 0xef, // source QP
    ];
    v.extend_from_slice(&psn);
    v.extend_from_slice(&[0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08]); // send timestamp
    v
}

const PSN: [u8; 4] = [0xfe, 0xdc, 0xba, 0x98];

#[test]
fn golden_request_write_imm() {
    let r = Request {
        op: Op::WriteImm,
        msn: 0x0102_0304,
        ssn: 0x0000_0005,
        imm: 0xcafe_f00d,
        rkey: 0x1357_9bdf,
        msg_len: 0x0000_1000,
        offset: 0x0000_0ffd,
        remote_offset: 0x1122_3344_5566_7788,
    };
    let mut expect = common_bytes(1, PSN);
    expect.extend_from_slice(&[
        0x03, 0x00, 0x00, 0x00, // op WRITE_IMM, reserved
        0x01, 0x02, 0x03, 0x04, // MSN
        0x00, 0x00, 0x00, 0x05, // SSN
        0xca, 0xfe, 0xf0, 0x0d, // immediate
        0x13, 0x57, 0x9b, 0xdf, // remote key
        0x00, 0x00, 0x10, 0x00, // message length
        0x00, 0x00, 0x0f, 0xfd, // offset of this payload
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // remote offset
        0xaa, 0xbb, 0xcc, // payload
    ]);
    let expect = with_crc(expect);
    assert_eq!(
        emit(
            &header(Kind::Request),
            &Body::Request(r),
            &[0xaa, 0xbb, 0xcc]
        ),
        expect
    );
    let p = Packet::parse(&expect).expect("golden bytes parse");
    assert_eq!(
        (p.body, p.payload),
        (Body::Request(r), &[0xaa, 0xbb, 0xcc][..])
    );
}

#[test]
fn golden_request_compare_swap() {
    let r = Request {
        op: Op::CompareSwap,
        msn: 7,
        ssn: 0,
        imm: 0,
        rkey: 0xa0b0_c0d0,
        msg_len: 8,
        offset: 0,
        remote_offset: 0x40,
    };
    let operands: Vec<u8> = (0x10..0x20).collect();
    let mut expect = common_bytes(1, PSN);
    expect.extend_from_slice(&[
        0x06, 0x00, 0x00, 0x00, // op COMPARE_SWAP
        0x00, 0x00, 0x00, 0x07, // MSN
        0x00, 0x00, 0x00, 0x00, // SSN
        0x00, 0x00, 0x00, 0x00, // immediate
        0xa0, 0xb0, 0xc0, 0xd0, // remote key
        0x00, 0x00, 0x00, 0x08, // message length
        0x00, 0x00, 0x00, 0x00, // offset
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, // remote offset
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, // swap (add-or-swap)
        0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, // compare
    ]);
    let expect = with_crc(expect);
    assert_eq!(
        emit(&header(Kind::Request), &Body::Request(r), &operands),
        expect
    );
    assert_eq!(
        Packet::parse(&expect).expect("golden").body,
        Body::Request(r)
    );
}

#[test]
fn golden_read_response() {
    let r = ReadResponse {
        msn: 0x0a0b_0c0d,
        offset: 0x0000_0584,
        msg_len: 0x0001_0000,
    };
    let mut expect = common_bytes(2, PSN);
    expect.extend_from_slice(&[
        0x0a, 0x0b, 0x0c, 0x0d, // MSN
        0x00, 0x00, 0x05, 0x84, // offset
        0x00, 0x01, 0x00, 0x00, // total length
        0x00, 0x00, 0x00, 0x00, // reserved
        0x42, 0x43, // payload
    ]);
    let expect = with_crc(expect);
    assert_eq!(
        emit(
            &header(Kind::ReadResponse),
            &Body::ReadResponse(r),
            &[0x42, 0x43]
        ),
        expect
    );
    assert_eq!(
        Packet::parse(&expect).expect("golden").body,
        Body::ReadResponse(r)
    );
}

#[test]
fn golden_atomic_response() {
    let r = AtomicResponse {
        msn: 0x0000_0102,
        original: 0x8877_6655_4433_2211,
    };
    let mut expect = common_bytes(3, PSN);
    expect.extend_from_slice(&[
        0x00, 0x00, 0x01, 0x02, // MSN
        0x00, 0x00, 0x00, 0x00, // reserved
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // original value
    ]);
    let expect = with_crc(expect);
    assert_eq!(
        emit(&header(Kind::AtomicResponse), &Body::AtomicResponse(r), &[]),
        expect
    );
    assert_eq!(
        Packet::parse(&expect).expect("golden").body,
        Body::AtomicResponse(r)
    );
}

#[test]
fn golden_ack() {
    let a = sample_ack();
    let h = Header {
        psn: 0,
        ..header(Kind::Ack)
    };
    let mut expect = common_bytes(4, [0, 0, 0, 0]);
    expect.extend_from_slice(&[
        0x00, 0x00, 0x03, 0xe8, // cumulative PSN 1000
        0x00, 0x00, 0x03, 0xeb, // echoed PSN 1003
        0x00, 0x00, 0x00, 0x00, 0x07, 0x5b, 0xcd, 0x15, // echoed timestamp 123456789
        0x00, 0x00, 0x10, 0xe1, // holding time 4321
        0x00, 0x00, 0x00, 0x07, // CE count
    ]);
    // SACK bitmap: byte 0 = 0b1010_0001, byte 31 = 0x80, the rest zero.
    let mut sack = [0u8; 32];
    sack[0] = 0xa1;
    sack[31] = 0x80;
    expect.extend_from_slice(&sack);
    let expect = with_crc(expect);
    assert_eq!(emit(&h, &Body::Ack(a), &[]), expect);
    let p = Packet::parse(&expect).expect("golden");
    assert_eq!(p.body, Body::Ack(a));
    // Bit i of the bitmap = PSN cum + 1 + i.
    let sacked: Vec<u32> = (1000..1300).filter(|&psn| a.sacked(psn)).collect();
    assert_eq!(sacked, vec![1001, 1006, 1008, 1256]);
}

#[test]
fn golden_nak() {
    let n = Nak {
        psn: 0x0000_0037,
        msn: 0x0000_0006,
        syndrome: Syndrome::RemoteAccess,
    };
    let h = Header {
        psn: 0,
        ..header(Kind::Nak)
    };
    let mut expect = common_bytes(5, [0, 0, 0, 0]);
    expect.extend_from_slice(&[
        0x00, 0x00, 0x00, 0x37, // refused PSN
        0x00, 0x00, 0x00, 0x06, // MSN
        0x02, 0x00, 0x00, 0x00, // syndrome REMOTE_ACCESS, reserved
    ]);
    let expect = with_crc(expect);
    assert_eq!(emit(&h, &Body::Nak(n), &[]), expect);
    assert_eq!(Packet::parse(&expect).expect("golden").body, Body::Nak(n));
}

#[test]
fn golden_op_and_syndrome_codes() {
    let codes: Vec<u8> = ALL_OPS
        .iter()
        .map(|&op| {
            let (r, p) = request(op);
            emit(&header(Kind::Request), &Body::Request(r), &p)[HEADER_LEN]
        })
        .collect();
    assert_eq!(codes, vec![0, 1, 2, 3, 4, 5, 6]);
    let syn: Vec<u8> = [
        Syndrome::ReceiverNotReady,
        Syndrome::RemoteAccess,
        Syndrome::InvalidRequest,
        Syndrome::RemoteOperation,
    ]
    .iter()
    .map(|&syndrome| {
        emit(
            &header(Kind::Nak),
            &Body::Nak(Nak {
                psn: 0,
                msn: 0,
                syndrome,
            }),
            &[],
        )[HEADER_LEN + 8]
    })
    .collect();
    assert_eq!(syn, vec![1, 2, 3, 4]);
}

#[test]
fn truncated_packets_at_every_length_are_rejected() {
    for (h, body, payload) in samples() {
        let bytes = emit(&h, &body, &payload);
        for len in 0..bytes.len() {
            assert!(
                Packet::parse(&bytes[..len]).is_err(),
                "{body:?} cut to {len} bytes parsed"
            );
        }
    }
}

#[test]
fn truncated_headers_with_a_valid_crc_are_truncated() {
    for (h, body, payload) in samples() {
        let bytes = emit(&h, &body, &payload);
        let headers = HEADER_LEN + body.len();
        for len in 0..headers {
            let cut = with_crc(bytes[..len].to_vec());
            assert_eq!(
                Packet::parse(&cut),
                Err(Error::Truncated),
                "{body:?} headers cut to {len} bytes"
            );
        }
    }
}

/// A flipped bit anywhere is a bad CRC, except the FLAG_SEALED bit, which makes the packet
/// claim to be sealed (the engine then finds no valid tag).
#[test]
fn a_flipped_bit_anywhere_is_a_bad_crc() {
    const SEALED_BIT: usize = 3 * 8 + 2;
    assert_eq!(1 << (SEALED_BIT % 8), wire::FLAG_SEALED);
    for (h, body, payload) in samples() {
        let bytes = emit(&h, &body, &payload);
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            let want = if bit == SEALED_BIT {
                Error::Sealed
            } else {
                Error::BadCrc
            };
            assert_eq!(Packet::parse(&b), Err(want), "{body:?} bit {bit}");
        }
    }
}

/// Packets emitted with a payload their length fields disagree with.
fn inconsistent() -> Vec<(&'static str, Body, usize)> {
    let (send, _) = request(Op::Send);
    let (read, _) = request(Op::Read);
    let (fadd, _) = request(Op::FetchAdd);
    let rresp = ReadResponse {
        msn: 1,
        offset: 100,
        msg_len: 150,
    };
    vec![
        (
            "send past its message length",
            Body::Request(Request {
                offset: 4990,
                ..send
            }),
            11,
        ),
        (
            "send with offset wrapping u32",
            Body::Request(Request {
                offset: u32::MAX,
                msg_len: u32::MAX,
                ..send
            }),
            1,
        ),
        ("read carrying payload", Body::Request(read), 1),
        (
            "fetch-add with msg_len 9",
            Body::Request(Request { msg_len: 9, ..fadd }),
            16,
        ),
        ("fetch-add with 15 operand bytes", Body::Request(fadd), 15),
        ("fetch-add with 17 operand bytes", Body::Request(fadd), 17),
        (
            "compare-swap with no operands",
            Body::Request(Request {
                op: Op::CompareSwap,
                ..fadd
            }),
            0,
        ),
        (
            "read response past its length",
            Body::ReadResponse(rresp),
            51,
        ),
        (
            "atomic response with payload",
            Body::AtomicResponse(AtomicResponse {
                msn: 1,
                original: 2,
            }),
            1,
        ),
        ("ack with payload", Body::Ack(sample_ack()), 4),
        (
            "nak with payload",
            Body::Nak(Nak {
                psn: 1,
                msn: 1,
                syndrome: Syndrome::RemoteAccess,
            }),
            8,
        ),
    ]
}

#[test]
fn inconsistent_length_fields_are_bad_length() {
    for (what, body, plen) in inconsistent() {
        let bytes = emit(&header(body.kind()), &body, &vec![7u8; plen]);
        assert_eq!(Packet::parse(&bytes), Err(Error::BadLength), "{what}");
    }
}

#[test]
fn length_fields_at_their_limit_are_accepted() {
    let (send, _) = request(Op::Send);
    let at_limit = Body::Request(Request {
        offset: 4990,
        ..send
    });
    assert!(Packet::parse(&emit(&header(Kind::Request), &at_limit, &[1; 10])).is_ok());
    let rresp = Body::ReadResponse(ReadResponse {
        msn: 1,
        offset: 100,
        msg_len: 150,
    });
    assert!(Packet::parse(&emit(&header(Kind::ReadResponse), &rresp, &[1; 50])).is_ok());
}

#[test]
fn unknown_version_kind_op_and_syndrome_are_rejected() {
    let (r, p) = request(Op::Write);
    let good = emit(&header(Kind::Request), &Body::Request(r), &p);
    let refit = |at: usize, v: u8| {
        let mut b = good[..good.len() - TRAILER_LEN].to_vec();
        b[at] = v;
        with_crc(b)
    };
    assert_eq!(Packet::parse(&refit(0, 0)), Err(Error::BadVersion));
    assert_eq!(Packet::parse(&refit(0, 2)), Err(Error::BadVersion));
    assert_eq!(Packet::parse(&refit(1, 0)), Err(Error::BadKind));
    assert_eq!(Packet::parse(&refit(1, 6)), Err(Error::BadKind));
    assert_eq!(Packet::parse(&refit(HEADER_LEN, 7)), Err(Error::BadOp));
    assert_eq!(Packet::parse(&refit(HEADER_LEN, 0xff)), Err(Error::BadOp));
    let nak = emit(
        &header(Kind::Nak),
        &Body::Nak(Nak {
            psn: 1,
            msn: 1,
            syndrome: Syndrome::RemoteAccess,
        }),
        &[],
    );
    for bad in [0u8, 5, 0xff] {
        let mut b = nak[..nak.len() - TRAILER_LEN].to_vec();
        b[HEADER_LEN + 8] = bad;
        assert_eq!(
            Packet::parse(&with_crc(b)),
            Err(Error::BadSyndrome),
            "syndrome {bad}"
        );
    }
}

#[test]
fn emit_into_a_short_buffer_is_buffer_too_small() {
    let (r, p) = request(Op::Send);
    let body = Body::Request(r);
    let mut buf = vec![0u8; wire::packet_len(&body, p.len()) - 1];
    let res = wire::emit(&mut buf, &header(Kind::Request), &body, p.len(), |_| {
        panic!("must not fill")
    });
    assert_eq!(res, Err(Error::BufferTooSmall));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random bytes never panic the parser, and are almost always rejected by the CRC.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = Packet::parse(&bytes) {
            let _ = p.to_string();
        }
    }

    /// Random bytes behind a valid CRC (so they reach the field checks) never panic, and
    /// whatever parses re-emits to a packet that parses the same.
    #[test]
    fn random_bytes_with_a_valid_crc_never_panic(
        kind in 0u8..7,
        op in 0u8..8,
        mut bytes in proptest::collection::vec(any::<u8>(), 0..160),
    ) {
        if bytes.len() > 1 { bytes[0] = 1; bytes[1] = kind; }
        if bytes.len() > HEADER_LEN { bytes[HEADER_LEN] = op; }
        let bytes = with_crc(bytes);
        if let Ok(p) = Packet::parse(&bytes) {
            let _ = p.to_string();
            let again = emit(&p.header, &p.body, p.payload);
            let q = Packet::parse(&again).expect("a re-emitted packet parses");
            prop_assert_eq!(q, p);
        }
    }

    /// Any request whose fields agree round-trips.
    #[test]
    fn any_consistent_request_round_trips(
        op in 0usize..7, msn: u32, ssn: u32, imm: u32, rkey: u32, remote_offset: u64,
        msg_len in 0u32..100_000, offset_frac in 0.0f64..1.0, plen in 0usize..1500,
        psn: u32, ts: u64, path: u8,
    ) {
        let op = ALL_OPS[op];
        let (msg_len, offset, plen) = match op {
            Op::Read => (msg_len, 0, 0),
            Op::FetchAdd | Op::CompareSwap => (8, 0, 16),
            _ => {
                let offset = (f64::from(msg_len) * offset_frac) as u32;
                (msg_len, offset, plen.min((msg_len - offset) as usize))
            }
        };
        let r = Request { op, msn, ssn, imm, rkey, msg_len, offset, remote_offset };
        let h = Header { psn, send_ts_ns: ts, path, ..header(Kind::Request) };
        let payload: Vec<u8> = (0..plen).map(|i| i as u8).collect();
        let bytes = emit(&h, &Body::Request(r), &payload);
        let p = Packet::parse(&bytes).expect("consistent request parses");
        prop_assert_eq!((p.header, p.body, p.payload), (h, Body::Request(r), &payload[..]));
    }
}

/// The plaintext layout of a sealed NAK, byte for byte from the diagram: the header with
/// FLAG_SEALED, the sequence number, the NAK body, then room for the tag.
#[test]
fn golden_sealed_plaintext_layout() {
    let n = Nak {
        psn: 0x37,
        msn: 6,
        syndrome: Syndrome::RemoteAccess,
    };
    let h = Header {
        psn: 0,
        ..header(Kind::Nak)
    };
    let mut buf = [0u8; 128];
    let len = wire::emit_for_seal(
        &mut buf,
        &h,
        0x1122_3344_5566_7788,
        &Body::Nak(n),
        0,
        |_| {},
    )
    .expect("room");
    let mut expect = common_bytes(5, [0, 0, 0, 0]);
    expect[3] = 0x05; // FLAG_RETRANSMIT | FLAG_SEALED
    expect.extend_from_slice(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]); // sequence
    expect.extend_from_slice(&[
        0x00, 0x00, 0x00, 0x37, // refused PSN
        0x00, 0x00, 0x00, 0x06, // MSN
        0x02, 0x00, 0x00, 0x00, // syndrome REMOTE_ACCESS, reserved
    ]);
    assert_eq!(len, expect.len() + wire::SEAL_TAG_LEN);
    assert_eq!(&buf[..expect.len()], &expect[..]);
    assert_eq!(
        Packet::parse_opened(&expect)
            .expect("plaintext parses")
            .body,
        Body::Nak(n)
    );
    assert_eq!(wire::SEAL_OVERHEAD, 20);
    assert_eq!(
        wire::sealed_packet_len(&Body::Nak(n), 0),
        wire::packet_len(&Body::Nak(n), 0) + 20
    );
}

#[test]
fn kind_op_and_syndrome_codes_decode_only_their_values() {
    let kinds = [
        Kind::Request,
        Kind::ReadResponse,
        Kind::AtomicResponse,
        Kind::Ack,
        Kind::Nak,
    ];
    for k in kinds {
        assert_eq!(Kind::from_u8(k as u8), Ok(k));
    }
    for op in ALL_OPS {
        assert_eq!(Op::from_u8(op as u8), Ok(op));
    }
    for s in [
        Syndrome::ReceiverNotReady,
        Syndrome::RemoteAccess,
        Syndrome::InvalidRequest,
        Syndrome::RemoteOperation,
    ] {
        assert_eq!(Syndrome::from_u8(s as u8), Ok(s));
    }
    for v in 0..=255u8 {
        if !(1..=5).contains(&v) {
            assert_eq!(Kind::from_u8(v), Err(Error::BadKind), "kind {v}");
        }
        if v > 6 {
            assert_eq!(Op::from_u8(v), Err(Error::BadOp), "op {v}");
        }
        if !(1..=4).contains(&v) {
            assert_eq!(
                Syndrome::from_u8(v),
                Err(Error::BadSyndrome),
                "syndrome {v}"
            );
        }
    }
    // The per-kind header lengths are the ones the tables end at.
    assert_eq!(Kind::Request.header_len(), REQUEST_LEN);
    assert_eq!(Kind::Ack.header_len(), ACK_LEN);
    assert_eq!(Kind::Nak.header_len(), NAK_LEN);
}

#[test]
fn typed_flags_agree_with_the_flag_constants() {
    assert_eq!(Flags::RETRANSMIT.bits(), FLAG_RETRANSMIT);
    assert_eq!(Flags::DUPLICATE.bits(), FLAG_DUPLICATE);
    assert_eq!(Flags::SEALED.bits(), FLAG_SEALED);
    let f = Flags::RETRANSMIT | Flags::SEALED;
    assert!(f.contains(Flags::SEALED) && f.contains(Flags::RETRANSMIT));
    assert!(!f.contains(Flags::DUPLICATE));
    assert!(!f.contains(Flags::DUPLICATE | Flags::SEALED));
    assert_eq!(f.difference(Flags::SEALED), Flags::RETRANSMIT);
    assert_eq!(f.to_string(), "rtx sealed ");
    assert_eq!(Flags::EMPTY.to_string(), "");
    // Unknown bits survive a round trip through the type.
    assert_eq!(Flags::from_bits(0xf0 | FLAG_DUPLICATE).bits(), 0xf2);
    assert_eq!(header(Kind::Ack).flag_set(), Flags::RETRANSMIT);
}

/// The view reads back, through the field table, what the emitter wrote for every sample;
/// `Repr` parses to the same as `Packet::parse` and announces the emitted length.
#[test]
fn the_view_and_repr_read_what_emit_wrote() {
    for (h, body, payload) in samples() {
        let bytes = emit(&h, &body, &payload);
        let v = PacketView::new_checked(&bytes[..]).expect("long enough");
        assert_eq!(v.version(), VERSION);
        assert_eq!(v.kind(), Ok(body.kind()));
        assert_eq!(v.path(), h.path);
        assert_eq!(v.flags(), h.flag_set());
        assert_eq!(
            (v.dst_qpn(), v.src_qpn(), v.psn()),
            (h.dst_qpn, h.src_qpn, h.psn)
        );
        assert_eq!(v.send_ts_ns(), h.send_ts_ns);
        assert!(!v.is_sealed());
        assert_eq!(v.seal_seq(), None);
        assert_eq!((v.header_len(), v.trailer_len()), (HEADER_LEN, TRAILER_LEN));
        assert!(v.verify_checksum());
        assert_eq!(v.body_and_payload().len(), body.len() + payload.len());
        let (repr, rest) = Repr::parse(&v).expect("parses");
        assert_eq!(repr, Repr { header: h, body });
        assert_eq!(rest, &payload[..]);
        assert_eq!(repr.buffer_len(payload.len()), bytes.len());
        assert_eq!(v.to_string(), Packet::parse(&bytes).unwrap().to_string());
        let mut again = vec![0u8; repr.buffer_len(payload.len())];
        let n = repr
            .emit(&mut again, payload.len(), |p| p.copy_from_slice(&payload))
            .expect("room");
        assert_eq!(&again[..n], &bytes[..]);
    }
}

/// The setters write the fields the diagram places, and fill_checksum makes the result
/// parse.
#[test]
fn view_setters_write_the_diagrammed_bytes() {
    let (r, p) = request(Op::Write);
    let mut bytes = emit(&header(Kind::Request), &Body::Request(r), &p);
    let mut v = PacketView::new_checked(&mut bytes[..]).expect("long enough");
    v.set_path(7);
    v.set_flags(Flags::DUPLICATE);
    v.set_dst_qpn(0x0102_0304);
    v.set_src_qpn(0x0506_0708);
    v.set_psn(0x0a0b_0c0d);
    v.set_send_ts_ns(0x1122_3344_5566_7788);
    assert!(!v.verify_checksum());
    v.fill_checksum();
    assert_eq!(
        &bytes[..HEADER_LEN],
        &[
            1, 1, 7, 2, 1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d, 0x11, 0x22, 0x33, 0x44,
            0x55, 0x66, 0x77, 0x88
        ]
    );
    let q = Packet::parse(&bytes).expect("refilled checksum");
    assert_eq!((q.header.path, q.header.psn), (7, 0x0a0b_0c0d));
    // Setting the sealing sequence number needs the room for it.
    let mut short = [0u8; HEADER_LEN + TRAILER_LEN];
    let mut v = PacketView::new_unchecked(&mut short[..]);
    assert_eq!(v.set_seal_seq(1), Err(Error::BufferTooSmall));
}

#[test]
fn check_len_requires_header_and_trailer_and_more_when_sealed() {
    let mut b = vec![0u8; HEADER_LEN + TRAILER_LEN];
    assert!(PacketView::new_checked(&b[..]).is_ok());
    assert_eq!(
        PacketView::new_checked(&b[..b.len() - 1]),
        Err(Error::Truncated)
    );
    b[field::FLAGS] = FLAG_SEALED;
    assert_eq!(PacketView::new_checked(&b[..]), Err(Error::Truncated));
    b.resize(HEADER_LEN + SEAL_SEQ_LEN + SEAL_TAG_LEN, 0);
    b[field::SEAL_SEQ.start + 7] = 9;
    let v = PacketView::new_checked(&b[..]).expect("sealed minimum");
    assert_eq!(v.seal_seq(), Some(9));
    assert_eq!(v.checksum(), None);
    assert!(!v.verify_checksum());
    assert_eq!(Repr::parse(&v), Err(Error::Sealed));
    assert!(v.to_string().contains("sealed"), "{v}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The documented guarantee: after check_len, no accessor, setter or the printer of the
    /// view panics, whatever the bytes (including a flags byte that claims a sealed packet).
    #[test]
    fn no_view_accessor_panics_after_check_len(
        flags: u8,
        mut bytes in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        if bytes.len() > field::FLAGS { bytes[field::FLAGS] = flags; }
        let Ok(v) = PacketView::new_checked(&bytes[..]) else {
            let sealed = flags & FLAG_SEALED != 0;
            let need = if sealed && bytes.len() > field::FLAGS {
                HEADER_LEN + SEAL_SEQ_LEN + SEAL_TAG_LEN
            } else {
                HEADER_LEN + TRAILER_LEN
            };
            prop_assert!(bytes.len() < need);
            return Ok(());
        };
        let _ = (v.version(), v.kind(), v.path(), v.flags(), v.dst_qpn(), v.src_qpn());
        let _ = (v.psn(), v.send_ts_ns(), v.seal_seq(), v.checksum(), v.verify_checksum());
        let _ = (v.header_len(), v.trailer_len(), v.body_and_payload(), v.total_len());
        let _ = Repr::parse(&v);
        let _ = v.to_string();
        let mut copy = bytes.clone();
        let mut w = PacketView::new_checked(&mut copy[..]).expect("same length");
        w.set_flags(Flags::from_bits(!flags));
        let _ = w.set_seal_seq(u64::MAX);
        w.fill_checksum();
        w.set_psn(1);
        let _ = w.to_string();
        let _ = peek_sealed(&bytes);
    }
}
