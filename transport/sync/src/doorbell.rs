//! The wake-up protocol between producers and a consumer that may sleep.
//!
//! # The protocol
//!
//! A [`Doorbell`] is one word counting the consumers that are about to sleep or asleep
//! ("armed"). A producer publishes its work (a ring's `Release` store), then **rings**: an
//! `AcqRel` read-modify-write of the word. If the word was non-zero it must wake the sleeper
//! through whatever the sleeper sleeps in (a condition variable, a thread park, the
//! datapath's `wake`). A consumer that wants to sleep **arms** (an `AcqRel` increment),
//! **re-checks** its ring, and sleeps only if the ring is still empty; after waking it
//! **disarms**.
//!
//! # Why no wake-up is lost
//!
//! Both sides perform a read-modify-write on the same word, so the two are ordered in that
//! word's modification order, and a read-modify-write always reads the latest value in it:
//! - the producer's ring comes first: the consumer's arm reads the value it wrote, so the ring
//!   (a release) synchronises with the arm (an acquire), the producer's publication happens
//!   before the consumer's re-check, and the re-check sees the work;
//! - the arm comes first: the producer's ring reads a non-zero count and wakes the consumer.
//!
//! A plain load in `ring` would not do: it may read a stale zero while the consumer's re-check
//! reads a stale empty ring (the store-buffer pattern), and both walk away. The wake itself
//! must not be lost between the consumer's re-check and its sleep: [`Event`] holds its mutex
//! across that gap; a park token or the datapath's wake (which makes the *next* `recv` return
//! too) remember an early wake.
//!
//! Counting (rather than a flag) lets several threads wait on one [`Event`].
//!
//! `tests/loom.rs` checks [`Event`] and the [`Mpsc`] hand-off with one and two producers.
use std::time::Duration;

use crate::ring::{self, Consumer, Producer, Ring};
use crate::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering};

/// The state word of the wake-up protocol (see the module documentation).
#[derive(Debug, Default)]
pub struct Doorbell {
    /// Consumers between `arm` and `disarm`.
    armed: AtomicUsize,
}

impl Doorbell {
    /// A doorbell nobody waits on.
    pub fn new() -> Doorbell {
        Doorbell {
            armed: AtomicUsize::new(0),
        }
    }

    /// Producer side, after publishing work: returns whether a consumer is armed, in which
    /// case the caller must wake it.
    #[must_use = "when it returns true, the sleeper must be woken"]
    pub fn ring(&self) -> bool {
        // A read-modify-write, not a load: see "Why no wake-up is lost". Adding zero changes
        // nothing but still takes part in the word's modification order.
        self.armed.fetch_add(0, Ordering::AcqRel) != 0
    }

    /// Consumer side, before the last check for work: from here on, producers wake us.
    pub fn arm(&self) {
        self.armed.fetch_add(1, Ordering::AcqRel);
    }

    /// Consumer side, after waking (or after finding work on the re-check).
    pub fn disarm(&self) {
        let was = self.armed.fetch_sub(1, Ordering::Release);
        debug_assert!(was > 0, "disarm without arm");
    }
}

/// A doorbell with a condition variable to sleep on: for threads that wait until a ring
/// (or anything else a producer publishes before calling [`notify`](Self::notify)) is ready.
#[derive(Debug, Default)]
pub struct Event {
    bell: Doorbell,
    /// Held by a waiter from before it arms until the condition variable releases it, and by
    /// `notify` around the wake, so a wake cannot fall between a waiter's re-check and sleep.
    lock: Mutex<()>,
    cond: Condvar,
}

