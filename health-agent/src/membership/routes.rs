//! Routed mode: every peer's health address is reachable through the peer's
//! node IP, so the agent keeps one `<health-ip>/32 via <node-ip>` route (and
//! `<health-ip6>/128 via <node-ip6>` for IPv6) per peer whose node IP is
//! on-link, and removes those of nodes that left.
//!
//! The routes carry the agent's own route protocol number
//! ([`ROUTE_PROTOCOL`], `ip route` shows `proto 201`): a route to a peer's
//! health IP that someone else installed is never replaced or deleted, and
//! routes of the agent's left by an earlier run (after `kill -9`) are found
//! by their protocol and removed at the first sync.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::NodeSet;
use crate::{
    sys::netlink::{Netlink, NetlinkError, RouteWrite, in_netns},
    util::errors::chain,
};

/// The `rtm_protocol` of the agent's routes (unassigned in iproute2's
/// `rt_protos`).
pub const ROUTE_PROTOCOL: u8 = 201;

/// The main routing table.
const MAIN_TABLE: u32 = 254;

#[derive(Debug, Default)]
pub struct PeerRoutes {
    /// Peers left without a route because their node IP is not on-link,
    /// as last reported (the warning is said again only when it changes).
    not_on_link: usize,
    /// Peers whose health IP already has a route the agent did not
    /// install, as last reported.
    foreign: usize,
    /// Peers refused a route, as last reported.
    refused: usize,
    /// Routes the kernel would not make, as last reported.
    failed: usize,
}

/// A peer's health address and how it is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRoute {
    /// The peer's node address: the route's gateway.
    pub via: IpAddr,
    /// The peer's name, for what is reported.
    pub node: String,
}

/// What bounds the routes the agent makes: the cluster's health ranges,
/// and addresses that are never routed elsewhere (the etcd endpoints).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteBounds {
    /// `--health-range`: IPv4 health addresses are routed only inside it.
    pub range: Option<Ipv4Net>,
    /// `--health-range6`, likewise for IPv6.
    pub range6: Option<Ipv6Net>,
    /// Addresses the agent depends on (the etcd endpoints): never routed.
    pub protected: Vec<IpAddr>,
    /// With encryption on (`--encryption wireguard`), the WireGuard
    /// device: health addresses are routed into it (`dev wg0`, no
    /// gateway), whether or not the peer's node IP is on-link.
    pub tunnel: Option<String>,
}

/// A peer's health address the agent refused to route, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedRoute {
    pub node: String,
    pub address: IpAddr,
    pub reason: String,
}

/// Whether `ip` lies in one of the node's connected networks (of its
/// family), and which.
fn connected_net(ip: IpAddr, connected: &[(IpAddr, u8)]) -> Option<(IpAddr, u8)> {
    connected
        .iter()
        .copied()
        .find(|(net, prefix)| covers(*net, *prefix, ip))
}

fn on_link(ip: IpAddr, connected: &[(IpAddr, u8)]) -> bool {
    connected_net(ip, connected).is_some()
}

/// Whether `net/prefix` holds `ip` (of the same family).
fn covers(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    net.is_ipv4() == ip.is_ipv4() && masked(net, prefix) == masked(ip, prefix)
}

/// `ip` with the bits past `prefix` cleared (none past its family's
/// length).
fn masked(ip: IpAddr, prefix: u8) -> IpAddr {
    let past = |bits: u32| bits.saturating_sub(u32::from(prefix));
    match ip {
        IpAddr::V4(ip) => {
            let mask = u32::MAX.checked_shl(past(32)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from_bits(ip.to_bits() & mask))
        }
        IpAddr::V6(ip) => {
            let mask = u128::MAX.checked_shl(past(128)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from_bits(ip.to_bits() & mask))
        }
    }
}

/// What one sync did.
#[derive(Debug, Default)]
struct Applied {
    added: usize,
    removed: usize,
    /// Routes the kernel refused to add or remove.
    failed: usize,
    /// The first such refusal.
    first_failure: Option<String>,
    not_on_link: usize,
    foreign: usize,
    refused: Vec<RefusedRoute>,
}

