//! ICMP echo for a whole round at once, without a task or a timer per
//! probe: one raw socket per source namespace; the round's requests are
//! paced out over the spread from one loop that also reads the replies,
//! matches them by identifier and sequence (and source), and ends at one
//! deadline. Identifiers are random per round, so a late reply of an
//! earlier round is never taken for this one's.

use std::{
    io::{self, Read as _},
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::{
    io::unix::AsyncFd,
    time::{Instant, sleep_until},
};

use super::error::{ProbeError, Proto};
use crate::sys::{
    icmp::{echo_request, parse_any_reply},
    netns::Netns,
};

/// Sequence numbers per identifier: a round of more targets uses the next
/// identifiers too.
const PER_IDENTIFIER: usize = 1 << 16;

pub struct IcmpProber {
    sock: AsyncFd<Socket>,
}

impl IcmpProber {
    /// Opens the socket in `netns` (the caller's when `None`); needs a
    /// tokio runtime.
    pub fn new(netns: Option<&Netns>) -> io::Result<Self> {
        let sock = crate::sys::netns::run_in(netns, || {
            Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))
        })
        .map_err(io::Error::other)??;
        sock.set_nonblocking(true)?;
        // Replies of a whole round may arrive in one burst, and all ICMP of
        // the namespace lands here: SO_RCVBUF is capped by
        // net.core.rmem_max (about 200 KiB, a few hundred replies), so the
        // privileged agent forces its size past the cap.
        force_buffer(&sock, libc::SO_RCVBUFFORCE, 16 << 20)
            .or_else(|_| sock.set_recv_buffer_size(16 << 20))?;
        force_buffer(&sock, libc::SO_SNDBUFFORCE, 4 << 20)
            .or_else(|_| sock.set_send_buffer_size(4 << 20))?;
        // SAFETY: the AsyncFd owns the socket and keeps its fd open.
        let sock = unsafe { AsyncFd::register(sock)? };
        Ok(Self { sock })
    }

    /// The receive buffer's size as the kernel keeps it (twice what was
    /// asked, for bookkeeping).
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.sock.get_ref().recv_buffer_size()
    }

    /// One echo to each of `targets`, the requests spread evenly over
    /// `spread`; each answer counts when it comes within `timeout` of its
    /// request. Results are in the order of `targets`.
    pub async fn round(
        &self,
        targets: &[Ipv4Addr],
        timeout: Duration,
        spread: Duration,
    ) -> Vec<Result<Duration, ProbeError>> {
        let n = targets.len();
        let timed_out = Err(ProbeError::Timeout {
            proto: Proto::Icmp,
            after: timeout,
        });
        let mut results: Vec<Result<Duration, ProbeError>> = vec![timed_out; n];
        if n == 0 {
            return results;
        }
        let base = fastrand::u16(..);
        let mut sent_at: Vec<Option<Instant>> = vec![None; n];
        let mut pending = n;
        let start = Instant::now();
        let step = spread / u32::try_from(n).unwrap_or(u32::MAX).max(1);
        let mut next = 0usize;
        let mut deadline = start + spread + timeout;
        let mut buf = [0u8; 1500];
        while pending > 0 {
            // Send every request whose time has come.
            let now = Instant::now();
            while next < n && start + step * u32::try_from(next).unwrap_or(u32::MAX) <= now {
                let (id, seq) = ident(base, next);
                match self.send(targets[next], id, seq).await {
                    Ok(()) => sent_at[next] = Some(Instant::now()),
                    Err(e) => {
                        results[next] = Err(ProbeError::io("sending echo request", &e));
                        pending -= 1;
                    }
                }
                next += 1;
            }
            if next == n {
                deadline = deadline.min(Instant::now() + timeout);
            }
            if pending == 0 {
                break;
            }
            let wake = if next < n {
                start + step * u32::try_from(next).unwrap_or(u32::MAX)
            } else {
                deadline
            };
            tokio::select! {
                ready = self.sock.readable() => {
                    let Ok(mut guard) = ready else { break };
                    // Drain every reply queued, then wait again.
                    while let Ok(Ok(len)) = guard.try_io(|s| {
                        let mut sock: &Socket = s.get_ref();
                        sock.read(&mut buf)
                    }) {
                        let at = Instant::now();
                        if let Some(i) = match_reply(&buf[..len], base, targets)
                            && let Some(sent) = sent_at[i].take()
                        {
                            let rtt = at.saturating_duration_since(sent);
                            if rtt <= timeout {
                                results[i] = Ok(rtt);
                            }
                            pending -= 1;
                        }
                    }
                }
                () = sleep_until(wake) => {
                    if next == n && Instant::now() >= deadline {
                        break;
                    }
                }
            }
        }
        results
    }

    async fn send(&self, dst: Ipv4Addr, id: u16, seq: u16) -> io::Result<()> {
        let request = echo_request(id, seq);
        let to = SockAddr::from(SocketAddrV4::new(dst, 0));
        loop {
            let mut guard = self.sock.writable().await?;
            match guard.try_io(|s| s.get_ref().send_to(&request, &to)) {
                Ok(r) => return r.map(|_| ()),
                Err(_would_block) => {}
            }
        }
    }
}

