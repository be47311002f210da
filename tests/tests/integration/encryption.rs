//! The encryption check on a kernel with WireGuard (the 6.12 guest of the
//! kernel matrix: `cargo xtask test --kernel 6.12`; the host's kernel has
//! no WireGuard): a 3-node cluster whose node addresses live on `wg0`,
//! every path encrypted; then one peer's AllowedIPs without its health
//! CIDR (not covered), a route that sends one node's address around the
//! tunnel (plaintext), and a peer that stops answering handshakes
//! (stale). And, on any kernel, a node without WireGuard says so.

use std::{net::IpAddr, time::Duration};

use health_agent::{
    encryption::EncState,
    probe::status::{ClusterStatus, NodeStatus},
    sys::netlink::in_netns,
};
use health_tests::{
    cluster::{Cluster, Family, Settings},
    topology::TwoNodes,
    wireguard,
};

fn node<'a>(s: &'a ClusterStatus, name: &str) -> &'a NodeStatus {
    s.nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("{name} missing from {s:#?}"))
}

/// The encryption state of `name`'s node (`endpoint`: health) address.
fn state(s: &ClusterStatus, name: &str, endpoint: bool) -> Option<EncState> {
    let n = node(s, name);
    let c = if endpoint { &n.endpoint } else { &n.host };
    c.encryption.as_ref().map(|e| e.state)
}

/// The addresses node `i`'s encryption check watches (`ENCRYPT_WATCH`).
fn watched(cluster: &Cluster, i: usize) -> Vec<IpAddr> {
    health_agent::datapath::encrypt_watch::list(&cluster.nodes[i].pins)
        .expect("ENCRYPT_WATCH")
        .into_iter()
        .map(|r| r.destination)
        .collect()
}

fn peers_are(s: &ClusterStatus, want: &[(&str, bool, EncState)]) -> bool {
    want.iter()
        .all(|(name, endpoint, st)| state(s, name, *endpoint) == Some(*st))
}

fn settings() -> Settings {
    Settings {
        wireguard: true,
        // Discovery through etcd: the cluster view (assembled from the
        // agents' summaries there) lists the node reached in plain text.
        etcd: true,
        extra_args: [
            "--encryption",
            "wireguard",
            "--encryption-handshake-margin",
            "10s",
        ]
        .map(String::from)
        .to_vec(),
        ..Settings::default()
    }
}

#[test]
#[ignore = "needs a kernel with WireGuard: cargo xtask test --kernel 6.12 runs it"]
fn wireguard_paths_are_encrypted_and_each_fault_is_named() {
    let cluster = Cluster::start(&settings());
    every_path_encrypted(&cluster);
    health_routed_into_the_tunnel(&cluster);
    not_covered_and_plaintext_are_named(&cluster);
    stale_while_the_other_peer_rekeys(&cluster);
}

/// Every path of every node encrypted, reachable.
fn every_path_encrypted(cluster: &Cluster) {
    use EncState::Encrypted;
    for i in 0..3 {
        let s = cluster.wait_status(i, Duration::from_secs(40), |s| {
            s.reachable() == 3
                && s.nodes
                    .iter()
                    .filter(|n| s.local_node.as_deref() != Some(n.name.as_str()))
                    .all(|n| {
                        n.connectivities()
                            .all(|c| c.encryption.as_ref().map(|e| e.state) == Some(Encrypted))
                    })
        });
        let e = s.encryption.as_ref().expect("the check's summary");
        assert_eq!(e.device.as_deref(), Some(wireguard::DEVICE));
        assert_eq!(e.paths["encrypted"], 4, "{e:?}");
    }
    let text = cluster.nodes[0].status_text();
    assert!(text.contains("encrypted"), "{text}");
}

/// The agent routed the peers' health addresses into the tunnel.
fn health_routed_into_the_tunnel(cluster: &Cluster) {
    let a = &cluster.nodes[0];
    let routed = in_netns(Some(&a.ns), |nl| async move {
        nl.routes::<std::net::Ipv4Addr>().await
    })
    .expect("routes");
    let wg_index = in_netns(Some(&a.ns), |nl| async move {
        nl.require_link(wireguard::DEVICE).await
    })
    .expect("wg0");
    let health_b: IpAddr = node(&a.status().expect("status"), "node-2").endpoint.ip;
    assert!(
        routed.iter().any(|r| IpAddr::V4(r.destination) == health_b
            && r.prefix == 32
            && r.oif == Some(wg_index)
            && r.gateway.is_none()),
        "no route to {health_b} into {}: {routed:?}",
        wireguard::DEVICE
    );
}

