//! What a writer of the etcd prefix can make an agent do, over a real etcd
//! and real namespaces: no route outside the cluster's health range or to
//! an address the node depends on, no record but at its exact key, no
//! address taken from the node that holds it, and this node's own record
//! written back when someone else changes or deletes it.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use health_agent::util::timefmt::now_ms;
use health_agent::{
    api::types::NodesView,
    cluster::{
        summary::{PathSample, PeerSummary, Summary},
        view::Verdict,
        view_cell::ClusterReply,
    },
    membership::routes::ROUTE_PROTOCOL,
    probe::path::ProbeResult,
    sys::netlink::{RouteV4, RouteWrite, in_netns},
};
use health_tests::cluster::{Cluster, ETCD_ENDPOINT, Settings, health_cidr, node_ip};
use nix::sys::signal::Signal;

/// A plain etcd client in the fabric namespace, for one call.
fn etcd<T: Send>(
    cluster: &Cluster,
    call: impl AsyncFnOnce(&mut etcd_client::Client) -> T + Send,
) -> T {
    health_agent::sys::netns::run_in(Some(&cluster.fabric), || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let mut c = etcd_client::Client::connect([format!("http://{ETCD_ENDPOINT}")], None)
                    .await
                    .expect("connect to etcd");
                call(&mut c).await
            })
    })
    .expect("fabric netns")
}

fn put(cluster: &Cluster, key: &str, value: &str) {
    let (key, value) = (key.to_owned(), value.to_owned());
    etcd(cluster, async move |c| {
        c.put(key, value, None).await.expect("etcd put");
    });
}

fn get(cluster: &Cluster, key: &str) -> Option<String> {
    let key = key.to_owned();
    etcd(cluster, async move |c| {
        let resp = c.get(key, None).await.expect("etcd get");
        resp.kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
    })
}

fn delete(cluster: &Cluster, key: &str) {
    let key = key.to_owned();
    etcd(cluster, async move |c| {
        c.delete(key, None).await.expect("etcd delete");
    });
}

/// Node `i`'s IPv4 host routes.
fn host_routes(cluster: &Cluster, i: usize) -> Vec<RouteV4> {
    in_netns(Some(&cluster.nodes[i].ns), |nl| async move {
        nl.routes::<Ipv4Addr>().await
    })
    .expect("routes")
    .into_iter()
    .filter(|r| r.prefix == 32)
    .collect()
}

fn record(name: &str, node: Ipv4Addr, health: &str) -> String {
    format!(r#"{{"name":"{name}","node_ip":"{node}","health_ip":"{health}"}}"#)
}

fn reason_of<'a>(view: &'a NodesView, key: &str) -> Option<&'a str> {
    view.rejected
        .iter()
        .find(|r| r.record == key)
        .map(|r| r.reason.as_str())
}

