//! The nodes file: YAML (`.yaml`/`.yml`) or JSON (anything else).
//!
//! ```yaml
//! nodes:
//!   - name: node-1
//!     node-ip: 198.18.0.11
//!     health-ip: 198.18.64.2        # or
//!     health-cidr: 198.18.64.0/24   # the endpoint gets its first usable address
//! ```
//!
//! Errors name the line (and field) at fault; the caller keeps the last good
//! set when a new version of the file does not parse.

use std::{collections::BTreeMap, fmt, net::Ipv4Addr, path::Path};

use serde::Deserialize;

use super::{Node, NodeSet};
use crate::util::cidr::Ipv4Cidr;

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    nodes: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Entry {
    name: String,
    node_ip: Ipv4Addr,
    health_ip: Option<Ipv4Addr>,
    health_cidr: Option<Ipv4Cidr>,
}

/// Parses the file's text; `path` decides the format and names the file in errors.
pub fn parse(path: &Path, text: &str) -> Result<NodeSet, NodesFileError> {
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
    let file: File = if yaml {
        serde_yaml_ng::from_str(text).map_err(|e| {
            err(
                e.location().map(|l| l.line()),
                strip_location(&e.to_string()),
            )
        })?
    } else {
        serde_json::from_str(text)
            .map_err(|e| err(Some(e.line()), strip_location(&e.to_string())))?
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::with_capacity(file.nodes.len());
    // Entry i starts at the i-th `name` key: one pass over the text.
    let mut entry_lines = entry_lines(text);
    for (i, e) in file.nodes.into_iter().enumerate() {
        let line = entry_lines.next();
        if e.name.is_empty() {
            return Err(err(line, format!("node {}: field `name` is empty", i + 1)));
        }
        if let Some(first) = seen.insert(e.name.clone(), i) {
            return Err(err(
                line,
                format!(
                    "duplicate node {:?} (also node {} of the file)",
                    e.name,
                    first + 1
                ),
            ));
        }
        let health_ip = match (e.health_ip, e.health_cidr) {
            (Some(ip), None) => ip,
            (None, Some(cidr)) => cidr.usable().next().ok_or_else(|| {
                err(
                    line,
                    format!(
                        "node {:?}: field `health-cidr` {cidr} has no usable address",
                        e.name
                    ),
                )
            })?,
            (Some(_), Some(_)) => {
                return Err(err(
                    line,
                    format!(
                        "node {:?}: give `health-ip` or `health-cidr`, not both",
                        e.name
                    ),
                ));
            }
            (None, None) => {
                return Err(err(
                    line,
                    format!(
                        "node {:?}: missing field `health-ip` (or `health-cidr`)",
                        e.name
                    ),
                ));
            }
        };
        for (field, ip) in [("node-ip", e.node_ip), ("health-ip", health_ip)] {
            if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
                return Err(err(
                    line,
                    format!(
                        "node {:?}: field `{field}` {ip} is not a unicast node address",
                        e.name
                    ),
                ));
            }
        }
        out.push(Node {
            name: e.name,
            node_ip: e.node_ip,
            health_ip,
        });
    }
    NodeSet::new(out).map_err(|e| err(None, e.to_string()))
}

/// Reads and parses the file.
pub fn load(path: &Path) -> Result<NodeSet, NodesFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| NodesFileError {
        path: path.display().to_string(),
        line: None,
        message: format!("cannot read: {e}"),
    })?;
    parse(path, &text)
}

/// serde's messages end in " at line L column C"; the line is shown up front.
fn strip_location(msg: &str) -> String {
    msg.find(" at line ")
        .map_or_else(|| msg.to_owned(), |i| msg[..i].to_owned())
}

/// The lines (1-based) of the entries' `name` keys, in order: serde
/// reports semantic problems without positions, so entries are found by
/// their name keys.
fn entry_lines(text: &str) -> impl Iterator<Item = usize> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, l)| is_name_key(l))
        .map(|(n, _)| n + 1)
}

fn is_name_key(line: &str) -> bool {
    let t = line.trim_start().trim_start_matches(['-', '{', ' ']);
    t.starts_with("name:") || t.starts_with("\"name\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "nodes:\n  - name: node-2\n    node-ip: 198.18.0.12\n    health-cidr: 198.18.65.0/24\n  - name: node-1\n    node-ip: 198.18.0.11\n    health-ip: 198.18.64.2\n";

    fn yaml(text: &str) -> Result<NodeSet, NodesFileError> {
        parse(Path::new("nodes.yaml"), text)
    }

    fn json(text: &str) -> Result<NodeSet, NodesFileError> {
        parse(Path::new("nodes.json"), text)
    }

    #[test]
    fn yaml_and_json_give_the_same_sorted_set() {
        let from_yaml = yaml(YAML).expect("valid");
        let from_json = json(
            r#"{"nodes": [
            {"name": "node-2", "node-ip": "198.18.0.12", "health-cidr": "198.18.65.0/24"},
            {"name": "node-1", "node-ip": "198.18.0.11", "health-ip": "198.18.64.2"}]}"#,
        )
        .expect("valid");
        assert_eq!(from_yaml, from_json);
        assert_eq!(from_yaml[0].name, "node-1");
        assert_eq!(
            from_yaml[1].health_ip,
            Ipv4Addr::new(198, 18, 65, 2),
            "first usable of the CIDR"
        );
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = yaml("nodes:\n  - name: a\n    node-ip: [\n").expect_err("bad");
        assert!(e.line.is_some(), "{e}");
        assert!(e.to_string().starts_with("nodes.yaml:"), "{e}");
        let e = json("{\"nodes\": [\n  {\"name\": \"a\",\n   \"node-ip\": \"198.18.0.1\",,\n")
            .expect_err("bad");
        assert_eq!(e.line, Some(3), "{e}");
    }

    #[test]
    fn bad_addresses_name_line_and_field() {
        let e =
            yaml("nodes:\n  - name: a\n    node-ip: 198.18.0.300\n    health-ip: 198.18.64.2\n")
                .expect_err("bad");
        assert_eq!(e.line, Some(3), "{e}");
        assert!(
            e.message.contains("node-ip") && e.message.contains("invalid IPv4 address"),
            "{e}"
        );
        let e = yaml("nodes:\n  - name: a\n    node-ip: 0.0.0.0\n    health-ip: 198.18.64.2\n")
            .expect_err("bad");
        assert!(e.message.contains("`node-ip`"), "{e}");
        let e =
            yaml("nodes:\n  - name: a\n    node-ip: 198.18.0.1\n    health-cidr: 198.18.64.1/24\n")
                .expect_err("bad");
        assert!(e.message.contains("198.18.64.1/24"), "{e}");
    }

    #[test]
    fn duplicates_and_missing_fields_are_named() {
        let dup = "nodes:\n  - name: a\n    node-ip: 198.18.0.1\n    health-ip: 198.18.64.2\n  - name: a\n    node-ip: 198.18.0.2\n    health-ip: 198.18.65.2\n";
        let e = yaml(dup).expect_err("duplicate");
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("duplicate node \"a\""), "{e}");
        let e = yaml("nodes:\n  - name: b\n    node-ip: 198.18.0.1\n").expect_err("missing");
        assert!(e.message.contains("health-ip"), "{e}");
        let e = yaml("nodes:\n  - name: b\n    node-ip: 198.18.0.1\n    health-ip: 198.18.64.2\n    colour: red\n").expect_err("unknown");
        assert!(e.message.contains("colour"), "{e}");
    }
}
