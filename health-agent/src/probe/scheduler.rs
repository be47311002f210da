//! The probe loop: a round every probe interval (after the initial delay),
//! until shutdown. A round in flight at shutdown is abandoned: its probes
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
    loop {
        tick.tick().await;
        let status = prober.round().await;
        if let Some(r) = &status.round {
            debug!(
                seq = r.seq,
                probes = r.probes,
                duration_ms = r.duration_ms,
                reachable = status.reachable(),
                "probe round"
            );
        }
    }
}
