use std::net::{Ipv4Addr, Ipv6Addr};

use super::*;
use crate::{
    membership::Node,
    probe::{
        family::{
            EP_HTTP, EP_ICMP, Families, Family, HOST_HTTP, HOST_ICMP, MAX_PATHS, PER_FAMILY,
            path_index,
        },
        history,
        path::{ProbeResult, RttSource, Thresholds},
        path_record::PathRecord,
        published::CHUNK,
        targets::target_count,
    },
};

#[test]
fn the_gzipped_status_is_the_status_and_made_once() {
    let prober = Prober::new(ProbeConfig::default());
    let nodes = (0..500u16)
        .map(|i| Node {
            name: format!("node-{i:04}"),
            node_ip: Some(Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8)),
            health_ip: Some(Ipv4Addr::new(198, 19, (i >> 8) as u8, i as u8)),
            node_ip6: None,
            health_ip6: None,
            zone: None,
        })
        .collect();
    prober.set_nodes(NodeSet::new(nodes).expect("unique"));
    let (json, gz) = (prober.status_json(), prober.status_json_gzip());
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain)
        .expect("gunzip");
    assert_eq!(plain, json.to_vec());
    assert_eq!(
        json.to_vec(),
        serde_json::to_vec(&*prober.status()).expect("json"),
        "the status itself"
    );
    assert!(
        gz.len() * 5 < json.len(),
        "{} of {} bytes",
        gz.len(),
        json.len()
    );
    // The same bytes (one compression, at the publish) until the next.
    assert_eq!(prober.status_json_gzip().as_ptr(), gz.as_ptr());
    // The node sync's periodic run with the set unchanged publishes
    // nothing new; a changed set is shown at once.
    prober.set_nodes(prober.nodes());
    assert_eq!(prober.status_json_gzip().as_ptr(), gz.as_ptr());
    let fewer = prober.nodes().iter().skip(1).cloned().collect();
    prober.set_nodes(NodeSet::new(fewer).expect("unique"));
    assert_eq!(prober.status().nodes.len(), 499);
    // The summary is counted with each publish, and the status lists
    // its nodes sorted by name, as a lookup by name bisects.
    assert_eq!(*prober.status_summary(), prober.status().summary());
    assert_eq!(prober.status_summary().nodes, 499);
    let status = prober.status();
    assert!(status.nodes.is_sorted_by(|a, b| a.name < b.name));
    assert_eq!(
        status.node("node-0377").map(|n| n.name.as_str()),
        Some("node-0377")
    );
    assert!(status.node("node-0000").is_none(), "the one removed");
}

fn nodes(names: &[&str]) -> NodeSet {
    NodeSet::named(names)
}

fn ok(us: u64) -> Outcome {
    Outcome::Ok {
        rtt: Duration::from_micros(us),
        warning: None,
        source: RttSource::Userspace,
    }
}

fn refused() -> Outcome {
    Outcome::Failed(ProbeError::io(
        "connect",
        &std::io::Error::from_raw_os_error(libc::ECONNREFUSED),
    ))
}

/// Round `seq` over the prober's nodes: every path succeeds with an RTT
/// of `seq` µs, except `failing`'s host HTTP path.
fn round_with(prober: &Prober, seq: u64, failing: Option<&str>) -> usize {
    round_where(prober, seq, |n, family, endpoint| {
        let bad = failing == Some(n.name.as_str()) && family == Family::Ipv4 && !endpoint;
        (ok(seq), if bad { refused() } else { ok(seq) })
    })
}

/// Round `seq` over the prober's nodes, each probe's (ICMP, HTTP)
/// outcomes from `outcome(node, family, to the endpoint)`.
fn round_where(
    prober: &Prober,
    seq: u64,
    outcome: impl Fn(&Node, Family, bool) -> (Outcome, Outcome),
) -> usize {
    let set = prober.nodes();
    let t = targets(&set, prober.cfg.families);
    let outcomes: Vec<_> = (0..t.keys.len())
        .map(|i| {
            let (family, endpoint) = t.kind(i);
            outcome(&set[t.keys[i].0 as usize], family, endpoint)
        })
        .collect();
    prober
        .round_seq
        .store(seq, std::sync::atomic::Ordering::Relaxed);
    let recorded = prober.record(&set, &t.keys, outcomes, seq, seq * 1000, seq * 1000 + 7);
    prober.publish(None, true);
    recorded
}

/// `a` dual-stack, `b` IPv4-only, `c` IPv6-only.
fn mixed() -> NodeSet {
    let v4 = |n: u8| Ipv4Addr::new(198, 18, 1, n);
    let h4 = |n: u8| Ipv4Addr::new(198, 18, 2, n);
    let v6 = |n: u16| Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, n);
    let h6 = |n: u16| Ipv6Addr::new(0x2001, 2, 0, 2, 0, 0, 0, n);
    NodeSet::new(vec![
        Node {
            node_ip6: Some(v6(1)),
            health_ip6: Some(h6(1)),
            ..Node::v4("a", v4(1), h4(1))
        },
        Node::v4("b", v4(2), h4(2)),
        Node {
            name: "c".into(),
            node_ip6: Some(v6(3)),
            health_ip6: Some(h6(3)),
            ..Node::default()
        },
    ])
    .expect("unique")
}

fn prober_of(families: Families) -> Arc<Prober> {
    let prober = Prober::new(ProbeConfig {
        families,
        thresholds: Thresholds {
            success: 1,
            failure: 1,
        },
        ..ProbeConfig::default()
    });
    prober.set_nodes(mixed());
    prober
}