impl Applied {
    fn fail(&mut self, e: &NetlinkError) {
        self.failed += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some(chain(e));
        }
    }
}

/// What one sync left.
#[derive(Debug, Default)]
pub struct Synced {
    /// The health addresses the bounds refused a route.
    pub refused: Vec<RefusedRoute>,
    /// Some route could not be added or removed, or the table could not
    /// be read: the kernel announces a link that comes up before it puts
    /// back the link's connected routes, so a sync at that moment finds
    /// its gateways unreachable and must run again.
    pub failed: bool,
}

/// A route in the main table, either family.
#[derive(Debug, Clone, Copy)]
struct TableRoute {
    destination: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
    /// The interface it leaves through.
    oif: Option<u32>,
    protocol: u8,
}

impl TableRoute {
    const fn is_host(&self) -> bool {
        self.prefix == if self.destination.is_ipv4() { 32 } else { 128 }
    }
}

/// The node's routes and addresses, as a sync checks them, indexed so
/// that each desired route is judged in constant time (a sync at 50,000
/// peers judges 50,000 routes against as many in the table).
struct Table {
    routes: Vec<TableRoute>,
    connected: Vec<(IpAddr, u8)>,
    /// The default routes' gateways.
    gateways: HashSet<IpAddr>,
    /// The first host route to each destination.
    hosts: HashMap<IpAddr, TableRoute>,
    /// The destinations of routes the agent did not make, by prefix
    /// length (a handful of lengths).
    foreign: BTreeMap<u8, HashSet<IpAddr>>,
}

impl Table {
    fn new(routes: Vec<TableRoute>, connected: Vec<(IpAddr, u8)>) -> Self {
        let mut hosts = HashMap::with_capacity(routes.len());
        let mut foreign: BTreeMap<u8, HashSet<IpAddr>> = BTreeMap::new();
        let mut gateways = HashSet::new();
        for r in &routes {
            if r.is_host() {
                hosts.entry(r.destination).or_insert(*r);
            }
            if r.protocol != ROUTE_PROTOCOL {
                foreign
                    .entry(r.prefix)
                    .or_default()
                    .insert(masked(r.destination, r.prefix));
            }
            if let (0, Some(gw)) = (r.prefix, r.gateway) {
                gateways.insert(gw);
            }
        }
        Self {
            routes,
            connected,
            gateways,
            hosts,
            foreign,
        }
    }

    /// Whether a route the agent did not make, `at_least` as specific,
    /// covers `ip`.
    fn foreign_covers(&self, ip: IpAddr, at_least: u8) -> bool {
        self.foreign
            .range(at_least..)
            .any(|(&prefix, nets)| nets.contains(&masked(ip, prefix)))
    }
}

/// The main table's routes and the node's connected networks, both
/// families.
async fn read_table(nl: &Netlink) -> Result<Table, NetlinkError> {
    let mut routes: Vec<TableRoute> = nl
        .routes::<Ipv4Addr>()
        .await?
        .into_iter()
        .map(|r| TableRoute {
            destination: r.destination.into(),
            prefix: r.prefix,
            gateway: r.gateway.map(IpAddr::V4),
            oif: r.oif,
            protocol: r.protocol,
        })
        .collect();
    routes.extend(
        nl.routes::<Ipv6Addr>()
            .await?
            .into_iter()
            .filter(|r| r.table == MAIN_TABLE)
            .map(|r| TableRoute {
                destination: r.destination.into(),
                prefix: r.prefix,
                gateway: r.gateway.map(IpAddr::V6),
                oif: r.oif,
                protocol: r.protocol,
            }),
    );
    let mut connected: Vec<(IpAddr, u8)> = nl
        .addresses::<Ipv4Addr>()
        .await?
        .into_iter()
        .map(|(_, a, p)| (a.into(), p))
        .collect();
    connected.extend(
        nl.addresses::<Ipv6Addr>()
            .await?
            .into_iter()
            .filter(|(_, a, _)| !is_link_local(*a))
            .map(|(_, a, p)| (a.into(), p)),
    );
    Ok(Table::new(routes, connected))
}

