//! Addresses and neighbour entries of either family: added, listed,
//! deleted. One path for both; what differs is said where it differs
//! (an IPv6 address skips duplicate address detection).

use std::net::IpAddr;

use futures::TryStreamExt as _;
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags},
    neighbour::NeighbourState,
};

use super::{Netlink, NetlinkError, req};
use crate::util::cidr::Family;

impl Netlink {
    /// Adds `addr/prefix` to an interface; an IPv6 one without duplicate
    /// address detection (`nodad`): usable at once.
    pub async fn add_address<A: Family>(
        &self,
        name: &str,
        addr: A,
        prefix: u8,
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(name).await?;
        let ip: IpAddr = addr.into();
        let mut request = self.handle.address().add(index, ip, prefix);
        if ip.is_ipv6() {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        request
            .execute()
            .await
            .map_err(req(format!("adding {addr}/{prefix} to {name:?}")))
    }

    /// Every address of family `A` configured in this namespace, with its
    /// interface index and prefix length.
    pub async fn addresses<A: Family>(&self) -> Result<Vec<(u32, A, u8)>, NetlinkError> {
        let mut stream = self.handle.address().get().execute();
        let mut out = Vec::new();
        while let Some(msg) = stream.try_next().await.map_err(req("listing addresses"))? {
            for a in &msg.attributes {
                if let AddressAttribute::Address(ip) = a
                    && let Some(ip) = A::from_ip(*ip)
                {
                    out.push((msg.header.index, ip, msg.header.prefix_len));
                }
            }
        }
        Ok(out)
    }

    /// Deletes the address `addr` from `iface`; a missing one is fine.
    pub async fn delete_address(&self, iface: &str, addr: IpAddr) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        let mut stream = self.handle.address().get().execute();
        let mut found = None;
        while let Some(msg) = stream.try_next().await.map_err(req("listing addresses"))? {
            if msg.header.index == index
                && msg
                    .attributes
                    .iter()
                    .any(|a| matches!(a, AddressAttribute::Address(a) if *a == addr))
            {
                found = Some(msg);
            }
        }
        let Some(msg) = found else {
            return Ok(());
        };
        self.handle
            .address()
            .del(msg)
            .execute()
            .await
            .map_err(req(format!("deleting {addr} from {iface:?}")))
    }

    /// Adds (or replaces) a permanent neighbour entry `ip -> mac` on `iface`.
    pub async fn replace_neighbour<A: Family>(
        &self,
        iface: &str,
        ip: A,
        mac: [u8; 6],
    ) -> Result<(), NetlinkError> {
        let index = self.require_link(iface).await?;
        self.handle
            .neighbours()
            .add(index, ip.into())
            .link_layer_address(&mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(req(format!("adding neighbour {ip} on {iface}")))
    }
}
