//! The cluster as this agent sees it: which nodes exist (discovery) and when
//! changes to that set are applied (the bounded-frequency sync runner).

pub mod discovery;
pub mod etcd;
pub mod nodes_file;
pub mod routes;
pub mod sync;

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// The node's own address: ICMP to its stack, HTTP to its agent.
    pub node_ip: Ipv4Addr,
    /// The address of the node's health endpoint.
    pub health_ip: Ipv4Addr,
}

/// A set of nodes, sorted by name, names unique.
pub type NodeSet = Vec<Node>;
