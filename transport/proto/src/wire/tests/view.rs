//! The checked view and the `Repr` level.
use super::*;
use proptest::prelude::*;

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
        // The filler that checksums what it copies writes the same datagram, hop field
        // masked as the trailer's CRC masks it.
        let mut fused = vec![0u8; repr.buffer_len(payload.len())];
        let n = repr
            .emit_with_crc(&mut fused, payload.len(), |p, crc| {
                p.copy_from_slice(&payload);
                braid_crc::crc32c_append(crc, p)
            })
            .expect("room");
        assert_eq!(&fused[..n], &bytes[..], "{}", body.kind());
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
