//! What an observer may report on: the peers its subset plan assigns to it
//! ([`super::subset`]). A summary's observations of other nodes are left
//! out before the view is assembled, so that an agent (or anyone writing
//! its summary key) cannot speak about nodes it does not probe.
//!
//! Cost: an observer's assignment is one selection over the set's
//! [`SubsetPlan`] (a pass of a hash a node, and about K/2 steps along the
//! ring), computed when its summary is first checked against a node set and kept
//! (about K + zone indices per observer). When the set changes, only the
//! observers a changed node could move are selected again: those of its
//! zone, and those whose selection reached it ([`Reach`]), about K + zone
//! of them per node joined or left; the others' indices are carried over.
//! A change of addresses alone moves nobody. So the leader of 50,000
//! nodes pays milliseconds for a join, not an O(N²) selection of every
//! observer. In a full mesh every node is assigned and nothing is computed.

use std::collections::HashMap;

use crate::{
    cluster::{
        subset::{ProbePeers, Reach, SubsetPlan, name_hash},
        summary::Summary,
    },
    membership::{Node, NodeSet},
};

/// Above this share of the set changed at once (1/8), every observer is
/// selected again: carrying over would cost about as much.
const CARRY_UP_TO_SHARE: usize = 8;

/// Fewer observers than this a thread are selected on the calling one.
const PARALLEL_FROM: usize = 64;

/// The observers' assignments over one node set.
#[derive(Debug, Default)]
pub struct Assignments {
    /// The set and the `--probe-peers` the assignments are for, once set.
    over: Option<(NodeSet, Option<ProbePeers>)>,
    /// `None`: a full mesh (every node assigned to every observer).
    plan: Option<SubsetPlan>,
    /// By observer: its assignment.
    by_observer: HashMap<String, Assigned>,
    /// Observers selected so far, over every set.
    selected: u64,
    /// Calls of [`Self::select_all`] so far.
    listing: u64,
}

/// One observer's assignment, and what it depended on.
#[derive(Debug)]
struct Assigned {
    /// Its assigned peers' indices in the set, sorted.
    peers: Vec<u32>,
    /// Its zone when it was selected.
    zone: Option<String>,
    reach: Reach,
    /// The version of its summary last found to report on assigned
    /// peers only: unchanged, it is not checked again.
    honest: Option<u64>,
    /// The last [`Assignments::select_all`] that listed it.
    listed: u64,
}

/// A node that joined, left or moved zone: what a carried-over
/// assignment is checked against.
struct Changed<'a> {
    hash: u64,
    zone: Option<&'a str>,
}

impl Assignments {
    /// Carries the assignments over when `nodes` or `peers` differ from
    /// the last call's (see the module's documentation).
    pub fn update(&mut self, nodes: &NodeSet, peers: Option<ProbePeers>) {
        if self
            .over
            .as_ref()
            .is_some_and(|(n, p)| n == nodes && *p == peers)
        {
            return;
        }
        let before = self.over.replace((nodes.clone(), peers));
        self.plan = (!self.is_full_mesh()).then(|| SubsetPlan::new(nodes));
        match before {
            Some((old, old_peers)) if old_peers == peers && self.plan.is_some() => {
                self.carry(&old, nodes);
            }
            _ => self.by_observer.clear(),
        }
    }

    /// Keeps the assignments no change between `old` and `new` could
    /// move, with their indices moved to `new`'s.
    fn carry(&mut self, old: &NodeSet, new: &NodeSet) {
        let Some((moved, changed)) = diff(old, new) else {
            self.by_observer.clear();
            return;
        };
        if changed.len().saturating_mul(CARRY_UP_TO_SHARE) > new.len() {
            self.by_observer.clear();
            return;
        }
        let changed_names: std::collections::HashSet<u64> =
            changed.iter().map(|c| c.hash).collect();
        self.by_observer.retain(|name, a| {
            if changed_names.contains(&name_hash(name)) {
                return false;
            }
            let touched = changed.iter().any(|c| {
                (c.zone.is_some() && c.zone == a.zone.as_deref()) || a.reach.touched_by(c.hash)
            });
            if touched {
                return false;
            }
            for i in &mut a.peers {
                match moved.get(*i as usize).copied().flatten() {
                    Some(to) => *i = to,
                    None => return false,
                }
            }
            true
        });
    }

    fn nodes(&self) -> &NodeSet {
        static EMPTY: std::sync::LazyLock<NodeSet> = std::sync::LazyLock::new(NodeSet::default);
        self.over.as_ref().map_or(&EMPTY, |(n, _)| n)
    }

