//! A SEND refused at two of its packets for two reasons completes with the status of its
//! earliest refused packet, whichever NAK arrives first. Two endpoints, the test playing the
//! network: B has no receive posted when the SEND's first packet comes (an RNR NAK, and A
//! allows no RNR retry), then a receive too short for the message is posted and the later
//! packets are refused as invalid. A hears the invalid-request NAK before the RNR NAK, and
//! still reports what happened to the first packet: B never had it, so B never got to the
//! refusal it would report as a length error.
use std::net::SocketAddr;

use braid_proto::wire::{Body, Packet, Syndrome};
use braid_proto::{
    Access, Endpoint, EndpointConfig, RecvWr, Region, SendOp, SendWr, Sge, Timestamp, WcStatus,
};

fn nak_of(d: &[u8]) -> Option<(u32, Syndrome)> {
    match Packet::parse(d).expect("a datagram the engine made").body {
        Body::Nak(n) => Some((n.psn, n.syndrome)),
        _ => None,
    }
}

#[test]
fn the_earliest_refused_packet_decides_the_status() {
    let at = |s: &str| s.parse::<SocketAddr>().expect("address");
    let (ea, eb) = (at("10.0.0.1:4791"), at("10.0.0.2:4791"));
    let cfg = |seed| EndpointConfig {
        seed,
        max_datagram: 1500,
        rnr_retry_limit: 0,
        ..EndpointConfig::default()
    };
    let mut a = Endpoint::new(cfg(1), ea);
    let mut b = Endpoint::new(cfg(2), eb);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(), b.create_cq());
    let ia = a.create_qp(pa, ca, ca).expect("qp");
    let ib = b.create_qp(pb, cb, cb).expect("qp");
    a.connect(ia.qpn, ib).expect("connect");
    b.connect(ib.qpn, ia).expect("connect");
    let src = Region::new(4000);
    let dst = Region::new(4000);
    let ks = a.register(pa, src, Access::NONE).expect("src");
    let kd = b.register(pb, dst, Access::LOCAL_WRITE).expect("dst");
    a.post_send(
        ia.qpn,
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sges: vec![Sge {
                lkey: ks.lkey,
                offset: 0,
                len: 4000,
            }],
            signaled: true,
        },
    )
    .expect("post");
    let now = Timestamp::from_micros(1);
    let mut buf = vec![0u8; 1500];
    let mut sent = Vec::new();
    while let Some(t) = a.poll_transmit(now, &mut buf) {
        sent.push(buf[..t.len].to_vec());
    }
    assert_eq!(sent.len(), 3, "a SEND of three packets");
    // The first packet finds no receive.
    b.handle_datagram(now, ea, 0, &sent[0]);
    b.post_recv(
        ib.qpn,
        RecvWr {
            wr_id: 9,
            sges: vec![Sge {
                lkey: kd.lkey,
                offset: 0,
                len: 100,
            }],
        },
    )
    .expect("recv");
    // The later ones find a receive too short for the message.
    b.handle_datagram(now, ea, 0, &sent[1]);
    b.handle_datagram(now, ea, 0, &sent[2]);
    let mut naks = Vec::new();
    while let Some(t) = b.poll_transmit(now, &mut buf) {
        if let Some(n) = nak_of(&buf[..t.len]) {
            naks.push((n, buf[..t.len].to_vec()));
        }
    }
    let rnr = naks
        .iter()
        .position(|((_, s), _)| *s == Syndrome::ReceiverNotReady)
        .expect("an RNR NAK");
    let invalid = naks
        .iter()
        .position(|((_, s), _)| *s == Syndrome::InvalidRequest)
        .expect("an invalid-request NAK");
    assert!(
        naks[rnr].0.0 < naks[invalid].0.0,
        "the RNR NAK is for the earlier packet: {:?}",
        naks.iter().map(|(n, _)| *n).collect::<Vec<_>>()
    );
    // The invalid-request NAK reaches A first.
    a.handle_datagram(now, eb, 0, &naks[invalid].1);
    a.handle_datagram(now, eb, 0, &naks[rnr].1);
    let (_, wc) = a.poll_completion().expect("the SEND failed");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RnrRetryExceeded));
}
