//! The cluster view: every agent's last round ([`Summary`]) put together,
//! with a verdict per node, after `NetBouncer` and 007: a failure seen by one
//! observer is blamed on the node only when the other observers agree, and
//! on the observer when it fails towards many nodes that the others reach.
//!
//! Each observation (an observer's report on one peer) is one of: reached
//! (all four paths in Success), failed every path, failed some path, or
//! unknown (no failure, some path not known yet: no evidence either way).
//! An observer's report on itself is left out.
//!
//! The verdicts, in this order:
//!
//! 1. **Observer problems** are found first. An observer's failure towards
//!    a node is *suspect* when the node's other observers mostly reach it
//!    (over three times as many reach it as fail it: not while a fault is
//!    just starting and summaries a round apart disagree). An observer whose suspect
//!    failures are towards nodes of at least
//!    [`ViewParams::observer_problem_min`] zones (a node without a zone is
//!    its own; with fewer zones observed: half of them, at least 2) is an
//!    observer problem. Counting zones, not nodes, keeps an observer that
//!    fails towards a few nodes of one partitioned zone (whose own nodes
//!    still reach each other) from looking like the problem. This is done
//!    twice: the second time the node's other observers exclude
//!    those the first pass found, so that the nodes of a partitioned zone
//!    (each one an observer problem: it fails every node outside) do not
//!    make the outside observers that fail towards them look suspect.
//!    An observer problem's *failures* are discounted everywhere below (its
//!    successes still count: a path it reaches is reachable).
//! 2. With fewer than [`ViewParams::min_observers`] observers reporting a
//!    definite state (reached or failed, discounted failures aside), the
//!    node's verdict is **unknown**, or **observer problem** if it is one.
//! 3. **Node down**: every such observer fails every path (none reaches
//!    it, none fails only some paths), by the paths' states or by their
//!    last probes: a path in Success whose last probe failed (*failing*,
//!    below the prober's failure threshold) counts here. The agreement of
//!    every observer of the node (at least [`ViewParams::min_observers`])
//!    stands in for each prober's threshold, so a node down shows within
//!    two rounds (its observers' summaries are up to a round apart),
//!    whatever the threshold. Everywhere else a failing path counts as
//!    the Success it still is.
//! 4. **Path degraded**: some observers fail some path; the failing
//!    observers are named. A partitioned zone's nodes get this verdict:
//!    reached from inside the zone, failed from outside, and the outside
//!    observers are named.
//! 5. **Observer problem**: the node is one (and the nodes it fails towards
//!    are named).
//! 6. **Healthy** otherwise.
//!
//! A flapping observer is an observer problem while its failures show and
//! healthy between: its failures never make a node down or degraded.
//!
//! Cost: O(total observations) time (a few passes over them) and 5 bytes
//! per observation of working memory, besides the view itself.

use std::{borrow::Borrow, collections::HashMap};

use serde::{Deserialize, Serialize};

use crate::{
    cluster::summary::{PathSample, Summary},
    membership::NodeSet,
    probe::path::ProbeResult,
};

/// The most names listed per node (failing observers, unreached nodes): the
/// counts are exact, the names an excerpt.
pub const MAX_NAMED: usize = 16;

/// What the view concludes about a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Its observers reach it (or the failures are an observer's problem).
    Healthy,
    /// Every observer fails every path.
    NodeDown,
    /// Some observers fail some paths: a link, a path, a partition.
    PathDegraded,
    /// It fails towards many nodes that the other observers reach.
    ObserverProblem,
    /// Too few observers report on it.
    Unknown,
}

impl Verdict {
    /// How bad it is, worst first: node down, path degraded, observer
    /// problem, unknown, healthy. Lists of nodes are shown (and cut, when
    /// they do not all fit) in this order.
    #[must_use]
    pub const fn rank(self) -> u8 {
        match self {
            Self::NodeDown => 0,
            Self::PathDegraded => 1,
            Self::ObserverProblem => 2,
            Self::Unknown => 3,
            Self::Healthy => 4,
        }
    }
}

/// The rules' thresholds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewParams {
    /// Fewer observers reporting a definite state make the verdict unknown.
    /// Default 2: a single observer cannot tell a node down from its own
    /// link to it.
    pub min_observers: usize,
    /// Zones of the suspect failures that make an observer an observer
    /// problem. Default 4: a node down or a broken link gives each observer
    /// one; a partitioned zone, one.
    pub observer_problem_min: usize,
    /// Summaries of rounds that ended before this (epoch ms) are ignored:
    /// an agent that stopped publishing is no longer an observer. 0 keeps
    /// all.
    pub oldest_ms: u64,
    /// Now (epoch ms), against which a summary that says its observer
    /// summarises less often is judged by its own cadence
    /// ([`Summary::current`]); 0: by `oldest_ms` alone.
    pub now_ms: u64,
}

impl Default for ViewParams {
    fn default() -> Self {
        Self {
            min_observers: 2,
            observer_problem_min: 4,
            oldest_ms: 0,
            now_ms: 0,
        }
    }
}

