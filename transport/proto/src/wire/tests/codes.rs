//! The code bytes and the typed flags.
use super::*;

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
