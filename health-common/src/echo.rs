//! The ICMP echo responder's decision and rewrite, independent of where it
//! runs (XDP, tc, or a host unit test).

use crate::{
    checksum,
    frame::Frame,
    headers::{
        ETH_P_IP, EthHdr, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IPPROTO_ICMP, IcmpEchoHdr, Ipv4Hdr,
        REPLY_TTL,
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

    let Some(eth) = frame.header_mut::<EthHdr>(0) else {
        return bad(M::TruncatedEthernet);
    };
    if eth.ether_type() != ETH_P_IP {
        return pass(P::NotIpv4);
    }
    let wire_ip_len = frame.wire_len().saturating_sub(EthHdr::LEN);
    let Some(ip) = frame.header_mut::<Ipv4Hdr>(IP_OFF) else {
        return bad(M::TruncatedIpv4);
    };
    let ip = *ip;
    if ip.version() != 4 {
        return bad(M::BadVersion);
    }
    if ip.header_len() < Ipv4Hdr::LEN {
        return bad(M::BadHeaderLength);
    }
    if ip.total_len() < ip.header_len() || ip.total_len() > wire_ip_len {
        return bad(M::BadTotalLength);
    }
    if ip.header_len() != Ipv4Hdr::LEN {
        return pass(P::IpOptions);
    }
    if checksum::ipv4_header_sum(&ip.bytes) != 0xffff {
        return bad(M::BadIpChecksum);
    }
    if ip.is_fragment() {
        return pass(P::Fragment);
    }
    if ip.protocol() != IPPROTO_ICMP {
        return pass(P::NotIcmp);
    }
    if local == [0; 4] {
        return pass(P::NoAddress);
    }
    if ip.dst() != local {
        return pass(P::NotForEndpoint);
    }
    if is_martian_source(ip.src()) {
        return pass(P::MartianSource);
    }
    if ip.total_len() < Ipv4Hdr::LEN + IcmpEchoHdr::LEN {
        return bad(M::TruncatedIcmp);
    }
    let Some(icmp) = frame.header_mut::<IcmpEchoHdr>(ICMP_OFF) else {
        return bad(M::TruncatedIcmp);
    };
    if icmp.kind != ICMP_ECHO_REQUEST || icmp.code != 0 {
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
    let Some(eth) = frame.header_mut::<EthHdr>(0) else {
        return truncated;
    };
    core::mem::swap(&mut eth.dst, &mut eth.src);

    let Some(ip) = frame.header_mut::<Ipv4Hdr>(IP_OFF) else {
        return truncated;
    };
    // Swapping the two addresses leaves the header sum unchanged; the TTL
    // shares its 16-bit word with the protocol.
    let b = &mut ip.bytes;
    for i in 12..16 {
        b.swap(i, i + 4);
    }
    let old = u16::from_be_bytes([b[8], b[9]]);
    let new = u16::from_be_bytes([REPLY_TTL, b[9]]);
    let check = checksum::update16(u16::from_be_bytes([b[10], b[11]]), old, new);
    b[8] = REPLY_TTL;
    b[10..12].copy_from_slice(&check.to_be_bytes());

    let Some(icmp) = frame.header_mut::<IcmpEchoHdr>(ICMP_OFF) else {
        return truncated;
    };
    let old = u16::from_be_bytes([icmp.kind, icmp.code]);
    let new = u16::from_be_bytes([ICMP_ECHO_REPLY, icmp.code]);
    let check = checksum::update16(u16::from_be_bytes(icmp.checksum), old, new);
    icmp.kind = ICMP_ECHO_REPLY;
    icmp.checksum = check.to_be_bytes();
    Verdict::Reply
}

#[cfg(test)]
mod tests;