#[test]
fn paths_per_family_follow_the_node_and_the_agents_families() {
    let count = |families| {
        let t = targets(&mixed(), families);
        assert_eq!(t.ips.len(), t.keys.len());
        assert_eq!(target_count(&mixed(), families), t.ips.len());
        let per_node: Vec<usize> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, _)| 2 * t.keys.iter().filter(|k| k.0 as usize == i).count())
            .collect();
        (per_node, t.ips.iter().filter(|ip| ip.is_ipv6()).count())
    };
    // Paths per node (2 per address probed) and IPv6 addresses probed.
    assert_eq!(count(Families::Ipv4), (vec![4, 4, 0], 0));
    assert_eq!(count(Families::Dual), (vec![8, 4, 4], 4));
    assert_eq!(count(Families::Ipv6), (vec![4, 0, 4], 4));
    // Primary first: a's IPv4 addresses, then its IPv6 ones.
    let t = targets(&mixed(), Families::Dual);
    assert_eq!(t.keys[..4], [(0, 0), (0, 1), (0, 2), (0, 3)]);
    assert_eq!(t.kind(3), (Family::Ipv6, true));
    assert_eq!(
        t.ips[2],
        IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1))
    );
    // Each address carries its node's tag, which its answer must name.
    let nodes = mixed();
    assert_eq!(t.tags.len(), t.ips.len());
    for (tag, &(node, _)) in t.tags.iter().zip(&t.keys) {
        let name = nodes[node as usize].name.as_bytes();
        assert_eq!(*tag, crate::probe::http::node_tag(name));
    }
}

#[test]
fn a_node_removed_during_the_round_is_skipped_and_the_next_keeps_its_outcomes() {
    let prober = prober_of(Families::Dual);
    let set = prober.nodes();
    let t = targets(&set, Families::Dual);
    // b leaves while the round runs; c's endpoint ICMP fails.
    let without_b: Vec<Node> = set.iter().filter(|n| n.name != "b").cloned().collect();
    prober.set_nodes(NodeSet::new(without_b).expect("unique"));
    let outcomes: Vec<_> = (0..t.keys.len())
        .map(|i| {
            let (_, endpoint) = t.kind(i);
            let c = set[t.keys[i].0 as usize].name == "c";
            (if c && endpoint { refused() } else { ok(10) }, ok(20))
        })
        .collect();
    assert_eq!(prober.record(&set, &t.keys, outcomes, 1, 1000, 1007), 12);
    assert!(!prober.paths.lock().expect("paths").contains_key("b"));
    let status = prober.status();
    let names: Vec<&str> = status.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["a", "c"]);
    assert!(status.nodes[0].reachable(), "{:?}", status.nodes[0]);
    let c = &status.nodes[1];
    assert_eq!(
        (
            c.host.icmp.result,
            c.endpoint.icmp.result,
            c.endpoint.http.result
        ),
        (
            ProbeResult::Success,
            ProbeResult::Failure,
            ProbeResult::Success
        )
    );
    // Outcomes that end early record the nodes they reach, no others.
    let prober = prober_of(Families::Dual);
    let two = (0..2).map(|_| (ok(10), ok(20)));
    assert_eq!(prober.record(&set, &t.keys, two, 1, 1000, 1007), 4);
    assert_eq!(prober.paths.lock().expect("paths").len(), 1);
}

/// A round over three chunks of nodes frees the paths between chunks
/// (a reader of one node's status waits for a chunk, not the round),
/// and a node removed between two chunks is not brought back by the
/// next.
#[test]
fn a_round_is_recorded_a_chunk_of_nodes_at_a_time() {
    let prober = Prober::new(ProbeConfig::default());
    let set = NodeSet::numbered(u16::try_from(2 * CHUNK + 1).expect("small"));
    prober.set_nodes(set.clone());
    let t = targets(&set, prober.cfg.families);
    let last = set[set.len() - 1].name.clone();
    let without_last = NodeSet::new(set[..set.len() - 1].to_vec()).expect("unique");
    let free = std::cell::Cell::new(0);
    let outcomes = (0..t.keys.len()).map(|_| {
        if prober.paths.try_lock().is_ok() {
            free.set(free.get() + 1);
            if free.get() == 2 {
                prober.set_nodes(without_last.clone());
            }
        }
        (ok(10), ok(20))
    });
    let recorded = prober.record(&set, &t.keys, outcomes, 1, 1000, 1007);
    assert_eq!(free.get(), 3, "free before each of the three chunks");
    assert_eq!(recorded, 4 * (set.len() - 1));
    let paths = prober.paths.lock().expect("paths");
    assert_eq!(paths.len(), set.len() - 1);
    assert!(!paths.contains_key(last.as_str()), "{last} came back");
}

