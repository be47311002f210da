//! Routes of both families: added or replaced, deleted (a missing one is
//! fine), listed. The agent's own routes carry its protocol number and are
//! deleted only with it, so a route someone else made is never touched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt as _;
use netlink_packet_route::{
    AddressFamily,
    route::{
        RouteAddress, RouteAttribute, RouteMessage, RouteNextHop, RouteProtocol, RouteScope,
        RouteType,
    },
};
use rtnetlink::RouteMessageBuilder;

use super::{Netlink, NetlinkError, RTPROT_BOOT, req};
use crate::util::cidr::Family;

/// The kernel's local routing table (`RT_TABLE_LOCAL`).
const RT_TABLE_LOCAL: u32 = 255;

/// A route of family `A`, as far as the agent cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<A> {
    pub destination: A,
    pub prefix: u8,
    pub gateway: Option<A>,
    pub oif: Option<u32>,
    /// Who installed it (`rtm_protocol`: 2 kernel, 3 boot, 4 static, ...).
    pub protocol: u8,
    /// The routing table (254 main, 255 local).
    pub table: u32,
}

/// An IPv4 route.
pub type RouteV4 = Route<Ipv4Addr>;
/// An IPv6 route.
pub type RouteV6 = Route<Ipv6Addr>;

/// A route to `destination/prefix`, through `gateway` when given (of the
/// same family).
fn route(
    destination: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
) -> Result<RouteMessageBuilder<IpAddr>, NetlinkError> {
    // rtnetlink checks the prefix length against the family.
    let b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(destination, prefix)
        .map_err(invalid_route(destination, prefix))?;
    match gateway {
        None => Ok(b),
        Some(gateway) if gateway.is_ipv4() == destination.is_ipv4() => b
            .gateway(gateway)
            .map_err(invalid_route(destination, prefix)),
        Some(gateway) => Err(NetlinkError::FamilyMismatch {
            destination,
            gateway,
        }),
    }
}

fn invalid_route<E: std::fmt::Display>(
    destination: IpAddr,
    prefix: u8,
) -> impl FnOnce(E) -> NetlinkError {
    move |e| NetlinkError::InvalidRoute {
        destination,
        prefix,
        reason: e.to_string(),
    }
}

/// The address of a route attribute, when it is one of family `A`.
fn address<A: Family>(a: &RouteAddress) -> Option<A> {
    match a {
        RouteAddress::Inet(a) => A::from_ip(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => A::from_ip(IpAddr::V6(*a)),
        _ => None,
    }
}

/// How a route is written where one to the same destination and metric
/// may exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteWrite {
    /// Replacing it (the caller knows it is its own).
    Replace,
    /// Never over it: the kernel refuses the add (`EEXIST`, see
    /// [`NetlinkError::exists`]) and that route stays.
    New,
}

/// The route `msg` gives: one a next hop when it has several
/// (`RTA_MULTIPATH`), each with its gateway and interface, so that every
/// gateway of a multipath default route is seen.
fn parsed_route<A: Family>(msg: &RouteMessage) -> Vec<Route<A>> {
    let mut r = Route {
        destination: A::UNSPECIFIED,
        prefix: msg.header.destination_prefix_length,
        gateway: None,
        oif: None,
        protocol: u8::from(msg.header.protocol),
        table: u32::from(msg.header.table),
    };
    let mut hops: &[RouteNextHop] = &[];
    for a in &msg.attributes {
        match a {
            RouteAttribute::Destination(d) => {
                r.destination = address(d).unwrap_or(r.destination);
            }
            RouteAttribute::Gateway(g) => r.gateway = address(g).or(r.gateway),
            RouteAttribute::Oif(i) => r.oif = Some(*i),
            RouteAttribute::Table(t) => r.table = *t,
            RouteAttribute::MultiPath(h) => hops = h,
            _ => {}
        }
    }
    if hops.is_empty() {
        return vec![r];
    }
    hops.iter()
        .map(|hop| Route {
            gateway: hop.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(g) => address(g),
                _ => None,
            }),
            oif: Some(hop.interface_index).filter(|&i| i != 0),
            ..r
        })
        .collect()
}

