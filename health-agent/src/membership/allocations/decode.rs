//! An allocation's value: the health CIDRs and node addresses an admin gave
//! one node, checked alone against the cluster's health ranges.

use crate::util::text::clip;
use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Deserialize;

use crate::membership::{record::LocalNode, validate::address_class};

/// The largest value read as an allocation: one is under 200 bytes.
pub const MAX_ALLOCATION_BYTES: usize = 512;

/// An allocation as it is written in etcd: exactly these fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllocationRecord {
    #[serde(default)]
    health_cidr: Option<String>,
    #[serde(default)]
    health_cidr6: Option<String>,
    #[serde(default)]
    node_ip: Option<String>,
    #[serde(default)]
    node_ip6: Option<String>,
}

/// The health CIDRs allocated to one node, and the node addresses that
/// are its alone where the admin named them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allocation {
    pub cidr: Option<Ipv4Net>,
    pub cidr6: Option<Ipv6Net>,
    pub node_ip: Option<Ipv4Addr>,
    pub node_ip6: Option<Ipv6Addr>,
}

/// The health CIDRs, as a health address outside them is told.
impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.cidr, self.cidr6) {
            (Some(c), Some(c6)) => write!(f, "{c} and {c6}"),
            (Some(c), None) => write!(f, "{c}"),
            (None, Some(c6)) => write!(f, "{c6}"),
            (None, None) => f.write_str("no health CIDR"),
        }
    }
}

/// A network as written: `198.18.64.0/24`, never `198.18.64.9/24`.
fn network<N: FromStr + Copy + PartialEq + fmt::Display>(
    text: &str,
    field: &str,
    trunc: impl Fn(N) -> N,
) -> Result<N, String> {
    let net: N = text
        .parse()
        .map_err(|_| format!("{field} {:?} is not a CIDR", clip(text, 64)))?;
    if trunc(net) != net {
        return Err(format!(
            "{field} {net} is not a network (its network is {})",
            trunc(net)
        ));
    }
    Ok(net)
}

/// An address of the family asked, as written.
fn address<A: FromStr>(text: &str, field: &str, family: &str) -> Result<A, String> {
    text.parse()
        .map_err(|_| format!("{field} {:?} is not an {family} address", clip(text, 64)))
}

/// A node address is one a record may hold, and never a health address:
/// not inside the cluster's health range of its family, nor the
/// allocation's own health CIDR.
fn outside_health<N: fmt::Display>(
    (field, ip): (&str, IpAddr),
    range: Option<(N, &str)>,
    own: Option<(N, &str)>,
    contains: impl Fn(&N) -> bool,
) -> Result<(), String> {
    if let Some(class) = address_class(ip) {
        return Err(format!("{field} {ip} is {class}, which no node may hold"));
    }
    if let Some((range, flag)) = range.filter(|(r, _)| contains(r)) {
        return Err(format!(
            "{field} {ip} is inside the cluster's health range {range} ({flag}), which holds health addresses"
        ));
    }
    if let Some((cidr, cidr_field)) = own.filter(|(c, _)| contains(c)) {
        return Err(format!(
            "{field} {ip} is inside the allocation's own {cidr_field} {cidr}"
        ));
    }
    Ok(())
}

impl Allocation {
    /// The allocation a value says, checked against the cluster's health
    /// ranges in `local`; why not, in a sentence.
    ///
    /// # Errors
    /// The value is too large, does not decode, allocates nothing, or a
    /// CIDR is not a network or lies outside its family's health range, or
    /// a node address is not one or lies inside a health CIDR or range.
    pub fn decode(value: &[u8], local: &LocalNode) -> Result<Self, String> {
        if value.len() > MAX_ALLOCATION_BYTES {
            return Err(format!(
                "the value is {} bytes, more than an allocation's {MAX_ALLOCATION_BYTES}",
                value.len()
            ));
        }
        let record: AllocationRecord = serde_json::from_slice(value)
            .map_err(|e| clip(&format!("the value is not an allocation: {e}"), 256))?;
        let a = Self {
            cidr: record
                .health_cidr
                .as_deref()
                .map(|t| network(t, "health_cidr", |n: Ipv4Net| n.trunc()))
                .transpose()?,
            cidr6: record
                .health_cidr6
                .as_deref()
                .map(|t| network(t, "health_cidr6", |n: Ipv6Net| n.trunc()))
                .transpose()?,
            node_ip: record
                .node_ip
                .as_deref()
                .map(|t| address(t, "node_ip", "IPv4"))
                .transpose()?,
            node_ip6: record
                .node_ip6
                .as_deref()
                .map(|t| address(t, "node_ip6", "IPv6"))
                .transpose()?,
        };
        if a == Self::default() {
            return Err("it allocates nothing: an allocation has health_cidr, health_cidr6, node_ip or node_ip6".into());
        }
        a.within(local)?;
        Ok(a)
    }

