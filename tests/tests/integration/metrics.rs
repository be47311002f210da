//! Prometheus metrics: a real Prometheus scrapes a local cluster's agents;
//! the series stay the same in number whatever the peers, unless per-peer
//! series are asked for, and those go with their peer.

use std::{
    fmt::Write as _,
    process::Command,
    time::{Duration, Instant},
};

use health_agent::sys::netlink::in_netns;
use health_common::maps::MapId;
use health_tests::{
    agent::agent_binary,
    cluster::{Cluster, ClusterNode, Settings, nodes_yaml},
    patience,
    prometheus::{Prometheus, http_get},
};
use serde_json::Value;

/// Node 1's `/metrics`, fetched from the fabric namespace.
fn scrape(cluster: &Cluster, node: &ClusterNode) -> String {
    let (code, body) =
        http_get(&cluster.fabric, node.web_addr(), "/metrics").expect("the metrics listener");
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics: {body}");
    body
}

/// `node`'s `/metrics`, or `None` while its listener does not answer.
fn try_scrape(cluster: &Cluster, node: &ClusterNode) -> Option<String> {
    http_get(&cluster.fabric, node.web_addr(), "/metrics")
        .filter(|(code, body)| *code == 200 && body.ends_with("# EOF\n"))
        .map(|(_, body)| body)
}

/// The value of the series `series` (its name and labels as exposed:
/// `health_nodes{source="file"}`) in an exposition.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

