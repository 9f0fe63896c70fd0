//! DCQCN: ECN-driven rate control, as a [`Controller`].

use braid_time::Timestamp;

use crate::{AckSample, Controller, ControllerFactory};

/// Rate-increase events one call may apply after a long gap. Past this many the rates have
/// long reached the line rate (hyper increase grows quadratically), so the rest are dropped.
pub const MAX_INCREASE_EVENTS_PER_CALL: u64 = 1024;

/// Configuration (and factory) for [`Dcqcn`].
///
/// Rates are in bytes per second. The constants follow the DCQCN paper (Zhu et al.,
/// "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015) where it gives them,
/// and are Braid's choice otherwise:
///
/// | field | default | source |
/// |---|---|---|
/// | `line_rate_bytes_per_s` | 12.5 GB/s (100 Gb/s) | Braid: the cap, and the starting rate |
/// | `min_rate_bytes_per_s` | 1.25 MB/s (10 Mb/s) | Braid |
/// | `g` | 1/256 | paper |
/// | `alpha_init` | 1 | paper |
/// | `alpha_period_ns` (K) | 55 µs | paper |
/// | `cut_interval_ns` | 50 µs | paper's CNP interval N at the notification point |
/// | `increase_period_ns` (T) | 55 µs | paper |
/// | `byte_counter_bytes` (B) | 10 MB | paper |
/// | `fast_recovery_steps` (F) | 5 | paper |
/// | `ai_rate_bytes_per_s` (R_AI) | 5 MB/s (40 Mb/s) | paper |
/// | `hai_rate_bytes_per_s` (R_HAI) | 50 MB/s (400 Mb/s) | Braid: 10 × R_AI |
/// | `cut_on_loss` | `true` | Braid: Ethernet here is lossy, loss counts as a CNP |
/// | `window_rtts` | 2 | Braid: the window only bounds what the rate lets out |
/// | `rtt_init_ns` | 100 µs | Braid |
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnConfig {
    /// Highest rate and the rate a connection starts at.
    pub line_rate_bytes_per_s: u64,
    /// Lowest rate.
    pub min_rate_bytes_per_s: u64,
    /// Gain of the alpha EWMA.
    pub g: f64,
    /// Alpha at start.
    pub alpha_init: f64,
    /// Alpha decays by `1 − g` per period without a cut (K), ns.
    pub alpha_period_ns: u64,
    /// At most one cut per interval, ns (the CNP interval a DCQCN receiver enforces; Braid's
    /// engine reports every ACK with new CE marks, so the sender enforces it).
    pub cut_interval_ns: u64,
    /// Period of the rate-increase timer (T), ns.
    pub increase_period_ns: u64,
    /// Bytes sent per byte-counter increase event (B); 0 disables the byte counter.
    pub byte_counter_bytes: u64,
    /// Increase events of fast recovery before additive increase (F).
    pub fast_recovery_steps: u32,
    /// Additive increase of the target rate per event (R_AI).
    pub ai_rate_bytes_per_s: u64,
    /// Hyper increase step of the target rate (R_HAI).
    pub hai_rate_bytes_per_s: u64,
    /// Whether a lost packet counts as a congestion notification.
    pub cut_on_loss: bool,
    /// The window is this many smoothed round trips at the current rate.
    pub window_rtts: f64,
    /// Round trip assumed before the first sample, ns.
    pub rtt_init_ns: u64,
}

impl Default for DcqcnConfig {
    fn default() -> Self {
        DcqcnConfig {
            line_rate_bytes_per_s: 12_500_000_000,
            min_rate_bytes_per_s: 1_250_000,
            g: 1.0 / 256.0,
            alpha_init: 1.0,
            alpha_period_ns: 55_000,
            cut_interval_ns: 50_000,
            increase_period_ns: 55_000,
            byte_counter_bytes: 10_000_000,
            fast_recovery_steps: 5,
            ai_rate_bytes_per_s: 5_000_000,
            hai_rate_bytes_per_s: 50_000_000,
            cut_on_loss: true,
            window_rtts: 2.0,
            rtt_init_ns: 100_000,
        }
    }
}

impl ControllerFactory for DcqcnConfig {
    fn build(&self, mtu: u32) -> Box<dyn Controller> {
        Box::new(Dcqcn::new(*self, mtu))
    }
}

