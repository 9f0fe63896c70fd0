//! Braid's concurrent structures: the only places where the runtime's threads share memory
//! without the engine lock. It does not contain the protocol engine, which stays
//! single-threaded behind one lock, and it starts no threads and reads no clock of its own
//! (only [`Event::wait_until`] takes a timeout).
//!
//! - [`ring`]: a bounded single-producer single-consumer ring with batch push and pop. The
//!   runtime uses one per completion queue (engine → application) and one for work requests
//!   handed to the progress thread (application → engine, producers serialised by [`Mpsc`]).
//! - [`doorbell`]: the wake-up protocol between producers and a consumer that may sleep:
//!   [`Doorbell`] (the state word), [`Event`] (doorbell + condition variable, for threads
//!   waiting on a completion queue) and [`Mpsc`] (ring + producer lock + doorbell, for the
//!   hand-off to the progress thread, whose sleep is the datapath's own `recv`).
//! - [`pool`]: a bounded lock-free pool of boxed buffers.
//!
//! Every structure imports its atomics, cells, mutexes and threads from the `sync` shim below:
//! std's normally, loom's under `RUSTFLAGS="--cfg loom"`, where `tests/loom.rs` model-checks
//! each of them (including one deliberately broken variant that loom must catch). Orderings are
//! argued next to each structure without `SeqCst` (loom models `SeqCst` as `AcqRel`).
#![warn(missing_docs, unreachable_pub)]

pub mod doorbell;
pub mod pool;
pub mod ring;

pub use doorbell::{Doorbell, Event, Mpsc};
pub use pool::Pool;
pub use ring::{Consumer, Producer, Ring};

/// std's or loom's primitives, under one set of names.
#[allow(unused_imports)]
mod sync {
    #[cfg(loom)]
    pub(crate) use loom::cell::UnsafeCell;
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
    #[cfg(loom)]
    pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
    #[cfg(not(loom))]
    pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

    /// `std::cell::UnsafeCell` with loom's closure-based access API, so that the same code
    /// compiles against both (loom tracks every access to check for data races).
    #[cfg(not(loom))]
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    #[cfg(not(loom))]
    impl<T> UnsafeCell<T> {
        pub(crate) fn new(v: T) -> UnsafeCell<T> {
            UnsafeCell(std::cell::UnsafeCell::new(v))
        }
        /// Runs `f` with a shared pointer to the contents.
        #[allow(dead_code)] // loom's API has it; nothing here reads a cell without moving out
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }
        /// Runs `f` with a mutable pointer to the contents.
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

/// Keeps `T` on its own cache lines (128 bytes: two 64-byte lines, as the adjacent-line
/// prefetcher of x86 pulls pairs), so that a producer's index and a consumer's index do not
/// bounce one line between cores.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Locks `m`, ignoring poisoning: every structure here keeps its invariants across a panic
/// in user code (indices are published only after the slots they cover are written or read).
pub(crate) fn lock<T>(m: &sync::Mutex<T>) -> sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
