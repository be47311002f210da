//! `health-agent daemon --config FILE`: the daemon's flags from a YAML
//! file, one key per flag (`probe-interval: 10s`), and `health-agent config
//! print-defaults|check`.
//!
//! Precedence, highest first: the command line, the flag's environment
//! variable, the file, the default. The file's values are checked one by one
//! with the flags' own parsers ([`file`]), so a bad one is refused naming its
//! key and line; then they are handed to clap as flags placed before the
//! command line's, skipping every key the command line or the environment
//! sets. On SIGHUP the daemon reads the file again the same way
//! ([`Invocation`]) into the same typed configuration.

mod defaults;
mod file;

use std::{
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use clap::{Arg, CommandFactory as _, FromArgMatches as _};
use health_agent::config::Config;

pub(crate) use self::{
    defaults::defaults,
    file::{Entry, load},
};
use super::{Cli, Command};

/// The key of the global `--log-level` (its argument's flag), which a
/// reload applies too.
pub(crate) fn log_level_key() -> String {
    Cli::command()
        .get_arguments()
        .find(|a| a.get_id() == "log_level")
        .and_then(Arg::get_long)
        .unwrap_or_default()
        .to_owned()
}

/// The keys a SIGHUP applies at once: the daemon's reloadable section and
/// the log level; a change to any other key needs a restart.
pub(crate) fn reloadable() -> Vec<String> {
    let mut keys = Config::reloadable_keys();
    keys.push(log_level_key());
    keys
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigFileError {
    #[error("reading the config file {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// `at`: `path:line`, or the path when the line is not known.
    #[error("{at}: {message}")]
    Invalid { at: String, message: String },
    #[error(transparent)]
    Clap(#[from] clap::Error),
}

/// Where `argv` (whole, program name first) runs the daemon: the index of
/// the `daemon` token and the `--config` file, if any.
fn daemon_config(argv: &[OsString]) -> Option<(usize, PathBuf)> {
    let mut i = 1;
    let daemon = loop {
        let a = argv.get(i)?.to_str()?;
        if a == "--log-level" {
            i += 2;
        } else if a.starts_with('-') {
            i += 1;
        } else if a == "daemon" {
            break i;
        } else {
            return None;
        }
    };
    let mut rest = argv[daemon + 1..].iter();
    while let Some(a) = rest.next() {
        let a = a.to_str()?;
        if a == "--" {
            return None;
        }
        if a == "--config" {
            return rest.next().map(|p| (daemon, PathBuf::from(p)));
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some((daemon, PathBuf::from(p)));
        }
    }
    None
}

/// `argv` with the file's settings inserted after `daemon`, but for the
/// keys the command line or the environment sets.
fn merged(
    argv: &[OsString],
    daemon: usize,
    entries: &[Entry],
    env_set: impl Fn(&OsStr) -> bool,
) -> Vec<OsString> {
    let keys = file::keys();
    let given = |key: &str| {
        let flag = format!("--{key}");
        let with_value = format!("{flag}=");
        let on_line = argv[1..]
            .iter()
            .filter_map(|a| a.to_str())
            .any(|a| a == flag || a.starts_with(&with_value));
        let in_env = keys
            .iter()
            .find(|a| file::long(a) == key)
            .and_then(Arg::get_env)
            .is_some_and(&env_set);
        on_line || in_env
    };
    let mut out = argv[..=daemon].to_vec();
    out.extend(
        entries
            .iter()
            .filter(|e| !given(&e.key))
            .filter_map(|e| e.flag.as_ref().map(OsString::from)),
    );
    out.extend_from_slice(&argv[daemon + 1..]);
    out
}

/// How the daemon was started, to read its configuration again.
#[derive(Debug, Clone)]
pub(crate) struct Invocation {
    pub argv: Vec<OsString>,
    pub path: PathBuf,
    /// The daemon's settings in force: those at start, with the
    /// reloadable ones as the last reload applied them.
    pub settings: Config,
    /// The log filter in force.
    pub log_level: String,
}

/// Parses `argv` (program name first), merging the `--config` file of
/// `daemon` when there is one.
pub(crate) fn parse_command_line(
    argv: Vec<OsString>,
) -> Result<(Cli, Option<Invocation>), ConfigFileError> {
    let Some((daemon, path)) = daemon_config(&argv) else {
        return Ok((<Cli as clap::Parser>::try_parse_from(argv)?, None));
    };
    let cli = parse_with_file(&argv, daemon, &path)?;
    let invocation = match &cli.command {
        Command::Daemon(daemon_args) => Some(Invocation {
            settings: daemon_args.settings.clone(),
            log_level: cli.log_level.clone(),
            argv,
            path,
        }),
        _ => None,
    };
    Ok((cli, invocation))
}

fn parse_with_file(argv: &[OsString], daemon: usize, path: &Path) -> Result<Cli, ConfigFileError> {
    let entries = load(path)?;
    let env_set = |name: &OsStr| std::env::var_os(name).is_some();
    let matches = Cli::command()
        .try_get_matches_from(merged(argv, daemon, &entries, env_set))
        .map_err(|e| with_file(e, path))?;
    Ok(Cli::from_arg_matches(&matches)?)
}

/// clap's refusal of the command line the file was merged into, naming
/// the file (its values may be the ones in conflict, or it may lack one
/// the others need) in one line, without clap's usage; `--help` and
/// `--version` as clap has them.
fn with_file(e: clap::Error, path: &Path) -> ConfigFileError {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return ConfigFileError::Clap(e);
    }
    let missing = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::Strings(flags)) if e.kind() == ErrorKind::MissingRequiredArgument => {
            Some(flags.join(", "))
        }
        _ => None,
    };
    let message = if let Some(flags) = missing {
        format!("with the command line, {flags} is still missing")
    } else {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        format!(
            "with the command line, {}",
            first.strip_prefix("error: ").unwrap_or(first)
        )
    };
    ConfigFileError::Invalid {
        at: path.display().to_string(),
        message,
    }
}

