//! The cluster view: after each of its rounds the agent publishes a compact
//! summary ([`Summary`]) under its lease, at `<summaries prefix><node>`,
//! at most once per probe interval; it watches every agent's summaries
//! (applied one event at a time, never re-listed) and assembles the view
//! ([`view::assemble`]) once per interval, for `GET /v1/cluster`,
//! `status --cluster` and the connectivity page. An agent that stops
//! publishing drops out of the view when its lease ends, or after
//! [`STALE_ROUNDS`] intervals without a new summary.

use std::{borrow::Cow, collections::HashMap, sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::{
    cluster::{
        assigned::Assignments,
        matrix,
        subset::ProbePeers,
        summary::Summary,
        view::{self, ViewParams},
        view_cell::ClusterViewCell,
    },
    membership::{
        kvstore::{KvStore, WatchEvent},
        published::Nodes,
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
    /// `--probe-peers`: what each observer is assigned, and so may report.
    pub(super) peers: Option<ProbePeers>,
}

/// The most summary keys held: one per node of the largest node set
/// accepted (`--max-nodes`'s default). Summaries past it are refused and
/// reported, so that a writer of the prefix cannot make the agent hold
/// without bound.
pub const MAX_SUMMARIES: usize = 65_536;

/// How far ahead of the local clock a summary's time may be: two probe
/// intervals and this slack (clocks differ a little; a summary from the
/// far future would otherwise outlive every newer one).
const FUTURE_SLACK: Duration = Duration::from_secs(5);

/// Why a summary was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Decode(String),
    #[error(
        "a summary counts only at exactly <prefix><observer>: {observer:?} belongs at {expected:?}"
    )]
    Key { observer: String, expected: String },
    #[error("its time is {ahead_ms} ms ahead of this node's clock (at most {limit_ms} ms)")]
    Future { ahead_ms: u64, limit_ms: u64 },
    #[error("{cap} summaries are held already")]
    Full { cap: usize },
}

/// The summaries held, by key, and what was refused since the last report.
struct Held {
    prefix: Vec<u8>,
    by_key: HashMap<Vec<u8>, Summary>,
    /// The most keys held.
    cap: usize,
    /// How far ahead of now a summary's time may be, in ms.
    future_ms: u64,
    refused: usize,
    first_refusal: Option<String>,
}

impl Held {
    fn new(prefix: &str, interval: Duration, cap: usize) -> Self {
        Self {
            prefix: prefix.as_bytes().to_vec(),
            by_key: HashMap::new(),
            cap,
            future_ms: future_limit_ms(interval),
            refused: 0,
            first_refusal: None,
        }
    }

    /// Checks a summary against the rules: decodes, sits at exactly its
    /// observer's key, is not from the future, and fits.
    fn check(&self, key: &[u8], value: &[u8], now_ms: u64) -> Result<Summary, Refusal> {
        let s = Summary::decode(value).map_err(|e| Refusal::Decode(e.to_string()))?;
        let exact = key.strip_prefix(self.prefix.as_slice()) == Some(s.observer().as_bytes());
        if !exact {
            return Err(Refusal::Key {
                observer: s.observer().to_owned(),
                expected: format!("{}{}", String::from_utf8_lossy(&self.prefix), s.observer()),
            });
        }
        let ahead_ms = s.at_ms().saturating_sub(now_ms);
        if ahead_ms > self.future_ms {
            return Err(Refusal::Future {
                ahead_ms,
                limit_ms: self.future_ms,
            });
        }
        if self.by_key.len() >= self.cap && !self.by_key.contains_key(key) {
            return Err(Refusal::Full { cap: self.cap });
        }
        Ok(s)
    }

    fn put(&mut self, key: Vec<u8>, value: &[u8], now_ms: u64) {
        match self.check(&key, value, now_ms) {
            Ok(s) => {
                self.by_key.insert(key, s);
            }
            Err(e) => {
                self.by_key.remove(&key);
                self.refused += 1;
                self.first_refusal
                    .get_or_insert_with(|| format!("{:?}: {e}", String::from_utf8_lossy(&key)));
            }
        }
    }

