//! Networks in CIDR notation are `ipnet`'s [`Ipv4Net`] (`198.18.64.0/24`:
//! the health CIDR of a node, the cluster's health range, a node record's
//! `health-cidr`) and [`Ipv6Net`] (`2001:2:0:1::/64`: the node's
//! `--health-cidr6`). What `ipnet` does not do is here, once for both
//! families: a network given by a user or read from a file has no host
//! bits (`198.18.64.1/24` is refused, naming `198.18.64.0/24`), and the
//! endpoint's view of a network: its router and the addresses it may have.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use ipnet::{IpNet, Ipv4AddrRange, Ipv4Net, Ipv6AddrRange, Ipv6Net, PrefixLenError};

/// A CIDR that does not parse, with the input and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {input:?}: {reason}")]
pub struct CidrError {
    pub input: String,
    pub reason: String,
}

/// An address family: what an address of it is called and how it is told
/// apart from the other family's.
pub trait Family:
    Copy + Ord + fmt::Display + fmt::Debug + FromStr + Into<IpAddr> + Send + Sync + 'static
{
    /// `IPv4` or `IPv6`.
    const NAME: &'static str;
    /// `0.0.0.0` or `::`: a default route's destination.
    const UNSPECIFIED: Self;
    /// The address, when `ip` is of this family.
    fn from_ip(ip: IpAddr) -> Option<Self>;
}

impl Family for Ipv4Addr {
    const NAME: &'static str = "IPv4";
    const UNSPECIFIED: Self = Ipv4Addr::UNSPECIFIED;
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }
}

impl Family for Ipv6Addr {
    const NAME: &'static str = "IPv6";
    const UNSPECIFIED: Self = Ipv6Addr::UNSPECIFIED;
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        }
    }
}

/// A network of either family as the health endpoint sees it: the first
/// address after the network's own is the router (never configured on an
/// interface: the endpoint reaches it through a static neighbour entry
/// pointing at the host side of the veth); the addresses after it, less
/// IPv4's broadcast address, can be handed out.
pub trait Cidr: Copy + Eq + fmt::Display + fmt::Debug + Into<IpNet> {
    type Addr: Family;
    /// Every address of the network, in order (`ipnet`'s range).
    type Range: DoubleEndedIterator<Item = Self::Addr>;
    /// The other family's network.
    type Other: Cidr;
    /// A network to show in the syntax hint.
    const EXAMPLE: &'static str;
    /// The flag that takes a network of this family.
    const FLAG: &'static str;
    /// The longest prefix: a single address.
    const MAX_PREFIX: u8;
    /// The longest prefix that leaves room for the router and one host.
    const LONGEST_USABLE_PREFIX: u8;
    /// Whether the last address is the broadcast address (IPv4).
    const HAS_BROADCAST: bool;

    /// `addr/prefix` as written (host bits kept).
    fn from_parts(addr: Self::Addr, prefix: u8) -> Result<Self, PrefixLenError>;
    /// The network with host bits cleared.
    #[must_use]
    fn truncated(self) -> Self;
    /// The prefix length.
    fn prefix(self) -> u8;
    /// The network's own address up to its last one.
    fn all(self) -> Self::Range;

    /// The endpoint's gateway; `None` when the network has no room for it
    /// and a host.
    fn router(self) -> Option<Self::Addr> {
        if self.prefix() > Self::LONGEST_USABLE_PREFIX {
            None
        } else {
            self.all().nth(1)
        }
    }

    /// Addresses that can be handed out, in order.
    fn usable(self) -> Self::Range {
        let mut all = self.all();
        if self.prefix() > Self::LONGEST_USABLE_PREFIX {
            // No room for a router and a host: at most two addresses.
            all.by_ref().for_each(drop);
        } else {
            all.nth(1); // the network's own address and the router
            if Self::HAS_BROADCAST {
                all.next_back();
            }
        }
        all
    }

    /// How many addresses [`Self::usable`] gives (saturating at
    /// `u128::MAX` for an IPv6 /0).
    fn usable_count(self) -> u128 {
        if self.prefix() > Self::LONGEST_USABLE_PREFIX {
            return 0;
        }
        let bits = u32::from(Self::MAX_PREFIX - self.prefix());
        1u128
            .checked_shl(bits)
            .map_or(u128::MAX, |n| n - 2 - u128::from(Self::HAS_BROADCAST))
    }

    /// Whether `addr` is one [`Self::usable`] gives.
    fn is_usable(self, addr: Self::Addr) -> bool {
        let mut usable = self.usable();
        let Some(first) = usable.next() else {
            return false;
        };
        let last = usable.next_back().unwrap_or(first);
        (first..=last).contains(&addr)
    }
}

