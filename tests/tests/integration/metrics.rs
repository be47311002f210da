//! Prometheus metrics: a real Prometheus scrapes a local cluster's agents;
//! the series stay the same in number whatever the peers, unless per-peer
//! series are asked for, and those go with their peer.

use std::{fmt::Write as _, time::Duration};

use health_tests::{
    cluster::{Cluster, ClusterNode, Settings, nodes_yaml},
    prometheus::{Prometheus, http_get},
};

/// Node 1's `/metrics`, fetched from the fabric namespace.
fn scrape(cluster: &Cluster, node: &ClusterNode) -> String {
    let (code, body) =
        http_get(&cluster.fabric, node.web_addr(), "/metrics").expect("the metrics listener");
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics: {body}");
    body
}

/// The series of an exposition (its lines that are not comments).
fn series(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

fn wait_reachable(cluster: &Cluster, n: usize) {
    for i in 0..cluster.nodes.len() {
        cluster.wait_status(i, Duration::from_secs(30), |s| {
            s.nodes.len() == n && s.reachable() == n
        });
    }
}

#[test]
fn prometheus_sees_a_node_go_unreachable_and_back_and_datapath_counters_grow() {
    let cluster = Cluster::start(&Settings::default());
    wait_reachable(&cluster, 3);
    let targets: Vec<_> = cluster.nodes.iter().map(ClusterNode::web_addr).collect();
    let prom = Prometheus::start(&cluster.fabric, cluster.dir.join("prometheus"), &targets);
    let patience = Duration::from_secs(30);
    prom.wait_value(r#"count(up{job="health"} == 1)"#, 3.0, patience);
    let inst = cluster.nodes[0].web_addr();
    let nodes = |status: &str| {
        format!(
            r#"health_node_connectivity_status{{instance="{inst}",type="node",status="{status}"}}"#
        )
    };
    prom.wait_value(&nodes("reachable"), 3.0, patience);
    prom.wait_value(&nodes("unreachable"), 0.0, patience);
    let answered = format!(r#"health_echo_packets_total{{instance="{inst}",verdict="answered"}}"#);
    let created = format!(r#"health_ct_created_total{{instance="{inst}"}}"#);
    let (answered0, created0) = (
        prom.value(&answered).expect("echo counter scraped"),
        prom.value(&created).expect("CT counter scraped"),
    );

    cluster.nodes[2].set_uplink(false);
    prom.wait_value(&nodes("unreachable"), 1.0, patience);
    prom.wait_value(
        &format!(r#"health_node_connectivity_status{{instance="{inst}",type="endpoint",status="unreachable"}}"#),
        1.0,
        patience,
    );
    cluster.nodes[2].set_uplink(true);
    prom.wait_value(&nodes("unreachable"), 0.0, patience);
    prom.wait_value(&nodes("reachable"), 3.0, patience);

    let (answered1, created1) = (
        prom.value(&answered).expect("echo counter"),
        prom.value(&created).expect("CT counter"),
    );
    assert!(
        answered1 > answered0,
        "echo answered: {answered0} then {answered1}"
    );
    assert!(
        created1 > created0,
        "CT created: {created0} then {created1}"
    );
    // The prober's own series, summed over the agents.
    let probes = prom
        .value(r#"sum(health_probes_total{protocol="icmp",result="success"})"#)
        .expect("probe counter");
    assert!(probes > 0.0, "{probes}");
}

/// The nodes file's text for the cluster's 3 nodes and `extra` peers that
/// never answer (198.18.1.0/24 node IPs, 198.19.x.0/24 health CIDRs).
fn with_silent_peers(extra: usize) -> String {
    let mut yaml = nodes_yaml(3);
    for i in 0..extra {
        let _ = write!(
            yaml,
            "  - name: silent-{i:03}\n    node-ip: 198.18.1.{}\n    health-cidr: 198.19.{i}.0/24\n",
            i + 1
        );
    }
    yaml
}

#[test]
fn series_are_as_many_with_200_peers_as_with_3() {
    let cluster = Cluster::start(&Settings {
        // Every peer probed, each with its status.
        extra_args: vec!["--probe-peers".into(), "all".into()],
        ..Settings::default()
    });
    wait_reachable(&cluster, 3);
    let node = &cluster.nodes[0];
    let three = scrape(&cluster, node);
    assert!(
        three.contains("health_node_connectivity_latency_seconds_bucket"),
        "no latency histogram after a round:\n{three}"
    );
    let seq = node.status().and_then(|s| s.round).map_or(0, |r| r.seq);
    cluster.write_nodes_text(&with_silent_peers(197));
    cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes.len() == 200 && s.round.as_ref().is_some_and(|r| r.seq >= seq + 2)
    });
    let two_hundred = scrape(&cluster, node);
    assert!(
        two_hundred
            .contains(r#"health_node_connectivity_status{type="node",status="unknown"} 197"#)
            || two_hundred.contains(
                r#"health_node_connectivity_status{type="node",status="unreachable"} 197"#
            ),
        "the silent peers are not counted:\n{two_hundred}"
    );
    assert!(!two_hundred.contains("silent-"), "a per-peer series leaked");
    assert_eq!(
        series(&three).len(),
        series(&two_hundred).len(),
        "3 peers:\n{three}\n200 peers:\n{two_hundred}"
    );
}

#[test]
fn per_peer_series_go_with_their_peer() {
    let cluster = Cluster::start(&Settings {
        extra_args: vec!["--metrics-per-peer".into()],
        ..Settings::default()
    });
    wait_reachable(&cluster, 3);
    let node = &cluster.nodes[0];
    let before = scrape(&cluster, node);
    for line in [
        r#"health_peer_reachable{peer="node-3",type="node",protocol="icmp"} 1"#,
        r#"health_peer_reachable{peer="node-3",type="endpoint",protocol="http"} 1"#,
        r#"health_peer_rtt_seconds{peer="node-3",type="endpoint",protocol="icmp"}"#,
    ] {
        assert!(before.contains(line), "missing {line:?} in\n{before}");
    }
    // The same exposition on the unix socket.
    let (code, body) =
        health_tests::api::call(
            &node.socket(),
            |c| async move { c.raw("GET", "/metrics").await },
        )
        .expect("GET /metrics on the socket");
    let on_socket = String::from_utf8_lossy(&body);
    assert_eq!(code.as_u16(), 200, "{on_socket}");
    assert!(
        on_socket.contains(r#"health_peer_reachable{peer="node-3",type="node",protocol="icmp"} 1"#),
        "{on_socket}"
    );
    cluster.write_nodes_text(&nodes_yaml(2));
    cluster.wait_status(0, Duration::from_secs(20), |s| s.nodes.len() == 2);
    let after = scrape(&cluster, node);
    assert!(
        after.contains(r#"health_peer_reachable{peer="node-2",type="node",protocol="icmp"} 1"#),
        "{after}"
    );
    assert!(
        !after.contains(r#"peer="node-3""#),
        "node-3 left but kept series:\n{after}"
    );
}
