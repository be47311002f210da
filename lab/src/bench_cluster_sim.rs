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

use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed},
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};

use crate::sim_nodes::{MAX_NODES, NODE_IP_BASE, mix64, node, rtt_us};
use health_agent::{
    cluster::{
        cadence::{HEARTBEAT_ROUNDS, STALE_ROUNDS},
        published_view::PublishedView,
        subset::{ProbePeers, SubsetPlan, name_hash},
        summary::{PathSample, PeerSummary, Summary},
        summary_writes::{SummaryWrites, verdicts_digest},
        view::{ClusterView, NodeView, Verdict, ViewParams, assemble},
    },
    membership::{Node, NodeSet},
    probe::{
        error::{ProbeError, Proto},
        path::{Outcome, RttSource, Thresholds},
        path_record::{ErrorTexts, PathRecord},
    },
};

pub(crate) struct Options {
    pub(crate) nodes: usize,
    pub(crate) peers: usize,
    /// Default: one per 20 nodes.
    pub(crate) zones: Option<usize>,
    pub(crate) rounds: u32,
    pub(crate) failure_threshold: u32,
}

/// The system allocator, counting the bytes allocated while [`COUNTING`]
/// is set (one relaxed load per allocation otherwise): what the view's
/// assembly allocates, measured rather than estimated.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Bytes allocated less bytes freed since counting started (frees of older
/// allocations make it negative).
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn count(delta: isize) {
    if COUNTING.load(Relaxed) {
        let live = LIVE.fetch_add(delta, Relaxed) + delta;
        PEAK.fetch_max(live, Relaxed);
    }
}

fn signed(n: usize) -> isize {
    isize::try_from(n).unwrap_or(isize::MAX)
}

// SAFETY: every call goes to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(signed(layout.size()));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(signed(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        count(-signed(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(signed(new_size) - signed(layout.size()));
        }
        p
    }
}

/// Runs `f` counting its allocations: its result, the peak of bytes
/// allocated and not yet freed during it, and those still allocated after.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    let out = f();
    COUNTING.store(false, Relaxed);
    let (peak, live) = (PEAK.load(Relaxed), LIVE.load(Relaxed));
    (
        out,
        usize::try_from(peak).unwrap_or(0),
        usize::try_from(live).unwrap_or(0),
    )
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
struct Movement {
    probers: usize,
    changed: usize,
    moved: usize,
    picks: usize,
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

/// The injected faults (node indices).
#[derive(Debug, Clone, Copy)]
struct Faults {
    partition: u32,
    down: usize,
    a: usize,
    b: usize,
    flap: usize,
    deaf: usize,
}

impl Faults {
    fn pick(c: &Cluster, rng: &mut Rng) -> anyhow::Result<Self> {
        let n = c.len();
        let partition = c.zone[rng.below(n)];
        let mut taken: Vec<usize> = Vec::new();
        let fresh = |rng: &mut Rng, taken: &mut Vec<usize>| -> anyhow::Result<usize> {
            for _ in 0..10_000 {
                let i = rng.below(n);
                if c.zone[i] != partition && !taken.contains(&i) {
                    taken.push(i);
                    return Ok(i);
                }
            }
            anyhow::bail!("too few nodes outside the partitioned zone")
        };
        let (down, flap, deaf, a) = (
            fresh(rng, &mut taken)?,
            fresh(rng, &mut taken)?,
            fresh(rng, &mut taken)?,
            fresh(rng, &mut taken)?,
        );
        let b = c.picks[a]
            .iter()
            .map(|&j| j as usize)
            .find(|&j| c.zone[j] != c.zone[a] && c.zone[j] != partition && !taken.contains(&j))
            .context("node A probes no node outside its zone")?;
        Ok(Self {
            partition,
            down,
            a,
            b,
            flap,
            deaf,
        })
    }

    /// Whether `o`'s probes of `t` succeed in round `r` (every path alike).
    fn works(&self, c: &Cluster, o: usize, t: usize, r: u32) -> bool {
        if r < FAULT_ROUND || o == t {
            return true;
        }
        let flapping = ((r - FAULT_ROUND) / FLAP_ROUNDS).is_multiple_of(2);
        let parted = (c.zone[o] == self.partition) != (c.zone[t] == self.partition);
        !(t == self.down
            || (o, t) == (self.a, self.b)
            || (o, t) == (self.b, self.a)
            || parted
            || o == self.deaf
            || (o == self.flap && flapping))
    }

