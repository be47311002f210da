//! `health-agent daemon --config FILE`: the daemon's flags from a YAML
//! file, one key per flag (`probe-interval: 10s`), and `health-agent config
//! print-defaults|check`.
//!
//! Precedence, highest first: the command line, the flag's environment
//! variable, the file, the default. The file's values are checked one by one
//! with the flags' own parsers, so a bad one is refused naming its key and
//! line; then they are handed to clap as flags placed before the command
//! line's, skipping every key the command line or the environment sets.
//! On SIGHUP the daemon reads the file again the same way ([`Invocation`]).

use std::{
    collections::BTreeMap,
    ffi::{OsStr, OsString},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use clap::{Arg, ArgAction, ArgMatches, CommandFactory as _, FromArgMatches as _};
use serde_yaml_ng::Value;

use super::Cli;

/// Settings a SIGHUP applies at once; a change to any other key is
/// reported as needing a restart.
pub(crate) const RELOADABLE: [&str; 6] = [
    "probe-interval",
    "probe-timeout",
    "success-threshold",
    "failure-threshold",
    "history-length",
    "log-level",
];

/// Flags that are not settings.
const NOT_KEYS: [&str; 3] = ["help", "version", "config"];

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

/// One key of the file, checked: `--key=value` (or `--key` for a flag set
/// to `true`; nothing for `false` or an empty value).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: String,
    pub flag: Option<String>,
}

/// The daemon's settings as keys: its own flags and the global ones.
fn keys() -> Vec<Arg> {
    let root = Cli::command();
    let globals = root
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect::<Vec<_>>();
    let daemon = root
        .find_subcommand("daemon")
        .map(|d| d.get_arguments().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    globals
        .into_iter()
        .chain(daemon)
        .filter(|a| a.get_long().is_some() && !NOT_KEYS.contains(&a.get_id().as_str()))
        .collect()
}

fn long(arg: &Arg) -> &str {
    arg.get_long().unwrap_or_default()
}

fn is_flag(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue)
}

/// The 1-based line of each top-level key (block style; the first one).
fn key_lines(text: &str) -> BTreeMap<String, usize> {
    let mut lines = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let Some(first) = line.chars().next() else {
            continue;
        };
        if first.is_whitespace() || first == '#' || first == '-' {
            continue;
        }
        if let Some((key, _)) = line.split_once(':') {
            let key = key.trim().trim_matches(['"', '\'']).to_owned();
            lines.entry(key).or_insert(i + 1);
        }
    }
    lines
}

/// serde's messages end in " at line L column C"; the line is shown up front.
fn strip_location(msg: &str) -> &str {
    msg.find(" at line ").map_or(msg, |i| &msg[..i])
}

/// Reads and checks `path`.
pub(crate) fn load(path: &Path) -> Result<Vec<Entry>, ConfigFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: shown.clone(),
        source,
    })?;
    parse(&shown, &text)
}

/// Checks `text`, the file `path`: every key a daemon flag, every value one
/// its flag accepts.
pub(crate) fn parse(path: &str, text: &str) -> Result<Vec<Entry>, ConfigFileError> {
    let at = |line: Option<usize>| match line {
        Some(l) => format!("{path}:{l}"),
        None => path.to_owned(),
    };
    let invalid = |line, message: String| ConfigFileError::Invalid {
        at: at(line),
        message,
    };
    let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| {
        invalid(
            e.location().map(|l| l.line()),
            strip_location(&e.to_string()).to_owned(),
        )
    })?;
    let map = match doc {
        Value::Null => return Ok(Vec::new()),
        Value::Mapping(m) => m,
        _ => {
            return Err(invalid(
                None,
                "expected a mapping of settings (`probe-interval: 10s`, ...)".into(),
            ));
        }
    };
    let lines = key_lines(text);
    let keys = keys();
    let mut entries = Vec::new();
    for (k, v) in map {
        let Value::String(key) = k else {
            return Err(invalid(None, format!("key {k:?} is not a string")));
        };
        let line = lines.get(&key).copied();
        let Some(arg) = keys.iter().find(|a| long(a) == key) else {
            let mut message = format!("unknown key {key:?}");
            if let Some(close) = keys
                .iter()
                .map(long)
                .find(|k| k.contains(key.as_str()) || key.contains(k))
            {
                let _ = write!(message, " (did you mean {close:?}?)");
            }
            return Err(invalid(line, message));
        };
        let value = match v {
            Value::Null => None,
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            Value::String(s) => Some(s),
            Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => {
                return Err(invalid(
                    line,
                    format!("{key:?}: expected a single value, not a list or a mapping"),
                ));
            }
        };
        let flag = match value {
            None => None,
            Some(v) if is_flag(arg) => match v.as_str() {
                "true" => Some(format!("--{key}")),
                "false" => None,
                _ => {
                    return Err(invalid(
                        line,
                        format!("{key:?}: invalid value {v:?}: expected true or false"),
                    ));
                }
            },
            Some(v) => {
                check_value(arg, &v).map_err(|m| invalid(line, format!("{key:?}: {m}")))?;
                Some(format!("--{key}={v}"))
            }
        };
        entries.push(Entry { key, flag });
    }
    Ok(entries)
}