/// What `config check` found in a valid file.
#[derive(Debug)]
pub(crate) struct Checked {
    /// Settings the file holds.
    pub settings: usize,
    /// What the daemon still needs from its command line (clap's usage of
    /// the missing flags), when the file does not give it.
    pub command_line_must_give: Option<String>,
}

/// `config check FILE`: the file's keys and values, then the daemon's
/// settings it makes on its own (over the environment, as the daemon
/// would see it), checked as the daemon checks them before it creates
/// anything: flags in conflict, a family without its range, an etcd file
/// that cannot be read. Flags the file leaves to the command line are
/// named, not refused.
pub(crate) fn check(path: &Path) -> anyhow::Result<Checked> {
    let entries = load(path)?;
    let argv = ["health-agent", "daemon"].map(OsString::from);
    let env_set = |name: &OsStr| std::env::var_os(name).is_some();
    let settings = entries.len();
    let matches = match Cli::command().try_get_matches_from(merged(&argv, 1, &entries, env_set)) {
        Ok(m) => m,
        // clap looks for conflicts before missing flags: none were found.
        Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => {
            let missing = match e.get(clap::error::ContextKind::InvalidArg) {
                Some(clap::error::ContextValue::Strings(flags)) => flags.join(", "),
                _ => e.to_string(),
            };
            return Ok(Checked {
                settings,
                command_line_must_give: Some(missing),
            });
        }
        // Its first line, without clap's own "error: " and usage.
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            anyhow::bail!(
                "{}: {}",
                path.display(),
                first.strip_prefix("error: ").unwrap_or(first)
            );
        }
    };
    let Command::Daemon(daemon) = Cli::from_arg_matches(&matches)?.command else {
        anyhow::bail!("{}: not a daemon command line", path.display());
    };
    health_agent::daemon::config::DaemonConfig::new(daemon.settings)
        .and_then(|cfg| cfg.check_families())
        .with_context(|| path.display().to_string())?;
    Ok(Checked {
        settings,
        command_line_must_give: None,
    })
}

impl Invocation {
    /// Reads the file again, with the same command line over it.
    pub(crate) fn reread(&self) -> Result<Cli, ConfigFileError> {
        let (daemon, _) = daemon_config(&self.argv).ok_or_else(|| ConfigFileError::Invalid {
            at: self.path.display().to_string(),
            message: "the command line no longer names it".into(),
        })?;
        parse_with_file(&self.argv, daemon, &self.path)
    }

    /// [`Self::reread`], the daemon's settings then checked as the daemon
    /// checks them at start: a file the daemon would refuse at start (a
    /// restart would fail on it) is refused whole, naming the file.
    pub(crate) fn reread_checked(&self) -> anyhow::Result<Cli> {
        let cli = self.reread()?;
        if let Command::Daemon(daemon) = &cli.command {
            health_agent::daemon::config::DaemonConfig::new(daemon.settings.clone())
                .and_then(|cfg| cfg.check_families())
                .with_context(|| self.path.display().to_string())?;
        }
        Ok(cli)
    }
}

