//! The ICMP and `ICMPv6` echo responder's decision and rewrite, independent
//! of where it runs (XDP, tc, or a host unit test).

use crate::{
    checksum,
    frame::Frame,
    headers::{
        EthHdr, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST,
        IPPROTO_ICMP, IPPROTO_ICMPV6, Icmpv4Hdr, Icmpv6Hdr, Ipv4Hdr, Ipv6Hdr, NEXTHDR_FRAGMENT,
        REPLY_HOP_LIMIT, REPLY_TTL, ipv4_bytes, ipv4_header_len, ipv4_total_len, ipv6_payload_len,
        is_fragment, is_ipv4, is_ipv6, is_ipv6_extension,
    },
    maps::{EchoConfig, EchoCounter, OWN_SLOTS},
};

/// Why a packet was handed on untouched.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassReason {
    /// Neither IPv4 nor IPv6.
    NotIp,
    IpOptions,
    /// An IPv4 fragment, or an IPv6 packet with a fragment header.
    Fragment,
    /// An IPv6 extension header (hop-by-hop, routing, destination
    /// options, ...) before the upper-layer header.
    ExtensionHeader,
    NotIcmp,
    NoAddress,
    NotForEndpoint,
    MartianSource,
    /// The source is another of the interface's own addresses (its IPv6
    /// link-local one, say), or the interface has more addresses than the
    /// responder knows: the stack decides, as it does for its own
    /// packets.
    OwnSource,
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
    /// The ICMP checksum over the datagram's ICMP message (for `ICMPv6`,
    /// with the pseudo-header) is wrong: the kernel drops such a request
    /// (`InCsumErrors`).
    BadIcmpChecksum,
    TruncatedIpv6,
    /// IPv6 payload length longer than the frame.
    BadPayloadLength,
}

/// What the responder did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The frame was rewritten in place into an echo reply of `len` bytes
    /// (the Ethernet header and the IP datagram): cut anything beyond
    /// that (link padding, trailing bytes past the IPv4 total length or
    /// the IPv6 payload length) and send it back out of the interface it
    /// came in on.
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
const ICMP6_OFF: usize = EthHdr::LEN + Ipv6Hdr::LEN;

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

/// Looks at `frame` and, when it is an IPv4 ICMP or an IPv6 `ICMPv6` echo
/// request the kernel stack of the interface `cfg` describes would answer,
/// rewrites it in place into the reply the kernel would send.
///
/// Invalid or truncated Ethernet/IP/ICMP headers and a wrong ICMP checksum
/// are `Malformed` (the kernel drops them as well); fragments, IP options,
/// IPv6 extension headers, VLAN tags, frames for another host and anything
/// not addressed to the endpoint are `Pass`ed untouched, for the stack to
/// decide. `vlan_tagged` says whether the frame had a VLAN tag the driver
/// or the stack already took off (tc sees those untagged).
#[inline(always)]
pub fn respond<F: Frame>(frame: &mut F, cfg: &EchoConfig, vlan_tagged: bool) -> Verdict {
    if vlan_tagged {
        return Verdict::Pass(PassReason::Vlan);
    }
    let plan = match classify(frame, cfg) {
        Ok(plan) => plan,
        Err(verdict) => return verdict,
    };
    // One sum for both families (one copy of the chunked loop for the
    // verifier): over the ICMP message as the IP length bounds it (bytes
    // past it, link padding, are not part of the datagram), plus the
    // IPv6 pseudo-header.
    match frame.ones_sum(plan.icmp_off, plan.icmp_len) {
        Some(sum) if checksum::fold(u32::from(checksum::fold(sum)) + plan.pseudo) == 0xffff => {}
        Some(_) => return Verdict::Malformed(MalformedReason::BadIcmpChecksum),
        None => return Verdict::Pass(PassReason::TooLong),
    }
    if plan.v6 {
        rewrite6(frame, plan)
    } else {
        rewrite(frame, plan)
    }
}

