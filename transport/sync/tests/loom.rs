//! Model checks of every structure in braid-sync with loom: every interleaving of 2–3 threads
//! (up to a preemption bound where the full space is too large), with loom's checks for data
//! races on cells, deadlocks (a lost wake-up leaves a thread asleep forever) and leaks.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p braid-sync --test loom -- --nocapture`
//! (`scripts/test.sh` does). Each test prints how many schedules loom explored.
//!
//! The first two tests are deliberately broken variants and assert that loom *fails* them:
//! proof that the harness explores the interleavings that matter.
#![cfg(loom)]

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};

use braid_sync::ring::{self, Consumer, Producer};
use braid_sync::{Doorbell, Event, Mpsc, Pool};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Runs `body` under loom with an optional preemption bound, counts the schedules it explored
/// (a std counter: loom's would be reset with each schedule) and prints the count.
fn explore(name: &str, preemptions: Option<usize>, body: impl Fn() + Sync + Send + 'static) {
    static_counter_run(name, preemptions, body, true);
}

fn static_counter_run(
    name: &str,
    preemptions: Option<usize>,
    body: impl Fn() + Sync + Send + 'static,
    report: bool,
) -> usize {
    let schedules = std::sync::Arc::new(StdAtomicUsize::new(0));
    let counter = schedules.clone();
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = preemptions;
    let result = catch_unwind(AssertUnwindSafe(|| {
        builder.check(move || {
            counter.fetch_add(1, StdOrdering::Relaxed);
            body();
        })
    }));
    let n = schedules.load(StdOrdering::Relaxed);
    let bound = preemptions.map_or("none".to_string(), |b| b.to_string());
    if report {
        eprintln!("loom schedules explored: {name}: {n} (preemption bound {bound})");
    }
    if let Err(panic) = result {
        if report {
            std::panic::resume_unwind(panic);
        }
        // Tell the broken-variant tests that loom failed the model.
        return usize::MAX;
    }
    n
}

/// Runs a model that must fail; returns after checking that loom did fail it.
///
/// `no_drop_on_unwind`: once loom reports a failure it unwinds out of the model with its
/// execution torn down, and a loom object dropped during that unwinding (an `Arc`, a cell, an
/// atomic) panics again inside a destructor, which aborts the whole test binary. The broken
/// models therefore hold their loom objects in `ManuallyDrop` and drop them explicitly only on
/// the normal path; on the failing path they leak, which is harmless in a test.
fn explore_expecting_failure(name: &str, body: impl Fn() + Sync + Send + 'static) {
    let n = static_counter_run(name, None, body, false);
    assert_eq!(
        n,
        usize::MAX,
        "{name}: loom explored {n} schedules without finding the planted bug"
    );
    eprintln!("loom schedules explored: {name}: failed as it must (planted bug found)");
}

/// Spins (yielding to loom's scheduler) until `f` returns a value.
fn spin<T>(mut f: impl FnMut() -> Option<T>) -> T {
    loop {
        if let Some(v) = f() {
            return v;
        }
        thread::yield_now();
    }
}

#[test]
fn broken_ring_with_relaxed_publish_is_caught() {
    // The publishing store of `tail` is Relaxed: the consumer can see the new tail without
    // the slot's write happening before its read. Loom must report the race on the slot.
    explore_expecting_failure("broken_ring_with_relaxed_publish_is_caught", || {
        let (tx, rx) = ring::channel::<usize>(2);
        // Not dropped while unwinding from loom's failure report (see `no_drop_on_unwind`).
        let (mut tx, mut rx) = (ManuallyDrop::new(tx), ManuallyDrop::new(rx));
        let t = thread::spawn(move || {
            tx.push_relaxed(7).unwrap();
            drop(ManuallyDrop::into_inner(tx));
        });
        if let Some(v) = rx.pop() {
            assert_eq!(v, 7);
        }
        t.join().unwrap();
        drop(ManuallyDrop::into_inner(rx));
    });
}

