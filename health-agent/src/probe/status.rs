//! What `GET /v1/status` returns, after Cilium's health API.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use super::path::{PathState, ProbeResult};

/// ICMP and HTTP to one address of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connectivity {
    pub ip: Ipv4Addr,
    pub icmp: PathState,
    pub http: PathState,
}

impl Connectivity {
    #[must_use]
    pub fn summary(&self) -> ProbeResult {
        summarize([self.icmp.result, self.http.result])
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: String,
    /// Connectivity to the node's own address ("Host connectivity").
    pub host: Connectivity,
    /// Connectivity to the node's health endpoint.
    pub endpoint: Connectivity,
}

impl NodeStatus {
    /// Reachable: all four paths succeed.
    #[must_use]
    pub fn reachable(&self) -> bool {
        self.state() == ProbeResult::Success
    }

    /// The node's state over its four paths: Failure if any failed, else
    /// Unknown if any is unknown, else Success.
    #[must_use]
    pub fn state(&self) -> ProbeResult {
        summarize([self.host.summary(), self.endpoint.summary()])
    }
}

/// Failure if any failed, else Unknown if any is unknown, else Success.
fn summarize<const N: usize>(results: [ProbeResult; N]) -> ProbeResult {
    if results.contains(&ProbeResult::Failure) {
        ProbeResult::Failure
    } else if results.contains(&ProbeResult::Unknown) {
        ProbeResult::Unknown
    } else {
        ProbeResult::Success
    }
}

/// The round a status comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundInfo {
    /// The round's number in this agent's run (1, 2, ...): rounds are
    /// ordered by it, not by wall-clock times.
    #[serde(default)]
    pub seq: u64,
    /// Epoch milliseconds when the round started.
    pub started_ms: u64,
    pub duration_ms: u64,
    pub probes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub local_node: Option<String>,
    pub probe_interval_ms: u64,
    pub probe_timeout_ms: u64,
    /// `None` until the first round has finished: every path is Unknown.
    pub round: Option<RoundInfo>,
    pub nodes: Vec<NodeStatus>,
}

impl ClusterStatus {
    #[must_use]
    pub fn reachable(&self) -> usize {
        self.nodes.iter().filter(|n| n.reachable()).count()
    }

    /// Counts only: what a large cluster's operator looks at first.
    #[must_use]
    pub fn summary(&self) -> StatusSummary {
        let mut s = StatusSummary {
            local_node: self.local_node.clone(),
            round: self.round.clone(),
            nodes: self.nodes.len(),
            reachable: 0,
            unreachable: 0,
            unknown: 0,
        };
        for n in &self.nodes {
            match n.state() {
                ProbeResult::Success => s.reachable += 1,
                ProbeResult::Failure => s.unreachable += 1,
                ProbeResult::Unknown => s.unknown += 1,
            }
        }
        s
    }

    /// The same status with only the nodes `keep` accepts.
    #[must_use]
    pub fn filtered(&self, keep: impl Fn(&NodeStatus) -> bool) -> Self {
        Self {
            local_node: self.local_node.clone(),
            probe_interval_ms: self.probe_interval_ms,
            probe_timeout_ms: self.probe_timeout_ms,
            round: self.round.clone(),
            nodes: self.nodes.iter().filter(|n| keep(n)).cloned().collect(),
        }
    }
}

/// `GET /v1/status?summary=true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusSummary {
    pub local_node: Option<String>,
    pub round: Option<RoundInfo>,
    pub nodes: usize,
    /// All four paths succeed.
    pub reachable: usize,
    /// At least one path failed.
    pub unreachable: usize,
    /// Not failed, but at least one path not known yet.
    pub unknown: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        use ProbeResult::{Failure, Success, Unknown};
        assert_eq!(summarize([Success, Success]), Success);
        assert_eq!(summarize([Success, Unknown]), Unknown);
        assert_eq!(summarize([Unknown, Failure]), Failure);
    }
}
