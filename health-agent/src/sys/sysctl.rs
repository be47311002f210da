//! Sysctls the agent sets for as long as it runs, and restores after; and
//! the ones it reads (the ephemeral port range).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use tracing::{info, warn};

use crate::sys::{
    boot,
    netns::{Netns, NetnsError, run_in},
};

/// A sysctl set by the agent; dropping it writes the value it had back
/// (when the agent changed it, and the value is still the agent's), and
/// forgets the record of that value.
#[derive(Debug)]
pub struct Sysctl {
    path: PathBuf,
    /// What the agent set.
    value: String,
    previous: Option<String>,
    /// Where the value it had is recorded until it is written back.
    record: Option<PathBuf>,
    /// Dropping leaves the value and its record ([`Sysctl::kept_on_drop`]).
    kept: bool,
}

/// The longest value a record may hold: sysctls the agent sets are
/// small integers.
const RECORD_MAX: usize = 20;

impl Sysctl {
    /// Sets `/proc/sys/<name>` to `value` (`name` with slashes, e.g.
    /// `net/ipv4/ip_forward`), remembering what it was. That value is
    /// recorded in `record_dir`, with the boot, until it is written back:
    /// an agent killed before it could write it back, or one that kept the
    /// endpoint (and so the setting), leaves the record, and the next
    /// agent of the same boot writes back the value recorded, not the one
    /// it found (its predecessor's). After a reboot the record is stale:
    /// the node set its sysctls anew.
    pub fn set(name: &str, value: &str, record_dir: &Path) -> io::Result<Self> {
        let record = record_dir.join(format!("sysctl-{}", name.replace('/', ".")));
        let boot = boot::id().unwrap_or_default();
        Self::set_at(PathBuf::from("/proc/sys").join(name), value, record, &boot)
    }

    /// For a sysctl this agent does not set (its setting is off this run):
    /// writes back the value an earlier agent of this boot recorded for
    /// `/proc/sys/<name>` (killed, or keeping the endpoint that needed it),
    /// when the sysctl still holds `value`, what the agent sets; then
    /// forgets the record. Without a record of this boot, nothing changes.
    pub fn restore_recorded(name: &str, value: &str, record_dir: &Path) {
        let record = record_dir.join(format!("sysctl-{}", name.replace('/', ".")));
        let boot = boot::id().unwrap_or_default();
        Self::restore_at(
            &PathBuf::from("/proc/sys").join(name),
            value,
            &record,
            &boot,
        );
    }

    fn restore_at(path: &Path, value: &str, record: &Path, boot: &str) {
        if !record.exists() {
            return;
        }
        if let Some(recorded) = read_record(record, boot) {
            drop(Self {
                path: path.to_owned(),
                value: value.to_owned(),
                previous: Some(recorded),
                record: Some(record.to_owned()),
                kept: false,
            });
        } else {
            // Another boot's, or not a value: nothing to write back.
            forget(record);
        }
    }

    fn set_at(path: PathBuf, value: &str, record: PathBuf, boot: &str) -> io::Result<Self> {
        let found = fs::read_to_string(&path)?.trim().to_owned();
        let recorded = read_record(&record, boot);
        let original = recorded.clone().unwrap_or_else(|| found.clone());
        if original == value {
            forget(&record);
            return Ok(Self {
                path,
                value: value.to_owned(),
                previous: None,
                record: None,
                kept: false,
            });
        }
        if recorded.is_none()
            && let Err(e) = write_record(&record, &original, boot)
        {
            warn!(record = %record.display(), "recording {original} before changing {}: {e}; \
                an agent killed before it writes it back leaves the change", path.display());
        }
        if found != value {
            fs::write(&path, value)?;
        }
        info!(sysctl = %path.display(), from = %original, to = value, "set for as long as the agent runs");
        Ok(Self {
            path,
            value: value.to_owned(),
            previous: Some(original),
            record: Some(record),
            kept: false,
        })
    }

