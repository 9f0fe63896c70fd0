//! A SEND refused at two of its packets for two reasons completes with the status of its
//! earliest refused packet, whichever NAK arrives first. Two endpoints, the test playing the
//! network: B has no receive posted when the SEND's first packet comes (an RNR NAK, and A
//! allows no RNR retry), then a receive too short for the message is posted and the later
//! packets are refused as invalid. A hears the invalid-request NAK before the RNR NAK, and
//! still reports what happened to the first packet: B never had it, so B never got to the
//! refusal it would report as a length error.
use braid_proto::wire::{Body, Packet, Syndrome};
use braid_proto::{
    Access, EndpointConfig, RecvWr, Region, SendOp, SendWr, Sge, Timestamp, WcStatus,
};

mod common;

fn nak_of(d: &[u8]) -> Option<(u32, Syndrome)> {
    match Packet::parse(d).expect("a datagram the engine made").body {
        Body::Nak(n) => Some((n.psn, n.syndrome)),
        _ => None,
    }
}

#[test]
fn the_earliest_refused_packet_decides_the_status() {
    let common::Connected {
        mut a,
        mut b,
        a_addr: ea,
        b_addr: eb,
        pa,
        pb,
        qa,
        qb,
        ..
    } = common::connected(EndpointConfig {
        max_datagram: 1500,
        rnr_retry_limit: 0,
        ..EndpointConfig::default()
    });
    let src = Region::new(4000);
    let dst = Region::new(4000);
    let ks = a.register(pa, src, Access::NONE).expect("src");
    let kd = b.register(pb, dst, Access::LOCAL_WRITE).expect("dst");
    a.post_send(
        qa,
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
        qb,
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
