//! Return codes, the thread-local last-error message and the panic barrier.
use core::ffi::c_char;
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};

use braid_rt::{PostError, ResourceError};

/// Success.
pub const BRAID_OK: i32 = 0;
/// No such key: an lkey or rkey this device does not know (-ENOENT).
pub const BRAID_ENOENT: i32 = -2;
/// The datapath could not be opened or failed (-EIO); the message has the OS error.
pub const BRAID_EIO: i32 = -5;
/// Not a live handle of the expected kind: never created, already destroyed, or a handle of
/// another kind (-EBADF).
pub const BRAID_EBADF: i32 = -9;
/// The work queue is full; poll completions and post again (-EAGAIN).
pub const BRAID_EAGAIN: i32 = -11;
/// Out of memory or a resource limit (QPs, queue depths, region size) reached (-ENOMEM).
pub const BRAID_ENOMEM: i32 = -12;
/// Access refused: a region lacks the right an operation needs, or belongs to another
/// protection domain or device (-EACCES).
pub const BRAID_EACCES: i32 = -13;
/// A required pointer argument is NULL (-EFAULT).
pub const BRAID_EFAULT: i32 = -14;
/// No such device: `BRAID_BACKEND_VERBS` without rdma-core, without an RDMA device (ENOSYS
/// or ENODEV from the kernel), with an unknown `verbs_device`, a port that is down, or a
/// library built without verbs support (-ENODEV).
pub const BRAID_ENODEV: i32 = -19;
/// The object still has children (a device with PDs or CQs, a PD with regions or QPs, a CQ
/// with QPs): destroy them first (-EBUSY).
pub const BRAID_EBUSY: i32 = -16;
/// An invalid argument: unknown enum value or flag, bad size, unparsable address (-EINVAL).
pub const BRAID_EINVAL: i32 = -22;
/// The caller's buffer is too small (-ENOSPC).
pub const BRAID_ENOSPC: i32 = -28;
/// An offset and length reach outside the memory region (-ERANGE).
pub const BRAID_ERANGE: i32 = -34;
/// A connection blob that is not valid QP information, or a peer Braid cannot connect to
/// (encryption on one side only, an unusable public key) (-EPROTO).
pub const BRAID_EPROTO: i32 = -71;
/// The QP is in the wrong state for this (e.g. connecting twice) (-EBADFD).
pub const BRAID_EBADFD: i32 = -77;
/// `post_send` before `braid_qp_connect` (-ENOTCONN).
pub const BRAID_ENOTCONN: i32 = -107;
/// An internal error: the library caught a panic and the call did nothing further
/// (-ENOTRECOVERABLE). Please report it with the message.
pub const BRAID_EINTERNAL: i32 = -131;

/// A failed call: the code it returns and the message `braid_last_error` shows.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) code: i32,
    pub(crate) msg: String,
}

impl Error {
    pub(crate) fn new(code: i32, msg: impl Into<String>) -> Error {
        Error {
            code,
            msg: msg.into(),
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// Fails with `BRAID_EFAULT` when `p` is null.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        Err(Error::new(BRAID_EFAULT, format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        let code = match e {
            PostError::UnknownQp => BRAID_EBADF,
            PostError::NotConnected => BRAID_ENOTCONN,
            PostError::QueueFull => BRAID_EAGAIN,
            PostError::TooManySges => BRAID_EINVAL,
            PostError::InvalidLkey => BRAID_ENOENT,
            PostError::WrongPd | PostError::NoLocalWrite => BRAID_EACCES,
            PostError::OutOfBounds => BRAID_ERANGE,
            PostError::BadAtomic => BRAID_EINVAL,
            _ => BRAID_EINVAL,
        };
        Error::new(code, e.to_string())
    }
}

