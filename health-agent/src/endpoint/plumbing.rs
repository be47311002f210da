//! The endpoint's network plumbing, through netlink:
//!
//! ```text
//!  node namespace                     endpoint namespace (default "health")
//!  lxc_health  <------- veth ------->  eth0  198.18.x.y/32, 2001:..:y/128 (nodad)
//!  route x.y/32 dev lxc_health         lo up
//!  route 2001:..:y/128 dev lxc_health  neigh <router> lladdr <lxc_health MAC> PERMANENT
//!                                      route <router>/32 dev eth0 scope link
//!                                      default via <router> dev eth0 onlink
//!                                      neigh <router6> lladdr <lxc_health MAC> PERMANENT
//!                                      route <router6>/128 dev eth0
//!                                      default via <router6> dev eth0 onlink
//! ```
//!
//! Each family is there when the endpoint has an address of it (IPv4,
//! IPv6 or both). The router address (first host of the CIDR, `::1` of
//! the IPv6 one) is never configured anywhere: the static neighbour entry
//! sends everything the endpoint emits to the host side of the veth, where
//! the node routes it. For IPv6 this is chosen over a default route via
//! the host side's link-local address, which changes with the veth's MAC
//! whenever the veth is recreated and is only usable once its duplicate
//! address detection is over; the router address is the same in every run
//! and needs no neighbour discovery.
//!
//! The other way, the node finds the endpoint's IPv6 address by neighbour
//! discovery (the echo responder hands ND to the stack): the node's
//! solicitation leaves from the link-local address of `lxc_health`, so
//! duplicate address detection is switched off on both ends of a new veth
//! (`accept_dad`, interfaces the agent owns) and their link-local addresses
//! are usable at once; the endpoint's own address is added `nodad`. Every
//! step is idempotent, so the same [`ensure`] creates, restores and
//! repairs.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{
    ownership::{self, ForeignObject, Found, Owned, Record, judge},
    plan::{Plan, PlumbingError},
};
use crate::{
    sys::netlink::{Netlink, NetlinkError, in_netns},
    sys::netns::Netns,
    sys::sysctl::write_in,
    util::cidr::Cidr as _,
};

/// The IPv4 address and router, when the endpoint has IPv4.
fn v4_router(plan: &Plan) -> Result<Option<(Ipv4Addr, Ipv4Addr)>, PlumbingError> {
    plan.v4
        .map(|v| {
            v.cidr
                .router()
                .map(|r| (v.addr, r))
                .ok_or(PlumbingError::NoRouter { cidr: v.cidr })
        })
        .transpose()
}

/// The IPv6 address and router, when the endpoint has IPv6.
fn v6_router(plan: &Plan) -> Result<Option<(Ipv6Addr, Ipv6Addr)>, PlumbingError> {
    plan.v6
        .map(|v| {
            v.cidr
                .router()
                .map(|r| (v.addr, r))
                .ok_or(PlumbingError::NoRouter6 { cidr: v.cidr })
        })
        .transpose()
}

/// A piece of the plumbing found missing or wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Missing {
    Namespace,
    HostInterface,
    EndpointInterface,
    Address,
    HostRoute,
    DefaultRoute,
    RouterNeighbour,
    /// The endpoint's IPv6 address.
    Address6,
    /// The node's route to the endpoint's IPv6 address.
    HostRoute6,
    /// The endpoint's IPv6 default route.
    DefaultRoute6,
    /// The programs are not attached to the endpoint's interface as it is now.
    Programs,
    /// Everything is in place but the endpoint does not answer an echo.
    EchoReply,
}

impl Missing {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::HostInterface => "host interface",
            Self::EndpointInterface => "endpoint interface",
            Self::Address => "address",
            Self::HostRoute => "host route",
            Self::DefaultRoute => "default route",
            Self::RouterNeighbour => "router neighbour",
            Self::Address6 => "IPv6 address",
            Self::HostRoute6 => "IPv6 host route",
            Self::DefaultRoute6 => "IPv6 default route",
            Self::Programs => "programs",
            Self::EchoReply => "echo reply",
        }
    }
}

