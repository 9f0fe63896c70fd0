//! Memory regions.
use core::ffi::c_void;

use braid_rt::{Access, MemError};

use crate::device::{clear_out, put};
use crate::error::*;
use crate::handle::{self, MrObj};
use crate::types::*;

fn access(bits: u32) -> Result<Access> {
    let all = BRAID_ACCESS_LOCAL_WRITE
        | BRAID_ACCESS_REMOTE_WRITE
        | BRAID_ACCESS_REMOTE_READ
        | BRAID_ACCESS_REMOTE_ATOMIC;
    if bits & !all != 0 {
        return Err(Error::new(
            BRAID_EINVAL,
            format!("unknown access bits {:#x}", bits & !all),
        ));
    }
    Ok(Access::from_bits_truncate(bits as u8))
}

fn mem_error(e: MemError, offset: u64, len: usize, mr_len: usize) -> Error {
    Error::new(
        BRAID_ERANGE,
        format!("{len} bytes at offset {offset} of a {mr_len}-byte region: {e:?}"),
    )
}

fn register(
    pd: *const braid_pd,
    out: *mut *mut braid_mr,
    library_owned: bool,
    make: impl FnOnce(
        &braid_rt::ProtectionDomain,
    ) -> std::result::Result<braid_rt::MemoryRegion, braid_rt::ResourceError>,
) -> Result<i32> {
    let p = handle::get(pd)?;
    let mr = make(&p.pd)?;
    let h = handle::insert::<braid_mr>(MrObj { mr, library_owned }, &[handle::token(pd)])?;
    // SAFETY: the exported caller checked `out` with clear_out, under its own contract.
    unsafe { put(out, h, "out")? };
    Ok(BRAID_OK)
}

/// Allocates a zero-filled region of `len` bytes (1 to `BRAID_MR_ALLOC_MAX`) owned by the
/// library and registers it with the rights in `access_flags` (`BRAID_ACCESS_*`). Read and write its bytes with
/// `braid_mr_read` and `braid_mr_write`; the network places data in it directly.
///
/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_mr_alloc(
    pd: *const braid_pd,
    len: usize,
    access_flags: u32,
    out: *mut *mut braid_mr,
) -> i32 {
    call("braid_mr_alloc", || {
        // SAFETY: the caller's contract.
        unsafe { clear_out(out, "out")? };
        let a = access(access_flags)?;
        if len == 0 || len as u64 > BRAID_MR_ALLOC_MAX {
            return Err(Error::new(
                BRAID_EINVAL,
                format!("len {len} is outside 1 to BRAID_MR_ALLOC_MAX"),
            ));
        }
        register(pd, out, true, |pd| pd.alloc_mr(len, a))
    })
}

/// Registers `len` bytes of the caller's memory at `addr` with the rights in `access_flags`
/// (`BRAID_ACCESS_*`).
///
/// The contract (the library cannot check it):
/// - `[addr, addr + len)`, rounded out to whole aligned 8-byte words, is readable and
///   writable memory that stays valid until `braid_mr_destroy` has returned **and** every
///   work request that used the region has completed (been polled).
/// - While it is registered, the network may read and write it at any moment (peers with its
///   rkey, and this side's receives, READs and atomics). Bytes a work request or a peer
///   writes are defined once the completion that covers them has been polled; do not change
///   bytes that an outstanding SEND or WRITE is gathering, nor bytes a peer may be writing.
///   The library itself only ever accesses the memory as aligned 8-byte atomic words, so
///   neighbouring bytes in the first and last word are never torn.
///
/// # Safety
/// As above; `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_mr_register(
    pd: *const braid_pd,
    addr: *mut c_void,
    len: usize,
    access_flags: u32,
    out: *mut *mut braid_mr,
) -> i32 {
    call("braid_mr_register", || {
        // SAFETY: the caller's contract.
        unsafe { clear_out(out, "out")? };
        non_null(addr, "addr")?;
        let a = access(access_flags)?;
        if len == 0 {
            return Err(Error::new(BRAID_EINVAL, "len is 0"));
        }
        // The words the region covers must not wrap around the address space.
        let end = (addr as usize)
            .checked_add(len)
            .and_then(|e| e.checked_add(7))
            .filter(|&e| e <= isize::MAX as usize);
        if end.is_none() {
            return Err(Error::new(
                BRAID_EINVAL,
                format!("{len} bytes at {addr:p} run past the end of the address space"),
            ));
        }
        register(pd, out, false, |pd| {
            // SAFETY: the caller's contract, stated above, is register_raw's.
            unsafe { pd.register_raw(addr.cast(), len, a) }
        })
    })
}

