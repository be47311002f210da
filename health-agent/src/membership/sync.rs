//! A bounded-frequency runner, after kube-proxy's: a function runs when
//! asked, but never more often than `min_interval` allows (with `burst`
//! runs of slack), and at least every `max_interval` even when nobody asks.
//! A run that could not finish its work asks to be run again after a delay
//! of its choosing (kube-proxy's `RetryAfter`), within the same limits.

use std::time::Duration;

use tokio::{
    sync::Notify,
    time::{Instant, sleep_until},
};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub min_interval: Duration,
    pub max_interval: Duration,
    pub burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(60),
            burst: 2,
        }
    }
}

/// Token bucket deciding when the next run may happen.
#[derive(Debug)]
struct Bucket {
    limits: Limits,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new(limits: Limits, now: Instant) -> Self {
        Self {
            limits,
            tokens: f64::from(limits.burst.max(1)),
            refilled: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let per_token = self.limits.min_interval.as_secs_f64().max(1e-9);
        let gained = now.saturating_duration_since(self.refilled).as_secs_f64() / per_token;
        self.tokens = (self.tokens + gained).min(f64::from(self.limits.burst.max(1)));
        self.refilled = now;
    }

    /// When a run may next happen (now, if a token is available).
    fn next_allowed(&mut self, now: Instant) -> Instant {
        self.refill(now);
        if self.tokens >= 1.0 {
            now
        } else {
            now + self.limits.min_interval.mul_f64(1.0 - self.tokens)
        }
    }

    /// Takes a token for a run, if one is left: a run the longest interval
    /// forced with none left costs nothing, so that a later change waits
    /// for one token, never for a debt of many.
    fn take(&mut self, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens - 1.0).max(0.0);
    }
}

/// Runs `f` whenever `wake` is notified, or as soon as the last run asked
/// (its output: run again after this long), within `limits`, until the
/// task is dropped. Returns never.
pub async fn run<F, Fut>(limits: Limits, wake: &Notify, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<Duration>>,
{
    let mut bucket = Bucket::new(limits, Instant::now());
    let mut last_run = Instant::now();
    let mut retry: Option<Instant> = None;
    loop {
        let deadline = last_run + limits.max_interval;
        let asked = tokio::select! {
            () = wake.notified() => true,
            () = sleep_until(retry.map_or(deadline, |r| r.min(deadline))) => retry.is_some(),
        };
        if asked {
            let at = bucket.next_allowed(Instant::now());
            sleep_until(at).await;
        }
        bucket.take(Instant::now());
        let again = f().await;
        last_run = Instant::now();
        retry = again.map(|d| last_run + d);
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicU32, Ordering},
        },
        time::Duration,
    };

    use super::*;

    fn limits() -> Limits {
        Limits {
            min_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(10),
            burst: 2,
        }
    }

    async fn runner() -> (Arc<Notify>, Arc<AtomicU32>, tokio::task::JoinHandle<()>) {
        let wake = Arc::new(Notify::new());
        let runs = Arc::new(AtomicU32::new(0));
        let (w, r) = (wake.clone(), runs.clone());
        let task = tokio::spawn(async move {
            run(limits(), &w, || {
                r.fetch_add(1, Ordering::SeqCst);
                std::future::ready(None)
            })
            .await;
        });
        tokio::task::yield_now().await;
        (wake, runs, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_requests_is_limited_to_burst_then_min_interval() {
        let (wake, runs, task) = runner().await;
        for _ in 0..20 {
            wake.notify_one();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // 200 ms of requests: the burst (2) ran, the rest waits for tokens.
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "one more after min_interval"
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_that_asks_runs_again_after_its_delay_within_max_interval() {
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let task = tokio::spawn(async move {
            let wake = Notify::new();
            wake.notify_one();
            // The first two runs ask again after 3 s; then none asks.
            run(limits(), &wake, || {
                let n = r.fetch_add(1, Ordering::SeqCst);
                std::future::ready((n < 2).then_some(Duration::from_secs(3)))
            })
            .await;
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "asked again after 3 s");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "and again");
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "not asked: max_interval");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn runs_at_least_every_max_interval() {
        let (_wake, runs, task) = runner().await;
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn runs_forced_by_the_longest_interval_leave_no_debt() {
        // Longer between tokens than between forced runs: every forced run
        // finds no token left.
        let limits = Limits {
            min_interval: Duration::from_secs(120),
            max_interval: Duration::from_secs(60),
            burst: 1,
        };
        let start = Instant::now();
        let mut bucket = Bucket::new(limits, start);
        let mut now = start;
        for _ in 0..1_000 {
            now += limits.max_interval;
            bucket.take(now);
        }
        let wait = bucket.next_allowed(now) - now;
        assert!(wait <= limits.min_interval, "{wait:?}");
    }
}