/// DCQCN rate control (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments",
/// SIGCOMM 2015), as the reaction point of one connection.
///
/// State: current rate `R_c`, target rate `R_t`, congestion estimate `alpha`, and two counters
/// of increase events since the last cut: `T` (timer) and `BC` (byte counter).
///
/// **Congestion notification** (an ACK reporting new CE marks, or a loss when `cut_on_loss`),
/// at most once per `cut_interval_ns`:
///
/// ```text
/// R_t ← R_c;   R_c ← max(R_c × (1 − alpha / 2), min_rate);   alpha ← (1 − g) × alpha + g
/// T ← 0;  BC ← 0;  timer and byte counter restart
/// ```
///
/// **Alpha decay**: every `alpha_period_ns` without a notification, `alpha ← (1 − g) × alpha`.
///
/// **Increase events**: one per `increase_period_ns` elapsed (`T += 1`) and one per
/// `byte_counter_bytes` sent (`BC += 1`). Each applies, then `R_c ← (R_t + R_c) / 2`:
///
/// ```text
/// max(T, BC) ≤ F:   fast recovery      (R_t unchanged)
/// min(T, BC) > F:   hyper increase     R_t ← R_t + (min(T, BC) − F) × R_HAI
/// otherwise:        additive increase  R_t ← R_t + R_AI
/// ```
///
/// with both rates capped at the line rate. There are no timers: every call computes how many
/// periods elapsed since the last one from its `now` (at most
/// [`MAX_INCREASE_EVENTS_PER_CALL`] increase events per call), so the rate recovers during
/// idle time exactly as a NIC's timer would make it.
///
/// **Retransmit timeout**: `R_t ← R_c`, `R_c ← min_rate`, counters reset: fast recovery then
/// brings the rate back to within 1/32 of `R_t` in `F` timer periods if the path works again.
///
/// [`pacing_rate`](Controller::pacing_rate) is `R_c`; [`window`](Controller::window) is
/// `max(2 × mtu, R_c × srtt × window_rtts)` so that the rate, not the window, limits sending.
/// Delay samples only feed `srtt`.
#[derive(Debug, Clone)]
pub struct Dcqcn {
    cfg: DcqcnConfig,
    mtu: f64,
    rc: f64,
    rt: f64,
    alpha: f64,
    last_cut: Option<Timestamp>,
    /// Start of the current alpha period; `None` until the first call.
    alpha_anchor: Option<Timestamp>,
    /// Start of the current increase-timer period; `None` until the first call.
    timer_anchor: Option<Timestamp>,
    timer_events: u32,
    byte_events: u32,
    bytes_since_event: u64,
    srtt_ns: f64,
    has_rtt: bool,
}

impl Dcqcn {
    /// A controller for packets of up to `mtu` bytes, starting at the line rate.
    pub fn new(cfg: DcqcnConfig, mtu: u32) -> Self {
        let mut cfg = cfg;
        cfg.line_rate_bytes_per_s = cfg.line_rate_bytes_per_s.max(1);
        cfg.min_rate_bytes_per_s = cfg.min_rate_bytes_per_s.clamp(1, cfg.line_rate_bytes_per_s);
        cfg.g = if cfg.g.is_finite() {
            cfg.g.clamp(0.0, 1.0)
        } else {
            1.0 / 256.0
        };
        cfg.alpha_init = if cfg.alpha_init.is_finite() {
            cfg.alpha_init.clamp(0.0, 1.0)
        } else {
            1.0
        };
        cfg.alpha_period_ns = cfg.alpha_period_ns.max(1);
        cfg.increase_period_ns = cfg.increase_period_ns.max(1);
        cfg.rtt_init_ns = cfg.rtt_init_ns.max(1);
        let line = cfg.line_rate_bytes_per_s as f64;
        Dcqcn {
            cfg,
            mtu: f64::from(mtu.max(1)),
            rc: line,
            rt: line,
            alpha: cfg.alpha_init,
            last_cut: None,
            alpha_anchor: None,
            timer_anchor: None,
            timer_events: 0,
            byte_events: 0,
            bytes_since_event: 0,
            srtt_ns: cfg.rtt_init_ns as f64,
            has_rtt: false,
        }
    }

