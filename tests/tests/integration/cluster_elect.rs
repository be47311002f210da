//! The elected assembler: three agents on etcd elect one of them, which
//! alone reads the summaries and publishes the view under its own key;
//! the others show that view, naming it. Killed with SIGKILL, it loses
//! the role when its election lease ends and another agent publishes
//! within two rounds. A bad value written to the view's key by hand is
//! refused and named in the log, the last good view kept; a view an agent
//! no longer receives (its link down) is shown as stale, then current
//! again with the link back; a view that calls down a node an agent
//! reaches is reported as a contradiction.

use std::time::{Duration, Instant};

use health_agent::{
    cluster::{
        published_view::{election_name, view_prefix},
        view_cell::ClusterReply,
    },
    daemon::cluster_view::ELECTION_TTL,
};
use health_tests::{
    cluster::{Cluster, ClusterNode, ETCD_ENDPOINT, ETCD_PREFIX, Settings},
    etcd, patience,
};
use nix::sys::signal::Signal;

fn reply(node: &ClusterNode) -> Option<ClusterReply> {
    node.cluster_json()
}

/// Waits until `node`'s view satisfies `ok`; returns it.
fn wait_reply(
    node: &ClusterNode,
    timeout: Duration,
    what: &str,
    ok: impl Fn(&ClusterReply) -> bool,
) -> ClusterReply {
    node.wait_cluster_json(timeout, what, ok)
}

fn assembler(r: &ClusterReply) -> Option<&str> {
    r.assembly.as_ref().map(|a| a.assembled_by.as_str())
}

/// A current view by `by` (any agent when `None`) of `n` nodes' reports.
fn current(r: &ClusterReply, by: Option<&str>, reports: usize) -> bool {
    r.assembly
        .as_ref()
        .is_some_and(|a| !a.stale && by.is_none_or(|b| a.assembled_by == b))
        && r.view.reports == reports
}

fn leader_index(cluster: &Cluster, name: &str) -> usize {
    cluster
        .nodes
        .iter()
        .position(|n| n.name == name)
        .expect("the assembler is one of the nodes")
}

