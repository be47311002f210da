//! An agent's check of the published view against what it sees itself:
//! any agent may become the assembler (or write the view's key), so each
//! one compares the view with its own last rounds on the peers it probes
//! and reports a view that contradicts them.
//!
//! A contradiction needs the agent's own observation to have held for a
//! whole interval before the view was assembled (so that the assembler
//! had the summary saying it):
//!
//! - the view says a node is down, and this agent reaches it on every
//!   path;
//! - the view names this agent among a node's failing observers, and it
//!   reaches the node on every path;
//! - the view says a node is healthy, and this agent fails every path to
//!   it (unless the view calls this agent an observer problem: its
//!   failures are discounted then).
//!
//! A node without a summary of its own that this agent reaches while its
//! other observers fail it is down in the view, this agent's reach
//! discounted (`cluster::view`): that is reported as well, the view and
//! this agent's rounds disagreeing.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::{
    cluster::{
        published_view::PublishedView,
        summary::{PeerSummary, Summary},
        view::Verdict,
    },
    probe::path::ProbeResult,
};

/// What this agent's own round says of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Every path in Success, none failing its last probe.
    Reached,
    /// Every path in Failure, in every family.
    FailedAll,
    /// Every path in Failure or failing its last probe, some still in
    /// Success (their failures short of the threshold): an assembler
    /// counts such an observer as reaching the node, so it is no evidence
    /// against a healthy verdict.
    FailingAll,
    /// Some path answers (in Success, its last probe answered, or failed
    /// in one address family only), some does not: the node is up.
    ReachedSome,
    /// Anything else, or not known yet: no evidence either way.
    Other,
}

impl Seen {
    #[must_use]
    pub fn of(p: &PeerSummary) -> Self {
        let paths = p.paths();
        if paths
            .iter()
            .all(|s| s.state == ProbeResult::Success && !s.failing)
        {
            Self::Reached
        } else if paths
            .iter()
            .all(|s| s.state == ProbeResult::Failure && !s.split)
        {
            Self::FailedAll
        } else if paths
            .iter()
            .all(|s| (s.state == ProbeResult::Failure || s.failing) && !s.split)
        {
            Self::FailingAll
        } else if paths
            .iter()
            .any(|s| (s.state == ProbeResult::Success && !s.failing) || s.split)
        {
            Self::ReachedSome
        } else {
            Self::Other
        }
    }
}

/// One node on which the published view and this agent disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contradiction {
    pub node: String,
    /// The view's verdict on it.
    pub published: Verdict,
    /// What this agent sees: "reaches it on every path" or "fails every
    /// path to it".
    pub here: String,
}

/// This agent's observations of its peers, and since when each holds.
#[derive(Debug, Default)]
pub struct Checker {
    since: HashMap<String, (Seen, u64)>,
}

impl Checker {
    /// Takes this agent's last round (its own summary).
    pub fn observe(&mut self, own: &Summary) {
        let at = own.at_ms();
        let mut next = HashMap::with_capacity(own.peers().len());
        for p in own.peers() {
            if *p.name == *own.observer() {
                continue;
            }
            let seen = Seen::of(p);
            let since = match self.since.get(&*p.name) {
                Some(&(s, t)) if s == seen => t,
                _ => at,
            };
            next.insert(p.name.to_string(), (seen, since));
        }
        self.since = next;
    }

