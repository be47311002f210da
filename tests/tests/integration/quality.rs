//! Path quality from a real kernel drop: a share of one path's probes
//! dropped by nftables reads as that path's loss, with its confidence
//! interval, and makes it degraded while it stays up; no other path moves.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use health_agent::probe::{
    path::ProbeResult,
    quality_view::{NodeQuality, PathQualityView},
};
use health_tests::{
    api,
    cluster::{Cluster, Settings},
    nft::NftTable,
};

fn quality(cluster: &Cluster, observer: usize, node: &str) -> NodeQuality {
    let node = node.to_owned();
    api::call(&cluster.nodes[observer].socket(), |c| async move {
        c.quality(&node).await
    })
    .expect("the quality of a node in the set")
}

fn path<'a>(q: &'a NodeQuality, name: &str) -> &'a PathQualityView {
    q.paths
        .iter()
        .find(|p| p.path == name)
        .unwrap_or_else(|| panic!("no path {name}: {q:#?}"))
}

/// Probes and losses of the 10-minute window.
fn ten_minutes(p: &PathQualityView) -> (u64, u64) {
    let w = p.windows.iter().find(|w| w.window == "10m").expect("10m");
    (w.probes, w.lost)
}

fn cli(cluster: &Cluster, args: &[&str]) -> String {
    let out = std::process::Command::new(health_tests::agent::agent_binary())
        .args(args)
        .arg("--socket")
        .arg(cluster.nodes[0].socket())
        .output()
        .expect("the CLI");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every 20th (small: not the MTU probe) ICMP echo request from node-1's
/// endpoint to node-3's node address is dropped on node-3's uplink
/// (`numgen inc`: exactly 5 %, so
/// the figure can be checked tightly in a minute of probes; `numgen
/// random` would need ten minutes for the same bounds).
#[test]
fn five_percent_of_one_paths_probes_dropped_read_as_its_loss_and_degrade_it() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        probe_interval: "250ms",
        probe_timeout: "200ms",
        ..Settings::default()
    });
    let s = cluster.wait_status(0, Duration::from_secs(30), |s| s.reachable() == 3);
    let observer_ip = s
        .nodes
        .iter()
        .find(|n| n.name == cluster.nodes[0].name)
        .map(|n| match n.endpoint.ip {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(ip) => panic!("an IPv4 cluster, not {ip}"),
        })
        .expect("node-1 probes itself");
    let target = &cluster.nodes[2];
    let _drop = NftTable::netdev(
        &target.ns,
        &format!(
            "chain lossy {{ type filter hook ingress device \"uplink\" priority 0; \
             ip saddr {observer_ip} ip daddr {} ip length < 200 icmp type echo-request \
             numgen inc mod 20 == 0 counter drop; }}",
            target.ip
        ),
    )
    .expect("nft rules");
    let before = quality(&cluster, 0, &target.name);
    let (p1, l1) = ten_minutes(path(&before, "host-icmp"));
    let deadline = Instant::now() + health_tests::patience(Duration::from_secs(180));
    let after = loop {
        let q = quality(&cluster, 0, &target.name);
        if ten_minutes(path(&q, "host-icmp")).0 >= p1 + 300 {
            break q;
        }
        assert!(Instant::now() < deadline, "300 probes never came: {q:#?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let lossy = path(&after, "host-icmp");
    let (p2, l2) = ten_minutes(lossy);
    #[expect(clippy::cast_precision_loss, reason = "a few hundred probes")]
    let share_lost = (l2 - l1) as f64 / (p2 - p1) as f64;
    assert!(
        (0.03..=0.07).contains(&share_lost),
        "loss {share_lost}: {lossy:#?}"
    );
    let w = lossy
        .windows
        .iter()
        .find(|w| w.window == "10m")
        .expect("10m");
    let (low, high) = (w.loss_low.expect("low"), w.loss_high.expect("high"));
    let ratio = w.loss_ratio.expect("ratio");
    assert!(low < ratio && ratio < high && low >= 0.01, "{w:#?}");
    assert!(w.rtt_p50_ns.is_some() && w.rtt_p99_ns.is_some(), "{w:#?}");
    assert_eq!(lossy.result, ProbeResult::Success, "it still answers");
    assert!(lossy.degraded, "{lossy:#?}");

    // No other path moves: node-3's others and node-2's.
    for node in [&target.name, &cluster.nodes[1].name] {
        let q = quality(&cluster, 0, node);
        for p in q
            .paths
            .iter()
            .filter(|p| !(node == &target.name && p.path == "host-icmp"))
        {
            let (probes, lost) = ten_minutes(p);
            assert!(
                probes > 0 && lost * 50 < probes,
                "{node} {}: {p:#?}",
                p.path
            );
            assert!(!p.degraded, "{node} {}: {p:#?}", p.path);
        }
    }

    // The CLI and the metrics say the same.
    let verbose = cli(&cluster, &["status", "--verbose"]);
    assert!(
        verbose.contains("Degraded (answers, but loses probes"),
        "{verbose}"
    );
    let table = cli(&cluster, &["status", "--quality", &target.name]);
    assert!(
        table.contains(&format!("host-icmp (ipv4) to {}: degraded", target.ip)),
        "{table}"
    );
    let metrics = api::call(&cluster.nodes[0].socket(), |c| async move {
        c.raw("GET", "/metrics").await
    })
    .expect("metrics")
    .1;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.contains("health_paths_degraded 1\n"), "{metrics}");
}