/// The node's routes to the endpoint's addresses, out of `index`: which
/// of the planned ones are missing.
async fn host_routes_missing(
    nl: &Netlink,
    plan: &Plan,
    index: Option<u32>,
) -> Result<Vec<Missing>, NetlinkError> {
    let mut missing = Vec::new();
    if let Some(v4) = plan.v4 {
        let table = nl.routes::<Ipv4Addr>().await?;
        let there = index.is_some()
            && table
                .iter()
                .any(|r| r.destination == v4.addr && r.prefix == 32 && r.oif == index);
        if !there {
            missing.push(Missing::HostRoute);
        }
    }
    if let Some(v6) = plan.v6 {
        let table = nl.routes::<Ipv6Addr>().await?;
        let there = index.is_some()
            && table
                .iter()
                .any(|r| r.destination == v6.addr && r.prefix == 128 && r.oif == index);
        if !there {
            missing.push(Missing::HostRoute6);
        }
    }
    Ok(missing)
}

/// Read-only check of the plumbing; empty when everything is in place.
pub fn inspect(plan: &Plan) -> Result<Vec<Missing>, PlumbingError> {
    let mut missing = Vec::new();
    if !plan.netns.exists() {
        missing.push(Missing::Namespace);
    }
    let (host_index, host_routes) = in_netns(None, |nl| async move {
        let index = nl.link_index(&plan.host_iface).await?;
        let routes = host_routes_missing(&nl, plan, index).await?;
        Ok((index, routes))
    })?;
    if host_index.is_none() {
        missing.push(Missing::HostInterface);
    }
    missing.extend(host_routes);
    if missing.contains(&Missing::Namespace) {
        return Ok(missing);
    }
    let v4 = v4_router(plan)?;
    let v6 = v6_router(plan)?;
    let inside = in_netns(Some(&plan.netns), |nl| async move {
        let mut m = Vec::new();
        let Some(index) = nl.link_index(&plan.ep_iface).await? else {
            return Ok(vec![Missing::EndpointInterface]);
        };
        if let Some((addr, router)) = v4 {
            let addrs = nl.addresses::<Ipv4Addr>().await?;
            if !addrs.iter().any(|(i, a, _)| *i == index && *a == addr) {
                m.push(Missing::Address);
            }
            let table = nl.routes::<Ipv4Addr>().await?;
            if !table
                .iter()
                .any(|r| r.prefix == 0 && r.gateway == Some(router) && r.oif == Some(index))
            {
                m.push(Missing::DefaultRoute);
            }
        }
        if let Some((addr, router)) = v6 {
            let addrs = nl.addresses::<Ipv6Addr>().await?;
            if !addrs.iter().any(|(i, a, _)| *i == index && *a == addr) {
                m.push(Missing::Address6);
            }
            if !has_default6(&nl, index, router).await? {
                m.push(Missing::DefaultRoute6);
            }
        }
        Ok(m)
    })?;
    missing.extend(inside);
    Ok(missing)
}

async fn has_default6(nl: &Netlink, index: u32, router: Ipv6Addr) -> Result<bool, NetlinkError> {
    Ok(nl
        .routes::<Ipv6Addr>()
        .await?
        .iter()
        .any(|r| r.prefix == 0 && r.gateway == Some(router) && r.oif == Some(index)))
}

