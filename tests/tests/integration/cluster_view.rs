//! The cluster view: six agents on etcd, each probing a subset
//! (`--probe-peers 2`) and publishing its rounds' summaries; the elected
//! agent assembles everyone's and publishes the view, which every agent
//! shows. A node whose link goes down is "node down" on every other
//! agent; ICMP dropped on one observer's path to one node is "path
//! degraded" there, not "node down". At the default intervals (rounds
//! every 60 s, liveness echoes every 3 s) a node that stops is node down
//! in the published view within 10 s.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use health_agent::{
    cluster::view::{ClusterView, Verdict},
    probe::status::ClusterStatus,
};
use health_tests::{
    cluster::{Cluster, ClusterNode, Settings},
    faults::DropIcmp,
};

fn view(node: &ClusterNode) -> Option<ClusterView> {
    node.cluster_json()
}

/// Waits until `node`'s view satisfies `ok`; returns it.
fn wait_view(
    node: &ClusterNode,
    timeout: Duration,
    what: &str,
    ok: impl Fn(&ClusterView) -> bool,
) -> ClusterView {
    node.wait_cluster_json(timeout, what, ok)
}

/// The nodes counted in the view.
fn counted(v: &ClusterView) -> usize {
    let c = &v.counts;
    c.healthy + c.node_down + c.path_degraded + c.observer_problem + c.unknown
}

/// A node's verdict: as listed, or healthy when the view (which lists the
/// nodes not healthy) counts all six and does not list it.
fn verdict(v: &ClusterView, name: &str) -> Option<Verdict> {
    match v.node(name) {
        Some(n) => Some(n.verdict),
        None => (counted(v) == 6).then_some(Verdict::Healthy),
    }
}

fn probed(status: &ClusterStatus) -> Vec<String> {
    status.nodes.iter().map(|n| n.name.clone()).collect()
}

#[test]
fn six_agents_on_a_subset_localise_a_node_down_and_a_degraded_path() {
    let cluster = Cluster::start(&Settings {
        nodes: 6,
        etcd: true,
        extra_args: vec!["--probe-peers".into(), "2".into()],
        // A node that goes down stays in the node set while the others
        // see it fail.
        lease_ttl: "5m",
        ..Settings::default()
    });
    // Every node observed, each agent probing a subset; healthy where two
    // observers or more report (one alone is too few for a verdict).
    for node in &cluster.nodes {
        wait_view(
            node,
            Duration::from_secs(40),
            "six nodes observed",
            all_well,
        );
    }
    let statuses: Vec<ClusterStatus> = cluster
        .nodes
        .iter()
        .map(|n| n.status().expect("status"))
        .collect();
    for (node, s) in cluster.nodes.iter().zip(&statuses) {
        assert!(
            s.nodes.len() <= 3,
            "{} probes {:?}: more than itself and 2 peers",
            node.name,
            probed(s)
        );
    }

    // A degraded path: ICMP from one observer to one node it probes.
    let view0 = view(&cluster.nodes[0]).expect("view");
    let (target, observer) = pick_observed(&cluster, &statuses, &view0);
    let observer_ip = statuses[observer]
        .nodes
        .iter()
        .find(|n| n.name == cluster.nodes[observer].name)
        .map(|n| match n.endpoint.ip {
            std::net::IpAddr::V4(ip) => ip,
            std::net::IpAddr::V6(ip) => panic!("an IPv4 cluster, not {ip}"),
        })
        .expect("the observer probes itself");
    let target_name = cluster.nodes[target].name.clone();
    {
        let _filter = DropIcmp::attach_from(&cluster.nodes[target].ns, "uplink", observer_ip)
            .expect("tc filter");
        for (i, node) in cluster.nodes.iter().enumerate() {
            let v = wait_view(node, Duration::from_secs(30), "path degraded", |v| {
                verdict(v, &target_name) == Some(Verdict::PathDegraded)
            });
            let n = v.node(&target_name).expect("target");
            assert!(
                n.failing_observers.contains(&cluster.nodes[observer].name),
                "node {i}: {n:#?}"
            );
            assert_eq!(v.counts.node_down, 0, "{v:#?}");
        }
    }
    for node in &cluster.nodes {
        wait_view(node, Duration::from_secs(30), "healthy again", all_well);
    }

    // A node down: its link, seen by every other agent.
    cluster.nodes[target].set_uplink(false);
    for (i, node) in cluster.nodes.iter().enumerate() {
        if i == target {
            continue;
        }
        wait_view(node, Duration::from_secs(40), "node down", |v| {
            verdict(v, &target_name) == Some(Verdict::NodeDown) && v.counts.node_down == 1
        });
    }
    // The matrix (served by the agent that assembles the view) says the
    // same cell by cell: the target's column is all failures in the rows
    // of the observers that probe it.
    let assembler = assembler(&cluster);
    let m = health_tests::api::call(
        &assembler.socket(),
        |c| async move { c.cluster_matrix().await },
    )
    .expect("GET /v1/cluster/matrix");
    assert_eq!(m.nodes.len(), 6, "{m:#?}");
    let col = m
        .nodes
        .iter()
        .position(|n| *n == target_name)
        .expect("target");
    let seen: Vec<u8> = m
        .rows
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != col)
        .map(|(_, r)| r.as_bytes()[col])
        .filter(|c| *c != b'.')
        .collect();
    assert!(
        seen.len() >= 2 && seen.iter().all(|c| *c == b'F'),
        "column {col} of {m:#?}"
    );
    cluster.nodes[target].set_uplink(true);
    for node in &cluster.nodes {
        wait_view(
            node,
            Duration::from_secs(40),
            "healthy after the link is back",
            all_well,
        );
    }
}

