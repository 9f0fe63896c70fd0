//! Devices and protection domains.
use core::ffi::{CStr, c_char};
use std::net::SocketAddr;

use braid_rt::{Backend, DatapathKind, Device, DeviceConfig};

use crate::error::*;
use crate::handle::{self, DeviceObj, PdObj};
use crate::types::*;

/// Writes `v` through a caller's out-pointer after checking it is non-null and aligned.
///
/// # Safety
/// A non-null, aligned `p` must be valid for a write of `T`.
pub(crate) unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    non_null(p, what)?;
    if !p.is_aligned() {
        return Err(Error::new(BRAID_EINVAL, format!("{what} is misaligned")));
    }
    // SAFETY: checked non-null and aligned above; the caller guarantees it is writable.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads a caller's struct after checking the pointer and its `struct_size` field, which
/// must be the first `u32` of `T` and equal `size_of::<T>()`.
///
/// # Safety
/// A non-null, aligned `p` must be valid for a read of `T`.
pub(crate) unsafe fn get_sized<T: Copy>(p: *const T, what: &str) -> Result<T> {
    non_null(p, what)?;
    if !p.is_aligned() {
        return Err(Error::new(BRAID_EINVAL, format!("{what} is misaligned")));
    }
    // SAFETY: non-null and aligned (checked); the caller guarantees a readable T, whose
    // first field is a u32.
    let size = unsafe { p.cast::<u32>().read() };
    if size as usize != size_of::<T>() {
        return Err(Error::new(
            BRAID_EINVAL,
            format!(
                "{what}->struct_size is {size}, this library's is {}: rebuild against this braid.h",
                size_of::<T>()
            ),
        ));
    }
    // SAFETY: as above.
    Ok(unsafe { p.read() })
}

/// Reads a caller's `braid_device_config`: of this header's size, or of the size before
/// `backend` was added (the newer fields then keep their defaults: software backend).
///
/// # Safety
/// As [`get_sized`], for a struct of the `struct_size` the caller set.
unsafe fn get_config(p: *const braid_device_config) -> Result<braid_device_config> {
    non_null(p, "cfg")?;
    if !p.is_aligned() {
        return Err(Error::new(BRAID_EINVAL, "cfg is misaligned"));
    }
    // SAFETY: non-null and aligned (checked); its first field is a u32.
    let size = unsafe { p.cast::<u32>().read() } as usize;
    if size != DEVICE_CONFIG_V1_SIZE {
        // SAFETY: forwarded.
        return unsafe { get_sized(p, "cfg") };
    }
    let mut c = braid_device_config {
        struct_size: size as u32,
        datapath: BRAID_DATAPATH_UDP,
        bind: core::ptr::null(),
        interface: core::ptr::null(),
        seed: 0,
        flags: 0,
        paths: 0,
        ports: 0,
        max_datagram: 0,
        max_send_wr: 0,
        max_recv_wr: 0,
        retry_limit: 0,
        rto_min_ns: 0,
        backend: BRAID_BACKEND_SOFTWARE,
        verbs_device: core::ptr::null(),
    };
    // SAFETY: the caller's struct holds `size` readable bytes, the prefix of ours up to
    // `backend`, with the same layout; plain data, so a byte copy is a valid value.
    unsafe {
        core::ptr::copy_nonoverlapping(
            p.cast::<u8>(),
            (&raw mut c).cast::<u8>(),
            DEVICE_CONFIG_V1_SIZE,
        )
    };
    Ok(c)
}

/// Clears a caller's out-handle so that a failed call leaves NULL there.
///
/// # Safety
/// As [`put`].
pub(crate) unsafe fn clear_out<T>(out: *mut *mut T, what: &str) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { put(out, core::ptr::null_mut(), what) }
}

/// Text from a caller's C string, or `None` for NULL.
///
/// # Safety
/// A non-null `p` must point to a NUL-terminated string.
unsafe fn text(p: *const c_char, what: &str) -> Result<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller guarantees a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| Error::new(BRAID_EINVAL, format!("{what} is not UTF-8")))
}

fn datapath_kind(v: u32) -> Result<DatapathKind> {
    Ok(match v {
        BRAID_DATAPATH_UDP => DatapathKind::Udp,
        BRAID_DATAPATH_URING => DatapathKind::Uring,
        BRAID_DATAPATH_XDP => DatapathKind::Xdp,
        BRAID_DATAPATH_AUTO => DatapathKind::Auto,
        other => {
            return Err(Error::new(
                BRAID_EINVAL,
                format!("unknown datapath {other} (BRAID_DATAPATH_UDP, _URING, _XDP or _AUTO)"),
            ));
        }
    })
}

