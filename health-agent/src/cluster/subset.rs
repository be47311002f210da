//! Which peers a node probes when the cluster is too large for a full mesh
//! (`--probe-peers K`).
//!
//! A node probes:
//!
//! - itself (the prober always has, and the status shows it);
//! - every node of its own zone, when its record has a `zone` (Pingmesh's
//!   first level: a rack or a zone is a complete graph);
//! - `K` nodes outside its zone, chosen by two stable hashes of the names:
//!   - `K/2` are its nearest nodes outside its zone on a hash ring (`K/4`
//!     after it, `K/4` before it, by [`ring_position`]); so every node is
//!     observed by its `K/4` nearest nodes before it and `K/4` after it
//!     (by their ring picks, or as its zone's nodes): the floor under each
//!     node's observers;
//!   - the rest are the nodes of highest rendezvous weight
//!     ([`rendezvous_weight`] of the prober's and the peer's names), as
//!     goldpinger does.
//!
//! Rendezvous alone gives each node a Poisson(`K`) number of observers: at
//! `K` = 32 and 50,000 nodes that leaves about 33 nodes with fewer than 16
//! observers (P(X < 16) = 6.6e-4), and nothing bounds the tail. The ring
//! half bounds it: every node has at least `K/2` observers outside its zone
//! whatever the names (given more than `K` nodes).
//!
//! Both halves are deterministic (the same node set gives every agent the
//! same assignment, with no coordination) and move little when a node joins
//! or leaves: on the ring only the `K/2` neighbours of the node change a
//! pick; under rendezvous only the probers that rank the node in their top
//! picks (about `K/2` of them); and its zone's nodes add or drop it. So
//! about `K + zone` probers of N change one peer each: a fraction of about
//! `(K + zone)/N` of the probers (rendezvous alone: `K/N`), and about `1/N`
//! of all picks.
//!
//! The hashes are written here so that they never change with the Rust
//! version or a dependency: FNV-1a (64-bit) over the name's bytes, finished
//! by splitmix64's mixer. Every agent of a cluster must compute the same
//! assignment whatever version built it.
//!
//! Cost: [`assigned`] makes one selection in a few passes over the node
//! set, O(N) (plus O(log K) for the few nodes that enter a pick buffer),
//! with nothing sorted: one to hash the names and index the zones (a
//! [`SubsetPlan`] without its ring order), one for the ring picks and one
//! for the rendezvous picks. [`SubsetPlan`] keeps the names' hashes, the zones' nodes and the set in
//! ring order for callers that select for many probers over one node set
//! (the elected assembler's check of every observer, a simulation): each
//! selection then costs one pass of a hash and a comparison a node (the
//! rendezvous half) and about `K/2` steps along the ring.

mod picks;
mod plan;

use crate::membership::NodeSet;

pub use picks::Reach;
pub use plan::SubsetPlan;

pub use crate::probe::peers::{DEFAULT_PEERS, FULL_MESH_UP_TO, ProbePeers, ProbePeersError};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Keeps the ring's positions independent of the rendezvous weights.
const RING_SEED: u64 = 0x5851_f42d_4c95_7f2d;

/// splitmix64's finaliser: a bijection of u64 with full avalanche.
#[must_use]
const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stable 64-bit hash of a node name: FNV-1a over its bytes, then
/// `mix64`. Fixed forever: agents of different versions must agree.
#[must_use]
pub fn name_hash(name: &str) -> u64 {
    mix64(fnv1a(name.as_bytes()))
}

/// FNV-1a, 64 bits.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// The rendezvous weight of `peer` for `prober`, from their
/// [`name_hash`]es: a prober picks the peers of highest weight.
#[must_use]
pub const fn rendezvous_weight(prober: u64, peer: u64) -> u64 {
    mix64(prober ^ mix64(peer))
}

/// A node's place on the hash ring, from its [`name_hash`].
#[must_use]
pub const fn ring_position(name_hash: u64) -> u64 {
    mix64(name_hash ^ RING_SEED)
}

/// No zone: matches no other node's.
const NO_ZONE: u32 = u32::MAX;

/// The nodes that the node called `me`, in zone `my_zone`, probes: indices
/// into `nodes`, sorted, deterministic.
///
/// With [`ProbePeers::All`], or when `K` covers the set, every node. With
/// `Count(K)`: `me` itself when it is in the set (the prober probes itself
/// and the status shows it), every node whose zone is `my_zone`, and `K`
/// nodes outside the zone (the module's documentation says which). At most
/// `K + zone size` indices (self counted in its zone) and, given more than
/// `K` nodes outside the zone, exactly that many.
///
/// A few passes over the set, nothing sorted: build a [`SubsetPlan`] once
/// instead when computing the assignment of many nodes over one set.
#[must_use]
pub fn assigned(me: &str, my_zone: Option<&str>, nodes: &NodeSet, peers: ProbePeers) -> Vec<usize> {
    if peers.is_full_mesh(nodes.len()) {
        return (0..nodes.len()).collect();
    }
    SubsetPlan::new(nodes).assigned_once(me, my_zone, nodes, peers)
}

