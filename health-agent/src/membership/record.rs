//! A node record under validation: where it comes from ([`Record`],
//! [`Origin`]), what [`super::validate`] checks it against ([`LocalNode`],
//! [`Rule`]), and the outcome of an update ([`Validated`]: the set of the
//! good records, and the rejected ones with why).

use std::{fmt, fmt::Write as _, net::IpAddr, sync::Arc};

use serde::{Deserialize, Serialize};

use super::{Node, NodeSet};
use crate::util::text::clip;
use ipnet::{Ipv4Net, Ipv6Net};

/// The longest node name, in bytes (a DNS name's limit).
pub const MAX_NAME_LEN: usize = 253;

/// Rejected records the API lists for the set in use (the count covers
/// them all).
pub const MAX_REJECTED_SHOWN: usize = 100;

/// Rejected records named in the one warning logged per update.
pub const MAX_REJECTED_LOGGED: usize = 5;

/// This node, as the rules that depend on it see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalNode {
    /// This node's name: its own record is exempt from the CIDR rule and
    /// taken first.
    pub name: Option<String>,
    /// This node's health CIDR: no peer's address may be inside it.
    pub health_cidr: Option<Ipv4Net>,
    /// This node's IPv6 health CIDR, likewise.
    pub health_cidr6: Option<Ipv6Net>,
    /// The cluster's health range (`--health-range`): a peer's IPv4
    /// health address outside it is refused (`None`: not checked).
    pub health_range: Option<Ipv4Net>,
    /// The cluster's IPv6 health range (`--health-range6`), likewise.
    pub health_range6: Option<Ipv6Net>,
}

/// Where a record comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The `entry`-th (1-based) record of the nodes file at `path`, whose
    /// `name` key is on `line` when it could be found.
    File {
        path: Arc<str>,
        line: Option<usize>,
        entry: usize,
    },
    /// The etcd key holding the record; the first `prefix_len` bytes are
    /// the watched prefix.
    Etcd { key: String, prefix_len: usize },
}

/// A node record: where it is and, when it has one, its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub origin: Origin,
    pub name: Option<String>,
}

/// The most of an etcd key shown with a record's verdict (which is logged
/// on every agent and served by `GET /v1/nodes`); the key itself is kept
/// whole, and judged whole.
const MAX_KEY_SHOWN: usize = 512;

impl Record {
    /// Where the record is: `nodes.yaml:12`, `nodes.yaml (node #3)` when
    /// its line is not known, or its etcd key.
    #[must_use]
    pub fn location(&self) -> String {
        match &self.origin {
            Origin::File {
                path,
                line: Some(line),
                ..
            } => format!("{path}:{line}"),
            Origin::File {
                path,
                line: None,
                entry,
            } => format!("{path} (node #{entry})"),
            Origin::Etcd { key, .. } => clip(key, MAX_KEY_SHOWN),
        }
    }

    /// The record as a conflict names its first holder: `node "a" at
    /// nodes.yaml:5`, `node "a" at etcd key "/health/nodes/a"`.
    fn describe(&self) -> String {
        let name = self
            .name
            .as_ref()
            .map_or_else(|| "a node".to_owned(), |n| format!("node {n:?}"));
        match &self.origin {
            Origin::File { .. } => format!("{name} at {}", self.location()),
            Origin::Etcd { key, .. } => {
                format!("{name} at etcd key {:?}", clip(key, MAX_KEY_SHOWN))
            }
        }
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.origin, &self.name) {
            (Origin::Etcd { key, .. }, _) => write!(f, "etcd key {:?}", clip(key, MAX_KEY_SHOWN)),
            (Origin::File { line: Some(_), .. }, Some(name)) => {
                write!(f, "{}: node {name:?}", self.location())
            }
            (Origin::File { path, entry, .. }, Some(name)) => {
                write!(f, "{path}: node #{entry} {name:?}")
            }
            (Origin::File { path, entry, .. }, None) => write!(f, "{path}: node #{entry}"),
        }
    }
}

/// A record's address fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    NodeIp,
    HealthIp,
    NodeIp6,
    HealthIp6,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NodeIp => "node-ip",
            Self::HealthIp => "health-ip",
            Self::NodeIp6 => "node-ip6",
            Self::HealthIp6 => "health-ip6",
        })
    }
}

