//! The status as the API reads it. Publishing (once a round, or when the
//! node set changes) keeps the counts and the gzipped JSON, made from the
//! paths a chunk of nodes at a time; the structured status, its head and
//! one node's status are made from the paths when asked.

use std::sync::Arc;

use bytes::Bytes;

use super::{Prober, ms};
use crate::probe::{
    family::Shown,
    published::{CHUNK, Published, serialised},
    status::{ClusterStatus, NodeStatus, RoundInfo, StatusSummary},
    status_counts::StatusCounts,
    targets::{NodePaths, node_status},
};
use crate::{encryption::EncryptionView, membership::Node, util::json_list};

impl Prober {
    /// `self` with its status (no node, no round yet) published.
    pub(super) fn with_status_published(self: Arc<Self>) -> Arc<Self> {
        self.publish(None, true);
        self
    }

    fn published(&self) -> Published {
        self.published
            .read()
            .map_or_else(|p| p.into_inner().clone(), |s| s.clone())
    }

    /// The status of the published round, made now from the paths (never
    /// waits for a round): the published JSON
    /// ([`Self::status_json_gzip`]) and counts ([`Self::status_summary`])
    /// are kept, the structured status is not (at 10,000 nodes it is a
    /// second copy of every path's state).
    #[must_use]
    pub fn status(&self) -> Arc<ClusterStatus> {
        Arc::new(self.snapshot(self.status_summary().round.clone()))
    }

    /// The published round's status with only the nodes `keep` takes, as
    /// JSON made a chunk of nodes at a time as the pieces are taken: a
    /// client that reads slowly holds one chunk's JSON, never the whole
    /// answer (`?state=success` at 10,000 nodes is about 9 MB of it). The
    /// round and the node set are those published when asked; each
    /// chunk's paths are read from the prober in service (`current`: a
    /// reload meanwhile lets the old one go) as its piece is made. `None`:
    /// the status has no list of nodes to fill, which never happens.
    pub fn status_where_pieces(
        current: impl Fn() -> Arc<Self> + Send + 'static,
        keep: impl Fn(&NodeStatus) -> bool + Send + 'static,
    ) -> Option<impl Iterator<Item = Bytes> + Send + 'static> {
        let (nodes, head) = {
            let prober = current();
            let encryption = prober.cfg.encryption.as_ref().map(|e| e.view());
            let round = prober.status_summary().round.clone();
            (prober.nodes(), prober.head(round, encryption.as_deref()))
        };
        let chunks = json_list::ranges(nodes.len(), CHUNK).map(move |r| {
            let prober = current();
            let encryption = prober.cfg.encryption.as_ref().map(|e| e.view());
            let statuses = prober.node_statuses(&nodes[r], encryption.as_deref());
            json_list::chunk(statuses.iter().filter(|n| keep(n)))
        });
        // A head serialises: it holds nothing but strings and numbers.
        let empty = serde_json::to_vec(&head).ok()?;
        json_list::pieces(empty, "nodes", chunks)
    }

    /// The published round's status without its nodes.
    #[must_use]
    pub fn status_head(&self) -> ClusterStatus {
        let encryption = self.cfg.encryption.as_ref().map(|e| e.view());
        self.head(self.status_summary().round.clone(), encryption.as_deref())
    }

    /// The status of the node named `name` in the published round, made
    /// now; `None`: no such node.
    #[must_use]
    pub fn node_status(&self, name: &str) -> Option<NodeStatus> {
        let nodes = self.nodes();
        let node = nodes.get(name)?;
        let encryption = self.cfg.encryption.as_ref().map(|e| e.view());
        self.node_statuses(std::slice::from_ref(node), encryption.as_deref())
            .pop()
    }

    /// The published status's counts (made when it was published).
    #[must_use]
    pub fn status_summary(&self) -> Arc<StatusSummary> {
        self.published().summary
    }

    /// What the metrics count over the published status's nodes (counted
    /// when it was published), with that status's summary: one publish's.
    #[must_use]
    pub fn status_counts(&self) -> (Arc<StatusSummary>, Arc<StatusCounts>) {
        let p = self.published();
        (p.summary, p.counts)
    }

    /// The published status as JSON, for a client that does not take
    /// gzip: decompressed from [`Self::status_json_gzip`] for each.
    #[must_use]
    pub fn status_json(&self) -> Bytes {
        let gz = self.status_json_gzip();
        let mut plain = Vec::with_capacity(gz.len() * 10);
        // The bytes were compressed here: they decompress.
        let _ = std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain);
        Bytes::from(plain)
    }

    /// The published status as gzipped JSON, made once when it was
    /// published: a 5,000-node status is 4.7 MB of JSON and about a tenth
    /// of that gzipped.
    #[must_use]
    pub fn status_json_gzip(&self) -> Bytes {
        self.published().gzip
    }

    /// The status of the round `round` as the paths are now.
    pub(super) fn snapshot(&self, round: Option<RoundInfo>) -> ClusterStatus {
        let nodes = self.nodes();
        let encryption = self.cfg.encryption.as_ref().map(|e| e.view());
        let mut status = self.head(round, encryption.as_deref());
        for chunk in nodes.chunks(CHUNK) {
            status
                .nodes
                .extend(self.node_statuses(chunk, encryption.as_deref()));
        }
        status
    }

    /// A status of `round` without its nodes.
    pub(in crate::probe) fn head(
        &self,
        round: Option<RoundInfo>,
        encryption: Option<&EncryptionView>,
    ) -> ClusterStatus {
        ClusterStatus {
            local_node: self.cfg.local_node.clone(),
            probe_interval_ms: ms(self.cfg.interval),
            probe_timeout_ms: ms(self.cfg.timeout),
            round,
            encryption: encryption.map(|v| crate::probe::status::EncryptionSummary {
                device: v.device.clone(),
                error: v.error.clone(),
                paths: v
                    .counts()
                    .into_iter()
                    .map(|(s, n)| (s.name().to_owned(), n))
                    .collect(),
            }),
            nodes: Vec::new(),
        }
    }

    /// The status of each of `nodes` as the paths are now (one lock of
    /// the paths for all of them).
    pub(crate) fn node_statuses(
        &self,
        nodes: &[Node],
        encryption: Option<&EncryptionView>,
    ) -> Vec<NodeStatus> {
        let paths = self.paths.lock();
        let unknown = NodePaths::default();
        nodes
            .iter()
            .map(|n| {
                let p = paths
                    .as_ref()
                    .ok()
                    .and_then(|p| p.get(n.name.as_str()))
                    .unwrap_or(&unknown);
                let mut s = node_status(n, p, Shown::of(n, self.cfg.families));
                if let Some(view) = encryption {
                    for c in s.connectivities_mut() {
                        c.encryption = view.paths.get(&c.ip).cloned().map(Box::new);
                    }
                }
                s
            })
            .collect()
    }

    /// Publishes the paths as they are now, as round `round`, unless a
    /// round that started later is already published (`force`: a
    /// node-set change, published with the newest round's info).
    ///
    /// One publish at a time, from the check to the write: a node-set
    /// change that read round 4 while round 5 was being published could
    /// otherwise write round 4 back over it, the published round going
    /// back while the round number its waiters follow did not.
    pub(crate) fn publish(&self, round: Option<RoundInfo>, force: bool) {
        let _one = self
            .publishing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Publish::As(round) = publishable(round, self.status_summary().round.clone(), force)
        else {
            return;
        };
        // Serialised outside the readers' lock: they keep the old one
        // meanwhile. The node set is read here, under the publishing
        // lock, so the last publish shows the last set.
        let nodes = self.nodes();
        let encryption = self.cfg.encryption.as_ref().map(|e| e.view());
        let made = serialised(self, &nodes, round, encryption.as_deref());
        let seq = made.summary.round.as_ref().map(|r| r.seq);
        if let Ok(mut published) = self.published.write() {
            *published = made;
        }
        if let Some(seq) = seq {
            self.published_seq.send_if_modified(|newest| {
                let later = seq > *newest;
                if later {
                    *newest = seq;
                }
                later
            });
        }
    }
}

