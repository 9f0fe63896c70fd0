//! Payloads left in their regions (`Endpoint::set_in_place_min`): two endpoints, the test
//! playing the datapath. A WRITE from a gather list goes out with each payload of at least
//! the minimum that lies in one entry left in the source region; the test puts each such
//! datagram together as a datapath's iovecs would (the buffer's bytes before the payload,
//! the payload where `Transmit::payload` says it is, the buffer's bytes after it), or, for
//! every third, has the engine copy the payload into the buffer (`copy_payload`, as the
//! runtime does for a datagram it carries over). The destination gets every byte, and no
//! datagram fails its CRC.
use std::net::SocketAddr;

use braid_proto::{
    Access, Endpoint, EndpointConfig, Region, RemoteAddr, SendOp, SendWr, Sge, Timestamp, Transmit,
    WcStatus,
};

mod common;

const LEN: usize = 400_000;
const MIN: usize = 4096;

/// The datagram `t` (written into `buf`) as the wire carries it, its payload read from `src`,
/// the source region it was left in.
fn on_the_wire(t: &Transmit, buf: &[u8], src: &Region) -> Vec<u8> {
    let mut d = buf[..t.len].to_vec();
    if let Some(p) = t.payload {
        let offset = p.addr - src.as_ptr() as usize;
        assert!(
            offset + p.len as usize <= src.len(),
            "inside the source region"
        );
        let (at, len) = (p.at as usize, p.len as usize);
        src.read(offset as u64, &mut d[at..at + len])
            .expect("source bytes");
    }
    d
}

fn run(in_place: Option<usize>) -> (u64, u64) {
    let common::Connected {
        mut a,
        mut b,
        a_addr: ea,
        b_addr: eb,
        pa,
        pb,
        qa,
        ..
    } = common::connected(EndpointConfig {
        max_datagram: 9000,
        ..EndpointConfig::default()
    });
    a.set_in_place_min(in_place);
    let (src, dst) = (Region::new(LEN + 100), Region::new(LEN + 10));
    let data: Vec<u8> = (0..LEN + 100).map(|i| (i * 13 + i / 7001) as u8).collect();
    src.write(0, &data).expect("fill");
    let ks = a.register(pa, src.clone(), Access::NONE).expect("src");
    let kd = b
        .register(pb, dst.clone(), Access::REMOTE_WRITE)
        .expect("dst");
    // Two entries, the second starting mid-datagram at an odd offset.
    let first = 150_001;
    let wr = SendWr {
        wr_id: 7,
        op: SendOp::Write(RemoteAddr {
            rkey: kd.rkey,
            offset: 3,
        }),
        sges: vec![
            Sge {
                lkey: ks.lkey,
                offset: 1,
                len: first,
            },
            Sge {
                lkey: ks.lkey,
                offset: 100 + u64::from(first),
                len: LEN as u32 - first - 100,
            },
        ],
        signaled: true,
    };
    a.post_send(qa, wr).expect("post");
    let mut now = Timestamp::from_micros(1);
    let mut buf = vec![0u8; 9000];
    let mut n = 0u64;
    for _ in 0..10_000 {
        while let Some(mut t) = a.poll_transmit(now, &mut buf) {
            n += 1;
            if let Some(p) = t.payload {
                assert!(p.len as usize >= MIN);
                if n.is_multiple_of(3) {
                    assert!(a.copy_payload(&mut t, &mut buf), "pinned until unpinned");
                    assert_eq!(t.payload, None);
                }
            }
            let d = on_the_wire(&t, &buf, &src);
            b.handle_datagram(now, ea, 0, &d);
        }
        a.unpin_payloads();
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            a.handle_datagram(now, eb, 0, &buf[..t.len]);
        }
        if let Some((_, wc)) = a.poll_completion() {
            assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
            let mut got = vec![0u8; LEN - 100];
            dst.read(3, &mut got).expect("destination");
            let mut want = data[1..1 + first as usize].to_vec();
            want.extend_from_slice(&data[100 + first as usize..LEN]);
            assert!(got == want, "the destination holds the gathered bytes");
            assert_eq!(b.stats().rx_bad_crc, 0);
            return (a.stats().tx_in_place, a.stats().tx_datagrams);
        }
        now = now.add_nanos(1_000);
        a.handle_timeout(now);
        b.handle_timeout(now);
    }
    panic!("the WRITE did not complete");
}

#[test]
fn a_write_leaves_from_its_region_byte_exact() {
    let (in_place, sent) = run(Some(MIN));
    // 45 datagrams of 8.9 KB: all but the one across the two entries, at least.
    assert!(in_place >= 40, "{in_place} of {sent}");
}

#[test]
fn without_the_setting_every_payload_is_gathered() {
    let (in_place, _) = run(None);
    assert_eq!(in_place, 0);
}

#[test]
fn a_payload_is_copied_only_while_its_region_is_pinned() {
    let at: SocketAddr = "10.0.0.1:4791".parse().expect("address");
    let a = Endpoint::new(EndpointConfig::default(), at);
    let mut buf = vec![0u8; 64];
    let mut t = Transmit {
        dest: at,
        path: 0,
        ecn: 0,
        len: 64,
        payload: Some(braid_proto::PayloadAt {
            at: 8,
            len: 16,
            addr: buf.as_ptr() as usize,
        }),
    };
    // Nothing is pinned: the address names no region the engine holds.
    assert!(!a.copy_payload(&mut t, &mut buf));
    assert!(t.payload.is_some());
}
