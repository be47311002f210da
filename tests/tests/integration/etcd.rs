//! Node discovery through a real etcd (Debian's etcd-server) running in the
//! fabric namespace: registration with a lease, join and leave, and an etcd
//! outage during which probing goes on with the last known set.

use std::time::Duration;

use health_agent::api::types::NodesView;
use health_tests::cluster::{Cluster, Settings};
use nix::sys::signal::Signal;

fn nodes_view(cluster: &Cluster, i: usize) -> Option<NodesView> {
    health_tests::api::call(
        &cluster.nodes[i].socket(),
        |c| async move { c.nodes().await },
    )
    .ok()
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
    cluster.stop_agent(2, Signal::SIGTERM);
    cluster.wait_status(0, Duration::from_secs(5), |s| s.nodes.len() == 2);
    // Join: it registers again.
    cluster.start_agent(2);
    cluster.wait_status(0, Duration::from_secs(20), |s| {
        s.nodes.len() == 3 && s.reachable() == 3
    });

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
    let view = nodes_view(&cluster, 0).expect("nodes view");
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
