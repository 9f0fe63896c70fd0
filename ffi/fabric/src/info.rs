//! `fi_getinfo` for the provider: one `fi_info` per IPv4 interface (the domain is named after
//! the interface), filtered by the hints and trimmed to what they ask for.
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};

use crate::fi;
use crate::util::{c_str, c_strdup, from_sockaddr, guard, interfaces, neg, to_sockaddr_in};

/// Primary capabilities the provider implements.
pub(crate) const PRIMARY_CAPS: u64 =
    fi::FI_MSG as u64 | fi::FI_TAGGED as u64 | fi::FI_RMA as u64 | fi::FI_ATOMIC as u64;
/// The primary capabilities that need memory registration with provider keys.
pub(crate) const KEYED_CAPS: u64 = fi::FI_RMA as u64 | fi::FI_ATOMIC as u64;
/// Secondary capabilities it implements.
pub(crate) const SECONDARY_CAPS: u64 = fi::FI_SEND as u64
    | fi::FI_RECV as u64
    | fi::FI_READ as u64
    | fi::FI_WRITE as u64
    | fi::FI_REMOTE_READ as u64
    | fi::FI_REMOTE_WRITE as u64
    | fi::FI_DIRECTED_RECV
    | fi::FI_SOURCE
    | fi::FI_REMOTE_COMM
    | fi::FI_LOCAL_COMM
    | fi::FI_RMA_EVENT
    | fi::FI_MULTI_RECV as u64;
/// The capabilities that belong in `tx_attr->caps` (fi_getinfo(3): primary capabilities and
/// the transmit-side modifiers; no receive-side or domain bits).
const TX_ATTR_CAPS: u64 =
    PRIMARY_CAPS | fi::FI_SEND as u64 | fi::FI_READ as u64 | fi::FI_WRITE as u64;
/// The capabilities that belong in `rx_attr->caps`.
const RX_ATTR_CAPS: u64 = PRIMARY_CAPS
    | fi::FI_RECV as u64
    | fi::FI_REMOTE_READ as u64
    | fi::FI_REMOTE_WRITE as u64
    | fi::FI_DIRECTED_RECV
    | fi::FI_SOURCE
    | fi::FI_RMA_EVENT
    | fi::FI_MULTI_RECV as u64;
/// Secondary capabilities returned only when asked for: FI_RMA_EVENT costs a provider message
/// per RMA operation (see `ep::KIND_RMA_EVENT`).
const ON_REQUEST_CAPS: u64 = fi::FI_RMA_EVENT;
/// Domain capabilities: peers on other hosts and on this one (loopback).
const DOMAIN_CAPS: u64 = fi::FI_REMOTE_COMM | fi::FI_LOCAL_COMM;
/// Everything it implements.
pub(crate) const CAPS: u64 = PRIMARY_CAPS | SECONDARY_CAPS;
/// The message ordering it guarantees: send after send (Braid RC completes and places
/// SENDs of one QP in order; nothing else is promised).
pub(crate) const MSG_ORDER: u64 = fi::FI_ORDER_SAS as u64;
/// Tag format reported: all 64 bits usable.
pub(crate) const TAG_FORMAT: u64 = 0xaaaa_aaaa_aaaa_aaaa;
/// Operation flags accepted on transmit and receive attributes.
pub(crate) const OP_FLAGS: u64 = fi::FI_COMPLETION as u64
    | fi::FI_INJECT as u64
    | fi::FI_TRANSMIT_COMPLETE as u64
    | fi::FI_DELIVERY_COMPLETE as u64
    | fi::FI_INJECT_COMPLETE as u64
    | fi::FI_MULTI_RECV as u64
    | fi::FI_REMOTE_CQ_DATA as u64;

/// What one fi_info says, before it is turned into C.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) caps: u64,
    pub(crate) domain: String,
    pub(crate) src: SocketAddr,
    pub(crate) dest: Option<SocketAddr>,
    pub(crate) threading: fi::fi_threading,
    pub(crate) control_progress: fi::fi_progress,
    pub(crate) data_progress: fi::fi_progress,
    pub(crate) resource_mgmt: fi::fi_resource_mgmt,
    pub(crate) av_type: fi::fi_av_type,
    pub(crate) mr_mode: i32,
    pub(crate) tx_op_flags: u64,
    pub(crate) rx_op_flags: u64,
    pub(crate) api_version: u32,
}

