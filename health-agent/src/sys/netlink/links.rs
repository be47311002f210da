//! Every interface of a namespace with its kind, for the encryption
//! check (which interfaces are WireGuard devices, which carry Ethernet);
//! and WireGuard links made for the tests and the lab.

use futures::TryStreamExt as _;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkLayerType};
use rtnetlink::{LinkMessageBuilder, LinkUnspec};

use super::{Netlink, NetlinkError, req};

/// One interface, as the encryption check sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSummary {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND` (`wireguard`, `veth`, `bridge`, ...), when the
    /// interface has one.
    pub kind: Option<String>,
    /// The link layer is Ethernet (`ARPHRD_ETHER`).
    pub ethernet: bool,
    pub up: bool,
    /// It holds an IPv4 address or a global IPv6 one: traffic of the node
    /// can leave through it (a pod's or a container's veth holds none).
    pub addressed: bool,
}

impl LinkSummary {
    #[must_use]
    pub fn is_wireguard(&self) -> bool {
        self.kind.as_deref() == Some("wireguard")
    }
}

impl Netlink {
    /// Every interface of the namespace.
    pub async fn links(&self) -> Result<Vec<LinkSummary>, NetlinkError> {
        let mut addressed: Vec<u32> = self
            .addresses::<std::net::Ipv4Addr>()
            .await?
            .into_iter()
            .map(|(i, _, _)| i)
            .collect();
        addressed.extend(
            self.addresses::<std::net::Ipv6Addr>()
                .await?
                .into_iter()
                .filter(|(_, a, _)| !a.is_unicast_link_local())
                .map(|(i, _, _)| i),
        );
        let mut dump = self.handle.link().get().execute();
        let mut out = Vec::new();
        while let Some(m) = dump
            .try_next()
            .await
            .map_err(req("listing the interfaces"))?
        {
            let mut name = String::new();
            let mut kind = None;
            for a in &m.attributes {
                match a {
                    LinkAttribute::IfName(n) => name.clone_from(n),
                    LinkAttribute::LinkInfo(infos) => {
                        for i in infos {
                            if let LinkInfo::Kind(k) = i {
                                kind = Some(k.to_string());
                            }
                        }
                    }
                    _ => {}
                }
            }
            out.push(LinkSummary {
                index: m.header.index,
                name,
                kind,
                ethernet: m.header.link_layer_type == LinkLayerType::Ether,
                up: m.header.flags.contains(LinkFlags::Up),
                addressed: addressed.contains(&m.header.index),
            });
        }
        Ok(out)
    }

    /// Creates a WireGuard interface `name` (the kernel loads its module
    /// on demand); keys and peers are set through its generic-netlink
    /// family (`wg set`).
    pub async fn add_wireguard(&self, name: &str) -> Result<(), NetlinkError> {
        let msg = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Wireguard)
            .name(name.to_owned())
            .build();
        self.add_link(msg, format!("creating WireGuard interface {name:?}"))
            .await
    }
}
