//! Congestion control for Braid, as pure algorithms.
//!
//! This crate does no I/O, reads no clock and starts no thread: every call takes `now`. It
//! knows nothing of packet formats. The engine calls a [`Controller`] per connection when it
//! sends, when an acknowledgement arrives and when it detects congestion (loss or ECN), and
//! asks it how many bytes may be in flight.
//!
//! Only a fixed window lives here so far; the delay-based (Swift-style) and ECN-based
//! (DCQCN-style) controllers and per-path scoring plug in behind the same trait.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub use braid_time::Timestamp;

/// A congestion controller for one connection.
///
/// The engine calls, in any order: [`on_sent`](Controller::on_sent) for every data packet it
/// transmits (first transmissions and retransmissions), [`on_ack`](Controller::on_ack) for
/// every packet newly acknowledged, [`on_congestion_event`](Controller::on_congestion_event)
/// when it declares packets lost or sees ECN marks; and it never lets more than
/// [`window`](Controller::window) bytes be in flight.
pub trait Controller: Send + core::fmt::Debug {
    /// A packet of `bytes` was put on the wire at `now` with sequence number `psn`.
    fn on_sent(&mut self, now: Timestamp, bytes: u32, psn: u32);
    /// A packet of `bytes`, sent at `sent_at`, was acknowledged at `now`; `rtt_ns` is the
    /// fabric round trip measured for it (the receiver's holding time removed), if known.
    fn on_ack(&mut self, now: Timestamp, sent_at: Timestamp, bytes: u32, rtt_ns: Option<u64>);
    /// Congestion was detected at `now` for a packet sent at `sent_at`: `is_ecn` for a CE
    /// mark, otherwise a loss of `lost_bytes`.
    fn on_congestion_event(
        &mut self,
        now: Timestamp,
        sent_at: Timestamp,
        is_ecn: bool,
        lost_bytes: u32,
    );
    /// Bytes that may be in flight.
    fn window(&self) -> u64;
    /// Pacing rate in bytes per second, or `None` for no pacing.
    fn pacing_rate(&self) -> Option<u64> {
        None
    }
}

/// Builds one [`Controller`] per connection. The default is [`FixedWindowConfig::default`].
pub trait ControllerFactory: Send + Sync + core::fmt::Debug {
    /// A controller for a new connection whose packets carry up to `mtu` bytes.
    fn build(&self, mtu: u32) -> Box<dyn Controller>;
}

/// A fixed window: never reacts to congestion. The baseline for comparisons, and the default
/// until the delay-based controller lands.
#[derive(Debug, Clone, Copy)]
pub struct FixedWindow {
    window_bytes: u64,
}

impl FixedWindow {
    /// A window of `window_bytes` bytes in flight.
    pub fn new(window_bytes: u64) -> Self {
        FixedWindow { window_bytes }
    }
}

impl Controller for FixedWindow {
    fn on_sent(&mut self, _now: Timestamp, _bytes: u32, _psn: u32) {}
    fn on_ack(&mut self, _now: Timestamp, _sent_at: Timestamp, _bytes: u32, _rtt_ns: Option<u64>) {}
    fn on_congestion_event(
        &mut self,
        _now: Timestamp,
        _sent_at: Timestamp,
        _is_ecn: bool,
        _lost: u32,
    ) {
    }
    fn window(&self) -> u64 {
        self.window_bytes
    }
}

/// Configuration (and factory) for [`FixedWindow`]: a window of `packets` full packets.
#[derive(Debug, Clone, Copy)]
pub struct FixedWindowConfig {
    /// Window size in full-size packets.
    pub packets: u32,
}

impl Default for FixedWindowConfig {
    fn default() -> Self {
        FixedWindowConfig { packets: 256 }
    }
}

impl ControllerFactory for FixedWindowConfig {
    fn build(&self, mtu: u32) -> Box<dyn Controller> {
        Box::new(FixedWindow::new(u64::from(self.packets) * u64::from(mtu)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_ignores_congestion() {
        let mut c = FixedWindowConfig { packets: 4 }.build(1000);
        assert_eq!(c.window(), 4000);
        c.on_congestion_event(Timestamp::ZERO, Timestamp::ZERO, false, 1000);
        c.on_ack(
            Timestamp::from_micros(10),
            Timestamp::ZERO,
            1000,
            Some(10_000),
        );
        assert_eq!(c.window(), 4000);
        assert_eq!(c.pacing_rate(), None);
    }
}
