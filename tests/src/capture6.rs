//! An IPv6 packet capture on one interface of a namespace (an `AF_PACKET`
//! socket, both directions, as [`crate::capture`] does for IPv4): addresses,
//! next header and the port or echo identifier of every IPv6 packet.

use std::net::Ipv6Addr;

use health_agent::sys::netns::Netns;

use crate::capture::Running;

/// One IPv6 packet seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen6 {
    /// The whole IPv6 packet (no link header).
    pub bytes: Vec<u8>,
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// The fixed header's next header.
    pub next: u8,
    /// `ICMPv6`: type; otherwise 0.
    pub icmp_type: u8,
    /// TCP/UDP ports; `ICMPv6` echo: the identifier as `sport`, 0.
    pub sport: u16,
    pub dport: u16,
}

impl Seen6 {
    fn parse(ip: &[u8]) -> Option<Self> {
        if ip.len() < 40 + 8 || ip[0] >> 4 != 6 {
            return None;
        }
        let octets =
            |b: &[u8]| -> Option<Ipv6Addr> { <[u8; 16]>::try_from(b).ok().map(Ipv6Addr::from) };
        let l4 = &ip[40..];
        let word = |i: usize| u16::from_be_bytes([l4[i], l4[i + 1]]);
        let next = ip[6];
        let (icmp_type, sport, dport) = match next {
            58 => (l4[0], word(4), 0),
            _ => (0, word(0), word(2)),
        };
        Some(Self {
            bytes: ip.to_vec(),
            src: octets(&ip[8..24])?,
            dst: octets(&ip[24..40])?,
            next,
            icmp_type,
            sport,
            dport,
        })
    }

    /// The frame's length on an Ethernet link (what tc programs count).
    #[must_use]
    pub fn frame_len(&self) -> u64 {
        self.bytes.len() as u64 + 14
    }
}

/// A running IPv6 capture.
pub type Capture6 = Running<Seen6>;

const ETH_P_IPV6: u16 = 0x86dd;

impl Running<Seen6> {
    /// Starts capturing IPv6 on `iface` in `ns`.
    pub fn start(ns: &Netns, iface: &str) -> std::io::Result<Self> {
        crate::capture::start(ns, iface, ETH_P_IPV6, Seen6::parse)
    }
}