    /// Where `view` contradicts what `local` (this agent) has seen for at
    /// least `hold_ms` (the view's interval, or less when it claims a
    /// longer one than the reader believes) before the view was
    /// assembled; by node name.
    #[must_use]
    pub fn check(&self, local: &str, view: &PublishedView, hold_ms: u64) -> Vec<Contradiction> {
        let listed: HashMap<&str, &crate::cluster::view::NodeView> = view
            .view
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n))
            .collect();
        let discounted = listed
            .get(local)
            .is_some_and(|n| n.verdict == Verdict::ObserverProblem);
        let mut out = Vec::new();
        for (name, &(seen, since)) in &self.since {
            if since.saturating_add(hold_ms) > view.at_ms {
                continue;
            }
            let node = listed.get(name.as_str());
            let published = match node {
                Some(n) => n.verdict,
                None if view.unlisted == 0 => Verdict::Healthy,
                None => continue,
            };
            let names_local = node.is_some_and(|n| n.failing_observers.iter().any(|o| o == local));
            let here = match seen {
                Seen::Reached if published == Verdict::NodeDown || names_local => {
                    "reaches it on every path"
                }
                Seen::ReachedSome if published == Verdict::NodeDown => "reaches it on some path",
                Seen::FailedAll if published == Verdict::Healthy && !discounted => {
                    "fails every path to it"
                }
                _ => continue,
            };
            out.push(Contradiction {
                node: name.clone(),
                published,
                here: here.to_owned(),
            });
        }
        out.sort_by(|a, b| a.node.cmp(&b.node));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{
        summary::PathSample,
        view::{ClusterView, NodeView, VerdictCounts},
    };

    fn peer(name: &str, state: ProbeResult, failing: bool) -> PeerSummary {
        PeerSummary::new(name, [PathSample::with_failing(state, None, failing); 4])
    }

    fn own(at_ms: u64, peers: Vec<PeerSummary>) -> Summary {
        Summary::new("me".into(), 1, at_ms, peers).expect("summary")
    }

    fn node(name: &str, verdict: Verdict, failing_observers: &[&str]) -> NodeView {
        NodeView {
            plaintext: 0,
            name: name.into(),
            zone: None,
            reporting: true,
            observers: 3,
            seen_reachable: 0,
            failing: u32::try_from(failing_observers.len()).expect("few"),
            discounted: 0,
            verdict,
            failing_observers: failing_observers.iter().map(|s| (*s).to_owned()).collect(),
            unreached: 0,
            unreached_nodes: Vec::new(),
            lossy: 0,
        }
    }

    fn view(at_ms: u64, nodes: Vec<NodeView>, unlisted: u64) -> PublishedView {
        PublishedView {
            assembler: "leader".into(),
            round: 7,
            at_ms,
            interval_ms: 1000,
            unlisted,
            view: ClusterView {
                plaintext_nodes: Vec::new(),
                reports: 4,
                ignored: 0,
                counts: VerdictCounts::default(),
                nodes,
            },
        }
    }

    /// A peer every path of which failed over one address family only.
    fn one_family(name: &str) -> PeerSummary {
        PeerSummary::new(
            name,
            [PathSample::new(ProbeResult::Failure, None).with_split(true); 4],
        )
    }

    #[test]
    fn a_view_contradicting_what_this_agent_has_seen_for_an_interval_is_reported() {
        let mut c = Checker::default();
        c.observe(&own(
            1_000,
            vec![
                peer("a", ProbeResult::Success, false),
                peer("b", ProbeResult::Failure, false),
                peer("c", ProbeResult::Success, false),
                peer("d", ProbeResult::Success, true),
                one_family("e"),
                peer("me", ProbeResult::Success, false),
            ],
        ));
        // Held since 1000: a view of 2000 was assembled an interval later.
        c.observe(&own(
            1_500,
            vec![
                peer("a", ProbeResult::Success, false),
                peer("b", ProbeResult::Failure, false),
                peer("c", ProbeResult::Success, false),
                peer("d", ProbeResult::Success, true),
                one_family("e"),
            ],
        ));
        let v = view(
            2_000,
            vec![
                node("a", Verdict::NodeDown, &[]),
                node("c", Verdict::PathDegraded, &["me"]),
                node("d", Verdict::NodeDown, &[]),
                node("e", Verdict::NodeDown, &[]),
            ],
            0,
        );
        let found = c.check("me", &v, 1_000);
        let names: Vec<(&str, Verdict, &str)> = found
            .iter()
            .map(|x| (x.node.as_str(), x.published, x.here.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("a", Verdict::NodeDown, "reaches it on every path"),
                ("b", Verdict::Healthy, "fails every path to it"),
                ("c", Verdict::PathDegraded, "reaches it on every path"),
                ("e", Verdict::NodeDown, "reaches it on some path"),
            ]
        );
        // A view of 1999 is assembled less than an interval after: no
        // contradiction yet (the assembler may not have had the summary).
        assert_eq!(
            c.check("me", &view(1_999, v.view.nodes.clone(), 0), 1_000),
            Vec::<Contradiction>::new()
        );
    }

    #[test]
    fn no_contradiction_where_the_view_agrees_or_cannot_tell() {
        let mut c = Checker::default();
        c.observe(&own(
            0,
            vec![
                peer("a", ProbeResult::Failure, false),
                peer("b", ProbeResult::Success, false),
                peer("u", ProbeResult::Unknown, false),
            ],
        ));
        // a down and b healthy: as seen here; u unknown here.
        let agree = view(5_000, vec![node("a", Verdict::NodeDown, &[])], 0);
        assert_eq!(c.check("me", &agree, 1_000), Vec::<Contradiction>::new());
        // Some nodes not healthy left unlisted: a node not listed may be
        // one of them.
        let partial = view(5_000, Vec::new(), 1);
        assert_eq!(c.check("me", &partial, 1_000), Vec::<Contradiction>::new());
        // This agent an observer problem: its failures are discounted.
        let discounted = view(5_000, vec![node("me", Verdict::ObserverProblem, &[])], 0);
        assert_eq!(
            c.check("me", &discounted, 1_000),
            Vec::<Contradiction>::new()
        );
        // An observation that changed restarts its interval.
        c.observe(&own(4_500, vec![peer("b", ProbeResult::Failure, false)]));
        assert_eq!(
            c.check("me", &view(5_000, Vec::new(), 0), 1_000),
            Vec::<Contradiction>::new()
        );
        assert_eq!(c.check("me", &view(5_500, Vec::new(), 0), 1_000).len(), 1);
    }

    /// Every path failed over one address family only: the node answers
    /// over the other, so not "fails every path".
    #[test]
    fn paths_failed_in_one_family_are_not_every_path_failed() {
        let failed = PathSample::new(ProbeResult::Failure, None);
        let p = |split| PeerSummary::new("a", [failed.with_split(split); 4]);
        assert_eq!(Seen::of(&p(false)), Seen::FailedAll);
        assert_eq!(Seen::of(&p(true)), Seen::ReachedSome);
    }

    /// Every path failing its last probes but short of the failure
    /// threshold: the assembler counts this agent as reaching the node
    /// (it is healthy in an honest view), so that view is no
    /// contradiction, however long it lasts.
    #[test]
    fn paths_failing_short_of_the_threshold_do_not_contradict_a_healthy_view() {
        let mut c = Checker::default();
        c.observe(&own(
            1_000,
            vec![PeerSummary::new("a", [PathSample::FAILING; 4])],
        ));
        assert_eq!(c.since.get("a").map(|s| s.0), Some(Seen::FailingAll));
        let healthy = view(60_000, Vec::new(), 0);
        assert_eq!(c.check("me", &healthy, 1_000), Vec::<Contradiction>::new());
        // Once they fail (the threshold reached), it is one.
        let failed = PathSample::new(ProbeResult::Failure, None);
        c.observe(&own(2_000, vec![PeerSummary::new("a", [failed; 4])]));
        assert_eq!(c.check("me", &healthy, 1_000).len(), 1);
    }
}
