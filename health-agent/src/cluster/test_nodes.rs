//! Simulated nodes for the cluster's unit tests: node `i` at 198.18.0.0/16
//! plus `i`, its health address at 198.19.0.0/16 plus `i`, IPv4 only.

use std::net::Ipv4Addr;

use crate::membership::Node;

/// Node `i`, named `name`, in `zone`.
pub(crate) fn node(i: usize, name: String, zone: Option<String>) -> Node {
    let ip = u32::try_from(i).expect("below 65,536 nodes");
    Node {
        name,
        node_ip: Some(Ipv4Addr::from(0xc612_0000 + ip)),
        health_ip: Some(Ipv4Addr::from(0xc613_0000 + ip)),
        node_ip6: None,
        health_ip6: None,
        zone,
    }
}
