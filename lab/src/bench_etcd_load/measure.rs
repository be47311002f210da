//! What the tasks measure, shared between them: latency histograms, the
//! agents' put times, the run's counters, and what each watcher received.

use std::sync::atomic::{AtomicU64, Ordering};

use super::cluster::Cluster;

/// Latencies in µs, with bounded memory: [`Histogram::BUCKET_US`] buckets
/// up to [`Histogram::RANGE_US`] (one more for anything above) and the
/// exact maximum. Shared by every task (relaxed atomics).
pub(super) struct Histogram {
    buckets: Vec<AtomicU64>,
    max: AtomicU64,
}

impl Histogram {
    const BUCKET_US: u64 = 100;
    const RANGE_US: u64 = 60_000_000;

    fn new() -> Self {
        let n = (Self::RANGE_US / Self::BUCKET_US) as usize + 1;
        Self {
            buckets: (0..n).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }

    pub(super) fn record(&self, us: u64) {
        let i = ((us / Self::BUCKET_US) as usize).min(self.buckets.len() - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(us, Ordering::Relaxed);
    }

    pub(super) fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    pub(super) fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// The `p` quantile, in µs: the upper edge of its bucket (at most
    /// [`Self::BUCKET_US`] above the sample), at most the maximum; the
    /// maximum when it is above the range.
    pub(super) fn quantile(&self, p: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank among at most billions of samples"
        )]
        let rank = ((n as f64 * p).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                // The last bucket holds everything above the range.
                if i + 1 == self.buckets.len() {
                    break;
                }
                return ((i as u64 + 1) * Self::BUCKET_US).min(self.max());
            }
        }
        self.max()
    }
}

/// When each agent sent its latest puts, in µs of the run's clock: per
/// agent [`PutTimes::SLOTS`] slots by seq, each the seq's low 24 bits above
/// 40 bits of time (12 days). A delivery more than `SLOTS` puts of its
/// agent late finds its slot taken: counted as unstamped.
pub(super) struct PutTimes {
    slots: Vec<AtomicU64>,
}

impl PutTimes {
    const SLOTS: usize = 64;
    const TIME_BITS: u32 = 40;
    const TIME_MASK: u64 = (1 << Self::TIME_BITS) - 1;
    const SEQ_MASK: u64 = (1 << 24) - 1;

    fn new(agents: usize) -> Self {
        Self {
            slots: (0..agents * Self::SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn slot(&self, agent: usize, seq: u64) -> &AtomicU64 {
        &self.slots[agent * Self::SLOTS + (seq % Self::SLOTS as u64) as usize]
    }

    pub(super) fn record(&self, agent: usize, seq: u64, us: u64) {
        let v = ((seq & Self::SEQ_MASK) << Self::TIME_BITS) | (us & Self::TIME_MASK);
        self.slot(agent, seq).store(v, Ordering::Release);
    }

    pub(super) fn get(&self, agent: usize, seq: u64) -> Option<u64> {
        let v = self.slot(agent, seq).load(Ordering::Acquire);
        (v != 0 && v >> Self::TIME_BITS == seq & Self::SEQ_MASK).then_some(v & Self::TIME_MASK)
    }
}

/// What every task adds to.
pub(super) struct Shared {
    pub(super) cluster: Cluster,
    /// The run's clock (monotonic): put and receive times are µs of it.
    epoch: std::time::Instant,
    pub(super) sent: PutTimes,
    pub(super) put_latency: Histogram,
    pub(super) delivery: Histogram,
    pub(super) puts: AtomicU64,
    pub(super) put_errors: AtomicU64,
    pub(super) keepalive_errors: AtomicU64,
    /// Encoded summary sizes.
    pub(super) bytes_total: AtomicU64,
    pub(super) bytes_min: AtomicU64,
    pub(super) bytes_max: AtomicU64,
    /// Deliveries so far, every watcher's.
    pub(super) delivered: AtomicU64,
}

impl Shared {
    pub(super) fn new(cluster: Cluster) -> Self {
        Self {
            sent: PutTimes::new(cluster.len()),
            cluster,
            epoch: std::time::Instant::now(),
            put_latency: Histogram::new(),
            delivery: Histogram::new(),
            puts: AtomicU64::new(0),
            put_errors: AtomicU64::new(0),
            keepalive_errors: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            bytes_min: AtomicU64::new(u64::MAX),
            bytes_max: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        }
    }

    pub(super) fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// What one watcher received.
pub(super) struct Seen {
    /// Per agent: its last seq received (0: none) and how many.
    pub(super) per_agent: Vec<(u64, u64)>,
    pub(super) deliveries: u64,
    /// A seq not above the agent's last one.
    pub(super) out_of_order: u64,
    /// Not a summary of an agent, or (watcher 0) one that does not decode
    /// to its key's observer and its header's seq.
    pub(super) invalid: u64,
    /// No send time found for its (agent, seq).
    pub(super) unstamped: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_a_bucket() {
        let h = Histogram::new();
        assert_eq!(h.quantile(0.99), 0);
        for ms in 1..=100 {
            h.record(ms * 1000 + 17);
        }
        h.record(90_000_000);
        assert_eq!(h.count(), 101);
        assert_eq!(h.quantile(0.5), 51_100);
        assert_eq!(h.quantile(0.99), 100_100);
        assert_eq!(h.quantile(1.0), 90_000_000, "above the range: the max");
        assert_eq!(h.max(), 90_000_000);
    }

    #[test]
    fn put_times_keep_the_latest_puts() {
        let t = PutTimes::new(2);
        assert_eq!(t.get(1, 1), None);
        t.record(1, 1, 12_345);
        assert_eq!(t.get(1, 1), Some(12_345));
        assert_eq!(t.get(0, 1), None);
        t.record(1, 1 + PutTimes::SLOTS as u64, 99);
        assert_eq!(t.get(1, 1), None, "overwritten");
        assert_eq!(t.get(1, 1 + PutTimes::SLOTS as u64), Some(99));
    }
}