/// Largest region in virtual-address mode (see [`Spec::virt_addr`]).
pub(crate) const VIRT_MR_MAX: usize = 1 << 32;

/// The provider key of a region in virtual-address mode: Braid remote key, base's low bits.
pub(crate) fn virt_key(rkey: u32, base: usize) -> u64 {
    (u64::from(rkey) << 32) | (base as u64 & 0xffff_ffff)
}

/// The Braid remote key and offset a virtual-address-mode `key` and `addr` name.
pub(crate) fn virt_target(key: u64, addr: u64) -> (u32, u64) {
    let rkey = (key >> 32) as u32;
    let base_lo = key as u32;
    (rkey, u64::from((addr as u32).wrapping_sub(base_lo)))
}

impl Spec {
    /// Whether remote addresses are the target's virtual addresses (FI_MR_VIRT_ADDR, or
    /// FI_MR_BASIC) rather than offsets into the region. Braid addresses a region by remote
    /// key and offset, so in this mode a region's provider key carries the low 32 bits of its
    /// base address above the 32-bit Braid remote key, and the initiator turns `addr` into
    /// the offset `(addr - base) mod 2^32`; such regions are limited to 4 GiB.
    pub(crate) fn virt_addr(&self) -> bool {
        self.mr_mode == fi::FI_MR_BASIC as i32 || self.mr_mode & fi::FI_MR_VIRT_ADDR as i32 != 0
    }
}

/// `getinfo` in the provider table.
pub(crate) unsafe extern "C" fn getinfo(
    version: u32,
    node: *const libc::c_char,
    service: *const libc::c_char,
    flags: u64,
    hints: *const fi::fi_info,
    info: *mut *mut fi::fi_info,
) -> i32 {
    guard(|| {
        if info.is_null() {
            return neg(fi::FI_EINVAL);
        }
        // SAFETY: the pointers come from libfabric's fi_getinfo, which passes valid C strings
        // (or null) and a valid (or null) hints structure.
        let specs = unsafe { specs(version, node, service, flags, hints) };
        let specs = match specs {
            Ok(s) if !s.is_empty() => s,
            Ok(_) => return neg(fi::FI_ENODATA),
            Err(e) => return e,
        };
        let mut head: *mut fi::fi_info = std::ptr::null_mut();
        for s in specs.iter().rev() {
            let cur = alloc_info(s);
            if cur.is_null() {
                free_chain(head);
                return neg(fi::FI_ENOMEM);
            }
            // SAFETY: `cur` is a fresh, fully allocated fi_info.
            unsafe { (*cur).next = head };
            head = cur;
        }
        // SAFETY: `info` is non-null (checked) and writable by fi_getinfo's contract.
        unsafe { *info = head };
        0
    })
}

/// Resolves `node`/`service` to an IPv4 socket address.
fn resolve(node: Option<&str>, service: Option<&str>) -> Result<SocketAddr, i32> {
    let port: u16 = match service {
        None => 0,
        Some(s) => s.parse().map_err(|_| neg(fi::FI_EINVAL))?,
    };
    let host = node.unwrap_or("0.0.0.0");
    (host, port)
        .to_socket_addrs()
        .map_err(|_| neg(fi::FI_ENODATA))?
        .find(|a| a.is_ipv4())
        .ok_or(neg(fi::FI_ENODATA))
}

