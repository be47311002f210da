//! Probe packets seen leaving the node, for the encryption check: the
//! programs on the egress of the WireGuard device and of every other
//! interface count, per destination the agent watches, the probes that
//! left through the tunnel and those that left in plain text.
//!
//! A probe is what the agent sends: an ICMP or `ICMPv6` echo request, or
//! a TCP segment to the hello port ([`HELLO_PORT`]).

use crate::{
    ct::{IPPROTO_TCP, v4_mapped},
    frame::Frame,
    headers::{
        EthHdr, ICMP_ECHO_REQUEST, ICMPV6_ECHO_REQUEST, IPPROTO_ICMP, IPPROTO_ICMPV6, Ipv4Hdr,
        Ipv6Hdr, ipv4_header_len, is_later_fragment,
    },
};

/// The port of the agents' HTTP hello server, which HTTP probes go to.
pub const HELLO_PORT: u16 = 4240;

/// A watched destination: an IPv6 address, or an IPv4 one mapped
/// (`::ffff:a.b.c.d`), as connection tracking keys them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    pub addr: [u8; 16],
}

/// Probe packets to one watched destination, on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchCounts {
    /// Left through the WireGuard device (before encryption).
    pub tunnel: u64,
    /// Left through any other watched interface: in plain text.
    pub plain: u64,
}

const _: () = assert!(size_of::<WatchKey>() == 16 && align_of::<WatchKey>() == 1);
const _: () = assert!(size_of::<WatchCounts>() == 16);

// SAFETY: repr(C), no padding (asserted above), every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for WatchKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for WatchCounts {}

/// Where a frame's network header starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Ethernet: the IP header follows a 14-byte Ethernet header.
    Ethernet,
    /// A layer-3 device (WireGuard's): the frame is the IP packet.
    None,
}

/// The destination of `frame` when it is a probe packet (an echo request,
/// or TCP to the hello port); `None` for anything else, a later IPv4
/// fragment, an IPv6 packet with an extension header, or a truncated one.
#[inline(always)]
pub fn probe_destination<F: Frame>(frame: &mut F, link: Link) -> Option<WatchKey> {
    let l3 = match link {
        Link::Ethernet => EthHdr::LEN,
        Link::None => 0,
    };
    // Read as a whole IPv4 header (the shortest probe's is at least this
    // long): a one-byte bound compiles to a comparison the verifier
    // cannot use to bound a packet pointer.
    let version = frame.read::<[u8; 20]>(l3)?[0] >> 4;
    if let Link::Ethernet = link {
        // The EtherType must agree with the header's version.
        let eth = frame.read::<EthHdr>(0)?;
        let ok = match version {
            4 => crate::headers::is_ipv4(&eth),
            6 => crate::headers::is_ipv6(&eth),
            _ => false,
        };
        if !ok {
            return None;
        }
    }
    match version {
        4 => ipv4_probe(frame, l3),
        6 => ipv6_probe(frame, l3),
        _ => None,
    }
}

#[inline(always)]
fn ipv4_probe<F: Frame>(frame: &mut F, l3: usize) -> Option<WatchKey> {
    let ip = frame.read::<Ipv4Hdr>(l3)?;
    let ihl = ipv4_header_len(&ip);
    if !(20..=60).contains(&ihl) || is_later_fragment(&ip) {
        return None;
    }
    is_probe(frame, ip.proto, l3 + ihl, IPPROTO_ICMP, ICMP_ECHO_REQUEST).then(|| WatchKey {
        addr: v4_mapped(ip.dst_addr),
    })
}

#[inline(always)]
fn ipv6_probe<F: Frame>(frame: &mut F, l3: usize) -> Option<WatchKey> {
    let ip = frame.header_mut::<Ipv6Hdr>(l3)?;
    let (next, dst) = (ip.next_hdr, ip.dst_addr);
    is_probe(
        frame,
        next,
        l3 + Ipv6Hdr::LEN,
        IPPROTO_ICMPV6,
        ICMPV6_ECHO_REQUEST,
    )
    .then_some(WatchKey { addr: dst })
}