/// A node that is not in the set, and a request without a node, are
/// named.
#[test]
fn quality_of_an_unknown_node_or_without_a_node_is_refused() {
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(30), |s| s.reachable() == 2);
    let socket = cluster.nodes[0].socket();
    let (code, body) = api::call(&socket, |c| async move {
        c.raw("GET", "/v1/status/quality?node=nobody").await
    })
    .expect("an answer");
    assert_eq!(code.as_u16(), 404, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("nobody"));
    for bad in ["", "?node=", "?peer=node-2"] {
        let (code, body) = api::call(&socket, |c| async move {
            c.raw("GET", &format!("/v1/status/quality{bad}")).await
        })
        .expect("an answer");
        assert_eq!(
            code.as_u16(),
            400,
            "{bad}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let out = std::process::Command::new(health_tests::agent::agent_binary())
        .args(["status", "--quality", "nobody", "--socket"])
        .arg(&socket)
        .output()
        .expect("the CLI");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nobody"),
        "{out:?}"
    );
}

/// node-3's uplink takes at most 1400-byte packets while the fabric
/// sends it 1500: full-size packets to node-3 are dropped without a word
/// (no "fragmentation needed" from a layer-2 hop), small ones pass. Its
/// ICMP path from node-1 is an MTU black hole; node-2's is not.
#[test]
fn a_smaller_mtu_on_the_way_reads_as_an_mtu_black_hole_and_only_there() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        probe_interval: "500ms",
        probe_timeout: "300ms",
        failure_threshold: 2,
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(30), |s| s.reachable() == 3);
    let target = &cluster.nodes[2];
    health_agent::sys::netlink::in_netns(Some(&target.ns), |nl| async move {
        nl.set_mtu("uplink", 1400).await
    })
    .expect("node-3's uplink MTU");
    let s = cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes
            .iter()
            .any(|n| n.name == target.name && n.host.icmp.mtu_blackhole.is_some())
    });
    for n in &s.nodes {
        let c = &n.host.icmp;
        if n.name == target.name {
            assert_eq!(c.mtu_blackhole, Some(1500), "{n:#?}");
            assert_eq!(c.result, ProbeResult::Success, "small echoes pass: {n:#?}");
        } else {
            assert_eq!(c.mtu_blackhole, None, "{n:#?}");
        }
        assert!(n.reachable(), "every node still answers: {n:#?}");
    }
    let verbose = cli(&cluster, &["status", "--verbose"]);
    assert!(
        verbose.contains("MTU black hole: 1500-byte probes lost"),
        "{verbose}"
    );
    let table = cli(&cluster, &["status", "--quality", &target.name]);
    assert!(
        table.contains("mtu-blackhole (1500-byte probes lost)"),
        "{table}"
    );
    let metrics = api::call(&cluster.nodes[0].socket(), |c| async move {
        c.raw("GET", "/metrics").await
    })
    .expect("metrics")
    .1;
    assert!(
        String::from_utf8_lossy(&metrics).contains("health_paths_mtu_blackhole 1\n"),
        "{}",
        String::from_utf8_lossy(&metrics)
    );

    // The MTU mended, the verdict goes with the next answered probe.
    health_agent::sys::netlink::in_netns(Some(&target.ns), |nl| async move {
        nl.set_mtu("uplink", 1500).await
    })
    .expect("node-3's uplink MTU back");
    cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes.iter().all(|n| n.host.icmp.mtu_blackhole.is_none())
    });
}

/// An MTU black hole as it happens in the wild: a router on the way
/// (r2 of `health_tests::router_chain`) forwards onto a link of MTU 1400
/// and drops its own ICMP "fragmentation needed", so a full-size
/// Don't-Fragment echo vanishes while small ones are answered. The
/// agent's host ICMP path to the peer reads as an MTU black hole of the
/// probe size, the peer's health path (not MTU-probed) does not, and the
/// verdict clears once the link's MTU is back.
#[test]
fn a_router_that_drops_fragmentation_needed_reads_as_an_mtu_black_hole() {
    use health_tests::router_chain::Chain;
    let mut chain = Chain::new();
    chain.start_agent(&["--probe-mtu", "1500"]);
    chain.wait_path("the peer answers three routers away", |p| {
        p.result == ProbeResult::Success && p.mtu_blackhole.is_none()
    });
    let set_mtu = |mtu: u32| {
        for (ns, iface) in [(&chain.ns[2], "east"), (&chain.ns[3], "west")] {
            health_agent::sys::netlink::in_netns(Some(ns), |nl| async move {
                nl.set_mtu(iface, mtu).await
            })
            .expect("set the link's MTU");
        }
    };
    let quiet = NftTable::netdev(
        &chain.ns[2],
        "chain quiet { type filter hook egress device \"west\" priority 0; \
         icmp type destination-unreachable icmp code frag-needed drop; }",
    )
    .expect("nft in r2");
    set_mtu(1400);
    let hole = chain.wait_path("the host ICMP path is an MTU black hole", |p| {
        p.mtu_blackhole.is_some()
    });
    assert_eq!(
        hole.result,
        ProbeResult::Success,
        "small echoes still answer: {hole:?}"
    );
    assert_eq!(hole.mtu_blackhole, Some(1500), "{hole:?}");
    set_mtu(1500);
    let mended = chain.wait_path("the verdict clears with the MTU back", |p| {
        p.result == ProbeResult::Success && p.mtu_blackhole.is_none()
    });
    assert_eq!(mended.mtu_failures, 0, "{mended:?}");
    drop(quiet);
}
