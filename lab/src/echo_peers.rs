//! The simulated peers' ICMP echo answered from a thread of the lab
//! (`--network-thread`), not by the peers' kernel.
//!
//! The kernel answers an echo from one ICMP socket per CPU, shared by every
//! namespace, whose send buffer holds about 132 KB. A reply holds its
//! share (its buffer and the kernel's bookkeeping: about 2.3 KB for 1,500
//! bytes) until the router's stack takes it in, and with the network in a
//! NAPI thread the router takes in the replies only after the 64 requests
//! of a poll have been answered: 64 replies to an agent's MTU probes are
//! about 147 KB, and the kernel drops what does not fit, which the agent
//! rightly calls lost. One host answering for thousands of peers is the
//! simulation's fault, not the agent's. Here one raw socket with a buffer
//! of its own (32 MiB) answers every peer, in batches, and counts the
//! replies the socket refused (a full buffer makes it wait instead; a
//! drop past the socket is not seen here, but the agent's checks see it).

use std::{
    io,
    mem::{size_of, zeroed},
    net::Ipv4Addr,
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context as _;
use health_agent::sys::netns::Netns;
use socket2::{Domain, Protocol, Socket, Type};

/// Requests taken and replies sent per system call.
const BATCH: usize = 64;
/// Room for a request of the topology's 1,500-byte MTU and more.
const PACKET: usize = 2048;
/// The socket's buffers, as asked (the kernel doubles them): a round's
/// burst of requests and replies.
const BUFFER: usize = 16 << 20;
/// How often the thread checks whether it should stop.
const POLL: Duration = Duration::from_millis(100);

/// The responder's thread; it stops when dropped.
pub(crate) struct EchoPeers {
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Counts {
    answered: AtomicU64,
    not_sent: AtomicU64,
    /// The thread's id, for its CPU in `/proc`.
    tid: AtomicU32,
}

impl EchoPeers {
    /// Turns the peers' kernel echo off (`icmp_echo_ignore_all`, in their
    /// namespace, removed with it) and answers from a thread.
    pub(crate) fn start(peers: &Netns) -> anyhow::Result<Self> {
        let sock = peers
            .run(|| -> anyhow::Result<Socket> {
                std::fs::write("/proc/sys/net/ipv4/icmp_echo_ignore_all", "1")
                    .context("turning the peers' kernel echo off")?;
                raw_socket().context("the peers' raw ICMP socket")
            })
            .context("entering the peers' namespace")??;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let thread = std::thread::Builder::new()
            .name("echo-peers".into())
            .spawn({
                let (stop, counts) = (stop.clone(), counts.clone());
                move || answer(&sock, &stop, &counts)
            })
            .context("starting the peers' echo thread")?;
        Ok(Self {
            stop,
            counts,
            thread: Some(thread),
        })
    }

    /// Replies sent, and replies the socket refused.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.counts.answered.load(Ordering::Relaxed),
            self.counts.not_sent.load(Ordering::Relaxed),
        )
    }

    /// The thread's CPU so far (its own, not the lab's).
    pub(crate) fn cpu(&self) -> Duration {
        match self.counts.tid.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            tid => crate::usage::stat_cpu(&format!("/proc/self/task/{tid}/stat"))
                .map_or(Duration::ZERO, |(u, s)| u + s),
        }
    }
}

impl Drop for EchoPeers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn raw_socket() -> io::Result<Socket> {
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
    // The reply's IP header is written here: its source is the address
    // asked, which the peers' namespace holds by route, not on a link.
    sock.set_header_included_v4(true)?;
    sock.set_read_timeout(Some(POLL))?;
    force(&sock, libc::SO_RCVBUFFORCE)?;
    force(&sock, libc::SO_SNDBUFFORCE)?;
    Ok(sock)
}