/// What a publish does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Publish {
    /// Nothing: a later round is published.
    Nothing,
    /// The paths as they are now, as this round (`None`: before any).
    As(Option<RoundInfo>),
}

/// What to publish, asked to publish `round` (`force`: whatever the
/// round) with `published` the round published now. A round never goes
/// back: an older one is not published, and a forced publish of it shows
/// the newer one's info.
fn publishable(round: Option<RoundInfo>, published: Option<RoundInfo>, force: bool) -> Publish {
    let published = match (round, published) {
        (Some(new), Some(old)) if new.seq < old.seq => Some(old),
        (None, Some(old)) => Some(old),
        (None, None) => None,
        (new, _) => return Publish::As(new),
    };
    if force {
        Publish::As(published)
    } else {
        Publish::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(seq: u64) -> RoundInfo {
        RoundInfo {
            seq,
            started_ms: seq * 1000,
            duration_ms: 10,
            probes: 4,
        }
    }

    #[test]
    fn a_published_round_never_goes_back() {
        let five = Publish::As(Some(info(5)));
        // A later round, or the same one again: published.
        assert_eq!(publishable(Some(info(5)), Some(info(4)), false), five);
        assert_eq!(publishable(Some(info(5)), Some(info(5)), false), five);
        assert_eq!(
            publishable(Some(info(1)), None, false),
            Publish::As(Some(info(1)))
        );
        // An older one: not, unless forced, and then with the newer info.
        assert_eq!(
            publishable(Some(info(4)), Some(info(5)), false),
            Publish::Nothing
        );
        assert_eq!(publishable(Some(info(4)), Some(info(5)), true), five);
        assert_eq!(publishable(None, Some(info(5)), true), five);
        assert_eq!(publishable(None, Some(info(5)), false), Publish::Nothing);
        // Before any round: only a forced publish (a node-set change).
        assert_eq!(publishable(None, None, true), Publish::As(None));
        assert_eq!(publishable(None, None, false), Publish::Nothing);
    }

    #[test]
    fn a_node_set_change_that_read_an_older_round_keeps_the_newer_one() {
        use crate::{membership::NodeSet, probe::ProbeConfig};
        let prober = Prober::new(ProbeConfig::default());
        prober.set_nodes(NodeSet::named(&["a", "b"]));
        let mut rounds = prober.published_rounds();
        prober.publish(Some(info(4)), false);
        prober.publish(Some(info(5)), false);
        // The node-set change's publish, with the round it read before
        // round 5 was published.
        prober.publish(Some(info(4)), true);
        assert_eq!(
            prober.status_summary().round.as_ref().map(|r| r.seq),
            Some(5)
        );
        assert_eq!(*rounds.borrow_and_update(), 5);
        // A round that ended late, after a later one: not published.
        prober.publish(Some(info(3)), false);
        assert_eq!(
            prober.status_summary().round.as_ref().map(|r| r.seq),
            Some(5)
        );
    }
}
