//! Congestion control and path choice for Braid, as pure algorithms.
//!
//! What this crate does **not** do: it performs no I/O, reads no clock, starts no thread, draws
//! no randomness of its own and knows nothing of packet formats. Every call takes `now` (a
//! [`Timestamp`] in nanoseconds from the caller's epoch) and every random choice takes a number
//! the caller drew from its own seeded generator, so a simulated run replays exactly.
//!
//! What it does:
//!
//! - [`Controller`]: the per-connection congestion controller the engine consults (how many
//!   bytes may be in flight, how fast to pace), with a documented call contract.
//! - [`Swift`] ([`SwiftConfig`], the documented default [`ControllerFactory`]): delay-based
//!   AIMD with a target delay that scales with hops and with the window, at most one
//!   multiplicative decrease per round trip, and pacing below one packet of window.
//! - [`Dcqcn`] ([`DcqcnConfig`]): ECN-driven rate control of the DCQCN family.
//! - [`FixedWindow`] ([`FixedWindowConfig`]): a constant window, the baseline for comparisons.
//! - [`paths::PathSet`]: per-path health (delay, ECN, loss) for one connection, spraying
//!   weights, weighted path choice, PLB-style re-pathing, and a median-based connection signal
//!   so one bad path cannot collapse the connection's window.
//! - [`Pacer`]: turns a pacing rate into the earliest time the next packet may leave.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod dcqcn;
mod pacing;
pub mod paths;
mod swift;

pub use braid_time::Timestamp;
pub use dcqcn::{Dcqcn, DcqcnConfig, MAX_INCREASE_EVENTS_PER_CALL};
pub use pacing::Pacer;
pub use swift::{Swift, SwiftConfig};

/// What the engine knows about newly acknowledged packets: one packet, or the packets one ACK
/// frame acknowledged together (`bytes` their total, `sent_at` the earliest send time).
///
/// Build it with [`AckSample::new`] and set the fields the engine has; the rest stay `None`.
/// Controllers read what they need ([`Swift`] the delay, [`Dcqcn`] the round trip for its
/// window) and [`paths::PathSet`] reads the path, delay and ECN fields.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AckSample {
    /// When the packet was (last) transmitted; for several, the earliest of them.
    pub sent_at: Timestamp,
    /// Its length on the wire, bytes; for several, their total.
    pub bytes: u32,
    /// The full round trip measured for it, ns (`now - send time` of the echoed packet).
    pub rtt_ns: Option<u64>,
    /// The round trip with the receiver's holding time (ACK delay) removed, ns: the delay the
    /// fabric added. This is the congestion signal delay-based controllers compare with their
    /// target; when absent they fall back to `rtt_ns`.
    pub fabric_delay_ns: Option<u64>,
    /// Switch hops the packet crossed (from the IP TTL the receiver saw), if known.
    pub hops: Option<u8>,
    /// Whether the packet arrived CE-marked, if the receiver reported it for this packet.
    /// Path scoring reads it as a congestion signal; controllers learn about ECN as a
    /// congestion signal through [`Controller::on_congestion_event`] with `is_ecn`, and may
    /// read this field only to qualify the delay sample (a marked packet crossed a queue
    /// above the marking threshold, so its delay is not a base delay).
    pub ecn_ce: Option<bool>,
    /// The path (index into the connection's path set) the packet was sent on.
    pub path: u16,
    /// In-band hop telemetry, if the fabric gave it: the largest queueing delay one switch
    /// on the packet's way saw ahead of it, ns (the forward path only; the round trip adds
    /// up every queue both ways).
    pub hop_queue_ns: Option<u64>,
}

impl AckSample {
    /// A sample for a packet of `bytes` sent at `sent_at` on path 0, with no measurements.
    pub const fn new(sent_at: Timestamp, bytes: u32) -> Self {
        AckSample {
            sent_at,
            bytes,
            rtt_ns: None,
            fabric_delay_ns: None,
            hops: None,
            ecn_ce: None,
            path: 0,
            hop_queue_ns: None,
        }
    }

