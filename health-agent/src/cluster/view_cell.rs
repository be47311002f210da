//! The latest cluster view, as the agent's cluster-view task reads it
//! (the published view, with who assembled it and whether it is stale)
//! and the API serves it: its JSON made once per update, not per request.

use std::sync::{Arc, RwLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{contradiction::Contradiction, matrix::ClusterMatrix, view::ClusterView};

/// Who assembled the view shown, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assembly {
    /// The agent that assembled and published it.
    pub assembled_by: String,
    /// Whether that agent is this one.
    pub here: bool,
    /// Its assembler's round.
    pub round: u64,
    /// When it was assembled, ms since the epoch.
    pub at_ms: u64,
    /// Its assembler's probe interval, ms.
    pub interval_ms: u64,
    /// Its age when this answer was made, ms.
    pub age_ms: u64,
    /// Older than two of its assembler's rounds: not current.
    pub stale: bool,
    /// Nodes not healthy that the view counts but does not list (size).
    pub unlisted: u64,
    /// The etcd key it was read from.
    pub key: String,
}

/// What `GET /v1/cluster` serves: the view (its counts, and the nodes not
/// healthy with their evidence), who assembled it, and where it
/// contradicts this agent's own observations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReply {
    #[serde(flatten)]
    pub view: ClusterView,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assembly: Option<Assembly>,
    /// Nodes on which the view contradicts this agent's last rounds.
    #[serde(default)]
    pub contradictions: Vec<Contradiction>,
    /// Contradictions found since the agent started (one per node per
    /// view).
    #[serde(default)]
    pub contradictions_total: u64,
    /// Views refused since the agent started (undecodable, at another's
    /// key, from the future, of no node, or older than every view held).
    #[serde(default)]
    pub views_refused_total: u64,
    /// Values of the views' keys skipped since the agent started: a later
    /// value of their key came within the 250 ms between two batches read
    /// (a node writing its view key in a loop).
    #[serde(default)]
    pub views_skipped_total: u64,
}

/// What [`ClusterViewCell::matrix`] finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixAnswer {
    /// No view was read yet.
    NotPublished,
    /// The view was assembled by another agent, `by`, which serves it.
    Elsewhere { by: String },
    /// This agent assembled the view, which is stale now (`age_ms` old):
    /// its matrix is no current one.
    Stale { by: String, age_ms: u64 },
    /// The matrix of the current view, as JSON.
    Json(Bytes),
}

#[derive(Debug, Clone)]
struct Published {
    reply: Arc<ClusterReply>,
    json: Bytes,
    matrix: Option<Bytes>,
}

/// Shared between the task that reads the view and its readers.
#[derive(Debug, Clone, Default)]
pub struct ClusterViewCell {
    latest: Arc<RwLock<Option<Published>>>,
}

impl ClusterViewCell {
    /// Replaces the view and its matrix (serialised here, outside the
    /// lock). An agent that did not assemble the view has no matrix.
    pub fn publish(&self, reply: ClusterReply, matrix: Option<&ClusterMatrix>) {
        // Sent whole to every client that asks: from sealed files, without
        // a copy (`crate::sys::sealed`).
        let sealed = |json: Vec<u8>, name| crate::sys::sealed::bytes(json, name);
        let json = sealed(
            serde_json::to_vec(&reply).unwrap_or_default(),
            c"health-cluster",
        );
        let made = Published {
            reply: Arc::new(reply),
            json,
            matrix: matrix
                .map(|m| sealed(serde_json::to_vec(m).unwrap_or_default(), c"health-matrix")),
        };
        if let Ok(mut l) = self.latest.write() {
            *l = Some(made);
        }
    }

    /// The latest view, if one was read, its staleness as of now.
    #[must_use]
    pub fn reply(&self) -> Option<Arc<ClusterReply>> {
        self.current().map(|p| p.reply)
    }

    /// The latest view, made stale here once it is older than two of its
    /// assembler's rounds: the task that reads views may be kept waiting
    /// by etcd (an outage), and a view it read while current must not go
    /// on being served as current meanwhile.
    fn current(&self) -> Option<Published> {
        let latest = self.latest.read().ok()?.as_ref()?.clone();
        let now_ms = crate::util::timefmt::now_ms();
        let outdated = latest.reply.assembly.as_ref().is_some_and(|a| {
            !a.stale && super::published_view::is_stale(a.at_ms, a.interval_ms, now_ms)
        });
        if !outdated {
            return Some(latest);
        }
        let mut reply = (*latest.reply).clone();
        if let Some(a) = reply.assembly.as_mut() {
            a.stale = true;
            a.age_ms = now_ms.saturating_sub(a.at_ms);
        }
        let made = Published {
            json: Bytes::from(serde_json::to_vec(&reply).unwrap_or_default()),
            reply: Arc::new(reply),
            matrix: latest.matrix,
        };
        if let Ok(mut l) = self.latest.write() {
            *l = Some(made.clone());
        }
        Some(made)
    }