/// The infos that fit, in preference order.
///
/// # Safety
/// `node` and `service` are null or C strings; `hints` is null or a valid fi_info.
unsafe fn specs(
    version: u32,
    node: *const libc::c_char,
    service: *const libc::c_char,
    flags: u64,
    hints: *const fi::fi_info,
) -> Result<Vec<Spec>, i32> {
    if (version >> 16) != 1 {
        return Err(neg(fi::FI_ENODATA));
    }
    // SAFETY: forwarded from the caller's contract.
    let (node, service) = unsafe { (c_str(node), c_str(service)) };
    // SAFETY: hints is null or valid.
    let h = unsafe { hints.as_ref() };
    let mut spec = Spec {
        caps: CAPS & !ON_REQUEST_CAPS,
        domain: String::new(),
        src: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        dest: None,
        threading: fi::FI_THREAD_SAFE,
        control_progress: fi::FI_PROGRESS_AUTO,
        data_progress: fi::FI_PROGRESS_AUTO,
        resource_mgmt: fi::FI_RM_ENABLED,
        av_type: fi::FI_AV_UNSPEC,
        mr_mode: fi::FI_MR_PROV_KEY as i32,
        tx_op_flags: 0,
        rx_op_flags: 0,
        api_version: version,
    };
    let mut want_src: Option<SocketAddr> = None;
    let mut want_domain: Option<String> = None;
    if flags & fi::FI_SOURCE != 0 {
        if node.is_some() || service.is_some() {
            want_src = Some(resolve(node, service)?);
        }
    } else if node.is_some() {
        spec.dest = Some(resolve(node, service)?);
    } else if let Some(s) = service {
        // A service alone names the local port.
        want_src = Some(resolve(None, Some(s))?);
    }
    if let Some(h) = h {
        if h.caps != 0 {
            if h.caps & !CAPS != 0 {
                return Err(neg(fi::FI_ENODATA));
            }
            if h.caps & PRIMARY_CAPS == 0 {
                return Err(neg(fi::FI_ENODATA));
            }
            spec.caps = h.caps;
        }
        // No mode bits are required of the application, whatever it offers.
        if h.addr_format != fi::FI_FORMAT_UNSPEC
            && h.addr_format != fi::FI_SOCKADDR_IN
            && h.addr_format != fi::FI_SOCKADDR
        {
            return Err(neg(fi::FI_ENODATA));
        }
        if !h.src_addr.is_null() && h.src_addrlen > 0 {
            // SAFETY: src_addr has src_addrlen bytes by fi_info's contract.
            let a = unsafe { from_sockaddr(h.src_addr.cast(), h.src_addrlen) }
                .ok_or(neg(fi::FI_ENODATA))?;
            want_src = Some(a);
        }
        if !h.dest_addr.is_null() && h.dest_addrlen > 0 {
            // SAFETY: as above.
            let a = unsafe { from_sockaddr(h.dest_addr.cast(), h.dest_addrlen) }
                .ok_or(neg(fi::FI_ENODATA))?;
            spec.dest = Some(a);
        }
        // SAFETY: attribute pointers of a valid fi_info are null or valid.
        if let Some(ep) = unsafe { h.ep_attr.as_ref() } {
            if ep.type_ != fi::FI_EP_UNSPEC && ep.type_ != fi::FI_EP_RDM {
                return Err(neg(fi::FI_ENODATA));
            }
            if ep.max_msg_size > crate::MAX_MSG_SIZE {
                return Err(neg(fi::FI_ENODATA));
            }
            if ep.protocol != fi::FI_PROTO_UNSPEC {
                return Err(neg(fi::FI_ENODATA));
            }
            if ep.tx_ctx_cnt > 1 || ep.rx_ctx_cnt > 1 {
                // Shared contexts (FI_SHARED_CONTEXT is SIZE_MAX) and scalable endpoints.
                return Err(neg(fi::FI_ENODATA));
            }
            if ep.auth_key_size != 0 {
                return Err(neg(fi::FI_ENODATA));
            }
        }
        // SAFETY: as above.
        if let Some(f) = unsafe { h.fabric_attr.as_ref() } {
            // SAFETY: strings of a valid fabric_attr are null or C strings.
            if let Some(n) = unsafe { c_str(f.name) }
                && !n.eq_ignore_ascii_case("braid")
            {
                return Err(neg(fi::FI_ENODATA));
            }
            // SAFETY: as above.
            if let Some(p) = unsafe { c_str(f.prov_name) }
                && !p
                    .split(';')
                    .next()
                    .is_some_and(|n| n.eq_ignore_ascii_case("braid"))
            {
                return Err(neg(fi::FI_ENODATA));
            }
        }
        // SAFETY: as above.
        if let Some(d) = unsafe { h.domain_attr.as_ref() } {
            // SAFETY: as above.
            want_domain = unsafe { c_str(d.name) }.map(str::to_string);
            if d.threading != fi::FI_THREAD_UNSPEC {
                // Every threading model is served: the provider is thread safe.
                spec.threading = d.threading;
            }
            if d.control_progress == fi::FI_PROGRESS_MANUAL {
                spec.control_progress = fi::FI_PROGRESS_MANUAL;
            }
            if d.data_progress == fi::FI_PROGRESS_MANUAL {
                spec.data_progress = fi::FI_PROGRESS_MANUAL;
            }
            if d.resource_mgmt == fi::FI_RM_DISABLED {
                spec.resource_mgmt = fi::FI_RM_DISABLED;
            }
            match d.av_type {
                fi::FI_AV_UNSPEC | fi::FI_AV_MAP | fi::FI_AV_TABLE => spec.av_type = d.av_type,
                _ => return Err(neg(fi::FI_ENODATA)),
            }
            if d.cq_data_size > 4 {
                return Err(neg(fi::FI_ENODATA));
            }
            if d.caps & !CAPS & !(fi::FI_LOCAL_COMM) != 0 {
                return Err(neg(fi::FI_ENODATA));
            }
            if d.auth_key_size != 0 {
                return Err(neg(fi::FI_ENODATA));
            }
            // Message and tagged traffic needs no memory registration from the application.
            // RMA and atomics need keys the provider chooses: offered only to applications
            // that accept FI_MR_PROV_KEY (or the old FI_MR_BASIC, which implies it).
            let basic = d.mr_mode == fi::FI_MR_BASIC as i32;
            let prov_key = basic || d.mr_mode & fi::FI_MR_PROV_KEY as i32 != 0;
            if !prov_key {
                if h.caps & KEYED_CAPS != 0 {
                    return Err(neg(fi::FI_ENODATA));
                }
                spec.caps &= !(KEYED_CAPS
                    | fi::FI_RMA_EVENT
                    | fi::FI_READ as u64
                    | fi::FI_WRITE as u64
                    | fi::FI_REMOTE_READ as u64
                    | fi::FI_REMOTE_WRITE as u64);
            }
            // Remote addresses are offsets into the region unless the application asks for
            // virtual addresses (FI_MR_VIRT_ADDR, or FI_MR_BASIC, which means it and is
            // returned unchanged, as the spec says).
            spec.mr_mode = if spec.caps & KEYED_CAPS == 0 {
                0
            } else if basic {
                fi::FI_MR_BASIC as i32
            } else if d.mr_mode & fi::FI_MR_VIRT_ADDR as i32 != 0 {
                (fi::FI_MR_PROV_KEY | fi::FI_MR_VIRT_ADDR) as i32
            } else {
                fi::FI_MR_PROV_KEY as i32
            };
        }
        // SAFETY: as above.
        if let Some(t) = unsafe { h.tx_attr.as_ref() } {
            if t.inject_size > crate::EAGER_MAX
                || t.iov_limit > crate::IOV_LIMIT
                || t.size > crate::TX_SLOTS
                || t.msg_order & !MSG_ORDER != 0
                || t.comp_order & !(fi::FI_ORDER_NONE as u64) != 0
                || t.op_flags & !OP_FLAGS != 0
                || t.caps & !CAPS != 0
            {
                return Err(neg(fi::FI_ENODATA));
            }
            spec.tx_op_flags = t.op_flags;
        }
        // SAFETY: as above.
        if let Some(r) = unsafe { h.rx_attr.as_ref() } {
            if r.iov_limit > crate::IOV_LIMIT
                || r.size > crate::RX_QUEUE
                || r.msg_order & !MSG_ORDER != 0
                || r.comp_order & !(fi::FI_ORDER_NONE as u64) != 0
                || r.op_flags & !OP_FLAGS != 0
                || r.caps & !CAPS != 0
                || r.total_buffered_recv > crate::UNEXPECTED_BYTES_MAX
            {
                return Err(neg(fi::FI_ENODATA));
            }
            spec.rx_op_flags = r.op_flags;
        }
    }
    let mut out = Vec::new();
    for (name, ip) in interfaces() {
        if want_domain.as_deref().is_some_and(|d| d != name) {
            continue;
        }
        let mut s = spec.clone();
        s.domain = name;
        match want_src {
            Some(w) => {
                let SocketAddr::V4(w4) = w else { continue };
                if !w4.ip().is_unspecified() && *w4.ip() != ip {
                    continue;
                }
                s.src = SocketAddr::from((ip, w.port()));
            }
            None => s.src = SocketAddr::from((ip, 0)),
        }
        out.push(s);
    }
    Ok(out)
}