#[test]
fn at_the_default_intervals_a_node_that_stops_is_down_in_the_view_within_ten_seconds() {
    let cluster = Cluster::start(&Settings {
        nodes: 6,
        etcd: true,
        probe_interval: "60s",
        lease_ttl: "5m",
        ..Settings::default()
    });
    let healthy = |v: &ClusterView| counted(v) == 6 && v.reports == 6 && v.counts.healthy == 6;
    for node in &cluster.nodes {
        wait_view(node, Duration::from_secs(40), "six nodes healthy", healthy);
    }
    // Not the assembler: its failover is another test's; this one times
    // the liveness echoes, the round they set off and the next view.
    let leader = assembler(&cluster).name.clone();
    let target = cluster
        .nodes
        .iter()
        .rposition(|n| n.name != leader)
        .expect("a node that does not assemble");
    let name = cluster.nodes[target].name.clone();
    let t0 = Instant::now();
    cluster.nodes[target].set_uplink(false);
    let mut seen: Vec<Option<Duration>> = vec![None; cluster.nodes.len()];
    seen[target] = Some(Duration::ZERO);
    while seen.iter().any(Option::is_none) && t0.elapsed() < Duration::from_secs(40) {
        for (i, node) in cluster.nodes.iter().enumerate() {
            if seen[i].is_none()
                && view(node).is_some_and(|v| verdict(&v, &name) == Some(Verdict::NodeDown))
            {
                seen[i] = Some(t0.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let worst = seen.iter().flatten().max().copied();
    assert!(
        seen.iter().all(Option::is_some) && worst <= Some(Duration::from_secs(10)),
        "a node that stopped is node down within 10 s at the default intervals: {worst:?} (each agent: {seen:?})"
    );
    println!("{name} stopped: node down in every view after {worst:?} (each agent: {seen:?})");
    // Back: its echoes answered, it is probed at once and healthy again
    // well before the next round.
    let t1 = Instant::now();
    cluster.nodes[target].set_uplink(true);
    let deadline = health_tests::patience(Duration::from_secs(40));
    for node in &cluster.nodes {
        while !view(node).is_some_and(|v| healthy(&v)) {
            assert!(
                t1.elapsed() < deadline,
                "{}: {name} not healthy again after {:?}\n{}",
                node.name,
                t1.elapsed(),
                how_each_sees(&cluster, &name)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let back = t1.elapsed();
    println!("{name} back: healthy in every view after {back:?}");
    // Its address answers before its agent has put its routes back: the
    // early rounds that follow news find its endpoint too.
    assert!(
        back < Duration::from_secs(15),
        "healthy again after {back:?}, not at the next round"
    );
}

/// What each agent makes of `name` (its own paths to it, and its view),
/// then the tails of every agent's log: what a failure needs to be read.
fn how_each_sees(cluster: &Cluster, name: &str) -> String {
    let mut out = String::new();
    for node in &cluster.nodes {
        let paths = node.status().and_then(|s| {
            s.nodes.iter().find(|n| n.name == name).map(|n| {
                // Each path's state and the failures in a row behind it
                // (a state below the failure threshold reads as failing).
                let p = |s: &health_agent::probe::path::PathState| {
                    format!("{:?} ({} failed)", s.result, s.consecutive_failures)
                };
                format!(
                    "host icmp {} http {}, endpoint icmp {} http {}",
                    p(&n.host.icmp),
                    p(&n.host.http),
                    p(&n.endpoint.icmp),
                    p(&n.endpoint.http)
                )
            })
        });
        let seen = view(node).map(|v| (v.reports, verdict(&v, name)));
        let _ = writeln!(
            out,
            "{}: its paths to {name}: {paths:?}; its view (reports, verdict): {seen:?}",
            node.name
        );
    }
    for node in &cluster.nodes {
        let log = node.log();
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        let _ = writeln!(out, "--- {} log, last lines:", node.name);
        for l in tail.iter().rev() {
            out += l;
            out.push('\n');
        }
    }
    out
}

/// The agent that assembles the view (and serves the matrix), as node 1's
/// view names it.
fn assembler(cluster: &Cluster) -> &ClusterNode {
    let name = health_tests::api::call(
        &cluster.nodes[0].socket(),
        |c| async move { c.cluster().await },
    )
    .expect("GET /v1/cluster")
    .assembly
    .expect("a published view")
    .assembled_by;
    cluster
        .nodes
        .iter()
        .find(|n| n.name == name)
        .expect("the assembler is a node")
}

/// Six nodes, each with an observer; healthy with two or more, unknown
/// with one. The published view lists the nodes not healthy: each one
/// unknown with its one observer; the others healthy (two observers or
/// more make a verdict).
fn all_well(v: &ClusterView) -> bool {
    counted(v) == 6
        && v.reports == 6
        && v.counts.healthy + v.counts.unknown == 6
        && v.nodes.len() == v.counts.unknown
        && v.nodes
            .iter()
            .all(|n| n.observers == 1 && n.verdict == Verdict::Unknown)
}

/// A node with at least two observers and one of them (by the agents'
/// statuses: who probes whom).
fn pick_observed(
    cluster: &Cluster,
    statuses: &[ClusterStatus],
    view: &ClusterView,
) -> (usize, usize) {
    for (t, node) in cluster.nodes.iter().enumerate() {
        // Healthy (not listed) means two observers or more.
        let two_observers = view
            .node(&node.name)
            .map_or(verdict(view, &node.name) == Some(Verdict::Healthy), |n| {
                n.observers >= 2
            });
        let observer = statuses
            .iter()
            .enumerate()
            .find(|(o, s)| *o != t && s.nodes.iter().any(|n| n.name == node.name));
        if two_observers && let Some((o, _)) = observer {
            return (t, o);
        }
    }
    panic!("no node has two observers: {view:#?}");
}
