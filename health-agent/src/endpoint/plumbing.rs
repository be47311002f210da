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

use std::net::Ipv6Addr;

use ipnet::{Ipv4Net, Ipv6Net};

use super::{
    ownership::{self, ForeignObject, Found, Owned, Record, judge},
    plan::{Assigned, Plan, PlumbingError},
};
use crate::{
    sys::netlink::{Netlink, NetlinkError, in_netns},
    sys::netns::Netns,
    sys::sysctl::write_in,
    util::cidr::{Cidr, Family},
};

/// What differs between the families in the plumbing: which piece is
/// missing when an address, a host route or a default route is.
trait Plumbed: Cidr {
    const ADDRESS: Missing;
    const HOST_ROUTE: Missing;
    const DEFAULT_ROUTE: Missing;
}

impl Plumbed for Ipv4Net {
    const ADDRESS: Missing = Missing::Address;
    const HOST_ROUTE: Missing = Missing::HostRoute;
    const DEFAULT_ROUTE: Missing = Missing::DefaultRoute;
}

impl Plumbed for Ipv6Net {
    const ADDRESS: Missing = Missing::Address6;
    const HOST_ROUTE: Missing = Missing::HostRoute6;
    const DEFAULT_ROUTE: Missing = Missing::DefaultRoute6;
}

/// The endpoint's address of one family and its router.
type Routed<A> = (A, A);

