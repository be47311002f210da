//! Connectivity as counts of nodes by path type and status (over every
//! family probed, and per family), counted when the status was published:
//! a fixed set of series whatever the cluster's size, read without
//! walking the nodes. Per-peer series (`--metrics-per-peer`) are made
//! from the paths at each scrape ([`super::per_peer`]), so a peer that
//! left has none.

use std::sync::Arc;

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};
use tokio::sync::watch;

use super::encode::{gauge, gauges};
use crate::probe::{Prober, family::Family, path::ProbeResult, status::EncryptionSummary};

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

/// Addresses per encryption state, every state named (a constant set of
/// series), when encryption is checked.
fn encryption_series(e: Option<&EncryptionSummary>) -> Option<Vec<(&'static str, i64)>> {
    let e = e?;
    Some(
        crate::encryption::EncState::ALL
            .iter()
            .map(|st| {
                let n = e.paths.get(st.name()).copied().unwrap_or(0);
                (st.name(), i64::try_from(n).unwrap_or(i64::MAX))
            })
            .collect(),
    )
}

impl Collector for ConnectivityCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let prober = self.prober.borrow().clone();
        let (summary, counts) = prober.status_counts();
        let series = ["node", "endpoint"]
            .into_iter()
            .zip(counts.by_type)
            .flat_map(|(ty, row)| {
                STATUSES
                    .iter()
                    .zip(row)
                    .map(move |((_, st), n)| ([("type", ty), ("status", *st)], n))
            });
        gauges(
            &mut enc,
            "node_connectivity_status",
            "Peers by path type (node: the node's addresses, endpoint: its health endpoint's) and status (reachable: ICMP and HTTP succeed in every family probed)",
            series,
        )?;
        let series = Family::ALL
            .into_iter()
            .filter(|f| counts.families[f.index()])
            .flat_map(|f| {
                ["node", "endpoint"]
                    .into_iter()
                    .zip(counts.by_family[f.index()])
                    .flat_map(move |(ty, row)| {
                        STATUSES.iter().zip(row).map(move |((_, st), n)| {
                            ([("family", f.as_str()), ("type", ty), ("status", *st)], n)
                        })
                    })
            });
        gauges(
            &mut enc,
            "node_connectivity_family_status",
            "Peers by address family probed, path type and status",
            series,
        )?;
        gauge(
            &mut enc,
            "nodes_reachable",
            "Peers whose paths (four per family probed) all succeed",
            i64::try_from(counts.reachable()).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut enc,
            "paths_degraded",
            "Paths that answer but lose at least --degraded-loss of their probes with 95 % confidence over a window of 1 minute, 10 minutes or 1 hour",
            i64::try_from(counts.degraded).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut enc,
            "paths_mtu_blackhole",
            "ICMP paths that answer small echoes but lose the Don't-Fragment echo of --probe-mtu bytes, failure-threshold rounds in a row",
            i64::try_from(counts.mtu_blackholes).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut enc,
            "paths_partial_loss",
            "Paths probed over several flows (--probe-flows) some of which fail while others answer: one way through an ECMP group is bad",
            i64::try_from(counts.partial_losses).unwrap_or(i64::MAX),
        )?;
        if let Some(series) = encryption_series(summary.encryption.as_ref()) {
            gauges(
                &mut enc,
                "paths_encryption",
                "Peer addresses by encryption state (--encryption wireguard): encrypted, plaintext (probes left outside the tunnel), not_covered (outside every peer's AllowedIPs), stale (handshake too old while probes flow), unobserved, unknown",
                series.into_iter().map(|(st, n)| ([("state", st)], n)),
            )?;
        }
        // Series per peer are opt-in.
        if self.per_peer {
            super::per_peer::encode(&mut enc, &self.prober)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{
        path::PathState,
        status::{ClusterStatus, Connectivity, NodeStatus},
        status_counts::StatusCounts,
    };
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn path(result: ProbeResult) -> PathState {
        PathState {
            result,
            ..PathState::default()
        }
    }

    fn node(host: ProbeResult, endpoint: ProbeResult) -> NodeStatus {
        let c = |r, ip: Ipv4Addr| Connectivity::new(ip, path(r), path(ProbeResult::Success));
        NodeStatus {
            name: "n".into(),
            host: c(host, Ipv4Addr::new(198, 18, 0, 1)),
            endpoint: c(endpoint, Ipv4Addr::new(198, 19, 0, 1)),
            host_secondary: None,
            endpoint_secondary: None,
        }
    }

    /// `node(host, endpoint)` with IPv6 paths whose host ICMP is `host6`.
    fn dual(host: ProbeResult, host6: ProbeResult) -> NodeStatus {
        let v6: Ipv6Addr = "2001:2:0:1::1".parse().expect("ip");
        let c = |r| Connectivity::new(v6, path(r), path(ProbeResult::Success));
        NodeStatus {
            host_secondary: Some(Box::new(c(host6))),
            endpoint_secondary: Some(Box::new(c(ProbeResult::Success))),
            ..node(host, ProbeResult::Success)
        }
    }

    #[test]
    fn a_failing_ipv6_path_counts_in_the_type_and_in_its_family() {
        use ProbeResult::{Failure, Success};
        let status = ClusterStatus {
            local_node: None,
            probe_interval_ms: 0,
            probe_timeout_ms: 0,
            round: None,
            encryption: None,
            nodes: vec![
                dual(Success, Failure),
                dual(Success, Success),
                node(Success, Success),
            ],
        };
        let counts = StatusCounts::of(&status);
        assert_eq!(counts.by_type, [[2, 1, 0], [3, 0, 0]]);
        assert_eq!(counts.families, [true, true]);
        assert_eq!(counts.by_family[0], [[3, 0, 0], [3, 0, 0]], "IPv4");
        assert_eq!(counts.by_family[1], [[1, 1, 0], [2, 0, 0]], "IPv6");
        assert_eq!(counts.reachable(), 2);
    }

    #[test]
    fn encryption_states_are_one_series_each_and_absent_when_unchecked() {
        assert_eq!(encryption_series(None), None);
        let encryption = Some(EncryptionSummary {
            device: Some("wg0".into()),
            error: None,
            paths: [("encrypted".to_owned(), 7), ("plaintext".to_owned(), 1)]
                .into_iter()
                .collect(),
        });
        let s = encryption_series(encryption.as_ref()).expect("series");
        assert_eq!(s.len(), 6, "every state, zero included: {s:?}");
        assert!(s.contains(&("encrypted", 7)) && s.contains(&("plaintext", 1)));
        assert!(s.contains(&("stale", 0)));
    }

    /// A scrape reads the counts made when the status was published: the
    /// same as counting every node's status then, and not moved by a round
    /// recorded since, until it is published.
    #[test]
    fn a_scrape_reads_the_counts_of_the_published_status() {
        use crate::{
            membership::NodeSet,
            probe::{
                ProbeConfig,
                error::{ProbeError, Proto},
                path::{Outcome, RttSource},
            },
        };
        let prober = Prober::new(ProbeConfig::default());
        let set = NodeSet::numbered(600);
        prober.set_nodes(set.clone());
        let ok = Outcome::Ok {
            rtt: std::time::Duration::from_micros(50),
            warning: None,
            source: RttSource::Kernel,
        };
        let timeout = Outcome::Failed(ProbeError::Timeout {
            proto: Proto::Http,
            after: std::time::Duration::from_secs(1),
        });
        // Of the first 500 nodes, every fourth one's health endpoint
        // fails; the last 100 are not probed.
        let keys: Vec<(u32, u8)> = (0..500).flat_map(|i| [(i, 0), (i, 1)]).collect();
        let record = |seq: u64, failing: u32| {
            let outcomes = keys.iter().map(|&(i, a)| {
                let o = if a == 1 && i % failing == 0 {
                    &timeout
                } else {
                    &ok
                };
                (ok.clone(), o.clone())
            });
            prober.record(&set, &keys, outcomes, seq, seq * 1000, seq * 1000 + 1);
        };
        for seq in 1..=4 {
            record(seq, 4);
        }
        prober.publish(None, true);
        let (_, published) = prober.status_counts();
        assert_eq!(*published, StatusCounts::of(&prober.status()));
        assert_eq!(published.by_type, [[500, 0, 100], [375, 125, 100]]);
        assert_eq!(published.reachable(), 375);
        let mut registry = prometheus_client::registry::Registry::with_prefix("health");
        registry.register_collector(Box::new(ConnectivityCollector {
            prober: watch::channel(prober.clone()).1,
            per_peer: false,
        }));
        let scrape = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).expect("encoded");
            out
        };
        let text = scrape();
        assert!(
            text.contains(
                r#"health_node_connectivity_status{type="endpoint",status="unreachable"} 125"#
            ),
            "{text}"
        );
        assert!(text.contains("health_nodes_reachable 375"), "{text}");
        // Every other node failing now: read once published.
        for seq in 5..=8 {
            record(seq, 2);
        }
        assert!(scrape().contains("health_nodes_reachable 375"));
        prober.publish(None, true);
        assert!(
            scrape().contains("health_nodes_reachable 250"),
            "{}",
            scrape()
        );
    }

    #[test]
    fn nodes_are_counted_by_type_and_status() {
        use ProbeResult::{Failure, Success, Unknown};
        let status = ClusterStatus {
            local_node: None,
            probe_interval_ms: 0,
            probe_timeout_ms: 0,
            round: None,
            encryption: None,
            nodes: vec![
                node(Success, Success),
                node(Failure, Success),
                node(Success, Unknown),
            ],
        };
        // [node, endpoint] x [reachable, unreachable, unknown]
        assert_eq!(StatusCounts::of(&status).by_type, [[2, 1, 0], [2, 0, 1]]);
    }
}
