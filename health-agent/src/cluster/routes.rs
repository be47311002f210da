//! Routed mode: every peer's health address is reachable through the peer's
//! node IP, so the agent keeps one `<health-ip>/32 via <node-ip>` route per
//! peer, and removes those of nodes that left.

use std::{collections::BTreeMap, net::Ipv4Addr};

use tracing::{info, warn};

use super::NodeSet;
use crate::{sys::netlink::in_netns, util::errors::chain};

#[derive(Debug, Default)]
pub struct PeerRoutes {
    /// health IP -> node IP, as installed.
    installed: BTreeMap<Ipv4Addr, Ipv4Addr>,
    /// Peers left without a route because their node IP is not on-link,
    /// as last reported (the warning is said again only when it changes).
    not_on_link: usize,
}

/// Whether `ip` lies in one of the node's connected networks.
fn on_link(ip: Ipv4Addr, connected: &[(Ipv4Addr, u8)]) -> bool {
    connected.iter().any(|(net, prefix)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0);
        u32::from(ip) & mask == u32::from(*net) & mask
    })
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
    /// missing or changed routes are (re)installed, whatever the agent
    /// believes it installed (the kernel flushes routes through an
    /// interface that goes down), and routes of departed peers removed.
    /// Blocking; failures are logged and retried on the next sync.
    pub fn apply(&mut self, desired: &BTreeMap<Ipv4Addr, Ipv4Addr>) {
        let desired = desired.clone();
        let installed_keys: Vec<Ipv4Addr> = self.installed.keys().copied().collect();
        let done = in_netns(None, |nl| async move {
            let table = nl.routes_v4().await?;
            let connected: Vec<(Ipv4Addr, u8)> = nl
                .addresses_v4()
                .await?
                .into_iter()
                .map(|(_, a, p)| (a, p))
                .collect();
            // A route via a node IP the node cannot reach directly would be
            // refused (routed L3 fabrics route the health CIDRs themselves).
            let mut desired = desired;
            let before = desired.len();
            desired.retain(|_, node| on_link(*node, &connected));
            let skipped = before - desired.len();
            let ours: Vec<Ipv4Addr> = installed_keys
                .into_iter()
                .filter(|h| !desired.contains_key(h))
                .collect();
            let mut added = Vec::new();
            let mut removed = Vec::new();
            for (health, node) in &desired {
                let present = table.iter().any(|r| {
                    r.destination == *health && r.prefix == 32 && r.gateway == Some(*node)
                });
                if present {
                    continue;
                }
                match nl.replace_route_via(*health, 32, *node).await {
                    Ok(()) => added.push(*health),
                    Err(e) => warn!("{}", chain(&e)),
                }
            }
            for health in ours {
                match nl.delete_route(health, 32).await {
                    Ok(()) => removed.push(health),
                    Err(e) => warn!("{}", chain(&e)),
                }
            }
            Ok((desired, added, removed, skipped))
        });
        match done {
            Ok((desired, added, removed, skipped)) => {
                if skipped != self.not_on_link {
                    if skipped > 0 {
                        warn!(
                            peers = skipped,
                            "peers whose node IP is not on-link get no per-peer route (the network must route their health IPs)"
                        );
                    }
                    self.not_on_link = skipped;
                }
                if !added.is_empty() || !removed.is_empty() {
                    info!(
                        added = added.len(),
                        removed = removed.len(),
                        "routes to peer endpoints updated"
                    );
                }
                for h in removed {
                    self.installed.remove(&h);
                }
                for h in added {
                    if let Some(n) = desired.get(&h) {
                        self.installed.insert(h, *n);
                    }
                }
            }
            Err(e) => warn!("updating routes to peer endpoints: {}", chain(&e)),
        }
    }

    /// Removes every route this agent installed (on shutdown).
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
