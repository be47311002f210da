//! A traceroute by ICMP echo: requests to one address with TTL (hop limit)
//! 1 to N, all sent at once from one raw socket, and what each hop says:
//! "time exceeded" from a router on the way, "unreachable" from one that
//! has no way on, the echo reply from the address itself. Each answer is
//! matched to its request by the identifier and sequence it quotes.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::icmp::{echo_request, echo_request_v6, receive_until};

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

/// Traces the way to `dst`: echo requests with TTL 1 to `max_hops`
/// (identifier `identifier`, sequence the TTL), all sent at once, then
/// every answer read until `timeout` or until the address and every hop
/// before it answered. Returns the hops up to the address (it answered)
/// or up to the last hop that answered (the way ends there), in TTL
/// order; empty when nothing answered. Blocking; the socket is made in
/// the calling thread's namespace.
pub fn trace(
    dst: IpAddr,
    identifier: u16,
    max_hops: u8,
    timeout: Duration,
) -> io::Result<Vec<Hop>> {
    let sock = match dst {
        IpAddr::V4(_) => Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?,
        IpAddr::V6(_) => Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?,
    };
    let to = SockAddr::from(SocketAddr::new(dst, 0));
    let mut hops: Vec<Hop> = (1..=max_hops)
        .map(|ttl| Hop {
            ttl,
            answer: None,
            rtt: None,
        })
        .collect();
    let start = Instant::now();
    for ttl in 1..=max_hops {
        let sequence = u16::from(ttl);
        match dst {
            IpAddr::V4(_) => {
                sock.set_ttl_v4(u32::from(ttl))?;
                sock.send_to(&echo_request(identifier, sequence), &to)?;
            }
            IpAddr::V6(_) => {
                sock.set_unicast_hops_v6(u32::from(ttl))?;
                sock.send_to(&echo_request_v6(identifier, sequence), &to)?;
            }
        }
    }
    receive_until(&sock, start + timeout, |msg, from| {
        let answer = match dst {
            IpAddr::V4(_) => parse_hop_answer(msg).map(|(f, i, s, a)| (IpAddr::V4(f), i, s, a)),
            IpAddr::V6(_) => from
                .as_socket_ipv6()
                .zip(parse_hop_answer_v6(msg))
                .map(|(f, (i, s, a))| (IpAddr::V6(*f.ip()), i, s, a)),
        };
        let Some((from, id, seq, answer)) = answer else {
            return false;
        };
        if id != identifier || answer == HopAnswer::EchoReply && from != dst {
            return false;
        }
        let Some(hop) = usize::from(seq)
            .checked_sub(1)
            .and_then(|i| hops.get_mut(i))
        else {
            return false;
        };
        if hop.answer.is_none() {
            hop.answer = Some((from, answer));
            hop.rtt = Some(start.elapsed());
        }
        complete(&hops)
    })?;
    let reached = hops
        .iter()
        .position(|h| matches!(h.answer, Some((_, HopAnswer::EchoReply))));
    let last_answered = hops.iter().rposition(|h| h.answer.is_some());
    hops.truncate(reached.or(last_answered).map_or(0, |i| i + 1));
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
        let quoted = v4([198, 18, 0, 1], &echo_request(id, seq));
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
        m.extend_from_slice(&echo_request_v6(7, 2));
        assert_eq!(
            parse_hop_answer_v6(&m),
            Some((7, 2, HopAnswer::TimeExceeded))
        );
        m[8 + 6] = 17; // the quoted header's next header: UDP
        assert_eq!(parse_hop_answer_v6(&m), None);
        assert_eq!(parse_hop_answer_v6(&m[..20]), None);
        let mut reply = echo_request_v6(7, 2);
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
