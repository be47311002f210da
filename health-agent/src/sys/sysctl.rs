//! Sysctls the agent sets for as long as it runs, and restores after; and
//! the ones it reads (the ephemeral port range).

use std::{fs, io, path::PathBuf};

use tracing::{info, warn};

use crate::sys::netns::{Netns, NetnsError, run_in};

/// A sysctl set by the agent; dropping it writes the value it had back
/// (when the agent changed it).
#[derive(Debug)]
pub struct Sysctl {
    path: PathBuf,
    previous: Option<String>,
}

impl Sysctl {
    /// Sets `/proc/sys/<name>` to `value` (`name` with slashes, e.g.
    /// `net/ipv4/ip_forward`), remembering what it was.
    pub fn set(name: &str, value: &str) -> io::Result<Self> {
        let path = PathBuf::from("/proc/sys").join(name);
        let before = fs::read_to_string(&path)?.trim().to_owned();
        if before == value {
            return Ok(Self {
                path,
                previous: None,
            });
        }
        fs::write(&path, value)?;
        info!(sysctl = name, from = %before, to = value, "set for as long as the agent runs");
        Ok(Self {
            path,
            previous: Some(before),
        })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Some(v) = &self.previous {
            match fs::write(&self.path, v) {
                Ok(()) => info!(sysctl = %self.path.display(), to = %v, "restored"),
                Err(e) => warn!(sysctl = %self.path.display(), "restoring {v}: {e}"),
            }
        }
    }
}

/// Runs `f` with the integer sysctl `name` (slashes, read in the calling
/// thread's namespace) raised to at least `at_least`, and writes the
/// previous value back as soon as `f` returns: for limits the kernel reads
/// once, at a syscall, such as `net/core/somaxconn` at `listen()`. Other
/// sockets see the raised value only during that call. Where the sysctl
/// cannot be read or written (a read-only `/proc/sys`), `f` runs with the
/// value as it is, and a warning says so.
pub fn with_at_least<T>(name: &str, at_least: u64, f: impl FnOnce() -> T) -> T {
    let path = PathBuf::from("/proc/sys").join(name);
    let before = fs::read_to_string(&path)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    let raised = match before {
        Some(b) if b < at_least => match fs::write(&path, at_least.to_string()) {
            Ok(()) => Some(b),
            Err(e) => {
                warn!(
                    sysctl = name,
                    "raising {b} to {at_least}: {e}; the kernel caps at {b}"
                );
                None
            }
        },
        _ => None,
    };
    let out = f();
    if let Some(b) = raised
        && let Err(e) = fs::write(&path, b.to_string())
    {
        warn!(sysctl = name, "restoring {b}: {e}");
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    #[error("writing {value} to {path} in {netns}")]
    Write {
        path: String,
        value: String,
        netns: String,
        source: io::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// Writes `/proc/sys/<name>` (`name` with slashes) inside `netns` (the
/// calling thread's namespace when `None`). For settings of interfaces the
/// agent made (such as `net/ipv6/conf/lxc_health/accept_dad`): they go with
/// the interface, so nothing is restored.
pub fn write_in(netns: Option<&Netns>, name: &str, value: &str) -> Result<(), SysctlError> {
    let path = PathBuf::from("/proc/sys").join(name);
    run_in(netns, || fs::write(&path, value))?.map_err(|source| SysctlError::Write {
        path: path.display().to_string(),
        value: value.to_owned(),
        netns: netns.map_or_else(
            || "the agent's namespace".to_owned(),
            |n| n.path().display().to_string(),
        ),
        source,
    })
}

/// Where the kernel keeps `net.ipv4.ip_local_port_range`.
pub const LOCAL_PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// `net.ipv4.ip_local_port_range` of the calling thread's namespace: the
/// ports the kernel numbers connections from, (min, max).
pub fn local_port_range() -> io::Result<(u16, u16)> {
    let text = fs::read_to_string(LOCAL_PORT_RANGE)?;
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next()) {
        (Some(Ok(min)), Some(Ok(max))) => Ok((min, max)),
        _ => Err(io::Error::other(format!("unexpected content {text:?}"))),
    }
}
