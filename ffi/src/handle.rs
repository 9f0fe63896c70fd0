//! The handle registry: what a C handle stands for.
//!
//! A handle is not an address. It is a token `serial << 3 | kind`, with a serial that is
//! never reused, cast to the opaque pointer type the header declares. Every call looks the
//! token up here under a read lock and clones the object's `Arc`, so:
//! - a NULL, forged, destroyed (double destroy) or wrong-kind handle is an error, never a
//!   dereference of freed memory;
//! - an object destroyed while another thread is using it lives until that call returns.
//!
//! Each entry counts its children (a device its PDs and CQs, a PD its regions and QPs, a CQ
//! the QPs that report to it), so that destroying a parent first returns `BRAID_EBUSY`.
//! Creating and destroying take the write lock, which keeps those counts exact.
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use braid_rt::{CompletionQueue, Device, MemoryRegion, ProtectionDomain, QueuePair};

use crate::error::{BRAID_EBADF, BRAID_EBUSY, BRAID_EFAULT, Error, Result};
use crate::types::{braid_cq, braid_device, braid_mr, braid_pd, braid_qp};

/// What a device handle holds.
pub(crate) struct DeviceObj {
    pub(crate) dev: Device,
    /// Send queue depth per QP, as configured.
    pub(crate) max_send_wr: u32,
    /// Receive queue depth per QP, as configured.
    pub(crate) max_recv_wr: u32,
}

/// What a PD handle holds.
pub(crate) struct PdObj {
    pub(crate) pd: ProtectionDomain,
    /// The device's handle token.
    pub(crate) device: u64,
}

/// What a memory region handle holds.
pub(crate) struct MrObj {
    pub(crate) mr: MemoryRegion,
    /// Whether the library allocated the memory.
    pub(crate) library_owned: bool,
}

/// What a CQ handle holds.
pub(crate) struct CqObj {
    pub(crate) cq: CompletionQueue,
    /// The device's handle token.
    pub(crate) device: u64,
}

/// What a QP handle holds.
pub(crate) struct QpObj {
    pub(crate) qp: QueuePair,
}

/// A registered object of any kind.
pub(crate) enum Obj {
    Device(Arc<DeviceObj>),
    Pd(Arc<PdObj>),
    Mr(Arc<MrObj>),
    Cq(Arc<CqObj>),
    Qp(Arc<QpObj>),
}

/// A C handle type and the object it stands for.
pub(crate) trait Kind {
    /// The low bits of its tokens.
    const TAG: u64;
    /// Its name in error messages.
    const NAME: &'static str;
    /// The object behind it.
    type Obj;
    fn wrap(obj: Arc<Self::Obj>) -> Obj;
    fn unwrap(obj: &Obj) -> Option<&Arc<Self::Obj>>;
}

macro_rules! kind {
    ($c:ty, $tag:expr, $name:expr, $obj:ty, $variant:ident) => {
        impl Kind for $c {
            const TAG: u64 = $tag;
            const NAME: &'static str = $name;
            type Obj = $obj;
            fn wrap(obj: Arc<$obj>) -> Obj {
                Obj::$variant(obj)
            }
            fn unwrap(obj: &Obj) -> Option<&Arc<$obj>> {
                match obj {
                    Obj::$variant(o) => Some(o),
                    _ => None,
                }
            }
        }
    };
}

kind!(braid_device, 1, "device", DeviceObj, Device);
kind!(braid_pd, 2, "protection domain", PdObj, Pd);
kind!(braid_mr, 3, "memory region", MrObj, Mr);
kind!(braid_cq, 4, "completion queue", CqObj, Cq);
kind!(braid_qp, 5, "queue pair", QpObj, Qp);

const TAG_BITS: u32 = 3;

struct Entry {
    obj: Obj,
    /// Tokens of the entries that count this one as a child.
    parents: Vec<u64>,
    /// Live entries that name this one as a parent.
    children: usize,
}

struct Registry {
    next_serial: u64,
    map: HashMap<u64, Entry>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| {
    RwLock::new(Registry {
        next_serial: 1,
        map: HashMap::new(),
    })
});

fn read() -> RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner())
}

fn write() -> RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(|e| e.into_inner())
}

/// The token of a handle.
pub(crate) fn token<K>(h: *const K) -> u64 {
    h.addr() as u64
}

fn check<K: Kind>(h: *const K) -> Result<u64> {
    if h.is_null() {
        return Err(Error::new(
            BRAID_EFAULT,
            format!("{} handle is NULL", K::NAME),
        ));
    }
    let t = token(h);
    if t & ((1 << TAG_BITS) - 1) != K::TAG {
        return Err(Error::new(BRAID_EBADF, format!("not a {} handle", K::NAME)));
    }
    Ok(t)
}

fn stale<K: Kind>() -> Error {
    Error::new(
        BRAID_EBADF,
        format!(
            "not a live {} handle (destroyed, or never created)",
            K::NAME
        ),
    )
}

/// The object behind a live handle of kind `K`.
pub(crate) fn get<K: Kind>(h: *const K) -> Result<Arc<K::Obj>> {
    let t = check(h)?;
    read()
        .map
        .get(&t)
        .and_then(|e| K::unwrap(&e.obj))
        .cloned()
        .ok_or_else(stale::<K>)
}

/// Registers `obj` as a child of the handles in `parents` (which must still be live) and
/// returns its new handle. If a parent was destroyed meanwhile, `obj` is dropped.
pub(crate) fn insert<K: Kind>(obj: K::Obj, parents: &[u64]) -> Result<*mut K> {
    let obj = K::wrap(Arc::new(obj));
    let mut reg = write();
    if let Some(gone) = parents.iter().find(|p| !reg.map.contains_key(p)) {
        drop(reg);
        drop(obj);
        return Err(Error::new(
            BRAID_EBADF,
            format!("parent handle {gone:#x} was destroyed meanwhile"),
        ));
    }
    for p in parents {
        if let Some(e) = reg.map.get_mut(p) {
            e.children += 1;
        }
    }
    let serial = reg.next_serial;
    reg.next_serial += 1;
    let t = serial << TAG_BITS | K::TAG;
    reg.map.insert(
        t,
        Entry {
            obj,
            parents: parents.to_vec(),
            children: 0,
        },
    );
    Ok(core::ptr::without_provenance_mut(t as usize))
}

/// Unregisters a live handle without children and returns its object, for the caller to
/// drop outside the registry lock (dropping may wait for the engine).
pub(crate) fn remove<K: Kind>(h: *mut K) -> Result<Obj> {
    let t = check(h)?;
    let mut reg = write();
    match reg.map.get(&t) {
        Some(e) if K::unwrap(&e.obj).is_some() => {
            if e.children > 0 {
                return Err(Error::new(
                    BRAID_EBUSY,
                    format!(
                        "the {} still has {} live object(s) created from it: destroy them first",
                        K::NAME,
                        e.children
                    ),
                ));
            }
        }
        _ => return Err(stale::<K>()),
    }
    let entry = reg.map.remove(&t).ok_or_else(stale::<K>)?;
    for p in &entry.parents {
        if let Some(e) = reg.map.get_mut(p) {
            e.children = e.children.saturating_sub(1);
        }
    }
    Ok(entry.obj)
}
