//! Memory regions: the bytes peers read and write.
//!
//! # The access rule
//!
//! A region can be written by the network (a remote WRITE, a READ response, a SEND landing in
//! a posted receive, an atomic) at any moment, from the progress thread, while the owner reads
//! or writes it from its own threads. Plain `&[u8]` access would then be a data race, which is
//! undefined behaviour. So a region never hands out references to its bytes: every access,
//! local or remote, goes through [`Region::read`], [`Region::write`] and the atomic methods,
//! and all of them touch memory only as aligned 64-bit atomic words (partial words are updated
//! with a compare-and-swap loop, so neighbouring bytes are never torn). The result is what RDMA
//! hardware gives: while a remote WRITE is landing, a concurrent read may see some old and some
//! new bytes, but it is never undefined behaviour. Data is stable once the completion that
//! covers it has been polled.
//!
//! Regions allocated by Braid own their words. [`Region::from_raw`] registers caller memory
//! (for the C API); its safety contract extends the same rule to the caller.
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Access rights of a memory region, as verbs' `IBV_ACCESS_*`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// The local side may place incoming data here (RECV buffers, READ destinations).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE here.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA READ from here.
    pub const REMOTE_READ: Access = Access(4);
    /// Peers may run atomics here.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every right.
    pub const ALL: Access = Access(15);

    /// Whether every right in `other` is granted.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Raw bits (stable, for the C API).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// From raw bits; unknown bits are ignored.
    pub const fn from_bits_truncate(bits: u8) -> Access {
        Access(bits & Access::ALL.0)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Why a region access was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemError {
    /// `offset + len` is past the end of the region.
    OutOfBounds,
    /// An atomic at an offset that is not 8-byte aligned.
    Misaligned,
}

impl core::fmt::Display for MemError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MemError::OutOfBounds => "access outside the memory region",
            MemError::Misaligned => "atomic access not 8-byte aligned",
        })
    }
}

impl std::error::Error for MemError {}

enum Storage {
    Owned(Box<[AtomicU64]>),
    Borrowed(&'static [AtomicU64]),
}

/// The bytes of one memory region. Shared (`Arc`) between the owner and the engine.
pub struct Region {
    storage: Storage,
    /// Byte offset of the region's first byte within the first word.
    head: usize,
    len: usize,
}

impl core::fmt::Debug for Region {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Region {
    /// A zero-filled region of `len` bytes owned by Braid.
    pub fn new(len: usize) -> Arc<Region> {
        let words = len.div_ceil(8);
        let storage = Storage::Owned((0..words).map(|_| AtomicU64::new(0)).collect());
        Arc::new(Region {
            storage,
            head: 0,
            len,
        })
    }

    /// A zero-filled region of `len` bytes owned by Braid whose first byte sits at a
    /// multiple of `align` (a power of two, at least 8): for RDMA NICs, which register whole
    /// pages and need the region to start a page (the verbs backend). It over-allocates by
    /// up to `align` bytes.
    pub fn new_aligned(len: usize, align: usize) -> Arc<Region> {
        let align = align.max(8).next_power_of_two();
        let words = (len + align).div_ceil(8);
        let storage: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let addr = storage.as_ptr() as usize;
        // A multiple of 8 (the words are 8-aligned), below `align`: the words from there on
        // still cover `len` bytes.
        let head = (align - addr % align) % align;
        Arc::new(Region {
            storage: Storage::Owned(storage),
            head,
            len,
        })
    }

