//! The `packet` target: raw bytes into the packet parser and printer, with structural
//! assertions, sealed and not.
use super::*;

/// Byte ranges of a packet the parser skips (reserved fields), for the round-trip comparison.
fn reserved(kind: Kind) -> Range<usize> {
    let h = wire::HEADER_LEN;
    match kind {
        Kind::Request => h + 1..h + 4,
        Kind::ReadResponse => h + 12..h + 16,
        Kind::AtomicResponse => h + 4..h + 8,
        Kind::Nak => h + 9..h + 12,
        Kind::Ack => h..h,
    }
}

/// Parses `d` and, if it parses, checks the packet's structure, its printing and that emitting
/// it again gives back the same bytes (reserved fields zeroed).
fn check_parse(d: &[u8]) {
    let p = match Packet::parse(d) {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            if d.len() < wire::HEADER_LEN + wire::TRAILER_LEN {
                assert_eq!(e, wire::Error::Truncated, "short datagram: {d:02x?}");
            }
            return;
        }
    };
    let start = wire::HEADER_LEN + p.body.len();
    assert_eq!(
        start + p.payload.len() + wire::TRAILER_LEN,
        d.len(),
        "header, body, payload and trailer make up the datagram: {p:?}"
    );
    assert!(
        core::ptr::eq(p.payload.as_ptr(), d[start..].as_ptr()),
        "the payload is borrowed from its place in the datagram"
    );
    assert_eq!(p.header.kind, p.body.kind());
    assert!(!p.body.is_empty());
    assert_eq!(wire::packet_len(&p.body, p.payload.len()), d.len());
    let plen = p.payload.len() as u64;
    match &p.body {
        Body::Request(r) => {
            match r.op {
                Op::Read => assert_eq!(plen, 0, "a READ request carries no payload"),
                Op::FetchAdd | Op::CompareSwap => {
                    assert_eq!((r.msg_len, plen), (8, wire::ATOMIC_OPERANDS_LEN as u64))
                }
                _ => assert!(u64::from(r.offset) + plen <= u64::from(r.msg_len)),
            }
            assert_eq!(
                r.op.carries_data(),
                matches!(r.op, Op::Send | Op::SendImm | Op::Write | Op::WriteImm)
            );
            assert!(!(r.op.is_atomic() && r.op.carries_data()));
        }
        Body::ReadResponse(r) => assert!(u64::from(r.offset) + plen <= u64::from(r.msg_len)),
        Body::AtomicResponse(_) | Body::Nak(_) => assert_eq!(plen, 0),
        Body::Ack(a) => {
            assert!(
                plen == 0 || plen == wire::ACK_EXT_LEN as u64,
                "an ACK carries nothing or its telemetry extension"
            );
            for i in 0..wire::SACK_BITS {
                let bit = a.sack[(i / 8) as usize] & (1 << (i % 8)) != 0;
                assert_eq!(a.sacked(a.cum_psn.wrapping_add(1 + i)), bit, "SACK bit {i}");
            }
            assert!(
                !a.sacked(a.cum_psn),
                "the cumulative PSN itself is never SACKed"
            );
            assert!(!a.sacked(a.cum_psn.wrapping_add(1 + wire::SACK_BITS)));
        }
    }
    let text = p.to_string();
    assert!(text.starts_with("qp "), "{text}");
    assert_eq!(
        text.contains("rtx "),
        p.header.flags & wire::FLAG_RETRANSMIT != 0,
        "{text}"
    );

    // Emit it again: same bytes, with reserved fields zeroed and a fresh trailer.
    let mut out = vec![0u8; d.len()];
    let n = wire::emit(&mut out, &p.header, &p.body, p.payload.len(), |b| {
        b.copy_from_slice(p.payload)
    })
    .expect("a parsed packet fits the buffer it came from");
    assert_eq!(n, d.len());
    let mut expect = d.to_vec();
    expect[reserved(p.header.kind)].fill(0);
    fix_crc(&mut expect);
    assert_eq!(
        out, expect,
        "emit(parse(x)) differs from x beyond reserved fields: {p}"
    );
    let again = Packet::parse(&out).expect("an emitted packet parses");
    assert_eq!(
        (again.header, again.body, again.payload),
        (p.header, p.body, p.payload)
    );
    let mut short = vec![0u8; d.len() - 1];
    assert_eq!(
        wire::emit(&mut short, &p.header, &p.body, p.payload.len(), |_| {}),
        Err(wire::Error::BufferTooSmall)
    );
}