/// Sets a buffer past `net.core.[rw]mem_max` (the lab runs as root).
fn force(sock: &Socket, opt: libc::c_int) -> io::Result<()> {
    let size = libc::c_int::try_from(BUFFER).unwrap_or(libc::c_int::MAX);
    // SAFETY: `size` is a live c_int of the length given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw const size).cast(),
            libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The thread: takes up to [`BATCH`] requests, sends their replies, until
/// told to stop.
fn answer(sock: &Socket, stop: &AtomicBool, counts: &Counts) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    counts
        .tid
        .store(u32::try_from(tid).unwrap_or(0), Ordering::Relaxed);
    let mut rx = vec![[0u8; PACKET]; BATCH];
    let mut rx_lens = [0usize; BATCH];
    let mut tx = vec![[0u8; PACKET]; BATCH];
    let mut tx_lens = [0usize; BATCH];
    let mut to = [Ipv4Addr::UNSPECIFIED; BATCH];
    while !stop.load(Ordering::Relaxed) {
        // A timeout (nothing asked for POLL) or an interrupted call.
        let Ok(n) = receive(sock, &mut rx, &mut rx_lens) else {
            continue;
        };
        let mut replies = 0;
        for (req, &len) in rx.iter().zip(&rx_lens).take(n) {
            if let Some((dst, reply_len)) = reply(&req[..len.min(PACKET)], &mut tx[replies]) {
                to[replies] = dst;
                tx_lens[replies] = reply_len;
                replies += 1;
            }
        }
        let sent = send(sock, &tx, &tx_lens[..replies], &to[..replies]);
        counts.answered.fetch_add(sent as u64, Ordering::Relaxed);
        counts
            .not_sent
            .fetch_add((replies - sent) as u64, Ordering::Relaxed);
    }
}

/// Up to `bufs.len()` datagrams (IP header and ICMP), at least one, their
/// lengths in `lens`.
fn receive(sock: &Socket, bufs: &mut [[u8; PACKET]], lens: &mut [usize]) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: PACKET,
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: an all-zero mmsghdr is valid (no name, no control).
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    // SAFETY: every header points at one live buffer of PACKET bytes, for
    // the call only.
    let n = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            u32::try_from(msgs.len()).unwrap_or(0),
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    for (len, m) in lens.iter_mut().zip(&msgs).take(n) {
        *len = m.msg_len as usize;
    }
    Ok(n)
}

