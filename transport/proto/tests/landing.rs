//! READ responses received straight into place (`Landing`): two endpoints, the datagrams
//! between them moved by the test, which plays the datapath. For each batch of datagrams
//! from the responder it asks the requester where the next ones land, "receives" each into
//! its landing as `recvmmsg` with three iovecs would (headers into a buffer, the payload
//! straight into the destination, the rest into a buffer), then, as the runtime does, first
//! puts back together every datagram that is not the one predicted and only then hands the
//! datagrams to the engine in order.
use std::net::SocketAddr;
use std::sync::Arc;

use braid_proto::{
    Access, Endpoint, EndpointConfig, LANDING_MIN_BYTES, Landing, Region, RemoteAddr, SendOp,
    SendWr, Sge, Timestamp, WcStatus,
};

mod common;

const MSG: usize = 1 << 20;

struct Pair {
    a: Endpoint,
    b: Endpoint,
    a_addr: SocketAddr,
    b_addr: SocketAddr,
    qa: u32,
    a_lkey: u32,
    b_rkey: u32,
    dst: Arc<Region>,
    src: Arc<Region>,
    now: Timestamp,
}

impl Pair {
    fn new(max_datagram: usize) -> Pair {
        let common::Connected {
            mut a,
            mut b,
            a_addr,
            b_addr,
            pa,
            pb,
            qa,
            ..
        } = common::connected(EndpointConfig {
            max_datagram,
            ..EndpointConfig::default()
        });
        let (dst, src) = (Region::new(MSG + 64), Region::new(MSG));
        let pattern: Vec<u8> = (0..MSG).map(|i| (i * 7 + i / 4093) as u8).collect();
        src.write(0, &pattern).expect("fill");
        let ka = a
            .register(pa, dst.clone(), Access::LOCAL_WRITE)
            .expect("register");
        let kb = b
            .register(pb, src.clone(), Access::REMOTE_READ)
            .expect("register");
        Pair {
            a,
            b,
            a_addr,
            b_addr,
            qa,
            a_lkey: ka.lkey,
            b_rkey: kb.rkey,
            dst,
            src,
            now: Timestamp::from_micros(1),
        }
    }

    /// Posts a READ of the whole source into the destination at `at` (an odd offset puts
    /// every payload off the word grid).
    fn read(&mut self, id: u64, at: u64) {
        let wr = SendWr {
            wr_id: id,
            op: SendOp::Read(RemoteAddr {
                rkey: self.b_rkey,
                offset: 0,
            }),
            sges: vec![Sge {
                lkey: self.a_lkey,
                offset: at,
                len: MSG as u32,
            }],
            signaled: true,
        };
        self.a.post_send(self.qa, wr).expect("post_send");
    }