/// The records an etcd writer could use to redirect traffic: another
/// node's address, or etcd's, as a health address; a record at a key that
/// is not exactly `<prefix><name>`; another node's address claimed at a
/// key that sorts first. None of them moves a route or a node.
#[test]
fn an_etcd_writer_cannot_redirect_routes_or_take_a_nodes_place() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    let (n2, n3) = (node_ip(1), node_ip(2));
    put(
        &cluster,
        "/health/nodes/evil",
        &record("evil", n2, &n3.to_string()),
    );
    put(
        &cluster,
        "/health/nodes/evil-etcd",
        &record("evil-etcd", Ipv4Addr::new(198, 18, 0, 97), "198.18.0.1"),
    );
    put(
        &cluster,
        "/health/nodes/0/node-2",
        &record("node-2", Ipv4Addr::new(198, 18, 0, 96), "198.18.90.2"),
    );
    put(&cluster, "/health/nodes/0", &record("0", n2, "198.18.91.2"));
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.rejected_total == 4);
    assert_eq!(
        reason_of(&view, "/health/nodes/evil"),
        Some(
            format!(
                "health-ip {n3} is outside the cluster's health range 198.18.64.0/18 (--health-range)"
            )
            .as_str()
        ),
        "{view:#?}"
    );
    assert_eq!(
        reason_of(&view, "/health/nodes/evil-etcd"),
        Some(
            "health-ip 198.18.0.1 is outside the cluster's health range 198.18.64.0/18 (--health-range)"
        )
    );
    assert_eq!(
        reason_of(&view, "/health/nodes/0/node-2"),
        Some(
            "a node record counts only at exactly <prefix><name>: \"node-2\" belongs at \"/health/nodes/node-2\""
        )
    );
    assert_eq!(
        reason_of(&view, "/health/nodes/0"),
        Some(
            format!(
                "node-ip {n2} is already the node-ip of node \"node-2\" at etcd key \"/health/nodes/node-2\", which is kept"
            )
            .as_str()
        )
    );
    let names: Vec<&str> = view.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-1", "node-2", "node-3"]);
    assert_eq!(
        view.nodes.get("node-2").and_then(|n| n.node_ip),
        Some(n2),
        "node-2 keeps its address"
    );
    // No route of the agent's goes to another node's or etcd's address.
    let routes = host_routes(&cluster, 0);
    for dst in [n3, Ipv4Addr::new(198, 18, 0, 1)] {
        assert!(
            !routes
                .iter()
                .any(|r| r.destination == dst && r.protocol == ROUTE_PROTOCOL),
            "{dst}: {routes:?}"
        );
    }
    cluster.wait_status(0, Duration::from_secs(10), |s| s.reachable() == 3);

    // node-2 restarts: its record goes and comes back. The record at "0"
    // never gets node-2's address, neither in between nor after.
    cluster.stop_agent(1, Signal::SIGTERM);
    let gap = cluster.nodes[0]
        .wait_nodes_view(Duration::from_secs(10), |v| v.nodes.get("node-2").is_none());
    assert!(gap.nodes.get("0").is_none(), "{gap:#?}");
    assert_eq!(
        reason_of(&gap, "/health/nodes/0"),
        Some(
            format!("node-ip {n2} belongs to node \"node-2\", which held it first and keeps it")
                .as_str()
        )
    );
    cluster.start_agent(1);
    let back = cluster.nodes[0]
        .wait_nodes_view(Duration::from_secs(20), |v| v.nodes.get("node-2").is_some());
    assert!(back.nodes.get("0").is_none(), "{back:#?}");
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
    a_record_moved_away_gives_its_address_to_no_one(&cluster);
}

/// A writer moves node-2's record off its health address and, in the same
/// write, claims that address for a node of its own: no agent routes it
/// via the claimant, and node-2's agent, writing its record back, keeps
/// it.
fn a_record_moved_away_gives_its_address_to_no_one(cluster: &Cluster) {
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.nodes.len() == 3);
    let node2 = view.nodes.get("node-2").expect("node-2");
    let (n2, h2) = (
        node2.node_ip.expect("node-2's node address"),
        node2.health_ip.expect("node-2's health address"),
    );
    let elsewhere = Ipv4Addr::from(u32::from(h2) + 1).to_string();
    let claimant = Ipv4Addr::new(198, 18, 0, 95);
    let (moved, claim) = (
        record("node-2", n2, &elsewhere),
        record("evil-move", claimant, &h2.to_string()),
    );
    etcd(cluster, async move |c| {
        let ops = vec![
            etcd_client::TxnOp::put("/health/nodes/node-2", moved, None),
            etcd_client::TxnOp::put("/health/nodes/evil-move", claim, None),
        ];
        c.txn(etcd_client::Txn::new().and_then(ops))
            .await
            .expect("etcd txn");
    });
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        reason_of(v, "/health/nodes/evil-move").is_some()
            && v.nodes.get("node-2").and_then(|n| n.health_ip) == Some(h2)
    });
    assert!(view.nodes.get("evil-move").is_none(), "{view:#?}");
    let reason = reason_of(&view, "/health/nodes/evil-move").unwrap_or_default();
    assert!(
        reason.starts_with(&format!("health-ip {h2} ")) && reason.contains("node \"node-2\""),
        "{reason}"
    );
    for i in [0, 2] {
        let routes = host_routes(cluster, i);
        assert!(
            !routes
                .iter()
                .any(|r| r.destination == h2 && r.gateway == Some(claimant)),
            "node {i}: {routes:?}"
        );
    }
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
}