fn calloc<T>() -> *mut T {
    // SAFETY: calloc of one T; the caller checks for null. Zeroed memory is a valid value of
    // every bindgen struct used here (integers and raw pointers).
    unsafe { libc::calloc(1, std::mem::size_of::<T>()) }.cast()
}

/// Allocates an fi_info (and its attributes and strings) with the C allocator, as
/// `fi_freeinfo` expects.
pub(crate) fn alloc_info(s: &Spec) -> *mut fi::fi_info {
    let info = calloc::<fi::fi_info>();
    let tx = calloc::<fi::fi_tx_attr>();
    let rx = calloc::<fi::fi_rx_attr>();
    let ep = calloc::<fi::fi_ep_attr>();
    let dom = calloc::<fi::fi_domain_attr>();
    let fab = calloc::<fi::fi_fabric_attr>();
    let src = calloc::<libc::sockaddr_in>();
    let dest = if s.dest.is_some() {
        calloc::<libc::sockaddr_in>()
    } else {
        std::ptr::null_mut()
    };
    // prov_name stays null: libfabric's fi_getinfo fills it in from the provider table
    // (a core provider that sets it is taken for a layered one).
    let names = [c_strdup(&s.domain), c_strdup("braid")];
    let failed = info.is_null()
        || tx.is_null()
        || rx.is_null()
        || ep.is_null()
        || dom.is_null()
        || fab.is_null()
        || src.is_null()
        || (s.dest.is_some() && dest.is_null())
        || names.iter().any(|n| n.is_null());
    if failed {
        // SAFETY: each pointer is null or a fresh malloc'd block; free(NULL) is a no-op.
        unsafe {
            for p in [
                info.cast::<libc::c_void>(),
                tx.cast(),
                rx.cast(),
                ep.cast(),
                dom.cast(),
                fab.cast(),
                src.cast(),
                dest.cast(),
            ] {
                libc::free(p);
            }
            for n in names {
                libc::free(n.cast());
            }
        }
        return std::ptr::null_mut();
    }
    let msg_caps = s.caps & (PRIMARY_CAPS | fi::FI_SEND as u64 | fi::FI_RECV as u64);
    // SAFETY: every pointer was just allocated (non-null, checked) and is written once.
    unsafe {
        *tx = fi::fi_tx_attr {
            caps: s.caps & TX_ATTR_CAPS,
            mode: 0,
            op_flags: s.tx_op_flags,
            msg_order: MSG_ORDER,
            comp_order: fi::FI_ORDER_NONE as u64,
            inject_size: crate::EAGER_MAX,
            size: crate::TX_SLOTS,
            iov_limit: crate::IOV_LIMIT,
            rma_iov_limit: 1,
            tclass: 0,
        };
        *rx = fi::fi_rx_attr {
            caps: s.caps & RX_ATTR_CAPS,
            mode: 0,
            op_flags: s.rx_op_flags,
            msg_order: MSG_ORDER,
            comp_order: fi::FI_ORDER_NONE as u64,
            total_buffered_recv: crate::UNEXPECTED_BYTES_MAX,
            size: crate::RX_QUEUE,
            iov_limit: crate::IOV_LIMIT,
        };
        *ep = fi::fi_ep_attr {
            type_: fi::FI_EP_RDM,
            protocol: fi::FI_PROTO_UNSPEC,
            protocol_version: 1,
            max_msg_size: crate::MAX_MSG_SIZE,
            msg_prefix_size: 0,
            max_order_raw_size: 0,
            max_order_war_size: 0,
            max_order_waw_size: 0,
            mem_tag_format: if s.caps & fi::FI_TAGGED as u64 != 0 {
                TAG_FORMAT
            } else {
                0
            },
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            auth_key_size: 0,
            auth_key: std::ptr::null_mut(),
        };
        *dom = fi::fi_domain_attr {
            domain: std::ptr::null_mut(),
            name: names[0],
            threading: s.threading,
            control_progress: s.control_progress,
            data_progress: s.data_progress,
            resource_mgmt: s.resource_mgmt,
            av_type: s.av_type,
            mr_mode: s.mr_mode,
            // Offset mode: the Braid remote key. Virtual-address mode: the key also carries
            // the region's base (see `Spec::virt_addr`).
            mr_key_size: if s.virt_addr() { 8 } else { 4 },
            cq_data_size: 4,
            cq_cnt: 256,
            ep_cnt: crate::MAX_EPS_PER_DOMAIN,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            max_ep_tx_ctx: 1,
            max_ep_rx_ctx: 1,
            max_ep_stx_ctx: 0,
            max_ep_srx_ctx: 0,
            cntr_cnt: 256,
            mr_iov_limit: 1,
            caps: DOMAIN_CAPS,
            mode: 0,
            auth_key: std::ptr::null_mut(),
            auth_key_size: 0,
            max_err_data: 0,
            mr_cnt: 65_536,
            tclass: 0,
        };
        *fab = fi::fi_fabric_attr {
            fabric: std::ptr::null_mut(),
            name: names[1],
            prov_name: std::ptr::null_mut(),
            prov_version: crate::PROVIDER_VERSION,
            api_version: s.api_version,
        };
        *src = to_sockaddr_in(s.src);
        if let Some(d) = s.dest {
            *dest = to_sockaddr_in(d);
        }
        *info = fi::fi_info {
            next: std::ptr::null_mut(),
            caps: s.caps,
            mode: 0,
            addr_format: fi::FI_SOCKADDR_IN,
            src_addrlen: std::mem::size_of::<libc::sockaddr_in>(),
            dest_addrlen: if s.dest.is_some() {
                std::mem::size_of::<libc::sockaddr_in>()
            } else {
                0
            },
            src_addr: src.cast(),
            dest_addr: dest.cast(),
            handle: std::ptr::null_mut(),
            tx_attr: tx,
            rx_attr: rx,
            ep_attr: ep,
            domain_attr: dom,
            fabric_attr: fab,
            nic: std::ptr::null_mut(),
        };
    }
    let _ = msg_caps;
    info
}