fn backend(v: u32, device: Option<String>) -> Result<Backend> {
    Ok(match v {
        BRAID_BACKEND_SOFTWARE => Backend::Software,
        BRAID_BACKEND_VERBS => Backend::Verbs(device),
        BRAID_BACKEND_AUTO => Backend::Auto,
        other => {
            return Err(Error::new(
                BRAID_EINVAL,
                format!("unknown backend {other} (BRAID_BACKEND_SOFTWARE, _VERBS or _AUTO)"),
            ));
        }
    })
}

fn datapath_code(name: &str) -> u32 {
    match name {
        "uring" => BRAID_DATAPATH_URING,
        "xdp" => BRAID_DATAPATH_XDP,
        "verbs" => BRAID_DATAPATH_VERBS,
        _ => BRAID_DATAPATH_UDP,
    }
}

fn device_config(
    c: &braid_device_config,
    bind: &str,
    iface: Option<String>,
) -> Result<DeviceConfig> {
    let local: SocketAddr = bind.parse().map_err(|_| {
        Error::new(
            BRAID_EINVAL,
            format!("bind address {bind:?} is not ip:port"),
        )
    })?;
    if local.ip().is_unspecified() {
        return Err(Error::new(
            BRAID_EINVAL,
            format!("bind address {bind:?} is a wildcard: peers need a concrete address"),
        ));
    }
    let known = BRAID_DEVICE_DETERMINISTIC_SEED | BRAID_DEVICE_BUSY_POLL;
    if c.flags & !known != 0 {
        return Err(Error::new(
            BRAID_EINVAL,
            format!("unknown device flags {:#x}", c.flags & !known),
        ));
    }
    let mut cfg = DeviceConfig::udp(local)
        .datapath(datapath_kind(c.datapath)?)
        .busy_poll(c.flags & BRAID_DEVICE_BUSY_POLL != 0);
    cfg.interface = iface;
    cfg.deterministic_seed = c.flags & BRAID_DEVICE_DETERMINISTIC_SEED != 0;
    let e = &mut cfg.engine;
    e.seed = c.seed;
    let max_paths = braid_rt::MAX_PATHS;
    if c.paths > max_paths {
        return Err(Error::new(
            BRAID_EINVAL,
            format!("paths {} is above {max_paths}", c.paths),
        ));
    }
    if c.paths != 0 {
        e.paths = c.paths;
    }
    if c.ports != 0 && (c.ports > max_paths || c.ports < e.paths) {
        return Err(Error::new(
            BRAID_EINVAL,
            format!(
                "ports {} is outside paths ({}) to {max_paths}",
                c.ports, e.paths
            ),
        ));
    }
    e.ports = c.ports;
    if c.max_datagram != 0 {
        if !(1024..=65_507).contains(&c.max_datagram) {
            return Err(Error::new(
                BRAID_EINVAL,
                format!("max_datagram {} is outside 1024 to 65507", c.max_datagram),
            ));
        }
        e.max_datagram = c.max_datagram as usize;
    }
    let depth = |v: u32, max: usize, what: &str| -> Result<Option<usize>> {
        match v as usize {
            0 => Ok(None),
            n if n <= max => Ok(Some(n)),
            n => Err(Error::new(
                BRAID_EINVAL,
                format!("{what} {n} is above {max}"),
            )),
        }
    };
    if let Some(n) = depth(c.max_send_wr, braid_rt::proto::MAX_SEND_WR, "max_send_wr")? {
        e.max_send_wr = n;
    }
    if let Some(n) = depth(c.max_recv_wr, braid_rt::proto::MAX_RECV_WR, "max_recv_wr")? {
        e.max_recv_wr = n;
    }
    if c.retry_limit != 0 {
        e.retry_limit = c.retry_limit;
    }
    if c.rto_min_ns != 0 {
        if c.rto_min_ns > e.rto_max_ns {
            return Err(Error::new(
                BRAID_EINVAL,
                format!(
                    "rto_min_ns {} is above the ceiling {}",
                    c.rto_min_ns, e.rto_max_ns
                ),
            ));
        }
        e.rto_min_ns = c.rto_min_ns;
    }
    Ok(cfg)
}