/// The address and router, when the endpoint has an address of `C`'s
/// family.
fn router<C: Cidr>(
    assigned: Option<Assigned<C>>,
) -> Result<Option<Routed<C::Addr>>, PlumbingError> {
    assigned
        .map(|v| {
            v.cidr
                .router()
                .map(|r| (v.addr, r))
                .ok_or(PlumbingError::NoRouter {
                    cidr: v.cidr.into(),
                    longest: C::LONGEST_USABLE_PREFIX,
                })
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
    let v4 = host_route_missing(nl, plan.v4, index).await?;
    let v6 = host_route_missing(nl, plan.v6, index).await?;
    Ok(v4.into_iter().chain(v6).collect())
}

/// Whether the node's route to the endpoint's address of `C`'s family,
/// out of `index`, is missing.
async fn host_route_missing<C: Plumbed>(
    nl: &Netlink,
    assigned: Option<Assigned<C>>,
    index: Option<u32>,
) -> Result<Option<Missing>, NetlinkError> {
    let Some(a) = assigned else {
        return Ok(None);
    };
    let there = index.is_some()
        && nl
            .routes::<C::Addr>()
            .await?
            .iter()
            .any(|r| r.destination == a.addr && r.prefix == C::MAX_PREFIX && r.oif == index);
    Ok((!there).then_some(C::HOST_ROUTE))
}

/// The node's route to the endpoint's address of `C`'s family, when
/// [`host_route_missing`] found it missing.
async fn add_host_route<C: Plumbed>(
    nl: &Netlink,
    plan: &Plan,
    assigned: Option<Assigned<C>>,
    missing: &[Missing],
) -> Result<(), NetlinkError> {
    match assigned {
        // Never over a route someone else made to the address.
        Some(a) if missing.contains(&C::HOST_ROUTE) => {
            nl.add_route_new(a.addr, C::MAX_PREFIX, &plan.host_iface)
                .await
        }
        _ => Ok(()),
    }
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
    let v4 = router(plan.v4)?;
    let v6 = router(plan.v6)?;
    let inside = in_netns(Some(&plan.netns), |nl| async move {
        let Some(index) = nl.link_index(&plan.ep_iface).await? else {
            return Ok(vec![Missing::EndpointInterface]);
        };
        let mut m = inside_missing::<Ipv4Net>(&nl, index, v4).await?;
        m.extend(inside_missing::<Ipv6Net>(&nl, index, v6).await?);
        Ok(m)
    })?;
    missing.extend(inside);
    Ok(missing)
}

/// What of the endpoint's own plumbing of `C`'s family is missing on
/// its interface `index`: its address and its default route via `router`.
async fn inside_missing<C: Plumbed>(
    nl: &Netlink,
    index: u32,
    planned: Option<Routed<C::Addr>>,
) -> Result<Vec<Missing>, NetlinkError> {
    let mut m = Vec::new();
    if let Some((addr, router)) = planned {
        if !has_address(nl, index, addr).await? {
            m.push(C::ADDRESS);
        }
        if !has_default(nl, index, router).await? {
            m.push(C::DEFAULT_ROUTE);
        }
    }
    Ok(m)
}

async fn has_address<A: Family>(nl: &Netlink, index: u32, addr: A) -> Result<bool, NetlinkError> {
    Ok(nl
        .addresses::<A>()
        .await?
        .iter()
        .any(|(i, a, _)| *i == index && *a == addr))
}

async fn has_default<A: Family>(nl: &Netlink, index: u32, router: A) -> Result<bool, NetlinkError> {
    Ok(nl
        .routes::<A>()
        .await?
        .iter()
        .any(|r| r.prefix == 0 && r.gateway == Some(router) && r.oif == Some(index)))
}

/// The veth: both ends must exist; a half (one end moved or deleted with
/// the other surviving) is removed and the pair recreated. Returns what it
/// made. The host end is removed only when it is the one `host_proven`
/// (its index) says the agent made: one put in its place since the
/// ownership was judged is left, and named.
fn ensure_veth(plan: &Plan, host_proven: Option<u32>) -> Result<Option<Missing>, PlumbingError> {
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
    if let Some(index) = host {
        if host_proven != Some(index) {
            return Err(PlumbingError::NotMine {
                iface: plan.host_iface.clone(),
                index,
                proven: host_proven.map_or_else(|| "none".to_owned(), |i| i.to_string()),
            });
        }
        in_netns(None, |nl| async move { nl.delete_link_index(index).await })?;
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
    Ok(Some(if host.is_none() {
        Missing::HostInterface
    } else {
        Missing::EndpointInterface
    }))
}

/// The `accept_dad` sysctl of `iface`, as a path under `/proc/sys` (where
/// a dot in an interface name stays a dot: only `sysctl`'s dotted names
/// write it as a slash).
fn accept_dad(iface: &str) -> String {
    format!("net/ipv6/conf/{iface}/accept_dad")
}

/// Turns duplicate address detection off on both ends of a veth just
/// made, before either is up: their link-local addresses (the node's
/// neighbour solicitations leave from the host end's) are then usable at
/// once instead of after a second of DAD.
fn without_dad(plan: &Plan) -> Result<(), PlumbingError> {
    if plan.v6.is_some() {
        write_in(None, &accept_dad(&plan.host_iface), "0")?;
        write_in(Some(&plan.netns), &accept_dad(&plan.ep_iface), "0")?;
    }
    Ok(())
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
    ensure_with(plan, None, |_| Ok::<_, PlumbingError>(()))
}

/// [`ensure`], calling `made` as soon as the namespace or the veth is
/// made, before anything else is done with it (the agent records them
/// there).
pub fn ensure_with<E: From<PlumbingError>>(
    plan: &Plan,
    host_proven: Option<u32>,
    mut made: impl FnMut(Made) -> Result<(), E>,
) -> Result<Vec<Missing>, E> {
    let mut out = Vec::new();
    if !plan.netns.exists() {
        Netns::create(&plan.netns_name).map_err(PlumbingError::from)?;
        made(Made::Namespace)?;
        out.push(Missing::Namespace);
    }
    if let Some(m) = ensure_veth(plan, host_proven)? {
        // Recorded before anything else can fail: a veth the record does
        // not prove would be taken for someone else's from then on.
        made(Made::Veth)?;
        without_dad(plan)?;
        out.push(m);
    }
    out.extend(ensure_addressing(plan)?);
    Ok(out)
}

/// Everything on top of the namespace and the veth.
fn ensure_addressing(plan: &Plan) -> Result<Vec<Missing>, PlumbingError> {
    let mut made = Vec::new();
    let v4 = router(plan.v4)?;
    let v6 = router(plan.v6)?;
    let (host_mac, host_made) = in_netns(None, |nl| async move {
        nl.set_up(&plan.host_iface).await?;
        let index = nl.require_link(&plan.host_iface).await?;
        let missing = host_routes_missing(&nl, plan, Some(index)).await?;
        add_host_route(&nl, plan, plan.v4, &missing).await?;
        add_host_route(&nl, plan, plan.v6, &missing).await?;
        Ok((nl.link_l2(&plan.host_iface).await?.1, missing))
    })?;
    made.extend(host_made);
    let inside = in_netns(Some(&plan.netns), |nl| async move {
        let mut m = Vec::new();
        nl.set_up("lo").await?;
        nl.set_up(&plan.ep_iface).await?;
        let index = nl.require_link(&plan.ep_iface).await?;
        if let Some(planned) = v4 {
            m.extend(ensure_inside::<Ipv4Net>(&nl, plan, index, planned, host_mac).await?);
        }
        if let Some(planned) = v6 {
            m.extend(ensure_inside::<Ipv6Net>(&nl, plan, index, planned, host_mac).await?);
        }
        Ok(m)
    })?;
    made.extend(inside);
    Ok(made)
}

/// The endpoint's address of `C`'s family (IPv6's `nodad`: usable at
/// once), its router neighbour and routes.
async fn ensure_inside<C: Plumbed>(
    nl: &Netlink,
    plan: &Plan,
    index: u32,
    (addr, router): Routed<C::Addr>,
    host_mac: [u8; 6],
) -> Result<Vec<Missing>, NetlinkError> {
    let mut m = Vec::new();
    if !has_address(nl, index, addr).await? {
        nl.add_address(&plan.ep_iface, addr, C::MAX_PREFIX).await?;
        m.push(C::ADDRESS);
    }
    // The MAC changes whenever the veth is recreated: always refresh.
    nl.replace_neighbour(&plan.ep_iface, router, host_mac)
        .await?;
    nl.replace_route(router, C::MAX_PREFIX, &plan.ep_iface, None)
        .await?;
    if !has_default(nl, index, router).await? {
        nl.replace_route(C::Addr::UNSPECIFIED, 0, &plan.ep_iface, Some(router))
            .await?;
        m.push(C::DEFAULT_ROUTE);
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
        // By the index judged, not the name: a link made under the name
        // since is not taken for the one proven.
        let index = host.link.ifindex;
        match mine(Found {
            host: Some(host),
            ..Found::default()
        }) {
            Ok(_) => in_netns(None, |nl| async move { nl.delete_link_index(index).await })?,
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