    /// Current rate `R_c`, bytes per second.
    pub fn rate_bytes_per_s(&self) -> f64 {
        self.rc
    }

    /// Target rate `R_t`, bytes per second.
    pub fn target_rate_bytes_per_s(&self) -> f64 {
        self.rt
    }

    /// The congestion estimate `alpha`, in `[0, 1]`.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Applies alpha decay and timer increase events up to `now`.
    fn advance(&mut self, now: Timestamp) {
        let alpha_anchor = *self.alpha_anchor.get_or_insert(now);
        let k = self.cfg.alpha_period_ns;
        let periods = now.nanos_since(alpha_anchor) / k;
        if periods > 0 {
            self.alpha *= (1.0 - self.cfg.g).powf(periods as f64);
            self.alpha_anchor = Some(alpha_anchor.add_nanos(periods * k));
        }
        let timer_anchor = *self.timer_anchor.get_or_insert(now);
        let t = self.cfg.increase_period_ns;
        let periods = now.nanos_since(timer_anchor) / t;
        if periods > 0 {
            self.timer_anchor = Some(timer_anchor.add_nanos(periods * t));
            let events = periods.min(MAX_INCREASE_EVENTS_PER_CALL);
            for done in 1..=events {
                self.timer_events = self.timer_events.saturating_add(1);
                self.increase();
                if self.at_line_rate() {
                    // Further events change nothing but the counter.
                    let rest = u32::try_from(events - done).unwrap_or(u32::MAX);
                    self.timer_events = self.timer_events.saturating_add(rest);
                    break;
                }
            }
        }
    }

    fn at_line_rate(&self) -> bool {
        let line = self.cfg.line_rate_bytes_per_s as f64;
        self.rc >= line && self.rt >= line
    }

    fn increase(&mut self) {
        let f = self.cfg.fast_recovery_steps;
        let (t, bc) = (self.timer_events, self.byte_events);
        if t.max(bc) <= f {
            // Fast recovery: move halfway back to the target.
        } else if t.min(bc) > f {
            let i = f64::from(t.min(bc) - f);
            self.rt += i * self.cfg.hai_rate_bytes_per_s as f64;
        } else {
            self.rt += self.cfg.ai_rate_bytes_per_s as f64;
        }
        let line = self.cfg.line_rate_bytes_per_s as f64;
        self.rt = self.rt.min(line);
        self.rc = ((self.rt + self.rc) / 2.0).min(line);
    }

    fn restart_counters(&mut self, now: Timestamp) {
        self.timer_events = 0;
        self.byte_events = 0;
        self.bytes_since_event = 0;
        self.timer_anchor = Some(now);
        self.alpha_anchor = Some(now);
    }

    fn notify(&mut self, now: Timestamp) {
        self.advance(now);
        if self
            .last_cut
            .is_some_and(|t| now.nanos_since(t) < self.cfg.cut_interval_ns)
        {
            return;
        }
        self.rt = self.rc;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.cfg.min_rate_bytes_per_s as f64);
        self.alpha = (1.0 - self.cfg.g) * self.alpha + self.cfg.g;
        self.last_cut = Some(now);
        self.restart_counters(now);
    }
}

impl Controller for Dcqcn {
    fn on_sent(&mut self, now: Timestamp, bytes: u32, _psn: u32) {
        self.advance(now);
        let b = self.cfg.byte_counter_bytes;
        if b == 0 {
            return;
        }
        self.bytes_since_event += u64::from(bytes);
        // One packet is at most 4 GiB, so this runs at most 4 GiB / B times; with B ≥ 1 MB a
        // handful of times at worst.
        while self.bytes_since_event >= b {
            self.bytes_since_event -= b;
            self.byte_events = self.byte_events.saturating_add(1);
            self.increase();
        }
    }

    fn on_ack(&mut self, now: Timestamp, sent_at: Timestamp, bytes: u32, rtt_ns: Option<u64>) {
        let mut s = AckSample::new(sent_at, bytes);
        s.fabric_delay_ns = rtt_ns;
        self.on_ack_with(now, &s);
    }

