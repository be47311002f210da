//! ICMP echo packets for the agent's own use: building requests, matching
//! replies (shared by the prober's many-at-once echo in `probe::icmp`), and
//! one blocking exchange of either family for the endpoint controller's
//! check.

use std::{
    io,
    mem::MaybeUninit,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use health_common::{
    checksum,
    frame::read_at,
    headers::{
        ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST, Icmpv4Hdr,
        Ipv4Hdr, echo_id_seq, ipv4_header_len,
    },
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// The payload of echoes whose replies are matched by their identifier
/// and sequence alone: the endpoint controller's check of its own
/// endpoint, and the traces (diagnostics, whose hops' answers need quote
/// no payload: forgeable by identifier and sequence).
pub const UNKEYED: [u8; 8] = *b"health!!";

/// An echo request (ICMP header and the 8-byte payload `token`) with its
/// checksum.
#[must_use]
pub fn echo_request(identifier: u16, sequence: u16, token: [u8; 8]) -> [u8; 16] {
    let [i0, i1] = identifier.to_be_bytes();
    let [s0, s1] = sequence.to_be_bytes();
    let header = Icmpv4Hdr {
        type_: ICMP_ECHO_REQUEST,
        code: 0,
        check: [0; 2],
        data: [i0, i1, s0, s1],
    };
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&[
        header.type_,
        header.code,
        0,
        0,
        header.data[0],
        header.data[1],
        header.data[2],
        header.data[3],
    ]);
    req[8..].copy_from_slice(&token);
    let sum: u32 = req
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    req[2..4].copy_from_slice(&(!checksum::fold(sum)).to_be_bytes());
    req
}

/// An echo request of `len` bytes of ICMP (header, the 8-byte payload
/// `token`, zeros) written into `out`, for an IP packet of `len + 20`
/// bytes (IPv4; its checksum set) or `len + 40` (IPv6: the kernel sums
/// it). `len` is at least 16.
pub fn padded_echo_request(
    out: &mut Vec<u8>,
    ipv6: bool,
    (identifier, sequence): (u16, u16),
    token: [u8; 8],
    len: usize,
) {
    out.clear();
    if ipv6 {
        out.extend_from_slice(&echo_request_v6(identifier, sequence, token));
    } else {
        out.extend_from_slice(&echo_request(identifier, sequence, token));
    }
    out.resize(len.max(16), 0);
    if !ipv6 {
        out[2..4].fill(0);
        let sum: u32 = out
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
            .sum();
        out[2..4].copy_from_slice(&(!checksum::fold(sum)).to_be_bytes());
    }
}

/// `(source, sequence)` of an echo reply carrying `identifier`, in a packet
/// as a raw socket returns it (IPv4 header first).
#[must_use]
pub fn parse_reply(pkt: &[u8], identifier: u16) -> Option<(Ipv4Addr, u16)> {
    let ip: Ipv4Hdr = read_at(pkt, 0)?;
    let ihl = ipv4_header_len(&ip);
    if ihl < Ipv4Hdr::LEN {
        return None;
    }
    let icmp: Icmpv4Hdr = read_at(pkt, ihl)?;
    let (id, seq) = echo_id_seq(&icmp);
    if icmp.type_ != ICMP_ECHO_REPLY || id != identifier.to_be_bytes() {
        return None;
    }
    Some((Ipv4Addr::from(ip.src_addr), u16::from_be_bytes(seq)))
}

/// `(source, identifier, sequence, token)` of any echo reply, in a packet
/// as a raw socket returns it (IPv4 header first); the token is the first
/// 8 bytes of its payload, which a reply to one of the agent's requests
/// has.
#[must_use]
pub fn parse_any_reply(pkt: &[u8]) -> Option<(Ipv4Addr, u16, u16, [u8; 8])> {
    let ip: Ipv4Hdr = read_at(pkt, 0)?;
    let ihl = ipv4_header_len(&ip);
    if ihl < Ipv4Hdr::LEN {
        return None;
    }
    let icmp: Icmpv4Hdr = read_at(pkt, ihl)?;
    if icmp.type_ != ICMP_ECHO_REPLY {
        return None;
    }
    let token: [u8; 8] = read_at(pkt, ihl + Icmpv4Hdr::LEN)?;
    let (id, seq) = echo_id_seq(&icmp);
    Some((
        Ipv4Addr::from(ip.src_addr),
        u16::from_be_bytes(id),
        u16::from_be_bytes(seq),
        token,
    ))
}

/// An `ICMPv6` echo request (header and the 8-byte payload `token`),
/// checksum left zero: the kernel computes it over the pseudo-header for
/// a raw `ICMPv6` socket (RFC 3542).
#[must_use]
pub fn echo_request_v6(identifier: u16, sequence: u16, token: [u8; 8]) -> [u8; 16] {
    let [i0, i1] = identifier.to_be_bytes();
    let [s0, s1] = sequence.to_be_bytes();
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&[ICMPV6_ECHO_REQUEST, 0, 0, 0, i0, i1, s0, s1]);
    req[8..].copy_from_slice(&token);
    req
}

