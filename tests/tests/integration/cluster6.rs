//! Local clusters over IPv6: dual stack (every node probed over both
//! families, IPv4 primary, IPv6 secondary) and IPv6 only. A node whose IPv6
//! is switched off while its IPv4 works shows exactly that in `status`.

use std::{net::IpAddr, time::Duration};

use health_agent::{
    datapath::rtt,
    probe::{
        path::ProbeResult,
        status::{ClusterStatus, Connectivity, NodeStatus},
    },
    sys::netlink::in_netns,
};
use health_tests::{
    cluster::{Cluster, Family, Settings, health_cidr6, node_ip6, nodes_yaml_for},
    topology::TwoNodes,
};

const NODES: usize = 3;

/// Both paths of `c` succeed.
fn ok(c: &Connectivity) -> bool {
    c.icmp.result == ProbeResult::Success && c.http.result == ProbeResult::Success
}

/// Both paths of `c` failed.
fn failed(c: &Connectivity) -> bool {
    c.icmp.result == ProbeResult::Failure && c.http.result == ProbeResult::Failure
}

/// The primary and secondary connectivity of a node's host and endpoint.
fn paths(n: &NodeStatus) -> Vec<&Connectivity> {
    [&n.host, &n.endpoint]
        .into_iter()
        .chain(n.host_secondary.as_deref())
        .chain(n.endpoint_secondary.as_deref())
        .collect()
}

/// Every node of `s` is reachable over every path.
fn all_ok(s: &ClusterStatus) -> bool {
    s.nodes.len() == NODES && s.nodes.iter().all(|n| paths(n).into_iter().all(ok))
}

fn settings(family: Family) -> Settings {
    Settings {
        nodes: NODES,
        family,
        ..Settings::default()
    }
}

#[test]
fn a_dual_stack_cluster_probes_both_families_and_shows_an_ipv6_failure() {
    let cluster = Cluster::start(&settings(Family::Dual));
    let s = cluster.wait_status(0, Duration::from_secs(60), all_ok);
    for n in &s.nodes {
        assert!(n.host.ip.is_ipv4() && n.endpoint.ip.is_ipv4(), "{n:?}");
        let (host6, ep6) = (
            n.host_secondary.as_deref().expect("IPv6 host path"),
            n.endpoint_secondary.as_deref().expect("IPv6 endpoint path"),
        );
        assert!(host6.ip.is_ipv6() && ep6.ip.is_ipv6(), "{n:?}");
        assert_eq!(paths(n).len(), 4, "{n:?}");
    }
    let node2 = s.nodes.iter().find(|n| n.name == "node-2").expect("node-2");
    assert_eq!(
        node2.host_secondary.as_deref().map(|c| c.ip),
        cluster.nodes[1].ip6.map(IpAddr::V6)
    );
    let text = cluster.nodes[0].status_text();
    assert!(
        text.contains(&cluster.nodes[1].ip6.expect("ip6").to_string()),
        "the table names node-2's IPv6 address:\n{text}"
    );

    // Node 2's IPv6 goes away (its uplink drops every IPv6 address): its
    // IPv6 paths fail, its IPv4 paths stay OK, and nothing else changes.
    TwoNodes::sysctl(
        &cluster.nodes[1].ns,
        "net/ipv6/conf/uplink/disable_ipv6",
        "1",
    );
    let s = cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes
            .iter()
            .find(|n| n.name == "node-2")
            .is_some_and(|n| {
                n.host_secondary.as_deref().is_some_and(failed)
                    && n.endpoint_secondary.as_deref().is_some_and(failed)
            })
    });
    let node2 = s.nodes.iter().find(|n| n.name == "node-2").expect("node-2");
    assert!(
        ok(&node2.host) && ok(&node2.endpoint),
        "IPv4 still OK: {node2:?}"
    );
    assert!(
        !node2.reachable(),
        "a node is reachable only over all its paths"
    );
    assert_eq!(s.reachable(), NODES - 1, "{s:?}");
    let summary = s.summary();
    assert_eq!((summary.reachable, summary.unreachable), (NODES - 1, 1));
    let json = serde_json::to_value(node2).expect("json");
    assert_eq!(json["host"]["family"], "ipv4", "{json}");
    assert_eq!(json["host_secondary"]["family"], "ipv6", "{json}");

    // Back (switching IPv6 off removed the address; it is added again):
    // every path OK again.
    TwoNodes::sysctl(
        &cluster.nodes[1].ns,
        "net/ipv6/conf/uplink/disable_ipv6",
        "0",
    );
    let ip6 = cluster.nodes[1].ip6.expect("ip6");
    in_netns(Some(&cluster.nodes[1].ns), |nl| async move {
        nl.add_address("uplink", ip6, 64).await
    })
    .expect("node-2's IPv6 address again");
    let s = cluster.wait_status(0, Duration::from_secs(30), all_ok);

    // Node 2's record drops its IPv6 addresses: node 1's kernel RTT
    // entries of them go before its next round, and no late reply brings
    // them back; those of its IPv4 addresses stay.
    let node2 = s.nodes.iter().find(|n| n.name == "node-2").expect("node-2");
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = paths(node2)
        .into_iter()
        .map(|c| c.ip)
        .partition(IpAddr::is_ipv4);
    let timed = || -> Vec<IpAddr> {
        rtt::list(&cluster.nodes[0].pins)
            .expect("rtt list")
            .into_iter()
            .map(|r| r.peer)
            .collect()
    };
    assert!(v6.iter().all(|ip| timed().contains(ip)), "timed before");
    let dropped = format!(
        "    node-ip6: {}\n    health-cidr6: {}\n",
        node_ip6(1),
        health_cidr6(1)
    );
    let yaml = nodes_yaml_for(NODES, Family::Dual);
    assert!(yaml.contains(&dropped), "{yaml}");
    cluster.write_nodes_text(&yaml.replace(&dropped, ""));
    let round = |s: &ClusterStatus| s.round.as_ref().map_or(0, |r| r.seq);
    let one_family = cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.nodes
            .iter()
            .any(|n| n.name == "node-2" && n.host_secondary.is_none())
    });
    for later in [2, 4] {
        cluster.wait_status(0, Duration::from_secs(10), |s| {
            round(s) >= round(&one_family) + later
        });
        let peers = timed();
        assert!(
            v6.iter().all(|ip| !peers.contains(ip)) && v4.iter().all(|ip| peers.contains(ip)),
            "node-2's IPv6 entries gone, its IPv4 ones kept, {later} rounds on: {peers:?}"
        );
    }
}