/// The veth: both ends must exist; a half (one end moved or deleted with
/// the other surviving) is removed and the pair recreated. Returns what it
/// made.
fn ensure_veth(plan: &Plan) -> Result<Option<Missing>, PlumbingError> {
    let host = in_netns(
        None,
        |nl| async move { nl.link_index(&plan.host_iface).await },
    )?;
    let ep = in_netns(Some(&plan.netns), |nl| async move {
        nl.link_index(&plan.ep_iface).await
    })?;
    if host.is_some() && ep.is_some() {
        return Ok(None);
    }
    if host.is_some() {
        in_netns(
            None,
            |nl| async move { nl.delete_link(&plan.host_iface).await },
        )?;
    }
    if ep.is_some() {
        in_netns(Some(&plan.netns), |nl| async move {
            nl.delete_link(&plan.ep_iface).await
        })?;
    }
    in_netns(None, |nl| async move {
        nl.add_veth(&plan.host_iface, &plan.ep_iface, Some(&plan.netns))
            .await
    })?;
    if plan.v6.is_some() {
        // Before either end is up: their link-local addresses (the node's
        // neighbour solicitations leave from lxc_health's) are then usable
        // at once instead of after a second of DAD.
        write_in(None, &accept_dad(&plan.host_iface), "0")?;
        write_in(Some(&plan.netns), &accept_dad(&plan.ep_iface), "0")?;
    }
    Ok(Some(if host.is_none() {
        Missing::HostInterface
    } else {
        Missing::EndpointInterface
    }))
}

/// The `accept_dad` sysctl of `iface` (a dot in an interface name is a
/// slash in its sysctl path).
fn accept_dad(iface: &str) -> String {
    format!("net/ipv6/conf/{}/accept_dad", iface.replace('.', "/"))
}

/// An object [`ensure_with`] made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    Namespace,
    /// Both ends of the veth.
    Veth,
}

/// Creates whatever is missing; returns what it had to create.
pub fn ensure(plan: &Plan) -> Result<Vec<Missing>, PlumbingError> {
    ensure_with(plan, |_| Ok::<_, PlumbingError>(()))
}

/// [`ensure`], calling `made` as soon as the namespace or the veth is
/// made, before anything else is done with it (the agent records them
/// there).
pub fn ensure_with<E: From<PlumbingError>>(
    plan: &Plan,
    mut made: impl FnMut(Made) -> Result<(), E>,
) -> Result<Vec<Missing>, E> {
    let mut out = Vec::new();
    if !plan.netns.exists() {
        Netns::create(&plan.netns_name).map_err(PlumbingError::from)?;
        made(Made::Namespace)?;
        out.push(Missing::Namespace);
    }
    if let Some(m) = ensure_veth(plan)? {
        made(Made::Veth)?;
        out.push(m);
    }
    out.extend(ensure_addressing(plan)?);
    Ok(out)
}

/// Everything on top of the namespace and the veth.
fn ensure_addressing(plan: &Plan) -> Result<Vec<Missing>, PlumbingError> {
    let mut made = Vec::new();
    let v4 = v4_router(plan)?;
    let v6 = v6_router(plan)?;
    let (host_mac, host_made) = in_netns(None, |nl| async move {
        nl.set_up(&plan.host_iface).await?;
        let index = nl.require_link(&plan.host_iface).await?;
        let missing = host_routes_missing(&nl, plan, Some(index)).await?;
        for m in &missing {
            match (m, plan.v4, plan.v6) {
                (Missing::HostRoute, Some(v4), _) => {
                    nl.replace_route(v4.addr, 32, &plan.host_iface, None)
                        .await?;
                }
                (Missing::HostRoute6, _, Some(v6)) => {
                    nl.replace_route(v6.addr, 128, &plan.host_iface, None)
                        .await?;
                }
                _ => {}
            }
        }
        Ok((nl.link_l2(&plan.host_iface).await?.1, missing))
    })?;
    made.extend(host_made);
    let inside = in_netns(Some(&plan.netns), |nl| async move {
        let mut m = Vec::new();
        nl.set_up("lo").await?;
        nl.set_up(&plan.ep_iface).await?;
        let index = nl.require_link(&plan.ep_iface).await?;
        if let Some((addr, router)) = v4 {
            m.extend(ensure_inside4(&nl, plan, index, addr, router, host_mac).await?);
        }
        if let Some((addr, router)) = v6 {
            m.extend(ensure_inside6(&nl, plan, index, addr, router, host_mac).await?);
        }
        Ok(m)
    })?;
    made.extend(inside);
    Ok(made)
}

