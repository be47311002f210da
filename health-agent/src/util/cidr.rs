//! Networks in CIDR notation: IPv4 (`198.18.64.0/24`: the health CIDR of a
//! node, the cluster's health range, a node record's `health-cidr`) and
//! IPv6 (`2001:2:0:1::/64`: the node's `--health-cidr6`).

use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use serde::{Deserialize, Serialize};

/// A CIDR that does not parse, with the input and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {input:?}: {reason}")]
pub struct CidrError {
    pub input: String,
    pub reason: String,
}

/// An IPv4 network in CIDR notation; host bits must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Cidr {
    pub fn new(network: Ipv4Addr, prefix: u8) -> Result<Self, CidrError> {
        Self::from_str(&format!("{network}/{prefix}"))
    }

    #[must_use]
    pub const fn network(self) -> Ipv4Addr {
        self.network
    }

    #[must_use]
    pub const fn prefix(self) -> u8 {
        self.prefix
    }

    const fn mask(self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix)
        }
    }

    #[must_use]
    pub const fn broadcast(self) -> Ipv4Addr {
        Ipv4Addr::from_bits(self.network.to_bits() | !self.mask())
    }

    #[must_use]
    pub const fn contains(self, addr: Ipv4Addr) -> bool {
        addr.to_bits() & self.mask() == self.network.to_bits()
    }

    /// The first host address: the endpoint's gateway. It is never assigned
    /// to an interface; the endpoint reaches it through a static neighbour
    /// entry pointing at the host side of the veth.
    #[must_use]
    pub const fn router(self) -> Option<Ipv4Addr> {
        if self.prefix >= 31 {
            None
        } else {
            Some(Ipv4Addr::from_bits(self.network.to_bits() + 1))
        }
    }

    /// Addresses that can be handed out: all but network, router, broadcast.
    pub fn usable(self) -> impl Iterator<Item = Ipv4Addr> {
        let (first, last) = if self.prefix >= 31 {
            (1, 0) // empty: no room for a router and a host
        } else {
            (self.network.to_bits() + 2, self.broadcast().to_bits() - 1)
        };
        (first..=last).map(Ipv4Addr::from_bits)
    }

    #[must_use]
    pub fn usable_count(self) -> u64 {
        if self.prefix >= 31 {
            0
        } else {
            (1u64 << (32 - self.prefix)) - 3
        }
    }

    #[must_use]
    pub fn is_usable(self, addr: Ipv4Addr) -> bool {
        self.contains(addr)
            && Some(addr) != self.router()
            && addr != self.network
            && addr != self.broadcast()
            && self.prefix < 31
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| CidrError {
            input: input.to_owned(),
            reason,
        };
        let (addr, prefix) = input
            .split_once('/')
            .ok_or_else(|| bad("expected ADDRESS/PREFIX, e.g. 198.18.64.0/24".into()))?;
        let network: Ipv4Addr = addr
            .parse()
            .map_err(|_| bad(format!("{addr:?} is not an IPv4 address")))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| bad(format!("prefix {prefix:?} is not a number from 0 to 32")))?;
        let cidr = Self { network, prefix };
        let masked = Ipv4Addr::from_bits(network.to_bits() & cidr.mask());
        if masked != network {
            return Err(bad(format!(
                "host bits are set (the network is {masked}/{prefix})"
            )));
        }
        Ok(cidr)
    }
}

impl TryFrom<String> for Ipv4Cidr {
    type Error = CidrError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Ipv4Cidr> for String {
    fn from(c: Ipv4Cidr) -> Self {
        c.to_string()
    }
}

/// An IPv6 network in CIDR notation; host bits must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Ipv6Cidr {
    network: Ipv6Addr,
    prefix: u8,
}

impl Ipv6Cidr {
    /// The longest prefix that leaves room for the router and one host
    /// (a /126: the subnet-router anycast address, the router, two hosts).
    pub const LONGEST_USABLE_PREFIX: u8 = 126;

    pub fn new(network: Ipv6Addr, prefix: u8) -> Result<Self, CidrError> {
        Self::from_str(&format!("{network}/{prefix}"))
    }

    #[must_use]
    pub const fn network(self) -> Ipv6Addr {
        self.network
    }

    #[must_use]
    pub const fn prefix(self) -> u8 {
        self.prefix
    }

