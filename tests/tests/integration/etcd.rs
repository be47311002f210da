//! Node discovery through a real etcd (Debian's etcd-server) running in the
//! fabric namespace: registration with a lease, join and leave, and an etcd
//! outage during which probing goes on with the last known set; etcd over
//! TLS with client certificates, and with users and passwords; and the
//! agent's generic etcd API (`membership::kvstore`) against an etcd on
//! loopback.

use std::time::Duration;

use health_agent::{
    api::types::NodesView,
    membership::kvstore::{Entry, EtcdConfig, KvStore, LeaseFile, Link, Put, WatchEvent},
};
use health_tests::{
    cluster::{Cluster, ETCD_ENDPOINT, ETCD_PREFIX, Settings},
    etcd::{LocalEtcd, Security, enable_auth, keys_as, put_as},
    watch::Watching,
};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

fn nodes_view(cluster: &Cluster, i: usize) -> Option<NodesView> {
    cluster.nodes[i].nodes_view()
}

#[test]
fn nodes_join_and_leave_through_etcd_and_survive_an_etcd_restart() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        ..Settings::default()
    });
    let all = cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    assert_eq!(
        all.nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>(),
        ["node-1", "node-2", "node-3"]
    );
    let view = nodes_view(&cluster, 0).expect("nodes view");
    assert!(view.source.starts_with("etcd:198.18.0.1:2379"), "{view:?}");
    assert!(view.error.is_none(), "{view:?}");

    // Leave: a stopped agent revokes its lease; the others see it go.
    // An operator follows node-3's rounds through its restart.
    let mut watching = Watching::start(&cluster.nodes[2].socket());
    cluster.stop_agent(2, Signal::SIGTERM);
    cluster.wait_status(0, Duration::from_secs(5), |s| s.nodes.len() == 2);
    // Join: it registers again.
    let restarted = health_agent::util::timefmt::rfc3339(health_agent::util::timefmt::now_ms());
    cluster.start_agent(2);
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    // The watch waited for the agent and went on with its new run's
    // rounds, numbered from 1 again, saying so on stderr.
    let rows = watching.rows_until(|rows| rows.iter().any(|r| r.ended > restarted));
    let new_run = rows
        .iter()
        .position(|r| r.ended > restarted)
        .expect("a row of the new run");
    assert!(new_run > 0 && rows[new_run].seq <= 3, "{rows:#?}");
    let said = watching.stop();
    assert!(
        said.contains("cannot reach the health agent") && said.contains("answers again"),
        "{said}"
    );

    // etcd down: probing continues over the last known set.
    cluster.stop_etcd();
    let before = cluster.nodes[0]
        .status()
        .and_then(|s| s.round)
        .expect("a round")
        .started_ms;
    let during = cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.round.as_ref().is_some_and(|r| r.started_ms > before) && s.nodes.len() == 3
    });
    assert_eq!(
        during.reachable(),
        3,
        "the last known set is still probed: {during:#?}"
    );
    // Said once the watch's retries have failed for a few seconds (a
    // broken watch is retried quietly first: etcd may have only lost a
    // member).
    let view = cluster.nodes[0].wait_nodes_view(Duration::from_secs(15), |v| v.error.is_some());
    assert!(
        view.error.as_deref().is_some_and(|e| e.contains("etcd")),
        "{view:?}"
    );
    assert_eq!(view.nodes.len(), 3);
    // A node is killed while etcd is away: it cannot deregister.
    cluster.stop_agent(1, Signal::SIGKILL);

    // etcd back: the agents re-register and re-sync; node-2's lease
    // (3 s TTL) expires and it drops out of everyone's set.
    cluster.start_etcd();
    let after = cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>() == ["node-1", "node-3"]
    });
    assert_eq!(after.reachable(), 2);
    cluster.wait_status(2, Duration::from_secs(10), |s| s.nodes.len() == 2);
    let view = nodes_view(&cluster, 0).expect("nodes view");
    assert!(view.error.is_none(), "re-synced: {view:?}");
}

/// Node 1's routes of the agent's, to its peers' health addresses.
fn agent_routes(cluster: &Cluster) -> Vec<std::net::Ipv4Addr> {
    health_agent::sys::netlink::in_netns(Some(&cluster.nodes[0].ns), |nl| async move {
        nl.routes::<std::net::Ipv4Addr>().await
    })
    .expect("routes")
    .into_iter()
    .filter(|r| r.protocol == health_agent::membership::routes::ROUTE_PROTOCOL)
    .map(|r| r.destination)
    .collect()
}

