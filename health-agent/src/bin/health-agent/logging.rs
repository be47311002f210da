//! `tracing` setup. The `tracing-log` bridge turns `log` records, which is
//! what aya-log emits for the kernel programs' messages, into events.

use std::sync::OnceLock;

use tracing_subscriber::{
    EnvFilter, Registry, layer::SubscriberExt as _, reload, util::SubscriberInitExt as _,
};

/// Swaps the filter of the installed subscriber.
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

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
    let (filter, handle) = reload::Layer::new(filter);
    let _ = FILTER.set(handle);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours for a terminal only: a log file or the journal gets text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}

/// Replaces the log filter with `filter` (a new `log-level`), unless
/// `RUST_LOG` sets it.
pub(crate) fn set_level(filter: &str) -> anyhow::Result<()> {
    if std::env::var("RUST_LOG").is_ok_and(|v| !v.is_empty()) {
        anyhow::bail!("RUST_LOG is set and overrides it");
    }
    let new = EnvFilter::try_new(filter).map_err(|e| anyhow::anyhow!("{filter:?}: {e}"))?;
    FILTER
        .get()
        .ok_or_else(|| anyhow::anyhow!("no log subscriber installed"))?
        .reload(new)
        .map_err(|e| anyhow::anyhow!("replacing the log filter: {e}"))?;
    tracing::info!(filter, "log level changed");
    Ok(())
}
