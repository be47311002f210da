//! A bounded-frequency runner, after kube-proxy's: a function runs when
//! asked, but never more often than `min_interval` allows (with `burst`
//! runs of slack), and at least every `max_interval` even when nobody asks.

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

    fn take(&mut self, now: Instant) {
        self.refill(now);
        self.tokens -= 1.0;
    }
}

/// Runs `f` whenever `wake` is notified, within `limits`, until the task is
/// dropped. Returns never.
pub async fn run<F, Fut>(limits: Limits, wake: &Notify, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut bucket = Bucket::new(limits, Instant::now());
    let mut last_run = Instant::now();
    loop {
        let deadline = last_run + limits.max_interval;
        let asked = tokio::select! {
            () = wake.notified() => true,
            () = sleep_until(deadline) => false,
        };
        if asked {
            let at = bucket.next_allowed(Instant::now());
            sleep_until(at).await;
        }
        bucket.take(Instant::now());
        f().await;
        last_run = Instant::now();
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
                std::future::ready(())
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
    async fn runs_at_least_every_max_interval() {
        let (_wake, runs, task) = runner().await;
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        task.abort();
    }
}
