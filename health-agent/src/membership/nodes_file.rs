//! The nodes file: YAML (`.yaml`/`.yml`) or JSON (anything else).
//!
//! ```yaml
//! nodes:
//!   - name: node-1
//!     node-ip: 198.18.0.11
//!     health-ip: 198.18.64.2        # or
//!     health-cidr: 198.18.64.0/24   # the endpoint gets its first usable address
//!     node-ip6: 2001:2::11          # IPv6, with or without IPv4
//!     health-ip6: 2001:2:0:40::2    # or
//!     health-cidr6: 2001:2:0:40::/64
//! ```
//!
//! A file that does not parse as a whole (bad syntax, no `nodes` list) is
//! refused with the line at fault, and the caller keeps the last good set.
//! Otherwise each record is decoded and validated on its own
//! ([`super::validate`]): a bad one is rejected, named by its line and
//! name, and the others are used.

use crate::util::text::clip;
use std::{
    collections::{HashMap, VecDeque},
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    sync::Arc,
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{
    Node,
    claims::Holders,
    record::{Candidate, LocalNode, MAX_NAME_LEN, Origin, Record, Validated},
    validate,
};

/// The most of a value from the file shown in a record's verdict (logged,
/// and served by `GET /v1/nodes`).
const SHOWN: usize = 64;

/// A key from the file as a verdict shows it: cut to [`SHOWN`] bytes, its
/// control characters escaped (no forged log line).
fn shown(key: &str) -> String {
    clip(key, SHOWN).escape_debug().to_string()
}
use crate::util::cidr::{self, Cidr};

/// The whole file is refused: unreadable or unparsable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct NodesFileError {
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for NodesFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.path, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// The file's shape; each record is decoded alone, as it is read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    nodes: Vec<Decoded>,
}

/// A record decoded as it is read: its name, and its node or what is
/// wrong with it. Its text is not kept: 10,000 records held as values
/// until all were read took 6 MB more at the agent's start.
#[derive(Debug)]
struct Decoded {
    name: Option<String>,
    node: Result<Node, String>,
}

impl<'de> Deserialize<'de> for Decoded {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let written::Written { value, fault } = written::Written::deserialize(d)?;
        Ok(Self {
            // A longer one is none (its rule says how long it is): never
            // copied into every message about the record.
            name: value
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| n.len() <= MAX_NAME_LEN)
                .map(str::to_owned),
            node: fault.map_or_else(|| decode(&value), Err),
        })
    }
}

/// The fields of a record.
const FIELDS: [&str; 8] = [
    "name",
    "node-ip",
    "health-ip",
    "health-cidr",
    "node-ip6",
    "health-ip6",
    "health-cidr6",
    "zone",
];

/// Warns when the nodes in `update` (read from `path`) hold none named as
/// this node (`local`): peers then probe this node under a record of
/// another name, and fail every HTTP probe of it, since its hello servers
/// name it by its own. Whether it warned.
pub fn warn_if_unnamed(path: &Path, update: &Validated, local: &LocalNode) -> bool {
    let Some(name) = local.name.as_deref() else {
        return false;
    };
    let unnamed = !update.nodes.is_empty() && update.nodes.get(name).is_none();
    if unnamed {
        tracing::warn!(
            path = %path.display(),
            node = name,
            "no record of the nodes file is named as this node: --node-name (default: the \
             hostname) must be the name of this node's record, or peers fail every HTTP \
             probe of it (its hello servers answer under this name)"
        );
    }
    unnamed
}

/// The file's bytes as text: UTF-8, or an error naming the line and the
/// byte where it stops being (a file saved as Latin-1 or UTF-16, say).
pub fn text<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, NodesFileError> {
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        NodesFileError {
            path: path.display().to_string(),
            line: Some(bytes[..at].split(|&b| b == b'\n').count()),
            message: format!("not UTF-8 text: byte {at} of the file is not"),
        }
    })
}

