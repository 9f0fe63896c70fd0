//! Per-path health and path choice for one connection.
//!
//! A Braid connection sprays its packets over N paths (1 to [`MAX_PATHS`]); a path is an
//! entropy value, the UDP source port, that ECMP hashes onto some route. [`PathSet`] keeps, per
//! path, an EWMA of the fabric delay, of the fraction of packets that arrived CE-marked, and
//! of the loss rate, plus the packets in flight, and turns them into:
//!
//! - **spraying weights** ([`PathSet::weights`]): a path's health is
//!
//!   ```text
//!   h = b / (1 + k_delay × max(0, delay / min_delay − 1 − delay_tolerance)
//!              + k_ecn × max(0, ecn_frac − median ecn_frac − ecn_tolerance)
//!              + k_loss × loss_rate)
//!   share = probe_floor / N + (1 − probe_floor) × h / Σh
//!   ```
//!
//!   where `min_delay` is the lowest smoothed delay among the paths and `b`, the *balance*
//!   factor, is an EWMA (gain `balance_gain`, per delay sample) of `median delay / sample`
//!   taken in the log domain, within `1/balance_range..balance_range`: it evens out moderate
//!   delay differences the tolerance ignores, such as a link that carries more of the
//!   connection's paths than the others (ports hash onto links unevenly). Only the *relative*
//!   delay and marking matter: congestion every path shares (at the receiver's downlink, say)
//!   is the congestion controller's business, not a reason to move traffic. The `probe_floor` keeps
//!   a share of `probe_floor / N` on every path, so a path that recovered is noticed.
//! - **weighted choice** ([`PathSet::pick`], [`PathSet::pick_other`] for retransmissions):
//!   deterministic given a random `u32` the caller draws from its own seeded generator;
//!   [`PathSet::pick_spread`] (what the engine uses for new packets) walks a low-discrepancy
//!   sequence through the same shares instead, so each path's count keeps close to its share
//!   over any run of packets rather than drifting as independent draws do.
//! - **PLB-style re-pathing** (Qureshi et al., "PLB: Congestion Signals are Simple and
//!   Effective for Network Load Balancing", SIGCOMM 2022): per path, a *round* ends when
//!   feedback (an ACK or a loss) arrives for a packet sent after the round began, so a round
//!   is about one round trip of that path. A round is *congested* when at least
//!   `plb_ecn_threshold` of its ECN-reporting packets were marked, or more than
//!   `plb_loss_threshold` of its packets were lost, or its mean delay exceeded the delay
//!   target, *and* the path is an [outlier](PathSet::is_outlier) against the connection's
//!   median: congestion all paths share would follow a path to any port, so re-pathing on
//!   it only moves paths around (onto worse links as often as better ones) and the moves
//!   cost stalls (see `docs/design-notes.md`, "Re-pathing only outliers").
//!   After `plb_rounds` consecutive congested rounds the path is queued for
//!   re-pathing; [`PathSet::take_repath`] hands its index to the engine (which gives it a fresh
//!   random source port) and resets its statistics.
//! - **a connection-wide signal** ([`PathSet::connection_signal`]) and per-path outlier
//!   filtering ([`PathSet::is_outlier`], [`PathSet::cc_delay_ns`]).
//!
//! # Why the controller sees a median, not the worst path
//!
//! The connection has one congestion window (or rate) and many paths. If every path's samples
//! went straight to the controller, one bad path (a hot link, a flapping switch, a black hole)
//! would trigger a multiplicative decrease every round trip and collapse the whole
//! connection's window, although most of its traffic crosses healthy paths, and although the
//! right response to one bad path is to move traffic off it, which the weights and PLB do.
//! So the two mechanisms split the work:
//!
//! - congestion **common** to the paths (the receiver's link, an incast) raises every path's
//!   delay and marks, so it raises the median, and the controller backs off;
//! - congestion **on some paths only** leaves the median alone: those paths lose weight, and
//!   PLB moves them if it persists.
//!
//! The median is weighted by each path's share of the traffic: it is the delay that half of
//! the connection's packets see or less. The engine therefore feeds the controller:
//!
//! - delay samples through [`PathSet::cc_delay_ns`], which first replaces a sample by the
//!   median if its path is an outlier (smoothed delay above `outlier_delay_ratio` × the
//!   median), then hands the controller the median of the samples of the last round trip
//!   (at most [`RECENT_DELAYS`]): a shared rise reaches the controller as soon as it covers
//!   half the round trip's packets, while a queue that only some paths cross does not;
//!   with one path the sample passes as it is;
//! - ECN and loss events only from paths that are not [outliers](PathSet::is_outlier).
//!
//! The per-sample median is what makes the split hold with many paths. The per-path outlier
//! test needs a few samples on the same path, and a connection spraying over 256 source
//! ports sees each one about once every 256 packets, so with many paths almost nothing is an
//! outlier and raw samples would reach the controller. Swift reacts to any one sample above
//! target (once per round trip), so the few packets that cross a transiently deep queue would
//! cut the window every few round trips while the rest of the packets see no queue (see
//! `docs/design-notes.md`, "The per-round-trip median"). The round trip's median sees those
//! rare samples for what they are.
//!
//! Per-path windows (one controller per path) would be the alternative; they split an already
//! small window N ways and make each path's controller learn from a trickle of samples, so
//! Braid keeps one window per connection and a median-filtered signal.

use std::collections::VecDeque;

use braid_time::Timestamp;

use crate::AckSample;

/// Most paths one connection may have.
pub const MAX_PATHS: usize = 256;

/// Most delay samples the controller's median covers ([`PathSet::cc_delay_ns`]): about one
/// round trip of a 100 Gbit/s connection with 4 KiB packets and a 10 µs round trip.
pub const RECENT_DELAYS: usize = 32;

/// Quantization of the shares used for picking: shares become integers summing to about
/// this, so a choice is exact integer arithmetic on the caller's random number.
const SHARE_SCALE: f64 = (1u64 << 24) as f64;

/// `2^32 / φ`, rounded to odd: the step of [`PathSet::pick_spread`]'s Weyl sequence.
const GOLDEN_U32: u32 = 0x9E37_79B9;

/// Tuning of a [`PathSet`]. The defaults are Braid's choices, except PLB's round count and
/// ECN threshold, which are the PLB paper's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathConfig {
    /// EWMA gain of the per-path delay (per sample). Default 1/8.
    pub delay_gain: f64,
    /// EWMA gain of the per-path ECN fraction (per ECN-reporting ACK). Default 1/16.
    pub ecn_gain: f64,
    /// EWMA gain of the per-path loss rate (per ACK or loss). Default 1/16.
    pub loss_gain: f64,
    /// Weight penalty per unit of relative excess delay. Default 1: a path 10× slower than
    /// the best gets about a ninth of the health.
    pub k_delay: f64,
    /// Relative excess delay ignored as jitter. Default 1: at microsecond base delays a
    /// queue of one or two packets on a loaded link doubles the delay, which says the link
    /// is busy, not that it is bad; a deep queue (a slow link) is still far above.
    pub delay_tolerance: f64,
    /// Weight penalty per unit of ECN fraction above the connection's (share-weighted) median.
    /// Default 50: 40% of the packets marked where most paths see none leaves about a
    /// twentieth of the health, so a marked link loses its traffic even when its queue is
    /// shorter than the busy healthy links' (a much smaller gain leaves it a good share; see
    /// `docs/design-notes.md`, "The ECN penalty").
    pub k_ecn: f64,
    /// ECN fraction above the connection's median ignored as noise, both by the penalty and
    /// by the rule that a marked path may not gain share from the balance term. Default 0.
    pub ecn_tolerance: f64,
    /// Weight penalty per unit of loss rate. Default 50: 2% loss halves the health.
    pub k_loss: f64,
    /// Fraction of the traffic spread evenly over all paths whatever their health, so every
    /// path keeps being probed. Default 0.1.
    pub probe_floor: f64,
    /// Consecutive congested rounds before a path is re-pathed. Default 3 (PLB).
    pub plb_rounds: u32,
    /// Fraction of marked packets that makes a round congested. Default 0.5 (PLB).
    pub plb_ecn_threshold: f64,
    /// Fraction of lost packets above which a round is congested. Default 0.01: with a
    /// handful of packets per path and round, any loss.
    pub plb_loss_threshold: f64,
    /// Without a delay target set by the engine, a round is congested when its mean delay
    /// exceeds this multiple of the lowest delay measured. Default 3.
    pub plb_delay_factor: f64,
    /// A path whose smoothed delay exceeds this multiple of the connection's median is an
    /// outlier. Default 2.
    pub outlier_delay_ratio: f64,
    /// A path whose ECN fraction exceeds the median by this much is an outlier. Default 0.2.
    pub outlier_ecn_margin: f64,
    /// A path whose loss rate exceeds the median by this much is an outlier. Default 0.05.
    pub outlier_loss_margin: f64,
    /// Samples a path needs (since its last reset) before it can be called an outlier.
    /// Default 4.
    pub min_samples: u32,
    /// Gain of the balance term, per delay sample (0 turns it off). Default 0.05. Each
    /// sample moves the path's balance factor by `(median delay / sample)^balance_gain`, so
    /// paths whose packets wait longer than the connection's typical packet lose share and
    /// faster ones gain it until the delays even out: ports hash onto links unevenly (four
    /// links and sixteen paths can split 10/3/2/1), and a link that carries more of the
    /// connection's paths queues more. The health formula alone ignores moderate delay
    /// differences (see `delay_tolerance`); this term removes them slowly.
    pub balance_gain: f64,
    /// Largest factor the balance term may give or take away. Default 16.
    pub balance_range: f64,
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            delay_gain: 1.0 / 8.0,
            ecn_gain: 1.0 / 16.0,
            loss_gain: 1.0 / 16.0,
            k_delay: 1.0,
            delay_tolerance: 1.0,
            k_ecn: 50.0,
            ecn_tolerance: 0.0,
            k_loss: 50.0,
            probe_floor: 0.1,
            plb_rounds: 3,
            plb_ecn_threshold: 0.5,
            plb_loss_threshold: 0.01,
            plb_delay_factor: 3.0,
            outlier_delay_ratio: 2.0,
            outlier_ecn_margin: 0.2,
            outlier_loss_margin: 0.05,
            min_samples: 4,
            balance_gain: 0.05,
            balance_range: 16.0,
        }
    }
}

