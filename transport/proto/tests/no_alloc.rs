//! The data path allocates nothing: once two endpoints have carried a few messages (their
//! queues and maps grown to size), moving the packets of further WRITEs, READs and SENDs
//! (every `poll_transmit`, `handle_datagram`, `handle_timeout` and `poll_completion`) makes no
//! heap allocation at all. Posting a work request may allocate (its gather list); that is
//! per message and outside the counted section.
//!
//! A counting global allocator, counting only on the thread that runs the test, checks it.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;

use braid_proto::{
    Access, Endpoint, EndpointConfig, RecvWr, Region, RemoteAddr, SendOp, SendWr, Sge, Timestamp,
    WcStatus,
};

/// Forwards to the system allocator, counting allocations made while this thread counts.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note_alloc() {
    // `try_with`: the allocator can be called while thread-locals are being torn down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so it
// upholds `GlobalAlloc`'s contract exactly as `System` does; the counting touches only
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: the caller's `layout` is passed on as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: `ptr` and `layout` come from this allocator (which is `System`'s), as the
        // caller guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread while `f` runs.
fn allocations_in<T>(f: impl FnOnce() -> T) -> (T, u64) {
    ALLOCS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (out, ALLOCS.with(|n| n.get()))
}

mod common;

const MSG: u32 = 256 * 1024;

struct Pair {
    a: Endpoint,
    b: Endpoint,
    a_addr: SocketAddr,
    b_addr: SocketAddr,
    qa: u32,
    qb: u32,
    a_lkey: u32,
    b_lkey: u32,
    b_rkey: u32,
    now: Timestamp,
    buf: Vec<u8>,
    _regions: (Arc<Region>, Arc<Region>),
}

impl Pair {
    fn new() -> Pair {
        let common::Connected {
            mut a,
            mut b,
            a_addr,
            b_addr,
            pa,
            pb,
            qa,
            qb,
            ..
        } = common::connected(EndpointConfig::default());
        let (ra, rb) = (Region::new(MSG as usize), Region::new(MSG as usize));
        let ka = a
            .register(pa, ra.clone(), Access::LOCAL_WRITE)
            .expect("register");
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let kb = b.register(pb, rb.clone(), all).expect("register");
        let max = a.config().max_datagram;
        Pair {
            a,
            b,
            a_addr,
            b_addr,
            qa,
            qb,
            a_lkey: ka.lkey,
            b_lkey: kb.lkey,
            b_rkey: kb.rkey,
            now: Timestamp::from_micros(1),
            buf: vec![0; max],
            _regions: (ra, rb),
        }
    }

    /// Posts on A (and a receive on B for a SEND); outside the counted section.
    fn post(&mut self, op: SendOp, id: u64) {
        if matches!(op, SendOp::Send) {
            let rwr = RecvWr {
                wr_id: id,
                sges: vec![Sge {
                    lkey: self.b_lkey,
                    offset: 0,
                    len: MSG,
                }],
            };
            self.b.post_recv(self.qb, rwr).expect("post_recv");
        }
        let wr = SendWr {
            wr_id: id,
            op,
            sges: vec![Sge {
                lkey: self.a_lkey,
                offset: 0,
                len: MSG,
            }],
            signaled: true,
        };
        self.a.post_send(self.qa, wr).expect("post_send");
    }

    /// Moves datagrams both ways (batches of 64, as the runtime does) until A completes
    /// `id`; returns the datagrams moved.
    fn drive(&mut self, id: u64) -> u64 {
        let mut moved_total = 0;
        for _ in 0..100_000 {
            let mut moved = 0;
            for (from_a, n) in [(true, 64), (false, 64)] {
                for _ in 0..n {
                    self.now = self.now.add_nanos(50);
                    let (src, dst, addr) = if from_a {
                        (&mut self.a, &mut self.b, self.a_addr)
                    } else {
                        (&mut self.b, &mut self.a, self.b_addr)
                    };
                    let Some(t) = src.poll_transmit(self.now, &mut self.buf) else {
                        break;
                    };
                    dst.handle_datagram(self.now, addr, 0, &self.buf[..t.len]);
                    moved += 1;
                }
            }
            moved_total += moved;
            while let Some((_, c)) = self.b.poll_completion() {
                assert_eq!(c.status, WcStatus::Success);
            }
            if let Some((_, c)) = self.a.poll_completion() {
                assert_eq!((c.wr_id, c.status), (id, WcStatus::Success));
                return moved_total;
            }
            if moved == 0 {
                let t = [self.a.poll_timeout(), self.b.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min()
                    .expect("a stalled message has a timer");
                self.now = self.now.max(t);
                self.a.handle_timeout(self.now);
                self.b.handle_timeout(self.now);
            }
        }
        panic!("work request {id} did not complete");
    }
}

#[test]
fn steady_state_packets_allocate_nothing() {
    let mut p = Pair::new();
    let ops = |rkey| {
        let remote = RemoteAddr { rkey, offset: 0 };
        [
            ("WRITE", SendOp::Write(remote)),
            ("READ", SendOp::Read(remote)),
            ("SEND", SendOp::Send),
        ]
    };
    // Warm-up: queues, maps and buffers grow to their working size.
    let mut id = 0;
    for _ in 0..3 {
        for (_, op) in ops(p.b_rkey) {
            id += 1;
            p.post(op, id);
            p.drive(id);
        }
    }
    for (name, op) in ops(p.b_rkey) {
        id += 1;
        p.post(op, id);
        let (moved, allocs) = allocations_in(|| p.drive(id));
        assert!(
            moved > 150,
            "{name}: {moved} datagrams moved (a real message)"
        );
        assert_eq!(
            allocs, 0,
            "{name}: {allocs} allocations for {moved} datagrams"
        );
    }
}

/// The counter itself works: the check above cannot pass by counting nothing.
#[test]
fn the_counter_sees_allocations() {
    let (v, allocs) = allocations_in(|| vec![1u8; 100]);
    assert_eq!(v.len(), 100);
    assert!(allocs >= 1);
}