/// Whether the L4 header at `l4` of protocol `proto` is an echo request
/// (`icmp` of type `request`) or TCP to the hello port.
#[inline(always)]
fn is_probe<F: Frame>(frame: &mut F, proto: u8, l4: usize, icmp: u8, request: u8) -> bool {
    if proto == icmp {
        // The whole echo header (type, code, checksum, identifier,
        // sequence) must be there.
        return frame.read::<[u8; 8]>(l4).is_some_and(|h| h[0] == request);
    }
    if proto == IPPROTO_TCP {
        // The destination port: bytes 2 and 3 of the TCP header, which
        // must be there whole (20 bytes).
        return frame
            .read::<[u8; 20]>(l4)
            .is_some_and(|h| [h[2], h[3]] == HELLO_PORT.to_be_bytes());
    }
    false
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::frame::SliceFrame;

    fn ipv4(proto: u8, l4: &[u8], flags_frag: [u8; 2]) -> Vec<u8> {
        let mut p = std::vec![
            0x45,
            0,
            0,
            0,
            0,
            0,
            flags_frag[0],
            flags_frag[1],
            64,
            proto,
            0,
            0,
            198,
            18,
            0,
            11,
            198,
            18,
            1,
            12,
        ];
        p.extend_from_slice(l4);
        p
    }

    fn ipv6(next: u8, l4: &[u8]) -> Vec<u8> {
        let mut p = std::vec![0x60, 0, 0, 0];
        let len = u16::try_from(l4.len()).expect("short");
        p.extend_from_slice(&len.to_be_bytes());
        p.extend_from_slice(&[next, 64]);
        p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11]);
        p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12]);
        p.extend_from_slice(l4);
        p
    }

    fn eth(ethertype: [u8; 2], ip: &[u8]) -> Vec<u8> {
        let mut f = std::vec![0u8; 12];
        f.extend_from_slice(&ethertype);
        f.extend_from_slice(ip);
        f
    }

    fn tcp(dport: u16) -> [u8; 20] {
        let mut t = [0u8; 20];
        t[0..2].copy_from_slice(&40_000u16.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[12] = 0x50;
        t[13] = 0x02;
        t
    }

    fn dst(mut bytes: Vec<u8>, link: Link) -> Option<WatchKey> {
        probe_destination(&mut SliceFrame::new(&mut bytes), link)
    }

    const PEER4: [u8; 4] = [198, 18, 1, 12];

    #[test]
    fn echo_requests_and_hello_segments_are_probes_on_either_link() {
        let echo = ipv4(IPPROTO_ICMP, &[8, 0, 0, 0, 0, 1, 0, 1], [0, 0]);
        let want = Some(WatchKey {
            addr: v4_mapped(PEER4),
        });
        assert_eq!(dst(echo.clone(), Link::None), want);
        assert_eq!(dst(eth([0x08, 0x00], &echo), Link::Ethernet), want);
        let hello = ipv4(IPPROTO_TCP, &tcp(HELLO_PORT), [0x40, 0]);
        assert_eq!(dst(hello, Link::None), want);
        let echo6 = ipv6(IPPROTO_ICMPV6, &[128, 0, 0, 0, 0, 1, 0, 1]);
        let got = dst(eth([0x86, 0xdd], &echo6), Link::Ethernet).expect("a probe");
        assert_eq!(got.addr[15], 0x12);
        assert_eq!(
            dst(ipv6(IPPROTO_TCP, &tcp(HELLO_PORT)), Link::None),
            Some(got)
        );
    }

    #[test]
    fn everything_else_is_not_counted() {
        // An echo reply, TCP to another port, UDP (WireGuard's own).
        for ip in [
            ipv4(IPPROTO_ICMP, &[0, 0, 0, 0, 0, 1, 0, 1], [0, 0]),
            ipv4(IPPROTO_TCP, &tcp(443), [0, 0]),
            ipv4(17, &[0xca, 0x6c, 0xca, 0x6c, 0, 8, 0, 0], [0, 0]),
            // A later fragment: its first bytes are not an L4 header.
            ipv4(IPPROTO_ICMP, &[8, 0, 0, 0, 0, 1, 0, 1], [0, 0x10]),
            // Truncated TCP.
            ipv4(IPPROTO_TCP, &tcp(HELLO_PORT)[..10], [0, 0]),
            ipv6(IPPROTO_ICMPV6, &[129, 0, 0, 0]),
            // A fragment header before the echo.
            ipv6(44, &[58, 0, 0, 0, 0, 0, 0, 1, 128, 0, 0, 0]),
            std::vec![0x45],
            Vec::new(),
        ] {
            assert_eq!(dst(ip.clone(), Link::None), None, "{ip:?}");
            assert_eq!(dst(eth([0x08, 0x00], &ip), Link::Ethernet), None);
        }
        // The EtherType and the version must agree; ARP is never a probe.
        let echo = ipv4(IPPROTO_ICMP, &[8, 0, 0, 0, 0, 1, 0, 1], [0, 0]);
        assert_eq!(dst(eth([0x86, 0xdd], &echo), Link::Ethernet), None);
        assert_eq!(dst(eth([0x08, 0x06], &echo), Link::Ethernet), None);
    }
}
