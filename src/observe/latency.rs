//! A lock-free latency histogram fine enough to quote percentiles from.
//!
//! Buckets are log-linear: each power of two of microseconds is split into
//! [`SUB_BUCKETS`] equal slices, so any quantile read back is within about 6% of the true
//! value (the bucket's upper bound is reported). Recording is one relaxed atomic add, cheap
//! enough for the writer thread's hot path; memory is fixed whatever is recorded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Slices per power of two.
const SUB_BUCKETS: usize = 16;
/// Powers of two covered: 1 µs up to 2^30 µs (about 18 minutes); slower lands in the last bucket.
const OCTAVES: usize = 31;
/// Total buckets.
const BUCKETS: usize = SUB_BUCKETS * OCTAVES;

/// Counts of observed durations per bucket, with their sum and the largest.
pub struct Histogram {
    /// One counter per bucket, see [`bucket_of`].
    counts: Box<[AtomicU64]>,
    /// The sum of every observation, in microseconds.
    sum_us: AtomicU64,
    /// The largest observation, in microseconds (exact, not a bucket bound).
    max_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram({} observations)", self.count())
    }
}

/// The bucket a duration of `us` microseconds falls in.
fn bucket_of(us: u64) -> usize {
    if us < SUB_BUCKETS as u64 {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros() as usize; // floor(log2(us)) >= 4
    let shift = octave - SUB_BUCKETS.trailing_zeros() as usize;
    let slice = ((us >> shift) as usize) - SUB_BUCKETS;
    ((octave - 3) * SUB_BUCKETS + slice).min(BUCKETS - 1)
}

/// The largest duration, in microseconds, that lands in `bucket`.
fn upper_us_of(bucket: usize) -> u64 {
    if bucket < SUB_BUCKETS {
        return bucket as u64;
    }
    let octave = bucket / SUB_BUCKETS + 3;
    let slice = (bucket % SUB_BUCKETS) as u64;
    let shift = octave - SUB_BUCKETS.trailing_zeros() as usize;
    ((SUB_BUCKETS as u64 + slice + 1) << shift) - 1
}

impl Histogram {
    /// Records one observation.
    pub fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The largest observation so far, in microseconds; `None` when nothing was recorded.
    pub fn max_us(&self) -> Option<u64> {
        (self.count() > 0).then(|| self.max_us.load(Ordering::Relaxed))
    }

    /// The sum of every observation, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// The observations regrouped into coarser buckets with upper bounds `bounds_s` (seconds,
    /// ascending) and a last one at infinity, each with its own count (not cumulative), as
    /// `prometheus-client` takes them. A fine bucket counts at the first bound it lies wholly
    /// at or below, so one that straddles a bound counts at the next (within about 6% of the
    /// bound). The counts add up to every observation read.
    pub fn regrouped(&self, bounds_s: &[f64]) -> Vec<(f64, u64)> {
        let mut out = Vec::with_capacity(bounds_s.len() + 1);
        let mut bucket = 0;
        for &bound in bounds_s.iter().chain(&[f64::INFINITY]) {
            let mut n = 0;
            while bucket < BUCKETS && (upper_us_of(bucket) as f64) <= bound * 1e6 {
                n += self.counts[bucket].load(Ordering::Relaxed);
                bucket += 1;
            }
            out.push((bound, n));
        }
        out
    }

    /// Observations recorded so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The `q` quantile (0.0..=1.0) in microseconds, as its bucket's upper bound but never above
    /// the largest duration recorded (a bucket's bound can be, which made a p99 read above
    /// the max); `None` when nothing was recorded.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, c) in self.counts.iter().enumerate() {
            seen += c.load(Ordering::Relaxed);
            if seen >= rank {
                return Some(upper_us_of(bucket).min(self.max_us.load(Ordering::Relaxed)));
            }
        }
        Some(upper_us_of(BUCKETS - 1).min(self.max_us.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_duration_lands_in_a_bucket_whose_bound_covers_it_within_a_sixteenth() {
        for us in [
            0,
            1,
            15,
            16,
            17,
            31,
            32,
            100,
            999,
            1_000,
            4_321,
            65_536,
            1_000_000,
            123_456_789,
        ] {
            let b = bucket_of(us);
            let upper = upper_us_of(b);
            assert!(upper >= us, "{us} µs in bucket {b} with upper {upper}");
            assert!(
                upper as f64 <= us as f64 * (1.0 + 1.0 / 16.0) + 1.0,
                "{us} µs: upper {upper} too coarse"
            );
            if b > 0 {
                assert!(
                    upper_us_of(b - 1) < us,
                    "{us} µs should not fit the bucket below"
                );
            }
        }
    }

    #[test]
    fn max_sum_and_regrouped_counts_follow_what_was_recorded() {
        let h = Histogram::default();
        assert_eq!(h.max_us(), None);
        for us in [100u64, 900, 2_500, 40_000] {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.max_us(), Some(40_000));
        assert!((h.sum_seconds() - 0.0435).abs() < 1e-9);
        assert_eq!(
            h.regrouped(&[0.0005, 0.001, 0.002, 0.005]),
            [
                (0.0005, 1),
                (0.001, 1),
                (0.002, 0),
                (0.005, 1),
                (f64::INFINITY, 1)
            ]
        );
    }

    #[test]
    fn quantiles_come_back_from_recorded_durations() {
        let h = Histogram::default();
        assert_eq!(h.quantile_us(0.5), None);
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile_us(0.5).unwrap();
        let p99 = h.quantile_us(0.99).unwrap();
        assert!((50_000..=53_200).contains(&p50), "p50 {p50}");
        assert!((99_000..=105_300).contains(&p99), "p99 {p99}");
        // A bucket's bound may lie above the largest duration: no quantile is read above it.
        let one = Histogram::default();
        one.record(Duration::from_micros(347_356));
        assert_eq!(one.quantile_us(0.99), Some(347_356));
        assert!(h.quantile_us(1.0).unwrap() <= h.max_us().unwrap());
    }
}
