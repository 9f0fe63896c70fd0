//! Golden bytes written by hand from the header diagrams, plain and sealed.
use super::*;

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
    // A switch stamps the hop field (bytes 2-3 of the REQUEST header) in flight: the CRC
    // covers it as zeros, so the packet still parses to the same request, and the largest
    // stamp stays.
    let mut stamped = expect.clone();
    wire::stamp_hop_queue(&mut stamped, 6400);
    assert_eq!(&stamped[24..28], &[0x03, 0x00, 0x00, 0x65]); // 6400 ns / 64 + 1
    wire::stamp_hop_queue(&mut stamped, 640);
    assert_eq!(wire::hop_queue(&stamped), 0x65);
    assert_eq!(
        wire::decode_hop_queue(wire::hop_queue(&stamped)),
        Some(6400)
    );
    let p = Packet::parse(&stamped).expect("stamped packet parses");
    assert_eq!(p.body, Body::Request(r));
    // Any other byte changed still fails the CRC.
    stamped[24 + 4] ^= 1;
    assert_eq!(Packet::parse(&stamped).err(), Some(Error::BadCrc));
    // Not a REQUEST (here the ACK kind): left alone.
    let mut other = expect.clone();
    other[1] = 4;
    wire::stamp_hop_queue(&mut other, 6400);
    assert_eq!(&other[24..28], &expect[24..28]);
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
    // With the telemetry extension: the same body, then hop telemetry 0x0102 and two
    // reserved bytes where a payload would be; any other payload length is refused.
    let mut ext = expect[..expect.len() - TRAILER_LEN].to_vec();
    ext.extend_from_slice(&[0x01, 0x02, 0x00, 0x00]);
    let ext = with_crc(ext);
    assert_eq!(emit(&h, &Body::Ack(a), &[0x01, 0x02, 0x00, 0x00]), ext);
    let p = Packet::parse(&ext).expect("golden with extension");
    assert_eq!(
        (p.body, p.payload),
        (Body::Ack(a), &[0x01, 0x02, 0x00, 0x00][..])
    );
    let mut bad = expect[..expect.len() - TRAILER_LEN].to_vec();
    bad.extend_from_slice(&[0x01, 0x02]);
    assert_eq!(Packet::parse(&with_crc(bad)).err(), Some(Error::BadLength));
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