/// The same bytes received in pieces (`wire::parse_pieces`: headers, payload elsewhere,
/// trailer), cut at every head length up to the body's: never a panic, and a cut is accepted
/// exactly when it falls where the headers end and the whole datagram parses, to the same
/// headers.
fn check_pieces(d: &[u8]) {
    let Some(body_end) = d.len().checked_sub(wire::TRAILER_LEN) else {
        return;
    };
    let whole = Packet::parse(d);
    let cuts = (0..=body_end).take(wire::HEADER_LEN + wire::MAX_BODY_LEN + 2);
    for k in cuts {
        let (head, rest) = d.split_at(k);
        let (payload, trailer) = rest.split_at(body_end - k);
        let crc = |c| crc32c::crc32c_append(c, payload);
        match (
            wire::parse_pieces(head, payload.len(), crc, trailer),
            &whole,
        ) {
            (Ok(repr), Ok(p)) => {
                assert_eq!(k, wire::HEADER_LEN + p.body.len(), "cut at {k}: {p}");
                assert_eq!(repr, p.repr());
            }
            (Ok(repr), Err(e)) => panic!("pieces cut at {k} parse to {repr:?}, the whole: {e}"),
            (Err(_), Ok(p)) => {
                assert_ne!(
                    k,
                    wire::HEADER_LEN + p.body.len(),
                    "cut at the headers' end: {p}"
                )
            }
            (Err(_), Err(_)) => {}
        }
    }
}

fn check_sealed(data: &[u8]) {
    assert_eq!(Packet::parse(data), Err(wire::Error::Sealed));
    if let Ok(peek) = wire::peek_sealed(data) {
        assert!(data.len() >= wire::HEADER_LEN + wire::SEAL_SEQ_LEN + wire::SEAL_TAG_LEN);
        assert_eq!(peek.dst_qpn.to_be_bytes(), data[4..8]);
    }
    if let Ok(p) = Packet::parse_opened(data) {
        assert_ne!(p.header.flags & wire::FLAG_SEALED, 0);
        let start = wire::HEADER_LEN + wire::SEAL_SEQ_LEN + p.body.len();
        assert_eq!(p.payload.len(), data.len() - start);
        assert!(!p.to_string().is_empty());
    }
    if !cfg!(fuzzing) {
        let (sa, sb) = ([3u8; 32], [4u8; 32]);
        let a = Party {
            public: public_key(&sa),
            qpn: 1,
            psn: 0,
        };
        let b = Party {
            public: public_key(&sb),
            qpn: 2,
            psn: 0,
        };
        let mut s = Sealer::new(&sa, a, b).expect("good keys");
        assert!(s.open(data, &mut Vec::new()).is_err());
    }
}

/// Raw bytes into the packet parser and printer. Checked on every input: parsing never panics
/// (whole, or cut into headers, payload and trailer as a receive straight into place gets it);
/// a short datagram is `Truncated`; on stable, a wrong trailer is `BadCrc` before any field is
/// looked at; and for every input that parses (as given, and with its trailer recomputed) the
/// header, body, payload and trailer make up the datagram exactly, the payload is borrowed
/// from its place, each kind's length rule holds, the SACK accessor agrees with the bitmap,
/// printing works, and emit(parse(x)) reproduces x apart from reserved fields.
///
/// A datagram that claims to be sealed is refused by the plain parser with `Sealed`; its
/// clear fields are peeked, its bytes go through the plaintext parser as if decrypted, and
/// (on stable) a sealer with a fixed key refuses it, since no input forges a tag.
pub fn packet(data: &[u8]) {
    if wire::is_sealed(data) && data.len() >= wire::HEADER_LEN + wire::TRAILER_LEN {
        check_sealed(data);
        return;
    }
    check_parse(data);
    check_pieces(data);
    let mut fixed = data.to_vec();
    fix_crc(&mut fixed);
    if fixed != data {
        if !cfg!(fuzzing) && data.len() >= wire::HEADER_LEN + wire::TRAILER_LEN {
            assert_eq!(Packet::parse(data), Err(wire::Error::BadCrc));
        }
        check_parse(&fixed);
        check_pieces(&fixed);
    }
}
