//! Ctrl-C and SIGTERM for the lab's commands. The first asks the command
//! to stop: its loops poll [`check`] (or [`requested`]) and return, and
//! what the run made (namespaces, bpffs pins, files) is removed as it is
//! dropped. A second one ends the process at once, leaving them.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    if STOP.swap(true, Ordering::Relaxed) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// Installs the lab's handler: the first signal sets the flag
/// [`requested`] reads.
pub(crate) fn install() -> anyhow::Result<()> {
    install_with(on_signal)
}

/// Installs `on_signal` for SIGINT and SIGTERM: a handler that only
/// stores to an atomic (or exits).
pub(crate) fn install_with(on_signal: extern "C" fn(libc::c_int)) -> anyhow::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handlers given only store to an atomic or exit.
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
