//! A traceroute by ICMP echo: requests to a few addresses with TTL (hop
//! limit) 1 to N, all sent at once from one raw socket, and what each hop
//! says: "time exceeded" from a router on the way, "unreachable" from one
//! that has no way on, the echo reply from the address itself. Each answer
//! is matched to its request by the identifier and sequence it quotes.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::icmp::{UNKEYED, echo_request, echo_request_v6, receive_until};

const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_UNREACHABLE: u8 = 3;
const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMPV6_UNREACHABLE: u8 = 1;
const ICMPV6_TIME_EXCEEDED: u8 = 3;
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
/// An IPv6 header's length.
const IPV6_HEADER: usize = 40;

/// What answered one of the trace's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopAnswer {
    /// A router on the way: the TTL ran out there.
    TimeExceeded,
    /// A router with no way on (its ICMP code).
    Unreachable(u8),
    /// The address itself.
    EchoReply,
}

/// One hop as the trace saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    pub ttl: u8,
    /// Who answered at this TTL, and how; `None`: nobody within the
    /// timeout.
    pub answer: Option<(IpAddr, HopAnswer)>,
    pub rtt: Option<Duration>,
}

/// `(identifier, sequence, answer)` of an ICMP message answering one of
/// our echo requests, in an IPv4 packet as a raw socket returns it
/// (header first): an echo reply, or an error quoting the request.
#[must_use]
pub fn parse_hop_answer(pkt: &[u8]) -> Option<(Ipv4Addr, u16, u16, HopAnswer)> {
    let ihl = usize::from(pkt.first()? & 0x0f) * 4;
    let from = Ipv4Addr::new(*pkt.get(12)?, *pkt.get(13)?, *pkt.get(14)?, *pkt.get(15)?);
    let icmp = pkt.get(ihl..)?;
    let (answer, request) = match *icmp.first()? {
        ICMP_ECHO_REPLY => return id_seq(icmp).map(|(i, s)| (from, i, s, HopAnswer::EchoReply)),
        ICMP_TIME_EXCEEDED => (HopAnswer::TimeExceeded, icmp.get(8..)?),
        ICMP_UNREACHABLE => (HopAnswer::Unreachable(*icmp.get(1)?), icmp.get(8..)?),
        _ => return None,
    };
    // The quoted request: its IP header, then at least 8 bytes of ICMP.
    let inner_ihl = usize::from(request.first()? & 0x0f) * 4;
    if inner_ihl < 20 || *request.get(9)? != IPPROTO_ICMP {
        return None;
    }
    let echo = request.get(inner_ihl..)?;
    if *echo.first()? != ICMP_ECHO_REQUEST {
        return None;
    }
    id_seq(echo).map(|(i, s)| (from, i, s, answer))
}

/// [`parse_hop_answer`] for a message of a raw `ICMPv6` socket (no IPv6
/// header: the sender comes with `recvfrom`).
#[must_use]
pub fn parse_hop_answer_v6(msg: &[u8]) -> Option<(u16, u16, HopAnswer)> {
    let (answer, request) = match *msg.first()? {
        ICMPV6_ECHO_REPLY => return id_seq(msg).map(|(i, s)| (i, s, HopAnswer::EchoReply)),
        ICMPV6_TIME_EXCEEDED => (HopAnswer::TimeExceeded, msg.get(8..)?),
        ICMPV6_UNREACHABLE => (HopAnswer::Unreachable(*msg.get(1)?), msg.get(8..)?),
        _ => return None,
    };
    if *request.get(6)? != IPPROTO_ICMPV6 {
        return None;
    }
    let echo = request.get(IPV6_HEADER..)?;
    if *echo.first()? != ICMPV6_ECHO_REQUEST {
        return None;
    }
    id_seq(echo).map(|(i, s)| (i, s, answer))
}

/// The identifier and sequence of an echo message (ICMP or `ICMPv6`).
fn id_seq(echo: &[u8]) -> Option<(u16, u16)> {
    match echo.get(4..8)? {
        &[i0, i1, s0, s1] => Some((u16::from_be_bytes([i0, i1]), u16::from_be_bytes([s0, s1]))),
        _ => None,
    }
}

