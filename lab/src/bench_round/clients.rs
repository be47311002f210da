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

/// Each status client's thread, and whether it asks the small queries.
type StatusClient = (std::thread::JoinHandle<Vec<Sample>>, bool);

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
                let mut samples = Vec::new();
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
                    }
                }
                samples
            });
            (handle, small)
        })
        .collect()
}

/// The status clients' latencies, once they stopped: the whole status's,
/// and the small queries'.
pub(super) fn joined(clients: Vec<StatusClient>) -> (Percentiles, Percentiles) {
    let (mut full, mut small) = (Vec::new(), Vec::new());
    for (h, summary) in clients {
        let samples = h.join().unwrap_or_default();
        if summary {
            small.extend(samples);
        } else {
            full.extend(samples);
        }
    }
    (Percentiles::of(full), Percentiles::of(small))
}

/// A latency distribution's count and percentiles.
pub(super) struct Percentiles {
    count: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
    /// When the slowest answer's request was sent (epoch ms).
    max_sent_ms: u64,
}

impl Percentiles {
    /// "N answers, p99 X ms (p50, p90, max)".
    pub(super) fn line(&self) -> String {
        format!(
            "{} answers, p99 {:.2} ms (p50 {:.2}, p90 {:.2}, max {:.2} ms)",
            self.count,
            ms(self.p99),
            ms(self.p50),
            ms(self.p90),
            ms(self.max)
        )
    }

    fn of(mut samples: Vec<Sample>) -> Self {
        samples.sort_unstable();
        let at = |pct: usize| {
            samples
                .get((samples.len() * pct / 100).min(samples.len().saturating_sub(1)))
                .map(|s| s.0)
                .unwrap_or_default()
        };
        let (max, max_sent_ms) = samples.last().copied().unwrap_or_default();
        Self {
            count: samples.len(),
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
            (ms(51), ms(91), ms(100), ms(100))
        );
        assert!((p.max_from(500) - 0.6).abs() < 1e-9, "{}", p.max_from(500));
        let none = Percentiles::of(Vec::new());
        assert_eq!(
            (none.count, none.p99, none.max),
            (0, Duration::ZERO, Duration::ZERO)
        );
    }
}
