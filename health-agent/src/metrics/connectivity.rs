//! Connectivity as counts of nodes by path type and status, from the
//! published status at each scrape: a fixed set of series whatever the
//! cluster's size. Per-peer series (`--metrics-per-peer`) are made from the
//! same status, so a peer that left has none.

use std::sync::Arc;

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};
use tokio::sync::watch;

use super::encode::{gauge, gauges};
use crate::probe::{
    Prober,
    path::{PathState, ProbeResult},
    status::{ClusterStatus, Connectivity},
};

const STATUSES: [(ProbeResult, &str); 3] = [
    (ProbeResult::Success, "reachable"),
    (ProbeResult::Failure, "unreachable"),
    (ProbeResult::Unknown, "unknown"),
];

#[derive(Debug)]
pub(super) struct ConnectivityCollector {
    pub(super) prober: watch::Receiver<Arc<Prober>>,
    pub(super) per_peer: bool,
}

/// Nodes by path type (`node`: the node's own address, `endpoint`: its
/// health endpoint) and status; every combination, zeros included.
fn counts(status: &ClusterStatus) -> [[u64; 3]; 2] {
    let mut counts = [[0u64; 3]; 2];
    let slot = |r| STATUSES.iter().position(|(s, _)| *s == r).unwrap_or(2);
    for n in &status.nodes {
        counts[0][slot(n.host.summary())] += 1;
        counts[1][slot(n.endpoint.summary())] += 1;
    }
    counts
}

impl Collector for ConnectivityCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let status = self.prober.borrow().status();
        let counts = counts(&status);
        let series = ["node", "endpoint"]
            .into_iter()
            .zip(counts)
            .flat_map(|(ty, row)| {
                STATUSES
                    .iter()
                    .zip(row)
                    .map(move |((_, st), n)| ([("type", ty), ("status", *st)], n))
            });
        gauges(
            &mut enc,
            "node_connectivity_status",
            "Peers by path type (node: the node's address, endpoint: its health endpoint) and status (reachable: ICMP and HTTP succeed)",
            series,
        )?;
        gauge(
            &mut enc,
            "nodes_reachable",
            "Peers whose four paths all succeed",
            i64::try_from(status.reachable()).unwrap_or(i64::MAX),
        )?;
        if self.per_peer {
            per_peer(&mut enc, &status)?;
        }
        Ok(())
    }
}

/// One series per peer and path: reachability (1 or 0; none while
/// unknown) and the last RTT.
fn per_peer(enc: &mut DescriptorEncoder, status: &ClusterStatus) -> Result<(), std::fmt::Error> {
    fn paths(c: &Connectivity) -> [(&'static str, &PathState); 2] {
        [("icmp", &c.icmp), ("http", &c.http)]
    }
    let each = || {
        status.nodes.iter().flat_map(move |n| {
            [("node", &n.host), ("endpoint", &n.endpoint)]
                .into_iter()
                .flat_map(move |(ty, c)| {
                    paths(c)
                        .into_iter()
                        .map(move |(proto, p)| (n.name.as_str(), ty, proto, p))
                })
        })
    };
    let reachable = |p: &PathState| match p.result {
        ProbeResult::Success => Some(1i64),
        ProbeResult::Failure => Some(0),
        ProbeResult::Unknown => None,
    };
    gauges(
        enc,
        "peer_reachable",
        "Per peer and path: 1 when the path succeeds, 0 when it failed",
        each().filter_map(|(peer, ty, proto, p)| {
            reachable(p).map(|v| ([("peer", peer), ("type", ty), ("protocol", proto)], v))
        }),
    )?;
    #[allow(
        clippy::cast_precision_loss,
        reason = "nanoseconds as seconds in a float"
    )]
    let seconds = |ns: u64| ns as f64 / 1e9;
    gauges(
        enc,
        "peer_rtt_seconds",
        "Per peer and path: the RTT of the last successful probe",
        each().filter_map(|(peer, ty, proto, p)| {
            p.rtt_ns.map(|ns| {
                (
                    [("peer", peer), ("type", ty), ("protocol", proto)],
                    seconds(ns),
                )
            })
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::status::NodeStatus;
    use std::net::Ipv4Addr;

    fn path(result: ProbeResult) -> PathState {
        PathState {
            result,
            ..PathState::default()
        }
    }

    fn node(host: ProbeResult, endpoint: ProbeResult) -> NodeStatus {
        let c = |r, ip| Connectivity {
            ip,
            icmp: path(r),
            http: path(ProbeResult::Success),
        };
        NodeStatus {
            name: "n".into(),
            host: c(host, Ipv4Addr::new(198, 18, 0, 1)),
            endpoint: c(endpoint, Ipv4Addr::new(198, 19, 0, 1)),
        }
    }

    #[test]
    fn nodes_are_counted_by_type_and_status() {
        use ProbeResult::{Failure, Success, Unknown};
        let status = ClusterStatus {
            local_node: None,
            probe_interval_ms: 0,
            probe_timeout_ms: 0,
            round: None,
            nodes: vec![
                node(Success, Success),
                node(Failure, Success),
                node(Success, Unknown),
            ],
        };
        // [node, endpoint] x [reachable, unreachable, unknown]
        assert_eq!(counts(&status), [[2, 1, 0], [2, 0, 1]]);
    }
}