#[test]
fn one_agent_assembles_the_view_and_another_takes_over_when_it_is_killed() {
    let mut cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        lease_ttl: "5m",
        ..Settings::default()
    });
    let first = wait_reply(
        &cluster.nodes[0],
        Duration::from_secs(40),
        "a current view of 3 reports",
        |r| current(r, None, 3) && r.view.counts.healthy == 3,
    );
    let leader = assembler(&first).expect("assembled").to_owned();
    // etcd's election names the same agent.
    assert_eq!(
        etcd::election_leader(
            Some(&cluster.fabric),
            ETCD_ENDPOINT,
            &election_name(ETCD_PREFIX)
        )
        .as_deref(),
        Some(leader.as_str())
    );
    // Every agent shows that agent's view; only the leader says it is its
    // own, and only the leader serves the matrix.
    for node in &cluster.nodes {
        let r = wait_reply(node, Duration::from_secs(20), "the leader's view", |r| {
            current(r, Some(&leader), 3)
        });
        let a = r.assembly.expect("assembly");
        assert_eq!(a.here, node.name == leader, "{}: {a:?}", node.name);
        assert_eq!(a.key, format!("{}{leader}", view_prefix(ETCD_PREFIX)));
        let matrix =
            health_tests::api::call(&node.socket(), |c| async move { c.cluster_matrix().await });
        assert_eq!(
            matrix.is_ok(),
            node.name == leader,
            "{}: {matrix:?}",
            node.name
        );
        let text = node.cluster_text();
        assert!(
            text.contains(&format!("Assembled by:     {leader}")) && !text.contains("STALE"),
            "{text}"
        );
    }
    let l = leader_index(&cluster, &leader);
    let other = (l + 1) % 3;
    let last_round = reply(&cluster.nodes[other])
        .and_then(|r| r.assembly)
        .expect("view")
        .round;

    // SIGKILL: no resignation; the election lease ends within its TTL and
    // another agent publishes at its next round.
    cluster.stop_agent(l, Signal::SIGKILL);
    let killed = Instant::now();
    let interval = Duration::from_secs(1);
    let bound = ELECTION_TTL + 2 * interval + Duration::from_secs(1);
    let r = wait_reply(
        &cluster.nodes[other],
        bound,
        "a new view by another agent",
        |r| {
            assembler(r).is_some_and(|a| a != leader)
                && r.assembly.as_ref().is_some_and(|a| !a.stale)
        },
    );
    println!(
        "a new view by {:?} {} ms after the assembler was killed (bound {} ms; last round {last_round})",
        assembler(&r),
        killed.elapsed().as_millis(),
        patience(bound).as_millis()
    );
    let new_leader = assembler(&r).expect("assembled").to_owned();
    for (i, node) in cluster.nodes.iter().enumerate() {
        if i != l {
            wait_reply(
                node,
                Duration::from_secs(10),
                "the new leader's view",
                |r| assembler(r) == Some(new_leader.as_str()),
            );
        }
    }

    // SIGTERM: the leader resigns at once; the last agent publishes within
    // 2 rounds, without waiting for a lease to end.
    let n = leader_index(&cluster, &new_leader);
    let last = 3 - l - n;
    cluster.stop_agent(n, Signal::SIGTERM);
    let stopped = Instant::now();
    let bound = 2 * interval + Duration::from_millis(500);
    let r = wait_reply(
        &cluster.nodes[last],
        bound,
        "a view by the last agent",
        |r| r.assembly.as_ref().is_some_and(|a| a.here && !a.stale),
    );
    println!(
        "a new view by {:?} {} ms after the assembler was stopped (bound {} ms)",
        assembler(&r),
        stopped.elapsed().as_millis(),
        patience(bound).as_millis()
    );
}

