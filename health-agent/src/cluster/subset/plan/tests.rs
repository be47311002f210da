use super::*;
use crate::{cluster::test_nodes, membership::Node};

/// The selection by sorting every eligible node: the specification both
/// walks must meet.
fn by_sorting(plan: &SubsetPlan, me: Prober, k: usize) -> (Vec<usize>, Reach) {
    if k >= plan.len() - usize::from(me.index.is_some()) {
        return (
            (0..plan.len()).collect(),
            Reach::everything(me.hash, me.pos),
        );
    }
    let eligible: Vec<usize> = (0..plan.len())
        .filter(|&i| Some(i) != me.index && (me.zone == NO_ZONE || plan.entries[i].zone != me.zone))
        .collect();
    let ring_k = k / 2;
    let side = |cap: usize, distance: &dyn Fn(u64) -> u64| {
        let mut v: Vec<(u64, usize)> = eligible
            .iter()
            .map(|&i| (distance(plan.entries[i].ring), i))
            .collect();
        v.sort_unstable();
        v.truncate(cap);
        let reach = match (cap, v.len() == cap) {
            (0, _) => None,
            (_, true) => v.last().map(|&(d, _)| d),
            (_, false) => Some(u64::MAX),
        };
        (v.into_iter().map(|(_, i)| i).collect::<Vec<_>>(), reach)
    };
    let (after, after_reach) = side(ring_k - ring_k / 2, &|r| r.wrapping_sub(me.pos));
    let (before, before_reach) = side(ring_k / 2, &|r| me.pos.wrapping_sub(r));
    let mut weights: Vec<(std::cmp::Reverse<u64>, usize)> = eligible
        .iter()
        .map(|&i| {
            let w = super::super::rendezvous_weight(me.hash, plan.entries[i].hash);
            (std::cmp::Reverse(w), i)
        })
        .collect();
    weights.sort_unstable();
    weights.truncate(k);
    let lightest = if weights.len() == k {
        weights.last().map_or(0, |(w, _)| w.0)
    } else {
        0
    };
    let mut picked: Vec<usize> = after.iter().chain(&before).copied().collect();
    picked.sort_unstable();
    picked.dedup();
    let ring_picked = picked.len();
    for (_, i) in weights {
        if picked.len() < k && !picked[..ring_picked].contains(&i) {
            picked.push(i);
        }
    }
    let mut out: Vec<usize> = (0..plan.len())
        .filter(|&i| Some(i) == me.index || (me.zone != NO_ZONE && plan.entries[i].zone == me.zone))
        .chain(picked)
        .collect();
    out.sort_unstable();
    let reach = Reach {
        me_hash: me.hash,
        me_pos: me.pos,
        after: after_reach,
        before: before_reach,
        lightest,
    };
    (out, reach)
}

/// Checks every prober of `plan` (and one outside it) under `k`, each
/// in its own zone, in none, in another and in one the plan does not
/// know: both walks select as sorting does.
fn check_every_prober(plan: &SubsetPlan, k: usize, what: &str) {
    let outsider = 0x0123_4567_89ab_cdef;
    let nodes = plan
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.hash, e.zone, Some(i)))
        .chain([(outsider, plan.entries[0].zone, None)]);
    for (n, (hash, zone, index)) in nodes.enumerate() {
        let other_zone = plan.entries[(n + 1) % plan.len()].zone;
        for zone in [zone, NO_ZONE, NO_ZONE - 1, other_zone] {
            let me = Prober {
                hash,
                pos: ring_position(hash),
                zone,
                index,
            };
            let want = by_sorting(plan, me, k);
            for walk in [Walk::Ring, Walk::Pass] {
                let got = plan.select(me, ProbePeers::Count(k), walk);
                assert_eq!(got, want, "{what}, K = {k}, prober {me:?}, {walk:?}");
            }
        }
    }
}

fn set(n: usize, zone_of: impl Fn(usize) -> Option<usize>) -> NodeSet {
    let nodes: Vec<Node> = (0..n)
        .map(|i| {
            let name = format!("node-{i:05}.example");
            test_nodes::node(i, name, zone_of(i).map(|z| format!("zone-{z}")))
        })
        .collect();
    NodeSet::new(nodes).expect("unique")
}

/// A name and each node's zone.
type Layout = (&'static str, fn(usize) -> Option<usize>);

#[test]
fn ring_walks_and_one_pass_select_as_sorting_does() {
    let layouts: [Layout; 4] = [
        ("no zones", |_| None),
        ("zones of 3", |i| Some(i / 3)),
        ("zones of 20", |i| Some(i / 20)),
        // Most nodes in one zone, a few unzoned: the walks pass over long
        // runs of the prober's zone.
        ("one big zone", |i| {
            (i % 9 != 0).then_some(usize::from(i % 50 == 1))
        }),
    ];
    for n in [1, 2, 3, 5, 9, 17, 40, 130] {
        for (name, zone_of) in layouts {
            let plan = SubsetPlan::new(&set(n, zone_of));
            for k in [0, 1, 2, 3, 4, 7, 8, 32] {
                check_every_prober(&plan, k, &format!("{n} nodes, {name}"));
            }
        }
    }
}

#[test]
fn ties_go_to_the_lower_index_on_both_sides_and_by_weight() {
    // Names whose hashes collide cannot be found; nodes sharing a hash
    // (so a ring position and a weight) are made directly. Groups of
    // three share one, and some zones cut through the groups.
    let entries: Vec<Entry> = (0..60u64)
        .map(|i| {
            let hash = mix64(i / 3);
            Entry {
                hash,
                ring: ring_position(hash),
                zone: if i % 7 == 0 { NO_ZONE } else { (i % 4) as u32 },
            }
        })
        .collect();
    let zones = (0..4).map(|z| (format!("z{z}"), z)).collect();
    let plan = SubsetPlan::from_entries(entries, zones);
    for k in [0, 1, 2, 4, 5, 8, 12] {
        check_every_prober(&plan, k, "shared hashes");
    }
}

#[test]
fn zones_are_indexed_in_order() {
    let nodes = set(50, |i| (i % 5 != 0).then_some(i % 3));
    let plan = SubsetPlan::new(&nodes);
    for z in 0..3u32 {
        let want: Vec<usize> = (0..50).filter(|&i| plan.entries[i].zone == z).collect();
        assert!(want.len() > 10, "zone {z}: {want:?}");
        assert_eq!(plan.zone_nodes(z), want, "zone {z}");
    }
    let none: &[usize] = &[];
    assert_eq!(plan.zone_nodes(NO_ZONE), none);
    assert_eq!(plan.zone_nodes(NO_ZONE - 1), none, "a zone no node is in");
    assert_eq!(plan.zone_nodes(3), none);
}