/// `(identifier, sequence, token)` of an `ICMPv6` echo reply, in a message
/// as a raw `ICMPv6` socket returns it (no IPv6 header: the source comes
/// with `recvfrom`); the token is the first 8 bytes of its payload, which
/// a reply to one of the agent's requests has.
#[must_use]
pub fn parse_any_reply_v6(msg: &[u8]) -> Option<(u16, u16, [u8; 8])> {
    match msg {
        [
            ty,
            _code,
            _,
            _,
            i0,
            i1,
            s0,
            s1,
            t0,
            t1,
            t2,
            t3,
            t4,
            t5,
            t6,
            t7,
            ..,
        ] if *ty == ICMPV6_ECHO_REPLY => Some((
            u16::from_be_bytes([*i0, *i1]),
            u16::from_be_bytes([*s0, *s1]),
            [*t0, *t1, *t2, *t3, *t4, *t5, *t6, *t7],
        )),
        _ => None,
    }
}

/// Sends one echo request to `dst` (ICMP or `ICMPv6`) and waits up to
/// `timeout` for its reply from `dst`. Returns the round-trip time, or
/// `None` when no reply came. Blocking.
pub fn echo(
    dst: IpAddr,
    identifier: u16,
    sequence: u16,
    timeout: Duration,
) -> io::Result<Option<Duration>> {
    let (sock, request) = match dst {
        IpAddr::V4(_) => (
            Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?,
            echo_request(identifier, sequence, UNKEYED),
        ),
        IpAddr::V6(_) => (
            Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?,
            echo_request_v6(identifier, sequence, UNKEYED),
        ),
    };
    let start = Instant::now();
    sock.send_to(&request, &SockAddr::from(SocketAddr::new(dst, 0)))?;
    let answered = receive_until(&sock, start + timeout, |msg, from| match dst {
        IpAddr::V4(v4) => parse_reply(msg, identifier) == Some((v4, sequence)),
        IpAddr::V6(v6) => {
            from.as_socket_ipv6().is_some_and(|a| *a.ip() == v6)
                && parse_any_reply_v6(msg) == Some((identifier, sequence, UNKEYED))
        }
    })?;
    Ok(answered.then(|| start.elapsed()))
}

