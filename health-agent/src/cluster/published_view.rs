//! The cluster view as the elected assembler publishes it, under its own
//! key beside the summaries (`<`[`view_prefix`]`><assembler>`, on its
//! election lease, so that it goes with the role): the counts by verdict, every node
//! not healthy with its evidence, the round and time it describes, and
//! who assembled it. Every other agent reads only this key.
//!
//! The wire format (version 1, [`VERSION`]) is the protobuf message of
//! `health-agent/proto/view.proto`, as the summaries': one version byte,
//! the message's length as a varint, the message. [`PublishedView::decode`]
//! checks everything (any agent may write the key): the size, the names
//! and zones (by the node records' rules), the interval, and that the counts agree with the nodes listed.
//! [`PublishedView::stale`] is the staleness rule: older than
//! [`STALE_ROUNDS`] of its assembler's rounds.

use prost::Message as _;
use serde::{Deserialize, Serialize};

use crate::{
    cluster::view::{ClusterView, MAX_NAMED, NodeView, Verdict, VerdictCounts},
    membership::record::MAX_NAME_LEN,
};

/// The code prost generates from `proto/view.proto`.
#[allow(
    clippy::all,
    clippy::pedantic,
    unreachable_pub,
    unused_qualifications,
    reason = "generated"
)]
mod proto {
    include!(concat!(env!("OUT_DIR"), "/health.view.v1.rs"));
}

/// The view format's version byte.
pub const VERSION: u8 = 1;

/// The longest message accepted, and the budget the assembler lists the
/// nodes not healthy within (the counts stay exact beyond it).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// The most nodes a view may count (16 × the largest node set accepted).
const MAX_NODES: u64 = 1 << 20;

/// The longest probe interval a view may claim: one hour.
const MAX_INTERVAL_MS: u64 = 3_600_000;

/// A view older than this many of its assembler's probe intervals is
/// stale: shown as such, never as current.
pub const STALE_ROUNDS: u64 = 2;

/// Whether a view assembled at `at_ms` by an agent probing every
/// `interval_ms` is stale at `now_ms`: older than [`STALE_ROUNDS`] of
/// those intervals.
#[must_use]
pub const fn is_stale(at_ms: u64, interval_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(at_ms) > STALE_ROUNDS.saturating_mul(interval_ms)
}

/// The views' prefix beside the node records': `/health/nodes/` gives
/// `/health/view/`; the assembler's view is at `/health/view/<its name>`
/// (a node may write that key alone).
#[must_use]
pub fn view_prefix(node_prefix: &str) -> String {
    crate::membership::kvstore::beside(node_prefix, "view")
}

/// The election's name beside the node records: `/health/nodes/` gives
/// `/health/assembler/` (each candidate's key is below it).
#[must_use]
pub fn election_name(node_prefix: &str) -> String {
    crate::membership::kvstore::beside(node_prefix, "assembler")
}

/// Why a published view was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("empty")]
    Empty,
    #[error("format version {0} (this agent reads version {VERSION})")]
    Version(u8),
    #[error("{len} bytes of message, more than the {MAX_MESSAGE_BYTES} accepted")]
    TooLong { len: usize },
    #[error(
        "its nodes and names would take more than the {MAX_DECODED_BYTES} bytes accepted once decoded"
    )]
    TooCostly,
    #[error("truncated or trailing bytes: the length says {said}, {got} follow")]
    Length { said: usize, got: usize },
    #[error("not a view message: {0}")]
    Decode(String),
    #[error(
        "{what} {name:?}: a name is 1 to {MAX_NAME_LEN} bytes of letters, digits, '.', '_' and '-', the first a letter or digit"
    )]
    Name { what: &'static str, name: String },
    #[error("zone {name:?}: {why}")]
    Zone { name: String, why: String },
    #[error("interval of {0} ms (1 ms to 1 h)")]
    Interval(u64),
    #[error("node {name:?}: verdict code {code} (1 to 4)")]
    Verdict { name: String, code: u32 },
    #[error("node {name:?}: listed twice or out of order")]
    Order { name: String },
    #[error("node {name:?}: {detail}")]
    Evidence { name: String, detail: &'static str },
    #[error(
        "the counts say {counted} nodes not healthy; {listed} are listed and {unlisted} unlisted"
    )]
    Counts {
        counted: u64,
        listed: usize,
        unlisted: u64,
    },
    #[error("{0} nodes counted, more than {MAX_NODES}")]
    TooMany(u64),
    #[error(
        "{unlisted} nodes not healthy left unlisted, with room for {wire_left} bytes more listed: \
         an assembler lists them all until its message is full"
    )]
    Unlisted { unlisted: u64, wire_left: usize },
    #[error("{lossy} nodes counted with lossy paths, of {total} nodes")]
    Lossy { lossy: u64, total: u64 },
    #[error(
        "{plaintext} nodes counted reached in plain text ({named} named, at most {MAX_PLAINTEXT_NAMED}), of {total} nodes"
    )]
    Plaintext {
        plaintext: u64,
        named: usize,
        total: u64,
    },
}