/// Every node's history is read with no round half recorded: asked
/// for between two chunks of a round, it waits for the round's end
/// and shows the round on every node.
#[test]
fn every_nodes_history_waits_for_the_round_being_recorded() {
    let prober = Prober::new(ProbeConfig::default());
    let n = u16::try_from(2 * CHUNK + 1).expect("small");
    prober.set_nodes(NodeSet::numbered(n));
    round_with(&prober, 1, None);
    let set = prober.nodes();
    let t = targets(&set, prober.cfg.families);
    let (mid, reader) = std::sync::mpsc::channel();
    let recorder = {
        let prober = prober.clone();
        std::thread::spawn(move || {
            let mut pulled = 0;
            let outcomes = (0..t.keys.len()).map(|_| {
                // Between the first and the second chunk: the reader
                // is let go, and the round waits for it a while.
                if prober.paths.try_lock().is_ok() {
                    pulled += 1;
                    if pulled == 2 {
                        let _ = mid.send(());
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                (ok(2), refused())
            });
            prober.while_recording(|| prober.record(&set, &t.keys, outcomes, 2, 2000, 2007))
        })
    };
    reader.recv().expect("the round reached its second chunk");
    let strips = prober.history_strips();
    let stats = prober.history_stats();
    assert_eq!(recorder.join().expect("recorded"), 4 * usize::from(n));
    assert_eq!(strips.nodes.len(), usize::from(n));
    for s in &strips.nodes {
        assert_eq!(s.paths[1], "SF", "{}: {:?}", s.name, s.paths);
    }
    assert_eq!(stats.nodes.len(), usize::from(n));
    for s in &stats.nodes {
        let http = &s.paths[1];
        assert_eq!(
            (http.results, http.loss_ratio),
            (2, Some(0.5)),
            "{}",
            s.name
        );
    }
}

#[test]
fn a_rounds_probes_show_in_the_windows_whatever_the_wall_clock_says() {
    let prober = prober_of(Families::Dual);
    let set = prober.nodes();
    let t = targets(&set, Families::Dual);
    // Rounds stamped by the wall clock, then by one stepped forward a
    // day, then back: the windows count on their own clock.
    let now = crate::util::timefmt::now_ms();
    for (seq, at) in [(1, now), (2, now + 86_400_000), (3, now + 1)] {
        let outcomes = (0..t.keys.len()).map(|_| (ok(10), refused()));
        prober.record(&set, &t.keys, outcomes, seq, at, at + 7);
    }
    let q = prober.node_quality("a").expect("a is a node");
    let host_icmp = q
        .paths
        .iter()
        .find(|p| p.path == "host-icmp" && p.family == Family::Ipv4)
        .expect("host-icmp");
    let minute = &host_icmp.windows[0];
    assert_eq!((minute.probes, minute.lost), (3, 0), "{minute:?}");
    let host_http = q
        .paths
        .iter()
        .find(|p| p.path == "host-http" && p.family == Family::Ipv4)
        .expect("host-http");
    assert_eq!(
        (host_http.windows[0].probes, host_http.windows[0].lost),
        (3, 3)
    );
}

#[test]
fn the_targets_that_failed_last_go_first_as_the_last_round_recorded_them() {
    let prober = prober_of(Families::Dual);
    let set = prober.nodes();
    let t = targets(&set, Families::Dual);
    let spread = Spread {
        n: t.keys.len(),
        flows: 2,
    };
    // Of a's 4 targets, b's 2 and c's 2: a's IPv4 endpoint fails both
    // probes (target 1), b's node its echo (4), b's endpoint its HTTP
    // probe (5).
    round_where(&prober, 1, |n, family, endpoint| {
        let a_v4 = n.name == "a" && endpoint && family == Family::Ipv4;
        let icmp_bad = a_v4 || (n.name == "b" && !endpoint);
        let http_bad = a_v4 || (n.name == "b" && endpoint);
        (
            if icmp_bad { refused() } else { ok(10) },
            if http_bad { refused() } else { ok(20) },
        )
    });
    let (cached, flags) = {
        let last = prober.failed.lock().expect("lock");
        let (s, f) = last.as_ref().expect("recorded");
        (s.same_snapshot(&set), f.to_vec())
    };
    assert!(cached);
    assert_eq!(flags, prober.failed_looked_up(&set, &t.keys));
    let order = prober.failed_first(&set, &t.keys, spread);
    // Each flow's probe of them (target + 8) beside it.
    assert_eq!(order.icmp()[..7], [4, 12, 1, 9, 5, 13, 0], "{order:?}");
    assert_eq!(order.icmp_suspects(), 4);
    let http: Vec<usize> = order.http().collect();
    assert_eq!(http[..5], [1, 9, 5, 13, 0], "{http:?}");
    assert_eq!(http[14..], [4, 12], "the echo's failures last");
    assert_eq!(order.http_suspects(), 4);
    // The same nodes in another snapshot: read from the paths.
    let again = NodeSet::new(set.iter().cloned().collect()).expect("unique");
    assert_eq!(prober.failed_first(&again, &t.keys, spread), order);
    // A new node set lets the old one go, and the order stands.
    let fewer: Vec<Node> = set.iter().filter(|n| n.name != "c").cloned().collect();
    prober.set_nodes(NodeSet::new(fewer).expect("unique"));
    assert!(prober.failed.lock().expect("lock").is_none());
    prober.set_nodes(again.clone());
    assert_eq!(prober.failed_first(&again, &t.keys, spread), order);
    // Answered again: no suspect.
    round_where(&prober, 2, |_, _, _| (ok(10), ok(20)));
    let none = prober.failed_first(&set, &t.keys, spread);
    assert_eq!((none.icmp_suspects(), none.http_suspects()), (0, 0));
}

#[test]
fn a_dual_stack_node_is_reachable_only_over_all_eight_paths() {
    let prober = prober_of(Families::Dual);
    // Everything succeeds but a's IPv6 endpoint ICMP.
    let recorded = round_where(&prober, 1, |n, family, endpoint| {
        let bad = n.name == "a" && family == Family::Ipv6 && endpoint;
        (if bad { refused() } else { ok(10) }, ok(20))
    });
    assert_eq!(recorded, 16, "8 + 4 + 4 paths");
    let status = prober.status();
    let a = &status.nodes[0];
    assert_eq!(
        (a.host.family, a.endpoint.family),
        (Family::Ipv4, Family::Ipv4)
    );
    let (h2, e2) = (
        a.host_secondary.as_deref().expect("a's IPv6 host"),
        a.endpoint_secondary.as_deref().expect("a's IPv6 endpoint"),
    );
    assert_eq!(
        (h2.family, h2.ip),
        (Family::Ipv6, "2001:2:0:1::1".parse().expect("ip"))
    );
    assert_eq!(e2.icmp.result, ProbeResult::Failure);
    assert_eq!(a.host.icmp.result, ProbeResult::Success);
    assert_eq!(a.state(), ProbeResult::Failure);
    // b: IPv4 only, no secondary; c: IPv6 only, primary IPv6.
    let (b, c) = (&status.nodes[1], &status.nodes[2]);
    assert!(b.reachable() && b.host_secondary.is_none());
    assert!(c.reachable() && c.host_secondary.is_none());
    assert_eq!(c.host.family, Family::Ipv6);
    assert_eq!(status.summary().reachable, 2);
    let json = String::from_utf8(prober.status_json().to_vec()).expect("utf-8");
    assert_eq!(json.matches("host_secondary").count(), 1, "{json}");
    // History: eight paths for a, the secondary strips and figures.
    let h = prober.node_history("a").expect("a");
    assert_eq!(h.paths.len(), 8);
    assert_eq!(h.paths[6].family, Family::Ipv6);
    assert_eq!(h.paths[6].path, "endpoint-icmp");
    assert_eq!(
        h.paths[6].entries[0].outcome,
        history::EntryOutcome::Failure
    );
    let strips = prober.history_strips();
    assert_eq!(
        strips.nodes[0]
            .secondary
            .as_ref()
            .map(|s| s[EP_ICMP].as_str()),
        Some("F")
    );
    assert_eq!(strips.nodes[0].paths[EP_ICMP], "S");
    assert!(strips.nodes[1].secondary.is_none());
    assert_eq!(strips.nodes[2].paths[HOST_ICMP], "S", "c's primary is IPv6");
    let figures = prober.history_stats();
    assert_eq!(
        figures.nodes[0].secondary.map(|s| s[EP_ICMP].loss_ratio),
        Some(Some(1.0))
    );
}

#[test]
fn an_ipv6_only_agent_probes_no_ipv4_address() {
    let prober = prober_of(Families::Ipv6);
    let recorded = round_where(&prober, 1, |_, family, _| {
        assert_eq!(family, Family::Ipv6, "an IPv4 address was probed");
        (ok(5), ok(6))
    });
    assert_eq!(recorded, 8, "a's and c's four IPv6 paths");
    let status = prober.status();
    let (a, b) = (&status.nodes[0], &status.nodes[1]);
    assert_eq!(a.host.family, Family::Ipv6);
    assert!(a.reachable() && a.host_secondary.is_none());
    // b has no IPv6: shown with its IPv4 addresses, never probed.
    assert_eq!(b.state(), ProbeResult::Unknown);
    assert_eq!(b.host.icmp.probes, 0);
    assert!(
        b.host
            .icmp
            .warning
            .as_deref()
            .is_some_and(|w| w.contains("no ipv4")),
        "{:?}",
        b.host.icmp
    );
    assert_eq!(status.summary().unknown, 1);
}

#[test]
fn a_node_that_loses_its_ipv6_addresses_forgets_their_paths() {
    let prober = prober_of(Families::Dual);
    round_where(&prober, 1, |_, _, _| (refused(), refused()));
    assert_eq!(
        prober.status().nodes[0]
            .host_secondary
            .as_ref()
            .map(|c| c.icmp.result),
        Some(ProbeResult::Failure)
    );
    let mut nodes: Vec<Node> = mixed().to_vec();
    nodes[0].node_ip6 = None;
    nodes[0].health_ip6 = None;
    prober.set_nodes(NodeSet::new(nodes.clone()).expect("unique"));
    let a = &prober.status().nodes[0];
    assert!(a.host_secondary.is_none());
    assert_eq!(a.host.icmp.result, ProbeResult::Failure, "IPv4 kept");
    // Back with IPv6: its paths start over, Unknown.
    prober.set_nodes(mixed());
    let a = &prober.status().nodes[0];
    let v6 = a.host_secondary.as_deref().expect("IPv6 again");
    assert_eq!((v6.icmp.result, v6.icmp.probes), (ProbeResult::Unknown, 0));
    assert_eq!(
        prober.node_history("a").expect("a").paths[4].entries.len(),
        0
    );
    assert_eq!(path_index(Family::Ipv6, EP_HTTP), 7);
}

#[test]
fn rounds_are_kept_per_path_and_go_with_their_node() {
    let prober = Prober::new(ProbeConfig {
        history_length: 4,
        ..ProbeConfig::default()
    });
    prober.set_nodes(nodes(&["a", "b"]));
    for seq in 1..=6 {
        let failing = matches!(seq, 3 | 5).then_some("a");
        assert_eq!(round_with(&prober, seq, failing), 8);
    }
    let a = prober.node_history("a").expect("a is in the set");
    assert_eq!((a.node.as_str(), a.window), ("a", 4));
    let names: Vec<&str> = a.paths.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(names, history::PATH_NAMES);
    assert_eq!(a.paths.len(), 4, "an IPv4-only node: four paths");
    assert_eq!(a.paths[0].ip, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
    assert_eq!(a.paths[2].ip, IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1)));
    let host_http = &a.paths[HOST_HTTP];
    let seen: Vec<(u64, Option<&str>)> = host_http
        .entries
        .iter()
        .map(|e| (e.at_ms, e.error.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            (3007, Some("connect: refused")),
            (4007, None),
            (5007, Some("connect: refused")),
            (6007, None)
        ]
    );
    assert_eq!(host_http.loss_ratio, Some(0.5));
    assert_eq!(host_http.rtt_p50_ns, Some(4000));
    assert_eq!(host_http.rtt_p99_ns, Some(6000));
    assert_eq!(a.paths[HOST_ICMP].loss_ratio, Some(0.0));
    // The state saw the same results.
    let snapshot = prober.snapshot(None);
    assert_eq!(
        snapshot.nodes[0].host.http.last_error.as_deref(),
        Some("connect: Connection refused (os error 111)")
    );

    let strips = prober.history_strips();
    assert_eq!(strips.window, 4);
    let seqs: Vec<u64> = strips.rounds.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [3, 4, 5, 6]);
    assert_eq!(strips.rounds[0].started_ms, 3000);
    assert_eq!(strips.nodes[0].name, "a");
    assert_eq!(
        strips.nodes[0].paths,
        ["SSSS", "FSFS", "SSSS", "SSSS"].map(String::from)
    );
    assert_eq!(strips.nodes[1].paths[1], "SSSS");
    let stats = prober.history_stats();
    assert_eq!(stats.nodes[0].paths[HOST_HTTP].loss_ratio, Some(0.5));
    assert_eq!(stats.nodes[1].paths[HOST_HTTP].loss_ratio, Some(0.0));
    assert_eq!(stats.nodes[1].paths[HOST_HTTP].results, 4);

    assert!(prober.node_history("nobody").is_none());
    // A node that leaves takes its history along; back, it starts over.
    prober.set_nodes(nodes(&["b"]));
    assert!(prober.node_history("a").is_none());
    prober.set_nodes(nodes(&["a", "b"]));
    let again = prober.node_history("a").expect("back in the set");
    assert!(
        again.paths.iter().all(|p| p.entries.is_empty()),
        "{again:?}"
    );
    let strips = prober.history_strips();
    assert_eq!(strips.nodes[0].paths[0], "....");
    round_with(&prober, 7, None);
    assert_eq!(prober.history_strips().nodes[0].paths[0], "...S");
}