impl Cidr for Ipv4Net {
    type Addr = Ipv4Addr;
    type Range = Ipv4AddrRange;
    type Other = Ipv6Net;
    const EXAMPLE: &'static str = "198.18.64.0/24";
    const FLAG: &'static str = "--health-cidr";
    const MAX_PREFIX: u8 = 32;
    const LONGEST_USABLE_PREFIX: u8 = 30;
    const HAS_BROADCAST: bool = true;

    fn from_parts(addr: Ipv4Addr, prefix: u8) -> Result<Self, PrefixLenError> {
        Self::new(addr, prefix)
    }
    fn truncated(self) -> Self {
        self.trunc()
    }
    fn prefix(self) -> u8 {
        self.prefix_len()
    }
    fn all(self) -> Ipv4AddrRange {
        Ipv4AddrRange::new(self.network(), self.broadcast())
    }
}

impl Cidr for Ipv6Net {
    type Addr = Ipv6Addr;
    type Range = Ipv6AddrRange;
    type Other = Ipv4Net;
    const EXAMPLE: &'static str = "2001:2:0:1::/64";
    const FLAG: &'static str = "--health-cidr6";
    const MAX_PREFIX: u8 = 128;
    /// A /126: the subnet-router anycast address, the router, two hosts.
    const LONGEST_USABLE_PREFIX: u8 = 126;
    const HAS_BROADCAST: bool = false;

    fn from_parts(addr: Ipv6Addr, prefix: u8) -> Result<Self, PrefixLenError> {
        Self::new(addr, prefix)
    }
    fn truncated(self) -> Self {
        self.trunc()
    }
    fn prefix(self) -> u8 {
        self.prefix_len()
    }
    fn all(self) -> Ipv6AddrRange {
        self.hosts()
    }
}

/// Parses a network given by a user or read from a file: `ADDRESS/PREFIX`
/// of `N`'s family with no host bits set; an error names the input and
/// what is wrong with it.
pub fn parse<N: Cidr>(input: &str) -> Result<N, CidrError> {
    let bad = |reason: String| CidrError {
        input: input.to_owned(),
        reason,
    };
    let (addr, prefix) = input
        .split_once('/')
        .ok_or_else(|| bad(format!("expected ADDRESS/PREFIX, e.g. {}", N::EXAMPLE)))?;
    let family = <N::Addr as Family>::NAME;
    let ip: N::Addr = addr.parse().map_err(|_| {
        bad(if addr.parse::<<N::Other as Cidr>::Addr>().is_ok() {
            format!(
                "{addr:?} is an {} address, not {family} (that is {})",
                <<N::Other as Cidr>::Addr as Family>::NAME,
                N::Other::FLAG
            )
        } else {
            format!("{addr:?} is not an {family} address")
        })
    })?;
    let max = N::MAX_PREFIX;
    let net = prefix
        .parse()
        .ok()
        .and_then(|p| N::from_parts(ip, p).ok())
        .ok_or_else(|| bad(format!("prefix {prefix:?} is not a number from 0 to {max}")))?;
    let network = net.truncated();
    if network != net {
        return Err(bad(format!("host bits are set (the network is {network})")));
    }
    Ok(net)
}

/// Serde of an optional network kept in a file the agent reads back: its
/// text form, parsed as strictly as [`parse`] does
/// (`#[serde(default, with = "crate::util::cidr::strict")]`).
pub mod strict {
    use serde::{Deserialize as _, Deserializer, Serialize as _, Serializer, de::Error as _};

    use super::{Cidr, parse};

