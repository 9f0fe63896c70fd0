//! The part of libibverbs' C ABI Braid uses, loaded at run time.
//!
//! Why our own table instead of a crate: `ibverbs`/`ibverbs-sys` link libibverbs at build time
//! and need cmake and libclang to generate their bindings; `sideway` (MPL-2.0, on
//! `rdma-mummy-sys`) loads it at run time but brings a much larger API than the twenty-three
//! calls and twelve structures below. The layouts are those of rdma-core's `infiniband/verbs.h`
//! (stable ABI since libibverbs 1.1; checked against rdma-core 44 with `offsetof`, and the
//! sizes are asserted at the bottom of this file).
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are `static inline`
//! in `verbs.h`: they call through the function table in `struct ibv_context`, so [`ibv_context_ops`] spells
//! that table out up to the entries we call.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

/// The library's file name (the ABI version rdma-core has shipped since 2006).
pub(crate) const LIBIBVERBS: &str = "libibverbs.so.1";

#[repr(C)]
pub(crate) struct ibv_device {
    _opaque: [u8; 0],
}

#[repr(C)]
pub(crate) struct ibv_context_ops {
    _compat_0_10: [*const c_void; 11],
    pub(crate) poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub(crate) req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    _compat_13_24: [*const c_void; 12],
    pub(crate) post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub(crate) post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    _compat_27_31: [*const c_void; 5],
}

/// The head of `struct ibv_context` (we never allocate one, only read through the pointer
/// libibverbs returns).
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut ibv_device,
    pub(crate) ops: ibv_context_ops,
}

#[repr(C)]
pub(crate) struct ibv_pd {
    pub(crate) context: *mut ibv_context,
    pub(crate) handle: u32,
}

/// `struct ibv_comp_channel`: a file descriptor that becomes readable when a CQ armed with
/// `ibv_req_notify_cq` gets a completion.
#[repr(C)]
pub(crate) struct ibv_comp_channel {
    pub(crate) context: *mut ibv_context,
    pub(crate) fd: c_int,
    pub(crate) refcnt: c_int,
}

/// The head of `struct ibv_cq`.
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
}

/// The head of `struct ibv_qp`, up to the QP number.
#[repr(C)]
pub(crate) struct ibv_qp {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
}

