//! What `GET /v1/status` returns, after Cilium's health API.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    family::Family,
    path::{PathState, ProbeResult},
};
use crate::encryption::{EncState, PathEncryption};

/// ICMP and HTTP to one address of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connectivity {
    pub ip: IpAddr,
    /// `ipv4` or `ipv6`: the family of `ip`.
    #[serde(default)]
    pub family: Family,
    pub icmp: PathState,
    pub http: PathState,
    /// Whether probes to `ip` went through WireGuard (`--encryption`).
    /// Boxed: a status holds four of these per node, and without
    /// `--encryption` the field would otherwise carry its room (a sixth
    /// of a node's status) for nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Box<PathEncryption>>,
}

impl Connectivity {
    /// ICMP and HTTP to `ip` (its family taken from it).
    #[must_use]
    pub fn new(ip: impl Into<IpAddr>, icmp: PathState, http: PathState) -> Self {
        let ip = ip.into();
        Self {
            ip,
            family: Family::of(ip),
            icmp,
            http,
            encryption: None,
        }
    }

    #[must_use]
    pub fn summary(&self) -> ProbeResult {
        summarize([self.icmp.result, self.http.result])
    }
}

/// A node's connectivity, as Cilium's health API has it: the primary
/// address's in `host` and `endpoint` (IPv4 when this agent probes the
/// node's IPv4 addresses), the other family's, when it is probed too, in
/// `host_secondary` and `endpoint_secondary` (boxed: a status holds one
/// of these per node, and a single-stack node's would otherwise carry the
/// room of two absent ones, half its size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: String,
    /// Connectivity to the node's own (primary) address ("Host
    /// connectivity").
    pub host: Connectivity,
    /// Connectivity to the node's health endpoint's (primary) address.
    pub endpoint: Connectivity,
    /// Connectivity to the node's address of the other family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_secondary: Option<Box<Connectivity>>,
    /// Connectivity to its health endpoint's address of the other family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_secondary: Option<Box<Connectivity>>,
}

impl NodeStatus {
    /// Every connectivity of the node: primary host and endpoint, then the
    /// secondary ones present.
    pub fn connectivities(&self) -> impl Iterator<Item = &Connectivity> {
        [&self.host, &self.endpoint]
            .into_iter()
            .chain(self.host_secondary.as_deref())
            .chain(self.endpoint_secondary.as_deref())
    }

    /// Every connectivity of the node, to change.
    pub fn connectivities_mut(&mut self) -> impl Iterator<Item = &mut Connectivity> {
        [&mut self.host, &mut self.endpoint]
            .into_iter()
            .chain(self.host_secondary.as_deref_mut())
            .chain(self.endpoint_secondary.as_deref_mut())
    }

    /// The node's worst encryption state over its addresses (a problem
    /// first), when encryption is checked.
    #[must_use]
    pub fn encryption(&self) -> Option<EncState> {
        self.connectivities()
            .filter_map(|c| c.encryption.as_ref().map(|e| e.state))
            .min_by_key(|s| match s {
                EncState::Plaintext => 0,
                EncState::NotCovered => 1,
                EncState::Stale => 2,
                EncState::Unknown => 3,
                EncState::Unobserved => 4,
                EncState::Encrypted => 5,
            })
    }

    /// Reachable: all its paths (four per family probed) succeed.
    #[must_use]
    pub fn reachable(&self) -> bool {
        self.state() == ProbeResult::Success
    }

    /// The node's state over all its paths: Failure if any failed, else
    /// Unknown if any is unknown, else Success.
    #[must_use]
    pub fn state(&self) -> ProbeResult {
        summarize_all(self.connectivities().map(Connectivity::summary))
    }

    /// The state of the node's paths to its own addresses (`endpoint`:
    /// to its health endpoint's), every family probed.
    #[must_use]
    pub fn state_of(&self, endpoint: bool) -> ProbeResult {
        let (primary, secondary) = if endpoint {
            (&self.endpoint, &self.endpoint_secondary)
        } else {
            (&self.host, &self.host_secondary)
        };
        summarize_all(
            std::iter::once(primary)
                .chain(secondary.as_deref())
                .map(Connectivity::summary),
        )
    }
}