/// What a [`PathSet`] knows about one path, for statistics and tests.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct PathView {
    /// Smoothed fabric delay, ns, if any sample arrived since the last reset.
    pub delay_ns: Option<u64>,
    /// Delay samples since the last reset.
    pub delay_samples: u32,
    /// Smoothed fraction of CE-marked packets.
    pub ecn_frac: f64,
    /// Smoothed loss rate.
    pub loss_rate: f64,
    /// ACKs and losses counted since the last reset.
    pub outcomes: u32,
    /// Packets sent on the path and not yet acknowledged or declared lost.
    pub in_flight: u32,
    /// Consecutive congested rounds so far.
    pub congested_rounds: u32,
    /// Times the path was re-pathed.
    pub repaths: u32,
}

/// The connection-wide congestion signal: per-path values aggregated by their median,
/// weighted by each path's share of the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct ConnectionSignal {
    /// Weighted median of the smoothed per-path delays, ns.
    pub delay_ns: Option<u64>,
    /// Weighted median of the per-path ECN fractions.
    pub ecn_frac: f64,
    /// Weighted median of the per-path loss rates.
    pub loss_rate: f64,
    /// Lowest delay sample seen on any path, ns.
    pub min_delay_ns: Option<u64>,
}

/// Per-path state and path choice for one connection. See the [module docs](self).
///
/// # Call contract
///
/// - [`on_sent`](PathSet::on_sent) for every data packet, with the path it went out on;
/// - [`on_ack`](PathSet::on_ack) for every packet newly acknowledged, with its path, send
///   time and, when the ACK measured them for this packet, its delay and ECN mark;
/// - [`on_loss`](PathSet::on_loss) for every packet declared lost;
/// - [`pick`](PathSet::pick) / [`pick_other`](PathSet::pick_other) to choose a path;
/// - [`take_repath`](PathSet::take_repath) now and then (after ACK processing): each index it
///   returns gets a fresh random source port.
///
/// Path indices out of range are ignored. Nothing here allocates after construction.
#[derive(Debug, Clone)]
pub struct PathSet {
    cfg: PathConfig,
    /// `ln(cfg.balance_range)` (at least 0): a logarithm per acknowledged packet less.
    balance_range_ln: f64,
    paths: Vec<Path>,
    shares: Vec<f64>,
    /// Cumulative quantized shares: path `i` owns `[cum[i] - q[i], cum[i])`.
    cum: Vec<u64>,
    /// Where a choice starts looking in `cum`: `guide[j]` is the path owning
    /// `j × total / guide.len()`, so a choice scans a path or two from there instead of a
    /// binary search's chain of dependent loads (a cache miss each, with hundreds of QPs).
    /// Empty below [`GUIDE_MIN_PATHS`] paths, where a choice searches `cum` directly.
    guide: Vec<u16>,
    signal: ConnectionSignal,
    dirty: bool,
    events_since_refresh: u32,
    refresh_every: u32,
    repath_queue: VecDeque<u16>,
    min_delay_ns: Option<u64>,
    delay_target_ns: Option<u64>,
    /// Path indices in the order of each median's value, and the keys that order them (see
    /// [`PathSet::order`] and [`rank_key`]).
    orders: [Vec<u16>; 3],
    ranks: [Vec<u128>; 3],
    /// Whether `orders[k]` and `ranks[k]` hold every path's key as of the last refresh, so
    /// that only the paths fed since (`stale`) need placing again. A refresh that finds a
    /// median's values all equal skips its order and clears this.
    ranked: [bool; 3],
    /// Each path's health (its share before normalising) as the last refresh computed it,
    /// whether the path was fed since (`stale`), and what every health depended on beyond
    /// its own path then (the lowest delay and the median ECN fraction, as bits). A refresh
    /// recomputes only the stale paths unless those changed: one ACK feeds one path, and
    /// the exponentials and divisions of every path at each ACK were most of a refresh.
    health: Vec<f64>,
    stale: Vec<bool>,
    /// How many paths are `stale`.
    fed: usize,
    health_inputs: (u64, u64),
    /// The latest delays handed to the controller, a ring: (ACK time ns, delay ns).
    recent: [(u64, u64); RECENT_DELAYS],
    recent_pos: usize,
    recent_len: usize,
    /// The last point of [`PathSet::pick_spread`]'s sequence.
    spread: Option<u32>,
}

impl PathSet {
    /// A set of `n` paths with default tuning.
    ///
    /// # Panics
    ///
    /// If `n` is 0 or above [`MAX_PATHS`].
    pub fn new(n: u16) -> Self {
        Self::with_config(n, PathConfig::default())
    }

    /// A set of `n` paths.
    ///
    /// # Panics
    ///
    /// If `n` is 0 or above [`MAX_PATHS`].
    pub fn with_config(n: u16, cfg: PathConfig) -> Self {
        let n = usize::from(n);
        assert!(
            (1..=MAX_PATHS).contains(&n),
            "a connection has 1..={MAX_PATHS} paths, not {n}"
        );
        let mut cfg = cfg;
        cfg.probe_floor = finite_or(cfg.probe_floor, 0.1).clamp(0.0, 1.0);
        cfg.delay_gain = finite_or(cfg.delay_gain, 0.125).clamp(0.0, 1.0);
        cfg.ecn_gain = finite_or(cfg.ecn_gain, 0.0625).clamp(0.0, 1.0);
        cfg.loss_gain = finite_or(cfg.loss_gain, 0.0625).clamp(0.0, 1.0);
        let mut set = PathSet {
            cfg,
            balance_range_ln: cfg.balance_range.max(1.0).ln(),
            paths: vec![Path::default(); n],
            shares: vec![0.0; n],
            cum: vec![0; n],
            guide: if n >= GUIDE_MIN_PATHS {
                vec![0; n.next_power_of_two()]
            } else {
                Vec::new()
            },
            signal: ConnectionSignal::default(),
            dirty: true,
            events_since_refresh: 0,
            // Amortize the O(N log N) refresh over N/16 feedback events, and over two at
            // least: with 16 paths, a refresh at every ACK of a one-packet message was a
            // quarter of the sender's instructions per round trip.
            refresh_every: u32::try_from(n.div_ceil(16)).unwrap_or(1).max(2),
            repath_queue: VecDeque::with_capacity(n),
            min_delay_ns: None,
            delay_target_ns: None,
            // `n ≤ MAX_PATHS`, which fits in u16.
            orders: std::array::from_fn(|_| {
                (0..n).map(|i| u16::try_from(i).unwrap_or(0)).collect()
            }),
            ranks: std::array::from_fn(|_| Vec::with_capacity(n)),
            ranked: [false; 3],
            health: vec![0.0; n],
            stale: vec![true; n],
            fed: n,
            health_inputs: (u64::MAX, u64::MAX),
            recent: [(0, 0); RECENT_DELAYS],
            recent_pos: 0,
            recent_len: 0,
            spread: None,
        };
        set.refresh();
        set
    }

    /// Number of paths.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Always `false`: a set has at least one path.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// What is known about `path`.
    pub fn stats(&self, path: u16) -> Option<PathView> {
        let p = self.paths.get(usize::from(path))?;
        Some(PathView {
            delay_ns: (p.delay_samples > 0).then_some(p.delay_ns as u64),
            delay_samples: p.delay_samples,
            ecn_frac: p.ecn_frac,
            loss_rate: p.loss_rate,
            outcomes: p.outcomes,
            in_flight: p.in_flight,
            congested_rounds: p.congested_rounds,
            repaths: p.repaths,
        })
    }

    /// Sets the delay above which a round counts as congested for PLB; `None` falls back to
    /// `plb_delay_factor` × the lowest delay measured. The engine may keep it at the
    /// controller's [`target_delay_ns`](crate::Controller::target_delay_ns).
    pub fn set_delay_target_ns(&mut self, target_ns: Option<u64>) {
        self.delay_target_ns = target_ns;
    }

    /// A packet left on `path` at `now`.
    pub fn on_sent(&mut self, path: u16, now: Timestamp) {
        if let Some(p) = self.paths.get_mut(usize::from(path)) {
            p.in_flight = p.in_flight.saturating_add(1);
            p.last_sent = p.last_sent.max(now);
        }
    }

    /// A packet sent on `s.path` at `s.sent_at` was acknowledged at `now`. Reads the delay
    /// ([`AckSample::delay_ns`]) and the CE mark (`ecn_ce`) when present.
    pub fn on_ack(&mut self, now: Timestamp, s: &AckSample) {
        let i = usize::from(s.path);
        let cfg = self.cfg;
        let Some(p) = self.paths.get_mut(i) else {
            return;
        };
        p.in_flight = p.in_flight.saturating_sub(1);
        if s.sent_at < p.epoch {
            return; // sent on the path's previous source port
        }
        self.next_round(i, now, s.sent_at);
        self.mark_fed(i);
        let p = &mut self.paths[i];
        p.absorb(&cfg, s);
        p.balance(&cfg, self.balance_range_ln, s, self.signal.delay_ns);
        if let Some(d) = s.delay_ns() {
            self.min_delay_ns = Some(self.min_delay_ns.map_or(d, |m| m.min(d)));
        }
        p.loss_rate = flush_tiny(p.loss_rate - cfg.loss_gain * p.loss_rate);
        p.outcomes = p.outcomes.saturating_add(1);
        p.round.acked += 1;
    }