/// One node in the view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Whether its own summary is in the view.
    pub reporting: bool,
    /// Observers whose summary lists it (itself aside).
    pub observers: u32,
    /// Observers that reach it on all four paths.
    pub seen_reachable: u32,
    /// Observers (observer problems aside) failing at least one path.
    pub failing: u32,
    /// Failures from observer problems: shown, not counted.
    pub discounted: u32,
    pub verdict: Verdict,
    /// Up to [`MAX_NAMED`] of the `failing` observers, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing_observers: Vec<String>,
    /// As an observer: the nodes it fails towards that the others reach.
    #[serde(default)]
    pub unreached: u32,
    /// Up to [`MAX_NAMED`] of those, by name (observer problems only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreached_nodes: Vec<String>,
    /// Observers that reach it over a lossy path (in Success, yet losing
    /// probes with confidence).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lossy: u32,
    /// Observers that reach it in plain text (`--encryption wireguard`:
    /// their probes left outside the tunnel).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub plaintext: u32,
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
const fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Nodes per verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictCounts {
    pub healthy: usize,
    pub node_down: usize,
    pub path_degraded: usize,
    pub observer_problem: usize,
    pub unknown: usize,
    /// Not a verdict: the nodes (of any verdict) some observer reaches
    /// over a lossy path.
    #[serde(default)]
    pub lossy: usize,
    /// Not a verdict: the nodes (of any verdict) some observer reaches in
    /// plain text.
    #[serde(default)]
    pub plaintext: usize,
}

impl VerdictCounts {
    fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Healthy => self.healthy += 1,
            Verdict::NodeDown => self.node_down += 1,
            Verdict::PathDegraded => self.path_degraded += 1,
            Verdict::ObserverProblem => self.observer_problem += 1,
            Verdict::Unknown => self.unknown += 1,
        }
    }
}

/// What `GET /v1/cluster` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// Summaries used (one per reporting observer).
    pub reports: usize,
    /// Summaries left out: of nodes not in the set, older than
    /// [`ViewParams::oldest_ms`], or superseded by a newer one of the same
    /// observer.
    pub ignored: usize,
    pub counts: VerdictCounts,
    /// Every node of the set, in its order (by name).
    pub nodes: Vec<NodeView>,
    /// The first [`MAX_PLAINTEXT_NAMED`] nodes (by name) some observer
    /// reaches in plain text, whatever their verdict: a problem the view
    /// lists (a published view lists its nodes not healthy only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plaintext_nodes: Vec<String>,
}

/// The nodes reached in plain text a view names at most.
pub const MAX_PLAINTEXT_NAMED: usize = 100;

impl ClusterView {
    /// The node called `name`.
    #[must_use]
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.nodes[i])
    }

    /// The nodes whose verdict is not healthy.
    pub fn problems(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.iter().filter(|n| n.verdict != Verdict::Healthy)
    }
}

/// An observation's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Seen {
    Reached,
    FailedAll,
    FailedSome,
    Unknown,
    /// Every path failed its last probe, none in Failure yet: reached by
    /// the states.
    ReachedFailingAll,
    /// Every path failed its last probe, some in Failure already: failed
    /// some by the states.
    FailedSomeFailingAll,
    /// Reached, some path lossy.
    ReachedLossy,
}

impl Seen {
    fn of(paths: [PathSample; 4]) -> Self {
        let failed = paths
            .iter()
            .filter(|p| p.state == ProbeResult::Failure)
            .count();
        let failing = paths.iter().filter(|p| p.failing).count();
        match (failed, failed + failing) {
            (4, _) => Self::FailedAll,
            (0, 4) => Self::ReachedFailingAll,
            (_, 4) => Self::FailedSomeFailingAll,
            (1.., _) => Self::FailedSome,
            _ if paths.iter().any(|p| p.state == ProbeResult::Unknown) => Self::Unknown,
            _ if paths.iter().any(|p| p.lossy) => Self::ReachedLossy,
            _ => Self::Reached,
        }
    }

    /// Reached, by the paths' states.
    const fn reached(self) -> bool {
        matches!(
            self,
            Self::Reached | Self::ReachedFailingAll | Self::ReachedLossy
        )
    }

    /// Failed some path or all, by the paths' states.
    const fn failed(self) -> bool {
        matches!(
            self,
            Self::FailedAll | Self::FailedSome | Self::FailedSomeFailingAll
        )
    }

    /// Every path failed, by the states or the last probes.
    const fn down_now(self) -> bool {
        matches!(
            self,
            Self::FailedAll | Self::ReachedFailingAll | Self::FailedSomeFailingAll
        )
    }
}

/// One observer's latest summary, as a range of the observations.
#[derive(Clone, Copy)]
struct Slot {
    at_ms: u64,
    seq: u64,
    start: usize,
    end: usize,
}

/// Every observation, by observer: target index and class.
struct Observations {
    targets: Vec<u32>,
    seen: Vec<Seen>,
    /// Per observation: some path reached in plain text.
    plaintext: Vec<bool>,
    slots: Vec<Option<Slot>>,
    reports: usize,
    ignored: usize,
}