    /// Registers `len` bytes of caller memory at `ptr`.
    ///
    /// # Safety
    /// Every aligned 8-byte word that overlaps `[ptr, ptr + len)` must be valid for reads and
    /// writes from this call until both of these hold:
    /// - every endpoint the region was registered with has returned from
    ///   [`Endpoint::deregister`](crate::Endpoint::deregister) for each of its registrations
    ///   (or was dropped): from then on the engine never touches the memory, though it may
    ///   still hold clones of the `Arc` in work requests waiting to be reported;
    /// - the caller no longer calls [`read`](Self::read), [`write`](Self::write) or the
    ///   atomics on any clone of the returned `Arc`.
    ///
    /// Dropping a clone never touches the memory. Until then, those words may only be
    /// accessed through this region or through other atomic operations (no plain loads or
    /// stores that could race with the network).
    #[allow(unsafe_code)] // Memory registration: the engine's only unsafe code.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Arc<Region> {
        if len == 0 {
            return Arc::new(Region {
                storage: Storage::Owned(Box::new([])),
                head: 0,
                len: 0,
            });
        }
        let addr = ptr as usize;
        let head = addr % 8;
        let words = (head + len).div_ceil(8);
        // SAFETY: the caller guarantees that the `words` aligned words starting at
        // `ptr - head` are valid, live as long as the region, and are accessed only
        // atomically; AtomicU64 has the size and alignment of those words.
        let slice = unsafe {
            core::slice::from_raw_parts(ptr.wrapping_sub(head).cast::<AtomicU64>(), words)
        };
        Arc::new(Region {
            storage: Storage::Borrowed(slice),
            head,
            len,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The address of the region's first byte, for registering the same memory with an RDMA
    /// NIC (the verbs backend). The bytes stay valid as long as the region; what writes them
    /// there (a NIC) must treat them as the atomic words they are.
    pub fn as_ptr(&self) -> *mut u8 {
        self.words()
            .as_ptr()
            .cast::<u8>()
            .cast_mut()
            .wrapping_add(self.head)
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn words(&self) -> &[AtomicU64] {
        match &self.storage {
            Storage::Owned(b) => b,
            Storage::Borrowed(s) => s,
        }
    }

    /// Checks that `[offset, offset + len)` lies inside the region.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len as u64 => Ok(()),
            _ => Err(MemError::OutOfBounds),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the region.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, dst.len() as u64)?;
        let words = self.words();
        let mut pos = self.head + offset as usize; // fits: checked against len above
        let mut done = 0;
        // A partial first word.
        if !pos.is_multiple_of(8) && !dst.is_empty() {
            let in_word = pos % 8;
            let n = (8 - in_word).min(dst.len());
            let w = words[pos / 8].load(Relaxed).to_ne_bytes();
            dst[..n].copy_from_slice(&w[in_word..in_word + n]);
            done += n;
            pos += n;
        }
        // Whole words, vector-wide.
        let whole = (dst.len() - done) / 8;
        let first = pos / 8;
        words::load(
            &words[first..first + whole],
            &mut dst[done..done + whole * 8],
        );
        done += whole * 8;
        pos += whole * 8;
        // A partial last word.
        if done < dst.len() {
            let n = dst.len() - done;
            let w = words[pos / 8].load(Relaxed).to_ne_bytes();
            dst[done..].copy_from_slice(&w[..n]);
        }
        Ok(())
    }

    /// [`read`](Self::read), returning the CRC32C of the bytes `crc` was the CRC of followed
    /// by the bytes copied: in the same pass as the copy where the CPU can fold
    /// ([`braid_crc::copy_append`]), else over `dst` after it.
    pub fn read_crc(&self, offset: u64, dst: &mut [u8], crc: u32) -> Result<u32, MemError> {
        self.check(offset, dst.len() as u64)?;
        let pos = self.head + offset as usize; // fits: checked against len above
        // The bytes before the first whole word, the whole words, the bytes after them.
        let head = ((8 - pos % 8) % 8).min(dst.len());
        let whole = (dst.len() - head) / 8;
        let (first, rest) = dst.split_at_mut(head);
        let (middle, last) = rest.split_at_mut(whole * 8);
        self.read(offset, first)?;
        let mut crc = braid_crc::crc32c_append(crc, first);
        let at = (pos + head) / 8;
        crc = words::load_crc(&self.words()[at..at + whole], middle, crc);
        self.read(offset + (head + whole * 8) as u64, last)?;
        Ok(braid_crc::crc32c_append(crc, last))
    }

    /// The CRC32C of the bytes `crc` was the CRC of followed by the region's bytes
    /// `[offset, offset + len)`, read in place (no copy): how a datagram received straight
    /// into a region is checked ([`crate::Landing`]).
    pub fn crc(&self, offset: u64, len: usize, crc: u32) -> Result<u32, MemError> {
        self.check(offset, len as u64)?;
        let pos = self.head + offset as usize; // fits: checked against len above
        let head = ((8 - pos % 8) % 8).min(len);
        let whole = (len - head) / 8;
        let mut edge = [0u8; 8];
        self.read(offset, &mut edge[..head])?;
        let mut crc = braid_crc::crc32c_append(crc, &edge[..head]);
        let at = (pos + head) / 8;
        crc = words::crc(&self.words()[at..at + whole], crc);
        let tail = len - head - whole * 8;
        self.read(offset + (head + whole * 8) as u64, &mut edge[..tail])?;
        Ok(braid_crc::crc32c_append(crc, &edge[..tail]))
    }

    /// Copies `src` into the region starting at `offset`.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), MemError> {
        self.check(offset, src.len() as u64)?;
        let words = self.words();
        let mut pos = self.head + offset as usize; // fits: checked against len above
        let mut done = 0;
        // A partial first word.
        if !pos.is_multiple_of(8) && done < src.len() {
            let in_word = pos % 8;
            let n = (8 - in_word).min(src.len());
            merge_word(&words[pos / 8], in_word, &src[..n]);
            done += n;
            pos += n;
        }
        // Whole words, vector-wide.
        let whole = (src.len() - done) / 8;
        let first = pos / 8;
        words::store(&words[first..first + whole], &src[done..done + whole * 8]);
        done += whole * 8;
        pos += whole * 8;
        // A partial last word.
        if done < src.len() {
            merge_word(&words[pos / 8], 0, &src[done..]);
        }
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), MemError> {
        self.check(offset, len)?;
        let chunk = [byte; 4096];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk.len() as u64);
            self.write(offset + done, &chunk[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    fn atomic_word(&self, offset: u64) -> Result<&AtomicU64, MemError> {
        self.check(offset, 8)?;
        let pos = self.head + offset as usize;
        if !pos.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        Ok(&self.words()[pos / 8])
    }

    /// Atomically adds `add` to the native-endian u64 at `offset`; returns the old value.
    pub fn fetch_add(&self, offset: u64, add: u64) -> Result<u64, MemError> {
        Ok(self
            .atomic_word(offset)?
            .fetch_add(add, core::sync::atomic::Ordering::AcqRel))
    }

    /// Atomically replaces the u64 at `offset` with `swap` if it equals `compare`; returns the
    /// old value either way.
    pub fn compare_swap(&self, offset: u64, compare: u64, swap: u64) -> Result<u64, MemError> {
        let w = self.atomic_word(offset)?;
        use core::sync::atomic::Ordering::{AcqRel, Acquire};
        Ok(match w.compare_exchange(compare, swap, AcqRel, Acquire) {
            Ok(v) | Err(v) => v,
        })
    }

    /// Atomically loads the u64 at `offset`.
    pub fn load_u64(&self, offset: u64) -> Result<u64, MemError> {
        Ok(self
            .atomic_word(offset)?
            .load(core::sync::atomic::Ordering::Acquire))
    }

    /// Copies the region's bytes `[offset, offset+len)` into a new vector.
    pub fn to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>, MemError> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }
}

/// Replaces bytes `[at, at + src.len())` of one word, leaving its other bytes as they are even
/// if another thread changes them meanwhile.
fn merge_word(word: &AtomicU64, at: usize, src: &[u8]) {
    let mut cur = word.load(Relaxed);
    loop {
        let mut b = cur.to_ne_bytes();
        b[at..at + src.len()].copy_from_slice(src);
        match word.compare_exchange_weak(cur, u64::from_ne_bytes(b), Relaxed, Relaxed) {
            Ok(_) => return,
            Err(v) => cur = v,
        }
    }
}

/// Whole-word copies between a region's words and plain bytes.
///
/// Every access to a region is an access to aligned 64-bit atomic words (see the module
/// documentation). The portable form is one relaxed atomic load or store per word, which
/// the compiler may not merge or vectorise: 8 bytes per instruction. On x86-64 the copies
/// below are `asm!` loops of unaligned 16-byte (SSE2, every x86-64 CPU) or 32-byte (AVX,
/// detected at run time) vector loads and stores over the same words (the portable loop
/// under Miri, which cannot run assembly, and on other architectures). Inline assembly is
/// opaque to the Rust abstract machine: it may perform any access that Rust code holding
/// the same pointers could perform, here a relaxed atomic load or store of each word in
/// turn, which is what the hardware does for each aligned 8-byte part of a vector access
/// (x86 never tears an aligned 8-byte part: a concurrent writer's word is seen whole, old
/// or new). So a concurrent access from the application or another thread is as defined
/// as it is with the portable loop; as with RDMA hardware, a reader racing a writer may see
/// some old and some new words.
#[allow(unsafe_code)] // Memory registration: copies into and out of registered words.
mod words {
    use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// Copies the words into `dst`, whose length is 8 times theirs.
    #[inline]
    pub(super) fn load(words: &[AtomicU64], dst: &mut [u8]) {
        assert_eq!(words.len() * 8, dst.len(), "whole words");
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if dst.len() >= 32 {
            // SAFETY: `words` is valid for reads of `dst.len()` bytes (a live slice of that
            // many bytes' words) and `dst` for writes of as many (asserted above); the two
            // do not overlap (`dst` is an exclusive borrow of plain bytes, the words are
            // atomics that no `&mut [u8]` can alias). The assembly reads the words as the
            // relaxed atomic loads the portable loop below does (see the module comment).
            unsafe { x86::copy(dst.as_mut_ptr(), words.as_ptr().cast::<u8>(), dst.len()) };
            return;
        }
        for (w, chunk) in words.iter().zip(dst.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Relaxed).to_ne_bytes());
        }
    }