#[test]
fn broken_doorbell_checking_before_arming_is_caught() {
    // The consumer checks the ring *before* arming, then sleeps without re-checking: a push
    // and ring between its check and its arm find nobody armed, and the wake-up is lost.
    // Loom must report the consumer parked forever (a deadlock).
    explore_expecting_failure("broken_doorbell_checking_before_arming_is_caught", || {
        let (tx, rx) = ring::channel::<usize>(2);
        let bell = Arc::new(Doorbell::new());
        let consumer = thread::current();
        let b = bell.clone();
        // Not dropped while unwinding from loom's failure report (see `no_drop_on_unwind`).
        let (mut tx, mut rx, bell, b) = (
            ManuallyDrop::new(tx),
            ManuallyDrop::new(rx),
            ManuallyDrop::new(bell),
            ManuallyDrop::new(b),
        );
        let t = ManuallyDrop::new(thread::spawn(move || {
            tx.push(1).unwrap();
            if b.ring() {
                consumer.unpark();
            }
            drop(ManuallyDrop::into_inner(tx));
            drop(ManuallyDrop::into_inner(b));
        }));
        loop {
            if rx.pop().is_some() {
                break;
            }
            bell.arm(); // too late: the check above was not after an arm
            thread::park();
            bell.disarm();
        }
        ManuallyDrop::into_inner(t).join().unwrap();
        drop(ManuallyDrop::into_inner(rx));
        drop(ManuallyDrop::into_inner(bell));
    });
}

#[test]
fn ring_wraps_around_at_capacity_2() {
    explore("ring_wraps_around_at_capacity_2", Some(3), || {
        let (mut tx, mut rx) = ring::channel::<usize>(2);
        let t = thread::spawn(move || {
            for i in 0..3 {
                spin(|| tx.push(i).err().is_none().then_some(()));
            }
        });
        for i in 0..3 {
            assert_eq!(spin(|| rx.pop()), i);
        }
        t.join().unwrap();
    });
}

#[test]
fn ring_full_and_empty_edges() {
    // Capacity 2: the producer pushes up to 3 values and stops at the first refusal; whatever
    // it managed is popped, in order, exactly once. A refusal means the ring really was full:
    // at least 2 values were pushed that the consumer had not yet taken.
    explore("ring_full_and_empty_edges", None, || {
        let (mut tx, mut rx) = ring::channel::<usize>(2);
        let popped = Arc::new(AtomicUsize::new(0));
        let p = popped.clone();
        let t = thread::spawn(move || {
            let mut i = 0;
            while i < 3 {
                // Pops known to have happened before this push (the consumer stores `popped`
                // after releasing the slot, so the push's load of `head` sees them too).
                let taken = p.load(Ordering::Acquire);
                if let Err(v) = tx.push(i) {
                    assert_eq!(v, i, "a refused push hands its value back");
                    assert!(
                        i - taken >= 2,
                        "refused with room: pushed {i}, taken {taken}"
                    );
                    break;
                }
                i += 1;
            }
            assert!(i >= 2, "a ring of 2 refused its first or second value");
            (tx, i)
        });
        let mut next = 0;
        while let Some(v) = rx.pop() {
            assert_eq!(v, next);
            next += 1;
            popped.store(next, Ordering::Release);
        }
        let (tx, total) = t.join().unwrap();
        // Empty was seen; after the join everything is published: drain the rest.
        while let Some(v) = rx.pop() {
            assert_eq!(v, next);
            next += 1;
        }
        assert_eq!(next, total);
        assert!(rx.ring().is_empty());
        drop((tx, rx));
    });
}

#[test]
fn ring_batches_cross_in_order() {
    explore("ring_batches_cross_in_order", Some(3), || {
        let (mut tx, mut rx) = ring::channel::<usize>(4);
        let t = thread::spawn(move || {
            let mut src = 0..6;
            let mut sent = 0;
            while sent < 6 {
                let n = tx.push_iter(&mut src);
                if n == 0 {
                    thread::yield_now();
                }
                sent += n;
            }
        });
        let mut next = 0;
        while next < 6 {
            let n = rx.pop_batch(3, |v| {
                assert_eq!(v, next);
                next += 1;
            });
            if n == 0 {
                thread::yield_now();
            }
        }
        t.join().unwrap();
    });
}

#[test]
fn ring_drops_values_left_behind() {
    // Values still in the ring when both ends are dropped (on different threads) are dropped
    // once: loom reports a leaked or double-dropped `Arc`.
    explore("ring_drops_values_left_behind", None, || {
        let (mut tx, mut rx): (Producer<Arc<()>>, Consumer<Arc<()>>) = ring::channel(2);
        let v = Arc::new(());
        let v2 = v.clone();
        let t = thread::spawn(move || {
            tx.push(v2.clone()).unwrap();
            tx.push(v2).unwrap();
        });
        drop(rx.pop());
        t.join().unwrap();
        drop(rx);
        assert_eq!(Arc::strong_count(&v), 1);
    });
}