/// Parses the file's text; `path` decides the format and names the file in
/// errors; `local` is this node, for the rules that depend on it.
pub fn parse(
    path: &Path,
    text: &str,
    local: &LocalNode,
    holders: &Holders,
) -> Result<Validated, NodesFileError> {
    let shown = path.display().to_string();
    let err = |line, message: String| NodesFileError {
        path: shown.clone(),
        line,
        message,
    };
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    );
    // The format the name says, named in an error (a YAML file named
    // otherwise fails as JSON).
    let budget = written::Budget::for_file(text.len());
    let file: File = if yaml {
        serde_yaml_ng::from_str(text).map_err(|e| {
            err(
                e.location().map(|l| l.line()),
                format!("as YAML: {}", strip_location(&e.to_string())),
            )
        })?
    } else {
        serde_json::from_str(text).map_err(|e| {
            err(
                Some(e.line()),
                format!(
                    "as JSON (the name does not end in .yaml or .yml): {}",
                    strip_location(&e.to_string())
                ),
            )
        })?
    };
    drop(budget);
    let path: Arc<str> = shown.as_str().into();
    // Records are found in the text by their names: one pass over it.
    let mut lines = name_lines(text);
    let candidates = file
        .nodes
        .into_iter()
        .enumerate()
        .map(|(i, Decoded { name, node })| {
            let line = name
                .as_deref()
                .and_then(|n| lines.get_mut(n))
                .and_then(VecDeque::pop_front);
            Candidate {
                record: Record {
                    origin: Origin::File {
                        path: path.clone(),
                        line,
                        entry: i + 1,
                    },
                    name,
                },
                node,
            }
        })
        .collect();
    Ok(validate::validate(candidates, local, holders))
}

/// Decodes one record; the error names the field at fault.
fn decode(v: &Value) -> Result<Node, String> {
    let Value::Object(map) = v else {
        return Err(format!(
            "expected a mapping of {}, found {}",
            FIELDS.join(", "),
            kind(v)
        ));
    };
    if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field `{}`, expected one of `{}`",
            shown(k),
            FIELDS.join("`, `")
        ));
    }
    let name = string(map, "name")?.ok_or("missing field `name`")?;
    let node_ip = string(map, "node-ip")?
        .map(|s| address(s, "node-ip"))
        .transpose()?;
    let health_ip = health_address::<Ipv4Net>(map, "", address)?;
    let node_ip6 = string(map, "node-ip6")?
        .map(|s| address6(s, "node-ip6"))
        .transpose()?;
    let health_ip6 = health_address::<Ipv6Net>(map, "6", address6)?;
    if node_ip.is_none() && node_ip6.is_none() {
        return Err("missing field `node-ip` (or `node-ip6`)".into());
    }
    if node_ip.is_some() && health_ip.is_none() {
        return Err("missing field `health-ip` (or `health-cidr`)".into());
    }
    let zone = string(map, "zone")?
        .map(|z| validate::zone(z).map(str::to_owned))
        .transpose()
        .map_err(|e| format!("field `zone`: {e}"))?;
    Ok(Node {
        name: name.to_owned(),
        node_ip,
        health_ip,
        node_ip6,
        health_ip6,
        zone,
    })
}

/// A family's health address (`suffix` "" or "6"): `health-ip<suffix>`, or
/// the first usable address of `health-cidr<suffix>` (what the endpoint's
/// IPAM gives), not both.
fn health_address<C: Cidr>(
    map: &Map<String, Value>,
    suffix: &str,
    parse_ip: fn(&str, &str) -> Result<C::Addr, String>,
) -> Result<Option<C::Addr>, String> {
    let (ip_field, cidr_field) = (format!("health-ip{suffix}"), format!("health-cidr{suffix}"));
    match (string(map, &ip_field)?, string(map, &cidr_field)?) {
        (Some(ip), None) => parse_ip(ip, &ip_field).map(Some),
        (None, Some(cidr)) => {
            let cidr: C = cidr::parse(cidr).map_err(|e| format!("field `{cidr_field}`: {e}"))?;
            cidr.usable()
                .next()
                .map(Some)
                .ok_or_else(|| format!("field `{cidr_field}` {cidr} has no usable address"))
        }
        (Some(_), Some(_)) => Err(format!("give `{ip_field}` or `{cidr_field}`, not both")),
        (None, None) => Ok(None),
    }
}

