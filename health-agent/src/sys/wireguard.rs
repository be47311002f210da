//! WireGuard devices as the kernel's `wireguard` generic-netlink family
//! reports them (what `wg show` prints): each peer's public key,
//! endpoint, AllowedIPs, last handshake and byte counters.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::{Duration, SystemTime},
};

use base64::prelude::{BASE64_STANDARD, Engine as _};
use futures::StreamExt as _;
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAllowedIpAttr, WireguardAttribute, WireguardCmd, WireguardMessage,
    WireguardPeerAttribute,
};

use crate::sys::netlink::{LinkSummary, NetlinkError, in_netns};

#[derive(Debug, thiserror::Error)]
pub enum WireguardError {
    #[error(
        "the kernel has no WireGuard: its generic-netlink family \"wireguard\" is unknown \
         (is the wireguard module available?)"
    )]
    NoFamily,
    #[error("reading WireGuard device {device:?} through generic netlink: {detail}")]
    Read { device: String, detail: String },
    #[error("opening a generic-netlink socket")]
    Socket(#[source] std::io::Error),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// One peer of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgPeer {
    /// Base64, as `wg` shows it.
    pub public_key: String,
    pub endpoint: Option<SocketAddr>,
    pub allowed_ips: Vec<IpNet>,
    /// `None`: no handshake yet.
    pub last_handshake: Option<SystemTime>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
}

/// One WireGuard device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgDevice {
    pub name: String,
    pub index: u32,
    pub peers: Vec<WgPeer>,
}

/// The namespace's interfaces and every WireGuard device among them, with
/// its peers (the calling thread's namespace; blocking).
pub fn read() -> Result<(Vec<LinkSummary>, Vec<WgDevice>), WireguardError> {
    let links = in_netns(None, |nl| async move { nl.links().await })?;
    let names: Vec<String> = links
        .iter()
        .filter(|l| l.is_wireguard())
        .map(|l| l.name.clone())
        .collect();
    if names.is_empty() {
        return Ok((links, Vec::new()));
    }
    let devices = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(WireguardError::Socket)?;
            rt.block_on(devices(&names))
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })?;
    Ok((links, devices))
}

async fn devices(names: &[String]) -> Result<Vec<WgDevice>, WireguardError> {
    let (conn, mut handle, _) = genetlink::new_connection().map_err(WireguardError::Socket)?;
    let task = tokio::spawn(conn);
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match device(&mut handle, name).await {
            Ok(d) => out.push(d),
            Err(e) => {
                task.abort();
                return Err(e);
            }
        }
    }
    task.abort();
    Ok(out)
}

async fn device(
    handle: &mut genetlink::GenetlinkHandle,
    name: &str,
) -> Result<WgDevice, WireguardError> {
    let read_err = |detail: String| WireguardError::Read {
        device: name.to_owned(),
        detail,
    };
    let mut msg = NetlinkMessage::from(GenlMessage::from_payload(WireguardMessage {
        cmd: WireguardCmd::GetDevice,
        attributes: vec![WireguardAttribute::IfName(name.to_owned())],
    }));
    msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut replies = match handle.request(msg).await {
        Ok(r) => r,
        // Resolving the family's ID: ENOENT when the kernel has none.
        Err(genetlink::GenetlinkError::NetlinkError(e))
            if e.raw_os_error() == Some(libc::ENOENT) =>
        {
            return Err(WireguardError::NoFamily);
        }
        Err(e) => return Err(read_err(e.to_string())),
    };
    let mut dev = WgDevice {
        name: name.to_owned(),
        index: 0,
        peers: Vec::new(),
    };
    // A large device comes in several messages; a peer whose AllowedIPs
    // do not fit one message goes on in the next, named again by its key.
    let mut peers: BTreeMap<String, WgPeer> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    while let Some(reply) = replies.next().await {
        let reply = reply.map_err(|e| read_err(e.to_string()))?;
        match reply.payload {
            NetlinkPayload::InnerMessage(genl) => {
                for attr in genl.payload.attributes {
                    match attr {
                        WireguardAttribute::IfIndex(i) => dev.index = i,
                        WireguardAttribute::Peers(list) => {
                            for p in list {
                                merge_peer(&mut peers, &mut order, &p.0);
                            }
                        }
                        _ => {}
                    }
                }
            }
            NetlinkPayload::Error(e) => {
                return Err(read_err(e.to_io().to_string()));
            }
            _ => {}
        }
    }
    dev.peers = order.iter().filter_map(|k| peers.remove(k)).collect();
    Ok(dev)
}

