//! The signals that end the agent, and SIGHUP, which makes it re-read its
//! configuration. Installed before the agent creates anything, so a SIGTERM
//! (or a SIGHUP) at any moment of the start-up is a clean stop (or a reload)
//! rather than the default action (death, leaving everything behind).

use tokio::signal::unix::{Signal, SignalKind, signal};

use nix::sys::signal::{SigSet, SigmaskHow, Signal as Sig, pthread_sigmask};

fn stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Sig::SIGINT);
    set.add(Sig::SIGTERM);
    set
}

fn hangup() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Sig::SIGHUP);
    set
}

/// Holds SIGINT, SIGTERM and SIGHUP pending (blocked) on the calling thread
/// and the threads it starts from now on, so that one arriving before
/// [`Signals`] (or [`Hangups`]) is installed is not the default action
/// (death, leaving whatever was made behind) but a stop (a reload) once it
/// is. Call it first thing in `main`.
pub fn hold_until_installed() -> std::io::Result<()> {
    let mut set = stop_signals();
    set.add(Sig::SIGHUP);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None).map_err(std::io::Error::from)
}

/// SIGHUP, caught from the moment this is made.
pub struct Hangups(Signal);

impl Hangups {
    /// Needs a tokio runtime. Releases a SIGHUP held by
    /// [`hold_until_installed`] on this thread.
    pub fn install() -> std::io::Result<Self> {
        let me = Self(signal(SignalKind::hangup())?);
        pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&hangup()), None)
            .map_err(std::io::Error::from)?;
        Ok(me)
    }

    /// Resolves on the next SIGHUP (`false`: no more can come).
    pub async fn recv(&mut self) -> bool {
        self.0.recv().await.is_some()
    }
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