    /// The delay signal a delay-based controller uses: the fabric delay, else the round trip.
    pub fn delay_ns(&self) -> Option<u64> {
        self.fabric_delay_ns.or(self.rtt_ns)
    }
}

/// A congestion controller for one connection.
///
/// # Call contract
///
/// The engine owns the clock, the loss detector and the packets; the controller only hears
/// about them, through these calls, each with the current time `now` (never decreasing):
///
/// 1. [`on_sent`](Controller::on_sent) once for every data packet put on the wire, first
///    transmissions and retransmissions alike, with its wire length.
/// 2. For every packet newly acknowledged (cumulatively or selectively, including one earlier
///    declared lost whose acknowledgement proves the loss spurious), exactly **one** of
///    [`on_ack_with`](Controller::on_ack_with) (preferred: it carries the delay, hops and
///    path) or [`on_ack`](Controller::on_ack). A packet is acknowledged at most once. The
///    packets one ACK frame acknowledges may come in one call, their bytes summed and the
///    earliest send time given (Braid's engine does so: one call per frame, not per
///    packet); a controller's growth is per byte acknowledged, so both ways agree but for
///    rounding. An ACK frame usually yields one delay measurement (for the packet it
///    echoes): put it on one call and leave the others `None`; controllers reuse the latest
///    measurement for samples without one.
/// 3. [`on_congestion_event`](Controller::on_congestion_event) with `is_ecn == false` once
///    per packet declared lost (by time-based detection or by the retransmit timeout), with
///    that packet's send time and length; and with `is_ecn == true`, `lost_bytes == 0` at most
///    once per received ACK that reports new CE marks.
/// 4. [`on_retransmit_timeout`](Controller::on_retransmit_timeout) once each time the
///    retransmit timer fires, before the `on_congestion_event` calls for the packets it
///    declares lost.
/// 5. [`on_spurious_loss`](Controller::on_spurious_loss) at most once per loss reported in
///    3, when that packet proves not lost after all (its original transmission was
///    acknowledged: before the retransmission left, or, by the echoed send time, before the
///    retransmission could have arrived, as Eifel detects for TCP), with the `sent_at` the
///    loss was reported with. Call it before `on_ack_with` for the same packet.
/// 6. [`on_idle`](Controller::on_idle) when the connection has nothing in flight and nothing
///    to send (calling it again while idle is harmless); the next `on_sent` ends the idle
///    period.
///
/// And it obeys, before every new transmission:
///
/// - [`window`](Controller::window): at most this many bytes in flight, except that one packet
///   may always be sent when nothing is in flight;
/// - [`pacing_rate`](Controller::pacing_rate): when `Some(r)`, consecutive packets leave no
///   closer than `len * 1e9 / r` ns apart ([`Pacer`] does the arithmetic).
///
/// The four original methods keep their meaning, so an engine that calls only those still
/// works (with no delay samples a delay-based controller only reacts to loss). The trait is
/// object safe: the engine holds a `Box<dyn Controller>`.
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
    /// A packet, or the packets of one ACK frame, newly acknowledged at `now`; `sample` says
    /// how many bytes and what was measured.
    ///
    /// The default forwards to [`on_ack`](Controller::on_ack) with the fabric delay (or the
    /// round trip), so controllers written against the four original methods keep working.
    fn on_ack_with(&mut self, now: Timestamp, sample: &AckSample) {
        self.on_ack(now, sample.sent_at, sample.bytes, sample.delay_ns());
    }
    /// The retransmit timer fired at `now`. The default does nothing (the per-packet loss
    /// events that follow still reach [`on_congestion_event`](Controller::on_congestion_event)).
    fn on_retransmit_timeout(&mut self, now: Timestamp) {
        let _ = now;
    }
    /// A packet whose loss was reported through
    /// [`on_congestion_event`](Controller::on_congestion_event) (with `sent_at`) proved not
    /// lost: its original transmission arrived. Controllers may undo the decrease the loss
    /// caused. The default does nothing.
    fn on_spurious_loss(&mut self, now: Timestamp, sent_at: Timestamp) {
        let _ = (now, sent_at);
    }
    /// The connection went idle at `now`: nothing in flight, nothing to send. Controllers
    /// whose state goes stale while idle restart on the next [`on_sent`](Controller::on_sent).
    fn on_idle(&mut self, now: Timestamp) {
        let _ = now;
    }
    /// The delay the controller currently aims for, ns, if it is delay-based. Path scoring can
    /// use it as its "congested round" threshold ([`paths::PathSet::set_delay_target_ns`]).
    fn target_delay_ns(&self) -> Option<u64> {
        None
    }
    /// A short name for logs and statistics.
    fn name(&self) -> &'static str {
        "custom"
    }
}