    /// A copy sent on `s.path` at `s.sent_at`, already declared lost (and reported through
    /// [`on_loss`](PathSet::on_loss)), arrived after all, measured as in `s`: its delay (and
    /// CE mark) count for the path, which matters most for a slow path, whose packets tend to
    /// be declared lost before they arrive. Nothing else changes (the loss stands: a path that
    /// delivers this late is as bad as a lossy one).
    pub fn on_late_copy(&mut self, now: Timestamp, s: &AckSample) {
        let i = usize::from(s.path);
        let cfg = self.cfg;
        let Some(p) = self.paths.get_mut(i) else {
            return;
        };
        if s.sent_at < p.epoch {
            return;
        }
        p.absorb(&cfg, s);
        p.balance(&cfg, self.balance_range_ln, s, self.signal.delay_ns);
        self.mark_fed(i);
        self.dirty = true;
        self.events_since_refresh = self.events_since_refresh.saturating_add(1);
        let _ = now;
    }

    /// A packet sent on `path` at `sent_at` was declared lost at `now`.
    pub fn on_loss(&mut self, now: Timestamp, path: u16, sent_at: Timestamp) {
        let i = usize::from(path);
        let gain = self.cfg.loss_gain;
        let Some(p) = self.paths.get_mut(i) else {
            return;
        };
        p.in_flight = p.in_flight.saturating_sub(1);
        if sent_at < p.epoch {
            return;
        }
        self.next_round(i, now, sent_at);
        self.mark_fed(i);
        let p = &mut self.paths[i];
        p.loss_rate += gain * (1.0 - p.loss_rate);
        p.outcomes = p.outcomes.saturating_add(1);
        p.round.lost += 1;
    }

    /// The traffic share of each path (summing to 1), recomputed if anything changed.
    pub fn weights(&mut self) -> &[f64] {
        self.settle();
        &self.shares
    }

    /// Whether feedback came since the weights were last computed.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Recomputes the weights if feedback came since they were last computed, as
    /// [`weights`](PathSet::weights) does, without reading them: for a caller with time to
    /// spare, so that the next [`pick`](PathSet::pick) or
    /// [`cc_delay_ns`](PathSet::cc_delay_ns) finds them fresh. Returns whether it did.
    pub fn settle(&mut self) -> bool {
        let was = self.dirty;
        if was {
            self.refresh();
        }
        was
    }

    /// The traffic shares as last computed, without refreshing them (for statistics from
    /// `&self`; [`weights`](PathSet::weights) gives the up-to-date values).
    pub fn last_weights(&self) -> &[f64] {
        &self.shares
    }

    /// Chooses a path with probability equal to its share, from a random number the caller
    /// drew (uniform over `u32`). The same state and number give the same path.
    pub fn pick(&mut self, rng_u32: u32) -> u16 {
        self.maybe_refresh();
        let total = self.cum.last().copied().unwrap_or(1);
        let x = (u64::from(rng_u32) * total) >> 32;
        self.index_at(x)
    }

    /// Chooses the next path of a low-discrepancy sequence over the shares: the `k`-th call
    /// picks as [`pick`](PathSet::pick) would for `x0 + k × 2^32/φ (mod 2^32)` (a Weyl
    /// sequence on the golden ratio), `x0` being the caller's random number at the first
    /// call (later ones are ignored: the caller may draw one every time, which keeps its
    /// generator's stream the same whichever choice it uses).
    ///
    /// Over any `n` consecutive calls with unchanged shares, each path's count stays within a
    /// few packets of `n × share`, where independent draws stray by about `√(n × share)`.
    /// That matters on a saturated link: the queue of an uplink that a connection's paths
    /// feed follows the running sum of those deviations, so with independent draws it walks
    /// like a random walk and every excursion to empty is capacity lost for good, while the
    /// sequence keeps it within a bounded band (see `docs/design-notes.md`, "Spreading, not
    /// drawing").
    pub fn pick_spread(&mut self, rng_u32: u32) -> u16 {
        let x = match self.spread {
            Some(prev) => prev.wrapping_add(GOLDEN_U32),
            None => rng_u32,
        };
        self.spread = Some(x);
        self.pick(x)
    }

    /// Like [`pick`](PathSet::pick), but never `avoid` when there is another path: for a
    /// retransmission, which should not follow the packet that was lost.
    pub fn pick_other(&mut self, avoid: u16, rng_u32: u32) -> u16 {
        let a = usize::from(avoid);
        if self.paths.len() < 2 || a >= self.paths.len() {
            return self.pick(rng_u32);
        }
        self.maybe_refresh();
        let total = self.cum.last().copied().unwrap_or(1);
        let end = self.cum[a];
        let q = end - if a == 0 { 0 } else { self.cum[a - 1] };
        let mut x = (u64::from(rng_u32) * (total - q)) >> 32;
        if x >= end - q {
            x += q;
        }
        self.index_at(x)
    }

    /// The next path due for re-pathing, if any: the engine gives it a fresh random source
    /// port. Its statistics restart, and feedback for packets sent on it before this call
    /// (on the old port) is ignored from now on.
    pub fn take_repath(&mut self) -> Option<u16> {
        while let Some(i) = self.repath_queue.pop_front() {
            let p = &mut self.paths[usize::from(i)];
            if !p.repath_pending {
                continue;
            }
            *p = Path {
                in_flight: p.in_flight,
                last_sent: p.last_sent,
                epoch: p.last_sent.add_nanos(1),
                repaths: p.repaths.saturating_add(1),
                ..Path::default()
            };
            self.mark_fed(usize::from(i));
            self.dirty = true;
            self.events_since_refresh = u32::MAX;
            return Some(i);
        }
        None
    }

    /// Forgets every queued re-path without resetting anything: for an engine with no other
    /// source port to give (every port already in use by a path), where a path that cannot
    /// move must keep its statistics, since they still describe the route it stays on.
    /// Resetting them would make a bad path look new, and so healthy, at each request.
    pub fn drop_repaths(&mut self) {
        for i in self.repath_queue.drain(..) {
            if let Some(p) = self.paths.get_mut(usize::from(i)) {
                p.repath_pending = false;
            }
        }
    }

    /// Queues `path` for re-pathing now, whatever its rounds say (for instance when a
    /// retransmit timeout suggests it black-holes packets).
    pub fn request_repath(&mut self, path: u16) {
        if let Some(p) = self.paths.get_mut(usize::from(path))
            && !p.repath_pending
        {
            p.repath_pending = true;
            p.congested_rounds = 0;
            self.repath_queue.push_back(path);
        }
    }

    /// The connection-wide signal: share-weighted medians of the per-path values.
    pub fn connection_signal(&mut self) -> ConnectionSignal {
        if self.dirty {
            self.refresh();
        }
        self.signal
    }

    /// Whether `path` is doing markedly worse than the connection as a whole (delay above
    /// `outlier_delay_ratio` × the median, or ECN fraction or loss rate above the median by
    /// their margins), with at least `min_samples` samples behind the verdict. The engine
    /// should not pass ECN and loss events from outlier paths to the controller.
    pub fn is_outlier(&mut self, path: u16) -> bool {
        self.maybe_refresh();
        self.outlier(path)
    }

    /// [`is_outlier`](PathSet::is_outlier) against the signal as last refreshed.
    fn outlier(&self, path: u16) -> bool {
        self.delay_outlier(path) || {
            let Some(p) = self.paths.get(usize::from(path)) else {
                return false;
            };
            let c = &self.cfg;
            let ecn = p.ecn_samples >= c.min_samples
                && p.ecn_frac > self.signal.ecn_frac + c.outlier_ecn_margin;
            let loss = p.outcomes >= c.min_samples
                && p.loss_rate > self.signal.loss_rate + c.outlier_loss_margin;
            ecn || loss
        }
    }

    /// The delay sample the connection's controller should see for a raw sample `raw_ns`
    /// measured on `path` at `now` (call it once per ACK, with `now` never decreasing):
    ///
    /// 1. `raw_ns`, or `min(raw_ns, median path delay)` if the path's smoothed delay makes it
    ///    an outlier;
    /// 2. with more than one path, the median of that value and those of the previous calls
    ///    within the last `raw_ns` nanoseconds (the round trip this sample measured), at most
    ///    [`RECENT_DELAYS`] of them. Sprayed packets of one round trip cross different queues;
    ///    the connection's window should follow the delay most of them see, not the deepest
    ///    queue any one of them crossed (see the [module docs](self)).
    pub fn cc_delay_ns(&mut self, now: Timestamp, path: u16, raw_ns: u64) -> u64 {
        self.maybe_refresh();
        let d = match self.signal.delay_ns {
            Some(median) if self.delay_outlier(path) => raw_ns.min(median),
            _ => raw_ns,
        };
        if self.paths.len() < 2 {
            return d;
        }
        let at = now.as_nanos();
        self.recent[self.recent_pos] = (at, d);
        self.recent_pos = (self.recent_pos + 1) % RECENT_DELAYS;
        self.recent_len = (self.recent_len + 1).min(RECENT_DELAYS);
        // Newest first, back to one round trip ago (the newest is `d` itself, so `n ≥ 1`).
        let mut window = [0u64; RECENT_DELAYS];
        let mut n = 0;
        for k in 1..=self.recent_len {
            let (t, x) = self.recent[(self.recent_pos + RECENT_DELAYS - k) % RECENT_DELAYS];
            if at.saturating_sub(t) > d {
                break;
            }
            window[n] = x;
            n += 1;
        }
        let window = &mut window[..n.max(1)];
        let mid = window.len() / 2;
        *window.select_nth_unstable(mid).1
    }

    fn delay_outlier(&self, path: u16) -> bool {
        let Some(p) = self.paths.get(usize::from(path)) else {
            return false;
        };
        p.delay_samples >= self.cfg.min_samples
            && self
                .signal
                .delay_ns
                .is_some_and(|m| p.delay_ns > self.cfg.outlier_delay_ratio * m as f64)
    }