impl Observations {
    fn collect<S: Borrow<Summary>>(
        nodes: &NodeSet,
        summaries: impl IntoIterator<Item = S>,
        params: &ViewParams,
    ) -> Self {
        let index: HashMap<&str, u32> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((n.name.as_str(), u32::try_from(i).ok()?)))
            .collect();
        let mut o = Self {
            targets: Vec::new(),
            seen: Vec::new(),
            plaintext: Vec::new(),
            slots: vec![None; nodes.len()],
            reports: 0,
            ignored: 0,
        };
        for s in summaries {
            let s: &Summary = s.borrow();
            let Some(&me) = index.get(s.observer()) else {
                o.ignored += 1;
                continue;
            };
            let slot = &mut o.slots[me as usize];
            let newer = slot.is_none_or(|old| (s.at_ms(), s.seq()) > (old.at_ms, old.seq));
            if !s.current(params.oldest_ms, params.now_ms) || !newer {
                o.ignored += 1;
                continue;
            }
            if slot.is_some() {
                // Superseded: its observations stay in the arena, unused.
                o.ignored += 1;
            } else {
                o.reports += 1;
            }
            let start = o.targets.len();
            for p in s.peers() {
                match index.get(p.name.as_str()) {
                    Some(&t) if t != me => {
                        o.targets.push(t);
                        o.seen.push(Seen::of(p.paths));
                        o.plaintext.push(p.plaintext());
                    }
                    _ => {}
                }
            }
            *slot = Some(Slot {
                at_ms: s.at_ms(),
                seq: s.seq(),
                start,
                end: o.targets.len(),
            });
        }
        o
    }

    /// Each reporting observer with its observations, in node order.
    fn by_observer(
        &self,
    ) -> impl Iterator<Item = (usize, impl Iterator<Item = (usize, Seen)> + Clone + '_)> + '_ {
        self.slots.iter().enumerate().filter_map(move |(o, slot)| {
            let s = (*slot)?;
            Some((
                o,
                self.targets[s.start..s.end]
                    .iter()
                    .zip(&self.seen[s.start..s.end])
                    .map(|(&t, &seen)| (t as usize, seen)),
            ))
        })
    }

    /// Per target: observers reaching it and failing it, leaving out the
    /// observers in `excluded`.
    fn tallies(&self, n: usize, excluded: &[bool]) -> (Vec<u32>, Vec<u32>) {
        let (mut ok, mut fail) = (vec![0u32; n], vec![0u32; n]);
        for (o, obs) in self.by_observer() {
            if excluded[o] {
                continue;
            }
            for (t, seen) in obs {
                if seen.reached() {
                    ok[t] += 1;
                } else if seen.failed() {
                    fail[t] += 1;
                }
            }
        }
        (ok, fail)
    }

    /// Per observer: its suspect failures (towards nodes that the others,
    /// those in `excluded` aside, mostly reach); and which observers are
    /// observer problems by them: suspect failures in enough zones
    /// (`zones`: a number per node, those without a zone each their own).
    fn problems(
        &self,
        zones: &[u32],
        excluded: &[bool],
        params: &ViewParams,
    ) -> (Vec<u32>, Vec<bool>) {
        let n = zones.len();
        let (ok, fail) = self.tallies(n, excluded);
        let mut suspect = vec![0u32; n];
        let mut problem = vec![false; n];
        let (mut suspect_zones, mut observed_zones) = (Vec::new(), Vec::new());
        for (o, obs) in self.by_observer() {
            suspect_zones.clear();
            for (t, seen) in obs.clone() {
                if seen.failed() && suspect_failure(ok[t], fail[t] - u32::from(!excluded[o])) {
                    suspect_zones.push(zones[t]);
                }
            }
            suspect[o] = suspect_zones.len() as u32;
            if suspect_zones.is_empty() {
                continue;
            }
            suspect_zones.sort_unstable();
            suspect_zones.dedup();
            observed_zones.clear();
            observed_zones.extend(
                obs.filter(|&(_, s)| s != Seen::Unknown)
                    .map(|(t, _)| zones[t]),
            );
            observed_zones.sort_unstable();
            observed_zones.dedup();
            let needed = params
                .observer_problem_min
                .min(observed_zones.len().div_ceil(2).max(2))
                .max(1);
            problem[o] = suspect_zones.len() >= needed;
        }
        (suspect, problem)
    }
}

/// Whether an observer's failure towards a node is suspect, given how many
/// of the node's other observers reach it and fail it: they reach it over
/// three times as often. A node whose observers disagree about evenly (a
/// fault just starting, as summaries a round apart disagree) is no evidence
/// against the observer.
const fn suspect_failure(others_reach: u32, others_fail: u32) -> bool {
    others_reach > others_fail.saturating_mul(3)
}

/// A number per node for its zone; a node without one is its own.
fn zone_numbers(nodes: &NodeSet) -> Vec<u32> {
    let mut ids: HashMap<&str, u32> = HashMap::new();
    let n = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| match node.zone.as_deref() {
            Some(z) => {
                let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                *ids.entry(z).or_insert(next)
            }
            None => n.saturating_add(u32::try_from(i).unwrap_or(u32::MAX)),
        })
        .collect()
}

