//! Swift: delay-based AIMD with a scaled target delay.

use braid_time::Timestamp;

use crate::{AckSample, Controller, ControllerFactory};

/// Configuration (and factory) for [`Swift`]; **the documented default controller** of Braid.
///
/// Windows are in packets of the connection's MTU and may be fractional. The defaults are the
/// paper's for the shape of the control law (`ai`, `beta`, `max_mdf`, `fs_min_cwnd`,
/// `fs_max_cwnd`) and Braid's own for the delays, because Braid measures delay in software
/// (host stacks add tens of microseconds of jitter that NIC timestamps would not see) and runs
/// on fabrics whose base delay it cannot know in advance:
///
/// | field | default | why |
/// |---|---|---|
/// | `base_target_ns` | 50 µs | headroom above the lowest measured delay (software jitter) |
/// | `target_above_min_delay` | `true` | the base delay is measured, not configured |
/// | `per_hop_ns` | 2 µs | queueing allowance per switch hop when hops are reported |
/// | `assumed_hops` | 0 | hops are usually not reported: the base covers a typical path |
/// | `fs_range_ns` | 100 µs | extra target for flows with tiny windows (incast) |
/// | `fs_min_cwnd`, `fs_max_cwnd` | 0.1, 100 packets | paper |
/// | `ai` | 1 packet per RTT | paper |
/// | `beta` | 0.8 | paper |
/// | `max_mdf` | 0.5 | paper |
/// | `min_cwnd` | 0.01 packets | one packet per 100 RTTs at the floor |
/// | `max_cwnd` | 1024 packets | above any SACK span the engine allows |
/// | `init_cwnd` | 64 packets | Swift has no slow start; ~BDP of 10–25 Gb/s at ~50 µs |
/// | `rtt_init_ns` | 100 µs | round trip assumed before the first sample |
/// | `idle_restart_rtts` | 4 | idle longer than this restarts at `init_cwnd` at most |
/// | `rto_reset_threshold` | 1 | every retransmit timeout resets the window to `min_cwnd` |
/// | `min_delay_window_ns` | 10 s | a min-delay sample older than this is replaced; CE-marked samples never set it |
/// | `undo_spurious_losses` | `true` | a loss that proves spurious gives its decrease back |
/// | `base_delay_scale` | 0 | distance scaling of the target off: on a software host the minimum delay is mostly scheduling, not distance |
/// | `ai_ref_delay_ns` | 0 | distance scaling of the additive increase off, for the same reason |
/// | `hop_telemetry` | `false` | most fabrics stamp no per-hop telemetry; the round trip is the signal |
/// | `fast_start` | `false` | the paper's Swift has no slow start |
/// | `validate_cwnd` | 0 (off) | the paper's Swift grows the window whatever limits the sender |
/// | `fast_start_once_after_first_round` | `false` | only matters with `fast_start` |
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwiftConfig {
    /// Base target delay, ns. With `target_above_min_delay` it is headroom added to the lowest
    /// delay this connection has measured; otherwise it is the absolute base (the paper's
    /// `base_target`, for a fabric whose delays are known).
    pub base_target_ns: u64,
    /// Whether the target is relative to the measured minimum delay (see `base_target_ns`).
    pub target_above_min_delay: bool,
    /// Target added per switch hop, ns (the paper's `h`).
    pub per_hop_ns: u64,
    /// Hops assumed when ACK samples carry none.
    pub assumed_hops: u8,
    /// Largest extra target for small windows, ns (the paper's `fs_range`).
    pub fs_range_ns: u64,
    /// Window, packets, at and below which flow scaling adds all of `fs_range_ns`.
    pub fs_min_cwnd: f64,
    /// Window, packets, at and above which flow scaling adds nothing.
    pub fs_max_cwnd: f64,
    /// Additive increase, packets per round trip.
    pub ai: f64,
    /// Multiplicative decrease gain on the relative excess delay.
    pub beta: f64,
    /// Largest fraction one decrease removes.
    pub max_mdf: f64,
    /// Smallest window, packets (below one packet the controller paces).
    pub min_cwnd: f64,
    /// Largest window, packets.
    pub max_cwnd: f64,
    /// Window at start and the cap on restart after idle, packets.
    pub init_cwnd: f64,
    /// Round trip assumed before the first sample, ns.
    pub rtt_init_ns: u64,
    /// Idle periods of at least this many smoothed round trips restart the window.
    pub idle_restart_rtts: u32,
    /// Consecutive retransmit timeouts (without an ACK between) that reset the window to
    /// `min_cwnd`; earlier ones decrease it by `max_mdf`, at most once per round trip.
    pub rto_reset_threshold: u32,
    /// Lifetime of the minimum-delay estimate, ns (a route change can raise the base delay).
    pub min_delay_window_ns: u64,
    /// Undo a loss decrease when every loss behind it proves spurious
    /// ([`Controller::on_spurious_loss`]).
    pub undo_spurious_losses: bool,
    /// Distance scaling of the target: headroom added per nanosecond of measured minimum
    /// delay (with `target_above_min_delay`). A fixed headroom is a queue of a fixed number
    /// of microseconds whatever the base round trip, so it shrinks, relative to the
    /// bandwidth-delay product, as links get longer; scaling it keeps the allowed queue a
    /// fixed fraction of the base delay. 0 turns it off.
    pub base_delay_scale: f64,
    /// Distance scaling of the additive increase: with a minimum delay above this many ns,
    /// `ai` is added per `ai_ref_delay_ns` of time rather than per round trip (the increase
    /// per round trip is `ai × min_delay / ai_ref_delay_ns`), so a long connection grows its
    /// window, which is that many times larger, in the same time as a short one. 0 turns
    /// it off.
    pub ai_ref_delay_ns: u64,
    /// React to the most congested hop instead of the sum of every queue: when an ACK
    /// sample carries in-band hop telemetry ([`AckSample::hop_queue_ns`], the largest
    /// queueing delay one switch on the forward path saw), the delay compared with the
    /// target is `min_delay + hop_queue` rather than the measured fabric delay. A flow
    /// crossing two congested hops then sees the same signal as one crossing one of them,
    /// and is not cut harder for it (the multi-bottleneck unfairness of a summed delay);
    /// queues on the way back (the ACK's) no longer count either. Samples without
    /// telemetry keep the measured delay.
    pub hop_telemetry: bool,
    /// Rate-fair additive increase: the increase per round trip grows with the smoothed
    /// round trip over the minimum delay, raised to `rtt_fair_exp` (at most `rtt_fair_max`
    /// times). Swift's plain increase, a constant amount per round trip, grows a window by
    /// `ai / srtt` per unit of time, so a flow whose round trip is longer (it crosses more
    /// standing queues, both ways) settles at a smaller window *and* divides it by a longer
    /// round trip. With the exponent at 1 the window grows by the same amount per unit of
    /// time whatever the round trip: equal decreases then give equal *windows*, and still
    /// unequal rates. With 2 the *rate* (window over round trip) grows by the same amount per
    /// unit of time: equal decreases give equal rates. 0 (or below 1) turns it off.
    pub rtt_fair_max: f64,
    /// Exponent of the rate-fair increase: the factor on `ai` is
    /// `(srtt / min_delay)^rtt_fair_exp`, within `1..=rtt_fair_max` (see there). Default 1.
    pub rtt_fair_exp: f64,
    /// Measure the rate-fair increase's stretch against the delay the controller acts on
    /// rather than the minimum: the factor becomes `(srtt / delay)^rtt_fair_exp`, `delay`
    /// being the latest sample compared with the target (with `hop_telemetry`, the minimum
    /// plus the bottleneck hop's queue), never below the minimum. What makes rates unequal
    /// at a shared bottleneck is the round trip a flow has *beyond* that bottleneck's queue
    /// (other queues it crosses, both ways); the queue of the bottleneck itself is the same
    /// for every flow there, and counting it only makes every flow more aggressive the deeper
    /// the queue is (a 32-sender incast, whose round trips are all stretched alike by the
    /// receiver's queue, then grows at the factor's cap and overshoots). Without telemetry
    /// the delay is the round trip's own queueing, so the factor stays near 1. Default off.
    pub rtt_fair_hop_ref: bool,
    /// With `hop_telemetry`, react to the *standing* queue of the bottleneck hop: the
    /// lowest hop telemetry of the last one to two smoothed round trips rather than the
    /// latest sample (a queue that drained within a round trip is a burst, not congestion;
    /// the latest sample of a sprayed flow is the larger of several queues' momentary
    /// depths).
    pub hop_standing: bool,
    /// A delay-gated start: until the connection's first decrease (and again after an idle
    /// restart), an ACK whose delay is below the minimum delay plus half the target's
    /// headroom grows the window by the bytes it acknowledges (doubling it per round trip,
    /// as TCP's slow start) instead of by `ai` per round trip. A window that starts at
    /// about one bandwidth-delay product is limited as soon as any queue forms, and the
    /// additive increase takes longer to open it than a short flow lasts; gating on the
    /// delay keeps the fast growth away from a queue that is already there (an incast's
    /// first ACKs report it), and the first decrease ends it for good.
    pub fast_start: bool,
    /// Window validation (the idea of RFC 7661 for TCP): the window grows only while it is
    /// at most this many times the most bytes the connection had in flight in the last one
    /// to two smoothed round trips, plus one packet (a window is filled in whole packets). A connection held back by something other than its
    /// window (its own host link, an application that posts too little) otherwise keeps
    /// growing a window it does not use; at a bottleneck it shares with connections whose
    /// window is what limits them, a decrease then takes nothing from its rate until the
    /// decreases have eaten the unused part, and the whole reduction the queue asks for falls
    /// on the others. A window no larger than `init_cwnd` always grows (a connection may
    /// start with that much unproven). Decreases are unchanged. 0 (or below 1) turns it off.
    pub validate_cwnd: f64,
    /// With `fast_start`, the delay-gated start runs once per connection and from its second
    /// round on: only ACKs for packets sent at least one minimum delay after the connection's
    /// first packet may grow the window by it, and an idle restart does not start it again.
    /// The ACKs of a round report the queue as it was before that round's windows arrived:
    /// in an incast every sender's first window meets the others' at the receiver, yet the
    /// earliest ACKs come back with little delay and would double windows that are already
    /// too large; a connection coming back from idle into a fan-in (the next step of a tree
    /// all-reduce) meets the same. A connection's start is where a slow window costs the
    /// most (a long flow's first round trips), and from its second round the delay shows the
    /// queue its first window built.
    pub fast_start_once_after_first_round: bool,
}

