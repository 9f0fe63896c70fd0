//! A bounded single-producer single-consumer ring.
//!
//! [`channel`] returns the two ends. Each end is owned by one thread at a time (`&mut self`
//! on every operation), which is what makes it SPSC; an end may move between threads, or sit
//! behind a lock that several threads share.
//!
//! # Ordering argument
//!
//! Two free-running counters, `tail` (written only by the producer) and `head` (written only
//! by the consumer); slot `i & mask` belongs to the producer while `i >= tail - capacity`
//! and `i < head + capacity` says it is free, and to the consumer while `head <= i < tail`.
//!
//! - **Publication.** The producer writes a slot, then stores `tail` with `Release`. The
//!   consumer loads `tail` with `Acquire` before reading any slot below it, so the slot's
//!   write happens before its read.
//! - **Reclamation.** The consumer moves a value out of a slot, then stores `head` with
//!   `Release`. The producer loads `head` with `Acquire` before overwriting a slot below
//!   `head + capacity`, so the read happens before the overwrite.
//! - Each end keeps a private copy of its own counter and a cached copy of the other's; it
//!   reloads the other's only when the cache says full (producer) or empty (consumer), so a
//!   steady stream costs one shared load per wrap, not per item. A stale cache is always
//!   conservative (it under-states free or filled slots).
//! - Batch operations write or read several slots and publish them with one `Release` store.
//!
//! `tests/loom.rs` checks wrap-around at capacity 2, the full and empty edges, and batches; it
//! also checks that a publish store weakened to `Relaxed` (`Producer::push_relaxed`, compiled
//! only under loom) is caught as a data race.
use std::mem::MaybeUninit;

use crate::CachePadded;
use crate::sync::{Arc, AtomicUsize, Ordering, UnsafeCell};

/// The shared part of a ring. Reachable from both ends (see [`Producer::ring`]); by itself it
/// only answers how full the ring looks.
pub struct Ring<T> {
    /// Next slot the consumer reads; stored only by the consumer.
    head: CachePadded<AtomicUsize>,
    /// Next slot the producer writes; stored only by the producer.
    tail: CachePadded<AtomicUsize>,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
}

// SAFETY: a `Ring` hands each `T` from the producer's thread to the consumer's, so `T: Send`
// is required and sufficient; the slots are accessed under the head/tail protocol above,
// never by two threads at once.
unsafe impl<T: Send> Send for Ring<T> {}
// SAFETY: as above; shared `&Ring` access only loads the atomic counters.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

impl<T> Ring<T> {
    /// How many values it holds at most.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// How many values it holds: exact when both ends are quiescent, a hint otherwise (both
    /// ends may move during the call). Loads `tail` then `head`, both `Acquire`; if it returns
    /// 0, every value published before that `tail` load (in the happens-before sense) has been
    /// taken, which is what the doorbell's re-check relies on.
    pub fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        // At any one moment `tail - head <= capacity`. The consumer may pass the `tail` we
        // loaded before we load `head`; the difference then wraps to a huge value: it took
        // everything we saw published, so report empty.
        let len = tail.wrapping_sub(head);
        if len > self.capacity() { 0 } else { len }
    }

    /// Whether it looked empty (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn slot(&self, i: usize) -> &UnsafeCell<MaybeUninit<T>> {
        // In bounds: `mask == slots.len() - 1`.
        &self.slots[i & self.mask]
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // Both ends are gone (each held an `Arc`), and each published its private counter when
        // it was dropped, so the counters say exactly which slots hold values. Relaxed is
        // enough: the `Arc` drop that got us here synchronises with both ends' last uses.
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        let mut i = head;
        while i != tail {
            self.slot(i).with_mut(|p| {
                // SAFETY: slots in `head..tail` were written by the producer and not yet moved
                // out by the consumer; nobody else can reach them any more.
                unsafe { (*p).assume_init_drop() }
            });
            i = i.wrapping_add(1);
        }
    }
}

/// Makes a ring holding up to `capacity` values and returns its two ends.
///
/// # Panics
/// If `capacity` is not a power of two (it is a setup-time constant in every caller).
pub fn channel<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    assert!(
        capacity.is_power_of_two(),
        "ring capacity must be a power of two"
    );
    let ring = Arc::new(Ring {
        head: CachePadded(AtomicUsize::new(0)),
        tail: CachePadded(AtomicUsize::new(0)),
        slots: (0..capacity)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect(),
        mask: capacity - 1,
    });
    (
        Producer {
            ring: ring.clone(),
            tail: 0,
            head_cache: 0,
        },
        Consumer {
            ring,
            head: 0,
            tail_cache: 0,
        },
    )
}

