//! `bench-cluster-sim`: subset probing and the cluster view at 50,000 nodes,
//! simulated in one process with the agent's own code: the selection
//! ([`SubsetPlan`]), the summaries ([`Summary`] made, encoded and decoded
//! every round), the path states ([`PathRecord::record`] with the prober's
//! thresholds) and the view ([`assemble`]).
//!
//! The nodes are in zones (contiguous blocks of about 20 by default). From
//! round [`FAULT_ROUND`] on, five faults hold at once, in distinct nodes
//! outside the partitioned zone:
//!
//! - a node down (it stops answering and publishing; its last summary stays
//!   in etcd until it is [`STALE_ROUNDS`] rounds old);
//! - a link down between two nodes A and B (every path, both ways), B one
//!   of A's peers in another zone;
//! - a zone partitioned from every other zone;
//! - a flapping observer: all its probes fail for [`FLAP_ROUNDS`] rounds,
//!   then succeed for as many, and so on;
//! - an observer whose outgoing probes all fail.
//!
//! Agents' rounds are not in step: the view of round r is assembled (as one
//! agent would) from what etcd held after round r for half the nodes and
//! before it for the other half. An agent writes its summary as the agent
//! does ([`SummaryWrites`]): when its verdicts changed, otherwise every
//! [`HEARTBEAT_ROUNDS`] rounds. The run starts from a cluster that has run
//! a while: every node's first summary is in etcd, its last heartbeat
//! spread over the rounds before.
//!
//! The right verdicts: node down for the node; path degraded for B (and for
//! A when B probes A) and for every node of the partitioned zone; observer
//! problem for the dropping observer; observer problem or healthy for the
//! flapping one (as its states show); healthy for every other node. Before
//! a faulty node's verdict is first right, healthy or path degraded are
//! counted as converging (the path states of its observers are turning;
//! and observer problem for a node of the partitioned zone, while only its
//! own summary shows the cut);
//! any other verdict, any later change, and any non-healthy verdict of any
//! other node, is a wrong verdict.
//!
//! The selection is in [`selection`], the faults in [`faults`], the
//! summaries in [`summaries`], the view's assembly in [`assembly`], the
//! rounds in [`rounds`] with their verdicts kept in [`verdicts`], the
//! allocations counted by [`alloc_count`], and the report in
//! [`mod@render`].
//!
//! [`SubsetPlan`]: health_agent::cluster::subset::SubsetPlan
//! [`Summary`]: health_agent::cluster::summary::Summary
//! [`PathRecord::record`]: health_agent::probe::path_record::PathRecord::record
//! [`assemble`]: health_agent::cluster::view::assemble
//! [`STALE_ROUNDS`]: health_agent::cluster::cadence::STALE_ROUNDS
//! [`SummaryWrites`]: health_agent::cluster::summary_writes::SummaryWrites
//! [`HEARTBEAT_ROUNDS`]: health_agent::cluster::cadence::HEARTBEAT_ROUNDS

mod alloc_count;
mod assembly;
mod faults;
mod render;
mod rounds;
mod selection;
mod summaries;
mod verdicts;

use std::collections::HashMap;

use anyhow::ensure;

use crate::sim_nodes::{MAX_NODES, NODE_IP_BASE, mix64};
use health_agent::{
    cluster::subset::name_hash,
    membership::{Node, NodeSet},
};

use self::{faults::Faults, render::render, rounds::run_rounds, selection::select};

pub(crate) struct Options {
    pub(crate) nodes: usize,
    pub(crate) peers: usize,
    /// Default: one per 20 nodes.
    pub(crate) zones: Option<usize>,
    pub(crate) rounds: u32,
    pub(crate) failure_threshold: u32,
}

/// The first round with the faults.
const FAULT_ROUND: u32 = 3;
/// Rounds of each phase of the flapping observer.
const FLAP_ROUNDS: u32 = 4;
/// A round: one of the agent's publisher ticks at the default liveness
/// interval (3 s with a subset of peers).
const INTERVAL_MS: u64 = 3000;
/// What a non-leader may download a round: the view, steady and with a
/// zone down.
const VIEW_WIRE_STEADY: usize = 64 << 10;
const VIEW_WIRE_FAULTS: usize = 1 << 20;
/// The targets.
const SUMMARY_BUDGET: usize = 1536;
const VIEW_BUDGET: usize = 64 << 20;
const NODE_DOWN_ROUNDS: u32 = 2;

/// splitmix64: the simulation's choices, reproducible.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (mix64(self.0) % n.max(1) as u64) as usize
    }
}

#[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
fn ratio(a: usize, b: usize) -> f64 {
    a as f64 / b.max(1) as f64
}

/// A node's id from its node IP.
fn id_of(n: &Node) -> u32 {
    n.node_ip.map_or(0, u32::from).wrapping_sub(NODE_IP_BASE)
}

/// The simulated cluster: its nodes, zones and picks.
struct Cluster {
    nodes: NodeSet,
    zone: Vec<u32>,
    zone_size: Vec<usize>,
    picks: Vec<Vec<u32>>,
    /// Whether the node's latest summary is a round behind when the view is
    /// assembled.
    lag: Vec<bool>,
}

impl Cluster {
    fn new(nodes: NodeSet, picks: Vec<Vec<u32>>) -> Self {
        let mut ids: HashMap<&str, u32> = HashMap::new();
        let zone: Vec<u32> = nodes
            .iter()
            .map(|n| {
                let z = n.zone.as_deref().unwrap_or("");
                let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                *ids.entry(z).or_insert(next)
            })
            .collect();
        let mut zone_size = vec![0; ids.len()];
        for &z in &zone {
            zone_size[z as usize] += 1;
        }
        let lag = nodes.iter().map(|n| name_hash(&n.name) & 1 == 1).collect();
        Self {
            nodes,
            zone,
            zone_size,
            picks,
            lag,
        }
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// Runs the simulation; the report as text.
pub(crate) fn run(opts: &Options) -> anyhow::Result<String> {
    ensure!(
        (100..MAX_NODES).contains(&opts.nodes),
        "--nodes {}: from 100 to {} (the simulated nodes' addresses are in 198.18.0.0/15, one kept for the node that joins)",
        opts.nodes,
        MAX_NODES - 1
    );
    ensure!(opts.peers >= 2, "--peers: at least 2");
    ensure!(
        opts.rounds > FAULT_ROUND,
        "--rounds: more than {FAULT_ROUND}"
    );
    let zones = opts.zones.unwrap_or(opts.nodes / 20);
    ensure!(
        (3..=opts.nodes / 2).contains(&zones),
        "--zones: 3 to {} (one partitioned, a link between two others, zones of 2 or more)",
        opts.nodes / 2
    );
    let mut rng = Rng(0x5eed);
    eprintln!(
        "cluster-sim: {} nodes, {zones} zones, K = {}: selecting (and again after a join and a leave)",
        opts.nodes, opts.peers
    );
    let (cluster, sel) = select(opts, zones, &mut rng)?;
    let faults = Faults::pick(&cluster, &mut rng)?;
    eprintln!("cluster-sim: faults {faults:?}");
    let rounds = run_rounds(opts, &cluster, &faults)?;
    eprintln!("cluster-sim: the summary format, version 2 against 3");
    let formats = crate::bench_summary_format::compare(&rounds.last)?;
    Ok(render(opts, zones, &cluster, &faults, &sel, &rounds) + &formats)
}
