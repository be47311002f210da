//! How good a path is, over sliding windows of 1 minute, 10 minutes and
//! 1 hour: its loss ratio with a Wilson confidence interval, and its RTT
//! percentiles (p50, p90, p99, p99.9), each shown only when the window
//! holds enough samples for it.
//!
//! Memory is bounded per path whatever the probe interval: each window
//! is cut into epochs (6 of 10 s, 10 of 1 min, 6 of 10 min), each epoch
//! keeps its losses (a `u16`) and a sparse log-bucketed histogram of its
//! answers' RTTs; its probes are the two together. A bucket spans a
//! factor of [`GAMMA`] (8 %), so a percentile read at a bucket's
//! geometric middle is within 4 % of the sample's value (the stated
//! relative error). The histograms of all epochs share one exactly sized
//! slice of 2-byte entries (bucket, count up to 255), epoch after epoch,
//! with one entry per distinct RTT bucket an epoch saw (and one more per
//! 255 samples of a bucket): a steady path holds a few entries per epoch
//! (about 128 bytes a path at a 60 s interval, 512 at 5 s, when its RTTs
//! vary threefold), never a list of its samples.
//!
//! A window reads the epochs that started within its length before now,
//! so it spans its length, plus at most one epoch.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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

/// A path's samples over the three windows, in bounded memory: 88 bytes
/// and its histogram entries, 2 bytes each (40,000 of these at 10,000
/// peers). An epoch keeps its losses and its answers' histogram; its
/// probes are the two together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathQuality {
    /// The first window's newest epoch number (32 bits: 1,300 years of
    /// 10 s epochs); the other windows' follow from it.
    newest: u32,
    /// How many of `entries` each epoch has, window after window (see
    /// [`FIRST_EPOCH`]), each at slot `epoch % epochs`.
    lens: [u8; ALL_EPOCHS],
    /// Each epoch's lost probes, in the order of `lens`.
    lost: [u16; ALL_EPOCHS],
    /// The epochs' histogram entries, epoch after epoch in the order of
    /// `lens`: an RTT bucket (high 8 bits) and its samples (low 8 bits,
    /// 1 to 255; a bucket with more has one more entry for each 255).
    /// Exactly as long as the entries: no spare capacity.
    entries: Box<[u16]>,
}

const fn entry(bucket: u8, count: u8) -> u16 {
    ((bucket as u16) << 8) | count as u16
}

const fn bucket_of(e: u16) -> u8 {
    (e >> 8) as u8
}

const fn count_of(e: u16) -> u8 {
    (e & 0xff) as u8
}

impl PathQuality {
    /// Records one probe at `at_ms`: its RTT, or `None` when it was lost.
    pub fn record(&mut self, at_ms: u64, rtt_ns: Option<u64>) {
        self.advance(at_ms);
        // Each window's newest epoch, in the order of `lens`.
        let epochs: [usize; WINDOWS.len()] = std::array::from_fn(|t| {
            let epochs = u32::try_from(WINDOWS[t].epochs).unwrap_or(1);
            FIRST_EPOCH[t] + (self.newest_of(t) % epochs) as usize
        });
        match rtt_ns.map(bucket) {
            None => {
                for e in epochs {
                    self.lost[e] = self.lost[e].saturating_add(1);
                }
            }
            Some(b) => self.count(epochs, b),
        }
    }

    /// Window `t`'s newest epoch number.
    fn newest_of(&self, t: usize) -> u32 {
        self.newest / ratio_of(t)
    }

    /// Moves the windows to the epoch of `at_ms`, clearing the slots of
    /// the epochs that ended. A time before the newest epoch (a clock
    /// stepped back) counts in the newest.
    fn advance(&mut self, at_ms: u64) {
        let epoch = u32::try_from(WINDOWS[0].epoch_of(at_ms)).unwrap_or(u32::MAX);
        if epoch <= self.newest {
            return;
        }
        let mut ended = [false; ALL_EPOCHS];
        for (t, w) in WINDOWS.iter().enumerate() {
            let (old, new) = (self.newest_of(t), epoch / ratio_of(t));
            let epochs = u32::try_from(w.epochs).unwrap_or(1);
            for i in 0..(new - old).min(epochs) {
                // The remainder is below `epochs`, at most 10.
                ended[FIRST_EPOCH[t] + ((new - i) % epochs) as usize] = true;
            }
        }
        self.newest = epoch;
        let dropped: usize = ended
            .iter()
            .zip(&self.lens)
            .filter(|(gone, _)| **gone)
            .map(|(_, &n)| usize::from(n))
            .sum();
        if dropped > 0 {
            let mut kept = Vec::with_capacity(self.entries.len() - dropped);
            let mut at = 0;
            for (e, &gone) in ended.iter().enumerate() {
                let n = usize::from(self.lens[e]);
                if !gone {
                    kept.extend_from_slice(&self.entries[at..at + n]);
                }
                at += n;
            }
            self.entries = kept.into_boxed_slice();
        }
        for (e, &gone) in ended.iter().enumerate() {
            if gone {
                self.lens[e] = 0;
                self.lost[e] = 0;
            }
        }
    }