    /// Dropping leaves the value set and its record for the next agent of
    /// this boot: for a setting that something the agent keeps after it
    /// stops needs, whether the task holding it ends or is dropped at any
    /// point (aborted at a deadline).
    #[must_use]
    pub fn kept_on_drop(mut self) -> Self {
        self.kept = true;
        self
    }
}

/// The value recorded at `record` in this boot (`boot`), when it holds
/// one: a record of another boot, or one that is not a small integer, is
/// ignored (the latter with a warning).
fn read_record(record: &Path, boot: &str) -> Option<String> {
    let text = fs::read_to_string(record).ok()?;
    let mut words = text.split_whitespace();
    let (v, of) = (words.next().unwrap_or_default(), words.next());
    if v.is_empty() || v.len() > RECORD_MAX || !v.bytes().all(|b| b.is_ascii_digit()) {
        warn!(record = %record.display(), "ignored: not a sysctl value the agent records");
        return None;
    }
    (of == Some(boot)).then(|| v.to_owned())
}

/// Writes `value` of boot `boot` to `record` whole (a temporary file
/// renamed over it).
fn write_record(record: &Path, value: &str, boot: &str) -> io::Result<()> {
    if let Some(dir) = record.parent() {
        fs::create_dir_all(dir)?;
    }
    let tmp = record.with_extension("tmp");
    {
        use io::Write as _;
        let mut f = super::private_path::create(&tmp)?;
        f.write_all(format!("{value} {boot}\n").as_bytes())?;
    }
    fs::rename(&tmp, record)
}