#[test]
fn an_ipv6_only_cluster_reaches_every_path() {
    let cluster = Cluster::start(&settings(Family::V6));
    let s = cluster.wait_status(0, Duration::from_secs(60), all_ok);
    for n in &s.nodes {
        assert!(n.host.ip.is_ipv6() && n.endpoint.ip.is_ipv6(), "{n:?}");
        assert!(
            n.host_secondary.is_none() && n.endpoint_secondary.is_none(),
            "an IPv6-only node has no secondary family: {n:?}"
        );
    }
    let json = serde_json::to_value(&s.nodes[0]).expect("json");
    assert_eq!(json["host"]["family"], "ipv6", "{json}");
    assert!(json.get("host_secondary").is_none(), "{json}");
    // The endpoint has its IPv6 address from its CIDR and no IPv4 one.
    let eps = health_tests::api::call(&cluster.nodes[0].socket(), |c| async move {
        c.endpoints().await
    })
    .expect("endpoints");
    let ep = serde_json::to_value(eps.first().expect("endpoint")).expect("json");
    assert!(
        ep.to_string().contains("2001:2:0:40::2"),
        "endpoint 1 has 2001:2:0:40::2: {ep}"
    );
}

#[test]
fn dual_stack_nodes_join_through_etcd_with_both_families() {
    let cluster = Cluster::start(&Settings {
        etcd: true,
        ..settings(Family::Dual)
    });
    // Each agent publishes its IPv6 node address (found beside its IPv4
    // one) and its endpoint's IPv6 address; the others probe all 8 paths.
    let s = cluster.wait_status(0, Duration::from_secs(60), all_ok);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let n = s
            .nodes
            .iter()
            .find(|n| n.name == node.name)
            .unwrap_or_else(|| panic!("node {i} in the status"));
        assert_eq!(
            n.host_secondary.as_deref().map(|c| c.ip),
            node.ip6.map(IpAddr::V6),
            "{n:?}"
        );
    }
}
