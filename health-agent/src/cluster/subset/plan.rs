//! A node set's hashes, zones and ring order, computed once for the
//! selections made over it: [`SubsetPlan`].
//!
//! Cost of one prober's selection: the rendezvous half is one pass over
//! the peers' keys (8 bytes and one hash a node); the ring half is about
//! `K/2` steps of a walk along the set in ring order, sorted once for the
//! plan when it is first asked (O(N log N)); its zone is read from an
//! index. [`super::assigned`], which selects for one prober only, finds
//! the ring picks in a pass of their own over the set instead and never
//! sorts.

use std::{collections::HashMap, sync::OnceLock};

use super::{
    NO_ZONE, ProbePeers, mix64, name_hash,
    picks::{Nearest, Reach, Ring, Side, heaviest},
    ring_position,
};
use crate::membership::NodeSet;

/// The hashes, zones and ring order of a node set, computed once:
/// [`SubsetPlan::assigned_index`] then costs one pass of integer work per
/// call.
#[derive(Debug, Clone)]
pub struct SubsetPlan {
    /// Per node, in the set's order.
    entries: Vec<Entry>,
    /// `mix64(name_hash)` per node, in the set's order: the peer's half of
    /// [`super::rendezvous_weight`], all the rendezvous pass reads.
    keys: Vec<u64>,
    /// The zoned nodes' indices, zone after zone, ascending within each.
    zoned: Vec<usize>,
    /// Where each zone number's nodes start in `zoned` (one more entry
    /// than zones: where the last ends).
    zone_starts: Vec<usize>,
    /// Zone numbers by name.
    zone_ids: HashMap<String, u32>,
    /// The set in ring order, sorted when a selection first walks it.
    ring: OnceLock<Ring>,
}

/// What the selection needs of a node as a prober, or to exclude it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// [`name_hash`]: the prober's half of [`super::rendezvous_weight`].
    hash: u64,
    /// [`ring_position`].
    ring: u64,
    /// Zone number ([`NO_ZONE`] for none).
    zone: u32,
}

/// How a selection finds its ring picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Walk {
    /// In one pass over the set: one selection, nothing sorted.
    Pass,
    /// Along the set in ring order: many selections over one plan.
    Ring,
}