pub use super::view::MAX_PLAINTEXT_NAMED;
pub use cost::{LISTED_DECODED_BYTES, MAX_DECODED_BYTES};

mod cost;

/// One published view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedView {
    /// The agent that assembled it.
    pub assembler: String,
    pub round: u64,
    pub at_ms: u64,
    pub interval_ms: u64,
    /// Nodes not healthy left out of `view.nodes` for size.
    pub unlisted: u64,
    /// The counts, and the nodes not healthy (by name).
    pub view: ClusterView,
}

fn code(v: Verdict) -> u32 {
    match v {
        Verdict::Healthy => 0,
        Verdict::NodeDown => 1,
        Verdict::PathDegraded => 2,
        Verdict::ObserverProblem => 3,
        Verdict::Unknown => 4,
    }
}

fn verdict(name: &str, code: u32) -> Result<Verdict, ViewError> {
    Ok(match code {
        1 => Verdict::NodeDown,
        2 => Verdict::PathDegraded,
        3 => Verdict::ObserverProblem,
        4 => Verdict::Unknown,
        _ => {
            return Err(ViewError::Verdict {
                name: name.to_owned(),
                code,
            });
        }
    })
}

fn node_message(n: &NodeView) -> proto::Node {
    proto::Node {
        name: n.name.clone(),
        zone: n.zone.clone().unwrap_or_default(),
        reporting: n.reporting,
        observers: n.observers,
        seen_reachable: n.seen_reachable,
        failing: n.failing,
        discounted: n.discounted,
        verdict: code(n.verdict),
        failing_observers: n.failing_observers.clone(),
        unreached: n.unreached,
        unreached_nodes: n.unreached_nodes.clone(),
        lossy: n.lossy,
        plaintext: n.plaintext,
    }
}

/// A name in a view follows the node-name rule of the records: what a
/// reader shows (`status --cluster`, the page) holds no control
/// character, escape sequence or space from a view's writer.
fn check_name(what: &'static str, name: &str) -> Result<(), ViewError> {
    crate::membership::validate::check_name(name).map_err(|_| ViewError::Name {
        what,
        name: name.chars().take(64).collect(),
    })
}

/// A zone follows the zone rule of the records.
fn check_zone(zone: &str) -> Result<(), ViewError> {
    crate::membership::validate::zone(zone)
        .map(drop)
        .map_err(|why| ViewError::Zone {
            name: zone.chars().take(64).collect(),
            why,
        })
}

fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The most a listed node takes of the message: its name, its zone and
/// [`MAX_NAMED`] names of each list, each with its tag and length, and its
/// counts.
const LARGEST_NODE_WIRE: usize = (2 * MAX_NAMED + 2) * (MAX_NAME_LEN + 3) + 256;