/// The producing end of a [`channel`].
pub struct Producer<T> {
    ring: Arc<Ring<T>>,
    /// Our copy of `ring.tail` (we are its only writer).
    tail: usize,
    /// The last `ring.head` we loaded: slots below `head_cache + capacity` are free.
    head_cache: usize,
}

impl<T> std::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("ring", &self.ring)
            .finish()
    }
}

impl<T> Producer<T> {
    /// The shared ring (for emptiness hints from other threads).
    pub fn ring(&self) -> &Arc<Ring<T>> {
        &self.ring
    }

    /// Free slots, reloading the consumer's `head` if the cached one says fewer than `want`.
    fn free(&mut self, want: usize) -> usize {
        let cap = self.ring.capacity();
        let mut free = cap - self.tail.wrapping_sub(self.head_cache);
        if free < want {
            // Acquire: the consumer's reads of the slots it releases happen before our
            // overwrites of them.
            self.head_cache = self.ring.head.load(Ordering::Acquire);
            free = cap - self.tail.wrapping_sub(self.head_cache);
        }
        free
    }

    fn write(&mut self, v: T) {
        self.ring.slot(self.tail).with_mut(|p| {
            // SAFETY: `free()` said slot `tail` is free: the consumer moved its old value out
            // (or it never held one) and will not touch it until we publish `tail + 1`.
            unsafe { (*p).write(v) };
        });
        self.tail = self.tail.wrapping_add(1);
    }

    /// Appends `v`, or gives it back if the ring is full.
    pub fn push(&mut self, v: T) -> Result<(), T> {
        if self.free(1) == 0 {
            return Err(v);
        }
        self.write(v);
        // Release: publishes the slot just written (see the module's ordering argument).
        self.ring.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Appends values taken from `values` while there is room, and publishes them all with
    /// one store. Calls `values.next()` only when a slot is free for its result, so nothing
    /// is dropped on the floor. Returns how many were appended.
    pub fn push_iter(&mut self, values: &mut impl Iterator<Item = T>) -> usize {
        let free = self.free(usize::MAX);
        let mut n = 0;
        while n < free {
            let Some(v) = values.next() else { break };
            self.write(v);
            n += 1;
        }
        if n > 0 {
            // Release: publishes all `n` slots written above.
            self.ring.tail.store(self.tail, Ordering::Release);
        }
        n
    }

    /// A deliberately broken [`push`](Self::push) whose publishing store is `Relaxed`: the
    /// consumer may then see the new `tail` before the slot's contents. Exists only under loom,
    /// for the test that proves the loom harness finds such bugs.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn push_relaxed(&mut self, v: T) -> Result<(), T> {
        if self.free(1) == 0 {
            return Err(v);
        }
        self.write(v);
        self.ring.tail.store(self.tail, Ordering::Relaxed);
        Ok(())
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // Every write is published already unless a `push_iter` iterator panicked mid-batch:
        // publish what was written so `Ring::drop` drops it.
        self.ring.tail.store(self.tail, Ordering::Release);
    }
}

/// The consuming end of a [`channel`].
pub struct Consumer<T> {
    ring: Arc<Ring<T>>,
    /// Our copy of `ring.head` (we are its only writer).
    head: usize,
    /// The last `ring.tail` we loaded: slots below it hold published values.
    tail_cache: usize,
}

impl<T> std::fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("ring", &self.ring)
            .finish()
    }
}

impl<T> Consumer<T> {
    /// The shared ring (for emptiness hints from other threads).
    pub fn ring(&self) -> &Arc<Ring<T>> {
        &self.ring
    }

    /// Published values not yet taken, reloading the producer's `tail` if the cached one says
    /// fewer than `want`.
    fn filled(&mut self, want: usize) -> usize {
        let mut filled = self.tail_cache.wrapping_sub(self.head);
        if filled < want {
            // Acquire: the producer's writes of the slots it published happen before our
            // reads of them.
            self.tail_cache = self.ring.tail.load(Ordering::Acquire);
            filled = self.tail_cache.wrapping_sub(self.head);
        }
        filled
    }