impl Default for SwiftConfig {
    fn default() -> Self {
        SwiftConfig {
            base_target_ns: 50_000,
            target_above_min_delay: true,
            per_hop_ns: 2_000,
            assumed_hops: 0,
            fs_range_ns: 100_000,
            fs_min_cwnd: 0.1,
            fs_max_cwnd: 100.0,
            ai: 1.0,
            beta: 0.8,
            max_mdf: 0.5,
            min_cwnd: 0.01,
            max_cwnd: 1024.0,
            init_cwnd: 64.0,
            rtt_init_ns: 100_000,
            idle_restart_rtts: 4,
            rto_reset_threshold: 1,
            min_delay_window_ns: 10_000_000_000,
            undo_spurious_losses: true,
            base_delay_scale: 0.0,
            ai_ref_delay_ns: 0,
            hop_telemetry: false,
            rtt_fair_max: 0.0,
            rtt_fair_exp: 1.0,
            rtt_fair_hop_ref: false,
            hop_standing: false,
            fast_start: false,
            validate_cwnd: 0.0,
            fast_start_once_after_first_round: false,
        }
    }
}

impl SwiftConfig {
    /// Settings for a software datapath on a shared host, Braid's runtime default: the
    /// measured "fabric" delay there includes scheduling delays of tens to hundreds of
    /// microseconds, so the target sits 200 µs above the minimum instead of 50 µs, and only
    /// the third consecutive retransmit timeout (not the first, which on a busy host is
    /// usually a stalled thread) resets the window.
    pub fn software_host() -> Self {
        SwiftConfig {
            base_target_ns: 200_000,
            rto_reset_threshold: 3,
            ..SwiftConfig::default()
        }
    }
}

impl ControllerFactory for SwiftConfig {
    fn build(&self, mtu: u32) -> Box<dyn Controller> {
        Box::new(Swift::new(*self, mtu))
    }
}

/// Swift congestion control (Kumar et al., "Swift: Delay is Simple and Effective for
/// Congestion Control in the Datacenter", SIGCOMM 2020), for one connection.
///
/// The window `cwnd` is kept in bytes as a real number; in packets, `w = cwnd / mtu`.
///
/// **Target delay** (§3.5 of the paper), with `hops` from the latest sample (else
/// `assumed_hops`) and `min_delay` the lowest delay measured (only when
/// `target_above_min_delay`):
///
/// ```text
/// target = min_delay × (1 + base_delay_scale) + base_target + per_hop × hops + fs(w)
/// fs(w)  = clamp(α / √w + β, 0, fs_range)
/// α      = fs_range / (1/√fs_min_cwnd − 1/√fs_max_cwnd),   β = −α / √fs_max_cwnd
/// ```
///
/// so a flow with a tiny window tolerates up to `fs_range` more queueing than a big one, which
/// lets many small flows (incast) share a queue fairly.
///
/// `min_delay` is learned only from samples that did not arrive CE-marked (when the sample
/// says, [`AckSample::ecn_ce`]): a marked packet crossed a queue above the switch's marking
/// threshold, so its delay is queueing, not base delay. Without this, a connection that
/// starts while a queue already stands (the remote senders of an incast, whose first packets
/// queue behind the nearby senders' first window) takes that queue as its base, so its target
/// sits a whole queue higher than the others': it never sees its delay above target, keeps a
/// window far above its share, and the connections that measured the true base (the nearby
/// senders) are pushed down to the window floor, where a sub-packet window paces one packet
/// per `srtt / w` (4 ms at 0.01 packets and 40 µs) and ends up the job's tail. Until an
/// unmarked sample arrives the target is the absolute `base_target + fs(w)`.
///
/// **Distance scaling** (the paper's topology scaling, driven by the measured base delay
/// rather than a hop count): a long connection (a link between sites, hundreds of µs of
/// fibre) has a window many times a short one's and the same microseconds of headroom, so
/// a fixed `base_target` lets it queue a vanishing fraction of its bandwidth-delay product,
/// and one packet of additive increase per (long) round trip takes seconds to regain a
/// halved window. `base_delay_scale` adds headroom in proportion to `min_delay`, and
/// `ai_ref_delay_ns` makes the increase per unit of time rather than per round trip once
/// `min_delay` exceeds it. A connection is one peer, so its paths share their ends and,
/// on the fabrics Braid targets, their length; `min_delay` is the lowest over its paths.
///
/// **Per acknowledged packet** of `acked` bytes, with `delay` its fabric delay (or the latest
/// one measured, when the sample carries none):
///
/// ```text
/// if delay < target:   cwnd += ai' × mtu × acked / cwnd     (w ≥ 1: +ai' packets per RTT)
///                      cwnd += ai' × acked                  (w < 1)
/// ai' = ai × max(1, min_delay / ai_ref_delay)               (ai without distance scaling)
/// elif can_decrease:   cwnd ×= max(1 − beta × (delay − target) / delay, 1 − max_mdf)
/// ```
///
/// With `fast_start`, until the first decrease (and after an idle restart) an ACK whose
/// delay is below `floor + (target − floor) / 2` (`floor` the `min_delay` part of the
/// target) adds `acked` bytes instead (one doubling per round trip).
///
/// With `fast_start_once_after_first_round`, only ACKs for packets sent at least `min_delay`
/// after the connection's first packet may do so, and an idle restart does not re-arm it.
///
/// With `validate_cwnd` (`k`), neither increase applies while
/// `cwnd > k × in_flight_max + mtu` and `cwnd > init_cwnd`, where `in_flight_max` is the most
/// bytes in flight (sent, less acknowledged and lost) in the current or the previous epoch of
/// one `srtt`.
///
/// **Loss** (per packet declared lost): `cwnd ×= 1 − max_mdf` if `can_decrease`.
/// **Spurious-loss undo** (as TCP's Eifel response, RFC 4015): a loss decrease opens an
/// *episode* that remembers the window before it and counts the losses reported in the same
/// round trip. When [`on_spurious_loss`](Controller::on_spurious_loss) has cleared every one
/// of them, none was real: the window goes back to `max(cwnd, window before)` and the decrease
/// no longer blocks the next one. A delay decrease (a real congestion signal) ends the episode
/// without undo, and so does the next loss decrease (which opens a new one); proofs for
/// packets sent before the episode's first reported loss are ignored.
/// **Retransmit timeout**: `cwnd = min_cwnd` (after `rto_reset_threshold` consecutive ones;
/// earlier ones count as a loss). It opens an episode too (or extends the open one), which
/// the probes it retransmits join: if every one of them proves spurious (their originals were
/// acknowledged: the timeout measured a host that stalled, not a network that dropped), the
/// window, the decrease time and the consecutive-timeout count go back, as Eifel's response
/// to a spurious timeout (RFC 4015) does for TCP. `can_decrease` is `now − last_decrease ≥ srtt`: at most one
/// decrease per smoothed round trip. ECN marks are ignored: Swift is delay-based.
///
/// The window is clamped to `[min_cwnd, max_cwnd]` packets. Below one packet,
/// [`window`](Controller::window) reports one packet and [`pacing_rate`](Controller::pacing_rate)
/// is `cwnd / srtt` (the paper's pacing delay `rtt / w` per packet). After
/// [`on_idle`](Controller::on_idle) and `idle_restart_rtts` smoothed round trips without
/// sending, the next send caps the window at `init_cwnd` (as TCP does, RFC 5681 §4.1) and
/// forgets the stale delay sample.
///
/// Braid keeps one fabric window; the paper's second, endpoint window (receiver host delay) is
/// left out because the engine's ACK carries only its holding time, which it already removes.
#[derive(Debug, Clone)]
pub struct Swift {
    cfg: SwiftConfig,
    mtu: f64,
    /// Window, bytes.
    cwnd: f64,
    /// Flow-scaling coefficients α and β.
    fs_alpha: f64,
    fs_beta: f64,
    srtt_ns: f64,
    has_rtt: bool,
    last_delay_ns: Option<u64>,
    min_delay_ns: Option<u64>,
    min_delay_at: Timestamp,
    hops: Option<u8>,
    last_decrease: Option<Timestamp>,
    consecutive_rto: u32,
    idle_since: Option<Timestamp>,
    /// The loss episode that may still be undone.
    undo: Option<LossEpisode>,
    undos: u64,
    /// Lowest hop telemetry of the current and the previous epoch (one srtt each), ns, and
    /// when the current one began.
    hop_min: [Option<u64>; 2],
    hop_epoch: Timestamp,
    /// In the delay-gated start (`fast_start`, until the first decrease).
    starting: bool,
    /// Bytes in flight as the calls report them (sent, less acknowledged and lost), and the
    /// most of the current and the previous epoch (one srtt each), for `validate_cwnd`.
    in_flight: f64,
    in_flight_max: [f64; 2],
    in_flight_epoch: Timestamp,
    /// When the connection sent its first packet.
    first_sent: Option<Timestamp>,
}