/// A view leaves nodes unlisted only when those it lists fill what an
/// assembler may list ([`PublishedView::of`] stops at the first that does
/// not fit): less than the largest node's room is left in the message or
/// in what readers decode. A reader takes a node that is not listed for
/// healthy only when none is unlisted, so a view claiming unlisted nodes
/// with room to spare would hide every node it leaves out from the checks
/// against what the readers see themselves.
fn check_full(
    assembler: &str,
    plaintext: &[String],
    wire_listed: usize,
    nodes: &[NodeView],
    unlisted: u64,
) -> Result<(), ViewError> {
    let plaintext_wire: usize = plaintext.iter().map(|n| n.len() + 4).sum();
    let wire_left = MAX_MESSAGE_BYTES
        .saturating_sub(512 + assembler.len())
        .saturating_sub(plaintext_wire)
        .saturating_sub(wire_listed);
    let decoded = cost::head_cost(assembler, plaintext)
        .saturating_add(nodes.iter().map(cost::node_cost).sum::<usize>());
    let decoded_left = LISTED_DECODED_BYTES.saturating_sub(decoded);
    if wire_left >= LARGEST_NODE_WIRE && decoded_left >= cost::LARGEST_NODE_COST {
        return Err(ViewError::Unlisted {
            unlisted,
            wire_left,
        });
    }
    Ok(())
}

/// A view's listed nodes, checked and in order; how many of each verdict;
/// what they take of the message, as the assembler counts it
/// ([`PublishedView::of`]).
fn listed_nodes(
    listed: Vec<proto::Node>,
) -> Result<(Vec<NodeView>, VerdictCounts, usize), ViewError> {
    let mut nodes: Vec<NodeView> = Vec::with_capacity(listed.len());
    let mut by_verdict = VerdictCounts::default();
    let mut wire = 0usize;
    for n in listed {
        wire = wire.saturating_add(n.encoded_len() + 4);
        let n = node_view(n)?;
        if nodes.last().is_some_and(|prev| prev.name >= n.name) {
            return Err(ViewError::Order { name: n.name });
        }
        match n.verdict {
            Verdict::NodeDown => by_verdict.node_down += 1,
            Verdict::PathDegraded => by_verdict.path_degraded += 1,
            Verdict::ObserverProblem => by_verdict.observer_problem += 1,
            Verdict::Unknown | Verdict::Healthy => by_verdict.unknown += 1,
        }
        nodes.push(n);
    }
    Ok((nodes, by_verdict, wire))
}

fn node_view(m: proto::Node) -> Result<NodeView, ViewError> {
    check_name("node", &m.name)?;
    if !m.zone.is_empty() {
        check_zone(&m.zone)?;
    }
    for o in m.failing_observers.iter().chain(&m.unreached_nodes) {
        check_name("named node", o)?;
    }
    let evidence = |detail| ViewError::Evidence {
        name: m.name.clone(),
        detail,
    };
    if m.failing_observers.len() > MAX_NAMED || m.unreached_nodes.len() > MAX_NAMED {
        return Err(evidence("more names than a view lists"));
    }
    if u64::from(m.seen_reachable) + u64::from(m.failing) + u64::from(m.discounted)
        > u64::from(m.observers)
    {
        return Err(evidence(
            "more observers reaching or failing it than observe it",
        ));
    }
    if m.lossy > m.seen_reachable {
        return Err(evidence(
            "more observers reaching it over a lossy path than reach it",
        ));
    }
    if m.plaintext > m.seen_reachable {
        return Err(evidence(
            "more observers reaching it in plain text than reach it",
        ));
    }
    if m.failing_observers.len() > m.failing as usize
        || m.unreached_nodes.len() > m.unreached as usize
    {
        return Err(evidence("more names than its counts"));
    }
    Ok(NodeView {
        verdict: verdict(&m.name, m.verdict)?,
        zone: (!m.zone.is_empty()).then_some(m.zone),
        reporting: m.reporting,
        observers: m.observers,
        seen_reachable: m.seen_reachable,
        failing: m.failing,
        discounted: m.discounted,
        failing_observers: m.failing_observers,
        unreached: m.unreached,
        unreached_nodes: m.unreached_nodes,
        lossy: m.lossy,
        plaintext: m.plaintext,
        name: m.name,
    })
}

