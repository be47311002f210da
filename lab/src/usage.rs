//! A process's use of the machine, read from `/proc` (the agent's, the
//! lab's own, etcd's): CPU time in user space and in the kernel, and the
//! resident set.

use std::time::Duration;

use anyhow::Context as _;

/// CPU time (user + system) of `pid`, its resident set now and the peak of
/// its resident set since the last call (`VmHWM`, reset after reading by
/// writing 5 to `clear_refs`): what a round allocates and frees between two
/// samples counts in the peak, not in the resident set at its end.
pub(crate) fn usage(pid: u32) -> anyhow::Result<(Duration, Rss)> {
    let (user, system) = cpu_times(pid)?;
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let rss = Rss {
        now_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
        file_kib: field("RssFile:"),
    };
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .context("resetting the agent's peak RSS (clear_refs)")?;
    Ok((user + system, rss))
}

/// The soft open-file limit of `pid` (`Max open files` in its `limits`);
/// `None` when unlimited.
pub(crate) fn open_file_limit(pid: u32) -> anyhow::Result<Option<u64>> {
    let path = format!("/proc/{pid}/limits");
    let limits = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("no open-file limit in {path}"))?;
    Ok(soft.parse().ok())
}

/// The CPU time of `pid` (a process or a kernel thread) so far, in user
/// space and in the kernel (for the agent on the round bench's topology,
/// much of the latter the simulated network's work in its context).
pub(crate) fn cpu_times(pid: u32) -> anyhow::Result<(Duration, Duration)> {
    stat_cpu(&format!("/proc/{pid}/stat"))
}

/// User and system time from a `stat` file of `/proc` (a process's, or
/// one thread's under `task/`).
pub(crate) fn stat_cpu(path: &str) -> anyhow::Result<(Duration, Duration)> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    // After the command's closing parenthesis: utime is the 12th field
    // and stime the 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
    let hz = u64::try_from(nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100))
        .unwrap_or(100)
        .max(1);
    let time = |t: u64| Duration::from_millis(t * 1000 / hz);
    Ok((time(ticks(11)), time(ticks(12))))
}

/// The resident set when sampled and its peak since the sample before.
#[derive(Clone, Copy)]
#[expect(
    clippy::struct_field_names,
    reason = "each in KiB, as /proc/PID/status gives them"
)]
pub(crate) struct Rss {
    pub(crate) now_kib: u64,
    pub(crate) peak_kib: u64,
    /// Of `now_kib`, pages of files (the binary's code and the libraries):
    /// the rest is the heap, the stacks and the maps' memory.
    pub(crate) file_kib: u64,
}
