//! The ICMP echo responder's decision and rewrite, independent of where it
//! runs (XDP, tc, or a host unit test).

use crate::{
    checksum,
    frame::Frame,
    headers::{
        EthHdr, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IPPROTO_ICMP, Icmpv4Hdr, Ipv4Hdr, REPLY_TTL,
        ipv4_bytes, ipv4_header_len, ipv4_total_len, is_fragment, is_ipv4,
    },
    maps::{EchoConfig, EchoCounter},
};

/// Why a packet was handed on untouched.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassReason {
    NotIpv4,
    IpOptions,
    Fragment,
    NotIcmp,
    NoAddress,
    NotForEndpoint,
    MartianSource,
    NotEchoRequest,
    /// The destination MAC is another host's: the kernel drops it
    /// (`PACKET_OTHERHOST`).
    OtherHost,
    /// A unicast IP datagram in a link-layer broadcast or multicast frame
    /// where the interface drops those (`drop_unicast_in_l2_multicast`).
    UnicastInL2Multicast,
    /// The source MAC is a group address or zero: the kernel would answer
    /// its neighbour entry, not that address, so the stack decides.
    BadSourceMac,
    /// The frame carried (or carries) an 802.1Q/802.1ad tag: whether it is
    /// for this host depends on VLAN devices, so the stack decides.
    Vlan,
    /// The ICMP message is longer than the responder checksums
    /// ([`MAX_CHECKED_ICMP`]): the stack answers it.
    TooLong,
}

/// Why a packet was dropped as malformed.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MalformedReason {
    TruncatedEthernet,
    TruncatedIpv4,
    BadVersion,
    BadHeaderLength,
    /// IPv4 total length shorter than its header or longer than the frame.
    BadTotalLength,
    BadIpChecksum,
    TruncatedIcmp,
    /// The ICMP checksum over the datagram's ICMP message is wrong: the
    /// kernel drops such a request (`InCsumErrors`).
    BadIcmpChecksum,
}

/// What the responder did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The frame was rewritten in place into an echo reply of `len` bytes
    /// (the Ethernet header and the IPv4 datagram): cut anything beyond
    /// that (link padding, trailing bytes past the IPv4 total length) and
    /// send it back out of the interface it came in on.
    Reply {
        len: u16,
    },
    Pass(PassReason),
    Malformed(MalformedReason),
}

impl Verdict {
    #[must_use]
    #[inline(always)]
    pub const fn counter(self) -> EchoCounter {
        match self {
            Self::Reply { .. } => EchoCounter::Answered,
            Self::Pass(_) => EchoCounter::Passed,
            Self::Malformed(_) => EchoCounter::Malformed,
        }
    }
}

const IP_OFF: usize = EthHdr::LEN;
const ICMP_OFF: usize = EthHdr::LEN + Ipv4Hdr::LEN;

/// The longest ICMP message the responder checks and answers; a longer one
/// (jumbo frames) is passed to the stack.
pub const MAX_CHECKED_ICMP: usize = 16 * 1024;

/// Where a frame was addressed at the link layer, as the kernel's
/// `eth_type_trans` classifies it (`skb->pkt_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkDest {
    /// The interface's own MAC (`PACKET_HOST`).
    Host,
    /// ff:ff:ff:ff:ff:ff or a multicast MAC (`PACKET_BROADCAST`,
    /// `PACKET_MULTICAST`).
    Group,
    /// Any other unicast MAC (`PACKET_OTHERHOST`).
    OtherHost,
}

/// Classifies `dst` against the interface's MAC `own`.
#[must_use]
#[inline(always)]
pub fn link_dest(dst: [u8; 6], own: [u8; 6]) -> LinkDest {
    if dst[0] & 1 != 0 {
        LinkDest::Group
    } else if dst == own {
        LinkDest::Host
    } else {
        LinkDest::OtherHost
    }
}

/// Looks at `frame` and, when it is an IPv4 ICMP echo request the kernel
/// stack of the interface `cfg` describes would answer, rewrites it in
/// place into the reply the kernel would send.
///
/// Invalid or truncated Ethernet/IPv4/ICMP headers and a wrong ICMP
/// checksum are `Malformed` (the kernel drops them as well); fragments, IP
/// options, VLAN tags, frames for another host and anything not addressed
/// to the endpoint are `Pass`ed untouched, for the stack to decide.
/// `vlan_tagged` says whether the frame had a VLAN tag the driver or the
/// stack already took off (tc sees those untagged).
#[inline(always)]
pub fn respond<F: Frame>(frame: &mut F, cfg: &EchoConfig, vlan_tagged: bool) -> Verdict {
    if vlan_tagged {
        return Verdict::Pass(PassReason::Vlan);
    }
    match classify(frame, cfg) {
        Ok(reply) => rewrite(frame, reply),
        Err(verdict) => verdict,
    }
}

/// What `classify` found out for `rewrite`.
#[derive(Clone, Copy)]
struct Plan {
    /// The reply's source MAC: the request's destination, or the
    /// interface's own MAC when the request went to a group address.
    src_mac: [u8; 6],
    /// Ethernet header plus the IPv4 total length.
    len: u16,
}