#[test]
fn a_reload_keeps_the_history_that_fits_the_new_length_and_the_rounds_to_come() {
    let old = Prober::new(ProbeConfig {
        history_length: 5,
        ..ProbeConfig::default()
    });
    old.set_nodes(nodes(&["a"]));
    for seq in 1..=5 {
        round_with(&old, seq, (seq == 4).then_some("a"));
    }
    let shorter = Prober::new(ProbeConfig {
        history_length: 3,
        ..ProbeConfig::default()
    });
    shorter.take_over(&old);
    let strips = shorter.history_strips();
    assert_eq!(strips.window, 3);
    assert_eq!(strips.nodes[0].paths[HOST_HTTP], "SFS");
    let longer = Prober::new(ProbeConfig {
        history_length: 8,
        ..ProbeConfig::default()
    });
    longer.take_over(&shorter);
    round_with(&longer, 6, Some("a"));
    let a = longer.node_history("a").expect("a");
    assert_eq!(a.window, 8);
    let at: Vec<u64> = a.paths[HOST_HTTP].entries.iter().map(|e| e.at_ms).collect();
    assert_eq!(at, [3007, 4007, 5007, 6007]);
    assert_eq!(a.paths[HOST_HTTP].loss_ratio, Some(0.5));
    // The same length: everything carried over.
    let same = Prober::new(ProbeConfig {
        history_length: 5,
        ..ProbeConfig::default()
    });
    old.paths
        .lock()
        .expect("lock")
        .get_mut("a")
        .expect("a")
        .join_rounds = 2;
    same.take_over(&old);
    assert_eq!(same.history_strips().nodes[0].paths[HOST_HTTP], "SSSFS");
    assert_eq!(
        same.paths.lock().expect("lock")["a"].join_rounds,
        2,
        "rounds of the nodes that joined to come, carried"
    );
    assert!(same.joining.load(std::sync::atomic::Ordering::Relaxed));
}

