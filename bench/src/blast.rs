//! What the two ceiling binaries (`udp-blast`, `xdp-blast`) share: the receiver's wait
//! settings and how a result is printed.
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

/// The longest `--first-wait` accepted, seconds.
const FIRST_WAIT_S_MAX: f64 = 3600.0;

/// A receiver's `--idle` (silence that ends a run, under a minute) and `--first-wait` (how
/// long to wait for the first datagram, up to an hour), checked.
pub fn receiver_waits(idle: f64, first_wait: f64) -> Result<(Duration, Duration), String> {
    if !(idle > 0.0 && idle < 60.0) {
        return Err("--idle must be between 0 and 60 seconds".into());
    }
    if !(first_wait > 0.0 && first_wait <= FIRST_WAIT_S_MAX) {
        return Err("--first-wait must be between 0 and 3600 seconds".into());
    }
    Ok((
        Duration::from_secs_f64(idle),
        Duration::from_secs_f64(first_wait),
    ))
}

/// Prints `res` as one JSON line (`json`) or as `text` says, or its error on stderr under
/// the tool's name, and returns the exit code.
pub fn finish<R: Serialize>(
    tool: &str,
    res: Result<R, String>,
    json: bool,
    text: impl FnOnce(&R) -> String,
) -> ExitCode {
    let out = res.and_then(|r| {
        if json {
            serde_json::to_string(&r).map_err(|e| e.to_string())
        } else {
            Ok(text(&r))
        }
    });
    match out {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{tool}: error: {e}");
            ExitCode::FAILURE
        }
    }
}
