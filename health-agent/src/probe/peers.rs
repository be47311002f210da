//! `--probe-peers`: whether a node probes every node of the set or a
//! subset of `K` (chosen by the cluster view's subset plan), and the
//! defaults by cluster size.

use std::{fmt, str::FromStr};

/// `K` when the node set is larger than [`FULL_MESH_UP_TO`] and
/// `--probe-peers` is not given.
pub const DEFAULT_PEERS: usize = 32;

/// The largest cluster probed as a full mesh by default.
///
/// A full mesh costs each node 4·(N − 1) probes a round (four paths per
/// peer), 4·N·(N − 1) cluster-wide; a subset costs each node 4·(K + its
/// zone), whatever N. With the default K = 32 and zones of ~20 nodes the
/// subset is ~210 probes a node. Up to 64 nodes the full mesh costs at most
/// 252 probes a node, no more than the subset would, and every node is
/// observed by every other (the view's verdicts have the most evidence). At
/// 1,000 nodes the full mesh would cost 3,996 probes a node and 4 million a
/// round cluster-wide, 19 times the subset, and a summary of every peer
/// would pass the 1.5 KiB each node may write to etcd a round.
pub const FULL_MESH_UP_TO: usize = 64;

/// `--probe-peers`: probe every node, or `K` nodes outside the zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbePeers {
    /// A full mesh: every node of the set.
    All,
    /// Self, its zone and `K` other nodes ([`assigned`](crate::cluster::subset::assigned)). `Count(0)` probes
    /// only the zone (and self); the command line refuses 0.
    Count(usize),
}

impl ProbePeers {
    /// The default for a set of `n_nodes`: [`ProbePeers::All`] up to
    /// [`FULL_MESH_UP_TO`] nodes, `Count(DEFAULT_PEERS)` above.
    #[must_use]
    pub const fn default_for(n_nodes: usize) -> Self {
        if n_nodes <= FULL_MESH_UP_TO {
            Self::All
        } else {
            Self::Count(DEFAULT_PEERS)
        }
    }

    /// Whether this probes every node of a set of `n_nodes`.
    #[must_use]
    pub const fn is_full_mesh(self, n_nodes: usize) -> bool {
        match self {
            Self::All => true,
            // Self plus K others cover the set.
            Self::Count(k) => k.saturating_add(1) >= n_nodes,
        }
    }
}

impl fmt::Display for ProbePeers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::Count(k) => write!(f, "{k}"),
        }
    }
}

/// A `--probe-peers` value that is neither `all` nor a positive integer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid probe peers {value:?}: expected \"all\" or a positive number of peers (e.g. 32)")]
pub struct ProbePeersError {
    pub value: String,
}

impl FromStr for ProbePeers {
    type Err = ProbePeersError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("all") {
            return Ok(Self::All);
        }
        match t.parse::<usize>() {
            Ok(k) if k > 0 => Ok(Self::Count(k)),
            _ => Err(ProbePeersError { value: s.into() }),
        }
    }
}
