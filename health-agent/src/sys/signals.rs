//! The signals that end the agent. Installed before the agent creates
//! anything, so a SIGTERM at any moment of the start-up is a clean stop
//! rather than the default action (death, leaving everything behind).

use tokio::signal::unix::{Signal, SignalKind, signal};

use nix::sys::signal::{SigSet, SigmaskHow, Signal as Sig, pthread_sigmask};

fn stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Sig::SIGINT);
    set.add(Sig::SIGTERM);
    set
}

/// Holds SIGINT and SIGTERM pending (blocked) on the calling thread and the
/// threads it starts from now on, so that one arriving before [`Signals`]
/// is installed is not the default action (death, leaving whatever was made
/// behind) but a stop once it is. Call it first thing in `main`.
pub fn hold_until_installed() -> std::io::Result<()> {
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&stop_signals()), None)
        .map_err(std::io::Error::from)
}

/// SIGINT and SIGTERM, caught from the moment this is made.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Needs a tokio runtime. Releases the signals held by
    /// [`hold_until_installed`] on this thread: one that came meanwhile is
    /// delivered now, to these handlers.
    pub fn install() -> std::io::Result<Self> {
        let me = Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        };
        pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&stop_signals()), None)
            .map_err(std::io::Error::from)?;
        Ok(me)
    }

    /// Resolves with the signal's name on the next SIGINT or SIGTERM.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Resolves with the signal's name on SIGINT or SIGTERM.
pub async fn wait_for_shutdown() -> std::io::Result<&'static str> {
    Ok(Signals::install()?.recv().await)
}