    /// Whether a fault can touch `o`'s probes of `t`.
    fn touches(&self, c: &Cluster, o: usize, t: usize) -> bool {
        (FAULT_ROUND..FAULT_ROUND + 2 * FLAP_ROUNDS).any(|r| !self.works(c, o, t, r))
    }

    /// The verdicts `i` may have once its fault shows (None: healthy only).
    fn expected(&self, c: &Cluster, i: usize) -> Option<&'static [Verdict]> {
        if i == self.down {
            Some(&[Verdict::NodeDown])
        } else if i == self.deaf {
            Some(&[Verdict::ObserverProblem])
        } else if i == self.flap {
            Some(&[Verdict::ObserverProblem, Verdict::Healthy])
        } else if c.zone[i] == self.partition
            || i == self.b
            || (i == self.a && c.picks[self.b].contains(&u32::try_from(i).unwrap_or(u32::MAX)))
        {
            Some(&[Verdict::PathDegraded])
        } else {
            None
        }
    }
}

/// The path states of the pairs a fault touches, per round (index r), run
/// through the prober's own state machine.
fn faulty_states(
    c: &Cluster,
    f: &Faults,
    rounds: u32,
    thresholds: Thresholds,
) -> HashMap<(u32, u32), Vec<[PathSample; 4]>> {
    let mut states = HashMap::new();
    for (o, picks) in c.picks.iter().enumerate() {
        for &t in picks {
            let t = t as usize;
            if !f.touches(c, o, t) {
                continue;
            }
            let mut paths: [PathRecord; 4] = std::array::from_fn(|_| PathRecord::default());
            let mut texts = ErrorTexts::default();
            let mut per_round = vec![[PathSample::UNKNOWN; 4]];
            for r in 1..=rounds {
                let works = f.works(c, o, t, r);
                for (p, state) in paths.iter_mut().enumerate() {
                    let outcome = if works {
                        Outcome::Ok {
                            rtt: Duration::from_micros(rtt_us(o, t, p, u64::from(r))),
                            warning: None,
                            source: RttSource::Kernel,
                        }
                    } else {
                        let proto = if p.is_multiple_of(2) {
                            Proto::Icmp
                        } else {
                            Proto::Http
                        };
                        Outcome::Failed(ProbeError::Timeout {
                            proto,
                            after: Duration::from_secs(1),
                        })
                    };
                    state.record(outcome, thresholds, u64::from(r) * INTERVAL_MS, &mut texts);
                }
                per_round.push(
                    paths
                        .each_ref()
                        .map(|p| PathSample::from_state(&p.to_state())),
                );
            }
            let key = (
                u32::try_from(o).unwrap_or(u32::MAX),
                u32::try_from(t).unwrap_or(u32::MAX),
            );
            states.insert(key, per_round);
        }
    }
    states
}

/// Node `o`'s summary of round `r`, encoded, and the digest of its
/// verdicts.
fn summary(
    c: &Cluster,
    o: usize,
    r: u32,
    states: &HashMap<(u32, u32), Vec<[PathSample; 4]>>,
) -> anyhow::Result<(Vec<u8>, u64)> {
    let o32 = u32::try_from(o).unwrap_or(u32::MAX);
    let peers = c.picks[o]
        .iter()
        .map(|&t| {
            let paths = states.get(&(o32, t)).map_or_else(
                || {
                    std::array::from_fn(|p| {
                        PathSample::new(
                            health_agent::probe::path::ProbeResult::Success,
                            Some(rtt_us(o, t as usize, p, u64::from(r))),
                        )
                    })
                },
                |per_round| per_round[r as usize],
            );
            PeerSummary {
                name: c.nodes[t as usize].name.clone(),
                paths,
            }
        })
        .collect();
    let s = Summary::new(
        c.nodes[o].name.clone(),
        u64::from(r),
        u64::from(r) * INTERVAL_MS,
        peers,
    )?;
    Ok((s.encode(), verdicts_digest(&s)))
}

