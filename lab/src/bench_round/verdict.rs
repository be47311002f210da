//! Whether the agent's verdicts are right: every answering peer's paths
//! OK and no silent one's, and why live paths failed when some did.

use health_agent::{
    probe::{path::ProbeResult, status::ClusterStatus},
    sys::netns::Netns,
};

use super::{
    peers::{peer_index, silent},
    topology::{counter, listen_overflows},
};

/// Why live paths failed: (path, error) with counts, most frequent first.
fn live_failures(status: &ClusterStatus, pct: u32) -> Vec<(String, usize)> {
    let mut tally: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for n in &status.nodes {
        let k = peer_index(&n.name);
        if silent(k, pct) {
            continue;
        }
        for (path, p) in [
            ("node ICMP", &n.host.icmp),
            ("node HTTP", &n.host.http),
            ("endpoint ICMP", &n.endpoint.icmp),
            ("endpoint HTTP", &n.endpoint.http),
        ] {
            if p.result != ProbeResult::Success {
                let why = p.last_error.as_deref().unwrap_or("never probed");
                *tally.entry(format!("{path}: {why}")).or_default() += 1;
            }
        }
    }
    let mut v: Vec<_> = tally.into_iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v
}

/// The most frequent reasons live paths failed in `status`, and whether the
/// peers' one server could queue every connection.
pub(super) fn print_live_failures(status: &ClusterStatus, pct: u32, peers: &Netns) {
    for (why, n) in live_failures(status, pct).iter().take(5) {
        println!("first round: {n} live paths not OK: {why}");
    }
    if let Some((overflows, drops)) = listen_overflows(peers) {
        println!("the peers' server: {overflows} listen overflows, {drops} listen drops");
    }
    // The one host that answers for every peer has one ICMP socket: a
    // reply it cannot queue (its send buffer full of replies waiting for
    // the network's thread) is an echo lost, which an agent rightly counts.
    if let Some(errors) = counter(peers, "/proc/thread-self/net/snmp", "Icmp:", "OutErrors") {
        println!("the peers' ICMP: {errors} replies not sent");
    }
}

/// Live paths that are OK, and silent paths that are (wrongly) OK.
pub(super) fn correctness(status: &ClusterStatus, pct: u32) -> (usize, usize) {
    let (mut live_ok, mut false_ok) = (0, 0);
    for n in &status.nodes {
        let k = peer_index(&n.name);
        let ok = [
            &n.host.icmp,
            &n.host.http,
            &n.endpoint.icmp,
            &n.endpoint.http,
        ]
        .iter()
        .filter(|p| p.result == ProbeResult::Success)
        .count();
        if silent(k, pct) {
            false_ok += ok;
        } else {
            live_ok += ok;
        }
    }
    (live_ok, false_ok)
}