    fn read(&mut self) -> T {
        let v = self.ring.slot(self.head).with_mut(|p| {
            // SAFETY: `filled` said slot `head` was published by the producer, which will not
            // touch it again until we release it by storing a `head` past it; reading moves the
            // value out, and `head` moves past the slot before anyone could read it again.
            unsafe { (*p).assume_init_read() }
        });
        self.head = self.head.wrapping_add(1);
        v
    }

    /// Takes the oldest value, if any.
    pub fn pop(&mut self) -> Option<T> {
        if self.filled(1) == 0 {
            return None;
        }
        let v = self.read();
        // Release: our read of the slot happens before the producer reuses it.
        self.ring.head.store(self.head, Ordering::Release);
        Some(v)
    }

    /// Takes up to `max` values, oldest first, handing each to `f`, and releases their slots
    /// with one store. Returns how many were taken.
    pub fn pop_batch(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let n = self.filled(max).min(max);
        for _ in 0..n {
            // `read` moves `head` before `f` runs, so a panicking `f` leaves no slot that is
            // both moved out and still counted as filled (`Drop` publishes `head`).
            let v = self.read();
            f(v);
        }
        if n > 0 {
            // Release: as in `pop`, for all `n` slots.
            self.ring.head.store(self.head, Ordering::Release);
        }
        n
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        // Publish reads a panicking `pop_batch` callback left unpublished.
        self.ring.head.store(self.head, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Iterations for the threaded test: small under Miri, which is ~1000x slower.
    const ITEMS: usize = if cfg!(miri) { 200 } else { 200_000 };

    #[test]
    fn fills_to_capacity_and_refuses_one_more() {
        let (mut tx, mut rx) = channel(4);
        for i in 0..4 {
            assert_eq!(tx.push(i), Ok(()));
        }
        assert_eq!(tx.push(4), Err(4));
        assert_eq!(rx.ring().len(), 4);
        assert_eq!(rx.pop(), Some(0));
        assert_eq!(tx.push(4), Ok(()));
        let mut got = Vec::new();
        assert_eq!(rx.pop_batch(10, |v| got.push(v)), 4);
        assert_eq!(got, [1, 2, 3, 4]);
        assert_eq!(rx.pop(), None);
        assert!(tx.ring().is_empty());
    }

    #[test]
    fn push_iter_takes_only_what_fits() {
        let (mut tx, mut rx) = channel(2);
        let mut src = 0..5;
        assert_eq!(tx.push_iter(&mut src), 2);
        assert_eq!(
            src.next(),
            Some(2),
            "the iterator was not advanced past the room"
        );
        assert_eq!(rx.pop_batch(1, drop), 1);
        assert_eq!(tx.push_iter(&mut (10..20)), 1);
        let mut got = Vec::new();
        rx.pop_batch(usize::MAX, |v| got.push(v));
        assert_eq!(got, [1, 10]);
    }

    #[test]
    fn counters_wrap_around_usize() {
        let (mut tx, mut rx) = channel(2);
        // Start both ends just below the counter's wrap.
        let start = usize::MAX - 2;
        tx.tail = start;
        tx.head_cache = start;
        rx.head = start;
        rx.tail_cache = start;
        tx.ring.tail.store(start, Ordering::Relaxed);
        tx.ring.head.store(start, Ordering::Relaxed);
        for i in 0..10 {
            assert_eq!(tx.push(i), Ok(()));
            assert_eq!(rx.ring().len(), 1);
            assert_eq!(rx.pop(), Some(i));
        }
    }

    #[test]
    fn drops_values_left_in_the_ring() {
        let counted = std::sync::Arc::new(());
        let (mut tx, rx) = channel(4);
        tx.push(counted.clone()).unwrap();
        tx.push(counted.clone()).unwrap();
        assert_eq!(std::sync::Arc::strong_count(&counted), 3);
        drop(tx);
        drop(rx);
        assert_eq!(std::sync::Arc::strong_count(&counted), 1);
    }

    #[test]
    fn values_cross_threads_in_order() {
        let (mut tx, mut rx) = channel::<usize>(8);
        let producer = std::thread::spawn(move || {
            let mut next = 0;
            while next < ITEMS {
                let mut batch = next..(next + 3).min(ITEMS);
                next += tx.push_iter(&mut batch);
                std::thread::yield_now();
            }
        });
        let mut expect = 0;
        while expect < ITEMS {
            rx.pop_batch(5, |v| {
                assert_eq!(v, expect);
                expect += 1;
            });
            std::thread::yield_now();
        }
        producer.join().unwrap();
    }
}