/// The health address node-4 will take, by node-1's place in its own
/// CIDR.
fn fourth_health_address(cluster: &Cluster) -> Ipv4Addr {
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.nodes.len() == 3);
    let own = view
        .nodes
        .get("node-1")
        .and_then(|n| n.health_ip)
        .expect("node-1's health address");
    assert_eq!(health_cidr(0), "198.18.64.0/24");
    assert_eq!(health_cidr(3), "198.18.67.0/24");
    let offset = u32::from(own) - u32::from(Ipv4Addr::new(198, 18, 64, 0));
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 67, 0)) + offset)
}

/// An allocation with a typo is listed at its key with why, apart from the
/// node records, though its node has no record; gone, it is no longer
/// listed.
fn an_allocation_counting_for_nothing_is_listed(cluster: &Cluster) {
    let key = "/health/allocations/typo";
    put(
        cluster,
        key,
        r#"{"health_cidr":"198.18.101.0/24","node_ip":"198.18.0.300"}"#,
    );
    let uncounted = |v: &NodesView| {
        v.allocations_uncounted
            .iter()
            .find(|r| r.record == key)
            .map(|r| r.reason.clone())
    };
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        uncounted(v).as_deref() == Some("refused: node_ip \"198.18.0.300\" is not an IPv4 address")
    });
    assert_eq!(view.allocations_uncounted_total, 1, "{view:#?}");
    assert_eq!(reason_of(&view, key), None, "not a node record");
    let (_, metrics) = health_tests::prometheus::http_get(
        &cluster.fabric,
        cluster.nodes[0].web_addr(),
        "/metrics",
    )
    .expect("the metrics listener");
    assert!(
        metrics
            .lines()
            .any(|l| l == "health_allocations_uncounted 1"),
        "{metrics}"
    );
    let text = cluster.nodes[0].refused_text();
    assert!(
        text.contains("Health allocations counting for nothing: 1\nKEY ")
            && text.contains(
                "/health/allocations/typo  typo  refused: node_ip \"198.18.0.300\" is not an IPv4 address"
            ),
        "{text}"
    );
    delete(cluster, key);
    cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        uncounted(v).is_none() && v.allocations_uncounted_total == 0
    });
}

/// node-4's allocation, refused for a mistyped CIDR, still keeps the node
/// address it names from the squatter.
fn a_refused_allocation_keeps_its_node_address(cluster: &Cluster) {
    put(
        cluster,
        "/health/allocations/node-4",
        &format!(
            r#"{{"health_cidr":"{}x","node_ip":"{}"}}"#,
            health_cidr(3),
            node_ip(3)
        ),
    );
    let refused = format!(
        "node-ip {} is named by the allocation at etcd key \"/health/allocations/node-4\", which is refused and counts for nothing: it is no other node's",
        node_ip(3)
    );
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        reason_of(v, "/health/nodes/squat") == Some(refused.as_str())
    });
    assert!(view.nodes.get("squat").is_none(), "{view:#?}");
}