/// Sends `lens.len()` replies from `bufs` to `to`; returns how many the
/// socket took.
fn send(sock: &Socket, bufs: &[[u8; PACKET]], lens: &[usize], to: &[Ipv4Addr]) -> usize {
    let mut names: Vec<libc::sockaddr_in> = to.iter().map(|&a| sockaddr(a)).collect();
    let mut iov: Vec<libc::iovec> = bufs
        .iter()
        .zip(lens)
        .map(|(b, &len)| libc::iovec {
            iov_base: b.as_ptr().cast_mut().cast(),
            iov_len: len,
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .zip(&mut names)
        .map(|(v, name)| {
            // SAFETY: an all-zero mmsghdr is valid.
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_name = std::ptr::from_mut(name).cast();
            m.msg_hdr.msg_namelen =
                libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap_or(16);
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let mut done = 0;
    while done < msgs.len() {
        let rest = &mut msgs[done..];
        // SAFETY: every header points at a live reply and address, for the
        // call only; the kernel reads them (sendmmsg writes only msg_len).
        let n = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                rest.as_mut_ptr(),
                u32::try_from(rest.len()).unwrap_or(0),
                0,
            )
        };
        match usize::try_from(n) {
            Ok(n) if n > 0 => done += n,
            // The first of the rest refused (its buffer full, no route):
            // skipped, counted by the caller.
            _ => return done + send_rest_each(sock, &mut msgs[done + 1..]),
        }
    }
    done
}

/// Sends each of `msgs` alone after a refusal; returns how many went.
fn send_rest_each(sock: &Socket, msgs: &mut [libc::mmsghdr]) -> usize {
    msgs.iter_mut()
        .filter(|m| {
            // SAFETY: as in `send`.
            unsafe { libc::sendmsg(sock.as_raw_fd(), &raw const m.msg_hdr, 0) >= 0 }
        })
        .count()
}

fn sockaddr(a: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2),
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// ICMP type of an echo request and of its reply.
const ECHO_REQUEST: u8 = 8;
const ECHO_REPLY: u8 = 0;
/// IP header length of a reply (no options).
const IP_HEADER: usize = 20;

/// The reply to `req` (an IPv4 datagram as a raw socket receives it),
/// written into `out` with its IP header; its destination and length.
/// `None` for anything but a well-formed echo request.
fn reply(req: &[u8], out: &mut [u8; PACKET]) -> Option<(Ipv4Addr, usize)> {
    let ihl = usize::from(*req.first()? & 0x0f) * 4;
    if req[0] >> 4 != 4 || ihl < IP_HEADER {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([*req.get(2)?, *req.get(3)?]));
    let icmp = req.get(ihl..total)?;
    if icmp.len() < 8 || icmp[0] != ECHO_REQUEST || icmp[1] != 0 {
        return None;
    }
    let src: [u8; 4] = req.get(12..16)?.try_into().ok()?;
    let dst: [u8; 4] = req.get(16..20)?.try_into().ok()?;
    let len = IP_HEADER + icmp.len();
    let out = out.get_mut(..len)?;
    let (ip, body) = out.split_at_mut(IP_HEADER);
    ip.copy_from_slice(&[
        0x45, req[1], 0, 0, // version, IHL, the request's TOS; length below
        0, 0, 0x40, 0, // id (the kernel's), DF
        64, 1, 0, 0, // TTL, ICMP; the kernel sums the header
        0, 0, 0, 0, 0, 0, 0, 0, // addresses below
    ]);
    ip[2..4].copy_from_slice(&u16::try_from(len).ok()?.to_be_bytes());
    ip[12..16].copy_from_slice(&dst);
    ip[16..20].copy_from_slice(&src);
    body.copy_from_slice(icmp);
    body[0] = ECHO_REPLY;
    // RFC 1624: the type's word went from 0x0800 to 0x0000.
    let sum = u16::from_be_bytes([body[2], body[3]]);
    let folded = u32::from(!sum) + u32::from(!u16::from_be_bytes([ECHO_REQUEST, 0]));
    let folded = (folded & 0xffff) + (folded >> 16);
    let new = !u16::try_from((folded & 0xffff) + (folded >> 16)).unwrap_or(u16::MAX);
    body[2..4].copy_from_slice(&new.to_be_bytes());
    Some((Ipv4Addr::from(src), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one's-complement sum of `data`, folded and inverted.
    fn checksum(data: &[u8]) -> u16 {
        let mut sum: u32 = data
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !u16::try_from(sum).unwrap_or(0)
    }

    fn request(payload: &[u8]) -> Vec<u8> {
        let mut icmp = vec![ECHO_REQUEST, 0, 0, 0, 0x12, 0x34, 0, 7];
        icmp.extend_from_slice(payload);
        let sum = checksum(&icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let total = u16::try_from(IP_HEADER + icmp.len()).expect("a short request");
        let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, 1, 0, 0];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&[198, 18, 0, 2, 198, 19, 0, 9]);
        ip.extend_from_slice(&icmp);
        ip
    }

    #[test]
    fn a_reply_swaps_the_addresses_keeps_the_payload_and_sums_right() {
        for payload in [&b""[..], b"odd", &[0xffu8; 1472][..]] {
            let req = request(payload);
            let mut out = [0u8; PACKET];
            let (to, len) = reply(&req, &mut out).expect("a reply");
            assert_eq!(to, Ipv4Addr::new(198, 18, 0, 2));
            assert_eq!(len, req.len());
            assert_eq!(&out[12..16], &[198, 19, 0, 9], "from the address asked");
            assert_eq!(&out[16..20], &[198, 18, 0, 2]);
            assert_eq!(out[20], ECHO_REPLY);
            assert_eq!(&out[24..len], &req[24..], "id, sequence and payload kept");
            assert_eq!(checksum(&out[20..len]), 0, "the ICMP checksum verifies");
        }
    }

    #[test]
    fn anything_but_a_whole_echo_request_gets_no_reply() {
        let mut out = [0u8; PACKET];
        let req = request(b"x");
        let mut reply_type = req.clone();
        reply_type[20] = ECHO_REPLY;
        let mut v6 = req.clone();
        v6[0] = 0x65;
        let mut long = req.clone();
        long[2..4].copy_from_slice(&u16::try_from(req.len() + 1).expect("short").to_be_bytes());
        for bad in [
            &req[..10],
            &req[..27],
            &reply_type[..],
            &v6[..],
            &long[..],
            &[][..],
        ] {
            assert_eq!(reply(bad, &mut out), None, "{bad:?}");
        }
    }
}
