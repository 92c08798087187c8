//! Latency percentiles: the one definition every benchmark here reports its p50/p99/p999
//! with.
//!
//! Samples go into an HdrHistogram (the `hdrhistogram` crate) in nanoseconds, kept to three
//! significant digits, so a run of any length takes a few tens of KiB and no sort. A
//! percentile is the **nearest rank**: the `p` quantile of `n` samples is the
//! `ceil(p * n)`-th smallest (at least the first), i.e. the smallest sample with at least
//! a fraction `p` of all samples at or below it; never an interpolation between two samples.
//! It is reported as the highest value the histogram holds as equal to that sample, so it
//! may read up to 0.1% above the sample itself.

use hdrhistogram::Histogram;

/// Latency samples in nanoseconds.
#[derive(Debug, Clone)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Latencies(Histogram::new(3).expect("3 significant digits is a valid precision"))
    }
}

impl Latencies {
    /// Adds one sample, in nanoseconds.
    pub fn record(&mut self, ns: u64) {
        // The histogram grows to hold the value; if it cannot, the value counts as its
        // largest trackable one.
        if self.0.record(ns).is_err() {
            self.0.saturating_record(ns);
        }
    }

    /// Samples recorded.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// The `p` quantile by nearest rank (see the module docs), in microseconds; 0 without
    /// samples.
    pub fn percentile_us(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(p) as f64 / 1000.0
    }

    /// The largest sample, in microseconds (to the same precision); 0 without samples.
    pub fn max_us(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.max() as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ns: impl IntoIterator<Item = u64>) -> Latencies {
        let mut l = Latencies::default();
        for x in ns {
            l.record(x);
        }
        l
    }

    /// Within the histogram's precision: at or above the sample, by at most 0.1%.
    fn close(got: f64, want: f64) -> bool {
        got >= want && got <= want * 1.001
    }

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let v = of((1..=1000).map(|x| x * 1000));
        assert_eq!(v.len(), 1000);
        assert!(close(v.percentile_us(0.5), 500.0), "{}", v.percentile_us(0.5));
        assert!(close(v.percentile_us(0.99), 990.0), "{}", v.percentile_us(0.99));
        assert!(close(v.percentile_us(0.999), 999.0), "{}", v.percentile_us(0.999));
        assert!(close(v.max_us(), 1000.0));
        // Ten samples 1..=10 ms: the median is the 5th (ceil(0.5 * 10)), not the 6th that
        // rounding (n - 1) * p would pick, nor the 5.5 of interpolation.
        let ten = of((1..=10).map(|x| x * 1_000_000));
        assert!(close(ten.percentile_us(0.5), 5000.0), "{}", ten.percentile_us(0.5));
        assert!(close(ten.percentile_us(0.51), 6000.0), "{}", ten.percentile_us(0.51));
        assert!(close(ten.percentile_us(0.99), 10_000.0));
        // One sample is every percentile; none gives 0.
        assert!(close(of([1000]).percentile_us(0.99), 1.0));
        assert!(close(of([1000]).percentile_us(0.0), 1.0));
        assert_eq!(Latencies::default().percentile_us(0.5), 0.0);
        assert_eq!(Latencies::default().max_us(), 0.0);
    }
}