/// A summary encoded, and the digest of its verdicts.
type Encoded = (Vec<u8>, u64);

/// Every node's summary of round `r` (None for the node down), on every CPU.
fn publish(
    c: &Cluster,
    f: &Faults,
    r: u32,
    states: &HashMap<(u32, u32), Vec<[PathSample; 4]>>,
) -> anyhow::Result<Vec<Option<Encoded>>> {
    let n = c.len();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let chunk = n.div_ceil(threads).max(1);
    let mut out = Vec::with_capacity(n);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|start| {
                s.spawn(move || {
                    (start..(start + chunk).min(n))
                        .map(|o| {
                            if o == f.down && r >= FAULT_ROUND {
                                Ok(None)
                            } else {
                                summary(c, o, r, states).map(Some)
                            }
                        })
                        .collect::<anyhow::Result<Vec<_>>>()
                })
            })
            .collect();
        for h in handles {
            let part = h
                .join()
                .map_err(|_| anyhow::anyhow!("a summary thread panicked"))??;
            out.extend(part);
        }
        Ok(())
    })?;
    Ok(out)
}

/// Verdict bookkeeping over the rounds.
#[derive(Default)]
struct Tracker {
    /// First round each fault's node(s) had the right verdict.
    first_right: HashMap<&'static str, u32>,
    /// (round, node, verdict) of every wrong verdict.
    wrong: Vec<(u32, String, Verdict)>,
    converging: usize,
    /// Nodes whose verdict has been right once.
    settled: Vec<bool>,
}

impl Tracker {
    fn check(&mut self, c: &Cluster, f: &Faults, view: &ClusterView, r: u32) {
        if self.settled.is_empty() {
            self.settled = vec![false; c.len()];
        }
        let mut zone_right = true;
        for (i, v) in view.nodes.iter().enumerate() {
            let expected = if r >= FAULT_ROUND {
                f.expected(c, i)
            } else {
                None
            };
            let right = expected.map_or(v.verdict == Verdict::Healthy, |e| e.contains(&v.verdict));
            // A node of the partitioned zone whose own summary shows the
            // cut before its observers' do is an observer problem until
            // they do.
            let may_converge = expected.is_some()
                && !self.settled[i]
                && (matches!(v.verdict, Verdict::Healthy | Verdict::PathDegraded)
                    || (c.zone[i] == f.partition && v.verdict == Verdict::ObserverProblem));
            if right {
                self.settled[i] |= expected.is_some() && v.verdict != Verdict::Healthy;
            } else if may_converge {
                self.converging += 1;
            } else {
                self.wrong.push((r, v.name.clone(), v.verdict));
            }
            if c.zone[i] == f.partition && v.verdict != Verdict::PathDegraded {
                zone_right = false;
            }
        }
        let checks = [
            ("node down", view.nodes[f.down].verdict == Verdict::NodeDown),
            (
                "link down",
                view.nodes[f.b].verdict == Verdict::PathDegraded,
            ),
            ("zone partition", zone_right),
            (
                "flapping observer",
                view.nodes[f.flap].verdict == Verdict::ObserverProblem,
            ),
            (
                "dropping observer",
                view.nodes[f.deaf].verdict == Verdict::ObserverProblem,
            ),
        ];
        for (fault, ok) in checks {
            if ok && r >= FAULT_ROUND {
                self.first_right.entry(fault).or_insert(r);
            }
        }
    }
}

/// Bytes a view's allocations take (its own, by their capacities).
fn view_bytes(view: &ClusterView) -> usize {
    let strings = |v: &Vec<String>| {
        v.iter().map(String::capacity).sum::<usize>() + v.capacity() * size_of::<String>()
    };
    view.nodes.capacity() * size_of::<NodeView>()
        + view
            .nodes
            .iter()
            .map(|n| {
                n.name.capacity()
                    + n.zone.as_ref().map_or(0, String::capacity)
                    + strings(&n.failing_observers)
                    + strings(&n.unreached_nodes)
            })
            .sum::<usize>()
}

/// One round's view as one agent assembles it, with its memory.
struct Assembled {
    view: ClusterView,
    time: Duration,
    /// The most bytes allocated at once while assembling it (decoding one
    /// summary at a time, the observations, the view).
    peak_bytes: usize,
    /// Bytes still allocated after: the view.
    view_bytes: usize,
}