    /// [`load`], returning the CRC32C of the bytes `crc` was the CRC of followed by the
    /// words' bytes: folded from the loaded values in the copy's pass where the CPU can.
    #[inline]
    pub(super) fn load_crc(words: &[AtomicU64], dst: &mut [u8], crc: u32) -> u32 {
        assert_eq!(words.len() * 8, dst.len(), "whole words");
        // SAFETY: as in `load` (`words` readable and `dst` writable for `dst.len()` bytes,
        // not overlapping); `copy_append` reads the words only by assembly vector and word
        // loads, the relaxed atomic loads of the module comment.
        let folded = unsafe {
            braid_crc::copy_append(
                crc,
                dst.as_mut_ptr(),
                words.as_ptr().cast::<u8>(),
                dst.len(),
            )
        };
        match folded {
            Some(c) => c,
            None => {
                load(words, dst);
                braid_crc::crc32c_append(crc, dst)
            }
        }
    }

    /// The CRC32C of the bytes `crc` was the CRC of followed by the words' bytes, read in
    /// place: folded by vector loads where the CPU can, else through a small buffer.
    pub(super) fn crc(words: &[AtomicU64], crc: u32) -> u32 {
        let len = words.len() * 8;
        // SAFETY: `words` is readable for `len` bytes (a live slice of that many bytes'
        // words); `append_words` reads them only by assembly vector and word loads, the
        // relaxed atomic loads of the module comment.
        if let Some(c) = unsafe { braid_crc::append_words(crc, words.as_ptr().cast::<u8>(), len) } {
            return c;
        }
        let mut buf = [0u8; 512];
        let mut crc = crc;
        for chunk in words.chunks(buf.len() / 8) {
            let bytes = &mut buf[..chunk.len() * 8];
            load(chunk, bytes);
            crc = braid_crc::crc32c_append(crc, bytes);
        }
        crc
    }

