//! The subset selection over the whole cluster: every node's picks, what a
//! join or a leave moves, and the selection's figures.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use crate::sim_nodes::node;
use health_agent::{
    cluster::{
        assigned::Assignments,
        subset::{ProbePeers, SubsetPlan},
        summary::{PathSample, PeerSummary, Summary},
    },
    membership::{Node, NodeSet},
    probe::path::ProbeResult,
};

use super::{Cluster, Options, Rng, id_of, ratio};

/// Every node's picks (indices into the set), on every CPU.
fn select_all(plan: &SubsetPlan, peers: ProbePeers) -> Vec<Vec<u32>> {
    let n = plan.len();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let chunk = n.div_ceil(threads).max(1);
    let mut out: Vec<Vec<u32>> = Vec::with_capacity(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|start| {
                s.spawn(move || {
                    (start..(start + chunk).min(n))
                        .map(|i| {
                            plan.assigned_index(i, peers)
                                .into_iter()
                                .map(|j| u32::try_from(j).unwrap_or(u32::MAX))
                                .collect()
                        })
                        .collect::<Vec<Vec<u32>>>()
                })
            })
            .collect();
        for h in handles {
            out.extend(h.join().unwrap_or_default());
        }
    });
    out
}

/// A set's picks by node id.
fn picks_by_id(nodes: &NodeSet, picks: &[Vec<u32>]) -> HashMap<u32, BTreeSet<u32>> {
    picks
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ids = p.iter().map(|&j| id_of(&nodes[j as usize])).collect();
            (id_of(&nodes[i]), ids)
        })
        .collect()
}

/// What a join or a leave changed, over the probers in both sets.
pub(super) struct Movement {
    pub(super) probers: usize,
    pub(super) changed: usize,
    pub(super) moved: usize,
    pub(super) picks: usize,
}

fn movement(a: &HashMap<u32, BTreeSet<u32>>, b: &HashMap<u32, BTreeSet<u32>>) -> Movement {
    let mut m = Movement {
        probers: 0,
        changed: 0,
        moved: 0,
        picks: 0,
    };
    for (id, before) in a {
        let Some(after) = b.get(id) else { continue };
        m.probers += 1;
        m.picks += before.len();
        let moved = before
            .difference(after)
            .count()
            .max(after.difference(before).count());
        m.moved += moved;
        m.changed += usize::from(moved > 0);
    }
    m
}

/// The figures of the selection itself.
pub(super) struct Selection {
    pub(super) time: Duration,
    pub(super) probes_max: usize,
    pub(super) probes_mean: f64,
    /// Largest probes / 4·(K + zone) over the nodes.
    pub(super) budget_ratio: f64,
    pub(super) cluster_probes: usize,
    pub(super) full_mesh_probes: usize,
    pub(super) observers_min: usize,
    pub(super) observers_mean: f64,
    pub(super) join: Movement,
    pub(super) leave: Movement,
    pub(super) leader: LeaderCheck,
}

/// The elected assembler's check of what each observer may report on
/// ([`Assignments`]).
pub(super) struct LeaderCheck {
    /// Every observer's assignment, the first time.
    pub(super) first: Duration,
    /// Checking every observer's honest summary, all new; and again,
    /// none changed.
    pub(super) round_new: Duration,
    pub(super) round_same: Duration,
    /// Again after a join, and how many observers were selected again.
    pub(super) join: Duration,
    pub(super) join_selected: u64,
    /// The same after a leave.
    pub(super) leave: Duration,
    pub(super) leave_selected: u64,
}

/// What the leader does with a node set: carries its assignments over and
/// selects every observer `a` does not hold yet (on every CPU); then an
/// empty summary of each is checked. The time the selection took and the
/// observers selected.
fn check_every(
    a: &mut Assignments,
    nodes: &NodeSet,
    peers: ProbePeers,
) -> anyhow::Result<(Duration, u64)> {
    let before = a.selected();
    let t0 = Instant::now();
    a.update(nodes, Some(peers));
    a.select_all(nodes.iter().map(|n| n.name.as_str()));
    let spent = t0.elapsed();
    let selected = a.selected();
    for n in nodes.iter() {
        // Version 0: no honest summary has it.
        let _ = a.restrict(&Summary::new(n.name.clone(), 1, 1, Vec::new())?, 0);
    }
    anyhow::ensure!(
        a.selected() == selected,
        "{} observers were selected only when their summary was checked",
        a.selected() - selected
    );
    Ok((spent, selected - before))
}