/// [`summarize`] over any number of results.
fn summarize_all(results: impl Iterator<Item = ProbeResult>) -> ProbeResult {
    let mut out = ProbeResult::Success;
    for r in results {
        match r {
            ProbeResult::Failure => return ProbeResult::Failure,
            ProbeResult::Unknown => out = ProbeResult::Unknown,
            ProbeResult::Success => {}
        }
    }
    out
}

/// Failure if any failed, else Unknown if any is unknown, else Success.
fn summarize<const N: usize>(results: [ProbeResult; N]) -> ProbeResult {
    if results.contains(&ProbeResult::Failure) {
        ProbeResult::Failure
    } else if results.contains(&ProbeResult::Unknown) {
        ProbeResult::Unknown
    } else {
        ProbeResult::Success
    }
}

/// The round a status comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundInfo {
    /// The round's number in this agent's run (1, 2, ...): rounds are
    /// ordered by it, not by wall-clock times.
    #[serde(default)]
    pub seq: u64,
    /// Epoch milliseconds when the round started.
    pub started_ms: u64,
    pub duration_ms: u64,
    pub probes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub local_node: Option<String>,
    pub probe_interval_ms: u64,
    pub probe_timeout_ms: u64,
    /// `None` until the first round has finished: every path is Unknown.
    pub round: Option<RoundInfo>,
    /// Paths per encryption state, when encryption is checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionSummary>,
    pub nodes: Vec<NodeStatus>,
}

/// The encryption check over every path (`--encryption`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptionSummary {
    /// The WireGuard device judged against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Why no device could be judged against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Addresses per state (`encrypted`, `plaintext`, `not_covered`,
    /// `stale`, `unobserved`, `unknown`), every state named.
    pub paths: std::collections::BTreeMap<String, usize>,
}

impl ClusterStatus {
    #[must_use]
    pub fn reachable(&self) -> usize {
        self.nodes.iter().filter(|n| n.reachable()).count()
    }

    /// Counts only: what a large cluster's operator looks at first.
    #[must_use]
    pub fn summary(&self) -> StatusSummary {
        let mut s = StatusSummary {
            local_node: self.local_node.clone(),
            round: self.round.clone(),
            encryption: self.encryption.clone(),
            nodes: self.nodes.len(),
            reachable: 0,
            unreachable: 0,
            unknown: 0,
        };
        for n in &self.nodes {
            match n.state() {
                ProbeResult::Success => s.reachable += 1,
                ProbeResult::Failure => s.unreachable += 1,
                ProbeResult::Unknown => s.unknown += 1,
            }
        }
        s
    }

    /// The node named `name`. The agent's own status lists its nodes
    /// sorted by name (as its node set holds them): found by bisection,
    /// and by a walk when that misses, so a status in another order still
    /// finds it.
    #[must_use]
    pub fn node(&self, name: &str) -> Option<&NodeStatus> {
        self.nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
            .and_then(|i| self.nodes.get(i))
            .or_else(|| self.nodes.iter().find(|n| n.name == name))
    }

    /// The same status with `node` as its only node (none: no node).
    #[must_use]
    pub fn with_node(mut self, node: Option<NodeStatus>) -> Self {
        self.nodes = node.into_iter().collect();
        self
    }
}