/// Runs `value` through `arg`'s own parser (alone: none of its relations
/// to other flags, which are checked once everything is merged).
fn check_value(arg: &Arg, value: &str) -> Result<(), String> {
    let probe = clap::Command::new("check").no_binary_name(true).arg(
        Arg::new("value")
            .long("value")
            .value_parser(arg.get_value_parser().clone()),
    );
    match probe.try_get_matches_from(["--value", value]) {
        Ok(_) => Ok(()),
        Err(e) => {
            use std::error::Error as _;
            let reason = e.source().map_or_else(
                || {
                    let rendered = e.to_string();
                    let first = rendered.lines().next().unwrap_or_default().to_owned();
                    let hint = e
                        .get(clap::error::ContextKind::ValidValue)
                        .map(|v| format!(" (expected one of: {v})"))
                        .unwrap_or_default();
                    let first = first.strip_prefix("error: ").unwrap_or(&first).to_owned();
                    first.replace(" for '--value <value>'", "") + &hint
                },
                ToString::to_string,
            );
            Err(format!("invalid value {value:?}: {reason}"))
        }
    }
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
    let keys = keys();
    let given = |key: &str| {
        let flag = format!("--{key}");
        let with_value = format!("{flag}=");
        let on_line = argv[1..]
            .iter()
            .filter_map(|a| a.to_str())
            .any(|a| a == flag || a.starts_with(&with_value));
        let in_env = keys
            .iter()
            .find(|a| long(a) == key)
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

/// The daemon's effective settings by key (flags as `true`/`false`; unset
/// options absent): what a reload compares.
pub(crate) fn values(matches: &ArgMatches) -> BTreeMap<String, String> {
    let daemon = matches.subcommand_matches("daemon").unwrap_or(matches);
    keys()
        .iter()
        .filter_map(|arg| {
            let raw = daemon.get_raw(arg.get_id().as_str())?;
            let joined = raw
                .map(OsStr::to_string_lossy)
                .collect::<Vec<_>>()
                .join(",");
            Some((long(arg).to_owned(), joined))
        })
        .collect()
}

/// How the daemon was started, to read its configuration again.
#[derive(Debug, Clone)]
pub(crate) struct Invocation {
    pub argv: Vec<OsString>,
    pub path: PathBuf,
    /// The effective settings at start (and after each reload).
    pub values: BTreeMap<String, String>,
}

/// Parses `argv` (program name first), merging the `--config` file of
/// `daemon` when there is one.
pub(crate) fn parse_command_line(
    argv: Vec<OsString>,
) -> Result<(Cli, Option<Invocation>), ConfigFileError> {
    let Some((daemon, path)) = daemon_config(&argv) else {
        return Ok((<Cli as clap::Parser>::try_parse_from(argv)?, None));
    };
    let (cli, values) = parse_with_file(&argv, daemon, &path)?;
    Ok((cli, Some(Invocation { argv, path, values })))
}

fn parse_with_file(
    argv: &[OsString],
    daemon: usize,
    path: &Path,
) -> Result<(Cli, BTreeMap<String, String>), ConfigFileError> {
    let entries = load(path)?;
    let env_set = |name: &OsStr| std::env::var_os(name).is_some();
    let matches = Cli::command().try_get_matches_from(merged(argv, daemon, &entries, env_set))?;
    let cli = Cli::from_arg_matches(&matches)?;
    Ok((cli, values(&matches)))
}

impl Invocation {
    /// Reads the file again, with the same command line over it.
    pub(crate) fn reread(&self) -> Result<(Cli, BTreeMap<String, String>), ConfigFileError> {
        let (daemon, _) = daemon_config(&self.argv).ok_or_else(|| ConfigFileError::Invalid {
            at: self.path.display().to_string(),
            message: "the command line no longer names it".into(),
        })?;
        parse_with_file(&self.argv, daemon, &self.path)
    }
}

/// Keys whose value differs between `old` and `new`.
pub(crate) fn changed(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut keys: Vec<String> = old
        .keys()
        .chain(new.keys())
        .filter(|k| old.get(*k) != new.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// A YAML scalar for `s`: plain when YAML reads it back as the same text.
fn scalar(s: &str) -> String {
    let plain_ok = match serde_yaml_ng::from_str::<Value>(s) {
        Ok(Value::String(v)) => v == s,
        Ok(Value::Number(n)) => n.to_string() == s,
        Ok(Value::Bool(b)) => b.to_string() == s,
        _ => false,
    };
    if plain_ok {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

fn comment(out: &mut String, text: &str) {
    for paragraph in text.lines() {
        let mut line = String::from("#");
        for word in paragraph.split_whitespace() {
            if line.len() + 1 + word.len() > 78 && line.len() > 1 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
}

/// A complete configuration file: every key, commented, at its default
/// (keys without one commented out).
pub(crate) fn defaults() -> String {
    let mut out = String::new();
    comment(
        &mut out,
        "health-agent daemon configuration: `health-agent daemon --config FILE`.",
    );
    comment(
        &mut out,
        &format!(
            "Every key is the `daemon` flag of the same name; a flag on the command line, \
             or its environment variable, overrides the file. On SIGHUP the agent reads the \
             file again: {} apply at once, other changes need a restart.",
            RELOADABLE.join(", ")
        ),
    );
    for arg in keys() {
        let key = long(&arg);
        out.push('\n');
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        if !help.is_empty() {
            comment(&mut out, &help.replace("\n\n", "\n"));
        }
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| p.get_name().to_owned())
            .collect();
        if !possible.is_empty() && !is_flag(&arg) {
            comment(&mut out, &format!("One of: {}.", possible.join(", ")));
        }
        if let Some(env) = arg.get_env() {
            comment(
                &mut out,
                &format!(
                    "Environment: {} (overrides the file).",
                    env.to_string_lossy()
                ),
            );
        }
        let default = arg.get_default_values().first();
        match default {
            Some(d) => {
                let _ = writeln!(out, "{key}: {}", scalar(&d.to_string_lossy()));
            }
            None if arg.is_required_set() => {
                comment(&mut out, "Required (here or on the command line).");
                let _ = writeln!(out, "# {key}:");
            }
            None => {
                let _ = writeln!(out, "# {key}:");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
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
        assert_eq!(
            d.health_cidr.map(|c| c.to_string()).as_deref(),
            Some("198.18.64.0/24")
        );
        assert_eq!(d.probe_interval, std::time::Duration::from_secs(5));
        // The flag wins over the file.
        assert_eq!(d.probe_timeout, std::time::Duration::from_secs(3));
        assert_eq!(d.failure_threshold, 7);
        assert!(d.keep_endpoint);
        assert_eq!(d.routing, super::super::daemon::Routing::Masquerade);
        // Defaults stay for what neither sets.
        assert_eq!(d.success_threshold, 1);
        assert_eq!(cli.log_level, "debug");
    }

    #[test]
    fn history_length_is_a_range_checked_reloadable_key() {
        let (_, d) = daemon(&[], "health-cidr: 198.18.64.0/24\n").expect("valid");
        assert_eq!(d.history_length, 60, "the default");
        let (_, d) =
            daemon(&[], "health-cidr: 198.18.64.0/24\nhistory-length: 120\n").expect("valid");
        assert_eq!(d.history_length, 120);
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
        assert!(RELOADABLE.contains(&"history-length"));
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
        ];
        for (text, needle) in cases {
            let err = daemon(&[], text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
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
            d.web_allowed_hosts.map(|h| h.to_string()).as_deref(),
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
    fn changed_keys_are_found() {
        let (path, _gone) = write("health-cidr: 198.18.64.0/24\nprobe-interval: 5s\n");
        let (_, inv) =
            parse_command_line(argv(&["daemon", "--config", path.to_str().expect("utf-8")]))
                .expect("valid");
        let inv = inv.expect("a config file");
        std::fs::write(
            &path,
            "health-cidr: 198.18.64.0/24\nprobe-interval: 6s\ncontroller-interval: 5s\n",
        )
        .expect("rewrite");
        let (_, new) = inv.reread().expect("valid");
        assert_eq!(
            changed(&inv.values, &new),
            ["controller-interval", "probe-interval"]
        );
    }
}