/// With `--kvstore-allocations` (each node's health CIDR and node address
/// written by the admin at `/health/allocations/<name>`), a record
/// claiming the health address of a node not registered yet is refused
/// alone and routes nothing, an allocation of its own lets it claim no
/// other, a record holding a node address is refused once an allocation
/// names it for another node (a refused one too), and that node takes both addresses when it
/// comes, within the squatter's hold. Without allocations the first
/// claimant would keep them until it left, and 15 minutes more.
#[test]
fn no_node_takes_an_address_allocated_to_another() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        etcd_security: health_tests::etcd::Security {
            allocations: true,
            ..Default::default()
        },
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    let node4 = fourth_health_address(&cluster);
    put(
        &cluster,
        "/health/nodes/squat",
        &record("squat", Ipv4Addr::new(198, 18, 0, 90), &node4.to_string()),
    );
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.rejected_total == 1);
    assert_eq!(
        reason_of(&view, "/health/nodes/squat"),
        Some(
            format!(
                "health-ip {node4} is not allocated: no allocation at etcd key \"/health/allocations/squat\" (--kvstore-allocations)"
            )
            .as_str()
        ),
        "{view:#?}"
    );
    put(
        &cluster,
        "/health/allocations/squat",
        r#"{"health_cidr":"198.18.100.0/24"}"#,
    );
    let expected = format!(
        "health-ip {node4} is outside the node's allocation 198.18.100.0/24 (etcd key \"/health/allocations/squat\")"
    );
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        reason_of(v, "/health/nodes/squat") == Some(expected.as_str())
    });
    assert_eq!(view.nodes.len(), 3, "{view:#?}");
    assert!(
        !host_routes(&cluster, 0)
            .iter()
            .any(|r| r.destination == node4 && r.protocol == ROUTE_PROTOCOL),
        "no route to node-4's address"
    );
    an_allocation_counting_for_nothing_is_listed(&cluster);
    // The squatter takes node-4's node address while no allocation names
    // it (its health address now inside its own allocation)...
    put(
        &cluster,
        "/health/nodes/squat",
        &record("squat", node_ip(3), "198.18.100.2"),
    );
    cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        v.nodes.get("squat").and_then(|n| n.node_ip) == Some(node_ip(3))
    });
    // ... until node-4's allocation names it, even one refused for a slip
    // elsewhere in its value: then its record is refused, and what it
    // held stays held (for 15 minutes) from any claim the allocations do
    // not back.
    a_refused_allocation_keeps_its_node_address(&cluster);
    put(
        &cluster,
        "/health/allocations/node-4",
        &format!(
            r#"{{"health_cidr":"{}","node_ip":"{}"}}"#,
            health_cidr(3),
            node_ip(3)
        ),
    );
    let expected = format!(
        "node-ip {} is allocated to node \"node-4\" (etcd key \"/health/allocations/node-4\")",
        node_ip(3)
    );
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        reason_of(v, "/health/nodes/squat") == Some(expected.as_str())
    });
    assert!(view.nodes.get("squat").is_none(), "{view:#?}");
    // node-4 comes, its CIDR and address allocated to it: they are its, the
    // allocations outranking the squatter's hold.
    let i = cluster.join();
    cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes.len() == 4 && s.reachable() == 4
    });
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.nodes.len() == 4);
    assert_eq!(
        view.nodes.get("node-4").and_then(|n| n.health_ip),
        Some(node4)
    );
    assert_eq!(
        view.nodes.get("node-4").and_then(|n| n.node_ip),
        Some(node_ip(3))
    );
    assert_eq!(
        reason_of(&view, "/health/nodes/squat"),
        Some(expected.as_str())
    );
    let routes = host_routes(&cluster, 0);
    assert!(
        routes.iter().any(|r| r.destination == node4
            && r.gateway == Some(node_ip(i))
            && r.protocol == ROUTE_PROTOCOL),
        "{routes:?}"
    );
}

/// A health address inside the range that the agent must still not route:
/// one in a network the node is connected to is refused and listed; one
/// the node already reaches through a route the agent did not make is
/// left to that route.
#[test]
fn addresses_the_node_reaches_otherwise_are_not_routed() {
    const STATIC: u8 = 4;
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        etcd: true,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 2 && s.reachable() == 2
    });
    let foreign_net = Ipv4Addr::new(198, 18, 100, 0);
    in_netns(Some(&cluster.nodes[0].ns), |nl| async move {
        nl.add_address("uplink", Ipv4Addr::new(198, 18, 101, 1), 24)
            .await?;
        nl.write_route_owned(foreign_net, 24, node_ip(1), (STATIC, RouteWrite::Replace))
            .await
    })
    .expect("node-1's own network and route");
    put(
        &cluster,
        "/health/nodes/conn",
        &record("conn", Ipv4Addr::new(198, 18, 0, 95), "198.18.101.7"),
    );
    put(
        &cluster,
        "/health/nodes/routed",
        &record("routed", Ipv4Addr::new(198, 18, 0, 94), "198.18.100.7"),
    );
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| {
        v.nodes.len() == 4 && v.refused_routes_total == 1
    });
    let refused = &view.refused_routes[0];
    assert_eq!(
        (
            refused.node.as_str(),
            refused.address,
            refused.reason.as_str()
        ),
        (
            "conn",
            IpAddr::V4(Ipv4Addr::new(198, 18, 101, 7)),
            "inside this node's connected network 198.18.101.1/24"
        )
    );
    let routes = host_routes(&cluster, 0);
    for dst in [
        Ipv4Addr::new(198, 18, 101, 7),
        Ipv4Addr::new(198, 18, 100, 7),
    ] {
        assert!(
            !routes.iter().any(|r| r.destination == dst),
            "{dst}: {routes:?}"
        );
    }
    // node-2's route is still the agent's; the /24 is still someone else's.
    assert!(
        routes
            .iter()
            .any(|r| r.gateway == Some(node_ip(1)) && r.protocol == ROUTE_PROTOCOL),
        "{routes:?}"
    );
    let all = in_netns(Some(&cluster.nodes[0].ns), |nl| async move {
        nl.routes::<Ipv4Addr>().await
    })
    .expect("routes");
    assert!(
        all.iter()
            .any(|r| r.destination == foreign_net && r.prefix == 24 && r.protocol == STATIC),
        "{all:?}"
    );
}