/// Builds one [`Controller`] per connection.
///
/// The documented default is [`SwiftConfig::default()`] (Swift with the constants listed on
/// [`SwiftConfig`]); [`DcqcnConfig`] and [`FixedWindowConfig`] are the alternatives shipped
/// here, and users may implement their own.
pub trait ControllerFactory: Send + Sync + core::fmt::Debug {
    /// A controller for a new connection whose packets carry up to `mtu` bytes.
    fn build(&self, mtu: u32) -> Box<dyn Controller>;
}

/// A fixed window: never reacts to congestion. The baseline for comparisons.
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
    fn name(&self) -> &'static str {
        "fixed"
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
    fn fixed_window_ignores_everything() {
        let mut c = FixedWindowConfig { packets: 4 }.build(1000);
        assert_eq!(c.window(), 4000);
        c.on_sent(Timestamp::ZERO, 1000, 1);
        c.on_congestion_event(Timestamp::ZERO, Timestamp::ZERO, false, 1000);
        c.on_congestion_event(Timestamp::ZERO, Timestamp::ZERO, true, 0);
        c.on_ack(
            Timestamp::from_micros(10),
            Timestamp::ZERO,
            1000,
            Some(10_000),
        );
        let mut s = AckSample::new(Timestamp::ZERO, 1000);
        s.fabric_delay_ns = Some(1_000_000_000);
        c.on_ack_with(Timestamp::from_micros(20), &s);
        c.on_retransmit_timeout(Timestamp::from_micros(30));
        c.on_idle(Timestamp::from_micros(40));
        c.on_spurious_loss(Timestamp::from_micros(50), Timestamp::ZERO);
        c.on_sent(Timestamp::from_micros(1_000_000), 1000, 2);
        assert_eq!(c.window(), 4000);
        assert_eq!(c.pacing_rate(), None);
        assert_eq!(c.target_delay_ns(), None);
        assert_eq!(c.name(), "fixed");
    }

    #[test]
    fn default_on_ack_with_forwards_fabric_delay_to_on_ack() {
        #[derive(Debug, Default)]
        struct Probe(Vec<Option<u64>>);
        impl Controller for Probe {
            fn on_sent(&mut self, _: Timestamp, _: u32, _: u32) {}
            fn on_ack(&mut self, _: Timestamp, _: Timestamp, _: u32, rtt_ns: Option<u64>) {
                self.0.push(rtt_ns);
            }
            fn on_congestion_event(&mut self, _: Timestamp, _: Timestamp, _: bool, _: u32) {}
            fn window(&self) -> u64 {
                0
            }
        }
        let mut p = Probe::default();
        let mut s = AckSample::new(Timestamp::ZERO, 100);
        p.on_ack_with(Timestamp::ZERO, &s);
        s.rtt_ns = Some(30);
        p.on_ack_with(Timestamp::ZERO, &s);
        s.fabric_delay_ns = Some(20);
        p.on_ack_with(Timestamp::ZERO, &s);
        assert_eq!(p.0, [None, Some(30), Some(20)]);
        assert_eq!(p.name(), "custom");
    }
}