/// 10,000 nodes in the prober's map (16,384 slots with their names)
/// and 40,000 paths.
#[test]
fn a_node_and_a_path_are_small() {
    assert_eq!(size_of::<NodePaths>(), 64);
    assert_eq!(size_of::<super::super::targets::KeptPath>(), 152);
}

#[test]
fn a_node_holds_states_only_for_the_families_it_is_probed_over() {
    let mut p = NodePaths::default();
    assert_eq!(p.state(5), &PathRecord::UNKNOWN, "never probed");
    p.state_mut(1).mtu_failures = 1;
    assert_eq!(p.paths.len(), PER_FAMILY, "IPv4 only: 4 paths");
    p.state_mut(PER_FAMILY + 2).mtu_failures = 1;
    assert_eq!(p.paths.len(), MAX_PATHS, "both families");
    p.forget(Family::Ipv6);
    assert_eq!(p.paths.len(), PER_FAMILY, "IPv6 forgotten");
    assert_eq!(p.state(1).mtu_failures, 1, "IPv4 kept");
    p.forget(Family::Ipv4);
    assert_eq!(p.paths.len(), 0, "nothing probed any more");
    // The other way round: IPv4 forgotten first keeps IPv6's four
    // (and IPv4's, before them), then nothing.
    p.state_mut(1).mtu_failures = 1;
    p.state_mut(PER_FAMILY + 2).mtu_failures = 1;
    p.forget(Family::Ipv4);
    assert_eq!(p.paths.len(), MAX_PATHS, "IPv6 kept");
    assert_eq!(p.state(PER_FAMILY + 2).mtu_failures, 1);
    p.forget(Family::Ipv6);
    assert_eq!(p.paths.len(), 0, "both forgotten");
}

#[test]
fn a_node_set_that_gains_a_node_says_so_and_one_that_only_loses_does_not() {
    let prober = Prober::new(ProbeConfig::default());
    let mut joins = prober.joins();
    prober.set_nodes(nodes(&["a", "b"]));
    assert!(joins.has_changed().expect("open"), "a and b joined");
    joins.borrow_and_update();
    // The same set again (the sync's periodic run), then one fewer.
    prober.set_nodes(nodes(&["a", "b"]));
    prober.set_nodes(nodes(&["a"]));
    assert!(!joins.has_changed().expect("open"), "no one joined");
    // A node that left and came back joins again, as does a new one
    // beside a leave.
    prober.set_nodes(nodes(&["a", "b"]));
    assert!(joins.has_changed().expect("open"));
    joins.borrow_and_update();
    prober.set_nodes(nodes(&["a", "c"]));
    assert!(joins.has_changed().expect("open"));
    joins.borrow_and_update();
    // A record that changed (its health address came late, say).
    let mut changed: Vec<Node> = prober.nodes().to_vec();
    changed[1].health_ip = Some(Ipv4Addr::new(198, 19, 9, 9));
    prober.set_nodes(NodeSet::new(changed).expect("unique"));
    assert!(joins.has_changed().expect("open"));
}

#[test]
fn the_nodes_that_joined_are_those_no_round_recorded() {
    let prober = Prober::new(ProbeConfig::default());
    prober.set_nodes(nodes(&["b", "d"]));
    assert_eq!(prober.never_probed(&prober.nodes()), [0, 1]);
    round_with(&prober, 1, None);
    assert_eq!(prober.never_probed(&prober.nodes()), Vec::<usize>::new());
    prober.set_nodes(nodes(&["a", "b", "c", "d", "e"]));
    let set = prober.nodes();
    let never: Vec<&str> = prober
        .never_probed(&set)
        .into_iter()
        .map(|i| set[i].name.as_str())
        .collect();
    assert_eq!(never, ["a", "c", "e"]);
    // A node that left and came back starts again: never probed.
    prober.set_nodes(nodes(&["a", "c", "e"]));
    round_with(&prober, 2, None);
    prober.set_nodes(nodes(&["a", "b", "c", "e"]));
    assert_eq!(prober.never_probed(&prober.nodes()), [1]);
}