    pub fn serialize<S: Serializer, N: Cidr>(net: &Option<N>, s: S) -> Result<S::Ok, S::Error> {
        net.map(|n| n.to_string()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, N: Cidr>(d: D) -> Result<Option<N>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| parse(&text).map_err(D::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Net {
        parse(s).expect(s)
    }

    #[test]
    fn parses_and_reports_bad_input_clearly() {
        let c = cidr("198.18.64.0/24");
        assert_eq!(c.broadcast(), Ipv4Addr::new(198, 18, 64, 255));
        assert_eq!(c.router(), Some(Ipv4Addr::new(198, 18, 64, 1)));
        for (input, needle) in [
            ("198.18.64.0", "ADDRESS/PREFIX"),
            ("198.18.64/24", "not an IPv4 address"),
            ("2001:2::/64", "is an IPv6 address"),
            ("198.18.64.0/33", "prefix \"33\""),
            ("198.18.64.0/x", "prefix \"x\""),
            ("198.18.64.7/24", "network is 198.18.64.0/24"),
        ] {
            let err = parse::<Ipv4Net>(input).expect_err(input).to_string();
            assert!(
                err.contains(input) && err.contains(needle),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn ipv4_usable_addresses_skip_the_network_router_and_broadcast() {
        let c = cidr("198.18.64.0/29");
        let all: Vec<Ipv4Addr> = c.usable().collect();
        assert_eq!(
            all,
            (2..=6)
                .map(|h| Ipv4Addr::new(198, 18, 64, h))
                .collect::<Vec<_>>()
        );
        assert_eq!(all.len() as u128, c.usable_count());
        for (host, usable) in [(0, false), (1, false), (2, true), (6, true), (7, false)] {
            assert_eq!(
                c.is_usable(Ipv4Addr::new(198, 18, 64, host)),
                usable,
                "{host}"
            );
        }
        assert!(!c.is_usable(Ipv4Addr::new(198, 18, 65, 2)));
        assert_eq!(cidr("198.18.64.0/30").usable_count(), 1);
        for tiny in ["198.18.64.0/31", "198.18.64.9/32"] {
            let t = cidr(tiny);
            assert_eq!(
                (t.usable().count(), t.usable_count(), t.router()),
                (0, 0, None)
            );
            assert!(!t.is_usable(t.network()));
        }
    }

    fn cidr6(s: &str) -> Ipv6Net {
        parse(s).expect(s)
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Kept {
        #[serde(default, with = "strict")]
        cidr6: Option<Ipv6Net>,
    }

    #[test]
    fn ipv6_cidrs_parse_and_report_bad_input_clearly() {
        let c = cidr6("2001:2:0:7::/64");
        assert_eq!(c.to_string(), "2001:2:0:7::/64");
        assert_eq!(c.router(), Some("2001:2:0:7::1".parse().expect("addr")));
        assert_eq!(
            c.broadcast(),
            "2001:2:0:7:ffff:ffff:ffff:ffff"
                .parse::<Ipv6Addr>()
                .expect("addr")
        );
        assert!(c.contains(&"2001:2:0:7::abcd".parse::<Ipv6Addr>().expect("addr")));
        assert!(!c.contains(&"2001:2:0:8::2".parse::<Ipv6Addr>().expect("addr")));
        assert_eq!(c.usable_count(), (1u128 << 64) - 2);
        assert_eq!(cidr6("::/0").usable_count(), u128::MAX);
        // The serde form is the text form.
        let kept = Kept { cidr6: Some(c) };
        let json = serde_json::to_string(&kept).expect("serialize");
        assert_eq!(json, r#"{"cidr6":"2001:2:0:7::/64"}"#);
        assert_eq!(
            serde_json::from_str::<Kept>(&json).expect("deserialize"),
            kept
        );
        assert_eq!(
            serde_json::from_str::<Kept>("{}").expect("absent"),
            Kept { cidr6: None }
        );
        let err = serde_json::from_str::<Kept>(r#"{"cidr6":"2001:2::1/48"}"#)
            .expect_err("host bits")
            .to_string();
        assert!(err.contains("network is 2001:2::/48"), "{err}");
        for (input, needle) in [
            ("2001:2::", "ADDRESS/PREFIX"),
            ("2001:2::/", "prefix \"\""),
            ("2001:2::/129", "prefix \"129\""),
            ("2001:2::/-1", "prefix \"-1\""),
            ("2001:2::/sixty-four", "prefix \"sixty-four\""),
            ("2001:2:::/64", "not an IPv6 address"),
            ("2001:2:0:g::/64", "not an IPv6 address"),
            ("198.18.64.0/24", "is an IPv4 address"),
            ("2001:2:0:1::5/64", "network is 2001:2:0:1::/64"),
            ("2001:2:0:1::/48", "network is 2001:2::/48"),
        ] {
            let err = parse::<Ipv6Net>(input).expect_err(input).to_string();
            assert!(
                err.contains(&format!("{input:?}")) && err.contains(needle),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn ipv6_usable_addresses_skip_the_network_and_router() {
        let c = cidr6("2001:2:0:3::/126");
        let all: Vec<Ipv6Addr> = c.usable().collect();
        assert_eq!(
            all,
            [
                "2001:2:0:3::2".parse::<Ipv6Addr>().expect("addr"),
                "2001:2:0:3::3".parse().expect("addr")
            ]
        );
        assert_eq!(all.len() as u128, c.usable_count());
        assert!(!c.is_usable(c.network()));
        assert!(!c.is_usable("2001:2:0:3::1".parse().expect("addr")));
        assert!(c.is_usable("2001:2:0:3::3".parse().expect("addr")));
        assert!(!c.is_usable("2001:2:0:3::4".parse().expect("addr")));
        for tiny in ["2001:2:0:3::/127", "2001:2:0:3::/128"] {
            let t = cidr6(tiny);
            assert_eq!(
                (t.usable().count(), t.usable_count(), t.router()),
                (0, 0, None)
            );
        }
    }
}
