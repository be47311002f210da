//! ICMP errors about masqueraded flows. A router that cannot deliver a
//! probe the node masqueraded (host unreachable, fragmentation needed, TTL
//! exceeded) answers the node IP and quotes the packet as it left: the
//! node's address and port. Translated back (the outer destination, the
//! quoted source address and port, with the checksums), the error reaches
//! the endpoint's socket, which then fails at once or learns the path MTU,
//! as it would without masquerade.

use super::NatKey;
use crate::{
    ct::{DIR_IN, IPPROTO_TCP, IPPROTO_UDP},
    frame::Frame,
    headers::{
        EthHdr, ICMP_ECHO_REQUEST, IPPROTO_ICMP, Ipv4Hdr, ipv4_header_len, ipv4_total_len, is_ipv4,
        is_later_fragment,
    },
};

/// ICMP destination unreachable.
pub const ICMP_DEST_UNREACH: u8 = 3;
/// ICMP time exceeded.
pub const ICMP_TIME_EXCEEDED: u8 = 11;
/// ICMP parameter problem.
pub const ICMP_PARAMETER_PROB: u8 = 12;

/// How much of a frame an ICMP error is read from: the outer headers, the
/// quoted IPv4 header (options included) and its first 8 bytes of L4.
pub const QUOTE_HEADERS: u32 = (EthHdr::LEN + 60 + 8 + 60 + 8) as u32;

/// An ICMP error quoting a packet the node sent: the `IN` key of the
/// quoted flow, and where the parts to rewrite are in the frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotedError {
    /// The key of the replies to the quoted packet: its `dport` is the
    /// node port (or echo identifier) the quote carries.
    pub key: NatKey,
    /// The outer ICMP header.
    pub icmp_at: usize,
    /// The quoted IPv4 header.
    pub quote_at: usize,
    /// The quoted source port, or echo identifier.
    pub quote_port_at: usize,
}

/// Whether ICMP type `t` is an error that quotes a packet (RFC 792).
#[must_use]
#[inline(always)]
pub const fn is_error(t: u8) -> bool {
    matches!(
        t,
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROB
    )
}

/// Where the ICMP header of the error in `frame` is, and where its
/// datagram ends, when `frame` holds an unfragmented IPv4 ICMP error
/// addressed to `node_ip`: read from the first 82 bytes, so a program can
/// tell before it reads further.
#[inline(always)]
pub fn error_at<F: Frame>(frame: &mut F, node_ip: [u8; 4]) -> Option<(usize, usize)> {
    let eth = frame.read::<EthHdr>(0)?;
    if !is_ipv4(&eth) {
        return None;
    }
    let mut end = 0;
    let icmp_at = ipv4_at(frame, EthHdr::LEN, IPPROTO_ICMP, |ip| {
        end = EthHdr::LEN + ipv4_total_len(ip);
        // Translated, a first fragment would part from the others.
        ip.dst_addr == node_ip && u16::from_be_bytes(ip.frags) & FRAGMENTED == 0
    })?;
    let icmp = frame.read::<[u8; 8]>(icmp_at)?;
    is_error(icmp[0]).then_some((icmp_at, end))
}

/// The more-fragments flag and the fragment offset.
const FRAGMENTED: u16 = 0x3fff;

/// The ICMP error in `frame`, when it is addressed to `node_ip` and quotes
/// a TCP or UDP packet, or an ICMP echo request, that `node_ip` sent.
/// `None` for anything else, or a quote too short to hold the ports.
#[inline(always)]
pub fn quoted_error<F: Frame>(frame: &mut F, node_ip: [u8; 4]) -> Option<QuotedError> {
    let (icmp_at, end) = error_at(frame, node_ip)?;
    let quote_at = icmp_at + 8;
    let quote = *frame.header_mut::<Ipv4Hdr>(quote_at)?;
    if quote.src_addr != node_ip {
        return None;
    }
    let l4 = ipv4_at(frame, quote_at, quote.proto, |_| true)?;
    // The ports are within the datagram, not in the frame's padding.
    if l4 + 8 > end {
        return None;
    }
    let ports = frame.read::<[u8; 8]>(l4)?;
    let mut key = NatKey {
        saddr: quote.dst_addr,
        daddr: node_ip,
        sport: [ports[2], ports[3]],
        dport: [ports[0], ports[1]],
        proto: quote.proto,
        dir: DIR_IN,
        pad: [0; 2],
    };
    let quote_port_at = match quote.proto {
        IPPROTO_TCP | IPPROTO_UDP => l4,
        IPPROTO_ICMP if ports[0] == ICMP_ECHO_REQUEST => {
            key.sport = [0, 0];
            key.dport = [ports[4], ports[5]];
            l4 + 4
        }
        _ => return None,
    };
    Some(QuotedError {
        key,
        icmp_at,
        quote_at,
        quote_port_at,
    })
}

