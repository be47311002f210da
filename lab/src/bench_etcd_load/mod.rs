//! `bench-etcd-load`: a real etcd under the load the cluster view puts on
//! it with N agents: every agent publishes its round summary under its
//! lease, at most once per probe interval, and every agent watches every
//! agent's summaries.
//!
//! ```text
//! this process: N simulated agents; agent i, on connection i mod C:
//!                 its lease (the agent's default TTL), kept alive by its
//!                 own keepalive stream,
//!                 its summary put with the lease once per interval (each
//!                 agent at its own phase),
//!               W watchers of the summaries prefix (W = N by default),
//!                 watcher j its own watch stream on connection j mod C
//!       │ loopback, gRPC (etcd-client), C connections (default 8)
//! etcd: a local one (temporary data directory, free ports), removed after
//! ```
//!
//! **Summaries.** The agent's own [`Summary`], encoded by
//! [`Summary::encode`], as `bench-cluster-sim` builds them: the N agents
//! are nodes with EC2-style names in zones of [`ZONE_SIZE`], each probes
//! what the agent's [`SubsetPlan`] assigns it with K = [`DEFAULT_PEERS`]
//! (itself, its zone and 32 others: 52 peers once N ≥ 52), every path in
//! Success with an RTT (ICMP 80-400 µs, HTTP 300-3,000 µs, new each
//! round). Its `seq` is the round (1, 2, ...), its `at_ms` the wall clock
//! of the put. The key is the agent's: `<summaries prefix><node name>`
//! ([`summaries_prefix`] of the default node prefix). The encoded size is
//! reported.
//!
//! **Delivery latency.** The summary's only time field, `at_ms`, has a
//! resolution of 1 ms, too coarse for latencies of a few ms on loopback:
//! each agent keeps, in this process, the monotonic time at which it sent
//! each put, by (agent, seq) ([`PutTimes`]); a watcher reads the seq from
//! the summary's header and the agent from the key, and records its
//! receive time less the send time: the put's way to consensus plus the
//! watch's fan-out. Every delivery of every watcher is recorded, in
//! histograms of bounded memory (100 µs buckets up to 60 s, exact max:
//! [`Histogram`]).
//!
//! **Completeness.** Every watch starts at the revision right after a
//! read made before any put, so it sees every put. Each watcher counts
//! what it receives per agent and checks each agent's seqs increase;
//! watcher 0 also decodes every summary with
//! [`Summary::decode`] and checks it against its key. Missing: per watcher
//! and agent, the agent's acknowledged puts not received.
//!
//! Reported: the encoded summary size; puts per second achieved against
//! asked, put latency; deliveries (all of them must arrive) per second and
//! their latency p50/p99/max; etcd's database size (status API) and CPU,
//! and this process's CPU (it shares the machine with etcd). PASS when the
//! delivery p99 is at most 1 s and no delivery is missing or wrong. Then
//! the election phase (`bench_election`): the N agents campaign for the
//! cluster view's assembler, each with the agent's own client, and the
//! leader's session ends mid-run: the time to another agent's view.
//!
//! **Why not the agent's `KvStore`.** [`KvStore`] does the same calls
//! (grant, keepalive stream every TTL/3, put with the lease, a prefix watch
//! from the revision after a read), with the same crate, and those calls
//! and the agent's connect options are reproduced here. But a store makes
//! its own private connection (nothing lets stores share one): N agents
//! through it would be N connections, N lease sessions and N watch tasks,
//! each forwarding every event through a channel of its own before the
//! receiver sees it. Driven from this one process on the cores etcd uses,
//! that client work (which production spreads over N machines) would be
//! measured as etcd's delivery latency, and the connections could not be
//! set to the few that the fan-out is measured over (see
//! [`DEFAULT_CONNECTIONS`]). So `etcd_client` is used directly.
//!
//! [`KvStore`]: health_agent::membership::kvstore::KvStore
//! [`Summary`]: health_agent::cluster::summary::Summary
//! [`Summary::encode`]: health_agent::cluster::summary::Summary::encode
//! [`Summary::decode`]: health_agent::cluster::summary::Summary::decode
//! [`SubsetPlan`]: health_agent::cluster::subset::SubsetPlan
//! [`DEFAULT_PEERS`]: health_agent::cluster::subset::DEFAULT_PEERS
//! [`summaries_prefix`]: health_agent::daemon::cluster_view::summaries_prefix
//! [`PutTimes`]: measure::PutTimes
//! [`Histogram`]: measure::Histogram

