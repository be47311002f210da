//! How the agent writes a peer's health route over one that may exist: a
//! route it read as its own is replaced, and one it read nowhere is added
//! never over a route someone else made since (between the agent's read of
//! the table and its write), which stays as it was.

use std::net::Ipv4Addr;

use health_agent::{
    membership::routes::ROUTE_PROTOCOL,
    sys::netlink::{RouteV4, RouteWrite, in_netns},
};
use health_tests::topology::{B_IP, TwoNodes};

const HEALTH: Ipv4Addr = Ipv4Addr::new(198, 18, 66, 2);
/// Another on-link gateway in node `a`'s network.
const OTHER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 9);
/// `rtm_protocol` of a route an administrator made (`RTPROT_STATIC`).
const STATIC: u8 = 4;

/// Node `a`'s host routes to [`HEALTH`].
fn routes_to_health(nodes: &TwoNodes) -> Vec<RouteV4> {
    in_netns(
        Some(&nodes.a),
        |nl| async move { nl.routes::<Ipv4Addr>().await },
    )
    .expect("routes")
    .into_iter()
    .filter(|r| r.destination == HEALTH && r.prefix == 32)
    .collect()
}

#[test]
fn a_new_route_is_never_written_over_one_made_by_someone_else() {
    let nodes = TwoNodes::new();
    let write = |gateway: Ipv4Addr, owner: (u8, RouteWrite)| {
        in_netns(Some(&nodes.a), move |nl| async move {
            nl.write_route_owned(HEALTH, 32, gateway, owner).await
        })
    };
    // Someone else's route, made after the agent read the table.
    write(OTHER, (STATIC, RouteWrite::Replace)).expect("a static route");
    let refused = write(B_IP, (ROUTE_PROTOCOL, RouteWrite::New))
        .expect_err("the agent's add over the static route");
    assert!(refused.exists(), "{refused:?}");
    let routes = routes_to_health(&nodes);
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert_eq!(
        (routes[0].gateway, routes[0].protocol),
        (Some(OTHER), STATIC),
        "left as it was"
    );
    // Gone: the agent's add makes its own, and its replace moves it.
    in_netns(Some(&nodes.a), |nl| async move {
        nl.delete_route_owned(HEALTH, 32, STATIC).await
    })
    .expect("the static route removed");
    write(B_IP, (ROUTE_PROTOCOL, RouteWrite::New)).expect("the agent's route");
    write(OTHER, (ROUTE_PROTOCOL, RouteWrite::Replace)).expect("moved");
    let routes = routes_to_health(&nodes);
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert_eq!(
        (routes[0].gateway, routes[0].protocol),
        (Some(OTHER), ROUTE_PROTOCOL)
    );
}

/// Every gateway of a multipath default route is this node's: none is
/// routed as a peer's health address, as the one gateway of a plain
/// default route is not.
#[test]
fn no_gateway_of_a_multipath_default_route_is_routed_as_a_peer() {
    use std::{collections::BTreeMap, net::IpAddr};

    use health_agent::membership::routes::{PeerRoute, PeerRoutes, RouteBounds};
    use health_tests::topology::{A_IF, peer_via_b};

    let nodes = TwoNodes::new();
    let mut ip = std::process::Command::new("ip");
    ip.args(["route", "add", "default", "nexthop", "via"])
        .arg(HEALTH.to_string())
        .args(["dev", A_IF, "onlink", "nexthop", "via"])
        .arg(B_IP.to_string())
        .args(["dev", A_IF]);
    health_tests::process::enter(&mut ip, &nodes.a);
    let out = ip.output().expect("ip");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let desired: BTreeMap<IpAddr, PeerRoute> = [peer_via_b(HEALTH, "b")].into_iter().collect();
    let bounds = RouteBounds {
        range: Some("198.18.64.0/18".parse().expect("range")),
        ..RouteBounds::default()
    };
    let synced = nodes
        .a
        .run(move || PeerRoutes::default().apply(&desired, &bounds))
        .expect("enter a");
    let refused: Vec<(IpAddr, &str)> = synced
        .refused
        .iter()
        .map(|r| (r.address, r.reason.as_str()))
        .collect();
    assert_eq!(
        refused,
        [(IpAddr::V4(HEALTH), "this node's default gateway")],
        "{synced:?}"
    );
    let ours: Vec<RouteV4> = routes_to_health(&nodes)
        .into_iter()
        .filter(|r| r.protocol == ROUTE_PROTOCOL)
        .collect();
    assert_eq!(ours, [], "nothing routed");
}
