//! The subset selection over the whole cluster: every node's picks, what a
//! join or a leave moves, and the selection's figures.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use crate::sim_nodes::node;
use health_agent::{
    cluster::subset::{ProbePeers, SubsetPlan},
    membership::{Node, NodeSet},
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
        },
    ))
}
