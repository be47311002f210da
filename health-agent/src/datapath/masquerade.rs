//! Masquerade settings: what the uplink programs need (node IP, uplink,
//! sources, health range, port range), resolved and checked at start so a
//! bad flag fails the agent with its name instead of breaking flows later.

use std::{fmt, net::Ipv4Addr, str::FromStr};

use health_common::nat::NatConfig;
use ipnet::Ipv4Net;

use crate::sys::netlink::{NetlinkError, in_netns};

/// Where masquerade runs and what it does; `None` in routed mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masquerade {
    pub uplink: String,
    pub config: NatConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum MasqueradeError {
    #[error(
        "masquerade needs this node's IP: give --node-ip, or list this node ({name}) in the nodes file"
    )]
    NoNodeIp { name: String },
    #[error("no interface of this node holds the node IP {ip}: give --uplink")]
    NoUplink { ip: Ipv4Addr },
    #[error("the health CIDR {cidr} is not inside the health range {range} (--health-range)")]
    CidrOutsideRange { cidr: Ipv4Net, range: Ipv4Net },
    #[error(
        "NAT port range {ports} overlaps the node's local port range {local} \
         (net.ipv4.ip_local_port_range): the node's own connections could take \
         a masqueraded flow's port; choose --nat-port-range outside it"
    )]
    Overlap { ports: PortRange, local: PortRange },
    #[error("reading {path}")]
    Read {
        path: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// An inclusive range of ports, written `MIN-MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub min: u16,
    pub max: u16,
}

impl PortRange {
    /// The default: above Linux's default local port range (32768-60999).
    pub const DEFAULT: Self = Self {
        min: 61_000,
        max: 65_535,
    };

    #[must_use]
    pub const fn overlaps(self, other: Self) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (lo, hi) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?}: expected MIN-MAX, e.g. 61000-65535"))?;
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{s:?}: {p:?} is not a port (1-65535)"))
        };
        let (min, max) = (port(lo)?, port(hi)?);
        if min > max {
            return Err(format!("{s:?}: MIN is above MAX"));
        }
        Ok(Self { min, max })
    }
}

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct Request {
    pub node_ip: Ipv4Addr,
    pub uplink: Option<String>,
    pub health_cidr: Ipv4Net,
    pub health_range: Ipv4Net,
    pub ports: PortRange,
}

/// Checks `req` against this node (run in the node's namespace): the range
/// holds the CIDR, the uplink exists (or is the interface holding the node
/// IP), and the port range stays clear of the node's own local ports.
pub fn resolve(req: &Request) -> Result<Masquerade, MasqueradeError> {
    if !req.health_range.contains(&req.health_cidr) {
        return Err(MasqueradeError::CidrOutsideRange {
            cidr: req.health_cidr,
            range: req.health_range,
        });
    }
    let local = local_port_range()?;
    if req.ports.overlaps(local) {
        return Err(MasqueradeError::Overlap {
            ports: req.ports,
            local,
        });
    }
    let uplink = match &req.uplink {
        Some(name) => {
            let n = name.clone();
            in_netns(None, |nl| async move { nl.require_link(&n).await })?;
            name.clone()
        }
        None => uplink_holding(req.node_ip)?,
    };
    Ok(Masquerade {
        uplink,
        config: config(req),
    })
}

/// The kernel programs' view of `req`.
#[must_use]
pub fn config(req: &Request) -> NatConfig {
    NatConfig {
        enabled: 1,
        node_ip: req.node_ip.octets(),
        src_net: req.health_cidr.network().octets(),
        src_mask: mask(req.health_cidr.prefix_len()),
        exclude_net: req.health_range.network().octets(),
        exclude_mask: mask(req.health_range.prefix_len()),
        port_min: req.ports.min,
        port_max: req.ports.max,
    }
}

fn mask(prefix: u8) -> [u8; 4] {
    u32::MAX
        .checked_shl(32 - u32::from(prefix))
        .unwrap_or(0)
        .to_be_bytes()
}

/// `net.ipv4.ip_local_port_range` of this namespace.
fn local_port_range() -> Result<PortRange, MasqueradeError> {
    crate::sys::sysctl::local_port_range()
        .map(|(min, max)| PortRange { min, max })
        .map_err(|source| MasqueradeError::Read {
            path: crate::sys::sysctl::LOCAL_PORT_RANGE,
            source,
        })
}

fn uplink_holding(ip: Ipv4Addr) -> Result<String, MasqueradeError> {
    let name = in_netns(None, |nl| async move {
        let Some((index, _, _)) = nl
            .addresses::<Ipv4Addr>()
            .await?
            .into_iter()
            .find(|(_, a, _)| *a == ip)
        else {
            return Ok(None);
        };
        nl.link_name(index).await
    })?;
    name.ok_or(MasqueradeError::NoUplink { ip })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_and_name_the_bad_part() {
        assert_eq!("61000-65535".parse::<PortRange>(), Ok(PortRange::DEFAULT));
        for (bad, says) in [
            ("61000", "expected MIN-MAX"),
            ("0-10", "\"0\" is not a port"),
            ("1-70000", "\"70000\" is not a port"),
            ("20-10", "MIN is above MAX"),
        ] {
            let e = bad.parse::<PortRange>().expect_err(bad);
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn overlap_is_inclusive() {
        let local = PortRange {
            min: 32_768,
            max: 60_999,
        };
        assert!(!PortRange::DEFAULT.overlaps(local));
        assert!(
            PortRange {
                min: 60_999,
                max: 61_000
            }
            .overlaps(local)
        );
        assert!(
            PortRange {
                min: 1,
                max: 32_768
            }
            .overlaps(local)
        );
    }

    #[test]
    fn config_carries_masks_and_ports() {
        let req = Request {
            node_ip: Ipv4Addr::new(198, 18, 0, 11),
            uplink: None,
            health_cidr: "198.18.64.0/24".parse().expect("cidr"),
            health_range: "198.18.64.0/18".parse().expect("cidr"),
            ports: PortRange::DEFAULT,
        };
        let c = config(&req);
        assert_eq!(c.src_mask, [255, 255, 255, 0]);
        assert_eq!(c.exclude_mask, [255, 255, 192, 0]);
        assert!(c.masquerades([198, 18, 64, 2], [198, 18, 0, 12]));
        assert!(!c.masquerades([198, 18, 64, 2], [198, 18, 100, 2]));
        assert_eq!(mask(0), [0; 4]);
        assert_eq!(mask(32), [255; 4]);
    }
}