/// The L4 offset of the IPv4 header at `at` when it is a first (or only)
/// fragment of protocol `proto` that `accept` takes.
#[inline(always)]
fn ipv4_at<F: Frame>(
    frame: &mut F,
    at: usize,
    proto: u8,
    accept: impl FnOnce(&Ipv4Hdr) -> bool,
) -> Option<usize> {
    let ip = frame.header_mut::<Ipv4Hdr>(at)?;
    let ihl = ipv4_header_len(ip);
    let ok = ip.vihl >> 4 == 4
        && (20..=60).contains(&ihl)
        && !is_later_fragment(ip)
        && ip.proto == proto
        && accept(ip);
    ok.then_some(at + ihl)
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::frame::SliceFrame;

    const NODE: [u8; 4] = [198, 18, 0, 11];
    const PEER: [u8; 4] = [198, 18, 0, 12];
    const ROUTER: [u8; 4] = [198, 18, 0, 1];

    fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
        let total = u16::try_from(20 + payload.len())
            .expect("small")
            .to_be_bytes();
        let mut h = Vec::from([0x45, 0, total[0], total[1], 0, 0, 0, 0, 64, proto, 0, 0]);
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        h.extend_from_slice(payload);
        h
    }

    /// An error of type `t` from the router to `to`, quoting `quoted`.
    fn error(t: u8, to: [u8; 4], quoted: &[u8]) -> Vec<u8> {
        let mut icmp = Vec::from([t, 1, 0, 0, 0, 0, 0, 0]);
        icmp.extend_from_slice(quoted);
        let mut f = Vec::from([0u8; 12]);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&ipv4(ROUTER, to, IPPROTO_ICMP, &icmp));
        f
    }

    fn ports(sport: u16, dport: u16) -> [u8; 8] {
        let mut l4 = [0u8; 8];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4
    }

    fn parse(f: &mut [u8]) -> Option<QuotedError> {
        quoted_error(&mut SliceFrame::new(f), NODE)
    }

    #[test]
    fn an_error_quoting_a_masqueraded_segment_names_its_reply_key() {
        let quote = ipv4(NODE, PEER, IPPROTO_TCP, &ports(61_234, 4240));
        for t in [ICMP_DEST_UNREACH, ICMP_TIME_EXCEEDED, ICMP_PARAMETER_PROB] {
            let q = parse(&mut error(t, NODE, &quote)).expect("an error about a flow");
            assert_eq!(
                (
                    q.key.saddr,
                    q.key.daddr,
                    q.key.sport,
                    q.key.dport,
                    q.key.proto,
                    q.key.dir
                ),
                (
                    PEER,
                    NODE,
                    4240u16.to_be_bytes(),
                    61_234u16.to_be_bytes(),
                    IPPROTO_TCP,
                    DIR_IN
                )
            );
            assert_eq!((q.icmp_at, q.quote_at, q.quote_port_at), (34, 42, 62));
        }
    }

    #[test]
    fn an_error_quoting_an_echo_request_names_its_identifier() {
        let mut echo = [0u8; 8];
        echo[0] = ICMP_ECHO_REQUEST;
        echo[4..6].copy_from_slice(&0xf00du16.to_be_bytes());
        let q = parse(&mut error(
            ICMP_DEST_UNREACH,
            NODE,
            &ipv4(NODE, PEER, IPPROTO_ICMP, &echo),
        ))
        .expect("an error about an echo");
        assert_eq!(
            (q.key.sport, q.key.dport),
            ([0, 0], 0xf00du16.to_be_bytes())
        );
        assert_eq!(q.quote_port_at, 66);
    }

    #[test]
    fn other_messages_and_short_or_foreign_quotes_are_not_errors_about_a_flow() {
        let quote = ipv4(NODE, PEER, IPPROTO_UDP, &ports(61_000, 53));
        // Not an error: an echo reply, a redirect.
        for t in [0, 5] {
            assert_eq!(parse(&mut error(t, NODE, &quote)), None, "type {t}");
        }
        // To another address; quoting a packet from another source.
        assert_eq!(parse(&mut error(3, PEER, &quote)), None);
        let theirs = ipv4(PEER, NODE, IPPROTO_UDP, &ports(53, 61_000));
        assert_eq!(parse(&mut error(3, NODE, &theirs)), None);
        // A quote cut inside its ports; an echo reply quoted.
        let cut = &quote[..quote.len() - 5];
        assert_eq!(parse(&mut error(3, NODE, cut)), None);
        let mut reply = [0u8; 8];
        reply[4] = 1;
        assert_eq!(
            parse(&mut error(3, NODE, &ipv4(NODE, PEER, IPPROTO_ICMP, &reply))),
            None
        );
        // A quoted later fragment carries no ports.
        let mut frag = quote.clone();
        frag[6..8].copy_from_slice(&0x0010u16.to_be_bytes());
        assert_eq!(parse(&mut error(3, NODE, &frag)), None);
        assert!(parse(&mut error(3, NODE, &quote)).is_some());
        // The error itself a fragment (the first, more to come).
        let mut first = error(3, NODE, &quote);
        first[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
        assert_eq!(parse(&mut first), None);
        // Ports only in the frame's padding, past the datagram's length.
        let mut padded = error(3, NODE, cut);
        padded.extend_from_slice(&[0; 5]);
        assert_eq!(parse(&mut padded), None);
    }
}