#[test]
fn event_wakes_its_waiter_for_two_producers() {
    explore("event_wakes_its_waiter_for_two_producers", Some(3), || {
        let work = Arc::new(AtomicUsize::new(0));
        let event = Arc::new(Event::new());
        let producers: Vec<_> = (0..2)
            .map(|_| {
                let (work, event) = (work.clone(), event.clone());
                thread::spawn(move || {
                    work.fetch_add(1, Ordering::Release);
                    event.notify();
                })
            })
            .collect();
        // A lost wake-up leaves this waiting forever: loom reports a deadlock.
        assert!(event.wait_until(|| work.load(Ordering::Acquire) == 2, None));
        for p in producers {
            p.join().unwrap();
        }
    });
}

#[test]
fn event_wakes_two_waiters() {
    // Two waiters, one producer of two items: each waiter takes one. The doorbell counts
    // armed waiters, so the second is not forgotten when the first disarms.
    explore("event_wakes_two_waiters", Some(3), || {
        let items = Arc::new(AtomicUsize::new(0));
        let event = Arc::new(Event::new());
        let take = |items: &AtomicUsize| {
            let mut n = items.load(Ordering::Acquire);
            while n > 0 {
                match items.compare_exchange(n, n - 1, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return true,
                    Err(now) => n = now,
                }
            }
            false
        };
        let waiter = {
            let (items, event) = (items.clone(), event.clone());
            thread::spawn(move || {
                let mut got = false;
                assert!(event.wait_until(
                    || {
                        got = got || take(&items);
                        got
                    },
                    None
                ));
            })
        };
        let (i, e) = (items.clone(), event.clone());
        let producer = thread::spawn(move || {
            for _ in 0..2 {
                i.fetch_add(1, Ordering::Release);
                e.notify();
            }
        });
        let mut got = false;
        assert!(event.wait_until(
            || {
                got = got || take(&items);
                got
            },
            None
        ));
        producer.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(items.load(Ordering::Acquire), 0);
    });
}

