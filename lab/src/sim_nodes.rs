//! The simulated nodes the cluster benchmarks share: names as EC2 gives
//! them, addresses, zones and healthy RTTs, all reproducible from a node's
//! number.

use std::net::Ipv4Addr;

use health_agent::membership::Node;

/// splitmix64's finaliser: a well-mixed hash of `z`.
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Node `id`'s name, in EC2's form (`ip-` and a private address): a name
/// only, of the length a real cluster's names have; the node's addresses
/// are [`node`]'s.
pub(crate) fn name(id: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.eu-west-1.compute.internal",
        16 + id / 65_536,
        (id / 256) % 256,
        id % 256
    )
}

/// The most nodes: their node addresses fill 198.18.0.0/16, their health
/// addresses 198.19.0.0/16.
pub(crate) const MAX_NODES: usize = 65_536;

/// The first node address (198.18.0.0): node `id`'s is `id` after it.
pub(crate) const NODE_IP_BASE: u32 = 0xc612_0000;
/// The first health address (198.19.0.0).
const HEALTH_IP_BASE: u32 = 0xc613_0000;

/// Node `id` in zone number `zone`. Its addresses are only ever values in
/// this process, never on a wire.
///
/// # Panics
///
/// When `id` is [`MAX_NODES`] or more: its addresses would leave the
/// range, or be another node's. The benchmarks bound their sizes first.
pub(crate) fn node(id: usize, zone: usize) -> Node {
    assert!(
        id < MAX_NODES,
        "simulated node {id}: at most {MAX_NODES} nodes"
    );
    let ip = u32::try_from(id).unwrap_or(0);
    Node {
        name: name(id),
        node_ip: Some(Ipv4Addr::from(NODE_IP_BASE + ip)),
        health_ip: Some(Ipv4Addr::from(HEALTH_IP_BASE + ip)),
        node_ip6: None,
        health_ip6: None,
        zone: Some(format!("eu-west-1-rack-{zone:05}")),
    }
}

/// A healthy path's RTT in µs: ICMP 80-400, HTTP 300-3,000, by pair
/// (observer `o`, target `t`), path and round.
pub(crate) fn rtt_us(o: usize, t: usize, path: usize, round: u64) -> u64 {
    let h = mix64(((o as u64) << 32) ^ (t as u64) ^ ((path as u64) << 60) ^ (round << 40));
    if path.is_multiple_of(2) {
        80 + h % 320
    } else {
        300 + h % 2700
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_in_the_benchmarking_range_and_apart() {
        let (first, last) = (node(0, 0), node(MAX_NODES - 1, 0));
        assert_eq!(first.node_ip, Some(Ipv4Addr::new(198, 18, 0, 0)));
        assert_eq!(first.health_ip, Some(Ipv4Addr::new(198, 19, 0, 0)));
        assert_eq!(last.node_ip, Some(Ipv4Addr::new(198, 18, 255, 255)));
        assert_eq!(last.health_ip, Some(Ipv4Addr::new(198, 19, 255, 255)));
    }

    #[test]
    #[should_panic(expected = "at most 65536 nodes")]
    fn a_node_past_the_range_is_refused() {
        let _ = node(MAX_NODES, 0);
    }
}