    /// Where epoch `e`'s entries are in `entries`.
    fn segment(&self, e: usize) -> std::ops::Range<usize> {
        let start = self.lens[..e].iter().map(|&n| usize::from(n)).sum();
        start..start + usize::from(self.lens[e])
    }

    /// Counts an answer in bucket `b` of each window's epoch in `epochs`
    /// (in the order of `lens`): in place where the epoch has the bucket
    /// with room, else in a new entry, the new ones made in one copy.
    fn count(&mut self, epochs: [usize; WINDOWS.len()], b: u8) {
        let room = |x: &u16| count_of(*x) < u8::MAX;
        // Where each window's new entry goes, in `entries` as they are.
        let mut new_at = [None; WINDOWS.len()];
        for (t, &e) in epochs.iter().enumerate() {
            let held = self.segment(e);
            if let Some(x) = self.entries[held.clone()]
                .iter_mut()
                .find(|x| bucket_of(**x) == b && room(x))
            {
                *x += 1;
            } else if self.lens[e] < u8::MAX {
                new_at[t] = Some(held.end);
            } else if let Some(x) = self.entries[held]
                .iter_mut()
                .filter(|x| room(x))
                .min_by_key(|x| bucket_of(**x).abs_diff(b))
            {
                // An epoch has at most 255 entries (255 distinct buckets
                // fill them): past that, an answer counts in the nearest
                // bucket with room (it is still an answer).
                *x += 1;
            }
            // Past 255 entries of 255 samples each (65,025 answers in one
            // epoch), an answer is not counted, as a count past `u16` is
            // not.
        }
        let adds = new_at.iter().flatten().count();
        if adds == 0 {
            return;
        }
        // The epochs are in order, so the places are too.
        let mut grown = Vec::with_capacity(self.entries.len() + adds);
        let mut from = 0;
        for (&e, at) in epochs.iter().zip(new_at) {
            if let Some(at) = at {
                grown.extend_from_slice(&self.entries[from..at]);
                grown.push(entry(b, 1));
                from = at;
                self.lens[e] += 1;
            }
        }
        grown.extend_from_slice(&self.entries[from..]);
        self.entries = grown.into_boxed_slice();
    }

    /// Window `t`'s epochs that started within it at `now_ms`: each
    /// one's index in `lens` and `lost`, and its histogram entries.
    fn live_epochs(&self, t: usize, now_ms: u64) -> impl Iterator<Item = (usize, &[u16])> {
        let first = FIRST_EPOCH[t];
        let mut at: usize = self.lens[..first].iter().map(|&n| usize::from(n)).sum();
        (0..WINDOWS[t].epochs).filter_map(move |slot| {
            let held = at..at + usize::from(self.lens[first + slot]);
            at = held.end;
            self.live(t, slot, now_ms)
                .then(|| (first + slot, &self.entries[held]))
        })
    }

    /// The figures of window `t` at `now_ms`; `scratch` is reused across
    /// paths.
    #[must_use]
    pub fn stats(&self, t: usize, now_ms: u64, scratch: &mut Vec<(u8, u32)>) -> Quality {
        let (probes, lost) = self.counts(t, now_ms);
        scratch.clear();
        for (_, held) in self.live_epochs(t, now_ms) {
            scratch.extend(held.iter().map(|&x| (bucket_of(x), u32::from(count_of(x)))));
        }
        scratch.sort_unstable_by_key(|&(b, _)| b);
        Quality::from_parts(WINDOWS[t].name, probes, lost, scratch)
    }

    /// Whether slot `slot` of window `t` holds an epoch that started
    /// within the window at `now_ms`.
    fn live(&self, t: usize, slot: usize, now_ms: u64) -> bool {
        let w = WINDOWS[t];
        let now = w.epoch_of(now_ms);
        let epochs = w.epochs as u64;
        let newest = u64::from(self.newest_of(t));
        // The epoch the slot holds: the latest at or before `newest` with
        // that remainder.
        let back = (newest % epochs + epochs - slot as u64) % epochs;
        newest >= back && newest - back + epochs > now
    }

