//! What a client's connections count against, for the listeners' caps
//! per source.

use std::net::{IpAddr, Ipv4Addr};

/// What a client's connections count against: its IPv4 address, or the
/// /64 of its IPv6 address (a host is usually given a whole /64 and may use
/// any address of it, so counting full IPv6 addresses would let one host
/// take every slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4(Ipv4Addr),
    /// The upper 64 bits of the address.
    V6(u64),
}

impl Source {
    /// The source of a peer address; an IPv4-mapped address (an IPv4 peer
    /// of the dual-stack listener) counts as its IPv4 address.
    #[must_use]
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self::V4(v4),
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) >> 64;
                // Lossless: a u128 shifted right by 64 fits in 64 bits.
                Self::V6(u64::try_from(prefix).unwrap_or(u64::MAX))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_ipv4_addresses_and_ipv6_slash_64s() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        assert_eq!(
            Source::of(ip("2001:2::1")),
            Source::of(ip("2001:2::ffff:ffff:ffff:ffff"))
        );
        assert_ne!(Source::of(ip("2001:2::1")), Source::of(ip("2001:2:0:1::1")));
        assert_eq!(
            Source::of(ip("::ffff:198.18.0.1")),
            Source::of(ip("198.18.0.1"))
        );
        assert_ne!(Source::of(ip("198.18.0.1")), Source::of(ip("198.18.0.2")));
    }
}
