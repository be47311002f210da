//! Verdict bookkeeping over the rounds: when each faulty node's verdict
//! was first right, what converged, and every wrong verdict.

use std::collections::HashMap;

use health_agent::cluster::view::{ClusterView, Verdict};

use super::{Cluster, FAULT_ROUND};

use super::faults::Faults;

/// Verdict bookkeeping over the rounds.
#[derive(Default)]
pub(super) struct Tracker {
    /// First round each fault's node(s) had the right verdict.
    pub(super) first_right: HashMap<&'static str, u32>,
    /// (round, node, verdict) of every wrong verdict.
    pub(super) wrong: Vec<(u32, String, Verdict)>,
    pub(super) converging: usize,
    /// Nodes whose verdict has been right once.
    settled: Vec<bool>,
}

impl Tracker {
    pub(super) fn check(&mut self, c: &Cluster, f: &Faults, view: &ClusterView, r: u32) {
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