/// node-2's AllowedIPs on node-1 lose its health CIDR (not covered) and
/// its node address is routed around the tunnel (plaintext); put back,
/// both are encrypted again.
fn not_covered_and_plaintext_are_named(cluster: &Cluster) {
    use EncState::{Encrypted, NotCovered, Plaintext};
    let (keys, a) = (&cluster.wg_keys, &cluster.nodes[0]);
    wireguard::set_allowed_ips(&a.ns, &keys[1], &format!("{}/32", wireguard::node_ip(1)));
    // node-2's node address routed around the tunnel, over the fabric.
    let (via, dest) = (health_tests::cluster::node_ip(1), wireguard::node_ip(1));
    TwoNodes::sysctl(&cluster.nodes[1].ns, "net/ipv4/conf/all/rp_filter", "0");
    TwoNodes::sysctl(&cluster.nodes[1].ns, "net/ipv4/conf/uplink/rp_filter", "0");
    in_netns(Some(&a.ns), |nl| async move {
        nl.replace_route(dest, 32, "uplink", Some(via)).await
    })
    .expect("a route around the tunnel");
    let s = cluster.wait_status(0, Duration::from_secs(30), |s| {
        peers_are(
            s,
            &[("node-2", true, NotCovered), ("node-2", false, Plaintext)],
        )
    });
    let b = node(&s, "node-2");
    let why = b
        .endpoint
        .encryption
        .as_ref()
        .and_then(|e| e.reason.clone());
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("outside the AllowedIPs")),
        "{why:?}"
    );
    assert_eq!(
        state(&s, "node-3", false),
        Some(Encrypted),
        "the other peer is untouched"
    );
    let e = s.encryption.as_ref().expect("summary");
    assert_eq!(
        (e.paths["plaintext"], e.paths["not_covered"]),
        (1, 1),
        "{e:?}"
    );
    let text = a.status_text();
    assert!(
        text.contains("plaintext") && text.contains("not covered"),
        "{text}"
    );
    // The cluster view lists it though every path answers.
    let deadline = std::time::Instant::now() + health_tests::patience(Duration::from_secs(30));
    let mut view = a.cluster_text();
    while !view.contains("Plain text:       1 nodes reached outside the WireGuard tunnel") {
        assert!(std::time::Instant::now() < deadline, "{view}");
        std::thread::sleep(Duration::from_millis(500));
        view = a.cluster_text();
    }
    assert!(view.contains("): node-2"), "{view}");

    // Put back: encrypted again.
    in_netns(Some(&a.ns), |nl| async move {
        nl.delete_route(dest, 32, "uplink").await
    })
    .expect("route removed");
    wireguard::set_allowed_ips(
        &a.ns,
        &keys[1],
        &format!(
            "{}/32,{}",
            wireguard::node_ip(1),
            health_tests::cluster::health_cidr(1)
        ),
    );
    cluster.wait_status(0, Duration::from_secs(30), |s| {
        peers_are(
            s,
            &[("node-2", true, Encrypted), ("node-2", false, Encrypted)],
        )
    });
}

fn stale_while_the_other_peer_rekeys(cluster: &Cluster) {
    use EncState::{Encrypted, Stale};
    let keys = &cluster.wg_keys;
    // node-3 forgets node-1: node-1's probes still go to node-3's peer,
    // whose last handshake ages past 2 minutes and the 10 s margin, while
    // node-2's handshake is renewed (WireGuard rekeys after 2 minutes).
    wireguard::remove_peer(&cluster.nodes[2].ns, &keys[0]);
    let s = cluster.wait_status(0, Duration::from_secs(200), |s| {
        peers_are(s, &[("node-3", false, Stale), ("node-3", true, Stale)])
    });
    assert!(
        peers_are(
            &s,
            &[("node-2", false, Encrypted), ("node-2", true, Encrypted)]
        ),
        "a peer in use keeps a fresh handshake: {:#?}",
        node(&s, "node-2")
    );
    let why = node(&s, "node-3")
        .host
        .encryption
        .as_ref()
        .and_then(|e| e.reason.clone());
    assert!(
        why.as_deref().is_some_and(|w| w.contains("last handshake")),
        "{why:?}"
    );
}

