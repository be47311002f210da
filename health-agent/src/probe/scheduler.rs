//! The probe loop: a round every probe interval (after the initial delay),
//! liveness echoes between them ([`super::liveness`]), until shutdown. A round in flight at shutdown is abandoned: its probes
//! are dropped with their sockets, and nothing half-done is published.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Prober;

/// Runs rounds until `shutdown`.
pub async fn run(prober: Arc<Prober>, initial_delay: Duration, shutdown: CancellationToken) {
    shutdown
        .run_until_cancelled(rounds(prober, initial_delay))
        .await;
}

async fn rounds(prober: Arc<Prober>, initial_delay: Duration) {
    tokio::time::sleep(initial_delay).await;
    let mut tick = tokio::time::interval(prober.config().interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Liveness echoes between rounds (their interval is shorter than the
    // rounds' when they are on); the first goes an interval after the
    // first round.
    let every = prober.config().liveness.unwrap_or(Duration::MAX);
    let mut live = tokio::time::interval_at(
        tokio::time::Instant::now() + every.min(ONE_DAY),
        every.min(ONE_DAY),
    );
    live.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = tick.tick() => {
                let summary = prober.run_round().await;
                if let Some(r) = &summary.round {
                    debug!(
                        seq = r.seq,
                        probes = r.probes,
                        duration_ms = r.duration_ms,
                        reachable = summary.reachable,
                        "probe round"
                    );
                }
            }
            _ = live.tick(), if prober.config().liveness.is_some() => {
                let l = prober.liveness().await;
                if l.unanswered > 0 {
                    debug!(echoes = l.echoes, unanswered = l.unanswered, escalated = l.escalated, "liveness echoes");
                }
            }
        }
    }
}

/// A timer that never fires in practice (liveness echoes off).
const ONE_DAY: Duration = Duration::from_hours(24);
