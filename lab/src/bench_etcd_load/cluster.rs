//! The simulated cluster: its agents' names, the peers each selects, and
//! each agent's summary of a round, encoded as the agent encodes it.

use std::collections::HashMap;

use health_agent::{
    cluster::{
        subset::{DEFAULT_PEERS, ProbePeers, SubsetPlan},
        summary::{PathSample, PeerSummary, Summary},
    },
    daemon::cluster_view::summaries_prefix,
    membership::NodeSet,
    probe::path::ProbeResult,
};

use super::{NODE_PREFIX, ZONE_SIZE};
use crate::sim_nodes::{node, rtt_us};

/// The simulated cluster: agent i is node i of the set (sorted by name).
pub(super) struct Cluster {
    pub(super) prefix: String,
    pub(super) names: Vec<String>,
    /// Each agent's peers (indices into `names`), as the agent selects them.
    pub(super) picks: Vec<Vec<usize>>,
    /// An agent by its summary's key.
    pub(super) by_key: HashMap<Vec<u8>, usize>,
}

impl Cluster {
    pub(super) fn new(agents: usize) -> anyhow::Result<Self> {
        let nodes = NodeSet::new((0..agents).map(|id| node(id, id / ZONE_SIZE)).collect())?;
        let plan = SubsetPlan::new(&nodes);
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let picks = (0..names.len())
            .map(|i| plan.assigned_index(i, ProbePeers::Count(DEFAULT_PEERS)))
            .collect();
        let prefix = summaries_prefix(NODE_PREFIX);
        let by_key = names
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("{prefix}{n}").into_bytes(), i))
            .collect();
        Ok(Self {
            prefix,
            names,
            picks,
            by_key,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.names.len()
    }

    pub(super) fn key(&self, agent: usize) -> String {
        format!("{}{}", self.prefix, self.names[agent])
    }

    /// Agent `i`'s summary of round `seq`, ended at `at_ms`, encoded.
    pub(super) fn summary(&self, i: usize, seq: u64, at_ms: u64) -> anyhow::Result<Vec<u8>> {
        let peers = self.picks[i]
            .iter()
            .map(|&t| {
                PeerSummary::new(
                    self.names[t].as_str(),
                    std::array::from_fn(|p| {
                        PathSample::new(ProbeResult::Success, Some(rtt_us(i, t, p, seq)))
                    }),
                )
            })
            .collect();
        Ok(Summary::new(self.names[i].clone(), seq, at_ms, peers)?.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_the_agents_and_carry_their_seq() {
        let c = Cluster::new(1000).expect("cluster");
        assert!(c.picks.iter().all(|p| p.len() == 52), "self, 19, 32");
        for (i, seq) in [(0, 1), (517, 300), (999, 1 << 40)] {
            let bytes = c.summary(i, seq, 1_790_000_000_000).expect("summary");
            assert!(bytes.len() <= 1536, "{} bytes", bytes.len());
            let s = Summary::decode(&bytes).expect("decodes");
            assert_eq!((s.observer(), s.seq()), (c.names[i].as_str(), seq));
            assert_eq!(s.peers().len(), 52);
            assert_eq!(c.by_key.get(c.key(i).as_bytes()), Some(&i));
        }
        assert_eq!(c.key(0), format!("/health/summaries/{}", c.names[0]));
    }
}
