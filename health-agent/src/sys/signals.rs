//! The signals that end the agent. Installed before the agent creates
//! anything, so a SIGTERM at any moment of the start-up is a clean stop
//! rather than the default action (death, leaving everything behind).

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM, caught from the moment this is made.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Needs a tokio runtime.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
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