mod client;
mod cluster;
mod measure;
mod render;
mod roles;

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::{Context as _, ensure};
use etcd_client::{Client, GetOptions, LeaseKeepAliveStream, LeaseKeeper, WatchStream};
use health_tests::etcd::LocalEtcd;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::{
    client::{connect, keep_alive, lease, open_watch},
    cluster::Cluster,
    measure::Shared,
    render::{Outcome, render},
    roles::{agent, watcher},
};
use crate::{sim_nodes::MAX_NODES, usage};

pub(crate) struct Options {
    pub(crate) agents: usize,
    /// Default: two intervals ([`default_seconds`]).
    pub(crate) seconds: Option<u32>,
    pub(crate) interval: Duration,
    /// Default: one per agent.
    pub(crate) watchers: Option<usize>,
    /// Client connections all the traffic is spread over.
    pub(crate) connections: usize,
}

/// The agent's default `--probe-interval` (`health_agent::config::ProbeTuning`):
/// it publishes its summary at most once per interval.
pub(crate) const DEFAULT_INTERVAL: &str = "60s";

/// Client connections, shared by the agents (agent i's lease, puts and
/// watch on connection i mod C, as the agent keeps all three on its one
/// connection). etcd (grpc-go) serves a connection with one reader and one
/// writer goroutine: every frame of every stream on it goes through that
/// writer and that socket, in order. In production each agent has its own
/// connection, so the watch fan-out is written by all of etcd's cores at
/// once. One connection would make that writer the bottleneck, one per
/// agent would have this process (on the cores etcd uses) drive N HTTP/2
/// connections. 8 is more than etcd's cores here (2) and on a typical etcd
/// host (up to 8), so every core can write at once, and at 1,000 agents
/// each connection carries 125 watch streams. Streams sharing a connection
/// may share socket writes, which N connections cannot: etcd's CPU is if
/// anything understated; `--connections` equal to `--agents` gives the
/// product's one connection per agent.
pub(crate) const DEFAULT_CONNECTIONS: usize = 8;

/// The target: summaries reach every watcher within this, at p99.
const BUDGET: Duration = Duration::from_secs(1);
/// The agent's default node prefix (`--kvstore-prefix`).
const NODE_PREFIX: &str = "/health/nodes/";
/// The agent's default `--kvstore-lease-ttl`; it keeps its lease alive
/// every third of it.
const LEASE_TTL: Duration = Duration::from_mins(15);
/// Nodes per zone, as `bench-cluster-sim` by default.
const ZONE_SIZE: usize = 20;
/// How long deliveries may still arrive after the last put.
const DRAIN: Duration = Duration::from_secs(3);

/// The default run: every agent publishes at least twice (its phase is
/// under one interval, so its second put is before two intervals).
pub(crate) fn default_seconds(interval: Duration) -> u32 {
    let two = interval.saturating_mul(2);
    let secs = two.as_secs() + u64::from(two.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX).max(1)
}

/// The CPU time (user + system) of etcd and of this process.
fn cpu_times(etcd: u32) -> Option<(Duration, Duration)> {
    let total = |pid| {
        usage::cpu_times(pid)
            .ok()
            .map(|(user, system)| user + system)
    };
    total(etcd).zip(total(std::process::id()))
}

pub(crate) fn run(opts: &Options) -> anyhow::Result<String> {
    ensure!(!opts.interval.is_zero(), "--interval must be more than 0");
    ensure!(
        opts.agents <= MAX_NODES,
        "--agents {}: at most {MAX_NODES} (the simulated nodes' addresses are in 198.18.0.0/15)",
        opts.agents
    );
    let began = std::time::Instant::now();
    let etcd = LocalEtcd::start();
    progress(&format!(
        "etcd up in {:.1} s",
        began.elapsed().as_secs_f64()
    ));
    let pid = etcd.pid().context("etcd's pid")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(load(opts, &etcd.endpoint, pid))?;
    progress("the election: the agents campaign, the leader's session ends mid-run");
    let election = rt.block_on(crate::bench_election::election(
        &etcd.endpoint,
        opts.agents.max(1),
    ))?;
    drop(etcd);
    Ok(format!("{report}{election}"))
}

/// A step of the run, on stderr (the report is on stdout).
fn progress(what: &str) {
    eprintln!("bench-etcd-load: {what}");
}

/// Awaits every task.
async fn join_all<T>(
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<T>>>,
) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.context("a task panicked")??);
    }
    Ok(out)
}

/// The run's shape, its defaults resolved.
struct Shape {
    agents: usize,
    watchers: usize,
    connections: usize,
    seconds: u32,
    interval: Duration,
}

