//! One ICMP echo over a raw socket, for checks made by the agent itself.

use std::{
    io,
    mem::MaybeUninit,
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Sends one echo request to `dst` and waits up to `timeout` for its reply.
/// Returns the round-trip time, or `None` when no reply came. Blocking.
pub fn echo(
    dst: Ipv4Addr,
    identifier: u16,
    sequence: u16,
    timeout: Duration,
) -> io::Result<Option<Duration>> {
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
    let mut req = [
        8u8, 0, 0, 0, 0, 0, 0, 0, b'h', b'e', b'a', b'l', b't', b'h', 0, 0,
    ];
    req[4..6].copy_from_slice(&identifier.to_be_bytes());
    req[6..8].copy_from_slice(&sequence.to_be_bytes());
    let sum = checksum(&req);
    req[2..4].copy_from_slice(&sum.to_be_bytes());
    let start = Instant::now();
    sock.send_to(&req, &SockAddr::from(SocketAddrV4::new(dst, 0)))?;
    let deadline = start + timeout;
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        sock.set_read_timeout(Some(left))?;
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        // SAFETY: recv initialised the first n bytes.
        let pkt: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        if is_reply(&pkt, dst, identifier, sequence) {
            return Ok(Some(start.elapsed()));
        }
    }
}

fn is_reply(pkt: &[u8], from: Ipv4Addr, id: u16, seq: u16) -> bool {
    let ihl = usize::from(pkt.first().copied().unwrap_or(0) & 0x0f) * 4;
    pkt.len() >= ihl + 8
        && ihl >= 20
        && pkt[12..16] == from.octets()
        && pkt[ihl] == 0
        && pkt[ihl + 4..ihl + 6] == id.to_be_bytes()
        && pkt[ihl + 6..ihl + 8] == seq.to_be_bytes()
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_matched_on_source_identifier_and_sequence() {
        let from = Ipv4Addr::new(198, 18, 0, 2);
        let mut p = vec![
            0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0, 198, 18, 0, 2, 198, 18, 0, 1,
        ];
        p.extend_from_slice(&[0, 0, 0, 0, 0x12, 0x34, 0, 9]);
        assert!(is_reply(&p, from, 0x1234, 9));
        assert!(!is_reply(&p, from, 0x1234, 8));
        assert!(!is_reply(&p, Ipv4Addr::new(198, 18, 0, 3), 0x1234, 9));
        p[20] = 8; // a request, not a reply
        assert!(!is_reply(&p, from, 0x1234, 9));
        assert!(!is_reply(&p[..25], from, 0x1234, 9));
    }

    #[test]
    fn checksum_of_a_request_verifies() {
        let mut req = [8u8, 0, 0, 0, 0x12, 0x34, 0, 1, 1, 2, 3];
        let c = checksum(&req);
        req[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&req), 0);
    }
}
