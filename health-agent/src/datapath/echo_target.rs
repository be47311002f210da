//! What the echo responder must know of the interface it answers on, read
//! from that interface's namespace: its MAC (which frames are for this
//! host, and where replies to group-addressed requests come from) and
//! whether it drops unicast IP in link-layer multicast frames.

use std::{fs, io, net::Ipv4Addr, path::PathBuf};

use health_common::maps::EchoConfig;

use super::{DatapathError, Interface};
use crate::sys::netlink::in_netns;

/// The responder's configuration for `addr` on `iface`.
pub(super) fn read(iface: &Interface, addr: Ipv4Addr) -> Result<EchoConfig, DatapathError> {
    let name = iface.name.clone();
    let (_, mac) = in_netns(
        iface.netns.as_ref(),
        |nl| async move { nl.link_l2(&name).await },
    )
    .map_err(|source| DatapathError::LinkAddress {
        interface: iface.to_string(),
        source: Box::new(source),
    })?;
    let drop = drops_unicast_in_l2_multicast(iface)?;
    Ok(EchoConfig {
        addr: addr.octets(),
        mac,
        flags: if drop {
            EchoConfig::DROP_UNICAST_IN_L2_MULTICAST
        } else {
            0
        },
        reserved: 0,
    })
}

/// `IN_DEV_ORCONF(DROP_UNICAST_IN_L2_MULTICAST)`: the `all` setting or the
/// interface's own.
fn drops_unicast_in_l2_multicast(iface: &Interface) -> Result<bool, DatapathError> {
    let paths: Vec<PathBuf> = ["all", iface.name.as_str()]
        .iter()
        .map(|conf| {
            PathBuf::from("/proc/sys/net/ipv4/conf")
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
