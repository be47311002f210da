//! The cluster view as an N×N matrix, observers by targets, for the
//! connectivity page: each cell one character, a row a string, so a
//! 1,000-node matrix is about a megabyte of JSON made once per view.

use std::{borrow::Borrow, collections::HashMap};

use serde::{Deserialize, Serialize};

use crate::probe::path::ProbeResult;
use crate::{
    cluster::summary::{PeerSummary, Summary},
    membership::NodeSet,
};

/// The most nodes a matrix shows (the first by name); `total` says how many
/// there are.
pub const MAX_MATRIX_NODES: usize = 1000;

/// Every path succeeds.
pub const REACHED: u8 = b'S';
/// Every path failed: by its state, or by its last probe while below the
/// prober's failure threshold (as the node-down verdict reads it), none
/// of them in one address family only.
pub const FAILED: u8 = b'F';
/// Some path failed (every one, some in one address family only,
/// included).
pub const DEGRADED: u8 = b'D';
/// No failure, some path not known yet.
pub const UNKNOWN: u8 = b'?';
/// Not probed by the observer, or the observer publishes no summary.
pub const NOT_PROBED: u8 = b'.';

/// `GET /v1/cluster/matrix`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMatrix {
    /// Observers and targets alike, by name.
    pub nodes: Vec<String>,
    /// `rows[i][j]`: what `nodes[i]` saw of `nodes[j]` in its last round.
    pub rows: Vec<String>,
    /// Nodes in the set (more than `nodes` when truncated).
    pub total: usize,
    pub truncated: bool,
}

fn cell(p: &PeerSummary) -> u8 {
    let paths = p.paths();
    let states = paths.map(|s| s.state);
    if paths
        .iter()
        .all(|s| (s.state == ProbeResult::Failure || s.failing) && !s.split)
    {
        FAILED
    } else if states.contains(&ProbeResult::Failure) {
        DEGRADED
    } else if states.contains(&ProbeResult::Unknown) {
        UNKNOWN
    } else {
        REACHED
    }
}

/// The matrix of `nodes` (the first [`MAX_MATRIX_NODES`]) from the newest
/// summary of each observer current by `(oldest_ms, now_ms)`
/// ([`Summary::current`]). O(N + observations) besides the N² cells.
#[must_use]
pub fn matrix<S: Borrow<Summary>>(
    nodes: &NodeSet,
    summaries: impl IntoIterator<Item = S>,
    (oldest_ms, now_ms): (u64, u64),
) -> ClusterMatrix {
    let shown = nodes.len().min(MAX_MATRIX_NODES);
    let index: HashMap<&str, usize> = nodes
        .iter()
        .take(shown)
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut newest: Vec<Option<S>> = (0..shown).map(|_| None).collect();
    for s in summaries {
        let sb = s.borrow();
        if !sb.current(oldest_ms, now_ms) {
            continue;
        }
        if let Some(&i) = index.get(sb.observer()) {
            let newer = newest[i]
                .as_ref()
                .is_none_or(|held| held.borrow().at_ms() <= sb.at_ms());
            if newer {
                newest[i] = Some(s);
            }
        }
    }
    let rows = newest
        .iter()
        .map(|s| {
            let mut row = vec![NOT_PROBED; shown];
            for p in s.iter().flat_map(|s| s.borrow().peers()) {
                if let Some(&j) = index.get(&*p.name) {
                    row[j] = cell(p);
                }
            }
            // Only ASCII was written.
            String::from_utf8(row).unwrap_or_default()
        })
        .collect();
    ClusterMatrix {
        nodes: nodes.iter().take(shown).map(|n| n.name.clone()).collect(),
        rows,
        total: nodes.len(),
        truncated: nodes.len() > shown,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        cluster::summary::{PathSample, PeerSummary},
        membership::Node,
    };

    fn set(n: u8) -> NodeSet {
        NodeSet::new(
            (0..n)
                .map(|i| Node {
                    name: format!("n{i}"),
                    node_ip: Some(Ipv4Addr::new(198, 18, 0, i + 1)),
                    health_ip: Some(Ipv4Addr::new(198, 19, 0, i + 1)),
                    node_ip6: None,
                    health_ip6: None,
                    zone: None,
                })
                .collect(),
        )
        .expect("unique")
    }

    fn peer(name: &str, states: [ProbeResult; 4]) -> PeerSummary {
        PeerSummary::new(name, states.map(|s| PathSample::new(s, Some(100))))
    }

    #[test]
    fn cells_say_what_each_observer_saw() {
        use ProbeResult::{Failure as F, Success as S, Unknown as U};
        let nodes = set(4);
        let n0 = Summary::new(
            "n0".into(),
            7,
            1_000,
            vec![
                peer("n0", [S; 4]),
                peer("n1", [F; 4]),
                peer("n2", [S, F, S, S]),
                peer("n3", [S, U, S, S]),
                peer("gone", [S; 4]),
            ],
        )
        .expect("summary");
        let n1_old = Summary::new("n1".into(), 1, 10, vec![peer("n0", [F; 4])]).expect("old");
        // Failing paths (the last probe failed, below the threshold): all
        // of them, or with failures, is a failed cell; one alone is not.
        let failing = PathSample::FAILING;
        let failed = PathSample::new(F, None);
        let ok = PathSample::new(S, Some(100));
        let n1 = Summary::new(
            "n1".into(),
            2,
            1_000,
            vec![
                peer("n0", [S; 4]),
                PeerSummary::new("n2", [failing, failing, failed, failing]),
                PeerSummary::new("n3", [failing, ok, ok, ok]),
            ],
        )
        .expect("n1");
        let stale = Summary::new("n2".into(), 1, 5, vec![peer("n0", [S; 4])]).expect("stale");
        // Every path failed, over one address family only: degraded.
        let n3 = Summary::new(
            "n3".into(),
            3,
            1_000,
            vec![PeerSummary::new("n0", [failed.with_split(true); 4])],
        )
        .expect("n3");
        let m = matrix(&nodes, [&n1_old, &n0, &n1, &stale, &n3], (100, 0));
        assert_eq!(m.nodes, ["n0", "n1", "n2", "n3"]);
        assert_eq!(m.rows, ["SFD?", "S.FS", "....", "D..."]);
        assert_eq!((m.total, m.truncated), (4, false));
    }

    #[test]
    fn large_sets_are_cut_to_the_first_nodes() {
        let nodes = NodeSet::new(
            (0..1200u32)
                .map(|i| Node {
                    name: format!("n{i:04}"),
                    node_ip: Some(Ipv4Addr::from(0xC612_0000 + i + 1)),
                    health_ip: Some(Ipv4Addr::from(0xC613_0000 + i + 1)),
                    node_ip6: None,
                    health_ip6: None,
                    zone: None,
                })
                .collect(),
        )
        .expect("unique");
        let m = matrix::<&Summary>(&nodes, [], (0, 0));
        assert_eq!(m.nodes.len(), MAX_MATRIX_NODES);
        assert!(m.rows.iter().all(|r| r.len() == MAX_MATRIX_NODES));
        assert_eq!((m.total, m.truncated), (1200, true));
    }
}