/// Fills `cfg` with the defaults: UDP sockets, 16 paths, OS-seeded, no bind address (set
/// one), and `struct_size`.
///
/// # Safety
/// `cfg` must be NULL or point to writable memory for a `braid_device_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_device_config_init(cfg: *mut braid_device_config) -> i32 {
    call("braid_device_config_init", || {
        let v = braid_device_config {
            struct_size: size_of::<braid_device_config>() as u32,
            datapath: BRAID_DATAPATH_UDP,
            bind: core::ptr::null(),
            interface: core::ptr::null(),
            seed: 0,
            flags: 0,
            paths: 0,
            ports: 0,
            max_datagram: 0,
            max_send_wr: 0,
            max_recv_wr: 0,
            retry_limit: 0,
            rto_min_ns: 0,
            backend: BRAID_BACKEND_SOFTWARE,
            verbs_device: core::ptr::null(),
        };
        // SAFETY: the caller's contract.
        unsafe { put(cfg, v, "cfg")? };
        Ok(BRAID_OK)
    })
}

/// Opens a device as `cfg` says: binds the datapath and starts its progress thread. On
/// success `*out` is the device; on failure it is NULL and `braid_last_error` says why
/// (`BRAID_EIO` for a datapath that could not be opened, with the OS error).
///
/// # Safety
/// `cfg` must be NULL or point to a `braid_device_config` whose strings are NULL or
/// NUL-terminated; `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_device_open(
    cfg: *const braid_device_config,
    out: *mut *mut braid_device,
) -> i32 {
    call("braid_device_open", || {
        // SAFETY: the caller's contract, for this and the reads below.
        unsafe { clear_out(out, "out")? };
        // SAFETY: as above.
        let c = unsafe { get_config(cfg)? };
        // SAFETY: as above.
        let bind = unsafe { text(c.bind, "cfg->bind")? }
            .ok_or_else(|| Error::new(BRAID_EFAULT, "cfg->bind is NULL: set the local address"))?;
        // SAFETY: as above.
        let iface = unsafe { text(c.interface, "cfg->interface")? };
        let mut config = device_config(&c, &bind, iface)?;
        // SAFETY: as above.
        let verbs_device = unsafe { text(c.verbs_device, "cfg->verbs_device")? };
        config.backend = backend(c.backend, verbs_device)?;
        let max_send_wr = config.engine.max_send_wr as u32;
        let max_recv_wr = config.engine.max_recv_wr as u32;
        let dev = Device::open(config).map_err(|e| {
            let code = match e {
                braid_rt::OpenError::InvalidConfig(_) => BRAID_EINVAL,
                braid_rt::OpenError::Verbs(_) => BRAID_ENODEV,
                _ => BRAID_EIO,
            };
            Error::new(code, e.to_string())
        })?;
        let h = handle::insert::<braid_device>(
            DeviceObj {
                dev,
                max_send_wr,
                max_recv_wr,
            },
            &[],
        )?;
        // SAFETY: as above (checked writable by clear_out).
        unsafe { put(out, h, "out")? };
        Ok(BRAID_OK)
    })
}

/// Closes a device: stops its progress thread and releases its datapath. Every PD and CQ
/// made from it must be destroyed first (else `BRAID_EBUSY`, and nothing changes).
#[unsafe(no_mangle)]
pub extern "C" fn braid_device_close(dev: *mut braid_device) -> i32 {
    call("braid_device_close", || {
        drop(handle::remove(dev)?);
        Ok(BRAID_OK)
    })
}

/// Describes an open device. Set `attr->struct_size = sizeof(braid_device_attr)` first (the
/// size of an older header's `braid_device_attr`, without `backend`, is taken too: the
/// fields it has are filled).
///
/// # Safety
/// `attr` must be NULL or point to a writable `braid_device_attr` of the `struct_size` set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_device_query(
    dev: *const braid_device,
    attr: *mut braid_device_attr,
) -> i32 {
    call("braid_device_query", || {
        let d = handle::get(dev)?;
        non_null(attr, "attr")?;
        if !attr.is_aligned() {
            return Err(Error::new(BRAID_EINVAL, "attr is misaligned"));
        }
        // SAFETY: non-null and aligned (checked); its first field is a u32.
        let size = unsafe { attr.cast::<u32>().read() } as usize;
        if size != size_of::<braid_device_attr>() && size != DEVICE_ATTR_V1_SIZE {
            return Err(Error::new(
                BRAID_EINVAL,
                format!(
                    "attr->struct_size is {size}, this library's is {}: rebuild against this braid.h",
                    size_of::<braid_device_attr>()
                ),
            ));
        }
        let mut local_addr = [0 as c_char; 64];
        let text = d.dev.local_addr().to_string();
        for (dst, b) in local_addr.iter_mut().zip(text.bytes().take(63)) {
            *dst = b as c_char;
        }
        let v = braid_device_attr {
            struct_size: size_of::<braid_device_attr>() as u32,
            datapath: datapath_code(d.dev.datapath_kind()),
            local_addr,
            chunk_size: d.dev.chunk_size(),
            paths: d.dev.path_stats().len() as u32,
            max_send_wr: d.max_send_wr,
            max_recv_wr: d.max_recv_wr,
            max_sge: BRAID_MAX_SGE,
            max_msg_size: u32::MAX,
            backend: if d.dev.is_verbs() {
                BRAID_BACKEND_VERBS
            } else {
                BRAID_BACKEND_SOFTWARE
            },
        };
        #[cfg(feature = "verbs")]
        let v = match d.dev.verbs_caps() {
            // The NIC's limits, as its QPs are created with them.
            Some(c) => braid_device_attr {
                max_send_wr: c.qp_depth(),
                max_recv_wr: c.qp_depth(),
                max_sge: c.qp_sge(),
                paths: 1,
                ..v
            },
            None => v,
        };
        let v = braid_device_attr {
            struct_size: size as u32,
            ..v
        };
        // SAFETY: the caller's struct holds `size` writable bytes (its contract), the prefix
        // of ours with the same layout (`size` is ours or the size before `backend`); plain
        // data, so a byte copy of that prefix is valid.
        unsafe {
            core::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), attr.cast::<u8>(), size)
        };
        Ok(BRAID_OK)
    })
}

