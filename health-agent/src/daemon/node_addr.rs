//! This node's own addresses for its etcd record: given by `--node-ip` and
//! `--node-ip6`, or found the way the kernel would reach etcd.
//!
//! A family is looked up only when the endpoint has an address of it (a
//! record pairs a node address with a health address). With several etcd
//! endpoints, the first that resolves and is routed to gives it. IPv4: the
//! source address toward etcd. IPv6: the source address toward etcd when etcd is
//! reached over IPv6, otherwise a global IPv6 address of the interface that
//! holds the IPv4 node address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs as _, UdpSocket};

use crate::sys::netlink::in_netns;

/// Why a node address could not be found.
#[derive(Debug, thiserror::Error)]
pub enum NodeAddrError {
    #[error("resolving the etcd endpoint {endpoint:?}")]
    Resolve {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("finding this node's {family} address toward {endpoint}: give it with --{flag}")]
    NoSource {
        family: &'static str,
        flag: &'static str,
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "this node has no global IPv6 address on the interface of {node_ip}: give it with --node-ip6"
    )]
    NoIpv6 { node_ip: Ipv4Addr },
    #[error("listing the node's addresses")]
    Netlink(#[from] crate::sys::netlink::NetlinkError),
    #[error(
        "this node's address {ip} ({how}) is {class}: every agent, this one included, would refuse its record; give a routable one with --{flag}"
    )]
    Unusable {
        ip: IpAddr,
        how: String,
        class: &'static str,
        flag: &'static str,
    },
}

/// What is known before the lookup.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wanted {
    /// `--node-ip`, `--node-ip6`.
    pub node_ip: Option<Ipv4Addr>,
    pub node_ip6: Option<Ipv6Addr>,
    /// Whether the endpoint has an address of each family.
    pub v4: bool,
    pub v6: bool,
}

/// This node's IPv4 and IPv6 addresses, for the families it needs,
/// found toward the etcd `endpoints` (`host:port` each), each one a node
/// address peers accept (not loopback, link-local, ...: etcd on the node
/// itself is reached from loopback).
pub fn resolve(
    endpoints: &[String],
    wanted: Wanted,
) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), NodeAddrError> {
    let (v4, v6) = found(endpoints, wanted)?;
    let usable = |ip: Option<IpAddr>, given: bool, flag| match ip
        .and_then(|ip| crate::membership::validate::address_class(ip).map(|c| (ip, c)))
    {
        Some((ip, class)) => Err(NodeAddrError::Unusable {
            ip,
            how: if given {
                format!("given by --{flag}")
            } else {
                format!("found toward etcd at {}", endpoints.join(", "))
            },
            class,
            flag,
        }),
        None => Ok(()),
    };
    usable(v4.map(IpAddr::V4), wanted.node_ip.is_some(), "node-ip")?;
    usable(v6.map(IpAddr::V6), wanted.node_ip6.is_some(), "node-ip6")?;
    Ok((v4, v6))
}

/// [`resolve`]'s addresses, whatever their class.
fn found(
    endpoints: &[String],
    wanted: Wanted,
) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), NodeAddrError> {
    let mut targets: Vec<SocketAddr> = Vec::new();
    let mut unresolved = None;
    for endpoint in endpoints {
        match endpoint.to_socket_addrs() {
            Ok(found) => targets.extend(found),
            Err(source) => {
                unresolved.get_or_insert(NodeAddrError::Resolve {
                    endpoint: endpoint.clone(),
                    source,
                });
            }
        }
    }
    if let (true, Some(err)) = (targets.is_empty(), unresolved) {
        return Err(err);
    }
    let endpoint = endpoints.join(",");
    let endpoint = endpoint.as_str();
    // The source toward the first target of the family that has one.
    let toward = |v6: bool| -> Option<std::io::Result<IpAddr>> {
        let mut last = None;
        for t in targets.iter().copied().filter(|t| t.is_ipv6() == v6) {
            match source_toward(t) {
                Ok(ip) => return Some(Ok(ip)),
                Err(e) => last = Some(Err(e)),
            }
        }
        last
    };
    let no_source = |family, flag| {
        move |source| NodeAddrError::NoSource {
            family,
            flag,
            endpoint: endpoint.to_owned(),
            source,
        }
    };
    let v4 = match (wanted.v4, wanted.node_ip) {
        (false, _) => None,
        (true, Some(ip)) => Some(ip),
        (true, None) => {
            let found = toward(false).ok_or_else(|| {
                no_source("IPv4", "node-ip")(std::io::Error::other("etcd has no IPv4 address"))
            })?;
            match found.map_err(no_source("IPv4", "node-ip"))? {
                IpAddr::V4(ip) => Some(ip),
                IpAddr::V6(_) => None,
            }
        }
    };
    let v6 = match (wanted.v6, wanted.node_ip6) {
        (false, _) => None,
        (true, Some(ip)) => Some(ip),
        (true, None) => match (toward(true), v4) {
            (Some(found), _) => match found.map_err(no_source("IPv6", "node-ip6"))? {
                IpAddr::V6(ip) => Some(ip),
                IpAddr::V4(_) => None,
            },
            (None, Some(node_ip)) => Some(global_ipv6_beside(node_ip)?),
            (None, None) => {
                return Err(no_source("IPv6", "node-ip6")(std::io::Error::other(
                    "etcd has no IPv6 address",
                )));
            }
        },
    };
    Ok((v4, v6))
}

