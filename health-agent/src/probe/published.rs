//! The published status of the latest round, serialised once: its gzipped
//! JSON and its counts are written when it is published, and neither the
//! JSON nor the status itself is held whole. The nodes are taken from the
//! prober's paths a chunk at a time while the JSON is written, so at
//! 10,000 nodes the agent never holds a second copy of every path's state
//! (5.5 MB): a reader that wants the structured status builds it then
//! ([`super::Prober::status`]).

use std::{cell::RefCell, sync::Arc};

use bytes::Bytes;
use serde::{Serialize, Serializer, ser::SerializeSeq as _};

use super::{
    Prober,
    status::{EncryptionSummary, RoundInfo, StatusSummary},
    status_counts::StatusCounts,
};
use crate::{encryption::EncryptionView, membership::NodeSet};

/// Nodes taken at a time wherever every node's paths are read or written
/// (the status serialised, a round's results and every node's history;
/// twice as many targets for a round's MTU probes and flows): the
/// prober's paths are locked for a chunk only, never for all of them.
pub(crate) const CHUNK: usize = 256;

/// The published status, its JSON and its summary made once.
#[derive(Clone)]
pub(super) struct Published {
    /// `GET /v1/status?summary=true`, counted once (a count walks every
    /// node: at 10,000 nodes, asked for in a loop, it was most of the
    /// answer's cost); its `round` is the published round's.
    pub(super) summary: Arc<StatusSummary>,
    /// The status as gzipped JSON, written once when it is published: the
    /// JSON itself (4.7 MB at 5,000 nodes, ten times its gzip) is never
    /// held whole, neither kept nor built.
    pub(super) gzip: Bytes,
    /// What the metrics count over every node, counted as the JSON is
    /// written.
    pub(super) counts: Arc<StatusCounts>,
}

/// `ClusterStatus` as written: the same fields in the same order (its
/// JSON is the status's), the nodes streamed.
#[derive(Serialize)]
struct StatusOut<'a> {
    local_node: &'a Option<String>,
    probe_interval_ms: u64,
    probe_timeout_ms: u64,
    round: &'a Option<RoundInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    encryption: &'a Option<EncryptionSummary>,
    nodes: NodesOut<'a>,
}

/// The nodes of a status, made a chunk at a time and counted as they go.
struct NodesOut<'a> {
    prober: &'a Prober,
    nodes: &'a NodeSet,
    encryption: Option<&'a EncryptionView>,
    /// What the summary and the metrics count.
    counts: RefCell<StatusCounts>,
}

impl Serialize for NodesOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.nodes.len()))?;
        let mut counts = StatusCounts::default();
        for chunk in self.nodes.chunks(CHUNK) {
            for n in self.prober.node_statuses(chunk, self.encryption) {
                counts.add(&n);
                seq.serialize_element(&n)?;
            }
        }
        self.counts.replace(counts);
        seq.end()
    }
}

/// `value` as JSON, gzipped as it is written.
fn gzipped_json(value: &impl Serialize) -> Bytes {
    // Serialising the status cannot fail.
    let ((), bytes) = crate::util::gzip::gzipped(|out| {
        let _ = serde_json::to_writer(out, value);
    });
    // Sent whole to every client that asks: from a sealed file, without
    // a copy (`crate::sys::sealed`).
    crate::sys::sealed::bytes(bytes, c"health-status")
}

/// The status of `nodes` as the prober holds them now, with `round` and
/// `encryption`, serialised and counted.
pub(super) fn serialised(
    prober: &Prober,
    nodes: &NodeSet,
    round: Option<RoundInfo>,
    encryption: Option<&EncryptionView>,
) -> Published {
    let head = prober.head(round, encryption);
    let out = StatusOut {
        local_node: &head.local_node,
        probe_interval_ms: head.probe_interval_ms,
        probe_timeout_ms: head.probe_timeout_ms,
        round: &head.round,
        encryption: &head.encryption,
        nodes: NodesOut {
            prober,
            nodes,
            encryption,
            counts: RefCell::default(),
        },
    };
    let gzip = gzipped_json(&out);
    let counts = Arc::new(out.nodes.counts.take());
    let [reachable, unreachable, unknown] = counts.by_state;
    Published {
        summary: Arc::new(StatusSummary {
            local_node: head.local_node,
            round: head.round,
            encryption: head.encryption,
            nodes: nodes.len(),
            reachable,
            unreachable,
            unknown,
        }),
        gzip,
        counts,
    }
}