/// Traces the way to each of `dsts` (all of one family) at once, from one
/// raw socket: echo requests with TTL 1 to `max_hops` to every address
/// (identifier `identifier` + its index, sequence the TTL), then every
/// answer read until `timeout` or until each address and every hop
/// before it answered. Returns, per address, the hops up to it (it
/// answered) or up to the last hop that answered (the way ends there), in
/// TTL order; empty when nothing answered. Blocking; the socket is made
/// in the calling thread's namespace.
pub fn trace(
    dsts: &[IpAddr],
    identifier: u16,
    max_hops: u8,
    timeout: Duration,
) -> io::Result<Vec<Vec<Hop>>> {
    let Some(&first) = dsts.first() else {
        return Ok(Vec::new());
    };
    let v4 = first.is_ipv4();
    if dsts.iter().any(|d| d.is_ipv4() != v4) || dsts.len() > usize::from(u16::MAX) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a trace takes addresses of one family",
        ));
    }
    let sock = if v4 {
        Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?
    } else {
        Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?
    };
    let mut hops: Vec<Vec<Hop>> = dsts
        .iter()
        .map(|_| {
            (1..=max_hops)
                .map(|ttl| Hop {
                    ttl,
                    answer: None,
                    rtt: None,
                })
                .collect()
        })
        .collect();
    let id_of = |k: usize| identifier.wrapping_add(u16::try_from(k).unwrap_or(u16::MAX));
    let start = Instant::now();
    for ttl in 1..=max_hops {
        if v4 {
            sock.set_ttl_v4(u32::from(ttl))?;
        } else {
            sock.set_unicast_hops_v6(u32::from(ttl))?;
        }
        for (k, dst) in dsts.iter().enumerate() {
            let to = SockAddr::from(SocketAddr::new(*dst, 0));
            let (id, seq) = (id_of(k), u16::from(ttl));
            if v4 {
                sock.send_to(&echo_request(id, seq, UNKEYED), &to)?;
            } else {
                sock.send_to(&echo_request_v6(id, seq, UNKEYED), &to)?;
            }
        }
    }
    let mut left = dsts.len();
    receive_until(&sock, start + timeout, |msg, from| {
        let answer = if v4 {
            parse_hop_answer(msg).map(|(f, i, s, a)| (IpAddr::V4(f), i, s, a))
        } else {
            from.as_socket_ipv6()
                .zip(parse_hop_answer_v6(msg))
                .map(|(f, (i, s, a))| (IpAddr::V6(*f.ip()), i, s, a))
        };
        let Some((from, id, seq, answer)) = answer else {
            return false;
        };
        let k = usize::from(id.wrapping_sub(identifier));
        let Some((dst, way)) = dsts.get(k).zip(hops.get_mut(k)) else {
            return false;
        };
        if answer == HopAnswer::EchoReply && from != *dst {
            return false;
        }
        let Some(i) = usize::from(seq).checked_sub(1).filter(|&i| i < way.len()) else {
            return false;
        };
        if way[i].answer.is_none() {
            let was = complete(way);
            way[i].answer = Some((from, answer));
            way[i].rtt = Some(start.elapsed());
            if !was && complete(way) {
                left -= 1;
            }
        }
        left == 0
    })?;
    for way in &mut hops {
        let reached = way
            .iter()
            .position(|h| matches!(h.answer, Some((_, HopAnswer::EchoReply))));
        let last_answered = way.iter().rposition(|h| h.answer.is_some());
        way.truncate(reached.or(last_answered).map_or(0, |i| i + 1));
    }
    Ok(hops)
}

