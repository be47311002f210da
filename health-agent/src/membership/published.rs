//! The published node set: immutable [`NodeSet`] snapshots on a `watch`
//! channel (the one copy every reader shares), with the status of their
//! source (source, last error, rejected records) for the API. Every source
//! of [`super::discovery`] publishes here; one warning per update sums up
//! its rejected records.

use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::warn;

use super::{
    NodeSet,
    record::{MAX_REJECTED_SHOWN, RejectedRecord, Validated},
    routes::RefusedRoute,
};
use crate::util::timefmt::now_ms;

/// How the node set is doing: where it comes from and whether the latest
/// update was taken (`GET /v1/nodes` adds the set itself).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// `file:<path>`, `etcd:<endpoint><prefix>`, or `none`.
    pub source: String,
    /// Why the latest update was rejected (the set in use is the last good one).
    pub error: Option<String>,
    /// Epoch milliseconds of the last accepted update.
    pub updated_ms: Option<u64>,
    /// The records of the accepted update that were rejected, each with
    /// why (the first [`MAX_REJECTED_SHOWN`]).
    #[serde(default)]
    pub rejected: Vec<RejectedRecord>,
    /// How many records of the accepted update were rejected in all.
    #[serde(default)]
    pub rejected_total: usize,
    /// Peers' health addresses refused a route (outside the health range,
    /// inside a connected network, an etcd endpoint or the default
    /// gateway), each with why (the first [`MAX_REJECTED_SHOWN`]).
    #[serde(default)]
    pub refused_routes: Vec<RefusedRoute>,
    /// How many were refused in all.
    #[serde(default)]
    pub refused_routes_total: usize,
    /// With `--kvstore-allocations`: the health allocations that count for
    /// nothing (refused, or overlapping another), at their keys, each with
    /// why (the first [`MAX_REJECTED_SHOWN`], by name), whether or not
    /// their nodes have records.
    #[serde(default)]
    pub allocations_uncounted: Vec<RejectedRecord>,
    /// How many in all.
    #[serde(default)]
    pub allocations_uncounted_total: usize,
    /// With etcd: whether the last exchange with it succeeded (`None`
    /// before the first). A set refused whole (past `--max-nodes`, say)
    /// was read, so it leaves this true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
}

/// The published node set and the status of its source.
#[derive(Debug, Clone)]
pub struct Nodes {
    status: Arc<RwLock<SourceStatus>>,
    tx: watch::Sender<NodeSet>,
    /// Updates rejected as a whole since the agent started.
    rejected_updates: Arc<std::sync::atomic::AtomicU64>,
    /// This node's record written back since the agent started, by whose
    /// change it undid ([`REWRITTEN_AFTER`]).
    rewrites: Arc<[std::sync::atomic::AtomicU64; 4]>,
    /// The largest set taken (`--max-nodes`).
    limit: usize,
}

/// Whose change of this node's record a write-back undid, as the metric
/// labels it: the key deleted, written without a lease, under this
/// agent's own lease, or under another lease (most likely a second agent
/// given this node's name).
pub const REWRITTEN_AFTER: [&str; 4] = ["deleted", "no_lease", "own_lease", "other_lease"];

/// `--max-nodes`'s default: a node set larger than this is refused whole
/// (the last good set is kept), so that a writer of the nodes file or the
/// etcd prefix cannot make every agent probe and route without bound.
pub const DEFAULT_MAX_NODES: usize = 65_536;

impl Nodes {
    /// An empty set from `source` (`file:<path>`, `etcd:<endpoint><prefix>`
    /// or `none`).
    #[must_use]
    pub fn new(source: String) -> Self {
        Self {
            status: Arc::new(RwLock::new(SourceStatus {
                source,
                ..SourceStatus::default()
            })),
            tx: watch::Sender::new(NodeSet::default()),
            rejected_updates: Arc::default(),
            rewrites: Arc::default(),
            limit: DEFAULT_MAX_NODES,
        }
    }

    /// The same, taking sets of at most `max` nodes.
    #[must_use]
    pub fn with_max_nodes(mut self, max: usize) -> Self {
        self.limit = max;
        self
    }

    /// The most nodes a set may hold (`--max-nodes`).
    #[must_use]
    pub const fn max_nodes(&self) -> usize {
        self.limit
    }