fn merge_peer(
    peers: &mut BTreeMap<String, WgPeer>,
    order: &mut Vec<String>,
    attrs: &[WireguardPeerAttribute],
) {
    let Some(key) = attrs.iter().find_map(|a| match a {
        WireguardPeerAttribute::PublicKey(k) => Some(BASE64_STANDARD.encode(k)),
        _ => None,
    }) else {
        return;
    };
    let peer = peers.entry(key.clone()).or_insert_with(|| {
        order.push(key.clone());
        WgPeer {
            public_key: key,
            endpoint: None,
            allowed_ips: Vec::new(),
            last_handshake: None,
            tx_bytes: 0,
            rx_bytes: 0,
        }
    });
    for a in attrs {
        match a {
            WireguardPeerAttribute::Endpoint(e) => peer.endpoint = Some(*e),
            WireguardPeerAttribute::LastHandshake(t) => {
                peer.last_handshake = handshake_time(t.seconds, t.nano_seconds);
            }
            WireguardPeerAttribute::TxBytes(n) => peer.tx_bytes = *n,
            WireguardPeerAttribute::RxBytes(n) => peer.rx_bytes = *n,
            WireguardPeerAttribute::AllowedIps(ips) => {
                peer.allowed_ips
                    .extend(ips.iter().filter_map(|ip| allowed_ip(&ip.0)));
            }
            _ => {}
        }
    }
}

/// The handshake's wall-clock time; zero is "never".
fn handshake_time(seconds: i64, nanos: i64) -> Option<SystemTime> {
    let (s, n) = (u64::try_from(seconds).ok()?, u32::try_from(nanos).ok()?);
    if s == 0 && n == 0 {
        return None;
    }
    SystemTime::UNIX_EPOCH.checked_add(Duration::new(s, n.min(999_999_999)))
}

fn allowed_ip(attrs: &[WireguardAllowedIpAttr]) -> Option<IpNet> {
    let addr: IpAddr = attrs.iter().find_map(|a| match a {
        WireguardAllowedIpAttr::IpAddr(ip) => Some(*ip),
        _ => None,
    })?;
    let cidr = attrs.iter().find_map(|a| match a {
        WireguardAllowedIpAttr::Cidr(c) => Some(*c),
        _ => None,
    })?;
    IpNet::new(addr, cidr).ok().map(|n| n.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_handshake_is_never() {
        assert_eq!(handshake_time(0, 0), None);
        assert_eq!(handshake_time(-1, 0), None);
        let t = handshake_time(1_700_000_000, 5).expect("a time");
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).expect("after"),
            Duration::new(1_700_000_000, 5)
        );
    }

    #[test]
    fn a_peer_split_over_messages_is_merged_by_its_key() {
        let key = [7u8; 32];
        let ip = |a: &str, c: u8| {
            netlink_packet_wireguard::WireguardAllowedIp(vec![
                WireguardAllowedIpAttr::IpAddr(a.parse().expect("ip")),
                WireguardAllowedIpAttr::Cidr(c),
            ])
        };
        let (mut peers, mut order) = (BTreeMap::new(), Vec::new());
        merge_peer(
            &mut peers,
            &mut order,
            &[
                WireguardPeerAttribute::PublicKey(key),
                WireguardPeerAttribute::TxBytes(10),
                WireguardPeerAttribute::AllowedIps(vec![ip("198.18.1.12", 32)]),
            ],
        );
        merge_peer(
            &mut peers,
            &mut order,
            &[
                WireguardPeerAttribute::PublicKey(key),
                // A host address with a shorter prefix is the network.
                WireguardPeerAttribute::AllowedIps(vec![ip("198.18.65.7", 24)]),
            ],
        );
        // No key: nothing to merge into.
        merge_peer(
            &mut peers,
            &mut order,
            &[WireguardPeerAttribute::TxBytes(1)],
        );
        assert_eq!(order.len(), 1);
        let p = &peers[&order[0]];
        assert_eq!(p.public_key, BASE64_STANDARD.encode(key));
        assert_eq!(p.tx_bytes, 10);
        assert_eq!(
            p.allowed_ips,
            [
                "198.18.1.12/32".parse::<IpNet>().expect("net"),
                "198.18.65.0/24".parse().expect("net")
            ]
        );
    }
}
