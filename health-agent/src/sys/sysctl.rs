//! Sysctls the agent sets for as long as it runs, and restores after.

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