/// A string field (absent or null: `None`).
fn string<'a>(map: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, String> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!(
            "field `{field}`: expected a string, found {}",
            kind(other)
        )),
    }
}

fn address(s: &str, field: &str) -> Result<Ipv4Addr, String> {
    s.parse().map_err(|_| {
        if s.parse::<Ipv6Addr>().is_ok() {
            format!("field `{field}`: {s} is an IPv6 address; give it as `{field}6`")
        } else {
            format!("field `{field}`: invalid IPv4 address {:?}", clip(s, SHOWN))
        }
    })
}

fn address6(s: &str, field: &str) -> Result<Ipv6Addr, String> {
    s.parse().map_err(|_| {
        if s.parse::<Ipv4Addr>().is_ok() {
            format!(
                "field `{field}`: {s} is an IPv4 address; give it as `{}`",
                field.trim_end_matches('6')
            )
        } else {
            format!("field `{field}`: invalid IPv6 address {:?}", clip(s, SHOWN))
        }
    })
}

fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) => format!("number `{n}`"),
        Value::String(s) => format!("string {:?}", clip(s, SHOWN)),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

/// serde's messages end in " at line L column C"; the line is shown up front.
fn strip_location(msg: &str) -> String {
    msg.find(" at line ")
        .map_or_else(|| msg.to_owned(), |i| msg[..i].to_owned())
}

/// The lines (1-based) of the `name` keys, by the name they give, in
/// order: serde reports no positions for values, so a record is found by
/// its name (the n-th record called `a` at the n-th `name: a`). YAML block
/// and flow style and JSON alike; a name written with escapes is not found
/// and its record is named by its number instead.
fn name_lines(text: &str) -> HashMap<&str, VecDeque<usize>> {
    let mut out: HashMap<&str, VecDeque<usize>> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut from = 0;
        while let Some(i) = line[from..].find("name") {
            let at = from + i;
            from = at + "name".len();
            if let Some(value) = name_value(line, at) {
                out.entry(value).or_default().push_back(n + 1);
            }
        }
    }
    out
}

/// The value of a `name` key found at byte `at` of `line`, if it is one.
fn name_value(line: &str, at: usize) -> Option<&str> {
    let before = &line[..at];
    let after = &line[at + "name".len()..];
    // `name`, `"name"` or `'name'`, as a key: after a separator, then `:`.
    let (before, after) = match before.chars().next_back() {
        Some(q @ ('"' | '\'')) => (&before[..before.len() - 1], after.strip_prefix(q)?),
        _ => (before, after),
    };
    if !matches!(
        before.chars().next_back(),
        None | Some(' ' | '\t' | '{' | ',')
    ) {
        return None;
    }
    let value = after.trim_start().strip_prefix(':')?.trim_start();
    // No name is longer: looked for no further, so that a line of many
    // `name`s costs no pass over the rest of it for each.
    let value = &value[..floor_char_boundary(value, MAX_NAME_LEN + 2)];
    if let Some(q @ ('"' | '\'')) = value.chars().next() {
        let (name, _) = value[1..].split_once(q)?;
        return Some(name);
    }
    let end = value
        .char_indices()
        .find(|&(i, c)| matches!(c, ',' | '}' | ']') || (c == '#' && value[..i].ends_with(' ')))
        .map_or(value.len(), |(i, _)| i);
    Some(value[..end].trim_end())
}

/// The largest character boundary of `s` at most `at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

#[cfg(test)]
mod tests;
mod written;