/// This node's record is its own key, and the agent keeps it: changed or
/// deleted by someone else, it is written back.
#[test]
fn an_agent_writes_its_own_record_back() {
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        etcd: true,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 2);
    let key = "/health/nodes/node-1";
    let mine = get(&cluster, key).expect("node-1 registered");
    let wait_restored = |what: &str| {
        let deadline = Instant::now() + health_tests::patience(Duration::from_secs(10));
        loop {
            if get(&cluster, key).as_deref() == Some(mine.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not restored: {:?}\n{}",
                get(&cluster, key),
                cluster.nodes[0].log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    put(
        &cluster,
        key,
        &record("node-1", Ipv4Addr::new(198, 18, 0, 93), "198.18.64.9"),
    );
    wait_restored("overwritten");
    delete(&cluster, key);
    wait_restored("deleted");
    // Written under a lease of its own, as a second agent under node-1's
    // name (a cloned machine) would: the write-back names that lease.
    let forged = record("node-1", Ipv4Addr::new(198, 18, 0, 94), "198.18.64.9");
    let (k, v) = (key.to_owned(), forged);
    let lease = etcd(&cluster, async move |c| {
        let lease = c.lease_grant(60, None).await.expect("etcd lease").id();
        let leased = etcd_client::PutOptions::new().with_lease(lease);
        c.put(k, v, Some(leased)).await.expect("etcd put");
        lease
    });
    wait_restored("overwritten under a lease");
    let log = cluster.nodes[0].log();
    for said in [
        "record was changed without a lease, not by this agent".to_owned(),
        "record was deleted, not by this agent".to_owned(),
        format!(
            "record was changed under etcd lease {lease:x}, not this agent's: another agent may run under this node's name"
        ),
    ] {
        assert!(log.contains(&said), "{said}: {log}");
    }
    // Counted by whose change each undid, for an alert on the last kind.
    let metrics = health_tests::prometheus::http_get(
        &cluster.fabric,
        cluster.nodes[0].web_addr(),
        "/metrics",
    )
    .expect("the metrics listener")
    .1;
    for after in ["no_lease", "deleted", "other_lease"] {
        let series = format!("health_own_record_rewrites_total{{after=\"{after}\"}} 1\n");
        assert!(metrics.contains(&series), "{series}: {metrics}");
    }
    assert!(
        metrics.contains("health_own_record_rewrites_total{after=\"own_lease\"} 0\n"),
        "{metrics}"
    );
    // node-2 never lost node-1.
    cluster.wait_status(1, Duration::from_secs(10), |s| s.reachable() == 2);
}

/// `--max-nodes`: an etcd writer that grows the node set past the bound
/// gets the whole update refused, named in `/v1/nodes`; the agent keeps
/// probing its last good set, holds no more records than the bound, and
/// takes the next set within it (reading the prefix again for the record
/// it did not hold).
#[test]
fn a_node_set_past_max_nodes_keeps_the_last_good_one() {
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        etcd: true,
        extra_args: ["--max-nodes", "3"].map(String::from).to_vec(),
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 2 && s.reachable() == 2
    });
    let extra = |k: u8| {
        (
            format!("/health/nodes/extra-{k}"),
            record(
                &format!("extra-{k}"),
                Ipv4Addr::new(198, 18, 0, 90 + k),
                &format!("198.18.100.{}", 90 + k),
            ),
        )
    };
    let (one, two) = (extra(1), extra(2));
    put(&cluster, &one.0, &one.1);
    cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.nodes.len() == 3);
    put(&cluster, &two.0, &two.1);
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.error.is_some());
    assert_eq!(
        view.error.as_deref(),
        Some("4 records under /health/nodes/ could be nodes, more than --max-nodes 3 (1 not held)"),
        "{view:#?}"
    );
    let names: Vec<&str> = view.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["extra-1", "node-1", "node-2"], "the last good set");
    // Still probing the last good set: node-2 answers, extra-1 does not.
    cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.nodes.len() == 3 && s.reachable() == 2
    });
    delete(&cluster, &one.0);
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.error.is_none());
    let names: Vec<&str> = view.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["extra-2", "node-1", "node-2"]);
}

