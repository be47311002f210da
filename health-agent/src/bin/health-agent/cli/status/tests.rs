use std::net::Ipv4Addr;

use health_agent::probe::path::PathState;

use super::*;

fn node(name: &str, result: ProbeResult) -> NodeStatus {
    let path = PathState {
        result,
        ..PathState::default()
    };
    let c = Connectivity::new(Ipv4Addr::new(198, 18, 0, 1), path.clone(), path);
    NodeStatus {
        name: name.into(),
        host: c.clone(),
        endpoint: c,
        host_secondary: None,
        endpoint_secondary: None,
    }
}

fn status(n: usize) -> ClusterStatus {
    let mut nodes: Vec<NodeStatus> = (0..n)
        .map(|i| node(&format!("node-{i:03}"), ProbeResult::Success))
        .collect();
    nodes[5] = node("node-005", ProbeResult::Unknown);
    nodes[40] = node("node-040", ProbeResult::Failure);
    nodes[41] = node("node-041", ProbeResult::Failure);
    ClusterStatus {
        local_node: None,
        probe_interval_ms: 60_000,
        probe_timeout_ms: 1_000,
        round: None,
        encryption: None,
        nodes,
    }
}

fn rows(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("  node-"))
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect()
}

#[test]
fn a_large_cluster_shows_counts_and_the_nodes_not_reachable_failing_first() {
    let text = render(&status(60), false, false, None);
    assert!(
        text.contains("57 reachable, 2 unreachable, 1 unknown"),
        "{text}"
    );
    assert_eq!(rows(&text), ["node-040", "node-041", "node-005"], "{text}");
    assert_eq!(rows(&render(&status(60), false, true, None)).len(), 60);
}

/// At 5,000 nodes, all of them unknown (an agent just started) but two
/// failing: the failing two, then the first unknown ones up to the cap,
/// and how many more; --all lists them all.
#[test]
fn a_large_cluster_lists_a_bounded_number_of_nodes_not_reachable() {
    let mut s = status(5_000);
    for n in &mut s.nodes {
        if n.state() == ProbeResult::Success {
            *n = node(&n.name, ProbeResult::Unknown);
        }
    }
    let text = render(&s, false, false, None);
    let listed = rows(&text);
    assert_eq!(listed.len(), NOT_REACHABLE_SHOWN, "{text}");
    assert_eq!(listed[..3], ["node-040", "node-041", "node-000"], "{text}");
    assert!(
        text.contains(&format!(
            "... and {} more not reachable (--all lists every node",
            5_000 - NOT_REACHABLE_SHOWN
        )),
        "{text}"
    );
    let all = render(&s, false, true, None);
    assert_eq!(rows(&all).len(), 5_000);
    assert!(!all.contains("more not reachable"));
}

fn window(results: usize, loss: f64, p50: u64, p99: u64) -> WindowStats {
    WindowStats {
        results,
        loss_ratio: Some(loss),
        rtt_p50_ns: Some(p50),
        rtt_p99_ns: Some(p99),
    }
}

#[test]
fn verbose_shows_each_paths_figures_over_the_window() {
    let s = status(45);
    let mut stats = HistoryStats {
        window: 60,
        nodes: s
            .nodes
            .iter()
            .map(|n| NodeStats {
                name: n.name.clone(),
                paths: [WindowStats::default(); 4],
                secondary: None,
            })
            .collect(),
    };
    stats.nodes[40].paths = [
        window(60, 0.25, 120_000, 2_500_000),
        window(60, 0.0, 300_000, 400_000),
        WindowStats::default(),
        window(12, 1.0, 0, 0),
    ];
    stats.nodes[40].paths[3].rtt_p50_ns = None;
    stats.nodes[40].paths[3].rtt_p99_ns = None;
    let text = render(&s, true, false, Some(&stats));
    let block: Vec<&str> = text
        .split("\n\n")
        .find(|b| b.trim_start().starts_with("node-040"))
        .expect("node-040's block")
        .lines()
        .collect();
    assert_eq!(
        block[3].trim(),
        "last 60 results: loss 25.0%, RTT p50 120µs p99 2.5ms",
        "{block:#?}"
    );
    assert_eq!(
        block[5].trim(),
        "last 60 results: loss 0.0%, RTT p50 300µs p99 400µs"
    );
    assert_eq!(block[8].trim(), "last 0 results: loss -, RTT p50 - p99 -");
    assert_eq!(
        block[10].trim(),
        "last 12 results: loss 100.0%, RTT p50 - p99 -"
    );
    // Without the figures (an older agent), the paths alone.
    let plain = render(&s, true, false, None);
    assert!(!plain.contains("results: loss"), "{plain}");
    assert!(plain.contains("ICMP to stack:   Failure"), "{plain}");
}