/// With `--keep-endpoint` the routes to peers survive the agent's stop,
/// and the next agent leaves them until etcd has given it a node set: an
/// agent restarted while etcd is down keeps routing its peers' answers.
#[test]
fn kept_routes_stay_until_etcd_gives_the_restarted_agent_its_nodes() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        extra_args: vec!["--keep-endpoint".into()],
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    let routes = agent_routes(&cluster);
    assert_eq!(routes.len(), 2, "{routes:?}");
    cluster.stop_agent(0, Signal::SIGTERM);
    assert_eq!(agent_routes(&cluster), routes, "kept with the endpoint");
    cluster.stop_etcd();
    cluster.start_agent(0);
    cluster.wait_status(0, Duration::from_secs(20), |_| true);
    // Well past a sync of the empty set it starts with.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(agent_routes(&cluster), routes, "{}", cluster.nodes[0].log());
    cluster.start_etcd();
    cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    assert_eq!(agent_routes(&cluster), routes);
}

/// A round a minute, as by default, and no liveness echoes (as in a full
/// mesh too large for them): the peers an agent finds in etcd after its
/// first round, and a node that joins later, are probed in a round of
/// their own within a second, not at the next round a minute later; a
/// node that round finds not answering yet is probed again a second
/// apart while its paths have no verdict (ten failures turn one here, so
/// that the agent started after its record has ten seconds to answer).
#[test]
fn nodes_found_in_etcd_are_probed_before_the_next_round_is_due() {
    use health_agent::probe::status::{ClusterStatus, NodeStatus};
    let soon = Duration::from_secs(15);
    let started = std::time::Instant::now();
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        probe_interval: "60s",
        probe_timeout: "1s",
        failure_threshold: 10,
        extra_args: ["--liveness-interval", "0s"].map(String::from).to_vec(),
        ..Settings::default()
    });
    let probed_since = |n: &NodeStatus, ms: u64| {
        n.connectivities().all(|c| {
            [&c.icmp, &c.http]
                .iter()
                .all(|p| p.last_probe_ms.is_some_and(|t| t >= ms))
        })
    };
    let all = |s: &ClusterStatus| s.nodes.len() == 3 && s.nodes.iter().all(|n| probed_since(n, 0));
    for i in 0..3 {
        cluster.wait_status(i, Duration::from_secs(30), all);
    }
    assert!(
        started.elapsed() < soon,
        "every peer probed {:?} after the start",
        started.elapsed()
    );
    // node-3 leaves (SIGTERM: its lease goes). Its record comes back
    // before its agent answers: the round of the nodes that joined finds
    // it not answering (Unknown, below the threshold).
    let first = cluster.wait_status(0, Duration::from_secs(1), all);
    let node3 = first.node("node-3").expect("node-3").clone();
    cluster.stop_agent(2, Signal::SIGTERM);
    let left = cluster.wait_status(0, Duration::from_secs(10), |s| s.nodes.len() == 2);
    let back_ms = health_agent::util::timefmt::now_ms();
    etcd_put(
        &cluster,
        "/health/nodes/node-3",
        &format!(
            r#"{{"name": "node-3", "node_ip": "{}", "health_ip": "{}"}}"#,
            node3.host.ip, node3.endpoint.ip
        ),
    );
    let silent = cluster.wait_status(0, Duration::from_secs(10), |s| {
        s.node("node-3").is_some_and(|n| probed_since(n, back_ms))
    });
    assert!(
        !silent.node("node-3").is_some_and(NodeStatus::reachable),
        "{silent:#?}"
    );
    // Its agent starts: more rounds of the kind follow while some path
    // has no verdict, and it is reachable on every path within seconds,
    // not at the next round a minute away.
    let back = std::time::Instant::now();
    cluster.start_agent(2);
    let seen = cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.node("node-3").is_some_and(NodeStatus::reachable)
    });
    assert!(
        back.elapsed() < soon,
        "node-3 reachable {:?} after its agent started: {seen:#?}",
        back.elapsed()
    );
    // In a round of its own, which leaves the last round published as it
    // was: no rounds' cadence, number or history taken by it.
    assert_eq!(seen.round, left.round, "{seen:#?}");
}

