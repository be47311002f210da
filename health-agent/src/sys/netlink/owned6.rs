//! IPv6 routes the agent owns: installed with its route protocol number
//! and deleted only with it, so a route someone else made is never touched.

use std::net::Ipv6Addr;

use netlink_packet_route::route::RouteProtocol;
use rtnetlink::RouteMessageBuilder;

use super::{Netlink, NetlinkError, req};

impl Netlink {
    /// Adds `destination/prefix via gateway` marked as installed by
    /// `protocol`, replacing a route to the same destination (callers check
    /// that any such route is theirs first). The kernel picks the interface
    /// that reaches the gateway.
    pub async fn replace_route6_owned(
        &self,
        destination: Ipv6Addr,
        prefix: u8,
        gateway: Ipv6Addr,
        protocol: u8,
    ) -> Result<(), NetlinkError> {
        let msg = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(destination, prefix)
            .gateway(gateway)
            .protocol(RouteProtocol::from(protocol))
            .build();
        self.handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(req(format!(
                "adding route {destination}/{prefix} via {gateway} (protocol {protocol})"
            )))
    }

    /// Deletes the main-table IPv6 route to `destination/prefix` installed
    /// by `protocol`; the kernel leaves a route of another protocol alone.
    /// A missing one is fine.
    pub async fn delete_route6_owned(
        &self,
        destination: Ipv6Addr,
        prefix: u8,
        protocol: u8,
    ) -> Result<(), NetlinkError> {
        let msg = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(destination, prefix)
            .protocol(RouteProtocol::from(protocol))
            .build();
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
            Err(e) => Err(req(format!(
                "deleting route {destination}/{prefix} (protocol {protocol})"
            ))(e)),
        }
    }
}