fn assemble_round(
    c: &Cluster,
    current: &[Option<Vec<u8>>],
    previous: &[Option<Vec<u8>>],
    r: u32,
) -> anyhow::Result<Assembled> {
    let latest = (0..c.len()).filter_map(|o| {
        let (cur, prev) = (current[o].as_ref(), previous[o].as_ref());
        // A lagging node's latest is its previous round; a node that no
        // longer publishes leaves its last summary.
        if c.lag[o] { prev.or(cur) } else { cur.or(prev) }
    });
    let params = ViewParams {
        oldest_ms: (u64::from(r).saturating_sub(u64::from(STALE_ROUNDS))) * INTERVAL_MS,
        ..ViewParams::default()
    };
    let t0 = Instant::now();
    let mut bad = 0usize;
    let (view, peak_bytes, view_bytes) = counted(|| {
        assemble(
            &c.nodes,
            latest.filter_map(|b| {
                let s = Summary::decode(b);
                bad += usize::from(s.is_err());
                s.ok()
            }),
            &params,
        )
    });
    let time = t0.elapsed();
    ensure!(bad == 0, "{bad} summaries did not decode");
    Ok(Assembled {
        view,
        time,
        peak_bytes,
        view_bytes,
    })
}

/// The figures of the selection itself.
struct Selection {
    time: Duration,
    probes_max: usize,
    probes_mean: f64,
    /// Largest probes / 4·(K + zone) over the nodes.
    budget_ratio: f64,
    cluster_probes: usize,
    full_mesh_probes: usize,
    observers_min: usize,
    observers_mean: f64,
    join: Movement,
    leave: Movement,
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

fn select(opts: &Options, zones: usize, rng: &mut Rng) -> anyhow::Result<(Cluster, Selection)> {
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

/// The figures of the rounds.
#[derive(Default)]
struct Rounds {
    tracker: Tracker,
    bytes_max: usize,
    bytes_mean: f64,
    summary_max: usize,
    /// Allocated by the assembly and still held by the view (measured).
    view_bytes: usize,
    /// The view's allocations by their capacities (computed).
    view_estimate: usize,
    peak_bytes: usize,
    publish_time: Duration,
    assemble_time: Duration,
    last_counts: String,
    /// The last round's summaries, as published.
    last: Vec<Vec<u8>>,
    /// The published view's bytes (what each other agent downloads a
    /// round): the largest before the faults, and the largest after.
    view_wire_steady: usize,
    view_wire_faults: usize,
    /// Encoding the published view, over every round.
    encode_time: Duration,
    /// Summaries written (etcd puts) a round, before the faults and with
    /// them: (mean, max); and the bytes written, mean over all rounds.
    puts_steady: (f64, usize),
    puts_faults: (f64, usize),
    put_bytes_mean: f64,
}

fn run_rounds(opts: &Options, c: &Cluster, f: &Faults) -> anyhow::Result<Rounds> {
    let thresholds = Thresholds {
        success: 1,
        failure: opts.failure_threshold.max(1),
    };
    let states = faulty_states(c, f, opts.rounds, thresholds);
    let mut out = Rounds::default();
    // What etcd holds, and each agent's write policy.
    let mut written: Vec<Option<Vec<u8>>> = vec![None; c.len()];
    let mut writes = vec![SummaryWrites::default(); c.len()];
    let mut bytes_total = 0usize;
    let (mut puts, mut put_bytes) = ((Vec::new(), Vec::new()), 0usize);
    for r in 1..=opts.rounds {
        let t0 = Instant::now();
        let current = publish(c, f, r, &states)?;
        out.publish_time += t0.elapsed();
        let bytes: usize = current.iter().flatten().map(|(b, _)| b.len()).sum();
        out.summary_max = out.summary_max.max(
            current
                .iter()
                .flatten()
                .map(|(b, _)| b.len())
                .max()
                .unwrap_or(0),
        );
        out.bytes_max = out.bytes_max.max(bytes);
        bytes_total += bytes;
        let previous = written.clone();
        let mut n_puts = 0usize;
        for (o, cur) in current.into_iter().enumerate() {
            // The node down writes nothing; its last summary stays.
            let Some((b, digest)) = cur else { continue };
            if r == 1 {
                writes[o].written(
                    digest,
                    u64::from(r) + HEARTBEAT_ROUNDS - (o as u64 % HEARTBEAT_ROUNDS),
                );
                written[o] = Some(b);
            } else if writes[o]
                .decide_digest(digest, u64::from(r) + HEARTBEAT_ROUNDS)
                .writes()
            {
                n_puts += 1;
                put_bytes += b.len();
                written[o] = Some(b);
            }
        }
        if r > 1 {
            if r < FAULT_ROUND {
                &mut puts.0
            } else {
                &mut puts.1
            }
            .push(n_puts);
        }
        let current = &written;
        let a = assemble_round(c, current, &previous, r)?;
        out.assemble_time += a.time;
        out.tracker.check(c, f, &a.view, r);
        out.view_bytes = out.view_bytes.max(a.view_bytes);
        out.view_estimate = out.view_estimate.max(view_bytes(&a.view));
        out.peak_bytes = out.peak_bytes.max(a.peak_bytes);
        // The leader's publish: the view as every other agent reads it.
        let t1 = Instant::now();
        let wire = PublishedView::of(
            &c.nodes[0].name,
            u64::from(r),
            u64::from(r) * INTERVAL_MS,
            INTERVAL_MS,
            &a.view,
        )
        .encode()
        .len();
        out.encode_time += t1.elapsed();
        if r < FAULT_ROUND {
            out.view_wire_steady = out.view_wire_steady.max(wire);
        } else {
            out.view_wire_faults = out.view_wire_faults.max(wire);
        }
        let k = &a.view.counts;
        out.last_counts = format!(
            "healthy {}, node down {}, path degraded {}, observer problem {}, unknown {}",
            k.healthy, k.node_down, k.path_degraded, k.observer_problem, k.unknown
        );
        eprintln!(
            "cluster-sim: round {r}: {bytes} bytes of summaries, {n_puts} written, view in {:.0} ms: {}",
            a.time.as_secs_f64() * 1e3,
            out.last_counts
        );
    }
    out.bytes_mean = ratio(bytes_total, opts.rounds as usize);
    out.put_bytes_mean = ratio(put_bytes, opts.rounds.saturating_sub(1) as usize);
    let mean_max = |v: &[usize]| {
        (
            ratio(v.iter().sum(), v.len().max(1)),
            v.iter().copied().max().unwrap_or(0),
        )
    };
    (out.puts_steady, out.puts_faults) = (mean_max(&puts.0), mean_max(&puts.1));
    out.last = written.into_iter().flatten().collect();
    Ok(out)
}

/// Runs the simulation; the report as text.
pub(crate) fn run(opts: &Options) -> anyhow::Result<String> {
    ensure!(
        (100..=MAX_NODES).contains(&opts.nodes),
        "--nodes {}: from 100 to {MAX_NODES} (the simulated nodes' addresses are in 198.18.0.0/15)",
        opts.nodes
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

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

fn render(
    opts: &Options,
    zones: usize,
    c: &Cluster,
    f: &Faults,
    sel: &Selection,
    r: &Rounds,
) -> String {
    let mut s = String::new();
    render_selection(&mut s, opts, zones, c, sel);
    render_rounds(&mut s, opts, c, f, r);
    s
}

fn render_selection(s: &mut String, opts: &Options, zones: usize, c: &Cluster, sel: &Selection) {
    let (n, k) = (opts.nodes, opts.peers);
    let zmin = c.zone_size.iter().min().copied().unwrap_or(0);
    let zmax = c.zone_size.iter().max().copied().unwrap_or(0);
    let _ = writeln!(
        s,
        "cluster-sim: {n} nodes in {zones} zones of {zmin}-{zmax}, K = {k}, {} rounds, failure threshold {}",
        opts.rounds, opts.failure_threshold
    );
    let _ = writeln!(
        s,
        "\nselection ({:.2} s for every node, {} CPUs)",
        sel.time.as_secs_f64(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    let _ = writeln!(
        s,
        "  probes per node per round: max {}, mean {:.1}; max / 4·(K + zone) = {:.2}  [{}: ≤ 1]",
        sel.probes_max,
        sel.probes_mean,
        sel.budget_ratio,
        pass(sel.budget_ratio <= 1.0)
    );
    let _ = writeln!(
        s,
        "  probes per round, cluster-wide: {} ({:.4} % of the full mesh's {})",
        sel.cluster_probes,
        100.0 * ratio(sel.cluster_probes, sel.full_mesh_probes),
        sel.full_mesh_probes
    );
    let _ = writeln!(
        s,
        "  observers per node: min {}, mean {:.1}  [{}: min ≥ K/2 = {}]",
        sel.observers_min,
        sel.observers_mean,
        pass(sel.observers_min >= k / 2),
        k / 2
    );
    for (what, m) in [("join", &sel.join), ("leave", &sel.leave)] {
        let _ = writeln!(
            s,
            "  a {what}: {} of {} probers changed ({:.5}; K/N = {:.5}, (K + zone)/N = {:.5}), {} of {} picks moved ({:.6}; 1/N = {:.6})",
            m.changed,
            m.probers,
            ratio(m.changed, m.probers),
            ratio(k, n),
            ratio(k, n) + ratio(n, zones * n),
            m.moved,
            m.picks,
            ratio(m.moved, m.picks),
            ratio(1, n)
        );
    }
}

fn render_rounds(out: &mut String, opts: &Options, c: &Cluster, faults: &Faults, r: &Rounds) {
    let n = opts.nodes;
    let t = &r.tracker;
    let _ = writeln!(
        out,
        "\nfaults from round {FAULT_ROUND}: rounds until the right verdict (counting round {FAULT_ROUND} as 1; the path states need {} failed rounds)",
        opts.failure_threshold
    );
    for fault in [
        "node down",
        "link down",
        "zone partition",
        "flapping observer",
        "dropping observer",
    ] {
        let rounds = t
            .first_right
            .get(fault)
            .map(|&first| first + 1 - FAULT_ROUND);
        let view_delay = rounds.map(|x| x.saturating_sub(opts.failure_threshold.max(1) - 1));
        let shown = rounds.map_or_else(
            || "never".to_owned(),
            |x| {
                if fault == "node down" {
                    format!("{x} (read from every observer's last probes)")
                } else {
                    format!(
                        "{x} (the view: {} after the states turned)",
                        view_delay.unwrap_or(0)
                    )
                }
            },
        );
        // A node down is read from every observer's last probes, not from
        // the states: it is due within two rounds of the fault whatever
        // the threshold.
        let target = if fault == "node down" {
            format!(
                "  [{}: within {NODE_DOWN_ROUNDS} rounds of the fault]",
                pass(rounds.is_some_and(|d| d <= NODE_DOWN_ROUNDS))
            )
        } else {
            String::new()
        };
        let _ = writeln!(out, "  {fault:<18} {shown}{target}");
    }
    let _ = writeln!(
        out,
        "  (nodes: down {}, link {} – {}, zone {} partitioned, flapping {}, dropping {})",
        c.nodes[faults.down].name,
        c.nodes[faults.a].name,
        c.nodes[faults.b].name,
        faults.partition,
        c.nodes[faults.flap].name,
        c.nodes[faults.deaf].name
    );
    let _ = writeln!(
        out,
        "  wrong verdicts: {} over {} node-rounds  [{}: 0]; converging verdicts (healthy or degraded before right): {}",
        t.wrong.len(),
        n * opts.rounds as usize,
        pass(t.wrong.is_empty()),
        t.converging
    );
    for (round, name, v) in t.wrong.iter().take(10) {
        let _ = writeln!(out, "    round {round}: {name} {v:?}");
    }
    let _ = writeln!(out, "  last round's view: {}", r.last_counts);
    let budget = n * SUMMARY_BUDGET;
    let _ = writeln!(
        out,
        "\netcd writes per round (summary values): max {} B, mean {:.0} B, largest summary {} B  [{}: ≤ {n} × 1.5 KiB = {budget} B]",
        r.bytes_max,
        r.bytes_mean,
        r.summary_max,
        pass(r.bytes_max <= budget)
    );
    render_puts(out, n, r);
    let mib = |b: usize| ratio(b, 1 << 20);
    let _ = writeln!(
        out,
        "one agent's cluster view: {:.1} MiB allocated (by capacities: {:.1} MiB)  [{}: ≤ 64 MiB]",
        mib(r.view_bytes),
        mib(r.view_estimate),
        pass(r.view_bytes.max(r.view_estimate) <= VIEW_BUDGET)
    );
    let _ = writeln!(
        out,
        "  the assembly's peak: {:.1} MiB allocated at once (one decoded summary at a time, the observations, the view)",
        mib(r.peak_bytes)
    );
    let _ = writeln!(
        out,
        "time: summaries made and encoded {:.2} s, decoded and assembled {:.2} s, over {} rounds",
        r.publish_time.as_secs_f64(),
        r.assemble_time.as_secs_f64(),
        opts.rounds
    );
    render_assembler(out, opts, r);
}

/// Summaries written: etcd puts a round and a second, steady and with the
/// faults on. A round of the simulation is one of the agent's publisher
/// ticks: the liveness interval, 3 s by default with a subset of peers.
fn render_puts(out: &mut String, n: usize, r: &Rounds) {
    #[expect(
        clippy::cast_precision_loss,
        reason = "millisecond counts far below 2^52"
    )]
    let tick_s = INTERVAL_MS as f64 / 1000.0;
    let _ = writeln!(
        out,
        "summaries written (etcd puts), when an agent's verdicts change and every {HEARTBEAT_ROUNDS} ticks as a heartbeat:"
    );
    for (what, (mean, max)) in [
        ("before the faults", r.puts_steady),
        ("with the faults on", r.puts_faults),
    ] {
        let _ = writeln!(
            out,
            "  {what}: {mean:.0} a tick (max {max}; {:.1} % of the {n} agents), {:.0}/s at the default {tick_s} s tick (the liveness interval)",
            100.0 * mean / ratio(n.max(1), 1),
            mean / tick_s,
        );
    }
    let _ = writeln!(
        out,
        "  bytes written: {:.0} B a tick (every summary every tick would be {:.0} B)",
        r.put_bytes_mean, r.bytes_mean
    );
}

/// The elected assembler's figures: what the leader and every other agent
/// download a round, the leader's CPU, the cluster's etcd egress.
fn render_assembler(out: &mut String, opts: &Options, r: &Rounds) {
    let n = opts.nodes;
    let rounds = opts.rounds.max(1);
    let leader_cpu = (r.assemble_time + r.encode_time) / rounds;
    // The leader's watch delivers the summaries written, not every one.
    let summaries = r.put_bytes_mean;
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
    let egress_of = |view: usize| summaries + (n.saturating_sub(1) * view) as f64;
    let steady = egress_of(r.view_wire_steady);
    let egress = egress_of(r.view_wire_faults.max(r.view_wire_steady));
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
    let budget = 2.0 * summaries + (n * VIEW_WIRE_STEADY) as f64;
    let _ = writeln!(
        out,
        "
the elected assembler (the view published once a round under one key, read by every other agent):"
    );
    let _ = writeln!(
        out,
        "  a non-leader downloads the view: {} B a round before the faults  [{}: ≤ 64 KiB], at most {} B with the faults on (a zone partitioned among them)  [{}: ≤ 1 MiB]",
        r.view_wire_steady,
        pass(r.view_wire_steady <= VIEW_WIRE_STEADY),
        r.view_wire_faults,
        pass(r.view_wire_faults <= VIEW_WIRE_FAULTS)
    );
    let _ = writeln!(
        out,
        "  the leader downloads the summaries, {summaries:.0} B a round, and spends {:.0} ms a round decoding, assembling and encoding  [{}: ≤ 1 s]",
        leader_cpu.as_secs_f64() * 1e3,
        pass(leader_cpu <= Duration::from_secs(1))
    );
    let _ = writeln!(
        out,
        "  the cluster's etcd egress a round: the summaries to the leader and the view to {} agents, {steady:.0} B before the faults ({:.2}x the summaries written), {egress:.0} B with them ({:.2}x)  [{}: ≤ 2x the summaries + 64 KiB an agent = {budget:.0} B]",
        n.saturating_sub(1),
        steady / summaries.max(1.0),
        egress / summaries.max(1.0),
        pass(egress <= budget)
    );
}