/// Puts `key` = `value` from the fabric (plain etcd).
fn etcd_put(cluster: &Cluster, key: &str, value: &str) {
    health_tests::etcd::put(
        Some(&cluster.fabric),
        ETCD_ENDPOINT,
        (None, false),
        (key, value),
    );
}

#[test]
fn bad_records_in_etcd_are_rejected_by_key_and_the_others_kept() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    // Anyone with etcd access can write these.
    etcd_put(
        &cluster,
        "/health/nodes/evil",
        r#"{"name": "evil", "node_ip": "127.0.0.1", "health_ip": "198.18.90.2"}"#,
    );
    etcd_put(
        &cluster,
        "/health/nodes/zz",
        r#"{"name": "node-2", "node_ip": "198.18.0.99", "health_ip": "198.18.91.2"}"#,
    );
    etcd_put(
        &cluster,
        "/health/nodes/thief",
        r#"{"name": "thief", "node_ip": "198.18.0.98", "health_ip": "198.18.0.13"}"#,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let view = loop {
        let view = nodes_view(&cluster, 0);
        if let Some(v) = view.as_ref()
            && v.rejected_total == 3
        {
            break view.expect("a view");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{view:#?}\n{}",
            cluster.nodes[0].log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(view.error.is_none(), "{view:?}");
    assert_eq!(
        view.nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>(),
        ["node-1", "node-2", "node-3"]
    );
    let got: Vec<(&str, &str)> = view
        .rejected
        .iter()
        .map(|r| (r.record.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (
                "/health/nodes/evil",
                "node-ip 127.0.0.1 is loopback (127.0.0.0/8), not a node address"
            ),
            (
                "/health/nodes/thief",
                "health-ip 198.18.0.13 is outside the cluster's health range 198.18.64.0/18 (--health-range)"
            ),
            (
                "/health/nodes/zz",
                "a node record counts only at exactly <prefix><name>: \"node-2\" belongs at \"/health/nodes/node-2\""
            ),
        ]
    );
    // The good ones are still probed.
    let s = cluster.wait_status(0, Duration::from_secs(10), |s| s.reachable() == 3);
    assert_eq!(s.nodes.len(), 3);
}

/// Polls node `i`'s nodes view until `accept` holds.
fn wait_view(
    cluster: &Cluster,
    i: usize,
    timeout: Duration,
    accept: impl Fn(&NodesView) -> bool,
) -> NodesView {
    cluster.nodes[i].wait_nodes_view(timeout, accept)
}

#[test]
fn nodes_discover_each_other_over_tls_and_a_wrong_ca_is_named() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        etcd_security: Security {
            tls: true,
            ..Security::default()
        },
        ..Settings::default()
    });
    let all = cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    assert_eq!(all.nodes.len(), 3);
    let view = nodes_view(&cluster, 0).expect("nodes view");
    assert_eq!(view.source, "etcd:198.18.0.1:2379/health/nodes/");
    assert!(view.error.is_none(), "{view:?}");

    // node-3 trusts another CA: etcd's certificate is refused, and said so.
    cluster.stop_agent(2, Signal::SIGTERM);
    cluster.wait_status(0, Duration::from_secs(5), |s| s.nodes.len() == 2);
    let pki = cluster.etcd_pki().expect("pki");
    std::fs::copy(
        pki.path("other-ca.pem"),
        cluster.nodes[2].dir.join("etcd-ca.pem"),
    )
    .expect("wrong CA");
    cluster.start_agent(2);
    let view = wait_view(&cluster, 2, Duration::from_secs(20), |v| v.error.is_some());
    let error = view.error.expect("an error");
    assert!(
        error.starts_with("etcd at 198.18.0.1:2379: ") && error.contains("UnknownIssuer"),
        "{error}"
    );
    assert!(
        cluster.nodes[2].log().contains("UnknownIssuer"),
        "{}",
        cluster.nodes[2].log()
    );
    // And the others never see it.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        nodes_view(&cluster, 0).expect("view").nodes.len(),
        2,
        "node-3 did not register"
    );
}

