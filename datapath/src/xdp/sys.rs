//! Interface queries and small syscall wrappers: getifaddrs, the SIOCGIF* ioctls, ethtool's
//! channel count, eventfd, ppoll.

use std::ffi::CStr;
use std::io;
use std::mem;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::frame::Mac;

/// `ETHTOOL_GCHANNELS` from `linux/ethtool.h`.
const ETHTOOL_GCHANNELS: u32 = 0x3c;
/// `ARPHRD_ETHER` from `linux/if_arp.h`.
const ARPHRD_ETHER: u16 = 1;

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// The name of the interface that carries IPv4 address `ip`, if any.
pub(super) fn interface_with_ip(ip: Ipv4Addr) -> io::Result<Option<String>> {
    Ok(interface_addresses()?
        .into_iter()
        .find(|(_, a)| *a == ip)
        .map(|(name, _)| name))
}

/// Whether interface `name` carries IPv4 address `ip`.
pub(super) fn interface_has_ip(name: &str, ip: Ipv4Addr) -> io::Result<bool> {
    Ok(interface_addresses()?
        .iter()
        .any(|(n, a)| n == name && *a == ip))
}

/// Every (interface, IPv4 address) pair of this network namespace.
fn interface_addresses() -> io::Result<Vec<(String, Ipv4Addr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, live until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says how long it is; we only
            // read it as sockaddr_in after checking the family is AF_INET.
            let family = unsafe { (*ifa.ifa_addr).sa_family };
            if i32::from(family) == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in (see above).
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
                // Aliases are listed as "eth0:1"; the interface is "eth0".
                let name = name.to_string_lossy();
                let name = name.split(':').next().unwrap_or_default();
                out.push((
                    name.to_string(),
                    Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                ));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once; no reference into the
    // list outlives this point (names were copied into `out`).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// What the datapath needs to know about its interface.
#[derive(Clone, Debug)]
pub(super) struct InterfaceInfo {
    pub(super) mtu: u32,
    pub(super) mac: Mac,
    /// Whether the hardware type is Ethernet (`ARPHRD_ETHER`).
    pub(super) ethernet: bool,
    pub(super) hw_type: u16,
    pub(super) up: bool,
    /// Active receive queues (ethtool rx + combined channels; 1 if the driver cannot say).
    pub(super) rx_queues: u32,
}

/// An `ifreq` naming `name`, or `None` if the name does not fit.
fn ifreq(name: &str) -> Option<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return None;
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    Some(req)
}

/// Queries MTU, MAC, flags and queue count of interface `name`.
pub(super) fn interface_info(name: &str) -> io::Result<InterfaceInfo> {
    let bad_name = || io::Error::new(io::ErrorKind::InvalidInput, "bad interface name");
    // SAFETY: plain socket syscall; the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let ioctl = |req: libc::c_ulong, ifr: &mut libc::ifreq| -> io::Result<()> {
        // SAFETY: `ifr` is a live, writable ifreq, the argument type of these SIOCGIF*
        // requests (and of SIOCETHTOOL, whose ifr_data points at a live ethtool struct).
        if unsafe { libc::ioctl(sock.as_raw_fd(), req, ifr as *mut libc::ifreq) } < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };

    let mut req = ifreq(name).ok_or_else(bad_name)?;
    ioctl(libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU filled the ifru_mtu member of the union.
    let mtu = u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).unwrap_or(0);

    let mut req = ifreq(name).ok_or_else(bad_name)?;
    ioctl(libc::SIOCGIFHWADDR, &mut req)?;
    // SAFETY: SIOCGIFHWADDR filled the ifru_hwaddr member of the union.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let ethernet = hw.sa_family == ARPHRD_ETHER;
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }

    let mut req = ifreq(name).ok_or_else(bad_name)?;
    ioctl(libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: SIOCGIFFLAGS filled the ifru_flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let up = i32::from(flags) & libc::IFF_UP != 0;

    let mut channels = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    let mut req = ifreq(name).ok_or_else(bad_name)?;
    req.ifr_ifru.ifru_data = (&mut channels as *mut EthtoolChannels).cast::<libc::c_char>();
    let rx_queues = match ioctl(libc::SIOCETHTOOL, &mut req) {
        Ok(()) => (channels.rx_count + channels.combined_count).max(1),
        // Drivers without channel reporting (lo, dummy, many virtual devices) have one queue.
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => 1,
        Err(e) => return Err(e),
    };
    Ok(InterfaceInfo {
        mtu,
        mac,
        ethernet,
        hw_type: hw.sa_family,
        up,
        rx_queues,
    })
}

/// A nonblocking, close-on-exec eventfd.
pub(super) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; the result is checked before use.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd counter (a full counter already means "woken").
pub(super) fn eventfd_signal(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes the 8 bytes of `one`, which is live for the call.
    let _ = unsafe {
        libc::write(
            fd,
            (&one as *const u64).cast::<libc::c_void>(),
            mem::size_of::<u64>(),
        )
    };
}

/// Resets an eventfd counter.
pub(super) fn eventfd_drain(fd: RawFd) {
    let mut value = 0u64;
    // SAFETY: reads at most 8 bytes into `value`, which is 8 bytes long and live.
    let _ = unsafe {
        libc::read(
            fd,
            (&mut value as *mut u64).cast::<libc::c_void>(),
            mem::size_of::<u64>(),
        )
    };
}

/// `ppoll` with an optional timeout; the same wrapper the UDP datapath uses.
pub(super) use crate::sys::poll;