#[test]
fn the_nodes_that_joined_are_recorded_in_no_history_and_leave_the_round_published() {
    let prober = Prober::new(ProbeConfig::default());
    prober.set_nodes(nodes(&["a"]));
    round_with(&prober, 1, None);
    let published = Some(RoundInfo {
        seq: 1,
        started_ms: 1_000,
        duration_ms: 7,
        probes: 4,
    });
    prober.publish(published.clone(), false);
    prober.set_nodes(nodes(&["a", "b"]));
    let set = prober.nodes();
    let joined = set.subset(&prober.never_probed(&set));
    let t = targets(&joined, prober.cfg.families);
    let outcomes = vec![(ok(5), ok(5)); t.keys.len()];
    let recorded =
        prober.while_recording(|| prober.record_in(&joined, &t.keys, outcomes, None, 2_000));
    assert_eq!(recorded, 4, "b's four paths");
    prober.publish_round(None);
    // b is decided, shown, and counted; the round published is round 1.
    assert_eq!(prober.never_probed(&set), Vec::<usize>::new());
    let b = prober.status().node("b").cloned().expect("b");
    assert_eq!(b.host.icmp.result, ProbeResult::Success);
    assert_eq!(prober.status_summary().reachable, 2);
    assert_eq!(prober.status_summary().round, published);
    // The history holds round 1 alone, in which b was not probed.
    let strips = prober.history_strips();
    assert_eq!(strips.rounds.len(), 1);
    assert_eq!(strips.rounds[0].seq, 1);
    let b = strips
        .nodes
        .iter()
        .find(|n| n.name == "b")
        .expect("b's strips");
    assert!(b.paths.iter().all(|p| p == "."), "{b:?}");
    // No flags for the next round's order numbered by b alone.
    assert!(prober.failed.lock().expect("lock").is_none());
}

/// A round of the nodes that joined, as [`Prober::probe_joined`] runs
/// it, each probe's (ICMP, HTTP) outcomes from `outcome(node, to the
/// endpoint)`: the nodes it probed, and whether some have rounds to come.
fn joined_round(
    prober: &Prober,
    at: u64,
    outcome: impl Fn(&Node, bool) -> (Outcome, Outcome),
) -> (Vec<String>, bool) {
    let set = prober.nodes();
    let (picked, never) = prober.joined_now(&set);
    let these = set.subset(&picked);
    let t = targets(&these, prober.cfg.families);
    let outcomes: Vec<_> = (0..t.keys.len())
        .map(|i| outcome(&these[t.keys[i].0 as usize], t.kind(i).1))
        .collect();
    prober.while_recording(|| prober.record_in(&these, &t.keys, outcomes, None, at));
    let more = prober.after_joined(&set, &picked, &never);
    let names = these.iter().map(|n| n.name.clone()).collect();
    (names, more)
}

fn thresholds(success: u32, failure: u32) -> Arc<Prober> {
    Prober::new(ProbeConfig {
        thresholds: Thresholds { success, failure },
        ..ProbeConfig::default()
    })
}

#[test]
fn a_node_that_joined_is_probed_again_until_every_path_has_its_verdict() {
    // Three failures turn a path: three rounds to come after the first.
    let prober = thresholds(1, 3);
    assert_eq!(prober.follow_ups(), 3);
    prober.set_nodes(nodes(&["a"]));
    round_with(&prober, 1, None);
    prober.set_nodes(nodes(&["a", "b", "c"]));
    // b answers at once; c's endpoint is silent for good, and its node
    // address misses the first echo (a node just starting).
    let silent = |first: bool| {
        move |n: &Node, endpoint: bool| match (n.name.as_str(), endpoint) {
            ("c", true) => (refused(), refused()),
            ("c", false) if first => (refused(), ok(5)),
            _ => (ok(5), ok(5)),
        }
    };
    assert_eq!(
        joined_round(&prober, 2_000, silent(true)),
        (vec!["b".to_owned(), "c".to_owned()], true)
    );
    let state = |i| prober.paths.lock().expect("lock")["c"].state(i).result;
    assert_eq!(state(0), ProbeResult::Unknown, "one failure of three");
    // c alone, twice more: its node address answers, its endpoint's
    // paths fail their third time and are decided.
    assert_eq!(
        joined_round(&prober, 3_000, silent(false)),
        (vec!["c".to_owned()], true)
    );
    assert_eq!(state(0), ProbeResult::Success);
    assert_eq!(
        joined_round(&prober, 4_000, silent(false)),
        (vec!["c".to_owned()], false)
    );
    assert_eq!(state(2), ProbeResult::Failure);
    assert_eq!(joined_round(&prober, 5_000, silent(false)), (vec![], false));
    // A round of the whole set decides a node meanwhile: nothing to come.
    prober.set_nodes(nodes(&["a", "b", "c", "d"]));
    assert!(
        joined_round(&prober, 6_000, |n, _| if n.name == "d" {
            (refused(), refused())
        } else {
            (ok(5), ok(5))
        })
        .1
    );
    round_with(&prober, 2, None);
    assert_eq!(joined_round(&prober, 7_000, silent(false)), (vec![], false));
}

/// A reload between a round of the nodes that joined and that round's
/// bookkeeping: the node's rounds to come were set with its first
/// results, under the recording the take-over waits for, so the new
/// prober probes it again. A node first probed by a whole round has none.
#[test]
fn a_reload_right_after_a_round_of_nodes_that_joined_keeps_their_rounds_to_come() {
    let old = thresholds(1, 3);
    old.set_nodes(nodes(&["a"]));
    round_with(&old, 1, None);
    assert_eq!(old.paths.lock().expect("lock")["a"].join_rounds, 0);
    old.set_nodes(nodes(&["a", "b"]));
    let set = old.nodes();
    let (picked, _) = old.joined_now(&set);
    let these = set.subset(&picked);
    let t = targets(&these, old.cfg.families);
    let outcomes = (0..t.keys.len()).map(|_| (refused(), refused()));
    old.while_recording(|| old.record_in(&these, &t.keys, outcomes, None, 2_000));
    // The reload, before `after_joined` ran.
    let new = thresholds(1, 3);
    new.take_over(&old);
    assert_eq!(
        new.paths.lock().expect("lock")["b"].join_rounds,
        old.follow_ups()
    );
    let (picked, never) = new.joined_now(&new.nodes());
    assert_eq!((picked.len(), never.len()), (1, 0), "b, probed again");
}