/// With a user and a role per node (what `cargo xtask run --kvstore etcd`
/// and docs/etcd.md set up), a node's user writes its own record and its
/// own summary, reads everyone's, and is refused any other key in etcd's
/// words: another node's record, a record of that name under another key,
/// a longer name, another node's summary.
#[test]
fn a_node_user_writes_only_its_own_keys() {
    let etcd = LocalEtcd::start();
    let names = ["node-1", "node-2"].map(String::from);
    enable_auth(None, &etcd.endpoint, None, ETCD_PREFIX, &names);
    let put = |user: &str, key: &str| put_as(None, &etcd.endpoint, None, user, (key, "{}"));
    assert_eq!(put("node-1", "/health/nodes/node-1"), Ok(()));
    assert_eq!(put("node-1", "/health/summaries/node-1"), Ok(()));
    assert_eq!(put("node-2", "/health/nodes/node-2"), Ok(()));
    for key in [
        "/health/nodes/node-2",
        "/health/nodes/0/node-2",
        "/health/nodes/0/node-1",
        "/health/nodes/node-10",
        "/health/nodes/node-1/x",
        "/health/summaries/node-2",
        "/health/view",
        "/health/allocations/node-1",
    ] {
        let e = put("node-1", key).expect_err(key);
        assert!(e.contains("permission denied"), "{key}: {e}");
    }
    let keys = |user: &str, prefix: &str| keys_as(None, &etcd.endpoint, None, user, prefix);
    assert_eq!(
        keys("node-2", "/health/nodes/"),
        Ok(vec![
            "/health/nodes/node-1".to_owned(),
            "/health/nodes/node-2".to_owned()
        ])
    );
    assert_eq!(
        keys("node-2", "/health/summaries/"),
        Ok(vec!["/health/summaries/node-1".to_owned()])
    );
    health_tests::etcd::put(
        None,
        &etcd.endpoint,
        (None, true),
        (
            "/health/allocations/node-2",
            r#"{"health_cidr":"198.18.65.0/24"}"#,
        ),
    );
    assert_eq!(
        keys("node-1", "/health/allocations/"),
        Ok(vec!["/health/allocations/node-2".to_owned()]),
        "the allocations root wrote are read, and written by no node"
    );
    let e = keys("node-1", "/health/").expect_err("outside the prefixes");
    assert!(e.contains("permission denied"), "{e}");
}

/// The agents of a cluster whose etcd runs TLS and authentication, each
/// logged in as its node's user, their health addresses checked against
/// the allocations root wrote: they register, see each other and publish
/// their summaries; one of them is refused another's key there too; the
/// one elected publishes the cluster view, which every agent reads. One
/// killed and started again takes its lease over: its user may read what
/// the lease holds, which etcd asks of it.
#[test]
fn agents_with_a_user_each_register_and_see_each_other_over_tls() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        // Outlives a restart with room to spare.
        lease_ttl: "30s",
        // As `cargo xtask run --kvstore etcd`: each node's user reads the
        // allocations root wrote.
        etcd_security: Security {
            tls: true,
            auth: true,
            allocations: true,
        },
        ..Settings::default()
    });
    for i in 0..3 {
        cluster.wait_status(i, Duration::from_secs(20), |s| {
            s.nodes.len() == 3 && s.reachable() == 3
        });
        let view = nodes_view(&cluster, i).expect("nodes view");
        assert!(view.error.is_none(), "{view:?}");
    }
    let pki = cluster.etcd_pki();
    let fabric = Some(&cluster.fabric);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let summaries = keys_as(
            fabric,
            ETCD_ENDPOINT,
            pki.as_ref(),
            "node-1",
            "/health/summaries/",
        )
        .expect("read the summaries");
        if summaries.len() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "every agent writes its summary: {summaries:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for key in ["/health/nodes/node-2", "/health/nodes/0/node-2"] {
        let e = put_as(
            fabric,
            ETCD_ENDPOINT,
            pki.as_ref(),
            "node-1",
            (key, r#"{"name":"node-2"}"#),
        )
        .expect_err(key);
        assert!(e.contains("permission denied"), "{key}: {e}");
    }
    // With a role each, the agents elect one to assemble the cluster view,
    // which publishes it at its own key; every agent reads it.
    for node in &cluster.nodes {
        let deadline = std::time::Instant::now() + health_tests::patience(Duration::from_secs(20));
        loop {
            let reply =
                health_tests::api::call(&node.socket(), |c| async move { c.cluster().await });
            if reply
                .as_ref()
                .is_ok_and(|r| r.assembly.as_ref().is_some_and(|a| !a.stale) && r.view.reports == 3)
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: no published view: {reply:?}\n{}",
                node.name,
                node.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    let lease_file = cluster.nodes[2].dir.join("state/etcd-lease");
    let kept = || std::fs::read_to_string(&lease_file).expect("node-3's lease file");
    let before = kept();
    cluster.stop_agent(2, Signal::SIGKILL);
    cluster.start_agent(2);
    cluster.wait_status(2, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });
    let log = cluster.nodes[2].log();
    assert!(
        log.contains("the last run's lease taken over"),
        "node-3 took its lease over: {log}"
    );
    assert_eq!(kept(), before, "no new lease written over it");
}

