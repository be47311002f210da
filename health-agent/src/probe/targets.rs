//! A round's targets: the addresses of every node in the families this
//! agent probes, numbered as their paths are, and each node's path states
//! turned into its status.

use std::{net::IpAddr, sync::Arc};

use super::{
    family::{self, Families, Family, MAX_PATHS, PER_FAMILY, Shown},
    history::NodeRing,
    path::ProbeResult,
    path_record::PathRecord,
    quality::PathQuality,
    status::{Connectivity, NodeStatus},
};
use crate::membership::{Node, NodeSet};

/// A node's paths (`4 * family + kind`, see [`family::path_index`]) and
/// their recent results. Only as many paths as the highest family probed
/// needs (4 for an IPv4-only node): at 5,000 nodes the other four would be
/// 3 MB never used. 64 bytes and the paths (152 bytes each).
#[derive(Debug, Clone, Default)]
pub(super) struct NodePaths {
    pub(super) paths: Vec<KeptPath>,
    pub(super) history: NodeRing,
    /// Liveness echoes (see [`super::liveness`]) by family (at
    /// `Family::index`): early rounds left while the family's paths
    /// disagree with its echoes, and whether its last echo was answered.
    pub(super) echo: [EchoTrack; 2],
    /// Rounds of the nodes that joined (`RoundKind::Joined`) left to this
    /// node while some of its paths have no verdict (see
    /// [`Prober::probe_joined`](super::Prober::probe_joined)).
    pub(super) join_rounds: u8,
}

/// One path as the prober keeps it: its state, and its loss and RTT over
/// the sliding windows.
#[derive(Debug, Clone, Default)]
pub(super) struct KeptPath {
    pub(super) state: PathRecord,
    pub(super) quality: PathQuality,
}

/// One family's liveness echoes to a node (see [`super::liveness`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct EchoTrack {
    /// Early rounds left while the family's paths disagree with its echo.
    pub(super) early_rounds: u8,
    /// Whether the last echo was answered; `None` before the first.
    pub(super) last: Option<bool>,
}

impl NodePaths {
    /// Whether some path `node` is probed over has no verdict yet (see
    /// [`PathRecord::verdict`]).
    pub(super) fn undecided(&self, node: &Node, families: Families) -> bool {
        Shown::of(node, families).probed().any(|f| {
            let at = f.index() * PER_FAMILY;
            (at..at + PER_FAMILY).any(|i| self.state(i).verdict() == ProbeResult::Unknown)
        })
    }

    /// Path `i`'s state (Unknown when never probed).
    pub(super) fn state(&self, i: usize) -> &PathRecord {
        self.paths.get(i).map_or(&PathRecord::UNKNOWN, |p| &p.state)
    }

    /// Path `i`'s windows (`None` when never probed).
    pub(super) fn quality(&self, i: usize) -> Option<&PathQuality> {
        self.paths.get(i).map(|p| &p.quality)
    }

    /// Path `i`, to record into: its family's paths made when it has none.
    fn path_mut(&mut self, i: usize) -> &mut KeptPath {
        if self.paths.len() <= i {
            let len = (i / PER_FAMILY + 1) * PER_FAMILY;
            self.paths
                .resize_with(len.min(MAX_PATHS).max(i + 1), KeptPath::default);
        }
        &mut self.paths[i]
    }

    /// Path `i`'s state, to record into.
    pub(super) fn state_mut(&mut self, i: usize) -> &mut PathRecord {
        &mut self.path_mut(i).state
    }

    /// Path `i`'s windows, to record into.
    pub(super) fn quality_mut(&mut self, i: usize) -> &mut PathQuality {
        &mut self.path_mut(i).quality
    }

    /// Forgets a family's paths.
    pub(super) fn forget(&mut self, family: Family) {
        let at = family.index() * PER_FAMILY;
        if at >= self.paths.len() {
            return;
        }
        let end = (at + PER_FAMILY).min(self.paths.len());
        self.paths[at..end].fill_with(KeptPath::default);
        // The families from the last probed one on go (forgetting IPv4
        // and then IPv6 leaves nothing).
        let keep = self
            .paths
            .iter()
            .rposition(|p| p.state != PathRecord::UNKNOWN)
            .map_or(0, |i| (i / PER_FAMILY + 1) * PER_FAMILY);
        if keep < self.paths.len() {
            self.paths.truncate(keep);
            self.paths.shrink_to_fit();
        }
    }
}