/// The address answered and so did every hop before it.
fn complete(hops: &[Hop]) -> bool {
    hops.iter()
        .position(|h| matches!(h.answer, Some((_, HopAnswer::EchoReply))))
        .is_some_and(|end| hops[..end].iter().all(|h| h.answer.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 packet from `from` carrying the ICMP message `icmp`.
    fn v4(from: [u8; 4], icmp: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        p.extend_from_slice(&from);
        p.extend_from_slice(&[198, 18, 0, 1]);
        p.extend_from_slice(icmp);
        p
    }

    /// An error of `ty`/`code` quoting our echo request `id`/`seq`.
    fn error_quoting(ty: u8, code: u8, id: u16, seq: u16) -> Vec<u8> {
        let mut m = vec![ty, code, 0, 0, 0, 0, 0, 0];
        let quoted = v4([198, 18, 0, 1], &echo_request(id, seq, UNKEYED));
        m.extend_from_slice(&quoted[..28]);
        m
    }

    #[test]
    fn time_exceeded_and_unreachable_are_matched_to_the_request_they_quote() {
        let router = Ipv4Addr::new(198, 18, 1, 1);
        let p = v4(router.octets(), &error_quoting(11, 0, 0xbeef, 3));
        assert_eq!(
            parse_hop_answer(&p),
            Some((router, 0xbeef, 3, HopAnswer::TimeExceeded))
        );
        let p = v4(router.octets(), &error_quoting(3, 1, 0xbeef, 4));
        assert_eq!(
            parse_hop_answer(&p),
            Some((router, 0xbeef, 4, HopAnswer::Unreachable(1)))
        );
        let reply = v4([198, 18, 2, 2], &[0, 0, 0, 0, 0xbe, 0xef, 0, 5]);
        assert_eq!(
            parse_hop_answer(&reply),
            Some((
                Ipv4Addr::new(198, 18, 2, 2),
                0xbeef,
                5,
                HopAnswer::EchoReply
            ))
        );
    }

    #[test]
    fn malformed_or_foreign_messages_are_not_hop_answers() {
        let router = [198, 18, 1, 1];
        let p = v4(router, &error_quoting(11, 0, 1, 1));
        for cut in [0, 10, 20, 27, 30, 47, 51] {
            assert_eq!(parse_hop_answer(&p[..cut]), None, "cut at {cut}");
        }
        // Quoting a UDP packet, or an echo reply: not our request.
        let mut udp = p.clone();
        udp[28 + 9] = 17;
        assert_eq!(parse_hop_answer(&udp), None);
        let mut reply = p.clone();
        reply[48] = ICMP_ECHO_REPLY;
        assert_eq!(parse_hop_answer(&reply), None);
        // A redirect is no hop answer.
        let mut redirect = p;
        redirect[20] = 5;
        assert_eq!(parse_hop_answer(&redirect), None);
    }

    #[test]
    fn icmpv6_errors_quote_the_request_after_its_ipv6_header() {
        let mut m = vec![ICMPV6_TIME_EXCEEDED, 0, 0, 0, 0, 0, 0, 0];
        let mut ip6 = [0u8; IPV6_HEADER];
        ip6[0] = 0x60;
        ip6[6] = IPPROTO_ICMPV6;
        m.extend_from_slice(&ip6);
        m.extend_from_slice(&echo_request_v6(7, 2, UNKEYED));
        assert_eq!(
            parse_hop_answer_v6(&m),
            Some((7, 2, HopAnswer::TimeExceeded))
        );
        m[8 + 6] = 17; // the quoted header's next header: UDP
        assert_eq!(parse_hop_answer_v6(&m), None);
        assert_eq!(parse_hop_answer_v6(&m[..20]), None);
        let mut reply = echo_request_v6(7, 2, UNKEYED);
        reply[0] = ICMPV6_ECHO_REPLY;
        assert_eq!(
            parse_hop_answer_v6(&reply),
            Some((7, 2, HopAnswer::EchoReply))
        );
    }

    #[test]
    fn a_trace_is_complete_once_the_address_and_every_hop_before_it_answered() {
        let hop = |ttl, answer| Hop {
            ttl,
            answer,
            rtt: None,
        };
        let r = Some((IpAddr::V4(Ipv4Addr::LOCALHOST), HopAnswer::TimeExceeded));
        let e = Some((IpAddr::V4(Ipv4Addr::LOCALHOST), HopAnswer::EchoReply));
        assert!(complete(&[hop(1, r), hop(2, e), hop(3, None)]));
        assert!(!complete(&[hop(1, None), hop(2, e)]));
        assert!(!complete(&[hop(1, r), hop(2, r)]));
    }
}