/// The identifier and sequence of the `i`-th request of a round.
#[allow(
    clippy::cast_possible_truncation,
    reason = "the low 16 bits are the sequence, the rest picks the identifier"
)]
const fn ident(base: u16, i: usize) -> (u16, u16) {
    (
        base.wrapping_add((i / PER_IDENTIFIER) as u16),
        (i % PER_IDENTIFIER) as u16,
    )
}

/// The index of the request `pkt` answers: identifier and sequence of this
/// round, from the address it was sent to.
fn match_reply(pkt: &[u8], base: u16, targets: &[Ipv4Addr]) -> Option<usize> {
    let (src, id, seq) = parse_any_reply(pkt)?;
    let block = usize::from(id.wrapping_sub(base));
    let i = block * PER_IDENTIFIER + usize::from(seq);
    (targets.get(i) == Some(&src)).then_some(i)
}

/// Sets a socket buffer size past `net.core.[rw]mem_max` (`SO_RCVBUFFORCE`
/// or `SO_SNDBUFFORCE`; needs `CAP_NET_ADMIN`).
fn force_buffer(sock: &Socket, opt: libc::c_int, bytes: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a valid socket, an int option value of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw const bytes).cast(),
            libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(from: Ipv4Addr, id: u16, seq: u16) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 36, 0, 0, 0, 0, 64, 1, 0, 0];
        p.extend_from_slice(&from.octets());
        p.extend_from_slice(&[198, 18, 64, 2]);
        let mut icmp = echo_request(id, seq).to_vec();
        icmp[0] = 0;
        p.extend_from_slice(&icmp);
        p
    }

    #[test]
    fn replies_match_by_identifier_sequence_and_source() {
        let targets: Vec<Ipv4Addr> = (1..=3).map(|k| Ipv4Addr::new(198, 18, 1, k)).collect();
        let base = 0xfffe;
        assert_eq!(
            match_reply(&reply(targets[2], base, 2), base, &targets),
            Some(2)
        );
        assert_eq!(
            match_reply(&reply(targets[1], base, 2), base, &targets),
            None,
            "a reply from another address than the request's"
        );
        assert_eq!(
            match_reply(&reply(targets[0], base.wrapping_add(7), 0), base, &targets),
            None,
            "another round's identifier"
        );
        assert_eq!(
            match_reply(&reply(targets[0], base, 9), base, &targets),
            None
        );
    }

    #[test]
    fn rounds_past_65536_requests_use_the_next_identifiers() {
        assert_eq!(ident(0xffff, 0), (0xffff, 0));
        assert_eq!(ident(0xffff, 65_535), (0xffff, 65_535));
        assert_eq!(
            ident(0xffff, 65_536),
            (0, 0),
            "wraps to the next identifier"
        );
        assert_eq!(ident(7, 70_000), (8, 4_464));
    }

    #[tokio::test]
    async fn the_receive_buffer_holds_a_round_of_replies_past_rmem_max() {
        let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .expect("rmem_max")
            .trim()
            .parse()
            .expect("a number");
        let prober = IcmpProber::new(None).expect("raw ICMP socket (run as root)");
        let size = prober.recv_buffer_size().expect("SO_RCVBUF");
        assert!(
            size >= 16 << 20 && size > 2 * rmem_max,
            "receive buffer {size} bytes (rmem_max {rmem_max})"
        );
    }
}