fn forget(record: &Path) {
    if let Err(e) = fs::remove_file(record)
        && e.kind() != io::ErrorKind::NotFound
    {
        warn!(record = %record.display(), "removing: {e}");
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let Some(v) = self.previous.as_ref().filter(|_| !self.kept) else {
            return;
        };
        let now = fs::read_to_string(&self.path).unwrap_or_default();
        if now.trim() != self.value {
            // Someone set it since: theirs stays.
            info!(sysctl = %self.path.display(), now = now.trim(), "changed by someone else since; left as it is");
        } else if let Err(e) = fs::write(&self.path, v) {
            // The record stays: the next agent writes it back.
            warn!(sysctl = %self.path.display(), "restoring {v}: {e}");
            return;
        } else {
            info!(sysctl = %self.path.display(), to = %v, "restored");
        }
        if let Some(record) = &self.record {
            forget(record);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a `/proc/sys` file and the agent's state directory.
    fn files(test: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sysctl-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("dir");
        let sysctl = dir.join("ip_forward");
        fs::write(&sysctl, "0\n").expect("sysctl");
        (
            dir.clone(),
            sysctl,
            dir.join("state").join("sysctl-net.ipv4.ip_forward"),
        )
    }

    fn read(p: &Path) -> String {
        fs::read_to_string(p).expect("read").trim().to_owned()
    }

    #[test]
    fn a_value_changed_is_written_back_and_its_record_forgotten() {
        let (dir, sysctl, record) = files("back");
        let set = Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set");
        assert_eq!((read(&sysctl), read(&record)), ("1".into(), "0 b1".into()));
        drop(set);
        assert_eq!(read(&sysctl), "0");
        assert!(!record.exists());
        // Already as wanted: nothing changed, nothing recorded.
        fs::write(&sysctl, "1").expect("write");
        drop(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set"));
        assert_eq!(read(&sysctl), "1");
        assert!(!record.exists());
        let _ = fs::remove_dir_all(dir);
    }

    /// An agent killed (or keeping the endpoint) leaves the value set and
    /// its record: the next one writes back the value recorded, not the
    /// one it found. Before, it took the agent's own 1 for the node's.
    #[test]
    fn the_next_agent_writes_back_what_a_killed_one_recorded() {
        let (dir, sysctl, record) = files("killed");
        std::mem::forget(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set"));
        assert_eq!(read(&sysctl), "1");
        let next = Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set");
        assert_eq!(read(&record), "0 b1", "kept while set");
        drop(next);
        assert_eq!(read(&sysctl), "0");
        assert!(!record.exists());
        let _ = fs::remove_dir_all(dir);
    }

    /// Kept on drop: the value and its record stay for the next agent,
    /// which writes back the value recorded.
    #[test]
    fn a_setting_kept_on_drop_stays_for_the_next_agent() {
        let (dir, sysctl, record) = files("kept");
        let set = Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set");
        drop(set.kept_on_drop());
        assert_eq!((read(&sysctl), read(&record)), ("1".into(), "0 b1".into()));
        drop(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set"));
        assert_eq!(read(&sysctl), "0");
        assert!(!record.exists());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn a_record_that_is_not_a_value_is_ignored() {
        let (dir, sysctl, record) = files("garbage");
        fs::create_dir_all(record.parent().expect("dir")).expect("dir");
        for garbage in [
            "",
            "yes b1",
            "1; rm -rf / b1",
            &format!("{} b1", "9".repeat(40)),
        ] {
            fs::write(&record, garbage).expect("record");
            fs::write(&sysctl, "0").expect("sysctl");
            let set = Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set");
            assert_eq!(
                read(&record),
                "0 b1",
                "{garbage:?}: the value found recorded"
            );
            drop(set);
            assert_eq!(read(&sysctl), "0", "{garbage:?}");
        }
        let _ = fs::remove_dir_all(dir);
    }

    /// A record of another boot is stale (the node set its sysctls anew
    /// at boot): the value found is the node's.
    #[test]
    fn a_record_of_another_boot_is_not_believed() {
        let (dir, sysctl, record) = files("reboot");
        std::mem::forget(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set"));
        // Rebooted: the node itself turned forwarding on.
        drop(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b2").expect("set"));
        assert_eq!(read(&sysctl), "1", "the node's own 1 stays");
        assert!(!record.exists());
        let _ = fs::remove_dir_all(dir);
    }

    /// A value someone else set while the agent ran is theirs: left.
    #[test]
    fn a_value_changed_by_someone_else_is_left() {
        let (dir, sysctl, record) = files("theirs");
        let set = Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set");
        fs::write(&sysctl, "2").expect("someone else");
        drop(set);
        assert_eq!(read(&sysctl), "2");
        assert!(!record.exists());
        let _ = fs::remove_dir_all(dir);
    }

    /// An earlier agent of this boot set the sysctl and left its record;
    /// this one does not set it: the value recorded is written back, unless
    /// someone changed it since, and the record goes either way.
    #[test]
    fn a_sysctl_set_no_more_is_written_back_from_its_record() {
        let (dir, sysctl, record) = files("unused");
        std::mem::forget(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set"));
        Sysctl::restore_at(&sysctl, "1", &record, "b1");
        assert_eq!(read(&sysctl), "0", "written back");
        assert!(!record.exists());
        // Changed by someone since: theirs stays.
        std::mem::forget(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set"));
        fs::write(&sysctl, "2").expect("someone else");
        Sysctl::restore_at(&sysctl, "1", &record, "b1");
        assert_eq!(read(&sysctl), "2");
        assert!(!record.exists());
        // Another boot's record: the node's value stays.
        fs::write(&sysctl, "0").expect("sysctl");
        std::mem::forget(Sysctl::set_at(sysctl.clone(), "1", record.clone(), "b1").expect("set"));
        Sysctl::restore_at(&sysctl, "1", &record, "b2");
        assert_eq!(read(&sysctl), "1");
        assert!(!record.exists());
        // No record: nothing happens.
        Sysctl::restore_at(&sysctl, "1", &record, "b2");
        assert_eq!(read(&sysctl), "1");
        let _ = fs::remove_dir_all(dir);
    }
}
