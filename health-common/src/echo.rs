//! The ICMP echo responder's decision and rewrite, independent of where it
//! runs (XDP, tc, or a host unit test).

use crate::{
    checksum,
    frame::Frame,
    headers::{
        EthHdr, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IPPROTO_ICMP, Icmpv4Hdr, Ipv4Hdr, REPLY_TTL,
        ipv4_bytes, ipv4_header_len, ipv4_total_len, is_fragment, is_ipv4,
    },
    maps::EchoCounter,
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
}

/// What the responder did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The frame was rewritten in place into an echo reply: send it back out
    /// of the interface it came in on.
    Reply,
    Pass(PassReason),
    Malformed(MalformedReason),
}

impl Verdict {
    #[must_use]
    #[inline(always)]
    pub const fn counter(self) -> EchoCounter {
        match self {
            Self::Reply => EchoCounter::Answered,
            Self::Pass(_) => EchoCounter::Passed,
            Self::Malformed(_) => EchoCounter::Malformed,
        }
    }
}

const IP_OFF: usize = EthHdr::LEN;
const ICMP_OFF: usize = EthHdr::LEN + Ipv4Hdr::LEN;

/// Looks at `frame` and, when it is an IPv4 ICMP echo request addressed to
/// `local`, rewrites it in place into the reply.
///
/// Invalid or truncated Ethernet/IPv4/ICMP headers are `Malformed` (the
/// kernel stack would drop them as well); fragments, IP options and anything
/// not addressed to the endpoint are `Pass`ed untouched. The ICMP payload
/// checksum is not verified: the incremental update preserves whatever error
/// the request carried, so a corrupt request gets a reply its sender rejects.
#[inline(always)]
pub fn respond<F: Frame>(frame: &mut F, local: [u8; 4]) -> Verdict {
    match classify(frame, local) {
        Ok(()) => rewrite(frame),
        Err(verdict) => verdict,
    }
}

#[inline(always)]
fn classify<F: Frame>(frame: &mut F, local: [u8; 4]) -> Result<(), Verdict> {
    use MalformedReason as M;
    use PassReason as P;
    let pass = |r| Err(Verdict::Pass(r));
    let bad = |r| Err(Verdict::Malformed(r));

    let Some(eth) = frame.read::<EthHdr>(0) else {
        return bad(M::TruncatedEthernet);
    };
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
    if local == [0; 4] {
        return pass(P::NoAddress);
    }
    if ip.dst_addr != local {
        return pass(P::NotForEndpoint);
    }
    if is_martian_source(ip.src_addr) {
        return pass(P::MartianSource);
    }
    if total_len < Ipv4Hdr::LEN + Icmpv4Hdr::LEN {
        return bad(M::TruncatedIcmp);
    }
    let Some(icmp) = frame.header_mut::<Icmpv4Hdr>(ICMP_OFF) else {
        return bad(M::TruncatedIcmp);
    };
    if icmp.type_ != ICMP_ECHO_REQUEST || icmp.code != 0 {
        return pass(P::NotEchoRequest);
    }
    Ok(())
}

/// Sources the kernel would never answer: unspecified, loopback, multicast,
/// limited broadcast.
#[inline(always)]
const fn is_martian_source(src: [u8; 4]) -> bool {
    matches!(
        src,
        [0, 0, 0, 0] | [127 | 224..=239, ..] | [255, 255, 255, 255]
    )
}

/// Turns a classified echo request into its reply. Each header is fetched
/// again (one bounds check each) so that no two views of the frame overlap.
#[inline(always)]
fn rewrite<F: Frame>(frame: &mut F) -> Verdict {
    let truncated = Verdict::Malformed(MalformedReason::TruncatedIcmp);
    let Some(mut eth) = frame.read::<EthHdr>(0) else {
        return truncated;
    };
    core::mem::swap(&mut eth.dst_addr, &mut eth.src_addr);
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
    Verdict::Reply
}

#[cfg(test)]
mod tests;
