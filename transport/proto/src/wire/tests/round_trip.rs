//! Every kind and op round-trips, at sample, extreme and random field values.
use super::*;
use proptest::prelude::*;

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

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

/// Every sample, cut into headers, payload and trailer, parses by `parse_pieces` to what
/// `Packet::parse` gives whole; a flipped payload bit fails the CRC, a head that is not
/// exactly the headers fails its length, and so does a short trailer.
#[test]
fn pieces_parse_as_the_whole_datagram_does() {
    for (h, body, payload) in samples() {
        let bytes = emit(&h, &body, &payload);
        let whole = Packet::parse(&bytes).expect("a sample parses");
        let head_len = HEADER_LEN + body.len();
        let (head, rest) = bytes.split_at(head_len);
        let (data, trailer) = rest.split_at(rest.len() - TRAILER_LEN);
        let crc = |c| braid_crc::crc32c_append(c, data);
        let repr = wire::parse_pieces(head, data.len(), crc, trailer).expect("pieces parse");
        assert_eq!(repr, whole.repr(), "{whole}");
        if !data.is_empty() {
            let mut bad = data.to_vec();
            bad[data.len() / 2] ^= 0x10;
            let crc = |c| braid_crc::crc32c_append(c, &bad);
            assert_eq!(
                wire::parse_pieces(head, bad.len(), crc, trailer),
                Err(Error::BadCrc),
                "{whole}"
            );
        }
        let long: Vec<u8> = bytes[..head_len + 1].to_vec();
        let crc = |c| braid_crc::crc32c_append(c, &data[1..]);
        assert!(
            wire::parse_pieces(&long, data.len().saturating_sub(1), crc, trailer).is_err(),
            "{whole}"
        );
        let crc = |c| braid_crc::crc32c_append(c, data);
        assert_eq!(
            wire::parse_pieces(head, data.len(), crc, &trailer[..2]),
            Err(Error::BadLength)
        );
    }
}
