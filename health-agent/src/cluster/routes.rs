//! Routed mode: every peer's health address is reachable through the peer's
//! node IP, so the agent keeps one `<health-ip>/32 via <node-ip>` route per
//! peer whose node IP is on-link, and removes those of nodes that left.
//!
//! The routes carry the agent's own route protocol number
//! ([`ROUTE_PROTOCOL`], `ip route` shows `proto 201`): a route to a peer's
//! health IP that someone else installed is never replaced or deleted, and
//! routes of the agent's left by an earlier run (after `kill -9`) are found
//! by their protocol and removed at the first sync.

use std::{collections::BTreeMap, net::Ipv4Addr};

use tracing::{info, warn};

use super::NodeSet;
use crate::{sys::netlink::in_netns, util::errors::chain};

/// The `rtm_protocol` of the agent's routes (unassigned in iproute2's
/// `rt_protos`).
pub const ROUTE_PROTOCOL: u8 = 201;

#[derive(Debug, Default)]
pub struct PeerRoutes {
    /// Peers left without a route because their node IP is not on-link,
    /// as last reported (the warning is said again only when it changes).
    not_on_link: usize,
    /// Peers whose health IP already has a route the agent did not
    /// install, as last reported.
    foreign: usize,
}

/// Whether `ip` lies in one of the node's connected networks.
fn on_link(ip: Ipv4Addr, connected: &[(Ipv4Addr, u8)]) -> bool {
    connected.iter().any(|(net, prefix)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0);
        u32::from(ip) & mask == u32::from(*net) & mask
    })
}

/// What one sync did.
#[derive(Debug, Default)]
struct Applied {
    added: usize,
    removed: usize,
    not_on_link: usize,
    foreign: usize,
}

impl PeerRoutes {
    /// The routes `nodes` calls for: all but this node's own (by name, or by
    /// its endpoint's address).
    #[must_use]
    pub fn desired(
        nodes: &NodeSet,
        local_name: Option<&str>,
        local_health_ip: Ipv4Addr,
    ) -> BTreeMap<Ipv4Addr, Ipv4Addr> {
        nodes
            .iter()
            .filter(|n| Some(n.name.as_str()) != local_name && n.health_ip != local_health_ip)
            .map(|n| (n.health_ip, n.node_ip))
            .collect()
    }

    /// Makes the kernel's routes match `desired`, in one netlink session:
    /// missing or changed routes of the agent's are (re)installed (the
    /// kernel flushes routes through an interface that goes down), and
    /// every route of the agent's protocol that is not desired is removed.
    /// Blocking; failures are logged and retried on the next sync.
    pub fn apply(&mut self, desired: &BTreeMap<Ipv4Addr, Ipv4Addr>) {
        let desired = desired.clone();
        let done = in_netns(None, |nl| async move {
            let table = nl.routes_v4().await?;
            let connected: Vec<(Ipv4Addr, u8)> = nl
                .addresses_v4()
                .await?
                .into_iter()
                .map(|(_, a, p)| (a, p))
                .collect();
            let mut applied = Applied::default();
            for (health, node) in &desired {
                // A route via a node IP the node cannot reach directly would
                // be refused (routed L3 fabrics route health CIDRs themselves).
                if !on_link(*node, &connected) {
                    applied.not_on_link += 1;
                    continue;
                }
                let existing = table
                    .iter()
                    .find(|r| r.destination == *health && r.prefix == 32);
                match existing {
                    Some(r) if r.protocol != ROUTE_PROTOCOL => {
                        applied.foreign += 1;
                        continue;
                    }
                    Some(r) if r.gateway == Some(*node) => continue,
                    _ => {}
                }
                match nl
                    .replace_route_owned(*health, 32, *node, ROUTE_PROTOCOL)
                    .await
                {
                    Ok(()) => applied.added += 1,
                    Err(e) => warn!("{}", chain(&e)),
                }
            }
            let stale = table.iter().filter(|r| {
                r.protocol == ROUTE_PROTOCOL
                    && r.prefix == 32
                    && !desired
                        .get(&r.destination)
                        .is_some_and(|node| on_link(*node, &connected))
            });
            for r in stale {
                match nl
                    .delete_route_owned(r.destination, 32, ROUTE_PROTOCOL)
                    .await
                {
                    Ok(()) => applied.removed += 1,
                    Err(e) => warn!("{}", chain(&e)),
                }
            }
            Ok(applied)
        });
        match done {
            Ok(a) => {
                if a.added > 0 || a.removed > 0 {
                    info!(
                        added = a.added,
                        removed = a.removed,
                        "routes to peer endpoints updated"
                    );
                }
                if a.not_on_link != self.not_on_link && a.not_on_link > 0 {
                    warn!(
                        peers = a.not_on_link,
                        "peers whose node IP is not on-link get no per-peer route (the network must route their health IPs)"
                    );
                }
                if a.foreign != self.foreign && a.foreign > 0 {
                    warn!(
                        peers = a.foreign,
                        "peers whose health IP already has a route the agent did not install: left as it is"
                    );
                }
                self.not_on_link = a.not_on_link;
                self.foreign = a.foreign;
            }
            Err(e) => warn!("updating routes to peer endpoints: {}", chain(&e)),
        }
    }

    /// Removes every route of the agent's (on shutdown).
    pub fn clear(&mut self) {
        self.apply(&BTreeMap::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Node;

    fn node(name: &str, n: u8) -> Node {
        Node {
            name: name.into(),
            node_ip: Ipv4Addr::new(198, 18, 0, n),
            health_ip: Ipv4Addr::new(198, 18, 64 + n, 2),
            zone: None,
        }
    }

    #[test]
    fn on_link_means_inside_a_connected_network() {
        let connected = [
            (Ipv4Addr::new(198, 18, 0, 10), 24),
            (Ipv4Addr::new(198, 19, 1, 1), 32),
        ];
        assert!(on_link(Ipv4Addr::new(198, 18, 0, 77), &connected));
        assert!(!on_link(Ipv4Addr::new(198, 18, 1, 77), &connected));
        assert!(on_link(Ipv4Addr::new(198, 19, 1, 1), &connected));
        assert!(!on_link(Ipv4Addr::new(198, 19, 1, 2), &connected));
        assert!(on_link(
            Ipv4Addr::new(198, 19, 1, 2),
            &[(Ipv4Addr::UNSPECIFIED, 0)]
        ));
    }

    #[test]
    fn desired_routes_skip_the_local_node() {
        let nodes = NodeSet::new(vec![node("a", 1), node("b", 2), node("c", 3)]).expect("unique");
        let by_name = PeerRoutes::desired(&nodes, Some("a"), Ipv4Addr::UNSPECIFIED);
        assert_eq!(by_name.len(), 2);
        assert_eq!(
            by_name.get(&Ipv4Addr::new(198, 18, 66, 2)),
            Some(&Ipv4Addr::new(198, 18, 0, 2))
        );
        let by_ip = PeerRoutes::desired(&nodes, None, Ipv4Addr::new(198, 18, 67, 2));
        assert!(!by_ip.contains_key(&Ipv4Addr::new(198, 18, 67, 2)));
        assert_eq!(by_ip.len(), 2);
    }
}
