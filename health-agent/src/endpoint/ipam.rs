//! IPv4 address management for the health endpoint: the node's share of the
//! pod range (`--health-cidr`), minus its network, router and broadcast
//! addresses and whatever is already in use.

use std::{collections::BTreeSet, net::Ipv4Addr};

pub use crate::util::cidr::Ipv4Cidr;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("no free address in {cidr}: {usable} usable, all in use or reserved")]
    Exhausted { cidr: Ipv4Cidr, usable: u64 },
    #[error("address {addr} is not a usable host address of {cidr}")]
    NotUsable { addr: Ipv4Addr, cidr: Ipv4Cidr },
}

/// Picks an address of `cidr` not in `in_use`. `previous` (the address the
/// endpoint had before a restart) is kept when it is still usable and free.
pub fn allocate(
    cidr: Ipv4Cidr,
    in_use: &BTreeSet<Ipv4Addr>,
    previous: Option<Ipv4Addr>,
) -> Result<Ipv4Addr, IpamError> {
    if let Some(prev) = previous
        && cidr.is_usable(prev)
        && !in_use.contains(&prev)
    {
        return Ok(prev);
    }
    cidr.usable()
        .find(|a| !in_use.contains(a))
        .ok_or(IpamError::Exhausted {
            cidr,
            usable: cidr.usable_count(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().expect(s)
    }

    #[test]
    fn skips_network_router_broadcast_and_used() {
        let c = cidr("198.18.64.0/29");
        let all: Vec<_> = c.usable().collect();
        assert_eq!(all.first(), Some(&Ipv4Addr::new(198, 18, 64, 2)));
        assert_eq!(all.last(), Some(&Ipv4Addr::new(198, 18, 64, 6)));
        assert_eq!(all.len() as u64, c.usable_count());
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
            assert!(err.contains(tiny), "{err}");
        }
    }
}
