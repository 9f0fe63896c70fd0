//! One simulator: real engines on any simulated [`Network`](braid_datapath::net::Network),
//! driven by one [`Driver`], and the fabric-scale scenarios built on it ([`fabric`]).
//!
//! The network model (per-path links or a leaf-spine fabric, both behind
//! `braid_datapath::net::Network`) decides where and when datagrams arrive; the [`Driver`]
//! owns everything between the network and the engines (deliveries, timers, transmissions
//! paced by the NIC, completions, wake-ups) so tests, fuzz targets and `braid-fabric` do not
//! each write it again.
pub mod driver;
pub mod fabric;
pub mod topo;

pub use driver::{CqQueues, Driver, DriverConfig, Handler, HostModel, Livelock, Service};
