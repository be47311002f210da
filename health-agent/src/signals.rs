//! Waiting for the signals that end the agent.

use tokio::signal::unix::{SignalKind, signal};

/// Resolves with the signal's name on SIGINT or SIGTERM.
pub async fn wait_for_shutdown() -> std::io::Result<&'static str> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
