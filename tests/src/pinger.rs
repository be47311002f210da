//! ICMP echo over a raw socket opened inside a namespace, keeping the raw
//! replies (IPv4 header included) so tests can check every byte.

use std::{
    io,
    mem::MaybeUninit,
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use health_agent::sys::netns::Netns;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::packets::{Echo, verify_ipv4_icmp};

/// What one echo exchange produced.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub sequence: u16,
    /// The reply as received: IPv4 header + ICMP. `None`: no reply in time.
    pub reply: Option<Vec<u8>>,
    pub rtt: Option<Duration>,
}

/// Sends `count` echo requests to `dst` from inside `ns`, one at a time,
/// waiting up to `timeout` for each reply.
pub fn ping(
    ns: &Netns,
    dst: Ipv4Addr,
    identifier: u16,
    count: u16,
    timeout: Duration,
) -> io::Result<Vec<Exchange>> {
    ns.run(|| {
        let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
        let to = SockAddr::from(SocketAddrV4::new(dst, 0));
        (0..count)
            .map(|seq| {
                let mut req = Echo::request(Ipv4Addr::UNSPECIFIED, dst, identifier, seq);
                req.payload = payload_for(seq);
                // The kernel writes the IPv4 header; send the ICMP part only.
                let icmp = req.ip_packet()[20..].to_vec();
                let start = Instant::now();
                sock.send_to(&icmp, &to)?;
                let reply = wait_reply(&sock, dst, identifier, seq, start + timeout)?;
                let rtt = reply.as_ref().map(|_| start.elapsed());
                Ok(Exchange {
                    sequence: seq,
                    reply,
                    rtt,
                })
            })
            .collect()
    })
    .map_err(io::Error::other)?
}

/// One echo request of `size` payload bytes to `dst` from inside `ns`,
/// with Don't Fragment off, so that a size over the path's MTU leaves in
/// fragments; the reply's ICMP message (checksum checked) when one came
/// before `timeout`. The payload's bytes are `i % 7`: never an echo's type
/// where a capture would read a later fragment's first byte.
pub fn ping_fragmented(
    ns: &Netns,
    dst: Ipv4Addr,
    identifier: u16,
    size: usize,
    timeout: Duration,
) -> io::Result<Option<Vec<u8>>> {
    ns.run(|| {
        let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
        let dont: libc::c_int = libc::IP_PMTUDISC_DONT;
        // SAFETY: a plain setsockopt on an open socket, with an int option.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                (&raw const dont).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req = Echo::request(Ipv4Addr::UNSPECIFIED, dst, identifier, 1);
        req.payload = fragmented_payload(size);
        sock.send_to(
            &req.ip_packet()[20..],
            &SockAddr::from(SocketAddrV4::new(dst, 0)),
        )?;
        let deadline = Instant::now() + timeout;
        let Some(reply) = wait_for(&sock, deadline, |pkt| is_reply_to(pkt, dst, identifier, 1))?
        else {
            return Ok(None);
        };
        verify_ipv4_icmp(&reply)
            .map(<[u8]>::to_vec)
            .map(Some)
            .map_err(io::Error::other)
    })
    .map_err(io::Error::other)?
}

/// The payload [`ping_fragmented`] sends, of `size` bytes.
#[must_use]
pub fn fragmented_payload(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i % 7) as u8).collect()
}

/// A payload that differs per sequence number, so a reply cannot match
/// another request's by accident.
#[must_use]
pub fn payload_for(seq: u16) -> Vec<u8> {
    (0..56u16)
        .map(|i| (i.wrapping_mul(7) ^ seq) as u8)
        .collect()
}

fn wait_reply(
    sock: &Socket,
    from: Ipv4Addr,
    id: u16,
    seq: u16,
    deadline: Instant,
) -> io::Result<Option<Vec<u8>>> {
    wait_for(sock, deadline, |pkt| is_reply_to(pkt, from, id, seq))
}

/// The first packet `sock` receives that `wanted` accepts before
/// `deadline` (`None` when none came).
pub(crate) fn wait_for(
    sock: &Socket,
    deadline: Instant,
    wanted: impl Fn(&[u8]) -> bool,
) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 65_536];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        sock.set_read_timeout(Some(deadline - now))?;
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
        if wanted(&pkt) {
            return Ok(Some(pkt));
        }
    }
}

fn is_reply_to(pkt: &[u8], from: Ipv4Addr, id: u16, seq: u16) -> bool {
    let ihl = usize::from(pkt.first().copied().unwrap_or(0) & 0x0f) * 4;
    pkt.len() >= ihl + 8
        && pkt[12..16] == from.octets()
        && pkt[ihl] == 0
        && pkt[ihl + 4..ihl + 6] == id.to_be_bytes()
        && pkt[ihl + 6..ihl + 8] == seq.to_be_bytes()
}

/// Checks a reply in full: checksums (independently computed), type, code,
/// identifier, sequence, payload.
pub fn check_reply(ex: &Exchange, identifier: u16) -> Result<(), String> {
    let reply = ex
        .reply
        .as_ref()
        .ok_or_else(|| format!("seq {}: no reply", ex.sequence))?;
    let icmp = verify_ipv4_icmp(reply).map_err(|e| format!("seq {}: {e}", ex.sequence))?;
    let want_head = {
        let mut h = vec![0, 0];
        h.extend_from_slice(&identifier.to_be_bytes());
        h.extend_from_slice(&ex.sequence.to_be_bytes());
        h
    };
    if icmp[0..2] != want_head[0..2] || icmp[4..8] != want_head[2..6] {
        return Err(format!(
            "seq {}: unexpected ICMP header {:02x?}",
            ex.sequence,
            &icmp[..8]
        ));
    }
    if icmp[8..] != payload_for(ex.sequence)[..] {
        return Err(format!(
            "seq {}: payload differs from the request's",
            ex.sequence
        ));
    }
    Ok(())
}
