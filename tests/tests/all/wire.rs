//! The wire format: round trips, golden bytes written by hand from the header diagrams in
//! `braid_proto::wire`, and rejection of truncated, corrupted, inconsistent and random input.
use braid_proto::wire::{
    self, Ack, AtomicResponse, Body, Error, FLAG_RETRANSMIT, HEADER_LEN, Header, Kind, Nak, Op,
    Packet, ReadResponse, Request, SACK_BITS, Syndrome, TRAILER_LEN,
};
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

/// Two sealers of one connection, from fixed private keys: A (QPN 0xabcdef, PSN 100) and B
/// (QPN 0x123456, PSN 200).
fn sealers() -> (braid_proto::seal::Sealer, braid_proto::seal::Sealer) {
    use braid_proto::seal::{Party, Sealer, public_key};
    let (sa, sb) = ([0x11u8; 32], [0x22u8; 32]);
    let a = Party {
        public: public_key(&sa),
        qpn: 0x00ab_cdef,
        psn: 100,
    };
    let b = Party {
        public: public_key(&sb),
        qpn: 0x0012_3456,
        psn: 200,
    };
    (
        Sealer::new(&sa, a, b).expect("good keys"),
        Sealer::new(&sb, b, a).expect("good keys"),
    )
}

fn seal(s: &braid_proto::seal::Sealer, h: &Header, body: &Body, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; wire::sealed_packet_len(body, payload.len())];
    let n = s
        .emit(&mut buf, h, body, payload.len(), |p| {
            p.copy_from_slice(payload)
        })
        .expect("buffer sized by sealed_packet_len");
    assert_eq!(
        n,
        buf.len(),
        "emit wrote the length sealed_packet_len announced"
    );
    buf
}

#[test]
fn every_packet_kind_and_op_round_trips_sealed() {
    let (tx, mut rx) = sealers();
    let mut scratch = Vec::new();
    for (i, (h, body, payload)) in samples().into_iter().enumerate() {
        let bytes = seal(&tx, &h, &body, &payload);
        assert_eq!(Packet::parse(&bytes), Err(Error::Sealed));
        let peek = wire::peek_sealed(&bytes).expect("sealed");
        assert_eq!(
            (peek.dst_qpn, peek.src_qpn, peek.seq),
            (h.dst_qpn, h.src_qpn, i as u64)
        );
        let p = rx
            .open(&bytes, &mut scratch)
            .unwrap_or_else(|e| panic!("{body:?}: {e}"));
        let want = Header {
            flags: h.flags | wire::FLAG_SEALED,
            ..h
        };
        assert_eq!((p.header, p.body, p.payload), (want, body, &payload[..]));
        assert!(p.to_string().contains("sealed"));
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

/// The key schedule and nonce of `braid_proto::seal`'s documentation, recomputed here with
/// ring and x25519-dalek directly, opens what the engine's sealer wrote: the documentation
/// and the code agree.
#[test]
fn sealed_packets_follow_the_documented_key_schedule_and_nonce() {
    use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    use ring::hkdf::{HKDF_SHA256, Salt};
    use x25519_dalek::{PublicKey, StaticSecret};
    let (sa, sb) = ([0x11u8; 32], [0x22u8; 32]);
    let (pa, pb) = (
        PublicKey::from(&StaticSecret::from(sa)).to_bytes(),
        PublicKey::from(&StaticSecret::from(sb)).to_bytes(),
    );
    let (qpn_a, psn_a, qpn_b, psn_b) = (0x00ab_cdefu32, 100u32, 0x0012_3456u32, 200u32);
    // Order the parties by (public key, QPN).
    let a_first = (pa, qpn_a) <= (pb, qpn_b);
    let shared = StaticSecret::from(sa).diffie_hellman(&PublicKey::from(pb));
    let label: &[u8] = b"braid seal v1";
    let prk = Salt::new(HKDF_SHA256, label).extract(shared.as_bytes());
    let (lo, hi) = if a_first {
        ((pa, qpn_a, psn_a), (pb, qpn_b, psn_b))
    } else {
        ((pb, qpn_b, psn_b), (pa, qpn_a, psn_a))
    };
    let (q1, p1, q2, p2) = (
        lo.1.to_be_bytes(),
        lo.2.to_be_bytes(),
        hi.1.to_be_bytes(),
        hi.2.to_be_bytes(),
    );
    // The sealer for party "A" of the test (`sealers().0`) sends in direction lower->higher
    // when it is the lower party.
    let dir_label: &[u8] = if a_first { b"A->B" } else { b"B->A" };
    let info: [&[u8]; 8] = [label, &lo.0, &q1, &p1, &hi.0, &q2, &p2, dir_label];
    let okm = prk.expand(&info, &AES_256_GCM).expect("32 bytes");
    let key = LessSafeKey::new(UnboundKey::from(okm));

    let (tx, _) = sealers();
    let h = header(Kind::Nak);
    let n = Body::Nak(Nak {
        psn: 1,
        msn: 2,
        syndrome: Syndrome::InvalidRequest,
    });
    let _first = seal(&tx, &h, &n, &[]); // sequence 0
    let mut bytes = seal(&tx, &h, &n, &[]); // sequence 1
    let mut nonce = [0u8; 12];
    nonce[0] = if a_first { 0 } else { 1 };
    nonce[4..].copy_from_slice(&1u64.to_be_bytes());
    let (aad, rest) = bytes.split_at_mut(HEADER_LEN + wire::SEAL_SEQ_LEN);
    let plain = key
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&*aad), rest)
        .expect("the documented key and nonce open the packet");
    assert_eq!(
        plain,
        &[
            0,
            0,
            0,
            1,
            0,
            0,
            0,
            2,
            Syndrome::InvalidRequest as u8,
            0,
            0,
            0
        ][..]
    );
}

#[test]
fn sealed_packets_truncated_or_flipped_anywhere_are_refused() {
    let (tx, mut rx) = sealers();
    let mut scratch = Vec::new();
    let (r, payload) = request(Op::Write);
    let bytes = seal(&tx, &header(Kind::Request), &Body::Request(r), &payload);
    for len in 0..bytes.len() {
        assert!(
            rx.open(&bytes[..len], &mut scratch).is_err(),
            "length {len}"
        );
    }
    for bit in 0..bytes.len() * 8 {
        let mut bad = bytes.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(rx.open(&bad, &mut scratch).is_err(), "bit {bit}");
    }
    // Untouched, it opens once, and only once.
    assert!(rx.open(&bytes, &mut scratch).is_ok());
    assert_eq!(
        rx.open(&bytes, &mut scratch).map(|_| ()),
        Err(braid_proto::seal::OpenError::Replayed)
    );
}