impl SubsetPlan {
    /// O(N): one hash per name, one map entry per zone.
    #[must_use]
    pub fn new(nodes: &NodeSet) -> Self {
        let mut zone_ids: HashMap<String, u32> = HashMap::new();
        let entries: Vec<Entry> = nodes
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
                    zone,
                }
            })
            .collect();
        Self::from_entries(entries, zone_ids)
    }

    fn from_entries(entries: Vec<Entry>, zone_ids: HashMap<String, u32>) -> Self {
        let keys = entries.iter().map(|e| mix64(e.hash)).collect();
        // A counting sort by zone number, stable: ascending within a zone.
        let zone_count = zone_ids.len();
        let mut zone_starts = vec![0usize; zone_count + 1];
        for e in entries.iter().filter(|e| (e.zone as usize) < zone_count) {
            zone_starts[e.zone as usize + 1] += 1;
        }
        for z in 1..zone_starts.len() {
            zone_starts[z] += zone_starts[z - 1];
        }
        let mut next = zone_starts.clone();
        let mut members = vec![0usize; zone_starts.last().copied().unwrap_or(0)];
        for (i, e) in entries.iter().enumerate() {
            if (e.zone as usize) < zone_count {
                members[next[e.zone as usize]] = i;
                next[e.zone as usize] += 1;
            }
        }
        Self {
            entries,
            keys,
            zoned: members,
            zone_starts,
            zone_ids,
            ring: OnceLock::new(),
        }
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

    /// What the node at index `me` of the set probes: see
    /// [`super::assigned`].
    #[must_use]
    pub fn assigned_index(&self, me: usize, peers: ProbePeers) -> Vec<usize> {
        match self.entries.get(me) {
            Some(e) => {
                let prober = Prober {
                    hash: e.hash,
                    pos: e.ring,
                    zone: e.zone,
                    index: Some(me),
                };
                self.select(prober, peers, Walk::Ring).0
            }
            None => Vec::new(),
        }
    }

    /// What a node called `me` in `my_zone` probes (see
    /// [`super::assigned`]), and how far the selection reached: which
    /// nodes joining or leaving the set could change it.
    #[must_use]
    pub fn assigned_reach(
        &self,
        me: &str,
        my_zone: Option<&str>,
        nodes: &NodeSet,
        peers: ProbePeers,
    ) -> (Vec<usize>, Reach) {
        self.select(self.prober(me, my_zone, nodes), peers, Walk::Ring)
    }

    /// What a node called `me` in `my_zone` probes, for a single
    /// selection: nothing is sorted.
    pub(super) fn assigned_once(
        &self,
        me: &str,
        my_zone: Option<&str>,
        nodes: &NodeSet,
        peers: ProbePeers,
    ) -> Vec<usize> {
        self.select(self.prober(me, my_zone, nodes), peers, Walk::Pass)
            .0
    }

    fn prober(&self, me: &str, my_zone: Option<&str>, nodes: &NodeSet) -> Prober {
        let h = name_hash(me);
        Prober {
            hash: h,
            pos: ring_position(h),
            zone: my_zone.map_or(NO_ZONE, |z| {
                self.zone_ids.get(z).copied().unwrap_or(NO_ZONE - 1)
            }),
            index: nodes.binary_search_by(|n| n.name.as_str().cmp(me)).ok(),
        }
    }

    /// The selection (see the module's documentation).
    fn select(&self, me: Prober, peers: ProbePeers, walk: Walk) -> (Vec<usize>, Reach) {
        let n = self.len();
        let others = n - usize::from(me.index.is_some());
        let k = match peers {
            ProbePeers::Count(k) if k < others => k,
            _ => return ((0..n).collect(), Reach::everything(me.hash, me.pos)),
        };
        // The nearest nodes after and before `me` on the ring, and the `k`
        // of highest weight (up to `ring_k` of which may be ring picks
        // already), all outside the zone.
        let ring_k = k / 2;
        let caps = (ring_k - ring_k / 2, ring_k / 2);
        let eligible = |i: usize| {
            Some(i) != me.index && (me.zone == NO_ZONE || self.entries[i].zone != me.zone)
        };
        let (after, before) = match walk {
            Walk::Ring => self.ring().sides(me.pos, caps, eligible),
            Walk::Pass => self.sides_in_one_pass(me.pos, caps, eligible),
        };
        let (by_weight, lightest) = heaviest(&self.keys, me.hash, k, eligible);
        // A node can be both after and before `me` when the set is small.
        let mut picked: Vec<usize> = after.picks.iter().chain(&before.picks).copied().collect();
        picked.sort_unstable();
        picked.dedup();
        let ring_picked = picked.len();
        for (_, i) in by_weight {
            if picked.len() >= k {
                break;
            }
            if picked[..ring_picked].binary_search(&i).is_err() {
                picked.push(i);
            }
        }
        let mut out = self.zone_nodes(me.zone).to_vec();
        // The prober, unless its zone's nodes hold it already.
        let in_zone =
            |i: usize| me.zone != NO_ZONE && self.entries.get(i).is_some_and(|e| e.zone == me.zone);
        out.extend(me.index.filter(|&i| !in_zone(i)));
        out.extend(picked);
        out.sort_unstable();
        let reach = Reach {
            me_hash: me.hash,
            me_pos: me.pos,
            after: after.reach,
            before: before.reach,
            lightest,
        };
        (out, reach)
    }

    fn ring(&self) -> &Ring {
        self.ring.get_or_init(|| {
            let positions: Vec<u64> = self.entries.iter().map(|e| e.ring).collect();
            Ring::new(&positions)
        })
    }

    /// Both sides' ring picks found in one pass over the set.
    fn sides_in_one_pass(
        &self,
        me_pos: u64,
        (after, before): (usize, usize),
        eligible: impl Fn(usize) -> bool,
    ) -> (Side, Side) {
        let (mut after, mut before) = (Nearest::new(after), Nearest::new(before));
        for (i, e) in self.entries.iter().enumerate() {
            if eligible(i) {
                after.offer(e.ring.wrapping_sub(me_pos), i);
                before.offer(me_pos.wrapping_sub(e.ring), i);
            }
        }
        (after.finish(), before.finish())
    }

    /// The nodes of zone number `zone`, ascending (none for [`NO_ZONE`]
    /// or a zone no node of the set is in).
    fn zone_nodes(&self, zone: u32) -> &[usize] {
        if zone == NO_ZONE {
            return &[];
        }
        let z = zone as usize;
        match (self.zone_starts.get(z), self.zone_starts.get(z + 1)) {
            (Some(&from), Some(&to)) => &self.zoned[from..to],
            _ => &[],
        }
    }
}

/// The node a selection is for.
#[derive(Clone, Copy, Debug)]
struct Prober {
    /// Its [`name_hash`].
    hash: u64,
    /// Its [`ring_position`].
    pos: u64,
    /// Its zone's number ([`NO_ZONE`] for none).
    zone: u32,
    /// Its index in the set, when it is in it.
    index: Option<usize>,
}

#[cfg(test)]
mod tests;