#[test]
fn etcd_users_log_in_with_a_password_file_and_a_wrong_password_is_named() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 2,
        etcd: true,
        etcd_security: Security {
            auth: true,
            ..Security::default()
        },
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 2 && s.reachable() == 2
    });
    cluster.wait_status(1, Duration::from_secs(10), |s| s.nodes.len() == 2);
    assert!(nodes_view(&cluster, 1).expect("view").error.is_none());

    cluster.stop_agent(1, Signal::SIGTERM);
    cluster.wait_status(0, Duration::from_secs(5), |s| s.nodes.len() == 1);
    std::fs::write(cluster.nodes[1].dir.join("etcd-password"), "not-it\n").expect("password");
    cluster.start_agent(1);
    let view = wait_view(&cluster, 1, Duration::from_secs(20), |v| v.error.is_some());
    let error = view.error.expect("an error");
    assert!(
        error.contains("authenticating to etcd as user \"node-2\"")
            && error.contains("authentication failed, invalid user ID or password"),
        "{error}"
    );
    assert!(
        !cluster.nodes[1].log().contains("not-it"),
        "the password is never logged"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(nodes_view(&cluster, 0).expect("view").nodes.len(), 1);
}

/// The next event within 10 s.
async fn next(events: &mut mpsc::Receiver<WatchEvent>) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("an event within 10 s")
        .expect("the watch goes on")
}

async fn wait_up(store: &KvStore) -> i64 {
    let mut link = store.link();
    let up = link.wait_for(|l| matches!(l, Link::Up { .. }));
    match tokio::time::timeout(Duration::from_secs(10), up)
        .await
        .expect("up within 10 s")
        .as_deref()
    {
        Ok(Link::Up { lease }) => *lease,
        other => panic!("{other:?}"),
    }
}

fn kv(e: &Entry) -> (String, String) {
    (
        e.key_str().into_owned(),
        String::from_utf8_lossy(&e.value).into_owned(),
    )
}

fn local_config(etcd: &LocalEtcd) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![etcd.endpoint.clone()],
        prefix: "/t/nodes/".into(),
        lease_ttl: Duration::from_secs(2),
        tls: None,
        credentials: None,
        lease_file: None,
        allocations: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `store` with its lease session running.
fn running(store: &KvStore) -> tokio::task::JoinHandle<()> {
    let s = store.clone();
    tokio::spawn(async move { s.run().await })
}

/// The listing a new watch starts with, its pages put together.
async fn snapshot(events: &mut mpsc::Receiver<WatchEvent>) -> Vec<(String, String)> {
    snapshot_pages(events).await.concat()
}

/// The pages of the listing a new watch starts with: one revision, the
/// first page first, at most 500 keys each.
async fn snapshot_pages(events: &mut mpsc::Receiver<WatchEvent>) -> Vec<Vec<(String, String)>> {
    let mut pages = Vec::new();
    let mut at = None;
    loop {
        match next(events).await {
            WatchEvent::Snapshot {
                entries,
                revision,
                first,
                last,
            } => {
                assert!(revision > 0);
                assert_eq!(*at.get_or_insert(revision), revision, "one revision");
                assert_eq!(first, pages.is_empty(), "the first page first");
                assert!(entries.len() <= 500);
                pages.push(entries.iter().map(kv).collect());
                if last {
                    return pages;
                }
            }
            other => panic!("{other:?} within the listing"),
        }
    }
}

