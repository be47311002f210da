//! The endpoint's network plumbing, through netlink:
//!
//! ```text
//!  node namespace                     endpoint namespace (default "health")
//!  lxc_health  <------- veth ------->  eth0  198.18.x.y/32
//!  route x.y/32 dev lxc_health         lo up
//!                                      neigh <router> lladdr <lxc_health MAC> PERMANENT
//!                                      route <router>/32 dev eth0 scope link
//!                                      default via <router> dev eth0 onlink
//! ```
//!
//! The router address (first host of the CIDR) is never configured anywhere:
//! the static neighbour entry sends everything the endpoint emits to the host
//! side of the veth, where the node routes it. Every step is idempotent, so
//! the same [`ensure`] creates, restores and repairs.

use std::net::Ipv4Addr;

use crate::{
    sys::netlink::{NetlinkError, in_netns},
    sys::netns::{Netns, NetnsError},
    util::cidr::Ipv4Cidr,
};

/// Everything that describes the endpoint's plumbing.
#[derive(Debug, Clone)]
pub struct Plan {
    pub netns: Netns,
    pub netns_name: String,
    pub host_iface: String,
    pub ep_iface: String,
    pub ipv4: Ipv4Addr,
    pub cidr: Ipv4Cidr,
}

#[derive(Debug, thiserror::Error)]
pub enum PlumbingError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{cidr} has no router address (a /31 or /32 leaves no room for one)")]
    NoRouter { cidr: Ipv4Cidr },
}

impl Plan {
    fn router(&self) -> Result<Ipv4Addr, PlumbingError> {
        self.cidr
            .router()
            .ok_or(PlumbingError::NoRouter { cidr: self.cidr })
    }
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
            Self::Programs => "programs",
            Self::EchoReply => "echo reply",
        }
    }
}

/// Read-only check of the plumbing; empty when everything is in place.
pub fn inspect(plan: &Plan) -> Result<Vec<Missing>, PlumbingError> {
    let mut missing = Vec::new();
    if !plan.netns.exists() {
        missing.push(Missing::Namespace);
    }
    let (host_index, host_route) = in_netns(None, |nl| async move {
        let index = nl.link_index(&plan.host_iface).await?;
        let table = nl.routes_v4().await?;
        let route = table.iter().any(|r| {
            r.destination == plan.ipv4 && r.prefix == 32 && r.oif == index && index.is_some()
        });
        Ok((index, route))
    })?;
    if host_index.is_none() {
        missing.push(Missing::HostInterface);
    }
    if !host_route {
        missing.push(Missing::HostRoute);
    }
    if missing.contains(&Missing::Namespace) {
        return Ok(missing);
    }
    let router = plan.router()?;
    let inside = in_netns(Some(&plan.netns), |nl| async move {
        let mut m = Vec::new();
        let Some(index) = nl.link_index(&plan.ep_iface).await? else {
            return Ok(vec![Missing::EndpointInterface]);
        };
        let addrs = nl.addresses_v4().await?;
        if !addrs.iter().any(|(i, a, _)| *i == index && *a == plan.ipv4) {
            m.push(Missing::Address);
        }
        let table = nl.routes_v4().await?;
        if !table
            .iter()
            .any(|r| r.prefix == 0 && r.gateway == Some(router) && r.oif == Some(index))
        {
            m.push(Missing::DefaultRoute);
        }
        Ok(m)
    })?;
    missing.extend(inside);
    Ok(missing)
}

/// Creates whatever is missing; returns what it had to create.
pub fn ensure(plan: &Plan) -> Result<Vec<Missing>, PlumbingError> {
    let mut made = Vec::new();
    if !plan.netns.exists() {
        Netns::create(&plan.netns_name)?;
        made.push(Missing::Namespace);
    }
    // The veth: both ends must exist; a half (one end moved or deleted
    // with the other surviving) is removed and the pair recreated.
    let host = in_netns(
        None,
        |nl| async move { nl.link_index(&plan.host_iface).await },
    )?;
    let ep = in_netns(Some(&plan.netns), |nl| async move {
        nl.link_index(&plan.ep_iface).await
    })?;
    if host.is_none() || ep.is_none() {
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
        made.push(if host.is_none() {
            Missing::HostInterface
        } else {
            Missing::EndpointInterface
        });
    }
    let router = plan.router()?;
    let host_mac = in_netns(None, |nl| async move {
        nl.set_up(&plan.host_iface).await?;
        let table = nl.routes_v4().await?;
        let index = nl.require_link(&plan.host_iface).await?;
        if !table
            .iter()
            .any(|r| r.destination == plan.ipv4 && r.prefix == 32 && r.oif == Some(index))
        {
            nl.replace_route(plan.ipv4, 32, &plan.host_iface, None)
                .await?;
        }
        Ok(nl.link_l2(&plan.host_iface).await?.1)
    })?;
    let inside = in_netns(Some(&plan.netns), |nl| async move {
        let mut m = Vec::new();
        nl.set_up("lo").await?;
        nl.set_up(&plan.ep_iface).await?;
        let index = nl.require_link(&plan.ep_iface).await?;
        if !nl
            .addresses_v4()
            .await?
            .iter()
            .any(|(i, a, _)| *i == index && *a == plan.ipv4)
        {
            nl.add_address(&plan.ep_iface, plan.ipv4, 32).await?;
            m.push(Missing::Address);
        }
        // The MAC changes whenever the veth is recreated: always refresh.
        nl.replace_neighbour(&plan.ep_iface, router, host_mac)
            .await?;
        nl.replace_route(router, 32, &plan.ep_iface, None).await?;
        let table = nl.routes_v4().await?;
        if !table
            .iter()
            .any(|r| r.prefix == 0 && r.gateway == Some(router) && r.oif == Some(index))
        {
            nl.replace_route(Ipv4Addr::UNSPECIFIED, 0, &plan.ep_iface, Some(router))
                .await?;
            m.push(Missing::DefaultRoute);
        }
        Ok(m)
    })?;
    made.extend(inside);
    Ok(made)
}

/// Removes the endpoint: its namespace (which takes the veth, both ends,
/// and the host route with it) and a host interface left outside.
pub fn remove(plan: &Plan) -> Result<(), PlumbingError> {
    let host = in_netns(
        None,
        |nl| async move { nl.link_index(&plan.host_iface).await },
    )?;
    if host.is_some() {
        in_netns(
            None,
            |nl| async move { nl.delete_link(&plan.host_iface).await },
        )?;
    }
    plan.netns.delete()?;
    Ok(())
}
