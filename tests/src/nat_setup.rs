//! The addresses and masquerade settings shared by the NAT test-run tests
//! and the datapath benchmark: node 198.18.0.11 masquerading its health
//! CIDR 198.18.64.0/24, health range 198.18.64.0/18.

use std::net::Ipv4Addr;

use health_common::nat::NatConfig;

/// The endpoint, and a second source in the same health CIDR.
pub const EP: Ipv4Addr = Ipv4Addr::new(198, 18, 64, 2);
pub const EP2: Ipv4Addr = Ipv4Addr::new(198, 18, 64, 3);
pub const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
/// Peers outside the health range (node IPs) and inside it.
pub const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 12);
pub const PEER2: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 13);
pub const PEER_HEALTH: Ipv4Addr = Ipv4Addr::new(198, 18, 65, 2);

/// Masquerade on, handing out `port_min..=port_max`.
#[must_use]
pub fn config(port_min: u16, port_max: u16) -> NatConfig {
    NatConfig {
        enabled: 1,
        node_ip: NODE.octets(),
        src_net: [198, 18, 64, 0],
        src_mask: [255, 255, 255, 0],
        exclude_net: [198, 18, 64, 0],
        exclude_mask: [255, 255, 192, 0],
        port_min,
        port_max,
    }
}
