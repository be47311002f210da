//! Which boot this is: the kernel's boot ID, and when the boot began.
//!
//! What the agent records about kernel objects (interface indexes, nsfs
//! inodes, namespace cookies, sysctl values) holds for one boot only: the
//! kernel starts those counters over, and a node booting the same way
//! hands the same numbers to whoever asks first.

use std::{
    fs, io,
    time::{Duration, SystemTime},
};

/// Where the kernel says which boot this is.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot: its ID, and the wall-clock time it began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThisBoot {
    pub id: String,
    /// Now less the time since boot (`CLOCK_BOOTTIME`, suspends
    /// included), on the wall clock as it reads now.
    pub began: SystemTime,
}

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("reading the boot ID from {BOOT_ID}")]
    Id(#[source] io::Error),
    #[error("{BOOT_ID} holds no boot ID")]
    Empty,
    #[error("reading CLOCK_BOOTTIME")]
    Clock(#[source] nix::Error),
}

impl ThisBoot {
    pub fn read() -> Result<Self, BootError> {
        let id = id().map_err(BootError::Id)?;
        if id.is_empty() {
            return Err(BootError::Empty);
        }
        let since = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .map_err(BootError::Clock)?;
        let since = Duration::from(since);
        let now = SystemTime::now();
        Ok(Self {
            id,
            began: now.checked_sub(since).unwrap_or(SystemTime::UNIX_EPOCH),
        })
    }
}

/// This boot's ID (empty when the kernel has none to give).
pub fn id() -> io::Result<String> {
    Ok(fs::read_to_string(BOOT_ID)?.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_boot_has_an_id_and_began_before_now() {
        let boot = ThisBoot::read().expect("the boot");
        assert_eq!(boot.id.len(), 36, "a UUID: {:?}", boot.id);
        assert_eq!(ThisBoot::read().expect("again").id, boot.id, "stable");
        assert!(boot.began < SystemTime::now());
        // No process here outlives its boot by as much as that boot
        // lasted: the start is past, and not the epoch.
        assert!(boot.began > SystemTime::UNIX_EPOCH + Duration::from_hours(24));
    }
}