    fn on_ack_with(&mut self, now: Timestamp, s: &AckSample) {
        self.advance(now);
        if let Some(rtt) = s.rtt_ns.or(s.fabric_delay_ns) {
            let rtt = rtt.max(1) as f64;
            self.srtt_ns = if self.has_rtt {
                0.875 * self.srtt_ns + 0.125 * rtt
            } else {
                rtt
            };
            self.has_rtt = true;
        }
    }

    fn on_congestion_event(
        &mut self,
        now: Timestamp,
        _sent_at: Timestamp,
        is_ecn: bool,
        _lost_bytes: u32,
    ) {
        if is_ecn || self.cfg.cut_on_loss {
            self.notify(now);
        } else {
            self.advance(now);
        }
    }

    fn on_retransmit_timeout(&mut self, now: Timestamp) {
        self.advance(now);
        self.rt = self.rc;
        self.rc = self.cfg.min_rate_bytes_per_s as f64;
        self.last_cut = Some(now);
        self.restart_counters(now);
    }

    fn window(&self) -> u64 {
        let bytes = self.rc * self.srtt_ns / 1e9 * self.cfg.window_rtts;
        bytes.max(2.0 * self.mtu) as u64
    }

    fn pacing_rate(&self) -> Option<u64> {
        Some((self.rc as u64).max(1))
    }

    fn name(&self) -> &'static str {
        "dcqcn"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write as _;

    const MTU: u32 = 1000;
    const LINE: f64 = 12_500_000_000.0;

    fn us(x: u64) -> Timestamp {
        Timestamp::from_micros(x)
    }

    fn ecn(c: &mut Dcqcn, t: Timestamp) {
        c.on_congestion_event(t, t, true, 0);
    }

