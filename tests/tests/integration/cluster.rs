//! Local clusters of namespaces, each node running the real agent: full-mesh
//! probing, reachability changes, partial failures.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use health_agent::util::timefmt::now_ms;
use health_agent::{
    api::types::NodesView,
    datapath::{classic::PRIORITY, rtt},
    membership::routes::ROUTE_PROTOCOL,
    sys::{
        netlink::{TcDirection, in_netns},
        netns::Netns,
    },
};

use health_agent::probe::{
    history::{EntryOutcome, NodeHistory},
    path::{ProbeResult, RttSource},
    status::ClusterStatus,
};
use health_tests::{
    cluster::{Cluster, ClusterNode, Settings, nodes_yaml},
    faults::DropIcmp,
    watch::Watching,
};

fn all_paths(s: &ClusterStatus, r: ProbeResult) -> bool {
    s.nodes.iter().all(|n| {
        [
            &n.host.icmp,
            &n.host.http,
            &n.endpoint.icmp,
            &n.endpoint.http,
        ]
        .iter()
        .all(|p| p.result == r)
    })
}

fn node<'a>(s: &'a ClusterStatus, name: &str) -> &'a health_agent::probe::status::NodeStatus {
    s.nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("{name} missing from {s:#?}"))
}

#[test]
fn five_nodes_reach_five_of_five_with_all_paths_ok() {
    let cluster = Cluster::start(&Settings {
        nodes: 5,
        ..Settings::default()
    });
    for i in 0..5 {
        let s = cluster.wait_status(i, Duration::from_secs(20), |s| {
            s.nodes.len() == 5 && s.reachable() == 5 && all_paths(s, ProbeResult::Success)
        });
        assert_eq!(
            s.local_node.as_deref(),
            Some(format!("node-{}", i + 1).as_str())
        );
        for n in &s.nodes {
            for p in [
                &n.host.icmp,
                &n.host.http,
                &n.endpoint.icmp,
                &n.endpoint.http,
            ] {
                assert!(
                    p.rtt_ns.is_some_and(|ns| ns > 0),
                    "{}: no RTT in {p:?}",
                    n.name
                );
            }
        }
    }
}

/// The cluster of the kernel matrix (`cargo xtask test --kernel`): three
/// nodes reach 3/3 with every path OK, each with the tc hook its kernel
/// has, then SIGTERM leaves nothing on any node: no endpoint namespace,
/// no `lxc_health`, no tc filter of the agent's, no pins.
#[test]
fn three_nodes_reach_three_of_three_and_sigterm_leaves_nothing() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        ..Settings::default()
    });
    for i in 0..3 {
        cluster.wait_status(i, Duration::from_secs(20), |s| {
            s.nodes.len() == 3 && s.reachable() == 3 && all_paths(s, ProbeResult::Success)
        });
        // Every probe to another node crosses `lxc_health`, whose programs
        // time it: each path's RTT is the kernel's.
        cluster.wait_status(i, Duration::from_secs(20), |s| {
            s.nodes
                .iter()
                .filter(|n| s.local_node.as_deref() != Some(n.name.as_str()))
                .flat_map(|n| {
                    [
                        &n.host.icmp,
                        &n.host.http,
                        &n.endpoint.icmp,
                        &n.endpoint.http,
                    ]
                })
                .all(|p| p.rtt_source == Some(RttSource::Kernel))
        });
    }
    cluster.stop_agents();
    for node in &cluster.nodes {
        let ep = Netns::named(&node.endpoint_netns).expect("name");
        assert!(!ep.exists(), "{}: endpoint namespace left", node.name);
        let links = in_netns(Some(&node.ns), |nl| async move {
            let lxc = nl.link_index("lxc_health").await?;
            let mut ours = 0;
            for dir in [TcDirection::Ingress, TcDirection::Egress] {
                ours += nl
                    .tc_filters("uplink", dir)
                    .await?
                    .iter()
                    .filter(|f| f.priority == PRIORITY)
                    .count();
            }
            Ok((lxc, ours))
        })
        .expect("netlink");
        assert_eq!(
            links,
            (None, 0),
            "{}: lxc_health or tc filters left",
            node.name
        );
        assert!(!node.pins.exists(), "{}: pins left", node.name);
    }
}