/// What `classify` found out for the checksum check and `rewrite`.
#[derive(Clone, Copy)]
struct Plan {
    /// The reply's source MAC: the request's destination, or the
    /// interface's own MAC when the request went to a group address.
    src_mac: [u8; 6],
    /// Ethernet header plus the IP datagram.
    len: u16,
    /// Where the ICMP message starts, and its length.
    icmp_off: usize,
    icmp_len: usize,
    /// The IPv6 pseudo-header's one's-complement sum in the byte order of
    /// [`Frame::ones_sum`] (native); 0 for IPv4.
    pseudo: u32,
    v6: bool,
}

#[inline(always)]
fn classify<F: Frame>(frame: &mut F, cfg: &EchoConfig) -> Result<Plan, Verdict> {
    let Some(eth) = frame.read::<EthHdr>(0) else {
        return Err(Verdict::Malformed(MalformedReason::TruncatedEthernet));
    };
    if is_vlan(&eth) {
        return Err(Verdict::Pass(PassReason::Vlan));
    }
    if is_ipv4(&eth) {
        classify4(frame, cfg, &eth)
    } else if is_ipv6(&eth) {
        classify6(frame, cfg, &eth)
    } else {
        Err(Verdict::Pass(PassReason::NotIp))
    }
}

/// The reply's source MAC for a request in `eth`, or why the stack must
/// decide: `drop_flag` is the family's `DROP_UNICAST_IN_L2_MULTICAST` bit.
#[inline(always)]
fn reply_mac(eth: &EthHdr, cfg: &EchoConfig, drop_flag: u8) -> Result<[u8; 6], Verdict> {
    let src_mac = match link_dest(eth.dst_addr, cfg.mac) {
        LinkDest::Host => eth.dst_addr,
        LinkDest::OtherHost => return Err(Verdict::Pass(PassReason::OtherHost)),
        LinkDest::Group if cfg.flags & drop_flag != 0 => {
            return Err(Verdict::Pass(PassReason::UnicastInL2Multicast));
        }
        LinkDest::Group => cfg.mac,
    };
    if eth.src_addr[0] & 1 != 0 || eth.src_addr == [0; 6] {
        return Err(Verdict::Pass(PassReason::BadSourceMac));
    }
    Ok(src_mac)
}

#[inline(always)]
fn classify4<F: Frame>(frame: &mut F, cfg: &EchoConfig, eth: &EthHdr) -> Result<Plan, Verdict> {
    use MalformedReason as M;
    use PassReason as P;
    let pass = |r| Err(Verdict::Pass(r));
    let bad = |r| Err(Verdict::Malformed(r));

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
    // Total length 0 marks a GSO packet past 64 KiB (BIG TCP), whose
    // length is the frame's: not ICMP, and not the length check's to judge.
    if total_len == 0 && ip.proto != IPPROTO_ICMP {
        return pass(P::NotIcmp);
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
    let src_mac = reply_mac(eth, cfg, EchoConfig::DROP_UNICAST_IN_L2_MULTICAST)?;
    // The route lookup calls every local source martian.
    if is_martian_source(ip.src_addr) || ip.src_addr == local || is_own(&cfg.own4, &ip.src_addr) {
        return pass(P::MartianSource);
    }
    if cfg.flags & EchoConfig::MORE_OWN4 != 0 {
        return pass(P::OwnSource);
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
    #[allow(
        clippy::cast_possible_truncation,
        reason = "total_len came from a 16-bit field and MAX_CHECKED_ICMP bounds it"
    )]
    let len = (EthHdr::LEN + total_len) as u16;
    Ok(Plan {
        src_mac,
        len,
        icmp_off: ICMP_OFF,
        icmp_len,
        pseudo: 0,
        v6: false,
    })
}