impl Netlink {
    /// Adds `msg`, replacing a route to the same destination.
    async fn add_route(&self, msg: RouteMessage, op: String) -> Result<(), NetlinkError> {
        self.write_route(msg, RouteWrite::Replace, op).await
    }

    /// Adds `msg` as `write` says.
    async fn write_route(
        &self,
        msg: RouteMessage,
        write: RouteWrite,
        op: String,
    ) -> Result<(), NetlinkError> {
        let add = self.handle.route().add(msg);
        let add = match write {
            RouteWrite::Replace => add.replace(),
            RouteWrite::New => add,
        };
        add.execute().await.map_err(req(op))
    }

    /// Deletes the route `msg` names; a missing one is fine.
    async fn delete_message(&self, msg: RouteMessage, op: String) -> Result<(), NetlinkError> {
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
            Err(e) => Err(req(op)(e)),
        }
    }

    /// Routes of family `A`; IPv6 ones of every table (check
    /// [`Route::table`]).
    pub async fn routes<A: Family>(&self) -> Result<Vec<Route<A>>, NetlinkError> {
        let mut query = RouteMessageBuilder::<IpAddr>::new().build();
        let any: IpAddr = A::UNSPECIFIED.into();
        query.header.address_family = if any.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let msgs: Vec<RouteMessage> = self
            .handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(req(format!("listing {} routes", A::NAME)))?;
        Ok(msgs.iter().flat_map(parsed_route).collect())
    }

    /// Adds (or replaces) a route `destination/prefix` out of `iface`,
    /// through `gateway` when given (on-link: the gateway need not be in
    /// any connected network). The interface must be up for IPv6.
    pub async fn replace_route<A: Family>(
        &self,
        destination: A,
        prefix: u8,
        iface: &str,
        gateway: Option<A>,
    ) -> Result<(), NetlinkError> {
        let msg = self.out_of(destination, prefix, iface, gateway).await?;
        let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
        let destination: IpAddr = destination.into();
        self.add_route(
            msg,
            format!("adding route {destination}/{prefix}{via} dev {iface}"),
        )
        .await
    }

    /// Adds a direct route `destination/prefix` out of `iface`, as
    /// [`Self::replace_route`] does without a gateway, but never over
    /// another: where a route to the destination exists (someone else's),
    /// the kernel refuses the add (`EEXIST`) and that route stays.
    pub async fn add_route_new<A: Family>(
        &self,
        destination: A,
        prefix: u8,
        iface: &str,
    ) -> Result<(), NetlinkError> {
        let msg = self.out_of(destination, prefix, iface, None).await?;
        let destination: IpAddr = destination.into();
        self.handle.route().add(msg).execute().await.map_err(req(format!(
            "adding route {destination}/{prefix} dev {iface} (never over a route to it that exists)"
        )))
    }

    /// The route `destination/prefix` out of `iface`, through `gateway`
    /// when given (on-link), else direct.
    async fn out_of<A: Family>(
        &self,
        destination: A,
        prefix: u8,
        iface: &str,
        gateway: Option<A>,
    ) -> Result<RouteMessage, NetlinkError> {
        let index = self.require_link(iface).await?;
        let destination: IpAddr = destination.into();
        let b = route(destination, prefix, gateway.map(Into::into))?.output_interface(index);
        Ok(match gateway {
            Some(_) => b.onlink(),
            // A direct IPv4 route reaches only the link; IPv6 routes have
            // no scope.
            None if destination.is_ipv4() => b.scope(RouteScope::Link),
            None => b,
        }
        .build())
    }

    /// Makes every address of `destination/prefix` local to this namespace
    /// (a `local` route in the local table, "AnyIP"): packets to any of
    /// them are delivered here, and answered from the address they were
    /// sent to, without `iface` holding each as an address. A simulated
    /// host standing in for thousands of peers holds their addresses this
    /// way: a lookup of its own source address walks a trie, not one hash
    /// chain of thousands of interface addresses.
    pub async fn add_local_route(
        &self,
        destination: IpAddr,
        prefix: u8,
        iface: &str,
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        let msg = route(destination, prefix, None)?
            .output_interface(index)
            .table_id(RT_TABLE_LOCAL)
            .kind(RouteType::Local)
            .scope(RouteScope::Host)
            .protocol(RouteProtocol::from(RTPROT_BOOT))
            .build();
        self.add_route(
            msg,
            format!("adding local route {destination}/{prefix} dev {iface}"),
        )
        .await
    }

    /// Deletes the main-table route to `destination/prefix` out of `iface`,
    /// whoever installed it and whatever its scope; a missing one is fine.
    pub async fn delete_route<A: Family>(
        &self,
        destination: A,
        prefix: u8,
        iface: &str,
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        let msg = route(destination.into(), prefix, None)?
            .output_interface(index)
            .protocol(RouteProtocol::Unspec)
            .scope(RouteScope::NoWhere)
            .build();
        self.delete_message(
            msg,
            format!("deleting route {destination}/{prefix} dev {iface}"),
        )
        .await
    }

    /// Adds (or replaces) `destination/prefix via gateway`, letting the
    /// kernel pick the interface that reaches the gateway.
    pub async fn replace_route_via<A: Family>(
        &self,
        destination: A,
        prefix: u8,
        gateway: A,
    ) -> Result<(), NetlinkError> {
        let owner = (RTPROT_BOOT, RouteWrite::Replace);
        self.write_route_owned(destination, prefix, gateway, owner)
            .await
    }

    /// Adds `destination/prefix via gateway` (either family, both the
    /// same) marked as installed by `protocol`, over a route to the same
    /// destination as `write` says (callers replace only a route they
    /// know is theirs). The kernel picks the interface that reaches the
    /// gateway.
    pub async fn write_route_owned(
        &self,
        destination: impl Into<IpAddr>,
        prefix: u8,
        gateway: impl Into<IpAddr>,
        (protocol, write): (u8, RouteWrite),
    ) -> Result<(), NetlinkError> {
        let (destination, gateway) = (destination.into(), gateway.into());
        let msg = route(destination, prefix, Some(gateway))?
            .protocol(RouteProtocol::from(protocol))
            .build();
        self.write_route(
            msg,
            write,
            format!("adding route {destination}/{prefix} via {gateway} (protocol {protocol})"),
        )
        .await
    }

    /// Adds `destination/prefix dev iface` (either family, no gateway)
    /// marked as installed by `protocol`, over a route to the same
    /// destination as `write` says (callers replace only a route they
    /// know is theirs).
    pub async fn write_route_dev_owned(
        &self,
        destination: IpAddr,
        prefix: u8,
        iface: &str,
        (protocol, write): (u8, RouteWrite),
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        let b = route(destination, prefix, None)?
            .output_interface(index)
            .protocol(RouteProtocol::from(protocol));
        let b = if destination.is_ipv4() {
            b.scope(RouteScope::Link)
        } else {
            b
        };
        self.write_route(
            b.build(),
            write,
            format!("adding route {destination}/{prefix} dev {iface} (protocol {protocol})"),
        )
        .await
    }

    /// Deletes the main-table route to `destination/prefix` (either family)
    /// installed by `protocol`, whatever its scope (a route into a device
    /// is link-scoped, and the kernel matches a delete's scope unless it
    /// is `RT_SCOPE_NOWHERE`); the kernel leaves a route of another
    /// protocol alone. A missing one is fine.
    pub async fn delete_route_owned(
        &self,
        destination: impl Into<IpAddr>,
        prefix: u8,
        protocol: u8,
    ) -> Result<(), NetlinkError> {
        let destination = destination.into();
        let msg = route(destination, prefix, None)?
            .protocol(RouteProtocol::from(protocol))
            .scope(RouteScope::NoWhere)
            .build();
        self.delete_message(
            msg,
            format!("deleting route {destination}/{prefix} (protocol {protocol})"),
        )
        .await
    }
}
