//! `health-agent daemon`.

use std::path::PathBuf;

use clap::Args;
use tracing::{error, info, warn};

use super::config::{self, Invocation};
use health_agent::{
    config::Config,
    daemon::{self, DaemonConfig, reload::Reload},
};

#[derive(Debug, Clone, Args)]
pub(crate) struct DaemonArgs {
    /// YAML file of settings: one key per flag of this command, same name
    /// (`probe-interval: 10s`); flags and their environment variables
    /// override it. Re-read on SIGHUP (see `health-agent config
    /// print-defaults`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Config,
}

impl DaemonArgs {
    pub(crate) async fn run(self, invocation: Option<Invocation>) -> anyhow::Result<()> {
        let cfg = DaemonConfig::new(self.settings)?;
        daemon::run(cfg, invocation.map(reloader)).await?;
        Ok(())
    }
}

/// Lets every flag of the daemon whose value is parsed into something
/// (a duration, a number, an address) take one starting with `-`
/// (`--probe-interval -5s`), so that its parser judges it and names the
/// flag, as it does the same value in a config file, rather than clap
/// calling it an unexpected argument. A flag given where such a value
/// belongs (`--probe-interval --zone a`) is then that flag's invalid
/// value, still named. Free-form text and paths keep clap's rule, or
/// `--state-dir --keep-endpoint` would take the next flag for a path.
pub(crate) fn values_may_start_with_a_hyphen(arg: clap::Arg) -> clap::Arg {
    use std::{any::TypeId, ffi::OsString, path::PathBuf};
    let parsed = arg.get_value_parser().type_id();
    let free_form = [
        TypeId::of::<String>(),
        TypeId::of::<PathBuf>(),
        TypeId::of::<OsString>(),
    ]
    .iter()
    .any(|t| parsed == *t);
    if arg.get_action().takes_values() && !arg.is_positional() && !free_form {
        arg.allow_hyphen_values(true)
    } else {
        arg
    }
}

