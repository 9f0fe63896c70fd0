//! The UMEM: one page-aligned anonymous mapping cut into equal frames, shared by the kernel
//! (which copies received frames into it and reads frames to transmit from it) and us.
//!
//! Ownership of each frame passes back and forth through the rings: a frame we put on the
//! fill or TX ring belongs to the kernel until it comes back on the RX or completion ring.
//! Only frames we own are ever turned into slices.

use std::io;
use std::ptr::NonNull;

/// An owned memory mapping, unmapped on drop.
#[derive(Debug)]
pub(super) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory with no thread affinity; who may touch which bytes is
// decided by the ring protocol and the datapath's locks, not by the owning thread.
unsafe impl Send for Mmap {}
// SAFETY: as above; `Mmap` itself only hands out raw pointers.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Anonymous, private, zeroed memory of `len` bytes (page-aligned by mmap), populated up
    /// front so the kernel never faults while copying into it.
    pub(super) fn anonymous(len: usize) -> io::Result<Mmap> {
        // Miri models anonymous private mappings but not MAP_POPULATE (a performance hint).
        let populate = if cfg!(miri) { 0 } else { libc::MAP_POPULATE };
        Self::map(
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
            -1,
            0,
        )
    }

    /// The region of `len` bytes at page offset `offset` of socket `fd` (an AF_XDP ring).
    pub(super) fn socket_ring(fd: libc::c_int, len: usize, offset: u64) -> io::Result<Mmap> {
        Self::map(
            len,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            offset as libc::off_t,
        )
    }

    fn map(len: usize, flags: libc::c_int, fd: libc::c_int, off: libc::off_t) -> io::Result<Mmap> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint) aliases no Rust object; the
        // result is checked for MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mmap { ptr, len })
    }

    pub(super) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value created and nobody else unmaps.
        // Anything still using it (the kernel's pinned UMEM pages, ring mappings of a socket)
        // holds its own reference, so unmapping our view is always sound.
        unsafe { libc::munmap(self.ptr.as_ptr().cast::<libc::c_void>(), self.len) };
    }
}

/// The UMEM and its frame geometry.
#[derive(Debug)]
pub(super) struct Umem {
    map: Mmap,
    frame_size: u32,
}

impl Umem {
    /// `frames` frames of `frame_size` bytes (a power of two).
    pub(super) fn new(frames: u32, frame_size: u32) -> io::Result<Umem> {
        debug_assert!(frame_size.is_power_of_two());
        let len = frames as usize * frame_size as usize;
        Ok(Umem {
            map: Mmap::anonymous(len)?,
            frame_size,
        })
    }

    pub(super) fn base(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn frame_size(&self) -> u32 {
        self.frame_size
    }

    /// UMEM address of frame `index`.
    pub(super) fn frame_addr(&self, index: u32) -> u64 {
        u64::from(index) * u64::from(self.frame_size)
    }

    /// The start of the frame that UMEM address `addr` falls in (descriptors the kernel
    /// returns point past its headroom).
    pub(super) fn frame_base(&self, addr: u64) -> u64 {
        addr & !(u64::from(self.frame_size) - 1)
    }

    /// The bytes `addr..addr + len` for reading; see [`Umem::frame_mut`].
    ///
    /// # Safety
    /// As for [`Umem::frame_mut`], except that other shared slices of the frame may live.
    pub(super) unsafe fn frame(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let start = self.check(addr, len)?;
        // SAFETY: `start..start + len` lies within the mapping (`check`); the kernel not
        // writing it is the caller's contract.
        Some(unsafe { std::slice::from_raw_parts(self.base().add(start), len) })
    }

    /// The offset of `addr` if `addr..addr + len` stays inside the UMEM and one frame.
    fn check(&self, addr: u64, len: usize) -> Option<usize> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len)?;
        let frame_end = usize::try_from(self.frame_base(addr)).ok()? + self.frame_size as usize;
        if end > self.len() || end > frame_end {
            return None;
        }
        Some(start)
    }

    /// The bytes `addr..addr + len`, or `None` if they leave the UMEM or cross a frame.
    ///
    /// # Safety
    /// The frame holding `addr` must be owned by the caller (taken off the RX or completion
    /// ring, or never given to the kernel) for as long as the slice lives, so the kernel does
    /// not write it meanwhile, and no other slice of that frame may be live.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn frame_mut(&self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let start = self.check(addr, len)?;
        // SAFETY: `start..start + len` lies within the mapping (checked above); exclusivity and the
        // kernel not writing it are the caller's contract.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base().add(start), len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_handed_out_only_inside_the_umem_and_one_frame() {
        let umem = Umem::new(4, 2048).unwrap();
        assert_eq!(umem.len(), 4 * 2048);
        // SAFETY: nothing else (no kernel, no other slice) uses this UMEM.
        unsafe {
            let f = umem
                .frame_mut(umem.frame_addr(3) + 100, 1948)
                .expect("to frame end");
            f.fill(7);
            assert!(
                umem.frame(umem.frame_addr(3) + 100, 1949).is_none(),
                "crosses the end"
            );
            assert!(
                umem.frame(umem.frame_addr(1) + 2000, 100).is_none(),
                "crosses a frame"
            );
            assert!(umem.frame(u64::MAX - 2, 8).is_none(), "wraps");
            assert!(umem.frame(4 * 2048, 1).is_none(), "past the end");
            let back = umem
                .frame(umem.frame_addr(3) + 100, 1948)
                .expect("same frame");
            assert!(back.iter().all(|&b| b == 7));
            assert_eq!(umem.frame_base(umem.frame_addr(2) + 77), umem.frame_addr(2));
        }
    }
}
