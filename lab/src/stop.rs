//! Ctrl-C and SIGTERM for the lab's long-running commands. The first asks
//! the command to stop: its loops poll [`check`] (or [`requested`]) and
//! return, and what the run made (namespaces, bpffs pins, files) is
//! removed as it is dropped. One that comes a second or more after the
//! first ends the process at once, leaving them. A terminal's Ctrl-C
//! reaches the lab twice, from the terminal and passed on by `cargo
//! xtask`, milliseconds apart: that counts as one.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

static STOP: AtomicBool = AtomicBool::new(false);
/// When the first signal came, in ms of `CLOCK_MONOTONIC`.
static FIRST_MS: AtomicU64 = AtomicU64::new(0);
/// A signal this long after the first ends the process.
const SECOND_AFTER_MS: u64 = 1000;

/// `CLOCK_MONOTONIC` in ms, read in a way a signal handler may.
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1000
        + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000
}

extern "C" fn on_signal(_: libc::c_int) {
    let now = monotonic_ms();
    if !STOP.swap(true, Ordering::Relaxed) {
        FIRST_MS.store(now, Ordering::Relaxed);
    } else if now.saturating_sub(FIRST_MS.load(Ordering::Relaxed)) >= SECOND_AFTER_MS {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// Installs the lab's handler, for a command whose loops poll
/// [`requested`] or [`check`].
pub(crate) fn install() -> anyhow::Result<()> {
    install_with(on_signal)
}

/// Installs `on_signal` for SIGINT and SIGTERM: a handler that only
/// stores to atomics (or exits).
pub(crate) fn install_with(on_signal: extern "C" fn(libc::c_int)) -> anyhow::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handlers given only store to atomics or exit.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}

/// Whether Ctrl-C or SIGTERM came.
pub(crate) fn requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// An error once Ctrl-C or SIGTERM came, so that `?` unwinds the run and
/// drops what it made.
pub(crate) fn check() -> anyhow::Result<()> {
    if requested() {
        anyhow::bail!("interrupted: stopping and removing what the run made");
    }
    Ok(())
}

/// Sleeps `d`, or less when Ctrl-C or SIGTERM comes (then the error of
/// [`check`]).
pub(crate) fn sleep(d: Duration) -> anyhow::Result<()> {
    const SLICE: Duration = Duration::from_millis(100);
    let end = std::time::Instant::now() + d;
    loop {
        check()?;
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(SLICE));
    }
}