/// A loss decrease that may prove spurious.
#[derive(Debug, Clone, Copy)]
struct LossEpisode {
    /// Window before the decrease, bytes.
    cwnd_before: f64,
    last_decrease_before: Option<Timestamp>,
    /// Consecutive retransmit timeouts before the episode (an undone timeout does not count
    /// towards `rto_reset_threshold`).
    consecutive_rto_before: u32,
    /// When the decrease happened.
    at: Timestamp,
    /// Losses reported in the episode and not yet proven spurious.
    pending: u32,
    /// Earliest send time of those losses.
    first_sent_at: Timestamp,
    /// A retransmit timeout joined the episode and none of its probes was reported yet: the
    /// timeout itself is not proven spurious until one is (and proves so).
    awaiting_probe: bool,
}

impl Swift {
    /// A controller for packets of up to `mtu` bytes. Out-of-range settings are brought into
    /// range (a window floor above zero, a ceiling above the floor, gains within `[0, 1]`).
    pub fn new(cfg: SwiftConfig, mtu: u32) -> Self {
        let mut cfg = cfg;
        cfg.min_cwnd = finite_or(cfg.min_cwnd, 0.01).max(1e-6);
        cfg.max_cwnd = finite_or(cfg.max_cwnd, 1024.0).max(cfg.min_cwnd);
        cfg.init_cwnd = finite_or(cfg.init_cwnd, 64.0).clamp(cfg.min_cwnd, cfg.max_cwnd);
        cfg.max_mdf = finite_or(cfg.max_mdf, 0.5).clamp(0.0, 1.0);
        cfg.beta = finite_or(cfg.beta, 0.8).max(0.0);
        cfg.ai = finite_or(cfg.ai, 1.0).max(0.0);
        cfg.rtt_init_ns = cfg.rtt_init_ns.max(1);
        cfg.base_delay_scale = finite_or(cfg.base_delay_scale, 0.0).max(0.0);
        cfg.rtt_fair_exp = finite_or(cfg.rtt_fair_exp, 1.0).max(0.0);
        let (fs_alpha, fs_beta) = flow_scaling_coefficients(&cfg);
        let mtu = f64::from(mtu.max(1));
        Swift {
            cfg,
            mtu,
            cwnd: cfg.init_cwnd * mtu,
            fs_alpha,
            fs_beta,
            srtt_ns: cfg.rtt_init_ns as f64,
            has_rtt: false,
            last_delay_ns: None,
            min_delay_ns: None,
            min_delay_at: Timestamp::ZERO,
            hops: None,
            last_decrease: None,
            consecutive_rto: 0,
            idle_since: None,
            undo: None,
            undos: 0,
            hop_min: [None, None],
            hop_epoch: Timestamp::ZERO,
            starting: cfg.fast_start,
            in_flight: 0.0,
            in_flight_max: [0.0; 2],
            in_flight_epoch: Timestamp::ZERO,
            first_sent: None,
        }
    }

    /// Whether the controller is in its delay-gated start (`fast_start`).
    pub fn in_fast_start(&self) -> bool {
        self.starting
    }

    /// Loss decreases undone because every loss behind them proved spurious.
    pub fn undos(&self) -> u64 {
        self.undos
    }

    /// The window in packets (fractional).
    pub fn cwnd_packets(&self) -> f64 {
        self.cwnd / self.mtu
    }

    /// The smoothed round trip, ns (`rtt_init_ns` before the first sample).
    pub fn srtt_ns(&self) -> u64 {
        self.srtt_ns as u64
    }

    /// The lowest delay measured (within `min_delay_window_ns`), ns.
    pub fn min_delay_ns(&self) -> Option<u64> {
        self.min_delay_ns
    }

    /// The current target delay, ns, for the current window and the latest hop count.
    pub fn target_ns(&self) -> u64 {
        self.target_f64().round() as u64
    }

    /// The flow-scaling term of the target for a window of `cwnd_packets`, ns.
    pub fn flow_scaling_ns(&self, cwnd_packets: f64) -> u64 {
        self.flow_scaling(cwnd_packets).round() as u64
    }

    fn flow_scaling(&self, w: f64) -> f64 {
        let range = self.cfg.fs_range_ns as f64;
        if range <= 0.0 || self.fs_alpha <= 0.0 {
            return 0.0;
        }
        (self.fs_alpha / w.max(1e-9).sqrt() + self.fs_beta).clamp(0.0, range)
    }

    fn target_f64(&self) -> f64 {
        let base = self.cfg.base_target_ns as f64
            + if self.cfg.target_above_min_delay {
                self.min_delay_ns.unwrap_or(0) as f64 * (1.0 + self.cfg.base_delay_scale)
            } else {
                0.0
            };
        let hops = f64::from(self.hops.unwrap_or(self.cfg.assumed_hops));
        base + hops * self.cfg.per_hop_ns as f64 + self.flow_scaling(self.cwnd_packets())
    }

    /// The factor on `ai` from distance scaling (`ai_ref_delay_ns`) and the rate-fair
    /// increase (`rtt_fair_max`): at least 1.
    fn ai_scale(&self) -> f64 {
        let distance = match (self.cfg.ai_ref_delay_ns, self.min_delay_ns) {
            (r, Some(m)) if r > 0 && m > r => m as f64 / r as f64,
            _ => 1.0,
        };
        let fair = match self.min_delay_ns {
            Some(m) if self.cfg.rtt_fair_max > 1.0 && m > 0 && self.has_rtt => {
                let reference = if self.cfg.rtt_fair_hop_ref {
                    self.last_delay_ns.unwrap_or(m).max(m)
                } else {
                    m
                };
                let stretch = self.srtt_ns / reference as f64;
                stretch
                    .powf(self.cfg.rtt_fair_exp)
                    .clamp(1.0, self.cfg.rtt_fair_max)
            }
            _ => 1.0,
        };
        distance * fair
    }

    /// Takes in hop telemetry `q` and returns the lowest of the last one to two round trips.
    fn standing_hop_queue(&mut self, now: Timestamp, q: u64) -> u64 {
        if now.nanos_since(self.hop_epoch) as f64 >= self.srtt_ns {
            self.hop_min = [None, self.hop_min[0]];
            self.hop_epoch = now;
        }
        self.hop_min[0] = Some(self.hop_min[0].map_or(q, |m| m.min(q)));
        match self.hop_min {
            [Some(a), Some(b)] => a.min(b),
            [Some(a), None] => a,
            _ => q,
        }
    }

    /// Takes in a change of the bytes in flight at `now` and keeps the epoch maxima.
    fn track_in_flight(&mut self, now: Timestamp, delta: f64) {
        // Only window validation reads it: without it, no work per packet.
        if self.cfg.validate_cwnd < 1.0 {
            return;
        }
        if now.nanos_since(self.in_flight_epoch) as f64 >= self.srtt_ns {
            self.in_flight_max = [0.0, self.in_flight_max[0]];
            self.in_flight_epoch = now;
        }
        self.in_flight = (self.in_flight + delta).max(0.0);
        self.in_flight_max[0] = self.in_flight_max[0].max(self.in_flight);
    }

    /// Whether `validate_cwnd` lets the window grow: it is not far above what was in flight.
    fn window_is_used(&self) -> bool {
        let k = self.cfg.validate_cwnd;
        if k < 1.0 {
            return true;
        }
        // One packet more: a window is filled in whole packets.
        let used = self.in_flight_max[0].max(self.in_flight_max[1]);
        self.cwnd <= k * used + self.mtu || self.cwnd <= self.cfg.init_cwnd * self.mtu
    }

    fn can_decrease(&self, now: Timestamp) -> bool {
        self.last_decrease
            .is_none_or(|t| now.nanos_since(t) as f64 >= self.srtt_ns)
    }

    fn decrease(&mut self, now: Timestamp, factor: f64) {
        self.cwnd *= factor;
        self.clamp();
        self.last_decrease = Some(now);
        self.starting = false;
    }

    /// Whether `delay` (ns) lets the delay-gated start grow the window: below the
    /// minimum-delay part of `target` plus half of the rest.
    fn fast_start_allows(&self, delay: u64, target: f64) -> bool {
        let floor = if self.cfg.target_above_min_delay {
            self.min_delay_ns.unwrap_or(0) as f64 * (1.0 + self.cfg.base_delay_scale)
        } else {
            0.0
        };
        (delay as f64) < floor + (target - floor) / 2.0
    }