/// Deregisters a region: peers lose access at once. A library-owned region's memory is freed
/// once no outstanding work request uses it; the caller's memory may be reused after every
/// work request that used it has completed.
#[unsafe(no_mangle)]
pub extern "C" fn braid_mr_destroy(mr: *mut braid_mr) -> i32 {
    call("braid_mr_destroy", || {
        drop(handle::remove(mr)?);
        Ok(BRAID_OK)
    })
}

/// Fills `attr` with the region's keys, length and rights.
///
/// # Safety
/// `attr` must be NULL or point to a writable `braid_mr_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_mr_query(mr: *const braid_mr, attr: *mut braid_mr_attr) -> i32 {
    call("braid_mr_query", || {
        let m = handle::get(mr)?;
        let v = braid_mr_attr {
            lkey: m.mr.lkey(),
            rkey: m.mr.rkey(),
            length: m.mr.len() as u64,
            access: u32::from(m.mr.access().bits()),
            library_owned: u32::from(m.library_owned),
        };
        // SAFETY: the caller's contract.
        unsafe { put(attr, v, "attr")? };
        Ok(BRAID_OK)
    })
}

/// Copies `len` bytes at `offset` of the region into `dst` (which must not lie inside a
/// registered region). `BRAID_ERANGE` if they reach past its end.
///
/// # Safety
/// `dst` must be NULL or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_mr_read(
    mr: *const braid_mr,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> i32 {
    call("braid_mr_read", || {
        let m = handle::get(mr)?;
        if len == 0 {
            return Ok(BRAID_OK);
        }
        non_null(dst, "dst")?;
        if len > isize::MAX as usize {
            return Err(Error::new(BRAID_EINVAL, format!("len {len} is too large")));
        }
        // SAFETY: non-null, and writable for len bytes by the caller's contract; it is not
        // region memory, so nothing else accesses it meanwhile.
        let dst = unsafe { core::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        m.mr.read(offset, dst)
            .map_err(|e| mem_error(e, offset, len, m.mr.len()))?;
        Ok(BRAID_OK)
    })
}

/// Copies `len` bytes from `src` (which must not lie inside a registered region) to `offset`
/// of the region. `BRAID_ERANGE` if they reach past its end.
///
/// # Safety
/// `src` must be NULL or readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_mr_write(
    mr: *const braid_mr,
    offset: u64,
    src: *const c_void,
    len: usize,
) -> i32 {
    call("braid_mr_write", || {
        let m = handle::get(mr)?;
        if len == 0 {
            return Ok(BRAID_OK);
        }
        non_null(src, "src")?;
        if len > isize::MAX as usize {
            return Err(Error::new(BRAID_EINVAL, format!("len {len} is too large")));
        }
        // SAFETY: non-null, and readable for len bytes by the caller's contract; it is not
        // region memory, so nothing writes it meanwhile.
        let src = unsafe { core::slice::from_raw_parts(src.cast::<u8>(), len) };
        m.mr.write(offset, src)
            .map_err(|e| mem_error(e, offset, len, m.mr.len()))?;
        Ok(BRAID_OK)
    })
}
