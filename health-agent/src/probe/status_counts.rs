//! What the metrics count over every node's status, made once when the
//! status is published (node by node, as its JSON is written): a scrape
//! reads these, never every node's status again (at 10,000 nodes that
//! was a status made whole, about 5 MB and several milliseconds, per
//! scrape).

use super::{
    path::ProbeResult,
    status::{ClusterStatus, NodeStatus},
};

/// A state's place in the counts: reachable, unreachable, unknown.
#[must_use]
const fn slot(r: ProbeResult) -> usize {
    match r {
        ProbeResult::Success => 0,
        ProbeResult::Failure => 1,
        ProbeResult::Unknown => 2,
    }
}

/// Counts over every node of a status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusCounts {
    /// Nodes by path type (the node's addresses, its health endpoint's)
    /// and state (reachable, unreachable, unknown) over every family probed.
    pub by_type: [[u64; 3]; 2],
    /// The same per family (`[family][type][state]`).
    pub by_family: [[[u64; 3]; 2]; 2],
    /// The families any node is shown in.
    pub families: [bool; 2],
    /// Nodes by their state over all their paths, in that order: every path
    /// succeeds, one failed, none failed but one not known yet.
    pub by_state: [usize; 3],
    /// Paths degraded.
    pub degraded: usize,
    /// ICMP paths found to be MTU black holes.
    pub mtu_blackholes: usize,
    /// Paths some of whose flows fail while others answer.
    pub partial_losses: usize,
}

impl StatusCounts {
    /// Counts `n` in.
    pub fn add(&mut self, n: &NodeStatus) {
        self.by_type[0][slot(n.state_of(false))] += 1;
        self.by_type[1][slot(n.state_of(true))] += 1;
        let pairs = [(&n.host, &n.endpoint)].into_iter().chain(
            n.host_secondary
                .as_deref()
                .zip(n.endpoint_secondary.as_deref()),
        );
        for (host, endpoint) in pairs {
            let f = host.family.index();
            self.families[f] = true;
            self.by_family[f][0][slot(host.summary())] += 1;
            self.by_family[f][1][slot(endpoint.summary())] += 1;
        }
        self.by_state[slot(n.state())] += 1;
        for c in n.connectivities() {
            // A path that answers the small echo: one down is down, not
            // an MTU black hole (its flag is kept for when it answers).
            self.mtu_blackholes += usize::from(
                c.icmp.mtu_blackhole.is_some() && c.icmp.result == ProbeResult::Success,
            );
            for p in [&c.icmp, &c.http] {
                self.degraded += usize::from(p.degraded);
                self.partial_losses +=
                    usize::from(p.flows.as_deref().is_some_and(|f| !f.partial().is_empty()));
            }
        }
    }

    /// Nodes whose paths all succeed.
    #[must_use]
    pub const fn reachable(&self) -> usize {
        self.by_state[0]
    }

    /// The counts of every node of `status`.
    #[must_use]
    pub fn of(status: &ClusterStatus) -> Self {
        let mut counts = Self::default();
        for n in &status.nodes {
            counts.add(n);
        }
        counts
    }
}
