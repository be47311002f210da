//! What the echo responder must know of the interface it answers on, read
//! from that interface's namespace: its MAC (which frames are for this
//! host, and where replies to group-addressed requests come from) and
//! whether it drops unicast IP in link-layer multicast frames.

use std::{
    fs, io,
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use health_common::maps::EchoConfig;

use super::{DatapathError, Interface};
use crate::sys::netlink::in_netns;

/// The responder's configuration for `addr` and `addr6` (either may be
/// absent: that family is not answered) on `iface`.
pub(super) fn read(
    iface: &Interface,
    addr: Option<Ipv4Addr>,
    addr6: Option<Ipv6Addr>,
) -> Result<EchoConfig, DatapathError> {
    let name = iface.name.clone();
    let (_, mac) = in_netns(
        iface.netns.as_ref(),
        |nl| async move { nl.link_l2(&name).await },
    )
    .map_err(|source| DatapathError::LinkAddress {
        interface: iface.to_string(),
        source: Box::new(source),
    })?;
    let mut flags = 0;
    if addr.is_some() && drops_unicast_in_l2_multicast(iface, "ipv4")? {
        flags |= EchoConfig::DROP_UNICAST_IN_L2_MULTICAST;
    }
    if addr6.is_some() && drops_unicast_in_l2_multicast(iface, "ipv6")? {
        flags |= EchoConfig::DROP_UNICAST_IN_L2_MULTICAST6;
    }
    Ok(EchoConfig {
        addr: addr.map_or([0; 4], |a| a.octets()),
        mac,
        flags,
        reserved: 0,
        addr6: addr6.map_or([0; 16], |a| a.octets()),
    })
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
