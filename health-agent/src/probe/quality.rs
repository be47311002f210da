//! How good a path is, over sliding windows of 1 minute, 10 minutes and
//! 1 hour: its loss ratio with a Wilson confidence interval, and its RTT
//! percentiles (p50, p90, p99, p99.9), each shown only when the window
//! holds enough samples for it.
//!
//! Memory is bounded per path whatever the probe interval: each window
//! is cut into epochs (6 of 10 s, 10 of 1 min, 6 of 10 min), each epoch
//! keeps its losses and its answers' RTTs in log buckets. A bucket spans
//! a factor of [`GAMMA`] (8 %), so a percentile read at a bucket's
//! geometric middle is within 4 % of the sample's value (the stated
//! relative error). [`PathQuality`] records a probe in one epoch, not
//! one a window, each epoch in the smaller of a byte per answer or two
//! per distinct bucket (module `epochs`): a steady path holds about 100
//! bytes at a 60 s interval and 300 at 5 s once its hour is full, when
//! its RTTs vary threefold, never a list of its samples.
//!
//! A window reads the epochs that started within its length before now,
//! so it spans its length, plus at most one epoch. Epochs count on the
//! monotonic clock ([`clock_ms`]), so a wall clock stepped back or
//! forward moves no probe into another epoch.

mod epochs;

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

pub use epochs::PathQuality;

/// The ratio between a bucket's bounds.
pub const GAMMA: f64 = 1.08;
/// RTTs at or below this are in bucket 0.
const FLOOR_NS: f64 = 1_000.0;
/// The last bucket: RTTs of `FLOOR_NS * GAMMA^255` (about 330 s) and more.
const LAST_BUCKET: u8 = u8::MAX;

/// The windows, each cut into epochs.
pub const WINDOWS: [Window; 3] = [
    Window {
        name: "1m",
        epoch: Duration::from_secs(10),
        epochs: 6,
    },
    Window {
        name: "10m",
        epoch: Duration::from_secs(60),
        epochs: 10,
    },
    Window {
        name: "1h",
        epoch: Duration::from_secs(600),
        epochs: 6,
    },
];

/// Milliseconds on the monotonic clock since its first reading: the time
/// the windows count in. Unlike the wall clock it never steps, so an
/// NTP correction neither piles a path's probes into one epoch nor
/// empties its windows.
#[must_use]
pub fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// The epochs of every window together.
const ALL_EPOCHS: usize = 22;
/// Where each window's epochs start among them.
const FIRST_EPOCH: [usize; 3] = [0, 6, 16];

/// One sliding window: its length is `epoch * epochs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub name: &'static str,
    pub epoch: Duration,
    pub epochs: usize,
}

impl Window {
    /// The number of the epoch holding `at_ms`.
    fn epoch_of(self, at_ms: u64) -> u64 {
        at_ms
            / u64::try_from(self.epoch.as_millis())
                .unwrap_or(u64::MAX)
                .max(1)
    }
}

/// The bucket of an RTT.
#[must_use]
pub fn bucket(rtt_ns: u64) -> u8 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "an RTT's bucket needs 4 % precision, f64 has 52 bits"
    )]
    let ns = rtt_ns as f64;
    if ns <= FLOOR_NS {
        return 0;
    }
    let b = ((ns / FLOOR_NS).ln() / GAMMA.ln()).ceil();
    if b >= f64::from(LAST_BUCKET) {
        LAST_BUCKET
    } else {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "b is in 1..255 here"
        )]
        let b = b as u8;
        b
    }
}

/// The value a bucket stands for: its geometric middle (bucket 0: the
/// floor).
#[must_use]
pub fn bucket_value(b: u8) -> u64 {
    if b == 0 {
        return 1_000;
    }
    let upper = FLOOR_NS * GAMMA.powi(i32::from(b));
    let middle = upper / GAMMA.sqrt();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "at most FLOOR_NS * 1.08^255, about 3.3e11 ns"
    )]
    let ns = middle.round() as u64;
    ns
}

// Every window's epoch is a whole number of the first window's: one
// epoch number (the first window's) gives every window's, and the
// windows' epochs fill the counts one window after the other.
const _: () = {
    let first = WINDOWS[0].epoch.as_millis();
    let mut t = 0;
    while t < WINDOWS.len() {
        assert!(WINDOWS[t].epoch.as_millis().is_multiple_of(first));
        let end = if t + 1 < WINDOWS.len() {
            FIRST_EPOCH[t + 1]
        } else {
            ALL_EPOCHS
        };
        assert!(FIRST_EPOCH[t] + WINDOWS[t].epochs == end);
        t += 1;
    }
};

/// How many of the first window's epochs make one of window `t`'s.
fn ratio_of(t: usize) -> u32 {
    let first = WINDOWS[0].epoch.as_millis();
    u32::try_from(WINDOWS[t].epoch.as_millis() / first.max(1)).unwrap_or(1)
}

