//! A node of the cluster and the node set: an immutable snapshot, sorted by
//! name with names unique (the constructor enforces both), shared by every
//! reader without copying.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    ops::Deref,
    sync::Arc,
};

use serde::{Deserialize, Serialize};

/// One node of the cluster: a node and a health address in each family it
/// has (validation makes sure it has at least one, and that a family's node
/// address comes with its health address). IPv4 is the primary family when
/// the node has both, as in Cilium.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// The node's own IPv4 address: ICMP to its stack, HTTP to its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<Ipv4Addr>,
    /// The IPv4 address of the node's health endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_ip: Option<Ipv4Addr>,
    /// The node's own IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ip6: Option<Ipv6Addr>,
    /// The IPv6 address of the node's health endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_ip6: Option<Ipv6Addr>,
    /// The node's failure domain (a rack, a zone): nodes of one zone probe
    /// each other in full whatever `--probe-peers` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl Node {
    /// An IPv4-only node.
    #[must_use]
    pub fn v4(name: impl Into<String>, node_ip: Ipv4Addr, health_ip: Ipv4Addr) -> Self {
        Self {
            name: name.into(),
            node_ip: Some(node_ip),
            health_ip: Some(health_ip),
            ..Self::default()
        }
    }

    /// The node's addresses, primary (IPv4) first.
    pub fn node_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.node_ip
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.node_ip6.map(IpAddr::V6))
    }

    /// Its health endpoint's addresses, primary (IPv4) first.
    pub fn health_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.health_ip
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.health_ip6.map(IpAddr::V6))
    }

    /// All its addresses: node and health, both families.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.node_ips().chain(self.health_ips())
    }

    /// The primary node address (IPv4 when it has one).
    #[must_use]
    pub fn primary_node_ip(&self) -> Option<IpAddr> {
        self.node_ips().next()
    }

    /// The primary health address (IPv4 when it has one).
    #[must_use]
    pub fn primary_health_ip(&self) -> Option<IpAddr> {
        self.health_ips().next()
    }
}

/// Two records with the same name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duplicate node {name:?}")]
pub struct DuplicateNode {
    pub name: String,
}

/// The nodes of the cluster, sorted by name, names unique. Cloning shares
/// the snapshot; a change is a new set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSet(Arc<[Node]>);

