//! Address management for the health endpoint: the node's share of the
//! pod range, IPv4 (`--health-cidr`, minus its network, router and
//! broadcast addresses) and IPv6 (`--health-cidr6`, minus its network
//! (subnet-router anycast) and router addresses), and whatever is already in
//! use. Each family hands out its first free address, or keeps the one the
//! endpoint had before a restart.

use std::{collections::BTreeSet, net::Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::util::cidr::Cidr;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("no free address in {cidr}: {usable} usable, all in use or reserved")]
    Exhausted { cidr: IpNet, usable: u128 },
    #[error(
        "{cidr} is too small for the health endpoint: a prefix longer than /{} leaves no \
         room for a router and a host address",
        Ipv6Net::LONGEST_USABLE_PREFIX
    )]
    TooSmall6 { cidr: Ipv6Net },
    #[error(
        "{cidr} is too small for the health endpoint: a prefix longer than /30 leaves no \
         room for a router and a host address beside the network and broadcast ones"
    )]
    TooSmall4 { cidr: Ipv4Net },
    #[error("{cidr} cannot be a health CIDR: it overlaps {reserved} ({what})")]
    Reserved4 {
        cidr: Ipv4Net,
        reserved: Ipv4Net,
        what: &'static str,
    },
    #[error("{cidr} cannot be a health CIDR: it overlaps {reserved} ({what})")]
    Reserved6 {
        cidr: Ipv6Net,
        reserved: Ipv6Net,
        what: &'static str,
    },
}

/// A network the endpoint's addresses can come from: whether it can be
/// one at all (an IPv4 network too small for a host is found exhausted).
pub trait Pool: Cidr {
    fn check(self) -> Result<(), IpamError>;
}

impl Pool for Ipv4Net {
    fn check(self) -> Result<(), IpamError> {
        check4(self)
    }
}

/// IPv4 ranges no endpoint address may come from: no peer would take a
/// record naming one.
const RESERVED4: [([u8; 4], u8, &str); 5] = [
    ([0, 0, 0, 0], 8, "\"this network\" addresses"),
    ([127, 0, 0, 0], 8, "loopback addresses"),
    ([169, 254, 0, 0], 16, "link-local addresses"),
    ([224, 0, 0, 0], 4, "multicast addresses"),
    (
        [240, 0, 0, 0],
        4,
        "reserved addresses and the limited broadcast address",
    ),
];

/// Whether `cidr` can be an IPv4 health CIDR: room for a router and a host
/// beside its network and broadcast addresses (a /30 at most), and no
/// overlap with "this network", loopback, link-local, multicast or
/// reserved addresses.
///
/// # Errors
/// What keeps it from being one, naming it.
pub fn check4(cidr: Ipv4Net) -> Result<(), IpamError> {
    if cidr.prefix_len() > 30 {
        return Err(IpamError::TooSmall4 { cidr });
    }
    for (network, prefix, what) in RESERVED4 {
        let reserved = Ipv4Net::new_assert(network.into(), prefix);
        if reserved.contains(&cidr) || cidr.contains(&reserved) {
            return Err(IpamError::Reserved4 {
                cidr,
                reserved,
                what,
            });
        }
    }
    Ok(())
}

impl Pool for Ipv6Net {
    fn check(self) -> Result<(), IpamError> {
        check6(self)
    }
}

/// IPv6 ranges no endpoint address may come from.
const RESERVED6: [(u128, u8, &str); 4] = [
    (0, 96, "unspecified, loopback and IPv4-compatible addresses"),
    (0xffff_0000_0000, 96, "IPv4-mapped addresses"),
    (0xfe80 << 112, 10, "link-local addresses"),
    (0xff << 120, 8, "multicast addresses"),
];

/// Whether `cidr` can be an IPv6 health CIDR: room for a router and a host,
/// and no overlap with unspecified, loopback, IPv4-mapped, link-local or
/// multicast addresses.
pub fn check6(cidr: Ipv6Net) -> Result<(), IpamError> {
    if cidr.prefix_len() > Ipv6Net::LONGEST_USABLE_PREFIX {
        return Err(IpamError::TooSmall6 { cidr });
    }
    for (network, prefix, what) in RESERVED6 {
        let reserved = Ipv6Net::new_assert(Ipv6Addr::from_bits(network), prefix);
        if reserved.contains(&cidr) || cidr.contains(&reserved) {
            return Err(IpamError::Reserved6 {
                cidr,
                reserved,
                what,
            });
        }
    }
    Ok(())
}

