//! Series per peer and path (`--metrics-per-peer`): reachability (1 or
//! 0; none while unknown) and the last RTT, made at each scrape from the
//! paths as they are then, [`CHUNK`] nodes at a time. A scrape holds one
//! chunk's statuses, never the whole status (megabytes at 10,000 peers).
//! Every series is labelled `peer`, `type`, `protocol` and `family`, so a
//! dual-stack cluster's series of either family are selected alike.

use std::{fmt::Error, sync::Arc};

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric as _},
    metrics::{MetricType, gauge::ConstGauge},
};
use tokio::sync::watch;

use crate::{
    membership::NodeSet,
    probe::{
        CHUNK, Prober,
        path::{PathState, ProbeResult},
        status::{Connectivity, NodeStatus},
    },
};

/// A series' labels.
type Labels<'a> = Vec<(&'static str, &'a str)>;

/// Both families, over every node but this one: the agent's own paths
/// never leave the node, and a node that no other agent reaches must
/// read as down. Each chunk is read from the prober in service, so a
/// reload during a slow scrape lets the old one go.
pub(super) fn encode(
    enc: &mut DescriptorEncoder,
    probers: &watch::Receiver<Arc<Prober>>,
) -> Result<(), Error> {
    let current = || probers.borrow().clone();
    let nodes = current().nodes();
    family(
        enc,
        (
            "peer_reachable",
            "Per peer and path: 1 when the path succeeds, 0 when it failed",
        ),
        &current,
        &nodes,
        |p| match p.result {
            ProbeResult::Success => Some(1i64),
            ProbeResult::Failure => Some(0),
            ProbeResult::Unknown => None,
        },
    )?;
    #[allow(
        clippy::cast_precision_loss,
        reason = "nanoseconds as seconds in a float"
    )]
    let seconds = |ns: u64| ns as f64 / 1e9;
    family(
        enc,
        (
            "peer_rtt_seconds",
            "Per peer and path: the RTT of the last successful probe",
        ),
        &current,
        &nodes,
        |p| p.rtt_ns.map(seconds),
    )
}

/// One family (`name`, `help`): a series per peer and path that has a
/// `value`, the paths read a chunk of nodes at a time.
fn family<V: EncodeGaugeValue + std::fmt::Debug>(
    enc: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    current: &impl Fn() -> Arc<Prober>,
    nodes: &NodeSet,
    value: impl Fn(&PathState) -> Option<V>,
) -> Result<(), Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for chunk in nodes.chunks(CHUNK) {
        let prober = current();
        let local = prober.config().local_node.as_deref();
        let statuses = prober.node_statuses(chunk, None);
        for n in statuses.iter().filter(|n| local != Some(n.name.as_str())) {
            for (labels, p) in series(n) {
                if let Some(v) = value(p) {
                    ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
                }
            }
        }
    }
    Ok(())
}