    /// The path owning `x` (`x < total`): the first `i` with `cum[i] > x`.
    fn index_at(&self, x: u64) -> u16 {
        let last = self.paths.len() - 1;
        if self.guide.is_empty() {
            // `cum` strictly increases (every share counts at least 1).
            let i = self.cum.partition_point(|&c| c <= x).min(last);
            // `i ≤ last < MAX_PATHS`, which fits in u16.
            return u16::try_from(i).unwrap_or(0);
        }
        let total = self.cum.last().copied().unwrap_or(1).max(1);
        let g = self.guide.len() as u64;
        // `guide[j]` owns `j × total / g ≤ x`, so the answer is at or after it.
        let j = (x * g / total).min(g - 1) as usize;
        let mut i = usize::from(self.guide[j]);
        while i < last && self.cum[i] <= x {
            i += 1;
        }
        // `i ≤ last < MAX_PATHS`, which fits in u16.
        u16::try_from(i).unwrap_or(0)
    }

    fn rebuild_guide(&mut self) {
        if self.guide.is_empty() {
            return;
        }
        let total = self.cum.last().copied().unwrap_or(1).max(1);
        // The guide's length is a power of two: a shift, not a division per slot (refresh
        // runs at every feedback on up to 16 paths, and the divisions were a fifth of it).
        debug_assert!(self.guide.len().is_power_of_two());
        let shift = self.guide.len().trailing_zeros();
        let mut i = 0;
        for (j, slot) in self.guide.iter_mut().enumerate() {
            let x = (j as u64 * total) >> shift;
            while i + 1 < self.cum.len() && self.cum[i] <= x {
                i += 1;
            }
            // `i < len ≤ MAX_PATHS`.
            *slot = u16::try_from(i).unwrap_or(0);
        }
    }

    /// Called before feedback is counted: ends the path's round if the feedback is for a
    /// packet sent after the round began (that feedback then opens the next round).
    fn next_round(&mut self, i: usize, now: Timestamp, sent_at: Timestamp) {
        self.dirty = true;
        self.events_since_refresh = self.events_since_refresh.saturating_add(1);
        let p = &mut self.paths[i];
        let Some(start) = p.round.start else {
            p.round.start = Some(now);
            return;
        };
        if sent_at < start {
            return;
        }
        // The round ends (most feedback does not get here: it is for packets sent before the
        // round began). Only a path congested beyond the others is worth moving: congestion
        // the paths share (the receiver's link, or every link busy with this connection's own
        // window) would follow it to any port, and a move resets what is known about it.
        let delay_target = self.delay_target_ns.map(|t| t as f64).or_else(|| {
            self.min_delay_ns
                .map(|m| m as f64 * self.cfg.plb_delay_factor)
        });
        let cfg = self.cfg;
        // `i < len ≤ MAX_PATHS`.
        let outlier = self.outlier(u16::try_from(i).unwrap_or(0));
        let p = &mut self.paths[i];
        let congested = p.round.congested(&cfg, delay_target) && outlier;
        p.round = Round {
            start: Some(now),
            ..Round::default()
        };
        if !congested {
            p.congested_rounds = 0;
            return;
        }
        p.congested_rounds += 1;
        if p.congested_rounds >= cfg.plb_rounds.max(1) {
            p.congested_rounds = 0;
            if !p.repath_pending {
                p.repath_pending = true;
                // `i < len ≤ MAX_PATHS`.
                self.repath_queue.push_back(u16::try_from(i).unwrap_or(0));
            }
        }
    }

    /// Path `i` was fed: its health and its places in the medians' orders are out of date.
    fn mark_fed(&mut self, i: usize) {
        if let Some(s) = self.stale.get_mut(i)
            && !std::mem::replace(s, true)
        {
            self.fed += 1;
        }
    }

    fn maybe_refresh(&mut self) {
        if self.dirty && self.events_since_refresh >= self.refresh_every {
            self.refresh();
        }
    }

    fn refresh(&mut self) {
        let c = self.cfg;
        let n = self.paths.len() as f64;
        // One pass for whether each median's values are all equal (usually so for ECN and
        // loss: no marks, no losses; for the delay when every path measured the same), which
        // spares those medians their order.
        let mut uniform = [Uniform::default(); 3];
        for p in &self.paths {
            uniform[MEDIAN_DELAY].see(delay_of(p));
            uniform[MEDIAN_ECN].see(ecn_of(p));
            uniform[MEDIAN_LOSS].see(loss_of(p));
        }
        for (k, u) in uniform.iter().enumerate() {
            // An order skipped now misses this refresh's changes.
            self.ranked[k] &= !u.same;
        }
        // The lowest delay: the one value, or the first of the delays' order (what `f64::min`
        // over them gives, as delays are never NaN or -0).
        let dmin = if uniform[MEDIAN_DELAY].same {
            uniform[MEDIAN_DELAY]
                .first
                .map_or(f64::INFINITY, f64::from_bits)
        } else {
            self.order(MEDIAN_DELAY, delay_of);
            self.ranks[MEDIAN_DELAY]
                .first()
                .and_then(|&key| rank_value(key))
                .unwrap_or(f64::INFINITY)
        };
        debug_assert_eq!(
            dmin.to_bits(),
            (self.paths.iter().filter_map(delay_of))
                .fold(f64::INFINITY, f64::min)
                .to_bits()
        );
        let ecn_median = self.signal.ecn_frac;
        let inputs = (dmin.to_bits(), ecn_median.to_bits());
        let all = inputs != self.health_inputs;
        self.health_inputs = inputs;
        let mut sum = 0.0;
        for ((p, h), stale) in self
            .paths
            .iter()
            .zip(self.health.iter_mut())
            .zip(self.stale.iter_mut())
        {
            if all || *stale {
                *h = p.health(&c, dmin, ecn_median);
            }
            sum += *h;
        }
        debug_assert!(
            self.paths
                .iter()
                .zip(&self.health)
                .all(|(p, h)| p.health(&c, dmin, ecn_median).to_bits() == h.to_bits()),
            "a path's health changed without it being marked stale"
        );
        let mut acc = 0u64;
        for ((s, cum), &h) in self
            .shares
            .iter_mut()
            .zip(self.cum.iter_mut())
            .zip(&self.health)
        {
            let health = if sum > 0.0 { h / sum } else { 1.0 / n };
            *s = c.probe_floor / n + (1.0 - c.probe_floor) * health;
            acc += round_share(*s * SHARE_SCALE).max(1);
            *cum = acc;
        }
        self.rebuild_guide();
        self.signal = ConnectionSignal {
            delay_ns: if uniform[MEDIAN_DELAY].same {
                uniform[MEDIAN_DELAY].first.map(f64::from_bits)
            } else {
                // Ordered above.
                self.ordered_median(MEDIAN_DELAY)
            }
            .map(|d| d as u64),
            ecn_frac: self
                .median(MEDIAN_ECN, uniform[MEDIAN_ECN], ecn_of)
                .unwrap_or(0.0),
            loss_rate: self
                .median(MEDIAN_LOSS, uniform[MEDIAN_LOSS], loss_of)
                .unwrap_or(0.0),
            min_delay_ns: self.min_delay_ns,
        };
        // Kept until now: the medians' orders place the paths fed since the last refresh.
        self.stale.fill(false);
        self.fed = 0;
        self.dirty = false;
        self.events_since_refresh = 0;
    }

    /// Share-weighted median of `value` over the paths that have one, `k` naming which
    /// (`MEDIAN_DELAY`, `MEDIAN_ECN`, `MEDIAN_LOSS`): the first value, in ascending order,
    /// at which the shares summed in that order reach half their total. `uniform` says
    /// whether the values are all equal (the refresh's pass over the paths): then the median
    /// is that value, with no order needed.
    fn median(
        &mut self,
        k: usize,
        uniform: Uniform,
        value: impl Fn(&Path) -> Option<f64>,
    ) -> Option<f64> {
        if uniform.same {
            return uniform.first.map(f64::from_bits);
        }
        self.order(k, value);
        self.ordered_median(k)
    }

    /// Brings the order of median `k`'s values (`orders[k]`: the path indices sorted by
    /// value, then index) and their packed keys (`ranks[k]`, see [`rank_key`]) up to date.
    ///
    /// The order is kept from one refresh to the next. When it is complete (`ranked[k]`)
    /// and at most [`PLACED_ALONE_MAX`] paths were fed since the last refresh (`stale`),
    /// only those have new keys, and each is moved from its old place to its new one: where
    /// one ACK feeds one path per refresh, building every key afresh was most of a refresh.
    /// Keys are unique (they end in the path index), so the order is the one a sort gives
    /// and the medians are the same to the bit. Otherwise every key is built again and
    /// sorted by insertion from the previous order (paths move by little between
    /// refreshes).
    fn order(&mut self, k: usize, value: impl Fn(&Path) -> Option<f64>) {
        let PathSet {
            paths,
            orders,
            ranks,
            ranked,
            stale,
            fed,
            ..
        } = self;
        let order = &mut orders[k];
        let keys = &mut ranks[k];
        if ranked[k] && keys.len() == paths.len() && *fed <= PLACED_ALONE_MAX {
            for (i, _) in stale.iter().enumerate().filter(|(_, s)| **s) {
                // `i < len ≤ MAX_PATHS`, which fits in u16.
                let index = u16::try_from(i).unwrap_or(0);
                let key = rank_key(value(&paths[i]), index);
                let Some(mut m) = order.iter().position(|&o| o == index) else {
                    continue;
                };
                while m > 0 && key < keys[m - 1] {
                    keys[m] = keys[m - 1];
                    order[m] = order[m - 1];
                    m -= 1;
                }
                while m + 1 < keys.len() && keys[m + 1] < key {
                    keys[m] = keys[m + 1];
                    order[m] = order[m + 1];
                    m += 1;
                }
                keys[m] = key;
                order[m] = index;
            }
        } else {
            keys.clear();
            keys.extend(
                order
                    .iter()
                    .map(|&i| rank_key(value(&paths[usize::from(i)]), i)),
            );
            for j in 1..keys.len() {
                let x = keys[j];
                let mut m = j;
                while m > 0 && x < keys[m - 1] {
                    keys[m] = keys[m - 1];
                    m -= 1;
                }
                keys[m] = x;
            }
            for (o, &key) in order.iter_mut().zip(keys.iter()) {
                *o = rank_index(key);
            }
            ranked[k] = true;
        }
        debug_assert!(
            keys.windows(2).all(|w| w[0] < w[1])
                && keys.iter().all(|&key| {
                    let i = rank_index(key);
                    key == rank_key(value(&paths[usize::from(i)]), i)
                }),
            "median {k}: the kept order is not the order of the current values"
        );
    }

