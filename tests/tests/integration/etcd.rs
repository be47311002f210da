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

/// Puts `key` = `value` through etcd's JSON gateway, from the fabric.
fn etcd_put(cluster: &Cluster, key: &str, value: &str) {
    use std::io::{Read as _, Write as _};
    let body = format!(
        "{{\"key\": \"{}\", \"value\": \"{}\"}}",
        base64(key.as_bytes()),
        base64(value.as_bytes())
    );
    let reply = cluster
        .fabric
        .run(|| -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(health_tests::cluster::ETCD_ENDPOINT)?;
            write!(
                s,
                "POST /v3/kv/put HTTP/1.1\r\nhost: etcd\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .expect("fabric netns")
        .expect("etcd put");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
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
                "health-ip 198.18.0.13 is already the node-ip of node \"node-3\" at etcd key \"/health/nodes/node-3\", which is kept"
            ),
            (
                "/health/nodes/zz",
                "the name \"node-2\" is not the key's last segment \"zz\""
            ),
        ]
    );
    // The good ones are still probed.
    let s = cluster.wait_status(0, Duration::from_secs(10), |s| s.reachable() == 3);
    assert_eq!(s.nodes.len(), 3);
}