/// A round's probes: ICMP and HTTP to `ips[i]`, the address `keys[i].1`
/// (`2 * family + 0` the node's, `+ 1` its health endpoint's) of node
/// `keys[i].0` of the round's node set. Its paths are `2 * keys[i].1`
/// (ICMP) and `2 * keys[i].1 + 1` (HTTP).
pub(super) struct Targets {
    pub(super) ips: Arc<Vec<IpAddr>>,
    pub(super) keys: Vec<(u32, u8)>,
    /// Each address's node, by [`super::http::node_tag`]: what its hello
    /// answer must name.
    pub(super) tags: Arc<Vec<u32>>,
}

impl Targets {
    /// The family of probe `i` and whether it goes to the health endpoint.
    pub(super) fn kind(&self, i: usize) -> (Family, bool) {
        let a = self.keys[i].1;
        let family = if a >= 2 { Family::Ipv6 } else { Family::Ipv4 };
        (family, a % 2 == 1)
    }
}

/// One warning for the nodes this agent cannot probe: none of their
/// families is one of its own (the count and the first five).
pub(super) fn warn_unprobed(nodes: &NodeSet, families: Families) {
    let mut unprobed = nodes.iter().filter(|n| !Shown::of(n, families).probed);
    let first: Vec<&str> = unprobed.by_ref().take(5).map(|n| n.name.as_str()).collect();
    if !first.is_empty() {
        let count = first.len() + unprobed.count();
        tracing::warn!(
            count,
            first = ?first,
            "nodes with no address of this agent's families ({families}) are not probed (Unknown)"
        );
    }
}

/// How many addresses [`targets`] would probe, without making them.
pub(super) fn target_count(nodes: &[Node], families: Families) -> usize {
    nodes
        .iter()
        .map(|n| {
            Family::ALL
                .into_iter()
                .filter(|&f| families.contains(f) && family::addresses(n, f).is_some())
                .count()
                * 2
        })
        .sum()
}

/// Both addresses of every node in each family it has and this agent
/// probes (primary family first), as [`Targets`] numbers them.
pub(super) fn targets(nodes: &[Node], families: Families) -> Targets {
    let mut ips = Vec::with_capacity(nodes.len() * 2);
    let mut keys = Vec::with_capacity(nodes.len() * 2);
    let mut tags = Vec::with_capacity(nodes.len() * 2);
    for (i, n) in nodes.iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        let tag = super::http::node_tag(n.name.as_bytes());
        for f in Family::ALL {
            if families.contains(f)
                && let Some((ip, health)) = family::addresses(n, f)
            {
                let a = 2 * u8::from(f == Family::Ipv6);
                ips.extend([ip, health]);
                keys.extend([(i, a), (i, a + 1)]);
                tags.extend([tag, tag]);
            }
        }
    }
    Targets {
        ips: Arc::new(ips),
        keys,
        tags: Arc::new(tags),
    }
}

/// A node's status: its primary family's paths as `host` and `endpoint`,
/// the secondary's (when probed) as `host_secondary` and
/// `endpoint_secondary`.
pub(super) fn node_status(n: &Node, p: &NodePaths, shown: Shown) -> NodeStatus {
    let connectivity = |f: Family, endpoint: bool| {
        let (ip, health) = family::addresses(n, f).unwrap_or((f.unspecified(), f.unspecified()));
        let base = f.index() * PER_FAMILY + 2 * usize::from(endpoint);
        let mut c = Connectivity::new(
            if endpoint { health } else { ip },
            p.state(base).to_state(),
            p.state(base + 1).to_state(),
        );
        if !shown.probed {
            let why = format!("not probed: this agent has no {f} address");
            let why: Box<str> = why.into();
            c.icmp.warning = Some(why.clone());
            c.http.warning = Some(why);
        }
        c
    };
    NodeStatus {
        name: n.name.clone(),
        host: connectivity(shown.primary, false),
        endpoint: connectivity(shown.primary, true),
        host_secondary: shown.secondary.map(|f| Box::new(connectivity(f, false))),
        endpoint_secondary: shown.secondary.map(|f| Box::new(connectivity(f, true))),
    }
}