#[test]
fn history_lists_each_paths_results_oldest_first() {
    use health_agent::probe::{
        family::Family,
        history::{HistoryEntry, PathHistory},
    };
    let entry = |at_ms, error: Option<&str>| HistoryEntry {
        at_ms,
        outcome: if error.is_some() {
            EntryOutcome::Failure
        } else {
            EntryOutcome::Success
        },
        rtt_ns: error.is_none().then_some(150_000),
        error: error.map(str::to_owned),
    };
    let path = |name: &str, entries: Vec<HistoryEntry>| PathHistory {
        path: name.to_owned(),
        family: Family::Ipv4,
        ip: Ipv4Addr::new(198, 18, 0, 3).into(),
        loss_ratio: (!entries.is_empty()).then_some(0.5),
        rtt_p50_ns: Some(150_000),
        rtt_p99_ns: Some(150_000),
        entries,
    };
    let h = NodeHistory {
        node: "node-3".into(),
        window: 60,
        paths: vec![
            path(
                "host-icmp",
                vec![
                    entry(1_790_000_000_000, None),
                    entry(1_790_000_001_500, Some("timeout")),
                ],
            ),
            path("host-http", Vec::new()),
        ],
    };
    let text = render_history(&h);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "History of node-3 (the agent keeps the last 60 rounds)"
    );
    assert_eq!(
        lines[2],
        "  host-icmp (ipv4) to 198.18.0.3: last 2 results: loss 50.0%, RTT p50 150µs p99 150µs"
    );
    assert!(
        lines[3].contains("TIME") && lines[3].contains("ERROR"),
        "{text}"
    );
    assert_eq!(
        lines[4].split_whitespace().collect::<Vec<_>>(),
        ["2026-09-21T14:13:20.000Z", "success", "150µs"]
    );
    assert_eq!(
        lines[5].split_whitespace().collect::<Vec<_>>(),
        ["2026-09-21T14:13:21.500Z", "failure", "timeout"]
    );
    assert!(
        text.contains("host-http (ipv4) to 198.18.0.3: last 0 results"),
        "{text}"
    );
    assert!(text.contains("(not probed yet)"), "{text}");
}

/// `node-040` of [`status`] made dual-stack: its IPv6 host ICMP path
/// fails, every other path succeeds.
fn dual_stack(n: usize) -> ClusterStatus {
    let mut s = status(n);
    let ok = PathState {
        result: ProbeResult::Success,
        ..PathState::default()
    };
    let v4 = |ip| Connectivity::new(ip, ok.clone(), ok.clone());
    let v6 = |ip: &str, icmp: ProbeResult| {
        Connectivity::new(
            ip.parse::<std::net::Ipv6Addr>().expect("ip"),
            PathState {
                result: icmp,
                last_error: (icmp == ProbeResult::Failure)
                    .then(|| "no echo reply within 1000 ms".into()),
                ..ok.clone()
            },
            ok.clone(),
        )
    };
    s.nodes[40] = NodeStatus {
        name: "node-040".into(),
        host: v4(Ipv4Addr::new(198, 18, 0, 40)),
        endpoint: v4(Ipv4Addr::new(198, 18, 64, 40)),
        host_secondary: Some(Box::new(v6("2001:2:0:1::40", ProbeResult::Failure))),
        endpoint_secondary: Some(Box::new(v6("2001:2:0:2::40", ProbeResult::Success))),
    };
    s
}