/// A reload that lowers the failure threshold: a path two failures into
/// a run turns at the take-over under the new threshold of 1, not a
/// round later; one that raises the success threshold leaves a verdict
/// as it is.
#[test]
fn a_reload_judges_the_runs_it_carries_by_the_new_thresholds() {
    let old = thresholds(1, 3);
    old.set_nodes(nodes(&["a", "b"]));
    round_with(&old, 1, None);
    round_with(&old, 2, Some("a"));
    round_with(&old, 3, Some("a"));
    let state = |p: &Prober, n: &str, i| p.paths.lock().expect("lock")[n].state(i).clone();
    // Path 1 is a's node address over HTTP: two failures of three.
    let failing = state(&old, "a", 1);
    assert_eq!(
        (failing.result, failing.consecutive_failures),
        (ProbeResult::Success, 2)
    );
    let new = thresholds(5, 1);
    new.take_over(&old);
    assert_eq!(state(&new, "a", 1).result, ProbeResult::Failure);
    for (node, path) in [("a", 0), ("b", 1)] {
        assert_eq!(
            state(&new, node, path).result,
            ProbeResult::Success,
            "{node}'s path {path}: 3 successes of 5 leave the verdict"
        );
    }
}

#[test]
fn a_node_that_joined_and_stays_undecided_runs_out_of_rounds() {
    // Two of a kind turn a path: one that alternates never does.
    let prober = thresholds(2, 2);
    let rounds = prober.follow_ups();
    prober.set_nodes(nodes(&["a"]));
    let mut count = 0;
    for i in 0..10u64 {
        let outcome = if i % 2 == 0 { refused() } else { ok(5) };
        let (names, more) = joined_round(&prober, 1_000 * (i + 1), |_, _| {
            (outcome.clone(), outcome.clone())
        });
        count += names.len();
        if !more {
            break;
        }
    }
    assert_eq!(
        count,
        1 + usize::from(rounds),
        "the first round and its follow-ups"
    );
    assert_eq!(
        joined_round(&prober, 20_000, |_, _| (ok(5), ok(5))).0,
        Vec::<String>::new()
    );
}

/// A round of another kind takes the turn of the round of the nodes that
/// joined due: it says again that one is due, while some are to come.
#[tokio::test]
async fn a_round_of_another_kind_passes_on_the_rounds_of_nodes_that_joined() {
    let prober = Prober::new(ProbeConfig::default());
    let mut joins = prober.joins();
    prober.run_round().await;
    assert!(!joins.has_changed().expect("open"), "none to come");
    prober
        .joining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    prober.run_round().await;
    assert!(joins.has_changed().expect("open"), "some to come");
    joins.borrow_and_update();
    // Nothing left to probe: the round of the nodes that joined says so.
    assert_eq!(prober.probe_joined().await, 0);
    assert!(!prober.joining.load(std::sync::atomic::Ordering::Relaxed));
    prober.run_round().await;
    assert!(!joins.has_changed().expect("open"));
}

#[test]
fn a_node_is_undecided_while_some_path_of_a_family_it_is_probed_over_is() {
    let prober = prober_of(Families::Dual);
    // Every path answered: decided.
    round_where(&prober, 1, |_, _, _| (ok(5), ok(5)));
    let set = prober.nodes();
    let undecided = |p: &Prober| -> Vec<String> {
        let paths = p.paths.lock().expect("lock");
        set.iter()
            .filter(|n| {
                paths
                    .get(n.name.as_str())
                    .is_some_and(|path| path.undecided(n, p.cfg.families))
            })
            .map(|n| n.name.clone())
            .collect()
    };
    assert_eq!(undecided(&prober), Vec::<String>::new());
    // Three failures turn a path: a's IPv6 endpoint and c's (IPv6 only)
    // host path failing once leave them undecided; b, IPv4 only, is not
    // probed over IPv6.
    let slow = Prober::new(ProbeConfig {
        families: Families::Dual,
        thresholds: Thresholds {
            success: 1,
            failure: 3,
        },
        ..ProbeConfig::default()
    });
    slow.set_nodes(mixed());
    round_where(&slow, 1, |_, _, _| (ok(5), ok(5)));
    round_where(&slow, 2, |n, family, endpoint| {
        let fails = family == Family::Ipv6 && (n.name == "a") == endpoint;
        (ok(5), if fails { refused() } else { ok(5) })
    });
    assert_eq!(undecided(&slow), ["a", "c"]);
    // An agent of IPv4 alone: a's IPv6 paths, never recorded, read
    // Unknown, but a is not probed over IPv6 (c, not probed at all, has
    // no paths).
    let v4 = prober_of(Families::Ipv4);
    round_where(&v4, 1, |_, _, _| (refused(), refused()));
    assert_eq!(undecided(&v4), Vec::<String>::new());
}

/// A whole round, two flows a path, to a node whose addresses lead to a
/// hello server naming another node (a route to the wrong node): its
/// HTTP paths fail naming that node, on every flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(
    clippy::print_stderr,
    reason = "says why the test is skipped for a user who is not root"
)]
async fn a_round_fails_the_http_paths_of_an_address_another_node_answers() {
    // A round opens raw ICMP sockets before any probe.
    if let Err(e) = IcmpProber::new(None, Families::Ipv4)
        && e.kind() == std::io::ErrorKind::PermissionDenied
    {
        eprintln!("skipped: a raw ICMP socket needs root (cargo xtask test runs it)");
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move { crate::probe::hello::serve(listener, stop, "node-3").await }
    });
    let prober = Prober::new(ProbeConfig {
        families: Families::Ipv4,
        timeout: Duration::from_millis(800),
        http_port: port,
        flows: flows::FlowPlan::new(2, false),
        thresholds: Thresholds {
            success: 1,
            failure: 1,
        },
        ..ProbeConfig::default()
    });
    let loopback = Ipv4Addr::LOCALHOST;
    prober.set_nodes(NodeSet::new(vec![Node::v4("node-2", loopback, loopback)]).expect("unique"));
    let status = prober.run_round().await;
    let summary = prober.status();
    let node = &summary.nodes[0];
    for c in [&node.host, &node.endpoint] {
        assert_eq!(c.http.result, ProbeResult::Failure, "{status:?}");
        assert_eq!(
            c.http.last_error.as_deref(),
            Some("answered by node \"node-3\", not the node probed")
        );
    }
    stop.cancel();
}

