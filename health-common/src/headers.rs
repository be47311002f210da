//! Wire headers: the `network-types` structs (the design card's package),
//! shared by the kernel programs and the host, plus the few constants and
//! views the datapath needs on top of them.
//!
//! `Ipv4Hdr` and `Icmpv4Hdr` are byte-array structs of alignment 1, so a
//! pointer anywhere into a packet may be viewed as one in place.
//! `EthHdr` holds its `EtherType` as a `u16` (alignment 2): it is read and
//! written by value (`Frame::read`/`Frame::write`), never viewed in place.

pub use network_types::{
    eth::{EthHdr, EtherType},
    icmp::{Icmpv4Hdr, Icmpv6Hdr},
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    udp::UdpHdr,
};

/// `IPPROTO_ICMP`.
pub const IPPROTO_ICMP: u8 = 1;
/// ICMP echo request type.
pub const ICMP_ECHO_REQUEST: u8 = 8;
/// ICMP echo reply type.
pub const ICMP_ECHO_REPLY: u8 = 0;
/// TTL the responder gives its replies, like the kernel's `ip_default_ttl`.
pub const REPLY_TTL: u8 = 64;
/// `IPPROTO_ICMPV6` (the IPv6 next header).
pub const IPPROTO_ICMPV6: u8 = 58;
/// `NEXTHDR_FRAGMENT`.
pub const NEXTHDR_FRAGMENT: u8 = 44;
/// `ICMPv6` echo request type.
pub const ICMPV6_ECHO_REQUEST: u8 = 128;
/// `ICMPv6` echo reply type.
pub const ICMPV6_ECHO_REPLY: u8 = 129;
/// Hop limit the responder gives its replies, like the kernel's default
/// `net.ipv6.conf.*.hop_limit`.
pub const REPLY_HOP_LIMIT: u8 = 64;

/// Whether `eth` carries IPv6.
#[must_use]
#[inline(always)]
pub const fn is_ipv6(eth: &EthHdr) -> bool {
    eth.ether_type == EtherType::Ipv6 as u16
}

/// The IPv6 payload length (everything after the fixed header).
#[must_use]
#[inline(always)]
pub const fn ipv6_payload_len(ip: &Ipv6Hdr) -> usize {
    u16::from_be_bytes(ip.payload_len) as usize
}

/// Whether `next` is an IPv6 extension header (RFC 8200 and the IANA
/// registry: hop-by-hop, routing, fragment, ESP, AH, destination options,
/// mobility, HIP, shim6, the experimental values).
#[must_use]
#[inline(always)]
pub const fn is_ipv6_extension(next: u8) -> bool {
    matches!(
        next,
        0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254
    )
}

/// Whether `eth` carries IPv4 (`EtherType` values are stored in network
/// order, as the field is).
#[must_use]
#[inline(always)]
pub const fn is_ipv4(eth: &EthHdr) -> bool {
    eth.ether_type == EtherType::Ipv4 as u16
}

/// The 20 bytes of an IPv4 header (for the header checksum).
#[must_use]
#[inline(always)]
pub const fn ipv4_bytes(ip: &Ipv4Hdr) -> [u8; 20] {
    // SAFETY: `Ipv4Hdr` is repr(C), 20 bytes of u8 and [u8; N] fields with
    // no padding (asserted below): every byte is initialised.
    unsafe { core::mem::transmute::<Ipv4Hdr, [u8; 20]>(*ip) }
}

/// Whether the More Fragments flag or a fragment offset is set.
#[must_use]
#[inline(always)]
pub const fn is_fragment(ip: &Ipv4Hdr) -> bool {
    u16::from_be_bytes(ip.frags) & 0x3fff != 0
}

/// Whether the fragment offset is non-zero (a later fragment: no L4 header).
#[must_use]
#[inline(always)]
pub const fn is_later_fragment(ip: &Ipv4Hdr) -> bool {
    u16::from_be_bytes(ip.frags) & 0x1fff != 0
}

/// The IPv4 header's length in bytes (IHL * 4).
#[must_use]
#[inline(always)]
pub const fn ipv4_header_len(ip: &Ipv4Hdr) -> usize {
    ((ip.vihl & 0x0f) as usize) * 4
}

/// The IPv4 total length.
#[must_use]
#[inline(always)]
pub const fn ipv4_total_len(ip: &Ipv4Hdr) -> usize {
    u16::from_be_bytes(ip.tot_len) as usize
}

/// The TCP flags byte (CWR ... FIN), as the wire has it.
#[must_use]
#[inline(always)]
pub const fn tcp_flags(tcp: &TcpHdr) -> u8 {
    // SAFETY: `TcpHdr` is repr(C), 20 bytes of byte-array fields with no
    // padding (asserted below); the flags are its 14th byte.
    let bytes = unsafe { core::mem::transmute::<TcpHdr, [u8; 20]>(*tcp) };
    bytes[13]
}

/// The identifier and sequence of an echo request or reply.
#[must_use]
#[inline(always)]
pub const fn echo_id_seq(icmp: &Icmpv4Hdr) -> ([u8; 2], [u8; 2]) {
    ([icmp.data[0], icmp.data[1]], [icmp.data[2], icmp.data[3]])
}

const _: () = {
    assert!(size_of::<EthHdr>() == EthHdr::LEN && EthHdr::LEN == 14);
    assert!(size_of::<Ipv4Hdr>() == Ipv4Hdr::LEN && Ipv4Hdr::LEN == 20);
    assert!(size_of::<Icmpv4Hdr>() == Icmpv4Hdr::LEN && Icmpv4Hdr::LEN == 8);
    assert!(size_of::<Ipv6Hdr>() == Ipv6Hdr::LEN && Ipv6Hdr::LEN == 40);
    assert!(size_of::<Icmpv6Hdr>() == Icmpv6Hdr::LEN && Icmpv6Hdr::LEN == 8);
    assert!(align_of::<Ipv6Hdr>() == 1);
    assert!(align_of::<Icmpv6Hdr>() == 1);
    assert!(align_of::<Ipv4Hdr>() == 1);
    assert!(align_of::<Icmpv4Hdr>() == 1);
    assert!(size_of::<TcpHdr>() == 20 && align_of::<TcpHdr>() == 1);
    assert!(size_of::<UdpHdr>() == 8 && align_of::<UdpHdr>() == 1);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_of_a_known_header() {
        let bytes: [u8; 20] = [
            0x45, 0, 0, 84, 0x12, 0x34, 0x20, 0, 64, 1, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2,
        ];
        // SAFETY: 20 bytes into a 20-byte, alignment-1 header.
        let ip: Ipv4Hdr = unsafe { core::mem::transmute(bytes) };
        assert_eq!(ipv4_bytes(&ip), bytes);
        assert_eq!(ipv4_header_len(&ip), 20);
        assert_eq!(ipv4_total_len(&ip), 84);
        assert!(is_fragment(&ip), "MF set");
        assert!(!is_later_fragment(&ip), "offset 0");
        let eth = EthHdr {
            dst_addr: [0; 6],
            src_addr: [0; 6],
            ether_type: u16::from_ne_bytes([0x08, 0x00]),
        };
        assert!(is_ipv4(&eth));
    }
}