/// Frees a chain built by [`alloc_info`] (on a failure half-way through `getinfo`).
fn free_chain(mut p: *mut fi::fi_info) {
    while !p.is_null() {
        // SAFETY: every node and attribute came from alloc_info (malloc'd), freed once.
        unsafe {
            let i = &*p;
            let next = i.next;
            libc::free((*i.domain_attr).name.cast());
            libc::free((*i.fabric_attr).name.cast());
            for q in [
                i.tx_attr.cast::<libc::c_void>(),
                i.rx_attr.cast(),
                i.ep_attr.cast(),
                i.domain_attr.cast(),
                i.fabric_attr.cast(),
                i.src_addr,
                i.dest_addr,
            ] {
                libc::free(q);
            }
            libc::free(p.cast());
            p = next;
        }
    }
}

/// Reads the parts of an application's fi_info that shape a domain or endpoint.
///
/// # Safety
/// `info` is null or a valid fi_info.
pub(crate) unsafe fn read_info(info: *const fi::fi_info) -> Option<Spec> {
    // SAFETY: null or valid by contract.
    let i = unsafe { info.as_ref() }?;
    let src = if i.src_addr.is_null() {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    } else {
        // SAFETY: src_addr has src_addrlen bytes.
        unsafe { from_sockaddr(i.src_addr.cast(), i.src_addrlen) }?
    };
    // SAFETY: attribute pointers are null or valid.
    let dom = unsafe { i.domain_attr.as_ref() };
    // SAFETY: as above.
    let tx = unsafe { i.tx_attr.as_ref() };
    // SAFETY: as above.
    let rx = unsafe { i.rx_attr.as_ref() };
    Some(Spec {
        caps: if i.caps == 0 {
            CAPS & !ON_REQUEST_CAPS
        } else {
            i.caps & CAPS
        },
        // SAFETY: the name is null or a C string.
        domain: dom
            .and_then(|d| unsafe { c_str(d.name) })
            .unwrap_or("")
            .to_string(),
        src,
        dest: None,
        threading: dom.map(|d| d.threading).unwrap_or(fi::FI_THREAD_SAFE),
        control_progress: dom
            .map(|d| d.control_progress)
            .unwrap_or(fi::FI_PROGRESS_AUTO),
        data_progress: dom.map(|d| d.data_progress).unwrap_or(fi::FI_PROGRESS_AUTO),
        resource_mgmt: dom.map(|d| d.resource_mgmt).unwrap_or(fi::FI_RM_ENABLED),
        av_type: dom.map(|d| d.av_type).unwrap_or(fi::FI_AV_UNSPEC),
        mr_mode: dom.map(|d| d.mr_mode).unwrap_or(0),
        tx_op_flags: tx.map(|t| t.op_flags).unwrap_or(0),
        rx_op_flags: rx.map(|r| r.op_flags).unwrap_or(0),
        api_version: crate::API_VERSION,
    })
}
