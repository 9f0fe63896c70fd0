//! AF_XDP sockets and their four single-producer/single-consumer rings, mapped from the
//! socket.
//!
//! Each ring is a power-of-two array of descriptors plus a producer and a consumer index
//! (free-running `u32`s) and a flags word, all shared with the kernel. The protocol, the same
//! as libxdp's:
//!
//! - The producer writes descriptors at `producer..`, then publishes them with a
//!   **Release** store of the new producer index. It learns about freed slots with an
//!   **Acquire** load of the consumer index, which orders the kernel's reads of the old
//!   descriptors before our overwrite.
//! - The consumer learns about new descriptors with an **Acquire** load of the producer index
//!   (ordering the kernel's descriptor writes before our reads), reads them, then hands the
//!   slots back with a **Release** store of the new consumer index.
//!
//! We are the producer of the fill and TX rings and the consumer of the RX and completion
//! rings. Each ring is used by one thread at a time (the datapath holds a lock around it), so
//! plain `u32` caches of the indices live next to the shared words.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use super::umem::{Mmap, Umem};

/// A failed step of socket setup: what was being done, and the OS error.
pub(super) type StepError = (&'static str, io::Error);

fn step<T>(what: &'static str, r: io::Result<T>) -> Result<T, StepError> {
    r.map_err(|e| (what, e))
}

fn bad_offsets() -> io::Error {
    io::Error::other("kernel reported AF_XDP ring offsets out of range")
}

/// One mapped ring of `T` descriptors (`u64` UMEM addresses for fill/completion,
/// `xdp_desc` for RX/TX).
#[derive(Debug)]
struct Ring<T: Copy> {
    _map: Mmap,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    mask: u32,
    size: u32,
    /// Our copy of the producer index: authoritative on producer rings, a snapshot on
    /// consumer rings.
    cached_prod: u32,
    /// Our copy of the consumer index: authoritative on consumer rings, a snapshot on
    /// producer rings.
    cached_cons: u32,
}

// SAFETY: the pointers target a mapping owned by `_map`, which moves with the ring; the
// kernel side is synchronised through the atomics, and the user side needs `&mut self`.
unsafe impl<T: Copy> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps the ring of `size` entries described by `off` at page offset `pgoff` of `fd`.
    fn map(fd: RawFd, off: &libc::xdp_ring_offset, size: u32, pgoff: u64) -> io::Result<Self> {
        debug_assert!(size.is_power_of_two());
        let map = Mmap::socket_ring(fd, Self::mapping_len(off, size)?, pgoff)?;
        Self::over(map, off, size)
    }

    /// Bytes a ring of `size` entries laid out as `off` needs.
    fn mapping_len(off: &libc::xdp_ring_offset, size: u32) -> io::Result<usize> {
        let desc_off = usize::try_from(off.desc).map_err(|_| bad_offsets())?;
        Ok(desc_off + size as usize * mem::size_of::<T>())
    }

    /// The ring laid out as `off` in `map` (which must be at least `mapping_len` long).
    fn over(map: Mmap, off: &libc::xdp_ring_offset, size: u32) -> io::Result<Self> {
        let bad = bad_offsets;
        let len = Self::mapping_len(off, size)?;
        if map.len() < len {
            return Err(bad());
        }
        let desc_off = usize::try_from(off.desc).map_err(|_| bad())?;
        let word = |o: u64| -> io::Result<NonNull<AtomicU32>> {
            let o = usize::try_from(o).map_err(|_| bad())?;
            if o % mem::align_of::<AtomicU32>() != 0 || o + 4 > len {
                return Err(bad());
            }
            // SAFETY: `o + 4 <= len`, so the pointer stays inside the mapping, and it is
            // aligned for a u32 (checked above; mappings are page-aligned).
            Ok(unsafe { NonNull::new_unchecked(map.as_ptr().add(o).cast::<AtomicU32>()) })
        };
        let producer = word(off.producer)?;
        let consumer = word(off.consumer)?;
        let flags = word(off.flags)?;
        if desc_off % mem::align_of::<T>() != 0 {
            return Err(bad());
        }
        // SAFETY: `desc_off + size * size_of::<T>() == len`: the array lies inside the
        // mapping, and its start is aligned for `T` (checked above).
        let descs = unsafe { NonNull::new_unchecked(map.as_ptr().add(desc_off).cast::<T>()) };
        let mut ring = Ring {
            _map: map,
            producer,
            consumer,
            flags,
            descs,
            mask: size - 1,
            size,
            cached_prod: 0,
            cached_cons: 0,
        };
        ring.cached_prod = ring.producer().load(Ordering::Acquire);
        ring.cached_cons = ring.consumer().load(Ordering::Acquire);
        Ok(ring)
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the mapping `self` owns (see `map`); the kernel only accesses
        // the word atomically.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.consumer.as_ref() }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `producer`. Relaxed, as libxdp reads it: the kernel sets the flag
        // before it rechecks the ring, so a stale read costs at most one extra wake-up.
        let flags = unsafe { self.flags.as_ref() }.load(Ordering::Relaxed);
        flags & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn slot(&self, index: u32) -> *mut T {
        // SAFETY: `index & mask < size`, so the slot lies inside the descriptor array.
        unsafe { self.descs.as_ptr().add((index & self.mask) as usize) }
    }
}

/// A ring we produce into: fill (UMEM addresses) or TX (descriptors).
#[derive(Debug)]
pub(super) struct ProdRing<T: Copy>(Ring<T>);

impl<T: Copy> ProdRing<T> {
    /// Free slots, at least `want` if the kernel has consumed enough (refreshes the
    /// consumer snapshot only when the cached one shows too little room).
    pub(super) fn free(&mut self, want: u32) -> u32 {
        let r = &mut self.0;
        let mut free = r.size - r.cached_prod.wrapping_sub(r.cached_cons);
        if free < want {
            r.cached_cons = r.consumer().load(Ordering::Acquire);
            free = r.size - r.cached_prod.wrapping_sub(r.cached_cons);
        }
        free
    }

    /// Writes `value` into the `i`-th slot past the published producer index. The caller
    /// has checked `i < free(..)`.
    pub(super) fn write(&mut self, i: u32, value: T) {
        let r = &mut self.0;
        debug_assert!(i < r.size - r.cached_prod.wrapping_sub(r.cached_cons));
        let slot = r.slot(r.cached_prod.wrapping_add(i));
        // SAFETY: the slot is inside the array (`slot`), and it is free: the kernel consumed
        // it (the Acquire load in `free` ordered its reads before this write) and does not
        // read it again until we publish it.
        unsafe { slot.write_volatile(value) };
    }

    /// Publishes the next `n` written slots to the kernel.
    pub(super) fn submit(&mut self, n: u32) {
        let r = &mut self.0;
        r.cached_prod = r.cached_prod.wrapping_add(n);
        r.producer().store(r.cached_prod, Ordering::Release);
    }

    /// Slots published but not yet consumed by the kernel.
    pub(super) fn pending(&mut self) -> u32 {
        let r = &mut self.0;
        r.cached_cons = r.consumer().load(Ordering::Acquire);
        r.cached_prod.wrapping_sub(r.cached_cons)
    }

    /// Whether the kernel asked for a syscall to notice new entries.
    pub(super) fn needs_wakeup(&self) -> bool {
        self.0.needs_wakeup()
    }
}

/// A ring we consume from: RX (descriptors) or completion (UMEM addresses).
#[derive(Debug)]
pub(super) struct ConsRing<T: Copy>(Ring<T>);

impl<T: Copy> ConsRing<T> {
    /// Entries ready to read, at most `max` (refreshes the producer snapshot only when the
    /// cached one shows none).
    pub(super) fn available(&mut self, max: u32) -> u32 {
        let r = &mut self.0;
        let mut n = r.cached_prod.wrapping_sub(r.cached_cons);
        if n == 0 {
            r.cached_prod = r.producer().load(Ordering::Acquire);
            n = r.cached_prod.wrapping_sub(r.cached_cons);
        }
        n.min(max)
    }

    /// Reads the `i`-th entry past the consumer index. The caller has checked
    /// `i < available(..)`.
    pub(super) fn read(&self, i: u32) -> T {
        let r = &self.0;
        debug_assert!(i < r.cached_prod.wrapping_sub(r.cached_cons));
        let slot = r.slot(r.cached_cons.wrapping_add(i));
        // SAFETY: the slot is inside the array and was published by the kernel (the Acquire
        // load in `available` ordered its write before this read); the kernel does not
        // rewrite it until we release it.
        unsafe { slot.read_volatile() }
    }

    /// Hands the next `n` read slots back to the kernel.
    pub(super) fn release(&mut self, n: u32) {
        let r = &mut self.0;
        r.cached_cons = r.cached_cons.wrapping_add(n);
        r.consumer().store(r.cached_cons, Ordering::Release);
    }

    /// Whether any entry is ready, without consuming.
    pub(super) fn is_empty(&mut self) -> bool {
        self.available(1) == 0
    }
}

/// Ring sizes for one socket; 0 leaves that ring out.
#[derive(Copy, Clone, Debug)]
pub(super) struct RingSizes {
    pub(super) rx: u32,
    pub(super) tx: u32,
    pub(super) fill: u32,
    pub(super) completion: u32,
}

/// One AF_XDP socket with its mapped rings.
#[derive(Debug)]
pub(super) struct Xsk {
    pub(super) rx: Option<ConsRing<libc::xdp_desc>>,
    pub(super) tx: Option<ProdRing<libc::xdp_desc>>,
    pub(super) fill: ProdRing<u64>,
    pub(super) completion: ConsRing<u64>,
    /// Declared last: the ring mappings above are unmapped before the socket closes.
    pub(super) fd: OwnedFd,
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: passes a pointer to a live `T` and its exact size; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            (value as *const T).cast::<libc::c_void>(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// C structs made only of integers, for which all-zero bytes are a valid value.
///
/// # Safety
/// Implement only for such structs.
unsafe trait Pod: Sized {}
// SAFETY: structs of u64 fields only.
unsafe impl Pod for libc::xdp_mmap_offsets {}
// SAFETY: struct of u64 fields only.
unsafe impl Pod for libc::xdp_statistics {}
// SAFETY: struct of one u32.
unsafe impl Pod for libc::xdp_options {}

/// Reads a fixed-size SOL_XDP option; fails if the kernel's struct has another size.
fn getsockopt<T: Pod>(fd: RawFd, name: libc::c_int) -> io::Result<T> {
    // SAFETY: `T: Pod`, so all-zero bytes are a valid `T`.
    let mut value: T = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live and `len` holds the size of `value`; the kernel
    // writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            name,
            (&mut value as *mut T).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != mem::size_of::<T>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel's AF_XDP structures are older than Linux 5.4 (no ring flags)",
        ));
    }
    Ok(value)
}

