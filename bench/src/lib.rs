//! Shared pieces of Braid's benchmark tools: the test loops `braid-perf` runs over a connected
//! queue pair, data patterns for end-to-end verification, latency percentiles, the JSON report
//! shapes, and the bootstrap messages `braid-perf client` and `server` exchange over TCP.
#![warn(missing_docs)]

pub mod blast;
pub mod fabric;
pub mod pattern;
pub mod report;
pub mod run;
pub mod stats;
pub mod wire;

/// A byte count as the tools take it: a number with an optional suffix K, M or G (powers of
/// 1024; `KiB`, `MB` and the like too), from 1 byte to 4 GiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match t[i..].to_ascii_lowercase().as_str() {
                "b" => 1,
                "k" | "kb" | "ki" | "kib" => 1 << 10,
                "m" | "mb" | "mi" | "mib" => 1 << 20,
                "g" | "gb" | "gi" | "gib" => 1 << 30,
                other => return Err(format!("unknown size suffix {other:?} (use K, M or G)")),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("size too large: {s:?}"))?;
    if v == 0 || v > u64::from(u32::MAX) {
        return Err(format!("size must be 1 byte to 4 GiB: {s:?}"));
    }
    Ok(v)
}