#[cfg(test)]
mod tests {
    use super::file::{keys, long, parse};
    use super::*;
    use crate::cli::Command;

    fn argv(args: &[&str]) -> Vec<OsString> {
        std::iter::once("health-agent")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn write(text: &str) -> (PathBuf, impl Drop) {
        struct Gone(PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let path = std::env::temp_dir().join(format!(
            "health-agent-config-{}-{}.yaml",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::write(&path, text).expect("write the config file");
        (path.clone(), Gone(path))
    }

    fn daemon(
        args: &[&str],
        file: &str,
    ) -> Result<(Cli, Box<super::super::daemon::DaemonArgs>), String> {
        let (path, _gone) = write(file);
        let mut all = vec!["daemon", "--config", path.to_str().expect("utf-8")];
        all.extend_from_slice(args);
        let (cli, inv) = parse_command_line(argv(&all)).map_err(|e| e.to_string())?;
        assert!(inv.is_some());
        match cli.command {
            Command::Daemon(ref d) => {
                let d = d.clone();
                Ok((cli, d))
            }
            _ => unreachable!("parsed a daemon command line"),
        }
    }

    #[test]
    fn the_file_sets_what_the_command_line_does_not() {
        let (cli, d) = daemon(
            &["--probe-timeout", "3s"],
            "health-cidr: 198.18.64.0/24\n\
             probe-interval: 5s\n\
             probe-timeout: 2s\n\
             failure-threshold: 7\n\
             keep-endpoint: true\n\
             routing: masquerade\n\
             log-level: debug\n",
        )
        .expect("valid");
        let s = &d.settings;
        assert_eq!(
            s.endpoint.health_cidr.map(|c| c.to_string()).as_deref(),
            Some("198.18.64.0/24")
        );
        assert_eq!(s.tuning.probe_interval, std::time::Duration::from_secs(5));
        // The flag wins over the file.
        assert_eq!(s.tuning.probe_timeout, std::time::Duration::from_secs(3));
        assert_eq!(s.tuning.failure_threshold, 7);
        assert!(s.endpoint.keep_endpoint);
        assert_eq!(
            s.datapath.routing,
            health_agent::config::Routing::Masquerade
        );
        // Defaults stay for what neither sets.
        assert_eq!(s.tuning.success_threshold, 1);
        assert_eq!(cli.log_level, "debug");
    }

    #[test]
    fn history_length_is_a_range_checked_reloadable_key() {
        let (_, d) = daemon(&[], "health-cidr: 198.18.64.0/24\n").expect("valid");
        assert_eq!(d.settings.tuning.history_length, 60, "the default");
        let (_, d) =
            daemon(&[], "health-cidr: 198.18.64.0/24\nhistory-length: 120\n").expect("valid");
        assert_eq!(d.settings.tuning.history_length, 120);
        for bad in ["0", "1441", "many"] {
            let err = daemon(
                &[],
                &format!("health-cidr: 198.18.64.0/24\nhistory-length: {bad}\n"),
            )
            .expect_err(bad);
            assert!(err.contains(":2: \"history-length\""), "{bad}: {err}");
            let err =
                daemon(&["--history-length", bad], "health-cidr: 198.18.64.0/24\n").expect_err(bad);
            assert!(err.contains("--history-length"), "{bad}: {err}");
        }
        let err =
            daemon(&["--history-length", "0"], "health-cidr: 198.18.64.0/24\n").expect_err("0");
        assert!(err.contains("1..=1440"), "{err}");
        assert!(reloadable().contains(&"history-length".to_owned()));
    }

    #[test]
    fn a_global_flag_before_the_subcommand_wins_over_the_file() {
        let (cli, _) =
            daemon(&[], "health-cidr: 198.18.64.0/24\nlog-level: debug\n").expect("valid");
        assert_eq!(cli.log_level, "debug");
        let (path, _gone) = write("health-cidr: 198.18.64.0/24\nlog-level: debug\n");
        let (cli, _) = parse_command_line(argv(&[
            "--log-level",
            "warn",
            "daemon",
            "--config",
            path.to_str().expect("utf-8"),
        ]))
        .expect("valid");
        assert_eq!(cli.log_level, "warn");
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let entries =
            parse("f.yaml", "bpffs-dir: /sys/fs/bpf/f\nprobe-interval: 5s\n").expect("valid");
        let argv = argv(&["daemon", "--config", "f.yaml"]);
        let flags = |set: &str| -> Vec<OsString> {
            let all = merged(&argv, 1, &entries, |name| name == set);
            // program, daemon, the file's flags, then --config f.yaml
            all[2..all.len() - 2].to_vec()
        };
        assert_eq!(
            flags("NOTHING"),
            ["--bpffs-dir=/sys/fs/bpf/f", "--probe-interval=5s"]
        );
        assert_eq!(flags("HEALTH_AGENT_BPFFS_DIR"), ["--probe-interval=5s"]);
    }

    #[test]
    fn bad_files_are_refused_naming_the_key_and_line() {
        let cases = [
            (
                "health-cidr: 198.18.64.0/24\nprobe-intervall: 5s\n",
                ":2: unknown key \"probe-intervall\"",
            ),
            (
                "# c\nhealth-cidr: 198.18.64.0/24\n\nprobe-interval: soon\n",
                ":4: \"probe-interval\": invalid value \"soon\"",
            ),
            (
                "health-cidr: 198.18.64.300/24\n",
                ":1: \"health-cidr\": invalid value",
            ),
            (
                "health-cidr: 198.18.64.0/24\nrouting: bridged\n",
                ":2: \"routing\": invalid value \"bridged\"",
            ),
            (
                "health-cidr: 198.18.64.0/24\nsuccess-threshold: 0\n",
                ":2: \"success-threshold\"",
            ),
            (
                "health-cidr: 198.18.64.0/24\nkeep-endpoint: yes please\n",
                ":2: \"keep-endpoint\"",
            ),
            (
                "health-cidr: 198.18.64.0/24\nprobe-interval: [1s, 2s]\n",
                ":2: \"probe-interval\": expected a single value",
            ),
            (
                "health-cidr: 198.18.64.0/24\nprobe-interval: 1s\n  bad: indent\n",
                ":3:",
            ),
            ("- a\n- b\n", "expected a mapping"),
            (
                "health-cidr: 198.18.64.0/24\nconfig: other.yaml\n",
                ":2: unknown key \"config\"",
            ),
            (
                "health-cidr: 198.18.64.0/24\nuplink: an-interface-name-too-long\n",
                ":2: \"uplink\": invalid value \"an-interface-name-too-long\"",
            ),
            (
                "health-cidr: 198.18.64.0/24\nnode-ip: 0.0.0.0\n",
                ":2: \"node-ip\": invalid value \"0.0.0.0\": 0.0.0.0 is unspecified",
            ),
            (
                "health-cidr: 198.18.64.0/24\nnode-ip6: fe80::1\n",
                ":2: \"node-ip6\": invalid value \"fe80::1\": fe80::1 is link-local",
            ),
        ];
        for (text, needle) in cases {
            let err = daemon(&[], text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
    }

    /// A value starting with `-` is judged by its key's parser, not taken
    /// for a flag.
    #[test]
    fn a_negative_value_is_refused_by_its_keys_parser() {
        for (text, needle) in [
            (
                "health-cidr: 198.18.64.0/24\ndegraded-loss: -1%\n",
                ":2: \"degraded-loss\": invalid value \"-1%\"",
            ),
            (
                "health-cidr: 198.18.64.0/24\nprobe-timeout: -5s\n",
                ":2: \"probe-timeout\": invalid value \"-5s\"",
            ),
        ] {
            let err = daemon(&[], text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
            assert!(!err.contains("unexpected argument"), "{err}");
        }
    }

    #[test]
    fn several_members_are_taken_comma_separated_or_as_a_list() {
        let want = ["198.18.0.2:2379", "198.18.0.3:2379"];
        for text in [
            "kvstore-endpoint: 198.18.0.2:2379,198.18.0.3:2379\n",
            "kvstore-endpoint: [198.18.0.2:2379, 198.18.0.3:2379]\n",
            "kvstore-endpoint:\n  - 198.18.0.2:2379\n  - 198.18.0.3:2379\n",
        ] {
            let file = format!("health-cidr: 198.18.64.0/24\nkvstore: etcd\n{text}");
            let (_, d) = daemon(&[], &file).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(d.settings.cluster.kvstore_endpoint, want, "{text:?}");
        }
        for (text, needle) in [
            (
                "kvstore-endpoint: 198.18.0.2:2379,198.18.0.3\n",
                ":3: \"kvstore-endpoint\": invalid value \"198.18.0.2:2379,198.18.0.3\"",
            ),
            (
                "kvstore-endpoint: []\n",
                ":3: \"kvstore-endpoint\": an empty list",
            ),
            (
                "kvstore-endpoint: [198.18.0.2:2379, [198.18.0.3:2379]]\n",
                ":3: \"kvstore-endpoint\": a list of single values",
            ),
            (
                "kvstore-endpoint: [\"198.18.0.2:2379,198.18.0.3:2379\"]\n",
                "holds ',', which separates items",
            ),
        ] {
            let file = format!("health-cidr: 198.18.64.0/24\nkvstore: etcd\n{text}");
            let err = daemon(&[], &file).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
    }

    #[test]
    fn a_number_is_taken_as_written() {
        let (_, d) = daemon(
            &[],
            "health-cidr: 198.18.64.0/24\nzone: 1.10 # rack\nnode-name: 1e3\nfailure-threshold: 07\t# tab\nsuccess-threshold: 0x2\n",
        )
        .expect("valid");
        let c = &d.settings.cluster;
        assert_eq!(c.zone.as_deref(), Some("1.10"), "not 1.1");
        assert_eq!(c.node_name.as_deref(), Some("1e3"), "not 1000");
        assert_eq!(
            d.settings.tuning.failure_threshold, 7,
            "a tab before the comment"
        );
        assert_eq!(
            d.settings.tuning.success_threshold, 2,
            "hex, as YAML reads it"
        );
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let err = parse_command_line(argv(&["daemon", "--config", "/nonexistent/health.yaml"]))
            .expect_err("missing file");
        assert!(
            err.to_string().contains("/nonexistent/health.yaml"),
            "{err}"
        );
    }

    /// A file whose values the command line conflicts with, or that
    /// leaves a flag its others need to the command line, is named with
    /// what is wrong, in one line.
    #[test]
    fn the_daemons_refusal_of_a_file_and_its_command_line_names_the_file() {
        let err = daemon(
            &["--kvstore", "etcd"],
            "health-cidr: 198.18.64.0/24\nnodes-file: /etc/health/nodes.yaml\n",
        )
        .expect_err("a conflict");
        assert!(
            err.contains("health-agent-config-")
                && err.contains("with the command line, the argument")
                && err.contains("cannot be used with")
                && !err.contains("Usage"),
            "{err}"
        );
        let err = daemon(
            &[],
            "health-cidr: 198.18.64.0/24\nkvstore: etcd\nkvstore-user: health\n",
        )
        .expect_err("a password file missing");
        assert!(
            err.contains("health-agent-config-")
                && err.contains("--kvstore-password-file")
                && err.contains("is still missing"),
            "{err}"
        );
    }

    #[test]
    fn check_judges_the_daemon_the_file_makes_not_only_its_values() {
        let check = |text: &str| {
            let (path, _gone) = write(text);
            check(&path).map_err(|e| format!("{e:#}"))
        };
        let whole = check("health-cidr: 198.18.64.0/24\nnode-name: node-1\n").expect("valid");
        assert_eq!(whole.settings, 2);
        assert_eq!(whole.command_line_must_give, None);
        // Each value is good; together they are not.
        let err = check(
            "health-cidr: 198.18.64.0/24\nnodes-file: /etc/health/nodes.yaml\nkvstore: etcd\n",
        )
        .expect_err("a conflict");
        assert!(
            err.contains("'--nodes-file <PATH>' cannot be used with '--kvstore <KVSTORE>'")
                && !err.contains("Usage"),
            "{err}"
        );
        let err = check("health-cidr6: 2001:2::/64\nrouting: masquerade\nnode-name: node-1\n")
            .expect_err("IPv6 masquerade");
        assert!(err.contains("IPv6 masquerade is not supported"), "{err}");
        // A flag the command line may give is named, not refused.
        let partial = check("probe-interval: 5s\n").expect("valid so far");
        assert!(
            partial
                .command_line_must_give
                .as_deref()
                .is_some_and(|m| m.contains("--health-cidr")),
            "{partial:?}"
        );
    }

    #[test]
    fn required_flags_may_come_from_the_file_or_not_at_all() {
        let err = daemon(&[], "probe-interval: 5s\n").expect_err("no CIDR");
        assert!(err.contains("--health-cidr"), "{err}");
    }

    #[test]
    fn print_defaults_is_complete_and_reads_back_as_the_defaults() {
        let text = defaults();
        for arg in keys() {
            let key = long(&arg);
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{key}:")) || l == format!("# {key}:")),
                "{key} missing from the defaults"
            );
        }
        // Every uncommented key parses, and gives what no file gives.
        let entries = parse("defaults.yaml", &text).expect("the defaults parse");
        assert!(entries.len() > 30, "{} keys", entries.len());
        let (_, mut with) = daemon(&["--health-cidr", "198.18.64.0/24"], &text).expect("valid");
        with.config = None;
        let (cli, _) = parse_command_line(argv(&["daemon", "--health-cidr", "198.18.64.0/24"]))
            .expect("valid");
        let Command::Daemon(without) = cli.command else {
            unreachable!()
        };
        assert_eq!(format!("{with:?}"), format!("{without:?}"));
    }

    #[test]
    fn web_allowed_hosts_is_a_key_checked_by_its_parser() {
        let (_, d) = daemon(
            &[],
            "health-cidr: 198.18.64.0/24\nweb-allowed-hosts: health.example,node-1.example:8080\n",
        )
        .expect("valid");
        assert_eq!(
            d.settings
                .web
                .web_allowed_hosts
                .map(|h| h.to_string())
                .as_deref(),
            Some("health.example,node-1.example:8080")
        );
        let err = daemon(
            &[],
            "health-cidr: 198.18.64.0/24\nweb-allowed-hosts: health.example,,x\n",
        )
        .expect_err("an empty name");
        assert!(
            err.contains(":2: \"web-allowed-hosts\": invalid value"),
            "{err}"
        );
        assert!(defaults().lines().any(|l| l == "# web-allowed-hosts:"));
    }

    #[test]
    fn a_reread_file_is_compared_typed_naming_the_changed_keys() {
        let (path, _gone) =
            write("health-cidr: 198.18.64.0/24\nprobe-interval: 5s\nlog-level: info\n");
        let (_, inv) =
            parse_command_line(argv(&["daemon", "--config", path.to_str().expect("utf-8")]))
                .expect("valid");
        let inv = inv.expect("a config file");
        assert_eq!(inv.log_level, "info");
        std::fs::write(
            &path,
            "health-cidr: 198.18.64.0/24\nprobe-interval: 6s\ncontroller-interval: 5s\n",
        )
        .expect("rewrite");
        let Command::Daemon(new) = inv.reread().expect("valid").command else {
            unreachable!("a daemon command line")
        };
        let changes = inv.settings.changes(&new.settings);
        assert_eq!(changes.reloadable, ["probe-interval"]);
        assert_eq!(changes.need_restart, ["controller-interval"]);
        // The same value written otherwise is no change.
        std::fs::write(
            &path,
            "health-cidr: 198.18.64.0/24\nprobe-interval: 5000ms\n",
        )
        .expect("rewrite");
        let Command::Daemon(same) = inv.reread().expect("valid").command else {
            unreachable!("a daemon command line")
        };
        assert_eq!(
            inv.settings.changes(&same.settings),
            health_agent::config::Changes::default()
        );
    }

    /// A file the daemon would refuse at start is refused on reload too,
    /// naming the file and what is wrong.
    #[test]
    fn a_reread_file_the_daemon_would_refuse_at_start_is_refused() {
        let (path, _gone) = write("health-cidr: 198.18.64.0/24\nnode-name: n1\n");
        let (_, inv) =
            parse_command_line(argv(&["daemon", "--config", path.to_str().expect("utf-8")]))
                .expect("valid");
        let inv = inv.expect("a config file");
        assert!(inv.reread_checked().is_ok());
        for (text, says) in [
            (
                "health-cidr: 198.18.64.0/24\nnode-name: n1\nprobe-interval: 6s\nsync-min-interval: 2m\n",
                "sync",
            ),
            (
                "health-cidr: 198.18.64.0/24\nnode-name: \"bad name\"\n",
                "bad name",
            ),
        ] {
            std::fs::write(&path, text).expect("rewrite");
            assert!(inv.reread().is_ok(), "it parses: {text}");
            let err = format!("{:#}", inv.reread_checked().expect_err(text));
            assert!(
                err.contains(&path.display().to_string()) && err.contains(says),
                "{err}"
            );
        }
    }

    #[test]
    fn the_log_level_is_named_from_its_flag_and_reloads() {
        assert_eq!(log_level_key(), "log-level");
        assert_eq!(
            reloadable(),
            [
                "probe-interval",
                "liveness-interval",
                "probe-timeout",
                "success-threshold",
                "failure-threshold",
                "history-length",
                "log-level"
            ]
        );
    }
}