/// With peers, an agent without the health range of its family refuses to
/// start, naming the flag; a CIDR outside the range is named too.
#[test]
fn peers_without_a_health_range_refuse_to_start_naming_the_flag() {
    // A node of its own: were the refusal to regress, the agent would
    // make its endpoint there, never in the host's namespace.
    let node = health_tests::agent::AgentNode::new();
    let dir = &node.dir;
    let file = dir.join("nodes.yaml");
    std::fs::write(
        &file,
        "nodes:\n  - name: a\n    node-ip: 198.18.0.1\n    health-ip: 198.18.65.2\n",
    )
    .expect("write");
    for (args, needle) in [
        (
            &["--health-cidr", "198.18.64.0/24"][..],
            "--health-range is needed with peers",
        ),
        (
            &["--health-cidr6", "2001:2:0:40::/64"][..],
            "--health-range6 is needed with peers",
        ),
        (
            &[
                "--health-cidr",
                "198.18.64.0/24",
                "--health-range",
                "198.18.128.0/18",
            ][..],
            "--health-cidr 198.18.64.0/24 is not inside --health-range 198.18.128.0/18",
        ),
    ] {
        let mut cmd = std::process::Command::new(health_tests::agent::agent_binary());
        cmd.arg("daemon")
            .args(args)
            .arg("--nodes-file")
            .arg(&file)
            .arg("--pidfile")
            .arg(dir.join("pid"))
            .arg("--socket")
            .arg(dir.join("sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--endpoint-netns")
            .arg(&node.endpoint_netns)
            .arg("--bpffs-dir")
            .arg(&node.pins);
        health_tests::process::enter(&mut cmd, &node.node);
        let out =
            health_tests::process::output_within(&mut cmd, health_tests::process::EXIT_WITHIN);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!dir.join("sock").exists(), "nothing left behind");
    }
}