    /// Whether `fast_start_once_after_first_round` lets an ACK for a packet sent at `sent_at`
    /// grow the window by the delay-gated start: the packet left at least one minimum delay
    /// after the connection's first packet.
    fn fast_start_round_allows(&self, sent_at: Timestamp) -> bool {
        if !self.cfg.fast_start_once_after_first_round {
            return true;
        }
        match (self.first_sent, self.min_delay_ns) {
            (Some(first), Some(m)) => sent_at.nanos_since(first) >= m,
            _ => false,
        }
    }

    fn clamp(&mut self) {
        self.cwnd = self
            .cwnd
            .clamp(self.cfg.min_cwnd * self.mtu, self.cfg.max_cwnd * self.mtu);
    }

    fn sample_rtt(&mut self, rtt_ns: u64) {
        let rtt = rtt_ns.max(1) as f64;
        self.srtt_ns = if self.has_rtt {
            0.875 * self.srtt_ns + 0.125 * rtt
        } else {
            rtt
        };
        self.has_rtt = true;
    }

    /// Takes in a delay sample; `marked` (it arrived CE-marked) keeps it out of the minimum.
    fn sample_delay(&mut self, now: Timestamp, delay_ns: u64, marked: bool) {
        let expired = now.nanos_since(self.min_delay_at) > self.cfg.min_delay_window_ns;
        if !marked && self.min_delay_ns.is_none_or(|m| delay_ns <= m || expired) {
            self.min_delay_ns = Some(delay_ns);
            self.min_delay_at = now;
        }
        self.last_delay_ns = Some(delay_ns);
    }
}

impl Controller for Swift {
    fn on_sent(&mut self, now: Timestamp, bytes: u32, _psn: u32) {
        if let Some(since) = self.idle_since.take() {
            let idle_ns = now.nanos_since(since) as f64;
            if idle_ns >= f64::from(self.cfg.idle_restart_rtts) * self.srtt_ns {
                self.cwnd = self.cwnd.min(self.cfg.init_cwnd * self.mtu);
                self.last_delay_ns = None;
                self.last_decrease = None;
                self.starting = self.cfg.fast_start && !self.cfg.fast_start_once_after_first_round;
            }
        }
        self.track_in_flight(now, f64::from(bytes));
        self.first_sent.get_or_insert(now);
    }

    fn on_ack(&mut self, now: Timestamp, sent_at: Timestamp, bytes: u32, rtt_ns: Option<u64>) {
        let mut s = AckSample::new(sent_at, bytes);
        s.fabric_delay_ns = rtt_ns;
        self.on_ack_with(now, &s);
    }

    fn on_ack_with(&mut self, now: Timestamp, s: &AckSample) {
        self.consecutive_rto = 0;
        self.track_in_flight(now, -f64::from(s.bytes));
        if let Some(rtt) = s.rtt_ns.or(s.fabric_delay_ns) {
            self.sample_rtt(rtt);
        }
        if let Some(d) = s.delay_ns() {
            self.sample_delay(now, d, s.ecn_ce == Some(true));
            if self.cfg.hop_telemetry
                && let (Some(q), Some(m)) = (s.hop_queue_ns, self.min_delay_ns)
            {
                // The bottleneck hop's queue on top of the base: the signal of one queue.
                let q = if self.cfg.hop_standing {
                    self.standing_hop_queue(now, q)
                } else {
                    q
                };
                self.last_delay_ns = Some(m.saturating_add(q));
            }
        }
        if s.hops.is_some() {
            self.hops = s.hops;
        }
        let acked = f64::from(s.bytes);
        let target = self.target_f64();
        match self.last_delay_ns {
            Some(d) if d > 0 && d as f64 >= target => {
                if self.can_decrease(now) {
                    let d = d as f64;
                    let factor =
                        (1.0 - self.cfg.beta * (d - target) / d).max(1.0 - self.cfg.max_mdf);
                    self.decrease(now, factor);
                    self.undo = None;
                }
            }
            _ if !self.window_is_used() => {}
            Some(d)
                if self.starting
                    && self.fast_start_allows(d, target)
                    && self.fast_start_round_allows(s.sent_at) =>
            {
                self.cwnd += acked;
                self.clamp();
            }
            _ => {
                let ai = self.cfg.ai * self.ai_scale();
                if self.cwnd >= self.mtu {
                    self.cwnd += ai * self.mtu * acked / self.cwnd;
                } else {
                    self.cwnd += ai * acked;
                }
                self.clamp();
            }
        }
    }

    fn on_congestion_event(
        &mut self,
        now: Timestamp,
        sent_at: Timestamp,
        is_ecn: bool,
        lost_bytes: u32,
    ) {
        if is_ecn {
            return;
        }
        self.track_in_flight(now, -f64::from(lost_bytes));
        if self.can_decrease(now) {
            self.undo = self.cfg.undo_spurious_losses.then_some(LossEpisode {
                cwnd_before: self.cwnd,
                last_decrease_before: self.last_decrease,
                consecutive_rto_before: self.consecutive_rto,
                at: now,
                pending: 0,
                first_sent_at: sent_at,
                awaiting_probe: false,
            });
            self.decrease(now, 1.0 - self.cfg.max_mdf);
        }
        // Losses in the decrease's round trip belong to its episode: all must prove spurious.
        let srtt = self.srtt_ns;
        if let Some(u) = &mut self.undo
            && (now.nanos_since(u.at) as f64) < srtt
        {
            u.pending = u.pending.saturating_add(1);
            u.first_sent_at = u.first_sent_at.min(sent_at);
            u.awaiting_probe = false;
        }
    }

    fn on_spurious_loss(&mut self, now: Timestamp, sent_at: Timestamp) {
        // The packet was taken out of flight when reported lost, and its acknowledgement
        // (which follows) takes it out again: put it back (its length is not reported here;
        // a full packet is the usual case).
        self.track_in_flight(now, self.mtu);
        let Some(u) = &mut self.undo else {
            return;
        };
        if sent_at < u.first_sent_at || u.pending == 0 {
            return;
        }
        u.pending -= 1;
        if u.pending == 0 && !u.awaiting_probe {
            let u = *u;
            self.undo = None;
            self.cwnd = self.cwnd.max(u.cwnd_before);
            self.clamp();
            self.last_decrease = u.last_decrease_before;
            self.consecutive_rto = self.consecutive_rto.min(u.consecutive_rto_before);
            self.undos += 1;
        }
    }

    fn on_retransmit_timeout(&mut self, now: Timestamp) {
        // The timeout opens (or extends) an undo episode: the probes it retransmits are
        // reported as losses right after (`on_congestion_event`, same instant), and if every
        // one of them proves spurious the timeout measured a stalled host, not the network.
        let episode = match self.undo.take() {
            Some(u) => LossEpisode {
                at: now,
                awaiting_probe: true,
                ..u
            },
            None => LossEpisode {
                cwnd_before: self.cwnd,
                last_decrease_before: self.last_decrease,
                consecutive_rto_before: self.consecutive_rto,
                at: now,
                pending: 0,
                first_sent_at: now,
                awaiting_probe: true,
            },
        };
        self.undo = self.cfg.undo_spurious_losses.then_some(episode);
        self.consecutive_rto = self.consecutive_rto.saturating_add(1);
        if self.consecutive_rto >= self.cfg.rto_reset_threshold {
            self.cwnd = self.cfg.min_cwnd * self.mtu;
            self.last_decrease = Some(now);
            self.starting = false;
        } else if self.can_decrease(now) {
            self.decrease(now, 1.0 - self.cfg.max_mdf);
        }
    }

    fn on_idle(&mut self, now: Timestamp) {
        self.idle_since.get_or_insert(now);
        self.in_flight = 0.0;
    }

    fn window(&self) -> u64 {
        self.cwnd.max(self.mtu) as u64
    }

    fn pacing_rate(&self) -> Option<u64> {
        (self.cwnd < self.mtu).then(|| ((self.cwnd * 1e9 / self.srtt_ns) as u64).max(1))
    }

    fn target_delay_ns(&self) -> Option<u64> {
        Some(self.target_ns())
    }

    fn name(&self) -> &'static str {
        "swift"
    }
}

fn finite_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() { x } else { fallback }
}