    /// Copies `src`, whose length is 8 times theirs, into the words.
    #[inline]
    pub(super) fn store(words: &[AtomicU64], src: &[u8]) {
        assert_eq!(words.len() * 8, src.len(), "whole words");
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if src.len() >= 32 {
            // SAFETY: `src` is valid for reads of `src.len()` bytes and `words` for writes
            // of as many (asserted above; atomics are writable through a shared reference);
            // they do not overlap (`src` is a shared borrow of plain bytes, which no atomic
            // word aliases). The assembly writes the words as the relaxed atomic stores the
            // portable loop below does (see the module comment).
            unsafe {
                x86::copy(
                    words.as_ptr().cast::<u8>().cast_mut(),
                    src.as_ptr(),
                    src.len(),
                )
            };
            return;
        }
        for (w, chunk) in words.iter().zip(src.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Relaxed);
        }
    }

    #[cfg(all(target_arch = "x86_64", not(miri)))]
    mod x86 {
        use core::arch::asm;
        use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

        /// 0: not probed yet, 1: SSE2 only, 2: AVX.
        static LEVEL: AtomicU8 = AtomicU8::new(0);

        fn avx() -> bool {
            match LEVEL.load(Relaxed) {
                0 => {
                    let avx = std::arch::is_x86_feature_detected!("avx");
                    LEVEL.store(if avx { 2 } else { 1 }, Relaxed);
                    avx
                }
                l => l == 2,
            }
        }