/// Picks an address of `cidr` not in `in_use`. `previous` (the address the
/// endpoint had before a restart) is kept when it is still usable and free;
/// else the first free one.
pub fn allocate<N: Pool>(
    cidr: N,
    in_use: &BTreeSet<N::Addr>,
    previous: Option<N::Addr>,
) -> Result<N::Addr, IpamError> {
    cidr.check()?;
    if let Some(prev) = previous
        && cidr.is_usable(prev)
        && !in_use.contains(&prev)
    {
        return Ok(prev);
    }
    cidr.usable()
        .find(|a| !in_use.contains(a))
        .ok_or(IpamError::Exhausted {
            cidr: cidr.into(),
            usable: cidr.usable_count(),
        })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::util::cidr::parse;

    fn cidr(s: &str) -> Ipv4Net {
        parse(s).expect(s)
    }

    #[test]
    fn skips_network_router_broadcast_and_used() {
        let c = cidr("198.18.64.0/29");
        let all: Vec<_> = c.usable().collect();
        assert_eq!(all.first(), Some(&Ipv4Addr::new(198, 18, 64, 2)));
        assert_eq!(all.last(), Some(&Ipv4Addr::new(198, 18, 64, 6)));
        assert_eq!(all.len() as u128, c.usable_count());
        let used: BTreeSet<_> =
            [Ipv4Addr::new(198, 18, 64, 2), Ipv4Addr::new(198, 18, 64, 3)].into();
        assert_eq!(allocate(c, &used, None), Ok(Ipv4Addr::new(198, 18, 64, 4)));
    }

    #[test]
    fn keeps_the_previous_address_when_free() {
        let c = cidr("198.18.64.0/24");
        let prev = Ipv4Addr::new(198, 18, 64, 77);
        assert_eq!(allocate(c, &BTreeSet::new(), Some(prev)), Ok(prev));
        let taken: BTreeSet<_> = [prev].into();
        assert_eq!(
            allocate(c, &taken, Some(prev)),
            Ok(Ipv4Addr::new(198, 18, 64, 2))
        );
        // Outside the range (the CIDR changed): a fresh address.
        assert_eq!(
            allocate(c, &BTreeSet::new(), Some(Ipv4Addr::new(198, 19, 0, 9))),
            Ok(Ipv4Addr::new(198, 18, 64, 2))
        );
    }

    #[test]
    fn exhausted_ranges_name_the_cidr() {
        let c = cidr("198.18.64.0/30");
        let used: BTreeSet<_> = [Ipv4Addr::new(198, 18, 64, 2)].into();
        let err = allocate(c, &used, None).expect_err("full");
        assert_eq!(
            err.to_string(),
            "no free address in 198.18.64.0/30: 1 usable, all in use or reserved"
        );
        for tiny in ["198.18.64.0/31", "198.18.64.9/32"] {
            let err = allocate(cidr(tiny), &BTreeSet::new(), None)
                .expect_err(tiny)
                .to_string();
            assert!(err.contains(tiny) && err.contains("too small"), "{err}");
        }
    }

    #[test]
    fn ipv4_health_cidrs_hold_a_host_and_no_reserved_address() {
        assert_eq!(check4(cidr("198.18.64.0/30")), Ok(()));
        assert_eq!(check4(cidr("198.18.64.0/18")), Ok(()));
        for (bad, says) in [
            ("198.18.64.0/31", "too small"),
            ("127.0.0.0/24", "loopback"),
            ("224.0.0.0/24", "multicast"),
            ("169.254.1.0/24", "link-local"),
            ("0.0.0.0/0", "\"this network\""),
            ("240.0.0.0/24", "reserved"),
        ] {
            let err = check4(cidr(bad)).expect_err(bad).to_string();
            assert!(err.contains(bad) && err.contains(says), "{err}");
        }
    }

    fn cidr6(s: &str) -> Ipv6Net {
        parse(s).expect(s)
    }

    fn a6(s: &str) -> Ipv6Addr {
        s.parse().expect(s)
    }

    #[test]
    fn ipv6_first_usable_address_skipping_network_router_and_used() {
        let c = cidr6("2001:2:0:4::/64");
        assert_eq!(allocate(c, &BTreeSet::new(), None), Ok(a6("2001:2:0:4::2")));
        let used: BTreeSet<_> = [a6("2001:2:0:4::2"), a6("2001:2:0:4::3")].into();
        assert_eq!(allocate(c, &used, None), Ok(a6("2001:2:0:4::4")));
    }

    #[test]
    fn ipv6_keeps_the_previous_address_when_free() {
        let c = cidr6("2001:2:0:4::/64");
        let prev = a6("2001:2:0:4::77");
        assert_eq!(allocate(c, &BTreeSet::new(), Some(prev)), Ok(prev));
        let taken: BTreeSet<_> = [prev].into();
        assert_eq!(allocate(c, &taken, Some(prev)), Ok(a6("2001:2:0:4::2")));
        // Outside the range (the CIDR changed), or its router: a fresh one.
        for stale in ["2001:2:0:5::9", "2001:2:0:4::1", "2001:2:0:4::"] {
            assert_eq!(
                allocate(c, &BTreeSet::new(), Some(a6(stale))),
                Ok(a6("2001:2:0:4::2")),
                "{stale}"
            );
        }
    }

    #[test]
    fn ipv6_exhausted_too_small_and_reserved_ranges_are_refused_naming_the_cidr() {
        let c = cidr6("2001:2:0:4::/126");
        let used: BTreeSet<_> = [a6("2001:2:0:4::2"), a6("2001:2:0:4::3")].into();
        let err = allocate(c, &used, None).expect_err("full");
        assert_eq!(
            err.to_string(),
            "no free address in 2001:2:0:4::/126: 2 usable, all in use or reserved"
        );
        for tiny in ["2001:2:0:4::/127", "2001:2:0:4::9/128"] {
            let err = allocate(cidr6(tiny), &BTreeSet::new(), None)
                .expect_err(tiny)
                .to_string();
            assert!(err.contains(tiny) && err.contains("too small"), "{err}");
        }
        for (bad, needle) in [
            ("fe80::/64", "link-local"),
            ("ff02::/16", "multicast"),
            ("::ffff:0.0.0.0/96", "IPv4-mapped"),
            ("::/0", "unspecified"),
            ("::/127", "too small"),
            ("fe00::/7", "link-local"),
        ] {
            let err = allocate(cidr6(bad), &BTreeSet::new(), None)
                .expect_err(bad)
                .to_string();
            assert!(err.contains(bad) && err.contains(needle), "{bad}: {err}");
        }
        assert_eq!(check6(cidr6("2001:2:0:1::/64")), Ok(()));
    }
}