#[inline(always)]
fn classify<F: Frame>(frame: &mut F, cfg: &EchoConfig) -> Result<Plan, Verdict> {
    use MalformedReason as M;
    use PassReason as P;
    let pass = |r| Err(Verdict::Pass(r));
    let bad = |r| Err(Verdict::Malformed(r));

    let Some(eth) = frame.read::<EthHdr>(0) else {
        return bad(M::TruncatedEthernet);
    };
    if is_vlan(&eth) {
        return pass(P::Vlan);
    }
    if !is_ipv4(&eth) {
        return pass(P::NotIpv4);
    }
    let wire_ip_len = frame.wire_len().saturating_sub(EthHdr::LEN);
    let Some(ip) = frame.header_mut::<Ipv4Hdr>(IP_OFF) else {
        return bad(M::TruncatedIpv4);
    };
    let ip = *ip;
    let (header_len, total_len) = (ipv4_header_len(&ip), ipv4_total_len(&ip));
    if ip.vihl >> 4 != 4 {
        return bad(M::BadVersion);
    }
    if header_len < Ipv4Hdr::LEN {
        return bad(M::BadHeaderLength);
    }
    if total_len < header_len || total_len > wire_ip_len {
        return bad(M::BadTotalLength);
    }
    if header_len != Ipv4Hdr::LEN {
        return pass(P::IpOptions);
    }
    if checksum::ipv4_header_sum(&ipv4_bytes(&ip)) != 0xffff {
        return bad(M::BadIpChecksum);
    }
    if is_fragment(&ip) {
        return pass(P::Fragment);
    }
    if ip.proto != IPPROTO_ICMP {
        return pass(P::NotIcmp);
    }
    let local = cfg.addr;
    if local == [0; 4] || cfg.mac == [0; 6] {
        return pass(P::NoAddress);
    }
    if ip.dst_addr != local {
        return pass(P::NotForEndpoint);
    }
    let src_mac = match link_dest(eth.dst_addr, cfg.mac) {
        LinkDest::Host => eth.dst_addr,
        LinkDest::OtherHost => return pass(P::OtherHost),
        LinkDest::Group if cfg.flags & EchoConfig::DROP_UNICAST_IN_L2_MULTICAST != 0 => {
            return pass(P::UnicastInL2Multicast);
        }
        LinkDest::Group => cfg.mac,
    };
    if eth.src_addr[0] & 1 != 0 || eth.src_addr == [0; 6] {
        return pass(P::BadSourceMac);
    }
    if is_martian_source(ip.src_addr) || ip.src_addr == local {
        return pass(P::MartianSource);
    }
    if total_len < Ipv4Hdr::LEN + Icmpv4Hdr::LEN {
        return bad(M::TruncatedIcmp);
    }
    let Some(icmp) = frame.header_mut::<Icmpv4Hdr>(ICMP_OFF) else {
        return bad(M::TruncatedIcmp);
    };
    // The kernel answers any code, and keeps it in the reply.
    if icmp.type_ != ICMP_ECHO_REQUEST {
        return pass(P::NotEchoRequest);
    }
    let icmp_len = total_len - Ipv4Hdr::LEN;
    if icmp_len > MAX_CHECKED_ICMP {
        return pass(P::TooLong);
    }
    // Over the ICMP message as the IPv4 total length bounds it: bytes past
    // it (link padding) are not part of the datagram.
    match frame.ones_sum(ICMP_OFF, icmp_len) {
        Some(sum) if checksum::fold(sum) == 0xffff => {}
        Some(_) => return bad(M::BadIcmpChecksum),
        None => return pass(P::TooLong),
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "total_len came from a 16-bit field and MAX_CHECKED_ICMP bounds it"
    )]
    let len = (EthHdr::LEN + total_len) as u16;
    Ok(Plan { src_mac, len })
}

/// Whether `eth` carries an 802.1Q or 802.1ad tag.
#[inline(always)]
fn is_vlan(eth: &EthHdr) -> bool {
    let t = u16::from_be(eth.ether_type);
    t == 0x8100 || t == 0x88a8
}

/// Sources the kernel's route lookup calls martian: "this network"
/// (0.0.0.0/8), loopback, multicast, limited broadcast.
#[inline(always)]
const fn is_martian_source(src: [u8; 4]) -> bool {
    matches!(src, [0 | 127 | 224..=239, ..] | [255, 255, 255, 255])
}

/// Turns a classified echo request into its reply. Each header is fetched
/// again (one bounds check each) so that no two views of the frame overlap.
#[inline(always)]
fn rewrite<F: Frame>(frame: &mut F, plan: Plan) -> Verdict {
    let truncated = Verdict::Malformed(MalformedReason::TruncatedIcmp);
    let Some(mut eth) = frame.read::<EthHdr>(0) else {
        return truncated;
    };
    eth.dst_addr = eth.src_addr;
    eth.src_addr = plan.src_mac;
    if !frame.write(0, eth) {
        return truncated;
    }

    let Some(ip) = frame.header_mut::<Ipv4Hdr>(IP_OFF) else {
        return truncated;
    };
    // Swapping the two addresses leaves the header sum unchanged; the TTL
    // shares its 16-bit word with the protocol.
    core::mem::swap(&mut ip.src_addr, &mut ip.dst_addr);
    let old = u16::from_be_bytes([ip.ttl, ip.proto]);
    let new = u16::from_be_bytes([REPLY_TTL, ip.proto]);
    ip.check = checksum::update16(u16::from_be_bytes(ip.check), old, new).to_be_bytes();
    ip.ttl = REPLY_TTL;

    let Some(icmp) = frame.header_mut::<Icmpv4Hdr>(ICMP_OFF) else {
        return truncated;
    };
    let old = u16::from_be_bytes([icmp.type_, icmp.code]);
    let new = u16::from_be_bytes([ICMP_ECHO_REPLY, icmp.code]);
    icmp.check = checksum::update16(u16::from_be_bytes(icmp.check), old, new).to_be_bytes();
    icmp.type_ = ICMP_ECHO_REPLY;
    Verdict::Reply { len: plan.len }
}

#[cfg(test)]
mod tests;