    /// Moves datagrams until A completes `id`. B's datagrams go to A in batches of up to
    /// four, each batch reordered by `shuffle` and, if `corrupt` says so for a datagram's
    /// index, with one payload byte flipped as it lands.
    fn drive(
        &mut self,
        id: u64,
        shuffle: impl Fn(&mut Vec<Vec<u8>>),
        corrupt: impl Fn(usize) -> bool,
    ) {
        let mut buf = vec![0u8; 65_536];
        let mut sent = 0usize;
        for _ in 0..100_000 {
            let mut moved = 0;
            for _ in 0..64 {
                self.now = self.now.add_nanos(50);
                let Some(t) = self.a.poll_transmit(self.now, &mut buf) else {
                    break;
                };
                self.b
                    .handle_datagram(self.now, self.a_addr, 0, &buf[..t.len]);
                moved += 1;
            }
            // B's datagrams reach A's socket in groups of four, each reordered by `shuffle`.
            let mut queue = std::collections::VecDeque::new();
            loop {
                let mut group = Vec::new();
                while group.len() < 4 {
                    self.now = self.now.add_nanos(50);
                    let Some(t) = self.b.poll_transmit(self.now, &mut buf) else {
                        break;
                    };
                    group.push(buf[..t.len].to_vec());
                }
                if group.is_empty() {
                    break;
                }
                shuffle(&mut group);
                for d in group {
                    queue.push_back((d, corrupt(sent)));
                    sent += 1;
                }
            }
            moved += queue.len();
            while !queue.is_empty() {
                self.receive(&mut queue);
            }
            while self.b.poll_completion().is_some() {}
            if let Some((_, c)) = self.a.poll_completion() {
                assert_eq!((c.wr_id, c.status), (id, WcStatus::Success));
                return;
            }
            if moved == 0 {
                let t = [self.a.poll_timeout(), self.b.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min()
                    .expect("a stalled READ has a timer");
                self.now = self.now.max(t);
                self.a.handle_timeout(self.now);
                self.b.handle_timeout(self.now);
            }
        }
        panic!("READ {id} did not complete");
    }

    /// A's receive of one batch from the queued datagrams (each with whether to flip a bit
    /// of its payload), as the runtime does it: into as many landings as the engine names,
    /// else four the usual way.
    fn receive(&mut self, queue: &mut std::collections::VecDeque<(Vec<u8>, bool)>) {
        let mut landings = Vec::new();
        self.a.landings(&mut landings, 4);
        let take = if landings.is_empty() {
            4
        } else {
            landings.len()
        };
        let (batch, flips): (Vec<Vec<u8>>, Vec<bool>) =
            queue.drain(..take.min(queue.len())).unzip();
        // The "kernel": each datagram cut over its landing's three pieces.
        let mut pieces = Vec::new();
        for (i, d) in batch.iter().enumerate() {
            let Some(l) = landings.get(i) else {
                pieces.push(None);
                continue;
            };
            let h = l.head_len().min(d.len());
            let n = l.len().min(d.len() - h);
            let mut payload = d[h..h + n].to_vec();
            if flips[i] && n > 0 {
                payload[n / 2] ^= 0x40;
            }
            // SAFETY: a landing names `len()` bytes of live registered memory that no
            // packet placed, and this thread holds the endpoint (nothing else touches the
            // region meanwhile): what the kernel's receive does to it.
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), l.dst(), n) };
            pieces.push(Some((d[..h].to_vec(), n, d[h + n..].to_vec())));
        }
        // First every datagram not the one predicted is put back together, before any
        // handling places bytes over where another landed.
        let mut whole: Vec<Option<Vec<u8>>> = Vec::new();
        for (i, d) in batch.iter().enumerate() {
            whole.push(match (&pieces[i], landings.get(i)) {
                (Some((head, n, tail)), Some(l)) if !l.matches(head, *n, tail) => {
                    let mut mid = vec![0u8; *n];
                    assert!(l.read_landed(&mut mid));
                    Some([head.clone(), mid, tail.clone()].concat())
                }
                (Some(_), Some(_)) => None,
                _ => {
                    let mut d = d.clone();
                    if flips[i] && d.len() > 100 {
                        let k = d.len() / 2;
                        d[k] ^= 0x40;
                    }
                    Some(d)
                }
            });
        }
        for (i, w) in whole.into_iter().enumerate() {
            self.now = self.now.add_nanos(50);
            match w {
                Some(d) => self.a.handle_datagram(self.now, self.b_addr, 0, &d),
                None => {
                    let (head, _, tail) = pieces[i].as_ref().expect("received");
                    let l = &landings[i];
                    let src = (self.b_addr, 0);
                    assert!(self.a.handle_landed(self.now, 0, src, l, head, tail));
                }
            }
        }
    }

    fn check(&self, at: u64) {
        let got = self.dst.to_vec(at, MSG).expect("read back");
        let want = self.src.to_vec(0, MSG).expect("read back");
        assert!(got == want, "the READ's bytes differ from the source's");
    }
}