    #[test]
    fn ecn_cuts_rate_by_half_alpha() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), MTU);
        assert_eq!(c.rate_bytes_per_s(), LINE);
        ecn(&mut c, us(0));
        // alpha starts at 1: the first cut halves the rate and remembers the old one.
        assert_eq!(c.rate_bytes_per_s(), LINE / 2.0);
        assert_eq!(c.target_rate_bytes_per_s(), LINE);
        assert_eq!(c.pacing_rate(), Some((LINE / 2.0) as u64));
        // A second notification after the interval cuts by the updated alpha.
        let alpha = c.alpha();
        ecn(&mut c, us(50));
        assert!((c.rate_bytes_per_s() - LINE / 2.0 * (1.0 - alpha / 2.0)).abs() < 1.0);
    }

    #[test]
    fn ecn_cuts_at_most_once_per_interval() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), MTU);
        ecn(&mut c, us(0));
        let r = c.rate_bytes_per_s();
        for t in [1, 10, 30, 49] {
            ecn(&mut c, us(t));
        }
        assert_eq!(c.rate_bytes_per_s(), r);
        ecn(&mut c, us(50));
        assert!(c.rate_bytes_per_s() < r);
    }

    #[test]
    fn rate_recovers_over_time_without_ecn() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), MTU);
        ecn(&mut c, us(0));
        // Fast recovery: F = 5 timer periods, each halving the distance to the target.
        c.on_ack(us(5 * 55), us(0), MTU, None);
        let expect = LINE - LINE / 2.0 / 32.0;
        assert!(
            (c.rate_bytes_per_s() - expect).abs() < 1.0,
            "{}",
            c.rate_bytes_per_s()
        );
        // Well after that, back at the line rate.
        c.on_ack(us(100_000), us(0), MTU, None);
        assert_eq!(c.rate_bytes_per_s(), LINE);
    }

    #[test]
    fn additive_increase_raises_the_target_past_the_old_rate() {
        let cfg = DcqcnConfig {
            byte_counter_bytes: 0,
            ..DcqcnConfig::default()
        };
        let mut c = Dcqcn::new(cfg, MTU);
        ecn(&mut c, us(0)); // 12.5 GB/s -> 6.25 GB/s
        ecn(&mut c, us(50)); // target = 6.25 GB/s, rate lower
        let target = c.target_rate_bytes_per_s();
        // Ten timer periods: 5 of fast recovery, then additive increase of R_AI each.
        c.on_sent(us(50 + 10 * 55), MTU, 0);
        let expect = target + 5.0 * 5_000_000.0;
        assert!((c.target_rate_bytes_per_s() - expect).abs() < 1.0);
    }

    #[test]
    fn byte_counter_drives_increase() {
        let cfg = DcqcnConfig {
            byte_counter_bytes: 10_000,
            ..DcqcnConfig::default()
        };
        let mut c = Dcqcn::new(cfg, MTU);
        ecn(&mut c, us(0));
        let cut = c.rate_bytes_per_s();
        // 10 packets of 1000 bytes within one timer period: one byte-counter event.
        for i in 0..10 {
            c.on_sent(us(1 + i), MTU, i as u32);
        }
        let expect = (LINE + cut) / 2.0;
        assert!((c.rate_bytes_per_s() - expect).abs() < 1.0);
    }

    #[test]
    fn alpha_decays_without_ecn() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), MTU);
        ecn(&mut c, us(0));
        let a0 = c.alpha();
        assert!(a0 > 0.99);
        c.on_ack(us(55 * 256), us(0), MTU, None);
        let expect = a0 * (1.0 - 1.0 / 256.0_f64).powi(256);
        assert!(
            (c.alpha() - expect).abs() < 1e-9,
            "{} vs {expect}",
            c.alpha()
        );
        // Repeated marking drives alpha up again.
        for i in 0..100 {
            ecn(&mut c, us(20_000 + i * 50));
        }
        assert!(c.alpha() > expect);
    }

    #[test]
    fn loss_counts_as_a_notification_unless_disabled() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), MTU);
        c.on_congestion_event(us(0), us(0), false, MTU);
        assert_eq!(c.rate_bytes_per_s(), LINE / 2.0);
        let cfg = DcqcnConfig {
            cut_on_loss: false,
            ..DcqcnConfig::default()
        };
        let mut c = Dcqcn::new(cfg, MTU);
        c.on_congestion_event(us(0), us(0), false, MTU);
        assert_eq!(c.rate_bytes_per_s(), LINE);
    }

    #[test]
    fn retransmit_timeout_drops_to_min_rate_and_recovers_fast() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), MTU);
        c.on_retransmit_timeout(us(0));
        assert_eq!(c.rate_bytes_per_s(), 1_250_000.0);
        c.on_sent(us(5 * 55), MTU, 0);
        assert!(c.rate_bytes_per_s() > LINE * 0.96);
    }

    #[test]
    fn window_tracks_rate_times_rtt() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), MTU);
        let mut s = AckSample::new(us(0), MTU);
        s.rtt_ns = Some(40_000);
        c.on_ack_with(us(40), &s);
        // 12.5 GB/s × 40 µs × 2 = 1 MB.
        assert_eq!(c.window(), 1_000_000);
        c.on_retransmit_timeout(us(41));
        assert_eq!(c.window(), 2 * u64::from(MTU));
    }

    /// DCQCN's rate over 8 ms, sending at its own rate in 1472-byte packets. For the first
    /// 4 ms a 2.5 GB/s bottleneck marks every packet while the rate is above it (one
    /// notification per 10 µs step, so at most one cut per 50 µs); then the bottleneck goes
    /// away. Sampled every 250 µs.
    #[test]
    fn trajectory_around_a_bottleneck_then_recovery() {
        let mut c = Dcqcn::new(DcqcnConfig::default(), 1472);
        let mut table = String::from("t_us | ecn | rate_MBps | target_MBps | alpha  | sent_MB\n");
        let (mut credit, mut sent) = (0.0, 0u64);
        for step in 0..=800u64 {
            let now = us(step * 10);
            credit += c.rate_bytes_per_s() * 10e-6;
            while credit >= 1472.0 {
                credit -= 1472.0;
                sent += 1472;
                c.on_sent(now, 1472, 0);
            }
            let marking = step < 400 && c.rate_bytes_per_s() > 2.5e9;
            if marking {
                ecn(&mut c, now);
            } else {
                c.on_ack(now, now, 1472, None);
            }
            if step % 25 == 0 {
                writeln!(
                    table,
                    "{:>4} | {:>3} | {:>9.1} | {:>11.1} | {:.4} | {:>7.1}",
                    step * 10,
                    if marking { "CE" } else { "-" },
                    c.rate_bytes_per_s() / 1e6,
                    c.target_rate_bytes_per_s() / 1e6,
                    c.alpha(),
                    sent as f64 / 1e6,
                )
                .unwrap();
            }
        }
        insta::assert_snapshot!(table);
    }
}