    const fn mask(self) -> u128 {
        if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - self.prefix)
        }
    }

    /// The last address of the network.
    #[must_use]
    pub const fn last(self) -> Ipv6Addr {
        Ipv6Addr::from_bits(self.network.to_bits() | !self.mask())
    }

    #[must_use]
    pub const fn contains(self, addr: Ipv6Addr) -> bool {
        addr.to_bits() & self.mask() == self.network.to_bits()
    }

    /// The first address after the network's own (the subnet-router
    /// anycast address): the endpoint's gateway. As for IPv4, it is never
    /// configured on an interface; the endpoint reaches it through a static
    /// neighbour entry pointing at the host side of the veth.
    #[must_use]
    pub const fn router(self) -> Option<Ipv6Addr> {
        if self.prefix > Self::LONGEST_USABLE_PREFIX {
            None
        } else {
            Some(Ipv6Addr::from_bits(self.network.to_bits() + 1))
        }
    }

    /// Addresses that can be handed out, in order: all but the network's
    /// own address and the router.
    pub fn usable(self) -> impl Iterator<Item = Ipv6Addr> {
        let (first, last) = if self.prefix > Self::LONGEST_USABLE_PREFIX {
            (1, 0) // empty: no room for a router and a host
        } else {
            (self.network.to_bits() + 2, self.last().to_bits())
        };
        (first..=last).map(Ipv6Addr::from_bits)
    }

    /// How many addresses [`Self::usable`] gives (saturating at
    /// `u128::MAX` for a /0).
    #[must_use]
    pub const fn usable_count(self) -> u128 {
        if self.prefix > Self::LONGEST_USABLE_PREFIX {
            0
        } else if self.prefix == 0 {
            u128::MAX
        } else {
            (1u128 << (128 - self.prefix)) - 2
        }
    }

    #[must_use]
    pub fn is_usable(self, addr: Ipv6Addr) -> bool {
        self.prefix <= Self::LONGEST_USABLE_PREFIX
            && self.contains(addr)
            && addr != self.network
            && Some(addr) != self.router()
    }
}

impl fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Ipv6Cidr {
    type Err = CidrError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| CidrError {
            input: input.to_owned(),
            reason,
        };
        let (addr, prefix) = input
            .split_once('/')
            .ok_or_else(|| bad("expected ADDRESS/PREFIX, e.g. 2001:2:0:1::/64".into()))?;
        let network: Ipv6Addr = addr.parse().map_err(|_| {
            bad(if addr.parse::<Ipv4Addr>().is_ok() {
                format!("{addr:?} is an IPv4 address, not IPv6 (that is --health-cidr)")
            } else {
                format!("{addr:?} is not an IPv6 address")
            })
        })?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 128)
            .ok_or_else(|| bad(format!("prefix {prefix:?} is not a number from 0 to 128")))?;
        let cidr = Self { network, prefix };
        let masked = Ipv6Addr::from_bits(network.to_bits() & cidr.mask());
        if masked != network {
            return Err(bad(format!(
                "host bits are set (the network is {masked}/{prefix})"
            )));
        }
        Ok(cidr)
    }
}

impl TryFrom<String> for Ipv6Cidr {
    type Error = CidrError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Ipv6Cidr> for String {
    fn from(c: Ipv6Cidr) -> Self {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().expect(s)
    }

    #[test]
    fn parses_and_reports_bad_input_clearly() {
        let c = cidr("198.18.64.0/24");
        assert_eq!(c.broadcast(), Ipv4Addr::new(198, 18, 64, 255));
        assert_eq!(c.router(), Some(Ipv4Addr::new(198, 18, 64, 1)));
        for (input, needle) in [
            ("198.18.64.0", "ADDRESS/PREFIX"),
            ("198.18.64/24", "not an IPv4 address"),
            ("198.18.64.0/33", "prefix \"33\""),
            ("198.18.64.0/x", "prefix \"x\""),
            ("198.18.64.7/24", "network is 198.18.64.0/24"),
        ] {
            let err = input.parse::<Ipv4Cidr>().expect_err(input).to_string();
            assert!(
                err.contains(input) && err.contains(needle),
                "{input}: {err}"
            );
        }
    }

    fn cidr6(s: &str) -> Ipv6Cidr {
        s.parse().expect(s)
    }

    #[test]
    fn ipv6_cidrs_parse_and_report_bad_input_clearly() {
        let c = cidr6("2001:2:0:7::/64");
        assert_eq!(c.to_string(), "2001:2:0:7::/64");
        assert_eq!(c.router(), Some("2001:2:0:7::1".parse().expect("addr")));
        assert_eq!(
            c.last(),
            "2001:2:0:7:ffff:ffff:ffff:ffff"
                .parse::<Ipv6Addr>()
                .expect("addr")
        );
        assert!(c.contains("2001:2:0:7::abcd".parse().expect("addr")));
        assert!(!c.contains("2001:2:0:8::2".parse().expect("addr")));
        assert_eq!(c.usable_count(), (1u128 << 64) - 2);
        assert_eq!(cidr6("::/0").usable_count(), u128::MAX);
        // The serde form is the text form.
        let json = serde_json::to_string(&c).expect("serialize");
        assert_eq!(json, "\"2001:2:0:7::/64\"");
        assert_eq!(
            serde_json::from_str::<Ipv6Cidr>(&json).expect("deserialize"),
            c
        );
        assert!(serde_json::from_str::<Ipv6Cidr>("\"2001:2::1/48\"").is_err());
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
            let err = input.parse::<Ipv6Cidr>().expect_err(input).to_string();
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