#[test]
fn a_dual_stack_node_shows_both_addresses_and_its_secondary_paths() {
    let s = dual_stack(45);
    let text = render(&s, false, false, None);
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("node-040"))
        .expect("node-040's row");
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        [
            "node-040",
            "198.18.0.40,2001:2:0:1::40",
            "unreachable",
            "reachable"
        ],
        "{text}"
    );
    // The columns stay aligned: every row's NODE word starts at the same
    // column.
    let header = text
        .lines()
        .find(|l| l.contains("ENDPOINTS"))
        .expect("header");
    let col = header.find("NODE").expect("NODE");
    assert!(
        text.lines()
            .filter(|l| l.starts_with("  node-"))
            .all(|l| l[col..].starts_with("reachable")
                || l[col..].starts_with("unreachable")
                || l[col..].starts_with("unknown")),
        "{text}"
    );
    let verbose = render(&s, true, false, None);
    let block: Vec<&str> = verbose
        .split("\n\n")
        .find(|b| b.trim_start().starts_with("node-040"))
        .expect("node-040's block")
        .lines()
        .collect();
    assert_eq!(
        block,
        [
            "  node-040 (198.18.0.40,2001:2:0:1::40):",
            "    Host connectivity to 198.18.0.40:",
            "      ICMP to stack:   OK, RTT=",
            "      HTTP to agent:   OK, RTT=",
            "      Secondary connectivity to 2001:2:0:1::40:",
            "        ICMP to stack:   Failure: no echo reply within 1000 ms",
            "        HTTP to agent:   OK, RTT=",
            "    Endpoint connectivity to 198.18.64.40:",
            "      ICMP to stack:   OK, RTT=",
            "      HTTP to agent:   OK, RTT=",
            "      Secondary connectivity to 2001:2:0:2::40:",
            "        ICMP to stack:   OK, RTT=",
            "        HTTP to agent:   OK, RTT=",
        ],
        "{verbose}"
    );
    // Single-stack nodes have no secondary lines.
    let other = verbose
        .split("\n\n")
        .find(|b| b.trim_start().starts_with("node-041"))
        .expect("node-041's block");
    assert!(!other.contains("Secondary"), "{other}");
}

#[test]
fn with_encryption_checked_the_table_says_which_address_is_not_encrypted() {
    use health_agent::encryption::PathEncryption;
    let mut s = ClusterStatus {
        nodes: vec![
            node("n1", ProbeResult::Success),
            node("n2", ProbeResult::Success),
        ],
        ..status(50)
    };
    let enc = |state| {
        Some(Box::new(PathEncryption {
            state,
            peer: Some("KEY".into()),
            reason: Some(format!("why {state}")),
        }))
    };
    s.nodes[0].host.encryption = enc(EncState::Encrypted);
    s.nodes[0].endpoint.encryption = enc(EncState::Encrypted);
    s.nodes[1].host.encryption = enc(EncState::Plaintext);
    s.nodes[1].endpoint.encryption = enc(EncState::NotCovered);
    s.encryption = Some(EncryptionSummary {
        device: Some("wg0".into()),
        error: None,
        paths: [("encrypted", 2), ("plaintext", 1), ("not_covered", 1)]
            .map(|(k, v)| (k.to_owned(), v))
            .into_iter()
            .collect(),
    });
    let text = render(&s, true, false, None);
    assert!(
        text.contains(
            "Encryption: WireGuard (wg0): 2 encrypted, 1 plaintext, 1 not covered addresses"
        ),
        "{text}"
    );
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name}: {text}"))
            .to_owned()
    };
    assert!(row("n1").ends_with("encrypted"), "{text}");
    assert!(
        row("n2").ends_with("plaintext host, not covered endpoint"),
        "{text}"
    );
    assert!(text.contains("ENCRYPTION"), "{text}");
    assert!(
        text.contains("Encryption:      plaintext (peer KEY): why plaintext"),
        "verbose names the peer and why: {text}"
    );
}

#[test]
fn a_small_cluster_shows_every_node_in_order() {
    let text = render(&status(45), false, false, None);
    assert_eq!(rows(&text).len(), 45, "{text}");
    assert!(!text.contains("--all"), "{text}");
}

#[test]
fn long_node_names_keep_the_columns_aligned() {
    let mut s = status(45);
    s.nodes[1].name = "ip-198-18-0-2.eu-west-1.compute.internal".into();
    s.local_node = Some(s.nodes[1].name.clone());
    let text = render(&s, false, false, None);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("  ")).collect();
    let header = lines[0];
    let ip_at = header.find("IP").expect("an IP column");
    for row in &lines[1..] {
        assert_eq!(row.find("198.18.0.1"), Some(ip_at), "{text}");
    }
    assert!(
        text.contains("ip-198-18-0-2.eu-west-1.compute.internal (localhost) "),
        "{text}"
    );
}
