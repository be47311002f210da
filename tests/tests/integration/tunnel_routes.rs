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
use health_tests::topology::{A_IF, B_IP, TwoNodes};

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
    let desired: BTreeMap<IpAddr, PeerRoute> = [(
        IpAddr::V4(HEALTH),
        PeerRoute {
            via: IpAddr::V4(B_IP),
            node: "b".into(),
        },
    )]
    .into_iter()
    .collect();
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
