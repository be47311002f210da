//! What the echo responder must know of the interface it answers on, read
//! from that interface's namespace: its MAC (which frames are for this
//! host, and where replies to group-addressed requests come from), its
//! addresses (a request from any of them, the IPv6 link-local one
//! included, is the host's own and goes to the stack), whether it drops
//! unicast IP in link-layer multicast frames, and whether its peer is in
//! another namespace (a veth's replies then go straight to the peer).

use std::{
    fs, io,
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use health_common::maps::{EchoConfig, OWN_SLOTS};
use tracing::warn;

use super::{DatapathError, Interface};
use crate::sys::netlink::in_netns;

/// The interface's index, MAC, IPv4 and IPv6 addresses, and whether its
/// peer is in another namespace.
type Link = (u32, [u8; 6], Vec<Ipv4Addr>, Vec<Ipv6Addr>, bool);

/// The responder's configuration for `addr` and `addr6` (either may be
/// absent: that family is not answered) on `iface`.
pub(super) fn read(
    iface: &Interface,
    addr: Option<Ipv4Addr>,
    addr6: Option<Ipv6Addr>,
) -> Result<EchoConfig, DatapathError> {
    let name = iface.name.clone();
    let (_, mac, all4, all6, peer_elsewhere): Link =
        in_netns(iface.netns.as_ref(), |nl| async move {
            let (index, mac, peer_elsewhere) = nl.link_l2_and_peer(&name).await?;
            let on = |i: u32| i == index;
            let v4 = nl.addresses::<Ipv4Addr>().await?;
            let v6 = nl.addresses::<Ipv6Addr>().await?;
            Ok((
                index,
                mac,
                v4.into_iter().filter(|a| on(a.0)).map(|a| a.1).collect(),
                v6.into_iter().filter(|a| on(a.0)).map(|a| a.1).collect(),
                peer_elsewhere,
            ))
        })
        .map_err(|source| DatapathError::LinkAddress {
            interface: iface.to_string(),
            source: Box::new(source),
        })?;
    let mut flags = 0;
    if peer_elsewhere {
        flags |= EchoConfig::REPLY_TO_PEER;
    }
    if addr.is_some() && drops_unicast_in_l2_multicast(iface, "ipv4")? {
        flags |= EchoConfig::DROP_UNICAST_IN_L2_MULTICAST;
    }
    if addr6.is_some() && drops_unicast_in_l2_multicast(iface, "ipv6")? {
        flags |= EchoConfig::DROP_UNICAST_IN_L2_MULTICAST6;
    }
    let (own4, more4) = own_slots(
        all4.iter()
            .filter(|a| Some(**a) != addr)
            .map(Ipv4Addr::octets),
    );
    // Link-local first: the one every IPv6 interface has.
    let mut others6: Vec<Ipv6Addr> = all6.into_iter().filter(|a| Some(*a) != addr6).collect();
    others6.sort_by_key(|a| !a.is_unicast_link_local());
    let (own6, more6) = own_slots(others6.iter().map(Ipv6Addr::octets));
    if more4 || more6 {
        warn!(
            interface = %iface,
            slots = OWN_SLOTS,
            "the interface has more addresses than the echo responder holds: its echo requests of \
             that family go to the stack"
        );
    }
    if more4 {
        flags |= EchoConfig::MORE_OWN4;
    }
    if more6 {
        flags |= EchoConfig::MORE_OWN6;
    }
    Ok(EchoConfig {
        addr: addr.map_or([0; 4], |a| a.octets()),
        mac,
        flags,
        reserved: 0,
        addr6: addr6.map_or([0; 16], |a| a.octets()),
        own4,
        own6,
    })
}

/// `addrs` in the responder's slots, and whether some did not fit.
fn own_slots<const N: usize>(addrs: impl Iterator<Item = [u8; N]>) -> ([[u8; N]; OWN_SLOTS], bool) {
    let mut slots = [[0; N]; OWN_SLOTS];
    let mut more = false;
    for (i, a) in addrs.enumerate() {
        match slots.get_mut(i) {
            Some(s) => *s = a,
            None => more = true,
        }
    }
    (slots, more)
}

/// `IN_DEV_ORCONF(DROP_UNICAST_IN_L2_MULTICAST)` for `family` (`ipv4` or
/// `ipv6`): the `all` setting or the interface's own. (IPv6 reads only the
/// interface's; counting `all` as well only hands more to the stack.)
fn drops_unicast_in_l2_multicast(iface: &Interface, family: &str) -> Result<bool, DatapathError> {
    let paths: Vec<PathBuf> = ["all", iface.name.as_str()]
        .iter()
        .map(|conf| {
            PathBuf::from("/proc/sys/net")
                .join(family)
                .join("conf")
                .join(conf)
                .join("drop_unicast_in_l2_multicast")
        })
        .collect();
    let read = || -> Result<bool, (String, io::Error)> {
        for path in &paths {
            let text = fs::read_to_string(path).map_err(|e| (path.display().to_string(), e))?;
            if text.trim() != "0" {
                return Ok(true);
            }
        }
        Ok(false)
    };
    crate::sys::netns::run_in(iface.netns.as_ref(), read)?.map_err(|(path, source)| {
        DatapathError::Sysctl {
            interface: iface.to_string(),
            path,
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_fill_the_slots_and_the_excess_is_flagged() {
        let a = |i: u8| [198, 18, 0, i];
        let (slots, more) = own_slots((1..=2).map(a));
        assert_eq!(slots[..2], [a(1), a(2)]);
        assert!(slots[2..].iter().all(|s| *s == [0; 4]) && !more);
        let n = u8::try_from(OWN_SLOTS).expect("small");
        let (slots, more) = own_slots((1..=n).map(a));
        assert!(!more && slots[OWN_SLOTS - 1] == a(n));
        let (_, more) = own_slots((1..=n + 1).map(a));
        assert!(more);
    }
}