#[test]
fn pool_never_hands_out_a_value_twice() {
    // Each pooled value is a loom cell that its holder mutates: two holders at once, or a
    // holder whose writes are not ordered before the next holder's, is a data race for loom.
    explore("pool_never_hands_out_a_value_twice", None, || {
        let pool = Arc::new(Pool::new(2));
        pool.put(Box::new(UnsafeCell::new(0usize))).ok().unwrap();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                thread::spawn(move || {
                    if let Some(v) = pool.get() {
                        // SAFETY: the pool gave us this box alone (what the test checks).
                        v.with_mut(|p| unsafe { *p += 1 });
                        assert!(pool.put(v).is_ok(), "a 2-slot pool with one value was full");
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let v = pool.get().expect("the value came back");
        // SAFETY: both workers are joined; nobody else holds the value.
        let n = v.with(|p| unsafe { *p });
        assert!(n <= 2);
        assert!(pool.get().is_none(), "one value, handed out once");
    });
}

#[test]
fn pool_bounds_what_it_keeps() {
    // Two threads put one value each into a 1-slot pool: exactly one is kept, the other is
    // handed back (and dropped by its owner; loom would report a leak).
    explore("pool_bounds_what_it_keeps", None, || {
        let pool = Arc::new(Pool::<usize>::new(1));
        let kept = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..2)
            .map(|i| {
                let (pool, kept) = (pool.clone(), kept.clone());
                thread::spawn(move || {
                    if pool.put(Box::new(i)).is_ok() {
                        kept.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(kept.load(Ordering::Relaxed), 1);
        assert!(pool.get().is_some());
    });
}

/// The post → progress-thread hand-off as the runtime uses it: producers send and wake the
/// consumer when told to; the consumer drains, arms (which re-checks) and sleeps. Every item is
/// consumed exactly once, and a lost wake-up would leave the consumer parked forever.
fn hand_off(producers: usize, per_producer: usize) {
    let (mpsc, mut rx) = Mpsc::<usize>::new(2);
    let mpsc = Arc::new(mpsc);
    let consumer = thread::current();
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let (mpsc, consumer) = (mpsc.clone(), consumer.clone());
            thread::spawn(move || {
                for k in 0..per_producer {
                    let mut item = p * per_producer + k;
                    loop {
                        match mpsc.send(item) {
                            Ok(wake) => {
                                if wake {
                                    consumer.unpark();
                                }
                                break;
                            }
                            // Full: the runtime then takes the engine lock itself; here, wait.
                            Err(back) => {
                                item = back;
                                thread::yield_now();
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let total = producers * per_producer;
    let mut seen = vec![0u8; total];
    let mut got = 0;
    while got < total {
        got += rx.pop_batch(usize::MAX, |v| seen[v] += 1);
        if got < total && mpsc.arm() {
            thread::park();
            mpsc.disarm();
        }
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "each item exactly once: {seen:?}"
    );
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn hand_off_one_producer_to_a_sleeping_consumer() {
    explore(
        "hand_off_one_producer_to_a_sleeping_consumer",
        Some(3),
        || hand_off(1, 3),
    );
}

#[test]
fn hand_off_two_producers_to_a_sleeping_consumer() {
    explore(
        "hand_off_two_producers_to_a_sleeping_consumer",
        Some(3),
        || hand_off(2, 1),
    );
}

#[test]
fn completion_queue_wakes_a_waiter_beside_a_poller() {
    // The runtime's completion queue: the engine side pushes into the ring and notifies the
    // event; applications pop under a consumer lock. One thread waits (poll, then sleep on the
    // event until the ring looks non-empty), another polls without waiting. Each completion is
    // taken once, and the waiter is not left asleep while one is queued.
    explore(
        "completion_queue_wakes_a_waiter_beside_a_poller",
        Some(2),
        || {
            let (mut tx, rx) = ring::channel::<usize>(2);
            let ring = rx.ring().clone();
            let rx = Arc::new(loom::sync::Mutex::new(rx));
            let event = Arc::new(Event::new());
            let taken = Arc::new(AtomicUsize::new(0));
            let pop = |rx: &loom::sync::Mutex<Consumer<usize>>| rx.lock().unwrap().pop();
            let poller = {
                let (rx, taken) = (rx.clone(), taken.clone());
                thread::spawn(move || {
                    if pop(&rx).is_some() {
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            let e = event.clone();
            let engine = thread::spawn(move || {
                for c in 0..2 {
                    tx.push(c).unwrap();
                    e.notify();
                }
            });
            // The waiter wants one completion; the poller may take the other (or none).
            loop {
                if pop(&rx).is_some() {
                    taken.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                assert!(event.wait_until(|| !ring.is_empty(), None));
            }
            engine.join().unwrap();
            poller.join().unwrap();
            let left = std::iter::from_fn(|| pop(&rx)).count();
            assert_eq!(
                taken.load(Ordering::Relaxed) + left,
                2,
                "each completion once"
            );
        },
    );
}

#[test]
fn sharded_completion_queue_wakes_its_waiter_and_keeps_each_shards_order() {
    // The completion queue of a device with two engine shards: one ring per shard, each with
    // its own producer (the shard's engine-lock holder), one event for all. The waiter pops
    // from the rings in turn and sleeps on the event until any ring looks non-empty. It must
    // never be left asleep while a completion is queued in either ring, and it sees each
    // shard's completions in that shard's order (a QP lives on one shard).
    explore(
        "sharded_completion_queue_wakes_its_waiter_and_keeps_each_shards_order",
        Some(2),
        || {
            let event = Arc::new(Event::new());
            let mut rings = Vec::new();
            let mut shards = Vec::new();
            for shard in 0..2usize {
                let (mut tx, rx) = ring::channel::<usize>(2);
                rings.push((rx.ring().clone(), loom::sync::Mutex::new(rx)));
                let e = event.clone();
                // Shard 0 produces two (its order is checked), shard 1 one (it keeps the
                // model small enough to explore).
                let count = 2 - shard;
                shards.push(thread::spawn(move || {
                    for c in 0..count {
                        tx.push(shard * 10 + c).unwrap();
                        e.notify();
                    }
                }));
            }
            let mut seen: Vec<Vec<usize>> = vec![Vec::new(); 2];
            let mut start = 0;
            while seen.iter().map(Vec::len).sum::<usize>() < 3 {
                let mut got = false;
                for k in 0..2 {
                    let (_, rx) = &rings[(start + k) % 2];
                    if let Some(c) = rx.lock().unwrap().pop() {
                        seen[c / 10].push(c % 10);
                        got = true;
                    }
                }
                start += 1;
                if !got {
                    // A lost wake-up leaves this waiting forever: loom reports a deadlock.
                    assert!(event.wait_until(|| rings.iter().any(|(r, _)| !r.is_empty()), None));
                }
            }
            for s in shards {
                s.join().unwrap();
            }
            assert_eq!(
                seen,
                vec![vec![0, 1], vec![0]],
                "each shard's order, each once"
            );
        },
    );
}