/// A percentile and the samples it needs: `1 / (1 - q)`.
const PERCENTILES: [(f64, u64); 4] = [(0.5, 2), (0.9, 10), (0.99, 100), (0.999, 1000)];

/// One window's figures for a path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    /// `1m`, `10m` or `1h`.
    pub window: String,
    /// Probes sent in the window.
    pub probes: u64,
    pub lost: u64,
    /// `lost / probes`; `None` without probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_ratio: Option<f64>,
    /// The 95 % Wilson score interval of the loss ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_low: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_high: Option<f64>,
    /// RTT percentiles of the answered probes, each only with enough of
    /// them (p50: 2, p90: 10, p99: 100, p99.9: 1,000), within 4 %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_p50_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_p90_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_p99_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_p999_ns: Option<u64>,
}

impl Quality {
    fn from_parts(window: &str, probes: u64, lost: u64, sorted: &[(u8, u32)]) -> Self {
        let answered: u64 = sorted.iter().map(|&(_, c)| u64::from(c)).sum();
        let pct = |i: usize| {
            let (q, needs) = PERCENTILES[i];
            (answered >= needs).then(|| percentile(sorted, answered, q))
        };
        let (low, high) = wilson(lost, probes).map_or((None, None), |(l, h)| (Some(l), Some(h)));
        Self {
            window: window.to_owned(),
            probes,
            lost,
            loss_ratio: ratio(lost, probes),
            loss_low: low,
            loss_high: high,
            rtt_p50_ns: pct(0),
            rtt_p90_ns: pct(1),
            rtt_p99_ns: pct(2),
            rtt_p999_ns: pct(3),
        }
    }
}

fn ratio(k: u64, n: u64) -> Option<f64> {
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    (n > 0).then(|| k as f64 / n as f64)
}

/// Nearest-rank percentile `q` of `n` samples in `sorted` buckets.
fn percentile(sorted: &[(u8, u32)], n: u64, q: f64) -> u64 {
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "n is far below 2^52; the rank is in 1..=n"
    )]
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0u64;
    for &(b, c) in sorted {
        seen += u64::from(c);
        if seen >= rank {
            return bucket_value(b);
        }
    }
    sorted.last().map_or(0, |&(b, _)| bucket_value(b))
}

/// z of a two-sided 95 % interval.
const Z95: f64 = 1.96;

/// The 95 % Wilson score interval of `k` successes in `n` trials (here:
/// losses in probes); `None` without trials.
#[must_use]
pub fn wilson(k: u64, n: u64) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    let (none, all) = (k == 0, k == n);
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    // With no loss (or every probe lost) the interval reaches 0 (1)
    // exactly, not within the formula's rounding (1e-17).
    let low = if none { 0.0 } else { (centre - half).max(0.0) };
    let high = if all { 1.0 } else { (centre + half).min(1.0) };
    Some((low, high))
}

/// Windows shorter than this many probes never make a path degraded: one
/// loss in a few probes is an unlucky probe, not a bad path.
pub const DEGRADED_MIN_PROBES: u64 = 20;

/// Whether a path loses at least `threshold` of its probes with 95 %
/// confidence (the Wilson interval's lower bound) in any window with
/// enough probes.
#[must_use]
pub fn is_degraded(windows: &[Quality], threshold: f64) -> bool {
    windows
        .iter()
        .any(|q| q.probes >= DEGRADED_MIN_PROBES && q.loss_low.is_some_and(|l| l >= threshold))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_within_the_stated_error() {
        for ns in [
            1_500u64,
            20_000,
            87_654,
            1_000_000,
            123_456_789,
            2_000_000_000,
        ] {
            let v = bucket_value(bucket(ns));
            #[expect(clippy::cast_precision_loss, reason = "test values")]
            let err = (v as f64 - ns as f64).abs() / ns as f64;
            assert!(err <= 0.04, "{ns} read as {v}: {err}");
        }
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(u64::MAX), LAST_BUCKET);
        assert!(bucket(2_000) < bucket(2_200));
    }

    #[test]
    fn wilson_matches_the_textbook_values() {
        // 5 of 100: [0.0215, 0.1118] (Wilson, 95 %).
        let (l, h) = wilson(5, 100).expect("trials");
        assert!(
            (l - 0.0215).abs() < 0.0005 && (h - 0.1118).abs() < 0.0005,
            "{l} {h}"
        );
        let (l, h) = wilson(0, 60).expect("trials");
        assert!(l.abs() < 1e-12 && h > 0.05 && h < 0.07, "{l} {h}");
        // No loss starts at 0 and every probe lost ends at 1, exactly:
        // no threshold above 0 is met without a loss.
        for n in 1..=2_000 {
            let (l, _) = wilson(0, n).expect("trials");
            let (_, h) = wilson(n, n).expect("trials");
            assert!(
                l.to_bits() == 0 && h.to_bits() == 1f64.to_bits(),
                "{n}: {l} {h}"
            );
        }
        assert_eq!(wilson(0, 0), None);
    }
}