/// The local address the kernel would use toward `target`.
fn source_toward(target: SocketAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(any)?;
    sock.connect(target)?;
    let ip = sock.local_addr()?.ip();
    if ip.is_unspecified() {
        return Err(std::io::Error::other(format!(
            "no source address toward {target}"
        )));
    }
    Ok(ip)
}

/// A global IPv6 address of the interface holding `node_ip`.
fn global_ipv6_beside(node_ip: Ipv4Addr) -> Result<Ipv6Addr, NodeAddrError> {
    let (v4, v6) = in_netns(None, |nl| async move {
        Ok((
            nl.addresses::<Ipv4Addr>().await?,
            nl.addresses::<Ipv6Addr>().await?,
        ))
    })?;
    let index = v4
        .iter()
        .find(|(_, ip, _)| *ip == node_ip)
        .map(|(i, _, _)| *i)
        .ok_or(NodeAddrError::NoIpv6 { node_ip })?;
    v6.into_iter()
        .filter(|(i, _, _)| *i == index)
        .map(|(_, ip, _)| ip)
        .find(|ip| is_global(*ip))
        .ok_or(NodeAddrError::NoIpv6 { node_ip })
}

/// Neither link-local, loopback, multicast nor unspecified.
fn is_global(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 != 0xfe80
        && !ip.is_loopback()
        && !ip.is_multicast()
        && !ip.is_unspecified()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_addresses_are_used_and_unwanted_families_skipped() {
        let wanted = Wanted {
            node_ip: Some(Ipv4Addr::new(198, 18, 0, 11)),
            node_ip6: Some("2001:2::11".parse().expect("ip")),
            v4: true,
            v6: false,
        };
        assert_eq!(
            resolve(&one("127.0.0.1:2379"), wanted).expect("resolve"),
            (Some(Ipv4Addr::new(198, 18, 0, 11)), None)
        );
        let v6_only = Wanted {
            v4: false,
            v6: true,
            ..wanted
        };
        assert_eq!(
            resolve(&one("127.0.0.1:2379"), v6_only).expect("resolve"),
            (None, Some("2001:2::11".parse().expect("ip")))
        );
    }

    #[test]
    fn the_source_toward_etcd_is_found_and_missing_families_are_named() {
        let source = found(
            &one("127.0.0.1:2379"),
            Wanted {
                v4: true,
                ..Wanted::default()
            },
        )
        .expect("loopback");
        assert_eq!(source, (Some(Ipv4Addr::LOCALHOST), None));
        let err = resolve(
            &one("127.0.0.1:2379"),
            Wanted {
                v6: true,
                ..Wanted::default()
            },
        )
        .expect_err("no IPv6 toward an IPv4 etcd without an IPv4 node address");
        assert!(err.to_string().contains("--node-ip6"), "{err}");
        let err = resolve(&one("not an endpoint"), Wanted::default()).expect_err("bad");
        assert!(err.to_string().contains("not an endpoint"), "{err}");
    }

    #[test]
    fn with_several_endpoints_one_that_resolves_is_enough() {
        let v4 = Wanted {
            v4: true,
            ..Wanted::default()
        };
        let endpoints = ["not an endpoint".to_owned(), "127.0.0.2:2379".to_owned()];
        assert_eq!(
            found(&endpoints, v4).expect("the second one"),
            (Some(Ipv4Addr::LOCALHOST), None)
        );
        let err = resolve(
            &["not an endpoint".to_owned(), "nor this one".to_owned()],
            v4,
        )
        .expect_err("none resolves");
        assert!(err.to_string().contains("not an endpoint"), "{err}");
    }

    /// An address peers would refuse is refused at start, naming how it
    /// was had and the flag that gives another: found toward an etcd on
    /// the node itself (loopback), or given.
    #[test]
    fn an_address_peers_would_refuse_is_refused_naming_its_flag() {
        let v4 = Wanted {
            v4: true,
            ..Wanted::default()
        };
        let err = resolve(&one("127.0.0.1:2379"), v4)
            .expect_err("loopback")
            .to_string();
        assert!(
            err.contains("127.0.0.1 (found toward etcd at 127.0.0.1:2379) is loopback")
                && err.contains("--node-ip"),
            "{err}"
        );
        let given = Wanted {
            node_ip: Some(Ipv4Addr::new(169, 254, 1, 1)),
            ..v4
        };
        let err = resolve(&one("127.0.0.1:2379"), given)
            .expect_err("link-local")
            .to_string();
        assert!(
            err.contains("given by --node-ip") && err.contains("link-local"),
            "{err}"
        );
        let mapped = Wanted {
            node_ip6: Some("::ffff:198.18.0.11".parse().expect("ip")),
            v6: true,
            ..Wanted::default()
        };
        let err = resolve(&one("127.0.0.1:2379"), mapped)
            .expect_err("mapped")
            .to_string();
        assert!(
            err.contains("IPv4-mapped") && err.contains("--node-ip6"),
            "{err}"
        );
    }

    fn one(endpoint: &str) -> Vec<String> {
        vec![endpoint.to_owned()]
    }

    #[test]
    fn global_means_routable() {
        assert!(is_global("2001:2::1".parse().expect("ip")));
        assert!(!is_global("fe80::1".parse().expect("ip")));
        assert!(!is_global("::1".parse().expect("ip")));
    }
}
