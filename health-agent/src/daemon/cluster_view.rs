//! The cluster view: after each of its rounds the agent publishes a compact
//! summary ([`Summary`]) under its lease, at `<summaries prefix><node>`,
//! at most once per probe interval; it watches every agent's summaries
//! (applied one event at a time, never re-listed) and assembles the view
//! ([`view::assemble`]) once per interval, for `GET /v1/cluster`,
//! `status --cluster` and the connectivity page. An agent that stops
//! publishing drops out of the view when its lease ends, or after
//! [`STALE_ROUNDS`] intervals without a new summary.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::{
    cluster::{
        discovery::Nodes,
        kvstore::{KvStore, WatchEvent},
        matrix,
        summary::Summary,
        view::{self, ViewParams},
        view_cell::ClusterViewCell,
    },
    probe::Prober,
    util::errors::chain,
};

/// Summaries older than this many probe intervals are left out.
pub const STALE_ROUNDS: u32 = 3;

/// The summaries' prefix beside the node records': `/health/nodes/` gives
/// `/health/summaries/`.
#[must_use]
pub fn summaries_prefix(node_prefix: &str) -> String {
    let trimmed = node_prefix.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((parent, _)) => format!("{parent}/summaries/"),
        None => format!("{trimmed}-summaries/"),
    }
}

#[derive(Clone)]
pub(super) struct ClusterViewTask {
    pub(super) store: KvStore,
    pub(super) prefix: String,
    pub(super) local: String,
    pub(super) prober: watch::Receiver<Arc<Prober>>,
    pub(super) nodes: Nodes,
    pub(super) cell: ClusterViewCell,
}

/// The summaries held, by key, and what was refused since the last report.
#[derive(Default)]
struct Held {
    by_key: HashMap<Vec<u8>, Summary>,
    refused: usize,
    first_refusal: Option<String>,
}

impl Held {
    fn put(&mut self, key: Vec<u8>, value: &[u8]) {
        match Summary::decode(value) {
            Ok(s) => {
                self.by_key.insert(key, s);
            }
            Err(e) => {
                self.by_key.remove(&key);
                self.refused += 1;
                self.first_refusal
                    .get_or_insert_with(|| format!("{}: {e}", String::from_utf8_lossy(&key)));
            }
        }
    }

    fn apply(&mut self, event: WatchEvent) {
        match event {
            WatchEvent::Snapshot { entries, .. } => {
                self.by_key.clear();
                for e in entries {
                    self.put(e.key, &e.value);
                }
            }
            WatchEvent::Put(e) => self.put(e.key, &e.value),
            WatchEvent::Delete { key, .. } => {
                self.by_key.remove(&key);
            }
            WatchEvent::Lost { error } => {
                debug!("cluster view: summaries watch lost: {}", chain(&*error));
            }
        }
    }

    /// One warning for every summary refused since the last one.
    fn report_refused(&mut self) {
        if self.refused > 0 {
            warn!(
                refused = self.refused,
                "cluster view: summaries that do not decode were left out (first: {})",
                self.first_refusal.take().unwrap_or_default()
            );
            self.refused = 0;
        }
    }
}

impl ClusterViewTask {
    pub(super) async fn run(self, shutdown: CancellationToken) {
        let mut events = self.store.watch_prefix(self.prefix.clone().into_bytes());
        let mut held = Held::default();
        let mut published_seq = 0;
        let mut interval = self.prober.borrow().config().interval;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                event = events.recv() => match event {
                    Some(e) => held.apply(e),
                    None => break,
                },
                _ = tick.tick() => {
                    let prober = self.prober.borrow().clone();
                    if prober.config().interval != interval {
                        interval = prober.config().interval;
                        tick = tokio::time::interval(interval);
                    }
                    published_seq = self.publish(&prober, published_seq).await;
                    held.report_refused();
                    self.assemble(&held, interval);
                }
            }
        }
    }

    /// Writes the summary of the prober's last round if it is newer than
    /// `published`; returns the round published last.
    async fn publish(&self, prober: &Prober, published: u64) -> u64 {
        let status = prober.status();
        let Some(seq) = status.round.as_ref().map(|r| r.seq) else {
            return published;
        };
        if seq == published {
            return published;
        }
        let summary = match Summary::from_status(&status) {
            Ok(s) => s,
            Err(e) => {
                warn!("cluster view: summarising round {seq}: {e}");
                return seq;
            }
        };
        let key = format!("{}{}", self.prefix, self.local);
        if let Err(e) = self.store.put_leased(key, summary.encode()).await {
            warn!("cluster view: publishing round {seq}: {}", chain(&e));
        }
        seq
    }

    fn assemble(&self, held: &Held, interval: Duration) {
        let now_ms = crate::util::timefmt::now_ms();
        let stale = u64::try_from((interval * STALE_ROUNDS).as_millis()).unwrap_or(u64::MAX);
        let params = ViewParams {
            oldest_ms: now_ms.saturating_sub(stale),
            ..ViewParams::default()
        };
        let nodes = self.nodes.current();
        let view = view::assemble(&nodes, held.by_key.values(), &params);
        let matrix = matrix::matrix(&nodes, held.by_key.values(), params.oldest_ms);
        self.cell.publish(view, &matrix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_sit_beside_the_node_records() {
        assert_eq!(summaries_prefix("/health/nodes/"), "/health/summaries/");
        assert_eq!(summaries_prefix("/health/nodes"), "/health/summaries/");
        assert_eq!(summaries_prefix("/a/b/c/"), "/a/b/summaries/");
        assert_eq!(summaries_prefix("nodes"), "nodes-summaries/");
    }
}
