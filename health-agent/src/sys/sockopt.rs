//! Socket options that neither std nor socket2 sets: any option by its
//! level and number, buffer sizes past the system's cap, and the bytes a
//! socket has queued to send.

use std::{io, os::fd::AsFd};

/// `setsockopt(level, opt)` on `sock` with `value` as the option's bytes.
/// Only for options whose value is plain data (integers, flags, filters):
/// the kernel must not follow pointers held in `value`.
pub(crate) fn set<T>(
    sock: &impl AsFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: &T,
) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a valid descriptor (borrowed for the call), an option value
    // of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            level,
            opt,
            std::ptr::from_ref(value).cast(),
            libc::socklen_t::try_from(size_of::<T>()).unwrap_or(libc::socklen_t::MAX),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Has a listening TCP socket accept a connection only once its first
/// bytes have arrived, or about `after` its handshake (`TCP_DEFER_ACCEPT`:
/// 1 s exactly; longer times are rounded to when the kernel would send the
/// SYN-ACK again, 3 s, 7 s, 15 s...): the kernel drops the handshake's bare
/// last ACK until then, and a connection that sends nothing is accepted
/// when its client answers the SYN-ACK sent again at the end of that time.
pub(crate) fn defer_accept(listener: &impl AsFd, after: std::time::Duration) -> io::Result<()> {
    let secs = libc::c_int::try_from(after.as_secs().max(1)).unwrap_or(libc::c_int::MAX);
    set(listener, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, &secs)
}

/// Sets a socket buffer size past `net.core.[rw]mem_max` (`opt`:
/// `SO_RCVBUFFORCE` or `SO_SNDBUFFORCE`; needs `CAP_NET_ADMIN`). The
/// kernel doubles `bytes` for its own bookkeeping, as it does for
/// `SO_RCVBUF` and `SO_SNDBUF`.
pub(crate) fn force_buffer(
    sock: &impl AsFd,
    opt: libc::c_int,
    bytes: libc::c_int,
) -> io::Result<()> {
    set(sock, libc::SOL_SOCKET, opt, &bytes)
}

/// A socket's buffer: which of its two [`size_buffer`] sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buffer {
    Send,
    Receive,
}

/// Sizes `sock`'s `buffer` at `bytes`: past `net.core.[rw]mem_max` where
/// the caller may ([`force_buffer`]), up to it otherwise (`SO_SNDBUF`,
/// `SO_RCVBUF`, which the kernel caps). The error is the capped call's.
pub(crate) fn size_buffer(sock: &impl AsFd, buffer: Buffer, bytes: libc::c_int) -> io::Result<()> {
    let (force, capped) = match buffer {
        Buffer::Send => (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        Buffer::Receive => (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
    };
    force_buffer(sock, force, bytes).or_else(|_| set(sock, libc::SOL_SOCKET, capped, &bytes))
}

/// Bytes `sock` has queued and its peer has not yet read (`SIOCOUTQ`,
/// which Linux numbers as `TIOCOUTQ`; on a unix stream socket, the bytes
/// sent and not yet read).
pub(crate) fn queued(sock: &impl AsFd) -> io::Result<usize> {
    use std::os::fd::AsRawFd as _;
    let mut bytes: libc::c_int = 0;
    // SAFETY: a valid descriptor (borrowed for the call) and an int for
    // the kernel to write.
    let rc = unsafe { libc::ioctl(sock.as_fd().as_raw_fd(), libc::TIOCOUTQ, &raw mut bytes) };
    if rc == 0 {
        usize::try_from(bytes).map_err(|_| io::ErrorKind::InvalidData.into())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A TCP socket's `TCP_INFO`: what tests read of the segments it sent
/// and received.
#[cfg(test)]
pub(crate) fn tcp_info(sock: &impl AsFd) -> io::Result<libc::tcp_info> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: tcp_info is plain data; an all-zero value is valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(size_of::<libc::tcp_info>()).unwrap_or(0);
    // SAFETY: a valid descriptor (borrowed for the call); `info` is
    // writable for `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(info)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    /// `SO_SNDBUF` as the kernel reports it.
    fn send_buffer(sock: &UnixStream) -> usize {
        socket2::SockRef::from(sock)
            .send_buffer_size()
            .expect("SO_SNDBUF")
    }

    #[test]
    fn a_forced_buffer_passes_the_system_cap() {
        let (a, _b) = UnixStream::pair().expect("socket pair");
        let cap: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .expect("wmem_max")
            .trim()
            .parse()
            .expect("a number");
        // Past the cap, and well below the kernel's own bound (INT_MAX / 2).
        let want = cap.saturating_mul(2).clamp(4 << 20, 1 << 28);
        // A host whose cap is 256 MiB or more leaves nothing to force.
        if want <= cap {
            return;
        }
        match force_buffer(
            &a,
            libc::SO_SNDBUFFORCE,
            libc::c_int::try_from(want).expect("fits"),
        ) {
            // The kernel doubles what it is given.
            Ok(()) => assert_eq!(send_buffer(&a), want * 2),
            // Without CAP_NET_ADMIN the kernel says so, and nothing changed.
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
                assert!(send_buffer(&a) <= cap * 2);
            }
        }
    }

    #[test]
    fn each_buffer_is_sized_with_or_without_the_right_to_pass_the_cap() {
        let (a, _b) = UnixStream::pair().expect("socket pair");
        // Below any cap: the same size whether forced or not.
        size_buffer(&a, Buffer::Send, 96 << 10).expect("send buffer");
        size_buffer(&a, Buffer::Receive, 80 << 10).expect("receive buffer");
        let sock = socket2::SockRef::from(&a);
        assert_eq!(sock.send_buffer_size().expect("SO_SNDBUF"), 192 << 10);
        assert_eq!(sock.recv_buffer_size().expect("SO_RCVBUF"), 160 << 10);
    }

    #[test]
    fn a_bad_option_is_the_kernels_error() {
        let (a, _b) = UnixStream::pair().expect("socket pair");
        let e = set(&a, libc::SOL_SOCKET, -1, &1 as &libc::c_int).expect_err("no option -1");
        assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}");
    }

    #[test]
    fn queued_bytes_are_those_the_peer_has_not_read() {
        use std::io::{Read as _, Write as _};
        let (mut a, mut b) = UnixStream::pair().expect("socket pair");
        assert_eq!(queued(&a).expect("SIOCOUTQ"), 0);
        a.write_all(&[7; 1000]).expect("write");
        let before = queued(&a).expect("SIOCOUTQ");
        assert!(before >= 1000, "{before}");
        let mut got = [0; 1000];
        b.read_exact(&mut got).expect("read");
        assert_eq!(queued(&a).expect("SIOCOUTQ"), 0);
    }
}
