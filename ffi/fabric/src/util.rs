//! Helpers shared by the ops: panic guards, error codes, socket addresses.
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::fi;

/// `-FI_<code>` as the `int` most ops return.
pub(crate) const fn neg(code: u32) -> i32 {
    -(code as i32)
}

/// Runs `f`, turning a panic into `-FI_EOTHER`: no panic crosses into C.
pub(crate) fn guard(f: impl FnOnce() -> i32) -> i32 {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(neg(fi::FI_EOTHER))
}

/// [`guard`] for the ops that return `ssize_t`.
pub(crate) fn guard_sz(f: impl FnOnce() -> isize) -> isize {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-(fi::FI_EOTHER as isize))
}

/// A sockaddr_in for `addr` (IPv4 only: the provider's address format is FI_SOCKADDR_IN).
pub(crate) fn to_sockaddr_in(addr: SocketAddr) -> libc::sockaddr_in {
    let (ip, port) = match addr {
        SocketAddr::V4(a) => (*a.ip(), a.port()),
        SocketAddr::V6(a) => (
            a.ip().to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
            a.port(),
        ),
    };
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Reads a sockaddr_in from `len` bytes at `p`; `None` if too short or not AF_INET.
///
/// # Safety
/// `p` is null or points to `len` readable bytes.
pub(crate) unsafe fn from_sockaddr(p: *const u8, len: usize) -> Option<SocketAddr> {
    if p.is_null() || len < std::mem::size_of::<libc::sockaddr_in>() {
        return None;
    }
    // SAFETY: `p` has at least size_of::<sockaddr_in>() readable bytes (checked above and by
    // the caller's contract); read_unaligned needs no alignment.
    let sa: libc::sockaddr_in = unsafe { std::ptr::read_unaligned(p.cast()) };
    if i32::from(sa.sin_family) != libc::AF_INET {
        return None;
    }
    Some(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    )))
}

/// Copies `s` into a `malloc`ed C string (libfabric frees fi_info strings with `free`).
pub(crate) fn c_strdup(s: &str) -> *mut libc::c_char {
    let bytes = s.as_bytes();
    // SAFETY: malloc of len+1 bytes; checked for null before use.
    let p = unsafe { libc::malloc(bytes.len() + 1) }.cast::<u8>();
    if p.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `p` has len+1 writable bytes; `bytes` does not overlap a fresh allocation.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        *p.add(bytes.len()) = 0;
    }
    p.cast()
}

/// Reads a C string, `None` for null or non-UTF-8.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const libc::c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_str().ok()
}

/// The interfaces with an IPv4 address that is up: (name, address), loopback last.
pub(crate) fn interfaces() -> Vec<(String, Ipv4Addr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family we check
        // before reading it as sockaddr_in.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let Some(SocketAddr::V4(a)) = (unsafe {
            from_sockaddr(
                ifa.ifa_addr.cast(),
                std::mem::size_of::<libc::sockaddr_in>(),
            )
        }) else {
            continue;
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { c_str(ifa.ifa_name) }.unwrap_or("").to_string();
        out.push((name, *a.ip()));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort_by_key(|(_, ip)| ip.is_loopback());
    out
}

/// The MTU of the interface that holds address `ip` (IPv4 only), from `SIOCGIFMTU` (which
/// answers for the caller's network namespace), or `None` if no up interface holds it.
pub(crate) fn interface_mtu(ip: Ipv4Addr) -> Option<u32> {
    let (name, _) = interfaces().into_iter().find(|(_, a)| *a == ip)?;
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: a plain socket() call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `req` is a live, writable ifreq with a NUL-terminated name, the argument
    // SIOCGIFMTU takes; `fd` is the socket opened above.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req as *mut libc::ifreq) };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU succeeded, so it filled the ifru_mtu member of the union.
    u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).ok()
}

/// The UDP payload that fits one IPv4 packet on a link of `mtu` bytes (20 bytes of IP header,
/// 8 of UDP), at most 65507, the largest UDP datagram.
pub(crate) fn datagram_for_mtu(mtu: u32) -> usize {
    (mtu as usize).saturating_sub(28).min(65_507)
}