/// Kernel counters of one socket (`XDP_STATISTICS`).
pub(super) fn statistics(fd: RawFd) -> io::Result<libc::xdp_statistics> {
    getsockopt(fd, libc::XDP_STATISTICS)
}

/// Whether the bound socket runs in zero-copy mode (`XDP_OPTIONS`).
pub(super) fn is_zero_copy(fd: RawFd) -> io::Result<bool> {
    let o: libc::xdp_options = getsockopt(fd, libc::XDP_OPTIONS)?;
    Ok(o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0)
}

impl Xsk {
    /// Creates an AF_XDP socket and its rings. `register` registers `umem` with it (the
    /// first socket); the others share that registration at bind time. A ring size of 0
    /// leaves the RX or TX ring out.
    pub(super) fn open(umem: &Umem, register: bool, sizes: RingSizes) -> Result<Xsk, StepError> {
        // SAFETY: plain socket syscall; the result is checked and owned below.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(("socket(AF_XDP)", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if register {
            let reg = libc::xdp_umem_reg {
                addr: umem.base() as u64,
                len: umem.len() as u64,
                chunk_size: umem.frame_size(),
                headroom: 0,
                flags: 0,
                tx_metadata_len: 0,
            };
            step("XDP_UMEM_REG", setsockopt(raw, libc::XDP_UMEM_REG, &reg))?;
        }
        step(
            "XDP_UMEM_FILL_RING",
            setsockopt(raw, libc::XDP_UMEM_FILL_RING, &sizes.fill),
        )?;
        step(
            "XDP_UMEM_COMPLETION_RING",
            setsockopt(raw, libc::XDP_UMEM_COMPLETION_RING, &sizes.completion),
        )?;
        if sizes.rx > 0 {
            step("XDP_RX_RING", setsockopt(raw, libc::XDP_RX_RING, &sizes.rx))?;
        }
        if sizes.tx > 0 {
            step("XDP_TX_RING", setsockopt(raw, libc::XDP_TX_RING, &sizes.tx))?;
        }
        let off: libc::xdp_mmap_offsets =
            step("XDP_MMAP_OFFSETS", getsockopt(raw, libc::XDP_MMAP_OFFSETS))?;
        let fill = ProdRing(step(
            "mmap fill ring",
            Ring::map(raw, &off.fr, sizes.fill, libc::XDP_UMEM_PGOFF_FILL_RING),
        )?);
        let completion = ConsRing(step(
            "mmap completion ring",
            Ring::map(
                raw,
                &off.cr,
                sizes.completion,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            ),
        )?);
        let rx = if sizes.rx > 0 {
            Some(ConsRing(step(
                "mmap RX ring",
                Ring::map(raw, &off.rx, sizes.rx, libc::XDP_PGOFF_RX_RING as u64),
            )?))
        } else {
            None
        };
        let tx = if sizes.tx > 0 {
            Some(ProdRing(step(
                "mmap TX ring",
                Ring::map(raw, &off.tx, sizes.tx, libc::XDP_PGOFF_TX_RING as u64),
            )?))
        } else {
            None
        };
        Ok(Xsk {
            rx,
            tx,
            fill,
            completion,
            fd,
        })
    }

    /// Binds to queue `queue` of interface `ifindex` with `flags`; with `shared` set, shares
    /// the UMEM registered on that socket (`XDP_SHARED_UMEM`, which takes no other flag).
    pub(super) fn bind(
        &self,
        ifindex: u32,
        queue: u32,
        flags: u16,
        shared: Option<RawFd>,
    ) -> io::Result<()> {
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: if shared.is_some() {
                libc::XDP_SHARED_UMEM
            } else {
                flags
            },
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: shared.map_or(0, |fd| fd as u32),
        };
        // SAFETY: `addr` is a live sockaddr_xdp and the length passed is its size.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_xdp).cast::<libc::sockaddr>(),
                mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Asks the kernel to process the TX ring (`sendto` with no data). Returns the errno of
    /// a failed kick; EAGAIN/EBUSY/ENOBUFS mean "more work pending, kick again", not failure.
    pub(super) fn kick_tx(fd: RawFd) -> Option<i32> {
        // SAFETY: a zero-length send with null buffer and address is what AF_XDP documents
        // as the TX wake-up; nothing is read or written through the pointers.
        let r = unsafe {
            libc::sendto(
                fd,
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            io::Error::last_os_error().raw_os_error()
        } else {
            None
        }
    }

    /// Asks the kernel to look at the fill ring (`recvfrom` with no buffer).
    pub(super) fn kick_fill(fd: RawFd) {
        // SAFETY: a zero-length receive with null buffer and address is the documented
        // AF_XDP RX wake-up; nothing is written through the pointers.
        let _ = unsafe {
            libc::recvfrom(
                fd,
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }
}

/// The ring protocol against a simulated kernel on another thread, over anonymous memory
/// laid out as the kernel lays out a ring. Small enough for Miri, whose data-race detector
/// then checks that the Acquire/Release pairs really order the (non-atomic) descriptor
/// accesses: `scripts/sanitizers.sh miri`.
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    const SIZE: u32 = 4;
    const ITEMS: u64 = if cfg!(miri) { 40 } else { 100_000 };

    fn layout() -> libc::xdp_ring_offset {
        libc::xdp_ring_offset {
            producer: 0,
            consumer: 64,
            desc: 192,
            flags: 128,
        }
    }

    /// A ring over fresh memory, and the address of that memory for the "kernel".
    fn ring() -> (Ring<u64>, Kernel) {
        let map = Mmap::anonymous(Ring::<u64>::mapping_len(&layout(), SIZE).unwrap()).unwrap();
        let base = Kernel(map.as_ptr());
        (Ring::over(map, &layout(), SIZE).unwrap(), base)
    }

    /// The kernel's view of a ring's memory: its indices and descriptor slots.
    struct Kernel(*mut u8);

    // SAFETY: the kernel side touches the shared ring memory only as the ring protocol allows
    // (atomic indices; descriptors it owns per those indices), like the real kernel.
    unsafe impl Send for Kernel {}

    impl Kernel {
        fn word(&self, off: u64) -> &AtomicU32 {
            // SAFETY: the ring's mapping outlives the test's threads (joined before the ring
            // drops), the offset is inside it and 4-aligned, and every access is atomic.
            unsafe { AtomicU32::from_ptr(self.0.add(off as usize).cast::<u32>()) }
        }
        fn slot(&self, i: u32) -> *mut u64 {
            let off = layout().desc as usize + (i & (SIZE - 1)) as usize * 8;
            // SAFETY: `off` is inside the descriptor array of the mapping.
            unsafe { self.0.add(off).cast::<u64>() }
        }
    }

    // Each direction gets its own test so that nothing but that ring's index pair orders the
    // descriptor accesses (a second ring would synchronise the threads and hide a broken
    // ordering from Miri: weakening `submit`'s Release to Relaxed makes the first test fail
    // under Miri with a data race).

    #[test]
    fn a_producer_ring_publishes_descriptors_to_the_kernel_in_order() {
        let (prod, kernel) = ring();
        let mut prod = ProdRing(prod);
        let consumer = std::thread::spawn(move || {
            let mut next = 0u32;
            while u64::from(next) < ITEMS {
                let avail = kernel.word(0).load(Ordering::Acquire).wrapping_sub(next);
                for k in 0..avail {
                    // SAFETY: published by the producer's Release store that the Acquire load
                    // above observed; not rewritten until the consumer index moves past it.
                    let v = unsafe { kernel.slot(next.wrapping_add(k)).read_volatile() };
                    assert_eq!(v, u64::from(next.wrapping_add(k)) + 1, "lost or torn");
                }
                next = next.wrapping_add(avail);
                kernel.word(64).store(next, Ordering::Release);
                if avail == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let mut sent = 0u64;
        while sent < ITEMS {
            let n = prod.free(SIZE).min((ITEMS - sent) as u32);
            for i in 0..n {
                prod.write(i, sent + u64::from(i) + 1);
            }
            prod.submit(n);
            sent += u64::from(n);
            if n == 0 {
                std::thread::yield_now();
            }
        }
        consumer.join().unwrap();
        assert_eq!(prod.pending(), 0);
    }

    #[test]
    fn a_consumer_ring_reads_what_the_kernel_published_in_order() {
        let (cons, kernel) = ring();
        let mut cons = ConsRing(cons);
        let producer = std::thread::spawn(move || {
            let mut next = 0u32;
            while u64::from(next) < ITEMS {
                let used = next.wrapping_sub(kernel.word(64).load(Ordering::Acquire));
                let n = (SIZE - used).min((ITEMS - u64::from(next)) as u32);
                for k in 0..n {
                    let i = next.wrapping_add(k);
                    // SAFETY: the slot is free: the consumer released it (Release store seen
                    // by the Acquire load above) and reads it only after we publish.
                    unsafe { kernel.slot(i).write_volatile(u64::from(i) * 3) };
                }
                next = next.wrapping_add(n);
                kernel.word(0).store(next, Ordering::Release);
                if n == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let mut got = 0u64;
        while got < ITEMS {
            let m = cons.available(SIZE);
            for i in 0..m {
                assert_eq!(cons.read(i), (got + u64::from(i)) * 3, "lost or torn");
            }
            cons.release(m);
            got += u64::from(m);
            if m == 0 {
                std::thread::yield_now();
            }
        }
        producer.join().unwrap();
        assert!(cons.is_empty());
    }

    #[test]
    fn offsets_outside_the_mapping_are_refused() {
        let map = Mmap::anonymous(4096).unwrap();
        let mut off = layout();
        off.flags = 4094;
        assert!(Ring::<u64>::over(map, &off, SIZE).is_err());
        let small = Mmap::anonymous(64).unwrap();
        assert!(Ring::<u64>::over(small, &layout(), SIZE).is_err());
    }
}
