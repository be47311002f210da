//! The nodes' addresses: node i's IPv4 and IPv6 addresses, its health
//! CIDRs, and the nodes file that lists them.

use std::{
    fmt::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::IpNet;

use super::Family;

/// The nodes file's text listing the first `n` nodes: a `nodes:` line, then
/// three lines per node (`name`, `node-ip`, `health-cidr`).
#[must_use]
pub fn nodes_yaml(n: usize) -> String {
    nodes_yaml_for(n, Family::V4)
}

/// The nodes file's text listing the first `n` nodes with the addresses
/// of `family` (`node-ip6` and `health-cidr6` lines for IPv6).
#[must_use]
pub fn nodes_yaml_for(n: usize, family: Family) -> String {
    let mut yaml = String::from("nodes:\n");
    for i in 0..n {
        let _ = writeln!(yaml, "  - name: node-{}", i + 1);
        if family.has_v4() {
            let _ = write!(
                yaml,
                "    node-ip: {}\n    health-cidr: {}\n",
                node_ip(i),
                health_cidr(i)
            );
        }
        if family.has_v6() {
            let _ = write!(
                yaml,
                "    node-ip6: {}\n    health-cidr6: {}\n",
                node_ip6(i),
                health_cidr6(i)
            );
        }
    }
    yaml
}

/// Node `i`'s IPv6 address: `2001:2::11`, `::12`, ...
#[must_use]
pub fn node_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0x2001,
        2,
        0,
        0,
        0,
        0,
        0,
        0x11 + u16::try_from(i).expect("fewer than 200 nodes"),
    )
}

/// Node `i`'s IPv6 health CIDR: `2001:2:0:40::/64`, `2001:2:0:41::/64`, ...
#[must_use]
pub fn health_cidr6(i: usize) -> String {
    share(HEALTH_RANGE6, 64, i)
}

#[must_use]
pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        198,
        18,
        0,
        11 + u8::try_from(i).expect("fewer than 200 nodes"),
    )
}

/// The cluster's health range: every node's [`health_cidr`] is in it.
pub const HEALTH_RANGE: &str = "198.18.64.0/18";

/// The most nodes a cluster has: the health ranges hold 64 /24s and 64
/// /64s.
pub const MAX_NODES: usize = 64;

/// The cluster's IPv6 health range: every node's [`health_cidr6`] is in
/// it (64 nodes).
pub const HEALTH_RANGE6: &str = "2001:2:0:40::/58";

/// Node `i`'s IPv4 health CIDR: `198.18.64.0/24`, `198.18.65.0/24`, ...
#[must_use]
pub fn health_cidr(i: usize) -> String {
    share(HEALTH_RANGE, 24, i)
}

/// The `i`-th network of length `prefix` in `range` (either family).
fn share(range: &str, prefix: u8, i: usize) -> String {
    let range: IpNet = range.parse().expect("a health range");
    range
        .subnets(prefix)
        .expect("a longer prefix than the range's")
        .nth(i)
        .unwrap_or_else(|| panic!("{range} holds fewer than {} /{prefix}s", i + 1))
        .to_string()
}