    /// Probes and losses of window `t` at `now_ms`.
    fn counts(&self, t: usize, now_ms: u64) -> (u64, u64) {
        let (mut probes, mut lost) = (0u64, 0u64);
        for (e, held) in self.live_epochs(t, now_ms) {
            let answered: u64 = held.iter().map(|&x| u64::from(count_of(x))).sum();
            probes += answered + u64::from(self.lost[e]);
            lost += u64::from(self.lost[e]);
        }
        (probes, lost)
    }

    /// Every window's figures at `now_ms`.
    #[must_use]
    pub fn windows(&self, now_ms: u64) -> Vec<Quality> {
        let mut scratch = Vec::new();
        (0..WINDOWS.len())
            .map(|t| self.stats(t, now_ms, &mut scratch))
            .collect()
    }

    /// Whether the path loses at least `threshold` of its probes with
    /// confidence in a window at `now_ms` (see [`is_degraded`]), from the
    /// windows' losses and answer counts (no percentile is made).
    #[must_use]
    pub fn is_degraded(&self, now_ms: u64, threshold: f64) -> bool {
        (0..WINDOWS.len()).any(|t| {
            let (probes, lost) = self.counts(t, now_ms);
            probes >= DEGRADED_MIN_PROBES
                && wilson(lost, probes).is_some_and(|(low, _)| low >= threshold)
        })
    }