/// Scrapes `node` until `accept` holds of its exposition, which is
/// returned; panics after `timeout`.
fn wait_scrape(
    cluster: &Cluster,
    node: &ClusterNode,
    timeout: Duration,
    accept: impl Fn(&str) -> bool,
) -> String {
    let timeout = patience(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        let text = try_scrape(cluster, node).unwrap_or_default();
        if accept(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "not in {timeout:?}; last scrape of {}:\n{text}\nlog:\n{}",
            node.name,
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `health-agent bpf ARGS -o json` on `node`'s pins.
fn bpf_json(node: &ClusterNode, args: &[&str]) -> Vec<Value> {
    let out = Command::new(agent_binary())
        .arg("bpf")
        .args(args)
        .args(["-o", "json", "--bpffs-dir"])
        .arg(&node.pins)
        .output()
        .expect("health-agent bpf");
    assert!(
        out.status.success(),
        "bpf {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON rows")
}

/// A walk of the maps by the maintenance task, as a scrape showed it: it
/// was published after `after` and before `before`.
struct Walk {
    text: String,
    after: Instant,
    before: Instant,
    /// `health_ct_removed_total` at `after`.
    removed_after: f64,
}

/// Scrapes `node` from its start until a walk of the maps shows CT
/// entries and RTT samples, noting between which two scrapes it was
/// published. The walk's series are absent until the first walk, one
/// collector interval (10 s) after the start, then change a minute apart;
/// so a bounded poll, long enough for a second walk should the first have
/// come before any traffic.
fn wait_walk(cluster: &Cluster, node: &ClusterNode) -> Walk {
    let timeout = patience(Duration::from_secs(100));
    let deadline = Instant::now() + timeout;
    // The last answered scrape: its start, CT entries and removals.
    let mut previous: Option<(Instant, Option<f64>, f64)> = None;
    let mut after = None;
    loop {
        let start = Instant::now();
        let text = try_scrape(cluster, node);
        let end = Instant::now();
        if let Some(text) = text {
            let entries = value(&text, "health_ct_entries");
            if let Some((at, seen, removed)) = previous
                && seen != entries
            {
                after = Some((at, removed));
            }
            let removed = value(&text, "health_ct_removed_total").unwrap_or(0.0);
            previous = Some((start, entries, removed));
            let samples = value(&text, "health_rtt_samples");
            if let Some((after, removed_after)) = after
                && entries.is_some_and(|n| n > 0.0)
                && samples.is_some_and(|n| n > 0.0)
            {
                return Walk {
                    text,
                    after,
                    before: end,
                    removed_after,
                };
            }
        }
        assert!(
            Instant::now() < deadline,
            "no walk of the maps with CT entries and RTT samples in {timeout:?}; log:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The walk's CT entries against `health-agent bpf ct list global`, taken
/// since: every entry listed that was surely created before the walk was
/// counted by it (the datapath never deletes, nothing is evicted from a
/// map this empty), and it counted no more than the entries listed that
/// may have been created before it plus those the collector removed
/// since. Also: no evictions, and the CT map's own row says the same.
fn assert_ct_entries_agree(cluster: &Cluster, node: &ClusterNode, walk: &Walk) {
    let text = &walk.text;
    let entries = value(text, "health_ct_entries").expect("walked");
    assert_eq!(value(text, "health_ct_evicted_total"), Some(0.0), "{text}");
    let ct_map = format!(r#"health_map_entries{{map="{}"}}"#, MapId::CtMap.name());
    assert_eq!(value(text, &ct_map), Some(entries), "{text}");
    let from = Instant::now();
    let rows = bpf_json(node, &["ct", "list", "global"]);
    let to = Instant::now();
    let removed_since = value(&scrape(cluster, node), "health_ct_removed_total")
        .expect("the CT counters")
        - walk.removed_after;
    // An entry listed `a` seconds old (rounded down) was created between
    // a + 1 and a seconds before a moment of the listing.
    let age = |r: &Value| r["created_seconds_ago"].as_f64().expect("an age");
    let surely_before = (to - walk.after).as_secs_f64();
    let surely_after = (from - walk.before).as_secs_f64();
    let low = rows.iter().filter(|r| age(r) > surely_before).count();
    let maybe_before = rows.iter().filter(|r| age(r) + 1.0 >= surely_after).count();
    #[expect(clippy::cast_precision_loss, reason = "a few hundred entries")]
    let (low, high) = (low as f64, maybe_before as f64 + removed_since);
    assert!(
        low <= entries && entries <= high,
        "the walk counted {entries} CT entries; the listing {surely_before:.1} s later has {low} older than it and at most {high} as old (with {removed_since} removed since):\n{rows:#?}"
    );
}

/// Every hash map `health-agent bpf map list` shows has its entries, size
/// and pressure in the walk's series, the pressure in [0, 1] and equal to
/// entries over size; arrays have none. NAT is empty (routed mode) and
/// the RTT totals are no more than the map holds now.
fn assert_maps_walked(node: &ClusterNode, walk: &Walk) {
    let text = &walk.text;
    let rows = bpf_json(node, &["map", "list"]);
    let hashes: Vec<&str> = rows
        .iter()
        .filter(|r| r["type"].as_str().is_some_and(|t| t.contains("hash")))
        .filter_map(|r| r["name"].as_str())
        .collect();
    for map in [
        MapId::CtMap,
        MapId::NatMap,
        MapId::RttStats,
        MapId::RttLosses,
    ] {
        assert!(hashes.contains(&map.name()), "{hashes:?} lacks {map:?}");
    }
    for (row, name) in rows.iter().filter_map(|r| Some((r, r["name"].as_str()?))) {
        let get = |family: &str| value(text, &format!(r#"health_map_{family}{{map="{name}"}}"#));
        let pressure = get("pressure_ratio");
        if !hashes.contains(&name) {
            assert_eq!(pressure, None, "{name} is an array:\n{text}");
            continue;
        }
        let (entries, size) = (get("entries"), get("max_entries"));
        assert_eq!(size, row["max_entries"].as_f64(), "{name}:\n{text}");
        let (Some(p), Some(entries), Some(size)) = (pressure, entries, size) else {
            panic!("{name}: no entries, size or pressure:\n{text}");
        };
        assert!((0.0..=1.0).contains(&p), "{name}: pressure {p}");
        assert!(
            (p - entries / size).abs() < 1e-12,
            "{name}: {p} {entries}/{size}"
        );
    }
    let pressures = text
        .lines()
        .filter(|l| l.starts_with("health_map_pressure_ratio{"))
        .count();
    assert_eq!(pressures, hashes.len(), "{text}");
    assert_eq!(value(text, "health_nat_entries"), Some(0.0), "{text}");
    let rtt = bpf_json(node, &["rtt", "list"]);
    let total = |field: &str| rtt.iter().filter_map(|r| r[field].as_f64()).sum::<f64>();
    let samples = value(text, "health_rtt_samples").expect("walked");
    let losses = value(text, "health_rtt_losses").expect("RTT losses walked");
    assert!(
        samples > 0.0 && samples <= total("samples") && losses <= total("losses"),
        "walk: {samples} samples, {losses} losses; now:\n{rtt:#?}"
    );
}

/// The agent's own series, as Prometheus holds them for the 3 agents of
/// a nodes file without kvstore: each endpoint ready and in no other
/// state, never repaired, 3 nodes from the file, nothing rejected, no
/// kvstore series, the version the binary prints.
fn assert_agent_series(prom: &Prometheus, patience: Duration) {
    let out = Command::new(agent_binary())
        .arg("--version")
        .output()
        .expect("health-agent --version");
    let printed = String::from_utf8_lossy(&out.stdout);
    let version = printed
        .trim()
        .strip_prefix("health-agent ")
        .expect("health-agent VERSION");
    prom.wait_value(
        &format!(r#"count(health_build_info{{version="{version}"}} == 1)"#),
        3.0,
        patience,
    );
    for (promql, want) in [
        (r#"count(health_endpoint_state{state="ready"} == 1)"#, 3.0),
        ("sum(health_endpoint_state)", 3.0),
        (r#"count(health_nodes{source="file"} == 3)"#, 3.0),
        ("count(health_nodes)", 3.0),
        ("sum(health_endpoint_repairs_total)", 0.0),
        ("sum(health_node_updates_rejected_total)", 0.0),
        ("sum(health_node_records_rejected)", 0.0),
        ("count(health_build_info)", 3.0),
    ] {
        assert_eq!(prom.value(promql), Some(want), "{promql}");
    }
    let kvstore = prom.query("health_kvstore_connected");
    assert!(kvstore.is_empty(), "no kvstore, yet {kvstore:?}");
}

/// The series of an exposition (its lines that are not comments).
fn series(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

fn wait_reachable(cluster: &Cluster, n: usize) {
    for i in 0..cluster.nodes.len() {
        cluster.wait_status(i, Duration::from_secs(30), |s| {
            s.nodes.len() == n && s.reachable() == n
        });
    }
}

#[test]
fn prometheus_sees_a_node_go_unreachable_and_back_and_datapath_counters_grow() {
    let cluster = Cluster::start(&Settings::default());
    let walk = wait_walk(&cluster, &cluster.nodes[0]);
    assert_ct_entries_agree(&cluster, &cluster.nodes[0], &walk);
    assert_maps_walked(&cluster.nodes[0], &walk);
    wait_reachable(&cluster, 3);
    let targets: Vec<_> = cluster.nodes.iter().map(ClusterNode::web_addr).collect();
    let prom = Prometheus::start(&cluster.fabric, cluster.dir.join("prometheus"), &targets);
    let patience = Duration::from_secs(30);
    prom.wait_value(r#"count(up{job="health"} == 1)"#, 3.0, patience);
    assert_agent_series(&prom, patience);
    let inst = cluster.nodes[0].web_addr();
    let nodes = |status: &str| {
        format!(
            r#"health_node_connectivity_status{{instance="{inst}",type="node",status="{status}"}}"#
        )
    };
    prom.wait_value(&nodes("reachable"), 3.0, patience);
    prom.wait_value(&nodes("unreachable"), 0.0, patience);
    let answered = format!(r#"health_echo_packets_total{{instance="{inst}",verdict="answered"}}"#);
    let created = format!(r#"health_ct_created_total{{instance="{inst}"}}"#);
    let (answered0, created0) = (
        prom.value(&answered).expect("echo counter scraped"),
        prom.value(&created).expect("CT counter scraped"),
    );

    cluster.nodes[2].set_uplink(false);
    prom.wait_value(&nodes("unreachable"), 1.0, patience);
    prom.wait_value(
        &format!(r#"health_node_connectivity_status{{instance="{inst}",type="endpoint",status="unreachable"}}"#),
        1.0,
        patience,
    );
    cluster.nodes[2].set_uplink(true);
    prom.wait_value(&nodes("unreachable"), 0.0, patience);
    prom.wait_value(&nodes("reachable"), 3.0, patience);

    let (answered1, created1) = (
        prom.value(&answered).expect("echo counter"),
        prom.value(&created).expect("CT counter"),
    );
    assert!(
        answered1 > answered0,
        "echo answered: {answered0} then {answered1}"
    );
    assert!(
        created1 > created0,
        "CT created: {created0} then {created1}"
    );
    // The prober's own series, summed over the agents.
    let probes = prom
        .value(r#"sum(health_probes_total{protocol="icmp",result="success"})"#)
        .expect("probe counter");
    assert!(probes > 0.0, "{probes}");
}

/// The nodes file's text for the cluster's 3 nodes and `extra` peers that
/// never answer (198.18.1.0/24 node IPs, health IPs 198.18.100.x inside the
/// cluster's health range).
fn with_silent_peers(extra: usize) -> String {
    let mut yaml = nodes_yaml(3);
    for i in 0..extra {
        let _ = write!(
            yaml,
            "  - name: silent-{i:03}\n    node-ip: 198.18.1.{}\n    health-ip: 198.18.100.{}\n",
            i + 1,
            i + 1
        );
    }
    yaml
}

#[test]
fn series_are_as_many_with_200_peers_as_with_3() {
    let cluster = Cluster::start(&Settings {
        // Every peer probed, each with its status.
        extra_args: vec!["--probe-peers".into(), "all".into()],
        ..Settings::default()
    });
    wait_reachable(&cluster, 3);
    let node = &cluster.nodes[0];
    // The walk's series (entries, pressure per map) appear with the first
    // walk of the maps, 10 s after the start: both counts include them.
    wait_scrape(&cluster, node, Duration::from_secs(30), |t| {
        value(t, "health_ct_entries").is_some()
    });
    let three = scrape(&cluster, node);
    assert!(
        three.contains("health_node_connectivity_latency_seconds_bucket"),
        "no latency histogram after a round:\n{three}"
    );
    let seq = node.status().and_then(|s| s.round).map_or(0, |r| r.seq);
    cluster.write_nodes_text(&with_silent_peers(197));
    cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes.len() == 200 && s.round.as_ref().is_some_and(|r| r.seq >= seq + 2)
    });
    let two_hundred = scrape(&cluster, node);
    assert!(
        two_hundred
            .contains(r#"health_node_connectivity_status{type="node",status="unknown"} 197"#)
            || two_hundred.contains(
                r#"health_node_connectivity_status{type="node",status="unreachable"} 197"#
            ),
        "the silent peers are not counted:\n{two_hundred}"
    );
    assert!(!two_hundred.contains("silent-"), "a per-peer series leaked");
    assert_eq!(
        series(&three).len(),
        series(&two_hundred).len(),
        "3 peers:\n{three}\n200 peers:\n{two_hundred}"
    );
}

#[test]
fn per_peer_series_go_with_their_peer() {
    let cluster = Cluster::start(&Settings {
        extra_args: vec!["--metrics-per-peer".into()],
        ..Settings::default()
    });
    wait_reachable(&cluster, 3);
    let node = &cluster.nodes[0];
    let before = scrape(&cluster, node);
    for line in [
        r#"health_peer_reachable{peer="node-3",type="node",protocol="icmp",family="ipv4"} 1"#,
        r#"health_peer_reachable{peer="node-3",type="endpoint",protocol="http",family="ipv4"} 1"#,
        r#"health_peer_rtt_seconds{peer="node-3",type="endpoint",protocol="icmp",family="ipv4"}"#,
    ] {
        assert!(before.contains(line), "missing {line:?} in\n{before}");
    }
    // The same exposition on the unix socket.
    let (code, body) =
        health_tests::api::call(
            &node.socket(),
            |c| async move { c.raw("GET", "/metrics").await },
        )
        .expect("GET /metrics on the socket");
    let on_socket = String::from_utf8_lossy(&body);
    assert_eq!(code.as_u16(), 200, "{on_socket}");
    assert!(
        on_socket.contains(
            r#"health_peer_reachable{peer="node-3",type="node",protocol="icmp",family="ipv4"} 1"#
        ),
        "{on_socket}"
    );
    cluster.write_nodes_text(&nodes_yaml(2));
    cluster.wait_status(0, Duration::from_secs(20), |s| s.nodes.len() == 2);
    let after = scrape(&cluster, node);
    assert!(
        after.contains(
            r#"health_peer_reachable{peer="node-2",type="node",protocol="icmp",family="ipv4"} 1"#
        ),
        "{after}"
    );
    assert!(
        !after.contains(r#"peer="node-3""#),
        "node-3 left but kept series:\n{after}"
    );
    assert_rejections_counted(&cluster, node);
    assert_repair_counted(&cluster, node);
}

/// A bad record in the nodes file is counted as rejected and the others
/// kept; a file that does not parse is an update rejected as a whole, the
/// last good set (and its count of rejected records) staying.
fn assert_rejections_counted(cluster: &Cluster, node: &ClusterNode) {
    // Nodes from the file, records rejected, updates rejected.
    let counts = |t: &str| {
        [
            r#"health_nodes{source="file"}"#,
            "health_node_records_rejected",
            "health_node_updates_rejected_total",
        ]
        .map(|series| value(t, series))
    };
    let before = scrape(cluster, node);
    assert_eq!(
        counts(&before),
        [Some(2.0), Some(0.0), Some(0.0)],
        "{before}"
    );
    cluster.write_nodes_text(&format!(
        "{}  - name: bad\n    node-ip: 127.0.0.1\n    health-cidr: 198.19.0.0/24\n",
        nodes_yaml(2)
    ));
    let text = wait_scrape(cluster, node, Duration::from_secs(20), |t| {
        counts(t)[1] == Some(1.0)
    });
    assert_eq!(counts(&text), [Some(2.0), Some(1.0), Some(0.0)], "{text}");
    cluster.write_nodes_text("nodes: [\n");
    let text = wait_scrape(cluster, node, Duration::from_secs(20), |t| {
        counts(t)[2] == Some(1.0)
    });
    assert_eq!(counts(&text), [Some(2.0), Some(1.0), Some(1.0)], "{text}");
}

/// The endpoint's host side deleted: the controller repairs it once, and
/// the endpoint is ready again, in that state alone.
fn assert_repair_counted(cluster: &Cluster, node: &ClusterNode) {
    let ready = r#"health_endpoint_state{state="ready"}"#;
    let states = |t: &str| -> f64 {
        t.lines()
            .filter(|l| l.starts_with("health_endpoint_state{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = scrape(cluster, node);
    assert_eq!(
        value(&before, "health_endpoint_repairs_total"),
        Some(0.0),
        "{before}"
    );
    assert_eq!(value(&before, ready), Some(1.0), "{before}");
    in_netns(Some(&node.ns), |nl| async move {
        nl.delete_link("lxc_health").await
    })
    .expect("delete lxc_health");
    let text = wait_scrape(cluster, node, Duration::from_secs(10), |t| {
        value(t, "health_endpoint_repairs_total").is_some_and(|n| n >= 1.0)
            && value(t, ready) == Some(1.0)
    });
    assert_eq!(
        value(&text, "health_endpoint_repairs_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(states(&text), 1.0, "one current state:\n{text}");
}