    fn peers(&self) -> ProbePeers {
        let n = self.nodes().len();
        self.over
            .as_ref()
            .and_then(|(_, p)| *p)
            .unwrap_or_else(|| ProbePeers::default_for(n))
    }

    fn is_full_mesh(&self) -> bool {
        self.peers().is_full_mesh(self.nodes().len())
    }

    /// Observers selected so far (each costs a pass over the set's keys).
    #[must_use]
    pub const fn selected(&self) -> u64 {
        self.selected
    }

    /// Selects every observer of `observers` not selected over the set
    /// yet, on every CPU but one (the prober keeps it): what a newly
    /// elected leader does once for the whole cluster (about 0.08-0.1 ms an
    /// observer at 50,000 nodes). The observers not listed are forgotten.
    pub fn select_all<'a>(&mut self, observers: impl IntoIterator<Item = &'a str>) {
        self.listing += 1;
        let listing = self.listing;
        let peers = self.peers();
        let (Some(plan), Some((nodes, _))) = (self.plan.as_ref(), self.over.as_ref()) else {
            return;
        };
        let mut missing: Vec<&str> = Vec::new();
        for o in observers {
            match self.by_observer.get_mut(o) {
                Some(a) => a.listed = listing,
                None => missing.push(o),
            }
        }
        let threads =
            std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1));
        let chunk = missing.len().div_ceil(threads).max(PARALLEL_FROM);
        let one = |o: &&str| ((*o).to_owned(), select(plan, nodes, o, peers));
        let selected: Vec<(String, Assigned)> = std::thread::scope(|s| {
            let mut parts = missing.chunks(chunk);
            let here = parts.next().unwrap_or_default();
            let elsewhere: Vec<_> = parts
                .map(|part| {
                    std::thread::Builder::new()
                        .name("health-select".into())
                        .spawn_scoped(s, move || part.iter().map(one).collect::<Vec<_>>())
                        .map_err(|_| part)
                })
                .collect();
            let mut out: Vec<(String, Assigned)> = here.iter().map(one).collect();
            for part in elsewhere {
                match part {
                    Ok(h) => out.extend(h.join().unwrap_or_default()),
                    // No thread to be had: here, then.
                    Err(part) => out.extend(part.iter().map(one)),
                }
            }
            out
        });
        self.selected += selected.len() as u64;
        for (name, mut a) in selected {
            a.listed = listing;
            self.by_observer.insert(name, a);
        }
        self.by_observer.retain(|_, a| a.listed == listing);
    }

    /// `me`'s assigned peers, as indices in the set, sorted; `None` in a
    /// full mesh.
    fn assigned_to(&mut self, me: &str) -> Option<&[u32]> {
        let peers = self.peers();
        let (plan, (nodes, _)) = (self.plan.as_ref()?, self.over.as_ref()?);
        if !self.by_observer.contains_key(me) {
            let a = select(plan, nodes, me, peers);
            self.selected += 1;
            self.by_observer.insert(me.to_owned(), a);
        }
        self.by_observer.get(me).map(|a| &a.peers[..])
    }

    /// `summary` without its observations of nodes the observer is not
    /// assigned, and how many were left out; `None` when none was.
    /// `version` names the summary's content: a summary found honest is
    /// not checked again at the same version, over the same assignment.
    /// The caller never gives two contents one version.
    pub fn restrict(&mut self, summary: &Summary, version: u64) -> Option<(Summary, usize)> {
        let nodes = self.nodes().clone();
        let me = summary.observer();
        if !self.by_observer.contains_key(me) {
            self.assigned_to(me)?;
        }
        let a = self.by_observer.get_mut(me)?;
        if a.honest == Some(version) {
            return None;
        }
        let assigned = &a.peers;
        let is_assigned = |name: &str| {
            nodes
                .binary_search_by(|n| n.name.as_str().cmp(name))
                .ok()
                .and_then(|i| u32::try_from(i).ok())
                .is_some_and(|i| assigned.binary_search(&i).is_ok())
        };
        // A summary's peers are in strict name order (made or decoded so),
        // as the assigned indices are: one merge.
        let name = |j: usize| assigned.get(j).map(|&i| nodes[i as usize].name.as_str());
        let mut j = 0;
        let left_out = summary
            .peers()
            .iter()
            .filter(|p| {
                while name(j).is_some_and(|n| n < &*p.name) {
                    j += 1;
                }
                name(j) != Some(&*p.name)
            })
            .count();
        if left_out == 0 {
            a.honest = Some(version);
            return None;
        }
        Some((summary.keeping(|p| is_assigned(&p.name)), left_out))
    }
}

