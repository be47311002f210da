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

/// Node `id`'s name: as EC2 names them (10.16.0.0/12, one address each).
pub(crate) fn name(id: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.eu-west-1.compute.internal",
        16 + id / 65_536,
        (id / 256) % 256,
        id % 256
    )
}

/// Node `id` in zone number `zone`.
pub(crate) fn node(id: usize, zone: usize) -> Node {
    let ip = u32::try_from(id).unwrap_or(u32::MAX);
    Node {
        name: name(id),
        node_ip: Some(Ipv4Addr::from(0x0a10_0000_u32.wrapping_add(ip))),
        health_ip: Some(Ipv4Addr::from(0x6440_0000_u32.wrapping_add(ip))),
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
