//! A packet capture on one interface of a namespace (an `AF_PACKET`
//! socket, both directions), so a test can see what a peer node received:
//! addresses and the port or echo identifier of every IPv4 packet.

use std::{
    io,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use health_agent::sys::{netlink::in_netns, netns::Netns};

/// One IPv4 packet seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The whole IPv4 packet.
    pub bytes: Vec<u8>,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    /// ICMP echo: type; otherwise 0.
    pub icmp_type: u8,
    /// TCP/UDP source port, or the ICMP echo identifier.
    pub sport: u16,
    pub dport: u16,
}

impl Seen {
    fn parse(ip: &[u8]) -> Option<Self> {
        let ihl = usize::from(*ip.first()? & 0x0f) * 4;
        if ip[0] >> 4 != 4 || ip.len() < ihl + 8 {
            return None;
        }
        let l4 = &ip[ihl..];
        let word = |i: usize| u16::from_be_bytes([l4[i], l4[i + 1]]);
        let proto = ip[9];
        let (icmp_type, sport, dport) = match proto {
            1 => (l4[0], word(4), 0),
            _ => (0, word(0), word(2)),
        };
        Some(Self {
            bytes: ip.to_vec(),
            src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            proto,
            icmp_type,
            sport,
            dport,
        })
    }
}

/// A running capture of one ethertype's packets, parsed by the family's
/// parser; [`Running::stop`] returns what it saw.
pub struct Running<T> {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<T>>,
}

/// A running IPv4 capture.
pub type Capture = Running<Seen>;

/// Every protocol: only `ETH_P_ALL` sockets see outgoing packets too
/// (packets of other ethertypes are skipped).
const ETH_P_ALL: u16 = 0x0003;
const ETH_P_IP: u16 = 0x0800;

/// Starts capturing the packets of `ethertype` on `iface` in `ns`, both
/// directions, keeping those `parse` accepts.
pub(crate) fn start<T: Send + 'static>(
    ns: &Netns,
    iface: &str,
    ethertype: u16,
    parse: fn(&[u8]) -> Option<T>,
) -> io::Result<Running<T>> {
    let fd = packet_socket(ns, iface, libc::SOCK_DGRAM)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 65_536];
        while !flag.load(Ordering::Relaxed) {
            if let Some((n, from)) = recv(&fd, &mut buf)
                && from.sll_protocol == ethertype.to_be()
                && let Some(s) = parse(&buf[..n])
            {
                seen.push(s);
            }
        }
        seen
    });
    Ok(Running { stop, thread })
}

impl<T> Running<T> {
    /// Stops and returns every packet seen.
    #[must_use]
    pub fn stop(self) -> Vec<T> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("capture thread")
    }
}

impl Running<Seen> {
    /// Starts capturing IPv4 on `iface` in `ns`.
    pub fn start(ns: &Netns, iface: &str) -> io::Result<Self> {
        start(ns, iface, ETH_P_IP, Seen::parse)
    }
}

/// Sends whole Ethernet frames, as given, out of `iface` in `ns`.
pub fn send_frames(ns: &Netns, iface: &str, frames: &[Vec<u8>]) -> io::Result<()> {
    let fd = packet_socket(ns, iface, libc::SOCK_RAW)?;
    for f in frames {
        // SAFETY: f is valid for its length; fd is open.
        let n = unsafe { libc::send(fd.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
        if usize::try_from(n).ok() != Some(f.len()) {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One frame from `fd` into `buf` (`None` when the receive timed out):
/// its length and where it came from.
pub(crate) fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<(usize, libc::sockaddr_ll)> {
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut from_len = u32::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or(0);
    // SAFETY: buf and from are valid for their lengths; fd is open.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&raw mut from).cast(),
            &raw mut from_len,
        )
    };
    usize::try_from(n).ok().map(|n| (n, from))
}

/// `sll_pkttype` of a frame this host sent.
const PACKET_OUTGOING: u8 = 4;

/// `sll_pkttype` of a frame addressed to this host.
pub const PACKET_HOST: u8 = 0;

/// A frame that arrived on an interface, and what the stack took it for
/// (`sll_pkttype`: [`PACKET_HOST`], broadcast, multicast, another host's).
pub struct Arrival {
    pub frame: Vec<u8>,
    pub pkttype: u8,
}

/// Sends one whole Ethernet frame out of `iface` in `ns` and returns every
/// frame that arrives on `iface` within `window` after it (frames sent by
/// this host are left out).
pub fn exchange(
    ns: &Netns,
    iface: &str,
    frame: &[u8],
    window: Duration,
) -> io::Result<Vec<Arrival>> {
    let fd = packet_socket(ns, iface, libc::SOCK_RAW)?;
    // SAFETY: frame is valid for its length; fd is open.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    if usize::try_from(n).ok() != Some(frame.len()) {
        return Err(io::Error::last_os_error());
    }
    let deadline = std::time::Instant::now() + window;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while std::time::Instant::now() < deadline {
        if let Some((n, from)) = recv(&fd, &mut buf)
            && from.sll_pkttype != PACKET_OUTGOING
        {
            got.push(Arrival {
                frame: buf[..n].to_vec(),
                pkttype: from.sll_pkttype,
            });
        }
    }
    Ok(got)
}

/// The one frame of `got` that `is_reply` picks (`None` when none does).
/// Panics if two do, or if the one arrived other than addressed to this
/// host: a reply is unicast to the requester, whatever the request was
/// sent to.
pub fn the_reply(got: Vec<Arrival>, is_reply: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let mut replies = got.into_iter().filter(|a| is_reply(&a.frame));
    let first = replies.next();
    assert!(replies.next().is_none(), "two replies to one request");
    first.map(|a| {
        assert_eq!(
            a.pkttype, PACKET_HOST,
            "the reply arrived as sll_pkttype {}, not as addressed to this host",
            a.pkttype
        );
        a.frame
    })
}

/// An `AF_PACKET` socket on `iface` of `ns` (`SOCK_DGRAM`: no link header;
/// `SOCK_RAW`: whole frames), with a short receive timeout so a reader can
/// stop.
pub(crate) fn packet_socket(ns: &Netns, iface: &str, kind: i32) -> io::Result<OwnedFd> {
    let name = iface.to_owned();
    let index = in_netns(Some(ns), |nl| async move { nl.require_link(&name).await })
        .map_err(io::Error::other)?;
    ns.run(|| bound_socket(index, kind))
        .map_err(io::Error::other)?
}

/// The socket of [`packet_socket`], made in the calling thread's namespace.
fn bound_socket(index: u32, kind: i32) -> io::Result<OwnedFd> {
    let proto = i32::from(ETH_P_ALL.to_be());
    // SAFETY: plain syscall; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_PACKET, kind | libc::SOCK_CLOEXEC, proto) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_ll is valid; fields set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = ETH_P_ALL.to_be();
    addr.sll_ifindex = i32::try_from(index).map_err(io::Error::other)?;
    // SAFETY: addr is a valid sockaddr_ll of the given size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            u32::try_from(size_of::<libc::sockaddr_ll>()).map_err(io::Error::other)?,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: i64::try_from(Duration::from_millis(100).as_micros()).unwrap_or(100_000),
    };
    // SAFETY: timeout is a valid timeval of the given size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            u32::try_from(size_of::<libc::timeval>()).map_err(io::Error::other)?,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}
