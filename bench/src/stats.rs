//! Latency percentiles.
use serde::Serialize;

/// Latency summary in microseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Samples taken.
    pub samples: u64,
    /// Smallest sample.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

/// The `q` quantile (0..=1) of sorted samples, nearest rank.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises nanosecond samples (sorts them in place).
pub fn summarize(samples_ns: &mut [u64]) -> Latency {
    samples_ns.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    let n = samples_ns.len();
    let mean = if n == 0 {
        0.0
    } else {
        samples_ns.iter().map(|&x| x as f64).sum::<f64>() / n as f64 / 1000.0
    };
    Latency {
        samples: n as u64,
        min_us: us(samples_ns.first().copied().unwrap_or(0)),
        p50_us: us(quantile(samples_ns, 0.50)),
        mean_us: mean,
        p99_us: us(quantile(samples_ns, 0.99)),
        p999_us: us(quantile(samples_ns, 0.999)),
        max_us: us(samples_ns.last().copied().unwrap_or(0)),
    }
}

/// The median of a few values (for repeated runs); `None` if empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v: Vec<u64> = (1..=1000).map(|x| x * 1000).collect();
        let l = summarize(&mut v);
        assert_eq!(l.p50_us, 500.0);
        assert_eq!(l.p99_us, 990.0);
        assert_eq!(l.p999_us, 999.0);
        assert_eq!(l.min_us, 1.0);
        assert_eq!(l.max_us, 1000.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
    }
}