impl Event {
    /// An event nobody waits on.
    pub fn new() -> Event {
        Event {
            bell: Doorbell::new(),
            lock: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    /// Producer side, after publishing: wakes every waiter, if there is one. Costs one atomic
    /// read-modify-write when nobody waits.
    pub fn notify(&self) {
        if self.bell.ring() {
            let _held = crate::lock(&self.lock);
            self.cond.notify_all();
        }
    }

    /// Waits until `ready()` holds or `timeout` (if any) passes; returns whether it held.
    /// `ready` is called with the event's lock held, so it must not wait itself. A `timeout` of
    /// `None` waits forever (the only form allowed under loom, which has no clock).
    pub fn wait_until(&self, mut ready: impl FnMut() -> bool, timeout: Option<Duration>) -> bool {
        if ready() {
            return true;
        }
        #[cfg(not(loom))]
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        #[cfg(loom)]
        assert!(timeout.is_none(), "loom has no clock");
        let mut held = crate::lock(&self.lock);
        loop {
            self.bell.arm();
            if ready() {
                self.bell.disarm();
                return true;
            }
            #[cfg(not(loom))]
            {
                held = match deadline {
                    None => self.cond.wait(held).unwrap_or_else(|e| e.into_inner()),
                    Some(d) => {
                        let Some(left) = d.checked_duration_since(std::time::Instant::now()) else {
                            self.bell.disarm();
                            return false;
                        };
                        self.cond
                            .wait_timeout(held, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                };
            }
            #[cfg(loom)]
            {
                held = self.cond.wait(held).unwrap_or_else(|e| e.into_inner());
            }
            self.bell.disarm();
            // Loop: re-arm before re-checking (a spurious or timed-out wake must not skip the
            // arm → check order), and give up only after a failed check past the deadline.
        }
    }
}

/// Many producers, one consumer: a [`ring`] whose producer end sits behind a small mutex,
/// plus a [`Doorbell`] for the consumer's sleep.
///
/// Producers are application threads posting work while the consumer (whoever holds the
/// engine) is busy: a slow path, so serialising them with a lock held for one slot write is
/// cheaper and simpler to check than a lock-free multi-producer ring. The consumer end is
/// returned separately by [`Mpsc::new`] and is used without any lock by its single owner.
#[derive(Debug)]
pub struct Mpsc<T> {
    producer: Mutex<Producer<T>>,
    ring: Arc<Ring<T>>,
    bell: Doorbell,
}

impl<T> Mpsc<T> {
    /// A hand-off holding up to `capacity` (a power of two) values, and its consumer end.
    pub fn new(capacity: usize) -> (Mpsc<T>, Consumer<T>) {
        let (tx, rx) = ring::channel(capacity);
        let ring = tx.ring().clone();
        (
            Mpsc {
                producer: Mutex::new(tx),
                ring,
                bell: Doorbell::new(),
            },
            rx,
        )
    }

    /// Appends `v` (or gives it back when full), then rings. Returns whether the consumer is
    /// armed, in which case the caller must wake it.
    #[must_use = "when it returns Ok(true), the consumer must be woken"]
    pub fn send(&self, v: T) -> Result<bool, T> {
        crate::lock(&self.producer).push(v)?;
        Ok(self.bell.ring())
    }

    /// Whether values look queued (a hint from any thread; exact for the consumer's thread
    /// after [`arm`](Self::arm)).
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Consumer side, before sleeping: arms the doorbell and re-checks the ring. Returns
    /// `true` if the consumer may sleep (it must call [`disarm`](Self::disarm) after); `false`
    /// if values are queued (it is left disarmed and should take them instead).
    #[must_use = "sleep only when it returns true"]
    pub fn arm(&self) -> bool {
        self.bell.arm();
        if self.ring.is_empty() {
            true
        } else {
            self.bell.disarm();
            false
        }
    }

    /// Consumer side, after sleeping.
    pub fn disarm(&self) {
        self.bell.disarm();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const ROUNDS: usize = if cfg!(miri) { 20 } else { 2_000 };

    #[test]
    fn wait_until_times_out_when_nothing_comes() {
        let e = Event::new();
        assert!(!e.wait_until(|| false, Some(Duration::from_millis(5))));
        assert!(e.wait_until(|| true, Some(Duration::ZERO)));
    }

    #[test]
    fn ring_reports_armed_consumers_only() {
        let d = Doorbell::new();
        assert!(!d.ring());
        d.arm();
        assert!(d.ring());
        d.disarm();
        assert!(!d.ring());
    }

    #[test]
    fn event_wakes_a_waiter_every_round() {
        let (tx, mut rx) = ring::channel::<usize>(4);
        let e = std::sync::Arc::new(Event::new());
        let ring = rx.ring().clone();
        let e2 = e.clone();
        let producer = std::thread::spawn(move || {
            let mut tx = tx;
            for i in 0..ROUNDS {
                while tx.push(i).is_err() {
                    std::thread::yield_now();
                }
                e2.notify();
            }
        });
        let mut next = 0;
        while next < ROUNDS {
            assert!(e.wait_until(|| !ring.is_empty(), None));
            while let Some(v) = rx.pop() {
                assert_eq!(v, next);
                next += 1;
            }
        }
        producer.join().unwrap();
    }

    #[test]
    fn mpsc_arm_refuses_sleep_when_values_are_queued() {
        let (m, mut rx) = Mpsc::new(2);
        assert!(m.arm());
        assert_eq!(m.send(1), Ok(true));
        m.disarm();
        assert!(!m.arm(), "a queued value must keep the consumer awake");
        assert_eq!(m.send(2), Ok(false));
        assert_eq!(m.send(3), Err(3));
        assert_eq!(rx.pop(), Some(1));
        assert_eq!(rx.pop(), Some(2));
        assert!(m.arm());
        m.disarm();
    }
}
