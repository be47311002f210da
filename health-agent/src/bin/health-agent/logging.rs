//! `tracing` setup. The `tracing-log` bridge turns `log` records, which is
//! what aya-log emits for the kernel programs' messages, into events.

use std::sync::OnceLock;

use tracing_subscriber::{
    EnvFilter, Registry, layer::SubscriberExt as _, reload, util::SubscriberInitExt as _,
};

/// Swaps the filter of the installed subscriber.
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Words taken for levels that are not one: alone in a filter, a word is
/// a target whose events pass at every level while all else is off, so
/// `warning` would silence the agent. Each with the level meant.
const NOT_LEVELS: [(&str, &str); 10] = [
    ("warning", "warn"),
    ("err", "error"),
    ("fatal", "error"),
    ("critical", "error"),
    ("crit", "error"),
    ("information", "info"),
    ("notice", "info"),
    ("verbose", "debug"),
    ("all", "trace"),
    ("none", "off"),
];

/// `--log-level` (and the config file's `log-level`): a filter the log
/// subscriber takes, without a misspelt level it would take as a target.
pub(crate) fn parse_filter(s: &str) -> Result<String, String> {
    check_filter(s)
        .map_err(|e| format!("{e} (HEALTH_AGENT_LOG, when set, gives the value the flag does not)"))
}

fn check_filter(s: &str) -> Result<String, String> {
    for directive in s.split(',').map(str::trim) {
        if let Some((_, meant)) = NOT_LEVELS
            .iter()
            .find(|(word, _)| directive.eq_ignore_ascii_case(word))
        {
            return Err(format!(
                "{directive:?} is not a level (trace, debug, info, warn, error, off): did you mean \
                 {meant:?}? Alone it would name a target and turn every other log off"
            ));
        }
    }
    EnvFilter::try_new(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

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

#[cfg(test)]
mod tests {
    use super::parse_filter;

    #[test]
    fn filters_are_checked_and_misspelt_levels_refused() {
        for good in [
            "info",
            "debug",
            "health_agent=trace,info",
            "warn",
            "off",
            "hyper",
        ] {
            assert_eq!(parse_filter(good).as_deref(), Ok(good));
        }
        for (bad, needle) in [
            ("warning", "did you mean \"warn\""),
            ("info,Verbose", "\"Verbose\" is not a level"),
            ("health_agent=verbose", "expected one of"),
            ("health_agent=[", ""),
        ] {
            let err = parse_filter(bad).expect_err(bad);
            assert!(err.contains(needle), "{bad:?}: {err}");
            // A bad value may have come from the environment, not the flag.
            assert!(err.contains("HEALTH_AGENT_LOG"), "{bad:?}: {err}");
        }
    }
}
