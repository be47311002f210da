//! The two halves of a prober's picks outside its zone, and how far they
//! reached:
//!
//! - the ring's: the nodes nearest the prober on the hash ring, after it
//!   and before it. Found either in one pass over the set ([`Nearest`]:
//!   one prober's selection, no index needed) or by walking the set
//!   sorted by ring position ([`Ring`]: `K/2` steps a prober, given the
//!   sort, for a caller selecting many probers). Both keep the same nodes:
//!   the smallest distances, ties to the lower index;
//! - rendezvous's: the nodes of highest weight ([`heaviest`]), one pass
//!   over the peers' keys, kept apart from the rest of a node's entry so
//!   that the pass reads 8 bytes a node and tests a zone only for the few
//!   nodes heavy enough to be kept.

use std::{cmp::Reverse, collections::BinaryHeap};

use super::{mix64, ring_position};

/// How far one prober's selection reached, outside its zone: a node beyond
/// it (farther on the ring both ways than the farthest ring pick, and
/// lighter than the lightest weight kept) changes nothing by joining the
/// set or leaving it. The prober's own zone is the caller's to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub(super) me_hash: u64,
    pub(super) me_pos: u64,
    /// The farthest ring distance kept after the prober; `None`: no ring
    /// pick after it is made.
    pub(super) after: Option<u64>,
    /// The same, before it.
    pub(super) before: Option<u64>,
    /// The lightest rendezvous weight kept (0 while fewer than `K` were
    /// offered: every weight counts).
    pub(super) lightest: u64,
}

impl Reach {
    /// Every node counts: the selection took the whole set.
    pub(super) const fn everything(me_hash: u64, me_pos: u64) -> Self {
        Self {
            me_hash,
            me_pos,
            after: Some(u64::MAX),
            before: Some(u64::MAX),
            lightest: 0,
        }
    }

    /// Whether a node of [`super::name_hash`] `h`, outside the prober's
    /// zone, could change the selection by joining or leaving. Ties count:
    /// the answer errs towards selecting again.
    #[must_use]
    pub const fn touched_by(&self, h: u64) -> bool {
        let ring = ring_position(h);
        let after = ring.wrapping_sub(self.me_pos);
        let before = self.me_pos.wrapping_sub(ring);
        matches!(self.after, Some(limit) if after <= limit)
            || matches!(self.before, Some(limit) if before <= limit)
            || super::rendezvous_weight(self.me_hash, h) >= self.lightest
    }
}

/// Ring picks on one side of a prober: their indices, and the farthest
/// distance a newcomer could be kept at (`None` when none is picked;
/// `u64::MAX` while fewer than asked were found).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Side {
    pub(super) picks: Vec<usize>,
    pub(super) reach: Option<u64>,
}

/// The `cap` smallest distances offered, with their indices (ties to the
/// lower index): one side's ring picks in one pass over the set.
pub(super) struct Nearest {
    cap: usize,
    /// Sorted ascending by (distance, index).
    items: Vec<(u64, usize)>,
    /// The largest distance kept once full (`u64::MAX` before): most
    /// offers are farther and cost one comparison.
    limit: u64,
}

impl Nearest {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            items: Vec::with_capacity(cap + 1),
            limit: u64::MAX,
        }
    }

    #[inline]
    pub(super) fn offer(&mut self, distance: u64, index: usize) {
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

    pub(super) fn finish(self) -> Side {
        Side {
            reach: (self.cap > 0).then_some(self.limit),
            picks: self.items.into_iter().map(|(_, i)| i).collect(),
        }
    }
}

/// The set in ring order, both ways: a side's picks are the first
/// eligible nodes met walking from the prober, so finding them costs
/// about as many steps as picks (more only past the prober's zone's nodes
/// or itself).
#[derive(Debug, Clone)]
pub(super) struct Ring {
    /// (position, index), ascending: walking it from a prober's position
    /// meets the nodes after it by growing distance, ties by index.
    after: Vec<(u64, usize)>,
    /// (`!position`, index), ascending: the nodes before a prober, the
    /// same way (`!pos - !me` is `me - pos`).
    before: Vec<(u64, usize)>,
}

impl Ring {
    /// O(N log N): two sorts of the positions.
    pub(super) fn new(positions: &[u64]) -> Self {
        let sorted = |f: fn(u64) -> u64| {
            let mut v: Vec<(u64, usize)> = positions.iter().map(|&p| f(p)).zip(0..).collect();
            v.sort_unstable();
            v
        };
        Self {
            after: sorted(|p| p),
            before: sorted(|p| !p),
        }
    }

    /// The `after` and `before` nearest eligible nodes to a prober at ring
    /// position `me_pos`.
    pub(super) fn sides(
        &self,
        me_pos: u64,
        (after, before): (usize, usize),
        eligible: impl Fn(usize) -> bool,
    ) -> (Side, Side) {
        (
            walk(&self.after, me_pos, after, &eligible),
            walk(&self.before, !me_pos, before, &eligible),
        )
    }
}

/// The first `cap` eligible nodes of `ring` from position `from` on,
/// wrapping round.
fn walk(ring: &[(u64, usize)], from: u64, cap: usize, eligible: impl Fn(usize) -> bool) -> Side {
    if cap == 0 {
        return Side::default();
    }
    let start = ring.partition_point(|&(p, _)| p < from);
    let (behind, ahead) = ring.split_at(start);
    let mut side = Side {
        picks: Vec::with_capacity(cap),
        reach: Some(u64::MAX),
    };
    for &(p, i) in ahead.iter().chain(behind).filter(|&&(_, i)| eligible(i)) {
        side.picks.push(i);
        if side.picks.len() == cap {
            side.reach = Some(p.wrapping_sub(from));
            break;
        }
    }
    side
}

/// The `k` eligible nodes of highest rendezvous weight for the prober of
/// hash `me_hash` (`keys` are the peers' halves of the weight, in the
/// set's order), heaviest first (ties to the lower index), and the
/// lightest weight kept (0 while fewer than `k` were found). `eligible`
/// is asked only of a node heavy enough to be kept.
pub(super) fn heaviest(
    keys: &[u64],
    me_hash: u64,
    k: usize,
    eligible: impl Fn(usize) -> bool,
) -> (Vec<(u64, usize)>, u64) {
    if k == 0 {
        return (Vec::new(), 0);
    }
    // A min-heap of (weight, reversed index): its top is the entry a
    // heavier one replaces.
    let mut kept: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::with_capacity(k + 1);
    // The lightest weight kept once full: most nodes weigh less and cost
    // one hash and one comparison.
    let mut floor = 0u64;
    for (i, &key) in keys.iter().enumerate() {
        // `rendezvous_weight(me_hash, name_hash(peer))`.
        let w = mix64(me_hash ^ key);
        if w < floor || !eligible(i) {
            continue;
        }
        let entry = Reverse((w, usize::MAX - i));
        if kept.len() < k {
            kept.push(entry);
        } else if kept.peek().is_some_and(|min| entry < *min) {
            kept.pop();
            kept.push(entry);
        }
        if kept.len() == k {
            floor = kept.peek().map_or(0, |Reverse((w, _))| *w);
        }
    }
    let mut by_weight: Vec<(u64, usize)> = kept
        .into_iter()
        .map(|Reverse((w, j))| (w, usize::MAX - j))
        .collect();
    by_weight.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    (by_weight, floor)
}
