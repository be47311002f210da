//! The config file: a YAML mapping of the daemon's flags (`probe-interval:
//! 10s`), each key checked against the flag of its name and each value with
//! that flag's own parser, so a bad one is refused naming its key and line.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use clap::{Arg, ArgAction, CommandFactory as _};
use serde_yaml_ng::Value;

use super::ConfigFileError;
use crate::cli::Cli;

/// Flags that are not settings.
const NOT_KEYS: [&str; 3] = ["help", "version", "config"];

/// One key of the file, checked: `--key=value` (or `--key` for a flag set
/// to `true`; nothing for `false` or an empty value).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: String,
    pub flag: Option<String>,
}

/// The daemon's settings as keys: its own flags and the global ones.
pub(super) fn keys() -> Vec<Arg> {
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

pub(super) fn long(arg: &Arg) -> &str {
    arg.get_long().unwrap_or_default()
}

pub(super) fn is_flag(arg: &Arg) -> bool {
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

/// The number after the key on 1-based `line` of `text` as written (a
/// comment after it left out), when written in decimal (`1.10`, `1e3`,
/// `007`); `None` for any other form (`0x10`: taken as YAML reads it).
fn as_written(text: &str, line: Option<usize>) -> Option<String> {
    let (_, value) = text.lines().nth(line?.checked_sub(1)?)?.split_once(':')?;
    // A comment starts at a `#` after blank space.
    let end = value
        .char_indices()
        .find(|&(i, c)| c == '#' && value[..i].ends_with([' ', '\t']))
        .map_or(value.len(), |(i, _)| i);
    let value = value[..end].trim();
    let decimal = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-' | '_'));
    decimal.then(|| value.to_owned())
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
            Value::Sequence(items) if arg.get_value_delimiter().is_some() => {
                Some(list(arg, &key, items).map_err(|m| invalid(line, m))?)
            }
            // As written, as the command line would take it: YAML reads
            // `zone: 1.10` as 1.1 and `node-name: 1e3` as 1000.
            Value::Number(n) => Some(as_written(text, line).unwrap_or_else(|| n.to_string())),
            v => Some(scalar(&key, v).map_err(|m| invalid(line, m))?),
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

/// A key's single value as the command line would spell it.
fn scalar(key: &str, v: Value) -> Result<String, String> {
    match v {
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::String(s) => Ok(s),
        Value::Null | Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => Err(format!(
            "{key:?}: expected a single value, not a list or a mapping"
        )),
    }
}

/// A list for a flag that takes several values (`kvstore-endpoint:
/// [198.18.0.2:2379, 198.18.0.3:2379]`), joined by the flag's delimiter
/// as the command line takes it.
fn list(arg: &Arg, key: &str, items: Vec<Value>) -> Result<String, String> {
    let delimiter = arg.get_value_delimiter().unwrap_or(',');
    let mut joined = Vec::with_capacity(items.len());
    for item in items {
        let item = scalar(key, item)
            .map_err(|_| format!("{key:?}: a list of single values, not of lists or mappings"))?;
        if item.contains(delimiter) {
            return Err(format!(
                "{key:?}: the list's item {item:?} holds {delimiter:?}, which separates items"
            ));
        }
        joined.push(item);
    }
    if joined.is_empty() {
        return Err(format!("{key:?}: an empty list"));
    }
    Ok(joined.join(&delimiter.to_string()))
}

/// Runs `value` through `arg`'s own parser (alone: none of its relations
/// to other flags, which are checked once everything is merged), split
/// by its delimiter where it takes several values, as the command line
/// splits it.
fn check_value(arg: &Arg, value: &str) -> Result<(), String> {
    let one = Arg::new("value")
        .long("value")
        .value_parser(arg.get_value_parser().clone());
    let one = match arg.get_value_delimiter() {
        Some(d) => one.value_delimiter(d).action(ArgAction::Append),
        None => one,
    };
    let probe = clap::Command::new("check").no_binary_name(true).arg(one);
    // As `--key=value`, so that a value starting with `-` is the flag's
    // value, as the daemon's command line takes it.
    match probe.try_get_matches_from([format!("--value={value}")]) {
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
