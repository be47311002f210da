//! When an echo reply reached the node, as the kernel stamped it on
//! arrival (`SO_TIMESTAMPNS`), rather than when the agent read it. On a
//! busy node a reply that came in time can be read after its probe's
//! timeout; the arrival, not the read, decides whether it was in time, and
//! gives its RTT.

use std::{
    io,
    mem::MaybeUninit,
    net::Ipv6Addr,
    os::fd::AsRawFd as _,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use socket2::Socket;

/// Asks the kernel to stamp each datagram `sock` receives with the time it
/// arrived. The kernel turns its stamps on from a work queue, within
/// moments; a datagram that comes before is stamped when it is read.
pub(super) fn stamp_arrivals(sock: &Socket) -> io::Result<()> {
    crate::sys::sockopt::set(
        sock,
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMPNS,
        &1 as &libc::c_int,
    )
}

/// A datagram read: its length, when it arrived (when it was read, when
/// the kernel did not say), and its source when it came over IPv6.
#[derive(Debug, Clone, Copy)]
pub(super) struct Received {
    pub len: usize,
    pub at: Instant,
    pub from: Option<Ipv6Addr>,
}

/// Room for one `SCM_TIMESTAMPNS` message (a header and a timespec), with
/// the alignment control messages need.
#[repr(C, align(8))]
struct Control([u8; 64]);

/// Reads one datagram queued on `sock` into `buf` (without waiting), with
/// its arrival time.
pub(super) fn recv_stamped(sock: &Socket, buf: &mut [u8]) -> io::Result<Received> {
    let mut name = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut control = Control([0; 64]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = name.as_mut_ptr().cast();
    msg.msg_namelen = libc::socklen_t::try_from(size_of::<libc::sockaddr_storage>())
        .unwrap_or(libc::socklen_t::MAX);
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    // SAFETY: every pointer in `msg` points at a live buffer of the
    // length given beside it, for the duration of the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut msg, libc::MSG_DONTWAIT) };
    let len = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let read = clocks(SystemTime::now, Instant::now);
    // SAFETY: recvmsg filled `msg`'s control buffer and `name` (of
    // `msg_namelen` bytes).
    let (stamp, from) = unsafe { (arrival(&msg), source_v6(name.as_ptr(), msg.msg_namelen)) };
    Ok(Received {
        len: len.min(buf.len()),
        at: stamp.map_or(read.0, |s| on_monotonic(s, read)),
        from,
    })
}

/// The `SCM_TIMESTAMPNS` stamp among `msg`'s control messages.
///
/// # Safety
/// `msg` was filled by `recvmsg`: its control buffer holds
/// `msg_controllen` bytes of control messages.
unsafe fn arrival(msg: &libc::msghdr) -> Option<SystemTime> {
    // SAFETY: the CMSG_* macros walk the control buffer within
    // `msg_controllen`, as the caller vouches.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !c.is_null() {
        // SAFETY: a header inside the buffer (CMSG_FIRSTHDR/NXTHDR check).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_TIMESTAMPNS {
            // SAFETY: the kernel puts a timespec after this header.
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>()) };
            let secs = u64::try_from(ts.tv_sec).ok()?;
            let nanos = u32::try_from(ts.tv_nsec).ok()?;
            return Some(UNIX_EPOCH + Duration::new(secs, nanos));
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(msg, c) };
    }
    None
}

/// The IPv6 source in `name`, when it is one.
///
/// # Safety
/// `name` points at `len` bytes of a socket address written by the kernel.
unsafe fn source_v6(name: *const libc::sockaddr_storage, len: libc::socklen_t) -> Option<Ipv6Addr> {
    let len = usize::try_from(len).ok()?;
    // SAFETY: at least the family is there when `len` covers it.
    let family = unsafe { (*name).ss_family };
    if i32::from(family) != libc::AF_INET6 || len < size_of::<libc::sockaddr_in6>() {
        return None;
    }
    // SAFETY: an AF_INET6 address of its full size.
    let a = unsafe { std::ptr::read_unaligned(name.cast::<libc::sockaddr_in6>()) };
    Some(Ipv6Addr::from(a.sin6_addr.s6_addr))
}

/// A reading of both clocks, (monotonic, real-time), the real-time clock
/// read first: a pause between the two readings (the thread preempted)
/// makes a stamp put on the monotonic clock later, never earlier, so a
/// reply that came late is never taken for one in time.
fn clocks(
    real: impl FnOnce() -> SystemTime,
    mono: impl FnOnce() -> Instant,
) -> (Instant, SystemTime) {
    let r = real();
    (mono(), r)
}

