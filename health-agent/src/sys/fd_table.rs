//! The process's file-descriptor table, grown once to the size a round
//! needs instead of doubling under load.
//!
//! The kernel grows a process's descriptor table by doubling it when a new
//! descriptor does not fit. In a process with more than one thread, each
//! growth waits for an RCU grace period, and every thread that opens a
//! descriptor meanwhile (the API accepting a connection, the socket thread
//! making probe sockets) waits with it. A first round at 5,000 peers opens
//! 10,000 sockets: six doublings, each a stall of several milliseconds.
//! Asking for a descriptor at the size needed grows the table in one step.
//! The table never shrinks, so this is done once per size. On this
//! machine kind, in a process of two threads, 19,000 sockets took 138 ms
//! to make as the table doubled, and 65 ms after one step of 11-13 ms.

use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicUsize, Ordering},
};

use nix::fcntl::{FcntlArg, fcntl};

/// The table size reserved so far (descriptors), shared by every caller.
static RESERVED: AtomicUsize = AtomicUsize::new(0);

/// Grows the table to hold descriptors `0..want` (at most the open-file
/// limit), in one step; a table already that large is left alone. Returns
/// the size now reserved.
pub fn reserve(want: usize) -> io::Result<usize> {
    let limit = open_file_limit()?;
    let want = want.min(limit);
    if want <= RESERVED.load(Ordering::Relaxed) || want == 0 {
        return Ok(RESERVED.load(Ordering::Relaxed));
    }
    // A descriptor numbered `want - 1` or above: the kernel grows the
    // table to hold it (rounded up to its own sizes), then it is closed.
    let probe = std::fs::File::open("/dev/null")?;
    let target = libc::c_int::try_from(want - 1).unwrap_or(libc::c_int::MAX);
    let high = fcntl(&probe, FcntlArg::F_DUPFD_CLOEXEC(target)).map_err(io::Error::from)?;
    // SAFETY: `high` was just returned by fcntl and is owned by no one else.
    drop(unsafe { OwnedFd::from_raw_fd(high) });
    RESERVED.fetch_max(want, Ordering::Relaxed);
    Ok(want)
}

/// The soft open-file limit in force.
fn open_file_limit() -> io::Result<usize> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_err(io::Error::from)?;
    Ok(usize::try_from(soft).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots of this process's descriptor table (`FDSize`).
    fn table_size() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .expect("status")
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("FDSize")
    }

    #[test]
    fn the_table_grows_to_the_size_asked_for_in_one_step_and_nothing_stays_open() {
        // Descriptors from `want - 1` on, where the one that grows the
        // table is made: the other tests of this process open and close
        // lower ones meanwhile.
        let high_open = |from: usize| {
            std::fs::read_dir("/proc/self/fd")
                .expect("fds")
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<usize>().ok())
                .filter(|&fd| fd >= from)
                .count()
        };
        let from = table_size();
        let want = (from * 4).min(open_file_limit().expect("limit"));
        assert!(reserve(want).expect("reserve") >= want);
        assert!(table_size() >= want, "FDSize {} < {want}", table_size());
        // The descriptor that grew the table is closed again.
        assert_eq!(
            high_open(want - 1),
            0,
            "a descriptor at or above {} stays open",
            want - 1
        );
        // Asking for less opens nothing and keeps the size reserved.
        assert!(reserve(16).expect("reserve again") >= want);
    }
}
