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
//!    successes still count: a path it reaches is reachable, but for the
//!    rule that follows).
//!    A *reach* is discounted too, whoever the observer, when the node
//!    publishes no current summary of its own (a dead node's goes stale
//!    after [`super::cadence::STALE_ROUNDS`] ticks) and its other
//!    observers, observer problems aside, at least
//!    [`ViewParams::min_observers`] of them, fail every path to it over
//!    three times as often as they reach it: one observer saying a dead
//!    node answers (a compromised node lying, say) does not keep it from
//!    *node down* once its summary is gone. A node that still publishes is
//!    alive somewhere, and every reach of it counts; so does a reach among
//!    enough others.
//! 2. With fewer than [`ViewParams::min_observers`] observers reporting a
//!    definite state (reached or failed, discounted observations aside), the
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
    /// Failures from observer problems, and reaches of a silent node that
    /// its other observers overwhelmingly fail: shown, not counted.
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
    /// Failed some path, and some other answers (in Success, its last
    /// probe answered, or failed in one address family only).
    FailedSome,
    /// Failed some path, and none of the others answers (unknown, or in
    /// Success failing its last probe).
    FailedSomeNoneAnswering,
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
        // A path failed in one family only: the other reached the node,
        // so the observer did not fail it whole.
        let split = paths.iter().any(|p| p.split);
        match (failed, failed + failing) {
            (4, _) if !split => Self::FailedAll,
            (0, 4) if !split => Self::ReachedFailingAll,
            (_, 4) if !split => Self::FailedSomeFailingAll,
            (1.., _)
                if paths
                    .iter()
                    .any(|p| (p.state == ProbeResult::Success && !p.failing) || p.split) =>
            {
                Self::FailedSome
            }
            (1.., _) => Self::FailedSomeNoneAnswering,
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
            Self::FailedAll
                | Self::FailedSome
                | Self::FailedSomeNoneAnswering
                | Self::FailedSomeFailingAll
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
                match index.get(&*p.name) {
                    Some(&t) if t != me => {
                        o.targets.push(t);
                        o.seen.push(Seen::of(p.paths()));
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

    /// Whether node `t` has a summary of its own in the view.
    fn reporting(&self, t: usize) -> bool {
        self.slots[t].is_some()
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

/// Whether an observer's reach of a node that publishes no summary of its
/// own is suspect, given how many of the node's other observers reach it
/// and fail every path to it: they fail it over three times as often, and
/// are enough (`min_observers`) to stand for a verdict without it. A dead node
/// publishes nothing; one observer saying it answers (a compromised node
/// lying) must not keep it from *node down*. A node that still publishes
/// is alive somewhere: every reach of it counts.
fn suspect_reach(others_reach: u32, others_fail: u32, min_observers: usize) -> bool {
    others_fail as usize >= min_observers && others_fail > others_reach.saturating_mul(3)
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
/// pass; `ok`, `fail`: the first pass's reach and failure counts;
/// `silent`: the reaches to discount).
fn tally(
    nodes: &NodeSet,
    obs: &Observations,
    (first, problem): (&[bool], &[bool]),
    (ok, fail): (&[u32], &[u32]),
    silent: &SilentReaches,
) -> (Vec<Tally>, Vec<Names>) {
    let n = nodes.len();
    let mut tally = vec![Tally::default(); n];
    let mut names = vec![Names::default(); n];
    for (o, seen_by_o) in obs.by_observer() {
        for (t, seen) in seen_by_o {
            let tl = &mut tally[t];
            tl.observers += 1;
            match seen {
                s if silent.discounts(o, t, s) => tl.discounted += 1,
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
    // other paths did, unless its reach is discounted.
    for (o, slot) in obs.slots.iter().enumerate() {
        let Some(slot) = slot else { continue };
        for i in slot.start..slot.end {
            let t = obs.targets[i] as usize;
            if obs.plaintext[i] && !silent.discounts(o, t, obs.seen[i]) {
                tally[t].plaintext += 1;
            }
        }
    }
    (tally, names)
}

/// The reaches of nodes without a summary of their own that their other
/// observers overwhelmingly fail ([`suspect_reach`]), found from two
/// counts a node: its observers' reaches and their failures of every
/// path (by the states or the last probes), observer problems of either
/// pass left out of both. Made once, as two flags a silent node (whether
/// a reach of it is discounted when its observer is among those counted,
/// and when it is not); nothing when every node publishes.
struct SilentReaches<'a> {
    /// Observer problems of the first and the second pass.
    problems: (&'a [bool], &'a [bool]),
    /// Per node: bit 0, a counted observer's reach is discounted; bit 1,
    /// an observer problem's. Empty when every node publishes.
    flags: Vec<u8>,
}

impl<'a> SilentReaches<'a> {
    fn new(obs: &Observations, problems: (&'a [bool], &'a [bool]), min_observers: usize) -> Self {
        let (first, problem) = problems;
        let n = obs.slots.len();
        if (0..n).all(|t| obs.reporting(t)) {
            return Self {
                problems,
                flags: Vec::new(),
            };
        }
        let (mut reach, mut down) = (vec![0u32; n], vec![0u32; n]);
        for (o, seen_by_o) in obs.by_observer() {
            if first[o] || problem[o] {
                continue;
            }
            for (t, seen) in seen_by_o.filter(|&(t, _)| !obs.reporting(t)) {
                if Self::claims_up(seen) {
                    reach[t] += 1;
                } else if seen.down_now() {
                    down[t] += 1;
                }
            }
        }
        let flags = (0..n)
            .map(|t| {
                if obs.reporting(t) {
                    return 0;
                }
                // A counted observer's reach is one of `reach[t]`.
                let counted = reach[t] > 0 && suspect_reach(reach[t] - 1, down[t], min_observers);
                let problem = suspect_reach(reach[t], down[t], min_observers);
                u8::from(counted) | (u8::from(problem) << 1)
            })
            .collect();
        Self { problems, flags }
    }

    /// Some path said to answer: every path in Success, or some failed
    /// and others in Success (a path failed in one family only counts as
    /// answering over the other), and not every one failed by the
    /// states or the last probes. An observer's claim that the node is
    /// up: a liar's partial reach is discounted as a whole one is.
    fn claims_up(seen: Seen) -> bool {
        !matches!(seen, Seen::Unknown | Seen::FailedSomeNoneAnswering) && !seen.down_now()
    }

    /// Whether observer `o`'s `seen` of node `t` is a reach to discount.
    fn discounts(&self, o: usize, t: usize, seen: Seen) -> bool {
        let Some(&flags) = self.flags.get(t) else {
            return false;
        };
        let (first, problem) = self.problems;
        let bit = if first[o] || problem[o] { 2 } else { 1 };
        flags & bit != 0 && Self::claims_up(seen)
    }
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

    let silent = SilentReaches::new(&obs, (&first, &problem), params.min_observers);
    let (tally, names) = tally(nodes, &obs, (&first, &problem), (&ok, &fail), &silent);

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
                reporting: obs.reporting(i),
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
mod tests;
