//! The decision for one address: which WireGuard peer covers it (the
//! longest AllowedIPs prefix, as WireGuard's own routing picks), whether
//! that is its node's peer, where its probes left, and how old the
//! peer's handshake is.

use std::{
    collections::HashMap,
    fmt::Write as _,
    net::IpAddr,
    time::{Duration, SystemTime},
};

use ipnet::IpNet;

use super::state::{EncState, PathEncryption};
use crate::sys::wireguard::WgDevice;

/// Probe packets to one address over the last rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Through the WireGuard device.
    pub tunnel: u64,
    /// Through any other interface.
    pub plain: u64,
}

/// Which peer of a device WireGuard sends each address to: its
/// AllowedIPs by prefix length, longest first, so that an address is
/// looked up once per distinct length (a handful), not against every
/// peer: O(addresses) per round, not O(addresses x peers).
#[derive(Debug, Default)]
pub struct Coverage {
    by_prefix: Vec<(u8, HashMap<IpNet, usize>)>,
}

impl Coverage {
    #[must_use]
    pub fn of(device: &WgDevice) -> Self {
        let mut by_len: HashMap<u8, HashMap<IpNet, usize>> = HashMap::new();
        for (i, p) in device.peers.iter().enumerate() {
            for net in &p.allowed_ips {
                // WireGuard keeps each network on one peer; the first wins.
                by_len
                    .entry(net.prefix_len())
                    .or_default()
                    .entry(net.trunc())
                    .or_insert(i);
            }
        }
        let mut by_prefix: Vec<(u8, HashMap<IpNet, usize>)> = by_len.into_iter().collect();
        by_prefix.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        Self { by_prefix }
    }

    /// The peer whose AllowedIPs hold `ip` most specifically.
    #[must_use]
    pub fn peer(&self, ip: IpAddr) -> Option<usize> {
        self.by_prefix.iter().find_map(|(len, nets)| {
            let net = IpNet::new(ip, *len).ok()?.trunc();
            nets.get(&net).copied()
        })
    }
}

/// What decides a verdict besides the address's own figures.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub device: &'a WgDevice,
    /// The device's AllowedIPs, made once per judgement.
    pub coverage: &'a Coverage,
    pub now: SystemTime,
    /// Rekey time plus the margin.
    pub stale_after: Duration,
    /// Interfaces of the node with an address that no counting program
    /// watches (not Ethernet): probes leaving through them are not seen.
    pub unwatched: &'a [String],
}

/// `ip`'s encryption: `expected` is the peer that covers its node's own
/// address (of the same family), when one does.
#[must_use]
pub fn judge(cx: Context<'_>, ip: IpAddr, expected: Option<usize>, seen: Seen) -> PathEncryption {
    let dev = cx.device;
    let Some(i) = cx.coverage.peer(ip) else {
        return verdict(
            EncState::NotCovered,
            None,
            format!(
                "{ip} is outside the AllowedIPs of every peer of {}",
                dev.name
            ),
        );
    };
    let peer = &dev.peers[i];
    let key = Some(peer.public_key.clone());
    if let Some(e) = expected.filter(|e| *e != i) {
        return verdict(
            EncState::NotCovered,
            key,
            format!(
                "{ip} is in the AllowedIPs of peer {}, not of its node's peer {}",
                short(&peer.public_key),
                short(&dev.peers[e].public_key)
            ),
        );
    }
    if seen.plain > 0 {
        return verdict(
            EncState::Plaintext,
            key,
            format!(
                "{} probe packets to {ip} left through an interface other than {} in the last rounds",
                seen.plain, dev.name
            ),
        );
    }
    if seen.tunnel == 0 {
        let mut why = format!("no probe to {ip} left in the last rounds");
        if !cx.unwatched.is_empty() {
            let _ = write!(
                why,
                " through {} or a watched interface; probes through {} (not Ethernet) are not \
                 counted",
                dev.name,
                cx.unwatched.join(", ")
            );
        }
        return verdict(EncState::Unobserved, key, why);
    }
    // A handshake dated ahead of the clock by more than a read's race: the
    // clock stepped back, and its age says nothing.
    if let Some(ahead) = peer
        .last_handshake
        .and_then(|t| t.duration_since(cx.now).ok())
        .filter(|a| *a > HANDSHAKE_SLACK)
    {
        return verdict(
            EncState::Stale,
            key,
            format!(
                "probes went to peer {} but its last handshake is dated {} ahead of this node's clock (did the clock step back?)",
                short(&peer.public_key),
                humantime::format_duration(Duration::from_secs(ahead.as_secs()))
            ),
        );
    }
    let age = peer
        .last_handshake
        .map(|t| cx.now.duration_since(t).unwrap_or_default());
    match age {
        None => verdict(
            EncState::Stale,
            key,
            format!(
                "probes went to peer {} but it never completed a handshake",
                short(&peer.public_key)
            ),
        ),
        Some(age) if age > cx.stale_after => verdict(
            EncState::Stale,
            key,
            format!(
                "probes went to peer {} but its last handshake was {} ago (more than {})",
                short(&peer.public_key),
                humantime::format_duration(Duration::from_secs(age.as_secs())),
                humantime::format_duration(cx.stale_after)
            ),
        ),
        Some(_) => PathEncryption {
            state: EncState::Encrypted,
            peer: key,
            reason: None,
        },
    }
}

