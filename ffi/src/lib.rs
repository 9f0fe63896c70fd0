//! The C ABI of Braid (`libbraid.so` + `braid.h`) and, later, the libfabric provider.
//!
//! Not built yet: this crate only reserves the place in the workspace. The C API has its own
//! issue; until it lands, C programs cannot use Braid.
#![warn(missing_docs)]

/// The Braid version this crate was built from, for a future `braid_version()`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