/// Per-node tallies of the final pass.
#[derive(Clone, Copy, Default)]
struct Tally {
    observers: u32,
    reached: u32,
    failed_all: u32,
    failed_some: u32,
    discounted: u32,
    /// Observers failing every path by the states or the last probes.
    down_now: u32,
    /// Of `reached`, those failing every path by the last probes.
    reached_failing: u32,
    /// Of `reached`, those over a lossy path.
    lossy: u32,
    /// Of `reached`, those in plain text.
    plaintext: u32,
}

/// Per-node excerpts of names (at most [`MAX_NAMED`] each).
#[derive(Clone, Default)]
struct Names {
    /// Observers failing some path of the node, by the states.
    failing: Vec<String>,
    /// Observers reaching the node by the states but failing every path by
    /// the last probes: named as failing when the node is down.
    failing_now: Vec<String>,
    /// Nodes this observer fails towards that others reach.
    unreached: Vec<String>,
}

fn named(list: &mut Vec<String>, name: &str) {
    if list.len() < MAX_NAMED {
        list.push(name.to_owned());
    }
}

/// Every node's tally over the observations, and the names that go with
/// it (`first`, `problem`: observer problems of the first and second
/// pass; `ok`, `fail`: the first pass's reach and failure counts).
fn tally(
    nodes: &NodeSet,
    obs: &Observations,
    (first, problem): (&[bool], &[bool]),
    (ok, fail): (&[u32], &[u32]),
) -> (Vec<Tally>, Vec<Names>) {
    let n = nodes.len();
    let mut tally = vec![Tally::default(); n];
    let mut names = vec![Names::default(); n];
    for (o, seen_by_o) in obs.by_observer() {
        for (t, seen) in seen_by_o {
            let tl = &mut tally[t];
            tl.observers += 1;
            match seen {
                s if s.reached() => {
                    tl.reached += 1;
                    tl.lossy += u32::from(s == Seen::ReachedLossy);
                    if s.down_now() {
                        tl.down_now += 1;
                        tl.reached_failing += 1;
                        named(&mut names[t].failing_now, &nodes[o].name);
                    }
                }
                Seen::Unknown => {}
                _ if problem[o] => {
                    tl.discounted += 1;
                    let others_fail = fail[t] - u32::from(!first[o]);
                    if suspect_failure(ok[t], others_fail) {
                        named(&mut names[o].unreached, &nodes[t].name);
                    }
                }
                _ => {
                    if seen == Seen::FailedAll {
                        tl.failed_all += 1;
                    } else {
                        tl.failed_some += 1;
                    }
                    tl.down_now += u32::from(seen.down_now());
                    named(&mut names[t].failing, &nodes[o].name);
                }
            }
        }
    }

    // Plain text: an observer that reached some path of it outside the
    // tunnel (a summary marks only paths that answered), whatever its
    // other paths did.
    for slot in obs.slots.iter().flatten() {
        for i in slot.start..slot.end {
            if obs.plaintext[i] {
                tally[obs.targets[i] as usize].plaintext += 1;
            }
        }
    }
    (tally, names)
}