    /// The CIDRs inside their families' health ranges, the node addresses
    /// outside them and outside the CIDRs.
    fn within(&self, local: &LocalNode) -> Result<(), String> {
        if let (Some(c), Some(range)) = (self.cidr, local.health_range)
            && !range.contains(&c)
        {
            return Err(format!(
                "health_cidr {c} is outside the cluster's health range {range} (--health-range)"
            ));
        }
        if let (Some(c), Some(range)) = (self.cidr6, local.health_range6)
            && !range.contains(&c)
        {
            return Err(format!(
                "health_cidr6 {c} is outside the cluster's health range {range} (--health-range6)"
            ));
        }
        if let Some(ip) = self.node_ip {
            outside_health(
                ("node_ip", IpAddr::V4(ip)),
                local.health_range.map(|r| (r, "--health-range")),
                self.cidr.map(|c| (c, "health_cidr")),
                |n: &Ipv4Net| n.contains(&ip),
            )?;
        }
        if let Some(ip) = self.node_ip6 {
            outside_health(
                ("node_ip6", IpAddr::V6(ip)),
                local.health_range6.map(|r| (r, "--health-range6")),
                self.cidr6.map(|c| (c, "health_cidr6")),
                |n: &Ipv6Net| n.contains(&ip),
            )?;
        }
        Ok(())
    }

    /// The node addresses a refused value still names: `node_ip` and
    /// `node_ip6` where the value is JSON within the size and they read
    /// as addresses of their family that a node may hold, outside the
    /// cluster's health ranges and the value's own CIDRs. No node but the allocation's may hold
    /// them while it stands: an admin's slip elsewhere in the value must
    /// not leave the address it names to the first node that claims it.
    #[must_use]
    pub fn named_by_refused(value: &[u8], local: &LocalNode) -> Vec<IpAddr> {
        if value.len() > MAX_ALLOCATION_BYTES {
            return Vec::new();
        }
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(value) else {
            return Vec::new();
        };
        let text = |field: &str| fields.get(field).and_then(serde_json::Value::as_str);
        // Inside the cluster's range or the value's own CIDR, the address
        // is itself the slip.
        let cidr = text("health_cidr").and_then(|t| t.parse::<Ipv4Net>().ok());
        let cidr6 = text("health_cidr6").and_then(|t| t.parse::<Ipv6Net>().ok());
        let v4 = text("node_ip")
            .and_then(|t| t.parse::<Ipv4Addr>().ok())
            .filter(|ip| !local.health_range.is_some_and(|r| r.contains(ip)))
            .filter(|ip| !cidr.is_some_and(|c| c.contains(ip)))
            .map(IpAddr::V4);
        let v6 = text("node_ip6")
            .and_then(|t| t.parse::<Ipv6Addr>().ok())
            .filter(|ip| !local.health_range6.is_some_and(|r| r.contains(ip)))
            .filter(|ip| !cidr6.is_some_and(|c| c.contains(ip)))
            .map(IpAddr::V6);
        [v4, v6]
            .into_iter()
            .flatten()
            .filter(|&ip| address_class(ip).is_none())
            .collect()
    }

    /// The node addresses named, of either family.
    pub(super) fn node_addresses(&self) -> impl Iterator<Item = IpAddr> {
        [self.node_ip.map(IpAddr::V4), self.node_ip6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
    }
}