/// Who probes each node: `observers[i]` lists the indices of the nodes
/// whose assignment holds `i` (not `i` itself), sorted. O(N) per node:
/// O(N²) in all, for tests and simulations, not the agent (the agent learns
/// its observers from their summaries).
#[must_use]
pub fn observers(plan: &SubsetPlan, peers: ProbePeers) -> Vec<Vec<usize>> {
    let mut observers = vec![Vec::new(); plan.len()];
    for p in 0..plan.len() {
        for q in plan.assigned_index(p, peers) {
            if q != p {
                observers[q].push(p);
            }
        }
    }
    observers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cluster::test_nodes, membership::Node};

    fn set(n: usize, zone_size: Option<usize>) -> NodeSet {
        NodeSet::new((0..n).map(|i| node(i, zone_size)).collect()).expect("unique")
    }

    fn node(i: usize, zone_size: Option<usize>) -> Node {
        let name = format!(
            "ip-10-{}-{}-{}.eu-west-1.compute.internal",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        );
        test_nodes::node(i, name, zone_size.map(|z| format!("rack-{:04}", i / z)))
    }

    fn names(nodes: &NodeSet, picks: &[usize]) -> Vec<String> {
        picks.iter().map(|&i| nodes[i].name.clone()).collect()
    }

    #[test]
    fn parses_and_prints_the_flag() {
        assert_eq!("all".parse::<ProbePeers>(), Ok(ProbePeers::All));
        assert_eq!("ALL".parse::<ProbePeers>(), Ok(ProbePeers::All));
        assert_eq!("32".parse::<ProbePeers>(), Ok(ProbePeers::Count(32)));
        for bad in ["0", "-3", "", "many", "3.5"] {
            let err = bad.parse::<ProbePeers>().expect_err(bad);
            assert!(
                err.to_string()
                    .contains("expected \"all\" or a positive number"),
                "{err}"
            );
        }
        assert_eq!(ProbePeers::All.to_string(), "all");
        assert_eq!(ProbePeers::Count(7).to_string(), "7");
        assert_eq!(ProbePeers::default_for(FULL_MESH_UP_TO), ProbePeers::All);
        assert_eq!(
            ProbePeers::default_for(FULL_MESH_UP_TO + 1),
            ProbePeers::Count(DEFAULT_PEERS)
        );
    }

    /// Every node's picks' names under `K`, folded into one hash; every
    /// 25th node's are selected from its name as well, and must agree.
    fn fingerprint(nodes: &NodeSet, k: usize) -> u64 {
        let plan = SubsetPlan::new(nodes);
        let peers = ProbePeers::Count(k);
        let mut h = FNV_OFFSET;
        for (me, n) in nodes.iter().enumerate() {
            let picks = plan.assigned_index(me, peers);
            if me % 25 == 0 {
                let by_name = assigned(&n.name, n.zone.as_deref(), nodes, peers);
                assert_eq!(picks, by_name, "node {me}, K = {k}");
            }
            for i in picks {
                h = (h ^ fnv1a(nodes[i].name.as_bytes())).wrapping_mul(FNV_PRIME);
            }
        }
        h
    }

    #[test]
    fn the_assignment_is_pinned() {
        // Agents of every version must pick the same peers: a leader
        // checks every observer against its own selection. These values
        // were computed by the one-pass selection that came before the
        // plan's ring order, and must never change.
        let plain = set(3000, None);
        let zoned = set(3000, Some(20));
        let pinned = [
            (fingerprint(&plain, 32), 0x4bdc_88fb_e8f0_0f66),
            (fingerprint(&plain, 7), 0x88bc_f9f8_947d_3e0d),
            (fingerprint(&zoned, 32), 0x5a46_c5d0_46ce_d444),
            (fingerprint(&zoned, 3), 0xf945_72fe_00cd_4111),
        ];
        assert_eq!(pinned.map(|(got, _)| got), pinned.map(|(_, want)| want));
    }

    #[test]
    fn the_hash_is_pinned() {
        // Agents of every version must pick the same peers: these values
        // must never change. FNV-1a's published test vector, then ours
        // (computed independently).
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(name_hash("node-a"), 0x8299_5e46_723a_0e5f);
        assert_eq!(rendezvous_weight(1, 2), 0x3ec2_d42f_3a45_cc6e);
    }

    #[test]
    fn small_sets_and_all_are_a_full_mesh() {
        let nodes = set(10, None);
        let all: Vec<usize> = (0..10).collect();
        assert_eq!(assigned(&nodes[3].name, None, &nodes, ProbePeers::All), all);
        assert_eq!(
            assigned(&nodes[3].name, None, &nodes, ProbePeers::Count(9)),
            all
        );
        let some = assigned(&nodes[3].name, None, &nodes, ProbePeers::Count(4));
        assert_eq!(some.len(), 5, "self and 4: {some:?}");
        assert!(some.contains(&3), "self is included");
    }

    #[test]
    fn assignment_is_deterministic_and_sized() {
        let nodes = set(2000, None);
        let plan = SubsetPlan::new(&nodes);
        for me in [0, 17, 1999] {
            let a = assigned(&nodes[me].name, None, &nodes, ProbePeers::Count(32));
            assert_eq!(a, plan.assigned_index(me, ProbePeers::Count(32)));
            assert_eq!(
                a,
                SubsetPlan::new(&nodes.clone()).assigned_index(me, ProbePeers::Count(32))
            );
            assert_eq!(a.len(), 33, "self and K");
            assert!(a.windows(2).all(|w| w[0] < w[1]), "sorted, unique");
            assert!(a.contains(&me));
        }
        // A node set built in another order is the same set.
        let mut shuffled: Vec<Node> = nodes.iter().rev().cloned().collect();
        shuffled.swap(3, 1000);
        let again = NodeSet::new(shuffled).expect("unique");
        assert_eq!(
            names(
                &nodes,
                &assigned(&nodes[5].name, None, &nodes, ProbePeers::Count(32))
            ),
            names(
                &again,
                &assigned(&nodes[5].name, None, &again, ProbePeers::Count(32))
            )
        );
    }

    #[test]
    fn every_node_has_at_least_half_k_observers() {
        for zone_size in [None, Some(20)] {
            let nodes = set(2000, zone_size);
            let plan = SubsetPlan::new(&nodes);
            let obs = observers(&plan, ProbePeers::Count(32));
            let min = obs.iter().map(Vec::len).min().unwrap_or(0);
            let total: usize = obs.iter().map(Vec::len).sum();
            // The ring's floor: K/2 whatever the names; with zones, at
            // least the zone's other 19 too.
            let floor = if zone_size.is_some() { 19 } else { 16 };
            assert!(
                min >= 16 && min >= floor,
                "zone {zone_size:?}: min {min} observers"
            );
            // Each prober picks K outside its zone and its zone's others.
            let per_prober = if zone_size.is_some() { 32 + 19 } else { 32 };
            assert_eq!(total, 2000 * per_prober, "zone {zone_size:?}");
        }
    }

    #[test]
    fn zones_are_fully_meshed_on_top_of_k() {
        let nodes = set(2000, Some(20));
        let plan = SubsetPlan::new(&nodes);
        for me in 0..nodes.len() {
            let picks = plan.assigned_index(me, ProbePeers::Count(32));
            let zone = nodes[me].zone.as_deref();
            let in_zone = picks
                .iter()
                .filter(|&&i| nodes[i].zone.as_deref() == zone)
                .count();
            assert_eq!(in_zone, 20, "node {me}: the whole zone (self included)");
            assert_eq!(picks.len(), 20 + 32, "node {me}: zone + K");
        }
        // The public entry point agrees, given the zone by name.
        assert_eq!(
            assigned(
                &nodes[45].name,
                nodes[45].zone.as_deref(),
                &nodes,
                ProbePeers::Count(32)
            ),
            plan.assigned_index(45, ProbePeers::Count(32))
        );
    }

    /// Fraction of probers whose picks changed, and of picks that changed,
    /// between two sets (probers present in both; picks compared by name).
    fn movement(a: &NodeSet, b: &NodeSet, k: usize) -> (usize, usize, usize) {
        let (pa, pb) = (SubsetPlan::new(a), SubsetPlan::new(b));
        let (mut probers, mut moved, mut total) = (0, 0, 0);
        for (i, n) in a.iter().enumerate() {
            let Ok(j) = b.binary_search_by(|m| m.name.cmp(&n.name)) else {
                continue;
            };
            let before: std::collections::BTreeSet<_> =
                names(a, &pa.assigned_index(i, ProbePeers::Count(k)))
                    .into_iter()
                    .collect();
            let after: std::collections::BTreeSet<_> =
                names(b, &pb.assigned_index(j, ProbePeers::Count(k)))
                    .into_iter()
                    .collect();
            total += before.len();
            let gone = before.difference(&after).count();
            let new = after.difference(&before).count();
            if gone + new > 0 {
                probers += 1;
            }
            moved += gone.max(new);
        }
        (probers, moved, total)
    }

    #[test]
    fn a_join_or_a_leave_moves_about_k_over_n() {
        let k = 32;
        let nodes = set(2001, None);
        let without_last: Vec<Node> = nodes.iter().take(2000).cloned().collect();
        let small = NodeSet::new(without_last).expect("unique");
        // A join: 2,000 → 2,001; a leave: the reverse.
        for (a, b) in [(&small, &nodes), (&nodes, &small)] {
            let (probers, moved, total) = movement(a, b, k);
            // About K/2 ring neighbours and K/2 rendezvous probers change
            // one pick each.
            assert!(probers <= 2 * k, "{probers} probers changed");
            assert!(probers >= k / 2, "{probers} probers changed");
            assert!(
                moved <= 2 * probers,
                "{moved} picks moved by {probers} probers"
            );
            assert!(moved * 2000 < 2 * total, "{moved} of {total}");
        }
    }
}