/// An IPv6 packet whose next header is `ICMPv6` itself (no extension
/// header: those, fragments included, go to the stack), as `ip6_rcv_core`
/// and `icmpv6_rcv` would take it.
#[inline(always)]
fn classify6<F: Frame>(frame: &mut F, cfg: &EchoConfig, eth: &EthHdr) -> Result<Plan, Verdict> {
    use MalformedReason as M;
    use PassReason as P;
    let pass = |r| Err(Verdict::Pass(r));
    let bad = |r| Err(Verdict::Malformed(r));

    let wire_ip_len = frame.wire_len().saturating_sub(EthHdr::LEN);
    let Some(ip) = frame.header_mut::<Ipv6Hdr>(IP_OFF) else {
        return bad(M::TruncatedIpv6);
    };
    let ip = *ip;
    if ip.vcf[0] >> 4 != 6 {
        return bad(M::BadVersion);
    }
    // Hop-by-hop first: with payload length 0 it announces a jumbogram,
    // which the length check below must not judge.
    if ip.next_hdr == 0 {
        return pass(P::ExtensionHeader);
    }
    let payload_len = ipv6_payload_len(&ip);
    if payload_len > wire_ip_len.saturating_sub(Ipv6Hdr::LEN) {
        return bad(M::BadPayloadLength);
    }
    if ip.next_hdr == NEXTHDR_FRAGMENT {
        return pass(P::Fragment);
    }
    if is_ipv6_extension(ip.next_hdr) {
        return pass(P::ExtensionHeader);
    }
    if ip.next_hdr != IPPROTO_ICMPV6 {
        return pass(P::NotIcmp);
    }
    let local = cfg.addr6;
    if local == [0; 16] || cfg.mac == [0; 6] {
        return pass(P::NoAddress);
    }
    // Multicast destinations (all-nodes, solicited-node: neighbour
    // discovery, MLD) are never the endpoint's address.
    if ip.dst_addr != local {
        return pass(P::NotForEndpoint);
    }
    let src_mac = reply_mac(eth, cfg, EchoConfig::DROP_UNICAST_IN_L2_MULTICAST6)?;
    if is_martian_source6(&ip.src_addr) || ip.src_addr == local {
        return pass(P::MartianSource);
    }
    if is_own(&cfg.own6, &ip.src_addr) || cfg.flags & EchoConfig::MORE_OWN6 != 0 {
        return pass(P::OwnSource);
    }
    // icmpv6_rcv drops a message shorter than its 8-byte header.
    if payload_len < Icmpv6Hdr::LEN {
        return bad(M::TruncatedIcmp);
    }
    let Some(icmp) = frame.header_mut::<Icmpv6Hdr>(ICMP6_OFF) else {
        return bad(M::TruncatedIcmp);
    };
    // Neighbour discovery, MLD and every other type go to the stack; the
    // kernel answers an echo request of any code, keeping it.
    if icmp.type_ != ICMPV6_ECHO_REQUEST {
        return pass(P::NotEchoRequest);
    }
    if payload_len > MAX_CHECKED_ICMP {
        return pass(P::TooLong);
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "payload_len came from a 16-bit field and MAX_CHECKED_ICMP bounds it"
    )]
    let len = (ICMP6_OFF + payload_len) as u16;
    Ok(Plan {
        src_mac,
        len,
        icmp_off: ICMP6_OFF,
        icmp_len: payload_len,
        pseudo: pseudo_header_sum(&ip),
        v6: true,
    })
}

/// The one's-complement sum of the `ICMPv6` pseudo-header (RFC 8200 8.1:
/// source, destination, upper-layer length, next header 58) of `ip`, in
/// native byte order like [`Frame::ones_sum`]: the upper-layer length is
/// the payload length, there being no extension header.
#[inline(always)]
fn pseudo_header_sum(ip: &Ipv6Hdr) -> u32 {
    let mut sum = u32::from(u16::from_ne_bytes(ip.payload_len))
        + u32::from(u16::from_ne_bytes([0, IPPROTO_ICMPV6]));
    let mut i = 0;
    while i < 16 {
        sum += u32::from(u16::from_ne_bytes([ip.src_addr[i], ip.src_addr[i + 1]]));
        sum += u32::from(u16::from_ne_bytes([ip.dst_addr[i], ip.dst_addr[i + 1]]));
        i += 2;
    }
    sum
}

