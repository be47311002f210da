//! ECMP flows from a real kernel drop: with `--probe-flows 4`, one flow's
//! source (its ICMP identifier, its TCP source port) dropped on the way to
//! one node reads as partial loss naming that flow, on that node's paths
//! only; the paths stay up.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use health_agent::probe::{
    flows::PathFlows,
    path::ProbeResult,
    quality_view::{NodeQuality, PathQualityView},
};
use health_tests::{
    api,
    cluster::{Cluster, Settings},
    nft::NftTable,
};

fn quality(cluster: &Cluster, node: &str) -> NodeQuality {
    let node = node.to_owned();
    api::call(&cluster.nodes[0].socket(), |c| async move {
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

fn flows<'a>(q: &'a NodeQuality, name: &str) -> &'a PathFlows {
    path(q, name)
        .flows
        .as_deref()
        .unwrap_or_else(|| panic!("{name} has no flows: {q:#?}"))
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

/// node-1 probes every path over 4 flows; node-3's uplink drops what
/// node-1's endpoint sends its node address from flow 2's sources.
#[test]
fn one_dropped_source_port_reads_as_partial_loss_naming_its_flow() {
    let cluster = Cluster::start(&Settings {
        nodes: 3,
        probe_interval: "250ms",
        probe_timeout: "200ms",
        extra_args: vec!["--probe-flows".into(), "4".into()],
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
    let before = quality(&cluster, &target.name);
    let icmp = flows(&before, "host-icmp");
    let http = flows(&before, "host-http");
    assert_eq!((icmp.flows.len(), http.flows.len()), (4, 4), "{before:#?}");
    let sources = |f: &PathFlows| f.flows.iter().map(|x| x.source).collect::<Vec<_>>();
    let (ids, ports) = (sources(icmp), sources(http));
    assert!(
        ids.windows(2).all(|w| w[0] != w[1]) && ports.windows(2).all(|w| w[0] != w[1]),
        "each flow its own source: {ids:?} {ports:?}"
    );
    assert!(icmp.partial().is_empty() && http.partial().is_empty());
    let (id, port) = (ids[2], ports[2]);
    let _drop = NftTable::netdev(
        &target.ns,
        &format!(
            "chain flow2 {{ type filter hook ingress device \"uplink\" priority 0; \
             ip saddr {observer_ip} ip daddr {ip} icmp type echo-request icmp id {id} counter drop; \
             ip saddr {observer_ip} ip daddr {ip} tcp sport {port} counter drop; }}",
            ip = target.ip
        ),
    )
    .expect("nft rules");

    let deadline = Instant::now() + health_tests::patience(Duration::from_secs(60));
    let q = loop {
        let q = quality(&cluster, &target.name);
        if !flows(&q, "host-icmp").partial().is_empty()
            && !flows(&q, "host-http").partial().is_empty()
        {
            break q;
        }
        assert!(Instant::now() < deadline, "no partial loss: {q:#?}");
        std::thread::sleep(Duration::from_millis(250));
    };
    for (name, source) in [("host-icmp", id), ("host-http", port)] {
        let p = path(&q, name);
        let failing = flows(&q, name).partial();
        assert_eq!(failing.len(), 1, "{name}: {p:#?}");
        assert_eq!((failing[0].flow, failing[0].source), (2, source), "{name}");
        assert_eq!(
            p.result,
            ProbeResult::Success,
            "{name}: the other flows answer"
        );
    }
    // No other path shows it: node-3's endpoint paths, node-2's.
    for node in [&target.name, &cluster.nodes[1].name] {
        for p in &quality(&cluster, node).paths {
            if node == &target.name && p.path.starts_with("host-") {
                continue;
            }
            let f = p.flows.as_deref().expect("flows");
            assert!(f.partial().is_empty(), "{node} {}: {p:#?}", p.path);
            assert_eq!(p.result, ProbeResult::Success, "{node} {}", p.path);
        }
    }

    // The CLI and the metrics say the same.
    let verbose = cli(&cluster, &["status", "--verbose"]);
    assert!(
        verbose.contains(&format!(
            "partial loss: 1 of 4 flows failing: flow 2 (source {id})"
        )) && verbose.contains(&format!("flow 2 (source {port})")),
        "{verbose}"
    );
    let table = cli(&cluster, &["status", "--quality", &target.name]);
    assert!(table.contains("failing"), "{table}");
    let metrics = api::call(&cluster.nodes[0].socket(), |c| async move {
        c.raw("GET", "/metrics").await
    })
    .expect("metrics")
    .1;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("health_paths_partial_loss 2\n"),
        "{metrics}"
    );
}
