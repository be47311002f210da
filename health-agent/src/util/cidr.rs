//! IPv4 networks in CIDR notation (`198.18.64.0/24`): the health CIDR of a
//! node, the cluster's health range, a node record's `health-cidr`.

use std::{fmt, net::Ipv4Addr, str::FromStr};

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
}
