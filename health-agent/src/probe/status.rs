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
        summarize([self.host.summary(), self.endpoint.summary()]) == ProbeResult::Success
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
