//! What an observer may report on: the peers its subset plan assigns to it
//! ([`super::subset`]). A summary's observations of other nodes are left
//! out before the view is assembled, so that an agent (or anyone writing
//! its summary key) cannot speak about nodes it does not probe.
//!
//! Cost: an observer's assignment is one pass over the node set, O(N),
//! computed when its summary is first checked against a node set and kept
//! until the set changes (about K + zone indices per observer). In a full
//! mesh every node is assigned and nothing is computed.

use std::collections::HashMap;

use crate::{
    cluster::{
        subset::{ProbePeers, SubsetPlan},
        summary::Summary,
    },
    membership::NodeSet,
};

/// The observers' assignments over one node set.
#[derive(Debug, Default)]
pub struct Assignments {
    /// The set and the `--probe-peers` the assignments are for, once set.
    over: Option<(NodeSet, Option<ProbePeers>)>,
    /// `None`: a full mesh (every node assigned to every observer).
    plan: Option<SubsetPlan>,
    /// By observer: its assigned peers' indices in the set, sorted.
    by_observer: HashMap<String, Vec<u32>>,
}

impl Assignments {
    /// Starts over when `nodes` or `peers` differ from the last call's.
    pub fn update(&mut self, nodes: &NodeSet, peers: Option<ProbePeers>) {
        if self
            .over
            .as_ref()
            .is_some_and(|(n, p)| n == nodes && *p == peers)
        {
            return;
        }
        self.over = Some((nodes.clone(), peers));
        self.by_observer.clear();
        self.plan = (!self.is_full_mesh()).then(|| SubsetPlan::new(nodes));
    }

    fn nodes(&self) -> &NodeSet {
        static EMPTY: std::sync::LazyLock<NodeSet> = std::sync::LazyLock::new(NodeSet::default);
        self.over.as_ref().map_or(&EMPTY, |(n, _)| n)
    }

    fn peers(&self) -> ProbePeers {
        let n = self.nodes().len();
        self.over
            .as_ref()
            .and_then(|(_, p)| *p)
            .unwrap_or_else(|| ProbePeers::default_for(n))
    }

    fn is_full_mesh(&self) -> bool {
        self.peers().is_full_mesh(self.nodes().len())
    }

    /// `summary` without its observations of nodes the observer is not
    /// assigned, and how many were left out; `None` when none was.
    pub fn restrict(&mut self, summary: &Summary) -> Option<(Summary, usize)> {
        let peers = self.peers();
        let (plan, (nodes, _)) = (self.plan.as_ref()?, self.over.as_ref()?);
        let me = summary.observer();
        let zone = nodes.get(me).and_then(|n| n.zone.as_deref());
        let assigned = self.by_observer.entry(me.to_owned()).or_insert_with(|| {
            let mut v: Vec<u32> = plan
                .assigned(me, zone, nodes, peers)
                .into_iter()
                .filter_map(|i| u32::try_from(i).ok())
                .collect();
            v.sort_unstable();
            v
        });
        let is_assigned = |name: &str| {
            nodes
                .binary_search_by(|n| n.name.as_str().cmp(name))
                .ok()
                .and_then(|i| u32::try_from(i).ok())
                .is_some_and(|i| assigned.binary_search(&i).is_ok())
        };
        let left_out = summary
            .peers()
            .iter()
            .filter(|p| !is_assigned(&p.name))
            .count();
        if left_out == 0 {
            return None;
        }
        Some((summary.keeping(|p| is_assigned(&p.name)), left_out))
    }
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use super::*;
    use crate::{
        cluster::{
            subset,
            summary::{PathSample, PeerSummary},
        },
        membership::Node,
        probe::path::ProbeResult,
    };

    fn set(n: u32) -> NodeSet {
        NodeSet::new(
            (0..n)
                .map(|i| {
                    Node::v4(
                        format!("n{i:03}"),
                        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i),
                        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + i),
                    )
                })
                .collect(),
        )
        .expect("unique")
    }

    fn about(name: &str) -> PeerSummary {
        let ok = PathSample::new(ProbeResult::Success, Some(100));
        PeerSummary {
            name: name.into(),
            paths: [ok; 4],
        }
    }

    #[test]
    fn observations_of_unassigned_nodes_are_left_out() {
        let nodes = set(200);
        let peers = Some(ProbePeers::Count(8));
        let mut a = Assignments::default();
        a.update(&nodes, peers);
        let mine = subset::assigned("n000", None, &nodes, ProbePeers::Count(8));
        let assigned: Vec<PeerSummary> = mine
            .iter()
            .filter(|&&i| i != 0)
            .map(|&i| about(&nodes[i].name))
            .collect();
        let honest = Summary::new("n000".into(), 1, 1, assigned.clone()).expect("summary");
        assert!(a.restrict(&honest).is_none(), "nothing to leave out");
        // The same, plus reports on every other node.
        let all: Vec<PeerSummary> = nodes.iter().skip(1).map(|n| about(&n.name)).collect();
        let liar = Summary::new("n000".into(), 2, 2, all)
            .expect("summary")
            .with_cadence(Duration::from_secs(300));
        let (kept, left_out) = a.restrict(&liar).expect("restricted");
        assert_eq!(left_out, 199 - assigned.len());
        assert_eq!(kept.peers(), honest.peers());
        assert_eq!((kept.seq(), kept.at_ms()), (2, 2));
        assert_eq!(
            kept.cadence_ms(),
            300_000,
            "judged at its own cadence still"
        );
        // A full mesh assigns everyone.
        a.update(&nodes, Some(ProbePeers::All));
        assert!(a.restrict(&liar).is_none());
    }
}
