//! Helpers shared by Braid's integration tests (`tests/all`) and the `braid-test-peer`
//! binary: the line protocol the two processes speak over the child's stdin and stdout, and
//! deterministic test data both sides can compute. [`fuzz_checks`] holds the bodies of the
//! fuzz targets, run both by `fuzz/` and by the stable corpus replay; [`oracle`] says what
//! completions and memory must look like after a workload.
//!
//! The protocol, one line per message:
//!
//! - peer → test, at start: `QP <addr> <qpn> <psn> <rkey> <region length>`
//! - test → peer: `QP <addr> <qpn> <psn> 0 0` (the test's QP); the peer connects and answers
//!   `READY`
//! - test → peer: `SUM <offset> <len>`; the peer answers `SUM <fnv1a of those region bytes>`
//! - test → peer: `RECV`; the peer waits for its next receive completion and answers
//!   `RECV <wr_id> <status> <byte_len> <imm or -> <fnv1a of the received bytes>`
//! - test → peer: `STATS`; the peer answers `STATS <rx_unknown_qp> <rx_wrong_peer>
//!   <rx_duplicates> <rx_out_of_window> <rx_bad_crc>` (its device's drop counters)
//! - test → peer: `QUIT` (or end of input); the peer exits with status 0
//!
//! The peer's optional first argument is the address to bind (default `127.0.0.1:0`), so it
//! can run in another network namespace.
#![warn(missing_docs)]

pub mod conformance;
pub mod fuzz_checks;
pub mod oracle;

use std::net::SocketAddr;

use braid::QpInfo;

/// Bytes of the region the peer serves. Its first half holds [`pattern_byte`]s.
pub const PEER_REGION_LEN: u64 = 1 << 20;
/// Bytes of the peer's receive buffer.
pub const PEER_RECV_LEN: u32 = 64 * 1024;

/// 64-bit FNV-1a: a small, dependency-free fingerprint of a byte range.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The byte at `offset` of deterministic test data.
pub fn pattern_byte(offset: u64) -> u8 {
    (offset.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// `QP <addr> <qpn> <psn> <rkey> <len>`.
pub fn format_info(info: &QpInfo, rkey: u32, len: u64) -> String {
    format!(
        "QP {} {} {} {} {}",
        info.addr, info.qpn, info.psn, rkey, len
    )
}

/// Parses a line written by [`format_info`].
pub fn parse_info(line: &str) -> Option<(QpInfo, u32, u64)> {
    let mut it = line.split_whitespace();
    if it.next()? != "QP" {
        return None;
    }
    let addr: SocketAddr = it.next()?.parse().ok()?;
    let qpn = it.next()?.parse().ok()?;
    let psn = it.next()?.parse().ok()?;
    let rkey = it.next()?.parse().ok()?;
    let len = it.next()?.parse().ok()?;
    Some((
        QpInfo {
            addr,
            qpn,
            psn,
            seal_key: None,
        },
        rkey,
        len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lines_round_trip() {
        let info = QpInfo {
            addr: "127.0.0.1:4791".parse().unwrap(),
            qpn: 77,
            psn: u32::MAX,
            seal_key: None,
        };
        assert_eq!(
            parse_info(&format_info(&info, 9, 1 << 20)),
            Some((info, 9, 1 << 20))
        );
        assert_eq!(parse_info("READY"), None);
    }
}
