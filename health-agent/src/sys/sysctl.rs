//! Sysctls the agent sets for as long as it runs, and restores after.

use std::{fs, io, path::PathBuf};

use tracing::{info, warn};

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
