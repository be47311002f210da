//! Names unique to this process and call, so tests can run in parallel and a
//! leftover from a crashed run can be told from a live one.

use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace and pin directory the tests create.
pub const PREFIX: &str = "htest";

/// `htest-<pid>-<n>-<what>`.
#[must_use]
pub fn unique(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}{n}-{what}", of_pid(std::process::id()))
}

/// How every name [`unique`] gives in process `pid` starts:
/// `htest-<pid>-`.
#[must_use]
pub fn of_pid(pid: u32) -> String {
    format!("{PREFIX}-{pid}-")
}

/// The pid embedded by [`unique`] in `name`, if it has one.
#[must_use]
pub fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?
        .strip_prefix('-')?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// True when `name` was made by a test process that no longer runs.
#[must_use]
pub fn is_stale(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes namespaces under /run/netns left by test processes that died.
pub fn sweep_stale_netns() {
    let Ok(entries) = std::fs::read_dir(health_agent::sys::netns::NETNS_RUN_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(is_stale) {
            let _ = health_agent::sys::netns::Netns::at(entry.path()).delete();
        }
    }
}