    /// The latest view's matrix, read with the view it belongs to (one
    /// read: never a matrix of one view said of another), its staleness
    /// as of now.
    #[must_use]
    pub fn matrix(&self) -> MatrixAnswer {
        let Some(p) = self.current() else {
            return MatrixAnswer::NotPublished;
        };
        let assembly = p.reply.assembly.as_ref();
        let by = assembly.map(|a| a.assembled_by.clone()).unwrap_or_default();
        match (p.matrix, assembly) {
            (None, _) => MatrixAnswer::Elsewhere { by },
            (Some(_), Some(a)) if a.stale => MatrixAnswer::Stale {
                by,
                age_ms: a.age_ms,
            },
            (Some(json), _) => MatrixAnswer::Json(json),
        }
    }

    /// The latest view as JSON, its staleness as of now.
    #[must_use]
    pub fn json(&self) -> Option<Bytes> {
        self.current().map(|p| p.json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(at_ms: u64, stale: bool) -> ClusterReply {
        ClusterReply {
            view: ClusterView {
                plaintext_nodes: Vec::new(),
                reports: 0,
                ignored: 0,
                counts: super::super::view::VerdictCounts::default(),
                nodes: Vec::new(),
            },
            assembly: Some(Assembly {
                assembled_by: "node-1".into(),
                here: false,
                round: 7,
                at_ms,
                interval_ms: 1_000,
                age_ms: 0,
                stale,
                unlisted: 0,
                key: "/health/view/node-1".into(),
            }),
            contradictions: Vec::new(),
            contradictions_total: 0,
            views_refused_total: 0,
            views_skipped_total: 0,
        }
    }

    fn served_stale(cell: &ClusterViewCell) -> bool {
        let json: ClusterReply =
            serde_json::from_slice(&cell.json().expect("a view")).expect("JSON");
        let reply = cell.reply().expect("a view");
        let a = json.assembly.expect("assembled");
        assert_eq!(Some(a.stale), reply.assembly.as_ref().map(|r| r.stale));
        a.stale
    }

    #[test]
    fn a_view_read_while_current_is_served_stale_once_it_is_old_whoever_updates_it() {
        let cell = ClusterViewCell::default();
        let now = crate::util::timefmt::now_ms();
        cell.publish(reply(now, false), None);
        assert!(!served_stale(&cell), "fresh");
        // Read three rounds ago and never updated since (the reading
        // task kept waiting by etcd): stale when served now.
        cell.publish(reply(now - 3_000, false), None);
        assert!(served_stale(&cell));
        let a = cell
            .reply()
            .and_then(|r| r.assembly.clone())
            .expect("assembled");
        assert!(a.age_ms >= 3_000, "{a:?}");
    }

    /// The matrix goes with its view: served while the view is current,
    /// refused once it is stale, and elsewhere when another agent made it.
    #[test]
    fn a_matrix_is_served_only_with_its_view_current() {
        let cell = ClusterViewCell::default();
        assert_eq!(cell.matrix(), MatrixAnswer::NotPublished);
        let matrix = ClusterMatrix {
            nodes: vec!["node-1".into()],
            rows: vec![".".into()],
            total: 1,
            truncated: false,
        };
        let now = crate::util::timefmt::now_ms();
        cell.publish(reply(now, false), Some(&matrix));
        let MatrixAnswer::Json(json) = cell.matrix() else {
            panic!("current: {:?}", cell.matrix());
        };
        assert!(json.starts_with(b"{\"nodes\":[\"node-1\"]"), "{json:?}");
        cell.publish(reply(now - 3_000, false), Some(&matrix));
        assert!(
            matches!(cell.matrix(), MatrixAnswer::Stale { ref by, age_ms } if by == "node-1" && age_ms >= 3_000),
            "{:?}",
            cell.matrix()
        );
        cell.publish(reply(now, false), None);
        assert_eq!(
            cell.matrix(),
            MatrixAnswer::Elsewhere {
                by: "node-1".into()
            }
        );
    }
}