/// `GET /v1/status?summary=true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusSummary {
    pub local_node: Option<String>,
    pub round: Option<RoundInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionSummary>,
    pub nodes: usize,
    /// All its paths succeed.
    pub reachable: usize,
    /// At least one path failed.
    pub unreachable: usize,
    /// Not failed, but at least one path not known yet.
    pub unknown: usize,
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn summaries() {
        use ProbeResult::{Failure, Success, Unknown};
        assert_eq!(summarize([Success, Success]), Success);
        assert_eq!(summarize([Success, Unknown]), Unknown);
        assert_eq!(summarize([Unknown, Failure]), Failure);
    }

    fn path(result: ProbeResult) -> PathState {
        PathState {
            result,
            ..PathState::default()
        }
    }

    fn conn(ip: impl Into<IpAddr>, icmp: ProbeResult, http: ProbeResult) -> Connectivity {
        Connectivity::new(ip, path(icmp), path(http))
    }

    /// A dual-stack node: IPv4 paths all `v4`, IPv6 host ICMP `v6_icmp`
    /// and the other IPv6 paths successful.
    fn dual(v4: ProbeResult, v6_icmp: ProbeResult) -> NodeStatus {
        use ProbeResult::Success;
        NodeStatus {
            name: "n".into(),
            host: conn(Ipv4Addr::new(198, 18, 1, 1), v4, v4),
            endpoint: conn(Ipv4Addr::new(198, 18, 2, 1), v4, v4),
            host_secondary: Some(Box::new(conn(
                "2001:2:0:1::1".parse::<Ipv6Addr>().expect("ip"),
                v6_icmp,
                Success,
            ))),
            endpoint_secondary: Some(Box::new(conn(
                "2001:2:0:2::1".parse::<Ipv6Addr>().expect("ip"),
                Success,
                Success,
            ))),
        }
    }

    #[test]
    fn a_node_is_reachable_only_when_every_path_of_every_family_succeeds() {
        use ProbeResult::{Failure, Success, Unknown};
        assert!(dual(Success, Success).reachable());
        let v6_down = dual(Success, Failure);
        assert!(!v6_down.reachable());
        assert_eq!(v6_down.state(), Failure);
        assert_eq!(v6_down.state_of(false), Failure, "host paths");
        assert_eq!(v6_down.state_of(true), Success, "endpoint paths");
        assert_eq!(dual(Success, Unknown).state(), Unknown);
        assert_eq!(dual(Unknown, Failure).state(), Failure);
        assert_eq!(dual(Failure, Success).state(), Failure);
        let status = ClusterStatus {
            local_node: None,
            probe_interval_ms: 1,
            probe_timeout_ms: 1,
            round: None,
            encryption: None,
            nodes: vec![
                dual(Success, Success),
                dual(Success, Failure),
                dual(Success, Unknown),
            ],
        };
        let s = status.summary();
        assert_eq!((s.reachable, s.unreachable, s.unknown), (1, 1, 1));
        assert_eq!(status.reachable(), 1);
    }

    #[test]
    fn a_node_is_found_by_name_in_sorted_order_and_in_any_other() {
        use ProbeResult::Success;
        let named = |name: &str| NodeStatus {
            name: name.into(),
            ..dual(Success, Success)
        };
        let mut status = ClusterStatus {
            local_node: None,
            probe_interval_ms: 1,
            probe_timeout_ms: 1,
            round: None,
            encryption: None,
            nodes: ["a", "b", "c", "d", "e"].map(named).to_vec(),
        };
        for name in ["a", "c", "e"] {
            assert_eq!(status.node(name).map(|n| n.name.as_str()), Some(name));
        }
        assert!(status.node("bb").is_none());
        // Out of order (a status read from elsewhere): still found.
        status.nodes.reverse();
        for name in ["a", "b", "c", "d", "e"] {
            assert_eq!(status.node(name).map(|n| n.name.as_str()), Some(name));
        }
        assert!(status.node("z").is_none());
        let d = status.node("d").cloned();
        let one = status.clone().with_node(d);
        assert_eq!(one.nodes.len(), 1);
        assert_eq!(one.nodes[0].name, "d");
    }

    #[test]
    fn json_names_each_addresss_family_and_omits_an_absent_secondary() {
        use ProbeResult::Success;
        let v = serde_json::to_value(dual(Success, Success)).expect("json");
        assert_eq!(v["host"]["ip"], "198.18.1.1");
        assert_eq!(v["host"]["family"], "ipv4");
        assert_eq!(v["host_secondary"]["ip"], "2001:2:0:1::1");
        assert_eq!(v["host_secondary"]["family"], "ipv6");
        assert_eq!(v["endpoint_secondary"]["family"], "ipv6");
        assert_eq!(v["endpoint_secondary"]["icmp"]["result"], "success");
        let single = NodeStatus {
            host_secondary: None,
            endpoint_secondary: None,
            ..dual(Success, Success)
        };
        let v = serde_json::to_value(&single).expect("json");
        let mut keys: Vec<&str> = v
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["endpoint", "host", "name"], "{v}");
        let back: NodeStatus = serde_json::from_value(v).expect("back");
        assert_eq!(back, single);
        // An IPv6-only node: its primary is IPv6.
        let v6 = NodeStatus {
            host: conn(
                "2001:2:0:1::9".parse::<Ipv6Addr>().expect("ip"),
                Success,
                Success,
            ),
            ..single
        };
        assert_eq!(
            serde_json::to_value(&v6).expect("json")["host"]["family"],
            "ipv6"
        );
    }
}