/// Reads messages from `sock` until `deadline`, until `wanted` accepts one
/// (with its sender); whether one came.
pub(super) fn receive_until(
    sock: &Socket,
    deadline: Instant,
    mut wanted: impl FnMut(&[u8], &SockAddr) -> bool,
) -> io::Result<bool> {
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        sock.set_read_timeout(Some(left))?;
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        // SAFETY: recv_from initialised the first n bytes of `buf`, and
        // MaybeUninit<u8> has u8's layout.
        let msg = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        if wanted(msg, &from) {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(from: [u8; 4], id: u16, seq: u16) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0];
        p.extend_from_slice(&from);
        p.extend_from_slice(&[198, 18, 0, 1, 0, 0, 0, 0]);
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&seq.to_be_bytes());
        p
    }

    #[test]
    fn replies_are_matched_on_source_identifier_and_sequence() {
        let from = Ipv4Addr::new(198, 18, 0, 2);
        let mut p = reply(from.octets(), 0x1234, 9);
        assert_eq!(parse_reply(&p, 0x1234), Some((from, 9)));
        assert_ne!(parse_reply(&p, 0x1234), Some((from, 8)));
        assert_ne!(
            parse_reply(&p, 0x1234),
            Some((Ipv4Addr::new(198, 18, 0, 3), 9))
        );
        assert_eq!(parse_reply(&p, 0x1235), None, "another prober's reply");
        assert_eq!(parse_reply(&p[..25], 0x1234), None, "truncated");
        p[20] = 8;
        assert_eq!(parse_reply(&p, 0x1234), None, "a request, not a reply");
    }

    #[test]
    fn any_reply_gives_its_token() {
        let from = Ipv4Addr::new(198, 18, 0, 2);
        let token = *b"\x01tokens\xfe";
        let mut p = vec![0x45, 0, 0, 36, 0, 0, 0, 0, 64, 1, 0, 0];
        p.extend_from_slice(&from.octets());
        p.extend_from_slice(&[198, 18, 0, 1]);
        let mut icmp = echo_request(0x1234, 9, token);
        icmp[0] = ICMP_ECHO_REPLY;
        p.extend_from_slice(&icmp);
        assert_eq!(parse_any_reply(&p), Some((from, 0x1234, 9, token)));
        assert_eq!(parse_any_reply(&p[..35]), None, "no whole token");
        p[20] = ICMP_ECHO_REQUEST;
        assert_eq!(parse_any_reply(&p), None, "a request, not a reply");
    }

    #[test]
    fn icmpv6_requests_and_replies() {
        let token = *b"12345678";
        let req = echo_request_v6(0xbeef, 3, token);
        assert_eq!(&req[..8], &[128, 0, 0, 0, 0xbe, 0xef, 0, 3]);
        assert_eq!(&req[8..], b"12345678");
        let mut reply = req;
        reply[0] = 129;
        assert_eq!(parse_any_reply_v6(&reply), Some((0xbeef, 3, token)));
        assert_eq!(parse_any_reply_v6(&req), None, "a request, not a reply");
        assert_eq!(parse_any_reply_v6(&reply[..7]), None, "truncated");
        assert_eq!(parse_any_reply_v6(&reply[..15]), None, "no whole token");
        reply[0] = 136; // neighbour advertisement
        assert_eq!(parse_any_reply_v6(&reply), None);
    }

    #[test]
    fn padded_requests_carry_a_valid_checksum_over_every_byte() {
        let mut buf = Vec::new();
        let token = [0xa5, 1, 2, 3, 4, 5, 6, 0xff];
        for len in [16usize, 17, 1_000, 1_480] {
            padded_echo_request(&mut buf, false, (0x1234, 7), token, len);
            assert_eq!(buf.len(), len);
            assert_eq!(&buf[4..8], &[0x12, 0x34, 0, 7]);
            assert_eq!(buf[8..16], token, "the token leads the payload");
            let sum: u32 = buf
                .chunks(2)
                .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
                .sum();
            assert_eq!(checksum::fold(sum), 0xffff, "len {len}");
        }
        padded_echo_request(&mut buf, true, (1, 2), token, 1_452);
        assert_eq!((buf.len(), buf[0]), (1_452, ICMPV6_ECHO_REQUEST));
        assert_eq!(buf[8..16], token);
    }

    #[test]
    fn requests_carry_a_valid_checksum() {
        let req = echo_request(0x1234, 7, UNKEYED);
        let sum: u32 = req
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        assert_eq!(
            checksum::fold(sum),
            0xffff,
            "a valid checksum sums to all ones"
        );
        assert_eq!((req[0], &req[4..8]), (8, &[0x12, 0x34, 0, 7][..]));
    }

    #[test]
    #[allow(
        clippy::print_stderr,
        reason = "says why the test is skipped for a user who is not root"
    )]
    fn a_blocking_echo_is_answered_over_loopback_in_both_families() {
        // Raw sockets: root (as `cargo xtask test` runs it).
        let timeout = Duration::from_secs(1);
        for dst in [
            IpAddr::from(Ipv4Addr::LOCALHOST),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ] {
            let rtt = match echo(dst, 0x4845, 7, timeout) {
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    eprintln!("skipped: a raw ICMP socket needs root (cargo xtask test runs it)");
                    return;
                }
                rtt => rtt.expect("echo"),
            };
            assert!(rtt.is_some_and(|r| r < timeout), "{dst}: {rtt:?}");
        }
    }
}