const fn is_link_local(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

impl RouteBounds {
    /// Why `health` must not be routed through a peer, if it must not:
    /// outside the range, inside a connected network, an etcd endpoint or
    /// a default gateway.
    fn refuse(&self, health: IpAddr, table: &Table) -> Option<String> {
        match (health, self.range, self.range6) {
            (IpAddr::V4(_), None, _) => {
                return Some(
                    "no --health-range: the agent routes only inside the cluster's health range"
                        .into(),
                );
            }
            (IpAddr::V6(_), _, None) => {
                return Some(
                    "no --health-range6: the agent routes only inside the cluster's health range"
                        .into(),
                );
            }
            (IpAddr::V4(ip), Some(r), _) if !r.contains(&ip) => {
                return Some(format!("outside the health range {r} (--health-range)"));
            }
            (IpAddr::V6(ip), _, Some(r)) if !r.contains(&ip) => {
                return Some(format!("outside the health range {r} (--health-range6)"));
            }
            _ => {}
        }
        if let Some((net, prefix)) = connected_net(health, &table.connected) {
            return Some(format!(
                "inside this node's connected network {net}/{prefix}"
            ));
        }
        // Compared canonical: an endpoint written as a mapped IPv6
        // address (`[::ffff:a.b.c.d]`) is the IPv4 address a record names.
        if self
            .protected
            .iter()
            .any(|p| p.to_canonical() == health.to_canonical())
        {
            return Some("an etcd endpoint of this agent".into());
        }
        table
            .gateways
            .contains(&health)
            .then(|| "this node's default gateway".into())
    }

    /// The prefix length of the range of `ip`'s family.
    fn range_prefix(&self, ip: IpAddr) -> u8 {
        match ip {
            IpAddr::V4(_) => self.range.map_or(32, |r| r.prefix_len()),
            IpAddr::V6(_) => self.range6.map_or(128, |r| r.prefix_len()),
        }
    }
}

async fn install(
    nl: &Netlink,
    health: IpAddr,
    node: IpAddr,
    write: RouteWrite,
) -> Result<(), NetlinkError> {
    let prefix = if health.is_ipv4() { 32 } else { 128 };
    nl.write_route_owned(health, prefix, node, (ROUTE_PROTOCOL, write))
        .await
}

/// `health` routed into the WireGuard device `dev` (marked as the
/// agent's): WireGuard picks the peer by its AllowedIPs.
async fn install_into(
    nl: &Netlink,
    health: IpAddr,
    dev: &str,
    write: RouteWrite,
) -> Result<(), NetlinkError> {
    let prefix = if health.is_ipv4() { 32 } else { 128 };
    nl.write_route_dev_owned(health, prefix, dev, (ROUTE_PROTOCOL, write))
        .await
}

async fn remove(nl: &Netlink, destination: IpAddr) -> Result<(), NetlinkError> {
    let prefix = if destination.is_ipv4() { 32 } else { 128 };
    nl.delete_route_owned(destination, prefix, ROUTE_PROTOCOL)
        .await
}

impl PeerRoutes {
    /// The routes `nodes` calls for, health address to node address in
    /// each family a peer has: all but this node's own (by name, or by its
    /// endpoint's addresses `local_health`).
    #[must_use]
    pub fn desired(
        nodes: &NodeSet,
        local_name: Option<&str>,
        local_health: &[IpAddr],
    ) -> BTreeMap<IpAddr, PeerRoute> {
        nodes
            .iter()
            .filter(|n| Some(n.name.as_str()) != local_name)
            .flat_map(|n| {
                let route = |via: IpAddr| PeerRoute {
                    via,
                    node: n.name.clone(),
                };
                [
                    n.health_ip
                        .zip(n.node_ip)
                        .map(|(h, v)| (IpAddr::V4(h), route(IpAddr::V4(v)))),
                    n.health_ip6
                        .zip(n.node_ip6)
                        .map(|(h, v)| (IpAddr::V6(h), route(IpAddr::V6(v)))),
                ]
            })
            .flatten()
            .filter(|(health, _)| !local_health.contains(health))
            .collect()
    }

    /// Makes the kernel's routes match `desired` within `bounds`, in one
    /// netlink session: missing or changed routes of the agent's are
    /// (re)installed (the kernel flushes routes through an interface that
    /// goes down), and every route of the agent's protocol that is not
    /// desired is removed. A health address the bounds refuse gets no
    /// route; one the node already reaches through a route the agent did
    /// not make, at least as specific as the health range, is left to it.
    /// Blocking; failures are logged, and [`Synced::failed`] asks for the
    /// sync to be run again soon.
    pub fn apply(&mut self, desired: &BTreeMap<IpAddr, PeerRoute>, bounds: &RouteBounds) -> Synced {
        let desired = desired.clone();
        let bounds = bounds.clone();
        let done = in_netns(None, |nl| async move {
            let table = read_table(&nl).await?;
            // The tunnel's index: a route of the agent's into another
            // device (made by an earlier run, or before the node's only
            // device changed) is made again. Not found, every route into
            // it is made again, and fails naming it.
            let tunnel = match &bounds.tunnel {
                Some(dev) => nl.link_index(dev).await.unwrap_or_else(|e| {
                    warn!(
                        "routes: looking up the encryption device {dev:?}: {}",
                        chain(&e)
                    );
                    None
                }),
                None => None,
            };
            let mut applied = Applied::default();
            let mut routed: BTreeMap<IpAddr, IpAddr> = BTreeMap::new();
            for (health, peer) in &desired {
                if let Some(reason) = bounds.refuse(*health, &table) {
                    applied.refused.push(RefusedRoute {
                        node: peer.node.clone(),
                        address: *health,
                        reason,
                    });
                    continue;
                }
                // A route via a node IP the node cannot reach directly would
                // be refused (routed L3 fabrics route health CIDRs themselves).
                if bounds.tunnel.is_none() && !on_link(peer.via, &table.connected) {
                    applied.not_on_link += 1;
                    continue;
                }
                if table.foreign_covers(*health, bounds.range_prefix(*health)) {
                    applied.foreign += 1;
                    continue;
                }
                routed.insert(*health, peer.via);
                let current = table.hosts.get(health);
                let done = match &bounds.tunnel {
                    // Into the tunnel: ours, without a gateway, through it.
                    Some(_) => current.is_some_and(|r| {
                        r.gateway.is_none()
                            && r.protocol == ROUTE_PROTOCOL
                            && tunnel.is_some_and(|i| r.oif == Some(i))
                    }),
                    None => current.is_some_and(|r| r.gateway == Some(peer.via)),
                };
                if done {
                    continue;
                }
                // A host route read is the agent's (another's is foreign,
                // above): replaced. None read: added never over one made
                // since by someone else.
                let write = if current.is_some() {
                    RouteWrite::Replace
                } else {
                    RouteWrite::New
                };
                let made = match &bounds.tunnel {
                    Some(dev) => install_into(&nl, *health, dev, write).await,
                    None => install(&nl, *health, peer.via, write).await,
                };
                // Refused as existing (someone made one since the read, or
                // the read missed one): a failure, so that the sync runs
                // again within a second and reads what is there.
                match made {
                    Ok(()) => applied.added += 1,
                    Err(e) => applied.fail(&e),
                }
            }
            let stale = table.routes.iter().filter(|r| {
                r.protocol == ROUTE_PROTOCOL && r.is_host() && !routed.contains_key(&r.destination)
            });
            for r in stale {
                match remove(&nl, r.destination).await {
                    Ok(()) => applied.removed += 1,
                    Err(e) => applied.fail(&e),
                }
            }
            Ok(applied)
        });
        match done {
            Ok(mut a) => {
                self.report(&a);
                Synced {
                    refused: std::mem::take(&mut a.refused),
                    failed: a.failed > 0,
                }
            }
            Err(e) => {
                warn!("updating routes to peer endpoints: {}", chain(&e));
                Synced {
                    refused: Vec::new(),
                    failed: true,
                }
            }
        }
    }

    /// Logs what a sync did; the warnings only when their counts change.
    fn report(&mut self, a: &Applied) {
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
                "peer addresses whose node IP is not on-link get no per-peer route (the network must route their health IPs)"
            );
        }
        if a.foreign != self.foreign && a.foreign > 0 {
            warn!(
                peers = a.foreign,
                "peer addresses the node already reaches through a route the agent did not install: left as they are"
            );
        }
        if a.refused.len() != self.refused && !a.refused.is_empty() {
            let first = &a.refused[0];
            warn!(
                peers = a.refused.len(),
                "peer health addresses refused a route (GET /v1/nodes lists them); first: node {:?} {}: {}",
                first.node,
                first.address,
                first.reason
            );
        }
        if let Some(first) = a.first_failure.as_ref().filter(|_| a.failed != self.failed) {
            warn!(
                routes = a.failed,
                "routes to peer endpoints not made (retried); first: {first}"
            );
        }
        self.not_on_link = a.not_on_link;
        self.failed = a.failed;
        self.foreign = a.foreign;
        self.refused = a.refused.len();
    }

    /// Removes every route of the agent's (on shutdown).
    pub fn clear(&mut self) {
        self.apply(&BTreeMap::new(), &RouteBounds::default());
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::membership::Node;

    fn node(name: &str, n: u8) -> Node {
        Node {
            name: name.into(),
            node_ip: Some(Ipv4Addr::new(198, 18, 0, n)),
            health_ip: Some(Ipv4Addr::new(198, 18, 64 + n, 2)),
            node_ip6: None,
            health_ip6: None,
            zone: None,
        }
    }

    /// The table's index answers as a scan of every route would: which
    /// routes the agent did not make cover an address at least as
    /// specifically as asked, the host route to it, and whether it is a
    /// default gateway; both families, every prefix length.
    #[test]
    fn the_tables_index_answers_as_a_scan_of_its_routes() {
        let ip = |s: &str| -> IpAddr { s.parse().expect(s) };
        let route = |d: &str, prefix, gateway: Option<&str>, protocol| TableRoute {
            destination: ip(d),
            prefix,
            gateway: gateway.map(ip),
            oif: None,
            protocol,
        };
        let mut routes = vec![
            route("0.0.0.0", 0, Some("198.18.0.1"), 4),
            route("::", 0, Some("2001:2::1"), 4),
            route("198.18.64.0", 24, None, 2),
            route("198.18.65.7", 32, Some("198.18.0.9"), 4),
            route("198.18.65.7", 32, Some("198.18.0.8"), 4),
            route("2001:2:0:40::", 64, None, 2),
            route("2001:2:0:41::7", 128, Some("2001:2::9"), 3),
        ];
        // The agent's own: never foreign.
        routes.extend((0..=255).map(|k| {
            let d = format!("198.18.66.{k}");
            route(&d, 32, Some("198.18.0.7"), ROUTE_PROTOCOL)
        }));
        let table = Table::new(routes.clone(), Vec::new());
        let asked = [
            "198.18.0.1",
            "198.18.64.9",
            "198.18.65.7",
            "198.18.65.8",
            "198.18.66.3",
            "2001:2::1",
            "2001:2:0:40::5",
            "2001:2:0:41::7",
            "2001:2:0:41::8",
        ];
        for a in asked.map(ip) {
            for at_least in [0, 16, 24, 25, 32, 48, 64, 65, 128] {
                let scan = routes.iter().any(|r| {
                    r.protocol != ROUTE_PROTOCOL
                        && r.prefix >= at_least
                        && covers(r.destination, r.prefix, a)
                });
                assert_eq!(table.foreign_covers(a, at_least), scan, "{a} /{at_least}");
            }
            let host = routes.iter().find(|r| r.is_host() && r.destination == a);
            let indexed = table.hosts.get(&a);
            assert_eq!(indexed.map(|r| r.gateway), host.map(|r| r.gateway), "{a}");
            let gateway = routes.iter().any(|r| r.prefix == 0 && r.gateway == Some(a));
            assert_eq!(table.gateways.contains(&a), gateway, "{a}");
        }
        assert!(table.foreign_covers(ip("198.18.64.9"), 24));
        assert!(!table.foreign_covers(ip("198.18.64.9"), 25));
        assert!(
            !table.foreign_covers(ip("198.18.66.3"), 1),
            "the agent's own"
        );
    }

    #[test]
    fn on_link_means_inside_a_connected_network_of_its_family() {
        let ip = |s: &str| -> IpAddr { s.parse().expect(s) };
        let connected = [
            (ip("198.18.0.10"), 24),
            (ip("198.19.1.1"), 32),
            (ip("2001:2::10"), 64),
        ];
        assert!(on_link(ip("198.18.0.77"), &connected));
        assert!(!on_link(ip("198.18.1.77"), &connected));
        assert!(on_link(ip("198.19.1.1"), &connected));
        assert!(!on_link(ip("198.19.1.2"), &connected));
        assert!(on_link(ip("198.19.1.2"), &[(ip("0.0.0.0"), 0)]));
        assert!(on_link(ip("2001:2::ffff:1"), &connected));
        assert!(!on_link(ip("2001:2:0:1::1"), &connected));
        // An IPv4 default network does not make IPv6 addresses on-link.
        assert!(!on_link(ip("2001:2::1"), &[(ip("0.0.0.0"), 0)]));
        assert!(on_link(ip("2001:2:0:1::1"), &[(ip("::"), 0)]));
    }

    #[test]
    fn an_etcd_endpoint_is_never_routed_in_either_of_its_spellings() {
        let ip = |s: &str| -> IpAddr { s.parse().expect(s) };
        let bounds = RouteBounds {
            range: Some("198.18.0.0/15".parse().expect("range")),
            protected: vec![ip("::ffff:198.18.66.2"), ip("198.18.67.2")],
            ..RouteBounds::default()
        };
        let table = Table::new(Vec::new(), Vec::new());
        for health in ["198.18.66.2", "198.18.67.2"] {
            assert_eq!(
                bounds.refuse(ip(health), &table).as_deref(),
                Some("an etcd endpoint of this agent"),
                "{health}"
            );
        }
        assert_eq!(bounds.refuse(ip("198.18.68.2"), &table), None);
    }

    #[test]
    fn desired_routes_skip_the_local_node() {
        let nodes = NodeSet::new(vec![node("a", 1), node("b", 2), node("c", 3)]).expect("unique");
        let by_name = PeerRoutes::desired(&nodes, Some("a"), &[]);
        assert_eq!(by_name.len(), 2);
        assert_eq!(
            by_name.get(&IpAddr::V4(Ipv4Addr::new(198, 18, 66, 2))),
            Some(&PeerRoute {
                via: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
                node: "b".into()
            })
        );
        let mine = IpAddr::V4(Ipv4Addr::new(198, 18, 67, 2));
        let by_ip = PeerRoutes::desired(&nodes, None, &[mine]);
        assert!(!by_ip.contains_key(&mine));
        assert_eq!(by_ip.len(), 2);
    }

    #[test]
    fn desired_routes_cover_each_family_a_peer_has() {
        let v6 = |s: &str| -> Ipv6Addr { s.parse().expect(s) };
        let dual = Node {
            node_ip6: Some(v6("2001:2::2")),
            health_ip6: Some(v6("2001:2:0:42::2")),
            ..node("b", 2)
        };
        let only6 = Node {
            name: "c".into(),
            node_ip6: Some(v6("2001:2::3")),
            health_ip6: Some(v6("2001:2:0:43::2")),
            ..Node::default()
        };
        let nodes = NodeSet::new(vec![node("a", 1), dual, only6]).expect("unique");
        let mine = IpAddr::V6(v6("2001:2:0:41::2"));
        let got: BTreeMap<IpAddr, IpAddr> = PeerRoutes::desired(&nodes, Some("a"), &[mine])
            .into_iter()
            .map(|(h, r)| (h, r.via))
            .collect();
        let want: BTreeMap<IpAddr, IpAddr> = [
            ("198.18.66.2", "198.18.0.2"),
            ("2001:2:0:42::2", "2001:2::2"),
            ("2001:2:0:43::2", "2001:2::3"),
        ]
        .into_iter()
        .map(|(h, n)| (h.parse().expect(h), n.parse().expect(n)))
        .collect();
        assert_eq!(got, want);
    }
}
