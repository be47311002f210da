//! A packet sender that is not the bottleneck: one prebuilt frame sent over
//! an `AF_PACKET` socket with `sendmmsg`, bypassing the qdisc, from as many
//! threads as asked.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use health_agent::sys::netns::Netns;

const BATCH: usize = 64;

/// Sends `frame` out of interface `ifindex` (in `ns`) from `threads` threads
/// for `duration`; returns how many frames the kernel accepted.
pub(crate) fn blast(
    ns: &Netns,
    ifindex: u32,
    frame: &[u8],
    threads: usize,
    duration: Duration,
) -> io::Result<u64> {
    let results: Vec<io::Result<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    ns.run(|| send_for(ifindex, frame, duration))
                        .map_err(io::Error::other)?
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.into_iter().sum()
}

fn packet_socket(ifindex: u32) -> io::Result<OwnedFd> {
    // Protocol 0: this socket only sends, it never receives a copy of traffic.
    // SAFETY: plain syscall; the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed sockaddr_ll is valid; the fields are set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = i32::try_from(ifindex).map_err(io::Error::other)?;
    // SAFETY: addr is a valid sockaddr_ll of the given size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let one: libc::c_int = 1;
    // SAFETY: valid option pointer and length.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn send_for(ifindex: u32, frame: &[u8], duration: Duration) -> io::Result<u64> {
    let fd = packet_socket(ifindex)?;
    let mut iov = libc::iovec {
        iov_base: frame.as_ptr().cast_mut().cast(),
        iov_len: frame.len(),
    };
    // SAFETY: an all-zero mmsghdr is valid; each points at the one iovec.
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH)
        .map(|_| {
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &raw mut iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let deadline = Instant::now() + duration;
    let mut sent = 0u64;
    while Instant::now() < deadline && !crate::stop::requested() {
        // SAFETY: msgs holds BATCH valid headers pointing at live buffers.
        let n = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), BATCH as u32, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOBUFS) {
                continue;
            }
            return Err(e);
        }
        sent += u64::from(n.unsigned_abs());
    }
    Ok(sent)
}
