//! With encryption on, peers' health addresses are routed into the
//! encryption device: a route of the agent's through another device (made
//! by an earlier run, or before the node's only device changed) is made
//! again through the one named now, not left where it was.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
};

use health_agent::{
    membership::routes::{PeerRoute, PeerRoutes, ROUTE_PROTOCOL, RouteBounds},
    sys::netlink::in_netns,
};
use health_tests::topology::{A_IF, TwoNodes, peer_via_b};

/// Stands in for a second tunnel device in node `a`.
const OTHER: &str = "tun-o";
const OTHER_PEER: &str = "tun-p";
const HEALTH: Ipv4Addr = Ipv4Addr::new(198, 18, 66, 2);

#[test]
fn a_health_route_follows_the_encryption_device_named() {
    let nodes = TwoNodes::new();
    in_netns(Some(&nodes.a), |nl| async move {
        nl.add_veth(OTHER, OTHER_PEER, None).await?;
        nl.set_up(OTHER).await?;
        nl.set_up(OTHER_PEER).await
    })
    .expect("a second device in a");
    let desired: BTreeMap<IpAddr, PeerRoute> = [peer_via_b(HEALTH, "b")].into_iter().collect();
    let through = |dev: &str| {
        let bounds = RouteBounds {
            range: Some("198.18.64.0/18".parse().expect("range")),
            tunnel: Some(dev.to_owned()),
            ..RouteBounds::default()
        };
        let desired = desired.clone();
        let synced = nodes
            .a
            .run(move || PeerRoutes::default().apply(&desired, &bounds))
            .expect("enter a");
        assert!(!synced.failed, "{dev}: {synced:?}");
        in_netns(Some(&nodes.a), |nl| async move {
            let index = nl.require_link(dev).await?;
            let routes = nl.routes::<Ipv4Addr>().await?;
            Ok(routes
                .into_iter()
                .filter(|r| r.destination == HEALTH && r.protocol == ROUTE_PROTOCOL)
                .map(|r| (r.oif == Some(index), r.gateway))
                .collect::<Vec<_>>())
        })
        .expect("routes")
    };
    assert_eq!(through(A_IF), [(true, None)], "into {A_IF}, no gateway");
    assert_eq!(
        through(OTHER),
        [(true, None)],
        "made again into {OTHER}, not left in {A_IF}"
    );
}

/// The health addresses node `a` routes with the agent's protocol.
fn owned_routes(nodes: &TwoNodes) -> Vec<Ipv4Addr> {
    nodes.a.run(owned_routes_here).expect("enter a")
}

#[test]
fn a_tunnel_route_goes_when_its_peer_leaves_and_when_the_agent_stops() {
    let nodes = TwoNodes::new();
    let bounds = RouteBounds {
        range: Some("198.18.64.0/18".parse().expect("range")),
        tunnel: Some(A_IF.to_owned()),
        ..RouteBounds::default()
    };
    let other = Ipv4Addr::new(198, 18, 66, 3);
    let peer = |health: Ipv4Addr| peer_via_b(health, &format!("n-{health}"));
    let both: BTreeMap<IpAddr, PeerRoute> = [peer(HEALTH), peer(other)].into_iter().collect();
    let one: BTreeMap<IpAddr, PeerRoute> = [peer(other)].into_iter().collect();
    let (removed, left) = nodes
        .a
        .run(move || {
            let mut routes = PeerRoutes::default();
            let made = routes.apply(&both, &bounds);
            assert!(!made.failed, "{made:?}");
            let synced = routes.apply(&one, &bounds);
            let left = owned_routes_here();
            routes.clear();
            (synced, left)
        })
        .expect("enter a");
    assert!(!removed.failed, "{removed:?}");
    // Link-scoped routes into the device: a delete that named no scope
    // would match none of them and find nothing to remove.
    assert_eq!(left, [other], "the departed peer's route is gone");
    assert_eq!(
        owned_routes(&nodes),
        Vec::<Ipv4Addr>::new(),
        "cleared at stop"
    );
}

/// [`owned_routes`] from inside the namespace already entered.
fn owned_routes_here() -> Vec<Ipv4Addr> {
    in_netns(None, |nl| async move {
        let routes = nl.routes::<Ipv4Addr>().await?;
        Ok(routes
            .into_iter()
            .filter(|r| r.protocol == ROUTE_PROTOCOL)
            .map(|r| r.destination)
            .collect::<Vec<_>>())
    })
    .expect("routes")
}