    /// [`median`](Self::median) over the keys `order` left in `ranks[k]`, with the current
    /// shares.
    fn ordered_median(&self, k: usize) -> Option<f64> {
        let valued = || {
            self.ranks[k].iter().map_while(|&key| {
                rank_value(key).map(|v| (v, self.shares[usize::from(rank_index(key))]))
            })
        };
        let half = valued().map(|e| e.1).sum::<f64>() / 2.0;
        let mut acc = 0.0;
        let mut last = None;
        for (v, w) in valued() {
            acc += w;
            if acc >= half {
                return Some(v);
            }
            last = Some(v);
        }
        last
    }
}

/// The key path `i` with median value `v` sorts by: the values in [`total_order_key`] order,
/// then the paths without one, each group by index, as one integer (bits 0-15 the index,
/// 16-79 the order key with its sign bit flipped, 80 set for "no value").
fn rank_key(v: Option<f64>, i: u16) -> u128 {
    match v {
        Some(v) => u128::from(total_order_key(v) as u64 ^ (1 << 63)) << 16 | u128::from(i),
        None => 1 << 80 | u128::from(i),
    }
}

/// The value of a [`rank_key`], `None` for a path without one.
fn rank_value(key: u128) -> Option<f64> {
    (key >> 80 == 0).then(|| from_total_order_key(((key >> 16) as u64 ^ (1 << 63)) as i64))
}

/// The path index of a [`rank_key`].
fn rank_index(key: u128) -> u16 {
    key as u16
}

/// A path's delay, ECN fraction and loss rate, where it has measured one (the values of the
/// three medians).
fn delay_of(p: &Path) -> Option<f64> {
    (p.delay_samples > 0).then_some(p.delay_ns)
}
fn ecn_of(p: &Path) -> Option<f64> {
    (p.ecn_samples > 0).then_some(p.ecn_frac)
}
fn loss_of(p: &Path) -> Option<f64> {
    (p.outcomes > 0).then_some(p.loss_rate)
}

/// Whether the values seen so far are all equal (under `total_cmp`, which is equal bits),
/// and the first of them.
#[derive(Debug, Clone, Copy)]
struct Uniform {
    first: Option<u64>,
    same: bool,
}

impl Default for Uniform {
    fn default() -> Self {
        Uniform {
            first: None,
            same: true,
        }
    }
}

impl Uniform {
    fn see(&mut self, v: Option<f64>) {
        if let Some(v) = v {
            let b = v.to_bits();
            match self.first {
                None => self.first = Some(b),
                Some(f) => self.same &= f == b,
            }
        }
    }
}

/// The smallest path set whose choices go through [`PathSet::guide`]. Every refresh rebuilds
/// the guide: with 16 paths a refresh costs a fifth less without it (callgrind on the `paths`
/// bench), and a binary search over 16 cumulative shares is four steps; with hundreds of
/// paths the guide spares a choice the search's cache misses.
const GUIDE_MIN_PATHS: usize = 64;

/// Most paths fed between two refreshes for which a median's kept order moves each of them
/// to its new place; with more, it is built again. A refresh every two feedback events (up
/// to 32 paths) feeds one or two; with hundreds of paths a refresh comes every 16 feedback
/// events, and the moves then cost more than a new order (measured with callgrind on
/// `braid-fabric`).
const PLACED_ALONE_MAX: usize = 2;

/// [`PathSet::orders`] of the delay, ECN and loss medians.
const MEDIAN_DELAY: usize = 0;
const MEDIAN_ECN: usize = 1;
const MEDIAN_LOSS: usize = 2;