#[test]
fn a_node_whose_link_goes_down_turns_unreachable_then_recovers() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        failure_threshold: 2,
        success_threshold: 1,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
    // An operator following the rounds meanwhile.
    let mut watching = Watching::start(&cluster.nodes[0].socket());
    cluster.nodes[2].set_uplink(false);
    let down = cluster.wait_status(0, Duration::from_secs(10), |s| {
        !node(s, "node-3").reachable()
    });
    let n3 = node(&down, "node-3");
    assert_eq!(n3.host.icmp.result, ProbeResult::Failure, "{n3:#?}");
    assert!(
        n3.host.icmp.consecutive_failures >= 2,
        "failure only after the threshold: {n3:#?}"
    );
    assert!(n3.host.icmp.last_error.is_some());
    assert!(
        node(&down, "node-2").reachable(),
        "the others stay reachable"
    );
    assert!(node(&down, "node-1").reachable());

    cluster.nodes[2].set_uplink(true);
    let up = cluster.wait_status(0, Duration::from_secs(10), |s| s.reachable() == 3);
    assert!(node(&up, "node-3").host.icmp.consecutive_successes >= 1);

    // `status --watch` wrote a row a round as it ended: node-3 named while
    // it was down, not before nor after.
    let up_seq = up.round.as_ref().expect("a round").seq;
    let rows = watching.rows_until(|rows| rows.last().is_some_and(|r| r.seq >= up_seq));
    let states: Vec<&str> = rows
        .iter()
        .map(|r| match (r.unreachable, r.names.as_str()) {
            (0, "") => "up",
            (1, "node-3") => "down",
            _ => panic!("a row neither all up nor node-3 down: {rows:#?}"),
        })
        .collect();
    let mut runs = states.clone();
    runs.dedup();
    assert_eq!(runs, ["up", "down", "up"], "{rows:#?}");
    assert!(
        rows.windows(2).all(|w| w[0].seq < w[1].seq),
        "rounds in order, each once: {rows:#?}"
    );

    // The history tells the same story in order: successes, the failures
    // (among them the one the status showed), successes again.
    let out = std::process::Command::new(health_tests::agent::agent_binary())
        .args(["status", "--history", "node-3", "-o", "json", "--socket"])
        .arg(cluster.nodes[0].socket())
        .output()
        .expect("status --history");
    assert!(out.status.success(), "{out:?}");
    let history: NodeHistory = serde_json::from_slice(&out.stdout).expect("history JSON");
    let icmp = &history.paths[0];
    assert_eq!(icmp.path, "host-icmp");
    assert!(
        icmp.entries.windows(2).all(|w| w[0].at_ms < w[1].at_ms),
        "oldest first: {icmp:#?}"
    );
    let story: String = icmp
        .entries
        .iter()
        .map(|e| match e.outcome {
            EntryOutcome::Success => 'S',
            EntryOutcome::Failure => 'F',
        })
        .collect();
    let (before, after) = story.split_at(story.find("SFF").expect("down after up") + 1);
    assert!(before.ends_with('S') && after.contains("FS"), "{story}");
    let failed_at = n3.host.icmp.last_probe_ms.expect("probed");
    assert!(
        icmp.entries.iter().any(|e| e.at_ms == failed_at
            && e.outcome == EntryOutcome::Failure
            && e.error.is_some()),
        "the failure of {failed_at} in {icmp:#?}"
    );
    assert!(
        icmp.loss_ratio.is_some_and(|r| r > 0.0 && r < 1.0),
        "{icmp:#?}"
    );
}

#[test]
fn the_agents_routes_come_back_after_a_sync_that_could_not_make_them_and_after_flaps() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
    let node = &cluster.nodes[2];
    assert_eq!(node.agent_routes(), 2, "a route to each peer's endpoint");

    // A sync that finds every gateway unreachable (as one woken by a link
    // coming up can: the kernel announces the link before it puts back its
    // connected route) runs again by itself, for nothing else announces
    // the connected route's return.
    let not_made = || {
        node.log()
            .matches("routes to peer endpoints not made")
            .count()
    };
    let spare = Ipv4Addr::new(198, 18, 1, 250);
    in_netns(Some(&node.ns), |nl| async move {
        for r in nl.routes::<Ipv4Addr>().await? {
            if r.protocol == ROUTE_PROTOCOL {
                nl.delete_route_owned(r.destination, r.prefix, ROUTE_PROTOCOL)
                    .await?;
            }
        }
        nl.delete_route(Ipv4Addr::new(198, 18, 0, 0), 24, "uplink")
            .await?;
        // An address event: it wakes the sync, which fails.
        nl.add_address("uplink", spare, 32).await
    })
    .expect("routes and an address changed");
    let deadline = std::time::Instant::now() + health_tests::patience(Duration::from_secs(10));
    while not_made() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no sync failed:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past the syncs the address event may have queued (200 ms apart):
    // from here on only the failure itself wakes the next.
    std::thread::sleep(Duration::from_millis(1500));
    in_netns(Some(&node.ns), |nl| async move {
        nl.replace_route(Ipv4Addr::new(198, 18, 0, 0), 24, "uplink", None)
            .await
    })
    .expect("the connected route put back");
    let back = routes_back(node, "after a failed sync, with no news since");
    println!("after a sync that could not make them: the routes back within {back:?}");
    in_netns(Some(&node.ns), |nl| async move {
        nl.delete_address("uplink", spare.into()).await
    })
    .expect("the spare address removed");

    let mut slowest = Duration::ZERO;
    for flap in 0..6 {
        node.set_uplink(false);
        std::thread::sleep(Duration::from_millis(200 + 100 * flap));
        assert_eq!(node.agent_routes(), 0, "a link going down takes its routes");
        node.set_uplink(true);
        slowest = slowest.max(routes_back(node, "after the link came up"));
    }
    println!("6 flaps: the routes back within {slowest:?} each time");
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
}