/// Copies the device's datapath report (which datapath was opened and, for
/// `BRAID_DATAPATH_AUTO`, why the faster ones were not) into `buf` as a NUL-terminated
/// string, truncated to `len - 1` bytes. Returns the report's full length (without the NUL),
/// as snprintf does; `buf` may be NULL when `len` is 0.
///
/// # Safety
/// `buf` must be NULL or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_device_report(
    dev: *const braid_device,
    buf: *mut c_char,
    len: usize,
) -> i32 {
    call("braid_device_report", || {
        let d = handle::get(dev)?;
        let report = d.dev.datapath_report().as_bytes();
        if len > 0 {
            non_null(buf, "buf")?;
            let n = report.len().min(len - 1);
            // SAFETY: buf is non-null and, by the caller's contract, writable for len > n
            // bytes; the source is a live slice of at least n bytes that cannot overlap it.
            unsafe {
                core::ptr::copy_nonoverlapping(report.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        Ok(i32::try_from(report.len()).unwrap_or(i32::MAX))
    })
}

/// Fills `stats` with the device's counters. Set `stats->struct_size` first.
///
/// # Safety
/// `stats` must be NULL or point to a writable `braid_device_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_device_query_stats(
    dev: *const braid_device,
    stats: *mut braid_device_stats,
) -> i32 {
    call("braid_device_query_stats", || {
        let d = handle::get(dev)?;
        // SAFETY: the caller's contract.
        unsafe { get_sized(stats, "stats")? };
        let s = d.dev.stats();
        let v = braid_device_stats {
            struct_size: size_of::<braid_device_stats>() as u32,
            reserved: 0,
            rx_datagrams: s.rx_datagrams,
            tx_datagrams: s.tx_datagrams,
            retransmits: s.retransmits,
            rx_bad_crc: s.rx_bad_crc,
            rx_malformed: s.rx_malformed,
            rx_unknown_qp: s.rx_unknown_qp,
            rx_wrong_peer: s.rx_wrong_peer,
            rx_duplicates: s.rx_duplicates,
            naks_sent: s.naks_sent,
            naks_received: s.naks_received,
            rto_fired: s.rto_fired,
            rx_auth_failed: s.rx_auth_failed,
        };
        // SAFETY: the caller's contract.
        unsafe { put(stats, v, "stats")? };
        Ok(BRAID_OK)
    })
}

/// Allocates a protection domain on `dev`.
///
/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_pd_alloc(dev: *const braid_device, out: *mut *mut braid_pd) -> i32 {
    call("braid_pd_alloc", || {
        // SAFETY: the caller's contract.
        unsafe { clear_out(out, "out")? };
        let d = handle::get(dev)?;
        let pd = d.dev.alloc_pd();
        let device = handle::token(dev);
        let h = handle::insert::<braid_pd>(PdObj { pd, device }, &[device])?;
        // SAFETY: the caller's contract.
        unsafe { put(out, h, "out")? };
        Ok(BRAID_OK)
    })
}

/// Frees a protection domain. Its regions and QPs must be destroyed first (else
/// `BRAID_EBUSY`).
#[unsafe(no_mangle)]
pub extern "C" fn braid_pd_free(pd: *mut braid_pd) -> i32 {
    call("braid_pd_free", || {
        drop(handle::remove(pd)?);
        Ok(BRAID_OK)
    })
}