/// The nodes reached in plain text: no more than the nodes, named by at
/// most [`MAX_PLAINTEXT_NAMED`] valid names in order, no more names than
/// counted.
fn check_plaintext(m: &proto::View, total: u64) -> Result<(), ViewError> {
    let named = m.plaintext_nodes.len();
    if m.plaintext > total || named > MAX_PLAINTEXT_NAMED || named as u64 > m.plaintext {
        return Err(ViewError::Plaintext {
            plaintext: m.plaintext,
            named,
            total,
        });
    }
    for (i, name) in m.plaintext_nodes.iter().enumerate() {
        check_name("plain-text node", name)?;
        if i > 0 && m.plaintext_nodes[i - 1] >= *name {
            return Err(ViewError::Order { name: name.clone() });
        }
    }
    Ok(())
}

impl PublishedView {
    /// What the view costs decoded, as a reader counts it from the wire
    /// before decoding: the nodes it lists and its names.
    #[must_use]
    pub fn cost(&self) -> usize {
        cost::head_cost(&self.assembler, &self.view.plaintext_nodes)
            + self.view.nodes.iter().map(cost::node_cost).sum::<usize>()
    }

    /// The view to publish of `view` (every node of the set): its counts
    /// and the nodes not healthy, worst first, as many as fit in
    /// [`MAX_MESSAGE_BYTES`].
    #[must_use]
    pub fn of(
        assembler: &str,
        round: u64,
        at_ms: u64,
        interval_ms: u64,
        view: &ClusterView,
    ) -> Self {
        let mut problems: Vec<&NodeView> = view.problems().collect();
        problems.sort_by(|a, b| {
            a.verdict
                .rank()
                .cmp(&b.verdict.rank())
                .then_with(|| a.name.cmp(&b.name))
        });
        // The counts, the header and 64 bytes of slack for field tags, and
        // the names of the nodes whose paths go in plain text.
        let plaintext: usize = view.plaintext_nodes.iter().map(|n| n.len() + 4).sum();
        let mut budget = MAX_MESSAGE_BYTES
            .saturating_sub(512 + assembler.len())
            .saturating_sub(plaintext);
        // What a reader will count it to cost decoded ([`cost`]).
        let mut decoded =
            LISTED_DECODED_BYTES.saturating_sub(cost::head_cost(assembler, &view.plaintext_nodes));
        let mut nodes = Vec::new();
        for n in &problems {
            let (len, takes) = (node_message(n).encoded_len() + 4, cost::node_cost(n));
            if len > budget || takes > decoded {
                break;
            }
            budget -= len;
            decoded -= takes;
            nodes.push((*n).clone());
        }
        // Listed by name, as a view's nodes are ([`ClusterView::node`]).
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            assembler: assembler.to_owned(),
            round,
            at_ms,
            interval_ms,
            unlisted: (problems.len() - nodes.len()) as u64,
            view: ClusterView {
                reports: view.reports,
                ignored: view.ignored,
                counts: view.counts.clone(),
                nodes,
                plaintext_nodes: view.plaintext_nodes.clone(),
            },
        }
    }

    /// The value written: version byte, length, message.
    ///
    /// # Panics
    ///
    /// Never: a `Vec` takes any length.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let c = &self.view.counts;
        let m = proto::View {
            assembler: self.assembler.clone(),
            round: self.round,
            at_ms: self.at_ms,
            interval_ms: self.interval_ms,
            reports: self.view.reports as u64,
            ignored: self.view.ignored as u64,
            healthy: c.healthy as u64,
            node_down: c.node_down as u64,
            path_degraded: c.path_degraded as u64,
            observer_problem: c.observer_problem as u64,
            unknown: c.unknown as u64,
            nodes: self.view.nodes.iter().map(node_message).collect(),
            unlisted: self.unlisted,
            lossy: c.lossy as u64,
            plaintext: c.plaintext as u64,
            plaintext_nodes: self.view.plaintext_nodes.clone(),
        };
        let len = m.encoded_len();
        let mut out = Vec::with_capacity(1 + prost::length_delimiter_len(len) + len);
        out.push(VERSION);
        m.encode_length_delimited(&mut out)
            .expect("a Vec takes any length");
        out
    }

    /// Reads and checks a value written by any agent (or anyone who may
    /// write the key): never panics, and decodes nothing that would take
    /// more than [`MAX_DECODED_BYTES`] (its tags and lengths are
    /// walked first).
    pub fn decode(bytes: &[u8]) -> Result<Self, ViewError> {
        let (&version, mut rest) = bytes.split_first().ok_or(ViewError::Empty)?;
        if version != VERSION {
            return Err(ViewError::Version(version));
        }
        let said = prost::decode_length_delimiter(&mut rest)
            .map_err(|e| ViewError::Decode(e.to_string()))?;
        if said > MAX_MESSAGE_BYTES {
            return Err(ViewError::TooLong { len: said });
        }
        if said != rest.len() {
            return Err(ViewError::Length {
                said,
                got: rest.len(),
            });
        }
        cost::check(rest)?;
        let m = proto::View::decode(rest).map_err(|e| ViewError::Decode(e.to_string()))?;
        check_name("assembler", &m.assembler)?;
        if m.interval_ms == 0 || m.interval_ms > MAX_INTERVAL_MS {
            return Err(ViewError::Interval(m.interval_ms));
        }
        let counted = [m.node_down, m.path_degraded, m.observer_problem, m.unknown]
            .iter()
            .try_fold(0u64, |a, &b| a.checked_add(b))
            .unwrap_or(u64::MAX);
        let total = counted.saturating_add(m.healthy);
        if m.lossy > total {
            return Err(ViewError::Lossy {
                lossy: m.lossy,
                total,
            });
        }
        check_plaintext(&m, total)?;
        if total > MAX_NODES || m.reports > MAX_NODES || m.ignored > MAX_NODES {
            return Err(ViewError::TooMany(total.max(m.reports).max(m.ignored)));
        }
        let listed = m.nodes.len();
        if counted != (listed as u64).saturating_add(m.unlisted) {
            return Err(ViewError::Counts {
                counted,
                listed,
                unlisted: m.unlisted,
            });
        }
        let (nodes, by_verdict, wire_listed) = listed_nodes(m.nodes)?;
        let counts = VerdictCounts {
            healthy: usize_of(m.healthy),
            node_down: usize_of(m.node_down),
            path_degraded: usize_of(m.path_degraded),
            observer_problem: usize_of(m.observer_problem),
            unknown: usize_of(m.unknown),
            lossy: usize_of(m.lossy),
            plaintext: usize_of(m.plaintext),
        };
        if by_verdict.node_down > counts.node_down
            || by_verdict.path_degraded > counts.path_degraded
            || by_verdict.observer_problem > counts.observer_problem
            || by_verdict.unknown > counts.unknown
        {
            return Err(ViewError::Counts {
                counted,
                listed,
                unlisted: m.unlisted,
            });
        }
        if m.unlisted > 0 {
            check_full(
                &m.assembler,
                &m.plaintext_nodes,
                wire_listed,
                &nodes,
                m.unlisted,
            )?;
        }
        Ok(Self {
            assembler: m.assembler,
            round: m.round,
            at_ms: m.at_ms,
            interval_ms: m.interval_ms,
            unlisted: m.unlisted,
            view: ClusterView {
                reports: usize_of(m.reports),
                ignored: usize_of(m.ignored),
                counts,
                nodes,
                plaintext_nodes: m.plaintext_nodes,
            },
        })
    }

    /// How old the view is at `now_ms` (0 when from the future).
    #[must_use]
    pub const fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.at_ms)
    }

    /// Older than [`STALE_ROUNDS`] of its assembler's intervals at `now_ms`.
    #[must_use]
    pub const fn stale(&self, now_ms: u64) -> bool {
        is_stale(self.at_ms, self.interval_ms, now_ms)
    }

    /// How far ahead of `now_ms` its time is (0: not ahead).
    #[must_use]
    pub const fn ahead_ms(&self, now_ms: u64) -> u64 {
        self.at_ms.saturating_sub(now_ms)
    }

    /// The verdict on `name`: as listed, healthy when not listed and the
    /// list is complete, `None` otherwise.
    #[must_use]
    pub fn verdict_on(&self, name: &str) -> Option<Verdict> {
        match self.view.nodes.iter().find(|n| n.name == name) {
            Some(n) => Some(n.verdict),
            None => (self.unlisted == 0).then_some(Verdict::Healthy),
        }
    }
}

#[cfg(test)]
mod tests;