/// Waits (4 s at most) until `node` holds its 2 routes again; how long.
fn routes_back(node: &ClusterNode, what: &str) -> Duration {
    let t0 = std::time::Instant::now();
    let deadline = health_tests::patience(Duration::from_secs(4));
    while node.agent_routes() < 2 {
        assert!(
            t0.elapsed() < deadline,
            "{what}: routes back {} of 2 after {:?}\n{}",
            node.agent_routes(),
            t0.elapsed(),
            node.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

#[test]
fn icmp_dropped_toward_a_node_shows_icmp_failing_and_http_ok() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        failure_threshold: 2,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
    // Drop ICMP entering node-3 (for its node IP and its endpoint alike).
    let _filter = DropIcmp::attach(&cluster.nodes[2].ns, "uplink").expect("tc filter on node-3");
    let s = cluster.wait_status(0, Duration::from_secs(10), |s| {
        let n = node(s, "node-3");
        n.host.icmp.result == ProbeResult::Failure && n.endpoint.icmp.result == ProbeResult::Failure
    });
    let n3 = node(&s, "node-3");
    assert_eq!(n3.host.http.result, ProbeResult::Success, "{n3:#?}");
    assert_eq!(n3.endpoint.http.result, ProbeResult::Success, "{n3:#?}");
    assert!(!n3.reachable());
    assert!(node(&s, "node-2").reachable());
    // The verbose table says the same in words.
    let out = std::process::Command::new(health_tests::agent::agent_binary())
        .args(["status", "--verbose", "--socket"])
        .arg(cluster.nodes[0].socket())
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Cluster health: 2/3 reachable"), "{text}");
    assert!(
        text.contains("ICMP to stack:   Failure: no echo reply"),
        "{text}"
    );
    assert!(text.contains("HTTP to agent:   OK, RTT="), "{text}");
}

#[test]
fn nodes_file_edits_add_and_remove_peers_and_bad_edits_keep_the_last_good_set() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        ..Settings::default()
    });
    let s = cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
    let leaving: Vec<IpAddr> = node(&s, "node-3").connectivities().map(|c| c.ip).collect();
    let timed = |c: &Cluster| -> Vec<IpAddr> {
        rtt::list(&c.nodes[0].pins)
            .expect("rtt list")
            .into_iter()
            .map(|r| r.peer)
            .collect()
    };
    let peers = timed(&cluster);
    assert!(
        leaving.iter().all(|ip| peers.contains(ip)),
        "node-3 timed by the kernel: {peers:?}"
    );
    // node-3 leaves the file: gone from the status within a sync.
    cluster.write_nodes_file(2);
    let left = cluster.wait_status(0, Duration::from_secs(5), |s| s.nodes.len() == 2);
    // Its kernel RTT entries go before the next round, and no late reply
    // brings them back: none over the next rounds.
    let round = |s: &ClusterStatus| s.round.as_ref().map_or(0, |r| r.seq);
    let after = round(&left);
    for later in [2, 4] {
        cluster.wait_status(0, Duration::from_secs(10), |s| round(s) >= after + later);
        let peers = timed(&cluster);
        assert!(
            leaving.iter().all(|ip| !peers.contains(ip)) && !peers.is_empty(),
            "node-3's entries left {later} rounds on: {peers:?}"
        );
    }
    // ...and joins again.
    cluster.write_nodes_file(3);
    cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });

    let good = std::fs::read_to_string(&cluster.nodes_file).expect("read");
    let nodes_json = |c: &Cluster| -> serde_json::Value {
        let out = std::process::Command::new(health_tests::agent::agent_binary())
            .args(["status", "-o", "json", "--socket"])
            .arg(c.nodes[0].socket())
            .output()
            .expect("status");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    // A file that does not parse as a whole (bad records alone are
    // rejected one by one: see the next test).
    for (bad, needle) in [
        (
            good.replace("node-ip: 198.18.0.12", "node-ip: [198.18"),
            "nodes.yaml:",
        ),
        (good.replace("nodes:", "nodez:"), "unknown field `nodez`"),
    ] {
        std::fs::write(&cluster.nodes_file, &bad).expect("write");
        let view = wait_nodes_error(&cluster, needle);
        assert_eq!(view.nodes.len(), 3, "last good set kept: {view:?}");
        assert_eq!(
            nodes_json(&cluster)["nodes"].as_array().map(Vec::len),
            Some(3)
        );
    }
    std::fs::write(&cluster.nodes_file, &good).expect("restore");
}