/// The endpoint's IPv4 address, router neighbour and routes.
async fn ensure_inside4(
    nl: &Netlink,
    plan: &Plan,
    index: u32,
    addr: Ipv4Addr,
    router: Ipv4Addr,
    host_mac: [u8; 6],
) -> Result<Vec<Missing>, NetlinkError> {
    let mut m = Vec::new();
    if !nl
        .addresses::<Ipv4Addr>()
        .await?
        .iter()
        .any(|(i, a, _)| *i == index && *a == addr)
    {
        nl.add_address(&plan.ep_iface, addr, 32).await?;
        m.push(Missing::Address);
    }
    // The MAC changes whenever the veth is recreated: always refresh.
    nl.replace_neighbour(&plan.ep_iface, router, host_mac)
        .await?;
    nl.replace_route(router, 32, &plan.ep_iface, None).await?;
    let table = nl.routes::<Ipv4Addr>().await?;
    if !table
        .iter()
        .any(|r| r.prefix == 0 && r.gateway == Some(router) && r.oif == Some(index))
    {
        nl.replace_route(Ipv4Addr::UNSPECIFIED, 0, &plan.ep_iface, Some(router))
            .await?;
        m.push(Missing::DefaultRoute);
    }
    Ok(m)
}

/// The endpoint's IPv6 address (`nodad`: usable at once), router
/// neighbour and routes.
async fn ensure_inside6(
    nl: &Netlink,
    plan: &Plan,
    index: u32,
    addr: Ipv6Addr,
    router: Ipv6Addr,
    host_mac: [u8; 6],
) -> Result<Vec<Missing>, NetlinkError> {
    let mut m = Vec::new();
    if !nl
        .addresses::<Ipv6Addr>()
        .await?
        .iter()
        .any(|(i, a, _)| *i == index && *a == addr)
    {
        nl.add_address(&plan.ep_iface, addr, 128).await?;
        m.push(Missing::Address6);
    }
    nl.replace_neighbour(&plan.ep_iface, router, host_mac)
        .await?;
    nl.replace_route(router, 128, &plan.ep_iface, None).await?;
    if !has_default6(nl, index, router).await? {
        nl.replace_route(Ipv6Addr::UNSPECIFIED, 0, &plan.ep_iface, Some(router))
            .await?;
        m.push(Missing::DefaultRoute6);
    }
    Ok(m)
}

/// Waits up to `timeout` until the endpoint interface has its IPv6
/// link-local address (the kernel adds it once the veth's carrier is
/// seen, shortly after both ends are up); whether it has one.
pub fn wait_link_local(plan: &Plan, timeout: std::time::Duration) -> Result<bool, PlumbingError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let has = in_netns(Some(&plan.netns), |nl| async move {
            let Some(index) = nl.link_index(&plan.ep_iface).await? else {
                return Ok(false);
            };
            Ok(nl
                .addresses::<Ipv6Addr>()
                .await?
                .iter()
                .any(|(i, a, _)| *i == index && a.is_unicast_link_local()))
        })?;
        if has || std::time::Instant::now() >= deadline {
            return Ok(has);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Removes what `owned` proves is the agent's: the host interface when it
/// is left outside, and the namespace (which takes the veth, both ends,
/// and the host routes with it). An object under those names that `owned`
/// does not prove is left as it is, and returned.
pub fn remove(plan: &Plan, owned: &Owned) -> Result<Vec<ForeignObject>, PlumbingError> {
    let found = ownership::observe(plan)?;
    let mut left = Vec::new();
    let mine = |f: Found| judge(Record::Current(owned), &f);
    if let Some(host) = found.host.clone() {
        match mine(Found {
            host: Some(host),
            ..Found::default()
        }) {
            Ok(_) => in_netns(
                None,
                |nl| async move { nl.delete_link(&plan.host_iface).await },
            )?,
            Err(e) => left.push(*e),
        }
    }
    if let Some(ns) = found.netns {
        match mine(Found {
            netns: Some(ns),
            ..Found::default()
        }) {
            Ok(_) => plan.netns.delete()?,
            Err(e) => left.push(*e),
        }
    }
    Ok(left)
}
