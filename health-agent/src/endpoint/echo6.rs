//! One blocking `ICMPv6` echo exchange, for the controller's check that the
//! endpoint answers on its IPv6 address (the IPv4 one is
//! [`crate::sys::icmp::echo`]).

use std::{
    io,
    mem::MaybeUninit,
    net::{Ipv6Addr, SocketAddrV6},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const ECHO_REQUEST: u8 = 128;
const ECHO_REPLY: u8 = 129;

/// An echo request: `ICMPv6` header and an 8-byte payload. The checksum is
/// left zero: the kernel fills it in on a raw `ICMPv6` socket.
fn request(identifier: u16, sequence: u16) -> [u8; 16] {
    let mut req = [0u8; 16];
    req[0] = ECHO_REQUEST;
    req[4..6].copy_from_slice(&identifier.to_be_bytes());
    req[6..8].copy_from_slice(&sequence.to_be_bytes());
    req[8..].copy_from_slice(b"health!!");
    req
}

/// Whether `msg` (an `ICMPv6` message, as a raw socket returns it) is the
/// reply to `(identifier, sequence)`.
fn is_reply(msg: &[u8], identifier: u16, sequence: u16) -> bool {
    msg.len() >= 8
        && msg[0] == ECHO_REPLY
        && msg[4..6] == identifier.to_be_bytes()
        && msg[6..8] == sequence.to_be_bytes()
}

/// Sends one echo request to `dst` and waits up to `timeout` for its reply
/// from `dst`. Returns the round-trip time, or `None` when no reply came.
pub(super) fn echo6(
    dst: Ipv6Addr,
    identifier: u16,
    sequence: u16,
    timeout: Duration,
) -> io::Result<Option<Duration>> {
    let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    let start = Instant::now();
    sock.send_to(
        &request(identifier, sequence),
        &SockAddr::from(SocketAddrV6::new(dst, 0, 0, 0)),
    )?;
    let deadline = start + timeout;
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
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
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        // SAFETY: recv_from initialised the first n bytes.
        let msg: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        let from_dst = from.as_socket_ipv6().is_some_and(|a| *a.ip() == dst);
        if from_dst && is_reply(&msg, identifier, sequence) {
            return Ok(Some(start.elapsed()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_matched_on_type_identifier_and_sequence() {
        let mut reply = request(0x4845, 3);
        assert!(!is_reply(&reply, 0x4845, 3), "a request is no reply");
        reply[0] = ECHO_REPLY;
        assert!(is_reply(&reply, 0x4845, 3));
        assert!(!is_reply(&reply, 0x4845, 4));
        assert!(!is_reply(&reply, 0x4846, 3));
        assert!(!is_reply(&reply[..7], 0x4845, 3), "truncated");
    }
}