#[test]
fn bad_records_in_the_nodes_file_are_rejected_alone_and_named_on_the_api() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
    // Three good records (lines 2-10), then three bad ones.
    let mut yaml = nodes_yaml(3);
    yaml.push_str("  - name: bad-loopback\n    node-ip: 127.0.0.1\n    health-ip: 198.18.90.2\n");
    yaml.push_str("  - name: node-2\n    node-ip: 198.18.0.99\n    health-ip: 198.18.91.2\n");
    // Inside node-1's own health CIDR (198.18.64.0/24).
    yaml.push_str("  - name: inside\n    node-ip: 198.18.0.98\n    health-ip: 198.18.64.77\n");
    let edited = now_ms();
    cluster.write_nodes_text(&yaml);

    let view = wait_nodes(&cluster, |v| v.rejected_total == 3);
    assert!(view.error.is_none(), "the file was taken: {view:?}");
    assert_eq!(
        view.nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>(),
        ["node-1", "node-2", "node-3"],
        "the good records are kept, the first node-2 among them"
    );
    assert_eq!(
        view.nodes
            .get("node-2")
            .and_then(|n| n.node_ip)
            .map(|ip| ip.to_string()),
        Some("198.18.0.12".into())
    );
    let file = cluster.nodes_file.display().to_string();
    let got: Vec<(String, Option<&str>, &str)> = view
        .rejected
        .iter()
        .map(|r| (r.record.clone(), r.name.as_deref(), r.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (
                format!("{file}:11"),
                Some("bad-loopback"),
                "node-ip 127.0.0.1 is loopback (127.0.0.0/8), not a node address",
            ),
            (
                format!("{file}:14"),
                Some("node-2"),
                &*format!(
                    "duplicate name \"node-2\": node \"node-2\" at {file}:5 came before it (a name's later records are refused)"
                ),
            ),
            (
                format!("{file}:17"),
                Some("inside"),
                "health-ip 198.18.64.77 is inside this node's health CIDR 198.18.64.0/24",
            ),
        ]
    );

    // Probing goes on over the good ones: a round started after the edit.
    let s = cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.round.as_ref().is_some_and(|r| r.started_ms > edited)
    });
    assert_eq!(
        s.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["node-1", "node-2", "node-3"]
    );
    assert_eq!(s.reachable(), 3, "{s:#?}");

    // One warning for the update, naming the count and the first records.
    let log = cluster.nodes[0].log();
    assert_eq!(
        log.matches("node records rejected").count(),
        1,
        "one summarised warning:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "3 node records rejected, 3 in use: {file}:11: node \"bad-loopback\": node-ip 127.0.0.1 is loopback"
        )),
        "{log}"
    );

    // The bad records removed: nothing is rejected any more.
    cluster.write_nodes_file(3);
    let view = wait_nodes(&cluster, |v| v.rejected_total == 0);
    assert!(view.rejected.is_empty(), "{view:?}");
}