#[repr(C)]
pub(crate) struct ibv_mr {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: u32,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: u32,
    pub(crate) _rest: [c_int; 14],
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_port_attr {
    pub(crate) state: u32,
    pub(crate) max_mtu: u32,
    pub(crate) active_mtu: u32,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
}

#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_gid_entry {
    pub(crate) gid: [u8; 16],
    pub(crate) gid_index: u32,
    pub(crate) port_num: u32,
    pub(crate) gid_type: u32,
    pub(crate) ndev_ifindex: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_wc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) opcode: u32,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    /// Network byte order when `wc_flags & IBV_WC_WITH_IMM`.
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: u32,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`; `wr.rdma` is its prefix with the rkey moved up, so
/// both are spelled out and written through [`ibv_send_wr::set_rdma`] / `set_atomic`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct wr_atomic {
    pub(crate) remote_addr: u64,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) rkey: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: u32,
    pub(crate) send_flags: u32,
    /// Network byte order.
    pub(crate) imm_data: u32,
    /// The `wr` union, as its largest member (`atomic`).
    pub(crate) wr: wr_atomic,
    pub(crate) qp_type: u32,
    _pad: u32,
    /// The `bind_mw` / `tso` union, unused.
    _bind_mw: [u64; 6],
}

impl ibv_send_wr {
    pub(crate) fn zeroed() -> ibv_send_wr {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: wr_atomic::default(),
            qp_type: 0,
            _pad: 0,
            _bind_mw: [0; 6],
        }
    }

    /// `wr.rdma = { remote_addr, rkey }`: the rkey sits right after the address.
    pub(crate) fn set_rdma(&mut self, remote_addr: u64, rkey: u32) {
        self.wr = wr_atomic::default();
        self.wr.remote_addr = remote_addr;
        // `wr.rdma.rkey` overlays the low half of `wr.atomic.compare_add` (little endian).
        self.wr.compare_add = u64::from(rkey);
    }

    pub(crate) fn set_atomic(&mut self, remote_addr: u64, rkey: u32, compare_add: u64, swap: u64) {
        self.wr = wr_atomic {
            remote_addr,
            compare_add,
            swap,
            rkey,
            _pad: 0,
        };
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_recv_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_recv_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_qp_init_attr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: u32,
    pub(crate) sq_sig_all: c_int,
}

/// `union ibv_gid` holds two `__be64`, so the structures holding it are 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: [u8; 16],
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_ah_attr {
    pub(crate) grh: ibv_global_route,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_attr {
    pub(crate) qp_state: u32,
    pub(crate) cur_qp_state: u32,
    pub(crate) path_mtu: u32,
    pub(crate) path_mig_state: u32,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: u32,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) alt_ah_attr: ibv_ah_attr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

// enum ibv_wc_status
pub(crate) const IBV_WC_SUCCESS: u32 = 0;
pub(crate) const IBV_WC_LOC_LEN_ERR: u32 = 1;
pub(crate) const IBV_WC_LOC_QP_OP_ERR: u32 = 2;
pub(crate) const IBV_WC_LOC_EEC_OP_ERR: u32 = 3;
pub(crate) const IBV_WC_LOC_PROT_ERR: u32 = 4;
pub(crate) const IBV_WC_WR_FLUSH_ERR: u32 = 5;
pub(crate) const IBV_WC_MW_BIND_ERR: u32 = 6;
pub(crate) const IBV_WC_BAD_RESP_ERR: u32 = 7;
pub(crate) const IBV_WC_LOC_ACCESS_ERR: u32 = 8;
pub(crate) const IBV_WC_REM_INV_REQ_ERR: u32 = 9;
pub(crate) const IBV_WC_REM_ACCESS_ERR: u32 = 10;
pub(crate) const IBV_WC_REM_OP_ERR: u32 = 11;
pub(crate) const IBV_WC_RETRY_EXC_ERR: u32 = 12;
pub(crate) const IBV_WC_RNR_RETRY_EXC_ERR: u32 = 13;
pub(crate) const IBV_WC_LOC_RDD_VIOL_ERR: u32 = 14;
pub(crate) const IBV_WC_REM_INV_RD_REQ_ERR: u32 = 15;
pub(crate) const IBV_WC_REM_ABORT_ERR: u32 = 16;
pub(crate) const IBV_WC_INV_EECN_ERR: u32 = 17;
pub(crate) const IBV_WC_INV_EEC_STATE_ERR: u32 = 18;
pub(crate) const IBV_WC_FATAL_ERR: u32 = 19;
pub(crate) const IBV_WC_RESP_TIMEOUT_ERR: u32 = 20;
pub(crate) const IBV_WC_GENERAL_ERR: u32 = 21;
pub(crate) const IBV_WC_TM_ERR: u32 = 22;
pub(crate) const IBV_WC_TM_RNDV_INCOMPLETE: u32 = 23;

// enum ibv_wc_opcode (receive side; the send side is known from what was posted)
pub(crate) const IBV_WC_RECV_RDMA_WITH_IMM: u32 = 129;
// enum ibv_wc_flags
pub(crate) const IBV_WC_WITH_IMM: u32 = 1 << 1;

// enum ibv_wr_opcode
pub(crate) const IBV_WR_RDMA_WRITE: u32 = 0;
pub(crate) const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub(crate) const IBV_WR_SEND: u32 = 2;
pub(crate) const IBV_WR_SEND_WITH_IMM: u32 = 3;
pub(crate) const IBV_WR_RDMA_READ: u32 = 4;
pub(crate) const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub(crate) const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
// enum ibv_send_flags
pub(crate) const IBV_SEND_SIGNALED: u32 = 1 << 1;

// enum ibv_access_flags (Braid's `Access` bits are the same four)
pub(crate) const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: u32 = 1 << 2;
pub(crate) const IBV_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;

// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: c_int = 1 << 0;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_qp_state, ibv_qp_type, ibv_port_state, ibv_atomic_cap, ibv_gid_type
pub(crate) const IBV_QPS_INIT: u32 = 1;
pub(crate) const IBV_QPS_RTR: u32 = 2;
pub(crate) const IBV_QPS_RTS: u32 = 3;
pub(crate) const IBV_QPS_ERR: u32 = 6;
pub(crate) const IBV_QPT_RC: u32 = 2;
pub(crate) const IBV_PORT_ACTIVE: u32 = 4;
pub(crate) const IBV_ATOMIC_NONE: u32 = 0;
pub(crate) const IBV_GID_TYPE_IB: u32 = 0;
pub(crate) const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub(crate) const IBV_GID_TYPE_ROCE_V2: u32 = 2;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut ibv_device);
type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut [u8; 16]) -> c_int;
type QueryGidEx =
    unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type RegMrIova2 = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, u32) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type CreateCompChannel = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
type DestroyCompChannel = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
type GetCqEvent =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
type AckCqEvents = unsafe extern "C" fn(*mut ibv_cq, u32);
type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;

/// The loaded library and the functions Braid calls in it.
pub(crate) struct Lib {
    pub(crate) get_device_list: GetDeviceList,
    pub(crate) free_device_list: FreeDeviceList,
    pub(crate) get_device_name: GetDeviceName,
    pub(crate) open_device: OpenDevice,
    pub(crate) close_device: CloseDevice,
    pub(crate) query_device: QueryDevice,
    pub(crate) query_port: QueryPort,
    pub(crate) query_gid: QueryGid,
    /// `_ibv_query_gid_ex` (libibverbs 1.11, rdma-core 32): the GID type, for the RoCE
    /// version. Older libraries report the version as unknown.
    pub(crate) query_gid_ex: Option<QueryGidEx>,
    pub(crate) alloc_pd: AllocPd,
    pub(crate) dealloc_pd: DeallocPd,
    pub(crate) reg_mr_iova2: RegMrIova2,
    pub(crate) dereg_mr: DeregMr,
    pub(crate) create_cq: CreateCq,
    pub(crate) destroy_cq: DestroyCq,
    pub(crate) create_comp_channel: CreateCompChannel,
    pub(crate) destroy_comp_channel: DestroyCompChannel,
    pub(crate) get_cq_event: GetCqEvent,
    pub(crate) ack_cq_events: AckCqEvents,
    pub(crate) create_qp: CreateQp,
    pub(crate) modify_qp: ModifyQp,
    pub(crate) destroy_qp: DestroyQp,
    /// Keeps the function pointers above valid.
    _lib: Library,
}

impl Lib {
    /// Loads libibverbs and looks up every function; `Err` names what was missing.
    pub(crate) fn load() -> Result<Lib, String> {
        // SAFETY: loading libibverbs runs its constructors, which only set up its own state
        // (provider list, fork handling); it is a well-known system library.
        let lib = unsafe { Library::new(LIBIBVERBS) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: `$ty` is the C prototype of `$name` in rdma-core's verbs.h; the
                // pointer is copied out and stays valid while `_lib` (kept in `Lib`) is loaded.
                let s = unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
                s.map(|s| *s)
            }};
        }
        macro_rules! need {
            ($name:literal, $ty:ty) => {
                sym!($name, $ty).map_err(|e| format!("{}: {e}", $name))?
            };
        }
        Ok(Lib {
            get_device_list: need!("ibv_get_device_list", GetDeviceList),
            free_device_list: need!("ibv_free_device_list", FreeDeviceList),
            get_device_name: need!("ibv_get_device_name", GetDeviceName),
            open_device: need!("ibv_open_device", OpenDevice),
            close_device: need!("ibv_close_device", CloseDevice),
            query_device: need!("ibv_query_device", QueryDevice),
            query_port: need!("ibv_query_port", QueryPort),
            query_gid: need!("ibv_query_gid", QueryGid),
            query_gid_ex: sym!("_ibv_query_gid_ex", QueryGidEx).ok(),
            alloc_pd: need!("ibv_alloc_pd", AllocPd),
            dealloc_pd: need!("ibv_dealloc_pd", DeallocPd),
            reg_mr_iova2: need!("ibv_reg_mr_iova2", RegMrIova2),
            dereg_mr: need!("ibv_dereg_mr", DeregMr),
            create_cq: need!("ibv_create_cq", CreateCq),
            destroy_cq: need!("ibv_destroy_cq", DestroyCq),
            create_comp_channel: need!("ibv_create_comp_channel", CreateCompChannel),
            destroy_comp_channel: need!("ibv_destroy_comp_channel", DestroyCompChannel),
            get_cq_event: need!("ibv_get_cq_event", GetCqEvent),
            ack_cq_events: need!("ibv_ack_cq_events", AckCqEvents),
            create_qp: need!("ibv_create_qp", CreateQp),
            modify_qp: need!("ibv_modify_qp", ModifyQp),
            destroy_qp: need!("ibv_destroy_qp", DestroyQp),
            _lib: lib,
        })
    }
}

// Sizes and offsets from rdma-core 44's verbs.h on x86_64 (gcc, `sizeof`/`offsetof`).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, max_mr_size) == 80);
    assert!(offset_of!(ibv_device_attr, atomic_cap) == 164);
    assert!(offset_of!(ibv_device_attr, phys_port_cnt) == 227);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(offset_of!(ibv_context, ops) == 8);
    assert!(offset_of!(ibv_context_ops, poll_cq) == 88);
    assert!(offset_of!(ibv_context_ops, req_notify_cq) == 96);
    assert!(size_of::<ibv_comp_channel>() == 16);
    assert!(offset_of!(ibv_context_ops, post_send) == 200);
    assert!(offset_of!(ibv_context_ops, post_recv) == 208);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_mr, lkey) == 36);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(offset_of!(ibv_wc, wc_flags) == 36);
    assert!(size_of::<ibv_sge>() == 16);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, wr) == 40);
    assert!(offset_of!(ibv_send_wr, qp_type) == 72);
    assert!(offset_of!(ibv_send_wr, _bind_mw) == 80);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(size_of::<ibv_global_route>() == 24);
    assert!(size_of::<ibv_gid_entry>() == 32);
};
