//! `tracing` setup. The `tracing-log` bridge turns `log` records, which is
//! what aya-log emits for the kernel programs' messages, into events.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber, writing to stderr. `RUST_LOG` overrides
/// `default_filter`.
pub(crate) fn init(default_filter: &str) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => {
            EnvFilter::try_new(&v).map_err(|e| anyhow::anyhow!("RUST_LOG={v:?}: {e}"))?
        }
        _ => EnvFilter::try_new(default_filter)
            .map_err(|e| anyhow::anyhow!("--log-level {default_filter:?}: {e}"))?,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file or the journal gets text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}
