//! Agents over a 3-member etcd cluster (each member a real etcd in a
//! namespace of its own): given every member's endpoint, they ride out the
//! loss of the member they talk to, keeping their node set and their
//! registration (the lease kept alive through another member), and the
//! cut-off of that member from the others.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use health_tests::{
    cluster::{Cluster, ETCD_PREFIX, Settings},
    etcd_cluster::{PEER_PORT, connected_members},
    nft::NftTable,
};
use nix::sys::signal::Signal;

/// Three agents over a 3-member etcd, leases of [`LEASE_TTL`], each seeing
/// all three nodes.
fn three_over_three_members() -> Cluster {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        etcd: true,
        etcd_members: 3,
        lease_ttl: "4s",
        ..Settings::default()
    });
    for node in &cluster.nodes {
        node.wait_nodes_view(Duration::from_secs(30), |v| v.nodes.len() == 3);
    }
    cluster
}

/// The agents' lease TTL.
const LEASE_TTL: Duration = Duration::from_secs(4);

/// The member the agent `pid` talks to: its established connections to
/// etcd's client port.
fn talked_to(pid: u32) -> std::net::Ipv4Addr {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(ip) = connected_members(pid).first().copied() {
            return ip;
        }
        assert!(
            Instant::now() < deadline,
            "the agent holds no etcd connection"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn agents_keep_their_node_set_and_lease_when_their_etcd_member_is_killed() {
    let lease_ttl = LEASE_TTL;
    let mut cluster = three_over_three_members();
    for node in &cluster.nodes {
        let view = node.nodes_view().expect("the agent answers");
        let etcd = cluster.etcd_cluster.as_ref().expect("an etcd cluster");
        assert_eq!(
            view.source,
            format!("etcd:{}{ETCD_PREFIX}", etcd.endpoints()),
            "every member's endpoint named in the source"
        );
    }

    // The member node-1's agent talks to, killed as in a crash.
    let pid = cluster.nodes[0].pid().expect("node-1's agent runs");
    let talked_to = talked_to(pid);
    let etcd = cluster.etcd_cluster.as_mut().expect("an etcd cluster");
    let victim = etcd
        .members
        .iter()
        .position(|m| m.ip == talked_to)
        .expect("a member's address");
    let leases_before: Vec<i64> = {
        let keys = etcd.keys(ETCD_PREFIX).expect("etcd answers");
        assert_eq!(keys.len(), 3, "{keys:?}");
        keys.iter().map(|(_, lease)| *lease).collect()
    };
    etcd.stop(victim, Signal::SIGKILL);

    // For three lease TTLs: every agent keeps all three nodes without an
    // error, and etcd (the two members left) keeps the three records on
    // the same leases: each agent's keep-alive went through another member.
    let until = Instant::now() + 3 * lease_ttl;
    while Instant::now() < until {
        for node in &cluster.nodes {
            let view = node.nodes_view().expect("the agent answers");
            assert!(
                view.nodes.len() == 3 && view.error.is_none(),
                "{}: {view:#?}\n{}",
                node.name,
                story(&cluster, &leases_before)
            );
        }
        let etcd = cluster.etcd_cluster.as_ref().expect("an etcd cluster");
        if let Some(keys) = etcd.keys(ETCD_PREFIX) {
            let leases: Vec<i64> = keys.iter().map(|(_, l)| *l).collect();
            assert_eq!(
                leases, leases_before,
                "records kept on their leases: {keys:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let etcd = cluster.etcd_cluster.as_ref().expect("an etcd cluster");
    let keys = etcd.keys(ETCD_PREFIX).expect("the members left answer");
    assert_eq!(keys.len(), 3, "{keys:?}");
    let now = connected_members(pid);
    assert!(
        !now.is_empty() && !now.contains(&talked_to),
        "node-1 talks to the members left: {now:?} (killed: {talked_to})"
    );

    // Nobody touched a record, and no lease ended: no agent says its own
    // record was taken (a listing read just before an agent's first
    // write is not that). Before node-3's restart, which starts its log
    // again.
    for node in &cluster.nodes {
        let log = node.log();
        let taken = log.lines().find(|l| l.contains("not by this agent"));
        assert!(
            taken.is_none(),
            "{}: {taken:?}\n{}",
            node.name,
            story(&cluster, &leases_before)
        );
    }

    // A node that registers now (a restarted agent) does so through the
    // members left, and the others see it come back.
    cluster.stop_agent(2, Signal::SIGTERM);
    cluster.nodes[0].wait_nodes_view(Duration::from_secs(10), |v| v.nodes.len() == 2);
    cluster.start_agent(2);
    for node in &cluster.nodes {
        node.wait_nodes_view(Duration::from_secs(30), |v| v.nodes.len() == 3);
    }
}

/// What the agents and etcd said of the outage: the records' leases now
/// and before, each agent's etcd lines and each member's warnings.
fn story(cluster: &Cluster, leases_before: &[i64]) -> String {
    let etcd = cluster.etcd_cluster.as_ref().expect("an etcd cluster");
    let mut out = format!(
        "leases before: {leases_before:x?}\nrecords now: {:x?}\n",
        etcd.keys(ETCD_PREFIX)
    );
    for node in &cluster.nodes {
        let _ = writeln!(out, "--- {} (etcd lines)", node.name);
        for line in node.log().lines().filter(|l| l.contains("etcd")) {
            out.push_str(line);
            out.push('\n');
        }
    }
    for m in &etcd.members {
        let _ = writeln!(out, "--- {} (warnings)", m.name);
        let log = m.log();
        let warnings: Vec<&str> = log
            .lines()
            .filter(|l| {
                [
                    "lease",
                    "leader",
                    "took too long",
                    "\"level\":\"warn\"",
                    " W | ",
                ]
                .iter()
                .any(|w| l.contains(w))
            })
            .collect();
        for line in &warnings[warnings.len().saturating_sub(40)..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The member an agent talks to cut off from the other two (its peer
/// traffic dropped, its clients still served): it has no leader, so it
/// ends the watches it serves and answers nothing, and the agent goes on
/// through the members that have a quorum. A node that leaves is seen to
/// leave, and the agent's own record keeps its lease.
#[test]
fn an_agent_whose_etcd_member_is_cut_off_from_the_others_goes_on_through_them() {
    let lease_ttl = LEASE_TTL;
    let mut cluster = three_over_three_members();
    let pid = cluster.nodes[0].pid().expect("node-1's agent runs");
    let talked_to = talked_to(pid);
    let etcd = cluster.etcd_cluster.as_ref().expect("an etcd cluster");
    let victim = etcd
        .members
        .iter()
        .find(|m| m.ip == talked_to)
        .expect("a member's address");
    let node1_lease = |keys: &[(String, i64)]| {
        keys.iter()
            .find(|(k, _)| k.ends_with("/node-1"))
            .map(|(_, l)| *l)
    };
    let lease_before =
        node1_lease(&etcd.keys(ETCD_PREFIX).expect("etcd answers")).expect("node-1's record");
    let _cut = NftTable::netdev(
        &victim.ns,
        &format!(
            "chain cut {{ type filter hook ingress device \"uplink\" priority 0; \
             tcp dport {PEER_PORT} drop; tcp sport {PEER_PORT} drop; }}"
        ),
    )
    .expect("nft rules");

    // node-3 leaves (its record deleted, or its lease let go); node-1 sees
    // it within two lease TTLs and a member switch.
    cluster.stop_agent(2, Signal::SIGTERM);
    cluster.nodes[0].wait_nodes_view(Duration::from_secs(30), |v| v.nodes.len() == 2);

    // Through three lease TTLs more, node-1's record stays on its lease:
    // its keep-alives reach the leader through another member.
    let etcd = cluster.etcd_cluster.as_ref().expect("an etcd cluster");
    let until = Instant::now() + 3 * lease_ttl;
    while Instant::now() < until {
        if let Some(keys) = etcd.keys(ETCD_PREFIX) {
            assert_eq!(
                node1_lease(&keys),
                Some(lease_before),
                "node-1's record on its lease: {keys:?}\n{}",
                story(&cluster, &[lease_before])
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let now = connected_members(pid);
    assert!(
        now.iter().any(|ip| *ip != talked_to),
        "node-1 talks to a member with a quorum: {now:?} (cut off: {talked_to})"
    );

    // node-3 comes back through the members left, and node-1 sees it.
    cluster.start_agent(2);
    cluster.nodes[0].wait_nodes_view(Duration::from_secs(30), |v| v.nodes.len() == 3);
}