/// What SIGHUP does: reads the file again with the same command line over
/// it, into the same typed configuration; applies the log level here and
/// hands the probe tuning to the daemon; names every other changed key as
/// needing a restart. A file that no longer parses, or that the daemon
/// would refuse at start, changes nothing.
fn reloader(mut inv: Invocation) -> Reload {
    Box::new(move || {
        let cli = match inv.reread_checked() {
            Ok(v) => v,
            Err(e) => {
                error!("config file refused, the running settings stay: {e:#}");
                return None;
            }
        };
        let super::Command::Daemon(args) = cli.command else {
            return None;
        };
        let changes = inv.settings.changes(&args.settings);
        if !changes.need_restart.is_empty() {
            warn!(
                keys = %changes.need_restart.join(", "),
                "config file: these changes need a restart of the agent to take effect"
            );
        }
        let mut applied = changes.reloadable;
        if cli.log_level != inv.log_level {
            match crate::logging::set_level(&cli.log_level) {
                Ok(()) => {
                    applied.push(config::log_level_key());
                    inv.log_level = cli.log_level;
                }
                Err(e) => error!("{}: {e:#}", config::log_level_key()),
            }
        }
        inv.settings.tuning = args.settings.tuning;
        info!(applied = %applied.join(", "), "config file re-read");
        Some(args.settings.tuning)
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};
    use health_agent::config::ServeAddr;

    /// `health-agent daemon ARGS` as the binary parses it (no config file).
    fn daemon(args: &[&str]) -> DaemonArgs {
        let command_line = ["health-agent", "daemon"].iter().chain(args);
        match Cli::try_parse_from(command_line).expect("valid").command {
            Command::Daemon(d) => *d,
            other => unreachable!("parsed {other:?}"),
        }
    }

    /// A health CIDR no endpoint could take an address from is refused as
    /// the flag is read, naming it.
    #[test]
    fn a_health_cidr_without_room_or_in_a_reserved_range_is_refused() {
        for (cidr, says) in [
            ("198.18.64.0/31", "too small"),
            ("127.0.0.0/24", "loopback"),
        ] {
            let err = Cli::try_parse_from(["health-agent", "daemon", "--health-cidr", cidr])
                .expect_err(cidr)
                .to_string();
            assert!(err.contains("--health-cidr") && err.contains(says), "{err}");
        }
    }

    #[test]
    fn the_metrics_listener_defaults_to_loopback_port_9962() {
        let d = daemon(&["--health-cidr", "198.18.64.0/24"]);
        let want = SocketAddr::from((Ipv4Addr::LOCALHOST, 9962));
        assert_eq!(d.settings.web.prometheus_serve_addr, ServeAddr(Some(want)));
        assert!(
            !d.settings.web.metrics_per_peer,
            "per-peer series are opt-in"
        );
        // What the daemon is handed: the same address, on loopback.
        let cfg = DaemonConfig::new(
            daemon(&["--health-cidr", "198.18.64.0/24", "--node-name", "n"]).settings,
        )
        .expect("a daemon configuration");
        assert_eq!(cfg.settings.web.serve_addr(), Some(want));
        assert!(
            cfg.settings
                .web
                .serve_addr()
                .is_some_and(|a| a.ip().is_loopback())
        );
        assert!(!cfg.settings.web.metrics_per_peer);
        // Given, it is used as given; `off` serves nothing.
        let given = daemon(&[
            "--health-cidr",
            "198.18.64.0/24",
            "--prometheus-serve-addr",
            "198.18.0.11:9000",
        ]);
        assert_eq!(
            given.settings.web.prometheus_serve_addr.0,
            Some(SocketAddr::from((Ipv4Addr::new(198, 18, 0, 11), 9000)))
        );
        let off = daemon(&[
            "--health-cidr",
            "198.18.64.0/24",
            "--prometheus-serve-addr",
            "off",
        ]);
        assert_eq!(off.settings.web.prometheus_serve_addr, ServeAddr(None));
    }

    /// A probe timeout longer than the interval is refused, naming both;
    /// as long as it is taken.
    #[test]
    fn a_probe_timeout_past_the_interval_is_refused_naming_both() {
        let with = |interval: &str, timeout: &str| {
            let args = [
                "--health-cidr",
                "198.18.64.0/24",
                "--node-name",
                "n",
                "--probe-interval",
                interval,
                "--probe-timeout",
                timeout,
            ];
            DaemonConfig::new(daemon(&args).settings)
        };
        let err = with("1s", "1500ms").expect_err("refused").to_string();
        assert!(
            err.contains("--probe-timeout 1s 500ms is longer than --probe-interval 1s"),
            "{err}"
        );
        with("1s", "1s").expect("as long as the interval");
        with("60s", "1s").expect("the defaults' shape");
    }

    #[test]
    fn web_allowed_hosts_are_parsed_and_bad_ones_named() {
        let none = DaemonConfig::new(
            daemon(&["--health-cidr", "198.18.64.0/24", "--node-name", "n"]).settings,
        )
        .expect("a daemon configuration");
        assert_eq!(none.settings.web.allowed_hosts().to_string(), "");
        let given = DaemonConfig::new(
            daemon(&[
                "--health-cidr",
                "198.18.64.0/24",
                "--node-name",
                "n",
                "--web-allowed-hosts",
                "Health.example,node-1.example:8080",
            ])
            .settings,
        )
        .expect("a daemon configuration");
        assert_eq!(
            given.settings.web.allowed_hosts().to_string(),
            "health.example,node-1.example:8080"
        );
        let err = Cli::try_parse_from([
            "health-agent",
            "daemon",
            "--health-cidr",
            "198.18.64.0/24",
            "--web-allowed-hosts",
            "ok.example,http://evil.example",
        ])
        .expect_err("a URL is not a host")
        .to_string();
        assert!(
            err.contains("--web-allowed-hosts") && err.contains("\"http://evil.example\""),
            "{err}"
        );
    }
}
