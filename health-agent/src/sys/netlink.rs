//! Links and addresses through rtnetlink, never by running `ip`.
//!
//! A netlink socket talks to the namespace its creating thread was in, so
//! [`in_netns`] builds the connection on a thread that entered the namespace
//! and drives it with a current-thread runtime there.

use std::{future::Future, os::fd::AsRawFd as _};

use futures::TryStreamExt as _;
use netlink_packet_route::{
    link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo, LinkMessage},
    tc::TcAttribute,
};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, new_connection};

use crate::sys::netns::{Netns, NetnsError, run_in};

mod addresses;
mod links;
mod routes;

pub use links::LinkSummary;
pub use routes::{Route, RouteV4, RouteV6, RouteWrite};

/// `RTPROT_BOOT`, what `ip route add` marks a route with by default.
const RTPROT_BOOT: u8 = 3;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("{op}")]
    Request {
        op: String,
        source: rtnetlink::Error,
    },
    #[error("a route to {destination}/{prefix}: {reason}")]
    InvalidRoute {
        destination: std::net::IpAddr,
        prefix: u8,
        reason: String,
    },
    #[error("a route to {destination} via {gateway}: the families differ")]
    FamilyMismatch {
        destination: std::net::IpAddr,
        gateway: std::net::IpAddr,
    },
    #[error("interface {name:?} does not exist")]
    NoSuchLink { name: String },
    #[error("opening a netlink socket")]
    Socket(#[source] std::io::Error),
    #[error("starting the runtime for netlink work")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

impl NetlinkError {
    /// Whether the kernel refused a request because what it would make
    /// exists already (`EEXIST`): a route added never over another found
    /// one.
    #[must_use]
    pub fn exists(&self) -> bool {
        matches!(self, Self::Request { source: rtnetlink::Error::NetlinkError(e), .. } if e.raw_code() == -libc::EEXIST)
    }
}

/// Counters of an interface, from `IFLA_STATS64`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
}

/// A direction of the clsact qdisc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcDirection {
    Ingress,
    Egress,
}

/// A classic tc filter, as far as the agent cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcFilter {
    pub priority: u16,
    pub handle: u32,
    /// `bpf`, `matchall`, `u32`, ...
    pub kind: String,
    /// For `bpf` filters: the program's ID and name.
    pub bpf_id: Option<u32>,
    pub bpf_name: Option<String>,
}