        /// Copies `len` bytes (a multiple of 8) from `src` to `dst`.
        ///
        /// # Safety
        /// `src` valid for reads and `dst` for writes of `len` bytes, not overlapping.
        #[inline]
        pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
            debug_assert!(len.is_multiple_of(8));
            if avx() {
                // SAFETY: the caller's contract; this CPU has AVX (probed above).
                unsafe { copy_avx(dst, src, len) }
            } else {
                // SAFETY: the caller's contract; SSE2 is part of x86-64.
                unsafe { copy_sse2(dst, src, len) }
            }
        }

        /// 64 bytes a step in four 16-byte vectors, then 8-byte words.
        ///
        /// # Safety
        /// As [`copy`].
        unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize) {
            // SAFETY: reads `len` bytes at `src` and writes `len` bytes at `dst` (the caller's
            // contract makes both valid), touching no other memory and no stack; `len` is a
            // multiple of 8, so the word loop ends exactly at `len`.
            unsafe {
                asm!(
                    "cmp {n}, 64",
                    "jb 3f",
                    "2:",
                    "movdqu {a}, xmmword ptr [{s}]",
                    "movdqu {b}, xmmword ptr [{s} + 16]",
                    "movdqu {c}, xmmword ptr [{s} + 32]",
                    "movdqu {e}, xmmword ptr [{s} + 48]",
                    "movdqu xmmword ptr [{d}], {a}",
                    "movdqu xmmword ptr [{d} + 16], {b}",
                    "movdqu xmmword ptr [{d} + 32], {c}",
                    "movdqu xmmword ptr [{d} + 48], {e}",
                    "add {s}, 64",
                    "add {d}, 64",
                    "sub {n}, 64",
                    "cmp {n}, 64",
                    "jae 2b",
                    "3:",
                    "test {n}, {n}",
                    "jz 5f",
                    "4:",
                    "mov {t}, qword ptr [{s}]",
                    "mov qword ptr [{d}], {t}",
                    "add {s}, 8",
                    "add {d}, 8",
                    "sub {n}, 8",
                    "jnz 4b",
                    "5:",
                    s = inout(reg) src => _,
                    d = inout(reg) dst => _,
                    n = inout(reg) len => _,
                    t = out(reg) _,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    e = out(xmm_reg) _,
                    options(nostack),
                );
            }
        }

        /// 128 bytes a step in four 32-byte vectors, then 32, then 8-byte words.
        ///
        /// # Safety
        /// As [`copy`], and the CPU has AVX.
        #[target_feature(enable = "avx")]
        unsafe fn copy_avx(dst: *mut u8, src: *const u8, len: usize) {
            // SAFETY: as in `copy_sse2`; `vzeroupper` at the end clears the upper halves of
            // the vector registers (no live Rust value uses them across the block) so later
            // SSE code pays no transition penalty.
            unsafe {
                asm!(
                    "cmp {n}, 128",
                    "jb 3f",
                    "2:",
                    "vmovdqu {a}, ymmword ptr [{s}]",
                    "vmovdqu {b}, ymmword ptr [{s} + 32]",
                    "vmovdqu {c}, ymmword ptr [{s} + 64]",
                    "vmovdqu {e}, ymmword ptr [{s} + 96]",
                    "vmovdqu ymmword ptr [{d}], {a}",
                    "vmovdqu ymmword ptr [{d} + 32], {b}",
                    "vmovdqu ymmword ptr [{d} + 64], {c}",
                    "vmovdqu ymmword ptr [{d} + 96], {e}",
                    "add {s}, 128",
                    "add {d}, 128",
                    "sub {n}, 128",
                    "cmp {n}, 128",
                    "jae 2b",
                    "3:",
                    "cmp {n}, 32",
                    "jb 6f",
                    "7:",
                    "vmovdqu {a}, ymmword ptr [{s}]",
                    "vmovdqu ymmword ptr [{d}], {a}",
                    "add {s}, 32",
                    "add {d}, 32",
                    "sub {n}, 32",
                    "cmp {n}, 32",
                    "jae 7b",
                    "6:",
                    "test {n}, {n}",
                    "jz 5f",
                    "4:",
                    "mov {t}, qword ptr [{s}]",
                    "mov qword ptr [{d}], {t}",
                    "add {s}, 8",
                    "add {d}, 8",
                    "sub {n}, 8",
                    "jnz 4b",
                    "5:",
                    "vzeroupper",
                    s = inout(reg) src => _,
                    d = inout(reg) dst => _,
                    n = inout(reg) len => _,
                    t = out(reg) _,
                    a = out(ymm_reg) _,
                    b = out(ymm_reg) _,
                    c = out(ymm_reg) _,
                    e = out(ymm_reg) _,
                    options(nostack),
                );
            }
        }

        /// The SSE2 path, for the tests on an AVX machine.
        #[cfg(test)]
        pub(crate) fn copy_sse2_for_test(dst: &mut [u8], src: &[u8]) {
            assert_eq!(dst.len(), src.len());
            assert!(src.len().is_multiple_of(8));
            // SAFETY: two distinct slices of `len` bytes.
            unsafe { copy_sse2(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
        }
    }

    #[cfg(all(test, target_arch = "x86_64", not(miri)))]
    pub(crate) use x86::copy_sse2_for_test;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_region_starts_on_the_boundary_and_reads_back() {
        for len in [0, 1, 4095, 4096, 10_000] {
            let r = Region::new_aligned(len, 4096);
            assert_eq!(r.as_ptr() as usize % 4096, 0, "len {len}");
            assert_eq!(r.len(), len);
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            r.write(0, &data).unwrap();
            let mut back = vec![0; len];
            r.read(0, &mut back).unwrap();
            assert_eq!(back, data);
            assert_eq!(r.check(0, len as u64 + 1), Err(MemError::OutOfBounds));
        }
    }

    /// `read_crc` copies what `read` copies and returns the CRC32C of `crc`'s bytes followed
    /// by them, at every alignment, for lengths on both sides of the one-pass copy's minimum.
    #[test]
    fn read_crc_copies_and_checksums_at_any_alignment() {
        let size = 3000usize;
        let r = Region::new(size);
        let data: Vec<u8> = (0..size)
            .map(|i| (i.wrapping_mul(131) >> 3) as u8)
            .collect();
        r.write(0, &data).unwrap();
        for off in 0..9usize {
            for len in [0, 5, 64, 255, 256, 263, 264, 1408, 1409, 2900] {
                let mut got = vec![0u8; len];
                let crc = r.read_crc(off as u64, &mut got, 0x1234_5678).unwrap();
                let want = &data[off..off + len];
                assert_eq!(got, want, "offset {off}, length {len}");
                assert_eq!(
                    crc,
                    crc32c::crc32c_append(0x1234_5678, want),
                    "offset {off}, length {len}"
                );
            }
        }
        let mut over = vec![0u8; 10];
        assert_eq!(
            r.read_crc(size as u64 - 5, &mut over, 0),
            Err(MemError::OutOfBounds)
        );
    }

    /// `crc` returns what `read_crc` does, without the copy, at every alignment and at
    /// lengths on both sides of the in-place fold's minimum.
    #[test]
    fn crc_in_place_agrees_with_the_copying_crc() {
        let size = 3000usize;
        let r = Region::new(size);
        let data: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(97) >> 2) as u8).collect();
        r.write(0, &data).unwrap();
        for off in 0..9usize {
            for len in [0, 3, 8, 64, 255, 256, 263, 264, 1408, 1409, 2900] {
                let want = crc32c::crc32c_append(0xDEAD_BEEF, &data[off..off + len]);
                assert_eq!(
                    r.crc(off as u64, len, 0xDEAD_BEEF),
                    Ok(want),
                    "offset {off}, length {len}"
                );
            }
        }
        assert_eq!(r.crc(size as u64 - 5, 10, 0), Err(MemError::OutOfBounds));
    }

    #[test]
    fn read_write_any_alignment() {
        let r = Region::new(37);
        for off in 0..10u64 {
            for len in 0..20usize {
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(7) ^ off as u8)
                    .collect();
                r.fill(0, 37, 0xAA).unwrap();
                r.write(off, &data).unwrap();
                let all = r.to_vec(0, 37).unwrap();
                assert_eq!(&all[off as usize..off as usize + len], &data[..]);
                assert!(all[..off as usize].iter().all(|&b| b == 0xAA));
                assert!(all[off as usize + len..].iter().all(|&b| b == 0xAA));
            }
        }
    }

    /// Copies of many words, at every alignment, with remainders of every word count: `read`
    /// and `write` agree with a plain byte array.
    #[test]
    fn long_copies_match_a_byte_array_at_any_alignment() {
        let size = 200usize;
        let r = Region::new(size);
        let mut oracle = vec![0x5Au8; size];
        r.fill(0, size as u64, 0x5A).unwrap();
        for off in 0..10usize {
            for len in [
                0, 1, 7, 8, 9, 24, 31, 32, 33, 40, 63, 64, 65, 72, 100, 150, 190,
            ] {
                if off + len > size {
                    continue;
                }
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(13) ^ (off as u8).wrapping_add(len as u8))
                    .collect();
                r.write(off as u64, &data).unwrap();
                oracle[off..off + len].copy_from_slice(&data);
                assert_eq!(r.to_vec(0, size).unwrap(), oracle, "write {off}+{len}");
                let mut back = vec![0u8; len];
                r.read(off as u64, &mut back).unwrap();
                assert_eq!(back, data, "read {off}+{len}");
            }
        }
    }

    /// The vector copies against a byte array: every length in the edge list (and random
    /// ones) at every start alignment, in a region whose own start is unaligned too (a
    /// caller registration at an odd address); bytes outside the copied range stay as they
    /// were, on both sides.
    #[test]
    #[allow(unsafe_code)] // Registers a test buffer at an odd address through `from_raw`.
    fn vector_copies_match_bytes_at_every_edge() {
        const SIZE: usize = 4096 + 200;
        let mut backing = vec![0u64; SIZE / 8 + 2];
        for head in [0usize, 3] {
            // SAFETY: `backing` outlives `r` (dropped at the end of each iteration) and is
            // touched only through `r` meanwhile.
            let r = unsafe { Region::from_raw(backing.as_mut_ptr().cast::<u8>().add(head), SIZE) };
            let mut oracle = vec![0xC3u8; SIZE];
            r.fill(0, SIZE as u64, 0xC3).unwrap();
            for len in [
                0usize, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1408, 4095, 4096,
            ] {
                for off in 0..9usize {
                    let data: Vec<u8> = (0..len)
                        .map(|i| (i as u8).wrapping_mul(29) ^ (len as u8) ^ (off as u8) << 4)
                        .collect();
                    r.write(off as u64, &data).unwrap();
                    oracle[off..off + len].copy_from_slice(&data);
                    assert!(
                        r.to_vec(0, SIZE).unwrap() == oracle,
                        "write {head}/{off}+{len}"
                    );
                    // Reads into a buffer with guard bytes on both sides.
                    let mut back = vec![0xEEu8; len + 2];
                    r.read(off as u64, &mut back[1..=len]).unwrap();
                    assert_eq!(&back[1..=len], &data[..], "read {head}/{off}+{len}");
                    assert_eq!((back[0], back[len + 1]), (0xEE, 0xEE), "guards {off}+{len}");
                }
            }
            drop(r);
        }
    }

    proptest::proptest! {
        /// Random offsets and lengths: `write` then `read` agree with a byte array, and the
        /// bytes around the written range are kept.
        #[test]
        fn random_copies_match_a_byte_array(
            ops in proptest::collection::vec((0usize..600, 0usize..700, proptest::num::u8::ANY), 1..20)
        ) {
            const SIZE: usize = 1300;
            let r = Region::new(SIZE);
            let mut oracle = vec![0u8; SIZE];
            for (off, len, seed) in ops {
                let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed | 1) ^ seed).collect();
                r.write(off as u64, &data).unwrap();
                oracle[off..off + len].copy_from_slice(&data);
                let mut back = vec![0u8; len];
                r.read(off as u64, &mut back).unwrap();
                proptest::prop_assert_eq!(&back, &data);
            }
            proptest::prop_assert!(r.to_vec(0, SIZE).unwrap() == oracle);
        }
    }

    /// The SSE2 loop (taken on CPUs without AVX) against `copy_from_slice`, whatever this
    /// CPU picks for `read` and `write`.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    #[test]
    fn the_sse2_copy_matches_a_plain_copy() {
        for len in (0..=520).step_by(8).chain([1400, 4088, 4096]) {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut dst = vec![0u8; len + 8];
            words::copy_sse2_for_test(&mut dst[..len], &src);
            assert_eq!(&dst[..len], &src[..], "len {len}");
            assert!(
                dst[len..].iter().all(|&b| b == 0),
                "past the end, len {len}"
            );
        }
    }

    #[test]
    fn bounds_and_alignment_are_checked() {
        let r = Region::new(16);
        assert_eq!(r.write(10, &[0; 7]), Err(MemError::OutOfBounds));
        assert_eq!(r.read(u64::MAX, &mut [0; 2]), Err(MemError::OutOfBounds));
        assert_eq!(r.fetch_add(4, 1), Err(MemError::Misaligned));
        assert_eq!(r.fetch_add(16, 1), Err(MemError::OutOfBounds));
        assert_eq!(r.fetch_add(8, 5), Ok(0));
        assert_eq!(r.compare_swap(8, 5, 9), Ok(5));
        assert_eq!(r.compare_swap(8, 5, 1), Ok(9));
        assert_eq!(r.load_u64(8), Ok(9));
    }

    #[test]
    #[allow(unsafe_code)] // Registers a test buffer through `from_raw`.
    fn raw_registration_respects_edges() {
        let mut backing = vec![0u64; 8];
        let base = backing.as_mut_ptr().cast::<u8>();
        // SAFETY: `backing` outlives `r` (dropped at the end of the test) and is not touched
        // while `r` is alive.
        let r = unsafe { Region::from_raw(base.wrapping_add(3), 40) };
        r.fill(0, 40, 0xFF).unwrap();
        let mut head = [0u8; 8];
        r.read(0, &mut head).unwrap();
        assert_eq!(head, [0xFF; 8]);
        drop(r);
        let bytes: Vec<u8> = backing.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(&bytes[..3], &[0, 0, 0]);
        assert!(bytes[3..43].iter().all(|&b| b == 0xFF));
        assert!(bytes[43..].iter().all(|&b| b == 0));
    }
}
