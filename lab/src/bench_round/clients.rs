//! The status clients: 8 pulling the whole status as fast as they can,
//! and a ninth asking the small questions, with their latencies'
//! percentiles.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use health_agent::api::client::Client;

/// An answer's latency, and when its request was sent (epoch ms).
type Sample = (Duration, u64);

/// A client's answers' samples, and how many requests failed (an error,
/// or an answer other than 2xx).
type Samples = (Vec<Sample>, usize);

/// Each status client's thread, and whether it asks the small queries.
type StatusClient = (std::thread::JoinHandle<Samples>, bool);

/// 8 clients asking `GET /v1/status` (the whole body) as fast as they can
/// until `done`, and a ninth asking by turns for the summary
/// (`?summary=true`) and one node's status (`?node=NAME`); each returns
/// its latencies: to the last byte of the body as sent (gzip), as a load
/// generator measures, not the client's own decoding, which on 2 vCPUs
/// would take the agent's CPU.
pub(super) fn status_clients(
    client: &Client,
    done: &Arc<AtomicBool>,
    node: &str,
) -> Vec<StatusClient> {
    (0..9)
        .map(|i| {
            let small = i == 8;
            let (client, done) = (client.clone(), done.clone());
            let node = format!("/v1/status?node={node}");
            let handle = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                let (mut samples, mut failed) = (Vec::new(), 0);
                let mut turn = 0_usize;
                while !done.load(Ordering::Relaxed) {
                    let path = match (small, turn % 2) {
                        (false, _) => "/v1/status",
                        (true, 0) => "/v1/status?summary=true",
                        (true, _) => node.as_str(),
                    };
                    turn += 1;
                    let (t, sent_ms) = (Instant::now(), health_agent::util::timefmt::now_ms());
                    if rt
                        .block_on(client.raw_as_sent("GET", path))
                        .is_ok_and(|(status, _, _)| status.is_success())
                    {
                        samples.push((t.elapsed(), sent_ms));
                    } else {
                        failed += 1;
                    }
                }
                (samples, failed)
            });
            (handle, small)
        })
        .collect()
}

/// The status clients' latencies, once they stopped: the whole status's,
/// and the small queries'.
pub(super) fn joined(clients: Vec<StatusClient>) -> (Percentiles, Percentiles) {
    let (mut full, mut small) = ((Vec::new(), 0), (Vec::new(), 0));
    for (h, summary) in clients {
        let (samples, failed) = h.join().unwrap_or_default();
        let into = if summary { &mut small } else { &mut full };
        into.0.extend(samples);
        into.1 += failed;
    }
    (
        Percentiles::of(full.0).failing(full.1),
        Percentiles::of(small.0).failing(small.1),
    )
}

/// A latency distribution's count and percentiles.
pub(super) struct Percentiles {
    count: usize,
    /// Requests that failed (an error or no 2xx answer): in no figure.
    failed: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
    /// When the slowest answer's request was sent (epoch ms).
    max_sent_ms: u64,
}

impl Percentiles {
    /// "N answers, F failed, p99 X ms (p50, p90, max)".
    pub(super) fn line(&self) -> String {
        format!(
            "{} answers, {} failed, p99 {:.2} ms (p50 {:.2}, p90 {:.2}, max {:.2} ms)",
            self.count,
            self.failed,
            ms(self.p99),
            ms(self.p50),
            ms(self.p90),
            ms(self.max)
        )
    }

    /// With `failed` requests counted beside the answers.
    const fn failing(self, failed: usize) -> Self {
        Self { failed, ..self }
    }

    /// The distribution of `samples`, each percentile its nearest rank:
    /// the smallest sample at least `pct` % of them do not exceed.
    fn of(mut samples: Vec<Sample>) -> Self {
        samples.sort_unstable();
        let at = |pct: usize| {
            let rank = (samples.len() * pct).div_ceil(100).max(1);
            samples.get(rank - 1).map(|s| s.0).unwrap_or_default()
        };
        let (max, max_sent_ms) = samples.last().copied().unwrap_or_default();
        Self {
            count: samples.len(),
            failed: 0,
            p50: at(50),
            p90: at(90),
            p99: at(99),
            max,
            max_sent_ms,
        }
    }

    /// When the slowest answer's request was sent, in seconds from
    /// `started_ms` (a round's start): where in the round the answers
    /// wait longest.
    #[allow(
        clippy::cast_precision_loss,
        reason = "seconds for display, from milliseconds far below 2^52"
    )]
    pub(super) fn max_from(&self, started_ms: u64) -> f64 {
        (self.max_sent_ms as f64 - started_ms as f64) / 1000.0
    }
}

/// Milliseconds, for display.
pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_distribution() {
        let ms = Duration::from_millis;
        // Sample k was sent at 1,000 + k ms: the slowest (100 ms) at
        // 1,100, 0.6 s after a round that started at 500.
        let p = Percentiles::of((1..=100).rev().map(|k| (ms(k), 1_000 + k)).collect());
        assert_eq!(p.count, 100);
        assert_eq!(
            (p.p50, p.p90, p.p99, p.max),
            (ms(50), ms(90), ms(99), ms(100))
        );
        // Of 1,000: the 990th is the p99.
        let thousand = Percentiles::of((1..=1_000).map(|k| (ms(k), 0)).collect());
        assert_eq!((thousand.p50, thousand.p99), (ms(500), ms(990)));
        // One sample is every percentile.
        let one = Percentiles::of(vec![(ms(7), 0)]);
        assert_eq!((one.p50, one.p99, one.max), (ms(7), ms(7), ms(7)));
        assert!(
            one.failing(3)
                .line()
                .starts_with("1 answers, 3 failed, p99 7.00 ms")
        );
        assert!((p.max_from(500) - 0.6).abs() < 1e-9, "{}", p.max_from(500));
        let none = Percentiles::of(Vec::new());
        assert_eq!(
            (none.count, none.p99, none.max),
            (0, Duration::ZERO, Duration::ZERO)
        );
    }
}