#[test]
#[ignore = "needs a kernel with WireGuard: cargo xtask test --kernel 6.12 runs it"]
fn ipv6_health_addresses_left_out_of_allowed_ips_are_not_covered_and_named() {
    use EncState::{Encrypted, NotCovered};
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        family: Family::V6,
        wireguard: true,
        extra_args: ["--encryption", "wireguard"].map(String::from).to_vec(),
        ..Settings::default()
    });
    let s = cluster.wait_status(0, Duration::from_secs(40), |s| {
        s.reachable() == 2
            && peers_are(
                s,
                &[("node-2", false, Encrypted), ("node-2", true, Encrypted)],
            )
    });
    assert!(
        node(&s, "node-2").endpoint.ip.is_ipv6(),
        "IPv6 only: {s:#?}"
    );
    // The AllowedIPs of an IPv6-only cluster without the health CIDRs.
    let a = &cluster.nodes[0];
    wireguard::set_allowed_ips(
        &a.ns,
        &cluster.wg_keys[1],
        &format!("{}/128", wireguard::node_ip6(1)),
    );
    let s = cluster.wait_status(0, Duration::from_secs(30), |s| {
        peers_are(
            s,
            &[("node-2", true, NotCovered), ("node-2", false, Encrypted)],
        )
    });
    let b = node(&s, "node-2");
    let why = b
        .endpoint
        .encryption
        .as_ref()
        .and_then(|e| e.reason.clone())
        .unwrap_or_default();
    assert!(
        why.contains(&b.endpoint.ip.to_string()) && why.contains("outside the AllowedIPs"),
        "{why}"
    );
}

#[test]
fn without_a_wireguard_device_every_path_is_unknown_and_the_status_says_why() {
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        extra_args: ["--encryption", "wireguard"].map(String::from).to_vec(),
        ..Settings::default()
    });
    let s = cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.reachable() == 2 && s.encryption.as_ref().is_some_and(|e| e.error.is_some())
    });
    let e = s.encryption.as_ref().expect("summary");
    assert!(
        e.error
            .as_deref()
            .is_some_and(|w| w.contains("no WireGuard device")),
        "{e:?}"
    );
    assert_eq!(e.paths["unknown"], 2, "node-2's two addresses: {e:?}");
    assert_eq!(state(&s, "node-2", true), Some(EncState::Unknown));
    // Probing goes on regardless: the peer is reachable.
    assert!(node(&s, "node-2").reachable());
    // The counters watch the peer's two addresses (not this node's).
    let watched = watched(&cluster, 0);
    let b = node(&s, "node-2");
    assert_eq!(watched.len(), 2, "{watched:?}");
    assert!(watched.contains(&b.host.ip) && watched.contains(&b.endpoint.ip));
}

/// A round over some nodes (the round of a node that joined, or of those
/// whose liveness echo is news) judges no encryption: the verdicts and
/// the watched addresses stay those of the last round over the whole set,
/// not the few nodes of that round, until the next whole round.
#[test]
fn a_round_of_a_node_that_joined_leaves_the_encryption_check_to_whole_rounds() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 2,
        // No whole round between the first and the end of the test.
        probe_interval: "120s",
        extra_args: ["--encryption", "wireguard"].map(String::from).to_vec(),
        ..Settings::default()
    });
    let first = cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.reachable() == 2 && s.encryption.as_ref().is_some_and(|e| e.error.is_some())
    });
    let round = first.round.as_ref().map(|r| r.started_ms);
    let third = cluster.join();
    cluster.write_nodes_file(third + 1);
    let s = cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && node(s, "node-3").reachable()
    });
    assert_eq!(
        s.round.as_ref().map(|r| r.started_ms),
        round,
        "node-3 was probed in a round of its own, not a whole one"
    );
    let e = s.encryption.as_ref().expect("summary");
    assert_eq!(e.paths["unknown"], 2, "node-2's two addresses still: {e:?}");
    assert_eq!(state(&s, "node-2", true), Some(EncState::Unknown));
    assert_eq!(state(&s, "node-3", true), None, "not judged yet");
    let watched = watched(&cluster, 0);
    let b = node(&s, "node-2");
    assert_eq!(
        watched.len(),
        2,
        "node-2's, as the whole round left them: {watched:?}"
    );
    assert!(watched.contains(&b.host.ip) && watched.contains(&b.endpoint.ip));
}