impl From<ResourceError> for Error {
    fn from(e: ResourceError) -> Error {
        let code = match e {
            ResourceError::UnknownPd | ResourceError::UnknownCq | ResourceError::UnknownQp => {
                BRAID_EBADF
            }
            ResourceError::UnknownMr => BRAID_ENOENT,
            ResourceError::BadState => BRAID_EBADFD,
            ResourceError::Limit => BRAID_ENOMEM,
            ResourceError::Busy => BRAID_EBUSY,
            ResourceError::EncryptionMismatch | ResourceError::BadPeerKey => BRAID_EPROTO,
            ResourceError::Entropy => BRAID_EIO,
            _ => BRAID_EINVAL,
        };
        Error::new(code, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::from(c"no error"));
}

fn set_last_error(msg: String) {
    let msg = CString::new(msg.replace('\0', "?")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

/// Runs an exported function's body: returns its value, or records the error's message and
/// returns its code; a panic becomes `BRAID_EINTERNAL`.
pub(crate) fn call(name: &str, f: impl FnOnce() -> Result<i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {}", e.msg));
            e.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(format!("{name}: internal error (caught a panic: {what})"));
            BRAID_EINTERNAL
        }
    }
}

/// The message of the most recent failed call on this thread ("no error" before any). A
/// successful call leaves it as it was. The string belongs to the library and stays valid
/// until the next failing call on the same thread.
#[unsafe(no_mangle)]
pub extern "C" fn braid_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr())).unwrap_or(c"internal error".as_ptr())
}

/// A static description of a `BRAID_E*` return code (or "unknown error code").
#[unsafe(no_mangle)]
pub extern "C" fn braid_strerror(code: i32) -> *const c_char {
    match code {
        BRAID_OK => c"success",
        BRAID_ENOENT => c"no such key",
        BRAID_EIO => c"datapath error",
        BRAID_EBADF => c"not a live handle of this kind",
        BRAID_EAGAIN => c"work queue full",
        BRAID_ENOMEM => c"out of memory or resource limit reached",
        BRAID_EACCES => c"access refused",
        BRAID_EFAULT => c"NULL pointer argument",
        BRAID_EBUSY => c"object still has children",
        BRAID_ENODEV => c"no usable RDMA device",
        BRAID_EINVAL => c"invalid argument",
        BRAID_ENOSPC => c"buffer too small",
        BRAID_ERANGE => c"outside the memory region",
        BRAID_EPROTO => c"invalid connection information",
        BRAID_EBADFD => c"queue pair in the wrong state",
        BRAID_ENOTCONN => c"queue pair not connected",
        BRAID_EINTERNAL => c"internal error",
        _ => c"unknown error code",
    }
    .as_ptr()
}

/// The version of the library, e.g. "0.1.0" (static).
#[unsafe(no_mangle)]
pub extern "C" fn braid_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: braid_last_error returns a valid NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(braid_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn codes_are_the_linux_errno_values() {
        let pairs = [
            (BRAID_ENOENT, libc::ENOENT),
            (BRAID_EIO, libc::EIO),
            (BRAID_EBADF, libc::EBADF),
            (BRAID_EAGAIN, libc::EAGAIN),
            (BRAID_ENOMEM, libc::ENOMEM),
            (BRAID_EACCES, libc::EACCES),
            (BRAID_EFAULT, libc::EFAULT),
            (BRAID_EBUSY, libc::EBUSY),
            (BRAID_ENODEV, libc::ENODEV),
            (BRAID_EINVAL, libc::EINVAL),
            (BRAID_ENOSPC, libc::ENOSPC),
            (BRAID_ERANGE, libc::ERANGE),
            (BRAID_EPROTO, libc::EPROTO),
            (BRAID_EBADFD, libc::EBADFD),
            (BRAID_ENOTCONN, libc::ENOTCONN),
            (BRAID_EINTERNAL, libc::ENOTRECOVERABLE),
        ];
        for (ours, errno) in pairs {
            assert_eq!(ours, -errno);
            // SAFETY: braid_strerror returns a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(braid_strerror(ours)) };
            assert_ne!(s.to_str().unwrap(), "unknown error code");
        }
    }

    #[test]
    fn a_panic_becomes_an_error_code_and_a_message() {
        let r = call("braid_test", || panic!("boom {}", 42));
        assert_eq!(r, BRAID_EINTERNAL);
        assert!(last().contains("braid_test: internal error"), "{}", last());
        assert!(last().contains("boom 42"), "{}", last());
    }

    #[test]
    fn an_error_sets_the_message_and_success_keeps_it() {
        assert_eq!(
            call("braid_x", || Err(Error::new(BRAID_EINVAL, "bad \0 thing"))),
            BRAID_EINVAL
        );
        assert_eq!(last(), "braid_x: bad ? thing");
        assert_eq!(call("braid_y", || Ok(3)), 3);
        assert_eq!(last(), "braid_x: bad ? thing");
    }

    #[test]
    fn the_version_matches_the_crate() {
        // SAFETY: a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(braid_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