/// The cluster view of `nodes` from `summaries` (any order; the newest of
/// each observer is used, those of observers not in the set are left out).
/// O(total observations).
#[must_use]
pub fn assemble<S: Borrow<Summary>>(
    nodes: &NodeSet,
    summaries: impl IntoIterator<Item = S>,
    params: &ViewParams,
) -> ClusterView {
    let n = nodes.len();
    let obs = Observations::collect(nodes, summaries, params);
    let zones = zone_numbers(nodes);
    let (_, first) = obs.problems(&zones, &vec![false; n], params);
    let (suspect, problem) = obs.problems(&zones, &first, params);
    let (ok, fail) = obs.tallies(n, &first);

    let (tally, names) = tally(nodes, &obs, (&first, &problem), (&ok, &fail));

    let mut counts = VerdictCounts::default();
    let views: Vec<NodeView> = nodes
        .iter()
        .enumerate()
        .zip(names)
        .map(|((i, node), mut names)| {
            let t = tally[i];
            let mut failing = t.failed_all + t.failed_some;
            let definite = (t.reached + failing) as usize;
            let verdict = if definite < params.min_observers.max(1) {
                if problem[i] {
                    Verdict::ObserverProblem
                } else {
                    Verdict::Unknown
                }
            } else if t.down_now as usize == definite {
                Verdict::NodeDown
            } else if failing > 0 {
                Verdict::PathDegraded
            } else if problem[i] {
                Verdict::ObserverProblem
            } else {
                Verdict::Healthy
            };
            counts.add(verdict);
            counts.lossy += usize::from(t.lossy > 0);
            counts.plaintext += usize::from(t.plaintext > 0);
            let mut seen_reachable = t.reached;
            // Down by the last probes: those observers fail it, whatever
            // their states still say.
            if verdict == Verdict::NodeDown {
                seen_reachable -= t.reached_failing;
                failing += t.reached_failing;
                for name in names.failing_now {
                    named(&mut names.failing, &name);
                }
            }
            NodeView {
                name: node.name.clone(),
                zone: node.zone.clone(),
                reporting: obs.slots[i].is_some(),
                observers: t.observers,
                seen_reachable,
                failing,
                discounted: t.discounted,
                verdict,
                failing_observers: names.failing,
                unreached: if problem[i] { suspect[i] } else { 0 },
                unreached_nodes: if problem[i] {
                    names.unreached
                } else {
                    Vec::new()
                },
                lossy: t.lossy,
                plaintext: t.plaintext,
            }
        })
        .collect();
    let plaintext_nodes = views
        .iter()
        .filter(|n: &&NodeView| n.plaintext > 0)
        .take(MAX_PLAINTEXT_NAMED)
        .map(|n| n.name.clone())
        .collect();
    ClusterView {
        reports: obs.reports,
        ignored: obs.ignored,
        counts,
        nodes: views,
        plaintext_nodes,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        cluster::{
            subset::{ProbePeers, SubsetPlan},
            summary::{PathSample, PeerSummary},
        },
        membership::Node,
    };

    const N: usize = 200;
    const ZONE: usize = 20;
    const K: usize = 16;

    /// The faults of a simulated cluster.
    #[derive(Default)]
    struct Faults {
        down: Vec<usize>,
        /// Both directions, every path.
        cut: Vec<(usize, usize)>,
        /// A zone cut from every other.
        partition: Option<usize>,
        /// Observers whose probes all fail (outgoing only).
        deaf: Vec<usize>,
        /// Observers whose HTTP probes fail (outgoing only).
        http_deaf: Vec<usize>,
        /// Observers whose summaries predate the partition.
        lagging: Vec<usize>,
        /// The first round of the faults: a failed path is failing (its
        /// last probe failed), not yet in Failure (threshold above 1).
        fresh: bool,
        /// Observers whose summaries predate every fault.
        before: Vec<usize>,
        /// Targets every observer reaches over a lossy host ICMP path.
        lossy: Vec<usize>,
        /// (observer, target): the target's endpoint address reached in
        /// plain text by that observer.
        plaintext: Vec<(usize, usize)>,
    }

    struct Cluster {
        nodes: NodeSet,
        plan: SubsetPlan,
        zone_size: usize,
    }

    impl Cluster {
        fn new() -> Self {
            Self::with_zones(ZONE)
        }

        fn with_zones(zone_size: usize) -> Self {
            let nodes: Vec<Node> = (0..N)
                .map(|i| Node {
                    name: format!("node-{i:03}"),
                    node_ip: Some(Ipv4Addr::from(
                        0xc612_0000 + u32::try_from(i).expect("small"),
                    )),
                    health_ip: Some(Ipv4Addr::from(
                        0xc613_0000 + u32::try_from(i).expect("small"),
                    )),
                    node_ip6: None,
                    health_ip6: None,
                    zone: Some(format!("zone-{}", i / zone_size)),
                })
                .collect();
            let nodes = NodeSet::new(nodes).expect("unique");
            let plan = SubsetPlan::new(&nodes);
            Self {
                nodes,
                plan,
                zone_size,
            }
        }

        fn zone(&self, i: usize) -> usize {
            i / self.zone_size
        }

        /// Whether `o`'s probe of `t` on path `p` succeeds.
        fn works(&self, f: &Faults, o: usize, t: usize, p: usize) -> bool {
            let cut = f
                .cut
                .iter()
                .any(|&(a, b)| (a, b) == (o, t) || (b, a) == (o, t));
            let parted = f
                .partition
                .is_some_and(|z| (self.zone(o) == z) != (self.zone(t) == z))
                && !f.lagging.contains(&o);
            let http = p % 2 == 1;
            f.before.contains(&o)
                || !(f.down.contains(&t)
                    || cut
                    || parted
                    || f.deaf.contains(&o)
                    || (http && f.http_deaf.contains(&o)))
        }

        fn summaries(&self, f: &Faults) -> Vec<Summary> {
            (0..N)
                .filter(|o| !f.down.contains(o))
                .map(|o| {
                    let peers = self
                        .plan
                        .assigned_index(o, ProbePeers::Count(K))
                        .into_iter()
                        .map(|t| PeerSummary {
                            name: self.nodes[t].name.clone(),
                            paths: std::array::from_fn(|p| {
                                if self.works(f, o, t, p) {
                                    PathSample::new(ProbeResult::Success, Some(200))
                                        .with_lossy(p == 0 && f.lossy.contains(&t))
                                        .with_plaintext(p >= 2 && f.plaintext.contains(&(o, t)))
                                } else if f.fresh {
                                    PathSample::FAILING
                                } else {
                                    PathSample::new(ProbeResult::Failure, None)
                                }
                            }),
                        })
                        .collect();
                    Summary::new(self.nodes[o].name.clone(), 1, 1000, peers).expect("valid")
                })
                .collect()
        }

        fn view(&self, f: &Faults) -> ClusterView {
            // Through the wire format, as the agent gets them.
            let decoded: Vec<Summary> = self
                .summaries(f)
                .iter()
                .map(|s| Summary::decode(&s.encode()).expect("decodes"))
                .collect();
            assemble(&self.nodes, &decoded, &ViewParams::default())
        }

        /// Asserts the verdicts: `expected` for the nodes listed, healthy
        /// for every other.
        fn check(view: &ClusterView, expected: &[(usize, Verdict)]) {
            for (i, v) in view.nodes.iter().enumerate() {
                let want = expected
                    .iter()
                    .find(|(j, _)| *j == i)
                    .map_or(Verdict::Healthy, |(_, v)| *v);
                assert_eq!(v.verdict, want, "node {i}: {v:?}");
            }
        }

        fn observes(&self, o: usize, t: usize) -> bool {
            self.plan
                .assigned_index(o, ProbePeers::Count(K))
                .contains(&t)
        }
    }

    #[test]
    fn a_healthy_cluster_is_healthy() {
        let c = Cluster::new();
        let view = c.view(&Faults::default());
        Cluster::check(&view, &[]);
        assert_eq!(view.reports, N);
        assert_eq!(view.counts.healthy, N);
        let min = view.nodes.iter().map(|n| n.observers).min().unwrap_or(0);
        assert!(min as usize >= ZONE - 1 + K / 2, "min observers {min}");
        assert!(
            view.nodes
                .iter()
                .all(|n| n.seen_reachable == n.observers && n.reporting)
        );
    }

    #[test]
    fn a_node_down() {
        let c = Cluster::new();
        let view = c.view(&Faults {
            down: vec![57],
            ..Faults::default()
        });
        Cluster::check(&view, &[(57, Verdict::NodeDown)]);
        let v = &view.nodes[57];
        assert!(!v.reporting);
        assert_eq!((v.seen_reachable, v.failing), (0, v.observers));
    }

    #[test]
    fn a_node_down_shows_before_any_probers_threshold() {
        let c = Cluster::new();
        let down = Faults {
            down: vec![57],
            fresh: true,
            ..Faults::default()
        };
        // The first round after the fault: every observer's paths towards
        // 57 failed their last probe, none is in Failure yet.
        let view = c.view(&down);
        Cluster::check(&view, &[(57, Verdict::NodeDown)]);
        // Shown as failed by every observer, named, as a node down by the
        // states is.
        let v = &view.nodes[57];
        assert_eq!((v.seen_reachable, v.failing), (0, v.observers), "{v:?}");
        assert_eq!(
            v.failing_observers.len(),
            (v.observers as usize).min(MAX_NAMED),
            "{v:?}"
        );
        // Summaries a round apart: observers that have not probed since
        // the fault still reach it. No verdict against the node yet.
        let observers: Vec<usize> = (0..N).filter(|&o| c.observes(o, 57)).collect();
        let half = Faults {
            before: observers[..observers.len() / 2].to_vec(),
            ..down
        };
        Cluster::check(&c.view(&half), &[]);
    }

    #[test]
    fn failing_paths_alone_blame_no_link_zone_or_observer() {
        let c = Cluster::new();
        let b = c
            .plan
            .assigned_index(3, ProbePeers::Count(K))
            .into_iter()
            .find(|&t| c.zone(t) != c.zone(3))
            .expect("a peer in another zone");
        for faults in [
            Faults {
                cut: vec![(3, b)],
                ..Faults::default()
            },
            Faults {
                partition: Some(2),
                ..Faults::default()
            },
            Faults {
                deaf: vec![11],
                ..Faults::default()
            },
        ] {
            // Below the threshold a failing path is still a Success: only
            // the agreement of every observer (a node down) reads it.
            Cluster::check(
                &c.view(&Faults {
                    fresh: true,
                    ..faults
                }),
                &[],
            );
        }
    }

    #[test]
    fn a_link_down() {
        let c = Cluster::new();
        // An observer and a node it probes in another zone.
        let a = 3;
        let b = c
            .plan
            .assigned_index(a, ProbePeers::Count(K))
            .into_iter()
            .find(|&t| c.zone(t) != c.zone(a))
            .expect("a peer outside the zone");
        let view = c.view(&Faults {
            cut: vec![(a, b)],
            ..Faults::default()
        });
        let mut expected = vec![(b, Verdict::PathDegraded)];
        if c.observes(b, a) {
            expected.push((a, Verdict::PathDegraded));
        }
        Cluster::check(&view, &expected);
        assert_eq!(view.nodes[b].failing_observers, [c.nodes[a].name.clone()]);
    }

    #[test]
    fn a_zone_partition_degrades_the_zone_only() {
        let c = Cluster::new();
        let view = c.view(&Faults {
            partition: Some(4),
            ..Faults::default()
        });
        let zone: Vec<(usize, Verdict)> = (80..100).map(|i| (i, Verdict::PathDegraded)).collect();
        Cluster::check(&view, &zone);
        for i in 80..100 {
            let v = &view.nodes[i];
            assert_eq!(
                v.seen_reachable, 19,
                "node {i}: reached from inside its zone"
            );
            assert!(v.failing >= 1, "node {i}: failed from outside");
            assert!(
                v.failing_observers.iter().all(|o| c
                    .nodes
                    .get(o)
                    .is_some_and(|n| n.zone.as_deref() != Some("zone-4"))),
                "the failing observers named are outside: {v:?}"
            );
            assert!(v.unreached >= 4, "its failures outwards are its own: {v:?}");
        }
    }

    #[test]
    fn a_large_zone_partly_seen_partitioned_blames_the_zone() {
        // Zones of 50: an outside observer probes several nodes of the
        // partitioned zone, and while half the observers' summaries still
        // predate the partition those nodes look reached by most others.
        let c = Cluster::with_zones(50);
        let view = c.view(&Faults {
            partition: Some(1),
            lagging: (0..N).filter(|i| i % 2 == 1).collect(),
            ..Faults::default()
        });
        // A node of the zone that no up-to-date outsider probes is still
        // healthy to all.
        let zone: Vec<(usize, Verdict)> = (50..100)
            .filter(|&i| (0..N).any(|o| c.zone(o) != 1 && o % 2 == 0 && c.observes(o, i)))
            .map(|i| (i, Verdict::PathDegraded))
            .collect();
        assert!(zone.len() > 25, "{} of the zone degraded", zone.len());
        Cluster::check(&view, &zone);
    }

    #[test]
    fn an_observer_that_drops_its_probes() {
        let c = Cluster::new();
        let view = c.view(&Faults {
            deaf: vec![123],
            ..Faults::default()
        });
        Cluster::check(&view, &[(123, Verdict::ObserverProblem)]);
        let v = &view.nodes[123];
        assert_eq!(v.unreached as usize, ZONE - 1 + K, "every peer");
        assert_eq!(v.unreached_nodes.len(), MAX_NAMED);
        assert_eq!(v.seen_reachable, v.observers, "others reach it");
        assert!(view.nodes.iter().all(|n| n.failing == 0));
    }

    #[test]
    fn a_flapping_observer_is_a_problem_only_while_it_fails() {
        let c = Cluster::new();
        // Its failing phases: everything, then HTTP only; between: none.
        for (deaf, http_deaf) in [(vec![9], vec![]), (vec![], vec![9])] {
            let view = c.view(&Faults {
                deaf,
                http_deaf,
                ..Faults::default()
            });
            Cluster::check(&view, &[(9, Verdict::ObserverProblem)]);
        }
        Cluster::check(&c.view(&Faults::default()), &[]);
    }

    #[test]
    fn every_fault_at_once() {
        let c = Cluster::new();
        let (a, b) = (150, 170);
        assert!(
            c.observes(a, b) || c.observes(b, a),
            "the cut link is observed"
        );
        let view = c.view(&Faults {
            down: vec![57],
            cut: vec![(a, b)],
            partition: Some(4),
            deaf: vec![123, 9],
            ..Faults::default()
        });
        let mut expected: Vec<(usize, Verdict)> =
            (80..100).map(|i| (i, Verdict::PathDegraded)).collect();
        expected.extend([
            (57, Verdict::NodeDown),
            (123, Verdict::ObserverProblem),
            (9, Verdict::ObserverProblem),
        ]);
        for (x, y) in [(a, b), (b, a)] {
            if c.observes(x, y) {
                expected.push((y, Verdict::PathDegraded));
            }
        }
        Cluster::check(&view, &expected);
    }

    #[test]
    fn too_few_observers_is_unknown() {
        let c = Cluster::new();
        let all = c.summaries(&Faults::default());
        let lone = &c.nodes[0].name;
        // Only the first two zones report: nodes outside them have few
        // observers or none; node 0 hears only from its zone.
        let some: Vec<&Summary> = all.iter().filter(|s| s.observer() < "node-040").collect();
        let view = assemble(&c.nodes, some, &ViewParams::default());
        assert_eq!(view.node(lone).map(|n| n.verdict), Some(Verdict::Healthy));
        let unobserved = view.nodes.iter().filter(|n| n.observers < 2);
        for n in unobserved {
            assert_eq!(n.verdict, Verdict::Unknown, "{n:?}");
        }
        assert!(view.counts.unknown > 0);
        // Every path still unknown (a first round): unknown everywhere.
        let fresh: Vec<Summary> = all
            .iter()
            .map(|s| {
                let peers = s
                    .peers()
                    .iter()
                    .map(|p| PeerSummary {
                        name: p.name.clone(),
                        paths: [PathSample::UNKNOWN; 4],
                    })
                    .collect();
                Summary::new(s.observer().into(), 1, 1, peers).expect("valid")
            })
            .collect();
        let view = assemble(&c.nodes, &fresh, &ViewParams::default());
        assert_eq!(view.counts.unknown, N);
    }

    #[test]
    fn stale_superseded_and_foreign_summaries_are_left_out() {
        let c = Cluster::new();
        let down = Faults {
            down: vec![57],
            ..Faults::default()
        };
        // Newer summaries see 57 down; older ones (at 500) saw it up.
        let mut summaries = c.summaries(&down);
        let old: Vec<Summary> = c
            .summaries(&Faults::default())
            .into_iter()
            .map(|s| Summary::new(s.observer().into(), 0, 500, s.peers().to_vec()).expect("valid"))
            .collect();
        summaries.extend(old);
        summaries.push(Summary::new("stranger".into(), 1, 1000, vec![]).expect("valid"));
        let view = assemble(&c.nodes, &summaries, &ViewParams::default());
        assert!(view.nodes[57].reporting, "57's own old summary is in");
        Cluster::check(&view, &[(57, Verdict::NodeDown)]);
        let params = ViewParams {
            oldest_ms: 600,
            ..ViewParams::default()
        };
        let view = assemble(&c.nodes, summaries.iter().rev(), &params);
        Cluster::check(&view, &[(57, Verdict::NodeDown)]);
        assert_eq!(view.reports, N - 1);
        assert_eq!(view.ignored, N + 1, "every old one and the stranger");
        assert!(!view.nodes[57].reporting);
    }

    /// Summaries older than the reader's window count while their
    /// observers say they summarise less often and they are within that
    /// cadence's window.
    #[test]
    fn observers_that_summarise_less_often_are_judged_by_their_own_cadence() {
        let c = Cluster::new();
        let slow: Vec<Summary> = c
            .summaries(&Faults::default())
            .into_iter()
            .map(|s| {
                Summary::new(s.observer().into(), 1, 500, s.peers().to_vec())
                    .expect("valid")
                    .with_cadence(std::time::Duration::from_secs(60))
            })
            .collect();
        let params = |now_ms| ViewParams {
            oldest_ms: 600,
            now_ms,
            ..ViewParams::default()
        };
        let view = assemble(&c.nodes, &slow, &params(60_000));
        assert_eq!((view.reports, view.ignored), (N, 0));
        let later = 500 + u64::from(crate::cluster::cadence::STALE_ROUNDS) * 60_000 + 1;
        let view = assemble(&c.nodes, &slow, &params(later));
        assert_eq!((view.reports, view.ignored), (0, N));
    }

    #[test]
    fn the_view_serialises_for_the_api() {
        let c = Cluster::new();
        let view = c.view(&Faults {
            down: vec![1],
            ..Faults::default()
        });
        let json = serde_json::to_value(&view).expect("serialises");
        assert_eq!(json["nodes"][1]["verdict"], "node-down");
        assert_eq!(json["nodes"][0]["verdict"], "healthy");
        assert_eq!(json["counts"]["node_down"], 1);
        let back: ClusterView = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, view);
    }

    #[test]
    fn lossy_paths_are_counted_through_the_wire_without_changing_a_verdict() {
        let cluster = Cluster::new();
        let lossy = [7, 150];
        let v = cluster.view(&Faults {
            lossy: lossy.to_vec(),
            ..Faults::default()
        });
        Cluster::check(&v, &[]);
        assert_eq!(v.counts.lossy, 2, "{:?}", v.counts);
        for (i, n) in v.nodes.iter().enumerate() {
            if lossy.contains(&i) {
                assert_eq!(n.lossy, n.seen_reachable, "every observer sees it: {n:?}");
                assert!(n.lossy > 0, "{n:?}");
            } else {
                assert_eq!(n.lossy, 0, "{n:?}");
            }
        }
        // A lossy node that is also down by its other observers' states:
        // counted lossy by those that still reach it, its verdict its own.
        let v = cluster.view(&Faults {
            lossy: vec![7],
            cut: vec![(7, 8)],
            ..Faults::default()
        });
        assert_eq!(v.counts.lossy, 1);
        assert_eq!(v.nodes[7].lossy, v.nodes[7].seen_reachable);
    }

    #[test]
    fn nodes_reached_in_plain_text_are_counted_and_named_whatever_their_verdict() {
        let cluster = Cluster::new();
        // Two observers of node 9 and one of node 120 reach them in plain
        // text; an observation of a node that does not reach it is no
        // plain-text evidence.
        let observers = |t: usize| -> Vec<usize> {
            (0..N)
                .filter(|&o| {
                    cluster
                        .plan
                        .assigned_index(o, ProbePeers::Count(K))
                        .contains(&t)
                })
                .collect()
        };
        let (of9, of120) = (observers(9), observers(120));
        let v = cluster.view(&Faults {
            plaintext: vec![(of9[0], 9), (of9[1], 9), (of120[0], 120)],
            ..Faults::default()
        });
        Cluster::check(&v, &[]);
        assert_eq!(v.counts.plaintext, 2, "{:?}", v.counts);
        assert_eq!((v.nodes[9].plaintext, v.nodes[120].plaintext), (2, 1));
        assert_eq!(v.nodes[9].verdict, Verdict::Healthy, "not a verdict");
        assert_eq!(
            v.plaintext_nodes,
            [v.nodes[9].name.clone(), v.nodes[120].name.clone()]
        );
        let v = cluster.view(&Faults {
            plaintext: vec![(of9[0], 9)],
            cut: vec![(of9[0], 9)],
            ..Faults::default()
        });
        assert_eq!(v.nodes[9].plaintext, 0, "a failed path is not reached");
        assert_eq!(v.plaintext_nodes, Vec::<String>::new());
        // Reached in plain text while another path to it fails (its
        // health address outside the AllowedIPs, say): still counted.
        let v = cluster.view(&Faults {
            plaintext: vec![(of9[0], 9)],
            http_deaf: vec![of9[0]],
            ..Faults::default()
        });
        assert_eq!(v.nodes[9].plaintext, 1, "{:?}", v.nodes[9]);
        assert_eq!(v.plaintext_nodes, [v.nodes[9].name.clone()]);
    }
}