/// A node's history read while a round is being recorded waits for the
/// round's end: the round is begun in the history before the node's
/// results are in, and read between the two it would lack a result of
/// the window's newest round.
#[test]
fn one_nodes_history_is_never_read_half_recorded() {
    let prober = thresholds(1, 1);
    prober.set_nodes(nodes(&["a"]));
    round_with(&prober, 1, None);
    let entries =
        |h: &history::NodeHistory| h.paths.iter().map(|p| p.entries.len()).collect::<Vec<_>>();
    assert_eq!(
        entries(&prober.node_history("a").expect("a")),
        [1; 4],
        "one round, every path"
    );
    let set = prober.nodes();
    let t = targets(&set, prober.cfg.families);
    let outcomes: Vec<_> = (0..t.keys.len()).map(|_| (ok(2), ok(2))).collect();
    std::thread::scope(|s| {
        let reader = prober.while_recording(|| {
            if let Ok(mut history) = prober.history.lock() {
                history.begin_round(2, 2_000, 2_007);
            }
            let reader = s.spawn(|| prober.node_history("a").expect("a"));
            std::thread::sleep(Duration::from_millis(150));
            assert!(!reader.is_finished(), "read while round 2 is half recorded");
            prober.record_in(&set, &t.keys, outcomes, Some((2, 2_000)), 2_007);
            reader
        });
        let h = reader.join().expect("reader");
        assert_eq!(entries(&h), [2; 4], "round 2 whole: {h:?}");
    });
}

/// A node whose address moves keeps no verdict of the old one: the
/// family's paths start Unknown, the node is probed at once as a new one
/// is, and a round that probed the old address records nothing of it.
#[test]
fn a_node_whose_address_moved_starts_its_paths_anew_and_is_probed_at_once() {
    let prober = thresholds(1, 3);
    prober.set_nodes(nodes(&["a", "b"]));
    round_with(&prober, 1, None);
    let reachable = |p: &Prober| {
        p.status()
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.host.icmp.result, n.endpoint.icmp.result))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        reachable(&prober),
        [
            ("a".to_owned(), ProbeResult::Success, ProbeResult::Success),
            ("b".to_owned(), ProbeResult::Success, ProbeResult::Success),
        ]
    );
    let old = prober.nodes();
    let mut moved: Vec<Node> = old.to_vec();
    moved[1].node_ip = Some(Ipv4Addr::new(198, 18, 9, 9));
    let moved = NodeSet::new(moved).expect("unique");
    // A round begun before the move, recorded after it.
    let t = targets(&old, prober.cfg.families);
    let outcomes: Vec<_> = (0..t.keys.len()).map(|_| (ok(2), ok(2))).collect();
    prober.set_nodes(moved.clone());
    prober.while_recording(|| prober.record(&old, &t.keys, outcomes, 2, 2_000, 2_007));
    assert_eq!(
        reachable(&prober),
        [
            ("a".to_owned(), ProbeResult::Success, ProbeResult::Success),
            ("b".to_owned(), ProbeResult::Unknown, ProbeResult::Unknown),
        ],
        "b's old address's results, old and new, are not the new one's"
    );
    let h = prober.node_history("b").expect("b");
    assert!(h.paths.iter().all(|p| p.entries.is_empty()), "{h:?}");
    let (picked, never) = prober.joined_now(&moved);
    assert_eq!((picked, never), (vec![1], vec![]), "b probed at once");
}

/// An MTU black hole is losses of the large echo in a row, each in a
/// round whose small echo answered: a round without a verdict breaks the
/// row; and a path that stops answering is counted down, not as an MTU
/// black hole.
#[test]
fn an_mtu_black_hole_is_losses_in_a_row_on_a_path_that_answers() {
    use crate::probe::icmp_round::{MtuOutcome, MtuTargets};
    let prober = thresholds(1, 2);
    prober.set_nodes(nodes(&["a"]));
    let set = prober.nodes();
    let t = targets(&set, prober.cfg.families);
    let mtu = MtuTargets::of(&t, Some(1_500));
    let mtu_round = |seq: u64, small_ok: bool, large: MtuOutcome| {
        round_where(&prober, seq, |_, _, _| {
            (if small_ok { ok(seq) } else { refused() }, ok(seq))
        });
        prober.record_mtu(&set, &t.keys, &mtu, &[large]);
        prober.publish(None, true);
        let s = prober.status();
        (
            s.nodes[0].host.icmp.mtu_blackhole.is_some(),
            crate::probe::status_counts::StatusCounts::of(&s).mtu_blackholes,
        )
    };
    assert_eq!(mtu_round(1, true, MtuOutcome::Lost), (false, 0), "one loss");
    assert_eq!(
        mtu_round(2, true, MtuOutcome::NotSent),
        (false, 0),
        "no verdict"
    );
    assert_eq!(
        mtu_round(3, true, MtuOutcome::Lost),
        (false, 0),
        "the row began again"
    );
    assert_eq!(
        mtu_round(4, true, MtuOutcome::Lost),
        (true, 1),
        "two in a row"
    );
    // The path fails: its flag stays, for when it answers, but it is
    // counted as down, not as an MTU black hole.
    mtu_round(5, false, MtuOutcome::NotSent);
    assert_eq!(mtu_round(6, false, MtuOutcome::NotSent), (true, 0));
}
