//! A bounded lock-free pool of boxed values (the runtime's transmit batches).
//!
//! A fixed array of slots, each an `AtomicPtr` that is null or owns one `Box<T>`.
//!
//! # Ordering argument
//!
//! - [`Pool::get`] takes a slot's pointer with `swap(null, Acquire)`. The swap is atomic, so
//!   each non-null pointer is returned by exactly one `get`: no double hand-out, and no ABA
//!   problem because nothing is compared against a value read earlier.
//! - [`Pool::put`] installs a pointer with `compare_exchange(null, p, Release, Relaxed)`, so
//!   a slot is only filled when empty and never overwrites (leaks) another value; `Release`
//!   makes the putter's writes to the value happen before the next getter (`Acquire`) uses it.
//! - A full pool drops the value instead ([`Pool::put`] hands it back): the pool bounds the
//!   memory it keeps, not the number of values alive.
//!
//! The scan is linear; pools are small (a handful of slots), and a `Relaxed` load skips empty
//! or full slots without taking their cache line exclusively.
use crate::sync::{AtomicPtr, Ordering};

/// A bounded pool of `Box<T>`; see the module documentation.
pub struct Pool<T> {
    slots: Box<[AtomicPtr<T>]>,
}

// SAFETY: the pool moves boxes between threads (`T: Send`) and never shares a `&T`: each
// pointer is owned by exactly one slot or one caller at a time.
unsafe impl<T: Send> Send for Pool<T> {}
// SAFETY: as above; `&Pool` only performs atomic operations on the slots.
unsafe impl<T: Send> Sync for Pool<T> {}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl<T> Pool<T> {
    /// An empty pool keeping at most `slots` values.
    pub fn new(slots: usize) -> Pool<T> {
        Pool {
            slots: (0..slots)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    /// Takes a pooled value, if any.
    pub fn get(&self) -> Option<Box<T>> {
        for s in self.slots.iter() {
            if s.load(Ordering::Relaxed).is_null() {
                continue;
            }
            // Acquire: pairs with the `Release` of the `put` that filled the slot.
            let p = s.swap(std::ptr::null_mut(), Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: a non-null slot owns a pointer from `Box::into_raw` (in `put`), and
                // the swap moved that ownership to us alone.
                return Some(unsafe { Box::from_raw(p) });
            }
        }
        None
    }

    /// Returns a value to the pool, or hands it back if every slot is taken.
    pub fn put(&self, v: Box<T>) -> Result<(), Box<T>> {
        let p = Box::into_raw(v);
        for s in self.slots.iter() {
            if !s.load(Ordering::Relaxed).is_null() {
                continue;
            }
            // Release: our writes to `*p` happen before the `get` that takes it.
            if s.compare_exchange(
                std::ptr::null_mut(),
                p,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
            {
                return Ok(());
            }
        }
        // SAFETY: `p` came from `Box::into_raw` above and no slot took it.
        Err(unsafe { Box::from_raw(p) })
    }
}

impl<T> Drop for Pool<T> {
    fn drop(&mut self) {
        for s in self.slots.iter() {
            // `&mut self`: no other thread can reach the slots; Relaxed suffices.
            let p = s.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: as in `get`: the slot owned this pointer from `Box::into_raw`.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const ROUNDS: usize = if cfg!(miri) { 50 } else { 20_000 };

    #[test]
    fn keeps_at_most_its_slots() {
        let pool = Pool::new(2);
        assert!(pool.get().is_none());
        assert!(pool.put(Box::new(1)).is_ok());
        assert!(pool.put(Box::new(2)).is_ok());
        assert_eq!(pool.put(Box::new(3)).map_err(|b| *b), Err(3));
        let mut got = [*pool.get().unwrap(), *pool.get().unwrap()];
        got.sort();
        assert_eq!(got, [1, 2]);
        assert!(pool.get().is_none());
    }

    #[test]
    fn drops_pooled_values() {
        let counted = std::sync::Arc::new(());
        let pool = Pool::new(4);
        pool.put(Box::new(counted.clone())).unwrap();
        drop(pool);
        assert_eq!(std::sync::Arc::strong_count(&counted), 1);
    }

    #[test]
    fn threads_never_share_a_value() {
        // Each value carries an in-use flag; a double hand-out would find it set.
        let pool = std::sync::Arc::new(Pool::new(3));
        for _ in 0..3 {
            pool.put(Box::new(std::sync::atomic::AtomicBool::new(false)))
                .unwrap();
        }
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        let Some(v) = pool.get() else { continue };
                        assert!(!v.swap(true, std::sync::atomic::Ordering::Relaxed));
                        v.store(false, std::sync::atomic::Ordering::Relaxed);
                        let _ = pool.put(v); // may be dropped if stale loads saw no room
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    }
}
