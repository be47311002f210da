//! The two roles of the load: an agent putting its summary every interval,
//! and a watcher of every agent's summaries.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::bail;
use etcd_client::{Client, EventType, PutOptions, WatchStream};
use health_agent::{
    cluster::summary::Summary, membership::kvstore::REQUEST_TIMEOUT, util::timefmt::now_ms,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::measure::{Seen, Shared};

/// One agent's puts: its summary with its lease every `interval` from
/// `start + phase` until `end` (it returns then, not at its next put).
/// Returns the puts acknowledged.
pub(super) async fn agent(
    i: usize,
    client: Client,
    lease: i64,
    (start, phase, end, interval): (Instant, Duration, Instant, Duration),
    shared: Arc<Shared>,
) -> anyhow::Result<u64> {
    let mut kv = client.kv_client();
    let key = shared.cluster.key(i);
    let mut acked = 0;
    let mut at = start + phase;
    let mut seq = 0;
    // Ctrl-C ends the run early (the caller then stops).
    while at < end && !crate::stop::requested() {
        tokio::time::sleep_until(at).await;
        seq += 1;
        let value = shared.cluster.summary(i, seq, now_ms())?;
        let len = value.len() as u64;
        shared.bytes_total.fetch_add(len, Ordering::Relaxed);
        shared.bytes_min.fetch_min(len, Ordering::Relaxed);
        shared.bytes_max.fetch_max(len, Ordering::Relaxed);
        let sent = shared.now_us();
        shared.sent.record(i, seq, sent);
        let put = kv.put(
            key.clone(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        );
        if let Ok(Ok(_)) = tokio::time::timeout(REQUEST_TIMEOUT, put).await {
            shared.puts.fetch_add(1, Ordering::Relaxed);
            shared
                .put_latency
                .record(shared.now_us().saturating_sub(sent));
            acked += 1;
        } else {
            shared.put_errors.fetch_add(1, Ordering::Relaxed);
        }
        // The next interval; a put that took longer delays the next one
        // (as the agent's ticker: `MissedTickBehavior::Delay`).
        at = (at + interval).max(Instant::now());
    }
    Ok(acked)
}

/// One watcher: every delivery's latency and bookkeeping, until `stop`.
pub(super) async fn watcher(
    w: usize,
    mut stream: WatchStream,
    stop: CancellationToken,
    shared: Arc<Shared>,
) -> anyhow::Result<Seen> {
    let cluster = &shared.cluster;
    let mut seen = Seen {
        per_agent: vec![(0, 0); cluster.len()],
        deliveries: 0,
        out_of_order: 0,
        invalid: 0,
        unstamped: 0,
    };
    loop {
        let msg = tokio::select! {
            biased;
            m = stream.message() => m?,
            () = stop.cancelled() => break,
        };
        let Some(resp) = msg else {
            bail!("the watch ended");
        };
        if resp.canceled() {
            bail!("the watch was canceled: {}", resp.cancel_reason());
        }
        let now = shared.now_us();
        for ev in resp.events() {
            let Some(kv) = ev.kv().filter(|_| ev.event_type() == EventType::Put) else {
                continue;
            };
            seen.deliveries += 1;
            shared.delivered.fetch_add(1, Ordering::Relaxed);
            let (Some(&agent), Some(seq)) = (
                cluster.by_key.get(kv.key()),
                Summary::decode(kv.value()).ok().map(|s| s.seq()),
            ) else {
                seen.invalid += 1;
                continue;
            };
            if w == 0
                && !Summary::decode(kv.value())
                    .is_ok_and(|s| s.observer() == cluster.names[agent] && s.seq() == seq)
            {
                seen.invalid += 1;
            }
            let (last, count) = &mut seen.per_agent[agent];
            if seq <= *last {
                seen.out_of_order += 1;
            }
            *last = seq.max(*last);
            *count += 1;
            match shared.sent.get(agent, seq) {
                Some(sent) => shared.delivery.record(now.saturating_sub(sent)),
                None => seen.unstamped += 1,
            }
        }
    }
    Ok(seen)
}
