//! `braid`, a libfabric provider over Braid: unmodified libfabric applications load
//! `libbraid_fi.so` through `FI_PROVIDER_PATH` and select it with `FI_PROVIDER=braid` or
//! `-p braid`.
//!
//! What it offers: reliable connectionless endpoints (`FI_EP_RDM`) with `FI_MSG` and
//! `FI_TAGGED` (tag and ignore mask, directed receive, unexpected messages buffered until a
//! receive matches), `FI_RMA` (write, read, writedata) and `FI_ATOMIC` for what the engine
//! does (64-bit sum, read, compare-and-swap), address vectors (table and map), completion
//! queues in the context, msg, data and tagged formats with error entries, `FI_WAIT_FD` and
//! `fi_cq_sread`, event queues, counters and memory registration with provider keys (remote
//! addresses are offsets into the region, or virtual addresses when the application asks for
//! `FI_MR_VIRT_ADDR` or `FI_MR_BASIC`). What it does not offer (the ops exist and return
//! `-FI_ENOSYS` or `-FI_EOPNOTSUPP`, no op pointer is NULL): connected endpoints
//! (`FI_EP_MSG`), `FI_EP_DGRAM`, collectives, scalable endpoints, shared contexts, triggered
//! operations, wait sets and poll sets.
//!
//! How it maps onto Braid: a domain is one Braid device (one UDP port on the domain's
//! interface address) with the connection handshake enabled, so the first operation to an
//! address sets up a Braid QP to that peer (`braid::handshake`); a request from a peer not yet
//! in the address vector is accepted. Messages up to [`EAGER_MAX`] bytes go eagerly into
//! provider receive buffers and are copied out when a receive matches; larger ones use
//! rendezvous: the sender registers its buffer and sends a request-to-send, the receiver
//! issues a Braid READ straight into the user's buffer (zero copy) and tells the sender when
//! it is done.
//!
//! Progress: Braid's progress thread moves the data; the provider's matching runs inside
//! every provider call (so `FI_PROGRESS_MANUAL` applications are served) and on one provider
//! thread per endpoint (so `FI_PROGRESS_AUTO` holds while the application is away).
//!
//! Endpoints per domain: up to [`MAX_EPS_PER_DOMAIN`]. The first endpoint opened uses the
//! domain's device; each further one opens a Braid device of its own (its own UDP port on
//! the domain's interface, QP space, handshake and progress), because the handshake keys a
//! connection by the peer device's address: two endpoints on one device talking to the same
//! peer would share one QP and one stream of provider messages. Memory regions are the
//! domain's and live on the domain's device, so their keys serve RMA and atomics aimed at
//! the domain's first endpoint; aimed at a further endpoint they fail with `FI_EACCES`
//! (messages, tagged messages and RMA *issued* by any endpoint work everywhere).
//!
//! Memory per peer: [`RX_SLOTS`] receive buffers of [`SLOT_LEN`] bytes (about 257 KiB) while a
//! connection is up, plus the Braid QP; an endpoint holds [`TX_SLOTS`] send buffers (about
//! 4 MiB) whatever the number of peers.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs, unreachable_pub)]

#[allow(
    missing_docs,
    unreachable_pub,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]
pub mod bindings;

mod ep;
mod ep_stubs;
mod info;
mod objects;
mod util;

use bindings as fi;

/// Largest message payload sent eagerly (into the peer's provider buffers); larger messages
/// use rendezvous (a Braid READ into the receiver's buffer), whose two extra one-way trips
/// (the request to send, the READ) cost more than the eager copies up to here (`ofi_rxm`'s
/// default eager limit too; measured in bench/results/session-2026-12-07-s41.md).
pub const EAGER_MAX: usize = 16 << 10;
/// Bytes of the provider's message header in front of every eager payload.
pub const HEADER_LEN: usize = 40;
/// Size of one provider buffer (a header and an eager payload).
pub const SLOT_LEN: usize = HEADER_LEN + EAGER_MAX;
/// Provider receive buffers posted per connected peer.
pub const RX_SLOTS: usize = 16;
/// Provider send buffers per endpoint: eager sends, injects and control messages in flight.
pub const TX_SLOTS: usize = 256;
/// Largest message (rendezvous READs are one Braid READ each, which carries a u32 length).
pub const MAX_MSG_SIZE: usize = 1 << 30;
/// Receives one endpoint holds posted at once.
pub const RX_QUEUE: usize = 4096;
/// Bytes of unexpected eager messages an endpoint buffers; beyond, a message stays in its
/// provider buffer (which is not reposted) until a receive matches, so the sender is pushed
/// back by Braid's receiver-not-ready retries instead of growing memory.
pub const UNEXPECTED_BYTES_MAX: usize = 64 << 20;
/// Endpoints one domain opens at once (`ep_cnt`).
pub const MAX_EPS_PER_DOMAIN: usize = 64;
/// Entries of scatter/gather lists accepted per operation.
pub const IOV_LIMIT: usize = 4;

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The provider's version.
pub const PROVIDER_VERSION: u32 = fi_version(0, 1);
/// The libfabric API version the provider is built for.
pub const API_VERSION: u32 = fi_version(1, 17);
/// The provider (and fabric) name.
pub const NAME: &std::ffi::CStr = c"braid";

/// The provider table. libfabric writes its `context` field at load time (its own
/// bookkeeping), so the table lives in writable memory, behind an `UnsafeCell`.
struct Provider(std::cell::UnsafeCell<fi::fi_provider>);
// SAFETY: the provider only reads the table; libfabric writes `context` while it loads
// providers and reads it afterwards, serialised by its own initialisation.
unsafe impl Sync for Provider {}

static PROVIDER: Provider = Provider(std::cell::UnsafeCell::new(fi::fi_provider {
    version: PROVIDER_VERSION,
    fi_version: API_VERSION,
    context: fi::fi_context {
        internal: [std::ptr::null_mut(); 4],
    },
    name: NAME.as_ptr(),
    getinfo: Some(info::getinfo),
    fabric: Some(objects::fabric_open),
    cleanup: Some(cleanup),
}));

extern "C" fn cleanup() {}

/// The entry point libfabric's loader calls after `dlopen` of an external provider.
#[unsafe(no_mangle)]
pub extern "C" fn fi_prov_ini() -> *mut fi::fi_provider {
    PROVIDER.0.get()
}