/// In order: every response after the first batch lands in place (the first response shows
/// the stream's datagram size), the last one shorter; the bytes are exact at any alignment.
#[test]
fn in_order_responses_land_in_place() {
    for at in [0u64, 3, 8] {
        let mut p = Pair::new(65_507);
        p.read(1, at);
        p.drive(1, |_| {}, |_| false);
        p.check(at);
        let s = p.a.stats();
        let responses = MSG.div_ceil(65_507 - 24 - 16 - 4) as u64;
        // The first batch is received before any response showed the stream's size.
        assert!(s.rx_landed >= responses - 4, "offset {at}: {s:?}");
        assert_eq!(
            s.rx_bad_crc + s.rx_bad_response + s.rx_duplicates,
            0,
            "{s:?}"
        );
        let mut none = Vec::new();
        p.a.landings(&mut none, 4);
        assert!(
            none.is_empty() && !p.a.wants_landing(),
            "nothing left to land"
        );
    }
}

/// Reordered in every batch: predictions miss, the datagrams are put back together and
/// placed where they belong; nothing lands over placed bytes; the bytes are exact. A second
/// READ after it lands again.
#[test]
fn reordered_responses_are_put_back_together() {
    let mut p = Pair::new(65_507);
    p.read(1, 5);
    p.drive(1, |b| b.reverse(), |_| false);
    p.check(5);
    let s = p.a.stats().clone();
    assert_eq!(s.rx_bad_crc + s.rx_bad_response, 0, "{s:?}");
    // The next READ: its first batch of four responses goes the usual way (the first shows
    // the stream's piece size; no acknowledgement of the request goes ahead of them, the
    // responses acknowledge it); every later response lands.
    p.read(2, 0);
    p.drive(2, |_| {}, |_| false);
    p.check(0);
    let responses = MSG.div_ceil(65_507 - 24 - 16 - 4) as u64;
    let landed = p.a.stats().rx_landed - s.rx_landed;
    assert_eq!(landed, responses - 4, "{:?}", p.a.stats());
}

/// A landed payload with a flipped bit fails its CRC, read where it landed: the packet is
/// dropped, retransmitted, and the READ completes with exact bytes.
#[test]
fn a_corrupt_landed_payload_is_dropped_and_sent_again() {
    let mut p = Pair::new(65_507);
    p.read(1, 0);
    p.drive(1, |_| {}, |i| i == 5 || i == 9);
    p.check(0);
    let s = p.a.stats();
    assert_eq!(s.rx_bad_crc, 2, "{s:?}");
    assert!(s.rx_landed > 0, "{s:?}");
}

/// Datagrams below `LANDING_MIN_BYTES` are not predicted: everything goes the copying way.
#[test]
fn small_datagrams_are_not_predicted() {
    const { assert!(LANDING_MIN_BYTES > 1472) };
    let mut p = Pair::new(1472);
    p.read(1, 0);
    p.drive(1, |_| {}, |_| false);
    p.check(0);
    assert_eq!(p.a.stats().rx_landed, 0);
    assert!(!p.a.wants_landing());
}

/// A landing handed back with pieces that are not what it predicted is refused untouched.
#[test]
fn handle_landed_refuses_pieces_it_did_not_predict() {
    let mut p = Pair::new(65_507);
    p.read(1, 0);
    // Run until a landing is named, then offer it nonsense.
    let mut buf = vec![0u8; 65_536];
    let mut l: Vec<Landing> = Vec::new();
    for _ in 0..1000 {
        p.now = p.now.add_nanos(50);
        if let Some(t) = p.a.poll_transmit(p.now, &mut buf) {
            p.b.handle_datagram(p.now, p.a_addr, 0, &buf[..t.len]);
        }
        if let Some(t) = p.b.poll_transmit(p.now, &mut buf) {
            p.a.handle_datagram(p.now, p.b_addr, 0, &buf[..t.len]);
        }
        p.a.landings(&mut l, 1);
        if !l.is_empty() {
            break;
        }
    }
    let l = &l[0];
    let before = p.a.stats().clone();
    let head = vec![0u8; l.head_len()];
    assert!(!p.a.handle_landed(p.now, 0, (p.b_addr, 0), l, &head, &[0; 4]));
    assert!(!p.a.handle_landed(p.now, 0, (p.b_addr, 0), l, &head[1..], &[0; 4]));
    assert_eq!(p.a.stats(), &before, "refused pieces count as nothing");
}