/// Checks the summary of every observer of `nodes` reporting on its
/// `picks` (made a few thousand at a time), each at version `version +`
/// its index, twice: the time each pass of checks took.
fn check_honest(
    a: &mut Assignments,
    nodes: &NodeSet,
    picks: &[Vec<u32>],
    version: u64,
) -> anyhow::Result<[Duration; 2]> {
    const AT_ONCE: usize = 5_000;
    let ok = PathSample::new(ProbeResult::Success, Some(100));
    let mut spent = [Duration::ZERO; 2];
    for (part, some) in picks.chunks(AT_ONCE).enumerate() {
        let summaries = some
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let peers = p
                    .iter()
                    .map(|&j| PeerSummary::new(nodes[j as usize].name.as_str(), [ok; 4]))
                    .collect();
                Summary::new(nodes[part * AT_ONCE + k].name.clone(), 1, 1, peers)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for pass in &mut spent {
            let t0 = Instant::now();
            let left_out: usize = summaries
                .iter()
                .enumerate()
                .filter_map(|(k, s)| a.restrict(s, version + (part * AT_ONCE + k) as u64))
                .map(|(_, n)| n)
                .sum();
            *pass += t0.elapsed();
            anyhow::ensure!(left_out == 0, "{left_out} honest observations left out");
        }
    }
    Ok(spent)
}

/// The leader's check over `nodes` (whose observers picked `picks`), then
/// after `joined`, then after `left` (each from `nodes`).
fn leader_check(
    (nodes, picks): (&NodeSet, &[Vec<u32>]),
    joined: &NodeSet,
    left: &NodeSet,
    peers: ProbePeers,
) -> anyhow::Result<LeaderCheck> {
    let mut a = Assignments::default();
    let (first, _) = check_every(&mut a, nodes, peers)?;
    let [round_new, round_same] = check_honest(&mut a, nodes, picks, 1)?;
    let (join, join_selected) = check_every(&mut a, joined, peers)?;
    check_every(&mut a, nodes, peers)?;
    let (leave, leave_selected) = check_every(&mut a, left, peers)?;
    Ok(LeaderCheck {
        first,
        round_new,
        round_same,
        join,
        join_selected,
        leave,
        leave_selected,
    })
}

/// Probes per node (max, total, mean), the worst ratio to 4·(K + zone),
/// observers per node (min, mean).
fn selection_figures(c: &Cluster, k: usize) -> (usize, usize, f64, f64, usize, f64) {
    let n = c.len();
    let mut observers = vec![0usize; n];
    let (mut max, mut total, mut worst) = (0, 0, 0.0f64);
    for (o, picks) in c.picks.iter().enumerate() {
        let probes = 4 * picks.len();
        max = max.max(probes);
        total += probes;
        worst = worst.max(ratio(probes, 4 * (k + c.zone_size[c.zone[o] as usize])));
        for &t in picks {
            if t as usize != o {
                observers[t as usize] += 1;
            }
        }
    }
    let min = observers.iter().copied().min().unwrap_or(0);
    (
        max,
        total,
        ratio(total, n),
        worst,
        min,
        ratio(observers.iter().sum(), n),
    )
}

pub(super) fn select(
    opts: &Options,
    zones: usize,
    rng: &mut Rng,
) -> anyhow::Result<(Cluster, Selection)> {
    let n = opts.nodes;
    let peers = ProbePeers::Count(opts.peers);
    let zone_of = |id: usize| id * zones / n;
    let base: Vec<Node> = (0..n).map(|id| node(id, zone_of(id))).collect();
    let nodes = NodeSet::new(base.clone())?;
    let t0 = Instant::now();
    let plan = SubsetPlan::new(&nodes);
    let picks = select_all(&plan, peers);
    let time = t0.elapsed();
    let before = picks_by_id(&nodes, &picks);

    // A join (a new node in an existing zone) and a leave.
    let mut joined = base.clone();
    joined.push(node(n, rng.below(zones)));
    let joined = NodeSet::new(joined)?;
    let after_join = picks_by_id(&joined, &select_all(&SubsetPlan::new(&joined), peers));
    let mut left = base;
    left.swap_remove(rng.below(n));
    let left = NodeSet::new(left)?;
    let after_leave = picks_by_id(&left, &select_all(&SubsetPlan::new(&left), peers));
    let (join, leave) = (
        movement(&before, &after_join),
        movement(&before, &after_leave),
    );
    let leader = leader_check((&nodes, &picks), &joined, &left, peers)?;

    let cluster = Cluster::new(nodes, picks);
    let (probes_max, cluster_probes, probes_mean, budget_ratio, observers_min, observers_mean) =
        selection_figures(&cluster, opts.peers);
    Ok((
        cluster,
        Selection {
            time,
            probes_max,
            probes_mean,
            budget_ratio,
            cluster_probes,
            full_mesh_probes: 4 * n * n,
            observers_min,
            observers_mean,
            join,
            leave,
            leader,
        },
    ))
}
