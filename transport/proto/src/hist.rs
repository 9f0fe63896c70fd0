//! A fixed-size log-linear histogram for round-trip times.
//!
//! What it does not do: it never allocates after creation, never grows, and keeps no samples.
//! Recording is O(1) (a leading-zero count, a shift and an add); a percentile query walks the
//! [`BUCKETS`] counters once.
//!
//! Layout (HdrHistogram-style with 4 bits of precision): values below 16 ns each have their own
//! bucket; every power-of-two range `[2^k, 2^(k+1))` above that is cut into 16 equal buckets of
//! width `2^(k-4)`. A percentile is reported as the middle of its bucket, clamped to the exact
//! minimum and maximum, so it is within [`MAX_RELATIVE_ERROR`] of a value that was recorded.
//! Values at or above [`MAX_TRACKED_NS`] (about 4.3 s) land in the last bucket; the exact
//! maximum is still kept.

/// Sub-buckets per power of two (4 bits of precision).
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Largest exponent tracked: values up to `2^32 - 1` ns.
const TOP_BIT: u32 = 32;
/// Number of counters: 16 linear ones below 16 ns, then 16 per power of two from 2^4 to 2^31.
pub const BUCKETS: usize = SUB + (TOP_BIT - SUB_BITS) as usize * SUB;
/// Values at or above this (ns) share the last bucket.
pub const MAX_TRACKED_NS: u64 = 1 << TOP_BIT;
/// Largest relative error of a reported percentile against the recorded value it stands for
/// (half a bucket width over the bucket's lower bound: 1/32).
pub const MAX_RELATIVE_ERROR: f64 = 1.0 / 32.0;

/// Summary of a set of RTT samples, ns. All fields are 0 before the first sample.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RttSummary {
    /// Samples recorded.
    pub samples: u64,
    /// Smallest sample (exact).
    pub min_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest sample (exact).
    pub max_ns: u64,
    /// Arithmetic mean.
    pub mean_ns: u64,
}

/// A log-linear histogram of RTT samples in nanoseconds (about 1.9 KB, fixed).
#[derive(Clone)]
pub struct RttHistogram {
    counts: [u32; BUCKETS],
    samples: u64,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

impl core::fmt::Debug for RttHistogram {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RttHistogram")
            .field("summary", &self.summary())
            .finish()
    }
}

impl Default for RttHistogram {
    fn default() -> Self {
        RttHistogram::new()
    }
}