impl TcFilter {
    fn from_message(msg: &netlink_packet_route::tc::TcMessage) -> Self {
        use netlink_packet_route::tc::{TcFilterBpfOption, TcOption};
        let mut f = Self {
            priority: (msg.header.info >> 16) as u16,
            handle: (u32::from(msg.header.handle.major) << 16) | u32::from(msg.header.handle.minor),
            kind: String::new(),
            bpf_id: None,
            bpf_name: None,
        };
        for a in &msg.attributes {
            match a {
                TcAttribute::Kind(k) => f.kind.clone_from(k),
                TcAttribute::Options(opts) => {
                    for o in opts {
                        match o {
                            TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => f.bpf_id = Some(*id),
                            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => {
                                f.bpf_name = Some(n.clone());
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        f
    }
}

/// A netlink connection bound to one namespace.
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
}

/// Runs `work` with a netlink connection inside `netns` (or the calling
/// thread's namespace when `None`), on a dedicated thread.
pub fn in_netns<T, F, Fut>(netns: Option<&Netns>, work: F) -> Result<T, NetlinkError>
where
    T: Send,
    F: FnOnce(Netlink) -> Fut + Send,
    Fut: Future<Output = Result<T, NetlinkError>>,
{
    let go = move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(NetlinkError::Runtime)?;
        rt.block_on(async move {
            let (conn, handle, _) = new_connection().map_err(NetlinkError::Socket)?;
            let task = tokio::spawn(conn);
            let out = work(Netlink { handle }).await;
            task.abort();
            out
        })
    };
    match netns {
        Some(_) => run_in(netns, go)?,
        // Keep the caller's runtime untouched: a nested block_on would panic.
        None => std::thread::scope(|s| s.spawn(go).join())
            .unwrap_or_else(|p| std::panic::resume_unwind(p)),
    }
}

fn req(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let op = op.into();
    move |source| NetlinkError::Request { op, source }
}

impl Netlink {
    /// The index of `name`, or `None` when there is no such interface.
    pub async fn link_index(&self, name: &str) -> Result<Option<u32>, NetlinkError> {
        Ok(self.link_by_name(name).await?.map(|m| m.header.index))
    }

    /// The index of `name` and the index its `IFLA_LINK` names (for a
    /// veth, the peer's index in the peer's namespace), or `None` when
    /// there is no such interface.
    pub async fn link_and_peer(
        &self,
        name: &str,
    ) -> Result<Option<(u32, Option<u32>)>, NetlinkError> {
        Ok(self.link_by_name(name).await?.map(|m| {
            let peer = m.attributes.iter().find_map(|a| match a {
                LinkAttribute::Link(i) => Some(*i),
                _ => None,
            });
            (m.header.index, peer)
        }))
    }

    /// Index and MAC address of `name`.
    pub async fn link_l2(&self, name: &str) -> Result<(u32, [u8; 6]), NetlinkError> {
        Ok(l2_of(&self.require_link_by_name(name).await?))
    }

    /// [`Self::link_l2`], and whether `name` is a veth or a netkit device
    /// whose peer lives in another namespace (what `bpf_redirect_peer`
    /// needs to hand a packet to the peer's ingress), from one lookup.
    pub async fn link_l2_and_peer(&self, name: &str) -> Result<(u32, [u8; 6], bool), NetlinkError> {
        let link = self.require_link_by_name(name).await?;
        let (index, mac) = l2_of(&link);
        Ok((index, mac, peer_in_other_netns(&link)))
    }

    /// The name of the interface with index `index`, if there is one.
    pub async fn link_name(&self, index: u32) -> Result<Option<String>, NetlinkError> {
        let mut links = self.handle.link().get().match_index(index).execute();
        match links.try_next().await {
            Ok(link) => Ok(link.and_then(|l| {
                l.attributes.into_iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n),
                    _ => None,
                })
            })),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(source) => Err(NetlinkError::Request {
                op: format!("looking up interface index {index}"),
                source,
            }),
        }
    }

    /// Like [`Self::link_index`] but a missing link is an error naming it.
    pub async fn require_link(&self, name: &str) -> Result<u32, NetlinkError> {
        Ok(self.require_link_by_name(name).await?.header.index)
    }

    /// The MTU of the interface of index `index`, when there is one.
    pub async fn link_mtu(&self, index: u32) -> Result<Option<u32>, NetlinkError> {
        let mut links = self.handle.link().get().match_index(index).execute();
        let link = match links.try_next().await {
            Ok(link) => link,
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => None,
            Err(e) => return Err(req(format!("looking up interface {index}"))(e)),
        };
        Ok(link.and_then(|l| {
            l.attributes.iter().find_map(|a| match a {
                LinkAttribute::Mtu(m) => Some(*m),
                _ => None,
            })
        }))
    }

    /// Like [`Self::link_by_name`] but a missing link is an error naming it.
    async fn require_link_by_name(&self, name: &str) -> Result<LinkMessage, NetlinkError> {
        self.link_by_name(name)
            .await?
            .ok_or_else(|| NetlinkError::NoSuchLink { name: name.into() })
    }

    async fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>, NetlinkError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(link) => Ok(link),
            // ENODEV: no such device.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(req(format!("looking up interface {name:?}"))(e)),
        }
    }

    /// Creates a veth pair `name` <-> `peer`; the peer is created directly in
    /// `peer_netns` when given.
    pub async fn add_veth(
        &self,
        name: &str,
        peer: &str,
        peer_netns: Option<&Netns>,
    ) -> Result<(), NetlinkError> {
        let ns_file = peer_netns.map(Netns::open).transpose()?;
        let mut peer_msg = LinkMessageBuilder::<LinkUnspec>::new().name(peer.to_owned());
        if let Some(f) = &ns_file {
            peer_msg = peer_msg.setns_by_fd(f.as_raw_fd());
        }
        let msg = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(name.to_owned())
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg.build())))
            .build();
        self.add_link(msg, format!("creating veth {name:?} <-> {peer:?}"))
            .await
    }

    /// Creates a bridge.
    pub async fn add_bridge(&self, name: &str) -> Result<(), NetlinkError> {
        self.add_link(
            rtnetlink::LinkBridge::new(name).build(),
            format!("creating bridge {name:?}"),
        )
        .await
    }

    /// Creates the link `msg` describes; `op` names it in an error.
    async fn add_link(&self, msg: LinkMessage, op: String) -> Result<(), NetlinkError> {
        self.handle.link().add(msg).execute().await.map_err(req(op))
    }

    /// Enslaves `port` to the bridge `bridge`.
    pub async fn set_controller(&self, port: &str, bridge: &str) -> Result<(), NetlinkError> {
        let (p, b) = (
            self.require_link(port).await?,
            self.require_link(bridge).await?,
        );
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(p).controller(b).build())
            .execute()
            .await
            .map_err(req(format!("adding {port:?} to bridge {bridge:?}")))
    }

    /// Sets an interface administratively up.
    pub async fn set_up(&self, name: &str) -> Result<(), NetlinkError> {
        self.set_admin(name, true).await
    }

    /// Sets an interface administratively down.
    pub async fn set_down(&self, name: &str) -> Result<(), NetlinkError> {
        self.set_admin(name, false).await
    }

    /// Sets an interface's MTU.
    pub async fn set_mtu(&self, name: &str, mtu: u32) -> Result<(), NetlinkError> {
        let index = self.require_link(name).await?;
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).mtu(mtu).build())
            .execute()
            .await
            .map_err(req(format!("setting the MTU of {name:?} to {mtu}")))
    }

    async fn set_admin(&self, name: &str, up: bool) -> Result<(), NetlinkError> {
        let index = self.require_link(name).await?;
        let msg = LinkUnspec::new_with_index(index);
        let msg = if up { msg.up() } else { msg.down() };
        self.handle
            .link()
            .set(msg.build())
            .execute()
            .await
            .map_err(req(format!(
                "setting {name:?} {}",
                if up { "up" } else { "down" }
            )))
    }

    /// Deletes an interface (for a veth, both ends go).
    pub async fn delete_link(&self, name: &str) -> Result<(), NetlinkError> {
        let index = self.require_link(name).await?;
        self.del_link(index, format!("deleting {name:?}")).await
    }

    /// Deletes the interface of index `index` (for a veth, both ends go):
    /// that one, whatever now bears its name.
    pub async fn delete_link_index(&self, index: u32) -> Result<(), NetlinkError> {
        self.del_link(index, format!("deleting the interface of index {index}"))
            .await
    }

    async fn del_link(&self, index: u32, what: String) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(req(what))
    }

    /// The classic tc filters of `name` at the clsact `direction`
    /// (`tc filter show dev NAME ingress|egress`); an interface that has
    /// no clsact qdisc has none.
    pub async fn tc_filters(
        &self,
        name: &str,
        direction: TcDirection,
    ) -> Result<Vec<TcFilter>, NetlinkError> {
        let index = self.require_link(name).await?;
        let get = self
            .handle
            .traffic_filter(i32::try_from(index).unwrap_or(i32::MAX))
            .get();
        let get = match direction {
            TcDirection::Ingress => get.ingress(),
            TcDirection::Egress => get.egress(),
        };
        let mut filters = Vec::new();
        let mut dump = get.execute();
        loop {
            match dump.try_next().await {
                Ok(Some(msg)) => filters.push(TcFilter::from_message(&msg)),
                Ok(None) => break,
                // No clsact qdisc: no filters (EINVAL on older kernels,
                // ENOENT on newer).
                Err(rtnetlink::Error::NetlinkError(e))
                    if matches!(-e.raw_code(), libc::EINVAL | libc::ENOENT) =>
                {
                    break;
                }
                Err(e) => return Err(req(format!("listing tc filters of {name:?}"))(e)),
            }
        }
        // A dump lists each filter's chain head (no handle) too.
        filters.retain(|f| f.handle != 0);
        Ok(filters)
    }

    /// Whether `name` has a clsact qdisc.
    pub async fn has_clsact(&self, name: &str) -> Result<bool, NetlinkError> {
        let index = self.require_link(name).await?;
        let mut dump = self
            .handle
            .qdisc()
            .get()
            .index(i32::try_from(index).unwrap_or(i32::MAX))
            .execute();
        while let Some(q) = dump
            .try_next()
            .await
            .map_err(req(format!("listing the qdiscs of {name:?}")))?
        {
            let clsact = q.header.index == i32::try_from(index).unwrap_or(i32::MAX)
                && q.attributes
                    .iter()
                    .any(|a| matches!(a, TcAttribute::Kind(k) if k == "clsact"));
            if clsact {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Deletes the clsact qdisc of `name` (and with it every filter under
    /// it); none there is not an error.
    pub async fn delete_clsact(&self, name: &str) -> Result<(), NetlinkError> {
        let Some(index) = self.link_index(name).await? else {
            return Ok(());
        };
        let mut del = self
            .handle
            .qdisc()
            .del(i32::try_from(index).unwrap_or(i32::MAX));
        let msg = del.message_mut();
        msg.header.parent = netlink_packet_route::tc::TcHandle {
            major: 0xffff,
            minor: 0xfff1,
        };
        msg.header.handle = netlink_packet_route::tc::TcHandle {
            major: 0xffff,
            minor: 0,
        };
        match del.execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e))
                if matches!(-e.raw_code(), libc::EINVAL | libc::ENOENT) =>
            {
                Ok(())
            }
            Err(e) => Err(req(format!("deleting the clsact qdisc of {name:?}"))(e)),
        }
    }

    /// Gives `name` a root `pfifo` queue of `packets` (its transmit queue
    /// length, which a `pfifo` without options takes as its limit), as a
    /// NIC's driver queue has: a veth has none, and one whose receiver
    /// runs in a NAPI thread drops what its 256-slot ring cannot take
    /// instead of holding the sender back.
    pub async fn set_fifo_queue(&self, name: &str, packets: u32) -> Result<(), NetlinkError> {
        use netlink_packet_core::{
            NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage,
        };
        use netlink_packet_route::{
            RouteNetlinkMessage,
            tc::{TcHandle, TcMessage},
        };
        let index = self.require_link(name).await?;
        let op = || format!("a pfifo queue of {packets} packets on {name:?}");
        self.handle
            .link()
            .set(
                LinkUnspec::new_with_index(index)
                    .txqueuelen(packets)
                    .build(),
            )
            .execute()
            .await
            .map_err(req(op()))?;
        let mut msg = TcMessage::with_index(i32::try_from(index).unwrap_or(i32::MAX));
        msg.header.parent = TcHandle::ROOT;
        msg.attributes.push(TcAttribute::Kind("pfifo".into()));
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(msg));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        let mut handle = self.handle.clone();
        let mut answers = handle.request(request).map_err(req(op()))?;
        while let Some(answer) = futures::StreamExt::next(&mut answers).await {
            if let netlink_packet_core::NetlinkPayload::Error(e) = answer.payload
                && e.code.is_some()
            {
                return Err(req(op())(rtnetlink::Error::NetlinkError(e)));
            }
        }
        Ok(())
    }

    /// The interface's `IFLA_STATS64` counters.
    pub async fn link_stats(&self, name: &str) -> Result<LinkStats, NetlinkError> {
        let link = self.require_link_by_name(name).await?;
        let stats = link.attributes.iter().find_map(|a| match a {
            LinkAttribute::Stats64(s) => Some(LinkStats {
                rx_packets: s.rx_packets,
                tx_packets: s.tx_packets,
                rx_bytes: s.rx_bytes,
                tx_bytes: s.tx_bytes,
                rx_dropped: s.rx_dropped,
                tx_dropped: s.tx_dropped,
            }),
            _ => None,
        });
        Ok(stats.unwrap_or_default())
    }
}