impl NodeSet {
    /// Sorts `nodes` by name; two with the same name are refused.
    pub fn new(mut nodes: Vec<Node>) -> Result<Self, DuplicateNode> {
        nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = nodes.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(DuplicateNode {
                name: w[0].name.clone(),
            });
        }
        Ok(Self(nodes.into()))
    }

    /// Sorts `nodes` by name; their names are unique already (validation
    /// made sure of it).
    pub(in crate::membership) fn from_unique(mut nodes: Vec<Node>) -> Self {
        nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        debug_assert!(
            nodes.windows(2).all(|w| w[0].name != w[1].name),
            "validated names are unique"
        );
        Self(nodes.into())
    }

    /// The node called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Node> {
        self.0
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.0[i])
    }

    /// Whether a node called `name` is in the set.
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The nodes at `indices` (sorted, as the cluster view's subset plan
    /// gives them), as a set of their own.
    #[must_use]
    pub fn subset(&self, indices: &[usize]) -> Self {
        Self(
            indices
                .iter()
                .filter_map(|&i| self.0.get(i).cloned())
                .collect(),
        )
    }

    /// The records `current` holds of this set's nodes that still have
    /// every address they had here (their other fields may have changed,
    /// and they may have gained addresses).
    #[must_use]
    pub fn still_in(&self, current: &Self) -> Self {
        Self(
            self.0
                .iter()
                .filter_map(|old| {
                    let now = current.get(&old.name)?;
                    old.addresses()
                        .all(|a| now.addresses().any(|b| b == a))
                        .then(|| now.clone())
                })
                .collect(),
        )
    }

    /// Whether both hold the very same snapshot (no comparison of nodes).
    #[must_use]
    pub fn same_snapshot(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
impl NodeSet {
    /// Nodes called `names` (unique), node IPs 198.18.0.1, .2, ... and
    /// health IPs 198.19.0.1, .2, ...: a fixture of the unit tests.
    pub(crate) fn named(names: &[&str]) -> Self {
        let nodes = names
            .iter()
            .zip(1u8..)
            .map(|(name, i)| {
                Node::v4(
                    *name,
                    Ipv4Addr::new(198, 18, 0, i),
                    Ipv4Addr::new(198, 19, 0, i),
                )
            })
            .collect();
        Self::new(nodes).expect("unique names")
    }

    /// `n` nodes called `node-0000`, `node-0001`, ..., node IPs from
    /// 198.18.0.0 and health IPs from 198.19.0.0: a fixture of the unit
    /// tests that need more nodes than a chunk of the prober's takes.
    pub(crate) fn numbered(n: u16) -> Self {
        let nodes = (0..n)
            .map(|i| {
                let [hi, lo] = i.to_be_bytes();
                Node::v4(
                    format!("node-{i:04}"),
                    Ipv4Addr::new(198, 18, hi, lo),
                    Ipv4Addr::new(198, 19, hi, lo),
                )
            })
            .collect();
        Self::new(nodes).expect("unique names")
    }
}

impl Deref for NodeSet {
    type Target = [Node];

    fn deref(&self) -> &[Node] {
        &self.0
    }
}

impl Serialize for NodeSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for NodeSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(Vec::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        let mut sep = " (";
        for ip in self.node_ips() {
            write!(f, "{sep}{ip}")?;
            sep = ", ";
        }
        sep = if sep == ", " {
            ", health "
        } else {
            " (health "
        };
        for ip in self.health_ips() {
            write!(f, "{sep}{ip}")?;
            sep = ", ";
        }
        if sep == ", " {
            f.write_str(")")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, n: u8) -> Node {
        Node::v4(
            name,
            Ipv4Addr::new(198, 18, 0, n),
            Ipv4Addr::new(198, 18, 64 + n, 2),
        )
    }

    #[test]
    fn sorted_by_name_and_searchable() {
        let set = NodeSet::new(vec![node("c", 3), node("a", 1), node("b", 2)]).expect("unique");
        let names: Vec<_> = set.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(
            set.get("b").and_then(|n| n.node_ip),
            Some(Ipv4Addr::new(198, 18, 0, 2))
        );
        assert!(!set.contains("d"));
        let shared = set.clone();
        assert!(shared.same_snapshot(&set));
    }

    #[test]
    fn still_in_keeps_the_nodes_that_kept_their_addresses() {
        let old = NodeSet::new(vec![node("a", 1), node("b", 2), node("c", 3), node("e", 5)])
            .expect("unique");
        // b left, c moved to another address, d joined, e changed zone.
        let e = Node {
            zone: Some("z1".into()),
            ..node("e", 5)
        };
        let now = NodeSet::new(vec![node("a", 1), node("c", 9), node("d", 4), e.clone()])
            .expect("unique");
        let kept = old.still_in(&now);
        let names: Vec<_> = kept.iter().map(|n| n.name.clone()).collect();
        assert_eq!(names, ["a", "e"]);
        assert_eq!(kept.get("e"), Some(&e), "the current record");
        assert!(old.still_in(&NodeSet::default()).is_empty());
    }

    #[test]
    fn duplicates_are_refused_naming_the_node() {
        let err = NodeSet::new(vec![node("a", 1), node("b", 2), node("a", 3)]).expect_err("dup");
        assert_eq!(err.to_string(), "duplicate node \"a\"");
        let err = serde_json::from_str::<NodeSet>(
            r#"[{"name":"x","node_ip":"198.18.0.1","health_ip":"198.18.64.2"},
                {"name":"x","node_ip":"198.18.0.2","health_ip":"198.18.65.2"}]"#,
        )
        .expect_err("dup");
        assert!(err.to_string().contains("duplicate node \"x\""), "{err}");
    }

    #[test]
    fn families_primary_first_and_shown_in_order() {
        let v4 = node("a", 1);
        assert_eq!(v4.to_string(), "a (198.18.0.1, health 198.18.65.2)");
        let dual = Node {
            node_ip6: Some("2001:2::1".parse().expect("ip")),
            health_ip6: Some("2001:2:0:1::2".parse().expect("ip")),
            ..v4
        };
        assert_eq!(
            dual.to_string(),
            "a (198.18.0.1, 2001:2::1, health 198.18.65.2, 2001:2:0:1::2)"
        );
        assert_eq!(
            dual.primary_node_ip(),
            Some(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)))
        );
        let v6 = Node {
            node_ip: None,
            health_ip: None,
            ..dual
        };
        assert_eq!(v6.to_string(), "a (2001:2::1, health 2001:2:0:1::2)");
        assert_eq!(v6.addresses().count(), 2);
        assert!(v6.primary_health_ip().is_some_and(|ip| ip.is_ipv6()));
        // IPv4-only records serialise as before: no IPv6 keys.
        let json = serde_json::to_string(&node("b", 2)).expect("json");
        assert_eq!(
            json,
            r#"{"name":"b","node_ip":"198.18.0.2","health_ip":"198.18.66.2"}"#
        );
    }
}
