//! `ICMPv6` echo over a raw socket opened inside a namespace; replies are
//! checked with the tests' own checksum code ([`crate::packets6`]).

use std::{
    io,
    net::{Ipv6Addr, SocketAddrV6},
    time::{Duration, Instant},
};

use health_agent::sys::netns::Netns;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{
    packets6::icmpv6_checksum,
    pinger::{payload_for, wait_for},
};

/// What one echo exchange produced.
#[derive(Debug, Clone)]
pub struct Exchange6 {
    pub sequence: u16,
    /// The reply's `ICMPv6` message as received (the kernel strips the IPv6
    /// header). `None`: no reply in time.
    pub reply: Option<Vec<u8>>,
    /// From just before the send to the reply's arrival.
    pub rtt: Option<Duration>,
}

/// Sends `count` echo requests from `src` to `dst` inside `ns`, one at a
/// time, waiting up to `timeout` for each reply.
pub fn ping6(
    ns: &Netns,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    identifier: u16,
    count: u16,
    timeout: Duration,
) -> io::Result<Vec<Exchange6>> {
    ns.run(|| {
        let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
        sock.bind(&SockAddr::from(SocketAddrV6::new(src, 0, 0, 0)))?;
        let to = SockAddr::from(SocketAddrV6::new(dst, 0, 0, 0));
        (0..count)
            .map(|seq| {
                // The kernel fills in the checksum of a raw ICMPv6 socket.
                let mut msg = vec![128, 0, 0, 0];
                msg.extend_from_slice(&identifier.to_be_bytes());
                msg.extend_from_slice(&seq.to_be_bytes());
                msg.extend_from_slice(&payload_for(seq));
                let start = Instant::now();
                sock.send_to(&msg, &to)?;
                let reply = wait_reply(&sock, identifier, seq, start + timeout)?;
                let rtt = reply.as_ref().map(|_| start.elapsed());
                Ok(Exchange6 {
                    sequence: seq,
                    reply,
                    rtt,
                })
            })
            .collect()
    })
    .map_err(io::Error::other)?
}

fn wait_reply(sock: &Socket, id: u16, seq: u16, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
    // An ICMPv6 raw socket delivers the message alone (no IPv6 header).
    wait_for(sock, deadline, |msg| {
        msg.len() >= 8
            && msg[0] == 129
            && msg[4..6] == id.to_be_bytes()
            && msg[6..8] == seq.to_be_bytes()
    })
}

/// Checks a reply from `from` to `to` in full: the checksum (computed
/// here, pseudo-header included), type, code, identifier, sequence, data.
pub fn check_reply6(
    ex: &Exchange6,
    from: Ipv6Addr,
    to: Ipv6Addr,
    identifier: u16,
) -> Result<(), String> {
    let seq = ex.sequence;
    let msg = ex
        .reply
        .as_ref()
        .ok_or_else(|| format!("seq {seq}: no reply"))?;
    if icmpv6_checksum(from, to, msg) != 0 {
        return Err(format!("seq {seq}: ICMPv6 checksum is wrong"));
    }
    let mut want = vec![129, 0];
    want.extend_from_slice(&msg[2..4]);
    want.extend_from_slice(&identifier.to_be_bytes());
    want.extend_from_slice(&seq.to_be_bytes());
    want.extend_from_slice(&payload_for(seq));
    if *msg != want {
        return Err(format!("seq {seq}: reply differs: {:02x?}", &msg[..8]));
    }
    Ok(())
}
