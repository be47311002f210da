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
//! Cost: one pass over the node set per call, O(N) (plus O(log K) for the
//! few nodes that enter a pick buffer); no allocation but the result and
//! two buffers of at most K entries. [`SubsetPlan`] keeps the names' hashes
//! for callers that compute many assignments over one node set (a
//! simulation, or the view's observers).

use std::{cmp::Reverse, collections::BinaryHeap, collections::HashMap};

use crate::membership::NodeSet;

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

/// The hashes and zones of a node set, computed once: [`SubsetPlan::assigned`]
/// then costs one pass of integer work per call.
#[derive(Debug, Clone)]
pub struct SubsetPlan {
    /// Per node, in the set's order.
    entries: Vec<Entry>,
    /// Zone numbers by name.
    zone_ids: HashMap<String, u32>,
}

/// What the selection needs of a node, together for one pass.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// [`name_hash`]: the prober's half of [`rendezvous_weight`].
    hash: u64,
    /// [`ring_position`].
    ring: u64,
    /// `mix64(name_hash)`: the peer's half of [`rendezvous_weight`].
    key: u64,
    /// Zone number ([`NO_ZONE`] for none).
    zone: u32,
}

impl SubsetPlan {
    /// O(N): one hash per name, one map entry per zone.
    #[must_use]
    pub fn new(nodes: &NodeSet) -> Self {
        let mut zone_ids: HashMap<String, u32> = HashMap::new();
        let entries = nodes
            .iter()
            .map(|n| {
                let zone = match &n.zone {
                    None => NO_ZONE,
                    Some(z) => {
                        let next = u32::try_from(zone_ids.len()).unwrap_or(NO_ZONE - 1);
                        *zone_ids.entry(z.clone()).or_insert(next)
                    }
                };
                let h = name_hash(&n.name);
                Entry {
                    hash: h,
                    ring: ring_position(h),
                    key: mix64(h),
                    zone,
                }
            })
            .collect();
        Self { entries, zone_ids }
    }

    /// Nodes in the plan.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the plan has no nodes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What the node at index `me` of the set probes: see [`assigned`].
    #[must_use]
    pub fn assigned_index(&self, me: usize, peers: ProbePeers) -> Vec<usize> {
        match self.entries.get(me) {
            Some(e) => {
                self.select_hashed(e.hash, e.ring, e.zone, Some(me), peers)
                    .0
            }
            None => Vec::new(),
        }
    }

    /// What a node called `me` in `my_zone` probes: see [`assigned`].
    #[must_use]
    pub fn assigned(
        &self,
        me: &str,
        my_zone: Option<&str>,
        nodes: &NodeSet,
        peers: ProbePeers,
    ) -> Vec<usize> {
        self.assigned_reach(me, my_zone, nodes, peers).0
    }

    /// [`Self::assigned`], and how far the selection reached: which nodes
    /// joining or leaving the set could change it.
    #[must_use]
    pub fn assigned_reach(
        &self,
        me: &str,
        my_zone: Option<&str>,
        nodes: &NodeSet,
        peers: ProbePeers,
    ) -> (Vec<usize>, Reach) {
        let index = nodes.binary_search_by(|n| n.name.as_str().cmp(me)).ok();
        let zone = my_zone.map_or(NO_ZONE, |z| {
            self.zone_ids.get(z).copied().unwrap_or(NO_ZONE - 1)
        });
        let h = name_hash(me);
        self.select_hashed(h, ring_position(h), zone, index, peers)
    }