    fn apply(&mut self, event: WatchEvent, now_ms: u64) {
        match event {
            WatchEvent::Snapshot { entries, .. } => {
                self.by_key.clear();
                for e in entries {
                    self.put(e.key, &e.value, now_ms);
                }
            }
            WatchEvent::Put(e) => self.put(e.key, &e.value, now_ms),
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
        // Taken outside the macro, whose arguments are evaluated only
        // when the warning is logged.
        let first = self.first_refusal.take().unwrap_or_default();
        if self.refused > 0 {
            warn!(
                refused = self.refused,
                "cluster view: summaries refused and left out (first: {first})"
            );
            self.refused = 0;
        }
    }
}

/// How far ahead of the local clock a summary may be: 2 × the probe
/// interval + [`FUTURE_SLACK`], in ms.
fn future_limit_ms(interval: Duration) -> u64 {
    u64::try_from((interval * 2 + FUTURE_SLACK).as_millis()).unwrap_or(u64::MAX)
}

impl ClusterViewTask {
    pub(super) async fn run(self, shutdown: CancellationToken) {
        let mut events = self.store.watch_prefix(self.prefix.clone().into_bytes());
        let mut published_seq = 0;
        let mut interval = self.prober.borrow().config().interval;
        let mut held = Held::new(&self.prefix, interval, MAX_SUMMARIES);
        let mut assignments = Assignments::default();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                event = events.recv() => match event {
                    Some(e) => held.apply(e, crate::util::timefmt::now_ms()),
                    None => break,
                },
                _ = tick.tick() => {
                    let prober = self.prober.borrow().clone();
                    if prober.config().interval != interval {
                        interval = prober.config().interval;
                        tick = tokio::time::interval(interval);
                        held.future_ms = future_limit_ms(interval);
                    }
                    published_seq = self.publish(&prober, published_seq).await;
                    held.report_refused();
                    self.assemble(&held, &mut assignments, interval);
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

    fn assemble(&self, held: &Held, assignments: &mut Assignments, interval: Duration) {
        let now_ms = crate::util::timefmt::now_ms();
        let stale = u64::try_from((interval * STALE_ROUNDS).as_millis()).unwrap_or(u64::MAX);
        let params = ViewParams {
            oldest_ms: now_ms.saturating_sub(stale),
            ..ViewParams::default()
        };
        let nodes = self.nodes.current();
        assignments.update(&nodes, self.peers);
        let (mut left_out, mut first) = (0, None);
        let summaries: Vec<Cow<'_, Summary>> = held
            .by_key
            .values()
            .map(|s| match assignments.restrict(s) {
                Some((restricted, n)) => {
                    left_out += n;
                    first.get_or_insert_with(|| s.observer().to_owned());
                    Cow::Owned(restricted)
                }
                None => Cow::Borrowed(s),
            })
            .collect();
        if let Some(first) = first {
            warn!(
                observations = left_out,
                "cluster view: observations of nodes their observer is not assigned were left out (first observer: {first:?})"
            );
        }
        let view = view::assemble(&nodes, summaries.iter().map(AsRef::as_ref), &params);
        let matrix = matrix::matrix(
            &nodes,
            summaries.iter().map(AsRef::as_ref),
            params.oldest_ms,
        );
        self.cell.publish(view, &matrix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::membership::kvstore::Entry;

    fn summary(observer: &str, at_ms: u64) -> Vec<u8> {
        Summary::new(observer.into(), 1, at_ms, Vec::new())
            .expect("summary")
            .encode()
    }

    fn put(key: &str, value: Vec<u8>) -> WatchEvent {
        WatchEvent::Put(Entry {
            key: key.as_bytes().to_vec(),
            value,
            mod_revision: 1,
            lease: 0,
        })
    }

    #[test]
    fn summaries_count_only_at_their_observers_key_and_not_from_the_future() {
        let now = 1_000_000;
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 3);
        assert_eq!(held.future_ms, 25_000);
        held.apply(put("/h/s/a", summary("a", now)), now);
        held.apply(put("/h/s/x/b", summary("b", now)), now);
        held.apply(put("/h/s/c", summary("a", now)), now);
        assert_eq!(held.by_key.len(), 1);
        assert_eq!(held.refused, 2);
        assert_eq!(
            held.first_refusal.as_deref(),
            Some(
                "\"/h/s/x/b\": a summary counts only at exactly <prefix><observer>: \"b\" belongs at \"/h/s/b\""
            )
        );
        // Within the limit ahead of the clock, and past it.
        held.apply(put("/h/s/d", summary("d", now + 25_000)), now);
        held.apply(put("/h/s/e", summary("e", now + 25_001)), now);
        assert!(held.by_key.contains_key(&b"/h/s/d"[..]));
        assert!(!held.by_key.contains_key(&b"/h/s/e"[..]));
        held.report_refused();
        held.apply(put("/h/s/e", summary("e", now + 25_001)), now);
        assert_eq!(
            held.first_refusal.as_deref(),
            Some("\"/h/s/e\": its time is 25001 ms ahead of this node's clock (at most 25000 ms)")
        );
        // An agent's summary that went to the future is dropped, not kept
        // at its old value.
        held.apply(put("/h/s/a", summary("a", now + 60_000)), now);
        assert!(!held.by_key.contains_key(&b"/h/s/a"[..]));
    }

    #[test]
    fn the_summaries_held_are_bounded_and_the_excess_reported() {
        let now = 1_000_000;
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 2);
        for name in ["a", "b", "c", "d"] {
            held.apply(put(&format!("/h/s/{name}"), summary(name, now)), now);
        }
        assert_eq!(held.by_key.len(), 2);
        assert_eq!(held.refused, 2);
        assert!(
            held.first_refusal
                .as_deref()
                .is_some_and(|r| r.ends_with(": 2 summaries are held already")),
            "{:?}",
            held.first_refusal
        );
        // A key already held is still updated when full.
        held.apply(put("/h/s/a", summary("a", now + 1)), now);
        assert_eq!(
            held.by_key.get(&b"/h/s/a"[..]).map(Summary::at_ms),
            Some(now + 1)
        );
    }

    #[test]
    fn summaries_sit_beside_the_node_records() {
        assert_eq!(summaries_prefix("/health/nodes/"), "/health/summaries/");
        assert_eq!(summaries_prefix("/health/nodes"), "/health/summaries/");
        assert_eq!(summaries_prefix("/a/b/c/"), "/a/b/summaries/");
        assert_eq!(summaries_prefix("nodes"), "nodes-summaries/");
    }
}