/// Every agent's lease and every watcher's watch, all at once (the agents
/// start once all are up).
async fn setup(
    clients: &[Client],
    shape: &Shape,
    prefix: &str,
) -> anyhow::Result<(
    Vec<(i64, LeaseKeeper, LeaseKeepAliveStream)>,
    Vec<WatchStream>,
)> {
    let began = Instant::now();
    let conn = |i: usize| clients[i % clients.len()].clone();
    // Every watch starts right after this revision (as `KvStore` watches
    // after its read): none misses a put, whenever etcd creates it.
    let revision = clients[0]
        .kv_client()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?
        .header()
        .map_or(0, etcd_client::ResponseHeader::revision);
    let leases = (0..shape.agents)
        .map(|i| tokio::spawn(lease(conn(i))))
        .collect();
    let watches = (0..shape.watchers)
        .map(|j| tokio::spawn(open_watch(conn(j), prefix.to_owned(), revision + 1)))
        .collect();
    let leases = join_all(leases).await.context("the agents' leases")?;
    let watches = join_all(watches).await.context("the watches")?;
    progress(&format!(
        "{} leases and {} watches over {} connections in {:.1} s; the agents put for {} s",
        shape.agents,
        shape.watchers,
        shape.connections,
        began.elapsed().as_secs_f64(),
        shape.seconds
    ));
    Ok((leases, watches))
}

async fn load(opts: &Options, endpoint: &str, pid: u32) -> anyhow::Result<String> {
    let cluster = Cluster::new(opts.agents.max(1))?;
    let shape = Shape {
        agents: cluster.len(),
        watchers: opts.watchers.unwrap_or(cluster.len()),
        connections: opts.connections.max(1),
        seconds: opts
            .seconds
            .unwrap_or_else(|| default_seconds(opts.interval)),
        interval: opts.interval,
    };
    let shared = Arc::new(Shared::new(cluster));
    let mut clients = Vec::new();
    for _ in 0..shape.connections {
        clients.push(connect(endpoint).await?);
    }
    let conn = |i: usize| clients[i % clients.len()].clone();
    let (leases, watches) = setup(&clients, &shape, &shared.cluster.prefix).await?;

    let stop = CancellationToken::new();
    let mut keepalives = Vec::new();
    let mut lease_ids = Vec::new();
    for (id, keeper, answers) in leases {
        lease_ids.push(id);
        keepalives.push(tokio::spawn(keep_alive(
            keeper,
            answers,
            stop.clone(),
            shared.clone(),
        )));
    }
    let watch_tasks: Vec<_> = watches
        .into_iter()
        .enumerate()
        .map(|(w, s)| tokio::spawn(watcher(w, s, stop.clone(), shared.clone())))
        .collect();
    let start = Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_secs(u64::from(shape.seconds));
    let agents = lease_ids
        .iter()
        .enumerate()
        .map(|(i, &lease)| {
            // Phases spread evenly over the interval.
            #[expect(
                clippy::cast_precision_loss,
                reason = "an agent's share of the interval"
            )]
            let phase = shape.interval.mul_f64(i as f64 / shape.agents as f64);
            let times = (start, phase, end, shape.interval);
            tokio::spawn(agent(i, conn(i), lease, times, shared.clone()))
        })
        .collect();
    tokio::time::sleep_until(start).await;
    let cpu_before = cpu_times(pid);
    let acked = join_all(agents).await.context("the agents")?;
    if crate::stop::requested() {
        stop.cancel();
    }
    crate::stop::check()?;
    progress("the agents are done; waiting for the last deliveries");

    // Every acknowledged put to every watcher, or the drain's end.
    let expected = shared.puts.load(Ordering::Relaxed) * shape.watchers as u64;
    let drained = Instant::now() + DRAIN;
    while shared.delivered.load(Ordering::Relaxed) < expected
        && Instant::now() < drained
        && !crate::stop::requested()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cpu_after = cpu_times(pid);
    let wall = start.elapsed();
    stop.cancel();
    let seen = join_all(watch_tasks).await.context("the watchers")?;
    for k in keepalives {
        k.await.context("a keepalive task panicked")?;
    }
    let etcd = clients[0].status().await.context("etcd status")?;
    let cpu = cpu_before.zip(cpu_after).map(|((e0, s0), (e1, s1))| {
        let percent = |d: Duration| d.as_secs_f64() * 100.0 / wall.as_secs_f64();
        (
            percent(e1.saturating_sub(e0)),
            percent(s1.saturating_sub(s0)),
        )
    });
    Ok(render(&Outcome {
        shape: &shape,
        shared: &shared,
        acked: &acked,
        seen: &seen,
        etcd: &etcd,
        cpu,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_run_has_two_intervals() {
        assert_eq!(default_seconds(Duration::from_secs(60)), 120);
        assert_eq!(default_seconds(Duration::from_millis(2500)), 5);
        assert_eq!(default_seconds(Duration::from_millis(1)), 1);
    }
}