    /// Updates rejected as a whole since the agent started.
    #[must_use]
    pub fn updates_rejected(&self) -> u64 {
        self.rejected_updates
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a write-back of this node's record undoing a change of the
    /// kind at `kind` in [`REWRITTEN_AFTER`].
    pub fn count_rewrite(&self, kind: usize) {
        if let Some(n) = self.rewrites.get(kind) {
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// This node's record written back since the agent started, by the
    /// kinds of [`REWRITTEN_AFTER`].
    #[must_use]
    pub fn rewrites(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.rewrites[i].load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The current snapshot (shared, not copied).
    #[must_use]
    pub fn current(&self) -> NodeSet {
        self.tx.borrow().clone()
    }

    /// A receiver of every new snapshot.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<NodeSet> {
        self.tx.subscribe()
    }

    #[must_use]
    pub fn status(&self) -> SourceStatus {
        self.status.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Records an accepted update and publishes its set (readers are
    /// woken only when it differs from the current one); its rejected
    /// records are summed up in one warning and listed in the status.
    pub fn accept(&self, update: Validated) -> bool {
        if update.nodes.len() > self.limit {
            self.reject(format!(
                "{} nodes, more than --max-nodes {}",
                update.nodes.len(),
                self.limit
            ));
            return false;
        }
        if let Some(summary) = update.summary() {
            warn!(rejected = update.rejected_total(), "{summary}");
        }
        if let Ok(mut s) = self.status.write() {
            s.error = None;
            s.connected = Some(true);
            s.updated_ms = Some(now_ms());
            s.rejected_total = update.rejected_total();
            s.rejected = update
                .rejected
                .iter()
                .take(MAX_REJECTED_SHOWN)
                .map(RejectedRecord::from)
                .collect();
        }
        let nodes = update.nodes;
        self.tx.send_if_modified(|cur| {
            if *cur == nodes {
                false
            } else {
                *cur = nodes;
                true
            }
        });
        true
    }

    /// Lists the peers' health addresses the last route sync refused.
    pub fn set_refused_routes(&self, mut refused: Vec<RefusedRoute>) {
        if let Ok(mut s) = self.status.write() {
            s.refused_routes_total = refused.len();
            refused.truncate(MAX_REJECTED_SHOWN);
            s.refused_routes = refused;
        }
    }

    /// Lists the health allocations that count for nothing; a change in
    /// them is warned about once.
    pub fn set_allocations_uncounted(&self, shown: Vec<RejectedRecord>, total: usize) {
        if let Ok(mut s) = self.status.write() {
            if s.allocations_uncounted != shown || s.allocations_uncounted_total != total {
                if let Some(first) = shown.first() {
                    let (n, count) = if total == 1 {
                        ("1 health allocation".to_owned(), "counts")
                    } else {
                        (format!("{total} health allocations"), "count")
                    };
                    warn!(
                        uncounted = total,
                        "{n} {count} for nothing (GET /v1/nodes lists them); first: {:?}: {:?}",
                        first.record,
                        first.reason
                    );
                } else {
                    tracing::info!("every health allocation counts again");
                }
            }
            s.allocations_uncounted = shown;
            s.allocations_uncounted_total = total;
        }
    }

    /// Records an update rejected as a whole; the last good set stays (and
    /// so does the list of its rejected records).
    pub fn reject(&self, error: String) {
        self.rejected(error, true);
    }

    /// Records that the source cannot be read (etcd unreachable, say):
    /// the last good set stays, and the source reads not connected until
    /// an update is read again, taken or refused.
    pub fn unreachable(&self, error: String) {
        self.rejected(error, false);
    }

    fn rejected(&self, error: String, connected: bool) {
        warn!("node set update rejected, keeping the last good set: {error}");
        self.rejected_updates
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut s) = self.status.write() {
            s.error = Some(error);
            s.connected = Some(connected);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::membership::Node;

    fn update(n: u8) -> Validated {
        Validated {
            nodes: NodeSet::new(
                (0..n)
                    .map(|i| {
                        Node::v4(
                            format!("n{i}"),
                            Ipv4Addr::new(198, 18, 0, i),
                            Ipv4Addr::new(198, 18, 64, i),
                        )
                    })
                    .collect(),
            )
            .expect("unique"),
            rejected: Vec::new(),
            unheld: 0,
        }
    }

    #[test]
    fn a_set_larger_than_max_nodes_keeps_the_last_good_one_and_says_why() {
        let nodes = Nodes::new("file:x".into()).with_max_nodes(3);
        nodes.accept(update(3));
        assert_eq!(nodes.current().len(), 3);
        nodes.accept(update(4));
        assert_eq!(nodes.current().len(), 3, "the last good set is kept");
        assert_eq!(
            nodes.status().error.as_deref(),
            Some("4 nodes, more than --max-nodes 3")
        );
        assert_eq!(nodes.updates_rejected(), 1);
        nodes.accept(update(2));
        assert_eq!(nodes.current().len(), 2);
        assert_eq!(nodes.status().error, None);
    }

    /// A set refused whole was read: the source is connected. Only an
    /// exchange that failed says it is not.
    #[test]
    fn a_refused_set_leaves_the_source_connected_and_a_failed_read_does_not() {
        let nodes = Nodes::new("etcd:x".into()).with_max_nodes(3);
        assert_eq!(nodes.status().connected, None);
        nodes.accept(update(4));
        assert_eq!(nodes.status().connected, Some(true));
        nodes.unreachable("etcd at x: unavailable".into());
        assert_eq!(nodes.status().connected, Some(false));
        nodes.accept(update(2));
        assert_eq!(nodes.status().connected, Some(true));
    }
}
