//! A READ or atomic answered at once needs no ACK of its request: the response acknowledges
//! it (as InfiniBand's do). Two endpoints, the test playing the network: the responder's
//! first datagram after the request is the response itself, not an ACK; the requester's
//! request leaves its flight with the response, so nothing is sent again however long the
//! test then waits. A request that arrives while earlier packets are still owed an ACK is
//! acknowledged as before.
use std::net::SocketAddr;

use braid_proto::wire::{Kind, Packet};
use braid_proto::{
    Access, CqId, Endpoint, EndpointConfig, Region, RemoteAddr, SendOp, SendWr, Sge, Timestamp,
    WcStatus,
};

mod common;

struct Pair {
    a: Endpoint,
    b: Endpoint,
    ea: SocketAddr,
    eb: SocketAddr,
    qpn: u32,
    cq: CqId,
    lkey: u32,
    rkey: u32,
    src: std::sync::Arc<Region>,
    now: Timestamp,
    /// Kinds of the datagrams B sent, in order.
    from_b: Vec<Kind>,
    /// Kinds of the datagrams A sent, in order.
    from_a: Vec<Kind>,
}

fn kind(d: &[u8]) -> Kind {
    Packet::parse(d)
        .expect("a datagram the engine made")
        .header
        .kind
}

impl Pair {
    fn new() -> Pair {
        let common::Connected {
            mut a,
            mut b,
            a_addr: ea,
            b_addr: eb,
            pa,
            pb,
            ca,
            qa,
            ..
        } = common::connected(EndpointConfig {
            max_datagram: 1500,
            ..EndpointConfig::default()
        });
        let (dst, src) = (Region::new(8192), Region::new(8192));
        let data: Vec<u8> = (0..8192).map(|i| (i * 7 + 1) as u8).collect();
        src.write(0, &data).expect("fill");
        let kd = a
            .register(pa, dst.clone(), Access::LOCAL_WRITE)
            .expect("dst");
        let ks = b
            .register(
                pb,
                src.clone(),
                Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            )
            .expect("src");
        Pair {
            a,
            b,
            ea,
            eb,
            qpn: qa,
            cq: ca,
            lkey: kd.lkey,
            rkey: ks.rkey,
            src,
            now: Timestamp::from_micros(1),
            from_b: Vec::new(),
            from_a: Vec::new(),
        }
    }

    fn post(&mut self, wr_id: u64, op: SendOp, len: u32) {
        let wr = SendWr {
            wr_id,
            op,
            sges: vec![Sge {
                lkey: self.lkey,
                offset: 0,
                len,
            }],
            signaled: true,
        };
        self.a.post_send(self.qpn, wr).expect("post");
    }

    /// Moves datagrams both ways, one at a time, for `micros` microseconds of test time,
    /// running timers; `drop_a` decides, by A's datagram count, which of A's are lost.
    /// Returns the completions A saw.
    fn run(&mut self, micros: u64, drop_a: impl Fn(usize) -> bool) -> Vec<(u64, WcStatus)> {
        let mut buf = vec![0u8; 1500];
        let mut done = Vec::new();
        let end = self.now.add_nanos(micros * 1000);
        while self.now < end {
            while let Some(t) = self.a.poll_transmit(self.now, &mut buf) {
                self.from_a.push(kind(&buf[..t.len]));
                if !drop_a(self.from_a.len()) {
                    self.b.handle_datagram(self.now, self.ea, 0, &buf[..t.len]);
                }
            }
            while let Some(t) = self.b.poll_transmit(self.now, &mut buf) {
                self.from_b.push(kind(&buf[..t.len]));
                self.a.handle_datagram(self.now, self.eb, 0, &buf[..t.len]);
            }
            while let Some((cq, c)) = self.a.poll_completion() {
                assert_eq!(cq, self.cq);
                done.push((c.wr_id, c.status));
            }
            self.now = self.now.add_nanos(1_000);
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
        }
        done
    }
}

#[test]
fn a_read_answered_at_once_is_acknowledged_by_its_response() {
    let mut p = Pair::new();
    let remote = RemoteAddr {
        rkey: p.rkey,
        offset: 0,
    };
    p.post(1, SendOp::Read(remote), 4000);
    // Long past any retransmit timeout.
    let done = p.run(500_000, |_| false);
    assert_eq!(done, vec![(1, WcStatus::Success)]);
    // Three responses of up to 1.4 KB, and no ACK from the responder at all: the requester
    // sent nothing after the request but ACKs of the responses.
    assert_eq!(p.from_b, vec![Kind::ReadResponse; 3], "{:?}", p.from_b);
    assert_eq!(p.from_a[0], Kind::Request);
    assert!(
        p.from_a[1..].iter().all(|&k| k == Kind::Ack),
        "{:?}",
        p.from_a
    );
    for s in [p.a.stats(), p.b.stats()] {
        assert_eq!((s.retransmits, s.rto_fired), (0, 0), "{s:?}");
    }
    assert_eq!(
        p.a.poll_timeout(),
        None,
        "nothing in flight, nothing awaited"
    );
    // The request's round trip to its response was measured all the same.
    let q = p.a.qp_stats(p.qpn).expect("qp");
    assert!(q.srtt_ns > 0, "{q:?}");
}

#[test]
fn an_atomic_answered_at_once_is_acknowledged_by_its_response() {
    let mut p = Pair::new();
    let remote = RemoteAddr {
        rkey: p.rkey,
        offset: 64,
    };
    let mut before = [0u8; 8];
    p.src.read(64, &mut before).expect("word");
    p.post(1, SendOp::FetchAdd(remote, 5), 8);
    let done = p.run(500_000, |_| false);
    assert_eq!(done, vec![(1, WcStatus::Success)]);
    let mut after = [0u8; 8];
    p.src.read(64, &mut after).expect("word");
    assert_eq!(
        u64::from_ne_bytes(after),
        u64::from_ne_bytes(before).wrapping_add(5)
    );
    assert_eq!(p.from_b, vec![Kind::AtomicResponse], "{:?}", p.from_b);
    for s in [p.a.stats(), p.b.stats()] {
        assert_eq!((s.retransmits, s.rto_fired), (0, 0), "{s:?}");
    }
}

/// The READ's request is the only packet of the requester's that B receives while the
/// WRITE before it is missing (its one packet lost): the READ came out of order, so B
/// acknowledges at once (its SACK tells A what is missing) and the response follows. The
/// WRITE is sent again, and both complete in posting order.
#[test]
fn a_read_out_of_order_is_acknowledged_at_once() {
    let mut p = Pair::new();
    let remote = RemoteAddr {
        rkey: p.rkey,
        offset: 0,
    };
    p.post(1, SendOp::Write(remote), 100);
    p.post(2, SendOp::Read(remote), 100);
    let done = p.run(500_000, |n| n == 1);
    assert_eq!(done, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.from_b[0], Kind::Ack, "{:?}", p.from_b);
    assert!(p.from_b.contains(&Kind::ReadResponse), "{:?}", p.from_b);
    assert_eq!(p.a.stats().retransmits, 1, "{:?}", p.a.stats());
}