/// Polls `GET /v1/nodes` of node-1 until `accept` holds.
fn wait_nodes(cluster: &Cluster, accept: impl Fn(&NodesView) -> bool) -> NodesView {
    let socket = cluster.nodes[0].socket();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut last = None;
    loop {
        let view = health_tests::api::call(&socket, |c| async move { c.nodes().await }).ok();
        if let Some(v) = view {
            if accept(&v) {
                return v;
            }
            last = Some(v);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "condition not met; last view: {last:#?}\nlog:\n{}",
            cluster.nodes[0].log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `GET /v1/nodes` of node-1 until its error mentions `needle`.
fn wait_nodes_error(cluster: &Cluster, needle: &str) -> NodesView {
    let socket = cluster.nodes[0].socket();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let view = health_tests::api::call(&socket, |c| async move { c.nodes().await }).ok();
        if let Some(v) = view
            && v.error.as_deref().is_some_and(|e| e.contains(needle))
        {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no nodes error mentioning {needle:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_bad_nodes_file_at_start_is_refused_naming_the_line() {
    let node = health_tests::agent::AgentNode::new();
    let file = node.dir.join("nodes.yaml");
    std::fs::write(
        &file,
        "nodes:\n  - name: a\n    node-ip: 198.18.0.1\n    health-ip: 198.18.64.2\n  - name: b\n    node-ip: [198.18.0.2\n",
    )
    .expect("write");
    let file = file.to_str().expect("utf-8");
    let out = node.run_to_exit(
        health_tests::agent::HEALTH_CIDR,
        &["--health-range", "198.18.64.0/18", "--nodes-file", file],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("nodes.yaml:7: "), "{err}");
    assert!(
        !node.socket().exists() && !health_tests::agent::pidfile_in(&node.dir).exists(),
        "nothing left behind"
    );
}

/// A round asked for through the API (`status --probe`) runs to its end
/// and is published even when the request's deadline passes first: a
/// round cut short would be recorded and never published.
#[test]
fn a_round_asked_for_runs_to_its_end_past_the_requests_deadline() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        // No scheduled round or liveness echo during the test: the only
        // round after the first is the one asked for.
        probe_interval: "1h",
        // Rounds of 2 s with a node down: time for twenty requests to
        // come while one waits.
        probe_timeout: "2s",
        failure_threshold: 1,
        extra_args: vec!["--liveness-interval".into(), "0s".into()],
        ..Settings::default()
    });
    // node-1's one scheduled round may run before the others' endpoints
    // are up: rounds are asked for until one finds all three.
    cluster.wait_endpoints_ready(Duration::from_secs(30));
    let ask = |deadline: &str| {
        std::process::Command::new(health_tests::agent::agent_binary())
            .args([
                "status",
                "--probe",
                "--probe-timeout",
                deadline,
                "-o",
                "json",
                "--socket",
            ])
            .arg(cluster.nodes[0].socket())
            .output()
            .expect("status --probe")
    };
    let mut all_up = None;
    for _ in 0..10 {
        let out = ask("30s");
        assert!(out.status.success(), "{out:?}");
        let s: ClusterStatus = serde_json::from_slice(&out.stdout).expect("status JSON");
        if s.reachable() == 3 {
            all_up = Some(s);
            break;
        }
    }
    let all_up = all_up.expect("a round finding all three nodes");
    let seq = all_up.round.as_ref().expect("a round").seq;
    // node-3's probes now wait for their whole timeout: the round takes 2 s.
    cluster.nodes[2].set_uplink(false);
    let out = ask("100ms");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("504") && stderr.contains("did not finish within 100ms"),
        "{stderr}"
    );
    let asked = cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.round.as_ref().is_some_and(|r| r.seq > seq)
    });
    assert_eq!(
        asked.round.as_ref().map(|r| r.seq),
        Some(seq + 1),
        "the round asked for, and no other"
    );
    assert!(
        !node(&asked, "node-3").reachable(),
        "its probes to node-3 ran to their timeout: {asked:#?}"
    );
    assert!(node(&asked, "node-2").reachable());

    // Twenty requests at once, each gone after 100 ms, while a round of
    // theirs runs for 2 s: they share one waiting round, and no round is
    // queued per request.
    let seq = seq + 1;
    let first = ask("100ms");
    assert!(!first.status.success());
    let many: Vec<_> = (0..20)
        .map(|_| {
            std::process::Command::new(health_tests::agent::agent_binary())
                .args(["status", "--probe", "--probe-timeout", "100ms", "--socket"])
                .arg(cluster.nodes[0].socket())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("status --probe")
        })
        .collect();
    for mut child in many {
        child.wait().expect("status --probe");
    }
    let shared = cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.round.as_ref().is_some_and(|r| r.seq >= seq + 2)
    });
    assert!(shared.round.is_some());
    // Two rounds' time and more, twice, with nothing more asked: no round
    // comes. (A request slow to start, landing after the shared round
    // began, asks for one more: at most one.)
    let last = || {
        std::thread::sleep(Duration::from_secs(5));
        let after = cluster.nodes[0].status().expect("status");
        after.round.as_ref().map_or(0, |r| r.seq)
    };
    let (settled, later) = (last(), last());
    assert!(
        settled <= seq + 3 && later == settled,
        "rounds up to {settled}, then {later}, from {seq} for 21 requests: one for the first, one shared by the twenty"
    );
}
