//! Sealed packets through the engine's sealer: round trips of every kind, the documented key
//! schedule and nonce recomputed independently with ring and x25519-dalek, and refusal of
//! truncated or flipped sealed datagrams. The codec itself (golden bytes, views, rejection of
//! bad input) is tested next to it, in `braid_proto::wire`'s unit tests, over the same sample
//! packets (`braid_proto::wire::samples`).
use braid_proto::wire::samples::{header, request, samples};
use braid_proto::wire::{self, Body, Error, HEADER_LEN, Header, Kind, Nak, Op, Packet, Syndrome};

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