/// The rule a record breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rule {
    /// The record does not decode (a field missing, of the wrong type, or
    /// not an address); the text says which field.
    #[error("{0}")]
    Malformed(String),
    #[error("the name is empty")]
    EmptyName,
    #[error("the name is {len} bytes long, more than {MAX_NAME_LEN}")]
    NameTooLong { len: usize },
    #[error(
        "the name {name:?} is not a node name (letters, digits, '.', '_' and '-', starting with a letter or digit)"
    )]
    NameCharset { name: String },
    #[error(
        "a node record counts only at exactly <prefix><name>: {name:?} belongs at {expected:?}"
    )]
    KeyNotExact { name: String, expected: String },
    #[error("no address: a node has node-ip and health-ip, node-ip6 and health-ip6, or all four")]
    NoAddress,
    #[error("{has} without {missing}: a family's node and health addresses come together")]
    HalfFamily { has: Field, missing: Field },
    #[error("{field} {ip} is {class}, not a node address")]
    Address {
        field: Field,
        ip: IpAddr,
        class: &'static str,
    },
    #[error("{field} {ip} is inside this node's health CIDR {cidr}")]
    InLocalCidr {
        field: Field,
        ip: IpAddr,
        /// The CIDR as written (either family).
        cidr: String,
    },
    #[error("{node} and {health} are the same address {ip}")]
    SameAddresses {
        node: Field,
        health: Field,
        ip: IpAddr,
    },
    #[error("{field} {ip} is outside the cluster's health range {range} ({flag})")]
    OutsideRange {
        field: Field,
        ip: IpAddr,
        /// The range as written (either family).
        range: String,
        flag: &'static str,
    },
    /// With `--kvstore-allocations`: a health address outside its node's
    /// allocation (the reason names the allocation's key), a node address
    /// where health addresses are allocated, or one other than its
    /// allocation names, or one another node's allocation names.
    #[error("{field} {ip} {reason}")]
    Unallocated {
        field: Field,
        ip: IpAddr,
        reason: String,
    },
    #[error("zone {zone:?}: {reason}")]
    Zone { zone: String, reason: String },
    #[error("duplicate name {name:?}: {} came before it (a name's later records are refused)", .first.describe())]
    DuplicateName { name: String, first: Box<Record> },
    #[error("{field} {ip} is already the {first_field} of {}, which is kept", .first.describe())]
    DuplicateAddress {
        field: Field,
        ip: IpAddr,
        first: Box<Record>,
        first_field: Field,
    },
    #[error(
        "{field} {ip} is also claimed as {other_field} by {}: neither takes it",
        .other.describe()
    )]
    Contested {
        field: Field,
        ip: IpAddr,
        other: Box<Record>,
        other_field: Field,
    },
    #[error("{field} {ip} belongs to node {holder:?}, which held it first and keeps it")]
    Held {
        field: Field,
        ip: IpAddr,
        holder: String,
    },
}

/// A rejected record and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{record}: {rule}")]
pub struct Rejected {
    pub record: Record,
    pub rule: Rule,
}

/// A rejected record as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedRecord {
    /// Where it is: `<path>:<line>` of the nodes file, or the etcd key.
    pub record: String,
    /// Its name, when it has one.
    pub name: Option<String>,
    /// The rule it breaks.
    pub reason: String,
}

impl From<&Rejected> for RejectedRecord {
    fn from(r: &Rejected) -> Self {
        Self {
            record: r.record.location(),
            name: r.record.name.clone(),
            reason: r.rule.to_string(),
        }
    }
}

/// A record to check: where it is, and the node it decoded to or why it
/// did not decode.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub record: Record,
    pub node: Result<Node, String>,
}

/// The outcome of an update: the set of the good records, and the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validated {
    pub nodes: NodeSet,
    /// In the order the records were checked: this node's own first, then
    /// file or key order.
    pub rejected: Vec<Rejected>,
    /// Rejected records not even held to be listed: keys past the most
    /// undecodable ones kept, or too long to be a node's.
    pub unheld: usize,
}

impl Validated {
    /// Every record rejected, listed or not.
    #[must_use]
    pub const fn rejected_total(&self) -> usize {
        self.rejected.len() + self.unheld
    }

    /// One line for the log: the count, then the first few rejections.
    #[must_use]
    pub fn summary(&self) -> Option<String> {
        let n = self.rejected_total();
        if n == 0 {
            return None;
        }
        let mut out = format!(
            "{n} node record{} rejected, {} in use: ",
            if n == 1 { "" } else { "s" },
            self.nodes.len()
        );
        for (i, r) in self.rejected.iter().take(MAX_REJECTED_LOGGED).enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            out.push_str(&r.to_string());
        }
        if self.rejected.len() > MAX_REJECTED_LOGGED {
            let _ = write!(
                out,
                "; and {} more (GET /v1/nodes lists them)",
                self.rejected.len() - MAX_REJECTED_LOGGED
            );
        }
        if self.unheld > 0 {
            let _ = write!(
                out,
                "{}{} not held (records that can never be a node, past the first listed, or keys too long to be a node's)",
                if self.rejected.is_empty() {
                    ""
                } else {
                    "; and "
                },
                self.unheld,
            );
        }
        Some(out)
    }
}
