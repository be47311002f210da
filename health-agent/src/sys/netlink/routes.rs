//! Routes of both families: added or replaced, deleted (a missing one is
//! fine), listed. The agent's own routes carry its protocol number and are
//! deleted only with it, so a route someone else made is never touched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt as _;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope,
};
use rtnetlink::RouteMessageBuilder;

use super::{Netlink, NetlinkError, RTPROT_BOOT, RouteV4, RouteV6, req};

impl Netlink {
    /// Adds `msg`, replacing a route to the same destination.
    async fn add_route(&self, msg: RouteMessage, op: String) -> Result<(), NetlinkError> {
        self.handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(req(op))
    }

    /// Deletes the route `msg` names; a missing one is fine.
    async fn delete_route(&self, msg: RouteMessage, op: String) -> Result<(), NetlinkError> {
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
            Err(e) => Err(req(op)(e)),
        }
    }

    /// Every route `query` (a family's empty message) lists.
    async fn route_messages(
        &self,
        query: RouteMessage,
        what: &'static str,
    ) -> Result<Vec<RouteMessage>, NetlinkError> {
        self.handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(req(what))
    }

    /// Adds (or replaces) an IPv4 route `destination/prefix` out of
    /// `iface`, through `gateway` when given (on-link: the gateway need not
    /// be in any connected subnet).
    pub async fn replace_route(
        &self,
        destination: Ipv4Addr,
        prefix: u8,
        iface: &str,
        gateway: Option<Ipv4Addr>,
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        let b = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(destination, prefix)
            .output_interface(index);
        let b = match gateway {
            Some(gw) => b.gateway(gw).onlink(),
            None => b.scope(RouteScope::Link),
        };
        let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
        self.add_route(
            b.build(),
            format!("adding route {destination}/{prefix}{via} dev {iface}"),
        )
        .await
    }

    /// Adds (or replaces) `destination/prefix via gateway`, letting the
    /// kernel pick the interface that reaches the gateway.
    pub async fn replace_route_via(
        &self,
        destination: Ipv4Addr,
        prefix: u8,
        gateway: Ipv4Addr,
    ) -> Result<(), NetlinkError> {
        self.replace_route_owned(destination, prefix, gateway, RTPROT_BOOT)
            .await
    }

    /// Adds `destination/prefix via gateway` (either family, both the
    /// same) marked as installed by `protocol`, replacing a route to the
    /// same destination (callers check that any such route is theirs
    /// first). The kernel picks the interface that reaches the gateway.
    pub async fn replace_route_owned(
        &self,
        destination: impl Into<IpAddr>,
        prefix: u8,
        gateway: impl Into<IpAddr>,
        protocol: u8,
    ) -> Result<(), NetlinkError> {
        let (destination, gateway) = (destination.into(), gateway.into());
        let proto = RouteProtocol::from(protocol);
        let msg = match (destination, gateway) {
            (IpAddr::V4(d), IpAddr::V4(g)) => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(d, prefix)
                .gateway(g)
                .protocol(proto)
                .build(),
            (IpAddr::V6(d), IpAddr::V6(g)) => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(d, prefix)
                .gateway(g)
                .protocol(proto)
                .build(),
            _ => {
                return Err(NetlinkError::FamilyMismatch {
                    destination,
                    gateway,
                });
            }
        };
        self.add_route(
            msg,
            format!("adding route {destination}/{prefix} via {gateway} (protocol {protocol})"),
        )
        .await
    }

    /// Deletes the main-table route to `destination/prefix` (either family)
    /// installed by `protocol`; the kernel leaves a route of another
    /// protocol alone. A missing one is fine.
    pub async fn delete_route_owned(
        &self,
        destination: impl Into<IpAddr>,
        prefix: u8,
        protocol: u8,
    ) -> Result<(), NetlinkError> {
        let destination = destination.into();
        let proto = RouteProtocol::from(protocol);
        let msg = match destination {
            IpAddr::V4(d) => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(d, prefix)
                .protocol(proto)
                .build(),
            IpAddr::V6(d) => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(d, prefix)
                .protocol(proto)
                .build(),
        };
        self.delete_route(
            msg,
            format!("deleting route {destination}/{prefix} (protocol {protocol})"),
        )
        .await
    }

    /// IPv4 routes of the main table.
    pub async fn routes_v4(&self) -> Result<Vec<RouteV4>, NetlinkError> {
        let msgs = self
            .route_messages(
                RouteMessageBuilder::<Ipv4Addr>::new().build(),
                "listing IPv4 routes",
            )
            .await?;
        Ok(msgs
            .iter()
            .map(|msg| {
                let mut r = RouteV4 {
                    destination: Ipv4Addr::UNSPECIFIED,
                    prefix: msg.header.destination_prefix_length,
                    gateway: None,
                    oif: None,
                    protocol: u8::from(msg.header.protocol),
                };
                for a in &msg.attributes {
                    match a {
                        RouteAttribute::Destination(RouteAddress::Inet(d)) => r.destination = *d,
                        RouteAttribute::Gateway(RouteAddress::Inet(g)) => r.gateway = Some(*g),
                        RouteAttribute::Oif(i) => r.oif = Some(*i),
                        _ => {}
                    }
                }
                r
            })
            .collect())
    }

    /// Adds (or replaces) an IPv6 route `destination/prefix` out of `iface`,
    /// through `gateway` when given (on-link: the gateway need not be in any
    /// connected prefix). The interface must be up.
    pub async fn replace_route6(
        &self,
        destination: Ipv6Addr,
        prefix: u8,
        iface: &str,
        gateway: Option<Ipv6Addr>,
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        let mut b = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(destination, prefix)
            .output_interface(index);
        if let Some(gw) = gateway {
            b = b.gateway(gw).onlink();
        }
        let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
        self.add_route(
            b.build(),
            format!("adding route {destination}/{prefix}{via} dev {iface}"),
        )
        .await
    }

    /// Deletes the main-table IPv6 route to `destination/prefix` out of
    /// `iface`, whoever installed it; a missing one is fine.
    pub async fn delete_route6(
        &self,
        destination: Ipv6Addr,
        prefix: u8,
        iface: &str,
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        let msg = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(destination, prefix)
            .output_interface(index)
            .protocol(RouteProtocol::Unspec)
            .build();
        self.delete_route(
            msg,
            format!("deleting route {destination}/{prefix} dev {iface}"),
        )
        .await
    }

    /// IPv6 routes of every table (check [`RouteV6::table`]).
    pub async fn routes_v6(&self) -> Result<Vec<RouteV6>, NetlinkError> {
        let msgs = self
            .route_messages(
                RouteMessageBuilder::<Ipv6Addr>::new().build(),
                "listing IPv6 routes",
            )
            .await?;
        Ok(msgs
            .iter()
            .map(|msg| {
                let mut r = RouteV6 {
                    destination: Ipv6Addr::UNSPECIFIED,
                    prefix: msg.header.destination_prefix_length,
                    gateway: None,
                    oif: None,
                    protocol: u8::from(msg.header.protocol),
                    table: u32::from(msg.header.table),
                };
                for a in &msg.attributes {
                    match a {
                        RouteAttribute::Destination(RouteAddress::Inet6(d)) => r.destination = *d,
                        RouteAttribute::Gateway(RouteAddress::Inet6(g)) => r.gateway = Some(*g),
                        RouteAttribute::Oif(i) => r.oif = Some(*i),
                        RouteAttribute::Table(t) => r.table = *t,
                        _ => {}
                    }
                }
                r
            })
            .collect())
    }
}