/// Whether `eth` carries an 802.1Q or 802.1ad tag.
#[inline(always)]
fn is_vlan(eth: &EthHdr) -> bool {
    let t = u16::from_be(eth.ether_type);
    t == 0x8100 || t == 0x88a8
}

/// Whether `src` is in one of the slots `own` (unused slots are all zero,
/// a source the martian checks turn away first). A fixed number of
/// comparisons, unrolled for the verifier.
#[inline(always)]
fn is_own<const N: usize>(own: &[[u8; N]; OWN_SLOTS], src: &[u8; N]) -> bool {
    own.iter().any(|a| a == src)
}

/// Sources the kernel's route lookup calls martian: "this network"
/// (0.0.0.0/8), loopback, multicast, limited broadcast.
#[inline(always)]
const fn is_martian_source(src: [u8; 4]) -> bool {
    matches!(src, [0 | 127 | 224..=239, ..] | [255, 255, 255, 255])
}

/// Sources `ip6_rcv_core` drops or the stack must judge: multicast,
/// unspecified, loopback, IPv4-mapped.
#[inline(always)]
fn is_martian_source6(src: &[u8; 16]) -> bool {
    let head_zero = u64::from_ne_bytes([
        src[0], src[1], src[2], src[3], src[4], src[5], src[6], src[7],
    ]) == 0;
    let mid = u32::from_be_bytes([src[8], src[9], src[10], src[11]]);
    let low = u32::from_be_bytes([src[12], src[13], src[14], src[15]]);
    src[0] == 0xff || (head_zero && (mid == 0xffff || (mid == 0 && low <= 1)))
}

/// Addresses the reply: back to the requester, from `src_mac`.
#[inline(always)]
fn rewrite_eth<F: Frame>(frame: &mut F, src_mac: [u8; 6]) -> bool {
    let Some(mut eth) = frame.read::<EthHdr>(0) else {
        return false;
    };
    eth.dst_addr = eth.src_addr;
    eth.src_addr = src_mac;
    frame.write(0, eth)
}

/// Turns a classified IPv4 echo request into its reply. Each header is
/// fetched again (one bounds check each) so that no two views of the frame
/// overlap.
#[inline(always)]
fn rewrite<F: Frame>(frame: &mut F, plan: Plan) -> Verdict {
    let truncated = Verdict::Malformed(MalformedReason::TruncatedIcmp);
    if !rewrite_eth(frame, plan.src_mac) {
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

/// Turns a classified `ICMPv6` echo request into its reply: addresses
/// swapped (which leaves the pseudo-header sum unchanged), hop limit 64
/// (not covered by the checksum), type 129 with the code, identifier,
/// sequence and data kept. The traffic class and flow label are kept,
/// as the kernel's reply reflects the traffic class.
#[inline(always)]
fn rewrite6<F: Frame>(frame: &mut F, plan: Plan) -> Verdict {
    let truncated = Verdict::Malformed(MalformedReason::TruncatedIcmp);
    if !rewrite_eth(frame, plan.src_mac) {
        return truncated;
    }
    let Some(ip) = frame.header_mut::<Ipv6Hdr>(IP_OFF) else {
        return truncated;
    };
    core::mem::swap(&mut ip.src_addr, &mut ip.dst_addr);
    ip.hop_limit = REPLY_HOP_LIMIT;

    let Some(icmp) = frame.header_mut::<Icmpv6Hdr>(ICMP6_OFF) else {
        return truncated;
    };
    let old = u16::from_be_bytes([icmp.type_, icmp.code]);
    let new = u16::from_be_bytes([ICMPV6_ECHO_REPLY, icmp.code]);
    icmp.check = checksum::update16(u16::from_be_bytes(icmp.check), old, new).to_be_bytes();
    icmp.type_ = ICMPV6_ECHO_REPLY;
    Verdict::Reply { len: plan.len }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests6;