/// The libfabric error code for a Braid completion status.
pub(crate) fn wc_errno(s: braid::WcStatus) -> u32 {
    use braid::WcStatus::*;
    match s {
        Success => 0,
        LocalLengthError => fi::FI_ETRUNC,
        LocalProtectionError => fi::FI_EFAULT,
        RemoteAccessError => fi::FI_EACCES,
        RemoteInvalidRequest => fi::FI_EINVAL,
        RemoteOperationError => fi::FI_EREMOTEIO,
        RetryExceeded | RnrRetryExceeded => fi::FI_ETIMEDOUT,
        Flushed => fi::FI_ECANCELED,
        _ => fi::FI_EIO,
    }
}

/// One entry of a user's scatter/gather list.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Iov {
    pub(crate) base: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: an Iov is a plain description of user memory; the provider only touches that
// memory while the operation it belongs to is outstanding, as libfabric's contract requires.
unsafe impl Send for Iov {}

/// Total bytes of `iovs`.
pub(crate) fn iov_len(iovs: &[Iov]) -> usize {
    iovs.iter().map(|v| v.len).sum()
}

/// Copies `src` into the scatter list; returns bytes copied (at most its total length).
///
/// # Safety
/// Every iov describes writable memory of its length.
pub(crate) unsafe fn scatter(iovs: &[Iov], src: &[u8]) -> usize {
    let mut done = 0;
    for v in iovs {
        if done == src.len() {
            break;
        }
        let n = v.len.min(src.len() - done);
        if n > 0 && !v.base.is_null() {
            // SAFETY: `v.base` has `v.len >= n` writable bytes (caller's contract); src has
            // n bytes from `done`; user memory does not overlap the provider's buffers.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), v.base, n) };
        }
        done += n;
    }
    done
}

/// Copies the gather list into `dst` (which holds at least its total length).
///
/// # Safety
/// Every iov describes readable memory of its length.
pub(crate) unsafe fn gather(iovs: &[Iov], dst: &mut [u8]) {
    let mut done = 0;
    for v in iovs {
        let n = v.len.min(dst.len() - done);
        if n > 0 && !v.base.is_null() {
            // SAFETY: `v.base` has `n` readable bytes (caller's contract), dst has room.
            unsafe { std::ptr::copy_nonoverlapping(v.base, dst.as_mut_ptr().add(done), n) };
        }
        done += n;
    }
}

/// Reads `count` iovecs at `iov`, refusing null lists with entries and more than
/// [`crate::IOV_LIMIT`] entries.
///
/// # Safety
/// `iov` is null or points to `count` iovecs.
pub(crate) unsafe fn read_iovs(iov: *const fi::iovec, count: usize) -> Result<Vec<Iov>, i32> {
    if count > crate::IOV_LIMIT {
        return Err(neg(fi::FI_EINVAL));
    }
    if count > 0 && iov.is_null() {
        return Err(neg(fi::FI_EINVAL));
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: `iov` has `count` entries by the caller's contract.
        let v = unsafe { &*iov.add(i) };
        if v.iov_base.is_null() && v.iov_len > 0 {
            return Err(neg(fi::FI_EINVAL));
        }
        out.push(Iov {
            base: v.iov_base.cast(),
            len: v.iov_len,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_mtu_is_the_kernels_and_sizes_the_datagram() {
        let sys = std::fs::read_to_string("/sys/class/net/lo/mtu").expect("lo mtu");
        let mtu: u32 = sys.trim().parse().expect("a number");
        assert_eq!(interface_mtu(Ipv4Addr::LOCALHOST), Some(mtu));
        assert_eq!(interface_mtu(Ipv4Addr::new(192, 0, 2, 77)), None);
    }

    #[test]
    fn datagram_leaves_room_for_the_ip_and_udp_headers() {
        assert_eq!(datagram_for_mtu(1500), 1472);
        assert_eq!(datagram_for_mtu(9000), 8972);
        assert_eq!(datagram_for_mtu(65536), 65_507);
        assert_eq!(datagram_for_mtu(0), 0);
    }
}
