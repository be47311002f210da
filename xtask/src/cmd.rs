//! Running commands, echoing each so long tasks show progress.

use std::{
    path::Path,
    process::{Command, Output},
};

use anyhow::{Context as _, bail};

/// Prints and runs `cmd`; a non-zero exit is an error naming the command.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: $ {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", display(cmd));
    }
    Ok(())
}

/// The last SIGINT/SIGTERM xtask received while a child ran (0: none).
static RECEIVED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Whether a SIGINT/SIGTERM was passed on to a child since xtask started.
static PASSED_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn record_signal(sig: libc::c_int) {
    RECEIVED.store(sig, std::sync::atomic::Ordering::Relaxed);
}

/// Whether xtask was asked to stop (SIGINT, SIGTERM) while a child ran.
pub(crate) fn interrupted() -> bool {
    PASSED_ON.load(std::sync::atomic::Ordering::Relaxed)
}

/// Prints and runs `cmd` as `run` does, but SIGINT and SIGTERM sent to
/// xtask are passed on to the child, and xtask returns only once the child
/// has exited: a Ctrl-C or `timeout -s INT` never leaves a child tearing
/// down (or still running) after the prompt is back.
pub(crate) fn run_forwarding_signals(cmd: &mut Command) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    eprintln!("xtask: $ {}", display(cmd));
    // Installed before the child starts, so that no signal in between
    // ends xtask and leaves the child without its parent (the child's
    // exec resets its own handlers to the default).
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; sigaction with a zeroed mask and flags is valid.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = (record_signal as extern "C" fn(libc::c_int)) as usize;
        for sig in [libc::SIGINT, libc::SIGTERM] {
            libc::sigaction(sig, &raw const action, std::ptr::null_mut());
        }
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", display(cmd)))?;
    // Streams the caller piped are copied through: the child writes to a
    // pipe, never to our own stdout, which it could reopen and truncate.
    let copiers = [
        child.stdout.take().map(|mut s| {
            std::thread::spawn(move || drop(std::io::copy(&mut s, &mut std::io::stdout())))
        }),
        child.stderr.take().map(|mut s| {
            std::thread::spawn(move || drop(std::io::copy(&mut s, &mut std::io::stderr())))
        }),
    ];
    let pid = libc::pid_t::try_from(child.id()).context("child pid")?;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the child")? {
            break status;
        }
        let sig = RECEIVED.swap(0, Ordering::Relaxed);
        if sig != 0 {
            PASSED_ON.store(true, Ordering::Relaxed);
            eprintln!("xtask: passing signal {sig} on to the child and waiting for it to stop");
            // SAFETY: kill with the child's pid and a valid signal number.
            unsafe { libc::kill(pid, sig) };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    for copier in copiers.into_iter().flatten() {
        let _ = copier.join();
    }
    if !status.success() {
        return Err(Exited {
            cmd: display(cmd),
            status,
        }
        .into());
    }
    Ok(())
}

/// A child that ran and exited unsuccessfully: its command line and status,
/// for callers that tell one exit code from another.
#[derive(Debug)]
pub(crate) struct Exited {
    pub(crate) cmd: String,
    pub(crate) status: std::process::ExitStatus,
}

impl std::fmt::Display for Exited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` failed ({})", self.cmd, self.status)
    }
}

impl std::error::Error for Exited {}

/// Runs `cmd` quietly and returns its output (exit status not checked).
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<Output> {
    cmd.output()
        .with_context(|| format!("starting {}", display(cmd)))
}

/// `cargo ARGS` in the workspace root, with the cargo that runs xtask.
pub(crate) fn cargo(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).current_dir(root).args(args))
}

pub(crate) fn require_root(why: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("run as root: {why}");
    }
    Ok(())
}

fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_to_xtask_reaches_the_child_and_xtask_waits_for_its_teardown() {
        let dir = std::env::temp_dir().join(format!("xtask-sig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let done = dir.join("torn-down");
        // A child that tears down slowly on SIGINT, as the demo does.
        let script = format!(
            "trap 'sleep 0.3; echo ok > {}; exit 0' INT; while :; do sleep 0.05; done",
            done.display()
        );
        let me = libc::pid_t::try_from(std::process::id()).expect("pid");
        let sender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            // SAFETY: a signal to this process, whose handler (installed by
            // run_forwarding_signals) only records it.
            unsafe { libc::kill(me, libc::SIGINT) };
        });
        run_forwarding_signals(Command::new("sh").args(["-c", &script])).expect("child exits 0");
        sender.join().expect("sender");
        assert!(
            done.exists(),
            "xtask returned before the child's teardown had finished"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