/// `me`'s assignment over `nodes`.
fn select(plan: &SubsetPlan, nodes: &NodeSet, me: &str, peers: ProbePeers) -> Assigned {
    let zone = nodes.get(me).and_then(|n| n.zone.clone());
    let (picks, reach) = plan.assigned_reach(me, zone.as_deref(), nodes, peers);
    let mut v: Vec<u32> = picks
        .into_iter()
        .filter_map(|i| u32::try_from(i).ok())
        .collect();
    v.sort_unstable();
    Assigned {
        peers: v,
        zone,
        reach,
        honest: None,
        listed: 0,
    }
}

/// Where each of `old`'s nodes is in `new` (`None`: gone), and the nodes
/// that joined, left or changed zone (a zone change as both its zones);
/// `None` if an index does not fit in `u32`. One merge of the two sorted
/// sets.
fn diff<'a>(old: &'a NodeSet, new: &'a NodeSet) -> Option<(Vec<Option<u32>>, Vec<Changed<'a>>)> {
    let mut moved = Vec::with_capacity(old.len());
    let mut changed = Vec::new();
    let gone = |n: &'a Node| Changed {
        hash: name_hash(&n.name),
        zone: n.zone.as_deref(),
    };
    let (old, new): (&[Node], &[Node]) = (&old[..], &new[..]);
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.name == b.name => {
                if a.zone != b.zone {
                    changed.extend([gone(a), gone(b)]);
                }
                moved.push(Some(u32::try_from(j).ok()?));
                (i, j) = (i + 1, j + 1);
            }
            (Some(a), b) if b.is_none_or(|b| a.name < b.name) => {
                changed.push(gone(a));
                moved.push(None);
                i += 1;
            }
            (_, Some(b)) => {
                changed.push(gone(b));
                j += 1;
            }
            (_, None) => break,
        }
    }
    Some((moved, changed))
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use super::*;
    use crate::{
        cluster::{
            subset,
            summary::{PathSample, PeerSummary},
        },
        membership::Node,
        probe::path::ProbeResult,
    };

    fn set(n: u32) -> NodeSet {
        NodeSet::new(
            (0..n)
                .map(|i| {
                    Node::v4(
                        format!("n{i:03}"),
                        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i),
                        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + i),
                    )
                })
                .collect(),
        )
        .expect("unique")
    }

    fn node(i: u32, zone_size: u32) -> Node {
        let mut n = Node::v4(
            format!("n{i:05}"),
            Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i),
            Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + i),
        );
        n.zone = Some(format!("z{}", i / zone_size));
        n
    }

    /// Every observer's assignment over `nodes`, by name.
    fn every_assignment(a: &mut Assignments, nodes: &NodeSet) -> Vec<Vec<String>> {
        nodes
            .iter()
            .map(|o| {
                a.assigned_to(&o.name)
                    .expect("a subset")
                    .iter()
                    .map(|&i| nodes[i as usize].name.clone())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_change_selects_again_only_the_observers_it_can_move() {
        const ZONE: u32 = 20;
        const K: usize = 32;
        let peers = Some(ProbePeers::Count(K));
        let all: Vec<Node> = (0..2_000).map(|i| node(i, ZONE)).collect();
        let first = NodeSet::new(all.clone()).expect("unique");
        let mut a = Assignments::default();
        a.update(&first, peers);
        every_assignment(&mut a, &first);
        assert_eq!(a.selected(), 2_000);
        let mut joined = all.clone();
        joined.push(node(2_000, ZONE));
        let mut left = all.clone();
        left.remove(777);
        let mut rezoned = all.clone();
        rezoned[1_234].zone = Some("elsewhere".into());
        let mut readdressed = all.clone();
        readdressed[55].node_ip = Some(Ipv4Addr::new(198, 18, 200, 1));
        let mut many = all;
        many.drain(100..180);
        for (what, nodes, most) in [
            ("a join", joined, 3 * K + ZONE as usize),
            ("a leave", left, 3 * K + ZONE as usize),
            ("a zone change", rezoned, 6 * K + 2 * ZONE as usize),
            ("an address change", readdressed, 0),
            ("80 leaving", many, 80 * (3 * K + ZONE as usize)),
        ] {
            let nodes = NodeSet::new(nodes).expect("unique");
            a.update(&first, peers);
            every_assignment(&mut a, &first);
            let before = a.selected();
            a.update(&nodes, peers);
            let carried = every_assignment(&mut a, &nodes);
            let again = a.selected() - before;
            let mut fresh = Assignments::default();
            fresh.update(&nodes, peers);
            assert_eq!(
                carried,
                every_assignment(&mut fresh, &nodes),
                "after {what}"
            );
            assert!(
                again <= most as u64,
                "{what}: {again} observers selected again, at most {most} expected"
            );
            if most > 0 {
                assert!(again >= u64::from(ZONE) - 1, "{what}: its zone at least");
            }
        }
    }

    /// Small sets, near the full mesh's edge, with zones and without:
    /// after random joins, leaves and zone changes, what is carried over
    /// is what a fresh selection gives.
    #[test]
    fn carried_assignments_match_fresh_ones_on_small_random_sets() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut below = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            usize::try_from(seed % n).unwrap_or(0)
        };
        let zone = |z: usize| (z < 3).then(|| format!("z{z}"));
        for trial in 0..300 {
            let k = 2 + below(7);
            let n = k + 2 + below(10);
            let mut nodes: Vec<Node> = (0..n)
                .map(|i| {
                    let mut node = node(u32::try_from(i).unwrap_or(0), 1);
                    node.zone = zone(below(5));
                    node
                })
                .collect();
            let peers = Some(ProbePeers::Count(k));
            let first = NodeSet::new(nodes.clone()).expect("unique");
            let mut a = Assignments::default();
            a.update(&first, peers);
            every_assignment(&mut a, &first);
            for step in 0..=below(3) {
                match below(3) {
                    0 => {
                        let mut joined = node(u32::try_from(1_000 + step).unwrap_or(0), 1);
                        joined.name = format!("j{trial}-{step}");
                        joined.zone = zone(below(5));
                        nodes.push(joined);
                    }
                    1 if nodes.len() > 1 => {
                        nodes.remove(below(nodes.len() as u64));
                    }
                    _ => {
                        let i = below(nodes.len() as u64);
                        nodes[i].zone = zone(below(5));
                    }
                }
            }
            let next = NodeSet::new(nodes).expect("unique");
            a.update(&next, peers);
            let mut fresh = Assignments::default();
            fresh.update(&next, peers);
            assert_eq!(
                every_assignment_or_mesh(&mut a, &next),
                every_assignment_or_mesh(&mut fresh, &next),
                "trial {trial}: k {k}, {n} nodes, then {}",
                next.len()
            );
        }
    }

    /// [`every_assignment`], or nothing in a full mesh.
    fn every_assignment_or_mesh(a: &mut Assignments, nodes: &NodeSet) -> Option<Vec<Vec<String>>> {
        nodes
            .first()
            .and_then(|n| a.assigned_to(&n.name).map(|_| ()))
            .map(|()| every_assignment(a, nodes))
    }

    fn about(name: &str) -> PeerSummary {
        let ok = PathSample::new(ProbeResult::Success, Some(100));
        PeerSummary::new(name, [ok; 4])
    }

    #[test]
    fn observations_of_unassigned_nodes_are_left_out() {
        let nodes = set(200);
        let peers = Some(ProbePeers::Count(8));
        let mut a = Assignments::default();
        a.update(&nodes, peers);
        let mine = subset::assigned("n000", None, &nodes, ProbePeers::Count(8));
        let assigned: Vec<PeerSummary> = mine
            .iter()
            .filter(|&&i| i != 0)
            .map(|&i| about(&nodes[i].name))
            .collect();
        let honest = Summary::new("n000".into(), 1, 1, assigned.clone()).expect("summary");
        assert!(a.restrict(&honest, 1).is_none(), "nothing to leave out");
        // The same, plus reports on every other node.
        let all: Vec<PeerSummary> = nodes.iter().skip(1).map(|n| about(&n.name)).collect();
        let liar = Summary::new("n000".into(), 2, 2, all)
            .expect("summary")
            .with_cadence(Duration::from_secs(300));
        let (kept, left_out) = a.restrict(&liar, 2).expect("restricted");
        assert!(
            a.restrict(&liar, 2).is_some(),
            "a liar is checked every time"
        );
        assert!(
            a.restrict(&liar, 1).is_none(),
            "version 1 was found honest: not checked again"
        );
        assert_eq!(left_out, 199 - assigned.len());
        assert_eq!(kept.peers(), honest.peers());
        assert_eq!((kept.seq(), kept.at_ms()), (2, 2));
        assert_eq!(
            kept.cadence_ms(),
            300_000,
            "judged at its own cadence still"
        );
        // Observers no longer listed are forgotten; those listed are not
        // selected again.
        let before = a.selected();
        a.select_all(["n000", "n001"]);
        assert_eq!(a.selected(), before + 1, "n001 only");
        a.select_all(["n001"]);
        assert_eq!(a.by_observer.keys().collect::<Vec<_>>(), ["n001"]);
        // A full mesh assigns everyone.
        a.update(&nodes, Some(ProbePeers::All));
        assert!(a.restrict(&liar, 2).is_none());
    }
}
