//! The run's peers by number: the `k`-th peer's name and addresses, and
//! which of them are silent.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Probes a peer takes a round: ICMP and HTTP to its node and health
/// addresses.
pub(crate) const PROBES_A_PEER: u32 = 4;

/// The most peers: the node IPs' and the health IPs' /17s hold 32,768
/// each.
pub(super) const MAX_PEERS: usize = 32_000;

/// The `k`-th peer's node and health IPs.
pub(super) fn peer_ips(k: usize) -> (Ipv4Addr, Ipv4Addr) {
    let k = u32::try_from(k).unwrap_or(u32::MAX);
    (
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + k),
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + k),
    )
}

/// The answering peers' node and health IPs as the fewest prefixes: the
/// peers namespace makes them local by route (a real peer holds its own
/// address, not thousands: held as interface addresses, each answer's
/// source check walked one hash chain of thousands of them).
pub(super) fn answering(n: usize, pct: u32) -> Vec<Ipv4Net> {
    let hosts: Vec<Ipv4Net> = (0..n)
        .filter(|k| !silent(*k, pct))
        .flat_map(|k| {
            let (node, health) = peer_ips(k);
            [node, health].map(Ipv4Net::from)
        })
        .collect();
    Ipv4Net::aggregate(&hosts)
}

/// Whether the `k`-th peer is silent: `pct` percent of them, spread out.
pub(super) const fn silent(k: usize, pct: u32) -> bool {
    (k % 100) < pct as usize
}

/// The `k`-th peer's name.
pub(super) fn peer_name(k: usize) -> String {
    format!("peer-{k:05}")
}

/// The index `k` of the node `peer-k` (`usize::MAX` for a name that is
/// not `peer-` and a number).
pub(super) fn peer_index(name: &str) -> usize {
    name.strip_prefix("peer-")
        .and_then(|k| k.parse().ok())
        .unwrap_or(usize::MAX)
}

/// The paths of the answering ones among `peers` peers, `pct` % silent.
pub(super) fn live_paths(peers: usize, pct: u32) -> usize {
    PROBES_A_PEER as usize * (0..peers).filter(|k| !silent(*k, pct)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_prefixes_cover_the_answering_peers_and_no_silent_one() {
        let nets = answering(1_000, 50);
        let held = |ip: Ipv4Addr| nets.iter().any(|n| n.contains(&ip));
        for k in 0..1_100 {
            let (node, health) = peer_ips(k);
            let answers = k < 1_000 && !silent(k, 50);
            assert_eq!((held(node), held(health)), (answers, answers), "peer {k}");
        }
        // Runs of 50 addresses: a few prefixes each, not one per address
        // (1,000 addresses held).
        assert!(nets.len() <= 100, "{} prefixes", nets.len());
    }
}