fn flow_scaling_coefficients(cfg: &SwiftConfig) -> (f64, f64) {
    let lo = finite_or(cfg.fs_min_cwnd, 0.1);
    let hi = finite_or(cfg.fs_max_cwnd, 100.0);
    if lo <= 0.0 || hi <= lo {
        return (0.0, 0.0);
    }
    let alpha = cfg.fs_range_ns as f64 / (1.0 / lo.sqrt() - 1.0 / hi.sqrt());
    (alpha, -alpha / hi.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write as _;

    const MTU: u32 = 1000;

    fn us(x: u64) -> Timestamp {
        Timestamp::from_micros(x)
    }

    /// A fixed-target configuration (absolute 100 µs, no flow scaling) so the numbers in the
    /// assertions are easy to follow.
    fn fixed_target() -> SwiftConfig {
        SwiftConfig {
            base_target_ns: 100_000,
            target_above_min_delay: false,
            fs_range_ns: 0,
            init_cwnd: 20.0,
            ..SwiftConfig::default()
        }
    }

    fn ack(c: &mut Swift, now: Timestamp, delay_us: Option<u64>) {
        let mut s = AckSample::new(now, MTU);
        s.fabric_delay_ns = delay_us.map(|d| d * 1000);
        c.on_ack_with(now, &s);
    }

    #[test]
    fn delay_above_target_shrinks_window_in_proportion_to_the_excess() {
        // Excess 25 µs over a 100 µs target at 125 µs: factor 1 − 0.8 × 25/125 = 0.84.
        let mut a = Swift::new(fixed_target(), MTU);
        ack(&mut a, us(0), Some(125));
        assert!(
            (a.cwnd_packets() - 20.0 * 0.84).abs() < 1e-9,
            "{}",
            a.cwnd_packets()
        );
        // Twice the excess (150 µs): 1 − 0.8 × 50/150 = 0.7333.
        let mut b = Swift::new(fixed_target(), MTU);
        ack(&mut b, us(0), Some(150));
        assert!((b.cwnd_packets() - 20.0 * (1.0 - 0.8 * 50.0 / 150.0)).abs() < 1e-9);
        // A huge excess is capped at max_mdf.
        let mut c = Swift::new(fixed_target(), MTU);
        ack(&mut c, us(0), Some(10_000));
        assert!((c.cwnd_packets() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn delay_above_target_decreases_at_most_once_per_rtt() {
        let mut c = Swift::new(fixed_target(), MTU);
        // srtt becomes 200 µs; factor 1 − 0.8 × 100/200 = 0.6.
        ack(&mut c, us(0), Some(200));
        assert!((c.cwnd_packets() - 12.0).abs() < 1e-9);
        for t in [10, 50, 100, 150, 199] {
            ack(&mut c, us(t), Some(200));
        }
        assert!(
            (c.cwnd_packets() - 12.0).abs() < 1e-9,
            "no second cut within one RTT"
        );
        ack(&mut c, us(200), Some(200));
        assert!(
            (c.cwnd_packets() - 7.2).abs() < 1e-9,
            "the next RTT may cut again"
        );
    }

    #[test]
    fn delay_below_target_grows_window_by_about_ai_per_rtt() {
        let mut c = Swift::new(fixed_target(), MTU);
        let mut t = 0;
        for _rtt in 0..10 {
            // One window's worth of ACKs per round trip.
            let n = c.cwnd_packets().floor() as u64;
            for _ in 0..n {
                ack(&mut c, us(t), Some(50));
                t += 50 / n.max(1);
            }
        }
        // Ten RTTs of +1 packet each (a little less, since the window grows within a round).
        let w = c.cwnd_packets();
        assert!((29.0..=30.5).contains(&w), "{w}");
    }

    #[test]
    fn loss_decreases_window_once_per_rtt() {
        let mut c = Swift::new(fixed_target(), MTU);
        ack(&mut c, us(0), Some(50)); // srtt 50 µs
        let w0 = c.cwnd_packets();
        c.on_congestion_event(us(10), us(0), false, MTU);
        assert!((c.cwnd_packets() - w0 * 0.5).abs() < 1e-9);
        c.on_congestion_event(us(20), us(0), false, MTU);
        assert!(
            (c.cwnd_packets() - w0 * 0.5).abs() < 1e-9,
            "one cut per RTT"
        );
        c.on_congestion_event(us(60), us(1), false, MTU);
        assert!((c.cwnd_packets() - w0 * 0.25).abs() < 1e-9);
    }

    /// A controller at 20 packets with a 50 µs srtt, after one loss decrease at 10 µs for a
    /// packet sent at 1 µs: window 10.
    fn after_one_loss() -> Swift {
        let mut c = Swift::new(fixed_target(), MTU);
        ack(&mut c, us(0), Some(50));
        let w0 = c.cwnd_packets();
        c.on_congestion_event(us(10), us(1), false, MTU);
        assert!((c.cwnd_packets() - w0 * 0.5).abs() < 1e-9);
        c
    }

    #[test]
    fn a_spurious_loss_restores_the_window_before_the_decrease() {
        let mut c = after_one_loss();
        let w0 = c.cwnd_packets() * 2.0;
        c.on_spurious_loss(us(30), us(1));
        assert!((c.cwnd_packets() - w0).abs() < 1e-9, "{}", c.cwnd_packets());
        assert_eq!(c.undos(), 1);
        // The undone decrease no longer holds off the next one: a real loss cuts at once.
        c.on_congestion_event(us(31), us(20), false, MTU);
        assert!((c.cwnd_packets() - w0 * 0.5).abs() < 1e-9);
        // A second proof for the same episode changes nothing.
        c.on_spurious_loss(us(32), us(1));
        assert!((c.cwnd_packets() - w0 * 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_retransmit_timeout_whose_probes_prove_spurious_gives_the_window_back() {
        let mut c = Swift::new(
            SwiftConfig {
                rto_reset_threshold: 1,
                ..fixed_target()
            },
            MTU,
        );
        ack(&mut c, us(0), Some(50));
        let w0 = c.cwnd_packets();
        // The timeout resets the window; its two probes are reported lost at once.
        c.on_retransmit_timeout(us(1000));
        c.on_congestion_event(us(1000), us(1), false, MTU);
        c.on_congestion_event(us(1000), us(2), false, MTU);
        assert!(
            (c.cwnd_packets() - 0.01).abs() < 1e-9,
            "{}",
            c.cwnd_packets()
        );
        // One original acknowledged: not yet.
        c.on_spurious_loss(us(1010), us(1));
        assert!((c.cwnd_packets() - 0.01).abs() < 1e-9);
        // Both: the host stalled, the network lost nothing.
        c.on_spurious_loss(us(1011), us(2));
        assert!((c.cwnd_packets() - w0).abs() < 1e-9, "{}", c.cwnd_packets());
        assert_eq!(c.undos(), 1);
        assert_eq!(c.pacing_rate(), None);
    }

    #[test]
    fn a_retransmit_timeout_with_a_real_loss_keeps_the_reset() {
        let mut c = Swift::new(
            SwiftConfig {
                rto_reset_threshold: 2,
                ..fixed_target()
            },
            MTU,
        );
        ack(&mut c, us(0), Some(50));
        // First timeout: a loss decrease (below the threshold), probe proves spurious: undone,
        // and it does not count towards the threshold.
        let w0 = c.cwnd_packets();
        c.on_retransmit_timeout(us(1000));
        c.on_congestion_event(us(1000), us(1), false, MTU);
        c.on_spurious_loss(us(1010), us(1));
        assert!((c.cwnd_packets() - w0).abs() < 1e-9);
        c.on_retransmit_timeout(us(2000));
        c.on_congestion_event(us(2000), us(3), false, MTU);
        assert!(
            c.cwnd_packets() > 0.01,
            "one counted timeout only: no reset"
        );
        // The next one is the second in a row: reset, and its probe was really lost (its
        // retransmission is what got acknowledged: no spurious proof ever comes).
        c.on_retransmit_timeout(us(3000));
        c.on_congestion_event(us(3000), us(4), false, MTU);
        assert!(
            (c.cwnd_packets() - 0.01).abs() < 1e-9,
            "{}",
            c.cwnd_packets()
        );
        // A proof for a packet sent before the episode changes nothing.
        c.on_spurious_loss(us(3010), us(0));
        assert!((c.cwnd_packets() - 0.01).abs() < 1e-9);
    }

    #[test]
    fn undo_can_be_turned_off() {
        let mut c = Swift::new(
            SwiftConfig {
                undo_spurious_losses: false,
                ..fixed_target()
            },
            MTU,
        );
        ack(&mut c, us(0), Some(50));
        c.on_congestion_event(us(10), us(1), false, MTU);
        let w = c.cwnd_packets();
        c.on_spurious_loss(us(30), us(1));
        assert!((c.cwnd_packets() - w).abs() < 1e-9);
    }

    #[test]
    fn undo_waits_until_every_loss_of_the_round_proved_spurious() {
        let mut c = after_one_loss();
        let w1 = c.cwnd_packets();
        c.on_congestion_event(us(20), us(2), false, MTU); // same round: no second cut
        assert!((c.cwnd_packets() - w1).abs() < 1e-9);
        c.on_spurious_loss(us(30), us(2));
        assert!(
            (c.cwnd_packets() - w1).abs() < 1e-9,
            "one loss of two proved spurious"
        );
        c.on_spurious_loss(us(40), us(1));
        assert!((c.cwnd_packets() - 2.0 * w1).abs() < 1e-9);
    }

    #[test]
    fn undo_keeps_a_window_that_grew_past_the_old_one() {
        let mut c = after_one_loss();
        let w0 = 2.0 * c.cwnd_packets();
        for t in 11..400 {
            ack(&mut c, us(t), Some(50));
        }
        let grown = c.cwnd_packets();
        assert!(grown > w0, "{grown}");
        c.on_spurious_loss(us(400), us(1));
        assert!((c.cwnd_packets() - grown).abs() < 1e-9);
    }

    #[test]
    fn real_congestion_after_the_loss_cancels_the_undo() {
        // A delay decrease in the next round.
        let mut c = after_one_loss();
        ack(&mut c, us(300), Some(500));
        let w = c.cwnd_packets();
        c.on_spurious_loss(us(310), us(1));
        assert!((c.cwnd_packets() - w).abs() < 1e-9);
        assert_eq!(c.undos(), 0);
        // A retransmit timeout.
        let mut c = after_one_loss();
        c.on_retransmit_timeout(us(20));
        let w = c.cwnd_packets();
        c.on_spurious_loss(us(30), us(1));
        assert!((c.cwnd_packets() - w).abs() < 1e-9);
        assert_eq!(c.undos(), 0);
    }

    #[test]
    fn proofs_for_older_packets_or_without_a_decrease_do_nothing() {
        let mut c = Swift::new(fixed_target(), MTU);
        ack(&mut c, us(0), Some(50));
        let w = c.cwnd_packets();
        c.on_spurious_loss(us(5), us(1));
        assert!((c.cwnd_packets() - w).abs() < 1e-9, "no decrease to undo");
        let mut c = after_one_loss();
        let w1 = c.cwnd_packets();
        c.on_spurious_loss(us(30), us(0)); // sent before the episode's first loss
        assert!((c.cwnd_packets() - w1).abs() < 1e-9);
        // The next round's loss opens a new episode: the old one can no longer be undone.
        c.on_congestion_event(us(70), us(40), false, MTU);
        c.on_spurious_loss(us(80), us(1));
        assert!((c.cwnd_packets() - w1 * 0.5).abs() < 1e-9);
        c.on_spurious_loss(us(90), us(40));
        assert!((c.cwnd_packets() - w1).abs() < 1e-9, "{}", c.cwnd_packets());
    }

    #[test]
    fn ecn_marks_do_not_move_swift() {
        let mut c = Swift::new(fixed_target(), MTU);
        c.on_congestion_event(us(0), us(0), true, 0);
        assert!((c.cwnd_packets() - 20.0).abs() < 1e-9);
    }

    #[test]
    fn retransmit_timeout_resets_window_to_min() {
        let mut c = Swift::new(fixed_target(), MTU);
        c.on_retransmit_timeout(us(1000));
        assert!((c.cwnd_packets() - 0.01).abs() < 1e-12);
        assert_eq!(c.window(), u64::from(MTU));
        // The first ACK after it brings the window back above one packet (sub-packet AI).
        ack(&mut c, us(1100), Some(50));
        assert!(c.cwnd_packets() > 1.0);
    }

    #[test]
    fn retransmit_timeouts_below_threshold_decrease_multiplicatively() {
        let cfg = SwiftConfig {
            rto_reset_threshold: 3,
            ..fixed_target()
        };
        let mut c = Swift::new(cfg, MTU);
        c.on_retransmit_timeout(us(0));
        assert!((c.cwnd_packets() - 10.0).abs() < 1e-9);
        c.on_retransmit_timeout(us(1000));
        assert!((c.cwnd_packets() - 5.0).abs() < 1e-9);
        c.on_retransmit_timeout(us(2000));
        assert!((c.cwnd_packets() - 0.01).abs() < 1e-12);
    }

    #[test]
    fn idle_restart_caps_window_at_initial() {
        let mut c = Swift::new(fixed_target(), MTU);
        let mut t = 0;
        for _ in 0..400 {
            ack(&mut c, us(t), Some(50));
            t += 5;
        }
        assert!(c.cwnd_packets() > 30.0);
        let grown = c.cwnd_packets();
        // Idle shorter than idle_restart_rtts × srtt (4 × 50 µs): nothing changes.
        c.on_idle(us(t));
        c.on_sent(us(t + 150), MTU, 0);
        assert_eq!(c.cwnd_packets(), grown);
        // Idle longer: back to the initial window, and the stale delay is forgotten.
        c.on_idle(us(t + 200));
        c.on_idle(us(t + 300)); // repeated calls keep the start of the idle period
        c.on_sent(us(t + 400), MTU, 1);
        assert!((c.cwnd_packets() - 20.0).abs() < 1e-9);
        assert_eq!(c.last_delay_ns, None);
    }

    #[test]
    fn idle_restart_keeps_a_window_smaller_than_initial() {
        let mut c = Swift::new(fixed_target(), MTU);
        ack(&mut c, us(0), Some(1000)); // cut to 10 packets
        c.on_idle(us(10));
        c.on_sent(us(100_000), MTU, 0);
        assert!((c.cwnd_packets() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn pacing_engages_below_one_packet() {
        let mut c = Swift::new(fixed_target(), MTU);
        assert_eq!(c.pacing_rate(), None);
        ack(&mut c, us(0), Some(100_000)); // srtt 100 ms, cut by max_mdf
        let mut t = 0;
        while c.cwnd_packets() >= 1.0 {
            t += 200_000;
            ack(&mut c, us(t), Some(100_000));
        }
        let w = c.cwnd_packets();
        assert!((0.5..1.0).contains(&w), "{w}");
        // window() reports one packet; the pacing rate is cwnd / srtt.
        assert_eq!(c.window(), u64::from(MTU));
        let expect = w * f64::from(MTU) / 0.1; // bytes per second at srtt = 100 ms
        let rate = c.pacing_rate().expect("paced below one packet") as f64;
        assert!((rate - expect).abs() <= 1.0, "{rate} vs {expect}");
    }

    #[test]
    fn window_stays_within_floor_and_ceiling() {
        let cfg = SwiftConfig {
            max_cwnd: 25.0,
            ..fixed_target()
        };
        let mut c = Swift::new(cfg, MTU);
        for i in 0..10_000 {
            ack(&mut c, us(i), Some(10));
        }
        assert!((c.cwnd_packets() - 25.0).abs() < 1e-9);
        for i in 0..200 {
            c.on_congestion_event(us(20_000 + i * 1000), us(0), false, MTU);
        }
        assert!((c.cwnd_packets() - 0.01).abs() < 1e-12);
    }

    #[test]
    fn target_grows_with_hops_and_for_small_windows() {
        let cfg = SwiftConfig {
            target_above_min_delay: false,
            ..SwiftConfig::default()
        };
        let mut c = Swift::new(cfg, MTU);
        // Flow scaling: full range at fs_min_cwnd and below, none at fs_max_cwnd and above.
        assert_eq!(c.flow_scaling_ns(0.01), 100_000);
        assert_eq!(c.flow_scaling_ns(0.1), 100_000);
        assert_eq!(c.flow_scaling_ns(100.0), 0);
        assert_eq!(c.flow_scaling_ns(1000.0), 0);
        let mid = c.flow_scaling_ns(1.0);
        assert!(mid > 0 && mid < 100_000);
        // init_cwnd 64 packets: 50 µs base + fs(64).
        assert_eq!(c.target_ns(), 50_000 + c.flow_scaling_ns(64.0));
        let mut s = AckSample::new(us(0), MTU);
        s.hops = Some(5);
        s.fabric_delay_ns = Some(10_000);
        c.on_ack_with(us(0), &s);
        let w = c.cwnd_packets();
        assert_eq!(c.target_ns(), 50_000 + 5 * 2_000 + c.flow_scaling_ns(w));
    }

    #[test]
    fn target_follows_the_measured_min_delay_by_default() {
        let mut c = Swift::new(SwiftConfig::default(), MTU);
        ack(&mut c, us(0), Some(40));
        ack(&mut c, us(10), Some(30));
        ack(&mut c, us(20), Some(90));
        assert_eq!(c.min_delay_ns(), Some(30_000));
        let w = c.cwnd_packets();
        assert_eq!(c.target_ns(), 30_000 + 50_000 + c.flow_scaling_ns(w));
    }

    /// Distance scaling: a fixed headroom above a 400 µs base delay (a long link) is the
    /// short fabric's; scaled, it grows with the base, and the additive increase per round
    /// trip grows with it too, while a short connection's target and increase do not move.
    #[test]
    fn distance_scaling_raises_target_and_increase_with_the_base_delay() {
        let scaled = SwiftConfig {
            base_target_ns: 15_000,
            base_delay_scale: 0.25,
            ai_ref_delay_ns: 20_000,
            ..SwiftConfig::default()
        };
        let fixed = SwiftConfig {
            base_delay_scale: 0.0,
            ai_ref_delay_ns: 0,
            ..scaled
        };
        // Long: 400 µs base delay.
        let mut a = Swift::new(fixed, MTU);
        let mut b = Swift::new(scaled, MTU);
        for c in [&mut a, &mut b] {
            ack(c, us(0), Some(400));
        }
        let (wa, wb) = (a.cwnd_packets(), b.cwnd_packets());
        assert_eq!(a.target_ns(), 400_000 + 15_000 + a.flow_scaling_ns(wa));
        assert_eq!(b.target_ns(), 500_000 + 15_000 + b.flow_scaling_ns(wb));
        // One round trip of ACKs (a window's worth) below the target: +1 packet fixed,
        // +400/20 = 20 packets scaled (17.5 from 64: the window grows within the round).
        for c in [&mut a, &mut b] {
            let n = c.cwnd_packets().round() as u64;
            for i in 0..n {
                ack(c, us(400 + i), Some(400));
            }
        }
        let (ga, gb) = (a.cwnd_packets() - wa, b.cwnd_packets() - wb);
        assert!(
            (0.9..=1.1).contains(&ga),
            "fixed: +{ga} packets in a round trip"
        );
        assert!(
            (16.0..=20.5).contains(&gb),
            "scaled: +{gb} packets in a round trip"
        );
        // Short: 10 µs base delay, below ai_ref_delay_ns: the increase is Swift's, and the
        // target moves by a quarter of 10 µs only.
        let mut s = Swift::new(scaled, MTU);
        ack(&mut s, us(0), Some(10));
        let w = s.cwnd_packets();
        assert_eq!(s.target_ns(), 12_500 + 15_000 + s.flow_scaling_ns(w));
        let n = w.round() as u64;
        for i in 0..n {
            ack(&mut s, us(10 + i), Some(10));
        }
        let g = s.cwnd_packets() - w;
        assert!(
            (0.9..=1.1).contains(&g),
            "short: +{g} packets in a round trip"
        );
    }

    /// Hop telemetry: a flow whose delay comes from two standing queues of 12 µs each (and a
    /// 10 µs base) is cut by a summed signal where a flow crossing one of them is not, and
    /// with telemetry both see the one bottleneck hop's 12 µs and keep the same window.
    #[test]
    fn rate_fair_increase_with_exponent_two_grows_rates_alike() {
        // Two connections with the same 10 µs base delay, one with a 20 µs round trip and
        // one with 40 µs (queues, all below the target). Growth per round trip is the factor
        // on `ai`; per unit of time it is that over the round trip, and a rate grows by it
        // over the round trip once more.
        let cfg = SwiftConfig {
            base_target_ns: 100_000,
            fs_range_ns: 0,
            init_cwnd: 50.0,
            rtt_fair_max: 64.0,
            ..SwiftConfig::default()
        };
        let growth = |rtt_us: u64, exp: f64| {
            let mut c = Swift::new(
                SwiftConfig {
                    rtt_fair_exp: exp,
                    ..cfg
                },
                MTU,
            );
            let before = c.cwnd_packets();
            // A tenth of the window acknowledged: a tenth of a round trip's growth.
            for t in 0..5 {
                let mut s = AckSample::new(us(t), MTU);
                s.rtt_ns = Some(rtt_us * 1000);
                s.fabric_delay_ns = Some(10_000);
                c.on_ack_with(us(t), &s);
            }
            (c.cwnd_packets() - before) * 10.0
        };
        let near = |a: f64, b: f64| (a - b).abs() <= 0.05 * a.abs().max(b.abs());
        // Exponent 1: (rtt / base) per round trip, the same window growth per unit of time.
        let (w20, w40) = (growth(20, 1.0), growth(40, 1.0));
        assert!(near(w20, 2.0) && near(w40, 4.0), "{w20} {w40}");
        assert!(near(w20 / 20.0, w40 / 40.0));
        // Exponent 2: (rtt / base)² per round trip, the same rate growth per unit of time.
        let (r20, r40) = (growth(20, 2.0), growth(40, 2.0));
        assert!(near(r20, 4.0) && near(r40, 16.0), "{r20} {r40}");
        assert!(near(r20 / 400.0, r40 / 1600.0));
        // Capped by `rtt_fair_max`.
        let capped = Swift::new(
            SwiftConfig {
                rtt_fair_exp: 2.0,
                rtt_fair_max: 8.0,
                ..cfg
            },
            MTU,
        );
        let mut c = capped;
        let before = c.cwnd_packets();
        for t in 0..5 {
            let mut s = AckSample::new(us(t), MTU);
            s.rtt_ns = Some(40_000);
            s.fabric_delay_ns = Some(10_000);
            c.on_ack_with(us(t), &s);
        }
        let g = (c.cwnd_packets() - before) * 10.0;
        assert!(near(g, 8.0), "{g}");
    }

    /// With `rtt_fair_hop_ref`, a round trip stretched only by the bottleneck hop's own queue
    /// (an incast: 10 µs base, 30 µs of queue at the receiver, a 40 µs round trip) grows at
    /// plain Swift's pace, while one stretched by queues beyond that hop (the same 40 µs with
    /// a 10 µs hop queue) still grows faster, by `(40 / 20)²`; without it both grow 16-fold.
    #[test]
    fn rate_fair_increase_against_the_hop_delay_ignores_the_bottleneck_queue() {
        let cfg = SwiftConfig {
            base_target_ns: 100_000,
            fs_range_ns: 0,
            init_cwnd: 50.0,
            rtt_fair_max: 64.0,
            rtt_fair_exp: 2.0,
            hop_telemetry: true,
            ..SwiftConfig::default()
        };
        let growth = |hop_ref: bool, hop_queue_us: u64| {
            let mut c = Swift::new(
                SwiftConfig {
                    rtt_fair_hop_ref: hop_ref,
                    ..cfg
                },
                MTU,
            );
            // The base delay first (an unqueued path), then a tenth of a window queued.
            let mut s = AckSample::new(us(0), MTU);
            s.rtt_ns = Some(40_000);
            s.fabric_delay_ns = Some(10_000);
            s.hop_queue_ns = Some(0);
            c.on_ack_with(us(0), &s);
            let before = c.cwnd_packets();
            for t in 1..=5 {
                let mut s = AckSample::new(us(t), MTU);
                s.rtt_ns = Some(40_000);
                s.fabric_delay_ns = Some(40_000);
                s.hop_queue_ns = Some(hop_queue_us * 1000);
                c.on_ack_with(us(t), &s);
            }
            (c.cwnd_packets() - before) * 10.0
        };
        let near = |a: f64, b: f64| (a - b).abs() <= 0.05 * a.abs().max(b.abs());
        // Against the minimum (10 µs) both grow by (40 / 10)² per round trip.
        let (a, b) = (growth(false, 30), growth(false, 10));
        assert!(near(a, 16.0) && near(b, 16.0), "{a} {b}");
        // Against the hop delay: the incast's reference is its whole round trip (10 + 30 µs),
        // a factor of 1; the other's is 10 + 10 µs, a factor of (40 / 20)².
        let (incast, beyond) = (growth(true, 30), growth(true, 10));
        assert!(near(incast, 1.0), "{incast}");
        assert!(near(beyond, 4.0), "{beyond}");
    }

    #[test]
    fn hop_telemetry_does_not_cut_a_flow_crossing_two_queues_harder() {
        let cfg = SwiftConfig {
            base_target_ns: 15_000,
            fs_range_ns: 0,
            ..SwiftConfig::default()
        };
        let run = |telemetry: bool, queues: u64| {
            let mut c = Swift::new(
                SwiftConfig {
                    hop_telemetry: telemetry,
                    ..cfg
                },
                MTU,
            );
            // The base, measured first.
            ack(&mut c, us(0), Some(10));
            for t in 1..2000 {
                let mut s = AckSample::new(us(t), MTU);
                s.fabric_delay_ns = Some(10_000 + queues * 12_000);
                s.hop_queue_ns = Some(12_000);
                c.on_ack_with(us(t), &s);
            }
            c.cwnd_packets()
        };
        let (one, two) = (run(false, 1), run(false, 2));
        assert!(two < one / 4.0, "summed delay: {two} vs {one} packets");
        let (one_t, two_t) = (run(true, 1), run(true, 2));
        assert!((one_t - two_t).abs() < 1e-9, "{one_t} vs {two_t}");
        assert!(
            (one_t - one).abs() < 1e-9,
            "one queue: telemetry changes nothing"
        );
        // Samples without telemetry keep the measured delay.
        let mut c = Swift::new(
            SwiftConfig {
                hop_telemetry: true,
                ..cfg
            },
            MTU,
        );
        ack(&mut c, us(0), Some(10));
        for t in 1..2000 {
            ack(&mut c, us(t), Some(34));
        }
        assert!((c.cwnd_packets() - two).abs() < 1e-9);
    }

    fn ack_marked(c: &mut Swift, now: Timestamp, delay_us: u64, ce: bool) {
        let mut s = AckSample::new(now, MTU);
        s.fabric_delay_ns = Some(delay_us * 1000);
        s.ecn_ce = Some(ce);
        c.on_ack_with(now, &s);
    }

    #[test]
    fn marked_samples_do_not_set_the_min_delay() {
        // A connection whose first packets queue behind others' (marked): the queue must not
        // become its base delay, or its target would sit a whole queue higher.
        let mut c = Swift::new(SwiftConfig::default(), MTU);
        ack_marked(&mut c, us(0), 40, true);
        ack_marked(&mut c, us(10), 35, true);
        assert_eq!(c.min_delay_ns(), None);
        let w = c.cwnd_packets();
        assert_eq!(c.target_ns(), 50_000 + c.flow_scaling_ns(w));
        // ... but they are still the delay the window reacts to: 35 µs is below the absolute
        // 50 µs target, 90 µs above it.
        let before = c.cwnd_packets();
        ack_marked(&mut c, us(400), 90, true);
        assert!(c.cwnd_packets() < before);
        // The first unmarked sample is the base, and a lower marked one does not replace it.
        ack_marked(&mut c, us(500), 12, false);
        ack_marked(&mut c, us(510), 8, true);
        assert_eq!(c.min_delay_ns(), Some(12_000));
    }
    #[test]
    fn samples_without_delay_reuse_the_latest_delay() {
        let mut c = Swift::new(fixed_target(), MTU);
        ack(&mut c, us(0), Some(200)); // cut: 20 -> 12
        ack(&mut c, us(300), None); // still above target: a second cut after one RTT
        assert!((c.cwnd_packets() - 7.2).abs() < 1e-9);
    }

    /// Runs an ACK-clocked connection with a 20 µs round trip, acknowledging below the target,
    /// that keeps as many packets in flight as its window allows but at most `limit`, for
    /// `acks` acknowledgements; returns the window, packets.
    fn ack_clocked_up_to(cfg: SwiftConfig, acks: u64, limit: u64) -> f64 {
        let mut c = Swift::new(cfg, MTU);
        let mut in_flight = 0;
        let mut t = 0;
        for _ in 0..acks {
            while in_flight < (c.window() / u64::from(MTU)).min(limit) {
                c.on_sent(Timestamp::from_nanos(t), MTU, 0);
                in_flight += 1;
            }
            t += 1_000;
            ack(&mut c, Timestamp::from_nanos(t), Some(20));
            in_flight -= 1;
        }
        c.cwnd_packets()
    }

    #[test]
    fn window_validation_stops_growth_of_a_window_the_sender_does_not_fill() {
        // A sender held at 5 packets in flight (its host link, not its window, limits it).
        let validated = SwiftConfig {
            validate_cwnd: 1.05,
            ..fixed_target()
        };
        // Without validation the unused window keeps growing: each acknowledgement adds
        // 1/w of a packet, so w^2 grows by 2 per acknowledgement (20 -> 28.3 in 200).
        let plain = ack_clocked_up_to(fixed_target(), 200, 5);
        assert!(plain > 28.0, "{plain}");
        // With it the window stops at its initial 20 packets (which need no proof), one
        // increase past them at most.
        let w = ack_clocked_up_to(validated, 200, 5);
        assert!(w < 20.1, "{w}");
    }

    #[test]
    fn window_validation_lets_a_full_window_grow() {
        // The sender keeps its window full: the window is what limits it, and it grows by a
        // packet a round trip as without validation.
        let cfg = SwiftConfig {
            validate_cwnd: 1.05,
            ..fixed_target()
        };
        let w = ack_clocked_up_to(cfg, 250, u64::MAX);
        assert!(w > 29.0, "{w}");
        assert_eq!(w, ack_clocked_up_to(fixed_target(), 250, u64::MAX));
    }

    #[test]
    fn swift_is_the_default_controller() {
        let c = SwiftConfig::default().build(1472);
        assert_eq!(c.name(), "swift");
        assert_eq!(c.window(), 64 * 1472);
        assert_eq!(c.pacing_rate(), None);
    }

    /// Swift's window over 50 round trips of a delay step: 10 RTTs at a low delay, 20 at a
    /// delay above the largest target (the window falls to the floor and pacing takes over),
    /// then 20 at a moderate delay. Each round acknowledges one window's worth of packets;
    /// below one packet the pacing credit decides whether a packet goes out in that round.
    /// `fixed_target` (absolute 100 µs target, so the fast-start gate is at 50 µs) with the
    /// delay-gated start.
    fn fast_start() -> SwiftConfig {
        SwiftConfig {
            fast_start: true,
            ..fixed_target()
        }
    }

    #[test]
    fn fast_start_grows_by_the_acked_bytes_below_half_the_headroom() {
        let mut c = Swift::new(fast_start(), MTU);
        assert!(c.in_fast_start());
        // 20 ACKs of one packet at 49 µs (below the 50 µs gate): 20 -> 40 packets, one
        // doubling for a window's worth of ACKs.
        for t in 0..20 {
            ack(&mut c, us(t), Some(49));
        }
        assert!(
            (c.cwnd_packets() - 40.0).abs() < 1e-9,
            "{}",
            c.cwnd_packets()
        );
        // At the gate (50 µs, still below the 100 µs target): the additive increase,
        // 1/40 packet per ACK.
        ack(&mut c, us(20), Some(50));
        assert!(
            (c.cwnd_packets() - 40.025).abs() < 1e-9,
            "{}",
            c.cwnd_packets()
        );
        assert!(c.in_fast_start());
    }

    /// Sends 20 packets at 1 µs intervals from `start_us` and acknowledges each 40 µs later
    /// (below the fast-start gate); returns the window, packets.
    fn fast_start_round(c: &mut Swift, start_us: u64) -> f64 {
        for t in start_us..start_us + 20 {
            c.on_sent(us(t), MTU, 0);
        }
        for t in start_us..start_us + 20 {
            let mut s = AckSample::new(us(t), MTU);
            s.fabric_delay_ns = Some(40_000);
            c.on_ack_with(us(t + 40), &s);
        }
        c.cwnd_packets()
    }

    #[test]
    fn fast_start_once_after_first_round_skips_the_first_round_and_idle_restarts() {
        // Without the option the first round's ACKs double the window: 20 -> 40.
        let mut plain = Swift::new(fast_start(), MTU);
        assert!((fast_start_round(&mut plain, 0) - 40.0).abs() < 1e-9);
        let mut c = Swift::new(
            SwiftConfig {
                fast_start_once_after_first_round: true,
                ..fast_start()
            },
            MTU,
        );
        // The first round (sent within 40 µs, the minimum delay, of the first packet): the
        // additive increase, about a packet.
        let w = fast_start_round(&mut c, 0);
        assert!(w > 20.9 && w < 21.0, "{w}");
        assert!(c.in_fast_start());
        // The second round (sent from 40 µs on): the delay-gated start doubles.
        let w2 = fast_start_round(&mut c, 60);
        assert!((w2 - (w + 20.0)).abs() < 1e-9, "{w2}");
        // It ends at the first decrease and an idle restart does not start it again.
        ack(&mut c, us(200), Some(500));
        assert!(!c.in_fast_start());
        c.on_idle(us(300));
        c.on_sent(us(5_000), MTU, 0);
        assert!(!c.in_fast_start());
    }

    #[test]
    fn fast_start_is_off_by_default() {
        let mut c = Swift::new(fixed_target(), MTU);
        assert!(!c.in_fast_start());
        for t in 0..20 {
            ack(&mut c, us(t), Some(10));
        }
        // 20 ACKs at 20-21 packets: about one packet in all.
        assert!(c.cwnd_packets() < 21.0, "{}", c.cwnd_packets());
    }

    #[test]
    fn fast_start_ends_at_the_first_decrease_and_resumes_after_an_idle_restart() {
        let mut c = Swift::new(fast_start(), MTU);
        ack(&mut c, us(0), Some(200)); // above target: cut to 12 packets
        assert!(!c.in_fast_start());
        let w = c.cwnd_packets();
        ack(&mut c, us(300), Some(10));
        assert!(
            (c.cwnd_packets() - (w + 1.0 / w)).abs() < 1e-9,
            "additive again"
        );
        // Idle for more than idle_restart_rtts round trips: the next send restarts it.
        c.on_idle(us(400));
        c.on_sent(us(400 + 5 * 200), MTU, 0);
        assert!(c.in_fast_start());
        let w = c.cwnd_packets();
        ack(&mut c, us(1500), Some(10));
        assert!(
            (c.cwnd_packets() - (w + 1.0)).abs() < 1e-9,
            "{}",
            c.cwnd_packets()
        );
    }

    #[test]
    fn fast_start_ends_at_a_loss() {
        let mut c = Swift::new(fast_start(), MTU);
        c.on_congestion_event(us(0), us(0), false, MTU);
        assert!(!c.in_fast_start());
    }

    #[test]
    fn trajectory_under_a_delay_step() {
        let mtu = 1472;
        let mut c = Swift::new(SwiftConfig::default(), mtu);
        let mut table = String::from(
            "rtt | t_us   | delay_us | target_us | cwnd_pkts | window_B | pacing_Bps\n",
        );
        let mut t_ns: u64 = 0;
        let mut credit = 0.0;
        for rtt in 0..50 {
            let delay_us: u64 = match rtt {
                0..10 => 25,
                10..30 => 300,
                _ => 40,
            };
            let w = c.cwnd_packets();
            credit += w;
            let n = credit.floor() as u64;
            credit -= n as f64;
            // ACKs spread over the round; each sample was sent one delay earlier, and each ACK
            // clocks out the next packet.
            let step = delay_us * 1000 / n.max(1);
            for i in 0..n {
                let now = Timestamp::from_nanos(t_ns + i * step);
                let sent_at =
                    Timestamp::from_nanos((t_ns + i * step).saturating_sub(delay_us * 1000));
                let mut s = AckSample::new(sent_at, mtu);
                s.rtt_ns = Some(delay_us * 1000);
                s.fabric_delay_ns = Some(delay_us * 1000);
                c.on_ack_with(now, &s);
                c.on_sent(now, mtu, 0);
            }
            t_ns += delay_us * 1000;
            writeln!(
                table,
                "{rtt:>3} | {:>6} | {delay_us:>8} | {:>9} | {:>9.3} | {:>8} | {:>10}",
                t_ns / 1000,
                c.target_ns() / 1000,
                c.cwnd_packets(),
                c.window(),
                c.pacing_rate().map_or("-".to_string(), |r| r.to_string()),
            )
            .unwrap();
        }
        insta::assert_snapshot!(table);
    }
}