/// Sends `()` on `events` for every link event (new, changed, deleted link)
/// and address event (IPv4 or IPv6 address added or removed) in the
/// namespace of the calling thread, until the multicast stream ends.
/// Run it on a runtime that lives in that namespace. A subscriber that
/// lags only misses wake-ups it would have coalesced anyway.
pub async fn watch_links(events: tokio::sync::broadcast::Sender<()>) -> Result<(), NetlinkError> {
    use futures::StreamExt as _;
    let (conn, _handle, mut messages) =
        // Addresses too: the kernel drops the routes through an address's
        // network with it (an IPv6 address goes with `disable_ipv6`
        // without any link event), and the agent's routes must come back.
        rtnetlink::new_multicast_connection(&[
            rtnetlink::MulticastGroup::Link,
            rtnetlink::MulticastGroup::Ipv4Ifaddr,
            rtnetlink::MulticastGroup::Ipv6Ifaddr,
        ])
            .map_err(NetlinkError::Socket)?;
    let task = tokio::spawn(conn);
    while messages.next().await.is_some() {
        let _ = events.send(());
    }
    task.abort();
    Ok(())
}

/// A link's index and MAC address (zero when it has none).
fn l2_of(link: &LinkMessage) -> (u32, [u8; 6]) {
    let mac = link
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(m) => <[u8; 6]>::try_from(m.as_slice()).ok(),
            _ => None,
        })
        .unwrap_or_default();
    (link.header.index, mac)
}

/// Whether a link is a veth or a netkit device whose peer lives in
/// another namespace: the kernel reports `IFLA_LINK_NETNSID` for such a
/// device only when the peer's namespace is not its own.
fn peer_in_other_netns(link: &LinkMessage) -> bool {
    let paired = link.attributes.iter().any(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos
            .iter()
            .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth | InfoKind::Netkit))),
        _ => false,
    });
    paired
        && link
            .attributes
            .iter()
            .any(|a| matches!(a, LinkAttribute::LinkNetNsId(_)))
}