/// The counter index of `v` ns.
fn index(v: u64) -> usize {
    let v = v.min(MAX_TRACKED_NS - 1);
    if v < SUB as u64 {
        return v as usize;
    }
    let k = 63 - v.leading_zeros(); // SUB_BITS <= k < TOP_BIT
    let sub = ((v >> (k - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (k - SUB_BITS) as usize * SUB + sub
}

/// The lowest value and the width of counter `i`.
fn bucket(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let k = (i - SUB) / SUB + SUB_BITS as usize;
    let sub = ((i - SUB) % SUB) as u64;
    let width = 1u64 << (k - SUB_BITS as usize);
    ((SUB as u64 + sub) * width, width)
}

impl RttHistogram {
    /// An empty histogram.
    pub const fn new() -> Self {
        RttHistogram {
            counts: [0; BUCKETS],
            samples: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }

    /// Records one sample of `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        let c = &mut self.counts[index(ns)];
        *c = c.saturating_add(1);
        self.samples += 1;
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Samples recorded.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Adds every sample of `other` to this histogram.
    pub fn merge(&mut self, other: &RttHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
        self.samples += other.samples;
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// The value below which a fraction `q` (0 to 1) of the samples lie, ns; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.samples == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.samples as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                let (lo, width) = bucket(i);
                return (lo + width / 2).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    /// Percentiles, extremes and mean of what was recorded.
    pub fn summary(&self) -> RttSummary {
        if self.samples == 0 {
            return RttSummary::default();
        }
        RttSummary {
            samples: self.samples,
            min_ns: self.min_ns,
            p50_ns: self.quantile(0.50),
            p99_ns: self.quantile(0.99),
            p999_ns: self.quantile(0.999),
            max_ns: self.max_ns,
            mean_ns: (self.sum_ns / u128::from(self.samples)) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact `q` quantile of sorted `v` by the same rank rule.
    fn exact(v: &[u64], q: f64) -> u64 {
        let rank = ((q * v.len() as f64).ceil() as usize).max(1);
        v[rank - 1]
    }

    fn check(mut v: Vec<u64>) {
        let mut h = RttHistogram::new();
        for &x in &v {
            h.record(x);
        }
        v.sort_unstable();
        for q in [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let (got, want) = (h.quantile(q), exact(&v, q));
            let err = got.abs_diff(want) as f64 / want.max(1) as f64;
            assert!(
                err <= MAX_RELATIVE_ERROR,
                "q {q}: got {got}, exact {want}, error {err}"
            );
        }
        let s = h.summary();
        assert_eq!(s.samples, v.len() as u64);
        assert_eq!(s.min_ns, v[0]);
        assert_eq!(s.max_ns, *v.last().unwrap());
    }

    #[test]
    fn is_small() {
        assert_eq!(BUCKETS, 464);
        assert!(core::mem::size_of::<RttHistogram>() <= 2048);
    }

    #[test]
    fn buckets_tile_the_range() {
        let mut next = 0;
        for i in 0..BUCKETS {
            let (lo, w) = bucket(i);
            assert_eq!(lo, next, "bucket {i}");
            assert_eq!(index(lo), i);
            assert_eq!(index(lo + w - 1), i);
            next = lo + w;
        }
        assert_eq!(next, MAX_TRACKED_NS);
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn empty_reports_zeros() {
        assert_eq!(RttHistogram::new().summary(), RttSummary::default());
        assert_eq!(RttHistogram::new().quantile(0.5), 0);
    }

    #[test]
    fn one_value_is_exact() {
        let mut h = RttHistogram::new();
        h.record(12_345);
        let s = h.summary();
        assert_eq!(
            (s.min_ns, s.p50_ns, s.p999_ns, s.max_ns),
            (12_345, 12_345, 12_345, 12_345)
        );
    }

    #[test]
    fn uniform_distribution_within_bound() {
        // 10 us to 110 us in 7 ns steps.
        check((0..14_286).map(|i| 10_000 + 7 * i).collect());
    }

    #[test]
    fn uniform_percentiles_land_where_expected() {
        let mut h = RttHistogram::new();
        for i in 1..=100_000u64 {
            h.record(i * 10); // 10 ns .. 1 ms
        }
        let s = h.summary();
        for (got, want) in [
            (s.p50_ns, 500_000),
            (s.p99_ns, 990_000),
            (s.p999_ns, 999_000),
        ] {
            assert!(got.abs_diff(want) as f64 <= want as f64 * MAX_RELATIVE_ERROR);
        }
        assert_eq!(s.mean_ns, 500_005);
    }

    #[test]
    fn heavy_tail_within_bound() {
        // A bimodal RTT: 99% near 20 us, 1% near 5 ms (a deterministic spread).
        let mut v = Vec::new();
        for i in 0..99_000u64 {
            v.push(20_000 + (i * 7919) % 3_000);
        }
        for i in 0..1_000u64 {
            v.push(5_000_000 + (i * 104_729) % 1_000_000);
        }
        check(v);
    }

    #[test]
    fn geometric_spread_within_bound() {
        // Values from 1 ns to about 4 s, each power of two populated.
        let mut v = Vec::new();
        let mut x = 1.0f64;
        while x < 4.0e9 {
            v.push(x as u64);
            x *= 1.013;
        }
        check(v);
    }

    #[test]
    fn huge_values_clamp_to_last_bucket_but_keep_exact_max() {
        let mut h = RttHistogram::new();
        h.record(100);
        h.record(60_000_000_000);
        assert_eq!(h.summary().max_ns, 60_000_000_000);
        assert!(h.quantile(1.0) >= MAX_TRACKED_NS - (MAX_TRACKED_NS >> 5));
    }

    #[test]
    fn merge_equals_recording_both() {
        let (mut a, mut b, mut both) = (
            RttHistogram::new(),
            RttHistogram::new(),
            RttHistogram::new(),
        );
        for i in 0..1000u64 {
            let x = 1_000 + i * 37;
            if i % 3 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            both.record(x);
        }
        a.merge(&b);
        assert_eq!(a.summary(), both.summary());
    }
}