#[test]
fn a_bad_view_is_refused_a_stale_one_shown_stale_and_a_false_one_contradicted() {
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        etcd: true,
        lease_ttl: "5m",
        ..Settings::default()
    });
    let first = wait_reply(
        &cluster.nodes[0],
        Duration::from_secs(40),
        "a current view of 2 reports",
        |r| current(r, None, 2),
    );
    let leader = assembler(&first).expect("assembled").to_owned();
    let follower = 1 - leader_index(&cluster, &leader);
    let key = format!("{}{leader}", view_prefix(ETCD_PREFIX));
    // The follower holds that view too before it is replaced: its last
    // good one could still be the leader's first, of its own report only.
    wait_reply(
        &cluster.nodes[follower],
        Duration::from_secs(20),
        "the follower's current view of 2 reports",
        |r| current(r, Some(&leader), 2),
    );

    // A bad value by hand: refused, named with its key in the log; the
    // last good view still shown.
    etcd::put(
        Some(&cluster.fabric),
        ETCD_ENDPOINT,
        (None, false),
        (&key, "\u{1}not a view"),
    );
    let logged = format!("the published view at {key:?} was refused");
    let deadline = Instant::now() + patience(Duration::from_secs(10));
    while !cluster.nodes[follower].log().contains(&logged) {
        assert!(
            Instant::now() < deadline,
            "no refusal logged:\n{}",
            cluster.nodes[follower].log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = reply(&cluster.nodes[follower]).expect("view");
    assert_eq!(assembler(&r), Some(leader.as_str()), "{r:#?}");
    assert_eq!(r.view.reports, 2, "{r:#?}");
    // The leader's next round replaces the bad value.
    let round = r.assembly.as_ref().expect("assembly").round;
    wait_reply(
        &cluster.nodes[follower],
        Duration::from_secs(10),
        "a newer view",
        |r| r.assembly.as_ref().is_some_and(|a| a.round > round),
    );

    // The follower's link down: it receives no view; the one it holds is
    // shown as stale, never as current. The link back: current again.
    let node = &cluster.nodes[follower];
    node.set_uplink(false);
    let r = wait_reply(node, Duration::from_secs(20), "a stale view", |r| {
        r.assembly.as_ref().is_some_and(|a| a.stale)
    });
    let a = r.assembly.expect("assembly");
    assert_eq!(a.assembled_by, leader, "{a:?}");
    assert!(a.age_ms > 2 * a.interval_ms, "{a:?}");
    let text = node.cluster_text();
    assert!(text.contains("STALE"), "{text}");
    node.set_uplink(true);
    wait_reply(node, Duration::from_secs(40), "a current view again", |r| {
        r.assembly.as_ref().is_some_and(|a| !a.stale)
    });

    a_view_of_no_node_is_refused(&cluster, node, &leader);
    a_flood_of_views_is_read_a_batch_at_a_time(&cluster, node);
    // The same at the leader's key, named as the leader's, calling it
    // down, written again and again: each is shown until the leader's
    // next view, written after it, and the follower, which reaches the
    // leader again, reports the contradiction.
    cluster.wait_status(follower, Duration::from_secs(30), |s| {
        s.nodes.iter().any(|n| n.name == leader && n.reachable())
    });
    let deadline = Instant::now() + patience(Duration::from_secs(10));
    let r = loop {
        etcd::put_bytes(
            Some(&cluster.fabric),
            ETCD_ENDPOINT,
            &key,
            forged_view(&leader, &leader),
        );
        std::thread::sleep(Duration::from_millis(200));
        if let Some(r) = reply(node).filter(|r| {
            assembler(r) == Some(leader.as_str())
                && r.contradictions.iter().any(|c| c.node == leader)
        }) {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "no contradiction of the forged view:\n{}",
            node.log()
        );
    };
    assert!(r.contradictions_total >= 1, "{r:#?}");
    let c = &r.contradictions[0];
    assert_eq!(c.here, "reaches it on every path", "{c:?}");
    assert!(
        node.log()
            .contains("the published view contradicts this agent's rounds"),
        "{}",
        node.log()
    );
}

/// A valid view by hand at the key of a name no node has: refused by its
/// key, before it is decoded, and logged so by `node`.
fn a_view_of_no_node_is_refused(cluster: &Cluster, node: &ClusterNode, leader: &str) {
    let prefix = view_prefix(ETCD_PREFIX);
    let key = format!("{prefix}node-9");
    etcd::put_bytes(
        Some(&cluster.fabric),
        ETCD_ENDPOINT,
        &key,
        forged_view(leader, "node-9"),
    );
    let logged = format!(
        "{key:?} was refused and the last good one kept: a view counts only at \
         {prefix:?} followed by a node's name, and this key names no node"
    );
    let deadline = Instant::now() + patience(Duration::from_secs(10));
    while !node.log().contains(&logged) {
        assert!(
            Instant::now() < deadline,
            "no refusal logged:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// 200 values written at one key as fast as etcd takes them: `node`
/// reads a batch every 250 ms at most, the last value of each key,
/// counts the values it skipped (`views_skipped_total`) and says so;
/// the refusals are said once a tick, counted.
fn a_flood_of_views_is_read_a_batch_at_a_time(cluster: &Cluster, node: &ClusterNode) {
    let key = format!("{}flood", view_prefix(ETCD_PREFIX));
    let values = (0..200)
        .map(|i| format!("\u{1}junk {i}").into_bytes())
        .collect();
    let before = reply(node).expect("a view");
    let started = Instant::now();
    etcd::put_bytes_each(Some(&cluster.fabric), ETCD_ENDPOINT, &key, values);
    let took = started.elapsed();
    // A batch every 250 ms at most over the writes, and the last.
    let batches = u64::try_from(took.as_millis() / 250).unwrap_or(u64::MAX) + 2;
    let r = wait_reply(
        node,
        Duration::from_secs(10),
        "the skipped values counted",
        |r| r.views_skipped_total - before.views_skipped_total + batches >= 200,
    );
    let skipped = r.views_skipped_total - before.views_skipped_total;
    let refused = r.views_refused_total - before.views_refused_total;
    println!(
        "200 writes in {} ms: {skipped} skipped, {refused} refused",
        took.as_millis()
    );
    assert!(
        refused <= batches && refused >= 1,
        "{refused} refused: {r:#?}"
    );
    let said = "published views rewritten faster than they are read";
    let deadline = Instant::now() + patience(Duration::from_secs(10));
    while !node.log().contains(said) {
        assert!(Instant::now() < deadline, "not said:\n{}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Two lines a tick at most (the first at once, the count at the
    // tick's end), and ticks are a second or more.
    let log = node.log();
    let refusals = log
        .matches(&format!("the published view at {key:?} was refused"))
        .count();
    let most = 2 * (took.as_secs() + 3);
    assert!(refusals as u64 <= most, "{refusals} refusals said:\n{log}");
}

/// A view by `by`, 6 s ahead of now (within what is accepted: two of the
/// reader's 2 s intervals and 5 s), that calls `down` down and one other
/// node healthy. It ranks as of when it is read.
fn forged_view(down: &str, by: &str) -> Vec<u8> {
    use health_agent::cluster::{
        published_view::PublishedView,
        view::{ClusterView, NodeView, Verdict, VerdictCounts},
    };
    let now_ms = health_agent::util::timefmt::now_ms();
    let view = ClusterView {
        plaintext_nodes: Vec::new(),
        reports: 2,
        ignored: 0,
        counts: VerdictCounts {
            healthy: 1,
            node_down: 1,
            ..VerdictCounts::default()
        },
        nodes: vec![NodeView {
            plaintext: 0,
            name: down.to_owned(),
            zone: None,
            reporting: false,
            observers: 1,
            seen_reachable: 0,
            failing: 1,
            discounted: 0,
            verdict: Verdict::NodeDown,
            failing_observers: vec![by.into()],
            unreached: 0,
            unreached_nodes: Vec::new(),
            lossy: 0,
        }],
    };
    PublishedView::of(by, 1, now_ms + 6_000, 1_000, &view).encode()
}

/// `cargo xtask run --kvstore etcd --nodes 6` as its users get it (the
/// same settings: TLS, a user per node, dual stack, 2 s rounds, the
/// product's lease): one agent assembles the view; stopping that agent
/// (SIGTERM, as `systemctl stop` does) moves the role to another, whose
/// view every remaining agent shows within 2 rounds.
#[test]
fn in_the_local_cluster_of_six_stopping_the_assembler_moves_the_role() {
    use health_tests::cluster::Family;
    let mut cluster = Cluster::start(&Settings::local(6, "2s", true, false, Family::Dual));
    let first = wait_reply(
        &cluster.nodes[0],
        Duration::from_secs(60),
        "a current view of 6 reports",
        |r| current(r, None, 6) && r.view.counts.healthy == 6,
    );
    let leader = assembler(&first).expect("assembled").to_owned();
    let l = leader_index(&cluster, &leader);
    cluster.stop_agent(l, Signal::SIGTERM);
    let stopped = Instant::now();
    let bound = 2 * Duration::from_secs(2) + Duration::from_secs(1);
    let mut new_leader = None;
    for (i, node) in cluster.nodes.iter().enumerate().filter(|(i, _)| *i != l) {
        let r = wait_reply(node, bound, "a view by another agent", |r| {
            assembler(r).is_some_and(|a| a != leader)
                && r.assembly.as_ref().is_some_and(|a| !a.stale)
        });
        let by = assembler(&r).expect("assembled").to_owned();
        assert_eq!(
            new_leader.get_or_insert_with(|| by.clone()),
            &by,
            "node {i} shows another assembler's view"
        );
    }
    println!(
        "{leader} stopped; every other agent shows {new_leader:?}'s view {} ms later (bound {} ms)",
        stopped.elapsed().as_millis(),
        patience(bound).as_millis()
    );
}