#[test]
fn the_kvstore_api_puts_with_the_lease_and_follows_a_prefix() {
    let etcd = LocalEtcd::start();
    let cfg = local_config(&etcd);
    runtime().block_on(async {
        let (a, b) = (KvStore::new(&cfg), KvStore::new(&cfg));
        let a_run = running(&a);
        a.put_leased("/t/sum/a", "one").await.expect("kept");
        let lease = wait_up(&a).await;

        // The snapshot, then one event per change.
        let mut events = b.watch_prefix("/t/sum/");
        assert_eq!(
            snapshot(&mut events).await,
            [("/t/sum/a".into(), "one".into())]
        );
        let (_, listed) = b.list("/t/sum/").await.expect("list");
        assert_eq!(listed[0].lease, lease, "put with a's lease");
        assert_eq!(
            a.put_leased("/t/sum/a", "two").await.expect("put"),
            Put::Written
        );
        let WatchEvent::Put(e) = next(&mut events).await else {
            panic!("a put")
        };
        assert_eq!(kv(&e), ("/t/sum/a".into(), "two".into()));
        a.put_leased("/t/sum/c", vec![0xff, 0]).await.expect("put");
        let WatchEvent::Put(e) = next(&mut events).await else {
            panic!("a put")
        };
        assert_eq!(
            (e.key.as_slice(), e.value.as_slice()),
            (&b"/t/sum/c"[..], &[0xff, 0][..])
        );
        a.delete_leased("/t/sum/c").await.expect("delete");
        let WatchEvent::Delete { key, .. } = next(&mut events).await else {
            panic!("a delete")
        };
        assert_eq!(key, b"/t/sum/c");

        // A graceful leave: the lease is revoked, its keys go.
        a_run.abort();
        assert_eq!(a.revoke().await.expect("revoke"), Some(lease));
        let WatchEvent::Delete { key, .. } = next(&mut events).await else {
            panic!("a's delete")
        };
        assert_eq!(key, b"/t/sum/a");

        // A crash: no revoke, the key goes with the lease's TTL (2 s).
        let d = KvStore::new(&cfg);
        let d_run = running(&d);
        d.put_leased("/t/sum/d", "d").await.expect("kept");
        wait_up(&d).await;
        let WatchEvent::Put(e) = next(&mut events).await else {
            panic!("d's put")
        };
        assert_eq!(kv(&e).0, "/t/sum/d");
        d_run.abort();
        let gone = std::time::Instant::now();
        let WatchEvent::Delete { key, .. } = next(&mut events).await else {
            panic!("d's delete")
        };
        assert_eq!(key, b"/t/sum/d");
        assert!(
            gone.elapsed() < Duration::from_secs(5),
            "{:?}",
            gone.elapsed()
        );
    });
}

#[test]
fn the_kvstore_watch_and_lease_come_through_an_etcd_restart() {
    let mut etcd = LocalEtcd::start();
    let cfg = local_config(&etcd);
    runtime().block_on(async {
        let (a, b) = (KvStore::new(&cfg), KvStore::new(&cfg));
        let _a_run = running(&a);
        a.put_leased("/t/sum/a", "one").await.expect("kept");
        a.put_leased("/t/sum/b", "b").await.expect("kept");
        let lease = wait_up(&a).await;
        let mut events = b.watch_prefix("/t/sum/");
        let before = snapshot(&mut events).await;
        assert_eq!(before.len(), 2, "{before:?}");
        let b_revision = revision_of(&b, "/t/sum/b").await;

        // The watch is lost once, then a new snapshot; a's lease survives
        // (etcd keeps leases across restarts) and so do its keys.
        tokio::task::block_in_place(|| etcd.stop());
        let WatchEvent::Lost { error } = next(&mut events).await else {
            panic!("lost")
        };
        assert_ne!(error.to_string(), "");
        let mut link = a.link();
        tokio::time::timeout(
            Duration::from_secs(10),
            link.wait_for(|l| matches!(l, Link::Down { .. })),
        )
        .await
        .expect("a's session down within 10 s")
        .expect("link");
        // A change while etcd is away is kept, and written when the
        // session is back.
        assert_eq!(
            a.put_leased("/t/sum/a", "down").await.expect("kept"),
            Put::Pending
        );
        tokio::task::block_in_place(|| etcd.resume());
        assert_eq!(wait_up(&a).await, lease, "the same lease after the restart");
        let mut seen = snapshot(&mut events).await;
        while !seen.contains(&("/t/sum/a".into(), "down".into())) {
            match next(&mut events).await {
                WatchEvent::Put(e) => seen.push(kv(&e)),
                other => panic!("{other:?}"),
            }
        }
        // The key that did not change was not written again: the lease
        // kept it.
        assert_eq!(
            revision_of(&b, "/t/sum/b").await,
            b_revision,
            "b written again: {seen:?}"
        );
        // Changes flow again.
        a.put_leased("/t/sum/a", "two").await.expect("put");
        match next(&mut events).await {
            WatchEvent::Put(e) => assert_eq!(kv(&e), ("/t/sum/a".into(), "two".into())),
            other => panic!("{other:?} before the put of two"),
        }
    });
}

