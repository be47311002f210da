//! Network namespaces: named ones under `/run/netns` (the `ip netns`
//! convention, so operators can inspect them with the usual tools), and
//! running code inside one.
//!
//! `setns(2)` and `unshare(2)` with `CLONE_NEWNET` change the namespace of
//! the calling *thread* only, so every piece of namespace work runs on a
//! dedicated OS thread that is joined before returning; the caller's threads
//! (and the tokio runtime) never change namespace.

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    thread,
};

use nix::{
    mount::{MntFlags, MsFlags, mount, umount2},
    sched::{CloneFlags, setns, unshare},
};

/// Directory holding named namespaces (as `ip netns` does).
pub const NETNS_RUN_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace name {name:?} is invalid (1-64 chars of [A-Za-z0-9_.-])")]
    InvalidName { name: String },
    #[error("network namespace {name:?} already exists at {path}")]
    Exists { name: String, path: PathBuf },
    #[error("opening network namespace {path}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{call} for network namespace {path}")]
    Syscall {
        call: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("the thread working in network namespace {path} panicked")]
    ThreadPanicked { path: PathBuf },
}

/// A network namespace identified by a path to its nsfs file
/// (`/run/netns/NAME`, `/proc/PID/ns/net`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Netns {
    path: PathBuf,
}

impl Netns {
    /// The namespace at an arbitrary nsfs path.
    #[must_use]
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// `/run/netns/NAME`; the name is validated, the namespace need not exist.
    pub fn named(name: &str) -> Result<Self, NetnsError> {
        validate_name(name)?;
        Ok(Self::at(Path::new(NETNS_RUN_DIR).join(name)))
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    #[must_use]
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// Device and inode of the namespace as `stat(2)` sees them through
    /// its path (for a named namespace, the nsfs file bind-mounted there),
    /// or `None` when there is nothing at the path.
    pub fn identity(&self) -> Result<Option<(u64, u64)>, NetnsError> {
        use std::os::unix::fs::MetadataExt as _;
        match fs::metadata(&self.path) {
            Ok(m) => Ok(Some((m.dev(), m.ino()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(NetnsError::Io {
                op: "examining",
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Creates the named namespace `/run/netns/NAME` with a fresh network
    /// stack (only `lo`, down). Fails if it already exists.
    pub fn create(name: &str) -> Result<Self, NetnsError> {
        let ns = Self::named(name)?;
        let io = |op, path: &Path| {
            let path = path.to_owned();
            move |source| NetnsError::Io { op, path, source }
        };
        fs::create_dir_all(NETNS_RUN_DIR).map_err(io("creating", Path::new(NETNS_RUN_DIR)))?;
        match File::create_new(&ns.path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(NetnsError::Exists {
                    name: name.to_owned(),
                    path: ns.path,
                });
            }
            Err(e) => return Err(io("creating", &ns.path)(e)),
        }
        let target = ns.path.clone();
        let made = thread::spawn(move || -> Result<(), NetnsError> {
            let fail = |call| {
                let path = target.clone();
                move |source| NetnsError::Syscall { call, path, source }
            };
            unshare(CloneFlags::CLONE_NEWNET).map_err(fail("unshare(CLONE_NEWNET)"))?;
            mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(fail("bind mount"))
        })
        .join()
        .unwrap_or_else(|_| {
            Err(NetnsError::ThreadPanicked {
                path: ns.path.clone(),
            })
        });
        if let Err(e) = made {
            let _ = fs::remove_file(&ns.path);
            return Err(e);
        }
        Ok(ns)
    }

    /// Removes a named namespace. Its interfaces are destroyed by the kernel
    /// once nothing else holds the namespace. Removing one that does not
    /// exist is not an error.
    pub fn delete(&self) -> Result<(), NetnsError> {
        if !self.path.exists() {
            return Ok(());
        }
        match umount2(&self.path, MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::Error::EINVAL) => {}
            Err(source) => {
                return Err(NetnsError::Syscall {
                    call: "umount2",
                    path: self.path.clone(),
                    source,
                });
            }
        }
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(NetnsError::Io {
                op: "removing",
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// The namespace's cookie (`SO_NETNS_COOKIE` of a socket made inside
    /// it): unlike the nsfs inode, never given to another namespace while
    /// the kernel runs. `None` on kernels without it (before 5.14).
    pub fn cookie(&self) -> Result<Option<u64>, NetnsError> {
        use std::os::fd::AsRawFd as _;

        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
        let fail = |call| {
            let path = self.path.clone();
            move |source| NetnsError::Syscall { call, path, source }
        };
        self.run(|| {
            let fd = socket(
                AddressFamily::Unix,
                SockType::Datagram,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .map_err(fail("socket"))?;
            let mut cookie = 0u64;
            let mut len = libc::socklen_t::try_from(size_of::<u64>()).unwrap_or(8);
            // SAFETY: `cookie` and `len` are valid for writes of the sizes
            // given; the descriptor is open for the call's duration.
            let rc = unsafe {
                libc::getsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_NETNS_COOKIE,
                    (&raw mut cookie).cast(),
                    &raw mut len,
                )
            };
            match nix::Error::result(rc) {
                Ok(_) => Ok(Some(cookie)),
                Err(nix::Error::ENOPROTOOPT) => Ok(None),
                Err(e) => Err(fail("getsockopt(SO_NETNS_COOKIE)")(e)),
            }
        })?
    }

    /// Opens the namespace file (for `IFLA_NET_NS_FD` and the like).
    pub fn open(&self) -> Result<File, NetnsError> {
        File::open(&self.path).map_err(|source| NetnsError::Open {
            path: self.path.clone(),
            source,
        })
    }

    /// Runs `f` on a new OS thread that has entered this namespace, and
    /// returns its result. Panics in `f` are propagated.
    pub fn run<T, F>(&self, f: F) -> Result<T, NetnsError>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let file = self.open()?;
        thread::scope(|s| {
            s.spawn(|| {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Syscall {
                    call: "setns",
                    path: self.path.clone(),
                    source,
                })?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

/// Runs `f` in `netns` when one is given, else on the calling thread.
pub fn run_in<T, F>(netns: Option<&Netns>, f: F) -> Result<T, NetnsError>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    match netns {
        Some(ns) => ns.run(f),
        None => Ok(f()),
    }
}

fn validate_name(name: &str) -> Result<(), NetnsError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(NetnsError::InvalidName {
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for bad in ["", "a/b", "..", "x y", &"n".repeat(65)] {
            assert!(
                matches!(Netns::named(bad), Err(NetnsError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        let ns = Netns::named("health").expect("valid");
        assert_eq!(ns.path(), Path::new("/run/netns/health"));
    }
}