/// A node's paths with their labels: the primary family's, then the
/// secondary's.
fn series(n: &NodeStatus) -> impl Iterator<Item = (Labels<'_>, &PathState)> {
    let secondary = n
        .host_secondary
        .iter()
        .map(|c| ("node", &**c))
        .chain(n.endpoint_secondary.iter().map(|c| ("endpoint", &**c)));
    [("node", &n.host), ("endpoint", &n.endpoint)]
        .into_iter()
        .chain(secondary)
        .flat_map(move |(ty, c): (&'static str, &Connectivity)| {
            [("icmp", &c.icmp), ("http", &c.http)]
                .into_iter()
                .map(move |(proto, p)| {
                    let labels: Labels<'_> = vec![
                        ("peer", n.name.as_str()),
                        ("type", ty),
                        ("protocol", proto),
                        ("family", c.family.as_str()),
                    ];
                    (labels, p)
                })
        })
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tokio::sync::watch;

    use crate::{
        membership::NodeSet,
        metrics::Metrics,
        probe::{
            ProbeConfig, Prober,
            error::{ProbeError, Proto},
            path::{Outcome, RttSource, Thresholds},
        },
        util::gzip,
    };

    /// 600 nodes, `node-0000` this one; the first 500 probed once (a
    /// failure is enough to fail), the health endpoint's HTTP path of
    /// every seventh failing, and the last 100 nodes not probed.
    fn prober() -> Arc<Prober> {
        let prober = Prober::new(ProbeConfig {
            local_node: Some("node-0000".into()),
            thresholds: Thresholds {
                failure: 1,
                success: 1,
            },
            ..ProbeConfig::default()
        });
        let set = NodeSet::numbered(600);
        prober.set_nodes(set.clone());
        let ok = Outcome::Ok {
            rtt: Duration::from_micros(250),
            warning: None,
            source: RttSource::Kernel,
        };
        let timeout = Outcome::Failed(ProbeError::Timeout {
            proto: Proto::Http,
            after: Duration::from_secs(1),
        });
        let keys: Vec<(u32, u8)> = (0..500).flat_map(|i| [(i, 0), (i, 1)]).collect();
        let outcomes = keys.iter().map(|&(i, a)| {
            let http = if a == 1 && i % 7 == 0 { &timeout } else { &ok };
            (ok.clone(), http.clone())
        });
        prober.record(&set, &keys, outcomes, 1, 1_000, 1_001);
        prober
    }

    /// The metrics of [`prober`]'s nodes, series per peer on.
    fn metrics_per_peer() -> Metrics {
        Metrics::of_probers(watch::channel(prober()).1, true)
    }

    #[test]
    fn series_per_peer_are_made_a_chunk_of_nodes_at_a_time_and_sent_gzipped() {
        let metrics = Arc::new(metrics_per_peer());
        let text = metrics.encode();
        let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
        // Four paths of each of the 499 other nodes probed; none of this
        // node's, none of the unprobed ones' (unknown: no series).
        assert_eq!(count("health_peer_reachable{"), 499 * 4);
        assert_eq!(count("# TYPE health_peer_reachable gauge"), 1);
        assert_eq!(count("# TYPE health_peer_rtt_seconds gauge"), 1);
        assert!(!text.contains(r#"peer="node-0000""#));
        assert!(!text.contains(r#"peer="node-0599""#));
        assert!(text.contains(
            r#"health_peer_reachable{peer="node-0007",type="endpoint",protocol="http",family="ipv4"} 0"#
        ));
        assert!(text.contains(
            r#"health_peer_reachable{peer="node-0499",type="endpoint",protocol="http",family="ipv4"} 1"#
        ));
        // An RTT for every path that succeeded: a seventh of the
        // endpoints' HTTP paths failed (node-0007 to node-0497).
        assert_eq!(count("health_peer_rtt_seconds{"), 499 * 4 - 71);
        assert!(text.contains(
            r#"health_peer_rtt_seconds{peer="node-0001",type="node",protocol="icmp",family="ipv4"} 0.00025"#
        ));
        assert!(text.ends_with("# EOF\n"));
        // Scraped: the same text, gzipped, or in pieces for a client that
        // does not take gzip.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("runtime");
        let gz = runtime
            .block_on(metrics.exposition())
            .expect("an exposition");
        assert!(gz.len() * 5 < text.len(), "{} of {}", gz.len(), text.len());
        let pieces: Vec<bytes::Bytes> = gzip::pieces(gz, gzip::PIECE)
            .collect::<Result<_, _>>()
            .expect("pieces");
        assert!(pieces.len() >= 3, "{} pieces", pieces.len());
        assert!(pieces.iter().all(|p| p.len() <= gzip::PIECE));
        assert_eq!(pieces.concat(), text.as_bytes());
    }

    #[test]
    fn every_path_is_labelled_with_its_family() {
        use std::net::{Ipv4Addr, Ipv6Addr};

        use crate::probe::{
            path::PathState,
            status::{Connectivity, NodeStatus},
        };
        let v4 = |last| {
            Connectivity::new(
                Ipv4Addr::new(198, 18, 0, last),
                PathState::default(),
                PathState::default(),
            )
        };
        let v6 = |last| {
            Connectivity::new(
                Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, last),
                PathState::default(),
                PathState::default(),
            )
        };
        let n = NodeStatus {
            name: "n".into(),
            host: v4(1),
            endpoint: v4(2),
            host_secondary: Some(Box::new(v6(1))),
            endpoint_secondary: Some(Box::new(v6(2))),
        };
        let labels: Vec<Vec<(&str, &str)>> = super::series(&n).map(|(l, _)| l).collect();
        assert_eq!(labels.len(), 8);
        assert_eq!(
            labels[0],
            [
                ("peer", "n"),
                ("type", "node"),
                ("protocol", "icmp"),
                ("family", "ipv4")
            ]
        );
        assert_eq!(
            labels[7],
            [
                ("peer", "n"),
                ("type", "endpoint"),
                ("protocol", "http"),
                ("family", "ipv6")
            ]
        );
        assert!(labels[..4].iter().all(|l| l.contains(&("family", "ipv4"))));
        assert!(labels[4..].iter().all(|l| l.contains(&("family", "ipv6"))));
        // An IPv6 node's IPv4 paths are the secondary ones.
        let n = NodeStatus {
            name: "m".into(),
            host: v6(3),
            endpoint: v6(4),
            host_secondary: Some(Box::new(v4(3))),
            endpoint_secondary: None,
        };
        let labels: Vec<Vec<(&str, &str)>> = super::series(&n).map(|(l, _)| l).collect();
        assert_eq!(labels.len(), 6);
        assert!(labels[4..].iter().all(|l| l.contains(&("family", "ipv4"))));
        assert!(labels[..4].iter().all(|l| l.contains(&("family", "ipv6"))));
    }
}