/// A lease file names the lease a previous run kept: the next run takes
/// it over when etcd says it holds that node's keys alone, and its keys
/// never go. A file naming another node's lease (a state directory copied
/// from that node) is left alone: a new lease is granted, and that node's
/// key outlives this agent's leave.
#[test]
fn a_kept_lease_is_taken_over_only_when_it_holds_this_nodes_keys_alone() {
    let etcd = LocalEtcd::start();
    let dir = health_tests::scratch::ScratchDir::new("lease");
    let file = |node: &str| dir.join(format!("{node}-lease"));
    // Long enough that the first run's lease outlives the start of the
    // next (etcd counts what is left in whole seconds).
    let cfg = |node: &str| EtcdConfig {
        lease_file: Some(LeaseFile {
            path: file(node),
            own_keys: vec![format!("/t/nodes/{node}").into_bytes()],
        }),
        lease_ttl: Duration::from_secs(20),
        ..local_config(&etcd)
    };
    let kept = |node: &str| std::fs::read_to_string(file(node)).expect("lease file");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot ID");
    let boot = boot.trim();
    runtime().block_on(async {
        // a's first run is killed: its lease stays for its TTL.
        let first = KvStore::new(&cfg("a"));
        let first_run = running(&first);
        first.put_leased("/t/nodes/a", "a").await.expect("kept");
        let lease_a = wait_up(&first).await;
        assert_eq!(
            kept("a").trim(),
            format!("{lease_a:x} 20 {boot}"),
            "its ID, TTL and boot"
        );
        first_run.abort();
        let a = KvStore::new(&cfg("a"));
        let _a_run = running(&a);
        a.put_leased("/t/nodes/a", "a").await.expect("kept");
        assert_eq!(wait_up(&a).await, lease_a, "the next run takes it over");

        // A clone of a's machine, under a's name with a copy of its state
        // directory, boots with another boot ID: it neither takes a's
        // lease over nor ends it when it leaves.
        let other_boot = "4c1f2a7e-0d3b-4b8e-8a6f-2e9d5c7b1a03";
        std::fs::write(file("clone"), kept("a").replace(boot, other_boot)).expect("copy");
        let clone = KvStore::new(&EtcdConfig {
            lease_file: Some(LeaseFile {
                path: file("clone"),
                own_keys: vec![b"/t/nodes/a".to_vec()],
            }),
            ..cfg("a")
        });
        let clone_run = running(&clone);
        let lease_clone = wait_up(&clone).await;
        assert_ne!(lease_clone, lease_a, "a's lease is not its clone's");
        assert_eq!(kept("clone").trim(), format!("{lease_clone:x} 20 {boot}"));
        clone_run.abort();
        assert_eq!(clone.revoke().await.expect("revoke"), Some(lease_clone));
        let (_, listed) = a.list("/t/nodes/").await.expect("list");
        let leases: Vec<_> = listed.iter().map(|e| (kv(e).0, e.lease)).collect();
        assert_eq!(
            leases,
            [("/t/nodes/a".into(), lease_a)],
            "a's key and lease live on"
        );

        // b's state directory is a copy of a's.
        std::fs::copy(file("a"), file("b")).expect("copy");
        let b = KvStore::new(&cfg("b"));
        let b_run = running(&b);
        b.put_leased("/t/nodes/b", "b").await.expect("kept");
        let lease_b = wait_up(&b).await;
        assert_ne!(lease_b, lease_a, "a's lease is not b's");
        assert_eq!(kept("b").trim(), format!("{lease_b:x} 20 {boot}"));
        let (_, listed) = a.list("/t/nodes/").await.expect("list");
        let leases: Vec<_> = listed.iter().map(|e| (kv(e).0, e.lease)).collect();
        assert_eq!(
            leases,
            [
                ("/t/nodes/a".into(), lease_a),
                ("/t/nodes/b".into(), lease_b)
            ]
        );

        // b leaves: its lease goes, a's key stays with a's.
        b_run.abort();
        assert_eq!(b.revoke().await.expect("revoke"), Some(lease_b));
        let (_, listed) = a.list("/t/nodes/").await.expect("list");
        let leases: Vec<_> = listed.iter().map(|e| (kv(e).0, e.lease)).collect();
        assert_eq!(leases, [("/t/nodes/a".into(), lease_a)]);
        assert!(!file("b").exists(), "b's file goes with its lease");
    });
}