/// How far ahead of the judging time a handshake may be dated: one that
/// completed between the clock's read and the device's.
const HANDSHAKE_SLACK: Duration = Duration::from_secs(5);

fn verdict(state: EncState, peer: Option<String>, reason: String) -> PathEncryption {
    PathEncryption {
        state,
        peer,
        reason: Some(reason),
    }
}

/// The first characters of a key, as logs show it.
fn short(key: &str) -> &str {
    key.get(..8).unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::wireguard::WgPeer;

    fn peer(key: &str, allowed: &[&str], handshake: Option<u64>) -> WgPeer {
        WgPeer {
            public_key: key.into(),
            endpoint: None,
            allowed_ips: allowed.iter().map(|a| a.parse().expect("net")).collect(),
            last_handshake: handshake.map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
            tx_bytes: 0,
            rx_bytes: 0,
        }
    }

    const NOW: u64 = 1_000_000;

    fn device() -> WgDevice {
        WgDevice {
            name: "wg0".into(),
            index: 5,
            peers: vec![
                peer(
                    "BBBBBBBBkey",
                    &["198.18.1.12/32", "198.18.65.0/24"],
                    Some(NOW - 30),
                ),
                peer("CCCCCCCCkey", &["198.18.1.13/32"], Some(NOW - 200)),
                // A wide prefix: the more specific one wins.
                peer("DDDDDDDDkey", &["198.18.0.0/15"], None),
            ],
        }
    }

    fn cx<'a>(d: &'a WgDevice, coverage: &'a Coverage) -> Context<'a> {
        Context {
            device: d,
            coverage,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(NOW),
            stale_after: Duration::from_secs(180),
            unwatched: &[],
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    const TUNNEL: Seen = Seen {
        tunnel: 4,
        plain: 0,
    };

    #[test]
    fn the_most_specific_allowed_ips_pick_the_peer() {
        let c = Coverage::of(&device());
        assert_eq!(c.peer(ip("198.18.1.12")), Some(0));
        assert_eq!(c.peer(ip("198.18.65.9")), Some(0));
        assert_eq!(c.peer(ip("198.18.1.99")), Some(2));
        assert_eq!(c.peer(ip("2001:2::12")), None);
    }

    #[test]
    fn probes_through_the_tunnel_to_a_fresh_peer_are_encrypted() {
        let d = device();
        let c = Coverage::of(&d);
        let v = judge(cx(&d, &c), ip("198.18.65.9"), Some(0), TUNNEL);
        assert_eq!(v.state, EncState::Encrypted, "{v:?}");
        assert_eq!(v.peer.as_deref(), Some("BBBBBBBBkey"));
        assert_eq!(v.reason, None);
    }

    #[test]
    fn any_probe_in_plain_text_is_plaintext_even_beside_tunnelled_ones() {
        let d = device();
        let c = Coverage::of(&d);
        let v = judge(
            cx(&d, &c),
            ip("198.18.1.12"),
            Some(0),
            Seen {
                tunnel: 3,
                plain: 1,
            },
        );
        assert_eq!(v.state, EncState::Plaintext);
        assert!(v.reason.expect("why").contains("other than wg0"));
    }

    #[test]
    fn an_address_outside_every_allowed_ips_or_in_another_nodes_peer_is_not_covered() {
        let d = device();
        let c = Coverage::of(&d);
        let v = judge(cx(&d, &c), ip("2001:2::99"), None, TUNNEL);
        assert_eq!(v.state, EncState::NotCovered);
        assert!(v.reason.expect("why").contains("outside the AllowedIPs"));
        // The health address is in the wide peer's AllowedIPs, but the
        // node's own address is in B's.
        let v = judge(cx(&d, &c), ip("198.18.66.1"), Some(0), TUNNEL);
        assert_eq!(v.state, EncState::NotCovered);
        assert_eq!(v.peer.as_deref(), Some("DDDDDDDDkey"));
        assert!(
            v.reason
                .expect("why")
                .contains("not of its node's peer BBBBBBBB"),
            "names both peers"
        );
    }

    #[test]
    fn an_old_or_missing_handshake_is_stale_only_while_probes_flow() {
        let d = device();
        let c = Coverage::of(&d);
        let v = judge(cx(&d, &c), ip("198.18.1.13"), Some(1), TUNNEL);
        assert_eq!(v.state, EncState::Stale, "200 s > 180 s");
        assert!(v.reason.expect("why").contains("3m 20s ago"));
        let v = judge(cx(&d, &c), ip("198.18.1.99"), None, TUNNEL);
        assert_eq!(v.state, EncState::Stale);
        assert!(v.reason.expect("why").contains("never"));
        // Dated an hour ahead (the clock stepped back): not fresh.
        let mut ahead = device();
        ahead.peers[1].last_handshake = Some(cx(&d, &c).now + Duration::from_secs(3_600));
        let a = Coverage::of(&ahead);
        let v = judge(cx(&ahead, &a), ip("198.18.1.13"), Some(1), TUNNEL);
        assert_eq!(v.state, EncState::Stale);
        assert!(
            v.reason.expect("why").contains("dated 1h ahead"),
            "names how far"
        );
        // A second ahead: a handshake made as the device was read.
        ahead.peers[1].last_handshake = Some(cx(&d, &c).now + Duration::from_secs(1));
        let a = Coverage::of(&ahead);
        let v = judge(cx(&ahead, &a), ip("198.18.1.13"), Some(1), TUNNEL);
        assert_eq!(v.state, EncState::Encrypted);
        // Idle: no probe went to it, so an old handshake says nothing.
        let v = judge(cx(&d, &c), ip("198.18.1.13"), Some(1), Seen::default());
        assert_eq!(v.state, EncState::Unobserved);
        assert!(!v.reason.expect("why").contains("not counted"));
    }

    /// Where some interface of the node is not watched, an unobserved
    /// address's reason names it: its probes may be leaving there.
    #[test]
    fn an_unobserved_address_names_the_interfaces_not_watched() {
        let (d, c) = (device(), Coverage::of(&device()));
        let unwatched = ["tun0".to_owned(), "ipip1".to_owned()];
        let cx = Context {
            unwatched: &unwatched,
            ..cx(&d, &c)
        };
        let v = judge(cx, ip("198.18.65.9"), Some(0), Seen::default());
        assert_eq!(v.state, EncState::Unobserved);
        let why = v.reason.expect("why");
        assert!(
            why.contains("probes through tun0, ipip1 (not Ethernet) are not counted"),
            "{why}"
        );
        // Seen in the tunnel: encrypted, whatever is not watched.
        let v = judge(cx, ip("198.18.65.9"), Some(0), TUNNEL);
        assert_eq!(v.state, EncState::Encrypted);
    }
}
