//! Ctrl-C and SIGTERM for the long-running lab commands (the local
//! cluster, the chaos suite): a handler that only stores to an atomic the
//! command polls, so that it stops and removes everything it made.

/// Installs `on_signal` for SIGINT and SIGTERM.
pub(crate) fn install(on_signal: extern "C" fn(libc::c_int)) -> anyhow::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handlers given only store to an atomic.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}