    /// Bytes held beyond the struct itself.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.entries.len() * size_of::<u16>()
    }
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
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Some(((centre - half).max(0.0), (centre + half).min(1.0)))
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

    const SEC: u64 = 1000;

    /// The bytes a path's histograms hold after `hours` of probes every
    /// `interval_ms`, its RTTs spread evenly (in log scale) over a factor
    /// of `spread` from 100 µs.
    fn held_after(hours: u64, interval_ms: u64, spread: f64) -> usize {
        let mut p = PathQuality::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut t = 0;
        while t < hours * 3600 * SEC {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "at most 100 µs times the spread"
            )]
            let rtt = (100_000.0 * spread.powf(rng.f64())) as u64;
            p.record(t, Some(rtt));
            t += interval_ms;
        }
        p.heap_bytes()
    }

    #[test]
    fn a_bucket_past_255_samples_in_an_epoch_takes_more_entries_and_loses_none() {
        let mut p = PathQuality::default();
        // 600 answers in one 10 s epoch, all in one bucket.
        for i in 0..600u64 {
            p.record(i * 10, Some(100_000));
        }
        // Per window: 255 + 255 + 90.
        assert_eq!(p.entries.len(), 3 * 3);
        let counted: u32 = p.entries.iter().map(|&x| u32::from(count_of(x))).sum();
        assert_eq!(counted, 3 * 600);
        for q in all(&p, 6 * SEC) {
            assert_eq!(q.probes, 600, "{q:?}");
            assert_eq!(q.rtt_p999_ns, None, "600 answers are too few for p99.9");
            assert_eq!(q.rtt_p99_ns, Some(bucket_value(bucket(100_000))));
        }
    }

    #[test]
    fn an_epoch_with_every_bucket_counts_every_answer() {
        let mut p = PathQuality::default();
        // 256 answers in one 10 s epoch, one in each bucket: the last
        // finds the epoch's 255 entries taken and counts in the nearest.
        for b in 0..=u8::MAX {
            p.record(u64::from(b), Some(bucket_value(b)));
        }
        for q in all(&p, SEC) {
            assert_eq!((q.probes, q.lost), (256, 0), "{q:?}");
        }
        assert_eq!(p.entries.len(), 3 * 255);
    }

    /// What a live path's histograms come to once every window is full,
    /// and that they stay there: at 10,000 peers (40,000 paths) these
    /// bytes times 40,000 are the largest part of the agent's heap.
    #[test]
    fn a_steady_path_holds_a_bounded_histogram() {
        for (interval_ms, spread, most) in [
            (60 * SEC, 3.0, 128),
            (5 * SEC, 1.3, 256),
            (5 * SEC, 3.0, 512),
            (SEC, 3.0, 1024),
        ] {
            let (one, three) = (
                held_after(1, interval_ms, spread),
                held_after(3, interval_ms, spread),
            );
            assert!(
                three <= most,
                "{interval_ms} ms, spread {spread}: {three} B"
            );
            assert!(
                three <= one * 5 / 4,
                "grows after the first hour: {one} -> {three}"
            );
        }
    }

    fn all(p: &PathQuality, now: u64) -> Vec<Quality> {
        let mut s = Vec::new();
        (0..WINDOWS.len())
            .map(|t| p.stats(t, now, &mut s))
            .collect()
    }

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
        assert_eq!(wilson(0, 0), None);
    }

    #[test]
    fn percentiles_need_enough_samples_and_read_the_right_rank() {
        let mut p = PathQuality::default();
        // 99 probes at 100 µs, one at 10 ms, 1 s apart.
        for i in 0..100u64 {
            let rtt = if i == 50 { 10_000_000 } else { 100_000 };
            p.record(1_000_000 + i * SEC, Some(rtt));
        }
        let q = &all(&p, 1_000_000 + 100 * SEC)[1];
        assert_eq!((q.probes, q.lost), (100, 0));
        let near = |v: Option<u64>, want: u64| {
            let v = v.expect("shown");
            #[expect(clippy::cast_precision_loss, reason = "test values")]
            let err = (v as f64 - want as f64).abs() / want as f64;
            err < 0.04
        };
        assert!(near(q.rtt_p50_ns, 100_000), "{q:?}");
        assert!(near(q.rtt_p90_ns, 100_000), "{q:?}");
        assert!(near(q.rtt_p99_ns, 100_000), "{q:?}");
        assert_eq!(q.rtt_p999_ns, None, "1,000 samples needed");
        // The 1-minute window holds about the last 60 to 70.
        let m = &all(&p, 1_000_000 + 100 * SEC)[0];
        assert!((50..=70).contains(&m.probes), "{m:?}");
        assert_eq!(m.rtt_p99_ns, None, "{m:?}");
    }

    #[test]
    fn loss_is_counted_per_window_and_old_epochs_leave() {
        let mut p = PathQuality::default();
        let t0 = 7_000_000;
        // 10 minutes at 1 s with every 20th probe lost: 5 %.
        for i in 0..600u64 {
            let rtt = (i % 20 != 0).then_some(50_000);
            p.record(t0 + i * SEC, rtt);
        }
        let now = t0 + 600 * SEC;
        let w = all(&p, now);
        let ten = &w[1];
        assert!(ten.probes >= 540, "{ten:?}");
        let r = ten.loss_ratio.expect("probes");
        assert!((0.04..=0.06).contains(&r), "{ten:?}");
        assert!(is_degraded(&w, 0.01));
        assert!(!is_degraded(&w, 0.10));
        // An hour later with no probes, every window is empty.
        let later = all(&p, now + 3_700 * SEC);
        assert!(later.iter().all(|q| q.probes == 0), "{later:?}");
        // And new probes after the gap are counted alone.
        p.record(now + 3_700 * SEC, Some(60_000));
        let fresh = all(&p, now + 3_700 * SEC);
        assert!(
            fresh.iter().all(|q| q.probes == 1 && q.lost == 0),
            "{fresh:?}"
        );
    }

    #[test]
    fn one_unlucky_probe_is_not_degraded() {
        let mut p = PathQuality::default();
        let t0 = 3_600_000;
        // One hour at the 60 s default, one probe lost.
        for i in 0..60u64 {
            p.record(t0 + i * 60 * SEC, (i != 30).then_some(80_000));
        }
        let w = all(&p, t0 + 60 * 60 * SEC);
        assert!(!is_degraded(&w, 0.01), "{w:?}");
        // Three of the hour's probes lost (5 %) is.
        let mut p = PathQuality::default();
        for i in 0..60u64 {
            p.record(t0 + i * 60 * SEC, (i % 20 != 0).then_some(80_000));
        }
        let w = all(&p, t0 + 60 * 60 * SEC);
        assert!(is_degraded(&w, 0.01), "{w:?}");
    }

    #[test]
    fn memory_is_bounded_whatever_the_rate() {
        let mut p = PathQuality::default();
        // Two hours at 10 probes a second with RTTs over a wide spread.
        let mut x = 12_345u64;
        for i in 0..72_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let rtt = 20_000 + (x >> 40) % 200_000;
            p.record(i * 100, Some(rtt));
        }
        // 22 epochs, each with at most the buckets 20-220 µs spans (about
        // 32), and one more entry for each 255 samples of a bucket.
        assert!(
            p.entries.len() <= 22 * 34 + 72_000 / 255,
            "{}",
            p.entries.len()
        );
        assert!(p.heap_bytes() < 16 * 1024, "{}", p.heap_bytes());
    }

    #[test]
    fn a_steady_path_at_the_default_interval_is_small() {
        let mut p = PathQuality::default();
        for i in 0..120u64 {
            p.record(i * 60 * SEC, Some(100_000 + (i % 3) * 1_000));
        }
        assert_eq!(size_of::<PathQuality>(), 88, "the counts and epochs");
        let bytes = size_of::<PathQuality>() + p.heap_bytes();
        // 40,000 paths (10,000 peers, four paths each) under 16 MiB.
        assert!(bytes * 40_000 < 16 << 20, "{bytes} bytes a path");
    }
}