/// `stamp`, taken on the real-time clock, on the monotonic clock, given
/// a reading of both (`read`) after it. A stamp ahead of the reading (the
/// clock stepped back) is the reading.
fn on_monotonic(stamp: SystemTime, (mono, real): (Instant, SystemTime)) -> Instant {
    let ago = real.duration_since(stamp).unwrap_or(Duration::ZERO);
    mono.checked_sub(ago).unwrap_or(mono)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real-time clock is read first, so that a pause between the two
    /// readings puts the arrival later, never earlier.
    #[test]
    fn a_pause_between_the_clock_readings_puts_the_arrival_later() {
        let start = (Instant::now(), SystemTime::now());
        let stamp = start.1;
        let pause = Duration::from_millis(5);
        // The reading taken across a 5 ms pause: whichever clock is read
        // second reads 5 ms later.
        let order = std::cell::RefCell::new(Vec::new());
        let read = clocks(
            || {
                order.borrow_mut().push("real");
                if order.borrow().len() == 2 {
                    start.1 + pause
                } else {
                    start.1
                }
            },
            || {
                order.borrow_mut().push("mono");
                if order.borrow().len() == 2 {
                    start.0 + pause
                } else {
                    start.0
                }
            },
        );
        assert_eq!(*order.borrow(), ["real", "mono"]);
        assert!(
            on_monotonic(stamp, read) >= start.0,
            "never before the arrival"
        );
    }

    #[test]
    fn a_stamp_is_as_long_before_the_read_on_either_clock() {
        let (mono, real) = (Instant::now(), SystemTime::now());
        let stamp = real - Duration::from_millis(700);
        assert_eq!(
            on_monotonic(stamp, (mono, real)),
            mono.checked_sub(Duration::from_millis(700))
                .expect("a monotonic clock past 700 ms")
        );
        // A stamp after the reading (the clock stepped back): the reading.
        let ahead = real + Duration::from_secs(3);
        assert_eq!(on_monotonic(ahead, (mono, real)), mono);
    }

    /// Over loopback: a datagram read 200 ms after it came is stamped
    /// when it came, not when it was read; its length is its own, and an
    /// IPv6 one names its source. Without stamps asked for, the read is
    /// the arrival.
    #[test]
    fn a_datagram_read_late_is_stamped_when_it_came() {
        use socket2::{Domain, Protocol, SockAddr, Type};
        let wait = Duration::from_millis(200);
        for (domain, at) in [
            (Domain::IPV4, "127.0.0.1:0".parse::<std::net::SocketAddr>()),
            (Domain::IPV6, "[::1]:0".parse::<std::net::SocketAddr>()),
        ] {
            let at = SockAddr::from(at.expect("address"));
            let receiver = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
            receiver.bind(&at).expect("bind");
            stamp_arrivals(&receiver).expect("SO_TIMESTAMPNS");
            // The kernel turns stamping on from a work queue.
            std::thread::sleep(Duration::from_millis(50));
            let sender = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
            let to = receiver.local_addr().expect("bound");
            sender.send_to(b"echo", &to).expect("send");
            let sent = Instant::now();
            std::thread::sleep(wait);
            let mut buf = [0u8; 16];
            let got = recv_stamped(&receiver, &mut buf).expect("a datagram");
            assert_eq!((got.len, &buf[..4]), (4, &b"echo"[..]));
            let before_read = Instant::now().saturating_duration_since(got.at);
            assert!(
                before_read >= Duration::from_millis(180),
                "{domain:?}: stamped {before_read:?} before the read, not on arrival"
            );
            assert!(got.at <= sent + Duration::from_millis(20), "{domain:?}");
            assert_eq!(
                got.from,
                (domain == Domain::IPV6).then_some(Ipv6Addr::LOCALHOST),
                "{domain:?}"
            );
            // Nothing queued: an error, no datagram made up.
            assert!(recv_stamped(&receiver, &mut buf).is_err());
        }
        // Unstamped: the read's time.
        let at = SockAddr::from("127.0.0.1:0".parse::<std::net::SocketAddr>().expect("addr"));
        let plain = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
        plain.bind(&at).expect("bind");
        let sender = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
        sender
            .send_to(b"x", &plain.local_addr().expect("bound"))
            .expect("send");
        std::thread::sleep(wait);
        let mut buf = [0u8; 4];
        let got = recv_stamped(&plain, &mut buf).expect("a datagram");
        assert!(Instant::now().saturating_duration_since(got.at) < wait / 2);
    }
}