/// An integer that orders as `f64::total_cmp` orders `v` (the transform it uses: negative
/// values get their magnitude bits flipped).
fn total_order_key(v: f64) -> i64 {
    let bits = v.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// The value whose [`total_order_key`] is `key` (the transform is its own inverse).
fn from_total_order_key(key: i64) -> f64 {
    f64::from_bits((key ^ (((key >> 63) as u64) >> 1) as i64) as u64)
}

/// `x.round() as u64` for a share scaled to integers (`x` is finite, at least 0 and below
/// 2^52), without `round`'s library call (once per path at every refresh): the truncation
/// is exact, so is `x` less it, and a fraction of one half or more rounds up, as `round`
/// does away from zero.
fn round_share(x: f64) -> u64 {
    // Through i64: one conversion instruction each way (u64's need a branch for 2^63 up).
    let t = x as i64;
    let r = if x - t as f64 >= 0.5 { t + 1 } else { t };
    r.max(0) as u64
}

/// One path's state. A refresh reads what the medians and the health need of every path,
/// so those fields come first, in one cache line per path (`repr(C)` keeps the order; with
/// 256 paths the refresh's misses were most of the simulator's on the path set when they
/// sat in two lines).
#[derive(Debug, Clone, Default)]
#[repr(C, align(64))]
struct Path {
    delay_ns: f64,
    ecn_frac: f64,
    loss_rate: f64,
    /// Natural log of the balance factor (see [`PathConfig::balance_gain`]).
    balance_log: f64,
    delay_samples: u32,
    ecn_samples: u32,
    outcomes: u32,
    in_flight: u32,
    last_sent: Timestamp,
    /// Feedback for packets sent before this is ignored (they left on the previous port).
    epoch: Timestamp,
    round: Round,
    congested_rounds: u32,
    repath_pending: bool,
    repaths: u32,
}

impl Path {
    /// The path's health: its share before normalising, from its delay above the lowest
    /// (`dmin`), its ECN fraction above the median, its loss rate and its balance term.
    fn health(&self, c: &PathConfig, dmin: f64, ecn_median: f64) -> f64 {
        let excess = if self.delay_samples > 0 && dmin > 0.0 && dmin.is_finite() {
            (self.delay_ns / dmin - 1.0 - c.delay_tolerance).max(0.0)
        } else {
            0.0
        };
        // Marks above the connection's median: marks every path sees are the controller's
        // business, and an ACK's CE report covers every packet since the previous ACK, so
        // some of one path's marks land on the paths whose packets the ACKs echo.
        let ecn = (self.ecn_frac - ecn_median - c.ecn_tolerance).max(0.0);
        // A path marked more than the median is not fast, whatever its delay (a marking
        // AQM keeps its queue short): the balance term may only take share from it.
        let balance = if ecn > 0.0 {
            self.balance_log.min(0.0)
        } else {
            self.balance_log
        };
        let h =
            balance.exp() / (1.0 + c.k_delay * excess + c.k_ecn * ecn + c.k_loss * self.loss_rate);
        if h.is_finite() && h > 0.0 { h } else { 0.0 }
    }

    /// Moves the balance factor by one delay sample against the connection's median delay
    /// (`range`: the logarithm of `cfg.balance_range`, the most it may move either way).
    fn balance(&mut self, cfg: &PathConfig, range: f64, s: &AckSample, median_ns: Option<u64>) {
        let (Some(d), Some(m)) = (s.delay_ns(), median_ns) else {
            return;
        };
        if d == 0 || m == 0 || cfg.balance_gain <= 0.0 {
            return;
        }
        let x = (m as f64 / d as f64).ln();
        if x.is_finite() {
            self.balance_log = flush_tiny(
                self.balance_log + cfg.balance_gain * (x.clamp(-range, range) - self.balance_log),
            );
        }
    }

    /// Takes in the delay and CE mark one acknowledged (or late) packet measured.
    fn absorb(&mut self, cfg: &PathConfig, s: &AckSample) {
        if let Some(d) = s.delay_ns() {
            let d = d as f64;
            self.delay_ns = if self.delay_samples == 0 {
                d
            } else {
                self.delay_ns + cfg.delay_gain * (d - self.delay_ns)
            };
            self.delay_samples = self.delay_samples.saturating_add(1);
            self.round.delay_sum += d;
            self.round.delay_n += 1;
        }
        if let Some(ce) = s.ecn_ce {
            let x = if ce { 1.0 } else { 0.0 };
            self.ecn_frac = flush_tiny(self.ecn_frac + cfg.ecn_gain * (x - self.ecn_frac));
            self.ecn_samples = self.ecn_samples.saturating_add(1);
            self.round.ecn_known += 1;
            self.round.marked += u32::from(ce);
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Round {
    start: Option<Timestamp>,
    acked: u32,
    lost: u32,
    ecn_known: u32,
    marked: u32,
    delay_sum: f64,
    delay_n: u32,
}

impl Round {
    fn congested(&self, cfg: &PathConfig, delay_target_ns: Option<f64>) -> bool {
        let total = self.acked + self.lost;
        if total == 0 {
            return false;
        }
        let ecn = self.ecn_known > 0
            && f64::from(self.marked) >= cfg.plb_ecn_threshold * f64::from(self.ecn_known);
        let loss =
            self.lost > 0 && f64::from(self.lost) > cfg.plb_loss_threshold * f64::from(total);
        let delay = self.delay_n > 0
            && delay_target_ns.is_some_and(|t| self.delay_sum / f64::from(self.delay_n) > t);
        ecn || loss || delay
    }
}

/// `x`, or 0 where its magnitude is below [`TINY`]: for the averages that decay toward zero
/// (a loss rate after its last loss, an ECN fraction after its last mark, a balance term at
/// the median delay). Left alone they decay into subnormal numbers and stay there (a tenth
/// of the smallest one rounds to nothing), and on x86 each operation on a subnormal takes a
/// microcode assist of a hundred cycles or more, at every acknowledged packet: `perf` on a
/// 1 MiB WRITE over a veth pair put 77 % of `on_ack`'s samples on the loss rate's one
/// subtraction.
fn flush_tiny(x: f64) -> f64 {
    if x.abs() < TINY { 0.0 } else { x }
}

/// Where [`flush_tiny`] takes an average for zero: far below any rate, fraction or log
/// ratio that could change a share (a loss rate falls from one loss's 1/16 to it in about
/// 400 acknowledged packets on that path), far above the subnormal range (below 2.2e-308).
const TINY: f64 = 1e-12;

fn finite_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() { x } else { fallback }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The share-weighted median as a stable sort of the path-ordered values computes it:
    /// the reference `PathSet::median` must equal to the bit.
    fn median_by_sort(set: &PathSet, value: impl Fn(&Path) -> Option<f64>) -> Option<f64> {
        let mut v: Vec<(f64, f64)> = set
            .paths
            .iter()
            .zip(&set.shares)
            .filter_map(|(p, &w)| value(p).map(|x| (x, w)))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let half = v.iter().map(|e| e.1).sum::<f64>() / 2.0;
        let mut acc = 0.0;
        for &(x, w) in &v {
            acc += w;
            if acc >= half {
                return Some(x);
            }
        }
        v.last().map(|e| e.0)
    }

    #[test]
    fn rank_keys_sort_as_value_then_index_with_the_valueless_last() {
        let values = [
            None,
            Some(-1.5),
            Some(-0.0),
            Some(0.0),
            Some(1e-300),
            Some(8_000.0),
            Some(f64::INFINITY),
            Some(f64::NAN),
        ];
        let tuple = |v: Option<f64>, i: u16| match v {
            Some(v) => (false, total_order_key(v), i),
            None => (true, 0, i),
        };
        for &a in &values {
            for &b in &values {
                for (i, j) in [(0u16, 1u16), (1, 0), (7, 7), (255, 3)] {
                    assert_eq!(
                        rank_key(a, i).cmp(&rank_key(b, j)),
                        tuple(a, i).cmp(&tuple(b, j)),
                        "{a:?}/{i} against {b:?}/{j}"
                    );
                }
            }
            let key = rank_key(a, 42);
            assert_eq!(rank_value(key).map(f64::to_bits), a.map(f64::to_bits));
            assert_eq!(rank_index(key), 42);
        }
    }

    #[test]
    fn median_order_kept_between_refreshes_equals_a_fresh_sort() {
        let mut rng = Lcg(7);
        for n in [1u16, 2, 3, 16, 255] {
            let mut set = PathSet::new(n);
            for round in 0..300 {
                // Move a few paths per round, by little or by much, with ties, paths
                // without a value, signed zeros and unequal shares.
                for _ in 0..rng.next() % 6 {
                    let i = (rng.next() % u32::from(n)) as usize;
                    let p = &mut set.paths[i];
                    p.delay_samples = u32::from(!rng.next().is_multiple_of(8));
                    p.delay_ns = match rng.next() % 16 {
                        0 => 10_000.0,
                        1 => -0.0,
                        2 => 0.0,
                        3..=5 => p.delay_ns * 1.01,
                        6..=8 => p.delay_ns * 0.99,
                        _ => f64::from(rng.next() % 100_000),
                    };
                    set.shares[i] = f64::from(rng.next() % 1000 + 1) / 1000.0;
                    // As the feedback calls do: the kept order places the paths fed.
                    set.mark_fed(i);
                }
                let value = |p: &Path| (p.delay_samples > 0).then_some(p.delay_ns);
                let want = median_by_sort(&set, value);
                let mut uniform = Uniform::default();
                for p in &set.paths {
                    uniform.see(value(p));
                }
                let got = set.median(MEDIAN_DELAY, uniform, value);
                assert_eq!(
                    got.map(f64::to_bits),
                    want.map(f64::to_bits),
                    "{n} paths, round {round}"
                );
                // `order` then `ordered_median` (the refresh's way for the delay) agree with
                // it, also when the values are all equal.
                set.order(MEDIAN_DELAY, value);
                let ordered = set.ordered_median(MEDIAN_DELAY);
                assert_eq!(ordered.map(f64::to_bits), want.map(f64::to_bits));
                set.stale.fill(false);
                set.fed = 0;
            }
        }
    }

    fn us(x: u64) -> Timestamp {
        Timestamp::from_micros(x)
    }

    /// A simple deterministic generator for the caller-side random numbers (64-bit LCG,
    /// Knuth's MMIX constants; the high half is returned).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 32) as u32
        }
    }

    fn sample(path: u16, sent_at: Timestamp, delay_us: Option<u64>, ce: Option<bool>) -> AckSample {
        let mut s = AckSample::new(sent_at, 1000);
        s.path = path;
        s.fabric_delay_ns = delay_us.map(|d| d * 1000);
        s.ecn_ce = ce;
        s
    }

    /// Feeds `rounds` of `per_path` ACKs to every path; `delay_us(path)` and `ce(path, k)` say
    /// what each sees.
    fn feed(
        ps: &mut PathSet,
        rounds: u64,
        per_path: u64,
        delay_us: impl Fn(u16) -> u64,
        ce: impl Fn(u16, u64) -> bool,
    ) {
        let n = ps.len() as u16;
        for r in 0..rounds {
            for k in 0..per_path {
                for p in 0..n {
                    let t = us(1000 * (r + 1) + k);
                    send(ps, p, t);
                    let s = sample(p, t, Some(delay_us(p)), Some(ce(p, r * per_path + k)));
                    ps.on_ack(t.add_nanos(1), &s);
                }
            }
        }
    }

    /// A packet leaves on `p` at `t`. The engine picks a path for every packet it sends,
    /// which keeps the weights and the connection signal fresh; so does this.
    fn send(ps: &mut PathSet, p: u16, t: Timestamp) {
        let _ = ps.pick(0);
        ps.on_sent(p, t);
    }

    /// `n` rounds, 1 ms apart, in which every path sends one packet and `feedback` answers
    /// it (an ACK or a loss).
    fn rounds(ps: &mut PathSet, n: u64, mut feedback: impl FnMut(&mut PathSet, u16, Timestamp)) {
        for r in 0..n {
            for p in 0..ps.len() as u16 {
                let t = us(1000 * r + u64::from(p));
                send(ps, p, t);
                feedback(ps, p, t);
            }
        }
    }

    fn fair(ps: &PathSet) -> f64 {
        1.0 / ps.len() as f64
    }

    #[test]
    fn weight_moves_off_a_path_with_ten_times_the_delay() {
        let mut ps = PathSet::new(8);
        feed(
            &mut ps,
            10,
            4,
            |p| if p == 0 { 1000 } else { 100 },
            |_, _| false,
        );
        let w = ps.weights().to_vec();
        let f = fair(&ps);
        assert!(w[0] < 0.25 * f, "{w:?}");
        assert!(w[1..].iter().all(|&x| x > f), "{w:?}");
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn weight_moves_off_a_path_with_half_its_packets_marked() {
        let mut ps = PathSet::new(8);
        feed(&mut ps, 25, 4, |_| 100, |p, k| p == 2 && k % 2 == 0);
        let w = ps.weights().to_vec();
        assert!(w[2] < 0.5 * fair(&ps), "{w:?}");
        assert!((ps.stats(2).unwrap().ecn_frac - 0.5).abs() < 0.1);
    }

    #[test]
    fn ecn_tolerance_ignores_a_few_points_of_marks_and_not_half() {
        let tolerant = PathConfig {
            ecn_tolerance: 0.1,
            ..PathConfig::default()
        };
        // One packet in twenty marked on path 2, none elsewhere: within the tolerance the
        // path keeps its share; without it the penalty takes almost half of it.
        let few = |p: u16, k: u64| p == 2 && k.is_multiple_of(20);
        let mut ps = PathSet::with_config(8, tolerant);
        feed(&mut ps, 25, 4, |_| 100, few);
        let w = ps.weights().to_vec();
        assert!(w[2] > 0.9 * fair(&ps), "{w:?}");
        let mut strict = PathSet::new(8);
        feed(&mut strict, 25, 4, |_| 100, few);
        assert!(
            strict.weights()[2] < 0.6 * fair(&strict),
            "{:?}",
            strict.weights()
        );
        // Half marked is far above the tolerance: the path still loses its traffic.
        let mut ps = PathSet::with_config(8, tolerant);
        feed(&mut ps, 25, 4, |_| 100, |p, k| p == 2 && k % 2 == 0);
        let w = ps.weights().to_vec();
        assert!(w[2] < 0.5 * fair(&ps), "{w:?}");
    }

    #[test]
    fn averages_decaying_toward_zero_reach_zero_and_never_go_subnormal() {
        // One loss, one CE mark and a slow start on path 1, then equal delays and no marks for
        // long enough that a plain exponential decay would sink into subnormal numbers
        // (below 2.2e-308: about 11,000 ACKs at a gain of 1/16).
        let mut ps = PathSet::new(4);
        ps.on_sent(1, us(0));
        ps.on_loss(us(1), 1, us(0));
        let ok = |x: f64| x == 0.0 || x.is_normal();
        for i in 1..=15_000u64 {
            for p in 0..4u16 {
                let t = us(10 * i);
                send(&mut ps, p, t);
                let slow = p == 1 && i <= 10;
                let s = sample(p, t, Some(if slow { 300 } else { 100 }), Some(slow));
                ps.on_ack(t.add_nanos(1), &s);
                let q = &ps.paths[usize::from(p)];
                assert!(
                    ok(q.loss_rate) && ok(q.ecn_frac) && ok(q.balance_log),
                    "path {p} after {i} rounds: {} {} {}",
                    q.loss_rate,
                    q.ecn_frac,
                    q.balance_log
                );
            }
        }
        let q = &ps.paths[1];
        assert_eq!((q.loss_rate, q.ecn_frac, q.balance_log), (0.0, 0.0, 0.0));
        assert!(ps.weights().iter().all(|&w| (w - 0.25).abs() < 1e-12));
    }

    #[test]
    fn weight_moves_off_a_lossy_path() {
        let mut ps = PathSet::new(8);
        for i in 0..400u64 {
            for p in 0..8u16 {
                let t = us(10 * i);
                ps.on_sent(p, t);
                if p == 5 && i % 10 == 0 {
                    ps.on_loss(t.add_nanos(1), p, t);
                } else {
                    ps.on_ack(t.add_nanos(1), &sample(p, t, Some(100), None));
                }
            }
        }
        let w = ps.weights().to_vec();
        assert!(w[5] < 0.5 * fair(&ps), "{w:?}");
    }

    #[test]
    fn every_path_keeps_the_probe_floor() {
        let mut ps = PathSet::new(8);
        for i in 0..200u64 {
            let t = us(10 * i);
            for p in 0..4u16 {
                ps.on_sent(p, t);
                ps.on_loss(t.add_nanos(1), p, t);
                ps.on_ack(t.add_nanos(2), &sample(p, t, Some(100_000), Some(true)));
            }
            for p in 4..8u16 {
                ps.on_ack(t.add_nanos(2), &sample(p, t, Some(10), Some(false)));
            }
        }
        let floor = 0.1 / 8.0;
        let w = ps.weights().to_vec();
        assert!(w.iter().all(|&x| x >= floor - 1e-12), "{w:?}");
        assert!(w[..4].iter().all(|&x| x < 1.2 * floor), "{w:?}");
    }

    #[test]
    fn pick_follows_the_weights() {
        let mut ps = PathSet::new(8);
        feed(
            &mut ps,
            20,
            4,
            |p| 100 + 150 * u64::from(p),
            |p, k| p == 7 && k % 4 == 0,
        );
        let shares = ps.weights().to_vec();
        let mut counts = [0u64; 8];
        let mut rng = Lcg(42);
        const PICKS: u64 = 100_000;
        for _ in 0..PICKS {
            counts[usize::from(ps.pick(rng.next()))] += 1;
        }
        // Chi-square with 7 degrees of freedom; 30 is far in the tail (p < 1e-4).
        let chi2: f64 = counts
            .iter()
            .zip(&shares)
            .map(|(&o, &s)| {
                let e = s * PICKS as f64;
                (o as f64 - e).powi(2) / e
            })
            .sum();
        assert!(
            chi2 < 30.0,
            "chi2 {chi2}, counts {counts:?}, shares {shares:?}"
        );
        // And the weights really differ, so the test means something.
        assert!(shares[0] > 2.0 * shares[7]);
    }

    /// The largest excursion, over `picks` choices, of any link's running count from its
    /// expected share, when the 256 paths hash onto 8 links as `link_of` says.
    fn worst_link_excursion(
        ps: &mut PathSet,
        picks: u64,
        mut choose: impl FnMut(&mut PathSet) -> u16,
    ) -> f64 {
        let link_of = |p: u16| (u32::from(p).wrapping_mul(0x2545_F491) >> 7) as usize % 8;
        let shares = ps.weights().to_vec();
        let mut link_share = [0.0; 8];
        for (p, s) in shares.iter().enumerate() {
            link_share[link_of(p as u16)] += s;
        }
        let mut count = [0u64; 8];
        let mut worst: f64 = 0.0;
        for k in 1..=picks {
            count[link_of(choose(ps))] += 1;
            for l in 0..8 {
                worst = worst.max((count[l] as f64 - k as f64 * link_share[l]).abs());
            }
        }
        worst
    }

    /// A saturated link's queue follows the running difference between what the
    /// connection's paths put on it and its share: with the spread sequence it stays within
    /// a band of about 16 packets however long it runs, with independent draws it wanders
    /// by the hundreds (a random walk).
    #[test]
    fn spread_choice_keeps_every_link_near_its_share() {
        const PICKS: u64 = 200_000;
        let mut rng = Lcg(3);
        let mut ps = PathSet::new(256);
        let spread = worst_link_excursion(&mut ps, PICKS, |ps| ps.pick_spread(rng.next()));
        // Bounded: the same after a tenth of the choices (a random walk grows as √n).
        let mut ps = PathSet::new(256);
        let early = worst_link_excursion(&mut ps, PICKS / 10, |ps| ps.pick_spread(rng.next()));
        let mut ps = PathSet::new(256);
        let drawn = worst_link_excursion(&mut ps, PICKS, |ps| ps.pick(rng.next()));
        assert!(spread < 24.0, "spread excursion {spread}");
        assert!(
            spread < 1.5 * early,
            "spread {spread} vs {early} after a tenth"
        );
        assert!(drawn > 10.0 * spread, "drawn {drawn} vs spread {spread}");
    }

    /// The spread choice follows uneven weights as closely as the drawn one, and is the
    /// same sequence for the same seed whatever later numbers the caller passes.
    #[test]
    fn spread_choice_follows_the_weights_and_only_the_first_number_seeds_it() {
        let mut ps = PathSet::new(8);
        feed(
            &mut ps,
            20,
            4,
            |p| 100 + 150 * u64::from(p),
            |p, k| p == 7 && k % 4 == 0,
        );
        let shares = ps.weights().to_vec();
        assert!(shares[0] > 2.0 * shares[7]);
        let mut other = ps.clone();
        let mut counts = [0u64; 8];
        const PICKS: u64 = 10_000;
        let mut rng = Lcg(9);
        for k in 0..PICKS {
            let r = rng.next();
            let p = ps.pick_spread(r);
            assert_eq!(
                p,
                other.pick_spread(if k == 0 { r } else { 12345 }),
                "pick {k}"
            );
            counts[usize::from(p)] += 1;
        }
        for (c, s) in counts.iter().zip(&shares) {
            let expect = s * PICKS as f64;
            assert!((*c as f64 - expect).abs() < 3.0, "{counts:?} vs {shares:?}");
        }
    }

    /// The guided choice gives exactly the path a binary search over the cumulative shares
    /// would, for uneven shares and every set size.
    #[test]
    fn guided_choice_matches_a_binary_search() {
        let mut rng = Lcg(7);
        for n in [1u16, 2, 3, 7, 16, 100, 256] {
            let mut ps = PathSet::new(n);
            for round in 0..20u64 {
                for p in 0..n {
                    let t = us(1000 * (round + 1) + u64::from(p));
                    ps.on_sent(p, t);
                    let d = 100 + u64::from(rng.next() % 2000);
                    let ce = rng.next().is_multiple_of(7);
                    ps.on_ack(t.add_nanos(1), &sample(p, t, Some(d), Some(ce)));
                }
                let _ = ps.weights();
                let total = *ps.cum.last().unwrap();
                for _ in 0..500 {
                    let x = (u64::from(rng.next()) * total) >> 32;
                    let expect = ps.cum.partition_point(|&c| c <= x).min(usize::from(n) - 1);
                    assert_eq!(usize::from(ps.index_at(x)), expect, "n {n} x {x}");
                }
                for x in [0, total - 1] {
                    let expect = ps.cum.partition_point(|&c| c <= x).min(usize::from(n) - 1);
                    assert_eq!(usize::from(ps.index_at(x)), expect, "n {n} x {x}");
                }
            }
        }
    }

    #[test]
    fn pick_is_deterministic_for_a_given_number() {
        let mut a = PathSet::new(16);
        let mut b = PathSet::new(16);
        let mut rng = Lcg(7);
        for _ in 0..1000 {
            let r = rng.next();
            assert_eq!(a.pick(r), b.pick(r));
        }
        assert_eq!(a.pick(0), 0);
        assert_eq!(a.pick(u32::MAX), 15);
    }

    #[test]
    fn pick_other_never_returns_the_avoided_path() {
        let mut ps = PathSet::new(8);
        feed(&mut ps, 5, 2, |p| 100 + 10 * u64::from(p), |_, _| false);
        let mut rng = Lcg(1);
        let mut seen = [false; 8];
        for i in 0..20_000u32 {
            let avoid = (i % 8) as u16;
            let p = ps.pick_other(avoid, rng.next());
            assert_ne!(p, avoid);
            seen[usize::from(p)] = true;
        }
        assert!(seen.iter().all(|&s| s));
        for avoid in 0..8 {
            assert_ne!(ps.pick_other(avoid, 0), avoid);
            assert_ne!(ps.pick_other(avoid, u32::MAX), avoid);
        }
    }

    #[test]
    fn pick_other_with_one_path_returns_it() {
        let mut ps = PathSet::new(1);
        assert_eq!(ps.pick_other(0, 12345), 0);
        assert_eq!(ps.pick(u32::MAX), 0);
    }

    /// One round on `path`: a few packets sent at `t`, acknowledged just after, all marked or
    /// all clean. The first ACK ends the previous round (its packet was sent after that round
    /// began) and opens this one.
    /// Four ACKs on `path`, CE-marked or not, and four unmarked ones on every other path
    /// (the rest of the connection stays clean, so `path` stands out when marked).
    fn ecn_round(ps: &mut PathSet, path: u16, t: u64, marked: bool) {
        for p in 0..ps.len() as u16 {
            for k in 0..4 {
                send(ps, p, us(t));
                ps.on_ack(
                    us(t + 10 + k),
                    &sample(p, us(t), Some(100), Some(marked && p == path)),
                );
            }
        }
    }

    #[test]
    fn plb_flags_a_path_after_n_congested_rounds_and_not_before() {
        let mut ps = PathSet::new(4);
        ecn_round(&mut ps, 3, 0, true); // opens the first round
        ecn_round(&mut ps, 3, 100, true); // ends congested round 1
        ecn_round(&mut ps, 3, 200, true); // 2
        assert_eq!(ps.take_repath(), None);
        assert_eq!(ps.stats(3).unwrap().congested_rounds, 2);
        ecn_round(&mut ps, 3, 300, true); // 3 = plb_rounds
        assert_eq!(ps.take_repath(), Some(3));
        assert_eq!(ps.take_repath(), None);
        let st = ps.stats(3).unwrap();
        assert_eq!((st.outcomes, st.ecn_frac, st.repaths), (0, 0.0, 1));
    }

    #[test]
    fn plb_counts_only_consecutive_congested_rounds() {
        let mut ps = PathSet::new(4);
        for (i, marked) in [true, true, false, true, true, false]
            .into_iter()
            .enumerate()
        {
            ecn_round(&mut ps, 1, 100 * i as u64, marked);
        }
        // Five rounds ended (T, T, clean, T, T): the clean one reset the count.
        assert_eq!(ps.stats(1).unwrap().congested_rounds, 2);
        assert_eq!(ps.take_repath(), None);
    }

    #[test]
    fn plb_flags_a_path_whose_delay_exceeds_the_target() {
        let mut ps = PathSet::new(4);
        ps.set_delay_target_ns(Some(200_000));
        rounds(&mut ps, 10, |ps, p, t| {
            let d = if p == 0 { 500 } else { 100 };
            ps.on_ack(t.add_nanos(1), &sample(p, t, Some(d), None));
        });
        assert_eq!(ps.take_repath(), Some(0));
        assert_eq!(ps.take_repath(), None);
    }

    #[test]
    fn plb_flags_a_black_holed_path_through_its_losses() {
        let mut ps = PathSet::new(4);
        rounds(&mut ps, 8, |ps, p, t| {
            if p == 1 {
                ps.on_loss(t.add_nanos(500_000), 1, t);
            } else {
                ps.on_ack(t.add_nanos(1), &sample(p, t, Some(100), None));
            }
        });
        assert_eq!(ps.take_repath(), Some(1));
        assert_eq!(ps.take_repath(), None);
    }

    /// Congestion every path sees (a shared bottleneck, or every link busy with this
    /// connection's own window) would follow a path to any port: nothing is re-pathed, though
    /// every round of every path is congested.
    #[test]
    fn plb_leaves_paths_alone_when_all_share_the_congestion() {
        let mut ps = PathSet::new(4);
        ps.set_delay_target_ns(Some(200_000));
        rounds(&mut ps, 10, |ps, p, t| {
            let s = sample(p, t, Some(400 + 10 * u64::from(p)), Some(true));
            ps.on_ack(t.add_nanos(1), &s);
        });
        assert!(ps.stats(0).unwrap().outcomes >= 10);
        assert_eq!(ps.take_repath(), None);
    }

    /// A path 1.5 times slower than the others, inside the delay tolerance the health formula
    /// ignores, still loses share through the balance term; without it, it keeps its share.
    #[test]
    fn round_share_rounds_as_round_does() {
        let mut x = 0.0f64;
        for v in [
            0.0,
            0.49999999999999994,
            0.5,
            1.5,
            2.5,
            1e6 + 0.5,
            4095.499999,
            65535.5,
        ] {
            assert_eq!(round_share(v), v.round() as u64, "{v}");
        }
        for _ in 0..100_000 {
            x = (x * 1.618_033_988 + 0.377) % 70_000.0;
            assert_eq!(round_share(x), x.round() as u64, "{x}");
        }
    }

    #[test]
    fn balance_moves_share_off_a_moderately_slower_path() {
        for gain in [0.05, 0.0] {
            let cfg = PathConfig {
                balance_gain: gain,
                ..PathConfig::default()
            };
            let mut ps = PathSet::with_config(8, cfg);
            feed(
                &mut ps,
                20,
                4,
                |p| if p == 0 { 150 } else { 100 },
                |_, _| false,
            );
            let w = ps.weights().to_vec();
            let f = fair(&ps);
            if gain > 0.0 {
                assert!(w[0] < 0.8 * f, "gain {gain}: {w:?}");
                assert!(w[1..].iter().all(|&x| x > f), "gain {gain}: {w:?}");
            } else {
                assert!((w[0] - f).abs() < 0.01 * f, "gain {gain}: {w:?}");
            }
            assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        }
    }

    #[test]
    fn feedback_from_the_old_port_is_ignored_after_repath() {
        let mut ps = PathSet::new(2);
        ps.request_repath(0);
        for i in 0..4 {
            ps.on_sent(0, us(i));
        }
        assert_eq!(ps.take_repath(), Some(0));
        assert_eq!(ps.stats(0).unwrap().in_flight, 4);
        // ACKs for packets sent before the repath still leave the flight, but teach nothing.
        ps.on_ack(us(100), &sample(0, us(2), Some(5000), Some(true)));
        let st = ps.stats(0).unwrap();
        assert_eq!((st.in_flight, st.outcomes, st.delay_ns), (3, 0, None));
        ps.on_sent(0, us(101));
        ps.on_ack(us(200), &sample(0, us(101), Some(100), Some(false)));
        assert_eq!(ps.stats(0).unwrap().delay_ns, Some(100_000));
    }

    #[test]
    fn one_bad_path_among_eight_leaves_the_connection_signal_near_the_good_delay() {
        let mut ps = PathSet::new(8);
        feed(
            &mut ps,
            10,
            4,
            |p| if p == 6 { 5000 } else { 95 + u64::from(p) },
            |p, _| p == 6,
        );
        let s = ps.connection_signal();
        let d = s.delay_ns.unwrap();
        assert!((95_000..=102_000).contains(&d), "{d}");
        assert_eq!(s.ecn_frac, 0.0);
        assert!(ps.is_outlier(6));
        assert!(!ps.is_outlier(0));
        // The controller sees the median instead of the bad path's samples...
        assert!(ps.cc_delay_ns(us(10_000), 6, 5_000_000) <= 102_000);
        // ...and good paths' samples untouched, even when they rise (alone in their round
        // trip, a sample is its own median).
        assert_eq!(ps.cc_delay_ns(us(20_000), 0, 300_000), 300_000);
    }

    #[test]
    fn a_deep_queue_on_a_few_sprayed_packets_does_not_reach_the_controller() {
        // 256 paths, one sample each: too few for any path to be called an outlier. One
        // packet in ten crosses a 30 µs queue; the others see the 10 µs base.
        let mut ps = PathSet::new(256);
        let mut worst = 0;
        for k in 0..200u64 {
            let raw = if k % 10 == 3 { 40_000 } else { 10_000 };
            let path = (k % 256) as u16;
            worst = worst.max(ps.cc_delay_ns(Timestamp::from_nanos(330 * k), path, raw));
        }
        assert_eq!(worst, 10_000);
    }

    #[test]
    fn a_queue_most_sprayed_packets_cross_reaches_the_controller_within_a_round_trip() {
        // Every packet sees the same queue build up: once half the round trip's samples are
        // above the old level, so is what the controller sees.
        let mut ps = PathSet::new(256);
        let mut t = 0;
        for k in 0..40u16 {
            t += 330;
            assert_eq!(ps.cc_delay_ns(Timestamp::from_nanos(t), k, 10_000), 10_000);
        }
        let mut seen = Vec::new();
        for k in 0..40u16 {
            t += 330;
            seen.push(ps.cc_delay_ns(Timestamp::from_nanos(t), 40 + k, 30_000));
        }
        // 10 µs round trip = 30 samples: the median turns after about 16 of them.
        let first_high = seen.iter().position(|&d| d == 30_000).unwrap();
        assert!((10..=20).contains(&first_high), "{seen:?}");
        assert!(seen[first_high..].iter().all(|&d| d == 30_000), "{seen:?}");
    }

    #[test]
    fn with_one_path_the_controller_sees_each_sample() {
        let mut ps = PathSet::new(1);
        for k in 0..20u64 {
            let raw = if k % 10 == 3 { 40_000 } else { 10_000 };
            assert_eq!(ps.cc_delay_ns(Timestamp::from_nanos(330 * k), 0, raw), raw);
        }
    }

    #[test]
    fn samples_older_than_the_round_trip_are_not_in_the_median() {
        let mut ps = PathSet::new(16);
        for k in 0..31u64 {
            ps.cc_delay_ns(Timestamp::from_nanos(100 * k), (k % 16) as u16, 50_000);
        }
        // 100 µs later, the 10 µs round trip holds only the new sample.
        assert_eq!(ps.cc_delay_ns(us(103), 0, 10_000), 10_000);
    }

    #[test]
    fn shared_congestion_moves_the_connection_signal() {
        let mut ps = PathSet::new(8);
        feed(&mut ps, 10, 4, |_| 500, |_, _| true);
        let s = ps.connection_signal();
        assert_eq!(s.delay_ns, Some(500_000));
        assert!(s.ecn_frac > 0.9);
        assert!((0..8).all(|p| !ps.is_outlier(p)));
        let w = ps.weights();
        assert!(w.iter().all(|&x| (x - 0.125).abs() < 1e-9), "{w:?}");
    }

    #[test]
    fn new_accepts_max_paths() {
        let mut ps = PathSet::new(MAX_PATHS as u16);
        assert_eq!(ps.len(), MAX_PATHS);
        assert_eq!(ps.pick(u32::MAX), (MAX_PATHS - 1) as u16);
    }

    #[test]
    #[should_panic(expected = "paths")]
    fn new_rejects_more_than_max_paths() {
        let _ = PathSet::new(MAX_PATHS as u16 + 1);
    }

    #[test]
    #[should_panic(expected = "paths")]
    fn new_rejects_zero_paths() {
        let _ = PathSet::new(0);
    }

    #[test]
    fn out_of_range_paths_are_ignored() {
        let mut ps = PathSet::new(2);
        ps.on_sent(9, us(0));
        ps.on_ack(us(1), &sample(9, us(0), Some(1), Some(true)));
        ps.on_loss(us(1), 9, us(0));
        ps.request_repath(9);
        assert_eq!(ps.take_repath(), None);
        assert!(!ps.is_outlier(9));
        assert_eq!(ps.stats(9), None);
    }
}
