//! The bootstrap `braid-perf client` and `server` exchange over TCP: one JSON object per line.
//!
//! 1. client → server: [`Hello`] (test, sizes, engine settings, the client QP).
//! 2. server → client: [`Welcome`] (the server QP, its region's rkey and length), or
//!    [`Welcome::error`] set when the server refuses.
//! 3. The test runs over Braid.
//! 4. client → server: [`Done`]; server → client: [`Bye`] (the server's per-path counters).
use std::io::{BufRead, Write};
use std::net::SocketAddr;

use braid::QpInfo;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::report::{PathRow, QpTelemetry};

/// A [`QpInfo`] on the wire.
#[derive(Copy, Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireQp {
    /// Device address.
    pub addr: SocketAddr,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// X25519 public key of an encrypted QP (absent for a plain one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal_key: Option<[u8; 32]>,
}

impl From<QpInfo> for WireQp {
    fn from(q: QpInfo) -> Self {
        WireQp {
            addr: q.addr,
            qpn: q.qpn,
            psn: q.psn,
            seal_key: q.seal_key,
        }
    }
}

impl From<WireQp> for QpInfo {
    fn from(q: WireQp) -> Self {
        QpInfo {
            addr: q.addr,
            qpn: q.qpn,
            psn: q.psn,
            seal_key: q.seal_key,
        }
    }
}

/// The client's opening message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// Test the client will run (the server prepares for it: READ data, posted receives).
    pub test: String,
    /// Message size (largest, for a sweep).
    pub size: u64,
    /// Bytes the server should register (REMOTE_WRITE | REMOTE_READ | LOCAL_WRITE).
    pub region_len: u64,
    /// Paths per connection (both sides use the same).
    pub paths: u16,
    /// Largest datagram (both sides use the same: it sizes the receive buffers).
    pub max_datagram: usize,
    /// New packets per path draw (burst spraying; both sides use the same, so READ
    /// responses leave in bursts as WRITEs do). Absent from older clients: 1.
    #[serde(default = "one")]
    pub burst: u16,
    /// ACK coalescing of both sides (`--ack-every`); absent: each device's default.
    #[serde(default)]
    pub ack_every: Option<u16>,
    /// The client's QP.
    pub qp: WireQp,
    /// The client device's engine shards; the server opens its device with as many
    /// (absent: the server's own default).
    #[serde(default)]
    pub shards: Option<u16>,
    /// The client's further QPs of a multi-QP bandwidth test (`--qps`): the server answers
    /// each with a QP and a region of `region_len` bytes of its own.
    #[serde(default)]
    pub more_qps: Vec<WireQp>,
}

fn one() -> u16 {
    1
}

/// The server's answer.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Welcome {
    /// The server's QP (absent on error).
    pub qp: Option<WireQp>,
    /// Remote key of the server's region.
    pub rkey: u32,
    /// Length of the server's region.
    pub region_len: u64,
    /// Datapath the server uses.
    pub datapath: String,
    /// Why the server refused, if it did.
    pub error: Option<String>,
    /// The server's QP and region for each of the client's `more_qps`, in order.
    #[serde(default)]
    pub more: Vec<WireRemote>,
}

/// A server QP and the remote key of the region that goes with it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireRemote {
    /// The server's QP.
    pub qp: WireQp,
    /// Remote key of its region (`Welcome::region_len` bytes).
    pub rkey: u32,
}

/// The client is finished.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Done {
    /// Always true; present so the line is a non-empty object.
    pub done: bool,
}

/// The server's farewell with its counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Bye {
    /// The server device's per-path counters.
    pub paths: Vec<PathRow>,
    /// Receives the server's echo loop handled (send_lat).
    pub echoed: u64,
    /// The server QP's telemetry (absent from older servers).
    #[serde(default)]
    pub qp: Option<QpTelemetry>,
}

/// Writes `msg` as one JSON line.
pub fn send_line<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), String> {
    let mut s = serde_json::to_string(msg).map_err(|e| format!("encode: {e}"))?;
    s.push('\n');
    w.write_all(s.as_bytes())
        .and_then(|_| w.flush())
        .map_err(|e| format!("bootstrap write: {e}"))
}

/// Reads one JSON line into a `T`.
pub fn recv_line<T: DeserializeOwned>(r: &mut impl BufRead) -> Result<T, String> {
    let mut line = String::new();
    let n = r
        .read_line(&mut line)
        .map_err(|e| format!("bootstrap read: {e}"))?;
    if n == 0 {
        return Err("bootstrap connection closed by peer".to_string());
    }
    serde_json::from_str(line.trim_end())
        .map_err(|e| format!("bootstrap: bad message {:?}: {e}", line.trim_end()))
}
