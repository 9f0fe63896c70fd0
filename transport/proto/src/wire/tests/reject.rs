//! Rejection of truncated, corrupted, inconsistent and random input.
use super::*;
use proptest::prelude::*;

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
    // The hop telemetry of a REQUEST is mutable in flight: the CRC covers it as zeros.
    let hop =
        HEADER_LEN + field::request::HOP_QUEUE.start..HEADER_LEN + field::request::HOP_QUEUE.end;
    for (h, body, payload) in samples() {
        let bytes = emit(&h, &body, &payload);
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            if matches!(body, Body::Request(_)) && hop.contains(&(bit / 8)) {
                let p = Packet::parse(&b).expect("a switch may set the hop field");
                assert_eq!(p.body, body, "bit {bit}");
                continue;
            }
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
        (
            "ack with a payload not its extension",
            Body::Ack(sample_ack()),
            3,
        ),
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
}