/// Node 1's cluster view (the elected assembler's), through the CLI.
fn cluster_view(cluster: &Cluster) -> Option<ClusterReply> {
    let out = std::process::Command::new(health_tests::agent::agent_binary())
        .args(["status", "--cluster", "-o", "json", "--socket"])
        .arg(cluster.nodes[0].socket())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// Three nodes counted, all healthy (none listed: the published view
/// lists the nodes that are not).
fn all_healthy(r: &ClusterReply) -> bool {
    r.view.counts.healthy == 3 && r.view.nodes.is_empty()
}

/// Summaries written where an agent's own would not be, or dated in the
/// future, say that every node fails: they are refused and the view stays
/// as the agents' own summaries make it.
#[test]
fn forged_summaries_do_not_reach_the_cluster_view() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        ..Settings::default()
    });
    let deadline = Instant::now() + health_tests::patience(Duration::from_secs(30));
    while !cluster_view(&cluster).is_some_and(|v| all_healthy(&v)) {
        assert!(
            Instant::now() < deadline,
            "{:#?}\n{}",
            cluster_view(&cluster),
            cluster.nodes[0].log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let now_ms = now_ms();
    let down = PathSample::new(ProbeResult::Failure, None);
    let all_down = |observer: &str, at_ms: u64| {
        let peers = ["node-1", "node-2", "node-3"]
            .into_iter()
            .filter(|n| *n != observer)
            .map(|n| PeerSummary::new(n, [down; 4]))
            .collect();
        Summary::new(observer.into(), u64::MAX / 2, at_ms, peers)
            .expect("summary")
            .encode()
    };
    let put_bytes = |key: &str, value: Vec<u8>| {
        let key = key.to_owned();
        etcd(&cluster, async move |c| {
            c.put(key, value, None).await.expect("etcd put");
        });
    };
    // At a key that is not the observer's; from an hour ahead.
    put_bytes("/health/summaries/x/node-2", all_down("node-2", now_ms));
    put_bytes(
        "/health/summaries/node-3",
        all_down("node-3", now_ms + 3_600_000),
    );
    // Several rounds on, no node is called down or degraded (node-3's own
    // summary, overwritten in etcd, is missing until its next round: the
    // nodes it observes may be unknown meanwhile), and the view is whole
    // again once node-3 has written its summary back.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let v = cluster_view(&cluster).expect("a view").view;
        assert!(
            v.nodes
                .iter()
                .all(|n| matches!(n.verdict, Verdict::Healthy | Verdict::Unknown)),
            "{v:#?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let deadline = Instant::now() + health_tests::patience(Duration::from_secs(10));
    while !cluster_view(&cluster).is_some_and(|v| all_healthy(&v)) {
        assert!(Instant::now() < deadline, "{:#?}", cluster_view(&cluster));
        std::thread::sleep(Duration::from_millis(300));
    }
    // The agent that assembles the view read the forged summaries.
    let by = cluster_view(&cluster)
        .and_then(|r| r.assembly)
        .expect("an assembled view")
        .assembled_by;
    let log = cluster
        .nodes
        .iter()
        .find(|n| n.name == by)
        .expect("the assembler is a node")
        .log();
    assert!(log.contains("summaries refused and left out"), "{log}");
    a_summary_read_before_its_observers_record_counts_once_it_is(&cluster, &by);
}

/// A joining node's summary read by the assembler `by` before the node's
/// record is refused, and counts as soon as the record is read, though
/// its observer never writes it again.
fn a_summary_read_before_its_observers_record_counts_once_it_is(cluster: &Cluster, by: &str) {
    let now_ms = now_ms();
    let up = PathSample::new(ProbeResult::Success, Some(100));
    let peers = ["node-1", "node-2", "node-3"]
        .into_iter()
        .map(|n| PeerSummary::new(n, [up; 4]))
        .collect();
    // Current for a minute whatever the readers' interval.
    let summary = Summary::new("node-4".into(), 1, now_ms, peers)
        .expect("summary")
        .with_cadence(Duration::from_secs(20))
        .encode();
    etcd(cluster, async move |c| {
        c.put("/health/summaries/node-4", summary, None)
            .await
            .expect("etcd put");
    });
    let assembler = cluster
        .nodes
        .iter()
        .find(|n| n.name == by)
        .expect("the assembler is a node");
    let refused = "its observer \"node-4\" is not in the node set";
    let deadline = Instant::now() + health_tests::patience(Duration::from_secs(10));
    while !assembler.log().contains(refused) {
        assert!(Instant::now() < deadline, "{}", assembler.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let reporting = |r: &ClusterReply| {
        r.view
            .nodes
            .iter()
            .find(|n| n.name == "node-4")
            .map(|n| n.reporting)
    };
    let health = fourth_health_address(cluster).to_string();
    put(
        cluster,
        "/health/nodes/node-4",
        &record("node-4", node_ip(3), &health),
    );
    let deadline = Instant::now() + health_tests::patience(Duration::from_secs(10));
    loop {
        let view = cluster_view(cluster);
        if view.as_ref().and_then(reporting) == Some(true) {
            break;
        }
        assert!(Instant::now() < deadline, "{view:#?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}