    /// The selection: one pass over the set. `me_hash` is the prober's
    /// [`name_hash`], `me_pos` its ring position.
    fn select_hashed(
        &self,
        me_hash: u64,
        me_pos: u64,
        zone: u32,
        me: Option<usize>,
        peers: ProbePeers,
    ) -> (Vec<usize>, Reach) {
        let n = self.len();
        let others = n - usize::from(me.is_some());
        let k = match peers {
            ProbePeers::Count(k) if k < others => k,
            _ => return ((0..n).collect(), Reach::everything(me_hash, me_pos)),
        };
        let ring_k = k / 2;
        // The nearest nodes after and before `me` on the ring, and the `k`
        // of highest weight (up to `ring_k` of which may be ring picks
        // already), all outside the zone.
        let mut after = Nearest::new(ring_k - ring_k / 2);
        let mut before = Nearest::new(ring_k / 2);
        let mut heaviest: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::with_capacity(k + 1);
        // The lightest weight kept once `heaviest` is full: most nodes
        // weigh less and cost one comparison.
        let mut floor = 0u64;
        let mut out = Vec::with_capacity(k + 16);
        for (i, e) in self.entries.iter().enumerate() {
            if Some(i) == me || (zone != NO_ZONE && e.zone == zone) {
                out.push(i);
                continue;
            }
            after.offer(e.ring.wrapping_sub(me_pos), i);
            before.offer(me_pos.wrapping_sub(e.ring), i);
            // `rendezvous_weight(name_hash(me), name_hash(peer))`.
            let w = mix64(me_hash ^ e.key);
            if k == 0 || (heaviest.len() == k && w < floor) {
                continue;
            }
            // Ties go to the lower index (the smaller name).
            let entry = Reverse((w, usize::MAX - i));
            if heaviest.len() < k {
                heaviest.push(entry);
            } else if heaviest.peek().is_some_and(|min| entry < *min) {
                heaviest.pop();
                heaviest.push(entry);
            }
            if heaviest.len() == k {
                floor = heaviest.peek().map_or(0, |Reverse((w, _))| *w);
            }
        }
        // A node can be both after and before `me` when the set is small.
        let mut picked: Vec<usize> = after.indices().chain(before.indices()).collect();
        picked.sort_unstable();
        picked.dedup();
        let mut by_weight: Vec<(u64, usize)> = heaviest
            .into_iter()
            .map(|Reverse((w, j))| (w, usize::MAX - j))
            .collect();
        by_weight.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let ring_picked = picked.len();
        for (_, i) in by_weight {
            if picked.len() >= k {
                break;
            }
            if picked[..ring_picked].binary_search(&i).is_err() {
                picked.push(i);
            }
        }
        out.extend(picked);
        out.sort_unstable();
        let reach = Reach {
            me_hash,
            me_pos,
            after: after.reach(),
            before: before.reach(),
            lightest: floor,
        };
        (out, reach)
    }
}

/// How far one prober's selection reached, outside its zone: a node beyond
/// it (farther on the ring both ways than the farthest ring pick, and
/// lighter than the lightest weight kept) changes nothing by joining the
/// set or leaving it. The prober's own zone is the caller's to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    me_hash: u64,
    me_pos: u64,
    /// The farthest ring distance kept after the prober; `None`: no ring
    /// pick after it is made.
    after: Option<u64>,
    /// The same, before it.
    before: Option<u64>,
    /// The lightest rendezvous weight kept (0 while fewer than `K` were
    /// offered: every weight counts).
    lightest: u64,
}

impl Reach {
    /// Every node counts: the selection took the whole set.
    const fn everything(me_hash: u64, me_pos: u64) -> Self {
        Self {
            me_hash,
            me_pos,
            after: Some(u64::MAX),
            before: Some(u64::MAX),
            lightest: 0,
        }
    }

    /// Whether a node of [`name_hash`] `h`, outside the prober's zone,
    /// could change the selection by joining or leaving. Ties count: the
    /// answer errs towards selecting again.
    #[must_use]
    pub const fn touched_by(&self, h: u64) -> bool {
        let ring = ring_position(h);
        let after = ring.wrapping_sub(self.me_pos);
        let before = self.me_pos.wrapping_sub(ring);
        matches!(self.after, Some(limit) if after <= limit)
            || matches!(self.before, Some(limit) if before <= limit)
            || rendezvous_weight(self.me_hash, h) >= self.lightest
    }
}

/// The `cap` smallest distances offered, with their indices (ties to the
/// lower index).
struct Nearest {
    cap: usize,
    /// Sorted ascending by (distance, index).
    items: Vec<(u64, usize)>,
    /// The largest distance kept once full (`u64::MAX` before): most
    /// offers are farther and cost one comparison.
    limit: u64,
}

impl Nearest {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            items: Vec::with_capacity(cap + 1),
            limit: u64::MAX,
        }
    }

    #[inline]
    fn offer(&mut self, distance: u64, index: usize) {
        if distance > self.limit || self.cap == 0 {
            return;
        }
        let item = (distance, index);
        if self.items.len() == self.cap && self.items.last().is_some_and(|last| item >= *last) {
            return;
        }
        let at = self.items.partition_point(|x| *x < item);
        self.items.insert(at, item);
        self.items.truncate(self.cap);
        if self.items.len() == self.cap {
            self.limit = self.items.last().map_or(u64::MAX, |&(d, _)| d);
        }
    }

    fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.items.iter().map(|&(_, i)| i)
    }

    /// The farthest distance a newcomer could be kept at (`None` when
    /// nothing is kept).
    const fn reach(&self) -> Option<u64> {
        if self.cap == 0 {
            None
        } else {
            Some(self.limit)
        }
    }
}

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
/// One pass over the set: build a [`SubsetPlan`] once instead when computing
/// the assignment of many nodes over one set.
#[must_use]
pub fn assigned(me: &str, my_zone: Option<&str>, nodes: &NodeSet, peers: ProbePeers) -> Vec<usize> {
    if peers.is_full_mesh(nodes.len()) {
        return (0..nodes.len()).collect();
    }
    SubsetPlan::new(nodes).assigned(me, my_zone, nodes, peers)
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