/// Asked to, a followed prefix is listed again in its own stream: a
/// whole snapshot of it as it is now, then its changes, nothing lost
/// between them and no break in between.
#[test]
fn a_followed_prefix_is_listed_again_in_its_stream_when_asked() {
    let etcd = LocalEtcd::start();
    let cfg = local_config(&etcd);
    // One thread: the two asks below go before the follower runs again.
    let one_thread = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    one_thread.block_on(async {
        let store = KvStore::new(&cfg);
        let _run = running(&store);
        wait_up(&store).await;
        store.put_leased("/t/again/a", "a").await.expect("put");
        let (mut events, again) = store.follow_prefix("/t/again/");
        assert_eq!(
            snapshot(&mut events).await,
            [("/t/again/a".into(), "a".into())]
        );
        store.put_leased("/t/again/b", "b").await.expect("put");
        match next(&mut events).await {
            WatchEvent::Put(e) => assert_eq!(kv(&e), ("/t/again/b".into(), "b".into())),
            other => panic!("{other:?} before b's put"),
        }
        again.now();
        let listed = snapshot(&mut events).await;
        assert_eq!(
            listed,
            [
                ("/t/again/a".into(), "a".into()),
                ("/t/again/b".into(), "b".into())
            ]
        );
        store.put_leased("/t/again/c", "c").await.expect("put");
        match next(&mut events).await {
            WatchEvent::Put(e) => assert_eq!(kv(&e), ("/t/again/c".into(), "c".into())),
            other => panic!("{other:?} before c's put"),
        }
        // Asked twice before the listing begins: listed once, and
        // nothing more until asked again.
        again.now();
        again.now();
        assert_eq!(snapshot(&mut events).await.len(), 3);
        assert!(
            tokio::time::timeout(Duration::from_secs(2), events.recv())
                .await
                .is_err(),
            "nothing more"
        );
    });
}

/// The revision of `key`'s last change, as `store` lists it.
async fn revision_of(store: &KvStore, key: &str) -> i64 {
    let (_, entries) = store.list(key).await.expect("list");
    entries
        .iter()
        .find(|e| e.key_str() == key)
        .map(|e| e.mod_revision)
        .expect("the key is there")
}

/// More than gRPC's 4 MiB receive limit under one prefix (5 MiB: 2,560
/// values of 2 KiB): the list and a watch's snapshot read it whole, in
/// pages, at one revision.
#[test]
fn a_prefix_of_5_mib_is_listed_whole() {
    const KEYS: usize = 2_560;
    let etcd = LocalEtcd::start();
    let cfg = local_config(&etcd);
    runtime().block_on(async {
        let mut client = etcd_client::Client::connect([format!("http://{}", etcd.endpoint)], None)
            .await
            .expect("connect");
        let value = "x".repeat(2048);
        for i in 0..KEYS {
            client
                .put(format!("/t/big/{i:05}"), value.as_str(), None)
                .await
                .expect("put");
        }
        // A single read of the prefix is refused by the client.
        let whole = client
            .get(
                "/t/big/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await;
        assert!(whole.is_err(), "one read of 5 MiB fits?");
        let store = KvStore::new(&cfg);
        let (revision, listed) = store.list("/t/big/").await.expect("paged list");
        assert!(revision > 0);
        assert_eq!(listed.len(), KEYS);
        assert!(
            listed.windows(2).all(|w| w[0].key < w[1].key),
            "in key order"
        );
        assert!(listed.iter().all(|e| e.value.len() == 2048));
        let mut events = store.watch_prefix("/t/big/");
        let pages = snapshot_pages(&mut events).await;
        assert_eq!(pages.len(), KEYS.div_ceil(500), "a page at a time");
        assert_eq!(pages.concat().len(), KEYS);
        // Values near etcd's 1.5 MiB request limit: a page of four is over
        // gRPC's 4 MiB, and is read again in smaller ones.
        let huge = "h".repeat(1_400_000);
        for i in 0..4 {
            client
                .put(format!("/t/huge/{i}"), huge.as_str(), None)
                .await
                .expect("put");
        }
        let (_, listed) = store.list("/t/huge/").await.expect("paged list");
        assert_eq!(listed.len(), 4);
        assert!(listed.iter().all(|e| e.value.len() == huge.len()));
    });
}
